// Kernel families of the CUDA backend against the CPU reference on random data: activation
// quantisation (bit-exact), matvec for every weight type (vs quant::vec_dot), dequantisation
// (bit-exact), the FP8/FP4/Hadamard simulations (bit-exact), RMSNorm, top-k with ties.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cpu/numerics.h"
#include "cuda/kernels.h"
#include "quant/iq2_tables.h"
#include "cuda_test_util.h"
#include "dsv4/quant.h"

using namespace dsv4;
using namespace dsv4::cudatest;
using quant::Type;

namespace {

struct HostWeight {
    Type t;
    uint64_t K, rows;
    std::vector<uint8_t> bytes;   // GGUF blocks
};

HostWeight random_weight(Type t, uint64_t K, uint64_t rows, uint64_t seed) {
    HostWeight w{t, K, rows, {}};
    const size_t rb = quant::row_bytes(t, K);
    w.bytes.resize(rb * rows);
    for (uint64_t r = 0; r < rows; ++r) {
        if (t == Type::IQ2_XXS || t == Type::Q2_K) {
            quant::random_row(t, w.bytes.data() + r * rb, K, seed * 1000 + r, 0.5f);
        } else {
            auto f = random_floats(K, seed * 1000 + r, -0.5f, 0.5f);
            quant::quantize_row(t, f.data(), w.bytes.data() + r * rb, K);
        }
    }
    return w;
}

// The device copy of a weight in the backend's layout (Q8_0 repacked).
struct DevWeightHolder {
    DevVec<uint8_t> data;
    DevVec<int8_t> qs;
    DevVec<uint16_t> d;
    cuda::DevWeight w;
    explicit DevWeightHolder(const HostWeight& h) {
        w.type = uint32_t(h.t);
        w.K = h.K;
        w.rows = h.rows;
        w.row_bytes = quant::row_bytes(h.t, h.K);
        if (h.t == Type::Q8_0) {
            std::vector<int8_t> q(h.rows * h.K);
            std::vector<uint16_t> dd(h.rows * h.K / 32);
            cuda::repack_q8_0(h.bytes.data(), h.rows, h.K, q.data(), dd.data());
            qs.resize(q.size());
            qs.upload(q);
            d.resize(dd.size());
            d.upload(dd);
            w.qs = qs.get();
            w.d = d.get();
        } else {
            data.resize(h.bytes.size());
            data.upload(h.bytes);
            w.data = data.get();
        }
    }
};

struct ActHolder {
    DevVec<int8_t> q;
    DevVec<float> d;
    DevVec<int32_t> b;
    cuda::ActBuf buf;
    explicit ActHolder(uint64_t values) : q(values), d(values / 32 + 1), b(values / 16 + 1) {
        buf = {q.get(), d.get(), b.get(), values};
    }
};

const Type kAllTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q2_K, Type::Q4_K, Type::IQ2_XXS,
                          Type::MXFP4};

}  // namespace

class CudaKernels : public ::testing::Test {
protected:
    void SetUp() override {
        DSV4_REQUIRE_CUDA();
        cuda::upload_iq2xxs_grid(quant::detail::kIq2xxsGrid);
    }
};

TEST_F(CudaKernels, ActivationQuantisationIsBitExact) {
    const uint64_t K = 1024;
    const uint32_t R = 5;
    auto x = random_floats(R * K, 3, -3.0f, 3.0f);
    for (uint64_t i = 0; i < K; ++i) x[2 * K + i] = 0.0f;   // an all-zero row
    x[3 * K + 17] = 5.0f;                                      // ties of |max| with opposite signs
    x[3 * K + 200] = -5.0f;
    DevVec<float> dx(x);
    ActHolder ah(R * K);
    for (Type t : {Type::Q8_0, Type::IQ2_XXS}) {
        const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, R, K, ah.buf, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        auto q = ah.q.download();
        auto d = ah.d.download();
        auto b = ah.b.download();
        const Type at = quant::traits(t).vec_dot_type;
        std::vector<uint8_t> ref(quant::act_bytes(t, K));
        for (uint32_t r = 0; r < R; ++r) {
            quant::quantize_act(t, &x[r * K], ref.data(), K);
            if (at == Type::Q8_0) {
                for (uint64_t blk = 0; blk < K / 32; ++blk) {
                    const uint8_t* rb = ref.data() + blk * 34;
                    uint16_t h;
                    std::memcpy(&h, rb, 2);
                    ASSERT_EQ(quant::fp16_to_fp32(h), d[r * (K / 32) + blk]) << "row " << r << " block " << blk;
                    ASSERT_EQ(0, std::memcmp(rb + 2, &q[r * K + blk * 32], 32)) << "row " << r << " block " << blk;
                }
            } else {
                for (uint64_t blk = 0; blk < K / 256; ++blk) {
                    const uint8_t* rb = ref.data() + blk * 292;
                    float dd;
                    std::memcpy(&dd, rb, 4);
                    ASSERT_EQ(dd, d[r * (K / 256) + blk]) << "row " << r << " block " << blk;
                    ASSERT_EQ(0, std::memcmp(rb + 4, &q[r * K + blk * 256], 256)) << "row " << r;
                    for (int j = 0; j < 16; ++j) {
                        int16_t s;
                        std::memcpy(&s, rb + 260 + 2 * j, 2);
                        ASSERT_EQ(int32_t(s), b[r * (K / 16) + blk * 16 + j]) << "row " << r << " bsum " << j;
                    }
                }
            }
        }
        (void)a;
    }
}

TEST_F(CudaKernels, MatvecMatchesVecDotForEveryType) {
    const uint64_t K = 768, N = 45;
    for (Type t : kAllTypes) {
        const HostWeight hw = random_weight(t, K, N, uint64_t(t) + 1);
        DevWeightHolder dw(hw);
        for (uint32_t R : {1u, 3u, 8u, 13u}) {
            auto x = random_floats(R * K, R * 31 + uint64_t(t), -2.0f, 2.0f);
            DevVec<float> dx(x);
            ActHolder ah(R * K);
            DevVec<float> y(R * N);
            const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, R, K, ah.buf, nullptr);
            cuda::matvec(dw.w, a, R, y.get(), N, N, 0, nullptr);
            auto got = y.download();
            const size_t rb = quant::row_bytes(t, K);
            std::vector<uint8_t> act(quant::act_bytes(t, K));
            std::vector<float> wf(K), af(K);
            for (uint32_t r = 0; r < R; ++r) {
                quant::quantize_act(t, &x[r * K], act.data(), K);
                const Type at = quant::traits(t).vec_dot_type;
                if (at == Type::F32) std::memcpy(af.data(), act.data(), K * 4);
                else quant::dequantize_row(at, act.data(), af.data(), K);
                for (uint64_t n = 0; n < N; ++n) {
                    const float ref = quant::vec_dot(t, hw.bytes.data() + n * rb, act.data(), K);
                    quant::dequantize_row(t, hw.bytes.data() + n * rb, wf.data(), K);
                    double mag = 0;
                    for (uint64_t k = 0; k < K; ++k) mag += std::fabs(double(wf[k]) * af[k]);
                    ASSERT_NEAR(got[r * N + n], ref, 2e-6 * mag + 1e-6)
                        << quant::traits(t).name << " R=" << R << " row " << n << " act " << r;
                }
            }
        }
    }
}

TEST_F(CudaKernels, MatvecExpertsRowOffsetAndStride) {
    // A 3-D expert tensor: 4 experts of 16 rows; pairs p pick experts; act row p / 2.
    const uint64_t K = 512, RPE = 16, NEXP = 4;
    for (Type t : {Type::Q8_0, Type::IQ2_XXS, Type::Q2_K, Type::Q4_K, Type::MXFP4, Type::F16}) {
        const HostWeight hw = random_weight(t, K, RPE * NEXP, 77 + uint64_t(t));
        DevWeightHolder dw(hw);
        const uint32_t P = 6;
        const std::vector<int32_t> ex = {3, 0, 2, 2, 1, 3};
        DevVec<int32_t> dex(ex);
        auto x = random_floats(3 * K, 5);
        DevVec<float> dx(x);
        ActHolder ah(3 * K);
        const uint64_t N = 10, row0 = 4, ys = 12;
        DevVec<float> y(P * ys);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, 3, K, ah.buf, nullptr);
        cuda::matvec(dw.w, a, P, y.get(), ys, N, row0, nullptr, dex.get(), RPE, 2);
        auto got = y.download();
        const size_t rb = quant::row_bytes(t, K);
        std::vector<uint8_t> act(quant::act_bytes(t, K));
        for (uint32_t p = 0; p < P; ++p) {
            quant::quantize_act(t, &x[(p / 2) * K], act.data(), K);
            for (uint64_t n = 0; n < N; ++n) {
                const float ref = quant::vec_dot(t, hw.bytes.data() + (ex[p] * RPE + row0 + n) * rb, act.data(), K);
                ASSERT_NEAR(got[p * ys + n], ref, 1e-3 * (std::fabs(ref) + 1)) << quant::traits(t).name << " pair " << p;
            }
        }
    }
}

TEST_F(CudaKernels, MatvecSwigluEqualsMatvecThenSwiglu) {
    // The fused gate+up+SwiGLU product is matvec(gate), matvec(up), swiglu bit for bit:
    // expert pairs (with clamp and routing weights) and plain rows of several batch sizes.
    const uint64_t K = 1024, RPE = 24, NEXP = 3, N = 20;
    for (Type t : {Type::Q8_0, Type::IQ2_XXS, Type::Q2_K, Type::Q4_K, Type::MXFP4}) {
        const HostWeight hg = random_weight(t, K, RPE * NEXP, 301 + uint64_t(t));
        const HostWeight hu = random_weight(t, K, RPE * NEXP, 401 + uint64_t(t));
        DevWeightHolder dg(hg), du(hu);
        ASSERT_TRUE(cuda::matvec_swiglu_ok(dg.w, du.w));
        for (int expert_mode = 0; expert_mode < 2; ++expert_mode) {
            for (uint32_t R : {1u, 3u, 9u}) {
                const uint32_t div = expert_mode ? 2 : 1, P = expert_mode ? 2 * R : R, AR = R;
                std::vector<int32_t> ex(P);
                for (uint32_t p = 0; p < P; ++p) ex[p] = int32_t((p * 7 + 1) % NEXP);
                DevVec<int32_t> dex(ex);
                auto wv = random_floats(P, 11 + R, 0.1f, 1.0f);
                DevVec<float> dew(wv);
                auto x = random_floats(AR * K, 13 + R + uint64_t(t), -2.0f, 2.0f);
                DevVec<float> dx(x);
                ActHolder ah(AR * K);
                const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, AR, K, ah.buf, nullptr);
                DevVec<float> g(P * N), u(P * N), mid(P * N), fused(P * N);
                const float clamp = expert_mode ? 0.05f : 0.0f;
                const int32_t* e = expert_mode ? dex.get() : nullptr;
                const float* w = expert_mode ? dew.get() : nullptr;
                cuda::matvec(dg.w, a, P, g.get(), N, N, 0, nullptr, e, RPE, div);
                cuda::matvec(du.w, a, P, u.get(), N, N, 0, nullptr, e, RPE, div);
                cuda::swiglu(g.get(), u.get(), mid.get(), P, uint32_t(N), clamp, w, nullptr);
                cuda::matvec_swiglu(dg.w, du.w, a, P, fused.get(), N, N, clamp, w, nullptr, e, RPE, div);
                auto ref = mid.download();
                auto got = fused.download();
                ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * 4))
                    << quant::traits(t).name << " experts " << expert_mode << " R=" << R;
            }
        }
    }
}

TEST_F(CudaKernels, MatvecLongRowsWideBlocks) {
    // The mHC mixes: few rows of 4*4096 values take the 1024-thread block-per-row path; the
    // result must not depend on the batch size (same order of sums for every R).
    const uint64_t K = 16384, N = 24;
    for (Type t : {Type::F16, Type::F32, Type::Q8_0}) {
        const HostWeight hw = random_weight(t, K, N, 500 + uint64_t(t));
        DevWeightHolder dw(hw);
        const uint32_t RMAX = 9;
        auto x = random_floats(RMAX * K, 600 + uint64_t(t), -2.0f, 2.0f);
        DevVec<float> dx(x);
        std::vector<float> first;
        for (uint32_t R : {1u, 2u, 4u, 9u}) {
            ActHolder ah(R * K);
            DevVec<float> y(R * N);
            const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, R, K, ah.buf, nullptr);
            cuda::matvec(dw.w, a, R, y.get(), N, N, 0, nullptr);
            auto got = y.download();
            if (first.empty()) first = got;
            ASSERT_EQ(0, std::memcmp(first.data(), got.data(), N * 4)) << quant::traits(t).name << " R=" << R;
            const size_t rb = quant::row_bytes(t, K);
            std::vector<uint8_t> act(quant::act_bytes(t, K));
            for (uint32_t r = 0; r < R; ++r) {
                quant::quantize_act(t, &x[r * K], act.data(), K);
                for (uint64_t n = 0; n < N; ++n) {
                    const float ref = quant::vec_dot(t, hw.bytes.data() + n * rb, act.data(), K);
                    ASSERT_NEAR(got[r * N + n], ref, 1e-4 * (std::fabs(ref) + 1))
                        << quant::traits(t).name << " row " << n << " act " << r;
                }
            }
        }
    }
}

TEST_F(CudaKernels, HcPreFusedNormEqualsSeparate) {
    // mHC pre with the sublayer RMSNorm fused (E = 4096, H = 4) = hc_pre_finish + rms_norm.
    const uint32_t R = 3, H = 4, E = 4096, M = 2 * H + H * H;
    auto mix = random_floats(R * M, 71, -2.0f, 2.0f);
    auto scale = random_floats(3, 72, 0.5f, 1.5f);
    auto base = random_floats(M, 73, -1.0f, 1.0f);
    auto X = random_floats(uint64_t(R) * H * E, 74, -3.0f, 3.0f);
    auto nw = random_floats(E, 75, 0.5f, 1.5f);
    DevVec<float> dmix(mix), dscale(scale), dbase(base), dX(X), dnw(nw);
    DevVec<float> post1(R * H), comb1(R * H * H), xs1(R * E), xn1(R * E);
    DevVec<float> post2(R * H), comb2(R * H * H), xs2(R * E), xn2(R * E);
    cuda::hc_pre_finish(dmix.get(), dscale.get(), dbase.get(), dX.get(), R, H, E, 1e-6f, 20, post1.get(), comb1.get(),
                        xs1.get(), nullptr);
    cuda::rms_norm(xs1.get(), E, xn1.get(), E, R, E, 1e-6f, dnw.get(), nullptr);
    ASSERT_TRUE(cuda::hc_pre_norm_fusable(H, E, dX.get(), xn2.get(), dnw.get()));
    cuda::hc_pre_finish(dmix.get(), dscale.get(), dbase.get(), dX.get(), R, H, E, 1e-6f, 20, post2.get(), comb2.get(),
                        xs2.get(), nullptr, dnw.get(), 1e-6f, xn2.get());
    auto a1 = xn1.download(), a2 = xn2.download();
    ASSERT_EQ(0, std::memcmp(a1.data(), a2.data(), a1.size() * 4));
    auto p1 = post1.download(), p2 = post2.download();
    ASSERT_EQ(0, std::memcmp(p1.data(), p2.data(), p1.size() * 4));
    auto c1 = comb1.download(), c2 = comb2.download();
    ASSERT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * 4));
}

TEST_F(CudaKernels, MatvecShortRowsLargeBatchStrided) {
    // The shapes of small models: rows of 32..128 values, hundreds of activation rows read
    // with a stride larger than the row.
    for (Type t : {Type::Q8_0, Type::F16, Type::F32, Type::MXFP4}) {
        for (uint64_t K : {32ull, 64ull, 128ull}) {
            const uint64_t N = 40, xs = K + 32;
            const uint32_t R = 600;
            const HostWeight hw = random_weight(t, K, N, K + uint64_t(t));
            DevWeightHolder dw(hw);
            auto x = random_floats(R * xs, K, -2.0f, 2.0f);
            DevVec<float> dx(x);
            ActHolder ah(R * K);
            DevVec<float> y(R * N);
            const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), xs, R, K, ah.buf, nullptr);
            cuda::matvec(dw.w, a, R, y.get(), N, N, 0, nullptr);
            auto got = y.download();
            const size_t rb = quant::row_bytes(t, K);
            std::vector<uint8_t> act(quant::act_bytes(t, K));
            for (uint32_t r = 0; r < R; ++r) {
                quant::quantize_act(t, &x[r * xs], act.data(), K);
                for (uint64_t n = 0; n < N; ++n) {
                    const float ref = quant::vec_dot(t, hw.bytes.data() + n * rb, act.data(), K);
                    ASSERT_NEAR(got[r * N + n], ref, 1e-5 * (std::fabs(ref) + 1))
                        << quant::traits(t).name << " K=" << K << " row " << n << " act " << r;
                }
            }
        }
    }
}

TEST_F(CudaKernels, MatvecOddWidthsFloat) {
    // Tiny models keep rows too short for block formats as F16 of any width.
    for (uint64_t K : {20ull, 36ull, 100ull}) {
        const HostWeight hw = random_weight(Type::F16, K, 7, K);
        DevWeightHolder dw(hw);
        auto x = random_floats(2 * 128, K);
        DevVec<float> dx(x);
        ActHolder ah(16);
        DevVec<float> y(2 * 7);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::F16), dx.get() + 1, 128, 2, K, ah.buf, nullptr);
        cuda::matvec(dw.w, a, 2, y.get(), 7, 7, 0, nullptr);
        auto got = y.download();
        for (uint32_t r = 0; r < 2; ++r)
            for (uint64_t n = 0; n < 7; ++n) {
                const float ref = quant::vec_dot(Type::F16, hw.bytes.data() + n * K * 2, &x[r * 128 + 1], K);
                ASSERT_NEAR(got[r * 7 + n], ref, 1e-4) << "K=" << K;
            }
    }
}

TEST_F(CudaKernels, DequantiseIsBitExact) {
    const uint64_t K = 512, N = 5;
    for (Type t : kAllTypes) {
        const HostWeight hw = random_weight(t, K, N, 9 + uint64_t(t));
        DevWeightHolder dw(hw);
        DevVec<float> out(N * K);
        cuda::dequantize_rows(dw.w, 0, N, out.get(), nullptr);
        auto got = out.download();
        std::vector<float> ref(K);
        for (uint64_t r = 0; r < N; ++r) {
            quant::dequantize_row(t, hw.bytes.data() + r * quant::row_bytes(t, K), ref.data(), K);
            for (uint64_t i = 0; i < K; ++i)
                ASSERT_EQ(got[r * K + i], ref[i]) << quant::traits(t).name << " row " << r << " value " << i;
        }
    }
}

TEST_F(CudaKernels, Fp8Fp4RoundingMatchesTheCpuEverywhere) {
    std::vector<float> v;
    // Every E4M3 value, the midpoints between neighbours (ties), and random values.
    std::vector<float> e4m3;
    for (int k = 0; k < 127; ++k) {
        const int e = k >> 3, m = k & 7;
        e4m3.push_back(e == 0 ? float(m) * 0x1p-9f : (1.0f + float(m) / 8.0f) * std::ldexp(1.0f, e - 7));
    }
    for (size_t i = 0; i < e4m3.size(); ++i) {
        v.push_back(e4m3[i]);
        if (i + 1 < e4m3.size()) v.push_back(0.5f * (e4m3[i] + e4m3[i + 1]));
    }
    const float e2m1[] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < 8; ++i) {
        v.push_back(e2m1[i]);
        if (i < 7) v.push_back(0.5f * (e2m1[i] + e2m1[i + 1]));
    }
    auto r = random_floats(20000, 4, -448.0f, 448.0f);
    v.insert(v.end(), r.begin(), r.end());
    auto r2 = random_floats(20000, 5, -6.0f, 6.0f);
    v.insert(v.end(), r2.begin(), r2.end());
    auto r3 = random_floats(5000, 6, -0.02f, 0.02f);
    v.insert(v.end(), r3.begin(), r3.end());
    const size_t n0 = v.size();
    for (size_t i = 0; i < n0; ++i) v.push_back(-v[i]);
    DevVec<float> dx(v), dy(v.size());
    cuda::e4m3_round_n(dx.get(), dy.get(), v.size(), nullptr);
    auto g8 = dy.download();
    for (size_t i = 0; i < v.size(); ++i)
        if (std::fabs(v[i]) <= 448.0f) {
            ASSERT_EQ(g8[i], cpu::e4m3_round(v[i])) << "e4m3 of " << v[i];
        }
    cuda::e2m1_round_n(dx.get(), dy.get(), v.size(), nullptr);
    auto g4 = dy.download();
    for (size_t i = 0; i < v.size(); ++i)
        if (std::fabs(v[i]) <= 6.0f) {
            ASSERT_EQ(g4[i], cpu::e2m1_round(v[i])) << "e2m1 of " << v[i];
        }
}

TEST_F(CudaKernels, SimulationsAndHadamardAreBitExact) {
    const uint32_t R = 7;
    for (uint32_t n : {48u, 64u, 128u, 448u, 512u}) {
        auto x = random_floats(R * 512, n, -4.0f, 4.0f);
        for (uint32_t i = 0; i < 512; ++i) x[3 * 512 + i] *= 1e-6f;   // tiny block: the amax floor
        for (int kind = 0; kind < 3; ++kind) {
            if (kind == 2 && (n & (n - 1))) continue;
            DevVec<float> dx(x);
            if (kind == 0) cuda::fp8_sim_rows(dx.get(), R, n, 512, nullptr);
            if (kind == 1) cuda::fp4_sim_rows(dx.get(), R, n, 512, nullptr);
            if (kind == 2) cuda::hadamard_rows(dx.get(), R, n, 512, nullptr);
            auto got = dx.download();
            auto ref = x;
            for (uint32_t r = 0; r < R; ++r) {
                if (kind == 0) cpu::fp8_sim(&ref[r * 512], n);
                if (kind == 1) cpu::fp4_sim(&ref[r * 512], n);
                if (kind == 2) cpu::hadamard(&ref[r * 512], n);
            }
            for (size_t i = 0; i < ref.size(); ++i)
                ASSERT_EQ(got[i], ref[i]) << "kind " << kind << " n " << n << " at " << i;
        }
    }
}

TEST_F(CudaKernels, RmsNormMatchesTheCpu) {
    const uint32_t R = 4, n = 1000;
    auto x = random_floats(R * n, 8, -3.0f, 3.0f);
    auto w = random_floats(n, 9, 0.5f, 1.5f);
    DevVec<float> dx(x), dw(w), dy(R * n);
    cuda::rms_norm(dx.get(), n, dy.get(), n, R, n, 1e-6f, dw.get(), nullptr);
    auto got = dy.download();
    for (uint32_t r = 0; r < R; ++r) {
        double ss = 0;
        for (uint32_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
        const float s = float(1.0 / std::sqrt(ss / n + 1e-6f));
        for (uint32_t i = 0; i < n; ++i) ASSERT_NEAR(got[r * n + i], x[r * n + i] * s * w[i], 1e-6f);
    }
}

TEST_F(CudaKernels, TopKTiesGoToTheLowerIndex) {
    for (uint32_t n : {600u, 1000u, 5000u}) {
        for (uint32_t k : {8u, 64u, 512u}) {
            if (k >= n) continue;
            auto s = random_floats(n, n + k, -1.0f, 1.0f);
            for (auto& v : s) v = std::round(v * 8.0f) / 8.0f;   // many ties
            s[5] = -0.0f;
            DevVec<float> ds(s);
            DevVec<uint32_t> sel(k);
            cuda::topk_plain(ds.get(), n, k, sel.get(), nullptr);
            auto got = sel.download();
            std::vector<uint32_t> idx(n);
            std::iota(idx.begin(), idx.end(), 0u);
            std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                              [&](uint32_t a, uint32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
            idx.resize(k);
            std::sort(idx.begin(), idx.end());
            ASSERT_EQ(got, idx) << "n " << n << " k " << k;
        }
    }
}
