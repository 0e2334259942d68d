// quantize_row, random_row and the activation formats of vec_dot.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dsv4/common.h"
#include "dsv4/quant.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"

namespace dsv4::quant {

using namespace detail;

namespace {

// Smallest f16 value >= x (x >= 0 and finite), so a scale rounded to f16 never shrinks and
// the quantisation ranges derived from it still cover the data.
uint16_t fp16_round_up(float x) {
    uint16_t h = fp32_to_fp16(x);
    if (fp16_to_fp32(h) < x && h < 0x7bff) ++h;  // next larger positive half
    return h;
}

// ---- Q8_0 -------------------------------------------------------------------------------
// d = amax/127 and q = round_half_even(x * (1/d)), as ds4's reference activation quantiser
// computes it (it multiplies by the float reciprocal; q never reaches -128). The block
// stores d rounded to f16, like every GGUF Q8_0 block.
void quantize_q8_0(const float* x, BlockQ8_0* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++y, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_f16(y->d, d);
        for (int j = 0; j < QK8_0; ++j) y->qs[j] = int8_t(round_clamp(x[j] * id, -128, 127));
    }
}

// ---- Q8_K (model-spec §2.2, exactly) ------------------------------------------------------
void quantize_q8_k(const float* x, BlockQ8_K* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++y, x += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(y, 0, sizeof(*y));
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; ++j) y->qs[j] = int8_t(round_clamp(iscale * x[j], -128, 127));
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int t = 0; t < 16; ++t) sum += y->qs[16 * j + t];
            store_i16(y->bsums + 2 * j, int16_t(sum));
        }
        store_f32(y->d, 1.0f / iscale);
    }
}

// ---- K-quant scale/min fitting -------------------------------------------------------------
// A plain min/max fit (not ggml's search-based optimiser): every sub-block gets the
// asymmetric range [min(0, min x), max x]; the per-sub-block scale and min are quantised
// upwards against f16 super-block scales so the representable range always covers the
// data. Then each value is at most half a quantisation step ds_j = d*sc_j from its input.
struct KFit {
    uint16_t d, dmin;        // f16
    uint8_t sc[16], m[16];   // per sub-block
    uint8_t q[QK_K];         // 0..qmax
};

void fit_kquant(const float* x, int nsub, int qmax, int scale_max, KFit& f) {
    const int len = QK_K / nsub;
    float mn[16], mx[16];
    float maxneg = 0.0f;
    for (int j = 0; j < nsub; ++j) {
        float lo = 0.0f, hi = 0.0f;
        for (int t = 0; t < len; ++t) {
            lo = std::min(lo, x[j * len + t]);
            hi = std::max(hi, x[j * len + t]);
        }
        mn[j] = lo;
        mx[j] = hi;
        maxneg = std::max(maxneg, -lo);
    }
    f.dmin = fp16_round_up(maxneg / float(scale_max));
    const float dmin = fp16_to_fp32(f.dmin);
    float dm[16], span[16], maxspan = 0.0f;
    for (int j = 0; j < nsub; ++j) {
        f.m[j] = dmin > 0.0f ? uint8_t(std::min(float(scale_max), std::ceil(-mn[j] / dmin))) : 0;
        dm[j] = dmin * float(f.m[j]);
        span[j] = std::max(0.0f, mx[j] + dm[j]);
        maxspan = std::max(maxspan, span[j]);
    }
    f.d = fp16_round_up(maxspan / float(qmax * scale_max));
    const float d = fp16_to_fp32(f.d);
    for (int j = 0; j < nsub; ++j) {
        f.sc[j] = d > 0.0f ? uint8_t(std::min(float(scale_max), std::ceil(span[j] / (float(qmax) * d)))) : 0;
        const float ds = d * float(f.sc[j]);
        for (int t = 0; t < len; ++t) {
            const float v = x[j * len + t];
            f.q[j * len + t] = ds > 0.0f ? uint8_t(round_clamp((v + dm[j]) / ds, 0, qmax)) : 0;
        }
    }
}

void pack_q4_k(const KFit& f, BlockQ4_K* y) {
    store_u16(y->d, f.d);
    store_u16(y->dmin, f.dmin);
    for (int k = 0; k < 4; ++k) {
        y->scales[k] = uint8_t((f.sc[k] & 63) | ((f.sc[k + 4] >> 4) << 6));
        y->scales[k + 4] = uint8_t((f.m[k] & 63) | ((f.m[k + 4] >> 4) << 6));
        y->scales[k + 8] = uint8_t((f.sc[k + 4] & 0xF) | ((f.m[k + 4] & 0xF) << 4));
    }
    for (int c = 0; c < 4; ++c)
        for (int t = 0; t < 32; ++t)
            y->qs[32 * c + t] = uint8_t(f.q[64 * c + t] | f.q[64 * c + 32 + t] << 4);
}

void pack_q2_k(const KFit& f, BlockQ2_K* y) {
    store_u16(y->d, f.d);
    store_u16(y->dmin, f.dmin);
    for (int k = 0; k < 16; ++k) y->scales[k] = uint8_t(f.sc[k] | f.m[k] << 4);
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            uint8_t b = 0;
            for (int j = 0; j < 4; ++j) b = uint8_t(b | f.q[128 * h + 32 * j + l] << (2 * j));
            y->qs[32 * h + l] = b;
        }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, size_t nb) {
    KFit f;
    for (size_t i = 0; i < nb; ++i, ++y, x += QK_K) {
        fit_kquant(x, 8, 15, 63, f);
        pack_q4_k(f, y);
    }
}

void quantize_q2_k(const float* x, BlockQ2_K* y, size_t nb) {
    KFit f;
    for (size_t i = 0; i < nb; ++i, ++y, x += QK_K) {
        fit_kquant(x, 16, 3, 15, f);
        pack_q2_k(f, y);
    }
}

// ---- MXFP4 -------------------------------------------------------------------------------
// Shared exponent: the smallest e with 12 * 2^(e-128) >= amax (the largest magnitude fits,
// nothing saturates unless amax exceeds the format), then each value takes the nearest
// code (ties go to the smaller magnitude). |error| <= max(s/2, |x|/4) with s = 2^(e-128).
uint8_t mxfp4_exponent(float amax) {
    if (!(amax > 0.0f)) return 0;
    if (!std::isfinite(amax)) return 254;
    int k;
    std::frexp(amax, &k);  // amax in [2^(k-1), 2^k)
    int p = k - 5;         // amax/12 >= 2^(k-5)
    while (std::ldexp(12.0f, p) < amax) ++p;
    return uint8_t(std::clamp(p + 128, 0, 254));
}

uint8_t mxfp4_code(float v) {  // v in units of the block scale
    static const float kMid[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
    const float a = std::fabs(v);
    uint8_t c = 0;
    while (c < 7 && a > kMid[c]) ++c;
    return (v < 0.0f && c != 0) ? uint8_t(c | 8) : c;
}

void quantize_mxfp4(const float* x, BlockMXFP4* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++y, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
        y->e = mxfp4_exponent(amax);
        const float s = e8m0_to_fp32_half(y->e);
        for (int j = 0; j < QK_MXFP4 / 2; ++j)
            y->qs[j] = uint8_t(mxfp4_code(x[j] / s) | mxfp4_code(x[j + QK_MXFP4 / 2] / s) << 4);
    }
}

// ---- IQ2_XXS -------------------------------------------------------------------------------
// Deliberately crude (not ggml's quantiser, which searches a neighbourhood of grid points
// with importance weights): each group of 32 takes its scale from a few candidates around
// amax/43, every 8 values take the signs of the input (the one with the smallest |x| is
// flipped when the parity rule demands it) and the grid point nearest in least squares.
// Good enough for tests; synthetic models use random_row for this type.
struct GridNorms {
    float sq[256];  // sum of squared magnitudes of each grid entry
    GridNorms() {
        for (int i = 0; i < 256; ++i) {
            float s = 0.0f;
            for (int t = 0; t < 8; ++t) s += float(iq2xxs_grid_value(uint32_t(i), t)) * float(iq2xxs_grid_value(uint32_t(i), t));
            sq[i] = s;
        }
    }
};

struct Iq2Sub {
    uint8_t index;
    uint8_t sign_idx;
    float err;
};

// Best encoding of 8 values x with group scale db.
Iq2Sub iq2_encode8(const float* x, float db) {
    static const GridNorms norms;
    float a[8];
    uint32_t neg = 0;
    int smallest = 0;
    for (int t = 0; t < 8; ++t) {
        a[t] = std::fabs(x[t]);
        if (x[t] < 0.0f) neg |= 1u << t;
        if (a[t] < a[smallest]) smallest = t;
    }
    if (std::popcount(neg) & 1) {  // odd number of negatives: flip the smallest value's sign
        neg ^= 1u << smallest;
        a[smallest] = -a[smallest];
    }
    float best = INFINITY;
    int best_i = 0;
    for (int i = 0; i < 256; ++i) {
        float dot = 0.0f;
        for (int t = 0; t < 8; ++t) dot += a[t] * float(iq2xxs_grid_value(uint32_t(i), t));
        const float e = db * db * norms.sq[i] - 2.0f * db * dot;  // + sum a^2, constant
        if (e < best) {
            best = e;
            best_i = i;
        }
    }
    float a2 = 0.0f;
    for (int t = 0; t < 8; ++t) a2 += a[t] * a[t];
    return {uint8_t(best_i), uint8_t(neg & 127), best + a2};
}

void quantize_iq2_xxs(const float* x, BlockIQ2_XXS* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++y, x += QK_K) {
        float gscale[8];
        for (int g = 0; g < 8; ++g) {
            const float* xg = x + 32 * g;
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xg[j]));
            float best = INFINITY;
            gscale[g] = 0.0f;
            if (amax == 0.0f) continue;
            for (float f : {0.75f, 0.875f, 1.0f}) {
                const float s = f * amax / 43.0f;
                float e = 0.0f;
                for (int l = 0; l < 4; ++l) e += iq2_encode8(xg + 8 * l, s).err;
                if (e < best) {
                    best = e;
                    gscale[g] = s;
                }
            }
        }
        // db = d * (2 ls + 1) / 8: the largest group scale sets d with ls = 15.
        const float maxs = *std::max_element(gscale, gscale + 8);
        const uint16_t dh = fp32_to_fp16(maxs * 8.0f / 31.0f);
        store_u16(y->d, dh);
        const float d = fp16_to_fp32(dh);
        for (int g = 0; g < 8; ++g) {
            const uint32_t ls = d > 0.0f ? uint32_t(round_clamp((gscale[g] * 8.0f / d - 1.0f) * 0.5f, 0, 15)) : 0;
            const float db = d * (0.5f + float(ls)) * 0.25f;
            uint32_t a0 = 0, a1 = ls << 28;
            for (int l = 0; l < 4; ++l) {
                const Iq2Sub s = iq2_encode8(x + 32 * g + 8 * l, db);
                a0 |= uint32_t(s.index) << (8 * l);
                a1 |= uint32_t(s.sign_idx) << (7 * l);
            }
            store_u32(y->qs + 8 * g, a0);
            store_u32(y->qs + 8 * g + 4, a1);
        }
    }
}

}  // namespace

void quantize_row(Type t, const float* src, void* dst, size_t n) {
    const size_t nb = row_blocks("quantize_row", t, n);
    uint8_t* out = static_cast<uint8_t*>(dst);
    switch (t) {
        case Type::F32:
            std::memcpy(dst, src, n * sizeof(float));
            return;
        case Type::F16:
            for (size_t i = 0; i < n; ++i) store_f16(out + 2 * i, src[i]);
            return;
        case Type::BF16:
            for (size_t i = 0; i < n; ++i) store_u16(out + 2 * i, fp32_to_bf16(src[i]));
            return;
        case Type::Q8_0: return quantize_q8_0(src, reinterpret_cast<BlockQ8_0*>(out), nb);
        case Type::Q8_K: return quantize_q8_k(src, reinterpret_cast<BlockQ8_K*>(out), nb);
        case Type::Q4_K: return quantize_q4_k(src, reinterpret_cast<BlockQ4_K*>(out), nb);
        case Type::Q2_K: return quantize_q2_k(src, reinterpret_cast<BlockQ2_K*>(out), nb);
        case Type::MXFP4: return quantize_mxfp4(src, reinterpret_cast<BlockMXFP4*>(out), nb);
        case Type::IQ2_XXS: return quantize_iq2_xxs(src, reinterpret_cast<BlockIQ2_XXS*>(out), nb);
        case Type::I32: break;
    }
    fail("quantize_row: cannot quantise to ", traits(t).name);
}

// Random valid blocks. For the 2-bit types (and Q4_K) these are not quantised from any
// float data: random valid blocks are what a synthetic model needs, and they exercise every
// code path of the dot products. The scales are chosen so |value| <= scale (up to f16
// rounding of the block scales, a relative 2^-11).
void random_row(Type t, void* dst, size_t n, uint64_t seed, float scale) {
    const size_t nb = row_blocks("random_row", t, n);
    SplitMix64 rng{seed};
    uint8_t* out = static_cast<uint8_t*>(dst);
    auto random_bytes = [&](uint8_t* p, size_t len) {
        for (size_t k = 0; k < len; ++k) p[k] = uint8_t(rng.next() >> 56);
    };
    switch (t) {
        case Type::F32:
            for (size_t i = 0; i < n; ++i) store_f32(out + 4 * i, scale * rng.sym());
            return;
        case Type::F16:
            for (size_t i = 0; i < n; ++i) store_f16(out + 2 * i, scale * rng.sym());
            return;
        case Type::BF16:
            for (size_t i = 0; i < n; ++i) store_u16(out + 2 * i, fp32_to_bf16(scale * rng.sym()));
            return;
        case Type::Q8_0: {
            auto* b = reinterpret_cast<BlockQ8_0*>(out);
            for (size_t i = 0; i < nb; ++i, ++b) {
                store_f16(b->d, scale / 127.0f);
                for (int j = 0; j < QK8_0; ++j) b->qs[j] = int8_t(rng.range(-127, 127));
            }
            return;
        }
        case Type::Q8_K: {
            auto* b = reinterpret_cast<BlockQ8_K*>(out);
            for (size_t i = 0; i < nb; ++i, ++b) {
                store_f32(b->d, scale / 127.0f);
                for (int j = 0; j < QK_K; ++j) b->qs[j] = int8_t(rng.range(-127, 127));
                for (int j = 0; j < QK_K / 16; ++j) {
                    int s = 0;
                    for (int k = 0; k < 16; ++k) s += b->qs[16 * j + k];
                    store_i16(b->bsums + 2 * j, int16_t(s));
                }
            }
            return;
        }
        case Type::Q4_K: {
            // value = d*sc*q - dmin*m with dmin = 15 d and m = sc/2: centred on zero,
            // |value| <= 15 d * 64/2 = scale.
            auto* b = reinterpret_cast<BlockQ4_K*>(out);
            const float d = 2.0f * scale / (15.0f * 64.0f);
            for (size_t i = 0; i < nb; ++i, ++b) {
                KFit f;
                f.d = fp32_to_fp16(d);
                f.dmin = fp32_to_fp16(15.0f * fp16_to_fp32(f.d));
                for (int j = 0; j < 8; ++j) {
                    f.sc[j] = uint8_t(rng.range(16, 63));
                    f.m[j] = uint8_t(f.sc[j] / 2);
                }
                for (int k = 0; k < QK_K; ++k) f.q[k] = uint8_t(rng.next() >> 60);
                pack_q4_k(f, b);
            }
            return;
        }
        case Type::Q2_K: {
            // value = d*sc*q - dmin*m with dmin = 1.5 d and m = sc: d*sc*(q - 1.5),
            // |value| <= 1.5 d * 15 = scale.
            auto* b = reinterpret_cast<BlockQ2_K*>(out);
            const float d = scale / 22.5f;
            for (size_t i = 0; i < nb; ++i, ++b) {
                store_f16(b->d, d);
                store_f16(b->dmin, 1.5f * load_f16(b->d));
                for (int k = 0; k < 16; ++k) {
                    const int sc = rng.range(4, 15);
                    b->scales[k] = uint8_t(sc | sc << 4);
                }
                random_bytes(b->qs, sizeof(b->qs));
            }
            return;
        }
        case Type::IQ2_XXS: {
            // Random grid indices, sign indices and 4-bit group scales: |value| <=
            // d * 31/8 * 43 = scale.
            auto* b = reinterpret_cast<BlockIQ2_XXS*>(out);
            for (size_t i = 0; i < nb; ++i, ++b) {
                store_f16(b->d, scale * 8.0f / (31.0f * 43.0f));
                for (int g = 0; g < 8; ++g) {
                    const uint32_t a0 = uint32_t(rng.next() >> 32);
                    const uint32_t a1 = uint32_t(rng.next() >> 32);  // 4 sign indices + ls
                    store_u32(b->qs + 8 * g, a0);
                    store_u32(b->qs + 8 * g + 4, a1);
                }
            }
            return;
        }
        case Type::MXFP4: {
            // e: the largest code (12 * 2^(e-128)) in (scale/2, scale].
            uint8_t e = 0;
            if (scale > 0.0f && std::isfinite(scale)) {
                int k;
                std::frexp(scale / 12.0f, &k);  // scale/12 in [2^(k-1), 2^k)
                e = uint8_t(std::clamp(k - 1 + 128, 0, 254));
            }
            auto* b = reinterpret_cast<BlockMXFP4*>(out);
            for (size_t i = 0; i < nb; ++i, ++b) {
                b->e = e;
                random_bytes(b->qs, sizeof(b->qs));
            }
            return;
        }
        case Type::I32: break;
    }
    fail("random_row: no random blocks for ", traits(t).name);
}

size_t act_bytes(Type t, size_t n) {
    const Type a = traits(t).vec_dot_type;
    if (a == Type::I32) fail("act_bytes: type ", traits(t).name, " has no dot product");
    if (a == Type::F32) return n * sizeof(float);
    return row_bytes(a, n);
}

void quantize_act(Type t, const float* x, void* dst, size_t n) {
    const Type a = traits(t).vec_dot_type;
    switch (a) {
        case Type::F32: std::memcpy(dst, x, n * sizeof(float)); return;
        case Type::Q8_0:
        case Type::Q8_K: quantize_row(a, x, dst, n); return;
        default: break;
    }
    fail("quantize_act: type ", traits(t).name, " has no dot product");
}

}  // namespace dsv4::quant
