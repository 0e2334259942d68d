// Type traits and scalar float conversions. Block sizes are the GGUF/ggml definitions.
#include <bit>
#include <string>

#include "dsv4/common.h"
#include "dsv4/quant.h"

namespace dsv4::quant {

namespace {
// clang-format off
const TypeTraits kTraits[] = {
    {Type::F32,     "F32",     1,   4,   false, Type::F32},
    {Type::F16,     "F16",     1,   2,   false, Type::F32},
    {Type::BF16,    "BF16",    1,   2,   false, Type::F32},
    {Type::I32,     "I32",     1,   4,   false, Type::I32},
    {Type::Q8_0,    "Q8_0",    32,  34,  true,  Type::Q8_0},
    {Type::Q2_K,    "Q2_K",    256, 84,  true,  Type::Q8_K},
    {Type::Q4_K,    "Q4_K",    256, 144, true,  Type::Q8_K},
    {Type::Q8_K,    "Q8_K",    256, 292, true,  Type::Q8_K},
    {Type::IQ2_XXS, "IQ2_XXS", 256, 66,  true,  Type::Q8_K},
    {Type::MXFP4,   "MXFP4",   32,  17,  true,  Type::Q8_0},
};
// clang-format on
}  // namespace

const TypeTraits* traits(uint32_t type_id) {
    for (const auto& t : kTraits)
        if (uint32_t(t.type) == type_id) return &t;
    return nullptr;
}

const TypeTraits& traits(Type t) {
    const TypeTraits* p = traits(uint32_t(t));
    if (!p) fail("unknown tensor type id ", uint32_t(t));
    return *p;
}

const char* type_name(uint32_t type_id) {
    const TypeTraits* p = traits(type_id);
    if (p) return p->name;
    static thread_local std::string s;
    s = "type " + std::to_string(type_id);
    return s.c_str();
}

size_t row_bytes(Type t, size_t n) {
    const TypeTraits& tr = traits(t);
    return (n + tr.block_elems - 1) / tr.block_elems * tr.block_bytes;
}

// IEEE half conversions done bit-wise so that results do not depend on the host's
// F16C support (and agree bit for bit with ggml's reference conversions).
float fp16_to_fp32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400) == 0);
            mant &= 0x3ff;
            bits = sign | uint32_t(127 - 15 - e) << 23 | mant << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    return std::bit_cast<float>(bits);
}

uint16_t fp32_to_fp16(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx > 0x7f800000) return uint16_t(sign | 0x7e00);  // NaN
    if (absx >= 0x477ff000) {                               // rounds to >= 65520: inf
        return uint16_t(sign | 0x7c00);
    }
    if (absx < 0x38800000) {  // below the smallest normal half: subnormal or zero
        // value = absx as float; half subnormal unit = 2^-24
        const float af = std::bit_cast<float>(absx);
        // round to nearest even multiple of 2^-24
        float scaled = af * 16777216.0f;  // exact (power of two)
        uint32_t q = uint32_t(scaled);
        float rem = scaled - float(q);
        if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
        return uint16_t(sign | q);
    }
    uint32_t exp = ((absx >> 23) - 127 + 15);
    uint32_t mant = absx & 0x7fffff;
    uint32_t h = exp << 10 | mant >> 13;
    uint32_t rest = mant & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
    return uint16_t(sign | h);
}

float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

uint16_t fp32_to_bf16(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffff) > 0x7f800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
    x += 0x7fff + ((x >> 16) & 1);
    return uint16_t(x >> 16);
}

}  // namespace dsv4::quant
