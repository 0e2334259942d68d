// Prompt rounds' attention (an item per row: all heads, all keys) on the FP16 tensor cores,
// FP32-accurate — attn_rows_tc_kernel's algorithm (attention_tc.cu) with m16n8k16 FP16
// products instead of m16n8k8 TF32 ones.
//
// Why: the TF32 rows kernel spends most of its instructions outside its MMAs. Its queries are
// split (x = hi + lo, 3 instructions a value) again for every 16-key tile, since a row's split
// queries take twice their FP32 space and the FP32 ones already fill 132 of the 227 KB (the
// score phase: ~30 instructions for 4 MMAs of k = 8). Here a value is split into two FP16
// halves, hi = fp16(x), lo = fp16(x − hi): together they hold its 22 leading bits, as TF32's
// pair does, in the same 4 bytes as the float, so a row's queries are split once (in place,
// when they land) and the score phase takes ~16 instructions for 4 MMAs of k = 16. FP16's MMA
// also runs at twice TF32's rate.
//
// Operands, per tile of 16 keys:
//   Q: hi and lo halves of each head row (one split a row);
//   K, V (the same latent rows): the tile staged as floats by cp.async, then converted once for
//     every warp into hi and lo halves. A 16-dim chunk whose lo halves are all zero in the tile
//     (the value was an FP16 value already: window rows are rounded to F16, compressed rows'
//     FP8-simulated dims are FP16 values) skips its hi·lo products, as the TF32 kernel skips
//     TF32-exact keys: they would add exact zeros;
//   Q also times 2^10 before its split (lo parts of small values stay normal), divided out of
//     the softmax scale (a power of two: the same scaled scores);
//   P: the softmax weights (in [0, 1]) times 2^12 before their split (so weights down to 2^-36
//     keep 22 bits instead of flushing in FP16's subnormal range), the 2^12 divided out of the
//     output's normalisation (a power of two: exact).
// Each product a·b ≈ hi·hi + hi·lo + lo·hi, the small terms first into a fresh accumulator,
// the sum added to the running one by an FP32 add (the tensor cores truncate their sums), as
// in the TF32 kernel. What FP16 cannot hold: magnitudes from 65,504 up (queries are RMS-normed
// heads, |q| <= sqrt(D); keys RMS-normed latent rows) and lo parts below 2^-24 (values under
// ~2^-13, whose products then carry an absolute error below 2^-25 |b|).
//
// The softmax's exponentials are expf (within 2 ulp) instead of exp_cr's double exp: its
// polynomial's constants took 8 registers, which at the 128-register cap were spilled around
// every call (run 87: 57 M local-memory requests a ratio-4 call, ~44 a warp a tile).
// Numerics are their own (not the TF32 kernel's bits); each row is computed by the same
// operations whatever the batch or chunking, as the rows kernel's contract requires.
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cuda/attention.cuh"
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace dsv4::cuda {
namespace {

constexpr uint32_t kF16Warps = 16, kF16Threads = 32 * kF16Warps;
constexpr uint32_t kF16KT = 16;        // keys a tile: the weighted sum's one k16 step; = warps (key conversion)
constexpr uint32_t kF16MaxMT = 4;      // m-tiles of 16 heads: up to 64 heads
constexpr uint32_t kF16RS = 24;        // score-part row stride in floats (≡ 8 mod 32: conflict-free float2 stores)
constexpr uint32_t kF16PS = 24;        // weight row stride in halves: 48 bytes, so an ldmatrix's 8 rows fall on
                                       // 8 different 16-byte bank groups
constexpr float kF16PScale = 4096.0f;  // the weights' scale before their split (2^12)
constexpr float kF16QScale = 1024.0f;  // the queries' (2^10; RMS-normed heads: |q| <= sqrt(D) <= 22.7)
static_assert(kF16KT == kF16Warps && kF16Threads == 8 * 16 * kF16MaxMT, "key conversion, softmax threads");

// Shared memory for head width D (rows of D + kAttnPad floats, DP), the regions of fixed size
// first (sized for 64 heads: their offsets are constants, no registers) and the queries last:
//   the staged tile [kF16KT][DP] floats | its hi, lo halves [kF16KT][D + 8] each | score parts
//   [4][64][kF16RS] floats | weights hi, lo [64][kF16PS] halves each | queries [16 MT][DP] floats
//   (as halves: each 8 dims' 8 hi halves, then their 8 lo halves, in the 32 bytes of their
//   floats; at a row's end its output in floats).
// Row strides ≡ 16 bytes mod 128: an ldmatrix's 8 rows fall on distinct bank groups.
constexpr uint32_t f16_off_kh(uint32_t D) { return kF16KT * (D + kAttnPad) * 4; }
constexpr uint32_t f16_off_kl(uint32_t D) { return f16_off_kh(D) + kF16KT * (D + 8) * 2; }
constexpr uint32_t f16_off_s(uint32_t D) { return f16_off_kl(D) + kF16KT * (D + 8) * 2; }
constexpr uint32_t f16_off_ph(uint32_t D) { return f16_off_s(D) + 4 * 16 * kF16MaxMT * kF16RS * 4; }
constexpr uint32_t f16_off_pl(uint32_t D) { return f16_off_ph(D) + 16 * kF16MaxMT * kF16PS * 2; }
constexpr uint32_t f16_off_q(uint32_t D) { return f16_off_pl(D) + 16 * kF16MaxMT * kF16PS * 2; }
constexpr size_t f16_smem_bytes(uint32_t D, uint32_t MT) {
    return f16_off_q(D) + size_t(16) * MT * (D + kAttnPad) * 4;
}
static_assert(f16_smem_bytes(512, kF16MaxMT) + 2832 <= 227 * 1024, "FP16 rows kernel: one block an SM");

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
// x0, x1 as FP16 pairs hi (x0 in the low half) and lo = fp16(x − float(hi)).
__device__ __forceinline__ void f16_split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 b = __half22float2(h);
    hi = h2_bits(h);
    lo = h2_bits(__floats2half2_rn(__fsub_rn(x0, b.x), __fsub_rn(x1, b.y)));
}

// d += a·b (m16n8k16, FP16 inputs, FP32 accumulate). a0 (row gid, k 2tig..+1), a1 (gid+8, same),
// a2 (gid, 2tig+8..+9), a3 (gid+8, same); b0 (k 2tig..+1, n gid), b1 (k 2tig+8..+9, n gid); d as
// mma_tf32's.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a·b (a fresh accumulator).
__device__ __forceinline__ void mma_f16_0(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
// Four 8×8 matrices of halves (lanes 8i..8i+7 give matrix i's row addresses, shared-window
// byte addresses: 32-bit registers, not generic pointers); TRANS: each
// transposed (register i of lane l: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1 of matrix i).
template <bool TRANS = false>
__device__ __forceinline__ void ldsm_x4_h(uint32_t (&r)[4], uint32_t s) {
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s)
                     : "memory");
    else
        ldsm_x4(r, s);
}

// What both rows kernels (16- and 32-key tiles) do around their products.
// The online softmax of head hs over a tile (eight lanes a head, V keys each from key V·kc): the
// four quarters' score parts added in order (rows of RS floats), scaled, keys past nt at -inf;
// the running max m_run and sum l_run moved on, the weights e (0 past nt); returns the
// correction of the sums so far.
template <uint32_t V, uint32_t RS>
__device__ __forceinline__ float rows_softmax_step(const float* s_s, uint32_t hs, uint32_t kc, uint32_t nt,
                                                   float scale, float& m_run, float& l_run, float (&e)[V]) {
    static_assert(V == 2 || V == 4, "keys a lane");
    auto load = [&](uint32_t v, float (&d)[V]) {
        const float* p = s_s + (v * (16 * kF16MaxMT) + hs) * RS + V * kc;
        if constexpr (V == 2) {
            const float2 a = *reinterpret_cast<const float2*>(p);
            d[0] = a.x, d[1] = a.y;
        } else {
            const float4 a = *reinterpret_cast<const float4*>(p);
            d[0] = a.x, d[1] = a.y, d[2] = a.z, d[3] = a.w;
        }
    };
    float sv[V];
    load(0, sv);
#pragma unroll
    for (uint32_t v = 1; v < 4; ++v) {
        float b[V];
        load(v, b);
#pragma unroll
        for (uint32_t j = 0; j < V; ++j) sv[j] = __fadd_rn(sv[j], b[j]);
    }
    float mx = -INFINITY;
#pragma unroll
    for (uint32_t j = 0; j < V; ++j) {
        sv[j] = V * kc + j < nt ? __fmul_rn(sv[j], scale) : -INFINITY;
        mx = fmaxf(mx, sv[j]);
    }
#pragma unroll
    for (uint32_t x = 1; x < 8; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    const float nm = fmaxf(m_run, mx);
    const float corr = expf(m_run - nm);
#pragma unroll
    for (uint32_t j = 0; j < V; ++j) e[j] = V * kc + j < nt ? expf(sv[j] - nm) : 0.0f;
    float sum = __fadd_rn(e[0], e[1]);
    if constexpr (V == 4) sum = __fadd_rn(sum, __fadd_rn(e[2], e[3]));
#pragma unroll
    for (uint32_t x = 1; x < 8; x <<= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, x));
    l_run = __fadd_rn(__fmul_rn(l_run, corr), sum);
    m_run = nm;
    return corr;
}
// A row's last tile: lane kc 0 of each real head stores its sink's share fw and the
// normalisation inv (the weights' 2^12 divided out here: a power of two, exact); every lane's
// running max and sum reset for the next row.
__device__ __forceinline__ void rows_softmax_end(const float* sinks, uint32_t hs, uint32_t kc, uint32_t n_head,
                                                 float& m_run, float& l_run, float* fw_s, float* inv_s) {
    if (kc == 0 && hs < n_head) rows_sink_norm(sinks[hs], m_run, l_run, kF16PScale, fw_s[hs], inv_s[hs]);
    m_run = -INFINITY;
    l_run = 0.0f;
}
// Per tile of kF16KT = 16 keys (16 warps; NT = D / 64):
//   S = Q·Kᵀ: warp w takes m-tile w % 4 and both key n-tiles over the quarter w / 4 of D (NT
//     k16 steps); the softmax adds the four quarters in order;
//   the online softmax: eight threads a head, two keys each (every thread of the block);
//   O = O·corr + P·V: warp w takes D / 16 columns (NT / 2 n-tiles) of every head, one k16 step.
// FAST (--fast-prefill's rounds, DSV4_ATTN_FAST): plain FP16 products, the hi halves only, each MMA accumulating
// in place (no hi·lo terms, no FP32 add a step): ~2^-11 of each operand lost, so not
// FP32-accurate, but still a row's own operations whatever its batch or chunking.
template <uint32_t NT, bool FAST>
__global__ void __launch_bounds__(kF16Threads, 1)
    attn_rows_f16_kernel(const float* __restrict__ q, const float* __restrict__ sinks, uint32_t n_head, uint32_t n_swa,
                         uint32_t ratio, uint32_t top_k, const uint32_t* __restrict__ sel,
                         const DevRow* __restrict__ rows, const DevLayerKV* __restrict__ lkv, uint32_t n_layer,
                         uint32_t il, uint32_t R, uint32_t n_rot, const double* __restrict__ inv_freq,
                         float* __restrict__ o, int8_t* __restrict__ oq, float* __restrict__ od, bool qn,
                         double q_eps, bool qpf) {
    pdl_begin();
    constexpr uint32_t D = 64 * NT, DP = D + kAttnPad, D4 = D / 4, T = kF16Threads;
    constexpr uint32_t KH = D + 8;              // a converted key row in halves
    constexpr uint32_t NTW = NT / 2;            // the weighted sum's n-tiles a warp
    constexpr uint32_t KTH = T / kF16KT;        // staging threads a key row
    constexpr uint32_t CPL = D4 / 32;           // float4s a lane converts of a row
    static_assert(NT == 4 || NT == 8, "FP16 rows kernel: head widths 256 and 512");
    const uint32_t MT = (n_head + 15) / 16, HP = 16 * MT;
    extern __shared__ float4 sm4[];
    uint8_t* smb = reinterpret_cast<uint8_t*>(sm4);
    float* k32 = reinterpret_cast<float*>(smb);
    __half* kh_s = reinterpret_cast<__half*>(smb + f16_off_kh(D));
    __half* kl_s = reinterpret_cast<__half*>(smb + f16_off_kl(D));
    float* s_s = reinterpret_cast<float*>(smb + f16_off_s(D));
    __half* ph_s = reinterpret_cast<__half*>(smb + f16_off_ph(D));
    __half* pl_s = reinterpret_cast<__half*>(smb + f16_off_pl(D));
    float* q_s = reinterpret_cast<float*>(smb + f16_off_q(D));
    __shared__ float corr_s[16 * kF16MaxMT], fw_s[16 * kF16MaxMT], inv_s[16 * kF16MaxMT];
    // The row's RoPE angles: qn, the forward rotation's (made when its queries are staged; the
    // output's inverse takes -rs_s), else the inverse's (made in its last tile).
    __shared__ float rc_s[kAttnMaxD / 2], rs_s[kAttnMaxD / 2];
    __shared__ uint32_t mask_s[2];   // per tile (alternating): its 16-dim chunks with lo halves
    if (blockIdx.x >= R) return;
    const uint32_t s_a = uint32_t(__cvta_generic_to_shared(smb)), q_a = s_a + f16_off_q(D),
                   kh_a = s_a + f16_off_kh(D), kl_a = s_a + f16_off_kl(D), ph_a = s_a + f16_off_ph(D),
                   pl_a = s_a + f16_off_pl(D);

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t li = lane >> 3, lr = lane & 7;                    // ldmatrix: matrix, row
    const uint32_t kj = threadIdx.x / KTH, ksub = threadIdx.x % KTH;   // key staging: row, first float4
    const uint32_t hs = threadIdx.x >> 3, kc = threadIdx.x & 7;      // softmax: head, key pair
    // the softmax scale with the queries' 2^10 divided out (powers of two: the same product)
    const float scale = float(1.0 / sqrt(double(D))) / kF16QScale;
    RowTiles<kF16KT, D, T> tiles{rows, lkv, sel, n_swa, ratio, top_k, n_layer, il, R};
    // The row's queries, landed as floats (qn: raw, normalised and rotated first with
    // head_norm_rope's bits, rows_head_norm_rope), split in place: each 8 dims' 32 bytes become
    // their 8 hi halves, then their 8 lo halves (an ldmatrix row either way). A warp a head row.
    auto split_q = [&] {
        for (uint32_t h = w; h < HP; h += kF16Warps) {
            float* row = q_s + h * DP;
            if (qn && h < n_head) {
                rows_head_norm_rope<D>(row, n_rot, q_eps, rc_s, rs_s);
                __syncwarp();
            }
#pragma unroll 1
            for (uint32_t j = 0; j < D / 256; ++j) {
                float4* g = reinterpret_cast<float4*>(row) + 2 * (lane + 32 * j);
                const float4 a = g[0], b = g[1];
                constexpr float k = kF16QScale;
                uint4 hi, lo;
                f16_split2(a.x * k, a.y * k, hi.x, lo.x);
                f16_split2(a.z * k, a.w * k, hi.y, lo.y);
                f16_split2(b.x * k, b.y * k, hi.z, lo.z);
                f16_split2(b.z * k, b.w * k, hi.w, lo.w);
                reinterpret_cast<uint4*>(g)[0] = hi;
                reinterpret_cast<uint4*>(g)[1] = lo;
            }
        }
    };
    // The staged tile converted (warp w: key row w) into hi and lo halves; the 16-dim chunks
    // with any nonzero lo half OR-ed into mask_s[mb].
    auto split_keys = [&](uint32_t mb) {
        const float4* src = reinterpret_cast<const float4*>(k32 + w * DP);
        uint2* hi = reinterpret_cast<uint2*>(kh_s + w * KH);
        uint2* lo = reinterpret_cast<uint2*>(kl_s + w * KH);
        if constexpr (FAST) {   // hi halves only: the fast products read neither lo nor the mask
#pragma unroll
            for (uint32_t j = 0; j < CPL; ++j) {
                const float4 x = src[lane + 32 * j];
                hi[lane + 32 * j] = make_uint2(h2_bits(__floats2half2_rn(x.x, x.y)), h2_bits(__floats2half2_rn(x.z, x.w)));
            }
            return;
        }
        uint32_t mine = 0;   // this lane's chunks with a nonzero lo half
#pragma unroll
        for (uint32_t j = 0; j < CPL; ++j) {
            const float4 x = src[lane + 32 * j];
            uint2 a, b;
            f16_split2(x.x, x.y, a.x, b.x);
            f16_split2(x.z, x.w, a.y, b.y);
            hi[lane + 32 * j] = a;
            lo[lane + 32 * j] = b;
            // lane's values: chunk lane / 4 + 8 j
            mine |= uint32_t((b.x | b.y) != 0u) << (lane / 4 + 8 * j);
        }
        const uint32_t cm = __reduce_or_sync(0xffffffffu, mine);   // one reduction for the row
        if (lane == 0 && cm) atomicOr(&mask_s[mb], cm);
    };

    uint32_t r = blockIdx.x, t0 = 0;
    if (threadIdx.x < 2) mask_s[threadIdx.x] = 0;
    rows_stage_q<D, T>(q_s, q, r, n_head, HP);
    tiles.stage(r, t0, tiles.sel_of(r, t0, kj), kj, ksub, k32 + kj * DP);
    if (qn && threadIdx.x < n_rot / 2)
        rope_angle(rows[r].pos, inv_freq, threadIdx.x, false, rc_s[threadIdx.x], rs_s[threadIdx.x]);
    auto n1 = tiles.next_of(r, t0, kj);   // the next tile (copied during this one)
    uint32_t mb = 0;

    const uint32_t base = w * (D / 16);      // this warp's columns of the weighted sum

    float ob[kF16MaxMT][NTW][4];   // running output (times 2^12): heads 16m + gid (+ 8) × this warp's columns
    rows_zero(ob);
    float m_run = -INFINITY, l_run = 0.0f;   // head hs (eight lanes hold it)

    while (true) {
        cp_async_wait_all();
        __syncthreads();   // the tile (and a new row's queries) in; every warp done with the last tile's halves
        if (t0 == 0) {
            split_q();
            // qpf: the block's next row's queries (128 KB at 64 heads of 512) into L2 now, a hint,
            // so that their copy at this row's end (rows_finish), which nothing overlaps, reads L2
            // instead of device memory (q_b's output of the whole round is larger than L2)
            if (qpf && r + gridDim.x < R) {
                const char* nq = reinterpret_cast<const char*>(q + uint64_t(r + gridDim.x) * n_head * D);
                for (uint32_t i = threadIdx.x; i < n_head * D / 32; i += T)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(nq + 128 * i));
            }
        }
        split_keys(mb);
        const uint32_t NK = tiles.keys(r).NK;
        const uint32_t nt = NK - t0 < kF16KT ? NK - t0 : kF16KT;
        const bool last = t0 + kF16KT >= NK;
        const bool more = n1.r < R;
        __syncthreads();   // halves and the chunk mask complete; the staged tile free
        if (threadIdx.x == 0) mask_s[mb ^ 1] = 0;   // (the last tile's mask: read before its scores' barrier)
        if (more) tiles.stage(n1.r, n1.t0, n1.sg, kj, ksub, k32 + kj * DP);
        const auto n2 = more ? tiles.next_of(n1.r, n1.t0, kj) : n1;
        const uint32_t kmask = mask_s[mb];

        {   // Scores: warp w, m-tile mp × 16 keys over dims dq·D/4 ...
            const uint32_t mp = w % 4, dq = w / 4;
            if (mp < MT) {
                float sb[2][4];
#pragma unroll
                for (uint32_t n = 0; n < 2; ++n)
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) sb[n][i] = 0.0f;
                const uint32_t qa = q_a + (16 * mp + (li & 1) * 8 + lr) * DP * 4 + (li >> 1) * 32;
                const uint32_t ko = 2 * (((li >> 1) * 8 + lr) * KH + (li & 1) * 8);
                // Each half of the quarter's k16 steps with or without the hi·lo products, as its
                // chunks need them (one test a half: a per-chunk test would predicate the MMAs, and
                // ptxas then puts a WARPSYNC before every MMA and ldmatrix; run 121). A chunk of
                // FP16-exact keys in a half that needs them adds exact zeros: the same sums.
                auto khalf = [&](uint32_t k0, auto lo) {
                    constexpr bool LO = decltype(lo)::value;
#pragma unroll 2
                    for (uint32_t kk = k0; kk < k0 + NT / 2; ++kk) {
                        const uint32_t d0 = dq * (D / 4) + 16 * kk;
                        uint32_t ah[4], al[4], b[4], bl[4];
                        ldsm_x4_h(ah, qa + 4 * d0);
                        ldsm_x4_h(al, qa + 4 * d0 + 16);
                        ldsm_x4_h(b, kh_a + ko + 2 * d0);
                        if constexpr (LO) ldsm_x4_h(bl, kl_a + ko + 2 * d0);
#pragma unroll
                        for (uint32_t n = 0; n < 2; ++n) {
                            float u[4];
                            mma_f16_0(u, al, b[2 * n], b[2 * n + 1]);
                            if constexpr (LO) mma_f16(u, ah, bl[2 * n], bl[2 * n + 1]);
                            mma_f16(u, ah, b[2 * n], b[2 * n + 1]);
#pragma unroll
                            for (uint32_t i = 0; i < 4; ++i) sb[n][i] = __fadd_rn(sb[n][i], u[i]);
                        }
                    }
                };
                if constexpr (FAST) {   // hi·hi only, accumulated in place
#pragma unroll 2
                    for (uint32_t kk = 0; kk < NT; ++kk) {
                        const uint32_t d0 = dq * (D / 4) + 16 * kk;
                        uint32_t ah[4], b[4];
                        ldsm_x4_h(ah, qa + 4 * d0);
                        ldsm_x4_h(b, kh_a + ko + 2 * d0);
#pragma unroll
                        for (uint32_t n = 0; n < 2; ++n) mma_f16(sb[n], ah, b[2 * n], b[2 * n + 1]);
                    }
                } else {
#pragma unroll 1
                    for (uint32_t k0 = 0; k0 < NT; k0 += NT / 2) {
                        if ((kmask >> (dq * NT + k0)) & ((1u << (NT / 2)) - 1u)) khalf(k0, std::true_type{});
                        else khalf(k0, std::false_type{});
                    }
                }
                float* part = s_s + dq * (16 * kF16MaxMT) * kF16RS;
#pragma unroll
                for (uint32_t n = 0; n < 2; ++n) {
                    *reinterpret_cast<float2*>(part + (16 * mp + gid) * kF16RS + 8 * n + 2 * tig) =
                        make_float2(sb[n][0], sb[n][1]);
                    *reinterpret_cast<float2*>(part + (16 * mp + gid + 8) * kF16RS + 8 * n + 2 * tig) =
                        make_float2(sb[n][2], sb[n][3]);
                }
            }
        }
        if (last && !qn && threadIdx.x < n_rot / 2)
            rope_angle(rows[r].pos, inv_freq, threadIdx.x, true, rc_s[threadIdx.x], rs_s[threadIdx.x]);
        __syncthreads();   // score parts complete

        if (hs < HP) {   // Online softmax of head hs, keys 2kc, 2kc + 1 (eight lanes a head: every thread)
            float e[2];
            const float corr = rows_softmax_step<2, kF16RS>(s_s, hs, kc, nt, scale, m_run, l_run, e);
            if constexpr (FAST) {   // the hi halves alone (the fast products read no lo)
                *reinterpret_cast<uint32_t*>(ph_s + hs * kF16PS + 2 * kc) =
                    h2_bits(__floats2half2_rn(e[0] * kF16PScale, e[1] * kF16PScale));
            } else {
                uint32_t eh, el;
                f16_split2(e[0] * kF16PScale, e[1] * kF16PScale, eh, el);
                *reinterpret_cast<uint32_t*>(ph_s + hs * kF16PS + 2 * kc) = eh;
                *reinterpret_cast<uint32_t*>(pl_s + hs * kF16PS + 2 * kc) = el;
            }
            if (kc == 0) corr_s[hs] = corr;
            if (last) rows_softmax_end(sinks, hs, kc, n_head, m_run, l_run, fw_s, inv_s);
        }
        __syncthreads();   // weights and corrections complete

        {   // Weighted sum: n-tile t of this warp = columns base + 8t ..; keys of the tile, one k16
            // step. The corrections first (rows_correct); then per 16 columns (their V halves
            // held) every m-tile's weights (re-read per 16 columns: 8 registers fewer than
            // holding all V halves).
            rows_correct(ob, corr_s, MT, gid);
            const uint32_t vo = 2 * (((li & 1) * 8 + lr) * KH + base + (li >> 1) * 8);
            const uint32_t po = 2 * (((li & 1) * 8 + lr) * kF16PS + (li >> 1) * 8);
            // per 16 columns with or without the hi·lo products (as the scores' halves)
            auto vchunk = [&](uint32_t c, auto lo) {
                constexpr bool LO = decltype(lo)::value;
                uint32_t vb[4], vl[4];
                ldsm_x4_h<true>(vb, kh_a + vo + 32 * c);
                if constexpr (LO) ldsm_x4_h<true>(vl, kl_a + vo + 32 * c);
#pragma unroll
                for (uint32_t m = 0; m < kF16MaxMT; ++m) {
                    if (m >= MT) continue;
                    uint32_t ah[4], al[4];
                    ldsm_x4_h(ah, ph_a + po + 32 * m * kF16PS);
                    ldsm_x4_h(al, pl_a + po + 32 * m * kF16PS);
#pragma unroll
                    for (uint32_t tt = 0; tt < 2; ++tt) {
                        const uint32_t t = 2 * c + tt, j = 2 * tt;
                        float u[4];
                        mma_f16_0(u, al, vb[j], vb[j + 1]);
                        if constexpr (LO) mma_f16(u, ah, vl[j], vl[j + 1]);
                        mma_f16(u, ah, vb[j], vb[j + 1]);
#pragma unroll
                        for (uint32_t i = 0; i < 4; ++i) ob[m][t][i] = __fadd_rn(ob[m][t][i], u[i]);
                    }
                }
            };
#pragma unroll
            for (uint32_t c = 0; c < NTW / 2; ++c) {
                if constexpr (FAST) {   // hi·hi only, accumulated in place
                    uint32_t vb[4];
                    ldsm_x4_h<true>(vb, kh_a + vo + 32 * c);
#pragma unroll
                    for (uint32_t m = 0; m < kF16MaxMT; ++m) {
                        if (m >= MT) continue;
                        uint32_t ah[4];
                        ldsm_x4_h(ah, ph_a + po + 32 * m * kF16PS);
#pragma unroll
                        for (uint32_t tt = 0; tt < 2; ++tt)
                            mma_f16(ob[m][2 * c + tt], ah, vb[2 * tt], vb[2 * tt + 1]);
                    }
                } else if ((kmask >> ((base + 16 * c) / 16)) & 1u) {
                    vchunk(c, std::true_type{});
                } else {
                    vchunk(c, std::false_type{});
                }
            }
        }

        if (last) {   // the row's output: normalised into q_s (its halves no longer read), rotated back, written
#pragma unroll
            for (uint32_t m = 0; m < kF16MaxMT; ++m) {
                if (m >= MT) continue;
#pragma unroll
                for (uint32_t half = 0; half < 2; ++half) {
                    const uint32_t h = 16 * m + gid + 8 * half;
                    const float fw = h < n_head ? fw_s[h] : 0.0f, inv = h < n_head ? inv_s[h] : 0.0f;
                    float* dst = q_s + h * DP + base + 2 * tig;
#pragma unroll
                    for (uint32_t t = 0; t < NTW; ++t)
                        *reinterpret_cast<float2*>(dst + 8 * t) =
                            make_float2(__fmul_rn(__fmul_rn(ob[m][t][2 * half], fw), inv),
                                        __fmul_rn(__fmul_rn(ob[m][t][2 * half + 1], fw), inv));
                }
            }
            rows_zero(ob);
            rows_finish<D, T>(q_s, r, n_head, n_rot, rc_s, rs_s, qn, o, oq, od, q, n1.r, R, HP, rows, inv_freq);
        }
        if (!more) break;
        r = n1.r;
        t0 = n1.t0;
        n1 = n2;
        mb ^= 1;
    }
}

template <uint32_t NT, bool FAST>
void launch_rows_f16(const float* q, const float* sinks, uint32_t n_head, uint32_t n_swa, uint32_t ratio,
                     uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer,
                     uint32_t il, uint32_t R, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq, float* od,
                     bool qn, float q_eps, cudaStream_t s) {
    // Once per width (the first call is an eager round, so a graph capture finds it done).
    constexpr auto kernel = attn_rows_f16_kernel<NT, FAST>;
    static const uint32_t resident = [] {
        const size_t most = f16_smem_bytes(64 * NT, kF16MaxMT);
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most)),
              "attention (rows, FP16) shared memory");
        return resident_blocks(reinterpret_cast<const void*>(kernel), kF16Threads, most);
    }();
    const size_t smem = f16_smem_bytes(64 * NT, (n_head + 15) / 16);
    // DSV4_ATTN_QPF=0: no L2 prefetch of a block's next row's queries (the same bits)
    static const bool qpf = env_switch("DSV4_ATTN_QPF", true);
    kernel<<<std::min(R, std::max(1u, resident)), kF16Threads, smem, s>>>(
        q, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq, od, qn,
        double(q_eps), qpf);
    check_launch("attention (rows, FP16)");
}

// ---- The fast mode's rows attention with 32-key tiles (DSV4_ATTN_FAST_KT=32; heads of 512) ----
// Why: attn_rows_f16_kernel<NT, true> pays a tile's bookkeeping for every 16 keys (run 153:
// ~730 warp instructions a warp and tile for its 32 MMAs: the staging, the conversion, the
// online softmax's shuffles and rescale, three barriers; 16 warps at 25 % occupancy, 8.7 cycles
// between a warp's instructions). Here a tile is 32 keys, so that bookkeeping is paid once for
// twice the MMAs, and the row's queries arrive as FP16 already:
//   attn_fast_q_kernel (a warp a head) normalises and rotates q_b's raw heads (qn:
//   rows_head_norm_rope, head_norm_rope's bits), scales them by 2^10 and rounds each value to
//   FP16 once, into the first half of the output o's own row: the rows kernel reads row r's
//   queries (into shared memory, at the row's start) before it writes row r's output, and no
//   other row's. Its shared memory then holds the queries' halves (66.5 KB) instead of their
//   floats (132 KB), which leaves room for a tile of 32 staged keys (66 KB as floats, 33 KB as
//   halves), the score parts of D's four quarters (40 KB) and the weights (5 KB).
// The output leaves from the accumulators (no float copy in shared memory): normalised, the
// tail's pairs rotated back in registers (a thread holds both values of each pair), and the
// Q8_0 codes of a head's 32 columns (one warp's) by a reduction over the 4 lanes that hold them;
// or, asked for a half output (oh, attention's AttnHalfOut: the fast mode's out_a then takes it
// as it is), as FP16 alone, the largest magnitude one atomic a warp at the kernel's end.
// Numerics: the plain FP16 products of attn_rows_f16_kernel<NT, true> (queries, keys, weights
// and values rounded to FP16 once, FP32 sums), other sums' order (a tile's 32 keys in one online
// softmax step): its own bits, still a row's own whatever the batch or chunking.
constexpr uint32_t kFastD = 512;                  // head width (Flash's; 256 keeps the 16-key kernel)
constexpr uint32_t kFastKT = 32;                  // keys a tile
constexpr uint32_t kFastQH = kFastD + 8;          // a query or key row in halves (1,040 bytes ≡ 16 mod 128)
constexpr uint32_t kFastRS = kFastKT + 8;         // score-part row stride in floats (≡ 8 mod 32)
constexpr uint32_t kFastPS = kFastKT + 8;         // weight row stride in halves (80 bytes: 8 rows, 8 bank groups)
constexpr uint32_t kFastOffK32 = 16 * kF16MaxMT * kFastQH * 2;                 // after the queries' halves
constexpr uint32_t kFastOffKh = kFastOffK32 + kFastKT * (kFastD + kAttnPad) * 4;
constexpr uint32_t kFastOffS = kFastOffKh + kFastKT * kFastQH * 2;
constexpr uint32_t kFastOffP = kFastOffS + 4 * 16 * kF16MaxMT * kFastRS * 4;
constexpr uint32_t kFastSmem = kFastOffP + 16 * kF16MaxMT * kFastPS * 2;
static_assert(kFastSmem + 2832 <= 227 * 1024, "fast rows kernel: one block an SM");
static_assert(kF16Threads / kFastKT == 16 && kF16Threads == 8 * 16 * kF16MaxMT && kFastKT == 2 * kF16Warps,
              "fast rows kernel: staging, softmax and conversion threads");

// q_b's rows as FP16 (times 2^10) into the first half of each output row; qn: normalised and
// rotated first (rows_head_norm_rope: head_norm_rope's bits). A block a row, a warp a head.
// oh_max (the half output's largest magnitude, which the rows kernel after this one raises):
// zeroed here, so no memset node sits between the two kernels. qh (AttnQNorm::h): q_b's output
// as FP16 instead of q, each value taken back to its float by the inverse of its top's factor
// (a power of two: the FP16 value exactly) before the same steps.
__global__ void __launch_bounds__(kF16Threads) attn_fast_q_kernel(const float* __restrict__ q, uint32_t n_head,
                                                                  uint32_t n_rot, const double* __restrict__ inv_freq,
                                                                  const DevRow* __restrict__ rows, bool qn,
                                                                  double q_eps, float* __restrict__ o,
                                                                  unsigned* oh_max, const uint16_t* qh,
                                                                  const unsigned* qh_top) {
    pdl_begin();
    if (oh_max && blockIdx.x == 0 && threadIdx.x == 0) *oh_max = 0;   // (the rows kernel's, after this one)
    const float qinv = qh ? 1.0f / f16_factor(*qh_top, 1.0f) : 1.0f;
    constexpr uint32_t D = kFastD, DP = D + kAttnPad;
    __shared__ __align__(16) float row_s[kF16Warps][DP];
    __shared__ float rc_s[kAttnMaxD / 2], rs_s[kAttnMaxD / 2];
    const uint32_t r = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (qn && threadIdx.x < n_rot / 2)
        rope_angle(rows[r].pos, inv_freq, threadIdx.x, false, rc_s[threadIdx.x], rs_s[threadIdx.x]);
    __syncthreads();
    float* x = row_s[w];
    __half2* dst = reinterpret_cast<__half2*>(o + uint64_t(r) * n_head * D);
    for (uint32_t h = w; h < n_head; h += kF16Warps) {
        const uint64_t at = (uint64_t(r) * n_head + h) * D;
        if (qh) {
#pragma unroll
            for (uint32_t j = 0; j < D / 128; ++j) {
                const uint2 v = reinterpret_cast<const uint2*>(qh + at)[lane + 32 * j];
                const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x)),
                             b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
                reinterpret_cast<float4*>(x)[lane + 32 * j] = make_float4(a.x * qinv, a.y * qinv, b.x * qinv, b.y * qinv);
            }
        } else {
            const float4* src = reinterpret_cast<const float4*>(q + at);
#pragma unroll
            for (uint32_t j = 0; j < D / 128; ++j) reinterpret_cast<float4*>(x)[lane + 32 * j] = src[lane + 32 * j];
        }
        __syncwarp();
        if (qn) {
            rows_head_norm_rope<D>(x, n_rot, q_eps, rc_s, rs_s);
            __syncwarp();
        }
#pragma unroll
        for (uint32_t j = 0; j < D / 64; ++j) {
            const float2 v = reinterpret_cast<const float2*>(x)[lane + 32 * j];
            dst[uint64_t(h) * (D / 2) + lane + 32 * j] = __floats2half2_rn(v.x * kF16QScale, v.y * kF16QScale);
        }
        __syncwarp();   // x read out before the warp's next head lands
    }
}

// Per tile of 32 keys (16 warps):
//   the staged floats into halves: warp w key rows 2w, 2w + 1;
//   S = Q·Kᵀ: warp w takes m-tile w % 4 and the tile's 4 key n-tiles over the quarter w / 4 of D
//     (8 k16 steps); the softmax adds the four quarters in order;
//   the online softmax: eight threads a head, four keys each;
//   O = O·corr + P·V: warp w takes D / 16 = 32 columns (4 n-tiles) of every head, two k16 steps.
__global__ void __launch_bounds__(kF16Threads, 1)
    attn_rows_fast_kernel(const __half* q16, const float* __restrict__ sinks, uint32_t n_head, uint32_t n_swa,
                          uint32_t ratio, uint32_t top_k, const uint32_t* __restrict__ sel,
                          const DevRow* __restrict__ rows, const DevLayerKV* __restrict__ lkv, uint32_t n_layer,
                          uint32_t il, uint32_t R, uint32_t n_rot, const double* __restrict__ inv_freq, float* o,
                          int8_t* __restrict__ oq, float* __restrict__ od, uint16_t* __restrict__ oh,
                          unsigned* __restrict__ oh_max) {
    pdl_begin();
    constexpr uint32_t D = kFastD, DP = D + kAttnPad, QH = kFastQH, KT = kFastKT, T = kF16Threads;
    constexpr uint32_t NTW = D / 128;   // the weighted sum's n-tiles of 8 columns a warp
    const uint32_t MT = (n_head + 15) / 16, HP = 16 * MT;
    extern __shared__ float4 sm4[];
    uint8_t* smb = reinterpret_cast<uint8_t*>(sm4);
    __half* q_s = reinterpret_cast<__half*>(smb);
    float* k32 = reinterpret_cast<float*>(smb + kFastOffK32);
    __half* kh_s = reinterpret_cast<__half*>(smb + kFastOffKh);
    float* s_s = reinterpret_cast<float*>(smb + kFastOffS);
    __half* ph_s = reinterpret_cast<__half*>(smb + kFastOffP);
    __shared__ float corr_s[16 * kF16MaxMT], fw_s[16 * kF16MaxMT], inv_s[16 * kF16MaxMT];
    __shared__ float rc_s[kAttnMaxD / 2], rs_s[kAttnMaxD / 2];   // the row's inverse RoPE angles (its last tile)
    if (blockIdx.x >= R) return;
    const uint32_t s_a = uint32_t(__cvta_generic_to_shared(smb)), kh_a = s_a + kFastOffKh, ph_a = s_a + kFastOffP;

    const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const uint32_t li = lane >> 3, lr = lane & 7;                          // ldmatrix: matrix, row
    const uint32_t kj = threadIdx.x / (T / KT), ksub = threadIdx.x % (T / KT);   // key staging: row, first float4
    const uint32_t hs = threadIdx.x >> 3, kc = threadIdx.x & 7;            // softmax: head, key quad
    const float scale = float(1.0 / sqrt(double(D))) / kF16QScale;       // (the queries' 2^10 divided out)
    RowTiles<KT, D, T> tiles{rows, lkv, sel, n_swa, ratio, top_k, n_layer, il, R};
    // padding heads: zero once (a row's copy writes the real heads only)
    for (uint32_t i = threadIdx.x; i < (HP - n_head) * (QH / 8); i += T)
        reinterpret_cast<uint4*>(q_s + n_head * QH)[i] = make_uint4(0, 0, 0, 0);
    // row's queries (attn_fast_q_kernel's halves, the first half of o's row) into q_s
    auto stage_q = [&](uint32_t row) {
        const __half* src = q16 + uint64_t(row) * n_head * D * 2;
        for (uint32_t i = threadIdx.x; i < n_head * (D / 8); i += T) {
            const uint32_t h = i / (D / 8), c = i % (D / 8);
            cp_async16(q_s + h * QH + 8 * c, src + uint64_t(h) * D + 8 * c);
        }
    };

    uint32_t r = blockIdx.x, t0 = 0;
    stage_q(r);
    tiles.stage(r, t0, tiles.sel_of(r, t0, kj), kj, ksub, k32 + kj * DP);
    auto n1 = tiles.next_of(r, t0, kj);   // the next tile (copied during this one)

    const uint32_t base = w * (D / 16);   // this warp's columns of the weighted sum
    float ob[kF16MaxMT][NTW][4];          // running output (times 2^12): heads 16m + gid (+ 8) × this warp's columns
    rows_zero(ob);
    float m_run = -INFINITY, l_run = 0.0f;   // head hs (eight lanes hold it)
    float hmax = 0.0f;                       // the half output's largest |y| (rows_half_max)

    while (true) {
        cp_async_wait_all();
        __syncthreads();   // the tile (and a new row's queries) landed; every warp done with the last tile
#pragma unroll
        for (uint32_t k = 0; k < 2; ++k) {   // the staged floats into halves: key rows 2w, 2w + 1
            const float4* src = reinterpret_cast<const float4*>(k32 + (2 * w + k) * DP);
            uint2* hi = reinterpret_cast<uint2*>(kh_s + (2 * w + k) * QH);
#pragma unroll
            for (uint32_t j = 0; j < D / 128; ++j) {
                const float4 x = src[lane + 32 * j];
                hi[lane + 32 * j] = make_uint2(h2_bits(__floats2half2_rn(x.x, x.y)), h2_bits(__floats2half2_rn(x.z, x.w)));
            }
        }
        const uint32_t NK = tiles.keys(r).NK;
        const uint32_t nt = NK - t0 < KT ? NK - t0 : KT;
        const bool last = t0 + KT >= NK;
        const bool more = n1.r < R;
        __syncthreads();   // halves complete; the staged tile free
        if (more) tiles.stage(n1.r, n1.t0, n1.sg, kj, ksub, k32 + kj * DP);
        const auto n2 = more ? tiles.next_of(n1.r, n1.t0, kj) : n1;

        {   // Scores: warp w, m-tile mp × the tile's 32 keys over dims dq·D/4 ...
            const uint32_t mp = w % 4, dq = w / 4;
            if (mp < MT) {
                float sb[4][4];
#pragma unroll
                for (uint32_t n = 0; n < 4; ++n)
#pragma unroll
                    for (uint32_t i = 0; i < 4; ++i) sb[n][i] = 0.0f;
                const uint32_t qa = s_a + 2 * ((16 * mp + (li & 1) * 8 + lr) * QH + (li >> 1) * 8);
                const uint32_t ko = kh_a + 2 * (((li >> 1) * 8 + lr) * QH + (li & 1) * 8);
#pragma unroll 2
                for (uint32_t kk = 0; kk < D / 64; ++kk) {
                    const uint32_t d0 = dq * (D / 4) + 16 * kk;
                    uint32_t a[4], b[4];
                    ldsm_x4_h(a, qa + 2 * d0);
#pragma unroll
                    for (uint32_t np = 0; np < 2; ++np) {   // keys 16 np .. + 15: n-tiles 2 np, 2 np + 1
                        ldsm_x4_h(b, ko + 2 * (16 * np * QH + d0));
                        mma_f16(sb[2 * np], a, b[0], b[1]);
                        mma_f16(sb[2 * np + 1], a, b[2], b[3]);
                    }
                }
                float* part = s_s + dq * (16 * kF16MaxMT) * kFastRS;
#pragma unroll
                for (uint32_t n = 0; n < 4; ++n) {
                    *reinterpret_cast<float2*>(part + (16 * mp + gid) * kFastRS + 8 * n + 2 * tig) =
                        make_float2(sb[n][0], sb[n][1]);
                    *reinterpret_cast<float2*>(part + (16 * mp + gid + 8) * kFastRS + 8 * n + 2 * tig) =
                        make_float2(sb[n][2], sb[n][3]);
                }
            }
        }
        if (last && threadIdx.x < n_rot / 2)
            rope_angle(rows[r].pos, inv_freq, threadIdx.x, true, rc_s[threadIdx.x], rs_s[threadIdx.x]);
        __syncthreads();   // score parts complete; the queries read
        if (last && more) stage_q(n1.r);   // the block's next row's queries, landed by its first tile

        if (hs < HP) {   // Online softmax of head hs, keys 4kc .. 4kc + 3 (eight lanes a head: every thread)
            float e[4];
            const float corr = rows_softmax_step<4, kFastRS>(s_s, hs, kc, nt, scale, m_run, l_run, e);
            *reinterpret_cast<uint2*>(ph_s + hs * kFastPS + 4 * kc) =
                make_uint2(h2_bits(__floats2half2_rn(e[0] * kF16PScale, e[1] * kF16PScale)),
                           h2_bits(__floats2half2_rn(e[2] * kF16PScale, e[3] * kF16PScale)));
            if (kc == 0) corr_s[hs] = corr;
            if (last) rows_softmax_end(sinks, hs, kc, n_head, m_run, l_run, fw_s, inv_s);
        }
        __syncthreads();   // weights and corrections complete

        {   // Weighted sum: n-tile t of this warp = columns base + 8t ..; the tile's keys, two k16
            // steps; the corrections first
            rows_correct(ob, corr_s, MT, gid);
            const uint32_t vo = kh_a + 2 * (((li & 1) * 8 + lr) * QH + base + (li >> 1) * 8);
            const uint32_t po = ph_a + 2 * (((li & 1) * 8 + lr) * kFastPS + (li >> 1) * 8);
#pragma unroll
            for (uint32_t ks = 0; ks < KT / 16; ++ks)
#pragma unroll
                for (uint32_t c = 0; c < NTW / 2; ++c) {
                    uint32_t vb[4];
                    ldsm_x4_h<true>(vb, vo + 2 * 16 * ks * QH + 32 * c);
#pragma unroll
                    for (uint32_t m = 0; m < kF16MaxMT; ++m) {
                        if (m >= MT) continue;
                        uint32_t ah[4];
                        ldsm_x4_h(ah, po + 2 * 16 * m * kFastPS + 32 * ks);
#pragma unroll
                        for (uint32_t tt = 0; tt < 2; ++tt) mma_f16(ob[m][2 * c + tt], ah, vb[2 * tt], vb[2 * tt + 1]);
                    }
                }
        }

        if (last) {   // the row's output from the accumulators: normalised, rotated back, written
            const uint32_t tail0 = D - n_rot;
#pragma unroll
            for (uint32_t m = 0; m < kF16MaxMT; ++m) {
                if (m >= MT) continue;
#pragma unroll
                for (uint32_t half = 0; half < 2; ++half) {
                    const uint32_t h = 16 * m + gid + 8 * half;
                    const bool real = h < n_head;
                    const float fw = real ? fw_s[h] : 0.0f, inv = real ? inv_s[h] : 0.0f;
                    float y[NTW][2];
                    float am = 0.0f;
#pragma unroll
                    for (uint32_t t = 0; t < NTW; ++t)
                        rows_out_pair(ob[m][t][2 * half], ob[m][t][2 * half + 1], fw, inv, base + 8 * t + 2 * tig, tail0,
                                      rc_s, rs_s, y[t], am);
                    // the head's block of 32 columns (this warp's)
                    rows_store_block(y, am, o, oq, od, oh, (uint64_t(r) * n_head + h) * D + base, tig, real);
                    if (real) hmax = fmaxf(hmax, am);
                }
            }
            rows_zero(ob);
        }
        if (!more) break;
        r = n1.r;
        t0 = n1.t0;
        n1 = n2;
    }
    rows_half_max(hmax, oh ? oh_max : nullptr);
}

// keys_to_halves: session blockIdx.y; its raw rows (positions kh_lo .. kh_hi) and then its
// compressed rows, 8 values a thread (two float4 loads, one 16-byte store) in a grid-stride loop.
__global__ void keys_to_halves_kernel(const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t D, uint32_t ratio) {
    pdl_begin();
    const DevLayerKV L = lkv[uint64_t(blockIdx.y) * n_layer + il];
    if (!L.kh || L.kh_hi < L.kh_lo) return;
    const uint64_t n_raw = uint64_t(L.kh_hi - L.kh_lo + 1), n_comp = ratio ? uint64_t(L.kh_hi + 1) / ratio : 0;
    const uint32_t chunks = D / 8;
    const uint64_t n = (n_raw + n_comp) * chunks;
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const uint64_t k = i / chunks, c = i % chunks;
        const float* src;
        uint64_t dst;
        if (k < n_raw) {
            const uint64_t j = uint64_t(L.kh_lo + int64_t(k)) % L.raw_cap;
            src = L.raw + j * D;
            dst = j * D;
        } else {
            src = L.comp + (k - n_raw) * L.comp_stride;
            dst = (uint64_t(L.raw_cap) + (k - n_raw)) * D;
        }
        const float4 a = __ldcs(reinterpret_cast<const float4*>(src + 8 * c));
        const float4 b = __ldcs(reinterpret_cast<const float4*>(src + 8 * c + 4));
        *reinterpret_cast<uint4*>(L.kh + dst + 8 * c) =
            make_uint4(h2_bits(__floats2half2_rn(a.x, a.y)), h2_bits(__floats2half2_rn(a.z, a.w)),
                       h2_bits(__floats2half2_rn(b.x, b.y)), h2_bits(__floats2half2_rn(b.z, b.w)));
    }
}

std::atomic<uint64_t> g_wg_calls{0};
bool g_key_halves_round = false;
void launch_rows_fast(const float* q, const float* sinks, uint32_t n_head, uint32_t n_swa, uint32_t ratio,
                      uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer,
                      uint32_t il, uint32_t R, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq, float* od,
                      uint16_t* oh, unsigned* oh_max, const uint16_t* qh, const unsigned* qh_top, bool qn,
                      float q_eps, int wg, cudaStream_t s) {
    static const uint32_t resident = [] {
        check(cudaFuncSetAttribute(attn_rows_fast_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kFastSmem)),
              "attention (rows, fast) shared memory");
        return resident_blocks(reinterpret_cast<const void*>(attn_rows_fast_kernel), kF16Threads, kFastSmem);
    }();
    attn_fast_q_kernel<<<R, kF16Threads, 0, s>>>(q, n_head, n_rot, inv_freq, rows, qn, double(q_eps), o, oh_max, qh,
                                                 qh_top);
    check_launch("attention (fast queries)");
    if (wg >= 3 && !g_key_halves_round) wg = 0;   // (forms 3 and 4 read the round's FP16 keys)
    if (wg && launch_rows_wg(wg, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq,
                             od, oh, oh_max, s)) {
        ++g_wg_calls;
        return;
    }
    attn_rows_fast_kernel<<<std::min(R, std::max(1u, resident)), kF16Threads, kFastSmem, s>>>(
        reinterpret_cast<const __half*>(o), sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot,
        inv_freq, o, oq, od, oh, oh_max);
    check_launch("attention (rows, fast)");
}

int g_fast_kt_override = -1;
int g_f16_override = -1, g_fast_override = -1, g_fast_wg_override = -1;
std::atomic<uint64_t> g_fast_calls{0}, g_fast32_calls{0};

}  // namespace

void attn_rows_f16_override(int on) { g_f16_override = on; }
void attn_rows_fast_override(int on) { g_fast_override = on; }
void attn_rows_fast_kt_override(int kt) { g_fast_kt_override = kt; }
uint64_t attn_rows_fast_calls(int kt) { return kt == 32 ? g_fast32_calls.load() : g_fast_calls.load(); }
void attn_rows_fast_wg_override(int form) { g_fast_wg_override = form; }
uint64_t attn_rows_wg_calls() { return g_wg_calls.load(); }
int attn_rows_wg_form() {
    // DSV4_ATTN_FAST_WG (read once; attn_rows_fast_wg_override wins): 1 to 4 the fast rows
    // attention's 32-key tiles by Hopper's warpgroup MMA (sm90a/attention_wg.cu, a compute
    // capability 9.0 device; 2: the key tiles copied by cp.async, 3: copied from the round's FP16
    // keys: the default, run 189: a fast chunk of 4 ratio-4 layers 14.57 -> 13.52 us a token, the
    // attention 3.42 -> 2.38; 4: form 3's keys, the consumers in split roles, other bits, not yet
    // run), 0 by mma.sync (also where the round has no FP16 keys or the device no warpgroup MMA)
    static const int env = env_int("DSV4_ATTN_FAST_WG", 3);
    const int form = g_fast_wg_override >= 0 ? g_fast_wg_override : env;
    return form >= 1 && form <= 4 && gemm_experts_wgmma_available() ? form : 0;
}
void attn_key_halves_round(bool on) { g_key_halves_round = on; }
bool attn_key_halves_round() { return g_key_halves_round; }
void keys_to_halves(const DevLayerKV* lkv, uint32_t S, uint32_t n_layer, uint32_t il, uint32_t D, uint32_t ratio,
                    cudaStream_t s) {
    if (!S) return;
    if (D % 8) throw_mismatch("keys as halves: head width a multiple of 8", 0, D, D);
    keys_to_halves_kernel<<<dim3(std::max(1, 2 * sm_count() / int(S) + 1), S), 256, 0, s>>>(lkv, n_layer, il, D, ratio);
    check_launch("keys as halves");
}

bool attn_rows_f16_on(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    static const bool env = env_switch("DSV4_ATTN_F16", true);
    const bool on = g_f16_override >= 0 ? g_f16_override != 0 : env;
    return on && (D == 256 || D == 512) && n_head >= 1 && n_head <= 16 * kF16MaxMT && n_rot <= D && n_rot % 2 == 0;
}

namespace {
// The plain FP16 form: attn_rows_fast_override, else DSV4_ATTN_FAST (read once: 0 off, else
// on), else the round's (fast_prefill_round: --fast-prefill)
bool rows_fast() {
    static const int fast_env = env_int("DSV4_ATTN_FAST", -1);
    return fast_part(g_fast_override, fast_env);
}
// DSV4_ATTN_FAST_KT (read once; attn_rows_fast_kt_override wins): 32 (default) that form in
// tiles of 32 keys (attn_rows_fast_kernel, heads of 512 up to 64), its own bits, 16 % faster
// than 16 (run 155: a fast chunk's attention 2.15 -> 1.80 us a token); 16: the kernel below's
bool rows_fast32(bool fast, uint32_t n_head, uint32_t D) {
    static const int kt_env = env_int("DSV4_ATTN_FAST_KT", 32);
    return fast && D == kFastD && n_head <= 16 * kF16MaxMT && (g_fast_kt_override > 0 ? g_fast_kt_override : kt_env) == 32;
}
}  // namespace

bool attn_rows_f16_fast32(uint32_t n_head, uint32_t D, uint32_t n_rot) {
    return attn_rows_f16_on(n_head, D, n_rot) && rows_fast32(rows_fast(), n_head, D);
}

void attn_rows_f16(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
                   uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
                   uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq,
                   float* od, uint16_t* oh, unsigned* oh_max, const uint16_t* qh, const unsigned* qh_top, bool qn,
                   float q_eps, cudaStream_t s) {
    const bool fast = rows_fast();
    if (fast) ++g_fast_calls;
    if (rows_fast32(fast, n_head, D)) {
        ++g_fast32_calls;
        const int wg = attn_rows_wg_form();
        launch_rows_fast(q, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq,
                         od, oh, oh_max, qh, qh_top, qn, q_eps, wg, s);
        return;
    }
    auto* launch = D == 256 ? (fast ? launch_rows_f16<4, true> : launch_rows_f16<4, false>)
                            : (fast ? launch_rows_f16<8, true> : launch_rows_f16<8, false>);
    launch(q, sinks, n_head, n_swa, ratio, top_k, sel, rows, lkv, n_layer, il, R, n_rot, inv_freq, o, oq, od, qn, q_eps,
           s);
}

}  // namespace dsv4::cuda
