// vec_dot: one weight row times an activation in traits(t).vec_dot_type.
//
// The quantised dot products follow the reference (ggml/ds4) structure: integer sums of
// weight codes times activation codes inside each (sub-)block, scaled by the integer
// sub-block scales, then one float multiply-add per block with the block scales. Hence they
// equal the dot of the dequantised weight row with the dequantised activation, up to float
// summation order. The AVX2 K-quant and IQ2_XXS kernels compute exactly the same integers
// and the same per-block float operations as the scalar ones, so they agree bit for bit;
// the float and Q8_0 kernels keep vector accumulators and agree up to summation order.
// Per-block accumulations use explicit std::fma so that compilers' multiply-add contraction
// (on with -march=native, impossible without FMA) cannot make builds disagree.
//
// Activation codes are never -128 (the Q8_0/Q8_K activation quantisers produce |q| <= 127),
// which the SIMD kernels rely on (_mm256_sign_epi8 and _mm256_maddubs_epi16 stay exact).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "dsv4/common.h"
#include "dsv4/quant.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"

namespace dsv4::quant {

using namespace detail;

namespace {

// ---- scalar -------------------------------------------------------------------------------

// F32, F16 and BF16 differ only in how an element of `Bytes` bytes is read (Load). Weight
// rows are read with memcpy: a row may sit at any address inside a mapping.
template <size_t Bytes, float (*Load)(const uint8_t*)>
float dot_float(const uint8_t* w, const float* x, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; ++i) s += Load(w + Bytes * i) * x[i];
    return s;
}

// Q8_0 and Q8_K differ only in the block length and in how the scale d is stored (LoadD:
// f16 in Q8_0, f32 in Q8_K).
template <typename Block, float (*LoadD)(const uint8_t*)>
float dot_q8(const Block* w, const Block* x, size_t nb) {
    constexpr int n = int(sizeof(Block::qs));  // int8 codes
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        int sumi = 0;
        for (int j = 0; j < n; ++j) sumi += int(w[i].qs[j]) * int(x[i].qs[j]);
        s = std::fma(LoadD(w[i].d) * LoadD(x[i].d), float(sumi), s);
    }
    return s;
}

// A Q2_K or Q4_K super-block's share of the dot: dall * isum - dmin * mins, where isum is the
// sum of the sub-block scales times their code dots, mins the sum of the sub-block mins times
// the activation sums under them, and dall, dmin the block's d and dmin times the activation
// scale. The scalar and AVX2 kernels end each block here, so they agree bit for bit.
template <typename Block>
float k_superblock(const Block& w, const BlockQ8_K& x, int isum, int mins) {
    const float dx = load_f32(x.d);
    const float dall = dx * load_f16(w.d);
    const float dmin = dx * load_f16(w.dmin);
    return std::fma(dall, float(isum), -(dmin * float(mins)));
}

// Sum over sub-blocks of min * (sum of the activation codes under it), from the bsums.
int q2k_mins(const BlockQ2_K& w, const BlockQ8_K& x) {
    int summs = 0;
    for (int k = 0; k < 16; ++k) summs += int(load_i16(x.bsums + 2 * k)) * (w.scales[k] >> 4);
    return summs;
}

float dot_q2_k(const BlockQ2_K* w, const BlockQ8_K* x, size_t nb) {
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        int isum = 0;
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 4; ++j)
                for (int sb = 0; sb < 2; ++sb) {
                    const uint8_t* q = w[i].qs + 32 * h + 16 * sb;
                    const int8_t* q8 = x[i].qs + 128 * h + 32 * j + 16 * sb;
                    int sumi = 0;
                    for (int t = 0; t < 16; ++t) sumi += ((q[t] >> (2 * j)) & 3) * int(q8[t]);
                    isum += (w[i].scales[8 * h + 2 * j + sb] & 0xF) * sumi;
                }
        s += k_superblock(w[i], x[i], isum, q2k_mins(w[i], x[i]));
    }
    return s;
}

void q4k_unpack_scales(const BlockQ4_K& w, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; ++j) q4k_scale_min(w.scales, j, sc[j], m[j]);
}

int q4k_mins(const uint8_t m[8], const BlockQ8_K& x) {
    int summs = 0;
    for (int j = 0; j < 8; ++j)
        summs += m[j] * (int(load_i16(x.bsums + 4 * j)) + int(load_i16(x.bsums + 4 * j + 2)));
    return summs;
}

float dot_q4_k(const BlockQ4_K* w, const BlockQ8_K* x, size_t nb) {
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        uint8_t sc[8], m[8];
        q4k_unpack_scales(w[i], sc, m);
        int isum = 0;
        for (int c = 0; c < 4; ++c)
            for (int half = 0; half < 2; ++half) {
                const uint8_t* q = w[i].qs + 32 * c;
                const int8_t* q8 = x[i].qs + 64 * c + 32 * half;
                int sumi = 0;
                for (int t = 0; t < 32; ++t) sumi += ((q[t] >> (4 * half)) & 0xF) * int(q8[t]);
                isum += sc[2 * c + half] * sumi;
            }
        s += k_superblock(w[i], x[i], isum, q4k_mins(m, x[i]));
    }
    return s;
}

// Group scale (0.5 + ls) / 4 = (2 ls + 1) / 8: integer (2 ls + 1) inside, 1/8 at the end.
float dot_iq2_xxs(const BlockIQ2_XXS* w, const BlockQ8_K* x, size_t nb) {
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        const float d = load_f16(w[i].d) * load_f32(x[i].d);
        int bsum = 0;
        for (int g = 0; g < 8; ++g) {
            const uint32_t a0 = load_u32(w[i].qs + 8 * g);
            const uint32_t a1 = load_u32(w[i].qs + 8 * g + 4);
            const int8_t* q8 = x[i].qs + 32 * g;
            int sumi = 0;
            for (int l = 0; l < 4; ++l) {
                const uint32_t idx = (a0 >> (8 * l)) & 0xFF;
                const uint8_t signs = kSignsIq2xs[(a1 >> (7 * l)) & 127];
                for (int t = 0; t < 8; ++t) {
                    const int v = iq2xxs_grid_value(idx, t) * int(q8[8 * l + t]);
                    sumi += (signs >> t) & 1 ? -v : v;
                }
            }
            bsum += sumi * int(2 * (a1 >> 28) + 1);
        }
        s = std::fma(d, float(bsum), s);
    }
    return 0.125f * s;
}

float dot_mxfp4(const BlockMXFP4* w, const BlockQ8_0* x, size_t nb) {
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        int sumi = 0;
        for (int j = 0; j < QK_MXFP4 / 2; ++j) {
            sumi += kMxfp4Values[w[i].qs[j] & 0xF] * int(x[i].qs[j]);
            sumi += kMxfp4Values[w[i].qs[j] >> 4] * int(x[i].qs[j + QK_MXFP4 / 2]);
        }
        s = std::fma(e8m0_to_fp32_half(w[i].e) * load_f16(x[i].d), float(sumi), s);
    }
    return s;
}

// ---- AVX2 ---------------------------------------------------------------------------------
#if defined(__AVX2__)

inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

inline __m256 madd(__m256 a, __m256 b, __m256 c) {
#if defined(__FMA__)
    return _mm256_fmadd_ps(a, b, c);
#else
    return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

float dot_f32_avx2(const uint8_t* wb, const float* x, size_t n) {
    const float* w = reinterpret_cast<const float*>(wb);  // only through unaligned loads
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = madd(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = madd(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = madd(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = madd(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = madd(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) s += load_f32(wb + 4 * i) * x[i];
    return s;
}

#if defined(__F16C__)
float dot_f16_avx2(const uint8_t* w, const float* x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    auto ld = [w](size_t i) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
    };
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = madd(ld(i), _mm256_loadu_ps(x + i), a0);
        a1 = madd(ld(i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = madd(ld(i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = madd(ld(i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = madd(ld(i), _mm256_loadu_ps(x + i), a0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) s += load_f16(w + 2 * i) * x[i];
    return s;
}
#endif

float dot_bf16_avx2(const uint8_t* w, const float* x, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    auto ld = [w](size_t i) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    };
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = madd(ld(i), _mm256_loadu_ps(x + i), a0);
        a1 = madd(ld(i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = madd(ld(i), _mm256_loadu_ps(x + i), a0);
    float s = hsum_ps(_mm256_add_ps(a0, a1));
    for (; i < n; ++i) s += load_bf16(w + 2 * i) * x[i];
    return s;
}

// Signed 8-bit dot of 32 lanes into 8 int32 lanes, each the sum of 4 neighbouring products:
// |w| * (x with w's sign). The same integers either way (|w|, |x| <= 127: a pair of products never
// saturates maddubs' int16); AVX-512 VNNI adds the four in one instruction.
inline __m256i dot_i8_32(__m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
#else
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
}

// Two 16-lane int16 scale halves: lanes 0..7 get lo, lanes 8..15 get hi (matching the
// 128-bit halves of a maddubs result over 32 bytes).
inline __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(short(hi)), _mm_set1_epi16(short(lo)));
}

float dot_q4_k_avx2(const BlockQ4_K* w, const BlockQ8_K* x, size_t nb) {
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float s = 0.0f;
    for (size_t i = 0; i < nb; ++i) {
        uint8_t sc[8], m[8];
        q4k_unpack_scales(w[i], sc, m);
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
            const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(bytes, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
            const __m256i q8a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * c));
            const __m256i q8b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 64 * c + 32));
            const __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, q8a), _mm256_set1_epi16(short(sc[2 * c])));
            const __m256i pb = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q8b), _mm256_set1_epi16(short(sc[2 * c + 1])));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(pa, pb));
        }
        s += k_superblock(w[i], x[i], hsum_epi32(acc), q4k_mins(m, x[i]));
    }
    return s;
}

// ---- Q8_0, Q2_K and IQ2_XXS: one weight row against A activations -----------------------------
// A = 1: vec_dot; A = 4: vec_dot_x4. Each activation's operations are the same whatever A (the
// same bits); what A activations share is the weight row's loads and decoding (IQ2_XXS: the grid
// and sign tables, a quarter of them at A = 4), and their float chains (two each for Q8_0) run
// side by side where one dot's chain is latency-bound.
template <int A>
void dot_q8_0_avx2_n(const BlockQ8_0* w, const BlockQ8_0* const* x, size_t nb, float* out) {
    __m256 acc0[A], acc1[A];
    for (int a = 0; a < A; ++a) acc0[a] = acc1[a] = _mm256_setzero_ps();
    auto p_of = [](__m256i wq, const BlockQ8_0& xb) {
        return dot_i8_32(wq, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs)));
    };
    size_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i + 1].qs));
        const float d0 = load_f16(w[i].d), d1 = load_f16(w[i + 1].d);
        for (int a = 0; a < A; ++a) {
            const __m256i p0 = p_of(w0, x[a][i]), p1 = p_of(w1, x[a][i + 1]);
            acc0[a] = madd(_mm256_set1_ps(d0 * load_f16(x[a][i].d)), _mm256_cvtepi32_ps(p0), acc0[a]);
            acc1[a] = madd(_mm256_set1_ps(d1 * load_f16(x[a][i + 1].d)), _mm256_cvtepi32_ps(p1), acc1[a]);
        }
    }
    for (; i < nb; ++i) {
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
        const float d0 = load_f16(w[i].d);
        for (int a = 0; a < A; ++a)
            acc0[a] = madd(_mm256_set1_ps(d0 * load_f16(x[a][i].d)), _mm256_cvtepi32_ps(p_of(w0, x[a][i])), acc0[a]);
    }
    for (int a = 0; a < A; ++a) out[a] = hsum_ps(_mm256_add_ps(acc0[a], acc1[a]));
}

template <int A>
void dot_q2_k_avx2_n(const BlockQ2_K* w, const BlockQ8_K* const* x, size_t nb, float* out) {
    const __m256i m3 = _mm256_set1_epi8(3);
    float s[A] = {};
    for (size_t i = 0; i < nb; ++i) {
        __m256i acc[A];
        for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * h));
            for (int j = 0; j < 4; ++j) {
                const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * j), m3);
                const int k = 8 * h + 2 * j;
                const __m256i sc = scale_pair(w[i].scales[k] & 0xF, w[i].scales[k + 1] & 0xF);
                for (int a = 0; a < A; ++a) {
                    const __m256i q8 =
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[a][i].qs + 128 * h + 32 * j));
                    acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(q2, q8), sc));
                }
            }
        }
        // the mins' sum (q2k_mins, the same integer): the 16 mins as int16 once, then one madd
        // against each activation's bsums
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales));
        const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
        for (int a = 0; a < A; ++a) {
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[a][i].bsums));
            s[a] += k_superblock(w[i], x[a][i], hsum_epi32(acc[a]), hsum_epi32(_mm256_madd_epi16(bs, mins16)));
        }
    }
    for (int a = 0; a < A; ++a) out[a] = s[a];
}

// A group of 32 IQ2_XXS weights (its 8 code bytes at qs): the grid magnitudes of its four
// sub-groups of 8, their signs as +1 / -1 bytes, and its integer scale 2 ls + 1.
struct Iq2Group {
    __m256i grid, signs;
    int16_t ls;
};
inline Iq2Group iq2_group(const uint8_t* qs) {
    const uint32_t a0 = load_u32(qs), a1 = load_u32(qs + 4);
    return {_mm256_set_epi64x(int64_t(kIq2xxsGrid[a0 >> 24]), int64_t(kIq2xxsGrid[(a0 >> 16) & 0xFF]),
                              int64_t(kIq2xxsGrid[(a0 >> 8) & 0xFF]), int64_t(kIq2xxsGrid[a0 & 0xFF])),
            _mm256_set_epi64x(int64_t(kSignBytesIq2xs[(a1 >> 21) & 127]), int64_t(kSignBytesIq2xs[(a1 >> 14) & 127]),
                              int64_t(kSignBytesIq2xs[(a1 >> 7) & 127]), int64_t(kSignBytesIq2xs[a1 & 127])),
            int16_t(2 * (a1 >> 28) + 1)};
}

template <int A>
void dot_iq2_xxs_avx2_n(const BlockIQ2_XXS* w, const BlockQ8_K* const* x, size_t nb, float* out) {
    float s[A] = {};
    for (size_t i = 0; i < nb; ++i) {
        const float dw = load_f16(w[i].d);
        __m256i acc[A];
        for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
            const Iq2Group q = iq2_group(w[i].qs + 8 * g);
            const __m256i ls = _mm256_set1_epi16(q.ls);
            for (int a = 0; a < A; ++a) {
                const __m256i q8 = _mm256_sign_epi8(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[a][i].qs + 32 * g)), q.signs);
                acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(q.grid, q8), ls));
            }
        }
        for (int a = 0; a < A; ++a) s[a] = std::fma(dw * load_f32(x[a][i].d), float(hsum_epi32(acc[a])), s[a]);
    }
    for (int a = 0; a < A; ++a) out[a] = 0.125f * s[a];
}
// ---- IQ2_XXS: a row decoded once for many activations ----------------------------------------
// dot_iq2_xxs_avx2_n looks a group's grid entries and signs up for every call, shared by at most
// four activations. Decoded once instead, a super-block's 256 signed weights are kept as bytes
// w + 64 (grid magnitudes <= 43: 21 .. 107, unsigned as maddubs wants them, so no sign step per
// activation) with the 8 group scales; per activation a group is then one maddubs, one madd and
// an add. The offset's share, 64 * sum over groups of ls * (sum of the activation's codes there),
// comes out of the Q8_K block's bsums and is subtracted: the same integer sum as
// dot_iq2_xxs_avx2_n's (a pair of products is at most 2 * 107 * 127 < 2^15: no saturation), then
// the same float steps, so the same bits.
struct Iq2Decoded {
    uint8_t wu[256];   // weight + 64, 32 a group
    int16_t ls[16];    // group g's scale 2 ls + 1 at 2 g and 2 g + 1 (against bsums 2 g, 2 g + 1)
    float dw;
};

void iq2_xxs_decode(const BlockIQ2_XXS* w, size_t nb, Iq2Decoded* out) {
    const __m256i off = _mm256_set1_epi8(64);
    for (size_t i = 0; i < nb; ++i) {
        out[i].dw = load_f16(w[i].d);
        for (int g = 0; g < 8; ++g) {
            const Iq2Group q = iq2_group(w[i].qs + 8 * g);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[i].wu + 32 * g),
                                _mm256_add_epi8(_mm256_sign_epi8(q.grid, q.signs), off));
            out[i].ls[2 * g] = out[i].ls[2 * g + 1] = q.ls;
        }
    }
}

template <int A>
void dot_iq2_xxs_decoded_n(const Iq2Decoded* w, const BlockQ8_K* const* x, size_t nb, float* out) {
    float s[A] = {};
    for (size_t i = 0; i < nb; ++i) {
        __m256i acc[A];
        for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
            const __m256i wu = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].wu + 32 * g));
            const __m256i ls = _mm256_set1_epi16(w[i].ls[2 * g]);
            for (int a = 0; a < A; ++a) {
                const __m256i q8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[a][i].qs + 32 * g));
                acc[a] = _mm256_add_epi32(acc[a], _mm256_madd_epi16(_mm256_maddubs_epi16(wu, q8), ls));
            }
        }
        const __m256i ls16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].ls));
        for (int a = 0; a < A; ++a) {
            const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[a][i].bsums));
            const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bs, ls16), 6);
            s[a] = std::fma(w[i].dw * load_f32(x[a][i].d), float(hsum_epi32(_mm256_sub_epi32(acc[a], offset))), s[a]);
        }
    }
    for (int a = 0; a < A; ++a) out[a] = 0.125f * s[a];
}

// One activation: the kernels at A = 1.
template <typename W, typename X, void (*K)(const W*, const X* const*, size_t, float*)>
float dot_one(const W* w, const X* x, size_t nb) {
    float r;
    K(w, &x, nb, &r);
    return r;
}
#endif  // __AVX2__

}  // namespace

namespace detail {

float vec_dot_scalar(Type t, const void* w_row, const void* act, size_t n) {
    const size_t nb = n / traits(t).block_elems;
    const auto* w = static_cast<const uint8_t*>(w_row);
    switch (t) {
        case Type::F32: return dot_float<4, load_f32>(w, static_cast<const float*>(act), n);
        case Type::F16: return dot_float<2, load_f16>(w, static_cast<const float*>(act), n);
        case Type::BF16: return dot_float<2, load_bf16>(w, static_cast<const float*>(act), n);
        case Type::Q8_0:
            return dot_q8<BlockQ8_0, load_f16>(static_cast<const BlockQ8_0*>(w_row),
                                               static_cast<const BlockQ8_0*>(act), nb);
        case Type::Q8_K:
            return dot_q8<BlockQ8_K, load_f32>(static_cast<const BlockQ8_K*>(w_row),
                                               static_cast<const BlockQ8_K*>(act), nb);
        case Type::Q2_K:
            return dot_q2_k(static_cast<const BlockQ2_K*>(w_row), static_cast<const BlockQ8_K*>(act), nb);
        case Type::Q4_K:
            return dot_q4_k(static_cast<const BlockQ4_K*>(w_row), static_cast<const BlockQ8_K*>(act), nb);
        case Type::IQ2_XXS:
            return dot_iq2_xxs(static_cast<const BlockIQ2_XXS*>(w_row), static_cast<const BlockQ8_K*>(act), nb);
        case Type::MXFP4:
            return dot_mxfp4(static_cast<const BlockMXFP4*>(w_row), static_cast<const BlockQ8_0*>(act), nb);
        case Type::I32: break;
    }
    fail("vec_dot: type ", traits(t).name, " has no dot product");
}

bool vec_dot_simd(Type t, const void* w_row, const void* act, size_t n, float* out) {
#if defined(__AVX2__)
    const size_t nb = n / traits(t).block_elems;
    switch (t) {
        case Type::F32:
            *out = dot_f32_avx2(static_cast<const uint8_t*>(w_row), static_cast<const float*>(act), n);
            return true;
#if defined(__F16C__)
        case Type::F16:
            *out = dot_f16_avx2(static_cast<const uint8_t*>(w_row), static_cast<const float*>(act), n);
            return true;
#endif
        case Type::BF16:
            *out = dot_bf16_avx2(static_cast<const uint8_t*>(w_row), static_cast<const float*>(act), n);
            return true;
        case Type::Q8_0:
            *out = dot_one<BlockQ8_0, BlockQ8_0, dot_q8_0_avx2_n<1>>(static_cast<const BlockQ8_0*>(w_row),
                                                                      static_cast<const BlockQ8_0*>(act), nb);
            return true;
        case Type::Q2_K:
            *out = dot_one<BlockQ2_K, BlockQ8_K, dot_q2_k_avx2_n<1>>(static_cast<const BlockQ2_K*>(w_row),
                                                                      static_cast<const BlockQ8_K*>(act), nb);
            return true;
        case Type::Q4_K:
            *out = dot_q4_k_avx2(static_cast<const BlockQ4_K*>(w_row), static_cast<const BlockQ8_K*>(act), nb);
            return true;
        case Type::IQ2_XXS:
            *out = dot_one<BlockIQ2_XXS, BlockQ8_K, dot_iq2_xxs_avx2_n<1>>(static_cast<const BlockIQ2_XXS*>(w_row),
                                                                             static_cast<const BlockQ8_K*>(act), nb);
            return true;
        default: break;
    }
#else
    (void)t, (void)w_row, (void)act, (void)n, (void)out;
#endif
    return false;
}

}  // namespace detail

float vec_dot(Type t, const void* w_row, const void* act, size_t n) {
    row_blocks("vec_dot", t, n);  // throws unless n is whole blocks
    float r;
    if (detail::vec_dot_simd(t, w_row, act, n, &r)) return r;
    return detail::vec_dot_scalar(t, w_row, act, n);
}

void vec_dot_x4(Type t, const void* w_row, const void* const act[4], size_t n, float out[4]) {
    row_blocks("vec_dot", t, n);
#if defined(__AVX2__)
    const size_t nb = n / traits(t).block_elems;
    switch (t) {
        case Type::Q8_0:
            return dot_q8_0_avx2_n<4>(static_cast<const BlockQ8_0*>(w_row), reinterpret_cast<const BlockQ8_0* const*>(act),
                                    nb, out);
        case Type::Q2_K:
            return dot_q2_k_avx2_n<4>(static_cast<const BlockQ2_K*>(w_row), reinterpret_cast<const BlockQ8_K* const*>(act),
                                    nb, out);
        case Type::IQ2_XXS:
            return dot_iq2_xxs_avx2_n<4>(static_cast<const BlockIQ2_XXS*>(w_row),
                                       reinterpret_cast<const BlockQ8_K* const*>(act), nb, out);
        default: break;
    }
#endif
    for (int a = 0; a < 4; ++a) out[a] = vec_dot(t, w_row, act[a], n);
}

void vec_dot_many(Type t, const void* w_row, const void* const* act, size_t count, size_t n, float* out,
                  std::vector<uint8_t>& scratch) {
    row_blocks("vec_dot", t, n);
    size_t j = 0;
#if defined(__AVX2__)
    if (t == Type::IQ2_XXS && count >= kDecodeOnceFrom) {
        const size_t nb = n / QK_K;
        if (scratch.size() < nb * sizeof(Iq2Decoded)) scratch.resize(nb * sizeof(Iq2Decoded));
        auto* d = reinterpret_cast<Iq2Decoded*>(scratch.data());   // (vector storage: aligned for it)
        iq2_xxs_decode(static_cast<const BlockIQ2_XXS*>(w_row), nb, d);
        for (; count - j >= 4; j += 4)
            dot_iq2_xxs_decoded_n<4>(d, reinterpret_cast<const BlockQ8_K* const*>(act + j), nb, out + j);
        for (; j < count; ++j)
            dot_iq2_xxs_decoded_n<1>(d, reinterpret_cast<const BlockQ8_K* const*>(act + j), nb, out + j);
        return;
    }
#else
    (void)scratch;
#endif
    // four at a time; a tail of two or three padded with its last activation (cheaper than single
    // dots: the row's decoding dominates), a lone one alone
    while (count - j >= 2) {
        const void* a[4];
        for (size_t i = 0; i < 4; ++i) a[i] = act[std::min(j + i, count - 1)];
        float o[4];
        vec_dot_x4(t, w_row, a, n, o);
        const size_t m = std::min<size_t>(4, count - j);
        for (size_t i = 0; i < m; ++i) out[j + i] = o[i];
        j += m;
    }
    if (j < count) out[j] = vec_dot(t, w_row, act[j], n);
}

}  // namespace dsv4::quant
