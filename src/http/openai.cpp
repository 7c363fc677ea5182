#include "http/openai.h"

#include "http/completion_prompt.h"
#include "http/json_fields.h"

#include "core/duration.h"
#include "core/failure.h"
#include "engine/generate.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>

namespace spw::http {

using namespace json_fields;

namespace {

// A cost limit's message (openai.h's kMax*Bytes): the limit and the size sent.
std::string over_limit(const std::string& what, size_t limit, size_t got) {
  return what + " may be at most " + std::to_string(limit) + " bytes, got " + std::to_string(got) + " bytes";
}

ApiError unsupported(std::string param, std::string message) {
  return bad(std::move(param), std::move(message), "unsupported_parameter");
}

// logit_bias: {"<token id>": bias in [-100, 100]}, at most kMaxLogitBias
// entries, into s.logit_bias sorted by id (one order for one request, so
// that its checkpoints are byte-identical whatever order the keys came in).
// The ids' upper bound is the vocabulary's (check_token_ids).
std::optional<ApiError> parse_logit_bias(const json& obj, SamplingFields& s) {
  auto lb = obj.find("logit_bias");
  if (lb == obj.end() || lb->is_null()) return std::nullopt;
  if (!lb->is_object()) return wrong_type("logit_bias", "an object mapping token ids to biases", *lb);
  if (lb->size() > kMaxLogitBias) {
    return bad("logit_bias", "'logit_bias' may hold at most " + std::to_string(kMaxLogitBias) + " entries, got " +
                                 std::to_string(lb->size()));
  }
  for (const auto& [key, value] : lb->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoull(key) > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return bad("logit_bias", "'logit_bias' keys must be token ids (decimal integers from 0 to 2147483647), got '" +
                                   input_excerpt(key) + "'");
    }
    if (!value.is_number()) {
      return bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " +
                                   std::string(value.type_name()) + " for token " + key,
                 "invalid_type");
    }
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100)) {
      return bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + json(b).dump() +
                                   " for token " + key);
    }
    s.logit_bias.push_back({static_cast<TokenId>(std::stoul(key)), static_cast<float>(b)});
  }
  std::sort(s.logit_bias.begin(), s.logit_bias.end(),
            [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  // "7" and "007" are two JSON keys but one token.
  const auto dup = std::adjacent_find(s.logit_bias.begin(), s.logit_bias.end(),
                                      [](const LogitBias& a, const LogitBias& b) { return a.id == b.id; });
  if (dup != s.logit_bias.end()) {
    return bad("logit_bias", "'logit_bias' lists token " + std::to_string(dup->id) + " twice (as two spellings)");
  }
  return std::nullopt;
}

// stop_token_ids (vLLM): an array of at most kMaxStopTokenIds token ids.
std::optional<ApiError> parse_stop_token_ids(const json& obj, SamplingFields& s) {
  auto it = obj.find("stop_token_ids");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_array()) return wrong_type("stop_token_ids", "an array of token ids", *it);
  if (it->size() > kMaxStopTokenIds) {
    return bad("stop_token_ids", "'stop_token_ids' may hold at most " + std::to_string(kMaxStopTokenIds) +
                                     " ids, got " + std::to_string(it->size()));
  }
  for (size_t k = 0; k < it->size(); ++k) {
    const json& e = (*it)[k];
    const std::string at = "stop_token_ids[" + std::to_string(k) + "]";
    if (!e.is_number_integer()) return wrong_type(at, "a token id (an integer)", e);
    const bool in_range = e.is_number_unsigned()
                              ? e.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
                              : e.get<int64_t>() >= 0;
    if (!in_range) return bad(at, "'" + at + "' must be a token id from 0 to 2147483647, got " + e.dump());
    s.stop_token_ids.push_back(static_cast<TokenId>(e.get<int64_t>()));
  }
  return std::nullopt;
}

// vLLM's names for what the engine does: repetition_penalty (llama.cpp's
// repeat_penalty, parsed before this), ignore_eos, min_tokens,
// stop_token_ids, and skip_special_tokens, which can only be true here.
std::optional<ApiError> parse_vllm_fields(const json& obj, SamplingFields& s) {
  std::optional<double> d;
  SPW_TRY_FIELD(get_number(obj, "repetition_penalty", d));
  if (d) {
    SPW_TRY_FIELD(in_range("repetition_penalty", *d, 0.0, 100.0, /*lo_open=*/true));
    const auto v = static_cast<float>(*d);
    if (s.repeat_penalty && *s.repeat_penalty != v) {
      return bad("repetition_penalty", "'repetition_penalty' (" + json(*d).dump() + ") and 'repeat_penalty' (" +
                                           json(*s.repeat_penalty).dump() +
                                           ") differ; they are the same penalty, give one of them");
    }
    s.repeat_penalty = v;
  }
  std::optional<bool> b;
  SPW_TRY_FIELD(get_bool(obj, "ignore_eos", b));
  s.ignore_eos = b.value_or(false);
  std::optional<int64_t> i;
  SPW_TRY_FIELD(get_int(obj, "min_tokens", i));
  if (i) {
    if (*i < 0) return bad("min_tokens", "'min_tokens' must be >= 0, got " + std::to_string(*i));
    if (s.max_tokens && *i > *s.max_tokens) {
      return bad("min_tokens", "'min_tokens' (" + std::to_string(*i) + ") must be <= max_tokens (" +
                                   std::to_string(*s.max_tokens) + ")");
    }
    s.min_tokens = static_cast<int32_t>(std::min<int64_t>(*i, std::numeric_limits<int32_t>::max()));
  }
  SPW_TRY_FIELD(parse_stop_token_ids(obj, s));
  b.reset();
  SPW_TRY_FIELD(get_bool(obj, "skip_special_tokens", b));
  if (b && !*b) {
    return unsupported("skip_special_tokens", "'skip_special_tokens': false is not supported: this server never "
                                              "writes special (control) tokens into the text, so only true (the "
                                              "default) or null is accepted");
  }
  return std::nullopt;
}

// seed: an integer a JSON number holds exactly (the response reports it
// back), negative ones as their two's complement.
// response_format (openai.h): text, json_object, or json_schema compiled
// here (grammar/json_schema.h) so that a schema outside the subset is a 400
// before anything is queued; the constraint's source goes to the engine.
std::optional<ApiError> parse_response_format(const json& obj, SamplingFields& s) {
  auto rf = obj.find("response_format");
  if (rf == obj.end() || rf->is_null()) return std::nullopt;
  if (!rf->is_object()) return wrong_type("response_format", "an object", *rf);
  auto t = rf->find("type");
  if (t == rf->end() || !t->is_string()) return bad("response_format.type", "'response_format.type' must be a string");
  const std::string type = t->get<std::string>();
  const auto only = [&](std::initializer_list<const char*> keys) -> std::optional<ApiError> {
    for (const auto& item : rf->items()) {
      // A named reference, not a structured binding: clang before 16 (the
      // fuzz build's) cannot capture a binding in the lambda below.
      const std::string& key = item.key();
      if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return key == k; }) == keys.end()) {
        return bad("response_format." + input_excerpt(key, kMaxParamBytes / 2),
                   "Unrecognized request argument supplied: response_format." + input_excerpt(key), "unknown_parameter");
      }
    }
    return std::nullopt;
  };
  grammar::ConstraintSpec spec;
  if (type == "text") {
    SPW_TRY_FIELD(only({"type"}));
    return std::nullopt;
  } else if (type == "json_object") {
    SPW_TRY_FIELD(only({"type"}));
    spec.kind = grammar::ConstraintKind::kJsonObject;
  } else if (type == "json_schema") {
    SPW_TRY_FIELD(only({"type", "json_schema"}));
    auto js = rf->find("json_schema");
    if (js == rf->end() || !js->is_object()) {
      return bad("response_format.json_schema", "'response_format.json_schema' must be an object with name and schema");
    }
    for (const auto& [key, value] : js->items()) {
      if (key != "name" && key != "description" && key != "schema" && key != "strict") {
        return bad("response_format.json_schema." + input_excerpt(key, kMaxParamBytes / 2),
                   "Unrecognized request argument supplied: response_format.json_schema." + input_excerpt(key) +
                       " (json_schema accepts: name, description, schema, strict)",
                   "unknown_parameter");
      }
    }
    auto name = js->find("name");
    if (name == js->end() || !name->is_string() || name->get<std::string>().empty()) {
      return bad("response_format.json_schema.name", "'response_format.json_schema.name' must be a non-empty string");
    }
    auto strict = js->find("strict");
    if (strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
      return wrong_type("response_format.json_schema.strict", "a boolean", *strict);
    }
    auto schema = js->find("schema");
    // No schema: any JSON value (OpenAI's field is optional).
    spec.schema = schema == js->end() || schema->is_null() ? "{}" : schema->dump(-1, ' ', false, json::error_handler_t::replace);
    spec.kind = grammar::ConstraintKind::kJsonSchema;
  } else {
    return bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got '" +
                                           input_excerpt(type) + "'");
  }
  if (Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_constraint(spec); !g.ok()) {
    return bad("response_format", g.status().message());
  }
  // Both would hold the end back where nothing may follow the document.
  if (s.ignore_eos) return bad("ignore_eos", "'ignore_eos' cannot be combined with a JSON response_format");
  if (s.min_tokens.value_or(0) > 0) {
    return bad("min_tokens", "'min_tokens' cannot be combined with a JSON response_format (the document may be "
                             "complete sooner, and nothing may follow it)");
  }
  s.constraint = std::move(spec);
  return std::nullopt;
}

std::optional<ApiError> parse_seed(const json& obj, SamplingFields& s) {
  auto it = obj.find("seed");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return wrong_type("seed", "an integer", *it);
  constexpr int64_t kMax = (int64_t{1} << 53) - 1;
  const bool in_range = it->is_number_unsigned() ? it->get<uint64_t>() <= static_cast<uint64_t>(kMax)
                                                 : it->get<int64_t>() >= -kMax && it->get<int64_t>() <= kMax;
  if (!in_range) {
    return bad("seed", "'seed' must be an integer in [-9007199254740991, 9007199254740991] (-(2^53 - 1) to "
                       "2^53 - 1, exact in a JSON number), got " + it->dump());
  }
  s.seed = it->is_number_unsigned() ? it->get<uint64_t>()
                                    : static_cast<uint64_t>(it->get<int64_t>());  // two's complement, as given
  return std::nullopt;
}

// logprobs: /v1/completions' number of alternatives in [0, 5] (false: none,
// as before it was implemented); chat's boolean (its top_logprobs, in
// parse_chat_only, sets the number).
std::optional<ApiError> parse_logprobs(const json& obj, bool chat, SamplingFields& s) {
  auto lp = obj.find("logprobs");
  if (lp == obj.end() || lp->is_null()) return std::nullopt;
  if (chat) {
    if (!lp->is_boolean()) return wrong_type("logprobs", "a boolean", *lp);
    if (lp->get<bool>()) s.logprobs = 0;
    return std::nullopt;
  }
  if (lp->is_boolean() && !lp->get<bool>()) return std::nullopt;
  std::optional<int64_t> n;
  if (lp->is_boolean() || get_int(obj, "logprobs", n)) {
    return wrong_type("logprobs", "an integer in [0, 5] (the alternatives per token)", *lp);
  }
  if (*n < 0 || *n > 5) return bad("logprobs", "'logprobs' must be in [0, 5], got " + std::to_string(*n));
  s.logprobs = static_cast<int32_t>(*n);
  return std::nullopt;
}

// stop: a string or an array of strings, within the cost limits (openai.h:
// kMaxStop, kMaxStopBytes, kMaxStopTotalBytes).
std::optional<ApiError> parse_stop(const json& obj, SamplingFields& s) {
  auto stop = obj.find("stop");
  if (stop != obj.end() && !stop->is_null()) {
    if (stop->is_string()) {
      const size_t n = stop->get_ref<const std::string&>().size();
      if (n > kMaxStopBytes) return bad("stop", over_limit("'stop'", kMaxStopBytes, n));
      s.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStop) {
        return bad("stop", "'stop' may hold at most " + std::to_string(kMaxStop) + " strings, got " +
                               std::to_string(stop->size()));
      }
      size_t total = 0;
      for (size_t k = 0; k < stop->size(); ++k) {
        const json& e = (*stop)[k];
        const std::string at = "stop[" + std::to_string(k) + "]";
        if (!e.is_string()) return wrong_type(at, "a string", e);
        const size_t n = e.get_ref<const std::string&>().size();
        if (n > kMaxStopBytes) return bad(at, over_limit("'" + at + "'", kMaxStopBytes, n));
        total += n;
      }
      if (total > kMaxStopTotalBytes) {
        return bad("stop", over_limit("the 'stop' strings together", kMaxStopTotalBytes, total));
      }
      for (const json& e : *stop) s.stop.push_back(e.get<std::string>());
    } else {
      return wrong_type("stop", "a string or an array of strings", *stop);
    }
  }
  return std::nullopt;
}

// stream, and stream_options ({"include_usage": bool}; other keys unknown).
std::optional<ApiError> parse_stream(const json& obj, SamplingFields& s) {
  std::optional<bool> b;
  SPW_TRY_FIELD(get_bool(obj, "stream", b));
  s.stream = b.value_or(false);
  auto so = obj.find("stream_options");
  if (so != obj.end() && !so->is_null()) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    for (const auto& [key, value] : so->items()) {
      if (key != "include_usage") {
        return bad(input_excerpt("stream_options." + key, kMaxParamBytes / 2),
                   "Unrecognized request argument supplied: stream_options." + input_excerpt(key) +
                       " (stream_options accepts: include_usage)",
                   "unknown_parameter");
      }
    }
    std::optional<bool> inc;
    if (auto e = get_bool(*so, "include_usage", inc)) {
      e->param = "stream_options.include_usage";
      return e;
    }
    s.include_usage = inc.value_or(false);
  }
  return std::nullopt;
}

// Fields common to /v1/completions and /v1/chat/completions.
std::optional<ApiError> parse_sampling(const json& obj, bool chat, SamplingFields& s, std::string& model) {
  std::optional<std::string> model_name;
  SPW_TRY_FIELD(get_string(obj, "model", model_name));
  if (model_name) model = *model_name;
  if (auto it = obj.find("keep_alive"); it != obj.end() && !it->is_null()) {
    Result<double> ka = it->is_number() ? Result<double>(it->get<double>())
                        : it->is_string() ? parse_duration_s(it->get<std::string>())
                                          : Result<double>(Status::invalid_argument("expected a number of seconds or "
                                                                                    "a duration string, got " +
                                                                                    std::string(it->type_name())));
    if (ka.ok() && !std::isfinite(*ka)) ka = Status::invalid_argument("not a finite number");
    if (!ka.ok()) return bad("keep_alive", "'keep_alive': " + ka.status().message());
    s.keep_alive_s = *ka < 0 ? -1.0 : std::min(*ka, kMaxDurationS);
  }

  // max_completion_tokens is OpenAI's newer name for max_tokens, on both
  // endpoints here. Two different limits in one request have no honest
  // reading: refuse rather than pick one.
  std::optional<int64_t> max_tokens, mct;
  SPW_TRY_FIELD(get_int(obj, "max_tokens", max_tokens));
  if (max_tokens && *max_tokens < 1) {
    return bad("max_tokens", "'max_tokens' must be >= 1, got " + std::to_string(*max_tokens));
  }
  SPW_TRY_FIELD(get_int(obj, "max_completion_tokens", mct));
  if (mct && *mct < 1) {
    return bad("max_completion_tokens", "'max_completion_tokens' must be >= 1, got " + std::to_string(*mct));
  }
  if (max_tokens && mct && *max_tokens != *mct) {
    return bad("max_completion_tokens", "'max_completion_tokens' (" + std::to_string(*mct) + ") and 'max_tokens' (" +
                                            std::to_string(*max_tokens) +
                                            ") differ; they are the same limit, give one of them");
  }
  if (mct) max_tokens = mct;
  if (max_tokens) {
    s.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, std::numeric_limits<int32_t>::max()));
  }

  std::optional<double> d;
  SPW_TRY_FIELD(get_number(obj, "temperature", d));
  if (d) {
    SPW_TRY_FIELD(in_range("temperature", *d, 0.0, 2.0));
    s.temperature = static_cast<float>(*d);
  }
  d.reset();
  SPW_TRY_FIELD(get_number(obj, "top_p", d));
  if (d) {
    SPW_TRY_FIELD(in_range("top_p", *d, 0.0, 1.0));
    s.top_p = static_cast<float>(*d);
  }
  d.reset();
  SPW_TRY_FIELD(get_number(obj, "min_p", d));
  if (d) {
    SPW_TRY_FIELD(in_range("min_p", *d, 0.0, 1.0));
    s.min_p = static_cast<float>(*d);
  }
  d.reset();
  SPW_TRY_FIELD(get_number(obj, "repeat_penalty", d));
  if (d) {
    SPW_TRY_FIELD(in_range("repeat_penalty", *d, 0.0, 100.0, /*lo_open=*/true));
    s.repeat_penalty = static_cast<float>(*d);
  }
  d.reset();
  SPW_TRY_FIELD(get_number(obj, "frequency_penalty", d));
  if (d) {
    SPW_TRY_FIELD(in_range("frequency_penalty", *d, -2.0, 2.0));
    s.frequency_penalty = static_cast<float>(*d);
  }
  d.reset();
  SPW_TRY_FIELD(get_number(obj, "presence_penalty", d));
  if (d) {
    SPW_TRY_FIELD(in_range("presence_penalty", *d, -2.0, 2.0));
    s.presence_penalty = static_cast<float>(*d);
  }
  SPW_TRY_FIELD(parse_logit_bias(obj, s));

  std::optional<int64_t> i;
  SPW_TRY_FIELD(get_int(obj, "top_k", i));
  if (i) {
    if (*i < 0) return bad("top_k", "'top_k' must be >= 0 (0 disables), got " + std::to_string(*i));
    s.top_k = static_cast<int32_t>(std::min<int64_t>(*i, std::numeric_limits<int32_t>::max()));
  }
  i.reset();
  SPW_TRY_FIELD(get_int(obj, "repeat_last_n", i));
  if (i) {
    if (*i < 0) return bad("repeat_last_n", "'repeat_last_n' must be >= 0, got " + std::to_string(*i));
    s.repeat_last_n = static_cast<int32_t>(std::min<int64_t>(*i, std::numeric_limits<int32_t>::max()));
  }
  i.reset();
  SPW_TRY_FIELD(parse_seed(obj, s));
  i.reset();
  SPW_TRY_FIELD(get_int(obj, "n", i));
  if (i) {
    if (*i < 1 || *i > kMaxChoices) {
      return bad("n", "'n' must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(*i));
    }
    s.n = static_cast<int32_t>(*i);
  }
  i.reset();
  SPW_TRY_FIELD(get_int(obj, "best_of", i));
  if (i) {
    if (*i < s.n) {
      return bad("best_of", "'best_of' must be >= n (" + std::to_string(s.n) + "), got " + std::to_string(*i));
    }
    if (*i > s.n) {
      return bad("best_of",
                 "best_of > n is not supported (generating best_of choices and returning the n of highest mean "
                 "log-probability); got best_of " + std::to_string(*i) + " with n " + std::to_string(s.n) +
                     ": send best_of = n, or n = " + std::to_string(*i) + " and pick on the client",
                 "unsupported_value");
    }
  }
  SPW_TRY_FIELD(parse_vllm_fields(obj, s));

  SPW_TRY_FIELD(parse_stop(obj, s));
  SPW_TRY_FIELD(parse_stream(obj, s));

  // Features this server does not implement: refuse rather than ignore.
  // (Chat's tools are read by parse_chat_tools.)
  auto tools = obj.find("tools");
  if (!chat && tools != obj.end() && !tools->is_null() && !(tools->is_array() && tools->empty())) {
    return bad("tools", "tools are for /v1/chat/completions (a completion has no messages to call them from)",
               "unsupported_parameter");
  }
  SPW_TRY_FIELD(parse_response_format(obj, s));
  SPW_TRY_FIELD(parse_logprobs(obj, chat, s));

  // Metadata in OpenAI's API: checked for type, no effect on the output.
  std::optional<std::string> text;
  SPW_TRY_FIELD(get_string(obj, "user", text));
  auto meta = obj.find("metadata");
  if (meta != obj.end() && !meta->is_null() && !meta->is_object()) return wrong_type("metadata", "an object", *meta);
  std::optional<bool> store;
  SPW_TRY_FIELD(get_bool(obj, "store", store));
  if (store.value_or(false)) {
    return unsupported("store", "'store': true is not supported: this server keeps no completions for later "
                                "retrieval (send false or null)");
  }
  text.reset();
  SPW_TRY_FIELD(get_string(obj, "service_tier", text));
  if (text && *text != "auto" && *text != "default") {
    return unsupported("service_tier", "'service_tier' must be \"auto\", \"default\" or null (this server has one "
                                       "tier), got '" + input_excerpt(*text) + "'");
  }
  return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls (see ChatRequest). The tools are
// read again from the body with their keys in the client's order: the
// templates render them as the client wrote them.
std::optional<ApiError> parse_chat_tools(std::string_view body, const json& obj, ChatRequest& out) {
  bool forced = false;
  bool none = false;
  auto tc = obj.find("tool_choice");
  if (tc != obj.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v == "required") forced = true;
      else if (v == "none") none = true;
      else if (v != "auto") {
        return bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                                  "\"function\", ...}, got '" + input_excerpt(v) + "'");
      }
    } else if (tc->is_object()) {
      forced = true;
    } else {
      return wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if (forced) {
    return unsupported("tool_choice", "'tool_choice' that forces a call (\"required\" or a named function) needs "
                                      "constrained decoding of the call, which this server does not do for tools yet "
                                      "(response_format is constrained); send \"auto\" or \"none\"");
  }
  std::optional<bool> parallel;
  SPW_TRY_FIELD(get_bool(obj, "parallel_tool_calls", parallel));
  out.parallel_tool_calls = parallel.value_or(true);
  auto tools = obj.find("tools");
  if (tools == obj.end() || tools->is_null()) return std::nullopt;
  if (!tools->is_array()) return wrong_type("tools", "an array", *tools);
  if (tools->size() > 128) return bad("tools", "'tools' may list at most 128 tools, got " + std::to_string(tools->size()));
  // Sized before the body is parsed again below and each tool rendered twice.
  const size_t tools_bytes = tools->dump(-1, ' ', false, json::error_handler_t::replace).size();
  if (tools_bytes > kMaxToolsBytes) {
    return bad("tools", over_limit("'tools' (as compact JSON)", kMaxToolsBytes, tools_bytes));
  }
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body, nullptr, false);
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return wrong_type(at, "an object", t);
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function") {
      return bad(at + ".type", "'" + at + ".type' must be \"function\"");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return bad(at + ".function", "'" + at + ".function' must be an object");
    auto name = fn->find("name");
    const std::string nat = at + ".function.name";
    if (name == fn->end() || !name->is_string()) return bad(nat, "'" + nat + "' is required and must be a string");
    const std::string n = name->get<std::string>();
    if (n.empty() || n.size() > 64 || !std::all_of(n.begin(), n.end(), [](char ch) {
          return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
        })) {
      return bad(nat, "'" + nat + "' must be 1-64 letters, digits, '_' or '-', got '" + input_excerpt(n) + "'");
    }
    for (const ChatTool& seen : out.tools) {
      if (seen.name == n) return bad(nat, "'" + nat + "': two tools are named '" + n + "'");
    }
    auto desc = fn->find("description");
    if (desc != fn->end() && !desc->is_string()) return wrong_type(at + ".function.description", "a string", *desc);
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_object()) {
      return wrong_type(at + ".function.parameters", "an object (a JSON Schema)", *params);
    }
    auto strict = fn->find("strict");
    if (strict != fn->end() && !strict->is_boolean() && !strict->is_null()) {
      return wrong_type(at + ".function.strict", "a boolean", *strict);
    }
    const std::string text = ordered.at("tools").at(i).dump();
    ChatTool ct;
    ct.name = n;
    ct.json = tojson(text).value();
    ct.json_indent4 = tojson(text, 4).value();
    for (const auto& [key, val] : ordered.at("tools").at(i).at("function").items()) {
      ChatTool::Field f;
      f.key = key;
      f.is_string = val.is_string();
      f.text = f.is_string ? val.get<std::string>() : tojson(val.dump()).value();
      ct.function_fields.push_back(std::move(f));
    }
    if (!none) out.tools.push_back(std::move(ct));
  }
  return std::nullopt;
}

// One assistant message's tool_calls (ChatRequest); `at` names the message.
std::optional<ApiError> parse_message_tool_calls(const json& calls, const std::string& at, ChatMessage& cm) {
  if (!calls.is_array()) return wrong_type(at + ".tool_calls", "an array", calls);
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string cat = at + ".tool_calls[" + std::to_string(j) + "]";
    if (!c.is_object()) return wrong_type(cat, "an object", c);
    ChatToolCall call;
    auto id = c.find("id");
    if (id != c.end() && !id->is_null()) {
      if (!id->is_string()) return wrong_type(cat + ".id", "a string", *id);
      call.id = id->get<std::string>();
    }
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) return bad(cat + ".function", "'" + cat + ".function' must be an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return bad(cat + ".function.name", "'" + cat + ".function.name' must be a non-empty string");
    }
    call.name = name->get<std::string>();
    auto args = fn->find("arguments");
    const std::string aat = cat + ".function.arguments";
    if (args == fn->end() || !args->is_string()) return bad(aat, "'" + aat + "' must be a string (a JSON object)");
    const std::string& a = args->get_ref<const std::string&>();
    if (!json::parse(a, nullptr, false).is_object()) {
      return bad(aat, "'" + aat + "' must be a JSON object as a string, got '" + input_excerpt(a) + "'");
    }
    call.arguments_json = tojson(a).value();
    cm.tool_calls.push_back(std::move(call));
  }
  return std::nullopt;
}

// Fields only the chat endpoint has besides the tools. top_logprobs after
// parse_sampling read logprobs into `s`.
std::optional<ApiError> parse_chat_only(const json& obj, SamplingFields& s) {
  std::optional<int64_t> top;
  SPW_TRY_FIELD(get_int(obj, "top_logprobs", top));
  if (top && (*top < 0 || *top > 20)) {
    return bad("top_logprobs", "'top_logprobs' must be in [0, 20], got " + std::to_string(*top));
  }
  if (top && !s.logprobs) {
    return bad("top_logprobs", "'top_logprobs' needs \"logprobs\": true (it is the number of alternatives listed "
                               "beside each token's log-probability)");
  }
  if (top) s.logprobs = static_cast<int32_t>(*top);
  return std::nullopt;
}

}  // namespace

std::string input_excerpt(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Do not split a UTF-8 character (the cut byte would start a new one).
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " bytes)";
}

ApiError api_error_from_status(const Status& s) {
  const FailureClass fc = classify(s);
  ApiError e;
  e.http_status = fc.http_status;
  e.type = std::string(fc.type);
  e.code = std::string(fc.code);
  e.param = s.field();
  // An internal error keeps its code name: it is a bug report.
  e.message = fc.http_status == 500 ? s.to_string() : s.message();
  return e;
}

std::optional<ApiError> check_token_ids(const SamplingFields& s, int32_t n_vocab) {
  const auto past = [n_vocab](TokenId id) { return id >= n_vocab; };
  const std::string size = "the model's vocabulary has " + std::to_string(n_vocab) + " tokens (ids 0 to " +
                           std::to_string(n_vocab - 1) + ")";
  for (const LogitBias& b : s.logit_bias) {
    if (past(b.id)) return bad("logit_bias", "'logit_bias' names token " + std::to_string(b.id) + ", but " + size);
  }
  for (size_t k = 0; k < s.stop_token_ids.size(); ++k) {
    if (past(s.stop_token_ids[k])) {
      return bad("stop_token_ids[" + std::to_string(k) + "]",
                 "'stop_token_ids' names token " + std::to_string(s.stop_token_ids[k]) + ", but " + size);
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(std::string_view body, CompletionRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  SPW_TRY_FIELD(refuse_unknown(obj, "/v1/completions", {kCompletionOnlyFields, kSharedGenerationFields}));
  auto p = obj.find("prompt");
  if (p == obj.end() || p->is_null()) return bad("prompt", "'prompt' is required", "missing_required_parameter");
  SPW_TRY_FIELD(parse_completion_prompt(*p, out));
  std::optional<bool> echo;
  SPW_TRY_FIELD(get_bool(obj, "echo", echo));
  out.echo = echo.value_or(false);
  std::optional<std::string> suffix;
  SPW_TRY_FIELD(get_string(obj, "suffix", suffix));
  if (suffix && !suffix->empty()) return bad("suffix", "suffix is not supported by this server", "unsupported_parameter");
  SPW_TRY_FIELD(parse_sampling(obj, /*chat=*/false, out.sampling, out.model));
  if (out.echo && out.sampling.n > 1) {
    return bad("echo", "echo with n > 1 is not supported (n = " + std::to_string(out.sampling.n) + ")",
               "unsupported_value");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(std::string_view body, ChatRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  SPW_TRY_FIELD(refuse_unknown(obj, "/v1/chat/completions", {kChatOnlyFields, kSharedGenerationFields}));
  auto m = obj.find("messages");
  if (m == obj.end() || m->is_null()) {
    return bad("messages", "'messages' is required", "missing_required_parameter");
  }
  if (!m->is_array()) return wrong_type("messages", "an array", *m);
  if (m->empty()) return bad("messages", "'messages' must not be empty");
  size_t prompt_bytes = 0;  // content and tool-call arguments as sent: the text the template renders
  for (size_t k = 0; k < m->size(); ++k) {
    const json& msg = (*m)[k];
    const std::string at = "messages[" + std::to_string(k) + "]";
    if (!msg.is_object()) return wrong_type(at, "an object", msg);
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) {
      return bad(at + ".role", "'" + at + ".role' is required and must be a string", "invalid_type");
    }
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for it
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool") {
      return bad(at + ".role", "'" + at + ".role' must be one of system, user, assistant, tool; got '" +
                                   input_excerpt(cm.role) + "'");
    }
    auto calls = msg.find("tool_calls");
    if (calls != msg.end() && !calls->is_null()) {
      if (cm.role != "assistant") return bad(at + ".tool_calls", "only an assistant message has tool_calls");
      SPW_TRY_FIELD(parse_message_tool_calls(*calls, at, cm));
      for (const json& c : *calls) {
        prompt_bytes += c.at("function").at("arguments").get_ref<const std::string&>().size();
      }
    }
    if (cm.role == "tool") {
      auto id = msg.find("tool_call_id");
      if (id == msg.end() || !id->is_string() || id->get_ref<const std::string&>().empty()) {
        return bad(at + ".tool_call_id", "'" + at + ".tool_call_id' is required for a tool message (the call it answers)",
                   "missing_required_parameter");
      }
      cm.tool_call_id = id->get<std::string>();
    }
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      if (cm.role != "assistant") return bad(at + ".content", "'" + at + ".content' is required", "missing_required_parameter");
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t q = 0; q < content->size(); ++q) {
        const json& part = (*content)[q];
        const std::string pat = at + ".content[" + std::to_string(q) + "]";
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text") {
          return bad(pat, "'" + pat + "' must be a {\"type\":\"text\",\"text\":...} part (only text is supported)",
                     "invalid_type");
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) return bad(pat + ".text", "'" + pat + ".text' must be a string", "invalid_type");
        cm.content += text->get<std::string>();
      }
    } else {
      return wrong_type(at + ".content", "a string or an array of text parts", *content);
    }
    prompt_bytes += cm.content.size();
    out.messages.push_back(std::move(cm));
  }
  if (prompt_bytes > kMaxPromptBytes) {
    return bad("messages", over_limit("the text of 'messages'", kMaxPromptBytes, prompt_bytes));
  }
  SPW_TRY_FIELD(parse_sampling(obj, /*chat=*/true, out.sampling, out.model));
  SPW_TRY_FIELD(parse_chat_only(obj, out.sampling));
  SPW_TRY_FIELD(parse_chat_tools(body, obj, out));
  if (!out.tools.empty() && out.sampling.n > 1) {
    return bad("n", "n > 1 with tools is not supported (n = " + std::to_string(out.sampling.n) + ")",
               "unsupported_value");
  }
  if (out.sampling.constraint.active() && !out.tools.empty()) {
    return bad("response_format", "a JSON response_format cannot be combined with tools: the tool-call markup of "
                                  "the template is not JSON (send tools or a JSON response_format)");
  }
  return std::nullopt;
}

int64_t count_chars(std::string_view utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

namespace {

// A token's text: its bytes with whatever is not UTF-8 on its own (part of a
// character) as U+FFFD, so that the JSON string is valid.
std::string token_text(const std::string& piece) {
  Utf8Stream u;
  std::string out = u.push(piece);
  out += u.flush();
  return out;
}

// JSON has no infinity: a token the logits rule out gets OpenAI's -9999.
double wire_logprob(double lp) { return std::isfinite(lp) ? lp : -9999.0; }

json bytes_json(const std::string& piece) {
  json a = json::array();
  for (char c : piece) a.push_back(static_cast<unsigned char>(c));
  return a;
}

// /v1/completions: {"tokens","token_logprobs","top_logprobs","text_offset"}.
json completion_logprobs_json(const ChoiceLogprobs* lp) {
  if (lp == nullptr || lp->entries.empty()) return nullptr;
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  int64_t offset = lp->text_offset;
  for (const TokenLogprobs& e : lp->entries) {
    tokens.push_back(token_text(e.token.piece));
    if (std::isnan(e.token.logprob)) {  // an echoed prompt's first token: nothing predicts it
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      offsets.push_back(offset);
      offset += count_chars(e.token.piece);
      continue;
    }
    token_logprobs.push_back(wire_logprob(e.token.logprob));
    // The most likely first; a text already there keeps its (higher) value,
    // and the chosen token is always among the keys.
    json alts = json::object();
    for (const PieceLogprob& a : e.top) {
      const std::string t = token_text(a.piece);
      if (!alts.contains(t)) alts[t] = wire_logprob(a.logprob);
    }
    const std::string chosen = token_text(e.token.piece);
    if (!alts.contains(chosen)) alts[chosen] = wire_logprob(e.token.logprob);
    top.push_back(std::move(alts));
    offsets.push_back(offset);
    offset += count_chars(e.token.piece);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

// /v1/chat/completions: {"content":[{"token","logprob","bytes","top_logprobs"}],"refusal":null}.
json chat_logprobs_json(const ChoiceLogprobs* lp) {
  if (lp == nullptr || lp->entries.empty()) return nullptr;
  json content = json::array();
  for (const TokenLogprobs& e : lp->entries) {
    json alts = json::array();
    for (const PieceLogprob& a : e.top) {
      alts.push_back(
          {{"token", token_text(a.piece)}, {"logprob", wire_logprob(a.logprob)}, {"bytes", bytes_json(a.piece)}});
    }
    content.push_back({{"token", token_text(e.token.piece)},
                       {"logprob", wire_logprob(e.token.logprob)},
                       {"bytes", bytes_json(e.token.piece)},
                       {"top_logprobs", std::move(alts)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// A whole response that asked for log-probabilities has the object even when
// no token was listed (an empty list), so that a client can tell "asked,
// nothing generated" from "not asked".
json completion_logprobs_whole(const std::optional<ChoiceLogprobs>& lp) {
  if (!lp) return nullptr;
  if (lp->entries.empty()) {
    return {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  }
  return completion_logprobs_json(&*lp);
}
json chat_logprobs_whole(const std::optional<ChoiceLogprobs>& lp) {
  if (!lp) return nullptr;
  if (lp->entries.empty()) return {{"content", json::array()}, {"refusal", nullptr}};
  return chat_logprobs_json(&*lp);
}

}  // namespace

std::string render_completion(const CompletionResult& r) {
  json j;
  j["id"] = r.id;
  j["object"] = "text_completion";
  j["created"] = r.created;
  j["model"] = r.model;
  j["choices"] = json::array({{{"text", r.text}, {"index", 0}, {"logprobs", completion_logprobs_whole(r.logprobs)},
                               {"finish_reason", nullable(r.finish_reason)}}});
  for (size_t i = 0; i < r.more_choices.size(); ++i) {
    const CompletionResult::Choice& c = r.more_choices[i];
    j["choices"].push_back({{"text", c.text},
                            {"index", i + 1},
                            {"logprobs", completion_logprobs_whole(c.logprobs)},
                            {"finish_reason", nullable(c.finish_reason)}});
  }
  j["usage"] = usage_json(r.prompt_tokens, r.completion_tokens);
  j["spillway"] = spillway_json(r.spillway);
  return dump(j);
}

std::string render_chat_completion(const CompletionResult& r) {
  json j;
  j["id"] = r.id;
  j["object"] = "chat.completion";
  j["created"] = r.created;
  j["model"] = r.model;
  json message = {{"role", "assistant"}, {"content", r.text}};
  if (!r.tool_calls.empty()) {
    if (r.text.empty()) message["content"] = nullptr;
    json calls = json::array();
    for (const ToolCallOut& c : r.tool_calls) {
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["tool_calls"] = calls;
  }
  j["choices"] = json::array({{{"index", 0},
                               {"message", message},
                               {"logprobs", chat_logprobs_whole(r.logprobs)},
                               {"finish_reason", nullable(r.finish_reason)}}});
  for (size_t i = 0; i < r.more_choices.size(); ++i) {
    const CompletionResult::Choice& c = r.more_choices[i];
    j["choices"].push_back({{"index", i + 1},
                            {"message", {{"role", "assistant"}, {"content", c.text}}},
                            {"logprobs", chat_logprobs_whole(c.logprobs)},
                            {"finish_reason", nullable(c.finish_reason)}});
  }
  j["usage"] = usage_json(r.prompt_tokens, r.completion_tokens);
  j["spillway"] = spillway_json(r.spillway);
  return dump(j);
}

namespace {

// The envelope both stream chunk kinds share; `choice` is the one choice of a
// content chunk (a usage-only chunk has none).
std::string render_chunk(const ChunkFields& c, const char* object, const json& choice) {
  json j;
  j["id"] = c.id;
  j["object"] = object;
  j["created"] = c.created;
  j["model"] = c.model;
  if (c.usage_only) {
    j["choices"] = json::array();
    j["usage"] = usage_json(c.prompt_tokens, c.completion_tokens);
  } else {
    j["choices"] = json::array({choice});
  }
  if (c.spillway) j["spillway"] = spillway_json(*c.spillway);
  return dump(j);
}

}  // namespace

std::string render_completion_chunk(const ChunkFields& c) {
  return render_chunk(c, "text_completion",
                      {{"text", c.text}, {"index", c.index}, {"logprobs", completion_logprobs_json(c.logprobs)},
                       {"finish_reason", nullable(c.finish_reason)}});
}

std::string render_chat_chunk(const ChunkFields& c) {
  json delta = json::object();
  if (c.role_delta) delta["role"] = "assistant";
  if (c.role_delta || !c.text.empty()) delta["content"] = c.text;
  if (c.tool_call) {
    const ToolCallOut& t = *c.tool_call;
    delta["tool_calls"] = json::array({{{"index", c.tool_call_index},
                                        {"id", t.id},
                                        {"type", "function"},
                                        {"function", {{"name", t.name}, {"arguments", t.arguments}}}}});
  }
  return render_chunk(c, "chat.completion.chunk",
                      {{"index", c.index}, {"delta", delta}, {"logprobs", chat_logprobs_json(c.logprobs)},
                       {"finish_reason", nullable(c.finish_reason)}});
}

namespace {

// Bounded whatever built the error (a message may carry text from deeper
// layers, or a path from the request line): an error body stays small.
json error_json(const ApiError& e) {
  json j = {{"message", input_excerpt(e.message, kMaxErrorMessageBytes)},
            {"type", e.type},
            {"param", nullable(input_excerpt(e.param, kMaxParamBytes))},
            {"code", nullable(e.code)}};
  if (e.request_id) {
    j["request_id"] = *e.request_id;
    j["resume_url"] = "/v1/requests/" + std::to_string(*e.request_id) + "/resume";
  }
  return j;
}

}  // namespace

std::string render_error(const ApiError& e, const std::string& model) {
  json j;
  j["error"] = error_json(e);
  if (!model.empty()) j["spillway"] = {{"model", model}, {"placement", nullptr}};
  return dump(j);
}

// Here, not in spillway_api.cpp: it is what the OpenAI routes answer when
// admission refuses, an OpenAI error body (error_json, as render_error) that
// OpenAI clients read as such; its "spillway" object is the same kind of
// extension as every response's, built from the decision's verdicts
// (json_fields.h, shared with spillway_api.cpp's decision renderings).
std::string render_refusal(const ApiError& e, const std::string& model, const admission::Decision& d) {
  json j = {{"error", error_json(e)}};
  json s = {{"model", model.empty() ? json(nullptr) : json(model)}, {"placement", nullptr}, {"decision", "reject"},
            {"reason", d.reason}, {"paths", verdicts_json(d)}};
  if (d.http_status == 429) s["retry_after_s"] = d.retry_after_s;
  j["spillway"] = s;
  return dump(j);
}

std::string render_queued_chunk(const std::string& id, int64_t created, const std::string& model, bool chat,
                                const std::string& path, int32_t position,
                                std::optional<double> estimated_delay_ms) {
  json j = {{"id", id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", model},
            {"choices", json::array()},
            {"spillway",
             {{"state", "queued"}, {"path", path}, {"queue_position", position}, {"estimated_delay_ms", optional_json(estimated_delay_ms)}}}};
  return dump(j);
}

bool is_chat_body(std::string_view body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("messages");
}

std::string sse_data(std::string_view payload) {
  std::string s;
  s.reserve(payload.size() + 8);
  s += "data: ";
  s += payload;
  s += "\n\n";
  return s;
}

}  // namespace spw::http
