// Private: the IQ2_XXS format's tables.
#pragma once

#include <array>
#include <bit>
#include <cstdint>

namespace dsv4::quant::detail {

// GGUF IQ2_XXS codebook (ggml `iq2xxs_grid`): 256 entries of 8 magnitudes in {8, 25, 43},
// byte t of an entry is weight t. Defined in iq2_grid.cpp.
extern const uint64_t kIq2xxsGrid[256];

// Magnitude t (0..7) of grid entry `index`.
inline uint8_t iq2xxs_grid_value(uint32_t index, int t) {
    return uint8_t(kIq2xxsGrid[index] >> (8 * t));
}

// ggml `ksigns_iq2xs`: a 7-bit sign index stores the signs of weights 0..6 of a group of 8
// (bit set = negative); the sign of weight 7 is implied by the rule that every group has an
// even number of negative weights, so entry i = i | (popcount(i) & 1) << 7.
constexpr std::array<uint8_t, 128> make_ksigns() {
    std::array<uint8_t, 128> s{};
    for (uint32_t i = 0; i < 128; ++i) s[i] = uint8_t(i | (uint32_t(std::popcount(i)) & 1u) << 7);
    return s;
}
inline constexpr std::array<uint8_t, 128> kSignsIq2xs = make_ksigns();

// The same signs expanded to 8 bytes of +1 (0x01) / -1 (0xff), byte t for weight t: a mask
// the SIMD dot products multiply the activation with.
constexpr std::array<uint64_t, 128> make_sign_bytes() {
    std::array<uint64_t, 128> s{};
    for (uint32_t i = 0; i < 128; ++i) {
        uint64_t v = 0;
        for (int t = 0; t < 8; ++t) {
            uint64_t b = (kSignsIq2xs[i] >> t) & 1 ? 0xffu : 0x01u;
            v |= b << (8 * t);
        }
        s[i] = v;
    }
    return s;
}
inline constexpr std::array<uint64_t, 128> kSignBytesIq2xs = make_sign_bytes();

}  // namespace dsv4::quant::detail
