// dsv4 logits: raw little-endian float32 logits [n_tokens][n_vocab] for every position —
// the hook every correctness comparison uses. Row i is the prediction after tokens 0..i.
#include <cstdio>
#include <fstream>

#include "apps/app.h"

namespace dsv4::apps {

namespace {

std::vector<int32_t> parse_int_list(const std::string& flag, const std::string& s) {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t e = s.find(',', pos);
        if (e == std::string::npos) e = s.size();
        const std::string item = s.substr(pos, e - pos);
        try {
            size_t used = 0;
            const long long v = std::stoll(item, &used);
            if (used != item.size() || v < INT32_MIN || v > INT32_MAX) throw 0;
            out.push_back(int32_t(v));
        } catch (...) {
            fail(flag, ": expected integers separated by commas, found '", item, "'");
        }
        pos = e + 1;
    }
    return out;
}

}  // namespace

Runner add_logits(CLI::App& app) {
    auto* cmd = app.add_subcommand("logits", "write float32 logits for every position of a token list");
    struct Opts {
        ModelOptions mo;
        std::string tokens, text, out, split;
        bool special = false;
    };
    auto o = std::make_shared<Opts>();
    o->mo.add_to(*cmd, true);
    auto* t1 = cmd->add_option("--tokens", o->tokens, "comma-separated token ids");
    auto* t2 = cmd->add_option("--text", o->text, "text to tokenize (no BOS is added)");
    t1->excludes(t2);
    cmd->add_flag("--special", o->special, "parse special-token strings in --text");
    cmd->add_option("--out", o->out, "output file (float32 little-endian, [n_tokens][n_vocab])")->required();
    cmd->add_option("--split", o->split,
                    "evaluate in pieces of these lengths (comma-separated, the last repeats), as separate steps");
    return [o, cmd]() {
        if (o->tokens.empty() && o->text.empty()) fail("logits: give --tokens or --text");
        auto engine = o->mo.open_engine();
        std::vector<int32_t> ids;
        if (!o->text.empty()) {
            text::Tokenizer tok = text::Tokenizer::from_gguf(*engine->model().file);
            ids = tok.encode(o->text, o->special);
        } else {
            ids = parse_int_list("--tokens", o->tokens);
        }
        if (ids.empty()) fail("logits: the input has no tokens");
        const uint32_t V = engine->config().n_vocab;
        for (int32_t id : ids)
            if (id < 0 || uint32_t(id) >= V) fail("--tokens: token id ", id, " is outside the vocabulary [0, ", V, ")");
        uint64_t ctx = o->mo.ctx;
        if (cmd->count("--ctx") == 0) ctx = std::max<uint64_t>(ctx, ids.size());
        if (ids.size() > ctx)
            fail("the input has ", ids.size(), " tokens but the context (--ctx) is ", ctx, " tokens");
        auto session = engine->new_session(ctx);
        std::vector<float> logits(ids.size() * size_t(V));
        std::vector<int32_t> pieces = o->split.empty() ? std::vector<int32_t>{} : parse_int_list("--split", o->split);
        for (int32_t p : pieces)
            if (p <= 0) fail("--split: piece lengths must be positive, found ", p);
        size_t done = 0, k = 0;
        while (done < ids.size()) {
            size_t n = ids.size() - done;
            if (!pieces.empty()) n = std::min<size_t>(n, size_t(pieces[std::min(k++, pieces.size() - 1)]));
            session->eval(std::span<const int32_t>(ids.data() + done, n), logits.data() + done * V);
            done += n;
        }
        std::ofstream f(o->out, std::ios::binary);
        if (!f) fail("--out: cannot write ", o->out);
        f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
        if (!f) fail("--out: error writing ", o->out);
        write_stats_json(o->mo.stats_json, session->accounting(),
                         cat("\"n_tokens\": ", ids.size(), ", \"n_vocab\": ", V));
        std::fprintf(stderr, "dsv4 logits: %zu positions x %u logits -> %s\n", ids.size(), V, o->out.c_str());
        return 0;
    };
}

}  // namespace dsv4::apps
