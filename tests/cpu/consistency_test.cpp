// Internal consistency of the CPU backend (docs/validation.md "Internal consistency"):
// one prefill vs token-by-token decode vs awkward chunkings, lazy vs eager KV, the guard,
// the budget, and snapshot -> restore -> continue.
#include <gtest/gtest.h>

#include "dsv4/backend.h"
#include "dsv4/sampler.h"
#include "test_util.h"

using namespace dsv4;

namespace {

using test::expect_same;

std::string tiny() { return test::synth_model("cons-tiny", "tiny"); }
std::string small() { return test::synth_model("cons-small", "small", [](model::Config& c) { c.n_layer = 6; }); }

}  // namespace

class ChunkingTest : public ::testing::TestWithParam<Numerics> {};

TEST_P(ChunkingTest, PrefillEqualsDecodeEqualsAwkwardSplitsTiny) {
    auto e = runtime::Engine::open(tiny(), test::cpu_options(GetParam()));
    const auto toks = test::random_tokens(300, 0, 256);   // 2 rows of ratio 128, indexer selecting
    const size_t V = e->config().n_vocab;
    const auto ref = test::all_logits(*e, toks, 1024);
    const uint32_t w = e->config().n_swa;
    for (std::vector<size_t> split : std::vector<std::vector<size_t>>{
             {1}, {3}, {4}, {5}, {127}, {128}, {129}, {w - 1}, {w + 1}, {2, 5, 127, 1, 130}, {6, 4}})
        expect_same(ref, test::all_logits(*e, toks, 1024, split), V, "split " + std::to_string(split[0]));
}

TEST_P(ChunkingTest, PrefillChunkSizeDoesNotMatterSmall) {
    const auto toks = test::random_tokens(600, 0, 256);
    auto e1 = runtime::Engine::open(small(), test::cpu_options(GetParam(), 512));
    auto e2 = runtime::Engine::open(small(), test::cpu_options(GetParam(), 37));   // window 128 > chunk
    const size_t V = e1->config().n_vocab;
    const auto ref = test::all_logits(*e1, toks, 2048);
    expect_same(ref, test::all_logits(*e2, toks, 2048), V, "chunk 37");
    expect_same(ref, test::all_logits(*e1, toks, 2048, {127, 1, 129, 3}), V, "split 127,1,129,3");
}

INSTANTIATE_TEST_SUITE_P(Numerics, ChunkingTest, ::testing::Values(Numerics::Official, Numerics::Plain),
                         [](const auto& info) { return std::string(numerics_name(info.param)); });

TEST(BackendOptions, ChunkZeroIsTheBackendsDefaultAndSizesTheRing) {
    // BackendOptions::prefill_chunk 0 (the CLI's default) takes the backend's own chunk, which
    // the engine's sessions then size their raw ring by; an explicit chunk is kept.
    auto m = model::Model::load(tiny());
    EXPECT_EQ(make_cpu_backend(*m, BackendOptions{})->options().prefill_chunk, kCpuPrefillChunk);
    BackendOptions o;
    o.prefill_chunk = 100;
    EXPECT_EQ(make_cpu_backend(*m, o)->options().prefill_chunk, 100u);
    runtime::EngineOptions eo;
    eo.backend = "cpu";
    auto e = runtime::Engine::open(tiny(), eo);
    auto s = e->new_session(4096);
    EXPECT_EQ(s->prefill_chunk(), kCpuPrefillChunk);
    const uint64_t window = m->config.n_swa;
    EXPECT_EQ(kv::Layout::make(m->config, 4096, s->prefill_chunk()).raw_cap, window + kCpuPrefillChunk);
}

TEST(KvLazy, LazyAndEagerAreBitIdenticalAcrossGrowth) {
    // Tiny initial commit: a 2,000-token prompt and 300 generated tokens cross many growth points.
    auto opt_lazy = test::cpu_options(Numerics::Official, 64);
    opt_lazy.kv_opt.initial_rows = 1;
    opt_lazy.kv_opt.growth = 1.5;
    auto opt_eager = test::cpu_options(Numerics::Official, 64);
    opt_eager.kv_opt.eager = true;
    auto lazy = runtime::Engine::open(tiny(), opt_lazy);
    auto eager = runtime::Engine::open(tiny(), opt_eager);
    const auto prompt = test::random_tokens(2000, 0, 256, 11);
    const size_t V = lazy->config().n_vocab;
    auto s1 = lazy->new_session(8192), s2 = eager->new_session(8192);
    const uint64_t committed0 = s1->accounting().committed;
    std::vector<float> a(prompt.size() * V), b(prompt.size() * V);
    s1->eval(prompt, a.data());
    s2->eval(prompt, b.data());
    expect_same(a, b, V, "prefill");
    for (int i = 0; i < 300; ++i) {
        const int32_t t = test::argmax(s1->logits().data(), V);
        ASSERT_EQ(t, test::argmax(s2->logits().data(), V)) << "decode step " << i;
        s1->eval(std::vector<int32_t>{t});
        s2->eval(std::vector<int32_t>{t});
        expect_same(s1->logits(), s2->logits(), V, "decode step " + std::to_string(i));
    }
    EXPECT_GT(s1->accounting().committed, committed0) << "the lazy session never grew";
    EXPECT_LT(s1->accounting().committed, s2->accounting().committed);
    EXPECT_EQ(s2->accounting().committed, s2->accounting().reserved);
}

TEST(KvLazy, GuardRefusesAStepIntoUncommittedRows) {
    auto opt = test::cpu_options();
    opt.kv_opt.initial_rows = 2;
    opt.kv_opt.allow_growth = false;
    auto e = runtime::Engine::open(tiny(), opt);
    auto s = e->new_session(4096);
    const auto toks = test::random_tokens(4, 0, 256);
    s->eval(toks);   // 4 tokens: one ratio-4 row, committed
    const uint64_t n_before = s->kv().n_tokens();
    try {
        s->eval(test::random_tokens(400, 0, 256));
        FAIL() << "a step past the committed rows was not refused";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("kv"), std::string::npos) << err.what();
    }
    EXPECT_EQ(s->kv().n_tokens(), n_before);
    EXPECT_EQ(s->tokens().size(), 4u);
}

TEST(KvBudget, ExhaustedBudgetFailsOneStepAndSparesTheOthers) {
    auto opt = test::cpu_options();
    opt.kv_opt.initial_rows = 1;
    uint64_t one_session = 0;
    {
        auto probe = runtime::Engine::open(tiny(), opt);
        one_session = probe->new_session(1 << 16)->accounting().committed;
    }
    opt.kv_budget = one_session + (64 << 10);   // one session and 64 KiB of growth
    auto e = runtime::Engine::open(tiny(), opt);
    auto a = e->new_session(1 << 16);
    a->eval(test::random_tokens(64, 0, 256));
    const std::vector<float> before = a->logits();
    // A second session does not fit: refused at creation, with the budget named.
    try {
        auto b = e->new_session(1 << 16);
        FAIL() << "a session beyond the budget was created";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("budget"), std::string::npos) << err.what();
    }
    // A step of `a` that would grow past the budget is refused before anything is written.
    try {
        a->eval(test::random_tokens(3000, 0, 256));
        FAIL() << "growth beyond the budget was not refused";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("budget"), std::string::npos) << err.what();
    }
    EXPECT_EQ(a->logits(), before);
    EXPECT_EQ(a->kv().n_tokens(), 64u);
    a->eval(std::vector<int32_t>{5});   // and it keeps working
    EXPECT_EQ(a->tokens().size(), 65u);
    EXPECT_LE(e->budget().used(), e->budget().limit());
}

TEST(Snapshot, SaveLoadInAFreshEngineContinuesIdentically) {
    const auto prompt = test::random_tokens(530, 0, 256, 3);
    const auto more = test::random_tokens(40, 0, 256, 4);
    const std::string path = test::tmp_dir() + "/snap.kv";
    std::vector<float> uninterrupted;
    {
        auto e = runtime::Engine::open(tiny(), test::cpu_options(Numerics::Official));
        auto s = e->new_session(4096);
        s->eval(prompt);
        s->save_file(path);
        const size_t V = e->config().n_vocab;
        uninterrupted.resize(more.size() * V);
        s->eval(more, uninterrupted.data());
    }
    auto opt = test::cpu_options(Numerics::Official);
    opt.kv_opt.initial_rows = 1;   // the restore must grow before writing
    auto e = runtime::Engine::open(tiny(), opt);
    auto s = e->new_session(8192);
    s->load_file(path);
    EXPECT_EQ(s->tokens(), prompt);
    const size_t V = e->config().n_vocab;
    std::vector<float> resumed(more.size() * V);
    s->eval(more, resumed.data());
    expect_same(uninterrupted, resumed, V, "continuation after restore");
}

TEST(Snapshot, RejectsAnotherModel) {
    const std::string other = test::synth_model("cons-tiny-seed2", "tiny", {}, "f32", 2);
    const std::string path = test::tmp_dir() + "/snap-other.kv";
    {
        auto e = runtime::Engine::open(tiny(), test::cpu_options());
        auto s = e->new_session(1024);
        s->eval(test::random_tokens(10, 0, 256));
        s->save_file(path);
    }
    auto e = runtime::Engine::open(other, test::cpu_options());
    auto s = e->new_session(1024);
    try {
        s->load_file(path);
        FAIL() << "a snapshot of another model was accepted";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("model"), std::string::npos) << err.what();
    }
    EXPECT_EQ(s->tokens().size(), 0u);
}

TEST(ForwardErrors, BadInputIsAnError) {
    auto e = runtime::Engine::open(tiny(), test::cpu_options());
    auto s = e->new_session(16);
    EXPECT_THROW(s->eval(std::vector<int32_t>{}), Error);
    EXPECT_THROW(s->eval(std::vector<int32_t>{int32_t(e->config().n_vocab)}), Error);
    EXPECT_THROW(s->eval(std::vector<int32_t>{-1}), Error);
    EXPECT_THROW(s->eval(test::random_tokens(17, 0, 256)), Error);   // longer than the context
    EXPECT_EQ(s->kv().n_tokens(), 0u);
    s->eval(test::random_tokens(16, 0, 256));                        // exactly the context is fine
}

// Greedy steps (StepInput::greedy, Session::eval_greedy) pick what argmax_excluding picks from
// the same logits: a prompt, then decode steps of a session through eval_greedy and of two
// more in one round (one wanting the id alone, the other the id and its logits), odd steps
// excluding the id the logits would pick; the timelines stay those of a session stepped with
// logits.
TEST(Greedy, IdsEqualArgmaxOfTheLogits) {
    auto e = runtime::Engine::open(tiny(), test::cpu_options());
    const size_t V = e->config().n_vocab;
    auto ref = e->new_session(1024), a = e->new_session(1024), b = e->new_session(1024), c = e->new_session(1024);
    const auto prompt = test::random_tokens(70, 0, 256, 21);
    ref->eval(prompt);
    int32_t ia = a->eval_greedy(prompt);
    EXPECT_TRUE(a->logits().empty());
    std::vector<float> lc(V);
    int32_t ib = e->backend().forward_greedy(b->kv(), prompt);
    int32_t ic = e->backend().forward_greedy(c->kv(), prompt, -1, lc.data());
    expect_same(ref->logits(), lc, V, "prompt logits beside the greedy id");
    ASSERT_EQ(ia, test::argmax(ref->logits().data(), V));
    ASSERT_EQ(ib, ia);
    ASSERT_EQ(ic, ia);
    for (int i = 0; i < 8; ++i) {
        const int32_t t = test::argmax(ref->logits().data(), V);
        const std::vector<int32_t> one{t};
        ref->eval(one);
        const int32_t ex = i % 2 ? test::argmax(ref->logits().data(), V) : -1;   // odd steps: exclude the pick
        ia = a->eval_greedy(one, ex);
        StepInput st[2] = {{&b->kv(), one, false, nullptr, {}, &ib, ex}, {&c->kv(), one, false, lc.data(), {}, &ic}};
        e->backend().forward(st);
        ASSERT_TRUE(st[0].error.empty() && st[1].error.empty()) << st[0].error << st[1].error;
        expect_same(ref->logits(), lc, V, "decode logits beside the greedy id, step " + std::to_string(i));
        const std::span<const float> lr(ref->logits());
        const int32_t want = argmax_excluding(lr, std::span<const int32_t>(&ex, ex >= 0 ? 1 : 0));
        EXPECT_EQ(ia, want) << "step " << i;
        EXPECT_EQ(ib, want) << "step " << i;
        EXPECT_EQ(ic, argmax(lr)) << "step " << i;
        if (ex >= 0) {
            EXPECT_NE(ia, ex) << "step " << i;
        }
    }
    EXPECT_EQ(a->tokens(), ref->tokens());
}

// `dsv4 serve` composes its steps from whatever sessions are ready: a session's bits must not
// depend on it. Solo, all prompts in one step, server-sized steps with one arrival a step,
// small steps: every session's logits after its prompt and its greedy ids are the solo ones.
TEST(Batching, ServeCompositionsEqualSolo) {
    auto e = runtime::Engine::open(tiny(), test::cpu_options(Numerics::Official, 64));
    test::expect_compositions_equal_solo(e->backend(), "cpu-compose tiny", 6, 6, 1024);
    // decode steps across position 128 (a ratio-128 layer's first compressed row)
    test::expect_compositions_equal_solo(e->backend(), "cpu-compose tiny, across 128", 6, 24, 1024, 100);
}
