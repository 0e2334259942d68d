// The dsv4 binary as users and outside checks run it: exit codes, one-line errors, output
// formats of logits/tokenize/bench/plot/info, --stats-json.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace dsv4;

namespace {

struct Result {
    int code;
    std::string out, err;
};

std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
}

Result run(const std::string& args) {
    const std::string o = test::tmp_dir() + "/cli.out", e = test::tmp_dir() + "/cli.err";
    const std::string cmd = std::string(DSV4_BINARY) + " " + args + " > " + o + " 2> " + e;
    const int st = std::system(cmd.c_str());
    return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(o), slurp(e)};
}

std::string tiny() { return test::synth_model("cli-tiny", "tiny"); }

}  // namespace

TEST(Cli, LogitsWritesRawFloatsAndStats) {
    const std::string out = test::tmp_dir() + "/l.bin", stats = test::tmp_dir() + "/s.json";
    Result r = run("logits -m " + tiny() + " --tokens 1,2,3,4,5 --out " + out + " --stats-json " + stats +
                   " --numerics plain --kv-initial-rows 1");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ifstream f(out, std::ios::binary | std::ios::ate);
    EXPECT_EQ(size_t(f.tellg()), 5u * 283u * sizeof(float));
    std::ifstream sj(stats);
    const auto j = nlohmann::json::parse(sj);
    for (const char* k : {"kv_logical_bytes", "kv_reserved_bytes", "kv_committed_bytes", "kv_live_bytes"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_LE(j["kv_committed_bytes"].get<uint64_t>(), j["kv_reserved_bytes"].get<uint64_t>());
    EXPECT_LE(j["kv_live_bytes"].get<uint64_t>(), j["kv_committed_bytes"].get<uint64_t>());
}

TEST(Cli, FastPrefillIsACudaOptionTheCpuIgnores) {
    // --fast-prefill (BackendOptions::fast_prefill) changes only the CUDA backend's prompt
    // products: on the CPU the logits stay the same bytes.
    const std::string a = test::tmp_dir() + "/fp-a.bin", b = test::tmp_dir() + "/fp-b.bin";
    const std::string args = "logits --backend cpu -m " + tiny() + " --tokens 1,2,3,4,5,6,7 --out ";
    ASSERT_EQ(run(args + a).code, 0);
    Result r = run(args + b + " --fast-prefill");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string x = slurp(a), y = slurp(b);
    EXPECT_EQ(x.size(), 7u * 283u * sizeof(float));
    EXPECT_TRUE(x == y);
}

TEST(Cli, BadInputIsOneClearLineAndNonZero) {
    auto one_line_error = [](const Result& r, const std::string& needle) {
        EXPECT_NE(r.code, 0);
        EXPECT_LT(r.code, 128) << "killed by a signal";
        EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    };
    one_line_error(run("logits -m /nonexistent.gguf --tokens 1 --out /dev/null"), "/nonexistent.gguf");
    one_line_error(run("logits -m " + tiny() + " --tokens 1,99999 --out /dev/null"), "99999");
    one_line_error(run("logits -m " + tiny() + " --tokens 1,2,3 --ctx 2 --out /dev/null"), "context");
    one_line_error(run("logits -m " + tiny() + " --tokens '' --out /dev/null"), "token");
    // A file that is not GGUF.
    const std::string junk = test::tmp_dir() + "/junk.gguf";
    std::ofstream(junk) << "this is not a gguf file at all";
    one_line_error(run("info " + junk), "magic");
    one_line_error(run("run -m " + tiny() + " -p hello --ctx 4"), "context");
    one_line_error(run("run -m " + tiny() + " -p \"$(printf '\\377\\376')\""), "UTF-8");
    one_line_error(run("tokenize --text hi --no-such-flag"), "no-such-flag");
}

TEST(Cli, TokenizePrintsAJsonArray) {
    Result r = run("tokenize -m " + tiny() + " --text 'hello world'");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.is_array());
    EXPECT_GT(j.size(), 0u);
    Result s = run("tokenize -m " + tiny() + " --special --text '<｜User｜>hi'");
    ASSERT_EQ(s.code, 0) << s.err;
    EXPECT_EQ(nlohmann::json::parse(s.out)[0].get<int>(), 258);   // the byte vocabulary's <｜User｜>
}

TEST(Cli, RunPrintsTheSummaryLine) {
    const std::string stats = test::tmp_dir() + "/run.json";
    Result r = run("run -m " + tiny() + " -p 'hello there' -n 8 --temp 0 --stats-json " + stats);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("KV committed"), std::string::npos) << r.err;
    std::ifstream sj(stats);
    EXPECT_TRUE(nlohmann::json::parse(sj).contains("kv_committed_bytes"));
}

TEST(Cli, BenchWritesCsvAndPlotAndStopsAtShortPrompts) {
    const std::string prompt = test::tmp_dir() + "/prompt.txt", csv = test::tmp_dir() + "/b.csv",
                      svg = test::tmp_dir() + "/b.svg";
    std::ofstream(prompt) << std::string(300, 'a') + " the quick brown fox " + std::string(100, 'b');
    Result r = run("bench -m " + tiny() + " --prompt-file " + prompt +
                   " --ctx-start 16 --ctx-max 4096 --step-mul 2 --gen-tokens 4 --csv " + csv + " --plot " + svg);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("only"), std::string::npos) << "no message about the short prompt: " << r.err;
    std::ifstream f(csv);
    std::string header;
    std::getline(f, header);
    for (const char* col : {"ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens", "gen_tps", "kv_logical_bytes",
                            "kv_reserved_bytes", "kv_committed_bytes", "kv_live_bytes", "rss_bytes"})
        EXPECT_NE(header.find(col), std::string::npos) << col;
    int rows = 0;
    for (std::string line; std::getline(f, line);) ++rows;
    EXPECT_GE(rows, 3);
    std::ifstream s(svg);
    std::string svgtext((std::istreambuf_iterator<char>(s)), {});
    EXPECT_NE(svgtext.find("<svg"), std::string::npos);
    EXPECT_NE(svgtext.find("polyline"), std::string::npos);
    // Unwritable outputs are refused before any work.
    Result bad = run("bench -m " + tiny() + " --prompt-file " + prompt + " --csv /nonexistent/dir/x.csv");
    EXPECT_NE(bad.code, 0);
    EXPECT_NE(bad.err.find("/nonexistent/dir/x.csv"), std::string::npos) << bad.err;
}

TEST(Cli, InfoPrintsTheLogicalKvAtAContext) {
    Result r = run("info " + tiny() + " --ctx 1048576");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("KV at 1048576 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("schedule:      0 0 4 128"), std::string::npos) << r.out;
}
