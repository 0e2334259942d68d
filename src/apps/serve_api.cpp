#include "apps/serve_api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

namespace dsv4::apps::serve {

json ApiError::body() const {
    json e = json::object();
    e["message"] = message;
    e["type"] = type;
    e["param"] = param.empty() ? json(nullptr) : json(param);
    e["code"] = code.empty() ? json(nullptr) : json(code);
    for (auto it = extra.begin(); it != extra.end(); ++it) e[it.key()] = it.value();
    return json{{"error", e}};
}

void bad_request(std::string message, std::string param, std::string code) {
    ApiError e;
    e.status = 400;
    e.message = std::move(message);
    e.param = std::move(param);
    e.code = std::move(code);
    throw e;
}

namespace {

const char* type_name(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::object: return "an object";
        case json::value_t::array: return "an array";
        case json::value_t::string: return "a string";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "an integer";
        case json::value_t::number_float: return "a number";
        default: return "a value";
    }
}

[[noreturn]] void wrong_type(const std::string& param, const char* expected, const json& v) {
    bad_request(cat("Invalid type for '", param, "': expected ", expected, ", but got ", type_name(v), "."), param,
                "invalid_type");
}

// A field that is present and not null.
const json* field(const json& obj, const char* name) {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

// `param`: the path of the parameter in the body ("messages[2].role").
[[noreturn]] void missing_parameter(const std::string& param) {
    bad_request(cat("Missing required parameter: '", param, "'."), param, "missing_required_parameter");
}

// A field that must be present and not null; never nullptr.
const json* required_field(const json& obj, const char* name, const std::string& param) {
    const json* v = field(obj, name);
    if (!v) missing_parameter(param);
    return v;
}

std::optional<double> get_number(const json& obj, const char* name, double lo, double hi) {
    const json* v = field(obj, name);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
        bad_request(cat("Invalid value for '", name, "': ", d, " is outside [", lo, ", ", hi, "]."), name);
    return d;
}

std::optional<int64_t> get_int(const json& obj, const char* name, int64_t lo, int64_t hi) {
    const json* v = field(obj, name);
    if (!v) return std::nullopt;
    int64_t x = 0;
    if (v->is_number_integer()) {
        if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
            bad_request(cat("Invalid value for '", name, "': too large."), name);
        x = v->get<int64_t>();
    } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e18) {
        x = int64_t(v->get<double>());
    } else {
        wrong_type(name, "an integer", *v);
    }
    if (x < lo || x > hi) bad_request(cat("Invalid value for '", name, "': ", x, " is outside [", lo, ", ", hi, "]."), name);
    return x;
}

std::optional<bool> get_bool(const json& obj, const char* name) {
    const json* v = field(obj, name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(name, "a boolean", *v);
    return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* name) {
    const json* v = field(obj, name);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(name, "a string", *v);
    return v->get<std::string>();
}

// Message content: a string, or an array of parts whose text parts are concatenated.
std::string content_text(const json& v, const std::string& param) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();
    if (!v.is_array()) wrong_type(param, "a string or an array of content parts", v);
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) {
        const json& p = v[i];
        const std::string pp = cat(param, "[", i, "]");
        if (p.is_string()) {
            out += p.get<std::string>();
            continue;
        }
        if (!p.is_object()) wrong_type(pp, "an object", p);
        const auto type = get_string(p, "type").value_or("text");
        if (type != "text" && type != "input_text" && type != "output_text")
            bad_request(cat("Unsupported content part type '", type, "' in '", pp, "': only text is supported."),
                        pp + ".type");
        const json* t = field(p, "text");
        if (!t || !t->is_string()) wrong_type(pp + ".text", "a string", t ? *t : json(nullptr));
        out += t->get<std::string>();
    }
    return out;
}

void parse_thinking(const json& body, ParsedRequest& r, uint64_t ctx) {
    text::ThinkMode m = text::ThinkMode::High;   // model-spec §4.1: HIGH by default
    if (r.model == "deepseek-chat") m = text::ThinkMode::None;
    if (r.model == "deepseek-reasoner") m = text::ThinkMode::High;
    if (auto t = get_bool(body, "think")) m = *t ? text::ThinkMode::High : text::ThinkMode::None;
    if (const json* t = field(body, "thinking")) {
        if (t->is_boolean()) {
            m = t->get<bool>() ? text::ThinkMode::High : text::ThinkMode::None;
        } else if (t->is_object()) {
            const auto type = get_string(*t, "type");
            if (!type || (*type != "enabled" && *type != "disabled"))
                bad_request("Invalid value for 'thinking.type': expected \"enabled\" or \"disabled\".", "thinking.type");
            m = *type == "enabled" ? text::ThinkMode::High : text::ThinkMode::None;
        } else {
            wrong_type("thinking", "a boolean or an object", *t);
        }
    }
    if (auto e = get_string(body, "reasoning_effort")) {
        if (*e == "max") m = text::ThinkMode::Max;
        else if (*e == "xhigh" || *e == "high" || *e == "medium" || *e == "low" || *e == "minimal") m = text::ThinkMode::High;
        else if (*e == "none") m = text::ThinkMode::None;
        else
            bad_request(cat("Invalid value for 'reasoning_effort': '", *e,
                            "' (expected none, minimal, low, medium, high, xhigh or max)."),
                        "reasoning_effort");
    }
    r.think = text::think_mode_for_context(m, ctx);
}

// Fields shared by chat and completions: model, sampling, limits, stop, stream.
void parse_common(const json& body, ParsedRequest& r, const ParseContext& pc) {
    if (auto m = get_string(body, "model")) r.model = m->empty() ? std::string(kModelId) : *m;
    parse_thinking(body, r, pc.ctx);
    if (auto n = get_int(body, "n", 1, 1)) (void)n;
    // Sampling (§7.4): the defaults; in thinking mode the client's knobs are ignored.
    SamplerParams p;
    const auto temperature = get_number(body, "temperature", 0, 2);
    const auto top_p = get_number(body, "top_p", 0, 1);
    const auto min_p = get_number(body, "min_p", 0, 1);
    const auto top_k = get_int(body, "top_k", 0, 1 << 30);
    if (r.think == text::ThinkMode::None) {
        if (temperature) p.temperature = float(*temperature);
        if (top_p) p.top_p = float(*top_p);
        if (min_p) p.min_p = float(*min_p);
        if (top_k) p.top_k = int(std::min<int64_t>(*top_k, 1024));
    }
    const auto seed = get_int(body, "seed", INT64_MIN, INT64_MAX);
    p.seed = seed ? uint64_t(*seed) : uint64_t(std::chrono::system_clock::now().time_since_epoch().count());
    r.sampling = p;

    auto mt = get_int(body, "max_completion_tokens", 1, INT64_MAX);
    if (!mt) mt = get_int(body, "max_tokens", 1, INT64_MAX);
    if (mt) r.max_tokens = uint64_t(*mt);

    if (const json* s = field(body, "stop")) {
        if (s->is_string()) {
            r.stop.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            if (s->size() > 16) bad_request("Invalid value for 'stop': at most 16 sequences.", "stop");
            for (size_t i = 0; i < s->size(); ++i) {
                if (!(*s)[i].is_string()) wrong_type(cat("stop[", i, "]"), "a string", (*s)[i]);
                r.stop.push_back((*s)[i].get<std::string>());
            }
        } else {
            wrong_type("stop", "a string or an array of strings", *s);
        }
        for (const auto& x : r.stop)
            if (x.empty()) bad_request("Invalid value for 'stop': empty stop sequence.", "stop");
    }
    r.stream = get_bool(body, "stream").value_or(false);
    r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    if (const json* so = field(body, "stream_options")) {
        if (!so->is_object()) wrong_type("stream_options", "an object", *so);
        r.include_usage = get_bool(*so, "include_usage").value_or(false);
    }
    if (const json* lp = field(body, "logprobs"))
        if (!(lp->is_boolean() && !lp->get<bool>()) && !(lp->is_number_integer() && lp->get<int64_t>() == 0))
            bad_request("'logprobs' is not supported by this server.", "logprobs", "unsupported_parameter");
}

}  // namespace

ParsedRequest parse_chat_request(const json& body, const ParseContext& pc) {
    if (!body.is_object()) wrong_type("body", "a JSON object", body);
    ParsedRequest r;
    r.endpoint = Endpoint::Chat;
    const json* msgs = required_field(body, "messages", "messages");
    if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
    if (msgs->empty()) bad_request("Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages",
                                   "empty_array");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        const std::string pm = cat("messages[", i, "]");
        if (!m.is_object()) wrong_type(pm, "an object", m);
        const json* role = required_field(m, "role", pm + ".role");
        if (!role->is_string()) wrong_type(pm + ".role", "a string", *role);
        text::Message msg;
        msg.role = role->get<std::string>();
        static const char* roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
        if (std::find_if(std::begin(roles), std::end(roles), [&](const char* x) { return msg.role == x; }) ==
            std::end(roles))
            bad_request(cat("Invalid value: '", msg.role, "'. Supported values are: 'system', 'developer', 'user', "
                            "'assistant', 'tool' and 'function'."),
                        pm + ".role");
        auto cit = m.find("content");
        if (cit != m.end()) msg.content = content_text(*cit, pm + ".content");
        else if (msg.role != "assistant")
            missing_parameter(pm + ".content");
        if (msg.role == "assistant") {
            if (const json* rc = field(m, "reasoning_content")) {
                if (!rc->is_string()) wrong_type(pm + ".reasoning_content", "a string", *rc);
                msg.reasoning_content = rc->get<std::string>();
            }
            if (const json* tcs = field(m, "tool_calls")) {
                if (!tcs->is_array()) wrong_type(pm + ".tool_calls", "an array", *tcs);
                for (size_t k = 0; k < tcs->size(); ++k) {
                    const json& tc = (*tcs)[k];
                    const std::string pt = cat(pm, ".tool_calls[", k, "]");
                    if (!tc.is_object()) wrong_type(pt, "an object", tc);
                    text::ToolCall call;
                    call.id = get_string(tc, "id").value_or("");
                    const json* fn = field(tc, "function");
                    if (!fn || !fn->is_object()) wrong_type(pt + ".function", "an object", fn ? *fn : json(nullptr));
                    const json* name = field(*fn, "name");
                    if (!name || !name->is_string()) wrong_type(pt + ".function.name", "a string", name ? *name : json(nullptr));
                    call.name = name->get<std::string>();
                    if (const json* a = field(*fn, "arguments"))
                        call.arguments = a->is_string() ? a->get<std::string>() : a->dump();
                    else
                        call.arguments = "{}";
                    msg.tool_calls.push_back(std::move(call));
                }
            }
        }
        r.messages.push_back(std::move(msg));
    }
    bool tools_off = false;
    if (const json* tc = field(body, "tool_choice")) {
        if (tc->is_string()) {
            const auto s = tc->get<std::string>();
            if (s != "none" && s != "auto" && s != "required")
                bad_request(cat("Invalid value for 'tool_choice': '", s, "' (expected none, auto, required or an object)."),
                            "tool_choice");
            tools_off = s == "none";
        } else if (!tc->is_object()) {
            wrong_type("tool_choice", "a string or an object", *tc);
        }
    }
    if (const json* tools = field(body, "tools")) {
        if (!tools->is_array()) wrong_type("tools", "an array", *tools);
        for (size_t i = 0; i < tools->size(); ++i) {
            const json& t = (*tools)[i];
            const std::string pt = cat("tools[", i, "]");
            if (!t.is_object()) wrong_type(pt, "an object", t);
            const auto type = get_string(t, "type").value_or("function");
            if (type != "function")
                bad_request(cat("Invalid value for '", pt, ".type': '", type, "' (only function tools are supported)."),
                            pt + ".type");
            const json* fn = field(t, "function");
            if (!fn || !fn->is_object()) wrong_type(pt + ".function", "an object", fn ? *fn : json(nullptr));
            const json* name = field(*fn, "name");
            if (!name || !name->is_string()) wrong_type(pt + ".function.name", "a string", name ? *name : json(nullptr));
            // The function object exactly as sent (key order kept), one per line (§4.4).
            if (!tools_off) r.tool_schemas.push_back(fn->dump(-1, ' ', false, json::error_handler_t::replace));
        }
    }
    parse_common(body, r, pc);
    return r;
}

ParsedRequest parse_completion_request(const json& body, const ParseContext& pc) {
    if (!body.is_object()) wrong_type("body", "a JSON object", body);
    ParsedRequest r;
    r.endpoint = Endpoint::Completions;
    const json* p = required_field(body, "prompt", "prompt");
    if (p->is_string()) {
        r.prompt_text = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
        r.prompt_text = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& x) { return x.is_number_integer(); })) {
        r.prompt_is_ids = true;
        for (const auto& x : *p) r.prompt_ids.push_back(int32_t(x.get<int64_t>()));
    } else if (p->is_array()) {
        bad_request("Invalid value for 'prompt': expected a string, an array of one string or an array of token ids.",
                    "prompt");
    } else {
        wrong_type("prompt", "a string", *p);
    }
    if (!r.prompt_is_ids && r.prompt_text.empty())
        bad_request("Invalid value for 'prompt': empty prompt.", "prompt");
    if (field(body, "suffix")) bad_request("'suffix' is not supported by this server.", "suffix", "unsupported_parameter");
    parse_common(body, r, pc);
    return r;
}

// ---- tool call memory ----------------------------------------------------------------------

void ToolCallMemory::remember(const std::vector<std::string>& ids, const std::string& raw) {
    if (ids.empty() || raw.empty()) return;
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& id : ids) {
        if (map_.emplace(id, raw).second) order_.push_back(id);
    }
    while (order_.size() > max_) {
        map_.erase(order_.front());
        order_.pop_front();
    }
}

void ToolCallMemory::apply(std::vector<text::Message>& messages) const {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& m : messages) {
        if (m.role != "assistant" || m.tool_calls.empty()) continue;
        const std::string* raw = nullptr;
        bool same = true;
        for (const auto& c : m.tool_calls) {
            auto it = map_.find(c.id);
            if (it == map_.end() || (raw && *raw != it->second)) {
                same = false;
                break;
            }
            raw = &it->second;
        }
        if (same && raw) m.tool_calls_raw = *raw;
    }
}

// ---- prompts -------------------------------------------------------------------------------

Prompt render_prompt(const ParsedRequest& r, const text::Tokenizer& tok) {
    Prompt p;
    p.thinking = r.think != text::ThinkMode::None;
    if (r.endpoint == Endpoint::Chat) {
        text::ChatOptions o;
        o.think = r.think;
        o.tool_schemas = r.tool_schemas;
        p.text = text::render_chat(r.messages, o);
    } else if (r.prompt_is_ids) {
        p.ids = r.prompt_ids;
        p.thinking = false;   // raw tokens: no template, no reasoning split
        return p;
    } else {
        p.text = text::render_single_turn("You are a helpful assistant", r.prompt_text, r.think);
    }
    p.ids = tok.encode(p.text, true);
    return p;
}

// ---- output tracking -----------------------------------------------------------------------

namespace {

constexpr std::string_view kToolOpeners[] = {"<｜DSML｜tool_calls>", "<DSML｜tool_calls>", "<tool_calls>"};
constexpr std::string_view kToolClosers[] = {"</｜DSML｜tool_calls>", "</DSML｜tool_calls>", "</tool_calls>"};
constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

// Length of the longest suffix of `s` (starting at or after `from`) that is a proper prefix of `m`.
size_t partial_suffix(std::string_view s, size_t from, std::string_view m) {
    const size_t avail = s.size() - std::min(from, s.size());
    for (size_t k = std::min(avail, m.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == m.substr(0, k)) return k;
    return 0;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

OutputTracker::OutputTracker(const text::Tokenizer& tok, bool thinking, bool tools, std::vector<std::string> stop)
    : tok_(&tok), dec_(tok), thinking_(thinking), tools_(tools), stop_(std::move(stop)) {}

runtime::TokenAction OutputTracker::push(int32_t token) {
    runtime::TokenAction act;
    const size_t old = text_.size();
    text_ += dec_.push(token);
    if (!stop_.empty() && text_.size() > old) {
        size_t maxlen = 0;
        for (const auto& s : stop_) maxlen = std::max(maxlen, s.size());
        const size_t from = old > maxlen ? old - maxlen + 1 : 0;
        size_t best = std::string::npos;
        for (const auto& s : stop_) best = std::min(best, text_.find(s, from));
        if (best != std::string::npos) {
            text_.resize(best);
            stopped_ = true;
            act.stop = true;
            update_stream(false);
            return act;
        }
    }
    // A complete tool-call block ends the generation (§8.3).
    size_t cs = 0;
    if (thinking_) {
        const size_t close = text_.find(text::kThinkClose);
        cs = close == std::string::npos ? std::string::npos : close + text::kThinkClose.size();
    }
    if (cs != std::string::npos) {
        size_t open = std::string::npos;
        for (auto o : kToolOpeners) open = std::min(open, text_.find(o, cs));
        if (open != std::string::npos)
            for (auto c : kToolClosers)
                if (text_.find(c, open) != std::string::npos) {
                    tool_block_closed_ = true;
                    act.stop = true;
                }
    }
    update_stream(false);
    act.greedy_next = !act.stop && tools_ && in_tool_block_structure();
    return act;
}

void OutputTracker::finish() {
    if (!stopped_) text_ += dec_.flush();
    update_stream(true);
}

// The decode-time DSML guard (§4.5): inside a tool block, everything but string bodies
// (string="true" values, JSON strings in string="false" values) is sampled greedily.
bool OutputTracker::in_tool_block_structure() const {
    size_t cs = 0;
    if (thinking_) {
        const size_t close = text_.rfind(text::kThinkClose);
        if (close == std::string::npos) return false;
        cs = close + text::kThinkClose.size();
    }
    size_t open = std::string::npos;
    for (auto o : kToolOpeners) open = std::min(open, text_.find(o, cs));
    if (open == std::string::npos) return false;
    const std::string_view block = std::string_view(text_).substr(open);
    const size_t po = block.rfind(kParamOpen);
    const size_t pc = block.rfind(kParamClose);
    if (po == std::string_view::npos || (pc != std::string_view::npos && pc > po)) return true;
    const size_t gt = block.find('>', po);
    if (gt == std::string_view::npos) return true;   // inside the tag
    const std::string_view tag = block.substr(po, gt - po);
    if (tag.find("string=\"true\"") != std::string_view::npos) return false;
    bool in_str = false, esc = false;
    for (char c : block.substr(gt + 1)) {
        if (esc) esc = false;
        else if (in_str && c == '\\') esc = true;
        else if (c == '"') in_str = !in_str;
    }
    return !in_str;
}

void OutputTracker::update_stream(bool final) {
    if (final) {
        // Reconcile with the parsed message: emit what the stream has not shown yet.
        const text::ParsedMessage m = final_message();
        if (m.reasoning.size() > sent_reasoning_) {
            pending_.reasoning += m.reasoning.substr(sent_reasoning_);
            sent_reasoning_ = m.reasoning.size();
        }
        if (m.content.size() > sent_content_) {
            pending_.content += m.content.substr(sent_content_);
            sent_content_ = m.content.size();
        }
        return;
    }
    const std::string_view t = text_;
    // Stop strings may still complete: hold back a suffix that starts one.
    size_t hold_stop = 0;
    for (const auto& s : stop_) hold_stop = std::max(hold_stop, partial_suffix(t, 0, s));
    size_t content_start = 0;
    if (thinking_) {
        size_t r0 = 0;
        if (t.size() < text::kThinkOpen.size() && text::kThinkOpen.starts_with(t)) return;
        if (t.starts_with(text::kThinkOpen)) r0 = text::kThinkOpen.size();
        const size_t close = t.find(text::kThinkClose, r0);
        size_t r_end = close;
        if (close == std::string_view::npos) {
            r_end = t.size() - std::max(hold_stop, partial_suffix(t, r0, text::kThinkClose));
            r_end = std::max(r_end, r0);
        }
        if (r_end - r0 > sent_reasoning_) {
            pending_.reasoning += std::string(t.substr(r0 + sent_reasoning_, r_end - r0 - sent_reasoning_));
            sent_reasoning_ = r_end - r0;
        }
        if (close == std::string_view::npos) return;
        content_start = close + text::kThinkClose.size();
    }
    // Content: up to a tool block, holding back whitespace and partial markers.
    size_t c_end = t.size();
    for (auto o : kToolOpeners) c_end = std::min(c_end, t.find(o, content_start));
    if (c_end == t.size()) {
        size_t hold = hold_stop;
        for (auto o : kToolOpeners) hold = std::max(hold, partial_suffix(t, content_start, o));
        c_end = t.size() - std::min(hold, t.size() - content_start);
    }
    while (c_end > content_start && is_ws(t[c_end - 1])) --c_end;
    if (c_end - content_start > sent_content_) {
        pending_.content += std::string(t.substr(content_start + sent_content_, c_end - content_start - sent_content_));
        sent_content_ = c_end - content_start;
    }
}

OutputTracker::Delta OutputTracker::take_delta() {
    Delta d;
    std::swap(d, pending_);
    return d;
}

text::ParsedMessage OutputTracker::final_message() const {
    text::ParsedMessage m = text::parse_generated_message(text_, thinking_);
    // A block that did not parse is plain content (§8.3).
    if (m.tool_calls.empty() && !m.tool_calls_raw.empty()) {
        m.content += m.tool_calls_raw;
        m.tool_calls_raw.clear();
    }
    return m;
}

// ---- responses -----------------------------------------------------------------------------

std::string random_id(const std::string& prefix) {
    thread_local std::mt19937_64 rng(std::random_device{}() ^
                                     uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
    static const char* hex = "0123456789abcdef";
    std::string s = prefix;
    for (int i = 0; i < 24; ++i) s += hex[rng() & 15];
    return s;
}

json usage_json(const runtime::JobResult& r) {
    json u = json::object();
    u["prompt_tokens"] = r.prompt_tokens;
    u["completion_tokens"] = r.completion_tokens;
    u["total_tokens"] = r.prompt_tokens + r.completion_tokens;
    u["prompt_tokens_details"] = json{{"cached_tokens", r.cached_tokens}};
    return u;
}

std::string finish_reason(const runtime::JobResult& r, const text::ParsedMessage& m) {
    if (r.finish == runtime::FinishReason::Error) return "error";
    if (!m.tool_calls.empty()) return "tool_calls";
    if (r.finish == runtime::FinishReason::Length) return "length";
    return "stop";
}

json response_head(const std::string& id, const char* object, int64_t created, const std::string& model) {
    json h = json::object();
    h["id"] = id;
    h["object"] = object;
    h["created"] = created;
    h["model"] = model;
    return h;
}

json one_choice(const json& fields, json finish) {
    json choice = json::object();
    choice["index"] = 0;
    for (const auto& field : fields.items()) choice[field.key()] = field.value();
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = std::move(finish);
    return choice;
}

namespace {

// A non-streamed answer: the head, the one choice and the usage.
json response_json(const std::string& id, const char* object, int64_t created, const std::string& model,
                   const json& fields, const std::string& finish, const runtime::JobResult& r) {
    json out = response_head(id, object, created, model);
    out["choices"] = json::array({one_choice(fields, finish)});
    out["usage"] = usage_json(r);
    return out;
}

}  // namespace

json chat_response(const std::string& id, int64_t created, const std::string& model, const text::ParsedMessage& m,
                   const std::vector<std::string>& call_ids, const std::string& finish, const runtime::JobResult& r) {
    json msg = json::object();
    msg["role"] = "assistant";
    msg["content"] = m.content.empty() && !m.tool_calls.empty() ? json(nullptr) : json(m.content);
    if (!m.reasoning.empty()) msg["reasoning_content"] = m.reasoning;
    if (!m.tool_calls.empty()) {
        json calls = json::array();
        for (size_t i = 0; i < m.tool_calls.size(); ++i)
            calls.push_back(json{{"id", call_ids[i]},
                                 {"type", "function"},
                                 {"function", {{"name", m.tool_calls[i].name}, {"arguments", m.tool_calls[i].arguments}}}});
        msg["tool_calls"] = calls;
    }
    json fields = json::object();
    fields["message"] = std::move(msg);
    return response_json(id, "chat.completion", created, model, fields, finish, r);
}

json completion_response(const std::string& id, int64_t created, const std::string& model,
                         const text::ParsedMessage& m, const std::string& finish, const runtime::JobResult& r) {
    json fields = json::object();
    fields["text"] = m.content;
    if (!m.reasoning.empty()) fields["reasoning_content"] = m.reasoning;
    return response_json(id, "text_completion", created, model, fields, finish, r);
}

}  // namespace dsv4::apps::serve
