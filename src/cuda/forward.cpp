// The CUDA backend: weights resident in device memory, KV in CUDA VMM regions, and the
// forward pass of src/cpu/forward.cpp on the GPU with the same row-batch structure: a batch
// of rows (session, position, token), layer-major, compressors as per-token state machines,
// the indexer's top-k with ties to the lower index, sink attention, MoE, mHC, and both
// numerics modes. Every kernel computes the CPU's function up to float summation order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
const bool g_timing_on = [] {
    const char* e = std::getenv("DSV4_CUDA_TIMING");
    return e && e[0] == '1';
}();

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
    // Returns true when the buffer moved.
    bool ensure(size_t n, const char* what) {
        if (n <= n_) return false;
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
        uint64_t off2 = 0, bytes2 = 0; // repacked Q8_0 scales
    };

    size_t add(const Tensor& t, bool as_floats) {
        Item it{&t, as_floats, t.type() == quant::Type::I32};
        const uint64_t rows = t.nbytes() / t.row_bytes();
        if (as_floats) {
            uint64_t n = 1;
            for (int i = 0; i < 4; ++i) n *= t.ne(i);
            it.bytes = n * 4;
        } else if (t.type() == quant::Type::Q8_0) {
            it.bytes = rows * t.ne(0);
            it.bytes2 = rows * (t.ne(0) / 32) * 2;
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
            } else if (t.type() == quant::Type::Q8_0) {
                const uint64_t K = t.ne(0), rows = t.nbytes() / t.row_bytes();
                // In slices, so the host staging stays small.
                const uint64_t slice = std::max<uint64_t>(1, (64ull << 20) / K);
                for (uint64_t r0 = 0; r0 < rows; r0 += slice) {
                    const uint64_t n = std::min(slice, rows - r0);
                    stage.resize(n * K + n * (K / 32) * 2);
                    repack_q8_0(t.data() + r0 * t.row_bytes(), n, K, reinterpret_cast<int8_t*>(stage.data()),
                                reinterpret_cast<uint16_t*>(stage.data() + n * K));
                    check(cudaMemcpy(base_ + it.off + r0 * K, stage.data(), n * K, cudaMemcpyHostToDevice),
                          "weight upload");
                    check(cudaMemcpy(base_ + it.off2 + r0 * (K / 32) * 2, stage.data() + n * K, n * (K / 32) * 2,
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
        if (t.type() == quant::Type::Q8_0) {
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
        : m_(m), c_(m.config), w_(m.weights), opt_(opt) {
        check(cudaSetDevice(0), "cudaSetDevice");
        check(cudaStreamCreate(&stream_), "cudaStreamCreate");
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
        for (auto& e : ev_)
            if (e) cudaEventDestroy(e);
        if (stream_) {
            cudaStreamSynchronize(stream_);
            cudaStreamDestroy(stream_);
        }
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
    // y = W · x for R rows (activation quantised as the CPU does).
    void mm(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y, uint64_t ys, uint64_t N,
            uint64_t row0 = 0) {
        const DevAct a = quantize_act(W.type, x, xs, R, W.K, act_, stream_);
        matvec(W, a, R, y, ys, N, row0, stream_);
    }
    void hc_pre(const DevWeight& fn, const float* scale, const float* base, const float* norm_w, uint32_t R);
    void attention_layer(uint32_t il, uint32_t R, uint32_t S);
    void ffn_layer(uint32_t il, uint32_t R);
    void output_head(std::span<StepInput> inputs, uint32_t R);

    const model::Model& m_;
    const model::Config& c_;
    const model::Weights& w_;
    BackendOptions opt_;
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
    uint64_t max_vis4_ = 0;

    // Workspace (device), sized to the largest round seen.
    uint32_t cap_rows_ = 0;
    DBuf<float> X_, flat_, mix_, x_sub_, xn_, post_, comb_, qr_, q_, kvr_, ckv_, csc_, pooled_, ikv_, isc_, ipooled_,
        qi_, wi_, o_, low_, y_, rlog_, ew_, gate_, up_, mid_, down_, shg_, shu_, score_, logits_;
    DBuf<int32_t> experts_, bad_;
    DBuf<uint32_t> sel_, want_, sess_begin_, sess_end_;
    DBuf<DevRow> rows_dev_;
    DBuf<DevLayerKV> lkv_dev_;
    DBuf<int8_t> act_q_, act2_q_;
    DBuf<float> act_d_, act2_d_;
    DBuf<int32_t> act_b_, act2_b_;
    ActBuf act_, act2_;
    cudaEvent_t ev_[3] = {nullptr, nullptr, nullptr};
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

void CudaBackend::ensure_workspace(uint32_t R) {
    if (R <= cap_rows_) return;
    const uint64_t n = R;
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, D = c_.head_dim, DI = c_.indexer_head_dim;
    const uint32_t K = c_.n_expert_used, F = c_.n_ff_exp, FS = F * std::max(1u, c_.n_expert_shared);
    X_.ensure(n * HD, "workspace");
    flat_.ensure(n * HD, "workspace");
    mix_.ensure(n * c_.hc_mix(), "workspace");
    x_sub_.ensure(n * E, "workspace");
    xn_.ensure(n * E, "workspace");
    post_.ensure(n * H, "workspace");
    comb_.ensure(n * H * H, "workspace");
    qr_.ensure(n * c_.q_lora_rank, "workspace");
    q_.ensure(n * c_.q_dim(), "workspace");
    kvr_.ensure(n * D, "workspace");
    ckv_.ensure(n * 2 * D, "workspace");
    csc_.ensure(n * 2 * D, "workspace");
    pooled_.ensure(n * D, "workspace");
    ikv_.ensure(n * 2 * DI, "workspace");
    isc_.ensure(n * 2 * DI, "workspace");
    ipooled_.ensure(n * DI, "workspace");
    qi_.ensure(n * c_.indexer_q_dim(), "workspace");
    wi_.ensure(n * c_.n_indexer_head, "workspace");
    o_.ensure(n * c_.q_dim(), "workspace");
    low_.ensure(n * c_.n_out_group * c_.o_lora_rank, "workspace");
    y_.ensure(n * E, "workspace");
    rlog_.ensure(n * c_.n_expert, "workspace");
    ew_.ensure(n * K, "workspace");
    experts_.ensure(n * K, "workspace");
    gate_.ensure(n * K * F, "workspace");
    up_.ensure(n * K * F, "workspace");
    mid_.ensure(n * K * F, "workspace");
    down_.ensure(n * K * E, "workspace");
    shg_.ensure(n * FS, "workspace");
    shu_.ensure(n * FS, "workspace");
    sel_.ensure(n * std::max(1u, c_.indexer_top_k), "workspace");
    want_.ensure(n, "workspace");
    rows_dev_.ensure(n, "workspace");
    // Activation buffers: the widest product input of any matrix, for every row (experts:
    // every (row, slot) pair).
    const uint64_t widest = std::max<uint64_t>({HD, E, c_.q_lora_rank, c_.group_dim(),
                                                uint64_t(c_.n_out_group) * c_.o_lora_rank, FS, uint64_t(K) * F});
    const uint64_t vals = (n * widest + 255) / 256 * 256;
    act_q_.ensure(vals, "workspace");
    act_d_.ensure(vals / 32, "workspace");
    act_b_.ensure(vals / 16, "workspace");
    act_ = {act_q_.get(), act_d_.get(), act_b_.get(), vals};
    const uint64_t vals2 = (n * E + 255) / 256 * 256;
    act2_q_.ensure(vals2, "workspace");
    act2_d_.ensure(vals2 / 32, "workspace");
    act2_b_.ensure(vals2 / 16, "workspace");
    act2_ = {act2_q_.get(), act2_d_.get(), act2_b_.get(), vals2};
    cap_rows_ = R;
}

// mHC pre (§5.5) for every row, then the sublayer's RMSNorm: xn_.
void CudaBackend::hc_pre(const DevWeight& fn, const float* scale, const float* base, const float* norm_w, uint32_t R) {
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, M = c_.hc_mix();
    rms_norm(X_.get(), HD, flat_.get(), HD, R, HD, c_.rms_eps, nullptr, stream_);
    mm(fn, flat_.get(), HD, R, mix_.get(), M, M);
    hc_pre_finish(mix_.get(), scale, base, X_.get(), R, H, E, c_.hc_eps, c_.n_sinkhorn_iter, post_.get(), comb_.get(),
                  x_sub_.get(), stream_);
    rms_norm(x_sub_.get(), E, xn_.get(), E, R, E, c_.rms_eps, norm_w, stream_);
}

void CudaBackend::attention_layer(uint32_t il, uint32_t R, uint32_t S) {
    const DevLayer& L = layers_[il];
    const uint32_t E = c_.n_embd, H = c_.n_hc, D = c_.head_dim, QL = c_.q_lora_rank, NL = c_.n_layer;
    const uint32_t ratio = c_.ratio(il);
    const double* invf = ratio ? inv_freq_comp_.get() : inv_freq_plain_.get();
    const bool official = opt_.numerics == Numerics::Official;
    const DevRow* rows = rows_dev_.get();
    const DevLayerKV* lkv = lkv_dev_.get();

    hc_pre(L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, L.attn_norm, R);
    // Q path
    mm(L.q_a, xn_.get(), E, R, qr_.get(), QL, QL);
    rms_norm(qr_.get(), QL, qr_.get(), QL, R, QL, c_.rms_eps, L.q_a_norm, stream_);
    mm(L.q_b, qr_.get(), QL, R, q_.get(), c_.q_dim(), c_.q_dim());
    head_norm_rope(q_.get(), R, c_.n_head, D, c_.n_rot, c_.rms_eps, true, false, invf, rows, stream_);
    // KV path: one latent row per token into the raw ring
    mm(L.kv, xn_.get(), E, R, kvr_.get(), D, D);
    kv_finalize(kvr_.get(), R, D, c_.n_rot, c_.rms_eps, L.kv_a_norm, invf, rows, official, c_.n_nope(), lkv, NL, il,
                stream_);
    // compressors
    if (ratio != 0) {
        const uint32_t W = c_.coff(il) * D;
        mm(L.comp_kv, xn_.get(), E, R, ckv_.get(), W, W);
        mm(L.comp_gate, xn_.get(), E, R, csc_.get(), W, W);
        compressor_state(ckv_.get(), csc_.get(), L.comp_ape, rows, sess_begin_.get(), sess_end_.get(), S, ratio, D,
                         false, lkv, NL, il, pooled_.get(), stream_);
        compressor_emit(pooled_.get(), R, rows, ratio, D, c_.n_rot, c_.n_nope(), c_.rms_eps, L.comp_norm, invf, false,
                        official, lkv, NL, il, stream_);
    }
    if (ratio == 4) {
        const uint32_t DI = c_.indexer_head_dim, Wi = 2 * DI, NIH = c_.n_indexer_head;
        mm(L.icomp_kv, xn_.get(), E, R, ikv_.get(), Wi, Wi);
        mm(L.icomp_gate, xn_.get(), E, R, isc_.get(), Wi, Wi);
        compressor_state(ikv_.get(), isc_.get(), L.icomp_ape, rows, sess_begin_.get(), sess_end_.get(), S, ratio, DI,
                         true, lkv, NL, il, ipooled_.get(), stream_);
        compressor_emit(ipooled_.get(), R, rows, ratio, DI, c_.n_rot, c_.n_nope(), c_.rms_eps, L.icomp_norm, invf,
                        true, official, lkv, NL, il, stream_);
        mm(L.iq_b, qr_.get(), QL, R, qi_.get(), c_.indexer_q_dim(), c_.indexer_q_dim());
        mm(L.iproj, xn_.get(), E, R, wi_.get(), NIH, NIH);
        const float wscale = float(1.0 / std::sqrt(double(DI) * NIH));
        indexer_q_prep(qi_.get(), wi_.get(), R, NIH, DI, c_.n_rot, invf, rows, official, wscale, stream_);
        if (max_vis4_ > c_.indexer_top_k) {
            score_.ensure(uint64_t(R) * max_vis4_, "indexer scores");
            indexer_scores(qi_.get(), wi_.get(), R, NIH, DI, rows, lkv, NL, il, c_.indexer_top_k, max_vis4_,
                           score_.get(), max_vis4_, stream_);
            topk_select(score_.get(), max_vis4_, R, rows, 4, c_.indexer_top_k, sel_.get(), stream_);
        }
    }
    attention(q_.get(), L.sinks, R, c_.n_head, D, c_.n_swa, ratio, c_.indexer_top_k, sel_.get(), rows, lkv, NL, il,
              c_.n_rot, invf, o_.get(), stream_);
    // grouped low-rank output projection
    const uint32_t G = c_.n_out_group, OL = c_.o_lora_rank, GD = c_.group_dim();
    for (uint32_t g = 0; g < G; ++g)
        mm(L.out_a, o_.get() + uint64_t(g) * GD, c_.q_dim(), R, low_.get() + uint64_t(g) * OL, uint64_t(G) * OL, OL,
           uint64_t(g) * OL);
    mm(L.out_b, low_.get(), uint64_t(G) * OL, R, y_.get(), E, E);
    hc_post(X_.get(), y_.get(), post_.get(), comb_.get(), R, H, E, stream_);
}

void CudaBackend::ffn_layer(uint32_t il, uint32_t R) {
    const DevLayer& L = layers_[il];
    const uint32_t E = c_.n_embd, H = c_.n_hc, F = c_.n_ff_exp, K = c_.n_expert_used, NE = c_.n_expert;
    hc_pre(L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, L.ffn_norm, R);
    // router
    mm(L.gate_inp, xn_.get(), E, R, rlog_.get(), NE, NE);
    const bool hash = c_.is_hash_layer(il);
    router(rlog_.get(), R, NE, K, hash ? nullptr : L.exp_probs_b, hash ? L.tid2eid : nullptr, rows_dev_.get(),
           c_.expert_weights_norm, c_.expert_weights_scale, experts_.get(), ew_.get(), bad_.get(), stream_);
    // routed experts: pair p = r*K + k
    const uint32_t P = R * K;
    const DevAct ag = quantize_act(L.gate_exps.type, xn_.get(), E, R, E, act_, stream_);
    DevAct au = ag;
    if (act_kind(L.up_exps.type) != ag.kind) au = quantize_act(L.up_exps.type, xn_.get(), E, R, E, act2_, stream_);
    matvec(L.gate_exps, ag, P, gate_.get(), F, F, 0, stream_, experts_.get(), F, K);
    matvec(L.up_exps, au, P, up_.get(), F, F, 0, stream_, experts_.get(), F, K);
    swiglu(gate_.get(), up_.get(), mid_.get(), P, F, c_.swiglu_clamp_exp[il], ew_.get(), stream_);
    const DevAct ad = quantize_act(L.down_exps.type, mid_.get(), F, P, F, act_, stream_);
    matvec(L.down_exps, ad, P, down_.get(), E, E, 0, stream_, experts_.get(), E, 1);
    // shared expert, then moe + shared summed in a fixed order
    const uint32_t FS = F * c_.n_expert_shared;
    if (FS) {
        mm(L.gate_sh, xn_.get(), E, R, shg_.get(), FS, FS);
        mm(L.up_sh, xn_.get(), E, R, shu_.get(), FS, FS);
        swiglu(shg_.get(), shu_.get(), shg_.get(), R, FS, c_.swiglu_clamp_shexp[il], nullptr, stream_);
        mm(L.down_sh, shg_.get(), FS, R, y_.get(), E, E);
    }
    moe_combine(down_.get(), R, K, E, FS != 0, y_.get(), stream_);
    hc_post(X_.get(), y_.get(), post_.get(), comb_.get(), R, H, E, stream_);
}

void CudaBackend::output_head(std::span<StepInput> inputs, uint32_t R) {
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, V = c_.n_vocab;
    std::vector<uint32_t> want;
    for (uint32_t r = 0; r < R; ++r) {
        const StepInput& in = inputs[rows_[r].input];
        const uint64_t first = first_pos_[rows_[r].input];
        if (in.logits && (in.all_logits || rows_[r].pos == first + in.tokens.size() - 1)) want.push_back(r);
    }
    if (want.empty()) return;
    const uint32_t NW = uint32_t(want.size());
    check(cudaMemcpyAsync(want_.get(), want.data(), NW * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_),
          "upload");
    gather_rows(X_.get(), HD, want_.get(), NW, flat_.get(), stream_);
    rms_norm(flat_.get(), HD, flat_.get(), HD, NW, HD, c_.rms_eps, nullptr, stream_);
    mm(output_hc_fn_, flat_.get(), HD, NW, mix_.get(), H, H);
    output_collapse(mix_.get(), output_hc_scale_, output_hc_base_, X_.get(), want_.get(), NW, H, E, c_.hc_eps,
                    xn_.get(), stream_);
    rms_norm(xn_.get(), E, xn_.get(), E, NW, E, c_.rms_eps, output_norm_, stream_);
    // Project in slices of rows so the logits buffer stays bounded.
    const uint32_t slice = std::max<uint32_t>(1, uint32_t(std::min<uint64_t>(NW, (256ull << 20) / (4ull * V))));
    logits_.ensure(uint64_t(slice) * V, "logits");
    for (uint32_t i0 = 0; i0 < NW; i0 += slice) {
        const uint32_t n = std::min(slice, NW - i0);
        mm(output_, xn_.get() + uint64_t(i0) * E, E, n, logits_.get(), V, V);
        for (uint32_t i = 0; i < n; ++i) {
            const Row& row = rows_[want[i0 + i]];
            StepInput& in = inputs[row.input];
            float* out = in.all_logits ? in.logits + (row.pos - first_pos_[row.input]) * V : in.logits;
            check(cudaMemcpyAsync(out, logits_.get() + uint64_t(i) * V, uint64_t(V) * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_),
                  "logits download");
        }
        check(cudaStreamSynchronize(stream_), "forward");
    }
}

void CudaBackend::forward(std::span<StepInput> inputs) {
    const uint32_t chunk = std::max<uint32_t>(1, opt_.prefill_chunk);
    for (auto& in : inputs) {
        in.error.clear();
        if (!in.kv) fail("forward: input without a session");
        if (!in.kv->on_device())
            fail("forward: the session's KV is in host memory; the CUDA backend needs KV made with its "
                 "region_factory()");
        if (in.tokens.empty()) in.error = "empty input: nothing to evaluate";
        for (int32_t t : in.tokens)
            if (t < 0 || uint32_t(t) >= c_.n_vocab) {
                in.error = cat("token id ", t, " is outside the vocabulary [0, ", c_.n_vocab, ")");
                break;
            }
        if (in.error.empty() && in.kv->n_tokens() + in.tokens.size() > in.kv->layout().ctx)
            in.error = cat("context full: ", in.kv->n_tokens(), " tokens in the session + ", in.tokens.size(),
                           " new exceed the context of ", in.kv->layout().ctx, " tokens");
        if (in.error.empty()) {
            // Grow once for the whole input, before any work is launched (outside any graph).
            kv::Status st = in.kv->ensure_tokens(in.kv->n_tokens() + in.tokens.size());
            if (!st) in.error = st.message;
        }
    }
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
        for (size_t i = 0; i < inputs.size(); ++i) {
            StepInput& in = inputs[i];
            if (!in.error.empty() || done[i] >= in.tokens.size()) continue;
            take[i] = std::min<size_t>(chunk, in.tokens.size() - done[i]);
            const int32_t s = int32_t(sb.size());
            sb.push_back(uint32_t(rows_.size()));
            for (size_t j = 0; j < take[i]; ++j) {
                rows_.push_back({uint32_t(i), in.kv->n_tokens() + j, in.tokens[done[i] + j]});
                drows.push_back({int64_t(in.kv->n_tokens() + j), in.tokens[done[i] + j], s});
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
        max_vis4_ = 0;
        for (const Row& r : rows_) max_vis4_ = std::max<uint64_t>(max_vis4_, (r.pos + 1) / 4);
        ensure_workspace(R);
        sess_begin_.ensure(S, "workspace");
        sess_end_.ensure(S, "workspace");
        lkv_dev_.ensure(lkv.size(), "workspace");
        check(cudaMemcpyAsync(rows_dev_.get(), drows.data(), R * sizeof(DevRow), cudaMemcpyHostToDevice, stream_),
              "upload");
        check(cudaMemcpyAsync(sess_begin_.get(), sb.data(), S * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_),
              "upload");
        check(cudaMemcpyAsync(sess_end_.get(), se.data(), S * sizeof(uint32_t), cudaMemcpyHostToDevice, stream_),
              "upload");
        check(cudaMemcpyAsync(lkv_dev_.get(), lkv.data(), lkv.size() * sizeof(DevLayerKV), cudaMemcpyHostToDevice,
                              stream_),
              "upload");

        if (g_timing_on) {
            if (!ev_[0]) {
                for (auto& e : ev_) check(cudaEventCreate(&e), "cudaEventCreate");
            }
            check(cudaEventRecord(ev_[0], stream_), "cudaEventRecord");
        }
        embed(token_embd_, rows_dev_.get(), R, c_.n_embd, c_.n_hc, X_.get(), stream_);
        for (uint32_t il = 0; il < c_.n_layer; ++il) {
            attention_layer(il, R, S);
            ffn_layer(il, R);
        }
        if (g_timing_on) check(cudaEventRecord(ev_[1], stream_), "cudaEventRecord");
        output_head(inputs, R);
        if (g_timing_on) {
            check(cudaEventRecord(ev_[2], stream_), "cudaEventRecord");
            check(cudaEventSynchronize(ev_[2]), "cudaEventSynchronize");
            float a = 0, b = 0;
            cudaEventElapsedTime(&a, ev_[0], ev_[1]);
            cudaEventElapsedTime(&b, ev_[1], ev_[2]);
            g_timing = {a, b};
        }
        int32_t bad = 0;
        check(cudaMemcpyAsync(&bad, bad_.get(), sizeof(bad), cudaMemcpyDeviceToHost, stream_), "forward");
        check(cudaStreamSynchronize(stream_), "forward");
        if (bad) {
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

std::unique_ptr<Backend> make_cuda_backend_impl(const model::Model& m, const BackendOptions& opt) {
    return std::make_unique<CudaBackend>(m, opt);
}

}  // namespace dsv4::cuda
