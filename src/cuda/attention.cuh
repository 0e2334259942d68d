// Sink attention (§5.12): what the split kernels (model.cu: FP32 CUDA cores;
// attention_tc.cu: tensor cores) and the merge share. The split of a row's keys and the
// scratch layout of the partials are fixed here, so attn_merge_kernel combines either
// kernel's partials.
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

namespace dsv4::cuda {

constexpr uint32_t kAttnThreads = 256;
constexpr uint32_t kAttnWarps = kAttnThreads / 32;
constexpr uint32_t kAttnMaxD = 512;
constexpr uint32_t kAttnHB = 8;         // heads per block; = kAttnWarps (softmax: one warp per head)
constexpr uint32_t kAttnKT = 32;        // keys per staged tile; = warp width (softmax: a lane per key)
constexpr uint32_t kAttnKS = 32;        // keys per split, at least (until the split count is capped)
constexpr uint32_t kAttnMaxSplit = 32;  // = warp width (the merge reduces the splits in one warp)
constexpr uint32_t kAttnPad = 4;        // floats after each staged query/key row: no bank conflicts across rows
constexpr uint32_t kAttnMergeThreads = kAttnMaxD / 4;
constexpr uint32_t kAttnMaxSliceRows = 64;   // rows per launch; = two warps (the split kernel's item list)
static_assert(kAttnHB == kAttnWarps && kAttnHB == 8 && kAttnKT == 32 && kAttnMaxSplit == 32, "attention layout");
static_assert(kAttnThreads == 2 * (kAttnMaxD / 4), "weighted sum: two key groups of one float4 column per thread");
static_assert(kAttnThreads == 8 * kAttnKT, "staging: eight threads per key");
static_assert(kAttnMaxSliceRows == 64 && kAttnThreads >= 64, "item list: one thread per row of a slice");

// Number of splits of a row with NK keys; non-decreasing in NK (the launcher bounds it by the
// largest NK a layer can have).
__host__ __device__ constexpr uint32_t attn_nsplit(uint64_t NK) {
    const uint64_t n = (NK + kAttnKS - 1) / kAttnKS;
    return uint32_t(n < kAttnMaxSplit ? n : kAttnMaxSplit);
}

// A row's keys: raw window positions lo .. lo+n_raw-1, then n_comp compressed rows (the
// selected ones when use_sel).
struct AttnKeys {
    int64_t lo;
    uint64_t n_raw, NK;
    bool use_sel;
};
__device__ __forceinline__ AttnKeys attn_keys(int64_t p, uint32_t n_swa, uint32_t ratio, uint32_t top_k) {
    AttnKeys k;
    k.lo = p + 1 >= int64_t(n_swa) ? p + 1 - n_swa : 0;
    k.n_raw = uint64_t(p + 1 - k.lo);
    const uint64_t n_vis = ratio ? uint64_t(p + 1) / ratio : 0;
    k.use_sel = ratio == 4 && n_vis > top_k;
    k.NK = k.n_raw + (k.use_sel ? top_k : n_vis);
    return k;
}

// Key g (0 .. NK-1) of a row: a raw ring row, or a compressed row (with use_sel, the row's
// selection sel_g = sel_r[g - n_raw], read by the caller).
__device__ __forceinline__ const float* attn_key_row_sel(const AttnKeys& ks, const DevLayerKV& L, uint64_t g,
                                                         uint32_t sel_g, uint32_t D) {
    if (g < ks.n_raw) return L.raw + uint64_t((ks.lo + int64_t(g)) % L.raw_cap) * D;
    const uint64_t c = ks.use_sel ? sel_g : g - ks.n_raw;
    return L.comp + c * L.comp_stride;
}
// The same, reading the selection from sel_r (the row's top_k selections).
__device__ __forceinline__ const float* attn_key_row(const AttnKeys& ks, const DevLayerKV& L, const uint32_t* sel_r,
                                                     uint64_t g, uint32_t D) {
    return attn_key_row_sel(ks, L, g, g >= ks.n_raw && ks.use_sel ? sel_r[g - ks.n_raw] : 0u, D);
}

// The split kernels' item list: incl_s[i] = splits of rows 0..i of the slice (rows past
// n_rows count 0). Every thread of the block calls it (two warps scan, two barriers).
__device__ __forceinline__ void attn_split_scan(uint32_t* incl_s, const DevRow* __restrict__ rows, uint32_t r0,
                                                uint32_t n_rows, uint32_t n_swa, uint32_t ratio, uint32_t top_k) {
    const uint32_t lane = threadIdx.x & 31;
    if (threadIdx.x < kAttnMaxSliceRows) {   // two warps: split counts, inclusive scan per warp
        const uint32_t i = threadIdx.x;
        uint32_t v = i < n_rows ? attn_nsplit(attn_keys(rows[r0 + i].pos, n_swa, ratio, top_k).NK) : 0;
        for (uint32_t o = 1; o < 32; o <<= 1) {
            const uint32_t t = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += t;
        }
        incl_s[i] = v;
    }
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < kAttnMaxSliceRows) incl_s[threadIdx.x] += incl_s[31];
    __syncthreads();
}

// The slice row of (row, split) pair P: the first row whose inclusive count exceeds P.
__device__ __forceinline__ uint32_t attn_pair_row(const uint32_t* incl_s, uint32_t P) {
    uint32_t lo_i = 0, hi_i = kAttnMaxSliceRows - 1;
    while (lo_i < hi_i) {
        const uint32_t mid = (lo_i + hi_i) / 2;
        if (incl_s[mid] > P) hi_i = mid;
        else lo_i = mid + 1;
    }
    return lo_i;
}

// 16-byte global → shared copy, asynchronous where the architecture has cp.async (the
// staged keys bypass L1: they are read from shared memory only).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t s = uint32_t(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<float4*>(smem) = *reinterpret_cast<const float4*>(gmem);
#endif
}
// Commits the copies issued so far and waits for all of them.
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

// The output projection's Q8_0 codes of 4 values y of a head's row (its float4 c; 8 threads
// = one 32-value block, called by whole warps): quantize_act's bytes, at value `at` of the rows.
__device__ __forceinline__ void attn_store_codes(float4 y, uint32_t c, uint64_t at, int8_t* oq, float* od) {
    float am = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
    for (int x = 1; x < 8; x <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, x));
    const float dd = am / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    char4 q4;
    q4.x = q_clamp(y.x * id);
    q4.y = q_clamp(y.y * id);
    q4.z = q_clamp(y.z * id);
    q4.w = q_clamp(y.w * id);
    reinterpret_cast<char4*>(oq + at)[c] = q4;
    if ((c & 7) == 0) od[at / 32 + c / 8] = f16_round(dd);
}

// The prompt rounds' query fold (the rows kernels' qn: q is q_b's raw output): head_norm_rope's
// per-head RMSNorm and RoPE (norm, not inverse) on one staged head x of D values by one warp,
// with its bits: lane l plays threads l, l + 32, l + 64, l + 96 of head_norm_rope_reg_kernel's
// block of 128 (thread t: values t + 128 j, j in order), so the squares in double in each
// thread's order (rms_scale_reg's), warp_sum_d's butterfly on each of the four (side by side:
// independent chains) and their totals added in warp order from 0 (block_sum_d's) are that
// kernel's. At D = 64 (head_norm_rope_kernel's rms_norm_block: threads 64 .. 127 hold nothing)
// the last two totals are 0 and add nothing. Then rr, the unit weight's product, and
// rope_pair's operations on each tail pair (i: cos cs[i], sin sn[i]), the partner exchanged by
// a shuffle (any even n_rot <= D: a pair never straddles two runs of 32). eps comes as a
// double: a float converted here is hoisted out of attn_rows_tc_kernel's tile loop into two
// registers, and its 16-warp form at D = 512 spilled.
template <uint32_t D>
__device__ __forceinline__ void rows_head_norm_rope(float* x, uint32_t n_rot, double eps, const float* cs,
                                                    const float* sn) {
    constexpr uint32_t VPT = (D + 127) / 128;        // values of a thread (D = 64: one, threads 0 .. 63)
    constexpr uint32_t NW = D < 128 ? D / 32 : 4;   // the block's warps that hold values
    const uint32_t lane = threadIdx.x & 31, tail0 = D - n_rot;
    double ss[4] = {0, 0, 0, 0};
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j)
#pragma unroll
        for (uint32_t w = 0; w < NW; ++w) {
            const float v = x[128 * j + 32 * w + lane];
            ss[w] += double(v) * double(v);
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (uint32_t w = 0; w < 4; ++w) ss[w] += __shfl_xor_sync(0xffffffffu, ss[w], o);
    double tot = 0;
#pragma unroll
    for (uint32_t w = 0; w < 4; ++w) tot += ss[w];
    const float rr = float(1.0 / sqrt(tot / D + eps));
#pragma unroll 4
    for (uint32_t c = 0; c < D / 32; ++c) {   // run c: values 32c .. 32c + 31
        const uint32_t e = 32 * c + lane;
        float v = __fmul_rn(__fmul_rn(x[e], rr), 1.0f);   // (rms_norm_block's unit weight)
        if (32 * c + 31 >= tail0) {   // (the whole warp: the shuffle)
            const float other = __shfl_xor_sync(0xffffffffu, v, 1);
            if (e >= tail0) {
                const uint32_t i = (e - tail0) / 2;
                const float c0 = cs[i], s0 = sn[i];
                const bool odd = (e - tail0) & 1;
                const float x0 = odd ? other : v, x1 = odd ? v : other;
                v = odd ? __fadd_rn(__fmul_rn(x0, s0), __fmul_rn(x1, c0)) : __fsub_rn(__fmul_rn(x0, c0), __fmul_rn(x1, s0));
            }
        }
        x[e] = v;
    }
}

// ---- what the prompt rounds' rows kernels share (attention_tc.cu, attention_rows_f16.cu) ----
// The FP16 kernel's walk over key tiles: rows blockIdx.x, + gridDim.x, ... (r >= R: none), KT
// keys a tile, key row kj of a tile staged by T / KT threads (ksub); a row's keys (attn_keys) in
// 32-bit arithmetic: positions, rings and key counts fit 32 bits (contexts below 2^31), where
// 64-bit divisions are calls whose saved registers spilled at the 128-register cap. The key
// range of the last row asked for is kept (the tiles around a step are mostly one row's). (The
// TF32 kernel keeps its own 64-bit walk: the same integers, but at D = 512 with 16 warps ptxas
// spilled ~150 bytes with this one where it spills none with that.)
template <uint32_t KT, uint32_t D, uint32_t T>
struct RowTiles {
    struct Keys {
        uint32_t lo, n_raw, NK;
        bool use_sel;
    };
    const DevRow* rows;
    const DevLayerKV* lkv;
    const uint32_t* sel;
    uint32_t n_swa, ratio, top_k, n_layer, il, R;
    uint32_t kr = ~0u;
    Keys kks{};

    __device__ __forceinline__ Keys keys(uint32_t r) {
        if (r != kr) {
            kr = r;
            const uint32_t p = uint32_t(rows[r].pos);
            kks.lo = p + 1 >= n_swa ? p + 1 - n_swa : 0;
            kks.n_raw = p + 1 - kks.lo;
            const uint32_t n_vis = ratio ? (p + 1) / ratio : 0;
            kks.use_sel = ratio == 4 && n_vis > top_k;
            kks.NK = kks.n_raw + (kks.use_sel ? top_k : n_vis);
        }
        return kks;
    }
    // (r, t0) to the tile after it
    __device__ __forceinline__ void advance(uint32_t& r, uint32_t& t0) {
        t0 += KT;
        if (t0 >= keys(r).NK) {
            r += gridDim.x;
            t0 = 0;
        }
    }
    // the selection of key row kj of tile (r, t0), read a tile ahead of its copy
    __device__ __forceinline__ uint32_t sel_of(uint32_t r, uint32_t t0, uint32_t kj) {
        if (r >= R) return 0u;
        const Keys ks = keys(r);
        const uint32_t g = t0 + kj;
        return g < ks.NK && g >= ks.n_raw && ks.use_sel ? sel[uint64_t(r) * top_k + (g - ks.n_raw)] : 0u;
    }
    // key g's selection (g below NK; 0 where it is a ring row or the row selects none)
    __device__ __forceinline__ uint32_t sel_at(const Keys& ks, uint32_t r, uint32_t g) const {
        return g >= ks.n_raw && ks.use_sel ? sel[uint64_t(r) * top_k + (g - ks.n_raw)] : 0u;
    }
    // The tile after (r, t0) and key row kj's selection there: a kernel keeps the tile after the
    // one it computes (copied during it) and reads the selection of the one after that.
    struct Next {
        uint32_t r, t0, sg;
    };
    __device__ __forceinline__ Next next_of(uint32_t r, uint32_t t0, uint32_t kj) {
        advance(r, t0);
        return {r, t0, sel_of(r, t0, kj)};
    }
    // Key g (below NK) of row r with keys ks, selection sg where the row selects
    // (attn_key_row_sel's rows): its float row, and its row in the round's FP16 keys
    // (DevLayerKV::kh: the ring's rows, then the compressed ones).
    __device__ __forceinline__ const float* key_row(const Keys& ks, uint32_t r, uint32_t g, uint32_t sg) const {
        const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
        return g < ks.n_raw ? L.raw + uint64_t((ks.lo + g) % L.raw_cap) * D
                            : L.comp + uint64_t(ks.use_sel ? sg : g - ks.n_raw) * L.comp_stride;
    }
    __device__ __forceinline__ const uint16_t* key_half_row(const Keys& ks, uint32_t r, uint32_t g,
                                                            uint32_t sg) const {
        const DevLayerKV& L = lkv[uint64_t(rows[r].sess) * n_layer + il];
        return L.kh + (g < ks.n_raw ? uint64_t((ks.lo + g) % L.raw_cap)
                                    : L.raw_cap + uint64_t(ks.use_sel ? sg : g - ks.n_raw)) * D;
    }
    // This thread's part of key row kj of tile (r, t0) (selection sg) into the staged row dst;
    // rows past the row's keys zero (their weights are 0, and 0 · a stale NaN would not be).
    __device__ __forceinline__ void stage(uint32_t r, uint32_t t0, uint32_t sg, uint32_t kj, uint32_t ksub, float* dst) {
        constexpr uint32_t D4 = D / 4, KTH = T / KT;
        const Keys ks = keys(r);
        const uint32_t g = t0 + kj;
        if (g < ks.NK) {
            const float* kp = key_row(ks, r, g, sg);
            for (uint32_t u = ksub; u < D4; u += KTH) cp_async16(dst + 4 * u, kp + 4 * u);
        } else {
            for (uint32_t u = ksub; u < D4; u += KTH) *reinterpret_cast<float4*>(dst + 4 * u) = make_float4(0, 0, 0, 0);
        }
    }
};

// The rows kernels' running output ob[m-tile][n-tile][4] (heads 16m + gid, + 8; a warp's
// columns): zeroed, and times each head's correction corr_s (an m-tile's skipped where all are 1:
// once a head's running max settles, most tiles; multiplying by 1 changes nothing).
template <uint32_t MAXMT, uint32_t NTW>
__device__ __forceinline__ void rows_zero(float (&ob)[MAXMT][NTW][4]) {
#pragma unroll
    for (uint32_t m = 0; m < MAXMT; ++m)
#pragma unroll
        for (uint32_t t = 0; t < NTW; ++t)
#pragma unroll
            for (uint32_t i = 0; i < 4; ++i) ob[m][t][i] = 0.0f;
}
template <uint32_t MAXMT, uint32_t NTW>
__device__ __forceinline__ void rows_correct(float (&ob)[MAXMT][NTW][4], const float* corr_s, uint32_t MT,
                                             uint32_t gid) {
#pragma unroll
    for (uint32_t m = 0; m < MAXMT; ++m) {
        if (m >= MT) continue;
        const float c0 = corr_s[16 * m + gid], c1 = corr_s[16 * m + gid + 8];
        if (__all_sync(0xffffffffu, c0 == 1.0f && c1 == 1.0f)) continue;
#pragma unroll
        for (uint32_t t = 0; t < NTW; ++t) {
            ob[m][t][0] = __fmul_rn(ob[m][t][0], c0);
            ob[m][t][1] = __fmul_rn(ob[m][t][1], c0);
            ob[m][t][2] = __fmul_rn(ob[m][t][2], c1);
            ob[m][t][3] = __fmul_rn(ob[m][t][3], c1);
        }
    }
}

// The rows kernels whose output leaves from the accumulators (attn_rows_fast_kernel, the
// warpgroup form of sm90a/attention_wg.cu): a head's share of its sink fw and the normalisation
// inv at the row's end, from its running max m and sum l (the weights' scale before FP16,
// pscale, divided out: a power of two, exact).
__device__ __forceinline__ void rows_sink_norm(float sink, float m, float l, float pscale, float& fw, float& inv) {
    const float M = fmaxf(sink, m);
    fw = expf(m - M);
    inv = __fmul_rn(1.0f / __fadd_rn(expf(sink - M), __fmul_rn(l, fw)), 1.0f / pscale);
}
// An output pair (accumulators a0, a1 at columns col, col + 1) normalised and, in the RoPE tail
// (columns from tail0), rotated back by the row's inverse angles rc, rs (rope_pair's operations,
// the sine negated); am grows to the pair's largest magnitude.
__device__ __forceinline__ void rows_out_pair(float a0, float a1, float fw, float inv, uint32_t col, uint32_t tail0,
                                              const float* rc, const float* rs, float (&y)[2], float& am) {
    float y0 = __fmul_rn(__fmul_rn(a0, fw), inv), y1 = __fmul_rn(__fmul_rn(a1, fw), inv);
    if (col >= tail0) {
        const uint32_t i = (col - tail0) / 2;
        const float cs = rc[i], sn = rs[i], x0 = y0, x1 = y1;
        y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
    }
    y[0] = y0, y[1] = y1;
    am = fmaxf(am, fmaxf(fabsf(y0), fabsf(y1)));
}
// A head's block of 32 output columns held by a lane quad (lane tig: the pairs at 8 t + 2 tig of
// the block starting at value `at`), stored for a real head, with oq its Q8_0 codes
// (attn_store_codes' operations; am: this lane's largest magnitude). Every lane of the quad calls it.
// With oh (the fast rows kernels' half output, attn_rows_half_output) the values times
// kAttnHalfScale as FP16 there instead, and neither the floats nor the codes.
__device__ __forceinline__ void rows_store_block(const float (&y)[4][2], float am, float* o, int8_t* oq, float* od,
                                                 uint16_t* oh, uint64_t at, uint32_t tig, bool real) {
    if (oh) {
        if (real)
#pragma unroll
            for (uint32_t t = 0; t < 4; ++t) {
                const __half2 h = __floats2half2_rn(y[t][0] * kAttnHalfScale, y[t][1] * kAttnHalfScale);
                *reinterpret_cast<__half2*>(oh + at + 8 * t + 2 * tig) = h;
            }
        return;
    }
    if (real)
#pragma unroll
        for (uint32_t t = 0; t < 4; ++t) *reinterpret_cast<float2*>(o + at + 8 * t + 2 * tig) = make_float2(y[t][0], y[t][1]);
    if (!oq) return;
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
    const float dd = am / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    if (!real) return;
#pragma unroll
    for (uint32_t t = 0; t < 4; ++t) {
        char2 q2;
        q2.x = q_clamp(y[t][0] * id);
        q2.y = q_clamp(y[t][1] * id);
        *reinterpret_cast<char2*>(oq + at + 8 * t + 2 * tig) = q2;
    }
    if (tig == 0) od[at / 32] = f16_round(dd);
}
// The half output's largest magnitude (its values' scale: |o| · kAttnHalfScale, up to the halves'
// rounding) into *oh_max: a warp's running maximum hm (each lane's |y| of its real heads), once a
// warp at the kernel's end (the caller zeroes *oh_max before the launch). Every lane calls it.
__device__ __forceinline__ void rows_half_max(float hm, unsigned* oh_max) {
    if (!oh_max) return;
    hm = warp_max(hm) * kAttnHalfScale;
    if ((threadIdx.x & 31) == 0 && hm > 0.0f) atomicMax(oh_max, __float_as_uint(hm));
}

// Row r's queries into q_s ([HP][DP] floats; padding heads zero) by the block's T threads.
template <uint32_t D, uint32_t T>
__device__ __forceinline__ void rows_stage_q(float* q_s, const float* q, uint32_t r, uint32_t n_head, uint32_t HP) {
    constexpr uint32_t D4 = D / 4, DP = D + kAttnPad;
    const float* qr = q + uint64_t(r) * n_head * D;
    for (uint32_t i = threadIdx.x; i < HP * D4; i += T) {
        const uint32_t h = i / D4, u = i % D4;
        if (h < n_head) cp_async16(q_s + h * DP + 4 * u, qr + uint64_t(h) * D + 4 * u);
        else *reinterpret_cast<float4*>(q_s + h * DP + 4 * u) = make_float4(0, 0, 0, 0);
    }
}

// A row's end, once its normalised output rows are in q_s (every thread calls it after storing
// its part): the tail pairs rotated back (inverse RoPE: angles rc, rs, or with qn the forward
// ones, rs negated), row r of o written, and with oq the output projection's Q8_0 codes; then
// (r1 < R) the next row's queries staged into q_s, and with qn its forward angles made into rc,
// rs (read out above).
template <uint32_t D, uint32_t T>
__device__ __forceinline__ void rows_finish(float* q_s, uint32_t r, uint32_t n_head, uint32_t n_rot, float* rc,
                                            float* rs, bool qn, float* o, int8_t* oq, float* od, const float* q,
                                            uint32_t r1, uint32_t R, uint32_t HP, const DevRow* rows,
                                            const double* inv_freq) {
    constexpr uint32_t D4 = D / 4, DP = D + kAttnPad;
    __syncthreads();   // the output rows complete
    const uint32_t pairs = n_rot / 2;
    for (uint32_t i = threadIdx.x; i < n_head * pairs; i += T)
        rope_pair(q_s + (i / pairs) * DP + (D - n_rot), i % pairs, rc[i % pairs], qn ? -rs[i % pairs] : rs[i % pairs]);
    __syncthreads();   // rotated
    for (uint32_t i = threadIdx.x; i < n_head * D4; i += T) {
        const uint32_t h = i / D4, c = i % D4;
        const float4 y = *reinterpret_cast<const float4*>(q_s + h * DP + 4 * c);
        const uint64_t at = (uint64_t(r) * n_head + h) * D;
        reinterpret_cast<float4*>(o + at)[c] = y;
        if (oq) attn_store_codes(y, c, at, oq, od);   // (D4 >= 32: whole warps)
    }
    __syncthreads();   // q_s read out
    if (r1 >= R) return;
    rows_stage_q<D, T>(q_s, q, r1, n_head, HP);
    if (qn && threadIdx.x < n_rot / 2) rope_angle(rows[r1].pos, inv_freq, threadIdx.x, false, rc[threadIdx.x], rs[threadIdx.x]);
}

// ---- the tensor-core split kernel (attention_tc.cu) -------------------------------------
// Shapes it takes: head widths D = 64, 128, 256 or 512 (the old kernel takes the rest).
bool attn_tc_ok(uint32_t n_head, uint32_t D);
// Whether attention() uses it: DSV4_ATTN_TC (read once, default 0: see attn_tc_on) unless a test forced it
// with attn_tc_override (kernels.h).
bool attn_tc_on();
// The partials of rows r0 .. r0+n_rows-1 (a slice), in attn_split_kernel's layout. loop
// (attention()'s DSV4_ATTN_LOOP, many rows): 0 an item per (row, split, 16 heads); 1 an item
// per (row, split) over all its head groups, a one-tile split's keys copied once; 2 the same
// with the groups per item chosen for the GPU's parallelism. The same bits in every mode.
void attn_split_tc(const float* q, uint32_t n_head, uint32_t D, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                   const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il,
                   uint32_t r0, uint32_t n_rows, uint32_t max_split, float* part_o, float2* part_ml, uint32_t loop,
                   cudaStream_t s);

// ---- prompt rounds: an item per row (attention_tc.cu) --------------------------------------
// Shapes it takes: attn_rows_ok (kernels.h).
// Rows 0 .. R-1 whole (all heads, all keys, the sink, normalisation, inverse RoPE, oq / od the
// output projection's Q8_0 codes when given): FP32-accurate, not the split kernels' bits.
// qn: q raw (q_b's output), each row's staged heads normalised and rotated in the kernel with
// head_norm_rope's operations (eps q_eps): head_norm_rope then the kernel's bits. oh: the output
// as FP16 instead, its largest magnitude into *oh_max where given (attention's AttnHalfOut,
// where attn_rows_half_output); qh, qh_top: q as FP16 (AttnQNorm::h, there too).
void attn_rows_tc(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
                  uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
                  uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq,
                  float* od, uint16_t* oh, unsigned* oh_max, const uint16_t* qh, const unsigned* qh_top, bool qn,
                  float q_eps, cudaStream_t s);
// Whether the rows kernel takes raw queries (DSV4_ATTN_QNORM_ROWS, read once, default 1, unless a
// test forced it with attn_rows_qnorm_override): attn_rows_qnorm (kernels.h) asks it.
bool attn_rows_qnorm_on();
// The same rows on the FP16 tensor cores (attention_rows_f16.cu: FP32-accurate by hi + lo halves,
// its own bits; widths 256 and 512, official or plain numerics): attn_rows_tc takes it when
// attn_rows_f16_on (DSV4_ATTN_F16, read once, default 1, unless a test forced it with
// attn_rows_f16_override, kernels.h). A fast prompt round (fast_prefill_round, DSV4_ATTN_FAST=1,
// attn_rows_fast_override) runs it in plain FP16 instead (hi halves only: other bits).
bool attn_rows_f16_on(uint32_t n_head, uint32_t D, uint32_t n_rot);
// Whether that plain form runs in tiles of 32 keys (attn_rows_fast_kernel or the warpgroup form):
// the kernels that can write their output as FP16 (oh).
bool attn_rows_f16_fast32(uint32_t n_head, uint32_t D, uint32_t n_rot);
void attn_rows_f16(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
                   uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
                   uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq,
                   float* od, uint16_t* oh, unsigned* oh_max, const uint16_t* qh, const unsigned* qh_top, bool qn,
                   float q_eps, cudaStream_t s);

}  // namespace dsv4::cuda
