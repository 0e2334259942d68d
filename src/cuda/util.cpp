// Error checking and host-side helpers of the CUDA backend.
#include <cstring>

#include "cuda/kernels.h"
#include "dsv4/common.h"
#include "dsv4/quant.h"

namespace dsv4::cuda {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail("CUDA: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
    }
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

void throw_too_small(const char* what, uint64_t need, uint64_t have) {
    fail("CUDA backend: ", what, " holds ", have, " values, ", need, " needed (a bug)");
}

void throw_mismatch(const char* what, uint32_t type, uint64_t weight_k, uint64_t act_k) {
    fail("CUDA backend: ", what, ": weight type ", quant::type_name(type), " with rows of ", weight_k,
         " values, activation of ", act_k, " values in another format");
}

void repack_q8_0(const uint8_t* src, uint64_t n_rows, uint64_t K, int8_t* qs, uint16_t* d) {
    const uint64_t nb = K / 32;
    for (uint64_t r = 0; r < n_rows; ++r)
        for (uint64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = src + (r * nb + b) * 34;
            std::memcpy(&d[r * nb + b], blk, 2);
            std::memcpy(&qs[(r * nb + b) * 32], blk + 2, 32);
        }
}

}  // namespace dsv4::cuda
