// SessionKV: lazy commits, growth at step boundaries, the guard, addressing, accounting.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>

#include "kv/kv_test_util.h"

using namespace dsv4;
using namespace dsv4::kv;
using dsv4::kv::test::flash_config;
using dsv4::kv::test::small_chunk_factory;
using dsv4::kv::test::tiny_config;

namespace {

Options opts(uint64_t initial_rows, bool allow_growth = true, double growth = 2.0) {
    Options o;
    o.initial_rows = initial_rows;
    o.allow_growth = allow_growth;
    o.growth = growth;
    return o;
}

// A value that names its layer, stream and row, so misplaced rows are caught.
float tag(uint32_t il, uint32_t stream, uint64_t row, uint64_t d) {
    return float(il * 1000003 + stream * 100003 + row * 131 + d % 131);
}

}  // namespace

TEST(KvSession, FlashLazyVersusEager) {
    const model::Config c = flash_config();
    const uint64_t ctx = 1048576;
    const Layout l = Layout::make(c, ctx, 2048);
    Budget budget;
    const RegionFactory host = host_region_factory();

    for (uint64_t initial : {uint64_t(4096), uint64_t(0)}) {
        SessionKV kv(c, l, opts(initial), &budget, host);
        ASSERT_TRUE(kv.ensure_tokens(2048));
        kv.set_n_tokens(2048);
        const Accounting a = kv.accounting();
        EXPECT_EQ(a.logical, l.logical_bytes());
        EXPECT_GE(a.reserved, a.logical);
        EXPECT_EQ(a.committed, budget.used());
        EXPECT_LT(a.committed * 10, a.logical);   // lazy ≪ eager
        EXPECT_GE(kv.committed_rows(4), 512u);
        EXPECT_GE(kv.committed_rows(128), 16u);
        std::printf("[ Flash ctx 1M, 2048 tokens, initial_rows %llu ] committed %s (fixed %s + rows %s), "
                    "live %s, logical (eager) %s, reserved %s\n",
                    (unsigned long long)initial, human_bytes(a.committed).c_str(),
                    human_bytes(kv.region(RegionId::fixed)->committed_bytes()).c_str(),
                    human_bytes(a.committed - kv.region(RegionId::fixed)->committed_bytes()).c_str(),
                    human_bytes(a.live).c_str(), human_bytes(a.logical).c_str(), human_bytes(a.reserved).c_str());
    }
    EXPECT_EQ(budget.used(), 0u);
}

TEST(KvSession, EagerCommitsEverything) {
    const model::Config c = flash_config();
    const Layout l = Layout::make(c, 16384, 2048);
    Options o;
    o.eager = true;
    SessionKV kv(c, l, o, nullptr, host_region_factory());
    const Accounting a = kv.accounting();
    EXPECT_EQ(a.committed, a.reserved);
    EXPECT_GE(a.committed, a.logical);
    EXPECT_EQ(kv.committed_rows(4), l.rows4_cap);
    EXPECT_EQ(kv.committed_rows(128), l.rows128_cap);
    EXPECT_TRUE(kv.check(16384));
}

TEST(KvSession, InitialRowsClampedToCapacity) {
    const model::Config c = tiny_config({0, 4, 128});
    const Layout l = Layout::make(c, 256, 32);
    SessionKV kv(c, l, opts(1u << 30), nullptr, host_region_factory());
    EXPECT_EQ(kv.committed_rows(4), l.rows4_cap);
    EXPECT_EQ(kv.committed_rows(128), l.rows128_cap);
    EXPECT_EQ(kv.capacity_rows(4), 256u / 4 + 2);
    EXPECT_EQ(kv.capacity_rows(0), 0u);
}

TEST(KvSession, StatesInitialisedAndReset) {
    const model::Config c = tiny_config({0, 4, 128, 4});
    const Layout l = Layout::make(c, 1024, 32);
    SessionKV kv(c, l, opts(8), nullptr, host_region_factory());
    auto check_init = [&] {
        for (uint32_t il = 0; il < l.n_layer; ++il) {
            if (l.ratio[il] == 0) {
                EXPECT_EQ(kv.state_kv(il), nullptr);
                EXPECT_EQ(kv.istate_kv(il), nullptr);
                continue;
            }
            const uint64_t n = uint64_t(l.state_rows(il)) * l.state_width(il);
            for (uint64_t i = 0; i < n; ++i) {
                ASSERT_EQ(kv.state_kv(il)[i], 0.0f);
                ASSERT_EQ(kv.state_score(il)[i], -1e30f);
            }
            if (l.ratio[il] != 4) {
                EXPECT_EQ(kv.istate_kv(il), nullptr);
                continue;
            }
            for (uint64_t i = 0; i < 8ull * l.istate_width(); ++i) {
                ASSERT_EQ(kv.istate_kv(il)[i], 0.0f);
                ASSERT_EQ(kv.istate_score(il)[i], -1e30f);
            }
        }
    };
    check_init();
    EXPECT_EQ(kv.n_tokens(), 0u);
    for (uint32_t il = 1; il < l.n_layer; ++il) {
        kv.state_kv(il)[5] = 3.0f;
        kv.state_score(il)[l.state_rows(il) * l.state_width(il) - 1] = 7.0f;
        if (kv.istate_kv(il)) kv.istate_score(il)[0] = 1.0f;
    }
    kv.set_n_tokens(77);
    const uint64_t committed = kv.accounting().committed;
    kv.reset();
    check_init();
    EXPECT_EQ(kv.n_tokens(), 0u);
    EXPECT_EQ(kv.accounting().committed, committed);   // keeps commits
}

TEST(KvSession, RowAddressingIsInterleavedAndDisjoint) {
    const model::Config c = tiny_config({0, 4, 128, 4, 128, 4}, 16, 8, 4);
    const Layout l = Layout::make(c, 2048, 8);
    SessionKV kv(c, l, opts(0), nullptr, small_chunk_factory());
    ASSERT_TRUE(kv.ensure_tokens(2048));
    EXPECT_EQ(kv.comp_stride(1), 3u * 16);
    EXPECT_EQ(kv.comp_stride(2), 2u * 16);
    EXPECT_EQ(kv.comp_stride(0), 0u);
    EXPECT_EQ(kv.index_stride(), 3u * 8);
    EXPECT_EQ(kv.comp_row(0, 0), nullptr);
    EXPECT_EQ(kv.index_row(2, 0), nullptr);
    // Row c of every ratio-4 layer is contiguous: layer slots side by side.
    EXPECT_EQ(kv.comp_row(3, 5), kv.comp_row(1, 5) + 16);
    EXPECT_EQ(kv.comp_row(5, 5), kv.comp_row(1, 5) + 32);
    EXPECT_EQ(kv.comp_row(1, 6), kv.comp_row(1, 5) + kv.comp_stride(1));
    EXPECT_EQ(kv.index_row(5, 9), kv.index_row(1, 9) + 16);
    EXPECT_EQ(kv.raw_row(0, l.raw_cap + 3), kv.raw_row(0, 3));   // the ring wraps

    // Write every row of every stream, then read them all back: no two rows overlap.
    const uint64_t r4 = 2048 / 4, r128 = 2048 / 128;
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        for (uint64_t p = 0; p < l.raw_cap; ++p)
            for (uint32_t d = 0; d < 16; ++d) kv.raw_row(il, p)[d] = tag(il, 0, p, d);
        const uint64_t rows = l.ratio[il] == 4 ? r4 : l.ratio[il] == 128 ? r128 : 0;
        for (uint64_t r = 0; r < rows; ++r) {
            for (uint32_t d = 0; d < 16; ++d) kv.comp_row(il, r)[d] = tag(il, 1, r, d);
            if (l.ratio[il] == 4)
                for (uint32_t d = 0; d < 8; ++d) kv.index_row(il, r)[d] = tag(il, 2, r, d);
        }
    }
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        for (uint64_t p = 0; p < l.raw_cap; ++p)
            for (uint32_t d = 0; d < 16; ++d) ASSERT_EQ(kv.raw_row(il, p)[d], tag(il, 0, p, d));
        const uint64_t rows = l.ratio[il] == 4 ? r4 : l.ratio[il] == 128 ? r128 : 0;
        for (uint64_t r = 0; r < rows; ++r) {
            for (uint32_t d = 0; d < 16; ++d) ASSERT_EQ(kv.comp_row(il, r)[d], tag(il, 1, r, d));
            if (l.ratio[il] == 4) {
                for (uint32_t d = 0; d < 8; ++d) ASSERT_EQ(kv.index_row(il, r)[d], tag(il, 2, r, d));
            }
        }
    }
    // States live in the fixed region, apart from every ring.
    std::set<const float*> starts;
    for (uint32_t il = 0; il < l.n_layer; ++il) {
        starts.insert(kv.raw_row(il, 0));
        if (l.ratio[il]) {
            starts.insert(kv.state_kv(il));
            starts.insert(kv.state_score(il));
        }
        if (l.ratio[il] == 4) {
            starts.insert(kv.istate_kv(il));
            starts.insert(kv.istate_score(il));
        }
    }
    EXPECT_EQ(starts.size(), 6u + 5 * 2 + 3 * 2);
}

TEST(KvSession, GrowthAcrossManyPointsKeepsBasesAndData) {
    // Page-sized chunks and one initial row: the ratio-4 streams grow many times on the way
    // to the full context, the ratio-128 stream a few times.
    const model::Config c = tiny_config({0, 4, 128, 4, 128}, 64, 32, 16);
    const uint64_t ctx = 65536;
    const Layout l = Layout::make(c, ctx, 64);
    for (double growth : {2.0, 1.0, 1.3}) {
        Budget budget;
        SessionKV kv(c, l, opts(1, true, growth), &budget, small_chunk_factory());
        const uint8_t* bases[4];
        for (int i = 0; i < 4; ++i) bases[i] = kv.region(RegionId(i))->base();
        int growths = 0;
        uint64_t last_committed = kv.accounting().committed;
        // Steps of varying size (a prefill chunk, then decode-like single steps, ...).
        uint64_t n = 0;
        uint64_t step = 1;
        while (n < ctx) {
            const uint64_t end = std::min(ctx, n + step);
            ASSERT_TRUE(kv.ensure_tokens(end)) << end;
            ASSERT_TRUE(kv.check(end)) << end;
            // Write the rows this step completes, as the forward pass would.
            for (uint32_t il = 0; il < l.n_layer; ++il) {
                const uint32_t r = l.ratio[il];
                if (!r) continue;
                for (uint64_t row = n / r; row < end / r; ++row) {
                    for (uint32_t d = 0; d < 64; ++d) kv.comp_row(il, row)[d] = tag(il, 1, row, d);
                    if (r == 4)
                        for (uint32_t d = 0; d < 32; ++d) kv.index_row(il, row)[d] = tag(il, 2, row, d);
                }
            }
            n = end;
            kv.set_n_tokens(n);
            const uint64_t committed = kv.accounting().committed;
            if (committed != last_committed) ++growths;
            last_committed = committed;
            EXPECT_EQ(committed, budget.used());
            for (int i = 0; i < 4; ++i) ASSERT_EQ(kv.region(RegionId(i))->base(), bases[i]);
            step = step == 1 ? 37 : step == 37 ? 500 : 1;
        }
        EXPECT_GE(growths, growth == 2.0 ? 8 : 30) << growth;
        // Everything written before every growth point is intact.
        for (uint32_t il = 0; il < l.n_layer; ++il) {
            const uint32_t r = l.ratio[il];
            if (!r) continue;
            for (uint64_t row = 0; row < ctx / r; ++row) {
                for (uint32_t d = 0; d < 64; ++d) ASSERT_EQ(kv.comp_row(il, row)[d], tag(il, 1, row, d));
                if (r == 4) {
                    for (uint32_t d = 0; d < 32; ++d) ASSERT_EQ(kv.index_row(il, row)[d], tag(il, 2, row, d));
                }
            }
        }
        EXPECT_LE(kv.accounting().committed, kv.accounting().reserved);
        std::printf("[ growth %.1f ] %d growth points to %llu tokens\n", growth, growths, (unsigned long long)ctx);
    }
}

TEST(KvSession, GuardWithoutGrowth) {
    const model::Config c = tiny_config({0, 4, 128}, 64, 32, 16);
    const Layout l = Layout::make(c, 1u << 20, 64);
    SessionKV kv(c, l, opts(10, /*allow_growth=*/false), nullptr, small_chunk_factory());
    const uint64_t rows4 = kv.committed_rows(4);   // 10 asked, a page's worth committed
    EXPECT_GE(rows4, 10u);
    const uint64_t limit = rows4 * 4;              // tokens whose ratio-4 rows are committed
    EXPECT_TRUE(kv.check(limit));
    EXPECT_TRUE(kv.ensure_tokens(limit));
    Status s = kv.check(limit + 4);
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("guard"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("ratio-4"), std::string::npos) << s.message;
    const uint64_t committed = kv.accounting().committed;
    s = kv.ensure_tokens(limit + 4);
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("guard"), std::string::npos) << s.message;
    EXPECT_EQ(kv.accounting().committed, committed);   // nothing grew
}

TEST(KvSession, ContextFull) {
    const model::Config c = tiny_config({0, 4, 128});
    const Layout l = Layout::make(c, 1000, 64);
    SessionKV kv(c, l, opts(1), nullptr, small_chunk_factory());
    EXPECT_TRUE(kv.ensure_tokens(1000));
    EXPECT_TRUE(kv.check(1000));
    for (uint64_t end : {uint64_t(1001), uint64_t(5000), uint64_t(1) << 62}) {
        Status s = kv.ensure_tokens(end);
        EXPECT_FALSE(s);
        EXPECT_NE(s.message.find("context full"), std::string::npos) << s.message;
        EXPECT_FALSE(kv.check(end));
    }
}

TEST(KvSession, BudgetRefusalOnGrowth) {
    const model::Config c = tiny_config({0, 4, 128}, 64, 32, 16);
    const Layout l = Layout::make(c, 1u << 20, 64);
    Budget budget;
    SessionKV kv(c, l, opts(0), &budget, small_chunk_factory());
    const uint64_t base_used = budget.used();
    // Room for about 3072 ratio-4 rows: not for the geometric step from 2048 to 4096.
    const uint64_t g4 = l.comp4_row_group_bytes() + l.index_row_group_bytes();   // 384 B
    budget.set_limit(base_used + 3072 * g4 + 64 * 1024);
    ASSERT_TRUE(kv.ensure_tokens(4 * 2048));
    EXPECT_EQ(kv.committed_rows(4), 2048u);
    ASSERT_TRUE(kv.ensure_tokens(4 * 3000));   // the geometric step is refused; the rows needed fit
    EXPECT_GE(kv.committed_rows(4), 3000u);
    EXPECT_LT(kv.committed_rows(4), 4096u);
    const uint64_t committed = kv.accounting().committed;
    Status s = kv.ensure_tokens(4 * 100000);
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("budget"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("kv comp4"), std::string::npos) << s.message;
    EXPECT_EQ(kv.accounting().committed, committed);
    EXPECT_EQ(budget.used(), committed);
}

TEST(KvSession, ConstructorRefusedByBudget) {
    const model::Config c = tiny_config({0, 4, 128});
    const Layout l = Layout::make(c, 4096, 64);
    Budget budget(4096);
    try {
        SessionKV kv(c, l, opts(0), &budget, small_chunk_factory());
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("kv fixed"), std::string::npos) << e.what();
    }
    EXPECT_EQ(budget.used(), 0u);
}

TEST(KvSession, RejectsLayoutOfAnotherConfig) {
    const Layout l = Layout::make(tiny_config({0, 4, 128}), 4096, 64);
    EXPECT_THROW(SessionKV(tiny_config({0, 4, 4}), l, opts(0), nullptr, host_region_factory()), Error);
    EXPECT_THROW(SessionKV(tiny_config({0, 4, 128}, 32), l, opts(0), nullptr, host_region_factory()), Error);
}

TEST(KvSession, Accounting) {
    const model::Config c = tiny_config({0, 4, 128, 4}, 64, 32, 16);
    const Layout l = Layout::make(c, 8192, 64);   // raw_cap 80
    SessionKV kv(c, l, opts(0), nullptr, small_chunk_factory());
    const uint64_t states = 2 * (2 * 8 * 128 * 4 + 2 * 8 * 64 * 4) + 2 * 128 * 64 * 4;
    Accounting a = kv.accounting();
    EXPECT_EQ(a.logical, l.logical_bytes());
    EXPECT_EQ(a.live, states);
    EXPECT_EQ(a.reserved, kv.region(RegionId::fixed)->reserved_bytes() + kv.region(RegionId::comp4)->reserved_bytes() +
                              kv.region(RegionId::index)->reserved_bytes() +
                              kv.region(RegionId::comp128)->reserved_bytes());
    ASSERT_TRUE(kv.ensure_tokens(1000));
    kv.set_n_tokens(1000);
    a = kv.accounting();
    // raw: min(1000, 80) rows × 4 layers; 250 ratio-4 rows of 2 layers; 7 ratio-128 rows.
    EXPECT_EQ(a.live, 80ull * 64 * 4 * 4 + states + 250ull * 2 * (64 + 32) * 4 + 7ull * 64 * 4);
    EXPECT_EQ(a.committed, kv.region(RegionId::fixed)->committed_bytes() +
                               kv.region(RegionId::comp4)->committed_bytes() +
                               kv.region(RegionId::index)->committed_bytes() +
                               kv.region(RegionId::comp128)->committed_bytes());
    EXPECT_GE(a.committed, a.live);
    kv.set_n_tokens(10);
    EXPECT_EQ(kv.accounting().live, 10ull * 64 * 4 * 4 + states + 2ull * 2 * (64 + 32) * 4);

    Accounting sum;
    sum += a;
    sum += a;
    EXPECT_EQ(sum.logical, 2 * a.logical);
    EXPECT_EQ(sum.reserved, 2 * a.reserved);
    EXPECT_EQ(sum.committed, 2 * a.committed);
    EXPECT_EQ(sum.live, 2 * a.live);
}

TEST(KvSession, OnlyRawLayers) {
    const model::Config c = tiny_config({0, 0});
    const Layout l = Layout::make(c, 4096, 64);
    SessionKV kv(c, l, opts(4096), nullptr, host_region_factory());
    EXPECT_EQ(kv.region(RegionId::comp4), nullptr);
    EXPECT_EQ(kv.region(RegionId::comp128), nullptr);
    EXPECT_TRUE(kv.ensure_tokens(4096));
    EXPECT_FALSE(kv.ensure_tokens(4097));
    EXPECT_EQ(kv.accounting().logical, l.fixed_bytes);
}
