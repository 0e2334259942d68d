// Snapshots: bit-exact round trips, and every damaged or foreign file rejected by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "kv/kv_test_util.h"

using namespace dsv4;
using namespace dsv4::kv;
using dsv4::kv::test::fill_random;
using dsv4::kv::test::flash_config;
using dsv4::kv::test::small_chunk_factory;
using dsv4::kv::test::tiny_config;

namespace {

constexpr uint64_t kModel = 0x1234abcd5678ef00ull;

Options opts(uint64_t initial_rows) {
    Options o;
    o.initial_rows = initial_rows;
    return o;
}

// A session holding `n` tokens' worth of random KV: every raw ring row (not just the
// window), every compressed row in use, every state.
struct Filled {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
};

Filled fill(SessionKV& kv, uint64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Layout& l = kv.layout();
    EXPECT_TRUE(kv.ensure_tokens(n));
    kv.set_n_tokens(n);
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        for (uint64_t p = 0; p < l.raw_cap; ++p) fill_random(kv.raw_row(il, p), l.head_dim, rng);
        const uint32_t r = l.ratio[il];
        if (!r) continue;
        for (uint64_t c = 0; c < n / r; ++c) {
            fill_random(kv.comp_row(il, c), l.head_dim, rng);
            if (r == 4) fill_random(kv.index_row(il, c), l.indexer_dim, rng);
        }
        fill_random(kv.state_kv(il), uint64_t(l.state_rows(il)) * l.state_width(il), rng);
        fill_random(kv.state_score(il), uint64_t(l.state_rows(il)) * l.state_width(il), rng);
        if (r == 4) {
            fill_random(kv.istate_kv(il), 8ull * l.istate_width(), rng);
            fill_random(kv.istate_score(il), 8ull * l.istate_width(), rng);
        }
    }
    Filled f;
    for (uint64_t i = 0; i < n; ++i) f.tokens.push_back(int32_t(rng() % 100000));
    f.logits.resize(kv.config().n_vocab);
    fill_random(f.logits.data(), f.logits.size(), rng);
    return f;
}

// Every byte the next step could read must be equal.
void expect_same_kv(const SessionKV& a, const SessionKV& b) {
    ASSERT_EQ(a.n_tokens(), b.n_tokens());
    const Layout& l = a.layout();
    const uint64_t n = a.n_tokens();
    const uint64_t window = std::min<uint64_t>(n, l.n_swa);
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        for (uint64_t p = n - window; p < n; ++p)
            ASSERT_EQ(std::memcmp(a.raw_row(il, p), b.raw_row(il, p), l.raw_row_bytes()), 0) << il << " " << p;
        const uint32_t r = l.ratio[il];
        if (!r) continue;
        for (uint64_t c = 0; c < n / r; ++c) {
            ASSERT_EQ(std::memcmp(a.comp_row(il, c), b.comp_row(il, c), uint64_t(l.head_dim) * 4), 0) << il << " " << c;
            if (r == 4) {
                ASSERT_EQ(std::memcmp(a.index_row(il, c), b.index_row(il, c), uint64_t(l.indexer_dim) * 4), 0);
            }
        }
        ASSERT_EQ(std::memcmp(a.state_kv(il), b.state_kv(il), l.state_bytes(il)), 0) << il;
        ASSERT_EQ(std::memcmp(a.state_score(il), b.state_score(il), l.state_bytes(il)), 0) << il;
        if (r == 4) {
            ASSERT_EQ(std::memcmp(a.istate_kv(il), b.istate_kv(il), l.istate_bytes()), 0) << il;
            ASSERT_EQ(std::memcmp(a.istate_score(il), b.istate_score(il), l.istate_bytes()), 0) << il;
        }
    }
}

std::string load_error(SessionKV& kv, const std::vector<uint8_t>& blob, uint64_t model = kModel) {
    try {
        load_snapshot(kv, model, blob.data(), blob.size(), "snap.kv");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

model::Config small() { return tiny_config({0, 4, 128, 4, 0, 128, 4}, 32, 16, 12, 50); }

// A session of the small model holding n tokens of random KV, and its snapshot.
struct Saved {
    model::Config c = small();
    Layout l;
    std::unique_ptr<SessionKV> src;
    Filled f;
    std::vector<uint8_t> blob;

    Saved(uint64_t n, uint64_t seed, uint64_t ctx = 2048) : l(Layout::make(c, ctx, 16)) {
        src = fresh();
        f = fill(*src, n, seed);
        save_snapshot(*src, kModel, f.tokens, f.logits, blob);
    }
    // An empty session of the same shapes, one committed row to start from.
    std::unique_ptr<SessionKV> fresh(Budget* budget = nullptr) const {
        return std::make_unique<SessionKV>(c, l, opts(1), budget, small_chunk_factory());
    }
};

}  // namespace

TEST(KvSnapshot, RoundTripBitExact) {
    const model::Config c = small();
    // Source: prefill chunk 20 (raw_cap 32); destination: chunk 100 (raw_cap 112), page
    // chunks and one initial row, so ring slots and committed rows both differ.
    const Layout src_l = Layout::make(c, 4096, 20);
    const Layout dst_l = Layout::make(c, 4096, 100);
    for (uint64_t n : {uint64_t(0), uint64_t(5), uint64_t(12), uint64_t(128), uint64_t(1001), uint64_t(4095)}) {
        SessionKV src(c, src_l, opts(4096), nullptr, host_region_factory());
        const Filled f = fill(src, n, 1000 + n);
        std::vector<uint8_t> blob;
        save_snapshot(src, kModel, f.tokens, f.logits, blob);
        EXPECT_EQ(blob.size(), snapshot_bytes(src));

        SessionKV dst(c, dst_l, opts(1), nullptr, small_chunk_factory());
        fill(dst, 77, 5);   // loading replaces whatever was there
        const SnapshotData d = load_snapshot(dst, kModel, blob.data(), blob.size(), "mem");
        EXPECT_EQ(d.n_tokens, n);
        EXPECT_EQ(d.ctx, 4096u);
        EXPECT_EQ(d.tokens, f.tokens);
        ASSERT_EQ(d.logits.size(), f.logits.size());
        EXPECT_EQ(std::memcmp(d.logits.data(), f.logits.data(), f.logits.size() * 4), 0);
        EXPECT_EQ(dst.n_tokens(), n);
        expect_same_kv(src, dst);
        EXPECT_TRUE(dst.check(n));

        // What the destination saves is the same blob, byte for byte (the format does not
        // depend on ring size or commits).
        std::vector<uint8_t> again;
        save_snapshot(dst, kModel, d.tokens, d.logits, again);
        EXPECT_EQ(again.size(), blob.size());
        EXPECT_TRUE(again.size() == blob.size() && std::memcmp(again.data(), blob.data(), blob.size()) == 0) << n;
    }
}

// A session whose last step produced only the greedy id has no logits to save: its
// snapshot holds none (n_logits 0) and the same KV, and loads back without logits.
TEST(KvSnapshot, WithoutLogitsRoundTrips) {
    Saved s(300, 3);
    std::vector<uint8_t> blob;
    save_snapshot(*s.src, kModel, s.f.tokens, {}, blob);
    EXPECT_EQ(blob.size(), snapshot_bytes(*s.src, false));
    EXPECT_EQ(blob.size() + uint64_t(s.c.n_vocab) * 4, s.blob.size());
    uint32_t n_logits = 1;
    std::memcpy(&n_logits, blob.data() + 36, 4);
    EXPECT_EQ(n_logits, 0u);
    auto dst = s.fresh();
    const SnapshotData d = load_snapshot(*dst, kModel, blob.data(), blob.size(), "mem");
    EXPECT_EQ(d.tokens, s.f.tokens);
    EXPECT_TRUE(d.logits.empty());
    expect_same_kv(*s.src, *dst);
    // Saved again without logits: the same bytes.
    std::vector<uint8_t> again;
    save_snapshot(*dst, kModel, d.tokens, d.logits, again);
    EXPECT_TRUE(again == blob);
}

TEST(KvSnapshot, FileRoundTrip) {
    Saved s(999, 42);

    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("dsv4_kv_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "session.kv").string();
    save_snapshot_file(*s.src, kModel, s.f.tokens, s.f.logits, path);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(file, s.blob);   // streamed checksum == one-shot checksum

    auto dst_ptr = s.fresh();
    SessionKV& dst = *dst_ptr;
    const SnapshotData d = load_snapshot_file(dst, kModel, path);
    EXPECT_EQ(d.tokens, s.f.tokens);
    expect_same_kv(*s.src, dst);

    try {
        load_snapshot_file(dst, kModel + 1, path);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    try {
        load_snapshot_file(dst, kModel, (dir / "missing.kv").string());
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing.kv"), std::string::npos) << e.what();
    }
    // An unwritable destination is an Error naming the path, and leaves no temporary.
    const std::string bad = (dir / "no-such-dir" / "x.kv").string();
    try {
        save_snapshot_file(*s.src, kModel, s.f.tokens, s.f.logits, bad);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
}

TEST(KvSnapshot, RejectsTruncated) {
    Saved s(700, 7);

    auto dst_ptr = s.fresh();
    SessionKV& dst = *dst_ptr;
    fill(dst, 33, 8);
    const uint64_t committed = dst.accounting().committed;
    for (int k = 0; k < 64; ++k) {
        for (size_t cut : {s.blob.size() * k / 64, s.blob.size() * k / 64 + 3}) {
            if (cut >= s.blob.size()) continue;
            const std::vector<uint8_t> t(s.blob.begin(), s.blob.begin() + long(cut));
            const std::string m = load_error(dst, t);
            ASSERT_FALSE(m.empty()) << cut;
            EXPECT_NE(m.find("snap.kv"), std::string::npos) << m;
            EXPECT_NE(m.find("truncated"), std::string::npos) << m;
            EXPECT_NE(m.find("expected"), std::string::npos) << m;
        }
    }
    std::vector<uint8_t> last(s.blob.begin(), s.blob.end() - 1);
    EXPECT_NE(load_error(dst, last).find("truncated: expected"), std::string::npos);
    // A rejected snapshot leaves the session as it was.
    EXPECT_EQ(dst.n_tokens(), 33u);
    EXPECT_EQ(dst.accounting().committed, committed);
}

TEST(KvSnapshot, RejectsTrailingBytes) {
    Saved s(100, 3);
    s.blob.push_back(0);
    const std::string m = load_error(*s.src, s.blob);
    EXPECT_NE(m.find("trailing bytes"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(s.blob.size())), std::string::npos) << m;
}

TEST(KvSnapshot, RejectsBitFlips) {
    Saved s(555, 11);
    auto dst_ptr = s.fresh();
    SessionKV& dst = *dst_ptr;

    std::mt19937_64 rng(99);
    std::vector<size_t> positions;
    for (size_t i = 0; i < kSnapshotHeaderBytes + 4 * s.l.n_layer; ++i) positions.push_back(i);   // every header byte
    for (int k = 0; k < 64; ++k) positions.push_back(s.blob.size() * size_t(k) / 64 + 1);
    for (int k = 0; k < 64; ++k) positions.push_back(size_t(rng() % s.blob.size()));
    positions.push_back(s.blob.size() - 1);   // the checksum itself
    int checksum_msgs = 0;
    for (size_t pos : positions) {
        if (pos >= s.blob.size()) continue;
        std::vector<uint8_t> bad = s.blob;
        bad[pos] ^= uint8_t(1u << (rng() % 8));
        const std::string m = load_error(dst, bad);
        ASSERT_FALSE(m.empty()) << "flip at " << pos << " accepted";
        EXPECT_NE(m.find("snap.kv"), std::string::npos) << m;
        checksum_msgs += m.find("checksum") != std::string::npos;
    }
    EXPECT_GT(checksum_msgs, 64);
    EXPECT_EQ(dst.n_tokens(), 0u);
    // The intact blob still loads.
    EXPECT_NO_THROW(load_snapshot(dst, kModel, s.blob.data(), s.blob.size(), "snap.kv"));
    EXPECT_EQ(dst.n_tokens(), 555u);
}

TEST(KvSnapshot, RejectsWrongModelId) {
    Saved s(300, 1);
    auto dst_ptr = s.fresh();
    SessionKV& dst = *dst_ptr;
    const std::string m = load_error(dst, s.blob, 0xfeedull);
    EXPECT_NE(m.find("model identity"), std::string::npos) << m;
    EXPECT_NE(m.find("0x000000000000feed"), std::string::npos) << m;
    EXPECT_NE(m.find("0x1234abcd5678ef00"), std::string::npos) << m;
    EXPECT_EQ(dst.n_tokens(), 0u);
}

TEST(KvSnapshot, RejectsWrongShapes) {
    Saved s(300, 1);

    struct Case {
        model::Config c;
        uint64_t ctx;
        const char* field;
    };
    std::vector<Case> cases = {
        {tiny_config({0, 4, 128, 4, 0, 128, 4}, 64, 16, 12, 50), 2048, "head_dim: expected 64, found 32"},
        {tiny_config({0, 4, 128, 4, 0, 128, 4}, 32, 8, 12, 50), 2048, "indexer_dim: expected 8, found 16"},
        {tiny_config({0, 4, 128, 4, 0, 128, 4}, 32, 16, 16, 50), 2048, "n_swa: expected 16, found 12"},
        {tiny_config({0, 4, 128, 4, 0, 128, 4}, 32, 16, 12, 51), 2048, "n_logits: expected 51 (n_vocab) or 0, found 50"},
        {tiny_config({0, 4, 128, 4, 0, 128}, 32, 16, 12, 50), 2048, "n_layer: expected 6, found 7"},
        {tiny_config({0, 4, 128, 4, 0, 128, 128}, 32, 16, 12, 50), 2048, "ratio of layer 6: expected 128, found 4"},
        {small(), 300, "n_tokens: expected fewer than the session's context of 300 tokens, found 300"},
    };
    for (const Case& k : cases) {
        SessionKV dst(k.c, Layout::make(k.c, k.ctx, 16), opts(1), nullptr, small_chunk_factory());
        const std::string m = load_error(dst, s.blob);
        EXPECT_NE(m.find(k.field), std::string::npos) << "want \"" << k.field << "\", got: " << m;
        EXPECT_NE(m.find("snap.kv"), std::string::npos) << m;
        EXPECT_EQ(dst.n_tokens(), 0u);
    }
    // A larger context is fine; the saved context is only informational.
    SessionKV big(s.c, Layout::make(s.c, 301, 16), opts(1), nullptr, small_chunk_factory());
    EXPECT_NO_THROW(load_snapshot(big, kModel, s.blob.data(), s.blob.size(), "snap.kv"));
}

TEST(KvSnapshot, RejectsOtherFilesAndVersions) {
    const model::Config c = small();
    const Layout l = Layout::make(c, 2048, 16);
    SessionKV kv(c, l, opts(1), nullptr, small_chunk_factory());
    std::vector<uint8_t> junk(200, 'x');
    EXPECT_NE(load_error(kv, junk).find("magic"), std::string::npos);
    const Filled f = fill(kv, 10, 1);
    std::vector<uint8_t> blob;
    save_snapshot(kv, kModel, f.tokens, f.logits, blob);
    blob[8] = 2;   // version
    const std::string m = load_error(kv, blob);
    EXPECT_NE(m.find("format version: expected 1, found 2"), std::string::npos) << m;
    EXPECT_NE(load_error(kv, {}).find("truncated at magic"), std::string::npos);
}

TEST(KvSnapshot, LoadRefusedByBudget) {
    Saved s(60000, 2, 1u << 16);

    Budget budget;
    auto dst_ptr = s.fresh(&budget);
    SessionKV& dst = *dst_ptr;
    budget.set_limit(budget.used() + 8192);
    const std::string m = load_error(dst, s.blob);
    EXPECT_NE(m.find("cannot hold 60000 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("budget"), std::string::npos) << m;
    EXPECT_EQ(dst.n_tokens(), 0u);
    budget.set_limit(0);
    load_snapshot(dst, kModel, s.blob.data(), s.blob.size(), "snap.kv");
    expect_same_kv(*s.src, dst);
}

TEST(KvSnapshot, SaveChecksItsArguments) {
    const model::Config c = small();
    const Layout l = Layout::make(c, 2048, 16);
    SessionKV kv(c, l, opts(1), nullptr, small_chunk_factory());
    Filled f = fill(kv, 10, 1);
    std::vector<uint8_t> blob;
    f.tokens.pop_back();
    try {
        save_snapshot(kv, kModel, f.tokens, f.logits, blob);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("tokens: expected 10"), std::string::npos) << e.what();
    }
    f.tokens.push_back(1);
    f.logits.pop_back();
    EXPECT_THROW(save_snapshot(kv, kModel, f.tokens, f.logits, blob), Error);
}

TEST(KvSnapshot, FlashSizeMatchesSpec) {
    // model-spec §6.3: ds4's payload at T = 2048 is 52,184,460 bytes. Ours carries the same
    // rows and states; the header differs: 88 B + 43 ratios + an 8 B checksum instead of
    // 13 u32 + two 43-entry row-count arrays, 128 bytes less.
    const model::Config c = flash_config();
    const Layout l = Layout::make(c, 65536, 2048);
    SessionKV kv(c, l, opts(0), nullptr, host_region_factory());
    ASSERT_TRUE(kv.ensure_tokens(2048));
    kv.set_n_tokens(2048);
    EXPECT_EQ(snapshot_bytes(kv), 52184460u - 128u);
    std::vector<int32_t> tokens(2048, 7);
    std::vector<float> logits(c.n_vocab, 0.5f);
    std::vector<uint8_t> blob;
    save_snapshot(kv, kModel, tokens, logits, blob);
    EXPECT_EQ(blob.size(), 52184460u - 128u);
    std::printf("[ Flash snapshot ] 2048 tokens: %s (%zu B)\n", human_bytes(blob.size()).c_str(), blob.size());
    SessionKV dst(c, Layout::make(c, 4096, 512), opts(0), nullptr, host_region_factory());
    const SnapshotData d = load_snapshot(dst, kModel, blob.data(), blob.size(), "flash");
    EXPECT_EQ(d.tokens, tokens);
    expect_same_kv(kv, dst);
}
