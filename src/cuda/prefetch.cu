// L2 prefetch of weights a decode step is about to read.
//
// A decode layer spends most of its time in small latency-bound kernels (norms, mHC, the
// router, attention) while the memory system idles, then streams a 35 MB Q8_0 matrix
// (q_b, out_a) on the critical path. Issuing that matrix's bytes into L2 (50 MB on the
// H200) on a side branch while the small kernels run turns the product's HBM reads into
// L2 hits. Hopper's bulk prefetch (the TMA unit) does it with one instruction per chunk:
// the kernel only issues requests and ends, nothing waits for the bytes.
#include "cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr uint64_t kChunk = 64 << 10;   // bytes per bulk prefetch request

__global__ void l2_prefetch_kernel(const uint8_t* p, uint64_t bytes) {
    // Reads nothing another kernel writes: lets its dependents go, and does not wait.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const uint64_t off = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kChunk;
    if (off >= bytes) return;
    const uint32_t n = uint32_t(min(kChunk, bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
#endif
}

// [p, p + bytes) shrunk to 16-byte boundaries (the bulk copy's alignment and size unit).
void prefetch_range(const void* p, uint64_t bytes, cudaStream_t s) {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t(15);
    if (!p || e <= a) return;
    const uint64_t n = e - a, requests = (n + kChunk - 1) / kChunk;
    const uint32_t threads = 128, blocks = uint32_t((requests + threads - 1) / threads);
    l2_prefetch_kernel<<<blocks, threads, 0, s>>>(reinterpret_cast<const uint8_t*>(a), n);
    check_launch("l2_prefetch");
}

}  // namespace

void l2_prefetch(const DevWeight& W, cudaStream_t s) {
    if (!W.K || !W.rows) return;
    if (RepackShape rs; W.qs && repack_shape(W.type, &rs)) {
        const uint64_t blocks = W.rows * (W.K / rs.block_values);
        prefetch_range(W.qs, blocks * rs.body_bytes, s);
        prefetch_range(W.d, blocks * rs.aux_bytes, s);
    } else {
        prefetch_range(W.data, W.rows * W.row_bytes, s);
    }
}

}  // namespace dsv4::cuda
