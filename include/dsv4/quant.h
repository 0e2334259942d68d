// Tensor types: block layouts identical to GGUF/ggml, dequantisation, quantisation
// (for tools and tests) and the CPU dot products the reference backend uses.
// Knows nothing of models.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::quant {

// ggml type ids as stored in GGUF tensor directories.
enum class Type : uint32_t {
    F32 = 0,
    F16 = 1,
    Q8_0 = 8,
    Q2_K = 10,
    Q4_K = 12,
    Q8_K = 15,      // activation-only format for K-quant and IQ2 dot products
    IQ2_XXS = 16,
    I32 = 26,
    BF16 = 30,
    MXFP4 = 39,
};

struct TypeTraits {
    Type type;
    const char* name;        // "Q8_0", ...
    uint32_t block_elems;    // values per block
    uint32_t block_bytes;    // bytes per block
    bool is_quantized;       // block formats (not F32/F16/BF16/I32)
    Type vec_dot_type;       // activation format the CPU dot product wants (F32 for float types)
};

// nullptr for a type id this engine does not know.
const TypeTraits* traits(uint32_t type_id);
const TypeTraits& traits(Type t);
const char* type_name(uint32_t type_id);   // "type 7" for unknown ids

// Bytes of a row of n elements; n must be a multiple of block_elems (checked by callers).
size_t row_bytes(Type t, size_t n);

// ---- scalar conversions -----------------------------------------------------------------
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);          // round to nearest even
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);          // round to nearest even
inline float f16_round(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }

// ---- rows -------------------------------------------------------------------------------
// Dequantise n values (n multiple of block_elems) of any known type except Q8_K/I32 into dst.
void dequantize_row(Type t, const void* src, float* dst, size_t n);

// Quantise n floats into `dst` (row_bytes(t, n) bytes). Supported: F32, F16, BF16, Q8_0,
// Q8_K, Q4_K, Q2_K, MXFP4, IQ2_XXS. For Q2_K and IQ2_XXS this is a simple (not
// quality-optimised) quantiser: good enough for synthetic models and tests.
void quantize_row(Type t, const float* src, void* dst, size_t n);

// Random valid blocks for a type (synth uses this for the 2-bit expert types, whose
// quality-optimised quantisers are not worth writing for random weights). `scale` bounds
// the magnitude of the dequantised values roughly to [-scale, scale].
void random_row(Type t, void* dst, size_t n, uint64_t seed, float scale);

// Dot product of one weight row (type t, n values) with an activation already in
// traits(t).vec_dot_type (Q8_0 blocks, Q8_K blocks or plain floats). SIMD where available.
float vec_dot(Type t, const void* w_row, const void* act, size_t n);
// The same row against four activations: out[a] = vec_dot(t, w_row, act[a], n), bit for bit,
// with the row's loads and decoding shared (AVX2: Q8_0, Q2_K, IQ2_XXS; else four vec_dots).
void vec_dot_x4(Type t, const void* w_row, const void* const act[4], size_t n, float out[4]);

// One row against `count` activations: out[i] = vec_dot(t, w_row, act[i], n), bit for bit. Where
// many share the row its decoding is done once for all of them (IQ2_XXS under AVX2 from
// kDecodeOnceFrom activations: the grid and sign lookups expanded to bytes in `scratch`, which
// grows as needed), else four at a time (vec_dot_x4).
// (From 5: a row's decoding costs about three activations' dots, and four at a time pad 5-7
// activations to 8; measured on one core, 3-4 activations are faster the four-at-a-time way.)
inline constexpr size_t kDecodeOnceFrom = 5;
void vec_dot_many(Type t, const void* w_row, const void* const* act, size_t count, size_t n, float* out,
                  std::vector<uint8_t>& scratch);

// Bytes the activation for vec_dot(t, ..., n) occupies (floats for float weight types).
size_t act_bytes(Type t, size_t n);
// Converts a float activation into the format vec_dot(t, ...) expects. Q8_0 activations are
// GGUF Q8_0 blocks (d = amax/127 stored as f16, q = round_half_even(x * (1/d))); Q8_K follows
// model-spec §2.2. Activation codes are always within [-127, 127] (the SIMD kernels rely on it).
void quantize_act(Type t, const float* x, void* dst, size_t n);

}  // namespace dsv4::quant
