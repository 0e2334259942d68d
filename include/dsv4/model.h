// The DeepSeek V4 model description: Config read from `deepseek4.*` metadata (any size,
// tiny test models and the full Flash release through the same code), the layer schedule,
// and weight binding by tensor name with shape and type checks. Knows nothing of devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/common.h"
#include "dsv4/gguf.h"
#include "dsv4/quant.h"

namespace dsv4::model {

// Every field comes from the file (model-spec §1.1); nothing is a compiled-in constant.
struct Config {
    std::string name;                     // general.name (informational)
    uint32_t n_layer = 0;                 // block_count, excluding an appended MTP block
    uint32_t n_embd = 0;                  // embedding_length
    uint32_t n_vocab = 0;                 // vocab_size
    uint64_t n_ctx_train = 0;             // context_length (informational)
    uint32_t n_head = 0;                  // attention.head_count
    uint32_t n_head_kv = 0;               // attention.head_count_kv (1: one latent K=V head)
    uint32_t head_dim = 0;                // attention.key_length (= value_length)
    uint32_t n_rot = 0;                   // rope.dimension_count: tail dims of each head rotated
    uint32_t n_out_group = 0;             // attention.output_group_count
    uint32_t q_lora_rank = 0;             // attention.q_lora_rank
    uint32_t o_lora_rank = 0;             // attention.output_lora_rank
    uint32_t n_expert = 0;                // expert_count
    uint32_t n_expert_used = 0;           // expert_used_count
    uint32_t n_expert_shared = 0;         // expert_shared_count
    uint32_t n_ff_exp = 0;                // expert_feed_forward_length
    uint32_t n_hash_layer = 0;            // hash_layer_count
    uint32_t n_swa = 0;                   // attention.sliding_window
    uint32_t n_indexer_head = 0;          // attention.indexer.head_count
    uint32_t indexer_head_dim = 0;        // attention.indexer.key_length
    uint32_t indexer_top_k = 0;           // attention.indexer.top_k
    uint32_t n_hc = 0;                    // hyper_connection.count
    uint32_t n_sinkhorn_iter = 0;         // hyper_connection.sinkhorn_iterations
    float hc_eps = 0;                     // hyper_connection.epsilon
    float rms_eps = 0;                    // attention.layer_norm_rms_epsilon
    float rope_freq_base = 0;             // rope.freq_base (ratio-0 layers)
    float compress_rope_freq_base = 0;    // attention.compress_rope_freq_base (compressed layers)
    float rope_scaling_factor = 1;        // rope.scaling.factor (YaRN, compressed layers)
    float yarn_beta_fast = 32;            // rope.scaling.yarn_beta_fast
    float yarn_beta_slow = 1;             // rope.scaling.yarn_beta_slow
    uint64_t rope_orig_ctx = 0;           // rope.scaling.original_context_length
    float expert_weights_scale = 1;       // expert_weights_scale
    bool expert_weights_norm = true;      // expert_weights_norm
    uint32_t expert_gating_func = 4;      // 4 = sqrt(softplus)
    std::vector<uint32_t> compress_ratio; // per layer (n_layer entries): 0, 4 or 128
    std::vector<float> swiglu_clamp_exp;  // per layer
    std::vector<float> swiglu_clamp_shexp;// per layer (defaults to the routed value)
    uint32_t n_mtp = 0;                   // nextn_predict_layers

    // Reads and validates. Throws Error naming the key: missing, wrong type, inconsistent.
    static Config from_gguf(const gguf::File& f);
    // Writes every key of this config into a GGUF writer (synth, tests).
    void to_gguf(gguf::Writer& w) const;
    // Same checks as from_gguf, for configs built in code.
    void validate() const;

    // ---- derived sizes (model-spec §1.1) ----
    uint32_t ratio(uint32_t il) const { return compress_ratio[il]; }
    uint32_t coff(uint32_t il) const { return ratio(il) == 4 ? 2 : 1; }
    uint32_t hc_dim() const { return n_hc * n_embd; }
    uint32_t hc_mix() const { return 2 * n_hc + n_hc * n_hc; }
    uint32_t q_dim() const { return n_head * head_dim; }
    uint32_t n_nope() const { return head_dim - n_rot; }
    uint32_t group_heads() const { return n_head / n_out_group; }
    uint32_t group_dim() const { return group_heads() * head_dim; }
    uint32_t indexer_q_dim() const { return n_indexer_head * indexer_head_dim; }
    bool is_hash_layer(uint32_t il) const { return il < n_hash_layer; }
    // Short human summary of the layer schedule, e.g. "0 0 4 128 4 128".
    std::string schedule_string() const;
};

// A bound tensor: type, shape and a pointer to its bytes (host mapping).
struct Tensor {
    const gguf::TensorInfo* info = nullptr;
    quant::Type type() const { return quant::Type(info->type); }
    const uint8_t* data() const { return info->data; }
    uint64_t ne(int i) const { return i < int(info->ne.size()) ? info->ne[size_t(i)] : 1; }
    uint64_t nbytes() const { return info->nbytes; }
    const std::string& name() const { return info->name; }
    explicit operator bool() const { return info != nullptr; }
    // Row r of a 2-D (or the flattened 3-D) matrix: ne0 values.
    const uint8_t* row(uint64_t r) const;
    size_t row_bytes() const;
};

struct LayerWeights {
    // mHC
    Tensor hc_attn_fn, hc_attn_scale, hc_attn_base;
    Tensor hc_ffn_fn, hc_ffn_scale, hc_ffn_base;
    // attention
    Tensor attn_norm, attn_q_a, attn_q_a_norm, attn_q_b, attn_kv, attn_kv_a_norm, attn_sinks;
    Tensor attn_output_a, attn_output_b;
    // compressor (ratio != 0)
    Tensor attn_compressor_ape, attn_compressor_kv, attn_compressor_gate, attn_compressor_norm;
    // indexer (ratio == 4)
    Tensor indexer_attn_q_b, indexer_proj;
    Tensor indexer_compressor_ape, indexer_compressor_kv, indexer_compressor_gate, indexer_compressor_norm;
    // FFN
    Tensor ffn_norm, ffn_gate_inp, exp_probs_b, ffn_gate_tid2eid;
    Tensor ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    Tensor ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
};

// The optional multi-token-prediction block, in either naming scheme:
// ds4's `mtp.0.*` or llama.cpp's extra `blk.{n_layer}.*` block.
struct MtpWeights {
    bool present = false;
    std::string scheme;   // "mtp.0" or "blk.N"
    LayerWeights block;
    Tensor e_proj, h_proj, enorm, hnorm, norm, hc_head_base, hc_head_fn, hc_head_scale;
};

struct Weights {
    Tensor token_embd, output, output_norm, output_hc_base, output_hc_fn, output_hc_scale;
    std::vector<LayerWeights> layers;
    MtpWeights mtp;
    uint64_t total_bytes = 0;

    // Binds every tensor by name, checking shape and type against the config. Throws Error
    // naming the tensor, the expected and the found shape/type. Unknown tensors are errors
    // too (a file of another architecture should not load silently).
    static Weights bind(const gguf::File& f, const Config& c);
};

// A loaded model: the mapping, its config and bound weights.
struct Model {
    std::unique_ptr<gguf::File> file;
    Config config;
    Weights weights;

    // Opens, checks general.architecture == "deepseek4", reads the config, binds weights.
    static std::unique_ptr<Model> load(const std::string& path);
};

}  // namespace dsv4::model

namespace dsv4::model {

// ---- synthetic models (`dsv4 synth`) -----------------------------------------------------

// Stored type per tensor role. Presets: "f32" (every float tensor F32: the llama.cpp
// comparison), "f16", "q8_0", "flash" (the shipped 2-bit mix: IQ2_XXS gate/up and Q2_K down
// experts, Q8_0 attention/shared/output, F16 embedding/HC/compressor/indexer/router, F32
// norms), "q4k" (flash mix with Q4_K experts), "mxfp4" (flash mix with MXFP4 experts).
struct TypeMix {
    quant::Type embedding, output, attn, compressor, router, hc_fn, shared, gate_up, down, mtp;
    static TypeMix preset(const std::string& name);
};

struct Vocab {
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::vector<int32_t> token_types;   // 1 normal, 3 control (specials), 6 byte...
    std::string pre = "deepseek-v3";
    int32_t bos = 0, eos = 1;
};

// Config of a named preset: "tiny" (a few MB; unit tests), "small" (tens of MB: window,
// ratio-4 and ratio-128 layers, hash layers, indexer top_k below the compressed rows of a
// few hundred tokens), "flash" (full Flash widths). `layers` overrides the layer count
// (0 keeps the preset's); the schedule is Flash's 0,0,4,128,4,128,...
Config synth_config(const std::string& preset, uint32_t layers, uint32_t n_vocab);

// What synth writes for a config and type mix, in file order: name, stored type, shape.
struct PlannedTensor {
    std::string name;
    quant::Type type;
    std::vector<uint64_t> ne;
};
std::vector<PlannedTensor> synth_plan(const Config& c, const TypeMix& mix, bool with_mtp = false);

// Writes a random-weight GGUF: deterministic for (config, mix, vocab, seed). Weights are
// scaled so activations keep a realistic range through many layers.
void synth_write(const Config& c, const TypeMix& mix, const Vocab& vocab, uint64_t seed, const std::string& path,
                 bool with_mtp = false);

}  // namespace dsv4::model
