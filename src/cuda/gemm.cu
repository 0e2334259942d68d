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

__host__ __device__ constexpr int bitrev5(int j) {
    return ((j & 1) << 4) | ((j & 2) << 2) | (j & 4) | ((j & 8) >> 2) | ((j & 16) >> 4);
}

// The "lane" sums of one leaf: blocks l, l + 32, ... for this thread's 2 × 2 tiles
// (16 values: tile (mt, nt), element e of the MMA's accumulator layout).
__device__ __forceinline__ void leaf_sums(const Gemm& p, int l, const int8_t* const (&wr)[2][2],
                                          const uint16_t* const (&wdr)[2][2], const int8_t* const (&ar)[2],
                                          const float* const (&adr)[2][2], uint32_t tig, float (&acc)[2][2][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    const uint64_t nb = p.K / 32;
    for (uint64_t b = uint64_t(l); b < nb; b += 32) {
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

__global__ void __launch_bounds__(128) gemm_q8_0_kernel(Gemm p) {
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
    // The butterfly's tree, leaf by leaf: after leaf j, merge as many levels as j + 1 has
    // trailing zero bits (a binary counter); st[i] holds a finished subtree of 2^i leaves.
    float st[5][2][2][4];
    float cur[2][2][4];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        leaf_sums(p, bitrev5(j), wr, wdr, ar, adr, tig, cur);
        int level = 0;
#pragma unroll
        for (int c = j + 1; (c & 1) == 0; c >>= 1, ++level)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) cur[mt][nt][e] = st[level][mt][nt][e] + cur[mt][nt][e];
        if (level < 5)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) st[level][mt][nt][e] = cur[mt][nt][e];
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t n = m0 + mt * 16 + gid + 8 * (e >> 1);
                const uint32_t r = n0 + nt * 8 + 2 * tig + (e & 1);
                if (n < p.N && r < p.R) p.y[uint64_t(r) * p.y_stride + n] = cur[mt][nt][e];
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

constexpr int kKqBM = 128;   // weight rows per block: 4 warps × 2 MMA tiles of 16

template <uint32_t T, int NW>
__global__ void __launch_bounds__(128) gemm_kq_kernel(KqGemm p) {
    constexpr uint32_t BODY = T == T_IQ2_XXS ? 64 : 80, AUX = T == T_IQ2_XXS ? 1 : 2;
    const uint32_t gi = blockIdx.y;
    if (gi >= uint32_t(*p.count)) return;
    const int32_t* g = p.grp + 3 * gi;
    const uint64_t wbase = uint64_t(g[0]) * p.rows_per_expert;
    const int cnt = g[2];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint64_t m0 = uint64_t(blockIdx.x) * kKqBM + warp * 32;
    const uint64_t nsb = p.K / 256;
    // this thread's B column (pair gid) and C columns (pairs 2tig, 2tig+1); dead columns
    // repeat the last live pair and are not stored
    const uint32_t pb = uint32_t(p.pairs[g[1] + min(int(gid), cnt - 1)]);
    const int8_t* ab = p.aq + uint64_t(pb / p.act_div) * p.AL;
    uint32_t pc[2];
    const float* adc[2];
    const int32_t* bsc[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        pc[c] = uint32_t(p.pairs[g[1] + min(int(2 * tig) + c, cnt - 1)]);
        adc[c] = p.ad + uint64_t(pc[c] / p.act_div) * (p.AL / 256);
        bsc[c] = p.absum + uint64_t(pc[c] / p.act_div) * (p.AL / 16);
    }
    const uint8_t* wr[NW][2][2];
    const uint16_t* wdr[NW][2][2];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint64_t row = wbase + min(m0 + mt * 16 + gid + 8 * h, p.N - 1);
                wr[j][mt][h] = p.wq[j] + row * nsb * BODY;
                wdr[j][mt][h] = p.wd[j] + row * nsb * AUX;
            }
    float st[3][NW][2][4], cur[NW][2][4];
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
        const int leaf = ((jj & 1) << 2) | (jj & 2) | ((jj & 4) >> 2);   // bit-reversed 3 bits
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) cur[j][mt][e] = 0.0f;
        for (uint64_t sb = uint64_t(leaf); sb < nsb; sb += 8) {
            int isum[NW][2][4], mins[NW][2][4];
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) isum[j][mt][e] = mins[j][mt][e] = 0;
            if constexpr (T == T_IQ2_XXS) {
#pragma unroll 2
                for (int grp32 = 0; grp32 < 8; ++grp32) {
                    const int8_t* ak = ab + sb * 256 + 32 * grp32 + 4 * tig;
                    const uint32_t b[2] = {ld32(ak), ld32(ak + 16)};
#pragma unroll
                    for (int j = 0; j < NW; ++j)
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            uint32_t a0w[2], a1w[2];
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const uint2 q = *reinterpret_cast<const uint2*>(wr[j][mt][h] + sb * BODY + 8 * grp32);
                                a0w[h] = q.x;
                                a1w[h] = q.y;
                            }
                            // a[0..3]: rows gid / gid+8 at k = 4tig.. (grid row tig>>1) and k + 16
                            const uint32_t a[4] = {
                                iq2_word(p.grid, p.sign, a0w[0], a1w[0], tig >> 1, tig & 1),
                                iq2_word(p.grid, p.sign, a0w[1], a1w[1], tig >> 1, tig & 1),
                                iq2_word(p.grid, p.sign, a0w[0], a1w[0], 2 + (tig >> 1), tig & 1),
                                iq2_word(p.grid, p.sign, a0w[1], a1w[1], 2 + (tig >> 1), tig & 1)};
                            int d[4];
                            mma_s8(a, b, d);
#pragma unroll
                            for (int e = 0; e < 4; ++e) isum[j][mt][e] += d[e] * int(2 * (a1w[e >> 1] >> 28) + 1);
                        }
                }
            } else {
                // Q2_K: sub-block u = 8h + 2jp + s holds values 16u + t at code bytes
                // 32h + 16s + t, bits 2jp; its scale byte is scales[u]
                uint4 sc[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) sc[mt][h] = *reinterpret_cast<const uint4*>(wr[0][mt][h] + sb * BODY);
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    const uint32_t hh = u >> 3, jp = (u >> 1) & 3, s = u & 1;
                    const uint32_t b = ld32(ab + sb * 256 + 16 * u + 4 * tig);
                    const int bs[2] = {bsc[0][sb * 16 + u], bsc[1][sb * 16 + u]};
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt) {
                        uint32_t a[2], scb[2];
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const uint32_t qw =
                                *reinterpret_cast<const uint32_t*>(wr[0][mt][h] + sb * BODY + 16 + 32 * hh + 16 * s + 4 * tig);
                            a[h] = (qw >> (2 * jp)) & 0x03030303u;
                            const uint32_t wsel = u >> 2, words[4] = {sc[mt][h].x, sc[mt][h].y, sc[mt][h].z, sc[mt][h].w};
                            scb[h] = (words[wsel] >> (8 * (u & 3))) & 0xFF;
                        }
                        int d[4];
                        mma_s8_k16(a[0], a[1], b, d);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            isum[0][mt][e] += d[e] * int(scb[e >> 1] & 0xF);
                            mins[0][mt][e] += int(scb[e >> 1] >> 4) * bs[e & 1];
                        }
                    }
                }
            }
            // the super-block's float step, as the decode kernel's lane 4j does it
            float dx[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) dx[c] = adc[c][sb];
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const uint16_t* wd = wdr[j][mt][e >> 1] + sb * AUX;
                        if constexpr (T == T_IQ2_XXS) {
                            cur[j][mt][e] = fmaf(f16_to_f32(wd[0]) * dx[e & 1], float(isum[j][mt][e]), cur[j][mt][e]);
                        } else {
                            const float dall = dx[e & 1] * f16_to_f32(wd[0]), dmin = dx[e & 1] * f16_to_f32(wd[1]);
                            cur[j][mt][e] += fmaf(dall, float(isum[j][mt][e]), -(dmin * float(mins[j][mt][e])));
                        }
                    }
        }
        int level = 0;
#pragma unroll
        for (int c = jj + 1; (c & 1) == 0; c >>= 1, ++level)
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) cur[j][mt][e] = st[level][j][mt][e] + cur[j][mt][e];
        if (level < 3)
#pragma unroll
            for (int j = 0; j < NW; ++j)
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) st[level][j][mt][e] = cur[j][mt][e];
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint64_t n = m0 + mt * 16 + gid + 8 * (e >> 1);
            const int c = int(2 * tig) + (e & 1);
            if (n >= p.N || c >= cnt) continue;
            // the butterfly's last two steps add the zero lanes' sums
            float v = (cur[0][mt][e] + 0.0f) + 0.0f;
            if (T == T_IQ2_XXS) v *= 0.125f;
            if constexpr (NW == 2) {
                float u = (cur[NW - 1][mt][e] + 0.0f) + 0.0f;
                if (T == T_IQ2_XXS) u *= 0.125f;
                v = swiglu_pair(v, u, p.clamp, p.ew, pc[e & 1]);
            }
            p.y[uint64_t(pc[e & 1]) * p.y_stride + n] = v;
        }
}

}  // namespace

bool gemm_q8_0_eligible(const DevWeight& W, uint32_t R, uint64_t N, uint64_t rpg, bool expert) {
    static const bool on = [] {
        const char* e = std::getenv("DSV4_CUDA_TC");
        return !e || e[0] != '0';
    }();
    // Only where decode takes matvec_kernel's warp per row (plain rows, not the wide blocks
    // of launch_rb: N <= 1024 with K >= 2048), whose order of sums this kernel follows.
    const bool wide = N <= 1024 && W.K >= 2048;
    return on && W.type == T_Q8_0 && !expert && !wide && R >= uint32_t(kMinRows) && W.K % 32 == 0 &&
           (rpg == 0 || rpg % kBM == 0);
}

void gemm_q8_0(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
               uint64_t row0, uint64_t rpg, cudaStream_t s) {
    if (R == 0 || N == 0) return;
    if (W.type != T_Q8_0 || a.kind != ActKind::Q8_0 || (rpg && rpg % kBM)) throw_mismatch("gemm_q8_0", W.type, W.K, a.K);
    Gemm p{W.qs, W.d, W.K, row0, N, a.q, a.d, a.K, rpg, R, y, y_stride};
    const dim3 grid(uint32_t((N + kBM - 1) / kBM), (R + kBN - 1) / kBN);
    gemm_q8_0_kernel<<<grid, 128, 0, s>>>(p);
    check_launch("gemm_q8_0");
}

bool gemm_kq_eligible(const DevWeight& W, const MoeGroups* groups) {
    static const bool on = [] {
        const char* e = std::getenv("DSV4_CUDA_TC");
        return !e || e[0] != '0';
    }();
    return on && groups && groups->per_group == 8 && (W.type == T_IQ2_XXS || W.type == T_Q2_K) && W.K % 256 == 0;
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
    const dim3 grid(uint32_t((N + kKqBM - 1) / kKqBM), g.cap), block(128);
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
