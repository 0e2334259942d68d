#include "apps/generate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace dsv4::apps {

namespace {
double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void SamplingOptions::add_to(CLI::App& app) {
    app.add_option("--temp", temp, "sampling temperature (0: greedy)");
    app.add_option("--top-p", top_p, "nucleus sampling mass");
    app.add_option("--top-k", top_k, "sample among the k most likely (0: off)");
    app.add_option("--min-p", min_p, "drop tokens below min-p times the most likely one's probability");
    app.add_option("--seed", seed, "random seed (0: from the clock)");
    app.add_option("-n,--tokens", n_predict, "maximum tokens to generate");
    app.add_flag("--think", think, "thinking mode on (default)");
    app.add_flag("--nothink", nothink, "thinking mode off");
    app.add_option("--system", system, "system text (\"\" for none)");
}

SamplerParams SamplingOptions::params() const {
    SamplerParams p;
    p.temperature = temp;
    p.top_p = top_p;
    p.min_p = min_p;
    p.top_k = top_k;
    p.seed = seed ? seed : uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    return p;
}

GenerationStats generate(runtime::Session& s, const text::Tokenizer& tok, std::span<const int32_t> tokens,
                         Sampler& sampler, int n_predict, const std::function<void(const std::string&)>& on_text,
                         const std::atomic<bool>* interrupted) {
    GenerationStats g;
    g.prompt_tokens = tokens.size();
    if (s.tokens().size() + tokens.size() > s.ctx())
        fail("the prompt needs ", s.tokens().size() + tokens.size(), " tokens but the context (--ctx) holds ", s.ctx());
    const bool tty = isatty(STDERR_FILENO);
    // Pieces for the progress bar, each at least one whole backend chunk: a smaller piece
    // would make each of the backend's rounds that small (on the GPU a 2,048-token round is
    // what its prefill figures are measured with).
    const size_t chunk = std::max<size_t>(256, s.prefill_chunk());
    double t0 = now_s();
    for (size_t done = 0; done < tokens.size();) {
        const size_t n = runtime::prompt_piece(tokens.size() - done, chunk);
        s.eval_prompt(tokens.subspan(done, n));
        done += n;
        if (tty && tokens.size() > chunk) {
            const int w = 30, filled = int(w * done / tokens.size());
            std::fprintf(stderr, "\rprefill [%.*s%*s] %zu/%zu", filled, "==============================", w - filled,
                         "", done, tokens.size());
            if (done == tokens.size()) std::fprintf(stderr, "\r%*s\r", 60, "");
        }
    }
    g.prefill_s = now_s() - t0;
    text::StreamDecoder dec(tok);
    const int32_t eos = tok.special().eos;
    t0 = now_s();
    // Greedy sampling takes each next id from the backend (on the GPU formed there: no logits
    // download); the first comes from the prompt's logits.
    const bool greedy = !(sampler.params().temperature > 0);
    int32_t t = n_predict > 0 ? sampler.sample(s.logits()) : -1;
    for (int i = 0; i < n_predict; ++i) {
        if (interrupted && interrupted->load()) break;
        if (t == eos) {
            g.stopped_by_eos = true;
            break;
        }
        on_text(dec.push(t));
        ++g.generated;
        if (s.tokens().size() >= s.ctx()) break;   // the context is full
        if (i + 1 == n_predict) {   // the last token needs no successor: evaluate it for the timeline only
            s.eval(std::vector<int32_t>{t});
            break;
        }
        const std::vector<int32_t> one{t};
        if (greedy) {
            t = s.eval_greedy(one);
        } else {
            s.eval(one);
            t = sampler.sample(s.logits());
        }
    }
    on_text(dec.flush());
    g.decode_s = now_s() - t0;
    return g;
}

std::string summary_line(const GenerationStats& g, const kv::Accounting& a) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "prompt %zu tok (%zu reused), generated %zu tok, prefill %.1f tok/s, decode %.1f tok/s, "
                  "KV committed %s / logical %s (live %s)",
                  g.prompt_tokens, g.reused_tokens, g.generated, g.prefill_s > 0 ? g.prompt_tokens / g.prefill_s : 0.0,
                  g.decode_s > 0 ? g.generated / g.decode_s : 0.0, human_bytes(a.committed).c_str(),
                  human_bytes(a.logical).c_str(), human_bytes(a.live).c_str());
    return buf;
}

}  // namespace dsv4::apps
