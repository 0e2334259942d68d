// Token sampling (model-spec.md §7.4): greedy, temperature, top-k, top-p, min-p, with the
// xorshift64* generator ds4 uses, so a seed reproduces a generation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dsv4 {

struct SamplerParams {
    float temperature = 1.0f;  // <= 0: greedy
    float top_p = 1.0f;        // outside (0, 1] -> 1
    float min_p = 0.05f;       // relative to the most likely token; < 0 -> 0, > 1 -> 1
    int top_k = 0;             // <= 0: whole vocabulary; capped at 1024
    uint64_t seed = 0;         // 0 is replaced by a fixed non-zero state
};

// xorshift64*: s ^= s>>12; s ^= s<<25; s ^= s>>27; out = s * 0x2545F4914F6CDD1D.
class Rng {
public:
    explicit Rng(uint64_t seed = 0) { reseed(seed); }
    void reseed(uint64_t seed) { state_ = seed ? seed : 0x9E3779B97F4A7C15ull; }
    uint64_t next();
    // Uniform in [0, 1) with 24 bits: ((out >> 40) & 0xFFFFFF) / 2^24.
    float uniform();
    uint64_t state() const { return state_; }
    void set_state(uint64_t s) { reseed(s); }

private:
    uint64_t state_;
};

// First index of the largest logit (NaN never wins). -1 for an empty span.
int32_t argmax(std::span<const float> logits);
// The same, never returning one of `excluded` (the bench forbids EOS). -1 when every id is
// excluded.
int32_t argmax_excluding(std::span<const float> logits, std::span<const int32_t> excluded);

// One draw with explicit parameters and generator (the DSML guard samples some tokens with
// temperature 0 while keeping the request's generator). Greedy draws do not advance `rng`;
// every other draw takes exactly one uniform number.
int32_t sample(std::span<const float> logits, const SamplerParams& params, Rng& rng);

// Parameters + generator + scratch, one per generating session.
class Sampler {
public:
    explicit Sampler(const SamplerParams& params = {}) : params_(params), rng_(params.seed) {}
    int32_t sample(std::span<const float> logits);
    // Same generator, other parameters for this one draw.
    int32_t sample_with(std::span<const float> logits, const SamplerParams& params);
    const SamplerParams& params() const { return params_; }
    Rng& rng() { return rng_; }

private:
    SamplerParams params_;
    Rng rng_;
};

}  // namespace dsv4
