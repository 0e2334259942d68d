// Error checking and host-side helpers of the CUDA backend.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <tuple>
#include <vector>

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

bool env_switch(const char* name, bool on_by_default) {
    const char* e = std::getenv(name);
    return e && e[0] ? e[0] != '0' : on_by_default;
}

int env_int(const char* name, int default_value) {
    const char* e = std::getenv(name);
    return e && e[0] ? std::atoi(e) : default_value;
}

bool pdl_early_weights() {
    static const bool on = env_switch("DSV4_PDL_EARLY", true);
    return on;
}

int sm_count() {
    static const int n = [] {
        int dev = 0, c = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) !=
                                                       cudaSuccess)
            c = 132;
        return c > 0 ? c : 132;
    }();
    return n;
}

uint32_t resident_blocks(const void* kernel, uint32_t threads, size_t smem) {
    static std::mutex mu;
    static std::vector<std::tuple<const void*, uint32_t, size_t, uint32_t>> seen;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [k, t, b, n] : seen)
        if (k == kernel && t == threads && b == smem) return n;
    int dev = 0, sms = 0, per_sm = 0;
    check(cudaGetDevice(&dev), "residency");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "residency");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, int(threads), smem), "residency");
    seen.emplace_back(kernel, threads, smem, uint32_t(std::max(1, sms) * std::max(1, per_sm)));
    return std::get<3>(seen.back());
}

bool repack_shape(uint32_t type, RepackShape* s) {
    switch (quant::Type(type)) {
        case quant::Type::Q8_0: *s = {32, 34, 2, 32, 0, 2}; return true;         // d | qs[32]
        case quant::Type::IQ2_XXS: *s = {256, 66, 2, 64, 0, 2}; return true;     // d | qs[32] (u16)
        case quant::Type::Q2_K: *s = {256, 84, 0, 80, 80, 4}; return true;       // scales[16] qs[64] | d dmin
        default: return false;
    }
}

void repack_rows(uint32_t type, const uint8_t* src, uint64_t n_rows, uint64_t K, uint8_t* qs, uint8_t* d) {
    RepackShape s;
    if (!repack_shape(type, &s)) fail("repack_rows: type ", quant::type_name(type), " is not repacked");
    const uint64_t nb = n_rows * (K / s.block_values);
    for (uint64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = src + b * s.block_bytes;
        std::memcpy(qs + b * s.body_bytes, blk + s.body_off, s.body_bytes);
        std::memcpy(d + b * s.aux_bytes, blk + s.aux_off, s.aux_bytes);
    }
}

}  // namespace dsv4::cuda
