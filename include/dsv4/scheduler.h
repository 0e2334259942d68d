// The Scheduler (design.md "runtime"): many resident sessions, one worker thread that owns
// the Engine, batched decode and chunked prefill.
//
//  - Sessions stay resident after a request; a new request reuses the idle session whose
//    tokens are the longest prefix of its prompt (only the suffix is evaluated).
//  - When the resident-session limit or the KV budget is reached, the least recently used
//    idle session is saved to the disk directory (a KV snapshot) and released; a request
//    whose prompt extends a saved session's tokens restores it instead of prefilling.
//    Snapshot files stay (a cache, capped by disk_max_bytes, least recently used first).
//  - Every step is one Backend::forward call: one token for every decoding request plus
//    prefill chunks (at most `prefill_step_tokens` tokens in all), so a long prompt does not
//    stall the others.
//  - A request may be cancelled at any time; its session keeps what was evaluated and stays
//    reusable.
//
// Token level only: the caller tokenizes, renders and decodes (callbacks per token).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsv4/runtime.h"
#include "dsv4/sampler.h"

namespace dsv4::runtime {

struct SchedulerOptions {
    uint64_t ctx = 4096;               // logical context of every session (tokens)
    uint32_t max_sessions = 8;         // resident sessions (idle + active)
    uint32_t max_active = 0;           // requests generating at once; 0: max_sessions
    uint32_t max_queued = 64;          // requests waiting for a slot; more are refused
    uint32_t prefill_chunk = 256;      // tokens of one request's prompt per step
    uint32_t prefill_step_tokens = 256;   // prompt tokens of all requests per step
    std::string disk_dir;              // KV snapshots of evicted sessions; "" = no disk tier
    uint64_t disk_max_bytes = 0;       // cap on the snapshot files; 0 = none
    // With a disk dir: a prompt of at least this many tokens whose prefill computed something
    // is saved once its prefill is done (a repeated or extended prompt then restores it even
    // when the resident session has moved on). 0 = off.
    uint64_t disk_save_prompt_min_tokens = 0;
    bool save_on_shutdown = true;      // with a disk dir: save idle sessions at shutdown
    bool load_disk_index = true;       // index snapshots already in disk_dir at start
    // Greedy decode steps (temperature 0, or the DSML guard's greedy tokens) take the next id
    // from the backend (StepInput::greedy) instead of downloading n_vocab logits a session a
    // step; the session then keeps no logits, so it (and its snapshot) serves prompts that
    // extend it, not the identical prompt. false: every step downloads the logits.
    bool device_greedy = true;
};

enum class FinishReason {
    Stop,       // EOS or the token callback asked to stop (stop string, tool block end)
    Length,     // max_tokens reached or the context is full
    Cancelled,  // Job::cancel()
    Error,      // see JobResult::error_kind / error
};
const char* finish_reason_name(FinishReason r);

enum class ErrorKind {
    None,
    InvalidRequest,  // empty prompt, prompt >= ctx
    KvExhausted,     // KV budget reached with no idle session left to evict
    Internal,
};

struct JobResult {
    FinishReason finish = FinishReason::Stop;
    ErrorKind error_kind = ErrorKind::None;
    std::string error;
    size_t prompt_tokens = 0;
    size_t cached_tokens = 0;          // prompt tokens reused from a resident or disk session
    bool restored_from_disk = false;
    size_t completion_tokens = 0;      // tokens sampled (EOS not counted)
    double queue_s = 0;                // submit -> admitted
    double ttft_s = 0;                 // submit -> first token sampled
    double decode_s = 0;               // first token -> finish
};

// What the token callback decides after each sampled token.
struct TokenAction {
    bool stop = false;         // end the generation here (finish reason Stop)
    bool greedy_next = false;  // sample the next token with temperature 0 (DSML guard)
};

struct GenerationRequest {
    std::vector<int32_t> prompt;
    SamplerParams sampling;
    uint32_t max_tokens = 256;         // clamped to the free context
    std::vector<int32_t> stop_tokens;  // ends the generation, not passed to on_token (EOS)
    // All callbacks run on the worker thread: keep them short, never block.
    std::function<void(size_t cached_tokens)> on_admit;     // a session was assigned
    std::function<TokenAction(int32_t token)> on_token;     // every sampled token but stop tokens
    std::function<void(const JobResult&)> on_finish;       // exactly once, last
};

// Handle of a submitted request.
class Job {
public:
    void cancel() { cancelled_ = true; }
    bool cancelled() const { return cancelled_; }
    bool done() const { return done_; }
    // Blocks until the job finished or the timeout expired; returns done().
    bool wait(std::chrono::milliseconds timeout);
    // Valid once done().
    const JobResult& result() const { return result_; }

private:
    friend class Scheduler;
    std::atomic<bool> cancelled_{false};
    std::atomic<bool> done_{false};
    mutable std::mutex mu_;
    std::condition_variable cv_;
    JobResult result_;
    GenerationRequest req_;
    std::chrono::steady_clock::time_point submitted_;
};

struct SchedulerStats {
    // counters (since start)
    uint64_t requests_submitted = 0, requests_rejected = 0, requests_finished = 0, requests_failed = 0,
             requests_cancelled = 0;
    uint64_t prompt_tokens = 0, cached_tokens = 0, prefill_tokens = 0, completion_tokens = 0;
    double prefill_seconds = 0, decode_seconds = 0;   // step time attributed by row share
    uint64_t steps = 0, step_rows = 0;
    uint64_t evictions = 0, disk_saves = 0, disk_restores = 0, disk_deletes = 0;
    // rates over the last few seconds
    double prefill_tps = 0, decode_tps = 0;
    // gauges
    uint64_t active = 0, queued = 0;
    uint64_t sessions_resident = 0, sessions_on_disk = 0, disk_bytes = 0;
    kv::Accounting kv;                 // summed over resident sessions
    uint64_t kv_budget_used = 0, kv_budget_limit = 0;
};

class Scheduler {
public:
    // Starts the worker thread. The engine must outlive the scheduler and is used by the
    // worker thread only from now on.
    Scheduler(Engine& engine, const SchedulerOptions& opt);
    ~Scheduler();   // shutdown()
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    const SchedulerOptions& options() const { return opt_; }

    // Queues a request. nullptr (and `why`) when too many requests are active or queued.
    std::shared_ptr<Job> submit(GenerationRequest req, std::string* why = nullptr);

    // Cancels everything, saves idle sessions to disk (save_on_shutdown), stops the worker.
    void shutdown();
    bool stopping() const;

    SchedulerStats stats() const;

    // For tests: the token lists of the resident sessions and of the disk index.
    std::vector<std::vector<int32_t>> resident_tokens() const;
    std::vector<std::vector<int32_t>> disk_tokens() const;

    struct Impl;

private:
    SchedulerOptions opt_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::runtime
