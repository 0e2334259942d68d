// The OpenAI layer of `dsv4 serve` without a server: request parsing and validation,
// the output tracker (stop strings, reasoning/content streaming, DSML tool calls and the
// decode-time guard) and the tool-call replay memory. The app sources are not part of the
// library, so this file compiles serve_api.cpp itself.
#include <gtest/gtest.h>

#include "apps/serve_api.cpp"   // NOLINT: the unit under test

using namespace dsv4;
using namespace dsv4::apps::serve;

namespace {

const text::Tokenizer& tok() {
    static const text::Tokenizer t = text::Tokenizer::from_vocab(text::builtin_byte_vocab());
    return t;
}

ParsedRequest chat(const std::string& body) { return parse_chat_request(json::parse(body), ParseContext{4096}); }

ApiError chat_error(const std::string& body) {
    try {
        chat(body);
    } catch (const ApiError& e) {
        return e;
    }
    ADD_FAILURE() << "no error for " << body;
    return {};
}

// Feeds text through the tracker token by token; returns the concatenated deltas.
struct Fed {
    std::string reasoning, content;
    std::vector<runtime::TokenAction> actions;
    size_t tokens = 0;
};
Fed feed(OutputTracker& t, const std::string& text) {
    Fed f;
    for (int32_t id : tok().encode(text, true)) {
        auto a = t.push(id);
        f.actions.push_back(a);
        ++f.tokens;
        auto d = t.take_delta();
        f.reasoning += d.reasoning;
        f.content += d.content;
        if (a.stop) break;
    }
    t.finish();
    auto d = t.take_delta();
    f.reasoning += d.reasoning;
    f.content += d.content;
    return f;
}

}  // namespace

TEST(ServeApi, ThinkingControls) {
    const std::string m = R"("messages":[{"role":"user","content":"hi"}])";
    EXPECT_EQ(chat("{" + m + "}").think, text::ThinkMode::High);   // the default
    EXPECT_EQ(chat(R"({"model":"deepseek-chat",)" + m + "}").think, text::ThinkMode::None);
    EXPECT_EQ(chat(R"({"model":"deepseek-reasoner",)" + m + "}").think, text::ThinkMode::High);
    EXPECT_EQ(chat(R"({"thinking":{"type":"disabled"},)" + m + "}").think, text::ThinkMode::None);
    EXPECT_EQ(chat(R"({"model":"deepseek-chat","thinking":true,)" + m + "}").think, text::ThinkMode::High);
    EXPECT_EQ(chat(R"({"think":false,)" + m + "}").think, text::ThinkMode::None);
    EXPECT_EQ(chat(R"({"reasoning_effort":"none",)" + m + "}").think, text::ThinkMode::None);
    EXPECT_EQ(chat(R"({"reasoning_effort":"low",)" + m + "}").think, text::ThinkMode::High);
    // MAX needs a context of at least 393216 tokens; below it is HIGH.
    EXPECT_EQ(chat(R"({"reasoning_effort":"max",)" + m + "}").think, text::ThinkMode::High);
    EXPECT_EQ(parse_chat_request(json::parse(R"({"reasoning_effort":"max",)" + m + "}"), ParseContext{400000}).think,
              text::ThinkMode::Max);
}

TEST(ServeApi, SamplingKnobsAreIgnoredWhenThinking) {
    const std::string m = R"("messages":[{"role":"user","content":"hi"}],"temperature":0,"top_k":5,"top_p":0.5,"min_p":0.1,"seed":42)";
    auto off = chat(R"({"model":"deepseek-chat",)" + m + "}");
    EXPECT_EQ(off.sampling.temperature, 0.0f);
    EXPECT_EQ(off.sampling.top_k, 5);
    EXPECT_FLOAT_EQ(off.sampling.top_p, 0.5f);
    EXPECT_FLOAT_EQ(off.sampling.min_p, 0.1f);
    EXPECT_EQ(off.sampling.seed, 42u);
    auto on = chat("{" + m + "}");
    EXPECT_EQ(on.sampling.temperature, 1.0f);
    EXPECT_EQ(on.sampling.top_k, 0);
    EXPECT_FLOAT_EQ(on.sampling.top_p, 1.0f);
    EXPECT_FLOAT_EQ(on.sampling.min_p, 0.05f);
    EXPECT_EQ(on.sampling.seed, 42u);
}

TEST(ServeApi, FieldsAndTools) {
    auto r = chat(R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
        {"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"42"}],
        "tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}],
        "max_tokens":10,"max_completion_tokens":20,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true}})");
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[1].content, "ab");
    ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
    EXPECT_EQ(r.messages[2].tool_calls[0].arguments, R"({"x":1})");
    EXPECT_EQ(r.messages[2].reasoning_content, "r");
    ASSERT_EQ(r.tool_schemas.size(), 1u);
    // The function object as sent, key order kept.
    EXPECT_EQ(r.tool_schemas[0],
              R"({"name":"f","description":"d","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}})");
    EXPECT_EQ(r.max_tokens, 20u);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    auto none = chat(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
        "tools":[{"type":"function","function":{"name":"f"}}]})");
    EXPECT_TRUE(none.tool_schemas.empty());
    // The rendered prompt carries the tool preamble and ends in the assistant prefix.
    Prompt p = render_prompt(r, tok());
    EXPECT_NE(p.text.find("## Tools"), std::string::npos);
    EXPECT_TRUE(p.text.ends_with("<｜Assistant｜><think>"));
    EXPECT_EQ(p.ids, tok().encode(p.text, true));
}

TEST(ServeApi, BadRequestsNameTheField) {
    struct Case {
        const char* body;
        const char* param;
        const char* code;
    };
    const Case cases[] = {
        {R"([])", "body", "invalid_type"},
        {R"({})", "messages", "missing_required_parameter"},
        {R"({"messages":{}})", "messages", "invalid_type"},
        {R"({"messages":[]})", "messages", "empty_array"},
        {R"({"messages":[1]})", "messages[0]", "invalid_type"},
        {R"({"messages":[{"content":"x"}]})", "messages[0].role", "missing_required_parameter"},
        {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role", "invalid_value"},
        {R"({"messages":[{"role":"user","content":7}]})", "messages[0].content", "invalid_type"},
        {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0].type", "invalid_value"},
        {R"({"messages":[{"role":"user"}]})", "messages[0].content", "missing_required_parameter"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", "max_tokens", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"top_p":-1})", "top_p", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"stop":5})", "stop", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop[0]", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"stream":1})", "stream", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools[0].function", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})", "tool_choice", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"thinking":"yes"})", "thinking", "invalid_type"},
        {R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"})", "reasoning_effort", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"n":2})", "n", "invalid_value"},
        {R"({"messages":[{"role":"user","content":"x"}],"seed":"1"})", "seed", "invalid_type"},
    };
    for (const auto& c : cases) {
        ApiError e = chat_error(c.body);
        EXPECT_EQ(e.status, 400) << c.body;
        EXPECT_EQ(e.param, c.param) << c.body;
        EXPECT_EQ(e.code, c.code) << c.body;
        const json b = e.body();
        EXPECT_TRUE(b["error"]["message"].is_string());
        EXPECT_EQ(b["error"]["type"], "invalid_request_error");
    }
    try {
        parse_completion_request(json::parse(R"({"prompt":{}})"), ParseContext{});
        ADD_FAILURE();
    } catch (const ApiError& e) {
        EXPECT_EQ(e.param, "prompt");
    }
}

TEST(ServeApi, StreamsReasoningThenContent) {
    OutputTracker t(tok(), /*thinking=*/true, /*tools=*/false, {});
    Fed f = feed(t, "I should greet.</think>Hello there, friend.");
    EXPECT_EQ(f.reasoning, "I should greet.");
    EXPECT_EQ(f.content, "Hello there, friend.");
    auto m = t.final_message();
    EXPECT_EQ(m.reasoning, f.reasoning);
    EXPECT_EQ(m.content, f.content);
    for (auto& a : f.actions) EXPECT_FALSE(a.stop || a.greedy_next);
}

TEST(ServeApi, StopStringTruncatesAndIsNeverStreamed) {
    OutputTracker t(tok(), false, false, {"STOP", "xyz"});
    Fed f = feed(t, "one two STOP three");
    EXPECT_TRUE(f.actions.back().stop);
    EXPECT_TRUE(t.stopped_by_string());
    EXPECT_EQ(t.final_message().content, "one two ");
    EXPECT_EQ(f.content, "one two ");
    EXPECT_EQ(f.content.find("ST"), std::string::npos);
}

TEST(ServeApi, ToolCallRoundTripThroughTheTracker) {
    const std::vector<std::string> schemas = {
        R"({"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}})"};
    const std::vector<text::ToolCall> calls = {{"", "get_weather", R"({"city":"Paris & <Lyon>","days":3})"},
                                               {"", "get_weather", R"({"city":"Oslo","days":[1,2]})"}};
    const std::string block = text::render_tool_calls(calls, schemas);
    OutputTracker t(tok(), true, true, {});
    Fed f = feed(t, "Need weather.</think>Let me check." + block + "trailing junk never generated");
    // Generation stops right after the closing tag: the junk is not part of the output.
    EXPECT_TRUE(f.actions.back().stop);
    EXPECT_EQ(t.text().find("junk"), std::string::npos);
    EXPECT_EQ(f.reasoning, "Need weather.");
    EXPECT_EQ(f.content, "Let me check.");   // no DSML leaks into streamed content
    auto m = t.final_message();
    ASSERT_EQ(m.tool_calls.size(), 2u);
    for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(m.tool_calls[i].name, calls[i].name);
        EXPECT_EQ(json::parse(m.tool_calls[i].arguments), json::parse(calls[i].arguments));
    }
    EXPECT_EQ(m.tool_calls_raw, block);
    runtime::JobResult r;
    EXPECT_EQ(finish_reason(r, m), "tool_calls");
    // The guard made the structure greedy (GuardStatesInsideABlock has the details).
    bool some_greedy = false;
    for (const auto& a : f.actions) some_greedy |= a.greedy_next;
    EXPECT_TRUE(some_greedy);

    // The response carries the calls; the replay memory gives the exact block back.
    json resp = chat_response("id", 0, "m", m, {"call_a", "call_b"}, "tool_calls", r);
    EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][1]["function"]["name"], "get_weather");
    EXPECT_TRUE(resp["choices"][0]["message"]["content"].is_string());
    ToolCallMemory mem;
    mem.remember({"call_a", "call_b"}, m.tool_calls_raw);
    std::vector<text::Message> history = {{"user", "w?", "", {}, ""},
                                          {"assistant", "", "", {{"call_a", "get_weather", "{}"}, {"call_b", "get_weather", "{}"}}, ""}};
    mem.apply(history);
    EXPECT_EQ(history[1].tool_calls_raw, block);
    std::vector<text::Message> other = {{"assistant", "", "", {{"call_zz", "get_weather", "{}"}}, ""}};
    mem.apply(other);
    EXPECT_TRUE(other[0].tool_calls_raw.empty());
}

TEST(ServeApi, GuardStatesInsideABlock) {
    OutputTracker t(tok(), false, true, {});
    auto push_text = [&](const std::string& s) {
        runtime::TokenAction a;
        for (int32_t id : tok().encode(s, true)) a = t.push(id);
        return a;
    };
    EXPECT_FALSE(push_text("Sure.").greedy_next);
    EXPECT_TRUE(push_text("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n").greedy_next);
    EXPECT_TRUE(push_text("<｜DSML｜parameter name=\"a\" string=\"tr").greedy_next);
    EXPECT_FALSE(push_text("ue\">some te").greedy_next);   // a string body
    EXPECT_TRUE(push_text("xt</｜DSML｜parameter>\n<｜DSML｜parameter name=\"b\" string=\"false\">{\"k\": ").greedy_next);
    EXPECT_FALSE(push_text("\"in a js").greedy_next);      // a JSON string
    EXPECT_TRUE(push_text("on string\", \"n\": 1").greedy_next);
}

TEST(ServeApi, UnparsableBlockIsPlainContent) {
    OutputTracker t(tok(), false, false, {});
    feed(t, "text <｜DSML｜tool_calls> garbage");
    auto m = t.final_message();
    EXPECT_TRUE(m.tool_calls.empty());
    EXPECT_EQ(m.content, "text <｜DSML｜tool_calls> garbage");
}
