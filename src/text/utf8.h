// Small UTF-8 helpers shared by the text layer (internal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::text::utf8 {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is invalid or
// truncated (overlong forms, surrogates and code points above U+10FFFF are invalid).
inline size_t valid_char_len(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
    const size_t left = s.size() - i;
    const uint8_t c = b(0);
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return (left >= 2 && (b(1) & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (left < 3 || (b(1) & 0xC0) != 0x80 || (b(2) & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
        if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
        return 3;
    }
    if (c < 0xF5) {
        if (left < 4 || (b(1) & 0xC0) != 0x80 || (b(2) & 0xC0) != 0x80 || (b(3) & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
        if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
        return 4;
    }
    return 0;
}

// Offset of the first byte that does not start a valid character, or npos.
inline size_t first_invalid(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        if (uint8_t(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t n = valid_char_len(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string_view::npos;
}

// Decodes the valid character at s[i] (of length n from valid_char_len).
inline uint32_t decode(std::string_view s, size_t i, size_t n) {
    const auto b = [&](size_t k) { return uint32_t(uint8_t(s[i + k])); };
    switch (n) {
        case 1:
            return b(0);
        case 2:
            return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
        case 3:
            return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
        default:
            return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    }
}

inline void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

}  // namespace dsv4::text::utf8
