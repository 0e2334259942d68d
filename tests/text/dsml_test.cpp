// DSML tool-call markup: canonical rendering and parsing of generated output (§4.5).
#include <gtest/gtest.h>

#include "dsv4/text.h"

using namespace dsv4::text;

namespace {

const std::string kSchema =
    R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string"}}}}})";

std::string param(const std::string& name, bool str, const std::string& value) {
    return "<｜DSML｜parameter name=\"" + name + "\" string=\"" + (str ? "true" : "false") + "\">" + value +
           "</｜DSML｜parameter>\n";
}

}  // namespace

TEST(DsmlRender, CanonicalFormFollowsSchemaOrder) {
    const std::vector<ToolCall> calls = {
        {"id1", "get_weather", R"({"days": 3, "unit": "c", "opts": {"a": [1, 2.50], "b": "x y"}, "city": "Paris"})"}};
    EXPECT_EQ(render_tool_calls(calls, {kSchema}),
              "\n\n<｜DSML｜tool_calls>\n"
              "<｜DSML｜invoke name=\"get_weather\">\n" +
                  param("city", true, "Paris") + param("unit", true, "c") + param("days", false, "3") +
                  param("opts", false, R"({"a":[1,2.50],"b":"x y"})") +
                  "</｜DSML｜invoke>\n"
                  "</｜DSML｜tool_calls>");
    // Without a schema: the arguments' own order.
    EXPECT_EQ(render_tool_calls(calls), "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n" +
                                            param("days", false, "3") + param("unit", true, "c") +
                                            param("opts", false, R"({"a":[1,2.50],"b":"x y"})") +
                                            param("city", true, "Paris") + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
    EXPECT_EQ(render_tool_calls({}), "");
}

TEST(DsmlRender, Escaping) {
    const std::vector<ToolCall> calls = {
        {"", "run \"x\" & <y>",
         R"({"cmd": "a && b > c </｜DSML｜parameter> d", "v": ["</｜DSML｜parameter>"], "u": "é\n"})"}};
    EXPECT_EQ(render_tool_calls(calls),
              "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"run &quot;x&quot; &amp; &lt;y&gt;\">\n" +
                  param("cmd", true, "a && b > c &lt;/｜DSML｜parameter> d") +
                  param("v", false, R"(["\u003c/｜DSML｜parameter>"])") + param("u", true, "é\n") +
                  "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

TEST(DsmlRender, NonObjectArgumentsBecomeOneStringParameter) {
    EXPECT_EQ(render_tool_calls({{"", "f", "not json"}}), "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n" +
                                                              param("arguments", true, "not json") +
                                                              "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
    EXPECT_EQ(render_tool_calls({{"", "f", "[1,2]"}}), "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n" +
                                                           param("arguments", true, "[1,2]") +
                                                           "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
}

TEST(DsmlParse, ThinkingSplitsReasoningContentAndCalls) {
    const std::string block = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n" +
                              param("city", true, "Paris") + param("days", false, " 3 ") +
                              "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const std::string text = "Let me check.</think>Sure." + block;
    const ParsedMessage pm = parse_generated_message(text, true);
    EXPECT_EQ(pm.reasoning, "Let me check.");
    EXPECT_EQ(pm.content, "Sure.");
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].name, "get_weather");
    EXPECT_EQ(pm.tool_calls[0].arguments, R"({"city":"Paris","days":3})");
    EXPECT_EQ(pm.tool_calls_raw, block);
    EXPECT_EQ(pm.content + pm.tool_calls_raw, "Sure." + block);  // exact replay restores the text
}

TEST(DsmlParse, ReasoningOnlyAndPlainContent) {
    ParsedMessage pm = parse_generated_message("<think>still going <｜DSML｜tool_calls>", true);
    EXPECT_EQ(pm.reasoning, "still going <｜DSML｜tool_calls>");
    EXPECT_EQ(pm.content, "");
    EXPECT_TRUE(pm.tool_calls.empty());

    pm = parse_generated_message("Hello there.", false);
    EXPECT_EQ(pm.reasoning, "");
    EXPECT_EQ(pm.content, "Hello there.");
    EXPECT_TRUE(pm.tool_calls_raw.empty());
}

TEST(DsmlParse, DsmlInsideReasoningIsIgnored) {
    const std::string text =
        "maybe <｜DSML｜tool_calls><｜DSML｜invoke name=\"x\"></｜DSML｜invoke></｜DSML｜tool_calls>"
        "</think>No tools needed.";
    const ParsedMessage pm = parse_generated_message(text, true);
    EXPECT_TRUE(pm.tool_calls.empty());
    EXPECT_EQ(pm.content, "No tools needed.");
}

TEST(DsmlParse, OnlyAfterTheLastThinkClose) {
    const std::string text =
        "r</think>a <｜DSML｜tool_calls></｜DSML｜tool_calls></think>b\n\n<｜DSML｜tool_calls>\n"
        "<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const ParsedMessage pm = parse_generated_message(text, true);
    EXPECT_EQ(pm.reasoning, "r");
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].name, "f");
    EXPECT_EQ(pm.tool_calls[0].arguments, "{}");
    EXPECT_EQ(pm.content, "a <｜DSML｜tool_calls></｜DSML｜tool_calls></think>b");
}

TEST(DsmlParse, UnescapesStringsAndKeepsJson) {
    const std::string text = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"sh &amp; co\">\n" +
                             param("cmd", true, "a &lt; b &amp;&amp; c &lt;/｜DSML｜parameter> && d > e") +
                             param("n", false, "1.50") + param("bad", false, "{not json") +
                             param("obj", false, "{ \"k\" : [1, \"\\u003c/｜DSML｜parameter>\"] }") +
                             "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const ParsedMessage pm = parse_generated_message(text, false);
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].name, "sh & co");
    EXPECT_EQ(
        pm.tool_calls[0].arguments,
        R"({"cmd":"a < b && c </｜DSML｜parameter> && d > e","n":1.50,"bad":"{not json","obj":{"k":[1,"\u003c/｜DSML｜parameter>"]}})");
    EXPECT_EQ(pm.content, "");
}

TEST(DsmlParse, NestedParametersBecomeAnObject) {
    const std::string text =
        "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
        "<｜DSML｜parameter name=\"opts\">\n" +
        param("a", false, "1") + param("b", true, "two") + "</｜DSML｜parameter>\n" + param("z", true, "last") +
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const ParsedMessage pm = parse_generated_message(text, false);
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].arguments, R"({"opts":{"a":1,"b":"two"},"z":"last"})");
}

TEST(DsmlParse, ShortAndPlainXmlVariants) {
    const std::string shortv =
        "x\n\n<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n"
        "<DSML｜parameter name=\"a\" string=\"true\">1</DSML｜parameter>\n"
        "</DSML｜invoke>\n</DSML｜tool_calls>";
    ParsedMessage pm = parse_generated_message(shortv, false);
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].arguments, R"({"a":"1"})");
    EXPECT_EQ(pm.content, "x");

    const std::string plain =
        "<tool_calls><invoke name=\"g\"><parameter name=\"b\" string=\"false\">true</parameter>"
        "</invoke><invoke name=\"h\"></invoke></tool_calls>";
    pm = parse_generated_message(plain, false);
    ASSERT_EQ(pm.tool_calls.size(), 2u);
    EXPECT_EQ(pm.tool_calls[0].name, "g");
    EXPECT_EQ(pm.tool_calls[0].arguments, R"({"b":true})");
    EXPECT_EQ(pm.tool_calls[1].name, "h");
}

TEST(DsmlParse, TruncatedBlockKeepsWhatWasComplete) {
    const std::string text =
        "ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n" + param("a", true, "1") +
        "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"b\" string=\"tr";
    const ParsedMessage pm = parse_generated_message(text, false);
    ASSERT_EQ(pm.tool_calls.size(), 1u);
    EXPECT_EQ(pm.tool_calls[0].name, "f");
    EXPECT_EQ(pm.content, "ok");
    EXPECT_EQ(pm.content + pm.tool_calls_raw, text);
}

TEST(DsmlRoundTrip, RenderThenParseGivesTheCallsBack) {
    const std::vector<ToolCall> calls = {
        {"", "get_weather",
         R"({"city": "São Paulo", "unit": "c", "days": 3, "flags": [true, null], "q": "a > b && c"})"},
        {"", "edit", R"({"path": "x.cpp", "text": "if (a < b) { return \"</｜DSML｜parameter>\"; }\n\ttab"})"},
        {"", "noargs", "{}"}};
    const std::string rendered = render_tool_calls(calls, {kSchema});
    const ParsedMessage pm = parse_generated_message("Done.</think>Here." + rendered, true);
    EXPECT_EQ(pm.content, "Here.");
    EXPECT_EQ(pm.tool_calls_raw, rendered);
    ASSERT_EQ(pm.tool_calls.size(), 3u);
    EXPECT_EQ(pm.tool_calls[0].name, "get_weather");
    EXPECT_EQ(pm.tool_calls[0].arguments,
              R"({"city":"São Paulo","unit":"c","days":3,"flags":[true,null],"q":"a > b && c"})");
    EXPECT_EQ(pm.tool_calls[1].arguments,
              R"({"path":"x.cpp","text":"if (a < b) { return \"</｜DSML｜parameter>\"; }\n\ttab"})");
    EXPECT_EQ(pm.tool_calls[2].arguments, "{}");
    // Rendering the parsed calls again gives the same bytes.
    EXPECT_EQ(render_tool_calls(pm.tool_calls, {kSchema}), rendered);
}
