// Q8_0 products of many activation rows (prefill) on the tensor cores, with the decode
// kernels' exact arithmetic. One Q8_0 block is 32 values, exactly the k of the int8 MMA
// m16n8k32, so one MMA per block gives the block's integer sums of 16 weight rows × 8 rows,
// the same integers the decode kernel's dp4a chains make. The float steps are the decode
// kernel's too: per block acc = fma(dw·da, sum, acc), where in decode lane l of a warp sums
// the blocks l, l + 32, l + 64, ... and the 32 lane sums are then added by the warp's
// butterfly (xor 16, 8, 4, 2, 1). Here the 32 "lane" sums are made one after another, in the
// order in which that butterfly tree adds them (bit-reversed lane numbers), and added at once
// through a stack of five partial sums: the same additions of the same values. So a row's
// result is bit for bit what decode gives, whichever path a batch takes.
#include <algorithm>
#include <utility>
#include <cstdint>
#include <type_traits>
#include <cstdlib>
#include <stdexcept>

#include <cooperative_groups.h>

#include "cuda/common.cuh"
#include "cuda/experts_f16.cuh"
#include "cuda/iq2.cuh"

namespace dsv4::cuda {
using namespace xf;
namespace {

constexpr int kBM = 64;    // weight rows per block (2 warps × 2 MMA tiles of 16)
constexpr int kBN = 32;    // activation rows per block (2 warps × 2 MMA tiles of 8)
constexpr int kMinRows = 16;

struct Gemm {
    const int8_t* wq;      // [rows][K]
    const uint16_t* wd;    // [rows][K/32] f16
    uint64_t K, row0, N;
    const int8_t* aq;      // [R][AL]
    const float* ad;       // [R][AL/32]
    uint64_t AL, rpg;      // rpg: grouped product (rows per group; 0: plain)
    uint32_t R;
    float* y;
    uint64_t y_stride;
};

__device__ __forceinline__ void mma_s8(const uint32_t (&a)[4], const uint32_t (&b)[2], int (&d)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0), "r"(0), "r"(0));
}

__device__ __forceinline__ uint32_t ld32(const int8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// float(v) without I2F (a quarter-rate conversion) for integer sums |v| < 2^22 formed by adds
// from kQ8Magic (1.5 · 2^23 as a float's bits) instead of 0: the bits 0x4B400000 + v are the
// float 12,582,912 + v exactly (floats in [2^23, 2^24) are the integers), so one subtraction
// gives the value float(v) gives: the same bits.
constexpr int kQ8Magic = 0x4B400000;   // 12,582,912.0f
__device__ __forceinline__ float magic_float(int biased) { return __int_as_float(biased) - 12582912.0f; }


// The decode kernels' butterfly (xor 16, 8, ...) adds its leaves as a complete binary tree;
// visiting the leaves in bit-reversed order, leaf j's sum `cur` joins the finished subtrees
// as a binary counter does: merged with as many as j + 1 has trailing zero bits, then kept
// as the subtree of that height (st[h]: 2^h leaves). After the last leaf, cur is the root.
// (j is a constant after unrolling, so every st[] index is too: all in registers.)
template <int L, typename A>
__device__ __forceinline__ void tree_push(int j, A (&st)[L], A& cur) {
    int level = 0;
#pragma unroll
    for (int c = j + 1; (c & 1) == 0; c >>= 1, ++level) each2(cur, st[level], [](float& a, float& b) { a = b + a; });
    if (level < L) each2(st[level], cur, [](float& a, float& b) { a = b; });
}

// A 2-bit expert kernel's sums of a (row, pair) over its super-blocks: step(idx, cur) adds the
// idx-th visited super-block's float step into cur. FLAT (a prompt round): k order, super-blocks
// 0, 1, ... into one sum from 0 (the CPU's vec_dot). Else decode's tree: leaves in bit-reversed
// order (leaf j: super-blocks j, j + 8, ...) through a stack of three, then the butterfly's last
// two steps adding the zero lanes' sums.
template <bool FLAT, typename A, typename Step>
__device__ __forceinline__ void sum_superblocks(int nsb, A& cur, Step&& step) {
    if constexpr (FLAT) {
        each(cur, [](float& x) { x = 0.0f; });
        for (int idx = 0; idx < nsb; ++idx) step(idx, cur);
    } else {
        A st[3];
        int idx = 0;
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int leaf = ((jj & 1) << 2) | (jj & 2) | ((jj & 4) >> 2);
            each(cur, [](float& x) { x = 0.0f; });
            for (int sb = leaf; sb < nsb; sb += 8, ++idx) step(idx, cur);
            tree_push(jj, st, cur);
        }
        each(cur, [](float& x) { x = (x + 0.0f) + 0.0f; });
    }
}

// The super-block visited idx-th: leaves in bit-reversed order, each leaf's blocks leaf,
// leaf + 8, ... (sum_superblocks' order of decode's tree).
__device__ __forceinline__ int sb_at(int idx, int nsb) {
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
        const int leaf = ((jj & 1) << 2) | (jj & 2) | ((jj & 4) >> 2);
        const int c = leaf < nsb ? (nsb - leaf + 7) / 8 : 0;
        if (idx < c) return leaf + 8 * idx;
        idx -= c;
    }
    return -1;
}

__host__ __device__ constexpr int bitrev5(int j) {
    return ((j & 1) << 4) | ((j & 2) << 2) | (j & 4) | ((j & 8) >> 2) | ((j & 16) >> 4);
}

// The "lane" sums of one leaf: blocks l, l + 32, ... for this thread's 2 × 2 tiles
// (16 values: tile (mt, nt), element e of the MMA's accumulator layout).
__device__ __forceinline__ void leaf_sums(const Gemm& p, uint64_t first, uint64_t stride,
                                          const int8_t* const (&wr)[2][2],
                                          const uint16_t* const (&wdr)[2][2], const int8_t* const (&ar)[2],
                                          const float* const (&adr)[2][2], uint32_t tig, float (&acc)[2][2][4]) {
    each(acc, [](float& x) { x = 0.0f; });
    const uint64_t nb = p.K / 32;
    for (uint64_t b = first; b < nb; b += stride) {
        const uint64_t k = b * 32 + tig * 4;
        uint32_t a[2][4], bf[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            a[mt][0] = ld32(wr[mt][0] + k);
            a[mt][1] = ld32(wr[mt][1] + k);
            a[mt][2] = ld32(wr[mt][0] + k + 16);
            a[mt][3] = ld32(wr[mt][1] + k + 16);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            bf[nt][0] = ld32(ar[nt] + k);
            bf[nt][1] = ld32(ar[nt] + k + 16);
        }
        float dw[2][2], da[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) dw[mt][h] = f16_to_f32(wdr[mt][h][b]);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) da[nt][c] = adr[nt][c][b];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                int d[4];
                mma_s8(a[mt], bf[nt], d);
                // d[e]: weight row gid + 8 * (e >> 1), activation row 2 * tig + (e & 1)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    acc[mt][nt][e] = fmaf(dw[mt][e >> 1] * da[nt][e & 1], float(d[e]), acc[mt][nt][e]);
            }
    }
}

// A warp's MMA tiles of results into y, rows past N or R skipped: one 16-row tile of weight
// rows × 2 tiles of 8 activation rows (element e of tile nt: weight row m0 + gid + 8 (e >> 1),
// activation row r0 + 8 nt + 2 tig + (e & 1)), or two such tiles 16 weight rows apart.
__device__ __forceinline__ void store_tiles(const Gemm& p, uint64_t m0, uint32_t r0, uint32_t gid, uint32_t tig,
                                            const float (&v)[2][4]) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint64_t n = m0 + gid + 8 * (e >> 1);
            const uint32_t r = r0 + nt * 8 + 2 * tig + (e & 1);
            if (n < p.N && r < p.R) p.y[uint64_t(r) * p.y_stride + n] = v[nt][e];
        }
}
__device__ __forceinline__ void store_tiles(const Gemm& p, uint64_t m0, uint32_t r0, uint32_t gid, uint32_t tig,
                                            const float (&v)[2][2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) store_tiles(p, m0 + mt * 16, r0, gid, tig, v[mt]);
}

// WT: the threads decode gives a row (32: a warp per row; 256 or 1024: matvec_kernel's wide
// blocks, whose warps' butterfly sums are then added one after another from 0).
template <int WT>
__global__ void __launch_bounds__(128) gemm_q8_0_kernel(Gemm p) {
    pdl_begin();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t gid = lane >> 2, tig = lane & 3;
    const uint64_t m0 = uint64_t(blockIdx.x) * kBM + (warp & 1) * 32;   // weight rows of this warp
    const uint32_t n0 = blockIdx.y * kBN + (warp >> 1) * 16;            // activation rows
    const uint64_t nb = p.K / 32;
    // a block's rows lie in one group (kBM divides rpg: checked by the launcher)
    const uint64_t goff = p.rpg ? ((p.row0 + uint64_t(blockIdx.x) * kBM) / p.rpg) * p.K : 0;
    const int8_t* wr[2][2];
    const uint16_t* wdr[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint64_t n = min(m0 + mt * 16 + gid + 8 * h, p.N - 1);   // rows past N: clamped, not stored
            wr[mt][h] = p.wq + (p.row0 + n) * p.K;
            wdr[mt][h] = p.wd + (p.row0 + n) * nb;
        }
    const int8_t* ar[2];
    const float* adr[2][2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        ar[nt] = p.aq + uint64_t(min(n0 + nt * 8 + gid, p.R - 1)) * p.AL + goff;
#pragma unroll
        for (int c = 0; c < 2; ++c)
            adr[nt][c] = p.ad + uint64_t(min(n0 + nt * 8 + 2 * tig + c, p.R - 1)) * (p.AL / 32) + goff / 32;
    }
    // Each warp's butterfly tree over its 32 lanes (tree_push), in the block's warp order.
    float st[5][2][2][4];
    float cur[2][2][4], total[2][2][4];
    each(total, [](float& x) { x = 0.0f; });
    for (int w = 0; w < WT / 32; ++w) {
        if (uint64_t(32 * w) < nb) {
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                leaf_sums(p, uint64_t(32 * w + bitrev5(j)), WT, wr, wdr, ar, adr, tig, cur);
                tree_push(j, st, cur);
            }
        } else {
            each(cur, [](float& x) { x = 0.0f; });   // a warp with no blocks
        }
        // one warp per row: its sum is the result; wide blocks: 0 + warp 0 + warp 1 + ...
        each2(total, cur, [](float& t, float& c) { t = WT == 32 ? c : t + c; });
    }
    store_tiles(p, m0, n0, gid, tig, total);
}

// ---- the routed experts' 2-bit products (IQ2_XXS gate+up, Q2_K down), by pair group -------
// The decode kernel (kq_kernel) sums a super-block's integer products exactly, then lane
// 4j (j = sb mod 8) adds the super-block's float step to its sum, and the warp's butterfly
// adds the 8 lane sums (and the 24 zero lanes: "+ 0" twice at the end). Here one MMA per
// 32-value group (IQ2_XXS, codes expanded from the grid) or per 16-value sub-block (Q2_K:
// each has its own scale) gives the same integers for 16 weight rows × the 8 pairs of a
// group; the super-blocks are visited leaf by leaf in the butterfly's order (bit-reversed
// j) and the leaf sums merged through a stack of three.
//
// Prompt rounds (gemm_prefill_order(true), DSV4_KQ_FLAT; the FLAT kernels below) need not give
// decode's bits, so they take the CPU's order (quant dot.cpp: dot_iq2_xxs, dot_q2_k): the same
// exact integers a super-block, the same float step (IQ2_XXS: acc = fmaf(dw·dx, isum, acc),
// times 0.125 at the end; Q2_K: acc += fmaf(dall, isum, -(dmin·mins))) with super-blocks 0,
// 1, 2, ... from acc = 0: bit for bit vec_dot's float for every (pair, row), whatever the group,
// batch or chunk. Without the stack (and the zero lanes' "+ 0 + 0") a block takes groups of
// kKqFlatPairs = 64 pairs, so the IQ2_XXS expansion and the weight staging serve twice the pairs.

__device__ __forceinline__ void mma_s8_k16(uint32_t a0, uint32_t a1, uint32_t b0, int (&d)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0), "r"(0), "r"(0), "r"(0));
}

// Word `half` of grid row l of an IQ2_XXS group, with its signs applied (matvec.cu's
// iq2_expand, for one word).
__device__ __forceinline__ uint32_t iq2_word(const uint64_t* grid, const uint64_t* sign, uint32_t a0, uint32_t a1,
                                             uint32_t l, uint32_t half) {
    const uint64_t gv = __ldg(&grid[(a0 >> (8 * l)) & 0xFF]);
    const uint64_t m = __ldg(&sign[(a1 >> (7 * l)) & 127]);
    const uint32_t g = uint32_t(half ? gv >> 32 : gv), mw = uint32_t(half ? m >> 32 : m);
    return (g ^ mw) + (mw & 0x01010101u);
}


// A warp: MT tiles of 16 weight rows × NT tiles of 8 pairs, so each expanded weight
// fragment serves NT × 8 pairs; a group of kKqPairs pairs takes kKqPairs / (8 NT) passes.
// A block: 4 warps, 64 MT rows. IQ2_XXS (costly expansion): MT 1, NT 4; Q2_K (its mins need
// a per-pair sum per sub-block): MT 2, NT 2. FLAT (k order, the fallback of the staged FLAT
// kernels): one running sum an output instead of the leaves and the stack; groups of up to
// kKqFlatPairs pairs (more passes).
constexpr uint32_t kKqPairs = 32;       // MoeGroups::per_group for these kernels (decode's order)
template <uint32_t T>
constexpr int kq_mt() { return T == T_IQ2_XXS ? 1 : 2; }
template <uint32_t T>
constexpr int kq_nt() { return T == T_IQ2_XXS ? 4 : 2; }

template <uint32_t T, int NW, bool FLAT = false>
__global__ void __launch_bounds__(128) gemm_kq_kernel(KqGemm p) {
    pdl_begin();
    constexpr int MT = kq_mt<T>(), NT = kq_nt<T>();
    constexpr uint32_t BODY = T == T_IQ2_XXS ? 64 : 80, AUX = T == T_IQ2_XXS ? 1 : 2;
    const uint32_t gi = blockIdx.y;
    if (gi >= uint32_t(*p.count)) return;
    const int32_t* g = p.grp + 3 * gi;
    const uint64_t wbase = uint64_t(g[0]) * p.rows_per_expert;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint64_t m0 = uint64_t(blockIdx.x) * (64 * MT) + warp * 16 * MT;
    const uint64_t nsb = p.K / 256;
    for (int pass = 0; pass * 8 * NT < g[2]; ++pass) {
        const int32_t* gp = p.pairs + g[1] + pass * 8 * NT;   // this pass's pairs
        const int cnt = min(g[2] - pass * 8 * NT, 8 * NT);
        // B columns: pair nt*8 + gid; C columns: pairs nt*8 + 2tig + c. Columns past the group's
        // pairs repeat its last pair and are not stored.
        const int8_t* ab[NT];
        uint32_t pc[NT][2];
        const float* adc[NT][2];
        const int32_t* bsc[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint32_t pb = uint32_t(gp[min(nt * 8 + int(gid), cnt - 1)]);
            ab[nt] = p.aq + uint64_t(pb / p.act_div) * p.AL;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                pc[nt][c] = uint32_t(gp[min(nt * 8 + int(2 * tig) + c, cnt - 1)]);
                adc[nt][c] = p.ad + uint64_t(pc[nt][c] / p.act_div) * (p.AL / 256);
                bsc[nt][c] = p.absum + uint64_t(pc[nt][c] / p.act_div) * (p.AL / 16);
            }
        }
        const uint8_t* wr[NW][MT][2];
        const uint16_t* wdr[NW][MT][2];
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint64_t row = wbase + min(m0 + mt * 16 + gid + 8 * h, p.N - 1);
                    wr[j][mt][h] = p.wq[j] + row * nsb * BODY;
                    wdr[j][mt][h] = p.wd[j] + row * nsb * AUX;
                }
        // a (row, pair)'s super-blocks in k order (FLAT) or decode's tree (sum_superblocks)
        float cur[NW][MT][NT][4];
        sum_superblocks<FLAT>(int(nsb), cur, [&](int idx, float (&cur)[NW][MT][NT][4]) {
                const uint64_t sb = uint64_t(FLAT ? idx : sb_at(idx, int(nsb)));
                int isum[NW][MT][NT][4], mins[MT][NT][4];
                each(isum, [](int& x) { x = 0; });
                each(mins, [](int& x) { x = 0; });
                if constexpr (T == T_IQ2_XXS) {
#pragma unroll 1
                    for (int grp32 = 0; grp32 < 8; ++grp32) {
                        uint32_t b[NT][2];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            const int8_t* ak = ab[nt] + sb * 256 + 32 * grp32 + 4 * tig;
                            b[nt][0] = ld32(ak);
                            b[nt][1] = ld32(ak + 16);
                        }
#pragma unroll
                        for (int j = 0; j < NW; ++j)
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                uint32_t a0w[2], a1w[2];
#pragma unroll
                                for (int h = 0; h < 2; ++h) {
                                    const uint8_t* gq = wr[j][mt][h] + sb * BODY + 8 * grp32;
                                    const uint2 q = *reinterpret_cast<const uint2*>(gq);
                                    a0w[h] = q.x;
                                    a1w[h] = q.y;
                                }
                                // a[0..3]: rows gid / gid+8 at k = 4tig.. (grid row tig>>1) and k + 16
                                const uint32_t a[4] = {
                                    iq2_word(p.grid, p.sign, a0w[0], a1w[0], tig >> 1, tig & 1),
                                    iq2_word(p.grid, p.sign, a0w[1], a1w[1], tig >> 1, tig & 1),
                                    iq2_word(p.grid, p.sign, a0w[0], a1w[0], 2 + (tig >> 1), tig & 1),
                                    iq2_word(p.grid, p.sign, a0w[1], a1w[1], 2 + (tig >> 1), tig & 1)};
                                const int ls[2] = {int(2 * (a1w[0] >> 28) + 1), int(2 * (a1w[1] >> 28) + 1)};
#pragma unroll
                                for (int nt = 0; nt < NT; ++nt) {
                                    int d[4];
                                    mma_s8(a, b[nt], d);
#pragma unroll
                                    for (int e = 0; e < 4; ++e) isum[j][mt][nt][e] += d[e] * ls[e >> 1];
                                }
                            }
                    }
                } else {
                    // Q2_K: sub-block u = 8h + 2jp + s holds values 16u + t at code bytes
                    // 32h + 16s + t, bits 2jp; its scale byte is scales[u]
                    uint4 sc[MT][2];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            sc[mt][h] = *reinterpret_cast<const uint4*>(wr[0][mt][h] + sb * BODY);
#pragma unroll
                    for (int u = 0; u < 16; ++u) {
                        const uint32_t hh = u >> 3, jp = (u >> 1) & 3, s = u & 1;
                        uint32_t b[NT];
                        int bs[NT][2];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) {
                            b[nt] = ld32(ab[nt] + sb * 256 + 16 * u + 4 * tig);
                            bs[nt][0] = bsc[nt][0][sb * 16 + u];
                            bs[nt][1] = bsc[nt][1][sb * 16 + u];
                        }
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            uint32_t a[2], scb[2];
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const uint32_t qw = *reinterpret_cast<const uint32_t*>(wr[0][mt][h] + sb * BODY + 16 +
                                                                                        32 * hh + 16 * s + 4 * tig);
                                a[h] = (qw >> (2 * jp)) & 0x03030303u;
                                const uint32_t words[4] = {sc[mt][h].x, sc[mt][h].y, sc[mt][h].z, sc[mt][h].w};
                                scb[h] = (words[u >> 2] >> (8 * (u & 3))) & 0xFF;
                            }
#pragma unroll
                            for (int nt = 0; nt < NT; ++nt) {
                                int d[4];
                                mma_s8_k16(a[0], a[1], b[nt], d);
#pragma unroll
                                for (int e = 0; e < 4; ++e) {
                                    isum[0][mt][nt][e] += d[e] * int(scb[e >> 1] & 0xF);
                                    mins[mt][nt][e] += int(scb[e >> 1] >> 4) * bs[nt][e & 1];
                                }
                            }
                        }
                    }
                }
                // the super-block's float step, as the decode kernel's lane 4j does it
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    float dw[NW][2][2];   // (weight, row h, d / dmin)
#pragma unroll
                    for (int j = 0; j < NW; ++j)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const uint16_t* wd = wdr[j][mt][h] + sb * AUX;
                            dw[j][h][0] = f16_to_f32(wd[0]);
                            dw[j][h][1] = T == T_Q2_K ? f16_to_f32(wd[AUX - 1]) : 0.0f;
                        }
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const float dx[2] = {adc[nt][0][sb], adc[nt][1][sb]};
#pragma unroll
                        for (int j = 0; j < NW; ++j)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const float x = dx[e & 1];
                                if constexpr (T == T_IQ2_XXS) {
                                    cur[j][mt][nt][e] =
                                        fmaf(dw[j][e >> 1][0] * x, float(isum[j][mt][nt][e]), cur[j][mt][nt][e]);
                                } else {
                                    const float dall = x * dw[j][e >> 1][0], dmin = x * dw[j][e >> 1][1];
                                    cur[j][mt][nt][e] +=
                                        fmaf(dall, float(isum[j][mt][nt][e]), -(dmin * float(mins[mt][nt][e])));
                                }
                            }
                    }
                }
        });
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const uint64_t n = m0 + mt * 16 + gid + 8 * (e >> 1);
                    const int c = nt * 8 + int(2 * tig) + (e & 1);
                    if (n >= p.N || c >= cnt) continue;
                    float v = cur[0][mt][nt][e];
                    if (T == T_IQ2_XXS) v *= 0.125f;
                    if constexpr (NW == 2) {
                        float u = cur[NW - 1][mt][nt][e];
                        if (T == T_IQ2_XXS) u *= 0.125f;
                        v = swiglu_pair(v, u, p.clamp, p.ew, pc[nt][e & 1]);
                    }
                    p.y[uint64_t(pc[nt][e & 1]) * p.y_stride + n] = v;
                }
    }
}


// ---- IQ2_XXS gate+up staged through shared memory (DSV4_GEMM_SMEM, on by default) --------
// Same integers and the same float steps in the same order as gemm_kq_kernel<T_IQ2_XXS>
// (so as decode); only where the operands come from differs. A block: 64 weight rows × the
// group's 32 pairs × NW weights, 8 warps of 16 rows × 16 pairs (2 × NW accumulator tiles a
// thread: 128 registers with NW = 2, ptxas spilling 20 bytes; 2 blocks = 16 warps an SM,
// 73 KB of shared memory a block). Per super-block (in the decode tree's
// visiting order): the raw codes (NW × 64 rows × 64 bytes) and the pairs' activations
// (32 × 256 bytes) arrive by cp.async one super-block ahead (two stages); the block expands
// the codes once through the grid and sign tables (in shared memory) into int8 rows, then
// every MMA takes its A and B fragments by ldmatrix from shared memory. Global traffic per
// MMA (m16n8k32): 2 bytes of codes and 1 of activations (was 16 table lookups + 8 code +
// 16 activation bytes per 2 MMAs from global / L1 per lane group).
constexpr int kSmRows = 64;                 // weight rows a block
// bytes a staged row of 256 int8 (expanded weights, activations) takes: 16 of padding so
// ldmatrix's 8 row addresses fall on different banks
constexpr int kSmRowE = 256 + 16;

// A warp's tiles of 8 pairs in a staged expert GEMM block. The block's two halves of warps (h =
// warp / 4) take the group's tiles alternately (tile nt of half h: pairs 8 (2 nt + h) ..), and
// a warp skips its tiles that start past the group's count (their ldmatrix, MMAs, integer and
// float steps, stores): a prompt chunk's groups are ~3/4 full (12,288 pairs of a 2,048-token
// chunk over 256 experts, 64 slots a group), and alternating keeps the two halves' work equal
// up to a tile. Which thread forms an output changes; its operations do not (same bits).
// DSV4_KQ_SKIP=0 runs every tile. Measured (runs 115, 117: Nsight Compute, a 2,048-token chunk):
// gate+up 2,200 against 2,399 µs, down 1,690 against 1,811; the 43-layer prefill +4.6 %.
template <int NT>
struct PairTiles {
    int h, n;   // n: the warp's tiles holding a pair (tiles of 8: ceil(cnt / 8) in the group)
    __device__ PairTiles(uint32_t half, int cnt, bool skip)
        : h(int(half)), n(skip ? ((cnt + 7) / 8 - int(half) + 1) / 2 : NT) {}
    __device__ int base(int nt) const { return 8 * (2 * nt + h); }
    // lane's ldmatrix.x4 row for tiles 2 np (matrices 0, 1) and 2 np + 1 (matrices 2, 3)
    __device__ uint32_t ldm_row(int np, uint32_t lane) const { return uint32_t(base(2 * np + int(lane >> 4))) + (lane & 7); }
};

// REP: the tables replicated (iq2.cuh: the grid in 16 copies, the sign selectors in 16), each
// lane reading its own copy: a warp's 64-bit grid lookups take the minimum 2 shared-memory
// passes and its selector lookups 2, where one copy of each (REP = false: the grid and the
// byte masks as in global memory) takes ~7 passes for each, random indices colliding on
// banks. The expansion was most of the kernel's shared-memory traffic (Nsight Compute, run
// 37: L1/shared throughput 79 %, the kernel's limit). 40 KB more a block: 109 KB, still 2
// blocks an SM.
//
// FLAT (prompt rounds, k order; REP only): groups of 64 pairs, 8 warps of 16 rows × 32 pairs
// (4 × NW accumulator tiles a thread, the stack's registers freed), so one expansion and one
// weight stage serve 64 pairs. The 64 pairs' activations take 17 KB more; to stay at 2 blocks
// an SM (228 KB, 1 KB reserved a block: 112 KB a block at most) the grid has 8 copies instead
// of 16 (16 KB less; iq2.cuh): 110 KB a block (NW = 2). The price: a warp's 64-bit grid
// lookups take ~4 shared-memory passes instead of 2, i.e. 4 × 32 × 2 = 256 more passes a
// super-block and block (counted from the access pattern, not measured: ~2,340 passes a
// super-block for 64 pairs against ~1,760 for 32 pairs with 16 copies, ~35 % fewer a pair).
// ptxas: 128 registers with NW = 2 (32 bytes spilled, 40 of reloads; 173 unbounded), 101 with
// NW = 1.
constexpr uint32_t kIq2GemmSelCopies = 16;
template <int NW, bool REP, bool FLAT = false>
struct Iq2Smem {
    static constexpr int pairs = FLAT ? int(kKqFlatPairs) : int(kKqPairs);   // a group's pairs at most
    static constexpr uint32_t grid_copies = FLAT ? 8 : kIq2GridCopies;
    static constexpr int grid = 0;   // 256 × u64 (REP: grid_copies copies)
    // 128 × u64 masks (REP: selectors)
    static constexpr int sign = grid + (REP ? int(iq2_grid_rep_bytes(grid_copies)) : 256 * 8);
    static constexpr int exp = sign + (REP ? 128 * int(kIq2GemmSelCopies) * 4 : 128 * 8);   // [NW][64] rows of kSmRowE int8
    static constexpr int ls = exp + NW * kSmRows * kSmRowE;         // [NW][64][8] group scales 2s + 1
    static constexpr int raw = ls + NW * kSmRows * 8;               // [2][NW][64][64] code bytes
    static constexpr int act = raw + 2 * NW * kSmRows * 64;         // [2][pairs] rows of kSmRowE int8
    static constexpr int dw = act + 2 * pairs * kSmRowE;            // [NW][64] float
    static constexpr int dx = dw + NW * kSmRows * 4;                // [pairs] float
    static constexpr int bytes = dx + pairs * 4;
};
static_assert(Iq2Smem<2, true, true>::bytes + 1024 <= 228 * 1024 / 2, "FLAT IQ2_XXS: 2 blocks an SM");


// NIB (FLAT only, the default; DSV4_IQ2_NIB=0 off): the grid as 2-bit codes (iq2.cuh: iq2_expand_nib) in
// 16 copies in the grid's 16 KB, the same int8 values, so the same bits.
template <int NW, bool REP, bool FLAT = false, bool NIB = false>
__global__ void __launch_bounds__(256, 2) gemm_iq2_smem_kernel(KqGemm p) {
    static_assert(REP || !FLAT, "FLAT: replicated tables only");
    static_assert(!NIB || FLAT, "NIB: the FLAT kernel's");
    static_assert(!NIB || 256 * 16 * 4 <= int(iq2_grid_rep_bytes(Iq2Smem<NW, REP, FLAT>::grid_copies)),
                  "NIB: 16 copies of the codes in the grid's space");
    pdl_begin();
    using L = Iq2Smem<NW, REP, FLAT>;
    constexpr int PAIRS = L::pairs, NT = PAIRS / 16;   // NT: a warp's tiles of 8 pairs
    constexpr uint32_t GC = L::grid_copies;
    extern __shared__ __align__(16) uint8_t sm[];
    ExpertGroup eg;
    if (!expert_group(p, PAIRS, eg)) return;
    const uint64_t wbase = eg.wbase;
    const int32_t* gp = eg.pairs;
    const int cnt = eg.cnt;
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wm = (warp & 3) * 16;   // this warp's weight rows in the block
    const PairTiles<NT> pt(warp >> 2, cnt, p.skip_tiles);   // and its tiles of pairs
    const uint64_t m0 = uint64_t(blockIdx.x) * kSmRows;
    const int nsb = int(p.K / 256);
    int nvis = nsb;   // super-blocks visited (FLAT: sb = idx)
    if constexpr (!FLAT) {
        nvis = 0;
        for (int leaf = 0; leaf < 8; ++leaf) nvis += leaf < nsb ? (nsb - leaf + 7) / 8 : 0;
    }
    auto sb_of = [&](int idx) { return FLAT ? idx : sb_at(idx, nsb); };

    // tables
    uint64_t* sgrid = reinterpret_cast<uint64_t*>(sm + L::grid);
    uint64_t* ssign = reinterpret_cast<uint64_t*>(sm + L::sign);
    if constexpr (NIB) {
        iq2_fill_nib<256, kIq2GemmSelCopies, 16>(reinterpret_cast<uint4*>(sm + L::grid),
                                                 reinterpret_cast<uint4*>(sm + L::sign), p.grid, p.sel, t);
    } else if constexpr (REP) {
        iq2_fill_rep<256, kIq2GemmSelCopies, GC>(reinterpret_cast<uint4*>(sm + L::grid),
                                                 reinterpret_cast<uint4*>(sm + L::sign), p.grid, p.sel, t);
    } else {
        sgrid[t] = p.grid[t];
        if (t < 128) ssign[t] = p.sign[t];
    }
    // this thread's copies: code bytes 16 t.. of each weight's 64 rows (row t / 4, part t % 4),
    // activation chunks TP i + t % TP of pair slot t / TP (TP = 256 / PAIRS threads a pair: one
    // row register; a warp's copy takes 16 TP contiguous bytes of each of its rows)
    constexpr int TP = 256 / PAIRS;
    const uint64_t woff = (wbase + min(m0 + (t >> 2), p.N - 1)) * uint64_t(nsb) * 64 + (t & 3) * 16;
    const uint32_t arow = uint32_t(gp[min(int(t) / TP, cnt - 1)]) / p.act_div;
    auto issue = [&](int idx) {
        const int s = idx & 1, sb = sb_of(idx);
#pragma unroll
        for (int j = 0; j < NW; ++j)
            cp_async16(sm + L::raw + (s * NW + j) * kSmRows * 64 + t * 16, p.wq[j] + woff + uint64_t(sb) * 64);
#pragma unroll
        for (int i = 0; i < 16 / TP; ++i) {
            const uint32_t part = TP * i + t % TP;
            cp_async16(sm + L::act + (s * PAIRS + int(t) / TP) * kSmRowE + part * 16,
                       p.aq + uint64_t(arow) * p.AL + uint64_t(sb) * 256 + part * 16);
        }
    };
    // the scale this thread stages per super-block: a weight row's d (t < 64 NW) or a pair's dx
    const bool has_dw = t < uint32_t(NW * kSmRows), has_dx = !has_dw && t < uint32_t(NW * kSmRows + PAIRS);
    uint64_t soff = 0;
    if (has_dw) soff = (wbase + min(m0 + (t % kSmRows), p.N - 1)) * uint64_t(nsb);
    else if (has_dx)
        soff = uint64_t(uint32_t(gp[min(int(t) - NW * kSmRows, cnt - 1)]) / p.act_div) * (p.AL / 256);
    auto scale_at = [&](int idx) {
        const int sb = sb_of(idx);
        if (has_dw) return f16_to_f32((t >= uint32_t(kSmRows) ? p.wd[NW - 1] : p.wd[0])[soff + sb]);
        return has_dx ? p.ad[soff + sb] : 0.0f;
    };

    issue(0);
    cp_async_commit();
    float pre = scale_at(0);
    // the rest with the warp's tile count a constant (run-time guards would cut the unrolled
    // tile loops into blocks the compiler cannot interleave: each MMA's latency exposed)
    with_tiles<0, NT>(pt.n, [&](auto ntv) {
        constexpr int NV = decltype(ntv)::value;

        // One super-block (the idx-th visited): wait for its stage, start the next one's copies,
        // expand its codes, its MMAs, its float step into cur.
        auto step = [&](int idx, float (&cur)[NW][NT][4]) {
            const int s = idx & 1;
            cp_async_wait_all();
            __syncthreads();   // stage s landed for all; every warp is done with the last MMAs
            if (idx + 1 < nvis) issue(idx + 1);
            cp_async_commit();
            // expand the codes: unit u = (weight, row, 32-value group), 8 int8 per grid row
            const uint8_t* raw = sm + L::raw + s * NW * kSmRows * 64;
#pragma unroll 1
            for (int i = 0; i < 2 * NW; ++i) {
                const uint32_t u = t + 256 * i, grp = u & 7, jr = u >> 3;   // jr = j * 64 + row
                const uint2 q = *reinterpret_cast<const uint2*>(raw + jr * 64 + grp * 8);
                uint32_t w[8];
                if constexpr (NIB) {
                    iq2_expand_nib<kIq2GemmSelCopies, 16>(q.x, q.y, sm + L::grid + (lane & 15) * 4,
                                                          sm + L::sign + (lane & 15) * 4, w);
                } else if constexpr (REP) {
                    iq2_expand_rep<kIq2GemmSelCopies, GC>(q.x, q.y, sm + L::grid + (lane & (GC - 1)) * 8,
                                                          sm + L::sign + (lane & 15) * 4, w);
                } else {
#pragma unroll
                    for (int l = 0; l < 4; ++l) {
                        const uint64_t gv = sgrid[(q.x >> (8 * l)) & 0xFF];
                        const uint64_t m = ssign[(q.y >> (7 * l)) & 127];
                        const uint32_t glo = uint32_t(gv), ghi = uint32_t(gv >> 32);
                        const uint32_t mlo = uint32_t(m), mhi = uint32_t(m >> 32);
                        w[2 * l] = (glo ^ mlo) + (mlo & 0x01010101u);
                        w[2 * l + 1] = (ghi ^ mhi) + (mhi & 0x01010101u);
                    }
                }
                // groups 4-7 store their second half first: 8 lanes' 16-byte stores then fall
                // on 8 different bank quads
                uint4* e = reinterpret_cast<uint4*>(sm + L::exp + jr * kSmRowE + grp * 32);
                const uint4 lo = make_uint4(w[0], w[1], w[2], w[3]), hi = make_uint4(w[4], w[5], w[6], w[7]);
                const uint32_t sw = (grp >> 2) & 1;
                e[sw] = sw ? hi : lo;
                e[sw ^ 1] = sw ? lo : hi;
                sm[L::ls + jr * 8 + grp] = uint8_t(2 * (q.y >> 28) + 1);
            }
            if (t < uint32_t(NW * kSmRows)) reinterpret_cast<float*>(sm + L::dw)[t] = pre;
            else if (t < uint32_t(NW * kSmRows + PAIRS))
                reinterpret_cast<float*>(sm + L::dx)[t - NW * kSmRows] = pre;
            if (idx + 1 < nvis) pre = scale_at(idx + 1);
            __syncthreads();   // expanded rows, scales visible
            int isum[NW][NT][4];
            each(isum, [](int& x) { x = 0; });
            const uint8_t* as = sm + L::act + s * PAIRS * kSmRowE;
            // group grp's MMAs; lsv: words of the group scales of rows gid, gid + 8 (weight j), the
            // group's byte at bit `shift`
            auto mma_group = [&](int grp, const uint32_t (&lsv)[NW][2], int shift) {
                // B, per 16 pairs: matrices (pairs 0-7, k 0-15), (0-7, 16-31), (8-15, 0-15), (8-15, 16-31)
                uint32_t b[NT / 2][4];
#pragma unroll
                for (int np = 0; np < NT / 2; ++np)
                    if (2 * np < NV)
                        ldmatrix_x4(b[np], as + pt.ldm_row(np, lane) * kSmRowE + grp * 32 + ((lane >> 3) & 1) * 16);
#pragma unroll
                for (int j = 0; j < NW; ++j) {
                    // A: matrices (rows 0-7, k 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31)
                    uint32_t a[4];
                    ldmatrix_x4(a, sm + L::exp + (j * kSmRows + wm + (lane & 7) + ((lane >> 3) & 1) * 8) * kSmRowE +
                                       grp * 32 + (lane >> 4) * 16);
                    int ls[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h) ls[h] = int((lsv[j][h] >> shift) & 0xFF);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        if (nt >= NV) continue;
                        int d[4];
                        const uint32_t bb[2] = {b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]};
                        mma_s8(a, bb, d);
#pragma unroll
                        for (int e = 0; e < 4; ++e) isum[j][nt][e] += d[e] * ls[e >> 1];
                    }
                }
            };
            if constexpr (FLAT) {
                // the scales of 4 groups at a time (a word a row: 4 registers fewer than all 8)
#pragma unroll 1
                for (int half = 0; half < 2; ++half) {
                    uint32_t lsw[NW][2];
#pragma unroll
                    for (int j = 0; j < NW; ++j)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            lsw[j][h] = *reinterpret_cast<const uint32_t*>(
                                sm + L::ls + (j * kSmRows + wm + gid + 8 * h) * 8 + 4 * half);
#pragma unroll 2
                    for (int g4 = 0; g4 < 4; ++g4) mma_group(4 * half + g4, lsw, 8 * g4);
                }
            } else {
                uint2 lsw[NW][2];
#pragma unroll
                for (int j = 0; j < NW; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        lsw[j][h] = *reinterpret_cast<const uint2*>(sm + L::ls + (j * kSmRows + wm + gid + 8 * h) * 8);
#pragma unroll 2
                for (int grp = 0; grp < 8; ++grp) {
                    uint32_t lv[NW][2];
#pragma unroll
                    for (int j = 0; j < NW; ++j)
#pragma unroll
                        for (int h = 0; h < 2; ++h) lv[j][h] = grp < 4 ? lsw[j][h].x : lsw[j][h].y;
                    mma_group(grp, lv, 8 * (grp & 3));
                }
            }
            // the super-block's float step, as gemm_kq_kernel (and decode's lane 4j, and the
            // CPU's dot_iq2_xxs: fmaf(d_w · d_x, bsum, s)) does it
            const float* sdw = reinterpret_cast<const float*>(sm + L::dw);
            const float* sdx = reinterpret_cast<const float*>(sm + L::dx);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (nt >= NV) continue;
                const float dx[2] = {sdx[pt.base(nt) + 2 * tig], sdx[pt.base(nt) + 2 * tig + 1]};
#pragma unroll
                for (int j = 0; j < NW; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float dwv = sdw[j * kSmRows + wm + gid + 8 * (e >> 1)];
                        cur[j][nt][e] = fmaf(dwv * dx[e & 1], float(isum[j][nt][e]), cur[j][nt][e]);
                    }
            }
        };

        float cur[NW][NT][4];
        sum_superblocks<FLAT>(nsb, cur, step);
        cp_async_wait_all();
        // every tile (the empty ones hold zeros; c >= cnt skips them): bounded by NV, ptxas
        // spilled 388 bytes here instead of 16
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t n = m0 + wm + gid + 8 * (e >> 1);
                const int c = pt.base(nt) + int(2 * tig) + (e & 1);
                if (n >= p.N || c >= cnt) continue;
                const uint32_t pc = uint32_t(gp[c]);
                float v = cur[0][nt][e] * 0.125f;
                if constexpr (NW == 2) {
                    const float u = cur[1][nt][e] * 0.125f;
                    v = swiglu_pair(v, u, p.clamp, p.ew, pc);
                }
                p.y[uint64_t(pc) * p.y_stride + n] = v;
            }
    });
}


// ---- Q2_K (the experts' down product) staged through shared memory -----------------------
// The same pipeline as gemm_iq2_smem_kernel (64 weight rows × the group's 32 pairs a block,
// 8 warps of 16 × 16, super-blocks in the decode tree's order, cp.async one ahead). The
// expansion multiplies each 2-bit code by its sub-block's 4-bit scale (q·s <= 45: still int8),
// so the super-block's integer sum Σ_u s_u (q_u · a_u) — exactly the decode kernel's — comes
// from 8 accumulating m16n8k32 MMAs instead of 16 m16n8k16 ones and 16 scalar products a
// tile. The mins' sums Σ_u m_u bsum_u (bsum_u: the sum of sub-block u's 16 activation codes)
// are Σ_t m_{u(t)} a_t: with MMA_MINS two more MMAs per 32 values against the same
// activation fragments, the A operand the two sub-blocks' mins (4-bit) replicated into each
// byte, built in registers from the scale bytes; the same integers as the scalar sums of the
// staged bsums (MMA_MINS = false, DSV4_GEMM_SMEM=2), which took most of the kernel's
// instructions (64 multiply-adds and 24 shared loads a thread per super-block).
// 80 registers (ptxas spills 8 bytes; 20 without MMA_MINS), 50 KB of shared memory: 3 blocks =
// 24 warps an SM. FLAT (prompt rounds, k order; MMA_MINS only): groups of 64 pairs, 8 warps of
// 16 rows × 32 pairs (4 accumulator tiles a thread in the stack's registers), no bsum staging:
// 62 KB of shared memory, still 3 blocks an SM; 80 registers, 36 bytes spilled (112 unbounded).
//
// MINS picks how the mins' sums are formed: 0 scalar sums of the staged bsums (DSV4_GEMM_SMEM=2,
// not FLAT), 1 two more m16n8k32 MMAs per 32 values against the activation (MMA_MINS above;
// DSV4_Q2K_MINS=1), 2 (the default) one m16n8k16 pair per super-block against the bsums: the
// super-block's 16 mins of a row are the A operand (k = sub-block), its 16 bsums of a pair the
// B operand, split as bsum = 128 hi + lo with lo in [0, 127] and hi in [-16, 15] (|bsum| <= 16 ·
// 128) so both fit int8: Σ_u m_u bsum_u = 128 Σ m·hi + Σ m·lo, the same integer. The bsums are
// staged as MINS 0 stages them and split into bytes once per super-block beside the expansion.
// A super-block's mins then cost one k32 MMA's work a tile instead of 16.
template <bool FLAT = false, int MINS = 1>
struct Q2Smem {
    static constexpr int pairs = FLAT ? int(kKqFlatPairs) : int(kKqPairs);   // a group's pairs at most
    static constexpr int bss = MINS == 0 ? 80 : 64;                // bytes a staged pair's bsums take
    static constexpr int exp = 0;                                  // [64] rows of kSmRowE int8
    static constexpr int raw = exp + kSmRows * kSmRowE;            // [2][64][80] scales + codes
    static constexpr int act = raw + 2 * kSmRows * 80;             // [2][pairs] rows of kSmRowE int8
    static constexpr int bs = act + 2 * pairs * kSmRowE;           // [2][pairs] bss bytes: 16 int32 (MINS 0, 2)
    static constexpr int split = bs + (MINS == 1 ? 0 : 2 * pairs * bss);   // [pairs][48]: lo, hi bytes (MINS 2)
    static constexpr int dw = split + (MINS == 2 ? pairs * 48 : 0);        // [64][2] float (d, dmin)
    static constexpr int dx = dw + kSmRows * 8;                    // [pairs] float
    static constexpr int bytes = dx + pairs * 4;
};
static_assert(3 * (Q2Smem<true, 1>::bytes + 1024) <= 228 * 1024, "FLAT Q2_K: 3 blocks an SM");
static_assert(3 * (Q2Smem<true, 2>::bytes + 1024) <= 228 * 1024, "FLAT Q2_K (bsum mins): 3 blocks an SM");

__device__ __forceinline__ void mma_s8_k16(const uint32_t (&a)[2], uint32_t b, int (&d)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b));
}

__device__ __forceinline__ void mma_s8_acc(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int MINS, bool FLAT = false>
__global__ void __launch_bounds__(256, 3) gemm_q2k_smem_kernel(KqGemm p) {
    static_assert(MINS != 0 || !FLAT, "FLAT: mins by MMA only");
    pdl_begin();
    using L = Q2Smem<FLAT, MINS>;
    constexpr int PAIRS = L::pairs, NT = PAIRS / 16;   // NT: a warp's tiles of 8 pairs
    extern __shared__ __align__(16) uint8_t sm[];
    ExpertGroup eg;
    if (!expert_group(p, PAIRS, eg)) return;
    const uint64_t wbase = eg.wbase;
    const int32_t* gp = eg.pairs;
    const int cnt = eg.cnt;
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wm = (warp & 3) * 16;
    const PairTiles<NT> pt(warp >> 2, cnt, p.skip_tiles);
    const uint64_t m0 = uint64_t(blockIdx.x) * kSmRows;
    const int nsb = int(p.K / 256);
    int nvis = nsb;   // super-blocks visited (FLAT: sb = idx)
    if constexpr (!FLAT) {
        nvis = 0;
        for (int leaf = 0; leaf < 8; ++leaf) nvis += leaf < nsb ? (nsb - leaf + 7) / 8 : 0;
    }
    auto sb_of = [&](int idx) { return FLAT ? idx : sb_at(idx, nsb); };

    // copies: 320 chunks of code rows (row q / 5, part q % 5) for q = t and t + 256 (< 320);
    // activation chunks TP i + t % TP of pair slot t / TP (as gemm_iq2_smem_kernel); bsum chunks
    // t < 4 PAIRS (pair t / 4, part t % 4)
    constexpr int TP = 256 / PAIRS;
    uint64_t woff[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint32_t q = min(t + 256 * i, 319u);
        woff[i] = (wbase + min(m0 + q / 5, p.N - 1)) * uint64_t(nsb) * 80 + (q % 5) * 16;
    }
    const uint32_t arow = uint32_t(gp[min(int(t) / TP, cnt - 1)]) / p.act_div;
    const uint32_t brow = uint32_t(gp[min(int(t >> 2), cnt - 1)]) / p.act_div;
    auto issue = [&](int idx) {
        const int s = idx & 1, sb = sb_of(idx);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t q = t + 256 * i;
            if (q < 320)
                cp_async16(sm + L::raw + s * kSmRows * 80 + q * 16, p.wq[0] + woff[i] + uint64_t(sb) * 80);
        }
#pragma unroll
        for (int i = 0; i < 16 / TP; ++i) {
            const uint32_t part = TP * i + t % TP;
            cp_async16(sm + L::act + (s * PAIRS + int(t) / TP) * kSmRowE + part * 16,
                       p.aq + uint64_t(arow) * p.AL + uint64_t(sb) * 256 + part * 16);
        }
        if (MINS != 1 && t < uint32_t(4 * PAIRS))
            cp_async16(sm + L::bs + (s * PAIRS + int(t >> 2)) * L::bss + (t & 3) * 16,
                       p.absum + uint64_t(brow) * (p.AL / 16) + uint64_t(sb) * 16 + (t & 3) * 4);
    };
    // scales staged per super-block: a row's (d, dmin) (t < 64) or a pair's dx (64 <= t < 64 + PAIRS)
    const bool has_dw = t < uint32_t(kSmRows), has_dx = !has_dw && t < uint32_t(kSmRows + PAIRS);
    uint64_t soff = 0;
    if (has_dw) soff = (wbase + min(m0 + t, p.N - 1)) * uint64_t(nsb);
    else if (has_dx) soff = uint64_t(uint32_t(gp[min(int(t) - kSmRows, cnt - 1)]) / p.act_div) * (p.AL / 256);
    auto scale_at = [&](int idx) -> uint32_t {
        const int sb = sb_of(idx);
        return has_dw ? reinterpret_cast<const uint32_t*>(p.wd[0])[soff + sb]
                      : has_dx ? __float_as_uint(p.ad[soff + sb]) : 0u;
    };

    issue(0);
    cp_async_commit();
    uint32_t pre = scale_at(0);
    // the rest with the warp's tile count a constant (run-time guards would cut the unrolled
    // tile loops into blocks the compiler cannot interleave: each MMA's latency exposed)
    with_tiles<0, NT>(pt.n, [&](auto ntv) {
        constexpr int NV = decltype(ntv)::value;

        // One super-block (the idx-th visited): wait for its stage, start the next one's copies,
        // expand its codes, its MMAs, its float step into cur.
        auto step = [&](int idx, float (&cur)[NT][4]) {
            const int s = idx & 1;
            cp_async_wait_all();
            __syncthreads();   // stage s landed for all; every warp is done with the last MMAs
            if (idx + 1 < nvis) issue(idx + 1);
            cp_async_commit();
            // expand: unit (row, 32 values = sub-blocks 2c, 2c + 1) -> q · (scale & 15)
            const uint8_t* raw = sm + L::raw + s * kSmRows * 80;
#pragma unroll 1
            for (int i = 0; i < 2; ++i) {
                const uint32_t u = t + 256 * i, c = u & 7, row = u >> 3, hh = c >> 2, jp = c & 3;
                const uint8_t* rr = raw + row * 80;
                const uint4 q0 = *reinterpret_cast<const uint4*>(rr + 16 + 32 * hh);
                const uint4 q1 = *reinterpret_cast<const uint4*>(rr + 16 + 32 * hh + 16);
                const uint32_t s0 = rr[2 * c] & 0xF, s1 = rr[2 * c + 1] & 0xF;
                auto x2 = [&](uint32_t w, uint32_t sc) { return ((w >> (2 * jp)) & 0x03030303u) * sc; };
                const uint4 lo = make_uint4(x2(q0.x, s0), x2(q0.y, s0), x2(q0.z, s0), x2(q0.w, s0));
                const uint4 hi = make_uint4(x2(q1.x, s1), x2(q1.y, s1), x2(q1.z, s1), x2(q1.w, s1));
                uint4* e = reinterpret_cast<uint4*>(sm + L::exp + row * kSmRowE + c * 32);
                const uint32_t sw = (c >> 2) & 1;
                e[sw] = sw ? hi : lo;
                e[sw ^ 1] = sw ? lo : hi;
            }
            if constexpr (MINS == 2) {
                // the bsums as bytes: pair t / 4's sub-blocks 4 (t % 4) .. + 3, lo then hi
                if (t < uint32_t(4 * PAIRS)) {
                    const int4 v = *reinterpret_cast<const int4*>(sm + L::bs + (s * PAIRS + int(t >> 2)) * L::bss +
                                                                 (t & 3) * 16);
                    const int b[4] = {v.x, v.y, v.z, v.w};
                    uint32_t lo = 0, hi = 0;
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        lo |= uint32_t(b[k] & 127) << (8 * k);
                        hi |= (uint32_t(b[k] >> 7) & 0xFFu) << (8 * k);
                    }
                    uint8_t* d = sm + L::split + (t >> 2) * 48 + (t & 3) * 4;
                    *reinterpret_cast<uint32_t*>(d) = lo;
                    *reinterpret_cast<uint32_t*>(d + 16) = hi;
                }
            }
            float* sdw = reinterpret_cast<float*>(sm + L::dw);
            if (has_dw) {
                sdw[2 * t] = f16_to_f32(uint16_t(pre & 0xFFFF));
                sdw[2 * t + 1] = f16_to_f32(uint16_t(pre >> 16));
            } else if (has_dx) {
                reinterpret_cast<float*>(sm + L::dx)[t - kSmRows] = __uint_as_float(pre);
            }
            if (idx + 1 < nvis) pre = scale_at(idx + 1);
            __syncthreads();   // expanded rows, scales visible
            // integer sums from kQ8Magic (magic_float): |Σ| <= 256 · 45 · 128 for isum and
            // 16 · 15 · 2,048 for the mins, both < 2^22
            int isum[NT][4], mins[NT][4];
            each(isum, [](int& x) { x = kQ8Magic; });
            each(mins, [](int& x) { x = kQ8Magic; });
            const uint8_t* as = sm + L::act + s * PAIRS * kSmRowE;
#pragma unroll 2
            for (int c = 0; c < 8; ++c) {
                // B, per 16 pairs: matrices (pairs 0-7, k 0-15), (0-7, 16-31), (8-15, 0-15), (8-15, 16-31)
                uint32_t a[4], b[NT / 2][4];
#pragma unroll
                for (int np = 0; np < NT / 2; ++np)
                    if (2 * np < NV)
                        ldmatrix_x4(b[np], as + pt.ldm_row(np, lane) * kSmRowE + c * 32 + ((lane >> 3) & 1) * 16);
                ldmatrix_x4(a, sm + L::exp + (wm + (lane & 7) + ((lane >> 3) & 1) * 8) * kSmRowE + c * 32 +
                                   (lane >> 4) * 16);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    if (nt < NV) mma_s8_acc(a, b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1], isum[nt]);
                if constexpr (MINS == 1) {
                    // sub-blocks 2c (k 0-15) and 2c + 1 (k 16-31) of rows gid, gid + 8: their
                    // mins (high nibbles of scale bytes 2c, 2c + 1) in every byte
                    const uint32_t s0 = *reinterpret_cast<const uint16_t*>(raw + (wm + gid) * 80 + 2 * c);
                    const uint32_t s1 = *reinterpret_cast<const uint16_t*>(raw + (wm + gid + 8) * 80 + 2 * c);
                    const uint32_t am[4] = {((s0 >> 4) & 0xF) * 0x01010101u, ((s1 >> 4) & 0xF) * 0x01010101u,
                                            (s0 >> 12) * 0x01010101u, (s1 >> 12) * 0x01010101u};
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        if (nt < NV) mma_s8_acc(am, b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1], mins[nt]);
                }
            }
            // mins: Σ_u (scale_u >> 4) · bsum_u per (row, pair)
            if constexpr (MINS == 0) {
                const int32_t* bsp = reinterpret_cast<const int32_t*>(sm + L::bs) + s * PAIRS * (L::bss / 4);
#pragma unroll 1
                for (int u4 = 0; u4 < 4; ++u4) {
                    uint32_t mw[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        mw[h] = (*reinterpret_cast<const uint32_t*>(raw + (wm + gid + 8 * h) * 80 + 4 * u4) >> 4) &
                                0x0F0F0F0Fu;
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        int4 bv[2];
#pragma unroll
                        for (int cc = 0; cc < 2; ++cc)
                            bv[cc] = *reinterpret_cast<const int4*>(bsp + (pt.base(nt) + 2 * tig + cc) * (L::bss / 4) + 4 * u4);
#pragma unroll
                        for (int k = 0; k < 4; ++k)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int4& v = bv[e & 1];
                                const int bsv = k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
                                mins[nt][e] += int((mw[e >> 1] >> (8 * k)) & 0xFF) * bsv;
                            }
                    }
                }
            }
            // MINS 2, A: the mins of rows gid, gid + 8, sub-blocks 4 tig .. + 3 (high nibbles of
            // the scale bytes); B (per tile): pair gid's bsum bytes of the same sub-blocks
            [[maybe_unused]] uint32_t am[2];
            if constexpr (MINS == 2) {
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    am[h] = (*reinterpret_cast<const uint32_t*>(raw + (wm + gid + 8 * h) * 80 + 4 * tig) >> 4) & 0x0F0F0F0Fu;
            }
            // the super-block's float step, as gemm_kq_kernel (and decode's lane 4j, and the
            // CPU's k_superblock) does it
            const float* sdx = reinterpret_cast<const float*>(sm + L::dx);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (nt >= NV) continue;
                int mn[4];
                if constexpr (MINS == 2) {
                    const uint8_t* bp = sm + L::split + (pt.base(nt) + gid) * 48 + 4 * tig;
                    mn[0] = mn[1] = mn[2] = mn[3] = 0;
                    mma_s8_k16(am, *reinterpret_cast<const uint32_t*>(bp + 16), mn);
#pragma unroll
                    for (int e = 0; e < 4; ++e) mn[e] = mn[e] * 128 + kQ8Magic;
                    mma_s8_k16(am, *reinterpret_cast<const uint32_t*>(bp), mn);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) mn[e] = mins[nt][e];
                }
                const float dx[2] = {sdx[pt.base(nt) + 2 * tig], sdx[pt.base(nt) + 2 * tig + 1]};
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float x = dx[e & 1];
                    const uint32_t r = wm + gid + 8 * (e >> 1);
                    const float dall = x * sdw[2 * r], dmin = x * sdw[2 * r + 1];
                    cur[nt][e] += fmaf(dall, magic_float(isum[nt][e]), -(dmin * magic_float(mn[e])));
                }
            }
        };

        float cur[NT][4];
        sum_superblocks<FLAT>(nsb, cur, step);
        cp_async_wait_all();
#pragma unroll
        for (int nt = 0; nt < NV; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t n = m0 + wm + gid + 8 * (e >> 1);
                const int c = pt.base(nt) + int(2 * tig) + (e & 1);
                if (n >= p.N || c >= cnt) continue;
                p.y[uint64_t(uint32_t(gp[c])) * p.y_stride + n] = cur[nt][e];
            }
    });
}



// ---- Q8_0 products staged through shared memory (DSV4_GEMM_SMEM_Q8=1, opt-in; warp-per-row
// order only, WT = 32) --------------------------------------------------------------------
// Same block tile as gemm_q8_0_kernel (64 weight rows × 32 activation rows) but 8 warps of
// 16 × 16 (8 accumulators a thread instead of 16, so ~half the registers). A stage is G
// leaves of the decode tree (leaf l = bitrev5(j): blocks l, l + 32, ...; G = 1 for K >= 3,073,
// else 2 or 4, so a stage holds 4 to 8 blocks a row) of the 64 weight rows and 32 activation
// rows, copied by cp.async while the previous stage's MMAs run; fragments come by ldmatrix,
// the scales through shared memory. Per output the float steps are those of leaf_sums +
// tree_push in the same order.
constexpr int kQ8MaxSlots = 8;   // blocks a row a stage: K <= 8192 (8 blocks a leaf)

__host__ __device__ constexpr int q8_leaves_per_stage(int cmax) { return cmax >= 4 ? 1 : cmax >= 2 ? 2 : 4; }
__host__ __device__ constexpr int q8_slots(int cmax) { return q8_leaves_per_stage(cmax) * cmax; }
__host__ __device__ constexpr int q8_stride(int slots) { return slots * 32 + 16; }   // odd 16-byte units
__host__ __device__ constexpr int q8_smem_bytes(int slots) {
    return 2 * (kBM + kBN) * q8_stride(slots) + (kBM + kBN) * slots * 4;
}

__global__ void __launch_bounds__(256, 2) gemm_q8_0_smem_kernel(Gemm p) {
    pdl_begin();
    extern __shared__ __align__(16) uint8_t sm[];
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wm = (warp & 3) * 16, wn = (warp >> 2) * 16;
    const uint64_t m0 = uint64_t(blockIdx.x) * kBM;
    const uint32_t n0 = blockIdx.y * kBN;
    const int nb = int(p.K / 32);
    const int cmax = (nb + 31) / 32, G = q8_leaves_per_stage(cmax), SL = G * cmax, stride = q8_stride(SL);
    uint8_t* wbuf = sm;                                                    // [2][64] rows of stride bytes
    uint8_t* abuf = sm + 2 * kBM * stride;                                 // [2][32]
    float* sdw = reinterpret_cast<float*>(sm + 2 * (kBM + kBN) * stride);  // [64][SL]
    float* sda = sdw + kBM * SL;                                           // [32][SL]
    const uint64_t goff = p.rpg ? ((p.row0 + m0) / p.rpg) * p.K : 0;
    auto leaf_count = [&](int j) {
        const int l = bitrev5(j);
        return l < nb ? (nb - l + 31) / 32 : 0;
    };
    auto wrow = [&](uint32_t r) { return p.row0 + min(m0 + r, p.N - 1); };   // rows past N: clamped
    auto arow = [&](uint32_t a) { return uint64_t(min(n0 + a, p.R - 1)); };
    // stage j0 / G: slot g * cmax + i holds block bitrev5(j0 + g) + 32 i (i < that leaf's count)
    auto issue = [&](int j0) {
        const int s = (j0 / G) & 1;
        for (int v = int(t); v < 192 * SL; v += 256) {
            const bool isw = v < 128 * SL;
            const int vv = isw ? v : v - 128 * SL, r = vv / (2 * SL), slot = (vv % (2 * SL)) >> 1, h = vv & 1;
            const int jl = j0 + slot / cmax, i = slot % cmax;
            if (i >= leaf_count(jl)) continue;
            const uint64_t k = uint64_t(bitrev5(jl) + 32 * i) * 32 + 16 * h;
            if (isw)
                cp_async16(wbuf + (s * kBM + r) * stride + slot * 32 + h * 16, p.wq + wrow(r) * p.K + k);
            else
                cp_async16(abuf + (s * kBN + r) * stride + slot * 32 + h * 16, p.aq + arow(r) * p.AL + goff + k);
        }
    };
    // scales of a stage: v < 64 SL: weight row v / SL, slot v % SL; then the activation rows
    float pre[3];
    auto load_scales = [&](int j0) {
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            const int v = int(t) + 256 * q;
            if (v >= 96 * SL) continue;
            const bool isw = v < 64 * SL;
            const int vv = isw ? v : v - 64 * SL, r = vv / SL, slot = vv % SL;
            const int jl = j0 + slot / cmax, i = slot % cmax;
            if (i >= leaf_count(jl)) continue;
            const int b = bitrev5(jl) + 32 * i;
            pre[q] = isw ? f16_to_f32(p.wd[wrow(r) * uint64_t(nb) + b])
                         : p.ad[arow(r) * (p.AL / 32) + goff / 32 + b];
        }
    };
    auto store_scales = [&]() {
#pragma unroll
        for (int q = 0; q < 3; ++q) {
            const int v = int(t) + 256 * q;
            if (v < 96 * SL) (v < 64 * SL ? sdw[v] : sda[v - 64 * SL]) = pre[q];   // [row][slot] either way
        }
    };

    issue(0);
    cp_async_commit();
    load_scales(0);
    float st[5][2][4], cur[2][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        if (j % G == 0) {
            cp_async_wait_all();
            __syncthreads();   // stage j / G landed for all; every warp is done with the last one
            if (j + G < 32) issue(j + G);
            cp_async_commit();
            store_scales();
            if (j + G < 32) load_scales(j + G);
            __syncthreads();   // scales visible
        }
        const int c = leaf_count(j), s = (j / G) & 1, slot0 = (j % G) * cmax;
        each(cur, [](float& x) { x = 0.0f; });
        const uint8_t* wb = wbuf + s * kBM * stride;
        const uint8_t* ab = abuf + s * kBN * stride;
        for (int i = 0; i < c; ++i) {
            const int slot = slot0 + i;
            uint32_t a[4], b[4];
            ldmatrix_x4(a, wb + (wm + (lane & 7) + ((lane >> 3) & 1) * 8) * stride + slot * 32 + (lane >> 4) * 16);
            ldmatrix_x4(b, ab + (wn + (lane & 7) + (lane >> 4) * 8) * stride + slot * 32 + ((lane >> 3) & 1) * 16);
            const float dw[2] = {sdw[(wm + gid) * SL + slot], sdw[(wm + gid + 8) * SL + slot]};
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                int d[4];
                const uint32_t bb[2] = {b[2 * nt], b[2 * nt + 1]};
                mma_s8(a, bb, d);
                const float da[2] = {sda[(wn + nt * 8 + 2 * tig) * SL + slot],
                                     sda[(wn + nt * 8 + 2 * tig + 1) * SL + slot]};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    cur[nt][e] = fmaf(dw[e >> 1] * da[e & 1], float(d[e]), cur[nt][e]);
            }
        }
        tree_push(j, st, cur);
    }
    cp_async_wait_all();
    store_tiles(p, m0 + wm, n0 + wn, gid, tig, cur);
}


// ---- Q8_0 products, staged and pipelined (DSV4_GEMM_Q8_V=1 and 2 (default); warp-per-row order,
// WT = 32) --------------------------------------------------------------------------------
// Why the register-fed kernel runs at ~3 % of the int8 tensor peak: per MMA each thread
// issues 3 four-byte global loads, 2 scale loads, and 4 int→float conversions (I2F: 16 a
// clock an SM, so 8 clocks an SM per MMA before anything else), and the first staged attempt
// (gemm_q8_0_smem_kernel) kept the I2F, fed 2 MMAs with 2 ldmatrix and 6 scalar scale loads
// (shared memory bound), and paid two barriers and runtime divisions per stage of 4 blocks.
// This kernel:
// - gets float(isum) without I2F: the MMA's accumulator input is 0x4B400000 (1.5 · 2^23 as
//   a float), so it returns isum + 0x4B400000, whose float is exactly 12,582,912 + isum
//   (|isum| <= 32 · 128 · 128 < 2^22 keeps it in [2^23, 2^24), where floats are the integers);
//   one float subtraction gives isum, the same value float(isum) gives: same bits.
// - stages 8 blocks a row a stage (the next 8 positions of decode's visiting sequence: leaf
//   bitrev5(j) of j = 0..31, its blocks leaf, leaf + 32, ... in order), 64 weight rows and 64
//   activation rows a block, by cp.async NS stages deep; 8 warps of 32 × 16 (2 × 2 MMA
//   tiles: 3 ldmatrix.x4 feed 4 MMAs); the scales staged as floats, in an order that gives
//   each thread its 4 weight and 4 activation scales of a block in two 16-byte loads.
// - is persistent: a block walks its tiles (activation tiles fastest, so the blocks in
//   flight share weight rows) with one pipeline across tile boundaries, so a short K (q_b:
//   4 stages a tile) does not pay the pipeline's fill for every tile.
// CM (1, 2, 4, 8) is decode's longest leaf, rounded up to a power of two (positions past a
// leaf's blocks are skipped), so a stage holds 8 / CM whole leaves and every tree level
// inside a stage is a constant; the stage's last leaf merges at a level known at run time
// (the same for the whole block).
constexpr int kQ2Rows = 64;                       // weight rows = activation rows a tile
constexpr int kQ2Slots = 8;                       // blocks a row a stage
constexpr int kQ2Stride = kQ2Slots * 32 + 16;     // a staged row: 17 16-byte units (odd: ldmatrix rows on distinct banks)
constexpr int kQ2StageBytes = 2 * kQ2Rows * kQ2Stride + 2 * kQ2Rows * kQ2Slots * 4;
constexpr int q8_pipe_smem(int stages) { return stages * kQ2StageBytes; }
static_assert(kQ2Rows == kBM, "gemm_q8_0_eligible's group check (rpg % kBM) covers the pipelined tiles");

__device__ __forceinline__ void mma_s8_magic(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int (&d)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kQ8Magic));
}
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Where the staged scales of a tile row go, so that an MMA thread reads its scales of a block
// as consecutive floats: weight row r = WM wmi + 16 mt + 8 h + gid (warps of WM rows, MT =
// WM / 16 m-tiles) -> WM wmi + 2 MT gid + 2 mt + h; activation row r = WN wni + 8 nt + 2 tig
// + c (warps of WN rows, NT = WN / 8 n-tiles) -> WN wni + 2 NT tig + 2 nt + c.
template <uint32_t WM>
__device__ __forceinline__ uint32_t scale_pos_w(uint32_t r) {
    constexpr uint32_t MT = WM / 16;
    return (r & ~(WM - 1)) + 2 * MT * (r & 7) + 2 * ((r >> 4) & (MT - 1)) + ((r >> 3) & 1);
}
template <uint32_t WN>
__device__ __forceinline__ uint32_t scale_pos_a(uint32_t r) {
    constexpr uint32_t NT = WN / 8;
    return (r & ~(WN - 1)) + 2 * NT * ((r >> 1) & 3) + 2 * ((r >> 3) & (NT - 1)) + (r & 1);
}
// A stage's scales through registers (the staged Q8_0 GEMMs): thread t takes block b (its
// slot t % SLOTS of the stage; b >= nb = K / 32: past K, zeros; anb = AL / 32) of weight rows m0 + t / SLOTS + RS u
// (u < 2) and activation rows r0 + t / SLOTS + RS (u - 2) (2 <= u < 2 + NA), RS = 256 / SLOTS; rows past N
// or R clamped. Stored as floats where the MMA threads read them (scale_pos_w / scale_pos_a,
// warps of WM weight rows and WN activation rows; ROWS weight rows and AROWS activation rows a
// slot; slot = t % SLOTS).
template <uint32_t SLOTS, uint32_t NA = 2>
__device__ __forceinline__ void load_stage_scales(const Gemm& p, uint32_t b, uint64_t m0, uint32_t r0, uint64_t goff,
                                                  uint32_t nb, uint64_t anb, uint32_t t, float (&pre)[2 + NA]) {
    constexpr uint32_t RS = 256 / SLOTS;
#pragma unroll
    for (uint32_t u = 0; u < 2 + NA; ++u) {
        const uint32_t r = t / SLOTS + RS * (u < 2 ? u : u - 2);
        pre[u] = 0.0f;
        if (b < nb)
            pre[u] = u < 2 ? f16_to_f32(p.wd[(p.row0 + min(m0 + r, p.N - 1)) * nb + b])
                           : p.ad[uint64_t(min(r0 + r, p.R - 1)) * anb + goff / 32 + b];
    }
}
template <uint32_t SLOTS, uint32_t ROWS, uint32_t WM, uint32_t WN, uint32_t NA = 2, uint32_t AROWS = ROWS>
__device__ __forceinline__ void store_stage_scales(float* sdw, uint32_t t, uint32_t slot, const float (&pre)[2 + NA]) {
    constexpr uint32_t RS = 256 / SLOTS;
    float* sda = sdw + SLOTS * ROWS;
#pragma unroll
    for (uint32_t u = 0; u < 2 + NA; ++u) {
        const uint32_t r = t / SLOTS + RS * (u < 2 ? u : u - 2);
        if (u < 2) sdw[slot * ROWS + scale_pos_w<WM>(r)] = pre[u];
        else sda[slot * AROWS + scale_pos_a<WN>(r)] = pre[u];
    }
}
// A warp's MT × NT MMA tiles of results (element e of tile (mt, nt): weight row m0 + 16 mt
// + gid + 8 (e >> 1), activation row r0 + 8 nt + 2 tig + (e & 1)) into p.y, rows past N or R
// skipped (the flat kernels: Gemm or FGemm).
template <typename P, int MT, int NT>
__device__ __forceinline__ void store_warp_tiles(const P& p, uint64_t m0, uint32_t r0, uint32_t gid, uint32_t tig,
                                                 const float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t n = m0 + 16 * mt + gid + 8 * (e >> 1);
                const uint32_t r = r0 + 8 * nt + 2 * tig + (e & 1);
                if (n < p.N && r < p.R) p.y[uint64_t(r) * p.y_stride + n] = acc[mt][nt][e];
            }
}
// A cp.async pipeline's prologue: stages 0 .. NS - 2 in flight, stage 0's scales stored,
// stage 1's loaded into registers (n: the block's stages).
template <int NS, typename I, typename L, typename S>
__device__ __forceinline__ void pipe_prologue(uint32_t n, I&& issue, L&& load_scales, S&& store_scales) {
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (uint32_t(s) < n) issue(uint32_t(s));
        cp_async_commit();
    }
    if (n > 0) {
        load_scales(0u);
        store_scales(0u);
    }
    if (n > 1) load_scales(1u);
}
// The start of stage s of n in that pipeline: wait for its copies, then keep NS - 1 stages in
// flight, store the next stage's scales (its buffer's last reader was stage s + 1 - NS <= s -
// 1, done by the barrier) and load the one after into registers.
template <int NS, typename I, typename L, typename S>
__device__ __forceinline__ void pipe_stage(uint32_t s, uint32_t n, I&& issue, L&& load_scales, S&& store_scales) {
    cp_async_wait_group<NS - 2>();
    __syncthreads();   // stage s landed for all; every warp is done with stage s - 1
    if (s + NS - 1 < n) issue(s + NS - 1);
    cp_async_commit();
    if (s + 1 < n) store_scales(s + 1);
    if (s + 2 < n) load_scales(s + 2);
}

// tree_push with the level (trailing zero bits of j + 1) given: merged with the LV finished
// subtrees below it, then kept at height LV (LV = L: cur is the root). A constant level
// (after unrolling) folds the switch; a run-time one is the same for the whole block, so the
// switch takes one uniform branch to straight-line code for that level. (Unrolled over every
// level with run-time conditions instead, each leaf paid for the predicated adds and moves
// of all five levels: up to 160 instructions a thread, beside 16 to 32 FMAs an output per
// leaf in the float GEMM, a stage's MMAs in the Q8_0 one.)
template <int LV, int L, typename A>
__device__ __forceinline__ void tree_merge(A (&st)[L], A& cur) {
#pragma unroll
    for (int h = 0; h < LV; ++h) each2(cur, st[h], [](float& a, float& b) { a = b + a; });
    if constexpr (LV < L) each2(st[LV], cur, [](float& a, float& b) { a = b; });
}
template <int L, typename A>
__device__ __forceinline__ void tree_push_level(int level, A (&st)[L], A& cur) {
    static_assert(L == 5, "stacks of five subtrees (32 leaves)");
    switch (level) {
        case 0: tree_merge<0>(st, cur); break;
        case 1: tree_merge<1>(st, cur); break;
        case 2: tree_merge<2>(st, cur); break;
        case 3: tree_merge<3>(st, cur); break;
        case 4: tree_merge<4>(st, cur); break;
        default: tree_merge<5>(st, cur); break;
    }
}

__host__ __device__ constexpr int ctz_c(int x) { return (x & 1) ? 0 : 1 + ctz_c(x >> 1); }

__device__ __forceinline__ uint32_t bitrev5d(uint32_t j) {
    return ((j & 1) << 4) | ((j & 2) << 2) | (j & 4) | ((j & 8) >> 2) | ((j & 16) >> 4);
}

// NS: stages in flight (3: 117 KB, one block an SM; 2: 78 KB, two blocks an SM where the
// registers allow: MINB = 2 caps them at 128).
template <int CM, int NS, int MINB>
__global__ void __launch_bounds__(256, MINB) gemm_q8_0_pipe_kernel(Gemm p, uint32_t tiles_r, uint32_t tiles) {
    pdl_begin();
    constexpr int G = kQ2Slots / CM;                                       // leaves a stage
    constexpr int LG = G >= 8 ? 3 : G >= 4 ? 2 : G >= 2 ? 1 : 0;           // log2 G
    constexpr int LC = CM >= 8 ? 3 : CM >= 4 ? 2 : CM >= 2 ? 1 : 0;        // log2 CM
    constexpr int NST = 32 * CM / kQ2Slots;                                // stages a tile
    extern __shared__ __align__(16) uint8_t sm[];
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wmi = warp & 1, wni = warp >> 1;   // warp's 32 weight rows, 16 activation rows
    const uint32_t nb = uint32_t(p.K / 32);
    const bool full = nb == 32u * CM;                 // every position holds a block
    const uint32_t mine = tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const uint32_t nwork = mine * NST;                // stages of this block, all its tiles
    const uint64_t anb = p.AL / 32;

    struct TileAt {
        uint64_t m0;   // first weight row (from row0)
        uint32_t r0;   // first activation row
        uint64_t goff; // grouped product: the group's values in an activation row
    };
    auto tile_at = [&](uint32_t w) {
        const uint32_t tile = blockIdx.x + (w / NST) * gridDim.x;
        TileAt a;
        a.m0 = uint64_t(tile / tiles_r) * kQ2Rows;
        a.r0 = (tile % tiles_r) * kQ2Rows;
        // a tile's rows lie in one group (64 divides rpg: checked by the launcher)
        a.goff = p.rpg ? ((p.row0 + a.m0) / p.rpg) * p.K : 0;
        return a;
    };
    // the block at position q of a leaf sequence (q = 8 st + slot), or nb past the leaf
    auto block_at = [&](uint32_t q) {
        const uint32_t b = bitrev5d(q >> LC) + 32u * (q & (CM - 1));
        return b < nb ? b : nb;
    };

    // copies: 16-byte chunk (t & 15) = (slot, half) of staged rows (t >> 4) + 16 u, u < 8
    // (rows 0-63 weights, 64-127 activations)
    const uint32_t cslot = (t & 15) >> 1, chalf = t & 1;
    auto issue = [&](uint32_t w) {
        const TileAt ta = tile_at(w);
        const uint32_t b = block_at((w % NST) * kQ2Slots + cslot);
        if (b >= nb) return;
        uint8_t* dst = sm + (w % NS) * kQ2StageBytes + (t >> 4) * kQ2Stride + (t & 15) * 16;
        const uint64_t k = uint64_t(b) * 32 + chalf * 16;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const uint32_t r = (t >> 4) + 16 * (u & 3);
            const int8_t* src = u < 4 ? p.wq + (p.row0 + min(ta.m0 + r, p.N - 1)) * p.K + k   // rows past N, R:
                                      : p.aq + uint64_t(min(ta.r0 + r, p.R - 1)) * p.AL + ta.goff + k;   // clamped
            cp_async16(dst + u * 16 * kQ2Stride, src);
        }
    };
    // scales: slot (t & 7) of rows (t >> 3) + 32 u, u < 4 (u < 2: weights), loaded a stage
    // early into registers, stored as floats in the order the MMA threads read them
    const uint32_t sslot = t % kQ2Slots;
    float pre[4];
    auto load_scales = [&](uint32_t w) {
        const TileAt ta = tile_at(w);
        load_stage_scales<kQ2Slots>(p, block_at((w % NST) * kQ2Slots + sslot), ta.m0, ta.r0, ta.goff, nb, anb, t, pre);
    };
    auto store_scales = [&](uint32_t w) {   // (warps of 32 weight rows, 16 activation rows)
        store_stage_scales<kQ2Slots, kQ2Rows, 32, 16>(
            reinterpret_cast<float*>(sm + (w % NS) * kQ2StageBytes + 2 * kQ2Rows * kQ2Stride), t, sslot, pre);
    };

    pipe_prologue<NS>(nwork, issue, load_scales, store_scales);

    float st[5][2][2][4], cur[2][2][4];
    for (uint32_t w = 0; w < nwork; ++w) {
        pipe_stage<NS>(w, nwork, issue, load_scales, store_scales);

        const uint32_t sti = w % NST;
        const uint8_t* wb = sm + (w % NS) * kQ2StageBytes;
        const uint8_t* ab = wb + kQ2Rows * kQ2Stride;
        const float* sdw = reinterpret_cast<const float*>(wb + 2 * kQ2Rows * kQ2Stride);
        const float* sda = sdw + kQ2Slots * kQ2Rows;
        // ldmatrix rows: A (rows 0-7 / 8-15, k 0-15 / 16-31), B (rows 0-7 / 8-15 of the pair of
        // n-tiles, k 0-15 / 16-31)
        const uint8_t* arow = wb + (32 * wmi + (lane & 7) + ((lane >> 3) & 1) * 8) * kQ2Stride + (lane >> 4) * 16;
        const uint8_t* brow = ab + (16 * wni + (lane & 7) + (lane >> 4) * 8) * kQ2Stride + ((lane >> 3) & 1) * 16;
#pragma unroll
        for (int s = 0; s < kQ2Slots; ++s) {
            const int i = s % CM, g = s / CM;   // chain position, leaf of the stage
            if (i == 0) each(cur, [](float& x) { x = 0.0f; });
            if (full || block_at(sti * kQ2Slots + s) < nb) {
                uint32_t a[2][4], b[4];
                ldmatrix_x4(a[0], arow + s * 32);
                ldmatrix_x4(a[1], arow + 16 * kQ2Stride + s * 32);
                ldmatrix_x4(b, brow + s * 32);
                const float4 dw4 = *reinterpret_cast<const float4*>(sdw + s * kQ2Rows + 32 * wmi + 4 * gid);
                const float4 da4 = *reinterpret_cast<const float4*>(sda + s * kQ2Rows + 16 * wni + 4 * tig);
                const float dw[2][2] = {{dw4.x, dw4.y}, {dw4.z, dw4.w}}, da[2][2] = {{da4.x, da4.y}, {da4.z, da4.w}};
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt) {
                        int d[4];
                        mma_s8_magic(a[mt], b[2 * nt], b[2 * nt + 1], d);
                        // d[e]: weight row gid + 8 (e >> 1), activation row 2 tig + (e & 1)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float isum = magic_float(d[e]);   // exact: float(isum)
                            cur[mt][nt][e] = fmaf(dw[mt][e >> 1] * da[nt][e & 1], isum, cur[mt][nt][e]);
                        }
                    }
            }
            if (i == CM - 1) {
                // leaf j = G sti + g: its level is trailing_zeros(j + 1)
                const int level = g < G - 1 ? ctz_c(g + 1) : LG + __ffs(int(sti) + 1) - 1;
                tree_push_level(level, st, cur);
            }
        }
        if (sti == NST - 1) {   // the tile's last leaf: cur is the root, the row's result
            const TileAt ta = tile_at(w);
            store_tiles(p, ta.m0 + 32 * wmi, ta.r0 + 16 * wni, gid, tig, cur);
        }
    }
    cp_async_wait_all();
}


// Prompt rounds' Q8_0 order (gemm_prefill_order: DSV4_PREFILL_FLAT). The kernels above add a
// row's block sums in decode's tree, which costs a 5-deep stack of partial sums an output
// and caps their tiles at 64 × 64 (4 MMAs a warp per 32-value block, ~110 TOPS of int8). A
// prompt's rows need not equal decode's bits (docs/validation.md: ~1e-5 where the order
// differs; the chunkings of a prompt stay bit-identical, see forward.cpp), so they take this
// kernel: y = Σ_b (dw_b·da_b)·I_b with one fmaf a block in k order from 0 — the same
// operations for a row in any tile, batch or chunk (the host mirrors them exactly in
// TensorCoreQ8_0FlatOrder). A block holds 128 weight rows × BN activation rows; a stage is 4
// blocks (128 values) of both, copied by cp.async NS stages ahead; the scales go through
// registers a stage ahead and are stored as floats in the order the MMA threads read them.
// - BN = 128: a warp 64 × 32 (16 MMAs a block), 238 registers, 4 stages: one block (8 warps)
//   an SM. Run 76 (Nsight Compute): issue 0.47 a scheduler with 2 warps each, ~0.8 of them
//   eligible: latency-bound at ~200 TOPS.
// - BN = 64: a warp 32 × 32 (8 MMAs a block, the same float steps a result), registers capped
//   for two blocks an SM (16 warps), 3 stages (2 × 92 KB).
constexpr int kFlatBM = 128;                                   // weight rows a tile
constexpr int kFlatSlots = 4;                                  // 32-value blocks a stage
constexpr int kFlatStride = kFlatSlots * 32 + 16;              // a staged row: 9 16-byte units (ldmatrix rows on distinct banks)
constexpr int flat_stage_bytes(int bn) { return (kFlatBM + bn) * (kFlatStride + kFlatSlots * 4); }
constexpr int flat_smem(int stages, int bn) { return stages * flat_stage_bytes(bn); }

// One 32-value block of a flat warp tile (gemm_q8_0_flat_kernel, gemm_q8_0_flat_lean_kernel):
// the MT × NT MMAs and their float steps in k order, acc = fmaf(dw·da, I, acc); dw, da this
// thread's 2 MT weight and 2 NT activation scales (scale_pos_w / _a). Element e of tile
// (mt, nt): weight row 16 mt + gid + 8 (e >> 1), activation row 8 nt + 2 tig + (e & 1).
template <int MT, int NT>
__device__ __forceinline__ void flat_q8_block(const uint32_t (&a)[MT][4], const uint32_t (&b)[NT / 2][4],
                                              const float (&dw)[2 * MT], const float (&da)[2 * NT],
                                              float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            int d[4];
            mma_s8_magic(a[mt], b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1], d);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float isum = magic_float(d[e]);   // exact: float(isum)
                acc[mt][nt][e] = fmaf(dw[2 * mt + (e >> 1)] * da[2 * nt + (e & 1)], isum, acc[mt][nt][e]);
            }
        }
}

template <int NS, int MINB, int BN>
__global__ void __launch_bounds__(256, MINB) gemm_q8_0_flat_kernel(Gemm p) {
    pdl_begin();
    constexpr int WM = BN == 128 ? 64 : 32, WN = 32;           // a warp's weight and activation rows
    constexpr int MT = WM / 16, NT = WN / 8, WMN = kFlatBM / WM;
    constexpr int SB = flat_stage_bytes(BN), UW = kFlatBM / 32, UA = BN / 32, NA = BN / 64;
    static_assert(WMN * (BN / WN) == 8 && (BN == 64 || BN == 128), "flat tile: 8 warps");
    extern __shared__ __align__(16) uint8_t sm[];
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wmi = warp % WMN, wni = warp / WMN;   // the warp's weight rows WM wmi.., activation rows WN wni..
    const uint64_t m0 = uint64_t(blockIdx.y) * kFlatBM;
    const uint32_t r0 = blockIdx.x * BN;
    const uint32_t nb = uint32_t(p.K / 32), nst = (nb + kFlatSlots - 1) / kFlatSlots;
    const uint64_t anb = p.AL / 32;
    // a tile's weight rows lie in one group (kFlatBM divides rpg: checked by the launcher)
    const uint64_t goff = p.rpg ? ((p.row0 + m0) / p.rpg) * p.K : 0;

    // copies: 16-byte chunk c = t & 7 (block c / 2, half c & 1) of staged rows (t >> 3) + 32 u
    // (weights u < UW, then activations)
    auto issue = [&](uint32_t s) {
        const uint32_t c = t & 7, b = s * kFlatSlots + c / 2;
        if (b >= nb) return;   // past K: never read (the MMA loop stops at nb)
        uint8_t* dst = sm + (s % NS) * SB + (t >> 3) * kFlatStride + c * 16;
        const uint64_t k = uint64_t(b) * 32 + (c & 1) * 16;
#pragma unroll
        for (int u = 0; u < UW + UA; ++u) {
            const bool wt = u < UW;
            const uint32_t r = (t >> 3) + 32 * (wt ? u : u - UW);
            const int8_t* src = wt ? p.wq + (p.row0 + min(m0 + r, p.N - 1)) * p.K + k   // rows past N, R:
                                   : p.aq + uint64_t(min(r0 + r, p.R - 1)) * p.AL + goff + k;   // clamped
            cp_async16(dst + (wt ? 32 * u : kFlatBM + 32 * (u - UW)) * kFlatStride, src);
        }
    };
    // scales: block (t & 3) of the stage, weight rows (t >> 2) + 64 u (u < 2), activation rows
    // (t >> 2) + 64 (u - 2)
    const uint32_t sslot = t % kFlatSlots;
    float pre[2 + NA];
    auto load_scales = [&](uint32_t s) {
        load_stage_scales<kFlatSlots, NA>(p, s * kFlatSlots + sslot, m0, r0, goff, nb, anb, t, pre);
    };
    auto store_scales = [&](uint32_t s) {
        store_stage_scales<kFlatSlots, kFlatBM, WM, WN, NA, BN>(
            reinterpret_cast<float*>(sm + (s % NS) * SB + (kFlatBM + BN) * kFlatStride), t, sslot, pre);
    };

    pipe_prologue<NS>(nst, issue, load_scales, store_scales);

    float acc[MT][NT][4];
    each(acc, [](float& x) { x = 0.0f; });
    // ldmatrix rows: A (rows 0-7 / 8-15, k 0-15 / 16-31), B (rows 0-7 / 8-15 of an n-tile pair, k 0-15 / 16-31)
    const uint32_t aoff = (WM * wmi + (lane & 7) + ((lane >> 3) & 1) * 8) * kFlatStride + (lane >> 4) * 16;
    const uint32_t boff = kFlatBM * kFlatStride + (WN * wni + (lane & 7) + (lane >> 4) * 8) * kFlatStride +
                          ((lane >> 3) & 1) * 16;
    for (uint32_t s = 0; s < nst; ++s) {
        pipe_stage<NS>(s, nst, issue, load_scales, store_scales);

        const uint8_t* st = sm + (s % NS) * SB;
        const float* sdw = reinterpret_cast<const float*>(st + (kFlatBM + BN) * kFlatStride);
        const float* sda = sdw + kFlatSlots * kFlatBM;
#pragma unroll
        for (int j = 0; j < kFlatSlots; ++j) {
            if (s * kFlatSlots + j >= nb) break;   // (the block's last stage may be short)
            uint32_t a[MT][4], b[NT / 2][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], st + aoff + mt * 16 * kFlatStride + j * 32);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) ldmatrix_x4(b[np], st + boff + np * 16 * kFlatStride + j * 32);
            // this thread's 2 MT weight and 2 NT activation scales, consecutive (scale_pos_w / _a)
            float dw[2 * MT], da[2 * NT];
            const float4* w4 = reinterpret_cast<const float4*>(sdw + j * kFlatBM + WM * wmi + 2 * MT * gid);
            const float4* a4 = reinterpret_cast<const float4*>(sda + j * BN + WN * wni + 2 * NT * tig);
#pragma unroll
            for (int q = 0; q < MT / 2; ++q) {
                const float4 v = w4[q];
                dw[4 * q] = v.x, dw[4 * q + 1] = v.y, dw[4 * q + 2] = v.z, dw[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int q = 0; q < NT / 2; ++q) {
                const float4 v = a4[q];
                da[4 * q] = v.x, da[4 * q + 1] = v.y, da[4 * q + 2] = v.z, da[4 * q + 3] = v.w;
            }
            flat_q8_block(a, b, dw, da, acc);
        }
    }
    cp_async_wait_all();
    store_warp_tiles(p, m0 + WM * wmi, r0 + WN * wni, gid, tig, acc);
}

// gemm_q8_0_flat_kernel<3, 2, 64> with the per-stage overhead cut (DSV4_FLAT_LEAN, on by
// default): the same operations on the same operands in the same order, so the same bits.
// Nsight Compute (q_b): 20.9 instructions an MMA, issue-bound (0.60 a cycle, 1.44 "not
// selected" an issue). A 32-value block's own work is 111 instructions a warp (4 ldmatrix, 3
// scale loads, 8 MMAs, 96 float steps): 444 of the stage loop's 671 SASS instructions; the
// rest recomputed per stage the % NS of three stage indices, every cp.async address, the
// scales' shared offsets (scale_pos_w / _a) and global addresses, the ldmatrix bases and a k
// check per block. Here the thread's offsets are computed once (the global ones as 32-bit
// offsets from the tile's first rows, clamped by one VIADDMNMX: 64-bit pointers spilled at
// the 128-register cap), a stage adds its byte offset (rotating, no division) and its k, and
// the stages whose copies, scales and blocks all lie below K (all but the last NS - 1 or NS)
// run without checks: 515 SASS instructions a stage (16.1 an MMA; the checked ones 557), 128
// registers, no spills.
// At the cap the compilers' choices are fragile (the same source with small changes: 526 to
// 598, or spills); the helpers below pin them: addresses added in PTX, shared memory through
// 32-bit addresses, the MMA threads' four bases kept opaque (pin) so they stay hoisted.
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// base + E off (one mad in PTX: otherwise the compiler splits a stage's base into its parts
// and adds them per address), and global loads from such addresses
template <int E>
__device__ __forceinline__ uint64_t addr_off(uint64_t base, uint32_t off) {
    uint64_t r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(off), "n"(E), "l"(base));
    return r;
}
__device__ __forceinline__ float ld_f16_as_f32(uint64_t a) {
    uint16_t h;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(h) : "l"(a));
    return f16_to_f32(h);
}
__device__ __forceinline__ float ld_f32(uint64_t a) {
    float x;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(x) : "l"(a));
    return x;
}
// x, opaque to the compiler (computed where it stands, not again inside a loop)
__device__ __forceinline__ uint32_t pin(uint32_t x) {
    asm("" : "+r"(x));
    return x;
}
__device__ __forceinline__ void st_shared_f32(uint32_t a, float x) {
    asm volatile("st.shared.f32 [%0], %1;" ::"r"(a), "f"(x) : "memory");
}
__device__ __forceinline__ float4 ld_shared_f32x4(uint32_t a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ void ldmatrix_x4_s(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

template <int NS>
__global__ void __launch_bounds__(256, 2) gemm_q8_0_flat_lean_kernel(Gemm p) {
    pdl_begin();
    constexpr int BN = 64, WM = 32, WN = 32, MT = 2, NT = 4, WMN = 4;
    constexpr uint32_t SB = flat_stage_bytes(BN), SC = (kFlatBM + BN) * kFlatStride;   // a stage; its scales
    static_assert(NS >= 3, "a stage loads the scales of the stage 2 ahead");
    extern __shared__ __align__(16) uint8_t sm[];
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wmi = warp % WMN, wni = warp / WMN;
    const uint64_t m0 = uint64_t(blockIdx.y) * kFlatBM;
    const uint32_t r0 = blockIdx.x * BN;
    const uint32_t nb = uint32_t(p.K / 32), nst = (nb + kFlatSlots - 1) / kFlatSlots, nfull = nb / kFlatSlots;
    const uint64_t anb = p.AL / 32;
    const uint64_t goff = p.rpg ? ((p.row0 + m0) / p.rpg) * p.K : 0;
    const uint32_t sm0 = smem_addr(sm);

    // global addresses: the tile's first rows (the block's) + a thread's 32-bit offset (K, AL <
    // 2^24: the launcher checks), rows past N or R clamped as there (to the tile's last row)
    const uint64_t wt = reinterpret_cast<uint64_t>(p.wq + (p.row0 + m0) * p.K);
    const uint64_t at = reinterpret_cast<uint64_t>(p.aq + uint64_t(r0) * p.AL + goff);
    const uint32_t wlast = uint32_t(min(p.N - 1 - m0, uint64_t(kFlatBM - 1)));   // the tile's last rows
    const uint32_t alast = min(p.R - 1 - r0, uint32_t(BN - 1));
    // copies (as gemm_q8_0_flat_kernel): chunk c = t & 7 of staged rows (t >> 3) + 32 u, weights
    // u < 4 then activations; stage s reads k = 128 s + 16 c of each. Row offsets: min(the
    // first one + 32 u rows, the last row's) (one VIADDMNMX)
    const uint32_t c = t & 7, cdst = sm0 + (t >> 3) * kFlatStride + c * 16;
    const uint32_t K32 = uint32_t(p.K), AL32 = uint32_t(p.AL);
    const uint32_t wsrc = (t >> 3) * K32 + c * 16, wlim = wlast * K32 + c * 16;
    const uint32_t asrc = (t >> 3) * AL32 + c * 16, alim = alast * AL32 + c * 16;
    auto issue = [&](uint32_t s, uint32_t so, bool full) {
        if (!full && s * kFlatSlots + c / 2 >= nb) return;
        const uint64_t k = uint64_t(s) * (kFlatSlots * 32), wk = wt + k, ak = at + k;
#pragma unroll
        for (int u = 0; u < 6; ++u)
            cp_async16_s(cdst + so + u * 32 * kFlatStride,
                         reinterpret_cast<const void*>(
                             u < 4 ? addr_off<1>(wk, __viaddmin_u32(wsrc, 32 * u * K32, wlim))
                                   : addr_off<1>(ak, __viaddmin_u32(asrc, 32 * (u - 4) * AL32, alim))));
    };
    // scales (as load_stage_scales / store_stage_scales): block t & 3 of the stage, weight rows
    // t / 4 and t / 4 + 64 (stored 64 floats apart: scale_pos_w), activation row t / 4
    const uint32_t sslot = t % kFlatSlots;
    const uint64_t wdt = reinterpret_cast<uint64_t>(p.wd + (p.row0 + m0) * nb);
    const uint64_t adt = reinterpret_cast<uint64_t>(p.ad + uint64_t(r0) * anb + goff / 32);
    const uint32_t wso0 = min(t >> 2, wlast) * nb + sslot, wso1 = min((t >> 2) + 64, wlast) * nb + sslot,
                   aso = min(t >> 2, alast) * uint32_t(anb) + sslot;
    float pre[3];
    auto load_scales = [&](uint32_t s, bool full) {
        const uint32_t b = s * kFlatSlots;
        const bool in = full || b + sslot < nb;
        const uint64_t wb = wdt + 2 * b, ab = adt + 4 * b;
        pre[0] = in ? ld_f16_as_f32(addr_off<2>(wb, wso0)) : 0.0f;
        pre[1] = in ? ld_f16_as_f32(addr_off<2>(wb, wso1)) : 0.0f;
        pre[2] = in ? ld_f32(addr_off<4>(ab, aso)) : 0.0f;
    };
    const uint32_t sws = sm0 + SC + 4 * (sslot * kFlatBM + scale_pos_w<WM>(t >> 2));
    const uint32_t sas = sm0 + SC + 4 * (kFlatSlots * kFlatBM + sslot * BN + scale_pos_a<WN>(t >> 2));
    auto store_scales = [&](uint32_t so) {
        st_shared_f32(sws + so, pre[0]);
        st_shared_f32(sws + so + 4 * 64, pre[1]);
        st_shared_f32(sas + so, pre[2]);
    };
    // the MMA threads' reads: ldmatrix rows (as gemm_q8_0_flat_kernel) and scales
    const uint32_t aoff = pin(sm0 + (WM * wmi + (lane & 7) + ((lane >> 3) & 1) * 8) * kFlatStride + (lane >> 4) * 16);
    const uint32_t boff = pin(sm0 + kFlatBM * kFlatStride + (WN * wni + (lane & 7) + (lane >> 4) * 8) * kFlatStride +
                              ((lane >> 3) & 1) * 16);
    const uint32_t rws = pin(sm0 + SC + 4 * (WM * wmi + 2 * MT * gid));
    const uint32_t ras = pin(sm0 + SC + 4 * (kFlatSlots * kFlatBM + WN * wni + 2 * NT * tig));
    float acc[MT][NT][4];
    auto compute = [&](uint32_t so, uint32_t jn) {   // blocks 0 .. jn - 1 of the stage at so
#pragma unroll
        for (uint32_t j = 0; j < kFlatSlots; ++j) {
            if (j >= jn) break;
            uint32_t a[MT][4], b[NT / 2][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldmatrix_x4_s(a[mt], aoff + so + mt * 16 * kFlatStride + j * 32);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) ldmatrix_x4_s(b[np], boff + so + np * 16 * kFlatStride + j * 32);
            float dw[2 * MT], da[2 * NT];
#pragma unroll
            for (int q = 0; q < MT / 2; ++q) {
                const float4 v = ld_shared_f32x4(rws + so + 4 * j * kFlatBM + 16 * q);
                dw[4 * q] = v.x, dw[4 * q + 1] = v.y, dw[4 * q + 2] = v.z, dw[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int q = 0; q < NT / 2; ++q) {
                const float4 v = ld_shared_f32x4(ras + so + 4 * j * BN + 16 * q);
                da[4 * q] = v.x, da[4 * q + 1] = v.y, da[4 * q + 2] = v.z, da[4 * q + 3] = v.w;
            }
            flat_q8_block(a, b, dw, da, acc);
        }
    };

    // pipe_prologue
#pragma unroll
    for (uint32_t s = 0; s < NS - 1; ++s) {
        if (s < nst) issue(s, s * SB, s < nfull);
        cp_async_commit();
    }
    if (nst > 0) {
        load_scales(0, nfull > 0);
        store_scales(0);
    }
    if (nst > 1) load_scales(1, nfull > 1);
    each(acc, [](float& x) { x = 0.0f; });

    // stage s's buffer at rd = (s % NS) SB; its scales go to nx (stage s + 1), its copies to pv
    // (stage s + NS - 1)
    auto next = [](uint32_t o) { return o == (NS - 1) * SB ? 0u : o + SB; };
    auto prev = [](uint32_t o, uint32_t n) { return NS == 3 ? 3 * SB - o - n : o == 0 ? (NS - 1) * SB : o - SB; };
    uint32_t s = 0, rd = 0;
    for (; s + NS - 1 < nfull; ++s) {   // every copy, scale and block of the stage below K
        const uint32_t nx = next(rd), pv = prev(rd, nx);
        cp_async_wait_group<NS - 2>();
        __syncthreads();   // stage s landed for all; every warp is done with stage s - 1
        issue(s + NS - 1, pv, true);
        cp_async_commit();
        store_scales(nx);
        load_scales(s + 2, true);
        compute(rd, kFlatSlots);
        rd = nx;
    }
    for (; s < nst; ++s) {   // the last NS - 1 stages, NS with a short last one (pipe_stage's checks)
        const uint32_t nx = next(rd), pv = prev(rd, nx);
        cp_async_wait_group<NS - 2>();
        __syncthreads();
        if (s + NS - 1 < nst) issue(s + NS - 1, pv, s + NS - 1 < nfull);
        cp_async_commit();
        if (s + 1 < nst) store_scales(nx);
        if (s + 2 < nst) load_scales(s + 2, s + 2 < nfull);
        compute(rd, min(uint32_t(kFlatSlots), nb - s * kFlatSlots));
        rd = nx;
    }
    cp_async_wait_all();
    store_warp_tiles(p, m0 + WM * wmi, r0 + WN * wni, gid, tig, acc);
}

}  // namespace

namespace {

// DSV4_CUDA_TC=0 keeps every product on the decode kernels (measurements).
bool tensor_cores_on() {
    static const bool on = env_switch("DSV4_CUDA_TC", true);
    return on;
}

// DSV4_GEMM_SMEM=0 keeps the register-fed tensor-core kernels (gemm_kq_kernel,
// gemm_q8_0_kernel) instead of the shared-memory staged ones (IQ2_XXS, Q2_K experts; Q8_0
// of decode's warp-per-row order); =2 stages them as before run 38 (one copy of the IQ2_XXS
// tables instead of the replicated ones, the Q2_K mins by scalar sums of the staged bsums
// instead of MMAs: the same bits); gemm_smem_override (tests) wins.
int g_smem_override = -1;
int smem_mode() {
    static const int mode = env_switch("DSV4_GEMM_SMEM", true) ? std::max(1, env_int("DSV4_GEMM_SMEM", 1)) : 0;
    return g_smem_override >= 0 ? g_smem_override : mode;
}
bool smem_on() { return smem_mode() != 0; }
// The staged Q8_0 kernel is opt-in (DSV4_GEMM_SMEM_Q8=1; tests force it with the override):
// on the H200 it took twice the register-fed kernel's time for out_a, q_b and out_b (run 27:
// 12.8 vs 5.8, 9.7 vs 4.6, 7.9 vs 5.5 us/token), while the staged expert kernels halved theirs.
bool smem_q8_on() {
    static const bool on = env_switch("DSV4_GEMM_SMEM_Q8", false);
    return g_smem_override >= 0 ? g_smem_override != 0 : on;
}

template <int NW, bool REP, bool FLAT = false, bool NIB = false>
bool iq2_smem_ready(cudaStream_t s) {
    static bool ready = false;
    return smem_ready(reinterpret_cast<const void*>(gemm_iq2_smem_kernel<NW, REP, FLAT, NIB>),
                      Iq2Smem<NW, REP, FLAT>::bytes, ready, s);
}
// The FLAT kernel's expansion from the grid as codes (NIB): on by default since run 152 (the same
// bits: ExpertsPromptOrderEqualCpuDot; a 2,048-token chunk's gate+up 4.29 against 4.39 µs a
// token, 43 layers 4,636 against 4,607 tok/s); DSV4_IQ2_NIB=0 the grid's 8-byte rows,
// gemm_iq2_nib_override (tests) wins.
int g_iq2_nib_override = -1;
bool iq2_nib() {
    static const bool env = env_switch("DSV4_IQ2_NIB", true);
    return g_iq2_nib_override >= 0 ? g_iq2_nib_override != 0 : env;
}
// The staged IQ2_XXS kernel for gate (NW = 1) or gate+up (NW = 2), replicated tables or not;
// groups of 64 pairs (flat: k order) take the FLAT kernel (replicated tables, also for
// DSV4_GEMM_SMEM=2: it has no other form). False when its shared memory cannot be raised yet
// (a capture first).
template <int NW>
bool launch_iq2_smem(const KqGemm& p, uint64_t N, uint32_t cap, bool flat, cudaStream_t s) {
    const dim3 grid(uint32_t((N + kSmRows - 1) / kSmRows), cap), block(256);
    if (flat && iq2_nib()) {
        if (!iq2_smem_ready<NW, true, true, true>(s)) return false;
        gemm_iq2_smem_kernel<NW, true, true, true><<<grid, block, Iq2Smem<NW, true, true>::bytes, s>>>(p);
    } else if (flat) {
        if (!iq2_smem_ready<NW, true, true>(s)) return false;
        gemm_iq2_smem_kernel<NW, true, true><<<grid, block, Iq2Smem<NW, true, true>::bytes, s>>>(p);
    } else if (smem_mode() != 2) {
        if (!iq2_smem_ready<NW, true>(s)) return false;
        gemm_iq2_smem_kernel<NW, true><<<grid, block, Iq2Smem<NW, true>::bytes, s>>>(p);
    } else {
        if (!iq2_smem_ready<NW, false>(s)) return false;
        gemm_iq2_smem_kernel<NW, false><<<grid, block, Iq2Smem<NW, false>::bytes, s>>>(p);
    }
    return true;
}
bool q8_smem_ready(cudaStream_t s) {
    static bool ready = false;
    return smem_ready(reinterpret_cast<const void*>(gemm_q8_0_smem_kernel), q8_smem_bytes(kQ8MaxSlots), ready, s);
}
// DSV4_GEMM_Q8_V: which kernel takes the Q8_0 products of decode's warp-per-row order
// (DSV4_GEMM_SMEM_Q8=1 wins): 2 (default) gemm_q8_0_pipe_kernel with 2 stages and registers
// capped for two blocks an SM (some spills); 1 the same kernel, 3 stages, one block an SM; 0
// the register-fed gemm_q8_0_kernel. On the H200 (4 layers, runs 33-34, A/B in one call)
// prefill took 11.37 / 11.32 µs a token and layer with 2, 11.79 / 11.66 with 1, 13.74 with 0.
// gemm_q8_0_version (tests, benchmarks) wins.
int g_q8_version_override = -1;
int q8_version() {
    static const int v = env_int("DSV4_GEMM_Q8_V", 2);
    return g_q8_version_override >= 0 ? g_q8_version_override : v;
}
// Launches gemm_q8_0_pipe_kernel<CM, NS, MINB> as a persistent grid (blocks an SM by the
// occupancy calculator); false where it cannot yet (first met in a capture).
template <int CM, int NS, int MINB>
bool q8_pipe_launch(const Gemm& p, uint32_t tiles_r, uint32_t tiles, cudaStream_t s) {
    static bool ready = false;
    const auto kernel = gemm_q8_0_pipe_kernel<CM, NS, MINB>;
    if (!smem_ready(reinterpret_cast<const void*>(kernel), q8_pipe_smem(NS), ready, s)) return false;
    const uint32_t blocks =
        std::min<uint32_t>(tiles, resident_blocks(reinterpret_cast<const void*>(kernel), 256, q8_pipe_smem(NS)));
    kernel<<<blocks, 256, q8_pipe_smem(NS), s>>>(p, tiles_r, tiles);
    return true;
}
template <int NS, int MINB>
bool q8_pipe_launch_cm(int cm, const Gemm& p, uint32_t tiles_r, uint32_t tiles, cudaStream_t s) {
    switch (cm) {
        case 1: return q8_pipe_launch<1, NS, MINB>(p, tiles_r, tiles, s);
        case 2: return q8_pipe_launch<2, NS, MINB>(p, tiles_r, tiles, s);
        case 4: return q8_pipe_launch<4, NS, MINB>(p, tiles_r, tiles, s);
        default: return q8_pipe_launch<8, NS, MINB>(p, tiles_r, tiles, s);
    }
}
// Prompt rounds' Q8_0 order (gemm_q8_0_flat_kernel), set by the backend for each round;
// DSV4_FLAT_BN (64 or 128, default 64) its activation rows a tile; DSV4_FLAT_STAGES (3 or 4,
// default 4) the stages in flight of the 128-row tile (one block an SM; the 64-row tile takes
// 3, two blocks an SM). gemm_q8_0_flat_bn (tests, benchmarks) wins over DSV4_FLAT_BN.
thread_local bool g_flat_round = false;
// A decode round (single tokens of sessions, gemm_decode_round): the row counts from which the
// tensor-core / tiled GEMMs take a product over matvec's row kernels, higher than a
// prefill's kMinRows. For a few dozen rows the GEMMs' fixed cost (a tile walks all of K for
// few rows) exceeds what reading the weight once saves: run 99, 16 sessions, 4 layers: the
// float GEMM of the router 199 us a step against 18 by the row kernel for 8 rows; the Q8_0
// GEMM of q_b 190 us against 52 for 8 rows, 135 at 32 rows. The GEMMs give matvec's bits,
// so either choice leaves every session's result as it is alone.
// DSV4_DECODE_GEMM_Q8_ROWS / DSV4_DECODE_GEMM_F_ROWS (32 / 128; 16: as before run 100).
thread_local bool g_decode_round = false;
const uint32_t g_decode_q8_rows = uint32_t(std::max(1, env_int("DSV4_DECODE_GEMM_Q8_ROWS", 32)));
const uint32_t g_decode_f_rows = uint32_t(std::max(1, env_int("DSV4_DECODE_GEMM_F_ROWS", 128)));
int g_flat_bn_override = -1;
int flat_stages() {
    static const int ns = env_int("DSV4_FLAT_STAGES", 4) == 3 ? 3 : 4;
    return ns;
}
int flat_bn() {
    static const int bn = env_int("DSV4_FLAT_BN", 64) == 128 ? 128 : 64;
    return g_flat_bn_override > 0 ? (g_flat_bn_override == 128 ? 128 : 64) : bn;
}
// DSV4_FLAT_LEAN (default 1): the 64-row tile takes gemm_q8_0_flat_lean_kernel; 0 keeps
// gemm_q8_0_flat_kernel<3, 2, 64> (A/B: the same bits). gemm_q8_0_flat_lean (tests) wins.
int g_flat_lean_override = -1;
bool flat_lean() {
    static const bool on = env_int("DSV4_FLAT_LEAN", 1) != 0;
    return g_flat_lean_override >= 0 ? g_flat_lean_override != 0 : on;
}
bool flat_ok(const DevWeight& W, const DevAct& a, uint64_t row0, uint64_t rpg) {
    return g_flat_round && W.type == T_Q8_0 && a.kind == ActKind::Q8_0 && W.K % 32 == 0 && a.K % 32 == 0 &&
           (rpg == 0 || (rpg % kFlatBM == 0 && row0 % kFlatBM == 0)) &&
           reinterpret_cast<uintptr_t>(W.qs) % 16 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0;
}
template <int MINS, bool FLAT>
bool q2k_smem_launch(const KqGemm& p, dim3 grid, cudaStream_t s) {
    static bool ready = false;
    const auto kernel = gemm_q2k_smem_kernel<MINS, FLAT>;
    constexpr int bytes = Q2Smem<FLAT, MINS>::bytes;
    if (!smem_ready(reinterpret_cast<const void*>(kernel), bytes, ready, s)) return false;
    kernel<<<grid, 256, bytes, s>>>(p);
    return true;
}
// DSV4_Q2K_MINS (read once): how the FLAT Q2_K kernel forms the mins' sums, 2 (default) by
// one m16n8k16 pair a super-block against the split bsums, 1 by two MMAs per 32 values against
// the activation (before); gemm_q2k_mins (tests) wins.
int g_q2k_mins_override = -1;
int q2k_mins() {
    static const int m = env_int("DSV4_Q2K_MINS", 2) == 1 ? 1 : 2;
    return g_q2k_mins_override > 0 ? g_q2k_mins_override : m;
}
// DSV4_XF_TABLE (read once; 1: on, else off: within noise in runs 158 and 160): the Q2_K
// kernel's expansion from a row's four values (TABLE); gemm_experts_f16_table_override (tests)
// wins.
int g_xf_table_override = -1;
// DSV4_XF_STAGE_USED (read once; 0: off, else on): the fast experts kernel stages and expands
// only the pairs its MMAs read (run 169, an H100, 36 layers: the fast prefill 8,183 -> 8,378
// tok/s at 1M; a 4,096-token round's chunk 11.37 -> 11.06 us a token);
// gemm_experts_f16_stage_used_override (tests) wins.
int g_xf_stage_used_override = -1;
bool xf_stage_used_on() {
    static const bool on = env_int("DSV4_XF_STAGE_USED", 1) != 0;
    return g_xf_stage_used_override >= 0 ? g_xf_stage_used_override != 0 : on;
}
// DSV4_XF_PAIRED_CODES (read once; 0: off, else on): the fast Q2_K kernel stages the code bytes
// two tiles share once (gemm_experts_f16_kernel's codes_stage: the same values, so the same bits,
// ~28 % fewer bytes a tile from L2; runs 197, 198, an H100: a fast chunk's down 2.23 -> 2.06 us a
// token, the 36-layer fast prefill 9,299 -> 9,431 tok/s); gemm_experts_f16_paired_codes_override
// (tests) wins.
int g_xf_paired_codes_override = -1;
bool xf_paired_codes_on() {
    static const bool on = env_int("DSV4_XF_PAIRED_CODES", 1) != 0;
    return g_xf_paired_codes_override >= 0 ? g_xf_paired_codes_override != 0 : on;
}
// DSV4_XF_WGMMA (read once): the kernel's form on a device that has wgmma (compute capability
// 9.0; elsewhere mma.sync): 0 mma.sync; 1 WG (sm90a/experts_wgmma.cu; run 164, an H100: a fast
// 2,048-token chunk's gate+up 4.02 -> 3.53 us a token, its down 2.63 -> 2.27); 2 WG2 (two groups
// of an expert a block); 3 WS, warp-specialised (sm90a/experts_ws.cu: a producer warpgroup and
// four consumers, mbarriers instead of the block-wide barrier; both products); unset: WG2 for a
// round of at least 96 pairs an expert on average (wide: the Flash model's rounds of 4,096
// tokens and more; run 168, an H100, 4 layers: WG2 took a 4,096-token round's chunk from 11.79 to
// 11.38 us a token, but a 2,048-token one's from 13.28 to 15.50, its groups mostly 64 pairs or
// fewer), else WS (runs 218-220, an H100: a fast chunk's gate+up 3.31 / 3.26 -> 3.17 / 3.15 us a
// token against WG, the down even; the 36-layer fast prefill 9,956 / 10,007 -> 10,094 / 10,074
// tok/s, alternated; the same bits as WG). DSV4_XF_WGMMA=1 takes WG. (Forms 3 and 4 before WS, WG in
// clusters of two and four blocks sharing their staged activations, measured slower and removed:
// run 197, gate+up 3.46 -> 4.74 and 5.12 us a token of a fast chunk, down 2.23 -> 2.91 and 3.12.)
// gemm_experts_f16_wgmma_override (tests) wins over the variable.
int g_xf_wgmma_override = -1;
int xf_wgmma_form(bool wide) {
    static const int env = env_int("DSV4_XF_WGMMA", -1);
    int form = g_xf_wgmma_override >= 0 ? g_xf_wgmma_override : env;
    if (form < kXfMma || form > kXfWs) form = wide ? kXfWg2 : kXfWs;
    return gemm_experts_wgmma_available() ? form : kXfMma;
}
// DSV4_XF_DIAG (read once; a measurement for the benchmarks, **wrong outputs**): 1 the WG form
// expands its weights but runs no MMA, 2 runs its MMAs without the expansion, 3 as 2 without the
// wait after each group, 4 neither (the tile loop's staging, B expansion and row setup alone), 5
// as 4 without the B expansion, 6 as 4 without the weights' copies, 7 as 4 without the
// activations' copies, 8 as 4 without any copy, 9 as 8 without the loop's barrier
// (gemm_experts_f16_kernel's DIAG); anything else: the kernel itself.
int xf_diag() {
    static const int env = env_int("DSV4_XF_DIAG", 0);
    return env >= 1 && env <= 9 ? env : 0;
}
// DSV4_XF_KGROUP (read once; 1, else 2): the WG form's commit groups of two k-steps an m-tile
// (gemm_experts_f16_kernel's KG; the default since run 207) or of one: the same bits;
// gemm_experts_f16_kgroup_override (tests) wins.
int g_xf_kgroup_override = -1;
int xf_kgroup() {
    static const int env = env_int("DSV4_XF_KGROUP", 2);
    return (g_xf_kgroup_override >= 0 ? g_xf_kgroup_override : env) == 1 ? 1 : 2;
}
// DSV4_XF_SECTORS (read once; 0: off, else on): the WG form's Q2_K down stages its scale bytes,
// (d, dmin) and dx in whole sectors, once a super-block (gemm_experts_f16_kernel's SB; run 209: 2.06
// -> 1.80 us a token of a fast chunk); the same values, so the same bits;
// gemm_experts_f16_sectors_override (tests) wins.
int g_xf_sectors_override = -1;
bool xf_sectors_on() {
    static const bool on = env_int("DSV4_XF_SECTORS", 1) != 0;
    return g_xf_sectors_override >= 0 ? g_xf_sectors_override != 0 : on;
}
// DSV4_XF_WS_PERSIST (read once; 0: off, else on): the WS form (DSV4_XF_WGMMA=3) as one block an
// SM over the round's items, its tables filled once and an item's first copies issued during the
// item before (sm90a/experts_ws.cu), or one item a block; the same bits;
// gemm_experts_f16_ws_persist_override (tests) wins.
int g_xf_ws_persist_override = -1;
bool xf_ws_persist_on() {
    static const bool on = env_int("DSV4_XF_WS_PERSIST", 1) != 0;
    return g_xf_ws_persist_override >= 0 ? g_xf_ws_persist_override != 0 : on;
}
// DSV4_XF_WS_AHEAD (read once; 3, 4 or 5, else 3): the WS form's tiles whose copies fly while its
// producer expands one (sm90a/experts_ws.cu's AHEAD; the stages beyond AHEAD + 1 are how far its
// consumers may drift apart); the same bits whatever it is; gemm_experts_f16_ws_ahead_override
// (tests) wins. 3 by default: 4 and 5 are not yet measured.
int g_xf_ws_ahead_override = -1;
uint8_t xf_ws_ahead() {
    static const int env = env_int("DSV4_XF_WS_AHEAD", 3);
    const int v = g_xf_ws_ahead_override >= 0 ? g_xf_ws_ahead_override : env;
    return uint8_t(v == 4 || v == 5 ? v : 3);
}
bool launch_experts_f16(const KqGemm& p, uint32_t type, uint64_t N, uint32_t cap, bool wide, cudaStream_t s) {
    static const bool env = env_int("DSV4_XF_TABLE", 0) == 1;
    const bool table = type == T_Q2_K && (g_xf_table_override >= 0 ? g_xf_table_override != 0 : env);
    if (const int form = xf_wgmma_form(wide); !table && form != kXfMma)
        return launch_experts_wgmma(p, type, form, xf_diag(), xf_kgroup(), xf_sectors_on(), N, cap, s);
    if (type == T_IQ2_XXS) return launch_experts_f16_form<T_IQ2_XXS, false>(p, N, cap, s);
    return table ? launch_experts_f16_form<T_Q2_K, true>(p, N, cap, s)
                 : launch_experts_f16_form<T_Q2_K, false>(p, N, cap, s);
}
// DSV4_EXPERTS_F16 (read once; 1: in every prompt round, 0: never, -1 (default): the round's, so
// --fast-prefill's): a prompt round's routed Q2_K experts (the down projection) by
// gemm_experts_f16_kernel (run 157, an H100: a fast chunk's down projection 3.54 -> 2.64 us a
// token), and its IQ2_XXS gate+up too unless DSV4_XF_IQ2=0 (read once); gemm_experts_f16_override
// (tests) wins over the first, gemm_experts_f16_iq2_override over the second.
int g_experts_f16_override = -1;
int g_xf_iq2_override = -1;
bool experts_f16_on(uint32_t type) {
    static const int env = env_int("DSV4_EXPERTS_F16", -1);
    static const bool iq2 = env_switch("DSV4_XF_IQ2", true);
    if (type == T_IQ2_XXS && !(g_xf_iq2_override >= 0 ? g_xf_iq2_override != 0 : iq2)) return false;
    return fast_part(g_experts_f16_override, env);
}
// The staged Q2_K kernel: groups of 64 pairs (flat: k order) take the FLAT kernel, the mins as
// q2k_mins() says (also for DSV4_GEMM_SMEM=2); decode's order (groups of 32) the mins by MMAs
// against the activation, or by scalar sums for DSV4_GEMM_SMEM=2 (MINS 2 there: ptxas spills
// 144 bytes inside the decode tree's eight unrolled leaves). False when its shared memory
// cannot be raised yet (a capture first).
bool launch_q2k_smem(const KqGemm& p, uint64_t N, uint32_t cap, bool flat, cudaStream_t s) {
    const dim3 grid(uint32_t((N + kSmRows - 1) / kSmRows), cap);
    if (flat) return q2k_mins() == 2 ? q2k_smem_launch<2, true>(p, grid, s) : q2k_smem_launch<1, true>(p, grid, s);
    return smem_mode() == 2 ? q2k_smem_launch<0, false>(p, grid, s) : q2k_smem_launch<1, false>(p, grid, s);
}
}  // namespace

namespace xf {
// Dynamic shared memory above 48 KB must be allowed once per kernel, outside stream capture:
// done at the first launch on a stream that is not capturing; until then (a capture first)
// the register-fed kernel runs, which gives the same bits.
bool smem_ready(const void* kernel, int bytes, bool& ready, cudaStream_t s) {
    if (ready) return true;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return false;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "gemm: dynamic shared memory of a staged kernel");
    ready = true;
    return true;
}
}  // namespace xf

// Rows from which a prompt round's Q8_0 (kind 0) or F16 (kind 1) products take cuBLAS (0:
// never; kernels.h).
int g_cublas_override[2] = {-1, -1};
thread_local bool g_fast_round = false;
uint32_t cublas_rows(int kind) {
    static const uint32_t rows = uint32_t(std::max(1, env_int("DSV4_CUBLAS_ROWS", int(kCublasRows))));
    // -1 (unset): the round's choice; 0 off, else on, in every prompt round
    static const int env[2] = {env_int("DSV4_Q8_CUBLAS", -1), env_int("DSV4_F16_CUBLAS", -1)};
    if (!g_flat_round) return 0;
    if (g_cublas_override[kind] >= 0) return uint32_t(g_cublas_override[kind]);
    return fast_part(-1, env[kind]) ? rows : 0;
}
bool cublas_round(uint32_t R) {
    const uint32_t q8 = cublas_rows(0), f16 = cublas_rows(1);
    return (q8 && R >= q8) || (f16 && R >= f16);
}
bool gemm_q8_0_takes_cublas(const DevWeight& W, uint32_t R, uint64_t N, uint64_t AK, uint64_t rpg, uint64_t y_stride,
                            cudaStream_t s) {
    const uint32_t cb_rows = cublas_rows(0);
    return cb_rows && R >= cb_rows && gemm_q8_0_eligible(W, R, N, rpg, false) &&
           gemm_q8_0_cublas_ready(W, R, N, AK, rpg, y_stride, s);
}
bool gemm_q8_0_floats(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y, uint64_t y_stride,
                      uint64_t N, cudaStream_t s) {
    // (run 170: quant_q8_0_kernel 46 us + the codes' top and dequantisation 24 against a top pass
    // and a conversion ~31, a 2,048-row activation of 4,096 values)
    static const bool on = env_switch("DSV4_Q8_CUBLAS_FLOATS", true);
    const uint32_t cb_rows = cublas_rows(0);
    if (!on || !cb_rows || R < cb_rows || W.type != T_Q8_0) return false;
    return gemm_q8_0_cublas_floats(W, x, xs, R, y, y_stride, N, s);
}
void gemm_q8_0_cublas_override(int min_rows) { g_cublas_override[0] = min_rows; }
void gemm_float_cublas_override(int min_rows) { g_cublas_override[1] = min_rows; }
void fast_prefill_round(bool on) { g_fast_round = on; }
bool fast_prefill_round() { return g_fast_round; }
bool fast_part(int override_on, int env_on) {
    if (override_on >= 0) return override_on != 0;
    return env_on >= 0 ? env_on != 0 : g_fast_round;
}
void gemm_smem_override(int on) { g_smem_override = on; }
void gemm_q2k_mins(int m) { g_q2k_mins_override = m; }
void gemm_experts_f16_override(int on) { g_experts_f16_override = on; }
void gemm_experts_f16_table_override(int on) { g_xf_table_override = on; }
void gemm_experts_f16_iq2_override(int on) { g_xf_iq2_override = on; }
void gemm_experts_f16_wgmma_override(int on) { g_xf_wgmma_override = on; }
void gemm_experts_f16_ws_ahead_override(int ahead) { g_xf_ws_ahead_override = ahead; }
void gemm_experts_f16_stage_used_override(int on) { g_xf_stage_used_override = on; }
void gemm_experts_f16_paired_codes_override(int on) { g_xf_paired_codes_override = on; }
void gemm_experts_f16_kgroup_override(int kg) { g_xf_kgroup_override = kg; }
void gemm_experts_f16_sectors_override(int on) { g_xf_sectors_override = on; }
void gemm_experts_f16_ws_persist_override(int on) { g_xf_ws_persist_override = on; }
bool gemm_experts_wgmma_available() {
    // (sm90a/experts_wgmma.cu holds sm_90a machine code alone: compute capability 9.0 exactly)
    static int cc[64] = {};   // by device: 0 unknown, 1 yes, 2 no
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (cc[dev] == 0) {
        int major = 0, minor = 0;
        const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                         major == 9 && minor == 0;
        cc[dev] = yes ? 1 : 2;
    }
    return cc[dev] == 1;
}
void gemm_q8_0_version(int v) { g_q8_version_override = v; }
void gemm_q8_0_flat_bn(int bn) { g_flat_bn_override = bn; }
void gemm_q8_0_flat_lean(int on) { g_flat_lean_override = on; }

bool gemm_q8_0_eligible(const DevWeight& W, uint32_t R, uint64_t N, uint64_t rpg, bool expert) {
    if (!tensor_cores_on() || W.type != T_Q8_0 || expert || W.K % 32 != 0) return false;
    // a prompt round's rows, however few, take the flat kernel (one order for every chunking)
    if (g_flat_round && (rpg == 0 || rpg % kFlatBM == 0)) return R >= 1;
    return R >= (g_decode_round ? g_decode_q8_rows : uint32_t(kMinRows)) && (rpg == 0 || rpg % kBM == 0);
}

void gemm_q8_0(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
               uint64_t row0, uint64_t rpg, cudaStream_t s) {
    if (R == 0 || N == 0) return;
    if (W.type != T_Q8_0 || a.kind != ActKind::Q8_0 || (rpg && rpg % kBM))
        throw_mismatch("gemm_q8_0", W.type, W.K, a.K);
    const uint32_t cb_rows = cublas_rows(0);
    if (cb_rows && R >= cb_rows && gemm_q8_0_cublas(W, a, R, y, y_stride, N, row0, rpg, s)) return;
    if (!a.q)   // (an FP16 activation alone: its caller asked gemm_q8_0_takes_cublas first)
        throw std::logic_error("gemm_q8_0: an activation without Q8_0 codes (FP16 only) that cuBLAS did not take");
    Gemm p{W.qs, W.d, W.K, row0, N, a.q, a.d, a.K, rpg, R, y, y_stride};
    if (flat_ok(W, a, row0, rpg) && (N + kFlatBM - 1) / kFlatBM < 65536) {
        const int bn = flat_bn();
        const dim3 fgrid((R + bn - 1) / bn, uint32_t((N + kFlatBM - 1) / kFlatBM));
        if (bn == 64 && flat_lean() && W.K < (1u << 24) && a.K < (1u << 24))   // (its 32-bit offsets)
            gemm_q8_0_flat_lean_kernel<3><<<fgrid, 256, flat_smem(3, 64), s>>>(p);
        else if (bn == 64) gemm_q8_0_flat_kernel<3, 2, 64><<<fgrid, 256, flat_smem(3, 64), s>>>(p);
        else if (flat_stages() == 3) gemm_q8_0_flat_kernel<3, 1, 128><<<fgrid, 256, flat_smem(3, 128), s>>>(p);
        else gemm_q8_0_flat_kernel<4, 1, 128><<<fgrid, 256, flat_smem(4, 128), s>>>(p);
        check_launch("gemm_q8_0 (flat)");
        return;
    }
    const dim3 grid(uint32_t((N + kBM - 1) / kBM), (R + kBN - 1) / kBN);
    const uint32_t wt = decode_row_threads(W.K, N, false);
    const int cmax = int((W.K / 32 + 31) / 32);
    if (wt == 32 && smem_q8_on() && q8_slots(cmax) <= kQ8MaxSlots && reinterpret_cast<uintptr_t>(W.qs) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.K % 16 == 0 && q8_smem_ready(s)) {
        gemm_q8_0_smem_kernel<<<grid, 256, q8_smem_bytes(q8_slots(cmax)), s>>>(p);
        check_launch("gemm_q8_0");
        return;
    }
    if (wt == 32 && q8_version() >= 1 && cmax <= 8 && reinterpret_cast<uintptr_t>(W.qs) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.K % 16 == 0 && W.K % 16 == 0) {
        const int cm = cmax <= 1 ? 1 : cmax <= 2 ? 2 : cmax <= 4 ? 4 : 8;
        const uint64_t tiles_r = (R + kQ2Rows - 1) / kQ2Rows, tiles = (N + kQ2Rows - 1) / kQ2Rows * tiles_r;
        if (tiles < (uint64_t(1) << 31) &&
            (q8_version() == 2 ? q8_pipe_launch_cm<2, 2>(cm, p, uint32_t(tiles_r), uint32_t(tiles), s)
                               : q8_pipe_launch_cm<3, 1>(cm, p, uint32_t(tiles_r), uint32_t(tiles), s))) {
            check_launch("gemm_q8_0");
            return;
        }
    }
    switch (wt) {
        case 1024: gemm_q8_0_kernel<1024><<<grid, 128, 0, s>>>(p); break;
        case 256: gemm_q8_0_kernel<256><<<grid, 128, 0, s>>>(p); break;
        default: gemm_q8_0_kernel<32><<<grid, 128, 0, s>>>(p); break;
    }
    check_launch("gemm_q8_0");
}

namespace {
// DSV4_KQ_FLAT (read once, on by default): a prompt round's 2-bit expert products take groups
// of 64 pairs in k order (the FLAT kernels); 0 keeps decode's order and groups of 32 there.
bool kq_flat_on() {
    static const bool on = env_switch("DSV4_KQ_FLAT", true);
    return on;
}
// DSV4_KQ_SKIP (read once, on by default): the staged expert GEMMs' warps skip their tiles of
// 8 pairs past the group's count; 0 runs every tile (the same bits).
bool kq_skip_on() {
    static const bool on = env_switch("DSV4_KQ_SKIP", true);
    return on;
}
}  // namespace

bool kq_flat_round() { return g_flat_round && kq_flat_on(); }
uint32_t gemm_kq_pairs() { return kq_flat_round() ? kKqFlatPairs : kKqPairs; }

bool gemm_kq_eligible(const DevWeight& W, const MoeGroups* groups) {
    return tensor_cores_on() && groups && groups->per_group == gemm_kq_pairs() &&
           (W.type == T_IQ2_XXS || W.type == T_Q2_K) && W.K % 256 == 0;
}

void gemm_kq_experts(const DevWeight& Wg, const DevWeight* Wu, const DevAct& a, uint32_t P, float* y,
                     uint64_t y_stride, uint64_t N, uint64_t rows_per_expert, uint32_t act_div, const MoeGroups& g,
                     float clamp, const float* ew, cudaStream_t s) {
    if (P == 0 || N == 0) return;
    if (!gemm_kq_eligible(Wg, &g) || a.kind != ActKind::Q8_K || a.K != Wg.K || (Wu && Wu->type != Wg.type))
        throw_mismatch("gemm_kq_experts", Wg.type, Wg.K, a.K);
    KqGemm p{};
    p.wq[0] = reinterpret_cast<const uint8_t*>(Wg.qs);
    p.wd[0] = Wg.d;
    if (Wu) {
        p.wq[1] = reinterpret_cast<const uint8_t*>(Wu->qs);
        p.wd[1] = Wu->d;
    }
    p.K = Wg.K;
    p.N = N;
    p.rows_per_expert = rows_per_expert;
    p.aq = a.q;
    p.ad = a.d;
    p.absum = a.bsum;
    p.AL = a.K;
    p.act_div = act_div ? act_div : 1;
    p.grp = g.grp;
    p.pairs = g.pairs;
    p.count = g.count;
    p.y = y;
    p.y_stride = y_stride;
    p.clamp = clamp;
    p.ew = ew;
    iq2_tables(&p.grid, &p.sign, &p.sel, &p.hgrid, &p.hsign);
    p.skip_tiles = kq_skip_on();
    p.stage_used = xf_stage_used_on();
    p.paired_codes = xf_paired_codes_on();
    p.ws_persist = xf_ws_persist_on();
    p.ws_ahead = xf_ws_ahead();
    // groups of 64 pairs: k order on every path (staged FLAT kernels; the register-fed one with
    // FLAT where staging is off, misaligned or not yet allowed), so a product never mixes orders
    const bool flat = g.per_group == kKqFlatPairs;
    const uint32_t bm = 64 * uint32_t(Wg.type == T_IQ2_XXS ? kq_mt<T_IQ2_XXS>() : kq_mt<T_Q2_K>());
    const dim3 grid(uint32_t((N + bm - 1) / bm), g.cap), block(128);
    const bool aligned = reinterpret_cast<uintptr_t>(p.aq) % 16 == 0 && p.AL % kXfK == 0 &&
                         reinterpret_cast<uintptr_t>(p.wq[0]) % 16 == 0 && reinterpret_cast<uintptr_t>(p.ad) % 4 == 0 &&
                         (!Wu || reinterpret_cast<uintptr_t>(p.wq[1]) % 16 == 0);
    // the fast mode's FP16 kernel: Q2_K alone (the down projection), IQ2_XXS gate+up fused
    const bool xf_shape = Wg.type == T_Q2_K ? !Wu : Wu && reinterpret_cast<uintptr_t>(p.wd[1]) % 4 == 0;
    // (its copies' addresses are 32-bit offsets from the tensors' bases: every byte of the weights
    // and of the activation rows the pairs read within 4 GiB of them)
    const bool xf_fits = Wg.rows * (Wg.K / 256) * (Wg.type == T_Q2_K ? 80 : 64) <= UINT32_MAX &&
                         (uint64_t(P - 1) / p.act_div + 1) * p.AL <= UINT32_MAX;
    if (flat && aligned && xf_shape && xf_fits && experts_f16_on(Wg.type) && reinterpret_cast<uintptr_t>(p.wd[0]) % 4 == 0 &&
        launch_experts_f16(p, Wg.type, N, g.cap, uint64_t(P) * rows_per_expert >= 96 * Wg.rows, s)) {
        // (launched by launch_experts_f16: the fast mode's bits)
    } else if (Wg.type == T_IQ2_XXS && smem_on() && reinterpret_cast<uintptr_t>(p.aq) % 16 == 0 && p.AL % 16 == 0 &&
        reinterpret_cast<uintptr_t>(p.wq[0]) % 16 == 0 && reinterpret_cast<uintptr_t>(p.wq[1]) % 16 == 0 &&
        (Wu ? launch_iq2_smem<2>(p, N, g.cap, flat, s) : launch_iq2_smem<1>(p, N, g.cap, flat, s))) {
        // (launched by launch_iq2_smem)
    } else if (Wg.type == T_Q2_K && !Wu && smem_on() && reinterpret_cast<uintptr_t>(p.aq) % 16 == 0 &&
               p.AL % 256 == 0 && reinterpret_cast<uintptr_t>(p.wq[0]) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(p.absum) % 16 == 0 && reinterpret_cast<uintptr_t>(p.wd[0]) % 4 == 0 &&
               launch_q2k_smem(p, N, g.cap, flat, s)) {
        // (launched by launch_q2k_smem)
    } else if (Wg.type == T_IQ2_XXS) {
        if (flat) {
            if (Wu) gemm_kq_kernel<T_IQ2_XXS, 2, true><<<grid, block, 0, s>>>(p);
            else gemm_kq_kernel<T_IQ2_XXS, 1, true><<<grid, block, 0, s>>>(p);
        } else {
            if (Wu) gemm_kq_kernel<T_IQ2_XXS, 2><<<grid, block, 0, s>>>(p);
            else gemm_kq_kernel<T_IQ2_XXS, 1><<<grid, block, 0, s>>>(p);
        }
    } else {
        if (Wu) throw_mismatch("gemm_kq_experts: Q2_K gate+up has no tensor-core kernel", Wg.type, Wg.K, a.K);
        if (flat) gemm_kq_kernel<T_Q2_K, 1, true><<<grid, block, 0, s>>>(p);
        else gemm_kq_kernel<T_Q2_K, 1><<<grid, block, 0, s>>>(p);
    }
    check_launch("gemm_kq_experts");
}

// ---- float weights (F16, BF16, F32) times float activations: a tiled SIMT GEMM ----------
// Decode (matvec_kernel, VEC path) gives output row n the NT = decode_row_threads(K, N)
// threads of a warp (32) or of a wide block (256, 1,024); thread t sums the 8-value chunks
// u = t, t + NT, t + 2 NT, ... in order, 8 sequential fmaf per chunk from 0, then each warp's
// 32 thread sums are added by the butterfly (xor 16, 8, 4, 2, 1) and, in a wide block, the
// warps' sums are added in order starting from 0. Here a block computes a tile of 64 weight
// rows × 16·TR activation rows (256 threads, 4 × TR outputs each, FP32 FMAs on the CUDA
// cores) and walks the K chunks in the order decode's tree consumes them: warp w of the row
// threads, its leaves j = 0..31 (thread 32w + bitrev5(j)), each leaf's C = K / (8 NT) chunks
// in order. The chunk sequence is staged four chunks (32 values) at a time into shared
// memory, double-buffered through registers (the weight chunk converted to float on the
// way, exactly), one barrier per stage. A leaf's sum is merged when it ends through the
// stack of five partial sums (tree_push's binary counter, with the leaf number a run-time
// value here: the block-uniform level picks the registers by unrolled branches), and a warp's
// root joins the wide block's running sum. So every output gets decode's float operations in
// decode's order: bit for bit. Shapes with leaves of unequal chunk counts (K % (8 NT) != 0)
// stay on matvec_kernel (gemm_float_eligible says no).
namespace {

constexpr int kFBM = 64;        // weight rows per block (16 threads × 4)
constexpr int kFStage = 4;      // chunks of 8 values staged per step
constexpr int kFK = 8 * kFStage;

struct FGemm {
    const uint8_t* w;
    uint64_t row_bytes, K, row0, N;
    const float* a;
    uint64_t a_stride, rpg;
    uint32_t R;
    float* y;
    uint64_t y_stride;
    uint32_t nt;    // decode's threads per row (32, 256, 1,024)
    uint32_t C;     // chunks per leaf: K / (8 nt)
};

__device__ __forceinline__ uint32_t bitrev5u(uint32_t j) {
    return ((j & 1) << 4) | ((j & 2) << 2) | (j & 4) | ((j & 8) >> 2) | ((j & 16) >> 4);
}

// The chunk (index into the row's K / 8 chunks) at position q of the visiting order.
__device__ __forceinline__ uint32_t chunk_at(const FGemm& p, uint32_t q) {
    const uint32_t leaf = q / p.C, c = q - leaf * p.C;
    return (leaf & ~31u) + bitrev5u(leaf & 31) + c * p.nt;
}

// Leaf number j (0..31) of a warp ended with sum cur: merge it as tree_push does (the level,
// trailing zeros of j + 1, is the same for the whole block: tree_push_level's uniform branch).
template <int TR>
__device__ __forceinline__ void tree_push_rt(uint32_t j, float (&st)[5][4][TR], float (&cur)[4][TR]) {
    tree_push_level(__ffs(int(j + 1)) - 1, st, cur);
}

template <uint32_t T>
__device__ __forceinline__ void to_floats(const uint4& v, float (&f)[8]) {
    const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint16_t lo = uint16_t(ws[j] & 0xFFFF), hi = uint16_t(ws[j] >> 16);
        f[2 * j] = T == T_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
        f[2 * j + 1] = T == T_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
    }
}

// T: weight type; TR: activation rows per thread (4: 64 per block; 2: 32, for small grids).
template <uint32_t T, int TR>
__global__ void __launch_bounds__(256, TR == 2 ? 2 : 1) gemm_float_kernel(FGemm p) {
    pdl_begin();
    constexpr int BR = 16 * TR;                    // activation rows per block
    constexpr int AV = BR / 32;                    // float4 activation loads per thread per stage
    constexpr int WV = T == T_F32 ? 2 : 1;         // 16-byte weight loads per thread per stage
    __shared__ __align__(16) float sw[2][kFK][kFBM];
    __shared__ __align__(16) float sa[2][kFK][BR];
    const uint32_t tid = threadIdx.x;
    const uint32_t tn = tid & 15, tr = tid >> 4;
    const uint64_t m0 = uint64_t(blockIdx.x) * kFBM;
    const uint32_t r0 = blockIdx.y * BR;
    // a block's rows lie in one group (the launcher checks rpg % 64 == 0 and row0 % 64 == 0)
    const uint64_t goff = p.rpg ? ((p.row0 + m0) / p.rpg) * p.K : 0;

    // loader roles: weight row lrow, stage position lpos (chunk lpos of the stage)
    const uint32_t lrow = tid & 63, lpos = tid >> 6;
    const uint8_t* wrow = p.w + (p.row0 + min(m0 + lrow, p.N - 1)) * p.row_bytes;   // rows past N: clamped
    const float* arow[AV];
    uint32_t apos[AV], ahalf[AV], arr[AV];
#pragma unroll
    for (int i = 0; i < AV; ++i) {
        const uint32_t e = tid + 256 * i;
        arr[i] = e % BR;
        apos[i] = (e / BR) % kFStage;
        ahalf[i] = e / (BR * kFStage);
        arow[i] = p.a + uint64_t(min(r0 + arr[i], p.R - 1)) * p.a_stride + goff;
    }
    uint4 wreg[WV];
    float4 areg[AV];
    auto load = [&](uint32_t stage) {
        const uint32_t wu = chunk_at(p, stage * kFStage + lpos);
        if constexpr (T == T_F32) {
            const uint4* src = reinterpret_cast<const uint4*>(wrow) + 2 * wu;
            wreg[0] = src[0];
            wreg[WV - 1] = src[1];
        } else {
            wreg[0] = reinterpret_cast<const uint4*>(wrow)[wu];
        }
#pragma unroll
        for (int i = 0; i < AV; ++i) {
            const uint32_t au = chunk_at(p, stage * kFStage + apos[i]);
            areg[i] = reinterpret_cast<const float4*>(arow[i])[2 * au + ahalf[i]];
        }
    };
    auto store = [&](int buf) {
        float f[8];
        if constexpr (T == T_F32) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                f[4 * h + 0] = __uint_as_float(wreg[h].x);
                f[4 * h + 1] = __uint_as_float(wreg[h].y);
                f[4 * h + 2] = __uint_as_float(wreg[h].z);
                f[4 * h + 3] = __uint_as_float(wreg[h].w);
            }
        } else {
            to_floats<T>(wreg[0], f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) sw[buf][lpos * 8 + j][lrow] = f[j];
#pragma unroll
        for (int i = 0; i < AV; ++i) {
            float* d = &sa[buf][apos[i] * 8 + ahalf[i] * 4][arr[i]];
            d[0] = areg[i].x;
            d[BR] = areg[i].y;
            d[2 * BR] = areg[i].z;
            d[3 * BR] = areg[i].w;
        }
    };

    float st[5][4][TR], cur[4][TR], total[4][TR];
    each(cur, [](float& x) { x = 0.0f; });
    each(total, [](float& x) { x = 0.0f; });
    const bool wide = p.nt > 32;
    const uint32_t stages = uint32_t(p.K / kFK);
    uint32_t cc = 0, leaf = 0;   // chunks done of the current leaf; leaves done
    load(0);
    store(0);
    __syncthreads();
    for (uint32_t s = 0; s < stages; ++s) {
        const int buf = int(s & 1);
        if (s + 1 < stages) load(s + 1);
#pragma unroll
        for (int c = 0; c < kFStage; ++c) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const float4 wv = *reinterpret_cast<const float4*>(&sw[buf][c * 8 + k][4 * tn]);
                float av[TR];
                if constexpr (TR == 4) {
                    const float4 a4 = *reinterpret_cast<const float4*>(&sa[buf][c * 8 + k][4 * tr]);
                    av[0] = a4.x, av[1] = a4.y, av[2] = a4.z, av[3] = a4.w;
                } else {
                    const float2 a2 = *reinterpret_cast<const float2*>(&sa[buf][c * 8 + k][2 * tr]);
                    av[0] = a2.x, av[TR - 1] = a2.y;
                }
                const float wf[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int r = 0; r < TR; ++r) cur[i][r] = fmaf(wf[i], av[r], cur[i][r]);
            }
            if (++cc == p.C) {   // a leaf ends
                cc = 0;
                const uint32_t j = leaf++ & 31;
                tree_push_rt(j, st, cur);
                if (j == 31) {          // a warp's root: the row's sum, or the next term of a wide block's
                    each2(total, cur, [&](float& t, float& x) { t = wide ? t + x : x; });
                }
                each(cur, [](float& x) { x = 0.0f; });
            }
        }
        if (s + 1 < stages) store(buf ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint64_t n = m0 + 4 * tn + i;
        if (n >= p.N) continue;
#pragma unroll
        for (int r = 0; r < TR; ++r) {
            const uint32_t ar = r0 + TR * tr + r;
            if (ar < p.R) p.y[uint64_t(ar) * p.y_stride + n] = total[i][r];
        }
    }
}

// A prompt round's products of F16 / BF16 weights (gemm_prefill_order, as the Q8_0 ones: not
// decode's order, the same bits for a row in any tile, batch or chunk) on the tensor cores:
// a weight is exact in TF32, an activation x = hi + lo (two TF32 values, |x - hi - lo| <=
// 2^-22 |x|, tf32_split), so W·x = W·hi + W·lo by two m16n8k8 MMAs, FP32-accurate. The tensor
// cores round their sums toward zero, so a stage's 32 values are summed in fresh accumulators
// (8 MMAs deep) and added to the running sum by FP32 adds (round to nearest): y = Σ over
// stages in k order of (the stage's MMA sum). A warp holds 64 weight rows × 32 activation
// rows, a block 128 × 128; both operands go global -> registers (a stage ahead) -> shared
// memory (two buffers): the weights converted to floats there (F16 and BF16 values are TF32
// values), the activations split at the fragment loads.
// SPLIT (opt-in; products of up to 1,024 rows, K of 512 or more: flat_splits): a block walks one of S
// equal runs of the stages, S = gridDim.z blocks of one cluster per tile, and the cluster adds
// the S run sums in run order (p0 + p1 + ... through distributed shared memory) into y. A
// block walks its stages one after another (each a global load, a barrier, 64 MMAs), ~1.5 us
// a stage: the router's product (N 256, K 4,096: 32 blocks of 128 stages) took 190 us, the
// output mix of one row (K 16,384) 677 us (run 80). S depends on N and K alone, so a row's
// bits do not depend on its batch.
// NTW (n-tiles a warp: 4, or 1 for small products, opt-in: ff_ntw): a warp holds 64 weight rows
// × 8·NTW activation rows, a block 128 × 32·NTW. A row's output is the same sequence of MMAs
// and adds in either, so the same bits.
constexpr int kFfBM = 128, kFfBN = 128, kFfK = 32, kFfStride = kFfK + 4;   // (36 words: ldmatrix rows on distinct banks)
constexpr int ff_smem(int ntw) { return 2 * (kFfBM + 32 * ntw) * kFfStride * 4; }
constexpr int kFfSmem = ff_smem(4);
static_assert(64 * 256 * 4 <= kFfSmem, "split reduction buffer: a block's 64 accumulators a thread");

template <uint32_t T, bool SPLIT, int NTW = 4>
__global__ void __launch_bounds__(256, NTW == 4 ? 1 : 2) gemm_float_flat_kernel(FGemm p) {
    static_assert(NTW == 4 || (NTW == 1 && !SPLIT), "gemm_float_flat_kernel: 4 n-tiles a warp, or 1 unsplit");
    constexpr int BN = 32 * NTW;   // activation rows a block
    pdl_begin();
    extern __shared__ __align__(16) float ff_s[];   // [2][kFfBM + BN][kFfStride]: weights, then activations
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t wmi = warp & 1, wni = warp >> 1;
    const uint64_t m0 = uint64_t(blockIdx.y) * kFfBM;
    const uint32_t r0 = blockIdx.x * BN;
    // a tile's weight rows lie in one group (the launcher checks rpg % 128 == 0, row0 % 128 == 0)
    const uint64_t goff = p.rpg ? ((p.row0 + m0) / p.rpg) * p.K : 0;
    uint32_t s0 = 0, nst = uint32_t((p.K + kFfK - 1) / kFfK);   // this block's stages s0 .. s0 + nst - 1
    if constexpr (SPLIT) {
        const uint32_t per = (nst + gridDim.z - 1) / gridDim.z;
        s0 = min(nst, blockIdx.z * per);
        nst = min(nst - s0, per);
    }
    // loads: row t >> 1 of the tile, values 16 (t & 1) .. + 15 of the stage (K % 8 == 0: an
    // 8-value group is wholly inside K or past it, and past it loads zeros); activation rows
    // only below BN
    const uint32_t lr = t >> 1, lk = 16 * (t & 1);
    const bool lact = lr < uint32_t(BN);
    const uint8_t* wrow = p.w + (p.row0 + min(m0 + lr, p.N - 1)) * p.row_bytes;
    const float* arow = p.a + uint64_t(min(r0 + lr, p.R - 1)) * p.a_stride + goff;
    uint4 wv[2];
    float4 av[4];
    auto load = [&](uint32_t s) {
        const uint64_t k = uint64_t(s0 + s) * kFfK + lk;
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wv[j] = k + 8 * j < p.K ? *reinterpret_cast<const uint4*>(wrow + (k + 8 * j) * 2) : make_uint4(0, 0, 0, 0);
        if (!lact) return;
#pragma unroll
        for (int j = 0; j < 4; ++j)
            av[j] = k + 4 * j < p.K ? *reinterpret_cast<const float4*>(arow + k + 4 * j) : make_float4(0, 0, 0, 0);
    };
    auto store = [&](uint32_t buf) {
        float* sw = ff_s + (buf * (kFfBM + BN) + lr) * kFfStride + lk;
        float* sa = ff_s + (buf * (kFfBM + BN) + kFfBM + lr) * kFfStride + lk;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float f[8];
            to_floats<T>(wv[j], f);
            reinterpret_cast<float4*>(sw + 8 * j)[0] = make_float4(f[0], f[1], f[2], f[3]);
            reinterpret_cast<float4*>(sw + 8 * j)[1] = make_float4(f[4], f[5], f[6], f[7]);
        }
        if (!lact) return;
#pragma unroll
        for (int j = 0; j < 4; ++j) reinterpret_cast<float4*>(sa + 4 * j)[0] = av[j];
    };

    float acc[4][NTW][4], part[4][NTW][4];
    each(acc, [](float& x) { x = 0.0f; });
    if (nst > 0) {
        load(0);
        store(0);
    }
    __syncthreads();
    for (uint32_t s = 0; s < nst; ++s) {
        if (s + 1 < nst) load(s + 1);   // in flight during the stage's MMAs
        const float* sw = ff_s + (s & 1) * (kFfBM + BN) * kFfStride;
        const float* sa = sw + kFfBM * kFfStride;
#pragma unroll
        for (int kk = 0; kk < kFfK / 8; ++kk) {
            uint32_t a[4][4], bh[NTW][2], bl[NTW][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
                ldsm_x4(a[mt], sw + (64 * wmi + 16 * mt + (lane & 15)) * kFfStride + 8 * kk + 4 * (lane >> 4));
            if constexpr (NTW == 4) {
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    uint32_t b[4];   // b0, b1 of n-tiles 2 np and 2 np + 1
                    ldsm_x4(b, sa + (32 * wni + 16 * np + (lane & 7) + 8 * (lane >> 4)) * kFfStride + 8 * kk +
                                   4 * ((lane >> 3) & 1));
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        tf32_split(__uint_as_float(b[i]), bh[2 * np + i / 2][i & 1], bl[2 * np + i / 2][i & 1]);
                }
            } else {
                uint32_t b[4];   // b0, b1 of the warp's n-tile (lanes 16-31 repeat lanes 0-15's rows)
                ldsm_x4(b, sa + (8 * wni + (lane & 7)) * kFfStride + 8 * kk + 4 * ((lane >> 3) & 1));
#pragma unroll
                for (int i = 0; i < 2; ++i) tf32_split(__uint_as_float(b[i]), bh[0][i], bl[0][i]);
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTW; ++nt) {
                    if (kk == 0) mma_tf32_0(part[mt][nt], a[mt], bh[nt][0], bh[nt][1]);
                    else mma_tf32(part[mt][nt], a[mt], bh[nt][0], bh[nt][1]);
                    mma_tf32(part[mt][nt], a[mt], bl[nt][0], bl[nt][1]);
                }
        }
        each2(acc, part, [](float& x, float& y) { x = __fadd_rn(x, y); });
        if (s + 1 < nst) store((s + 1) & 1);   // its last readers were stage s - 1's, before the barrier
        __syncthreads();
    }
    if constexpr (!SPLIT) {
        store_warp_tiles(p, m0 + 64 * wmi, r0 + 8 * NTW * wni, gid, tig, acc);
    } else {
        // Every block's run sums into its shared memory (the stages' buffers are free after
        // the loop's last barrier), then each block of the cluster adds the runs of every S-th
        // accumulator, in run order, and stores them.
        namespace cg = cooperative_groups;
        const cg::cluster_group cluster = cg::this_cluster();
        const uint32_t S = cluster.num_blocks(), rank = cluster.block_rank();
        float* red = ff_s;   // [64 accumulators][256 threads]
        int e = 0;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i, ++e) red[e * 256 + t] = acc[mt][nt][i];
        cluster.sync();
        e = 0;
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i, ++e) {
                    if (uint32_t(e) % S != rank) continue;
                    float v = cluster.map_shared_rank(red, 0u)[e * 256 + t];
                    for (uint32_t z = 1; z < S; ++z) v = __fadd_rn(v, cluster.map_shared_rank(red, z)[e * 256 + t]);
                    const uint64_t n = m0 + 64 * wmi + 16 * mt + gid + 8 * (i >> 1);
                    const uint32_t r = r0 + 32 * wni + 8 * nt + 2 * tig + (i & 1);
                    if (n < p.N && r < p.R) p.y[uint64_t(r) * p.y_stride + n] = v;
                }
        cluster.sync();   // no block leaves while the others read its shared memory
    }
}

// Whether a float product of this prompt round takes gemm_float_flat_kernel (DSV4_FLAT_FLOAT=0:
// prompt rounds keep decode's order for these, while the Q8_0 ones take theirs).
bool float_flat_ok(const DevWeight& W, const DevAct& a, uint64_t N, uint64_t row0, uint64_t rpg) {
    static const bool on = env_switch("DSV4_FLAT_FLOAT", true);
    return g_flat_round && on && (W.type == T_F16 || W.type == T_BF16) && a.kind == ActKind::F32 && W.K % 8 == 0 &&
           reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.row_bytes % 16 == 0 &&
           reinterpret_cast<uintptr_t>(a.f) % 16 == 0 && a.f_stride % 4 == 0 &&
           (rpg == 0 || (rpg % kFfBM == 0 && row0 % kFfBM == 0)) && (N + kFfBM - 1) / kFfBM < 65536;
}

// The runs of stages gemm_float_flat_kernel's tiles of a product take (a cluster of S blocks
// a tile) with DSV4_FLAT_SPLIT=1 (opt-in) for products of up to 1,024 rows: S doubles, up to
// 8, while every run keeps 16 stages (512 values) or more (K 4,096: 8; K 1,024: 2); 1 (no
// split) for more rows, whose tiles fill the GPU. From N and K alone (a row's bits do not
// depend on its batch). Off by default: on 43 layers (run 82, same call) prefill took 3,730 /
// 3,747 tok/s with it against 3,835 / 3,833 without. These small products run on the side
// streams beside the query path, where their few blocks cost little; split, they take every
// SM from it. gemm_flat_split_override (tests) wins.
int g_flat_split_override = -1;
uint32_t flat_splits(uint64_t N, uint64_t K) {
    static const bool env = env_switch("DSV4_FLAT_SPLIT", false);
    const bool on = g_flat_split_override >= 0 ? g_flat_split_override != 0 : env;
    if (!on || N > 1024) return 1;
    const uint64_t nst = (K + kFfK - 1) / kFfK;
    uint32_t S = 1;
    while (S < 8 && nst >= 32 * uint64_t(S)) S *= 2;
    return S;
}

// n-tiles a warp of gemm_float_flat_kernel: 4 by default; DSV4_FLAT_FLOAT_NT=1 (opt-in) takes 1
// (blocks of 32 activation rows) where the product then still fits in one wave of 2 blocks an
// SM; gemm_float_flat_ntw_override (tests) forces either. The same bits either way. Alone such
// products run ~2x faster (R 2,048, run 151: N 64 and 256 in 105 and 111 µs against 204 and
// 207), but they run on the side streams beside the query path, where 32 blocks cost it little
// and 128 take every SM from it (as DSV4_FLAT_SPLIT's clusters did): the whole model's prefill
// 4,583 against 4,632 tok/s (run 151; run 150, with N 1,024's two waves too: 4,510 / 4,603).
int g_ff_ntw_override = -1;
int ff_ntw(uint32_t R, uint64_t N) {
    static const bool env = env_int("DSV4_FLAT_FLOAT_NT", 4) == 1;
    if (g_ff_ntw_override == 1 || g_ff_ntw_override == 4) return g_ff_ntw_override;
    const uint64_t blocks = uint64_t((R + kFfBN - 1) / kFfBN) * ((N + kFfBM - 1) / kFfBM);
    return env && 4 * blocks <= 2 * uint64_t(sm_count()) ? 1 : 4;
}

// DSV4_GEMM_F16=0 keeps the float-weight products of prefill on matvec_kernel (A/B).
bool gemm_float_on() {
    static const bool on = env_switch("DSV4_GEMM_F16", true);
    return on;
}

}  // namespace

void gemm_flat_split_override(int on) { g_flat_split_override = on; }
void gemm_float_flat_ntw_override(int ntw) { g_ff_ntw_override = ntw; }
void gemm_iq2_nib_override(int on) { g_iq2_nib_override = on; }

void gemm_prefill_order(bool flat) {
    static bool raised = false;
    if (flat && !raised) {   // the flat kernels' shared memory limits (called before any capture of the round)
        const std::pair<const void*, int> kernels[] = {
            {reinterpret_cast<const void*>(gemm_q8_0_flat_kernel<3, 2, 64>), flat_smem(3, 64)},
            {reinterpret_cast<const void*>(gemm_q8_0_flat_lean_kernel<3>), flat_smem(3, 64)},
            {reinterpret_cast<const void*>(gemm_q8_0_flat_kernel<3, 1, 128>), flat_smem(3, 128)},
            {reinterpret_cast<const void*>(gemm_q8_0_flat_kernel<4, 1, 128>), flat_smem(4, 128)},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_F16, false>), kFfSmem},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_BF16, false>), kFfSmem},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_F16, true>), kFfSmem},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_BF16, true>), kFfSmem},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_F16, false, 1>), ff_smem(1)},
            {reinterpret_cast<const void*>(gemm_float_flat_kernel<T_BF16, false, 1>), ff_smem(1)}};
        for (const auto& [k, bytes] : kernels)
            check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                  "gemm: dynamic shared memory of a flat (prompt-order) kernel");
        raised = true;
    }
    g_flat_round = flat;
}
bool gemm_prefill_order() { return g_flat_round; }
void gemm_decode_round(bool on) { g_decode_round = on; }

bool gemm_float_eligible(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, uint64_t row0, uint64_t rpg,
                         bool expert) {
    if (!gemm_float_on() || expert || N == 0 || a.kind != ActKind::F32) return false;
    // a prompt round's rows, however few, take the flat kernel (one order for every chunking)
    if (float_flat_ok(W, a, N, row0, rpg)) return R >= 1;
    if (R < (g_decode_round ? g_decode_f_rows : uint32_t(kMinRows))) return false;
    if (W.type != T_F32 && W.type != T_F16 && W.type != T_BF16) return false;
    // decode's VEC path (matvec_impl's fvec) with leaves of equal chunk counts
    const uint64_t nt = decode_row_threads(W.K, N, false);
    return W.K % (8 * nt) == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.row_bytes % 16 == 0 &&
           reinterpret_cast<uintptr_t>(a.f) % 16 == 0 && a.f_stride % 4 == 0 &&
           (rpg == 0 || (rpg % kFBM == 0 && row0 % kFBM == 0));
}

void gemm_float(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                uint64_t row0, uint64_t rpg, cudaStream_t s) {
    if (R == 0 || N == 0) return;
    if (!gemm_float_eligible(W, a, R, N, row0, rpg, false)) throw_mismatch("gemm_float", W.type, W.K, a.K);
    const uint32_t cb_rows = cublas_rows(1);
    if (cb_rows && R >= cb_rows && gemm_float_cublas(W, a, R, y, y_stride, N, row0, rpg, s)) return;
    FGemm p{};
    p.w = W.data;
    p.row_bytes = W.row_bytes;
    p.K = W.K;
    p.row0 = row0;
    p.N = N;
    p.a = a.f;
    p.a_stride = a.f_stride;
    p.rpg = rpg;
    p.R = R;
    p.y = y;
    p.y_stride = y_stride;
    if (float_flat_ok(W, a, N, row0, rpg)) {
        const uint32_t S = flat_splits(N, W.K);
        const dim3 grid((R + kFfBN - 1) / kFfBN, uint32_t((N + kFfBM - 1) / kFfBM), S);
        if (S == 1 && ff_ntw(R, N) == 1) {
            const dim3 g1((R + 31) / 32, grid.y);
            if (W.type == T_F16) gemm_float_flat_kernel<T_F16, false, 1><<<g1, 256, ff_smem(1), s>>>(p);
            else gemm_float_flat_kernel<T_BF16, false, 1><<<g1, 256, ff_smem(1), s>>>(p);
        } else if (S == 1) {
            if (W.type == T_F16) gemm_float_flat_kernel<T_F16, false><<<grid, 256, kFfSmem, s>>>(p);
            else gemm_float_flat_kernel<T_BF16, false><<<grid, 256, kFfSmem, s>>>(p);
        } else {
            const auto kernel = W.type == T_F16 ? gemm_float_flat_kernel<T_F16, true> : gemm_float_flat_kernel<T_BF16, true>;
            check(launch_clusters(kernel, grid, dim3(256), kFfSmem, s, dim3(1, 1, S), p), "gemm_float (flat, split)");
        }
        check_launch("gemm_float (flat)");
        return;
    }
    p.nt = decode_row_threads(W.K, N, false);
    p.C = uint32_t(W.K / (8 * uint64_t(p.nt)));
    const uint32_t gx = uint32_t((N + kFBM - 1) / kFBM);
    // 64 activation rows a block (~225 registers: one block of 8 warps per SM), or 32
    // (~128 registers: two per SM) where 64 would not give every SM a block
    const bool big = uint64_t(gx) * ((R + 63) / 64) >= uint64_t(sm_count());
#define DSV4_FG(TT)                                                                         \
    if (W.type == TT) {                                                                     \
        if (big) gemm_float_kernel<TT, 4><<<dim3(gx, (R + 63) / 64), 256, 0, s>>>(p);       \
        else gemm_float_kernel<TT, 2><<<dim3(gx, (R + 31) / 32), 256, 0, s>>>(p);           \
    }
    DSV4_FG(T_F32)
    DSV4_FG(T_F16)
    DSV4_FG(T_BF16)
#undef DSV4_FG
    check_launch("gemm_float");
}

}  // namespace dsv4::cuda
