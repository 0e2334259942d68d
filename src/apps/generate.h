// Generation shared by `run` and `chat`: prefill with a progress bar, sampling until EOS
// or the token limit, streaming valid UTF-8, and the summary line.
#pragma once

#include <atomic>
#include <functional>

#include "apps/app.h"
#include "dsv4/sampler.h"

namespace dsv4::apps {

struct SamplingOptions {
    float temp = 1.0f, top_p = 1.0f, min_p = 0.05f;
    int top_k = 0;
    uint64_t seed = 0;   // 0: time-based
    int n_predict = 256;
    bool think = true, nothink = false;
    std::string system = "You are a helpful assistant";
    void add_to(CLI::App& app);
    SamplerParams params() const;
};

struct GenerationStats {
    size_t prompt_tokens = 0, reused_tokens = 0, generated = 0;
    double prefill_s = 0, decode_s = 0;
    bool stopped_by_eos = false;
};

// Evaluates `tokens` appended to the session (prefill, chunk by chunk with a progress bar
// on a TTY), then samples up to n_predict tokens, calling on_text with valid UTF-8 pieces.
// `interrupted` (optional) stops the generation between tokens.
GenerationStats generate(runtime::Session& s, const text::Tokenizer& tok, std::span<const int32_t> tokens,
                         Sampler& sampler, int n_predict, const std::function<void(const std::string&)>& on_text,
                         const std::atomic<bool>* interrupted = nullptr);

// "prompt 12 tok, generated 34 tok, prefill 123.4 tok/s, decode 45.6 tok/s, KV committed 1.2 MiB / logical 3.4 GiB"
std::string summary_line(const GenerationStats& g, const kv::Accounting& a);

}  // namespace dsv4::apps
