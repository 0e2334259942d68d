// The fast mode's rows attention on Hopper's warpgroup MMA (DSV4_ATTN_FAST_WG; sm_90a only, so
// attention_rows_f16.cu launches it only on a device of compute capability 9.0): an item per
// row, all 64 heads (M = 64, one wgmma m-tile) and all keys, heads of 512, in the manner of
// FlashMLA.
//
// Why: attn_rows_fast_kernel (mma.sync, 16 warps) spends ~830 warp instructions a warp and
// 32-key tile for 64 MMAs, at 0.37 issued a cycle a scheduler (run 184, Nsight Compute, a
// ratio-4 layer's 2,048-token chunk: 1.59 ms, 21.5 % of a fast chunk of 4 ratio-4 layers): the
// scores' D split over four warps (parts summed through shared memory), three barriers, the
// keys' conversion and the B fragments by ldmatrix a warp. Its MMAs alone would take ~1/8 of
// that time.
//
// Here, per tile of 32 keys (kWgKT), three warpgroups:
//   WG2 (the producer) stages the row's queries (attn_fast_q_kernel's FP16 halves, times 2^10,
//     in o's rows) and the key tiles (floats, rounded to FP16 once) into the no-swizzle
//     core-matrix layout both MMAs read (wgmma_ss.cuh), two buffers each, and signals them by
//     named barriers (kBarKFull + s, ...; the consumers free them the same way);
//   WG0, WG1 (the consumers) each form the scores over their half of D, S_i = Q[:, half i] ·
//     K[:, half i]ᵀ (16 wgmma m64n32k16, both operands from shared memory), exchange them
//     through shared memory (S = S_0 + S_1 in that order in both, so both hold the same bits),
//     run the same online softmax on the same values (four lanes a head row, in registers),
//     and each adds P·V for its 256 of the 512 value dims (2 wgmma m64n256k16, P from
//     registers: the score accumulators' layout is the A fragments', V the key tile read as an
//     MN-major B). The output leaves from the accumulators: normalised with the sink, the RoPE
//     tail rotated back, the Q8_0 codes of each 32 columns by a reduction over a lane quad.
// Numerics: queries, keys, weights and values rounded to FP16 once (the weights times 2^12
// first, as attn_rows_fast_kernel), FP32 sums: its own bits, still a row's own whatever its batch
// or chunking (a row's arithmetic depends on its keys alone).
// Measured (runs 186-187, an H100, 4 ratio-4 layers, µs a token of a fast chunk): form 1 4.86
// against the mma.sync kernel's 3.37 (with the fast queries' 0.28), 2.12 with the producer's key
// loads skipped: its loads through registers (32 KB in flight an SM) bound it. Run 188: form 2
// (the floats by cp.async) 3.67 against 3.42, 2.37 with its key loads skipped: a chunk's key
// tiles are ~2.7 GB of floats a ratio-4 layer, read from L2 at about its rate, hence form 3
// (FP16 keys made once a layer: half the bytes). Run 189: form 3 2.38 (the no-keys time: its
// loads hide behind the consumers), the chunk 14.57 -> 13.52; the default (DSV4_ATTN_FAST_WG=3),
// the 36-layer fast prefill 8,777 -> 9,116 tok/s (run 191). Its Nsight Compute profile (run 192):
// the consumers now bound it, their online rescale of O (FMUL 16.8 % of the instructions), the
// scores' exchange through shared memory and the softmax. (A form 4 that issued the next tile's
// scores before P · V and ran its softmax meanwhile, FlashAttention-3's schedule, measured slower:
// 2.86, with three key stages, one query buffer and 224 registers; its code is in 7b3389e.) The
// present form 4 (opt-in, not yet run) splits the roles instead: see the consumers below.
// The layouts (no swizzle; V as an MN-major B with LBO 128, SBO 512) were proved first by
// bench/gpu/wgmma_attn_probe.cu (run 185).
#include <cuda_fp16.h>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/kernels.h"
#include "cuda/sm90a/wgmma_ss.cuh"

namespace dsv4::cuda {
namespace {

using xf::h2_of;
using wgss::wg_mma_rs;
using wgss::wg_mma_ss;
using wgss::wg_ss_desc;

constexpr uint32_t kWgD = 512, kWgH = 64, kWgKT = 32, kWgThreads = 384;
constexpr float kWgPScale = 4096.0f;   // the weights' scale before FP16 (2^12), divided out at the end
constexpr float kWgQScale = 1024.0f;   // the queries' (attn_fast_q_kernel's 2^10)
// Shared memory: the query buffers [64 heads][512] halves (two in form 1, one in form 2), two
// key tiles [32][512] halves (both in the core-matrix layout of wg_cm_offset), the exchanged
// score halves [2 tiles' parity][2 warpgroups][64][32] floats, and in form 2 the staged floats
// of a key tile (64 KB: each producer thread's own 16-byte pieces, read back by itself).
constexpr uint32_t kWgQBytes = kWgH * kWgD * 2, kWgKBytes = kWgKT * kWgD * 2, kWgXBytes = kWgH * kWgKT * 4;
constexpr uint32_t kWgFBytes = kWgKT * kWgD * 4;
// Form 4 keeps three key stages and one query buffer; its region x holds the weights P of two
// tiles (the A operand of P · V, [64][32] halves each) and the rows' state after them.
template <int FORM>
struct WgSmem {
    static constexpr uint32_t q_buffers = FORM == 2 || FORM == 4 ? 1 : 2, k_stages = FORM == 4 ? 3 : 2;
    static constexpr uint32_t k = q_buffers * kWgQBytes, x = k + k_stages * kWgKBytes, f = x + 4 * kWgXBytes;
    static constexpr uint32_t bytes = f + (FORM == 2 ? kWgFBytes : 0);
};
constexpr uint32_t kWgMaxRot = 128;   // RoPE tail dims at most (the angles' static shared memory)
static_assert(WgSmem<1>::bytes + 2 * 2 * (kWgMaxRot / 2) * 4 <= 227 * 1024, "WG rows attention: one block an SM");
static_assert(WgSmem<2>::bytes + 2 * 2 * (kWgMaxRot / 2) * 4 <= 227 * 1024, "WG rows attention: one block an SM");
static_assert(WgSmem<4>::bytes + 2 * 2 * (kWgMaxRot / 2) * 4 <= 227 * 1024, "WG rows attention: one block an SM");
constexpr uint32_t kWgPBytes = kWgH * kWgKT * 2;   // form 4: a tile's P as halves
static_assert(2 * kWgPBytes + 2 * 3 * kWgH * 4 <= 4 * kWgXBytes, "form 4: P and the state in region x");
// Named barriers (0 is __syncthreads): the consumers' exchange; each key stage and query
// buffer full (producer arrives, consumers wait) and empty (the reverse).
// Form 4 also: a tile's P and state written (by parity; its owner arrives, the other waits) and
// each warpgroup's own P written (its four warps).
constexpr uint32_t kBarX = 1, kBarKFull = 2, kBarKEmpty = 5, kBarQFull = 8, kBarQEmpty = 10, kBarState = 12,
                   kBarP = 14;

__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Element (row, k) of a K-major operand of `rows` rows: core matrices of 8 rows × 8 k (16
// bytes a row), k-steps of 16 (rows · 32 bytes), the two halves of a step rows · 16 apart.
__device__ __forceinline__ uint32_t wg_cm_offset(uint32_t row, uint32_t k, uint32_t rows) {
    return (k / 16) * rows * 32 + ((k / 8) % 2) * rows * 16 + (row / 8) * 128 + (row % 8) * 16 + (k % 8) * 2;
}
// Two rows' values reduced over the lane quad that holds each row (op: max or a sum; the same
// butterfly on every lane, so all four hold the same bits).
template <typename Op>
__device__ __forceinline__ void quad_all(float& a, float& b, Op op) {
#pragma unroll
    for (uint32_t x = 1; x < 4; x <<= 1) {
        a = op(a, __shfl_xor_sync(0xffffffffu, a, x));
        b = op(b, __shfl_xor_sync(0xffffffffu, b, x));
    }
}

// FORM 1: the producer loads a tile's floats into its registers (two batches of 8 chunks of 8
// floats a thread) and stores them as halves; two query buffers. FORM 2: it copies them by
// cp.async into the staging buffer F (64 KB in flight, no registers), then converts its own
// pieces into the tile; one query buffer (the next row's queries are copied after the last
// tile's scores, while the consumers finish that tile). FORM 3: it copies the tile by cp.async
// from the round's FP16 keys (DevLayerKV::kh, made by keys_to_halves before the layer's
// attention: the same rounding, so the same bits as forms 1 and 2) straight into the core-matrix
// layout: half the bytes, no registers, no conversion; two query buffers. FORM 4: form 3's
// producer with three key stages and one query buffer, for consumers in split roles (below; not
// yet run on a device).
template <int FORM>
__global__ void __launch_bounds__(kWgThreads, 1)
    attn_rows_wg_kernel(const __half* q16, const float* __restrict__ sinks, uint32_t n_head, uint32_t n_swa,
                        uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* __restrict__ rows,
                        const DevLayerKV* __restrict__ lkv, uint32_t n_layer, uint32_t il, uint32_t R, uint32_t n_rot,
                        const double* __restrict__ inv_freq, float* o, int8_t* oq, float* od, uint16_t* oh,
                        unsigned* oh_max, bool no_keys, float margin) {
    pdl_begin();
    constexpr uint32_t D = kWgD, KT = kWgKT;
    extern __shared__ __align__(128) uint8_t smw[];
    // the row's inverse RoPE angles, by the row's parity (a warp may still read the row before's)
    __shared__ float rc_s[2][kWgMaxRot / 2], rs_s[2][kWgMaxRot / 2];
    const uint32_t wg = threadIdx.x / 128, tw = threadIdx.x % 128;
    using S = WgSmem<FORM>;
    RowTiles<KT, D, kWgThreads> tiles{rows, lkv, sel, n_swa, ratio, top_k, n_layer, il, R};

    if (wg == 2) {   // ---- the producer
        wgss::reg_dealloc<88>();   // (the consumers take 208: 256 x 208 + 128 x 88 = 384 x 168, the launch's)
        // padding heads: zero in the query buffers once (a row's copy writes the real heads)
        for (uint32_t i = tw; i < S::q_buffers * (kWgH - n_head) * (D / 8); i += 128) {
            const uint32_t b = i / ((kWgH - n_head) * (D / 8)), j = i % ((kWgH - n_head) * (D / 8));
            *reinterpret_cast<uint4*>(smw + b * kWgQBytes + wg_cm_offset(n_head + j / (D / 8), 8 * (j % (D / 8)), kWgH)) =
                make_uint4(0, 0, 0, 0);
        }
        const uint32_t kj = tw % KT, dc0 = tw / KT;   // this thread's key row of a tile, its first 8-dim chunk
        uint32_t n = 0, i = 0;
        for (uint32_t r = blockIdx.x; r < R; r += gridDim.x, ++i) {
            const uint32_t qb = i % S::q_buffers;
            if (i >= S::q_buffers) bar_sync(kBarQEmpty + qb, kWgThreads);
            uint8_t* qs = smw + qb * kWgQBytes;
            const __half* src = q16 + uint64_t(r) * n_head * D * 2;
            for (uint32_t c = tw; c < n_head * (D / 8); c += 128) {
                const uint32_t h = c % n_head, dc = c / n_head;   // consecutive threads: consecutive heads
                cp_async16(qs + wg_cm_offset(h, 8 * dc, kWgH), src + uint64_t(h) * D + 8 * dc);
            }
            if constexpr (FORM != 2) {
                cp_async_wait_all();
                xf::fence_proxy_async();
                bar_arrive(kBarQFull + qb, kWgThreads);
            }
            const auto ks = tiles.keys(r);
            for (uint32_t t0 = 0; t0 < ks.NK; t0 += KT, ++n) {
                const uint32_t st = n % S::k_stages;
                uint8_t* kt = smw + S::k + st * kWgKBytes;
                if constexpr (FORM >= 3) {
                    // key 8 (tw / 32) + tw % 8, its 16-byte chunks 4 u + (tw / 8) % 4: a warp reads
                    // 64 contiguous bytes of each of 8 keys and writes whole core matrices
                    const uint32_t kk = 8 * (tw / 32) + tw % 8, cq = (tw / 8) % 4, g = t0 + kk;
                    const uint16_t* kp =
                        g < ks.NK && !no_keys ? tiles.key_half_row(ks, r, g, tiles.sel_at(ks, r, g)) : nullptr;
                    if (n >= S::k_stages) bar_sync(kBarKEmpty + st, kWgThreads);   // the consumers are done with it
#pragma unroll
                    for (uint32_t u = 0; u < 16; ++u) {
                        const uint32_t dc = 4 * u + cq;
                        uint8_t* dst = kt + wg_cm_offset(kk, 8 * dc, KT);
                        if (kp) cp_async16(dst, kp + 8 * dc);
                        else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
                    }
                    cp_async_wait_all();
                    xf::fence_proxy_async();
                    bar_arrive(kBarKFull + st, FORM == 4 ? 256 : kWgThreads);   // (form 4: the tile's owner waits)
                    continue;
                }
                const uint32_t g = t0 + kj;
                const float* kp = g < ks.NK && !no_keys ? tiles.key_row(ks, r, g, tiles.sel_at(ks, r, g)) : nullptr;
                if constexpr (FORM == 2) {
                    // this thread's 16 chunks of 8 dims (dc0 + 4u) as 32 pieces of 16 bytes, piece
                    // (u, e) at F + (2u + e) · 2,048 + 16 tw (a warp's reads back: consecutive)
                    uint8_t* f = smw + S::f + 16 * tw;
#pragma unroll
                    for (uint32_t u = 0; u < 16; ++u) {
                        const uint32_t dc = dc0 + 4 * u;
#pragma unroll
                        for (uint32_t e = 0; e < 2; ++e) {
                            if (kp) cp_async16(f + (2 * u + e) * 2048, kp + 8 * dc + 4 * e);
                            else *reinterpret_cast<float4*>(f + (2 * u + e) * 2048) = make_float4(0, 0, 0, 0);
                        }
                    }
                    cp_async_wait_all();   // (and a row's first tile: its queries' copies)
                    if (t0 == 0) {
                        xf::fence_proxy_async();
                        bar_arrive(kBarQFull + qb, kWgThreads);
                    }
                    if (n >= 2) bar_sync(kBarKEmpty + st, kWgThreads);   // the consumers are done with the stage
#pragma unroll
                    for (uint32_t u = 0; u < 16; ++u) {
                        const uint32_t dc = dc0 + 4 * u;
                        const float4 a = *reinterpret_cast<const float4*>(f + (2 * u) * 2048);
                        const float4 c = *reinterpret_cast<const float4*>(f + (2 * u + 1) * 2048);
                        *reinterpret_cast<uint4*>(kt + wg_cm_offset(kj, 8 * dc, KT)) =
                            make_uint4(h2_of(a.x, a.y), h2_of(a.z, a.w), h2_of(c.x, c.y), h2_of(c.z, c.w));
                    }
                    xf::fence_proxy_async();
                    bar_arrive(kBarKFull + st, kWgThreads);
                    continue;
                }
                if (n >= 2) bar_sync(kBarKEmpty + st, kWgThreads);   // the consumers are done with the stage
                // 16 chunks of 8 dims (dc0 + 4u) in two batches of 8: a batch's loads, then its
                // conversion and stores
#pragma unroll
                for (uint32_t b = 0; b < 2; ++b) {
                    float4 v[16];
#pragma unroll
                    for (uint32_t u = 0; u < 8; ++u) {
                        const uint32_t dc = dc0 + 4 * (8 * b + u);
                        v[2 * u] = kp ? __ldcg(reinterpret_cast<const float4*>(kp + 8 * dc)) : make_float4(0, 0, 0, 0);
                        v[2 * u + 1] = kp ? __ldcg(reinterpret_cast<const float4*>(kp + 8 * dc + 4)) : make_float4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (uint32_t u = 0; u < 8; ++u) {
                        const uint32_t dc = dc0 + 4 * (8 * b + u);
                        const float4 a = v[2 * u], c = v[2 * u + 1];
                        *reinterpret_cast<uint4*>(kt + wg_cm_offset(kj, 8 * dc, KT)) =
                            make_uint4(h2_of(a.x, a.y), h2_of(a.z, a.w), h2_of(c.x, c.y), h2_of(c.z, c.w));
                    }
                }
                xf::fence_proxy_async();
                bar_arrive(kBarKFull + st, kWgThreads);
            }
        }
        return;
    }

    // ---- the consumers: warpgroup wg, its warp w: head rows 16 w + gid and + 8
    wgss::reg_alloc<208>();
    const uint32_t w = tw / 32, lane = tw % 32, gid = lane / 4, tig = lane % 4;
    const uint32_t h0 = 16 * w + gid, h1 = h0 + 8;
    const float scale = float(1.0 / sqrt(double(D))) / kWgQScale;
    const uint32_t sm_a = smem_addr(smw);
    float ov[128];   // O[64 heads][dims 256 wg ..] (times 2^12), wgmma's D layout: n-tile i in ov[4i .. 4i + 3]
    float hmax = 0.0f;   // the half output's largest |y| (rows_half_max)
    uint32_t n = 0, i = 0;
    for (uint32_t r = blockIdx.x; r < R; r += gridDim.x, ++i) {
        const uint32_t qb = i % S::q_buffers, ab = i & 1;
        const auto ks = tiles.keys(r);
        if (wg == 1 && tw < n_rot / 2) rope_angle(rows[r].pos, inv_freq, tw, true, rc_s[ab][tw], rs_s[ab][tw]);
#pragma unroll
        for (uint32_t j = 0; j < 128; ++j) ov[j] = 0.0f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;   // rows h0, h1 (the quad's four lanes alike)
        bar_sync(kBarQFull + qb, kWgThreads);
        const uint32_t qa = sm_a + qb * kWgQBytes;
        // S_wg over dims 256 wg .. 256 wg + 255 (k-steps 16 wg .. 16 wg + 15) of the tile in stage
        // st, issued and committed (not waited for)
        // (form 4: S over all of D, k-steps 0 .. 31)
        auto scores = [&](float (&sc)[16], uint32_t st) {
            const uint32_t ka = sm_a + S::k + st * kWgKBytes;
            xf::wg_fence();
#pragma unroll
            for (uint32_t s = 0; s < (FORM == 4 ? 32 : 16); ++s) {
                const uint32_t kg = (FORM == 4 ? 0 : 16 * wg) + s;
                wg_mma_ss<32, 0>(sc, wg_ss_desc(qa + kg * kWgH * 32, kWgH * 16, 128),
                                 wg_ss_desc(ka + kg * KT * 32, KT * 16, 128), s > 0);
            }
            xf::wg_commit();
        };
        // The scores of tile n once waited for, exchanged: S = S_0 + S_1 in both warpgroups.
        auto exchange = [&](float (&sc)[16], uint32_t tn) {
            // this warpgroup's half into X[tn & 1][wg], the other's back
            float* xs = reinterpret_cast<float*>(smw + S::x + ((tn & 1) * 2 + wg) * kWgXBytes);
            const float* xo = reinterpret_cast<const float*>(smw + S::x + ((tn & 1) * 2 + (1 - wg)) * kWgXBytes);
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t) {
                *reinterpret_cast<float2*>(xs + h0 * KT + 8 * t + 2 * tig) = make_float2(sc[4 * t], sc[4 * t + 1]);
                *reinterpret_cast<float2*>(xs + h1 * KT + 8 * t + 2 * tig) = make_float2(sc[4 * t + 2], sc[4 * t + 3]);
            }
            bar_sync(kBarX, 256);
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t) {
                const float2 a = *reinterpret_cast<const float2*>(xo + h0 * KT + 8 * t + 2 * tig);
                const float2 b = *reinterpret_cast<const float2*>(xo + h1 * KT + 8 * t + 2 * tig);
                const float oth[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e)
                    sc[4 * t + e] = wg == 0 ? __fadd_rn(sc[4 * t + e], oth[e]) : __fadd_rn(oth[e], sc[4 * t + e]);
            }
        };
        // The online softmax of rows h0 (sc[4t], sc[4t + 1]) and h1 (sc[4t + 2], sc[4t + 3]), key
        // 8 t + 2 tig (+ 1), over a tile's nt keys: sc becomes the weights exp(s - m), (m, l) move
        // on, c0, c1 the factors O takes before this tile's P · V is added.
        auto softmax = [&](float (&sc)[16], uint32_t nt, float& c0, float& c1) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t)
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) {
                    const uint32_t key = 8 * t + 2 * tig + (e & 1);
                    const float v = key < nt ? __fmul_rn(sc[4 * t + e], scale) : -INFINITY;
                    sc[4 * t + e] = v;
                    if (e < 2) mx0 = fmaxf(mx0, v);
                    else mx1 = fmaxf(mx1, v);
                }
            quad_all(mx0, mx1, [](float a, float b) { return fmaxf(a, b); });
            // (margin > 0: a row keeps its running max until a tile's exceeds it by the margin, so
            // O is rescaled on fewer tiles; P = exp(s - m) then stays below e^margin)
            const float nm0 = margin > 0.0f ? (mx0 > m0 + margin ? mx0 : m0) : fmaxf(m0, mx0);
            const float nm1 = margin > 0.0f ? (mx1 > m1 + margin ? mx1 : m1) : fmaxf(m1, mx1);
            c0 = expf(m0 - nm0), c1 = expf(m1 - nm1);
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t)
#pragma unroll
                for (uint32_t e = 0; e < 4; ++e) {
                    const float v = expf(sc[4 * t + e] - (e < 2 ? nm0 : nm1));   // exp(-inf) = 0 past nt
                    sc[4 * t + e] = v;
                    if (e < 2) s0 = __fadd_rn(s0, v);
                    else s1 = __fadd_rn(s1, v);
                }
            quad_all(s0, s1, [](float a, float b) { return __fadd_rn(a, b); });
            l0 = __fadd_rn(__fmul_rn(l0, c0), s0), l1 = __fadd_rn(__fmul_rn(l1, c1), s1);
            m0 = nm0, m1 = nm1;
        };
        // The weights (times 2^12, FP16) as the A fragments of the tile's two k-steps of 16 keys.
        auto fragments = [&](const float (&sc)[16], uint32_t (&pa)[2][4]) {
#pragma unroll
            for (uint32_t kk = 0; kk < 2; ++kk) {
                const float* lo = sc + 8 * kk;   // n-tiles 2 kk (keys 16 kk + 2 tig ..), 2 kk + 1 (+ 8)
                pa[kk][0] = h2_of(lo[0] * kWgPScale, lo[1] * kWgPScale);
                pa[kk][1] = h2_of(lo[2] * kWgPScale, lo[3] * kWgPScale);
                pa[kk][2] = h2_of(lo[4] * kWgPScale, lo[5] * kWgPScale);
                pa[kk][3] = h2_of(lo[6] * kWgPScale, lo[7] * kWgPScale);
            }
        };
        auto rescale = [&](float c0, float c1) {
            if (c0 != 1.0f || c1 != 1.0f) {
#pragma unroll
                for (uint32_t j = 0; j < 32; ++j) {
                    ov[4 * j] *= c0, ov[4 * j + 1] *= c0;
                    ov[4 * j + 2] *= c1, ov[4 * j + 3] *= c1;
                }
            }
        };
        // O += P · V, issued and committed: V the key tile in stage st as an MN-major B (dims
        // 256 wg ..: 8 dims a core matrix, 512 bytes apart; keys 16 kk ..: 8 keys a core matrix,
        // 128 bytes apart)
        auto weighted = [&](const uint32_t (&pa)[2][4], uint32_t st) {
            const uint32_t ka = sm_a + S::k + st * kWgKBytes;
            xf::wg_fence();
#pragma unroll
            for (uint32_t kk = 0; kk < 2; ++kk)
                wg_mma_rs<256, 1>(ov, pa[kk], wg_ss_desc(ka + kk * 256 + wg * (256 / 8) * (KT * 16), 128, KT * 16), true);
            xf::wg_commit();
        };
        if constexpr (FORM == 4) {
            // Split roles (as FlashMLA's): warpgroup j % 2 forms tile j's scores over all of D,
            // its softmax and P (into shared memory, with the rows' m, l and factor c); the other
            // reads that state, and both rescale their half of O and add P · V for their 256
            // value dims, the other issuing the next tile's scores beside it. So each warpgroup
            // runs the softmax of every other tile, nothing is exchanged but P (4 KB of halves),
            // and a tile's scores run beside the tile before's P · V. Other bits than forms 1-3
            // (S in one chain over D, not two halves added).
            const uint32_t T = uint32_t((ks.NK + KT - 1) / KT);
            const int64_t own_last = int64_t(T) - 1 - ((T - 1) % 2 != wg ? 1 : 0);   // -1: none
            const uint32_t pb = sm_a + S::x;                                          // P of parity p at pb + p kWgPBytes
            uint32_t* pw = reinterpret_cast<uint32_t*>(smw + S::x);
            float* state = reinterpret_cast<float*>(smw + S::x + 2 * kWgPBytes);    // [parity][m, l, c][64 rows]
            float sc[16];
            if (own_last < 0) bar_arrive(kBarQEmpty + qb, kWgThreads);   // (a row of one tile: warpgroup 1 forms none)
            if (wg == 0) {   // tile 0's scores
                bar_sync(kBarKFull + n % S::k_stages, 256);
                scores(sc, n % S::k_stages);
                xf::wg_wait<0>();
#pragma unroll
                for (uint32_t q = 0; q < 16; ++q) xf::wg_fence_operand(sc[q]);
                if (own_last == 0) bar_arrive(kBarQEmpty + qb, kWgThreads);
            }
            for (uint32_t j = 0; j < T; ++j, ++n) {
                const uint32_t st = n % S::k_stages, par = j & 1;
                float c0, c1;
                const bool own = j % 2 == wg, next = !own && j + 1 < T;
                if (own) {
                    softmax(sc, min(KT, uint32_t(ks.NK - uint64_t(j) * KT)), c0, c1);
                    // P (times 2^12) at wg_cm_offset(head, key, 64): rows h0, h1, keys 8 t + 2 tig, + 1
                    // (n-tile t's pairs are fragment t / 2's registers 2 (t % 2) and 2 (t % 2) + 1)
                    uint32_t pa[2][4];
                    fragments(sc, pa);
#pragma unroll
                    for (uint32_t t = 0; t < 4; ++t) {
                        pw[(par * kWgPBytes + wg_cm_offset(h0, 8 * t + 2 * tig, kWgH)) / 4] = pa[t / 2][2 * (t % 2)];
                        pw[(par * kWgPBytes + wg_cm_offset(h1, 8 * t + 2 * tig, kWgH)) / 4] = pa[t / 2][2 * (t % 2) + 1];
                    }
                    if (tig == 0) {
                        float* sp = state + par * 3 * kWgH;
                        sp[h0] = m0, sp[kWgH + h0] = l0, sp[2 * kWgH + h0] = c0;
                        sp[h1] = m1, sp[kWgH + h1] = l1, sp[2 * kWgH + h1] = c1;
                    }
                    xf::fence_proxy_async();
                    bar_arrive(kBarState + par, 256);   // for the other warpgroup
                    bar_sync(kBarP + wg, 128);          // this one's own P · V reads all four warps' P
                } else {
                    bar_sync(kBarState + par, 256);
                    const float* sp = state + par * 3 * kWgH;
                    m0 = sp[h0], l0 = sp[kWgH + h0], c0 = sp[2 * kWgH + h0];
                    m1 = sp[h1], l1 = sp[kWgH + h1], c1 = sp[2 * kWgH + h1];
                }
                // (O rescaled before any wgmma of this stage is issued: ptxas serialises every
                // wgmma of the kernel if their accumulators are written between issue and wait)
                rescale(c0, c1);
                {   // O += P · V, P from shared memory (the A operand's K-major core matrices)
                    const uint32_t ka = sm_a + S::k + st * kWgKBytes;
                    xf::wg_fence();
#pragma unroll
                    for (uint32_t kk = 0; kk < 2; ++kk)
                        wg_mma_ss<256, 1>(ov, wg_ss_desc(pb + par * kWgPBytes + kk * kWgH * 32, kWgH * 16, 128),
                                          wg_ss_desc(ka + kk * 256 + wg * (256 / 8) * (KT * 16), 128, KT * 16), true);
                    xf::wg_commit();
                }
                // (each path waits before it joins the other: sc must not merge while in flight)
                if (next) {   // the next tile is this warpgroup's: its scores beside P · V
                    bar_sync(kBarKFull + (n + 1) % S::k_stages, 256);
                    scores(sc, (n + 1) % S::k_stages);
                    xf::wg_wait<0>();
#pragma unroll
                    for (uint32_t q = 0; q < 16; ++q) xf::wg_fence_operand(sc[q]);
                    if (int64_t(j) + 1 == own_last) bar_arrive(kBarQEmpty + qb, kWgThreads);   // its last scores
                } else {
                    xf::wg_wait<0>();
                }
#pragma unroll
                for (uint32_t q = 0; q < 128; ++q) xf::wg_fence_operand(ov[q]);
                bar_arrive(kBarKEmpty + st, kWgThreads);   // the tile read
            }
            bar_sync(kBarX, 256);   // (both done with P and the state before the next row writes them)
        } else
        for (uint32_t t0 = 0; t0 < ks.NK; t0 += KT, ++n) {
            const uint32_t st = n % S::k_stages, nt = min(KT, uint32_t(ks.NK - t0));
            const bool last = t0 + KT >= ks.NK;
            bar_sync(kBarKFull + st, kWgThreads);
            float sc[16];
            scores(sc, st);
            xf::wg_wait<0>();
#pragma unroll
            for (uint32_t j = 0; j < 16; ++j) xf::wg_fence_operand(sc[j]);
            if (last) bar_arrive(kBarQEmpty + qb, kWgThreads);   // the row's queries read
            uint32_t pa[2][4];
            float c0, c1;
            exchange(sc, n);
            softmax(sc, nt, c0, c1);
            fragments(sc, pa);
            rescale(c0, c1);
            weighted(pa, st);
            xf::wg_wait<0>();
#pragma unroll
            for (uint32_t j = 0; j < 128; ++j) xf::wg_fence_operand(ov[j]);
            bar_arrive(kBarKEmpty + st, kWgThreads);   // the tile read
        }
        {   // the row's output: the sink, the normalisation, the RoPE tail back, the codes
            float fw[2], inv[2];
#pragma unroll
            for (uint32_t hh = 0; hh < 2; ++hh) {
                const uint32_t h = hh ? h1 : h0;
                rows_sink_norm(h < n_head ? sinks[h] : 0.0f, hh ? m1 : m0, hh ? l1 : l0, kWgPScale, fw[hh], inv[hh]);
            }
            const uint32_t tail0 = D - n_rot;
#pragma unroll
            for (uint32_t b = 0; b < 8; ++b) {   // blocks of 32 columns: n-tiles 4 b .. 4 b + 3
#pragma unroll
                for (uint32_t hh = 0; hh < 2; ++hh) {
                    const uint32_t h = hh ? h1 : h0;
                    float y[4][2];
                    float am = 0.0f;
#pragma unroll
                    for (uint32_t t = 0; t < 4; ++t) {
                        const uint32_t j = 4 * (4 * b + t) + 2 * hh;
                        rows_out_pair(ov[j], ov[j + 1], fw[hh], inv[hh], 256 * wg + 8 * (4 * b + t) + 2 * tig, tail0,
                                      rc_s[ab], rs_s[ab], y[t], am);
                    }
                    rows_store_block(y, am, o, oq, od, oh, (uint64_t(r) * n_head + h) * D + 256 * wg + 32 * b, tig,
                                     h < n_head);
                    if (h < n_head) hmax = fmaxf(hmax, am);
                }
            }
        }
    }
    rows_half_max(hmax, oh ? oh_max : nullptr);
}

template <int FORM>
uint32_t wg_resident() {
    static const uint32_t resident = [] {
        check(cudaFuncSetAttribute(attn_rows_wg_kernel<FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(WgSmem<FORM>::bytes)),
              "attention (rows, WG) shared memory");
        return resident_blocks(reinterpret_cast<const void*>(attn_rows_wg_kernel<FORM>), kWgThreads, WgSmem<FORM>::bytes);
    }();
    return resident;
}

}  // namespace

bool launch_rows_wg(int form, const float* sinks, uint32_t n_head, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                    const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il,
                    uint32_t R, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq, float* od,
                    uint16_t* oh, unsigned* oh_max, cudaStream_t s) {
    if (n_head > kWgH || n_rot > kWgMaxRot || n_rot % 2 || form < 1 || form > 4) return false;
    const uint32_t resident = form == 1   ? wg_resident<1>()
                              : form == 2 ? wg_resident<2>()
                              : form == 3 ? wg_resident<3>()
                                          : wg_resident<4>();
    if (resident == 0) return false;
    // DSV4_ATTN_WG_NO_KEYS=1 (a measurement, wrong outputs): the producer stages zero keys
    // without loading them, so the consumers' own time shows (run 187)
    static const bool no_keys = env_int("DSV4_ATTN_WG_NO_KEYS", 0) == 1;
    // DSV4_ATTN_WG_MARGIN=x (thousandths; opt-in, not yet measured, other bits): a row's running
    // max moves only when a tile's max exceeds it by x / 1000 (at most ln 8: P · 2^12 stays an
    // FP16 below 2^15), so the consumers rescale O on fewer tiles (run 192: FMUL 16.8 % of the
    // kernel's instructions)
    static const float margin = std::min(2.0794f, float(env_int("DSV4_ATTN_WG_MARGIN", 0)) / 1000.0f);
    auto* kernel = form == 1   ? attn_rows_wg_kernel<1>
                   : form == 2 ? attn_rows_wg_kernel<2>
                   : form == 3 ? attn_rows_wg_kernel<3>
                               : attn_rows_wg_kernel<4>;
    const uint32_t smem = form == 1   ? WgSmem<1>::bytes
                          : form == 2 ? WgSmem<2>::bytes
                          : form == 3 ? WgSmem<3>::bytes
                                      : WgSmem<4>::bytes;
    kernel<<<std::min(R, resident), kWgThreads, smem, s>>>(
        reinterpret_cast<const __half*>(o), sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot,
        inv_freq, o, oq, od, oh, oh_max, no_keys, margin);
    check_launch("attention (rows, WG)");
    return true;
}

}  // namespace dsv4::cuda
