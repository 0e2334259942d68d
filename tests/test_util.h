// Helpers shared by the test folders: temporary files, synthetic models, logits.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
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

// Writes a synthetic model once per distinct name and returns its path: the preset with
// `layers` layers (0: the preset's own) and `n_vocab` tokens, changed by `edit`, with the
// vocabulary `vocab` gives for the final vocabulary size (`edit` may change it).
// The same at a path of the caller's (written only if no file is there yet).
inline std::string synth_model_at(const std::string& path, const std::string& preset, uint32_t layers,
                                  uint32_t n_vocab, const std::function<model::Vocab(uint32_t)>& vocab,
                                  const std::function<void(model::Config&)>& edit, const std::string& types,
                                  uint64_t seed) {
    if (std::filesystem::exists(path)) return path;
    model::Config c = model::synth_config(preset, layers, n_vocab);
    if (edit) edit(c);
    model::synth_write(c, model::TypeMix::preset(types), vocab(c.n_vocab), seed, path);
    return path;
}
inline std::string synth_model_with_vocab(const std::string& name, const std::string& preset, uint32_t layers,
                                          uint32_t n_vocab, const std::function<model::Vocab(uint32_t)>& vocab,
                                          const std::function<void(model::Config&)>& edit,
                                          const std::string& types, uint64_t seed) {
    return synth_model_at(tmp_dir() + "/" + name + ".gguf", preset, layers, n_vocab, vocab, edit, types, seed);
}

// Writes a synthetic model (byte vocabulary) once per distinct name and returns its path.
inline std::string synth_model(const std::string& name, const std::string& preset,
                               const std::function<void(model::Config&)>& edit = {},
                               const std::string& types = "f32", uint64_t seed = 1) {
    const model::Vocab v = byte_vocab();
    return synth_model_with_vocab(name, preset, 0, uint32_t(v.tokens.size()), [&v](uint32_t) { return v; }, edit,
                                  types, seed);
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

// Bit-identical comparison of logits (V per position) with a useful message on failure.
inline void expect_same(const std::vector<float>& a, const std::vector<float>& b, size_t V, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
            FAIL() << what << ": first difference at position " << i / V << ", logit " << i % V << ": " << a[i]
                   << " vs " << b[i];
}

}  // namespace dsv4::test
