// dsv4 run (one shot), dsv4 chat (interactive, the live KV reused every turn) and
// dsv4 tokenize (ids as JSON).
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "apps/generate.h"

namespace dsv4::apps {

namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

text::ThinkMode think_mode(const SamplingOptions& so, uint64_t ctx) {
    return text::think_mode_for_context(so.nothink ? text::ThinkMode::None : text::ThinkMode::High, ctx);
}

// Text from the command line must be valid UTF-8: say where it is not.
void check_utf8(const std::string& s, const char* what) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (!ok) fail(what, ": invalid UTF-8 at byte ", i);
        i += n;
    }
}

}  // namespace

Runner add_run(CLI::App& app) {
    auto* cmd = app.add_subcommand("run", "generate a reply to one prompt");
    struct Opts {
        ModelOptions mo;
        SamplingOptions so;
        std::string prompt, prompt_file;
        bool raw = false;
    };
    auto o = std::make_shared<Opts>();
    o->mo.add_to(*cmd, false);
    o->so.add_to(*cmd);
    cmd->add_option("-p,--prompt", o->prompt, "the prompt");
    cmd->add_option("--prompt-file", o->prompt_file, "read the prompt from a file");
    cmd->add_flag("--raw", o->raw, "no chat template: the prompt is raw text");
    return [o]() {
        std::string prompt = o->prompt;
        if (!o->prompt_file.empty()) {
            std::ifstream f(o->prompt_file);
            if (!f) fail("--prompt-file: cannot read ", o->prompt_file);
            prompt.assign(std::istreambuf_iterator<char>(f), {});
        }
        if (prompt.empty()) fail("run: give a prompt with -p or --prompt-file");
        check_utf8(prompt, "the prompt");
        auto engine = o->mo.open_engine();
        text::Tokenizer tok = text::Tokenizer::from_gguf(*engine->model().file);
        const std::vector<int32_t> ids =
            o->raw ? tok.encode(prompt) : text::encode_single_turn(tok, o->so.system, prompt, think_mode(o->so, o->mo.ctx));
        if (ids.size() >= o->mo.ctx)
            fail("the prompt has ", ids.size(), " tokens but the context (--ctx) is ", o->mo.ctx, " tokens");
        auto session = engine->new_session(o->mo.ctx);
        Sampler sampler(o->so.params());
        std::signal(SIGINT, on_sigint);
        GenerationStats g = generate(*session, tok, ids, sampler, o->so.n_predict, [](const std::string& t) {
            std::fwrite(t.data(), 1, t.size(), stdout);
            std::fflush(stdout);
        }, &g_interrupted);
        std::printf("\n");
        std::fprintf(stderr, "%s\n", summary_line(g, session->accounting()).c_str());
        write_stats_json(o->mo.stats_json, session->accounting(),
                         cat("\"prompt_tokens\": ", g.prompt_tokens, ", \"generated_tokens\": ", g.generated,
                             ", \"prefill_tps\": ", g.prefill_s > 0 ? g.prompt_tokens / g.prefill_s : 0.0,
                             ", \"decode_tps\": ", g.decode_s > 0 ? g.generated / g.decode_s : 0.0));
        return 0;
    };
}

Runner add_chat(CLI::App& app) {
    auto* cmd = app.add_subcommand("chat", "interactive chat; each turn extends the live KV");
    struct Opts {
        ModelOptions mo;
        SamplingOptions so;
    };
    auto o = std::make_shared<Opts>();
    o->mo.add_to(*cmd, false);
    o->so.add_to(*cmd);
    return [o]() {
        auto engine = o->mo.open_engine();
        text::Tokenizer tok = text::Tokenizer::from_gguf(*engine->model().file);
        auto session = engine->new_session(o->mo.ctx);
        Sampler sampler(o->so.params());
        std::signal(SIGINT, on_sigint);   // Ctrl-C stops a generation, not the program
        const text::ThinkMode mode = think_mode(o->so, o->mo.ctx);
        const bool tty = isatty(STDIN_FILENO);
        bool first = true, ended_with_eos = true;
        std::string line;
        for (;;) {
            if (tty) std::fprintf(stderr, "dsv4> ");
            g_interrupted = false;
            if (!std::getline(std::cin, line)) break;
            if (line == "/quit" || line == "/exit") break;
            if (line.empty()) continue;
            try {
                check_utf8(line, "input");
                std::vector<int32_t> ids;
                if (first) {
                    ids = text::encode_single_turn(tok, o->so.system, line, mode);
                } else {
                    // Only the new turn is appended: the KV of everything before is live.
                    if (!ended_with_eos) ids.push_back(tok.special().eos);
                    ids.push_back(tok.require_special(text::kUser));
                    tok.encode_append(line, false, ids);
                    ids.push_back(tok.require_special(text::kAssistant));
                    ids.push_back(tok.require_special(mode == text::ThinkMode::None ? text::kThinkClose
                                                                                    : text::kThinkOpen));
                }
                GenerationStats g = generate(*session, tok, ids, sampler, o->so.n_predict, [](const std::string& t) {
                    std::fwrite(t.data(), 1, t.size(), stdout);
                    std::fflush(stdout);
                }, &g_interrupted);
                g.reused_tokens = session->tokens().size() - g.generated - ids.size();
                std::printf("\n");
                std::fprintf(stderr, "%s%s\n", g_interrupted ? "[interrupted] " : "",
                             summary_line(g, session->accounting()).c_str());
                // The EOS that ended the turn was sampled but not evaluated: the next turn adds it.
                ended_with_eos = false;
                first = false;
            } catch (const Error& e) {
                std::fprintf(stderr, "dsv4: error: %s\n", e.what());   // chat reports and continues
            }
        }
        write_stats_json(o->mo.stats_json, session->accounting());
        return 0;
    };
}

Runner add_tokenize(CLI::App& app) {
    auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
    struct Opts {
        std::string model, text, file;
        bool special = false;
    };
    auto o = std::make_shared<Opts>();
    cmd->add_option("-m,--model", o->model, "GGUF file whose tokenizer to use (default: the built-in model)");
    auto* a = cmd->add_option("--text", o->text, "text to tokenize");
    auto* b = cmd->add_option("--file", o->file, "file to tokenize");
    a->excludes(b);
    cmd->add_flag("--special", o->special, "parse special-token strings");
    return [o, cmd]() {
        std::string input = o->text;
        if (!o->file.empty()) {
            std::ifstream f(o->file, std::ios::binary);
            if (!f) fail("--file: cannot read ", o->file);
            input.assign(std::istreambuf_iterator<char>(f), {});
        } else if (cmd->count("--text") == 0) {
            fail("tokenize: give --text or --file");
        }
        const std::string path = o->model.empty() ? default_model_path() : o->model;
        auto file = gguf::File::open(path);
        text::Tokenizer tok = text::Tokenizer::from_gguf(*file);
        const std::vector<int32_t> ids = tok.encode(input, o->special);
        std::string out = "[";
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
        out += "]\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    };
}

}  // namespace dsv4::apps
