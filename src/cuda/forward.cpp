// The CUDA backend: weights resident in device memory, KV in CUDA VMM regions, and the
// forward pass of src/cpu/forward.cpp on the GPU with the same row-batch structure: a batch
// of rows (session, position, token), layer-major, compressors as per-token state machines,
// the indexer's top-k with ties to the lower index, sink attention, MoE, mHC, and both
// numerics modes. Every kernel computes the CPU's function up to float summation order.
// Decode rounds are captured as CUDA graphs whose independent paths run as parallel
// branches (side streams) and whose kernel-to-kernel edges are programmatic (PDL); prefill
// runs eagerly in chunks on tensor-core / tiled GEMMs. Those reproduce decode's order of float
// additions, except in prompt rounds (prefill_flat below): their Q8_0 and F16/BF16 products add
// in k order on the tensor cores, and their attention takes an item per row (all heads, all
// keys, no splits). So a row's result is the same bits in any batch and any chunking of its
// prompt, and decode's bits in decode (prompts too with DSV4_PREFILL_FLAT=0).
// bench/gpu/NOTES.md has the measurements and the A/B switches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>
#include <unistd.h>

#include "cpu/numerics.h"
#include "cuda/backend_impl.h"
#include "cuda/kernels.h"
#include "cuda/region.h"
#include "dsv4/backend.h"
#include "dsv4/quant.h"

namespace dsv4::cuda {
namespace {

using model::Tensor;

StepTiming g_timing;
const bool g_timing_on = env_switch("DSV4_CUDA_TIMING", false);
bool g_profile_on = env_switch("DSV4_CUDA_PROFILE", false);
const bool g_graphs_on = env_switch("DSV4_CUDA_GRAPHS", true);
// DSV4_IDX_FUSED=0 keeps the indexer's three-kernel query path (indexer_q_prep →
// indexer_scores → topk_select) in ratio-4 layers instead of the one-launch indexer_fused
// (bit-identical; used for batches of up to 16 rows and up to 16384 visible compressed rows).
// Either way the indexer's head weights and queries (iq_b product and preparation) are
// skipped while no row has more visible compressed rows than the top-k (nothing reads them
// then; the three-kernel path made them anyway before run 118).
const bool g_idx_fused = env_switch("DSV4_IDX_FUSED", true);
// The attention sublayer's branches (attention_layer). DSV4_CUDA_SPLIT: 0 the indexer's
// compressor, head weights and queries on one side stream (its queries after everything
// else there); 1 its queries (iq_b, then the scores and top-k once the compressor has
// emitted) on a branch of their own, so the query path's wait for qr and the compressor run
// side by side (default); 2 also each compressor's kv and gate products on two branches.
// The same kernels on the same data in every case, so the same bits.
const int g_branch_split = env_int("DSV4_CUDA_SPLIT", 1);
// Decode rounds of up to this many rows run the routed experts pair by pair (ffn_layer);
// DSV4_DECODE_PAIR_ROWS=1 groups them for every round of several rows (as before run 99).
const uint32_t g_decode_pair_rows = uint32_t(std::max(1, env_int("DSV4_DECODE_PAIR_ROWS", 64)));

// Decode graphs: every edge from one kernel node to another becomes a programmatic
// dependency, so the dependent is launched while its predecessor runs and waits inside
// (pdl_begin, the first statement of every kernel) instead of after it: each of the ~30
// kernel boundaries on a layer's critical path stops paying a full launch latency.
// DSV4_CUDA_PDL=0 keeps plain edges (read at each capture, so one process can compare).
bool pdl_on() { return env_switch("DSV4_CUDA_PDL", true); }
// A prompt's tokens (several, or one marked StepInput::prompt) run in prompt rounds; a single
// unmarked token is a decode step (decode's kernels and order of sums).
bool is_prompt(const StepInput& in) { return in.tokens.size() > 1 || in.prompt; }
// mHC pre in two launches spread over the GPU (hc_pre_mix + hc_pre_collapse) where the shape
// allows; DSV4_HC_FUSED=0 keeps the three single-block-per-row launches (rms_norm, the mix
// product, hc_pre_finish) for A/B measurement.
const bool g_hc_spread_on = env_switch("DSV4_HC_FUSED", true);
// A sublayer's hc_post folded into the next sublayer's hc_pre_mix (HcPostIn) where that takes
// the spread path: one launch and one pass over the 16,384-wide state fewer per sublayer on
// decode's critical path. The same operations, so the same bits; DSV4_HC_POST_FUSED=0 keeps
// the separate hc_post launch.
const bool g_post_fused = env_switch("DSV4_HC_POST_FUSED", true);
const bool g_head_decode_order = env_switch("DSV4_HEAD_DECODE_ORDER", true);
// Prompt rounds (an input of more than one token) add their Q8_0 and F16/BF16 products in k
// order (gemm_prefill_order), which lets the tensor-core kernels drop decode's tree of partial
// sums and take 128 x 128 tiles: run 62, 43 layers, prefill 2,325 and 2,325 tok/s against 2,045
// and 2,042 with the Q8_0 ones alone; run 65, 2,683 with both (2,349 with DSV4_FLAT_FLOAT=0).
// The routed experts' 2-bit products too (groups of 64 pairs, the CPU's k order: DSV4_KQ_FLAT).
// Not decode's bits (validation.md: ~1e-5 where the order differs); every chunking of a
// prompt, chunks of one token included, takes the same order, so those stay bit-identical;
// decode steps keep decode's order. DSV4_PREFILL_FLAT=0 gives prompts decode's order
// (prefill = decode bit for bit); prefill_flat_override (tests) wins.
int g_prefill_flat_override = -1;
bool prefill_flat() {
    static const bool env = env_switch("DSV4_PREFILL_FLAT", true);
    return g_prefill_flat_override >= 0 ? g_prefill_flat_override != 0 : env;
}
// A prompt round of at most this many rows (and at most DSV4_DECODE_PAIR_ROWS) runs its routed
// experts pair by pair with decode's kernels instead of grouped by expert: a short prompt's 6R
// pairs fall on ~as many experts, so each group's block expands an expert's whole weight for
// about one pair, where decode's kernels read only the pairs' rows.
// DSV4_FAST_PAIR_ROWS (the fast mode's, in decode's order: it promises no chunking invariance;
// 64 by default, 0: never): run 179 (H100, 4 layers, FlashPrefillByRoundSize, a 4,096-token
// prompt in rounds of N) 2,607 -> 3,488 tok/s at N = 16, 4,089 -> 5,700 at 32, 6,508 -> 8,993 at
// 64, twice each; run 180: all 84 CUDA tests with it.
// DSV4_EXACT_PAIR_ROWS (the exact mode's; 64 by default, 0: never): in the prompt order's k
// order (kq_flat_pairs: the FLAT forms of decode's kernels, the grouped GEMMs' bits, where
// kq_pair_flat_ok), so every chunking of a prompt still gets the same bits (tests
// ExpertsPromptOrderEqualCpuDot, ExactShortRoundsPairByPairKeepPromptBits). Run 182 (H100, 4
// layers, the same bench, twice each): 1,826 -> 3,282 tok/s at N = 16, 2,612 -> 5,157 at 32,
// 4,011 -> 8,246 at 64; run 183: all 85 CUDA tests with it. The overrides (tests) win.
int g_fast_pair_rows_override = -1, g_exact_pair_rows_override = -1;
uint32_t prompt_pair_rows(bool fast) {
    static const int fast_env = std::max(0, env_int("DSV4_FAST_PAIR_ROWS", 64));
    static const int exact_env = std::max(0, env_int("DSV4_EXACT_PAIR_ROWS", 64));
    const int o = fast ? g_fast_pair_rows_override : g_exact_pair_rows_override;
    return uint32_t(o >= 0 ? o : fast ? fast_env : exact_env);
}
// The ungrouped expert pairs launched in its scope add in k order when `on` (kq_flat_pairs).
struct FlatPairsScope {
    explicit FlatPairsScope(bool on) { kq_flat_pairs(on); }
    ~FlatPairsScope() { kq_flat_pairs(false); }
    FlatPairsScope(const FlatPairsScope&) = delete;
    FlatPairsScope& operator=(const FlatPairsScope&) = delete;
};
// DSV4_DUP=name,name,... (a measurement, never for use): the products marked with those names
// (q_a, kv, q_b, compressor_proj, indexer_proj, out_a, out_b, router, shared_expert,
// experts_gate+up, experts_down: each mark's name, '_' for its spaces) are
// launched twice. Each writes its output from inputs it does not change, so the results stay the
// same, and the step's time grows by the whole product where it lies on the critical path, by
// less where its branch has slack: the decode graph's critical path, measured (Nsight Compute
// cannot see branches, and Nsight Systems does not run on the device machine).
std::vector<std::string> dup_names(const char* list) {
    std::vector<std::string> v;
    for (std::string rest = list ? list : ""; !rest.empty();) {
        const size_t c = rest.find(',');
        v.push_back(rest.substr(0, c));
        rest = c == std::string::npos ? "" : rest.substr(c + 1);
    }
    return v;
}
std::vector<std::string> g_dup = dup_names(std::getenv("DSV4_DUP"));   // dup_products_override (tests) replaces it
int dup_times(const char* what) {
    // (names with spaces may be written with '_' instead: settings split on spaces)
    for (std::string n : g_dup) {
        if (n == what) return 2;
        std::replace(n.begin(), n.end(), '_', ' ');
        if (n == what) return 2;
    }
    return 1;
}
template <class F>
void dup(const char* what, F&& launch) {
    for (int i = dup_times(what); i > 0; --i) launch();
}
void programmatic_edges(cudaGraph_t g) {
    size_t n = 0;
    check(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), "graph edges");
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    check(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n), "graph edges");
    auto is_kernel = [](cudaGraphNode_t node) {
        cudaGraphNodeType t{};
        check(cudaGraphNodeGetType(node, &t), "graph node type");
        return t == cudaGraphNodeTypeKernel;
    };
    for (size_t i = 0; i < n; ++i) {
        if (data[i].type != cudaGraphDependencyTypeDefault || !is_kernel(from[i]) || !is_kernel(to[i])) continue;
        check(cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1), "graph edge");
        cudaGraphEdgeData pe{};
        pe.from_port = cudaGraphKernelNodePortProgrammatic;
        pe.type = cudaGraphDependencyTypeProgrammatic;
        check(cudaGraphAddDependencies(g, &from[i], &to[i], &pe, 1), "programmatic graph edge");
    }
}
std::vector<ProfileEntry> g_profile;

// A device buffer that only grows (contents are not kept across growth).
template <typename T>
class DBuf {
public:
    DBuf() = default;
    DBuf(const DBuf&) = delete;
    DBuf& operator=(const DBuf&) = delete;
    ~DBuf() {
        if (p_) cudaFree(p_);
    }
    // Returns true when the buffer moved (and bumps *gen, which invalidates CUDA graphs).
    bool ensure(size_t n, const char* what, uint64_t* gen = nullptr) {
        if (n <= n_) return false;
        if (gen) ++*gen;
        if (p_) cudaFree(p_);
        p_ = nullptr;
        n_ = 0;
        check(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)), what);
        n_ = n;
        return true;
    }
    T* get() const { return p_; }
    size_t size() const { return n_; }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

bool supported_matrix_type(quant::Type t) {
    switch (t) {
        case quant::Type::F32:
        case quant::Type::F16:
        case quant::Type::BF16:
        case quant::Type::Q8_0:
        case quant::Type::Q2_K:
        case quant::Type::Q4_K:
        case quant::Type::IQ2_XXS:
        case quant::Type::MXFP4: return true;
        default: return false;
    }
}

std::vector<float> to_floats(const Tensor& t) {
    if (!t) return {};
    uint64_t n = 1;
    for (int i = 0; i < 4; ++i) n *= t.ne(i);
    std::vector<float> v(n);
    quant::dequantize_row(t.type(), t.data(), v.data(), n);
    return v;
}

// Where every tensor goes in the one device allocation: planned first (sizes), then filled.
class WeightArena {
public:
    struct Item {
        const Tensor* t;
        bool as_floats;       // small vectors: converted to f32 on the host
        bool is_i32;
        uint64_t off = 0, bytes = 0;   // main bytes (raw, repacked qs, floats)
        uint64_t off2 = 0, bytes2 = 0; // repacked scales (repack_rows)
    };

    size_t add(const Tensor& t, bool as_floats) {
        Item it{&t, as_floats, t.type() == quant::Type::I32};
        const uint64_t rows = t.nbytes() / t.row_bytes();
        if (as_floats) {
            uint64_t n = 1;
            for (int i = 0; i < 4; ++i) n *= t.ne(i);
            it.bytes = n * 4;
        } else if (RepackShape rs; repack_shape(uint32_t(t.type()), &rs)) {
            const uint64_t blocks = rows * (t.ne(0) / rs.block_values);
            it.bytes = blocks * rs.body_bytes;
            it.bytes2 = blocks * rs.aux_bytes;
        } else {
            it.bytes = t.nbytes();
        }
        it.off = total_;
        total_ += align(it.bytes);
        if (it.bytes2) {
            it.off2 = total_;
            total_ += align(it.bytes2);
        }
        items_.push_back(it);
        return items_.size() - 1;
    }
    uint64_t total() const { return total_; }

    void upload() {
        size_t free_b = 0, total_b = 0;
        check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        const uint64_t reserve = 512ull << 20;
        if (total_ + reserve > free_b) {
            cudaDeviceProp prop{};
            cudaGetDeviceProperties(&prop, 0);
            fail("the model's weights need ", human_bytes(total_), " of device memory (plus ", human_bytes(reserve),
                 " of working room) but ", prop.name, " has only ", human_bytes(free_b), " free of ",
                 human_bytes(total_b));
        }
        check(cudaMalloc(reinterpret_cast<void**>(&base_), std::max<uint64_t>(total_, 1)), "weight allocation");
        const bool progress = total_ >= (1ull << 30);
        uint64_t done = 0, last_print = 0;
        std::vector<uint8_t> stage;
        for (Item& it : items_) {
            const Tensor& t = *it.t;
            if (it.as_floats) {
                std::vector<float> f = to_floats(t);
                check(cudaMemcpy(base_ + it.off, f.data(), it.bytes, cudaMemcpyHostToDevice), "weight upload");
            } else if (RepackShape rs; repack_shape(uint32_t(t.type()), &rs)) {
                const uint64_t K = t.ne(0), rows = t.nbytes() / t.row_bytes();
                const uint64_t body = (K / rs.block_values) * rs.body_bytes, aux = (K / rs.block_values) * rs.aux_bytes;
                // In slices, so the host staging stays small.
                const uint64_t slice = std::max<uint64_t>(1, (64ull << 20) / t.row_bytes());
                for (uint64_t r0 = 0; r0 < rows; r0 += slice) {
                    const uint64_t n = std::min(slice, rows - r0);
                    stage.resize(n * (body + aux));
                    repack_rows(uint32_t(t.type()), t.data() + r0 * t.row_bytes(), n, K, stage.data(),
                                stage.data() + n * body);
                    check(cudaMemcpy(base_ + it.off + r0 * body, stage.data(), n * body, cudaMemcpyHostToDevice),
                          "weight upload");
                    check(cudaMemcpy(base_ + it.off2 + r0 * aux, stage.data() + n * body, n * aux,
                                     cudaMemcpyHostToDevice),
                          "weight upload");
                }
            } else {
                const uint64_t step = 256ull << 20;
                for (uint64_t o = 0; o < it.bytes; o += step)
                    check(cudaMemcpy(base_ + it.off + o, t.data() + o, std::min(step, it.bytes - o),
                                     cudaMemcpyHostToDevice),
                          "weight upload");
            }
            done += it.bytes + it.bytes2;
            if (progress && (done - last_print > total_ / 50 || done == total_)) {
                last_print = done;
                std::fprintf(stderr, "\rcuda: uploading weights %5.1f / %.1f GiB", double(done) / (1 << 30),
                             double(total_) / (1 << 30));
                std::fflush(stderr);
            }
        }
        if (progress) std::fprintf(stderr, "\n");
    }

    DevWeight weight(size_t idx) const {
        const Item& it = items_[idx];
        const Tensor& t = *it.t;
        DevWeight w;
        w.type = uint32_t(t.type());
        w.K = t.ne(0);
        w.row_bytes = t.row_bytes();
        w.rows = t.nbytes() / t.row_bytes();
        if (it.bytes2) {
            w.qs = reinterpret_cast<const int8_t*>(base_ + it.off);
            w.d = reinterpret_cast<const uint16_t*>(base_ + it.off2);
        } else {
            w.data = base_ + it.off;
        }
        return w;
    }
    const float* floats(size_t idx) const { return reinterpret_cast<const float*>(base_ + items_[idx].off); }
    const int32_t* ints(size_t idx) const { return reinterpret_cast<const int32_t*>(base_ + items_[idx].off); }

    ~WeightArena() {
        if (base_) cudaFree(base_);
    }

private:
    static uint64_t align(uint64_t b) { return (b + 255) / 256 * 256; }
    std::vector<Item> items_;
    uint64_t total_ = 0;
    uint8_t* base_ = nullptr;
};

struct DevLayer {
    DevWeight hc_attn_fn, hc_ffn_fn, q_a, q_b, kv, out_a, out_b, comp_kv, comp_gate, iq_b, iproj, icomp_kv,
        icomp_gate, gate_inp, gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
    const float *hc_attn_scale = nullptr, *hc_attn_base = nullptr, *hc_ffn_scale = nullptr, *hc_ffn_base = nullptr;
    const float *attn_norm = nullptr, *q_a_norm = nullptr, *kv_a_norm = nullptr, *sinks = nullptr;
    const float *comp_ape = nullptr, *comp_norm = nullptr, *icomp_ape = nullptr, *icomp_norm = nullptr;
    const float *ffn_norm = nullptr, *exp_probs_b = nullptr;
    const int32_t* tid2eid = nullptr;
};

struct Row {
    uint32_t input;
    uint64_t pos;
    int32_t token;
};

class CudaBackend final : public Backend {
public:
    CudaBackend(const model::Model& m, const BackendOptions& opt)
        : m_(m), c_(m.config), w_(m.weights), opt_(opt),
          // DSV4_FAST_PREFILL=1: the benchmarks' way to --fast-prefill
          fast_prefill_(opt.fast_prefill || env_switch("DSV4_FAST_PREFILL", false)) {
        check(cudaSetDevice(0), "cudaSetDevice");
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        for (auto& sd : side_) check(cudaStreamCreateWithFlags(&sd, cudaStreamNonBlocking), "cudaStreamCreate");
        // the fast mode's Q8_0 products keep their weights' FP16 copies where the device has room
        if (fast_prefill_ && env_switch("DSV4_Q8_F16_COPIES", true)) {
            gemm_cublas_weight_copies(stream_, true);
            for (auto& sd : side_) gemm_cublas_weight_copies(sd, true);
        }
        upload_iq2xxs_grid(iq2xxs_grid_table());
        bind_weights();
        // RoPE frequencies of both flavours (cpu::Rope's YaRN blend), in double.
        for (int comp = 0; comp < 2; ++comp) {
            cpu::Rope rope(c_, comp == 1);
            std::vector<double> f(std::max<uint32_t>(1, c_.n_rot / 2));
            for (uint32_t i = 0; i < c_.n_rot / 2; ++i) f[i] = rope.theta(1, i);
            DBuf<double>& d = comp ? inv_freq_comp_ : inv_freq_plain_;
            d.ensure(f.size(), "rope table");
            check(cudaMemcpy(d.get(), f.data(), f.size() * sizeof(double), cudaMemcpyHostToDevice), "rope table");
        }
        bad_.ensure(1, "flag");
        check(cudaMemset(bad_.get(), 0, sizeof(int32_t)), "flag");
    }

    ~CudaBackend() override {
        clear_graphs();
        for (auto& e : ev_)
            if (e) cudaEventDestroy(e);
        for (auto& e : prof_ev_) cudaEventDestroy(e);
        if (pinned_) cudaFreeHost(pinned_);
        if (stream_) {
            cudaStreamSynchronize(stream_);
            release_cublas(stream_);
            cudaStreamDestroy(stream_);
        }
        for (auto& sd : side_)
            if (sd) {
                cudaStreamSynchronize(sd);
                release_cublas(sd);
                cudaStreamDestroy(sd);
            }
        for (auto& e : branch_ev_) cudaEventDestroy(e);
    }

    std::string name() const override { return "cuda"; }
    const model::Config& config() const override { return c_; }
    const BackendOptions& options() const override { return opt_; }
    kv::RegionFactory region_factory() override { return cuda_region_factory(); }
    void forward(std::span<StepInput> inputs) override;

private:
    static const uint64_t* iq2xxs_grid_table();
    void bind_weights();
    void ensure_workspace(uint32_t R);
    // y = W · x for R rows (activation quantised as the CPU does into `buf`; in the fast mode's
    // cuBLAS products, straight to FP16).
    void mm(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y, uint64_t ys, uint64_t N,
            cudaStream_t s, const ActBuf& buf) {
        if (gemm_q8_0_floats(W, x, xs, R, y, ys, N, s)) return;
        const DevAct a = quantize_act(W.type, x, xs, R, W.K, buf, s);
        matvec(W, a, R, y, ys, N, 0, s);
    }
    void mm(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y, uint64_t ys, uint64_t N) {
        mm(W, x, xs, R, y, ys, N, stream_, act_);
    }
    // xn_ in the activation format of a weight type, quantised once per sublayer and kind.
    // Called on the main stream before the sublayer forks, so every branch reads it.
    const DevAct& xn_act(uint32_t wtype, uint32_t R) {
        const uint32_t k = uint32_t(act_kind(wtype));
        if (!xn_have_[k]) {
            xn_acts_[k] = quantize_act(wtype, xn_.get(), c_.n_embd, R, c_.n_embd, k == 1 ? xn8_ : xnk_, stream_);
            xn_have_[k] = true;
        }
        xn_acts_[k].h = xnh_have_ ? xnh_.get() : nullptr;
        xn_acts_[k].h_top = xnh_have_ ? xnh_top_at_ : nullptr;
        return xn_acts_[k];
    }
    // Every activation form the sublayer's products read from xn_, made on the main stream before
    // the sublayer forks. In a round whose products take cuBLAS, xn_ also as FP16 once
    // (DevAct::h; by the mHC collapse itself at xn_f16_level 2, else act_f16's passes here;
    // DSV4_XN_F16=0: each product converts its own): the sublayer's Q8_0 and F16
    // products (q_a, kv, the compressors', the indexer's, the router's, the shared expert's) then
    // skip their top pass and conversion, and the Q8_0 ones read the floats' FP16 values instead
    // of the Q8_0 codes' (as gemm_q8_0_cublas_floats does: closer to the real-valued product,
    // not to the CPU's, which quantises the activation; run 176: flash4's median rel 0.0192 →
    // 0.0213 against the CPU, argmax 95 → 96 of 96).
    void xn_acts_for(std::initializer_list<const DevWeight*> ws, uint32_t R) {
        if (xn_f16_level() >= 1 && !xnh_have_ && cublas_round(R)) {
            const uint64_t n = uint64_t(R) * c_.n_embd;
            xnh_.ensure(n, "workspace", &gen_);
            xnh_top_.ensure(1, "workspace", &gen_);
            act_f16(xn_.get(), c_.n_embd, c_.n_embd, R, xnh_.get(), xnh_top_.get(), stream_);
            xnh_have_ = true;
            xnh_top_at_ = xnh_top_.get();
        }
        for (const DevWeight* w : ws)
            if (w->K) xn_act(w->type, R);
    }
    void mv_xn(const DevWeight& W, uint32_t R, float* y, uint64_t N, const char* what, cudaStream_t s) {
        dup(what, [&] { matvec(W, xn_act(W.type, R), R, y, N, N, 0, s); });
        mark(what, double(N) * W.row_bytes);
    }
    void mv_xn(const DevWeight& W, uint32_t R, float* y, uint64_t N, const char* what) {
        mv_xn(W, R, y, N, what, stream_);
    }
    // Independent parts of a sublayer run as branches on side streams (captured into the
    // decode graphs as parallel paths): fork(i) starts side stream i after everything issued
    // so far on the main stream; join(i) makes the main stream wait for what side i issued.
    // Off while profiling (the events between groups assume one stream).
    cudaStream_t side(uint32_t i) const { return branches_on_ ? side_[i] : stream_; }
    void fork(uint32_t i) {
        if (!branches_on_) return;
        cudaEvent_t e = next_event();
        check(cudaEventRecord(e, stream_), "fork");
        check(cudaStreamWaitEvent(side_[i], e, 0), "fork");
    }
    void join(uint32_t i) {
        if (!branches_on_) return;
        cudaEvent_t e = next_event();
        check(cudaEventRecord(e, side_[i]), "join");
        check(cudaStreamWaitEvent(stream_, e, 0), "join");
    }
    // Side stream i waits for the main stream's work so far (a mid-branch dependency).
    void wait_main(uint32_t i) { fork(i); }
    // Side stream i waits for what side stream j issued so far.
    void wait_side(uint32_t i, uint32_t j) {
        if (!branches_on_ || i == j) return;
        cudaEvent_t e = next_event();
        check(cudaEventRecord(e, side_[j]), "join");
        check(cudaStreamWaitEvent(side_[i], e, 0), "join");
    }
    // A compressor's kv and gate products (both read xn): the gate on side stream `gate_side`
    // beside the kv product on `kv_side` when the branches split them, which then waits for it.
    void compressor_proj(const DevWeight& kv, const DevWeight& gate, uint32_t R, float* ykv, float* ygate, uint64_t N,
                         const char* what, uint32_t kv_side, uint32_t gate_side) {
        const bool two = g_branch_split >= 2;
        if (two) fork(gate_side);
        mv_xn(kv, R, ykv, N, what, side(kv_side));
        mv_xn(gate, R, ygate, N, what, side(two ? gate_side : kv_side));
        if (two) wait_side(kv_side, gate_side);
    }

    cudaEvent_t next_event() {
        if (ev_next_ == branch_ev_.size()) {
            cudaEvent_t e;
            check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
            branch_ev_.push_back(e);
        }
        return branch_ev_[ev_next_++];
    }
    // Profiling (DSV4_CUDA_PROFILE=1, no graphs): an event after each named group of work.
    void mark(const char* name, double bytes = 0) {
        if (!profiling_) return;
        if (marks_ >= prof_ev_.size()) {
            cudaEvent_t e;
            check(cudaEventCreate(&e), "cudaEventCreate");
            prof_ev_.push_back(e);
        }
        check(cudaEventRecord(prof_ev_[marks_], stream_), "cudaEventRecord");
        if (prof_names_.size() <= marks_) prof_names_.resize(marks_ + 1);
        prof_names_[marks_] = {name, bytes};
        ++marks_;
    }
    // mHC pre and the sublayer's RMSNorm into xn_; users: the products that read xn_ (their
    // activation codes may come out of the same kernel).
    void hc_pre(const DevWeight& fn, const float* scale, const float* base, const float* norm_w, uint32_t R,
                std::initializer_list<const DevWeight*> users);
    // The sublayer's end: X += its output through mHC post (§5.5), now or folded into the
    // next hc_pre (post_pending_); flush_post applies a pending one (before the head).
    // Folded into hc_mix_kernel for decode-sized rounds (its eight thread groups would each form
    // the post of their quads in a prefill chunk: measured slower on the H200, run 46), and into
    // hc_mix_tile_kernel for rounds of 32 rows or more (hc_mix_tile_folds_post: one thread a
    // quad as it stages them); rounds in between apply it here. Either way the same bits.
    void sublayer_post(uint32_t R, const float* moe_down, uint32_t K, bool y_init) {
        post_pending_ = HcPostIn{true, y_.get(), post_.get(), comb_.get(), moe_down, K, y_init};
        if (!g_post_fused || (R > kPostFoldRows && !hc_mix_tile_folds_post(R))) flush_post(R);
    }
    static constexpr uint32_t kPostFoldRows = 16;
    void flush_post(uint32_t R) {
        if (!post_pending_.active) return;
        const HcPostIn& p = post_pending_;
        hc_post(X_.get(), p.y, p.post, p.comb, R, c_.n_hc, c_.n_embd, stream_, p.moe_down, p.K, p.y_init);
        mark("hc_post");
        post_pending_ = {};
    }
    HcPostIn post_pending_;
    void attention_layer(uint32_t il, uint32_t R, uint32_t S);
    void ffn_layer(uint32_t il, uint32_t R);
    void run_layers(uint32_t R, uint32_t S);
    void head_prepare(uint32_t NW);
    void head_project(uint32_t i0, uint32_t n) {
        mm(output_, xn_.get() + uint64_t(i0) * c_.n_embd, c_.n_embd, n, logits_.get(), c_.n_vocab, c_.n_vocab);
        mark("output head", double(n) * c_.n_vocab * output_.row_bytes);
    }
    // The greedy ids of logits rows i0 .. i0+n-1 (the slice head_project just wrote).
    void head_greedy(uint32_t i0, uint32_t n) {
        greedy_ids(logits_.get(), n, c_.n_vocab, greedy_excl_.get() + i0, greedy_part_.get(), greedy_ids_.get() + i0,
                   stream_);
        mark("greedy ids");
    }
    void clear_graphs();

    const model::Model& m_;
    const model::Config& c_;
    const model::Weights& w_;
    BackendOptions opt_;
    const bool fast_prefill_;   // prompt rounds in the fast mode (kernels.h: fast_prefill_round)
    cudaStream_t stream_ = nullptr;
    WeightArena arena_;
    std::vector<DevLayer> layers_;
    DevWeight token_embd_, output_, output_hc_fn_;
    const float *output_norm_ = nullptr, *output_hc_base_ = nullptr, *output_hc_scale_ = nullptr;
    DBuf<double> inv_freq_plain_, inv_freq_comp_;

    // The current round.
    std::vector<Row> rows_;
    std::vector<uint64_t> first_pos_;
    std::vector<int32_t> sess_of_input_;
    uint64_t max_vis4_ = 0, vis_ld_ = 0;
    std::vector<uint32_t> want_host_;

    // Workspace (device), sized to the largest round seen.
    uint32_t cap_rows_ = 0;
    DBuf<float> X_, flat_, mix_, x_sub_, xn_, post_, comb_, qr_, q_, kvr_, ckv_, csc_, pooled_, ikv_, isc_, ipooled_,
        qi_, wi_, o_, low_, y_, rlog_, ew_, gate_, up_, mid_, down_, shg_, shu_, score_, logits_;
    DBuf<uint16_t> qib_;       // the indexer's queries as BF16 (prompt rounds' tensor-core scores)
    DBuf<int32_t> experts_, bad_, grp_, grp_pairs_, grp_count_;
    DBuf<float> hc_gate_;      // hc_pre_mix → hc_pre_collapse: per row the pre gates and the norm's scale
    DBuf<double> hc_part_;     // hc_pre_mix's per-block partial sums
    DBuf<uint32_t> hc_count_;  // hc_pre_mix's finished-block counters (left at 0 by every launch)
    DBuf<uint32_t> tail_count_;   // matvec_tail's counters: [0] q_a's norm, [1] the router (left at 0)
    DBuf<uint32_t> idx_count_;  // indexer_fused's finished-block counters per row (left at 0)
    DBuf<uint32_t> sel_, want_, sess_begin_, sess_end_;
    // Greedy rounds (StepInput::greedy): per logits row the excluded id, the id, the partial keys.
    DBuf<int32_t> greedy_excl_, greedy_ids_;
    DBuf<uint64_t> greedy_part_;
    std::vector<int32_t> greedy_excl_host_;
    DBuf<DevRow> rows_dev_;
    DBuf<DevLayerKV> lkv_dev_;
    // A fast prompt round's FP16 keys (DevLayerKV::kh; the rows attention's warpgroup forms 3, 4),
    // made again by keys_to_halves before each layer's attention while kh_round_.
    DBuf<uint16_t> kh_;
    bool kh_round_ = false;
    DBuf<int8_t> act_q_, act2_q_;
    DBuf<float> act_d_, act2_d_;
    DBuf<int32_t> act_b_, act2_b_;
    ActBuf act_, act2_;
    DBuf<int8_t> xn8_q_, xnk_q_;
    DBuf<float> xn8_d_, xnk_d_;
    DBuf<int32_t> xn8_b_, xnk_b_;
    ActBuf xn8_, xnk_;
    DBuf<uint16_t> xnh_;   // xn_ as FP16 (xn_acts_for, or hc_pre's collapse), while xnh_have_
    DBuf<unsigned> xnh_top_;
    bool xnh_have_ = false;
    const unsigned* xnh_top_at_ = nullptr;   // its top: xnh_top_ (act_f16's) or its norm's bound
    // The sublayer norms' bounds of |xn| (hc_xn_bound), a slot each, made on first use
    DBuf<unsigned> xn_bounds_;
    std::map<const float*, size_t> xn_bound_at_;
    const unsigned* xn_bound(const float* norm_w) {
        const auto it = xn_bound_at_.find(norm_w);
        if (it != xn_bound_at_.end()) return xn_bounds_.get() + it->second;
        const size_t slots = 2 * size_t(c_.n_layer) + 2;
        if (xn_bound_at_.size() >= slots) return nullptr;
        xn_bounds_.ensure(slots, "workspace");   // (once: its pointers stay)
        const size_t i = xn_bound_at_.size();
        xn_bound_at_[norm_w] = i;
        hc_xn_bound(norm_w, c_.n_embd, xn_bounds_.get() + i, stream_);
        return xn_bounds_.get() + i;
    }
    // attention_layer's FP16 forms (q_half, o_half, low_half): q_b's output and its top; the
    // attention's output, its largest magnitude and the top that gives kAttnHalfScale
    // (kAttnHalfTop); out_a's output and its top
    DBuf<uint16_t> qh_, oh_, lowh_;
    DBuf<unsigned> qh_top_, oh_max_, oh_top_, lowh_top_;
    // A Q8_0 product's input given as FP16 alone (DevAct::h): K values a row at h, its top and
    // largest magnitude (nullptr: below 2^14)
    static DevAct half_act(uint64_t K, const uint16_t* h, const unsigned* top, const unsigned* max) {
        DevAct a;
        a.kind = ActKind::Q8_0;
        a.K = K;
        a.h = h;
        a.h_top = top;
        a.h_max = max;
        return a;
    }
    // oh_top_ holding kAttnHalfTop's bits (set once, on the main stream)
    const unsigned* half_top() {
        if (oh_top_.ensure(1, "workspace", &gen_)) {
            const float top = kAttnHalfTop;
            check(cudaMemcpyAsync(oh_top_.get(), &top, sizeof(top), cudaMemcpyHostToDevice, stream_), "workspace");
        }
        return oh_top_.get();
    }
    DevAct xn_acts_[3];
    bool xn_have_[3] = {false, false, false};
    cudaEvent_t ev_[3] = {nullptr, nullptr, nullptr};
    // Branches: side streams and a pool of events reused every round (ev_next_ restarts).
    // side streams: 0 the KV row / the shared expert, 1 the attention compressor, 2 the
    // indexer's compressor, 3 Sinkhorn, 4 the indexer's queries, 5 and 6 the compressors'
    // gate products (g_branch_split)
    static constexpr uint32_t kSides = 7, kSinkhorn = 3, kIdxQuery = 4, kCompGate = 5, kIdxCompGate = 6;
    cudaStream_t side_[kSides] = {};
    std::vector<cudaEvent_t> branch_ev_;
    size_t ev_next_ = 0;
    bool branches_on_ = false;
    DBuf<int8_t> qra_q_;
    DBuf<float> qra_d_;
    DBuf<int32_t> qra_b_;
    ActBuf qra_;
    // CUDA graphs of decode-sized rounds: (rows, sessions, logits rows, score width, PDL,
    // prompt order, greedy ids) -> the layers and the head, captured on the second round of
    // that shape.
    struct Graphs {
        cudaGraphExec_t layers = nullptr, head = nullptr;
        uint64_t gen = 0;
        bool seen = false;
    };
    std::map<std::tuple<uint32_t, uint32_t, uint32_t, uint64_t, bool, bool, bool, bool>, Graphs> graphs_;
    uint64_t gen_ = 0;
    // Pinned staging for the per-round uploads.
    uint8_t* pinned_ = nullptr;
    size_t pinned_bytes_ = 0;
    // Profiling.
    bool profiling_ = false;
    size_t marks_ = 0;
    std::vector<cudaEvent_t> prof_ev_;
    std::vector<std::pair<const char*, double>> prof_names_;
};

}  // namespace
}  // namespace dsv4::cuda

// The grid table lives in the quant layer (private header).
#include "quant/iq2_tables.h"

namespace dsv4::cuda {
namespace {

const uint64_t* CudaBackend::iq2xxs_grid_table() { return quant::detail::kIq2xxsGrid; }

void CudaBackend::bind_weights() {
    struct Pending {
        size_t idx;
        DevWeight* w;
    };
    struct PendingF {
        size_t idx;
        const float** f;
    };
    std::vector<Pending> pw;
    std::vector<PendingF> pf;
    std::vector<std::pair<size_t, const int32_t**>> pi;
    auto mat = [&](const Tensor& t, DevWeight* dst) {
        if (!t) return;
        if (!supported_matrix_type(t.type()))
            fail("tensor '", t.name(), "' has type ", quant::type_name(uint32_t(t.type())),
                 ", for which the CUDA backend has no kernel");
        pw.push_back({arena_.add(t, false), dst});
    };
    auto vec = [&](const Tensor& t, const float** dst) {
        if (!t) return;
        pf.push_back({arena_.add(t, true), dst});
    };
    layers_.resize(c_.n_layer);
    mat(w_.token_embd, &token_embd_);
    mat(w_.output, &output_);
    mat(w_.output_hc_fn, &output_hc_fn_);
    vec(w_.output_norm, &output_norm_);
    vec(w_.output_hc_base, &output_hc_base_);
    vec(w_.output_hc_scale, &output_hc_scale_);
    for (uint32_t il = 0; il < c_.n_layer; ++il) {
        const auto& lw = w_.layers[il];
        DevLayer& L = layers_[il];
        mat(lw.hc_attn_fn, &L.hc_attn_fn);
        mat(lw.hc_ffn_fn, &L.hc_ffn_fn);
        mat(lw.attn_q_a, &L.q_a);
        mat(lw.attn_q_b, &L.q_b);
        mat(lw.attn_kv, &L.kv);
        mat(lw.attn_output_a, &L.out_a);
        mat(lw.attn_output_b, &L.out_b);
        mat(lw.attn_compressor_kv, &L.comp_kv);
        mat(lw.attn_compressor_gate, &L.comp_gate);
        mat(lw.indexer_attn_q_b, &L.iq_b);
        mat(lw.indexer_proj, &L.iproj);
        mat(lw.indexer_compressor_kv, &L.icomp_kv);
        mat(lw.indexer_compressor_gate, &L.icomp_gate);
        mat(lw.ffn_gate_inp, &L.gate_inp);
        mat(lw.ffn_gate_exps, &L.gate_exps);
        mat(lw.ffn_up_exps, &L.up_exps);
        mat(lw.ffn_down_exps, &L.down_exps);
        mat(lw.ffn_gate_shexp, &L.gate_sh);
        mat(lw.ffn_up_shexp, &L.up_sh);
        mat(lw.ffn_down_shexp, &L.down_sh);
        vec(lw.hc_attn_scale, &L.hc_attn_scale);
        vec(lw.hc_attn_base, &L.hc_attn_base);
        vec(lw.hc_ffn_scale, &L.hc_ffn_scale);
        vec(lw.hc_ffn_base, &L.hc_ffn_base);
        vec(lw.attn_norm, &L.attn_norm);
        vec(lw.attn_q_a_norm, &L.q_a_norm);
        vec(lw.attn_kv_a_norm, &L.kv_a_norm);
        vec(lw.attn_sinks, &L.sinks);
        vec(lw.attn_compressor_ape, &L.comp_ape);
        vec(lw.attn_compressor_norm, &L.comp_norm);
        vec(lw.indexer_compressor_ape, &L.icomp_ape);
        vec(lw.indexer_compressor_norm, &L.icomp_norm);
        vec(lw.ffn_norm, &L.ffn_norm);
        vec(lw.exp_probs_b, &L.exp_probs_b);
        if (lw.ffn_gate_tid2eid) {
            if (lw.ffn_gate_tid2eid.type() != quant::Type::I32) fail("ffn_gate_tid2eid must be I32");
            pi.push_back({arena_.add(lw.ffn_gate_tid2eid, false), &L.tid2eid});
        }
    }
    arena_.upload();
    for (auto& p : pw) *p.w = arena_.weight(p.idx);
    for (auto& p : pf) *p.f = arena_.floats(p.idx);
    for (auto& p : pi) *p.second = arena_.ints(p.first);
}

void CudaBackend::clear_graphs() {
    for (auto& [k, g] : graphs_) {
        if (g.layers) cudaGraphExecDestroy(g.layers);
        if (g.head) cudaGraphExecDestroy(g.head);
    }
    graphs_.clear();
}

void CudaBackend::ensure_workspace(uint32_t R) {
    if (R <= cap_rows_) return;
    const uint64_t n = R;
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, D = c_.head_dim, DI = c_.indexer_head_dim;
    const uint32_t K = c_.n_expert_used, F = c_.n_ff_exp, FS = F * std::max(1u, c_.n_expert_shared);
    uint64_t* g = &gen_;
    X_.ensure(n * HD, "workspace", g);
    flat_.ensure(n * HD, "workspace", g);
    mix_.ensure(n * c_.hc_mix(), "workspace", g);
    x_sub_.ensure(n * E, "workspace", g);
    xn_.ensure(n * E, "workspace", g);
    post_.ensure(n * H, "workspace", g);
    comb_.ensure(n * H * H, "workspace", g);
    qr_.ensure(n * c_.q_lora_rank, "workspace", g);
    q_.ensure(n * c_.q_dim(), "workspace", g);
    kvr_.ensure(n * D, "workspace", g);
    ckv_.ensure(n * 2 * D, "workspace", g);
    csc_.ensure(n * 2 * D, "workspace", g);
    pooled_.ensure(n * D, "workspace", g);
    ikv_.ensure(n * 2 * DI, "workspace", g);
    isc_.ensure(n * 2 * DI, "workspace", g);
    ipooled_.ensure(n * DI, "workspace", g);
    qi_.ensure(n * c_.indexer_q_dim(), "workspace", g);
    qib_.ensure(n * c_.indexer_q_dim(), "workspace", g);
    wi_.ensure(n * c_.n_indexer_head, "workspace", g);
    o_.ensure(n * c_.q_dim(), "workspace", g);
    low_.ensure(n * c_.n_out_group * c_.o_lora_rank, "workspace", g);
    y_.ensure(n * E, "workspace", g);
    rlog_.ensure(n * c_.n_expert, "workspace", g);
    ew_.ensure(n * K, "workspace", g);
    experts_.ensure(n * K, "workspace", g);
    grp_.ensure(3ull * moe_groups_cap(R * K, c_.n_expert, 8), "workspace", g);
    grp_pairs_.ensure(n * K, "workspace", g);
    grp_count_.ensure(1, "workspace", g);
    gate_.ensure(n * K * F, "workspace", g);
    up_.ensure(n * K * F, "workspace", g);
    mid_.ensure(n * K * F, "workspace", g);
    down_.ensure(n * K * E, "workspace", g);
    shg_.ensure(n * FS, "workspace", g);
    shu_.ensure(n * FS, "workspace", g);
    sel_.ensure(n * std::max(1u, c_.indexer_top_k), "workspace", g);
    want_.ensure(n, "workspace", g);
    rows_dev_.ensure(n, "workspace", g);
    sess_begin_.ensure(n, "workspace", g);
    sess_end_.ensure(n, "workspace", g);
    lkv_dev_.ensure(n * c_.n_layer, "workspace", g);
    // Activation buffers: the widest product input of any matrix, for every row (experts:
    // every (row, slot) pair; the grouped output projection: the whole attention output).
    const uint64_t widest = std::max<uint64_t>({HD, E, c_.q_lora_rank, c_.q_dim(),
                                                uint64_t(c_.n_out_group) * c_.o_lora_rank, FS, uint64_t(K) * F});
    const uint64_t vals = (n * widest + 255) / 256 * 256;
    act_q_.ensure(vals, "workspace", g);
    act_d_.ensure(vals / 32, "workspace", g);
    act_b_.ensure(vals / 16, "workspace", g);
    act_ = {act_q_.get(), act_d_.get(), act_b_.get(), vals};
    const uint64_t vals2 = (n * std::max(E, FS) + 255) / 256 * 256;
    act2_q_.ensure(vals2, "workspace", g);
    act2_d_.ensure(vals2 / 32, "workspace", g);
    act2_b_.ensure(vals2 / 16, "workspace", g);
    act2_ = {act2_q_.get(), act2_d_.get(), act2_b_.get(), vals2};
    const uint64_t vals3 = (n * c_.q_lora_rank + 255) / 256 * 256;
    qra_q_.ensure(vals3, "workspace", g);
    qra_d_.ensure(vals3 / 32, "workspace", g);
    qra_b_.ensure(vals3 / 16, "workspace", g);
    qra_ = {qra_q_.get(), qra_d_.get(), qra_b_.get(), vals3};
    xn8_q_.ensure(vals2, "workspace", g);
    xn8_d_.ensure(vals2 / 32, "workspace", g);
    xn8_b_.ensure(vals2 / 16, "workspace", g);
    xn8_ = {xn8_q_.get(), xn8_d_.get(), xn8_b_.get(), vals2};
    xnk_q_.ensure(vals2, "workspace", g);
    xnk_d_.ensure(vals2 / 32, "workspace", g);
    xnk_b_.ensure(vals2 / 16, "workspace", g);
    xnk_ = {xnk_q_.get(), xnk_d_.get(), xnk_b_.get(), vals2};
    hc_gate_.ensure(n * (H + 1), "workspace", g);
    hc_part_.ensure(hc_pre_partials(R, H, E), "workspace", g);
    if (tail_count_.ensure(2, "workspace", g))
        check(cudaMemsetAsync(tail_count_.get(), 0, tail_count_.size() * sizeof(uint32_t), stream_), "tail counters");
    if (hc_count_.ensure(hc_pre_counters(R), "workspace", g))
        check(cudaMemsetAsync(hc_count_.get(), 0, hc_count_.size() * sizeof(uint32_t), stream_), "hc counters");
    if (idx_count_.ensure(n, "workspace", g))
        check(cudaMemsetAsync(idx_count_.get(), 0, idx_count_.size() * sizeof(uint32_t), stream_), "indexer counters");
    cap_rows_ = R;
}

// mHC pre (§5.5) for every row, then the sublayer's RMSNorm: xn_.
void CudaBackend::hc_pre(const DevWeight& fn, const float* scale, const float* base, const float* norm_w, uint32_t R,
                         std::initializer_list<const DevWeight*> users) {
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, M = c_.hc_mix();
    // Sinkhorn (a chain of ~40 dependent normalisations) makes comb, which only hc_post at
    // the sublayer's end reads: it runs on side stream kSinkhorn beside the sublayer.
    const bool side_sinkhorn = branches_on_;
    // The choice depends on the model alone (never on R): prefill and decode rows must agree.
    if (g_hc_spread_on && hc_pre_spread_ok(H, E, fn, X_.get(), xn_.get(), norm_w)) {
        hc_pre_mix(fn, X_.get(), scale, base, R, H, E, c_.hc_eps, c_.rms_eps, mix_.get(), post_.get(),
                   hc_gate_.get(), hc_part_.get(), hc_count_.get(), stream_, post_pending_);
        post_pending_ = {};
        const cudaStream_t ss = side_sinkhorn ? side_[kSinkhorn] : stream_;
        if (side_sinkhorn) fork(kSinkhorn);
        hc_sinkhorn(mix_.get(), scale, base, R, H, c_.hc_eps, c_.n_sinkhorn_iter, comb_.get(), ss);
        // xn's activation codes for the sublayer's products come out of the same kernel
        xn_have_[0] = xn_have_[1] = xn_have_[2] = xnh_have_ = false;
        HcQuant qa;
        if (E % 256 == 0 && uint64_t(R) * E <= xn8_.cap_values && uint64_t(R) * E <= xnk_.cap_values)
            for (const DevWeight* w : users) {
                const uint32_t k = uint32_t(act_kind(w->type));
                if (!w->K || k == 0 || xn_have_[k]) continue;
                const ActBuf& b = k == 1 ? xn8_ : xnk_;
                (k == 1 ? qa.q0 : qa.qk) = b.q;
                (k == 1 ? qa.d0 : qa.dk) = b.d;
                if (k == 2) qa.bk = b.bsum;
                xn_acts_[k] = codes_in(ActKind(k), E, b);
                xn_have_[k] = true;
            }
        // and its FP16 form for the round's cuBLAS products (xn_f16_level 2)
        if (xn_f16_level() >= 2 && cublas_round(R) && E % 4 == 0) {
            xnh_.ensure(uint64_t(R) * E, "workspace", &gen_);
            qa.h_top = xn_bound(norm_w);
            qa.h = qa.h_top ? xnh_.get() : nullptr;
        }
        hc_pre_collapse(X_.get(), hc_gate_.get(), norm_w, R, H, E, xn_.get(), stream_, qa);
        if (qa.h) {
            xnh_have_ = true;
            xnh_top_at_ = qa.h_top;
        }
        mark("hc_pre", double(M) * fn.row_bytes);
        return;
    }
    flush_post(R);
    rms_norm(X_.get(), HD, flat_.get(), HD, R, HD, c_.rms_eps, nullptr, stream_);
    mm(fn, flat_.get(), HD, R, mix_.get(), M, M);
    if (side_sinkhorn) {
        fork(kSinkhorn);
        hc_sinkhorn(mix_.get(), scale, base, R, H, c_.hc_eps, c_.n_sinkhorn_iter, comb_.get(), side_[kSinkhorn]);
    }
    if (hc_pre_norm_fusable(H, E, X_.get(), xn_.get(), norm_w)) {
        hc_pre_finish(mix_.get(), scale, base, X_.get(), R, H, E, c_.hc_eps, c_.n_sinkhorn_iter, post_.get(),
                      comb_.get(), x_sub_.get(), stream_, norm_w, c_.rms_eps, xn_.get(), !side_sinkhorn);
    } else {
        hc_pre_finish(mix_.get(), scale, base, X_.get(), R, H, E, c_.hc_eps, c_.n_sinkhorn_iter, post_.get(),
                      comb_.get(), x_sub_.get(), stream_, nullptr, 0.0f, nullptr, !side_sinkhorn);
        rms_norm(x_sub_.get(), E, xn_.get(), E, R, E, c_.rms_eps, norm_w, stream_);
    }
    xn_have_[0] = xn_have_[1] = xn_have_[2] = xnh_have_ = false;
    mark("hc_pre", double(M) * fn.row_bytes);
}

// The attention sublayer. After mHC pre, branches: the query path (main stream), the KV row
// (side 0), the attention compressor (side 1), the indexer's compressor (side 2) and its
// queries (side 4: the head weights, then iq_b once the query path has made qr_, then the
// scores and top-k once side 2 has emitted its rows). They meet before the attention; the
// sublayer's mHC post is left to the next sublayer's mix (sublayer_post).
void CudaBackend::attention_layer(uint32_t il, uint32_t R, uint32_t S) {
    const DevLayer& L = layers_[il];
    const uint32_t E = c_.n_embd, D = c_.head_dim, QL = c_.q_lora_rank, NL = c_.n_layer;
    const uint32_t ratio = c_.ratio(il);
    const double* invf = ratio ? inv_freq_comp_.get() : inv_freq_plain_.get();
    const bool official = opt_.numerics == Numerics::Official;
    const DevRow* rows = rows_dev_.get();
    const DevLayerKV* lkv = lkv_dev_.get();

    const auto users = {&L.q_a, &L.kv, &L.comp_kv, &L.comp_gate, &L.icomp_kv, &L.icomp_gate, &L.iproj};
    hc_pre(L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, L.attn_norm, R, users);
    xn_acts_for(users, R);
    // KV path: one latent row per token into the raw ring
    fork(0);
    const cudaStream_t sk = side(0);
    mv_xn(L.kv, R, kvr_.get(), D, "kv", sk);
    kv_finalize(kvr_.get(), R, D, c_.n_rot, c_.rms_eps, L.kv_a_norm, invf, rows, official, c_.n_nope(), lkv, NL, il,
                sk);
    mark("kv finalize");
    // compressors
    if (ratio != 0) {
        fork(1);
        const cudaStream_t sc = side(1);
        const uint32_t W = c_.coff(il) * D;
        compressor_proj(L.comp_kv, L.comp_gate, R, ckv_.get(), csc_.get(), W, "compressor proj", 1, kCompGate);
        compressor_state(ckv_.get(), csc_.get(), L.comp_ape, rows, R, sess_begin_.get(), sess_end_.get(), S, ratio, D,
                         false, lkv, NL, il, pooled_.get(), sc);
        compressor_emit(pooled_.get(), R, rows, ratio, D, c_.n_rot, c_.n_nope(), c_.rms_eps, L.comp_norm, invf, false,
                        official, lkv, NL, il, sc);
        mark("compressor");
    }
    // the indexer: its compressor on side 2; its queries on side iq (their own branch unless
    // g_branch_split is 0), which waits for qr and then for the compressor's emitted rows
    const uint32_t iq = g_branch_split >= 1 ? kIdxQuery : 2;
    const cudaStream_t si = side(iq);
    if (ratio == 4) {
        fork(2);
        if (iq != 2) fork(iq);
        const cudaStream_t sic = side(2);
        const uint32_t DI = c_.indexer_head_dim, Wi = 2 * DI;
        compressor_proj(L.icomp_kv, L.icomp_gate, R, ikv_.get(), isc_.get(), Wi, "indexer proj", 2, kIdxCompGate);
        compressor_state(ikv_.get(), isc_.get(), L.icomp_ape, rows, R, sess_begin_.get(), sess_end_.get(), S, ratio, DI,
                         true, lkv, NL, il, ipooled_.get(), sic);
        compressor_emit(ipooled_.get(), R, rows, ratio, DI, c_.n_rot, c_.n_nope(), c_.rms_eps, L.icomp_norm, invf,
                        true, official, lkv, NL, il, sic);
        mark("compressor");
        // the indexer's head weights need only xn: made before the branch waits for qr (and
        // only when a row sees more compressed rows than the top-k: nothing reads them else)
        if (vis_ld_) mv_xn(L.iproj, R, wi_.get(), c_.n_indexer_head, "indexer proj", si);
    }
    // Q path: qr_ normed, then quantised once for q_b and the indexer's queries (same
    // activation kind: one copy); for Q8_0 both in one launch (with DSV4_MV_TAIL=1, for one
    // row, the last block of q_a's product itself: matvec_tail)
    const bool q8_norm = act_kind(L.q_b.type) == ActKind::Q8_0 && QL % 32 == 0;
    DevAct qa;
    if (q8_norm && matvec_tail_on() && matvec_tail_fits(L.q_a, xn_act(L.q_a.type, R), R, QL, MvTail::NormQ8_0) &&
        uint64_t(R) * QL <= qra_.cap_values) {
        MvTail t;
        t.kind = MvTail::NormQ8_0;
        t.count = tail_count_.get();
        t.eps = c_.rms_eps;
        t.norm_w = L.q_a_norm;
        t.q = qra_.q;
        t.d = qra_.d;
        matvec_tail(L.q_a, xn_act(L.q_a.type, R), qr_.get(), QL, t, stream_);
        mark("q_a", double(QL) * L.q_a.row_bytes);
        qa = codes_in(ActKind::Q8_0, QL, qra_);
    } else {
        mv_xn(L.q_a, R, qr_.get(), QL, "q_a");
        qa = q8_norm ? rms_norm_q8_0(qr_.get(), QL, R, QL, c_.rms_eps, L.q_a_norm, qra_, stream_)
                     : (rms_norm(qr_.get(), QL, qr_.get(), QL, R, QL, c_.rms_eps, L.q_a_norm, stream_),
                        quantize_act(L.q_b.type, qr_.get(), QL, R, QL, qra_, stream_));
    }
    if (ratio == 4) {
        wait_main(iq);
        const uint32_t DI = c_.indexer_head_dim, NIH = c_.n_indexer_head;
        const float wscale = float(1.0 / std::sqrt(double(DI) * NIH));
        // Fused (decode rounds of short conversations): iq_b → indexer_fused (queries
        // prepared, scored and selected in one launch), and nothing at all while every row
        // sees at most top_k compressed rows. Prompt rounds with official numerics score on
        // the tensor cores instead, whatever their size (one order for every chunking of a
        // prompt); in decode rounds the rows that see tc_from compressed rows or more do
        // (indexer_tc_decode_from: a row's own length decides), the others on the FP32 kernels.
        const bool prompt_tc = official && indexer_tc_ok(NIH, DI) && gemm_prefill_order();
        const uint64_t tc_from = official && !prompt_tc ? indexer_tc_decode_from(NIH, DI, c_.n_rot) : 0;
        const bool decode_tc = tc_from && vis_ld_ >= tc_from;
        const bool tc = prompt_tc || decode_tc;
        const bool fused = !tc && g_idx_fused && indexer_fused_preferred(vis_ld_) &&
                           indexer_fused_ok(R, NIH, DI, c_.n_rot, vis_ld_);
        if (vis_ld_) {
            const DevAct qi_a = act_kind(L.iq_b.type) == qa.kind
                                    ? qa
                                    : quantize_act(L.iq_b.type, qr_.get(), QL, R, QL, act2_, si);
            dup("indexer proj",
                [&] { matvec(L.iq_b, qi_a, R, qi_.get(), c_.indexer_q_dim(), c_.indexer_q_dim(), 0, si); });
            mark("indexer proj", double(c_.indexer_q_dim()) * L.iq_b.row_bytes);
            wait_side(iq, 2);   // the scores read the rows the compressor emits this step
            if (fused) {
                indexer_fused(qi_.get(), wi_.get(), R, NIH, DI, c_.n_rot, invf, rows, official, wscale, lkv, NL, il,
                              c_.indexer_top_k, vis_ld_, score_.get(), vis_ld_, idx_count_.get(), sel_.get(), si);
            } else {
                // (the tensor cores take the queries as BF16: half the bytes, no conversion there)
                // (a decode round with the tensor cores keeps the float queries for its short rows)
                indexer_q_prep(qi_.get(), wi_.get(), R, NIH, DI, c_.n_rot, invf, rows, official, wscale, si,
                               tc ? qib_.get() : nullptr, decode_tc);
                if (!prompt_tc)
                    indexer_scores(qi_.get(), wi_.get(), R, NIH, DI, rows, lkv, NL, il, c_.indexer_top_k, vis_ld_,
                                   score_.get(), vis_ld_, si, decode_tc ? tc_from : 0);
                if (tc)
                    indexer_scores_tc(qib_.get(), wi_.get(), R, NIH, DI, rows, lkv, NL, il, c_.indexer_top_k, vis_ld_,
                                      score_.get(), vis_ld_, si, decode_tc ? tc_from : 0);
                topk_select(score_.get(), vis_ld_, R, rows, 4, c_.indexer_top_k, sel_.get(), si);
            }
            mark("indexer scores+top-k");
        }
    }
    // The queries' per-head norm and RoPE: in a prompt round's rows kernel on its staged heads
    // (attn_rows_qnorm: the same bits, one launch and a pass over q_ fewer; nothing else reads
    // q_), else head_norm_rope first. Where the fast rows kernels fold them (their query kernel)
    // and q_b takes cuBLAS, at attn_half_output_on's level 3 q_b's output as FP16 into it (qh_:
    // q_half; the floats where that product declines).
    const uint64_t QD = c_.q_dim();
    const bool q_fold = attn_rows_qnorm(c_.n_head, D, c_.n_rot);
    const bool q_try = q_fold && attn_half_output_on() >= 3 && attn_rows_half_output(c_.n_head, D, c_.n_rot) &&
                       gemm_q8_0_takes_cublas(L.q_b, R, QD, QL, 0, QD, stream_);
    if (q_try) {
        qh_.ensure(R * QD, "workspace", &gen_);
        qh_top_.ensure(1, "workspace", &gen_);
    }
    bool q_half = false;
    dup("q_b", [&] {
        q_half = q_try && gemm_q8_0_cublas_half(L.q_b, qa, R, QD, 0, qh_.get(), qh_top_.get(), stream_);
        if (!q_half) matvec(L.q_b, qa, R, q_.get(), QD, QD, 0, stream_);
    });
    mark("q_b", double(c_.q_dim()) * L.q_b.row_bytes);
    if (!q_fold) {
        head_norm_rope(q_.get(), R, c_.n_head, D, c_.n_rot, c_.rms_eps, true, false, invf, rows, stream_);
        mark("q norm+rope");
    }
    join(0);
    if (ratio != 0) join(1);
    if (ratio == 4) join(2);
    if (ratio == 4 && iq != 2) join(iq);
    if (kh_round_) {   // (after the joins: this step's raw and compressed rows are written)
        keys_to_halves(lkv, S, NL, il, D, ratio, stream_);
        mark("key halves");
    }
    // grouped low-rank output projection: one quantisation of the whole output (for Q8_0 by
    // the attention's merge itself), one product. Where that product takes cuBLAS and the fast
    // rows kernels run (attn_half_output_on), the attention's output as FP16 instead, the
    // product's input as it is (oh_: o_half); at level 2, where out_b takes cuBLAS too, out_a's
    // output as FP16, out_b's input as it is (lowh_: low_half).
    const uint32_t G = c_.n_out_group, OL = c_.o_lora_rank;
    const uint64_t GL = uint64_t(G) * OL;
    const bool o_codes = act_kind(L.out_a.type) == ActKind::Q8_0 && D % 128 == 0;
    const int half_level = o_codes ? attn_half_output_on() : 0;
    const bool o_half = half_level >= 1 && attn_rows_half_output(c_.n_head, D, c_.n_rot) &&
                        gemm_q8_0_takes_cublas(L.out_a, R, GL, QD, OL, GL, stream_);
    const bool low_half = o_half && half_level >= 2 && gemm_q8_0_takes_cublas(L.out_b, R, E, GL, 0, E, stream_);
    DevAct ao, al;
    if (o_half) {
        oh_.ensure(R * QD, "workspace", &gen_);
        oh_max_.ensure(1, "workspace", &gen_);
        ao = half_act(QD, oh_.get(), half_top(), oh_max_.get());
    }
    if (low_half) {
        lowh_.ensure(R * GL, "workspace", &gen_);
        lowh_top_.ensure(1, "workspace", &gen_);
        al = half_act(GL, lowh_.get(), lowh_top_.get(), nullptr);   // (out_b's output is floats: no bound)
    }
    attention(q_.get(), L.sinks, R, c_.n_head, D, c_.n_swa, ratio, c_.indexer_top_k, sel_.get(), rows, lkv, NL, il,
              c_.n_rot, invf, o_.get(), stream_, o_codes && !o_half ? &act_ : nullptr,
              AttnQNorm{q_fold, c_.rms_eps, q_half ? qh_.get() : nullptr, q_half ? qh_top_.get() : nullptr},
              o_half ? AttnHalfOut{oh_.get(), oh_max_.get()} : AttnHalfOut{});
    mark("attention");
    if (!o_half)
        ao = o_codes ? codes_in(ActKind::Q8_0, QD, act_) : quantize_act(L.out_a.type, o_.get(), QD, R, QD, act_, stream_);
    if (low_half) {
        dup("out_a", [&] {
            if (!gemm_q8_0_cublas_half(L.out_a, ao, R, GL, OL, lowh_.get(), lowh_top_.get(), stream_))
                throw std::logic_error("out_a: the FP16 output's product refused after gemm_q8_0_takes_cublas");
        });
        mark("out_a", double(G) * OL * L.out_a.row_bytes);
        dup("out_b", [&] { matvec(L.out_b, al, R, y_.get(), E, E, 0, stream_); });
    } else {
        dup("out_a", [&] { matvec_grouped(L.out_a, ao, R, low_.get(), GL, GL, OL, stream_); });
        mark("out_a", double(G) * OL * L.out_a.row_bytes);
        dup("out_b", [&] { mm(L.out_b, low_.get(), GL, R, y_.get(), E, E); });
    }
    mark("out_b", double(E) * L.out_b.row_bytes);
    join(kSinkhorn);
    sublayer_post(R, nullptr, 0, true);
}

// The MoE sublayer: the shared expert (side 0) beside the router and the routed experts.
void CudaBackend::ffn_layer(uint32_t il, uint32_t R) {
    const DevLayer& L = layers_[il];
    const uint32_t E = c_.n_embd, F = c_.n_ff_exp, K = c_.n_expert_used, NE = c_.n_expert;
    const auto users = {&L.gate_inp, &L.gate_exps, &L.up_exps, &L.gate_sh, &L.up_sh};
    hc_pre(L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm, R, users);
    xn_acts_for(users, R);
    // shared expert into y_ (the routed experts' sum is added to it below)
    const uint32_t FS = F * c_.n_expert_shared;
    if (FS) {
        fork(0);
        const cudaStream_t ss = side(0);
        // (many rows of Q8_0: two tensor-core products and the SwiGLU beat the fused kernel)
        if (matvec_swiglu_ok(L.gate_sh, L.up_sh) && !gemm_q8_0_eligible(L.gate_sh, R, FS, 0, false)) {
            dup("shared expert", [&] {
                matvec_swiglu(L.gate_sh, L.up_sh, xn_act(L.gate_sh.type, R), R, shg_.get(), FS, FS,
                              c_.swiglu_clamp_shexp[il], nullptr, ss);
            });
            mark("shared expert", double(FS) * (L.gate_sh.row_bytes + L.up_sh.row_bytes));
        } else {
            mv_xn(L.gate_sh, R, shg_.get(), FS, "shared expert", ss);
            mv_xn(L.up_sh, R, shu_.get(), FS, "shared expert", ss);
            swiglu(shg_.get(), shu_.get(), shg_.get(), R, FS, c_.swiglu_clamp_shexp[il], nullptr, ss);
        }
        dup("shared expert", [&] { mm(L.down_sh, shg_.get(), FS, R, y_.get(), E, E, ss, act2_); });
        mark("shared expert", double(E) * L.down_sh.row_bytes);
    }
    // router: its scores' product, then the picks in a launch of their own (with
    // DSV4_MV_TAIL=1, for one row, in the product's last block: matvec_tail). (Run inside the
    // routed experts' gate+up product instead, one launch fewer, it measured 0.6 % slower on
    // the H200: run 53; removed, the code is in 9d791fa.)
    const bool hash = c_.is_hash_layer(il);
    const RouterArgs route{rlog_.get(), NE, K, hash ? nullptr : L.exp_probs_b, hash ? L.tid2eid : nullptr,
                           rows_dev_.get(), c_.expert_weights_norm, c_.expert_weights_scale, experts_.get(),
                           ew_.get(), bad_.get()};
    if (K <= 32 && matvec_tail_on() &&
        matvec_tail_fits(L.gate_inp, xn_act(L.gate_inp.type, R), R, NE, MvTail::Router)) {
        MvTail t;
        t.kind = MvTail::Router;
        t.count = tail_count_.get() + 1;
        t.router = route;
        matvec_tail(L.gate_inp, xn_act(L.gate_inp.type, R), rlog_.get(), NE, t, stream_);
    } else {
        mv_xn(L.gate_inp, R, rlog_.get(), NE, "router");
        router(route, R, stream_);
    }
    mark("router");
    // routed experts: pair p = r*K + k. With several rows, the pairs are gathered by expert
    // first so each expert's weight rows are read once for up to 8 of its pairs.
    const uint32_t P = R * K;
    // 2-bit experts on the tensor cores take groups of gemm_kq_pairs() pairs (the fused
    // gate+up there exists for IQ2_XXS); every other case matvec's groups of 8. (The cap of
    // groups of 8 covers any larger per_group: grp_ is sized for it.)
    MoeGroups groups{grp_.get(), grp_pairs_.get(), grp_count_.get(), moe_groups_cap(P, NE, 8), gemm_kq_pairs()};
    if (!(L.gate_exps.type == uint32_t(quant::Type::IQ2_XXS) && gemm_kq_eligible(L.gate_exps, &groups) &&
          gemm_kq_eligible(L.up_exps, &groups) && gemm_kq_eligible(L.down_exps, &groups)))
        groups.per_group = 8;
    // The grouped kernels launch a block row per possible group (their grid's y is the cap; rows
    // past the round's count return at once): the cap of the groups actually formed, not of
    // groups of 8 (a 2,048-token round in groups of 64: 448 rows instead of 1,792, ~21,500 empty
    // blocks fewer a product). DSV4_MOE_TIGHT_CAP=0: the cap of groups of 8 (before).
    static const bool tight_cap = env_switch("DSV4_MOE_TIGHT_CAP", true);
    if (tight_cap) groups.cap = moe_groups_cap(P, NE, groups.per_group);
    // A prompt round's 2-bit experts add in k order (groups of gemm_kq_pairs() = 64, DSV4_KQ_FLAT):
    // the grouped FLAT GEMMs, or for a round of few rows (prompt_pair_rows) pair by pair by the
    // FLAT forms of decode's kernels, where those take the experts (kq_pair_flat_ok; else grouped,
    // rounds of one row too): the same bits either way, so every chunking of a prompt gets the same.
    // The fast mode's pairs keep decode's order (as measured, run 179).
    const bool fast = fast_prefill_round();
    const bool flat = kq_flat_round() && !fast;
    const bool prompt_kq = gemm_prefill_order() && groups.per_group != 8;
    const bool prompt_pairs = prompt_kq && R <= std::min(prompt_pair_rows(fast), g_decode_pair_rows) &&
                              (!flat || (kq_pair_flat_ok(L.gate_exps, &L.up_exps) && kq_pair_flat_ok(L.down_exps)));
    const bool kq_prompt = prompt_kq && !prompt_pairs;
    const FlatPairsScope flat_pairs(prompt_pairs && flat);
    // A decode round (a token a session) groups its pairs only when its experts are likely to
    // hold several pairs each (g_decode_pair_rows): R rows pick 6 of 256 experts each, so up
    // to ~64 rows a used expert holds ~1-2 pairs, and a group's GEMM block then walks an
    // expert's whole weight for one pair (run 98, 2 sessions: the grouped gate+up 124 us a
    // layer against 23 for one session's 6 pairs). Per pair, decode's own kernels run: every
    // session's bits are those it gets alone, either way.
    const MoeGroups* gp = R > g_decode_pair_rows || kq_prompt ? &groups : nullptr;
    if (gp) moe_groups(experts_.get(), P, NE, groups, stream_);
    const DevAct ag = xn_act(L.gate_exps.type, R);
    if (matvec_swiglu_ok(L.gate_exps, L.up_exps)) {
        // one pass: both rows of a (pair, n) in one warp, SwiGLU in the epilogue
        dup("experts gate+up", [&] {
            matvec_swiglu(L.gate_exps, L.up_exps, ag, P, mid_.get(), F, F, c_.swiglu_clamp_exp[il], ew_.get(), stream_,
                          experts_.get(), F, K, gp);
        });
        mark("experts gate+up", double(P) * F * (L.gate_exps.row_bytes + L.up_exps.row_bytes));
    } else {
        const DevAct au = xn_act(L.up_exps.type, R);
        matvec(L.gate_exps, ag, P, gate_.get(), F, F, 0, stream_, experts_.get(), F, K, gp);
        matvec(L.up_exps, au, P, up_.get(), F, F, 0, stream_, experts_.get(), F, K, gp);
        mark("experts gate+up", double(P) * F * (L.gate_exps.row_bytes + L.up_exps.row_bytes));
        swiglu(gate_.get(), up_.get(), mid_.get(), P, F, c_.swiglu_clamp_exp[il], ew_.get(), stream_);
    }
    const DevAct ad = quantize_act(L.down_exps.type, mid_.get(), F, P, F, act_, stream_);
    dup("experts down", [&] { matvec(L.down_exps, ad, P, down_.get(), E, E, 0, stream_, experts_.get(), E, 1, gp); });
    mark("experts down", double(P) * E * L.down_exps.row_bytes);
    // moe + shared summed in a fixed order
    if (FS) join(0);
    join(kSinkhorn);
    sublayer_post(R, down_.get(), K, FS != 0);
}

void CudaBackend::run_layers(uint32_t R, uint32_t S) {
    post_pending_ = {};
    embed(token_embd_, rows_dev_.get(), R, c_.n_embd, c_.n_hc, X_.get(), stream_);
    mark("embed");
    for (uint32_t il = 0; il < c_.n_layer; ++il) {
        attention_layer(il, R, S);
        ffn_layer(il, R);
    }
    flush_post(R);
}

// §5.14 up to the vocabulary projection, for the rows want_[0, NW): xn_ rows.
void CudaBackend::head_prepare(uint32_t NW) {
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc;
    gather_rows(X_.get(), HD, want_.get(), NW, flat_.get(), stream_);
    rms_norm(flat_.get(), HD, flat_.get(), HD, NW, HD, c_.rms_eps, nullptr, stream_);
    mm(output_hc_fn_, flat_.get(), HD, NW, mix_.get(), H, H);
    output_collapse(mix_.get(), output_hc_scale_, output_hc_base_, X_.get(), want_.get(), NW, H, E, c_.hc_eps,
                    xn_.get(), stream_);
    rms_norm(xn_.get(), E, xn_.get(), E, NW, E, c_.rms_eps, output_norm_, stream_);
    mark("output collapse");
}

void CudaBackend::forward(std::span<StepInput> inputs) {
    const uint32_t chunk = std::max<uint32_t>(1, opt_.prefill_chunk);
    for (auto& in : inputs)
        if (in.kv && !in.kv->on_device())
            fail("forward: the session's KV is in host memory; the CUDA backend needs KV made with its "
                 "region_factory()");
    admit_step(inputs, c_.n_vocab);
    struct OrderReset {   // products launched outside forward (tests, tools) keep decode's order
        ~OrderReset() {
            gemm_prefill_order(false);
            gemm_decode_round(false);
        }
    } order_reset;
    const uint32_t V = c_.n_vocab;
    std::vector<size_t> done(inputs.size(), 0);
    first_pos_.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) first_pos_[i] = inputs[i].kv->n_tokens();
    std::vector<DevRow> drows;
    std::vector<uint32_t> sb, se;
    std::vector<DevLayerKV> lkv;
    for (;;) {
        rows_.clear();
        drows.clear();
        sb.clear();
        se.clear();
        lkv.clear();
        std::vector<size_t> take(inputs.size(), 0);
        // With prompts in their own order (prefill_flat), a round holds prompts' chunks or
        // decode tokens, never both, so a decode token's bits never depend on what other
        // sessions send beside it: the decode tokens go first, in one short round.
        bool singles = false;
        if (prefill_flat())
            for (size_t i = 0; i < inputs.size(); ++i)
                singles = singles ||
                          (inputs[i].error.empty() && done[i] < inputs[i].tokens.size() && !is_prompt(inputs[i]));
        for (size_t i = 0; i < inputs.size(); ++i) {
            StepInput& in = inputs[i];
            if (!in.error.empty() || done[i] >= in.tokens.size()) continue;
            if (singles && is_prompt(in)) continue;   // (the next round)
            take[i] = std::min<size_t>(chunk, in.tokens.size() - done[i]);
            const int32_t sidx = int32_t(sb.size());
            sb.push_back(uint32_t(rows_.size()));
            for (size_t j = 0; j < take[i]; ++j) {
                rows_.push_back({uint32_t(i), in.kv->n_tokens() + j, in.tokens[done[i] + j]});
                drows.push_back({int64_t(in.kv->n_tokens() + j), in.tokens[done[i] + j], sidx});
            }
            se.push_back(uint32_t(rows_.size()));
            kv::SessionKV& kv = *in.kv;
            for (uint32_t il = 0; il < c_.n_layer; ++il) {
                DevLayerKV L;
                L.raw = kv.raw_row(il, 0);
                L.raw_cap = kv.layout().raw_cap;
                L.comp = kv.comp_row(il, 0);
                L.comp_stride = kv.comp_stride(il);
                L.index = kv.index_row(il, 0);
                L.index_stride = kv.index_stride();
                L.skv = kv.state_kv(il);
                L.ssc = kv.state_score(il);
                L.iskv = kv.istate_kv(il);
                L.issc = kv.istate_score(il);
                lkv.push_back(L);
            }
        }
        if (rows_.empty()) break;
        const uint32_t R = uint32_t(rows_.size()), S = uint32_t(sb.size());
        // The guard: nothing is launched unless every row it touches is committed.
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (!take[i]) continue;
            kv::Status st = inputs[i].kv->check(inputs[i].kv->n_tokens() + take[i]);
            if (!st) fail("KV guard: ", st.message);
        }
        // Rows that produce logits: every row of an all_logits input, else its final token;
        // greedy ids for the final tokens of greedy inputs (-2: none wanted).
        want_host_.clear();
        greedy_excl_host_.clear();
        bool greedy = false;
        for (uint32_t r = 0; r < R; ++r) {
            const StepInput& in = inputs[rows_[r].input];
            const bool last = rows_[r].pos == first_pos_[rows_[r].input] + in.tokens.size() - 1;
            if ((in.logits || in.greedy) && (in.all_logits || last)) {
                want_host_.push_back(r);
                greedy_excl_host_.push_back(in.greedy && last ? in.greedy_exclude : -2);
                greedy = greedy || (in.greedy && last);
            }
        }
        const uint32_t NW = uint32_t(want_host_.size());
        bool prompt = false;
        for (size_t i = 0; i < inputs.size(); ++i) prompt = prompt || (take[i] && is_prompt(inputs[i]));
        const bool flat = prefill_flat() && prompt;
        // The output head (head_prepare's mHC mix and the vocabulary product) takes decode's
        // order in every round (DSV4_HEAD_DECODE_ORDER, on by default): a prompt round's few
        // wanted rows then run decode's row kernels instead of one prompt tile walking all of K
        // (run 170, one row: the mix 699 us and the product 512 us a prompt), and a row's
        // logits never depend on how many rows want theirs (the fast mode's cuBLAS took 256 or
        // more). The layers keep the round's order.
        const auto round_order = [&](bool head) {
            const bool decode_head = head && g_head_decode_order;
            gemm_prefill_order(flat && !decode_head);
            fast_prefill_round(fast_prefill_ && prompt && !decode_head);
            gemm_decode_round(!prompt || decode_head);
        };
        round_order(false);
        // The fast rows attention's forms 3, 4 read FP16 keys made once a layer (keys_to_halves):
        // room for each session's raw ring and its compressed rows at ratio 4, unless that would
        // leave the device short (then the round keeps the mma.sync kernel).
        kh_round_ = false;
        if (fast_prefill_ && prompt && c_.head_dim == 512 && attn_rows_wg_form() >= 3) {
            std::vector<uint64_t> off(S + 1, 0);
            for (uint32_t s = 0; s < S; ++s)
                off[s + 1] = off[s] + key_halves_values(lkv[uint64_t(s) * c_.n_layer].raw_cap, rows_[se[s] - 1].pos,
                                                        c_.head_dim);
            size_t free_b = 0, total_b = 0;
            bool fits = off[S] <= kh_.size() || (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
                                                 off[S] * sizeof(uint16_t) + (size_t(2) << 30) <= free_b);
            if (fits) {
                try {   // (an allocation refused after all: this round without them, nothing lost)
                    kh_.ensure(off[S], "attention key halves", &gen_);
                } catch (const std::exception&) {
                    fits = false;
                }
            }
            if (fits) {
                for (uint32_t s = 0; s < S; ++s)
                    for (uint32_t il = 0; il < c_.n_layer; ++il) {
                        DevLayerKV& L = lkv[uint64_t(s) * c_.n_layer + il];
                        L.kh = kh_.get() + off[s];
                        L.kh_hi = int64_t(rows_[se[s] - 1].pos);
                        L.kh_lo = std::max<int64_t>(0, int64_t(rows_[sb[s]].pos) + 1 - int64_t(c_.n_swa));
                    }
                kh_round_ = true;
            }
        }
        attn_key_halves_round(kh_round_);
        // Indexer score rows: as wide as the furthest row's visible compressed rows, rounded
        // up to a power of two so consecutive decode steps share one graph.
        max_vis4_ = 0;
        for (const Row& r : rows_) max_vis4_ = std::max<uint64_t>(max_vis4_, (r.pos + 1) / 4);
        vis_ld_ = 0;
        if (max_vis4_ > c_.indexer_top_k) {
            vis_ld_ = 1024;
            while (vis_ld_ < max_vis4_) vis_ld_ *= 2;
            score_.ensure(uint64_t(R) * vis_ld_, "indexer scores", &gen_);
        }
        ensure_workspace(R);
        const uint32_t slice = std::max<uint32_t>(1, uint32_t(std::min<uint64_t>(NW, (256ull << 20) / (4ull * V))));
        logits_.ensure(uint64_t(std::max(1u, slice)) * V, "logits", &gen_);
        if (greedy) {
            greedy_excl_.ensure(NW, "greedy ids", &gen_);
            greedy_ids_.ensure(NW, "greedy ids", &gen_);
            greedy_part_.ensure(uint64_t(NW) * kGreedyParts, "greedy ids", &gen_);
        }
        // Uploads through pinned memory.
        auto r16 = [](size_t b) { return (b + 15) / 16 * 16; };
        const size_t up_bytes = r16(R * sizeof(DevRow)) + 2 * r16(S * sizeof(uint32_t)) +
                                r16(lkv.size() * sizeof(DevLayerKV)) + 2 * r16(NW * sizeof(uint32_t));
        // After the uploads: the greedy ids' download, then (the last 16 bytes) the flag's.
        const size_t stage_bytes = up_bytes + r16(NW * sizeof(int32_t)) + 32;
        if (stage_bytes > pinned_bytes_) {
            check(cudaStreamSynchronize(stream_), "forward");
            if (pinned_) cudaFreeHost(pinned_);
            pinned_ = nullptr;
            pinned_bytes_ = 0;
            check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), stage_bytes * 2), "pinned staging");
            pinned_bytes_ = stage_bytes * 2;
        }
        {
            uint8_t* p = pinned_;
            auto put = [&](void* dev, const void* src, size_t bytes) {
                if (!bytes) return;
                std::memcpy(p, src, bytes);
                check(cudaMemcpyAsync(dev, p, bytes, cudaMemcpyHostToDevice, stream_), "upload");
                p += (bytes + 15) / 16 * 16;
            };
            put(rows_dev_.get(), drows.data(), R * sizeof(DevRow));
            put(sess_begin_.get(), sb.data(), S * sizeof(uint32_t));
            put(sess_end_.get(), se.data(), S * sizeof(uint32_t));
            put(lkv_dev_.get(), lkv.data(), lkv.size() * sizeof(DevLayerKV));
            put(want_.get(), want_host_.data(), NW * sizeof(uint32_t));
            if (greedy) put(greedy_excl_.get(), greedy_excl_host_.data(), NW * sizeof(int32_t));
        }

        profiling_ = g_profile_on;
        marks_ = 0;
        branches_on_ = !profiling_ && env_switch("DSV4_CUDA_BRANCHES", true);
        ev_next_ = 0;
        if (profiling_) mark("start");
        const bool graphable = g_graphs_on && !profiling_ && R <= 64 && NW <= slice;
        const bool pdl = graphable && pdl_on();
        Graphs* gr = nullptr;
        if (graphable) {
            gr = &graphs_[{R, S, NW, vis_ld_, pdl, flat, greedy, kh_round_}];
            if (gr->layers && gr->gen != gen_) {
                cudaGraphExecDestroy(gr->layers);
                if (gr->head) cudaGraphExecDestroy(gr->head);
                *gr = Graphs{};
            }
            if (!gr->layers && gr->seen) {
                // Second round of this shape: capture (the first ran eagerly and set every
                // kernel attribute, so capture makes no other calls).
                auto capture = [&](auto&& body) {
                    cudaGraph_t g = nullptr;
                    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
                    body();
                    check(cudaStreamEndCapture(stream_, &g), "graph capture");
                    if (pdl) programmatic_edges(g);
                    cudaGraphExec_t e = nullptr;
                    check(cudaGraphInstantiate(&e, g, 0), "graph instantiate");
                    cudaGraphDestroy(g);
                    return e;
                };
                gr->layers = capture([&] { run_layers(R, S); });
                if (NW) gr->head = capture([&] {
                    round_order(true);
                    head_prepare(NW);
                    head_project(0, NW);
                    if (greedy) head_greedy(0, NW);
                    round_order(false);
                });
                gr->gen = gen_;
            }
            gr->seen = true;
            if (!gr->layers) gr = nullptr;   // this round runs eagerly
        }
        if (g_timing_on) {
            if (!ev_[0])
                for (auto& e : ev_) check(cudaEventCreate(&e), "cudaEventCreate");
            check(cudaEventRecord(ev_[0], stream_), "cudaEventRecord");
        }
        if (gr) check(cudaGraphLaunch(gr->layers, stream_), "graph launch");
        else run_layers(R, S);
        attn_key_halves_round(false);   // (read when the layers launch; other callers' rows carry no kh)
        if (g_timing_on) check(cudaEventRecord(ev_[1], stream_), "cudaEventRecord");
        auto download = [&](uint32_t i0, uint32_t n) {
            for (uint32_t i = 0; i < n; ++i) {
                const Row& row = rows_[want_host_[i0 + i]];
                StepInput& in = inputs[row.input];
                if (!in.logits) continue;   // greedy only
                float* out = in.all_logits ? in.logits + (row.pos - first_pos_[row.input]) * V : in.logits;
                check(cudaMemcpyAsync(out, logits_.get() + uint64_t(i) * V, uint64_t(V) * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_),
                      "logits download");
            }
        };
        if (NW) {
            if (gr && gr->head) {
                check(cudaGraphLaunch(gr->head, stream_), "graph launch");
                download(0, NW);
            } else {
                round_order(true);
                head_prepare(NW);
                for (uint32_t i0 = 0; i0 < NW; i0 += slice) {
                    const uint32_t n = std::min(slice, NW - i0);
                    head_project(i0, n);
                    if (greedy) head_greedy(i0, n);
                    download(i0, n);
                    if (i0 + n < NW) check(cudaStreamSynchronize(stream_), "forward");
                }
                round_order(false);
            }
        }
        int32_t* bad_host = reinterpret_cast<int32_t*>(pinned_ + pinned_bytes_ - 16);
        check(cudaMemcpyAsync(bad_host, bad_.get(), sizeof(int32_t), cudaMemcpyDeviceToHost, stream_), "forward");
        int32_t* ids_host = reinterpret_cast<int32_t*>(pinned_ + up_bytes);
        if (greedy)
            check(cudaMemcpyAsync(ids_host, greedy_ids_.get(), NW * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
                  "greedy ids download");
        if (g_timing_on) check(cudaEventRecord(ev_[2], stream_), "cudaEventRecord");
        check(cudaStreamSynchronize(stream_), "forward");
        if (g_timing_on) {
            float a = 0, b = 0;
            cudaEventElapsedTime(&a, ev_[0], ev_[1]);
            cudaEventElapsedTime(&b, ev_[1], ev_[2]);
            g_timing = {a, b};
        }
        if (profiling_) {
            for (size_t i = 1; i < marks_; ++i) {
                float ms = 0;
                cudaEventElapsedTime(&ms, prof_ev_[i - 1], prof_ev_[i]);
                const char* name = prof_names_[i].first;
                auto it = std::find_if(g_profile.begin(), g_profile.end(),
                                       [&](const ProfileEntry& e) { return e.name == name; });
                if (it == g_profile.end()) {
                    g_profile.push_back({name, 0, 0, 0});
                    it = g_profile.end() - 1;
                }
                it->ms += ms;
                it->bytes += prof_names_[i].second;
                it->calls += 1;
            }
        }
        for (uint32_t i = 0; greedy && i < NW; ++i)
            if (greedy_excl_host_[i] != -2) *inputs[rows_[want_host_[i]].input].greedy = ids_host[i];
        if (*bad_host) {
            check(cudaMemset(bad_.get(), 0, sizeof(int32_t)), "flag");
            fail("ffn_gate_tid2eid maps a token to an expert outside [0, ", c_.n_expert, ")");
        }
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (!take[i]) continue;
            done[i] += take[i];
            inputs[i].kv->set_n_tokens(first_pos_[i] + done[i]);
        }
    }
}

}  // namespace

StepTiming last_step_timing() { return g_timing; }
std::vector<ProfileEntry> profile_snapshot() { return g_profile; }
void profile_reset() { g_profile.clear(); }
void profile_enable(bool on) { g_profile_on = on; }
void prefill_flat_override(int on) { g_prefill_flat_override = on; }
void fast_pair_rows_override(int rows) { g_fast_pair_rows_override = rows; }
void exact_pair_rows_override(int rows) { g_exact_pair_rows_override = rows; }
void dup_products_override(const char* names) { g_dup = dup_names(names ? names : std::getenv("DSV4_DUP")); }

std::unique_ptr<Backend> make_cuda_backend_impl(const model::Model& m, const BackendOptions& opt) {
    BackendOptions o = opt;
    if (!o.prefill_chunk) o.prefill_chunk = kCudaPrefillChunk;
    return std::make_unique<CudaBackend>(m, o);
}

}  // namespace dsv4::cuda
