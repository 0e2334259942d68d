// Tokenizer unit tests on small vocabularies: byte map, pre-tokenizer splits, BPE merge
// order, specials, decoding, streaming, errors, and the HF tokenizer.json reader.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "dsv4/text.h"

using namespace dsv4::text;
using dsv4::Error;

namespace {

// A vocabulary of the 256 byte tokens plus the given merges (and their results), with the
// seven specials at the end.
Tokenizer byte_tokenizer(const std::vector<std::string>& merges) {
    std::vector<std::string> tokens;
    std::vector<TokenType> types;
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(bytes_to_token_spelling(std::string(1, char(b))));
        types.push_back(TokenType::Normal);
    }
    for (const auto& m : merges) {
        const size_t sp = m.find(' ');
        tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
        types.push_back(TokenType::Normal);
    }
    for (std::string_view s : {kBos, kEos, kUser, kAssistant, kThinkOpen, kThinkClose, kDsml}) {
        tokens.emplace_back(s);
        types.push_back(TokenType::Control);
    }
    return Tokenizer::from_vocab(tokens, merges, types);
}

std::vector<std::string> spellings(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(tok.token(id));
    return out;
}

using Pieces = std::vector<std::string>;

// Reference BPE, straight from the definition (§3.2): repeatedly merge the leftmost pair of
// lowest rank. Quadratic, for checking the heap implementation.
std::vector<std::string> naive_bpe(const std::string& piece, const std::vector<std::string>& merges) {
    std::vector<std::string> sym;
    for (char c : piece) sym.push_back(bytes_to_token_spelling(std::string(1, c)));
    std::map<std::string, size_t> rank;
    for (size_t i = 0; i < merges.size(); ++i) rank.emplace(merges[i], i);
    for (;;) {
        size_t best = SIZE_MAX, at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            auto it = rank.find(sym[i] + " " + sym[i + 1]);
            if (it != rank.end() && it->second < best) {
                best = it->second;
                at = i;
            }
        }
        if (best == SIZE_MAX) return sym;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + std::ptrdiff_t(at) + 1);
    }
}

}  // namespace

TEST(TextByteMap, IsABijectionWithPrintableSpellings) {
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = byte_to_codepoint(uint8_t(b));
        EXPECT_TRUE(seen.insert(cp).second) << b;
        EXPECT_EQ(codepoint_to_byte(cp), b);
        EXPECT_NE(cp, 0x20u);
    }
    EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // Ġ
    EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // Ċ
    EXPECT_EQ(byte_to_codepoint('A'), uint32_t('A'));
    EXPECT_EQ(codepoint_to_byte(0x4E00), -1);
    EXPECT_EQ(bytes_to_token_spelling(" the\n"), "ĠtheĊ");
}

TEST(TokenizerPreTokenize, SplitsLikeTheOfficialRegex) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    EXPECT_EQ(tok.pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
    EXPECT_EQ(tok.pre_tokenize("abc1234567def"), (Pieces{"abc", "123", "456", "7", "def"}));
    EXPECT_EQ(tok.pre_tokenize("    int x;"), (Pieces{"   ", " int", " x", ";"}));
    EXPECT_EQ(tok.pre_tokenize("a>;\nb"), (Pieces{"a", ">;\n", "b"}));
    EXPECT_EQ(tok.pre_tokenize("x.y"), (Pieces{"x", ".y"}));
    EXPECT_EQ(tok.pre_tokenize("don't"), (Pieces{"don", "'t"}));
    EXPECT_EQ(tok.pre_tokenize("a\n\n  b"), (Pieces{"a", "\n\n", " ", " b"}));
    EXPECT_EQ(tok.pre_tokenize("end  "), (Pieces{"end", "  "}));
    EXPECT_EQ(tok.pre_tokenize("中文English混合"), (Pieces{"中文", "English", "混合"}));
    EXPECT_EQ(tok.pre_tokenize("日本語のテキスト"), (Pieces{"日本語のテキスト"}));
    EXPECT_EQ(tok.pre_tokenize("Привет, мир"), (Pieces{"Привет", ",", " мир"}));
    // \p{N} is any Unicode number, not only ASCII digits.
    EXPECT_EQ(tok.pre_tokenize("x٠١٢٣y"), (Pieces{"x", "٠١٢", "٣", "y"}));
    EXPECT_EQ(tok.pre_tokenize(""), Pieces{});
}

TEST(TokenizerBpe, MergesByRankLeftmostFirst) {
    // "b c" outranks "a b": abc -> a + bc even though ab comes first.
    const Tokenizer t1 = byte_tokenizer({"b c", "a b"});
    EXPECT_EQ(spellings(t1, t1.encode("abc")), (Pieces{"a", "bc"}));
    // Equal pairs: the leftmost merges first.
    const Tokenizer t2 = byte_tokenizer({"a a"});
    EXPECT_EQ(spellings(t2, t2.encode("aaa")), (Pieces{"aa", "a"}));
    EXPECT_EQ(spellings(t2, t2.encode("aaaaa")), (Pieces{"aa", "aa", "a"}));
    // Merged symbols merge again.
    const Tokenizer t3 = byte_tokenizer({"a a", "aa aa", "Ġ aaaa"});
    EXPECT_EQ(spellings(t3, t3.encode(" aaaaa")), (Pieces{"Ġaaaa", "a"}));
    // Merges never cross piece boundaries.
    const Tokenizer t4 = byte_tokenizer({"a Ġ"});
    EXPECT_EQ(spellings(t4, t4.encode("a b")), (Pieces{"a", "Ġ", "b"}));
}

TEST(TokenizerBpe, HeapMatchesTheDefinitionOnRandomText) {
    const std::vector<std::string> merges = {"a b",  "b a",  "Ġ a",   "a a",  "ab a", "Ġa b", "b b",  "Ġ b",
                                             "aa b", "ba b", "Ġab a", "bb a", "a ab", "c c",  "cc c", "ab ab"};
    const Tokenizer tok = byte_tokenizer(merges);
    std::mt19937 rng(1234);
    const std::string alphabet = "aabbc ";
    for (int iter = 0; iter < 300; ++iter) {
        std::string text;
        const int len = 1 + int(rng() % 200);
        for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
        std::vector<std::string> expected;
        for (const auto& piece : tok.pre_tokenize(text))
            for (auto& s : naive_bpe(piece, merges)) expected.push_back(s);
        ASSERT_EQ(spellings(tok, tok.encode(text)), expected) << "text: \"" << text << "\"";
    }
}

TEST(TokenizerBpe, LongPiecesStayFast) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const std::string spaces(200000, ' ');
    const std::string letters(200000, 'a');
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(tok.encode(spaces).size(), spaces.size());
    EXPECT_EQ(tok.encode(letters).size(), letters.size());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ bench    ] 400 KB in two single pieces: %.3f s\n", s);
}

TEST(TokenizerBuiltin, HasSpecialsAndEnglishMerges) {
    const Vocab v = builtin_byte_vocab();
    const Tokenizer tok = Tokenizer::from_vocab(v);
    const SpecialTokens& sp = tok.special();
    EXPECT_EQ(sp.bos, 256);
    EXPECT_EQ(sp.eos, 257);
    EXPECT_EQ(sp.user, 258);
    EXPECT_EQ(sp.assistant, 259);
    EXPECT_EQ(sp.think_open, 260);
    EXPECT_EQ(sp.think_close, 261);
    EXPECT_EQ(sp.dsml, 262);
    EXPECT_EQ(spellings(tok, tok.encode("the thing")), (Pieces{"t", "he", "Ġt", "h", "ing"}));
    EXPECT_EQ(tok.decode(tok.encode("the thing")), "the thing");
}

TEST(TokenizerSpecial, ParsedOnlyWhenAsked) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const SpecialTokens& sp = tok.special();
    const std::string text = "<｜User｜>hi<｜Assistant｜><think>";
    const auto with = tok.encode(text, true);
    ASSERT_GE(with.size(), 4u);
    EXPECT_EQ(with.front(), sp.user);
    EXPECT_EQ(with[with.size() - 2], sp.assistant);
    EXPECT_EQ(with.back(), sp.think_open);
    const auto without = tok.encode(text, false);
    for (int32_t id : without) EXPECT_FALSE(tok.is_special(id)) << id;
    EXPECT_EQ(tok.decode(with), text);
    EXPECT_EQ(tok.decode(without), text);

    // <｜DSML｜tool_calls> is "<" + ｜DSML｜ + "tool_calls>" (§3.3).
    const auto dsml = tok.encode("<｜DSML｜tool_calls>", true);
    ASSERT_GE(dsml.size(), 3u);
    EXPECT_EQ(tok.token(dsml[0]), "<");
    EXPECT_EQ(dsml[1], sp.dsml);
    EXPECT_EQ(tok.decode(std::span(dsml).subspan(2)), "tool_calls>");
}

TEST(TokenizerSpecial, LongestMatchWins) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(bytes_to_token_spelling(std::string(1, char(b))));
    tokens.push_back("<a>");
    tokens.push_back("<a><b>");
    std::vector<TokenType> types(tokens.size(), TokenType::Normal);
    types[256] = types[257] = TokenType::UserDefined;
    const Tokenizer tok = Tokenizer::from_vocab(tokens, {}, types);
    EXPECT_EQ(tok.encode("x<a><b><a>", true), (std::vector<int32_t>{*tok.find("x"), 257, 256}));
    EXPECT_EQ(tok.special().bos, -1);
    EXPECT_THROW(tok.require_special(kBos), Error);
}

TEST(TokenizerErrors, InvalidUtf8IsAClearError) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    for (const std::string& bad : {std::string("ok\xff"), std::string("ab\xc3"), std::string("\xed\xa0\x80"),
                                   std::string("\xc0\xaf"), std::string("x\xf4\x90\x80\x80")}) {
        try {
            tok.encode(bad);
            ADD_FAILURE() << "no error for invalid UTF-8";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
        }
    }
    EXPECT_THROW(tok.decode(int32_t(tok.vocab_size())), Error);
    EXPECT_THROW(tok.decode(-1), Error);
}

TEST(TokenizerErrors, MissingByteTokenIsReported) {
    const Tokenizer tok = Tokenizer::from_vocab({"a", "b"}, {});
    EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{0, 1}));
    EXPECT_THROW(tok.encode("c"), Error);
    EXPECT_THROW(Tokenizer::from_vocab({"a", "b"}, {}, {TokenType::Normal}), Error);
    EXPECT_THROW(Tokenizer::from_vocab({}, {}), Error);
}

TEST(TokenizerDecode, RoundTripsAnyValidText) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const std::string text = "Straße 東京 🇮🇹 👩🏿‍💻 \t\r\n x\u200by ١٢٣ the end";
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(TokenizerStream, HoldsBackPartialCharacters) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const std::string text = "aé😀b";
    const auto ids = tok.encode(text);  // no merges for these: one token per byte
    ASSERT_EQ(ids.size(), 1 + 2 + 4 + 1u);
    StreamDecoder sd(tok);
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(sd.push(id));
    EXPECT_EQ(chunks, (Pieces{"a", "", "é", "", "", "", "😀", "b"}));
    EXPECT_FALSE(sd.has_pending());

    StreamDecoder cut(tok);
    EXPECT_EQ(cut.push(ids[3]), "");  // first byte of the emoji
    EXPECT_TRUE(cut.has_pending());
    EXPECT_EQ(cut.flush(), "\xf0");
    // A byte that can never start a character is passed through at once.
    const auto ff = tok.find(bytes_to_token_spelling("\xff"));
    ASSERT_TRUE(ff);
    EXPECT_EQ(cut.push(*ff), "\xff");
}

TEST(TokenizerHfJson, ReadsVocabMergesAddedTokensAndPads) {
    const auto dir = std::filesystem::temp_directory_path() / "dsv4_text_test";
    std::filesystem::create_directories(dir);
    const auto path = (dir / "tokenizer.json").string();
    {
        std::ofstream f(path);
        f << R"({
          "added_tokens": [
            {"id": 0, "content": "<｜begin▁of▁sentence｜>", "special": true},
            {"id": 9, "content": "<｜User｜>", "special": false}
          ],
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated"},
            {"type": "ByteLevel"}]},
          "model": {"type": "BPE",
            "vocab": {"<｜begin▁of▁sentence｜>": 0, "a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġab": 5},
            "merges": [["a", "b"], "Ġ ab"]}
        })";
    }
    const Vocab v = load_hf_tokenizer_json(path, 12);
    ASSERT_EQ(v.tokens.size(), 12u);
    EXPECT_EQ(v.tokens[3], "ab");
    EXPECT_EQ(v.tokens[9], "<｜User｜>");
    EXPECT_EQ(v.tokens[7], "<｜place▁holder▁no▁7｜>");
    EXPECT_EQ(v.tokens[11], "<｜place▁holder▁no▁11｜>");
    EXPECT_EQ(v.types[0], TokenType::Control);
    EXPECT_EQ(v.types[1], TokenType::Normal);
    EXPECT_EQ(v.types[7], TokenType::Unused);
    EXPECT_EQ(v.types[9], TokenType::UserDefined);
    EXPECT_EQ(v.merges, (std::vector<std::string>{"a b", "Ġ ab"}));
    EXPECT_EQ(v.pre_tokenizer_regexes, (std::vector<std::string>{"\\p{N}{1,3}"}));

    const Tokenizer tok = Tokenizer::from_vocab(v);
    EXPECT_EQ(tok.encode("ab ab<｜User｜>", true), (std::vector<int32_t>{3, 5, 9}));
    EXPECT_EQ(tok.special().user, 9);
    EXPECT_FALSE(tok.is_special(7));  // padding is never matched in text

    EXPECT_THROW(load_hf_tokenizer_json((dir / "missing.json").string()), Error);
    {
        std::ofstream f(path);
        f << "{ not json";
    }
    EXPECT_THROW(load_hf_tokenizer_json(path), Error);
    std::filesystem::remove_all(dir);
}
