// Byte-level BPE tokenizer (model-spec.md §3): specials, BPE with a rank map and a piece
// cache, decoding and streaming. The pre-tokenizer lives in pretokenizer.cpp.
#include <algorithm>
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "dsv4/text.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace dsv4::text {

namespace {

struct MergeInfo {
    int32_t rank;
    int32_t id;
};

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

bool contains_fullwidth_bar(std::string_view s) { return s.find("｜") != std::string_view::npos; }

// Lets the piece cache be searched with a string_view (no allocation per lookup).
struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

// ---- the tables ------------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    std::vector<std::string> decoded;  // bytes each id stands for (§3.4)
    std::unordered_map<std::string_view, int32_t> by_spelling;
    std::array<int32_t, 256> byte_token{};  // the id of each single byte; -1 when absent
    std::unordered_map<uint64_t, MergeInfo> merges;
    std::vector<uint8_t> special_flag;
    std::array<std::vector<int32_t>, 256> special_by_first_byte;  // longest first
    SpecialTokens special;

    static constexpr size_t kMaxCachedPiece = 256;
    static constexpr size_t kMaxCacheEntries = 1 << 18;
    mutable std::mutex cache_mu;
    mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

    void build(std::vector<std::string> toks, const std::vector<std::string>& merge_list, std::vector<TokenType> tt);
    void bpe(std::string_view piece, std::vector<int32_t>& out) const;
    void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
    void check_id(int32_t id) const {
        if (id < 0 || size_t(id) >= tokens.size())
            fail("token id ", id, " is outside the vocabulary (0..", tokens.size() - 1, ")");
    }
};

void Tokenizer::Impl::build(std::vector<std::string> toks, const std::vector<std::string>& merge_list,
                            std::vector<TokenType> tt) {
    if (toks.empty()) fail("tokenizer: the vocabulary is empty");
    if (toks.size() > size_t(INT32_MAX)) fail("tokenizer: vocabulary too large (", toks.size(), " tokens)");
    if (!tt.empty() && tt.size() != toks.size())
        fail("tokenizer: ", tt.size(), " token types for ", toks.size(), " tokens (expected none or one per token)");
    tokens = std::move(toks);
    types = tt.empty() ? std::vector<TokenType>(tokens.size(), TokenType::Normal) : std::move(tt);
    const size_t n = tokens.size();

    by_spelling.reserve(n);
    for (size_t i = 0; i < n; ++i) by_spelling.try_emplace(tokens[i], int32_t(i));  // first id wins

    byte_token.fill(-1);
    for (int b = 0; b < 256; ++b) {
        auto it = by_spelling.find(bytes_to_token_spelling(std::string(1, char(b))));
        if (it != by_spelling.end() && types[size_t(it->second)] != TokenType::Control) byte_token[b] = it->second;
    }

    // Merges are kept as (left id, right id) -> (rank, merged id). A merge whose parts or
    // result are not tokens is skipped: HF tokenizers refuses such files, and no real
    // vocabulary has one.
    merges.reserve(merge_list.size());
    for (size_t r = 0; r < merge_list.size(); ++r) {
        const std::string& m = merge_list[r];
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) fail("tokenizer: merge ", r, " \"", m, "\": expected \"A B\"");
        auto a = by_spelling.find(std::string_view(m).substr(0, sp));
        auto b = by_spelling.find(std::string_view(m).substr(sp + 1));
        auto c = by_spelling.find(std::string(m.substr(0, sp)) + m.substr(sp + 1));
        if (a == by_spelling.end() || b == by_spelling.end() || c == by_spelling.end()) continue;
        merges.try_emplace(pair_key(a->second, b->second), MergeInfo{int32_t(r), c->second});  // lower rank wins
    }

    // Specials: the seven the engine needs, plus every control / user-defined token.
    auto id_of = [&](std::string_view s) {
        auto it = by_spelling.find(s);
        return it == by_spelling.end() ? -1 : it->second;
    };
    special = SpecialTokens{id_of(kBos),       id_of(kEos),        id_of(kUser), id_of(kAssistant),
                            id_of(kThinkOpen), id_of(kThinkClose), id_of(kDsml)};
    special_flag.assign(n, 0);
    for (size_t i = 0; i < n; ++i)
        if (types[i] == TokenType::Control || types[i] == TokenType::UserDefined) special_flag[i] = 1;
    for (int32_t id : {special.bos, special.eos, special.user, special.assistant, special.think_open,
                       special.think_close, special.dsml})
        if (id >= 0) special_flag[size_t(id)] = 1;
    for (size_t i = 0; i < n; ++i) {
        if (!special_flag[i] || tokens[i].empty()) continue;
        if (by_spelling.at(tokens[i]) != int32_t(i)) continue;  // a duplicate spelling: the first id is the one
        special_by_first_byte[uint8_t(tokens[i][0])].push_back(int32_t(i));
    }
    for (auto& v : special_by_first_byte)
        std::stable_sort(v.begin(), v.end(),
                         [&](int32_t a, int32_t b) { return tokens[size_t(a)].size() > tokens[size_t(b)].size(); });

    // Decoding (§3.4): specials verbatim, everything else through the inverse byte map.
    decoded.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string& t = tokens[i];
        if (special_flag[i] || types[i] == TokenType::Unused || contains_fullwidth_bar(t) ||
            utf8::first_invalid(t) != std::string::npos) {
            decoded[i] = t;
            continue;
        }
        std::string out;
        for (size_t k = 0; k < t.size();) {
            const size_t len = utf8::valid_char_len(t, k);
            const int b = codepoint_to_byte(utf8::decode(t, k, len));
            if (b >= 0) out += char(b);  // code points that stand for no byte are skipped
            k += len;
        }
        decoded[i] = std::move(out);
    }
}

// BPE on one piece (§3.2): start from the byte tokens and repeatedly merge the adjacent pair
// of lowest rank, leftmost on ties. A heap keeps this O(n log n) for long pieces (runs of
// spaces, long words); stale heap entries are recognised by the ids they expected.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
    auto byte_id = [&](size_t i) {
        const int32_t id = byte_token[uint8_t(piece[i])];
        if (id < 0)
            fail("tokenizer: cannot encode byte 0x", "0123456789ABCDEF"[uint8_t(piece[i]) >> 4],
                 "0123456789ABCDEF"[uint8_t(piece[i]) & 15], ": the vocabulary has no token for it");
        return id;
    };
    if (piece.size() == 1) {
        out.push_back(byte_id(0));
        return;
    }
    const bool cacheable = piece.size() <= kMaxCachedPiece;
    if (cacheable) {
        std::lock_guard lock(cache_mu);
        auto it = cache.find(piece);
        if (it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }

    struct Sym {
        int32_t id, prev, next;
    };
    struct Cand {
        int32_t rank, pos, left, right;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    const int32_t n = int32_t(piece.size());
    std::vector<Sym> sym(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) sym[size_t(i)] = Sym{byte_id(size_t(i)), i - 1, i + 1 < n ? i + 1 : -1};
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto consider = [&](int32_t pos) {
        const int32_t nx = sym[size_t(pos)].next;
        if (nx < 0) return;
        auto it = merges.find(pair_key(sym[size_t(pos)].id, sym[size_t(nx)].id));
        if (it != merges.end()) heap.push(Cand{it->second.rank, pos, sym[size_t(pos)].id, sym[size_t(nx)].id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        Sym& l = sym[size_t(c.pos)];
        if (l.id != c.left || l.next < 0 || sym[size_t(l.next)].id != c.right) continue;  // stale
        Sym& r = sym[size_t(l.next)];
        l.id = merges.at(pair_key(c.left, c.right)).id;
        l.next = r.next;
        if (r.next >= 0) sym[size_t(r.next)].prev = c.pos;
        r.id = -1;
        if (l.prev >= 0) consider(l.prev);
        consider(c.pos);
    }
    const size_t start = out.size();
    for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);

    if (cacheable) {
        std::lock_guard lock(cache_mu);
        if (cache.size() >= kMaxCacheEntries) cache.clear();
        cache.emplace(std::string(piece), std::vector<int32_t>(out.begin() + std::ptrdiff_t(start), out.end()));
    }
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    detail::pre_tokenize(text, [&](std::string_view piece) { bpe(piece, out); });
}

// ---- public API ------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_vocab(std::vector<std::string> tokens, std::vector<std::string> merges,
                                std::vector<TokenType> types) {
    auto impl = std::make_shared<Impl>();
    impl->build(std::move(tokens), merges, std::move(types));
    detail::compile_pre_tokenizer();  // a broken PCRE2 build fails at load, not at the first prompt
    return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_vocab(const Vocab& vocab) { return from_vocab(vocab.tokens, vocab.merges, vocab.types); }

static void check_utf8(std::string_view text) {
    const size_t bad = utf8::first_invalid(text);
    if (bad != std::string_view::npos) {
        static const char* hex = "0123456789ABCDEF";
        const uint8_t b = uint8_t(text[bad]);
        fail("text is not valid UTF-8: byte 0x", hex[b >> 4], hex[b & 15], " at offset ", bad, " (of ", text.size(),
             " bytes) does not start a valid character");
    }
}

void Tokenizer::encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out) const {
    check_utf8(text);
    const Impl& im = *impl_;
    if (!parse_special) {
        im.encode_plain(text, out);
        return;
    }
    size_t start = 0, i = 0;
    while (i < text.size()) {
        const auto& cands = im.special_by_first_byte[uint8_t(text[i])];
        int32_t hit = -1;
        for (int32_t id : cands) {
            if (text.compare(i, im.tokens[size_t(id)].size(), im.tokens[size_t(id)]) == 0) {
                hit = id;
                break;  // longest first
            }
        }
        if (hit < 0) {
            ++i;
            continue;
        }
        if (i > start) im.encode_plain(text.substr(start, i - start), out);
        out.push_back(hit);
        i += im.tokens[size_t(hit)].size();
        start = i;
    }
    if (start < text.size()) im.encode_plain(text.substr(start), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    encode_append(text, parse_special, out);
    return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
    check_utf8(text);
    std::vector<std::string> pieces;
    detail::pre_tokenize(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
    return pieces;
}

const std::string& Tokenizer::decode(int32_t id) const {
    impl_->check_id(id);
    return impl_->decoded[size_t(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) out += decode(id);
    return out;
}

size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }

const std::string& Tokenizer::token(int32_t id) const {
    impl_->check_id(id);
    return impl_->tokens[size_t(id)];
}

TokenType Tokenizer::type(int32_t id) const {
    impl_->check_id(id);
    return impl_->types[size_t(id)];
}

std::optional<int32_t> Tokenizer::find(std::string_view token) const {
    auto it = impl_->by_spelling.find(token);
    if (it == impl_->by_spelling.end()) return std::nullopt;
    return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
    impl_->check_id(id);
    return impl_->special_flag[size_t(id)] != 0;
}

const SpecialTokens& Tokenizer::special() const { return impl_->special; }

int32_t Tokenizer::require_special(std::string_view token) const {
    auto id = find(token);
    if (!id) fail("tokenizer: the vocabulary has no special token \"", token, "\" (", vocab_size(), " tokens)");
    return *id;
}

// ---- streaming decode ------------------------------------------------------------------------

namespace {

// Length of the tail of `s` that is the unfinished start of a valid UTF-8 character (0 when
// the tail is complete, or can never become valid and so is passed through).
size_t incomplete_tail(std::string_view s) {
    const size_t n = s.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const uint8_t c = uint8_t(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
        size_t need = 0;
        if (c >= 0xC2 && c < 0xE0)
            need = 2;
        else if (c >= 0xE0 && c < 0xF0)
            need = 3;
        else if (c >= 0xF0 && c < 0xF5)
            need = 4;
        if (need <= back) return 0;  // ASCII, invalid lead, or already complete
        if (back >= 2) {
            const uint8_t c1 = uint8_t(s[n - back + 1]);
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 >= 0xA0) || (c == 0xF0 && c1 < 0x90) ||
                (c == 0xF4 && c1 >= 0x90))
                return 0;  // can never complete
        }
        return back;
    }
    return 0;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_->decode(id);
    const size_t hold = incomplete_tail(pending_);
    std::string out = pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace dsv4::text
