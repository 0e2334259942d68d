// Sink attention's split kernel (§5.12) on the tensor cores, FP32-accurate: the partials
// attn_split_kernel (model.cu) writes, for the same splits, into the same scratch, so the
// merge is shared.
//
// Work item = 16 heads of one row over one split of its keys (the row's splits are
// attn_split_kernel's). Per tile of up to 32 staged keys the block computes
//   S = Q·Kᵀ  (16 heads × 32 keys, over D)       — the 8 warps take D/8 each; their parts are
//                                                  added in warp order (fixed);
//   the online softmax per head in FP32 with exp_cr (a warp per 2 heads, a lane per key);
//   O = O·corr + P·V  (16 heads × D, over the keys) — the warps take D/8 columns each.
// Both products are m16n8k8 TF32 MMAs made FP32-accurate by the 3xTF32 split: x = hi + lo,
// hi = tf32(x), lo = tf32(x − hi) (both rounded to nearest), a·b ≈ hi·hi + hi·lo + lo·hi; the
// dropped lo·lo and lo's rounding are below 2^-22 |a·b|, FP32 products' own size. The tensor
// cores round their sums toward zero, so the large term hi·hi of each 8-wide k-step is made
// in a fresh accumulator and added to the running sum by an FP32 add (rounded to nearest);
// the two small terms accumulate in their own registers, where truncation costs ~2^-11 of an
// ulp of the result. Every addition is in a fixed order that depends on the row's own split
// only, and each MMA row (a head) is computed independently of the others, so a row's
// partials are the same bits alone (decode) or in any batch (prefill).
//
// The keys are gathered rows (window ring and selected compressed rows), copied by cp.async
// into two tile buffers: the next tile (of this item, or the block's next item) is copied
// while the current one is computed; the next item's queries once the current scores are
// made. One block of 8 warps per SM (192 KB of shared memory at D = 512).
//
// LOOP (many rows: prefill; attention()'s DSV4_ATTN_LOOP): an item is a (row, split) pair, or
// a run of gpi consecutive head groups of one, and takes its groups one after another; a split
// of one tile (up to 32 keys, the common case) copies its keys once for all of them (the same
// tile: the keys do not depend on the group) instead of once per 16 heads. The tiles then
// form a stream of steps (tile, group), where a step whose keys are those of the step before
// reads the same buffer and copies nothing: the next distinct tile, the next item's first
// included, is copied into the other buffer during the last step that reads the current one.
// Each (row, split, group) is computed with the same operations either way, so the partials
// are the same bits; decode keeps an item per group (its few rows need the items for
// parallelism).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr uint32_t kTcHeads = 16;                     // heads per item: the M of the MMAs
constexpr uint32_t kTcKT = 32;                        // keys per tile: the softmax's lane per key
constexpr uint32_t kTcThreads = 256;
constexpr uint32_t kTcWarps = kTcThreads / 32;
constexpr uint32_t kTcHPW = kTcHeads / kTcWarps;      // heads per warp in the softmax
constexpr uint32_t kTcRS = kTcKT + 8;                 // score/weight row stride: ≡ 8 (mod 32), see below
static_assert(kTcThreads == 8 * kTcKT, "key staging: eight threads per key row");
static_assert(kTcKT == 32 && kTcHeads == 16 && kTcWarps == 8, "tile shapes");

// Shared memory (floats) for head width D, rows padded to DP = D + 4:
//   keys [2][kTcKT][DP] | queries [kTcHeads][DP] | score parts [kTcWarps][kTcHeads][kTcRS]
//   | weights hi, lo [kTcHeads][kTcRS] each (TF32 bit patterns)
// DP ≡ 4 (mod 32) for D a multiple of 32: the 8 rows an ldmatrix reads fall on 8 different
// 16-byte bank groups; the weighted sum's key-row float4 loads (keys 2·tig, columns 4·gid)
// fall on distinct banks per quarter warp. kTcRS ≡ 8 (mod 32): the float2 stores of score
// parts and loads of weights (row gid, column 2·tig) are conflict-free per half warp.
constexpr size_t tc_smem_floats(uint32_t D) {
    return size_t(2 * kTcKT + kTcHeads) * (D + kAttnPad) + size_t(kTcWarps + 2) * kTcHeads * kTcRS;
}

// One work item, decoded from its number (every thread decodes it the same way, from the
// slice's rows staged in shared memory).
struct TcItem {
    uint32_t rl, split, h0, nh;
    uint32_t h_end;    // LOOP: the item's heads are h0 .. h_end-1 (its last group ends there)
    uint64_t kb, ke;   // the split's keys kb .. ke-1
    AttnKeys ks;
};

// Weighted-sum columns: warp w owns columns [8·NT·w, 8·NT·(w+1)) as NT MMA n-tiles. Column
// n (0..7) of n-tile t is, for NT >= 4, base + 32·(t/4) + 4·n + t%4 (so a lane's B values
// of four n-tiles are one float4 of a key row, and its results for 2tig, 2tig+1 two float4
// of the output row), else base + 8·t + n.
// The weighted sum's B values of this lane, in the column order above: for each n-tile t of
// the warp's columns, step(t, x0, x1) with the values of the key rows v0 (k slot tig) and v1
// (slot tig + 4) in the tile's column gid (v0, v1: the rows at the warp's first column).
template <uint32_t NT, class Step>
__device__ __forceinline__ void value_tiles(const float* v0, const float* v1, uint32_t gid, Step&& step) {
    if constexpr (NT >= 4) {
#pragma unroll
        for (uint32_t c = 0; c < NT / 4; ++c) {
            const float4 x0 = *reinterpret_cast<const float4*>(v0 + 32 * c + 4 * gid);
            const float4 x1 = *reinterpret_cast<const float4*>(v1 + 32 * c + 4 * gid);
            step(4 * c + 0, x0.x, x1.x);
            step(4 * c + 1, x0.y, x1.y);
            step(4 * c + 2, x0.z, x1.z);
            step(4 * c + 3, x0.w, x1.w);
        }
    } else {
#pragma unroll
        for (uint32_t t = 0; t < NT; ++t) step(t, v0[8 * t + gid], v1[8 * t + gid]);
    }
}
// Stores this lane's outputs of accumulator row gid (half 0) or gid + 8 (half 1) into the row
// dst (at the warp's first column), in the column order above: val(t, x) is element x of n-tile
// t's accumulator.
template <uint32_t NT, class Val>
__device__ __forceinline__ void store_out_row(float* dst, uint32_t tig, uint32_t half, Val&& val) {
    if constexpr (NT >= 4) {
#pragma unroll
        for (uint32_t c = 0; c < NT / 4; ++c)
#pragma unroll
            for (uint32_t j = 0; j < 2; ++j) {
                const uint32_t x = 2 * half + j;
                *reinterpret_cast<float4*>(dst + 32 * c + 8 * tig + 4 * j) =
                    make_float4(val(4 * c + 0, x), val(4 * c + 1, x), val(4 * c + 2, x), val(4 * c + 3, x));
            }
    } else {
#pragma unroll
        for (uint32_t t = 0; t < NT; ++t)
            *reinterpret_cast<float2*>(dst + 8 * t + 2 * tig) = make_float2(val(t, 2 * half), val(t, 2 * half + 1));
    }
}

// LOOP: items over several head groups (see the file comment); spread (LOOP only): gpi, the
// groups of an item, chosen for the grid (below), else all of the pair's groups.
template <uint32_t NT, bool LOOP>
__global__ void __launch_bounds__(kTcThreads, 1)
    attn_split_tc_kernel(const float* __restrict__ q, uint32_t n_head, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                         const uint32_t* __restrict__ sel, const DevRow* __restrict__ rows,
                         const DevLayerKV* __restrict__ lkv, uint32_t n_layer, uint32_t il, uint32_t r0,
                         uint32_t n_rows, uint32_t max_split, float* __restrict__ part_o,
                         float2* __restrict__ part_ml, bool spread) {
    pdl_begin();
    constexpr uint32_t D = 64 * NT, DP = D + kAttnPad, D4 = D / 4;
    extern __shared__ float4 sm4[];
    float* k_s = reinterpret_cast<float*>(sm4);                // [2][kTcKT][DP]
    float* q_s = k_s + 2 * kTcKT * DP;                          // [kTcHeads][DP]
    float* red_s = q_s + kTcHeads * DP;                         // [kTcWarps][kTcHeads][kTcRS]
    uint32_t* ph_s = reinterpret_cast<uint32_t*>(red_s + kTcWarps * kTcHeads * kTcRS);   // [kTcHeads][kTcRS]
    uint32_t* pl_s = ph_s + kTcHeads * kTcRS;                   // [kTcHeads][kTcRS]
    __shared__ float corr_s[kTcHeads];
    __shared__ uint32_t incl_s[kAttnMaxSliceRows];
    __shared__ int64_t pos_s[kAttnMaxSliceRows];      // the slice's rows: positions
    __shared__ DevLayerKV L_s[kAttnMaxSliceRows];     // and their sessions' KV of this layer

    if (threadIdx.x < n_rows) {   // n_rows <= kAttnMaxSliceRows
        const DevRow row = rows[r0 + threadIdx.x];
        pos_s[threadIdx.x] = row.pos;
        L_s[threadIdx.x] = lkv[uint64_t(row.sess) * n_layer + il];
    }
    attn_split_scan(incl_s, rows, r0, n_rows, n_swa, ratio, top_k);   // (its barriers publish the rows too)
    const uint32_t n_groups = (n_head + kTcHeads - 1) / kTcHeads;
    // LOOP: groups per item (gpi, a divisor of n_groups) and items per pair (n_chunks). With
    // spread, the gpi whose items take the fewest steps on the busiest block (a step = a tile
    // of one group; one tile per split assumed), ties to the larger gpi (fewer key copies):
    // e.g. 64 pairs of 4 groups on 132 blocks take 2 steps at gpi 1 (256 items) or 2 (128),
    // 4 at gpi 4 (64), so gpi = 2. Every block finds the same gpi (the slice's pair count and
    // the grid), and the partials do not depend on it.
    uint32_t gpi = 1, n_chunks = n_groups;
    if constexpr (LOOP) {
        gpi = n_groups;
        if (spread) {
            const uint64_t pairs = incl_s[kAttnMaxSliceRows - 1];
            uint64_t best = ~uint64_t(0);
            for (uint32_t g = 1; g <= n_groups; ++g) {
                if (n_groups % g) continue;
                const uint64_t span = (pairs * (n_groups / g) + gridDim.x - 1) / gridDim.x * g;
                if (span <= best) {
                    best = span;
                    gpi = g;
                }
            }
        }
        n_chunks = n_groups / gpi;
    }
    const uint32_t n_items = incl_s[kAttnMaxSliceRows - 1] * n_chunks;
    if (blockIdx.x >= n_items) return;

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t li = lane >> 3, lr = lane & 7;   // ldmatrix: the matrix and row this lane addresses
    const uint32_t kj = threadIdx.x >> 3, ksub = threadIdx.x & 7;   // key staging: row, first float4
    const float scale = float(1.0 / sqrt(double(D)));

    auto decode = [&](uint32_t item) {
        TcItem it;
        const uint32_t P = item / n_chunks, grp = item % n_chunks * gpi;   // (LOOP: the item's first group)
        it.rl = attn_pair_row(incl_s, P);
        it.split = P - (it.rl ? incl_s[it.rl - 1] : 0);
        it.ks = attn_keys(pos_s[it.rl], n_swa, ratio, top_k);
        const uint32_t ns = attn_nsplit(it.ks.NK);
        it.kb = uint64_t(it.split) * it.ks.NK / ns;
        it.ke = uint64_t(it.split + 1) * it.ks.NK / ns;
        it.h0 = grp * kTcHeads;
        it.nh = min(kTcHeads, n_head - it.h0);
        it.h_end = LOOP ? min(n_head, (grp + gpi) * kTcHeads) : 0u;
        return it;
    };
    // The tile after (item, t0): the split's next keys, (LOOP) the first keys of the item's
    // next group, or the first of the block's next item (n_items when there is none).
    auto advance = [&](uint32_t& item, TcItem& it, uint64_t& t0) {
        if (t0 + kTcKT < it.ke) {
            t0 += kTcKT;
            return;
        }
        if constexpr (LOOP) {
            if (it.h0 + kTcHeads < it.h_end) {
                it.h0 += kTcHeads;
                it.nh = min(kTcHeads, n_head - it.h0);
                t0 = it.kb;
                return;
            }
        }
        item += gridDim.x;
        if (item < n_items) {
            it = decode(item);
            t0 = it.kb;
        }
    };
    // This thread's key of tile (it, t0): key g (~0: none, a zero row) and its selection,
    // read a tile ahead of the copy so the read's latency hides behind a tile's work.
    auto key_of = [&](const TcItem& it, uint64_t t0, uint64_t& g, uint32_t& sel_g) {
        g = t0 + kj < it.ke ? t0 + kj : ~uint64_t(0);
        sel_g = g != ~uint64_t(0) && g >= it.ks.n_raw && it.ks.use_sel
                    ? sel[uint64_t(r0 + it.rl) * top_k + (g - it.ks.n_raw)]
                    : 0u;
    };
    // This thread's part of the tile copy into dst: eight float4 columns of key row kj; rows
    // past the tile's keys zero (their weights are 0, and 0 · a stale NaN would not be).
    auto stage_keys = [&](const TcItem& it, uint64_t g, uint32_t sel_g, float* dst) {
        float* row = dst + kj * DP;
        if (g != ~uint64_t(0)) {
            const float* kp = attn_key_row_sel(it.ks, L_s[it.rl], g, sel_g, D);
            for (uint32_t u = ksub; u < D4; u += 8) cp_async16(row + 4 * u, kp + 4 * u);
        } else {
            for (uint32_t u = ksub; u < D4; u += 8) *reinterpret_cast<float4*>(row + 4 * u) = make_float4(0, 0, 0, 0);
        }
    };
    // The item's queries (absent heads of a partial group: zeros, never written out).
    auto stage_q = [&](const TcItem& it) {
        const float* qr = q + (uint64_t(r0 + it.rl) * n_head + it.h0) * D;
        for (uint32_t i = threadIdx.x; i < kTcHeads * D4; i += kTcThreads) {
            const uint32_t h = i / D4, u = i % D4;
            if (h < it.nh) cp_async16(q_s + h * DP + 4 * u, qr + uint64_t(h) * D + 4 * u);
            else *reinterpret_cast<float4*>(q_s + h * DP + 4 * u) = make_float4(0, 0, 0, 0);
        }
    };

    // Whether step (ib, b), the one after (ia, a), reads the keys of (ia, a) again: LOOP, the
    // same item (so the next group: a one-tile split has no next tile) of a one-tile split.
    // Those keys stay in their buffer, and nothing is copied for the step.
    auto same_keys = [&](uint32_t ia, const TcItem& a, uint32_t ib) {
        return LOOP && ib == ia && a.ke - a.kb <= kTcKT;
    };

    // Three tiles in flight: cur (computed now, in buffer buf), nx1 (copied into buf ^ 1 while
    // cur is computed, unless it reads cur's keys) and nx2 (its keys' selections read meanwhile).
    uint32_t item = blockIdx.x;
    TcItem cur = decode(item);
    uint64_t t0 = cur.kb;
    {
        uint64_t g;
        uint32_t sg;
        key_of(cur, t0, g, sg);
        stage_q(cur);
        stage_keys(cur, g, sg, k_s);
    }
    uint32_t item1 = item;
    TcItem nx1 = cur;
    uint64_t t1 = t0;
    advance(item1, nx1, t1);
    uint64_t g1 = ~uint64_t(0);
    uint32_t sg1 = 0;
    bool read1 = item1 < n_items;   // (not for a step that copies nothing)
    if constexpr (LOOP) read1 = read1 && !same_keys(item, cur, item1);
    if (read1) key_of(nx1, t1, g1, sg1);
    uint32_t buf = 0;

    // Running output of heads gid, gid+8 over this warp's columns: the large terms (ob) and
    // the small ones (os), kept apart (see the file comment). Softmax state of heads
    // kTcHPW·w + i: running max and denominator.
    float ob[NT][4], os[NT][4];
#pragma unroll
    for (uint32_t t = 0; t < NT; ++t)
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i) ob[t][i] = os[t][i] = 0.0f;
    float m_run[kTcHPW], l_run[kTcHPW];
#pragma unroll
    for (uint32_t i = 0; i < kTcHPW; ++i) {
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
    }
    const uint32_t base = w * 8 * NT;   // this warp's D slice (scores) and columns (weighted sum)

    while (true) {
        cp_async_wait_all();
        __syncthreads();   // the tile and queries are in; every warp is done with the previous tile
        const float* kt = k_s + buf * kTcKT * DP;
        const uint64_t left = cur.ke - t0;
        const uint32_t nt = uint32_t(left < kTcKT ? left : kTcKT);
        // new_item: cur ends its split (LOOP: its group's pass over the split); reuse: nx1 reads
        // cur's keys, in buf.
        const bool more = item1 < n_items;
        bool new_item = item1 != item;
        if constexpr (LOOP) new_item = new_item || nx1.h0 != cur.h0;
        const bool reuse = more && same_keys(item, cur, item1);

        if (more && !reuse) stage_keys(nx1, g1, sg1, k_s + (buf ^ 1) * kTcKT * DP);
        uint32_t item2 = item1;
        TcItem nx2 = nx1;
        uint64_t t2 = t1, g2 = ~uint64_t(0);
        uint32_t sg2 = 0;
        if (more) {
            advance(item2, nx2, t2);
            bool read2 = item2 < n_items;
            if constexpr (LOOP) read2 = read2 && !same_keys(item1, nx1, item2);
            if (read2) key_of(nx2, t2, g2, sg2);
        }

        {   // Scores: warp w, dims base .. base + 8·NT - 1 of the 16 heads × 32 keys.
            float sb[4][4], ss[4][4];
#pragma unroll
            for (uint32_t n = 0; n < 4; ++n)
#pragma unroll
                for (uint32_t i = 0; i < 4; ++i) sb[n][i] = ss[n][i] = 0.0f;
#pragma unroll
            for (uint32_t kk = 0; kk < NT; ++kk) {
                const uint32_t d0 = base + 8 * kk;
                uint32_t a[4], ah[4], al[4];
                ldsm_x4(a, q_s + (lr + 8 * (li & 1)) * DP + d0 + 4 * (li >> 1));
#pragma unroll
                for (uint32_t i = 0; i < 4; ++i) tf32_split(__uint_as_float(a[i]), ah[i], al[i]);
#pragma unroll
                for (uint32_t pp = 0; pp < 2; ++pp) {   // key n-tiles 2pp, 2pp+1 (keys 16pp .. 16pp+15)
                    if (16 * pp >= nt) continue;
                    uint32_t b[4], bh[4], bl[4];
                    ldsm_x4(b, kt + (16 * pp + 8 * (li >> 1) + lr) * DP + d0 + 4 * (li & 1));
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) tf32_split(__uint_as_float(b[i]), bh[i], bl[i]);
#pragma unroll
                    for (uint32_t e = 0; e < 2; ++e) {
                        const uint32_t n = 2 * pp + e;
                        float t[4];
                        mma_tf32_0(t, ah, bh[2 * e], bh[2 * e + 1]);
                        mma_tf32(ss[n], ah, bl[2 * e], bl[2 * e + 1]);
                        mma_tf32(ss[n], al, bh[2 * e], bh[2 * e + 1]);
#pragma unroll
                        for (uint32_t i = 0; i < 4; ++i) sb[n][i] = __fadd_rn(sb[n][i], t[i]);
                    }
                }
            }
            float* rw = red_s + w * kTcHeads * kTcRS;
#pragma unroll
            for (uint32_t n = 0; n < 4; ++n) {
                *reinterpret_cast<float2*>(rw + gid * kTcRS + 8 * n + 2 * tig) =
                    make_float2(__fadd_rn(sb[n][0], ss[n][0]), __fadd_rn(sb[n][1], ss[n][1]));
                *reinterpret_cast<float2*>(rw + (gid + 8) * kTcRS + 8 * n + 2 * tig) =
                    make_float2(__fadd_rn(sb[n][2], ss[n][2]), __fadd_rn(sb[n][3], ss[n][3]));
            }
        }
        __syncthreads();   // score parts complete; the queries are no longer read
        if (more && new_item) stage_q(nx1);

        // Online softmax: warp w = heads kTcHPW·w + i, lane = key.
#pragma unroll
        for (uint32_t i = 0; i < kTcHPW; ++i) {
            const uint32_t h = kTcHPW * w + i;
            float sv = -INFINITY;
            if (lane < nt) {
                float a = red_s[h * kTcRS + lane];
#pragma unroll
                for (uint32_t v = 1; v < kTcWarps; ++v) a = __fadd_rn(a, red_s[(v * kTcHeads + h) * kTcRS + lane]);
                sv = __fmul_rn(a, scale);
            }
            const float nm = fmaxf(m_run[i], warp_max(sv));
            const float corr = exp_cr(m_run[i] - nm);   // 0 on a split's first tile (m_run = -inf)
            const float e = lane < nt ? exp_cr(sv - nm) : 0.0f;
            l_run[i] = __fadd_rn(__fmul_rn(l_run[i], corr), warp_sum(e));
            m_run[i] = nm;
            uint32_t eh, el;
            tf32_split(e, eh, el);
            ph_s[h * kTcRS + lane] = eh;
            pl_s[h * kTcRS + lane] = el;
            if (lane == 0) corr_s[h] = corr;
        }
        __syncthreads();   // weights and corrections complete

        {   // Weighted sum: O = O·corr + P·V over this warp's columns; keys k0 + 2tig (k slot
            // tig) and k0 + 2tig + 1 (slot tig + 4) of each 8-key step.
            const float c0 = corr_s[gid], c1 = corr_s[gid + 8];
#pragma unroll
            for (uint32_t t = 0; t < NT; ++t) {
                ob[t][0] = __fmul_rn(ob[t][0], c0);
                ob[t][1] = __fmul_rn(ob[t][1], c0);
                ob[t][2] = __fmul_rn(ob[t][2], c1);
                ob[t][3] = __fmul_rn(ob[t][3], c1);
                os[t][0] = __fmul_rn(os[t][0], c0);
                os[t][1] = __fmul_rn(os[t][1], c0);
                os[t][2] = __fmul_rn(os[t][2], c1);
                os[t][3] = __fmul_rn(os[t][3], c1);
            }
#pragma unroll
            for (uint32_t kk = 0; kk < kTcKT / 8; ++kk) {
                if (8 * kk >= nt) continue;
                const uint32_t k0 = 8 * kk;
                const uint2 h0 = *reinterpret_cast<const uint2*>(ph_s + gid * kTcRS + k0 + 2 * tig);
                const uint2 h1 = *reinterpret_cast<const uint2*>(ph_s + (gid + 8) * kTcRS + k0 + 2 * tig);
                const uint2 l0 = *reinterpret_cast<const uint2*>(pl_s + gid * kTcRS + k0 + 2 * tig);
                const uint2 l1 = *reinterpret_cast<const uint2*>(pl_s + (gid + 8) * kTcRS + k0 + 2 * tig);
                const uint32_t ah[4] = {h0.x, h1.x, h0.y, h1.y}, al[4] = {l0.x, l1.x, l0.y, l1.y};
                const float* v0 = kt + (k0 + 2 * tig) * DP + base;   // key of k slot tig
                const float* v1 = v0 + DP;                            // key of k slot tig + 4
                auto step = [&](uint32_t t, float x0, float x1) {
                    uint32_t bh0, bl0, bh1, bl1;
                    tf32_split(x0, bh0, bl0);
                    tf32_split(x1, bh1, bl1);
                    float u[4];
                    mma_tf32_0(u, ah, bh0, bh1);
                    mma_tf32(os[t], ah, bl0, bl1);
                    mma_tf32(os[t], al, bh0, bh1);
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) ob[t][i] = __fadd_rn(ob[t][i], u[i]);
                };
                value_tiles<NT>(v0, v1, gid, step);
            }
        }

        if (new_item) {   // the split's partials: heads gid, gid + 8 of this warp's columns
            const uint64_t hb = uint64_t(cur.rl) * n_head + cur.h0;   // scratch row of the item's first head
#pragma unroll
            for (uint32_t half = 0; half < 2; ++half) {
                const uint32_t h = gid + 8 * half;
                if (h >= cur.nh) continue;
                float* dst = part_o + ((hb + h) * max_split + cur.split) * D + base;
                store_out_row<NT>(dst, tig, half, [&](uint32_t t, uint32_t x) { return __fadd_rn(ob[t][x], os[t][x]); });
            }
            if (lane == 0) {
#pragma unroll
                for (uint32_t i = 0; i < kTcHPW; ++i) {
                    const uint32_t h = kTcHPW * w + i;
                    if (h < cur.nh) part_ml[(hb + h) * max_split + cur.split] = make_float2(m_run[i], l_run[i]);
                }
            }
#pragma unroll
            for (uint32_t t = 0; t < NT; ++t)
#pragma unroll
                for (uint32_t i = 0; i < 4; ++i) ob[t][i] = os[t][i] = 0.0f;
#pragma unroll
            for (uint32_t i = 0; i < kTcHPW; ++i) {
                m_run[i] = -INFINITY;
                l_run[i] = 0.0f;
            }
        }
        if (!more) break;
        item = item1;
        cur = nx1;
        t0 = t1;
        item1 = item2;
        nx1 = nx2;
        t1 = t2;
        g1 = g2;
        sg1 = sg2;
        if (!reuse) buf ^= 1;
    }
}

// ---- prompt rounds: an item per row over all its heads and keys ---------------------------
// A prompt round (gemm_prefill_order(true)) need not give decode's bits, only the same bits for
// any chunking of the prompt. So here an item is one row: all its heads (up to 64) over all
// its keys, a running softmax per head, and the block finishes the row itself (sink,
// normalisation, inverse RoPE, the Q8_0 codes) as attn_merge_kernel does for the splits. Each
// key tile is staged once for every head (the split kernels stage it per 8 or 16 heads), and
// no partials are written and read back. The rows are items blockIdx.x, + gridDim.x, ...;
// each is computed by the same operations whatever the batch, so a row gives the same bits
// alone or beside others.
// Per tile of kRowKT = 16 keys:
//   S = Q·Kᵀ: warp w takes the m-tiles (16 heads) 2(w&1) and 2(w&1)+1, both key n-tiles, over
//     the quarter w>>1 of D; the softmax adds the four quarters in order;
//   the online softmax: a thread per (head, four keys), four lanes a head, each holding the
//     head's running max and sum;
//   O = O·corr + P·V: warp w takes D/8 columns of every head (MT·NT accumulator tiles: 128
//     floats a thread at 64 heads × 512).
// Products are 3xTF32 as in the split kernel, FP32-accurate; each k-step's three products go
// into a fresh accumulator (the small terms first), added to the running sum by an FP32 add.
// Shared memory at 64 heads × 512: 217.5 KB (queries 129, two key tiles 64.5, scores 24), one
// block an SM.
// WARPS = 8 holds 128 accumulators a thread (238 registers): 2 warps a scheduler, issue 0.39 a
// cycle, stalled mostly on fixed-latency dependencies (run 78). WARPS = 16 (widths of 128 or
// more): a score warp takes one m-tile (the same four D-quarter parts, so the same scores), the
// weighted sum D/16 columns (64 accumulators, ≤ 128 registers), the softmax stays on the first
// 256 threads: twice the warps to hide the latencies.
// qn (attn_rows_qnorm, kernels.h): q is q_b's raw output; the kernel normalises and rotates
// each row's staged heads itself once they land (attention.cuh's rows_head_norm_rope:
// head_norm_rope's bits), which saves head_norm_rope's launch and its read and write of q.
constexpr uint32_t kRowKT = 16;
constexpr uint32_t kRowMaxMT = 4;   // m-tiles of 16 heads: up to 64 heads
constexpr uint32_t kRowRS = 24;     // score / weight row stride, ≡ 8 (mod 32): conflict-free float2 / uint2 rows
static_assert(kTcThreads == 16 * kRowKT && kTcThreads == 4 * 16 * kRowMaxMT, "staging and softmax threads");

constexpr size_t rows_smem_floats(uint32_t D, uint32_t MT) {
    return size_t(16 * MT + 2 * kRowKT) * (D + kAttnPad) + size_t(4) * 16 * MT * kRowRS;
}

template <uint32_t NT, uint32_t WARPS>
__global__ void __launch_bounds__(32 * WARPS, 1)
    attn_rows_tc_kernel(const float* __restrict__ q, const float* __restrict__ sinks, uint32_t n_head, uint32_t n_swa,
                        uint32_t ratio, uint32_t top_k, const uint32_t* __restrict__ sel,
                        const DevRow* __restrict__ rows, const DevLayerKV* __restrict__ lkv, uint32_t n_layer,
                        uint32_t il, uint32_t R, uint32_t n_rot, const double* __restrict__ inv_freq,
                        float* __restrict__ o, int8_t* __restrict__ oq, float* __restrict__ od, bool qn,
                        double q_eps) {
    pdl_begin();
    constexpr uint32_t D = 64 * NT, DP = D + kAttnPad, D4 = D / 4, T = 32 * WARPS;
    // 16 warps: each score m-tile alone and half the weighted sum's columns (NTW n-tiles a warp)
    constexpr uint32_t MPW = WARPS == 16 ? 1 : 2, MG = 4 / MPW, NTW = WARPS == 16 ? NT / 2 : NT, KTH = T / kRowKT;
    constexpr int SU = WARPS == 16 ? 2 : 4;   // score k-steps unrolled (16 warps: 128 registers)
    static_assert((WARPS == 8 || WARPS == 16) && NTW >= 1, "rows kernel: 8 or 16 warps, 16 for D >= 128");
    const uint32_t MT = (n_head + 15) / 16, HP = 16 * MT;   // padded heads (the padding: zero queries)
    extern __shared__ float4 sm4[];
    float* q_s = reinterpret_cast<float*>(sm4);   // [HP][DP]: the row's queries, then its output
    float* k_s = q_s + HP * DP;                    // [2][kRowKT][DP]
    float* s_s = k_s + 2 * kRowKT * DP;            // [4][HP][kRowRS]: score parts; weights hi, lo in parts 0, 1
    __shared__ float corr_s[16 * kRowMaxMT], fw_s[16 * kRowMaxMT], inv_s[16 * kRowMaxMT];
    // The row's RoPE angles: qn, cos and sin of the forward rotation, made when its queries are
    // staged (rope_angle's inverse sin is the forward one negated: -rs_s serves the output);
    // else the inverse's, made in its last tile.
    __shared__ float rc_s[kAttnMaxD / 2], rs_s[kAttnMaxD / 2];
    if (blockIdx.x >= R) return;

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t li = lane >> 3, lr = lane & 7;                    // ldmatrix: matrix, row
    const uint32_t kj = threadIdx.x / KTH, ksub = threadIdx.x % KTH;   // key staging: row, first float4
    const uint32_t hs = threadIdx.x >> 2, kc = threadIdx.x & 3;      // softmax: head, key quad
    const float scale = float(1.0 / sqrt(double(D)));
    // The key ranges of the last row asked for (the tiles around a step are mostly one row's;
    // attn_keys divides 64-bit by the ratio).
    uint32_t kr = ~0u;
    AttnKeys kks{};
    auto keys_of = [&](uint32_t r) {
        if (r != kr) {
            kr = r;
            kks = attn_keys(rows[r].pos, n_swa, ratio, top_k);
        }
        return kks;
    };

    // The block's tiles: (row r, first key t0), rows blockIdx.x, + gridDim.x, ... (r >= R: none).
    auto advance = [&](uint32_t& r, uint64_t& t0) {
        t0 += kRowKT;
        if (t0 >= keys_of(r).NK) {
            r += gridDim.x;
            t0 = 0;
        }
    };
    // This thread's key of tile (r, t0), read a tile ahead of its copy: its selection.
    auto sel_of = [&](uint32_t r, uint64_t t0) -> uint32_t {
        if (r >= R) return 0u;
        const AttnKeys ks = keys_of(r);
        const uint64_t g = t0 + kj;
        return g < ks.NK && g >= ks.n_raw && ks.use_sel ? sel[uint64_t(r) * top_k + (g - ks.n_raw)] : 0u;
    };
    // This thread's part of the tile's copy into dst (16 threads a key row); rows past the
    // row's keys zero (their weights are 0, and 0 · a stale NaN would not be).
    auto stage_keys = [&](uint32_t r, uint64_t t0, uint32_t sg, float* dst) {
        float* row = dst + kj * DP;
        const AttnKeys ks = keys_of(r);
        const uint64_t g = t0 + kj;
        if (g < ks.NK) {
            const float* kp = attn_key_row_sel(ks, lkv[uint64_t(rows[r].sess) * n_layer + il], g, sg, D);
            for (uint32_t u = ksub; u < D4; u += KTH) cp_async16(row + 4 * u, kp + 4 * u);
        } else {
            for (uint32_t u = ksub; u < D4; u += KTH) *reinterpret_cast<float4*>(row + 4 * u) = make_float4(0, 0, 0, 0);
        }
    };
    uint32_t r = blockIdx.x;
    uint64_t t0 = 0;
    rows_stage_q<D, T>(q_s, q, r, n_head, HP);
    stage_keys(r, t0, sel_of(r, t0), k_s);
    if (qn && threadIdx.x < n_rot / 2)
        rope_angle(rows[r].pos, inv_freq, threadIdx.x, false, rc_s[threadIdx.x], rs_s[threadIdx.x]);
    uint32_t r1 = r;   // the next tile (copied during this one) and its key's selection
    uint64_t t1 = t0;
    advance(r1, t1);
    uint32_t sg1 = sel_of(r1, t1), buf = 0;

    float ob[kRowMaxMT][NTW][4];   // running output: heads 16m + gid (+ 8) × this warp's columns
    rows_zero(ob);
    float m_run = -INFINITY, l_run = 0.0f;   // head hs (four lanes hold it)
    const uint32_t base = w * 8 * NTW;        // this warp's columns of the weighted sum

    while (true) {
        cp_async_wait_all();
        __syncthreads();   // the tile (and the row's queries) in; every warp is done with the last tile
        const uint64_t NK = keys_of(r).NK;
        const uint32_t nt = NK - t0 < kRowKT ? uint32_t(NK - t0) : kRowKT;
        const bool last = t0 + kRowKT >= NK;   // the row's last tile
        const bool more = r1 < R;
        if (more) stage_keys(r1, t1, sg1, k_s + (buf ^ 1) * kRowKT * DP);
        uint32_t r2 = r1, sg2 = 0;
        uint64_t t2 = t1;
        if (more) {
            advance(r2, t2);
            sg2 = sel_of(r2, t2);
        }
        const float* kt = k_s + buf * kRowKT * DP;
        if (qn && t0 == 0) {   // the row's raw queries, in: warp w takes heads w, w + WARPS, ... (padding: 0)
            for (uint32_t h = w; h < n_head; h += WARPS) rows_head_norm_rope<D>(q_s + h * DP, n_rot, q_eps, rc_s, rs_s);
            __syncthreads();   // normalised and rotated
        }

        {   // Scores: warp w, heads of m-tiles MPW mp .. MPW mp + MPW - 1 × 16 keys over dims dq·D/4 ...
            const uint32_t mp = w % MG, dq = w / MG;
            if (MPW * mp < MT) {
                float sb[MPW][2][4];
#pragma unroll
                for (uint32_t mi = 0; mi < MPW; ++mi)
#pragma unroll
                    for (uint32_t n = 0; n < 2; ++n)
#pragma unroll
                        for (uint32_t i = 0; i < 4; ++i) sb[mi][n][i] = 0.0f;
#pragma unroll(SU)
                for (uint32_t kk = 0; kk < 2 * NT; ++kk) {
                    const uint32_t d0 = dq * (D / 4) + 8 * kk;
                    uint32_t b[4], bh[4], bl[4];
                    ldsm_x4(b, kt + (8 * (li >> 1) + lr) * DP + d0 + 4 * (li & 1));
                    // Keys exact in TF32 (the F16-rounded window rows, the FP8-simulated dims of
                    // compressed rows) are used as they are, and their hi·lo products skipped:
                    // they would add exact zeros, so the sums are the same.
                    const bool klo = tf32_inexact(b[0] | b[1] | b[2] | b[3]);
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) {
                        if (klo) tf32_split(__uint_as_float(b[i]), bh[i], bl[i]);
                        else bh[i] = b[i];
                    }
#pragma unroll
                    for (uint32_t mi = 0; mi < MPW; ++mi) {
                        const uint32_t m = MPW * mp + mi;
                        if (m >= MT) continue;
                        uint32_t a[4], ah[4], al[4];
                        ldsm_x4(a, q_s + (16 * m + lr + 8 * (li & 1)) * DP + d0 + 4 * (li >> 1));
#pragma unroll
                        for (uint32_t i = 0; i < 4; ++i) tf32_split(__uint_as_float(a[i]), ah[i], al[i]);
#pragma unroll
                        for (uint32_t n = 0; n < 2; ++n) {
                            float u[4];
                            mma_tf32_0(u, al, bh[2 * n], bh[2 * n + 1]);
                            if (klo) mma_tf32(u, ah, bl[2 * n], bl[2 * n + 1]);
                            mma_tf32(u, ah, bh[2 * n], bh[2 * n + 1]);
#pragma unroll
                            for (uint32_t i = 0; i < 4; ++i) sb[mi][n][i] = __fadd_rn(sb[mi][n][i], u[i]);
                        }
                    }
                }
                float* part = s_s + dq * HP * kRowRS;
#pragma unroll
                for (uint32_t mi = 0; mi < MPW; ++mi) {
                    const uint32_t m = MPW * mp + mi;
                    if (m >= MT) continue;
#pragma unroll
                    for (uint32_t n = 0; n < 2; ++n) {
                        *reinterpret_cast<float2*>(part + (16 * m + gid) * kRowRS + 8 * n + 2 * tig) =
                            make_float2(sb[mi][n][0], sb[mi][n][1]);
                        *reinterpret_cast<float2*>(part + (16 * m + gid + 8) * kRowRS + 8 * n + 2 * tig) =
                            make_float2(sb[mi][n][2], sb[mi][n][3]);
                    }
                }
            }
        }
        // The row's inverse RoPE angles, for its output (read after the barriers below).
        if (last && !qn && threadIdx.x < n_rot / 2)
            rope_angle(rows[r].pos, inv_freq, threadIdx.x, true, rc_s[threadIdx.x], rs_s[threadIdx.x]);
        __syncthreads();   // score parts complete

        if (hs < HP) {   // Online softmax of head hs, keys 4kc .. 4kc + 3 (whole warps: HP % 16 == 0)
            float sv[4];
            {
                const float4 a0 = *reinterpret_cast<const float4*>(s_s + hs * kRowRS + 4 * kc);
                float4 a = a0;
#pragma unroll
                for (uint32_t v = 1; v < 4; ++v) {
                    const float4 b = *reinterpret_cast<const float4*>(s_s + (v * HP + hs) * kRowRS + 4 * kc);
                    a = make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
                }
                sv[0] = a.x;
                sv[1] = a.y;
                sv[2] = a.z;
                sv[3] = a.w;
            }
            float mx = -INFINITY;
#pragma unroll
            for (uint32_t j = 0; j < 4; ++j) {
                sv[j] = 4 * kc + j < nt ? __fmul_rn(sv[j], scale) : -INFINITY;
                mx = fmaxf(mx, sv[j]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float nm = fmaxf(m_run, mx);
            const float corr = exp_cr(m_run - nm);   // 0 on a row's first tile (m_run = -inf)
            float e[4];
#pragma unroll
            for (uint32_t j = 0; j < 4; ++j) e[j] = 4 * kc + j < nt ? exp_cr(sv[j] - nm) : 0.0f;
            float sum = __fadd_rn(__fadd_rn(e[0], e[1]), __fadd_rn(e[2], e[3]));
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));   // (the same bits in all four lanes)
            sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
            l_run = __fadd_rn(__fmul_rn(l_run, corr), sum);
            m_run = nm;
            uint4 eh, el;
            tf32_split(e[0], eh.x, el.x);
            tf32_split(e[1], eh.y, el.y);
            tf32_split(e[2], eh.z, el.z);
            tf32_split(e[3], eh.w, el.w);
            *reinterpret_cast<uint4*>(s_s + hs * kRowRS + 4 * kc) = eh;            // (this thread read them)
            *reinterpret_cast<uint4*>(s_s + (HP + hs) * kRowRS + 4 * kc) = el;
            if (kc == 0) corr_s[hs] = corr;
            if (last) {   // the sink and the normalisation, as attn_merge_kernel for one split
                if (kc == 0 && hs < n_head) {
                    const float sink = sinks[hs];
                    const float M = fmaxf(sink, m_run);
                    const float fw = exp_cr(m_run - M);
                    fw_s[hs] = fw;
                    inv_s[hs] = 1.0f / __fadd_rn(exp_cr(sink - M), __fmul_rn(l_run, fw));
                }
                m_run = -INFINITY;
                l_run = 0.0f;
            }
        }
        __syncthreads();   // weights and corrections complete

        {   // Weighted sum: keys k0 + 2tig (k slot tig) and k0 + 2tig + 1 (slot tig + 4) of each
            // 8-key step.
            const uint32_t* ph = reinterpret_cast<const uint32_t*>(s_s);
            const uint32_t* pl = ph + HP * kRowRS;
            rows_correct(ob, corr_s, MT, gid);
#pragma unroll
            for (uint32_t kk = 0; kk < kRowKT / 8; ++kk) {
                if (8 * kk >= nt) continue;
                const uint32_t k0 = 8 * kk;
                // B: this lane's two keys of the warp's NTW n-tiles, split once for every m-tile
                // (values exact in TF32 skip their lo products, as klo above)
                const float* v0 = kt + (k0 + 2 * tig) * DP + base;   // key of k slot tig
                const float* v1 = v0 + DP;                            // key of k slot tig + 4
                uint32_t bh[NTW][2], bl[NTW][2];
                bool vlo[NTW];
                value_tiles<NTW>(v0, v1, gid, [&](uint32_t t, float x0, float x1) {
                    bh[t][0] = __float_as_uint(x0), bh[t][1] = __float_as_uint(x1), bl[t][0] = bl[t][1] = 0;
                    vlo[t] = tf32_inexact(bh[t][0] | bh[t][1]);
                    if (vlo[t]) {
                        tf32_split(x0, bh[t][0], bl[t][0]);
                        tf32_split(x1, bh[t][1], bl[t][1]);
                    }
                });
#pragma unroll
                for (uint32_t m = 0; m < kRowMaxMT; ++m) {
                    if (m >= MT) continue;
                    const uint32_t o0 = (16 * m + gid) * kRowRS + k0 + 2 * tig, o1 = o0 + 8 * kRowRS;
                    const uint2 h0 = *reinterpret_cast<const uint2*>(ph + o0), h1 = *reinterpret_cast<const uint2*>(ph + o1);
                    const uint2 l0 = *reinterpret_cast<const uint2*>(pl + o0), l1 = *reinterpret_cast<const uint2*>(pl + o1);
                    const uint32_t ah[4] = {h0.x, h1.x, h0.y, h1.y}, al[4] = {l0.x, l1.x, l0.y, l1.y};
#pragma unroll
                    for (uint32_t t = 0; t < NTW; ++t) {
                        float u[4];
                        mma_tf32_0(u, al, bh[t][0], bh[t][1]);
                        if (vlo[t]) mma_tf32(u, ah, bl[t][0], bl[t][1]);
                        mma_tf32(u, ah, bh[t][0], bh[t][1]);
#pragma unroll
                        for (uint32_t i = 0; i < 4; ++i) ob[m][t][i] = __fadd_rn(ob[m][t][i], u[i]);
                    }
                }
            }
        }

        if (last) {   // the row's output: normalised into q_s (no longer read), rotated back, written
#pragma unroll
            for (uint32_t m = 0; m < kRowMaxMT; ++m) {
                if (m >= MT) continue;
#pragma unroll
                for (uint32_t half = 0; half < 2; ++half) {
                    const uint32_t h = 16 * m + gid + 8 * half;
                    const float fw = h < n_head ? fw_s[h] : 0.0f, inv = h < n_head ? inv_s[h] : 0.0f;
                    float* dst = q_s + h * DP + base;
                    store_out_row<NTW>(dst, tig, half, [&](uint32_t t, uint32_t x) {
                        return __fmul_rn(__fmul_rn(ob[m][t][x], fw), inv);
                    });
                }
            }
            rows_zero(ob);
            rows_finish<D, T>(q_s, r, n_head, n_rot, rc_s, rs_s, qn, o, oq, od, q, r1, R, HP, rows, inv_freq);
        }
        if (!more) break;
        r = r1;
        t0 = t1;
        r1 = r2;
        t1 = t2;
        sg1 = sg2;
        buf ^= 1;
    }
}

template <uint32_t NT, uint32_t WARPS>
void launch_rows(const float* q, const float* sinks, uint32_t n_head, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                 const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il,
                 uint32_t R, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq, float* od, bool qn,
                 float q_eps, cudaStream_t s) {
    // Once per width (the first call is an eager round, so a graph capture finds it done): the
    // shared-memory limit for 64 heads, and the blocks the GPU holds at once (the persistent grid).
    constexpr auto kernel = attn_rows_tc_kernel<NT, WARPS>;
    static const uint32_t resident = [] {
        const size_t most = rows_smem_floats(64 * NT, kRowMaxMT) * sizeof(float);
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)),
              "attention (rows) shared memory");
        return resident_blocks(reinterpret_cast<const void*>(kernel), 32 * WARPS, most);
    }();
    const size_t smem = rows_smem_floats(64 * NT, (n_head + 15) / 16) * sizeof(float);
    kernel<<<std::min(R, std::max(1u, resident)), 32 * WARPS, smem, s>>>(
        q, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq, od, qn,
        double(q_eps));
    check_launch("attention (rows)");
}

int g_tc_override = -1;
// The rows kernel's warps: DSV4_ATTN_ROWS=2 (default) 16 for heads of width 128 or more, =1
// 8; attn_rows_warps_override (tests) wins.
int g_rows_warps_override = -1;
uint32_t rows_warps(uint32_t D) {
    static const int env = env_int("DSV4_ATTN_ROWS", 2);
    const int v = g_rows_warps_override > 0 ? g_rows_warps_override : env == 1 ? 8 : 16;
    return v == 16 && D >= 128 ? 16 : 8;
}
// The rows kernel's query fold (attn_rows_qnorm_on): DSV4_ATTN_QNORM_ROWS, default 1;
// attn_rows_qnorm_override (tests) wins.
int g_rows_qnorm_override = -1;

template <uint32_t NT, bool LOOP>
void launch_tc(const float* q, uint32_t n_head, uint32_t n_swa, uint32_t ratio, uint32_t top_k, const uint32_t* sel,
               const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t r0, uint32_t n_rows,
               uint32_t max_split, float* part_o, float2* part_ml, bool spread, cudaStream_t s) {
    const size_t smem = tc_smem_floats(64 * NT) * sizeof(float);
    // Once per width and mode (the first call is an eager round, so a graph capture finds it
    // done): the shared-memory limit, and the blocks the GPU holds at once (the persistent grid).
    static const uint32_t resident = [smem] {
        check(cudaFuncSetAttribute(attn_split_tc_kernel<NT, LOOP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(smem)),
              "attention (tensor cores) shared memory");
        return resident_blocks(reinterpret_cast<const void*>(attn_split_tc_kernel<NT, LOOP>), kTcThreads, smem);
    }();
    // Items at most: a pair per group (no loop, or a spread loop's gpi = 1), else one per pair.
    const uint32_t n_groups = (n_head + kTcHeads - 1) / kTcHeads;
    const uint32_t blocks = std::min(n_rows * (LOOP && !spread ? 1 : n_groups) * max_split, resident);
    attn_split_tc_kernel<NT, LOOP><<<blocks, kTcThreads, smem, s>>>(q, n_head, n_swa, ratio, top_k, sel, rows, lkv,
                                                                    n_layer, il, r0, n_rows, max_split, part_o,
                                                                    part_ml, spread);
    check_launch("attention (tensor cores)");
}

}  // namespace

void attn_tc_override(int on) { g_tc_override = on; }
void attn_rows_warps_override(int warps) { g_rows_warps_override = warps; }
void attn_rows_qnorm_override(int on) { g_rows_qnorm_override = on; }

bool attn_rows_qnorm_on() {
    static const bool on = env_switch("DSV4_ATTN_QNORM_ROWS", true);
    return g_rows_qnorm_override >= 0 ? g_rows_qnorm_override != 0 : on;
}

bool attn_tc_on() {
    // Off by default: on the H200 (4 layers, run 34) the tensor-core splits gave 0.148 ms a
    // decode layer against 0.143 with the FP32 kernel, and prefill 11.61 against 11.51 µs a
    // token and layer: each of the four 16-head items of a split stages the same keys, so the
    // kernel is bound by those copies, not by the MMAs. Kept (tested, FP32-accurate) for the
    // next step: one item for all 64 heads, or clusters sharing the key tile.
    static const bool on = env_switch("DSV4_ATTN_TC", false);
    return g_tc_override >= 0 ? g_tc_override != 0 : on;
}

bool attn_tc_ok(uint32_t n_head, uint32_t D) { return n_head > 0 && (D == 64 || D == 128 || D == 256 || D == 512); }

void attn_split_tc(const float* q, uint32_t n_head, uint32_t D, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                   const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il,
                   uint32_t r0, uint32_t n_rows, uint32_t max_split, float* part_o, float2* part_ml, uint32_t loop,
                   cudaStream_t s) {
    if (!attn_tc_ok(n_head, D)) throw_mismatch("attention (tensor cores): head widths 64, 128, 256 or 512", 0, D, D);
    auto* launch = loop ? (D == 64    ? launch_tc<1, true>
                           : D == 128 ? launch_tc<2, true>
                           : D == 256 ? launch_tc<4, true>
                                      : launch_tc<8, true>)
                        : (D == 64    ? launch_tc<1, false>
                           : D == 128 ? launch_tc<2, false>
                           : D == 256 ? launch_tc<4, false>
                                      : launch_tc<8, false>);
    launch(q, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, r0, n_rows, max_split, part_o, part_ml,
           loop == 2, s);
}

bool attn_rows_ok(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    return attn_tc_ok(n_head, D) && n_head <= 16 * kRowMaxMT && n_rot <= D && n_rot % 2 == 0;
}

void attn_rows_tc(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
                  uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
                  uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq,
                  float* od, uint16_t* oh, unsigned* oh_max, const uint16_t* qh, const unsigned* qh_top, bool qn,
                  float q_eps, cudaStream_t s) {
    if (!attn_rows_ok(n_head, D, n_rot))
        throw_mismatch("attention (rows): up to 64 heads of width 64, 128, 256 or 512", 0, D, D);
    if (attn_rows_f16_on(n_head, D, n_rot)) {   // (attention_rows_f16.cu: FP16 products, widths 256 and 512)
        attn_rows_f16(q, sinks, R, n_head, D, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, n_rot, inv_freq, o, oq,
                      od, oh, oh_max, qh, qh_top, qn, q_eps, s);
        return;
    }
    auto* launch = rows_warps(D) == 16
                       ? (D == 128 ? launch_rows<2, 16> : D == 256 ? launch_rows<4, 16> : launch_rows<8, 16>)
                       : (D == 64    ? launch_rows<1, 8>
                          : D == 128 ? launch_rows<2, 8>
                          : D == 256 ? launch_rows<4, 8>
                                     : launch_rows<8, 8>);
    launch(q, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq, od, qn, q_eps,
           s);
}

}  // namespace dsv4::cuda
