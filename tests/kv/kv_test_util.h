// Configs and fillers shared by the kv tests. Configs are built in code (no GGUF).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dsv4/kv.h"

namespace dsv4::kv::test {

// A small model with the given schedule; only the fields the KV layer reads matter.
inline model::Config tiny_config(std::vector<uint32_t> ratios, uint32_t head_dim = 64, uint32_t indexer_dim = 32,
                                 uint32_t n_swa = 16, uint32_t n_vocab = 100) {
    model::Config c;
    c.name = "kv-test";
    c.n_layer = uint32_t(ratios.size());
    c.head_dim = head_dim;
    c.indexer_head_dim = indexer_dim;
    c.n_swa = n_swa;
    c.n_vocab = n_vocab;
    c.compress_ratio = std::move(ratios);
    return c;
}

// DeepSeek V4 Flash shapes (model-spec §1.1–1.2): 43 layers, ratio 0 for layers 0-1, then
// 4 for even and 128 for odd layers.
inline model::Config flash_config() {
    std::vector<uint32_t> ratios(43);
    for (uint32_t il = 0; il < 43; ++il) ratios[il] = il < 2 ? 0 : (il % 2 == 0 ? 4 : 128);
    model::Config c = tiny_config(std::move(ratios), 512, 128, 128, 129280);
    c.name = "flash-shapes";
    return c;
}

// Factory with page-sized chunks, so growth crosses many commit points in small tests.
inline RegionFactory small_chunk_factory() {
    return [](uint64_t reserve, Budget* budget, std::string label) {
        return make_host_region(reserve, budget, std::move(label), 4096);
    };
}

inline void fill_random(float* p, uint64_t n, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> d(-4.0f, 4.0f);
    for (uint64_t i = 0; i < n; ++i) p[i] = d(rng);
}

}  // namespace dsv4::kv::test
