// A probe of the warpgroup-MMA forms of the FlashMLA-style rows attention
// (src/cuda/sm90a/attention_wg.cu, wgmma_ss.cuh; bench/gpu/NOTES.md, "Thirty-ninth round"), in
// no-swizzle core-matrix layouts:
//   scores: S[64 heads][32 keys] = Q[64][512] · K[32 keys][512]ᵀ, A and B K-major from shared
//     memory (the queries and the key tile in one layout: element (row, k) at (k / 16) · rows ·
//     32 + ((k / 8) % 2) · rows · 16 + (row / 8) · 128 + (row % 8) · 16 + (k % 8) · 2);
//   weighted sum: O[64][dims 256..511] = P[64][32 keys] · V, V the same key tile read as an
//     MN-major B (transposed: 8 dims contiguous a key, core matrices 512 bytes apart along the
//     dims and 128 along the keys), m64n256k16; P from shared memory with both readings of
//     (LBO, SBO), and P from registers (the kernel's form).
// Each is checked against the host's double sums (FP32 accumulation of FP16 products: relative
// error ~1e-6 of the terms' magnitude expected; a wrong layout gives O(1)).
//   nvcc -Iinclude -Isrc -DDSV4_HAVE_CUDA=1 --expt-relaxed-constexpr -std=c++17 \
//        -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/wap bench/gpu/wgmma_attn_probe.cu && /tmp/wap
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/sm90a/wgmma_ss.cuh"
#include "probe_check.h"

namespace {
using namespace dsv4::cuda;
using namespace dsv4::cuda::wgss;

constexpr int kH = 64, kD = 512, kKeys = 32;   // attention_wg.cu's tile of 32 keys


__host__ __device__ constexpr uint32_t cm_offset(uint32_t row, uint32_t k, uint32_t rows) {
    return (k / 16) * rows * 32 + ((k / 8) % 2) * rows * 16 + (row / 8) * 128 + (row % 8) * 16 + (k % 8) * 2;
}

// A warpgroup's m64nN sums (mma.sync's D layout side by side) into out[64][N].
template <int DN>
__device__ void store_d(const float (&d)[DN], float* out, uint32_t warp, uint32_t gid, uint32_t tig) {
    constexpr uint32_t N = DN * 2;
    for (uint32_t i = 0; i < N / 8; ++i)
        for (uint32_t e = 0; e < 4; ++e) {
            const uint32_t row = 16 * warp + gid + 8 * (e / 2), col = 8 * i + 2 * tig + e % 2;
            out[row * N + col] = d[4 * i + e];
        }
}

// mode 0: scores; mode 1, 2: weighted sum, dims 256..511, P from shared memory, (LBO, SBO) =
// (128, 512) or (512, 128); mode 3: the same, P from registers, (128, 512).
__global__ void __launch_bounds__(128) probe(const __half* Q, const __half* K, const __half* P, float* out, int mode) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint8_t* q_s = sm;                    // 64 KB
    uint8_t* k_s = sm + kH * kD * 2;      // 32 KB
    uint8_t* p_s = k_s + kKeys * kD * 2;  // 4 KB
    const uint32_t t = threadIdx.x;
    for (uint32_t i = t; i < kH * kD; i += 128) *reinterpret_cast<__half*>(q_s + cm_offset(i / kD, i % kD, kH)) = Q[i];
    for (uint32_t i = t; i < kKeys * kD; i += 128)
        *reinterpret_cast<__half*>(k_s + cm_offset(i / kD, i % kD, kKeys)) = K[i];
    for (uint32_t i = t; i < kH * kKeys; i += 128)
        *reinterpret_cast<__half*>(p_s + cm_offset(i / kKeys, i % kKeys, kH)) = P[i];
    xf::fence_proxy_async();
    __syncthreads();
    const uint32_t warp = t / 32, lane = t % 32, gid = lane / 4, tig = lane % 4;
    const uint32_t qa = smem_addr(q_s), ka = smem_addr(k_s), pa = smem_addr(p_s);
    if (mode == 0) {
        float d[16];
        for (float& x : d) x = 0.0f;
        xf::wg_fence();
        for (uint32_t ks = 0; ks < kD / 16; ++ks)
            wg_mma_ss<32, 0>(d, wg_ss_desc(qa + ks * kH * 32, kH * 16, 128),
                             wg_ss_desc(ka + ks * kKeys * 32, kKeys * 16, 128), ks > 0);
        xf::wg_commit();
        xf::wg_wait<0>();
        store_d(d, out, warp, gid, tig);
    } else {
        float d[128];
        for (float& x : d) x = 0.0f;
        const uint32_t lbo = mode == 2 ? 512 : 128, sbo = mode == 2 ? 128 : 512;
        xf::wg_fence();
        for (uint32_t kk = 0; kk < kKeys / 16; ++kk) {
            const uint64_t db = wg_ss_desc(ka + kk * 2 * 128 + (256 / 8) * 512, lbo, sbo);
            if (mode == 3) {
                // A fragment: rows 16 warp + gid (+ 8), keys 16 kk + 2 tig (+ 1), + 8
                auto pk = [&](uint32_t row, uint32_t key) {
                    return uint32_t(__half_as_ushort(P[row * kKeys + key])) |
                           uint32_t(__half_as_ushort(P[row * kKeys + key + 1])) << 16;
                };
                const uint32_t r0 = 16 * warp + gid, k0 = 16 * kk + 2 * tig;
                const uint32_t a[4] = {pk(r0, k0), pk(r0 + 8, k0), pk(r0, k0 + 8), pk(r0 + 8, k0 + 8)};
                wg_mma_rs<256, 1>(d, a, db, kk > 0);
            } else {
                wg_mma_ss<256, 1>(d, wg_ss_desc(pa + kk * kH * 32, kH * 16, 128), db, kk > 0);
            }
        }
        xf::wg_commit();
        xf::wg_wait<0>();
        store_d(d, out, warp, gid, tig);
    }
}

}  // namespace

int main() {
    std::vector<__half> q(kH * kD), k(kKeys * kD), p(kH * kKeys);
    uint32_t s = 12345;
    auto rnd = [&] {
        s = s * 1664525u + 1013904223u;
        return float(int32_t(s >> 8) % 2001 - 1000) / 1000.0f;
    };
    for (auto& x : q) x = __float2half(rnd());
    for (auto& x : k) x = __float2half(rnd());
    for (auto& x : p) x = __float2half(0.5f + 0.5f * rnd());
    __half *dq, *dk, *dp;
    float* dout;
    CHECK(cudaMalloc(&dq, q.size() * 2));
    CHECK(cudaMalloc(&dk, k.size() * 2));
    CHECK(cudaMalloc(&dp, p.size() * 2));
    CHECK(cudaMalloc(&dout, kH * 256 * 4));
    CHECK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dp, p.data(), p.size() * 2, cudaMemcpyHostToDevice));
    const int smem = (kH * kD + kKeys * kD + kH * kKeys) * 2;
    CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int bad = 0;
    for (int mode = 0; mode < 4; ++mode) {
        CHECK(cudaMemset(dout, 0, kH * 256 * 4));
        probe<<<1, 128, smem>>>(dq, dk, dp, dout, mode);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        const int cols = mode == 0 ? 32 : 256;
        std::vector<float> out(kH * cols);
        CHECK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int r = 0; r < kH; ++r)
            for (int c = 0; c < cols; ++c) {
                double ref = 0, mag = 0;
                if (mode == 0)
                    for (int d = 0; d < kD; ++d) {
                        const double v = double(__half2float(q[r * kD + d])) * __half2float(k[c * kD + d]);
                        ref += v, mag += std::fabs(v);
                    }
                else
                    for (int j = 0; j < kKeys; ++j) {
                        const double v = double(__half2float(p[r * kKeys + j])) * __half2float(k[j * kD + 256 + c]);
                        ref += v, mag += std::fabs(v);
                    }
                worst = std::max(worst, std::fabs(out[r * cols + c] - ref) / std::max(mag, 1e-30));
            }
        std::printf("mode %d (%s): max error / magnitude %.3g -> %s\n", mode,
                    mode == 0   ? "scores, K-major A and B"
                    : mode == 1 ? "weighted sum, P in shared memory, MN-major B, LBO 128 SBO 512"
                    : mode == 2 ? "weighted sum, P in shared memory, MN-major B, LBO 512 SBO 128"
                                : "weighted sum, P in registers, MN-major B, LBO 128 SBO 512",
                    worst, worst < 1e-5 ? "exact layout" : "WRONG");
        if (mode != 2 && worst >= 1e-5) bad = 1;
    }
    return bad;
}
