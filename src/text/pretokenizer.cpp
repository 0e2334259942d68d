// The official DeepSeek pre-tokenizer (model-spec.md §3.1 caveat): three "Isolated" regex
// splits from the HF tokenizer.json, run by PCRE2 with Unicode properties.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <vector>

#include "dsv4/text.h"
#include "text/utf8.h"

namespace dsv4::text::detail {

namespace {

// ---- the pre-tokenizer regexes, compiled once per process ----------------------------------

// Regex engines disagree on the classes the official regexes use. They were written for
// Oniguruma (HF tokenizers' engine), where \s is Unicode White_Space (U+0009-U+000D, U+0085
// and the Z categories); PCRE2's \s adds U+180E, JavaScript's adds U+FEFF and drops U+0085.
// And each engine has its own Unicode version: PCRE2 10.42 knows Unicode 14, so newer code
// points (U+1FAE8 and every later emoji, new scripts) would fall outside \p{S}, \p{L}, ...
// We spell White_Space out and append to each \p{X} the code points that Oniguruma has and
// PCRE2 lacks, generated from the official library by tests/oracle/tokenizer/unicode_classes.mjs.
#include "text/unicode_supplement.inc"

std::string class_body(std::string_view name, bool supplement) {
    auto with = [&](const char* base, const char* extra) { return std::string(base) + (supplement ? extra : ""); };
    if (name == "L") return with("\\p{L}", kSupplement_L);
    if (name == "M") return with("\\p{M}", kSupplement_M);
    if (name == "N") return with("\\p{N}", kSupplement_N);
    if (name == "P") return with("\\p{P}", kSupplement_P);
    if (name == "S") return with("\\p{S}", kSupplement_S);
    if (name == "White_Space") return with("\\x{09}-\\x{0D}\\x{85}\\p{Z}", kSupplement_White_Space);
    return "";
}

// One bit per code point of the supplement. Text without such code points gets the same
// pieces from PCRE2's plain classes, which run about twice as fast as the supplemented ones.
struct SupplementSet {
    std::vector<uint64_t> bits = std::vector<uint64_t>(0x110000 / 64, 0);
    uint32_t lowest = 0x110000;
    SupplementSet() {
        for (const auto& r : kSupplementRanges) {
            lowest = std::min(lowest, r[0]);
            for (uint32_t cp = r[0]; cp <= r[1]; ++cp) bits[cp >> 6] |= uint64_t(1) << (cp & 63);
        }
    }
    bool any_in(std::string_view s) const {
        for (size_t i = 0; i < s.size();) {
            const uint8_t c = uint8_t(s[i]);
            if (c < 0xE0) {  // ASCII and 2-byte characters are all below every supplement
                i += c < 0x80 ? 1 : 2;
                continue;
            }
            const size_t n = utf8::valid_char_len(s, i);
            const uint32_t cp = utf8::decode(s, i, n);
            if (cp >= lowest && (bits[cp >> 6] >> (cp & 63) & 1)) return true;
            i += n;
        }
        return false;
    }
};

const SupplementSet& supplement_set() {
    static const SupplementSet s;
    return s;
}

}  // namespace

std::string for_pcre2(const std::string& re, bool supplement) {
    std::string out;
    bool in_class = false;
    size_t class_start = 0;
    auto put_class = [&](const std::string& body, bool negated) {
        if (in_class) {
            if (negated) fail("pre-tokenizer regex: a negated class inside [...] is not supported: ", re);
            out += body;
        } else {
            out += negated ? "[^" : "[";
            out += body;
            out += ']';
        }
    };
    for (size_t i = 0; i < re.size(); ++i) {
        const char c = re[i];
        if (c == '\\' && i + 1 < re.size()) {
            const char d = re[++i];
            if (d == 's' || d == 'S') {
                put_class(class_body("White_Space", supplement), d == 'S');
                continue;
            }
            if (d == 'p' && i + 1 < re.size() && re[i + 1] == '{') {
                const size_t close = re.find('}', i);
                const std::string name = re.substr(i + 2, close == std::string::npos ? 0 : close - i - 2);
                const std::string body = class_body(name, supplement);
                if (!body.empty()) {
                    put_class(body, false);
                    i = close;
                    continue;
                }
            }
            out += c;
            out += d;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            class_start = out.size() + 1;
            if (i + 1 < re.size() && re[i + 1] == '^') ++class_start;
        } else if (in_class && c == ']' && out.size() > class_start) {
            in_class = false;  // a ']' first in the class is a literal
        }
        out += c;
    }
    return out;
}

namespace {

struct Regexes {
    std::array<pcre2_code*, 3> plain{}, full{};

    static pcre2_code* compile(const std::string& src, size_t i) {
        int err = 0;
        PCRE2_SIZE off = 0;
        // UTF: the subject is UTF-8 (validated once by encode, hence NO_UTF_CHECK at match
        // time). UCP: the property classes use Unicode properties.
        pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(src.data()), src.size(), PCRE2_UTF | PCRE2_UCP, &err,
                                      &off, nullptr);
        if (!c) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            fail("pre-tokenizer regex ", i, ": PCRE2 compile error at offset ", off, ": ",
                 reinterpret_cast<char*>(msg));
        }
        pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
        return c;
    }
    Regexes() {
        const auto& official = pre_tokenizer_regexes();
        for (size_t i = 0; i < plain.size(); ++i) {
            plain[i] = compile(for_pcre2(official[i], false), i);
            full[i] = compile(for_pcre2(official[i], true), i);
        }
    }
    ~Regexes() {
        for (auto* c : plain) pcre2_code_free(c);
        for (auto* c : full) pcre2_code_free(c);
    }
};

const Regexes& regexes() {
    static const Regexes r;
    return r;
}

// Match data and JIT stack are per thread: compiled patterns are shared read-only.
struct MatchScratch {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mc = nullptr;
    pcre2_jit_stack* js = nullptr;

    MatchScratch() {
        md = pcre2_match_data_create(1, nullptr);
        mc = pcre2_match_context_create(nullptr);
        js = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
        if (!md || !mc || !js) fail("pre-tokenizer: out of memory for PCRE2 match data");
        pcre2_jit_stack_assign(mc, nullptr, js);
    }
    ~MatchScratch() {
        pcre2_jit_stack_free(js);
        pcre2_match_context_free(mc);
        pcre2_match_data_free(md);
    }
};

MatchScratch& scratch() {
    thread_local MatchScratch s;
    return s;
}

// "Isolated" split (HF tokenizers / transformers.js regexSplit): every match is a piece and
// so is every non-empty gap between matches. The regex sees only `piece`, so look-aheads
// stop at its end exactly as when the reference runs the regex on the piece as a string.
template <typename Emit>
void split_isolated(pcre2_code* re, std::string_view piece, Emit&& emit) {
    MatchScratch& ms = scratch();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t pos = 0, prev = 0;
    while (pos < piece.size()) {
        const int rc = pcre2_match(re, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, ms.md, ms.mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            fail("pre-tokenizer: PCRE2 match error: ", reinterpret_cast<char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md);
        const size_t s = ov[0], e = ov[1];  // read before emit: nested splits reuse the match data
        if (s > prev) emit(piece.substr(prev, s - prev));
        if (e > s) emit(piece.substr(s, e - s));
        prev = e;
        if (e > s)
            pos = e;
        else if (e < piece.size())
            pos = e + std::max<size_t>(1, utf8::valid_char_len(piece, e));  // empty match: step
        else
            break;
    }
    if (prev < piece.size()) emit(piece.substr(prev));
}

}  // namespace

void compile_pre_tokenizer() {
    regexes();
    supplement_set();
}

void pre_tokenize(std::string_view text, const std::function<void(std::string_view)>& emit) {
    const auto& re = supplement_set().any_in(text) ? regexes().full : regexes().plain;
    // Each split runs on every piece of the previous one, as HF's Sequence pre-tokenizer does.
    split_isolated(re[0], text, [&](std::string_view a) {
        split_isolated(re[1], a, [&](std::string_view b) { split_isolated(re[2], b, emit); });
    });
}

}  // namespace dsv4::text::detail
