// Prompt rendering (model-spec.md §4.1-§4.4): thinking modes, the single-turn prompt, the
// multi-turn renderer and the tool preamble. Every byte here reaches the model, and the
// server's KV reuse compares rendered prefixes, so the output must be exact.
#include "dsv4/text.h"

namespace dsv4::text {

std::string_view max_think_prefix() {
    static constexpr std::string_view s =
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
        "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
        "scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
        "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n"
        "\n";
    return s;
}

ThinkMode think_mode_for_context(ThinkMode requested, uint64_t context_tokens) {
    // The effort prompt is only worth its tokens when the context can hold what it provokes.
    if (requested == ThinkMode::Max && context_tokens < kMaxThinkMinContext) return ThinkMode::High;
    return requested;
}

const char* think_mode_name(ThinkMode m) {
    switch (m) {
        case ThinkMode::None:
            return "none";
        case ThinkMode::High:
            return "high";
        case ThinkMode::Max:
            return "max";
    }
    return "?";
}

ThinkMode parse_think_mode(std::string_view name) {
    if (name == "none") return ThinkMode::None;
    if (name == "high") return ThinkMode::High;
    if (name == "max") return ThinkMode::Max;
    fail("thinking mode: expected none, high or max, found \"", name, "\"");
}

std::string tools_preamble(const std::vector<std::string>& tool_schemas) {
    static constexpr std::string_view head =
        "## Tools\n"
        "\n"
        "You have access to a set of tools to help answer the user question. You can invoke tools by writing a "
        "\"<｜DSML｜tool_calls>\" block like the following:\n"
        "\n"
        "<｜DSML｜tool_calls>\n"
        "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
        "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
        "...\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
        "...\n"
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>\n"
        "\n"
        "String parameters should be specified as raw text and set `string=\"true\"`. Preserve characters such as "
        "`>`, `&`, and `&&` exactly; never replace normal string characters with XML or HTML entity escapes. Only if "
        "a string value itself contains the exact closing parameter tag `</｜DSML｜parameter>`, write that tag as "
        "`&lt;/｜DSML｜parameter>` inside the value. For all other types (numbers, booleans, arrays, objects), pass "
        "the value in JSON format and set `string=\"false\"`.\n"
        "\n"
        "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
        "<think>...</think> BEFORE any tool calls or final response.\n"
        "\n"
        "Otherwise, output directly after </think> with tool calls or final response.\n"
        "\n"
        "### Available Tool Schemas\n"
        "\n";
    static constexpr std::string_view tail =
        "\n"
        "\n"
        "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls. Use the "
        "exact parameter names from the schemas.";
    std::string out(head);
    for (size_t i = 0; i < tool_schemas.size(); ++i) {
        if (i) out += '\n';
        out += tool_schemas[i];
    }
    out += tail;
    return out;
}

std::string escape_tool_result(std::string_view content) {
    static constexpr std::string_view close = "</tool_result>";
    std::string out;
    out.reserve(content.size());
    size_t pos = 0;
    for (size_t hit; (hit = content.find(close, pos)) != std::string_view::npos; pos = hit + 1) {
        out.append(content.substr(pos, hit - pos));
        out += "&lt;";
    }
    out.append(content.substr(pos));
    return out;
}

namespace {

bool is_system_role(std::string_view r) { return r == "system" || r == "developer"; }
bool is_tool_role(std::string_view r) { return r == "tool" || r == "function"; }

}  // namespace

std::string render_chat(const std::vector<Message>& messages, const ChatOptions& options) {
    const bool tools_active = !options.tool_schemas.empty();
    const bool thinking = options.think != ThinkMode::None;

    std::string system;
    if (tools_active) system = tools_preamble(options.tool_schemas);  // tools come before the client's system text
    bool tool_context = tools_active;
    std::ptrdiff_t last_user = -1;
    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        if (is_system_role(m.role)) {
            if (!system.empty()) system += "\n\n";
            system += m.content;
        } else if (m.role == "user" || is_tool_role(m.role)) {
            last_user = std::ptrdiff_t(i);
            if (is_tool_role(m.role)) tool_context = true;
        } else if (m.role == "assistant") {
            if (!m.tool_calls.empty() || !m.tool_calls_raw.empty()) tool_context = true;
        } else {
            fail("chat message ", i, ": unknown role \"", m.role,
                 "\" (expected system, developer, user, assistant, tool or function)");
        }
    }

    std::string out(kBos);
    if (options.think == ThinkMode::Max) out += max_think_prefix();
    out += system;

    bool pending_assistant = false, pending_tool_result = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const Message& m = messages[i];
        if (is_system_role(m.role)) continue;
        if (m.role == "user") {
            out += kUser;
            out += m.content;
            pending_assistant = true;
            pending_tool_result = false;
        } else if (is_tool_role(m.role)) {
            if (!pending_tool_result) out += kUser;  // consecutive results share one user turn
            out += "<tool_result>";
            out += escape_tool_result(m.content);
            out += "</tool_result>";
            pending_assistant = true;
            pending_tool_result = true;
        } else {  // assistant
            if (pending_assistant) {
                out += kAssistant;
                // Reasoning before the last user turn is dropped (DeepSeek's encoding_dsv4.py),
                // except in tool use, where the model needs its earlier plans.
                if (thinking && (tool_context || std::ptrdiff_t(i) > last_user)) {
                    out += kThinkOpen;
                    out += m.reasoning_content;
                    out += kThinkClose;
                } else {
                    out += kThinkClose;
                }
            }
            out += m.content;
            out += m.tool_calls_raw.empty() ? render_tool_calls(m.tool_calls, options.tool_schemas) : m.tool_calls_raw;
            out += kEos;
            pending_assistant = false;
            pending_tool_result = false;
        }
    }
    if (pending_assistant) {
        out += kAssistant;
        out += thinking ? kThinkOpen : kThinkClose;
    }
    return out;
}

std::string render_single_turn(std::string_view system, std::string_view user, ThinkMode think) {
    std::string out(kBos);
    if (think == ThinkMode::Max) out += max_think_prefix();
    out += system;
    out += kUser;
    out += user;
    out += kAssistant;
    out += think == ThinkMode::None ? kThinkClose : kThinkOpen;
    return out;
}

std::vector<int32_t> encode_single_turn(const Tokenizer& tok, std::string_view system, std::string_view user,
                                        ThinkMode think) {
    std::vector<int32_t> ids;
    ids.push_back(tok.require_special(kBos));
    if (think == ThinkMode::Max) tok.encode_append(max_think_prefix(), false, ids);
    if (!system.empty()) tok.encode_append(system, false, ids);  // no role token for system text
    ids.push_back(tok.require_special(kUser));
    tok.encode_append(user, false, ids);
    ids.push_back(tok.require_special(kAssistant));
    ids.push_back(tok.require_special(think == ThinkMode::None ? kThinkClose : kThinkOpen));
    return ids;
}

}  // namespace dsv4::text
