// `dsv4 serve` end to end: the real binary on a free loopback port, a tiny synthetic model,
// and real clients — curl for every endpoint and every bad input, the official `openai` npm
// client (tools/node/serve_openai_test.mjs), 16 concurrent clients checked against single-
// client runs, and a small KV budget that sends sessions to disk and restores one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_util.h"

#ifdef DSV4_BINARY

using namespace dsv4;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string tiny() { return test::synth_model("serve-tiny", "tiny"); }

bool have(const char* tool) { return std::system((std::string("command -v ") + tool + " >/dev/null 2>&1").c_str()) == 0; }

bool require_oracles() {
    const char* e = std::getenv("DSV4_REQUIRE_ORACLES");
    return e && *e && std::string(e) != "0";
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// The server as a child process; the port comes from its first line of output.
class Server {
public:
    explicit Server(std::vector<std::string> args) {
        static std::atomic<int> n{0};
        log_ = test::tmp_dir() + "/serve-" + std::to_string(n++) + ".log";
        args.insert(args.begin(), {DSV4_BINARY, "serve", "--host", "127.0.0.1", "--port", "0", "--backend", "cpu",
                                   "--threads", "1"});
        int out[2];
        if (pipe(out) != 0) throw std::runtime_error("pipe");
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out[1], 1);
            const int err = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(err, 2);
            close(out[0]);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(out[1]);
        out_ = out[0];
        std::string line;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
            pollfd p{out_, POLLIN, 0};
            if (poll(&p, 1, 200) <= 0) continue;
            char buf[256];
            const ssize_t k = read(out_, buf, sizeof buf);
            if (k <= 0) break;
            line.append(buf, size_t(k));
        }
        const size_t colon = line.rfind(':');
        if (line.find("listening on") == std::string::npos || colon == std::string::npos)
            throw std::runtime_error("the server did not start: " + line + "\n" + slurp(log_));
        port_ = std::stoi(line.substr(colon + 1));
    }
    ~Server() { stop(); }

    int stop() {
        if (pid_ <= 0) return status_;
        kill(pid_, SIGTERM);
        for (int i = 0; i < 300; ++i) {
            if (waitpid(pid_, &status_, WNOHANG) == pid_) {
                pid_ = -1;
                close(out_);
                return status_;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        pid_ = -1;
        close(out_);
        return status_;
    }

    std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
    int port() const { return port_; }
    std::string log() const { return slurp(log_); }

private:
    pid_t pid_ = -1;
    int out_ = -1;
    int port_ = 0;
    int status_ = 0;
    std::string log_;
};

struct Reply {
    int status = 0;
    std::string body;
    json j() const {
        try {
            return json::parse(body);
        } catch (...) {
            return json();
        }
    }
};

// One curl request: POST when a body is given, GET otherwise.
Reply curl(const std::string& url, const std::string& body = "", const std::string& extra = "") {
    static std::atomic<int> n{0};
    const std::string base = test::tmp_dir() + "/curl-" + std::to_string(n++);
    std::string cmd = "curl -s -S -N --max-time 120 -o " + base + ".out -w '%{http_code}' " + extra;
    if (!body.empty()) {
        std::ofstream(base + ".in", std::ios::binary) << body;
        cmd += " -H 'Content-Type: application/json' --data-binary @" + base + ".in";
    }
    cmd += " '" + url + "' 2>" + base + ".err";
    Reply r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[64] = {0};
    const size_t k = fread(buf, 1, sizeof buf - 1, p);
    pclose(p);
    r.status = std::atoi(std::string(buf, k).c_str());
    r.body = slurp(base + ".out");
    return r;
}

json chat_body(const std::string& content, int max_tokens = 16, bool stream = false) {
    json b = {{"model", "deepseek-chat"},
              {"messages", json::array({{{"role", "user"}, {"content", content}}})},
              {"max_tokens", max_tokens},
              {"temperature", 0}};
    if (stream) {
        b["stream"] = true;
        b["stream_options"] = {{"include_usage", true}};
    }
    return b;
}

// The `data:` payloads of an SSE body.
std::vector<std::string> sse_events(const std::string& body) {
    std::vector<std::string> ev;
    std::istringstream in(body);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("data: ", 0) == 0) ev.push_back(line.substr(6));
    return ev;
}

struct Streamed {
    std::string content, reasoning, finish;
    json usage;
    bool done = false;
    size_t chunks = 0;
};
Streamed parse_stream(const std::string& body, const char* object = "chat.completion.chunk") {
    Streamed s;
    for (const auto& e : sse_events(body)) {
        if (e == "[DONE]") {
            s.done = true;
            continue;
        }
        EXPECT_FALSE(s.done) << "data after [DONE]";
        json c = json::parse(e);
        EXPECT_EQ(c["object"], object) << e;
        ++s.chunks;
        if (c.contains("usage") && !c["usage"].is_null()) s.usage = c["usage"];
        for (auto& ch : c["choices"]) {
            if (ch.contains("delta")) {
                if (ch["delta"].contains("content")) s.content += ch["delta"]["content"].get<std::string>();
                if (ch["delta"].contains("reasoning_content"))
                    s.reasoning += ch["delta"]["reasoning_content"].get<std::string>();
            }
            if (ch.contains("text")) s.content += ch["text"].get<std::string>();
            if (!ch["finish_reason"].is_null()) s.finish = ch["finish_reason"];
        }
    }
    return s;
}

double metric(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    return -1;
}

void expect_error(const Reply& r, int status, const std::string& code, const std::string& what) {
    EXPECT_EQ(r.status, status) << what << ": " << r.body;
    json j = r.j();
    ASSERT_TRUE(j.contains("error")) << what << ": " << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << what;
    EXPECT_TRUE(j["error"]["type"].is_string()) << what;
    EXPECT_TRUE(j["error"].contains("param")) << what;
    EXPECT_EQ(j["error"]["code"], code) << what << ": " << r.body;
}

#define NEED_CURL()                                                      \
    do {                                                                 \
        if (!have("curl")) {                                             \
            if (require_oracles()) FAIL() << "curl is not installed";    \
            GTEST_SKIP() << "curl is not installed";                     \
        }                                                                \
    } while (0)

}  // namespace

TEST(ServeHttp, ChatCompletionsStreamedAndNot) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "1024", "--max-sessions", "4"});
    Reply r = curl(s.url("/v1/chat/completions"), chat_body("Hello there").dump());
    ASSERT_EQ(r.status, 200) << r.body << s.log();
    json j = r.j();
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "deepseek-chat");
    const json& msg = j["choices"][0]["message"];
    EXPECT_EQ(msg["role"], "assistant");
    ASSERT_TRUE(msg["content"].is_string());
    const std::string finish = j["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
    const json& u = j["usage"];
    EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
    EXPECT_LE(u["completion_tokens"].get<int>(), 16);
    EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
    EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number());

    // The same greedy request streamed: same text, a usage chunk, [DONE] last.
    Reply rs = curl(s.url("/v1/chat/completions"), chat_body("Hello there", 16, true).dump());
    ASSERT_EQ(rs.status, 200) << rs.body;
    Streamed st = parse_stream(rs.body);
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.content, msg["content"].get<std::string>());
    EXPECT_EQ(st.finish, finish);
    ASSERT_TRUE(st.usage.is_object()) << rs.body;
    EXPECT_EQ(st.usage["completion_tokens"], u["completion_tokens"]);
    EXPECT_EQ(sse_events(rs.body).back(), "[DONE]");

    // Thinking (the default): reasoning is its own field, streamed as reasoning_content.
    json think = chat_body("Why?", 12);
    think.erase("model");
    think["seed"] = 3;
    Reply rt = curl(s.url("/v1/chat/completions"), think.dump());
    ASSERT_EQ(rt.status, 200) << rt.body;
    json jt = rt.j()["choices"][0]["message"];
    const std::string reasoning = jt.value("reasoning_content", "");
    EXPECT_GT(reasoning.size() + jt["content"].get<std::string>().size(), 0u) << rt.body;
    think["stream"] = true;
    Streamed stt = parse_stream(curl(s.url("/v1/chat/completions"), think.dump()).body);
    EXPECT_EQ(stt.reasoning, reasoning);   // same seed, same draw
    EXPECT_EQ(stt.content, jt["content"].get<std::string>());

    // Stop strings, and max_completion_tokens over max_tokens.
    json stop = chat_body("Hello there", 16);
    stop["max_completion_tokens"] = 3;
    Reply r3 = curl(s.url("/v1/chat/completions"), stop.dump());
    EXPECT_EQ(r3.j()["usage"]["completion_tokens"], 3) << r3.body;
    EXPECT_EQ(r3.j()["choices"][0]["finish_reason"], "length");
    // A stop string taken from the greedy answer (one ASCII letter or digit after the start).
    const std::string full = msg["content"];
    size_t at = 1;
    while (at < full.size() && !std::isalnum(static_cast<unsigned char>(full[at]))) ++at;
    if (at < full.size()) {
        const std::string stop_at = full.substr(at, 1);
        json stop2 = chat_body("Hello there", 16);
        stop2["stop"] = json::array({stop_at, "never-in-the-output"});
        Reply r4 = curl(s.url("/v1/chat/completions"), stop2.dump());
        EXPECT_EQ(r4.j()["choices"][0]["message"]["content"], full.substr(0, full.find(stop_at))) << r4.body;
        EXPECT_EQ(r4.j()["choices"][0]["finish_reason"], "stop");
    }
    EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(ServeHttp, CompletionsModelsHealthMetrics) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "1024"});
    json body = {{"model", "deepseek-chat"}, {"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}};
    Reply r = curl(s.url("/v1/completions"), body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.j();
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_TRUE(j["choices"][0]["text"].is_string());
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 8);
    body["stream"] = true;
    Reply rs = curl(s.url("/v1/completions"), body.dump());
    Streamed st = parse_stream(rs.body, "text_completion");
    EXPECT_TRUE(st.done);
    EXPECT_EQ(st.content, j["choices"][0]["text"].get<std::string>());

    Reply m = curl(s.url("/v1/models"));
    ASSERT_EQ(m.status, 200);
    EXPECT_EQ(m.j()["object"], "list");
    EXPECT_EQ(m.j()["data"][0]["id"], "deepseek-v4-flash");
    EXPECT_EQ(m.j()["data"][0]["context_length"], 1024);
    EXPECT_EQ(curl(s.url("/v1/models/deepseek-v4-flash")).j()["id"], "deepseek-v4-flash");
    expect_error(curl(s.url("/v1/models/gpt-7")), 404, "model_not_found", "unknown model");

    Reply h = curl(s.url("/health"));
    EXPECT_EQ(h.status, 200);
    EXPECT_EQ(h.j()["status"], "ok");

    Reply mt = curl(s.url("/metrics"));
    ASSERT_EQ(mt.status, 200);
    for (const char* name :
         {"dsv4_requests_total", "dsv4_prompt_tokens_total", "dsv4_completion_tokens_total",
          "dsv4_prefill_tokens_per_second", "dsv4_decode_tokens_per_second", "dsv4_kv_logical_bytes",
          "dsv4_kv_committed_bytes", "dsv4_kv_live_bytes", "dsv4_sessions_resident", "dsv4_sessions_on_disk"})
        EXPECT_GE(metric(mt.body, name), 0) << name << " missing";
    EXPECT_EQ(metric(mt.body, "dsv4_requests_total"), 2);
    EXPECT_GT(metric(mt.body, "dsv4_completion_tokens_total"), 0);
    EXPECT_GT(metric(mt.body, "dsv4_kv_committed_bytes"), 0);
    EXPECT_GT(metric(mt.body, "dsv4_kv_logical_bytes"), 0);
    EXPECT_GE(metric(mt.body, "dsv4_sessions_resident"), 1);
    EXPECT_NE(mt.body.find("dsv4_http_requests_total{path=\"/v1/completions\",status=\"200\"} 2"), std::string::npos)
        << mt.body;
    // the CPU's default step of prompt tokens (CUDA's is its 2,048-token backend chunk)
    EXPECT_NE(s.log().find("cpu backend, ctx 1024, up to 8 sessions (8 generating), 256 prompt tokens a step"),
              std::string::npos)
        << s.log();
}

TEST(ServeHttp, BadInputGetsOpenAIErrorsAndTheServerKeepsServing) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "256", "--max-body", "64K"});
    const std::string url = s.url("/v1/chat/completions");
    expect_error(curl(url, "{not json"), 400, "invalid_json", "invalid JSON");
    expect_error(curl(url, "[1,2,3]"), 400, "invalid_type", "not an object");
    expect_error(curl(url, R"({"messages":"hello"})"), 400, "invalid_type", "messages not an array");
    expect_error(curl(url, R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"9"})"), 400, "invalid_type",
                 "max_tokens a string");
    expect_error(curl(url, R"({"messages":[{"role":"user","content":"x"}],"temperature":[1]})"), 400, "invalid_type",
                 "temperature an array");
    expect_error(curl(url, R"({"messages":[{"role":"wizard","content":"x"}]})"), 400, "invalid_value", "unknown role");
    expect_error(curl(url, R"({"messages":[]})"), 400, "empty_array", "empty messages");
    expect_error(curl(url, R"({"model":"x"})"), 400, "missing_required_parameter", "no messages");
    expect_error(curl(s.url("/v1/completions"), R"({"prompt":42})"), 400, "invalid_type", "prompt a number");
    // Oversized body: 413.
    json big = chat_body(std::string(100 * 1024, 'a'));
    expect_error(curl(url, big.dump()), 413, "request_too_large", "oversized body");
    // Prompt over the context: 400 with the token counts.
    Reply r = curl(url, chat_body(std::string(2000, 'b')).dump());
    expect_error(r, 400, "context_length_exceeded", "prompt over the context");
    EXPECT_EQ(r.j()["error"]["n_ctx"], 256);
    EXPECT_GT(r.j()["error"]["n_prompt_tokens"].get<int>(), 256);
    EXPECT_EQ(r.j()["error"]["param"], "messages");
    expect_error(curl(s.url("/v1/nothing")), 404, "unknown_url", "unknown URL");
    // Still serving, and every answer so far was counted.
    Reply ok = curl(url, chat_body("fine").dump());
    EXPECT_EQ(ok.status, 200) << ok.body;
    Reply mt = curl(s.url("/metrics"));
    EXPECT_NE(mt.body.find("status=\"413\"} 1"), std::string::npos) << mt.body;
    EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(ServeHttp, TooManyRequestsAndClientDisconnect) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "32768", "--max-sessions", "1", "--max-queued", "0"});
    json long_req = chat_body("Tell me a long story", 32000, true);
    long_req["ignore_eos"] = true;
    // A streaming client that goes away after a second.
    std::thread t([&] { curl(s.url("/v1/chat/completions"), long_req.dump(), "--max-time 1"); });
    for (int i = 0; i < 100; ++i) {
        if (metric(curl(s.url("/metrics")).body, "dsv4_requests_active") == 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    expect_error(curl(s.url("/v1/chat/completions"), chat_body("me too").dump()), 429, "rate_limit_exceeded",
                 "second request while the only slot generates");
    t.join();
    // The disconnect cancelled the generation: the slot is free again.
    double cancelled = 0;
    for (int i = 0; i < 100 && cancelled < 1; ++i) {
        cancelled = metric(curl(s.url("/metrics")).body, "dsv4_requests_cancelled_total");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(cancelled, 1);
    const std::string mt = curl(s.url("/metrics")).body;
    EXPECT_LT(metric(mt, "dsv4_completion_tokens_total"), 32000);
    Reply ok = curl(s.url("/v1/chat/completions"), chat_body("me too").dump());
    EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServeHttp, ShutdownEndsStreamsAndSavesSessions) {
    NEED_CURL();
    const std::string dir = test::tmp_dir() + "/serve-shutdown-disk";
    fs::remove_all(dir);
    Server s({"-m", tiny(), "--ctx", "32768", "--kv-disk-dir", dir});
    json long_req = chat_body("A story that never ends", 32000, true);
    long_req["ignore_eos"] = true;
    Reply streamed;
    std::thread t([&] { streamed = curl(s.url("/v1/chat/completions"), long_req.dump()); });
    for (int i = 0; i < 200; ++i) {
        if (metric(curl(s.url("/metrics")).body, "dsv4_completion_tokens_total") > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(s.stop(), 0) << s.log();   // SIGTERM: a clean exit
    t.join();
    // The client got an error event and [DONE], not a cut connection.
    auto ev = sse_events(streamed.body);
    ASSERT_GE(ev.size(), 2u) << streamed.body;
    EXPECT_EQ(ev.back(), "[DONE]");
    EXPECT_NE(ev[ev.size() - 2].find("shutting_down"), std::string::npos) << ev[ev.size() - 2];
    // The session was saved for the next start.
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(dir)) files += f.path().extension() == ".kv";
    EXPECT_EQ(files, 1u);
}

TEST(ServeHttp, KvBudgetExhaustedIs503) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "1024", "--kv-budget", "64K"});
    Reply r = curl(s.url("/v1/chat/completions"), chat_body("hello").dump());
    expect_error(r, 503, "kv_exhausted", "budget below one session");
    Reply rs = curl(s.url("/v1/chat/completions"), chat_body("hello", 8, true).dump());
    expect_error(rs, 503, "kv_exhausted", "streamed, budget below one session");
    EXPECT_EQ(curl(s.url("/health")).status, 200);
    EXPECT_EQ(metric(curl(s.url("/metrics")).body, "dsv4_requests_failed_total"), 2);
}

TEST(ServeHttp, SixteenConcurrentClientsMatchSingleClientRuns) {
    NEED_CURL();
    Server s({"-m", tiny(), "--ctx", "1024", "--max-sessions", "16", "--prefill-chunk", "64"});
    std::vector<std::string> prompts;
    for (int i = 0; i < 16; ++i) {
        std::string p = "Client " + std::to_string(i) + ":";
        for (int k = 0; k < (i * 37) % 160; ++k) p += " w" + std::to_string((k * 7 + i) % 23);
        prompts.push_back(p);
    }
    auto body = [&](int i) {
        json b = chat_body(prompts[size_t(i)], 24, i % 2 == 1);
        return b.dump();
    };
    auto answer = [](int i, const Reply& r) -> std::pair<std::string, std::string> {
        if (i % 2 == 1) {
            Streamed st = parse_stream(r.body);
            EXPECT_TRUE(st.done) << r.body;
            return {st.content, st.finish};
        }
        json j = r.j();
        return {j["choices"][0]["message"]["content"].get<std::string>(), j["choices"][0]["finish_reason"]};
    };
    std::vector<std::pair<std::string, std::string>> single(16), many(16);
    for (int i = 0; i < 16; ++i) {
        Reply r = curl(s.url("/v1/chat/completions"), body(i));
        ASSERT_EQ(r.status, 200) << r.body;
        single[size_t(i)] = answer(i, r);
    }
    const double steps0 = metric(curl(s.url("/metrics")).body, "dsv4_steps_total");
    std::vector<std::thread> th;
    std::vector<Reply> replies(16);
    for (int i = 0; i < 16; ++i)
        th.emplace_back([&, i] { replies[size_t(i)] = curl(s.url("/v1/chat/completions"), body(i)); });
    for (auto& t : th) t.join();
    for (int i = 0; i < 16; ++i) {
        ASSERT_EQ(replies[size_t(i)].status, 200) << replies[size_t(i)].body;
        many[size_t(i)] = answer(i, replies[size_t(i)]);
        EXPECT_EQ(many[size_t(i)], single[size_t(i)]) << "client " << i;
    }
    // They were batched: far fewer steps than the 16 x 24 decode rows alone.
    const std::string mt = curl(s.url("/metrics")).body;
    EXPECT_LT(metric(mt, "dsv4_steps_total") - steps0, 16 * 24 * 0.5);
    EXPECT_EQ(metric(mt, "dsv4_requests_failed_total"), 0);
    EXPECT_NE(s.log().find(", 64 prompt tokens a step"), std::string::npos) << s.log();   // --prefill-chunk
}

TEST(ServeHttp, SmallBudgetEvictsToDiskAndRestores) {
    NEED_CURL();
    const uint64_t ctx = 1024;
    uint64_t one = 0;   // committed bytes of one session
    {
        auto e = runtime::Engine::open(tiny(), test::cpu_options(Numerics::Official));
        auto sess = e->new_session(ctx);
        sess->eval(test::random_tokens(60, 0, 256, 1));
        one = sess->accounting().committed;
    }
    const std::string dir = test::tmp_dir() + "/serve-kv-disk";
    fs::remove_all(dir);
    Server s({"-m", tiny(), "--ctx", std::to_string(ctx), "--kv-budget", std::to_string(one * 5 / 2), "--kv-disk-dir",
              dir, "--kv-cache-min-tokens", "1"});
    auto ask = [&](const json& messages) {
        json b = {{"model", "deepseek-chat"}, {"messages", messages}, {"max_tokens", 12}, {"temperature", 0}};
        Reply r = curl(s.url("/v1/chat/completions"), b.dump());
        EXPECT_EQ(r.status, 200) << r.body << s.log();
        return r.j();
    };
    const json first = json::array({{{"role", "user"}, {"content", "The first conversation, about boats."}}});
    json a1 = ask(first);
    for (const char* other : {"Second: trains.", "Third: planes and more planes.", "Fourth: bicycles."})
        ask(json::array({{{"role", "user"}, {"content", other}}}));
    std::string mt = curl(s.url("/metrics")).body;
    EXPECT_GE(metric(mt, "dsv4_sessions_evicted_total"), 2) << mt;
    EXPECT_GE(metric(mt, "dsv4_sessions_saved_total"), 2);
    EXPECT_GE(metric(mt, "dsv4_sessions_on_disk"), 2);
    EXPECT_LE(metric(mt, "dsv4_sessions_resident"), 2);
    EXPECT_LE(metric(mt, "dsv4_kv_budget_used_bytes"), double(one * 5 / 2));
    size_t files = 0;
    for (const auto& f : fs::directory_iterator(dir)) files += f.path().extension() == ".kv";
    EXPECT_GE(files, 2u);

    // The first conversation continues: its KV comes back from disk.
    json second = first;
    second.push_back({{"role", "assistant"}, {"content", a1["choices"][0]["message"]["content"]}});
    second.push_back({{"role", "user"}, {"content", "And sails?"}});
    json a2 = ask(second);
    const int cached = a2["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(cached, 10) << a2.dump();
    mt = curl(s.url("/metrics")).body;
    EXPECT_GE(metric(mt, "dsv4_sessions_restored_total"), 1);
    // ... and the continuation is what a fresh server computes from scratch.
    Server fresh({"-m", tiny(), "--ctx", std::to_string(ctx)});
    json b = {{"model", "deepseek-chat"}, {"messages", second}, {"max_tokens", 12}, {"temperature", 0}};
    Reply ref = curl(fresh.url("/v1/chat/completions"), b.dump());
    ASSERT_EQ(ref.status, 200);
    EXPECT_EQ(ref.j()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(ref.j()["choices"][0]["message"]["content"], a2["choices"][0]["message"]["content"]);
    EXPECT_EQ(s.stop(), 0) << s.log();
}

TEST(ServeNode, OfficialOpenAIClient) {
    NEED_CURL();
    const std::string dir = std::string(DSV4_SOURCE_DIR) + "/tools/node";
    if (!have("node") || !fs::exists(dir + "/node_modules/openai")) {
        if (require_oracles()) FAIL() << "node or the openai npm package is missing (run scripts/setup.sh)";
        GTEST_SKIP() << "node or tools/node/node_modules/openai is missing";
    }
    Server s({"-m", tiny(), "--ctx", "4096"});
    const std::string out = test::tmp_dir() + "/openai-node.log";
    const std::string cmd = "node " + dir + "/serve_openai_test.mjs " + s.url("/v1") + " > " + out + " 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << slurp(out) << "\nserver log:\n" << s.log();
}

#endif  // DSV4_BINARY
