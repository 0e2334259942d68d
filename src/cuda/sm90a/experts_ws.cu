// The fast mode's routed experts, warp-specialised (WS: kXfWs; the default for rounds of fewer than
// ~96 pairs an expert since runs 218-220, an H100: its gate+up ~4 % faster than WG's, its down
// even, the 36-layer fast prefill ~1 % faster): the IQ2_XXS gate+up and the Q2_K down. Compiled
// for sm_90a alone (CMakeLists.txt), like experts_wgmma.cu.
//
// Why: the WG form (gemm_experts_f16_kernel) has every thread copy, wait, meet the block-wide
// barrier, expand the activations to halves (B), then expand its weights (A) and issue the
// wgmma, once a 64-value tile. Runs 208 and 211 (an H100, a fast chunk, µs a token) found its
// parts adding up instead of hiding one another: the gate+up's loop alone (copies, barrier, B
// expansion, row setup) 1.84 of 3.31, the A expansion 0.77, the MMAs 0.67; of the loop ~0.65 the
// copies, the rest ~1.2 neither. The down's loop alone is 1.06 of 1.80.
//
// Here a block of five warpgroups over 512 stage rows: warpgroup 0, the producer, issues every
// copy of a tile kWsAhead tiles ahead, waits for its own copies of tile g, expands tile g's B
// into the stage and arrives on the stage's `full` mbarrier; warpgroups 1-4, the consumers,
// wait on `full`, expand their A from the stage and run the same wgmma as WG in each
// accumulator's order, then free the stage (`empty`, a warp's lane 0 each). No block-wide
// barrier in the loop: a consumer waits for nothing but its tile's data, and the copies' issue
// and the B expansion leave the consumers' instruction stream. Four consumers share one B tile,
// so the activations' copies and their expansion happen once for 512 rows instead of 256.
//   IQ2_XXS: 256 output rows, each consumer warp 16 (m-tile 0 gate's, 1 up's same rows, so the
//   swiglu stays in the thread, as in WG); a stage holds each row's tile of code words and, at a
//   super-block's first tile, its d.
//   Q2_K: 512 output rows, each consumer warp 32 (its two m-tiles). Two tiles read the same 32
//   code bytes of a row (WG's paired codes): the even tile's stage holds them, and the consumers
//   free an even tile's stage with the odd one's. A super-block's scale bytes and (d, dmin) are
//   staged once, with its first tile, into one of two buffers by the parity of the block's
//   super-block count (WG's SB).
// Registers: 640 threads at 96 a thread (one block an SM); the producer gives back to 32 and the
// consumers take 112 (128 x 32 + 512 x 112 = 640 x 96): the accumulators, two m64n64, are 64 of
// them. (ptxas serialises the wgmma below ~120 if an m-tile's two k-steps share a commit group,
// as WG's KG 2 does: here each wgmma is its own group, KG 1's order.)
// Checked on the host: tests/cuda/ws_protocol.py (the mbarrier protocol under random
// interleavings) and tests/cuda/ws_layout.py (every copy's address and every consumer's reads).
// The block takes items (a group's row block each) blockIdx.x, + gridDim.x, ... (ws_persist: one
// block an SM, so the IQ2_XXS tables are filled once and an item's first copies fly during the
// item before; else one item a block), its tiles one sequence g through the stages.
#include <algorithm>

#include "cuda/experts_f16.cuh"
#include "cuda/kernels.h"   // sm_count
#include "cuda/sm90a/wgmma_ss.cuh"

namespace dsv4::cuda::xf {

namespace {
constexpr int kWsConsumers = 4;                       // consumer warpgroups
constexpr int kWsThreads = 128 * (1 + kWsConsumers);  // and the producer
constexpr int kWsStageRows = 128 * kWsConsumers;      // 32 a consumer warp
constexpr int ws_out_rows(uint32_t T) { return T == T_IQ2_XXS ? kWsStageRows / 2 : kWsStageRows; }
// Stages a type: as many as shared memory holds (IQ2_XXS 7 x 23 KB beside its 48 KB of tables,
// Q2_K 6 x 29 KB beside its super-block parts). The producer issues tile j's copies once tile
// j - stages is consumed by every consumer warp, so the stages beyond kWsAhead + 1 are how far
// the fastest consumer may run ahead of the slowest before it waits on `full` (run 217, five
// stages: the consumers' `full` waits 11 % of their stall samples).
constexpr int kWsStagesIq2 = 7;
constexpr int kWsStagesQ2k = 6;
template <uint32_t T>
constexpr int ws_stages() { return T == T_IQ2_XXS ? kWsStagesIq2 : kWsStagesQ2k; }
// Tiles whose copies fly while the producer expands one: after expanding tile g it issues tile
// g + kWsAhead's copies into the stage of tile g + kWsAhead - stages, once the consumers are
// done with that tile (Q2_K, whose even tiles' stages are freed with the odd tile after them:
// with the tile after it). kWsAhead + 1 <= stages, else Q2_K's producer would wait for a
// tile it has yet to expand (tests/cuda/ws_protocol.py). DSV4_XF_WS_AHEAD (KqGemm::ws_ahead) picks
// kWsAhead (3, the default) to kWsAheadMost; the protocol model runs each.
constexpr int kWsAhead = 3;
constexpr int kWsAheadMost = 5;
static_assert(kWsAheadMost + 1 <= kWsStagesIq2 && kWsAheadMost + 1 <= kWsStagesQ2k,
              "WS: the producer never waits for a tile it has not yet expanded");
// Q2_K's super-block parts, two buffers: written with tile 4 sb's issue (after tile 4 sb - NS is
// consumed, an even one with the odd tile after it), read by super-block sb - 2's tiles up to
// 4 sb - 5: NS <= 6 (tests/cuda/ws_protocol.py models the protocol: seven stages race)
static_assert(kWsStagesQ2k <= 6, "WS Q2_K: the super-block parts' two buffers");
constexpr uint32_t kWsProducerRegs = 32, kWsConsumerRegs = 112;
static_assert(128 * kWsProducerRegs + 128 * kWsConsumers * kWsConsumerRegs <= kWsThreads * 96,
              "setmaxnreg: the consumers take what the producer gives back of the launch's 96 a thread");

template <uint32_t T>
struct WsSmem {
    static constexpr bool iq2 = T == T_IQ2_XXS;
    static constexpr int pairs = int(kKqFlatPairs);
    // IQ2_XXS: the half selectors' grid parts [256] and sign parts [128], 16 copies (as XfSmem's)
    static constexpr int hgrid = 0, hsign = hgrid + (iq2 ? 256 * kXfGridCopies * 8 : 0);
    // Q2_K: [2] by super-block parity: the rows' 16 scale bytes [512][16], (d, dmin) [512]
    static constexpr int sbq = hsign + (iq2 ? 128 * kXfGridCopies * 8 : 0), sbq_bytes = iq2 ? 0 : kWsStageRows * 20;
    static constexpr int stages = sbq + 2 * sbq_bytes;
    // a stage: B (the activations as halves, xf_wg_offset's layout); the rows' code bytes (IQ2_XXS
    // the tile's 16 [512][16] and d's 4-byte word [512]; Q2_K an even tile's and the next tile's 32
    // [512][32]); the activation codes [64][64]; dx a 16-byte chunk [256] (each chunk's own, copied
    // by the thread that expands it)
    static constexpr int st_b = 0, st_codes = st_b + pairs * kXfK * 2,
                         st_dw = st_codes + kWsStageRows * (iq2 ? 16 : 32), st_act = st_dw + (iq2 ? kWsStageRows * 4 : 0),
                         st_dx = st_act + pairs * kXfK, st_bytes = st_dx + pairs * 4 * 4;
    static constexpr int ns = ws_stages<T>();
    static constexpr int bars = stages + ns * st_bytes;   // full[ns], empty[ns]
    static constexpr int bytes = bars + 2 * ns * 8;
};
static_assert(WsSmem<T_IQ2_XXS>::bytes + 1024 <= 228 * 1024, "WS IQ2_XXS experts: one block an SM");
static_assert(WsSmem<T_Q2_K>::bytes + 1024 <= 228 * 1024, "WS Q2_K experts: one block an SM");
static_assert(WsSmem<T_IQ2_XXS>::st_bytes % 128 == 0 && WsSmem<T_Q2_K>::st_bytes % 128 == 0 &&
                  WsSmem<T_Q2_K>::stages % 128 == 0,
              "WS: each stage's B at a 128-byte boundary");

// An item: row block x of group gi (WG's blockIdx.x, .y).
struct WsItem {
    ExpertGroup eg;
    uint64_t m0;
    int nv;          // tiles of 8 pairs holding a pair
    uint32_t used;   // the pairs staged and expanded
};
template <uint32_t T>
__device__ __forceinline__ WsItem ws_item(const KqGemm& p, int it, int nx) {
    WsItem w;
    w.eg = expert_group_at(p, uint32_t(it / nx), int(kKqFlatPairs));
    w.m0 = uint64_t(it % nx) * ws_out_rows(T);
    w.nv = xf_pair_tiles(p, w.eg.cnt, int(kKqFlatPairs) / 8);
    w.used = xf_staged_pairs(p, w.eg.cnt, kKqFlatPairs);
    return w;
}

template <uint32_t T, int AHEAD>
__global__ void __launch_bounds__(kWsThreads, 1) gemm_experts_ws_kernel(KqGemm p, int nx) {
    constexpr bool IQ2 = T == T_IQ2_XXS;
    static_assert(IQ2 || T == T_Q2_K, "WS: the IQ2_XXS gate+up or the Q2_K down");
    pdl_begin();
    using L = WsSmem<T>;
    constexpr int PAIRS = L::pairs, NT = PAIRS / 8, NS = L::ns, OUT = ws_out_rows(T);
    extern __shared__ __align__(128) uint8_t sm[];
    const int items = nx * *p.count;
    if (int(blockIdx.x) >= items) return;
    const int my_items = (items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int nsb = int(p.K / 256), ntiles = int(p.K / kXfK);   // (ntiles a multiple of 4)
    auto item = [&](int k) { return ws_item<T>(p, int(blockIdx.x) + k * int(gridDim.x), nx); };
    // a row of the item (IQ2_XXS: gate's and up's row r % 256), clamped for the loads
    auto w_row = [&](const WsItem& w, uint32_t r) { return w.eg.wbase + min(w.m0 + r % OUT, p.N - 1); };
    auto stage = [&](int g) { return sm + L::stages + (g % NS) * L::st_bytes; };
    // Q2_K: tile g's code bytes (the even tile's stage) and its super-block's parts
    [[maybe_unused]] auto codes = [&](int g) { return stage(g & ~1) + L::st_codes; };
    [[maybe_unused]] auto sbq = [&](int g) { return sm + L::sbq + ((g >> 2) & 1) * L::sbq_bytes; };
    uint64_t* full = reinterpret_cast<uint64_t*>(sm + L::bars);
    uint64_t* empty = full + NS;
    if constexpr (IQ2)
        if (t < 256) {
            iq2_fill_rows<256, 256, kXfGridCopies>(reinterpret_cast<uint4*>(sm + L::hgrid), p.hgrid, t);
            iq2_fill_rows<256, 128, kXfGridCopies>(reinterpret_cast<uint4*>(sm + L::hsign), p.hsign, t);
        }
    if (t < uint32_t(NS)) {
        mbar_init(full + t, 128);                   // every producer thread
        mbar_init(empty + t, 4 * kWsConsumers);     // each consumer warp's lane 0
    }
    __syncthreads();   // the tables filled, the barriers initialised

    if (warp < 4) {   // ---- the producer
        wgss::reg_dealloc<kWsProducerRegs>();
        const int G = my_items * ntiles;
        // the item being issued: this thread's activation chunks c = t, t + 128 (pair c / 4, part
        // c % 4) and its rows' first super-blocks (IQ2_XXS: rows t + 128 j, j = 0, 1 gate's, 2, 3
        // up's same rows; Q2_K: rows t / 2 + 64 j, j = 0 .. 7, half t % 2 of their code bytes),
        // as 32-bit offsets (xf_fits)
        constexpr int NR = IQ2 ? 2 : 8;
        uint32_t act_off[2], dx_off[2], sb_r[NR], used_i = 0, used_x = 0;
        auto issue = [&](int g) {
            const int i = g % ntiles;
            if (i == 0) {
                const WsItem w = item(g / ntiles);
                used_i = w.used;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const uint32_t c = t + 128 * j;
                    const uint32_t arow = uint32_t(w.eg.pairs[min(int(c >> 2), w.eg.cnt - 1)]) / p.act_div;
                    act_off[j] = arow * uint32_t(p.AL) + (c & 3) * 16;
                    dx_off[j] = arow * uint32_t(p.AL / 256);
                }
#pragma unroll
                for (int j = 0; j < NR; ++j)
                    sb_r[j] = uint32_t(w_row(w, IQ2 ? t + 128 * j : (t >> 1) + 64 * j)) * uint32_t(nsb);
            }
            uint8_t* st = stage(g);
            const int sb = i >> 2;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const uint32_t c = t + 128 * j;
                if ((c >> 2) < used_i) {
                    cp_async16(st + L::st_act + c * 16, p.aq + (act_off[j] + uint32_t(i) * kXfK));
                    cp_async4(st + L::st_dx + c * 4, p.ad + (dx_off[j] + uint32_t(sb)));
                }
            }
            if constexpr (IQ2) {
                // groups 2 (i % 4), + 1 of the super-block's 8 (8 bytes each): the row's bytes 16 i ..
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint32_t r = t + 128 * j, sbr = sb_r[j & 1];
                    cp_async16(st + L::st_codes + r * 16, p.wq[j >> 1] + (sbr * 64 + uint32_t(i) * 16));
                    if ((i & 3) == 0)   // (d: one a super-block, read at its first tile)
                        cp_async4(st + L::st_dw + r * 4, p.wd[j >> 1] + ((sbr + uint32_t(sb)) & ~1u));
                }
            } else {
                // an even tile: the 32 code bytes of half (i % 4) / 2 of the super-block (after its
                // 16 scale bytes) that it and the next tile read, this thread's 16 of rows t / 2 + 64 j
                if (!(i & 1))
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        cp_async16(st + L::st_codes + ((t >> 1) + 64 * j) * 32 + (t & 1) * 16,
                                   p.wq[0] + (sb_r[j] * 80 + uint32_t(sb) * 80 + 16 + 32 * uint32_t((i & 3) >> 1) +
                                              (t & 1) * 16));
                if ((i & 3) == 0)   // the super-block's 16 scale bytes (t even) or (d, dmin) (t odd) of the rows
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const uint32_t r = (t >> 1) + 64 * j, sbr = sb_r[j] + uint32_t(sb);
                        if (t & 1) cp_async4(sbq(g) + kWsStageRows * 16 + r * 4, p.wd[0] + sbr * 2);
                        else cp_async16(sbq(g) + r * 16, p.wq[0] + sbr * 80);
                    }
            }
        };
        // tile g's chunks of this thread as halves q · dx into the stage's B, made visible to the
        // consumers' wgmma (the async proxy)
        auto expand_b = [&](int g) {
            if (g % ntiles == 0) used_x = item(g / ntiles).used;
            uint8_t* st = stage(g);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const uint32_t c = t + 128 * j;
                if ((c >> 2) < used_x)
                    xf_expand_chunk(*reinterpret_cast<const uint4*>(st + L::st_act + c * 16),
                                    *reinterpret_cast<const float*>(st + L::st_dx + c * 4), [&](uint32_t v) {
                                        return reinterpret_cast<uint32_t*>(st + L::st_b +
                                                                           xf_wg_offset<PAIRS>(c >> 2, c & 3, v));
                                    });
            }
            fence_proxy_async();
        };
        for (int g = 0; g < AHEAD; ++g) {
            if (g < G) issue(g);   // (AHEAD < NS: stages never used yet)
            cp_async_commit();
        }
        // Tile g's B first, then tile g + AHEAD's copies: the expansion waits only for its own
        // copies, never for the consumers (run 213: issuing first, behind the wait for tile
        // g - 2's stage, left the consumers waiting on `full` for 14 % of their samples)
        for (int g = 0; g < G; ++g) {
            cp_async_wait<AHEAD - 1>();   // this thread's copies of tile g landed
            expand_b(g);
            mbar_arrive(full + g % NS);
            const int j = g + AHEAD;
            if (j < G) {
                if (j >= NS) mbar_wait(empty + j % NS, uint32_t(j / NS - 1) & 1);   // tile j - NS consumed
                issue(j);
            }
            cp_async_commit();
        }
        cp_async_wait<0>();
        return;
    }

    // ---- the consumers: warpgroup w / 4 - 1's warp cw (0-15). Its fragment rows gid and + 8 of
    // m-tile mt: IQ2_XXS stage rows 256 mt + 16 cw + gid (+ 8), m-tile 0 gate's, 1 up's, output
    // rows 16 cw + gid (+ 8); Q2_K stage and output rows 32 cw + 16 mt + gid (+ 8)
    wgss::reg_alloc<kWsConsumerRegs>();
    const uint32_t cw = warp - 4, gid = lane >> 2, tig = lane & 3;
    auto stage_row = [&](int mt, int h) -> uint32_t {
        return IQ2 ? 256 * mt + 16 * cw + gid + 8 * h : 32 * cw + 16 * mt + gid + 8 * h;
    };
    [[maybe_unused]] const uint32_t copy8 = (lane % kXfGridCopies) * 8;
#pragma unroll 1
    for (int k = 0; k < my_items; ++k) {
        const int g0 = k * ntiles;
        uint32_t dpar = 0;   // IQ2_XXS, bit 2 mt + h: the parity of the row's first d (xf_iq2_row)
        int nv = 0;
        {
            const WsItem w = item(k);
            if constexpr (IQ2)
                for (int mt = 0; mt < 2; ++mt)
                    for (int h = 0; h < 2; ++h)
                        dpar |= uint32_t((w_row(w, stage_row(mt, h)) * nsb) & 1) << (2 * mt + h);
            nv = w.nv;
        }
        auto run = [&](auto ntv) {
            constexpr int NV = decltype(ntv)::value, N = 8 * NV;
            float acc[2][NT][4];
            each(acc, [](float& x) { x = 0.0f; });
            [[maybe_unused]] uint32_t d2[2][2] = {};
#pragma unroll 1
            for (int i = 0; i < ntiles; ++i) {
                const int g = g0 + i;
                mbar_wait(full + g % NS, uint32_t(g / NS) & 1);
                const uint8_t* st = stage(g);
                // the rows' setup: IQ2_XXS their grid indices a2, signs b2 and scales s2; Q2_K their
                // FP16 steps a2 · q + b2 (WG's row setup, without TABLE) and code bytes' offset
                uint32_t a2[2][2], b2[2][2];
                [[maybe_unused]] uint32_t s2[2][2];
                [[maybe_unused]] const uint8_t* qrow[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t r = stage_row(mt, h);
                        if constexpr (IQ2) {
                            xf_iq2_row(st + L::st_codes + r * 16, st + L::st_dw + r * 4, i, (dpar >> (2 * mt + h)) & 1,
                                       tig, d2[mt][h], a2[mt][h], b2[mt][h], s2[mt][h]);
                        } else {
                            qrow[mt][h] = codes(g) + r * 32 + (tig & 1) * 16;
                            const uint32_t sc = sbq(g)[r * 16 + 4 * (i & 3) + tig];
                            const uint32_t dd = *reinterpret_cast<const uint32_t*>(sbq(g) + kWsStageRows * 16 + r * 4);
                            xf_q2k_steps(dd, sc, a2[mt][h], b2[mt][h]);
                        }
                    }
                [[maybe_unused]] const int sh = 2 * (2 * (i & 1) + int(tig >> 1));   // Q2_K: the codes' shift
                // code words ks, ks + 1 (Q2_K: of each row; IQ2_XXS: the selectors of grid row ks /
                // 2), then k-step ks + kk's fragments and wgmma, an m-tile each
#pragma unroll
                for (int ks = 0; ks < kXfK / 16; ks += 2) {
                    uint2 q[2][2];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            if constexpr (IQ2)
                                q[mt][h] = xf_iq2_selectors(sm + L::hgrid, sm + L::hsign, a2[mt][h], b2[mt][h], ks, copy8);
                            else
                                q[mt][h] = *reinterpret_cast<const uint2*>(qrow[mt][h] + 4 * ks);
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            uint32_t a[4];
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const uint32_t wd = kk ? q[mt][h].y : q[mt][h].x;
                                if constexpr (IQ2) xf_iq2_frag(wd, s2[mt][h], a[h], a[2 + h]);
                                else xf_q2k_frag(wd, sh, a2[mt][h], b2[mt][h], a[h], a[2 + h]);
                            }
                            wg_fence();
                            wg_mma<N>(reinterpret_cast<float(&)[NT * 4]>(acc[mt]), a,
                                      wg_desc<PAIRS>(st + L::st_b + (ks + kk) * (PAIRS * 32)));
                            wg_commit();
                            wg_wait<1>();
                        }
                }
                wg_wait<0>();   // the tile's wgmma done: its B and code bytes free
                __syncwarp();
                // (Q2_K: an even tile's stage, whose code bytes the odd tile read, with the odd one)
                if (lane == 0 && (IQ2 || (i & 1))) {
                    if constexpr (!IQ2) mbar_arrive(empty + (g - 1) % NS);
                    mbar_arrive(empty + g % NS);
                }
            }
            each(acc, wg_fence_operand);
            // (the item read again rather than kept through the tile loop: registers)
            const WsItem w = item(k);
#pragma unroll
            for (int nt = 0; nt < NV; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = 8 * nt + int(2 * tig) + (e & 1);
                    if (c >= w.eg.cnt) continue;
                    const uint64_t pc = uint32_t(w.eg.pairs[c]);
                    if constexpr (IQ2) {
                        const uint64_t n = w.m0 + 16 * cw + gid + 8 * (e >> 1);
                        if (n < p.N)
                            p.y[pc * p.y_stride + n] = swiglu_pair<true>(acc[0][nt][e] * (1.0f / kXfWScale),
                                                                         acc[1][nt][e] * (1.0f / kXfWScale), p.clamp,
                                                                         p.ew, uint32_t(pc));
                    } else {
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            const uint64_t n = w.m0 + 32 * cw + 16 * mt + gid + 8 * (e >> 1);
                            if (n < p.N) p.y[pc * p.y_stride + n] = acc[mt][nt][e] * (1.0f / kXfWScale);
                        }
                    }
                }
        };
        // (in steps of 16 pairs, the wgmma shapes' step here)
        with_tiles<1, NT / 2>((nv + 1) / 2, [&](auto n2) { run(std::integral_constant<int, 2 * decltype(n2)::value>{}); });
    }
}

template <uint32_t T, int AHEAD>
bool launch_ws(const KqGemm& p, uint64_t N, uint32_t cap, cudaStream_t s) {
    static bool ready = false;
    constexpr int bytes = WsSmem<T>::bytes;
    const auto kernel = gemm_experts_ws_kernel<T, AHEAD>;
    if (!smem_ready(reinterpret_cast<const void*>(kernel), bytes, ready, s)) return false;
    // (the round's group count is the device's: the grid covers cap groups, blocks past them return)
    const int nx = int((N + ws_out_rows(T) - 1) / ws_out_rows(T));
    const int blocks = p.ws_persist ? std::min(nx * int(cap), sm_count()) : nx * int(cap);
    kernel<<<uint32_t(blocks), kWsThreads, bytes, s>>>(p, nx);
    return true;
}
template <uint32_t T>
bool launch_ws_ahead(const KqGemm& p, uint64_t N, uint32_t cap, cudaStream_t s) {
    static_assert(kWsAhead == 3 && kWsAheadMost == 5, "WS: an instance for each AHEAD");
    switch (p.ws_ahead) {
        case 4: return launch_ws<T, 4>(p, N, cap, s);
        case 5: return launch_ws<T, 5>(p, N, cap, s);
        default: return launch_ws<T, kWsAhead>(p, N, cap, s);
    }
}
}  // namespace

bool launch_experts_ws(const KqGemm& p, uint32_t type, uint64_t N, uint32_t cap, cudaStream_t s) {
    return type == T_IQ2_XXS ? launch_ws_ahead<T_IQ2_XXS>(p, N, cap, s) : launch_ws_ahead<T_Q2_K>(p, N, cap, s);
}

}  // namespace dsv4::cuda::xf
