// The official pre-tokenizer run by PCRE2 (internal to the text layer; tests use it too).
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dsv4::text::detail {

// Rewrites one of the official regexes (written for Oniguruma) into the PCRE2 pattern that
// matches the same text: \s becomes Unicode White_Space, and \p{L|M|N|P|S} gain the code
// points that PCRE2's older Unicode tables lack (unicode_supplement.inc) unless `supplement`
// is false (then only code points PCRE2 knows are classified as officially).
std::string for_pcre2(const std::string& official, bool supplement = true);

// Compiles the three patterns (once per process; later calls are free). Throws Error if
// PCRE2 refuses them.
void compile_pre_tokenizer();

// Splits valid UTF-8 `text` into pieces (§3.1), calling emit for each in order.
void pre_tokenize(std::string_view text, const std::function<void(std::string_view)>& emit);

}  // namespace dsv4::text::detail
