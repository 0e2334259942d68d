// Private: byte layouts of the GGUF/ggml block formats and the helpers every quant source
// uses. Every member is a byte array, so a block may sit at any address (tensors are
// mmapped and 34-, 66- and 17-byte blocks are not aligned); multi-byte fields are read with
// memcpy. The host must be little-endian, like the files.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "dsv4/common.h"
#include "dsv4/quant.h"

namespace dsv4::quant::detail {

static_assert(std::endian::native == std::endian::little, "GGUF blocks are little-endian");

constexpr int QK8_0 = 32;
constexpr int QK_K = 256;
constexpr int QK_MXFP4 = 32;

// Q8_0: value = d * qs[i]
struct BlockQ8_0 {
    uint8_t d[2];  // f16
    int8_t qs[QK8_0];
};
// Q2_K: see dequantize_q2_k for the bit layout.
struct BlockQ2_K {
    uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min, one per 16 values
    uint8_t qs[QK_K / 4];       // 2-bit quants
    uint8_t d[2];               // f16 super-block scale for the scales
    uint8_t dmin[2];            // f16 super-block scale for the mins
};
// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins packed into 12 bytes.
struct BlockQ4_K {
    uint8_t d[2];
    uint8_t dmin[2];
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
// IQ2_XXS: 8 groups of 32 values, each group 8 bytes (two little-endian u32).
struct BlockIQ2_XXS {
    uint8_t d[2];
    uint8_t qs[QK_K / 4];  // ggml: uint16_t qs[32]
};
// Q8_K: activation-only. bsums[j] = sum of qs[16j .. 16j+15].
struct BlockQ8_K {
    uint8_t d[4];  // f32
    int8_t qs[QK_K];
    uint8_t bsums[QK_K / 16 * 2];  // int16 each
};
// MXFP4 (ggml type 39): e is an E8M0 exponent; 4-bit codes index kMxfp4Values.
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];  // element j: low nibble of qs[j]; element j+16: high nibble
};

static_assert(sizeof(BlockQ8_0) == 34 && alignof(BlockQ8_0) == 1);
static_assert(sizeof(BlockQ2_K) == 84 && alignof(BlockQ2_K) == 1);
static_assert(sizeof(BlockQ4_K) == 144 && alignof(BlockQ4_K) == 1);
static_assert(sizeof(BlockIQ2_XXS) == 66 && alignof(BlockIQ2_XXS) == 1);
static_assert(sizeof(BlockQ8_K) == 292 && alignof(BlockQ8_K) == 1);
static_assert(sizeof(BlockMXFP4) == 17 && alignof(BlockMXFP4) == 1);

// MXFP4 code -> value in units of the block's "half" scale (the E2M1 values doubled so they
// are integers: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ggml's E8M0 "half" convention: 2^(e-127) * 0.5 = 2^(e-128), exact for every e (e = 0 and
// e = 1 give the subnormal floats 2^-128 and 2^-127; e = 255 gives 2^127, not NaN).
inline float e8m0_to_fp32_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
    return std::bit_cast<float>(bits);
}

// A little-endian field at any address (see the top of this file).
template <typename T>
inline T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline uint16_t load_u16(const uint8_t* p) { return load<uint16_t>(p); }
inline uint32_t load_u32(const uint8_t* p) { return load<uint32_t>(p); }
// Block scales are converted on every block of every dot product: use the F16C instruction
// where the build has it (exact, so identical to fp16_to_fp32 for every non-NaN half).
inline float load_f16(const uint8_t* p) {
#if defined(__F16C__)
    return _cvtsh_ss(load_u16(p));
#else
    return fp16_to_fp32(load_u16(p));
#endif
}
inline float load_bf16(const uint8_t* p) { return bf16_to_fp32(load_u16(p)); }
inline float load_f32(const uint8_t* p) { return load<float>(p); }
inline int16_t load_i16(const uint8_t* p) { return load<int16_t>(p); }
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
inline void store_f16(uint8_t* p, float f) { store_u16(p, fp32_to_fp16(f)); }
inline void store_f32(uint8_t* p, float f) { std::memcpy(p, &f, 4); }
inline void store_i16(uint8_t* p, int16_t v) { std::memcpy(p, &v, 2); }

// Blocks in a row of n values of type t; throws, naming `what`, when n is not a whole
// number of blocks (every row-level entry point checks this first).
inline size_t row_blocks(const char* what, Type t, size_t n) {
    const TypeTraits& tr = traits(t);
    if (n % tr.block_elems != 0)
        fail(what, ": ", n, " values is not a multiple of the ", tr.name, " block (", tr.block_elems, ")");
    return n / tr.block_elems;
}

// Q4_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void q4k_scale_min(const uint8_t* s, int j, uint8_t& sc, uint8_t& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Round to nearest, ties to even, independent of the FP environment. |x| < 2^31 assumed by
// callers (they clamp the result to a small range; NaN gives 0).
inline float round_half_even(float x) {
    if (!(std::fabs(x) < 8388608.0f)) return std::isnan(x) ? 0.0f : x;  // already an integer
    float r = std::floor(x);
    float diff = x - r;  // exact
    if (diff > 0.5f || (diff == 0.5f && std::fmod(r, 2.0f) != 0.0f)) r += 1.0f;
    return r;
}
// round_half_even(x) clamped to [lo, hi] (NaN: 0): nearbyint under the default rounding mode
// (to nearest, ties to even) is the same integer, without branches, so the activation
// quantisers' loops vectorise (they were ~12 % of a CPU prefill's time).
inline int round_clamp(float x, int lo, int hi) {
    float r = std::nearbyint(x);
    r = r != r ? 0.0f : r;
    return int(std::min(std::max(r, float(lo)), float(hi)));
}

// Deterministic generator for random_row (same bytes on every platform).
struct SplitMix64 {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // uniform integer in [lo, hi]
    int range(int lo, int hi) { return lo + int(next() % uint64_t(hi - lo + 1)); }
    // uniform float in [-1, 1)
    float sym() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) * (1.0f / 8388608.0f); }
};

// Scalar and SIMD dot products (dot.cpp). vec_dot() uses the SIMD one where it exists.
float vec_dot_scalar(Type t, const void* w_row, const void* act, size_t n);
// nullptr-like signal: returns false when no SIMD kernel exists for t in this build.
bool vec_dot_simd(Type t, const void* w_row, const void* act, size_t n, float* out);

}  // namespace dsv4::quant::detail
