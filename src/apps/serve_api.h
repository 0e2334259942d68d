// The OpenAI side of `dsv4 serve` (model-spec §8): request parsing and validation, prompt
// rendering, the per-request output tracker (stop strings, reasoning/content split, DSML
// tool calls, the decode-time DSML guard, stream deltas) and response JSON. No transport.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dsv4/sampler.h"
#include "dsv4/scheduler.h"
#include "dsv4/text.h"

namespace dsv4::apps::serve {

using json = nlohmann::ordered_json;

inline constexpr const char* kModelId = "deepseek-v4-flash";

// An error in OpenAI's shape: {"error":{"message","type","param","code", extra...}}.
struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;   // "" -> null
    std::string code;    // "" -> null
    json extra = json::object();
    json body() const;
};

[[noreturn]] void bad_request(std::string message, std::string param = {}, std::string code = "invalid_value");

enum class Endpoint { Chat, Completions };

// Everything a generation request asks for, validated.
struct ParsedRequest {
    Endpoint endpoint = Endpoint::Chat;
    std::string model = kModelId;
    // chat
    std::vector<text::Message> messages;
    std::vector<std::string> tool_schemas;   // empty when no tools or tool_choice "none"
    // completions
    std::string prompt_text;
    std::vector<int32_t> prompt_ids;          // a token-id prompt (raw, no template)
    bool prompt_is_ids = false;

    text::ThinkMode think = text::ThinkMode::High;
    SamplerParams sampling;
    std::optional<uint64_t> max_tokens;
    std::vector<std::string> stop;
    bool stream = false;
    bool include_usage = false;
    bool ignore_eos = false;   // (vLLM's extension) generate max_tokens tokens; for benchmarks
};

struct ParseContext {
    uint64_t ctx = 4096;
};

// Throws ApiError (400) naming the field for every malformed or unsupported input.
ParsedRequest parse_chat_request(const json& body, const ParseContext& pc);
ParsedRequest parse_completion_request(const json& body, const ParseContext& pc);

// Remembers the exact DSML block sampled for tool-call ids (model-spec §4.5 "exact replay"),
// so a client sending the calls back gets the same bytes rendered (the KV prefix matches).
class ToolCallMemory {
public:
    explicit ToolCallMemory(size_t max_ids = 100000) : max_(max_ids) {}
    void remember(const std::vector<std::string>& ids, const std::string& raw);
    // Fills tool_calls_raw of assistant messages whose calls all map to the same block.
    void apply(std::vector<text::Message>& messages) const;

private:
    mutable std::mutex mu_;
    size_t max_;
    std::unordered_map<std::string, std::string> map_;
    std::deque<std::string> order_;
};

// The rendered prompt (text, and ids) of a request.
struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool thinking = false;   // the prompt ends inside <think>
};
Prompt render_prompt(const ParsedRequest& r, const text::Tokenizer& tok);

// What the model generated so far, as text, with the rules of §8.3/§4.5: stop strings
// (output truncated at their start), the reasoning/content split, tool blocks, and
// hold-back of anything that may still become a marker. Used on the worker thread.
class OutputTracker {
public:
    OutputTracker(const text::Tokenizer& tok, bool thinking, bool tools, std::vector<std::string> stop);
    // Feeds one sampled token; returns whether to stop and whether the next draw is greedy.
    runtime::TokenAction push(int32_t token);
    // End of generation: flushes held-back bytes.
    void finish();

    // Stream deltas produced since the last call (safe to show: no partial marker).
    struct Delta {
        std::string reasoning, content;
    };
    Delta take_delta();
    // The final message (after finish()): reasoning, content, tool calls.
    text::ParsedMessage final_message() const;
    const std::string& text() const { return text_; }
    bool stopped_by_string() const { return stopped_; }

private:
    void update_stream(bool final);
    bool in_tool_block_structure() const;

    const text::Tokenizer* tok_;
    text::StreamDecoder dec_;
    bool thinking_, tools_;
    std::vector<std::string> stop_;
    std::string text_;
    bool stopped_ = false, tool_block_closed_ = false;
    // stream state: what was emitted of the reasoning and of the content
    size_t sent_reasoning_ = 0, sent_content_ = 0;
    Delta pending_;
};

// Response bodies and stream chunks. Each starts with the head (id, object, created, model)
// and holds one choice: index 0, then `fields` in their order (message, delta or text...),
// no logprobs, and the finish reason (null in a chunk that does not finish).
json response_head(const std::string& id, const char* object, int64_t created, const std::string& model);
json one_choice(const json& fields, json finish);
json usage_json(const runtime::JobResult& r);
json chat_response(const std::string& id, int64_t created, const std::string& model, const text::ParsedMessage& m,
                   const std::vector<std::string>& call_ids, const std::string& finish, const runtime::JobResult& r);
json completion_response(const std::string& id, int64_t created, const std::string& model,
                         const text::ParsedMessage& m, const std::string& finish, const runtime::JobResult& r);
// finish_reason of a finished job: stop | length | tool_calls | error.
std::string finish_reason(const runtime::JobResult& r, const text::ParsedMessage& m);

std::string random_id(const std::string& prefix);

}  // namespace dsv4::apps::serve
