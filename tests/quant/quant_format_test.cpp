// Block formats: known-answer blocks (bytes built by hand, values worked out from the format
// definitions in model-spec §2.2), tables, quantise -> dequantise error bounds, random_row.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dsv4/common.h"
#include "dsv4/quant.h"
#include "quant/blocks.h"
#include "quant/iq2_tables.h"
#include "quant/quant_test_util.h"

using namespace dsv4::quant;

namespace {

std::vector<float> deq(Type t, const std::vector<uint8_t>& bytes, size_t n) {
    std::vector<float> y(n, NAN);
    dequantize_row(t, bytes.data(), y.data(), n);
    return y;
}

void put16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
    b[off] = uint8_t(v);
    b[off + 1] = uint8_t(v >> 8);
}
void put32(std::vector<uint8_t>& b, size_t off, uint32_t v) {
    for (int k = 0; k < 4; ++k) b[off + k] = uint8_t(v >> (8 * k));
}

using test::gaussian;
using test::kAllTypes;

}  // namespace

// ---- known answers ------------------------------------------------------------------------

TEST(QuantKnownAnswer, Float) {
    std::vector<uint8_t> h(8);
    put16(h, 0, 0x3C00);
    put16(h, 2, 0xC000);
    put16(h, 4, 0x7BFF);
    put16(h, 6, 0x0001);
    auto y = deq(Type::F16, h, 4);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -2.0f);
    EXPECT_EQ(y[2], 65504.0f);
    EXPECT_EQ(y[3], std::ldexp(1.0f, -24));
    std::vector<uint8_t> b(4);
    put16(b, 0, 0x3F80);
    put16(b, 2, 0xC049);
    y = deq(Type::BF16, b, 2);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -3.140625f);
    std::vector<uint8_t> f(4);
    put32(f, 0, 0x40490FDBu);
    EXPECT_EQ(deq(Type::F32, f, 1)[0], std::bit_cast<float>(0x40490FDBu));
}

TEST(QuantKnownAnswer, Q8_0) {
    std::vector<uint8_t> b(34);
    put16(b, 0, 0x3800);  // d = 0.5
    for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j - 16));
    b[2] = uint8_t(int8_t(-128));
    auto y = deq(Type::Q8_0, b, 32);
    EXPECT_EQ(y[0], -64.0f);
    for (int j = 1; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * float(j - 16)) << j;
}

TEST(QuantKnownAnswer, Q8_K) {
    std::vector<uint8_t> b(292);
    put32(b, 0, std::bit_cast<uint32_t>(-0.25f));
    for (int j = 0; j < 256; ++j) b[4 + j] = uint8_t(int8_t(j % 7 - 3));
    auto y = deq(Type::Q8_K, b, 256);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], -0.25f * float(j % 7 - 3)) << j;
}

// Q2_K: byte layout {scales[16], qs[64], d, dmin}; value i = 128h + 32j + 16s + t is
// d*(sc&15)*((qs[32h+16s+t] >> 2j) & 3) - dmin*(sc>>4) with sc = scales[8h+2j+s].
TEST(QuantKnownAnswer, Q2_K) {
    std::vector<uint8_t> b(84, 0);
    b[0] = 0x21;   // sub-block 0 (values 0..15): scale 1, min 2
    b[2] = 0x05;   // sub-block 2 (values 32..47: h0 j1 s0): scale 5, min 0
    b[6] = 0x17;   // sub-block 6 (values 96..111: h0 j3 s0): scale 7, min 1
    b[13] = 0x3A;  // sub-block 13 (values 208..223: h1 j2 s1): scale 10, min 3
    b[16 + 0] = 0xE4;       // qs[0]: planes 0,1,2,3 = 0,1,2,3 -> values 0, 32, 64, 96
    b[16 + 53] = 0x10;      // qs[53] = qs[32*1 + 16*1 + 5], plane 2 = 1 -> value 213
    put16(b, 80, 0x3C00);   // d = 1
    put16(b, 82, 0x3800);   // dmin = 0.5
    auto y = deq(Type::Q2_K, b, 256);
    std::vector<float> want(256, 0.0f);
    for (int i = 0; i < 16; ++i) want[i] = -1.0f;          // 1*1*0 - 0.5*2
    want[32] = 5.0f;                                        // 1*5*1 - 0
    want[64] = 0.0f;                                        // scale 0
    for (int i = 96; i < 112; ++i) want[i] = -0.5f;         // 1*7*0 - 0.5*1
    want[96] = 20.5f;                                       // 1*7*3 - 0.5
    for (int i = 208; i < 224; ++i) want[i] = -1.5f;        // 0 - 0.5*3
    want[213] = 8.5f;                                       // 10*1 - 1.5
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

// Q4_K: {d, dmin, scales[12], qs[128]}; 6-bit (sc, m) per sub-block of 32, packed.
TEST(QuantKnownAnswer, Q4_K) {
    std::vector<uint8_t> b(144, 0);
    put16(b, 0, 0x3800);  // d = 0.5
    put16(b, 2, 0x3400);  // dmin = 0.25
    uint8_t* s = b.data() + 4;
    s[1] = 3;     // sub-block 1: sc = 3
    s[5] = 5;     //              m = 5
    // sub-block 6: sc = 42 = 0b10'1010, m = 49 = 0b11'0001
    s[10] = 0x1A;  // low nibbles: sc & 15 = 0xA, m & 15 = 0x1
    s[2] = 0x80;   // top bits of sc (2) in scales[6-4] bits 6..7; sub-block 2's own sc = 0
    s[6] = 0xC0;   // top bits of m (3) in scales[6] bits 6..7; sub-block 2's own m = 0
    uint8_t* q = b.data() + 16;
    q[0] = 0x70;       // value 0: q 0 (sub-block 0, low nibble); value 32: q 7 (sub-block 1)
    q[5] = 0xF0;       // value 37: q 15
    q[96 + 3] = 0x09;  // value 195 (sub-block 6, low nibble of chunk 3): q 9
    auto y = deq(Type::Q4_K, b, 256);
    std::vector<float> want(256, 0.0f);
    for (int i = 32; i < 64; ++i) want[i] = -1.25f;    // 0.5*3*0 - 0.25*5
    want[32] = 9.25f;                                  // 1.5*7 - 1.25
    want[37] = 21.25f;                                 // 1.5*15 - 1.25
    for (int i = 192; i < 224; ++i) want[i] = -12.25f;  // 0 - 0.25*49
    want[195] = 176.75f;                               // 0.5*42*9 - 12.25
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], want[i]) << i;
}

// IQ2_XXS: {d, 8 groups of (u32 grid bytes, u32 signs|ls<<28)}.
TEST(QuantKnownAnswer, IQ2_XXS) {
    std::vector<uint8_t> b(66, 0);
    put16(b, 0, 0x3C00);  // d = 1
    // group 0: grid indices 1, 0, 2, 255; sign indices 1, 0, 3, 127; ls = 3 -> db = 0.875
    put32(b, 2, 0xFF020001u);
    put32(b, 6, (3u << 28) | 1u | (0u << 7) | (3u << 14) | (127u << 21));
    // group 7: all zero indices and signs, ls = 15 -> db = 3.875
    put32(b, 2 + 56, 0);
    put32(b, 2 + 60, 15u << 28);
    auto y = deq(Type::IQ2_XXS, b, 256);
    // grid[1] = 0x080808080808082b (byte 0 = 43); ksigns[1] = 0x81: weights 0 and 7 negative
    const float g0[8] = {-37.625f, 7, 7, 7, 7, 7, 7, -7};
    // grid[0] = all 8, no signs
    const float g1[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    // grid[2] = 0x0808080808081919; ksigns[3] = 3: weights 0, 1 negative
    const float g2[8] = {-21.875f, -21.875f, 7, 7, 7, 7, 7, 7};
    // grid[255] = 0x2b2b2b1908081908; ksigns[127] = 0xff: all negative
    const float g3[8] = {-7, -21.875f, -7, -7, -21.875f, -37.625f, -37.625f, -37.625f};
    for (int t = 0; t < 8; ++t) {
        EXPECT_EQ(y[t], g0[t]) << t;
        EXPECT_EQ(y[8 + t], g1[t]) << t;
        EXPECT_EQ(y[16 + t], g2[t]) << t;
        EXPECT_EQ(y[24 + t], g3[t]) << t;
    }
    for (int i = 32; i < 224; ++i) EXPECT_EQ(y[i], 1.0f) << i;  // ls 0: 0.125 * 8
    for (int i = 224; i < 256; ++i) EXPECT_EQ(y[i], 31.0f) << i;
}

// MXFP4: {e, qs[16]}; e = 127 is scale 1 for the E2M1 values, i.e. ggml's doubled values
// times 2^(127-128).
TEST(QuantKnownAnswer, MXFP4) {
    std::vector<uint8_t> b(17 * 3, 0);
    b[0] = 127;
    for (int j = 0; j < 16; ++j) b[1 + j] = uint8_t(j | (15 - j) << 4);
    b[17] = 130;          // scale 2^2
    b[18] = 0x07;         // element 0: code 7 (12 * 4 = 48), element 16: code 0
    b[17 + 1 + 15] = 0xE0;  // element 15: code 0; element 31: code 14 (-8 * 4)
    b[34] = 0;            // scale 2^-128 (a subnormal float)
    b[35] = 0x91;         // element 0: code 1 -> 2^-128; element 16: code 9 -> -2^-128
    auto y = deq(Type::MXFP4, b, 96);
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], e2m1[j]) << j;
        EXPECT_EQ(y[16 + j], e2m1[15 - j]) << j;
    }
    EXPECT_EQ(y[32], 48.0f);
    EXPECT_EQ(y[48], 0.0f);
    EXPECT_EQ(y[47], 0.0f);
    EXPECT_EQ(y[63], -32.0f);
    EXPECT_EQ(y[64], std::ldexp(1.0f, -128));
    EXPECT_EQ(y[80], -std::ldexp(1.0f, -128));
    EXPECT_EQ(detail::e8m0_to_fp32_half(255), std::ldexp(1.0f, 127));
    EXPECT_EQ(detail::e8m0_to_fp32_half(1), std::ldexp(1.0f, -127));
}

TEST(QuantKnownAnswer, RejectsBadArguments) {
    std::vector<uint8_t> b(1024);
    std::vector<float> y(256);
    EXPECT_THROW(dequantize_row(Type::Q8_0, b.data(), y.data(), 33), dsv4::Error);
    EXPECT_THROW(dequantize_row(Type::I32, b.data(), y.data(), 4), dsv4::Error);
    EXPECT_THROW(quantize_row(Type::Q4_K, y.data(), b.data(), 32), dsv4::Error);
    EXPECT_THROW(vec_dot(Type::Q2_K, b.data(), b.data(), 128), dsv4::Error);
    EXPECT_THROW(act_bytes(Type::I32, 4), dsv4::Error);
}

// ---- tables -------------------------------------------------------------------------------

TEST(QuantIq2Tables, Signs) {
    // Spot values of ggml's ksigns_iq2xs table.
    EXPECT_EQ(detail::kSignsIq2xs[0], 0);
    EXPECT_EQ(detail::kSignsIq2xs[1], 129);
    EXPECT_EQ(detail::kSignsIq2xs[2], 130);
    EXPECT_EQ(detail::kSignsIq2xs[3], 3);
    EXPECT_EQ(detail::kSignsIq2xs[16], 144);
    EXPECT_EQ(detail::kSignsIq2xs[126], 126);
    EXPECT_EQ(detail::kSignsIq2xs[127], 255);
    for (int i = 0; i < 128; ++i) {
        EXPECT_EQ(std::popcount(unsigned(detail::kSignsIq2xs[i])) % 2, 0);
        EXPECT_EQ(detail::kSignsIq2xs[i] & 127, i);
        for (int t = 0; t < 8; ++t) {
            const uint8_t byte = uint8_t(detail::kSignBytesIq2xs[i] >> (8 * t));
            EXPECT_EQ(byte, (detail::kSignsIq2xs[i] >> t) & 1 ? 0xff : 0x01);
        }
    }
}

TEST(QuantIq2Tables, Grid) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the little-endian bytes
    for (int i = 0; i < 256; ++i) {
        if (i > 0) {
            EXPECT_LT(detail::kIq2xxsGrid[i - 1], detail::kIq2xxsGrid[i]);  // sorted, unique
        }
        for (int t = 0; t < 8; ++t) {
            const uint8_t v = detail::iq2xxs_grid_value(uint32_t(i), t);
            EXPECT_TRUE(v == 8 || v == 25 || v == 43) << i;
            h = (h ^ v) * 0x100000001b3ull;
        }
    }
    EXPECT_EQ(detail::kIq2xxsGrid[0], 0x0808080808080808ull);
    EXPECT_EQ(detail::kIq2xxsGrid[255], 0x2b2b2b1908081908ull);
    // Checksum of the ggml codebook (checked against two independent published copies).
    EXPECT_EQ(h, 0xbb4ee025b5ac6e8eull);
}

// ---- Q8_K ---------------------------------------------------------------------------------

TEST(QuantQ8K, BsumsAndSignedMax) {
    for (uint64_t seed : {1ull, 2ull, 3ull}) {
        auto x = gaussian(1024, seed, 2.0f);
        x[17] = seed == 2 ? 9.0f : -9.0f;  // the largest magnitude, either sign
        std::vector<uint8_t> q(row_bytes(Type::Q8_K, 1024));
        quantize_row(Type::Q8_K, x.data(), q.data(), 1024);
        const auto* b = reinterpret_cast<const detail::BlockQ8_K*>(q.data());
        for (int blk = 0; blk < 4; ++blk) {
            for (int j = 0; j < 16; ++j) {
                int s = 0;
                for (int t = 0; t < 16; ++t) s += b[blk].qs[16 * j + t];
                EXPECT_EQ(detail::load_i16(b[blk].bsums + 2 * j), s);
            }
        }
        // The signed max maps to -127 and d = -max/127 (negative for a positive max).
        EXPECT_EQ(b[0].qs[17], -127);
        EXPECT_FLOAT_EQ(detail::load_f32(b[0].d), -x[17] / 127.0f);
    }
}

TEST(QuantQ8K, TiesZeroAndClamp) {
    std::vector<float> x(256, 0.0f);
    x[0] = -127.0f;  // max = -127 -> iscale = 1, d = 1
    x[1] = 2.5f;
    x[2] = 3.5f;
    x[3] = -2.5f;
    x[4] = -0.5f;
    x[5] = 126.5f;
    std::vector<uint8_t> q(292);
    quantize_row(Type::Q8_K, x.data(), q.data(), 256);
    const auto* b = reinterpret_cast<const detail::BlockQ8_K*>(q.data());
    EXPECT_EQ(detail::load_f32(b->d), 1.0f);
    EXPECT_EQ(b->qs[0], -127);
    EXPECT_EQ(b->qs[1], 2);
    EXPECT_EQ(b->qs[2], 4);
    EXPECT_EQ(b->qs[3], -2);
    EXPECT_EQ(b->qs[4], 0);
    EXPECT_EQ(b->qs[5], 126);
    EXPECT_EQ(detail::load_i16(b->bsums), -127 + 2 + 4 - 2 + 126);
    // All-zero slice: d = 0, q = 0.
    std::fill(x.begin(), x.end(), 0.0f);
    quantize_row(Type::Q8_K, x.data(), q.data(), 256);
    for (uint8_t v : q) EXPECT_EQ(v, 0);
}

// round_clamp (nearbyint, branch-free, so the quantisers' loops vectorise) is round_half_even
// clamped, NaN to 0: every half-integer and its neighbours in [-300, 300], a sweep over the
// float bit patterns (every 65,537th: normals, subnormals, large, infinities, NaNs), and the
// clamp bounds of every quantiser.
TEST(QuantRounding, RoundClampIsRoundHalfEvenClamped) {
    auto ref = [](float x, int lo, int hi) {
        if (std::isnan(x)) return 0;
        const float r = detail::round_half_even(x);
        return r < float(lo) ? lo : r > float(hi) ? hi : int(r);
    };
    const std::pair<int, int> bounds[] = {{-128, 127}, {0, 15}, {0, 3}, {0, 63}};
    std::vector<float> xs;
    for (int i = -600; i <= 600; ++i) {
        const float h = float(i) * 0.5f;
        xs.insert(xs.end(), {h, std::nextafter(h, -1e9f), std::nextafter(h, 1e9f)});
    }
    for (uint64_t u = 0; u < (1ull << 32); u += 65537) {
        const uint32_t b = uint32_t(u);
        xs.push_back(std::bit_cast<float>(b));
    }
    xs.insert(xs.end(), {INFINITY, -INFINITY, NAN, 8388608.5f, -8388609.0f, 1e30f, -1e30f});
    for (const auto& [lo, hi] : bounds)
        for (float x : xs) ASSERT_EQ(detail::round_clamp(x, lo, hi), ref(x, lo, hi)) << x << " in [" << lo << ", " << hi << "]";
}

TEST(QuantRoundTrip, Q8_0TiesAndZero) {
    std::vector<float> x(32, 0.0f);
    x[0] = 127.0f;  // d = 1
    x[1] = 2.5f;
    x[2] = -3.5f;
    x[3] = 0.5f;
    std::vector<uint8_t> q(34);
    quantize_row(Type::Q8_0, x.data(), q.data(), 32);
    const auto* b = reinterpret_cast<const detail::BlockQ8_0*>(q.data());
    EXPECT_EQ(detail::load_f16(b->d), 1.0f);
    EXPECT_EQ(b->qs[0], 127);
    EXPECT_EQ(b->qs[1], 2);
    EXPECT_EQ(b->qs[2], -4);
    EXPECT_EQ(b->qs[3], 0);
    std::fill(x.begin(), x.end(), 0.0f);
    quantize_row(Type::Q8_0, x.data(), q.data(), 32);
    for (uint8_t v : q) EXPECT_EQ(v, 0);
}

// ---- quantise -> dequantise error bounds --------------------------------------------------

namespace {

struct RoundTrip {
    std::vector<float> x, y;
    std::vector<uint8_t> q;
};

RoundTrip round_trip(Type t, const std::vector<float>& x) {
    RoundTrip r{x, std::vector<float>(x.size()), std::vector<uint8_t>(row_bytes(t, x.size()))};
    quantize_row(t, x.data(), r.q.data(), x.size());
    dequantize_row(t, r.q.data(), r.y.data(), x.size());
    return r;
}

// Data sets every bound must hold on: Gaussian at several scales, one-signed, constant,
// zero, and blocks with one outlier.
std::vector<std::vector<float>> data_sets() {
    std::vector<std::vector<float>> sets;
    sets.push_back(gaussian(2048, 11, 1.0f));
    sets.push_back(gaussian(2048, 12, 0.01f));
    sets.push_back(gaussian(2048, 13, 300.0f));
    auto pos = gaussian(2048, 14, 1.0f);
    for (auto& v : pos) v = std::fabs(v) + 0.5f;
    sets.push_back(pos);
    auto neg = gaussian(2048, 15, 1.0f);
    for (auto& v : neg) v = -std::fabs(v) - 0.1f;
    sets.push_back(neg);
    sets.push_back(std::vector<float>(2048, 0.75f));
    sets.push_back(std::vector<float>(2048, 0.0f));
    auto outl = gaussian(2048, 16, 0.1f);
    for (size_t i = 5; i < outl.size(); i += 97) outl[i] = 20.0f;
    sets.push_back(outl);
    return sets;
}

float amax_of(const std::vector<float>& x) {
    float a = 0.0f;
    for (float v : x) a = std::max(a, std::fabs(v));
    return a;
}

}  // namespace

TEST(QuantRoundTrip, FloatTypes) {
    for (const auto& x : data_sets()) {
        auto f = round_trip(Type::F32, x);
        EXPECT_EQ(f.x, f.y);
        auto h = round_trip(Type::F16, x);
        auto b = round_trip(Type::BF16, x);
        for (size_t i = 0; i < x.size(); ++i) {
            // Normal range: relative error <= half an ulp = 2^-11 (f16), 2^-8 (bf16).
            if (std::fabs(x[i]) >= std::ldexp(1.0f, -14))
                EXPECT_LE(std::fabs(h.y[i] - x[i]), std::ldexp(std::fabs(x[i]), -11));
            else
                EXPECT_LE(std::fabs(h.y[i] - x[i]), std::ldexp(1.0f, -25));
            EXPECT_LE(std::fabs(b.y[i] - x[i]), std::ldexp(std::fabs(x[i]), -8));
        }
    }
}

// Q8_0: q = round(x/d), d = amax/127, the block keeps d rounded to f16 (relative error
// <= 2^-11), so |y - x| <= d/2 + 127 * d * 2^-11 (+ float rounding).
TEST(QuantRoundTrip, Q8_0) {
    for (const auto& x : data_sets()) {
        auto r = round_trip(Type::Q8_0, x);
        for (size_t blk = 0; blk < x.size() / 32; ++blk) {
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * blk + j]));
            const float d = amax / 127.0f;
            const float bound = d * (0.5f + 127.0f / 2048.0f) + 1e-6f * amax;
            for (int j = 0; j < 32; ++j) ASSERT_LE(std::fabs(r.y[32 * blk + j] - x[32 * blk + j]), bound);
        }
    }
}

// Q8_K: q = round(x/d) exactly as the spec, d kept as f32: |y - x| <= |d|/2.
TEST(QuantRoundTrip, Q8_K) {
    for (const auto& x : data_sets()) {
        auto r = round_trip(Type::Q8_K, x);
        const auto* b = reinterpret_cast<const detail::BlockQ8_K*>(r.q.data());
        for (size_t blk = 0; blk < x.size() / 256; ++blk) {
            const float d = std::fabs(detail::load_f32(b[blk].d));
            for (int j = 0; j < 256; ++j)
                ASSERT_LE(std::fabs(r.y[256 * blk + j] - x[256 * blk + j]), 0.5f * d * 1.0001f + 1e-30f);
        }
    }
}

// Q4_K and Q2_K: the fitter makes every sub-block's representable range [-dmin*m,
// qmax*d*sc - dmin*m] cover its data, so each value is within half a step: |y - x| <=
// d*sc/2 (sc of the value's sub-block, read back from the block).
TEST(QuantRoundTrip, Q4_K) {
    double se = 0.0, sx = 0.0;
    for (const auto& x : data_sets()) {
        auto r = round_trip(Type::Q4_K, x);
        const auto* b = reinterpret_cast<const detail::BlockQ4_K*>(r.q.data());
        const float slack = 1e-6f * amax_of(x);
        for (size_t blk = 0; blk < x.size() / 256; ++blk) {
            const float d = detail::load_f16(b[blk].d);
            for (int j = 0; j < 8; ++j) {
                uint8_t sc, m;
                detail::q4k_scale_min(b[blk].scales, j, sc, m);
                for (int t = 0; t < 32; ++t) {
                    const size_t i = 256 * blk + 32 * j + t;
                    ASSERT_LE(std::fabs(r.y[i] - x[i]), 0.5f * d * float(sc) * 1.0001f + slack) << i;
                }
            }
        }
    }
    // Quality on Gaussian data: RMS error / RMS value (a 4-bit min/max fit gives ~0.08).
    auto x = gaussian(1 << 14, 99, 1.0f);
    auto r = round_trip(Type::Q4_K, x);
    for (size_t i = 0; i < x.size(); ++i) {
        se += double(r.y[i] - x[i]) * (r.y[i] - x[i]);
        sx += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(se / sx), 0.12);  // measured 0.076
}

TEST(QuantRoundTrip, Q2_K) {
    for (const auto& x : data_sets()) {
        auto r = round_trip(Type::Q2_K, x);
        const auto* b = reinterpret_cast<const detail::BlockQ2_K*>(r.q.data());
        const float slack = 1e-6f * amax_of(x);
        for (size_t blk = 0; blk < x.size() / 256; ++blk) {
            const float d = detail::load_f16(b[blk].d);
            for (int k = 0; k < 16; ++k)
                for (int t = 0; t < 16; ++t) {
                    const size_t i = 256 * blk + 16 * k + t;
                    ASSERT_LE(std::fabs(r.y[i] - x[i]), 0.5f * d * float(b[blk].scales[k] & 15) * 1.0001f + slack) << i;
                }
        }
    }
    double se = 0.0, sx = 0.0;
    auto x = gaussian(1 << 14, 98, 1.0f);
    auto r = round_trip(Type::Q2_K, x);
    for (size_t i = 0; i < x.size(); ++i) {
        se += double(r.y[i] - x[i]) * (r.y[i] - x[i]);
        sx += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(se / sx), 0.45);  // measured 0.35: 4 levels over each 16-value range
}

// MXFP4: the shared exponent makes the largest magnitude fit (<= 12 s, s = 2^(e-128)) and
// values round to the nearest of {0,1,2,3,4,6,8,12}*s: half the local gap, so
// |y - x| <= max(s/2, |x|/4).
TEST(QuantRoundTrip, MXFP4) {
    for (const auto& x : data_sets()) {
        auto r = round_trip(Type::MXFP4, x);
        const auto* b = reinterpret_cast<const detail::BlockMXFP4*>(r.q.data());
        for (size_t blk = 0; blk < x.size() / 32; ++blk) {
            const float s = detail::e8m0_to_fp32_half(b[blk].e);
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * blk + j]));
            EXPECT_LE(amax, 12.0f * s);
            if (amax > 0.0f) {
                EXPECT_GT(amax, 6.0f * s);  // the smallest exponent that fits
            }
            for (int j = 0; j < 32; ++j) {
                const size_t i = 32 * blk + j;
                ASSERT_LE(std::fabs(r.y[i] - x[i]), std::max(0.5f * s, 0.25f * std::fabs(x[i])) * 1.000001f) << i;
            }
        }
    }
}

// IQ2_XXS: the crude quantiser has no tight per-element bound (only 256 of the 3^8 magnitude
// patterns exist); check it is a useful approximation: relative RMS error well below 1, and
// zero stays zero.
TEST(QuantRoundTrip, IQ2_XXS) {
    auto x = gaussian(4096, 97, 1.0f);
    auto r = round_trip(Type::IQ2_XXS, x);
    double se = 0.0, sx = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
        se += double(r.y[i] - x[i]) * (r.y[i] - x[i]);
        sx += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(se / sx), 0.45);  // measured 0.32
    auto z = round_trip(Type::IQ2_XXS, std::vector<float>(256, 0.0f));
    for (float v : z.y) EXPECT_EQ(v, 0.0f);
}

// ---- random_row ---------------------------------------------------------------------------

TEST(QuantRandom, ValidFiniteInRangeDeterministic) {
    const size_t n = 4096;
    for (Type t : kAllTypes) {
        for (float scale : {0.02f, 1.0f, 50.0f}) {
            std::vector<uint8_t> a(row_bytes(t, n)), b(row_bytes(t, n)), c(row_bytes(t, n));
            random_row(t, a.data(), n, 42, scale);
            random_row(t, b.data(), n, 42, scale);
            random_row(t, c.data(), n, 43, scale);
            EXPECT_EQ(a, b) << traits(t).name;
            EXPECT_NE(a, c) << traits(t).name;
            auto y = deq(t, a, n);
            float amax = 0.0f;
            double mean = 0.0;
            for (float v : y) {
                ASSERT_TRUE(std::isfinite(v)) << traits(t).name;
                amax = std::max(amax, std::fabs(v));
                mean += v;
            }
            mean /= double(n);
            EXPECT_LE(amax, scale * 1.002f) << traits(t).name << " scale " << scale;
            EXPECT_GE(amax, scale * 0.4f) << traits(t).name << " scale " << scale;
            EXPECT_LT(std::fabs(mean), 0.1 * scale) << traits(t).name;  // roughly centred
        }
    }
}

TEST(QuantRandom, FixedSeedBytes) {
    // The generator is part of synthetic-model reproducibility: pin a few bytes.
    std::vector<uint8_t> a(34);
    random_row(Type::Q8_0, a.data(), 32, 7, 1.0f);
    std::vector<uint8_t> b(34);
    random_row(Type::Q8_0, b.data(), 32, 7, 1.0f);
    EXPECT_EQ(a, b);
    EXPECT_EQ(detail::load_u16(a.data()), fp32_to_fp16(1.0f / 127.0f));
    detail::SplitMix64 r{0};
    EXPECT_EQ(r.next(), 0xe220a8397b1dcdafull);  // splitmix64 reference output for seed 0
}

TEST(QuantRandom, ActivationFormats) {
    EXPECT_EQ(act_bytes(Type::F16, 100), 400u);
    EXPECT_EQ(act_bytes(Type::F32, 7), 28u);
    EXPECT_EQ(act_bytes(Type::Q8_0, 64), 68u);
    EXPECT_EQ(act_bytes(Type::MXFP4, 64), 68u);
    EXPECT_EQ(act_bytes(Type::Q4_K, 512), 584u);
    EXPECT_EQ(act_bytes(Type::Q2_K, 256), 292u);
    EXPECT_EQ(act_bytes(Type::IQ2_XXS, 256), 292u);
    std::vector<float> x = gaussian(256, 5, 1.0f), y(256);
    quantize_act(Type::BF16, x.data(), y.data(), 256);
    EXPECT_EQ(x, y);
}
