// Device memory running out, for real: other allocations hold all but a few MiB of the GPU.
// At load, the weights are checked against free memory before any upload and the backend
// refuses with the sizes; while a session's KV grows, its commit is refused, the session is
// left as it was, and the other sessions of the same step run and match a solo run.
#include <algorithm>

#include "cuda_test_util.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

// Holds device memory until at most about `leave` bytes are free (pieces of 1 GiB down to
// 1 MiB, so little more than `leave` remains).
class DeviceHog {
public:
    explicit DeviceHog(size_t leave) {
        for (size_t piece = 1ull << 30; piece >= (1ull << 20);) {
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b <= leave + piece) {
                piece /= 2;
                continue;
            }
            void* p = nullptr;
            if (cudaMalloc(&p, piece) == cudaSuccess) {
                held_.push_back(p);
            } else {
                cudaGetLastError();
                piece /= 2;
            }
        }
    }
    ~DeviceHog() {
        for (void* p : held_) cudaFree(p);
    }
    DeviceHog(const DeviceHog&) = delete;
    DeviceHog& operator=(const DeviceHog&) = delete;

private:
    std::vector<void*> held_;
};

size_t free_bytes() {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return free_b;
}

}  // namespace

TEST(CudaMemory, WeightsThatDoNotFitAreRefusedWithTheSizes) {
    DSV4_REQUIRE_CUDA();
    auto m = model::Model::load(synth("memory-small-f32", "small", "f32"));
    BackendOptions o;
    o.prefill_chunk = 512;   // (the sizes below were set for 512-token rounds)
    std::string why;
    {
        DeviceHog hog(64ull << 20);   // less than the weights plus the backend's working room
        std::printf("[cuda-memory] free while held: %zu MiB\n", free_bytes() >> 20);
        auto g = make_cuda_backend(*m, o, &why);
        EXPECT_EQ(g, nullptr);
        std::printf("[cuda-memory] load refused: %s\n", why.c_str());
        EXPECT_NE(why.find("device memory"), std::string::npos) << why;
        EXPECT_NE(why.find("free"), std::string::npos) << why;
    }
    // Once the memory is back, the same process loads the model and computes.
    auto g = make_cuda_backend(*m, o, &why);
    ASSERT_NE(g, nullptr) << why;
    const size_t V = m->config.n_vocab;
    kv::Budget budget;
    auto kv = session(*g, 256, &budget);
    std::vector<float> lg(V);
    g->forward_one(*kv, random_tokens(16, 0, int32_t(V), 3), false, lg.data());
    EXPECT_TRUE(std::all_of(lg.begin(), lg.end(), [](float x) { return std::isfinite(x); }));
}

TEST(CudaMemory, KvCommitRefusedWhenTheDeviceIsFullOthersRun) {
    DSV4_REQUIRE_CUDA();
    auto m = model::Model::load(synth("memory-small-f32", "small", "f32"));
    BackendOptions o;
    o.prefill_chunk = 512;   // (the sizes below were set for 512-token rounds)
    std::string why;
    auto g = make_cuda_backend(*m, o, &why);
    ASSERT_NE(g, nullptr) << why;
    const size_t V = m->config.n_vocab;
    const auto big = random_tokens(9000, 0, int32_t(V), 6);
    const auto small_in = random_tokens(10, 0, int32_t(V), 7);
    std::vector<float> lb(V), lo(V), ls(V), lw(V);
    kv::Budget budget;
    // Everything the refused step will need besides KV exists before memory runs out: the
    // workspace of a 9,000-token prompt (then given back with its session), the solo
    // reference, and the CUDA graph of a 10-token round (captured on its second run).
    {
        auto warm = session(*g, 65536, &budget);
        g->forward_one(*warm, big, false, lw.data());
    }
    auto solo = session(*g, 2048, &budget), twice = session(*g, 2048, &budget);
    g->forward_one(*solo, small_in, false, ls.data());
    g->forward_one(*twice, small_in, false, lw.data());
    kv::Options lazy;
    lazy.initial_rows = 1;
    auto s = session(*g, 65536, &budget, lazy);
    auto other = session(*g, 2048, &budget);
    {
        DeviceHog hog(2ull << 20);
        std::printf("[cuda-memory] free while held: %zu MiB\n", free_bytes() >> 20);
        StepInput in[2] = {{s.get(), big, false, lb.data(), {}}, {other.get(), small_in, false, lo.data(), {}}};
        g->forward(in);
        EXPECT_FALSE(in[0].error.empty()) << "the 9,000-token step should not have found device memory";
        std::printf("[cuda-memory] KV commit refused: %s\n", in[0].error.c_str());
        EXPECT_EQ(s->n_tokens(), 0u);
        EXPECT_TRUE(in[1].error.empty()) << in[1].error;
    }
    test::expect_same(lo, ls, V, "the other session of the refused step");
    // With memory back, the refused session takes its prompt.
    g->forward_one(*s, big, false, lb.data());
    EXPECT_EQ(s->n_tokens(), big.size());
}
