// The JSON helpers openai.cpp and spillway_api.cpp share (json_fields.h):
// the strict body parser and its UTF-8 and syntax checks, the field readers,
// and the fragments both kinds of body render.
#include "http/json_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace spw::http::json_fields {
namespace {

// The offset of the first byte of `s` that does not start a well-formed UTF-8
// sequence (RFC 3629: no overlong forms, no surrogates, nothing past
// U+10FFFF), or npos.
size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      return i;  // a continuation byte, C0/C1 (overlong) or F5..FF
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

// nlohmann's parse_error text without the client's bytes: its what() is
// "[json.exception.parse_error.101] parse error at line L, column C: syntax
// error while parsing X - <constant lexer message>; last read: '<the last
// token, however long>'; expected Y". Only the part before "; last read"
// is ours to repeat (the rest quotes the input: a 52 MB string token came
// back whole in the error body).
std::string syntax_error_text(const char* what) {
  std::string_view w(what);
  const size_t start = w.find("syntax error");
  if (start == std::string_view::npos) return "syntax error";
  w.remove_prefix(start);
  if (const size_t cut = w.find("; last read"); cut != std::string_view::npos) w = w.substr(0, cut);
  return std::string(w.substr(0, 160));
}

// The bytes around a parse error, for the message (a short excerpt only).
std::string near(std::string_view body, size_t offset) {
  if (offset >= body.size()) return "at the end of the body";
  size_t from = offset > 16 ? offset - 16 : 0;
  // Start on a character boundary (the body is valid UTF-8 by now).
  while (from > 0 && (static_cast<unsigned char>(body[from]) & 0xC0) == 0x80) --from;
  std::string_view around = body.substr(from, 32);
  size_t end = around.size();
  if (from + end < body.size()) {
    while (end > 0 && (static_cast<unsigned char>(around[end]) & 0xC0) == 0x80) --end;
  }
  return "near '" + std::string(around.substr(0, end)) + "'";
}

// Accepts every event: with strict=false, sax_parse() then says whether the
// body starts with one complete JSON value (whatever follows it).
struct AcceptAll {
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const json::string_t&) { return true; }
  bool string(json::string_t&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(size_t) { return true; }
  bool key(json::string_t&) { return true; }
  bool end_object() { return true; }
  bool start_array(size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

bool starts_with_json_value(std::string_view body) {
  AcceptAll sax;
  try {
    return json::sax_parse(body.begin(), body.end(), &sax, json::input_format_t::json, /*strict=*/false);
  } catch (const json::exception&) {
    return false;
  }
}

ApiError invalid_json(std::string what) { return bad("", "request body is not valid JSON: " + what, "invalid_json"); }

json limits_json(const serve::AppliedLimits& l) {
  json j;
  j["n_ctx"] = l.n_ctx;
  j["prompt_tokens"] = l.prompt_tokens;
  j["max_tokens"] = l.max_tokens;
  j["max_tokens_requested"] = l.max_tokens_requested ? json(*l.max_tokens_requested) : json(nullptr);
  j["max_tokens_clamped"] = l.max_tokens_clamped;
  return j;
}

}  // namespace

ApiError bad(std::string param, std::string message, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

ApiError wrong_type(const std::string& param, const char* expected, const json& got) {
  return bad(param, "'" + param + "' must be " + expected + ", got " + std::string(got.type_name()), "invalid_type");
}

std::optional<ApiError> get_int(const json& obj, const char* key, std::optional<int64_t>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    out = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                         : static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (it->is_number_integer()) {
    out = it->get<int64_t>();
    return std::nullopt;
  }
  if (it->is_number_float()) {
    double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return wrong_type(key, "an integer", *it);
}

std::optional<ApiError> get_number(const json& obj, const char* key, std::optional<double>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(key, "a number", *it);
  double d = it->get<double>();
  if (!std::isfinite(d)) return bad(key, std::string("'") + key + "' must be a finite number");
  out = d;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& obj, const char* key, std::optional<bool>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(key, "a boolean", *it);
  out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_string(const json& obj, const char* key, std::optional<std::string>& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return wrong_type(key, "a string", *it);
  out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> in_range(const char* key, double v, double lo, double hi, bool lo_open) {
  if (v < lo || v > hi || (lo_open && v == lo)) {
    return bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                        json(hi).dump() + "], got " + json(v).dump());
  }
  return std::nullopt;
}

std::optional<ApiError> parse_object(std::string_view body, json& out) {
  // Checked before nlohmann sees the body: its lexer takes a NUL byte for the
  // end of input, so `{"prompt":"a"}\0{"x":1}` would parse as the first
  // object alone (strict mode cannot see the rest). Raw NULs are never valid
  // JSON (not whitespace, and control characters must be escaped in strings).
  if (const size_t nul = body.find('\0'); nul != std::string_view::npos) {
    return invalid_json("NUL byte at byte offset " + std::to_string(nul) + " (of " + std::to_string(body.size()) + ")");
  }
  if (const size_t at = invalid_utf8_at(body); at != std::string_view::npos) {
    return invalid_json("invalid UTF-8 at byte offset " + std::to_string(at) + " (of " + std::to_string(body.size()) +
                        ")");
  }
  try {
    // Strict: one value, then only whitespace to the end of the body.
    out = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based: the last character read (size + 1 at the end).
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    // Only on this error path: was it one good value with more after it?
    std::string what = syntax_error_text(e.what());
    if (starts_with_json_value(body)) what = "data after the JSON value (" + what + ")";
    return invalid_json(what + " at byte offset " + std::to_string(offset) + " (of " + std::to_string(body.size()) +
                        "), " + near(body, offset));
  } catch (const json::exception&) {  // out_of_range for 1e999: its what() quotes the number
    return invalid_json("a number is out of range (overflows a double)");
  }
  if (!out.is_object()) {
    return bad("", std::string("request body must be a JSON object, got ") + out.type_name(), "invalid_json");
  }
  return std::nullopt;
}

std::optional<ApiError> refuse_unknown(const json& obj, const char* endpoint,
                                       std::initializer_list<std::span<const std::string_view>> accepted) {
  for (const auto& [key, value] : obj.items()) {
    bool known = false;
    for (std::span<const std::string_view> list : accepted) {
      known = known || std::find(list.begin(), list.end(), key) != list.end();
    }
    if (known) continue;
    std::string names;
    for (std::span<const std::string_view> list : accepted) {
      for (std::string_view n : list) {
        if (!names.empty()) names += ", ";
        names += n;
      }
    }
    return bad(
        input_excerpt(key, kMaxParamBytes / 2),
        "Unrecognized request argument supplied: " + input_excerpt(key) + " (" + endpoint + " accepts: " + names + ")",
        "unknown_parameter");
  }
  return std::nullopt;
}

json nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json spillway_json(const SpillwayInfo& s) {
  json j;
  j["placement"] = s.placement;
  j["path"] = nullable(s.path);
  j["model"] = s.model;
  j["fallback_model"] = s.fallback_model;
  j["decision"] = nullable(s.decision);
  j["reason"] = nullable(s.reason);
  j["degraded"] = s.degraded;
  j["shrunk"] = s.shrunk;
  j["queue_position"] = s.queue_position;
  j["estimated_delay_ms"] = optional_json(s.estimated_delay_ms);
  j["quote"] = {{"ttft_ms", optional_json(s.predicted_ttft_ms)}, {"total_ms", optional_json(s.predicted_total_ms)}};
  j["request_id"] = s.request_id;
  j["seed"] = s.seed;
  j["limits"] = limits_json(s.limits);
  j["queue_ms"] = s.queue_ms;
  j["run_ms"] = s.run_ms;
  if (s.replayed) j["replayed"] = true;
  j["migrations"] = s.migrations;
  if (s.resumed_at_token) j["resumed_at_token"] = *s.resumed_at_token;
  return j;
}

json usage_json(int32_t prompt, int32_t completion) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json verdicts_json(const admission::Decision& d) {
  json a = json::array();
  for (const admission::PathVerdict& v : d.verdicts) {
    a.push_back({{"path", v.path}, {"eligible", v.eligible}, {"reason", v.reason}});
  }
  return a;
}

json resident_model_json(const gateway::ResidentModelInfo& r) {
  json charges = json::object();
  for (const auto& [ledger, bytes] : r.charges) charges[ledger] = bytes;
  return {{"name", r.name},
          {"model", r.model},
          {"state", r.state},
          {"pinned", r.pinned},
          {"draining", r.draining},
          {"memory_bytes", r.bytes},
          {"memory_by_ledger", charges},
          {"last_used", r.last_used_ms > 0 ? json(r.last_used_ms / 1000) : json(nullptr)},
          {"keep_alive_s", r.keep_alive_s},
          {"keep_alive_left_s", r.keep_alive_left_s >= 0 ? json(r.keep_alive_left_s) : json(nullptr)},
          {"resident_s", r.resident_s},
          {"running", r.running},
          {"waiting", r.waiting},
          {"loads", r.loads},
          {"evictions", r.evictions},
          {"last_evicted_for", nullable(r.last_evicted_for)},
          {"predicted_load_ms", r.predicted_load_ms},
          {"last_load_ms", r.last_load_ms >= 0 ? json(r.last_load_ms) : json(nullptr)}};
}

}  // namespace spw::http::json_fields
