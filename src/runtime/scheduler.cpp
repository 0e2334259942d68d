// The Scheduler: resident sessions with prefix reuse, LRU eviction to disk snapshots,
// batched decode with chunked prefill interleaved (include/dsv4/scheduler.h).
//
// One worker thread owns the Engine. Each iteration it admits queued requests (assigning
// each a session: the longest resident prefix, a disk snapshot that is longer, or a fresh
// session), then runs one step: a single Backend::forward with one token per decoding
// request and prompt chunks of the requests still in prefill.
#include "dsv4/scheduler.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>

namespace dsv4::runtime {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
        case FinishReason::Error: return "error";
    }
    return "?";
}

bool Job::wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return done_.load(); });
    return done_;
}

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool is_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Whether a timeline (resident or on disk) can start `prompt`: a prefix of it, and when it is
// the whole prompt, with the next-token logits to sample the first token from.
bool serves(const std::vector<int32_t>& tokens, bool has_logits, const std::vector<int32_t>& prompt) {
    return is_prefix(tokens, prompt) && (has_logits || tokens.size() < prompt.size());
}

struct Slot {
    std::unique_ptr<kv::SessionKV> kv;
    std::vector<int32_t> tokens;   // the timeline whose KV is written
    // next-token logits after `tokens`; empty when none (a fresh session, or its last step
    // was a greedy one that took only the id): such a slot serves only prompts extending it
    std::vector<float> logits;
    uint64_t last_used = 0;
    bool busy = false;
};

struct DiskEntry {
    std::string path;
    std::vector<int32_t> tokens;
    uint64_t bytes = 0;
    uint64_t last_used = 0;
    bool has_logits = true;   // false: serves only prompts that extend `tokens`
};

struct Active {
    std::shared_ptr<Job> job;
    Slot* slot = nullptr;
    size_t prompt_pos = 0;       // prompt[0, prompt_pos) is in the slot
    bool decoding = false;
    int32_t next_token = -1;     // decoding: the token to evaluate this step
    int32_t greedy_id = -1;      // the backend's greedy id after an id-only step (see step())
    Sampler sampler;
    bool greedy_next = false;
    size_t generated = 0;
    Clock::time_point first_token{};
    bool finished = false;
    explicit Active(const SamplerParams& p) : sampler(p) {}
};

std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

}  // namespace

struct Scheduler::Impl {
    Engine& engine;
    SchedulerOptions opt;

    // queue (shared with submitters)
    mutable std::mutex qmu;
    std::condition_variable qcv;
    std::deque<std::shared_ptr<Job>> pending;
    size_t n_inflight = 0;   // submitted and not yet completed (queued + active)
    bool stopping = false;

    // owned by the worker thread
    std::vector<std::unique_ptr<Slot>> slots;
    std::vector<DiskEntry> disk;
    std::list<Active> active;
    uint64_t tick = 0;
    std::deque<std::tuple<Clock::time_point, uint64_t, uint64_t>> window;   // (t, prefill, decode tokens)

    // published state
    mutable std::mutex smu;
    SchedulerStats st;
    std::vector<std::vector<int32_t>> resident_snapshot, disk_snapshot;

    std::thread worker;

    Impl(Engine& e, const SchedulerOptions& o) : engine(e), opt(o) {}

    // ---- stats -------------------------------------------------------------------------
    template <typename F>
    void count(F&& f) {
        std::lock_guard<std::mutex> l(smu);
        f(st);
    }

    void publish() {
        kv::Accounting acc;
        for (auto& s : slots) acc += s->kv->accounting();
        uint64_t disk_bytes = 0;
        for (auto& d : disk) disk_bytes += d.bytes;
        const auto now = Clock::now();
        while (!window.empty() && now - std::get<0>(window.front()) > std::chrono::seconds(10)) window.pop_front();
        double ptps = 0, dtps = 0;
        if (window.size() >= 2) {
            const double span = secs(std::get<0>(window.back()) - std::get<0>(window.front()));
            uint64_t p = 0, d = 0;
            for (size_t i = 1; i < window.size(); ++i) p += std::get<1>(window[i]), d += std::get<2>(window[i]);
            if (span > 0) ptps = p / span, dtps = d / span;
        }
        size_t queued = 0;
        {
            std::lock_guard<std::mutex> l(qmu);
            queued = pending.size();
        }
        std::lock_guard<std::mutex> l(smu);
        st.kv = acc;
        st.kv_budget_used = engine.budget().used();
        st.kv_budget_limit = engine.budget().limit();
        st.sessions_resident = slots.size();
        st.sessions_on_disk = disk.size();
        st.disk_bytes = disk_bytes;
        st.active = active.size();
        st.queued = queued;
        st.prefill_tps = ptps;
        st.decode_tps = dtps;
        resident_snapshot.clear();
        for (auto& s : slots) resident_snapshot.push_back(s->tokens);
        disk_snapshot.clear();
        for (auto& d : disk) disk_snapshot.push_back(d.tokens);
    }

    // ---- disk tier ---------------------------------------------------------------------
    std::string disk_path(const std::vector<int32_t>& tokens) const {
        const uint64_t h = XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
        return (fs::path(opt.disk_dir) / (hex64(h) + ".kv")).string();
    }

    void remove_disk_entry(size_t i) {
        std::error_code ec;
        fs::remove(disk[i].path, ec);
        disk.erase(disk.begin() + long(i));
        count([](SchedulerStats& s) { ++s.disk_deletes; });
    }

    // Snapshots already in the directory (a previous run with the same model).
    void index_disk_dir() {
        if (opt.disk_dir.empty()) return;
        std::error_code ec;
        fs::create_directories(opt.disk_dir, ec);
        if (ec) fail("--kv-disk-dir: cannot create ", opt.disk_dir, ": ", ec.message());
        if (!opt.load_disk_index) return;
        for (const auto& de : fs::directory_iterator(opt.disk_dir, ec)) {
            if (!de.is_regular_file() || de.path().extension() != ".kv") continue;
            std::ifstream f(de.path(), std::ios::binary);
            uint8_t h[kv::kSnapshotHeaderBytes];
            if (!f.read(reinterpret_cast<char*>(h), sizeof h)) continue;
            auto u32 = [&](size_t o) { uint32_t v; std::memcpy(&v, h + o, 4); return v; };
            auto u64 = [&](size_t o) { uint64_t v; std::memcpy(&v, h + o, 8); return v; };
            if (std::memcmp(h, kv::kSnapshotMagic, 8) != 0 || u32(8) != kv::kSnapshotVersion) continue;
            if (u64(16) != engine.model_identity() || u32(12) != engine.config().n_layer) continue;
            const uint64_t n = u64(48);
            if (n == 0 || n >= opt.ctx) continue;
            f.seekg(std::streamoff(kv::kSnapshotHeaderBytes + 4ull * u32(12)));
            DiskEntry e;
            e.path = de.path().string();
            e.tokens.resize(n);
            if (!f.read(reinterpret_cast<char*>(e.tokens.data()), std::streamsize(n * 4))) continue;
            e.bytes = de.file_size(ec);
            e.last_used = ++tick;
            e.has_logits = u32(36) != 0;   // n_logits
            disk.push_back(std::move(e));
        }
    }

    // Saves a slot's timeline to disk (when there is a disk tier and something to save).
    void save_to_disk(Slot& s) {
        if (opt.disk_dir.empty() || s.tokens.empty()) return;
        const std::string path = disk_path(s.tokens);
        for (auto& d : disk)
            if (d.path == path && d.tokens == s.tokens) {   // already there
                d.last_used = ++tick;
                return;
            }
        try {
            kv::save_snapshot_file(*s.kv, engine.model_identity(), s.tokens, s.logits, path);
        } catch (const Error& e) {
            std::fprintf(stderr, "dsv4 serve: cannot save an evicted session: %s\n", e.what());
            return;
        }
        for (size_t i = 0; i < disk.size(); ++i)
            if (disk[i].path == path) {
                disk.erase(disk.begin() + long(i));
                break;
            }
        DiskEntry e;
        e.path = path;
        e.tokens = s.tokens;
        std::error_code ec;
        e.bytes = fs::file_size(path, ec);
        e.last_used = ++tick;
        e.has_logits = !s.logits.empty();
        disk.push_back(std::move(e));
        count([](SchedulerStats& st) { ++st.disk_saves; });
        if (opt.disk_max_bytes) {
            uint64_t total = 0;
            for (auto& d : disk) total += d.bytes;
            while (total > opt.disk_max_bytes && disk.size() > 1) {
                size_t lru = 0;
                for (size_t i = 1; i + 1 < disk.size(); ++i)   // never the file just written (last)
                    if (disk[i].last_used < disk[lru].last_used) lru = i;
                total -= disk[lru].bytes;
                remove_disk_entry(lru);
            }
        }
    }

    // ---- resident sessions -------------------------------------------------------------
    // Saves the least recently used idle session to disk and releases it. False when no
    // session is idle.
    bool evict_lru() {
        long victim = -1;
        for (size_t i = 0; i < slots.size(); ++i)
            if (!slots[i]->busy && (victim < 0 || slots[i]->last_used < slots[size_t(victim)]->last_used))
                victim = long(i);
        if (victim < 0) return false;
        save_to_disk(*slots[size_t(victim)]);
        slots.erase(slots.begin() + victim);
        count([](SchedulerStats& s) { ++s.evictions; });
        return true;
    }

    // An empty session, evicting idle ones for room (session limit, KV budget). nullptr
    // and `why` when nothing is left to evict.
    Slot* fresh_slot(std::string* why) {
        for (auto& s : slots)
            if (!s->busy && s->tokens.empty()) return s.get();
        while (slots.size() >= opt.max_sessions)
            if (!evict_lru()) {
                *why = cat("all ", slots.size(), " resident sessions are busy");
                return nullptr;
            }
        const kv::Layout layout = kv::Layout::make(engine.config(), opt.ctx, engine.backend().options().prefill_chunk);
        for (;;) {
            try {
                auto s = std::make_unique<Slot>();
                s->kv = std::make_unique<kv::SessionKV>(engine.config(), layout, engine.options().kv_opt,
                                                        &engine.budget(), engine.backend().region_factory());
                slots.push_back(std::move(s));
                return slots.back().get();
            } catch (const Error& e) {
                if (!evict_lru()) {
                    *why = e.what();
                    return nullptr;
                }
            }
        }
    }

    // Restores a disk snapshot into an empty slot (growing it first, evicting for room).
    // False (the slot left empty) when it cannot be done.
    bool restore(Slot& s, size_t entry) {
        DiskEntry& d = disk[entry];
        for (;;) {
            kv::Status st = s.kv->ensure_tokens(d.tokens.size());
            if (st) break;
            if (!evict_lru()) return false;
        }
        try {
            kv::SnapshotData data = kv::load_snapshot_file(*s.kv, engine.model_identity(), d.path);
            s.tokens = std::move(data.tokens);
            s.logits = std::move(data.logits);
        } catch (const Error& e) {
            std::fprintf(stderr, "dsv4 serve: dropping an unusable KV snapshot: %s\n", e.what());
            s.kv->reset();
            s.tokens.clear();
            s.logits.clear();
            remove_disk_entry(entry);
            return false;
        }
        d.last_used = ++tick;   // the file stays: a cache for later requests with this prefix
        count([](SchedulerStats& st) { ++st.disk_restores; });
        return true;
    }

    // ---- requests ----------------------------------------------------------------------
    void complete(const std::shared_ptr<Job>& job) {
        if (job->req_.on_finish) {
            try {
                job->req_.on_finish(job->result_);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "dsv4 serve: on_finish: %s\n", e.what());
            }
        }
        {
            std::lock_guard<std::mutex> l(job->mu_);
            job->done_ = true;
        }
        job->cv_.notify_all();
        const JobResult& r = job->result_;
        count([&](SchedulerStats& s) {
            ++s.requests_finished;
            if (r.finish == FinishReason::Error) ++s.requests_failed;
            if (r.finish == FinishReason::Cancelled) ++s.requests_cancelled;
        });
    }

    // A job that never got a session.
    void reject(const std::shared_ptr<Job>& job, FinishReason f, ErrorKind k, std::string msg) {
        job->result_.finish = f;
        job->result_.error_kind = k;
        job->result_.error = std::move(msg);
        {
            std::lock_guard<std::mutex> l(qmu);
            --n_inflight;
        }
        complete(job);
    }

    void finish(Active& a, FinishReason f, ErrorKind k = ErrorKind::None, std::string msg = {}) {
        if (a.finished) return;
        a.finished = true;
        JobResult& r = a.job->result_;
        r.finish = f;
        r.error_kind = k;
        r.error = std::move(msg);
        r.completion_tokens = a.generated;
        if (a.generated) r.decode_s = secs(Clock::now() - a.first_token);
        a.slot->busy = false;
        a.slot->last_used = ++tick;
        {
            std::lock_guard<std::mutex> l(qmu);
            --n_inflight;
        }
        complete(a.job);
    }

    // Samples from the slot's logits (or takes the backend's greedy id when the step was
    // id-only) and hands the token to the request.
    void sample_next(Active& a) {
        GenerationRequest& req = a.job->req_;
        const std::vector<float>& logits = a.slot->logits;
        int32_t t;
        if (logits.empty()) {
            t = a.greedy_id;
            if (t < 0)   // (never: every path to here leaves logits or an id)
                return finish(a, FinishReason::Error, ErrorKind::Internal, "no next-token logits or id to sample from");
        } else if (a.greedy_next) {
            SamplerParams p = a.sampler.params();
            p.temperature = 0;
            t = a.sampler.sample_with(logits, p);
        } else {
            t = a.sampler.sample(logits);
        }
        if (a.generated == 0) {
            a.first_token = Clock::now();
            a.job->result_.ttft_s = secs(a.first_token - a.job->submitted_);
        }
        if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), t) != req.stop_tokens.end())
            return finish(a, FinishReason::Stop);
        ++a.generated;
        count([](SchedulerStats& s) { ++s.completion_tokens; });
        TokenAction act;
        if (req.on_token) {
            try {
                act = req.on_token(t);
            } catch (const std::exception& e) {
                return finish(a, FinishReason::Error, ErrorKind::Internal, cat("token callback: ", e.what()));
            }
        }
        if (act.stop) return finish(a, FinishReason::Stop);
        if (a.generated >= req.max_tokens) return finish(a, FinishReason::Length);
        if (a.slot->tokens.size() >= opt.ctx) return finish(a, FinishReason::Length);   // no room to evaluate it
        a.greedy_next = act.greedy_next;
        a.next_token = t;
        a.decoding = true;
    }

    void admit(const std::shared_ptr<Job>& job) {
        GenerationRequest& req = job->req_;
        JobResult& r = job->result_;
        r.prompt_tokens = req.prompt.size();
        r.queue_s = secs(Clock::now() - job->submitted_);
        count([&](SchedulerStats& s) { s.prompt_tokens += req.prompt.size(); });
        if (job->cancelled()) return reject(job, FinishReason::Cancelled, ErrorKind::None, "");
        if (req.prompt.empty()) return reject(job, FinishReason::Error, ErrorKind::InvalidRequest, "empty prompt");
        if (req.prompt.size() >= opt.ctx)
            return reject(job, FinishReason::Error, ErrorKind::InvalidRequest,
                          cat("the prompt has ", req.prompt.size(), " tokens but the context is ", opt.ctx, " tokens"));
        for (int32_t t : req.prompt)
            if (t < 0 || uint32_t(t) >= engine.config().n_vocab)
                return reject(job, FinishReason::Error, ErrorKind::InvalidRequest,
                              cat("token id ", t, " is outside the vocabulary"));

        // The longest resident prefix (an exact match needs its logits) ...
        Slot* best = nullptr;
        for (auto& s : slots) {
            if (s->busy || s->tokens.empty() || !serves(s->tokens, !s->logits.empty(), req.prompt)) continue;
            if (!best || s->tokens.size() > best->tokens.size()) best = s.get();
        }
        const size_t best_len = best ? best->tokens.size() : 0;
        // ... unless a disk snapshot holds a longer one (again, an exact match needs logits).
        long dbest = -1;
        for (size_t i = 0; i < disk.size(); ++i)
            if (disk[i].tokens.size() > best_len && serves(disk[i].tokens, disk[i].has_logits, req.prompt) &&
                (dbest < 0 || disk[i].tokens.size() > disk[size_t(dbest)].tokens.size()))
                dbest = long(i);

        Slot* slot = nullptr;
        std::string why;
        if (best) best->busy = true;   // not a victim while a slot is made for the snapshot
        if (dbest >= 0) {
            slot = fresh_slot(&why);
            if (slot) {
                slot->busy = true;
                if (restore(*slot, size_t(dbest))) {
                    r.restored_from_disk = true;
                    if (best) best->busy = false;
                } else if (best) {
                    slot->busy = false;   // stays as an empty session
                    slot = best;
                }
            } else if (best) {
                slot = best;
            }
        } else {
            slot = best;
        }
        if (!slot) slot = fresh_slot(&why);
        if (!slot)
            return reject(job, FinishReason::Error, ErrorKind::KvExhausted,
                          cat("KV memory exhausted and no idle session to evict: ", why));
        slot->busy = true;
        slot->last_used = ++tick;
        r.cached_tokens = slot->tokens.size();
        count([&](SchedulerStats& s) { s.cached_tokens += r.cached_tokens; });

        active.emplace_back(req.sampling);
        Active& a = active.back();
        a.job = job;
        a.slot = slot;
        a.prompt_pos = slot->tokens.size();
        if (req.on_admit) {
            try {
                req.on_admit(r.cached_tokens);
            } catch (const std::exception& e) {
                return finish(a, FinishReason::Error, ErrorKind::Internal, cat("admit callback: ", e.what()));
            }
        }
        if (a.prompt_pos == req.prompt.size()) sample_next(a);   // the whole prompt was cached
    }

    void step() {
        for (auto& a : active)
            if (!a.finished && a.job->cancelled()) finish(a, FinishReason::Cancelled);
        active.remove_if([](const Active& a) { return a.finished; });
        if (active.empty()) return;

        const uint32_t V = engine.config().n_vocab;
        std::vector<StepInput> inputs;
        std::vector<Active*> owner;
        uint64_t prefill_rows = 0, decode_rows = 0;
        for (auto& a : active) {
            if (!a.decoding) continue;
            // A greedy draw needs only the argmax: the backend forms the id (on the GPU there,
            // so no n_vocab floats cross to the host) and the slot keeps no logits.
            const bool id_only = opt.device_greedy && (a.greedy_next || !(a.sampler.params().temperature > 0));
            a.greedy_id = -1;
            if (id_only) {
                a.slot->logits.clear();
                inputs.push_back({a.slot->kv.get(), std::span<const int32_t>(&a.next_token, 1), false, nullptr, {},
                                  &a.greedy_id});
            } else {
                a.slot->logits.resize(V);
                inputs.push_back({a.slot->kv.get(), std::span<const int32_t>(&a.next_token, 1), false,
                                  a.slot->logits.data(), {}});
            }
            owner.push_back(&a);
            ++decode_rows;
        }
        size_t budget = std::max<uint32_t>(1, opt.prefill_step_tokens);
        for (auto& a : active) {
            if (a.decoding || budget == 0) continue;
            const auto& prompt = a.job->req_.prompt;
            const size_t n = prompt_piece(prompt.size() - a.prompt_pos,
                                          std::min(size_t(std::max<uint32_t>(1, opt.prefill_chunk)), budget));
            // Only the prompt's last chunk needs logits (the first token is sampled from them);
            // the others skip the output head and its download.
            float* lg = nullptr;
            if (a.prompt_pos + n == prompt.size()) {
                a.slot->logits.resize(V);
                lg = a.slot->logits.data();
            } else {
                a.slot->logits.clear();
            }
            inputs.push_back({a.slot->kv.get(), std::span<const int32_t>(prompt.data() + a.prompt_pos, n), false, lg, {}});
            inputs.back().prompt = true;
            owner.push_back(&a);
            budget -= std::min(budget, n);   // (a piece may take up to 2 more: prompt_piece)
            prefill_rows += n;
        }
        if (inputs.empty()) return;

        const auto t0 = Clock::now();
        try {
            engine.backend().forward(inputs);
        } catch (const std::exception& e) {
            // A backend failure leaves the sessions in an unknown state: drop their KV.
            for (Active* a : owner) {
                a->slot->kv->reset();
                a->slot->tokens.clear();
                a->slot->logits.clear();
                finish(*a, FinishReason::Error, ErrorKind::Internal, cat("backend: ", e.what()));
            }
            active.remove_if([](const Active& a) { return a.finished; });
            return;
        }
        const double dt = secs(Clock::now() - t0);
        uint64_t ok_prefill = 0, ok_decode = 0;
        for (size_t i = 0; i < inputs.size(); ++i) {
            Active& a = *owner[i];
            StepInput& in = inputs[i];
            if (!in.error.empty()) {
                // Growth refused (the budget): make room and retry next step, or give up.
                if (evict_lru()) continue;
                finish(a, FinishReason::Error, ErrorKind::KvExhausted,
                       cat("KV memory exhausted and no idle session to evict: ", in.error));
                continue;
            }
            a.slot->tokens.insert(a.slot->tokens.end(), in.tokens.begin(), in.tokens.end());
            if (a.decoding) {
                ++ok_decode;
                sample_next(a);
            } else {
                ok_prefill += in.tokens.size();
                a.prompt_pos += in.tokens.size();
                if (a.prompt_pos == a.job->req_.prompt.size()) {
                    if (opt.disk_save_prompt_min_tokens && a.prompt_pos >= opt.disk_save_prompt_min_tokens)
                        save_to_disk(*a.slot);
                    sample_next(a);
                }
            }
        }
        const double rows = double(prefill_rows + decode_rows);
        count([&](SchedulerStats& s) {
            ++s.steps;
            s.step_rows += prefill_rows + decode_rows;
            s.prefill_tokens += ok_prefill;
            s.prefill_seconds += dt * double(prefill_rows) / rows;
            s.decode_seconds += dt * double(decode_rows) / rows;
        });
        window.emplace_back(Clock::now(), ok_prefill, ok_decode);
        active.remove_if([](const Active& a) { return a.finished; });
    }

    void run() {
        try {
            index_disk_dir();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "dsv4 serve: %s\n", e.what());
        }
        publish();
        for (;;) {
            std::vector<std::shared_ptr<Job>> admitted;
            {
                std::unique_lock<std::mutex> l(qmu);
                const size_t max_active = opt.max_active ? opt.max_active : opt.max_sessions;
                qcv.wait(l, [&] { return stopping || !active.empty() || (!pending.empty() && active.size() < max_active); });
                if (stopping) break;
                while (!pending.empty() && admitted.size() + active.size() < max_active) {
                    admitted.push_back(std::move(pending.front()));
                    pending.pop_front();
                }
            }
            for (auto& j : admitted) {
                try {
                    admit(j);
                } catch (const std::exception& e) {
                    if (!j->done()) {
                        bool in_active = false;
                        for (auto& a : active)
                            if (a.job == j) {
                                finish(a, FinishReason::Error, ErrorKind::Internal, e.what());
                                in_active = true;
                            }
                        if (!in_active) reject(j, FinishReason::Error, ErrorKind::Internal, e.what());
                    }
                    // Only sessions of running requests are busy.
                    for (auto& sl : slots) sl->busy = false;
                    for (auto& a : active)
                        if (!a.finished) a.slot->busy = true;
                }
            }
            active.remove_if([](const Active& a) { return a.finished; });
            step();
            publish();
        }
        // Shutdown: nothing more is generated; idle sessions go to disk.
        for (auto& a : active) finish(a, FinishReason::Cancelled);
        active.clear();
        std::deque<std::shared_ptr<Job>> left;
        {
            std::lock_guard<std::mutex> l(qmu);
            left.swap(pending);
        }
        for (auto& j : left) {
            j->result_.finish = FinishReason::Cancelled;
            complete(j);
        }
        if (opt.save_on_shutdown)
            for (auto& s : slots) save_to_disk(*s);
        slots.clear();
        publish();
    }
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt) : opt_(opt) {
    if (opt_.max_sessions == 0) fail("--max-sessions must be at least 1");
    if (opt_.max_active == 0 || opt_.max_active > opt_.max_sessions) opt_.max_active = opt_.max_sessions;
    if (opt_.ctx < 2) fail("--ctx must be at least 2 tokens for serving");
    impl_ = std::make_unique<Impl>(engine, opt_);
    impl_->worker = std::thread([this] { impl_->run(); });
}

Scheduler::~Scheduler() { shutdown(); }

std::shared_ptr<Job> Scheduler::submit(GenerationRequest req, std::string* why) {
    auto job = std::make_shared<Job>();
    job->req_ = std::move(req);
    job->submitted_ = Clock::now();
    {
        std::lock_guard<std::mutex> l(impl_->qmu);
        const bool full = impl_->n_inflight >= size_t(opt_.max_active) + opt_.max_queued;
        if (impl_->stopping || full) {
            if (why)
                *why = impl_->stopping ? "the server is shutting down"
                                       : cat("too many requests: ", impl_->n_inflight - impl_->pending.size(),
                                             " generating and ", impl_->pending.size(), " queued (limits ",
                                             opt_.max_active, " and ", opt_.max_queued, ")");
            impl_->count([](SchedulerStats& s) { ++s.requests_rejected; });
            return nullptr;
        }
        ++impl_->n_inflight;
        impl_->pending.push_back(job);
    }
    impl_->count([](SchedulerStats& s) { ++s.requests_submitted; });
    impl_->qcv.notify_all();
    return job;
}

void Scheduler::shutdown() {
    if (!impl_) return;
    {
        std::lock_guard<std::mutex> l(impl_->qmu);
        impl_->stopping = true;
    }
    impl_->qcv.notify_all();
    if (impl_->worker.joinable()) impl_->worker.join();
}

bool Scheduler::stopping() const {
    std::lock_guard<std::mutex> l(impl_->qmu);
    return impl_->stopping;
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard<std::mutex> l(impl_->smu);
    return impl_->st;
}

std::vector<std::vector<int32_t>> Scheduler::resident_tokens() const {
    std::lock_guard<std::mutex> l(impl_->smu);
    return impl_->resident_snapshot;
}

std::vector<std::vector<int32_t>> Scheduler::disk_tokens() const {
    std::lock_guard<std::mutex> l(impl_->smu);
    return impl_->disk_snapshot;
}

}  // namespace dsv4::runtime
