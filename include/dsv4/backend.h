// The interface every backend (cpu, cuda) implements: run one step — a prefill chunk or a
// decode step — for one or several sessions, writing their KV and returning logits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv4/kv.h"
#include "dsv4/model.h"

namespace dsv4 {

// Which quantisation simulations the forward pass applies (design.md "Numerics").
enum class Numerics {
    Official,  // FP8 simulation of KV rows, Hadamard + FP4 in the indexer: as the weights were trained
    Plain,     // none: what llama.cpp and transformers compute
};
Numerics parse_numerics(const std::string& s);   // "official" | "plain"
const char* numerics_name(Numerics n);

struct BackendOptions {
    Numerics numerics = Numerics::Official;
    uint32_t threads = 0;          // 0: all cores
    // Tokens per layer-major chunk (also sizes the raw ring: the window plus a chunk); 0: the
    // backend's own default (kCpuPrefillChunk / kCudaPrefillChunk below).
    uint32_t prefill_chunk = 0;
    // CUDA: prompt rounds' Q8_0 and F16 products of 256 rows or more through cuBLAS in FP16,
    // their rows attention in plain FP16 and their mHC mix in FP32 (run 150: prefill +23 % on the
    // 43-layer flash model).
    // Within ~2e-4 of each product's sum of magnitudes, but neither the CPU's bits nor the same
    // bits for every chunking of a prompt, so off by default. The CPU backend ignores it.
    bool fast_prefill = false;
};

// The prefill chunk a backend takes when BackendOptions::prefill_chunk is 0. The CPU's 512
// keeps a chunk's activations in cache; the GPU wants big rounds: a 4,096-token prompt on the
// 43-layer flash model prefills at 587 / 1,041 / 1,859 / 3,083 / 4,233 tok/s in rounds of
// 128 / 256 / 512 / 1,024 / 2,048 tokens (H200, bench/RESULTS.md §5.14), while each session's
// ring grows by the chunk (~88 KB a row over 43 layers: 2,048 rows ~176 MB, only once a
// conversation is that long: committed as written).
constexpr uint32_t kCpuPrefillChunk = 512, kCudaPrefillChunk = 2048;

// One session's part of a step: its KV and the tokens to append at positions
// kv.n_tokens() .. kv.n_tokens() + tokens.size() - 1.
struct StepInput {
    kv::SessionKV* kv = nullptr;
    std::span<const int32_t> tokens;
    // Logits wanted: for every token (rows in order) or only for the last one.
    bool all_logits = false;
    float* logits = nullptr;       // [tokens.size() or 1][n_vocab], host memory
    // Set by forward() when this session's step was refused (KV growth or budget, context
    // full): nothing of it was written; the other sessions of the step ran normally.
    std::string error;
    // Greedy token wanted (optional): the id argmax_excluding (sampler.h) picks from the final
    // token's logits with `greedy_exclude` (-1: none) excluded. The CUDA backend forms it on
    // the device, so with `logits` null only the id crosses to the host, not n_vocab floats.
    int32_t* greedy = nullptr;
    int32_t greedy_exclude = -1;
    // These tokens are (part of) a prompt: even a single one runs as a prompt round. A backend
    // may sum a round of one token (a decode step) in another order than a prompt's rounds (the
    // CUDA backend does), so without this a prompt cut to leave a lone token would get other
    // bits than the same prompt cut otherwise. A single token without it is a decode step.
    bool prompt = false;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual const model::Config& config() const = 0;
    virtual const BackendOptions& options() const = 0;
    // Regions for this backend's KV (host memory for cpu, device memory for cuda).
    virtual kv::RegionFactory region_factory() = 0;
    // Runs one step. Every session's KV is grown (ensure_tokens) and guarded before any
    // work; a session whose growth fails gets `error` set and is left as it was.
    // Inputs longer than the prefill chunk are split into chunks.
    virtual void forward(std::span<StepInput> inputs) = 0;

    // One session; throws Error when its step is refused.
    void forward_one(kv::SessionKV& kv, std::span<const int32_t> tokens, bool all_logits, float* logits,
                     bool prompt = false) {
        StepInput in{&kv, tokens, all_logits, logits, {}};
        in.prompt = prompt;
        forward(std::span<StepInput>(&in, 1));
        if (!in.error.empty()) throw Error(in.error);
    }
    // One session, greedy: evaluates tokens and returns the next token's id (see
    // StepInput::greedy); `logits` (optional) also receives the final token's logits.
    int32_t forward_greedy(kv::SessionKV& kv, std::span<const int32_t> tokens, int32_t exclude = -1,
                           float* logits = nullptr) {
        int32_t id = -1;
        StepInput in{&kv, tokens, false, logits, {}, &id, exclude};
        forward(std::span<StepInput>(&in, 1));
        if (!in.error.empty()) throw Error(in.error);
        return id;
    }
};

// What every backend does first in forward(): checks each input (a session, tokens in the
// vocabulary, not empty, fits the context) and grows its KV for the whole input before any
// work; a refused input gets `error` set and is left as it was.
void admit_step(std::span<StepInput> inputs, uint32_t n_vocab);

std::unique_ptr<Backend> make_cpu_backend(const model::Model& m, const BackendOptions& opt);
// nullptr and a reason when CUDA is not compiled in or no device is present.
std::unique_ptr<Backend> make_cuda_backend(const model::Model& m, const BackendOptions& opt, std::string* why);
bool cuda_available();

}  // namespace dsv4
