// The quantisation-aware numerics of the released weights (model-spec §5.8, §5.10), and
// the tail RoPE with YaRN (§5.4). Shared by the CPU backend and the CUDA kernel tests.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/model.h"

namespace dsv4::cpu {

// Nearest E4M3FN value (ties to the even code), |v| <= 448.
float e4m3_round(float v);
// Nearest E2M1 value of {0, .5, 1, 1.5, 2, 3, 4, 6} with sign (ties to the even code), |v| <= 6.
float e2m1_round(float v);
// 2^ceil(log2(x)) for x > 0, computed exactly.
float pow2_ceil(float x);

// FP8 round trip of x[0, n) in blocks of 64 (the last block may be partial):
// scale = 2^ceil(log2(max(amax, 1e-4) / 448)), x = E4M3(clamp(x/scale)) * scale.
void fp8_sim(float* x, uint32_t n);
// FP4 round trip in blocks of 32: scale = 2^ceil(log2(max(amax, 6*2^-126) / 6)).
void fp4_sim(float* x, uint32_t n);
// Normalised Sylvester Walsh-Hadamard transform in place; n is a power of two.
void hadamard(float* x, uint32_t n);

// RoPE tables for one layer flavour: cos/sin of every (position, pair) computed on demand.
// Layers with ratio 0 use rope.freq_base without scaling; compressed layers use
// compress_rope_freq_base with YaRN (magnitude 1: DeepSeek V4 does not scale cos/sin).
class Rope {
public:
    Rope(const model::Config& c, bool compressed);
    // Rotates the last n_rot dims of x (a head of width `width`), interleaved pairs.
    // inverse = true rotates by -position (the attention output's tail).
    void apply(float* x, uint32_t width, uint64_t pos, bool inverse = false) const;
    // cos and sin of every pair at pos, interleaved (n_rot floats), to rotate many heads.
    void cos_sin(uint64_t pos, float* cs) const;
    // Rotation with precomputed cos_sin().
    void apply_cs(float* x, uint32_t width, const float* cs, bool inverse = false) const;
    uint32_t n_rot() const { return n_rot_; }
    double theta(uint64_t pos, uint32_t pair) const;

private:
    uint32_t n_rot_;
    std::vector<double> inv_freq_;  // per pair, YaRN-blended
};

}  // namespace dsv4::cpu
