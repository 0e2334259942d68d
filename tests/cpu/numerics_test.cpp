// Known answers for the quantisation-aware numerics (model-spec §5.8, §5.10) and RoPE (§5.4).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/numerics.h"
#include "dsv4/model.h"

using namespace dsv4;

TEST(Numerics, E4M3Grid) {
    EXPECT_EQ(cpu::e4m3_round(0.0f), 0.0f);
    EXPECT_EQ(cpu::e4m3_round(448.0f), 448.0f);
    EXPECT_EQ(cpu::e4m3_round(-448.0f), -448.0f);
    EXPECT_EQ(cpu::e4m3_round(1.0f), 1.0f);
    EXPECT_EQ(cpu::e4m3_round(1.0625f), 1.0f);     // halfway 1 (code 56) / 1.125 (57): even code wins
    EXPECT_EQ(cpu::e4m3_round(1.1875f), 1.25f);    // halfway 1.125 (57) / 1.25 (58): even code wins
    EXPECT_EQ(cpu::e4m3_round(1.1f), 1.125f);
    EXPECT_EQ(cpu::e4m3_round(0x1p-9f), 0x1p-9f);  // smallest subnormal
    EXPECT_EQ(cpu::e4m3_round(0x1p-10f), 0.0f);    // halfway 0 / 2^-9: code 0 is even
    EXPECT_EQ(cpu::e4m3_round(3 * 0x1p-10f), 2 * 0x1p-9f);   // halfway codes 1 / 2: 2 is even
    EXPECT_EQ(cpu::e4m3_round(-300.0f), -288.0f);  // 256 + 32k steps: 288 nearest
    EXPECT_EQ(cpu::e4m3_round(416.0f), 416.0f);
}

TEST(Numerics, E2M1Grid) {
    EXPECT_EQ(cpu::e2m1_round(0.25f), 0.0f);    // tie 0 / 0.5 -> even code 0
    EXPECT_EQ(cpu::e2m1_round(0.75f), 1.0f);    // tie 0.5 (1) / 1 (2) -> 2
    EXPECT_EQ(cpu::e2m1_round(2.5f), 2.0f);     // tie 2 (4) / 3 (5) -> 4
    EXPECT_EQ(cpu::e2m1_round(5.0f), 4.0f);     // tie 4 (code 6) / 6 (code 7) -> even code 6
    EXPECT_EQ(cpu::e2m1_round(-1.3f), -1.5f);
    EXPECT_EQ(cpu::e2m1_round(6.0f), 6.0f);
}

TEST(Numerics, Pow2Ceil) {
    EXPECT_EQ(cpu::pow2_ceil(1.0f), 1.0f);
    EXPECT_EQ(cpu::pow2_ceil(1.5f), 2.0f);
    EXPECT_EQ(cpu::pow2_ceil(0.25f), 0.25f);
    EXPECT_EQ(cpu::pow2_ceil(0.3f), 0.5f);
    EXPECT_EQ(cpu::pow2_ceil(448.0f / 448.0f), 1.0f);
}

TEST(Numerics, Fp8BlockScale) {
    // amax 448 -> scale 1: values on the grid stay; 100 -> 96 (step 8 above 64... 2^6 * 1.5 = 96, 104)
    std::vector<float> x(64, 0.0f);
    x[0] = 448.0f;
    x[1] = 100.0f;
    x[2] = -3.3f;
    cpu::fp8_sim(x.data(), 64);
    EXPECT_EQ(x[0], 448.0f);
    EXPECT_EQ(x[1], 96.0f);     // grid near 100: 96, 104 -> 96 nearer
    EXPECT_EQ(x[2], -3.25f);
    // amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8: values scaled by 256 before rounding
    std::vector<float> y(64, 0.0f);
    y[0] = 1.0f;
    y[5] = 0.3f;   // 0.3*256 = 76.8 -> grid 72, 80 (step 8 in [64,128)) -> 80 -> 0.3125
    cpu::fp8_sim(y.data(), 64);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[5], 0.3125f);
    // The amax floor 1e-4 keeps a zero block finite.
    std::vector<float> z(64, 0.0f);
    cpu::fp8_sim(z.data(), 64);
    EXPECT_EQ(z[0], 0.0f);
    // Only [0, n) is touched: a partial block of 48 (tiny models' nope dims).
    std::vector<float> p(64, 0.3f);
    cpu::fp8_sim(p.data(), 48);
    EXPECT_EQ(p[47], 0.3f * 0 + cpu::e4m3_round(0.3f / cpu::pow2_ceil(0.3f / 448)) * cpu::pow2_ceil(0.3f / 448));
    EXPECT_EQ(p[48], 0.3f);
}

TEST(Numerics, Fp4BlockScale) {
    std::vector<float> x(32, 0.0f);
    x[0] = 6.0f;     // scale 1
    x[1] = 2.6f;     // -> 3
    x[2] = -0.7f;    // -> -0.5
    cpu::fp4_sim(x.data(), 32);
    EXPECT_EQ(x[0], 6.0f);
    EXPECT_EQ(x[1], 3.0f);
    EXPECT_EQ(x[2], -0.5f);
    std::vector<float> y(32, 0.0f);
    y[0] = 1.0f;     // scale 2^ceil(log2(1/6)) = 0.25: 1/0.25 = 4 -> 4*0.25
    y[1] = 0.3f;     // 1.2 -> 1 -> 0.25
    cpu::fp4_sim(y.data(), 32);
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 0.25f);
}

TEST(Numerics, HadamardIsOrthonormalInvolution) {
    std::vector<float> x(128), y;
    for (int i = 0; i < 128; ++i) x[size_t(i)] = std::sin(0.37f * float(i)) + 0.1f * float(i % 7);
    y = x;
    cpu::hadamard(y.data(), 128);
    // Known answer: element 0 is the normalised sum.
    double sum = 0, n0 = 0, n1 = 0;
    for (float v : x) sum += v, n0 += double(v) * v;
    for (float v : y) n1 += double(v) * v;
    EXPECT_NEAR(y[0], sum / std::sqrt(128.0), 1e-5);
    EXPECT_NEAR(n0, n1, 1e-3);   // orthonormal: norm preserved
    cpu::hadamard(y.data(), 128);  // H·H = I for the normalised Sylvester matrix
    for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
    // Size 4 by hand: [1,2,3,4] -> [10, -2, -4, 0] / 2
    float s[4] = {1, 2, 3, 4};
    cpu::hadamard(s, 4);
    EXPECT_FLOAT_EQ(s[0], 5.0f);
    EXPECT_FLOAT_EQ(s[1], -1.0f);
    EXPECT_FLOAT_EQ(s[2], -2.0f);
    EXPECT_FLOAT_EQ(s[3], 0.0f);
}

TEST(Numerics, RopeYarnRampMatchesFlash) {
    // Flash: n_rot 64, base 160000, factor 16, orig 65536, betas 32/1 -> low 15, high 25:
    // pairs below 15 keep their frequency, pairs from 25 on are divided by 16.
    model::Config c;
    c.n_rot = 64;
    c.rope_freq_base = 10000;
    c.compress_rope_freq_base = 160000;
    c.rope_scaling_factor = 16;
    c.yarn_beta_fast = 32;
    c.yarn_beta_slow = 1;
    c.rope_orig_ctx = 65536;
    cpu::Rope comp(c, true), plain(c, false);
    for (uint32_t i : {0u, 5u, 15u}) EXPECT_DOUBLE_EQ(comp.theta(1000, i), 1000 * std::pow(160000.0, -2.0 * i / 64));
    for (uint32_t i : {25u, 31u}) EXPECT_NEAR(comp.theta(1000, i), 1000 * std::pow(160000.0, -2.0 * i / 64) / 16, 1e-12);
    // Pair 20 blends: ramp = 1 - (20-15)/10 = 0.5.
    const double f20 = std::pow(160000.0, -40.0 / 64);
    EXPECT_NEAR(comp.theta(1, 20), f20 / 16 * 0.5 + f20 * 0.5, 1e-15);
    EXPECT_DOUBLE_EQ(plain.theta(7, 3), 7 * std::pow(10000.0, -6.0 / 64));
    // Rotation then inverse is the identity; only the tail moves.
    std::vector<float> x(128);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.01f - 0.3f;
    auto y = x;
    comp.apply(y.data(), 128, 12345);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(y[i], x[i]);
    comp.apply(y.data(), 128, 12345, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}
