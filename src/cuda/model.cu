// The forward pass's kernels other than the matrix products (model-spec §5): norms, mHC,
// RoPE, KV finalisation, compressors, the lightning indexer and its top-k, sink attention,
// routing and the SwiGLU/MoE glue. Where the CPU reference's result is decided by rounding
// (exp, the FP8/FP4 simulations, RoPE), the same float operations are used, unfused.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/tails.cuh"

namespace dsv4::cuda {
namespace {

constexpr float kNegInf = -1e30f;

// ---- block-level helpers (every thread of the block calls them) -------------------------

// RMSNorm of x[0, n) into y (may alias x); double sum of squares like the CPU.
__device__ void rms_norm_block(const float* x, float* y, uint32_t n, float eps, const float* w) {
    double ss = 0;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(x[i]) * double(x[i]);
    ss = block_sum_d(ss);
    const float r = float(1.0 / sqrt(ss / n + double(eps)));
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = __fmul_rn(__fmul_rn(x[i], r), w ? w[i] : 1.0f);
    __syncthreads();
}

// Rotates the last n_rot dims of x (width D) by pos (or -pos), interleaved pairs.
__device__ void rope_block(float* x, uint32_t D, uint32_t n_rot, int64_t pos, const double* inv_freq, bool inverse) {
    float* t = x + (D - n_rot);
    for (uint32_t i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        float c, s;
        rope_angle(pos, inv_freq, i, inverse, c, s);
        rope_pair(t, i, c, s);
    }
    __syncthreads();
}

// Block-quantisation round trip of x[0, n) in blocks of `block` (<= 64): FP8 (E4M3, qmax
// 448) or FP4 (E2M1, qmax 6). One warp per block.
__device__ void sim_block(float* x, uint32_t n, uint32_t block, bool fp8) {
    const float qmax = fp8 ? 448.0f : 6.0f;
    const float floor_ = fp8 ? 1e-4f : 7.052966104933725e-38f;
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (uint32_t b = w * block; b < n; b += nw * block) {
        const uint32_t e = min(n, b + block);
        float amax = 0.0f;
        for (uint32_t i = b + lane; i < e; i += 32) amax = fmaxf(amax, fabsf(x[i]));
        amax = fmaxf(warp_max(amax), floor_);
        const float scale = pow2_ceil_d(amax / qmax);
        for (uint32_t i = b + lane; i < e; i += 32) {
            const float v = fminf(fmaxf(x[i] / scale, -qmax), qmax);
            x[i] = (fp8 ? e4m3_round_d(v) : e2m1_round_d(v)) * scale;
        }
    }
    __syncthreads();
}

// Normalised Sylvester Walsh-Hadamard transform of x[0, n), n a power of two.
__device__ void hadamard_block(float* x, uint32_t n) {
    for (uint32_t stride = 1; stride < n; stride <<= 1) {
        for (uint32_t p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const uint32_t i = (p / stride) * 2 * stride + (p % stride);
            const float a = x[i], b = x[i + stride];
            x[i] = a + b;
            x[i + stride] = a - b;
        }
        __syncthreads();
    }
    const float s = float(1.0 / sqrt(double(n)));
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) x[i] *= s;
    __syncthreads();
}

// ---- kernels ------------------------------------------------------------------------------

__global__ void rms_norm_kernel(const float* x, uint64_t xs, float* y, uint64_t ys, uint32_t n, float eps,
                                const float* w) {
    pdl_begin();
    rms_norm_block(x + blockIdx.x * xs, y + blockIdx.x * ys, n, eps, w);
}

// RMSNorm of a row, then its Q8_0 codes (the query path's q_a norm feeding q_b): the
// codes are quant_q8_0_kernel's from the stored normalised row, one warp per 32 values.
__global__ void rms_norm_q8_0_kernel(float* x, uint64_t xs, uint32_t n, float eps, const float* w, int8_t* q,
                                     float* d) {
    pdl_begin();
    float* xr = x + blockIdx.x * xs;
    rms_norm_block(xr, xr, n, eps, w);
    const uint32_t lane = threadIdx.x & 31;
    for (uint32_t b = threadIdx.x >> 5; b < n / 32; b += blockDim.x >> 5) {
        const float v = xr[b * 32 + lane];
        const float amax = warp_max(fabsf(v));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        q[uint64_t(blockIdx.x) * n + b * 32 + lane] = q_clamp(v * id);
        if (lane == 0) d[uint64_t(blockIdx.x) * (n / 32) + b] = f16_round(dd);
    }
}

// rms_norm_q8_0_kernel for rows of VPT * blockDim.x values with the row in registers
// (rms_norm_q8_0_row): the kernel above walks the row three times, each a chain of dependent
// L2 round trips on the query path's critical path.
template <uint32_t VPT>
__global__ void rms_norm_q8_0_reg_kernel(float* x, uint64_t xs, uint32_t n, float eps, const float* w, int8_t* q,
                                         float* d) {
    pdl_begin();
    rms_norm_q8_0_row<VPT>(x + blockIdx.x * xs, n, eps, w, q + uint64_t(blockIdx.x) * n, d + uint64_t(blockIdx.x) * (n / 32));
}

// Long rows (the 16,384-wide mHC state): 1024 threads and float4 loads, so a single row is
// not a long chain of dependent loads.
__global__ void __launch_bounds__(1024) rms_norm_vec_kernel(const float* x, uint64_t xs, float* y, uint64_t ys,
                                                            uint32_t n, float eps, const float* w) {
    pdl_begin();
    const float4* x4 = reinterpret_cast<const float4*>(x + blockIdx.x * xs);
    float4* y4 = reinterpret_cast<float4*>(y + blockIdx.x * ys);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    double ss = 0;
    for (uint32_t u = threadIdx.x; u < n / 4; u += blockDim.x) {
        const float4 v = x4[u];
        ss += double(v.x) * double(v.x) + double(v.y) * double(v.y) + double(v.z) * double(v.z) +
              double(v.w) * double(v.w);
    }
    ss = block_sum_d(ss);
    const float r = float(1.0 / sqrt(ss / n + double(eps)));
    __syncthreads();
    for (uint32_t u = threadIdx.x; u < n / 4; u += blockDim.x) {
        const float4 v = x4[u];
        const float4 g = w ? w4[u] : make_float4(1, 1, 1, 1);
        y4[u] = make_float4(__fmul_rn(__fmul_rn(v.x, r), g.x), __fmul_rn(__fmul_rn(v.y, r), g.y),
                            __fmul_rn(__fmul_rn(v.z, r), g.z), __fmul_rn(__fmul_rn(v.w, r), g.w));
    }
}

// Sinkhorn on one warp: lane a*H+c holds C[a][c]; every sum reads its H terms in the
// CPU's order through shuffles, so the result is the CPU's bit for bit.
__device__ void sinkhorn_warp(const float* m, const float* scale, const float* base, uint32_t H, float eps,
                              uint32_t iters, float* C) {
    const uint32_t lane = threadIdx.x & 31, HH = H * H;
    const uint32_t a = lane / H, col = lane % H;
    const bool act = lane < HH;
    auto at = [&](float v, uint32_t src) { return __shfl_sync(0xffffffffu, v, src & 31); };
    float c = act ? __fadd_rn(__fmul_rn(m[2 * H + lane], scale[2]), base[2 * H + lane]) : 0.0f;
    float mx = -INFINITY;
    for (uint32_t k = 0; k < H; ++k) mx = fmaxf(mx, at(c, a * H + k));
    const float e = exp_cr(c - mx);
    float sum = 0;
    for (uint32_t k = 0; k < H; ++k) sum += at(e, a * H + k);
    c = e / sum + eps;
    auto col_norm = [&] {
        float s2 = 0;
        for (uint32_t k = 0; k < H; ++k) s2 += at(c, k * H + col);
        c /= (s2 + eps);
    };
    auto row_norm = [&] {
        float s2 = 0;
        for (uint32_t k = 0; k < H; ++k) s2 += at(c, a * H + k);
        c /= (s2 + eps);
    };
    col_norm();
    for (uint32_t it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
    }
    if (act) C[lane] = c;
}

// Sinkhorn of one row (comb) by the calling warp: sinkhorn_warp when H * H <= 32, else lane 0
// alone, the CPU's loops in order.
__device__ void sinkhorn_row(const float* m, const float* scale, const float* base, uint32_t H, float eps,
                             uint32_t iters, float* C) {
    if (H * H <= 32) {
        sinkhorn_warp(m, scale, base, H, eps, iters, C);
        return;
    }
    if ((threadIdx.x & 31) != 0) return;
    for (uint32_t a = 0; a < H; ++a) {
        float mx = -INFINITY;
        for (uint32_t c = 0; c < H; ++c) {
            C[a * H + c] = __fadd_rn(__fmul_rn(m[2 * H + a * H + c], scale[2]), base[2 * H + a * H + c]);
            mx = fmaxf(mx, C[a * H + c]);
        }
        float sum = 0;
        for (uint32_t c = 0; c < H; ++c) sum += (C[a * H + c] = exp_cr(C[a * H + c] - mx));
        for (uint32_t c = 0; c < H; ++c) C[a * H + c] = C[a * H + c] / sum + eps;
    }
    auto col_norm = [&] {
        for (uint32_t c = 0; c < H; ++c) {
            float sum = 0;
            for (uint32_t a = 0; a < H; ++a) sum += C[a * H + c];
            for (uint32_t a = 0; a < H; ++a) C[a * H + c] /= (sum + eps);
        }
    };
    auto row_norm = [&] {
        for (uint32_t a = 0; a < H; ++a) {
            float sum = 0;
            for (uint32_t c = 0; c < H; ++c) sum += C[a * H + c];
            for (uint32_t c = 0; c < H; ++c) C[a * H + c] /= (sum + eps);
        }
    };
    col_norm();
    for (uint32_t it = 1; it < iters; ++it) {
        row_norm();
        col_norm();
    }
}

// sinkhorn: also comb (warp 0); without it, comb is left to hc_sinkhorn_kernel, which the
// backend runs beside the sublayer (comb is needed only by hc_post, at its end).
__global__ void __launch_bounds__(1024) hc_pre_finish_kernel(const float* mix, const float* scale, const float* base, const float* X,
                                     uint32_t H, uint32_t E, float eps, uint32_t iters, float* post, float* comb,
                                     float* x_sub, const float* norm_w, float rms_eps, float* xn, bool sinkhorn) {
    pdl_begin();
    const uint32_t r = blockIdx.x, M = 2 * H + H * H;
    __shared__ float pre_s[16];
    const float* m = mix + uint64_t(r) * M;
    float* C = comb + r * H * H;
    // The gates first; then warp 0 runs Sinkhorn (comb) while the other warps form x_sub,
    // which needs only the pre gates.
    if (threadIdx.x < H) {
        const uint32_t i = threadIdx.x;
        pre_s[i] = sigmoid_cr(__fadd_rn(__fmul_rn(m[i], scale[0]), base[i])) + eps;
        post[r * H + i] = 2.0f * sigmoid_cr(__fadd_rn(__fmul_rn(m[H + i], scale[1]), base[H + i]));
    }
    __syncthreads();
    if (xn) {
        // Fused sublayer RMSNorm (E == 4 * blockDim, H * H <= 32): thread t forms x_sub
        // values 4t..4t+3 and the norm is rms_norm_vec_kernel's, operation for operation
        // (one float4 per thread, the same double sum and block reduction); x_sub is not stored.
        const float4* X4 = reinterpret_cast<const float4*>(X + uint64_t(r) * H * E);
        const uint32_t u = threadIdx.x;
        float4 v = make_float4(0, 0, 0, 0);
        for (uint32_t h = 0; h < H; ++h) {
            const float4 xv = X4[h * (E / 4) + u];
            const float ph = pre_s[h];
            v.x = __fadd_rn(v.x, __fmul_rn(ph, xv.x));
            v.y = __fadd_rn(v.y, __fmul_rn(ph, xv.y));
            v.z = __fadd_rn(v.z, __fmul_rn(ph, xv.z));
            v.w = __fadd_rn(v.w, __fmul_rn(ph, xv.w));
        }
        double ss = 0;
        ss += double(v.x) * double(v.x) + double(v.y) * double(v.y) + double(v.z) * double(v.z) +
              double(v.w) * double(v.w);
        ss = block_sum_d(ss);
        const float rr = float(1.0 / sqrt(ss / E + double(rms_eps)));
        const float4 g = norm_w ? reinterpret_cast<const float4*>(norm_w)[u] : make_float4(1, 1, 1, 1);
        reinterpret_cast<float4*>(xn + uint64_t(r) * E)[u] =
            make_float4(__fmul_rn(__fmul_rn(v.x, rr), g.x), __fmul_rn(__fmul_rn(v.y, rr), g.y),
                        __fmul_rn(__fmul_rn(v.z, rr), g.z), __fmul_rn(__fmul_rn(v.w, rr), g.w));
        if (sinkhorn && threadIdx.x < 32) sinkhorn_row(m, scale, base, H, eps, iters, C);
        return;
    }
    if (threadIdx.x >= 32) {
        const float* Xr = X + uint64_t(r) * H * E;
        for (uint32_t e = threadIdx.x - 32; e < E; e += blockDim.x - 32) {
            float acc = 0;
            for (uint32_t h = 0; h < H; ++h) acc = __fadd_rn(acc, __fmul_rn(pre_s[h], Xr[h * E + e]));
            x_sub[uint64_t(r) * E + e] = acc;
        }
    } else if (sinkhorn) {
        sinkhorn_row(m, scale, base, H, eps, iters, C);
    }
}

// ---- mHC pre spread over the GPU (decode's latency path) --------------------------------
// One token's pre step is ~1.6 MB of reads (the fn weight, the 16,384-wide state): a single
// block per row leaves the chip idle, so the work is split in two launches.
// hc_mix_kernel: block (b, y) takes the column quads [b*kHcQuads, (b+1)*kHcQuads) of every
// stream (4 values of each of the H streams per quad) for up to kHcRows rows, and forms per
// row the partial dot products fn[m]·X (all M mix rows) and the partial Gram matrix of the
// streams, G[h][h'] = Σ_e X[h][e]·X[h'][e]. The last block of the grid column to finish
// (counter) adds the partials in block order, so the result does not depend on which block
// finished when, and then:
//   the flat RMSNorm is folded into the product: mix = r·(fn·X), r = 1/sqrt(trace(G)/HD + eps);
//   the gates pre/post as hc_pre_finish_kernel forms them;
//   the sublayer norm's scale from the Gram: |x_sub|² = Σ_h Σ_h' pre[h]·pre[h']·G[h][h'].
// hc_collapse_norm_kernel is then elementwise: xn = (Σ_h pre[h]·X[h])·r_sub·norm_w.
// A row's arithmetic is fixed by (H, E) alone, never by R or by its place in a block, so
// prefill, decode and batched rows agree bit for bit. All sums are in double.
constexpr uint32_t kHcQuads = 16;   // column quads of a block
constexpr uint32_t kHcGroups = 8;   // thread groups sharing out a block's products
constexpr uint32_t kHcRows = 4;     // rows of a block at most: its fn slice is loaded once for them
constexpr uint32_t kHcThreads = kHcQuads * kHcGroups;
constexpr uint32_t kHcCollapseThreads = 64;

template <uint32_t H>
struct HcShape {
    static constexpr uint32_t M = 2 * H + H * H;        // mix rows
    static constexpr uint32_t NG = H * (H + 1) / 2;     // Gram entries h <= h'
    static constexpr uint32_t P = M + NG;               // partials per (row, block)
    static constexpr uint32_t MT = (M + kHcGroups - 1) / kHcGroups;   // mix rows per thread
    static constexpr uint32_t GT = (NG + kHcGroups - 1) / kHcGroups;  // Gram entries per thread
};

// Gram entry j <-> (h, h'), h <= h', row-major over the upper triangle.
__host__ __device__ constexpr uint32_t gram_index(uint32_t h, uint32_t h2, uint32_t H) {
    return h * H - h * (h - 1) / 2 + (h2 - h);
}
__device__ inline void gram_pair(uint32_t j, uint32_t H, uint32_t& h, uint32_t& h2) {
    h = 0;
    while (j >= H - h) j -= H - h++;
    h2 = h + j;
}

template <uint32_t WT>
__device__ __forceinline__ float4 load_quad(const uint8_t* row, uint64_t k) {
    if constexpr (WT == T_F32) {
        return reinterpret_cast<const float4*>(row)[k / 4];
    } else {
        const uint2 v = reinterpret_cast<const uint2*>(row)[k / 4];
        auto cv = [](uint16_t u) { return WT == T_F16 ? f16_to_f32(u) : bf16_to_f32(u); };
        return make_float4(cv(uint16_t(v.x & 0xFFFF)), cv(uint16_t(v.x >> 16)), cv(uint16_t(v.y & 0xFFFF)),
                           cv(uint16_t(v.y >> 16)));
    }
}

__device__ __forceinline__ double dot4_d(float4 a, float4 b, double acc) {
    acc = fma(double(a.x), double(b.x), acc);
    acc = fma(double(a.y), double(b.y), acc);
    acc = fma(double(a.z), double(b.z), acc);
    return fma(double(a.w), double(b.w), acc);
}

// Gram entry j's term of one column quad, x[h]·x[h'] (j past the entries: entry 0's, never
// stored). The streams of a runtime pair are picked by unrolled compares, so x stays in
// registers.
template <uint32_t H>
__device__ __forceinline__ double gram_quad(const float4 (&x)[H], uint32_t j) {
    uint32_t h = 0, h2 = 0;
    gram_pair(j < H * (H + 1) / 2 ? j : 0, H, h, h2);
    float4 xa = x[0], xb = x[0];
#pragma unroll
    for (uint32_t t = 1; t < H; ++t) {
        if (h == t) xa = x[t];
        if (h2 == t) xb = x[t];
    }
    return dot4_d(xa, xb, 0.0);
}

// mHC post (§5.5) of one value: stream j's new value from the H streams' values in[], the
// sublayer's output yv, the post gates po and comb C of the row. hc_post_kernel and the post
// folded into hc_mix_kernel both make it so.
__device__ __forceinline__ float hc_post_out(const float* in, uint32_t H, float yv, const float* po, const float* C,
                                             uint32_t j) {
    float acc = __fmul_rn(po[j], yv);
    for (uint32_t i = 0; i < H; ++i) acc = __fadd_rn(acc, __fmul_rn(C[i * H + j], in[i]));
    return acc;
}

// mHC post of column quad u (values 4u .. 4u+3 of every stream) of row r: x[] holds the H
// streams' quads on entry and their new values on return, from the sublayer's output pp.y, the
// routed experts' rows pp.moe_down (pp.K a row, summed in order; added to y unless !y_init) and
// the row's post gates and comb. Every load first, then the arithmetic: hc_post_out per
// component, so hc_post_vec_kernel, hc_mix_kernel and hc_mix_tile_kernel (the post folded into
// the mix) make the same bits.
template <uint32_t H>
__device__ __forceinline__ void hc_post_quad(float4 (&x)[H], const HcPostIn& pp, uint64_t r, uint32_t u, uint32_t E) {
    constexpr uint32_t kDownMax = 8;   // routed experts' rows loaded together (more: a loop)
    float4 yv4 = make_float4(0, 0, 0, 0), dn[kDownMax];
    if (pp.y) yv4 = reinterpret_cast<const float4*>(pp.y + r * E)[u];
#pragma unroll
    for (uint32_t k = 0; k < kDownMax; ++k)
        if (pp.moe_down && k < pp.K) dn[k] = reinterpret_cast<const float4*>(pp.moe_down + (r * pp.K + k) * E)[u];
    float po[H], C[H * H];
#pragma unroll
    for (uint32_t h = 0; h < H; ++h) po[h] = pp.post[r * H + h];
#pragma unroll
    for (uint32_t t = 0; t < H * H; ++t) C[t] = pp.comb[r * H * H + t];
    float yv[4] = {yv4.x, yv4.y, yv4.z, yv4.w};
    if (pp.moe_down) {
        float acc[4] = {0, 0, 0, 0};
        auto add = [&](float4 v) {
            acc[0] = __fadd_rn(acc[0], v.x), acc[1] = __fadd_rn(acc[1], v.y);
            acc[2] = __fadd_rn(acc[2], v.z), acc[3] = __fadd_rn(acc[3], v.w);
        };
#pragma unroll
        for (uint32_t k = 0; k < kDownMax; ++k)
            if (k < pp.K) add(dn[k]);
        for (uint32_t k = kDownMax; k < pp.K; ++k) add(reinterpret_cast<const float4*>(pp.moe_down + (r * pp.K + k) * E)[u]);
#pragma unroll
        for (uint32_t c = 0; c < 4; ++c) yv[c] = pp.y_init ? __fadd_rn(yv[c], acc[c]) : acc[c];
    }
    float in[4][H];   // [component][stream]
#pragma unroll
    for (uint32_t h = 0; h < H; ++h) in[0][h] = x[h].x, in[1][h] = x[h].y, in[2][h] = x[h].z, in[3][h] = x[h].w;
#pragma unroll
    for (uint32_t j = 0; j < H; ++j) {
        float o[4];
#pragma unroll
        for (uint32_t c = 0; c < 4; ++c) o[c] = hc_post_out(in[c], H, yv[c], po, C, j);
        x[j] = make_float4(o[0], o[1], o[2], o[3]);
    }
}

// The rows r0 .. r0+nr-1 from their partials (NB blocks of P each): the sums over the blocks in
// a fixed order, then the RMSNorm's scale, the mix, the gates and the sublayer norm's scale
// (hc_mix_kernel's last block of a grid column, or hc_mix_finish_kernel). Every thread of a
// block of kHcThreads or more calls it.
template <uint32_t H, uint32_t RB>
__device__ __forceinline__ void hc_mix_finish(const double* part, uint32_t r0, uint32_t nr, uint32_t NB,
                                              uint32_t E, const float* scale, const float* base, float hc_eps,
                                              float rms_eps, float* mix, float* post, float* gate) {
    using S = HcShape<H>;
    constexpr uint32_t M = S::M, P = S::P;
    const uint64_t HD = uint64_t(H) * E;
    // Each partial is summed over NS consecutive runs of blocks by NS threads (loads of a run
    // issued together: the sum is bound by L2 latency), then the runs in order. The split
    // depends on (H, E) only.
    constexpr uint32_t NS = kHcThreads / P > 0 ? kHcThreads / P : 1;
    __shared__ double sub[RB][P][NS], tot[RB][P];
    __shared__ float rx[RB], pre_s[RB][H];
    const uint32_t run = (NB + NS - 1) / NS;
    for (uint32_t t = threadIdx.x; t < nr * P * NS; t += blockDim.x) {
        const uint32_t i = t / (P * NS), p = t / NS % P, sr = t % NS;
        const double* pr = part + uint64_t(r0 + i) * NB * P + p;
        const uint32_t lo = sr * run, hi = min(NB, lo + run);
        double s = 0;
        // Batches of 24 loads: a whole run at E = 4096 (64 blocks, runs of 22). The batch size
        // does not change the sum (the blocks are added one by one in order; past hi, +0).
        constexpr uint32_t kBatch = 24;
        for (uint32_t b0 = lo; b0 < hi; b0 += kBatch) {
            double v[kBatch];
#pragma unroll
            for (uint32_t j = 0; j < kBatch; ++j) v[j] = b0 + j < hi ? __ldcg(pr + uint64_t(b0 + j) * P) : 0.0;
#pragma unroll
            for (uint32_t j = 0; j < kBatch; ++j) s += v[j];
        }
        sub[i][p][sr] = s;
    }
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < nr * P; t += blockDim.x) {
        const uint32_t i = t / P, p = t % P;
        double s = 0;
#pragma unroll
        for (uint32_t sr = 0; sr < NS; ++sr) s += sub[i][p][sr];
        tot[i][p] = s;
    }
    __syncthreads();
    if (threadIdx.x < nr) {
        const uint32_t i = threadIdx.x;
        double ss = 0;
#pragma unroll
        for (uint32_t h = 0; h < H; ++h) ss += tot[i][M + gram_index(h, h, H)];
        rx[i] = float(1.0 / sqrt(ss / double(HD) + double(rms_eps)));
    }
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < nr * M; t += blockDim.x) {
        const uint32_t i = t / M, m = t % M, r = r0 + i;
        const float v = float(tot[i][m] * double(rx[i]));
        mix[uint64_t(r) * M + m] = v;
        if (m < H) pre_s[i][m] = sigmoid_cr(__fadd_rn(__fmul_rn(v, scale[0]), base[m])) + hc_eps;
        else if (m < 2 * H) post[uint64_t(r) * H + m - H] = 2.0f * sigmoid_cr(__fadd_rn(__fmul_rn(v, scale[1]), base[m]));
    }
    __syncthreads();
    if (threadIdx.x < nr) {
        const uint32_t i = threadIdx.x;
        double ss = 0;
#pragma unroll
        for (uint32_t h = 0; h < H; ++h) {
            const double ph = pre_s[i][h];
            ss += ph * ph * tot[i][M + gram_index(h, h, H)];
#pragma unroll
            for (uint32_t h2 = h + 1; h2 < H; ++h2) ss += 2.0 * ph * double(pre_s[i][h2]) * tot[i][M + gram_index(h, h2, H)];
        }
        float* gr = gate + uint64_t(r0 + i) * (H + 1);
#pragma unroll
        for (uint32_t h = 0; h < H; ++h) gr[h] = pre_s[i][h];
        gr[H] = float(1.0 / sqrt(ss / double(E) + double(rms_eps)));
    }
}

// RB: rows of a block (1, 2 or kHcRows; registers grow with it: x and the sums are per row).
template <uint32_t H, uint32_t WT, uint32_t RB>
__global__ void __launch_bounds__(kHcThreads) hc_mix_kernel(const uint8_t* fn, uint64_t fn_row_bytes, const float* X,
                                                            uint32_t R, uint32_t E, const float* scale,
                                                            const float* base, float hc_eps, float rms_eps, float* mix,
                                                            float* post, float* gate, double* part, uint32_t* count,
                                                            bool early, HcPostIn pp) {
    pdl_launch();
    if (!early) pdl_wait();
    using S = HcShape<H>;
    constexpr uint32_t M = S::M, P = S::P;
    const uint32_t q = threadIdx.x % kHcQuads, g = threadIdx.x / kHcQuads;
    const uint32_t NB = gridDim.x, b = blockIdx.x;
    const uint32_t r0 = blockIdx.y * RB, nr = min(RB, R - r0);
    const uint32_t u = b * kHcQuads + q;  // this thread's quad: values 4u..4u+3 of every stream
    const bool have = u < E / 4;
    const uint64_t HD = uint64_t(H) * E;

    // This thread's fn values (mix rows g, g + kHcGroups, ...) and every row's X quads.
    float4 w[S::MT][H];
#pragma unroll
    for (uint32_t k = 0; k < S::MT; ++k) {
        const uint32_t m = g + k * kHcGroups;
#pragma unroll
        for (uint32_t h = 0; h < H; ++h)
            w[k][h] = have && m < M ? load_quad<WT>(fn + m * fn_row_bytes, uint64_t(h) * E + 4 * u)
                                    : make_float4(0, 0, 0, 0);
    }
    if (early) pdl_wait();   // fn is a weight (loaded above meanwhile); X is the previous kernel's
    float4 x[RB][H];
#pragma unroll
    for (uint32_t i = 0; i < RB; ++i)
#pragma unroll
        for (uint32_t h = 0; h < H; ++h)
            x[i][h] = have && i < nr ? reinterpret_cast<const float4*>(X + (r0 + i) * HD + uint64_t(h) * E)[u]
                                     : make_float4(0, 0, 0, 0);
    if (pp.active && have) {
        // the previous sublayer's hc_post on these quads (hc_post_kernel's operations, per
        // component); every group forms it, group 0 writes it
#pragma unroll
        for (uint32_t i = 0; i < RB; ++i) {
            if (i >= nr) break;
            hc_post_quad<H>(x[i], pp, r0 + i, u, E);   // (the stores of X wait for the barrier below)
        }
    }
    if (pp.active) {
        // Every group of the block read these X quads above and group 0 overwrites them: the
        // barrier keeps its stores behind the other warps' loads. (Without it, a warp whose
        // load of X was still unserved when warp 0 stored would read the new X and apply the
        // post twice: a candidate for run 106's intermittent decode difference, not reproduced
        // since either way; NOTES, twenty-first round.)
        __syncthreads();
        if (g == 0 && have)
#pragma unroll
            for (uint32_t i = 0; i < RB; ++i)
                if (i < nr)
#pragma unroll
                    for (uint32_t j = 0; j < H; ++j)
                        reinterpret_cast<float4*>(const_cast<float*>(X) + (r0 + i) * HD + uint64_t(j) * E)[u] =
                            x[i][j];
    }

    double dm[RB][S::MT], dg[RB][S::GT];
#pragma unroll
    for (uint32_t i = 0; i < RB; ++i) {
        if (i >= nr) break;
#pragma unroll
        for (uint32_t k = 0; k < S::MT; ++k) {
            double a = 0;
#pragma unroll
            for (uint32_t h = 0; h < H; ++h) a = dot4_d(w[k][h], x[i][h], a);
            dm[i][k] = a;
        }
#pragma unroll
        for (uint32_t k = 0; k < S::GT; ++k) dg[i][k] = gram_quad<H>(x[i], g + k * kHcGroups);
    }
    // Sum over the block's quads (the 16 lanes of a half-warp), a fixed butterfly.
#pragma unroll
    for (uint32_t i = 0; i < RB; ++i) {
        if (i >= nr) break;   // nr is the same for the whole block: no lane leaves a shuffle
#pragma unroll
        for (uint32_t k = 0; k < S::MT; ++k)
            for (int o = kHcQuads / 2; o > 0; o >>= 1) dm[i][k] += __shfl_xor_sync(0xffffffffu, dm[i][k], o);
#pragma unroll
        for (uint32_t k = 0; k < S::GT; ++k)
            for (int o = kHcQuads / 2; o > 0; o >>= 1) dg[i][k] += __shfl_xor_sync(0xffffffffu, dg[i][k], o);
    }
    if (q == 0) {
#pragma unroll
        for (uint32_t i = 0; i < RB; ++i) {
            if (i >= nr) break;
            double* pr = part + (uint64_t(r0 + i) * NB + b) * P;
#pragma unroll
            for (uint32_t k = 0; k < S::MT; ++k)
                if (g + k * kHcGroups < M) pr[g + k * kHcGroups] = dm[i][k];
#pragma unroll
            for (uint32_t k = 0; k < S::GT; ++k)
                if (g + k * kHcGroups < S::NG) pr[M + g + k * kHcGroups] = dg[i][k];
        }
    }

    // The last block of this grid column finishes the rows.
    if (!last_block_done(&count[blockIdx.y], NB)) return;
    hc_mix_finish<H, RB>(part, r0, nr, NB, E, scale, base, hc_eps, rms_eps, mix, post, gate);
}

// hc_mix_tile_kernel (prefill: rounds of kHcTileRows rows or more without a folded post):
// hc_mix_kernel's partials, the same bits, for kHcTileRows rows a block. hc_mix_kernel loads a
// block's fn slice (24 KB) for at most 4 rows and adds its 16 quads by a half-warp butterfly,
// half its instructions shuffles: ~0.59 ms a 2,048-row call on the H200, about 10x the FP64
// rate. Here a block stages its fn slice (as doubles) and 32 rows' column quads in shared
// memory, a lane takes a row and a warp two of its quads, and the block adds the 16 quads in
// the butterfly's tree: lane 0 of the xor 8, 4, 2, 1 butterfly ends with
//   ((a0+a8) + (a4+a12)) + ((a2+a10) + (a6+a14))  +  ((a1+a9) + (a5+a13)) + ((a3+a11) + (a7+a15))
// (each addition's operands in either order: IEEE addition commutes), with a_q the quad's
// chain over the streams from 0 as there. The sums over blocks and the rest are hc_mix_finish
// in hc_mix_finish_kernel. Operands are converted to doubles once a block: converting them
// for every product (each fn value once for each of 32 rows, each x value once for each of 8
// warps) bound the kernel by the F2F rate (16 a clock an SM, a quarter of the FP64 FMA rate):
// 501 us a 2,048-row call (run 75), 281 with fn converted once (run 76).
constexpr uint32_t kHcTileRows = 32;                      // = warp width: a lane per row
constexpr uint32_t kHcTileThreads = 256;
constexpr uint32_t kHcTileWarps = kHcTileThreads / 32;   // warp w: quads w and w + 8
static_assert(kHcTileWarps == 8 && kHcQuads == 16, "hc tile layout");

template <uint32_t H>
constexpr size_t hc_tile_smem() {   // fn slice [M][H][16] as doubles + rows [32][H·16 + 1] (the pad: lanes on distinct banks)
    return size_t(HcShape<H>::M) * H * kHcQuads * 4 * sizeof(double) +
           size_t(kHcTileRows) * (H * kHcQuads + 1) * sizeof(float4);
}

// dot4_d with both operands already doubles (the same fmas in the same order).
__device__ __forceinline__ double dot4_dd(const double2* a, const double (&b)[4], double acc) {
    const double2 lo = a[0], hi = a[1];
    acc = fma(lo.x, b[0], acc);
    acc = fma(lo.y, b[1], acc);
    acc = fma(hi.x, b[2], acc);
    return fma(hi.y, b[3], acc);
}
// The same in floats (the fast form's: fn's quad one float4 at a).
__device__ __forceinline__ float dot4_dd(const double2* a, const float (&b)[4], float acc) {
    const float4 w = *reinterpret_cast<const float4*>(a);
    acc = fmaf(w.x, b[0], acc);
    acc = fmaf(w.y, b[1], acc);
    acc = fmaf(w.z, b[2], acc);
    return fmaf(w.w, b[3], acc);
}

// A = float (fast prompt rounds: fast_prefill_round, DSV4_HC_FAST): the products and the
// block's sums in FP32 instead of the CPU's doubles (no conversions, twice the FMA rate; other
// bits); the partials still go out as doubles, so hc_mix_finish is the same. fn's quads keep the
// doubles' layout (a float quad in the first half of its two double2).
// pp.active: the previous sublayer's mHC post folded in (hc_mix_tile_folds_post): a thread takes
// a row's column quad of every stream as it stages them, applies the post (hc_post_quad, the
// same bits as hc_post_vec_kernel) and stores the new X; the block's quads are its own, so no
// other block reads them. One pass over X fewer than hc_post then the mix.
template <uint32_t H, uint32_t WT, typename A = double>
__global__ void __launch_bounds__(kHcTileThreads, 2) hc_mix_tile_kernel(const uint8_t* fn, uint64_t fn_row_bytes,
                                                                        const float* X, uint32_t R, uint32_t E,
                                                                        double* part, HcPostIn pp) {
    pdl_launch();
    using S = HcShape<H>;
    constexpr uint32_t M = S::M, P = S::P, NQ = H * kHcQuads, XS = NQ + 1;
    extern __shared__ double2 hct_s[];
    double2* fn_s = hct_s;                                          // [m][h][q] as 2 double2
    float4* x_s = reinterpret_cast<float4*>(hct_s + 2 * M * NQ);    // [row][h][q], rows XS apart
    const uint32_t NB = gridDim.x, b = blockIdx.x, r0 = blockIdx.y * kHcTileRows, nq = E / 4;
    const uint64_t HD = uint64_t(H) * E;
    const float4 zero = make_float4(0, 0, 0, 0);
    for (uint32_t t = threadIdx.x; t < M * NQ; t += kHcTileThreads) {   // a weight: before the wait
        const uint32_t m = t / NQ, h = t / kHcQuads % H, u = b * kHcQuads + t % kHcQuads;
        const float4 v = u < nq ? load_quad<WT>(fn + m * fn_row_bytes, uint64_t(h) * E + 4 * u) : zero;
        if constexpr (std::is_same_v<A, float>) {
            *reinterpret_cast<float4*>(fn_s + 2 * t) = v;
        } else {
            fn_s[2 * t] = make_double2(v.x, v.y);
            fn_s[2 * t + 1] = make_double2(v.z, v.w);
        }
    }
    pdl_wait();
    if (pp.active) {
        for (uint32_t t = threadIdx.x; t < kHcTileRows * kHcQuads; t += kHcTileThreads) {
            const uint32_t i = t / kHcQuads, q = t % kHcQuads, u = b * kHcQuads + q;
            float4 x[H];
            if (r0 + i < R && u < nq) {
                float4* Xr = reinterpret_cast<float4*>(const_cast<float*>(X) + (r0 + i) * HD);
#pragma unroll
                for (uint32_t h = 0; h < H; ++h) x[h] = Xr[h * nq + u];
                hc_post_quad<H>(x, pp, r0 + i, u, E);
#pragma unroll
                for (uint32_t h = 0; h < H; ++h) Xr[h * nq + u] = x[h];
            } else {
#pragma unroll
                for (uint32_t h = 0; h < H; ++h) x[h] = zero;
            }
#pragma unroll
            for (uint32_t h = 0; h < H; ++h) x_s[i * XS + h * kHcQuads + q] = x[h];
        }
    } else {
        for (uint32_t t = threadIdx.x; t < kHcTileRows * NQ; t += kHcTileThreads) {
            const uint32_t i = t / NQ, h = t / kHcQuads % H, u = b * kHcQuads + t % kHcQuads;
            x_s[i * XS + t % NQ] =
                r0 + i < R && u < nq ? reinterpret_cast<const float4*>(X + (r0 + i) * HD + uint64_t(h) * E)[u] : zero;
        }
    }
    __syncthreads();

    // Warp w takes quads w and w + 8 of its lane's row (each x value converted to double once a
    // block), forms all P products of both (a quad's chain over the streams from 0, as
    // hc_mix_kernel), and adds the two: the butterfly's first level, a_q + a_{q+8}.
    const uint32_t i = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float4* xr = x_s + i * XS;
    A sum[P];
#pragma unroll
    for (uint32_t hq = 0; hq < 2; ++hq) {
        const uint32_t q = w + 8 * hq;
        A x[H][4];
#pragma unroll
        for (uint32_t h = 0; h < H; ++h) {
            const float4 v = xr[h * kHcQuads + q];
            x[h][0] = v.x, x[h][1] = v.y, x[h][2] = v.z, x[h][3] = v.w;
        }
#pragma unroll
        for (uint32_t m = 0; m < M; ++m) {
            A a = 0;
#pragma unroll
            for (uint32_t h = 0; h < H; ++h) a = dot4_dd(fn_s + 2 * ((m * H + h) * kHcQuads + q), x[h], a);
            sum[m] = hq ? sum[m] + a : a;
        }
#pragma unroll
        for (uint32_t h = 0; h < H; ++h)
#pragma unroll
            for (uint32_t h2 = h; h2 < H; ++h2) {   // gram_quad's product x[h]·x[h2]
                A a = 0;
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) a = fma(x[h][e], x[h2][e], a);
                const uint32_t j = M + gram_index(h, h2, H);
                sum[j] = hq ? sum[j] + a : a;
            }
    }
    // The rest of the butterfly across the warps, through shared memory (fn_s and x_s are free
    // once every warp is done): s_w = a_w + a_{w+8}, and lane 0 of the xor 8, 4, 2, 1 butterfly
    // ends with ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). Rows 33 doubles apart: the
    // final pass's lanes (consecutive products) fall on distinct bank pairs.
    constexpr uint32_t RS = kHcTileRows + 1;
    static_assert(size_t(kHcTileWarps) * P * RS * sizeof(double) <= hc_tile_smem<H>(), "hc tile reduction space");
    A* red = reinterpret_cast<A*>(hct_s);   // [warp][product][row]
    __syncthreads();
#pragma unroll
    for (uint32_t p = 0; p < P; ++p) red[(w * P + p) * RS + i] = sum[p];
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < kHcTileRows * P; t += kHcTileThreads) {
        const uint32_t r = t / P, p = t % P;
        auto sv = [&](uint32_t ww) { return red[(ww * P + p) * RS + r]; };
        const A tot = ((sv(0) + sv(4)) + (sv(2) + sv(6))) + ((sv(1) + sv(5)) + (sv(3) + sv(7)));
        if (r0 + r < R) part[(uint64_t(r0 + r) * NB + b) * P + p] = double(tot);
    }
}

// The rows of hc_mix_tile_kernel's partials, kHcRows a block of kHcThreads.
template <uint32_t H>
__global__ void __launch_bounds__(kHcThreads) hc_mix_finish_kernel(const double* part, uint32_t R, uint32_t NB,
                                                                   uint32_t E, const float* scale, const float* base,
                                                                   float hc_eps, float rms_eps, float* mix,
                                                                   float* post, float* gate) {
    pdl_begin();
    const uint32_t r0 = blockIdx.x * kHcRows;
    hc_mix_finish<H, kHcRows>(part, r0, min(kHcRows, R - r0), NB, E, scale, base, hc_eps, rms_eps, mix, post, gate);
}

// xn = x_sub·r_sub·norm_w, x_sub = Σ_h pre[h]·X[h] formed as hc_pre_finish_kernel forms it.
template <uint32_t H>
__global__ void __launch_bounds__(kHcCollapseThreads) hc_collapse_norm_kernel(const float* X, const float* gate,
                                                                             const float* norm_w, uint32_t E,
                                                                             float* xn, HcQuant qa) {
    pdl_begin();
    const uint32_t r = blockIdx.y, u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= E / 4) return;
    const float* gr = gate + uint64_t(r) * (H + 1);
    const float4* X4 = reinterpret_cast<const float4*>(X + uint64_t(r) * H * E);
    float4 xv[H];
#pragma unroll
    for (uint32_t h = 0; h < H; ++h) xv[h] = X4[h * (E / 4) + u];
    const float4 gw = norm_w ? reinterpret_cast<const float4*>(norm_w)[u] : make_float4(1, 1, 1, 1);
    float4 v = make_float4(0, 0, 0, 0);
#pragma unroll
    for (uint32_t h = 0; h < H; ++h) {
        const float ph = gr[h];
        v.x = __fadd_rn(v.x, __fmul_rn(ph, xv[h].x));
        v.y = __fadd_rn(v.y, __fmul_rn(ph, xv[h].y));
        v.z = __fadd_rn(v.z, __fmul_rn(ph, xv[h].z));
        v.w = __fadd_rn(v.w, __fmul_rn(ph, xv[h].w));
    }
    const float rr = gr[H];
    const float o[4] = {__fmul_rn(__fmul_rn(v.x, rr), gw.x), __fmul_rn(__fmul_rn(v.y, rr), gw.y),
                        __fmul_rn(__fmul_rn(v.z, rr), gw.z), __fmul_rn(__fmul_rn(v.w, rr), gw.w)};
    reinterpret_cast<float4*>(xn + uint64_t(r) * E)[u] = make_float4(o[0], o[1], o[2], o[3]);
    if (qa.h) {   // xn as FP16 by its bound's factor (the fast round's cuBLAS products)
        const float f = f16_factor(*qa.h_top, 1.0f);
        const __half2 a = __floats2half2_rn(o[0] * f, o[1] * f), b = __floats2half2_rn(o[2] * f, o[3] * f);
        reinterpret_cast<uint2*>(qa.h + uint64_t(r) * E)[u] =
            make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    }
    // The next products' activation codes, as quantize_act makes them from xn, bit for bit
    // (a launch and a read of xn fewer on the critical path).
    const uint32_t lane = threadIdx.x & 31;
    if (qa.q0) {
        // Q8_0: 32 values = 8 threads; the max of magnitudes is exact in any order
        float am = fmaxf(fmaxf(fabsf(o[0]), fabsf(o[1])), fmaxf(fabsf(o[2]), fabsf(o[3])));
        for (int x = 1; x < 8; x <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, x));
        const float dd = am / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        char4 c;
        c.x = q_clamp(o[0] * id);
        c.y = q_clamp(o[1] * id);
        c.z = q_clamp(o[2] * id);
        c.w = q_clamp(o[3] * id);
        reinterpret_cast<char4*>(qa.q0 + uint64_t(r) * E)[u] = c;
        if ((lane & 7) == 0) qa.d0[uint64_t(r) * (E / 32) + u / 8] = f16_round(dd);
    }
    if (qa.qk) {
        // Q8_K: 256 values = this block of 64 threads. The scale's sign is that of the first
        // value of the largest magnitude (lowest index on ties), as quant_q8_k_kernel picks it.
        float amax = 0.0f, mx = 0.0f;
        for (int t = 0; t < 4; ++t)
            if (fabsf(o[t]) > amax) {
                amax = fabsf(o[t]);
                mx = o[t];
            }
        uint32_t who = threadIdx.x;
        auto take = [&](float oa, float om, uint32_t ow) {
            if (oa > amax || (oa == amax && ow < who)) {
                amax = oa;
                mx = om;
                who = ow;
            }
        };
        for (int x = 16; x > 0; x >>= 1)
            take(__shfl_xor_sync(0xffffffffu, amax, x), __shfl_xor_sync(0xffffffffu, mx, x),
                 __shfl_xor_sync(0xffffffffu, who, x));
        __shared__ float s_am[2], s_mx[2];
        __shared__ uint32_t s_who[2];
        if (lane == 0) {
            s_am[threadIdx.x >> 5] = amax;
            s_mx[threadIdx.x >> 5] = mx;
            s_who[threadIdx.x >> 5] = who;
        }
        __syncthreads();
        const uint32_t other = (threadIdx.x >> 5) ^ 1;
        take(s_am[other], s_mx[other], s_who[other]);
        const uint64_t sb = uint64_t(r) * (E / 256) + blockIdx.x;
        int8_t* qb = qa.qk + uint64_t(r) * E + 4 * u;
        int sm = 0;
        if (amax == 0.0f) {
            for (int t = 0; t < 4; ++t) qb[t] = 0;
        } else {
            const float iscale = -127.0f / mx;
            char4 c;
            c.x = q_clamp(iscale * o[0]);
            c.y = q_clamp(iscale * o[1]);
            c.z = q_clamp(iscale * o[2]);
            c.w = q_clamp(iscale * o[3]);
            *reinterpret_cast<char4*>(qb) = c;
            sm = int(c.x) + int(c.y) + int(c.z) + int(c.w);
            if (threadIdx.x == 0) qa.dk[sb] = 1.0f / iscale;
        }
        if (amax == 0.0f && threadIdx.x == 0) qa.dk[sb] = 0.0f;
        sm += __shfl_xor_sync(0xffffffffu, sm, 1);
        sm += __shfl_xor_sync(0xffffffffu, sm, 2);
        if ((threadIdx.x & 3) == 0) qa.bk[uint64_t(r) * (E / 16) + u / 4] = sm;
    }
}

__global__ void hc_sinkhorn_kernel(const float* mix, const float* scale, const float* base, uint32_t H, float eps,
                                   uint32_t iters, float* comb) {
    pdl_begin();
    const uint32_t r = blockIdx.x;
    sinkhorn_row(mix + uint64_t(r) * (2 * H + H * H), scale, base, H, eps, iters, comb + r * H * H);
}

// With moe_down: the sublayer output is first y = (y_init ? y : 0) + the K routed experts'
// outputs of the row, added in expert-slot order (the MoE combine, folded in here).
__global__ void hc_post_kernel(float* X, const float* y, const float* post, const float* comb, uint32_t H,
                               uint32_t E, const float* moe_down, uint32_t K, bool y_init) {
    pdl_begin();
    const uint32_t r = blockIdx.y;
    const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    float* Xr = X + uint64_t(r) * H * E;
    const float* po = post + r * H;
    const float* C = comb + r * H * H;
    float in[16];
    for (uint32_t i = 0; i < H; ++i) in[i] = Xr[i * E + e];
    float yv = y ? y[uint64_t(r) * E + e] : 0.0f;
    if (moe_down) {
        float acc = 0;
        for (uint32_t k = 0; k < K; ++k) acc = __fadd_rn(acc, moe_down[(uint64_t(r) * K + k) * E + e]);
        yv = y_init ? __fadd_rn(yv, acc) : acc;
    }
    for (uint32_t j = 0; j < H; ++j) Xr[j * E + e] = hc_post_out(in, H, yv, po, C, j);
}

// hc_post_kernel for a constant H (the Flash model's 4 streams) and 4 values a thread: the
// streams' values, gates and comb in registers (the runtime-H kernel keeps its in[16] on the
// stack, 64 bytes a thread) and 16-byte loads and stores; the same operations on every value in
// the same order, so the same bits. (Run 170: hc_post_kernel 190 us a 2,048-row call, ~2.1 TB/s.)
template <uint32_t H>
__global__ void __launch_bounds__(256) hc_post_vec_kernel(float* X, HcPostIn pp, uint32_t E) {
    pdl_begin();
    const uint32_t r = blockIdx.y, q = blockIdx.x * blockDim.x + threadIdx.x, nq = E / 4;
    if (q >= nq) return;
    float4* Xr = reinterpret_cast<float4*>(X + uint64_t(r) * H * E);
    float4 x[H];
#pragma unroll
    for (uint32_t i = 0; i < H; ++i) x[i] = Xr[i * nq + q];
    hc_post_quad<H>(x, pp, r, q, E);
#pragma unroll
    for (uint32_t j = 0; j < H; ++j) Xr[j * nq + q] = x[j];
}

// ---- greedy decoding on the device -----------------------------------------------------------
// A greedy step needs one id, not the 129,280 logits: formed here, only the id crosses to the
// host (run 92, 43 layers: decode 164.9 / 164.8 tok/s against 155.2 / 154.7 with the logits
// downloaded and scanned on the host; the head's part of a step 0.158 against 0.250 ms). The id is argmax_excluding's (sampler.cpp): the largest logit, the first of equal
// ones, NaN never, the excluded id never. Each candidate becomes a 64-bit key, the logit's bits
// made unsigned-orderable (-0 as +0: the host's '>' does not tell them apart) above the id's
// complement, so the largest key is the answer and partial results combine by max in any order.
// Key 0 (no candidate: only NaNs or the excluded id) takes the host's fallback, the first id
// not excluded.
__device__ __forceinline__ uint64_t greedy_key(float v, uint32_t id) {
    const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
    const uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (uint64_t(o) << 32) | uint32_t(~id);
}

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        const uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Block (b, r): slice b of logits row r -> part[r][b].
__global__ void __launch_bounds__(256) greedy_part_kernel(const float* logits, uint32_t V, const int32_t* exclude,
                                                          uint64_t* part) {
    pdl_begin();
    const uint32_t r = blockIdx.y, per = (V + gridDim.x - 1) / gridDim.x;
    const uint32_t lo = blockIdx.x * per, hi = min(V, lo + per);
    const float* L = logits + uint64_t(r) * V;
    const uint32_t ex = uint32_t(exclude[r]);   // -1: no id
    uint64_t best = 0;
    for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = L[i];
        if (v != v || i == ex) continue;
        const uint64_t k = greedy_key(v, i);
        best = k > best ? k : best;
    }
    __shared__ uint64_t wb[8];
    best = warp_max_u64(best);
    if ((threadIdx.x & 31) == 0) wb[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x < 32) {
        best = warp_max_u64(threadIdx.x < blockDim.x / 32 ? wb[threadIdx.x] : 0);
        if (threadIdx.x == 0) part[uint64_t(r) * gridDim.x + blockIdx.x] = best;
    }
}

__global__ void greedy_final_kernel(const uint64_t* part, uint32_t nb, uint32_t V, const int32_t* exclude,
                                    int32_t* out) {
    pdl_begin();
    const uint32_t r = blockIdx.x;
    uint64_t best = 0;
    for (uint32_t i = threadIdx.x; i < nb; i += 32) {
        const uint64_t k = part[uint64_t(r) * nb + i];
        best = k > best ? k : best;
    }
    best = warp_max_u64(best);
    if (threadIdx.x != 0) return;
    if (best) {
        out[r] = int32_t(~uint32_t(best));
    } else {
        const int32_t first = exclude[r] == 0 ? 1 : 0;
        out[r] = uint32_t(first) < V ? first : -1;
    }
}

__global__ void __launch_bounds__(1024) output_collapse_kernel(const float* pre, const float* scale, const float* base, const float* X,
                                       const uint32_t* want, uint32_t H, uint32_t E, float eps, float* x) {
    pdl_begin();
    const uint32_t i = blockIdx.x;
    __shared__ float wgt[16];
    if (threadIdx.x < H)
        wgt[threadIdx.x] =
            sigmoid_cr(__fadd_rn(__fmul_rn(pre[i * H + threadIdx.x], scale[0]), base[threadIdx.x])) + eps;
    __syncthreads();
    const float* Xr = X + uint64_t(want[i]) * H * E;
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
        float acc = 0;
        for (uint32_t h = 0; h < H; ++h) acc = __fadd_rn(acc, __fmul_rn(wgt[h], Xr[h * E + e]));
        x[uint64_t(i) * E + e] = acc;
    }
}

__global__ void gather_rows_kernel(const float* X, uint64_t n, const uint32_t* want, float* dst) {
    pdl_begin();
    const uint32_t i = blockIdx.y;
    for (uint64_t k = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += uint64_t(gridDim.x) * blockDim.x)
        dst[uint64_t(i) * n + k] = X[uint64_t(want[i]) * n + k];
}

__global__ void head_norm_rope_kernel(float* q, uint32_t n_head, uint32_t D, uint32_t n_rot, float eps, bool norm,
                                      bool inverse, const double* inv_freq, const DevRow* rows) {
    pdl_begin();
    const uint32_t r = blockIdx.x / n_head;
    float* qh = q + uint64_t(blockIdx.x) * D;
    if (n_rot / 2 > blockDim.x) {
        if (norm) rms_norm_block(qh, qh, D, eps, nullptr);
        rope_block(qh, D, n_rot, rows[r].pos, inv_freq, inverse);
        return;
    }
    // The angle's double cos and sin (long dependent chains) first, so their latency runs
    // under the norm's loads and reduction; then rope_block's operations on the values.
    const uint32_t i = threadIdx.x;
    float c = 0.0f, sn = 0.0f;
    if (i < n_rot / 2) {
        const double th = double(rows[r].pos) * inv_freq[i];
        c = float(cos(th));
        sn = inverse ? -float(sin(th)) : float(sin(th));
    }
    if (norm) rms_norm_block(qh, qh, D, eps, nullptr);
    if (i < n_rot / 2) {
        float* t = qh + (D - n_rot);
        const float x0 = t[2 * i], x1 = t[2 * i + 1];
        t[2 * i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        t[2 * i + 1] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
}

// head_norm_rope_kernel with the head in registers (VPT values a thread, D = VPT *
// blockDim.x, the RoPE tail within the last VPT slot: n_rot <= blockDim.x): one round of loads
// instead of the norm's two walks and the rotation's reads of what the norm just wrote. The
// sum of squares takes each thread's terms in rms_norm_block's order, and the rotation is
// rope_block's on the pair (t, t ^ 1) exchanged by a shuffle. Same bits.
// early (DSV4_ATTN_EARLY): the rotation's angle (rows are uploaded before the step's kernels)
// is made before the programmatic-launch wait, beside the kernel before; the same values.
template <uint32_t VPT>
__global__ void head_norm_rope_reg_kernel(float* q, uint32_t D, uint32_t n_rot, float eps, bool norm, bool inverse,
                                          const double* inv_freq, const DevRow* rows, uint32_t n_head, bool early) {
    pdl_launch();
    if (!early) pdl_wait();
    const uint32_t r = blockIdx.x / n_head, bd = blockDim.x, t = threadIdx.x;
    // this thread's tail value: pair i, even (x0) or odd (x1) member
    const uint32_t e = t + (VPT - 1) * bd, tail0 = D - n_rot;
    const bool in_tail = e >= tail0;
    float c = 0.0f, sn = 0.0f;
    if (in_tail) rope_angle(rows[r].pos, inv_freq, (e - tail0) / 2, inverse, c, sn);
    if (early) pdl_wait();
    float* qh = q + uint64_t(blockIdx.x) * D;
    float v[VPT];
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j) v[j] = qh[t + j * bd];
    if (norm) {
        const float rr = rms_scale_reg<VPT>(v, D, eps);
#pragma unroll
        for (uint32_t j = 0; j < VPT; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], rr), 1.0f);   // (rms_norm_block's unit weight)
    }
    const float other = __shfl_xor_sync(0xffffffffu, v[VPT - 1], 1);
    if (in_tail) {
        const bool odd = (e - tail0) & 1;
        const float x0 = odd ? other : v[VPT - 1], x1 = odd ? v[VPT - 1] : other;
        v[VPT - 1] = odd ? __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)) : __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
    }
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j) qh[t + j * bd] = v[j];
}

__global__ void kv_finalize_kernel(float* kvr, uint32_t D, uint32_t n_rot, float eps, const float* norm_w,
                                   const double* inv_freq, const DevRow* rows, bool official, uint32_t n_nope,
                                   const DevLayerKV* lkv, uint32_t n_layer, uint32_t il) {
    pdl_begin();
    const uint32_t r = blockIdx.x;
    float* x = kvr + uint64_t(r) * D;
    rms_norm_block(x, x, D, eps, norm_w);
    rope_block(x, D, n_rot, rows[r].pos, inv_freq, false);
    if (official) {
        sim_block(x, n_nope, 64, true);
        for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) x[i] = f16_round(x[i]);
        __syncthreads();
    }
    const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
    float* dst = L.raw + uint64_t(rows[r].pos % L.raw_cap) * D;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) dst[i] = x[i];
}

// The candidates' softmax-weighted value (§5.9's pooling): the max first, then the sums in
// candidate order; compressor_state_kernel and compressor_pool_kernel both pool with it.
template <typename Cand>
__device__ __forceinline__ float compressor_pool_value(uint32_t nc, Cand cand) {
    float mx = kNegInf;
    for (uint32_t k = 0; k < nc; ++k) {
        float v, sc;
        cand(k, v, sc);
        mx = fmaxf(mx, sc);
    }
    float den = 0, num = 0;
    if (mx > kNegInf * 0.5f)
        for (uint32_t k = 0; k < nc; ++k) {
            float v, sc;
            cand(k, v, sc);
            if (sc <= kNegInf * 0.5f) continue;
            const float ex = exp_cr(sc - mx);
            den = __fadd_rn(den, ex);
            num = __fadd_rn(num, __fmul_rn(ex, v));
        }
    return den > 0 ? num / den : 0.0f;
}

// One thread per pooled dimension d of one session: the per-token state machine over the
// session's rows of this batch (columns d and, for ratio 4, D+d are this thread's alone).
__global__ void compressor_state_kernel(const float* kvp, const float* scp, const float* ape, const DevRow* rows,
                                        const uint32_t* sess_begin, const uint32_t* sess_end, uint32_t ratio,
                                        uint32_t D, bool indexer, const DevLayerKV* lkv, uint32_t n_layer,
                                        uint32_t il, float* pooled) {
    pdl_begin();
    const uint32_t s = blockIdx.y;
    const uint32_t d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    const uint32_t b = sess_begin[s], e = sess_end[s];
    if (b >= e) return;
    const DevLayerKV& L = lkv[uint64_t(rows[b].sess) * n_layer + il];
    float* skv = indexer ? L.iskv : L.skv;
    float* ssc = indexer ? L.issc : L.ssc;
    const uint32_t coff = ratio == 4 ? 2 : 1, width = coff * D;
    for (uint32_t r = b; r < e; ++r) {
        const int64_t pos = rows[r].pos;
        const uint32_t ph = uint32_t(pos % ratio);
        const uint32_t slot = ratio == 4 ? 4 + ph : ph;
        for (uint32_t k = 0; k < coff; ++k) {
            const uint32_t col = d + k * D;
            skv[uint64_t(slot) * width + col] = kvp[uint64_t(r) * width + col];
            ssc[uint64_t(slot) * width + col] = scp[uint64_t(r) * width + col] + ape[uint64_t(ph) * width + col];
        }
        if ((pos + 1) % ratio != 0) continue;
        const uint32_t nc = ratio == 4 ? 8 : ratio;
        pooled[uint64_t(r) * D + d] = compressor_pool_value(nc, [&](uint32_t k, float& v, float& sc) {
            const uint64_t off = uint64_t(k) * width + (ratio == 4 && k >= 4 ? D + d : d);
            v = skv[off];
            sc = ssc[off];
        });
        if (ratio == 4)
            for (uint32_t k = 0; k < 4; ++k)
                for (uint32_t h = 0; h < 2; ++h) {
                    const uint32_t col = d + h * D;
                    skv[uint64_t(k) * width + col] = skv[uint64_t(k + 4) * width + col];
                    ssc[uint64_t(k) * width + col] = ssc[uint64_t(k + 4) * width + col];
                }
    }
}

// ---- the compressor state machine, parallel over groups (DSV4_CMP_PAR, on by default) ----
// compressor_state_kernel walks a session's rows one after another. Every complete group's
// pooled row depends only on its candidates, so compressor_pool_kernel computes them all at
// once (one block per (group, column chunk)), and compressor_tail_kernel then leaves in each
// state slot what the walk would have left; it is launched after the pool kernel, which reads
// the slots as the previous call left them.
//
// Where the walk finds the value of position q when it emits the group ending at position pe:
// q in this batch (q >= p0, the session's first position here): the row's projection, its
// score plus the ape bias of its phase, as the walk stores them. Otherwise the slot written in
// an earlier call: for ratio 4 the current group's rows are in slots 4..7; the previous
// group's rows are in slots 0..3 when that group was emitted in an earlier call (pe - 4 < p0),
// else still in slots 4..7 (its emission, in this batch, has not copied them yet when it reads
// them; no row of this batch before pe - 4 shares their phase). Other ratios: slot q % ratio.

// Block x: the x-th complete group of the batch, sessions in order (a session's rows are
// consecutive positions, so its groups are the rows pe with (pe + 1) % ratio == 0); blocks past
// the last group return. Block y: a chunk of blockDim.x pooled columns.
template <bool kOverlap>
__global__ void compressor_pool_kernel(const float* kvp, const float* scp, const float* ape, const DevRow* rows,
                                       const uint32_t* sess_begin, const uint32_t* sess_end, uint32_t S,
                                       uint32_t ratio, uint32_t D, bool indexer, const DevLayerKV* lkv,
                                       uint32_t n_layer, uint32_t il, float* pooled) {
    pdl_begin();
    const uint32_t d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= D) return;
    uint64_t gi = blockIdx.x, g = 0;
    uint32_t s = 0, b = 0;
    int64_t p0 = 0;
    for (; s < S; ++s) {
        b = sess_begin[s];
        const uint32_t e = sess_end[s];
        if (b >= e) continue;
        p0 = rows[b].pos;
        const uint64_t first = uint64_t(p0) / ratio, n_g = (uint64_t(p0) + (e - b)) / ratio - first;
        if (gi < n_g) {
            g = first + gi;
            break;
        }
        gi -= n_g;
    }
    if (s == S) return;
    const int64_t pe = int64_t(g + 1) * ratio - 1;   // the group's last position: its emitting row
    const DevLayerKV& L = lkv[uint64_t(rows[b].sess) * n_layer + il];
    const float* skv = indexer ? L.iskv : L.skv;
    const float* ssc = indexer ? L.issc : L.ssc;
    const uint64_t width = uint64_t(kOverlap ? 2 : 1) * D;
    // position q's value and score in column col (phase ph = q % ratio), or slot's when q < p0
    auto fetch = [&](int64_t q, uint32_t ph, uint64_t col, uint32_t slot, float& v, float& sc) {
        if (q >= p0) {
            const uint64_t off = uint64_t(b + uint64_t(q - p0)) * width + col;
            v = kvp[off];
            sc = scp[off] + ape[uint64_t(ph) * width + col];
        } else {
            v = skv[uint64_t(slot) * width + col];
            sc = ssc[uint64_t(slot) * width + col];
        }
    };
    float out;
    if constexpr (kOverlap) {
        // candidates 0..3: the previous group's rows, first half; 4..7: this group's, second half
        float v[8], sc[8];
        const bool prev_emitted_before = pe - 4 < p0;
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) {
            fetch(pe - 7 + j, j, d, prev_emitted_before ? j : 4 + j, v[j], sc[j]);
            fetch(pe - 3 + j, j, uint64_t(D) + d, 4 + j, v[4 + j], sc[4 + j]);
        }
        out = compressor_pool_value(8, [&](uint32_t k, float& cv, float& cs) {
            cv = v[k];
            cs = sc[k];
        });
    } else {
        const int64_t q0 = pe - int64_t(ratio - 1);
        out = compressor_pool_value(ratio, [&](uint32_t k, float& cv, float& cs) { fetch(q0 + k, k, d, k, cv, cs); });
    }
    pooled[uint64_t(b + uint64_t(pe - p0)) * D + d] = out;
}

// The state as compressor_state_kernel leaves it, one thread per (session, phase ph, column):
// slot (4+)ph holds the batch's last row of phase ph if it has one, else keeps its value; for
// ratio 4, slot ph holds what slot 4+ph held at the batch's last emission (both halves), if the
// batch emitted, else keeps its value. Launched after compressor_pool_kernel (it overwrites
// slots that kernel reads).
template <bool kOverlap>
__global__ void compressor_tail_kernel(const float* kvp, const float* scp, const float* ape, const DevRow* rows,
                                       const uint32_t* sess_begin, const uint32_t* sess_end, uint32_t ratio,
                                       uint32_t D, bool indexer, const DevLayerKV* lkv, uint32_t n_layer,
                                       uint32_t il) {
    pdl_begin();
    const uint64_t width = uint64_t(kOverlap ? 2 : 1) * D;
    const uint32_t col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= width) return;
    const uint32_t ph = blockIdx.y, s = blockIdx.z;
    const uint32_t b = sess_begin[s], e = sess_end[s];
    if (b >= e) return;
    const DevLayerKV& L = lkv[uint64_t(rows[b].sess) * n_layer + il];
    float* skv = indexer ? L.iskv : L.skv;
    float* ssc = indexer ? L.issc : L.ssc;
    const int64_t p0 = rows[b].pos, pl = p0 + int64_t(e - b) - 1;   // first and last position
    const int64_t rt = ratio;
    const uint32_t slot = kOverlap ? 4 + ph : ph;
    const uint64_t so = uint64_t(slot) * width + col;
    auto batch_row = [&](int64_t q, uint64_t dst) {
        const uint64_t off = uint64_t(b + uint64_t(q - p0)) * width + col;
        skv[dst] = kvp[off];
        ssc[dst] = scp[off] + ape[uint64_t(ph) * width + col];
    };
    if constexpr (kOverlap) {
        const int64_t pe = pl - (pl % 4 + 1) % 4;   // the last emitting position <= pl
        if (pe >= p0) {
            const int64_t q = pe - 3 + ph;
            const uint64_t dst = uint64_t(ph) * width + col;
            if (q >= p0) {
                batch_row(q, dst);
            } else {   // read before slot 4+ph is overwritten below (same thread)
                skv[dst] = skv[so];
                ssc[dst] = ssc[so];
            }
        }
    }
    const int64_t q = pl - (pl % rt - int64_t(ph) + rt) % rt;   // the last position <= pl of phase ph
    if (q >= p0) batch_row(q, so);
}

__global__ void compressor_emit_kernel(const float* pooled, const DevRow* rows, uint32_t ratio, uint32_t D,
                                       uint32_t n_rot, uint32_t n_nope, float eps, const float* norm_w,
                                       const double* inv_freq, bool indexer, bool official, const DevLayerKV* lkv,
                                       uint32_t n_layer, uint32_t il) {
    pdl_begin();
    extern __shared__ float xs[];
    const uint32_t r = blockIdx.x;
    const int64_t pos = rows[r].pos;
    if ((pos + 1) % ratio != 0) return;
    const int64_t c = pos / ratio;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) xs[i] = pooled[uint64_t(r) * D + i];
    __syncthreads();
    rms_norm_block(xs, xs, D, eps, norm_w);
    rope_block(xs, D, n_rot, c * ratio, inv_freq, false);
    if (official) {
        if (indexer) {
            hadamard_block(xs, D);
            sim_block(xs, D, 32, false);
        } else {
            sim_block(xs, n_nope, 64, true);
        }
    }
    const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
    float* dst = indexer ? L.index + uint64_t(c) * L.index_stride : L.comp + uint64_t(c) * L.comp_stride;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) dst[i] = xs[i];
}

// qb (the tensor-core scores' input): the prepared queries as BF16 there instead of floats in
// qi (official numerics: FP4 values, exact in BF16); keep_qi: in both (a decode round whose
// long rows score on the tensor cores and short ones on the FP32 kernels).
__global__ void indexer_q_prep_kernel(float* qi, float* wi, uint32_t NH, uint32_t DI, uint32_t n_rot,
                                      const double* inv_freq, const DevRow* rows, bool official, float wscale,
                                      uint16_t* qb, bool keep_qi) {
    pdl_begin();
    extern __shared__ float xs[];
    const uint32_t r = blockIdx.x / NH;
    float* qh = qi + uint64_t(blockIdx.x) * DI;
    for (uint32_t i = threadIdx.x; i < DI; i += blockDim.x) xs[i] = qh[i];
    __syncthreads();
    rope_block(xs, DI, n_rot, rows[r].pos, inv_freq, false);
    if (official) {
        hadamard_block(xs, DI);
        sim_block(xs, DI, 32, false);
    }
    for (uint32_t i = threadIdx.x; i < DI; i += blockDim.x) {
        if (qb) qb[uint64_t(blockIdx.x) * DI + i] = __bfloat16_as_ushort(__float2bfloat16_rn(xs[i]));
        if (!qb || keep_qi) qh[i] = xs[i];
    }
    if (threadIdx.x == 0) wi[blockIdx.x] *= wscale;
}

constexpr uint32_t kScoreTile = 16;   // compressed rows per indexer-score block

// tc_from (> 0): rows with that many visible rows or more are left to indexer_scores_tc_kernel.
__global__ void indexer_scores_kernel(const float* qi, const float* wi, uint32_t NH, uint32_t DI, const DevRow* rows,
                                      const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k,
                                      float* score, uint64_t ld, uint64_t tc_from) {
    pdl_begin();
    extern __shared__ float sm[];
    const uint32_t r = blockIdx.y;
    const uint64_t n_vis = uint64_t(rows[r].pos + 1) / 4;
    if (n_vis <= top_k || (tc_from && n_vis >= tc_from)) return;
    const uint64_t c0 = uint64_t(blockIdx.x) * kScoreTile;
    if (c0 >= n_vis) return;
    const uint32_t P = DI + 1;
    float* q_s = sm;              // [NH][P]
    float* k_s = sm + NH * P;     // [kScoreTile][P]
    float* w_s = k_s + kScoreTile * P;
    const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
    // float4 loads (DI % 4 == 0, rows 16-byte aligned: checked by the launcher) into rows
    // padded to DI + 1, which keeps the heads' reads below free of bank conflicts
    const uint32_t D4 = DI / 4;
    const float4* q4 = reinterpret_cast<const float4*>(qi + uint64_t(r) * NH * DI);
    for (uint32_t i = threadIdx.x; i < NH * D4; i += blockDim.x) {
        const float4 v = q4[i];
        float* dst = q_s + (i / D4) * P + (i % D4) * 4;
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
    for (uint32_t i = threadIdx.x; i < NH; i += blockDim.x) w_s[i] = wi[uint64_t(r) * NH + i];
    const uint32_t nt = uint32_t(n_vis - c0 < kScoreTile ? n_vis - c0 : kScoreTile);
    for (uint32_t i = threadIdx.x; i < nt * D4; i += blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(L.index + (c0 + i / D4) * L.index_stride)[i % D4];
        float* dst = k_s + (i / D4) * P + (i % D4) * 4;
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
    __syncthreads();
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (uint32_t j = w; j < nt; j += nw) {
        float s = 0;
        for (uint32_t h = lane; h < NH; h += 32) {
            float dot = 0;
            for (uint32_t d = 0; d < DI; ++d) dot = fmaf(q_s[h * P + d], k_s[j * P + d], dot);
            s += fmaxf(0.0f, dot) * w_s[h];
        }
        s = warp_sum(s);
        if (lane == 0) score[uint64_t(r) * ld + c0 + j] = s;
    }
}

// indexer_scores for the model's shape (64 heads of 128: indexer_fused's constants, defined
// below) with a tile of 64 compressed rows a block instead of 16, so the row's 32 KB of
// queries are staged once per 64 keys, and register tiles instead of a scalar loop: warp w
// takes keys 8w .. 8w+7, lane l heads l and l + 32, and keeps the 16 dot products in
// registers, reading per four dimensions 2 query float4 (conflict-free at the row pitch of
// 132) and 8 broadcast key float4 (16 shared-memory passes for 64 FMAs, where the scalar
// loop took 2 loads an FMA). Each dot is the same fmaf chain in dimension order from 0, and
// the lane then adds heads l and l + 32 in that order before the warp sum: the same
// operations as indexer_scores_kernel and indexer_fused_kernel, so the same bits.
// KT / NTH (DSV4_IDX_TILED=2, measurements): 32 keys and 4 warps a block, the same 8 keys a warp:
// half the shared memory a block (50 KB: 4 blocks an SM, not 3), so an SM holds blocks in
// different phases (staging, arithmetic) where the 64-key blocks (2 an SM at 16K keys) stage
// and compute in step; the queries are staged twice as often (32 KB a block from L2).
constexpr uint32_t kScoreTileWide = 64;

template <uint32_t NH, uint32_t DI, uint32_t P, uint32_t KT = kScoreTileWide, uint32_t NTH = 256>
__global__ void __launch_bounds__(NTH) indexer_scores_tiled_kernel(const float* qi, const float* wi,
                                                                   const DevRow* rows, const DevLayerKV* lkv,
                                                                   uint32_t n_layer, uint32_t il, uint32_t top_k,
                                                                   float* score, uint64_t ld, uint64_t tc_from) {
    static_assert(NH == 64 && DI % 4 == 0 && P % 4 == 0, "two heads a lane, float4 rows");
    constexpr uint32_t D4 = DI / 4, KW = KT / (NTH / 32);   // keys a warp
    static_assert(KW * (NTH / 32) == KT && KW >= 1, "whole warps of keys");
    pdl_begin();
    extern __shared__ __align__(16) float sm[];
    const uint32_t r = blockIdx.y;
    const uint64_t n_vis = uint64_t(rows[r].pos + 1) / 4;
    if (n_vis <= top_k || (tc_from && n_vis >= tc_from)) return;
    const uint64_t c0 = uint64_t(blockIdx.x) * KT;
    if (c0 >= n_vis) return;
    float* q_s = sm;             // [NH][P]
    float* k_s = sm + NH * P;    // [KT][P]
    const uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
    const uint32_t nt = uint32_t(n_vis - c0 < KT ? n_vis - c0 : KT);
    const float4* q4 = reinterpret_cast<const float4*>(qi + uint64_t(r) * NH * DI);
    for (uint32_t i = tid; i < NH * D4; i += NTH) *reinterpret_cast<float4*>(q_s + (i / D4) * P + (i % D4) * 4) = q4[i];
    for (uint32_t i = tid; i < nt * D4; i += NTH) {
        const float4 v = reinterpret_cast<const float4*>(L.index + (c0 + i / D4) * L.index_stride)[i % D4];
        *reinterpret_cast<float4*>(k_s + (i / D4) * P + (i % D4) * 4) = v;
    }
    const float w0 = wi[uint64_t(r) * NH + lane], w1 = wi[uint64_t(r) * NH + lane + 32];
    __syncthreads();
    const uint32_t j0 = w * KW;
    if (j0 >= nt) return;   // (no barrier below)
    float acc[2][KW];
#pragma unroll
    for (uint32_t t = 0; t < KW; ++t) acc[0][t] = acc[1][t] = 0.0f;
    const float4* qa = reinterpret_cast<const float4*>(q_s + lane * P);
    const float4* qb = reinterpret_cast<const float4*>(q_s + (lane + 32) * P);
#pragma unroll 2
    for (uint32_t d4 = 0; d4 < D4; ++d4) {
        const float4 xa = qa[d4], xb = qb[d4];
#pragma unroll
        for (uint32_t t = 0; t < KW; ++t) {   // keys past nt: stale rows, never written out
            const float4 kv = reinterpret_cast<const float4*>(k_s + (j0 + t) * P)[d4];
            acc[0][t] = fmaf(xa.x, kv.x, acc[0][t]);
            acc[0][t] = fmaf(xa.y, kv.y, acc[0][t]);
            acc[0][t] = fmaf(xa.z, kv.z, acc[0][t]);
            acc[0][t] = fmaf(xa.w, kv.w, acc[0][t]);
            acc[1][t] = fmaf(xb.x, kv.x, acc[1][t]);
            acc[1][t] = fmaf(xb.y, kv.y, acc[1][t]);
            acc[1][t] = fmaf(xb.z, kv.z, acc[1][t]);
            acc[1][t] = fmaf(xb.w, kv.w, acc[1][t]);
        }
    }
#pragma unroll
    for (uint32_t t = 0; t < KW; ++t) {
        float sc = 0;
        sc += fmaxf(0.0f, acc[0][t]) * w0;
        sc += fmaxf(0.0f, acc[1][t]) * w1;
        sc = warp_sum(sc);
        if (lane == 0 && j0 + t < nt) score[uint64_t(r) * ld + c0 + j0 + t] = sc;
    }
}

// ---- prompt rounds' indexer scores on the BF16 tensor cores ------------------------------
// With official numerics the indexer's queries (indexer_q_prep) and index rows
// (compressor_emit) leave their Hadamard + FP4 step as E2M1 values times a power of two a
// block of 32: at most two significant bits, so each is a BF16 value exactly and each product
// of two is exact in FP32. A row's dots then go to m16n8k16 BF16 MMAs (FP32 accumulate) instead
// of one fmaf a dimension: 8 MMAs a (16 heads × 8 keys) tile for 128 dimensions where the FP32
// kernels issue 128 FMAs a (head, key) pair. Not the FP32 kernels' bits (the tensor cores add
// their products in their own order and rounding), so prompt rounds only (gemm_prefill_order:
// their order is their own, the same for every chunking); decode keeps indexer_fused's. Each
// score is formed from its own row's queries, weights and its key alone, in a fixed order
// (the k steps in order; the lane's heads 16 m + gid, + 8 in m order, then a butterfly over
// the 8 lanes of a key), whatever the block, batch or chunk: the chunkings of a prompt stay
// bit-identical.
// A block: kTcKeys = 256 index rows of one session staged as BF16 (8 warps of 32 keys), and
// up to RB query rows in turn (idx_tc_rows: DSV4_IDX_TC_ROWS, 16 or 32 by the width, up to kTcRowsMax:
// more rows a block stage each key block fewer times; the same bits whatever RB), each row's
// BF16 queries (indexer_q_prep's qb: half the bytes of the floats, no conversion here) copied
// by cp.async one row ahead; MT m-tiles of 16 heads (heads past NH are zero, weight 0).
constexpr uint32_t kTcKeys = 256, kTcRowsMax = 32, kTcThreads = 256;   // (rows a block: bits of one uint32_t)
template <uint32_t DI>
constexpr uint32_t tc_pitch() { return DI + 8; }   // bf16 a staged row: 16 bytes of padding, ldmatrix rows on distinct banks
template <uint32_t DI, uint32_t MT>
constexpr size_t idx_tc_smem() {
    return (size_t(kTcKeys) + 2 * 16 * MT) * tc_pitch<DI>() * 2 + 2 * 16 * MT * sizeof(float);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four floats as BF16 (exact for the FP4-simulated values this kernel takes), low dims first.
__device__ __forceinline__ uint2 bf16x4(float4 v) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

template <uint32_t DI, uint32_t MT>
__global__ void __launch_bounds__(kTcThreads, 2)
    indexer_scores_tc_kernel(const uint16_t* qb, const float* wi, uint32_t NH, const DevRow* rows,
                             const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint32_t R,
                             float* score, uint64_t ld, uint64_t tc_from, uint32_t RB) {
    static_assert(DI % 16 == 0 && MT >= 1 && MT <= 4, "k16 steps, up to 64 heads");
    constexpr uint32_t KP = tc_pitch<DI>(), HP = 16 * MT, D4 = DI / 4, C8 = DI / 8;   // C8: 16-byte chunks a head
    pdl_begin();
    extern __shared__ __align__(16) uint8_t tc_sm[];
    uint8_t* q_sm = tc_sm + kTcKeys * KP * 2;                                     // queries [2][HP][KP]
    const uint32_t k_a = smem_addr(tc_sm), q_a = smem_addr(q_sm);                 // keys [256][KP]
    float* w_s = reinterpret_cast<float*>(tc_sm + (kTcKeys + 2 * HP) * KP * 2);   // [2][HP]
    const uint32_t t = threadIdx.x, lane = t & 31, w = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint64_t c0 = uint64_t(blockIdx.x) * kTcKeys;
    const uint32_t r0 = blockIdx.y * RB, nr = min(RB, R - r0);   // (RB <= kTcRowsMax)
    // the block's rows that score keys of this chunk (every thread forms the same mask; rows
    // below tc_from are the FP32 kernels')
    uint32_t act = 0;
    for (uint32_t i = 0; i < nr; ++i) {
        const uint64_t nv = uint64_t(rows[r0 + i].pos + 1) / 4;
        if (nv > top_k && nv > c0 && nv >= tc_from) act |= 1u << i;
    }
    if (!act) return;

    // row r's queries into buffer b by cp.async (heads past NH: zeros, written once below) and
    // its weights (read a row later: the barrier between covers the plain store)
    auto stage_q = [&](uint32_t r, uint32_t b) {
        const uint16_t* src = qb + uint64_t(r) * NH * DI;
        for (uint32_t i = t; i < NH * C8; i += kTcThreads)
            cp_async16(q_sm + ((b * HP + i / C8) * KP + (i % C8) * 8) * 2, src + uint64_t(i) * 8);
        if (t < HP) w_s[b * HP + t] = t < NH ? wi[uint64_t(r) * NH + t] : 0.0f;
    };
    for (uint32_t i = NH * C8 + t; i < HP * C8; i += kTcThreads)   // the padding heads of both buffers
        for (uint32_t b = 0; b < 2; ++b)
            *reinterpret_cast<uint4*>(q_sm + ((b * HP + i / C8) * KP + (i % C8) * 8) * 2) = make_uint4(0, 0, 0, 0);
    int32_t staged = -1;   // the session whose index rows are staged
    auto stage_keys = [&](int32_t sess) {
        // as many rows as the block's rows of this session see (rows past them: zeros)
        uint64_t nmax = 0;
        for (uint32_t i = 0; i < nr; ++i)
            if (rows[r0 + i].sess == sess) nmax = max(nmax, uint64_t(rows[r0 + i].pos + 1) / 4);
        const uint32_t nk = uint32_t(min(uint64_t(kTcKeys), nmax > c0 ? nmax - c0 : uint64_t(0)));
        const DevLayerKV& L = lkv[uint64_t(sess) * n_layer + il];
        constexpr uint32_t KB = 8;   // loads in flight a thread
        static_assert(kTcKeys * D4 % (KB * kTcThreads) == 0, "whole batches of loads");
        for (uint32_t i0 = t; i0 < kTcKeys * D4; i0 += KB * kTcThreads) {
            float4 v[KB];
#pragma unroll
            for (uint32_t j = 0; j < KB; ++j) {
                const uint32_t c = (i0 + j * kTcThreads) / D4, d4 = (i0 + j * kTcThreads) % D4;
                v[j] = c < nk ? reinterpret_cast<const float4*>(L.index + (c0 + c) * L.index_stride)[d4]
                              : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (uint32_t j = 0; j < KB; ++j) {
                const uint32_t c = (i0 + j * kTcThreads) / D4, d4 = (i0 + j * kTcThreads) % D4;
                *reinterpret_cast<uint2*>(tc_sm + (c * KP + d4 * 4) * 2) = bf16x4(v[j]);
            }
        }
    };

    // ldmatrix rows: A (queries: heads 16 m + lane % 8 (+ 8 for matrices 1, 3), dims + 8 for
    // matrices 2, 3), B (keys 32 w + 16 p + lane % 8 (+ 8 for matrices 2, 3), dims + 8 for 1, 3)
    const uint32_t qoff = ((lane & 7) + 8 * ((lane >> 3) & 1)) * KP * 2 + (lane >> 4) * 16;
    const uint32_t koff = k_a + (32 * w + (lane & 7) + 8 * (lane >> 4)) * KP * 2 + ((lane >> 3) & 1) * 16;
    uint32_t i = __ffs(act) - 1, b = 0;
    stage_q(r0 + i, 0);
    while (true) {
        const uint32_t r = r0 + i;
        const int32_t sess = rows[r].sess;
        if (sess != staged) {   // (block-uniform)
            if (staged >= 0) __syncthreads();   // every warp done with the last session's keys
            stage_keys(sess);
            staged = sess;
        }
        cp_async_wait_all();
        __syncthreads();   // the row's queries, weights (and keys) staged; every warp done with the other buffer
        const uint32_t rest = act & ~((2u << i) - 1u);
        const uint32_t next = rest ? uint32_t(__ffs(rest) - 1) : 0u;
        if (rest) stage_q(r0 + next, b ^ 1);   // in flight during this row's MMAs
        const uint64_t nv = uint64_t(rows[r].pos + 1) / 4;
        const uint64_t kw = c0 + 32 * w;   // this warp's first key
        if (kw < nv) {
            float acc[MT][4][4] = {};
            const uint32_t qs = q_a + b * HP * KP * 2 + qoff;
#pragma unroll
            for (uint32_t kk = 0; kk < DI / 16; ++kk) {
                uint32_t bk[2][4];
#pragma unroll
                for (uint32_t p = 0; p < 2; ++p) ldsm_x4(bk[p], koff + p * 16 * KP * 2 + kk * 32);
#pragma unroll
                for (uint32_t m = 0; m < MT; ++m) {
                    uint32_t a[4];
                    ldsm_x4(a, qs + m * 16 * KP * 2 + kk * 32);
#pragma unroll
                    for (uint32_t n = 0; n < 4; ++n) mma_bf16(acc[m][n], a, bk[n >> 1][2 * (n & 1)], bk[n >> 1][2 * (n & 1) + 1]);
                }
            }
            // score of key 8 n + 2 tig + j: the lane's heads (16 m + gid, + 8) in m order, then the
            // sum over the 8 lanes of the key (gid) by a fixed butterfly
            const float* ws = w_s + b * HP;
            float* out = score + uint64_t(r) * ld;
#pragma unroll
            for (uint32_t n = 0; n < 4; ++n) {
                float sc[2] = {0.0f, 0.0f};
#pragma unroll
                for (uint32_t m = 0; m < MT; ++m)
#pragma unroll
                    for (uint32_t h = 0; h < 2; ++h) {
                        const float wh = ws[16 * m + gid + 8 * h];
#pragma unroll
                        for (uint32_t j = 0; j < 2; ++j) sc[j] = fmaf(fmaxf(acc[m][n][2 * h + j], 0.0f), wh, sc[j]);
                    }
#pragma unroll
                for (uint32_t j = 0; j < 2; ++j)
#pragma unroll
                    for (uint32_t o = 4; o < 32; o <<= 1) sc[j] += __shfl_xor_sync(0xffffffffu, sc[j], o);
                if (gid == 0)
#pragma unroll
                    for (uint32_t j = 0; j < 2; ++j) {
                        const uint64_t c = kw + 8 * n + 2 * tig + j;
                        if (c < nv) out[c] = sc[j];
                    }
            }
        }
        if (!rest) break;
        b ^= 1;
        i = next;
    }
}

__device__ __forceinline__ uint32_t order_key(float f) {
    if (f == 0.0f) f = 0.0f;   // -0 ties with +0, as in the CPU's comparisons
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum over a block of NT threads (NT / 32 <= 32 warps) of v; total in *total.
template <uint32_t NT = 256>
__device__ uint32_t block_excl_scan(uint32_t v, uint32_t* total) {
    static_assert(NT % 32 == 0 && NT / 32 <= 32, "warps");
    __shared__ uint32_t warp_tot[NT / 32];
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    uint32_t incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= uint32_t(o)) incl += t;
    }
    __syncthreads();   // (the last call's reads of warp_tot are done)
    if (lane == 31) warp_tot[w] = incl;
    __syncthreads();
    // every warp scans the warp totals itself (lane i holds warp i's)
    const uint32_t wt = lane < NT / 32 ? warp_tot[lane] : 0u;
    uint32_t wincl = wt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t t = __shfl_up_sync(0xffffffffu, wincl, o);
        if (lane >= uint32_t(o)) wincl += t;
    }
    *total = __shfl_sync(0xffffffffu, wincl, 31);
    return __shfl_sync(0xffffffffu, wincl - wt, w) + incl - v;
}

// One radix pass's digit, by a block of NT threads: thread t holds h[0 .. per), the counts of
// bins per·t .. per·t + per - 1 (per <= 4) among the keys matching prefix; the digit where the
// count of larger-or-equal keys reaches what remains (*s_remaining) extends the prefix
// (*s_prefix) and leaves what remains below it. The counts above each bin come from a block
// scan (one thread walking the bins was slow). s_all (optional): set when the chosen bin's
// keys are all still needed (its count is what remains to pick). What remains is read before
// the scan, whose barriers keep every thread's read ahead of the one finding thread's write.
template <uint32_t NT = 256>
__device__ __forceinline__ void radix_pick_digit(const uint32_t (&h)[4], uint32_t per, int shift, uint32_t prefix,
                                                 uint32_t* s_prefix, uint32_t* s_remaining, uint32_t* s_all) {
    const uint32_t rem = *s_remaining;
    uint32_t mine = 0;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i)
        if (i < per) mine += h[i];
    uint32_t total;
    const uint32_t below = block_excl_scan<NT>(mine, &total);   // bins under thread t's
    uint32_t above = total - below - mine;                       // bins over thread t's
#pragma unroll
    for (int i = 3; i >= 0; --i) {
        if (uint32_t(i) >= per) continue;
        if (above < rem && above + h[i] >= rem) {
            *s_prefix = prefix | ((per * threadIdx.x + uint32_t(i)) << shift);
            *s_remaining = rem - above;
            if (s_all && above + h[i] == rem) *s_all = 1;
        }
        above += h[i];
    }
}

// ---- fused indexer for small batches: q prep + scores + top-k in one launch ---------------
// The three-kernel path above (indexer_q_prep → indexer_scores → topk_select) is four
// dependent steps on the indexer's side stream after iq_b (three launches, each a full grid
// drain and ramp, q and scores round-tripping through global memory). Here every score
// block of a row prepares the row's 64 query heads itself (redundantly: 32 KB of L2 reads
// that the scores step loaded anyway, plus a warp-per-head RoPE/Hadamard/FP4 in registers
// with shuffles, its RoPE angles' double cos/sin under the loads), scores its tile (a thread
// per (head, 4 rows): float4 shared reads, four FMA chains), and the last block of the row
// to finish (a counter per row, left at 0) runs the top-k over the row's scores staged in
// shared memory. The arithmetic of each value is the three kernels' own (same operations in
// the same order: each dot one fmaf per dimension in order, each score the lane's two heads
// then indexer_scores' warp sum), so scores and selection are bit-identical; only the work
// distribution changes. Dependent steps after iq_b: one launch instead of three.
constexpr uint32_t kFusedNH = 64, kFusedDI = 128, kFusedThreads = 256;
constexpr uint32_t kFusedP = kFusedDI + 4;   // shared row pitch: float4-aligned, conflict-free
// dynamic shared floats before the top-k: q, the k tile, the head weights, the tile's dots
constexpr uint32_t kFusedBase = (kFusedNH + kScoreTile) * kFusedP + kFusedNH + kScoreTile * kFusedNH;
constexpr uint32_t kFusedMaxKeys = 16384;   // staged top-k keys (64 KB of shared memory)
constexpr uint32_t kFusedMaxRows = 16;      // beyond: prefill-sized batches, three kernels

// Block (256 threads) exclusive scan of two counts at once: packed as lo | hi << 16 when
// the totals fit 16 bits, else two scans. Returns the pair of exclusive prefixes.
__device__ uint2 block_excl_scan2(uint32_t lo, uint32_t hi, bool packed, uint2* total) {
    if (packed) {
        uint32_t t;
        const uint32_t e = block_excl_scan(lo | (hi << 16), &t);
        *total = make_uint2(t & 0xffffu, t >> 16);
        return make_uint2(e & 0xffffu, e >> 16);
    }
    uint32_t t0, t1;
    const uint32_t e0 = block_excl_scan(lo, &t0);
    __syncthreads();   // block_excl_scan's warp totals are reused
    const uint32_t e1 = block_excl_scan(hi, &t1);
    *total = make_uint2(t0, t1);
    return make_uint2(e0, e1);
}

// The top-k's selection rule: every key > T (the k-th largest key), then the lowest-index
// keys == T, listed in index order. TopkCut: T and how many keys == T are taken (need_eq),
// on the key bits in mask (the radix passes may stop before the last digit: topk_threshold).
struct TopkCut {
    uint32_t T, need_eq, mask;
};

// The radix passes of a top-k by radix select on order keys (order_key), by 256 threads, on n
// keys that key_at(i) yields (staged in shared memory, or read from global memory: U keys a
// thread loaded before their atomics, so that U loads are in flight). Histograms are
// double-buffered (the next one is cleared during the current pass: one barrier fewer per
// pass) and filled with one shared atomic per distinct digit of a warp (scores cluster in a
// few binades, so plain atomics serialise).
// early_exit: the passes stop once every key of the chosen bin is needed (the bin's count
// equals the keys still to pick): the selection is then every key whose digits so far are
// above the prefix or equal to it, which is what the remaining passes would select (T, the
// k-th largest key, is the bin's smallest, and all the bin's keys >= T are taken), and the
// output lists the selected keys in index order either way: the same bytes.
// (The top-k's block-wide scratch, one copy a kernel whatever the instantiations: a function's
// own __shared__ arrays would be one a template instantiation. Each user starts with a barrier,
// so the previous user's last reads are done.)
__shared__ uint32_t topk_hist_s[2][256], topk_prefix_s, topk_remaining_s, topk_all_s;
__shared__ uint32_t walk_c0_s[8], walk_c1_s[8];

// last_shift > 0: the passes stop after the digit at that shift (a cut on the key's top bits:
// at least k keys lie at or above prefix there).
template <uint32_t U, class KeyAt>
__device__ TopkCut topk_threshold(KeyAt key_at, uint32_t n, uint32_t k, bool early_exit, int last_shift = 0) {
    constexpr uint32_t NT = 256;
    auto& hist = topk_hist_s;
    uint32_t &s_prefix = topk_prefix_s, &s_remaining = topk_remaining_s, &s_all = topk_all_s;
    const uint32_t tid = threadIdx.x, lane = tid & 31;
    __syncthreads();
    hist[0][tid] = 0;
    hist[1][tid] = 0;
    if (tid == 0) s_remaining = k, s_all = 0;
    __syncthreads();
    uint32_t prefix = 0, mask = 0;
    int b = 0;
    for (int shift = 24; shift >= last_shift && !s_all; shift -= 8, b ^= 1) {
        // (the loop test on the warp's first key: every lane makes the same trips, as
        // __match_any_sync needs)
        for (uint32_t i0 = tid; i0 - lane < n; i0 += U * NT) {
            uint32_t u[U];
#pragma unroll
            for (uint32_t j = 0; j < U; ++j) u[j] = i0 + j * NT < n ? key_at(i0 + j * NT) : 0;
#pragma unroll
            for (uint32_t j = 0; j < U; ++j) {
                const bool in = i0 + j * NT < n && (u[j] & mask) == prefix;
                const uint32_t bin = in ? (u[j] >> shift) & 255 : 0xffffffffu;
                const uint32_t peers = __match_any_sync(0xffffffffu, bin);
                if (in && lane == uint32_t(__ffs(peers) - 1)) atomicAdd(&hist[b][bin], __popc(peers));
            }
        }
        hist[b ^ 1][tid] = 0;   // read last in the previous pass, before its final barrier
        __syncthreads();
        const uint32_t h[4] = {hist[b][tid], 0, 0, 0};
        radix_pick_digit(h, 1, shift, prefix, &s_prefix, &s_remaining, early_exit ? &s_all : nullptr);
        __syncthreads();
        prefix = s_prefix;
        mask |= 255u << shift;
    }
    return {prefix, s_remaining, mask};
}

// The selection written by thread segments: thread t owns the contiguous keys [t*seg,
// (t+1)*seg) and the output slot of key i is (#gt before i) + min(#eq before i, need_eq); out
// gets idx_of(i).
template <class KeyAt, class IdxOf>
__device__ void topk_write_by_threads(KeyAt key_at, IdxOf idx_of, uint32_t n, TopkCut c, uint32_t* out) {
    constexpr uint32_t NT = 256;
    const uint32_t seg = (n + NT - 1) / NT;
    const uint32_t lo = min(n, threadIdx.x * seg), hi = min(n, lo + seg);
    uint32_t gt = 0, eq = 0;
    for (uint32_t i = lo; i < hi; ++i) {
        const uint32_t u = key_at(i) & c.mask;
        gt += u > c.T;
        eq += u == c.T;
    }
    uint2 tot;
    const uint2 ex = block_excl_scan2(gt, eq, n < 65536u, &tot);
    uint32_t gt_b = ex.x, eq_b = ex.y;
    for (uint32_t i = lo; i < hi; ++i) {
        const uint32_t u = key_at(i) & c.mask;
        if (u > c.T) {
            out[gt_b + min(eq_b, c.need_eq)] = idx_of(i);
            ++gt_b;
        } else if (u == c.T) {
            if (eq_b < c.need_eq) out[gt_b + eq_b] = idx_of(i);
            ++eq_b;
        }
    }
}

// Block (8 warps) walk of n keys by warps for two passes over the same keys: warp w owns keys
// [w·seg, (w+1)·seg), seg a multiple of 32, 32 at a time, a key a lane (consecutive: no bank
// conflicts when staged, coalesced when not). flags(i, valid) returns the lane's two flags
// (bits 0, 1); the warps' counts of each are scanned (total0: all keys of flag 0), and then
// write(i, before0, before1, flags) sees for each flagged key how many keys of each flag lie
// before it.
template <class Flags, class Write>
__device__ void block_walk2(uint32_t n, Flags flags, Write write, uint32_t* total0 = nullptr) {
    constexpr uint32_t NW = 8;
    auto &w_c0 = walk_c0_s, &w_c1 = walk_c1_s;
    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, below = (1u << lane) - 1;
    const uint32_t seg = (n + 32 * NW - 1) / (32 * NW) * 32;
    const uint32_t lo = min(n, w * seg), hi = min(n, lo + seg);
    // the warp's counts: a lane's own, summed once at the end (no ballot a step: run 132 had
    // this loop at 16 instructions a step with them)
    uint32_t c0 = 0, c1 = 0;
#pragma unroll 4
    for (uint32_t i0 = lo; i0 < hi; i0 += 32) {
        const uint32_t f = flags(i0 + lane, i0 + lane < hi);
        c0 += f & 1;
        c1 += (f >> 1) & 1;
    }
    c0 = __reduce_add_sync(0xffffffffu, c0);
    c1 = __reduce_add_sync(0xffffffffu, c1);
    __syncthreads();   // (the previous walk's reads of the counts are done)
    if (lane == 0) w_c0[w] = c0, w_c1[w] = c1;
    __syncthreads();
    uint32_t b0 = 0, b1 = 0, t0 = 0;
    for (uint32_t j = 0; j < NW; ++j) {
        if (j < w) b0 += w_c0[j], b1 += w_c1[j];
        t0 += w_c0[j];
    }
    if (total0) *total0 = t0;
    if constexpr (!std::is_same_v<Write, std::nullptr_t>) {   // (nullptr: the counts only)
#pragma unroll 4
        for (uint32_t i0 = lo; i0 < hi; i0 += 32) {
            const uint32_t f = flags(i0 + lane, i0 + lane < hi);
            const uint32_t m0 = __ballot_sync(0xffffffffu, f & 1), m1 = __ballot_sync(0xffffffffu, f & 2);
            if (f) write(i0 + lane, b0 + __popc(m0 & below), b1 + __popc(m1 & below), f);
            b0 += __popc(m0);
            b1 += __popc(m1);
        }
    }
}

// The selection written by warps (DSV4_TOPK_WARP): block_walk2 with flags gt (bit 0) and eq
// (bit 1): the same slots as topk_write_by_threads, so the same bytes, without its 32-way bank
// conflicts (its per-thread segments put a warp's 32 reads of staged keys seg words apart).
template <class KeyAt, class IdxOf>
__device__ void topk_write_by_warps(KeyAt key_at, IdxOf idx_of, uint32_t n, TopkCut c, uint32_t* out) {
    block_walk2(
        n,
        [&](uint32_t i, bool v) {
            if (!v) return 0u;
            const uint32_t u = key_at(i) & c.mask;
            return (u > c.T ? 1u : 0u) | (u == c.T ? 2u : 0u);
        },
        [&](uint32_t i, uint32_t g, uint32_t e, uint32_t f) {
            if (f & 1) out[g + min(e, c.need_eq)] = idx_of(i);
            else if (e < c.need_eq) out[g + e] = idx_of(i);
        });
}

// Top-k by radix select (topk_threshold, then the selection written by threads or warps).
template <uint32_t U, class KeyAt, class IdxOf>
__device__ void topk_radix(KeyAt key_at, IdxOf idx_of, uint32_t n, uint32_t k, uint32_t* out, bool early_exit,
                           bool warp_out) {
    const TopkCut c = topk_threshold<U>(key_at, n, k, early_exit);
    if (warp_out) topk_write_by_warps(key_at, idx_of, n, c, out);
    else topk_write_by_threads(key_at, idx_of, n, c, out);
}
struct TopkSameIndex {
    __device__ uint32_t operator()(uint32_t i) const { return i; }
};

// On n order keys already staged in shared memory (topk_row).
__device__ void topk_staged(const uint32_t* keys, uint32_t n, uint32_t k, uint32_t* out, bool early_exit,
                            bool warp_out) {
    topk_radix<1>([keys](uint32_t i) { return keys[i]; }, TopkSameIndex{}, n, k, out, early_exit, warp_out);
}

// The order keys of sc[0, n) into keys (16-byte aligned). The scores come by cp.async, 16 bytes
// a copy, all of a thread's copies in flight at once, through L2 (.cg: in the fused indexer
// other blocks wrote them), and each thread then converts the keys it copied, in place. The loop
// this replaces (load by __ldcg, convert, store, a key at a time) waited a whole L2 round trip
// per key: ptxas keeps such strong loads in order with the shared stores between them (run 132,
// Nsight Compute's SASS table of a 16K-key decode row: every load's result used by the next
// instruction, 64 round trips a thread in a 35 us call; loads gathered in registers first still
// came out one or two in flight). A row not 16-byte aligned goes a key at a time as before.
__device__ void stage_order_keys(const float* sc, uint32_t n, uint32_t* keys) {
    constexpr uint32_t NT = 256;
    const uint32_t n4 = (reinterpret_cast<uintptr_t>(sc) & 15) == 0 ? n / 4 : 0;
    for (uint32_t c = threadIdx.x; c < n4; c += NT) cp_async16(keys + 4 * c, sc + 4 * c);
    for (uint32_t i = 4 * n4 + threadIdx.x; i < n; i += NT) keys[i] = order_key(__ldcg(sc + i));
    cp_async_wait_all();   // (a thread's own copies: visible to it now)
    for (uint32_t c = threadIdx.x; c < n4; c += NT) {
        uint4* p = reinterpret_cast<uint4*>(keys + 4 * c);
        const uint4 v = *p;
        *p = make_uint4(order_key(__uint_as_float(v.x)), order_key(__uint_as_float(v.y)),
                        order_key(__uint_as_float(v.z)), order_key(__uint_as_float(v.w)));
    }
}

// A long row's top-k through a sample (DSV4_TOPK_FILTER): the k_s-th largest of 1,024 evenly
// spaced keys (k_s: the k-th largest's expected rank in the sample plus 4 standard deviations
// and 8) is a cut t that, at the usual spread of scores, about 2k keys pass; a walk by warps
// (filter_walk) copies them with their indices in index order to cand (the first cap keys and
// indices; the walk counts before it writes), and the radix select runs on those only. Exact
// whenever at least k keys pass: every key >= the k-th largest then passes, the ties at it
// included, and candidates keep index order, so the selection and its order are the full
// select's. Returns false (nothing written to out) when fewer than k or more than cap pass
// (heavy ties at the cut): the caller then selects from all n keys. No key goes through an
// atomic. walk(t) walks every key and returns how many passed (the same in every thread).
constexpr uint32_t kTopkSample = 1024, kTopkFilterMin = 4096, kTopkFilterCap = 4096;
__host__ __device__ constexpr uint32_t round_up4(uint32_t n) { return (n + 3) & ~3u; }   // (16-byte aligned)
// the forms' bits (topk_row, indexer_fused_kernel); kTopkKeyByKey: the staging before
// stage_order_keys (DSV4_TOPK_ASYNC=0, measurements)
constexpr uint32_t kTopkWarp = 1, kTopkFilter = 2, kTopkKeyByKey = 4;
static_assert(2 * kTopkFilterCap <= kFusedBase, "the fused indexer's candidates fit its base shared memory");
static_assert(kTopkSample <= kTopkFilterCap, "the sample lies in the candidates' space");
template <class KeyAt, class Walk>
__device__ bool topk_filtered(KeyAt key_at, uint32_t n, uint32_t k, uint32_t* out, bool warp_out, uint32_t* cand,
                              Walk walk) {
    uint32_t* samp = cand;   // (the candidates are written after the sample's last use)
    __syncthreads();         // (cand may be the space of keys read just before)
    for (uint32_t j = threadIdx.x; j < kTopkSample; j += 256) samp[j] = key_at(uint32_t(uint64_t(j) * n / kTopkSample));
    __syncthreads();
    const uint32_t mf = uint32_t((uint64_t(k) * kTopkSample + n - 1) / n);
    const uint32_t ks = min(kTopkSample, mf + 4 * uint32_t(sqrtf(float(mf)) + 1.0f) + 8);
    // (the cut on the keys' top 24 bits: three radix passes over the sample, not four; its bin
    // at most 2^-15 of the cut's value wide, so scores bunched around a large value still pass
    // few more keys; a 16-bit cut's bin, 1/128 of the value, could pass thousands there)
    const TopkCut t = topk_threshold<1>([samp](uint32_t j) { return samp[j]; }, kTopkSample, ks, true, 8);
    const uint32_t c = walk(t);
    // (every thread's candidate writes done: they are read below, or, when the filter fails,
    // the caller's next use of this space (staging) must not race a slow thread's last write)
    __syncthreads();
    if (c < k || c > kTopkFilterCap) return false;
    const uint32_t* cand_idx = cand + kTopkFilterCap;
    topk_radix<1>([cand](uint32_t j) { return cand[j]; }, [cand_idx](uint32_t j) { return cand_idx[j]; }, c, k, out,
                  true, warp_out);
    return true;
}
// The filter's walk over m keys that key_at yields, the row's keys i0 .. i0 + m - 1: those
// that pass the cut go to cand[base + (how many passed before them)] (and their row indices to
// cand + kTopkFilterCap), as long as that is below kTopkFilterCap. Returns how many passed.
template <class KeyAt>
__device__ uint32_t filter_walk(KeyAt key_at, uint32_t m, uint32_t i0, TopkCut t, uint32_t* cand, uint32_t base) {
    uint32_t* cand_idx = cand + kTopkFilterCap;
    uint32_t c = 0;
    block_walk2(
        m, [&](uint32_t i, bool v) { return v && (key_at(i) & t.mask) >= t.T ? 1u : 0u; },
        [&](uint32_t i, uint32_t before, uint32_t, uint32_t) {
            if (base + before < kTopkFilterCap) cand[base + before] = key_at(i), cand_idx[base + before] = i0 + i;
        },
        &c);
    return c;
}

__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
    uint32_t b;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(b));
    return b;
}

// The top-k of a row's n scores (topk_select, topk_plain, the fused indexer's last block), by
// 256 threads in the dynamic shared memory. n <= stage_max: the order keys staged there first
// (stage_order_keys), then the passes at shared memory's latency; else every radix pass reads
// them from L2 (4 loads a thread in flight). With kTopkFilter (rows of kTopkFilterMin keys or
// more, falling back to those when the sample's cut fails) the filter walks the staged keys,
// its candidates after them, where those fit the dynamic shared memory, else the scores in L2
// (its candidates at the start, before any staging); rows longer than the staging walk their
// chunks of stage_max keys staged in turn. topk_block before these (a plain shared atomic a
// key, so a warp's keys of one binade serialised; one key a thread between atomics; a block scan
// per 256 keys in the output pass) took of the order of 100 us for a decode row of 16K keys;
// staged, 60.8 us (run 127); filtered, 36.6 (run 131).
__device__ void topk_row(const float* sc, uint32_t n, uint32_t k, uint32_t* out, uint32_t stage_max, uint32_t form,
                         bool early_exit) {
    extern __shared__ __align__(16) uint32_t keys[];
    auto global_key = [sc](uint32_t i) { return order_key(__ldcg(sc + i)); };
    auto staged_key = [](uint32_t i) { return keys[i]; };
    const bool warp_out = form & kTopkWarp, filter = (form & kTopkFilter) && n >= kTopkFilterMin;
    // the filter's walk over the whole row in one go, keys from key_at, candidates to cand
    auto whole = [n](auto key_at, uint32_t* cand) {
        return [=](TopkCut t) { return filter_walk(key_at, n, 0, t, cand, 0); };
    };
    if (n <= stage_max) {
        const bool after = (round_up4(n) + 2 * kTopkFilterCap) * 4 <= dynamic_smem_bytes();
        if (filter && !after && topk_filtered(global_key, n, k, out, warp_out, keys, whole(global_key, keys))) return;
        if (form & kTopkKeyByKey) {
#pragma unroll 16
            for (uint32_t i = threadIdx.x; i < n; i += 256) keys[i] = order_key(__ldcg(sc + i));
        } else {
            stage_order_keys(sc, n, keys);
        }
        __syncthreads();
        uint32_t* cand = keys + round_up4(n);
        if (filter && after && topk_filtered(staged_key, n, k, out, warp_out, cand, whole(staged_key, cand))) return;
        topk_staged(keys, n, k, out, early_exit, warp_out);
        return;
    }
    if (filter && stage_max) {
        // a row longer than the staging: its chunks of stage_max keys staged in turn, each
        // walked there (every key read from L2 once, 16 bytes a copy), the candidates after them
        uint32_t* cand = keys + round_up4(stage_max);
        auto chunks = [&](TopkCut t) {
            uint32_t c = 0;
            for (uint32_t c0 = 0; c0 < n && c <= kTopkFilterCap; c0 += stage_max) {
                const uint32_t m = min(stage_max, n - c0);
                __syncthreads();   // the last chunk's walk is done with its keys
                stage_order_keys(sc + c0, m, keys);
                __syncthreads();
                c += filter_walk(staged_key, m, c0, t, cand, c);
            }
            return c;
        };
        if (topk_filtered(global_key, n, k, out, warp_out, cand, chunks)) return;
    } else if (filter && topk_filtered(global_key, n, k, out, warp_out, keys, whole(global_key, keys))) {
        return;
    }
    topk_radix<4>(global_key, TopkSameIndex{}, n, k, out, early_exit, warp_out);
}

__global__ void __launch_bounds__(256) topk_select_kernel(const float* score, uint64_t ld, const DevRow* rows,
                                                          uint32_t ratio, uint32_t k, uint32_t* sel,
                                                          uint32_t stage_max, uint32_t form) {
    pdl_begin();
    const uint32_t r = blockIdx.x;
    const uint64_t n = uint64_t(rows[r].pos + 1) / ratio;
    if (n <= k) return;
    topk_row(score + uint64_t(r) * ld, uint32_t(n), k, sel + uint64_t(r) * k, stage_max, form, true);
}

__global__ void __launch_bounds__(256) topk_plain_kernel(const float* score, uint32_t n, uint32_t k, uint32_t* sel,
                                                         uint32_t stage_max, uint32_t form) {
    pdl_begin();
    topk_row(score, n, k, sel, stage_max, form, true);
}

// ---- the top-k of rows up to 32K keys with 1,024 threads, the keys in registers -------------
// (DSV4_TOPK_REG; after the designs of the DeepSeek V3.2 / V4 indexer top-k kernels in SGLang and
// vLLM: a thousand threads a row, the row read from global memory once, a wide first digit.)
// Thread t holds keys [t·e, t·e + e) of the row (e = n / 1,024 rounded up to 4, at most E) in
// registers; three radix passes on digits of 12, 10 and 10 bits (bits 31-20, 19-10, 9-0: the
// 32-bit select in three passes where topk_threshold takes four, and fewer keys a bin in the
// first) with one shared atomic a key that matches the prefix so far, a block scan over the
// bins (4 a thread in the first pass) to find the digit where the count of larger keys reaches
// what remains, and the same early exit; then topk_write_by_threads' slots (every key above
// the cut, then the lowest-index keys equal to it, in index order) from the registers, each
// thread's segment contiguous: the same bytes as topk_row.
// E = 16 keys a thread for matrices up to 16,384 wide, 32 up to 32,768 (kRegMax).
// CL > 1: a row by a cluster of CL blocks (32,768 keys each: up to 262,144 keys with 8, a 1M
// context's row), block c holding keys [c·1,024·e, (c + 1)·1,024·e): each pass's histogram is
// the sum of the blocks' (read over distributed shared memory, in two buffers taken in turn so
// one cluster barrier a pass keeps every read of a buffer ahead of its next clearing), so
// every block picks the same digit; the slots add the totals of the blocks before it.
constexpr uint32_t kRegThreads = 1024, kRegMax = kRegThreads * 32;
constexpr uint32_t kRegClusterMax = 8, kRegClusterRows = 64;   // (rows of a round: a cluster a row)

template <uint32_t E, uint32_t CL = 1>
__global__ void __launch_bounds__(kRegThreads, 1) topk_reg_kernel(const float* score, uint64_t ld, const DevRow* rows,
                                                               uint32_t ratio, uint32_t n_plain, uint32_t k,
                                                               uint32_t* sel) {
    static_assert(CL >= 1 && CL <= kRegClusterMax && (CL == 1 || E == 32), "clusters of blocks of 32,768 keys");
    pdl_begin();
    constexpr uint32_t NT = kRegThreads;
    __shared__ uint32_t hist[CL > 1 ? 2 : 1][4096];
    __shared__ uint32_t s_prefix, s_remaining, s_all, s_tot[2];
    const uint32_t rank = blockIdx.x % CL, r = blockIdx.x / CL, tid = threadIdx.x;
    const uint32_t n = rows ? uint32_t(uint64_t(rows[r].pos + 1) / ratio) : n_plain;
    if (n <= k) return;   // (rows: nothing to select; the same for every thread of the cluster)
    const float* sc = score + uint64_t(r) * ld;
    uint32_t* out = sel + uint64_t(r) * k;
    const uint32_t e = round_up4((n + CL * NT - 1) / (CL * NT));   // keys a thread (<= E: the launcher checks n)
    const uint32_t lo = min(n, (rank * NT + tid) * e), cnt = min(n - lo, e);
    uint32_t u[E];
    const bool vec = (reinterpret_cast<uintptr_t>(sc) & 15) == 0;
#pragma unroll
    for (uint32_t j = 0; j < E; j += 4) {
        if (vec && j + 4 <= cnt) {
            const float4 v = *reinterpret_cast<const float4*>(sc + lo + j);
            u[j] = order_key(v.x), u[j + 1] = order_key(v.y), u[j + 2] = order_key(v.z), u[j + 3] = order_key(v.w);
        } else {
#pragma unroll
            for (uint32_t i = j; i < j + 4; ++i) u[i] = i < cnt ? order_key(sc[lo + i]) : 0u;
        }
    }
    if (tid == 0) s_remaining = k, s_all = 0;
    uint32_t prefix = 0, mask = 0;
    namespace cg = cooperative_groups;
    // the passes: (shift, bits) = (20, 12), (10, 10), (0, 10)
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 20 : pass == 1 ? 10 : 0;
        const uint32_t nb = pass == 0 ? 4096u : 1024u, dm = nb - 1;
        uint32_t* hb = hist[CL > 1 ? pass & 1 : 0];
        for (uint32_t b = tid; b < nb; b += NT) hb[b] = 0;
        __syncthreads();   // (also: s_all, s_prefix of the last pass read by every thread)
        if (s_all) break;
#pragma unroll
        for (uint32_t j = 0; j < E; ++j)
            if (j < cnt && (u[j] & mask) == prefix) atomicAdd(&hb[(u[j] >> shift) & dm], 1u);
        if constexpr (CL > 1) cg::this_cluster().sync();   // every block's histogram complete
        else __syncthreads();
        // thread t's bins: 4t .. 4t + 3 (the first pass's 4,096) or t, summed over the cluster
        const uint32_t per = nb / NT;
        uint32_t h[4] = {0, 0, 0, 0};
#pragma unroll 1
        for (uint32_t c = 0; c < CL; ++c) {   // (CL = 1: this block's own)
            const uint32_t* hc = (CL > 1 ? cg::this_cluster().map_shared_rank(hb, c) : hb) + per * tid;
#pragma unroll
            for (uint32_t i = 0; i < 4; ++i)
                if (i < per) h[i] += hc[i];
        }
        radix_pick_digit<NT>(h, per, shift, prefix, &s_prefix, &s_remaining, &s_all);
        __syncthreads();
        prefix = s_prefix;
        mask |= dm << shift;
    }
    __syncthreads();   // (the last pass's s_remaining)
    const uint32_t T = prefix, need_eq = s_remaining;
    // the selection's slots, as topk_write_by_threads
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (uint32_t j = 0; j < E; ++j)
        if (j < cnt) {
            const uint32_t v = u[j] & mask;
            gt += v > T;
            eq += v == T;
        }
    uint32_t tot;
    const uint32_t ex = block_excl_scan<NT>(gt | (eq << 16), &tot);   // (a block's 32,768 keys: 16 bits each)
    uint32_t gt_b = ex & 0xffffu, eq_b = ex >> 16;
    if constexpr (CL > 1) {   // the keys of the blocks before this one come first
        if (tid == 0) s_tot[0] = tot & 0xffffu, s_tot[1] = tot >> 16;
        cg::this_cluster().sync();
        for (uint32_t c = 0; c < rank; ++c) {
            const uint32_t* o = cg::this_cluster().map_shared_rank(s_tot, c);
            gt_b += o[0];
            eq_b += o[1];
        }
    }
#pragma unroll
    for (uint32_t j = 0; j < E; ++j)
        if (j < cnt) {
            const uint32_t v = u[j] & mask;
            if (v > T) {
                out[gt_b + min(eq_b, need_eq)] = lo + j;
                ++gt_b;
            } else if (v == T) {
                if (eq_b < need_eq) out[gt_b + eq_b] = lo + j;
                ++eq_b;
            }
        }
    if constexpr (CL > 1) cg::this_cluster().sync();   // no block leaves while the others read its shared memory
}

// indexer_q_prep's steps on one head of 128 held by a warp (lane: dims 4 lane .. 4 lane + 3):
// rope_block (the tail pairs, angles cs_s / sn_s), then (official) hadamard_block's butterflies
// (strides 1, 2 inside the lane, 4..64 across lanes), its scale, and sim_block's FP4 (a block
// of 32 dims = 8 lanes). The same operations in the same order, so the same bits
// (indexer_fused_kernel, indexer_q_prep_warp_kernel).
__device__ __forceinline__ void iq_prep_lane(float (&x)[4], uint32_t lane, const float* cs_s, const float* sn_s,
                                             uint32_t tail0, bool official) {
    constexpr uint32_t DI = 128;
#pragma unroll
    for (uint32_t e = 0; e < 4; e += 2) {
        const uint32_t d = 4 * lane + e;
        if (d >= tail0) {
            const uint32_t i = (d - tail0) / 2;
            const float c = cs_s[i], s = sn_s[i];
            const float x0 = x[e], x1 = x[e + 1];
            x[e] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            x[e + 1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
    }
    if (!official) return;
    {   // stride 1
        const float a0 = x[0], b0 = x[1], a1 = x[2], b1 = x[3];
        x[0] = a0 + b0, x[1] = a0 - b0, x[2] = a1 + b1, x[3] = a1 - b1;
    }
    {   // stride 2
        const float a0 = x[0], b0 = x[2], a1 = x[1], b1 = x[3];
        x[0] = a0 + b0, x[2] = a0 - b0, x[1] = a1 + b1, x[3] = a1 - b1;
    }
#pragma unroll
    for (uint32_t m = 1; m < 32; m <<= 1) {   // stride 4m: partner lane ^ m
        const bool upper = lane & m;
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) {
            const float o = __shfl_xor_sync(0xffffffffu, x[e], m);
            x[e] = upper ? o - x[e] : x[e] + o;
        }
    }
    const float hs = float(1.0 / sqrt(double(DI)));
#pragma unroll
    for (uint32_t e = 0; e < 4; ++e) x[e] *= hs;
    const float qmax = 6.0f, floor_ = 7.052966104933725e-38f;
    float amax = 0.0f;
#pragma unroll
    for (uint32_t e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(x[e]));
    for (uint32_t m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    amax = fmaxf(amax, floor_);
    const float scale = pow2_ceil_d(amax / qmax);
#pragma unroll
    for (uint32_t e = 0; e < 4; ++e) {
        const float v = fminf(fmaxf(x[e] / scale, -qmax), qmax);
        x[e] = e2m1_round_d(v) * scale;
    }
}

// indexer_q_prep for heads of 128: a block (8 warps) a row (decode rows: gridDim.y blocks a
// row, a head a warp), a warp a head at a time, in registers (iq_prep_lane), the row's RoPE
// angles made once a block. indexer_q_prep_kernel (a block a
// head: its RoPE angles again for every head, and nine block barriers for the Hadamard
// butterflies in shared memory) took 275 us for a 2,048-row round (run 116).
__global__ void __launch_bounds__(256) indexer_q_prep_warp_kernel(float* qi, float* wi, uint32_t NH, uint32_t n_rot,
                                                                  const double* inv_freq, const DevRow* rows,
                                                                  bool official, float wscale, uint16_t* qb,
                                                                  bool keep_qi) {
    pdl_begin();
    constexpr uint32_t DI = 128;
    __shared__ float cs_s[DI / 2], sn_s[DI / 2];
    const uint32_t r = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    // the row's heads h0 .. h1 - 1 (a decode row's heads over gridDim.y blocks: one a warp)
    const uint32_t hpb = (NH + gridDim.y - 1) / gridDim.y, h0 = blockIdx.y * hpb, h1 = min(NH, h0 + hpb);
    const uint32_t half = n_rot / 2;
    if (t < 2 * half) {   // (as rope_block's rope_angle: cos on the first half of the threads, sin on the second)
        const uint32_t i = t < half ? t : t - half;
        const double th = double(rows[r].pos) * inv_freq[i];
        if (t < half) cs_s[i] = float(cos(th));
        else sn_s[i] = float(sin(th));
    }
    for (uint32_t h = h0 + t; h < h1; h += blockDim.x) wi[uint64_t(r) * NH + h] *= wscale;
    __syncthreads();
    for (uint32_t h = h0 + w; h < h1; h += blockDim.x / 32) {
        float4* p = reinterpret_cast<float4*>(qi + (uint64_t(r) * NH + h) * DI) + lane;
        const float4 v = *p;
        float x[4] = {v.x, v.y, v.z, v.w};
        iq_prep_lane(x, lane, cs_s, sn_s, DI - n_rot, official);
        if (qb) reinterpret_cast<uint2*>(qb + (uint64_t(r) * NH + h) * DI)[lane] = bf16x4(make_float4(x[0], x[1], x[2], x[3]));
        if (!qb || keep_qi) *p = make_float4(x[0], x[1], x[2], x[3]);
    }
}

__global__ void __launch_bounds__(kFusedThreads)
    indexer_fused_kernel(const float* qi, const float* wi, uint32_t n_rot, const double* inv_freq,
                         const DevRow* rows, bool official, float wscale, const DevLayerKV* lkv, uint32_t n_layer,
                         uint32_t il, uint32_t top_k, float* score, uint64_t ld, uint32_t* count, uint32_t* sel,
                         bool early, uint32_t topk_form, uint32_t tiles) {
    // early (DSV4_ATTN_EARLY): before the programmatic-launch wait, the row's position and KV
    // descriptor (uploaded before the step's kernels), the RoPE angles and L2 prefetches of
    // the block's compressed index rows (a hint: a row this step's compressor emits is read
    // after the wait like all of them); the top-k's passes stop early (topk_staged). The same
    // bits.
    // tiles (DSV4_IDX_FUSED_TILES): a block scores `tiles` consecutive tiles of kScoreTile keys
    // one after another with the queries it prepared once (every block prepares all 64 heads:
    // at 16K keys a tile a block is 1,024 blocks preparing them, run 126: 91.9 us a row). Each
    // tile's steps are the one-tile block's, so the same bits.
    pdl_launch();
    if (!early) pdl_wait();
    extern __shared__ __align__(16) float sm[];
    constexpr uint32_t NH = kFusedNH, DI = kFusedDI, P = kFusedP, D4 = DI / 4, HPW = NH / (kFusedThreads / 32);
    __shared__ float cs_s[DI / 2], sn_s[DI / 2];
    const uint32_t r = blockIdx.y;
    const int64_t pos = rows[r].pos;
    const uint64_t n_vis = uint64_t(pos + 1) / 4;
    const uint64_t cb = uint64_t(blockIdx.x) * tiles * kScoreTile;   // the block's first key
    if (n_vis <= top_k || cb >= n_vis) {
        if (early) pdl_wait();   // (its end still follows the kernels before it)
        return;
    }
    float* q_s = sm;                      // [NH][P]
    float* k_s = sm + NH * P;             // [kScoreTile][P]
    float* w_s = k_s + kScoreTile * P;    // [NH]
    float* dot_s = w_s + NH;              // [kScoreTile][NH]
    const uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = kFusedThreads / 32;
    const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
    const uint32_t nb = uint32_t(min(n_vis - cb, uint64_t(tiles) * kScoreTile));   // the block's keys
    const uint32_t half = n_rot / 2;
    auto angles = [&] {   // rope_block's angles: cos on the first half of the threads, sin on the second
        if (tid < 2 * half) {
            const uint32_t i = tid < half ? tid : tid - half;
            const double th = double(pos) * inv_freq[i];
            if (tid < half) cs_s[i] = float(cos(th));
            else sn_s[i] = float(sin(th));
        }
    };
    constexpr uint32_t lines = DI * sizeof(float) / 128;   // 128-byte lines a row
    if (early) {
        for (uint32_t i = tid; i < nb * lines; i += kFusedThreads)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(
                L.index + (cb + i / lines) * L.index_stride) + 128 * (i % lines)));
        angles();
        pdl_wait();
    }
    // Loads first (this warp's heads into registers: lane holds dims 4*lane .. 4*lane+3),
    // then the RoPE angles' double cos/sin, whose latency runs under them.
    float4 qv[HPW];
    const float4* q4 = reinterpret_cast<const float4*>(qi + uint64_t(r) * NH * DI);
#pragma unroll
    for (uint32_t j = 0; j < HPW; ++j) qv[j] = q4[(w * HPW + j) * D4 + lane];
    auto stage_tile = [&](uint64_t c0, uint32_t nt) {
        for (uint32_t i = tid; i < nt * D4; i += kFusedThreads) {
            const float4 v = reinterpret_cast<const float4*>(L.index + (c0 + i / D4) * L.index_stride)[i % D4];
            *reinterpret_cast<float4*>(k_s + (i / D4) * P + (i % D4) * 4) = v;
        }
    };
    stage_tile(cb, min(nb, kScoreTile));
    if (tid < NH) w_s[tid] = wi[uint64_t(r) * NH + tid] * wscale;   // indexer_q_prep's wi *= wscale
    if (!early) angles();
    __syncthreads();
    // indexer_q_prep per head, one warp per head at a time (iq_prep_lane)
    const uint32_t tail0 = DI - n_rot;
#pragma unroll
    for (uint32_t j = 0; j < HPW; ++j) {
        float x[4] = {qv[j].x, qv[j].y, qv[j].z, qv[j].w};
        iq_prep_lane(x, lane, cs_s, sn_s, tail0, official);
        *reinterpret_cast<float4*>(q_s + (w * HPW + j) * P + 4 * lane) = make_float4(x[0], x[1], x[2], x[3]);
    }
    __syncthreads();
    for (uint32_t t0 = 0; t0 < nb; t0 += kScoreTile) {
        const uint64_t c0 = cb + t0;
        const uint32_t nt = min(nb - t0, kScoreTile);
        if (t0 > 0) {   // the next tile's keys (every warp is done with the last one's)
            stage_tile(c0, nt);
            __syncthreads();
        }
        // indexer_scores' dots (each in dimension order, one fmaf per dimension): thread
        // (head h = tid % 64, rows 4g .. 4g+3 with g = tid / 64) keeps four chains; a warp reads
        // 32 heads' q (float4, conflict-free at the row pitch of 132) and four broadcast k rows
        // per four dimensions, a quarter of a warp-per-row loop's shared-memory traffic.
        {
            const uint32_t h = tid % NH, j0 = (tid / NH) * (kScoreTile / (kFusedThreads / NH));
            constexpr uint32_t RPT = kScoreTile / (kFusedThreads / NH);   // rows per thread: 4
            const float4* qh = reinterpret_cast<const float4*>(q_s + h * P);
            float acc[RPT];
#pragma unroll
            for (uint32_t t = 0; t < RPT; ++t) acc[t] = 0.0f;
#pragma unroll 4
            for (uint32_t d4 = 0; d4 < D4; ++d4) {
                const float4 qv = qh[d4];
#pragma unroll
                for (uint32_t t = 0; t < RPT; ++t) {
                    const float4 kv = reinterpret_cast<const float4*>(k_s + (j0 + t) * P)[d4];
                    acc[t] = fmaf(qv.x, kv.x, acc[t]);
                    acc[t] = fmaf(qv.y, kv.y, acc[t]);
                    acc[t] = fmaf(qv.z, kv.z, acc[t]);
                    acc[t] = fmaf(qv.w, kv.w, acc[t]);
                }
            }
#pragma unroll
            for (uint32_t t = 0; t < RPT; ++t) dot_s[(j0 + t) * NH + h] = acc[t];   // rows >= nt: unused
        }
        __syncthreads();
        // indexer_scores' sums: lane adds heads lane and lane + 32 (in that order), then the warp sum.
        for (uint32_t j = w; j < nt; j += nw) {
            float sc = 0;
            sc += fmaxf(0.0f, dot_s[j * NH + lane]) * w_s[lane];
            sc += fmaxf(0.0f, dot_s[j * NH + lane + 32]) * w_s[lane + 32];
            sc = warp_sum(sc);
            if (lane == 0) score[uint64_t(r) * ld + c0 + j] = sc;
        }
        if (t0 + kScoreTile < nb) __syncthreads();   // (the sums read dot_s; the next tile's dots write it)
    }
    // The row's last block to finish selects.
    if (!last_block_done(&count[r], uint32_t((n_vis + tiles * kScoreTile - 1) / (tiles * kScoreTile)))) return;
    // (its keys staged where q_s and k_s were: every key fits, max_vis floats at least)
    topk_row(score + uint64_t(r) * ld, uint32_t(n_vis), top_k, sel + uint64_t(r) * top_k, uint32_t(n_vis), topk_form,
             early);
}

// ---- sink attention (§5.12), split over keys (flash-decoding) -----------------------------
// Every head attends to the same keys (K = V = one latent row per key), so a work item of
// attn_split_kernel is kAttnHB heads of one row over one split of that row's keys: each
// staged key is used for kAttnHB dot products and kAttnHB weighted sums, and a decoded row
// still makes (n_head / kAttnHB) x splits items for the GPU. The splits' partials (max,
// denominator, unnormalised output) are merged per (row, head) by attn_merge_kernel, which
// adds the sink, normalises and undoes the RoPE.
// The split count and boundaries are a function of the row's own key count only, and the
// order of every floating-point operation is fixed, so a row's output is bit-identical
// whether it is computed alone (decode), in a prefill batch, or beside other sessions.
__device__ __forceinline__ void fma4(float a, const float4& k, float4& acc) {
    acc.x = fmaf(a, k.x, acc.x);
    acc.y = fmaf(a, k.y, acc.y);
    acc.z = fmaf(a, k.z, acc.z);
    acc.w = fmaf(a, k.w, acc.w);
}

// One tile's weighted sum for 8 heads (thread = float4 column col, keys of parity par): each
// head's sum scaled by its correction (corr[h]), then acc[h] += p[j][h]·k[j] for the keys
// j = par, par + 2, ... < nt, the 8 weights of key j at p + j * p_stride. Shared by both
// FP32 split kernels: the same operations in the same order.
__device__ __forceinline__ void attn_weighted_tile(float4 (&acc)[kAttnHB], const float* corr, const float* k_s,
                                                   uint32_t DP, const float* p, uint32_t p_stride, uint32_t col,
                                                   uint32_t par, uint32_t nt) {
#pragma unroll
    for (uint32_t h = 0; h < kAttnHB; ++h) {
        const float c = corr[h];
        acc[h].x *= c;
        acc[h].y *= c;
        acc[h].z *= c;
        acc[h].w *= c;
    }
#pragma unroll 2
    for (uint32_t j = par; j < nt; j += 2) {
        const float4 kv = reinterpret_cast<const float4*>(k_s + j * DP)[col];
        const float4 pa = reinterpret_cast<const float4*>(p + j * p_stride)[0];
        const float4 pb = reinterpret_cast<const float4*>(p + j * p_stride)[1];
        fma4(pa.x, kv, acc[0]);
        fma4(pa.y, kv, acc[1]);
        fma4(pa.z, kv, acc[2]);
        fma4(pa.w, kv, acc[3]);
        fma4(pb.x, kv, acc[4]);
        fma4(pb.y, kv, acc[5]);
        fma4(pb.z, kv, acc[6]);
        fma4(pb.w, kv, acc[7]);
    }
}

// Stages keys t0 .. t0+nt-1 of a row (nt <= kAttnKT) into k_s rows of DP floats: eight threads
// a key. sel_r: the row's selections.
__device__ __forceinline__ void attn_stage_keys(float* k_s, uint32_t DP, const AttnKeys& ks, const DevLayerKV& L,
                                                const uint32_t* sel_r, uint64_t t0, uint32_t nt, uint32_t D) {
    const uint32_t j = threadIdx.x >> 3, sub = threadIdx.x & 7;
    if (j < nt) {
        const float* kp = attn_key_row(ks, L, sel_r, t0 + j, D);
        for (uint32_t u = sub; u < D / 4; u += 8) cp_async16(k_s + j * DP + 4 * u, kp + 4 * u);
    }
}

// A split's partial outputs of 8 heads: the odd keys' sums (par 1) pass through comb
// (kAttnHB * D4 float4) and are added to the even keys' (par 0), which store heads h < nh at
// part_o[(base + h * max_split) * D]. Every thread of the block calls it (one barrier).
__device__ __forceinline__ void attn_store_partials(const float4 (&acc)[kAttnHB], float4* comb, uint32_t D,
                                                    uint32_t col, uint32_t par, uint32_t nh, float* part_o,
                                                    uint64_t base, uint32_t max_split) {
    const uint32_t D4 = D / 4;
    if (par == 1 && col < D4) {
#pragma unroll
        for (uint32_t h = 0; h < kAttnHB; ++h) comb[h * D4 + col] = acc[h];
    }
    __syncthreads();
    if (par == 0 && col < D4) {
#pragma unroll
        for (uint32_t h = 0; h < kAttnHB; ++h) {
            if (h < nh) {
                const float4 b = comb[h * D4 + col];
                const float4 v = make_float4(acc[h].x + b.x, acc[h].y + b.y, acc[h].z + b.z, acc[h].w + b.w);
                reinterpret_cast<float4*>(part_o + (base + uint64_t(h) * max_split) * D)[col] = v;
            }
        }
    }
}

// Work item = (row r0 + rl, split, head group). Scratch rows are slice-relative (rl): partial
// (head h, split s) at part_o[((rl * n_head + h) * max_split + s) * D], its (max, sum) at
// part_ml[(rl * n_head + h) * max_split + s].
// The blocks are persistent: the grid is sized for the residency of the GPU, not for the
// slice's max_split splits per row (most of which short rows do not have, and empty blocks
// that exit at once still cost a launch each); every block first lists the slice's items
// (the rows' split counts, prefix-summed) and takes items blockIdx.x, + gridDim.x, ...
// An item's result does not depend on which block computes it.
// Per tile of up to kAttnKT keys: stage the keys (eight threads per key row), scores with a
// lane per (two keys, four heads) and the warps over slices of D (a fixed-order sum of the
// warps' parts), the online softmax with a warp per head, and the weighted sum with a thread per (float4
// column, key parity); the two parities are added in a fixed order at the end.
// loop_groups (many rows: prefill): an item is a (row, split) pair and takes its head groups
// one after another; a split of one tile (up to kAttnKT keys, the common case) then stages its
// keys once for all of them instead of once per group (8 times for 64 heads). Each (row,
// split, group) is computed with the same operations either way, so the partials are the
// same bits; decode keeps an item per group (its few rows need the items for parallelism).
// early (DSV4_ATTN_EARLY, decode): the work that reads no output of this step's kernels runs
// before the programmatic-launch wait, beside the kernels before it: the item list (rows and
// the KV descriptors are uploaded before the step's kernels, in stream order), the first
// item's key range, and L2 prefetches of those of its keys whose rows are known without the
// indexer's selection (the window ring, a ratio-128 layer's compressed rows). A prefetch is
// only a cache hint (a row rewritten by this step's KV store is read after the wait), so the
// arithmetic and its bits are the same.
__device__ __forceinline__ void attn_prefetch_keys(const AttnKeys& ks, const DevLayerKV& L, uint64_t t0, uint32_t nt,
                                                   uint32_t D) {
    const uint32_t j = threadIdx.x >> 3, sub = threadIdx.x & 7;
    if (j >= nt || (ks.use_sel && t0 + j >= ks.n_raw)) return;   // a selected row: not known yet
    const char* kp = reinterpret_cast<const char*>(attn_key_row_sel(ks, L, t0 + j, 0u, D));
    for (uint32_t o = 128 * sub; o < D * sizeof(float); o += 8 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(kp + o));
}

__global__ void __launch_bounds__(kAttnThreads, 2)
    attn_split_kernel(const float* q, uint32_t n_head, uint32_t D, uint32_t n_swa, uint32_t ratio,
                      uint32_t top_k, const uint32_t* sel, const DevRow* __restrict__ rows,
                      const DevLayerKV* __restrict__ lkv, uint32_t n_layer, uint32_t il, uint32_t r0,
                      uint32_t n_rows, uint32_t max_split, float* part_o, float2* part_ml,
                      bool loop_groups, bool early) {
    pdl_launch();
    bool waited = !early;
    if (!early) pdl_wait();
    extern __shared__ float4 sm4[];
    const uint32_t DP = D + kAttnPad, D4 = D / 4;
    float* q_s = reinterpret_cast<float*>(sm4);      // kAttnHB * DP
    float* k_s = q_s + kAttnHB * DP;                 // kAttnKT * DP
    float* red_s = k_s + kAttnKT * DP;               // kAttnWarps * kAttnHB * kAttnKT: score parts
    float* p_s = red_s + kAttnWarps * kAttnHB * kAttnKT;   // kAttnKT * kAttnHB: weights [key][head]
    __shared__ float corr_s[kAttnHB];
    __shared__ uint32_t incl_s[kAttnMaxSliceRows];   // splits of rows 0..i of the slice

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    attn_split_scan(incl_s, rows, r0, n_rows, n_swa, ratio, top_k);
    const uint32_t n_groups = (n_head + kAttnHB - 1) / kAttnHB, per_item = loop_groups ? n_groups : 1;
    const uint32_t n_items = incl_s[kAttnMaxSliceRows - 1] * (n_groups / per_item);
    const float scale = float(1.0 / sqrt(double(D)));
    const uint32_t col = threadIdx.x % (kAttnMaxD / 4), par = threadIdx.x / (kAttnMaxD / 4);

    for (uint32_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        // (row, split) pair P: the first row whose inclusive count exceeds P.
        const uint32_t P = loop_groups ? item : item / n_groups, g0 = loop_groups ? 0 : item % n_groups;
        const uint32_t rl = attn_pair_row(incl_s, P), r = r0 + rl, split = P - (rl ? incl_s[rl - 1] : 0);
        const int64_t p = rows[r].pos;
        const AttnKeys ks = attn_keys(p, n_swa, ratio, top_k);
        const uint32_t ns = attn_nsplit(ks.NK);
        const uint64_t kb = uint64_t(split) * ks.NK / ns, ke = uint64_t(split + 1) * ks.NK / ns;
        const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
        const bool one_tile = ke - kb <= kAttnKT;   // its keys stay in k_s across the groups
        if (!waited) {   // (early: the first item) its first tile's known key rows toward L2, then the wait
            attn_prefetch_keys(ks, L, kb, uint32_t(min(ke - kb, uint64_t(kAttnKT))), D);
            pdl_wait();
            waited = true;
        }
        bool staged = false;
        for (uint32_t grp = g0; grp < g0 + per_item; ++grp) {
            const uint32_t h0 = grp * kAttnHB, nh = min(kAttnHB, n_head - h0);

            // The group's queries (absent heads of a partial group: zeros, never written out).
            for (uint32_t i = threadIdx.x; i < kAttnHB * D4; i += kAttnThreads) {
                const uint32_t h = i / D4, u = i % D4;
                if (h < nh) cp_async16(q_s + h * DP + 4 * u, q + (uint64_t(r) * n_head + h0 + h) * D + 4 * u);
                else *reinterpret_cast<float4*>(q_s + h * DP + 4 * u) = make_float4(0, 0, 0, 0);
            }

            float m_run = -INFINITY, l_run = 0.0f;   // warp w: running max and sum of head w
            float4 acc[kAttnHB];
#pragma unroll
            for (uint32_t h = 0; h < kAttnHB; ++h) acc[h] = make_float4(0, 0, 0, 0);

            for (uint64_t t0 = kb; t0 < ke; t0 += kAttnKT) {
                const uint32_t nt = uint32_t(ke - t0 < kAttnKT ? ke - t0 : kAttnKT);
                if (!(one_tile && staged)) attn_stage_keys(k_s, DP, ks, L, sel + uint64_t(r) * top_k, t0, nt, D);
                staged = true;
                cp_async_wait_all();
                __syncthreads();

                {   // scores: lane = (jp, hh) takes keys jp and jp+16 of heads 4hh..4hh+3, warp w the
                    // float4 columns w, w+8, ... Per column a warp reads 16 key float4 twice and 2
                    // query float4 four times (the padded rows put them in distinct banks): eight
                    // shared-memory wavefronts for 32 FMAs a lane, as fast as the FMAs go.
                    const uint32_t jp = lane & 15, hh = lane >> 4;
                    float sc[kAttnHB];   // [key jp, jp+16][head 4hh + i]
#pragma unroll
                    for (uint32_t i = 0; i < kAttnHB; ++i) sc[i] = 0.0f;
                    if (jp < nt) {   // key jp+16 may be past nt: computed from stale data, never used
                        const float4* ka = reinterpret_cast<const float4*>(k_s + jp * DP);
                        const float4* kb4 = reinterpret_cast<const float4*>(k_s + (jp + 16) * DP);
                        const float* qh = q_s + hh * 4 * DP;
                        // (not unrolled, and the weighted sum twice at most: 128 registers, no spills)
#pragma unroll 1
                        for (uint32_t u = w; u < D4; u += kAttnWarps) {
                            const float4 a = ka[u], b = kb4[u];
#pragma unroll
                            for (uint32_t i = 0; i < 4; ++i) {
                                const float4 qv = reinterpret_cast<const float4*>(qh + i * DP)[u];
                                sc[i] = fmaf(qv.x, a.x, sc[i]);
                                sc[i] = fmaf(qv.y, a.y, sc[i]);
                                sc[i] = fmaf(qv.z, a.z, sc[i]);
                                sc[i] = fmaf(qv.w, a.w, sc[i]);
                                sc[4 + i] = fmaf(qv.x, b.x, sc[4 + i]);
                                sc[4 + i] = fmaf(qv.y, b.y, sc[4 + i]);
                                sc[4 + i] = fmaf(qv.z, b.z, sc[4 + i]);
                                sc[4 + i] = fmaf(qv.w, b.w, sc[4 + i]);
                            }
                        }
                    }
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) {
                        float* rs = red_s + (w * kAttnHB + 4 * hh + i) * kAttnKT;
                        rs[jp] = sc[i];
                        rs[jp + 16] = sc[4 + i];
                    }
                }
                __syncthreads();

                {   // online softmax: warp w = head w, lane = key
                    float sv = -INFINITY;
                    if (lane < nt) {
                        float a = 0.0f;
                        for (uint32_t i = 0; i < kAttnWarps; ++i) a += red_s[(i * kAttnHB + w) * kAttnKT + lane];
                        sv = a * scale;
                    }
                    const float nm = fmaxf(m_run, warp_max(sv));
                    const float corr = exp_cr(m_run - nm);   // 0 on the first tile (m_run = -inf)
                    const float e = lane < nt ? exp_cr(sv - nm) : 0.0f;
                    l_run = l_run * corr + warp_sum(e);
                    m_run = nm;
                    p_s[lane * kAttnHB + w] = e;
                    if (lane == 0) corr_s[w] = corr;
                }
                __syncthreads();

                // weighted sum: thread = (float4 column, keys of one parity)
                if (col < D4) attn_weighted_tile(acc, corr_s, k_s, DP, p_s, kAttnHB, col, par, nt);
                __syncthreads();   // the next tile overwrites k_s, red_s and p_s
            }

            // Odd keys' sums through shared memory (free now: k_s, or with loop_groups q_s, as k_s
            // may still hold the keys of the next group), added to the even keys' sums.
            // (kAttnHB * D4 float4 fit in either: <= kAttnHB * DP and kAttnKT * DP floats)
            float4* comb = reinterpret_cast<float4*>(loop_groups ? q_s : k_s);
            const uint64_t base = (uint64_t(rl) * n_head + h0) * max_split + split;
            attn_store_partials(acc, comb, D, col, par, nh, part_o, base, max_split);
            if (lane == 0 && w < nh) part_ml[base + uint64_t(w) * max_split] = make_float2(m_run, l_run);
            __syncthreads();   // the next group or item overwrites q_s (and k_s)
        }
    }
    if (!waited) pdl_wait();   // (a block without items: its end still follows the kernels before)
}

// attn_split_wide_kernel (DSV4_ATTN_LOOP=3, prefill slices of ratio-0 and ratio-4 layers,
// whose splits are one tile: at most n_swa + top_k <= 1,024 keys, so <= 32 a split): an item
// is a (row, split) pair for all the row's heads (a multiple of 8, at most 64), the split's
// keys and all the queries staged once. Every partial is made by attn_split_kernel's
// operations in its order, only by other threads:
// - scores: warp w takes heads 8w..8w+7 and does the eight column classes itself (in
//   attn_split_kernel, warp c made class c's sums and the softmax warp added them from
//   red_s in class order): lane = (keys kq, kq+8, kq+16, kq+24; heads 2hp, 2hp+1 of the
//   warp's eight) with kq = lane & 7, hp = lane >> 3; per class c the fmaf chain over the
//   float4 columns u = c, c + 8, ... from 0, then tot += part in class order from 0. Per
//   column a warp reads 4 key and 2 query float4 (6 shared-memory passes for 32 FMAs: 8
//   before), and red_s and its barrier are gone.
// - softmax per head: the max is exact in any order; warp_sum over the 32 keys (xor 16, 8, 4,
//   2, 1 over key lanes) is here xor 16 = t ^ 2 and xor 8 = t ^ 1 inside the thread (key j =
//   kq + 8t), then shuffles xor 4, 2, 1 over kq: the same tree (additions commute exactly).
// - weighted sum: thread = (float4 column, key parity) as before, the heads in 8 passes of 8;
//   the odd keys' sums go through q_s (free once the scores are made), a region per pass.
constexpr uint32_t kAttnWideMaxHeads = 64;

__global__ void __launch_bounds__(kAttnThreads, 1)
    attn_split_wide_kernel(const float* __restrict__ q, uint32_t n_head, uint32_t D, uint32_t n_swa, uint32_t ratio,
                           uint32_t top_k, const uint32_t* __restrict__ sel, const DevRow* __restrict__ rows,
                           const DevLayerKV* __restrict__ lkv, uint32_t n_layer, uint32_t il, uint32_t r0,
                           uint32_t n_rows, uint32_t max_split, float* __restrict__ part_o,
                           float2* __restrict__ part_ml) {
    pdl_begin();
    extern __shared__ float4 sm4[];
    const uint32_t DP = D + kAttnPad, D4 = D / 4, NH = n_head;
    float* q_s = reinterpret_cast<float*>(sm4);   // NH * DP; then the odd keys' sums
    float* k_s = q_s + NH * DP;                   // kAttnKT * DP
    float* p_s = k_s + kAttnKT * DP;              // kAttnKT * NH: weights [key][head]
    __shared__ float corr_s[kAttnWideMaxHeads];
    __shared__ uint32_t incl_s[kAttnMaxSliceRows];

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const uint32_t kq = lane & 7, hp = lane >> 3, hA = 8 * w + 2 * hp;   // this lane's keys and heads
    const bool scoring = 8 * w < NH;
    attn_split_scan(incl_s, rows, r0, n_rows, n_swa, ratio, top_k);
    const uint32_t n_items = incl_s[kAttnMaxSliceRows - 1];
    const float scale = float(1.0 / sqrt(double(D)));
    const uint32_t col = threadIdx.x % (kAttnMaxD / 4), par = threadIdx.x / (kAttnMaxD / 4);

    for (uint32_t item = blockIdx.x; item < n_items; item += gridDim.x) {
        const uint32_t rl = attn_pair_row(incl_s, item), r = r0 + rl, split = item - (rl ? incl_s[rl - 1] : 0);
        const int64_t p = rows[r].pos;
        const AttnKeys ks = attn_keys(p, n_swa, ratio, top_k);
        const uint32_t ns = attn_nsplit(ks.NK);
        const uint64_t kb = uint64_t(split) * ks.NK / ns, ke = uint64_t(split + 1) * ks.NK / ns;
        const uint32_t nt = uint32_t(ke - kb);   // <= kAttnKT (the launcher's condition)
        const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
        for (uint32_t i = threadIdx.x; i < NH * D4; i += kAttnThreads) {
            const uint32_t h = i / D4, u = i % D4;
            cp_async16(q_s + h * DP + 4 * u, q + (uint64_t(r) * NH + h) * D + 4 * u);
        }
        attn_stage_keys(k_s, DP, ks, L, sel + uint64_t(r) * top_k, kb, nt, D);
        cp_async_wait_all();
        __syncthreads();

        if (scoring) {
            float tot[4][2];
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t) tot[t][0] = tot[t][1] = 0.0f;
            const float4* qa = reinterpret_cast<const float4*>(q_s + hA * DP);
            const float4* qb = reinterpret_cast<const float4*>(q_s + (hA + 1) * DP);
            const float4* kr = reinterpret_cast<const float4*>(k_s + kq * DP);   // key kq + 8t: kr + 8t * DP / 4
#pragma unroll 1
            for (uint32_t c = 0; c < kAttnWarps; ++c) {
                float part[4][2];
#pragma unroll
                for (uint32_t t = 0; t < 4; ++t) part[t][0] = part[t][1] = 0.0f;
#pragma unroll 2
                for (uint32_t u = c; u < D4; u += kAttnWarps) {
                    const float4 xa = qa[u], xb = qb[u];
#pragma unroll
                    for (uint32_t t = 0; t < 4; ++t) {   // keys past nt: stale rows, never used
                        const float4 kv = kr[t * 2 * DP + u];
                        part[t][0] = fmaf(xa.x, kv.x, part[t][0]);
                        part[t][0] = fmaf(xa.y, kv.y, part[t][0]);
                        part[t][0] = fmaf(xa.z, kv.z, part[t][0]);
                        part[t][0] = fmaf(xa.w, kv.w, part[t][0]);
                        part[t][1] = fmaf(xb.x, kv.x, part[t][1]);
                        part[t][1] = fmaf(xb.y, kv.y, part[t][1]);
                        part[t][1] = fmaf(xb.z, kv.z, part[t][1]);
                        part[t][1] = fmaf(xb.w, kv.w, part[t][1]);
                    }
                }
#pragma unroll
                for (uint32_t t = 0; t < 4; ++t) {
                    tot[t][0] += part[t][0];
                    tot[t][1] += part[t][1];
                }
            }
            // one tile per split: the running max and sum start at (-inf, 0) for every item
#pragma unroll
            for (uint32_t i = 0; i < 2; ++i) {
                const float m_run = -INFINITY, l_run = 0.0f;
                float sv[4], mx = -INFINITY;
#pragma unroll
                for (uint32_t t = 0; t < 4; ++t) {
                    sv[t] = kq + 8 * t < nt ? tot[t][i] * scale : -INFINITY;
                    mx = fmaxf(mx, sv[t]);
                }
                for (uint32_t o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float nm = fmaxf(m_run, mx);
                const float corr = exp_cr(m_run - nm);
                float e[4];
#pragma unroll
                for (uint32_t t = 0; t < 4; ++t) e[t] = kq + 8 * t < nt ? exp_cr(sv[t] - nm) : 0.0f;
                float sum = (e[0] + e[2]) + (e[1] + e[3]);
                for (uint32_t o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                const float l_new = l_run * corr + sum;
                const uint32_t h = hA + i;
#pragma unroll
                for (uint32_t t = 0; t < 4; ++t) p_s[(kq + 8 * t) * NH + h] = e[t];
                if (kq == 0) {
                    corr_s[h] = corr;
                    part_ml[(uint64_t(rl) * NH + h) * max_split + split] = make_float2(nm, l_new);
                }
            }
        }
        __syncthreads();   // weights and corrections visible; q_s free

        float4* comb = reinterpret_cast<float4*>(q_s);   // pass g: comb[(g * 8 + h) * D4 + col]
        for (uint32_t h0 = 0; h0 < NH; h0 += 8) {
            float4 acc[kAttnHB];
#pragma unroll
            for (uint32_t h = 0; h < kAttnHB; ++h) acc[h] = make_float4(0, 0, 0, 0);
            if (col < D4) attn_weighted_tile(acc, corr_s + h0, k_s, DP, p_s + h0, NH, col, par, nt);
            // this pass's region of comb: no reader of another pass
            attn_store_partials(acc, comb + h0 * D4, D, col, par, kAttnHB, part_o,
                                (uint64_t(rl) * NH + h0) * max_split + split, max_split);
        }
        __syncthreads();   // the next item overwrites q_s, k_s and p_s
    }
}

// Block = (row r0 + rl, head h): merges the row's splits in split order with the sink,
// normalises, rotates the RoPE tail back by -pos and writes o[r][h].
__global__ void __launch_bounds__(kAttnMergeThreads)
    attn_merge_kernel(const float* __restrict__ sinks, uint32_t n_head, uint32_t D, uint32_t n_swa, uint32_t ratio,
                      uint32_t top_k, const DevRow* __restrict__ rows, uint32_t r0, uint32_t max_split,
                      const float* part_o, const float2* part_ml, uint32_t n_rot,
                      const double* __restrict__ inv_freq, float* o, int8_t* oq, float* od, bool early) {
    pdl_launch();
    if (!early) pdl_wait();
    __shared__ float4 v_s[kAttnMaxD / 4];
    __shared__ float w_s[kAttnMaxSplit];
    __shared__ float inv_s;
    const uint32_t rl = blockIdx.x / n_head, h = blockIdx.x % n_head, r = r0 + rl;
    const int64_t p = rows[r].pos;
    const uint32_t ns = attn_nsplit(attn_keys(p, n_swa, ratio, top_k).NK);
    // The inverse RoPE's angle of this thread's pair (where the block has a thread a pair) and
    // the sink (a weight): with early (DSV4_ATTN_EARLY) made before the wait, beside the split
    // kernel; rows are uploaded before the step's kernels. The same values either way.
    const bool pre = n_rot / 2 <= blockDim.x;
    float rc = 0.0f, rs = 0.0f;
    if (pre && threadIdx.x < n_rot / 2) rope_angle(p, inv_freq, threadIdx.x, true, rc, rs);
    const float sink = sinks[h];
    if (early) pdl_wait();
    const uint64_t base = (uint64_t(rl) * n_head + h) * max_split;
    const uint32_t D4 = D / 4, c = threadIdx.x;
    const float4* src = reinterpret_cast<const float4*>(part_o + base * D) + c;
    // The first splits' partials are requested before the weights are known (their loads
    // overlap the weights' exps); sixteen loads in flight per batch.
    constexpr uint32_t kBatch = 16;
    float4 v[kBatch];
#pragma unroll
    for (uint32_t i = 0; i < kBatch; ++i) v[i] = c < D4 && i < ns ? src[uint64_t(i) * D4] : make_float4(0, 0, 0, 0);
    if (threadIdx.x < 32) {   // one warp: lane s = split s (ns <= 32)
        const uint32_t s = threadIdx.x;
        const float2 ml = s < ns ? part_ml[base + s] : make_float2(-INFINITY, 0.0f);
        const float M = fmaxf(sink, warp_max(ml.x));
        const float ws = s < ns ? exp_cr(ml.x - M) : 0.0f;
        const float den = exp_cr(sink - M) + warp_sum(ml.y * ws);
        w_s[s] = ws;
        if (s == 0) inv_s = 1.0f / den;
    }
    __syncthreads();
    if (c < D4) {
        float4 acc = make_float4(0, 0, 0, 0);
        for (uint32_t s0 = 0; s0 < ns; s0 += kBatch) {   // in split order
            if (s0) {
#pragma unroll
                for (uint32_t i = 0; i < kBatch; ++i)
                    v[i] = s0 + i < ns ? src[uint64_t(s0 + i) * D4] : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (uint32_t i = 0; i < kBatch; ++i)
                if (s0 + i < ns) fma4(w_s[s0 + i], v[i], acc);
        }
        const float inv = inv_s;
        v_s[c] = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
    __syncthreads();
    float* x = reinterpret_cast<float*>(v_s);
    if (pre) {   // rope_block's rotation with the angles made above
        if (threadIdx.x < n_rot / 2) rope_pair(x + (D - n_rot), threadIdx.x, rc, rs);
        __syncthreads();
    } else {
        rope_block(x, D, n_rot, p, inv_freq, true);
    }
    float* oh = o + (uint64_t(r) * n_head + h) * D;
    if (c < D4) reinterpret_cast<float4*>(oh)[c] = v_s[c];
    if (oq && c < D4) {
        // The output projection's Q8_0 codes of this head (the launcher checks D % 32 == 0 and
        // whole warps)
        attn_store_codes(v_s[c], c, (uint64_t(r) * n_head + h) * D, oq, od);
    }
}

// Scratch of the attention splits, shared by every caller: the backends run one forward pass
// at a time and synchronise their stream at its end, so no two launches overlap on it.
// Grow-only, and a replaced buffer is kept rather than freed: a CUDA graph captured earlier
// (by this or another backend) still holds its address. Its size depends on R, n_head, D and
// the layer kind only, never on positions, so graph replays whose positions advance still fit.
// Bytes per slice of rows: DSV4_ATTN_SCRATCH_MB (144 by default; a smaller slice keeps the
// partials in L2 between the split and the merge kernels, at the price of more launches).
size_t attn_scratch_budget() {
    static const size_t mb = size_t(std::clamp(env_int("DSV4_ATTN_SCRATCH_MB", 144), 4, 4096));
    return mb << 20;
}
std::mutex g_attn_mu;
void* g_attn_scratch = nullptr;
size_t g_attn_scratch_bytes = 0;
std::vector<void*> g_attn_retired;

void* attn_scratch(size_t need, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_attn_mu);
    if (need <= g_attn_scratch_bytes) return g_attn_scratch;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(s, &st), "attention scratch");
    if (st != cudaStreamCaptureStatusNone)
        throw_too_small("attention scratch (bytes; it cannot grow while a CUDA graph is captured, so this round "
                        "should have run eagerly first)",
                        need, g_attn_scratch_bytes);
    const size_t bytes = std::max(need, std::min(2 * g_attn_scratch_bytes, attn_scratch_budget()));
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "attention scratch");
    if (g_attn_scratch) g_attn_retired.push_back(g_attn_scratch);
    g_attn_scratch = p;
    g_attn_scratch_bytes = bytes;
    return p;
}

__global__ void router_kernel(RouterArgs a) {
    pdl_begin();
    extern __shared__ float router_smem[];   // router_scratch_bytes(NE, K)
    router_row(a, blockIdx.x, router_scratch(router_smem, a.NE, a.K));
}

__global__ void swiglu_kernel(const float* g, const float* u, float* mid, uint32_t F, float clamp, const float* w,
                              uint64_t total) {
    pdl_begin();
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += uint64_t(gridDim.x) * blockDim.x) {
        float gv = g[i], uv = u[i];
        if (clamp > 1e-6f) {
            gv = fminf(gv, clamp);
            uv = fminf(fmaxf(uv, -clamp), clamp);
        }
        float v = __fmul_rn(silu_cr(gv), uv);
        if (w) v = __fmul_rn(v, w[i / F]);
        mid[i] = v;
    }
}


__global__ void sim_rows_kernel(float* x, uint32_t n, uint64_t stride, int kind) {
    pdl_begin();
    extern __shared__ float xs[];
    float* row = x + uint64_t(blockIdx.x) * stride;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) xs[i] = row[i];
    __syncthreads();
    if (kind == 0) sim_block(xs, n, 64, true);
    else if (kind == 1) sim_block(xs, n, 32, false);
    else hadamard_block(xs, n);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = xs[i];
}

__global__ void round_kernel(const float* x, float* y, uint64_t n, bool fp8) {
    pdl_begin();
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fp8 ? e4m3_round_d(x[i]) : e2m1_round_d(x[i]);
}

uint32_t threads_for(uint32_t n) { return n >= 256 ? 256 : n > 64 ? 128 : 64; }

// The query path's norms with their rows in registers (rms_norm_q8_0_reg_kernel,
// head_norm_rope_reg_kernel); DSV4_NORM_REG=0 (read once) keeps the kernels that walk the row
// in memory, for A/B; norm_reg_override (tests) wins. The same bits either way.
int g_norm_reg_override = -1;
bool norm_reg_on() {
    static const bool env = env_switch("DSV4_NORM_REG", true);
    return g_norm_reg_override >= 0 ? g_norm_reg_override != 0 : env;
}

}  // namespace

void rms_norm(const float* x, uint64_t x_stride, float* y, uint64_t y_stride, uint32_t R, uint32_t n, float eps,
              const float* w, cudaStream_t s) {
    if (!R) return;
    const bool vec = n >= 2048 && n % 4 == 0 && x_stride % 4 == 0 && y_stride % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(w) % 16 == 0;
    if (vec) rms_norm_vec_kernel<<<R, 1024, 0, s>>>(x, x_stride, y, y_stride, n, eps, w);
    else rms_norm_kernel<<<R, threads_for(n), 0, s>>>(x, x_stride, y, y_stride, n, eps, w);
    check_launch("rms_norm");
}

DevAct rms_norm_q8_0(float* x, uint64_t x_stride, uint32_t R, uint32_t n, float eps, const float* w,
                     const ActBuf& buf, cudaStream_t s) {
    if (n % 32) throw std::runtime_error("rms_norm_q8_0: row not a multiple of 32 values");
    if (uint64_t(R) * n > buf.cap_values) throw_too_small("activation buffer", uint64_t(R) * n, buf.cap_values);
    const DevAct a = codes_in(ActKind::Q8_0, n, buf);
    if (!R) return a;
    const bool reg = norm_reg_on();
    const uint32_t bd = threads_for(n), vpt = n % bd == 0 ? n / bd : 0;
    if (reg && vpt == 4) rms_norm_q8_0_reg_kernel<4><<<R, bd, 0, s>>>(x, x_stride, n, eps, w, buf.q, buf.d);
    else if (reg && vpt == 8) rms_norm_q8_0_reg_kernel<8><<<R, bd, 0, s>>>(x, x_stride, n, eps, w, buf.q, buf.d);
    else if (reg && vpt == 2) rms_norm_q8_0_reg_kernel<2><<<R, bd, 0, s>>>(x, x_stride, n, eps, w, buf.q, buf.d);
    else if (reg && vpt == 1) rms_norm_q8_0_reg_kernel<1><<<R, bd, 0, s>>>(x, x_stride, n, eps, w, buf.q, buf.d);
    else rms_norm_q8_0_kernel<<<R, bd, 0, s>>>(x, x_stride, n, eps, w, buf.q, buf.d);
    check_launch("rms_norm_q8_0");
    return a;
}

bool hc_pre_norm_fusable(uint32_t H, uint32_t E, const float* X, const float* xn, const float* norm_w) {
    return E == 4 * 1024 && H * H <= 32 && reinterpret_cast<uintptr_t>(X) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(xn) % 16 == 0 && reinterpret_cast<uintptr_t>(norm_w) % 16 == 0;
}

void hc_pre_finish(const float* mix, const float* scale, const float* base, const float* X, uint32_t R, uint32_t H,
                   uint32_t E, float eps, uint32_t iters, float* post, float* comb, float* x_sub, cudaStream_t s,
                   const float* norm_w, float rms_eps, float* xn, bool with_sinkhorn) {
    if (!R) return;
    if (xn && !hc_pre_norm_fusable(H, E, X, xn, norm_w)) throw std::runtime_error("hc_pre_finish: norm not fusable");
    hc_pre_finish_kernel<<<R, 1024, 0, s>>>(mix, scale, base, X, H, E, eps, iters, post, comb, x_sub, norm_w,
                                            rms_eps, xn, with_sinkhorn);
    check_launch("hc_pre_finish");
}

bool hc_pre_spread_ok(uint32_t H, uint32_t E, const DevWeight& fn, const float* X, const float* xn,
                      const float* norm_w) {
    const uint32_t elt = fn.type == T_F32 ? 4 : (fn.type == T_F16 || fn.type == T_BF16) ? 2 : 0;
    auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
    return H == 4 && elt && E % 4 == 0 && E && fn.K == uint64_t(H) * E && fn.rows == 2 * H + H * H && fn.data &&
           al(fn.data, 4 * elt) && fn.row_bytes % (4 * elt) == 0 && al(X, 16) && al(xn, 16) && al(norm_w, 16);
}

uint64_t hc_pre_partials(uint32_t R, uint32_t H, uint32_t E) {
    const uint64_t NB = (E / 4 + kHcQuads - 1) / kHcQuads;
    return uint64_t(R) * NB * (2 * H + H * H + H * (H + 1) / 2);
}

// A counter per row: enough for any rows-per-block choice of hc_pre_mix.
uint32_t hc_pre_counters(uint32_t R) { return R; }

namespace {
// Rows per block of hc_mix_kernel: 1 for a single row (decode: no registers for rows it does
// not have), else DSV4_HC_ROWS (1, 2 or 4; 4 by default); hc_mix_rows_override (tests) wins.
// A row's arithmetic does not depend on it.
int g_hc_rows_override = -1;
uint32_t hc_mix_rows(uint32_t R) {
    static const int env = env_int("DSV4_HC_ROWS", int(kHcRows));
    const int v = g_hc_rows_override > 0 ? g_hc_rows_override : env;
    if (R == 1 && g_hc_rows_override <= 0) return 1;
    return v >= 4 ? 4 : v >= 2 ? 2 : 1;
}

// Whether hc_pre_mix takes hc_mix_tile_kernel: rounds of kHcTileRows rows or more without a
// folded post, unless DSV4_HC_TILE=0 (run 60, 43 layers: prefill 2,061 and 2,059 tok/s
// against 2,051 and 2,051 with hc_mix_kernel, the same bits), or hc_mix_tile_override (tests:
// any round; a rows override selects hc_mix_kernel). Its shared memory limit is raised once,
// outside a capture; a captured round before that takes hc_mix_kernel (the same bits).
int g_hc_tile_override = -1;
bool hc_mix_tile_on(uint32_t R) {
    static const bool env = env_switch("DSV4_HC_TILE", true);
    return g_hc_tile_override >= 0 ? g_hc_tile_override != 0 : env && g_hc_rows_override <= 0 && R >= kHcTileRows;
}
// DSV4_HC_POST_TILE=0: a pending post is applied by its own hc_post before the tile kernel
bool hc_post_tile_on() {
    static const bool env = env_switch("DSV4_HC_POST_TILE", true);
    return env;
}
bool hc_mix_tile(uint32_t R, const HcPostIn& pp, cudaStream_t s) {
    static bool raised = false;
    if (!hc_mix_tile_on(R) || (pp.active && !hc_post_tile_on())) return false;
    if (!raised) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return false;
        for (const void* k : {reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_F32>),
                              reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_F16>),
                              reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_BF16>),
                              reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_F32, float>),
                              reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_F16, float>),
                              reinterpret_cast<const void*>(hc_mix_tile_kernel<4, T_BF16, float>)})
            check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(hc_tile_smem<4>())),
                  "hc_pre_mix (tiles) shared memory");
        raised = true;
    }
    return true;
}

// The tile kernel's sums in floats: hc_mix_fast_override (tests), else DSV4_HC_FAST (0 / 1),
// else the round's (fast_prefill_round).
int g_hc_fast_override = -1;
bool hc_mix_fast() {
    static const int env = env_int("DSV4_HC_FAST", -1);
    return fast_part(g_hc_fast_override, env);
}
}  // namespace

bool hc_mix_tile_folds_post(uint32_t R) { return hc_mix_tile_on(R) && hc_post_tile_on(); }
void hc_mix_rows_override(int rows) { g_hc_rows_override = rows; }
void hc_mix_tile_override(int on) { g_hc_tile_override = on; }
void hc_mix_fast_override(int on) { g_hc_fast_override = on; }
void norm_reg_override(int on) { g_norm_reg_override = on; }

void hc_pre_mix(const DevWeight& fn, const float* X, const float* scale, const float* base, uint32_t R, uint32_t H,
                uint32_t E, float hc_eps, float rms_eps, float* mix, float* post, float* gate, double* part,
                uint32_t* count, cudaStream_t s, const HcPostIn& post_in) {
    if (!R) return;
    if (H != 4) throw std::runtime_error("hc_pre_mix: n_hc != 4");
    const uint32_t NB = (E / 4 + kHcQuads - 1) / kHcQuads;
    if (hc_mix_tile(R, post_in, s)) {
        auto tile = [&](auto kernel) {
            kernel<<<dim3(NB, (R + kHcTileRows - 1) / kHcTileRows), kHcTileThreads, hc_tile_smem<4>(), s>>>(
                fn.data, fn.row_bytes, X, R, E, part, post_in);
        };
        const bool fast = hc_mix_fast();
        switch (fn.type) {
            case T_F32: fast ? tile(hc_mix_tile_kernel<4, T_F32, float>) : tile(hc_mix_tile_kernel<4, T_F32>); break;
            case T_F16: fast ? tile(hc_mix_tile_kernel<4, T_F16, float>) : tile(hc_mix_tile_kernel<4, T_F16>); break;
            case T_BF16: fast ? tile(hc_mix_tile_kernel<4, T_BF16, float>) : tile(hc_mix_tile_kernel<4, T_BF16>); break;
            default: throw std::runtime_error("hc_pre_mix: fn type");
        }
        check_launch("hc_pre_mix (tiles)");
        hc_mix_finish_kernel<4><<<(R + kHcRows - 1) / kHcRows, kHcThreads, 0, s>>>(part, R, NB, E, scale, base, hc_eps,
                                                                                 rms_eps, mix, post, gate);
        check_launch("hc_pre_mix (finish)");
        return;
    }
    const uint32_t RB = hc_mix_rows(R);
    const dim3 grid(NB, (R + RB - 1) / RB);
    const bool early = pdl_early_weights();
    auto go = [&](auto kernel) {
        kernel<<<grid, kHcThreads, 0, s>>>(fn.data, fn.row_bytes, X, R, E, scale, base, hc_eps, rms_eps, mix, post,
                                           gate, part, count, early, post_in);
    };
    auto by_rows = [&](auto wt) {
        constexpr uint32_t T = decltype(wt)::value;
        if (RB == 1) go(hc_mix_kernel<4, T, 1>);
        else if (RB == 2) go(hc_mix_kernel<4, T, 2>);
        else go(hc_mix_kernel<4, T, kHcRows>);
    };
    switch (fn.type) {
        case T_F32: by_rows(std::integral_constant<uint32_t, T_F32>{}); break;
        case T_F16: by_rows(std::integral_constant<uint32_t, T_F16>{}); break;
        case T_BF16: by_rows(std::integral_constant<uint32_t, T_BF16>{}); break;
        default: throw std::runtime_error("hc_pre_mix: fn type");
    }
    check_launch("hc_pre_mix");
}

std::atomic<uint64_t> g_xn_half_calls{0};   // hc_pre_collapse with an FP16 xn (xn_f16_collapse_calls)
void hc_pre_collapse(const float* X, const float* gate, const float* norm_w, uint32_t R, uint32_t H, uint32_t E,
                     float* xn, cudaStream_t s, const HcQuant& qa) {
    if (!R) return;
    if (H != 4) throw std::runtime_error("hc_pre_collapse: n_hc != 4");
    // (whole warps for the shuffles: E / 4 threads a multiple of 32)
    if ((qa.q0 && E % 128) || (qa.qk && E % 256)) throw std::runtime_error("hc_pre_collapse: E not a block multiple");
    if (qa.h && (E % 4 || !qa.h_top)) throw std::runtime_error("hc_pre_collapse: an FP16 xn needs its bound (h_top)");
    const dim3 grid((E / 4 + kHcCollapseThreads - 1) / kHcCollapseThreads, R);
    hc_collapse_norm_kernel<4><<<grid, kHcCollapseThreads, 0, s>>>(X, gate, norm_w, E, xn, qa);
    check_launch("hc_pre_collapse");
    if (qa.h) ++g_xn_half_calls;
}

__global__ void __launch_bounds__(256) hc_xn_bound_kernel(const float* norm_w, uint32_t E, unsigned* top) {
    pdl_begin();
    float m = 0.0f;
    for (uint32_t i = threadIdx.x; i < E; i += blockDim.x) m = fmaxf(m, norm_w ? fabsf(norm_w[i]) : 1.0f);
    m = block_max(m);
    if (threadIdx.x == 0) *top = __float_as_uint(m * sqrtf(float(E)) * (1.0f + 0x1p-10f));
}

void hc_xn_bound(const float* norm_w, uint32_t E, unsigned* top, cudaStream_t s) {
    hc_xn_bound_kernel<<<1, 256, 0, s>>>(norm_w, E, top);
    check_launch("hc_xn_bound");
}

int g_xn_f16_override = -1;
void xn_f16_override(int level) { g_xn_f16_override = level; }
uint64_t xn_f16_collapse_calls() { return g_xn_half_calls.load(); }
int xn_f16_level() {
    static const int env = std::clamp(env_int("DSV4_XN_F16", 1), 0, 2);
    return g_xn_f16_override >= 0 ? std::min(g_xn_f16_override, 2) : env;
}

void hc_sinkhorn(const float* mix, const float* scale, const float* base, uint32_t R, uint32_t H, float eps,
                 uint32_t iters, float* comb, cudaStream_t s) {
    if (!R) return;
    hc_sinkhorn_kernel<<<R, 32, 0, s>>>(mix, scale, base, H, eps, iters, comb);
    check_launch("hc_sinkhorn");
}

void hc_post(float* X, const float* y, const float* post, const float* comb, uint32_t R, uint32_t H, uint32_t E,
             cudaStream_t s, const float* moe_down, uint32_t K, bool y_init) {
    if (!R) return;
    // DSV4_HC_POST_VEC=0: the runtime-H kernel always (the same bits)
    static const bool vec = env_switch("DSV4_HC_POST_VEC", true);
    auto a16 = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (vec && H == 4 && E % 4 == 0 && a16(X) && a16(y) && a16(moe_down)) {
        const HcPostIn pp{true, y, post, comb, moe_down, K, y_init};
        hc_post_vec_kernel<4><<<dim3((E / 4 + 255) / 256, R), 256, 0, s>>>(X, pp, E);
        check_launch("hc_post");
        return;
    }
    hc_post_kernel<<<dim3((E + 255) / 256, R), 256, 0, s>>>(X, y, post, comb, H, E, moe_down, K, y_init);
    check_launch("hc_post");
}

void output_collapse(const float* pre, const float* scale, const float* base, const float* X, const uint32_t* want,
                     uint32_t NW, uint32_t H, uint32_t E, float eps, float* x, cudaStream_t s) {
    if (!NW) return;
    output_collapse_kernel<<<NW, 1024, 0, s>>>(pre, scale, base, X, want, H, E, eps, x);
    check_launch("output_collapse");
}

void greedy_ids(const float* logits, uint32_t n, uint32_t V, const int32_t* exclude, uint64_t* part, int32_t* ids,
                cudaStream_t s) {
    if (!n) return;
    greedy_part_kernel<<<dim3(kGreedyParts, n), 256, 0, s>>>(logits, V, exclude, part);
    check_launch("greedy_part");
    greedy_final_kernel<<<n, 32, 0, s>>>(part, kGreedyParts, V, exclude, ids);
    check_launch("greedy_final");
}

void gather_rows(const float* X, uint64_t n, const uint32_t* want, uint32_t NW, float* dst, cudaStream_t s) {
    if (!NW) return;
    gather_rows_kernel<<<dim3(uint32_t(std::min<uint64_t>((n + 255) / 256, 64)), NW), 256, 0, s>>>(X, n, want, dst);
    check_launch("gather_rows");
}

namespace {
// DSV4_ATTN_EARLY (default 1; run 63, 43 layers: decode 157.9 and 158.4 tok/s against 156.1
// and 155.4 with 0) or attn_early_override (tests): the attention path's work that reads no output of
// the step's kernels before the programmatic-launch wait: head_norm_rope_reg_kernel's,
// attn_merge_kernel's and indexer_fused_kernel's RoPE angles, attn_split_kernel's item list and
// key prefetches, indexer_fused_kernel's index-row prefetches; and the indexer's top-k passes
// stopping once the chosen bin is taken whole (topk_staged). All the same bits.
// DSV4_ATTN_EARLY_PARTS (a bit mask, default all) picks the kernels that take it: 1
// head_norm_rope, 2 indexer_fused (with its top-k), 4 attn_split, 8 attn_merge. (Run 61 found
// the whole wrong with programmatic edges and right without; with __restrict__ taken off what
// the split and merge kernels read after their wait, every part and the whole pass: run 63.)
int g_attn_early_override = -1;
bool attn_early(int part) {
    static const bool env = env_switch("DSV4_ATTN_EARLY", true);
    static const int parts = env_int("DSV4_ATTN_EARLY_PARTS", 15);
    return (g_attn_early_override >= 0 ? g_attn_early_override != 0 : env) && (parts & part);
}
}  // namespace

void head_norm_rope(float* q, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_rot, float eps, bool norm,
                    bool inverse, const double* inv_freq, const DevRow* rows, cudaStream_t s) {
    if (!R) return;
    const uint32_t vpt = D % 128 == 0 ? D / 128 : 0;
    const bool reg = norm_reg_on() && n_rot % 2 == 0 && n_rot <= 128 && n_rot <= D;
    const bool early = attn_early(1);
    if (reg && vpt == 4) head_norm_rope_reg_kernel<4><<<R * n_head, 128, 0, s>>>(q, D, n_rot, eps, norm, inverse, inv_freq, rows, n_head, early);
    else if (reg && vpt == 1) head_norm_rope_reg_kernel<1><<<R * n_head, 128, 0, s>>>(q, D, n_rot, eps, norm, inverse, inv_freq, rows, n_head, early);
    else if (reg && vpt == 2) head_norm_rope_reg_kernel<2><<<R * n_head, 128, 0, s>>>(q, D, n_rot, eps, norm, inverse, inv_freq, rows, n_head, early);
    else if (reg && vpt == 8) head_norm_rope_reg_kernel<8><<<R * n_head, 128, 0, s>>>(q, D, n_rot, eps, norm, inverse, inv_freq, rows, n_head, early);
    else head_norm_rope_kernel<<<R * n_head, 128, 0, s>>>(q, n_head, D, n_rot, eps, norm, inverse, inv_freq, rows);
    check_launch("head_norm_rope");
}

void kv_finalize(float* kvr, uint32_t R, uint32_t D, uint32_t n_rot, float eps, const float* norm_w,
                 const double* inv_freq, const DevRow* rows, bool official, uint32_t n_nope, const DevLayerKV* lkv,
                 uint32_t n_layer, uint32_t il, cudaStream_t s) {
    if (!R) return;
    kv_finalize_kernel<<<R, 128, 0, s>>>(kvr, D, n_rot, eps, norm_w, inv_freq, rows, official, n_nope, lkv, n_layer,
                                         il);
    check_launch("kv_finalize");
}

// DSV4_CMP_PAR=0 keeps the sequential walk (compressor_state_kernel) for every batch; by
// default batches with more rows than sessions take the two parallel kernels, and decode (one
// row per session) keeps the walk's one launch. compressor_state_override (tests) wins.
static int g_cmp_par_override = -1;
void compressor_state_override(int on) { g_cmp_par_override = on; }

void compressor_state(const float* kvp, const float* scp, const float* ape, const DevRow* rows, uint32_t R,
                      const uint32_t* sess_begin, const uint32_t* sess_end, uint32_t S, uint32_t ratio, uint32_t D,
                      bool indexer, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, float* pooled,
                      cudaStream_t s) {
    if (!S || !R) return;
    static const bool env_par = env_switch("DSV4_CMP_PAR", true);
    const bool par = g_cmp_par_override >= 0 ? g_cmp_par_override != 0 : env_par && R > S;
    if (!par) {
        compressor_state_kernel<<<dim3((D + 127) / 128, S), 128, 0, s>>>(kvp, scp, ape, rows, sess_begin, sess_end,
                                                                         ratio, D, indexer, lkv, n_layer, il, pooled);
        check_launch("compressor_state");
        return;
    }
    // at most floor(R/ratio) + S complete groups: a session of n rows has at most ceil(n/ratio)
    const uint32_t groups = R / ratio + S;
    if (ratio == 4) {
        compressor_pool_kernel<true><<<dim3(groups, (D + 127) / 128), 128, 0, s>>>(
            kvp, scp, ape, rows, sess_begin, sess_end, S, ratio, D, indexer, lkv, n_layer, il, pooled);
        check_launch("compressor_pool");
        compressor_tail_kernel<true><<<dim3((2 * D + 127) / 128, 4, S), 128, 0, s>>>(
            kvp, scp, ape, rows, sess_begin, sess_end, ratio, D, indexer, lkv, n_layer, il);
    } else {
        // 128 candidates a column: narrower blocks, twice as many of them
        compressor_pool_kernel<false><<<dim3(groups, (D + 63) / 64), 64, 0, s>>>(
            kvp, scp, ape, rows, sess_begin, sess_end, S, ratio, D, indexer, lkv, n_layer, il, pooled);
        check_launch("compressor_pool");
        compressor_tail_kernel<false><<<dim3((D + 127) / 128, ratio, S), 128, 0, s>>>(
            kvp, scp, ape, rows, sess_begin, sess_end, ratio, D, indexer, lkv, n_layer, il);
    }
    check_launch("compressor_tail");
}

void compressor_emit(const float* pooled, uint32_t R, const DevRow* rows, uint32_t ratio, uint32_t D, uint32_t n_rot,
                     uint32_t n_nope, float eps, const float* norm_w, const double* inv_freq, bool indexer,
                     bool official, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, cudaStream_t s) {
    if (!R) return;
    compressor_emit_kernel<<<R, 128, D * sizeof(float), s>>>(pooled, rows, ratio, D, n_rot, n_nope, eps, norm_w,
                                                             inv_freq, indexer, official, lkv, n_layer, il);
    check_launch("compressor_emit");
}

namespace {
// DSV4_IDX_PREP=0 keeps indexer_q_prep_kernel (a block a head) for heads of 128 too (the same
// bits); indexer_prep_warp_override (tests) wins.
int g_idx_prep_override = -1;
bool indexer_prep_warp_on(uint32_t DI, uint32_t n_rot) {
    static const bool env = env_switch("DSV4_IDX_PREP", true);
    const bool on = g_idx_prep_override >= 0 ? g_idx_prep_override != 0 : env;
    return on && DI == 128 && n_rot % 2 == 0 && n_rot <= DI;
}
}  // namespace

void indexer_prep_warp_override(int on) { g_idx_prep_override = on; }

void indexer_q_prep(float* qi, float* wi, uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot,
                    const double* inv_freq, const DevRow* rows, bool official, float wscale, cudaStream_t s,
                    uint16_t* qb, bool keep_qi) {
    if (!R) return;
    if (qb && !official)
        throw std::invalid_argument("indexer_q_prep: BF16 queries need official numerics (plain queries are not BF16 values)");
    if (indexer_prep_warp_on(DI, n_rot)) {
        // decode-sized rounds: a row's heads over blocks of 8 (a warp a head, the angles made in
        // each block), not 8 a warp one after another on one SM (10.1 us a decode row, run 127)
        const dim3 grid(R, R <= kFusedMaxRows ? (NH + 7) / 8 : 1);
        indexer_q_prep_warp_kernel<<<grid, 256, 0, s>>>(qi, wi, NH, n_rot, inv_freq, rows, official, wscale, qb,
                                                        keep_qi);
        check_launch("indexer_q_prep");
        return;
    }
    indexer_q_prep_kernel<<<R * NH, 64, DI * sizeof(float), s>>>(qi, wi, NH, DI, n_rot, inv_freq, rows, official,
                                                                 wscale, qb, keep_qi);
    check_launch("indexer_q_prep");
}

namespace {
// DSV4_IDX_TILED: 1 (default) the tiled kernel of 64 keys a block for the model's shape, 2 its
// 32-key blocks of 4 warps, 0 indexer_scores_kernel (16 rows a block, scalar loop) for every
// shape; the same bits. indexer_tiled_override (tests) wins.
int g_idx_tiled_override = -1;
int indexer_tiled_form() {
    static const int env = env_int("DSV4_IDX_TILED", 1);
    return g_idx_tiled_override >= 0 ? g_idx_tiled_override : env;
}
template <uint32_t KT, uint32_t NTH>
void launch_scores_tiled(const float* qi, const float* wi, uint32_t R, const DevRow* rows, const DevLayerKV* lkv,
                         uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis, float* score, uint64_t ld,
                         uint64_t tc_from, cudaStream_t s) {
    constexpr auto kernel = indexer_scores_tiled_kernel<kFusedNH, kFusedDI, kFusedP, KT, NTH>;
    constexpr size_t smem = size_t(kFusedNH + KT) * kFusedP * sizeof(float);
    static const bool raised = [] {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
              "indexer_scores shared memory");
        return true;
    }();
    (void)raised;
    const dim3 grid(uint32_t((max_vis + KT - 1) / KT), R);
    kernel<<<grid, NTH, smem, s>>>(qi, wi, rows, lkv, n_layer, il, top_k, score, ld, tc_from);
    check_launch("indexer_scores");
}
}  // namespace

void indexer_tiled_override(int form) { g_idx_tiled_override = form; }

void indexer_scores(const float* qi, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, const DevRow* rows,
                    const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis,
                    float* score, uint64_t ld, cudaStream_t s, uint64_t tc_from) {
    if (!R || max_vis <= top_k) return;
    if (DI % 4) throw_mismatch("indexer_scores: indexer head widths must be multiples of 4", 0, DI, DI);
    const size_t smem = (size_t(NH + kScoreTile) * (DI + 1) + NH) * sizeof(float);
    static size_t raised = 0;
    if (smem > 48 * 1024 && smem > raised) {
        check(cudaFuncSetAttribute(indexer_scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
              "indexer_scores shared memory");
        raised = smem;
    }
    const int form = indexer_tiled_form();
    if (form && NH == kFusedNH && DI == kFusedDI) {
        if (form == 2)
            launch_scores_tiled<32, 128>(qi, wi, R, rows, lkv, n_layer, il, top_k, max_vis, score, ld, tc_from, s);
        else
            launch_scores_tiled<kScoreTileWide, 256>(qi, wi, R, rows, lkv, n_layer, il, top_k, max_vis, score, ld,
                                                     tc_from, s);
        return;
    }
    const dim3 grid(uint32_t((max_vis + kScoreTile - 1) / kScoreTile), R);
    indexer_scores_kernel<<<grid, 256, smem, s>>>(qi, wi, NH, DI, rows, lkv, n_layer, il, top_k, score, ld, tc_from);
    check_launch("indexer_scores");
}

namespace {
// Query rows a block of indexer_scores_tc_kernel for a score matrix max_vis keys wide:
// DSV4_IDX_TC_ROWS (1 ... 32), else 32 from kTcWideRows keys (each block stages its 256 index
// rows once for its rows: a long prompt's chunk restages every key block R / RB times; run 143,
// the last chunk of a 256K prompt, 65,536 keys: 6.64 against 6.89 ms a layer) and 16 below
// (run 144, 43 layers on a 64K prompt, up to 16,384 keys: 4,021 against 4,036 tok/s, no gain;
// a short prompt's few key blocks keep twice the blocks to spread over the SMs);
// indexer_tc_rows_override (tests) wins. The same bits: a score is its own row's, whatever the block.
constexpr uint64_t kTcWideRows = 128 * kTcKeys;
int g_idx_tc_rows_override = -1;
uint32_t idx_tc_rows(uint64_t max_vis) {
    static const int env = env_int("DSV4_IDX_TC_ROWS", 0);
    const int rows = g_idx_tc_rows_override > 0 ? g_idx_tc_rows_override : env;
    if (rows > 0) return std::min(uint32_t(rows), kTcRowsMax);
    return max_vis >= kTcWideRows ? kTcRowsMax : 16;
}
template <uint32_t DI, uint32_t MT>
void launch_scores_tc(const uint16_t* qb, const float* wi, uint32_t R, uint32_t NH, const DevRow* rows,
                      const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis,
                      float* score, uint64_t ld, uint64_t tc_from, cudaStream_t s) {
    constexpr auto kernel = indexer_scores_tc_kernel<DI, MT>;
    constexpr size_t smem = idx_tc_smem<DI, MT>();
    static const bool raised = [] {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
              "indexer scores (tensor cores) shared memory");
        return true;
    }();
    (void)raised;
    const uint32_t RB = idx_tc_rows(max_vis);
    const dim3 grid(uint32_t((max_vis + kTcKeys - 1) / kTcKeys), (R + RB - 1) / RB);
    kernel<<<grid, kTcThreads, smem, s>>>(qb, wi, NH, rows, lkv, n_layer, il, top_k, R, score, ld, tc_from, RB);
    check_launch("indexer scores (tensor cores)");
}
}  // namespace

void indexer_tc_rows_override(int rows) { g_idx_tc_rows_override = rows; }

// DSV4_IDX_TC=0 keeps prompt rounds' indexer scores on the FP32 kernels (indexer_fused or
// indexer_scores, decode's bits).
bool indexer_tc_ok(uint32_t NH, uint32_t DI) {
    static const bool on = env_switch("DSV4_IDX_TC", true);
    return on && NH >= 1 && NH <= 64 && (DI == 64 || DI == 128);
}

void indexer_scores_tc(const uint16_t* qb, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, const DevRow* rows,
                       const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis,
                       float* score, uint64_t ld, cudaStream_t s, uint64_t tc_from) {
    if (!R || max_vis <= top_k || max_vis < tc_from) return;
    if (!indexer_tc_ok(NH, DI)) throw_mismatch("indexer_scores_tc: indexer heads (up to 64) of width 64 or 128", 0, NH, DI);
    const uint32_t MT = (NH + 15) / 16;
    using Launch = void (*)(const uint16_t*, const float*, uint32_t, uint32_t, const DevRow*, const DevLayerKV*, uint32_t,
                            uint32_t, uint32_t, uint64_t, float*, uint64_t, uint64_t, cudaStream_t);
    static constexpr Launch l64[4] = {launch_scores_tc<64, 1>, launch_scores_tc<64, 2>, launch_scores_tc<64, 3>,
                                      launch_scores_tc<64, 4>};
    static constexpr Launch l128[4] = {launch_scores_tc<128, 1>, launch_scores_tc<128, 2>, launch_scores_tc<128, 3>,
                                       launch_scores_tc<128, 4>};
    (DI == 64 ? l64 : l128)[MT - 1](qb, wi, R, NH, rows, lkv, n_layer, il, top_k, max_vis, score, ld, tc_from, s);
}

namespace {
// topk_row's staging: up to kTopkStageMax keys (160 KB) in shared memory (and the filter's
// candidates after them: 32 KB); DSV4_TOPK_STAGE=0 reads every pass from global memory
// (measurements), topk_stage_override (tests) wins.
constexpr uint32_t kTopkStageMax = 40 * 1024;
constexpr size_t kTopkSmemMax = (kTopkStageMax + 2 * kTopkFilterCap) * 4;
int g_topk_stage_override = -1;
// DSV4_TOPK_WARP=1: topk_radix's output pass by warps (topk_write_by_warps; the same bytes).
// Off by default: 4 ratio-4 layers at 64K, 920.9 tok/s against 953.0 by threads (run 128), and
// level with the filter (1,070.0 / 1,063.4 at 60K, run 129); topk_warp_override (tests) wins.
int g_topk_warp_override = -1;
// DSV4_TOPK_FILTER (on): rows of kTopkFilterMin keys or more select through a sample
// (topk_filtered; the same bytes). 4 ratio-4 layers at 64K: 1,018.4 tok/s against 953.0 with
// every key through the radix passes (runs 128, 129); 0 turns it off, topk_filter_override wins.
int g_topk_filter_override = -1;
// DSV4_TOPK_ASYNC (on): topk_row stages its keys by stage_order_keys (cp.async, all of a
// thread's copies in flight); 0: a key at a time by __ldcg as before (measurements; the same bytes).
// How topk_row runs for rows of up to n keys: the keys it stages, its forms, its dynamic
// shared memory (the staged keys, or the sample's candidates and their indices).
struct TopkLaunch {
    uint32_t stage, form;   // (form: kTopkWarp | kTopkFilter bits)
    size_t smem;
};
TopkLaunch topk_launch(uint64_t n) {
    static const bool stage_on = env_switch("DSV4_TOPK_STAGE", true);
    static const bool warp_on = env_switch("DSV4_TOPK_WARP", false);
    static const bool filter_on = env_switch("DSV4_TOPK_FILTER", true);
    static const bool async_on = env_switch("DSV4_TOPK_ASYNC", true);
    const bool stage = g_topk_stage_override >= 0 ? g_topk_stage_override != 0 : stage_on;
    const bool warp = g_topk_warp_override >= 0 ? g_topk_warp_override != 0 : warp_on;
    const bool filter = (g_topk_filter_override >= 0 ? g_topk_filter_override != 0 : filter_on) && n >= kTopkFilterMin;
    TopkLaunch l{stage ? uint32_t(std::min<uint64_t>(n, kTopkStageMax)) : 0u,
                 (warp ? kTopkWarp : 0u) | (filter ? kTopkFilter : 0u) | (async_on ? 0u : kTopkKeyByKey), 0};
    l.smem = (size_t(round_up4(l.stage)) + (filter ? 2 * kTopkFilterCap : 0)) * 4;
    return l;
}
// DSV4_TOPK_REG (default 1): topk_select and topk_plain take topk_reg_kernel for score matrices
// up to kRegMax keys wide (the choice follows the width, not the rows' lengths, so a captured
// decode graph stays valid; the same bytes; run 134, 4 ratio-4 layers: decode +3 % holding a 64K
// or 60K conversation, level at 16K and in prompt rounds); topk_reg_override (tests) wins.
int g_topk_reg_override = -1;
bool topk_reg_on() {
    static const bool on = env_switch("DSV4_TOPK_REG", true);
    return g_topk_reg_override >= 0 ? g_topk_reg_override != 0 : on;
}
// The widest score matrix topk_reg_kernel takes for R rows: with DSV4_TOPK_CLUSTER (2 by
// default; topk_cluster_override, tests, wins) clusters of up to 8 blocks for every round, 1 for
// decode-sized rounds only (a cluster a row; run 137, 4 ratio-4 layers: decode +5 % holding a
// 128K conversation, +12 % at 256K, 3.2x at 1M, where topk_select_kernel's staged chunks held
// 250,000 keys a row; run 143: a 256K prompt's last chunk, 2,048 rows of 65,536 keys, 613
// against 862 us a layer), else 32,768 (0: never).
int g_topk_cluster_override = -1;
uint64_t topk_reg_max(uint32_t R) {
    static const int env = env_int("DSV4_TOPK_CLUSTER", 2);
    const int mode = g_topk_cluster_override >= 0 ? g_topk_cluster_override : env;
    return mode >= 2 || (mode == 1 && R <= kRegClusterRows) ? uint64_t(kRegMax) * kRegClusterMax : kRegMax;
}
template <uint32_t CL>
void launch_topk_reg_cluster(const float* score, uint64_t width, uint32_t R, const DevRow* rows, uint32_t ratio,
                             uint32_t n_plain, uint32_t k, uint32_t* sel, cudaStream_t s) {
    check(launch_clusters(topk_reg_kernel<32, CL>, dim3(R * CL), dim3(kRegThreads), 0, s, dim3(CL), score, width, rows,
                          ratio, n_plain, k, sel),
          "top-k (a cluster a row)");
}
// topk_reg_kernel on R rows of a score matrix `width` keys wide (<= topk_reg_max(R)): 16 keys a
// thread up to 16,384, 32 past it, and past 32,768 clusters of 2, 4 or 8 blocks (rows:
// topk_select's, or nullptr for one row of n_plain keys).
void launch_topk_reg(const float* score, uint64_t width, uint32_t R, const DevRow* rows, uint32_t ratio,
                     uint32_t n_plain, uint32_t k, uint32_t* sel, cudaStream_t s) {
    if (width <= kRegThreads * 16)
        topk_reg_kernel<16><<<R, kRegThreads, 0, s>>>(score, width, rows, ratio, n_plain, k, sel);
    else if (width <= kRegMax)
        topk_reg_kernel<32><<<R, kRegThreads, 0, s>>>(score, width, rows, ratio, n_plain, k, sel);
    else if (width <= 2 * uint64_t(kRegMax))
        launch_topk_reg_cluster<2>(score, width, R, rows, ratio, n_plain, k, sel, s);
    else if (width <= 4 * uint64_t(kRegMax))
        launch_topk_reg_cluster<4>(score, width, R, rows, ratio, n_plain, k, sel, s);
    else
        launch_topk_reg_cluster<8>(score, width, R, rows, ratio, n_plain, k, sel, s);
}
template <class Kernel>
void raise_topk_smem(Kernel kernel) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTopkSmemMax)),
          "top-k shared memory");
}
}  // namespace

void topk_stage_override(int on) { g_topk_stage_override = on; }
void topk_warp_override(int on) { g_topk_warp_override = on; }
void topk_filter_override(int on) { g_topk_filter_override = on; }
void topk_reg_override(int on) { g_topk_reg_override = on; }
void topk_cluster_override(int on) { g_topk_cluster_override = on; }

void topk_select(const float* score, uint64_t ld, uint32_t R, const DevRow* rows, uint32_t ratio, uint32_t top_k,
                 uint32_t* sel, cudaStream_t s) {
    if (!R) return;
    if (topk_reg_on() && ld <= topk_reg_max(R)) {
        launch_topk_reg(score, ld, R, rows, ratio, 0, top_k, sel, s);
        check_launch("topk_select");
        return;
    }
    static const bool raised = (raise_topk_smem(topk_select_kernel), true);
    (void)raised;
    const TopkLaunch l = topk_launch(ld);   // a row's keys: at most ld
    topk_select_kernel<<<R, 256, l.smem, s>>>(score, ld, rows, ratio, top_k, sel, l.stage, l.form);
    check_launch("topk_select");
}

void topk_plain(const float* score, uint32_t n, uint32_t k, uint32_t* sel, cudaStream_t s) {
    if (topk_reg_on() && n <= topk_reg_max(1)) {
        launch_topk_reg(score, n, 1, nullptr, 1, n, k, sel, s);
        check_launch("topk_plain");
        return;
    }
    static const bool raised = (raise_topk_smem(topk_plain_kernel), true);
    (void)raised;
    const TopkLaunch l = topk_launch(n);
    topk_plain_kernel<<<1, 256, l.smem, s>>>(score, n, k, sel, l.stage, l.form);
    check_launch("topk_plain");
}

bool indexer_fused_ok(uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot, uint64_t max_vis) {
    return R >= 1 && R <= kFusedMaxRows && NH == kFusedNH && DI == kFusedDI && n_rot % 2 == 0 && n_rot <= DI &&
           max_vis <= kFusedMaxKeys;
}

// DSV4_IDX_FUSED_MAX: the most keys (a row's visible compressed rows, rounded up to the score
// matrix's width) for which the fused indexer is preferred. With a 16-key tile a block every
// block prepares the row's 64 query heads again and the last block selects alone, so past a few
// thousand keys the three kernels (the query prep over 8 blocks, the filtered top-k) win: 4
// ratio-4 layers, 1,161.1 against 1,146.5 tok/s at 4,096 keys (16K tokens), 1,118.1 / 1,045.4 at
// 8K keys, 1,063.4 / 906.2 at 15,008 (runs 128, 129); level at 1,024 (4K tokens: 1,234.6 /
// 1,235.7). Default 2,048 keys (an 8K conversation).
uint64_t indexer_fused_max_keys() {
    static const uint64_t max_keys = uint64_t(std::max(0, env_int("DSV4_IDX_FUSED_MAX", 2048)));
    return max_keys;
}
bool indexer_fused_preferred(uint64_t max_vis) { return max_vis <= indexer_fused_max_keys(); }

// DSV4_IDX_TC_DECODE=N (official numerics): a decode round's rows that see N compressed rows or
// more score on the BF16 tensor cores as prompt rounds do (their bits), the others on the FP32
// kernels. The rule is a row's own length, so a row gets the same bits alone and in any batch;
// where the shapes allow the fused indexer (FP32, chosen by the matrix width) N is raised past
// its widths, or a row could take it alone and the tensor cores in a wider batch. 0: never.
// Default 16,384 (conversations from 64K tokens; run 136, N = 4,096, 4 ratio-4 layers: +2.4 % at
// 64K, +10.2 % at 256K, −1.7 % at 16K; 43 layers at 64K: 157.4 against 153.9 tok/s).
namespace {
int64_t g_idx_tc_decode_override = -1;
}
uint64_t indexer_tc_decode_from(uint32_t NH, uint32_t DI, uint32_t n_rot) {
    static const uint64_t env = uint64_t(std::max(0, env_int("DSV4_IDX_TC_DECODE", 16384)));
    uint64_t n = g_idx_tc_decode_override >= 0 ? uint64_t(g_idx_tc_decode_override) : env;
    if (!n || !indexer_tc_ok(NH, DI)) return 0;
    if (indexer_fused_ok(1, NH, DI, n_rot, 0)) n = std::max(n, indexer_fused_max_keys() + 1);
    return n;
}
void indexer_tc_decode_override(int64_t n) { g_idx_tc_decode_override = n; }

namespace {
// The fused indexer's tiles of kScoreTile keys a block: DSV4_IDX_FUSED_TILES=N (1, a tile a block:
// at 1,024 keys 1,206.6 / 1,217.8 tok/s against 1,226.2 with 2 and 1,167.3 with 4, run 128), 0 for as many as keep about 128 blocks a row (1 up to 2,048 keys,
// 8 at 16,384), at most 16; indexer_fused_tiles_override (tests) wins. The same bits.
int g_fused_tiles_override = -1;
uint32_t fused_tiles(uint64_t max_vis) {
    static const int env = std::max(0, env_int("DSV4_IDX_FUSED_TILES", 1));
    const int v = g_fused_tiles_override >= 0 ? g_fused_tiles_override : env;
    if (v > 0) return uint32_t(std::min(v, 16));
    return uint32_t(std::clamp<uint64_t>((max_vis + 128 * kScoreTile - 1) / (128 * kScoreTile), 1, 16));
}
}  // namespace

void indexer_fused_tiles_override(int tiles) { g_fused_tiles_override = tiles; }

void indexer_fused(const float* qi, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot,
                   const double* inv_freq, const DevRow* rows, bool official, float wscale, const DevLayerKV* lkv,
                   uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis, float* score, uint64_t ld,
                   uint32_t* count, uint32_t* sel, cudaStream_t s) {
    if (!R || max_vis <= top_k) return;
    if (!indexer_fused_ok(R, NH, DI, n_rot, max_vis))
        throw_mismatch("indexer_fused: unsupported shape (see indexer_fused_ok)", 0, R, NH);
    const size_t smem = std::max<size_t>(kFusedBase, max_vis) * sizeof(float);
    static const bool raised = [] {   // once, to the most any call uses (with the static shared)
        check(cudaFuncSetAttribute(indexer_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(std::max(kFusedBase, kFusedMaxKeys) * sizeof(float))),
              "indexer_fused shared memory");
        return true;
    }();
    (void)raised;
    const uint32_t tiles = fused_tiles(max_vis), keys = tiles * kScoreTile;
    const dim3 grid(uint32_t((max_vis + keys - 1) / keys), R);
    indexer_fused_kernel<<<grid, kFusedThreads, smem, s>>>(qi, wi, n_rot, inv_freq, rows, official, wscale, lkv,
                                                           n_layer, il, top_k, score, ld, count, sel, attn_early(2),
                                                           topk_launch(max_vis).form, tiles);
    check_launch("indexer_fused");
}

namespace {
int g_attn_loop_override = -1;
// Whether attention() takes the rows kernel (attention_tc.cu): a prompt round, DSV4_ATTN_ROWS
// (read once; 0 keeps the splits), a shape attn_rows_ok takes.
bool attn_rows_path(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    static const bool rows_on = env_switch("DSV4_ATTN_ROWS", true);
    return rows_on && gemm_prefill_order() && attn_rows_ok(n_head, D, n_rot);
}
}  // namespace

void attn_loop_override(int mode) { g_attn_loop_override = mode; }

bool attn_rows_qnorm(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    return attn_rows_path(n_head, D, n_rot) && attn_rows_qnorm_on();
}

bool attn_rows_half_output(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    return attn_rows_path(n_head, D, n_rot) && attn_rows_f16_fast32(n_head, D, n_rot);
}

int g_attn_half_out_override = -1;
std::atomic<uint64_t> g_attn_half_calls{0};
void attn_half_output_override(int level) { g_attn_half_out_override = level; }
uint64_t attn_half_output_calls() { return g_attn_half_calls.load(); }
int attn_half_output_on() {
    static const int env = std::clamp(env_int("DSV4_ATTN_HALF_OUT", 0), 0, 3);
    return g_attn_half_out_override >= 0 ? std::min(g_attn_half_out_override, 3) : env;
}

void attention(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
               uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
               uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, cudaStream_t s,
               const ActBuf* o_q8, AttnQNorm qn, AttnHalfOut oh) {
    if (!R || !n_head) return;
    if (oh.h && (o_q8 || !attn_rows_half_output(n_head, D, n_rot)))
        throw_mismatch("attention: a half output (oh) only from the fast rows kernels of 32-key tiles "
                       "(attn_rows_half_output), and without Q8_0 codes", 0, D, D);
    if (qn.h && (!qn.on || !qn.h_top || !attn_rows_half_output(n_head, D, n_rot)))
        throw_mismatch("attention: queries as FP16 (AttnQNorm::h) only raw (qn.on), with their top, into the fast rows "
                       "kernels of 32-key tiles (attn_rows_half_output)", 0, D, D);
    if (oh.h) ++g_attn_half_calls;
    if (D > kAttnMaxD || D % 4 != 0 || D == 0)
        throw_mismatch("attention: head widths up to 512, multiples of 4", 0, D, D);
    if (o_q8 && (D % 128 != 0 || uint64_t(R) * n_head * D > o_q8->cap_values))
        throw_mismatch("attention: Q8_0 output codes need heads of a multiple of 128 values", 0, D, D);
    // Raw queries only where the rows kernel folds their norm in (the caller asked attn_rows_qnorm).
    if (qn.on && !attn_rows_qnorm(n_head, D, n_rot))
        throw_mismatch("attention: raw queries (AttnQNorm) only where attn_rows_qnorm", 0, D, D);
    // A prompt round (gemm_prefill_order): an item per row, all heads and keys, no partials
    // (attention_tc.cu; DSV4_ATTN_ROWS=0 keeps the splits).
    if (attn_rows_path(n_head, D, n_rot)) {
        attn_rows_tc(q, sinks, R, n_head, D, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, n_rot, inv_freq, o,
                     o_q8 ? o_q8->q : nullptr, o_q8 ? o_q8->d : nullptr, oh.h, oh.h ? oh.max : nullptr, qn.h, qn.h_top,
                     qn.on, qn.eps, s);
        return;
    }
    // Splits per row at most: a layer without compression sees at most n_swa keys, a ratio-4
    // layer at most n_swa + top_k; others grow with the position and take the cap.
    const uint32_t max_split = std::max(
        1u, ratio == 0 ? attn_nsplit(n_swa) : ratio == 4 ? attn_nsplit(uint64_t(n_swa) + top_k) : kAttnMaxSplit);
    const uint64_t row_bytes = uint64_t(n_head) * max_split * (uint64_t(D) * sizeof(float) + sizeof(float2));
    // Rows in slices, so the scratch stays bounded; slices of equal size (±1) balance the launches.
    const uint32_t cap = uint32_t(std::clamp<uint64_t>(attn_scratch_budget() / row_bytes, 1, kAttnMaxSliceRows));
    const uint32_t n_slices = (R + cap - 1) / cap, slice = (R + n_slices - 1) / n_slices;
    const uint64_t o_floats = uint64_t(slice) * n_head * max_split * D;
    float* part_o = static_cast<float*>(attn_scratch(slice * row_bytes, s));
    float2* part_ml = reinterpret_cast<float2*>(part_o + o_floats);

    // The key splits on the tensor cores where the head width allows (DSV4_ATTN_TC): the same
    // splits and partials, so the merge is shared.
    const bool tc = attn_tc_on() && attn_tc_ok(n_head, D);
    const size_t smem =
        (size_t(kAttnHB + kAttnKT) * (D + kAttnPad) + kAttnWarps * kAttnHB * kAttnKT + kAttnKT * kAttnHB) * sizeof(float);
    // Shared-memory limit and residency (blocks the GPU holds at once: the persistent grid):
    // found by the first call of each width, an eager round, so graph capture finds them.
    static size_t raised = 0;
    uint32_t resident = 0;
    if (!tc) {
        if (smem > 48 * 1024 && smem > raised) {
            check(cudaFuncSetAttribute(attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                  "attention shared memory");
            raised = smem;
        }
        resident = resident_blocks(reinterpret_cast<const void*>(attn_split_kernel), kAttnThreads, smem);
    }
    const uint32_t n_groups = (n_head + kAttnHB - 1) / kAttnHB;
    // DSV4_ATTN_LOOP (slices of 32 rows or more: prefill; the same bits in every mode, see
    // attn_split_kernel, attn_split_wide_kernel and attention_tc.cu; tests force a mode with
    // attn_loop_override): 0 an item per head group; 1 a row's head groups in one item, a
    // split's keys staged once; 2 the same, the tensor-core kernel choosing the groups per item
    // (the FP32 kernel takes it as 1); 3 (default) below. On the H200 (runs 36, 42, 4 layers)
    // 1 and 2 gained nothing; 3 took 10.30 and 10.54 us a token and layer against 10.71 for 0.
    static const int loop_env = env_switch("DSV4_ATTN_LOOP", true) ? std::max(1, env_int("DSV4_ATTN_LOOP", 3)) : 0;
    const int loop_mode = g_attn_loop_override >= 0 ? g_attn_loop_override : loop_env;
    // =3: the FP32 kernel's items take all of a row's heads (attn_split_wide_kernel) where every
    // split is one tile (ratio 0 and 4 with n_swa + top_k <= 1,024 keys) and the heads are a
    // multiple of 8 up to 64; elsewhere as 1. Its shared memory is raised once, outside a capture
    // (a captured round before that takes attn_split_kernel: the same bits).
    const uint64_t max_keys = ratio == 0 ? n_swa : ratio == 4 ? uint64_t(n_swa) + top_k : UINT64_MAX;
    const bool wide_shape = !tc && loop_mode == 3 && n_head % 8 == 0 && n_head <= kAttnWideMaxHeads &&
                            max_keys <= uint64_t(kAttnKS) * kAttnMaxSplit;
    const size_t wide_smem = (size_t(n_head + kAttnKT) * (D + kAttnPad) + size_t(kAttnKT) * n_head) * sizeof(float);
    static uint32_t wide_resident = 0;   // blocks the GPU holds at once; 0: shared memory not yet raised
    if (wide_shape && wide_resident == 0) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusNone) {
            constexpr size_t most = (size_t(kAttnWideMaxHeads + kAttnKT) * (kAttnMaxD + kAttnPad) +
                                     size_t(kAttnKT) * kAttnWideMaxHeads) * sizeof(float);
            check(cudaFuncSetAttribute(attn_split_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)),
                  "attention (wide) shared memory");
            wide_resident = resident_blocks(reinterpret_cast<const void*>(attn_split_wide_kernel), kAttnThreads, most);
        }
    }
    for (uint32_t r0 = 0; r0 < R; r0 += slice) {
        const uint32_t n = std::min(slice, R - r0);
        const bool loop = loop_mode != 0 && n >= 32;
        if (loop && wide_shape && wide_resident) {
            const uint32_t blocks = std::min(n * max_split, wide_resident);
            attn_split_wide_kernel<<<blocks, kAttnThreads, wide_smem, s>>>(q, n_head, D, n_swa, ratio, top_k, sel, rows,
                                                                           lkv, n_layer, il, r0, n, max_split, part_o,
                                                                           part_ml);
            check_launch("attention (wide)");
        } else if (tc) {
            attn_split_tc(q, n_head, D, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, r0, n, max_split, part_o,
                          part_ml, loop ? (loop_mode == 2 ? 2u : 1u) : 0u, s);   // (3 as 1)
        } else {
            const uint32_t blocks = std::min(n * (loop ? 1 : n_groups) * max_split, resident);
            attn_split_kernel<<<blocks, kAttnThreads, smem, s>>>(q, n_head, D, n_swa, ratio, top_k, sel, rows, lkv,
                                                                 n_layer, il, r0, n, max_split, part_o, part_ml,
                                                                 loop, attn_early(4));
            check_launch("attention");
        }
        attn_merge_kernel<<<n * n_head, kAttnMergeThreads, 0, s>>>(sinks, n_head, D, n_swa, ratio, top_k, rows, r0,
                                                                   max_split, part_o, part_ml, n_rot, inv_freq, o,
                                                                   o_q8 ? o_q8->q : nullptr, o_q8 ? o_q8->d : nullptr,
                                                                   attn_early(8));
        check_launch("attention merge");
    }
}

void attn_early_override(int on) { g_attn_early_override = on; }

void router(float* logits, uint32_t R, uint32_t NE, uint32_t K, const float* bias, const int32_t* tid2eid,
            const DevRow* rows, bool norm, float scale, int32_t* experts, float* weights, int32_t* bad,
            cudaStream_t s) {
    router(RouterArgs{logits, NE, K, bias, tid2eid, rows, norm, scale, experts, weights, bad}, R, s);
}

void router(const RouterArgs& a, uint32_t R, cudaStream_t s) {
    if (!R) return;
    const uint32_t threads = std::min(1024u, (a.NE + 31) / 32 * 32);
    router_kernel<<<R, threads, router_scratch_bytes(a.NE, a.K), s>>>(a);
    check_launch("router");
}

void swiglu(const float* g, const float* u, float* mid, uint32_t P, uint32_t F, float clamp, const float* w,
            cudaStream_t s) {
    const uint64_t total = uint64_t(P) * F;
    if (!total) return;
    const uint32_t blocks = uint32_t(std::min<uint64_t>((total + 255) / 256, 4096));
    swiglu_kernel<<<blocks, 256, 0, s>>>(g, u, mid, F, clamp, w, total);
    check_launch("swiglu");
}


void fp8_sim_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s) {
    if (!R) return;
    sim_rows_kernel<<<R, 128, n * sizeof(float), s>>>(x, n, stride, 0);
    check_launch("fp8_sim_rows");
}
void fp4_sim_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s) {
    if (!R) return;
    sim_rows_kernel<<<R, 128, n * sizeof(float), s>>>(x, n, stride, 1);
    check_launch("fp4_sim_rows");
}
void hadamard_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s) {
    if (!R) return;
    sim_rows_kernel<<<R, 128, n * sizeof(float), s>>>(x, n, stride, 2);
    check_launch("hadamard_rows");
}
void e4m3_round_n(const float* x, float* y, uint64_t n, cudaStream_t s) {
    if (!n) return;
    round_kernel<<<uint32_t((n + 255) / 256), 256, 0, s>>>(x, y, n, true);
    check_launch("e4m3_round_n");
}
void e2m1_round_n(const float* x, float* y, uint64_t n, cudaStream_t s) {
    if (!n) return;
    round_kernel<<<uint32_t((n + 255) / 256), 256, 0, s>>>(x, y, n, false);
    check_launch("e2m1_round_n");
}

}  // namespace dsv4::cuda
