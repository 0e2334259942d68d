// Layout sizes against model-spec §6.1–6.3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "kv/kv_test_util.h"

using namespace dsv4;
using namespace dsv4::kv;
using dsv4::kv::test::flash_config;
using dsv4::kv::test::tiny_config;

TEST(KvLayout, FlashShapes) {
    const model::Config c = flash_config();
    const Layout l = Layout::make(c, 1048576, 2048);
    EXPECT_EQ(l.n_layer, 43u);
    EXPECT_EQ(l.n_r4, 21u);
    EXPECT_EQ(l.n_r128, 20u);
    EXPECT_EQ(l.raw_cap, 128u + 2048u);
    EXPECT_EQ(l.rows4_cap, 1048576u / 4 + 2);
    EXPECT_EQ(l.rows128_cap, 1048576u / 128 + 2);
    EXPECT_EQ(l.slot[0], -1);
    EXPECT_EQ(l.slot[2], 0);
    EXPECT_EQ(l.slot[3], 0);
    EXPECT_EQ(l.slot[42], 20);
    EXPECT_EQ(l.slot[41], 19);
    EXPECT_EQ(l.state_rows(2), 8u);
    EXPECT_EQ(l.state_width(2), 1024u);
    EXPECT_EQ(l.state_rows(3), 128u);
    EXPECT_EQ(l.state_width(3), 512u);
    EXPECT_EQ(l.istate_width(), 256u);
}

TEST(KvLayout, FlashLogicalBytesMatchSpec) {
    const model::Config c = flash_config();
    const uint64_t ctx = 1048576;
    const Layout l = Layout::make(c, ctx, 2048);
    // model-spec §6.3: compressed = 21·(ctx/4 + 2)·2560 + 20·(ctx/128 + 2)·2048
    const uint64_t compressed = 21 * (ctx / 4 + 2) * 2560 + 20 * (ctx / 128 + 2) * 2048;
    EXPECT_EQ(l.logical_bytes() - l.fixed_bytes, compressed);
    EXPECT_NEAR(double(compressed) / (1 << 20), 13760.2, 0.05);   // the spec's table, MiB

    // The fixed part: 43 rings of raw_cap rows plus every compressor state.
    const uint64_t raw = 43ull * l.raw_cap * 512 * 4;
    const uint64_t states = 21ull * (2 * 8 * 1024 * 4 + 2 * 8 * 256 * 4) + 20ull * (2 * 128 * 512 * 4);
    EXPECT_EQ(l.fixed_bytes, raw + states);

    // 13,760 bytes per context token: 13,440 for ratio 4 (10,752 + 2,688), 320 for ratio 128.
    const Layout l2 = Layout::make(c, 2 * ctx, 2048);
    EXPECT_EQ((l2.logical_bytes() - l.logical_bytes()) / ctx, 13760u);
    EXPECT_EQ((l2.logical_bytes() - l.logical_bytes()) % ctx, 0u);
    EXPECT_EQ(l.comp4_row_group_bytes() / 4, 10752u);     // per token: one row per 4 tokens
    EXPECT_EQ(l.index_row_group_bytes() / 4, 2688u);
    EXPECT_EQ(l.comp128_row_group_bytes() / 128, 320u);

    // The spec's raw_cap 2304 (ring aligned to 256 rows) gives its 193.5 MiB.
    const Layout l3 = Layout::make(c, ctx, 2304 - 128);
    EXPECT_EQ(43ull * l3.raw_cap * 512 * 4, uint64_t(193.5 * (1 << 20)));

    std::printf("[ Flash layout ] ctx %llu: logical %s = fixed %s (raw_cap %u) + compressed %s\n",
                (unsigned long long)ctx, human_bytes(l.logical_bytes()).c_str(), human_bytes(l.fixed_bytes).c_str(),
                l.raw_cap, human_bytes(compressed).c_str());
}

TEST(KvLayout, RawCapFollowsContextAndChunk) {
    const model::Config c = tiny_config({0, 4, 128}, 64, 32, 128);
    EXPECT_EQ(Layout::make(c, 100, 2048).raw_cap, 100u);     // the context itself
    EXPECT_EQ(Layout::make(c, 1000, 2048).raw_cap, 1000u);
    EXPECT_EQ(Layout::make(c, 4096, 0).raw_cap, 128u);       // the window alone
    EXPECT_EQ(Layout::make(c, 4096, 512).raw_cap, 640u);
    EXPECT_EQ(Layout::make(c, 1, 512).raw_cap, 1u);
    const Layout l = Layout::make(c, 1, 512);
    EXPECT_EQ(l.rows4_cap, 1u + 2);
    EXPECT_EQ(l.rows128_cap, 1u + 2);
}

TEST(KvLayout, StreamWithoutLayersHasNoRows) {
    const Layout l = Layout::make(tiny_config({0, 128, 128}), 4096, 64);
    EXPECT_EQ(l.n_r4, 0u);
    EXPECT_EQ(l.rows4_cap, 0u);
    EXPECT_EQ(l.n_r128, 2u);
    EXPECT_EQ(l.logical_bytes(), l.fixed_bytes + l.rows128_cap * 2 * 64 * 4);
}

TEST(KvLayout, FixedPiecesAreAlignedAndDisjoint) {
    const Layout l = Layout::make(tiny_config({0, 4, 128, 4, 0, 128}, 24, 12, 5), 300, 7);
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        pieces.push_back({l.raw_off[il], uint64_t(l.raw_cap) * l.raw_row_bytes()});
        if (l.ratio[il]) {
            pieces.push_back({l.state_kv_off[il], l.state_bytes(il)});
            pieces.push_back({l.state_sc_off[il], l.state_bytes(il)});
        }
        if (l.ratio[il] == 4) {
            pieces.push_back({l.istate_kv_off[il], l.istate_bytes()});
            pieces.push_back({l.istate_sc_off[il], l.istate_bytes()});
        }
    }
    std::sort(pieces.begin(), pieces.end());
    for (size_t i = 0; i < pieces.size(); ++i) {
        EXPECT_EQ(pieces[i].first % 256, 0u);
        EXPECT_LE(pieces[i].first + pieces[i].second, i + 1 < pieces.size() ? pieces[i + 1].first : l.fixed_bytes);
    }
}

TEST(KvLayout, RejectsBadConfigs) {
    auto message = [](const model::Config& c, uint64_t ctx) {
        try {
            Layout::make(c, ctx, 64);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    std::string m = message(tiny_config({0, 8, 4}), 1024);
    EXPECT_NE(m.find("layer 1"), std::string::npos) << m;
    EXPECT_NE(m.find("ratio 8"), std::string::npos) << m;

    model::Config c = tiny_config({0, 4, 128});
    c.n_layer = 4;
    m = message(c, 1024);
    EXPECT_NE(m.find("compress_ratio has 3 entries"), std::string::npos) << m;

    m = message(tiny_config({0, 4}), 0);
    EXPECT_NE(m.find("context"), std::string::npos) << m;

    m = message(tiny_config({0, 4}, 64, 0), 1024);
    EXPECT_NE(m.find("indexer"), std::string::npos) << m;
}
