// Text layer: the byte-level BPE tokenizer (model-spec.md §2.5, §3), chat rendering with
// thinking modes and the tool preamble (§4.1-§4.4), and DSML tool-call syntax (§4.5).
// Knows nothing of devices or sessions: text in, token ids out, and back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/common.h"

namespace dsv4::gguf {
class File;
}

namespace dsv4::text {

// ---- vocabulary ---------------------------------------------------------------------------

// Token kinds, numbered as GGUF's `tokenizer.ggml.token_type` (llama.cpp's numbering).
enum class TokenType : int32_t {
    Normal = 1,
    Unknown = 2,
    Control = 3,      // special tokens (BOS, EOS, placeholders, ...)
    UserDefined = 4,  // added tokens that are not "special" (e.g. <｜User｜>)
    Unused = 5,       // padding up to the model's vocabulary size
    Byte = 6,
};

// The raw material of a tokenizer: token strings (id = index; normal tokens are spelled
// with the GPT-2 byte->unicode map), merges "A B" (rank = index) and, optionally, a kind
// per token. `types` is empty or as long as `tokens`.
struct Vocab {
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::vector<TokenType> types;
    // The Split regexes of the file's pre_tokenizer, in order (HF tokenizer.json only;
    // informative: the tokenizer always uses pre_tokenizer_regexes()).
    std::vector<std::string> pre_tokenizer_regexes;
};

// Reads a Hugging Face tokenizer.json: model.vocab, model.merges ("a b" strings or [a, b]
// pairs) and added_tokens (special -> Control, others -> UserDefined). Ids missing below
// `pad_to` (and every gap) become placeholder tokens "<｜place▁holder▁no▁ID｜>" of kind
// Unused; the DeepSeek vocabulary has 128,815 ids and the model 129,280 rows.
Vocab load_hf_tokenizer_json(const std::string& path, size_t pad_to = 0);

// A small self-contained vocabulary for when no real one is at hand: ids 0..255 are the
// 256 byte tokens (in byte order), 256..262 the seven specials of §2.5 (BOS, EOS, User,
// Assistant, <think>, </think>, ｜DSML｜), then a handful of English merges.
Vocab builtin_byte_vocab();

// The official DeepSeek V3/V4 pre-tokenizer: a sequence of three "Isolated" splits,
// verbatim from the HF tokenizer.json (§3.1 caveat). Each split is applied to every piece
// the previous one produced; the gaps between matches are pieces too.
const std::vector<std::string>& pre_tokenizer_regexes();

// GPT-2 byte <-> unicode map (§3.2): the code point that stands for a byte, and back
// (-1 for code points that stand for no byte).
uint32_t byte_to_codepoint(uint8_t b);
int codepoint_to_byte(uint32_t cp);
// Spells raw bytes the way vocabulary entries are spelled ("hello world" -> "helloĠworld").
std::string bytes_to_token_spelling(std::string_view bytes);

// Ids of the seven specials the engine needs (§2.5); -1 when the vocabulary lacks one.
struct SpecialTokens {
    int32_t bos = -1;
    int32_t eos = -1;
    int32_t user = -1;
    int32_t assistant = -1;
    int32_t think_open = -1;
    int32_t think_close = -1;
    int32_t dsml = -1;
};

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";

// ---- tokenizer ----------------------------------------------------------------------------

// Byte-level BPE with the official pre-tokenizer. Immutable after construction except for
// an internal piece cache (thread-safe). Copies share the same tables and cache.
class Tokenizer {
public:
    static Tokenizer from_vocab(const Vocab& vocab);
    static Tokenizer from_vocab(std::vector<std::string> tokens, std::vector<std::string> merges,
                                std::vector<TokenType> types = {});
    // From `tokenizer.ggml.tokens`, `tokenizer.ggml.merges` and, when present,
    // `tokenizer.ggml.token_type`. Throws Error naming the key when they are missing.
    static Tokenizer from_gguf(const gguf::File& file);

    // Text -> ids. With parse_special, the strings of special tokens (the seven of §2.5 and
    // every Control/UserDefined token of the vocabulary; longest match wins) become their ids
    // and the text between them is tokenized on its own. Without it, specials are plain text.
    // Throws Error when the text is not valid UTF-8 (naming the byte offset).
    std::vector<int32_t> encode(std::string_view text, bool parse_special = false) const;
    void encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out) const;

    // The pieces the pre-tokenizer splits `text` into (no special parsing); for tests.
    std::vector<std::string> pre_tokenize(std::string_view text) const;

    // Id -> bytes (§3.4). Specials come out verbatim; others through the inverse byte map.
    // Concatenating the bytes of several tokens may split a UTF-8 character; use
    // StreamDecoder when emitting text as it is generated.
    const std::string& decode(int32_t id) const;
    std::string decode(std::span<const int32_t> ids) const;

    size_t vocab_size() const;
    const std::string& token(int32_t id) const;  // the vocabulary spelling
    TokenType type(int32_t id) const;
    std::optional<int32_t> find(std::string_view token) const;  // exact spelling -> id
    bool is_special(int32_t id) const;                          // matched by parse_special
    const SpecialTokens& special() const;
    // The id of one of the seven specials; throws Error naming it when the vocabulary lacks it.
    int32_t require_special(std::string_view token) const;

private:
    struct Impl;
    explicit Tokenizer(std::shared_ptr<Impl> impl);
    std::shared_ptr<Impl> impl_;
};

// Turns a stream of ids into text that is always valid UTF-8 at chunk boundaries: bytes of
// a character that is still incomplete are held back until the next token completes it.
// Bytes that can never form a valid character are passed through as they are.
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
    std::string push(int32_t id);
    std::string flush();  // whatever is held back (end of generation)
    bool has_pending() const { return !pending_.empty(); }

private:
    const Tokenizer* tok_;
    std::string pending_;
};

// ---- chat (§4) -----------------------------------------------------------------------------

enum class ThinkMode { None, High, Max };

// Contexts below this many tokens cannot use MAX (§4.1).
inline constexpr uint64_t kMaxThinkMinContext = 393216;
// MAX silently becomes HIGH when the session context is too small.
ThinkMode think_mode_for_context(ThinkMode requested, uint64_t context_tokens);
// The text MAX adds after BOS.
std::string_view max_think_prefix();
const char* think_mode_name(ThinkMode m);
// "none" | "high" | "max" -> mode; throws Error otherwise.
ThinkMode parse_think_mode(std::string_view name);

struct ToolCall {
    std::string id;  // client-side id (not rendered)
    std::string name;
    std::string arguments;  // JSON text (normally an object)
};

struct Message {
    std::string role;  // system | developer | user | assistant | tool | function
    std::string content;
    std::string reasoning_content;     // assistant only
    std::vector<ToolCall> tool_calls;  // assistant only
    // When non-empty, the exact DSML block that was sampled for these tool calls; it is
    // rendered verbatim instead of the canonical form (exact replay keeps KV prefixes).
    std::string tool_calls_raw;
};

struct ChatOptions {
    ThinkMode think = ThinkMode::High;  // already resolved with think_mode_for_context
    // One JSON object per tool, as the client sent it (the OpenAI `function` object). When
    // non-empty, tools are active and the preamble of §4.4 starts the system text.
    std::vector<std::string> tool_schemas;
};

// The tool preamble of §4.4, byte for byte; the schemas are joined by newlines.
std::string tools_preamble(const std::vector<std::string>& tool_schemas);

// Writes the `<` of every `</tool_result>` as `&lt;`; nothing else changes.
std::string escape_tool_result(std::string_view content);

// Canonical DSML rendering of tool calls (§4.5), starting with "\n\n<｜DSML｜tool_calls>".
// Parameters follow the property order of the matching schema first, then the arguments'
// own order. Returns "" when there are no calls.
std::string render_tool_calls(const std::vector<ToolCall>& calls, const std::vector<std::string>& tool_schemas = {});

// The multi-turn renderer of §4.3. The result is tokenized with encode(text, true).
std::string render_chat(const std::vector<Message>& messages, const ChatOptions& options);

// The simple single-turn prompt of §4.2: BOS [MAX prefix] [system] <｜User｜> user
// <｜Assistant｜> <think>|</think>. Each text part is tokenized on its own and specials inside
// `system`/`user` are plain text.
std::vector<int32_t> encode_single_turn(const Tokenizer& tok, std::string_view system, std::string_view user,
                                        ThinkMode think);
// The same prompt as text (`/v1/completions` renders this and parses specials).
std::string render_single_turn(std::string_view system, std::string_view user, ThinkMode think);

// ---- parsing generated output (§4.5) -------------------------------------------------------

struct ParsedMessage {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;  // arguments: a JSON object, minified, in written order
    std::string tool_calls_raw;        // the block exactly as generated (for exact replay)
};

// Splits an assistant's generated text (what followed the prompt's <think> or </think>)
// into reasoning, content and tool calls. `thinking`: the prompt ended with <think>, so the
// text starts inside the reasoning. Malformed or truncated DSML never throws: what could be
// read is returned and the rest stays in content.
ParsedMessage parse_generated_message(std::string_view text, bool thinking);

}  // namespace dsv4::text
