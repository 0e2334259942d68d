// Config: every hyper-parameter read from `deepseek4.*` metadata (model-spec §1.1) and
// validated, so the same code loads a 4-layer 64-wide test model and the full Flash.
#include <cmath>
#include <sstream>

#include "dsv4/model.h"

namespace dsv4::model {

namespace {

constexpr const char* kArch = "deepseek4";

std::string key(const char* k) { return cat(kArch, ".", k); }

uint32_t req_u32(const gguf::File& f, const char* k) { return f.get_u32(key(k)); }
float req_f32(const gguf::File& f, const char* k) { return float(f.get_f64(key(k))); }

uint32_t opt_u32(const gguf::File& f, const char* k, uint32_t def) {
    return f.has(key(k)) ? f.get_u32(key(k)) : def;
}

bool is_pow2(uint32_t v) { return v && !(v & (v - 1)); }

}  // namespace

Config Config::from_gguf(const gguf::File& f) {
    const std::string arch = f.has("general.architecture") ? f.get_string("general.architecture") : "";
    if (arch != kArch)
        fail(f.path(), ": general.architecture is '", arch.empty() ? "<missing>" : arch, "', expected '", kArch, "'");

    Config c;
    c.name = f.has("general.name") ? f.get_string("general.name") : "";
    const uint32_t block_count = req_u32(f, "block_count");
    c.n_mtp = opt_u32(f, "nextn_predict_layers", 0);
    if (c.n_mtp >= block_count)
        fail(f.path(), ": ", key("nextn_predict_layers"), " = ", c.n_mtp, " leaves no main layers (block_count ",
             block_count, ")");
    // llama.cpp-style files count the MTP block in block_count (it is blk.{n_layer}).
    c.n_layer = block_count - c.n_mtp;
    c.n_embd = req_u32(f, "embedding_length");
    if (f.has(key("vocab_size")))
        c.n_vocab = req_u32(f, "vocab_size");
    else if (f.has("tokenizer.ggml.tokens"))
        c.n_vocab = uint32_t(f.find("tokenizer.ggml.tokens")->items.size());
    else
        fail(f.path(), ": missing key ", key("vocab_size"), " (and no tokenizer.ggml.tokens to infer it from)");
    c.n_ctx_train = f.has(key("context_length")) ? f.get_u64(key("context_length")) : 0;
    c.n_head = req_u32(f, "attention.head_count");
    c.n_head_kv = req_u32(f, "attention.head_count_kv");
    c.head_dim = req_u32(f, "attention.key_length");
    const uint32_t value_length = req_u32(f, "attention.value_length");
    if (value_length != c.head_dim)
        fail(f.path(), ": ", key("attention.value_length"), " = ", value_length, " but key_length = ", c.head_dim,
             " (DeepSeek V4 uses one latent vector as K and V)");
    c.n_rot = req_u32(f, "rope.dimension_count");
    c.n_out_group = req_u32(f, "attention.output_group_count");
    c.q_lora_rank = req_u32(f, "attention.q_lora_rank");
    c.o_lora_rank = req_u32(f, "attention.output_lora_rank");
    c.n_expert = req_u32(f, "expert_count");
    c.n_expert_used = req_u32(f, "expert_used_count");
    c.n_expert_shared = req_u32(f, "expert_shared_count");
    c.n_ff_exp = req_u32(f, "expert_feed_forward_length");
    const uint32_t n_group = opt_u32(f, "expert_group_count", 0);
    const uint32_t n_group_used = opt_u32(f, "expert_group_used_count", 0);
    if (n_group > 1 || n_group_used > 1)
        fail(f.path(), ": ", key("expert_group_count"), "/", key("expert_group_used_count"), " = ", n_group, "/",
             n_group_used, ": group-limited routing is not part of DeepSeek V4 (expected 0)");
    c.n_hash_layer = req_u32(f, "hash_layer_count");
    c.n_swa = req_u32(f, "attention.sliding_window");
    c.n_indexer_head = req_u32(f, "attention.indexer.head_count");
    c.indexer_head_dim = req_u32(f, "attention.indexer.key_length");
    c.indexer_top_k = req_u32(f, "attention.indexer.top_k");
    c.n_hc = req_u32(f, "hyper_connection.count");
    c.n_sinkhorn_iter = req_u32(f, "hyper_connection.sinkhorn_iterations");
    c.hc_eps = req_f32(f, "hyper_connection.epsilon");
    c.rms_eps = req_f32(f, "attention.layer_norm_rms_epsilon");
    c.rope_freq_base = req_f32(f, "rope.freq_base");
    c.compress_rope_freq_base = req_f32(f, "attention.compress_rope_freq_base");
    if (f.has(key("rope.scaling.type"))) {
        const std::string t = f.get_string(key("rope.scaling.type"));
        if (t != "yarn") fail(f.path(), ": ", key("rope.scaling.type"), " = '", t, "', expected 'yarn'");
    }
    c.rope_scaling_factor = req_f32(f, "rope.scaling.factor");
    c.yarn_beta_fast = req_f32(f, "rope.scaling.yarn_beta_fast");
    c.yarn_beta_slow = req_f32(f, "rope.scaling.yarn_beta_slow");
    c.rope_orig_ctx = f.get_u64(key("rope.scaling.original_context_length"));
    c.expert_weights_scale = req_f32(f, "expert_weights_scale");
    c.expert_weights_norm = f.get_bool(key("expert_weights_norm"));
    c.expert_gating_func = opt_u32(f, "expert_gating_func", 4);

    auto ratios = f.get_number_array(key("attention.compress_ratios"));
    if (ratios.size() < c.n_layer)
        fail(f.path(), ": ", key("attention.compress_ratios"), " has ", ratios.size(), " entries, expected at least ",
             c.n_layer, " (one per layer)");
    for (uint32_t il = 0; il < c.n_layer; ++il) {
        const double r = ratios[il];
        if (r != 0 && r != 4 && r != 128)
            fail(f.path(), ": ", key("attention.compress_ratios"), "[", il, "] = ", r,
                 ": unsupported compression ratio (expected 0, 4 or 128)");
        c.compress_ratio.push_back(uint32_t(r));
    }
    auto clamp = f.get_number_array(key("swiglu_clamp_exp"));
    if (clamp.size() < c.n_layer)
        fail(f.path(), ": ", key("swiglu_clamp_exp"), " has ", clamp.size(), " entries, expected at least ", c.n_layer);
    for (uint32_t il = 0; il < c.n_layer; ++il) c.swiglu_clamp_exp.push_back(float(clamp[il]));
    if (f.has(key("swiglu_clamp_shexp"))) {
        auto sh = f.get_number_array(key("swiglu_clamp_shexp"));
        if (sh.size() < c.n_layer)
            fail(f.path(), ": ", key("swiglu_clamp_shexp"), " has ", sh.size(), " entries, expected at least ",
                 c.n_layer);
        for (uint32_t il = 0; il < c.n_layer; ++il) c.swiglu_clamp_shexp.push_back(float(sh[il]));
    } else {
        c.swiglu_clamp_shexp = c.swiglu_clamp_exp;
    }
    try {
        c.validate();
    } catch (const Error& e) {
        fail(f.path(), ": ", e.what());
    }
    return c;
}

void Config::validate() const {
    auto need = [](bool ok, auto&&... msg) {
        if (!ok) fail(msg...);
    };
    need(n_layer >= 1, "block_count must be at least 1");
    need(n_embd > 0 && n_vocab > 0 && n_head > 0 && head_dim > 0, "zero model dimension (embedding ", n_embd,
         ", vocab ", n_vocab, ", heads ", n_head, ", head dim ", head_dim, ")");
    need(n_head_kv == 1, "attention.head_count_kv = ", n_head_kv, ", expected 1 (one shared latent KV head)");
    need(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim, "rope.dimension_count = ", n_rot,
         ": must be even and at most the head dim ", head_dim);
    need(n_out_group > 0 && n_head % n_out_group == 0, "attention.output_group_count = ", n_out_group,
         " does not divide head_count ", n_head);
    need(q_lora_rank > 0 && o_lora_rank > 0, "zero LoRA rank (q ", q_lora_rank, ", output ", o_lora_rank, ")");
    need(n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert, "expert_used_count = ", n_expert_used,
         " with expert_count = ", n_expert);
    need(n_ff_exp > 0, "expert_feed_forward_length is 0");
    need(n_hash_layer <= n_layer, "hash_layer_count = ", n_hash_layer, " exceeds block_count ", n_layer);
    need(n_swa > 0, "attention.sliding_window is 0");
    need(n_hc > 0, "hyper_connection.count is 0");
    need(n_sinkhorn_iter > 0, "hyper_connection.sinkhorn_iterations is 0");
    need(expert_gating_func == 4, "expert_gating_func = ", expert_gating_func,
         ": only 4 (sqrt-softplus) is DeepSeek V4's router");
    need(compress_ratio.size() == n_layer, "compress_ratios has ", compress_ratio.size(), " entries for ", n_layer,
         " layers");
    need(swiglu_clamp_exp.size() == n_layer && swiglu_clamp_shexp.size() == n_layer,
         "swiglu_clamp arrays must have one entry per layer");
    bool any4 = false;
    for (uint32_t il = 0; il < n_layer; ++il) {
        need(compress_ratio[il] == 0 || compress_ratio[il] == 4 || compress_ratio[il] == 128,
             "compress_ratios[", il, "] = ", compress_ratio[il], ": unsupported (expected 0, 4 or 128)");
        any4 |= compress_ratio[il] == 4;
    }
    if (any4) {
        need(n_indexer_head > 0, "attention.indexer.head_count is 0 but ratio-4 layers need an indexer");
        need(is_pow2(indexer_head_dim) && indexer_head_dim >= n_rot, "attention.indexer.key_length = ",
             indexer_head_dim, ": must be a power of two (Hadamard rotation) and at least rope.dimension_count ",
             n_rot);
        need(indexer_top_k > 0, "attention.indexer.top_k is 0");
    }
    need(rope_freq_base > 0 && compress_rope_freq_base > 0, "non-positive RoPE base");
    need(rope_scaling_factor >= 1, "rope.scaling.factor = ", rope_scaling_factor, ", expected >= 1");
    need(rope_orig_ctx > 0, "rope.scaling.original_context_length is 0");
}

void Config::to_gguf(gguf::Writer& w) const {
    using namespace gguf;
    w.set("general.architecture", make_string(kArch));
    if (!name.empty()) w.set("general.name", make_string(name));
    w.set(key("block_count"), make_u32(n_layer + n_mtp));
    w.set(key("context_length"), make_u32(uint32_t(n_ctx_train)));   // llama.cpp reads u32
    w.set(key("embedding_length"), make_u32(n_embd));
    w.set(key("vocab_size"), make_u32(n_vocab));
    w.set(key("attention.head_count"), make_u32(n_head));
    w.set(key("attention.head_count_kv"), make_u32(n_head_kv));
    w.set(key("attention.key_length"), make_u32(head_dim));
    w.set(key("attention.value_length"), make_u32(head_dim));
    w.set(key("rope.dimension_count"), make_u32(n_rot));
    w.set(key("attention.output_group_count"), make_u32(n_out_group));
    w.set(key("attention.q_lora_rank"), make_u32(q_lora_rank));
    w.set(key("attention.output_lora_rank"), make_u32(o_lora_rank));
    w.set(key("expert_count"), make_u32(n_expert));
    w.set(key("expert_used_count"), make_u32(n_expert_used));
    w.set(key("expert_shared_count"), make_u32(n_expert_shared));
    w.set(key("expert_feed_forward_length"), make_u32(n_ff_exp));
    w.set(key("expert_group_count"), make_u32(0));
    w.set(key("expert_group_used_count"), make_u32(0));
    w.set(key("hash_layer_count"), make_u32(n_hash_layer));
    w.set(key("attention.sliding_window"), make_u32(n_swa));
    w.set(key("attention.indexer.head_count"), make_u32(n_indexer_head));
    w.set(key("attention.indexer.key_length"), make_u32(indexer_head_dim));
    w.set(key("attention.indexer.top_k"), make_u32(indexer_top_k));
    w.set(key("hyper_connection.count"), make_u32(n_hc));
    w.set(key("hyper_connection.sinkhorn_iterations"), make_u32(n_sinkhorn_iter));
    w.set(key("hyper_connection.epsilon"), make_f32(hc_eps));
    w.set(key("attention.layer_norm_rms_epsilon"), make_f32(rms_eps));
    w.set(key("rope.freq_base"), make_f32(rope_freq_base));
    w.set(key("attention.compress_rope_freq_base"), make_f32(compress_rope_freq_base));
    // Always written: llama.cpp silently changes results when these are missing.
    w.set(key("rope.scaling.type"), make_string("yarn"));
    w.set(key("rope.scaling.factor"), make_f32(rope_scaling_factor));
    w.set(key("rope.scaling.yarn_beta_fast"), make_f32(yarn_beta_fast));
    w.set(key("rope.scaling.yarn_beta_slow"), make_f32(yarn_beta_slow));
    w.set(key("rope.scaling.original_context_length"), make_u32(uint32_t(rope_orig_ctx)));
    w.set(key("expert_weights_scale"), make_f32(expert_weights_scale));
    w.set(key("expert_weights_norm"), make_bool(expert_weights_norm));
    w.set(key("expert_gating_func"), make_u32(expert_gating_func));
    std::vector<int32_t> ratios(compress_ratio.begin(), compress_ratio.end());
    for (uint32_t i = 0; i < n_mtp; ++i) ratios.push_back(0);  // the MTP block is SWA-only
    w.set(key("attention.compress_ratios"), make_i32_array(ratios));
    std::vector<float> clamp = swiglu_clamp_exp, shclamp = swiglu_clamp_shexp;
    for (uint32_t i = 0; i < n_mtp; ++i) {
        clamp.push_back(clamp.back());
        shclamp.push_back(shclamp.back());
    }
    w.set(key("swiglu_clamp_exp"), make_f32_array(clamp));
    w.set(key("swiglu_clamp_shexp"), make_f32_array(shclamp));
    if (n_mtp) w.set(key("nextn_predict_layers"), make_u32(n_mtp));
}

std::string Config::schedule_string() const {
    std::ostringstream os;
    for (uint32_t il = 0; il < n_layer; ++il) os << (il ? " " : "") << compress_ratio[il];
    return os.str();
}

}  // namespace dsv4::model
