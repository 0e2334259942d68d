// CudaGrowableRegion: reserve once, commit in granules, zeroed, never moves; clean refusals
// (budget, reservation, free device memory) that change nothing; everything released.
#include "cuda/region.h"
#include "cuda_test_util.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {
constexpr uint64_t MiB = 1ull << 20;

std::vector<uint8_t> read(const kv::Region& r, uint64_t off, uint64_t n) {
    std::vector<uint8_t> v(n);
    r.copy_out(off, v.data(), n);
    return v;
}
}  // namespace

TEST(CudaRegion, ReserveCommitGrowWithoutMoving) {
    DSV4_REQUIRE_CUDA();
    kv::Budget budget;
    auto r = cuda::make_cuda_region(100 * MiB, &budget, "test", 8 * MiB);
    EXPECT_TRUE(r->on_device());
    EXPECT_EQ(r->reserved_bytes() % r->chunk_bytes(), 0u);
    EXPECT_GE(r->reserved_bytes(), 100 * MiB);
    EXPECT_EQ(r->committed_bytes(), 0u);
    uint8_t* base = r->base();
    ASSERT_TRUE(r->commit(5 * MiB).ok);
    EXPECT_EQ(r->committed_bytes() % r->chunk_bytes(), 0u);
    EXPECT_GE(r->committed_bytes(), 5 * MiB);
    EXPECT_EQ(budget.used(), r->committed_bytes());
    auto z = read(*r, 0, r->committed_bytes());
    for (uint8_t b : z) ASSERT_EQ(b, 0);
    std::vector<uint8_t> pat(3 * MiB);
    for (size_t i = 0; i < pat.size(); ++i) pat[i] = uint8_t(i * 7 + 1);
    r->copy_in(MiB, pat.data(), pat.size());
    // Dirty the device memory through a kernel-side write as well.
    ASSERT_EQ(cudaMemset(base, 0xAB, 1024), cudaSuccess);
    ASSERT_TRUE(r->commit(61 * MiB).ok);   // several pieces of 8 MiB
    EXPECT_EQ(r->base(), base);
    EXPECT_GE(r->committed_bytes(), 61 * MiB);
    EXPECT_EQ(read(*r, MiB, pat.size()), pat);
    auto head = read(*r, 0, 1024);
    for (uint8_t b : head) ASSERT_EQ(b, 0xAB);
    auto fresh = read(*r, 6 * MiB, r->committed_bytes() - 6 * MiB);
    for (uint8_t b : fresh) ASSERT_EQ(b, 0) << "newly committed memory must read as zero";
    r->zero(MiB, MiB);
    auto zz = read(*r, MiB, MiB);
    for (uint8_t b : zz) ASSERT_EQ(b, 0);
    EXPECT_THROW(r->copy_out(r->committed_bytes() - 10, pat.data(), 20), Error);
    EXPECT_THROW(r->zero(r->committed_bytes(), 1), Error);
}

TEST(CudaRegion, RefusalsChangeNothing) {
    DSV4_REQUIRE_CUDA();
    kv::Budget budget(6 * MiB);
    auto r = cuda::make_cuda_region(64 * MiB, &budget, "kv comp4");
    ASSERT_TRUE(r->commit(MiB).ok);
    const uint64_t c0 = r->committed_bytes(), u0 = budget.used();
    kv::Status s = r->commit(20 * MiB);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.message.find("budget"), std::string::npos) << s.message;
    EXPECT_EQ(r->committed_bytes(), c0);
    EXPECT_EQ(budget.used(), u0);
    s = r->commit(r->reserved_bytes() + 1);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.message.find("kv comp4"), std::string::npos) << s.message;
    EXPECT_EQ(r->committed_bytes(), c0);
    // More than the device has: refused by the free-memory check, nothing changes.
    size_t free_b = 0, total_b = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    kv::Budget unlimited;
    auto big = cuda::make_cuda_region(total_b + 4096 * MiB, &unlimited, "huge");
    s = big->commit(total_b + 1024 * MiB);
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.message.find("huge"), std::string::npos) << s.message;
    EXPECT_EQ(big->committed_bytes(), 0u);
    EXPECT_EQ(unlimited.used(), 0u);
    EXPECT_TRUE(big->commit(2 * MiB).ok) << "the region stays usable after a refusal";
}

TEST(CudaRegion, ADeviceWithoutVmmIsRefusedByName) {
    // A GPU without the CUDA virtual memory API (simulated): a clear error naming the region,
    // the device and what is missing, for a region and for a session's KV; nothing is
    // counted, and regions work again once the device has it.
    DSV4_REQUIRE_CUDA();
    struct Reset {
        ~Reset() { cuda::region_vmm_override(-1); }
    } reset;
    kv::Budget budget;
    cuda::region_vmm_override(0);
    try {
        auto r = cuda::make_cuda_region(64 * MiB, &budget, "kv raw");
        ADD_FAILURE() << "a region was made on a device without VMM";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("kv raw"), std::string::npos) << m;
        EXPECT_NE(m.find("CUDA device"), std::string::npos) << m;
        EXPECT_NE(m.find("virtual memory management"), std::string::npos) << m;
    }
    const model::Config c = model::synth_config("small", 0, 320);
    const kv::Layout layout = kv::Layout::make(c, 65536, 512);
    EXPECT_THROW(kv::SessionKV(c, layout, kv::Options{}, &budget, cuda::cuda_region_factory()), Error);
    EXPECT_EQ(budget.used(), 0u);
    cuda::region_vmm_override(-1);
    auto r = cuda::make_cuda_region(64 * MiB, &budget, "kv raw");
    EXPECT_TRUE(r->commit(MiB).ok);
}

TEST(CudaRegion, DestructionReleasesDeviceMemory) {
    DSV4_REQUIRE_CUDA();
    size_t f0 = 0, f1 = 0, f2 = 0, t = 0;
    kv::Budget budget;
    ASSERT_EQ(cudaMemGetInfo(&f0, &t), cudaSuccess);
    {
        auto r = cuda::make_cuda_region(1024 * MiB, &budget, "test");
        ASSERT_TRUE(r->commit(512 * MiB).ok);
        ASSERT_EQ(cudaMemGetInfo(&f1, &t), cudaSuccess);
        EXPECT_GE(f0 - f1, 500 * MiB);
    }
    EXPECT_EQ(budget.used(), 0u);
    ASSERT_EQ(cudaMemGetInfo(&f2, &t), cudaSuccess);
    EXPECT_LE(f0 > f2 ? f0 - f2 : 0, 16 * MiB);
}

TEST(CudaRegion, SessionKvOnTheDeviceStartsInitialised) {
    DSV4_REQUIRE_CUDA();
    const model::Config c = model::synth_config("small", 0, 320);
    kv::Budget budget;
    const kv::Layout layout = kv::Layout::make(c, 65536, 512);
    kv::SessionKV kv(c, layout, kv::Options{}, &budget, cuda::cuda_region_factory());
    EXPECT_TRUE(kv.on_device());
    const kv::Region* fixed = kv.region(kv::RegionId::fixed);
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        if (!c.ratio(il)) continue;
        std::vector<float> sc(layout.state_bytes(il) / 4);
        fixed->copy_out(layout.state_sc_off[il], sc.data(), layout.state_bytes(il));
        for (float v : sc) ASSERT_EQ(v, kv::kNegInf);
    }
    const auto a = kv.accounting();
    EXPECT_LT(a.committed, a.logical);
    EXPECT_TRUE(kv.ensure_tokens(20000).ok);
    EXPECT_GE(kv.committed_rows(4), 5000u);
}
