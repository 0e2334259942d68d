// Budget and HostRegion: reserve once, commit a growing prefix, never move, never overrun.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dsv4/kv.h"

using namespace dsv4;
using namespace dsv4::kv;

namespace {
constexpr uint64_t MiB = 1ull << 20;
}

TEST(KvBudget, AcquireAndRelease) {
    Budget b(10 * MiB);
    EXPECT_TRUE(b.acquire(4 * MiB, "a"));
    EXPECT_TRUE(b.acquire(6 * MiB, "b"));
    EXPECT_EQ(b.used(), 10 * MiB);
    Status s = b.acquire(1, "kv comp4");
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("kv comp4"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("budget"), std::string::npos) << s.message;
    EXPECT_EQ(b.used(), 10 * MiB);   // refusal changes nothing
    b.release(6 * MiB);
    EXPECT_EQ(b.used(), 4 * MiB);
    EXPECT_FALSE(b.acquire(UINT64_MAX, "huge"));   // no wrap-around
    EXPECT_EQ(b.used(), 4 * MiB);
}

TEST(KvBudget, ZeroLimitIsUnlimited) {
    Budget b;
    EXPECT_TRUE(b.acquire(1ull << 50, "x"));
    EXPECT_EQ(b.used(), 1ull << 50);
    b.set_limit(1);
    EXPECT_FALSE(b.acquire(1, "y"));   // already over a newly lowered limit
}

TEST(KvBudget, ThreadSafe) {
    // Threads race to acquire and release; the limit must never be exceeded and every
    // successful acquisition must be accounted for exactly.
    constexpr uint64_t kLimit = 1000;
    Budget b(kLimit);
    std::atomic<bool> over{false};
    std::atomic<uint64_t> granted{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 8; ++t) {
        ts.emplace_back([&, t] {
            for (int i = 0; i < 20000; ++i) {
                const uint64_t n = 1 + uint64_t((i * 7 + t * 13) % 97);
                if (b.acquire(n, "t")) {
                    granted += n;
                    if (b.used() > kLimit) over = true;
                    b.release(n);
                }
            }
        });
    }
    for (auto& t : ts) t.join();
    EXPECT_FALSE(over.load());
    EXPECT_GT(granted.load(), 0u);
    EXPECT_EQ(b.used(), 0u);
}

TEST(KvHostRegion, ReserveCommitGrowKeepsBase) {
    Budget budget;
    auto r = make_host_region(10 * MiB + 1, &budget, "test region", 2 * MiB);
    EXPECT_FALSE(r->on_device());
    EXPECT_EQ(r->chunk_bytes(), 2 * MiB);
    EXPECT_EQ(r->reserved_bytes(), 12 * MiB);   // rounded to the chunk
    EXPECT_EQ(r->committed_bytes(), 0u);
    uint8_t* base = r->base();
    ASSERT_NE(base, nullptr);

    ASSERT_TRUE(r->commit(1));
    EXPECT_EQ(r->committed_bytes(), 2 * MiB);
    EXPECT_EQ(budget.used(), 2 * MiB);
    std::memset(base, 0xAB, 2 * MiB);

    ASSERT_TRUE(r->commit(2 * MiB));   // already committed: no-op
    EXPECT_EQ(r->committed_bytes(), 2 * MiB);

    ASSERT_TRUE(r->commit(5 * MiB));
    EXPECT_EQ(r->committed_bytes(), 6 * MiB);
    EXPECT_EQ(budget.used(), 6 * MiB);
    EXPECT_EQ(r->base(), base);   // never moves
    EXPECT_EQ(base[0], 0xAB);     // never copied or cleared
    EXPECT_EQ(base[2 * MiB - 1], 0xAB);
    for (uint64_t o = 2 * MiB; o < 6 * MiB; o += 4096) ASSERT_EQ(base[o], 0) << o;   // fresh memory is zero
    base[6 * MiB - 1] = 1;   // writable to the end

    ASSERT_TRUE(r->commit(12 * MiB));
    EXPECT_EQ(r->committed_bytes(), 12 * MiB);
    EXPECT_EQ(r->base(), base);
    r.reset();
    EXPECT_EQ(budget.used(), 0u);   // destructor gives the budget back
}

TEST(KvHostRegion, CommitBeyondReserveFails) {
    Budget budget;
    auto r = make_host_region(4 * MiB, &budget, "small region", 2 * MiB);
    ASSERT_TRUE(r->commit(2 * MiB));
    Status s = r->commit(4 * MiB + 1);
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("small region"), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("exceeds the reservation"), std::string::npos) << s.message;
    EXPECT_EQ(r->committed_bytes(), 2 * MiB);
    EXPECT_EQ(budget.used(), 2 * MiB);
}

TEST(KvHostRegion, BudgetRefusalLeavesStateUnchanged) {
    Budget budget(5 * MiB);
    auto r = make_host_region(16 * MiB, &budget, "budgeted region", 2 * MiB);
    ASSERT_TRUE(r->commit(4 * MiB));
    uint8_t* base = r->base();
    base[100] = 42;
    Status s = r->commit(6 * MiB);   // would take 6 MiB of a 5 MiB budget
    EXPECT_FALSE(s);
    EXPECT_NE(s.message.find("budgeted region"), std::string::npos) << s.message;
    EXPECT_EQ(r->committed_bytes(), 4 * MiB);
    EXPECT_EQ(budget.used(), 4 * MiB);
    EXPECT_EQ(r->base(), base);
    EXPECT_EQ(base[100], 42);
    budget.set_limit(6 * MiB);
    EXPECT_TRUE(r->commit(6 * MiB));   // usable after the refusal
    EXPECT_EQ(base[100], 42);
}

TEST(KvHostRegion, ChunkRoundedToPages) {
    auto r = make_host_region(10000, nullptr, "odd chunk", 5000);
    EXPECT_EQ(r->chunk_bytes() % 4096, 0u);
    EXPECT_GE(r->chunk_bytes(), 5000u);
    EXPECT_EQ(r->reserved_bytes() % r->chunk_bytes(), 0u);
    EXPECT_GE(r->reserved_bytes(), 10000u);
    ASSERT_TRUE(r->commit(1));
    EXPECT_EQ(r->committed_bytes(), r->chunk_bytes());
}

TEST(KvHostRegion, CopiesAndZeroAreRangeChecked) {
    auto r = make_host_region(4 * MiB, nullptr, "copy region", 2 * MiB);
    ASSERT_TRUE(r->commit(1));
    std::vector<uint8_t> src(1000), dst(1000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 31 + 7);
    r->copy_in(2 * MiB - 1000, src.data(), 1000);
    r->copy_out(2 * MiB - 1000, dst.data(), 1000);
    EXPECT_EQ(src, dst);
    r->zero(2 * MiB - 500, 500);
    r->copy_out(2 * MiB - 1000, dst.data(), 1000);
    for (size_t i = 0; i < 500; ++i) EXPECT_EQ(dst[i], src[i]);
    for (size_t i = 500; i < 1000; ++i) EXPECT_EQ(dst[i], 0);

    EXPECT_THROW(r->copy_in(2 * MiB - 999, src.data(), 1000), Error);   // past the committed prefix
    EXPECT_THROW(r->copy_out(2 * MiB, dst.data(), 1), Error);
    EXPECT_THROW(r->zero(UINT64_MAX, 2), Error);                          // no wrap-around
    try {
        r->copy_out(3 * MiB, dst.data(), 1);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("copy region"), std::string::npos) << e.what();
    }
}

TEST(KvHostRegion, ConcurrentRegionsShareOneBudget) {
    Budget budget(64 * MiB);
    std::vector<std::thread> ts;
    std::atomic<uint64_t> ok_bytes{0};
    std::atomic<int> done{0};
    for (int t = 0; t < 4; ++t) {
        ts.emplace_back([&] {
            auto r = make_host_region(32 * MiB, &budget, "shared", 2 * MiB);
            for (uint64_t b = 2 * MiB; b <= 32 * MiB; b += 2 * MiB)
                if (!r->commit(b)) break;
            ok_bytes += r->committed_bytes();
            EXPECT_LE(budget.used(), 64 * MiB);
            // Every region lives until all threads have committed, so the budget is the
            // only thing that stops them.
            ++done;
            while (done.load() < 4) std::this_thread::yield();
        });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(ok_bytes.load(), 64 * MiB);   // the budget, exactly, was handed out
    EXPECT_EQ(budget.used(), 0u);
}

TEST(KvHostRegion, EmptyReservation) {
    auto r = make_host_region(0, nullptr, "empty");
    EXPECT_EQ(r->reserved_bytes(), 0u);
    EXPECT_TRUE(r->commit(0));
    EXPECT_FALSE(r->commit(1));
}

// The kernel refusing a commit (here: RLIMIT_DATA makes mprotect answer ENOMEM) must fail
// cleanly: message with the label, the bytes and errno's text; nothing committed; budget
// given back; the region still usable. Runs in a child so the limit stays there.
TEST(KvHostRegion, KernelRefusalFailsCleanly) {
    auto body = [] {
        Budget budget;
        auto r = make_host_region(4ull << 30, &budget, "refused region", 2 * MiB);
        if (!r->commit(2 * MiB)) std::_Exit(10);
        r->base()[0] = 9;
        unsigned long long vm_data_kib = 0;
        if (FILE* f = std::fopen("/proc/self/status", "r")) {
            char line[256];
            while (std::fgets(line, sizeof line, f))
                if (std::sscanf(line, "VmData: %llu kB", &vm_data_kib) == 1) break;
            std::fclose(f);
        }
        if (vm_data_kib == 0) std::_Exit(11);
        rlimit lim{};
        lim.rlim_cur = lim.rlim_max = vm_data_kib * 1024 + 256 * MiB;
        if (setrlimit(RLIMIT_DATA, &lim) != 0) std::_Exit(12);
        Status s = r->commit(3ull << 30);
        if (s) std::_Exit(13);
        if (s.message.find("refused region") == std::string::npos) std::_Exit(14);
        if (s.message.find(std::strerror(ENOMEM)) == std::string::npos) std::_Exit(15);
        if (s.message.find(std::to_string((3ull << 30) - 2 * MiB)) == std::string::npos) std::_Exit(16);
        if (r->committed_bytes() != 2 * MiB || budget.used() != 2 * MiB) std::_Exit(17);
        if (r->base()[0] != 9) std::_Exit(18);
        if (!r->commit(4 * MiB) || budget.used() != 4 * MiB) std::_Exit(19);   // still usable
        std::_Exit(0);
    };
    EXPECT_EXIT(body(), ::testing::ExitedWithCode(0), "");
}
