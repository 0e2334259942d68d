// The CPU reference backend: DeepSeek V4's forward pass, read top to bottom like
// model-spec §5, for a batch of rows (one prefill chunk, or decode steps of several
// sessions). Each row is (session, position, token); everything per token is computed
// the same way whatever the batch, so prefill, chunked prefill and token-by-token decode
// give the same logits, and lazy and eager KV give bit-identical ones.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu/numerics.h"
#include "cpu/threadpool.h"
#include "dsv4/backend.h"
#include "dsv4/sampler.h"

namespace dsv4 {

Numerics parse_numerics(const std::string& s) {
    if (s == "official") return Numerics::Official;
    if (s == "plain") return Numerics::Plain;
    fail("--numerics: expected 'official' or 'plain', found '", s, "'");
}

const char* numerics_name(Numerics n) { return n == Numerics::Official ? "official" : "plain"; }

void admit_step(std::span<StepInput> inputs, uint32_t n_vocab) {
    for (auto& in : inputs) {
        in.error.clear();
        if (!in.kv) fail("forward: input without a session");
        if (in.tokens.empty()) in.error = "empty input: nothing to evaluate";
        for (int32_t t : in.tokens)
            if (t < 0 || uint32_t(t) >= n_vocab) {
                in.error = cat("token id ", t, " is outside the vocabulary [0, ", n_vocab, ")");
                break;
            }
        if (in.error.empty() && in.kv->n_tokens() + in.tokens.size() > in.kv->layout().ctx)
            in.error = cat("context full: ", in.kv->n_tokens(), " tokens in the session + ", in.tokens.size(),
                           " new exceed the context of ", in.kv->layout().ctx, " tokens");
        if (in.error.empty()) {
            // Grow once for the whole input, before any write (and, on CUDA, outside any
            // captured graph): a refusal leaves the session intact.
            kv::Status st = in.kv->ensure_tokens(in.kv->n_tokens() + in.tokens.size());
            if (!st) in.error = st.message;
        }
    }
}

namespace cpu {
namespace {

using model::Tensor;
constexpr float kNegInf = -1e30f;   // ds4's "minus infinity" for compressor scores

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
float silu(float x) { return x * sigmoid(x); }
float softplus(float x) { return x > 20 ? x : (x < -20 ? std::exp(x) : std::log1p(std::exp(x))); }

// y = x / sqrt(mean(x^2) + eps) * w (w may be null). Sum of squares in double, as ds4's CPU.
void rms_norm(const float* x, float* y, uint32_t n, float eps, const float* w) {
    double ss = 0;
    for (uint32_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float r = float(1.0 / std::sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; ++i) y[i] = x[i] * r * (w ? w[i] : 1.0f);
}

// Float copy of a small vector tensor (norm weights, biases, sinks, ape).
std::vector<float> to_floats(const Tensor& t) {
    if (!t) return {};
    uint64_t n = 1;
    for (int i = 0; i < 4; ++i) n *= t.ne(i);
    std::vector<float> v(n);
    quant::dequantize_row(t.type(), t.data(), v.data(), n);
    return v;
}

// Per-layer small tensors converted once at load (they are read for every token).
struct LayerFloats {
    std::vector<float> hc_attn_scale, hc_attn_base, hc_ffn_scale, hc_ffn_base;
    std::vector<float> attn_norm, attn_q_a_norm, attn_kv_a_norm, attn_sinks;
    std::vector<float> comp_ape, comp_norm, icomp_ape, icomp_norm;
    std::vector<float> ffn_norm, exp_probs_b;
};

struct Row {
    uint32_t input;      // which StepInput
    uint64_t pos;        // absolute position
    int32_t token;
};

class CpuBackend final : public Backend {
public:
    CpuBackend(const model::Model& m, const BackendOptions& opt)
        : m_(m), c_(m.config), w_(m.weights), opt_(opt), pool_(opt.threads), rope_plain_(c_, false),
          rope_comp_(c_, true) {
        for (const auto& lw : w_.layers) {
            LayerFloats f;
            f.hc_attn_scale = to_floats(lw.hc_attn_scale);
            f.hc_attn_base = to_floats(lw.hc_attn_base);
            f.hc_ffn_scale = to_floats(lw.hc_ffn_scale);
            f.hc_ffn_base = to_floats(lw.hc_ffn_base);
            f.attn_norm = to_floats(lw.attn_norm);
            f.attn_q_a_norm = to_floats(lw.attn_q_a_norm);
            f.attn_kv_a_norm = to_floats(lw.attn_kv_a_norm);
            f.attn_sinks = to_floats(lw.attn_sinks);
            f.comp_ape = to_floats(lw.attn_compressor_ape);
            f.comp_norm = to_floats(lw.attn_compressor_norm);
            f.icomp_ape = to_floats(lw.indexer_compressor_ape);
            f.icomp_norm = to_floats(lw.indexer_compressor_norm);
            f.ffn_norm = to_floats(lw.ffn_norm);
            f.exp_probs_b = to_floats(lw.exp_probs_b);
            lf_.push_back(std::move(f));
        }
        out_hc_base_ = to_floats(w_.output_hc_base);
        out_hc_scale_ = to_floats(w_.output_hc_scale);
        out_norm_ = to_floats(w_.output_norm);
        for (uint32_t il = 0; il < c_.n_layer; ++il) {
            const auto* tid = w_.layers[il].ffn_gate_tid2eid.info;
            if (tid && tid->type != uint32_t(quant::Type::I32)) fail("ffn_gate_tid2eid must be I32");
        }
    }

    std::string name() const override { return "cpu"; }
    const model::Config& config() const override { return c_; }
    const BackendOptions& options() const override { return opt_; }
    kv::RegionFactory region_factory() override { return kv::host_region_factory(); }

    void forward(std::span<StepInput> inputs) override;

private:
    // ---- building blocks --------------------------------------------------------------
    // y[r][n] = W · x[r] for rows r < R; W is [ne0 = K, ne1 >= row0 + N] (rows row0..row0+N).
    void matmul(const Tensor& W, const float* x, uint64_t x_stride, uint32_t R, float* y, uint64_t y_stride,
                uint64_t N, uint64_t row0 = 0);
    // Activations of R rows of width K in W's dot-product format, into act_ (reused).
    const uint8_t* quantize_rows(quant::Type t, const float* x, uint64_t x_stride, uint32_t R, uint64_t K);
    void quantize_rows_into(quant::Type t, const float* x, uint64_t x_stride, uint32_t R, uint64_t K, uint8_t* out);

    void hc_pre(const float* X, const Tensor& fn, const float* scale, const float* base, float* x_sub, float* post,
                float* comb);
    void hc_post(float* X, const float* y, const float* post, const float* comb);

    void attention_layer(uint32_t il);
    void compressor_step(uint32_t il, kv::SessionKV& kv, bool indexer, const float* kvp, const float* scp, uint64_t pos);
    void attend(uint32_t il, uint32_t r);
    void ffn_layer(uint32_t il);
    void output_head(std::span<StepInput> inputs);

    void ensure(std::vector<float>& v, size_t n) {
        if (v.size() < n) v.resize(n);
    }

    const model::Model& m_;
    const model::Config& c_;
    const model::Weights& w_;
    BackendOptions opt_;
    ThreadPool pool_;
    Rope rope_plain_, rope_comp_;
    std::vector<LayerFloats> lf_;
    std::vector<float> out_hc_base_, out_hc_scale_, out_norm_;

    // The current batch (one round of forward()).
    std::vector<Row> rows_;
    std::vector<kv::SessionKV*> kv_of_input_;
    // Workspace, sized to the largest batch seen; never shrunk (no allocation in steady decode).
    std::vector<float> X_, x_sub_, xn_, post_, comb_, qr_, q_, kvr_, ckv_, csc_, ikv_, isc_, qi_, wi_, o_, low_,
        y_, rlog_, gate_, up_, mid_, down_, shg_, shu_, cs_;
    std::vector<uint8_t> act_;
    std::vector<std::vector<float>> scratch_;      // per thread: attention scores, indexer scores
    std::vector<size_t> done_;                     // per input: tokens evaluated so far in this call
    std::vector<uint64_t> first_pos_;             // per input: its first position in this call
    std::vector<uint32_t> want_;                   // rows that produce logits
    std::vector<float> greedy_row_;                // logits of a greedy-only row
    std::vector<int32_t> experts_;                 // [R][n_used]
    std::vector<uint32_t> order_, active_;         // router ordering, experts used this step
    std::vector<std::vector<uint32_t>> pairs_of_;  // per expert: (row, slot) pairs routed to it
    std::vector<uint8_t> xq_, xqu_, midq_;         // expert activations in their dot formats
    std::vector<float> expert_w_;                  // [R][n_used]
};

const uint8_t* CpuBackend::quantize_rows(quant::Type t, const float* x, uint64_t x_stride, uint32_t R, uint64_t K) {
    const size_t ab = quant::act_bytes(t, K);
    if (act_.size() < ab * R) act_.resize(ab * R);
    quantize_rows_into(t, x, x_stride, R, K, act_.data());
    return act_.data();
}

// Each row's activation codes on its own (rows are independent: the same bytes whatever the
// split), over the pool for a prompt's many rows: done on one thread they were ~12 % of a
// 2-core prefill's time (perf, small model, 2,048 tokens).
void CpuBackend::quantize_rows_into(quant::Type t, const float* x, uint64_t x_stride, uint32_t R, uint64_t K,
                                    uint8_t* out) {
    const size_t ab = quant::act_bytes(t, K);
    pool_.parallel_for(
        R,
        [&](uint64_t a, uint64_t b) {
            for (uint64_t r = a; r < b; ++r) quant::quantize_act(t, x + r * x_stride, out + r * ab, K);
        },
        std::max<uint64_t>(1, 16384 / std::max<uint64_t>(K, 1)));
}

// store(i, vec_dot(t, w, act_of(i), K)) for i in [0, n), by quant::vec_dot_many (the row's
// decoding shared by the activations, the same bits); its arrays are the calling thread's.
template <typename ActOf, typename Store>
void dots_of_row(quant::Type t, const uint8_t* w, uint64_t K, size_t n, ActOf&& act_of, Store&& store) {
    thread_local std::vector<const void*> acts;
    thread_local std::vector<float> out;
    thread_local std::vector<uint8_t> scratch;
    acts.resize(n);
    out.resize(n);
    for (size_t i = 0; i < n; ++i) acts[i] = act_of(i);
    quant::vec_dot_many(t, w, acts.data(), n, K, out.data(), scratch);
    for (size_t i = 0; i < n; ++i) store(i, out[i]);
}

void CpuBackend::matmul(const Tensor& W, const float* x, uint64_t x_stride, uint32_t R, float* y, uint64_t y_stride,
                        uint64_t N, uint64_t row0) {
    const quant::Type t = W.type();
    const uint64_t K = W.ne(0);
    const uint8_t* act = quantize_rows(t, x, x_stride, R, K);
    const size_t ab = quant::act_bytes(t, K);
    const size_t rb = W.row_bytes();
    const uint8_t* base = W.data() + row0 * rb;
    pool_.parallel_for(
        N,
        [&](uint64_t a, uint64_t b) {
            for (uint64_t n = a; n < b; ++n)
                dots_of_row(
                    t, base + n * rb, K, R, [&](size_t r) { return act + r * ab; },
                    [&](size_t r, float v) { y[r * y_stride + n] = v; });
        },
        16);
}

// mHC pre (§5.5): collapse the n_hc streams of one token into the sublayer input and keep
// the post gates and the Sinkhorn-normalised combination matrix for hc_post.
void CpuBackend::hc_pre(const float* X, const Tensor& fn, const float* scale, const float* base, float* x_sub,
                        float* post, float* comb) {
    const uint32_t H = c_.n_hc, E = c_.n_embd, HD = c_.hc_dim(), M = c_.hc_mix();
    const float eps = c_.hc_eps;
    std::vector<float>& s = scratch_[0];
    ensure(s, HD + M);
    float* flat = s.data();
    float* mix = flat + HD;
    rms_norm(X, flat, HD, c_.rms_eps, nullptr);
    for (uint32_t k = 0; k < M; ++k) {
        // Tiny (24-row) product: done serially, from the row's own format.
        const size_t ab = quant::act_bytes(fn.type(), HD);
        if (act_.size() < ab) act_.resize(ab);
        if (k == 0) quant::quantize_act(fn.type(), flat, act_.data(), HD);
        mix[k] = quant::vec_dot(fn.type(), fn.row(k), act_.data(), HD);
    }
    float pre[16];
    for (uint32_t i = 0; i < H; ++i) {
        pre[i] = sigmoid(mix[i] * scale[0] + base[i]) + eps;
        post[i] = 2.0f * sigmoid(mix[H + i] * scale[1] + base[H + i]);
    }
    float* C = comb;
    for (uint32_t r = 0; r < H; ++r) {
        float mx = -INFINITY;
        for (uint32_t cc = 0; cc < H; ++cc) {
            C[r * H + cc] = mix[2 * H + r * H + cc] * scale[2] + base[2 * H + r * H + cc];
            mx = std::max(mx, C[r * H + cc]);
        }
        float sum = 0;
        for (uint32_t cc = 0; cc < H; ++cc) sum += (C[r * H + cc] = std::exp(C[r * H + cc] - mx));
        for (uint32_t cc = 0; cc < H; ++cc) C[r * H + cc] = C[r * H + cc] / sum + eps;
    }
    auto col_norm = [&] {
        for (uint32_t cc = 0; cc < H; ++cc) {
            float sum = 0;
            for (uint32_t r = 0; r < H; ++r) sum += C[r * H + cc];
            for (uint32_t r = 0; r < H; ++r) C[r * H + cc] /= (sum + eps);
        }
    };
    auto row_norm = [&] {
        for (uint32_t r = 0; r < H; ++r) {
            float sum = 0;
            for (uint32_t cc = 0; cc < H; ++cc) sum += C[r * H + cc];
            for (uint32_t cc = 0; cc < H; ++cc) C[r * H + cc] /= (sum + eps);
        }
    };
    col_norm();
    for (uint32_t it = 1; it < c_.n_sinkhorn_iter; ++it) {
        row_norm();
        col_norm();
    }
    for (uint32_t e = 0; e < E; ++e) {
        float acc = 0;
        for (uint32_t h = 0; h < H; ++h) acc += pre[h] * X[h * E + e];
        x_sub[e] = acc;
    }
}

// mHC post (§5.6): X'[j] = post[j]·y + Σ_i C[i][j]·X[i], with X the residual that entered hc_pre.
void CpuBackend::hc_post(float* X, const float* y, const float* post, const float* comb) {
    const uint32_t H = c_.n_hc, E = c_.n_embd;
    for (uint32_t e = 0; e < E; ++e) {
        float in[16];
        for (uint32_t i = 0; i < H; ++i) in[i] = X[i * E + e];
        for (uint32_t j = 0; j < H; ++j) {
            float acc = post[j] * y[e];
            for (uint32_t i = 0; i < H; ++i) acc += comb[i * H + j] * in[i];
            X[j * E + e] = acc;
        }
    }
}

// One token's step of a compressor (§5.9, §5.10): store its projections in the state, and
// when it completes a group, pool the group into one compressed row.
void CpuBackend::compressor_step(uint32_t il, kv::SessionKV& kv, bool indexer, const float* kvp, const float* scp,
                                 uint64_t pos) {
    const uint32_t ratio = c_.ratio(il);
    const uint32_t D = indexer ? c_.indexer_head_dim : c_.head_dim;
    const uint32_t coff = ratio == 4 ? 2 : 1;
    const uint32_t width = coff * D;
    const LayerFloats& f = lf_[il];
    const float* ape = indexer ? f.icomp_ape.data() : f.comp_ape.data();
    float* skv = indexer ? kv.istate_kv(il) : kv.state_kv(il);
    float* ssc = indexer ? kv.istate_score(il) : kv.state_score(il);

    const uint32_t ph = uint32_t(pos % ratio);
    const uint32_t slot = ratio == 4 ? 4 + ph : ph;
    std::memcpy(skv + uint64_t(slot) * width, kvp, width * sizeof(float));
    for (uint32_t d = 0; d < width; ++d) ssc[uint64_t(slot) * width + d] = scp[d] + ape[uint64_t(ph) * width + d];
    if ((pos + 1) % ratio != 0) return;

    // Pool: per dimension, a softmax over the candidates' scores weights their values.
    // Ratio 4 pools 8 candidates: the previous group's first halves and this group's
    // second halves; ratio 128 pools the group's 128 tokens.
    std::vector<float>& tmp = scratch_[0];
    ensure(tmp, 2 * D);
    float* pooled = tmp.data();
    float* row = pooled + D;
    for (uint32_t d = 0; d < D; ++d) {
        float mx = kNegInf;
        auto cand = [&](auto&& fn) {
            if (ratio == 4) {
                for (uint32_t k = 0; k < 4; ++k) fn(skv[k * width + d], ssc[k * width + d]);
                for (uint32_t k = 4; k < 8; ++k) fn(skv[k * width + D + d], ssc[k * width + D + d]);
            } else {
                for (uint32_t k = 0; k < ratio; ++k) fn(skv[k * width + d], ssc[k * width + d]);
            }
        };
        cand([&](float, float s) { mx = std::max(mx, s); });
        float den = 0, num = 0;
        if (mx > kNegInf * 0.5f)
            cand([&](float v, float s) {
                if (s <= kNegInf * 0.5f) return;   // an empty slot: weight 0
                const float e = std::exp(s - mx);
                den += e;
                num += e * v;
            });
        pooled[d] = den > 0 ? num / den : 0.0f;
    }
    rms_norm(pooled, row, D, c_.rms_eps, indexer ? f.icomp_norm.data() : f.comp_norm.data());
    const uint64_t c = pos / ratio;
    rope_comp_.apply(row, D, c * ratio);
    if (opt_.numerics == Numerics::Official) {
        if (indexer) {
            hadamard(row, D);
            fp4_sim(row, D);
        } else {
            fp8_sim(row, c_.n_nope());
        }
    }
    std::memcpy(indexer ? kv.index_row(il, c) : kv.comp_row(il, c), row, D * sizeof(float));
    if (ratio == 4) {   // the current group becomes the previous one
        std::memcpy(skv, skv + 4 * width, 4 * width * sizeof(float));
        std::memcpy(ssc, ssc + 4 * width, 4 * width * sizeof(float));
    }
}

// §5.7: the attention sublayer for every row of the batch.
void CpuBackend::attention_layer(uint32_t il) {
    const auto& lw = w_.layers[il];
    const LayerFloats& f = lf_[il];
    const uint32_t R = uint32_t(rows_.size());
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, D = c_.head_dim, QL = c_.q_lora_rank;
    const uint32_t ratio = c_.ratio(il);
    const Rope& rope = ratio ? rope_comp_ : rope_plain_;

    for (uint32_t r = 0; r < R; ++r) {
        hc_pre(&X_[uint64_t(r) * HD], lw.hc_attn_fn, f.hc_attn_scale.data(), f.hc_attn_base.data(),
               &x_sub_[uint64_t(r) * E], &post_[r * H], &comb_[r * H * H]);
        rms_norm(&x_sub_[uint64_t(r) * E], &xn_[uint64_t(r) * E], E, c_.rms_eps, f.attn_norm.data());
        rope.cos_sin(rows_[r].pos, &cs_[uint64_t(r) * c_.n_rot]);
    }
    // ---- Q path
    matmul(lw.attn_q_a, xn_.data(), E, R, qr_.data(), QL, QL);
    for (uint32_t r = 0; r < R; ++r)
        rms_norm(&qr_[uint64_t(r) * QL], &qr_[uint64_t(r) * QL], QL, c_.rms_eps, f.attn_q_a_norm.data());
    matmul(lw.attn_q_b, qr_.data(), QL, R, q_.data(), c_.q_dim(), c_.q_dim());
    pool_.parallel_for(uint64_t(R) * c_.n_head, [&](uint64_t a, uint64_t b) {
        for (uint64_t i = a; i < b; ++i) {
            float* qh = &q_[i * D];
            rms_norm(qh, qh, D, c_.rms_eps, nullptr);
            rope.apply_cs(qh, D, &cs_[(i / c_.n_head) * c_.n_rot]);
        }
    });
    // ---- KV path: one latent row per token, written to the raw window ring
    matmul(lw.attn_kv, xn_.data(), E, R, kvr_.data(), D, D);
    for (uint32_t r = 0; r < R; ++r) {
        float* kv = &kvr_[uint64_t(r) * D];
        rms_norm(kv, kv, D, c_.rms_eps, f.attn_kv_a_norm.data());
        rope.apply_cs(kv, D, &cs_[uint64_t(r) * c_.n_rot]);
        if (opt_.numerics == Numerics::Official) {
            fp8_sim(kv, c_.n_nope());
            for (uint32_t d = 0; d < D; ++d) kv[d] = quant::f16_round(kv[d]);
        }
        std::memcpy(kv_of_input_[rows_[r].input]->raw_row(il, rows_[r].pos), kv, D * sizeof(float));
    }
    // ---- compressors: projections for all rows at once, then the per-token state machine
    if (ratio != 0) {
        const uint32_t W = c_.coff(il) * D;
        matmul(lw.attn_compressor_kv, xn_.data(), E, R, ckv_.data(), W, W);
        matmul(lw.attn_compressor_gate, xn_.data(), E, R, csc_.data(), W, W);
        for (uint32_t r = 0; r < R; ++r)
            compressor_step(il, *kv_of_input_[rows_[r].input], false, &ckv_[uint64_t(r) * W], &csc_[uint64_t(r) * W],
                            rows_[r].pos);
    }
    if (ratio == 4) {
        const uint32_t Wi = 2 * c_.indexer_head_dim;
        matmul(lw.indexer_compressor_kv, xn_.data(), E, R, ikv_.data(), Wi, Wi);
        matmul(lw.indexer_compressor_gate, xn_.data(), E, R, isc_.data(), Wi, Wi);
        for (uint32_t r = 0; r < R; ++r)
            compressor_step(il, *kv_of_input_[rows_[r].input], true, &ikv_[uint64_t(r) * Wi], &isc_[uint64_t(r) * Wi],
                            rows_[r].pos);
        // Indexer queries and head weights (used only when selection is needed).
        matmul(lw.indexer_attn_q_b, qr_.data(), QL, R, qi_.data(), c_.indexer_q_dim(), c_.indexer_q_dim());
        matmul(lw.indexer_proj, xn_.data(), E, R, wi_.data(), c_.n_indexer_head, c_.n_indexer_head);
        const float wscale = float(1.0 / std::sqrt(double(c_.indexer_head_dim) * c_.n_indexer_head));
        for (uint32_t r = 0; r < R; ++r) {
            for (uint32_t h = 0; h < c_.n_indexer_head; ++h) {
                float* qh = &qi_[(uint64_t(r) * c_.n_indexer_head + h) * c_.indexer_head_dim];
                rope.apply_cs(qh, c_.indexer_head_dim, &cs_[uint64_t(r) * c_.n_rot]);
                if (opt_.numerics == Numerics::Official) {
                    hadamard(qh, c_.indexer_head_dim);
                    fp4_sim(qh, c_.indexer_head_dim);
                }
            }
            for (uint32_t h = 0; h < c_.n_indexer_head; ++h) wi_[uint64_t(r) * c_.n_indexer_head + h] *= wscale;
        }
    }
    // ---- attention core, per (row): every head shares the row's key/value set
    pool_.parallel_for(R, [&](uint64_t a, uint64_t b) {
        for (uint64_t r = a; r < b; ++r) attend(il, uint32_t(r));
    });
    // ---- grouped low-rank output projection
    const uint32_t G = c_.n_out_group, OL = c_.o_lora_rank, GD = c_.group_dim();
    for (uint32_t g = 0; g < G; ++g)
        matmul(lw.attn_output_a, &o_[uint64_t(g) * GD], c_.q_dim(), R, &low_[uint64_t(g) * OL], uint64_t(G) * OL, OL,
               uint64_t(g) * OL);
    matmul(lw.attn_output_b, low_.data(), uint64_t(G) * OL, R, y_.data(), E, E);
    for (uint32_t r = 0; r < R; ++r)
        hc_post(&X_[uint64_t(r) * HD], &y_[uint64_t(r) * E], &post_[r * H], &comb_[r * H * H]);
}

// Sink attention (§5.12) of one row over its raw window plus its visible (or selected)
// compressed rows; K = V. Runs on a pool thread: uses that thread's scratch only.
void CpuBackend::attend(uint32_t il, uint32_t r) {
    const Row& row = rows_[r];
    kv::SessionKV& kv = *kv_of_input_[row.input];
    const LayerFloats& f = lf_[il];
    const uint32_t D = c_.head_dim, ratio = c_.ratio(il);
    const Rope& rope = ratio ? rope_comp_ : rope_plain_;
    const uint64_t p = row.pos;
    const uint64_t lo = p + 1 >= c_.n_swa ? p + 1 - c_.n_swa : 0;
    const uint64_t n_vis = ratio ? (p + 1) / ratio : 0;

    // Per-row scratch: scores for n_raw + n_vis keys and, for the indexer, n_vis scores.
    thread_local std::vector<float> sc;
    thread_local std::vector<uint32_t> sel;
    thread_local std::vector<const float*> keys;
    keys.clear();
    for (uint64_t q = lo; q <= p; ++q) keys.push_back(kv.raw_row(il, q));
    if (ratio == 128 || (ratio == 4 && n_vis <= c_.indexer_top_k)) {
        for (uint64_t cr = 0; cr < n_vis; ++cr) keys.push_back(kv.comp_row(il, cr));
    } else if (ratio == 4) {
        // Lightning indexer (§5.11): score every visible row, keep the top_k (ties: lower index).
        const uint32_t NH = c_.n_indexer_head, DI = c_.indexer_head_dim;
        if (sc.size() < n_vis) sc.resize(n_vis);
        const float* qi = &qi_[uint64_t(r) * NH * DI];
        const float* wi = &wi_[uint64_t(r) * NH];
        for (uint64_t cr = 0; cr < n_vis; ++cr) {
            const float* k = kv.index_row(il, cr);
            float s = 0;
            uint32_t h = 0;
            // four heads' dots side by side (independent chains, each in d order: the same sums
            // as one at a time), then added into s in head order
            for (; h + 4 <= NH; h += 4) {
                const float *q0 = qi + h * DI, *q1 = q0 + DI, *q2 = q1 + DI, *q3 = q2 + DI;
                float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
                for (uint32_t d = 0; d < DI; ++d) {
                    const float kd = k[d];
                    d0 += q0[d] * kd;
                    d1 += q1[d] * kd;
                    d2 += q2[d] * kd;
                    d3 += q3[d] * kd;
                }
                s += std::max(0.0f, d0) * wi[h];
                s += std::max(0.0f, d1) * wi[h + 1];
                s += std::max(0.0f, d2) * wi[h + 2];
                s += std::max(0.0f, d3) * wi[h + 3];
            }
            for (; h < NH; ++h) {
                float dot = 0;
                for (uint32_t d = 0; d < DI; ++d) dot += qi[h * DI + d] * k[d];
                s += std::max(0.0f, dot) * wi[h];
            }
            sc[cr] = s;
        }
        sel.resize(n_vis);
        std::iota(sel.begin(), sel.end(), 0u);
        const uint32_t K = c_.indexer_top_k;
        std::partial_sort(sel.begin(), sel.begin() + K, sel.end(), [&](uint32_t a, uint32_t b) {
            return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
        });
        sel.resize(K);
        std::sort(sel.begin(), sel.end());
        for (uint32_t cr : sel) keys.push_back(kv.comp_row(il, cr));
    }
    const uint64_t NK = keys.size();
    if (sc.size() < NK) sc.resize(NK);
    const float scale = float(1.0 / std::sqrt(double(D)));
    for (uint32_t h = 0; h < c_.n_head; ++h) {
        const float* qh = &q_[(uint64_t(r) * c_.n_head + h) * D];
        float mx = f.attn_sinks[h];
        // the scores four keys at a time (independent chains, each in d order: the same sums as
        // one key at a time; one chain at a time they were latency-bound), the max in key order
        uint64_t j = 0;
        for (; j + 4 <= NK; j += 4) {
            const float *k0 = keys[j], *k1 = keys[j + 1], *k2 = keys[j + 2], *k3 = keys[j + 3];
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (uint32_t d = 0; d < D; ++d) {
                const float qd = qh[d];
                s0 += qd * k0[d];
                s1 += qd * k1[d];
                s2 += qd * k2[d];
                s3 += qd * k3[d];
            }
            sc[j] = s0 * scale;
            sc[j + 1] = s1 * scale;
            sc[j + 2] = s2 * scale;
            sc[j + 3] = s3 * scale;
        }
        for (; j < NK; ++j) {
            float s = 0;
            const float* k = keys[j];
            for (uint32_t d = 0; d < D; ++d) s += qh[d] * k[d];
            sc[j] = s * scale;
        }
        for (j = 0; j < NK; ++j) mx = std::max(mx, sc[j]);
        float den = std::exp(f.attn_sinks[h] - mx);
        float* oh = &o_[(uint64_t(r) * c_.n_head + h) * D];
        std::fill(oh, oh + D, 0.0f);
        for (uint64_t j = 0; j < NK; ++j) {
            const float e = std::exp(sc[j] - mx);
            den += e;
            const float* k = keys[j];
            for (uint32_t d = 0; d < D; ++d) oh[d] += e * k[d];
        }
        const float inv = 1.0f / den;
        for (uint32_t d = 0; d < D; ++d) oh[d] *= inv;
        rope.apply_cs(oh, D, &cs_[uint64_t(r) * c_.n_rot], /*inverse=*/true);
    }
}

// §5.13: the MoE sublayer for every row.
void CpuBackend::ffn_layer(uint32_t il) {
    const auto& lw = w_.layers[il];
    const LayerFloats& f = lf_[il];
    const uint32_t R = uint32_t(rows_.size());
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, F = c_.n_ff_exp, K = c_.n_expert_used;
    const uint32_t NE = c_.n_expert;

    for (uint32_t r = 0; r < R; ++r) {
        hc_pre(&X_[uint64_t(r) * HD], lw.hc_ffn_fn, f.hc_ffn_scale.data(), f.hc_ffn_base.data(),
               &x_sub_[uint64_t(r) * E], &post_[r * H], &comb_[r * H * H]);
        rms_norm(&x_sub_[uint64_t(r) * E], &xn_[uint64_t(r) * E], E, c_.rms_eps, f.ffn_norm.data());
    }
    // Router: sqrt(softplus(logit)) scores; the bias only steers selection.
    matmul(lw.ffn_gate_inp, xn_.data(), E, R, rlog_.data(), NE, NE);
    const int32_t* tid2eid = lw.ffn_gate_tid2eid ? reinterpret_cast<const int32_t*>(lw.ffn_gate_tid2eid.data()) : nullptr;
    std::vector<uint32_t>& order = order_;
    order.resize(NE);
    for (uint32_t r = 0; r < R; ++r) {
        float* prob = &rlog_[uint64_t(r) * NE];
        for (uint32_t e = 0; e < NE; ++e) prob[e] = std::sqrt(softplus(prob[e]));
        int32_t* sel = &experts_[uint64_t(r) * K];
        if (c_.is_hash_layer(il)) {
            for (uint32_t k = 0; k < K; ++k) {
                const int32_t e = tid2eid[uint64_t(rows_[r].token) * K + k];
                if (e < 0 || uint32_t(e) >= NE)
                    fail("layer ", il, ": ffn_gate_tid2eid maps token ", rows_[r].token, " to expert ", e,
                         ", outside [0, ", NE, ")");
                sel[k] = e;
            }
        } else {
            std::iota(order.begin(), order.end(), 0u);
            const float* bias = f.exp_probs_b.empty() ? nullptr : f.exp_probs_b.data();
            auto key = [&](uint32_t e) { return prob[e] + (bias ? bias[e] : 0.0f); };
            std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](uint32_t a, uint32_t b) {
                const float ka = key(a), kb = key(b);
                return ka > kb || (ka == kb && a < b);
            });
            for (uint32_t k = 0; k < K; ++k) sel[k] = int32_t(order[k]);
        }
        float sum = 0;
        for (uint32_t k = 0; k < K; ++k) sum += prob[sel[k]];
        const float norm = c_.expert_weights_norm ? 1.0f / std::max(sum, 6.103515625e-5f) : 1.0f;
        for (uint32_t k = 0; k < K; ++k) expert_w_[uint64_t(r) * K + k] = prob[sel[k]] * norm * c_.expert_weights_scale;
    }

    // Routed experts, grouped by expert so each expert's rows are read once per step.
    std::vector<std::vector<uint32_t>>& pairs_of = pairs_of_;   // pair = r * K + k
    pairs_of.resize(NE);
    for (auto& p : pairs_of) p.clear();   // keeps capacity: no allocation in steady decode
    for (uint32_t r = 0; r < R; ++r)
        for (uint32_t k = 0; k < K; ++k) pairs_of[uint32_t(experts_[uint64_t(r) * K + k])].push_back(r * K + k);
    const quant::Type tg = lw.ffn_gate_exps.type(), tu = lw.ffn_up_exps.type(), td = lw.ffn_down_exps.type();
    const size_t abg = quant::act_bytes(tg, E);
    // xf in the experts' activation format, once per row.
    std::vector<uint8_t>& xq = xq_;
    if (xq.size() < abg * R) xq.resize(abg * R);
    quantize_rows_into(tg, xn_.data(), E, R, E, xq.data());
    std::vector<uint8_t>& xqu = xqu_;
    const uint8_t* xup = xq.data();
    if (quant::traits(tu).vec_dot_type != quant::traits(tg).vec_dot_type) {
        if (xqu.size() < quant::act_bytes(tu, E) * R) xqu.resize(quant::act_bytes(tu, E) * R);
        quantize_rows_into(tu, xn_.data(), E, R, E, xqu.data());
        xup = xqu.data();
    }
    const size_t abu = quant::act_bytes(tu, E);
    std::vector<uint32_t>& active = active_;
    active.clear();
    for (uint32_t e = 0; e < NE; ++e)
        if (!pairs_of[e].empty()) active.push_back(e);
    const size_t rbg = lw.ffn_gate_exps.row_bytes(), rbu = lw.ffn_up_exps.row_bytes(), rbd = lw.ffn_down_exps.row_bytes();
    pool_.parallel_for(uint64_t(active.size()) * F, [&](uint64_t a, uint64_t b) {
        for (uint64_t i = a; i < b; ++i) {
            const uint32_t e = active[i / F], n = uint32_t(i % F);
            const uint8_t* gr = lw.ffn_gate_exps.data() + (uint64_t(e) * F + n) * rbg;
            const uint8_t* ur = lw.ffn_up_exps.data() + (uint64_t(e) * F + n) * rbu;
            const std::vector<uint32_t>& prs = pairs_of[e];
            dots_of_row(
                tg, gr, E, prs.size(), [&](size_t j) { return xq.data() + (prs[j] / K) * abg; },
                [&](size_t j, float v) { gate_[uint64_t(prs[j]) * F + n] = v; });
            dots_of_row(
                tu, ur, E, prs.size(), [&](size_t j) { return xup + (prs[j] / K) * abu; },
                [&](size_t j, float v) { up_[uint64_t(prs[j]) * F + n] = v; });
        }
    }, 8);
    const float clamp = c_.swiglu_clamp_exp[il];
    const size_t abd = quant::act_bytes(td, F);
    std::vector<uint8_t>& midq = midq_;
    if (midq.size() < abd * R * K) midq.resize(abd * R * K);
    // (each pair on its own: over the pool for a prompt's many pairs)
    pool_.parallel_for(
        uint64_t(R) * K,
        [&](uint64_t a, uint64_t b) {
            for (uint64_t pr = a; pr < b; ++pr) {
                const float* g = &gate_[pr * F];
                const float* u = &up_[pr * F];
                float* mid = &mid_[pr * F];
                const float wk = expert_w_[pr];
                for (uint32_t n = 0; n < F; ++n) {
                    float gv = g[n], uv = u[n];
                    if (clamp > 1e-6f) {
                        gv = std::min(gv, clamp);
                        uv = std::clamp(uv, -clamp, clamp);
                    }
                    mid[n] = silu(gv) * uv * wk;   // the router weight goes in before the down projection
                }
                quant::quantize_act(td, mid, midq.data() + pr * abd, F);
            }
        },
        std::max<uint64_t>(1, 8192 / std::max<uint32_t>(F, 1)));
    pool_.parallel_for(uint64_t(active.size()) * E, [&](uint64_t a, uint64_t b) {
        for (uint64_t i = a; i < b; ++i) {
            const uint32_t e = active[i / E], n = uint32_t(i % E);
            const uint8_t* dr = lw.ffn_down_exps.data() + (uint64_t(e) * E + n) * rbd;
            const std::vector<uint32_t>& prs = pairs_of[e];
            dots_of_row(
                td, dr, F, prs.size(), [&](size_t j) { return midq.data() + uint64_t(prs[j]) * abd; },
                [&](size_t j, float v) { down_[uint64_t(prs[j]) * E + n] = v; });
        }
    }, 8);
    // Shared expert: the same clamped SwiGLU with weight 1.
    const uint32_t FS = F * c_.n_expert_shared;
    if (FS) {
        matmul(lw.ffn_gate_shexp, xn_.data(), E, R, shg_.data(), FS, FS);
        matmul(lw.ffn_up_shexp, xn_.data(), E, R, shu_.data(), FS, FS);
        const float sclamp = c_.swiglu_clamp_shexp[il];
        for (uint64_t i = 0; i < uint64_t(R) * FS; ++i) {
            float gv = shg_[i], uv = shu_[i];
            if (sclamp > 1e-6f) {
                gv = std::min(gv, sclamp);
                uv = std::clamp(uv, -sclamp, sclamp);
            }
            shg_[i] = silu(gv) * uv;
        }
        matmul(lw.ffn_down_shexp, shg_.data(), FS, R, y_.data(), E, E);
    } else {
        std::fill(y_.begin(), y_.begin() + uint64_t(R) * E, 0.0f);
    }
    // moe + shared, summed in a fixed order (slot 0..K-1, then shared): deterministic.
    for (uint32_t r = 0; r < R; ++r) {
        float* y = &y_[uint64_t(r) * E];
        for (uint32_t e = 0; e < E; ++e) {
            float acc = 0;
            for (uint32_t k = 0; k < K; ++k) acc += down_[(uint64_t(r) * K + k) * E + e];
            y[e] += acc;
        }
        hc_post(&X_[uint64_t(r) * HD], y, &post_[r * H], &comb_[r * H * H]);
    }
}

// §5.14: collapse the streams with sigmoid weights, normalise, project to the vocabulary.
void CpuBackend::output_head(std::span<StepInput> inputs) {
    const uint32_t R = uint32_t(rows_.size());
    const uint32_t E = c_.n_embd, HD = c_.hc_dim(), H = c_.n_hc, V = c_.n_vocab;
    // Rows that produce logits: every row of an all_logits input, else its final token.
    std::vector<uint32_t>& want = want_;
    want.clear();
    for (uint32_t r = 0; r < R; ++r) {
        const StepInput& in = inputs[rows_[r].input];
        const uint64_t first = first_pos_[rows_[r].input];
        if ((in.logits || in.greedy) && (in.all_logits || rows_[r].pos == first + in.tokens.size() - 1))
            want.push_back(r);
    }
    if (want.empty()) return;
    const uint32_t NW = uint32_t(want.size());
    ensure(x_sub_, uint64_t(NW) * E);
    std::vector<float>& s = scratch_[0];
    ensure(s, HD + 16);
    for (uint32_t i = 0; i < NW; ++i) {
        const float* X = &X_[uint64_t(want[i]) * HD];
        float* flat = s.data();
        rms_norm(X, flat, HD, c_.rms_eps, nullptr);
        const size_t ab = quant::act_bytes(w_.output_hc_fn.type(), HD);
        if (act_.size() < ab) act_.resize(ab);
        quant::quantize_act(w_.output_hc_fn.type(), flat, act_.data(), HD);
        float wgt[16];
        for (uint32_t h = 0; h < H; ++h) {
            const float pre = quant::vec_dot(w_.output_hc_fn.type(), w_.output_hc_fn.row(h), act_.data(), HD);
            wgt[h] = sigmoid(pre * out_hc_scale_[0] + out_hc_base_[h]) + c_.hc_eps;
        }
        float* x = &xn_[uint64_t(i) * E];
        for (uint32_t e = 0; e < E; ++e) {
            float acc = 0;
            for (uint32_t h = 0; h < H; ++h) acc += wgt[h] * X[h * E + e];
            x[e] = acc;
        }
        rms_norm(x, x, E, c_.rms_eps, out_norm_.data());
    }
    // Project in slices so a large vocabulary needs no [rows][vocab] temporary.
    for (uint32_t i = 0; i < NW; ++i) {
        const Row& row = rows_[want[i]];
        StepInput& in = inputs[row.input];
        const bool last = row.pos == first_pos_[row.input] + in.tokens.size() - 1;
        float* out = !in.logits       ? nullptr
                     : in.all_logits ? in.logits + (row.pos - first_pos_[row.input]) * V
                                     : in.logits;
        if (!out && !(in.greedy && last)) continue;
        if (!out) {   // greedy only: the row in scratch
            ensure(greedy_row_, V);
            out = greedy_row_.data();
        }
        matmul(w_.output, &xn_[uint64_t(i) * E], E, 1, out, V, V);
        if (in.greedy && last) {
            const int32_t ex = in.greedy_exclude;
            *in.greedy =
                argmax_excluding(std::span<const float>(out, V), std::span<const int32_t>(&ex, ex >= 0 ? 1 : 0));
        }
    }
}

void CpuBackend::forward(std::span<StepInput> inputs) {
    const uint32_t chunk = std::max<uint32_t>(1, opt_.prefill_chunk);
    admit_step(inputs, c_.n_vocab);
    const uint32_t HD = c_.hc_dim();
    // Rounds: each takes up to `chunk` tokens from every input (the raw ring holds the
    // window plus one chunk).
    std::vector<size_t>& done = done_;
    done.assign(inputs.size(), 0);
    first_pos_.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) first_pos_[i] = inputs[i].kv->n_tokens();
    for (;;) {
        rows_.clear();
        kv_of_input_.assign(inputs.size(), nullptr);
        for (size_t i = 0; i < inputs.size(); ++i) {
            StepInput& in = inputs[i];
            if (!in.error.empty()) continue;
            kv_of_input_[i] = in.kv;
            const size_t n = std::min<size_t>(chunk, in.tokens.size() - done[i]);
            for (size_t j = 0; j < n; ++j)
                rows_.push_back({uint32_t(i), in.kv->n_tokens() + j, in.tokens[done[i] + j]});
        }
        if (rows_.empty()) break;
        const uint64_t R = rows_.size();
        // The guard: nothing is written unless every row it touches is committed.
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (!kv_of_input_[i]) continue;
            const size_t n = std::min<size_t>(chunk, inputs[i].tokens.size() - done[i]);
            kv::Status st = inputs[i].kv->check(inputs[i].kv->n_tokens() + n);
            if (!st) fail("KV guard: ", st.message);
        }
        // Workspace for R rows.
        const uint32_t E = c_.n_embd, W = 2 * c_.head_dim, Wi = 2 * c_.indexer_head_dim;
        const uint32_t K = c_.n_expert_used, F = c_.n_ff_exp;
        ensure(X_, R * HD);
        ensure(x_sub_, R * E);
        ensure(xn_, R * E);
        ensure(post_, R * c_.n_hc);
        ensure(comb_, R * c_.n_hc * c_.n_hc);
        ensure(qr_, R * c_.q_lora_rank);
        ensure(q_, R * c_.q_dim());
        ensure(kvr_, R * c_.head_dim);
        ensure(ckv_, R * W);
        ensure(csc_, R * W);
        ensure(ikv_, R * Wi);
        ensure(isc_, R * Wi);
        ensure(qi_, R * c_.indexer_q_dim());
        ensure(wi_, R * c_.n_indexer_head);
        ensure(o_, R * c_.q_dim());
        ensure(low_, R * c_.n_out_group * c_.o_lora_rank);
        ensure(y_, R * E);
        ensure(rlog_, R * c_.n_expert);
        ensure(gate_, R * K * F);
        ensure(up_, R * K * F);
        ensure(mid_, R * K * F);
        ensure(down_, R * K * E);
        ensure(shg_, R * F * std::max(1u, c_.n_expert_shared));
        ensure(shu_, R * F * std::max(1u, c_.n_expert_shared));
        ensure(cs_, R * c_.n_rot);
        if (experts_.size() < R * K) experts_.resize(R * K);
        if (expert_w_.size() < R * K) expert_w_.resize(R * K);
        if (scratch_.empty()) scratch_.resize(1);

        // §5.3: the embedding, replicated into every stream.
        for (uint64_t r = 0; r < R; ++r) {
            float* X = &X_[r * HD];
            quant::dequantize_row(w_.token_embd.type(), w_.token_embd.row(uint64_t(rows_[r].token)), X, E);
            for (uint32_t h = 1; h < c_.n_hc; ++h) std::memcpy(X + h * E, X, E * sizeof(float));
        }
        for (uint32_t il = 0; il < c_.n_layer; ++il) {
            attention_layer(il);
            ffn_layer(il);
        }
        output_head(inputs);
        // The round's KV is written: advance each session.
        for (size_t i = 0; i < inputs.size(); ++i) {
            if (!kv_of_input_[i]) continue;
            done[i] += std::min<size_t>(chunk, inputs[i].tokens.size() - done[i]);
            inputs[i].kv->set_n_tokens(first_pos_[i] + done[i]);
        }
        bool more = false;
        for (size_t i = 0; i < inputs.size(); ++i)
            if (kv_of_input_[i] && done[i] < inputs[i].tokens.size()) more = true;
        if (!more) break;
    }
}

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const model::Model& m, const BackendOptions& opt) {
    BackendOptions o = opt;
    if (!o.prefill_chunk) o.prefill_chunk = kCpuPrefillChunk;
    return std::make_unique<cpu::CpuBackend>(m, o);
}

}  // namespace dsv4
