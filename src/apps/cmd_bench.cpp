// dsv4 bench: the context-frontier sweep. Loads the model once, prefills incrementally to
// each frontier (timing only the new interval), snapshots the session, decodes gen-tokens
// greedily with end-of-text forbidden, times them, and restores the snapshot. One CSV row
// per frontier with speed and memory (KV logical/reserved/committed/live, RSS).
#include <chrono>
#include <cstdio>
#include <fstream>

#include "apps/app.h"
#include "dsv4/sampler.h"

namespace dsv4::apps {

Runner add_bench(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "prefill/decode speed and KV memory at growing context frontiers");
    struct Opts {
        ModelOptions mo;
        std::string prompt_file, csv, plot;
        std::vector<std::string> plot_with;
        uint64_t ctx_start = 2048, ctx_max = 8192, step_incr = 0;
        double step_mul = 0;
        int gen_tokens = 32;
    };
    auto o = std::make_shared<Opts>();
    o->mo.add_to(*cmd, false);
    cmd->add_option("--prompt-file", o->prompt_file, "text to prefill (tokenized once)")->required();
    cmd->add_option("--ctx-start", o->ctx_start, "first frontier (tokens)")->check(CLI::PositiveNumber);
    cmd->add_option("--ctx-max", o->ctx_max, "last frontier (tokens)")->check(CLI::PositiveNumber);
    auto* a = cmd->add_option("--step-incr", o->step_incr, "frontier step (tokens)");
    auto* b = cmd->add_option("--step-mul", o->step_mul, "frontier factor");
    a->excludes(b);
    cmd->add_option("--gen-tokens", o->gen_tokens, "tokens decoded at each frontier")->check(CLI::NonNegativeNumber);
    cmd->add_option("--csv", o->csv, "CSV output")->required();
    cmd->add_option("--plot", o->plot, "also write an SVG chart of this run");
    cmd->add_option("--plot-with", o->plot_with, "other bench CSVs to draw on the same chart (e.g. the eager run)");
    return [o, cmd]() {
        if (o->step_incr == 0 && o->step_mul <= 1.0) {
            if (cmd->count("--step-mul")) fail("--step-mul must be greater than 1, found ", o->step_mul);
            o->step_incr = 2048;
        }
        std::ofstream csv(o->csv);
        if (!csv) fail("--csv: cannot write ", o->csv);
        if (!o->plot.empty() && !std::ofstream(o->plot)) fail("--plot: cannot write ", o->plot);
        std::ifstream pf(o->prompt_file, std::ios::binary);
        if (!pf) fail("--prompt-file: cannot read ", o->prompt_file);
        const std::string text((std::istreambuf_iterator<char>(pf)), {});
        auto engine = o->mo.open_engine();
        text::Tokenizer tok = text::Tokenizer::from_gguf(*engine->model().file);
        std::vector<int32_t> ids = tok.encode(text);
        uint64_t ctx_max = o->ctx_max;
        if (ids.size() < ctx_max) {
            std::fprintf(stderr, "dsv4 bench: the prompt file has only %zu tokens; stopping at that length\n",
                         ids.size());
            ctx_max = ids.size();
        }
        const uint64_t alloc = std::max<uint64_t>(o->mo.ctx, ctx_max + uint64_t(o->gen_tokens) + 1);
        if (engine->config().n_ctx_train && alloc > engine->config().n_ctx_train)
            std::fprintf(stderr, "dsv4 bench: note: %llu tokens exceed the model's training context %llu\n",
                         (unsigned long long)alloc, (unsigned long long)engine->config().n_ctx_train);
        auto s = engine->new_session(alloc);
        const int32_t eos = tok.special().eos;
        csv << "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kv_logical_bytes,kv_reserved_bytes,"
               "kv_committed_bytes,kv_live_bytes,rss_bytes\n";
        using clock = std::chrono::steady_clock;
        uint64_t frontier = std::min(o->ctx_start, ctx_max);
        while (true) {
            const uint64_t have = s->tokens().size();
            const uint64_t n_new = frontier - have;
            auto t0 = clock::now();
            if (n_new) s->eval_prompt(std::span<const int32_t>(ids.data() + have, n_new));
            const double pf_s = std::chrono::duration<double>(clock::now() - t0).count();
            const std::vector<uint8_t> snap = s->save();
            t0 = clock::now();
            // Greedy, EOS excluded: each next id from the backend (on the GPU without the logits'
            // download), the first from the prompt's logits.
            int32_t t = argmax_excluding(s->logits(), std::span<const int32_t>(&eos, eos >= 0 ? 1 : 0));
            for (int i = 0; i < o->gen_tokens; ++i) t = s->eval_greedy(std::vector<int32_t>{t}, eos);
            const double gen_s = std::chrono::duration<double>(clock::now() - t0).count();
            const kv::Accounting acc = s->accounting();   // measured at the deepest point
            const uint64_t rss = runtime::rss_bytes();
            s->load(snap, "bench snapshot");
            char line[512];
            std::snprintf(line, sizeof line, "%llu,%llu,%.2f,%d,%.2f,%llu,%llu,%llu,%llu,%llu\n",
                          (unsigned long long)frontier, (unsigned long long)n_new, pf_s > 0 ? n_new / pf_s : 0.0,
                          o->gen_tokens, gen_s > 0 ? o->gen_tokens / gen_s : 0.0, (unsigned long long)acc.logical,
                          (unsigned long long)acc.reserved, (unsigned long long)acc.committed,
                          (unsigned long long)acc.live, (unsigned long long)rss);
            csv << line << std::flush;
            std::fprintf(stderr, "bench: ctx %llu: prefill %.1f tok/s, decode %.2f tok/s, KV committed %s (live %s)\n",
                         (unsigned long long)frontier, pf_s > 0 ? n_new / pf_s : 0.0,
                         gen_s > 0 ? o->gen_tokens / gen_s : 0.0, human_bytes(acc.committed).c_str(),
                         human_bytes(acc.live).c_str());
            if (frontier >= ctx_max) break;
            frontier = o->step_incr ? frontier + o->step_incr : uint64_t(double(frontier) * o->step_mul);
            frontier = std::min(frontier, ctx_max);
        }
        if (!csv) fail("--csv: error writing ", o->csv);
        csv.close();
        if (!o->plot.empty()) {
            std::vector<std::string> all{o->csv};
            all.insert(all.end(), o->plot_with.begin(), o->plot_with.end());
            write_plot_svg(all, o->plot);
        }
        return 0;
    };
}

}  // namespace dsv4::apps
