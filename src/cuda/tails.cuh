// Row steps that run either as a kernel of their own (model.cu) or in the last block of the
// product that makes their input (matvec.cu: matvec_tail, one launch fewer on decode's
// critical path): the query path's RMSNorm with its Q8_0 codes after q_a, and the router
// after its scores' product. One body each, so both ways give the same bits.
#pragma once

#include "cuda/common.cuh"

namespace dsv4::cuda {

// The block's RMSNorm scale of a row held VPT values a thread (thread t: values t +
// j*blockDim.x), its terms summed in rms_norm_block's order: 1/sqrt(mean of squares + eps).
template <uint32_t VPT>
__device__ __forceinline__ float rms_scale_reg(const float (&v)[VPT], uint32_t n, float eps) {
    double ss = 0;
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j) ss += double(v[j]) * double(v[j]);
    ss = block_sum_d(ss);
    return float(1.0 / sqrt(ss / n + double(eps)));
}

// The warp's largest key and its id (be; < 0: none) over the lanes' candidates, ties to the
// lower id: the router's pick.
__device__ __forceinline__ void warp_pick(float& best, int32_t& be) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (oe >= 0 && (be < 0 || ob > best || (ob == best && oe < be))) {
            best = ob;
            be = oe;
        }
    }
}

// rms_norm_q8_0 of one row of VPT * blockDim.x values (xr, in place), the row in registers:
// every load issued at once. Thread t holds values t + j*blockDim.x, the terms
// rms_norm_block's loop gives it, summed in the same order; a warp's value j is element `lane`
// of Q8_0 block (t - lane + j*blockDim.x) / 32, as rms_norm_q8_0_kernel's loop takes it. Codes
// and scales of the row at q and d. Every thread of the block calls it.
template <uint32_t VPT>
__device__ __forceinline__ void rms_norm_q8_0_row(float* xr, uint32_t n, float eps, const float* w, int8_t* q,
                                                  float* d) {
    const uint32_t bd = blockDim.x, lane = threadIdx.x & 31;
    float v[VPT];
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j) v[j] = xr[threadIdx.x + j * bd];
    const float r = rms_scale_reg<VPT>(v, n, eps);
#pragma unroll
    for (uint32_t j = 0; j < VPT; ++j) {
        const uint32_t i = threadIdx.x + j * bd;
        v[j] = __fmul_rn(__fmul_rn(v[j], r), w ? w[i] : 1.0f);
        xr[i] = v[j];
        const float amax = warp_max(fabsf(v[j]));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        q[i] = q_clamp(v[j] * id);
        if (lane == 0) d[i / 32] = f16_round(dd);
    }
}

// The router's shared memory: probs [NE], picks [K], taken [NE], carved from one buffer of
// router_scratch_bytes(NE, K) (router_kernel's dynamic shared memory, matvec_tail's static
// array).
struct RouterScratch {
    float* prob;
    int32_t* sel;
    uint8_t* taken;
};
__host__ __device__ constexpr uint32_t router_scratch_bytes(uint32_t NE, uint32_t K) { return NE * 4 + K * 4 + NE; }
__device__ __forceinline__ RouterScratch router_scratch(void* base, uint32_t NE, uint32_t K) {
    RouterScratch s;
    s.prob = reinterpret_cast<float*>(base);
    s.sel = reinterpret_cast<int32_t*>(s.prob + NE);
    s.taken = reinterpret_cast<uint8_t*>(s.sel + K);
    return s;
}

// The router (§5.13) of row r of a: probs (sqrt(softplus)) in place into a.logits, the
// selection (hash table or biased top-K, ties to the lower id) and the weights into
// a.experts / a.weights [r][K]. The probabilities and the picks live in shared memory because
// the weights read them back one after another, which from global memory was a chain of
// dependent loads. Every thread of the block calls it; warp 0 makes the picks and lane 0 the
// weights.
__device__ __forceinline__ void router_row(const RouterArgs& a, uint32_t r, const RouterScratch& s) {
    const uint32_t NE = a.NE, K = a.K, lane = threadIdx.x;
    const float* bias = a.bias;
    float* prob_s = s.prob;
    float* prob = a.logits + uint64_t(r) * NE;
    // The scores (double-precision exp and log1p, ~a hundred dependent instructions each)
    // one per thread across the block; the picks below need one warp only.
    for (uint32_t e = threadIdx.x; e < NE; e += blockDim.x) {
        const float v = sqrtf(softplus_cr(prob[e]));
        prob_s[e] = v;
        prob[e] = v;
        s.taken[e] = 0;
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    int32_t* sel = s.sel;
    if (a.tid2eid) {
        for (uint32_t k = lane; k < K; k += 32) {
            int32_t e = a.tid2eid[uint64_t(a.rows[r].token) * K + k];
            if (e < 0 || uint32_t(e) >= NE) {
                atomicExch(a.bad, 1);
                e = 0;
            }
            sel[k] = e;
        }
    } else if (NE <= 256) {
        // Each lane keeps its (at most 8) keys in registers: the same scan order and ties
        // as the general loop below, without re-reading prob and bias for every pick.
        float key[8];
        uint32_t avail = 0;
#pragma unroll
        for (uint32_t j = 0; j < 8; ++j) {
            const uint32_t e = lane + 32 * j;
            key[j] = e < NE ? prob_s[e] + (bias ? bias[e] : 0.0f) : 0.0f;
            if (e < NE) avail |= 1u << j;
        }
        for (uint32_t k = 0; k < K; ++k) {
            float best = -INFINITY;
            int32_t be = -1;
#pragma unroll
            for (uint32_t j = 0; j < 8; ++j) {
                if (!((avail >> j) & 1)) continue;
                if (be < 0 || key[j] > best) {
                    best = key[j];
                    be = int32_t(lane + 32 * j);
                }
            }
            warp_pick(best, be);
            if (lane == 0) sel[k] = be;
            if (be >= 0 && uint32_t(be) % 32 == lane) avail &= ~(1u << (uint32_t(be) / 32));
        }
    } else {
        for (uint32_t k = 0; k < K; ++k) {
            float best = -INFINITY;
            int32_t be = -1;
            for (uint32_t e = lane; e < NE; e += 32) {
                if (s.taken[e]) continue;
                const float key = prob_s[e] + (bias ? bias[e] : 0.0f);
                if (be < 0 || key > best) {
                    best = key;
                    be = int32_t(e);
                }
            }
            warp_pick(best, be);
            if (lane == 0) {
                sel[k] = be;
                s.taken[be] = 1;
            }
            __syncwarp();
        }
    }
    __syncwarp();
    if (lane == 0) {
        float sum = 0;
        for (uint32_t k = 0; k < K; ++k) sum += prob_s[sel[k]];
        const float nrm = a.norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
        for (uint32_t k = 0; k < K; ++k) {
            a.weights[uint64_t(r) * K + k] = __fmul_rn(__fmul_rn(prob_s[sel[k]], nrm), a.scale);
            a.experts[uint64_t(r) * K + k] = sel[k];
        }
    }
}

}  // namespace dsv4::cuda
