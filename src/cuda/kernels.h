// The CUDA backend's kernels, behind host-callable launchers (plain C++ types and a stream),
// so the backend (forward.cpp) and the tests (tests/cuda/) call them without nvcc.
// Each launcher computes what the CPU reference computes (src/cpu/forward.cpp,
// src/quant/dot.cpp), up to float summation order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// Throws dsv4::Error naming `what` and the CUDA error when e != cudaSuccess.
void check(cudaError_t e, const char* what);
// Checks the last launch (cudaGetLastError).
void check_launch(const char* what);
[[noreturn]] void throw_too_small(const char* what, uint64_t need, uint64_t have);
[[noreturn]] void throw_mismatch(const char* what, uint32_t type, uint64_t weight_k, uint64_t act_k);
// An A/B switch read from the environment: unset or empty gives on_by_default, "0..." off.
bool env_switch(const char* name, bool on_by_default);
// A numbered variant read from the environment: unset or empty gives default_value.
int env_int(const char* name, int default_value);
// Kernels that stream weights issue those loads before waiting for the kernels they depend
// on (pdl_launch / pdl_wait, common.cuh), so the loads overlap their tails in the decode
// graphs. DSV4_PDL_EARLY=0 (read once) makes them wait first.
bool pdl_early_weights();
// Blocks of `kernel` (threads and dynamic shared memory per block as given) the GPU holds at
// once: the grid of a persistent kernel. Asked once per shape; a kernel whose shared memory is
// above 48 KB must have its attribute raised before the first call.
uint32_t resident_blocks(const void* kernel, uint32_t threads, size_t smem);
// The GPU's multiprocessors (132 on the H200; 132 if the query fails).
int sm_count();

// ---- weights ---------------------------------------------------------------------------
// A weight matrix on the device: `rows` rows of K values (a 3-D expert tensor is flattened:
// expert e's rows start at e * rows_per_expert). Float and Q4_K/MXFP4 weights keep their GGUF
// block layout in `data`. Q8_0, Q2_K and IQ2_XXS blocks are split at upload (repack_rows) into
// `qs`, the blocks' code bytes with every block 16-byte aligned, and `d`, the blocks' f16
// scales, so a lane reads its codes with one 16-byte load instead of 2-byte ones (GGUF blocks
// of 34, 84 and 66 bytes are only 2-byte aligned).
struct DevWeight {
    uint32_t type = 0;          // quant::Type
    uint64_t K = 0, rows = 0, row_bytes = 0;
    const uint8_t* data = nullptr;
    const int8_t* qs = nullptr;
    const uint16_t* d = nullptr;
};

// How repack_rows splits a type's blocks: the code bytes [body_off, body_off + body_bytes)
// go to `qs`, the scale bytes [aux_off, aux_off + aux_bytes) to `d`. False: kept as is.
struct RepackShape {
    uint32_t block_values = 0, block_bytes = 0, body_off = 0, body_bytes = 0, aux_off = 0, aux_bytes = 0;
};
bool repack_shape(uint32_t type, RepackShape* shape);
// Splits n_rows rows of K values (GGUF blocks at src, host memory) into qs and d form.
void repack_rows(uint32_t type, const uint8_t* src, uint64_t n_rows, uint64_t K, uint8_t* qs, uint8_t* d);

// The IQ2_XXS grid (and its sign masks) live in device memory: call once per process before
// any IQ2_XXS kernel (the backend does it at construction). grid: 256 u64 entries.
void upload_iq2xxs_grid(const uint64_t* grid);

// ---- activations ----------------------------------------------------------------------
// The activation a weight type's dot product wants (quant::traits(t).vec_dot_type):
// floats for float weights, Q8_0 blocks (Q8_0, MXFP4), Q8_K blocks (K-quants, IQ2_XXS).
enum class ActKind : uint32_t { F32 = 0, Q8_0 = 1, Q8_K = 2 };
ActKind act_kind(uint32_t weight_type);

// Quantised activations of R rows of K values: q[r*K + i]; d[r*(K/bs) + b] (the scale the
// CPU's dot product uses: the f16-rounded Q8_0 scale, or Q8_K's f32 scale); bsum[r*(K/16)+j]
// (Q8_K only). For F32, f/f_stride point at the float rows themselves.
struct DevAct {
    ActKind kind = ActKind::F32;
    uint64_t K = 0;
    const float* f = nullptr;
    uint64_t f_stride = 0;
    const int8_t* q = nullptr;
    const float* d = nullptr;
    const int32_t* bsum = nullptr;
    // The same rows as FP16 ([R][K], each value times the power of two f16_factor makes of
    // *h_top: act_f16), made once where several cuBLAS products of a fast prompt round read one
    // activation (the sublayer's xn); those products then skip their own conversion. Null: none.
    const uint16_t* h = nullptr;
    const unsigned* h_top = nullptr;
    // Where given (a device float's bits): the FP16 values' largest magnitude, which may reach 2^16
    // (the attention's half output, AttnHalfOut::max), else below 2^14 (act_f16's): the bound an
    // FP16 output of a product from them takes (gemm_q8_0_cublas_half).
    const unsigned* h_max = nullptr;
};

// Scratch for quantised activations (device memory, owned by the caller).
struct ActBuf {
    int8_t* q = nullptr;
    float* d = nullptr;
    int32_t* bsum = nullptr;
    uint64_t cap_values = 0;   // q holds cap_values; d cap_values/32; bsum cap_values/16
};

// The activation of rows of K values whose codes (of a quantised kind) are, or are about to
// be, in buf: what quantize_act returns, for kernels that write the codes themselves.
inline DevAct codes_in(ActKind kind, uint64_t K, const ActBuf& buf) {
    DevAct a;
    a.kind = kind;
    a.K = K;
    a.q = buf.q;
    a.d = buf.d;
    a.bsum = buf.bsum;
    return a;
}

// Quantises R rows (x + r*x_stride, K values each) for weights of type wtype into buf
// (buf.cap_values >= R*K for the quantised kinds). Q8_0: d = amax/127 (f16-rounded for the
// dot), q = round_half_even(x * (1/d)); Q8_K: model-spec §2.2.
DevAct quantize_act(uint32_t wtype, const float* x, uint64_t x_stride, uint32_t R, uint64_t K, const ActBuf& buf,
                    cudaStream_t s);

// MoE pairs gathered by expert (moe_groups), so one read of an expert's weight rows serves
// up to per_group pairs (prefill: ~R*K/NE pairs per expert). Device buffers owned by the
// caller: grp [cap][3], pairs [P], count [1].
struct MoeGroups {
    int32_t* grp = nullptr;
    int32_t* pairs = nullptr;
    int32_t* count = nullptr;
    uint32_t cap = 0;          // >= moe_groups_cap(P, NE, per_group)
    uint32_t per_group = 8;    // pairs a group: 8 (matvec's slots), or gemm_kq_pairs() (32, or 64
                               // in a prompt round) where every product of the experts takes
                               // gemm_kq_experts
};
uint32_t moe_groups_cap(uint32_t P, uint32_t NE, uint32_t per_group);
void moe_groups(const int32_t* experts, uint32_t P, uint32_t NE, const MoeGroups& g, cudaStream_t s);

// y[r*y_stride + n] = W[row0 + n] · act[r / act_div] for n < N, r < R.
// With `expert` (device, one entry per r), row row0 + n of expert expert[r] is used
// (rows_per_expert apart). Act row r/act_div (gate/up of pairs r = row*K + k share one
// activation row: act_div = K). With `groups` (built by moe_groups from `expert`), the pairs
// of one expert are computed together; every pair's result is bit-identical either way.
void matvec(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N, uint64_t row0,
            cudaStream_t s, const int32_t* expert = nullptr, uint64_t rows_per_expert = 0, uint32_t act_div = 1,
            const MoeGroups* groups = nullptr);

struct DevRow;
// The router's (§5.13) inputs and outputs, for router() and for the kernels that run it
// inside themselves (router_row, tails.cuh): the scores, the selection's
// inputs, and where the picks and weights go.
struct RouterArgs {
    float* logits = nullptr;         // row r's NE scores at r * NE
    uint32_t NE = 0, K = 0;          // inside other kernels: NE <= 256 experts, K <= 32 picks
    const float* bias = nullptr;
    const int32_t* tid2eid = nullptr;
    const DevRow* rows = nullptr;    // rows[r]: row r's token, for tid2eid
    bool norm = false;
    float scale = 1.0f;
    int32_t* experts = nullptr;      // [R][K]
    float* weights = nullptr;        // [R][K]
    int32_t* bad = nullptr;
};
// A row step run by the last block of a one-row product (matvec_tail) on the product's whole
// output y, instead of a launch of its own after it: the same body as the step's kernel, so
// the same bits. count: a device word, zero before the first launch, left at 0 by each.
struct MvTail {
    enum Kind : int { None = 0, NormQ8_0 = 1, Router = 2 };
    Kind kind = None;
    uint32_t* count = nullptr;
    // NormQ8_0: rms_norm_q8_0 of y (in place) with weight norm_w, codes into q, d
    float eps = 0.0f;
    const float* norm_w = nullptr;
    int8_t* q = nullptr;
    float* d = nullptr;
    // Router: the router of y (its step sets router.logits and router.NE to y and N)
    RouterArgs router;
};
// Whether matvec_tail takes this product (one activation row, a block of 256 threads a row;
// F16 or Q8_0 weights; for NormQ8_0 N a multiple of 256 up to 2,048, for Router N <= 256),
// and whether the forward pass uses it: only with DSV4_MV_TAIL=1 (read once), since on the
// H200 it measured slower than the separate launches (run 48).
bool matvec_tail_fits(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, MvTail::Kind kind);
bool matvec_tail_on();
void matvec_tail(const DevWeight& W, const DevAct& a, float* y, uint64_t N, const MvTail& tail, cudaStream_t s);

// Threads matvec gives one output row in decode (a warp: 32; few long rows: a block of 256
// or 1,024). The tensor-core products follow the order of sums this implies.
uint32_t decode_row_threads(uint64_t K, uint64_t N, bool expert);

// Q8_0 products of R >= 16 rows on the tensor cores, bit for bit what matvec gives (see
// gemm.cu); matvec calls it itself where eligible. DSV4_CUDA_TC=0 turns it off. In a prompt
// round (gemm_prefill_order(true)) every Q8_0 product of any R instead adds its blocks in k
// order (gemm_q8_0_flat_kernel): not decode's bits, the same for any chunking of the prompt.
bool gemm_q8_0_eligible(const DevWeight& W, uint32_t R, uint64_t N, uint64_t rpg, bool expert);
void gemm_q8_0(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
               uint64_t row0, uint64_t rpg, cudaStream_t s);
// Products through cuBLAS (gemm_cublas.cu): Q8_0 weight rows [row0, row0 + N) or an
// activation's Q8_0 codes dequantised to FP16 ([N][K], [R][a.K], unscaled), and y[R][N] (row
// stride y_stride) = alpha · x · wᵀ by one FP16 GEMM with FP32 accumulation, w's rows ldw values
// apart (0: K), x's AK, alpha a device float (nullptr: 1); rpg > 0: groups of rpg weight rows,
// group g against x's columns [g·K, (g+1)·K).
void dequant_q8_0_weight_f16(const DevWeight& W, uint64_t row0, uint64_t N, uint16_t* out, cudaStream_t s);
void dequant_q8_0_act_f16(const DevAct& a, uint32_t R, uint16_t* out, cudaStream_t s);
void gemm_f16_cublas(const uint16_t* w, const uint16_t* x, uint32_t R, uint64_t N, uint64_t K, uint64_t AK,
                     uint64_t rpg, float* y, uint64_t y_stride, cudaStream_t s, const float* alpha = nullptr,
                     uint64_t ldw = 0);
// gemm_q8_0's / gemm_float's arguments through one such GEMM, the operands in the stream's own
// scratch (grown by cudaMalloc: never inside a capture), each scaled by a power of two into
// FP16's normal range: Q8_0 both dequantised; F16 weights as they are, the float activation
// rounded to FP16. False (nothing launched) where it does not apply: a capture, no device memory
// for the scratch, another weight type (gemm_float_cublas: F16 only), a group layout it does not
// take.
bool gemm_q8_0_cublas(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                      uint64_t row0, uint64_t rpg, cudaStream_t s);
bool gemm_float_cublas(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                       uint64_t row0, uint64_t rpg, cudaStream_t s);
// gemm_q8_0_cublas from float activation rows (R rows of W.K values, xs apart): the floats go to
// FP16 directly (a top pass and a conversion) instead of to Q8_0 codes made only to be
// dequantised again. Other bits than from the codes, closer to the exact product.
bool gemm_q8_0_cublas_floats(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y,
                             uint64_t y_stride, uint64_t N, cudaStream_t s);
// Whether gemm_q8_0_cublas will take W's rows [0, N) against R activation rows of AK values given
// as FP16 (DevAct::h) on s, having made what it needs there (the stream's handle, the weight's
// kept copy or scratch), so that the product then cannot fall back: nothing in between may
// capture s. gemm_q8_0_takes_cublas: the same where matvec's routing (matvec_grouped for rpg)
// sends the product to gemm_q8_0 and that to cuBLAS: the condition for an activation with no
// Q8_0 codes (gemm_q8_0 throws std::logic_error for one cuBLAS refused).
bool gemm_q8_0_cublas_ready(const DevWeight& W, uint32_t R, uint64_t N, uint64_t AK, uint64_t rpg, uint64_t y_stride,
                            cudaStream_t s);
// gemm_q8_0_cublas (row0 0, y_stride N) with its output as FP16, yh [R][N], for the next
// product's DevAct::h (or the attention's AttnQNorm::h), from an FP16 activation (a.h) or Q8_0
// codes (dequantised as gemm_q8_0_cublas does): alpha makes the trivial bound of the sums (K times
// the activation's largest magnitude, a.h_max or 2^14, times the weight's, below 2^14) at most
// 2^15, a finite FP16, and *y_top receives the top whose f16_factor is the output's factor
// (DevAct::h_top). False (nothing launched) where gemm_q8_0_cublas_ready is, or where codes find
// no room for their FP16 scratch. Other bits than the float output's: each output rounded to FP16
// once.
bool gemm_q8_0_cublas_half(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, uint64_t rpg, uint16_t* yh,
                           unsigned* y_top, cudaStream_t s);
bool gemm_q8_0_takes_cublas(const DevWeight& W, uint32_t R, uint64_t N, uint64_t AK, uint64_t rpg, uint64_t y_stride,
                            cudaStream_t s);
// R float rows (K values, xs apart) as FP16 into out ([R][K]) for DevAct::h: their largest
// magnitude into *top (this zeroes it first), each value times the power of two that takes it to
// [2^13, 2^14): the conversion gemm_float_cublas and gemm_q8_0_cublas_floats make per call, so
// their products from it have the same bits.
void act_f16(const float* x, uint64_t xs, uint64_t K, uint32_t R, uint16_t* out, unsigned* top, cudaStream_t s);
// Whether a prompt round of R rows takes its Q8_0 or F16 products through cuBLAS (the fast mode,
// R at least the cuBLAS rows): where an FP16 form of a shared activation pays.
bool cublas_round(uint32_t R);
// y = W · x for a Q8_0 weight and float rows where gemm_q8_0 would take cuBLAS (a prompt round of
// the fast mode with enough rows): by gemm_q8_0_cublas_floats. False (nothing launched) elsewhere:
// the caller quantises x and goes on as before. DSV4_Q8_CUBLAS_FLOATS=0: never (the codes' path).
bool gemm_q8_0_floats(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y, uint64_t y_stride,
                      uint64_t N, cudaStream_t s);
// Whether s keeps FP16 copies of the Q8_0 weights its products dequantise: the first product of a
// weight's rows makes the copy, later ones (the next chunks) reuse it, the same bits, without the
// weight's top-scale pass and dequantisation (~0.37 us a token of a fast chunk's 4 layers, run
// 170). A copy is made only where the device keeps 8 GiB or an eighth of its memory free after it
// (the rest of the weights then take the per-call path); release_cublas(s) frees them, so only
// for streams whose weights outlive that call (the backend's). DSV4_Q8_F16_COPIES=0: never.
void gemm_cublas_weight_copies(cudaStream_t s, bool on);
// The kept copies' device bytes (all streams).
uint64_t gemm_cublas_copy_bytes();
// Frees a stream's cuBLAS handle, scratch and kept copies (before the stream is destroyed).
void release_cublas(cudaStream_t s);
// Products each has launched in this process (kind 0: Q8_0, 1: F16, 2: Q8_0 with an FP16 output,
// gemm_q8_0_cublas_half; tests: the path was taken).
uint64_t gemm_cublas_calls(int kind);
// The fast prompt rounds (--fast-prefill: BackendOptions::fast_prefill, or DSV4_FAST_PREFILL=1
// for the benchmarks): the backend sets it each round, for this host thread's next launches.
// In such a round the Q8_0 and F16 products of DSV4_CUBLAS_ROWS (256) rows or more take
// gemm_q8_0_cublas / gemm_float_cublas instead of the flat kernels (Q8_0: ~2x faster products,
// run 149), the rows attention its plain FP16 form (attn_rows_f16), the mHC mix tile its float
// sums (hc_pre_mix): other bits, not chunking-invariant, and a decode row in such a round gets
// them too; the attention at heads of 512 in tiles of 32 keys (DSV4_ATTN_FAST_KT), the routed
// 2-bit experts (Q2_K down, IQ2_XXS gate+up) on the FP16 tensor cores (DSV4_EXPERTS_F16).
void fast_prefill_round(bool on);
bool fast_prefill_round();
// Whether a part of that mode runs now: a test's override (0 / 1; -1: unset), else its
// environment switch (0 / 1, read once by the caller; -1: unset), else the round's.
bool fast_part(int override_on, int env_on);
// Whether each part follows the round: an override's rows (tests; -1: unset), else
// DSV4_Q8_CUBLAS / DSV4_F16_CUBLAS (0: never, else in every prompt round; unset: the round's).
constexpr uint32_t kCublasRows = 256;
void gemm_q8_0_cublas_override(int min_rows);
void gemm_float_cublas_override(int min_rows);
// The order of the Q8_0 products launched next from this host thread: flat (a prompt round,
// DSV4_PREFILL_FLAT) or decode's. Call it outside stream capture (it raises the kernel's
// shared memory limit the first time).
void gemm_prefill_order(bool flat);
bool gemm_prefill_order();
// Whether the products launched next from this host thread belong to a decode round (every
// row a session's single token): the Q8_0 and float GEMMs then take over from matvec's row
// kernels only at more rows (gemm.cu: g_decode_q8_rows, g_decode_f_rows). Same bits either way.
void gemm_decode_round(bool on);
// Whether the backend's prompt rounds take that order: 1, 0, or -1 for DSV4_PREFILL_FLAT's
// choice (tests).
void prefill_flat_override(int on);
// The rows up to which a fast / an exact prompt round runs its routed experts pair by pair
// (forward.cpp: DSV4_FAST_PAIR_ROWS, DSV4_EXACT_PAIR_ROWS; -1: the environment's, tests).
void fast_pair_rows_override(int rows);
void exact_pair_rows_override(int rows);
// The products launched twice (forward.cpp: DSV4_DUP, a measurement of the critical path; the
// same results); names ','-separated, nullptr: the environment's again (tests). Graphs a backend
// captured before keep what they were captured with.
void dup_products_override(const char* names);

// Float-weight (F16, BF16, F32) products of R >= 16 float activation rows as a tiled SIMT
// GEMM, bit for bit what matvec's decode path gives each row (see gemm.cu): non-expert,
// decode's VEC shapes (K % 8 == 0, 16-byte aligned rows and activations) whose row threads
// get equal chunk counts (K % (8 * decode_row_threads) == 0); grouped (rpg) with rpg and
// row0 multiples of 64. DSV4_GEMM_F16=0 (read once) turns it off. In a prompt round
// (gemm_prefill_order(true)) F16/BF16 products of any R instead take the tensor cores in k
// order (gemm_float_flat_kernel, 2xTF32: FP32-accurate, not decode's bits; DSV4_FLAT_FLOAT=0
// keeps decode's order).
bool gemm_float_eligible(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, uint64_t row0, uint64_t rpg,
                         bool expert);
void gemm_float(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                uint64_t row0, uint64_t rpg, cudaStream_t s);

// The routed experts' IQ2_XXS / Q2_K products of a prefill (pairs gathered in groups) on the
// tensor cores, bit for bit what matvec / matvec_swiglu give; they call it where eligible.
// gemm_kq_pairs(): the pairs a group (MoeGroups::per_group) the products take now: 32 (decode's
// order), or 64 in a prompt round (gemm_prefill_order(true), DSV4_KQ_FLAT on by default): the
// super-blocks then added in k order, bit for bit the CPU's vec_dot for every (pair, row) (the
// fused gate+up: swiglu of the two), not decode's bits. Eligible: groups of exactly gemm_kq_pairs() (a
// product never mixes the orders).
uint32_t gemm_kq_pairs();
// Whether 2-bit expert products launched now add in k order: a prompt round with DSV4_KQ_FLAT on
// (gemm_kq_pairs() is then 64).
bool kq_flat_round();
// kq_flat_pairs(true): the ungrouped 2-bit expert pairs that matvec / matvec_swiglu launch next
// from this host thread add in k order too, by the FLAT forms of the streamed IQ2_XXS and the
// pipelined Q2_K kernels: bit for bit the grouped FLAT GEMMs' (the CPU's vec_dot), a pair at a
// time. Only where kq_pair_flat_ok says those kernels take the weight (IQ2_XXS, alone or gate
// with `up`, of 2,048 or 4,096 values on sm_90 and later; a Q2_K weight of at most 2,048 values;
// the default kernel choices); any other launch throws. kq_flat_pair_launches counts the launches
// (tests: the path was taken).
void kq_flat_pairs(bool on);
bool kq_pair_flat_ok(const DevWeight& W, const DevWeight* up = nullptr);
uint64_t kq_flat_pair_launches();
bool gemm_kq_eligible(const DevWeight& W, const MoeGroups* groups);
void gemm_kq_experts(const DevWeight& Wg, const DevWeight* Wu, const DevAct& a, uint32_t P, float* y,
                     uint64_t y_stride, uint64_t N, uint64_t rows_per_expert, uint32_t act_div, const MoeGroups& g,
                     float clamp, const float* ew, cudaStream_t s);
// The IQ2_XXS expert products stage their operands in shared memory (gemm.cu) unless
// DSV4_GEMM_SMEM=0 (read once; =2: with one copy of the IQ2_XXS tables instead of the
// replicated ones and the Q2_K mins by scalar sums instead of MMAs); tests force a path: 1,
// 2, 0, or -1 for the variable's.
void gemm_smem_override(int on);
// How the staged Q2_K expert kernel of prompt rounds (k order) forms the mins' sums: 2 one
// m16n8k16 pair a super-block against the bsums split into bytes (the default), 1 two MMAs
// per 32 values against the activation; -1 DSV4_Q2K_MINS's choice (the same bits either way).
void gemm_q2k_mins(int m);
// The Q8_0 products of decode's warp-per-row order: 2 the pipelined tensor-core kernel with
// 2 stages and two blocks an SM (the default), 1 the same with 3 stages and one block an SM,
// 0 the register-fed one; -1 DSV4_GEMM_Q8_V's choice (tests, benchmarks).
void gemm_q8_0_version(int v);
// Prompt rounds' Q8_0 tile (gemm_q8_0_flat_kernel): 128 or 64 activation rows (the same bits
// either way); -1 DSV4_FLAT_BN's choice (tests, benchmarks).
void gemm_q8_0_flat_bn(int bn);
// The 64-row tile's kernel: 1 the lean form (gemm_q8_0_flat_lean_kernel, fewer instructions
// a stage), 0 the plain one (the same bits); -1 DSV4_FLAT_LEAN's choice (tests, benchmarks).
void gemm_q8_0_flat_lean(int on);
// Prompt rounds' F16/BF16 products of up to 1,024 rows with their stages split over a cluster
// (1) or not (0); -1 DSV4_FLAT_SPLIT's choice (off by default). Tests.
void gemm_flat_split_override(int on);
// Prompt rounds' F16/BF16 products (unsplit) in blocks of 32 (1) or 128 (4) activation rows;
// -1: 128 unless DSV4_FLAT_FLOAT_NT=1 (32 where the product then fits one wave). The same bits.
void gemm_float_flat_ntw_override(int ntw);
// Prompt rounds' IQ2_XXS expert GEMM expanding from the grid as 2-bit codes (1) or from the grid's
// bytes (0); -1: DSV4_IQ2_NIB (on by default). The same bits. Tests.
void gemm_iq2_nib_override(int on);
// The fast mode's routed experts, Q2_K down and IQ2_XXS gate+up (gemm_experts_f16_kernel: each
// weight and activation code expanded into FP16, FP32 sums on the FP16 tensor cores; other bits,
// within each operand's FP16 rounding): 1 / 0 in every prompt round, -1 DSV4_EXPERTS_F16's choice
// (1: every prompt round, 0: never, -1 (default): the round's, fast_prefill_round). Tests.
void gemm_experts_f16_override(int on);
// That kernel's expansion from a row's four values by PRMT (1) or by HSUB2 and HFMA2 (0); -1:
// DSV4_XF_TABLE's (off by default). Other bits than 0's, within the same bounds. Tests.
void gemm_experts_f16_table_override(int on);
// Whether that kernel also takes the IQ2_XXS gate+up (1) or leaves it to the exact kernels (0);
// -1: DSV4_XF_IQ2's (on by default). Tests.
void gemm_experts_f16_iq2_override(int on);
// Whether that kernel takes its warpgroup-MMA form (1), that form over two groups of an expert a
// block (2), warp-specialised (3: sm90a/experts_ws.cu), or mma.sync (0); -1: DSV4_XF_WGMMA's
// (unset: 2 for a round of at least 96 pairs an expert on average, else 3). Only where
// gemm_experts_wgmma_available(): a device of compute capability 9.0 (the form's machine code is
// sm_90a's alone). Other bits than mma.sync's, within the same bounds. Tests.
void gemm_experts_f16_wgmma_override(int on);
// Whether that kernel stages and expands only the pairs its MMAs read (1) or every pair slot, the
// group's last pair copied into the empty ones (0); -1: DSV4_XF_STAGE_USED's (on by default). The
// same bits. Tests.
void gemm_experts_f16_stage_used_override(int on);
// Whether that kernel's Q2_K form stages the code bytes a pair of tiles shares once (1) or for
// each tile (0); -1: DSV4_XF_PAIRED_CODES's (on by default). The same bits. Tests.
void gemm_experts_f16_paired_codes_override(int on);
// That kernel's WG form's commit groups: 2 k-steps of an m-tile (2) or one (1); -1:
// DSV4_XF_KGROUP's (2 by default). The same bits. Tests.
void gemm_experts_f16_kgroup_override(int kg);
// That kernel's WG form's Q2_K down staged in whole sectors (1) or not (0); -1:
// DSV4_XF_SECTORS's (on by default). The same bits. Tests.
void gemm_experts_f16_sectors_override(int on);
// That kernel's WS form (3) as one block an SM over the round's items (1) or one item a block
// (0); -1: DSV4_XF_WS_PERSIST's (on by default). The same bits. Tests.
void gemm_experts_f16_ws_persist_override(int on);
// The WS form's tiles whose copies fly while its producer expands one (3, 4 or 5); -1:
// DSV4_XF_WS_AHEAD's (3 by default). The same bits whatever it is. Tests.
void gemm_experts_f16_ws_ahead_override(int ahead);
bool gemm_experts_wgmma_available();
// Device addresses of the IQ2_XXS grid and sign masks (upload_iq2xxs_grid fills them), of the
// sign selectors (iq2.cuh; constants), and of the fast experts kernel's half selectors (iq2.cuh):
// the grid's parts (upload_iq2xxs_grid) and the signs' (constants).
void iq2_tables(const uint64_t** grid, const uint64_t** sign, const uint32_t** sel, const uint64_t** hgrid,
                const uint64_t** hsign);

// Grouped product (the attention output's low-rank A): output row n uses the activation's
// group n / rows_per_group, i.e. values [g*K, (g+1)*K) of each activation row (a.K = groups*K).
// Block-quantised activations of the whole row equal the per-group ones (groups are whole
// blocks), so one quantisation serves every group.
void matvec_grouped(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                    uint64_t rows_per_group, cudaStream_t s);

// Tests: the IQ2_XXS decode tables' place as DSV4_KQ_SMEM would choose it (0 global memory,
// 1 shared, 2 shared with 3 blocks per SM); -1 (initially) follows the environment.
void kq_smem_select(int mode);
// Tests: the streamed IQ2_XXS decode kernel as DSV4_KQ_STREAM would choose it (1 where it
// applies, 0 never); -1 (initially) follows the environment.
void kq_stream_select(int v);

// Tests: the decode variant DSV4_Q2K_V would choose for Q2_K with one slot (0 four rows per
// warp, 1 eight rows per warp, 2 four rows with 3 blocks per SM, 3 eight rows with 3, 4 / 5
// pipelined (the next rows' loads in flight during a group's arithmetic; K <= 2,048): two rows
// a warp with 3 blocks per SM / four rows with 2) and
// DSV4_Q8_ROWS_V for the one-row Q8_0 products (0 q8_rows_kernel, 1 loads issued first +
// evict-first, 2 the same with twice the rows per warp); -1 (initially) follows the
// environment.
void q2k_select(int v);
void q8_rows_select(int v);
// The read floor of a product: `bytes` at p read and nothing else (benchmarks; matvec.cu),
// mode 0 one wave of 8 KB a warp, 1 / 2 a resident grid with 4 / 8 loads a thread in flight.
void read_floor(const void* p, uint64_t bytes, int mode, uint32_t* sink, cudaStream_t s);

// Gate and up products of one SwiGLU in one pass (same type and shape, quantised types):
// mid[r*mid_stride + n] = silu(clamp(Wg[n]·act)) * clamp(Wu[n]·act) (* ew[r]), every
// operation as matvec + swiglu in that order, so the result is theirs bit for bit.
bool matvec_swiglu_ok(const DevWeight& Wg, const DevWeight& Wu);
void matvec_swiglu(const DevWeight& Wg, const DevWeight& Wu, const DevAct& a, uint32_t R, float* mid,
                   uint64_t mid_stride, uint64_t N, float clamp, const float* ew, cudaStream_t s,
                   const int32_t* expert = nullptr, uint64_t rows_per_expert = 0, uint32_t act_div = 1,
                   const MoeGroups* groups = nullptr);

// Dequantises `n` consecutive rows starting at row r0 of W into dst (row-major floats).
void dequantize_rows(const DevWeight& W, uint64_t r0, uint64_t n, float* dst, cudaStream_t s);

// ---- the batch ------------------------------------------------------------------------
struct DevRow {
    int64_t pos;
    int32_t token;
    int32_t sess;     // index into the session tables of this step
};

// One session's KV for one layer (device pointers from kv::SessionKV).
struct DevLayerKV {
    float* raw = nullptr;      // ring base: row of position p at (p % raw_cap) * head_dim
    float* comp = nullptr;     // compressed row c at comp + c * comp_stride
    float* index = nullptr;    // indexer row c at index + c * index_stride
    float* skv = nullptr;
    float* ssc = nullptr;
    float* iskv = nullptr;
    float* issc = nullptr;
    uint64_t comp_stride = 0, index_stride = 0;
    uint32_t raw_cap = 0, pad = 0;
    // The round's FP16 copy of this session's keys (the fast rows attention's third warpgroup
    // form; keys_to_halves makes it each layer): ring row j at kh + j * head_dim, compressed row
    // c at kh + (raw_cap + c) * head_dim; raw positions kh_lo .. kh_hi and the compressed rows
    // of positions up to kh_hi are copied. Null where the round has none.
    uint16_t* kh = nullptr;
    int64_t kh_lo = 0, kh_hi = -1;
};
// The halves keys_to_halves needs for a session whose rows end at position last (its
// compressed rows counted at ratio 4, the most any layer has).
inline uint64_t key_halves_values(uint32_t raw_cap, int64_t last, uint32_t D) {
    return (uint64_t(raw_cap) + uint64_t(last + 1) / 4) * D;
}

// ---- per-row primitives ---------------------------------------------------------------
// y = x / sqrt(mean(x^2) + eps) * w (w may be null); sum of squares in double.
void rms_norm(const float* x, uint64_t x_stride, float* y, uint64_t y_stride, uint32_t R, uint32_t n, float eps,
              const float* w, cudaStream_t s);

// X [R][H*E] = embedding row of each row's token, replicated into the H streams.
void embed(const DevWeight& emb, const DevRow* rows, uint32_t R, uint32_t E, uint32_t H, float* X, cudaStream_t s);

// mHC pre after the mix product (mix [R][2H+H*H]): pre/post gates, Sinkhorn, x_sub.
// With xn (only where hc_pre_norm_fusable): also the sublayer's RMSNorm, xn = rms_norm(x_sub)
// * norm_w bit for bit as rms_norm() would give, and x_sub is not written.
// In place x = rms_norm(x) * w (R rows of n values), and its Q8_0 codes in buf: the same bits
// as rms_norm then quantize_act for a Q8_0 weight, in one launch.
DevAct rms_norm_q8_0(float* x, uint64_t x_stride, uint32_t R, uint32_t n, float eps, const float* w,
                     const ActBuf& buf, cudaStream_t s);
bool hc_pre_norm_fusable(uint32_t H, uint32_t E, const float* X, const float* xn, const float* norm_w);
// with_sinkhorn = false: comb is not computed here; hc_sinkhorn makes it (from mix alone).
void hc_pre_finish(const float* mix, const float* scale, const float* base, const float* X, uint32_t R, uint32_t H,
                   uint32_t E, float eps, uint32_t iters, float* post, float* comb, float* x_sub, cudaStream_t s,
                   const float* norm_w = nullptr, float rms_eps = 0.0f, float* xn = nullptr,
                   bool with_sinkhorn = true);
// mHC pre in two launches spread over the GPU (decode is latency-bound on it): hc_pre_mix
// forms mix (the flat RMSNorm folded into the product: r·(fn·X)), post and, per row in gate
// [R][H+1], the pre gates and the sublayer norm's scale; hc_pre_collapse then forms
// xn = rms_norm(Σ_h pre[h]·X[h])·norm_w. Only where hc_pre_spread_ok (n_hc = 4; fn F32, F16
// or BF16). Scratch: part, hc_pre_partials(R, H, E) doubles; count, hc_pre_counters(R)
// words, zero before the first launch (each launch leaves them at 0). Not bit-identical to
// rms_norm + matvec + hc_pre_finish (other rounding of mix and of the norm's scale), but a
// row's result does not depend on R.
bool hc_pre_spread_ok(uint32_t H, uint32_t E, const DevWeight& fn, const float* X, const float* xn,
                      const float* norm_w);
uint64_t hc_pre_partials(uint32_t R, uint32_t H, uint32_t E);
uint32_t hc_pre_counters(uint32_t R);
// Rows per block of hc_pre_mix's product (1, 2 or 4; the same bits): tests force one, -1 for
// the default (1 for a single row, else DSV4_HC_ROWS, 4).
void hc_mix_rows_override(int rows);
// hc_pre_mix's tile kernel for rounds of 32 rows or more (prefill; the same bits): tests force it
// on (1) or off (0), -1 for the default (DSV4_HC_TILE, off by default; never with a rows override).
void hc_mix_tile_override(int on);
// That tile kernel's products and sums in floats (1: other bits, a fast prompt round's form) or
// doubles (0); -1: DSV4_HC_FAST (0 / 1), else the round's (fast_prefill_round).
void hc_mix_fast_override(int on);
// The query path's norms (rms_norm_q8_0, head_norm_rope) with the row in registers (1) or
// walking it in memory (0; the same bits): tests force one, -1 for the default (DSV4_NORM_REG).
void norm_reg_override(int on);
// The previous sublayer's hc_post folded into hc_pre_mix (one launch and one pass over X
// fewer between sublayers): with active set, the mix kernel first forms X' = hc_post(X) for
// its columns exactly as hc_post does (the same operations, so the same bits), writes X' over
// X, and mixes X'. post may be the buffer hc_pre_mix writes its new post gates to: every
// block reads the old ones before the last block writes.
struct HcPostIn {
    bool active = false;
    const float* y = nullptr;
    const float* post = nullptr;
    const float* comb = nullptr;
    const float* moe_down = nullptr;
    uint32_t K = 0;
    bool y_init = true;
};
void hc_pre_mix(const DevWeight& fn, const float* X, const float* scale, const float* base, uint32_t R, uint32_t H,
                uint32_t E, float hc_eps, float rms_eps, float* mix, float* post, float* gate, double* part,
                uint32_t* count, cudaStream_t s, const HcPostIn& post_in = {});
// Whether hc_pre_mix of R rows takes a pending post into its tile kernel (rounds of 32 rows or
// more; DSV4_HC_POST_TILE=0: never). Rounds of up to 16 rows fold it into hc_mix_kernel.
bool hc_mix_tile_folds_post(uint32_t R);
// HcQuant: where hc_pre_collapse also writes xn's activation codes (null: not wanted), the
// same bytes quantize_act would make: Q8_0 (q0, d0; E % 32 == 0) and Q8_K (qk, dk, bk;
// E % 256 == 0), laid out as ActBuf holds them.
// qa.h (optional): xn also as FP16 there, each value times the factor f16_factor makes of *qa.h_top
// (DevAct::h for a fast round's cuBLAS products, instead of act_f16's two passes), h_top holding a
// bound of |xn| (hc_xn_bound).
struct HcQuant {
    int8_t* q0 = nullptr;
    float* d0 = nullptr;
    int8_t* qk = nullptr;
    float* dk = nullptr;
    int32_t* bk = nullptr;
    uint16_t* h = nullptr;
    const unsigned* h_top = nullptr;
};
// A bound of the sublayer norm's output xn (RMSNorm times norm_w, E values a row) into *top (a
// float's bits): sqrt(E) times norm_w's largest magnitude (1 without a weight), since no value of
// a row exceeds sqrt(E) times its RMS. As a top, its f16_factor keeps every xn below 2^14 as FP16.
void hc_xn_bound(const float* norm_w, uint32_t E, unsigned* top, cudaStream_t s);
// Where a fast round's xn FP16 form comes from (DSV4_XN_F16, read once; tests: xn_f16_override,
// -1 the variable's): 1 (default) act_f16's passes over xn (a top, then the conversion); 2 the
// mHC collapse writes it beside xn (HcQuant::h, a bound's factor: other bits, the same precision
// within FP16's normal range; the passes gone); 0 none (each product converts its own).
int xn_f16_level();
void xn_f16_override(int level);
// Launches of hc_pre_collapse with an FP16 xn in this process (tests: the path was taken).
uint64_t xn_f16_collapse_calls();
void hc_pre_collapse(const float* X, const float* gate, const float* norm_w, uint32_t R, uint32_t H, uint32_t E,
                     float* xn, cudaStream_t s, const HcQuant& qa = {});
void hc_sinkhorn(const float* mix, const float* scale, const float* base, uint32_t R, uint32_t H, float eps,
                 uint32_t iters, float* comb, cudaStream_t s);
// X'[j] = post[j]·y + Σ_i comb[i][j]·X[i], in place. With moe_down ([R*K][E], the routed
// experts' outputs): y is replaced by (y_init ? y : 0) + Σ_k moe_down[r*K+k] first (MoE
// combine; y may then be null when !y_init).
void hc_post(float* X, const float* y, const float* post, const float* comb, uint32_t R, uint32_t H, uint32_t E,
             cudaStream_t s, const float* moe_down = nullptr, uint32_t K = 0, bool y_init = true);
// Output head collapse: x[r] = Σ_h (sigmoid(pre[r][h]*scale + base[h]) + eps) · X[rows[r]][h].
void output_collapse(const float* pre, const float* scale, const float* base, const float* X, const uint32_t* want,
                     uint32_t NW, uint32_t H, uint32_t E, float eps, float* x, cudaStream_t s);
// Greedy ids of n logits rows [n][V] on the device: ids[r] = argmax_excluding (sampler.h) of
// row r with exclude[r] (-1: none) excluded. part: n * kGreedyParts scratch keys.
constexpr uint32_t kGreedyParts = 64;
void greedy_ids(const float* logits, uint32_t n, uint32_t V, const int32_t* exclude, uint64_t* part, int32_t* ids,
                cudaStream_t s);
// Gathers rows want[i] of X (width n) into dst[i].
void gather_rows(const float* X, uint64_t n, const uint32_t* want, uint32_t NW, float* dst, cudaStream_t s);

// Per-head RMSNorm (no weight) and tail RoPE of q [R][n_head][D] at each row's position.
// inv_freq: device, n_rot/2 doubles. inverse: rotate by -pos (no norm then).
void head_norm_rope(float* q, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_rot, float eps, bool norm,
                    bool inverse, const double* inv_freq, const DevRow* rows, cudaStream_t s);

// KV path tail: RMSNorm(kv_norm) → RoPE → (official: FP8 sim of dims < n_nope, f16 round)
// → raw ring of the row's session at its position.
void kv_finalize(float* kvr, uint32_t R, uint32_t D, uint32_t n_rot, float eps, const float* norm_w,
                 const double* inv_freq, const DevRow* rows, bool official, uint32_t n_nope, const DevLayerKV* lkv,
                 uint32_t n_layer, uint32_t il, cudaStream_t s);

// Compressor state machine (§5.9) for every session of the batch: rows of session s are
// rows sess_begin[s] .. sess_end[s]-1, consecutive positions in order. kvp/scp: [R][coff*D].
// ape: [ratio][coff*D]. Rows that complete a group get their pooled (pre-norm) row in
// pooled[r]. Batches of more rows than sessions run parallel over groups unless
// DSV4_CMP_PAR=0 (read once): the same bits, pooled rows and state slots.
void compressor_state(const float* kvp, const float* scp, const float* ape, const DevRow* rows, uint32_t R,
                      const uint32_t* sess_begin, const uint32_t* sess_end, uint32_t S, uint32_t ratio, uint32_t D,
                      bool indexer, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, float* pooled,
                      cudaStream_t s);
// Tests force the path: 0 the sequential walk, 1 the parallel kernels (also for one row per
// session), -1 the variable's choice.
void compressor_state_override(int on);
// Finishes the emitted rows: RMSNorm(norm) → RoPE at c*ratio → FP8 sim (attention) or
// Hadamard+FP4 (indexer) when official → comp/index row c = pos/ratio.
void compressor_emit(const float* pooled, uint32_t R, const DevRow* rows, uint32_t ratio, uint32_t D, uint32_t n_rot,
                     uint32_t n_nope, float eps, const float* norm_w, const double* inv_freq, bool indexer,
                     bool official, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, cudaStream_t s);

// Indexer queries: RoPE of each head's tail, then (official) Hadamard + FP4; wi *= wscale.
// With qb (official only), the prepared queries go there as BF16 (exact: FP4 values; row r
// head h at (r NH + h) DI) for indexer_scores_tc, and qi is left as it was unless keep_qi
// (then the floats go to qi too: a decode round whose rows take both kernels). Heads of 128 take
// a warp a head (DSV4_IDX_PREP=0: a block a head; the same bits; tests force 1 / 0, or -1
// for the variable's).
void indexer_prep_warp_override(int on);
void indexer_q_prep(float* qi, float* wi, uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot,
                    const double* inv_freq, const DevRow* rows, bool official, float wscale, cudaStream_t s,
                    uint16_t* qb = nullptr, bool keep_qi = false);
// score[r][c] = Σ_h max(0, qi[r][h]·Kidx[c]) · wi[r][h] for c < n_vis(r) = (pos+1)/4, for rows
// with n_vis > top_k (others untouched) and, when tc_from > 0, n_vis < tc_from (the rows from
// tc_from on are indexer_scores_tc's). ld: floats per score row.
// indexer_scores takes the tiled kernel for 64 heads of 128 (DSV4_IDX_TILED=0: the general
// one for every shape; 2: the tiled kernel's 32-key blocks; the same bits): tests force 1 / 2 /
// 0, or -1 for the variable's.
void indexer_tiled_override(int form);
void indexer_scores(const float* qi, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, const DevRow* rows,
                    const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis,
                    float* score, uint64_t ld, cudaStream_t s, uint64_t tc_from = 0);
// The same scores on the BF16 tensor cores for prompt rounds with official numerics, whose
// FP4-simulated queries and index rows are BF16 values exactly (products exact; the sums in
// the tensor cores' order: not the FP32 kernels' bits, the same for a row in any batch or
// chunk), from indexer_q_prep's BF16 queries qb; rows with n_vis < tc_from untouched (they are
// indexer_scores'). indexer_tc_ok: the shapes it takes (up to 64 heads of 64 or 128) and
// DSV4_IDX_TC (default 1).
bool indexer_tc_ok(uint32_t NH, uint32_t DI);
// Tests: indexer_scores_tc's query rows a block (1 ... 32; DSV4_IDX_TC_ROWS, default 16), -1
// back to the default. The same bits.
void indexer_tc_rows_override(int rows);
void indexer_scores_tc(const uint16_t* qb, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, const DevRow* rows,
                       const DevLayerKV* lkv, uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis,
                       float* score, uint64_t ld, cudaStream_t s, uint64_t tc_from = 0);
// Decode rounds (official numerics): the rows that see this many compressed rows or more score
// on the tensor cores (indexer_scores_tc with tc_from), the others on the FP32 kernels; 0 none
// (DSV4_IDX_TC_DECODE, default 16,384, raised past the fused indexer's widths where the shapes
// allow it: a row's own length decides, never the batch). Tests: indexer_tc_decode_override (N,
// or -1 back to the variable's).
uint64_t indexer_tc_decode_from(uint32_t NH, uint32_t DI, uint32_t n_rot);
void indexer_tc_decode_override(int64_t n);
// sel[r][0..top_k) = the top_k scores' indices (ties: lower index), ascending, for rows
// with n_vis > top_k.
void topk_select(const float* score, uint64_t ld, uint32_t R, const DevRow* rows, uint32_t ratio, uint32_t top_k,
                 uint32_t* sel, cudaStream_t s);
// Plain top-k of n values (tests): same selection rule, ascending indices.
void topk_plain(const float* score, uint32_t n, uint32_t k, uint32_t* sel, cudaStream_t s);
// Tests: 1 stages the keys in shared memory where they fit (the default), 0 reads every
// radix pass from global memory (DSV4_TOPK_STAGE=0), -1 back to the default. The same bytes.
void topk_stage_override(int on);
// Tests: 1 writes the top-k's selection by warps (DSV4_TOPK_WARP=1), 0 by per-thread segments,
// -1 back to the default (0). The same bytes.
void topk_warp_override(int on);
// Tests: 1 selects rows of 4,096 keys or more through a sample (DSV4_TOPK_FILTER=1), 0 not,
// -1 back to the default (1). The same bytes.
void topk_filter_override(int on);
// Tests: 1 selects rows of score matrices up to 32,768 keys wide by 1,024 threads with the keys
// in registers (DSV4_TOPK_REG=1; topk_select and topk_plain), 0 not, -1 back to the default (1).
// The same bytes.
void topk_reg_override(int on);
// Tests: 1 lets topk_reg_kernel take rows of decode-sized rounds (up to 64 rows) of score
// matrices up to 262,144 keys wide by clusters of 2, 4 or 8 blocks (DSV4_TOPK_CLUSTER=1), 2
// rows of every round, 0 none, -1 back to the default (1). The same bytes.
void topk_cluster_override(int on);
// Tests: the fused indexer's tiles of 16 keys a block (DSV4_IDX_FUSED_TILES: N > 0, or 0 for
// about 128 blocks a row), -1 back to the default (1). The same bits.
void indexer_fused_tiles_override(int tiles);
// The three calls above (indexer_q_prep, indexer_scores, topk_select with ratio 4) in one
// launch, bit-identical: each score block prepares its row's queries itself and the row's
// last block selects. qi and wi are only read (not prepared in place). count: R counters,
// zero before the first call and left at zero. Supported shapes: indexer_fused_ok.
bool indexer_fused_ok(uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot, uint64_t max_vis);
// Whether a decode round whose rows see up to max_vis keys should take it (DSV4_IDX_FUSED_MAX,
// measured: short conversations), given that indexer_fused_ok.
bool indexer_fused_preferred(uint64_t max_vis);
void indexer_fused(const float* qi, const float* wi, uint32_t R, uint32_t NH, uint32_t DI, uint32_t n_rot,
                   const double* inv_freq, const DevRow* rows, bool official, float wscale, const DevLayerKV* lkv,
                   uint32_t n_layer, uint32_t il, uint32_t top_k, uint64_t max_vis, float* score, uint64_t ld,
                   uint32_t* count, uint32_t* sel, cudaStream_t s);

// Sink attention (§5.12) for every (row, head): keys = raw window + visible compressed
// rows (ratio 128, or ratio 4 with n_vis <= top_k) or the selected rows (sel); K = V.
// Output o [R][n_head][D], inverse-RoPE'd.
// o_q8: also o's Q8_0 codes there (quantize_act's bytes for a Q8_0 output projection).
// qn.on (only where attn_rows_qnorm says so, else an error): q is the query product's raw
// output, and the rows kernel applies head_norm_rope's per-head RMSNorm (eps qn.eps) and RoPE
// itself: head_norm_rope (norm, not inverse) then attention's bits.
// oh.h (only where attn_rows_half_output says so and without o_q8, else an error): the output as
// FP16 ([R][n_head · D]) times kAttnHalfScale there instead of floats in o (whose rows still
// carry the fast kernels' FP16 queries): the input of a cuBLAS product (DevAct::h, h_top holding
// kAttnHalfTop), without the Q8_0 codes it would only dequantise again. Those kernels read FP16
// keys and values, so |o| <= 65,504 before the RoPE tail's rotation, sqrt(2) times that after it:
// halved, every value is a finite FP16. Each half is the float output's times the scale rounded
// once (round to nearest even). oh.max (optional): the halves' largest magnitude there (float bits,
// up to their rounding; attention zeroes it first): DevAct::h_max, a bound of the next product.
// qn.h (only with qn.on where attn_rows_half_output, else an error): q given as FP16 there
// instead ([R][n_head · D], each value times the factor f16_factor makes of *qn.h_top: q_b's
// half output, gemm_q8_0_cublas_half); the fast query kernel takes each back to its float (the
// FP16 value exactly) before the norm.
struct AttnQNorm {
    bool on = false;
    float eps = 0.0f;
    const uint16_t* h = nullptr;
    const unsigned* h_top = nullptr;
};
struct AttnHalfOut {
    uint16_t* h = nullptr;
    unsigned* max = nullptr;
};
constexpr float kAttnHalfScale = 0.5f;
constexpr float kAttnHalfTop = 16384.0f;   // f16_factor's power of two for it: 2^(14 - 15)
void attention(const float* q, const float* sinks, uint32_t R, uint32_t n_head, uint32_t D, uint32_t n_swa,
               uint32_t ratio, uint32_t top_k, const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv,
               uint32_t n_layer, uint32_t il, uint32_t n_rot, const double* inv_freq, float* o, cudaStream_t s,
               const ActBuf* o_q8 = nullptr, AttnQNorm qn = {}, AttnHalfOut oh = {});
// Whether attention can write its output as FP16 (oh): a prompt round's rows path in the fast
// mode's plain FP16 form with 32-key tiles (attn_rows_fast_kernel, or the warpgroup form).
bool attn_rows_half_output(uint32_t n_head, uint32_t D, uint32_t n_rot);
// Whether the backend asks for it where its output projection (Q8_0) then takes cuBLAS
// (DSV4_ATTN_HALF_OUT, read once; opt-in until measured; tests: attn_half_output_override, -1
// the variable's): 1 the fast rows kernels' FP16 output goes straight into out_a's GEMM, instead
// of floats, Q8_0 codes and their dequantisation to FP16 (a pass over the round's codes); 2 also
// out_a's output as FP16 straight into out_b's (gemm_q8_0_cublas_half), instead of floats and
// their top and conversion passes; 3 also q_b's output as FP16 into the fast query kernel
// (AttnQNorm::h), half the bytes written and read again; 0 none.
int attn_half_output_on();
void attn_half_output_override(int level);
// Launches of attention with a half output in this process (tests: the path was taken).
uint64_t attn_half_output_calls();
// In a prompt round (gemm_prefill_order(true)) and for the shapes attn_rows_ok takes (up to 64
// heads of width 64, 128, 256 or 512), an item is a whole row instead: all its heads over all
// its keys on the tensor cores (3xTF32), no splits and no merge; FP32-accurate, not decode's
// bits, a row's the same in any batch. DSV4_ATTN_ROWS=0 (read once) keeps the splits; =1 takes
// the rows kernel with 8 warps, =2 (default) with 16 for heads of width 128 or more (each
// variant its own bits).
bool attn_rows_ok(uint32_t n_head, uint32_t D, uint32_t n_rot);
// Tests: the rows kernel's warps, 8 or 16 (16 applies to widths of 128 or more); -1 the
// environment's choice.
void attn_rows_warps_override(int warps);
// Whether attention() of this shape takes the rows kernel now (a prompt round, as above) with
// the query norm folded in (DSV4_ATTN_QNORM_ROWS, read once, default 1): the caller then skips
// head_norm_rope and passes the raw queries with AttnQNorm (one launch and a pass over q fewer).
bool attn_rows_qnorm(uint32_t n_head, uint32_t D, uint32_t n_rot);
// Tests: the fold on (1) or off (0); -1 the environment's choice.
void attn_rows_qnorm_override(int on);
// Tests: prompt rounds' rows kernel on the FP16 tensor cores (1, widths 256 and 512) or the TF32
// ones (0); -1 DSV4_ATTN_F16's choice (default 1).
void attn_rows_f16_override(int on);
// Tests: that kernel in its plain FP16 form (1: hi halves only, other bits) or FP32-accurate
// (0); -1: DSV4_ATTN_FAST's (0 / 1), else the round's (fast_prefill_round).
void attn_rows_fast_override(int on);
// Tests: that plain form's key tiles, 16 (attn_rows_f16_kernel) or 32 (attn_rows_fast_kernel: heads
// of 512, up to 64; the queries rounded to FP16 once by attn_fast_q_kernel into o's rows first);
// -1: DSV4_ATTN_FAST_KT's (default 32).
void attn_rows_fast_kt_override(int kt);
// Launches of that plain form in this process (tests: the path was taken); kt = 32: those in
// tiles of 32 keys.
uint64_t attn_rows_fast_calls(int kt = 0);
// Tests: that form in tiles of 32 keys by Hopper's warpgroup MMA (attn_rows_wg_kernel,
// sm90a/attention_wg.cu, where gemm_experts_wgmma_available(); heads of 512 up to 64: 1 its key
// tiles loaded through the producer's registers, 2 by cp.async, 3 by cp.async from the round's
// FP16 keys where attn_key_halves_round, 4 from those with the consumers in split roles) or by
// mma.sync (0); -1: DSV4_ATTN_FAST_WG's (default 3). Its own bits, the same in forms 1-3.
void attn_rows_fast_wg_override(int form);
// Launches of the warpgroup form in this process (tests: the path was taken).
uint64_t attn_rows_wg_calls();
// The warpgroup form the override or DSV4_ATTN_FAST_WG asks for (0 none; 3: its key tiles
// copied from the round's FP16 keys, DevLayerKV::kh, by cp.async: the default; 4: the same keys,
// the consumers in split roles: other bits), where the device has it.
int attn_rows_wg_form();
// Whether this round's DevLayerKV carry FP16 keys (kh) that keys_to_halves fills before each
// layer's attention (set by the backend a round at a time; tests for a scope): forms 3 and 4
// run only then, else the mma.sync kernel does.
void attn_key_halves_round(bool on);
bool attn_key_halves_round();
// Layer il's keys of S sessions as FP16 (round to nearest) into their kh: the raw ring rows of
// positions kh_lo .. kh_hi and, for ratio > 0, the compressed rows 0 .. (kh_hi + 1) / ratio - 1.
void keys_to_halves(const DevLayerKV* lkv, uint32_t S, uint32_t n_layer, uint32_t il, uint32_t D, uint32_t ratio,
                    cudaStream_t s);
// The warpgroup form's launch (sm90a/attention_wg.cu; forms 1 to 4, as above), after
// attn_fast_q_kernel has put the rows' FP16 queries into o (oh, oh_max: the output as FP16 and
// its largest magnitude, attention's AttnHalfOut; *oh_max zeroed before): false where the shape or
// the device does not allow it.
bool launch_rows_wg(int form, const float* sinks, uint32_t n_head, uint32_t n_swa, uint32_t ratio, uint32_t top_k,
                    const uint32_t* sel, const DevRow* rows, const DevLayerKV* lkv, uint32_t n_layer, uint32_t il,
                    uint32_t R, uint32_t n_rot, const double* inv_freq, float* o, int8_t* oq, float* od,
                    uint16_t* oh, unsigned* oh_max, cudaStream_t s);
// The key splits run on the FP32 CUDA-core kernel unless DSV4_ATTN_TC=1 (read once) puts them
// on the tensor cores (attention_tc.cu: 3xTF32, FP32-accurate) where the head width allows;
// tests force either: 1 / 0, or -1 for the variable's.
void attn_tc_override(int on);
// Groups per item of the split kernels for slices of 32 rows or more (DSV4_ATTN_LOOP, read
// once; the bits are the same in every mode): tests force 0 (an item per head group), 1 (an
// item per (row, split) over all its groups), 2 (the tensor-core kernel chooses the groups per
// item; the FP32 kernel takes it as 1), 3 (the FP32 kernel's attn_split_wide_kernel: an item
// per (row, split) for all heads, where every split is one tile; the tensor cores take it as
// 1), or -1 for the variable's.
void attn_loop_override(int mode);
// The attention path's work that reads no output of the step's kernels before the
// programmatic-launch wait (1) or after it (0): head_norm_rope's, the merge's and
// indexer_fused's RoPE angles; the split kernel's item list, key ranges and L2 prefetches of
// known key rows; indexer_fused's index-row prefetches; and the indexer's top-k passes
// stopping once the chosen bin is taken whole. The same bits. -1: DSV4_ATTN_EARLY (default 0).
void attn_early_override(int on);

// Router (§5.13): probs in place (sqrt(softplus)), selection (hash table or biased top-K,
// ties to the lower id), weights. experts/weights: [R][K].
void router(float* logits, uint32_t R, uint32_t NE, uint32_t K, const float* bias, const int32_t* tid2eid,
            const DevRow* rows, bool norm, float scale, int32_t* experts, float* weights, int32_t* bad,
            cudaStream_t s);
void router(const RouterArgs& a, uint32_t R, cudaStream_t s);
// mid[p][n] = silu(min(g, c)) * clamp(u, -c, c) * (w ? w[p] : 1), c <= 1e-6: no clamp.
void swiglu(const float* g, const float* u, float* mid, uint32_t P, uint32_t F, float clamp, const float* w,
            cudaStream_t s);

// ---- numerics (tests and the kernels above) -------------------------------------------
// In place on n values of each of R rows (row stride `stride`): FP8 sim of the first n,
// FP4 sim, Hadamard (n a power of two, <= 1024).
void fp8_sim_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s);
void fp4_sim_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s);
void hadamard_rows(float* x, uint32_t R, uint32_t n, uint64_t stride, cudaStream_t s);
// y[i] = e4m3_round(x[i]) / e2m1_round(x[i]) (tests).
void e4m3_round_n(const float* x, float* y, uint64_t n, cudaStream_t s);
void e2m1_round_n(const float* x, float* y, uint64_t n, cudaStream_t s);

}  // namespace dsv4::cuda
