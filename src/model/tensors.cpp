#include "model/tensors.h"

namespace dsv4::model {

namespace {

using LW = LayerWeights;

// Appends the tensors of one transformer block. `prefix` is "blk.N." or "mtp.0.";
// `ratio`/`hash` describe the block (the MTP block is ratio 0 and score-routed).
void block_specs(std::vector<TensorSpec>& out, const Config& c, const std::string& prefix, int layer,
                 uint32_t ratio, bool hash, bool bias_required, std::function<LW&(Weights&)> lw) {
    auto add = [&](const char* name, std::vector<uint64_t> ne, Role role, Tensor LW::*m, bool required = true) {
        out.push_back({prefix + name, std::move(ne), role, required, layer,
                       [lw, m](Weights& w) -> Tensor& { return lw(w).*m; }});
    };
    const uint64_t E = c.n_embd, hc = c.hc_dim(), mix = c.hc_mix(), D = c.head_dim;
    add("hc_attn_fn.weight", {hc, mix}, Role::HcFn, &LW::hc_attn_fn);
    add("hc_attn_scale.weight", {3}, Role::HcScale, &LW::hc_attn_scale);
    add("hc_attn_base.weight", {mix}, Role::HcBase, &LW::hc_attn_base);
    add("attn_norm.weight", {E}, Role::Norm, &LW::attn_norm);
    add("attn_q_a.weight", {E, c.q_lora_rank}, Role::AttnProj, &LW::attn_q_a);
    add("attn_q_a_norm.weight", {c.q_lora_rank}, Role::Norm, &LW::attn_q_a_norm);
    add("attn_q_b.weight", {c.q_lora_rank, c.q_dim()}, Role::AttnProj, &LW::attn_q_b);
    add("attn_kv.weight", {E, D}, Role::AttnProj, &LW::attn_kv);
    add("attn_kv_a_norm.weight", {D}, Role::Norm, &LW::attn_kv_a_norm);
    add("attn_sinks.weight", {c.n_head}, Role::Sinks, &LW::attn_sinks);
    add("attn_output_a.weight", {c.group_dim(), uint64_t(c.n_out_group) * c.o_lora_rank}, Role::AttnProj,
        &LW::attn_output_a);
    add("attn_output_b.weight", {uint64_t(c.n_out_group) * c.o_lora_rank, E}, Role::AttnProj, &LW::attn_output_b);
    if (ratio != 0) {
        const uint64_t W = (ratio == 4 ? 2 : 1) * D;
        add("attn_compressor_ape.weight", {W, ratio}, Role::CompressorApe, &LW::attn_compressor_ape);
        add("attn_compressor_kv.weight", {E, W}, Role::CompressorW, &LW::attn_compressor_kv);
        add("attn_compressor_gate.weight", {E, W}, Role::CompressorW, &LW::attn_compressor_gate);
        add("attn_compressor_norm.weight", {D}, Role::Norm, &LW::attn_compressor_norm);
    }
    if (ratio == 4) {
        const uint64_t Di = c.indexer_head_dim;
        add("indexer.attn_q_b.weight", {c.q_lora_rank, c.indexer_q_dim()}, Role::CompressorW, &LW::indexer_attn_q_b);
        add("indexer.proj.weight", {E, c.n_indexer_head}, Role::CompressorW, &LW::indexer_proj);
        add("indexer_compressor_ape.weight", {2 * Di, 4}, Role::CompressorApe, &LW::indexer_compressor_ape);
        add("indexer_compressor_kv.weight", {E, 2 * Di}, Role::CompressorW, &LW::indexer_compressor_kv);
        add("indexer_compressor_gate.weight", {E, 2 * Di}, Role::CompressorW, &LW::indexer_compressor_gate);
        add("indexer_compressor_norm.weight", {Di}, Role::Norm, &LW::indexer_compressor_norm);
    }
    add("hc_ffn_fn.weight", {hc, mix}, Role::HcFn, &LW::hc_ffn_fn);
    add("hc_ffn_scale.weight", {3}, Role::HcScale, &LW::hc_ffn_scale);
    add("hc_ffn_base.weight", {mix}, Role::HcBase, &LW::hc_ffn_base);
    add("ffn_norm.weight", {E}, Role::Norm, &LW::ffn_norm);
    add("ffn_gate_inp.weight", {E, c.n_expert}, Role::Router, &LW::ffn_gate_inp);
    if (hash)
        add("ffn_gate_tid2eid.weight", {c.n_expert_used, c.n_vocab}, Role::HashTable, &LW::ffn_gate_tid2eid);
    // Optional in ds4's files (unused on hash layers, where llama.cpp rejects it: synth
    // writes it only on score-routed layers).
    add("exp_probs_b.bias", {c.n_expert}, Role::RouterBias, &LW::exp_probs_b, !hash && bias_required);
    const uint64_t F = c.n_ff_exp, X = c.n_expert, Fs = uint64_t(c.n_ff_exp) * c.n_expert_shared;
    add("ffn_gate_exps.weight", {E, F, X}, Role::ExpertGateUp, &LW::ffn_gate_exps);
    add("ffn_up_exps.weight", {E, F, X}, Role::ExpertGateUp, &LW::ffn_up_exps);
    add("ffn_down_exps.weight", {F, E, X}, Role::ExpertDown, &LW::ffn_down_exps);
    if (c.n_expert_shared) {
        add("ffn_gate_shexp.weight", {E, Fs}, Role::SharedExpert, &LW::ffn_gate_shexp);
        add("ffn_up_shexp.weight", {E, Fs}, Role::SharedExpert, &LW::ffn_up_shexp);
        add("ffn_down_shexp.weight", {Fs, E}, Role::SharedExpert, &LW::ffn_down_shexp);
    }
}

}  // namespace

std::vector<TensorSpec> tensor_specs(const Config& c, const std::string& mtp_scheme) {
    std::vector<TensorSpec> out;
    auto global = [&](const char* name, std::vector<uint64_t> ne, Role role, Tensor Weights::*m) {
        out.push_back({name, std::move(ne), role, true, -1, [m](Weights& w) -> Tensor& { return w.*m; }});
    };
    const uint64_t E = c.n_embd;
    global("token_embd.weight", {E, c.n_vocab}, Role::Embedding, &Weights::token_embd);
    global("output_hc_base.weight", {c.n_hc}, Role::HcBase, &Weights::output_hc_base);
    global("output_hc_fn.weight", {c.hc_dim(), c.n_hc}, Role::HcFn, &Weights::output_hc_fn);
    global("output_hc_scale.weight", {1}, Role::HcScale, &Weights::output_hc_scale);
    global("output_norm.weight", {E}, Role::Norm, &Weights::output_norm);
    global("output.weight", {E, c.n_vocab}, Role::Output, &Weights::output);
    for (uint32_t il = 0; il < c.n_layer; ++il)
        block_specs(out, c, cat("blk.", il, "."), int(il), c.ratio(il), c.is_hash_layer(il), false,
                    [il](Weights& w) -> LW& { return w.layers[il]; });
    if (!mtp_scheme.empty()) {
        const std::string prefix = mtp_scheme == "mtp.0" ? "mtp.0." : cat("blk.", c.n_layer, ".");
        block_specs(out, c, prefix, -1, 0, false, true, [](Weights& w) -> LW& { return w.mtp.block; });
        auto mtp = [&](const char* name, std::vector<uint64_t> ne, Role role, Tensor MtpWeights::*m) {
            out.push_back({prefix + name, std::move(ne), role, true, -1,
                           [m](Weights& w) -> Tensor& { return w.mtp.*m; }});
        };
        mtp("e_proj.weight", {E, E}, Role::MtpProj, &MtpWeights::e_proj);
        mtp("h_proj.weight", {E, E}, Role::MtpProj, &MtpWeights::h_proj);
        mtp("enorm.weight", {E}, Role::Norm, &MtpWeights::enorm);
        mtp("hnorm.weight", {E}, Role::Norm, &MtpWeights::hnorm);
        mtp("norm.weight", {E}, Role::Norm, &MtpWeights::norm);
        mtp("hc_head_base.weight", {c.n_hc}, Role::HcBase, &MtpWeights::hc_head_base);
        mtp("hc_head_fn.weight", {c.hc_dim(), c.n_hc}, Role::HcFn, &MtpWeights::hc_head_fn);
        mtp("hc_head_scale.weight", {1}, Role::HcScale, &MtpWeights::hc_head_scale);
    }
    return out;
}

bool type_allowed(Role r, quant::Type t) {
    using quant::Type;
    const bool is_float = t == Type::F32 || t == Type::F16 || t == Type::BF16;
    switch (r) {
        case Role::HashTable: return t == Type::I32;
        case Role::Norm:
        case Role::HcScale:
        case Role::HcBase:
        case Role::Sinks:
        case Role::RouterBias:
        case Role::CompressorApe: return is_float;
        default: return t != Type::I32 && t != Type::Q8_K;   // any weight format with a dot product
    }
}

}  // namespace dsv4::model
