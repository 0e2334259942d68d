// DSML tool-call markup (model-spec.md §4.5): canonical rendering of JSON tool calls for the
// prompt history, and parsing of the blocks the model generates.
#include <nlohmann/json.hpp>

#include "dsv4/text.h"

namespace dsv4::text {

namespace {

using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
    std::string out;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
        out.append(s.substr(pos, hit - pos));
        out.append(to);
    }
    out.append(s.substr(pos));
    return out;
}

std::string xml_attr_escape(std::string_view s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string xml_unescape(std::string_view s) {
    static constexpr std::pair<std::string_view, char> entities[] = {
        {"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&apos;", '\''}, {"&#39;", '\''}};
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        bool hit = false;
        if (s[i] == '&') {
            for (auto [e, c] : entities) {
                if (s.substr(i, e.size()) == e) {
                    out += c;
                    i += e.size();
                    hit = true;
                    break;
                }
            }
        }
        if (!hit) out += s[i++];
    }
    return out;
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Removes the whitespace outside strings of (valid) JSON text, keeping every other byte as
// written: numbers keep their spelling, escapes stay escapes.
std::string minify_json(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    bool in_str = false;
    for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (in_str) {
            out += c;
            if (c == '\\' && i + 1 < s.size())
                out += s[++i];
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
            out += c;
        } else if (!is_ws(c)) {
            out += c;
        }
    }
    return out;
}

std::string dump_json(const ordered_json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// End of the JSON value starting at s[i] (valid JSON is assumed: checked by the caller).
size_t json_value_end(std::string_view s, size_t i) {
    int depth = 0;
    bool in_str = false;
    for (; i < s.size(); ++i) {
        const char c = s[i];
        if (in_str) {
            if (c == '\\')
                ++i;
            else if (c == '"') {
                in_str = false;
                if (depth == 0) return i + 1;
            }
            continue;
        }
        if (c == '"')
            in_str = true;
        else if (c == '{' || c == '[')
            ++depth;
        else if (c == '}' || c == ']') {
            if (depth == 0) return i;  // the end of the enclosing object
            if (--depth == 0) return i + 1;
        } else if (depth == 0 && (c == ',' || c == ':' || is_ws(c)))
            return i;
    }
    return s.size();
}

// The members of a JSON object text as (key, raw value text), in written order; nullopt when
// the text is not a JSON object.
std::optional<std::vector<std::pair<std::string, std::string_view>>> object_members(std::string_view s) {
    if (!json::accept(s)) return std::nullopt;
    size_t i = 0;
    auto skip = [&] {
        while (i < s.size() && is_ws(s[i])) ++i;
    };
    skip();
    if (i >= s.size() || s[i] != '{') return std::nullopt;
    ++i;
    std::vector<std::pair<std::string, std::string_view>> members;
    for (;;) {
        skip();
        if (s[i] == '}') break;
        const size_t key_end = json_value_end(s, i);
        std::string key = json::parse(s.substr(i, key_end - i)).get<std::string>();
        i = key_end;
        skip();
        ++i;  // ':'
        skip();
        const size_t v_end = json_value_end(s, i);
        members.emplace_back(std::move(key), s.substr(i, v_end - i));
        i = v_end;
        skip();
        if (s[i] == ',') ++i;
    }
    return members;
}

// Property order of each tool's parameters, from the schemas the client sent (either the
// bare function object or the {"type":"function","function":{...}} wrapper).
std::vector<std::string> schema_property_order(const std::vector<std::string>& schemas, std::string_view tool) {
    for (const auto& s : schemas) {
        ordered_json j = ordered_json::parse(s, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.contains("function") && j["function"].is_object()) j = j["function"];
        if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>() != tool) continue;
        std::vector<std::string> order;
        if (j.contains("parameters") && j["parameters"].is_object() && j["parameters"].contains("properties") &&
            j["parameters"]["properties"].is_object())
            for (auto it = j["parameters"]["properties"].begin(); it != j["parameters"]["properties"].end(); ++it)
                order.push_back(it.key());
        return order;
    }
    return {};
}

void render_parameter(std::string& out, std::string_view name, std::string_view raw_value) {
    out += "<｜DSML｜parameter name=\"";
    out += xml_attr_escape(name);
    if (!raw_value.empty() && raw_value[0] == '"') {
        // String: the raw text; only the closing tag itself is escaped, so the value is unambiguous.
        out += "\" string=\"true\">";
        out += replace_all(json::parse(raw_value).get<std::string>(), kParamClose, "&lt;/｜DSML｜parameter>");
    } else {
        out += "\" string=\"false\">";
        out += replace_all(minify_json(raw_value), kParamClose, "\\u003c/｜DSML｜parameter>");
    }
    out += kParamClose;
    out += '\n';
}

}  // namespace

std::string render_tool_calls(const std::vector<ToolCall>& calls, const std::vector<std::string>& tool_schemas) {
    if (calls.empty()) return "";
    std::string out = "\n\n<｜DSML｜tool_calls>\n";
    for (const ToolCall& call : calls) {
        out += "<｜DSML｜invoke name=\"";
        out += xml_attr_escape(call.name);
        out += "\">\n";
        auto members = object_members(call.arguments);
        if (!members) {
            out += "<｜DSML｜parameter name=\"arguments\" string=\"true\">";
            out += replace_all(call.arguments, kParamClose, "&lt;/｜DSML｜parameter>");
            out += kParamClose;
            out += '\n';
        } else {
            std::vector<bool> done(members->size(), false);
            for (const std::string& key : schema_property_order(tool_schemas, call.name)) {
                for (size_t k = 0; k < members->size(); ++k) {
                    if (!done[k] && (*members)[k].first == key) {
                        render_parameter(out, key, (*members)[k].second);
                        done[k] = true;
                        break;
                    }
                }
            }
            for (size_t k = 0; k < members->size(); ++k)
                if (!done[k]) render_parameter(out, (*members)[k].first, (*members)[k].second);
        }
        out += "</｜DSML｜invoke>\n";
    }
    out += "</｜DSML｜tool_calls>";
    return out;
}

// ---- parsing ---------------------------------------------------------------------------------

namespace {

// One tag of the tool-call markup. The model writes `<｜DSML｜name ...>`; shortened
// `<DSML｜name ...>` and plain `<name ...>` forms are accepted too.
struct Tag {
    bool closing = false;
    std::string name;
    std::string_view attrs;
    size_t end = 0;  // one past '>'
};

std::optional<Tag> tag_at(std::string_view s, size_t i) {
    if (i >= s.size() || s[i] != '<') return std::nullopt;
    Tag t;
    size_t p = i + 1;
    if (p < s.size() && s[p] == '/') {
        t.closing = true;
        ++p;
    }
    for (std::string_view prefix : {std::string_view("｜DSML｜"), std::string_view("DSML｜")}) {
        if (s.substr(p, prefix.size()) == prefix) {
            p += prefix.size();
            break;
        }
    }
    for (std::string_view name : {"tool_calls", "invoke", "parameter"}) {
        if (s.substr(p, name.size()) == name) {
            const size_t q = p + name.size();
            if (q < s.size() && (s[q] == '>' || is_ws(s[q]))) {
                t.name = std::string(name);
                const size_t gt = s.find('>', q);
                if (gt == std::string_view::npos) return std::nullopt;
                t.attrs = s.substr(q, gt - q);
                t.end = gt + 1;
                return t;
            }
        }
    }
    return std::nullopt;
}

std::optional<std::string> attribute(std::string_view attrs, std::string_view name) {
    for (size_t pos = 0; (pos = attrs.find(name, pos)) != std::string_view::npos; pos += name.size()) {
        const bool starts = pos == 0 || is_ws(attrs[pos - 1]);
        if (!starts || attrs.substr(pos + name.size(), 2) != "=\"") continue;
        const size_t v = pos + name.size() + 2;
        const size_t q = attrs.find('"', v);
        if (q == std::string_view::npos) return std::nullopt;
        return xml_unescape(attrs.substr(v, q - v));
    }
    return std::nullopt;
}

size_t skip_ws(std::string_view s, size_t i) {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i;
}

// Earliest closing parameter tag (any spelling) at or after i: (start, end) or npos.
std::pair<size_t, size_t> find_param_close(std::string_view s, size_t i) {
    for (size_t p = s.find("</", i); p != std::string_view::npos; p = s.find("</", p + 1)) {
        auto t = tag_at(s, p);
        if (t && t->closing && t->name == "parameter") return {p, t->end};
    }
    return {std::string_view::npos, std::string_view::npos};
}

// Parses parameters up to the closing tag named `until` ("invoke", or "parameter" for a
// nested object). Appends `"key":value` members to `obj` (JSON text without braces).
// Returns the position after the closing tag, or nullopt when the markup breaks off.
std::optional<size_t> parse_parameters(std::string_view s, size_t i, std::string_view until, std::string& obj,
                                       int depth) {
    for (;;) {
        i = skip_ws(s, i);
        auto t = tag_at(s, i);
        if (!t) return std::nullopt;
        if (t->closing) {
            if (t->name != until) return std::nullopt;
            return t->end;
        }
        if (t->name != "parameter") return std::nullopt;
        const std::string key = attribute(t->attrs, "name").value_or("");
        const std::optional<std::string> str = attribute(t->attrs, "string");
        std::string value;  // JSON text
        size_t after;
        const size_t body = t->end;
        auto nested = tag_at(s, skip_ws(s, body));
        if (!str && nested && !nested->closing && nested->name == "parameter" && depth < 32) {
            std::string inner;
            auto end = parse_parameters(s, skip_ws(s, body), "parameter", inner, depth + 1);
            if (!end) return std::nullopt;
            value = "{" + inner + "}";
            after = *end;
        } else {
            auto [close, close_end] = find_param_close(s, body);
            if (close == std::string_view::npos) return std::nullopt;
            const std::string_view raw = s.substr(body, close - body);
            if (str && *str == "true") {
                value = dump_json(ordered_json(xml_unescape(raw)));
            } else {
                // Non-string values stay the JSON text the model wrote (minified); text that is
                // not JSON is kept as a string rather than lost.
                std::string_view trimmed = raw;
                while (!trimmed.empty() && is_ws(trimmed.front())) trimmed.remove_prefix(1);
                while (!trimmed.empty() && is_ws(trimmed.back())) trimmed.remove_suffix(1);
                value = json::accept(trimmed) ? minify_json(trimmed) : dump_json(ordered_json(std::string(raw)));
            }
            after = close_end;
        }
        if (!obj.empty()) obj += ',';
        obj += dump_json(ordered_json(key));
        obj += ':';
        obj += value;
        i = after;
    }
}

}  // namespace

ParsedMessage parse_generated_message(std::string_view text, bool thinking) {
    ParsedMessage pm;
    std::string_view rest = text;
    size_t search_from = 0;
    if (thinking) {
        if (rest.starts_with(kThinkOpen)) rest.remove_prefix(kThinkOpen.size());
        const size_t close = rest.find(kThinkClose);
        if (close == std::string_view::npos) {
            pm.reasoning = std::string(rest);  // still thinking: no content, and DSML in reasoning is ignored
            return pm;
        }
        pm.reasoning = std::string(rest.substr(0, close));
        rest.remove_prefix(close + kThinkClose.size());
        // Only text after the last </think> may hold tool calls.
        const size_t last = rest.rfind(kThinkClose);
        if (last != std::string_view::npos) search_from = last + kThinkClose.size();
    }

    size_t start = std::string_view::npos;
    for (std::string_view opener :
         {"\n\n<｜DSML｜tool_calls>", "<｜DSML｜tool_calls>", "<DSML｜tool_calls>", "<tool_calls>"}) {
        start = rest.find(opener, search_from);
        if (start != std::string_view::npos) break;
    }
    if (start == std::string_view::npos) {
        pm.content = std::string(rest);
        return pm;
    }
    size_t content_end = start;
    while (content_end > search_from && is_ws(rest[content_end - 1])) --content_end;
    pm.content = std::string(rest.substr(0, content_end));

    size_t i = rest.find('<', start);
    auto open = tag_at(rest, i);
    size_t block_end = rest.size();
    if (open && !open->closing && open->name == "tool_calls") {
        i = open->end;
        for (;;) {
            i = skip_ws(rest, i);
            auto t = tag_at(rest, i);
            if (!t) break;
            if (t->closing && t->name == "tool_calls") {
                block_end = t->end;
                break;
            }
            if (t->closing || t->name != "invoke") break;
            ToolCall call;
            call.name = attribute(t->attrs, "name").value_or("");
            std::string members;
            auto end = parse_parameters(rest, t->end, "invoke", members, 0);
            if (!end) break;  // truncated or malformed: keep the calls read so far
            call.arguments = "{" + members + "}";
            pm.tool_calls.push_back(std::move(call));
            i = *end;
        }
    }
    // The raw block includes the separator whitespace, so content + raw is the generated text.
    pm.tool_calls_raw = std::string(rest.substr(content_end, block_end - content_end));
    return pm;
}

}  // namespace dsv4::text
