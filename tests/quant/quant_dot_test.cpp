// vec_dot: against the dot of the dequantised weight row with the dequantised activation,
// and SIMD against scalar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dsv4/quant.h"
#include "quant/blocks.h"
#include "quant/quant_test_util.h"

using namespace dsv4::quant;

namespace {

using test::gaussian;
using test::kAllTypes;

struct Case {
    std::vector<uint8_t> w;    // weight row
    std::vector<uint8_t> act;  // activation in vec_dot_type
    double ref;                // dot of the dequantised rows, in double
    double mag;                // sum of |w_i * a_i|
};

// Weights either random valid blocks or quantised Gaussian data; activation Gaussian with
// an outlier (the activation quantisers then use its full range only in one block).
Case make_case(Type t, size_t n, uint64_t seed, bool random_weights) {
    Case c;
    c.w.resize(row_bytes(t, n));
    if (random_weights) {
        random_row(t, c.w.data(), n, seed, 0.7f);
    } else {
        auto wf = gaussian(n, seed, 0.3f);
        quantize_row(t, wf.data(), c.w.data(), n);
    }
    auto x = gaussian(n, seed + 1000, 1.5f);
    x[n / 3] = 11.0f;
    c.act.resize(act_bytes(t, n));
    quantize_act(t, x.data(), c.act.data(), n);
    std::vector<float> wd(n), ad(n);
    dequantize_row(t, c.w.data(), wd.data(), n);
    const Type at = traits(t).vec_dot_type;
    if (at == Type::F32)
        std::memcpy(ad.data(), c.act.data(), n * sizeof(float));
    else
        dequantize_row(at, c.act.data(), ad.data(), n);
    c.ref = 0.0;
    c.mag = 0.0;
    for (size_t i = 0; i < n; ++i) {
        c.ref += double(wd[i]) * double(ad[i]);
        c.mag += std::fabs(double(wd[i]) * double(ad[i]));
    }
    return c;
}

}  // namespace

TEST(QuantDot, MatchesDequantisedDot) {
    for (Type t : kAllTypes) {
        for (size_t n : {256u, 1024u, 4096u}) {
            for (bool rnd : {true, false}) {
                for (uint64_t seed : {1u, 2u, 3u}) {
                    const Case c = make_case(t, n, seed * 7 + n, rnd);
                    const float got = vec_dot(t, c.w.data(), c.act.data(), n);
                    const float sc = detail::vec_dot_scalar(t, c.w.data(), c.act.data(), n);
                    // Float summation order only: relative to the sum of |terms|.
                    EXPECT_NEAR(got, c.ref, 2e-5 * c.mag + 1e-30) << traits(t).name << " n " << n;
                    EXPECT_NEAR(sc, c.ref, 2e-5 * c.mag + 1e-30) << traits(t).name << " n " << n;
                }
            }
        }
    }
}

TEST(QuantDot, FloatTails) {
    // Lengths that are not multiples of the SIMD width.
    for (Type t : {Type::F32, Type::F16, Type::BF16}) {
        for (size_t n : {1u, 7u, 9u, 31u, 33u, 100u, 1001u}) {
            const Case c = make_case(t, n, n, true);
            EXPECT_NEAR(vec_dot(t, c.w.data(), c.act.data(), n), c.ref, 2e-5 * c.mag + 1e-30)
                << traits(t).name << " n " << n;
        }
    }
}

TEST(QuantDot, SimdAgreesWithScalar) {
#if defined(__AVX2__)
    for (Type t : kAllTypes) {
        for (uint64_t seed : {5u, 6u, 7u, 8u}) {
            const size_t n = 2048;
            const Case c = make_case(t, n, seed, seed & 1);
            float simd;
            const bool has = detail::vec_dot_simd(t, c.w.data(), c.act.data(), n, &simd);
            const float sc = detail::vec_dot_scalar(t, c.w.data(), c.act.data(), n);
            if (!has) continue;  // MXFP4, Q8_K: scalar only
            if (t == Type::Q2_K || t == Type::Q4_K || t == Type::IQ2_XXS) {
                // Same integers and the same per-block float operations: bit-identical.
                EXPECT_EQ(simd, sc) << traits(t).name;
            } else {
                EXPECT_NEAR(simd, sc, 1e-5 * c.mag) << traits(t).name;
            }
        }
    }
#else
    GTEST_SKIP() << "built without AVX2";
#endif
}

// vec_dot_x4: one weight row against four activations, each the single dot's bits (every
// type; odd block counts take the Q8_0 kernel's tail), quantised activations at unaligned
// offsets (float ones aligned: they are read as floats).
TEST(QuantDot, FourActivationsEqualFourDots) {
    for (Type t : kAllTypes) {
        const size_t be = traits(t).block_elems;
        const uint64_t skew = traits(traits(t).vec_dot_type).is_quantized ? 1 : 0;
        for (size_t n : {be * 3, size_t(1024), size_t(4096)}) {
            if (n % be) continue;
            const Case c = make_case(t, n, 91 + n, true);
            std::vector<std::vector<uint8_t>> acts;
            for (uint64_t a = 0; a < 4; ++a) {
                auto x = gaussian(n, 300 + a * 17 + n, 1.0f + float(a));
                std::vector<uint8_t> q(act_bytes(t, n) + 3);
                quantize_act(t, x.data(), q.data() + skew * (a % 4), n);
                acts.push_back(std::move(q));
            }
            const void* ap[4];
            for (uint64_t a = 0; a < 4; ++a) ap[a] = acts[a].data() + skew * (a % 4);
            float out[4];
            vec_dot_x4(t, c.w.data(), ap, n, out);
            for (int a = 0; a < 4; ++a) {
                const float one = vec_dot(t, c.w.data(), ap[a], n);
                EXPECT_EQ(std::memcmp(&out[a], &one, 4), 0)
                    << traits(t).name << " n " << n << " activation " << a << ": " << out[a] << " vs " << one;
            }
        }
    }
}

// vec_dot_many: one row against any number of activations, each the single dot's bits, on both
// sides of kDecodeOnceFrom (IQ2_XXS under AVX2: the row decoded once, its weights + 64 as bytes and
// the offset's share taken back from the bsums); activations at unaligned offsets, the extreme
// codes among them (every weight against +-127).
TEST(QuantDot, ManyActivationsEqualSingleDots) {
    std::vector<uint8_t> scratch;
    for (Type t : kAllTypes) {
        const size_t be = traits(t).block_elems;
        const uint64_t skew = traits(traits(t).vec_dot_type).is_quantized ? 1 : 0;
        for (size_t n : {size_t(256), size_t(4096)}) {
            if (n % be) continue;
            const Case c = make_case(t, n, 57 + n, true);
            for (size_t count : {size_t(1), size_t(3), kDecodeOnceFrom - 1, kDecodeOnceFrom, kDecodeOnceFrom + 5,
                                 size_t(32)}) {
                std::vector<std::vector<uint8_t>> acts;
                for (uint64_t a = 0; a < count; ++a) {
                    auto x = gaussian(n, 500 + a * 13 + n, 1.0f + float(a % 5));
                    if (a == 1)   // codes at +-127 throughout: the largest products
                        for (size_t i = 0; i < n; ++i) x[i] = (i % 3) ? 1.0f : -1.0f;
                    std::vector<uint8_t> q(act_bytes(t, n) + 3);
                    quantize_act(t, x.data(), q.data() + skew * (a % 4), n);
                    acts.push_back(std::move(q));
                }
                std::vector<const void*> ap(count);
                for (uint64_t a = 0; a < count; ++a) ap[a] = acts[a].data() + skew * (a % 4);
                std::vector<float> out(count);
                vec_dot_many(t, c.w.data(), ap.data(), count, n, out.data(), scratch);
                for (size_t a = 0; a < count; ++a) {
                    const float one = vec_dot(t, c.w.data(), ap[a], n);
                    EXPECT_EQ(std::memcmp(&out[a], &one, 4), 0) << traits(t).name << " n " << n << " count " << count
                                                                << " activation " << a << ": " << out[a] << " vs " << one;
                }
            }
        }
    }
}

TEST(QuantDot, UnalignedRows) {
    // Rows inside a GGUF mapping sit at any offset; results must not depend on it.
    for (Type t : kAllTypes) {
        const size_t n = 512;
        const Case c = make_case(t, n, 77, true);
        const float base = vec_dot(t, c.w.data(), c.act.data(), n);
        for (size_t off : {1u, 3u}) {
            std::vector<uint8_t> wbuf(c.w.size() + off), abuf(c.act.size() + off);
            std::memcpy(wbuf.data() + off, c.w.data(), c.w.size());
            std::memcpy(abuf.data() + off, c.act.data(), c.act.size());
            if (traits(traits(t).vec_dot_type).is_quantized) {
                EXPECT_EQ(vec_dot(t, wbuf.data() + off, abuf.data() + off, n), base) << traits(t).name;
            } else {
                EXPECT_EQ(vec_dot(t, wbuf.data() + off, c.act.data(), n), base) << traits(t).name;
            }
        }
    }
}

TEST(QuantDot, ExactSmallCase) {
    // Q8_0 x Q8_0 with hand-picked codes: d_w = 0.5, d_x = 0.25, sum q_w q_x = 1*2 + 3*(-4).
    std::vector<uint8_t> w(34, 0), x(34, 0);
    w[0] = 0x00, w[1] = 0x38;  // 0.5
    x[0] = 0x00, x[1] = 0x34;  // 0.25
    w[2] = 1, x[2] = 2;
    w[3] = 3, x[3] = uint8_t(int8_t(-4));
    w[33] = uint8_t(int8_t(-127)), x[33] = uint8_t(int8_t(-127));
    EXPECT_EQ(vec_dot(Type::Q8_0, w.data(), x.data(), 32), 0.125f * float(2 - 12 + 127 * 127));
    EXPECT_EQ(detail::vec_dot_scalar(Type::Q8_0, w.data(), x.data(), 32), 0.125f * float(2 - 12 + 127 * 127));
}
