// dequantize_row: the GGUF block formats to floats (model-spec §2.2). Where a value is
// d*q - m the multiply-add is an explicit std::fma, so every build gives the same bits
// whether or not the compiler may contract (-march=native) or the CPU has FMA.
#include <cmath>
#include <cstring>

#include "dsv4/common.h"
#include "dsv4/quant.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"

namespace dsv4::quant {

using namespace detail;

namespace {

void dequantize_q8_0(const BlockQ8_0* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b, y += QK8_0) {
        const float d = load_f16(b->d);
        for (int j = 0; j < QK8_0; ++j) y[j] = d * float(b->qs[j]);
    }
}

// Two halves of 128 values; in half h, byte qs[32h + l] carries four 2-bit values, plane
// j (bits 2j..2j+1) being value 128h + 32j + l. The 16 values 16k .. 16k+15 share scales[k].
void dequantize_q2_k(const BlockQ2_K* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b) {
        const float d = load_f16(b->d);
        const float dmin = load_f16(b->dmin);
        for (int h = 0; h < 2; ++h) {
            const uint8_t* q = b->qs + 32 * h;
            for (int j = 0; j < 4; ++j) {
                for (int s = 0; s < 2; ++s) {
                    const uint8_t sc = b->scales[8 * h + 2 * j + s];
                    const float dl = d * float(sc & 0xF);
                    const float ml = dmin * float(sc >> 4);
                    for (int t = 0; t < 16; ++t)
                        *y++ = std::fma(dl, float((q[16 * s + t] >> (2 * j)) & 3), -ml);
                }
            }
        }
    }
}

// Four chunks of 64 values; chunk c reads qs[32c .. 32c+31]: low nibbles are sub-block 2c,
// high nibbles sub-block 2c+1.
void dequantize_q4_k(const BlockQ4_K* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b) {
        const float d = load_f16(b->d);
        const float dmin = load_f16(b->dmin);
        for (int c = 0; c < 4; ++c) {
            const uint8_t* q = b->qs + 32 * c;
            for (int half = 0; half < 2; ++half) {
                uint8_t sc, m;
                q4k_scale_min(b->scales, 2 * c + half, sc, m);
                const float dl = d * float(sc);
                const float ml = dmin * float(m);
                for (int t = 0; t < 32; ++t) *y++ = std::fma(dl, float((q[t] >> (4 * half)) & 0xF), -ml);
            }
        }
    }
}

void dequantize_iq2_xxs(const BlockIQ2_XXS* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b) {
        const float d = load_f16(b->d);
        for (int g = 0; g < 8; ++g) {
            const uint32_t a0 = load_u32(b->qs + 8 * g);
            const uint32_t a1 = load_u32(b->qs + 8 * g + 4);
            const float db = d * (0.5f + float(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint32_t idx = (a0 >> (8 * l)) & 0xFF;
                const uint8_t signs = kSignsIq2xs[(a1 >> (7 * l)) & 127];
                for (int t = 0; t < 8; ++t) {
                    const float v = db * float(iq2xxs_grid_value(idx, t));
                    *y++ = (signs >> t) & 1 ? -v : v;
                }
            }
        }
    }
}

void dequantize_q8_k(const BlockQ8_K* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b, y += QK_K) {
        const float d = load_f32(b->d);
        for (int j = 0; j < QK_K; ++j) y[j] = d * float(b->qs[j]);
    }
}

void dequantize_mxfp4(const BlockMXFP4* b, float* y, size_t nb) {
    for (size_t i = 0; i < nb; ++i, ++b, y += QK_MXFP4) {
        const float d = e8m0_to_fp32_half(b->e);
        for (int j = 0; j < QK_MXFP4 / 2; ++j) {
            y[j] = d * float(kMxfp4Values[b->qs[j] & 0xF]);
            y[j + QK_MXFP4 / 2] = d * float(kMxfp4Values[b->qs[j] >> 4]);
        }
    }
}

}  // namespace

void dequantize_row(Type t, const void* src, float* dst, size_t n) {
    const size_t nb = row_blocks("dequantize_row", t, n);
    switch (t) {
        case Type::F32:
            std::memcpy(dst, src, n * sizeof(float));
            return;
        case Type::F16: {
            const uint8_t* p = static_cast<const uint8_t*>(src);
            for (size_t i = 0; i < n; ++i) dst[i] = load_f16(p + 2 * i);
            return;
        }
        case Type::BF16: {
            const uint8_t* p = static_cast<const uint8_t*>(src);
            for (size_t i = 0; i < n; ++i) dst[i] = load_bf16(p + 2 * i);
            return;
        }
        case Type::Q8_0: return dequantize_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
        case Type::Q2_K: return dequantize_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
        case Type::Q4_K: return dequantize_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
        case Type::IQ2_XXS: return dequantize_iq2_xxs(static_cast<const BlockIQ2_XXS*>(src), dst, nb);
        case Type::Q8_K: return dequantize_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
        case Type::MXFP4: return dequantize_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb);
        case Type::I32: break;
    }
    fail("dequantize_row: type ", traits(t).name, " has no float values");
}

}  // namespace dsv4::quant
