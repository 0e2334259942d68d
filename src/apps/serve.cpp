// dsv4 serve: an OpenAI-compatible HTTP server (model-spec §8) over the Scheduler —
// many resident sessions, batched decode, KV snapshots on disk.
//
// HTTP threads parse and validate requests, render and tokenize prompts, then hand a
// GenerationRequest to the scheduler's worker thread and wait: for the whole answer
// (non-streamed) or for deltas (SSE). A client that goes away cancels its generation.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "apps/app.h"
#include "apps/serve_api.h"
#include "dsv4/scheduler.h"

#ifdef DSV4_HAVE_HTTPLIB
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#endif

namespace dsv4::apps {

namespace {

struct ServeOptions {
    ModelOptions mo;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string kv_disk_dir;
    std::string kv_disk_max = "4G";
    uint64_t kv_cache_min_tokens = 512;
    uint32_t max_sessions = 8;
    uint32_t max_active = 0;
    uint32_t max_queued = 64;
    uint32_t prefill_chunk = 0;   // 0: the backend's chunk on CUDA, 256 on the CPU (run_serve)
    uint64_t default_max_tokens = 393216;
    std::string max_body = "16M";
    uint32_t http_threads = 0;
};

#ifdef DSV4_HAVE_HTTPLIB

using serve::ApiError;
using serve::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(e.body()), "application/json");
}

ApiError make_error(int status, std::string message, std::string type, std::string code, std::string param = {}) {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    e.param = std::move(param);
    return e;
}

// The socket of the request's connection, found by its ports, so that a handler can tell
// when the client went away (cpp-httplib 0.11 does not expose it).
int connection_fd(const httplib::Request& req) {
    DIR* d = opendir("/proc/self/fd");
    if (!d) return -1;
    int found = -1;
    while (dirent* e = readdir(d)) {
        char* end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (!end || *end || fd < 0) continue;
        struct stat st;
        if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage peer{}, local{};
        socklen_t pl = sizeof peer, ll = sizeof local;
        if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
        if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
        auto port = [](const sockaddr_storage& s) -> int {
            if (s.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(s).sin_port);
            if (s.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(s).sin6_port);
            return -1;
        };
        if (port(peer) == req.remote_port && (req.local_port <= 0 || port(local) == req.local_port)) {
            found = int(fd);
            break;
        }
    }
    closedir(d);
    return found;
}

bool peer_gone(int fd) {
    if (fd < 0) return false;
    pollfd p{fd, short(POLLRDHUP), 0};
    if (poll(&p, 1, 0) < 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// One generation request's meeting point between the worker (callbacks) and the HTTP thread.
struct Exchange {
    std::mutex mu;
    std::condition_variable cv;
    serve::OutputTracker out;
    bool admitted = false, finished = false;
    uint64_t seq = 0;   // bumped by every callback
    runtime::JobResult result;
    Exchange(const text::Tokenizer& tok, bool thinking, bool tools, std::vector<std::string> stop)
        : out(tok, thinking, tools, std::move(stop)) {}
};

class Server {
public:
    Server(const ServeOptions& o, runtime::Engine& engine, const runtime::SchedulerOptions& so)
        : opt_(o),
          engine_(engine),
          tok_(text::Tokenizer::from_gguf(*engine.model().file)),
          sched_(engine, so),
          created_(std::time(nullptr)) {
        eos_ = tok_.special().eos;
        routes();
    }

    httplib::Server& http() { return http_; }
    runtime::Scheduler& scheduler() { return sched_; }

private:
    void routes() {
        const size_t threads = opt_.http_threads ? opt_.http_threads
                                                 : std::min<size_t>(512, size_t(sched_.options().max_active) +
                                                                             sched_.options().max_queued + 16);
        http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
        http_.set_payload_max_length(parse_bytes("--max-body", opt_.max_body));
        http_.set_read_timeout(30, 0);
        http_.set_write_timeout(30, 0);
        http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) { count_http(req, res); });
        http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            if (res.status == 404)
                send_error(res, make_error(404, cat("Unknown request URL: ", req.method, " ", req.path, "."),
                                           "invalid_request_error", "unknown_url"));
            else if (res.status == 413)
                send_error(res, make_error(413, cat("Request body too large: the limit is ", opt_.max_body, " (--max-body)."),
                                           "invalid_request_error", "request_too_large"));
            else
                send_error(res, make_error(res.status, cat("HTTP error ", res.status, "."), "invalid_request_error", ""));
        });
        http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "internal error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, make_error(500, what, "server_error", "internal_error"));
        });
        http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            const auto s = sched_.stats();
            json j = {{"status", "ok"},
                      {"model", kModel()},
                      {"sessions_resident", s.sessions_resident},
                      {"requests_active", s.active},
                      {"requests_queued", s.queued}};
            res.set_content(dump(j), "application/json");
        });
        http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(dump(json{{"object", "list"}, {"data", json::array({model_json()})}}), "application/json");
        });
        http_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
            const std::string id = req.matches[1];
            if (id != serve::kModelId && id != "deepseek-chat" && id != "deepseek-reasoner")
                return send_error(res, make_error(404, cat("The model '", id, "' does not exist."),
                                                  "invalid_request_error", "model_not_found", "model"));
            json m = model_json();
            m["id"] = id;
            res.set_content(dump(m), "application/json");
        });
        http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics(), "text/plain; version=0.0.4");
        });
        http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
            generate(req, res, serve::Endpoint::Chat);
        });
        http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
            generate(req, res, serve::Endpoint::Completions);
        });
        http_.Options(R"(.*)", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
    }

    static const char* kModel() { return serve::kModelId; }

    json model_json() const {
        const uint64_t ctx = sched_.options().ctx;
        json m = json::object();
        m["id"] = serve::kModelId;
        m["object"] = "model";
        m["created"] = created_;
        m["owned_by"] = "dsv4";
        m["context_length"] = ctx;
        m["top_provider"] = {{"context_length", ctx},
                             {"max_completion_tokens", std::min<uint64_t>(opt_.default_max_tokens, ctx)}};
        m["supported_parameters"] = {"tools",  "tool_choice", "max_tokens", "temperature", "top_p",           "top_k",
                                     "min_p",  "stop",        "seed",       "stream",      "reasoning_effort"};
        return m;
    }

    // ---- generation ----------------------------------------------------------------------
    void generate(const httplib::Request& req, httplib::Response& res, serve::Endpoint ep) {
        try {
            generate_or_throw(req, res, ep);
        } catch (const ApiError& e) {
            send_error(res, e);
        } catch (const Error& e) {
            send_error(res, make_error(400, e.what(), "invalid_request_error", "invalid_value"));
        }
    }

    void generate_or_throw(const httplib::Request& req, httplib::Response& res, serve::Endpoint ep) {
        json body;
        try {
            body = json::parse(req.body);
        } catch (const json::exception& e) {
            throw make_error(400, cat("We could not parse the JSON body of your request: ", e.what()),
                             "invalid_request_error", "invalid_json");
        }
        serve::ParseContext pc;
        pc.ctx = sched_.options().ctx;
        serve::ParsedRequest pr =
            ep == serve::Endpoint::Chat ? serve::parse_chat_request(body, pc) : serve::parse_completion_request(body, pc);
        if (ep == serve::Endpoint::Chat) tool_memory_.apply(pr.messages);
        serve::Prompt prompt = serve::render_prompt(pr, tok_);
        const uint64_t ctx = sched_.options().ctx;
        if (prompt.ids.size() >= ctx) {
            ApiError e = make_error(400,
                                    cat("Prompt has ", prompt.ids.size(), " tokens, but the configured context size is ",
                                        ctx, " tokens"),
                                    "invalid_request_error", "context_length_exceeded",
                                    ep == serve::Endpoint::Chat ? "messages" : "prompt");
            e.extra["n_prompt_tokens"] = prompt.ids.size();
            e.extra["n_ctx"] = ctx;
            throw e;
        }
        for (int32_t t : prompt.ids)
            if (t < 0 || uint64_t(t) >= engine_.config().n_vocab)
                throw make_error(400, cat("Invalid token id ", t, " in 'prompt'."), "invalid_request_error",
                                 "invalid_value", "prompt");

        auto ex = std::make_shared<Exchange>(tok_, prompt.thinking, !pr.tool_schemas.empty(), pr.stop);
        runtime::GenerationRequest g;
        g.prompt = std::move(prompt.ids);
        g.sampling = pr.sampling;
        g.max_tokens = uint32_t(std::min<uint64_t>({pr.max_tokens.value_or(opt_.default_max_tokens),
                                                    ctx - g.prompt.size(), UINT32_MAX}));
        if (eos_ >= 0 && !pr.ignore_eos) g.stop_tokens.push_back(eos_);
        g.on_admit = [ex](size_t) {
            std::lock_guard<std::mutex> l(ex->mu);
            ex->admitted = true;
            ++ex->seq;
            ex->cv.notify_all();
        };
        g.on_token = [ex](int32_t t) {
            std::lock_guard<std::mutex> l(ex->mu);
            runtime::TokenAction a = ex->out.push(t);
            ++ex->seq;
            ex->cv.notify_all();
            return a;
        };
        g.on_finish = [ex](const runtime::JobResult& r) {
            std::lock_guard<std::mutex> l(ex->mu);
            ex->out.finish();
            ex->result = r;
            ex->finished = true;
            ++ex->seq;
            ex->cv.notify_all();
        };
        std::string why;
        std::shared_ptr<runtime::Job> job = sched_.submit(std::move(g), &why);
        if (!job && sched_.stopping()) throw shutting_down();
        if (!job) throw make_error(429, why, "rate_limit_error", "rate_limit_exceeded");
        const int fd = connection_fd(req);
        const std::string id = serve::random_id(ep == serve::Endpoint::Chat ? "chatcmpl-" : "cmpl-");
        const int64_t created = std::time(nullptr);
        const std::string model = pr.model;

        if (!pr.stream) {
            while (!job->wait(std::chrono::milliseconds(100)))
                if (peer_gone(fd)) job->cancel();
            std::unique_lock<std::mutex> l(ex->mu);
            ex->cv.wait(l, [&] { return ex->finished; });
            const runtime::JobResult r = ex->result;
            if (r.finish == runtime::FinishReason::Error) throw job_error(r);
            if (r.finish == runtime::FinishReason::Cancelled) throw shutting_down();   // (or nobody is listening)
            const text::ParsedMessage m = ex->out.final_message();
            l.unlock();
            const std::string finish = serve::finish_reason(r, m);
            json out;
            if (ep == serve::Endpoint::Chat) {
                std::vector<std::string> ids;
                for (size_t i = 0; i < m.tool_calls.size(); ++i) ids.push_back(serve::random_id("call_"));
                tool_memory_.remember(ids, m.tool_calls_raw);
                out = serve::chat_response(id, created, model, m, ids, finish, r);
            } else {
                out = serve::completion_response(id, created, model, m, finish, r);
            }
            res.set_content(dump(out), "application/json");
            return;
        }

        // Streaming: an error before the first token still gets its HTTP status.
        {
            std::unique_lock<std::mutex> l(ex->mu);
            while (!ex->cv.wait_for(l, std::chrono::milliseconds(100), [&] { return ex->admitted || ex->finished; }))
                if (peer_gone(fd)) job->cancel();
            if (ex->finished && ex->result.finish == runtime::FinishReason::Error) throw job_error(ex->result);
            if (ex->finished && ex->result.finish == runtime::FinishReason::Cancelled) throw shutting_down();
        }
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        auto state = std::make_shared<StreamState>();
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, ex, job, fd, id, created, model, ep, include_usage = pr.include_usage, state](size_t,
                                                                                              httplib::DataSink& sink) {
                return stream_step(*ex, *job, fd, id, created, model, ep, include_usage, *state, sink);
            },
            [job](bool) { job->cancel(); });   // no-op once done; cancels when the client went away
    }

    struct StreamState {
        bool sent_role = false;
        uint64_t seen = 0;
        Clock::time_point last_write = Clock::now();
    };

    static std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

    static const char* chunk_object(serve::Endpoint ep) {
        return ep == serve::Endpoint::Chat ? "chat.completion.chunk" : "text_completion";
    }

    json chunk(const std::string& id, int64_t created, const std::string& model, serve::Endpoint ep, json delta,
               json finish) const {
        json c = serve::response_head(id, chunk_object(ep), created, model);
        json fields = json::object();
        if (ep == serve::Endpoint::Chat) {
            fields["delta"] = std::move(delta);
        } else {
            fields["text"] = delta.value("content", std::string());
            if (delta.contains("reasoning_content")) fields["reasoning_content"] = delta["reasoning_content"];
        }
        c["choices"] = json::array({serve::one_choice(fields, std::move(finish))});
        return c;
    }

    // One call of the chunked content provider: waits a little for deltas, writes them;
    // false ends the response (client gone).
    bool stream_step(Exchange& ex, runtime::Job& job, int fd, const std::string& id, int64_t created,
                     const std::string& model, serve::Endpoint ep, bool include_usage, StreamState& st,
                     httplib::DataSink& sink) {
        std::string out;
        if (!st.sent_role && ep == serve::Endpoint::Chat) {
            out += sse(chunk(id, created, model, ep, json{{"role", "assistant"}, {"content", ""}}, nullptr));
            st.sent_role = true;
        }
        serve::OutputTracker::Delta d;
        bool finished = false;
        runtime::JobResult r;
        text::ParsedMessage m;
        {
            std::unique_lock<std::mutex> l(ex.mu);
            ex.cv.wait_for(l, std::chrono::milliseconds(200), [&] { return ex.seq != st.seen; });
            st.seen = ex.seq;
            d = ex.out.take_delta();
            finished = ex.finished;
            if (finished) {
                r = ex.result;
                m = ex.out.final_message();
            }
        }
        if (!d.reasoning.empty())
            out += sse(chunk(id, created, model, ep, json{{"reasoning_content", d.reasoning}}, nullptr));
        if (!d.content.empty()) out += sse(chunk(id, created, model, ep, json{{"content", d.content}}, nullptr));
        if (finished) {
            if (r.finish == runtime::FinishReason::Error || r.finish == runtime::FinishReason::Cancelled) {
                out += sse((r.finish == runtime::FinishReason::Error ? job_error(r) : shutting_down()).body());
            } else {
                if (ep == serve::Endpoint::Chat && !m.tool_calls.empty()) {
                    json calls = json::array();
                    std::vector<std::string> ids;
                    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
                        ids.push_back(serve::random_id("call_"));
                        calls.push_back(json{{"index", i},
                                             {"id", ids.back()},
                                             {"type", "function"},
                                             {"function",
                                              {{"name", m.tool_calls[i].name}, {"arguments", m.tool_calls[i].arguments}}}});
                    }
                    tool_memory_.remember(ids, m.tool_calls_raw);
                    out += sse(chunk(id, created, model, ep, json{{"tool_calls", calls}}, nullptr));
                }
                out += sse(chunk(id, created, model, ep, json::object(), serve::finish_reason(r, m)));
                if (include_usage) {
                    json u = serve::response_head(id, chunk_object(ep), created, model);
                    u["choices"] = json::array();
                    u["usage"] = serve::usage_json(r);
                    out += sse(u);
                }
            }
            out += "data: [DONE]\n\n";
        }
        if (out.empty()) {
            // Nothing new: see whether the client is still there; keep the connection alive.
            if (peer_gone(fd)) {
                job.cancel();
                return false;
            }
            if (Clock::now() - st.last_write > std::chrono::seconds(5)) out = ": keep-alive\n\n";
        }
        if (!out.empty()) {
            if (!sink.write(out.data(), out.size())) {
                job.cancel();
                return false;
            }
            st.last_write = Clock::now();
        }
        if (finished) sink.done();
        return true;
    }

    static ApiError shutting_down() {
        return make_error(503, "The server is shutting down.", "server_error", "shutting_down");
    }

    static ApiError job_error(const runtime::JobResult& r) {
        switch (r.error_kind) {
            case runtime::ErrorKind::KvExhausted: return make_error(503, r.error, "server_error", "kv_exhausted");
            case runtime::ErrorKind::InvalidRequest: return make_error(400, r.error, "invalid_request_error", "invalid_value");
            default: return make_error(500, r.error, "server_error", "internal_error");
        }
    }

    // ---- metrics -------------------------------------------------------------------------
    void count_http(const httplib::Request& req, const httplib::Response& res) {
        static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"};
        std::string path = "other";
        for (const char* k : known)
            if (req.path == k) path = k;
        if (req.path.rfind("/v1/models/", 0) == 0) path = "/v1/models/{id}";
        std::lock_guard<std::mutex> l(mmu_);
        ++http_counts_[{path, res.status}];
    }

    std::string metrics() {
        const runtime::SchedulerStats s = sched_.stats();
        std::string o;
        auto head = [&](const char* name, const char* type, const char* help) {
            o += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
        };
        auto one = [&](const char* name, const char* type, const char* help, auto v) {
            head(name, type, help);
            o += cat(name, " ", v, "\n");
        };
        head("dsv4_http_requests_total", "counter", "HTTP requests answered, by path and status.");
        {
            std::lock_guard<std::mutex> l(mmu_);
            for (const auto& [k, v] : http_counts_)
                o += cat("dsv4_http_requests_total{path=\"", k.first, "\",status=\"", k.second, "\"} ", v, "\n");
        }
        one("dsv4_requests_total", "counter", "Generation requests accepted.", s.requests_submitted);
        one("dsv4_requests_rejected_total", "counter", "Generation requests refused (too many requests).",
            s.requests_rejected);
        one("dsv4_requests_failed_total", "counter", "Generation requests that ended in an error.", s.requests_failed);
        one("dsv4_requests_cancelled_total", "counter", "Generation requests cancelled (client gone).",
            s.requests_cancelled);
        one("dsv4_requests_active", "gauge", "Requests holding a session (prefill or decode).", s.active);
        one("dsv4_requests_queued", "gauge", "Requests waiting for a session.", s.queued);
        one("dsv4_prompt_tokens_total", "counter", "Prompt tokens of all requests.", s.prompt_tokens);
        one("dsv4_prompt_tokens_cached_total", "counter", "Prompt tokens reused from resident or disk KV.",
            s.cached_tokens);
        one("dsv4_prefill_tokens_total", "counter", "Prompt tokens evaluated.", s.prefill_tokens);
        one("dsv4_completion_tokens_total", "counter", "Tokens generated.", s.completion_tokens);
        one("dsv4_prefill_seconds_total", "counter", "Step time attributed to prefill.", s.prefill_seconds);
        one("dsv4_decode_seconds_total", "counter", "Step time attributed to decode.", s.decode_seconds);
        one("dsv4_prefill_tokens_per_second", "gauge", "Prompt tokens evaluated per second (last 10 s).", s.prefill_tps);
        one("dsv4_decode_tokens_per_second", "gauge", "Tokens generated per second, all requests (last 10 s).",
            s.decode_tps);
        one("dsv4_steps_total", "counter", "Batched forward steps.", s.steps);
        one("dsv4_step_rows_total", "counter", "Token rows evaluated by all steps.", s.step_rows);
        one("dsv4_kv_logical_bytes", "gauge", "KV bytes the resident sessions' full contexts would need.", s.kv.logical);
        one("dsv4_kv_reserved_bytes", "gauge", "KV address space reserved.", s.kv.reserved);
        one("dsv4_kv_committed_bytes", "gauge", "KV memory committed.", s.kv.committed);
        one("dsv4_kv_live_bytes", "gauge", "KV bytes holding data of the tokens seen.", s.kv.live);
        one("dsv4_kv_budget_used_bytes", "gauge", "KV bytes counted against --kv-budget.", s.kv_budget_used);
        one("dsv4_kv_budget_bytes", "gauge", "The KV budget (0: none).", s.kv_budget_limit);
        one("dsv4_sessions_resident", "gauge", "Sessions in memory.", s.sessions_resident);
        one("dsv4_sessions_on_disk", "gauge", "Sessions saved in --kv-disk-dir.", s.sessions_on_disk);
        one("dsv4_kv_disk_bytes", "gauge", "Bytes of the session snapshots on disk.", s.disk_bytes);
        one("dsv4_sessions_evicted_total", "counter", "Idle sessions released for room.", s.evictions);
        one("dsv4_sessions_saved_total", "counter", "Session snapshots written to disk.", s.disk_saves);
        one("dsv4_sessions_restored_total", "counter", "Session snapshots loaded from disk.", s.disk_restores);
        return o;
    }

    ServeOptions opt_;
    runtime::Engine& engine_;
    text::Tokenizer tok_;
    runtime::Scheduler sched_;
    httplib::Server http_;
    serve::ToolCallMemory tool_memory_;
    int32_t eos_ = -1;
    int64_t created_;
    std::mutex mmu_;
    std::map<std::pair<std::string, int>, uint64_t> http_counts_;
};

int run_serve(const ServeOptions& o) {
    // SIGINT/SIGTERM are taken by one thread (every thread created later inherits the mask).
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    runtime::SchedulerOptions so;
    so.ctx = o.mo.ctx;
    so.max_sessions = o.max_sessions;
    so.max_active = o.max_active;
    so.max_queued = o.max_queued;
    so.disk_dir = o.kv_disk_dir;
    so.disk_max_bytes = parse_bytes("--kv-disk-max", o.kv_disk_max);
    so.disk_save_prompt_min_tokens = o.kv_cache_min_tokens;
    parse_bytes("--max-body", o.max_body);

    auto engine = o.mo.open_engine();
    // Prompt tokens a step takes. The GPU prefills ~4x faster in 2,048-token rounds than in
    // 256-token ones (backend.h: kCudaPrefillChunk), so on CUDA a step takes a whole backend
    // chunk; on the CPU 256 keeps the other requests' decode steps short while a prompt runs.
    const Backend& be = engine->backend();
    const uint32_t step = o.prefill_chunk      ? o.prefill_chunk
                          : be.name() == "cuda" ? be.options().prefill_chunk
                                                : std::min(256u, be.options().prefill_chunk);
    so.prefill_chunk = step;
    so.prefill_step_tokens = step;
    Server server(o, *engine, so);
    // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian
    // built the library), so a burst of clients connecting at once overflows it: Linux drops
    // the extra SYNs and the clients retry a second later. On the H200 machine (gVisor) one of
    // 64 clients connecting at once got a connection reset (bench/gpu/NOTES.md, nineteenth
    // round; the backlog is the likely cause, not yet confirmed there). listen() again on the
    // bound socket raises the backlog; the socket is the first the options callback sees.
    std::atomic<int> listen_fd{-1};
    server.http().set_socket_options([&listen_fd](socket_t sock) {
        httplib::default_socket_options(sock);
        int none = -1;
        listen_fd.compare_exchange_strong(none, int(sock));
    });
    int port = o.port;
    if (port == 0) {
        port = server.http().bind_to_any_port(o.host);
        if (port <= 0) fail("cannot bind to ", o.host, " (any port)");
    } else if (!server.http().bind_to_port(o.host, port)) {
        fail("cannot bind to ", o.host, ":", port);
    }
    if (listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) != 0)
        std::fprintf(stderr, "dsv4 serve: warning: cannot raise the listen backlog to %d: %s\n", SOMAXCONN,
                     std::strerror(errno));
    std::printf("dsv4 serve: listening on http://%s:%d\n", o.host.c_str(), port);
    std::fflush(stdout);
    std::fprintf(stderr,
                 "dsv4 serve: %s backend, ctx %llu, up to %u sessions (%u generating), %u prompt tokens a step, "
                 "KV budget %s, disk %s\n",
                 engine->backend().name().c_str(), static_cast<unsigned long long>(so.ctx), so.max_sessions,
                 server.scheduler().options().max_active, so.prefill_step_tokens,
                 engine->budget().limit() ? human_bytes(engine->budget().limit()).c_str() : "none",
                 so.disk_dir.empty() ? "off" : so.disk_dir.c_str());

    std::atomic<bool> done{false};
    runtime::SchedulerStats last;   // before shutdown releases the sessions (--stats-json)
    std::thread sig([&] {
        int s = 0;
        while (!done) {
            timespec ts{0, 200 * 1000 * 1000};
            siginfo_t info;
            s = sigtimedwait(&sigs, &info, &ts);
            if (s > 0) break;
        }
        // Generations end first (their clients get a final event), then the listener.
        last = server.scheduler().stats();
        if (s > 0) server.scheduler().shutdown();
        server.http().stop();
    });
    const bool ok = server.http().listen_after_bind();
    done = true;
    server.http().stop();
    sig.join();
    server.scheduler().shutdown();
    const auto st = server.scheduler().stats();
    write_stats_json(o.mo.stats_json, last.kv,
                     cat("\"sessions_resident\": ", last.sessions_resident, ", \"requests\": ", st.requests_finished,
                         ", \"prompt_tokens\": ", st.prompt_tokens, ", \"cached_tokens\": ", st.cached_tokens,
                         ", \"completion_tokens\": ", st.completion_tokens, ", \"sessions_on_disk\": ",
                         st.sessions_on_disk));
    std::fprintf(stderr, "dsv4 serve: stopped (%llu requests, %llu sessions on disk)\n",
                 static_cast<unsigned long long>(st.requests_finished),
                 static_cast<unsigned long long>(st.sessions_on_disk));
    return ok ? 0 : 1;
}

#endif  // DSV4_HAVE_HTTPLIB

}  // namespace

Runner add_serve(CLI::App& app) {
    auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, SSE, metrics)");
    auto o = std::make_shared<ServeOptions>();
    o->mo.add_to(*cmd, false);
    cmd->add_option("--host", o->host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", o->port, "port (0: any free port, printed at start)")->capture_default_str();
    cmd->add_option("--kv-disk-dir", o->kv_disk_dir, "save evicted sessions' KV here and restore them on reuse");
    cmd->add_option("--kv-disk-max", o->kv_disk_max, "cap on the snapshots in --kv-disk-dir (0: none)")
        ->capture_default_str();
    cmd->add_option("--kv-cache-min-tokens", o->kv_cache_min_tokens,
                    "with --kv-disk-dir: also save prompts of at least this many tokens once prefilled (0: off)")
        ->capture_default_str();
    cmd->add_option("--max-sessions", o->max_sessions, "sessions resident in memory")
        ->check(CLI::Range(1u, 4096u))
        ->capture_default_str();
    cmd->add_option("--parallel", o->max_active, "requests generating at once (default: --max-sessions)");
    cmd->add_option("--max-queued", o->max_queued, "requests waiting for a session before 429")->capture_default_str();
    cmd->add_option("--prefill-chunk", o->prefill_chunk,
                    "prompt tokens per step, interleaved with decode (default: 256 on the CPU, the --chunk on CUDA)")
        ->check(CLI::Range(1u, 1u << 20));
    cmd->add_option("-n,--tokens", o->default_max_tokens, "default max_tokens (clamped to the free context)")
        ->capture_default_str();
    cmd->add_option("--max-body", o->max_body, "largest request body (413 beyond)")->capture_default_str();
    cmd->add_option("--http-threads", o->http_threads, "HTTP worker threads (default: parallel + queued + 16)");
    return [o]() -> int {
#ifdef DSV4_HAVE_HTTPLIB
        return run_serve(*o);
#else
        fail("serve: this dsv4 was built without cpp-httplib (install libcpp-httplib-dev and rebuild)");
#endif
    };
}

}  // namespace dsv4::apps
