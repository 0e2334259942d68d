// Quantised weights against the same weights dequantised to F32 (issue: "compare with the
// same model dequantised to F32, with a tolerance you derive and justify").
//
// The only differences are the activation quantisations the quantised dot products use
// (model-spec §5.1): Q8_0 blocks of 32 for Q8_0/MXFP4 weights, Q8_K blocks of 256 for
// Q2_K/Q4_K/IQ2_XXS. Rounding to a step d = amax/127 leaves a uniform error of std
// d/sqrt(12) per element; with amax ~ 3-3.5x the block's rms that is ~0.7-0.8% of the rms.
// A dot product of random-sign terms inherits that relative error (errors and signal add
// in quadrature), and every quantised product on the path to the logits contributes an
// independent error of that size: ~9 per layer (q_a, q_b, kv, output a/b, experts
// gate/up/down, shared expert) times 6 layers plus the head, ~55 in all, giving
// 0.8% x sqrt(55) ~ 6% of the logit rms. We allow 10% for the relative RMS difference
// over all positions and the vocabulary, and check that it is not zero (the quantised
// path must really run), and that the bulk of argmaxes agree.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.h"

using namespace dsv4;

namespace {

// Rewrites a GGUF with every weight dequantised to F32 (metadata and I32 tables kept).
std::string dequantized_copy(const std::string& path) {
    auto f = gguf::File::open(path);
    gguf::Writer w(f->alignment());
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors()) {
        if (t.type == uint32_t(quant::Type::I32) || t.type == uint32_t(quant::Type::F32)) {
            w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
            continue;
        }
        const uint64_t n = t.n_elements();
        std::vector<float> v(n);
        const uint64_t ne0 = t.ne[0], rows = n / ne0;
        const size_t rb = quant::row_bytes(quant::Type(t.type), ne0);
        for (uint64_t r = 0; r < rows; ++r)
            quant::dequantize_row(quant::Type(t.type), t.data + r * rb, v.data() + r * ne0, ne0);
        std::vector<uint8_t> bytes(n * 4);
        std::memcpy(bytes.data(), v.data(), bytes.size());
        w.add_tensor(t.name, uint32_t(quant::Type::F32), t.ne, std::move(bytes));
    }
    const std::string out = path + ".f32.gguf";
    w.write(out);
    return out;
}

void compare_quantized(const std::string& mix) {
    // 256-wide so every tensor fits the 256-value blocks of the K-quants and IQ2_XXS.
    const std::string q = test::synth_model("quant-" + mix, "small", [](model::Config& c) {
        c.n_embd = 256;
        c.n_ff_exp = 256;
        c.q_lora_rank = 256;
    }, mix);
    const std::string f = dequantized_copy(q);
    auto eq = runtime::Engine::open(q, test::cpu_options(Numerics::Official));
    auto ef = runtime::Engine::open(f, test::cpu_options(Numerics::Official));
    const auto toks = test::random_tokens(300, 0, 256, 5);
    const auto a = test::all_logits(*eq, toks, 512), b = test::all_logits(*ef, toks, 512);
    const size_t V = eq->config().n_vocab;
    double d2 = 0, r2 = 0;
    size_t same = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d2 += double(a[i] - b[i]) * (a[i] - b[i]);
        r2 += double(b[i]) * b[i];
    }
    for (size_t p = 0; p < toks.size(); ++p) same += test::argmax(&a[p * V], V) == test::argmax(&b[p * V], V);
    const double rel = std::sqrt(d2 / r2);
    std::printf("[quantized %s] relative RMS difference vs dequantised F32: %.4f, argmax agreement %zu/%zu\n",
                mix.c_str(), rel, same, toks.size());
    EXPECT_GT(rel, 0.0) << "identical logits: the quantised dot products did not run";
    EXPECT_LT(rel, 0.10);
    EXPECT_GE(same, toks.size() * 8 / 10);
}

}  // namespace

TEST(Quantized, Q8_0MatchesDequantisedF32) { compare_quantized("q8_0"); }
TEST(Quantized, FlashMixIq2xxsQ2kMatchesDequantisedF32) { compare_quantized("flash"); }
TEST(Quantized, Q4kExpertsMatchDequantisedF32) { compare_quantized("q4k"); }
TEST(Quantized, Mxfp4ExpertsMatchDequantisedF32) { compare_quantized("mxfp4"); }
