// IQ2_XXS code expansion from tables replicated in shared memory, shared by the decode
// kernel (matvec.cu: kq_kernel_smem) and the prefill expert GEMM (gemm.cu:
// gemm_iq2_smem_kernel).
//
// A 32-value group of IQ2_XXS is 4 grid rows of 8 magnitudes (bytes 8, 25 or 43) chosen by
// the 4 bytes of a0, with 4 × 7 sign bits in a1 (the eighth sign of each row is the parity of
// the seven). Random indices from one shared copy of a table collide on banks, so the tables
// are replicated and each lane reads its own copy:
// - grid: row i, copy c at 8-byte slot 16 i + c (16 copies, 32 KB); lane l reads copy l & 15,
//   so a half-warp's 64-bit loads fall on 16 different bank pairs: the minimum 2 passes a warp.
//   With 8 copies (16 KB: GRID_COPIES = 8, slot 8 i + c, lane l reads copy l & 7; the prompt
//   order's expert GEMM, short of shared memory) lanes l and l + 8 share a copy, whose rows
//   lie on 2 bank pairs by the parity of i: a half-warp nearly always needs 2 passes, ~4 a warp.
// - signs: not byte masks but prmt selectors picking, per byte, the grid magnitude or its
//   negation (byte t of the result is byte t of g, or of 0x01010100 - g, the byte-wise
//   negation without borrows since no grid byte is 0), i.e. exactly the signed bytes of
//   (g ^ m) + (m & 0x01010101) with the byte masks m. Low half-word: values 0..3, high:
//   4..7. Entry i, copy c at word C i + c for C copies (32: one pass a warp; 16: two).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

constexpr uint32_t kIq2GridCopies = 16;
constexpr uint32_t kIq2GridRepBytes = 256 * kIq2GridCopies * 8;   // 32 KB
// bytes of the grid in `copies` copies (16 or 8)
constexpr uint32_t iq2_grid_rep_bytes(uint32_t copies) { return 256 * copies * 8; }

// ggml's ksigns_iq2xs: sign pattern i's 7 bits and their parity as bit 7 (an even count of
// negative values in every grid row), for the tables built at compile time or on the host.
__host__ __device__ constexpr uint32_t iq2_ksigns(uint32_t i) {
    uint32_t par = 0;
    for (int t = 0; t < 7; ++t) par ^= (i >> t) & 1;
    return i | par << 7;
}

// The 128 selectors (a constant: they depend on ksigns alone), built at compile time.
struct Iq2Selectors {
    uint32_t v[128];
};
constexpr Iq2Selectors iq2_selectors() {
    Iq2Selectors r{};
    for (uint32_t i = 0; i < 128; ++i) {
        const uint32_t v = iq2_ksigns(i);
        uint32_t s = 0;
        for (int t = 0; t < 8; ++t) s |= (uint32_t(t & 3) + 4 * ((v >> t) & 1)) << (4 * (t & 3) + 16 * (t >> 2));
        r.v[i] = s;
    }
    return r;
}

// Fills the replicated tables in shared memory with the block's NT threads: grid_s gets
// iq2_grid_rep_bytes(GRID_COPIES) (row i, copy c at 8-byte slot GRID_COPIES i + c), sel_s the
// selectors in SEL_COPIES copies (entry i, copy c at word SEL_COPIES i + c), from grid (256
// rows) and sel (128 selectors) in global memory. The selectors' loads first, then the grid's
// in rounds of 4 (few registers beside loads the caller has in flight); 16-byte stores to
// consecutive addresses per warp (conflict-free). No barrier: the caller's next one makes the
// tables visible.
// The selectors less `minus` (iq2_fill_nib: their byte positions) in SEL_COPIES copies, all loads
// first.
template <uint32_t NT, uint32_t SEL_COPIES>
__device__ __forceinline__ void iq2_fill_sel(uint4* sel_s, const uint32_t* sel, uint32_t tid, uint32_t minus = 0) {
    constexpr uint32_t NS = 128 * SEL_COPIES * 4 / 16 / NT;
    static_assert(NS * NT * 16 == 128 * SEL_COPIES * 4, "selector fill shape");
    uint32_t sv[NS];
#pragma unroll
    for (uint32_t j = 0; j < NS; ++j) sv[j] = __ldg(&sel[(tid + NT * j) / (SEL_COPIES / 4)]) - minus;
#pragma unroll
    for (uint32_t j = 0; j < NS; ++j) sel_s[tid + NT * j] = make_uint4(sv[j], sv[j], sv[j], sv[j]);
}

// A table of ROWS 64-bit rows in COPIES copies (row i, copy c at 8-byte slot COPIES i + c) from
// src in global memory, by the block's NT threads: loads in rounds of 4 (few registers beside
// loads the caller has in flight), then 16-byte stores to consecutive addresses per warp.
template <uint32_t NT, uint32_t ROWS, uint32_t COPIES>
__device__ __forceinline__ void iq2_fill_rows(uint4* dst, const uint64_t* src, uint32_t tid) {
    constexpr uint32_t NG = ROWS * COPIES * 8 / 16 / NT;
    static_assert(NG % 4 == 0 && NG * NT * 16 == ROWS * COPIES * 8, "fill shape");
#pragma unroll
    for (uint32_t j0 = 0; j0 < NG; j0 += 4) {
        uint64_t g[4];
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) g[j] = __ldg(&src[(tid + NT * (j0 + j)) / (COPIES / 2)]);
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j)
            dst[tid + NT * (j0 + j)] = make_uint4(uint32_t(g[j]), uint32_t(g[j] >> 32), uint32_t(g[j]), uint32_t(g[j] >> 32));
    }
}

template <uint32_t NT, uint32_t SEL_COPIES, uint32_t GRID_COPIES = kIq2GridCopies>
__device__ __forceinline__ void iq2_fill_rep(uint4* grid_s, uint4* sel_s, const uint64_t* grid, const uint32_t* sel,
                                             uint32_t tid) {
    static_assert(GRID_COPIES == 16 || GRID_COPIES == 8, "grid copies: 16 or 8");
    iq2_fill_sel<NT, SEL_COPIES>(sel_s, sel, tid);
    iq2_fill_rows<NT, 256, GRID_COPIES>(grid_s, grid, tid);
}

// prmt without __byte_perm's masking of the selector (an extra AND per call): the
// selectors never set a nibble's bit 3 (sign replication).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// x >> s for s >= 0, x << -s otherwise (s is a constant once the caller's loop is unrolled:
// one shift).
__device__ __forceinline__ uint32_t shift_right(uint32_t x, int s) { return s >= 0 ? x >> s : x << -s; }

// Row l (0..3) of one group (a0: grid indices, a1: signs and scale): its 8 grid magnitudes g
// and its prmt sign selector sel. gb: this lane's grid copy (tables + 8 (lane % GRID_COPIES));
// sb: its selector copy (selectors + 4 copy); SEL_COPIES: the selector table's copies (its
// entries are 4 SEL_COPIES bytes apart); GRID_COPIES: the grid's (rows 8 GRID_COPIES apart).
template <uint32_t SEL_COPIES, uint32_t GRID_COPIES = kIq2GridCopies>
__device__ __forceinline__ void iq2_row_rep(uint32_t a0, uint32_t a1, int l, const uint8_t* gb, const uint8_t* sb,
                                            uint2& g, uint32_t& sel) {
    static_assert(SEL_COPIES == 16 || SEL_COPIES == 32, "selector copies: 16 or 32");
    static_assert(GRID_COPIES == 16 || GRID_COPIES == 8, "grid copies: 16 or 8");
    constexpr int kSelShift = SEL_COPIES == 32 ? 7 : 6;    // log2 of the selector entry stride
    constexpr int kGridShift = GRID_COPIES == 16 ? 7 : 6;  // log2 of the grid row stride
    // 8 GRID_COPIES × grid index (byte l of a0); 4 SEL_COPIES × sign index (bits 7l..7l+6 of a1)
    const uint32_t go = shift_right(a0, 8 * l - kGridShift) & (0xFFu << kGridShift);
    const uint32_t so = shift_right(a1, 7 * l - kSelShift) & (127u << kSelShift);
    g = *reinterpret_cast<const uint2*>(gb + go);
    sel = *reinterpret_cast<const uint32_t*>(sb + so);
}

// The grid as codes (NIB, the prompt order's expert GEMM, opt-in): every grid byte is 8, 25 or 43
// (all 256 rows of kIq2xxsGrid), so row i is 8 two-bit codes 0, 1, 2, kept a nibble each
// (value t at bits 4t: the selectors' layout), and the selector with the sign in bit 2 of each
// nibble picks the signed byte from two constant words: kIq2Pos (8, 25, 43) and kIq2Neg
// (their negations). The same int8 values as iq2_expand_rep, from 4-byte table reads where the
// grid takes 8, and 16 copies of the codes (16 KB, 2 lanes a copy) where 8 of the grid take as
// much: ~2 shared-memory passes a warp's lookups instead of ~4. The sign table holds the
// selectors' sign bits alone (the selectors less their byte positions, 0x32103210).
constexpr uint32_t kIq2Pos = 0x002B1908u, kIq2Neg = 0x00D5E7F8u;
constexpr uint32_t kIq2SelPositions = 0x32103210u;

// Fills the codes (NIB_COPIES copies: row i, copy c at word NIB_COPIES i + c) and the sign
// selectors (SEL_COPIES copies) with the block's NT threads, from grid and sel in global memory;
// 16-byte stores to consecutive addresses per warp. No barrier (the caller's next one).
template <uint32_t NT, uint32_t SEL_COPIES, uint32_t NIB_COPIES>
__device__ __forceinline__ void iq2_fill_nib(uint4* nib_s, uint4* sel_s, const uint64_t* grid, const uint32_t* sel,
                                             uint32_t tid) {
    constexpr uint32_t NN = 256 * NIB_COPIES / 4 / NT;
    static_assert(NN * NT * 4 == 256 * NIB_COPIES, "fill shape");
    iq2_fill_sel<NT, SEL_COPIES>(sel_s, sel, tid, kIq2SelPositions);
#pragma unroll
    for (uint32_t j = 0; j < NN; ++j) {
        const uint64_t g = __ldg(&grid[(tid + NT * j) / (NIB_COPIES / 4)]);
        uint32_t n = 0;
#pragma unroll
        for (uint32_t t = 0; t < 8; ++t) {
            const uint32_t b = uint32_t(g >> (8 * t)) & 0xFFu;
            n |= (uint32_t(b > 0x08u) + uint32_t(b > 0x19u)) << (4 * t);
        }
        nib_s[tid + NT * j] = make_uint4(n, n, n, n);
    }
}

// The 8 signed code words of one group from the codes: nb this lane's copy (table + 4 (lane %
// NIB_COPIES)), sb its sign selectors' (table + 4 copy).
template <uint32_t SEL_COPIES, uint32_t NIB_COPIES>
__device__ __forceinline__ void iq2_expand_nib(uint32_t a0, uint32_t a1, const uint8_t* nb, const uint8_t* sb,
                                               uint32_t* w) {
    static_assert(SEL_COPIES == 16 || SEL_COPIES == 32, "selector copies: 16 or 32");
    static_assert(NIB_COPIES == 16 || NIB_COPIES == 32, "code copies: 16 or 32");
    constexpr int kSelShift = SEL_COPIES == 32 ? 7 : 6;   // log2 of the selector entry stride
    constexpr int kNibShift = NIB_COPIES == 32 ? 7 : 6;   // log2 of the code row stride
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        const uint32_t no = shift_right(a0, 8 * l - kNibShift) & (0xFFu << kNibShift);
        const uint32_t so = shift_right(a1, 7 * l - kSelShift) & (127u << kSelShift);
        const uint32_t sel = *reinterpret_cast<const uint32_t*>(nb + no) | *reinterpret_cast<const uint32_t*>(sb + so);
        w[2 * l] = prmt(kIq2Pos, kIq2Neg, sel);
        w[2 * l + 1] = prmt(kIq2Pos, kIq2Neg, sel >> 16);
    }
}

// The 8 signed code words of one group (iq2_row_rep's arguments).
template <uint32_t SEL_COPIES, uint32_t GRID_COPIES = kIq2GridCopies>
__device__ __forceinline__ void iq2_expand_rep(uint32_t a0, uint32_t a1, const uint8_t* gb, const uint8_t* sb,
                                               uint32_t* w) {
#pragma unroll
    for (int l = 0; l < 4; ++l) {
        uint2 g;
        uint32_t sel;
        iq2_row_rep<SEL_COPIES, GRID_COPIES>(a0, a1, l, gb, sb, g, sel);
        w[2 * l] = prmt(g.x, 0x01010100u - g.x, sel);
        w[2 * l + 1] = prmt(g.y, 0x01010100u - g.y, sel >> 16);
    }
}

// ---- The fast mode's FP16 expansion (experts_f16.cuh: gemm_experts_f16_kernel<T_IQ2_XXS>) --
// Every signed grid value ±8, ±25, ±43 is an exact half (0x4800, 0x4E40, 0x5160 and the same
// with bit 15), whose bytes are only eight: high 0x48 0x4E 0x51 0xC8 0xCE 0xD1, low 0x40 0x60
// and 0x00, the last from PRMT's sign replication (a selector nibble's bit 3) of the positive
// byte 0x40. So one PRMT of the two constant words kIq2HalfLo (bytes 0x48 0x4E 0x51 0x40) and
// kIq2HalfHi (0xC8 0xCE 0xD1 0x60) makes a pair of signed values as halves, its selector two
// bytes, one a value: low nibble the low byte (code c = 0, 1, 2 for 8, 25, 43: 0xB, 3, 7), high
// nibble the high byte (c + 4 · sign). The byte is the OR of a grid part (iq2_half_grid_byte:
// the low nibble and c << 4) and a sign part (0x40 when negative), so the selectors of a grid
// row's 8 values are one 64-bit word of each table, ORed.
constexpr uint32_t kIq2HalfLo = 0x40514E48u, kIq2HalfHi = 0x60D1CEC8u;
// The grid part of a value's selector byte from its magnitude (8, 25 or 43).
__host__ __device__ constexpr uint32_t iq2_half_grid_byte(uint32_t magnitude) {
    const uint32_t c = uint32_t(magnitude > 8) + uint32_t(magnitude > 25);
    return (c == 0 ? 0xBu : c == 1 ? 0x3u : 0x7u) | c << 4;
}
// The sign parts of the 128 sign patterns: byte t 0x40 when value t is negative (ksigns).
struct Iq2HalfSigns {
    uint64_t v[128];
};
constexpr Iq2HalfSigns iq2_half_signs() {
    Iq2HalfSigns r{};
    for (uint32_t i = 0; i < 128; ++i)
        for (int t = 0; t < 8; ++t) r.v[i] |= uint64_t((iq2_ksigns(i) >> t) & 1) << (8 * t + 6);
    return r;
}

}  // namespace dsv4::cuda
