// Kernel families of the CUDA backend against the CPU reference on random data: activation
// quantisation (bit-exact), matvec for every weight type (vs quant::vec_dot), dequantisation
// (bit-exact), the FP8/FP4/Hadamard simulations (bit-exact), RMSNorm, top-k with ties.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>

#include "cpu/numerics.h"
#include "cuda/kernels.h"
#include "quant/iq2_tables.h"
#include "cuda_test_util.h"
#include "dsv4/quant.h"
#include "dsv4/sampler.h"

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

// The device copy of a weight in the backend's layout (Q8_0, Q2_K, IQ2_XXS repacked).
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
        if (cuda::RepackShape rs; cuda::repack_shape(w.type, &rs)) {
            const uint64_t blocks = h.rows * (h.K / rs.block_values);
            std::vector<int8_t> q(blocks * rs.body_bytes);
            std::vector<uint16_t> dd(blocks * rs.aux_bytes / 2);
            cuda::repack_rows(w.type, h.bytes.data(), h.rows, h.K, reinterpret_cast<uint8_t*>(q.data()),
                              reinterpret_cast<uint8_t*>(dd.data()));
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

TEST_F(CudaKernels, Q8_0OneRowEqualsTheRowInABatch) {
    // Decode's one-row Q8_0 products take several rows per warp (q8_rows_kernel); a batch of
    // two takes matvec_kernel. Row 0 must be the same bits either way (and so equal the
    // tensor-core prefill products, which reproduce matvec_kernel's order): plain, grouped
    // (out_a) and gate+up with SwiGLU, rows of 1,024 to 8,192 values, row counts that leave a
    // warp partly filled.
    const std::pair<uint64_t, uint64_t> shapes[] = {{45, 1024}, {37, 2048}, {20, 4096}, {9, 8192}, {64, 1024}};
    for (auto [N, K] : shapes) {
        const HostWeight hw = random_weight(Type::Q8_0, K, N, 900 + K + N);
        const HostWeight hu = random_weight(Type::Q8_0, K, N, 1900 + K + N);
        DevWeightHolder dw(hw), du(hu);
        // grouped: 4 groups of N/4 rows each read their own K-slice of a 4K activation
        const uint64_t G = 4;
        auto x = random_floats(2 * G * K, 17 + K, -2.0f, 2.0f);
        std::copy(x.begin(), x.begin() + G * K, x.begin() + G * K);   // row 1 = row 0
        DevVec<float> dx(x);
        ActHolder ah(2 * G * K), ag(2 * G * K);
        // rows of K values at a stride of G * K: row 1 is row 0 again
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), G * K, 2, K, ah.buf, nullptr);
        const cuda::DevAct a4 = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), G * K, 2, G * K, ag.buf, nullptr);
        DevVec<float> one(N), two(2 * N);
        auto same = [&](const char* what) {
            auto o = one.download();
            auto t = two.download();
            ASSERT_EQ(0, std::memcmp(o.data(), t.data(), N * 4)) << what << " N=" << N << " K=" << K;
            ASSERT_EQ(0, std::memcmp(o.data(), t.data() + N, N * 4)) << what << " N=" << N << " K=" << K;
        };
        cuda::matvec(dw.w, a, 1, one.get(), N, N, 0, nullptr);
        cuda::matvec(dw.w, a, 2, two.get(), N, N, 0, nullptr);
        same("plain");
        if (N % G == 0) {
            cuda::matvec_grouped(dw.w, a4, 1, one.get(), N, N, N / G, nullptr);
            cuda::matvec_grouped(dw.w, a4, 2, two.get(), N, N, N / G, nullptr);
            same("grouped");
        }
        cuda::matvec_swiglu(dw.w, du.w, a, 1, one.get(), N, N, 0.0f, nullptr, nullptr);
        cuda::matvec_swiglu(dw.w, du.w, a, 2, two.get(), N, N, 0.0f, nullptr, nullptr);
        same("gate+up");
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

TEST_F(CudaKernels, HcPreSpreadMatchesDoubleAndIsRowIndependent) {
    // mHC pre in two spread launches (hc_pre_mix + hc_pre_collapse) against a double
    // reference; a row alone = the same row in a batch (bit for bit); a second launch = the
    // first (the finished-block counters are left at 0).
    const uint32_t H = 4, M = 2 * H + H * H;
    const float hc_eps = 1e-6f, rms_eps = 1e-6f;
    struct Case {
        uint32_t E;
        Type t;
    };
    for (const Case tc : {Case{4096, Type::F32}, Case{64, Type::F32}, Case{128, Type::F32}, Case{200, Type::F32},
                          Case{4096, Type::F16}, Case{64, Type::BF16}}) {
        const uint32_t E = tc.E;
        const uint64_t HD = uint64_t(H) * E;
        const HostWeight hw = random_weight(tc.t, HD, M, 90 + E + uint64_t(tc.t));
        DevWeightHolder dw(hw);
        std::vector<float> wf(M * HD);
        for (uint32_t m = 0; m < M; ++m)
            quant::dequantize_row(tc.t, hw.bytes.data() + m * quant::row_bytes(tc.t, HD), &wf[m * HD], HD);
        auto scale = random_floats(3, 91, 0.01f, 0.05f);
        auto base = random_floats(M, 92, -1.0f, 1.0f);
        auto nw = random_floats(E, 93 + E, 0.5f, 1.5f);
        DevVec<float> dscale(scale), dbase(base), dnw(nw);
        for (uint32_t R : {1u, 3u, 17u, 70u}) {   // (70: the tile kernel of prefill rounds)
            const std::string what = std::string(quant::traits(tc.t).name) + " E=" + std::to_string(E) +
                                     " R=" + std::to_string(R);
            auto X = random_floats(R * HD, 94 + R + E, -3.0f, 3.0f);
            DevVec<float> dX(X), mix(R * M), post(R * H), xn(R * E), gate(R * (H + 1));
            DevVec<double> part(cuda::hc_pre_partials(R, H, E));
            DevVec<uint32_t> count(cuda::hc_pre_counters(R));
            ASSERT_EQ(cudaMemset(count.get(), 0, count.size() * sizeof(uint32_t)), cudaSuccess);
            ASSERT_TRUE(cuda::hc_pre_spread_ok(H, E, dw.w, dX.get(), xn.get(), dnw.get())) << what;
            auto launch = [&](const float* x, uint32_t rows, float* mx, float* po, float* xo, float* ga) {
                cuda::hc_pre_mix(dw.w, x, dscale.get(), dbase.get(), rows, H, E, hc_eps, rms_eps, mx, po, ga,
                                 part.get(), count.get(), nullptr);
                cuda::hc_pre_collapse(x, ga, dnw.get(), rows, H, E, xo, nullptr);
            };
            launch(dX.get(), R, mix.get(), post.get(), xn.get(), gate.get());
            auto gm = mix.download(), gp = post.download(), gx = xn.download();
            for (uint32_t c : count.download()) ASSERT_EQ(c, 0u) << what << ": counter left set";

            for (uint32_t r = 0; r < R; ++r) {
                const float* xr = &X[r * HD];
                double ss = 0;
                for (uint64_t k = 0; k < HD; ++k) ss += double(xr[k]) * xr[k];
                const double rx = 1.0 / std::sqrt(ss / double(HD) + rms_eps);
                double mref[M], pre[H];
                for (uint32_t m = 0; m < M; ++m) {
                    double d = 0;
                    for (uint64_t k = 0; k < HD; ++k) d += double(wf[m * HD + k]) * xr[k];
                    mref[m] = d * rx;
                    ASSERT_NEAR(gm[r * M + m], mref[m], 1e-5 * (std::fabs(mref[m]) + 1)) << what << " mix " << m;
                }
                auto sig = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
                for (uint32_t h = 0; h < H; ++h) {
                    pre[h] = sig(mref[h] * scale[0] + base[h]) + hc_eps;
                    const double pr = 2.0 * sig(mref[H + h] * scale[1] + base[H + h]);
                    ASSERT_NEAR(gp[r * H + h], pr, 1e-5 * std::fabs(pr)) << what << " post " << h;
                }
                std::vector<double> xs(E);
                double s2 = 0;
                for (uint32_t e = 0; e < E; ++e) {
                    double a = 0;
                    for (uint32_t h = 0; h < H; ++h) a += pre[h] * xr[h * E + e];
                    xs[e] = a;
                    s2 += a * a;
                }
                const double rs = 1.0 / std::sqrt(s2 / E + rms_eps);
                for (uint32_t e = 0; e < E; ++e) {
                    const double ref = xs[e] * rs * nw[e];
                    ASSERT_NEAR(gx[r * E + e], ref, 1e-5 * (std::fabs(ref) + 1)) << what << " xn " << e;
                }
            }

            // Again, with every rows-per-block choice of hc_mix_kernel and with the tile kernel:
            // the same bits (the counters were reset by the first launch).
            for (const int rb : {4, 2, 1, 0}) {
                if (rb) cuda::hc_mix_rows_override(rb);
                else cuda::hc_mix_tile_override(1);
                launch(dX.get(), R, mix.get(), post.get(), xn.get(), gate.get());
                cuda::hc_mix_rows_override(-1);
                cuda::hc_mix_tile_override(-1);
                auto gm2 = mix.download(), gp2 = post.download(), gx2 = xn.download();
                ASSERT_EQ(0, std::memcmp(gm.data(), gm2.data(), gm.size() * 4)) << what << " rows a block (0: tiles) " << rb;
                ASSERT_EQ(0, std::memcmp(gp.data(), gp2.data(), gp.size() * 4)) << what << " rows a block (0: tiles) " << rb;
                ASSERT_EQ(0, std::memcmp(gx.data(), gx2.data(), gx.size() * 4)) << what << " rows a block (0: tiles) " << rb;
            }

            // The tile kernel's float form (a fast prompt round's): near the same references, each
            // row's mix within 2^-16 of its products' magnitudes (Σ|w·x| times the row's scale).
            cuda::hc_mix_tile_override(1);
            cuda::hc_mix_fast_override(1);
            launch(dX.get(), R, mix.get(), post.get(), xn.get(), gate.get());
            cuda::hc_mix_tile_override(-1);
            cuda::hc_mix_fast_override(-1);
            {
                auto fm = mix.download(), fp = post.download(), fx = xn.download();
                double worst = 0;
                for (uint32_t r = 0; r < R; ++r) {
                    const float* xr = &X[r * HD];
                    double ss = 0;
                    for (uint64_t k = 0; k < HD; ++k) ss += double(xr[k]) * xr[k];
                    const double rx = 1.0 / std::sqrt(ss / double(HD) + rms_eps);
                    for (uint32_t m = 0; m < M; ++m) {
                        double d = 0, mag = 0;
                        for (uint64_t k = 0; k < HD; ++k) {
                            d += double(wf[m * HD + k]) * xr[k];
                            mag += std::fabs(double(wf[m * HD + k]) * xr[k]);
                        }
                        worst = std::max(worst, std::fabs(fm[r * M + m] - d * rx) / (mag * rx));
                    }
                    for (uint32_t h = 0; h < H; ++h)
                        ASSERT_NEAR(fp[r * H + h], gp[r * H + h], 1e-3 * std::fabs(gp[r * H + h])) << what << " fast post";
                    for (uint32_t e = 0; e < E; ++e)
                        ASSERT_NEAR(fx[r * E + e], gx[r * E + e], 1e-3 * (std::fabs(gx[r * E + e]) + 1)) << what << " fast xn";
                }
                EXPECT_LT(worst, 1.0 / 65536) << what << " fast mix";
            }

            // Each row alone (R = 1, its own place in a block) = the row in the batch.
            DevVec<float> m1(M), p1(H), x1(E), g1(H + 1);
            for (uint32_t r = 0; r < R; ++r) {
                launch(dX.get() + r * HD, 1, m1.get(), p1.get(), x1.get(), g1.get());
                auto a = m1.download(), b = p1.download(), c = x1.download();
                ASSERT_EQ(0, std::memcmp(a.data(), &gm[r * M], M * 4)) << what << " row " << r;
                ASSERT_EQ(0, std::memcmp(b.data(), &gp[r * H], H * 4)) << what << " row " << r;
                ASSERT_EQ(0, std::memcmp(c.data(), &gx[r * E], E * 4)) << what << " row " << r;
            }
            for (uint32_t c : count.download()) ASSERT_EQ(c, 0u) << what << ": counter left set";
        }
    }
}


// An mHC mix weight of flash's shape on the device (fn: M rows of H*E F16 values) with its
// scale and base, from the three seeds.
struct HcMix {
    static constexpr uint32_t H = 4, M = 2 * H + H * H, E = 4096;
    static constexpr uint64_t HD = uint64_t(H) * E;
    DevWeightHolder dw;
    DevVec<float> scale, base;
    HcMix(uint64_t seed_w, uint64_t seed_scale, uint64_t seed_base)
        : dw(random_weight(Type::F16, HD, M, seed_w)),
          scale(random_floats(3, seed_scale, 0.01f, 0.05f)),
          base(random_floats(M, seed_base, -1.0f, 1.0f)) {}
};

TEST_F(CudaKernels, HcCollapseCodesEqualQuantizeAct) {
    // hc_pre_collapse can also write xn's Q8_0 and Q8_K codes: they must be the bytes
    // quantize_act makes from xn (codes, scales, 16-value sums), including a row of zeros
    // (Q8_K's zero block) and ties of magnitude (the first value's sign).
    constexpr uint32_t H = HcMix::H, M = HcMix::M, E = HcMix::E, R = 3;
    constexpr uint64_t HD = HcMix::HD;
    HcMix hm(1234, 91, 92);
    auto nw = random_floats(E, 93, 0.5f, 1.5f);
    nw[7] = 0.0f;   // an xn value of 0 in the first blocks
    nw[300] = nw[301];
    DevVec<float> dnw(nw);
    auto X = random_floats(R * HD, 95, -3.0f, 3.0f);
    for (uint32_t h = 0; h < H; ++h)
        for (uint32_t e = 256; e < 512; ++e) X[2 * HD + h * E + e] = 0.0f;   // row 2: one Q8_K block of zeros
    for (uint32_t h = 0; h < H; ++h) X[h * E + 300] = -X[h * E + 301];       // row 0: equal magnitudes
    DevVec<float> dX(X), mix(R * M), post(R * H), xn(R * E), gate(R * (H + 1));
    DevVec<double> part(cuda::hc_pre_partials(R, H, E));
    DevVec<uint32_t> count(cuda::hc_pre_counters(R));
    ASSERT_EQ(cudaMemset(count.get(), 0, count.size() * sizeof(uint32_t)), cudaSuccess);
    cuda::hc_pre_mix(hm.dw.w, dX.get(), hm.scale.get(), hm.base.get(), R, H, E, 1e-6f, 1e-6f, mix.get(), post.get(),
                     gate.get(), part.get(), count.get(), nullptr);
    ActHolder f0(R * E), fk(R * E), r0(R * E), rk(R * E);
    cuda::HcQuant qa{f0.buf.q, f0.buf.d, fk.buf.q, fk.buf.d, fk.buf.bsum};
    cuda::hc_pre_collapse(dX.get(), gate.get(), dnw.get(), R, H, E, xn.get(), nullptr, qa);
    cuda::quantize_act(uint32_t(Type::Q8_0), xn.get(), E, R, E, r0.buf, nullptr);
    cuda::quantize_act(uint32_t(Type::IQ2_XXS), xn.get(), E, R, E, rk.buf, nullptr);
    auto eq = [&](auto& a, auto& b, size_t n, const char* what) {
        auto x = a.download();
        auto y = b.download();
        ASSERT_EQ(0, std::memcmp(x.data(), y.data(), n * sizeof(x[0]))) << what;
    };
    eq(f0.q, r0.q, R * E, "Q8_0 codes");
    eq(f0.d, r0.d, R * E / 32, "Q8_0 scales");
    eq(fk.q, rk.q, R * E, "Q8_K codes");
    eq(fk.d, rk.d, R * E / 256, "Q8_K scales");
    eq(fk.b, rk.b, R * E / 16, "Q8_K sums");
    // and xn as FP16 (HcQuant::h, DSV4_XN_F16=2): each value times the factor of its norm's bound
    // (hc_xn_bound: sqrt(E) max|w|, at least every |xn|) rounded once, beside the same codes
    DevVec<unsigned> bound(std::vector<unsigned>{0});
    cuda::hc_xn_bound(dnw.get(), E, bound.get(), nullptr);
    DevVec<uint16_t> xh(R * E);
    DevVec<float> xn2(R * E);
    ActHolder g0(R * E), gk(R * E);
    cuda::HcQuant qh{g0.buf.q, g0.buf.d, gk.buf.q, gk.buf.d, gk.buf.bsum, xh.get(), bound.get()};
    cuda::hc_pre_collapse(dX.get(), gate.get(), dnw.get(), R, H, E, xn2.get(), nullptr, qh);
    eq(xn2, xn, R * E, "xn beside its FP16 form");
    eq(g0.q, r0.q, R * E, "Q8_0 codes beside the FP16 form");
    eq(gk.q, rk.q, R * E, "Q8_K codes beside the FP16 form");
    float b = 0.0f;
    std::memcpy(&b, bound.download().data(), 4);
    const auto x = xn.download();
    const auto h = xh.download();
    float wmax = 0.0f, xmax = 0.0f;
    for (float w : nw) wmax = std::max(wmax, std::fabs(w));
    for (float v : x) xmax = std::max(xmax, std::fabs(v));
    EXPECT_GE(b, wmax * std::sqrt(float(E))) << "the bound";
    EXPECT_LE(b, wmax * std::sqrt(float(E)) * 1.01f) << "the bound";
    EXPECT_GE(b, xmax) << "the bound below a value of xn";
    int e = 0;
    std::frexp(b, &e);
    const float f = std::ldexp(1.0f, 14 - e);   // (f16_factor(bound, 1))
    for (uint64_t i = 0; i < R * E; ++i)
        ASSERT_EQ(h[i], quant::fp32_to_fp16(x[i] * f)) << "value " << i << " (" << x[i] << ")";
}
TEST_F(CudaKernels, HcPostFoldedIntoMixEqualsSeparate) {
    // hc_pre_mix with the previous sublayer's hc_post folded in (HcPostIn) must leave the same
    // state X and make the same mix, post gates and collapse gates as hc_post then hc_pre_mix,
    // bit for bit: after an attention sublayer (y alone) and after an MoE sublayer (the routed
    // experts' outputs, with and without the shared expert's y), one row and a batch (rows of
    // 4 a block; 40 and 70: prompt rounds' tile kernel, one block of 32 rows and a partial
    // one), and with post the buffer the mix writes its new post gates to.
    constexpr uint32_t H = HcMix::H, M = HcMix::M, E = HcMix::E, K = 6;
    constexpr uint64_t HD = HcMix::HD;
    HcMix hm(77, 71, 72);
    for (uint32_t R : {1u, 5u, 40u, 70u}) {
        for (int kind = 0; kind < 3; ++kind) {   // 0 attention, 1 MoE + shared, 2 MoE alone
            SCOPED_TRACE(testing::Message() << "R " << R << " kind " << kind);
            const auto X = random_floats(R * HD, 80 + R, -3.0f, 3.0f);
            const auto y = random_floats(R * E, 81 + R, -2.0f, 2.0f);
            const auto down = random_floats(uint64_t(R) * K * E, 82 + R, -1.0f, 1.0f);
            const auto post0 = random_floats(R * H, 83 + R, 0.0f, 2.0f);
            const auto comb = random_floats(R * H * H, 84 + R, 0.0f, 1.0f);
            DevVec<float> dy(y), ddown(down), dcomb(comb);
            struct Out {
                std::vector<float> X, mix, post, gate;
            };
            auto run = [&](bool folded) {
                DevVec<float> dX(X), post(post0), mix(R * M), gate(R * (H + 1));
                DevVec<double> part(cuda::hc_pre_partials(R, H, E));
                DevVec<uint32_t> count(cuda::hc_pre_counters(R));
                EXPECT_EQ(cudaMemset(count.get(), 0, count.size() * sizeof(uint32_t)), cudaSuccess);
                const float* moe = kind ? ddown.get() : nullptr;
                const bool y_init = kind != 2;
                const float* yp = kind == 2 ? nullptr : dy.get();
                cuda::HcPostIn pin;
                if (folded) pin = cuda::HcPostIn{true, yp, post.get(), dcomb.get(), moe, kind ? K : 0, y_init};
                else cuda::hc_post(dX.get(), yp, post.get(), dcomb.get(), R, H, E, nullptr, moe, kind ? K : 0, y_init);
                cuda::hc_pre_mix(hm.dw.w, dX.get(), hm.scale.get(), hm.base.get(), R, H, E, 1e-6f, 1e-6f, mix.get(),
                                 post.get(), gate.get(), part.get(), count.get(), nullptr, pin);
                EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                return Out{dX.download(), mix.download(), post.download(), gate.download()};
            };
            auto same = [](const std::vector<float>& u, const std::vector<float>& v, const char* what) {
                ASSERT_EQ(u.size(), v.size()) << what;
                EXPECT_EQ(0, std::memcmp(u.data(), v.data(), u.size() * sizeof(float))) << what;
            };
            // the tile kernel in both forms of its sums (exact: doubles; fast: floats)
            EXPECT_EQ(R >= 32, cuda::hc_mix_tile_folds_post(R));
            for (int fast = 0; fast < (R >= 32 ? 2 : 1); ++fast) {
                SCOPED_TRACE(fast ? "fast tile" : "exact");
                cuda::hc_mix_fast_override(fast);
                const Out a = run(false), b = run(true);
                cuda::hc_mix_fast_override(-1);
                same(a.X, b.X, "X");
                same(a.mix, b.mix, "mix");
                same(a.post, b.post, "post");
                same(a.gate, b.gate, "gate");
                EXPECT_NE(0, std::memcmp(a.X.data(), X.data(), X.size() * sizeof(float)));   // the post did run
            }
        }
    }
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

TEST_F(CudaKernels, RmsNormQ8_0EqualsNormThenQuantise) {
    // The query path's fused norm + Q8_0 codes: the same bits as rms_norm then quantize_act.
    for (uint32_t n : {1024u, 1536u, 96u, 2048u, 512u, 256u}) {   // (registers: 4, -, -, 8, 2, 1 values a thread)
        const uint32_t R = 3;
        auto x = random_floats(R * n, 400 + n, -4.0f, 4.0f);
        auto w = random_floats(n, 401 + n, 0.5f, 1.5f);
        DevVec<float> a(x), b(x), dw(w);
        ActHolder fused(R * n), ref(R * n);
        cuda::rms_norm_q8_0(a.get(), n, R, n, 1e-6f, dw.get(), fused.buf, nullptr);
        cuda::rms_norm(b.get(), n, b.get(), n, R, n, 1e-6f, dw.get(), nullptr);
        cuda::quantize_act(uint32_t(Type::Q8_0), b.get(), n, R, n, ref.buf, nullptr);
        auto xa = a.download(), xb = b.download();
        ASSERT_EQ(0, std::memcmp(xa.data(), xb.data(), R * n * 4)) << "normed rows, n=" << n;
        auto qa = fused.q.download(), qb = ref.q.download();
        ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), R * n)) << "codes, n=" << n;
        auto da = fused.d.download(), db = ref.d.download();
        ASSERT_EQ(0, std::memcmp(da.data(), db.data(), R * n / 32 * 4)) << "scales, n=" << n;
    }
}

TEST_F(CudaKernels, MatvecTailEqualsSeparateLaunches) {
    // A one-row product whose last block runs the next row step (matvec_tail) against the
    // product and the step's own kernel, bit for bit: q_a's product with the query norm and
    // its Q8_0 codes, the router's product with the router (biased top-K and hash routing).
    // Each tail launch runs twice: its counter must be left at 0.
    const uint64_t K = 4096;
    const auto x = random_floats(K, 501, -2.0f, 2.0f);
    DevVec<float> dx(x);
    DevVec<uint32_t> count(1);
    ASSERT_EQ(cudaMemset(count.get(), 0, sizeof(uint32_t)), cudaSuccess);
    {   // q_a (Q8_0, 1,024 rows) + rms_norm_q8_0
        const uint64_t N = 1024;
        const HostWeight hw = random_weight(Type::Q8_0, K, N, 502);
        DevWeightHolder dw(hw);
        ActHolder ax(K);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), K, 1, K, ax.buf, nullptr);
        ASSERT_TRUE(cuda::matvec_tail_fits(dw.w, a, 1, N, cuda::MvTail::NormQ8_0));
        const auto nw = random_floats(N, 503, 0.5f, 1.5f);
        DevVec<float> dnw(nw), y_ref(N), y_tail(N);
        ActHolder ref(N), tail(N);
        cuda::matvec(dw.w, a, 1, y_ref.get(), N, N, 0, nullptr);
        cuda::rms_norm_q8_0(y_ref.get(), N, 1, uint32_t(N), 1e-6f, dnw.get(), ref.buf, nullptr);
        for (int rep = 0; rep < 2; ++rep) {
            cuda::MvTail t;
            t.kind = cuda::MvTail::NormQ8_0;
            t.count = count.get();
            t.eps = 1e-6f;
            t.norm_w = dnw.get();
            t.q = tail.buf.q;
            t.d = tail.buf.d;
            cuda::matvec_tail(dw.w, a, y_tail.get(), N, t, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto ya = y_ref.download(), yb = y_tail.download();
            ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), N * sizeof(float))) << "normed row, rep " << rep;
            const auto qa = ref.q.download(), qb = tail.q.download();
            ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), N)) << "codes, rep " << rep;
            const auto da = ref.d.download(), db = tail.d.download();
            ASSERT_EQ(0, std::memcmp(da.data(), db.data(), N / 32 * sizeof(float))) << "scales, rep " << rep;
        }
    }
    for (bool hash : {false, true}) {   // router (F16, 256 experts, 6 picks)
        const uint32_t NE = 256, KU = 6, n_tok = 10;
        const HostWeight hw = random_weight(Type::F16, K, NE, 504);
        DevWeightHolder dw(hw);
        ActHolder ax(K);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::F16), dx.get(), K, 1, K, ax.buf, nullptr);
        ASSERT_TRUE(cuda::matvec_tail_fits(dw.w, a, 1, NE, cuda::MvTail::Router));
        const auto bias = random_floats(NE, 505, -0.1f, 0.1f);
        std::vector<int32_t> t2e(n_tok * KU);
        for (uint32_t i = 0; i < t2e.size(); ++i) t2e[i] = int32_t((i * 37 + 11) % NE);
        std::vector<cuda::DevRow> rows = {{77, 7, 0}};
        DevVec<float> dbias(bias), y_ref(NE), y_tail(NE), w_ref(KU), w_tail(KU);
        DevVec<int32_t> dt2e(t2e), e_ref(KU), e_tail(KU), bad(1);
        DevVec<cuda::DevRow> drows(rows);
        ASSERT_EQ(cudaMemset(bad.get(), 0, sizeof(int32_t)), cudaSuccess);
        cuda::matvec(dw.w, a, 1, y_ref.get(), NE, NE, 0, nullptr);
        cuda::router(y_ref.get(), 1, NE, KU, hash ? nullptr : dbias.get(), hash ? dt2e.get() : nullptr, drows.get(),
                     true, 1.5f, e_ref.get(), w_ref.get(), bad.get(), nullptr);
        for (int rep = 0; rep < 2; ++rep) {
            cuda::MvTail t;
            t.kind = cuda::MvTail::Router;
            t.count = count.get();
            t.router = {y_tail.get(), NE, KU, hash ? nullptr : dbias.get(), hash ? dt2e.get() : nullptr, drows.get(),
                        true, 1.5f, e_tail.get(), w_tail.get(), bad.get()};
            cuda::matvec_tail(dw.w, a, y_tail.get(), NE, t, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto ya = y_ref.download(), yb = y_tail.download();
            ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), NE * sizeof(float))) << "probs, hash " << hash;
            const auto ea = e_ref.download(), eb = e_tail.download();
            ASSERT_EQ(ea, eb) << "experts, hash " << hash;
            const auto wa = w_ref.download(), wb = w_tail.download();
            ASSERT_EQ(0, std::memcmp(wa.data(), wb.data(), KU * sizeof(float))) << "weights, hash " << hash;
        }
        EXPECT_EQ(bad.download()[0], 0);
    }
}

TEST_F(CudaKernels, HeadNormRopeRegistersEqualMemoryWalk) {
    // The query heads' norm + RoPE with the head in registers against the kernel that walks
    // it in memory, bit for bit (and with its angles made before the programmatic-launch wait):
    // flash's heads (512, tail 64), small's (128, 64), tiny's (64, 16), forward and inverse
    // rotation, with and without the norm, positions up to 1M.
    struct Shape {
        uint32_t D, n_rot, n_head;
    };
    for (const Shape sh : {Shape{512, 64, 8}, Shape{128, 64, 4}, Shape{64, 16, 4}, Shape{1024, 128, 2}}) {
        std::vector<double> invf(sh.n_rot / 2);
        for (uint32_t i = 0; i < sh.n_rot / 2; ++i) invf[i] = 1.0 / std::pow(10000.0, 2.0 * i / sh.n_rot);
        DevVec<double> dinv(invf);
        const uint32_t R = 3;
        std::vector<cuda::DevRow> rows = {{0, 1, 0}, {4097, 2, 0}, {1048575, 3, 0}};
        DevVec<cuda::DevRow> drows(rows);
        const auto q = random_floats(uint64_t(R) * sh.n_head * sh.D, sh.D + sh.n_rot, -3.0f, 3.0f);
        for (bool norm : {true, false})
            for (bool inverse : {false, true}) {
                std::vector<float> got[3];
                for (int reg : {0, 1, 2}) {   // (2: in registers, the angles before the wait: DSV4_ATTN_EARLY)
                    cuda::norm_reg_override(reg ? 1 : 0);
                    cuda::attn_early_override(reg == 2 ? 1 : 0);
                    DevVec<float> dq(q);
                    cuda::head_norm_rope(dq.get(), R, sh.n_head, sh.D, sh.n_rot, 1e-6f, norm, inverse, dinv.get(),
                                         drows.get(), nullptr);
                    got[reg] = dq.download();
                }
                cuda::norm_reg_override(-1);
                cuda::attn_early_override(-1);
                for (int reg : {1, 2})
                    ASSERT_EQ(0, std::memcmp(got[0].data(), got[reg].data(), q.size() * sizeof(float)))
                        << "D " << sh.D << " n_rot " << sh.n_rot << " norm " << norm << " inverse " << inverse
                        << " variant " << reg;
                EXPECT_NE(0, std::memcmp(got[1].data(), q.data(), q.size() * sizeof(float)));
            }
    }
}

// The top-k's selection by a sort: the k largest of s[0, n) (-0 equal to +0, ties to the lower
// index), their indices ascending.
namespace {
std::vector<uint32_t> topk_reference(const float* s, uint32_t n, uint32_t k) {
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0u);
    auto key = [](float f) { return f == 0.0f ? 0.0f : f; };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
        return key(s[a]) > key(s[b]) || (key(s[a]) == key(s[b]) && a < b);
    });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
}
}  // namespace

// The top-k (every key above the k-th largest, then its ties by the lower index, listed in
// index order) against a sort, with the keys staged in shared memory and read from global
// memory in every radix pass, the selection written by per-thread segments and by warps
// (DSV4_TOPK_WARP), rows of 4,096 keys or more selected from all keys and through a sample
// (DSV4_TOPK_FILTER; a row whose cut passes too many keys falls back): short rows (with tails
// past the 16-byte staging copies, one row not 16-byte aligned), decode rows
// of a long conversation (20,000 keys: past the fused indexer's 16,384), and rows past the
// staging's 40K keys (70,000; 90,001, filtered in chunks of staged keys). Values
// rounded to eighths: many ties, and a whole row of one value (the radix passes can stop on
// no digit early). Form 8: rows up to 32,768 keys by 1,024 threads with the keys in registers
// (DSV4_TOPK_REG: 16 keys a thread up to 16,384, 32 past it; rows of 16,381, 16,384 and 32,000
// keys among them; topk_select at widths 16,384 and 32,768). Form 9: the same with rows up to
// 262,144 keys by clusters of 2, 4 and 8 such blocks (DSV4_TOPK_CLUSTER: rows of 40,000,
// 65,536, 70,000, 90,001, 131,072, 200,003 and 262,144 keys; topk_select at widths 65,536 and
// 262,144). Then a prompt round's 70 rows at width 65,536 (past the decode-sized rounds' 64) by
// clusters (DSV4_TOPK_CLUSTER=2, the default) and by topk_select_kernel (=1).
TEST_F(CudaKernels, TopKTiesGoToTheLowerIndex) {
    // topk_select (k 512, ratio 4) on rows of one score matrix ld keys wide, row r seeing nv[r]
    // keys (values in sixteenths: ties), against the sort
    auto select_rows = [](uint32_t ld, const std::vector<uint32_t>& nv, uint64_t seed, auto what) {
        const uint32_t k = 512, R = uint32_t(nv.size()), ratio = 4;
        auto s = random_floats(uint64_t(R) * ld, seed, -3.0f, 3.0f);
        for (auto& v : s) v = std::round(v * 16.0f) / 16.0f;
        std::vector<cuda::DevRow> rows(R);
        for (uint32_t r = 0; r < R; ++r) rows[r] = {int64_t(ratio * nv[r] - 1 + r % ratio), 0, int32_t(r)};
        DevVec<float> ds(s);
        DevVec<cuda::DevRow> drows(rows);
        DevVec<uint32_t> sel(std::vector<uint32_t>(R * k, 0xdeadbeefu));
        cuda::topk_select(ds.get(), ld, R, drows.get(), ratio, k, sel.get(), nullptr);
        const auto got = sel.download();
        for (uint32_t r = 0; r < R; ++r) {
            const auto want = topk_reference(s.data() + uint64_t(r) * ld, nv[r], k);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data() + r * k, k * sizeof(uint32_t))) << "row " << r << " " << what();
        }
    };
    for (int form = 0; form < 10; ++form) {
        const int stage = form & 1 && form < 9 ? 0 : 1, warp = (form >> 1) & 1, filter = (form >> 2) & 1,
                  reg = form >> 3, cluster = form == 9;
        cuda::topk_stage_override(stage);
        cuda::topk_warp_override(warp);
        cuda::topk_filter_override(filter);
        cuda::topk_reg_override(reg);
        cuda::topk_cluster_override(cluster);
        for (uint32_t n : {600u, 601u, 1000u, 5000u, 5003u, 6000u, 16381u, 16384u, 20000u, 32000u, 40000u, 65536u,
                           70000u, 90001u, 131072u, 200003u, 262144u}) {
            if ((n == 16381 || n == 16384 || n == 32000) && !reg) continue;
            if ((n == 40000 || n == 65536 || n > 90001) && !cluster) continue;
            for (uint32_t k : {8u, 64u, 512u}) {
                if (k >= n || (n > 6000 && k != 512)) continue;
                auto s = random_floats(n, n + k, -1.0f, 1.0f);
                // eighths: many ties (the filter's cut passes too many at 70,000); 20,000 and
                // 90,001: few (90,001: the filter walks 3 chunks of staged keys)
                const float q = n == 20000 || n == 90001 || n == 16381 || n == 32000 || n == 65536 || n == 200003
                                    ? 4096.0f
                                    : 8.0f;
                for (auto& v : s) v = std::round(v * q) / q;
                s[5] = -0.0f;
                if (n == 1000 || n == 6000)   // one value nearly everywhere (the sample's cut passes too many)
                    std::fill(s.begin() + 100, s.end(), 0.25f);
                // (5,003: the row one float past a 16-byte boundary, staged a key at a time;
                // 601 and 5,003: a tail of keys past the 16-byte copies)
                const uint32_t off = n == 5003 ? 1 : 0;
                std::vector<float> row(off, 9.0f);
                row.insert(row.end(), s.begin(), s.end());
                DevVec<float> ds(row);
                DevVec<uint32_t> sel(k);
                cuda::topk_plain(ds.get() + off, n, k, sel.get(), nullptr);
                ASSERT_EQ(sel.download(), topk_reference(s.data(), n, k))
                    << "n " << n << " k " << k << " stage " << stage << " warp " << warp << " filter " << filter
                    << " reg " << reg << " cluster " << cluster;
            }
        }
        // topk_select: rows of one score matrix (ld 32,768) seeing 20,000, 513 and 30,001 keys;
        // forms 8, 9 also at ld 16,384 (16 keys a thread) with rows of 16,000, 513 and 9,001; form
        // 9 at ld 65,536 (40,000, 513, 65,536) and 262,144 (200,003, 513, 262,144)
        for (int width = 0; width < (cluster ? 4 : 1 + reg); ++width) {
            const uint32_t ld = width == 1 ? 16384 : width == 2 ? 65536 : width == 3 ? 262144 : 32768;
            const std::vector<uint32_t> nv = {width == 1   ? 16000u
                                              : width == 2 ? 40000u
                                              : width == 3 ? 200003u
                                                           : 20000u,
                                              513, width == 1 ? 9001u : width == 0 ? 30001u : ld};
            ASSERT_NO_FATAL_FAILURE(select_rows(ld, nv, 4242, [&] {
                return "ld " + std::to_string(ld) + " stage " + std::to_string(stage) + " warp " +
                       std::to_string(warp) + " filter " + std::to_string(filter) + " reg " + std::to_string(reg) +
                       " cluster " + std::to_string(cluster);
            }));
        }
    }
    for (int mode : {2, 1}) {   // a prompt round's 70 rows: by clusters (the default), by topk_select_kernel
        cuda::topk_cluster_override(mode);
        std::vector<uint32_t> nv(70);
        for (uint32_t r = 0; r < nv.size(); ++r) nv[r] = r % 3 == 0 ? 40000 + 97 * r : r % 3 == 1 ? 513 + r : 65536;
        ASSERT_NO_FATAL_FAILURE(select_rows(65536, nv, 4343, [&] {
            return "a 70-row round, DSV4_TOPK_CLUSTER=" + std::to_string(mode);
        }));
    }
    cuda::topk_stage_override(-1);
    cuda::topk_warp_override(-1);
    cuda::topk_filter_override(-1);
    cuda::topk_reg_override(-1);
    cuda::topk_cluster_override(-1);
}

// The fused indexer (queries prepared, scored and selected in one launch) against the
// three kernels it replaces (the queries prepared by a block a head and by a warp a head), bit for bit (the scores by the general and the tiled kernel): scores and selections, decode (R = 1, also with
// the keys staged past the base shared memory) and small batches (a row at or below top_k
// is left alone by both), official and plain numerics, index rows with many exact ties
// (duplicated rows, all-zero rows). Run twice: the row counters must be left at 0.
TEST_F(CudaKernels, IndexerFusedEqualsThreeKernels) {
    const uint32_t NH = 64, DI = 128, n_rot = 64, top_k = 512, n_layer = 2, il = 1;
    const float wscale = float(1.0 / std::sqrt(double(DI) * NH));
    std::vector<double> invf(n_rot / 2);
    for (uint32_t i = 0; i < n_rot / 2; ++i) invf[i] = 1.0 / std::pow(10000.0, 2.0 * i / n_rot);
    DevVec<double> dinv(invf);
    // (5,000 keys: the fused kernel's filter on its staged keys, the candidates after them;
    // 12,001: on the scores in L2, the candidates where the keys go)
    const std::vector<std::vector<uint64_t>> cases = {{1500}, {5000}, {12001}, {1025, 512, 2250},
                                                      {513, 700, 1024, 4001, 600}};
    for (bool official : {true, false}) {
        for (size_t ci = 0; ci < cases.size(); ++ci) {
            const auto& vis = cases[ci];
            const uint32_t R = uint32_t(vis.size());
            uint64_t max_vis = 0;
            for (uint64_t v : vis) max_vis = std::max(max_vis, v);
            uint64_t ld = 1024;
            while (ld < max_vis) ld *= 2;
            ASSERT_TRUE(cuda::indexer_fused_ok(R, NH, DI, n_rot, ld));
            // one session per row; index rows with a padded stride (16-byte aligned)
            const uint64_t stride = DI + 4;
            std::vector<std::unique_ptr<DevVec<float>>> dindex;
            std::vector<cuda::DevLayerKV> lkv(R * n_layer);
            std::vector<cuda::DevRow> rows(R);
            for (uint32_t r = 0; r < R; ++r) {
                const uint64_t n = vis[r];
                auto base = random_floats(97 * DI, 1000 * ci + r, -1.0f, 1.0f);
                for (auto& v : base) v = std::round(v * 4.0f) / 4.0f;
                std::vector<float> idx(n * stride, 0.0f);
                for (uint64_t c = 0; c < n; ++c) {
                    if (c % 13 == 5) continue;   // all-zero rows: scores of exactly 0
                    const uint64_t src = c < 200 ? c % 97 : (c * 7) % 97;   // duplicates: exact ties
                    std::copy(base.begin() + src * DI, base.begin() + (src + 1) * DI, idx.begin() + c * stride);
                }
                dindex.push_back(std::make_unique<DevVec<float>>(idx));
                lkv[r * n_layer + il].index = dindex.back()->get();
                lkv[r * n_layer + il].index_stride = stride;
                rows[r] = {int64_t(4 * n - 1 + r % 4), 0, int32_t(r)};
                ASSERT_EQ(uint64_t(rows[r].pos + 1) / 4, n);
            }
            DevVec<cuda::DevLayerKV> dlkv(lkv);
            DevVec<cuda::DevRow> drows(rows);
            auto q = random_floats(uint64_t(R) * NH * DI, 77 + ci, -2.0f, 2.0f);
            auto wv = random_floats(uint64_t(R) * NH, 99 + ci, -1.0f, 1.0f);
            DevVec<float> q_old(q), w_old(wv), q_new(q), w_new(wv);
            const std::vector<float> score_init(R * ld, 12345.0f);
            const std::vector<uint32_t> sel_init(R * top_k, 0xdeadbeefu);
            DevVec<float> s_old(score_init), s_new(score_init);
            DevVec<uint32_t> sel_old(sel_init), sel_new(sel_init);
            DevVec<uint32_t> count(std::vector<uint32_t>(R, 0u));
            cuda::indexer_prep_warp_override(0);   // a block a head
            cuda::indexer_q_prep(q_old.get(), w_old.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), official, wscale,
                                 nullptr);
            {   // a warp a head (the default for heads of 128): the same bits
                DevVec<float> q_w(q), w_w(wv);
                cuda::indexer_prep_warp_override(1);
                cuda::indexer_q_prep(q_w.get(), w_w.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), official, wscale,
                                     nullptr);
                const auto qa = q_old.download(), qb = q_w.download(), wa = w_old.download(), wb = w_w.download();
                ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size() * sizeof(float)))
                    << "prepared queries, case " << ci << " official " << official;
                ASSERT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)));
            }
            cuda::indexer_prep_warp_override(-1);
            // the general scores kernel, then the tiled one (the default for this shape): same bits
            cuda::indexer_tiled_override(0);
            cuda::indexer_scores(q_old.get(), w_old.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k, ld,
                                 s_old.get(), ld, nullptr);
            const auto so_general = s_old.download();
            for (int form : {1, 2}) {   // (2: 32-key blocks of 4 warps, DSV4_IDX_TILED=2)
                cuda::indexer_tiled_override(form);
                DevVec<float> s_tiled(score_init);
                cuda::indexer_scores(q_old.get(), w_old.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k,
                                     ld, s_tiled.get(), ld, nullptr);
                ASSERT_EQ(0,
                          std::memcmp(so_general.data(), s_tiled.download().data(), so_general.size() * sizeof(float)))
                    << "tiled scores, form " << form << ", case " << ci << " official " << official;
            }
            cuda::indexer_tiled_override(-1);
            cuda::topk_select(s_old.get(), ld, R, drows.get(), 4, top_k, sel_old.get(), nullptr);
            const auto so = s_old.download();
            const auto lo = sel_old.download();
            // (rep 2: DSV4_ATTN_EARLY's early work and top-k passes; rep 3: the selection written by
            // warps; rep 4: rows of 4,096 keys or more through a sample, DSV4_TOPK_FILTER; rep 5: 3
            // tiles of keys a block, DSV4_IDX_FUSED_TILES; rep 6: as many as keep ~128 blocks a row,
            // with the filter)
            for (int rep = 0; rep < 7; ++rep) {
                cuda::attn_early_override(rep >= 2 ? 1 : 0);
                cuda::topk_warp_override(rep >= 3 && rep != 5 ? 1 : 0);
                cuda::topk_filter_override(rep == 4 || rep == 6 ? 1 : 0);
                cuda::indexer_fused_tiles_override(rep == 5 ? 3 : rep == 6 ? 0 : -1);
                cuda::indexer_fused(q_new.get(), w_new.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), official,
                                    wscale, dlkv.get(), n_layer, il, top_k, ld, s_new.get(), ld, count.get(),
                                    sel_new.get(), nullptr);
                cuda::attn_early_override(-1);
                cuda::topk_warp_override(-1);
                cuda::topk_filter_override(-1);
                cuda::indexer_fused_tiles_override(-1);
                const auto sn = s_new.download();
                const auto ln = sel_new.download();
                const auto cn = count.download();
                ASSERT_EQ(0, std::memcmp(so.data(), sn.data(), so.size() * sizeof(float)))
                    << "scores, case " << ci << " official " << official << " rep " << rep;
                ASSERT_EQ(0, std::memcmp(lo.data(), ln.data(), lo.size() * sizeof(uint32_t)))
                    << "selection, case " << ci << " official " << official << " rep " << rep;
                for (uint32_t r = 0; r < R; ++r) ASSERT_EQ(cn[r], 0u) << "counter of row " << r;
            }
            // the fused kernel reads its inputs only
            const auto qa = q_new.download();
            ASSERT_EQ(0, std::memcmp(qa.data(), q.data(), q.size() * sizeof(float)));
            // and the selection is the top-k with ties to the lower index
            for (uint32_t r = 0; r < R; ++r) {
                const uint64_t n = uint64_t(rows[r].pos + 1) / 4;
                if (n <= top_k) continue;
                const auto idx = topk_reference(so.data() + r * ld, uint32_t(n), top_k);
                ASSERT_EQ(0, std::memcmp(idx.data(), lo.data() + r * top_k, top_k * sizeof(uint32_t))) << "row " << r;
            }
        }
    }
}

// Prompt rounds' indexer scores on the BF16 tensor cores (official numerics) against a double
// reference and the FP32 kernel: FP4-simulated queries (indexer_q_prep, as floats and as the
// BF16 the tensor cores take: the same values) and index rows (as
// compressor_emit makes them: Hadamard + FP4), flash's shape (64 heads of 128) and tiny's (8
// of 64). The products are exact, so each score is within the FP32 sums' rounding of the
// double one. A row's scores are the same bits alone and in a batch (rows of several sessions
// in one block of rows, chunks of keys of any length); rows at or below top_k, and scores
// past a row's visible rows, are left alone.
TEST_F(CudaKernels, IndexerTensorCoreScoresMatchFp32) {
    struct Shape {
        uint32_t NH, DI, top_k;
    };
    for (const Shape sh : {Shape{64, 128, 512}, Shape{8, 64, 8}, Shape{20, 128, 16}}) {
        const uint32_t NH = sh.NH, DI = sh.DI, n_rot = 64 < DI ? 64 : DI / 2, top_k = sh.top_k, n_layer = 2, il = 1;
        ASSERT_TRUE(cuda::indexer_tc_ok(NH, DI));
        const float wscale = float(1.0 / std::sqrt(double(DI) * NH));
        std::vector<double> invf(n_rot / 2);
        for (uint32_t i = 0; i < n_rot / 2; ++i) invf[i] = 1.0 / std::pow(10000.0, 2.0 * i / n_rot);
        DevVec<double> dinv(invf);
        // 3 sessions: rows 0-20 of session 0, 21-24 of session 1 (few visible rows: left
        // alone when at or below top_k), 25-39 of session 2 (the block of rows 16-31 spans all three)
        const uint32_t n_sess = 3, R = 40;
        const uint64_t n_index[n_sess] = {uint64_t(top_k) + 700, uint64_t(top_k) + 3, uint64_t(top_k) + 257};
        const uint64_t stride = DI + 4;
        std::vector<std::vector<float>> idx(n_sess);
        std::vector<std::unique_ptr<DevVec<float>>> didx;
        std::vector<cuda::DevLayerKV> lkv(n_sess * n_layer);
        for (uint32_t s = 0; s < n_sess; ++s) {
            idx[s].assign(n_index[s] * stride, 0.0f);
            for (uint64_t c = 0; c < n_index[s]; ++c) {
                auto row = random_floats(DI, 5000 * s + c + DI, -3.0f, 3.0f);
                if (c % 11 == 3) std::fill(row.begin(), row.end(), 0.0f);
                cpu::hadamard(row.data(), DI);
                cpu::fp4_sim(row.data(), DI);
                std::copy(row.begin(), row.end(), idx[s].begin() + c * stride);
            }
            didx.push_back(std::make_unique<DevVec<float>>(idx[s]));
            lkv[s * n_layer + il].index = didx.back()->get();
            lkv[s * n_layer + il].index_stride = stride;
        }
        std::vector<cuda::DevRow> rows(R);
        for (uint32_t r = 0; r < R; ++r) {
            const uint32_t s = r < 21 ? 0 : r < 25 ? 1 : 2;
            // visible rows (pos + 1) / 4 from below top_k up to the session's n_index
            const uint64_t nv = r < 21 ? top_k - 2 + (n_index[0] - top_k + 2) * r / 20
                                : r < 25 ? top_k - 2 + (r - 21) * 5 / 3
                                         : n_index[2] - (r - 25) * 13;
            rows[r] = {int64_t(4 * std::min(nv, n_index[s]) + r % 4 - 1 + (nv == 0 ? 4 : 0)), 0, int32_t(s)};
        }
        DevVec<cuda::DevLayerKV> dlkv(lkv);
        DevVec<cuda::DevRow> drows(rows);
        const auto q = random_floats(uint64_t(R) * NH * DI, 31 + NH, -2.0f, 2.0f);
        const auto wv = random_floats(uint64_t(R) * NH, 37 + NH, -1.0f, 1.0f);
        DevVec<float> dq(q), dw(wv), dq2(q), dw2(wv);
        DevVec<uint16_t> dqb(uint64_t(R) * NH * DI);
        cuda::indexer_q_prep(dq.get(), dw.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), true, wscale, nullptr);
        // the same preparation with the queries as BF16 (the tensor cores' input): the floats' values
        cuda::indexer_q_prep(dq2.get(), dw2.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), true, wscale, nullptr,
                             dqb.get());
        const auto qp = dq.download(), wp = dw.download();
        {
            const auto qb = dqb.download();
            const auto q2 = dq2.download();
            for (size_t j = 0; j < qp.size(); ++j) {
                const uint32_t bits = uint32_t(qb[j]) << 16;
                float f;
                std::memcpy(&f, &bits, 4);
                ASSERT_EQ(f, qp[j]) << "BF16 query " << j;
            }
            ASSERT_EQ(0, std::memcmp(q2.data(), q.data(), q.size() * sizeof(float))) << "qi left alone";
            ASSERT_EQ(0, std::memcmp(dw2.download().data(), wp.data(), wp.size() * sizeof(float)));
        }
        uint64_t max_vis = 0;
        for (const auto& rw : rows) max_vis = std::max<uint64_t>(max_vis, uint64_t(rw.pos + 1) / 4);
        const uint64_t ld = max_vis + 5;
        const std::vector<float> init(R * ld, 12345.0f);
        DevVec<float> s_tc(init), s_f32(init);
        cuda::indexer_scores_tc(dqb.get(), dw.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k, max_vis,
                                s_tc.get(), ld, nullptr);
        cuda::indexer_scores(dq.get(), dw.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k, max_vis,
                             s_f32.get(), ld, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto tc = s_tc.download(), f32 = s_f32.download();
        uint64_t checked = 0;
        double worst = 0;
        for (uint32_t r = 0; r < R; ++r) {
            const uint64_t nv = uint64_t(rows[r].pos + 1) / 4;
            const float* krows = idx[rows[r].sess].data();
            for (uint64_t c = 0; c < ld; ++c) {
                const float got = tc[r * ld + c];
                if (nv <= top_k || c >= nv) {
                    ASSERT_EQ(got, 12345.0f) << "row " << r << " key " << c << " should be untouched";
                    continue;
                }
                double ref = 0, mag = 0;
                for (uint32_t h = 0; h < NH; ++h) {
                    double dot = 0, adot = 0;
                    for (uint32_t d = 0; d < DI; ++d) {
                        const double p = double(qp[(uint64_t(r) * NH + h) * DI + d]) * krows[c * stride + d];
                        dot += p;
                        adot += std::fabs(p);
                    }
                    ref += std::max(0.0, dot) * wp[uint64_t(r) * NH + h];
                    mag += adot * std::fabs(wp[uint64_t(r) * NH + h]);
                }
                const double tol = 2e-6 * mag + 1e-30;
                ASSERT_LE(std::fabs(got - ref), tol) << "row " << r << " key " << c << " NH " << NH;
                ASSERT_LE(std::fabs(f32[r * ld + c] - ref), tol) << "FP32 kernel, row " << r << " key " << c;
                worst = std::max(worst, mag > 0 ? std::fabs(got - ref) / mag : 0.0);
                ++checked;
            }
        }
        EXPECT_GT(checked, uint64_t(R) * 100);
        std::printf("NH %u DI %u: %llu scores, worst |tc - ref| / sum|terms| %.3g\n", NH, DI,
                    static_cast<unsigned long long>(checked), worst);
        // each row alone: the same bits as in the batch
        for (uint32_t r : {0u, 17u, 20u, 26u, 39u}) {
            DevVec<cuda::DevRow> one(std::vector<cuda::DevRow>{rows[r]});
            const auto qb = dqb.download();
            DevVec<uint16_t> q1(std::vector<uint16_t>(qb.begin() + uint64_t(r) * NH * DI, qb.begin() + uint64_t(r + 1) * NH * DI));
            DevVec<float> w1(std::vector<float>(wp.begin() + uint64_t(r) * NH, wp.begin() + uint64_t(r + 1) * NH));
            DevVec<float> s1(std::vector<float>(ld, 12345.0f));
            const uint64_t nv = uint64_t(rows[r].pos + 1) / 4;
            cuda::indexer_scores_tc(q1.get(), w1.get(), 1, NH, DI, one.get(), dlkv.get(), n_layer, il, top_k, nv,
                                    s1.get(), ld, nullptr);
            const auto a = s1.download();
            ASSERT_EQ(0, std::memcmp(a.data(), tc.data() + uint64_t(r) * ld, ld * sizeof(float))) << "row " << r;
        }
        // the batch by each number of rows a block (DSV4_IDX_TC_ROWS; above: the width's
        // default, 16 or 32): the same bits
        for (int rb : {16, 32, 5, 1}) {
            cuda::indexer_tc_rows_override(rb);
            DevVec<float> s_rb(init);
            cuda::indexer_scores_tc(dqb.get(), dw.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k,
                                    max_vis, s_rb.get(), ld, nullptr);
            cuda::indexer_tc_rows_override(-1);
            const auto a = s_rb.download();
            ASSERT_EQ(0, std::memcmp(a.data(), tc.data(), tc.size() * sizeof(float))) << rb << " rows a block";
        }
        // A decode round split by the rows' own lengths (DSV4_IDX_TC_DECODE): the queries
        // prepared as floats and BF16 at once (keep_qi), the rows below tc_from by the FP32
        // kernel (each tiled form for flash's shape), the others by the tensor cores, into one
        // matrix: each row the bits of its own kernel above, the rest untouched.
        DevVec<float> dq3(q), dw3(wv);
        DevVec<uint16_t> dqb3(uint64_t(R) * NH * DI);
        cuda::indexer_q_prep(dq3.get(), dw3.get(), R, NH, DI, n_rot, dinv.get(), drows.get(), true, wscale, nullptr,
                             dqb3.get(), true);
        ASSERT_EQ(0, std::memcmp(dq3.download().data(), qp.data(), qp.size() * sizeof(float))) << "qi kept";
        ASSERT_TRUE(dqb3.download() == dqb.download()) << "BF16 queries with qi kept";
        ASSERT_EQ(0, std::memcmp(dw3.download().data(), wp.data(), wp.size() * sizeof(float)));
        const std::vector<int> forms = NH == 64 && DI == 128 ? std::vector<int>{0, 1, 2} : std::vector<int>{0};
        for (const uint64_t tc_from : {uint64_t(top_k) + 1, uint64_t(top_k) + 200, n_index[2] - 20, max_vis + 1}) {
            for (const int form : forms) {
                cuda::indexer_tiled_override(form);
                DevVec<float> s_mix(init);
                cuda::indexer_scores(dq3.get(), dw3.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k,
                                     max_vis, s_mix.get(), ld, nullptr, tc_from);
                cuda::indexer_scores_tc(dqb3.get(), dw3.get(), R, NH, DI, drows.get(), dlkv.get(), n_layer, il, top_k,
                                        max_vis, s_mix.get(), ld, nullptr, tc_from);
                cuda::indexer_tiled_override(-1);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                const auto mix = s_mix.download();
                uint32_t n_tc = 0;
                for (uint32_t r = 0; r < R; ++r) {
                    const bool on_tc = uint64_t(rows[r].pos + 1) / 4 >= tc_from;
                    n_tc += on_tc;
                    ASSERT_EQ(0, std::memcmp(mix.data() + uint64_t(r) * ld, (on_tc ? tc : f32).data() + uint64_t(r) * ld,
                                             ld * sizeof(float)))
                        << "row " << r << " tc_from " << tc_from << " form " << form << (on_tc ? " (tc)" : " (fp32)");
                }
                if (tc_from == uint64_t(top_k) + 200) {
                    EXPECT_TRUE(n_tc > 0 && n_tc < R) << "a split round";
                }
            }
        }
    }
}

// ---- sink attention (§5.12) ---------------------------------------------------------------
namespace {

// The KV of layer il of n_sess sessions on the device (a raw ring longer than the window, so
// windows wrap around it, and compressed rows with a padded stride), plus the sinks and the
// RoPE frequencies. Rows, queries and selections are per call.
struct AttnProblem {
    uint32_t n_head, D, n_rot, n_swa, top_k, ratio;
    uint32_t n_layer = 2, il = 1, n_sess = 2, raw_cap;
    uint64_t n_comp, comp_stride;
    std::vector<std::vector<float>> raw, comp;   // per session
    std::vector<float> sinks;
    std::vector<double> inv_freq;
    std::vector<std::unique_ptr<DevVec<float>>> draw, dcomp;
    std::unique_ptr<DevVec<float>> dsinks;
    std::unique_ptr<DevVec<double>> dinv;
    std::unique_ptr<DevVec<cuda::DevLayerKV>> dlkv;
    std::vector<std::unique_ptr<DevVec<uint16_t>>> dkh;   // per session: the FP16 keys (DevLayerKV::kh)

    AttnProblem(uint32_t n_head_, uint32_t D_, uint32_t n_rot_, uint32_t n_swa_, uint32_t top_k_, uint32_t ratio_,
                int64_t max_pos, uint64_t seed)
        : n_head(n_head_), D(D_), n_rot(n_rot_), n_swa(n_swa_), top_k(top_k_), ratio(ratio_) {
        raw_cap = n_swa + 24;
        comp_stride = D + 8;
        n_comp = std::max<uint64_t>(1, ratio ? uint64_t(max_pos + 1) / ratio : 0);
        std::vector<cuda::DevLayerKV> lkv(n_sess * n_layer);
        for (uint32_t s = 0; s < n_sess; ++s) {
            raw.push_back(random_floats(uint64_t(raw_cap) * D, seed * 100 + 2 * s, -1.0f, 1.0f));
            comp.push_back(random_floats(n_comp * comp_stride, seed * 100 + 2 * s + 1, -1.0f, 1.0f));
            draw.push_back(std::make_unique<DevVec<float>>(raw.back()));
            dcomp.push_back(std::make_unique<DevVec<float>>(comp.back()));
            cuda::DevLayerKV& L = lkv[s * n_layer + il];
            L.raw = draw.back()->get();
            L.comp = dcomp.back()->get();
            L.comp_stride = comp_stride;
            L.raw_cap = raw_cap;
            // FP16 keys of every ring row and compressed row (run() makes them where the round
            // has them: the warpgroup form 3)
            dkh.push_back(std::make_unique<DevVec<uint16_t>>(cuda::key_halves_values(raw_cap, max_pos, D)));
            L.kh = dkh.back()->get();
            L.kh_lo = std::max<int64_t>(0, max_pos + 1 - int64_t(raw_cap));
            L.kh_hi = max_pos;
        }
        sinks = random_floats(n_head, seed * 100 + 99, -2.0f, 2.0f);
        sinks[0] = 6.0f;                  // a sink that takes most of the weight
        if (n_head > 1) sinks[1] = -30.0f;   // one that takes none
        for (uint32_t i = 0; i < n_rot / 2; ++i) inv_freq.push_back(std::pow(10000.0, -2.0 * i / n_rot));
        dsinks = std::make_unique<DevVec<float>>(sinks);
        dinv = std::make_unique<DevVec<double>>(inv_freq);
        dlkv = std::make_unique<DevVec<cuda::DevLayerKV>>(lkv);
    }

    bool uses_sel(int64_t pos) const { return ratio == 4 && uint64_t(pos + 1) / 4 > top_k; }

    // Rows at the given positions (sessions alternate), their queries and their selections
    // (top_k distinct ascending rows of the visible ones where the row has more than top_k).
    void make_rows(const std::vector<int64_t>& pos, uint64_t seed, std::vector<cuda::DevRow>* rows,
                   std::vector<float>* q, std::vector<uint32_t>* sel) const {
        rows->clear();
        for (size_t i = 0; i < pos.size(); ++i) rows->push_back({pos[i], 0, int32_t(i % n_sess)});
        *q = random_floats(pos.size() * n_head * D, seed, -4.0f, 4.0f);
        sel->assign(std::max<size_t>(1, pos.size() * top_k), 0u);
        uint64_t st = seed * 0x9E3779B97F4A7C15ull + 11;
        for (size_t i = 0; i < pos.size(); ++i) {
            if (!uses_sel(pos[i])) continue;
            std::vector<uint32_t> idx(uint64_t(pos[i] + 1) / 4);
            std::iota(idx.begin(), idx.end(), 0u);
            for (uint32_t k = 0; k < top_k; ++k) {   // partial Fisher-Yates
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                std::swap(idx[k], idx[k + (st >> 33) % (idx.size() - k)]);
            }
            std::sort(idx.begin(), idx.begin() + top_k);
            std::copy(idx.begin(), idx.begin() + top_k, sel->begin() + i * top_k);
        }
    }

    // The FP16 keys made, where the round has them (AttnKernel's mode 9), as the backend does
    // before each layer's attention.
    void halves(cudaStream_t s = nullptr) const {
        if (cuda::attn_key_halves_round()) cuda::keys_to_halves(dlkv->get(), n_sess, n_layer, il, D, ratio, s);
    }

    // attention of rows (queries q, selections sel) into out, or with oh.h its output as FP16 there
    void launch(const std::vector<cuda::DevRow>& rows, const std::vector<float>& q, const std::vector<uint32_t>& sel,
                float* out, cuda::AttnHalfOut oh, cudaStream_t s, cuda::AttnQNorm qn = {}) const {
        DevVec<cuda::DevRow> drows(rows);
        DevVec<float> dq(q);
        DevVec<uint32_t> dsel(sel);
        halves(s);
        cuda::attention(dq.get(), dsinks->get(), uint32_t(rows.size()), n_head, D, n_swa, ratio, top_k, dsel.get(),
                        drows.get(), dlkv->get(), n_layer, il, n_rot, dinv->get(), out, s, nullptr, qn, oh);
        EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    }
    std::vector<float> run(const std::vector<cuda::DevRow>& rows, const std::vector<float>& q,
                           const std::vector<uint32_t>& sel, cudaStream_t s = nullptr) const {
        DevVec<float> dout(uint64_t(rows.size()) * n_head * D);
        launch(rows, q, sel, dout.get(), {}, s);
        return dout.download();
    }
    // The output as FP16 (attention's AttnHalfOut; o still takes the fast kernels' queries), and the
    // largest magnitude the launch gave (its bits as a float) into *max.
    std::vector<uint16_t> run_half(const std::vector<cuda::DevRow>& rows, const std::vector<float>& q,
                                   const std::vector<uint32_t>& sel, float* max = nullptr) const {
        const uint64_t n = uint64_t(rows.size()) * n_head * D;
        DevVec<float> dout(n);
        DevVec<uint16_t> dh(n);
        DevVec<unsigned> dmax(std::vector<unsigned>{0x7f7fffffu});   // (attention zeroes it)
        launch(rows, q, sel, dout.get(), {dh.get(), dmax.get()}, nullptr);
        if (max) std::memcpy(max, dmax.download().data(), sizeof(float));
        return dh.download();
    }

    // §5.12 in double for row i, then the inverse RoPE of the tail: out [n_head][D].
    std::vector<double> reference(const cuda::DevRow& row, const float* q, const uint32_t* sel) const {
        const int64_t p = row.pos;
        const int64_t lo = p + 1 >= int64_t(n_swa) ? p + 1 - n_swa : 0;
        const uint64_t n_vis = ratio ? uint64_t(p + 1) / ratio : 0;
        std::vector<const float*> keys;
        for (int64_t t = lo; t <= p; ++t) keys.push_back(&raw[row.sess][uint64_t(t % raw_cap) * D]);
        const uint64_t n_c = uses_sel(p) ? top_k : n_vis;
        for (uint64_t j = 0; j < n_c; ++j)
            keys.push_back(&comp[row.sess][(uses_sel(p) ? sel[j] : j) * comp_stride]);
        std::vector<double> out(uint64_t(n_head) * D, 0.0), sc(keys.size());
        for (uint32_t h = 0; h < n_head; ++h) {
            const float* qh = q + uint64_t(h) * D;
            double m = sinks[h];
            for (size_t j = 0; j < keys.size(); ++j) {
                double s = 0;
                for (uint32_t d = 0; d < D; ++d) s += double(qh[d]) * keys[j][d];
                sc[j] = s / std::sqrt(double(D));
                m = std::max(m, sc[j]);
            }
            double den = std::exp(double(sinks[h]) - m);
            double* oh = &out[uint64_t(h) * D];
            for (size_t j = 0; j < keys.size(); ++j) {
                const double e = std::exp(sc[j] - m);
                den += e;
                for (uint32_t d = 0; d < D; ++d) oh[d] += e * keys[j][d];
            }
            for (uint32_t d = 0; d < D; ++d) oh[d] /= den;
            double* t = oh + (D - n_rot);
            for (uint32_t i = 0; i < n_rot / 2; ++i) {
                const double th = double(p) * inv_freq[i], c = std::cos(th), sn = -std::sin(th);
                const double x0 = t[2 * i], x1 = t[2 * i + 1];
                t[2 * i] = x0 * c - x1 * sn;
                t[2 * i + 1] = x0 * sn + x1 * c;
            }
        }
        return out;
    }
};

struct AttnShape {
    uint32_t n_head, D, n_rot, n_swa, top_k;
};
// The model's shape (Flash: 64 heads of 512, window 128, 512 selected rows), and small ones
// with partial head groups (the FP32 kernel takes 8 heads, the tensor-core kernel 16): 12
// heads of D = 64, the synthetic tiny and small models' 4 × 64 and 8 × 128, 20 heads of
// D = 256 (a full and a partial group of 16), and D = 96, which only the FP32 kernel takes.
const AttnShape kAttnShapes[] = {{64, 512, 64, 128, 512}, {12, 64, 16, 16, 8},   {4, 64, 16, 16, 8},
                                 {8, 128, 64, 128, 32},   {20, 256, 32, 32, 16}, {6, 96, 32, 16, 8}};

// A problem of shape sh and layer kind ratio (its compressed rows enough for position max_pos,
// by default the last of pos; seed: its caches) with rows at the positions pos and their
// queries and selections (row_seed).
struct AttnCase {
    AttnProblem P;
    std::vector<cuda::DevRow> rows;
    std::vector<float> q;
    std::vector<uint32_t> sel;
    AttnCase(const AttnShape& sh, uint32_t ratio, const std::vector<int64_t>& pos, uint64_t seed, uint64_t row_seed,
             int64_t max_pos = -1)
        : P(sh.n_head, sh.D, sh.n_rot, sh.n_swa, sh.top_k, ratio,
            max_pos >= 0 ? max_pos : *std::max_element(pos.begin(), pos.end()), seed) {
        P.make_rows(pos, row_seed, &rows, &q, &sel);
    }
};

// The attention path for a scope: 1 the tensor-core splits, 0 the FP32 splits (both with the
// merge: decode's path), 2 / 3 a prompt round's item per row (gemm_prefill_order(true): the
// rows kernel of attention_tc.cu with 8 / 16 warps where attn_rows_ok (16: widths of 128 or
// more), else the environment's splits), 4 the rows kernel on the FP16 tensor cores
// (attention_rows_f16.cu) for widths 256 and 512, else as 3, 5 the same in its plain FP16 form
// (DSV4_ATTN_FAST), 6 that form in tiles of 32 keys for width 512 (attn_rows_fast_kernel,
// DSV4_ATTN_FAST_KT=32), else as 5; 7 those tiles by Hopper's warpgroup MMA
// (attn_rows_wg_kernel, DSV4_ATTN_FAST_WG=1) where the device has it, else as 6; 8 the same with
// its key tiles copied by cp.async (DSV4_ATTN_FAST_WG=2); 9 the same from FP16 keys
// (DSV4_ATTN_FAST_WG=3, the round's keys made by keys_to_halves: AttnProblem::run); 10 from
// those keys with its consumers in split roles (DSV4_ATTN_FAST_WG=4: other bits); the
// environment's choice again afterwards.
struct AttnKernel {
    explicit AttnKernel(int mode) {
        if (mode >= 2) {
            cuda::gemm_prefill_order(true);
            cuda::attn_rows_warps_override(mode >= 3 ? 16 : 8);
            cuda::attn_rows_f16_override(mode >= 4 ? 1 : 0);
            cuda::attn_rows_fast_override(mode >= 5 ? 1 : 0);
            cuda::attn_rows_fast_kt_override(mode >= 6 ? 32 : 16);
            cuda::attn_rows_fast_wg_override(mode >= 7 ? mode - 6 : 0);
            cuda::attn_key_halves_round(mode >= 9);
        } else {
            cuda::attn_tc_override(mode);
        }
    }
    ~AttnKernel() {
        cuda::gemm_prefill_order(false);
        cuda::attn_tc_override(-1);
        cuda::attn_rows_warps_override(-1);
        cuda::attn_rows_f16_override(-1);
        cuda::attn_rows_fast_override(-1);
        cuda::attn_rows_fast_kt_override(-1);
        cuda::attn_rows_fast_wg_override(-1);
        cuda::attn_key_halves_round(false);
    }
    AttnKernel(const AttnKernel&) = delete;
    AttnKernel& operator=(const AttnKernel&) = delete;
};
// Forces the split kernels' groups per item for slices of 32 rows or more for a scope
// (cuda::attn_loop_override: 0 an item per head group, 1 an item per (row, split) over all
// its groups, 2 the tensor-core kernel's choice, 3 the FP32 kernel's items of all heads where
// the splits are one tile); the environment's choice again afterwards.
struct AttnLoop {
    explicit AttnLoop(int mode) { cuda::attn_loop_override(mode); }
    ~AttnLoop() { cuda::attn_loop_override(-1); }
    AttnLoop(const AttnLoop&) = delete;
    AttnLoop& operator=(const AttnLoop&) = delete;
};

// Positions per layer kind: window only, partial window, ring wrap (raw_cap = n_swa + 24),
// compressed rows below/at/above top_k (ratio 4), and long contexts (ratio 128: up to ~3000 keys).
std::vector<int64_t> attn_positions(const AttnShape& sh, uint32_t ratio) {
    const int64_t w = sh.n_swa, k4 = 4 * int64_t(sh.top_k);
    if (ratio == 0) return {0, 1, w / 2, w - 1, w, w + 30, 5 * w + 7};
    if (ratio == 4) return {0, 3, w + 2, k4 - 2, k4 - 1, k4 + 2, k4 + 3, k4 + 777, 10 * k4 + 5};
    return {0, 5, w - 1, w, 127, 128, 300, 4095, 65535, 200001, 369999};
}

}  // namespace

// Against a double-precision evaluation of §5.12 from the same inputs: raw ring rows (with
// wrap-around), all visible or the selected compressed rows, sinks, inverse RoPE; key counts
// from 1 to ~3000, so rows have one split up to the capped 32. The plain FP16 rows kernel (mode
// 5, widths 256 and 512; DSV4_ATTN_FAST) rounds queries, keys, weights and values to FP16 once
// each (2^-11 of each): held to 5e-3 of the head's largest output (queries in [-4, 4], keys in
// [-1, 1]: its scores move by ~3e-4 a key, its weights and values by 2^-11); mode 6 (its 32-key
// tiles at width 512) the same, and modes 7 to 10 (those tiles by the warpgroup MMA, where the
// device has it: its launches counted).
TEST_F(CudaKernels, AttentionMatchesDoubleReference) {
    for (int tc : {10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}) {
        const AttnKernel kernel(tc);
        for (const AttnShape& sh : kAttnShapes) {
            for (uint32_t ratio : {0u, 4u, 128u}) {
                const AttnCase c(sh, ratio, attn_positions(sh, ratio), sh.D + ratio, 5 + ratio);
                const auto& [P, rows, q, sel] = c;
                const uint64_t wg0 = cuda::attn_rows_wg_calls();
                const auto got = P.run(rows, q, sel);
                if (tc >= 7 && sh.D == 512 && sh.n_head <= 64 && cuda::gemm_experts_wgmma_available()) {
                    EXPECT_GT(cuda::attn_rows_wg_calls(), wg0) << "the warpgroup kernel was not taken";
                }
                for (size_t i = 0; i < rows.size(); ++i) {
                    const auto ref = P.reference(rows[i], &q[i * sh.n_head * sh.D], &sel[i * sh.top_k]);
                    for (uint32_t h = 0; h < sh.n_head; ++h) {
                        double md = 0, mr = 0;
                        for (uint32_t d = 0; d < sh.D; ++d) {
                            const double a = got[(i * sh.n_head + h) * sh.D + d], b = ref[uint64_t(h) * sh.D + d];
                            md = std::max(md, std::isnan(a) ? INFINITY : std::fabs(a - b));
                            mr = std::max(mr, std::fabs(b));
                        }
                        // ~1e-6 expected (float scores over D = 512 and exps rounded once).
                        const bool fp16 = tc >= 5 && (sh.D == 256 || sh.D == 512);
                        ASSERT_LE(md, (fp16 ? 5e-3 : 1e-5) * mr + 1e-12) << "tc " << tc << " D " << sh.D << " ratio " << ratio
                                                         << " pos " << rows[i].pos << " head " << h << " max|ref| "
                                                         << mr;
                    }
                }
            }
        }
    }
}

// A row's output is the same bits computed alone (decode), in a batch of many rows (several
// slices of rows inside the launcher), or at another place in the batch; the batches with
// the head-group loop (DSV4_ATTN_LOOP) forced off and on, for both kernels: a row alone is
// one item per head group, a slice of 32 rows or more with the loop an item per (row,
// split) over the groups (the keys of a one-tile split copied once), or on the tensor cores
// (mode 2) runs of groups whose length depends on the slice and the GPU, or (mode 3, FP32)
// an item per (row, split) for all heads (the 64- and 8-head shapes, ratio 0 and 4). The loop needs two
// head groups at least: the 64-, 20- and 12-head shapes for the FP32 kernel (8 heads a
// group), the 64- and 20-head ones for the tensor cores (16). R: slices of 32 rows or more
// for every layer kind of the model's shape (ratio 128: 100 rows = slices of 34, 34, 32). Mode 5
// (the plain FP16 rows kernel) and 6 (its 32-key tiles) too: other bits than mode 4, but a
// row's own whatever the batch; modes 7 to 10 (the warpgroup forms) too.
TEST_F(CudaKernels, AttentionRowsAreBitIdenticalAloneAndBatched) {
    for (int tc : {10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}) {
        const AttnKernel kernel(tc);
        for (const AttnShape& sh : kAttnShapes) {
            for (uint32_t ratio : {0u, 4u, 128u}) {
                auto base = attn_positions(sh, ratio);
                std::vector<int64_t> pos;
                const uint32_t R = ratio == 0 ? 40 : ratio == 4 ? 80 : 100;
                for (uint32_t i = 0; i < R; ++i) pos.push_back(base[(i * 7) % base.size()] + (i % 3));
                const AttnCase c(sh, ratio, pos, 3 * sh.D + ratio, 17 + ratio);
                const auto& [P, rows, q, sel] = c;
                const size_t HD = size_t(sh.n_head) * sh.D;
                // The batch reversed.
                std::vector<cuda::DevRow> rrows(rows.rbegin(), rows.rend());
                std::vector<float> rq(q.size());
                std::vector<uint32_t> rsel(sel.size());
                for (uint32_t i = 0; i < R; ++i) {
                    std::copy_n(&q[i * HD], HD, &rq[(R - 1 - i) * HD]);
                    std::copy_n(&sel[i * sh.top_k], sh.top_k, &rsel[(R - 1 - i) * sh.top_k]);
                }
                std::vector<std::vector<float>> alone(R);
                for (uint32_t i = 0; i < R; ++i) {
                    const std::vector<cuda::DevRow> one = {rows[i]};
                    const std::vector<float> q1(q.begin() + i * HD, q.begin() + (i + 1) * HD);
                    const std::vector<uint32_t> s1(sel.begin() + i * sh.top_k, sel.begin() + (i + 1) * sh.top_k);
                    alone[i] = P.run(one, q1, s1);
                }
                for (int loop : {0, 1, 2, 3}) {
                    if (loop == 2 && !tc) continue;   // (the FP32 kernel takes 2 as 1)
                    if (loop == 3 && tc) continue;    // (the tensor cores take 3 as 1)
                    if (tc >= 2 && loop) continue;    // (a prompt round's rows kernel has no loop modes)
                    const AttnLoop looped(loop);
                    const auto batch = P.run(rows, q, sel);
                    const auto rev = P.run(rrows, rq, rsel);
                    for (uint32_t i = 0; i < R; ++i) {
                        ASSERT_EQ(std::memcmp(alone[i].data(), &batch[i * HD], HD * sizeof(float)), 0)
                            << "tc " << tc << " loop " << loop << " D " << sh.D << " ratio " << ratio << " row " << i
                            << " pos " << rows[i].pos;
                        ASSERT_EQ(std::memcmp(alone[i].data(), &rev[(R - 1 - i) * HD], HD * sizeof(float)), 0)
                            << "tc " << tc << " loop " << loop << " D " << sh.D << " ratio " << ratio << " row " << i
                            << " pos " << rows[i].pos << " (reversed)";
                    }
                }
                if (!tc) {
                    // The FP32 kernel with its early work before the programmatic-launch wait
                    // (DSV4_ATTN_EARLY: item list and L2 prefetches first): the same bits.
                    cuda::attn_early_override(1);
                    const AttnLoop looped(0);
                    const auto batch = P.run(rows, q, sel);
                    for (uint32_t i = 0; i < R; ++i) {
                        ASSERT_EQ(std::memcmp(alone[i].data(), &batch[i * HD], HD * sizeof(float)), 0)
                            << "early, D " << sh.D << " ratio " << ratio << " row " << i;
                        if (i < 3) {
                            const std::vector<cuda::DevRow> one = {rows[i]};
                            const std::vector<float> q1(q.begin() + i * HD, q.begin() + (i + 1) * HD);
                            const std::vector<uint32_t> s1(sel.begin() + i * sh.top_k,
                                                           sel.begin() + (i + 1) * sh.top_k);
                            const auto a1 = P.run(one, q1, s1);
                            ASSERT_EQ(std::memcmp(alone[i].data(), a1.data(), HD * sizeof(float)), 0)
                                << "early alone, D " << sh.D << " ratio " << ratio << " row " << i;
                        }
                    }
                    cuda::attn_early_override(-1);
                }
            }
        }
    }
}

// The warpgroup forms (modes 7, 8, 9: keys through the producer's registers, by cp.async as
// floats, by cp.async from the FP16 keys) round every key to FP16 the same way and run the same
// consumers: the same bits, for every layer kind of the model's shape (rows alternating two
// sessions, windows wrapping the ring, selections).
TEST_F(CudaKernels, AttentionWarpgroupFormsAgreeBitForBit) {
    if (!cuda::gemm_experts_wgmma_available()) GTEST_SKIP() << "no warpgroup MMA on this device";
    const AttnShape sh = kAttnShapes[0];
    for (uint32_t ratio : {0u, 4u, 128u}) {
        const AttnCase c(sh, ratio, attn_positions(sh, ratio), 5 * sh.D + ratio, 31 + ratio);
        const auto& [P, rows, q, sel] = c;
        std::vector<float> first;
        for (int mode : {7, 8, 9}) {
            const AttnKernel kernel(mode);
            const uint64_t wg0 = cuda::attn_rows_wg_calls();
            const auto got = P.run(rows, q, sel);
            ASSERT_GT(cuda::attn_rows_wg_calls(), wg0) << "mode " << mode << ": the warpgroup kernel was not taken";
            if (first.empty()) first = got;
            else
                ASSERT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float)))
                    << "mode " << mode << " against mode 7, ratio " << ratio;
        }
    }
}

// The fast rows kernels of 32-key tiles (modes 6 to 10: mma.sync and the warpgroup forms) write
// their output as FP16 where asked (attention's AttnHalfOut): each half the float output's times
// kAttnHalfScale rounded once to nearest even, for every row, head and layer kind, and their
// largest magnitude (before that rounding) where asked; the other kernels (a prompt round's other
// forms, decode's splits) refuse it with an error.
TEST_F(CudaKernels, AttentionHalfOutputEqualsScaledFloats) {
    const AttnShape sh = kAttnShapes[0];
    for (int mode : {10, 9, 8, 7, 6, 5, 3, 0}) {
        const AttnKernel kernel(mode);
        if (mode >= 7 && !cuda::gemm_experts_wgmma_available()) continue;
        const bool takes = mode >= 6;
        ASSERT_EQ(takes, cuda::attn_rows_half_output(sh.n_head, sh.D, sh.n_rot)) << "mode " << mode;
        for (uint32_t ratio : {0u, 4u, 128u}) {
            const AttnCase c(sh, ratio, attn_positions(sh, ratio), 7 * sh.D + ratio, 41 + ratio);
            const auto& [P, rows, q, sel] = c;
            if (!takes) {
                EXPECT_ANY_THROW(P.run_half(rows, q, sel)) << "mode " << mode;
                continue;
            }
            const auto plain = P.run(rows, q, sel);
            const uint64_t before = cuda::attn_half_output_calls();
            float max = -1.0f;
            const auto half = P.run_half(rows, q, sel, &max);
            ASSERT_GT(cuda::attn_half_output_calls(), before);
            ASSERT_EQ(half.size(), plain.size());
            uint64_t bad = 0, first = 0;
            float want = 0.0f;
            for (uint64_t i = 0; i < half.size(); ++i) {
                if (half[i] != quant::fp32_to_fp16(plain[i] * cuda::kAttnHalfScale) && bad++ == 0) first = i;
                want = std::max(want, std::fabs(plain[i]) * cuda::kAttnHalfScale);
            }
            EXPECT_EQ(bad, 0u) << "mode " << mode << ", ratio " << ratio << ": first at " << first << " ("
                               << plain[first] << ")";
            EXPECT_EQ(max, want) << "mode " << mode << ", ratio " << ratio << ": the largest magnitude";
        }
    }
}

// Raw queries given as FP16 (AttnQNorm::h: q_b's half output, DSV4_ATTN_HALF_OUT=3) give the
// fast rows kernels (modes 6 to 10) the bits of the same values given as floats: each half
// divided by its top's factor is that float exactly; a kernel without the fast query kernel
// refuses them.
TEST_F(CudaKernels, AttentionHalfQueriesEqualTheirFloats) {
    const AttnShape sh = kAttnShapes[0];
    const float top = 65536.0f, f = 0.125f;   // (f16_factor(top, 1) = 2^(14 - 17))
    for (int mode : {10, 9, 8, 7, 6, 5}) {
        const AttnKernel kernel(mode);
        if (mode >= 7 && !cuda::gemm_experts_wgmma_available()) continue;
        ASSERT_TRUE(cuda::attn_rows_qnorm(sh.n_head, sh.D, sh.n_rot)) << "mode " << mode;
        for (uint32_t ratio : {0u, 4u, 128u}) {
            const AttnCase c(sh, ratio, attn_positions(sh, ratio), 11 * sh.D + ratio, 61 + ratio);
            const auto& [P, rows, q, sel] = c;
            std::vector<uint16_t> qh(q.size());
            std::vector<float> qf(q.size());
            for (size_t i = 0; i < q.size(); ++i) {
                qh[i] = quant::fp32_to_fp16(q[i] * 3.0f * f);   // (raw q_b outputs: a few units)
                qf[i] = quant::fp16_to_fp32(qh[i]) / f;
            }
            unsigned tb = 0;
            std::memcpy(&tb, &top, 4);
            DevVec<uint16_t> dqh(qh);
            DevVec<unsigned> dtop(std::vector<unsigned>{tb});
            const uint64_t n = uint64_t(rows.size()) * sh.n_head * sh.D;
            DevVec<float> a(n), b(n);
            const cuda::AttnQNorm raw{true, 1e-6f};
            if (mode < 6) {
                EXPECT_ANY_THROW(P.launch(rows, qf, sel, b.get(), {}, nullptr,
                                          cuda::AttnQNorm{true, 1e-6f, dqh.get(), dtop.get()}))
                    << "mode " << mode;
                continue;
            }
            P.launch(rows, qf, sel, a.get(), {}, nullptr, raw);
            P.launch(rows, qf, sel, b.get(), {}, nullptr, cuda::AttnQNorm{true, 1e-6f, dqh.get(), dtop.get()});
            const auto fa = a.download(), fb = b.download();
            EXPECT_EQ(0, std::memcmp(fa.data(), fb.data(), n * 4)) << "mode " << mode << ", ratio " << ratio;
        }
    }
}

// Captured into a CUDA graph after an eager run of the same shape (as the backend does), the
// launch replays with the same scratch and gives the eager run's bits.
TEST_F(CudaKernels, AttentionOutputCodesEqualQuantizeAct) {
    // The merge (and a prompt round's rows kernel) can write the output projection's Q8_0 codes
    // of o itself: the same bytes as quantize_act from o, and o unchanged (mode 5: the plain FP16
    // rows kernel's o; mode 6: its 32-key tiles, whose codes leave from the accumulators; modes 7
    // to 10 those tiles by the warpgroup MMA).
    for (int tc : {10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}) {
        const AttnKernel kernel(tc);
        for (const AttnShape& sh : kAttnShapes) {
            if (sh.D % 128) continue;
            const AttnCase c(sh, 4, {3, 640, 2051}, 91, 92, 4096);
            const auto& [P, rows, q, sel] = c;
            const uint32_t R = uint32_t(rows.size());
            const uint64_t n = uint64_t(R) * sh.n_head * sh.D;
            const auto plain = P.run(rows, q, sel, nullptr);
            DevVec<cuda::DevRow> drows(rows);
            DevVec<float> dq(q), dout(n);
            DevVec<uint32_t> dsel(sel);
            ActHolder fused(n), ref(n);
            cuda::attention(dq.get(), P.dsinks->get(), R, sh.n_head, sh.D, sh.n_swa, 4, sh.top_k, dsel.get(),
                            drows.get(), P.dlkv->get(), P.n_layer, P.il, sh.n_rot, P.dinv->get(), dout.get(), nullptr,
                            &fused.buf);
            const auto o = dout.download();
            ASSERT_EQ(0, std::memcmp(o.data(), plain.data(), n * 4)) << "o changed, D=" << sh.D;
            const uint64_t K = uint64_t(sh.n_head) * sh.D;
            cuda::quantize_act(uint32_t(Type::Q8_0), dout.get(), K, R, K, ref.buf, nullptr);
            auto qa = fused.q.download(), qb = ref.q.download();
            ASSERT_EQ(0, std::memcmp(qa.data(), qb.data(), n)) << "codes, D=" << sh.D;
            auto da = fused.d.download(), db = ref.d.download();
            ASSERT_EQ(0, std::memcmp(da.data(), db.data(), n / 32 * 4)) << "scales, D=" << sh.D;
        }
    }
}

TEST_F(CudaKernels, AttentionGraphReplayMatchesEager) {
    for (int tc : {4, 3, 2, 1, 0}) {
        const AttnKernel kernel(tc);
        const AttnShape sh = kAttnShapes[0];
        const AttnCase c(sh, 4, {5, 700, 2051, 9000}, 77, 78);
        const auto& [P, rows, q, sel] = c;
        const uint32_t R = uint32_t(rows.size());
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        const auto eager = P.run(rows, q, sel, s);
        DevVec<cuda::DevRow> drows(rows);
        DevVec<float> dq(q), dout(uint64_t(R) * sh.n_head * sh.D);
        DevVec<uint32_t> dsel(sel);
        cudaGraph_t g = nullptr;
        cudaGraphExec_t e = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        cuda::attention(dq.get(), P.dsinks->get(), R, sh.n_head, sh.D, sh.n_swa, 4, sh.top_k, dsel.get(), drows.get(),
                        P.dlkv->get(), P.n_layer, P.il, sh.n_rot, P.dinv->get(), dout.get(), s);
        ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
        for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        const auto replay = dout.download();
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
        cudaStreamDestroy(s);
        ASSERT_EQ(std::memcmp(replay.data(), eager.data(), replay.size() * sizeof(float)), 0) << "tc " << tc;
    }
}

// The tensor-core split kernel (3xTF32) against the FP32 CUDA-core one, both measured
// against the double-precision evaluation of §5.12, on every shape the tensor cores take,
// every layer kind and key counts from 1 to ~3000 (one split up to the capped 32).
// Why ~1e-6: an output is a weighted mean of value rows, so it moves by about the error of
// the scores (an error δ in a score scales its weight by 1 + δ) plus the rounding of the
// sums. FP32 scores over D = 512 with |q| <= 4, |k| <= 1 are sums of ~30 in magnitude, a
// few 1e-6 off after 512 roundings of 2^-24 relative, times 1/sqrt(512): δ ≈ 1e-7; the
// weighted sums and the merge add a few ulp. 3xTF32 represents each operand as hi + lo to
// within 2^-22 (lo keeps 11 of the 13 bits below hi) and drops lo·lo: up to ~4 ulp of a
// single product, far below the rounding accumulated over many keys, and its sums are no
// longer than the FP32 kernel's (see attention_tc.cu), so both are ~1e-7 .. 1e-6 of max|ref|
// per head. Asserted: the tensor-core error no worse than twice the FP32 kernel's, as the
// root mean square over all outputs of a case and as the largest one, with floors of 2^-25
// and 2^-22 (that representation error) for rows of a few keys, where the FP32 kernel is
// within an ulp or two; and the two kernels within 4e-6 of max|ref| of each other per head.
// The same bounds hold for a prompt round's rows kernel (mode 2: one running softmax a head
// over all its keys, on the same 3xTF32 products, no partials and no merge), and for its FP16
// form (mode 4, widths 256 and 512: each operand as two FP16 halves, 22 bits as 3xTF32's pair,
// the queries and weights scaled by powers of two so small values keep them).
TEST_F(CudaKernels, AttentionTensorCoresMatchFp32Kernel) {
    for (const AttnShape& sh : kAttnShapes) {
        if (!(sh.D == 64 || sh.D == 128 || sh.D == 256 || sh.D == 512)) continue;
        ASSERT_TRUE(cuda::attn_rows_ok(sh.n_head, sh.D, sh.n_rot)) << "D " << sh.D;
        for (uint32_t ratio : {0u, 4u, 128u}) {
            const AttnCase c(sh, ratio, attn_positions(sh, ratio), 7 * sh.D + ratio, 31 + ratio);
            const auto& [P, rows, q, sel] = c;
            // The FP32 kernel's outputs and the double reference, once for both paths.
            std::vector<float> got_old;
            {
                const AttnKernel kernel(0);
                got_old = P.run(rows, q, sel);
            }
            std::vector<std::vector<double>> refs;
            for (size_t i = 0; i < rows.size(); ++i)
                refs.push_back(P.reference(rows[i], &q[i * sh.n_head * sh.D], &sel[i * sh.top_k]));
            for (int mode : {1, 2, 3, 4}) {
                std::vector<float> got_tc;
                {
                    const AttnKernel kernel(mode);
                    got_tc = P.run(rows, q, sel);
                }
                double max_tc = 0, max_old = 0, sq_tc = 0, sq_old = 0, max_diff = 0;
                uint64_t count = 0;
                for (size_t i = 0; i < rows.size(); ++i) {
                    const auto& ref = refs[i];
                    for (uint32_t h = 0; h < sh.n_head; ++h) {
                        double mr = 0;
                        for (uint32_t d = 0; d < sh.D; ++d) mr = std::max(mr, std::fabs(ref[uint64_t(h) * sh.D + d]));
                        mr = std::max(mr, 1e-30);
                        double hd = 0;
                        for (uint32_t d = 0; d < sh.D; ++d) {
                            const uint64_t at = (i * sh.n_head + h) * sh.D + d;
                            const double b = ref[uint64_t(h) * sh.D + d];
                            const double et = std::fabs(got_tc[at] - b) / mr, eo = std::fabs(got_old[at] - b) / mr;
                            ASSERT_FALSE(std::isnan(et)) << "D " << sh.D << " ratio " << ratio << " pos " << rows[i].pos;
                            max_tc = std::max(max_tc, et);
                            max_old = std::max(max_old, eo);
                            sq_tc += et * et;
                            sq_old += eo * eo;
                            hd = std::max(hd, std::fabs(double(got_tc[at]) - double(got_old[at])) / mr);
                            ++count;
                        }
                        ASSERT_LE(hd, 4e-6) << "mode " << mode << " D " << sh.D << " ratio " << ratio << " pos "
                                            << rows[i].pos << " head " << h;
                        max_diff = std::max(max_diff, hd);
                    }
                }
                const double rms_tc = std::sqrt(sq_tc / double(count)), rms_old = std::sqrt(sq_old / double(count));
                const char* path = mode == 4   ? "rows kernel (FP16 where D >= 256)"
                                   : mode == 3 ? "rows kernel (16 warps)"
                                   : mode == 2 ? "rows kernel"
                                               : "tensor cores";
                std::printf("attention n_head %u D %u ratio %u: error / max|ref| %s max %.3g rms %.3g, FP32 max "
                            "%.3g rms %.3g; largest difference %.3g\n",
                            sh.n_head, sh.D, ratio, path, max_tc, rms_tc, max_old, rms_old, max_diff);
                EXPECT_LE(rms_tc, 2.0 * rms_old + std::ldexp(1.0, -25))
                    << "mode " << mode << " D " << sh.D << " ratio " << ratio;
                EXPECT_LE(max_tc, 2.0 * max_old + std::ldexp(1.0, -22))
                    << "mode " << mode << " D " << sh.D << " ratio " << ratio;
            }
        }
    }
}

// A prompt round's rows kernel with the queries' norm and RoPE folded in (attn_rows_qnorm,
// AttnQNorm), given the raw queries, against head_norm_rope then the kernel with the fold off,
// bit for bit: the outputs and (D a multiple of 128) the output projection's Q8_0 codes and
// scales. Every shape the rows kernel takes (12, 4 and 20 heads: partial m-tiles, their padding
// heads zero), every layer kind, 8 and 16 warps, rows 1, 3, 40 and 300 (more rows than the
// H200's blocks: a block's later rows take their angles from the end of the row before). The
// raw queries' rms is ~2.3, so a kernel that skipped the norm would differ: the fold-off kernel
// given them raw must not match.
TEST_F(CudaKernels, AttentionRowsQueryNormInKernelEqualsHeadNormRope) {
    constexpr float eps = 1e-6f;
    struct Fold {   // the fold forced for a scope, the environment's choice again afterwards
        explicit Fold(bool on) { cuda::attn_rows_qnorm_override(on ? 1 : 0); }
        ~Fold() { cuda::attn_rows_qnorm_override(-1); }
        Fold(const Fold&) = delete;
        Fold& operator=(const Fold&) = delete;
    };
    struct Out {
        std::vector<float> o, d;
        std::vector<int8_t> q;
    };
    // (AttnKernel: the rows kernel with 8 / 16 warps, FP16, plain FP16 in tiles of 32 keys: its
    // queries' norm in attn_fast_q_kernel, the same bits as head_norm_rope's)
    for (int mode : {2, 3, 4, 6, 7, 8, 9, 10}) {
        const AttnKernel kernel(mode);
        for (const AttnShape& sh : kAttnShapes) {
            if (!cuda::attn_rows_ok(sh.n_head, sh.D, sh.n_rot)) continue;   // (D = 96: the splits)
            if (mode == 3 && sh.D < 128) continue;                         // (16 warps: D >= 128 only)
            if (mode == 4 && sh.D < 256) continue;                         // (FP16: D of 256 and 512)
            if (mode >= 6 && sh.D != 512) continue;                        // (32-key tiles: D of 512)
            for (uint32_t ratio : {0u, 4u, 128u}) {
                const auto base = attn_positions(sh, ratio);
                for (uint32_t R : {1u, 3u, 40u, 300u}) {
                    std::vector<int64_t> pos;
                    for (uint32_t i = 0; i < R; ++i) pos.push_back(base[(i * 5 + 1) % base.size()] + (i % 2));
                    const AttnCase c(sh, ratio, pos, 5 * sh.D + ratio, 29 + R);
                    const auto& [P, rows, q, sel] = c;
                    const uint64_t n = uint64_t(R) * sh.n_head * sh.D;
                    const bool codes = sh.D % 128 == 0;
                    DevVec<cuda::DevRow> drows(rows);
                    DevVec<uint32_t> dsel(sel);
                    // how: 0 the raw queries, fold off; 1 head_norm_rope first, fold off; 2 the fold
                    auto go = [&](int how) {
                        const Fold fold(how == 2);
                        EXPECT_EQ(cuda::attn_rows_qnorm(sh.n_head, sh.D, sh.n_rot), how == 2);
                        DevVec<float> dq(q), dout(n);
                        ActHolder oc(n);
                        if (how == 1)
                            cuda::head_norm_rope(dq.get(), R, sh.n_head, sh.D, sh.n_rot, eps, true, false,
                                                 P.dinv->get(), drows.get(), nullptr);
                        P.halves();
                        cuda::attention(dq.get(), P.dsinks->get(), R, sh.n_head, sh.D, sh.n_swa, ratio, sh.top_k,
                                        dsel.get(), drows.get(), P.dlkv->get(), P.n_layer, P.il, sh.n_rot,
                                        P.dinv->get(), dout.get(), nullptr, codes ? &oc.buf : nullptr,
                                        cuda::AttnQNorm{how == 2, eps});
                        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                        Out r;
                        r.o = dout.download();
                        if (codes) {
                            r.q = oc.q.download();
                            r.d = oc.d.download();
                        }
                        return r;
                    };
                    const Out raw = go(0), ref = go(1), got = go(2);
                    const std::string what = (mode >= 7 ? "fast WG " + std::to_string(mode - 6) : mode == 6 ? std::string("fast 32") : mode == 4 ? std::string("FP16") : "warps " + std::to_string(mode == 3 ? 16 : 8)) + " heads " +
                                             std::to_string(sh.n_head) + " D " + std::to_string(sh.D) + " ratio " +
                                             std::to_string(ratio) + " R " + std::to_string(R);
                    ASSERT_NE(0, std::memcmp(raw.o.data(), ref.o.data(), n * sizeof(float))) << what;
                    ASSERT_EQ(0, std::memcmp(got.o.data(), ref.o.data(), n * sizeof(float))) << what;
                    if (codes) {
                        ASSERT_EQ(0, std::memcmp(got.q.data(), ref.q.data(), n)) << what << " (codes)";
                        ASSERT_EQ(0, std::memcmp(got.d.data(), ref.d.data(), n / 32 * sizeof(float)))
                            << what << " (scales)";
                    }
                }
            }
        }
    }
}

TEST_F(CudaKernels, MoePairGroupsEqualOnePairAtATime) {
    // Prefill gathers the (row, expert) pairs by expert so a block reads an expert's rows once
    // for up to 8 pairs; every pair's result must be bit-identical to computing it alone.
    // Uneven counts: one expert with 19 pairs (three groups), some with one, some with none.
    // Groups of IQ2_XXS / Q2_K pairs take the tensor cores (gemm_kq_experts): K = 4,096 puts
    // two super-blocks on each of the decode kernel's lanes.
    for (const uint64_t K : {1024, 4096}) {
        // (groups of 8 for matvec, of gemm_kq_pairs() = 32 for the tensor cores: expert 4 has
        // 51 pairs, so two groups, the second partial)
        const uint64_t RPE = 70, N = 70;
        const uint32_t NEXP = 7, KU = 3, R = 30, P = R * KU;
        std::vector<int32_t> ex(P);
        for (uint32_t p = 0; p < P; ++p) ex[p] = p % 2 ? 4 : int32_t((p * 5) % NEXP);
        DevVec<int32_t> dex(ex);
        const uint32_t cap = cuda::moe_groups_cap(P, NEXP, 8);
        DevVec<int32_t> grp8(3 * cap), pairs8(P), count8(1), grp32(3 * cap), pairs32(P), count32(1);
        const cuda::MoeGroups groups8{grp8.get(), pairs8.get(), count8.get(), cap, 8};
        const cuda::MoeGroups groups32{grp32.get(), pairs32.get(), count32.get(), cap, cuda::gemm_kq_pairs()};
        cuda::moe_groups(dex.get(), P, NEXP, groups8, nullptr);
        cuda::moe_groups(dex.get(), P, NEXP, groups32, nullptr);
        auto cnt = count8.download();
        ASSERT_GE(cnt[0], int32_t(NEXP + 5));
        ASSERT_LE(uint32_t(cnt[0]), cap);
        for (Type t : {Type::Q8_0, Type::IQ2_XXS, Type::Q2_K, Type::Q4_K, Type::MXFP4, Type::F16}) {
            const bool tc = t == Type::IQ2_XXS || t == Type::Q2_K;
            const cuda::MoeGroups& groups = tc ? groups32 : groups8;
            const HostWeight hg = random_weight(t, K, RPE * NEXP, 501 + uint64_t(t));
            const HostWeight hu = random_weight(t, K, RPE * NEXP, 601 + uint64_t(t));
            DevWeightHolder dg(hg), du(hu);
            auto x = random_floats(R * K, 17 + uint64_t(t), -2.0f, 2.0f);
            DevVec<float> dx(x);
            ActHolder ah(R * K);
            const cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), K, R, K, ah.buf, nullptr);
            auto wv = random_floats(P, 19, 0.1f, 1.0f);
            DevVec<float> dew(wv);
            // ungrouped expert pairs run one pair per block row, as decode does
            DevVec<float> alone(P * N), grouped(P * N);
            cuda::matvec(dg.w, a, P, alone.get(), N, N, 0, nullptr, dex.get(), RPE, KU);
            cuda::matvec(dg.w, a, P, grouped.get(), N, N, 0, nullptr, dex.get(), RPE, KU, &groups);
            auto ref = alone.download();
            auto got = grouped.download();
            ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * 4)) << quant::traits(t).name << " matvec K " << K;
            if (cuda::matvec_swiglu_ok(dg.w, du.w)) {
                // (a fused Q2_K gate+up has no tensor-core kernel: it takes matvec's groups of 8)
                const cuda::MoeGroups& gsw = t == Type::Q2_K ? groups8 : groups;
                DevVec<float> f1(P * N), f2(P * N);
                cuda::matvec_swiglu(dg.w, du.w, a, P, f1.get(), N, N, 0.05f, dew.get(), nullptr, dex.get(), RPE, KU);
                cuda::matvec_swiglu(dg.w, du.w, a, P, f2.get(), N, N, 0.05f, dew.get(), nullptr, dex.get(), RPE, KU,
                                    &gsw);
                auto r1 = f1.download();
                auto r2 = f2.download();
                ASSERT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * 4))
                    << quant::traits(t).name << " swiglu K " << K;
            }
        }
    }
}

TEST_F(CudaKernels, Iq2DecodeSharedTablesEqualGlobal) {
    // IQ2_XXS decode (one slot per block row) looks its grid and signs up in shared memory
    // (DSV4_KQ_SMEM = 1, or 2 with 3 blocks per SM), or streams its rows through shared
    // memory (mode 3 here: DSV4_KQ_STREAM, for K = 2,048 and 4,096); the results must be those
    // of the global-memory lookups (0) bit for bit: plain rows and expert pairs, gate+up fused
    // and single products, N not a multiple of a block's rows (warps without rows), K of one
    // partial to two full rounds of loads.
    const uint64_t RPE = 200, NEXP = 3, N = 200;
    for (const uint64_t K : {256, 2048, 4096, 8192}) {
        const HostWeight hg = random_weight(Type::IQ2_XXS, K, RPE * NEXP, 701 + K);
        const HostWeight hu = random_weight(Type::IQ2_XXS, K, RPE * NEXP, 801 + K);
        DevWeightHolder dg(hg), du(hu);
        const uint32_t AR = 3, P = 6;
        const std::vector<int32_t> ex = {2, 0, 1, 2, 2, 0};
        DevVec<int32_t> dex(ex);
        auto wv = random_floats(P, 23, 0.1f, 1.0f);
        DevVec<float> dew(wv);
        auto x = random_floats(AR * K, 29 + K, -2.0f, 2.0f);
        DevVec<float> dx(x);
        ActHolder ah(AR * K);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::IQ2_XXS), dx.get(), K, AR, K, ah.buf, nullptr);
        std::vector<float> ref[4];
        for (int mode : {0, 1, 2, 3}) {
            cuda::kq_smem_select(mode == 3 ? 1 : mode);
            cuda::kq_stream_select(mode == 3 ? 1 : 0);
            DevVec<float> y1(N), y2(P * N), f1(N), f2(P * N);
            cuda::matvec(dg.w, a, 1, y1.get(), N, N, 0, nullptr);
            cuda::matvec(dg.w, a, P, y2.get(), N, N, 0, nullptr, dex.get(), RPE, 2);
            cuda::matvec_swiglu(dg.w, du.w, a, 1, f1.get(), N, N, 0.0f, nullptr, nullptr);
            cuda::matvec_swiglu(dg.w, du.w, a, P, f2.get(), N, N, 0.05f, dew.get(), nullptr, dex.get(), RPE, 2);
            const std::vector<float> got[4] = {y1.download(), y2.download(), f1.download(), f2.download()};
            for (int c = 0; c < 4; ++c) {
                if (mode == 0) {
                    ref[c] = got[c];
                } else {
                    ASSERT_EQ(ref[c].size(), got[c].size());
                    ASSERT_EQ(0, std::memcmp(ref[c].data(), got[c].data(), ref[c].size() * 4))
                        << "K " << K << " mode " << mode << " case " << c;
                }
            }
        }
        cuda::kq_smem_select(-1);
        cuda::kq_stream_select(-1);
    }
}

TEST_F(CudaKernels, Q2KDecodeVariantsEqual) {
    // Q2_K decode with one slot per block row runs 4 rows per warp (DSV4_Q2K_V = 0), 8 rows
    // per warp with 2 blocks per SM (1), 4 rows with 3 blocks per SM (2), 8 rows with 3
    // blocks per SM (3), or pipelined (4, 5: two or four rows a warp, the next group's loads
    // during a group's arithmetic; its warps walk ~4 groups on the first shape): the same bits
    // for plain rows and expert pairs (the routed experts' down product: K = 2,048, 4,096
    // rows per expert), row counts that leave warps partly filled or without rows, K of a
    // partial to two full steps.
    const std::pair<uint64_t, uint64_t> shapes[] = {{4096, 2048}, {200, 2048}, {77, 256}, {131, 4096}, {1, 2048}};
    for (auto [RPE, K] : shapes) {
        const uint64_t NEXP = 3;
        const HostWeight hw = random_weight(Type::Q2_K, K, RPE * NEXP, 1301 + K + RPE);
        DevWeightHolder dw(hw);
        const uint32_t AR = 6, P = 6;
        const std::vector<int32_t> ex = {2, 0, 1, 2, 2, 0};
        DevVec<int32_t> dex(ex);
        auto x = random_floats(AR * K, 31 + K, -2.0f, 2.0f);
        DevVec<float> dx(x);
        ActHolder ah(AR * K);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::Q2_K), dx.get(), K, AR, K, ah.buf, nullptr);
        const uint64_t N = RPE;
        std::vector<float> ref[3];
        for (int v : {0, 1, 2, 3, 4, 5}) {
            cuda::q2k_select(v);
            DevVec<float> y1(N), y2(P * N), y3(P * N);
            cuda::matvec(dw.w, a, 1, y1.get(), N, N, 0, nullptr);
            // the decode's down product: slot i reads activation row i (one pair per block row)
            cuda::matvec(dw.w, a, P, y2.get(), N, N, 0, nullptr, dex.get(), RPE, 1);
            // and two slots per activation row (as the gate/up products of a token's experts)
            cuda::matvec(dw.w, a, P, y3.get(), N, N, 0, nullptr, dex.get(), RPE, 2);
            const std::vector<float> got[3] = {y1.download(), y2.download(), y3.download()};
            for (int c = 0; c < 3; ++c) {
                if (v == 0) {
                    ref[c] = got[c];
                } else {
                    ASSERT_EQ(ref[c].size(), got[c].size());
                    ASSERT_EQ(0, std::memcmp(ref[c].data(), got[c].data(), ref[c].size() * 4))
                        << "RPE " << RPE << " K " << K << " variant " << v << " case " << c;
                }
            }
        }
        cuda::q2k_select(-1);
    }
}

TEST_F(CudaKernels, Q8RowsVariantsEqual) {
    // The one-row Q8_0 products (q8_rows_kernel, DSV4_Q8_ROWS_V = 0) against the variant
    // that issues every weight load first with an evict-first policy (1) and the one with
    // twice the rows per warp (2): the same bits. The decode shapes (q_b 32,768 x 1,024,
    // out_b 4,096 x 8,192, out_a 8,192 x 4,096 in 8 groups), row counts that leave a warp
    // partly filled, plain, grouped and gate+up with SwiGLU. (N > 1,024: smaller products
    // with K >= 2,048 take the wide-row kernel.)
    struct Shape {
        uint64_t N, K, G;   // G: groups of the grouped product (0: none)
    };
    const Shape shapes[] = {{32768, 1024, 0}, {4096, 8192, 0}, {8192, 4096, 8}, {1037, 1024, 0},
                            {1061, 2048, 0},  {1029, 4096, 0}, {1027, 8192, 0}, {1040, 1024, 4},
                            {1056, 2048, 4},  {45, 1024, 0}};
    for (const Shape& sh : shapes) {
        const uint64_t N = sh.N, K = sh.K, G = sh.G ? sh.G : 1;
        const HostWeight hw = random_weight(Type::Q8_0, K, N, 2900 + K + N);
        const HostWeight hu = random_weight(Type::Q8_0, K, N, 3900 + K + N);
        DevWeightHolder dw(hw), du(hu);
        auto x = random_floats(G * K, 37 + K, -2.0f, 2.0f);
        DevVec<float> dx(x);
        ActHolder ah(G * K), ah1(K);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), G * K, 1, G * K, ah.buf, nullptr);
        const cuda::DevAct a1 = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), K, 1, K, ah1.buf, nullptr);
        std::vector<float> ref[2];
        for (int v : {0, 1, 2}) {
            cuda::q8_rows_select(v);
            DevVec<float> y(N), f(N);
            if (sh.G) cuda::matvec_grouped(dw.w, a, 1, y.get(), N, N, N / G, nullptr);
            else cuda::matvec(dw.w, a1, 1, y.get(), N, N, 0, nullptr);
            cuda::matvec_swiglu(dw.w, du.w, a1, 1, f.get(), N, N, 0.0f, nullptr, nullptr);
            const std::vector<float> got[2] = {y.download(), f.download()};
            for (int c = 0; c < 2; ++c) {
                if (v == 0) {
                    ref[c] = got[c];
                } else {
                    ASSERT_EQ(ref[c].size(), got[c].size());
                    ASSERT_EQ(0, std::memcmp(ref[c].data(), got[c].data(), ref[c].size() * 4))
                        << "N " << N << " K " << K << " G " << sh.G << " variant " << v << " case " << c;
                }
            }
        }
        cuda::q8_rows_select(-1);
    }
}

// Decode's result for each of R Q8_0 activation rows (of AK values) computed alone: the
// reference the tensor-core products must equal bit for bit.
std::vector<float> q8_0_rows_one_at_a_time(const cuda::DevWeight& w, const cuda::DevAct& a, uint32_t R, uint64_t AK,
                                           uint64_t N, uint64_t rpg) {
    DevVec<float> one(R * N);
    for (uint32_t r = 0; r < R; ++r) {
        cuda::DevAct ar = a;
        ar.q = a.q + uint64_t(r) * AK;
        ar.d = a.d + uint64_t(r) * (AK / 32);
        if (rpg) cuda::matvec_grouped(w, ar, 1, one.get() + r * N, N, N, rpg, nullptr);
        else cuda::matvec(w, ar, 1, one.get() + r * N, N, N, 0, nullptr);
    }
    return one.download();
}

// A Q8_0 product of the tensor-core tests: a random weight of N rows of K values, R random
// activation rows (groups × K values for a grouped product: N / rpg groups) and their Q8_0
// codes on the device.
struct Q8_0Case {
    uint64_t K, N, rpg;
    uint32_t R;
};
struct Q8_0Problem {
    uint64_t AK;   // values per activation row
    HostWeight hw;
    DevWeightHolder dw;
    std::vector<float> x;
    DevVec<float> dx;
    ActHolder ah;
    cuda::DevAct a;
    Q8_0Problem(const Q8_0Case& c, uint64_t weight_seed, uint64_t act_seed)
        : AK((c.rpg ? c.N / c.rpg : 1) * c.K),
          hw(random_weight(Type::Q8_0, c.K, c.N, weight_seed)),
          dw(hw),
          x(random_floats(c.R * AK, act_seed, -2.0f, 2.0f)),
          dx(x),
          ah(c.R * AK),
          a(cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), AK, c.R, AK, ah.buf, nullptr)) {}
    // The activation's codes and scales, downloaded.
    void act_to_host(std::vector<int8_t>& q, std::vector<float>& d) const {
        q.resize(x.size());
        d.resize(x.size() / 32);
        ASSERT_EQ(cudaMemcpy(q.data(), a.q, q.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d.data(), a.d, d.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
};

// Row n of a Q8_0 weight (hw, K values a row) against act(k), the activation's value k, in
// double: the sum, and the terms' magnitudes added to mag.
template <typename Act>
double q8_0_row_dot(const HostWeight& hw, uint64_t K, uint64_t n, Act act, double& mag) {
    const uint8_t* wr = hw.bytes.data() + n * quant::row_bytes(Type::Q8_0, K);
    double sum = 0;
    for (uint64_t b = 0; b < K / 32; ++b) {
        const uint8_t* blk = wr + b * 34;
        const double dw = quant::fp16_to_fp32(uint16_t(blk[0] | (blk[1] << 8)));
        for (uint64_t i = 0; i < 32; ++i) {
            const double t = dw * int8_t(blk[2 + i]) * act(b * 32 + i);
            sum += t;
            mag += std::fabs(t);
        }
    }
    return sum;
}

TEST_F(CudaKernels, TensorCoreQ8_0EqualsDecodeBitForBit) {
    // Prefill's tensor-core Q8_0 product (R >= 16) must give each row exactly what decode
    // (one row at a time) gives: same integer block sums, same float steps, same tree of sums.
    // K below, at and above 32 blocks (a lane with no, one, several blocks), N with a tail,
    // R with a tail, and the grouped product of the attention output.
    // Decode gives rows of N <= 1024 with K >= 2048 a wide block (256 or 1024 threads): those
    // shapes follow that block's order (N 72 and 64 below).
    for (const Q8_0Case c : {Q8_0Case{512, 100, 0, 16}, Q8_0Case{1024, 256, 0, 37}, Q8_0Case{4096, 1100, 0, 20},
                             Q8_0Case{8192, 1088, 0, 33}, Q8_0Case{1024, 128, 64, 17}, Q8_0Case{4096, 72, 0, 20},
                             Q8_0Case{8192, 64, 0, 18}, Q8_0Case{2048, 1024, 0, 16}}) {
        ASSERT_TRUE(cuda::gemm_q8_0_eligible(cuda::DevWeight{uint32_t(Type::Q8_0), c.K, c.N, 0}, c.R, c.N, c.rpg,
                                             false))
            << "K " << c.K;
        const Q8_0Problem pr(c, 900 + c.K + c.N, 31 + c.R);
        const uint64_t AK = pr.AK;
        const HostWeight& hw = pr.hw;
        const DevWeightHolder& dw = pr.dw;
        const std::vector<float>& x = pr.x;
        const cuda::DevAct& a = pr.a;
        DevVec<float> tc(c.R * c.N), old_tc(c.R * c.N);
        cuda::gemm_q8_0(dw.w, a, c.R, tc.get(), c.N, c.N, 0, c.rpg, nullptr);
        cuda::gemm_q8_0_version(0);   // the register-fed kernel too
        cuda::gemm_q8_0(dw.w, a, c.R, old_tc.get(), c.N, c.N, 0, c.rpg, nullptr);
        cuda::gemm_q8_0_version(-1);
        auto got = tc.download();
        const auto ref = q8_0_rows_one_at_a_time(dw.w, a, c.R, AK, c.N, c.rpg);
        ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4)) << "K " << c.K << " N " << c.N;
        const auto got_old = old_tc.download();
        ASSERT_EQ(0, std::memcmp(got_old.data(), ref.data(), got.size() * 4))
            << "register-fed: K " << c.K << " N " << c.N;
        // and near the CPU's dot product (a sanity check of the layout, not of the order)
        std::vector<uint8_t> act(quant::act_bytes(Type::Q8_0, c.K));
        const size_t rb = quant::row_bytes(Type::Q8_0, c.K);
        for (uint32_t r = 0; r < c.R; r += 7) {
            const uint64_t n = (r * 13) % c.N, g = c.rpg ? n / c.rpg : 0;
            quant::quantize_act(Type::Q8_0, &x[r * AK + g * c.K], act.data(), c.K);
            const float cpu = quant::vec_dot(Type::Q8_0, hw.bytes.data() + n * rb, act.data(), c.K);
            ASSERT_NEAR(got[r * c.N + n], cpu, 1e-3 * (std::fabs(cpu) + 1)) << "K " << c.K;
        }
    }
}

// Rows of a product written with stride N + 8 (the first R2 rows of ref, N values each, the
// eight after them left at 7.0f): the same bits, nothing written past N.
static void expect_strided_rows(const std::vector<float>& wide, const std::vector<float>& ref, uint32_t R2,
                                uint64_t N, const std::string& what) {
    for (uint32_t r = 0; r < R2; ++r) {
        ASSERT_EQ(0, std::memcmp(wide.data() + r * (N + 8), ref.data() + r * N, N * 4))
            << "strided, R " << R2 << " row " << r << " N " << N << " " << what;
        ASSERT_EQ(wide[r * (N + 8) + N], 7.0f) << "wrote past N, " << what;
    }
}

TEST_F(CudaKernels, TensorCoreQ8_0PipelinedEqualsDecode) {
    // The pipelined Q8_0 kernel (gemm.cu, gemm_q8_0_pipe_kernel: DSV4_GEMM_Q8_V=2, the default,
    // and 1) and the register-fed one (0) give each row exactly what decode gives it alone. The model's
    // shapes (q_b: K 1,024 = one block a leaf; the shared expert's gate/up K 4,096 and down
    // K 2,048; out_a grouped in 8 groups of 1,024 rows; out_b K 8,192 = 8 blocks a leaf) with R
    // past a multiple of the 64-row tile, and so many tiles that every block walks several
    // (one pipeline across tiles); then awkward ones: K below 32 blocks (leaves without a
    // block), 33 blocks (leaves of 2 and 1), 3 and 6 blocks a leaf (positions of the
    // power-of-two stage layout skipped), K 8,224 (9 blocks a leaf: the register-fed kernel
    // takes it), N with tails, small groups, R of exactly one tile and of 16.
    for (const Q8_0Case c :
         {Q8_0Case{1024, 32768, 0, 130}, Q8_0Case{4096, 2048, 0, 100}, Q8_0Case{2048, 4096, 0, 67},
          Q8_0Case{4096, 8192, 1024, 50}, Q8_0Case{8192, 4096, 0, 45}, Q8_0Case{512, 1100, 0, 16},
          Q8_0Case{1056, 1100, 0, 37}, Q8_0Case{3072, 1030, 0, 64}, Q8_0Case{6144, 1500, 0, 33},
          Q8_0Case{8224, 1040, 0, 17}, Q8_0Case{2048, 2048, 128, 70}, Q8_0Case{1024, 1090, 0, 200}}) {
        ASSERT_TRUE(cuda::gemm_q8_0_eligible(cuda::DevWeight{uint32_t(Type::Q8_0), c.K, c.N, 0}, c.R, c.N, c.rpg,
                                             false));
        ASSERT_EQ(cuda::decode_row_threads(c.K, c.N, false), 32u) << "K " << c.K << " N " << c.N;
        const Q8_0Problem pr(c, 970 + c.K + c.N, 43 + c.R);
        const uint64_t AK = pr.AK;
        const DevWeightHolder& dw = pr.dw;
        const cuda::DevAct& a = pr.a;
        const auto ref = q8_0_rows_one_at_a_time(dw.w, a, c.R, AK, c.N, c.rpg);
        for (const int v : {2, 1, 0}) {
            cuda::gemm_q8_0_version(v);
            // a poisoned output: a row or column the kernel skips shows
            DevVec<float> tc(std::vector<float>(c.R * c.N, std::nanf("")));
            cuda::gemm_q8_0(dw.w, a, c.R, tc.get(), c.N, c.N, 0, c.rpg, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto got = tc.download();
            cuda::gemm_q8_0_version(-1);
            ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
                << "version " << v << " K " << c.K << " N " << c.N << " R " << c.R << " rpg " << c.rpg;
        }
        // a strided output (y_stride > N) and a batch of a different size: same rows
        const uint32_t R2 = c.R - 3;
        DevVec<float> wide(std::vector<float>(R2 * (c.N + 8), 7.0f));
        cuda::gemm_q8_0(dw.w, a, R2, wide.get(), c.N + 8, c.N, 0, c.rpg, nullptr);
        const auto w2 = wide.download();
        expect_strided_rows(w2, ref, R2, c.N, "K " + std::to_string(c.K));
    }
}

TEST_F(CudaKernels, TensorCoreQ8_0FlatOrder) {
    // A prompt round's Q8_0 products (gemm_prefill_order(true): gemm_q8_0_flat_kernel) add an
    // output's 32-value blocks in k order, one fmaf a block: acc = fmaf(dw_b·da_b, I_b, acc)
    // from 0, with I_b the block's integer dot product. The host below makes exactly those
    // float operations, so every output must match it bit for bit, whatever its 128 × 128
    // or 128 × 64 tile, the batch (R, and R - 3 with a strided output) or the stage layout (K of 3 blocks,
    // 33, not a multiple of the 4-block stage); and lie within the float error bound of the
    // CPU's Q8_0 dot product (an independent order). The model's shapes (q_b, shared expert,
    // out_a grouped, out_b), R of 1, 3 and past the tile, N with tails.
    for (const Q8_0Case c :
         {Q8_0Case{1024, 32768, 0, 130}, Q8_0Case{4096, 2048, 0, 100}, Q8_0Case{2048, 4096, 0, 67},
          Q8_0Case{4096, 8192, 1024, 50}, Q8_0Case{8192, 4096, 0, 45}, Q8_0Case{512, 1100, 0, 16},
          Q8_0Case{1056, 1100, 0, 37}, Q8_0Case{96, 200, 0, 3}, Q8_0Case{2048, 2048, 128, 70},
          Q8_0Case{4096, 1100, 0, 1}, Q8_0Case{1024, 130, 0, 260}}) {
        const Q8_0Problem pr(c, 1970 + c.K + c.N, 143 + c.R);
        const uint64_t AK = pr.AK, nb = c.K / 32;
        std::vector<int8_t> aq;
        std::vector<float> ad;
        ASSERT_NO_FATAL_FAILURE(pr.act_to_host(aq, ad));
        const size_t rb = quant::row_bytes(Type::Q8_0, c.K);
        std::vector<float> ref(c.R * c.N);
        std::vector<double> mag(c.R * c.N);
        for (uint32_t r = 0; r < c.R; ++r)
            for (uint64_t n = 0; n < c.N; ++n) {
                const uint64_t g = c.rpg ? n / c.rpg : 0;
                const uint8_t* wr = pr.hw.bytes.data() + n * rb;
                float acc = 0.0f;
                double m = 0;
                for (uint64_t b = 0; b < nb; ++b) {
                    const uint8_t* blk = wr + b * 34;
                    const float dw = quant::fp16_to_fp32(uint16_t(blk[0] | (blk[1] << 8)));
                    const int8_t* x = aq.data() + r * AK + g * c.K + b * 32;
                    int isum = 0;
                    for (int i = 0; i < 32; ++i) isum += int(int8_t(blk[2 + i])) * int(x[i]);
                    const float sc = dw * ad[(r * AK + g * c.K) / 32 + b];
                    acc = std::fmaf(sc, float(isum), acc);
                    m += std::fabs(double(sc) * isum);
                }
                ref[r * c.N + n] = acc;
                mag[r * c.N + n] = m;
            }
        std::vector<float> got;
        // both tiles, the 64-row one also in its lean form (gemm_q8_0_flat_lean): the same
        // operations, so the same bits
        for (const auto& [bn, lean] : {std::pair{128, 0}, std::pair{64, 0}, std::pair{64, 1}}) {
            cuda::gemm_prefill_order(true);
            cuda::gemm_q8_0_flat_bn(bn);
            cuda::gemm_q8_0_flat_lean(lean);
            ASSERT_TRUE(cuda::gemm_q8_0_eligible(cuda::DevWeight{uint32_t(Type::Q8_0), c.K, c.N, 0}, c.R, c.N, c.rpg,
                                                 false));
            DevVec<float> y(std::vector<float>(c.R * c.N, std::nanf("")));   // a skipped output shows
            cuda::gemm_q8_0(pr.dw.w, pr.a, c.R, y.get(), c.N, c.N, 0, c.rpg, nullptr);
            const uint32_t R2 = c.R > 3 ? c.R - 3 : c.R;
            DevVec<float> wide(std::vector<float>(R2 * (c.N + 8), 7.0f));
            cuda::gemm_q8_0(pr.dw.w, pr.a, R2, wide.get(), c.N + 8, c.N, 0, c.rpg, nullptr);
            cuda::gemm_prefill_order(false);
            cuda::gemm_q8_0_flat_bn(-1);
            cuda::gemm_q8_0_flat_lean(-1);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            got = y.download();
            const auto w2 = wide.download();
            ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
                << "tile rows " << bn << " lean " << lean << " K " << c.K << " N " << c.N << " R " << c.R << " rpg "
                << c.rpg;
            expect_strided_rows(w2, ref, R2, c.N,
                                "tile rows " + std::to_string(bn) + " lean " + std::to_string(lean) + " K " +
                                    std::to_string(c.K));
        }
        // the CPU's dot product: a different order of the same terms, so within nb roundings
        std::vector<uint8_t> act(quant::act_bytes(Type::Q8_0, c.K));
        for (uint32_t r = 0; r < c.R; r += 5) {
            const uint64_t n = (r * 131) % c.N, g = c.rpg ? n / c.rpg : 0;
            quant::quantize_act(Type::Q8_0, &pr.x[r * AK + g * c.K], act.data(), c.K);
            const float cpu = quant::vec_dot(Type::Q8_0, pr.hw.bytes.data() + n * rb, act.data(), c.K);
            ASSERT_NEAR(got[r * c.N + n], cpu, 2.0 * double(nb + 1) * 0x1p-24 * mag[r * c.N + n] + 1e-30)
                << "K " << c.K << " N " << c.N << " row " << r;
        }
    }
}

// The checks the cuBLAS paths share (Q8_0CublasFp16WithinBound, FloatCublasFp16WithinBound):
// every checked output (columns `every` apart; padding untouched) within 2^-10 of Σ|w·x| of the
// double reference ref(r, n, &mag); the path's direct call, and the product as gemm_q8_0 /
// gemm_float dispatch it (`product(R, y, ld)`): from the override's rows on the direct call's bits,
// below them the flat kernel's (the same as with the override unset), into a strided output;
// with groups, the groups past the first alone (row0 = rpg) and a slice starting inside a group,
// which the path refuses.
template <typename Direct, typename Product, typename Override, typename Ref>
void cublas_path_checks(const Q8_0Case& c, uint64_t every, Direct direct_call, Product product, Override set_override,
                        Ref ref, double& worst) {
    auto check_rows = [&](const std::vector<float>& y, uint32_t R, uint64_t ld, uint64_t n0, const char* what) {
        for (uint64_t j = 0; j < ld; ++j) {
            const uint64_t n = n0 + j;
            if (n >= c.N) {   // padding past the product's columns
                for (uint32_t r = 0; r < R; ++r) ASSERT_EQ(y[r * ld + j], 7.0f) << what << " padding, row " << r;
                continue;
            }
            if (n % every) continue;
            for (uint32_t r = 0; r < R; ++r) {
                double mag = 0;
                const double err = std::fabs(y[r * ld + j] - ref(r, n, mag)) / (mag + 1e-300);
                worst = std::max(worst, err);
                ASSERT_LE(err, 0x1p-10) << what << " K " << c.K << " N " << c.N << " row " << r << " col " << n;
            }
        }
    };
    cuda::gemm_prefill_order(true);
    DevVec<float> direct(std::vector<float>(c.R * c.N, std::nanf("")));
    ASSERT_TRUE(direct_call(c.R, direct.get(), c.N, c.N, 0));
    set_override(int(c.R));
    DevVec<float> via(std::vector<float>(c.R * c.N, std::nanf("")));
    product(c.R, via.get(), c.N);
    const uint32_t R2 = c.R - 1;   // below the override's rows: the flat kernel
    DevVec<float> below(std::vector<float>(R2 * c.N, std::nanf("")));
    product(R2, below.get(), c.N);
    set_override(1);
    DevVec<float> wide(std::vector<float>(R2 * (c.N + 8), 7.0f));
    product(R2, wide.get(), c.N + 8);
    if (c.rpg) {
        DevVec<float> part(std::vector<float>(c.R * (c.N - c.rpg), std::nanf("")));
        ASSERT_TRUE(direct_call(c.R, part.get(), c.N - c.rpg, c.N - c.rpg, c.rpg));
        ASSERT_FALSE(direct_call(c.R, part.get(), c.N - c.rpg, c.rpg, c.rpg / 2));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_NO_FATAL_FAILURE(check_rows(part.download(), c.R, c.N - c.rpg, c.rpg, "groups past the first"));
    }
    set_override(-1);
    DevVec<float> flat(std::vector<float>(R2 * c.N, std::nanf("")));
    product(R2, flat.get(), c.N);
    cuda::gemm_prefill_order(false);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto y = direct.download();
    ASSERT_NO_FATAL_FAILURE(check_rows(y, c.R, c.N, 0, "direct"));
    ASSERT_TRUE(via.download() == y) << "the product from the override's rows";
    ASSERT_TRUE(below.download() == flat.download()) << "the product below the override's rows";
    ASSERT_NO_FATAL_FAILURE(check_rows(wide.download(), R2, c.N + 8, 0, "strided"));
}

TEST_F(CudaKernels, Q8_0CublasFp16WithinBound) {
    // A prompt round's Q8_0 products through cuBLAS (DSV4_Q8_CUBLAS, --fast-prefill): both
    // operands dequantised to FP16 (each value within 2^-12 of the exact q·d), one FP16 GEMM with
    // FP32 accumulation: cublas_path_checks against a double reference of the exact Q8_0 values
    // (two FP16 roundings a product, the sums' own), for the model's shapes, N with tails, the
    // grouped product and (the last case) an activation scaled by 2^-40, far below FP16's
    // smallest normal (2^-14): the path's power of two must bring it back.
    double worst = 0;
    const Q8_0Case cases[] = {Q8_0Case{1024, 4096, 0, 300}, Q8_0Case{4096, 1100, 0, 257},
                              Q8_0Case{4096, 2048, 1024, 260}, Q8_0Case{2048, 512, 128, 300},
                              Q8_0Case{96, 200, 0, 290}, Q8_0Case{1024, 512, 0, 280}};
    for (const Q8_0Case& c : cases) {
        const Q8_0Problem pr(c, 2026 + c.K + c.N, 12 + c.R);
        const uint64_t AK = pr.AK;
        std::vector<int8_t> aq;
        std::vector<float> ad;
        ASSERT_NO_FATAL_FAILURE(pr.act_to_host(aq, ad));
        if (&c == &cases[5]) {
            for (float& v : ad) v = std::ldexp(v, -40);
            ASSERT_EQ(cudaMemcpy(const_cast<float*>(pr.a.d), ad.data(), ad.size() * 4, cudaMemcpyHostToDevice),
                      cudaSuccess);
        }
        auto ref = [&](uint32_t r, uint64_t n, double& mag) {
            const uint64_t at = r * AK + (c.rpg ? n / c.rpg : 0) * c.K;
            return q8_0_row_dot(pr.hw, c.K, n, [&](uint64_t k) { return double(ad[(at + k) / 32]) * aq[at + k]; }, mag);
        };
        ASSERT_NO_FATAL_FAILURE(cublas_path_checks(
            c, 1,
            [&](uint32_t R, float* y, uint64_t ld, uint64_t N, uint64_t row0) {
                return cuda::gemm_q8_0_cublas(pr.dw.w, pr.a, R, y, ld, N, row0, c.rpg, nullptr);
            },
            [&](uint32_t R, float* y, uint64_t ld) { cuda::gemm_q8_0(pr.dw.w, pr.a, R, y, ld, c.N, 0, c.rpg, nullptr); },
            cuda::gemm_q8_0_cublas_override, ref, worst));
    }
    std::printf("Q8_0 through cuBLAS FP16: worst error %.3g of the sum of magnitudes\n", worst);
}

TEST_F(CudaKernels, Q8_0CublasKeptCopyEqualsPerCall) {
    // A stream that keeps its weights' FP16 copies (gemm_cublas_weight_copies: the backend's, in
    // the fast mode) gives the per-call path's bits: on the product that makes a weight's copy and
    // on the next one, which must take the copy (the weight's codes are zeroed in between, and the
    // result stays); a grouped weight's slice past its first group is a copy of its own. Released
    // with the stream, the copies' bytes go back.
    for (const Q8_0Case& c : {Q8_0Case{1024, 4096, 0, 300}, Q8_0Case{4096, 2048, 1024, 260}}) {
        const Q8_0Problem pr(c, 77 + c.K, 5 + c.R);
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        const uint64_t slice = c.rpg ? c.N - c.rpg : c.N / 2, row0 = c.N - slice;
        auto product = [&](uint64_t N, uint64_t r0) {
            DevVec<float> y(std::vector<float>(c.R * N, std::nanf("")));
            EXPECT_TRUE(cuda::gemm_q8_0_cublas(pr.dw.w, pr.a, c.R, y.get(), N, N, r0, c.rpg, s));
            EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
            return y.download();
        };
        const auto whole = product(c.N, 0), part = product(slice, row0);
        const uint64_t before = cuda::gemm_cublas_copy_bytes();
        cuda::gemm_cublas_weight_copies(s, true);
        EXPECT_TRUE(product(c.N, 0) == whole) << "K " << c.K << ": the product that makes the copy";
        EXPECT_TRUE(product(slice, row0) == part) << "K " << c.K << ": a slice's own copy";
        EXPECT_EQ(cuda::gemm_cublas_copy_bytes() - before, (c.N + slice) * c.K * 2 + 2 * 256);
        ASSERT_EQ(cudaMemset(const_cast<int8_t*>(pr.dw.w.qs), 0, c.N * c.K), cudaSuccess);
        EXPECT_TRUE(product(c.N, 0) == whole) << "K " << c.K << ": the next product, from the copy";
        EXPECT_TRUE(product(slice, row0) == part) << "K " << c.K << ": the slice, from its copy";
        EXPECT_EQ(cuda::gemm_cublas_copy_bytes() - before, (c.N + slice) * c.K * 2 + 2 * 256) << "no copy made twice";
        cuda::gemm_cublas_weight_copies(s, false);
        EXPECT_FALSE(product(c.N, 0) == whole) << "K " << c.K << ": copies off, the zeroed codes";
        cuda::release_cublas(s);
        EXPECT_EQ(cuda::gemm_cublas_copy_bytes(), before);
        ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
    }
}

TEST_F(CudaKernels, Q8_0CublasFromFloatsWithinBound) {
    // The fast mode's Q8_0 products from float rows (gemm_q8_0_cublas_floats: the floats to FP16
    // directly, no Q8_0 codes): within 2^-10 of Σ|w·x| of a double reference of the exact Q8_0
    // weight and the floats as they are, rows `xs` apart (a stride past K); gemm_q8_0_floats
    // takes it from the cuBLAS rows on with the same bits and declines below them, and declines
    // a weight of another type.
    cuda::gemm_prefill_order(true);
    double worst = 0;
    for (const Q8_0Case& c : {Q8_0Case{1024, 4096, 0, 300}, Q8_0Case{4096, 1100, 0, 257}}) {
        const HostWeight hw = random_weight(Type::Q8_0, c.K, c.N, 91 + c.K);
        const DevWeightHolder dw(hw);
        const uint64_t xs = c.K + 8;
        std::vector<float> x = random_floats(c.R * xs, 17 + c.R, -3.0f, 3.0f);
        for (uint32_t r = 0; r < c.R; ++r) x[r * xs] *= 1000.0f;   // a wide range a row
        const DevVec<float> dx(x);
        DevVec<float> y(std::vector<float>(c.R * c.N, std::nanf("")));
        ASSERT_TRUE(cuda::gemm_q8_0_cublas_floats(dw.w, dx.get(), xs, c.R, y.get(), c.N, c.N, nullptr));
        cuda::gemm_q8_0_cublas_override(int(c.R));
        DevVec<float> via(std::vector<float>(c.R * c.N, std::nanf("")));
        EXPECT_TRUE(cuda::gemm_q8_0_floats(dw.w, dx.get(), xs, c.R, via.get(), c.N, c.N, nullptr));
        EXPECT_FALSE(cuda::gemm_q8_0_floats(dw.w, dx.get(), xs, c.R - 1, via.get(), c.N, c.N, nullptr));
        cuda::gemm_q8_0_cublas_override(-1);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = y.download();
        EXPECT_TRUE(via.download() == got) << "K " << c.K << ": the dispatch's bits";
        for (uint32_t r = 0; r < c.R; r += 7)
            for (uint64_t n = 0; n < c.N; n += 3) {
                double mag = 0;
                const double sum = q8_0_row_dot(hw, c.K, n, [&](uint64_t k) { return double(x[r * xs + k]); }, mag);
                const double err = std::fabs(got[r * c.N + n] - sum) / (mag + 1e-300);
                worst = std::max(worst, err);
                ASSERT_LE(err, 0x1p-10) << "K " << c.K << " row " << r << " col " << n;
            }
    }
    const HostWeight hf = random_weight(Type::F16, 256, 64, 5);
    const DevWeightHolder df(hf);
    const DevVec<float> dx(random_floats(300 * 256, 3, -1.0f, 1.0f));
    DevVec<float> y(std::vector<float>(300 * 64, 0.0f));
    cuda::gemm_q8_0_cublas_override(1);
    EXPECT_FALSE(cuda::gemm_q8_0_floats(df.w, dx.get(), 256, 300, y.get(), 64, 64, nullptr)) << "an F16 weight";
    cuda::gemm_q8_0_cublas_override(-1);
    cuda::gemm_prefill_order(false);
    std::printf("Q8_0 from floats through cuBLAS FP16: worst error %.3g of the sum of magnitudes\n", worst);
}

TEST_F(CudaKernels, Q8_0CublasHalfOutputWithinBound) {
    // A Q8_0 product from an FP16 activation with its output as FP16 too (gemm_q8_0_cublas_half:
    // the fast mode's out_a into out_b, DSV4_ATTN_HALF_OUT=2): each output, divided by the factor
    // its top gives (2^13 / top, f16_factor's), within 2^-9 of Σ|w·x| of a double reference of the
    // exact Q8_0 weight and the activation's halves (three FP16 roundings a product); finite
    // halves whatever the rows' range. Activations: act_f16's (below 2^14, no h_max) and the
    // attention's kind (each value halved and rounded, kAttnHalfTop, h_max their largest
    // magnitude), plain and grouped; an activation without halves is refused.
    cuda::gemm_prefill_order(true);
    double worst = 0;
    for (const Q8_0Case& c : {Q8_0Case{4096, 2048, 1024, 260}, Q8_0Case{8192, 1024, 0, 300}}) {
        const uint64_t AK = (c.rpg ? c.N / c.rpg : 1) * c.K, n = c.R * AK;
        const HostWeight hw = random_weight(Type::Q8_0, c.K, c.N, 44 + c.K);
        const DevWeightHolder dw(hw);
        std::vector<float> x = random_floats(n, 19 + c.R, -3.0f, 3.0f);
        for (uint32_t r = 0; r < c.R; r += 5) x[r * AK + r % AK] *= 3000.0f;   // wide-ranged rows
        for (int kind : {0, 1}) {
            std::vector<uint16_t> xh(n);
            DevVec<uint16_t> dxh(xh);
            DevVec<unsigned> top(std::vector<unsigned>{0}), xmax(std::vector<unsigned>{0});
            cuda::DevAct a;
            a.kind = cuda::ActKind::Q8_0;
            a.K = AK;
            a.h = dxh.get();
            a.h_top = top.get();
            if (kind == 0) {   // act_f16's
                const DevVec<float> dx(x);
                cuda::act_f16(dx.get(), AK, AK, c.R, dxh.get(), top.get(), nullptr);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                xh = dxh.download();
            } else {           // the attention's
                float m = 0.0f;
                for (uint64_t i = 0; i < n; ++i) {
                    xh[i] = quant::fp32_to_fp16(x[i] * cuda::kAttnHalfScale);
                    m = std::max(m, std::fabs(x[i]) * cuda::kAttnHalfScale);
                }
                unsigned tb = 0, mb = 0;
                std::memcpy(&tb, &cuda::kAttnHalfTop, 4);
                std::memcpy(&mb, &m, 4);
                ASSERT_EQ(cudaMemcpy(dxh.get(), xh.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
                ASSERT_EQ(cudaMemcpy(top.get(), &tb, 4, cudaMemcpyHostToDevice), cudaSuccess);
                ASSERT_EQ(cudaMemcpy(xmax.get(), &mb, 4, cudaMemcpyHostToDevice), cudaSuccess);
                a.h_max = xmax.get();
            }
            DevVec<uint16_t> yh(std::vector<uint16_t>(c.R * c.N, 0x7e00));
            DevVec<unsigned> ytop(std::vector<unsigned>{0});
            ASSERT_TRUE(cuda::gemm_q8_0_cublas_half(dw.w, a, c.R, c.N, c.rpg, yh.get(), ytop.get(), nullptr));
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto got = yh.download();
            float yt = 0.0f;
            std::memcpy(&yt, ytop.download().data(), 4);
            const double yf = 8192.0 / double(yt);
            // the activation's factor: act_f16's top (f16_factor: 2^(14 - e) for top = f · 2^e), or 1/2
            float xt = 0.0f;
            std::memcpy(&xt, top.download().data(), 4);
            int e = 0;
            std::frexp(double(xt), &e);
            const double xf = std::ldexp(1.0, 14 - e);
            for (uint32_t r = 0; r < c.R; r += 3)
                for (uint64_t j = 0; j < c.N; j += 5) {
                    const uint64_t at = r * AK + (c.rpg ? j / c.rpg : 0) * c.K;
                    double mag = 0;
                    const double sum = q8_0_row_dot(
                        hw, c.K, j, [&](uint64_t k) { return double(quant::fp16_to_fp32(xh[at + k])) / xf; }, mag);
                    const float h = quant::fp16_to_fp32(got[r * c.N + j]);
                    ASSERT_TRUE(std::isfinite(h)) << "K " << c.K << " row " << r << " col " << j;
                    const double err = std::fabs(double(h) / yf - sum) / (mag + 1e-300);
                    worst = std::max(worst, err);
                    ASSERT_LE(err, 0x1p-9) << "kind " << kind << " K " << c.K << " row " << r << " col " << j;
                }
        }
    }
    Q8_0Problem pr(Q8_0Case{1024, 256, 0, 300}, 3, 4);   // (codes, no halves)
    DevVec<uint16_t> yh(300 * 256);
    DevVec<unsigned> ytop(std::vector<unsigned>{0});
    EXPECT_FALSE(cuda::gemm_q8_0_cublas_half(pr.dw.w, pr.a, 300, 256, 0, yh.get(), ytop.get(), nullptr));
    cuda::gemm_prefill_order(false);
    std::printf("Q8_0 through cuBLAS, FP16 in and out: worst error %.3g of the sum of magnitudes\n", worst);
}

TEST_F(CudaKernels, FloatCublasFp16WithinBound) {
    // A prompt round's F16 products through cuBLAS (DSV4_F16_CUBLAS): the weights as they are,
    // the float activation scaled by a power of two and rounded to FP16 (within 2^-11 of each
    // value), one FP16 GEMM with FP32 accumulation: cublas_path_checks against a double reference
    // (every fifth column of the wide products), for the compressor's and indexer's widths, K not
    // a multiple of 8, the grouped product, activation rows wider than K (a stride), and (the last
    // case) an activation scaled by 2^-40; BF16 weights fall back.
    double worst = 0;
    const Q8_0Case cases[] = {{4096, 1024, 0, 300}, {1000, 200, 0, 260}, {1024, 256, 128, 270}, {512, 300, 0, 257}};
    for (const Q8_0Case& c : cases) {
        const uint64_t groups = c.rpg ? c.N / c.rpg : 1, AK = groups * c.K, XS = AK + 4;
        const HostWeight hw = random_weight(Type::F16, c.K, c.N, 3100 + c.K + c.N);
        DevWeightHolder dw(hw);
        auto x = random_floats(c.R * XS, 91 + c.R, -2.0f, 2.0f);
        for (size_t i = 0; i < x.size(); i += 13) x[i] *= 1e-3f;
        if (&c == &cases[3])
            for (float& v : x) v = std::ldexp(v, -40);
        DevVec<float> dx(x);
        ActHolder ah(16);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::F16), dx.get(), XS, c.R, AK, ah.buf, nullptr);
        const size_t rb = quant::row_bytes(Type::F16, c.K);
        std::vector<float> wrow(c.K);
        auto ref = [&](uint32_t r, uint64_t n, double& mag) {
            quant::dequantize_row(Type::F16, hw.bytes.data() + n * rb, wrow.data(), c.K);
            const uint64_t g = c.rpg ? n / c.rpg : 0;
            double sum = 0;
            for (uint64_t k = 0; k < c.K; ++k) {
                const double t = double(wrow[k]) * x[r * XS + g * c.K + k];
                sum += t;
                mag += std::fabs(t);
            }
            return sum;
        };
        ASSERT_NO_FATAL_FAILURE(cublas_path_checks(
            c, c.N > 300 ? 5 : 1,
            [&](uint32_t R, float* y, uint64_t ld, uint64_t N, uint64_t row0) {
                return cuda::gemm_float_cublas(dw.w, a, R, y, ld, N, row0, c.rpg, nullptr);
            },
            [&](uint32_t R, float* y, uint64_t ld) { cuda::gemm_float(dw.w, a, R, y, ld, c.N, 0, c.rpg, nullptr); },
            cuda::gemm_float_cublas_override, ref, worst));
        const HostWeight hb = random_weight(Type::BF16, c.K, c.N, 7);   // BF16 weights: not this path
        DevWeightHolder db(hb);
        DevVec<float> yb(c.R * c.N);
        EXPECT_FALSE(cuda::gemm_float_cublas(db.w, a, c.R, yb.get(), c.N, c.N, 0, c.rpg, nullptr));
    }
    std::printf("F16 through cuBLAS FP16: worst error %.3g of the sum of magnitudes\n", worst);
}

TEST_F(CudaKernels, CublasFromSharedF16EqualsPerCall) {
    // An activation made FP16 once (act_f16, DevAct::h: the fast round's xn for all its products)
    // gives the bits each product's own conversion gives: an F16 weight's against gemm_float_cublas
    // from the floats, a Q8_0 weight's (its codes beside h, unread) against
    // gemm_q8_0_cublas_floats; grouped and strided rows as the products take them; and the
    // conversion is really used (h's values doubled double the product).
    struct Case {
        uint64_t K, N, rpg;
        uint32_t R;
    };
    for (const Case& c : {Case{1024, 512, 0, 300}, Case{4096, 256, 0, 257}, Case{512, 256, 128, 260}}) {
        SCOPED_TRACE(testing::Message() << "K " << c.K << " N " << c.N << " rpg " << c.rpg);
        const uint64_t AK = (c.rpg ? c.N / c.rpg : 1) * c.K, XS = AK + 4;
        const auto x = random_floats(c.R * XS, 40 + c.K, -3.0f, 3.0f);
        const DevVec<float> dx(x);
        DevVec<uint16_t> h(uint64_t(c.R) * AK);
        DevVec<unsigned> top(1);
        cuda::act_f16(dx.get(), XS, AK, c.R, h.get(), top.get(), nullptr);
        ActHolder ah(uint64_t(c.R) * AK);
        for (const Type t : {Type::F16, Type::Q8_0}) {
            if (t == Type::Q8_0 && c.rpg) continue;   // (grouped Q8_0 products read codes: out_a)
            const HostWeight hw = random_weight(t, c.K, c.N, 77 + c.K);
            const DevWeightHolder dw(hw);
            cuda::DevAct a = cuda::quantize_act(uint32_t(t), dx.get(), XS, c.R, AK, ah.buf, nullptr);
            DevVec<float> per_call(std::vector<float>(c.R * c.N, std::nanf(""))),
                shared(std::vector<float>(c.R * c.N, std::nanf("")));
            if (t == Type::F16)
                ASSERT_TRUE(cuda::gemm_float_cublas(dw.w, a, c.R, per_call.get(), c.N, c.N, 0, c.rpg, nullptr));
            else
                ASSERT_TRUE(cuda::gemm_q8_0_cublas_floats(dw.w, dx.get(), XS, c.R, per_call.get(), c.N, c.N, nullptr));
            a.h = h.get();
            a.h_top = top.get();
            if (t == Type::F16)
                ASSERT_TRUE(cuda::gemm_float_cublas(dw.w, a, c.R, shared.get(), c.N, c.N, 0, c.rpg, nullptr));
            else
                ASSERT_TRUE(cuda::gemm_q8_0_cublas(dw.w, a, c.R, shared.get(), c.N, c.N, 0, 0, nullptr));
            const auto want = per_call.download(), got = shared.download();
            EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << quant::traits(t).name;
            // h doubled (each FP16 value times 2: exact) doubles the product: h was read
            std::vector<uint16_t> hv = h.download();
            for (uint16_t& v : hv) v = v & 0x7C00 ? uint16_t(v + 0x0400) : v;   // exponent + 1 (no top value overflows)
            DevVec<uint16_t> h2(hv);
            a.h = h2.get();
            DevVec<float> twice(c.R * c.N);
            if (t == Type::F16)
                ASSERT_TRUE(cuda::gemm_float_cublas(dw.w, a, c.R, twice.get(), c.N, c.N, 0, c.rpg, nullptr));
            else
                ASSERT_TRUE(cuda::gemm_q8_0_cublas(dw.w, a, c.R, twice.get(), c.N, c.N, 0, 0, nullptr));
            const auto dbl = twice.download();
            for (size_t i = 0; i < got.size(); i += 97)
                ASSERT_NEAR(dbl[i], 2.0 * got[i], 1e-5 * std::fabs(got[i]) + 1e-6) << quant::traits(t).name << " " << i;
        }
    }
}

TEST_F(CudaKernels, FloatWeightFlatOrderOnTensorCores) {
    // A prompt round's F16 / BF16 products (gemm_prefill_order(true): gemm_float_flat_kernel,
    // 2xTF32 on the tensor cores, stages of 32 values added in k order) are FP32-accurate: within
    // 1e-5 of Σ|w·x| of a double reference at every output (the bound validation.md gives
    // orders that differ; reported: the worst ratio), and the same bits for a row in any batch
    // (R, and R - 3 with a strided output) and tile. Shapes: the compressor's and indexer's
    // widths, K not a multiple of the 32-value stage (1,000: 8-value groups past K load zeros),
    // R of 1, 3 and past the 128-row tile, N with tails, the grouped product (rpg 128). Both
    // forms: the stages in one run, and (gemm_flat_split_override(1)) products of up to 1,024
    // rows with their stages split over a cluster (K 4,096 and 16,384 in 8 runs, K 1,000 and
    // 1,024 in 2, K 256 none; N 1,100 and 8,192 never). Unsplit, blocks of 32 and of 128
    // activation rows give the same bits.
    const Q8_0Case cases[] = {{4096, 1024, 0, 130}, {4096, 512, 0, 300}, {1024, 8192, 0, 16}, {1000, 200, 0, 3},
                              {4096, 1100, 0, 1},   {1024, 256, 128, 70}, {256, 100, 0, 129}, {16384, 24, 0, 2}};
    double worst = 0;
    for (const int split : {0, 1}) {
        for (const Type wt : {Type::F16, Type::BF16}) {
            for (const Q8_0Case c : cases) {
                const uint64_t groups = c.rpg ? c.N / c.rpg : 1, AK = groups * c.K;
                const HostWeight hw = random_weight(wt, c.K, c.N, 2900 + c.K + c.N + uint64_t(wt));
                DevWeightHolder dw(hw);
                auto x = random_floats(c.R * AK, 77 + c.R, -2.0f, 2.0f);
                for (size_t i = 0; i < x.size(); i += 17) x[i] *= 1e-3f;   // small values too (lo's range)
                DevVec<float> dx(x);
                ActHolder ah(16);
                const cuda::DevAct a = cuda::quantize_act(uint32_t(wt), dx.get(), AK, c.R, AK, ah.buf, nullptr);
                cuda::gemm_prefill_order(true);
                cuda::gemm_flat_split_override(split);
                ASSERT_TRUE(cuda::gemm_float_eligible(dw.w, a, c.R, c.N, 0, c.rpg, false))
                    << "type " << uint32_t(wt) << " K " << c.K << " N " << c.N << " R " << c.R;
                DevVec<float> gm(std::vector<float>(c.R * c.N, std::nanf("")));
                cuda::gemm_float(dw.w, a, c.R, gm.get(), c.N, c.N, 0, c.rpg, nullptr);
                const uint32_t R2 = c.R > 3 ? c.R - 3 : c.R;
                DevVec<float> wide(std::vector<float>(R2 * (c.N + 8), 7.0f));
                cuda::gemm_float(dw.w, a, R2, wide.get(), c.N + 8, c.N, 0, c.rpg, nullptr);
                // blocks of 32 and of 128 activation rows (gemm_float_flat_ntw_override): the same bits
                std::vector<float> by_ntw[2];
                for (const int ntw : {1, 4}) {
                    if (split) break;
                    DevVec<float> gn(std::vector<float>(c.R * c.N, std::nanf("")));
                    cuda::gemm_float_flat_ntw_override(ntw);
                    cuda::gemm_float(dw.w, a, c.R, gn.get(), c.N, c.N, 0, c.rpg, nullptr);
                    cuda::gemm_float_flat_ntw_override(-1);
                    by_ntw[ntw == 4] = gn.download();
                }
                cuda::gemm_prefill_order(false);
                cuda::gemm_flat_split_override(-1);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                const auto got = gm.download(), w2 = wide.download();
                for (const auto& v : by_ntw) {
                    if (v.empty()) continue;
                    ASSERT_EQ(0, std::memcmp(v.data(), got.data(), got.size() * 4))
                        << "n-tiles a warp: type " << uint32_t(wt) << " K " << c.K << " N " << c.N << " R " << c.R;
                }
                expect_strided_rows(w2, got, R2, c.N, "K " + std::to_string(c.K));
                const size_t rb = quant::row_bytes(wt, c.K);
                std::vector<float> wrow(c.K);
                for (uint64_t n = 0; n < c.N; n += (c.N > 300 ? 7 : 1)) {
                    quant::dequantize_row(wt, hw.bytes.data() + n * rb, wrow.data(), c.K);
                    const uint64_t g = c.rpg ? n / c.rpg : 0;
                    for (uint32_t r = 0; r < c.R; ++r) {
                        double ref = 0, mag = 0;
                        for (uint64_t k = 0; k < c.K; ++k) {
                            const double t = double(wrow[k]) * x[r * AK + g * c.K + k];
                            ref += t;
                            mag += std::fabs(t);
                        }
                        const double err = std::fabs(got[r * c.N + n] - ref);
                        worst = std::max(worst, err / mag);
                        ASSERT_LE(err, 1e-5 * mag) << "split " << split << " type " << uint32_t(wt) << " K " << c.K
                                                   << " N " << c.N << " row " << r << " output " << n;
                    }
                }
            }
        }
    }
    std::printf("[float-flat] worst |error| / sum|w x| over every checked output: %.3g\n", worst);
}

TEST_F(CudaKernels, FloatWeightGemmEqualsDecodeBitForBit) {
    // Prefill's tiled float-weight GEMM (gemm.cu, gemm_float) must give each row exactly what
    // decode gives it alone (matvec, one row): the same fmaf chains over the same chunks, the
    // same butterfly tree of a warp's 32 thread sums, the wide block's warp sums in order.
    // Decode's row threads 32 (N > 1024, or K < 2048), 256 (N <= 1024, K >= 2048), 1,024
    // (N <= 1024, K >= 8192); N with tails past the 64-row tile, R past the 32/64-row tiles,
    // and the grouped product.
    const Q8_0Case cases[] = {{4096, 1024, 0, 33}, {4096, 512, 0, 2048}, {1024, 8192, 0, 16}, {4096, 64, 0, 20},
                              {16384, 24, 0, 17}, {4096, 1000, 0, 16},  {1024, 37, 0, 33},   {4096, 1100, 0, 20},
                              {1024, 128, 64, 17}, {256, 100, 0, 70}};
    for (const Type wt : {Type::F16, Type::BF16, Type::F32}) {
        for (const Q8_0Case c : cases) {
            if (c.R >= 2048 && wt != Type::F16) continue;   // the long case once
            const uint64_t groups = c.rpg ? c.N / c.rpg : 1, AK = groups * c.K;
            const HostWeight hw = random_weight(wt, c.K, c.N, 1900 + c.K + c.N + uint64_t(wt));
            DevWeightHolder dw(hw);
            auto x = random_floats(c.R * AK, 37 + c.R, -2.0f, 2.0f);
            DevVec<float> dx(x);
            ActHolder ah(16);
            const cuda::DevAct a = cuda::quantize_act(uint32_t(wt), dx.get(), AK, c.R, AK, ah.buf, nullptr);
            ASSERT_TRUE(cuda::gemm_float_eligible(dw.w, a, c.R, c.N, 0, c.rpg, false))
                << "type " << uint32_t(wt) << " K " << c.K << " N " << c.N;
            DevVec<float> gm(c.R * c.N), one(c.R * c.N);
            cuda::gemm_float(dw.w, a, c.R, gm.get(), c.N, c.N, 0, c.rpg, nullptr);
            for (uint32_t r = 0; r < c.R; ++r) {
                cuda::DevAct ar = a;
                ar.f = a.f + uint64_t(r) * AK;
                if (c.rpg) cuda::matvec_grouped(dw.w, ar, 1, one.get() + r * c.N, c.N, c.N, c.rpg, nullptr);
                else cuda::matvec(dw.w, ar, 1, one.get() + r * c.N, c.N, c.N, 0, nullptr);
            }
            auto got = gm.download();
            auto ref = one.download();
            ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
                << "type " << uint32_t(wt) << " K " << c.K << " N " << c.N << " R " << c.R;
            // and near the CPU's dot product (a check of the layout, not of the order)
            for (uint32_t r = 0; r < c.R; r += 7) {
                const uint64_t n = (r * 13) % c.N, g = c.rpg ? n / c.rpg : 0;
                const size_t rb = quant::row_bytes(wt, c.K);
                std::vector<float> wrow(c.K);
                quant::dequantize_row(wt, hw.bytes.data() + n * rb, wrow.data(), c.K);
                double ref_d = 0;
                for (uint64_t k = 0; k < c.K; ++k) ref_d += double(wrow[k]) * x[r * AK + g * c.K + k];
                ASSERT_NEAR(got[r * c.N + n], ref_d, 1e-3 * (std::fabs(ref_d) + 1)) << "K " << c.K;
            }
        }
    }
    // leaves of unequal chunk counts stay on matvec_kernel
    const HostWeight hw = random_weight(Type::F16, 1000, 40, 7);
    DevWeightHolder dw(hw);
    DevVec<float> dx(random_floats(16 * 1000, 5));
    ActHolder ah(16);
    const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::F16), dx.get(), 1000, 16, 1000, ah.buf, nullptr);
    EXPECT_FALSE(cuda::gemm_float_eligible(dw.w, a, 16, 40, 0, 0, false));
    EXPECT_FALSE(cuda::gemm_float_eligible(dw.w, a, 15, 40, 0, 0, false));
}

// Routed pairs of experts with counts[e] pairs each (expert e's pairs), interleaved so that a
// group's pairs are not consecutive activation rows.
static std::vector<int32_t> interleaved_pairs(const std::vector<uint32_t>& counts) {
    std::vector<int32_t> ex;
    for (uint32_t e = 0; e < counts.size(); ++e)
        for (uint32_t i = 0; i < counts[e]; ++i) ex.push_back(int32_t(e));
    std::vector<int32_t> mixed(ex.size());
    for (size_t i = 0; i < ex.size(); ++i) mixed[(i * 37) % ex.size()] = ex[i];
    return mixed;
}

TEST_F(CudaKernels, ExpertsSharedMemoryKernelEqualsDecode) {
    // The IQ2_XXS and Q2_K expert products staged through shared memory (gemm.cu,
    // DSV4_GEMM_SMEM) and the register-fed ones must both give every pair exactly what decode
    // gives it alone: groups of 1 to 32 pairs (experts with 1, 8, 31, 32, 38 and no pairs), N with a tail
    // past the block's 64 rows, K of 1 to 16 super-blocks (leaves with none, one, two: K 2,304
    // gives the decode lanes unequal counts), one weight alone and IQ2_XXS gate+up fused
    // (clamp, weights). Decode's order: groups of 32 (a prompt round's 64 take k order:
    // ExpertsPromptOrderEqualCpuDot).
    cuda::gemm_prefill_order(false);
    ASSERT_EQ(cuda::gemm_kq_pairs(), 32u);
    const uint32_t NEXP = 6, KU = 2;
    const std::vector<int32_t> mixed = interleaved_pairs({1, 8, 31, 32, 38, 0});
    const uint32_t P = uint32_t(mixed.size()), R = P / KU;
    ASSERT_EQ(P % KU, 0u);
    DevVec<int32_t> dex(mixed);
    const uint32_t cap = cuda::moe_groups_cap(P, NEXP, cuda::gemm_kq_pairs());
    DevVec<int32_t> grp(3 * cap), pairs(P), count(1);
    const cuda::MoeGroups groups{grp.get(), pairs.get(), count.get(), cap, cuda::gemm_kq_pairs()};
    cuda::moe_groups(dex.get(), P, NEXP, groups, nullptr);
    for (const Type wt : {Type::IQ2_XXS, Type::Q2_K}) {
        for (const uint64_t K : {256, 1024, 2304, 4096}) {
            for (const uint64_t N : {uint64_t(70), uint64_t(130)}) {
                const bool fused = wt == Type::IQ2_XXS;
                const uint64_t RPE = N + 3;
                const HostWeight hg = random_weight(wt, K, RPE * NEXP, 701 + K + N + uint64_t(wt));
                const HostWeight hu = random_weight(wt, K, RPE * NEXP, 801 + K + N + uint64_t(wt));
                DevWeightHolder dg(hg), du(hu);
                auto x = random_floats(R * K, 23 + K, -2.0f, 2.0f);
                DevVec<float> dx(x);
                ActHolder ah(R * K);
                const cuda::DevAct a = cuda::quantize_act(uint32_t(wt), dx.get(), K, R, K, ah.buf, nullptr);
                auto wv = random_floats(P, 29, 0.1f, 1.0f);
                DevVec<float> dew(wv);
                ASSERT_TRUE(cuda::gemm_kq_eligible(dg.w, &groups));
                DevVec<float> alone(P * N), sw_alone(P * N);
                cuda::matvec(dg.w, a, P, alone.get(), N, N, 0, nullptr, dex.get(), RPE, KU);
                if (fused)
                    cuda::matvec_swiglu(dg.w, du.w, a, P, sw_alone.get(), N, N, 0.05f, dew.get(), nullptr, dex.get(),
                                        RPE, KU);
                const auto ref = alone.download();
                const auto sw_ref = sw_alone.download();
                for (const int smem : {1, 2, 0}) {   // staged (newest), staged as before run 38, not staged
                    cuda::gemm_smem_override(smem);
                    DevVec<float> got(P * N), sw_got(P * N);
                    cuda::matvec(dg.w, a, P, got.get(), N, N, 0, nullptr, dex.get(), RPE, KU, &groups);
                    if (fused)
                        cuda::matvec_swiglu(dg.w, du.w, a, P, sw_got.get(), N, N, 0.05f, dew.get(), nullptr, dex.get(),
                                            RPE, KU, &groups);
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    const auto r1 = got.download();
                    const auto r2 = sw_got.download();
                    cuda::gemm_smem_override(-1);
                    ASSERT_EQ(0, std::memcmp(ref.data(), r1.data(), ref.size() * 4))
                        << quant::traits(wt).name << " alone, smem " << smem << " K " << K << " N " << N;
                    if (fused) {
                        ASSERT_EQ(0, std::memcmp(sw_ref.data(), r2.data(), sw_ref.size() * 4))
                            << "gate+up, smem " << smem << " K " << K << " N " << N;
                    }
                }
            }
        }
    }
}

// |term| of each weight value of a row, for error bounds: IQ2_XXS |w|; Q2_K |d·sc·q| + |dmin·m|
// (each block dequantised with dmin = 0, then with d = 0).
static void weight_term_magnitudes(Type t, const uint8_t* row, float* out, uint64_t K) {
    if (t != Type::Q2_K) {
        quant::dequantize_row(t, row, out, K);
        for (uint64_t k = 0; k < K; ++k) out[k] = std::fabs(out[k]);
        return;
    }
    const size_t rb = quant::row_bytes(t, K);
    std::vector<uint8_t> part(row, row + rb);
    std::vector<float> other(K);
    for (size_t b = 0; b < rb; b += 84) part[b + 82] = part[b + 83] = 0;   // dmin = 0
    quant::dequantize_row(t, part.data(), out, K);
    part.assign(row, row + rb);
    for (size_t b = 0; b < rb; b += 84) part[b + 80] = part[b + 81] = 0;   // d = 0
    quant::dequantize_row(t, part.data(), other.data(), K);
    for (uint64_t k = 0; k < K; ++k) out[k] = std::fabs(out[k]) + std::fabs(other[k]);
}

TEST_F(CudaKernels, ExpertsPromptOrderEqualCpuDot) {
    // A prompt round's IQ2_XXS / Q2_K expert products (gemm_prefill_order(true), DSV4_KQ_FLAT:
    // groups of gemm_kq_pairs() = 64 pairs; gemm_iq2_smem_kernel / gemm_q2k_smem_kernel with
    // FLAT, or gemm_kq_kernel with FLAT where not staged) add a row's super-blocks in k order,
    // one float step each, as the CPU's dot_iq2_xxs / dot_q2_k: every (pair, row) must be
    // quant::vec_dot's float bit for bit, on the very activation codes the GPU made (checked
    // equal to the host quantiser's), and the fused IQ2_XXS gate+up the GPU's swiglu of the
    // two CPU dots (which matvec + matvec + swiglu equals: MatvecSwigluEqualsMatvecThenSwiglu).
    // Experts with 1 to 130 pairs (past 64 a group splits: 65 = 64 + 1, 130 = 64 + 64 + 2) and
    // none, N with a tail past the blocks' 64 rows (300: past the FP16 kernel's 256 too), K of 1
    // to 16 super-blocks, every path (staged: smem 1 and 2, the Q2_K mins by the split bsums
    // and by MMAs against the activation; register-fed: 0), and batches of the first 20 rows
    // and of the first row alone (other groups; the one-row rounds of a prompt chunked token by
    // token), and the
    // staged IQ2_XXS kernel's expansion from the grid as codes (DSV4_IQ2_NIB). The counts
    // leave tiles of 8 pairs partly and wholly empty, which the staged kernels' warps skip.
    // The fast mode's FP16 kernel (DSV4_EXPERTS_F16: the Q2_K alone, the IQ2_XXS gate+up fused) is
    // held to bounds instead of bits.
    struct Restore {
        ~Restore() {
            cuda::gemm_prefill_order(false);
            cuda::gemm_smem_override(-1);
            cuda::gemm_q2k_mins(-1);
            cuda::gemm_iq2_nib_override(-1);
            cuda::gemm_experts_f16_override(-1);
            cuda::gemm_experts_f16_table_override(-1);
            cuda::gemm_experts_f16_iq2_override(-1);
            cuda::gemm_experts_f16_wgmma_override(-1);
            cuda::gemm_experts_f16_stage_used_override(-1);
            cuda::kq_flat_pairs(false);
        }
    } restore;
    if (const char* e = std::getenv("DSV4_KQ_FLAT"); e && e[0] == '0')
        GTEST_SKIP() << "DSV4_KQ_FLAT=0: prompt rounds keep decode's order";
    cuda::gemm_prefill_order(true);
    const uint32_t PG = cuda::gemm_kq_pairs();
    ASSERT_EQ(PG, 64u);
    const std::vector<uint32_t> counts = {1, 8, 31, 32, 33, 63, 64, 65, 130, 0};
    const uint32_t NEXP = uint32_t(counts.size()), KU = 7;
    const std::vector<int32_t> mixed = interleaved_pairs(counts);
    const uint32_t P = uint32_t(mixed.size()), R = P / KU;
    ASSERT_EQ(P % KU, 0u);
    DevVec<int32_t> dex(mixed);
    // the batches: all R rows, the first 20, the first alone (pairs p < rows · KU: the same pairs)
    const uint32_t batch_rows[3] = {R, 20, 1};
    struct Batch {
        uint32_t P, cap;
        DevVec<int32_t> grp, pairs, count;
        cuda::MoeGroups g;
    };
    std::vector<std::unique_ptr<Batch>> batches;
    for (const uint32_t rows : batch_rows) {
        auto b = std::make_unique<Batch>();
        b->P = rows * KU;
        b->cap = cuda::moe_groups_cap(b->P, NEXP, PG);
        b->grp.resize(3 * b->cap);
        b->pairs.resize(b->P);
        b->count.resize(1);
        b->g = cuda::MoeGroups{b->grp.get(), b->pairs.get(), b->count.get(), b->cap, PG};
        cuda::moe_groups(dex.get(), b->P, NEXP, b->g, nullptr);
        batches.push_back(std::move(b));
    }
    // the whole batch's groups: ceil(count / 64) an expert
    uint32_t want_groups = 0;
    for (const uint32_t c : counts) want_groups += (c + PG - 1) / PG;
    ASSERT_EQ(batches[0]->count.download()[0], int32_t(want_groups));
    for (const Type wt : {Type::IQ2_XXS, Type::Q2_K}) {
        for (const uint64_t K : {256, 1024, 2304, 4096}) {
            for (const uint64_t N : {uint64_t(70), uint64_t(130), uint64_t(300)}) {
                const bool fused = wt == Type::IQ2_XXS;
                const std::string what = std::string(quant::traits(wt).name) + " K " + std::to_string(K) + " N " +
                                         std::to_string(N);
                const uint64_t RPE = N + 3;
                const HostWeight hg = random_weight(wt, K, RPE * NEXP, 1701 + K + N + uint64_t(wt));
                const HostWeight hu = random_weight(wt, K, RPE * NEXP, 1801 + K + N + uint64_t(wt));
                DevWeightHolder dg(hg), du(hu);
                // a batch of decode's groups (32) is not eligible in a prompt round: no product
                // mixes the orders
                const cuda::MoeGroups g32{batches[0]->grp.get(), batches[0]->pairs.get(), batches[0]->count.get(),
                                          batches[0]->cap, 32};
                ASSERT_FALSE(cuda::gemm_kq_eligible(dg.w, &g32)) << what;
                ASSERT_TRUE(cuda::gemm_kq_eligible(dg.w, &batches[0]->g)) << what;
                auto x = random_floats(R * K, 123 + K, -2.0f, 2.0f);
                DevVec<float> dx(x);
                ActHolder ah(R * K);
                const cuda::DevAct a = cuda::quantize_act(uint32_t(wt), dx.get(), K, R, K, ah.buf, nullptr);
                // the CPU's activation blocks (Q8_K: d, 256 codes, 16 bsums), the GPU's codes
                const size_t ab = quant::act_bytes(wt, K);
                std::vector<uint8_t> act(R * ab);
                {
                    const auto q = ah.q.download();
                    const auto d = ah.d.download();
                    const auto bs = ah.b.download();
                    for (uint32_t r = 0; r < R; ++r) {
                        uint8_t* ar = act.data() + r * ab;
                        quant::quantize_act(wt, &x[r * K], ar, K);
                        for (uint64_t blk = 0; blk < K / 256; ++blk) {
                            const uint8_t* rb = ar + blk * 292;
                            float dd;
                            std::memcpy(&dd, rb, 4);
                            ASSERT_EQ(dd, d[r * (K / 256) + blk]) << what << " row " << r << " block " << blk;
                            ASSERT_EQ(0, std::memcmp(rb + 4, &q[r * K + blk * 256], 256)) << what << " row " << r;
                            for (int j = 0; j < 16; ++j) {
                                int16_t sv;
                                std::memcpy(&sv, rb + 260 + 2 * j, 2);
                                ASSERT_EQ(int32_t(sv), bs[r * (K / 16) + blk * 16 + j]) << what << " row " << r;
                            }
                        }
                    }
                }
                // the CPU's dots: pair p, output n = expert mixed[p]'s row n · activation row p / KU
                const size_t rb = quant::row_bytes(wt, K);
                std::vector<float> ref(P * N), ref_u(P * N);
                for (uint32_t p = 0; p < P; ++p)
                    for (uint64_t n = 0; n < N; ++n) {
                        const uint64_t row = uint64_t(mixed[p]) * RPE + n;
                        const uint8_t* av = act.data() + (p / KU) * ab;
                        ref[p * N + n] = quant::vec_dot(wt, hg.bytes.data() + row * rb, av, K);
                        if (fused) ref_u[p * N + n] = quant::vec_dot(wt, hu.bytes.data() + row * rb, av, K);
                    }
                // fused gate+up: the GPU's swiglu of the CPU's dots, with a clamp that cuts about
                // a third of the up values (and the gate's tail), and without clamp or weights
                auto wv = random_floats(P, 29, 0.1f, 1.0f);
                DevVec<float> dew(wv);
                std::vector<float> mag(ref_u.size());
                for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(ref_u[i]);
                std::nth_element(mag.begin(), mag.begin() + mag.size() * 2 / 3, mag.end());
                const float clamps[2] = {std::max(mag[mag.size() * 2 / 3], 1e-3f), 0.0f};
                std::vector<float> sw_ref[2];
                if (fused) {
                    DevVec<float> g(ref), u(ref_u), mid(P * N);
                    for (int c = 0; c < 2; ++c) {
                        cuda::swiglu(g.get(), u.get(), mid.get(), P, uint32_t(N), clamps[c], c ? nullptr : dew.get(),
                                     nullptr);
                        sw_ref[c] = mid.download();
                    }
                }
                // the first output that differs, for the message
                auto first_diff = [&](const std::vector<float>& got, const std::vector<float>& want, uint32_t np) {
                    for (uint64_t i = 0; i < uint64_t(np) * N; ++i)
                        if (std::memcmp(&got[i], &want[i], 4) != 0)
                            return "pair " + std::to_string(i / N) + " (expert " + std::to_string(mixed[i / N]) +
                                   ") row " + std::to_string(i % N) + ": " + std::to_string(got[i]) + " vs CPU " +
                                   std::to_string(want[i]);
                    return std::string("none");
                };
                // staged FLAT (1; 2 takes it too) with the Q2_K mins by the split bsums (2) and
                // against the activation (1), register-fed FLAT; the staged IQ2_XXS expansion
                // from the grid as 2-bit codes (nib 1, gemm_iq2_nib_override)
                // a batch's products into poisoned outputs (a skipped one shows): the gate alone, and
                // gate+up fused with clamp c
                auto gate_alone = [&](const Batch& b) {
                    DevVec<float> got(std::vector<float>(b.P * N, std::nanf("")));
                    cuda::matvec(dg.w, a, b.P, got.get(), N, N, 0, nullptr, dex.get(), RPE, KU, &b.g);
                    return got.download();
                };
                auto gate_up = [&](const Batch& b, int c) {
                    DevVec<float> sw(std::vector<float>(b.P * N, std::nanf("")));
                    cuda::matvec_swiglu(dg.w, du.w, a, b.P, sw.get(), N, N, clamps[c], c ? nullptr : dew.get(), nullptr,
                                        dex.get(), RPE, KU, &b.g);
                    return sw.download();
                };
                // (f16: the fast mode's kernel, gemm_experts_f16_override: within the bounds below)
                struct Path {
                    int smem, mins, nib, f16;
                };
                const Path paths[6] = {{1, 2, 0, 0}, {1, 1, 0, 0}, {2, -1, 0, 0}, {0, -1, 0, 0}, {1, 2, 1, 0}, {1, 2, 0, 1}};
                for (const auto& [smem, mins, nib, f16] : paths) {
                    if (nib && !fused) continue;   // (an IQ2_XXS path)
                    if (f16) {
                        // the fast mode's kernel (gemm_experts_f16_kernel: Q2_K alone, IQ2_XXS gate+up
                        // fused): each weight and activation code rounded to FP16 once (an IQ2_XXS
                        // weight: its scale, then its product with the exact ±grid value), FP32 sums
                        // in its own order, against the CPU's exact dots: within 3e-3 of Σ_k |terms_k|
                        // |x_k| (the operands' roundings give ~1.5e-3; a Q2_K weight's terms d·sc·q
                        // and dmin·m counted apart, as its FP16 form rounds them apart); gate+up: those
                        // bounds through the swiglu (silu' <= 1.1, the clamp 1-Lipschitz); and not the
                        // exact bits everywhere (the kernel ran)
                        const auto qv = ah.q.download();
                        const auto qd = ah.d.download();
                        std::vector<float> xa(R * K);
                        for (uint64_t i = 0; i < xa.size(); ++i) xa[i] = std::fabs(float(qv[i]) * qd[i / 256]);
                        // Σ_k |terms_k| |x_k| of every (pair, row) of a weight
                        auto magnitudes = [&](const HostWeight& hw) {
                            std::vector<float> m(P * N), tm(K);
                            for (uint32_t e = 0; e < NEXP; ++e)
                                for (uint64_t n = 0; n < N; ++n) {
                                    weight_term_magnitudes(wt, hw.bytes.data() + (e * RPE + n) * rb, tm.data(), K);
                                    for (uint32_t pp = 0; pp < P; ++pp) {
                                        if (uint32_t(mixed[pp]) != e) continue;
                                        double acc = 0.0;
                                        for (uint64_t k = 0; k < K; ++k) acc += double(tm[k]) * xa[(pp / KU) * K + k];
                                        m[pp * N + n] = float(acc);
                                    }
                                }
                            return m;
                        };
                        const std::vector<float> mg = magnitudes(hg), mgu = fused ? magnitudes(hu) : std::vector<float>();
                        cuda::gemm_experts_f16_override(1);
                        // the kernel's forms: mma.sync, and where the device has it wgmma, and wgmma
                        // over two groups of an expert a block (the counts 65 and 130: a pair of
                        // groups, and a third group alone); each
                        // staging every pair slot, then only the pairs its MMAs read
                        // (DSV4_XF_STAGE_USED)
                        const int forms = cuda::gemm_experts_wgmma_available() ? 3 : 1;
                        // the WG form's variants that keep its bits: commit groups of two k-steps
                        // (DSV4_XF_KGROUP=2: the same MMAs in each accumulator's order) and the
                        // Q2_K down's staging in whole sectors (DSV4_XF_SECTORS: the same values
                        // staged otherwise; the gate+up has no such form and runs as without),
                        // each against groups of one k-step staged tile by tile
                        auto wg_variants_same_bits = [&](const char* what_product, auto&& product) {
                            if (forms < 3) return;
                            cuda::gemm_experts_f16_wgmma_override(1);
                            cuda::gemm_experts_f16_stage_used_override(1);
                            cuda::gemm_experts_f16_paired_codes_override(1);
                            for (size_t bi = 0; bi < batches.size(); ++bi) {
                                cuda::gemm_experts_f16_kgroup_override(1);
                                cuda::gemm_experts_f16_sectors_override(0);
                                const auto want = product(*batches[bi]);
                                // {form, k-steps a group, whole sectors, persistent, ahead}: form
                                // 3, the warp-specialised kernel (the same wgmma in each
                                // accumulator's order), one item a block and one block an SM over
                                // all, its copies 3, 4 or 5 tiles ahead
                                const int variants[][5] = {{1, 2, 0, 0, 3}, {1, 1, 1, 0, 3}, {1, 2, 1, 0, 3},
                                                           {3, 2, 1, 0, 3}, {3, 2, 1, 1, 3}, {3, 2, 1, 1, 4},
                                                           {3, 2, 1, 0, 5}};
                                for (const auto& v : variants) {
                                    cuda::gemm_experts_f16_wgmma_override(v[0]);
                                    cuda::gemm_experts_f16_kgroup_override(v[1]);
                                    cuda::gemm_experts_f16_sectors_override(v[2]);
                                    cuda::gemm_experts_f16_ws_persist_override(v[3]);
                                    cuda::gemm_experts_f16_ws_ahead_override(v[4]);
                                    const auto got = product(*batches[bi]);
                                    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
                                        << what << " f16 (wgmma"
                                        << (v[0] == 3 ? v[3] ? ", warp-specialised, persistent" : ", warp-specialised" : "")
                                        << (v[0] == 3 ? ", copies " + std::to_string(v[4]) + " tiles ahead" : "")
                                        << ") " << what_product << ", k-step groups of " << v[1]
                                        << (v[2] ? ", staged in whole sectors" : "") << ", batch of "
                                        << batch_rows[bi] << " rows: first difference at "
                                        << first_diff(got, want, batches[bi]->P);
                                }
                                cuda::gemm_experts_f16_wgmma_override(1);
                                cuda::gemm_experts_f16_ws_persist_override(-1);
                                cuda::gemm_experts_f16_ws_ahead_override(-1);
                            }
                            cuda::gemm_experts_f16_kgroup_override(-1);
                            cuda::gemm_experts_f16_sectors_override(-1);
                        };
                        auto form_name = [](int wg) {
                            return std::string(wg == 1   ? " (wgmma)"
                                               : wg == 2 ? " (wgmma, 2 groups)"
                                               : wg == 3 ? " (wgmma, warp-specialised)"
                                                         : "");
                        };
                        const auto staged = [](int su) { return su ? ", read pairs staged" : ""; };
                        if (fused) {
                            // (and the warp-specialised form; the down's: its bits, above)
                            const int fforms = forms == 3 ? 4 : forms;
                            for (size_t fb = 0; fb < 2 * fforms * batches.size(); ++fb) {
                                const size_t bi = fb % batches.size();
                                const int wg = int(fb / batches.size()) % fforms;
                                const int su = int(fb / (fforms * batches.size()));
                                cuda::gemm_experts_f16_wgmma_override(wg);
                                cuda::gemm_experts_f16_stage_used_override(su);
                                const Batch& b = *batches[bi];
                                const std::string where = what + " f16" + form_name(wg) + staged(su) + ", batch of " +
                                                          std::to_string(batch_rows[bi]) + " rows: ";
                                // the gate alone keeps its exact kernel
                                const auto r1 = gate_alone(b);
                                ASSERT_EQ(0, std::memcmp(r1.data(), ref.data(), r1.size() * 4))
                                    << where << "gate alone, first difference at " << first_diff(r1, ref, b.P);
                                for (int c = 0; c < 2; ++c) {
                                    const auto r2 = gate_up(b, c);
                                    for (uint64_t i = 0; i < r2.size(); ++i) {
                                        const float eg = 3e-3f * mg[i] + 1e-6f, eu = 3e-3f * mgu[i] + 1e-6f;
                                        const float w = c ? 1.0f : wv[i / N];
                                        const float bound = w * (1.1f * eg * (std::fabs(ref_u[i]) + eu) +
                                                                 (std::fabs(ref[i]) + eg) * eu) +
                                                            1e-5f * std::fabs(sw_ref[c][i]) + 1e-6f;
                                        ASSERT_LE(std::fabs(r2[i] - sw_ref[c][i]), bound)
                                            << where << "gate+up, clamp " << clamps[c] << ", pair " << i / N << " row "
                                            << i % N << ": " << r2[i] << " vs the swiglu of the CPU's dots " << sw_ref[c][i];
                                    }
                                    ASSERT_NE(0, std::memcmp(r2.data(), sw_ref[c].data(), r2.size() * 4))
                                        << where << "gate+up, the exact bits";
                                }
                                // DSV4_XF_IQ2=0: gate+up back on the exact kernel
                                cuda::gemm_experts_f16_iq2_override(0);
                                const auto r3 = gate_up(b, 1);
                                cuda::gemm_experts_f16_iq2_override(-1);
                                ASSERT_EQ(0, std::memcmp(r3.data(), sw_ref[1].data(), r3.size() * 4))
                                    << where << "gate+up without its FP16 form, first difference at "
                                    << first_diff(r3, sw_ref[1], b.P);
                            }
                            wg_variants_same_bits("gate+up", [&](const Batch& b) { return gate_up(b, 1); });
                            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                            cuda::gemm_experts_f16_override(-1);
                            cuda::gemm_experts_f16_wgmma_override(-1);
                            cuda::gemm_experts_f16_stage_used_override(-1);
                            cuda::gemm_experts_f16_paired_codes_override(-1);
                            continue;
                        }
                        // (either expansion: the halves' steps, and a row's four values by PRMT;
                        // forms 2, 3: the halves' steps by wgmma, one or two groups a block; staging
                        // every pair slot and each tile's code bytes, then only the read pairs and
                        // a tile pair's code bytes once: DSV4_XF_PAIRED_CODES, the same values)
                        for (int fs = 0; fs < 2 * (1 + forms); ++fs) {
                            const int form = fs % (1 + forms), su = fs / (1 + forms);
                            const int table = form == 1;
                            cuda::gemm_experts_f16_table_override(table);
                            cuda::gemm_experts_f16_wgmma_override(form >= 2 ? form - 1 : 0);
                            cuda::gemm_experts_f16_stage_used_override(su);
                            cuda::gemm_experts_f16_paired_codes_override(su);
                            for (size_t bi = 0; bi < batches.size(); ++bi) {
                                const Batch& b = *batches[bi];
                                const std::string where = what + " f16, table " + std::to_string(table) +
                                                          form_name(form >= 2 ? form - 1 : 0) + staged(su) + ", batch of " +
                                                          std::to_string(batch_rows[bi]) + " rows: ";
                                const auto r1 = gate_alone(b);
                                for (uint64_t i = 0; i < r1.size(); ++i)
                                    ASSERT_LE(std::fabs(r1[i] - ref[i]), 3e-3f * mg[i] + 1e-6f)
                                        << where << "pair " << i / N << " row " << i % N << ": " << r1[i]
                                        << " vs CPU " << ref[i] << ", Σ|terms| " << mg[i];
                                ASSERT_NE(0, std::memcmp(r1.data(), ref.data(), r1.size() * 4)) << where << "the exact bits";
                            }
                        }
                        cuda::gemm_experts_f16_table_override(0);
                        wg_variants_same_bits("alone", gate_alone);
                        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                        cuda::gemm_experts_f16_override(-1);
                        cuda::gemm_experts_f16_table_override(-1);
                        cuda::gemm_experts_f16_wgmma_override(-1);
                        cuda::gemm_experts_f16_stage_used_override(-1);
                        cuda::gemm_experts_f16_paired_codes_override(-1);
                        continue;
                    }
                    cuda::gemm_smem_override(smem);
                    cuda::gemm_q2k_mins(mins);
                    cuda::gemm_iq2_nib_override(nib);
                    for (size_t bi = 0; bi < batches.size(); ++bi) {
                        const Batch& b = *batches[bi];
                        const std::string where = what + " smem " + std::to_string(smem) + " mins " +
                                                  std::to_string(mins) + " nib " + std::to_string(nib) + " batch of " +
                                                  std::to_string(batch_rows[bi]) + " rows: ";
                        const auto r1 = gate_alone(b);
                        ASSERT_EQ(0, std::memcmp(r1.data(), ref.data(), r1.size() * 4))
                            << where << "gate alone, first difference at " << first_diff(r1, ref, b.P);
                        if (!fused) continue;
                        for (int c = 0; c < 2; ++c) {
                            const auto r2 = gate_up(b, c);
                            ASSERT_EQ(0, std::memcmp(r2.data(), sw_ref[c].data(), r2.size() * 4))
                                << where << "gate+up, clamp " << clamps[c] << ", first difference at "
                                << first_diff(r2, sw_ref[c], b.P);
                        }
                    }
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    cuda::gemm_smem_override(-1);
                    cuda::gemm_q2k_mins(-1);
                    cuda::gemm_iq2_nib_override(-1);
                }
                // Pair by pair, no groups (kq_flat_pairs: the FLAT forms of the streamed IQ2_XXS and
                // the pipelined Q2_K decode kernels, a short prompt round's experts) where those
                // take the weight (kq_pair_flat_ok; here IQ2_XXS of K 4,096, Q2_K of K 256 and
                // 1,024 on sm_90 and later): the CPU's bits too.
                if (cuda::kq_pair_flat_ok(dg.w)) {
                    const uint64_t before = cuda::kq_flat_pair_launches();
                    cuda::kq_flat_pairs(true);
                    DevVec<float> got(std::vector<float>(P * N, std::nanf("")));
                    cuda::matvec(dg.w, a, P, got.get(), N, N, 0, nullptr, dex.get(), RPE, KU);
                    const auto r1 = got.download();
                    ASSERT_EQ(0, std::memcmp(r1.data(), ref.data(), r1.size() * 4))
                        << what << " pairs in k order: gate alone, first difference at " << first_diff(r1, ref, P);
                    if (fused) {
                        ASSERT_TRUE(cuda::kq_pair_flat_ok(dg.w, &du.w)) << what;
                        for (int c = 0; c < 2; ++c) {
                            DevVec<float> sw(std::vector<float>(P * N, std::nanf("")));
                            cuda::matvec_swiglu(dg.w, du.w, a, P, sw.get(), N, N, clamps[c], c ? nullptr : dew.get(),
                                                nullptr, dex.get(), RPE, KU);
                            const auto r2 = sw.download();
                            ASSERT_EQ(0, std::memcmp(r2.data(), sw_ref[c].data(), r2.size() * 4))
                                << what << " pairs in k order: gate+up, clamp " << clamps[c]
                                << ", first difference at " << first_diff(r2, sw_ref[c], P);
                        }
                    }
                    cuda::kq_flat_pairs(false);
                    EXPECT_EQ(cuda::kq_flat_pair_launches() - before, fused ? 3u : 1u) << what;
                }
            }
        }
    }
}

TEST_F(CudaKernels, TensorCoreQ8_0SharedMemoryEqualsDecode) {
    // The Q8_0 product staged through shared memory (gemm.cu, DSV4_GEMM_SMEM; decode's
    // warp-per-row order) and the register-fed one both give each row exactly what decode
    // gives: K with fewer blocks than the 32 leaves (4 leaves a stage), with one leaf longer
    // than the others (K 1,056: 33 blocks, 2 leaves a stage), 3 blocks a leaf (K 2,304: 2
    // leaves a stage), 8 blocks a leaf (K 8,192, the largest staged) and past it
    // (K 8,224: the register-fed kernel takes it), N and R with tails, the grouped product,
    // and a wide-block shape (N 72, K 4,096: not staged).
    struct Case {
        uint64_t K, N, rpg;
        uint32_t R;
    };
    for (const Case c : {Case{512, 100, 0, 16}, Case{1056, 130, 0, 37}, Case{4096, 1100, 0, 20},
                         Case{8192, 1088, 0, 33}, Case{8224, 1040, 0, 17}, Case{1024, 128, 64, 17},
                         Case{4096, 72, 0, 20}, Case{1024, 2048, 0, 64}, Case{2304, 1100, 0, 16}}) {
        const uint64_t groups = c.rpg ? c.N / c.rpg : 1, AK = groups * c.K;
        const HostWeight hw = random_weight(Type::Q8_0, c.K, c.N, 950 + c.K + c.N);
        DevWeightHolder dw(hw);
        auto x = random_floats(c.R * AK, 41 + c.R, -2.0f, 2.0f);
        DevVec<float> dx(x);
        ActHolder ah(c.R * AK);
        const cuda::DevAct a = cuda::quantize_act(uint32_t(Type::Q8_0), dx.get(), AK, c.R, AK, ah.buf, nullptr);
        DevVec<float> one(c.R * c.N);
        for (uint32_t r = 0; r < c.R; ++r) {
            cuda::DevAct ar = a;
            ar.q = a.q + uint64_t(r) * AK;
            ar.d = a.d + uint64_t(r) * (AK / 32);
            if (c.rpg) cuda::matvec_grouped(dw.w, ar, 1, one.get() + r * c.N, c.N, c.N, c.rpg, nullptr);
            else cuda::matvec(dw.w, ar, 1, one.get() + r * c.N, c.N, c.N, 0, nullptr);
        }
        const auto ref = one.download();
        for (const int smem : {1, 0}) {
            cuda::gemm_smem_override(smem);
            DevVec<float> tc(c.R * c.N);
            cuda::gemm_q8_0(dw.w, a, c.R, tc.get(), c.N, c.N, 0, c.rpg, nullptr);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const auto got = tc.download();
            cuda::gemm_smem_override(-1);
            ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4))
                << "smem " << smem << " K " << c.K << " N " << c.N << " R " << c.R;
        }
    }
}

TEST_F(CudaKernels, CompressorParallelEqualsSequential) {
    // The compressor state machine (§5.9) run parallel over groups (compressor_pool_kernel +
    // compressor_tail_kernel, DSV4_CMP_PAR) against the sequential walk (compressor_state_kernel):
    // every pooled row and every state slot afterwards bit for bit, over a sequence of calls
    // on three sessions (each path on its own copy of the state): decode rows (one row per
    // session), batches that start and end mid-group, batches that complete a group begun in
    // earlier calls, 2,048-row chunks, several sessions at different positions in one batch.
    // Ratio 4 (attention, and the indexer's state) and ratio 128, from the state a session
    // starts with and from a random one (finite scores in slots 0..3 too, some masked).
    // The default choice (-1: parallel when rows > sessions) runs on a third copy.
    struct Restore {
        ~Restore() { cuda::compressor_state_override(-1); }
    } restore;
    struct Cfg {
        uint32_t ratio, D;
        bool indexer;
    };
    const uint32_t n_sess = 3, n_layer = 2, il = 1, n_paths = 3;
    const int modes[n_paths] = {0, 1, -1};
    // rows per session per call; negative -k: enough rows (1..ratio) that the call's last row
    // is k-1 positions before a group's end (-1: it completes a group)
    std::vector<std::vector<int>> calls = {
        {1, 0, 0},    {2, 1, 3},  {1, 1, 1},    {5, 6, 130},  {2048, 0, 0}, {3, 2048, 1},   {0, 0, 125},
        {1, 1, 1},    {1, 1, 1},  {2047, 7, 2}, {4, 4, 4},    {128, 0, 256}, {-1, -2, -1},  {1, 1, 1},
        {1, 1, 1},    {-3, -1, -2}, {1, 1, 1},  {1, 1, 1},    {-2, -2, -2}, {2, 2, 2},      {-1, -1, -1},
        {1, 0, 1},    {2048, 2048, 2048}, {9, 0, 0}, {1, 2, 3}, {-4, 0, -4}, {4, 1, 4},      {1, 1, 1}};
    uint64_t seed = 1;
    for (int extra = 0; extra < 12; ++extra) {
        std::vector<int> c(n_sess);
        for (auto& x : c) x = int((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 60) - 4;
        calls.push_back(c);
    }
    uint64_t emitted_total = 0;
    for (const Cfg cfg : {Cfg{4, 512, false}, Cfg{4, 128, true}, Cfg{128, 512, false}}) {
        for (const bool fresh : {true, false}) {
            const uint32_t ratio = cfg.ratio, D = cfg.D, W = (ratio == 4 ? 2 : 1) * D;
            const uint32_t slots = ratio == 4 ? 8 : ratio;
            const std::string what = "ratio " + std::to_string(ratio) + " D " + std::to_string(D) +
                                     (cfg.indexer ? " indexer" : "") + (fresh ? " fresh" : " random state");
            DevVec<float> ape(random_floats(uint64_t(ratio) * W, 11 + ratio + D, -1.0f, 1.0f));
            // per session: value and score slots, one copy per path
            std::vector<float> kv0(uint64_t(slots) * W, 0.0f), sc0(uint64_t(slots) * W, -1e30f);
            std::vector<std::unique_ptr<DevVec<float>>> skv, ssc;   // [path * n_sess + s]
            for (uint32_t p = 0; p < n_paths; ++p)
                for (uint32_t s = 0; s < n_sess; ++s) {
                    if (!fresh) {
                        kv0 = random_floats(kv0.size(), 100 + s, -2.0f, 2.0f);
                        sc0 = random_floats(sc0.size(), 200 + s, -3.0f, 3.0f);
                        for (size_t i = 0; i < sc0.size(); i += 7) sc0[i] = -1e30f;
                    }
                    skv.push_back(std::make_unique<DevVec<float>>(kv0));
                    ssc.push_back(std::make_unique<DevVec<float>>(sc0));
                }
            std::vector<int64_t> pos(n_sess, 0);
            for (size_t ci = 0; ci < calls.size(); ++ci) {
                std::vector<cuda::DevRow> rows;
                std::vector<uint32_t> sb, se;
                std::vector<uint32_t> in_batch;   // session of each session table entry
                for (uint32_t s = 0; s < n_sess; ++s) {
                    int n = calls[ci][s];
                    if (n < 0) {
                        const int64_t want = (int64_t(ratio) - (-n - 1)) % ratio;   // next position's phase
                        n = int((want - pos[s] % ratio + ratio) % ratio);
                        if (!n) n = int(ratio);
                    }
                    if (!n) continue;
                    const int32_t sidx = int32_t(sb.size());
                    sb.push_back(uint32_t(rows.size()));
                    for (int j = 0; j < n; ++j) rows.push_back({pos[s] + j, 0, sidx});
                    se.push_back(uint32_t(rows.size()));
                    in_batch.push_back(s);
                    pos[s] += n;
                }
                const uint32_t R = uint32_t(rows.size()), S = uint32_t(sb.size());
                if (!R) continue;
                DevVec<cuda::DevRow> drows(rows);
                DevVec<uint32_t> dsb(sb), dse(se);
                DevVec<float> kvp(random_floats(uint64_t(R) * W, 1000 + ci * 7 + ratio, -2.0f, 2.0f));
                DevVec<float> scp(random_floats(uint64_t(R) * W, 2000 + ci * 7 + ratio, -3.0f, 3.0f));
                std::vector<float> unset(uint64_t(R) * D);
                const uint32_t nan_bits = 0xFFFFFFFFu;
                for (auto& v : unset) std::memcpy(&v, &nan_bits, 4);
                std::vector<std::vector<float>> pooled(n_paths);
                for (uint32_t p = 0; p < n_paths; ++p) {
                    std::vector<cuda::DevLayerKV> lkv(uint64_t(S) * n_layer);
                    for (uint32_t t = 0; t < S; ++t) {
                        cuda::DevLayerKV& L = lkv[uint64_t(t) * n_layer + il];
                        (cfg.indexer ? L.iskv : L.skv) = skv[p * n_sess + in_batch[t]]->get();
                        (cfg.indexer ? L.issc : L.ssc) = ssc[p * n_sess + in_batch[t]]->get();
                    }
                    DevVec<cuda::DevLayerKV> dlkv(lkv);
                    DevVec<float> dpooled(unset);
                    cuda::compressor_state_override(modes[p]);
                    cuda::compressor_state(kvp.get(), scp.get(), ape.get(), drows.get(), R, dsb.get(), dse.get(), S,
                                           ratio, D, cfg.indexer, dlkv.get(), n_layer, il, dpooled.get(), nullptr);
                    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
                    pooled[p] = dpooled.download();
                    cuda::compressor_state_override(-1);
                }
                // the rows that complete a group, and only they, have a pooled row
                uint64_t emitted = 0;
                for (uint32_t r = 0; r < R; ++r) {
                    const bool emits = (rows[r].pos + 1) % ratio == 0;
                    emitted += emits;
                    ASSERT_EQ(emits, std::memcmp(&pooled[0][uint64_t(r) * D], &unset[0], 4) != 0)
                        << what << " call " << ci << " row " << r;
                }
                emitted_total += emitted;
                for (uint32_t p = 1; p < n_paths; ++p) {
                    ASSERT_EQ(0, std::memcmp(pooled[0].data(), pooled[p].data(), pooled[0].size() * 4))
                        << what << " call " << ci << " R " << R << " S " << S << ": pooled rows, mode " << modes[p];
                    for (uint32_t s = 0; s < n_sess; ++s) {
                        const auto kv_ref = skv[s]->download(), sc_ref = ssc[s]->download();
                        const auto kv_got = skv[p * n_sess + s]->download(), sc_got = ssc[p * n_sess + s]->download();
                        ASSERT_EQ(0, std::memcmp(kv_ref.data(), kv_got.data(), kv_ref.size() * 4))
                            << what << " call " << ci << ": value slots of session " << s << ", mode " << modes[p];
                        ASSERT_EQ(0, std::memcmp(sc_ref.data(), sc_got.data(), sc_ref.size() * 4))
                            << what << " call " << ci << ": score slots of session " << s << ", mode " << modes[p];
                    }
                }
            }
        }
    }
    EXPECT_GT(emitted_total, 6000u);
}

// Greedy ids on the device against the host's argmax_excluding, on rows built to trip it: ties
// (the first wins, across the kernel's slices too), NaN everywhere but one logit, -0 before +0,
// rows of -inf, the maximum excluded, only NaNs (the first id not excluded), random rows.
TEST_F(CudaKernels, GreedyIdsEqualHostArgmax) {
    const uint32_t V = 129280;
    const float nan = std::nanf(""), inf = INFINITY;
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> excl;
    uint64_t seed = 77;
    auto random_row = [&] { return random_floats(V, seed++, -20.0f, 20.0f); };
    auto add = [&](std::vector<float> r, int32_t ex) {
        rows.push_back(std::move(r));
        excl.push_back(ex);
    };
    for (int i = 0; i < 3; ++i) add(random_row(), -1);
    {   // a tie far apart (different slices of the kernel) and one within a slice
        auto r = random_row();
        r[100000] = r[70] = r[71] = 50.0f;
        add(r, -1);
        add(r, 70);   // the first maximum excluded: the next one
    }
    {
        std::vector<float> r(V, nan);
        r[123456] = -3.0f;
        add(r, -1);
    }
    {   // -0 before +0, everything else negative
        std::vector<float> r(V, -1.0f);
        r[5000] = -0.0f;
        r[9] = 0.0f;
        r[4] = -0.0f;
        add(r, -1);
    }
    add(std::vector<float>(V, -inf), -1);
    add(std::vector<float>(V, -inf), 0);
    add(std::vector<float>(V, nan), -1);
    add(std::vector<float>(V, nan), 0);
    {
        auto r = random_row();
        r[V - 1] = inf;
        add(r, int32_t(V - 1));
        add(r, -1);
    }
    const uint32_t n = uint32_t(rows.size());
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    DevVec<float> lg(flat);
    DevVec<int32_t> ex(excl), ids(n);
    DevVec<uint64_t> part(size_t(n) * cuda::kGreedyParts);
    cuda::greedy_ids(lg.get(), n, V, ex.get(), part.get(), ids.get(), nullptr);
    const auto got = ids.download();
    for (uint32_t i = 0; i < n; ++i) {
        const int32_t want = argmax_excluding(std::span<const float>(rows[i]),
                                              std::span<const int32_t>(&excl[i], excl[i] >= 0 ? 1 : 0));
        EXPECT_EQ(got[i], want) << "row " << i << " (excluded " << excl[i] << ")";
    }
}
