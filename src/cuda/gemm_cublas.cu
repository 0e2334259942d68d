// Q8_0 and F16 products of prompt rounds through cuBLAS in FP16 (--fast-prefill's rounds, or
// DSV4_Q8_CUBLAS=1 / DSV4_F16_CUBLAS=1: other bits).
// gemm.cu's flat kernel keeps the CPU's arithmetic: an int8 MMA a 32-value block, then the
// block's float step (its two scales' product times the integer sum, added in k order), which
// bounds it by issue, not by the tensor cores (~240 int8 TOPS on the flash shapes, run 145).
// Here both operands are dequantised to FP16, each scaled by a power of two into FP16's normal
// range (q·d rounded to 11 bits: a relative error up to 2^-12 a value where the CPU's values are
// exact), and one cuBLAS FP16 GEMM with FP32 accumulation takes the whole product in its own
// order (520–720 TFLOPS, run 145), alpha undoing the two factors: results within ~5e-5 of the sum
// of the products' magnitudes, but not the CPU's bits, and not the same bits for every chunking
// of a prompt (cuBLAS picks its kernel by the rows' count). F16 weights (the router's, the compressors'
// and the indexer's projections) go in as they are, against their float activation scaled and
// rounded to FP16 likewise, where gemm.cu's flat float kernel takes 2xTF32 products
// (FP32-accurate).
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace dsv4::cuda {
namespace {

// FP16 holds magnitudes from 2^-14 (below: subnormals, fewer bits) to 65,504, so each operand
// is scaled by a power of two first: its largest value, 127 times its largest block scale, to
// [2^13, 2^14) (the sums run in FP32: no overflow there), and the GEMM's alpha divides both
// factors out again, exactly. The scales' largest magnitudes meet by atomicMax on their bits
// (non-negative floats order as their bits do) in `top` (zeroed before).
__device__ __forceinline__ float half_bits_to_float(uint16_t b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ float scale_value(uint16_t b) { return half_bits_to_float(b); }
__device__ __forceinline__ float scale_value(float v) { return v; }

// A thread's largest magnitude m (NaNs skipped: fmaxf keeps the other operand) into *top: the
// warp's largest, then the block's, then one atomicMax a block. (One a warp put ~260K atomics on
// one address for a 2,048-row activation: ~220 µs, run 148.) Every thread of the block calls it.
__device__ __forceinline__ void store_top(float m, unsigned* top) {
    __shared__ float warp_top[32];
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_top[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    m = threadIdx.x < (blockDim.x + 31) / 32 ? warp_top[threadIdx.x] : 0.0f;
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0 && m > 0.0f) atomicMax(top, __float_as_uint(m));
}

template <typename Scale>
__global__ void scale_top_kernel(const Scale* __restrict__ d, uint64_t n, unsigned* __restrict__ top) {
    float m = 0.0f;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
        m = fmaxf(m, fabsf(scale_value(d[i])));
    store_top(m, top);
}

// Each thread 8 values of a row of 32-value blocks, two such pieces a stride apart at once (their
// loads first: twice the bytes in flight; run 170: one piece at a time took 19.8 us for 24 MB;
// run 171: 16 consecutive values a thread, whose stores leave every other 16 bytes of a warp's
// span, 21.9): out = half(q · d · factor(*top)) (factor 1 without top). With alpha: thread 0 also
// writes 1 / (factor(*wtop) · factor(*top)), the GEMM's alpha (top: the activation's, wtop: the
// weight's).
template <typename Scale>
__global__ void dequant_blocks_f16_kernel(const int8_t* __restrict__ q, const Scale* __restrict__ d, uint64_t n8,
                                          __half* __restrict__ out, const unsigned* __restrict__ top,
                                          float* __restrict__ alpha, const unsigned* __restrict__ wtop) {
    const float f = top ? f16_factor(*top) : 1.0f;
    if (alpha && blockIdx.x == 0 && threadIdx.x == 0) *alpha = 1.0f / (f16_factor(*wtop) * f);
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    for (uint64_t i0 = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i0 < n8; i0 += 2 * stride) {
        int2 v[2];
        float sc[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const uint64_t i = i0 + u * stride;
            if (i >= n8) break;
            v[u] = reinterpret_cast<const int2*>(q)[i];
            sc[u] = scale_value(d[i / 4]) * f;   // 4 pieces of 8 a block of 32 (f: a power of two, exact)
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const uint64_t i = i0 + u * stride;
            if (i >= n8) break;
            __half2 h[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int w = j < 2 ? v[u].x : v[u].y, sh = 16 * (j & 1);
                h[j] = __floats2half2_rn(float(int8_t(w >> sh)) * sc[u], float(int8_t(w >> (sh + 8))) * sc[u]);
            }
            reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<uint4*>(h);
        }
    }
}

uint32_t grid_for(uint64_t n) { return uint32_t(std::max<uint64_t>(1, std::min<uint64_t>((n + 255) / 256, 132 * 16))); }

template <typename Scale>
void launch_dequant(const int8_t* q, const Scale* d, uint64_t n, __half* out, const unsigned* top, cudaStream_t s,
                    float* alpha = nullptr, const unsigned* wtop = nullptr) {
    if (reinterpret_cast<uintptr_t>(q) % 8 || reinterpret_cast<uintptr_t>(out) % 16 || n % 32)
        throw std::runtime_error("dequantise Q8_0 to FP16: codes 8-byte and output 16-byte aligned, whole blocks");
    dequant_blocks_f16_kernel<<<grid_for(n / 16), 256, 0, s>>>(q, d, n / 8, out, top, alpha, wtop);
    check_launch("dequantise Q8_0 to FP16");
}

// Float activation rows (R rows of K values, `stride` apart) to FP16 [R][K]: the largest
// magnitude into top (atomicMax as above), then each value times f16_factor(top, 1), thread 0
// writing alpha = 1 / that factor (times the weight's, wtop: a Q8_0 weight's top scale; none: FP16
// weights, factor 1). Blocks walk rows
// (y) and spans of a row (x), a thread V consecutive values (V = 4: 16-byte loads, where K,
// the stride and the rows' start allow): no division an element.
template <int V>
struct FloatsV;
template <>
struct FloatsV<1> {
    float v[1];
    __device__ __forceinline__ void load(const float* p) { v[0] = *p; }
};
template <>
struct FloatsV<4> {
    float v[4];
    __device__ __forceinline__ void load(const float* p) {
        const float4 t = *reinterpret_cast<const float4*>(p);
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    }
};
template <int V>
__global__ void float_top_kernel(const float* __restrict__ x, uint64_t stride, uint64_t K, uint32_t R,
                                 unsigned* __restrict__ top) {
    float m = 0.0f;
    for (uint32_t r = blockIdx.y; r < R; r += gridDim.y)
        for (uint64_t k = (blockIdx.x * uint64_t(blockDim.x) + threadIdx.x) * V; k < K;
             k += uint64_t(gridDim.x) * blockDim.x * V) {
            FloatsV<V> t;
            t.load(x + r * stride + k);
#pragma unroll
            for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(t.v[j]));
        }
    store_top(m, top);
}
// The GEMM's alpha for a float activation taken to FP16 by its top (xtop) against a Q8_0
// weight's factor (wtop) or an F16 weight's (none: 1).
__device__ __forceinline__ float floats_alpha(const unsigned* xtop, const unsigned* wtop) {
    const float f = f16_factor(*xtop, 1.0f);
    return 1.0f / (wtop ? f16_factor(*wtop) * f : f);
}
template <int V>
__global__ void float_to_f16_kernel(const float* __restrict__ x, uint64_t stride, uint64_t K, uint32_t R,
                                    __half* __restrict__ out, const unsigned* __restrict__ top,
                                    float* __restrict__ alpha, const unsigned* __restrict__ wtop) {
    const float f = f16_factor(*top, 1.0f);
    if (alpha && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *alpha = floats_alpha(top, wtop);
    for (uint32_t r = blockIdx.y; r < R; r += gridDim.y)
        for (uint64_t k = (blockIdx.x * uint64_t(blockDim.x) + threadIdx.x) * V; k < K;
             k += uint64_t(gridDim.x) * blockDim.x * V) {
            FloatsV<V> t;
            t.load(x + r * stride + k);
            if constexpr (V == 4) {
                const __half2 h[2] = {__floats2half2_rn(t.v[0] * f, t.v[1] * f),
                                      __floats2half2_rn(t.v[2] * f, t.v[3] * f)};
                *reinterpret_cast<uint2*>(out + r * K + k) = *reinterpret_cast<const uint2*>(h);
            } else {
                out[r * K + k] = __float2half_rn(t.v[0] * f);
            }
        }
}
// The activation's two passes: the top over at most 16 × 512 blocks (one atomic each), the
// conversion over every row.
template <int V>
void launch_float_to_f16(const float* x, uint64_t stride, uint64_t K, uint32_t R, __half* out, unsigned* top,
                         float* alpha, cudaStream_t s, const unsigned* wtop = nullptr) {
    const uint32_t spans = uint32_t(std::min<uint64_t>((K + 256 * V - 1) / (256 * V), 16));
    // (rows 512 blocks apart: 64 left the pass latency-bound, 24.9 us for a 32 MB activation, run 170)
    float_top_kernel<V><<<dim3(spans, std::min<uint32_t>(R, 512)), 256, 0, s>>>(x, stride, K, R, top);
    float_to_f16_kernel<V><<<dim3(spans, std::min<uint32_t>(R, 65535)), 256, 0, s>>>(x, stride, K, R, out, top, alpha,
                                                                                 wtop);
    check_launch("cuBLAS path: the activation to FP16");
}
// The same with V = 4 where K, the stride and the rows' start allow 16-byte loads, else V = 1.
void floats_to_f16(const float* x, uint64_t xs, uint64_t K, uint32_t R, __half* out, unsigned* top, float* alpha,
                   cudaStream_t s, const unsigned* wtop = nullptr) {
    if (K % 4 == 0 && xs % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
        launch_float_to_f16<4>(x, xs, K, R, out, top, alpha, s, wtop);
    else
        launch_float_to_f16<1>(x, xs, K, R, out, top, alpha, s, wtop);
}

// alpha for an activation already in FP16 (DevAct::h, its top xtop): float_to_f16_kernel's.
__global__ void alpha_kernel(const unsigned* __restrict__ xtop, const unsigned* __restrict__ wtop,
                             float* __restrict__ alpha) {
    *alpha = floats_alpha(xtop, wtop);
}

// An FP16 output's alpha and top (gemm_q8_0_cublas_half): the activation's halves within xmax (its
// h_max, else 2^14: act_f16's, or dequantised codes, whose top is of their scales: xmul 127), the
// weight's below 2^14 (127 times its largest block scale, times its factor),
// so |Σ_K x·w| <= K · xmax · 2^14 = v <= 2^e (frexp's e; v 0: e 0): alpha = 2^(15 - e) keeps every
// output within 2^15, a finite FP16. The output is y · yf, yf = alpha times the operands' factors,
// and 2^13 / yf is the top whose f16_factor is yf (both powers of two; kept within f16_factor's
// 2^±60 unless the operands' factors are that far apart already).
__global__ void half_out_kernel(const unsigned* __restrict__ xtop, float xmul, const unsigned* __restrict__ xmax,
                                const unsigned* __restrict__ wtop, float K, float* __restrict__ alpha,
                                unsigned* __restrict__ ytop) {
    const float xm = xmax ? __uint_as_float(*xmax) : 16384.0f;
    int e = 0;
    frexpf(K * xm * 16384.0f, &e);
    const float a = ldexpf(1.0f, 15 - e);
    *alpha = a;
    *ytop = __float_as_uint(8192.0f / (a * f16_factor(*xtop, xmul) * f16_factor(*wtop)));
}

void check_cublas(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string("cuBLAS: ") + what + " failed: " + cublasGetStatusString(st));
}

// A handle and FP16 scratch for each stream: cuBLAS's default workspace belongs to its handle,
// and the scratch is reused call after call in the stream's order, so a stream's products never
// share either with another stream's running at the same time (the forward pass's branches).
// A Q8_0 weight's rows dequantised once and kept (gemm_cublas_weight_copies): the FP16 values and,
// on the device after them, the top of their scales' magnitudes (the factor they were taken by).
struct F16Copy {
    uint16_t* w = nullptr;
    const unsigned* top = nullptr;
    uint64_t bytes = 0;
};
struct StreamState {
    cublasHandle_t h = nullptr;
    uint16_t* w = nullptr;   // dequantised weight rows
    uint16_t* x = nullptr;   // dequantised activation rows
    uint64_t w_cap = 0, x_cap = 0;
    // device: the operands' top scale bits (weight, activation), alpha, beta (0)
    unsigned* top = nullptr;
    float* alpha = nullptr;
    float* beta = nullptr;
    // Kept weight copies by (first code byte, rows); where the device had no room, a null copy,
    // so the check is made once a weight.
    std::map<std::pair<const int8_t*, uint64_t>, F16Copy> copies;
};
std::mutex g_mu;
std::unordered_map<cudaStream_t, StreamState> g_streams;
std::unordered_set<cudaStream_t> g_keep;   // streams that keep weight copies (gemm_cublas_weight_copies)
std::atomic<uint64_t> g_calls[3] = {0, 0, 0};   // Q8_0, F16, Q8_0 with an FP16 output
std::atomic<uint64_t> g_copy_bytes{0};        // kept weight copies' bytes, all streams

// The stream's state, made on its first use; nullptr when the device refuses its constants or
// cuBLAS its handle (the caller falls back to the flat kernel).
StreamState* stream_state(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_mu);
    StreamState& st = g_streams[s];
    if (st.h) return &st;
    void* consts = nullptr;
    if (cudaMalloc(&consts, 16) != cudaSuccess || cudaMemset(consts, 0, 16) != cudaSuccess) {
        (void)cudaGetLastError();
        if (consts) cudaFree(consts);
        return nullptr;
    }
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) {
        if (h) cublasDestroy(h);
        cudaFree(consts);
        return nullptr;
    }
    st.h = h;
    st.top = static_cast<unsigned*>(consts);
    st.alpha = static_cast<float*>(consts) + 2;
    st.beta = static_cast<float*>(consts) + 3;
    return &st;
}

// Grows a scratch buffer to n halves; false when the device has no room (the caller falls back
// to the flat kernel).
bool grow(uint16_t*& buf, uint64_t& cap, uint64_t n) {
    if (n <= cap) return true;
    if (buf) cudaFree(buf);
    buf = nullptr;
    cap = 0;
    if (cudaMalloc(&buf, n * sizeof(uint16_t)) != cudaSuccess) {
        (void)cudaGetLastError();
        buf = nullptr;
        return false;
    }
    cap = n;
    return true;
}

// y = alpha · x · wᵀ on the stream's handle (gemm_f16_cublas's contract); y's type yt: floats, or
// halves (each sum times alpha rounded to FP16 once).
void run_gemm(StreamState& st, const uint16_t* w, const uint16_t* x, uint32_t R, uint64_t N, uint64_t K, uint64_t AK,
              uint64_t rpg, void* y, uint64_t y_stride, const float* alpha, uint64_t ldw,
              cudaDataType_t yt = CUDA_R_32F) {
    const cublasHandle_t h = st.h;
    const float one = 1.0f, zero = 0.0f;
    // alpha on the device (the operands' factors, known only there) or 1 from the host
    check_cublas(cublasSetPointerMode(h, alpha ? CUBLAS_POINTER_MODE_DEVICE : CUBLAS_POINTER_MODE_HOST),
                 "cublasSetPointerMode");
    const float* al = alpha ? alpha : &one;
    const float* be = alpha ? st.beta : &zero;
    // Row-major y[R][N] = x[R][K] · w[N][K]ᵀ is, column-major, yᵀ (N × R) = op_T(w) · x.
    if (rpg == 0)
        check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(R), int(K), al, w, CUDA_R_16F, int(ldw), x,
                                  CUDA_R_16F, int(AK), be, y, yt, int(y_stride), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     "FP16 GEMM");
    else   // group g: weight rows [g·rpg, (g+1)·rpg), activation columns [g·K, (g+1)·K)
        check_cublas(cublasGemmStridedBatchedEx(
                         h, CUBLAS_OP_T, CUBLAS_OP_N, int(rpg), int(R), int(K), al, w, CUDA_R_16F, int(ldw),
                         static_cast<long long>(rpg * ldw), x, CUDA_R_16F, int(AK), static_cast<long long>(K), be, y,
                         yt, int(y_stride), static_cast<long long>(rpg), int(N / rpg), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
                     "grouped FP16 GEMM");
}

// The checks both paths make: a group layout they take (rpg: whole groups from row0), cuBLAS's
// int-sized arguments, no capture on s; then s's state. nullptr: the path does not apply.
StreamState* path_state(uint32_t R, uint64_t N, uint64_t K, uint64_t AK, uint64_t row0, uint64_t rpg,
                        uint64_t y_stride, cudaStream_t s) {
    if (R == 0 || N == 0 || K == 0) return nullptr;
    if (rpg ? row0 % rpg || N % rpg || (row0 + N) / rpg * K > AK : AK != K) return nullptr;
    if (N > (1u << 30) || K > (1u << 30) || AK > (1u << 30) || y_stride > (1u << 30)) return nullptr;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) return nullptr;
    return stream_state(s);
}

// W's rows [row0, row0 + N) to FP16 in out: their scales' top into *top (zeroed before), then
// each value by the power of two it gives.
void dequant_weight(const DevWeight& W, uint64_t row0, uint64_t N, uint16_t* out, unsigned* top, cudaStream_t s) {
    const uint64_t K = W.K;
    scale_top_kernel<<<grid_for(N * K / 32), 256, 0, s>>>(W.d + row0 * K / 32, N * K / 32, top);
    check_launch("cuBLAS path: a weight's top scale");
    launch_dequant(W.qs + row0 * K, W.d + row0 * K / 32, N * K, reinterpret_cast<__half*>(out), top, s);
}

// R float rows (K values, xs apart) to FP16 in the stream's scratch: their top into st.top[1] (zeroed
// before), alpha from it and the weight's top (wtop; none: FP16 weights).
void floats_to_scratch(StreamState& st, const float* x, uint64_t xs, uint64_t K, uint32_t R, cudaStream_t s,
                       const unsigned* wtop = nullptr) {
    floats_to_f16(x, xs, K, R, reinterpret_cast<__half*>(st.x), st.top + 1, st.alpha, s, wtop);
}

// Device memory a kept copy must leave free (the KV caches' lazy commits, the workspaces of
// longer rounds, other sessions): 8 GiB or an eighth of the device, whichever is more.
uint64_t copy_reserve(uint64_t total) { return std::max<uint64_t>(8ull << 30, total / 8); }

// W's rows [row0, row0 + N) as a kept FP16 copy on s (made on first use, by s, in the same
// kernels and factor as the per-call path: the same bits), or nullptr: copies not kept on s
// (gemm_cublas_weight_copies), or no room for this one (remembered).
const F16Copy* kept_copy(StreamState& st, const DevWeight& W, uint64_t row0, uint64_t N, cudaStream_t s) {
    const uint64_t K = W.K;
    const auto key = std::make_pair(W.qs + row0 * K, N);
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_keep.count(s)) return nullptr;
    if (const auto it = st.copies.find(key); it != st.copies.end()) return it->second.w ? &it->second : nullptr;
    F16Copy& c = st.copies[key];
    const uint64_t bytes = N * K * sizeof(uint16_t), pad = 256;
    size_t free_b = 0, total_b = 0;
    void* p = nullptr;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || bytes + pad + copy_reserve(total_b) > free_b ||
        cudaMalloc(&p, bytes + pad) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    c.w = static_cast<uint16_t*>(p);
    unsigned* top = reinterpret_cast<unsigned*>(static_cast<uint8_t*>(p) + bytes);
    c.top = top;
    c.bytes = bytes + pad;
    check(cudaMemsetAsync(top, 0, sizeof(unsigned), s), "cuBLAS path: a kept copy's scale");
    dequant_weight(W, row0, N, c.w, top, s);
    g_copy_bytes += c.bytes;
    return &c;
}

// A Q8_0 product's FP16 operands on s: W's rows [row0, row0 + N), its kept copy or dequantised
// into st.w (their scales' top in st.top[0]), and the activation, a.h as it is or its codes
// dequantised into st.x (their scales' top in st.top[1]; that launch also writes the float
// output's alpha where `alpha` is given). False, nothing launched: no room for the scratch.
struct Q8Operands {
    const uint16_t* w;
    const unsigned* wtop;
    const uint16_t* x;
};
bool q8_0_operands(StreamState& st, const DevWeight& W, const DevAct& a, uint32_t R, uint64_t row0, uint64_t N,
                   float* alpha, cudaStream_t s, Q8Operands& op) {
    const F16Copy* kept = kept_copy(st, W, row0, N, s);
    if ((!kept && !grow(st.w, st.w_cap, N * W.K)) || (!a.h && !grow(st.x, st.x_cap, uint64_t(R) * a.K))) return false;
    check(cudaMemsetAsync(st.top, 0, 2 * sizeof(unsigned), s), "cuBLAS path: scales");
    if (!kept) dequant_weight(W, row0, N, st.w, st.top, s);
    op.w = kept ? kept->w : st.w;
    op.wtop = kept ? kept->top : st.top;
    op.x = a.h ? a.h : st.x;
    if (!a.h) {
        const uint64_t nx = uint64_t(R) * a.K / 32;
        scale_top_kernel<<<grid_for(nx), 256, 0, s>>>(a.d, nx, st.top + 1);
        check_launch("cuBLAS path: top scales");
        launch_dequant(a.q, a.d, uint64_t(R) * a.K, reinterpret_cast<__half*>(st.x), st.top + 1, s, alpha, op.wtop);
    }
    return true;
}

}  // namespace

void dequant_q8_0_weight_f16(const DevWeight& W, uint64_t row0, uint64_t N, uint16_t* out, cudaStream_t s) {
    if (W.type != T_Q8_0 || W.K % 32 != 0) throw_mismatch("dequant_q8_0_weight_f16", W.type, W.K, W.K);
    launch_dequant(W.qs + row0 * W.K, W.d + row0 * W.K / 32, N * W.K, reinterpret_cast<__half*>(out), nullptr, s);
}

void dequant_q8_0_act_f16(const DevAct& a, uint32_t R, uint16_t* out, cudaStream_t s) {
    if (a.kind != ActKind::Q8_0 || a.K % 32 != 0) throw_mismatch("dequant_q8_0_act_f16", T_Q8_0, a.K, a.K);
    launch_dequant(a.q, a.d, uint64_t(R) * a.K, reinterpret_cast<__half*>(out), nullptr, s);
}

void gemm_f16_cublas(const uint16_t* w, const uint16_t* x, uint32_t R, uint64_t N, uint64_t K, uint64_t AK,
                     uint64_t rpg, float* y, uint64_t y_stride, cudaStream_t s, const float* alpha, uint64_t ldw) {
    StreamState* st = stream_state(s);
    if (!st) throw std::runtime_error("cuBLAS: no handle for the stream (device memory or cuBLAS set-up)");
    run_gemm(*st, w, x, R, N, K, AK, rpg, y, y_stride, alpha, ldw ? ldw : K);
}

bool gemm_q8_0_cublas(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                      uint64_t row0, uint64_t rpg, cudaStream_t s) {
    const uint64_t K = W.K;
    // (the dequantisation's 8-byte loads of codes)
    if (W.type != T_Q8_0 || a.kind != ActKind::Q8_0 || K % 32 || a.K % 32) return false;
    if (reinterpret_cast<uintptr_t>(W.qs) % 8 || reinterpret_cast<uintptr_t>(a.q) % 8) return false;
    StreamState* sp = path_state(R, N, K, a.K, row0, rpg, y_stride, s);
    if (!sp) return false;
    StreamState& st = *sp;
    // (the codes' dequantisation writes alpha; an activation's FP16 form, a.h, from its floats as
    // gemm_q8_0_cublas_floats takes them, gets its alpha from its own top)
    Q8Operands op;
    if (!q8_0_operands(st, W, a, R, row0, N, st.alpha, s, op)) return false;
    if (a.h) {
        alpha_kernel<<<1, 1, 0, s>>>(a.h_top, op.wtop, st.alpha);
        check_launch("cuBLAS path: alpha");
    }
    const uint64_t xoff = rpg ? row0 / rpg * K : 0;
    run_gemm(st, op.w, op.x + xoff, R, N, K, a.K, rpg, y, y_stride, st.alpha, K);
    ++g_calls[0];
    return true;
}

bool gemm_q8_0_cublas_ready(const DevWeight& W, uint32_t R, uint64_t N, uint64_t AK, uint64_t rpg, uint64_t y_stride,
                            cudaStream_t s) {
    const uint64_t K = W.K;
    if (W.type != T_Q8_0 || K % 32 || AK % 32 || reinterpret_cast<uintptr_t>(W.qs) % 8) return false;
    StreamState* sp = path_state(R, N, K, AK, 0, rpg, y_stride, s);
    return sp && (kept_copy(*sp, W, 0, N, s) || grow(sp->w, sp->w_cap, N * K));
}

bool gemm_q8_0_cublas_half(const DevWeight& W, const DevAct& a, uint32_t R, uint64_t N, uint64_t rpg, uint16_t* yh,
                           unsigned* y_top, cudaStream_t s) {
    const uint64_t K = W.K;
    if (a.kind != ActKind::Q8_0 || (a.h ? !a.h_top : !a.q || reinterpret_cast<uintptr_t>(a.q) % 8) ||
        !gemm_q8_0_cublas_ready(W, R, N, a.K, rpg, N, s))
        return false;
    StreamState& st = *stream_state(s);
    Q8Operands op;
    if (!q8_0_operands(st, W, a, R, 0, N, nullptr, s, op)) return false;
    // (codes: their scales' top, st.top[1], by 127 as f16_factor takes a Q8_0 top)
    half_out_kernel<<<1, 1, 0, s>>>(a.h ? a.h_top : st.top + 1, a.h ? 1.0f : 127.0f, a.h ? a.h_max : nullptr,
                                    op.wtop, float(K), st.alpha, y_top);
    check_launch("cuBLAS path: an FP16 output's alpha");
    run_gemm(st, op.w, op.x, R, N, K, a.K, rpg, yh, N, st.alpha, K, CUDA_R_16F);
    ++g_calls[2];
    return true;
}

bool gemm_q8_0_cublas_floats(const DevWeight& W, const float* x, uint64_t xs, uint32_t R, float* y,
                             uint64_t y_stride, uint64_t N, cudaStream_t s) {
    const uint64_t K = W.K;
    if (W.type != T_Q8_0 || K % 32 || reinterpret_cast<uintptr_t>(W.qs) % 8 || xs < K) return false;
    StreamState* sp = path_state(R, N, K, K, 0, 0, y_stride, s);
    if (!sp) return false;
    StreamState& st = *sp;
    const F16Copy* kept = kept_copy(st, W, 0, N, s);
    if ((!kept && !grow(st.w, st.w_cap, N * K)) || !grow(st.x, st.x_cap, uint64_t(R) * K)) return false;
    check(cudaMemsetAsync(st.top, 0, 2 * sizeof(unsigned), s), "cuBLAS path: scales");
    if (!kept) dequant_weight(W, 0, N, st.w, st.top, s);
    floats_to_scratch(st, x, xs, K, R, s, kept ? kept->top : st.top);
    run_gemm(st, kept ? kept->w : st.w, st.x, R, N, K, K, 0, y, y_stride, st.alpha, K);
    ++g_calls[0];
    return true;
}

uint64_t gemm_cublas_calls(int kind) { return g_calls[kind].load(); }

bool gemm_float_cublas(const DevWeight& W, const DevAct& a, uint32_t R, float* y, uint64_t y_stride, uint64_t N,
                       uint64_t row0, uint64_t rpg, cudaStream_t s) {
    const uint64_t K = W.K, ldw = W.row_bytes / 2;
    if (W.type != T_F16 || a.kind != ActKind::F32 || W.row_bytes % 2 || ldw < K || ldw > (1u << 30)) return false;
    if (a.f_stride < a.K) return false;
    StreamState* sp = path_state(R, N, K, a.K, row0, rpg, y_stride, s);
    if (!sp) return false;
    StreamState& st = *sp;
    if (a.h) {   // the activation's FP16 form, made once for the round's products
        alpha_kernel<<<1, 1, 0, s>>>(a.h_top, nullptr, st.alpha);
        check_launch("cuBLAS path: alpha");
    } else {
        if (!grow(st.x, st.x_cap, uint64_t(R) * a.K)) return false;
        check(cudaMemsetAsync(st.top + 1, 0, sizeof(unsigned), s), "cuBLAS path: scales");
        floats_to_scratch(st, a.f, a.f_stride, a.K, R, s);
    }
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W.data + row0 * W.row_bytes);
    const uint64_t xoff = rpg ? row0 / rpg * K : 0;
    run_gemm(st, w, (a.h ? a.h : st.x) + xoff, R, N, K, a.K, rpg, y, y_stride, st.alpha, ldw);
    ++g_calls[1];
    return true;
}

void act_f16(const float* x, uint64_t xs, uint64_t K, uint32_t R, uint16_t* out, unsigned* top, cudaStream_t s) {
    if (!R || !K) return;
    check(cudaMemsetAsync(top, 0, sizeof(unsigned), s), "an activation to FP16: its top");
    floats_to_f16(x, xs, K, R, reinterpret_cast<__half*>(out), top, nullptr, s);
}

void gemm_cublas_weight_copies(cudaStream_t s, bool on) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (on) g_keep.insert(s);
    else g_keep.erase(s);
}

uint64_t gemm_cublas_copy_bytes() { return g_copy_bytes.load(); }

void release_cublas(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_keep.erase(s);
    const auto it = g_streams.find(s);
    if (it == g_streams.end()) return;
    StreamState& st = it->second;
    for (auto& kc : st.copies)
        if (kc.second.w) {
            cudaFree(kc.second.w);
            g_copy_bytes -= kc.second.bytes;
        }
    if (st.h) cublasDestroy(st.h);
    for (void* p : {static_cast<void*>(st.w), static_cast<void*>(st.x), static_cast<void*>(st.top)})
        if (p) cudaFree(p);
    g_streams.erase(it);
}

}  // namespace dsv4::cuda
