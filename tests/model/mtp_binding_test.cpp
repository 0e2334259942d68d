// The optional MTP block binds in both naming schemes: llama.cpp's extra blk.N block and
// ds4's mtp.0.* tensors.
#include <gtest/gtest.h>

#include "test_util.h"

using namespace dsv4;

TEST(MtpBinding, ExtraBlockSchemeFromSynth) {
    model::Vocab v = test::byte_vocab();
    model::Config c = model::synth_config("tiny", 0, uint32_t(v.tokens.size()));
    const std::string path = test::tmp_dir() + "/mtp-blk.gguf";
    model::synth_write(c, model::TypeMix::preset("f32"), v, 1, path, /*with_mtp=*/true);
    auto m = model::Model::load(path);
    EXPECT_EQ(m->config.n_layer, 4u);
    EXPECT_EQ(m->config.n_mtp, 1u);
    EXPECT_TRUE(m->weights.mtp.present);
    EXPECT_EQ(m->weights.mtp.scheme, "blk.4");
    EXPECT_TRUE(m->weights.mtp.e_proj);
    EXPECT_TRUE(m->weights.mtp.block.exp_probs_b);   // score-routed: bias required
}

TEST(MtpBinding, Mtp0SchemeRenamed) {
    // Rewrite the blk.4 block as mtp.0.* with block_count back to 4 (ds4's naming).
    const std::string src = test::tmp_dir() + "/mtp-blk2.gguf";
    model::Vocab v = test::byte_vocab();
    model::Config c = model::synth_config("tiny", 0, uint32_t(v.tokens.size()));
    model::synth_write(c, model::TypeMix::preset("f32"), v, 1, src, true);
    auto f = gguf::File::open(src);
    gguf::Writer w(f->alignment());
    for (const auto& [k, val] : f->metadata()) {
        if (k == "deepseek4.nextn_predict_layers") continue;
        w.set(k, k == "deepseek4.block_count" ? gguf::make_u32(4) : val);
    }
    for (const auto& t : f->tensors()) {
        std::string name = t.name;
        if (name.rfind("blk.4.", 0) == 0) name = "mtp.0." + name.substr(6);
        w.add_tensor(name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    const std::string path = test::tmp_dir() + "/mtp-0.gguf";
    w.write(path);
    auto m = model::Model::load(path);
    EXPECT_TRUE(m->weights.mtp.present);
    EXPECT_EQ(m->weights.mtp.scheme, "mtp.0");
    EXPECT_TRUE(m->weights.mtp.h_proj);
    // And the main model still runs with the MTP tensors present.
    auto e = runtime::Engine::open(path, test::cpu_options());
    auto s = e->new_session(64);
    s->eval(test::random_tokens(8, 0, 256));
    EXPECT_EQ(s->logits().size(), e->config().n_vocab);
}

TEST(WeightBinding, RejectsWrongShapesTypesAndStrangers) {
    const std::string src = test::synth_model("bind-src", "tiny");
    auto f = gguf::File::open(src);
    auto rewrite = [&](const std::string& name, auto edit) {
        gguf::Writer w(f->alignment());
        for (const auto& [k, val] : f->metadata()) w.set(k, val);
        for (const auto& t : f->tensors()) {
            std::string n = t.name;
            std::vector<uint64_t> ne = t.ne;
            uint32_t type = t.type;
            std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
            edit(n, ne, type, bytes);
            w.add_tensor(n, type, ne, std::move(bytes));
        }
        const std::string p = test::tmp_dir() + "/" + name + ".gguf";
        w.write(p);
        return p;
    };
    auto expect_error = [](const std::string& path, const std::string& needle) {
        try {
            model::Model::load(path);
            ADD_FAILURE() << "loaded " << path;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error(rewrite("bad-shape", [](std::string& n, std::vector<uint64_t>& ne, uint32_t&, std::vector<uint8_t>&) {
                     if (n == "blk.0.attn_q_a.weight") std::swap(ne[0], ne[1]);   // [64, 32] -> [32, 64]
                 }),
                 "blk.0.attn_q_a.weight");
    expect_error(rewrite("bad-type", [](std::string& n, std::vector<uint64_t>&, uint32_t& type, std::vector<uint8_t>& b) {
                     if (n == "blk.1.attn_norm.weight") {
                         type = uint32_t(quant::Type::I32);
                         (void)b;
                     }
                 }),
                 "blk.1.attn_norm.weight");
    expect_error(rewrite("stranger", [](std::string& n, std::vector<uint64_t>&, uint32_t&, std::vector<uint8_t>&) {
                     if (n == "blk.0.attn_sinks.weight") n = "blk.0.attn_sink_typo.weight";
                 }),
                 "attn_sink");
}
