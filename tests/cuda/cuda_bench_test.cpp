// GPU benchmarks (opt-in: DSV4_CUDA_BENCH=1; scripts/gpu.sh runs them): decode and prefill
// tokens/s on a `synth flash` model of DSV4_BENCH_LAYERS layers (default 4) with the shipped
// 2-bit mix, per-phase device times and a projection to 43 layers, the device-to-device copy
// bandwidth, and KV committed vs eager at a 1M logical context with a 4K conversation.
#include <cuda_profiler_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "cuda/backend_impl.h"
#include "cuda/kernels.h"
#include "cuda/region.h"
#include "cuda_test_util.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint32_t env_u32(const char* name, uint32_t def) {
    const char* e = std::getenv(name);
    return e ? uint32_t(std::strtoul(e, nullptr, 10)) : def;
}

// A comma-separated list of numbers from the environment (`def` when unset or empty).
std::vector<uint32_t> env_u32_list(const char* name, const char* def) {
    const char* e = std::getenv(name);
    const std::string list = e && *e ? e : def;
    std::vector<uint32_t> out;
    for (size_t at = 0; at < list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        out.push_back(uint32_t(std::strtoul(list.substr(at, comma - at).c_str(), nullptr, 10)));
        at = comma + 1;
    }
    return out;
}

double d2d_copy_gbs() {
    const size_t n = 2ull << 30;
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
    cudaMemset(a, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0);
    for (int i = 0; i < 10; ++i) cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * n * 10 / (ms * 1e-3) / 1e9;   // bytes read + written
}

// Device µs of launch() on the default stream, timed by events: the median of `runs` calls,
// each after before(i) (untimed: a cache flush, a warming call) and a device synchronisation.
template <typename F, typename B>
double timed_median_us(int runs, F&& launch, B&& before) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> t;
    for (int i = 0; i < runs; ++i) {
        before(i);
        cudaDeviceSynchronize();
        cudaEventRecord(e0);
        launch();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(t.begin(), t.end());
    return double(t[t.size() / 2]);
}
// The median of 9 after one untimed call (warm-up, and any one-time set-up such as a kernel
// attribute).
template <typename F>
double median_us(F&& launch) {
    launch();
    return timed_median_us(9, launch, [](int) {});
}

// A Q8_0 weight of N rows of K values in the backend's repacked form (codes, f16 scales),
// from a hash: for timing products, not for their values. signed_scales: every other block's
// scale negative.
struct SynthQ8_0 {
    DevVec<int8_t> q;
    DevVec<uint16_t> d;
    cuda::DevWeight w;
    SynthQ8_0(uint64_t N, uint64_t K, bool signed_scales) : q(codes(N * K)), d(scales(N * K / 32, signed_scales)) {
        w.type = uint32_t(quant::Type::Q8_0);
        w.K = K;
        w.rows = N;
        w.row_bytes = K / 32 * 34;
        w.qs = q.get();
        w.d = d.get();
    }
    static std::vector<int8_t> codes(uint64_t n) {
        std::vector<int8_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = int8_t((i * 2654435761u) >> 24);
        return v;
    }
    static std::vector<uint16_t> scales(uint64_t n, bool signed_scales) {
        std::vector<uint16_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = uint16_t((signed_scales && (i & 1) ? 0x8000 : 0) | (0x2000 + i % 512));
        return v;
    }
};

// The benchmark model, synthesised (or reused: DSV4_BENCH_MODEL) and uploaded once per
// process, so the benchmarks of one call share the ~81 GB upload of the whole model.
struct BenchModel {
    uint32_t layers = 0;
    double t_synth = 0, t_load = 0;
    std::unique_ptr<model::Model> m;
    std::unique_ptr<Backend> g;
};

BenchModel& bench_model() {
    static BenchModel b;
    if (b.g) return b;
    b.layers = env_u32("DSV4_BENCH_LAYERS", 4);
    double t0 = now_s();
    // DSV4_BENCH_RATIO=0|4|128 gives every layer that compression ratio and no hash-routed
    // layers (the flash pattern mixes them: ratios 0, 0, then 4 and 128 alternating; 3 hash
    // layers), so each kind of layer's decode and prefill time can be measured on its own.
    const char* ratio_env = std::getenv("DSV4_BENCH_RATIO");
    const int ratio = ratio_env && *ratio_env ? std::atoi(ratio_env) : -1;
    auto edit = [ratio](model::Config& c) {
        if (ratio < 0) return;
        for (auto& r : c.compress_ratio) r = uint32_t(ratio);
        c.n_hash_layer = 0;
    };
    // DSV4_BENCH_MODEL=PATH keeps the synthesised model there (written once, reused by later
    // processes: an A/B of settings read once per process then pays the ~60 s synthesis once).
    const char* keep = std::getenv("DSV4_BENCH_MODEL");
    const std::string name =
        "bench-flash-" + std::to_string(b.layers) + (ratio >= 0 ? "-r" + std::to_string(ratio) : "");
    const std::string path = keep && *keep
                                 ? test::synth_model_at(keep, "flash", b.layers, 129280, plain_vocab, edit, "flash", 1)
                                 : synth(name, "flash", "flash", b.layers, 129280, edit);
    b.t_synth = now_s() - t0;
    t0 = now_s();
    b.m = model::Model::load(path);
    BackendOptions o;
    o.numerics = Numerics::Official;
    // DSV4_BENCH_PREFILL_CHUNK: the backend's chunk (2,048: the prefill figure), the
    // largest round FlashPrefillByRoundSize can measure
    o.prefill_chunk = env_u32("DSV4_BENCH_PREFILL_CHUNK", 2048);
    std::string why;
    b.g = make_cuda_backend(*b.m, o, &why);
    if (!b.g) ADD_FAILURE() << why;
    b.t_load = now_s() - t0;
    return b;
}

// The model's Q8_0 products of a prefill chunk: q_b, the shared expert's gate (up is the same)
// and down, out_a (8 groups of 1,024 rows, each reading its 4,096 values of a 32,768-value row)
// and out_b.
struct Q8Shape {
    const char* name;
    uint64_t K, N, rpg;
    uint64_t act_k() const { return rpg ? N / rpg * K : K; }   // an activation row's values
};
const Q8Shape kQ8Shapes[] = {{"q_b", 1024, 32768, 0}, {"shared gate", 4096, 2048, 0}, {"shared down", 2048, 4096, 0},
                             {"out_a", 4096, 8192, 1024}, {"out_b", 8192, 4096, 0}};

// R rows of a Q8_0 activation AK values wide, codes and scales of a fixed pattern, on the host
// and the device.
struct SynthQ8Act {
    std::vector<int8_t> q;
    std::vector<float> d;
    DevVec<int8_t> dq;
    DevVec<float> dd;
    cuda::DevAct a;
    SynthQ8Act(uint32_t R, uint64_t AK) : q(codes(uint64_t(R) * AK)), d(scales(uint64_t(R) * AK / 32)), dq(q), dd(d) {
        a.kind = cuda::ActKind::Q8_0;
        a.K = AK;
        a.q = dq.get();
        a.d = dd.get();
    }
    static std::vector<int8_t> codes(uint64_t n) {
        std::vector<int8_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = int8_t(int((i * 2246822519u) >> 24) % 255 - 127);
        return v;
    }
    static std::vector<float> scales(uint64_t n) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = 0.001f * float(1 + i % 97) * (i % 3 ? 1.0f : -1.0f);
        return v;
    }
};

}  // namespace

TEST(CudaBench, FlashDecodePrefillKv) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    const uint32_t ctx_tokens = env_u32("DSV4_BENCH_CONTEXT", 4096);
    const uint32_t n_decode = env_u32("DSV4_BENCH_DECODE", 64);
    // The first run's context (the process's warm-up) and the profiles': 8K, or the smallest
    // power of two that holds a longer DSV4_BENCH_CONTEXT prompt and its decode steps (decode
    // at a long conversation: the indexer scores and selects over every compressed row).
    uint64_t small_ctx = 8192;
    while (small_ctx < uint64_t(ctx_tokens) + std::max<uint32_t>(n_decode, 16) + 2) small_ctx *= 2;
    const std::string small_name = "ctx " + std::to_string(small_ctx / 1024) + "K lazy";
    BenchModel& bm = bench_model();
    ASSERT_TRUE(bm.g);
    const uint32_t layers = bm.layers;
    const double t_synth = bm.t_synth, t_load = bm.t_load;
    auto& m = bm.m;
    auto& g = bm.g;
    const size_t V = m->config.n_vocab;
    const double copy_gbs = d2d_copy_gbs();

    struct Run {
        const char* name;
        double prefill_tps = 0, decode_tps = 0, layers_ms = 0, head_ms = 0;
        uint64_t committed = 0, logical = 0;
    };
    // Decode steps are greedy: by default the next id is formed on the device (StepInput::greedy:
    // only the id downloaded, as `dsv4 run` / `dsv4 bench` do); DSV4_BENCH_GREEDY=0, or the
    // "logits" run beside the others, downloads the logits and takes the argmax on the host.
    const bool device_greedy = env_u32("DSV4_BENCH_GREEDY", 1) != 0;
    auto run = [&](const char* name, uint64_t ctx, bool eager, bool greedy_ids = true) {
        greedy_ids = greedy_ids && device_greedy;
        Run r{name};
        kv::Options ko;
        ko.eager = eager;
        kv::Budget budget;
        auto kv = session(*g, ctx, &budget, ko);
        const auto prompt = random_tokens(ctx_tokens, 0, int32_t(V), 1);
        std::vector<float> lg(V);
        const double a = now_s();
        g->forward_one(*kv, prompt, false, lg.data());
        r.prefill_tps = ctx_tokens / (now_s() - a);
        int32_t t = argmax(lg.data(), V);
        g->forward_one(*kv, std::vector<int32_t>{t}, false, lg.data());   // warm-up
        t = argmax(lg.data(), V);
        double lay = 0, head = 0;
        const double b = now_s();
        for (uint32_t i = 0; i < n_decode; ++i) {
            const std::vector<int32_t> one{t};
            if (greedy_ids) {
                t = g->forward_greedy(*kv, one);
            } else {
                g->forward_one(*kv, one, false, lg.data());
                t = argmax(lg.data(), V);
            }
            const auto st = cuda::last_step_timing();
            lay += st.embed_layers_ms;
            head += st.head_ms;
        }
        r.decode_tps = n_decode / (now_s() - b);
        r.layers_ms = lay / n_decode;
        r.head_ms = head / n_decode;
        const auto acc = kv->accounting();
        r.committed = acc.committed;
        r.logical = acc.logical;
        return r;
    };
    // Per group of kernels (events between groups, no graphs): decode steps at ctx_tokens,
    // or one prefill chunk after the tokens before it: 2,048 tokens, or DSV4_BENCH_PREFILL_CHUNK's
    // round where that is larger (at most the whole prompt: 4,096 tokens from the first).
    auto profile = [&](bool prefill) {
        kv::Budget budget;
        auto kv = session(*g, small_ctx, &budget);
        const auto prompt = random_tokens(ctx_tokens, 0, int32_t(V), 1);
        std::vector<float> lg(V);
        const uint32_t chunk = std::min<uint32_t>(std::max<uint32_t>(2048, env_u32("DSV4_BENCH_PREFILL_CHUNK", 2048)), ctx_tokens);
        const std::vector<int32_t> head(prompt.begin(), prompt.end() - (prefill ? chunk : 0));
        if (!head.empty()) g->forward_one(*kv, head, false, lg.data());
        // Under Nsight Compute (ncu --profile-from-start off): only these decode steps
        // (DSV4_NCU=1) or this prefill chunk (DSV4_NCU=prefill) are profiled, kernel by kernel.
        const char* ncu_env = std::getenv("DSV4_NCU");
        const bool ncu = ncu_env && prefill == (std::strcmp(ncu_env, "prefill") == 0);
        cuda::profile_enable(true);
        cuda::profile_reset();
        const uint32_t n = prefill ? chunk : ncu ? 2 : 16;   // tokens profiled
        if (ncu) cudaProfilerStart();
        if (prefill) {
            g->forward_one(*kv, std::vector<int32_t>(prompt.end() - chunk, prompt.end()), false, lg.data());
        } else {
            for (uint32_t i = 0; i < n; ++i)
                g->forward_one(*kv, std::vector<int32_t>{argmax(lg.data(), V)}, false, lg.data());
        }
        if (ncu) cudaProfilerStop();
        cuda::profile_enable(false);
        auto prof = cuda::profile_snapshot();
        std::sort(prof.begin(), prof.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
        double total = 0;
        for (const auto& e : prof) total += e.ms;
        std::printf("\n== %s profile at %u tokens (no graphs; events between groups), per token ==\n",
                    prefill ? ("prefill (one " + std::to_string(chunk) + "-token chunk)").c_str() : "decode",
                    ctx_tokens);
        std::printf("%-22s %10s %8s %12s %10s\n", "group", "us/token", "share", "weight GB/s", "of copy");
        for (const auto& e : prof) {
            const double us = 1000.0 * e.ms / n;
            const double gbs = e.bytes > 0 ? e.bytes / (e.ms * 1e-3) / 1e9 : 0;
            std::printf("%-22s %10.2f %7.1f%% %12.0f %9.0f%%\n", e.name.c_str(), us, 100.0 * e.ms / total, gbs,
                        copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0);
        }
        std::printf("total %.2f us/token (profiled, no graphs)\n", 1000.0 * total / n);
    };
    // DSV4_BENCH_AB=1 (settings compared process by process): the 8K run (a process's first
    // decode measures ~3 % slower: the warm-up) and the 1M lazy run alone, no profiles.
    const bool ab = std::getenv("DSV4_BENCH_AB") != nullptr;
    std::vector<Run> runs;
    runs.push_back(run(small_name.c_str(), small_ctx, false));
    runs.push_back(run("ctx 1M lazy", 1 << 20, false));
    if (!ab) {
        runs.push_back(run("ctx 1M eager", 1 << 20, true));
        if (device_greedy) runs.push_back(run("ctx 1M logits", 1 << 20, false, false));   // host argmax
        // The same decode with plain graph edges instead of programmatic ones (A/B in one run).
        setenv("DSV4_CUDA_PDL", "0", 1);
        runs.push_back(run("ctx 1M no PDL", 1 << 20, false));
        unsetenv("DSV4_CUDA_PDL");
    }

    // KV of the full 43-layer model at a 1M context holding a 4K conversation (accounting
    // only: regions are committed, no forward pass).
    const model::Config full = model::synth_config("flash", 0, 129280);
    kv::Budget kb;
    const kv::Layout fl = kv::Layout::make(full, 1 << 20, 2048);
    uint64_t full_lazy = 0;
    {
        kv::SessionKV s(full, fl, kv::Options{}, &kb, cuda::cuda_region_factory());
        EXPECT_TRUE(s.ensure_tokens(ctx_tokens).ok);
        full_lazy = s.accounting().committed;
    }

    std::printf("\n== CUDA benchmark: synth flash, %u layers, 2-bit mix, %zu-token vocab ==\n", layers, V);
    std::printf("model file %.2f GiB; synth %.1f s; load+upload %.1f s; device-to-device copy %.0f GB/s\n",
                double(m->weights.total_bytes) / (1 << 30), t_synth, t_load, copy_gbs);
    std::printf("%-14s %12s %12s %14s %10s %14s\n", "run", "prefill t/s", "decode t/s", "layers ms/tok", "head ms",
                "KV committed");
    for (const Run& r : runs)
        std::printf("%-14s %12.0f %12.1f %14.3f %10.3f %11.1f MiB\n", r.name, r.prefill_tps, r.decode_tps,
                    r.layers_ms, r.head_ms, double(r.committed) / (1 << 20));
    const double per_layer = runs[0].layers_ms / layers;
    const double proj = 1000.0 / (per_layer * 43 + runs[0].head_ms);
    std::printf("per layer %.3f ms/token -> projected 43-layer decode %.1f tokens/s (layers x43 + head)\n",
                per_layer, proj);
    // Prefill computes logits for the last token only, so its time is the layers' (and the
    // embedding's): per layer = 1 / (tokens/s x layers).
    const double pre_layer_us = 1e6 / (runs[0].prefill_tps * layers);
    std::printf("prefill per layer %.2f us/token -> projected 43-layer prefill %.0f tokens/s\n", pre_layer_us,
                1e6 / (pre_layer_us * 43));
    const char* ncu_env = std::getenv("DSV4_NCU");
    if (!ab && (!ncu_env || std::strcmp(ncu_env, "prefill") != 0)) profile(false);
    if (!ab && (!ncu_env || std::strcmp(ncu_env, "prefill") == 0)) profile(true);
    std::printf("full 43-layer KV at a 1M context: logical %.2f GiB; lazy with %u tokens committed %.1f MiB\n",
                double(fl.logical_bytes()) / (1 << 30), ctx_tokens, double(full_lazy) / (1 << 20));
    if (const uint64_t kept = cuda::gemm_cublas_copy_bytes())
        std::printf("the fast mode's kept FP16 weight copies: %.1f MiB (%.1f MiB a layer)\n", double(kept) / (1 << 20),
                    double(kept) / (1 << 20) / layers);
}

// Batched decode of several sessions, as `dsv4 serve` steps them (one forward, a token a
// session): aggregate tokens/s with every session's logits downloaded and its argmax taken on
// the host (the server's path before SchedulerOptions::device_greedy) against the greedy ids
// formed on the device (StepInput::greedy, logits left there). DSV4_BENCH_SESSIONS (1,4,8,16)
// sessions, each after a DSV4_BENCH_SESSION_PROMPT-token (512) prompt, DSV4_BENCH_SESSION_STEPS
// (32) steps a path, the two paths alternating in rounds of 8 steps. Under DSV4_BENCH_AB only
// when DSV4_BENCH_SESSIONS is set.
TEST(CudaBench, FlashDecodeSessions) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    // (bench/gpu/ab43.sh's settings run the Flash benchmarks alone unless sessions are asked for)
    if (std::getenv("DSV4_BENCH_AB") && !std::getenv("DSV4_BENCH_SESSIONS")) GTEST_SKIP() << "DSV4_BENCH_AB";
    BenchModel& bm = bench_model();
    ASSERT_TRUE(bm.g);
    Backend& g = *bm.g;
    const uint32_t V = bm.m->config.n_vocab;
    const uint32_t prompt_tokens = env_u32("DSV4_BENCH_SESSION_PROMPT", 512);
    const uint32_t steps = std::max<uint32_t>(8, env_u32("DSV4_BENCH_SESSION_STEPS", 32) / 8 * 8);
    const std::vector<uint32_t> counts = env_u32_list("DSV4_BENCH_SESSIONS", "1,4,8,16");
    std::printf("\n== batched decode, %u layers: sessions after a %u-token prompt each, aggregate tokens/s ==\n",
                bm.layers, prompt_tokens);
    std::printf("%-9s %8s %14s %12s %14s %12s %8s\n", "sessions", "steps", "logits tok/s", "ms/step", "ids tok/s",
                "ms/step", "ids/lg");
    for (uint32_t B : counts) {
        if (B == 0) continue;
        kv::Budget budget;
        std::vector<std::unique_ptr<kv::SessionKV>> kvs;
        std::vector<std::vector<float>> lg(B, std::vector<float>(V));
        std::vector<int32_t> next(B), ids(B);
        for (uint32_t i = 0; i < B; ++i) {
            kvs.push_back(session(g, 8192, &budget));
            g.forward_one(*kvs.back(), random_tokens(prompt_tokens, 0, int32_t(V), 100 + i), false, lg[i].data());
            next[i] = argmax(lg[i].data(), V);
        }
        // One step of B tokens: logits downloaded and argmax on the host, or the ids alone.
        auto step = [&](bool greedy_ids) {
            std::vector<StepInput> in(B);
            for (uint32_t i = 0; i < B; ++i) {
                in[i].kv = kvs[i].get();
                in[i].tokens = std::span<const int32_t>(&next[i], 1);
                if (greedy_ids) in[i].greedy = &ids[i];
                else in[i].logits = lg[i].data();
            }
            g.forward(in);
            for (uint32_t i = 0; i < B; ++i) {
                ASSERT_TRUE(in[i].error.empty()) << in[i].error;
                next[i] = greedy_ids ? ids[i] : argmax(lg[i].data(), V);
            }
        };
        step(false);   // warm-up: each path's graphs captured
        step(true);
        double t[2] = {0, 0};
        for (uint32_t round = 0; round < steps / 8; ++round)
            for (int path = 0; path < 2; ++path) {
                const double a = now_s();
                for (int k = 0; k < 8; ++k) step(path == 1);
                t[path] += now_s() - a;
            }
        const double tps0 = double(B) * steps / t[0], tps1 = double(B) * steps / t[1];
        std::printf("%-9u %8u %14.1f %12.3f %14.1f %12.3f %8.3f\n", B, steps, tps0, 1000 * t[0] / steps, tps1,
                    1000 * t[1] / steps, tps1 / tps0);
        // DSV4_BENCH_SESSION_PROFILE=1: where a step of B sessions spends its time (groups of
        // kernels, events between them, no graphs), 4 steps of the ids path.
        if (env_u32("DSV4_BENCH_SESSION_PROFILE", 0)) {
            cuda::profile_enable(true);
            cuda::profile_reset();
            for (int k = 0; k < 4; ++k) step(true);
            cuda::profile_enable(false);
            auto prof = cuda::profile_snapshot();
            std::sort(prof.begin(), prof.end(), [](const auto& x, const auto& y) { return x.ms > y.ms; });
            double total = 0;
            for (const auto& e : prof) total += e.ms;
            std::printf("  profile, %u sessions: %.3f ms a step (no graphs):", B, total / 4);
            for (size_t i = 0; i < prof.size() && i < 12; ++i)
                std::printf("%s %s %.0f us", i ? "," : "", prof[i].name.c_str(), 1000 * prof[i].ms / 4);
            std::printf("\n");
        }
    }
}

// Prefill tokens/s by the size of a round: a 4,096-token prompt fed in pieces of N tokens, each
// a forward call of its own (a prompt round of N rows, as `dsv4 serve`'s steps of
// --prefill-chunk tokens and the CLI's --chunk make them), after a warm-up prompt; the data for
// the CUDA defaults of both. DSV4_BENCH_CHUNKS (128,256,512,1024,2048) lists the sizes; under
// DSV4_BENCH_AB only when it is set. DSV4_BENCH_PROMPT: a longer prompt.
TEST(CudaBench, FlashPrefillByRoundSize) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    if (std::getenv("DSV4_BENCH_AB") && !std::getenv("DSV4_BENCH_CHUNKS")) GTEST_SKIP() << "DSV4_BENCH_AB";
    BenchModel& bm = bench_model();
    ASSERT_TRUE(bm.g);
    Backend& g = *bm.g;
    const uint32_t V = bm.m->config.n_vocab;
    const std::vector<uint32_t> sizes = env_u32_list("DSV4_BENCH_CHUNKS", "128,256,512,1024,2048");
    // a prompt of at least two of the largest rounds (4,096 tokens for the default sizes), or of
    // DSV4_BENCH_PROMPT tokens (long prompts: the indexer's work grows with the position)
    size_t n = std::max<size_t>(4096, env_u32("DSV4_BENCH_PROMPT", 0));
    for (uint32_t N : sizes)
        if (N <= g.options().prefill_chunk) n = std::max<size_t>(n, 2 * size_t(N));
    const auto prompt = random_tokens(n, 0, int32_t(V), 77);
    std::printf("\n== prefill by round size, %u layers: a %zu-token prompt in pieces of N tokens ==\n", bm.layers, n);
    std::printf("%-8s %10s %12s\n", "N", "ms", "tokens/s");
    kv::Budget budget;
    {
        auto warm = session(g, 8192, &budget);
        g.forward_one(*warm, std::span<const int32_t>(prompt.data(), 2048), false, nullptr);
    }
    for (uint32_t N : sizes) {
        if (N == 0 || N > g.options().prefill_chunk) continue;   // a call's rounds are at most the chunk
        auto kv = session(g, std::max<uint64_t>(8192, n), &budget);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const double t0 = now_s();
        for (size_t done = 0; done < n; done += N)
            g.forward_one(*kv, std::span<const int32_t>(prompt.data() + done, std::min<size_t>(N, n - done)), false,
                          nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const double dt = now_s() - t0;
        std::printf("%-8u %10.1f %12.1f\n", N, 1000 * dt, double(n) / dt);
    }
}

// The serve compositions (test_util.h) on the benchmark model: at flash width and, with
// DSV4_BENCH_LAYERS=43, on the whole model, where `dsv4 serve` gave one of 8 prompts another
// first token batched than solo (bench/gpu/NOTES.md, nineteenth round). Under DSV4_BENCH_AB
// only with DSV4_BENCH_COMPOSE=1.
TEST(CudaBench, FlashServeCompositionsEqualSolo) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    if (std::getenv("DSV4_BENCH_AB") && !std::getenv("DSV4_BENCH_COMPOSE")) GTEST_SKIP() << "DSV4_BENCH_AB";
    BenchModel& bm = bench_model();
    ASSERT_TRUE(bm.g);
    // DSV4_BENCH_COMPOSE_STEPS / _PROMPT: decode steps and the shortest prompt (8 / 60: every
    // position below the 128-token window; 48 / 90 cross it)
    const uint32_t steps = std::max(1u, env_u32("DSV4_BENCH_COMPOSE_STEPS", 8));
    const size_t prompt0 = std::max(2u, env_u32("DSV4_BENCH_COMPOSE_PROMPT", 60));
    test::expect_compositions_equal_solo(*bm.g, "cuda-compose flash " + std::to_string(bm.layers) + " layers", 8, steps,
                                         8192, prompt0);
}

// The same work repeated in one process must give the same bits every time: the compositions'
// solo timelines (8 prompts, each alone, in order) and all 8 together, DSV4_BENCH_REPEATS
// times (default 10), each against the first repetition. An intermittent difference here is a
// race (run 106 saw one solo timeline of 40 differ); running it under DSV4_CUDA_PDL=0,
// DSV4_CUDA_BRANCHES=0 or DSV4_CUDA_GRAPHS=0 says which mechanism it needs.
TEST(CudaBench, FlashRepeatsAreBitIdentical) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    if (std::getenv("DSV4_BENCH_AB") && !std::getenv("DSV4_BENCH_COMPOSE")) GTEST_SKIP() << "DSV4_BENCH_AB";
    BenchModel& bm = bench_model();
    ASSERT_TRUE(bm.g);
    const uint32_t steps = std::max(1u, env_u32("DSV4_BENCH_COMPOSE_STEPS", 48));
    const size_t prompt0 = std::max(2u, env_u32("DSV4_BENCH_COMPOSE_PROMPT", 90));
    const uint32_t reps = std::max(2u, env_u32("DSV4_BENCH_REPEATS", 10));
    const int32_t V = int32_t(bm.m->config.n_vocab);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < 8; ++i) prompts.push_back(random_tokens(prompt0 + 7 * i, 0, V, 500 + i));
    std::vector<test::Timeline> solo0, together0;
    size_t solo_bad = 0, together_bad = 0;
    const double t0 = now_s();
    for (uint32_t rep = 0; rep < reps; ++rep) {
        std::vector<test::Timeline> solo;
        for (const auto& p : prompts) solo.push_back(test::run_composition(*bm.g, {p}, steps, SIZE_MAX, 0, 8192)[0]);
        const auto together = test::run_composition(*bm.g, prompts, steps, SIZE_MAX, 0, 8192);
        if (rep == 0) {
            solo0 = solo;
            together0 = together;
            continue;
        }
        auto compare = [&](const test::Timeline& got, const test::Timeline& first, const char* what, size_t i,
                           size_t& bad) {
            std::string why;
            if (test::same_timelines({got}, {first}, &why) == 1) return;
            ++bad;
            std::printf("  repetition %u, %s prompt %zu: %s\n", rep, what, i, why.c_str());
        };
        for (size_t i = 0; i < prompts.size(); ++i) {
            compare(solo[i], solo0[i], "solo", i, solo_bad);
            compare(together[i], together0[i], "together", i, together_bad);
        }
    }
    const size_t n = size_t(reps - 1) * prompts.size();
    std::printf("[cuda-repeats flash %u layers] %u repetitions of 8 prompts of %zu+ tokens, %u greedy steps: "
                "timelines unlike the first repetition's: solo %zu/%zu, together %zu/%zu (%.1f s)\n",
                bm.layers, reps, prompt0, steps, solo_bad, n, together_bad, n, now_s() - t0);
    EXPECT_EQ(solo_bad, 0u);
    EXPECT_EQ(together_bad, 0u);
}

// One Q8_0 decode product (one activation row) at the shapes of q_b, out_a, out_b and the
// shared expert: device time (events around the launch) after a 256 MB write (the L2 then
// holds dirty lines of other data) and warm (the same product just before), against a
// product 4 times larger. Says how much of a 35 MB product is bandwidth and how much fixed
// cost (ramp-up, tail). An L2 prefetch of the weight measured the same as warm (run 23), and
// warm barely beats HBM: L2 residency is not what these products lack.
// The one-row Q8_0 products of decode beside their read floor: device µs by events (median of
// 15), cold = after a 256 MB write (the weight not in L2: as in a decode step, where 9 GB pass
// between two uses of a weight), warm = the same product just before. floor 0 / 1 / 2: the
// weight's bytes read and nothing else (read_floor: one wave of 8 KB a warp; a resident grid
// with 4 / 8 loads a thread in flight); product: the decode kernel (q8_rows_kernel).
TEST(CudaBench, Q8_0DecodeProductColdPrefetchedWarm) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    DevVec<uint8_t> flush(256u << 20);
    DevVec<uint32_t> sink(1);
    std::printf("\n== Q8_0 decode product, one row: device us (median of 15), cold unless marked ==\n");
    std::printf("%-16s %6s %8s %8s %8s %8s %8s %9s\n", "rows x K", "MB", "floor0", "floor1", "floor2", "product",
                "warm", "cold TB/s");
    const std::pair<uint64_t, uint64_t> shapes[] = {{32768, 1024}, {8192, 4096}, {4096, 8192}, {1024, 4096},
                                                    {2048, 4096}, {32768, 4096}};
    for (auto [N, K] : shapes) {
        const SynthQ8_0 sw(N, K, false);
        const cuda::DevWeight& w = sw.w;
        DevVec<float> x(random_floats(K, 7));
        DevVec<int8_t> aq(K);
        DevVec<float> ad(K / 32 + 1);
        DevVec<int32_t> ab(K / 16 + 1);
        const cuda::ActBuf buf{aq.get(), ad.get(), ab.get(), K};
        DevVec<float> y(N);
        const cuda::DevAct a = cuda::quantize_act(w.type, x.get(), K, 1, K, buf, nullptr);
        // 15 runs, each after a 256 MB write that evicts the weight from L2 (warm: then a call)
        auto timed = [&](auto&& launch, bool warm) {
            return timed_median_us(15, launch, [&](int i) {
                cudaMemsetAsync(flush.get(), i, 256u << 20);
                if (warm) launch();
            });
        };
        const double mb = double(N) * K * 34 / 32 / 1e6;
        double floor_us[3];
        for (int m = 0; m < 3; ++m)
            floor_us[m] = timed([&] { cuda::read_floor(sw.q.get(), N * K, m, sink.get(), nullptr); }, false);
        double prod[2];
        for (int warm = 0; warm < 2; ++warm)
            prod[warm] = timed([&] { cuda::matvec(w, a, 1, y.get(), N, N, 0, nullptr); }, warm);
        char shape[32];
        std::snprintf(shape, sizeof shape, "%llu x %llu", (unsigned long long)N, (unsigned long long)K);
        std::printf("%-16s %6.1f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f\n", shape, mb, floor_us[0], floor_us[1],
                    floor_us[2], prod[0], prod[1], mb / prod[0]);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The Q8_0 products of a prefill chunk (2,048 rows) on the tensor cores (kQ8Shapes), the
// register-fed kernel (DSV4_GEMM_Q8_V=0) beside the pipelined one (1). Device time by events
// (median_us), int8 TOPS (2 R N K / t), and whether both give the same bits.
TEST(CudaBench, Q8_0PrefillGemmOldNew) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    const uint32_t R = env_u32("DSV4_BENCH_ROWS", 2048);
    std::printf("\n== Q8_0 prefill products, R = %u rows: device us (median of 9), int8 TOPS ==\n", R);
    std::printf("%-12s %6s %6s %5s %10s %7s %10s %7s %7s %5s\n", "product", "K", "N", "rpg", "old us", "TOPS",
                "new us", "TOPS", "speed", "same");
    for (const Q8Shape& sh : kQ8Shapes) {
        const uint64_t N = sh.N, K = sh.K;
        const SynthQ8_0 sw(N, K, true);
        const SynthQ8Act act(R, sh.act_k());
        DevVec<float> y_old(uint64_t(R) * N), y_new(uint64_t(R) * N);
        auto timed = [&](int v, float* y) {
            cuda::gemm_q8_0_version(v);
            const double t = median_us([&] { cuda::gemm_q8_0(sw.w, act.a, R, y, N, N, 0, sh.rpg, nullptr); });
            cuda::gemm_q8_0_version(-1);
            return t;
        };
        const double t_old = timed(0, y_old.get()), t_new = timed(2, y_new.get());   // the default
        const auto o = y_old.download(), n = y_new.download();
        const bool same = std::memcmp(o.data(), n.data(), o.size() * 4) == 0;
        const double ops = 2.0 * R * N * K;
        std::printf("%-12s %6llu %6llu %5llu %10.1f %7.1f %10.1f %7.1f %6.2fx %5s\n", sh.name,
                    (unsigned long long)K, (unsigned long long)N, (unsigned long long)sh.rpg, t_old,
                    ops / t_old / 1e6, t_new, ops / t_new / 1e6, t_old / t_new, same ? "yes" : "NO");
        EXPECT_TRUE(same) << sh.name;
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// What the CPU's bits cost a prompt round's Q8_0 products: gemm.cu's flat kernel (the prompt
// order, the default) against the same product through cuBLAS in FP16 (both operands
// dequantised once, gemm_cublas.cu), on kQ8Shapes at R rows: device µs (median_us), the
// dequantisations apart (a weight's could be made once at load, for twice its memory), the whole
// path as gemm_q8_0 takes it (DSV4_Q8_CUBLAS), and each result's largest error against a double
// reference over 512 sampled outputs, relative to the sum of the products' magnitudes.
TEST(CudaBench, Q8_0PrefillCublasFp16) {
    DSV4_REQUIRE_CUDA();
    if (!std::getenv("DSV4_CUDA_BENCH")) GTEST_SKIP() << "set DSV4_CUDA_BENCH=1";
    const uint32_t R = env_u32("DSV4_BENCH_ROWS", 2048);
    const bool order = cuda::gemm_prefill_order();
    cuda::gemm_prefill_order(true);
    std::printf("\n== Q8_0 prompt products, R = %u rows: flat kernel vs cuBLAS FP16 (device us, median of 9) ==\n", R);
    std::printf("%-12s %6s %6s %5s %9s %7s %9s %7s %8s %8s %8s %7s %9s %9s\n", "product", "K", "N", "rpg", "flat us",
                "TOPS", "cublas us", "TFLOPS", "deq w us", "deq a us", "path us", "speed", "err flat", "err f16");
    double t_flat_all = 0, t_cublas_all = 0, t_path_all = 0;
    for (const Q8Shape& sh : kQ8Shapes) {
        const uint64_t N = sh.N, K = sh.K, AK = sh.act_k();
        const SynthQ8_0 sw(N, K, true);
        const SynthQ8Act act(R, AK);
        const cuda::DevAct& a = act.a;
        const std::vector<int8_t>& aq = act.q;
        const std::vector<float>& ad = act.d;
        DevVec<float> y_flat(uint64_t(R) * N), y_f16(uint64_t(R) * N);
        DevVec<uint16_t> wh(N * K), xh(uint64_t(R) * AK);
        const double t_flat = median_us([&] { cuda::gemm_q8_0(sw.w, a, R, y_flat.get(), N, N, 0, sh.rpg, nullptr); });
        const double t_deq_w = median_us([&] { cuda::dequant_q8_0_weight_f16(sw.w, 0, N, wh.get(), nullptr); });
        const double t_deq_a = median_us([&] { cuda::dequant_q8_0_act_f16(a, R, xh.get(), nullptr); });
        const double t_gemm = median_us(
            [&] { cuda::gemm_f16_cublas(wh.get(), xh.get(), R, N, K, AK, sh.rpg, y_f16.get(), N, nullptr); });
        cuda::gemm_q8_0_cublas_override(1);   // the whole path: both dequantisations and the GEMM
        const double t_path = median_us([&] { cuda::gemm_q8_0(sw.w, a, R, y_f16.get(), N, N, 0, sh.rpg, nullptr); });
        cuda::gemm_q8_0_cublas_override(-1);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess) << sh.name;
        // errors over sampled outputs against doubles of the exact Q8_0 values
        const auto wq = sw.q.download();
        const auto wd = sw.d.download();
        const auto yf = y_flat.download(), yh = y_f16.download();
        double err_flat = 0, err_f16 = 0;
        for (uint32_t s = 0; s < 512; ++s) {
            const uint64_t r = (s * 2654435761u) % R, n = (s * 40503u + 7) % N, a0 = sh.rpg ? n / sh.rpg * K : 0;
            double ref = 0, mag = 0;
            for (uint64_t k = 0; k < K; ++k) {
                const double w = double(wq[n * K + k]) * double(quant::fp16_to_fp32(wd[(n * K + k) / 32]));
                const double x = double(aq[r * AK + a0 + k]) * double(ad[(r * AK + a0 + k) / 32]);
                ref += w * x;
                mag += std::fabs(w * x);
            }
            err_flat = std::max(err_flat, std::fabs(yf[r * N + n] - ref) / mag);
            err_f16 = std::max(err_f16, std::fabs(yh[r * N + n] - ref) / mag);
        }
        const double ops = 2.0 * R * N * K;
        std::printf("%-12s %6llu %6llu %5llu %9.1f %7.1f %9.1f %7.1f %8.1f %8.1f %8.1f %6.2fx %9.2e %9.2e\n",
                    sh.name, (unsigned long long)K, (unsigned long long)N, (unsigned long long)sh.rpg, t_flat,
                    ops / t_flat / 1e6, t_gemm, ops / t_gemm / 1e6, t_deq_w, t_deq_a, t_path, t_flat / t_path,
                    err_flat, err_f16);
        t_flat_all += t_flat;
        t_cublas_all += t_gemm;
        t_path_all += t_path;
        EXPECT_LT(err_f16, 1e-3) << sh.name;   // FP16 operands: ~2^-12 a value, most of it averaging out
        EXPECT_LT(err_flat, 1e-5) << sh.name;
    }
    std::printf("all five: flat %.1f us; cuBLAS FP16 GEMMs %.1f us, the whole path (DSV4_Q8_CUBLAS: both operands "
                "dequantised, then the GEMM) %.1f us (%.2fx)\n",
                t_flat_all, t_cublas_all, t_path_all, t_flat_all / t_path_all);
    // F16 weights (the router's, compressor's and indexer's widths): the flat float kernel (2xTF32)
    // against gemm_float through cuBLAS (DSV4_F16_CUBLAS: the activation rounded to FP16)
    std::printf("%-12s %6s %6s %11s %9s %9s %7s\n", "F16 product", "K", "N", "flat128 us", "flat us", "path us",
                "speed");
    struct F16Shape {
        const char* name;
        uint64_t K, N;
    };
    // the flash model's: the indexer's head weights, the router (and the indexer's compressor,
    // each of its two), the ratio-4 compressor's kv (and gate), the indexer's queries
    for (const F16Shape& sh : {F16Shape{"indexer proj", 4096, 64}, F16Shape{"router", 4096, 256},
                               F16Shape{"compressor", 4096, 1024}, F16Shape{"indexer q_b", 1024, 8192}}) {
        const uint64_t K = sh.K, N = sh.N;
        std::vector<uint16_t> wh(N * K);
        for (size_t i = 0; i < wh.size(); ++i)   // halves of magnitude 2^-7 … 2^-6, both signs
            wh[i] = uint16_t((0x2000 + (i * 2654435761u >> 20) % 0x400) | (i & 1 ? 0x8000 : 0));
        DevVec<uint16_t> dwh(wh);
        cuda::DevWeight w;
        w.type = uint32_t(quant::Type::F16);
        w.K = K;
        w.rows = N;
        w.row_bytes = K * 2;
        w.data = reinterpret_cast<const uint8_t*>(dwh.get());
        std::vector<float> x(uint64_t(R) * K);
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int((i * 2246822519u) >> 24) % 255 - 127) / 64.0f;
        DevVec<float> dx(x);
        cuda::DevAct a;
        a.kind = cuda::ActKind::F32;
        a.K = K;
        a.f = dx.get();
        a.f_stride = K;
        DevVec<float> y(uint64_t(R) * N);
        cuda::gemm_float_flat_ntw_override(4);   // the flat kernel's 128-row blocks (before 32-row ones)
        const double t_flat128 = median_us([&] { cuda::gemm_float(w, a, R, y.get(), N, N, 0, 0, nullptr); });
        cuda::gemm_float_flat_ntw_override(-1);
        const double t_flat = median_us([&] { cuda::gemm_float(w, a, R, y.get(), N, N, 0, 0, nullptr); });
        cuda::gemm_float_cublas_override(1);
        const double t_path = median_us([&] { cuda::gemm_float(w, a, R, y.get(), N, N, 0, 0, nullptr); });
        cuda::gemm_float_cublas_override(-1);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        std::printf("%-12s %6llu %6llu %11.1f %9.1f %9.1f %6.2fx\n", sh.name, (unsigned long long)K, (unsigned long long)N,
                    t_flat128, t_flat, t_path, t_flat / t_path);
    }
    cuda::gemm_prefill_order(order);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
