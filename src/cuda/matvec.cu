// Activation quantisation and the dequantising matrix-vector products for every weight
// type, with the CPU's dot-product math (src/quant/dot.cpp): integer sums of weight codes
// times activation codes inside each (sub-)block, then one float multiply-add per block.
// A warp computes one output row for up to RB activation rows, so a batch reads each
// weight row once per RB rows.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/tails.cuh"
#include "cuda/iq2.cuh"

namespace dsv4::cuda {
namespace {

// IQ2_XXS tables (upload_iq2xxs_grid): the 256 grid rows of 8 magnitudes, and the 128 sign
// patterns as byte masks (byte t of g_iq2_sign[i] is 0xFF when value t of pattern i is
// negative: ksigns(i) bit t), read through the L1 cache by every lane.
__device__ uint64_t g_iq2_grid[256];
__device__ uint64_t g_iq2_sign[128];
// The fast experts kernel's half selectors (iq2.cuh): the grid parts (from the grid, at its
// upload) and the sign parts (constants).
__device__ uint64_t g_iq2_hgrid[256];
__device__ const Iq2HalfSigns g_iq2_hsign = iq2_half_signs();

__device__ __forceinline__ uint32_t ksigns(uint32_t i) { return i | ((uint32_t(__popc(i)) & 1u) << 7); }

__device__ __forceinline__ int mxfp4_val(uint32_t c) {
    const int m = int(c & 7);
    const int v = m < 4 ? m : (m < 6 ? 4 + 2 * (m - 4) : 8 + 4 * (m - 6));
    return (c & 8) ? -v : v;
}

// ---- activation quantisation ------------------------------------------------------------

// One warp per 32-value block.
__global__ void quant_q8_0_kernel(const float* __restrict__ x, uint64_t x_stride, uint64_t K, int8_t* __restrict__ q,
                                  float* __restrict__ d) {
    pdl_begin();
    const uint32_t r = blockIdx.y, lane = threadIdx.x & 31;
    const uint64_t b = uint64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= K / 32) return;
    const float v = x[r * x_stride + b * 32 + lane];
    const float amax = warp_max(fabsf(v));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    q[r * K + b * 32 + lane] = q_clamp(v * id);
    if (lane == 0) d[r * (K / 32) + b] = f16_round(dd);
}

// One warp per 256-value block; lane l holds values 8l .. 8l+7.
__global__ void quant_q8_k_kernel(const float* __restrict__ x, uint64_t x_stride, uint64_t K, int8_t* __restrict__ q,
                                  float* __restrict__ d, int32_t* __restrict__ bsum) {
    pdl_begin();
    const uint32_t r = blockIdx.y, lane = threadIdx.x & 31;
    const uint64_t b = uint64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (b >= K / 256) return;
    const float* xb = x + r * x_stride + b * 256 + lane * 8;
    float v[8];
    float amax = 0.0f, mx = 0.0f;
    for (int t = 0; t < 8; ++t) {
        v[t] = xb[t];
        const float ax = fabsf(v[t]);
        if (ax > amax) {
            amax = ax;
            mx = v[t];
        }
    }
    // The first value of the largest magnitude (lowest index on ties) gives the sign.
    uint32_t who = lane;
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
        const float om = __shfl_xor_sync(0xffffffffu, mx, o);
        const uint32_t ow = __shfl_xor_sync(0xffffffffu, who, o);
        if (oa > amax || (oa == amax && ow < who)) {
            amax = oa;
            mx = om;
            who = ow;
        }
    }
    int8_t* qb = q + r * K + b * 256 + lane * 8;
    if (amax == 0.0f) {
        for (int t = 0; t < 8; ++t) qb[t] = 0;
        if (!(lane & 1)) bsum[r * (K / 16) + b * 16 + lane / 2] = 0;
        if (lane == 0) d[r * (K / 256) + b] = 0.0f;
        return;
    }
    const float iscale = -127.0f / mx;
    int s = 0;
    for (int t = 0; t < 8; ++t) {
        const int8_t qi = q_clamp(iscale * v[t]);
        qb[t] = qi;
        s += qi;
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (!(lane & 1)) bsum[r * (K / 16) + b * 16 + lane / 2] = s;
    if (lane == 0) d[r * (K / 256) + b] = 1.0f / iscale;
}

// ---- matvec -----------------------------------------------------------------------------

struct MV {
    const uint8_t* w;
    const int8_t* wqs;
    const uint16_t* wd;
    uint64_t K, row_bytes;
    const float* af;
    uint64_t af_stride;
    const int8_t* aq;
    const float* ad;
    const int32_t* absum;
    uint32_t R;
    float* y;
    uint64_t y_stride, N, row0;
    const int32_t* expert;
    uint64_t rows_per_expert;
    uint32_t act_div;
    uint64_t act_len;   // values per activation row (K, or groups * K)
    uint64_t rpg;       // grouped product: output rows per group (0: not grouped)
    // Paired product (NW = 2): the up weight beside the gate weight (same type and shape);
    // the epilogue writes silu(clamp(gate)) * clamp(up) (* ew[out row]) into y.
    const uint8_t* w2;
    const int8_t* wqs2;
    const uint16_t* wd2;
    float clamp;
    const float* ew;
    // MoE pair groups (moe_groups): block row y serves group y, pairs of one expert.
    const int32_t* grp;
    const int32_t* grp_pairs;
    const int32_t* n_grp;
    uint32_t grp_cap;    // block rows launched for groups (an upper bound of *n_grp)
    bool early_weights;   // q8_rows_kernel: weight loads before pdl_wait (pdl_early_weights)
    MvTail tail;          // WIDE, one row: the last block's step (matvec_tail)
    // Ungrouped 2-bit expert pairs (kq_flat_pairs: a short prompt round's): a row's super-blocks added in
    // k order, the CPU's vec_dot, as the grouped FLAT GEMMs add them (iq2_stream_kernel and
    // kq_q2k_pipe_kernel with FLAT; kq_pair_flat_ok says where those run).
    bool flat;
};

// The activation rows a block works on ("slots"): RB consecutive rows, or one MoE pair
// group's pairs (all of one expert). Each slot is computed with the same operations
// whatever the other slots are, so a row's result does not depend on the batch.
template <int RB>
struct Slots {
    int n;               // live slots (>= 1); dead slots repeat the last live one
    uint32_t out[RB];    // output row (the pair) of each slot
    uint64_t act[RB];    // its activation row
    uint64_t wbase;      // weight row offset of the block (expert * rows_per_expert)
};

template <int RB>
__device__ __forceinline__ bool get_slots(const MV& p, Slots<RB>& s) {
    uint32_t n;
    if (p.grp) {
        const uint32_t gi = blockIdx.y;
        if (gi >= uint32_t(*p.n_grp)) return false;
        const int32_t* g = p.grp + 3 * gi;
        s.wbase = uint64_t(g[0]) * p.rows_per_expert;
        n = uint32_t(g[2]);
        for (int i = 0; i < RB; ++i) s.out[i] = uint32_t(p.grp_pairs[g[1] + min(i, int(n) - 1)]);
    } else {
        const uint32_t r0 = blockIdx.y * RB;
        n = min(uint32_t(RB), p.R - r0);
        s.wbase = p.expert ? uint64_t(p.expert[r0]) * p.rows_per_expert : 0;
        for (int i = 0; i < RB; ++i) s.out[i] = r0 + uint32_t(min(i, int(n) - 1));
    }
    s.n = int(n);
    for (int i = 0; i < RB; ++i) s.act[i] = s.out[i] / p.act_div;
    return true;
}

constexpr int kRowsPerBlock = 4;   // warps per block, one output row each

template <uint32_t T>
__device__ __forceinline__ float float_weight(const uint8_t* wr, uint64_t k) {
    if (T == T_F32) return reinterpret_cast<const float*>(wr)[k];
    if (T == T_F16) return f16_to_f32(reinterpret_cast<const uint16_t*>(wr)[k]);
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(wr)[k]);
}

// matvec_tail's step, by the last of the product's blocks (256 threads) to finish: y is then
// whole (last_block_done's fences make the other blocks' stores visible).
__device__ __forceinline__ void mv_tail_step(const MvTail t, float* y, uint32_t N) {
    if (!last_block_done(t.count, gridDim.x)) return;
    if (t.kind == MvTail::NormQ8_0) {
        switch (N / 256) {
            case 1: rms_norm_q8_0_row<1>(y, N, t.eps, t.norm_w, t.q, t.d); break;
            case 2: rms_norm_q8_0_row<2>(y, N, t.eps, t.norm_w, t.q, t.d); break;
            case 4: rms_norm_q8_0_row<4>(y, N, t.eps, t.norm_w, t.q, t.d); break;
            default: rms_norm_q8_0_row<8>(y, N, t.eps, t.norm_w, t.q, t.d); break;
        }
    } else {
        __shared__ uint4 scratch[(router_scratch_bytes(256, 32) + 15) / 16];   // (N <= 256, K <= 32)
        RouterArgs a = t.router;
        a.logits = y;
        a.NE = N;
        router_row(a, 0, router_scratch(scratch, N, a.K));
    }
}

// WIDE: a block of 256 threads per output row (rows few and long: the mHC mixes, the router,
// the head's collapse); else a warp per row, kRowsPerBlock rows per block.
// WT: threads per output row on the WIDE path (256, or 1024 for rows of >= 8192 values;
// chosen from K alone so every batch size sums a row in the same order).
// NW = 2: two weights (gate, up) per output row read in the same loop, each with the
// single-weight order of operations, then the SwiGLU of swiglu_kernel in the epilogue.
// TAIL (matvec_tail: WIDE, one row, 256 threads): the last block then runs p.tail's step; a
// template parameter so the other products keep their registers.
template <uint32_t T, int RB, bool VEC, bool WIDE, int WT = 256, int NW = 1, bool TAIL = false>
__global__ void __launch_bounds__(WIDE ? WT : 128) matvec_kernel(MV p) {
    pdl_launch();
    constexpr uint32_t NT = WIDE ? WT : 32;   // threads sharing one output row
    const uint64_t n = WIDE ? uint64_t(blockIdx.x) : uint64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    const uint32_t lane = WIDE ? threadIdx.x : (threadIdx.x & 31);
    // A row whose weight row does not depend on the previous kernels (no expert id, no pair
    // group) is pulled into L2 while those kernels finish (pdl_early_weights); the loop below
    // then streams it from L2.
    if (p.early_weights && !p.expert && !p.grp && blockIdx.y == 0 && n < p.N) {
        const uint64_t wrow = p.row0 + n;
        const bool split = T == T_Q8_0;   // repacked: codes in wqs, scales in wd
        const uint8_t* base = split ? reinterpret_cast<const uint8_t*>(p.wqs) + wrow * p.K : p.w + wrow * p.row_bytes;
        const uint64_t bytes = split ? p.K : p.row_bytes;
        for (uint64_t o = uint64_t(lane) * 128; o < bytes; o += uint64_t(NT) * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + o));
    }
    pdl_wait();
    if (n >= p.N) return;
    Slots<RB> sl;
    if (!get_slots<RB>(p, sl)) return;
    const int nr = sl.n;
    const uint64_t wrow = sl.wbase + p.row0 + n;
    const uint64_t* ar = sl.act;
    float acc[NW][RB];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int i = 0; i < RB; ++i) acc[j][i] = 0.0f;
    const uint64_t K = p.K, AL = p.act_len;
    // Grouped product: output row n reads the activation's group (row0 + n) / rpg.
    const uint64_t goff = p.rpg ? ((p.row0 + n) / p.rpg) * K : 0;

    if constexpr (T == T_F32 || T == T_F16 || T == T_BF16) {
        const uint8_t* wr = p.w + wrow * p.row_bytes;
        if constexpr (VEC) {
            // 8 values (F16/BF16: 16 bytes; F32: two 16-byte loads) per step.
            for (uint64_t u = lane; u < K / 8; u += NT) {
                float wf[8];
                if constexpr (T == T_F32) {
                    const float4 a = reinterpret_cast<const float4*>(wr)[2 * u];
                    const float4 b = reinterpret_cast<const float4*>(wr)[2 * u + 1];
                    wf[0] = a.x, wf[1] = a.y, wf[2] = a.z, wf[3] = a.w, wf[4] = b.x, wf[5] = b.y, wf[6] = b.z,
                    wf[7] = b.w;
                } else {
                    const uint4 v = reinterpret_cast<const uint4*>(wr)[u];
                    const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
                    for (int j = 0; j < 4; ++j) {
                        const uint16_t lo = uint16_t(ws[j] & 0xFFFF), hi = uint16_t(ws[j] >> 16);
                        wf[2 * j] = T == T_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
                        wf[2 * j + 1] = T == T_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
                    }
                }
                for (int i = 0; i < RB; ++i) {
                    if (i >= nr) break;
                    const float4* a4 = reinterpret_cast<const float4*>(p.af + ar[i] * p.af_stride + goff) + 2 * u;
                    const float4 a = a4[0], b = a4[1];
                    float s = acc[0][i];
                    s = fmaf(wf[0], a.x, s);
                    s = fmaf(wf[1], a.y, s);
                    s = fmaf(wf[2], a.z, s);
                    s = fmaf(wf[3], a.w, s);
                    s = fmaf(wf[4], b.x, s);
                    s = fmaf(wf[5], b.y, s);
                    s = fmaf(wf[6], b.z, s);
                    s = fmaf(wf[7], b.w, s);
                    acc[0][i] = s;
                }
            }
        } else {
            for (uint64_t k = lane; k < K; k += NT) {
                const float wv = float_weight<T>(wr, k);
                for (int i = 0; i < RB; ++i) {
                    if (i >= nr) break;
                    acc[0][i] = fmaf(wv, p.af[ar[i] * p.af_stride + goff + k], acc[0][i]);
                }
            }
        }
    } else if constexpr (T == T_Q8_0) {
        const int8_t* wq[NW];
        const uint16_t* wd[NW];
        wq[0] = p.wqs + wrow * K;
        wd[0] = p.wd + wrow * (K / 32);
        if constexpr (NW == 2) {
            wq[NW - 1] = p.wqs2 + wrow * K;
            wd[NW - 1] = p.wd2 + wrow * (K / 32);
        }
#pragma unroll 4
        for (uint64_t b = lane; b < K / 32; b += NT) {
            int4 w0[NW], w1[NW];
            float dw[NW];
#pragma unroll
            for (int j = 0; j < NW; ++j) {
                w0[j] = reinterpret_cast<const int4*>(wq[j] + b * 32)[0];
                w1[j] = reinterpret_cast<const int4*>(wq[j] + b * 32)[1];
                dw[j] = f16_to_f32(wd[j][b]);
            }
            for (int i = 0; i < RB; ++i) {
                // (one slot is always live: no branch, so the unrolled steps are one block of
                // code and their loads can all be issued before the first dp4a)
                if (RB > 1 && i >= nr) break;
                const int4* a4 = reinterpret_cast<const int4*>(p.aq + ar[i] * AL + goff + b * 32);
                const int4 a0 = a4[0], a1 = a4[1];
                const float da = p.ad[ar[i] * (AL / 32) + goff / 32 + b];
#pragma unroll
                for (int j = 0; j < NW; ++j) {
                    int s = __dp4a(w0[j].x, a0.x, 0);
                    s = __dp4a(w0[j].y, a0.y, s);
                    s = __dp4a(w0[j].z, a0.z, s);
                    s = __dp4a(w0[j].w, a0.w, s);
                    s = __dp4a(w1[j].x, a1.x, s);
                    s = __dp4a(w1[j].y, a1.y, s);
                    s = __dp4a(w1[j].z, a1.z, s);
                    s = __dp4a(w1[j].w, a1.w, s);
                    acc[j][i] = fmaf(dw[j] * da, float(s), acc[j][i]);
                }
            }
        }
    } else if constexpr (T == T_MXFP4) {
        const uint8_t* wrs[NW];
        wrs[0] = p.w + wrow * p.row_bytes;
        if constexpr (NW == 2) wrs[NW - 1] = p.w2 + wrow * p.row_bytes;
        for (uint64_t b = lane; b < K / 32; b += NT) {
            float de[NW];
            int wlo[NW][4], whi[NW][4];   // signed byte codes of values 0..15 and 16..31
#pragma unroll
            for (int j = 0; j < NW; ++j) {
                const uint8_t* blk = wrs[j] + b * 17;
                de[j] = e8m0_half(blk[0]);
                for (int w = 0; w < 4; ++w) {
                    uint32_t lo = 0, hi = 0;
                    for (int t = 0; t < 4; ++t) {
                        const uint8_t c = blk[1 + 4 * w + t];
                        lo |= (uint32_t(mxfp4_val(c & 0xF)) & 0xFF) << (8 * t);
                        hi |= (uint32_t(mxfp4_val(c >> 4)) & 0xFF) << (8 * t);
                    }
                    wlo[j][w] = int(lo);
                    whi[j][w] = int(hi);
                }
            }
            for (int i = 0; i < RB; ++i) {
                if (i >= nr) break;
                const int4* a4 = reinterpret_cast<const int4*>(p.aq + ar[i] * AL + goff + b * 32);
                const int4 a0 = a4[0], a1 = a4[1];
                const float da = p.ad[ar[i] * (AL / 32) + goff / 32 + b];
#pragma unroll
                for (int j = 0; j < NW; ++j) {
                    int s = __dp4a(wlo[j][0], a0.x, 0);
                    s = __dp4a(wlo[j][1], a0.y, s);
                    s = __dp4a(wlo[j][2], a0.z, s);
                    s = __dp4a(wlo[j][3], a0.w, s);
                    s = __dp4a(whi[j][0], a1.x, s);
                    s = __dp4a(whi[j][1], a1.y, s);
                    s = __dp4a(whi[j][2], a1.z, s);
                    s = __dp4a(whi[j][3], a1.w, s);
                    acc[j][i] = fmaf(de[j] * da, float(s), acc[j][i]);
                }
            }
        }
    } else {
        static_assert(T == T_Q4_K, "Q2_K and IQ2_XXS have their own kernel (kq_kernel)");
        // Super-blocks of 256: a group of 8 lanes shares one, each lane an eighth of it;
        // the integer partial sums are combined exactly before the per-block float step.
        const uint8_t* wrs[NW];
        wrs[0] = p.w + wrow * p.row_bytes;
        if constexpr (NW == 2) wrs[NW - 1] = p.w2 + wrow * p.row_bytes;
        const uint64_t nsb = K / 256;
        const uint32_t sub = lane & 7;
        // two steps unrolled: the second step's weight loads are issued before the first
        // step's shuffles (expert rows are 4..16 super-blocks: 1..4 steps of a warp)
#pragma unroll 2
        for (uint64_t base = 0; base < nsb; base += NT / 8) {
            const uint64_t sb = base + (lane >> 3);
            const bool ok = sb < nsb;
            for (int i = 0; i < RB; ++i) {
                if (i >= nr) break;
                int isum_[NW], mins_[NW];
                float dw_[NW], dmw_[NW];
#pragma unroll
                for (int jw = 0; jw < NW; ++jw) {
                const uint8_t* wr = wrs[jw];
                int isum = 0, mins = 0;
                float dw = 0.0f, dmw = 0.0f;
                if (ok) {
                    const int8_t* a = p.aq + ar[i] * AL + goff + sb * 256;
                    if constexpr (T == T_Q4_K) {
                        const uint8_t* blk = wr + sb * 144;
                        const uint8_t* s = blk + 4;
                        const uint32_t j = sub;
                        uint32_t sc, m;
                        if (j < 4) {
                            sc = s[j] & 63;
                            m = s[j + 4] & 63;
                        } else {
                            sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                        }
                        const uint32_t* qw = reinterpret_cast<const uint32_t*>(blk + 16 + 32 * (j >> 1));
                        const uint32_t sh = 4 * (j & 1);
                        const int4* a4 = reinterpret_cast<const int4*>(a + 32 * j);
                        const int4 a0 = a4[0], a1 = a4[1];
                        int sm = __dp4a(int((qw[0] >> sh) & 0x0F0F0F0Fu), a0.x, 0);
                        sm = __dp4a(int((qw[1] >> sh) & 0x0F0F0F0Fu), a0.y, sm);
                        sm = __dp4a(int((qw[2] >> sh) & 0x0F0F0F0Fu), a0.z, sm);
                        sm = __dp4a(int((qw[3] >> sh) & 0x0F0F0F0Fu), a0.w, sm);
                        sm = __dp4a(int((qw[4] >> sh) & 0x0F0F0F0Fu), a1.x, sm);
                        sm = __dp4a(int((qw[5] >> sh) & 0x0F0F0F0Fu), a1.y, sm);
                        sm = __dp4a(int((qw[6] >> sh) & 0x0F0F0F0Fu), a1.z, sm);
                        sm = __dp4a(int((qw[7] >> sh) & 0x0F0F0F0Fu), a1.w, sm);
                        isum = int(sc) * sm;
                        const int32_t* bs = p.absum + ar[i] * (AL / 16) + goff / 16 + sb * 16 + 2 * j;
                        mins = int(m) * (bs[0] + bs[1]);
                        dw = f16_to_f32(ld_u16(blk));
                        dmw = f16_to_f32(ld_u16(blk + 2));
                    }
                }
                isum_[jw] = isum, mins_[jw] = mins, dw_[jw] = dw, dmw_[jw] = dmw;
                }
#pragma unroll
                for (int j = 0; j < NW; ++j) {
                int isum = isum_[j], mins = mins_[j];
                const float dw = dw_[j], dmw = dmw_[j];
                isum += __shfl_xor_sync(0xffffffffu, isum, 1);
                isum += __shfl_xor_sync(0xffffffffu, isum, 2);
                isum += __shfl_xor_sync(0xffffffffu, isum, 4);
                mins += __shfl_xor_sync(0xffffffffu, mins, 1);
                mins += __shfl_xor_sync(0xffffffffu, mins, 2);
                mins += __shfl_xor_sync(0xffffffffu, mins, 4);
                if (ok && sub == 0) {
                    const float dx = p.ad[ar[i] * (AL / 256) + goff / 256 + sb];
                    const float dall = dx * dw, dmin = dx * dmw;
                    acc[j][i] += fmaf(dall, float(isum), -(dmin * float(mins)));
                }
                }
            }
        }
    }
    if constexpr (WIDE) {
        __shared__ float red[WT / 32][RB];
        for (int i = 0; i < RB; ++i) {
            const float v = warp_sum(acc[0][i]);
            if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5][i] = v;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0; i < nr; ++i) {
                float v = 0;
                for (int w = 0; w < int(WT / 32); ++w) v += red[w][i];
                p.y[uint64_t(sl.out[i]) * p.y_stride + n] = v;
            }
        if constexpr (TAIL) {
            static_assert(RB == 1 && NW == 1 && WT == 256, "matvec_tail: one row, 256 threads");
            mv_tail_step(p.tail, p.y, uint32_t(p.N));
        }
    } else {
        for (int i = 0; i < RB; ++i) {
            if (i >= nr) break;
            float v = warp_sum(acc[0][i]);
            if constexpr (NW == 2) v = swiglu_pair(v, warp_sum(acc[NW - 1][i]), p.clamp, p.ew, sl.out[i]);
            if (lane == 0) p.y[uint64_t(sl.out[i]) * p.y_stride + n] = v;
        }
    }
}

// ---- Q8_0 decode: several rows per warp, every load of the warp issued at once ----------
// A one-row product over a 35 MB Q8_0 matrix (q_b, out_a, out_b) with a warp per row left the
// memory system underfed: q_b's rows are 1 KB (one block per lane, then the warp is done:
// 8,192 blocks in 6 waves of set-up and reduction), out_b's 8 KB rows give only 4,096 warps
// (0.8 waves) with 4 loads in flight each (ncu run 23: 45-52 % of DRAM bandwidth, warps
// stalled on their loads half the time). Here a warp takes RW consecutive rows and a lane
// the NB blocks lane, lane + 32, ... of each row, all RW * NB weight loads issued before any
// arithmetic (~8 KB per warp in flight). Each row's sum is matvec_kernel's exactly: the
// same blocks per lane in the same order, the same fmaf chain, the same warp butterfly, so
// the tensor-core prefill products (gemm.cu) still equal decode bit for bit.
constexpr int kQ8Warps = 4;   // warps per block of q8_rows_kernel

// FIRST (DSV4_Q8_ROWS_V >= 1): every weight load guaranteed in flight before any arithmetic.
// ptxas gives the plain kernel 42-62 registers although <8,1,1> alone holds 64 registers of
// weights: it issues part of the loads only after the first rows' arithmetic (register-
// pressure scheduling, which the PTX order does not bind). With FIRST the first integer sum
// of every row starts from `dep & z`: dep is the xor of one word of every weight load, z an
// opaque zero (%dynamic_smem_size, the launch gives none), so the sums are the same (an
// integer 0 added) while no dp4a may start before every weight load has returned. Those
// loads are read once per token: ld.global.nc with L1::no_allocate and an L2 evict-first
// policy, so they neither evict the activations from L1 nor the next kernels' data from L2.
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ int4 ld_stream16(const void* ptr, uint64_t pol) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.s32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr), "l"(pol));
    return v;
}
__device__ __forceinline__ uint16_t ld_stream2(const uint16_t* ptr, uint64_t pol) {
    uint16_t v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(ptr), "l"(pol));
    return v;
}
__device__ __forceinline__ uint32_t opaque_zero() {
    uint32_t z;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(z));
    return z;
}

template <int RW, int NB, int NW, bool FIRST>
__global__ void __launch_bounds__(32 * kQ8Warps) q8_rows_kernel(MV p) {
    pdl_launch();
    if (!p.early_weights) pdl_wait();
    const uint32_t lane = threadIdx.x & 31;
    const uint64_t n0 = (uint64_t(blockIdx.x) * kQ8Warps + (threadIdx.x >> 5)) * RW;
    if (n0 >= p.N) return;   // (touches nothing: no wait needed)
    const uint64_t K = p.K;
    // rows of one warp share their activation group (launch checks rpg % RW == 0)
    const uint64_t goff = p.rpg ? ((p.row0 + n0) / p.rpg) * K : 0;
    const int nrow = int(min(uint64_t(RW), p.N - n0));
    const uint64_t pol = FIRST ? evict_first_policy() : 0;
    int4 w0[RW][NW][NB], w1[RW][NW][NB];
    uint16_t wd[RW][NW][NB];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const uint64_t wrow = p.row0 + n0 + uint64_t(min(r, nrow - 1));
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int8_t* wq = (j == 0 ? p.wqs : p.wqs2) + wrow * K;
            const uint16_t* wdr = (j == 0 ? p.wd : p.wd2) + wrow * (K / 32);
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const int8_t* q = wq + (lane + 32 * b) * 32;
                if constexpr (FIRST) {
                    w0[r][j][b] = ld_stream16(q, pol);
                    w1[r][j][b] = ld_stream16(q + 16, pol);
                    wd[r][j][b] = ld_stream2(wdr + lane + 32 * b, pol);
                } else {
                    w0[r][j][b] = reinterpret_cast<const int4*>(q)[0];
                    w1[r][j][b] = reinterpret_cast<const int4*>(q)[1];
                    wd[r][j][b] = wdr[lane + 32 * b];
                }
            }
        }
    }
    // The activation is the previous kernel's output: from here on, wait for it. The weight
    // loads above are in flight meanwhile (overlapping that kernel's tail).
    if (p.early_weights) pdl_wait();
    int4 a0[NB], a1[NB];
    float da[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        const int4* a4 = reinterpret_cast<const int4*>(p.aq + goff + (lane + 32 * b) * 32);
        a0[b] = a4[0];
        a1[b] = a4[1];
        da[b] = p.ad[goff / 32 + lane + 32 * b];
    }
    int zero = 0;
    if constexpr (FIRST) {
        uint32_t dep = 0;
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int b = 0; b < NB; ++b) dep ^= uint32_t(w0[r][j][b].x) ^ uint32_t(w1[r][j][b].x) ^ wd[r][j][b];
        zero = int(dep & opaque_zero());
    }
    float out[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        float acc[NW];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            acc[j] = 0.0f;
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                int sm = __dp4a(w0[r][j][b].x, a0[b].x, zero);
                sm = __dp4a(w0[r][j][b].y, a0[b].y, sm);
                sm = __dp4a(w0[r][j][b].z, a0[b].z, sm);
                sm = __dp4a(w0[r][j][b].w, a0[b].w, sm);
                sm = __dp4a(w1[r][j][b].x, a1[b].x, sm);
                sm = __dp4a(w1[r][j][b].y, a1[b].y, sm);
                sm = __dp4a(w1[r][j][b].z, a1[b].z, sm);
                sm = __dp4a(w1[r][j][b].w, a1[b].w, sm);
                acc[j] = fmaf(f16_to_f32(wd[r][j][b]) * da[b], float(sm), acc[j]);
            }
        }
        out[r] = warp_sum(acc[0]);
        if constexpr (NW == 2) out[r] = swiglu_pair(out[r], warp_sum(acc[NW - 1]), p.clamp, p.ew, 0);
    }
    // stores last: nothing may keep the compiler from issuing every load first
#pragma unroll
    for (int r = 0; r < RW; ++r)
        if (r < nrow && lane == 0) p.y[n0 + r] = out[r];
}

// ---- the read floor (a benchmark's reference, not a product) ------------------------------
// How fast a product of this many weight bytes could be: the bytes read and xor-ed, nothing
// else. mode 0: one wave of warps each loading its own 8 KB at once (q8_rows_kernel's
// pattern); mode 1 / 2: a resident grid walking the bytes with 4 / 8 16-byte loads a thread
// in flight.
template <int MODE>
__global__ void __launch_bounds__(128) read_floor_kernel(const int4* p, uint64_t n16, uint32_t* sink) {
    const uint32_t lane = threadIdx.x & 31;
    uint32_t x = 0;
    if constexpr (MODE == 0) {
        const uint64_t base = (uint64_t(blockIdx.x) * 4 + (threadIdx.x >> 5)) * 512;   // 8 KB a warp
        int4 v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const uint64_t k = base + 32 * i + lane;
            v[i] = k < n16 ? ld_stream16(p + k, evict_first_policy()) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) x ^= uint32_t(v[i].x ^ v[i].y ^ v[i].z ^ v[i].w);
    } else {
        constexpr int U = MODE == 1 ? 4 : 8;
        const uint64_t pol = evict_first_policy(), stride = uint64_t(gridDim.x) * blockDim.x;
        for (uint64_t k0 = uint64_t(blockIdx.x) * blockDim.x * U + threadIdx.x; k0 < n16; k0 += stride * U) {
            int4 v[U];
#pragma unroll
            for (int i = 0; i < U; ++i) {
                const uint64_t k = k0 + uint64_t(i) * blockDim.x;
                v[i] = k < n16 ? ld_stream16(p + k, pol) : make_int4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < U; ++i) x ^= uint32_t(v[i].x ^ v[i].y ^ v[i].z ^ v[i].w);
        }
    }
    if (x == 0x9E3779B9u) sink[0] = x;   // (keeps the loads)
}

int g_q8_rows_select = -1;   // q8_rows_select

// One activation row (decode), rows of 1,024..8,192 values read by a warp each (not the
// wide-block rows decode_row_threads gives 256+ threads): RW rows per warp for ~8 KB of
// weights in flight per warp (fewer with the paired gate+up, for registers).
// DSV4_Q8_ROWS_V (read once) selects the variant for A/B: 0 (default) q8_rows_kernel (loads
// in the order ptxas picks), 1 the same with FIRST (every weight load issued first,
// evict-first), 2 the same with twice the rows per warp (~16 KB per warp in flight, 8 KB
// with gate+up). On the H200 (run 28, 4 layers, one run) variant 0 gave 0.146 ms per layer,
// variant 1 0.149: forcing every load first did not pay, so 0 stays the default; on 43
// layers (run 50, one call) 2 gave 147.5 tok/s against 151.1, and (run 51, since removed)
// half the rows per warp 145.4 against 152.0. DSV4_Q8_ROWS=0 turns the whole path off
// (matvec_kernel).
bool launch_q8_rows(const MV& p, int nw, cudaStream_t s) {
    static const bool on = env_switch("DSV4_Q8_ROWS", true);
    static const int v_env = env_int("DSV4_Q8_ROWS_V", 0);
    if (!on || p.R != 1 || p.expert || p.grp || p.K % 1024 != 0 || p.K > 8192 ||
        decode_row_threads(p.K, p.N, false) != 32)
        return false;
    const int v = g_q8_rows_select >= 0 ? g_q8_rows_select : v_env;
    const int nb = int(p.K / 1024);
    int rw = std::max(1, (nw == 2 ? 4 : 8) * (v >= 2 ? 2 : 1) / nb);
    while (p.rpg && p.rpg % uint64_t(rw) != 0) rw /= 2;
    const uint32_t rows_per_block = uint32_t(kQ8Warps * rw);
    const dim3 grid(uint32_t((p.N + rows_per_block - 1) / rows_per_block)), block(32 * kQ8Warps);
#define DSV4_Q8(RW, NB, NW)                                                            \
    if (rw == RW && nb == NB && nw == NW) {                                            \
        if (v == 0) q8_rows_kernel<RW, NB, NW, false><<<grid, block, 0, s>>>(p);       \
        else q8_rows_kernel<RW, NB, NW, true><<<grid, block, 0, s>>>(p);               \
        return true;                                                                   \
    }
    DSV4_Q8(8, 1, 1) DSV4_Q8(4, 2, 1) DSV4_Q8(2, 4, 1) DSV4_Q8(1, 8, 1)
    DSV4_Q8(4, 1, 2) DSV4_Q8(2, 2, 2) DSV4_Q8(1, 4, 2) DSV4_Q8(1, 8, 2)
#define DSV4_Q8_V1(RW, NB, NW)                                                                        \
    if (rw == RW && nb == NB && nw == NW) {                                                           \
        q8_rows_kernel<RW, NB, NW, true><<<grid, block, 0, s>>>(p);                                   \
        return true;                                                                                  \
    }
    if (v >= 2) {   // (v = 2 only: the shapes twice the rows per warp adds)
        DSV4_Q8_V1(16, 1, 1) DSV4_Q8_V1(8, 2, 1) DSV4_Q8_V1(4, 4, 1) DSV4_Q8_V1(2, 8, 1)
        DSV4_Q8_V1(8, 1, 2) DSV4_Q8_V1(4, 2, 2) DSV4_Q8_V1(2, 4, 2)
    }
#undef DSV4_Q8_V1
#undef DSV4_Q8
    return false;
}

// ---- the 2-bit expert types (Q2_K, IQ2_XXS), repacked ------------------------------------
// Codes of a super-block are 64 (IQ2_XXS) or 16 + 64 (Q2_K: scales, codes) 16-byte aligned
// bytes (repack_rows), so a warp step covers 8 super-blocks with one 16-byte load per lane:
// lane l reads quarter q = l & 3 of super-block 8*step + (l >> 2). The four lanes of a
// super-block add their integer sums exactly (two shuffles), then lane q = 0 does the CPU's
// float step for that super-block. A warp computes RW output rows (their weight loads all
// issued before any arithmetic, PS steps ahead) for the RB slots of its block.

// IQ2_XXS: the 32 signed code bytes of one group as 8 words for dp4a: 4 grid rows of 8
// magnitudes with their signs (bytes negated as (v ^ m) + (m & 1): exact, grid bytes are 8,
// 25 or 43, never 0).
__device__ __forceinline__ void iq2_expand(uint32_t a0, uint32_t a1, uint32_t* w) {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const uint64_t gv = __ldg(&g_iq2_grid[(a0 >> (8 * l)) & 0xFF]);
        const uint64_t m = __ldg(&g_iq2_sign[(a1 >> (7 * l)) & 127]);
        const uint32_t m0 = uint32_t(m), m1 = uint32_t(m >> 32);
        w[2 * l] = (uint32_t(gv) ^ m0) + (m0 & 0x01010101u);
        w[2 * l + 1] = (uint32_t(gv >> 32) ^ m1) + (m1 & 0x01010101u);
    }
}

// The integer sum of one group against its 32 activation codes, times the group's odd scale
// 2 * (a1 >> 28) + 1.
__device__ __forceinline__ int iq2_group(uint32_t a0, uint32_t a1, int4 x0, int4 x1) {
    uint32_t w[8];
    iq2_expand(a0, a1, w);
    const int aw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    int sm = 0;
#pragma unroll
    for (int l = 0; l < 8; ++l) sm = __dp4a(int(w[l]), aw[l], sm);
    return sm * int(2 * (a1 >> 28) + 1);
}

constexpr int kKqWarps = 8;   // warps per block of kq_kernel

// IQ2_XXS decode (one slot) with its tables in shared memory (kq_body's SM = 1 or 2;
// DSV4_KQ_SMEM=0 selects the global-memory lookups of iq2_expand for A/B, see launch_kq).
// Each lane does 16 table lookups per 16 bytes of weights at random indices: from global memory they go through L1 as scattered
// requests, and even from one shared copy random indices collide on banks (a 64-bit lookup
// of a half-warp into 16 bank pairs costs ~3 passes instead of 1). So each lane reads its own
// copy of replicated tables (iq2.cuh: the grid in 16 copies, the sign selectors in 32), and
// a warp's lookups are conflict-free: 48 KB.
// Per 8 values this is 2 loads (3 shared passes per warp) and 2 + 2 + 1 + 2 + 2 integer
// operations (the two offsets, the high selector, two negations, two prmt) instead of 2
// scattered global loads and about 4 + 4 + 6 (64-bit addresses, then xor / and / add per word).
// The integers are the same, so are the sums and the results (bit for bit).
constexpr uint32_t kIq2SmemGrid = kIq2GridRepBytes;               // bytes of the grid copies
constexpr uint32_t kIq2SmemBytes = kIq2SmemGrid + 128 * 32 * 4;  // + the selector copies

__device__ const Iq2Selectors g_iq2_sel = iq2_selectors();

// Fills the shared tables (the block's 256 threads, then a barrier): iq2_fill_rep's loads are
// L1 / L2 hits mostly (every block of the SM reads the same 2.5 KB), beside the weight loads
// already in flight.
__device__ __forceinline__ void iq2_fill_smem(uint4* sm) {
    iq2_fill_rep<32 * kKqWarps, 32>(sm, sm + kIq2SmemGrid / 16, g_iq2_grid, g_iq2_sel.v, threadIdx.x);
    __syncthreads();
}

// iq2_expand from the shared tables: the same 8 words. smb: the tables; lane: threadIdx.x & 31.
__device__ __forceinline__ void iq2_expand_smem(uint32_t a0, uint32_t a1, const uint8_t* smb, uint32_t lane,
                                                uint32_t* w) {
    iq2_expand_rep<32>(a0, a1, smb + (lane & 15) * 8, smb + kIq2SmemGrid + lane * 4, w);
}

// iq2_group with the shared tables: the same integer sum, the same order.
__device__ __forceinline__ int iq2_group_smem(uint32_t a0, uint32_t a1, int4 x0, int4 x1, const uint8_t* smb,
                                              uint32_t lane) {
    uint32_t w[8];
    iq2_expand_smem(a0, a1, smb, lane, w);
    const int aw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    int sm = 0;
#pragma unroll
    for (int l = 0; l < 8; ++l) sm = __dp4a(int(w[l]), aw[l], sm);
    return sm * int(2 * (a1 >> 28) + 1);
}

// One Q2_K super-block of one weight row for this lane (quarter q: half h = q >> 1, sub-block
// parity s = q & 1; values 128h + 32j + 16s + t (t < 16) of plane j = 0..3 sit at bits 2j of
// its 16 code bytes w, with its 8 scale bytes sc): the four lanes' integer sums added exactly
// (two shuffles: every lane of the warp calls it), then lane q = 0 (`lead`, and the super-block
// in the row) adds the CPU's float step for the super-block to acc. x, bs: the activation's
// codes and 16-value sums for this lane's values; dx its super-block scale.
// The super-block's float step (the CPU's dot_q2_k): fmaf(dall, isum, -(dmin·mins)).
__device__ __forceinline__ float q2k_term(uint32_t dv, float dx, int isum, int mins) {
    const float dw = f16_to_f32(uint16_t(dv));
    const float dmw = f16_to_f32(uint16_t(dv >> 16));
    const float dall = dx * dw, dmin = dx * dmw;
    return fmaf(dall, float(isum), -(dmin * float(mins)));
}
// The super-block's integer sums (every lane of its four: two shuffles each).
__device__ __forceinline__ void q2k_lane_sums(const uint4 w, const uint2 sc, const int4 (&x)[4], const int (&bs)[4],
                                              uint32_t s, int& isum, int& mins) {
    const uint64_t scb = uint64_t(sc.x) | (uint64_t(sc.y) << 32);
    isum = 0, mins = 0;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        const uint32_t sh = 2 * jj;
        int sm = __dp4a(int((w.x >> sh) & 0x03030303u), x[jj].x, 0);
        sm = __dp4a(int((w.y >> sh) & 0x03030303u), x[jj].y, sm);
        sm = __dp4a(int((w.z >> sh) & 0x03030303u), x[jj].z, sm);
        sm = __dp4a(int((w.w >> sh) & 0x03030303u), x[jj].w, sm);
        const uint32_t scv = uint32_t(scb >> (8 * (2 * jj + s))) & 0xFF;
        isum += int(scv & 0xF) * sm;
        mins += int(scv >> 4) * bs[jj];
    }
    isum += __shfl_xor_sync(0xffffffffu, isum, 1);
    isum += __shfl_xor_sync(0xffffffffu, isum, 2);
    mins += __shfl_xor_sync(0xffffffffu, mins, 1);
    mins += __shfl_xor_sync(0xffffffffu, mins, 2);
}
__device__ __forceinline__ void q2k_lane_step(const uint4 w, const uint2 sc, uint32_t dv, const int4 (&x)[4],
                                              const int (&bs)[4], uint32_t s, bool lead, float dx, float& acc) {
    int isum, mins;
    q2k_lane_sums(w, sc, x, bs, s, isum, mins);
    if (lead) acc += q2k_term(dv, dx, isum, mins);
}

// SM: 0 tables in global memory (iq2_expand, kq_kernel); 1 in shared memory (iq2_expand_smem,
// kq_kernel_smem with 2 blocks of 8 warps per SM); 2 the same with 3 blocks per SM (registers
// capped at 80: the gate+up decode variant then spills some).
template <uint32_t T, int RB, int NW, int RW, int PS, int SM>
__device__ __forceinline__ void kq_body(const MV& p) {
    static_assert(SM == 0 || (T == T_IQ2_XXS && RB == 1), "shared tables: IQ2_XXS with one slot");
    // SM: kIq2SmemBytes of tables (launch_kq), filled once per block: before waiting for the
    // kernels this one depends on when p.early_weights (the tables are constants), else once
    // the first weight loads are issued (the fill's own loads then wait beside them). Every
    // thread passes exactly one barrier: warps without rows fill after their (empty) loop.
    // The grid may be smaller than the rows (launch_kq sizes it to what the GPU holds at
    // once): a warp then takes the rows n0, n0 + stride, ... one group of RW after another,
    // each with the same operations as a warp of its own would do.
    extern __shared__ uint4 kq_smem[];
    constexpr uint32_t BODY = T == T_IQ2_XXS ? 64 : 80;   // repacked bytes per super-block
    constexpr uint32_t CODES = T == T_IQ2_XXS ? 0 : 16;   // where its codes start
    constexpr uint32_t AUX = T == T_IQ2_XXS ? 1 : 2;      // f16 scales per super-block
    const uint32_t lane = threadIdx.x & 31, q = lane & 3;
    bool filled = false;
    if constexpr (SM != 0) {
        if (p.early_weights) {
            iq2_fill_smem(kq_smem);
            filled = true;
        }
    }
    pdl_wait();
    Slots<RB> sl;
    const bool live = get_slots<RB>(p, sl);   // (one slot: get_slots always succeeds)
    const uint64_t nsb = p.K / 256, AL = p.act_len;
    const uint64_t stride = uint64_t(gridDim.x) * kKqWarps * RW;
    for (uint64_t n0 = (uint64_t(blockIdx.x) * kKqWarps + (threadIdx.x >> 5)) * RW; live && nsb && n0 < p.N;
         n0 += stride) {
        const int nrow = int(min(uint64_t(RW), p.N - n0));
        const uint8_t* wq[RW][NW];
        const uint16_t* wd[RW][NW];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const uint64_t wrow = sl.wbase + p.row0 + n0 + uint64_t(min(r, nrow - 1));
            wq[r][0] = reinterpret_cast<const uint8_t*>(p.wqs) + wrow * nsb * BODY;
            wd[r][0] = p.wd + wrow * nsb * AUX;
            if constexpr (NW == 2) {
                wq[r][NW - 1] = reinterpret_cast<const uint8_t*>(p.wqs2) + wrow * nsb * BODY;
                wd[r][NW - 1] = p.wd2 + wrow * nsb * AUX;
            }
        }
        float acc[RW][NW][RB];
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int i = 0; i < RB; ++i) acc[r][j][i] = 0.0f;

        for (uint64_t base = 0; base < nsb; base += 8 * PS) {
            // every weight load of PS steps first: the bytes in flight are what sets the speed
            uint4 wv[PS][RW][NW];
            uint2 sc[PS][RW][NW];      // Q2_K: the 8 scale bytes of this lane's half
            uint32_t dv[PS][RW][NW];   // f16 scale(s) of the super-block
#pragma unroll
            for (int st = 0; st < PS; ++st) {
                const uint64_t sb = base + 8 * st + (lane >> 2);
#pragma unroll
                for (int r = 0; r < RW; ++r)
#pragma unroll
                    for (int j = 0; j < NW; ++j) {
                        if (sb < nsb) {
                            const uint8_t* blk = wq[r][j] + sb * BODY;
                            wv[st][r][j] = *reinterpret_cast<const uint4*>(blk + CODES + 16 * q);
                            if constexpr (T == T_Q2_K) {
                                sc[st][r][j] = *reinterpret_cast<const uint2*>(blk + 8 * (q >> 1));
                                dv[st][r][j] = *reinterpret_cast<const uint32_t*>(wd[r][j] + sb * 2);
                            } else {
                                dv[st][r][j] = wd[r][j][sb];
                            }
                        } else {
                            wv[st][r][j] = make_uint4(0, 0, 0, 0);
                            sc[st][r][j] = make_uint2(0, 0);
                            dv[st][r][j] = 0;
                        }
                    }
            }
            if constexpr (SM != 0) {
                if (!filled) {
                    iq2_fill_smem(kq_smem);
                    filled = true;
                }
            }
            // IQ2_XXS with several slots: the signed code bytes of this lane's two groups
            uint32_t wx[PS][RW][NW][T == T_IQ2_XXS && RB > 1 ? 16 : 1];
            if constexpr (T == T_IQ2_XXS && RB > 1) {
#pragma unroll
                for (int st = 0; st < PS; ++st)
#pragma unroll
                    for (int r = 0; r < RW; ++r)
#pragma unroll
                        for (int j = 0; j < NW; ++j) {
                            const uint4 w = wv[st][r][j];
                            iq2_expand(w.x, w.y, &wx[st][r][j][0]);
                            iq2_expand(w.z, w.w, &wx[st][r][j][8]);
                        }
            }
#pragma unroll
            for (int st = 0; st < PS; ++st) {
                const uint64_t sb = base + 8 * st + (lane >> 2);
                const bool ok = sb < nsb;
                for (int i = 0; i < RB; ++i) {
                    if (i >= sl.n) break;
                    const int8_t* a = p.aq + sl.act[i] * AL + (ok ? sb : 0) * 256;
                    const float dx = ok ? p.ad[sl.act[i] * (AL / 256) + sb] : 0.0f;
                    if constexpr (T == T_IQ2_XXS) {
                        // groups 2q and 2q+1: 64 activation codes
                        const int4* a4 = reinterpret_cast<const int4*>(a + 64 * q);
                        const int4 x0 = a4[0], x1 = a4[1], x2 = a4[2], x3 = a4[3];
#pragma unroll
                        for (int r = 0; r < RW; ++r)
#pragma unroll
                            for (int j = 0; j < NW; ++j) {
                                const uint4 w = wv[st][r][j];
                                int isum;
                                if constexpr (RB > 1) {
                                    // several slots share each weight row: its codes were expanded
                                    // to signed bytes once (wx), so a slot costs 16 dp4a
                                    const int aw[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                                                        x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
                                    int s0 = 0, s1 = 0;
#pragma unroll
                                    for (int t = 0; t < 8; ++t) {
                                        s0 = __dp4a(int(wx[st][r][j][t]), aw[t], s0);
                                        s1 = __dp4a(int(wx[st][r][j][8 + t]), aw[8 + t], s1);
                                    }
                                    isum = s0 * int(2 * (w.y >> 28) + 1) + s1 * int(2 * (w.w >> 28) + 1);
                                } else if constexpr (SM != 0) {
                                    const uint8_t* smb = reinterpret_cast<const uint8_t*>(kq_smem);
                                    isum = iq2_group_smem(w.x, w.y, x0, x1, smb, lane) +
                                           iq2_group_smem(w.z, w.w, x2, x3, smb, lane);
                                } else {
                                    isum = iq2_group(w.x, w.y, x0, x1) + iq2_group(w.z, w.w, x2, x3);
                                }
                                isum += __shfl_xor_sync(0xffffffffu, isum, 1);
                                isum += __shfl_xor_sync(0xffffffffu, isum, 2);
                                if (ok && q == 0) {
                                    const float dw = f16_to_f32(uint16_t(dv[st][r][j]));
                                    acc[r][j][i] = fmaf(dw * dx, float(isum), acc[r][j][i]);
                                }
                            }
                    } else {
                        // half h = q >> 1, sub-block parity s = q & 1: values 128h + 32j + 16s + t
                        // (t < 16) of plane j = 0..3 sit at bits 2j of this lane's 16 code bytes
                        const uint32_t h = q >> 1, s = q & 1;
                        int4 x[4];
                        int bs[4];
#pragma unroll
                        for (int jj = 0; jj < 4; ++jj) {
                            x[jj] = *reinterpret_cast<const int4*>(a + 128 * h + 32 * jj + 16 * s);
                            bs[jj] = ok ? p.absum[sl.act[i] * (AL / 16) + sb * 16 + 8 * h + 2 * jj + s] : 0;
                        }
#pragma unroll
                        for (int r = 0; r < RW; ++r)
#pragma unroll
                            for (int j = 0; j < NW; ++j)
                                q2k_lane_step(wv[st][r][j], sc[st][r][j], dv[st][r][j], x, bs, s, ok && q == 0, dx,
                                              acc[r][j][i]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            if (r >= nrow) break;
            for (int i = 0; i < RB; ++i) {
                if (i >= sl.n) break;
                float v = warp_sum(acc[r][0][i]);
                if (T == T_IQ2_XXS) v *= 0.125f;
                if constexpr (NW == 2) {
                    float u = warp_sum(acc[r][NW - 1][i]);
                    if (T == T_IQ2_XXS) u *= 0.125f;
                    v = swiglu_pair(v, u, p.clamp, p.ew, sl.out[i]);
                }
                if (lane == 0) p.y[uint64_t(sl.out[i]) * p.y_stride + n0 + r] = v;
            }
        }
    }
    if constexpr (SM != 0) {
        if (!filled) iq2_fill_smem(kq_smem);
    }
}

template <uint32_t T, int RB, int NW, int RW, int PS>
__global__ void __launch_bounds__(32 * kKqWarps) kq_kernel(MV p) {
    pdl_launch();   // (kq_body waits)
    kq_body<T, RB, NW, RW, PS, 0>(p);
}

// The shared-table variants (IQ2_XXS, one slot) with registers capped for MINB blocks per SM:
// 2 (128 registers) for SM = 1, 3 (80) for SM = 2.
template <uint32_t T, int NW, int RW, int PS, int MINB>
__global__ void __launch_bounds__(32 * kKqWarps, MINB) kq_kernel_smem(MV p) {
    pdl_launch();   // (kq_body waits)
    kq_body<T, 1, NW, RW, PS, MINB == 3 ? 2 : 1>(p);
}

// Q2_K decode with one slot (the routed experts' down product, K = 2,048: one step of
// 8 super-blocks per row) and registers capped for MINB blocks per SM. kq_kernel<Q2_K, 1,
// 1, 4, 1> takes 123 registers (2 blocks of 8 warps per SM) for only ~2.7 KB of weights in
// flight per warp (4 rows x 8 super-blocks x 84 bytes): ~43 KB per SM. DSV4_Q2K_V (read
// once; launch_kq) selects: 0 that kernel; 1 8 rows per warp, capped at 2 blocks per SM (122
// registers, no spills): ~5.4 KB per warp, ~86 KB per SM, 1.45 waves of warps for 6 experts
// x 4,096 rows; 2 four rows per warp with 3 blocks per SM (80 registers, ~24 bytes
// of spills): ~65 KB per SM, 1.94 waves; 3 eight rows with 3 blocks per SM (~190 bytes of
// spills): ~130 KB per SM, one wave. Rows per warp change nothing in a row's sum
// (the same lanes, blocks and operations), so every variant gives the same bits. On the H200
// (run 28, 4 layers) 0 / 1 / 2 gave 0.150 / 0.149 / 0.147 ms per layer, within the spread;
// on 43 layers (run 50, one call) 2 gave 155.1 tok/s against 151.1 for 1: more warps to
// overlap one warp's arithmetic with the others' loads beat more bytes in flight per warp.
// Run 51 (one call): 2 152.0, 1 149.8, and (since removed) two or four rows per warp with 4
// blocks per SM 149.4 and 146.0: 3 blocks of 4 rows is the best of those measured. 4 and 5
// (kq_q2k_pipe_kernel, below) pipeline the groups; 4 is the default since run 59.
template <uint32_t T, int NW, int RW, int PS, int MINB>
__global__ void __launch_bounds__(32 * kKqWarps, MINB) kq_kernel_mb(MV p) {
    pdl_launch();   // (kq_body waits)
    kq_body<T, 1, NW, RW, PS, 0>(p);
}
// Q2_K with one slot and rows of at most one step (K <= 2,048: the routed experts' down
// product), pipelined (DSV4_Q2K_V=4 and 5): kq_kernel_mb's warps load a group of RW rows,
// wait for it, do its arithmetic and only then load the next group; here the next group's
// loads are issued before the current group's arithmetic, so each warp keeps loads in flight
// while it computes (two buffers of RW rows). A row's sum is kq_body's (the same lanes,
// q2k_lane_step, the same warp butterfly): the same bits. On 43 layers (run 59, one call,
// each setting twice after a warm-up run) 4 (two rows a warp, 3 blocks an SM, no spills)
// took 5.937 / 5.958 ms a token for the layers against 5.982 / 5.974 for 2: 0.5 %, the
// default since (run 58, without the warm-up: 5 slower than 4).
template <int RW>
struct Q2kRows {
    uint4 w[RW];
    uint2 sc[RW];
    uint32_t dv[RW];
};

template <int RW>
__device__ __forceinline__ void q2k_rows_load(Q2kRows<RW>& B, const MV& p, uint64_t wbase, uint64_t n0, uint64_t sb,
                                              bool ok, uint32_t q) {
    const uint64_t nsb = p.K / 256;
    const int nrow = int(min(uint64_t(RW), p.N - n0));
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const uint64_t wrow = wbase + p.row0 + n0 + uint64_t(min(r, nrow - 1));
        if (ok) {
            const uint8_t* blk = reinterpret_cast<const uint8_t*>(p.wqs) + (wrow * nsb + sb) * 80;
            B.w[r] = *reinterpret_cast<const uint4*>(blk + 16 + 16 * q);
            B.sc[r] = *reinterpret_cast<const uint2*>(blk + 8 * (q >> 1));
            B.dv[r] = *reinterpret_cast<const uint32_t*>(p.wd + (wrow * nsb + sb) * 2);
        } else {
            B.w[r] = make_uint4(0, 0, 0, 0);
            B.sc[r] = make_uint2(0, 0);
            B.dv[r] = 0;
        }
    }
}

// FLAT: the row's super-blocks' terms (on their lanes 4 sb) added in k order from 0 (the CPU's
// dot_q2_k, as the grouped FLAT GEMM adds them) instead of decode's butterfly.
template <int RW, int MINB, bool FLAT = false>
__global__ void __launch_bounds__(32 * kKqWarps, MINB) kq_q2k_pipe_kernel(MV p) {
    pdl_launch();
    pdl_wait();   // the expert of the block row (and the activation) come from the kernels before
    Slots<1> sl;
    get_slots<1>(p, sl);
    const uint32_t lane = threadIdx.x & 31, q = lane & 3, h = q >> 1, s = q & 1;
    const uint64_t nsb = p.K / 256, AL = p.act_len, sb = lane >> 2;
    const bool ok = sb < nsb;
    uint64_t n0 = (uint64_t(blockIdx.x) * kKqWarps + (threadIdx.x >> 5)) * RW;
    if (n0 >= p.N) return;
    const uint64_t stride = uint64_t(gridDim.x) * kKqWarps * RW;
    Q2kRows<RW> A, B;
    q2k_rows_load(A, p, sl.wbase, n0, sb, ok, q);
    // this lane's activation codes and sums (one slot, one step: the same for every group)
    const int8_t* a = p.aq + sl.act[0] * AL + (ok ? sb : 0) * 256;
    const float dx = ok ? p.ad[sl.act[0] * (AL / 256) + sb] : 0.0f;
    int4 x[4];
    int bs[4];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        x[jj] = *reinterpret_cast<const int4*>(a + 128 * h + 32 * jj + 16 * s);
        bs[jj] = ok ? p.absum[sl.act[0] * (AL / 16) + sb * 16 + 8 * h + 2 * jj + s] : 0;
    }
    auto finish = [&](const Q2kRows<RW>& G, uint64_t g0) {
        const int nrow = int(min(uint64_t(RW), p.N - g0));
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            float v = 0.0f;
            if constexpr (FLAT) {
                int isum, mins;
                q2k_lane_sums(G.w[r], G.sc[r], x, bs, s, isum, mins);
                const float t = q2k_term(G.dv[r], dx, isum, mins);
                for (uint32_t b = 0; b < uint32_t(nsb); ++b) v += __shfl_sync(0xffffffffu, t, 4 * b);
            } else {
                q2k_lane_step(G.w[r], G.sc[r], G.dv[r], x, bs, s, ok && q == 0, dx, v);
                v = warp_sum(v);
            }
            if (r < nrow && lane == 0) p.y[uint64_t(sl.out[0]) * p.y_stride + g0 + r] = v;
        }
    };
    // two buffers walked alternately (unrolled by two: no register copies)
    for (;;) {
        uint64_t nn = n0 + stride;
        if (nn < p.N) q2k_rows_load(B, p, sl.wbase, nn, sb, ok, q);
        finish(A, n0);
        if (nn >= p.N) break;
        n0 = nn;
        nn = n0 + stride;
        if (nn < p.N) q2k_rows_load(A, p, sl.wbase, nn, sb, ok, q);
        finish(B, n0);
        if (nn >= p.N) break;
        n0 = nn;
    }
}
// ---- IQ2_XXS decode streamed through shared memory (DSV4_KQ_STREAM) ----------------------
//
// kq_kernel_smem holds a warp's weights in registers: a warp loads its rows, waits, computes,
// and only then loads again, and the registers those loads take cap the warps an SM keeps.
// Here each warp streams its rows into a ring of NST stages in shared memory by bulk copies
// (lane 0 issues them; no registers while in flight) and refills a stage as soon as it has
// read it, so from the router's result on every warp has NST rows on the way. The activation
// (one per block row: the pair's, or the row of a one-row product) stays in registers for the
// whole kernel instead of being reloaded a row, with its byte-wise negation: the signs go
// onto the activation (a prmt picks a or -a per byte) instead of onto the grid magnitudes,
// which saves the negation of every grid word.
//
// Measured (runs 112-113, Nsight Compute, caches flushed, the 6 experts' gate+up of one
// token): 18.7-19.2 µs against kq_kernel_smem's 20.0-20.4, 4 layers' decode 0.511 ms a token
// against 0.519-0.522. Both kernels issue ~0.5 instructions a cycle a scheduler with DRAM at
// ~28 %: the expansion's instructions (~3 a weight and lane) and their latency, not the bytes
// in flight, bound both. Measured and removed: the same streaming for the Q2_K down product
// (12.4 µs against kq_q2k_pipe_kernel's 10.1-10.4: its rows are short, and the per-row copy,
// wait and butterfly cost more than they hide); 24 warps an SM with the signs on the grid
// words instead of the activation (80 registers: 20.3 µs; more warps did not make up for
// the two more operations per 8 values); the table lookups by 32-bit addresses in inline PTX
// (19.4 µs).
//
// The sums are kq_body's: the same lanes take the same super-blocks (lane / 4 + 8 st) and
// quarters (lane % 4), the same integer sums (Σ g·(±a) = Σ (±g)·a exactly, as no activation
// code is -128: the quantiser maps the largest magnitude to ±127), the same float steps in
// the same order, the same butterfly: the same bits (Iq2DecodeSharedTablesEqualGlobal). Rows
// of exactly 8 STEPS super-blocks (K = 2,048 STEPS), one slot a block row.
template <int NW, int STEPS>
struct Iq2Stream {
    static constexpr uint32_t NSB = 8 * STEPS;
    static constexpr uint32_t CB = NSB * 64;               // a row's repacked codes
    static constexpr uint32_t DB = NSB * 2;                // a row's f16 scales
    static constexpr uint32_t STAGE = NW * (CB + DB);      // one row of each weight
    static_assert(CB % 16 == 0 && DB % 16 == 0, "bulk copies: multiples of 16 bytes");
    static constexpr size_t smem(int warps, int nst) { return kIq2SmemBytes + size_t(warps) * nst * (8 + STAGE); }
};

// FLAT: each super-block's (dw·dx, isum) gathered from its lane 4 (sb % 8) and added in k order
// from 0 (the CPU's dot_iq2_xxs, as the grouped FLAT GEMM adds them), not decode's butterfly.
template <int NW, int STEPS, int NST, int WARPS, bool FLAT = false>
__global__ void __launch_bounds__(32 * WARPS, 1) iq2_stream_kernel(MV p) {
    using S = Iq2Stream<NW, STEPS>;
    pdl_launch();
    extern __shared__ uint4 kq_smem[];
    uint8_t* smb = reinterpret_cast<uint8_t*>(kq_smem);
    const uint32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, q = lane & 3;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smb + kIq2SmemBytes) + warp * NST;
    uint8_t* ring = smb + kIq2SmemBytes + 8 * WARPS * NST + size_t(warp) * NST * S::STAGE;
    if (lane == 0)
        for (int st = 0; st < NST; ++st) mbar_init(&bars[st], 1);
    // the tables are constants: filled while the kernels before this one finish
    iq2_fill_rep<32 * WARPS, 32>(kq_smem, kq_smem + kIq2SmemGrid / 16, g_iq2_grid, g_iq2_sel.v, threadIdx.x);
    pdl_wait();   // the expert of the block row and the activation come from the kernels before
    Slots<1> sl;
    get_slots<1>(p, sl);
    const uint64_t stride = uint64_t(gridDim.x) * WARPS;
    uint64_t n = uint64_t(blockIdx.x) * WARPS + warp;
    const uint8_t* wq[2] = {reinterpret_cast<const uint8_t*>(p.wqs), reinterpret_cast<const uint8_t*>(p.wqs2)};
    const uint16_t* wd[2] = {p.wd, p.wd2};
    // lane 0 sends row r of every weight into stage st (armed for all their bytes)
    auto issue = [&](int st, uint64_t r) {
        const uint64_t wrow = sl.wbase + p.row0 + r;
        uint8_t* dst = ring + st * S::STAGE;
        mbar_expect_tx(&bars[st], S::STAGE);
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            bulk_copy_g2s(dst + j * S::CB, wq[j] + wrow * S::CB, S::CB, &bars[st]);
            bulk_copy_g2s(dst + NW * S::CB + j * S::DB, wd[j] + wrow * S::NSB, S::DB, &bars[st]);
        }
    };
    if (lane == 0)
        for (int st = 0; st < NST; ++st)
            if (n + st * stride < p.N) issue(st, n + st * stride);
    __syncthreads();   // the tables (and every warp's barriers initialised)

    // this lane's activation: super-blocks lane / 4 + 8 k, groups 2q and 2q + 1, and negated
    const uint64_t AL = p.act_len, sb0 = lane >> 2;
    float dx[STEPS];
    uint32_t xa[STEPS][16], xn[STEPS][16];
#pragma unroll
    for (int k = 0; k < STEPS; ++k) {
        const uint64_t sb = sb0 + 8 * k;
        const uint4* a4 = reinterpret_cast<const uint4*>(p.aq + sl.act[0] * AL + sb * 256 + 64 * q);
        dx[k] = p.ad[sl.act[0] * (AL / 256) + sb];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 v = a4[i];
            xa[k][4 * i] = v.x, xa[k][4 * i + 1] = v.y, xa[k][4 * i + 2] = v.z, xa[k][4 * i + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) xn[k][i] = __vneg4(xa[k][i]);
    }
    const uint8_t* gb = smb + (lane & 15) * 8;             // this lane's grid copy
    const uint8_t* sbt = smb + kIq2SmemGrid + lane * 4;   // and selector copy

    for (uint32_t it = 0; n < p.N; ++it, n += stride) {
        const int st = int(it % NST);
        mbar_wait(&bars[st], (it / NST) & 1);
        const uint8_t* stage = ring + st * S::STAGE;
        float acc[NW];
        float cs[NW][STEPS];   // FLAT: each super-block's dw·dx and isum, on its lanes
        int is[NW][STEPS];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            acc[j] = 0.0f;
#pragma unroll
            for (int k = 0; k < STEPS; ++k) {
                const uint32_t sb = uint32_t(sb0) + 8 * k;
                const uint4 w = *reinterpret_cast<const uint4*>(stage + j * S::CB + sb * 64 + 16 * q);
                const uint32_t ws[2][2] = {{w.x, w.y}, {w.z, w.w}};
                int isum = 0;
#pragma unroll
                for (int g = 0; g < 2; ++g) {
                    int sm = 0;
#pragma unroll
                    for (int l = 0; l < 4; ++l) {
                        uint2 gv;
                        uint32_t sel;
                        iq2_row_rep<32>(ws[g][0], ws[g][1], l, gb, sbt, gv, sel);
                        const int i0 = 8 * g + 2 * l;
                        sm = __dp4a(int(gv.x), int(prmt(xa[k][i0], xn[k][i0], sel)), sm);
                        sm = __dp4a(int(gv.y), int(prmt(xa[k][i0 + 1], xn[k][i0 + 1], sel >> 16)), sm);
                    }
                    isum += sm * int(2 * (ws[g][1] >> 28) + 1);
                }
                isum += __shfl_xor_sync(0xffffffffu, isum, 1);
                isum += __shfl_xor_sync(0xffffffffu, isum, 2);
                if constexpr (FLAT) {
                    cs[j][k] = f16_to_f32(reinterpret_cast<const uint16_t*>(stage + NW * S::CB + j * S::DB)[sb]) * dx[k];
                    is[j][k] = isum;
                } else if (q == 0) {
                    const float dw = f16_to_f32(reinterpret_cast<const uint16_t*>(stage + NW * S::CB + j * S::DB)[sb]);
                    acc[j] = fmaf(dw * dx[k], float(isum), acc[j]);
                }
            }
        }
        // every lane has read the stage: refill it with the row NST rows on
        __syncwarp();
        if (lane == 0 && n + NST * stride < p.N) {
            fence_proxy_async_smem();
            issue(st, n + NST * stride);
        }
        if constexpr (FLAT) {
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (uint32_t b = 0; b < S::NSB; ++b)
                    acc[j] = fmaf(__shfl_sync(0xffffffffu, cs[j][b / 8], 4 * (b % 8)),
                                  float(__shfl_sync(0xffffffffu, is[j][b / 8], 4 * (b % 8))), acc[j]);
        } else {
#pragma unroll
            for (int j = 0; j < NW; ++j) acc[j] = warp_sum(acc[j]);
        }
        float v = acc[0] * 0.125f;
        if constexpr (NW == 2) v = swiglu_pair(v, acc[NW - 1] * 0.125f, p.clamp, p.ew, sl.out[0]);
        if (lane == 0) p.y[uint64_t(sl.out[0]) * p.y_stride + n] = v;
    }
}

int g_q2k_select = -1;   // q2k_select
thread_local bool g_kq_flat_pairs = false;   // kq_flat_pairs
std::atomic<uint64_t> g_kq_flat_launches{0};  // kq_flat_pair_launches

// Slots per block and rows per warp: one slot per block row for expert pairs (their weight
// rows differ) unless grouped, RB rows of a batch otherwise; RW > 1 only for one slot, where
// a warp's few loads would leave the memory system idle. DSV4_KQ_RW overrides RW (1, 2, 4)
// for measurements. IQ2_XXS with one slot looks its tables up in shared memory (see
// kIq2SmemBytes); DSV4_KQ_SMEM (read once) selects for A/B: 0 the global-memory lookups of
// before, 1 (default) shared tables, 2 shared tables with 3 blocks per SM (kq_body's SM).
// (Run 51: a row a warp, 8 super-blocks a step, 3 blocks per SM measured 149.0 tok/s against
// 152.0 for 1; removed.)
int g_kq_smem_select = -1;   // kq_smem_select

// The 2-bit decode kernels with the grid cut to what the GPU holds at once (kq_body's warps
// then loop over their rows): no second wave of blocks each filling its shared tables and
// ramping up again. DSV4_KQ_PERSIST=0 (read once) launches a block per RW * 8 rows.
template <typename Kernel>
void launch_kq_grid(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s, const MV& p) {
    static const bool persist = env_switch("DSV4_KQ_PERSIST", true);
    if (persist) {
        const uint32_t res = resident_blocks(reinterpret_cast<const void*>(kernel), block.x, smem);
        grid.x = std::min(grid.x, std::max(1u, (res + grid.y - 1) / grid.y));
    }
    kernel<<<grid, block, smem, s>>>(p);
}

// iq2_stream_kernel's launch: one block of 16 warps an SM, each warp NST stages deep (~136 KB
// of rings; NST from 2 to 8 by the stage's size), the grid cut to one wave.
int g_kq_stream_select = -1;   // kq_stream_select
constexpr int kIq2StreamWarps = 16;
constexpr int iq2_stream_stages(uint32_t stage) {
    const int n = int(139264 / (kIq2StreamWarps * (stage + 8)));
    return n < 2 ? 2 : n > 8 ? 8 : n;
}

// Whether the device gives a block the stream kernel's shared memory (sm_90 and later: bulk copies).
// (The device's limit read once: one device a process, as the backend's other checks assume.)
bool iq2_stream_device_fits(size_t smem) {
    static const size_t most = [] {
        int dev = 0, major = 0, m = 0;
        const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        major >= 9 &&
                        cudaDeviceGetAttribute(&m, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess;
        return ok ? size_t(m) : size_t(0);
    }();
    return most >= smem;
}
template <int NW, int STEPS>
constexpr size_t iq2_stream_smem() {
    using S = Iq2Stream<NW, STEPS>;
    return S::smem(kIq2StreamWarps, iq2_stream_stages(S::STAGE));
}
// False where the GPU has no bulk copies (before sm_90) or its blocks cannot have the
// kernel's shared memory (~185 KB: Hopper and the data centre Blackwells can, the GeForce
// Blackwells, 99 KB, cannot): the caller goes on.
template <int NW, int STEPS, bool FLAT>
bool launch_iq2_stream_k(const MV& p, uint32_t gy, cudaStream_t s) {
    using S = Iq2Stream<NW, STEPS>;
    constexpr int NST = iq2_stream_stages(S::STAGE);
    constexpr int WARPS = kIq2StreamWarps;
    const auto kernel = iq2_stream_kernel<NW, STEPS, NST, WARPS, FLAT>;
    const size_t smem = iq2_stream_smem<NW, STEPS>();
    static const bool fits = [&] {
        if (!iq2_stream_device_fits(smem)) return false;
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
              "iq2_stream_kernel: shared memory");
        return true;
    }();
    if (!fits) return false;
    launch_kq_grid(kernel, dim3(uint32_t((p.N + WARPS - 1) / WARPS), gy), dim3(32 * WARPS), smem, s, p);
    return true;
}

// DSV4_KQ_STREAM (read once; kq_stream_select for tests): 1 (default) iq2_stream_kernel for
// IQ2_XXS with one slot a block row and rows of 2,048 or 4,096 values on sm_90 and later
// (bulk copies), 0 kq_kernel_smem. False: not applicable, the caller goes on.
int kq_stream_choice() {
    static const int env = env_int("DSV4_KQ_STREAM", 1);
    return g_kq_stream_select >= 0 ? g_kq_stream_select : env;
}
// Whether the stream kernel takes rows of K values of these weights (their codes and scales 16-byte aligned).
bool iq2_stream_takes(uint64_t K, uintptr_t align, int NW) {
    if (kq_stream_choice() != 1 || align % 16) return false;
    if (K == 2048) return iq2_stream_device_fits(NW == 2 ? iq2_stream_smem<2, 1>() : iq2_stream_smem<1, 1>());
    if (K == 4096) return iq2_stream_device_fits(NW == 2 ? iq2_stream_smem<2, 2>() : iq2_stream_smem<1, 2>());
    return false;
}
template <int NW, bool FLAT>
bool launch_iq2_stream(const MV& p, uint32_t gy, cudaStream_t s) {
    uintptr_t align = uintptr_t(p.wqs) | uintptr_t(p.wd);
    if (NW == 2) align |= uintptr_t(p.wqs2) | uintptr_t(p.wd2);
    if (!iq2_stream_takes(p.K, align, NW)) return false;
    return p.K == 2048 ? launch_iq2_stream_k<NW, 1, FLAT>(p, gy, s) : launch_iq2_stream_k<NW, 2, FLAT>(p, gy, s);
}

int kq_rw_env() {
    static const int v = env_int("DSV4_KQ_RW", 0);
    return v;
}
int q2k_choice() {
    static const int env = env_int("DSV4_Q2K_V", 4);
    return g_q2k_select >= 0 ? g_q2k_select : env;
}
// Whether kq_q2k_pipe_kernel takes a one-slot Q2_K product of rows of K values (DSV4_Q2K_V 4 or
// 5, K up to 2,048), and its launch (FLAT: k order); false where it does not take it.
bool q2k_pipe_takes(uint64_t K) {
    const int v = q2k_choice();
    return (v == 4 || v == 5) && K <= 2048;
}
template <bool FLAT>
bool launch_q2k_pipe(const MV& p, uint32_t gy, cudaStream_t s) {
    if (!q2k_pipe_takes(p.K)) return false;
    const bool v4 = q2k_choice() == 4;
    const uint32_t rpb = kKqWarps * (v4 ? 2u : 4u);
    const dim3 grid(uint32_t((p.N + rpb - 1) / rpb), gy), block(32 * kKqWarps);
    if (v4) launch_kq_grid(kq_q2k_pipe_kernel<2, 3, FLAT>, grid, block, 0, s, p);
    else launch_kq_grid(kq_q2k_pipe_kernel<4, 2, FLAT>, grid, block, 0, s, p);
    return true;
}

template <uint32_t T, int NW>
void launch_kq(const MV& p, cudaStream_t s) {
    const int rw_env = kq_rw_env();
    static const int smem_env = env_int("DSV4_KQ_SMEM", 1);
    const int rb = p.grp ? 8 : p.expert ? 1 : (p.R >= 8 ? 8 : p.R >= 4 ? 4 : p.R >= 2 ? 2 : 1);
    const int rw = rb > 1 ? 1 : rw_env ? rw_env : (NW == 2 ? 2 : 4);
    const uint32_t gy = p.grp ? p.grp_cap : (p.R + rb - 1) / rb;
    const uint32_t rows_per_block = kKqWarps * uint32_t(rw);
    const dim3 grid(uint32_t((p.N + rows_per_block - 1) / rows_per_block), gy), block(32 * kKqWarps);
    // PS: 16-super-block rows (K = 4096) in one round of loads with RW <= 2
    if (p.flat) {
        // k order: ungrouped pairs (one slot a block row), where kq_pair_flat_ok said one of these
        // takes the product
        ++g_kq_flat_launches;
        if constexpr (T == T_IQ2_XXS) {
            if (!rw_env && launch_iq2_stream<NW, true>(p, gy, s)) return;
        } else if constexpr (T == T_Q2_K && NW == 1) {
            if (!rw_env && launch_q2k_pipe<true>(p, gy, s)) return;
        }
        throw_mismatch("matvec: expert pairs in k order need the streamed IQ2_XXS or the pipelined Q2_K kernel "
                       "(kq_pair_flat_ok)",
                       T, p.K, p.act_len);
    }
    if constexpr (T == T_IQ2_XXS) {
        if (rb == 1 && !p.grp && !rw_env && launch_iq2_stream<NW, false>(p, gy, s)) return;
        const int sm = g_kq_smem_select >= 0 ? g_kq_smem_select : smem_env;
        if (rb == 1 && (sm == 1 || sm == 2)) {
            // 48 KB of dynamic shared memory: within the default limit, no attribute needed
            constexpr size_t sb = kIq2SmemBytes;
            if (sm == 2) {
                if (rw >= 4) launch_kq_grid(kq_kernel_smem<T, NW, 4, 1, 3>, grid, block, sb, s, p);
                else if (rw == 2) launch_kq_grid(kq_kernel_smem<T, NW, 2, 2, 3>, grid, block, sb, s, p);
                else launch_kq_grid(kq_kernel_smem<T, NW, 1, 2, 3>, grid, block, sb, s, p);
            } else {
                if (rw >= 4) launch_kq_grid(kq_kernel_smem<T, NW, 4, 1, 2>, grid, block, sb, s, p);
                else if (rw == 2) launch_kq_grid(kq_kernel_smem<T, NW, 2, 2, 2>, grid, block, sb, s, p);
                else launch_kq_grid(kq_kernel_smem<T, NW, 1, 2, 2>, grid, block, sb, s, p);
            }
            return;
        }
    }
    if constexpr (T == T_Q2_K && NW == 1) {
        const int v = q2k_choice();
        if (rb == 1 && !rw_env && launch_q2k_pipe<false>(p, gy, s)) return;
        if (rb == 1 && !rw_env && v >= 1 && v <= 3) {
            const uint32_t rw2 = v == 2 ? 4 : 8, rpb = kKqWarps * rw2;
            const dim3 grid2(uint32_t((p.N + rpb - 1) / rpb), gy);
            if (v == 1) launch_kq_grid(kq_kernel_mb<T, NW, 8, 1, 2>, grid2, block, 0, s, p);
            else if (v == 2) launch_kq_grid(kq_kernel_mb<T, NW, 4, 1, 3>, grid2, block, 0, s, p);
            else launch_kq_grid(kq_kernel_mb<T, NW, 8, 1, 3>, grid2, block, 0, s, p);   // (spills ~170 bytes)
            return;
        }
    }
    if (rb == 8) launch_kq_grid(kq_kernel<T, 8, NW, 1, 1>, grid, block, 0, s, p);
    else if (rb == 4) launch_kq_grid(kq_kernel<T, 4, NW, 1, 1>, grid, block, 0, s, p);
    else if (rb == 2) launch_kq_grid(kq_kernel<T, 2, NW, 1, 1>, grid, block, 0, s, p);
    else if (rw >= 4) launch_kq_grid(kq_kernel<T, 1, NW, 4, 1>, grid, block, 0, s, p);
    else if (rw == 2) launch_kq_grid(kq_kernel<T, 1, NW, 2, 2>, grid, block, 0, s, p);
    else launch_kq_grid(kq_kernel<T, 1, NW, 1, 2>, grid, block, 0, s, p);
}

template <uint32_t T, bool VEC, bool WIDE, int WT = 256, int NW = 1>
void launch_rb2(const MV& p, cudaStream_t s) {
    const dim3 block(WIDE ? WT : 32 * kRowsPerBlock);
    const uint32_t gx = WIDE ? uint32_t(p.N) : uint32_t((p.N + kRowsPerBlock - 1) / kRowsPerBlock);
    const int rb = p.grp ? 8 : p.expert ? 1 : (p.R >= 8 ? 8 : p.R >= 4 ? 4 : p.R >= 2 ? 2 : 1);
    const dim3 grid(gx, p.grp ? p.grp_cap : (p.R + rb - 1) / rb);
    switch (rb) {
        case 8: matvec_kernel<T, 8, VEC, WIDE, WT, NW><<<grid, block, 0, s>>>(p); break;
        case 4: matvec_kernel<T, 4, VEC, WIDE, WT, NW><<<grid, block, 0, s>>>(p); break;
        case 2: matvec_kernel<T, 2, VEC, WIDE, WT, NW><<<grid, block, 0, s>>>(p); break;
        default: matvec_kernel<T, 1, VEC, WIDE, WT, NW><<<grid, block, 0, s>>>(p); break;
    }
}

// Few long rows: too few warps to keep the memory system busy, so a block per row (1024
// threads for the longest rows, the mHC mixes of 4*4096 values).
template <uint32_t T, bool VEC>
void launch_rb(const MV& p, cudaStream_t s) {
    switch (decode_row_threads(p.K, p.N, p.expert != nullptr)) {
        case 1024: launch_rb2<T, VEC, true, 1024>(p, s); break;
        case 256: launch_rb2<T, VEC, true, 256>(p, s); break;
        default: launch_rb2<T, VEC, false>(p, s); break;
    }
}

// ---- dequantisation ----------------------------------------------------------------------

__device__ float weight_elem(const DevWeight& W, uint64_t row, uint64_t i) {
    const uint8_t* wr = W.data + row * W.row_bytes;
    switch (W.type) {
        case T_F32: return reinterpret_cast<const float*>(wr)[i];
        case T_F16: return f16_to_f32(ld_u16(wr + 2 * i));
        case T_BF16: return bf16_to_f32(ld_u16(wr + 2 * i));
        case T_Q8_0: return f16_to_f32(W.d[row * (W.K / 32) + i / 32]) * float(W.qs[row * W.K + i]);
        case T_Q2_K: {   // repacked: 80 code bytes (scales, codes) and (d, dmin) per super-block
            const uint64_t sbi = row * (W.K / 256) + i / 256;
            const uint8_t* blk = reinterpret_cast<const uint8_t*>(W.qs) + sbi * 80;
            const uint32_t w = uint32_t(i % 256), h = w / 128, j = (w % 128) / 32, s = (w % 32) / 16, t = w % 16;
            const uint8_t sc = blk[8 * h + 2 * j + s];
            const float dl = f16_to_f32(W.d[2 * sbi]) * float(sc & 0xF);
            const float ml = f16_to_f32(W.d[2 * sbi + 1]) * float(sc >> 4);
            return fmaf(dl, float((blk[16 + 32 * h + 16 * s + t] >> (2 * j)) & 3), -ml);
        }
        case T_Q4_K: {
            const uint8_t* blk = wr + (i / 256) * 144;
            const uint32_t w = uint32_t(i % 256), j = w / 32, t = w % 32;
            const uint8_t* s = blk + 4;
            uint32_t sc, m;
            if (j < 4) {
                sc = s[j] & 63;
                m = s[j + 4] & 63;
            } else {
                sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
            const float dl = f16_to_f32(ld_u16(blk)) * float(sc);
            const float ml = f16_to_f32(ld_u16(blk + 2)) * float(m);
            return fmaf(dl, float((blk[16 + 32 * (j / 2) + t] >> (4 * (j & 1))) & 0xF), -ml);
        }
        case T_IQ2_XXS: {   // repacked: 64 code bytes and d per super-block
            const uint64_t sbi = row * (W.K / 256) + i / 256;
            const uint8_t* blk = reinterpret_cast<const uint8_t*>(W.qs) + sbi * 64;
            const uint32_t w = uint32_t(i % 256), g = w / 32, l = (w % 32) / 8, t = w % 8;
            const uint32_t a0 = *reinterpret_cast<const uint32_t*>(blk + 8 * g);
            const uint32_t a1 = *reinterpret_cast<const uint32_t*>(blk + 8 * g + 4);
            const float db = f16_to_f32(W.d[sbi]) * (0.5f + float(a1 >> 28)) * 0.25f;
            const float v = db * float((g_iq2_grid[(a0 >> (8 * l)) & 0xFF] >> (8 * t)) & 0xFF);
            return (ksigns((a1 >> (7 * l)) & 127) >> t) & 1 ? -v : v;
        }
        case T_MXFP4: {
            const uint8_t* blk = wr + (i / 32) * 17;
            const uint32_t j = uint32_t(i % 32);
            const uint8_t c = j < 16 ? (blk[1 + j] & 0xF) : (blk[1 + j - 16] >> 4);
            return e8m0_half(blk[0]) * float(mxfp4_val(c));
        }
        default: return 0.0f;
    }
}

__global__ void dequant_rows_kernel(DevWeight W, uint64_t r0, float* dst) {
    pdl_begin();
    const uint64_t row = r0 + blockIdx.y;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < W.K; i += uint64_t(gridDim.x) * blockDim.x)
        dst[uint64_t(blockIdx.y) * W.K + i] = weight_elem(W, row, i);
}

__global__ void embed_kernel(DevWeight W, const DevRow* rows, uint32_t E, uint32_t H, float* X) {
    pdl_begin();
    const uint32_t r = blockIdx.y;
    const uint64_t tok = uint64_t(rows[r].token);
    for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < E; e += gridDim.x * blockDim.x) {
        const float v = weight_elem(W, tok, e);
        for (uint32_t h = 0; h < H; ++h) X[(uint64_t(r) * H + h) * E + e] = v;
    }
}

// Gathers the pairs p < P by expert (counting sort in one block): grp[3g..3g+2] = (expert,
// first index into pairs, count <= GB). The order of pairs inside an expert is whatever the
// atomics give: each pair's result is computed alone, so it does not matter.
__global__ void __launch_bounds__(1024) moe_groups_kernel(const int32_t* experts, uint32_t P, uint32_t NE, uint32_t GB,
                                                         int32_t* grp, int32_t* pairs, int32_t* count) {
    pdl_begin();
    extern __shared__ int32_t sh[];
    int32_t *cnt = sh, *off = sh + NE, *gof = sh + 2 * NE, *fill = sh + 3 * NE;
    for (uint32_t e = threadIdx.x; e < NE; e += blockDim.x) cnt[e] = fill[e] = 0;
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[experts[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t o = 0, go = 0;
        for (uint32_t e = 0; e < NE; ++e) {
            off[e] = o;
            gof[e] = go;
            o += cnt[e];
            go += (cnt[e] + int32_t(GB) - 1) / int32_t(GB);
        }
        *count = go;
    }
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int32_t e = experts[p];
        pairs[off[e] + atomicAdd(&fill[e], 1)] = int32_t(p);
    }
    for (uint32_t e = threadIdx.x; e < NE; e += blockDim.x)
        for (int32_t j = 0; j * int32_t(GB) < cnt[e]; ++j) {
            int32_t* g = grp + 3 * (gof[e] + j);
            g[0] = int32_t(e);
            g[1] = off[e] + j * int32_t(GB);
            g[2] = min(int32_t(GB), cnt[e] - j * int32_t(GB));
        }
}

}  // namespace

uint32_t decode_row_threads(uint64_t K, uint64_t N, bool expert) {
    if (!expert && N <= 1024 && K >= 8192) return 1024;
    if (!expert && N <= 1024 && K >= 2048) return 256;
    return 32;
}

void iq2_tables(const uint64_t** grid, const uint64_t** sign, const uint32_t** sel, const uint64_t** hgrid,
                const uint64_t** hsign) {
    // looked up once: the symbols' addresses do not change within the process
    struct Tables {
        const uint64_t *grid, *sign;
        const uint32_t* sel;
        const uint64_t *hgrid, *hsign;
    };
    static const Tables t = [] {
        auto addr = [](const auto& symbol, const char* what) {
            void* a = nullptr;
            check(cudaGetSymbolAddress(&a, symbol), what);
            return a;
        };
        return Tables{static_cast<const uint64_t*>(addr(g_iq2_grid, "IQ2_XXS grid")),
                      static_cast<const uint64_t*>(addr(g_iq2_sign, "IQ2_XXS signs")),
                      static_cast<const uint32_t*>(addr(g_iq2_sel, "IQ2_XXS sign selectors")),
                      static_cast<const uint64_t*>(addr(g_iq2_hgrid, "IQ2_XXS half selectors")),
                      static_cast<const uint64_t*>(addr(g_iq2_hsign, "IQ2_XXS half sign selectors"))};
    }();
    *grid = t.grid;
    *sign = t.sign;
    *sel = t.sel;
    *hgrid = t.hgrid;
    *hsign = t.hsign;
}

void upload_iq2xxs_grid(const uint64_t* grid) {
    check(cudaMemcpyToSymbol(g_iq2_grid, grid, 256 * sizeof(uint64_t)), "upload of the IQ2_XXS grid");
    uint64_t sign[128];
    for (uint32_t i = 0; i < 128; ++i) {
        const uint32_t sg = iq2_ksigns(i);
        sign[i] = 0;
        for (int t = 0; t < 8; ++t)
            if ((sg >> t) & 1) sign[i] |= uint64_t(0xFF) << (8 * t);
    }
    check(cudaMemcpyToSymbol(g_iq2_sign, sign, sizeof(sign)), "upload of the IQ2_XXS signs");
    uint64_t hgrid[256];
    for (uint32_t i = 0; i < 256; ++i) {
        hgrid[i] = 0;
        for (int t = 0; t < 8; ++t) hgrid[i] |= uint64_t(iq2_half_grid_byte(uint32_t(grid[i] >> (8 * t)) & 0xFF)) << (8 * t);
    }
    check(cudaMemcpyToSymbol(g_iq2_hgrid, hgrid, sizeof(hgrid)), "upload of the IQ2_XXS half selectors");
}

ActKind act_kind(uint32_t t) {
    switch (t) {
        case T_Q8_0:
        case T_MXFP4: return ActKind::Q8_0;
        case T_Q2_K:
        case T_Q4_K:
        case T_IQ2_XXS: return ActKind::Q8_K;
        default: return ActKind::F32;
    }
}

DevAct quantize_act(uint32_t wtype, const float* x, uint64_t x_stride, uint32_t R, uint64_t K, const ActBuf& buf,
                    cudaStream_t s) {
    if (act_kind(wtype) == ActKind::F32) {
        DevAct a;
        a.K = K;
        a.f = x;
        a.f_stride = x_stride;
        return a;
    }
    if (uint64_t(R) * K > buf.cap_values) throw_too_small("activation buffer", uint64_t(R) * K, buf.cap_values);
    const DevAct a = codes_in(act_kind(wtype), K, buf);
    if (R == 0) return a;
    if (a.kind == ActKind::Q8_0) {
        const uint32_t blocks = uint32_t(K / 32);
        quant_q8_0_kernel<<<dim3((blocks + 7) / 8, R), 256, 0, s>>>(x, x_stride, K, buf.q, buf.d);
    } else {
        const uint32_t blocks = uint32_t(K / 256);
        quant_q8_k_kernel<<<dim3((blocks + 7) / 8, R), 256, 0, s>>>(x, x_stride, K, buf.q, buf.d, buf.bsum);
    }
    check_launch("quantize_act");
    return a;
}

namespace {
// The product's parameters; `expert`, `groups` as in kernels.h.
// Float weights read 8 values (16 or 32 bytes) a step (matvec_kernel's VEC): rows and the
// activation aligned for it.
bool float_rows_vec_ok(const DevWeight& W, const DevAct& a) {
    return W.K % 8 == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.row_bytes % 16 == 0 &&
           reinterpret_cast<uintptr_t>(a.f) % 16 == 0 && a.f_stride % 4 == 0;
}

MV make_mv(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N, uint64_t row0,
           const int32_t* expert, uint64_t rows_per_expert, uint32_t act_div, const MoeGroups* groups) {
    MV p{};
    p.act_len = a.K;
    p.w = W.data;
    p.wqs = W.qs;
    p.wd = W.d;
    p.K = W.K;
    p.row_bytes = W.row_bytes;
    p.af = a.f;
    p.af_stride = a.f_stride;
    p.aq = a.q;
    p.ad = a.d;
    p.absum = a.bsum;
    p.R = R;
    p.y = y;
    p.y_stride = y_stride;
    p.N = N;
    p.row0 = row0;
    p.expert = expert;
    p.rows_per_expert = rows_per_expert;
    p.act_div = act_div ? act_div : 1;
    p.early_weights = pdl_early_weights();
    p.flat = expert && !groups && (W.type == T_IQ2_XXS || W.type == T_Q2_K) && g_kq_flat_pairs;
    if (groups) {
        p.grp = groups->grp;
        p.grp_pairs = groups->pairs;
        p.n_grp = groups->count;
        p.grp_cap = groups->cap;
        if (!expert || groups->per_group != 8)
            throw_mismatch("matvec: pair groups need experts and 8 pairs a group (32 or 64 only for the tensor-core "
                           "types)",
                           W.type, W.K, a.K);
    }
    return p;
}

void matvec_impl(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                 uint64_t row0, cudaStream_t s, const int32_t* expert, uint64_t rows_per_expert, uint32_t act_div,
                 uint64_t rpg, const MoeGroups* groups) {
    if (R == 0 || N == 0) return;
    const uint64_t n_groups = rpg ? (row0 + N + rpg - 1) / rpg : 1;
    if (act_kind(W.type) != a.kind || (rpg ? a.K < n_groups * W.K : a.K != W.K))
        throw_mismatch("matvec", W.type, W.K, a.K);
    if (row0 == 0 && gemm_kq_eligible(W, groups)) {
        gemm_kq_experts(W, nullptr, a, R, y, y_stride, N, rows_per_expert, act_div, *groups, 0.0f, nullptr, s);
        return;
    }
    MV p = make_mv(W, a, R, y, y_stride, N, row0, expert, rows_per_expert, act_div, groups);
    p.rpg = rpg;
    const bool fvec = float_rows_vec_ok(W, a);
    const bool kq = W.type == T_Q2_K || W.type == T_IQ2_XXS;
    if (kq && rpg) throw_mismatch("matvec_grouped: no kernel for this weight type", W.type, W.K, a.K);
    if (gemm_q8_0_eligible(W, R, N, rpg, expert != nullptr)) {
        gemm_q8_0(W, a, R, y, y_stride, N, row0, rpg, s);
        return;
    }
    // float weights, many rows (prefill): a tiled CUDA-core GEMM with decode's order of sums
    if (act_div <= 1 && gemm_float_eligible(W, a, R, N, row0, rpg, expert != nullptr)) {
        gemm_float(W, a, R, y, y_stride, N, row0, rpg, s);
        return;
    }
    switch (W.type) {
        case T_F32: fvec ? launch_rb<T_F32, true>(p, s) : launch_rb<T_F32, false>(p, s); break;
        case T_F16: fvec ? launch_rb<T_F16, true>(p, s) : launch_rb<T_F16, false>(p, s); break;
        case T_BF16: fvec ? launch_rb<T_BF16, true>(p, s) : launch_rb<T_BF16, false>(p, s); break;
        case T_Q8_0:
            if (!launch_q8_rows(p, 1, s)) launch_rb<T_Q8_0, false>(p, s);
            break;
        case T_MXFP4: launch_rb<T_MXFP4, false>(p, s); break;
        case T_Q2_K: launch_kq<T_Q2_K, 1>(p, s); break;
        case T_Q4_K: launch_rb<T_Q4_K, false>(p, s); break;
        case T_IQ2_XXS: launch_kq<T_IQ2_XXS, 1>(p, s); break;
        default: throw_mismatch("matvec: no kernel for this weight type", W.type, W.K, a.K);
    }
    check_launch("matvec");
}
}  // namespace

void matvec(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N, uint64_t row0,
            cudaStream_t s, const int32_t* expert, uint64_t rows_per_expert, uint32_t act_div,
            const MoeGroups* groups) {
    matvec_impl(W, a, R, y, y_stride, N, row0, s, expert, rows_per_expert, act_div, 0, groups);
}

void matvec_grouped(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                    uint64_t rows_per_group, cudaStream_t s) {
    matvec_impl(W, a, R, y, y_stride, N, 0, s, nullptr, 0, 1, rows_per_group, nullptr);
}

bool matvec_tail_on() {
    // Opt-in: on the H200 (run 48, 43 layers, same call) q_a + norm and the router as tails
    // took 6.523 ms a token for the layers against 6.099 with the separate launches.
    static const bool on = env_switch("DSV4_MV_TAIL", false);
    return on;
}

bool matvec_tail_fits(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, MvTail::Kind kind) {
    if (R != 1 || a.kind != act_kind(W.type) || a.K != W.K || decode_row_threads(W.K, N, false) != 256)
        return false;
    if (!((W.type == T_F16 && float_rows_vec_ok(W, a)) || W.type == T_Q8_0)) return false;
    if (kind == MvTail::NormQ8_0) return N % 256 == 0 && N / 256 <= 8 && (N / 256 & (N / 256 - 1)) == 0;
    if (kind == MvTail::Router) return N <= 256;
    return false;
}

void matvec_tail(const DevWeight& W, const DevAct& a, float* y, uint64_t N, const MvTail& tail, cudaStream_t s) {
    if (!matvec_tail_fits(W, a, 1, N, tail.kind) || !tail.count || (tail.kind == MvTail::Router && tail.router.K > 32))
        throw_mismatch("matvec_tail: not a one-row product of 256 threads a row", W.type, W.K, a.K);
    MV p = make_mv(W, a, 1, y, N, N, 0, nullptr, 0, 1, nullptr);
    p.tail = tail;
    // (launch_rb2's grid for one row: a block of 256 a row; the same kernel as matvec's)
    if (W.type == T_F16) matvec_kernel<T_F16, 1, true, true, 256, 1, true><<<dim3(uint32_t(N), 1), 256, 0, s>>>(p);
    else matvec_kernel<T_Q8_0, 1, false, true, 256, 1, true><<<dim3(uint32_t(N), 1), 256, 0, s>>>(p);
    check_launch("matvec_tail");
}

void kq_flat_pairs(bool on) { g_kq_flat_pairs = on; }

bool kq_pair_flat_ok(const DevWeight& W, const DevWeight* up) {
    if (kq_rw_env() != 0) return false;
    if (W.type == T_IQ2_XXS) {
        if (up && !matvec_swiglu_ok(W, *up)) return false;
        const uintptr_t align = uintptr_t(W.qs) | uintptr_t(W.d) | (up ? uintptr_t(up->qs) | uintptr_t(up->d) : 0);
        return iq2_stream_takes(W.K, align, up ? 2 : 1);
    }
    return W.type == T_Q2_K && !up && q2k_pipe_takes(W.K) && W.K % 256 == 0;
}
uint64_t kq_flat_pair_launches() { return g_kq_flat_launches.load(); }

void kq_smem_select(int mode) { g_kq_smem_select = mode; }
void kq_stream_select(int v) { g_kq_stream_select = v; }
void q2k_select(int v) { g_q2k_select = v; }
void read_floor(const void* p, uint64_t bytes, int mode, uint32_t* sink, cudaStream_t s) {
    const uint64_t n16 = bytes / 16;
    if (mode == 0) {
        read_floor_kernel<0><<<uint32_t((n16 + 2047) / 2048), 128, 0, s>>>(static_cast<const int4*>(p), n16, sink);
    } else {
        const uint32_t grid = uint32_t(sm_count()) * 8;
        if (mode == 1) read_floor_kernel<1><<<grid, 128, 0, s>>>(static_cast<const int4*>(p), n16, sink);
        else read_floor_kernel<2><<<grid, 128, 0, s>>>(static_cast<const int4*>(p), n16, sink);
    }
    check_launch("read_floor");
}

void q8_rows_select(int v) { g_q8_rows_select = v; }

bool matvec_swiglu_ok(const DevWeight& Wg, const DevWeight& Wu) {
    if (Wg.type != Wu.type || Wg.K != Wu.K || Wg.row_bytes != Wu.row_bytes || Wg.rows != Wu.rows) return false;
    switch (Wg.type) {
        case T_Q8_0:
        case T_MXFP4:
        case T_Q2_K:
        case T_Q4_K:
        case T_IQ2_XXS: return true;
        default: return false;
    }
}

void matvec_swiglu(const DevWeight& Wg, const DevWeight& Wu, const DevAct& a, uint32_t R, float* mid,
                   uint64_t mid_stride, uint64_t N, float clamp, const float* ew, cudaStream_t s,
                   const int32_t* expert, uint64_t rows_per_expert, uint32_t act_div, const MoeGroups* groups) {
    if (!matvec_swiglu_ok(Wg, Wu)) throw_mismatch("matvec_swiglu: gate and up differ or are float", Wu.type, Wu.K, a.K);
    if (R == 0 || N == 0) return;
    if (act_kind(Wg.type) != a.kind || a.K != Wg.K) throw_mismatch("matvec_swiglu", Wg.type, Wg.K, a.K);
    if (Wg.type == T_IQ2_XXS && gemm_kq_eligible(Wg, groups)) {
        gemm_kq_experts(Wg, &Wu, a, R, mid, mid_stride, N, rows_per_expert, act_div, *groups, clamp, ew, s);
        return;
    }
    MV p = make_mv(Wg, a, R, mid, mid_stride, N, 0, expert, rows_per_expert, act_div, groups);
    p.w2 = Wu.data;
    p.wqs2 = Wu.qs;
    p.wd2 = Wu.d;
    p.clamp = clamp;
    p.ew = ew;
    switch (Wg.type) {
        case T_Q8_0:
            if (!launch_q8_rows(p, 2, s)) launch_rb2<T_Q8_0, false, false, 256, 2>(p, s);
            break;
        case T_MXFP4: launch_rb2<T_MXFP4, false, false, 256, 2>(p, s); break;
        case T_Q2_K: launch_kq<T_Q2_K, 2>(p, s); break;
        case T_Q4_K: launch_rb2<T_Q4_K, false, false, 256, 2>(p, s); break;
        default: launch_kq<T_IQ2_XXS, 2>(p, s); break;
    }
    check_launch("matvec_swiglu");
}

// ---- MoE pair groups ---------------------------------------------------------------------

uint32_t moe_groups_cap(uint32_t P, uint32_t NE, uint32_t per_group) {
    return std::min<uint32_t>(P, (P + per_group - 1) / per_group + std::min(P, NE));
}

void moe_groups(const int32_t* experts, uint32_t P, uint32_t NE, const MoeGroups& g, cudaStream_t s) {
    if (P == 0) return;
    const uint32_t need = moe_groups_cap(P, NE, g.per_group);
    if (g.cap < need) throw_too_small("MoE pair groups", need, g.cap);
    moe_groups_kernel<<<1, 1024, 4 * NE * sizeof(int32_t), s>>>(experts, P, NE, g.per_group, g.grp, g.pairs, g.count);
    check_launch("moe_groups");
}

void dequantize_rows(const DevWeight& W, uint64_t r0, uint64_t n, float* dst, cudaStream_t s) {
    if (n == 0) return;
    const uint32_t gx = uint32_t(std::min<uint64_t>((W.K + 255) / 256, 64));
    dequant_rows_kernel<<<dim3(gx, uint32_t(n)), 256, 0, s>>>(W, r0, dst);
    check_launch("dequantize_rows");
}

void embed(const DevWeight& emb, const DevRow* rows, uint32_t R, uint32_t E, uint32_t H, float* X, cudaStream_t s) {
    if (R == 0) return;
    embed_kernel<<<dim3((E + 255) / 256, R), 256, 0, s>>>(emb, rows, E, H, X);
    check_launch("embed");
}

}  // namespace dsv4::cuda
