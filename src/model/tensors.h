// The tensor inventory of a DeepSeek V4 GGUF (model-spec §2.3), as one table that both
// weight binding (shape/type checks) and `synth` (generation) walk, so they cannot disagree.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dsv4/model.h"

namespace dsv4::model {

// What a tensor is, which decides the types it may have and how synth fills it.
enum class Role {
    Norm,          // RMSNorm weight vectors (F32)
    HcScale,       // hc_*_scale [3], output_hc_scale [1] (F32)
    HcBase,        // hc_*_base, output_hc_base (F32)
    HcFn,          // hc_*_fn, output_hc_fn (F16 in the shipped files)
    Sinks,         // attn_sinks (F32)
    Embedding,     // token_embd (F16)
    Output,        // output head (Q8_0)
    AttnProj,      // attn_q_a, attn_q_b, attn_kv, attn_output_a/b (Q8_0)
    CompressorW,   // compressor / indexer kv, gate, indexer q_b and proj (F16)
    CompressorApe, // compressor ape (F16)
    Router,        // ffn_gate_inp (F16)
    RouterBias,    // exp_probs_b.bias (F32)
    HashTable,     // ffn_gate_tid2eid (I32)
    SharedExpert,  // ffn_{gate,up,down}_shexp (Q8_0)
    ExpertGateUp,  // ffn_{gate,up}_exps (IQ2_XXS / Q2_K / Q4_K / ...)
    ExpertDown,    // ffn_down_exps
    MtpProj,       // mtp e_proj / h_proj (Q8_0)
};

struct TensorSpec {
    std::string name;
    std::vector<uint64_t> ne;
    Role role;
    bool required = true;
    int layer = -1;                               // -1: global or MTP extra
    std::function<Tensor&(Weights&)> slot;        // where binding stores it
};

// All tensors of a file for this config: globals, then each layer in order, then the MTP
// block if `mtp_scheme` is "mtp.0" or "blk.N" (empty: no MTP).
std::vector<TensorSpec> tensor_specs(const Config& c, const std::string& mtp_scheme = "");

// Whether a stored type is acceptable for a role.
bool type_allowed(Role r, quant::Type t);

}  // namespace dsv4::model
