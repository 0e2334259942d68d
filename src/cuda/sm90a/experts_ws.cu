// The fast mode's IQ2_XXS gate+up, warp-specialised (WS: kXfWs, DSV4_XF_WGMMA=3; opt-in until a
// device measures it). Compiled for sm_90a alone (CMakeLists.txt), like experts_wgmma.cu.
//
// Why: the WG form (gemm_experts_f16_kernel) has every thread copy, wait, meet the block-wide
// barrier, expand the activations to halves (B), then expand its weights (A) and issue the
// wgmma, once a 64-value tile. Runs 208 and 211 (an H100, a fast chunk's gate+up, µs a token)
// found its parts adding up instead of hiding one another: the loop alone (copies, barrier, B
// expansion, row setup) 1.84 of 3.31, the A expansion 0.77, the MMAs 0.67; of the loop ~0.65
// the copies, the rest ~1.2 neither.
//
// Here a block of five warpgroups over 512 stage rows (256 output rows: gate's, then up's same
// rows): warpgroup 0, the producer, issues every copy of a tile (the rows' code words, d at a
// super-block's first tile, the pairs' activation codes and dx) kAhead tiles ahead, waits for
// its own copies of tile i, expands tile i's B into the stage and arrives on the stage's `full`
// mbarrier; warpgroups 1-4, the consumers, each 64 rows of gate and the same of up (so the
// swiglu stays in the thread, as in WG), wait on `full`, expand their A from the stage and run
// the same wgmma as WG in the same order (KG 2: an m-tile's two k-steps of a code word a group),
// then free the stage (`empty`, a warp's lane 0 each). No block-wide barrier in the loop: a
// consumer waits for nothing but its tile's data, and the B expansion and the copies' issue
// leave the consumers' instruction stream. Four consumers share one B tile, so the activations'
// copies and their expansion happen once for 512 rows instead of once for 256.
// Registers: 640 threads at 96 a thread (one block an SM); the producer gives back to 32 and the
// consumers take 112 (128 x 32 + 512 x 112 = 640 x 96): the accumulators, m64n64 for gate and
// for up, are 64 of them. Shared memory: the IQ2_XXS half selector tables (48 KB) and five
// stages of 23 KB (B 8 KB, codes 8 KB, d 2 KB, activations 4 KB, dx 1 KB): ~164 KB.
#include <algorithm>

#include "cuda/experts_f16.cuh"
#include "cuda/kernels.h"   // sm_count
#include "cuda/sm90a/wgmma_ss.cuh"

namespace dsv4::cuda::xf {

namespace {
constexpr int kWsConsumers = 4;                       // consumer warpgroups
constexpr int kWsThreads = 128 * (1 + kWsConsumers);  // and the producer
constexpr int kWsOutRows = 64 * kWsConsumers;         // output rows a block: 16 a consumer warp
constexpr int kWsStageRows = 2 * kWsOutRows;          // gate's rows, then up's
constexpr int kWsStages = 5;
// Tiles whose copies fly while the producer expands one: it issues tile i + kWsAhead's copies
// into the stage of tile i + kWsAhead - kWsStages, so it waits for the consumers to be done
// with tile i - 2 and stays up to two tiles ahead of them.
constexpr int kWsAhead = 3;
constexpr uint32_t kWsProducerRegs = 32, kWsConsumerRegs = 112;
static_assert(128 * kWsProducerRegs + 128 * kWsConsumers * kWsConsumerRegs <= kWsThreads * 96,
              "setmaxnreg: the consumers take what the producer gives back of the launch's 96 a thread");

struct WsSmem {
    static constexpr int pairs = int(kKqFlatPairs);
    // the half selectors' grid parts [256] and sign parts [128], 16 copies (as XfSmem's)
    static constexpr int hgrid = 0, hsign = hgrid + 256 * kXfGridCopies * 8;
    static constexpr int stages = hsign + 128 * kXfGridCopies * 8;
    // a stage: B (the activations as halves, xf_wg_offset's layout), the rows' code words [512][16]
    // (d: the 4-byte word holding it [512]), the activation codes [64][64], dx a 16-byte chunk
    // [256] (each chunk's own, copied by the thread that expands it)
    static constexpr int st_b = 0, st_codes = st_b + pairs * kXfK * 2, st_dw = st_codes + kWsStageRows * 16,
                         st_act = st_dw + kWsStageRows * 4, st_dx = st_act + pairs * kXfK,
                         st_bytes = st_dx + pairs * 4 * 4;
    static constexpr int bars = stages + kWsStages * st_bytes;   // full[stages], empty[stages]
    static constexpr int bytes = bars + 2 * kWsStages * 8;
};
static_assert(WsSmem::bytes + 1024 <= 228 * 1024, "WS experts: one block an SM");
static_assert(WsSmem::st_bytes % 128 == 0, "WS: each stage's B at a 128-byte boundary");

// An item: row block x of group gi (the grid's former blockIdx.x, .y); a block takes items
// blockIdx.x, + gridDim.x, ... of the round's nx · count (ws_persist: one block an SM, so the
// tables are filled once and the producer's copies of an item's first tiles fly during the
// item before; else one item a block).
struct WsItem {
    ExpertGroup eg;
    uint64_t m0;
    int nv;          // tiles of 8 pairs holding a pair
    uint32_t used;   // the pairs staged and expanded
};
__device__ __forceinline__ WsItem ws_item(const KqGemm& p, int it, int nx) {
    const int gi = it / nx;
    const int32_t* g = p.grp + 3 * gi;
    WsItem w;
    w.eg = {uint64_t(g[0]) * p.rows_per_expert, p.pairs + g[1], min(g[2], int(kKqFlatPairs))};
    w.m0 = uint64_t(it % nx) * kWsOutRows;
    w.nv = p.skip_tiles ? (w.eg.cnt + 7) / 8 : int(kKqFlatPairs) / 8;
    w.used = p.skip_tiles && p.stage_used ? 16 * ((w.eg.cnt + 15) / 16) : kKqFlatPairs;
    return w;
}

__global__ void __launch_bounds__(kWsThreads, 1) gemm_experts_ws_kernel(KqGemm p, int nx) {
    pdl_begin();
    using L = WsSmem;
    constexpr int PAIRS = L::pairs, NT = PAIRS / 8, NS = kWsStages;
    extern __shared__ __align__(128) uint8_t sm[];
    const int items = nx * *p.count;
    if (int(blockIdx.x) >= items) return;
    const int my_items = (items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
    const uint32_t t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int nsb = int(p.K / 256), ntiles = int(p.K / kXfK);
    auto item = [&](int k) { return ws_item(p, int(blockIdx.x) + k * int(gridDim.x), nx); };
    // a row of the item, clamped for the loads
    auto w_row = [&](const WsItem& w, uint32_t r) { return w.eg.wbase + min(w.m0 + r, p.N - 1); };
    // the block's tiles in one sequence g (item g / ntiles, its tile g % ntiles) through the stages
    auto stage = [&](int g) { return sm + L::stages + (g % NS) * L::st_bytes; };
    uint64_t* full = reinterpret_cast<uint64_t*>(sm + L::bars);
    uint64_t* empty = full + NS;
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
        // c % 4) and rows t + 128 j (j = 0, 1 gate's, 2, 3 up's rows t, t + 128 of the block), as
        // 32-bit offsets (xf_fits)
        uint32_t act_off[2], dx_off[2], sb_r[2], used_i = 0, used_x = 0;
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
                    sb_r[j] = uint32_t(w_row(w, t + 128 * j)) * uint32_t(nsb);   // the row's first super-block
                }
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
            // groups 2 (i % 4), + 1 of the super-block's 8 (8 bytes each): the row's bytes 16 i ..
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t r = t + 128 * j, sbr = sb_r[j & 1];
                cp_async16(st + L::st_codes + r * 16, p.wq[j >> 1] + (sbr * 64 + uint32_t(i) * 16));
                if ((i & 3) == 0)   // (d: one a super-block, read at its first tile)
                    cp_async4(st + L::st_dw + r * 4, p.wd[j >> 1] + ((sbr + uint32_t(sb)) & ~1u));
            }
        };
        // tile g's chunks of this thread as halves q · dx into the stage's B (as the WG form's
        // expand_b), made visible to the consumers' wgmma (the async proxy)
        auto expand_b = [&](int g) {
            if (g % ntiles == 0) used_x = item(g / ntiles).used;
            uint8_t* st = stage(g);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const uint32_t c = t + 128 * j;
                if ((c >> 2) >= used_x) continue;
                const uint4 v = *reinterpret_cast<const uint4*>(st + L::st_act + c * 16);
                const float dx = *reinterpret_cast<const float*>(st + L::st_dx + c * 4);
                const uint32_t dx2 = h2_of(dx, dx), k1152 = 0x64806480u;
                const uint32_t vw[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
#pragma unroll
                for (uint32_t k = 0; k < 4; ++k) {
                    *reinterpret_cast<uint32_t*>(st + L::st_b + xf_wg_offset<PAIRS>(c >> 2, c & 3, 4 * k)) =
                        h2_mul(h2_sub(h2_magic(vw[k], 0x4140), k1152), dx2);
                    *reinterpret_cast<uint32_t*>(st + L::st_b + xf_wg_offset<PAIRS>(c >> 2, c & 3, 4 * k + 2)) =
                        h2_mul(h2_sub(h2_magic(vw[k], 0x4342), k1152), dx2);
                }
            }
            fence_proxy_async();
        };
        for (int g = 0; g < kWsAhead; ++g) {
            if (g < G) issue(g);   // (kWsAhead <= kWsStages: stages never used yet)
            cp_async_commit();
        }
        for (int g = 0; g < G; ++g) {
            const int j = g + kWsAhead;
            if (j < G) {
                if (j >= NS) mbar_wait(empty + j % NS, uint32_t(j / NS - 1) & 1);   // tile j - NS consumed
                issue(j);
            }
            cp_async_commit();
            cp_async_wait<kWsAhead>();   // this thread's copies of tile g landed
            expand_b(g);
            mbar_arrive(full + g % NS);
        }
        cp_async_wait<0>();
        return;
    }

    // ---- the consumers: warpgroup w / 4 - 1's warp cw (0-15): output rows 16 cw + gid and + 8,
    // m-tile 0 gate's (stage rows the same), m-tile 1 up's (stage rows 256 on)
    wgss::reg_alloc<kWsConsumerRegs>();
    const uint32_t cw = warp - 4, gid = lane >> 2, tig = lane & 3;
    auto stage_row = [&](int mt, int h) -> uint32_t { return kWsOutRows * mt + 16 * cw + gid + 8 * h; };
    const uint32_t copy8 = (lane % kXfGridCopies) * 8;
#pragma unroll 1
    for (int k = 0; k < my_items; ++k) {
        const int g0 = k * ntiles;
        uint32_t dpar = 0;   // bit 2 mt + h: the parity of the row's first d (xf_iq2_row)
        int nv = 0;
        {
            const WsItem w = item(k);
            for (int mt = 0; mt < 2; ++mt)
                for (int h = 0; h < 2; ++h)
                    dpar |= uint32_t((w_row(w, stage_row(mt, h) % kWsOutRows) * nsb) & 1) << (2 * mt + h);
            nv = w.nv;
        }
        auto run = [&](auto ntv) {
            constexpr int NV = decltype(ntv)::value, N = 8 * NV;
            float acc[2][NT][4];
            each(acc, [](float& x) { x = 0.0f; });
            uint32_t d2[2][2] = {};
#pragma unroll 1
            for (int i = 0; i < ntiles; ++i) {
                const int g = g0 + i;
                mbar_wait(full + g % NS, uint32_t(g / NS) & 1);
                const uint8_t* st = stage(g);
                uint32_t a2[2][2], b2[2][2], s2[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t r = stage_row(mt, h);
                        xf_iq2_row(st + L::st_codes + r * 16, st + L::st_dw + r * 4, i, (dpar >> (2 * mt + h)) & 1,
                                   tig, d2[mt][h], a2[mt][h], b2[mt][h], s2[mt][h]);
                    }
                // grid row ks / 2's two selector words: k-steps ks, ks + 1, each m-tile's wgmma
                // its own commit group (two in the WG form's KG 2 ask more registers than the 112
                // here: ptxas then serialises the wgmma); the same wgmma in each accumulator's
                // order as the WG form
#pragma unroll
                for (int ks = 0; ks < kXfK / 16; ks += 2) {
                    uint2 q[2][2];
#pragma unroll
                    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            q[mt][h] = xf_iq2_selectors(sm + L::hgrid, sm + L::hsign, a2[mt][h], b2[mt][h], ks, copy8);
#pragma unroll
                    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                        for (int mt = 0; mt < 2; ++mt) {
                            uint32_t a[4];
#pragma unroll
                            for (int h = 0; h < 2; ++h)
                                xf_iq2_frag(kk ? q[mt][h].y : q[mt][h].x, s2[mt][h], a[h], a[2 + h]);
                            wg_fence();
                            wg_mma<N>(reinterpret_cast<float(&)[NT * 4]>(acc[mt]), a,
                                      wg_desc<PAIRS>(st + L::st_b + (ks + kk) * (PAIRS * 32)));
                            wg_commit();
                            wg_wait<1>();
                        }
                }
                wg_wait<0>();   // the tile's wgmma done: its B and codes free
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + g % NS);
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
                    const uint64_t n = w.m0 + 16 * cw + gid + 8 * (e >> 1);
                    if (n < p.N)
                        p.y[pc * p.y_stride + n] = swiglu_pair<true>(acc[0][nt][e] * (1.0f / kXfWScale),
                                                                     acc[1][nt][e] * (1.0f / kXfWScale), p.clamp, p.ew,
                                                                     uint32_t(pc));
                }
        };
        // (in steps of 16 pairs, the wgmma shapes' step here)
        with_tiles<1, NT / 2>((nv + 1) / 2, [&](auto n2) { run(std::integral_constant<int, 2 * decltype(n2)::value>{}); });
    }
}
}  // namespace

bool launch_experts_ws(const KqGemm& p, uint64_t N, uint32_t cap, cudaStream_t s) {
    static bool ready = false;
    constexpr int bytes = WsSmem::bytes;
    if (!smem_ready(reinterpret_cast<const void*>(gemm_experts_ws_kernel), bytes, ready, s)) return false;
    // (the round's group count is the device's: the grid covers cap groups, blocks past them return)
    const int nx = int((N + kWsOutRows - 1) / kWsOutRows);
    const int blocks = p.ws_persist ? std::min(nx * int(cap), sm_count()) : nx * int(cap);
    gemm_experts_ws_kernel<<<uint32_t(blocks), kWsThreads, bytes, s>>>(p, nx);
    return true;
}

}  // namespace dsv4::cuda::xf
