// The CPU backend against llama.cpp's deepseek4 graph (node-llama-cpp, CPU build), on our
// synthetic F32 models in `plain` numerics (docs/validation.md, oracle 1): full logits at
// every position, max |diff| <= 1e-4, argmax identical everywhere, greedy continuations
// identical for 64 tokens. Several shapes: window smaller and larger than a chunk, 0/2/3
// hash layers, several indexer top_k, prompts where ratio-128 layers hold several rows and
// where the indexer selects.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.h"

using namespace dsv4;

namespace {

std::string node_dir() { return std::string(DSV4_SOURCE_DIR) + "/tools/node"; }

bool oracle_available() {
    return std::filesystem::exists(node_dir() + "/node_modules/node-llama-cpp") && std::system("node --version > /dev/null 2>&1") == 0;
}

// CI sets DSV4_REQUIRE_ORACLES=1: there a missing oracle is a failure, not a skip.
#define REQUIRE_ORACLE()                                                                               \
    do {                                                                                               \
        if (!oracle_available()) {                                                                     \
            if (std::getenv("DSV4_REQUIRE_ORACLES")) FAIL() << "node-llama-cpp is not installed in " << node_dir(); \
            GTEST_SKIP() << "node-llama-cpp not installed (run scripts/setup.sh)";                     \
        }                                                                                              \
    } while (0)

std::string write_tokens(const std::string& name, const std::vector<int32_t>& t) {
    const std::string p = test::tmp_dir() + "/" + name + ".json";
    std::ofstream f(p);
    f << "[";
    for (size_t i = 0; i < t.size(); ++i) f << (i ? "," : "") << t[i];
    f << "]";
    return p;
}

std::vector<float> llama_logits(const std::string& model, const std::vector<int32_t>& toks, const std::string& name) {
    const std::string tj = write_tokens(name, toks), out = test::tmp_dir() + "/" + name + ".llama.bin";
    const std::string cmd = "node " + node_dir() + "/llama_logits.mjs " + model + " " + tj + " " + out + " 2>" +
                            test::tmp_dir() + "/" + name + ".log";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out, std::ios::binary);
    std::vector<float> v((std::istreambuf_iterator<char>(f)), {});
    std::vector<float> r(v.size() / 1);
    std::ifstream f2(out, std::ios::binary | std::ios::ate);
    const size_t bytes = size_t(f2.tellg());
    r.resize(bytes / sizeof(float));
    f2.seekg(0);
    f2.read(reinterpret_cast<char*>(r.data()), std::streamsize(bytes));
    return r;
}

std::vector<int32_t> llama_greedy(const std::string& model, const std::vector<int32_t>& prompt, int n,
                                  const std::string& name) {
    const std::string tj = write_tokens(name, prompt), out = test::tmp_dir() + "/" + name + ".greedy.json";
    const std::string cmd = "node " + node_dir() + "/llama_logits.mjs " + model + " " + tj + " /dev/null --greedy " +
                            std::to_string(n) + " > " + out + " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    std::vector<int32_t> ids;
    for (char& ch : s)
        if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
    std::istringstream is(s);
    int32_t x;
    while (is >> x) ids.push_back(x);
    return ids;
}

struct Shape {
    std::string name;
    std::function<void(model::Config&)> edit;
    uint32_t chunk;
    size_t n_tokens;
};

void compare_with_llama(const Shape& sh) {
    const std::string model = test::synth_model("llama-" + sh.name, "tiny", sh.edit);
    auto e = runtime::Engine::open(model, test::cpu_options(Numerics::Plain, sh.chunk));
    const size_t V = e->config().n_vocab;
    const auto toks = test::random_tokens(sh.n_tokens, 0, 256, 101);
    const auto ours = test::all_logits(*e, toks, sh.n_tokens + 8);
    const auto ref = llama_logits(model, toks, sh.name);
    ASSERT_EQ(ours.size(), ref.size()) << "llama.cpp returned " << ref.size() / V << " positions";
    double maxd = 0;
    size_t max_at = 0, argmax_diff = 0, first_argmax_diff = SIZE_MAX;
    for (size_t p = 0; p < toks.size(); ++p) {
        for (size_t j = 0; j < V; ++j) {
            const double d = std::fabs(double(ours[p * V + j]) - ref[p * V + j]);
            if (!(d <= maxd)) maxd = d, max_at = p;
        }
        if (test::argmax(&ours[p * V], V) != test::argmax(&ref[p * V], V)) {
            ++argmax_diff;
            first_argmax_diff = std::min(first_argmax_diff, p);
        }
    }
    std::printf("[llama.cpp %s] %zu positions x %zu: max |diff| %.3g at position %zu, argmax mismatches %zu\n",
                sh.name.c_str(), toks.size(), V, maxd, max_at, argmax_diff);
    EXPECT_LE(maxd, 1e-4) << "at position " << max_at;
    EXPECT_EQ(argmax_diff, 0u) << "first at position " << first_argmax_diff;

    // Greedy continuation of the first 100 tokens: identical for 64 tokens.
    std::vector<int32_t> prompt(toks.begin(), toks.begin() + 100);
    const auto theirs = llama_greedy(model, prompt, 64, sh.name);
    auto s = e->new_session(256);
    s->eval(prompt);
    std::vector<int32_t> mine;
    const int32_t eos = 257;   // the byte vocabulary's end of sentence: llama.cpp stops there
    for (int i = 0; i < 64; ++i) {
        const int32_t t = test::argmax(s->logits().data(), V);
        if (t == eos) break;
        mine.push_back(t);
        s->eval(std::vector<int32_t>{t});
    }
    EXPECT_EQ(mine, theirs);
}

}  // namespace

// tiny: 4 layers (0,0,4,128), window 16 < chunk, 2 hash layers, top_k 8: 700 positions
// (5 ratio-128 rows; the indexer selects from position 35 on).
TEST(LlamaOracle, TinyWindowBelowChunk) {
    REQUIRE_ORACLE();
    compare_with_llama({"w16-h2-k8", {}, 512, 700});
}

// No hash layers, window 32 above the 8-token chunk, top_k 16, 2,100 positions.
// 16 indexer heads: with 8, a row whose every head is ReLU'd to 0 scores exactly 0, and
// such ties at the top-k boundary are broken differently by llama.cpp (seen at positions
// 260 and 1818 of this prompt: the 16th selected row scored exactly 0 and the next
// differences lasted exactly one window) — a tie, not a bug (docs/validation.md, pitfalls).
TEST(LlamaOracle, WindowAboveChunkNoHashLongPrompt) {
    REQUIRE_ORACLE();
    compare_with_llama({"w32-h0-k16", [](model::Config& c) {
                            c.n_hash_layer = 0;
                            c.n_swa = 32;
                            c.indexer_top_k = 16;
                            c.n_indexer_head = 16;
                        },
                        8, 2100});
}

// Three hash layers, 6 layers (two of each compressed kind), top_k 64, 640 positions.
TEST(LlamaOracle, ThreeHashLayersSixLayers) {
    REQUIRE_ORACLE();
    compare_with_llama({"l6-h3-k64", [](model::Config& c) {
                            c.n_layer = 6;
                            c.compress_ratio = {0, 0, 4, 128, 4, 128};
                            c.swiglu_clamp_exp.assign(6, 10.0f);
                            c.swiglu_clamp_shexp.assign(6, 10.0f);
                            c.n_hash_layer = 3;
                            c.indexer_top_k = 64;
                        },
                        100, 640});
}
