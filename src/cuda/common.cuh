// Device helpers shared by the kernel files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/kernels.h"

namespace dsv4::cuda {

constexpr uint32_t kWarp = 32;

// quant::Type ids (kept numeric here so no C++20 header reaches nvcc).
enum : uint32_t {
    T_F32 = 0, T_F16 = 1, T_Q8_0 = 8, T_Q2_K = 10, T_Q4_K = 12, T_Q8_K = 15, T_IQ2_XXS = 16, T_I32 = 26,
    T_BF16 = 30, T_MXFP4 = 39,
};

// A launch of `kernel` whose blocks form clusters of cluster.x × .y × .z (thread block clusters,
// sm_90: their shared memory visible to each other).
template <class... Params, class... Args>
cudaError_t launch_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                            dim3 cluster, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cluster.x;
    at[0].val.clusterDim.y = cluster.y;
    at[0].val.clusterDim.z = cluster.z;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Programmatic dependent launch (Hopper): the first statement of every kernel. It lets the
// next kernel of the stream be launched now (its blocks then wait in their own pdl_begin),
// then waits until the kernels this one depends on have finished and their writes are
// visible. Launch latency hides behind the running kernel; both are no-ops for kernels
// launched without a programmatic dependency (eager runs; graphs with DSV4_CUDA_PDL=0).
// Every kernel must call it before touching global memory: a dependent may start early.
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
    pdl_launch();
    pdl_wait();
}
// A kernel that reads constant data (weights) may do so between pdl_launch and pdl_wait:
// those bytes are written once, at load, so reading them while the kernels before it still
// run is safe, and the loads then overlap their tails. Everything else (activations, any
// buffer a kernel writes, and every store) only after pdl_wait. And no `const __restrict__`
// on a pointer read after a pdl_wait that is not the kernel's first statement: the compiler
// may treat such loads as invariant (ld.global.nc) and move them above the wait, reading what
// the kernels before have not yet written. Run 61: DSV4_ATTN_EARLY's split and merge kernels,
// with const __restrict__ partials and selection, gave wrong decode with programmatic edges
// and right without; run 63, the same kernels without __restrict__ there: right. (Their PTX
// had the loads after the wait: the move, or the non-coherent path's stale lines, is below it.)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// The power of two that takes mul·top into [2^13, 2^14) (1 for a zero or non-finite top), kept
// within 2^±60 so that alpha, the inverse of two of them, stays a normal float: the factor of an
// operand taken to FP16 (gemm_cublas.cu; DevAct::h_top's meaning). mul: 127 for the largest block
// scale of Q8_0 codes, 1 for the largest value of floats.
__device__ __forceinline__ float f16_factor(unsigned top_bits, float mul = 127.0f) {
    const float top = __uint_as_float(top_bits) * mul;
    if (!(top > 0.0f) || !isfinite(top)) return 1.0f;
    int e;
    frexpf(top, &e);   // top = f · 2^e, f in [0.5, 1)
    return ldexpf(1.0f, min(60, max(-60, 14 - e)));
}

// Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ double block_sum_d(double v) {
    __shared__ double part[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nw; ++i) t += part[i];
    return t;
}
__device__ __forceinline__ float block_max(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[w] = v;
    __syncthreads();
    float t = part[0];
    for (int i = 1; i < nw; ++i) t = fmaxf(t, part[i]);
    return t;
}

// True in the block that finishes last of the n blocks counting on *count; every thread
// of every block calls it once its results are stored. That block sees every other block's
// stores and leaves the counter at 0 for the next launch (graph replays).
__device__ __forceinline__ bool last_block_done(uint32_t* count, uint32_t n) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count, 1u) == n - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// expf as the CPU's std::exp(float) gives it (correctly rounded in glibc nearly always):
// the double exponential rounded once to float.
__device__ __forceinline__ float exp_cr(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float sigmoid_cr(float z) { return 1.0f / (1.0f + exp_cr(-z)); }
__device__ __forceinline__ float silu_cr(float x) { return x * sigmoid_cr(x); }
__device__ __forceinline__ float softplus_cr(float x) {
    return x > 20 ? x : (x < -20 ? exp_cr(x) : float(log1p(double(exp_cr(x)))));
}

// An activation value's int8 code: nearest (ties to even), NaN to 0, clamped (the CPU's).
__device__ __forceinline__ int8_t q_clamp(float v) {
    float r = rintf(v);
    if (r != r) r = 0.0f;
    r = fminf(fmaxf(r, -128.0f), 127.0f);
    return int8_t(int(r));
}

// SwiGLU of a (gate, up) pair of sums: swiglu_kernel's operations, in its order (the fused
// products' epilogues use it, so they equal matvec + matvec + swiglu bit for bit). FAST (the
// fast mode's expert kernel, whose sums have other bits anyway): the sigmoid from the float
// exponential (~1e-6 relative) instead of the double one (Nsight Compute, run 159: the DFMAs
// of the double exponential 4 % of that kernel's stall samples).
template <bool FAST = false>
__device__ __forceinline__ float swiglu_pair(float v, float u, float clamp, const float* ew, uint32_t pair) {
    if (clamp > 1e-6f) {
        v = fminf(v, clamp);
        u = fminf(fmaxf(u, -clamp), clamp);
    }
    v = __fmul_rn(FAST ? v / (1.0f + __expf(-v)) : silu_cr(v), u);
    if (ew) v = __fmul_rn(v, ew[pair]);
    return v;
}

__device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float f16_round(float f) { return __half2float(__float2half_rn(f)); }
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }

// ggml's E8M0 "half" scale: 2^(e-128), exact for every e.
__device__ __forceinline__ float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
    return __uint_as_float(bits);
}
__device__ __constant__ const int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^ceil(log2(x)) for x > 0, exactly (cpu::pow2_ceil).
__device__ __forceinline__ float pow2_ceil_d(float x) {
    int e;
    const float m = frexpf(x, &e);
    return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}
// Nearest E4M3FN value, ties to the even code (|v| <= 448): a power-of-two step, so
// rint (ties to even) on v/step picks the code of even mantissa.
__device__ __forceinline__ float e4m3_round_d(float v) {
    const float a = fabsf(v);
    float step;
    if (a < 0.015625f) {
        step = 0.001953125f;   // 2^-9: subnormals
    } else {
        int e;
        frexpf(a, &e);           // a in [2^(e-1), 2^e)
        step = ldexpf(1.0f, e - 4);
    }
    const float r = rintf(a / step) * step;
    return copysignf(fminf(r, 448.0f), v);
}
// Nearest E2M1 value of {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code.
__device__ __forceinline__ float e2m1_round_d(float v) {
    const float a = fabsf(v);
    const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
    const float r = rintf(a / step) * step;
    return copysignf(fminf(r, 6.0f), v);
}


// The rotation of RoPE pair i at pos (or -pos): its cosine and sine, from the angle in double.
__device__ __forceinline__ void rope_angle(int64_t pos, const double* inv_freq, uint32_t i, bool inverse, float& c,
                                           float& s) {
    const double th = double(pos) * inv_freq[i];
    c = float(cos(th));
    s = inverse ? -float(sin(th)) : float(sin(th));
}
// Pair (t[2i], t[2i+1]) rotated by (c, s).
__device__ __forceinline__ void rope_pair(float* t, uint32_t i, float c, float s) {
    const float x0 = t[2 * i], x1 = t[2 * i + 1];
    t[2 * i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    t[2 * i + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// ---- TF32 tensor-core helpers (attention_tc.cu, gemm.cu's flat float products) ----
// x = hi + lo with both TF32 (round to nearest): the 3xTF32 / 2xTF32 splits. The rounding is
// cvt.rn (ties to even), which sm_90 does in one instruction where ptxas expands cvt.rna (ties
// away) into four (run 69's SASS: add, an |x| < inf test, select, mask); below sm_90 cvt.rn
// has no TF32 form, so those keep cvt.rna (the two differ only at exact ties).
__device__ __forceinline__ uint32_t tf32_rn(float x) {
    uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
    return r;
}
// x = hi + lo + r, |r| <= 2^-22 |x|; hi and lo TF32 values (low 13 bits zero).
__device__ __forceinline__ void tf32_split(float x, uint32_t& hi, uint32_t& lo) {
    hi = tf32_rn(x);
    lo = tf32_rn(__fsub_rn(x, __uint_as_float(hi)));
}
// Whether all of a fragment's values are TF32 already (their low 13 bits zero in every lane):
// then hi = x and lo = 0, and a split's hi·lo products would add exact zeros. A warp vote.
__device__ __forceinline__ bool tf32_inexact(uint32_t bits_or) {
    return __any_sync(0xffffffffu, (bits_or & 0x1fffu) != 0u);
}

// d += a·b (m16n8k8, TF32 inputs, FP32 accumulate). Fragments (gid = lane / 4, tig = lane % 4):
// a0 (row gid, k tig), a1 (gid+8, tig), a2 (gid, tig+4), a3 (gid+8, tig+4); b0 (k tig, n gid),
// b1 (k tig+4, n gid); d0 (gid, 2tig), d1 (gid, 2tig+1), d2 (gid+8, 2tig), d3 (gid+8, 2tig+1).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a·b (a fresh accumulator).
__device__ __forceinline__ void mma_tf32_0(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return uint32_t(__cvta_generic_to_shared(p));
}

// Bulk copies global → shared completed on an mbarrier (Hopper's TMA without a tensor map:
// contiguous bytes, 16-byte aligned, a multiple of 16). A copy costs one instruction of one
// lane and no registers while in flight, so a warp can keep several of its next rows coming
// while it computes. Compiled only for sm_90 and later; callers check the device first.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arms the barrier's current phase for `bytes` of copies (this thread's arrival included).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
#endif
}
// This thread's arrival on the barrier (release: its earlier writes, its completed cp.async
// copies among them, are seen by the threads its phase's completion lets go).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// Waits until the barrier's phase of the given parity has completed (its bytes have landed).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
#endif
}
// Orders this thread's earlier generic-proxy accesses of shared memory before its later
// bulk copies into it (a stage read by the warp, then refilled).
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Four 8×8 matrices of 16-byte rows (lanes 8i..8i+7 give matrix i's row addresses, here as
// 32-bit shared-window byte addresses): register i of lane l gets bytes 4 (l % 4) .. + 3 of row
// l / 4 of matrix i — a TF32 A fragment (matrices: rows 0-7 / 8-15 × columns 0-3 / 4-7), two
// TF32 B fragments, or the FP16 / BF16 fragments of an m16n8k16 MMA.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
// The same from a generic pointer into shared memory.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const float* p) {
    ldsm_x4(r, uint32_t(__cvta_generic_to_shared(p)));
}

}  // namespace dsv4::cuda
