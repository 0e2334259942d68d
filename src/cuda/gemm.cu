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
#include <cstdint>
#include <cstdlib>

#include "cuda/common.cuh"

namespace dsv4::cuda {
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

// Element-wise over register fragment arrays of any shape (fully unrolled).
template <typename F>
__device__ __forceinline__ void each(float& x, F&& f) {
    f(x);
}
template <typename F>
__device__ __forceinline__ void each(int& x, F&& f) {
    f(x);
}
template <typename T, int N, typename F>
__device__ __forceinline__ void each(T (&a)[N], F&& f) {
#pragma unroll
    for (int i = 0; i < N; ++i) each(a[i], f);
}
template <typename F>
__device__ __forceinline__ void each2(float& x, float& y, F&& f) {
    f(x, y);
}
template <typename T, int N, typename F>
__device__ __forceinline__ void each2(T (&a)[N], T (&b)[N], F&& f) {
#pragma unroll
    for (int i = 0; i < N; ++i) each2(a[i], b[i], f);
}

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
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t n = m0 + mt * 16 + gid + 8 * (e >> 1);
                const uint32_t r = n0 + nt * 8 + 2 * tig + (e & 1);
                if (n < p.N && r < p.R) p.y[uint64_t(r) * p.y_stride + n] = total[mt][nt][e];
            }
}

// ---- the routed experts' 2-bit products (IQ2_XXS gate+up, Q2_K down), by pair group -------
// The decode kernel (kq_kernel) sums a super-block's integer products exactly, then lane
// 4j (j = sb mod 8) adds the super-block's float step to its sum, and the warp's butterfly
// adds the 8 lane sums (and the 24 zero lanes: "+ 0" twice at the end). Here one MMA per
// 32-value group (IQ2_XXS, codes expanded from the grid) or per 16-value sub-block (Q2_K:
// each has its own scale) gives the same integers for 16 weight rows × the 8 pairs of a
// group; the super-blocks are visited leaf by leaf in the butterfly's order (bit-reversed
// j) and the leaf sums merged through a stack of three.

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

struct KqGemm {
    const uint8_t* wq[2];     // repacked code bytes of gate (and up)
    const uint16_t* wd[2];    // their f16 scales
    uint64_t K, N, rows_per_expert;
    const int8_t* aq;
    const float* ad;
    const int32_t* absum;
    uint64_t AL;
    uint32_t act_div;
    const int32_t *grp, *pairs, *count;
    float* y;
    uint64_t y_stride;
    float clamp;
    const float* ew;
    const uint64_t *grid, *sign;
};

// A warp: MT tiles of 16 weight rows × NT tiles of 8 pairs, so each expanded weight
// fragment serves NT × 8 pairs; a group of kKqPairs pairs takes kKqPairs / (8 NT) passes.
// A block: 4 warps, 64 MT rows. IQ2_XXS (costly expansion): MT 1, NT 4; Q2_K (its mins need
// a per-pair sum per sub-block): MT 2, NT 2.
constexpr uint32_t kKqPairs = 32;   // MoeGroups::per_group for these kernels
template <uint32_t T>
constexpr int kq_mt() { return T == T_IQ2_XXS ? 1 : 2; }
template <uint32_t T>
constexpr int kq_nt() { return T == T_IQ2_XXS ? 4 : 2; }

template <uint32_t T, int NW>
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
        float st[3][NW][MT][NT][4], cur[NW][MT][NT][4];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int leaf = ((jj & 1) << 2) | (jj & 2) | ((jj & 4) >> 2);   // bit-reversed 3 bits
            each(cur, [](float& x) { x = 0.0f; });
            for (uint64_t sb = uint64_t(leaf); sb < nsb; sb += 8) {
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
            }
            tree_push(jj, st, cur);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const uint64_t n = m0 + mt * 16 + gid + 8 * (e >> 1);
                    const int c = nt * 8 + int(2 * tig) + (e & 1);
                    if (n >= p.N || c >= cnt) continue;
                    // the butterfly's last two steps add the zero lanes' sums
                    float v = (cur[0][mt][nt][e] + 0.0f) + 0.0f;
                    if (T == T_IQ2_XXS) v *= 0.125f;
                    if constexpr (NW == 2) {
                        float u = (cur[NW - 1][mt][nt][e] + 0.0f) + 0.0f;
                        if (T == T_IQ2_XXS) u *= 0.125f;
                        v = swiglu_pair(v, u, p.clamp, p.ew, pc[nt][e & 1]);
                    }
                    p.y[uint64_t(pc[nt][e & 1]) * p.y_stride + n] = v;
                }
    }
}

}  // namespace

namespace {
// DSV4_CUDA_TC=0 keeps every product on the decode kernels (measurements).
bool tensor_cores_on() {
    static const bool on = [] {
        const char* e = std::getenv("DSV4_CUDA_TC");
        return !e || e[0] != '0';
    }();
    return on;
}
}  // namespace

bool gemm_q8_0_eligible(const DevWeight& W, uint32_t R, uint64_t N, uint64_t rpg, bool expert) {
    return tensor_cores_on() && W.type == T_Q8_0 && !expert && R >= uint32_t(kMinRows) && W.K % 32 == 0 &&
           (rpg == 0 || rpg % kBM == 0);
}

void gemm_q8_0(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
               uint64_t row0, uint64_t rpg, cudaStream_t s) {
    if (R == 0 || N == 0) return;
    if (W.type != T_Q8_0 || a.kind != ActKind::Q8_0 || (rpg && rpg % kBM))
        throw_mismatch("gemm_q8_0", W.type, W.K, a.K);
    Gemm p{W.qs, W.d, W.K, row0, N, a.q, a.d, a.K, rpg, R, y, y_stride};
    const dim3 grid(uint32_t((N + kBM - 1) / kBM), (R + kBN - 1) / kBN);
    switch (decode_row_threads(W.K, N, false)) {
        case 1024: gemm_q8_0_kernel<1024><<<grid, 128, 0, s>>>(p); break;
        case 256: gemm_q8_0_kernel<256><<<grid, 128, 0, s>>>(p); break;
        default: gemm_q8_0_kernel<32><<<grid, 128, 0, s>>>(p); break;
    }
    check_launch("gemm_q8_0");
}

uint32_t gemm_kq_pairs() { return kKqPairs; }

bool gemm_kq_eligible(const DevWeight& W, const MoeGroups* groups) {
    return tensor_cores_on() && groups && groups->per_group == kKqPairs && (W.type == T_IQ2_XXS || W.type == T_Q2_K) &&
           W.K % 256 == 0;
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
    iq2_tables(&p.grid, &p.sign);
    const uint32_t bm = 64 * uint32_t(Wg.type == T_IQ2_XXS ? kq_mt<T_IQ2_XXS>() : kq_mt<T_Q2_K>());
    const dim3 grid(uint32_t((N + bm - 1) / bm), g.cap), block(128);
    if (Wg.type == T_IQ2_XXS) {
        if (Wu) gemm_kq_kernel<T_IQ2_XXS, 2><<<grid, block, 0, s>>>(p);
        else gemm_kq_kernel<T_IQ2_XXS, 1><<<grid, block, 0, s>>>(p);
    } else {
        if (Wu) throw_mismatch("gemm_kq_experts: Q2_K gate+up has no tensor-core kernel", Wg.type, Wg.K, a.K);
        gemm_kq_kernel<T_Q2_K, 1><<<grid, block, 0, s>>>(p);
    }
    check_launch("gemm_kq_experts");
}

}  // namespace dsv4::cuda
