// fp16 / bf16 scalar conversions: subnormals, ties, overflow, inf and NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "dsv4/quant.h"

using namespace dsv4::quant;

namespace {
float bits_f(uint32_t b) { return std::bit_cast<float>(b); }
}  // namespace

TEST(QuantFp16, DecodeSpecials) {
    EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
    EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
    EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
    EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));          // smallest normal
    EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));          // smallest subnormal
    EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.0f, -24));       // largest subnormal
    EXPECT_EQ(fp16_to_fp32(0x8001), -std::ldexp(1.0f, -24));
    EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0xFC01)));
    const float nz = fp16_to_fp32(0x8000);
    EXPECT_EQ(nz, 0.0f);
    EXPECT_TRUE(std::signbit(nz));
}

TEST(QuantFp16, EncodeRoundsToNearestEven) {
    const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0 is 2^-11
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp1 / 2), 0x3C00);               // tie -> even (down)
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * ulp1 / 2), 0x3C02);           // tie -> even (up)
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp1 / 2 + std::ldexp(1.0f, -20)), 0x3C01);  // just above tie
    EXPECT_EQ(fp32_to_fp16(1.0f + ulp1 / 2 - std::ldexp(1.0f, -20)), 0x3C00);  // just below
    EXPECT_EQ(fp32_to_fp16(-1.0f - 3 * ulp1 / 2), 0xBC02);
    // Mantissa carry into the exponent: 2 - 2^-12 rounds up to 2.0.
    EXPECT_EQ(fp32_to_fp16(2.0f - std::ldexp(1.0f, -12)), 0x4000);
}

TEST(QuantFp16, EncodeSubnormalsAndZero) {
    EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);                 // tie -> even (0)
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0001f, -25)), 0x0001);             // above the tie
    EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);                 // 1.5 units -> 2
    EXPECT_EQ(fp32_to_fp16(std::ldexp(5.0f, -25)), 0x0002);                 // 2.5 units -> 2
    EXPECT_EQ(fp32_to_fp16(-std::ldexp(3.0f, -25)), 0x8002);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // tie into normal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.0f, -24)), 0x03FF);
    EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
    EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(QuantFp16, EncodeOverflowInfNan) {
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
    EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7BFF);   // below the halfway point 65520
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);   // tie with "65536" -> even -> inf
    EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
    EXPECT_EQ(fp32_to_fp16(-1e10f), 0xFC00);
    EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
    EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
    const uint16_t n = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(n & 0x7C00, 0x7C00);
    EXPECT_NE(n & 0x03FF, 0);
    EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(bits_f(0x7F800001u)))));  // signalling NaN stays NaN
}

TEST(QuantFp16, ExhaustiveRoundTrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = fp16_to_fp32(uint16_t(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(fp32_to_fp16(f), h) << std::hex << h;
    }
}

TEST(QuantFp16, AgreesWithF16C) {
#if defined(__F16C__)
    uint64_t s = 12345;
    for (int i = 0; i < 200000; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t b = uint32_t(s >> 32);
        // Bias towards the interesting exponent range of halves.
        if (i & 1) b = (b & 0x807FFFFFu) | ((100u + (b >> 23) % 60u) << 23);
        const float f = bits_f(b);
        if (std::isnan(f)) continue;
        const uint16_t hw = uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
        ASSERT_EQ(fp32_to_fp16(f), hw) << std::hex << b;
        ASSERT_EQ(std::bit_cast<uint32_t>(fp16_to_fp32(hw)), std::bit_cast<uint32_t>(_cvtsh_ss(hw)));
    }
#else
    GTEST_SKIP() << "built without F16C";
#endif
}

TEST(QuantFp16, Bf16) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
    EXPECT_EQ(bf16_to_fp32(0x4049), 3.140625f);
    EXPECT_EQ(fp32_to_bf16(bits_f(0x3F808000u)), 0x3F80);  // tie -> even (down)
    EXPECT_EQ(fp32_to_bf16(bits_f(0x3F818000u)), 0x3F82);  // tie -> even (up)
    EXPECT_EQ(fp32_to_bf16(bits_f(0x3F808001u)), 0x3F81);  // above the tie
    EXPECT_EQ(fp32_to_bf16(bits_f(0x7F7FFFFFu)), 0x7F80);  // FLT_MAX rounds to inf
    EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
    EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(bits_f(0x7F800001u)))));  // low-bit NaN stays NaN
    EXPECT_EQ(bf16_to_fp32(0x0001), std::ldexp(1.0f, -133));  // subnormal
    EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = bf16_to_fp32(uint16_t(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(fp32_to_bf16(f), h);
    }
}
