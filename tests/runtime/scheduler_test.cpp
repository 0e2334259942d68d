// The Scheduler in-process on a tiny synthetic model: batched greedy decode equals one
// session at a time, prefix reuse, chunked prefill interleaved with decode, LRU eviction to
// disk and restore, budget exhaustion, cancellation, the request limit.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "dsv4/scheduler.h"
#include "test_util.h"

using namespace dsv4;
using namespace std::chrono_literals;

namespace {

std::string tiny() { return test::synth_model("sched-tiny", "tiny"); }

constexpr int32_t kEos = 257;   // the byte vocabulary's EOS

// Greedy continuation with one session and no scheduler: the reference.
std::vector<int32_t> greedy_reference(runtime::Engine& e, const std::vector<int32_t>& prompt, size_t n, uint64_t ctx) {
    auto s = e.new_session(ctx);
    s->eval(prompt);
    std::vector<int32_t> out;
    while (out.size() < n) {
        const int32_t t = argmax(s->logits());
        if (t == kEos) break;
        out.push_back(t);
        if (out.size() == n || s->tokens().size() >= ctx) break;
        s->eval(std::vector<int32_t>{t});
    }
    return out;
}

struct Collected {
    std::mutex mu;
    std::vector<int32_t> tokens;
};

runtime::GenerationRequest greedy_request(const std::vector<int32_t>& prompt, uint32_t n,
                                          std::shared_ptr<Collected> c) {
    runtime::GenerationRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.max_tokens = n;
    r.stop_tokens = {kEos};
    r.on_token = [c](int32_t t) {
        std::lock_guard<std::mutex> l(c->mu);
        c->tokens.push_back(t);
        return runtime::TokenAction{};
    };
    return r;
}

// Submits, waits, returns (result, tokens).
std::pair<runtime::JobResult, std::vector<int32_t>> run_one(runtime::Scheduler& s, const std::vector<int32_t>& prompt,
                                                           uint32_t n) {
    auto c = std::make_shared<Collected>();
    auto job = s.submit(greedy_request(prompt, n, c));
    EXPECT_TRUE(job);
    if (!job) return {};
    EXPECT_TRUE(job->wait(60s));
    return {job->result(), c->tokens};
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

runtime::EngineOptions opts(uint64_t budget = 0) {
    auto o = test::cpu_options(Numerics::Official, 64);
    o.kv_budget = budget;
    return o;
}

}  // namespace

// The scheduler's and `dsv4 run`'s prompt pieces: never one token while more of the prompt
// remains (on the GPU a lone token is a decode round, another order of sums), never one left
// behind, otherwise what was asked for.
TEST(PromptPiece, NeverALoneTokenOfALongerPrompt) {
    for (size_t rem = 1; rem <= 300; ++rem)
        for (size_t want = 1; want <= 300; ++want) {
            const size_t n = runtime::prompt_piece(rem, want), plain = std::min(rem, want);
            ASSERT_GE(n, 1u);
            ASSERT_LE(n, rem);
            ASSERT_LE(n, want + 2);
            if (rem > 1) {
                ASSERT_GE(n, 2u) << rem << " " << want;
                ASSERT_NE(rem - n, 1u) << rem << " " << want;
            }
            if (plain >= 2 && rem - plain != 1) {
                ASSERT_EQ(n, plain) << rem << " " << want;
            }
        }
    // A whole prompt cut by a budget that would leave lone tokens (60 = 59 + 1, 3 = 2 + 1).
    for (size_t len : {60u, 3u, 118u, 2u}) {
        size_t done = 0, pieces = 0;
        while (done < len) {
            const size_t n = runtime::prompt_piece(len - done, len == 118 ? 1 : 59);
            ASSERT_GT(n, 1u) << len;
            done += n;
            ++pieces;
        }
        EXPECT_EQ(done, len);
        EXPECT_GE(pieces, 1u);
    }
    EXPECT_EQ(runtime::prompt_piece(1, 256), 1u);   // a one-token prompt (or a reused prefix's last token)
}

TEST(Scheduler, BatchedGreedyEqualsOneSessionAtATime) {
    auto e = runtime::Engine::open(tiny(), opts());
    const uint64_t ctx = 512;
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < 8; ++i) prompts.push_back(test::random_tokens(5 + i * 37, 0, 256, 100 + i));
    std::vector<std::vector<int32_t>> ref;
    for (auto& p : prompts) ref.push_back(greedy_reference(*e, p, 24, ctx));

    runtime::SchedulerOptions so;
    so.ctx = ctx;
    so.max_sessions = 8;
    so.prefill_chunk = 40;
    so.prefill_step_tokens = 64;
    runtime::Scheduler s(*e, so);
    std::vector<std::shared_ptr<Collected>> got;
    std::vector<std::shared_ptr<runtime::Job>> jobs;
    for (auto& p : prompts) {
        got.push_back(std::make_shared<Collected>());
        jobs.push_back(s.submit(greedy_request(p, 24, got.back())));
        ASSERT_TRUE(jobs.back());
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
        ASSERT_TRUE(jobs[i]->wait(60s));
        EXPECT_NE(jobs[i]->result().finish, runtime::FinishReason::Error) << jobs[i]->result().error;
        EXPECT_EQ(got[i]->tokens, ref[i]) << "prompt " << i;
    }
    const auto st = s.stats();
    // Decode steps were shared: far fewer steps than rows.
    EXPECT_LT(st.steps * 2, st.step_rows);
    EXPECT_EQ(st.sessions_resident, 8u);
}

TEST(Scheduler, ReusesTheLongestResidentPrefix) {
    auto e = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 512;
    runtime::Scheduler s(*e, so);
    const auto prompt = test::random_tokens(50, 0, 256, 3);
    auto [r1, gen1] = run_one(s, prompt, 10);
    ASSERT_EQ(r1.cached_tokens, 0u);
    ASSERT_EQ(gen1.size(), 10u);
    // The session holds the prompt and the generated tokens but the last (never evaluated).
    std::vector<int32_t> next = concat(prompt, gen1);
    next.push_back(5);
    next.push_back(7);
    auto [r2, gen2] = run_one(s, next, 10);
    EXPECT_EQ(r2.cached_tokens, prompt.size() + gen1.size() - 1);
    EXPECT_EQ(gen2, greedy_reference(*e, next, 10, 512));
    // An unrelated prompt gets a new session; the first stays resident.
    auto [r3, gen3] = run_one(s, test::random_tokens(20, 0, 256, 9), 4);
    EXPECT_EQ(r3.cached_tokens, 0u);
    EXPECT_EQ(s.stats().sessions_resident, 2u);
    // The same prompt again: a prefix of nothing resident (the timeline moved on) -> 0 cached.
    auto [r4, gen4] = run_one(s, prompt, 10);
    EXPECT_EQ(r4.cached_tokens, 0u);
    EXPECT_EQ(gen4, gen1);
}

TEST(Scheduler, LongPrefillDoesNotStallDecode) {
    auto e = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 1024;
    so.prefill_chunk = 32;
    so.prefill_step_tokens = 32;
    runtime::Scheduler s(*e, so);
    struct Log {
        std::mutex mu;
        std::vector<char> events;   // 's' short token, 'l' long token
    };
    auto log = std::make_shared<Log>();
    auto mk = [&](const std::vector<int32_t>& p, char tag, uint32_t n) {
        runtime::GenerationRequest r;
        r.prompt = p;
        r.sampling.temperature = 0;
        r.max_tokens = n;
        r.on_token = [log, tag](int32_t) {
            std::lock_guard<std::mutex> l(log->mu);
            log->events.push_back(tag);
            return runtime::TokenAction{};
        };
        return r;
    };
    auto a = s.submit(mk(test::random_tokens(8, 0, 256, 1), 's', 40));
    auto b = s.submit(mk(test::random_tokens(600, 0, 256, 2), 'l', 2));
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->wait(60s) && b->wait(60s));
    // The long prompt takes ~19 steps of 32 tokens; the short request decodes meanwhile.
    size_t short_before_long = 0;
    for (char c : log->events) {
        if (c == 'l') break;
        ++short_before_long;
    }
    EXPECT_GE(short_before_long, 10u);
    EXPECT_EQ(b->result().completion_tokens, 2u);
}

TEST(Scheduler, EvictsLeastRecentlyUsedToDiskAndRestores) {
    const uint64_t ctx = 512;
    // The committed bytes of one session holding a short conversation.
    uint64_t one = 0;
    {
        auto e = runtime::Engine::open(tiny(), opts());
        auto s = e->new_session(ctx);
        s->eval(test::random_tokens(60, 0, 256, 1));
        one = s->accounting().committed;
    }
    auto e = runtime::Engine::open(tiny(), opts(one * 5 / 2));   // room for two sessions
    const std::string dir = test::tmp_dir() + "/sched-disk";
    std::filesystem::remove_all(dir);
    runtime::SchedulerOptions so;
    so.ctx = ctx;
    so.max_sessions = 8;
    so.disk_dir = dir;
    runtime::Scheduler s(*e, so);

    std::vector<std::vector<int32_t>> prompts, timelines;
    for (uint64_t i = 0; i < 4; ++i) {
        prompts.push_back(test::random_tokens(40 + i, 0, 256, 20 + i));
        auto [r, gen] = run_one(s, prompts.back(), 12);
        ASSERT_NE(r.finish, runtime::FinishReason::Error) << r.error;
        auto tl = concat(prompts.back(), gen);
        tl.pop_back();   // the last sampled token is not evaluated
        timelines.push_back(tl);
    }
    auto st = s.stats();
    EXPECT_GE(st.evictions, 2u);
    EXPECT_GE(st.disk_saves, 2u);
    EXPECT_LE(st.sessions_resident, 2u);
    EXPECT_LE(st.kv_budget_used, one * 5 / 2);
    // The first conversation went to disk, exactly as it was.
    auto disk = s.disk_tokens();
    ASSERT_NE(std::find(disk.begin(), disk.end(), timelines[0]), disk.end());

    // Continuing it restores the snapshot instead of prefilling; the continuation is the
    // one a fresh prefill gives.
    auto next = concat(timelines[0], {65, 66, 67});
    auto [r, gen] = run_one(s, next, 12);
    ASSERT_NE(r.finish, runtime::FinishReason::Error) << r.error;
    EXPECT_TRUE(r.restored_from_disk);
    EXPECT_EQ(r.cached_tokens, timelines[0].size());
    auto ref_engine = runtime::Engine::open(tiny(), opts());
    EXPECT_EQ(gen, greedy_reference(*ref_engine, next, 12, ctx));
    EXPECT_GE(s.stats().disk_restores, 1u);
}

TEST(Scheduler, BudgetExhaustedWithNothingToEvictFailsCleanly) {
    auto e = runtime::Engine::open(tiny(), opts(64 * 1024));   // less than one session
    runtime::SchedulerOptions so;
    so.ctx = 512;
    runtime::Scheduler s(*e, so);
    auto [r, gen] = run_one(s, test::random_tokens(30, 0, 256, 1), 4);
    EXPECT_EQ(r.finish, runtime::FinishReason::Error);
    EXPECT_EQ(r.error_kind, runtime::ErrorKind::KvExhausted);
    EXPECT_NE(r.error.find("KV"), std::string::npos) << r.error;
    // Raise the budget: the scheduler serves again.
    e->budget().set_limit(0);
    auto [r2, gen2] = run_one(s, test::random_tokens(30, 0, 256, 1), 4);
    EXPECT_NE(r2.finish, runtime::FinishReason::Error) << r2.error;
    EXPECT_EQ(gen2.size(), 4u);
}

TEST(Scheduler, CancelledSessionStaysReusable) {
    auto e = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 4096;
    runtime::Scheduler s(*e, so);
    const auto prompt = test::random_tokens(20, 0, 256, 4);
    auto c = std::make_shared<Collected>();
    auto req = greedy_request(prompt, 3000, c);
    req.stop_tokens.clear();   // never stops on its own
    auto job = s.submit(std::move(req));
    ASSERT_TRUE(job);
    for (int i = 0; i < 2000; ++i) {
        {
            std::lock_guard<std::mutex> l(c->mu);
            if (c->tokens.size() >= 20) break;
        }
        std::this_thread::sleep_for(1ms);
    }
    job->cancel();
    ASSERT_TRUE(job->wait(30s));
    EXPECT_EQ(job->result().finish, runtime::FinishReason::Cancelled);
    std::vector<int32_t> gen;
    {
        std::lock_guard<std::mutex> l(c->mu);
        gen = c->tokens;
    }
    ASSERT_GE(gen.size(), 20u);
    ASSERT_LT(gen.size(), 3000u);
    // The resident timeline is the prompt plus what was evaluated; extending it reuses it.
    auto resident = s.resident_tokens();
    ASSERT_EQ(resident.size(), 1u);
    ASSERT_GE(resident[0].size(), prompt.size() + gen.size() - 1);
    auto next = concat(resident[0], {1, 2, 3});
    auto [r, g2] = run_one(s, next, 5);
    EXPECT_EQ(r.cached_tokens, resident[0].size());
    EXPECT_EQ(g2, greedy_reference(*e, next, 5, 4096));
}

TEST(Scheduler, RefusesBeyondActivePlusQueued) {
    auto e = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 4096;
    so.max_sessions = 1;
    so.max_queued = 1;
    runtime::Scheduler s(*e, so);
    auto mk = [] {
        runtime::GenerationRequest r;
        r.prompt = test::random_tokens(10, 0, 256, 5);
        r.max_tokens = 4000;
        return r;
    };
    auto a = s.submit(mk());
    auto b = s.submit(mk());
    std::string why;
    auto c = s.submit(mk(), &why);
    ASSERT_TRUE(a && b);
    EXPECT_FALSE(c);
    EXPECT_NE(why.find("too many requests"), std::string::npos) << why;
    a->cancel();
    b->cancel();
    ASSERT_TRUE(a->wait(30s) && b->wait(30s));
    EXPECT_EQ(b->result().finish, runtime::FinishReason::Cancelled);
    auto d = s.submit(mk());
    EXPECT_TRUE(d);
    d->cancel();
    EXPECT_TRUE(d->wait(30s));
    EXPECT_EQ(s.stats().requests_rejected, 1u);
}

TEST(Scheduler, ShutdownSavesIdleSessionsAndANewSchedulerFindsThem) {
    const std::string dir = test::tmp_dir() + "/sched-restart";
    std::filesystem::remove_all(dir);
    auto e = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 512;
    so.disk_dir = dir;
    std::vector<int32_t> timeline;
    const auto prompt = test::random_tokens(33, 0, 256, 8);
    {
        runtime::Scheduler s(*e, so);
        auto [r, gen] = run_one(s, prompt, 6);
        timeline = concat(prompt, gen);
        timeline.pop_back();
    }
    runtime::Scheduler s2(*e, so);
    auto next = concat(timeline, {9, 9});
    auto [r, gen] = run_one(s2, next, 6);
    EXPECT_TRUE(r.restored_from_disk);
    EXPECT_EQ(r.cached_tokens, timeline.size());
    EXPECT_EQ(gen, greedy_reference(*e, next, 6, 512));
}

// Greedy decode steps take the backend's id (device_greedy, the default) instead of the
// logits: the same tokens as downloading the logits and sampling on the host, for greedy
// requests and beside them for seeded sampled ones (which still take the logits).
TEST(Scheduler, GreedyIdsFromTheBackendEqualTheLogitsPath) {
    auto e = runtime::Engine::open(tiny(), opts());
    std::vector<runtime::GenerationRequest> reqs;
    std::vector<std::vector<std::vector<int32_t>>> got(2);
    for (int mode = 0; mode < 2; ++mode) {
        runtime::SchedulerOptions so;
        so.ctx = 512;
        so.max_sessions = 6;
        so.device_greedy = mode == 1;
        runtime::Scheduler s(*e, so);
        std::vector<std::shared_ptr<Collected>> col;
        std::vector<std::shared_ptr<runtime::Job>> jobs;
        for (uint64_t i = 0; i < 6; ++i) {
            col.push_back(std::make_shared<Collected>());
            auto r = greedy_request(test::random_tokens(9 + 13 * i, 0, 256, 40 + i), 20, col.back());
            if (i % 3 == 2) {   // sampled, seeded: reproducible, and never an id-only step
                r.sampling.temperature = 0.9f;
                r.sampling.seed = 7 + i;
            }
            jobs.push_back(s.submit(std::move(r)));
            ASSERT_TRUE(jobs.back());
        }
        for (size_t i = 0; i < jobs.size(); ++i) {
            ASSERT_TRUE(jobs[i]->wait(60s));
            EXPECT_NE(jobs[i]->result().finish, runtime::FinishReason::Error) << jobs[i]->result().error;
            got[size_t(mode)].push_back(col[i]->tokens);
        }
    }
    EXPECT_EQ(got[0], got[1]);
    EXPECT_EQ(got[0][0], greedy_reference(*e, test::random_tokens(9, 0, 256, 40), 20, 512));
}

// A session whose last step was id-only keeps no logits: it (and its snapshot on disk) serves
// prompts that extend it, while the identical prompt is evaluated afresh, with the same tokens.
TEST(Scheduler, SessionWithoutLogitsServesOnlyPromptsExtendingIt) {
    const std::string dir = test::tmp_dir() + "/sched-nologits";
    std::filesystem::remove_all(dir);
    auto e = runtime::Engine::open(tiny(), opts());
    auto ref_engine = runtime::Engine::open(tiny(), opts());
    runtime::SchedulerOptions so;
    so.ctx = 512;
    so.max_sessions = 1;   // every new conversation evicts the resident one to disk
    so.disk_dir = dir;
    runtime::Scheduler s(*e, so);
    const auto prompt = test::random_tokens(30, 0, 256, 61);
    auto [r1, gen1] = run_one(s, prompt, 8);
    ASSERT_EQ(gen1.size(), 8u);
    auto timeline = concat(prompt, gen1);
    timeline.pop_back();   // the last sampled token is not evaluated
    // The identical timeline while resident: no logits to sample from, so a fresh prefill.
    auto [r2, gen2] = run_one(s, timeline, 5);
    EXPECT_EQ(r2.cached_tokens, 0u);
    EXPECT_EQ(gen2, greedy_reference(*ref_engine, timeline, 5, 512));
    // r2's conversation is resident now; the first went to disk without logits.
    auto disk = s.disk_tokens();
    ASSERT_NE(std::find(disk.begin(), disk.end(), timeline), disk.end());
    // The identical timeline again: the snapshot is not restored for it ...
    auto [r3, gen3] = run_one(s, timeline, 5);
    EXPECT_FALSE(r3.restored_from_disk);
    EXPECT_EQ(r3.cached_tokens, 0u);
    EXPECT_EQ(gen3, gen2);
    // ... but a prompt extending it restores it.
    auto next = concat(timeline, {70, 71});
    auto [r4, gen4] = run_one(s, next, 5);
    EXPECT_TRUE(r4.restored_from_disk);
    EXPECT_EQ(r4.cached_tokens, timeline.size());
    EXPECT_EQ(gen4, greedy_reference(*ref_engine, next, 5, 512));
}
