// JSON helpers the OpenAI wire format (openai.cpp) and Spillway's own API
// (spillway_api.cpp) share: the strict body parser (openai.h's "Strict,
// honest parsing"), the field readers and their 400s, and the fragments both
// kinds of body render (the "spillway" object, usage, admission verdicts).
// Internal to spw_http: nlohmann is a PRIVATE dependency of the library, so
// only its .cpp files include this header.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gateway/residency.h"
#include "http/openai.h"

namespace spw::http::json_fields {

// Insertion-ordered: responses list their fields as written (as OpenAI does),
// and a completions top_logprobs entry lists its alternatives most likely
// first (a sorted map would list them alphabetically).
using json = nlohmann::ordered_json;

// A 400 naming `param` (empty: null), with `message` and `code`.
ApiError bad(std::string param, std::string message, std::string code = "invalid_value");
// A 400 (invalid_type): `param` must be `expected`, and says what it got.
ApiError wrong_type(const std::string& param, const char* expected, const json& got);

// Each getter leaves `out` alone when the field is absent or null.
std::optional<ApiError> get_int(const json& obj, const char* key, std::optional<int64_t>& out);
std::optional<ApiError> get_number(const json& obj, const char* key, std::optional<double>& out);
std::optional<ApiError> get_bool(const json& obj, const char* key, std::optional<bool>& out);
std::optional<ApiError> get_string(const json& obj, const char* key, std::optional<std::string>& out);
// A 400 naming `key` unless lo <= v <= hi (lo < v with lo_open).
std::optional<ApiError> in_range(const char* key, double v, double lo, double hi, bool lo_open = false);

// The body as one JSON object, strictly (openai.h: one value, no NUL byte,
// UTF-8 only; a 400 invalid_json naming the byte offset otherwise).
std::optional<ApiError> parse_object(std::string_view body, json& out);
// 400 unknown_parameter for the first field of `obj` (in key order) not in
// any of `accepted`. `endpoint` names the route for the message.
std::optional<ApiError> refuse_unknown(const json& obj, const char* endpoint,
                                       std::initializer_list<std::span<const std::string_view>> accepted);

// Returns the error of a parse step that gives one.
#define SPW_TRY_FIELD(expr)                      \
  do {                                           \
    if (auto spw_err_ = (expr)) return spw_err_; \
  } while (0)

// An empty string or an absent value as null.
json nullable(const std::string& s);
json optional_json(const std::optional<double>& v);
// The "spillway" object of every response (SpillwayInfo), also in each entry
// of GET /v1/requests.
json spillway_json(const SpillwayInfo& s);
// OpenAI's usage object (responses, usage chunks, request records).
json usage_json(int32_t prompt, int32_t completion);
// An admission decision's verdicts, one per path: {"path","eligible","reason"}.
json verdicts_json(const admission::Decision& d);
// A catalogue model's residency unit (gateway/residency.h: one of its paths)
// for /v1/models and /v1/status: its name (the path) and model, state, pinned, draining, memory (all ledgers and by ledger),
// last use (Unix seconds or null), keep-alive and what is left of it (null
// while not counting), runs running and waiting, loads, evictions, the
// predicted and the last load time.
json resident_model_json(const gateway::ResidentModelInfo& r);

// Generated text is valid UTF-8 (Utf8Stream), but never let a stray byte throw.
std::string dump(const json& j);

}  // namespace spw::http::json_fields
