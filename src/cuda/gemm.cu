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

}  // namespace dsv4::cuda
