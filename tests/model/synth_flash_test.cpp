// `synth flash --layers 2` must write what the shipped 2-bit Flash GGUF holds for its
// globals and first two layers: the table below is model-spec §2.3, typed in by hand.
#include <gtest/gtest.h>

#include <map>

#include "dsv4/model.h"

using namespace dsv4;
using quant::Type;

TEST(SynthFlash, TwoLayersMatchTheShipped2BitFileLayout) {
    const model::Config c = model::synth_config("flash", 2, 129280);
    const auto plan = model::synth_plan(c, model::TypeMix::preset("flash"));
    struct Want {
        std::vector<uint64_t> ne;
        Type type;
    };
    std::map<std::string, Want> want = {
        {"token_embd.weight", {{4096, 129280}, Type::F16}},
        {"output_hc_base.weight", {{4}, Type::F32}},
        {"output_hc_fn.weight", {{16384, 4}, Type::F16}},
        {"output_hc_scale.weight", {{1}, Type::F32}},
        {"output_norm.weight", {{4096}, Type::F32}},
        {"output.weight", {{4096, 129280}, Type::Q8_0}},
    };
    for (int L = 0; L < 2; ++L) {
        const std::string b = "blk." + std::to_string(L) + ".";
        std::map<std::string, Want> layer = {
            {"hc_attn_fn.weight", {{16384, 24}, Type::F16}},
            {"hc_attn_scale.weight", {{3}, Type::F32}},
            {"hc_attn_base.weight", {{24}, Type::F32}},
            {"attn_norm.weight", {{4096}, Type::F32}},
            {"attn_q_a.weight", {{4096, 1024}, Type::Q8_0}},
            {"attn_q_a_norm.weight", {{1024}, Type::F32}},
            {"attn_q_b.weight", {{1024, 32768}, Type::Q8_0}},
            {"attn_kv.weight", {{4096, 512}, Type::Q8_0}},
            {"attn_kv_a_norm.weight", {{512}, Type::F32}},
            {"attn_sinks.weight", {{64}, Type::F32}},
            {"attn_output_a.weight", {{4096, 8192}, Type::Q8_0}},
            {"attn_output_b.weight", {{8192, 4096}, Type::Q8_0}},
            {"hc_ffn_fn.weight", {{16384, 24}, Type::F16}},
            {"hc_ffn_scale.weight", {{3}, Type::F32}},
            {"hc_ffn_base.weight", {{24}, Type::F32}},
            {"ffn_norm.weight", {{4096}, Type::F32}},
            {"ffn_gate_inp.weight", {{4096, 256}, Type::F16}},
            {"ffn_gate_tid2eid.weight", {{6, 129280}, Type::I32}},   // layers 0-2 are hash-routed
            {"ffn_gate_exps.weight", {{4096, 2048, 256}, Type::IQ2_XXS}},
            {"ffn_up_exps.weight", {{4096, 2048, 256}, Type::IQ2_XXS}},
            {"ffn_down_exps.weight", {{2048, 4096, 256}, Type::Q2_K}},
            {"ffn_gate_shexp.weight", {{4096, 2048}, Type::Q8_0}},
            {"ffn_up_shexp.weight", {{4096, 2048}, Type::Q8_0}},
            {"ffn_down_shexp.weight", {{2048, 4096}, Type::Q8_0}},
        };
        for (auto& [k, v] : layer) want[b + k] = v;
    }
    EXPECT_EQ(plan.size(), want.size());
    for (const auto& p : plan) {
        auto it = want.find(p.name);
        ASSERT_NE(it, want.end()) << "synth writes an unexpected tensor " << p.name;
        EXPECT_EQ(p.ne, it->second.ne) << p.name;
        EXPECT_EQ(p.type, it->second.type) << p.name << ": " << quant::traits(p.type).name;
    }
    // The compressed layers of a deeper file carry the compressor and indexer (layer 2: ratio 4).
    const auto plan4 = model::synth_plan(model::synth_config("flash", 4, 129280), model::TypeMix::preset("flash"));
    std::map<std::string, model::PlannedTensor> by;
    for (const auto& p : plan4) by.emplace(p.name, p);
    EXPECT_EQ(by.at("blk.2.attn_compressor_ape.weight").ne, (std::vector<uint64_t>{1024, 4}));
    EXPECT_EQ(by.at("blk.3.attn_compressor_ape.weight").ne, (std::vector<uint64_t>{512, 128}));
    EXPECT_EQ(by.at("blk.2.indexer.attn_q_b.weight").ne, (std::vector<uint64_t>{1024, 8192}));
    EXPECT_EQ(by.at("blk.2.indexer.attn_q_b.weight").type, Type::F16);
    EXPECT_EQ(by.at("blk.2.indexer_compressor_ape.weight").ne, (std::vector<uint64_t>{256, 4}));
    EXPECT_EQ(by.at("blk.3.exp_probs_b.bias").type, Type::F32);
    EXPECT_EQ(by.count("blk.3.ffn_gate_tid2eid.weight"), 0u);
    EXPECT_EQ(by.count("blk.3.indexer.proj.weight"), 0u);
}

TEST(SynthConfig, RoundTripsThroughGguf) {
    model::Config c = model::synth_config("small", 0, 300);
    gguf::Writer w;
    c.to_gguf(w);
    const auto bytes = w.to_bytes();
    auto f = gguf::File::parse(bytes.data(), bytes.size(), "cfg");
    const model::Config d = model::Config::from_gguf(*f);
    EXPECT_EQ(d.n_layer, c.n_layer);
    EXPECT_EQ(d.compress_ratio, c.compress_ratio);
    EXPECT_EQ(d.indexer_top_k, c.indexer_top_k);
    EXPECT_EQ(d.rope_orig_ctx, c.rope_orig_ctx);
    EXPECT_FLOAT_EQ(d.compress_rope_freq_base, c.compress_rope_freq_base);
}

TEST(ModelErrors, PreciseMessages) {
    model::Config c = model::synth_config("tiny", 0, 300);
    auto check = [&](auto edit, const std::string& needle) {
        model::Config e = c;
        edit(e);
        gguf::Writer w;
        e.to_gguf(w);
        const auto bytes = w.to_bytes();
        auto f = gguf::File::parse(bytes.data(), bytes.size(), "bad.gguf");
        try {
            model::Config::from_gguf(*f);
            ADD_FAILURE() << "accepted: " << needle;
        } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
        }
    };
    check([](model::Config& e) { e.compress_ratio[2] = 8; }, "compress_ratios[2] = 8");
    check([](model::Config& e) { e.n_head_kv = 2; }, "head_count_kv");
    check([](model::Config& e) { e.n_out_group = 3; }, "output_group_count");
    check([](model::Config& e) { e.expert_gating_func = 2; }, "expert_gating_func");
    check([](model::Config& e) { e.indexer_head_dim = 48; }, "indexer.key_length");
    // A missing key names the key.
    gguf::Writer w;
    c.to_gguf(w);
    auto bytes = w.to_bytes();
    auto f = gguf::File::parse(bytes.data(), bytes.size(), "ok.gguf");
    gguf::Writer w2;
    for (const auto& [k, v] : f->metadata())
        if (k != "deepseek4.expert_count") w2.set(k, v);
    bytes = w2.to_bytes();
    auto g = gguf::File::parse(bytes.data(), bytes.size(), "missing.gguf");
    try {
        model::Config::from_gguf(*g);
        ADD_FAILURE();
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("deepseek4.expert_count"), std::string::npos) << err.what();
    }
}
