// Byte-level builders for hand-made (often deliberately broken) GGUF images.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/common.h"
#include "dsv4/gguf.h"

namespace gguf_test {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ2_K = 10, kQ4_K = 12, kQ8_K = 15,
                   kIQ2_XXS = 16, kI32 = 26, kBF16 = 30, kMXFP4 = 39;

// Value type ids as raw numbers, for writing them where a broken file needs them.
constexpr uint32_t tU8 = 0, tI8 = 1, tU16 = 2, tI16 = 3, tU32 = 4, tI32 = 5, tF32 = 6, tBOOL = 7,
                   tSTRING = 8, tARRAY = 9, tU64 = 10, tI64 = 11, tF64 = 12;

struct Raw {
    std::vector<uint8_t> b;

    template <typename T>
    Raw& put(T v) {
        size_t n = b.size();
        b.resize(n + sizeof v);
        std::memcpy(b.data() + n, &v, sizeof v);
        return *this;
    }
    Raw& u8(uint8_t v) { return put(v); }
    Raw& u32(uint32_t v) { return put(v); }
    Raw& u64(uint64_t v) { return put(v); }
    Raw& bytes(std::string_view s) {
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& str(std::string_view s) { return u64(s.size()).bytes(s); }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
    }
    Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(tU32).u32(v); }
    Raw& kv_string(std::string_view key, std::string_view v) { return str(key).u32(tSTRING).str(v); }
    Raw& tensor(std::string_view name, std::initializer_list<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(uint32_t(ne.size()));
        for (uint64_t d : ne) u64(d);
        return u32(type).u64(offset);
    }
    Raw& pad_to(size_t a) {
        b.resize((b.size() + a - 1) / a * a, 0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

// Parses a copy sized exactly to the image, so that AddressSanitizer catches any read past
// its end. Returns the error message, or "" when the image parsed.
inline std::string parse_error(const std::vector<uint8_t>& image, size_t len) {
    std::vector<uint8_t> copy(image.begin(), image.begin() + ptrdiff_t(len));
    try {
        auto f = dsv4::gguf::File::parse(copy.data(), copy.size(), "t.gguf");
        return "";
    } catch (const dsv4::Error& e) {
        return e.what();
    }
}
inline std::string parse_error(const std::vector<uint8_t>& image) { return parse_error(image, image.size()); }

// Asserts that the image is rejected with a message containing every fragment.
#define EXPECT_REJECTED(image, ...)                                                  \
    do {                                                                             \
        std::string msg_ = gguf_test::parse_error(image);                            \
        ASSERT_FALSE(msg_.empty()) << "image was accepted";                          \
        EXPECT_EQ(msg_.find('\n'), std::string::npos) << msg_;                       \
        EXPECT_EQ(msg_.rfind("t.gguf: ", 0), 0u) << msg_;                            \
        for (const char* frag_ : {__VA_ARGS__})                                      \
            EXPECT_NE(msg_.find(frag_), std::string::npos) << "missing '" << frag_   \
                                                           << "' in: " << msg_;      \
    } while (0)

inline dsv4::gguf::Value scalar(dsv4::gguf::ValueType t, uint64_t u, int64_t i = 0, double f = 0) {
    dsv4::gguf::Value v;
    v.type = t;
    v.u = u;
    v.i = i;
    v.f = f;
    return v;
}

inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto& b : v) {
        x = x * 1664525u + 1013904223u;
        b = uint8_t(x >> 24);
    }
    return v;
}

}  // namespace gguf_test
