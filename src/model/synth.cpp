// Random-weight DeepSeek V4 GGUFs of any shape and type mix (`dsv4 synth`).
// Every tensor of tensor_specs() is generated row by row from a seed derived from
// (seed, tensor name, row), so the output is deterministic whatever the thread count.
#include <algorithm>
#include <cmath>
#include <thread>

#include "dsv4/model.h"
#include "model/tensors.h"

namespace dsv4::model {

namespace {

uint64_t splitmix64(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t hash_name(const std::string& s, uint64_t seed) {
    uint64_t h = 1469598103934665603ull ^ seed;
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

// Uniform in [-1, 1).
float uniform(uint64_t& s) { return float(double(splitmix64(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

// The range a role's values are drawn from, chosen so that activations keep a realistic
// scale: matrices get std 1/sqrt(fan_in) (uniform in ±sqrt(3/fan_in)), norms sit near 1,
// biases and sinks are O(1) so the sigmoid/softmax gates are neither saturated nor flat.
struct Dist {
    float center = 0, half_width = 1;
};

Dist dist_for(const TensorSpec& s) {
    const float fan_in = float(s.ne[0]);
    const float mat = std::sqrt(3.0f / fan_in);
    switch (s.role) {
        case Role::Norm: return {1.0f, 0.2f};
        case Role::HcScale: return {0.75f, 0.25f};
        case Role::HcBase: return {0.0f, 1.0f};
        case Role::HcFn: return {0.0f, mat};
        case Role::Sinks: return {0.0f, 1.0f};
        case Role::Embedding: return {0.0f, 1.7f};
        case Role::CompressorApe: return {0.0f, 0.5f};
        case Role::RouterBias: return {0.0f, 0.1f};
        default: return {0.0f, mat};
    }
}

quant::Type type_for(const TensorSpec& s, const TypeMix& m) {
    switch (s.role) {
        case Role::Norm:
        case Role::HcScale:
        case Role::HcBase:
        case Role::Sinks:
        case Role::RouterBias: return quant::Type::F32;
        case Role::CompressorApe: return m.compressor == quant::Type::F32 ? quant::Type::F32 : quant::Type::F16;
        case Role::HashTable: return quant::Type::I32;
        case Role::HcFn: return m.hc_fn;
        case Role::Embedding: return m.embedding;
        case Role::Output: return m.output;
        case Role::AttnProj: return m.attn;
        case Role::CompressorW: return m.compressor;
        case Role::Router: return m.router;
        case Role::SharedExpert: return m.shared;
        case Role::ExpertGateUp: return m.gate_up;
        case Role::ExpertDown: return m.down;
        case Role::MtpProj: return m.mtp;
    }
    return quant::Type::F32;
}

// 2-bit expert formats are filled with random valid blocks: their quality-optimised
// quantisers are not worth writing for random weights, and the forward pass only needs
// valid blocks of a realistic magnitude.
bool random_blocks(quant::Type t) { return t == quant::Type::IQ2_XXS || t == quant::Type::Q2_K; }

void fill_rows(const TensorSpec& s, quant::Type t, uint64_t seed, uint8_t* dst, const Config& c) {
    const uint64_t ne0 = s.ne[0];
    uint64_t rows = 1;
    for (size_t i = 1; i < s.ne.size(); ++i) rows *= s.ne[i];
    const size_t rb = quant::row_bytes(t, ne0);
    const uint64_t name_seed = hash_name(s.name, seed);
    const Dist d = dist_for(s);

    auto work = [&](uint64_t r0, uint64_t r1) {
        std::vector<float> buf(ne0);
        for (uint64_t r = r0; r < r1; ++r) {
            uint64_t st = name_seed ^ (r * 0xD6E8FEB86659FD93ull);
            if (s.role == Role::HashTable) {
                // Row r = token r: n_used distinct experts (ne0 = n_expert_used).
                auto* out = reinterpret_cast<int32_t*>(dst + r * rb);
                std::vector<int32_t> perm(c.n_expert);
                for (uint32_t e = 0; e < c.n_expert; ++e) perm[e] = int32_t(e);
                for (uint64_t k = 0; k < ne0; ++k) {
                    uint64_t j = k + splitmix64(st) % (c.n_expert - k);
                    std::swap(perm[k], perm[j]);
                    out[k] = perm[k];
                }
                continue;
            }
            if (random_blocks(t)) {
                quant::random_row(t, dst + r * rb, ne0, splitmix64(st), d.half_width);
                continue;
            }
            for (uint64_t i = 0; i < ne0; ++i) buf[i] = d.center + d.half_width * uniform(st);
            quant::quantize_row(t, buf.data(), dst + r * rb, ne0);
        }
    };
    const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    if (rows < 64 || nthreads == 1) {
        work(0, rows);
        return;
    }
    std::vector<std::thread> pool;
    const uint64_t per = (rows + nthreads - 1) / nthreads;
    for (unsigned i = 0; i < nthreads; ++i) {
        const uint64_t a = i * per, b = std::min(rows, a + per);
        if (a < b) pool.emplace_back(work, a, b);
    }
    for (auto& th : pool) th.join();
}

}  // namespace

TypeMix TypeMix::preset(const std::string& name) {
    using quant::Type;
    auto uniform_mix = [](Type t) { return TypeMix{t, t, t, t, t, t, t, t, t, t}; };
    if (name == "f32") return uniform_mix(Type::F32);
    if (name == "f16") return uniform_mix(Type::F16);
    if (name == "bf16") return uniform_mix(Type::BF16);
    if (name == "q8_0") return uniform_mix(Type::Q8_0);
    TypeMix m{Type::F16, Type::Q8_0, Type::Q8_0, Type::F16, Type::F16, Type::F16,
              Type::Q8_0, Type::IQ2_XXS, Type::Q2_K, Type::Q8_0};
    if (name == "flash") return m;
    if (name == "q4k") {
        m.gate_up = m.down = Type::Q4_K;
        return m;
    }
    if (name == "mxfp4") {
        m.gate_up = m.down = Type::MXFP4;
        return m;
    }
    fail("unknown type mix '", name, "' (expected f32, f16, bf16, q8_0, flash, q4k or mxfp4)");
}

namespace {

// What the presets differ in; everything else is the same for all (synth_config).
struct PresetShape {
    const char* preset;
    uint32_t n_layer, n_embd, n_head, head_dim, n_rot, n_out_group, q_lora_rank, o_lora_rank;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_hash_layer, n_swa;
    uint32_t n_indexer_head, indexer_head_dim, indexer_top_k;
    uint64_t n_ctx_train;
    uint32_t min_vocab;  // flash: at least the real tokenizer's vocabulary
};

constexpr PresetShape kPresets[] = {
    {.preset = "tiny", .n_layer = 4, .n_embd = 64, .n_head = 4, .head_dim = 64, .n_rot = 16, .n_out_group = 2,
     .q_lora_rank = 32, .o_lora_rank = 16, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 32, .n_hash_layer = 2,
     .n_swa = 16, .n_indexer_head = 8, .indexer_head_dim = 64, .indexer_top_k = 8, .n_ctx_train = 65536,
     .min_vocab = 0},
    {.preset = "small", .n_layer = 6, .n_embd = 128, .n_head = 8, .head_dim = 128, .n_rot = 64, .n_out_group = 4,
     .q_lora_rank = 64, .o_lora_rank = 64, .n_expert = 16, .n_expert_used = 4, .n_ff_exp = 128, .n_hash_layer = 3,
     .n_swa = 128, .n_indexer_head = 8, .indexer_head_dim = 64, .indexer_top_k = 32, .n_ctx_train = 1048576,
     .min_vocab = 0},
    {.preset = "flash", .n_layer = 43, .n_embd = 4096, .n_head = 64, .head_dim = 512, .n_rot = 64, .n_out_group = 8,
     .q_lora_rank = 1024, .o_lora_rank = 1024, .n_expert = 256, .n_expert_used = 6, .n_ff_exp = 2048,
     .n_hash_layer = 3, .n_swa = 128, .n_indexer_head = 64, .indexer_head_dim = 128, .indexer_top_k = 512,
     .n_ctx_train = 1048576, .min_vocab = 129280},
};

}  // namespace

Config synth_config(const std::string& preset, uint32_t layers, uint32_t n_vocab) {
    const PresetShape* p = nullptr;
    for (const PresetShape& shape : kPresets)
        if (preset == shape.preset) p = &shape;
    if (!p) fail("unknown synth preset '", preset, "' (expected tiny, small or flash)");
    Config c;
    c.name = cat("dsv4-synth-", preset);
    c.n_embd = p->n_embd;
    c.n_vocab = std::max(n_vocab, p->min_vocab);
    c.n_ctx_train = p->n_ctx_train;
    c.n_head = p->n_head;
    c.n_head_kv = 1;
    c.head_dim = p->head_dim;
    c.n_rot = p->n_rot;
    c.n_out_group = p->n_out_group;
    c.q_lora_rank = p->q_lora_rank;
    c.o_lora_rank = p->o_lora_rank;
    c.n_expert = p->n_expert;
    c.n_expert_used = p->n_expert_used;
    c.n_expert_shared = 1;
    c.n_ff_exp = p->n_ff_exp;
    c.n_swa = p->n_swa;
    c.n_indexer_head = p->n_indexer_head;
    c.indexer_head_dim = p->indexer_head_dim;
    c.indexer_top_k = p->indexer_top_k;
    c.n_hc = 4;
    c.n_sinkhorn_iter = 20;
    c.hc_eps = 1e-6f;
    c.rms_eps = 1e-6f;
    c.rope_freq_base = 10000;
    c.compress_rope_freq_base = 160000;
    c.rope_scaling_factor = 16;
    c.yarn_beta_fast = 32;
    c.yarn_beta_slow = 1;
    c.rope_orig_ctx = 65536;
    c.expert_weights_scale = 1.5f;
    c.expert_weights_norm = true;
    c.expert_gating_func = 4;
    c.n_layer = layers ? layers : p->n_layer;
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        c.compress_ratio.push_back(il < 2 ? 0 : (il % 2 == 0 ? 4 : 128));
        c.swiglu_clamp_exp.push_back(10.0f);
    }
    c.swiglu_clamp_shexp = c.swiglu_clamp_exp;
    c.n_hash_layer = std::min(p->n_hash_layer, c.n_layer);
    return c;
}

std::vector<PlannedTensor> synth_plan(const Config& c, const TypeMix& mix, bool with_mtp) {
    std::vector<PlannedTensor> out;
    for (const TensorSpec& s : tensor_specs(c, with_mtp ? "blk.N" : "")) {
        if (!s.required) {
            // Optional tensors: only the router bias, and only on score-routed layers.
            const bool hash_layer = s.layer >= 0 && c.is_hash_layer(uint32_t(s.layer));
            if (!(s.role == Role::RouterBias && !hash_layer)) continue;
        }
        quant::Type t = type_for(s, mix);
        if (quant::traits(t).block_elems > 1 && s.ne[0] % quant::traits(t).block_elems != 0)
            t = quant::Type::F16;  // a row too short for the block format (tiny models)
        out.push_back({s.name, t, s.ne});
    }
    return out;
}

void synth_write(const Config& c_in, const TypeMix& mix, const Vocab& vocab, uint64_t seed, const std::string& path,
                 bool with_mtp) {
    Config c = c_in;
    c.n_mtp = with_mtp ? 1 : 0;
    c.validate();
    if (vocab.tokens.size() != c.n_vocab)
        fail("synth: the vocabulary has ", vocab.tokens.size(), " tokens but the config says ", c.n_vocab);

    gguf::Writer w;
    c.to_gguf(w);
    w.set("general.file_type", gguf::make_u32(0));
    w.set("tokenizer.ggml.model", gguf::make_string("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::make_string(vocab.pre));
    w.set("tokenizer.ggml.tokens", gguf::make_string_array(vocab.tokens));
    if (!vocab.token_types.empty()) w.set("tokenizer.ggml.token_type", gguf::make_i32_array(vocab.token_types));
    w.set("tokenizer.ggml.merges", gguf::make_string_array(vocab.merges));
    w.set("tokenizer.ggml.bos_token_id", gguf::make_u32(uint32_t(vocab.bos)));
    w.set("tokenizer.ggml.eos_token_id", gguf::make_u32(uint32_t(vocab.eos)));
    w.set("tokenizer.ggml.add_bos_token", gguf::make_bool(false));

    const std::vector<TensorSpec> specs = tensor_specs(c, with_mtp ? "blk.N" : "");
    for (const PlannedTensor& p : synth_plan(c, mix, with_mtp)) {
        const TensorSpec& spec = *std::find_if(specs.begin(), specs.end(), [&](const TensorSpec& s) { return s.name == p.name; });
        const quant::Type t = p.type;
        w.add_tensor(p.name, uint32_t(t), p.ne, [spec, t, seed, c](uint8_t* dst, size_t) { fill_rows(spec, t, seed, dst, c); });
    }
    w.write(path);
}

}  // namespace dsv4::model
