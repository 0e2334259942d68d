// What gemm.cu and its Hopper-only part (sm90a/experts_wgmma.cu, compiled for sm_90a alone:
// wgmma exists only there) share: the routed experts' product parameters and pair groups, the
// cp.async and fragment helpers, and the fast mode's FP16 experts kernel, whose warpgroup-MMA
// forms (WG, WG2) only that file instantiates.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "cuda/common.cuh"
#include "cuda/iq2.cuh"

namespace dsv4::cuda::xf {

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
    const uint32_t* sel;   // the IQ2_XXS sign selectors (iq2.cuh)
    const uint64_t *hgrid, *hsign;   // the IQ2_XXS half selectors' parts (iq2.cuh; the fast experts kernel)
    bool skip_tiles;       // the staged kernels skip a warp's tiles past the group (PairTiles)
    bool stage_used;       // the fast experts kernel stages only the pairs its MMAs read (DSV4_XF_STAGE_USED)
    bool paired_codes;     // the fast Q2_K kernel stages a tile pair's code bytes once (DSV4_XF_PAIRED_CODES)
    bool ws_persist;       // the WS form: one block an SM over the round's items (DSV4_XF_WS_PERSIST)
    uint8_t ws_ahead;      // the WS form: tiles whose copies fly while its producer expands one (DSV4_XF_WS_AHEAD)
};

// A staged expert block's group of pairs (blockIdx.y): its expert's first weight row, its pairs and
// their count (at most cap); false past the round's groups.
struct ExpertGroup {
    uint64_t wbase;
    const int32_t* pairs;
    int cnt;
};
// Group gi of the round (gi below its count).
__device__ __forceinline__ ExpertGroup expert_group_at(const KqGemm& p, uint32_t gi, int cap) {
    const int32_t* g = p.grp + 3 * gi;
    return {uint64_t(g[0]) * p.rows_per_expert, p.pairs + g[1], min(g[2], cap)};
}
__device__ __forceinline__ bool expert_group(const KqGemm& p, int cap, ExpertGroup& eg) {
    const uint32_t gi = blockIdx.y;
    if (gi >= uint32_t(*p.count)) return false;
    eg = expert_group_at(p, gi, cap);
    return true;
}
// Two groups a block (the fast experts kernel's WG2 form): the block of a group also takes the
// next group if it is the same expert's (an expert's groups are consecutive, each but its last
// full, their pairs contiguous: matvec.cu, moe_groups_kernel), so eg grows to up to twice the
// group size; false (nothing to do) for a group after an odd number of its expert's groups,
// which the block before takes.
__device__ __forceinline__ bool expert_group_pair(const KqGemm& p, ExpertGroup& eg) {
    const int gi = int(blockIdx.y);
    const int32_t e = p.grp[3 * gi];
    int before = 0;
    while (before < gi && p.grp[3 * (gi - before - 1)] == e) ++before;
    if (before & 1) return false;
    if (gi + 1 < *p.count && p.grp[3 * (gi + 1)] == e) eg.cnt += p.grp[3 * (gi + 1) + 2];
    return true;
}

constexpr uint32_t kKqFlatPairs = 64;   // pairs a group in k order (prompt rounds; decode's order: gemm.cu kKqPairs)

// The fast experts kernels' tiles of 8 pairs holding one of a group's cnt pairs (all nt of the
// block's without skip_tiles), and the pairs whose activations they stage and expand: all the
// block's (copies of the last past cnt), or (stage_used) only those the MMAs read, whole 16-pair
// steps (ldmatrix.x4, wgmma's N): the rest of B is never read.
__device__ __forceinline__ int xf_pair_tiles(const KqGemm& p, int cnt, int nt) {
    return p.skip_tiles ? (cnt + 7) / 8 : nt;
}
__device__ __forceinline__ uint32_t xf_staged_pairs(const KqGemm& p, int cnt, uint32_t pairs) {
    return p.skip_tiles && p.stage_used ? 16 * ((cnt + 15) / 16) : pairs;
}

// f(std::integral_constant<int, min(n, NT)>) for a run-time n >= I: the kernel's tile loops
// with the count a constant.
template <int I, int NT, typename F>
__device__ __forceinline__ void with_tiles(int n, F&& f) {
    if constexpr (I >= NT) f(std::integral_constant<int, NT>{});
    else if (n <= I) f(std::integral_constant<int, I>{});
    else with_tiles<I + 1, NT>(n, f);
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// ---- The fast mode's routed Q2_K experts: FP16 tensor cores (DSV4_EXPERTS_F16; --fast-prefill) --
// The exact kernels (gemm.cu) keep the CPU's k-order bits, which costs them an int32 sum and a
// scale step per 16-value sub-block and MMA. The fast mode's rounds may take other bits, so
// here each Q2_K weight becomes its FP16 value d · sc · q - dmin · m (times 2^8) and each Q8_K
// activation code q · dx, and one m16n8k16 MMA a 16 × 8 × 16 step adds in FP32 across the
// whole row. Errors: each operand's FP16 rounding (2^-11 relative), the FP32 sum's order.
// (Its first form, run 155/156, also took the IQ2_XXS gate+up and expanded every weight into
// shared memory for ldmatrix: L1/shared 92 % busy, gate+up 1.67x slower than the exact kernel,
// down only 6 % faster. So the weights now never touch shared memory as halves, and IQ2_XXS,
// whose grid lookups the exact kernel already makes in registers, keeps that kernel.)
//
// The weights go straight from their staged code bytes into the A fragments: the k order
// inside a 64-value tile is permuted (A and B alike, so the sums are the same products) so
// that the 16 values a thread holds of a row in the tile's four k-steps are one whole
// sub-block, 16 code bytes at one shift under one scale byte: thread tig of a k-step holds
// slots 2 tig + e and 2 tig + 8 + e, which carry the tile's logical values
// 16 tig + 4 ks + 2 hi + e (hi: the second slot pair). The activations are stored in that
// physical order (xf_slot) when they are expanded; ldmatrix then reads them as usual.
// A block: 256 weight rows (8 warps of 32 rows, 2 m-tiles) × the group's 64 pairs (8 n-tiles,
// the empty ones skipped), k tiles of 64 in 4 cp.async stages with one barrier a tile: at tile
// i the block waits for the stage of tile i + 1, issues tile i + 3 into the stage tile i - 1
// left, expands tile i + 1's activations into the other B buffer, and runs tile i's MMAs,
// expanding its weights from the stage as it goes. bench/gpu/xf_layout.py emulates this index
// math on the host. Run 157 (H100): a fast chunk's down projection 3.54 -> 2.64 us a token;
// run 161 (H100): its IQ2_XXS gate+up (below) 4.28 -> 4.04.
constexpr int kXfRows = 256;                 // weight rows a block's stage holds
constexpr int kXfK = 64;                     // k a tile
constexpr int kXfStages = 4;                 // raw stages: tile i read, i + 1 expanded, i + 2 and i + 3 in flight
constexpr int kXfRowH = kXfK * 2 + 16;       // bytes a B row of 64 halves takes (ldmatrix rows on distinct banks)
constexpr uint32_t kXfGridCopies = 16;       // IQ2_XXS: copies of the half selector tables
// The weights' FP16 values times 2^8 (divided out of the sums: a power of two, exact), so that
// rows of small scales keep normal halves.
constexpr float kXfWScale = 256.0f;
// Output rows a block: Q2_K its 256 stage rows; IQ2_XXS 128 rows of gate and the same of up.
constexpr int xf_block_rows(uint32_t T) { return T == T_IQ2_XXS ? kXfRows / 2 : kXfRows; }
// The kernel's forms: kXfMma (mma.sync), kXfWg (warpgroup MMA), kXfWg2 (warpgroup MMA over two
// groups of an expert at once: 128 pairs, 512 threads; below). (WGC, WG in clusters of two or
// four blocks sharing their group's staged activations, measured slower and removed: run 197,
// bench/gpu/NOTES.md "Forty-third round"; the code is in 8d63629.)
// kXfWs (sm90a/experts_ws.cu): warp-specialised, a producer warpgroup and four consumers
// (launch_experts_ws).
constexpr int kXfMma = 0, kXfWg = 1, kXfWg2 = 2, kXfWs = 3;
constexpr int xf_threads(int form) { return form == kXfWg2 ? 512 : 256; }
constexpr int xf_pairs(int form) { return form == kXfWg2 ? 2 * int(kKqFlatPairs) : int(kKqFlatPairs); }
// SB (the WG form's Q2_K down, DSV4_XF_SECTORS, on by default): the staging in whole 32-byte
// sectors. Run 208 (H100) found the tile loop without the expansion and the MMAs (DIAG 4) taking
// 1.75 of the down's 2.04 us a token of a fast chunk: its copies pulled ~26 KB of L2 sectors a
// block-tile for ~10 KB used, the scale bytes and (d, dmin) 4 bytes a row every tile (one sector
// each) and dx the same every tile of a super-block. SB copies a super-block's 16 scale bytes,
// (d, dmin) and dx once (two buffers by the super-block's parity). Run 209: the down 2.06 ->
// 1.80 (its tile loop alone 1.75 -> 1.06); run 210: the 36-layer fast prefill 10,023 tok/s.
// (The IQ2_XXS gate+up the same way, its tile pair's code bytes a row by adjacent threads and dx
// once a super-block, was 3-6 % slower in runs 209, 210, its loop alone unchanged: removed, the
// code is in e5e8088.)
template <uint32_t T, int FORM = kXfMma, bool SB = false>
struct XfSmem {
    static constexpr bool iq2 = T == T_IQ2_XXS;
    static constexpr int pairs = xf_pairs(FORM);
    // [2] B buffers: the activations as halves, xf_slot order: 64 rows of kXfRowH (ldmatrix), or
    // wgmma's K-major core matrices (xf_wg_offset)
    static constexpr int b = 0, b_bytes = FORM != kXfMma ? pairs * kXfK * 2 : pairs * kXfRowH;
    // a raw stage: the weights' codes [256][32] (Q2_K: the half of the super-block's 64 code
    // bytes holding the tile; IQ2_XXS [256][16]: the tile's two 8-byte groups, gate's rows then
    // up's), Q2_K's scale bytes [256][4] (the tile's 4 sub-blocks), (d, dmin) [256] (IQ2_XXS: d
    // and its neighbour, the 4-byte word holding it), activation codes [64][64], their dx [64]
    static_assert(!SB || !iq2, "SB: the Q2_K down");
    // (SB: the scale bytes and (d, dmin) in sbq, dx in sbx)
    static constexpr int st_codes = 0, st_sc = st_codes + kXfRows * (iq2 ? 16 : 32),
                         st_dw = st_sc + (iq2 || SB ? 0 : kXfRows * 4), st_act = st_dw + (SB ? 0 : kXfRows * 4),
                         st_dx = st_act + pairs * kXfK, st_bytes = st_dx + (SB ? 0 : pairs * 4);
    static constexpr int stage = b + 2 * b_bytes;
    // SB: [2] by super-block parity: the scale bytes [256][16] and (d, dmin) [256]; dx [pairs]
    static constexpr int sbq = stage + kXfStages * st_bytes, sbq_bytes = SB ? kXfRows * 20 : 0;
    static constexpr int sbx = sbq + 2 * sbq_bytes, sbx_bytes = SB ? pairs * 4 : 0;
    // IQ2_XXS: the half selectors' grid parts [256] and sign parts [128] (iq2.cuh), row i's copy
    // c at 8-byte slot 16 i + c: a half-warp's lookups fall on 16 different bank pairs
    static constexpr int hgrid = sbx + 2 * sbx_bytes;
    static constexpr int hsign = hgrid + (iq2 ? 256 * kXfGridCopies * 8 : 0);
    static constexpr int bytes = hsign + (iq2 ? 128 * kXfGridCopies * 8 : 0);
};
static_assert(2 * (XfSmem<T_Q2_K>::bytes + 1024) <= 228 * 1024, "fast Q2_K experts: 2 blocks an SM");
static_assert(2 * (XfSmem<T_IQ2_XXS>::bytes + 1024) <= 228 * 1024, "fast IQ2_XXS experts: 2 blocks an SM");
static_assert(XfSmem<T_IQ2_XXS, kXfWg2>::bytes + 1024 <= 228 * 1024, "fast IQ2_XXS experts (WG2): 1 block an SM");
static_assert(2 * (XfSmem<T_Q2_K, kXfWg, true>::bytes + 1024) <= 228 * 1024, "fast Q2_K experts (SB): 2 blocks an SM");
// The byte offset in a B row of the half pair carrying a tile's logical values 16 tig + j, j
// = 4 ks + 2 hi (+ 0, 1): physical slot 16 ks + 8 hi + 2 tig.
__host__ __device__ constexpr uint32_t xf_slot(uint32_t tig, uint32_t j) {
    return 2 * (16 * (j >> 2) + 8 * ((j >> 1) & 1) + 2 * tig);
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ uint32_t h2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t h2_sub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t h2_of(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ void mma_f16_acc(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// ---- Hopper's warpgroup MMA (sm_90a only: the WG kernel, sm90a/experts_wgmma.cu) ------------
// wgmma.mma_async m64nNk16, f16 operands, f32 sums, A from registers in mma.sync m16n8k16's
// fragment layout (warp w of the warpgroup: rows 16 w ..), B from shared memory by a
// descriptor in the K-major core-matrix layout without swizzle (8 rows × 16 bytes, 128
// contiguous bytes each; LBO: the two core matrices of a k-step's 16 k, SBO: groups of 8 rows),
// the sums in mma.sync's D layout side by side (run 163, an H100: bench/gpu/wgmma_probe.cu
// exact in this layout; ~925 TFLOP/s at 4 warpgroups an SM).
// The descriptor of a B k-step of PAIRS pairs at smem: LBO PAIRS × 16 bytes, SBO 128.
template <int PAIRS>
__device__ __forceinline__ uint64_t wg_desc(const void* smem) {
    return uint64_t((smem_addr(smem) & 0x3FFFF) >> 4) | uint64_t((PAIRS * 16) >> 4) << 16 | uint64_t(128 >> 4) << 32;
}
// d += A · Bᵀ for N pairs (the first N / 2 of d; N a multiple of 16 up to 128)
template <int N, int D>
__device__ __forceinline__ void wg_mma(float (&d)[D], const uint32_t (&a)[4], uint64_t desc) {
    static_assert(N % 16 == 0 && N >= 16 && N <= 128 && N / 2 <= D, "wgmma m64nNk16 here: N 16..128");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 16)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 32)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 48)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n48k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, {%24,%25,%26,%27}, %28, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 64)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 80)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, {%40,%41,%42,%43}, %44, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 96)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 112)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n112k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55}, {%56,%57,%58,%59}, %60, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
    if constexpr (N == 128)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
#else
    (void)d, (void)a, (void)desc;
    __trap();
#endif
}
__device__ __forceinline__ void wg_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wg_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accesses of x across a wg_wait (the wgmma writes x unseen).
__device__ __forceinline__ void wg_fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }
// Generic-proxy stores to shared memory made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// The byte offset in a wgmma B buffer of PAIRS pairs of pair n's half pair at xf_slot(tig, j):
// its physical k slot 16 ks + 8 hi + 2 tig in core matrix (ks, hi, n / 8), row n % 8.
template <int PAIRS>
__host__ __device__ constexpr uint32_t xf_wg_offset(uint32_t n, uint32_t tig, uint32_t j) {
    return (j >> 2) * (PAIRS * 32) + ((j >> 1) & 1) * (PAIRS * 16) + (n / 8) * 128 + (n % 8) * 16 + 4 * tig;
}

// Bytes 0, 1 (sel 0x4140) or 2, 3 (0x4342) of w as halves 1024 + byte: the byte under the
// exponent of 1024, where the halves' spacing is 1.
__device__ __forceinline__ uint32_t h2_magic(uint32_t w, uint32_t sel) { return prmt(w, 0x64646464u, sel); }

// A 16-byte chunk of a pair's activation codes q (int8) as halves q · dx (q: 1024 + (q ^ 0x80) -
// 1152), values 2 m, 2 m + 1 of the chunk (m = 0 .. 7: logical values j = 2 m of xf_slot) stored
// as one word at at(j), wherever the B layout at hand puts them (the WG and WS kernels).
template <typename At>
__device__ __forceinline__ void xf_expand_chunk(const uint4 v, float dx, At&& at) {
    const uint32_t dx2 = h2_of(dx, dx), k1152 = 0x64806480u;
    const uint32_t vw[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k) {
        *at(4 * k) = h2_mul(h2_sub(h2_magic(vw[k], 0x4140), k1152), dx2);
        *at(4 * k + 2) = h2_mul(h2_sub(h2_magic(vw[k], 0x4342), k1152), dx2);
    }
}
// Q2_K, a row's sub-block (the WG and WS kernels): its step a · q + b (times 2^8) from the
// super-block's (d, dmin) word dd and the sub-block's scale byte sc; as half pairs a2, b2.
__device__ __forceinline__ float2 xf_q2k_ab(uint32_t dd, uint32_t sc) {
    return make_float2(f16_to_f32(uint16_t(dd & 0xFFFF)) * kXfWScale * float(sc & 15),
                       -(f16_to_f32(uint16_t(dd >> 16)) * kXfWScale * float(sc >> 4)));
}
__device__ __forceinline__ void xf_q2k_steps(uint32_t dd, uint32_t sc, uint32_t& a2, uint32_t& b2) {
    const float2 ab = xf_q2k_ab(dd, sc);
    a2 = h2_of(ab.x, ab.x);
    b2 = h2_of(ab.y, ab.y);
}
// Q2_K: a code word's four 2-bit codes at shift sh as two half pairs of an A fragment, each
// value a · q + b.
__device__ __forceinline__ void xf_q2k_frag(uint32_t w, int sh, uint32_t a2, uint32_t b2, uint32_t& lo, uint32_t& hi) {
    const uint32_t m = (w >> sh) & 0x03030303u, k1024 = 0x64006400u;
    lo = h2_fma(h2_sub(h2_magic(m, 0x4140), k1024), a2, b2);
    hi = h2_fma(h2_sub(h2_magic(m, 0x4342), k1024), a2, b2);
}
// IQ2_XXS, a thread's stage row at tile i (the WG and WS kernels): its group tig / 2's words as
// the grid indices a2 (shifted to grid row 2 (tig % 2)) and signs b2 (to its 7 bits), and its
// scale s2 as a half pair; at a super-block's first tile its d (staged then alone; the high half
// of the staged word when the row's parity dpar differs from the super-block's) into d2, which
// the row keeps for the super-block's other tiles.
__device__ __forceinline__ void xf_iq2_row(const uint8_t* codes, const uint8_t* dw, int i, uint32_t dpar, uint32_t tig,
                                           uint32_t& d2, uint32_t& a2, uint32_t& b2, uint32_t& s2) {
    const uint2 gw = *reinterpret_cast<const uint2*>(codes + (tig >> 1) * 8);
    if ((i & 3) == 0) {
        const uint32_t dd = *reinterpret_cast<const uint32_t*>(dw);
        const uint32_t hi = (dpar ^ uint32_t(i >> 2)) & 1;
        const __half2 dh = __half2half2(__ushort_as_half(uint16_t(dd >> (16 * hi))));
        d2 = *reinterpret_cast<const uint32_t*>(&dh);
    }
    // d · (0.5 + s) / 4 · 2^8 = d · (32 + 64 s) by one HMUL2 of d (both halves) and the half 32 +
    // 64 s (exact: 1056 + 64 s is the half 0x6420 + 64 s, less 1024): the exact product rounded
    // once, as the float product's rounding to a half was, in ~5 instructions instead of ~9
    static_assert(0.25f * kXfWScale == 64.0f, "the scale step below assumes 2^8");
    const uint32_t c2 = ((gw.y >> 22) & 0x3C0u) * 0x10001u + 0x64206420u;
    a2 = gw.x >> (16 * (tig & 1));
    b2 = gw.y >> (14 * (tig & 1));
    s2 = h2_mul(d2, h2_sub(c2, 0x64006400u));
}
// IQ2_XXS: the selectors of grid row 2 (tig % 2) + ks / 2 (words: values 0-3, 4-7) from the half
// selector tables (ks: a constant once the caller's loop is unrolled), by its index byte and 7
// sign bits (x 128: the tables' row stride); copy8: this lane's copy of the tables as the
// lookups' low offset bits, ORed into the row's (disjoint bits), so the tables' base stays uniform.
__device__ __forceinline__ uint2 xf_iq2_selectors(const uint8_t* hgrid, const uint8_t* hsign, uint32_t a2, uint32_t b2,
                                                  int ks, uint32_t copy8) {
    const uint32_t go = (shift_right(a2, 4 * ks - 7) & (0xFFu << 7)) | copy8;
    const uint32_t so = (shift_right(b2, 7 * (ks / 2) - 7) & (127u << 7)) | copy8;
    const uint2 g = *reinterpret_cast<const uint2*>(hgrid + go);
    const uint2 sg = *reinterpret_cast<const uint2*>(hsign + so);
    return make_uint2(g.x | sg.x, g.y | sg.y);
}
// IQ2_XXS: a selector word's four values as two half pairs of an A fragment, times the scale
// (selector nibbles with bit 3 set: PRMT's sign replication, meant).
__device__ __forceinline__ void xf_iq2_frag(uint32_t w, uint32_t s2, uint32_t& lo, uint32_t& hi) {
    lo = h2_mul(prmt(kIq2HalfLo, kIq2HalfHi, w), s2);
    hi = h2_mul(prmt(kIq2HalfLo, kIq2HalfHi, w >> 16), s2);
}

// T: T_Q2_K (the down projection, one weight) or T_IQ2_XXS (gate+up fused: the swiglu of the
// two products, as gemm_iq2_smem_kernel<2> gives it).
// Q2_K: a thread's 16 values of a row in a tile are one sub-block (16 code bytes at shift sh,
// one scale byte), each half pair a · q + b from its 2-bit codes; TABLE (DSV4_XF_TABLE=1,
// opt-in: within noise of the default in runs 158 and 160): a row's four possible values b, a + b, 2a + b, 3a + b as
// halves in two registers once a tile, each fragment word then one PRMT whose selector m · 0x22
// + 0x10101010 (m: four 2-bit codes, one a byte) picks halves q0, q1 (its low 16 bits) or q2, q3
// (shifted): ~6 instructions a code word instead of 8, each value rounded to FP16 once (from
// fmaf) instead of after a and b are.
// IQ2_XXS: a thread's 16 values of a row are two grid rows (8 values each) of one 32-value group,
// whose scale d · (0.5 + s) / 4 (times 2^8) is a half pair once a tile; each half pair of
// values is one PRMT of the constant bytes of ±8, 25, 43 (iq2.cuh: kIq2HalfLo, kIq2HalfHi) by
// the OR of two table words in shared memory (the grid row's and the sign pattern's), times
// that scale: exact signed magnitudes, one rounding. Block: m-tile 0 of each warp is gate's 16
// rows, m-tile 1 up's same rows, so a thread holds both products of its outputs for the
// swiglu (run 159, Nsight Compute: latency-bound, issue slots 55 % busy at 4 warps a scheduler,
// ~9.7 instructions an MMA; bench/gpu/NOTES.md "Thirty-fourth round").
// WG (sm_90a only; DSV4_XF_WGMMA): the same expansion into the same A fragments, but each warp
// group (warps 0-3, 4-7) multiplies them by one wgmma m64nNk16 an m-tile and k-step (warp w's
// fragment rows are rows 16 (w % 4) .. of the 64, its sums come back in the same registers)
// instead of a warp's ldmatrix and up to 8 mma.sync: B is read from shared memory by the tensor
// cores (xf_wg_offset's layout), and the MMA instructions a tile fall from ~80 to 8 a warp. A
// k-step's wgmma run while the next k-step's fragments are expanded (at most one group in flight
// when a fragment is written); each tile's end waits for all, so the barrier that follows frees
// its B buffer.
// WG2 (kXfWg2, opt-in: DSV4_XF_WGMMA=2): the WG form over 512 threads (4 warpgroups) and up to 128
// pairs: a block takes its group and the next group of the same expert, so each weight row is
// expanded once for up to 128 pairs instead of 64 (4,096-token rounds: ~96 pairs an expert). A
// warp holds one m-tile (16 rows: Q2_K rows 16 w ..; IQ2_XXS gate's rows 8 w .. as its fragment
// rows gid and up's same rows as gid + 8, so the swiglu stays in the thread), its sums 64
// registers (m64n128). The stage keeps 256 weight rows, so the activations' bytes a weight row
// and pair stay those of WG.
// DIAG (DSV4_XF_DIAG, the WG form; a measurement, **wrong outputs**): 1 expands every A fragment
// but runs no MMA (the fragments XORed into one register that reaches the output, so the
// expansion stays), 2 runs every wgmma on fragments made without the expansion (no selector or
// code lookups), 3 as 2 without the wait after each group: the expansion's time and the MMAs'
// apart, and what waiting for each group costs (runs 206, 207: bench/gpu/NOTES.md "Forty-fifth
// round", "Forty-sixth round"); 4 neither the expansion nor the MMAs (the tile loop's staging,
// barrier, B expansion and row setup: its skeleton), 5 as 4 without the B expansion, 6 as 4
// without the weights' copies (their stage bytes left as they are), 7 as 4 without the
// activations' copies: which of the loop's copies it waits for (run 211); 8 as 4 without any
// copy, 9 as 8 without the loop's barrier: what the barrier itself costs, the question a
// warp-specialised form (no block-wide barrier a tile) would answer.
// KG (DSV4_XF_KGROUP, the WG form): 2 (the default since run 207) puts an m-tile's two k-steps
// that share their code words in one commit group (4 fragments live instead of 2): half the
// groups, each waited for once; the same wgmma in each accumulator's order, so the same bits
// (run 207: gate+up 3.36 -> 3.29 us a token of a fast chunk).
template <uint32_t T, bool TABLE, int FORM = kXfMma, int DIAG = 0, int KG = 1, bool SB = false>
__global__ void __launch_bounds__(xf_threads(FORM), FORM == kXfWg2 ? 1 : 2) gemm_experts_f16_kernel(KqGemm p) {
    constexpr bool IQ2 = T == T_IQ2_XXS, WG = FORM != kXfMma;
    static_assert(DIAG == 0 || FORM == kXfWg, "DIAG: the WG form");
    static_assert(KG == 1 || (KG == 2 && FORM == kXfWg && DIAG == 0), "KG 2: the WG form");
    static_assert(T == T_Q2_K || (IQ2 && !TABLE), "fast experts: Q2_K (either expansion) or IQ2_XXS");
    static_assert(!TABLE || !WG, "TABLE: the mma.sync form only");
    static_assert(!SB || (FORM == kXfWg && !IQ2), "SB: the WG form's Q2_K down");
    pdl_begin();
    using L = XfSmem<T, FORM, SB>;
    constexpr int PAIRS = L::pairs, NT = PAIRS / 8;   // the block's pairs at most, its tiles of 8 pairs
    constexpr int MT = FORM == kXfWg2 ? 1 : 2;        // m-tiles (16 rows) a warp
    extern __shared__ __align__(16) uint8_t sm[];
    ExpertGroup eg;
    if (!expert_group(p, int(kKqFlatPairs), eg)) return;
    if constexpr (FORM == kXfWg2)
        if (!expert_group_pair(p, eg)) return;
    const int32_t* gp = eg.pairs;
    const int cnt = eg.cnt;
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5, gid = lane >> 2, tig = lane & 3;
    const int nv = xf_pair_tiles(p, cnt, NT);                 // tiles holding a pair
    const uint32_t used = xf_staged_pairs(p, cnt, PAIRS);   // the pairs staged and expanded
    const uint64_t m0 = uint64_t(blockIdx.x) * xf_block_rows(T);
    const int nsb = int(p.K / 256), ntiles = int(p.K / kXfK);
    auto w_row = [&](uint32_t r) { return eg.wbase + min(m0 + r, p.N - 1); };   // clamped for the loads
    // a stage row of this thread's fragments: m-tile mt, row gid + 8 h
    auto stage_row = [&](int mt, int h) -> uint32_t {
        if constexpr (FORM == kXfWg2) return IQ2 ? 128 * h + 8 * warp + gid : 16 * warp + gid + 8 * h;
        return IQ2 ? 128 * mt + 16 * warp + gid + 8 * h : 32 * warp + 16 * mt + gid + 8 * h;
    };
    if constexpr (IQ2)
        if (t < 256) {   // (WG2: the first 256 threads)
            iq2_fill_rows<256, 256, kXfGridCopies>(reinterpret_cast<uint4*>(sm + L::hgrid), p.hgrid, t);
            iq2_fill_rows<256, 128, kXfGridCopies>(reinterpret_cast<uint4*>(sm + L::hsign), p.hsign, t);
        }

    // this thread's copies of a tile: its pair's activation chunk (pair t / 4, part t % 4), a
    // pair's dx (t < PAIRS); Q2_K: half t % 2 of the codes of rows t / 2 and (256 threads) 128 + t
    // / 2, and row t's scale bytes and (d, dmin); IQ2_XXS: stage row t's two groups and d (gate's
    // row t, up's row t - 128); threads from 256 on (WG2) the activations and the codes only
    // (32-bit offsets from the tensors' bases, not pointers: fewer registers live through the
    // tile loop, and a tile's address is a 32-bit step and one 64-bit add instead of 64-bit
    // products; gemm_kq_experts takes this kernel only where every offset fits: xf_fits)
    const uint32_t arow = uint32_t(gp[min(int(t >> 2), cnt - 1)]) / p.act_div;
    const uint32_t xrow = uint32_t(gp[min(int(t), cnt - 1)]) / p.act_div;
    const uint32_t act_off = arow * uint32_t(p.AL) + (t & 3) * 16, dx_off = xrow * uint32_t(p.AL / 256);
    // Q2_K: the first code byte of this thread's half of rows t / 2 and 128 + t / 2 in super-block 0
    auto q2k_code_off = [&](uint32_t r) { return uint32_t(w_row(r)) * uint32_t(nsb) * 80 + 16 + (t & 1) * 16; };
    const uint32_t lo_off = IQ2 ? 0 : q2k_code_off(t >> 1), hi_off = IQ2 || FORM == kXfWg2 ? 0 : q2k_code_off(128 + (t >> 1));
    const uint32_t sb_t = uint32_t(w_row(IQ2 ? t & 127 : t)) * uint32_t(nsb);   // stage row t's first super-block
    // IQ2_XXS: bit 2 mt + h: the parity of this thread's fragment row's first d (its super-block
    // sb's d is the high half of the staged word when that parity differs from sb's)
    uint32_t dpar = 0;
    if constexpr (IQ2)
        for (int mt = 0; mt < MT; ++mt)
            for (int h = 0; h < 2; ++h)
                dpar |= uint32_t((w_row(stage_row(mt, h) & 127) * nsb) & 1) << (2 * mt + h);
    // Q2_K: the stage whose code bytes tile i reads. A tile's 64 values lie in the 32 code bytes
    // of half tq / 2 of its super-block, so tiles 2m and 2m + 1 read the same bytes; with
    // paired_codes tile 2m alone stages them, into stage m % 3's code bytes (three: pair m's are
    // read at tiles 2m, 2m + 1 and overwritten by pair m + 3's copies, issued at tile 2m + 3
    // after its barrier), so a tile pulls 8 KB of codes from L2 every other tile (run 196: the
    // down's L2 72 % busy; ~14 KB a tile before; runs 197, 198: the down 2.23 -> 2.06 us a
    // token of a fast chunk). The other parts of the stage keep tile i % 4's.
    auto codes_stage = [&](int i) -> uint8_t* {
        return sm + L::stage + (p.paired_codes ? (i >> 1) % 3 : i % kXfStages) * L::st_bytes + L::st_codes;
    };
    // SB: super-block sb's parts (issued with its first tile at the loop's step 4 sb - 3, read
    // by its 4 tiles up to step 4 sb + 3; the buffer is next written for sb + 2, at step 4 sb + 5)
    [[maybe_unused]] auto sbq = [&](int sb) { return sm + L::sbq + (sb & 1) * L::sbq_bytes; };
    [[maybe_unused]] auto sbx = [&](int sb) { return sm + L::sbx + (sb & 1) * L::sbx_bytes; };
    auto issue = [&](int i) {
        uint8_t* st = sm + L::stage + (i % kXfStages) * L::st_bytes;
        const int sb = i >> 2, tq = i & 3;
        if constexpr (DIAG != 7 && DIAG < 8) {   // (DIAG 7, 8, 9: the loop without the activations' copies)
            if ((t >> 2) < used) cp_async16(st + L::st_act + t * 16, p.aq + (act_off + uint32_t(i) * kXfK));
            if (t < used && (!SB || tq == 0))
                cp_async4((SB ? sbx(sb) : st + L::st_dx) + t * 4, p.ad + (dx_off + uint32_t(sb)));
        }
        if constexpr (DIAG == 6 || DIAG >= 8) return;   // (DIAG 6, 8, 9: the loop without the weights' copies)
        if constexpr (IQ2) {
            // groups 2 tq, 2 tq + 1 of the super-block's 8 (8 bytes each): the row's bytes 16 i ..
            const uint8_t* wq = t < 128 ? p.wq[0] : p.wq[1];
            const uint16_t* wd = t < 128 ? p.wd[0] : p.wd[1];
            if (t < uint32_t(kXfRows)) {
                cp_async16(st + L::st_codes + t * 16, wq + (sb_t * 64 + uint32_t(i) * 16));
                if (tq == 0)   // (d: one a super-block, read at its first tile: d2 below)
                    cp_async4(st + L::st_dw + t * 4, wd + ((sb_t + uint32_t(sb)) & ~1u));
            }
        } else {
            // the tile's 64 values (sub-blocks 4 tq .. + 3) lie in the 32 code bytes of half tq / 2
            // (after the 16 scale bytes), at shifts 4 (tq % 2) and + 2
            const uint32_t off = uint32_t(sb) * 80 + 32 * uint32_t(tq >> 1);
            if (!p.paired_codes || !(i & 1)) {
                uint8_t* cs = codes_stage(i);
                cp_async16(cs + t * 16, p.wq[0] + (lo_off + off));
                if constexpr (FORM != kXfWg2)
                    cp_async16(cs + 4096 + t * 16, p.wq[0] + (hi_off + off));
            }
            if (t < uint32_t(kXfRows)) {
                if constexpr (SB) {
                    if (tq == 0) {   // the super-block's 16 scale bytes and (d, dmin)
                        cp_async16(sbq(sb) + t * 16, p.wq[0] + (sb_t + uint32_t(sb)) * 80);
                        cp_async4(sbq(sb) + kXfRows * 16 + t * 4, p.wd[0] + (sb_t + uint32_t(sb)) * 2);
                    }
                } else {
                    cp_async4(st + L::st_sc + t * 4, p.wq[0] + ((sb_t + uint32_t(sb)) * 80 + 4 * uint32_t(tq)));
                    cp_async4(st + L::st_dw + t * 4, p.wd[0] + (sb_t + uint32_t(sb)) * 2);
                }
            }
        }
    };
    // Tile i's activation chunk of this thread: 16 codes q (int8) as halves q · dx (q: 1024 +
    // (q ^ 0x80) - 1152) into B buffer i % 2, each pair of values at its xf_slot.
    auto expand_b = [&](int i) {
        if ((t >> 2) >= used) return;
        const uint8_t* st = sm + L::stage + (i % kXfStages) * L::st_bytes;
        const uint4 v = *reinterpret_cast<const uint4*>(st + L::st_act + t * 16);
        const float dx = *reinterpret_cast<const float*>((SB ? sbx(i >> 2) : st + L::st_dx) + (t >> 2) * 4);
        // a pair of values' byte offset in B buffer i % 2
        xf_expand_chunk(v, dx, [&](uint32_t j) -> uint32_t* {
            const uint32_t o = WG ? (i & 1) * L::b_bytes + xf_wg_offset<PAIRS>(t >> 2, t & 3, j)
                                  : ((i & 1) * L::pairs + (t >> 2)) * kXfRowH + xf_slot(t & 3, j);
            return reinterpret_cast<uint32_t*>(sm + L::b + o);
        });
        if constexpr (WG) fence_proxy_async();   // (the barrier before tile i's wgmma follows)
    };

    for (int i = 0; i < 3; ++i) {
        if (i < ntiles) issue(i);
        cp_async_commit();
    }
    cp_async_wait<2>();
    __syncthreads();   // tile 0 landed for all (and the IQ2_XXS tables are filled)
    if constexpr (DIAG != 5) expand_b(0);
    auto run = [&](auto ntv) {
        constexpr int NV = decltype(ntv)::value;
        float acc[MT][NT][4];
        each(acc, [](float& x) { x = 0.0f; });
        [[maybe_unused]] uint32_t sink = 0;   // DIAG 1: the fragments' XOR
        [[maybe_unused]] uint32_t d2[MT][2] = {};   // IQ2_XXS: the rows' d of the tile's super-block, both halves
#pragma unroll 1
        for (int i = 0; i < ntiles; ++i) {
            cp_async_wait<1>();   // tile i + 1's stage (tile i + 2's may still fly)
            // it landed for all; tile i's B expanded; tile i - 1's MMAs done (DIAG 9: no barrier)
            if constexpr (DIAG != 9) __syncthreads();
            if (i + 3 < ntiles) issue(i + 3);   // into tile i - 1's stage
            cp_async_commit();
            if (DIAG != 5 && i + 1 < ntiles) expand_b(i + 1);
            const uint8_t* st = sm + L::stage + (i % kXfStages) * L::st_bytes;
            const uint8_t* bsm = sm + L::b + (i & 1) * L::b_bytes;
            // this thread's rows: Q2_K its sub-block tig of the tile (16 code bytes at shift sh)
            // and its FP16 step a · q + b (TABLE: its 4 values); IQ2_XXS its group tig / 2's words
            // (grid indices shifted to grid row 2 (tig % 2), signs to its 7 bits) and scale
            [[maybe_unused]] const int sh = 2 * (2 * (i & 1) + int(tig >> 1));
            [[maybe_unused]] const uint8_t* qrow[MT][2];
            uint32_t a2[MT][2], b2[MT][2];   // a, b as half pairs (TABLE: the halves w0, w1 and w2, w3; IQ2_XXS: the
                                             // grid indices and the signs)
            [[maybe_unused]] uint32_t s2[MT][2];   // IQ2_XXS: the scale as a half pair
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t r = stage_row(mt, h);
                    if constexpr (IQ2) {
                        xf_iq2_row(st + L::st_codes + r * 16, st + L::st_dw + r * 4, i,
                                   (dpar >> (2 * mt + h)) & 1, tig, d2[mt][h], a2[mt][h], b2[mt][h], s2[mt][h]);
                    } else {
                        qrow[mt][h] = codes_stage(i) + r * 32 + (tig & 1) * 16;
                        const uint32_t sc = SB ? sbq(i >> 2)[r * 16 + 4 * (i & 3) + tig] : st[L::st_sc + r * 4 + tig];
                        const uint32_t dd =
                            *reinterpret_cast<const uint32_t*>((SB ? sbq(i >> 2) + kXfRows * 16 : st + L::st_dw) + r * 4);
                        if constexpr (TABLE) {
                            const float2 ab = xf_q2k_ab(dd, sc);
                            const float a = ab.x, b = ab.y;
                            a2[mt][h] = h2_of(b, a + b);
                            b2[mt][h] = h2_of(fmaf(a, 2.0f, b), fmaf(a, 3.0f, b));
                        } else {
                            xf_q2k_steps(dd, sc, a2[mt][h], b2[mt][h]);
                        }
                    }
                }
            // Q2_K: code words ks, ks + 1 of each row (8 bytes: a half-warp's loads hit distinct
            // banks); IQ2_XXS: the selectors of grid row ks / 2 (words: values 0-3, 4-7)
            uint2 q[MT][2];
            // (IQ2_XXS: this lane's copy of the selector tables as the lookups' low offset bits,
            // ORed into the row's (disjoint bits), so the tables' base stays uniform: the loop's
            // SASS from the barrier to the last wgmma 423 -> 408 instructions)
            [[maybe_unused]] const uint32_t copy8 = (lane % kXfGridCopies) * 8;
#pragma unroll
            for (int ks = 0; ks < kXfK / 16; ++ks) {
                if (ks % 2 == 0)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            if constexpr (IQ2) {
                                q[mt][h] = xf_iq2_selectors(sm + L::hgrid, sm + L::hsign, a2[mt][h], b2[mt][h], ks, copy8);
                            } else {
                                q[mt][h] = *reinterpret_cast<const uint2*>(qrow[mt][h] + 4 * ks);
                            }
                        }
                // m-tile mt's A fragment: values 4 ks, + 1 (slots 2 tig, + 1) and 4 ks + 2, + 3
                // (slots 2 tig + 8, + 9) of its rows (Q2_K: code word ks; IQ2_XXS: selector word
                // ks % 2 of its grid row)
                // (k-step kk: ks, or with KG 2 also ks + 1, whose words q holds too)
                auto frag = [&](int mt, uint32_t (&a)[4], int kk) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t w = kk % 2 ? q[mt][h].y : q[mt][h].x;
                        if constexpr (IQ2) {
                            xf_iq2_frag(w, s2[mt][h], a[h], a[2 + h]);
                        } else if constexpr (TABLE) {
                            const uint32_t m = (w >> sh) & 0x03030303u;
                            const uint32_t sel = m * 0x22u + 0x10101010u;
                            a[h] = prmt(a2[mt][h], b2[mt][h], sel);
                            a[2 + h] = prmt(a2[mt][h], b2[mt][h], sel >> 16);
                        } else {
                            xf_q2k_frag(w, sh, a2[mt][h], b2[mt][h], a[h], a[2 + h]);
                        }
                    }
                };
                if constexpr (WG) {
                    // one commit group an m-tile, so only two fragments (8 registers) are live: the
                    // one in flight and the one being written. N = 8 NV (NV even here; the pairs
                    // past cnt are staged copies of the last).
                    constexpr int N = 8 * NV;
                    if constexpr (KG == 2) {
                        // k-steps ks, ks + 1 of an m-tile in one group: 4 fragments (16 registers)
                        // live, the same wgmma in each accumulator's order
                        if (ks % 2 == 0)
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt) {
                                uint32_t a0[4], a1[4];
                                frag(mt, a0, ks);
                                frag(mt, a1, ks + 1);
                                wg_fence();
                                wg_mma<N>(reinterpret_cast<float(&)[NT * 4]>(acc[mt]), a0,
                                          wg_desc<PAIRS>(bsm + ks * (PAIRS * 32)));
                                wg_mma<N>(reinterpret_cast<float(&)[NT * 4]>(acc[mt]), a1,
                                          wg_desc<PAIRS>(bsm + (ks + 1) * (PAIRS * 32)));
                                wg_commit();
                                wg_wait<1>();
                            }
                    } else {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            uint32_t a[4];
                            if constexpr (DIAG == 1) {
                                frag(mt, a, ks);
                                sink ^= a[0] ^ a[1] ^ a[2] ^ a[3];
                                continue;
                            }
                            if constexpr (DIAG >= 4) {   // the row setup kept live, nothing else (4-9)
                                if constexpr (IQ2) sink ^= s2[mt][0] ^ s2[mt][1];
                                else sink ^= a2[mt][0] ^ a2[mt][1] ^ b2[mt][0] ^ b2[mt][1];
                                continue;
                            }
                            if constexpr (DIAG >= 2) {   // (values from the tile's row setup, not constants)
                                if constexpr (IQ2) a[0] = a[2] = s2[mt][0], a[1] = a[3] = s2[mt][1];
                                else a[0] = a2[mt][0], a[1] = a2[mt][1], a[2] = b2[mt][0], a[3] = b2[mt][1];
                            } else {
                                frag(mt, a, ks);
                            }
                            wg_fence();   // the fragment written
                            wg_mma<N>(reinterpret_cast<float(&)[NT * 4]>(acc[mt]), a,
                                      wg_desc<PAIRS>(bsm + ks * (PAIRS * 32)));
                            wg_commit();
                            // the group before done: its fragment's registers free (DIAG 3: the
                            // fragments are the tile's, unchanged: no wait until the tile's end)
                            if constexpr (DIAG != 3) wg_wait<1>();
                        }
                    }
                } else {
                    static_assert(MT == 2, "mma.sync: two m-tiles a warp");
                    uint32_t a[2][4];
                    frag(0, a[0], ks);
                    frag(1, a[1], ks);
#pragma unroll
                    for (int np = 0; np < (NV + 1) / 2; ++np) {
                        uint32_t b[4];
                        ldmatrix_x4(b, bsm + (16 * np + 8 * (lane >> 4) + (lane & 7)) * kXfRowH + ks * 32 +
                                           ((lane >> 3) & 1) * 16);
#pragma unroll
                        for (int u = 0; u < 2; ++u)
                            if (2 * np + u < NV)
#pragma unroll
                                for (int mt = 0; mt < 2; ++mt)
                                    mma_f16_acc(acc[mt][2 * np + u], a[mt], b[2 * u], b[2 * u + 1]);
                    }
                }
            }
            if constexpr (WG) wg_wait<0>();   // tile i's wgmma done before the barrier frees its B buffer
        }
        cp_async_wait<0>();
        if constexpr (WG) each(acc, wg_fence_operand);
        if constexpr (DIAG == 1 || DIAG >= 4) acc[0][0][0] = __uint_as_float(sink);
#pragma unroll
        for (int nt = 0; nt < NV; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * nt + int(2 * tig) + (e & 1);
                if (c >= cnt) continue;
                const uint64_t pc = uint32_t(gp[c]);
                if constexpr (IQ2) {
                    // gate's and up's sums of output row n: m-tiles 0 and 1 (WG2: fragment rows gid
                    // and gid + 8)
                    if (FORM == kXfWg2 && e >= 2) continue;
                    const uint64_t n = m0 + (FORM == kXfWg2 ? 8 * warp + gid : 16 * warp + gid + 8 * (e >> 1));
                    const float g = acc[0][nt][e], u = FORM == kXfWg2 ? acc[0][nt][(e + 2) & 3] : acc[MT - 1][nt][e];
                    if (n < p.N)
                        p.y[pc * p.y_stride + n] = swiglu_pair<true>(g * (1.0f / kXfWScale), u * (1.0f / kXfWScale),
                                                                     p.clamp, p.ew, uint32_t(pc));
                } else {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const uint64_t n = m0 + 16 * MT * warp + 16 * mt + gid + 8 * (e >> 1);
                        if (n < p.N) p.y[pc * p.y_stride + n] = acc[mt][nt][e] * (1.0f / kXfWScale);
                    }
                }
            }
    };
    // (the wgmma forms in steps of 16 pairs, the shapes' step here)
    if constexpr (WG) with_tiles<1, NT / 2>((nv + 1) / 2, [&](auto n2) { run(std::integral_constant<int, 2 * decltype(n2)::value>{}); });
    else with_tiles<1, NT>(nv, run);
}

// Dynamic shared memory above 48 KB for kernel, allowed once (ready) outside stream capture;
// false while s captures (the caller then takes a kernel that needs no more; gemm.cu).
bool smem_ready(const void* kernel, int bytes, bool& ready, cudaStream_t s);
// The fast mode's expert kernel (gemm_experts_f16_kernel) for T; false when its shared memory
// cannot be raised yet (a capture first: the exact kernels run).
template <uint32_t T, bool TABLE, int FORM = kXfMma, int DIAG = 0, int KG = 1, bool SB = false>
bool launch_experts_f16_form(const KqGemm& p, uint64_t N, uint32_t cap, cudaStream_t s) {
    static bool ready = false;
    constexpr int bytes = XfSmem<T, FORM, SB>::bytes;
    const auto kernel = gemm_experts_f16_kernel<T, TABLE, FORM, DIAG, KG, SB>;
    if (!smem_ready(reinterpret_cast<const void*>(kernel), bytes, ready, s)) return false;
    kernel<<<dim3(uint32_t((N + xf_block_rows(T) - 1) / xf_block_rows(T)), cap), xf_threads(FORM), bytes, s>>>(p);
    return true;
}
// The same with a wgmma form (kXfWg, kXfWg2; sm90a/experts_wgmma.cu: only sm_90a machine code,
// so only for a device of compute capability 9.0).
// diag: the WG form's DIAG (DSV4_XF_DIAG: a measurement, wrong outputs); kgroup: its KG
// (DSV4_XF_KGROUP); sectors: its SB for the Q2_K down (DSV4_XF_SECTORS).
bool launch_experts_wgmma(const KqGemm& p, uint32_t type, int form, int diag, int kgroup, bool sectors,
                          uint64_t N, uint32_t cap, cudaStream_t s);
// The warp-specialised form (kXfWs; sm90a/experts_ws.cu) for T_IQ2_XXS (the gate+up) or T_Q2_K
// (the down); false as launch_experts_f16_form.
bool launch_experts_ws(const KqGemm& p, uint32_t type, uint64_t N, uint32_t cap, cudaStream_t s);

}  // namespace dsv4::cuda::xf
