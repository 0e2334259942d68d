// The runtime: an Engine (a loaded model + a backend + the process-wide KV budget) and
// Sessions (one live timeline each: tokens, KV, next-token logits, snapshots).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/backend.h"
#include "dsv4/kv.h"
#include "dsv4/model.h"

namespace dsv4::runtime {

struct EngineOptions {
    std::string backend = "auto";      // cpu | cuda | auto (cuda when a GPU is present)
    BackendOptions backend_opt;
    kv::Options kv_opt;                // eager, initial rows, growth
    uint64_t kv_budget = 0;            // bytes; 0 = unlimited
};

class Session;

class Engine {
public:
    Engine(std::unique_ptr<model::Model> model, const EngineOptions& opt);
    ~Engine();
    static std::unique_ptr<Engine> open(const std::string& path, const EngineOptions& opt);

    const model::Model& model() const { return *model_; }
    const model::Config& config() const { return model_->config; }
    Backend& backend() { return *backend_; }
    kv::Budget& budget() { return budget_; }
    const EngineOptions& options() const { return opt_; }
    // Hash of the config, the tensor directory and a sample of every tensor's bytes:
    // snapshots made with another model are rejected.
    uint64_t model_identity() const { return identity_; }

    // A new empty session with a logical context of ctx tokens.
    std::unique_ptr<Session> new_session(uint64_t ctx);

private:
    std::unique_ptr<model::Model> model_;
    EngineOptions opt_;
    kv::Budget budget_;
    std::unique_ptr<Backend> backend_;
    uint64_t identity_ = 0;
};

class Session {
public:
    Session(Engine& engine, uint64_t ctx);
    ~Session();

    uint64_t ctx() const { return kv_->layout().ctx; }
    // The backend's prefill chunk (BackendOptions::prefill_chunk): prompts evaluated in pieces
    // of at least this many tokens go through the backend in whole chunks.
    uint32_t prefill_chunk() const;
    const std::vector<int32_t>& tokens() const { return tokens_; }
    // Logits for the token after tokens() (empty before the first eval).
    const std::vector<float>& logits() const { return logits_; }
    kv::SessionKV& kv() { return *kv_; }
    kv::Accounting accounting() const { return kv_->accounting(); }

    // Evaluates tokens at the end of the timeline. `all_logits` (optional) receives
    // [n][n_vocab] logits for every position; logits() always ends up holding the last.
    void eval(std::span<const int32_t> tokens, float* all_logits = nullptr);
    // eval for a prompt's tokens (StepInput::prompt): a piece of one token is evaluated as
    // part of the prompt, not as a decode step, so every cut of a prompt gives the same bits.
    void eval_prompt(std::span<const int32_t> tokens, float* all_logits = nullptr);
    // Greedy decoding's step: evaluates tokens and returns the id of the largest next-token
    // logit (argmax_excluding in sampler.h, `exclude` never; -1: none excluded). The logits
    // stay with the backend (on the GPU: only the id is downloaded), so logits() is empty
    // until the next eval.
    int32_t eval_greedy(std::span<const int32_t> tokens, int32_t exclude = -1);
    // Makes the timeline equal `prompt`: reuses the longest common prefix when the live
    // state allows it (the prompt extends the timeline), otherwise resets and prefills.
    // Returns the number of prompt tokens reused.
    size_t sync(std::span<const int32_t> prompt);
    void reset();

    // Snapshots (in memory and on disk): tokens, logits, KV.
    std::vector<uint8_t> save() const;
    void load(const std::vector<uint8_t>& data, const std::string& label = "<snapshot>");
    void save_file(const std::string& path) const;
    void load_file(const std::string& path);

private:
    void eval_as(std::span<const int32_t> tokens, float* all_logits, bool prompt);

    Engine& engine_;
    std::unique_ptr<kv::SessionKV> kv_;
    std::vector<int32_t> tokens_;
    std::vector<float> logits_;
};

// How many tokens of a prompt, `remaining` of them still to evaluate, the next piece takes
// when `want` (at least 1) are asked for: never a piece of one token while more of the prompt
// remains, and never one token left behind (so up to 2 more than `want`). A piece is a round
// over every weight of the model: one of a single token pays a whole round for it. (Its bits
// are the prompt's either way: pieces go in as StepInput::prompt.) Inline: the CUDA tests,
// built without the runtime layer, replay the scheduler's cuts with it.
inline size_t prompt_piece(size_t remaining, size_t want) {
    size_t n = std::min(remaining, std::max<size_t>(1, want));
    if (remaining > 1) {
        n = std::max<size_t>(n, 2);
        if (remaining - n == 1) ++n;
    }
    return n;
}

// Resident set size of this process in bytes (Linux /proc/self/statm).
uint64_t rss_bytes();

}  // namespace dsv4::runtime
