// Helpers shared by the GGUF reader and writer (not part of the public interface).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "dsv4/gguf.h"

namespace dsv4::gguf {

// The format is little-endian and we read it with memcpy.
static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr size_t kMaxDims = 8;
inline constexpr uint32_t kMaxValueType = uint32_t(ValueType::F64);
inline constexpr const char* kAlignmentKey = "general.alignment";

bool is_unsigned_type(ValueType t);
bool is_signed_type(ValueType t);

// Fewest bytes one value of type t occupies in the file: bounds a count by the bytes left.
uint64_t min_encoded_size(ValueType t);

// "u32 7", "string", "array of 3 f32": what a getter found, for its error message.
std::string describe(const Value& v);

// A name from the file, escaped and shortened so that an error stays one readable line.
std::string printable(std::string_view s);

std::string shape_str(const uint64_t* ne, size_t n_dims);

// Empty when (type, ne) can be stored, with *nbytes set; otherwise why not.
std::string check_tensor_shape(uint32_t type, const uint64_t* ne, size_t n_dims, uint64_t* nbytes);

inline bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

// align_up without wrap-around; false when the result does not fit u64.
inline bool align_up(uint64_t x, uint64_t a, uint64_t* out) {
    uint64_t r = x % a;
    if (r == 0) {
        *out = x;
        return true;
    }
    return !__builtin_add_overflow(x, a - r, out);
}

}  // namespace dsv4::gguf
