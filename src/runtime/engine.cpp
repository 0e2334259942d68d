#include <algorithm>
#include <cstdio>
#include <unistd.h>
#include <xxhash.h>

#include "dsv4/runtime.h"

namespace dsv4::runtime {

namespace {

uint64_t compute_identity(const model::Model& m) {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    const model::Config& c = m.config;
    const uint32_t dims[] = {c.n_layer, c.n_embd, c.n_vocab, c.n_head, c.head_dim, c.n_rot, c.n_out_group,
                             c.q_lora_rank, c.o_lora_rank, c.n_expert, c.n_expert_used, c.n_ff_exp,
                             c.n_hash_layer, c.n_swa, c.n_indexer_head, c.indexer_head_dim, c.indexer_top_k, c.n_hc};
    XXH3_64bits_update(st, dims, sizeof dims);
    XXH3_64bits_update(st, c.compress_ratio.data(), c.compress_ratio.size() * sizeof(uint32_t));
    for (const auto& t : m.file->tensors()) {
        XXH3_64bits_update(st, t.name.data(), t.name.size());
        XXH3_64bits_update(st, &t.type, sizeof t.type);
        XXH3_64bits_update(st, t.ne.data(), t.ne.size() * sizeof(uint64_t));
        // A sample of the bytes tells two random-weight files of the same shape apart
        // without reading gigabytes.
        XXH3_64bits_update(st, t.data, std::min<uint64_t>(t.nbytes, 256));
        if (t.nbytes > 512) XXH3_64bits_update(st, t.data + t.nbytes - 256, 256);
    }
    const uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

}  // namespace

Engine::Engine(std::unique_ptr<model::Model> model, const EngineOptions& opt)
    : model_(std::move(model)), opt_(opt), budget_(opt.kv_budget) {
    identity_ = compute_identity(*model_);
    std::string why;
    if (opt_.backend == "cuda" || (opt_.backend == "auto" && cuda_available())) {
        backend_ = make_cuda_backend(*model_, opt_.backend_opt, &why);
        if (!backend_ && opt_.backend == "cuda") fail("--backend cuda: ", why);
    }
    if (!backend_) {
        if (opt_.backend != "auto" && opt_.backend != "cpu" && opt_.backend != "cuda")
            fail("--backend: expected cpu, cuda or auto, found '", opt_.backend, "'");
        backend_ = make_cpu_backend(*model_, opt_.backend_opt);
    }
}

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::open(const std::string& path, const EngineOptions& opt) {
    return std::make_unique<Engine>(model::Model::load(path), opt);
}

std::unique_ptr<Session> Engine::new_session(uint64_t ctx) { return std::make_unique<Session>(*this, ctx); }

Session::Session(Engine& engine, uint64_t ctx) : engine_(engine) {
    if (ctx == 0) fail("--ctx must be at least 1");
    const kv::Layout layout = kv::Layout::make(engine.config(), ctx, engine.backend().options().prefill_chunk);
    kv_ = std::make_unique<kv::SessionKV>(engine.config(), layout, engine.options().kv_opt, &engine.budget(),
                                          engine.backend().region_factory());
}

Session::~Session() = default;

uint32_t Session::prefill_chunk() const { return engine_.backend().options().prefill_chunk; }

void Session::eval(std::span<const int32_t> tokens, float* all_logits) { eval_as(tokens, all_logits, false); }

void Session::eval_prompt(std::span<const int32_t> tokens, float* all_logits) { eval_as(tokens, all_logits, true); }

void Session::eval_as(std::span<const int32_t> tokens, float* all_logits, bool prompt) {
    if (tokens.empty()) fail("nothing to evaluate: empty token list");
    const uint32_t V = engine_.config().n_vocab;
    logits_.resize(V);
    if (all_logits) {
        engine_.backend().forward_one(*kv_, tokens, true, all_logits, prompt);
        std::copy(all_logits + (tokens.size() - 1) * V, all_logits + tokens.size() * V, logits_.begin());
    } else {
        engine_.backend().forward_one(*kv_, tokens, false, logits_.data(), prompt);
    }
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

int32_t Session::eval_greedy(std::span<const int32_t> tokens, int32_t exclude) {
    if (tokens.empty()) fail("nothing to evaluate: empty token list");
    const int32_t id = engine_.backend().forward_greedy(*kv_, tokens, exclude);
    logits_.clear();
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    return id;
}

size_t Session::sync(std::span<const int32_t> prompt) {
    if (prompt.size() >= ctx() + 1)
        fail("the prompt has ", prompt.size(), " tokens but the context holds ", ctx());
    // Reuse the live timeline only when the prompt extends it: compressor state cannot be
    // rewound (model-spec §6.4), so a divergence behind the live end means a new prefill.
    const bool extends = tokens_.size() <= prompt.size() && std::equal(tokens_.begin(), tokens_.end(), prompt.begin());
    if (!extends) reset();
    size_t reused = tokens_.size();
    if (reused == prompt.size() && !logits_.empty()) return reused;
    if (reused == prompt.size()) {   // nothing new to evaluate, yet no logits: re-run the last token
        reset();
        reused = 0;
    }
    eval_prompt(prompt.subspan(reused));
    return reused;
}

void Session::reset() {
    kv_->reset();
    tokens_.clear();
    logits_.clear();
}

std::vector<uint8_t> Session::save() const {
    std::vector<uint8_t> out;
    kv::save_snapshot(*kv_, engine_.model_identity(), tokens_, logits_, out);
    return out;
}

void Session::load(const std::vector<uint8_t>& data, const std::string& label) {
    kv::SnapshotData d = kv::load_snapshot(*kv_, engine_.model_identity(), data.data(), data.size(), label);
    tokens_ = std::move(d.tokens);
    logits_ = std::move(d.logits);
}

void Session::save_file(const std::string& path) const {
    kv::save_snapshot_file(*kv_, engine_.model_identity(), tokens_, logits_, path);
}

void Session::load_file(const std::string& path) {
    kv::SnapshotData d = kv::load_snapshot_file(*kv_, engine_.model_identity(), path);
    tokens_ = std::move(d.tokens);
    logits_ = std::move(d.logits);
}

uint64_t rss_bytes() {
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &size, &resident);
    std::fclose(f);
    return n == 2 ? resident * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace dsv4::runtime
