// Vocabulary sources: the GPT-2 byte map, HF tokenizer.json, the built-in byte vocabulary,
// and the official pre-tokenizer regexes.
#include <array>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsv4/text.h"
#include "text/utf8.h"

namespace dsv4::text {

namespace {

struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};  // code points 0..323 cover every mapped value

    ByteMap() {
        to_byte.fill(-1);
        // Printable bytes stand for themselves; the other 68 take 256, 257, ... in byte order
        // (GPT-2's bytes_to_unicode), so every byte has a visible, non-space spelling.
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            to_cp[b] = printable ? uint32_t(b) : next++;
            to_byte[to_cp[b]] = int16_t(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) { return cp < 324 ? byte_map().to_byte[cp] : -1; }

std::string bytes_to_token_spelling(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) utf8::append(out, byte_to_codepoint(uint8_t(c)));
    return out;
}

const std::vector<std::string>& pre_tokenizer_regexes() {
    // Verbatim from DeepSeek's tokenizer.json (pre_tokenizer: Sequence of Split, behaviour
    // Isolated), after JSON unescaping: \r and \n below are the raw characters, as there.
    // tests/text/tokenizer_oracle_test.cpp checks them against the file.
    static const std::vector<std::string> r = {
        "\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
        "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*"
        "|\\s*[\r\n]+"
        "|\\s+(?!\\S)"
        "|\\s+",
    };
    return r;
}

Vocab load_hf_tokenizer_json(const std::string& path, size_t pad_to) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("tokenizer.json ", path, ": cannot open");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        fail("tokenizer.json ", path, ": not valid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
        fail("tokenizer.json ", path, ": expected an object with a \"model\" object");
    const auto& model = j["model"];
    if (model.contains("type") && model["type"] != "BPE")
        fail("tokenizer.json ", path, ": model.type: expected \"BPE\", found ", model["type"].dump());
    if (!model.contains("vocab") || !model["vocab"].is_object())
        fail("tokenizer.json ", path, ": model.vocab: expected an object of token -> id");
    if (!model.contains("merges") || !model["merges"].is_array())
        fail("tokenizer.json ", path, ": model.merges: expected an array");

    // id -> (token, type); a map first because ids may come in any order and with gaps.
    std::map<int64_t, std::pair<std::string, TokenType>> by_id;
    auto put = [&](int64_t id, const std::string& tok, TokenType type, const char* where) {
        if (id < 0 || id > int64_t(INT32_MAX))
            fail("tokenizer.json ", path, ": ", where, " \"", tok, "\": bad id ", id);
        auto [it, fresh] = by_id.try_emplace(id, tok, type);
        if (!fresh) {
            if (it->second.first != tok)
                fail("tokenizer.json ", path, ": id ", id, " is both \"", it->second.first, "\" and \"", tok, "\"");
            it->second.second = type;  // added_tokens refine the kind of a vocab entry
        }
    };
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it.value().is_number_integer())
            fail("tokenizer.json ", path, ": model.vocab[\"", it.key(), "\"]: expected an integer id");
        put(it.value().get<int64_t>(), it.key(), TokenType::Normal, "model.vocab");
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const auto& a : j["added_tokens"]) {
            if (!a.is_object() || !a.contains("id") || !a.contains("content"))
                fail("tokenizer.json ", path, ": added_tokens: expected objects with id and content");
            const bool special = a.value("special", false);
            put(a["id"].get<int64_t>(), a["content"].get<std::string>(),
                special ? TokenType::Control : TokenType::UserDefined, "added_tokens");
        }
    }

    Vocab v;
    const size_t n = std::max(by_id.empty() ? size_t(0) : size_t(by_id.rbegin()->first) + 1, pad_to);
    v.tokens.resize(n);
    v.types.assign(n, TokenType::Unused);
    std::vector<bool> have(n, false);
    for (auto& [id, tt] : by_id) {
        v.tokens[size_t(id)] = tt.first;
        v.types[size_t(id)] = tt.second;
        have[size_t(id)] = true;
    }
    for (size_t id = 0; id < n; ++id)
        if (!have[id]) v.tokens[id] = cat("<｜place▁holder▁no▁", id, "｜>");

    v.merges.reserve(model["merges"].size());
    for (const auto& m : model["merges"]) {
        if (m.is_string()) {
            v.merges.push_back(m.get<std::string>());
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        } else {
            fail("tokenizer.json ", path, ": model.merges[", v.merges.size(),
                 "]: expected \"a b\" or [\"a\", \"b\"], found ", m.dump());
        }
    }

    // Informative: the Split regexes, so that tests can check ours against the file's.
    std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& p) {
        if (!p.is_object()) return;
        if (p.value("type", "") == "Sequence" && p.contains("pretokenizers"))
            for (const auto& q : p["pretokenizers"]) walk(q);
        if (p.value("type", "") == "Split" && p.contains("pattern") && p["pattern"].contains("Regex"))
            v.pre_tokenizer_regexes.push_back(p["pattern"]["Regex"].get<std::string>());
    };
    if (j.contains("pre_tokenizer")) walk(j["pre_tokenizer"]);
    return v;
}

Vocab builtin_byte_vocab() {
    Vocab v;
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(bytes_to_token_spelling(std::string(1, char(b))));
        v.types.push_back(TokenType::Normal);
    }
    for (std::string_view s : {kBos, kEos, kUser, kAssistant, kThinkOpen, kThinkClose, kDsml}) {
        v.tokens.emplace_back(s);
        v.types.push_back(TokenType::Control);
    }
    // A few of DeepSeek's own first merges (in their order), enough for English to merge.
    static const char* merges[] = {"Ġ t",   "Ġ a", "i n", "h e", "e r", "o n", "r e", "e n", "a t", "Ġ s",
                                   "Ġt he", "o r", "e s", "Ġ c", "a n", "Ġ o", "i s", "i t", "Ġ w", "in g"};
    for (const char* m : merges) {
        std::string s = m;
        const size_t sp = s.find(' ');
        v.merges.push_back(s);
        v.tokens.push_back(s.substr(0, sp) + s.substr(sp + 1));
        v.types.push_back(TokenType::Normal);
    }
    return v;
}

}  // namespace dsv4::text
