// dsv4 info FILE [--ctx N]: what a GGUF holds and what its KV costs at a context.
#include <cstdio>
#include <map>

#include "apps/app.h"

namespace dsv4::apps {

Runner add_info(CLI::App& app) {
    auto* cmd = app.add_subcommand("info", "describe a DeepSeek V4 GGUF and its KV memory cost");
    auto path = std::make_shared<std::string>();
    auto ctx = std::make_shared<uint64_t>(0);
    cmd->add_option("file", *path, "GGUF file")->required();
    cmd->add_option("-c,--ctx", *ctx, "also print the logical KV bytes at this context");
    return [path, ctx]() {
        auto m = model::Model::load(*path);
        const model::Config& c = m->config;
        std::printf("file:          %s (GGUF v%u, %s)\n", path->c_str(), m->file->version(),
                    human_bytes(m->file->file_size()).c_str());
        std::printf("architecture:  deepseek4%s%s\n", c.name.empty() ? "" : ", ", c.name.c_str());
        std::printf("layers:        %u (+%u MTP)\n", c.n_layer, m->weights.mtp.present ? 1u : 0u);
        std::printf("embedding:     %u, heads %u x %u (rope %u), q lora %u, output %u groups x %u\n", c.n_embd,
                    c.n_head, c.head_dim, c.n_rot, c.q_lora_rank, c.n_out_group, c.o_lora_rank);
        std::printf("experts:       %u routed (%u used) + %u shared, hidden %u; hash-routed layers %u\n", c.n_expert,
                    c.n_expert_used, c.n_expert_shared, c.n_ff_exp, c.n_hash_layer);
        std::printf("attention:     window %u, indexer %u heads x %u, top-k %u, hyper-connections %u\n", c.n_swa,
                    c.n_indexer_head, c.indexer_head_dim, c.indexer_top_k, c.n_hc);
        std::printf("vocabulary:    %u\n", c.n_vocab);
        std::printf("schedule:      %s\n", c.schedule_string().c_str());
        std::map<std::string, std::pair<uint64_t, uint64_t>> hist;
        for (const auto& t : m->file->tensors()) {
            auto& h = hist[quant::type_name(t.type)];
            h.first += 1;
            h.second += t.nbytes;
        }
        std::printf("tensor types: ");
        for (auto& [name, h] : hist)
            std::printf(" %s x%llu (%s)", name.c_str(), (unsigned long long)h.first, human_bytes(h.second).c_str());
        std::printf("\nweights:       %s in %zu tensors\n", human_bytes(m->weights.total_bytes).c_str(),
                    m->file->tensors().size());
        // KV bytes per token: compressed rows of every compressed layer (+ indexer rows).
        uint64_t per_token_x128 = 0;   // bytes per 128 tokens, exact
        for (uint32_t il = 0; il < c.n_layer; ++il) {
            const uint32_t r = c.ratio(il);
            if (r == 4) per_token_x128 += 32ull * (c.head_dim + c.indexer_head_dim) * 4;
            if (r == 128) per_token_x128 += uint64_t(c.head_dim) * 4;
        }
        std::printf("KV per token:  %.1f B (compressed rows, fp32), plus a fixed %s of raw window and compressor state\n",
                    double(per_token_x128) / 128.0,
                    human_bytes(kv::Layout::make(c, std::max<uint64_t>(*ctx, 1), 512).fixed_bytes).c_str());
        if (*ctx) {
            const kv::Layout l = kv::Layout::make(c, *ctx, 512);
            std::printf("KV at %llu tokens (logical): %s\n", (unsigned long long)*ctx,
                        human_bytes(l.logical_bytes()).c_str());
        }
        return 0;
    };
}

}  // namespace dsv4::apps
