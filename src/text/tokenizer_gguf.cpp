// Tokenizer from GGUF metadata (model-spec.md §2.5). Kept apart from tokenizer.cpp so that
// the rest of the text layer builds and links without the gguf layer.
#include <cmath>

#include "dsv4/gguf.h"
#include "dsv4/text.h"

namespace dsv4::text {

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
    // ds4 reads only tokens and merges. The token kinds are optional: without them the
    // specials are the seven of §2.5, found by spelling.
    if (file.has("tokenizer.ggml.model")) {
        const std::string model = file.get_string("tokenizer.ggml.model");
        if (model != "gpt2")
            fail(file.path(), ": tokenizer.ggml.model: expected \"gpt2\" (byte-level BPE), found \"", model, "\"");
    }
    std::vector<std::string> tokens = file.get_string_array("tokenizer.ggml.tokens");
    std::vector<std::string> merges = file.get_string_array("tokenizer.ggml.merges");
    std::vector<TokenType> types;
    if (file.has("tokenizer.ggml.token_type")) {
        const std::vector<double> raw = file.get_number_array("tokenizer.ggml.token_type");
        if (raw.size() != tokens.size())
            fail(file.path(), ": tokenizer.ggml.token_type: expected ", tokens.size(),
                 " entries (one per token), found ", raw.size());
        types.reserve(raw.size());
        for (size_t i = 0; i < raw.size(); ++i) {
            const double t = raw[i];
            if (t != std::floor(t) || t < 1 || t > 6)
                fail(file.path(), ": tokenizer.ggml.token_type[", i, "]: expected 1..6, found ", t);
            types.push_back(TokenType(int32_t(t)));
        }
    }
    try {
        return from_vocab(std::move(tokens), merges, std::move(types));
    } catch (const Error& e) {
        fail(file.path(), ": ", e.what());
    }
}

}  // namespace dsv4::text
