// A probe of Hopper's warpgroup MMA in the form the experts GEMMs would take (bench/gpu/NOTES.md,
// "Thirty-fourth round"): wgmma.mma_async m64n64k16, f16 operands, f32 sums, A from registers in
// mma.sync's m16n8k16 fragment layout (warp w of the warpgroup: rows 16 w ..), B from shared
// memory through a matrix descriptor in the canonical K-major layout without swizzle (core
// matrices of 8 rows × 16 bytes, each 128 contiguous bytes; LBO between the two core matrices of
// a k-step's 16 k, SBO between groups of 8 rows), the sums read back in mma.sync's D layout side by
// side. It checks one 64 × 64 × K product against the host's (double), then times a chain of
// wgmma (one warpgroup a block, 1 to 4 blocks an SM). Run 163 (H100) found that layout exact
// (max error 0) before the kernel was written; the other reading of the offsets (LBO 128, SBO
// 1,024) read past B. It now takes the kernel's own helpers (experts_f16.cuh: wg_desc, wg_mma,
// wg_fence, wg_commit, wg_wait), so it checks what the kernel runs:
//   nvcc -Iinclude -Isrc -DDSV4_HAVE_CUDA=1 --expt-relaxed-constexpr -std=c++17 \
//        -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/wp bench/gpu/wgmma_probe.cu && /tmp/wp
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/experts_f16.cuh"
#include "probe_check.h"

namespace {
using namespace dsv4::cuda::xf;

constexpr int kM = 64, kN = 64, kK = 64;   // one warpgroup's rows, the pairs, 4 k-steps
constexpr int kKSteps = kK / 16;


// B's byte offset in shared memory: pair n, k (K-major core matrices; k-step ks = k / 16, its
// half kh = (k / 8) % 2, the pairs' group n / 8)
__host__ __device__ constexpr uint32_t b_offset(uint32_t n, uint32_t k) {
    return (k / 16) * 2048 + ((k / 8) % 2) * 1024 + (n / 8) * 128 + (n % 8) * 16 + (k % 8) * 2;
}

__device__ uint32_t pack(__half lo, __half hi) {
    return uint32_t(__half_as_ushort(lo)) | uint32_t(__half_as_ushort(hi)) << 16;
}

// One warpgroup: D = A · Bᵀ (A [64][K] row-major, B [64 pairs][K]), D [64][64]; reps > 1: the
// chain repeated (timing), cycles out.
__global__ void __launch_bounds__(128) probe(const __half* A, const __half* B, float* D, int reps, long long* cycles) {
    __shared__ __align__(128) uint8_t sb[kN * kK * 2];
    const uint32_t t = threadIdx.x, warp = t / 32, lane = t % 32, gid = lane / 4, tig = lane % 4;
    for (uint32_t i = t; i < kN * kK; i += 128) {
        const uint32_t n = i / kK, k = i % kK;
        *reinterpret_cast<__half*>(sb + b_offset(n, k)) = B[i];
    }
    fence_proxy_async();   // generic stores -> the async proxy
    __syncthreads();
    uint32_t a[kKSteps][4];
    const uint32_t r0 = 16 * warp + gid;
    for (int ks = 0; ks < kKSteps; ++ks) {
        const uint32_t k0 = 16 * ks + 2 * tig;
        a[ks][0] = pack(A[r0 * kK + k0], A[r0 * kK + k0 + 1]);
        a[ks][1] = pack(A[(r0 + 8) * kK + k0], A[(r0 + 8) * kK + k0 + 1]);
        a[ks][2] = pack(A[r0 * kK + k0 + 8], A[r0 * kK + k0 + 9]);
        a[ks][3] = pack(A[(r0 + 8) * kK + k0 + 8], A[(r0 + 8) * kK + k0 + 9]);
    }
    float d[32];
    for (float& x : d) x = 0.0f;
    const long long c0 = clock64();
    for (int r = 0; r < reps; ++r) {
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) wg_mma<kN>(d, a[ks], wg_desc<kN>(sb + ks * 2048));
        wg_commit();
    }
    wg_wait<0>();
    for (float& x : d) wg_fence_operand(x);
    const long long c1 = clock64();
    if (t == 0 && cycles) cycles[blockIdx.x] = c1 - c0;
    for (int nt = 0; nt < 8; ++nt)
        for (int e = 0; e < 4; ++e) {
            const uint32_t row = r0 + 8 * (e >> 1), col = 8 * nt + 2 * tig + (e & 1);
            if (blockIdx.x == 0) D[row * kN + col] = d[4 * nt + e];
        }
}

}  // namespace

int main() {
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    std::vector<__half> ha(kM * kK), hb(kN * kK);
    std::vector<double> fa(kM * kK), fb(kN * kK);
    srand(1);
    for (int i = 0; i < kM * kK; ++i) fa[i] = __half2float(ha[i] = __float2half(float(rand() % 17 - 8) / 8.0f));
    for (int i = 0; i < kN * kK; ++i) fb[i] = __half2float(hb[i] = __float2half(float(rand() % 13 - 6) / 4.0f));
    std::vector<double> ref(kM * kN, 0.0);
    double mag = 0.0;
    for (int m = 0; m < kM; ++m)
        for (int n = 0; n < kN; ++n) {
            for (int k = 0; k < kK; ++k) ref[m * kN + n] += fa[m * kK + k] * fb[n * kK + k];
            mag = std::fmax(mag, std::fabs(ref[m * kN + n]));
        }
    __half *da, *db;
    float* dd;
    long long* dc;
    const int max_blocks = 4 * prop.multiProcessorCount;
    CHECK(cudaMalloc(&da, ha.size() * 2));
    CHECK(cudaMalloc(&db, hb.size() * 2));
    CHECK(cudaMalloc(&dd, kM * kN * 4));
    CHECK(cudaMalloc(&dc, max_blocks * sizeof(long long)));
    CHECK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    {
        CHECK(cudaMemset(dd, 0, kM * kN * 4));
        probe<<<1, 128>>>(da, db, dd, 1, nullptr);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<float> got(kM * kN);
        CHECK(cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost));
        double err = 0.0;
        for (int i = 0; i < kM * kN; ++i) err = std::fmax(err, std::fabs(got[i] - ref[i]));
        std::printf("wg_desc<64> (LBO 1,024, SBO 128): max abs error %.3g of max |D| %.3g: rel %.3g\n", err, mag,
                    err / mag);
    }
    // throughput: a chain of 4,096 k-steps a warpgroup, 1..4 warpgroups (blocks) an SM
    const int reps = 1024;
    for (int per_sm = 1; per_sm <= 4; ++per_sm) {
        const int blocks = per_sm * prop.multiProcessorCount;
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        CHECK(cudaEventRecord(e0));
        probe<<<blocks, 128>>>(da, db, dd, reps, dc);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<long long> cyc(blocks);
        CHECK(cudaMemcpy(cyc.data(), dc, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
        const double flop = 2.0 * kM * kN * 16 * kKSteps * double(reps) * blocks;
        std::printf("%d warpgroup(s) an SM: %.1f TFLOP/s (%.3f ms), block 0: %.1f cycles a wgmma\n", per_sm,
                    flop / (ms * 1e-3) / 1e12, ms, double(cyc[0]) / (reps * kKSteps));
    }
    return 0;
}
