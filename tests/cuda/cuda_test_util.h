// Helpers of the CUDA backend's tests: device buffers, synthetic models, comparisons.
// Every test skips itself (GTEST_SKIP) when no CUDA device is present.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/backend.h"
#include "dsv4/kv.h"
#include "dsv4/model.h"
#include "test_util.h"

#define DSV4_REQUIRE_CUDA() \
    do { \
        if (!::dsv4::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
    } while (0)

namespace dsv4::cudatest {

template <typename T>
class DevVec {
public:
    explicit DevVec(size_t n = 0) { resize(n); }
    explicit DevVec(const std::vector<T>& h) {
        resize(h.size());
        upload(h);
    }
    ~DevVec() {
        if (p_) cudaFree(p_);
    }
    DevVec(const DevVec&) = delete;
    DevVec& operator=(const DevVec&) = delete;
    void resize(size_t n) {
        if (p_) cudaFree(p_);
        p_ = nullptr;
        n_ = n;
        if (n) {
            EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), cudaSuccess);
        }
    }
    void upload(const std::vector<T>& h) {
        ASSERT_LE(h.size(), n_);
        ASSERT_EQ(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
    std::vector<T> download() const {
        std::vector<T> h(n_);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        return h;
    }
    T* get() const { return p_; }
    size_t size() const { return n_; }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

// The helpers of every test folder (tests/test_util.h), under the names these tests use.
using test::argmax;
using test::expect_same;
using test::random_tokens;
using test::session;
using test::tmp_dir;

// A plain vocabulary of n tokens (no merges): the forward pass needs only its size.
inline model::Vocab plain_vocab(uint32_t n) {
    model::Vocab v;
    for (uint32_t i = 0; i < n; ++i) {
        v.tokens.push_back("<t" + std::to_string(i) + ">");
        v.token_types.push_back(1);
    }
    v.bos = 0;
    v.eos = 1;
    return v;
}

// Writes a synthetic model (plain vocabulary) once per name and returns its path.
inline std::string synth(const std::string& name, const std::string& preset, const std::string& mix,
                         uint32_t layers = 0, uint32_t n_vocab = 320,
                         const std::function<void(model::Config&)>& edit = {}) {
    return test::synth_model_with_vocab(name, preset, layers, n_vocab, plain_vocab, edit, mix, 1);
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
    for (auto& x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = lo + (hi - lo) * float((s >> 40) & 0xFFFFFF) / float(1 << 24);
    }
    return v;
}

// Logits of every position, evaluated in pieces of `piece` tokens (0: one call).
inline std::vector<float> all_logits(Backend& b, kv::SessionKV& kv, const std::vector<int32_t>& toks,
                                     size_t piece = 0) {
    const size_t V = b.config().n_vocab;
    std::vector<float> out(toks.size() * V);
    size_t done = 0;
    while (done < toks.size()) {
        const size_t n = piece ? std::min(piece, toks.size() - done) : toks.size() - done;
        b.forward_one(kv, std::span<const int32_t>(toks.data() + done, n), true, out.data() + done * V);
        done += n;
    }
    return out;
}

struct Diff {
    double max_rel = 0;      // max over positions of max|a-b| / max|b|
    double median_rel = 0;
    size_t worst_pos = 0;
    size_t argmax_same = 0, positions = 0;
};

inline Diff compare_logits(const std::vector<float>& got, const std::vector<float>& ref, size_t V) {
    Diff d;
    d.positions = ref.size() / V;
    std::vector<double> rel(d.positions);
    for (size_t p = 0; p < d.positions; ++p) {
        double md = 0, mr = 0;
        for (size_t i = 0; i < V; ++i) {
            const double a = got[p * V + i], b = ref[p * V + i];
            md = std::max(md, std::isnan(a) ? INFINITY : std::fabs(a - b));
            mr = std::max(mr, std::fabs(b));
        }
        rel[p] = md / std::max(mr, 1e-30);
        if (rel[p] > d.max_rel) {
            d.max_rel = rel[p];
            d.worst_pos = p;
        }
        if (argmax(&got[p * V], V) == argmax(&ref[p * V], V)) ++d.argmax_same;
    }
    std::vector<double> s = rel;
    std::sort(s.begin(), s.end());
    d.median_rel = s.empty() ? 0 : s[s.size() / 2];
    return d;
}

}  // namespace dsv4::cudatest
