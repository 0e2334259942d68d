// Data shared by the quant tests: roughly Gaussian rows and the list of block formats.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/quant.h"
#include "quant/blocks.h"

namespace dsv4::quant::test {

// Deterministic test data: roughly Gaussian (sum of 4 uniforms), scaled.
inline std::vector<float> gaussian(size_t n, uint64_t seed, float sigma) {
    detail::SplitMix64 r{seed};
    std::vector<float> x(n);
    for (auto& v : x) v = sigma * 0.866f * (r.sym() + r.sym() + r.sym() + r.sym());
    return x;
}

// Every type with float values (all but I32): each has a dequantiser and a dot product.
inline constexpr Type kAllTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q8_0, Type::Q8_K,
                                     Type::Q2_K, Type::Q4_K, Type::IQ2_XXS, Type::MXFP4};

}  // namespace dsv4::quant::test
