// OpenAI wire format: request parsing/validation and response rendering.
//
// Contract: parse_completion_request() / parse_chat_request() turn a request
// body into plain structs (no JSON escapes this layer). A body that is not a
// JSON object, a known field of the wrong type or out of range (negative or
// zero max_tokens, non-finite or negative temperature, top_p outside (0,1],
// min_p outside [0,1], repeat_penalty <= 0, n != 1, ...), an empty prompt, or
// malformed messages give an ApiError with HTTP 400, type
// "invalid_request_error", `param` naming the field and a message naming the
// problem. So does a request over one of the cost limits below (the message
// names the limit and the size sent): more than kMaxStop stop strings, a stop
// string over kMaxStopBytes or all of them over kMaxStopTotalBytes, tools
// over kMaxToolsBytes, a prompt (or the messages' text) over
// kMaxPromptBytes. These are checked while parsing, before anything is
// tokenized or queued.
//
// Strict, honest parsing (every parse_*_request below):
//  - The body is exactly one JSON value: bytes after it (other than JSON
//    whitespace), a NUL byte anywhere or bytes that are not UTF-8 are a 400
//    with code "invalid_json" whose message names the byte offset. (A raw NUL
//    would otherwise end nlohmann's lexer early and the rest be ignored.)
//  - A top-level field not in the endpoint's list below is a 400 with code
//    "unknown_parameter" and `param` = the field ("Unrecognized request
//    argument supplied: X", as OpenAI words it), never silently ignored.
//  - A listed field the server does not implement is accepted only with a
//    value that changes nothing (0, null, {}, false, ...); any other value is
//    a 400 with code "unsupported_parameter" naming it.
//  - An error message quotes client input only as input_excerpt() (at most
//    kInputExcerptBytes bytes and the full length), and render_error() bounds
//    the whole message to kMaxErrorMessageBytes (and `param` to kMaxParamBytes),
//    so a 50 MB body never comes back in its error.
// render_*() produce the bodies: completions and chat completions (whole and
// as stream chunks, OpenAI's "text_completion" / "chat.completion.chunk"
// shapes), and the error body {"error":{"message","type","param","code"}}.
// Every non-error body carries a "spillway" object (placement, model, limits).
// Spillway's own endpoints (health, status, quote, reservations, request
// records, resume, admin faults) have their JSON in http/spillway_api.h.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "gateway/gateway.h"
#include "serve/scheduler.h"
#include "http/tool_calls.h"
#include "tokenizer/chat_template.h"

namespace spw::http {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null
  // A resumable error (code "resumable"): the request to resume and where
  // (rendered as "request_id" and "resume_url" in the error object).
  std::optional<uint64_t> request_id;
};

// Maps a Status from the scheduler/engine to an HTTP error.
ApiError api_error_from_status(const Status& s);

// How much client input an error may quote, and how long an error message and
// its `param` may be when rendered (render_error / render_refusal cut longer
// ones, saying how long they were). The longest message of our own is an
// unknown_parameter's on /v1/chat/completions, which lists every accepted
// field (about 550 bytes with a 40-byte excerpt of the unknown name): the
// bound leaves it whole.
inline constexpr size_t kInputExcerptBytes = 40;
inline constexpr size_t kMaxErrorMessageBytes = 768;
inline constexpr size_t kMaxParamBytes = 128;

// Request cost limits (see the contract above). Each is far above what a real
// client sends, and low enough that a request at the limit costs the worker
// no more than an ordinary one:
//  - stop strings are matched on every generated token (engine/stop_rules.h
//    makes that cost independent of their length, but each is held in
//    memory per generation and compiled per request); real ones are
//    delimiters of a few to a few dozen bytes ("\n\nUser:", "</s>").
//    kMaxStop is OpenAI's own limit times four.
inline constexpr size_t kMaxStop = 16;
inline constexpr size_t kMaxStopBytes = 4 * 1024;
inline constexpr size_t kMaxStopTotalBytes = 16 * 1024;
//  - tools are rendered into the prompt of every request that lists them;
//    a real tool's JSON is a few hundred bytes to a few KiB, so 128 tools
//    (the count limit) of 2 KiB each fit. Measured as the `tools` array's
//    compact JSON (which is what the templates render).
inline constexpr size_t kMaxToolsBytes = 256 * 1024;
//  - the prompt (/v1/completions) or the text of all messages (content and
//    tool-call arguments, /v1/chat/completions): half the transport's
//    default body limit (16 MiB) and about two million tokens of text at ~4
//    bytes a token, more than a local model's context holds, so it refuses
//    only prompts that could not run anyway, but says so by name. Smaller prompts that cannot fit
//    are refused cheaply by Gateway::precheck (400 context_length_exceeded),
//    before tokenization too.
inline constexpr size_t kMaxPromptBytes = 8 * 1024 * 1024;
//  - logit_bias entries: engine/sampler.h's kMaxLogitBias (1024), which
//    says why.
//  - stop_token_ids: each generated token is compared with every one, and
//    each is stored in the request's checkpoints; a model has a handful of
//    end-of-turn tokens, so 64 is far above any real list.
inline constexpr size_t kMaxStopTokenIds = 64;

// `text` when it is at most `max_bytes` long; else its first bytes (cut on a
// UTF-8 character boundary) followed by "... (N bytes)". For quoting client
// input in error messages.
std::string input_excerpt(std::string_view text, size_t max_bytes = kInputExcerptBytes);

// The top-level fields each endpoint accepts (any other: "unknown_parameter").
//
// Both /v1/completions and /v1/chat/completions (and /v1/quote, which takes
// either body):
//   model (informational: one model is served), max_tokens,
//   max_completion_tokens (the same limit under OpenAI's newer name; both
//   given and different: 400 naming max_completion_tokens), temperature,
//   top_p, seed (an integer in [-(2^53 - 1), 2^53 - 1], the integers a JSON
//   number holds exactly, so that the seed a response reports back is the
//   one sent; negative ones as their 64-bit two's complement; outside: 400
//   naming seed and the range), stop, stream, n (1 only), best_of (1 only),
//   logprobs (see "Log-probabilities" below),
//   frequency_penalty and presence_penalty (numbers in [-2, 2]; counted over
//   the tokens this request generated, not the prompt, as OpenAI defines
//   them: engine/sampler.h), logit_bias ({"<token id>": number in [-100,
//   100]}: keys decimal token ids below the vocabulary's size, at most
//   kMaxLogitBias entries, one key per token; -100 bans a token in
//   practice, +100 forces it; greedy requests honour it too), all carried
//   in the request's checkpoints, so a resumed or migrated request
//   continues as it would have;
//   llama.cpp-style sampling the server implements: top_k, min_p,
//   repeat_penalty, repeat_last_n (the window repeat_penalty looks back
//   over, prompt included);
//   vLLM's names for what the engine does: repetition_penalty (the same
//   penalty as repeat_penalty, over the repeat_last_n window, where vLLM's
//   is the whole sequence; both given and different: 400 naming
//   repetition_penalty), ignore_eos (a boolean: an end-of-generation token
//   is generated on, as text it adds nothing), min_tokens (an integer >= 0,
//   at most max_tokens when that is given: until that many tokens are
//   generated, end-of-generation tokens (unless ignore_eos) and
//   stop_token_ids are never sampled; stop strings still apply, unlike
//   vLLM's), stop_token_ids (at most kMaxStopTokenIds token ids below the
//   vocabulary's size: sampling one ends the response with "stop", the
//   token not in its text nor its count, as an end-of-generation token),
//   skip_special_tokens (true / null only: control tokens never reach the
//   text here; false is unsupported_parameter);
//   response_format: {"type": "text"} / null (free text), {"type":
//   "json_object"} (a JSON object), {"type": "json_schema", "json_schema":
//   {"name": non-empty string, "description"?, "schema"?: the schema (absent:
//   any JSON value), "strict"?: boolean (either way the schema is enforced)}}:
//   constrained decoding (grammar/json_schema.h has the subset; a schema
//   outside it is a 400 whose message names the keyword and its JSON pointer,
//   param "response_format"; other keys of either object unknown_parameter);
//   a JSON response_format with ignore_eos, min_tokens > 0 or (chat) tools
//   is a 400 naming that field;
//   accepted only with values that change nothing (else unsupported_parameter):
//   tools ([] / null);
//   metadata that does not affect the output: user (string), metadata
//   (object), store (false / null: nothing is stored for later retrieval),
//   service_tier ("auto" / "default" / null), stream_options
//   ({"include_usage": bool}: the usage chunk; other keys unknown_parameter).
inline constexpr std::string_view kSharedGenerationFields[] = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream", "n",
    "best_of", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty",
    "logit_bias", "logprobs", "response_format", "tools", "user", "metadata", "store", "service_tier",
    "stream_options", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids", "skip_special_tokens",
    "keep_alive"};
// /v1/completions also: prompt (required; a string, token ids, or an array
// of one of those: http/completion_prompt.h; a batch of several is a 400),
// echo (a boolean: true puts the prompt before the completion's text, and
// with logprobs lists the prompt's tokens first: see "Log-probabilities"),
// suffix ("" / null).
inline constexpr std::string_view kCompletionOnlyFields[] = {"prompt", "echo", "suffix"};
// /v1/chat/completions also: messages (required), tool_choice ("none" /
// "auto" / null: without tools no tool is called either way),
// parallel_tool_calls (a boolean; nothing to parallelise without tools),
// top_logprobs (see below).
inline constexpr std::string_view kChatOnlyFields[] = {"messages", "tool_choice", "parallel_tool_calls",
                                                       "top_logprobs"};
//
// Log-probabilities (OpenAI's `logprobs`; SamplingFields::logprobs):
//  - /v1/completions: `logprobs` an integer in [0, 5] (null, absent or false:
//    none; true or another value: 400 naming logprobs). Each choice (and each
//    stream chunk that carries tokens) then has "logprobs": {"tokens",
//    "token_logprobs", "top_logprobs": [{token: logprob}] with the N most
//    likely tokens and the chosen one (so up to N + 1 keys; two tokens of the
//    same text show once, the more likely), "text_offset": characters
//    (Unicode code points, as OpenAI counts them) from the start of the
//    prompt to each token, counted from the tokens' bytes};
//  - /v1/chat/completions: `logprobs` a boolean, `top_logprobs` an integer in
//    [0, 20] (default 0) that needs "logprobs": true (otherwise 400 naming
//    top_logprobs). Each choice (and each chunk that carries tokens) then has
//    "logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs":
//    [{"token", "logprob", "bytes"}] (the N most likely)}], "refusal": null}.
//  The numbers are the model's: the log-softmax of the step's raw logits in
//  double precision, before repetition penalty, top-k/p, min-p and
//  temperature (as llama.cpp's server reports by default; engine/sampler.h
//  step_logprobs), so a greedy choice is the first alternative unless the
//  repetition penalty moved it, and the chosen token's logprob is there even
//  when it is not among the alternatives. Alternatives tie by lower token id.
//  A log-probability of -inf (a masked logit) is written -9999.0, OpenAI's
//  figure for "never". `token` is the token's text (a token that is part of a
//  UTF-8 character shows U+FFFD for it; an alternative control token its
//  name, e.g. "</s>"), `bytes` its exact bytes. Which tokens are listed, and
//  in which chunk, is engine/generate.h's rule: every token whose text is in
//  the response, once, in the chunk that completes its text (never before
//  it); a token that completes a stop string, and an end-of-generation
//  token, are not listed. A request that migrates to another path mid-stream
//  goes on listing from there, nothing listed twice.
//  Not stored: a replay of a finished request by its Idempotency-Key, and a
//  resumed request (POST /v1/requests/{id}/resume), answer with "logprobs":
//  null (the journal keeps the text and the checkpoint, not the entries).
//  Requests that do not ask compute nothing.
//  /v1/completions with "echo": true lists the prompt's tokens first, as
//  OpenAI's legacy API does: the first one with "token_logprobs" null and
//  "top_logprobs" null (nothing predicts it), the others from the logits of
//  the position before (engine/generate.h GenerateOptions::prompt_logprobs;
//  a token's text is its bytes in the prompt, a SentencePiece vocabulary's
//  prefixed space dropped from the first); "text_offset" then counts from
//  the start of the echoed text (0 for the first prompt token). Streaming,
//  the prompt's text and entries are one chunk before the completion's.

// Sampling fields shared by both endpoints; nullopt = the server default.
struct SamplingFields {
  std::optional<int32_t> max_tokens;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;  // repeat_penalty or repetition_penalty
  std::optional<int32_t> repeat_last_n;
  std::optional<float> frequency_penalty;
  std::optional<float> presence_penalty;
  std::vector<LogitBias> logit_bias;  // sorted by id; ids not checked against the vocabulary yet
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::optional<int32_t> min_tokens;
  std::vector<TokenId> stop_token_ids;  // not checked against the vocabulary yet
  // response_format json_object / json_schema (kNone: text).
  grammar::ConstraintSpec constraint;
  // Log-probabilities asked for: the number of alternatives per token
  // (completions' logprobs; chat's top_logprobs, 0 when only logprobs is
  // true); nullopt: none.
  std::optional<int32_t> logprobs;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // OpenAI's n: choices in [1, kMaxChoices] (engine/generate.h), choice i
  // sampled with seed + i; best_of must equal n when given.
  int32_t n = 1;
  // Ollama's keep_alive for a catalogue model (gateway/residency.h): seconds
  // (a number) or a duration string ("5m", "1h", "-1": forever; core/
  // duration.h), as the X-Spillway-Keep-Alive header; none: the model's own.
  std::optional<double> keep_alive_s;
};

struct CompletionRequest {
  std::string model;  // informational; the server serves one model
  std::string prompt;  // empty when prompt_tokens is given
  // "prompt" as token ids (http/completion_prompt.h); nullopt: text.
  std::optional<std::vector<TokenId>> prompt_tokens;
  bool echo = false;
  SamplingFields sampling;
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  SamplingFields sampling;
  // `tools` ({"type":"function","function":{name, description?,
  // parameters?, strict?}}, names of 1-64 letters, digits, '_' or '-',
  // unique) as the templates render them; empty with tool_choice "none"
  // (the model is not told of them, and nothing is parsed as a call).
  // tool_choice: "auto" (default with tools), "none"; "required" and a
  // named function are refused (400 unsupported_parameter: forcing a call
  // needs the call constrained to the tool's schema: not wired to tools yet).
  // parallel_tool_calls (default true): false keeps the first call.
  // Messages may carry assistant tool_calls ({id, type "function",
  // function {name, arguments: a JSON object as a string}}) and "tool"
  // messages (tool_call_id, content): arguments that are not a JSON object
  // are a 400 naming messages[i].tool_calls[j].function.arguments.
  std::vector<ChatTool> tools;
  bool parallel_tool_calls = true;
};

// A JSON object with a "messages" field (a chat body, e.g. for /v1/quote).
bool is_chat_body(std::string_view body);

// Return nullopt on success (out filled), else the error.
std::optional<ApiError> parse_completion_request(std::string_view body, CompletionRequest& out);
std::optional<ApiError> parse_chat_request(std::string_view body, ChatRequest& out);
// What parsing cannot check without the model: every token id a request
// names (logit_bias keys, stop_token_ids) below n_vocab, the served model's
// vocabulary size. A 400 (invalid_value) naming the field otherwise.
std::optional<ApiError> check_token_ids(const SamplingFields& s, int32_t n_vocab);

// What every response reports about where and how it ran.
struct SpillwayInfo {
  std::string placement = "cpu";
  std::string path;           // execution path ("gpu", "cpu", ...); empty for replays
  std::string model;
  bool fallback_model = false;  // a different model than the one asked for
  // The admission decision and its reason ("admit", "delay", "shrink",
  // "offload", "redirect"); degraded when not on the first-choice path.
  std::string decision;
  std::string reason;
  bool degraded = false;
  bool shrunk = false;
  int32_t queue_position = 0;       // at acceptance (0: started at once)
  // Predicted wait at acceptance and the quote it was admitted under;
  // nullopt (JSON null, header absent) while the path's rates cannot say.
  std::optional<double> estimated_delay_ms;
  std::optional<double> predicted_ttft_ms;
  std::optional<double> predicted_total_ms;
  uint64_t request_id = 0;
  // The sampler's seed: the request's (a negative one as its two's
  // complement), or one the server chose, below 2^53 so that a client can
  // send it back.
  uint64_t seed = 0;
  serve::AppliedLimits limits;
  double queue_ms = 0;
  double run_ms = 0;
  // A retry with a finished request's Idempotency-Key: the stored result,
  // nothing ran again ("replayed": true; absent otherwise).
  bool replayed = false;
  // Moved to another path mid-generation at a checkpoint ("migrations").
  int32_t migrations = 0;
  // A POST /v1/requests/{id}/resume response: the token it continued from
  // ("resumed_at_token"; absent otherwise).
  std::optional<int32_t> resumed_at_token;
};

// A choice's log-probabilities as rendered (see "Log-probabilities" above).
struct ChoiceLogprobs {
  std::vector<TokenLogprobs> entries;  // the engine's, in order
  // /v1/completions: the text_offset of the first entry (characters of the
  // prompt and of the text before it: count_chars()).
  int64_t text_offset = 0;
};
// Unicode code points in UTF-8 bytes (the bytes that do not continue a
// character), as text_offset counts them.
int64_t count_chars(std::string_view utf8);

struct CompletionResult {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string text;
  // Chat: the calls the model made (message.tool_calls; message.content is
  // null when `text` is empty and there are calls).
  std::vector<ToolCallOut> tool_calls;
  std::string finish_reason;  // "stop" / "length"
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  SpillwayInfo spillway;
  std::optional<ChoiceLogprobs> logprobs;  // nullopt: "logprobs": null
  // n > 1: choices 1..n-1 (the fields above are choice 0's; no tool calls),
  // rendered with index 1.. after it. completion_tokens counts all.
  struct Choice {
    std::string text;
    std::string finish_reason;
    std::optional<ChoiceLogprobs> logprobs;
  };
  std::vector<Choice> more_choices;
};

std::string render_completion(const CompletionResult& r);
std::string render_chat_completion(const CompletionResult& r);

// One stream chunk. `finish_reason` empty -> null. `spillway` is included when
// given (the first and last chunks carry it). For chat, `role_delta` puts
// {"role":"assistant"} into the delta (the first chunk).
struct ChunkFields {
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string text;
  std::string finish_reason;
  int32_t index = 0;  // the choice (n > 1)
  bool role_delta = false;
  const SpillwayInfo* spillway = nullptr;
  // Usage-only final chunk (stream_options.include_usage): choices is empty.
  bool usage_only = false;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  // The entries released with `text` (null or none: "logprobs": null).
  const ChoiceLogprobs* logprobs = nullptr;
  // Chat: one whole call as a delta ({"tool_calls":[{"index", "id", "type":
  // "function", "function":{"name","arguments"}}]}), index = its position
  // among the response's calls.
  const ToolCallOut* tool_call = nullptr;
  int32_t tool_call_index = 0;
};
std::string render_completion_chunk(const ChunkFields& c);
std::string render_chat_chunk(const ChunkFields& c);

// {"error":{...}}; with a model name, also "spillway":{"model","placement":null}
// (the request was not placed anywhere).
std::string render_error(const ApiError& e, const std::string& model = "");
// An error that admission decided (429/503): the error body plus
// "spillway":{"decision":"reject","reason",...,"paths":[verdicts]}.
std::string render_refusal(const ApiError& e, const std::string& model, const admission::Decision& d);
// A stream chunk while the request waits in a queue: "choices":[] (which
// OpenAI clients accept, as for usage chunks) and
// "spillway":{"state":"queued","queue_position","estimated_delay_ms","path"}.
std::string render_queued_chunk(const std::string& id, int64_t created, const std::string& model, bool chat,
                                const std::string& path, int32_t position,
                                std::optional<double> estimated_delay_ms);

// Server-Sent Events framing: "data: <payload>\n\n". The payload must not
// contain a newline (our JSON never does).
std::string sse_data(std::string_view payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// A comment line: ignored by clients; written to detect a vanished client.
inline constexpr std::string_view kSseKeepAlive = ": keep-alive\n\n";

}  // namespace spw::http
