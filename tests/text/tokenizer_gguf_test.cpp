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
    {
        const auto bytes = tokenizer_gguf(v, true, "llama");
        auto file = gguf::File::parse(bytes.data(), bytes.size(), "tok.gguf");
        try {
            Tokenizer::from_gguf(*file);
            ADD_FAILURE() << "accepted a non-BPE tokenizer";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
        }
    }
    {
        gguf::Writer w;
        w.set("tokenizer.ggml.tokens", gguf::make_string_array(v.tokens));
        const auto bytes = w.to_bytes();
        auto file = gguf::File::parse(bytes.data(), bytes.size(), "tok.gguf");
        try {
            Tokenizer::from_gguf(*file);
            ADD_FAILURE() << "accepted a file without merges";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.merges"), std::string::npos) << e.what();
        }
    }
}
