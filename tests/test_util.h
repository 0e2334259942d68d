// Helpers shared by the test folders: temporary files and synthetic models.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "dsv4/model.h"
#include "dsv4/runtime.h"
#include "dsv4/text.h"

namespace dsv4::test {

// A per-process scratch directory, removed at exit.
inline const std::string& tmp_dir() {
    static const std::string dir = [] {
        std::string d = (std::filesystem::temp_directory_path() / ("dsv4-test-" + std::to_string(getpid()))).string();
        std::filesystem::create_directories(d);
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                            ("dsv4-test-" + std::to_string(getpid())),
                                        ec);
        });
        return d;
    }();
    return dir;
}

inline model::Vocab byte_vocab() {
    text::Vocab v = text::builtin_byte_vocab();
    model::Vocab out;
    out.tokens = v.tokens;
    out.merges = v.merges;
    for (auto t : v.types) out.token_types.push_back(int32_t(t));
    out.bos = 256;
    out.eos = 257;
    return out;
}

// Writes a synthetic model (byte vocabulary) once per distinct name and returns its path.
inline std::string synth_model(const std::string& name, const std::string& preset,
                               const std::function<void(model::Config&)>& edit = {},
                               const std::string& types = "f32", uint64_t seed = 1) {
    const std::string path = tmp_dir() + "/" + name + ".gguf";
    if (std::filesystem::exists(path)) return path;
    model::Vocab v = byte_vocab();
    model::Config c = model::synth_config(preset, 0, uint32_t(v.tokens.size()));
    if (edit) edit(c);
    model::synth_write(c, model::TypeMix::preset(types), v, seed, path);
    return path;
}

// Deterministic pseudo-random tokens in [lo, hi).
inline std::vector<int32_t> random_tokens(size_t n, int32_t lo, int32_t hi, uint64_t seed = 7) {
    std::vector<int32_t> t(n);
    uint64_t s = seed * 2654435761u + 1;
    for (auto& x : t) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = lo + int32_t((s >> 33) % uint64_t(hi - lo));
    }
    return t;
}

inline runtime::EngineOptions cpu_options(Numerics n = Numerics::Plain, uint32_t chunk = 512) {
    runtime::EngineOptions o;
    o.backend = "cpu";
    o.backend_opt.numerics = n;
    o.backend_opt.prefill_chunk = chunk;
    return o;
}

// Logits of every position of `tokens`, evaluated in pieces of the given lengths (the last
// repeats; empty = one call).
inline std::vector<float> all_logits(runtime::Engine& e, const std::vector<int32_t>& tokens, uint64_t ctx,
                                     const std::vector<size_t>& pieces = {}) {
    auto s = e.new_session(ctx);
    const size_t V = e.config().n_vocab;
    std::vector<float> out(tokens.size() * V);
    size_t done = 0, k = 0;
    while (done < tokens.size()) {
        size_t n = tokens.size() - done;
        if (!pieces.empty()) n = std::min(n, pieces[std::min(k++, pieces.size() - 1)]);
        s->eval(std::span<const int32_t>(tokens.data() + done, n), out.data() + done * V);
        done += n;
    }
    return out;
}

inline int32_t argmax(const float* x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return int32_t(best);
}

}  // namespace dsv4::test
