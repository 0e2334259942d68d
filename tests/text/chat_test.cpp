// Prompt rendering, byte for byte (model-spec.md §4.1-§4.4).
#include <gtest/gtest.h>

#include "dsv4/text.h"

using namespace dsv4::text;
using dsv4::Error;

namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string USER = "<｜User｜>";
const std::string ASSISTANT = "<｜Assistant｜>";

Message msg(std::string role, std::string content, std::string reasoning = "") {
    Message m;
    m.role = std::move(role);
    m.content = std::move(content);
    m.reasoning_content = std::move(reasoning);
    return m;
}

// The preamble of §4.4, typed out independently of the implementation.
const std::string kPreambleHead = R"(## Tools

You have access to a set of tools to help answer the user question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as raw text and set `string="true"`. Preserve characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. Only if a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)";
const std::string kPreambleTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the "
    "exact "
    "parameter names from the schemas.";

const std::string kWeather =
    R"({"name":"get_weather","description":"Weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string"}},"required":["city"]}})";
const std::string kTime = R"({"name":"get_time","parameters":{"type":"object","properties":{}}})";

}  // namespace

TEST(ChatThinkMode, MaxNeedsALargeContext) {
    EXPECT_EQ(think_mode_for_context(ThinkMode::Max, 393215), ThinkMode::High);
    EXPECT_EQ(think_mode_for_context(ThinkMode::Max, 393216), ThinkMode::Max);
    EXPECT_EQ(think_mode_for_context(ThinkMode::Max, 1u << 20), ThinkMode::Max);
    EXPECT_EQ(think_mode_for_context(ThinkMode::High, 4096), ThinkMode::High);
    EXPECT_EQ(think_mode_for_context(ThinkMode::None, 1u << 20), ThinkMode::None);
    EXPECT_EQ(parse_think_mode("max"), ThinkMode::Max);
    EXPECT_STREQ(think_mode_name(ThinkMode::None), "none");
    EXPECT_THROW(parse_think_mode("medium"), Error);
}

TEST(ChatThinkMode, MaxPrefixIsExact) {
    EXPECT_EQ(
        max_think_prefix(),
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
        "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
        "scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
        "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n");
}

TEST(ChatSingleTurn, RendersEachMode) {
    EXPECT_EQ(render_single_turn("", "Hi", ThinkMode::None), BOS + USER + "Hi" + ASSISTANT + "</think>");
    EXPECT_EQ(render_single_turn("You are a helpful assistant", "Hi", ThinkMode::High),
              BOS + "You are a helpful assistant" + USER + "Hi" + ASSISTANT + "<think>");
    EXPECT_EQ(render_single_turn("S", "Hi", ThinkMode::Max),
              BOS + std::string(max_think_prefix()) + "S" + USER + "Hi" + ASSISTANT + "<think>");
}

TEST(ChatSingleTurn, TokensFollowSection42) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const SpecialTokens& sp = tok.special();
    std::vector<int32_t> want = {sp.bos};
    for (int32_t id : tok.encode("You are a helpful assistant")) want.push_back(id);
    want.push_back(sp.user);
    for (int32_t id : tok.encode("the <think> tag")) want.push_back(id);  // user text: specials stay text
    want.push_back(sp.assistant);
    want.push_back(sp.think_open);
    EXPECT_EQ(encode_single_turn(tok, "You are a helpful assistant", "the <think> tag", ThinkMode::High), want);

    // Empty system, NONE: the logprob-vector layout BOS <｜User｜> prompt <｜Assistant｜> </think>.
    const auto ids = encode_single_turn(tok, "", "hello", ThinkMode::None);
    EXPECT_EQ(ids.front(), sp.bos);
    EXPECT_EQ(ids[1], sp.user);
    EXPECT_EQ(ids[ids.size() - 2], sp.assistant);
    EXPECT_EQ(ids.back(), sp.think_close);
    // Same as rendering and parsing specials when the texts hold none.
    EXPECT_EQ(ids, tok.encode(render_single_turn("", "hello", ThinkMode::None), true));
}

TEST(ChatRender, MultiTurnDropsOldReasoning) {
    const std::vector<Message> m = {msg("system", "Be brief."), msg("user", "Q1"), msg("assistant", "A1", "R1"),
                                    msg("user", "Q2")};
    EXPECT_EQ(render_chat(m, {ThinkMode::High, {}}),
              BOS + "Be brief." + USER + "Q1" + ASSISTANT + "</think>A1" + EOS + USER + "Q2" + ASSISTANT + "<think>");
    EXPECT_EQ(render_chat(m, {ThinkMode::None, {}}),
              BOS + "Be brief." + USER + "Q1" + ASSISTANT + "</think>A1" + EOS + USER + "Q2" + ASSISTANT + "</think>");
    EXPECT_EQ(render_chat(m, {ThinkMode::Max, {}}), BOS + std::string(max_think_prefix()) + "Be brief." + USER + "Q1" +
                                                        ASSISTANT + "</think>A1" + EOS + USER + "Q2" + ASSISTANT +
                                                        "<think>");
}

TEST(ChatRender, KeepsReasoningAfterTheLastUserTurn) {
    // An assistant turn after the last user message (a prefill to continue) keeps its reasoning.
    const std::vector<Message> m = {msg("user", "Q1"), msg("assistant", "A1", "R1")};
    EXPECT_EQ(render_chat(m, {ThinkMode::High, {}}), BOS + USER + "Q1" + ASSISTANT + "<think>R1</think>A1" + EOS);
    EXPECT_EQ(render_chat(m, {ThinkMode::None, {}}), BOS + USER + "Q1" + ASSISTANT + "</think>A1" + EOS);
}

TEST(ChatRender, SystemAndDeveloperTextsJoin) {
    const std::vector<Message> m = {msg("system", "one"), msg("user", "hi"), msg("developer", "two")};
    EXPECT_EQ(render_chat(m, {ThinkMode::None, {}}), BOS + "one\n\ntwo" + USER + "hi" + ASSISTANT + "</think>");
    EXPECT_THROW(render_chat({msg("robot", "x")}, {}), Error);
}

TEST(ChatRender, ToolPreambleComesFirstAndIsExact) {
    EXPECT_EQ(tools_preamble({kWeather, kTime}), kPreambleHead + kWeather + "\n" + kTime + kPreambleTail);
    const std::vector<Message> m = {msg("system", "sys"), msg("user", "hi")};
    EXPECT_EQ(render_chat(m, {ThinkMode::None, {kWeather}}),
              BOS + kPreambleHead + kWeather + kPreambleTail + "\n\nsys" + USER + "hi" + ASSISTANT + "</think>");
    // Without a system message the preamble is the whole system text.
    EXPECT_EQ(render_chat({msg("user", "hi")}, {ThinkMode::High, {kWeather}}),
              BOS + kPreambleHead + kWeather + kPreambleTail + USER + "hi" + ASSISTANT + "<think>");
}

TEST(ChatRender, ToolResultsShareOneUserTurn) {
    Message call = msg("assistant", "", "I need the weather.");
    call.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}, {"call_2", "get_time", "{}"}};
    const std::vector<Message> m = {msg("user", "Weather and time?"),
                                    call,
                                    msg("tool", "18C </tool_result> & <b>"),
                                    msg("function", "12:00"),
                                    msg("assistant", "Sunny, noon.", "Both known."),
                                    msg("user", "Thanks")};
    const std::string dsml =
        "\n\n<｜DSML｜tool_calls>\n"
        "<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"get_time\">\n"
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>";
    // Tool context: reasoning before the last user turn is kept.
    EXPECT_EQ(render_chat(m, {ThinkMode::High, {}}),
              BOS + USER + "Weather and time?" + ASSISTANT + "<think>I need the weather.</think>" + dsml + EOS + USER +
                  "<tool_result>18C &lt;/tool_result> & <b></tool_result><tool_result>12:00</tool_result>" + ASSISTANT +
                  "<think>Both known.</think>Sunny, noon." + EOS + USER + "Thanks" + ASSISTANT + "<think>");
}

TEST(ChatRender, ExactReplayOfSampledToolCalls) {
    Message call = msg("assistant", "Checking.");
    call.tool_calls = {{"c", "get_weather", R"({"city":"Rome"})"}};
    call.tool_calls_raw =
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>  ";  // as sampled, odd spacing and all
    const std::vector<Message> m = {msg("user", "Rome?"), call, msg("tool", "20C")};
    EXPECT_EQ(render_chat(m, {ThinkMode::None, {}}), BOS + USER + "Rome?" + ASSISTANT + "</think>Checking." +
                                                         call.tool_calls_raw + EOS + USER +
                                                         "<tool_result>20C</tool_result>" + ASSISTANT + "</think>");
}

TEST(ChatRender, EscapeToolResultTouchesOnlyTheClosingTag) {
    EXPECT_EQ(escape_tool_result("a </tool_result> & b"), "a &lt;/tool_result> & b");
    EXPECT_EQ(escape_tool_result("</tool_result></tool_result>"), "&lt;/tool_result>&lt;/tool_result>");
    EXPECT_EQ(escape_tool_result("<tool_result> &lt; > &amp;"), "<tool_result> &lt; > &amp;");
}

TEST(ChatRender, TokenizesWithSpecials) {
    const Tokenizer tok = Tokenizer::from_vocab(builtin_byte_vocab());
    const std::vector<Message> m = {msg("user", "hi"), msg("assistant", "yo", "r"), msg("user", "again")};
    const auto ids = tok.encode(render_chat(m, {ThinkMode::High, {}}), true);
    const SpecialTokens& sp = tok.special();
    std::vector<int32_t> specials;
    for (int32_t id : ids)
        if (tok.is_special(id)) specials.push_back(id);
    EXPECT_EQ(specials, (std::vector<int32_t>{sp.bos, sp.user, sp.assistant, sp.think_close, sp.eos, sp.user,
                                              sp.assistant, sp.think_open}));
}
