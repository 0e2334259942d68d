// Tokenizer from GGUF metadata (tokenizer.ggml.*), written with the gguf layer's Writer.
#include <gtest/gtest.h>

#include "dsv4/gguf.h"
#include "dsv4/text.h"

using namespace dsv4;
using namespace dsv4::text;

namespace {

std::vector<uint8_t> tokenizer_gguf(const Vocab& v, bool with_types, const char* model = "gpt2") {
    gguf::Writer w;
    w.set("general.architecture", gguf::make_string("deepseek4"));
    if (model) w.set("tokenizer.ggml.model", gguf::make_string(model));
    w.set("tokenizer.ggml.pre", gguf::make_string("joyai-llm"));
    w.set("tokenizer.ggml.tokens", gguf::make_string_array(v.tokens));
    w.set("tokenizer.ggml.merges", gguf::make_string_array(v.merges));
    if (with_types) {
        std::vector<int32_t> t;
        for (TokenType tt : v.types) t.push_back(int32_t(tt));
        w.set("tokenizer.ggml.token_type", gguf::make_i32_array(t));
    }
    return w.to_bytes();
}

// Tokenizer::from_gguf must refuse the file (`what` is wrong with it) naming `key`.
void expect_refused_naming(const std::vector<uint8_t>& bytes, const std::string& key, const char* what) {
    auto file = gguf::File::parse(bytes.data(), bytes.size(), "tok.gguf");
    try {
        Tokenizer::from_gguf(*file);
        ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(TokenizerGguf, SameAsFromVocab) {
    const Vocab v = builtin_byte_vocab();
    const Tokenizer ref = Tokenizer::from_vocab(v);
    for (bool with_types : {true, false}) {
        const auto bytes = tokenizer_gguf(v, with_types);
        auto file = gguf::File::parse(bytes.data(), bytes.size(), "tok.gguf");
        const Tokenizer tok = Tokenizer::from_gguf(*file);
        EXPECT_EQ(tok.vocab_size(), v.tokens.size());
        const std::string text = "<｜User｜>the thing in 2024 <think>";
        EXPECT_EQ(tok.encode(text, true), ref.encode(text, true)) << "with_types " << with_types;
        EXPECT_EQ(tok.special().user, ref.special().user);
        EXPECT_EQ(tok.special().dsml, ref.special().dsml);
    }
}

TEST(TokenizerGguf, ErrorsNameTheKey) {
    const Vocab v = builtin_byte_vocab();
    expect_refused_naming(tokenizer_gguf(v, true, "llama"), "tokenizer.ggml.model", "a non-BPE tokenizer");
    gguf::Writer w;
    w.set("tokenizer.ggml.tokens", gguf::make_string_array(v.tokens));
    expect_refused_naming(w.to_bytes(), "tokenizer.ggml.merges", "a file without merges");
}
