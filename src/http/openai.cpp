#include "http/openai.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace spw::http {
namespace {

using nlohmann::json;

ApiError bad(std::string param, std::string message, std::string code = "invalid_value") {
  ApiError e;
  e.http_status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

ApiError wrong_type(const std::string& param, const char* expected, const json& got) {
  return bad(param, "'" + param + "' must be " + expected + ", got " + std::string(got.type_name()),
             "invalid_type");
}

// Each getter leaves `out` alone when the field is absent or null.
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

std::optional<ApiError> in_range(const char* key, double v, double lo, double hi, bool lo_open = false) {
  if (v < lo || v > hi || (lo_open && v == lo)) {
    return bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                        json(hi).dump() + "], got " + json(v).dump());
  }
  return std::nullopt;
}

std::optional<ApiError> parse_object(std::string_view body, json& out) {
  try {
    out = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    return bad("", std::string("request body is not valid JSON: ") + e.what(), "invalid_json");
  }
  if (!out.is_object()) {
    return bad("", std::string("request body must be a JSON object, got ") + out.type_name(), "invalid_json");
  }
  return std::nullopt;
}

#define SPW_TRY_FIELD(expr)              \
  do {                                   \
    if (auto spw_err_ = (expr)) return spw_err_; \
  } while (0)

// Fields common to /v1/completions and /v1/chat/completions.
std::optional<ApiError> parse_sampling(const json& obj, bool chat, SamplingFields& s, std::string& model) {
  std::optional<std::string> model_name;
  SPW_TRY_FIELD(get_string(obj, "model", model_name));
  if (model_name) model = *model_name;

  std::optional<int64_t> max_tokens;
  SPW_TRY_FIELD(get_int(obj, "max_tokens", max_tokens));
  if (chat) {
    std::optional<int64_t> mct;
    SPW_TRY_FIELD(get_int(obj, "max_completion_tokens", mct));
    if (mct) {
      if (*mct < 1) return bad("max_completion_tokens", "'max_completion_tokens' must be >= 1, got " + std::to_string(*mct));
      max_tokens = mct;
    }
  }
  if (max_tokens) {
    if (*max_tokens < 1) return bad("max_tokens", "'max_tokens' must be >= 1, got " + std::to_string(*max_tokens));
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
  // Accepted for compatibility (type-checked) but not applied.
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    d.reset();
    SPW_TRY_FIELD(get_number(obj, key, d));
    if (d) SPW_TRY_FIELD(in_range(key, *d, -2.0, 2.0));
  }

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
  {
    auto it = obj.find("seed");
    if (it != obj.end() && !it->is_null()) {
      if (it->is_number_unsigned()) {
        s.seed = it->get<uint64_t>();
      } else if (it->is_number_integer()) {
        s.seed = static_cast<uint64_t>(it->get<int64_t>());  // two's complement, as given
      } else {
        return wrong_type("seed", "an integer", *it);
      }
    }
  }
  i.reset();
  SPW_TRY_FIELD(get_int(obj, "n", i));
  if (i && *i != 1) return bad("n", "only n=1 is supported, got " + std::to_string(*i), "unsupported_value");
  i.reset();
  SPW_TRY_FIELD(get_int(obj, "best_of", i));
  if (i && *i != 1) return bad("best_of", "only best_of=1 is supported", "unsupported_value");

  auto stop = obj.find("stop");
  if (stop != obj.end() && !stop->is_null()) {
    if (stop->is_string()) {
      s.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      constexpr size_t kMaxStop = 16;
      if (stop->size() > kMaxStop) {
        return bad("stop", "'stop' may hold at most " + std::to_string(kMaxStop) + " strings, got " +
                               std::to_string(stop->size()));
      }
      for (size_t k = 0; k < stop->size(); ++k) {
        const json& e = (*stop)[k];
        if (!e.is_string()) return wrong_type("stop[" + std::to_string(k) + "]", "a string", e);
        s.stop.push_back(e.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", *stop);
    }
  }

  std::optional<bool> b;
  SPW_TRY_FIELD(get_bool(obj, "stream", b));
  s.stream = b.value_or(false);
  auto so = obj.find("stream_options");
  if (so != obj.end() && !so->is_null()) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    std::optional<bool> inc;
    if (auto e = get_bool(*so, "include_usage", inc)) {
      e->param = "stream_options.include_usage";
      return e;
    }
    s.include_usage = inc.value_or(false);
  }

  // Features this server does not implement: refuse rather than ignore.
  auto tools = obj.find("tools");
  if (tools != obj.end() && !tools->is_null() && !(tools->is_array() && tools->empty())) {
    return bad("tools", "tool calls are not supported by this server", "unsupported_parameter");
  }
  auto rf = obj.find("response_format");
  if (rf != obj.end() && !rf->is_null()) {
    if (!rf->is_object()) return wrong_type("response_format", "an object", *rf);
    auto t = rf->find("type");
    if (t == rf->end() || !t->is_string() || t->get<std::string>() != "text") {
      return bad("response_format", "only response_format {\"type\":\"text\"} is supported",
                 "unsupported_parameter");
    }
  }
  auto lp = obj.find("logprobs");
  if (lp != obj.end() && !lp->is_null()) {
    bool wants = lp->is_boolean() ? lp->get<bool>() : (lp->is_number() ? lp->get<double>() != 0 : true);
    if (!lp->is_boolean() && !lp->is_number()) return wrong_type("logprobs", chat ? "a boolean" : "an integer", *lp);
    if (wants) return bad("logprobs", "logprobs are not supported by this server", "unsupported_parameter");
  }
  return std::nullopt;
}

json limits_json(const serve::AppliedLimits& l) {
  json j;
  j["n_ctx"] = l.n_ctx;
  j["prompt_tokens"] = l.prompt_tokens;
  j["max_tokens"] = l.max_tokens;
  j["max_tokens_requested"] = l.max_tokens_requested ? json(*l.max_tokens_requested) : json(nullptr);
  j["max_tokens_clamped"] = l.max_tokens_clamped;
  return j;
}

json spillway_json(const SpillwayInfo& s) {
  json j;
  j["placement"] = s.placement;
  j["model"] = s.model;
  j["degraded"] = false;
  j["request_id"] = s.request_id;
  j["seed"] = s.seed;
  j["limits"] = limits_json(s.limits);
  j["queue_ms"] = s.queue_ms;
  j["run_ms"] = s.run_ms;
  if (s.replayed) j["replayed"] = true;
  return j;
}

json usage_json(int32_t prompt, int32_t completion) {
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

json nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// Generated text is valid UTF-8 (Utf8Stream), but never let a stray byte throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

ApiError api_error_from_status(const Status& s) {
  ApiError e;
  e.message = s.message();
  switch (s.code()) {
    case StatusCode::kInvalidArgument: {
      e.http_status = 400;
      e.type = "invalid_request_error";
      e.code = "invalid_value";
      // Scheduler and sampler messages start with the field they name.
      for (const char* field : {"prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                                "repeat_penalty", "repeat_last_n", "messages", "stop"}) {
        std::string_view m = s.message();
        if (m.starts_with("sampler param ")) m.remove_prefix(14);
        if (m.starts_with(field)) {
          e.param = field;
          break;
        }
      }
      if (e.param == "prompt" && s.message().find("context") != std::string::npos) {
        e.code = "context_length_exceeded";
      }
      break;
    }
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = s.message().find("queue") != std::string::npos ? "queue_full" : "resource_exhausted";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "unavailable";
      break;
    case StatusCode::kCancelled:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "cancelled";
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "deadline_exceeded";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      e.message = s.to_string();
      break;
  }
  return e;
}

std::optional<ApiError> parse_completion_request(std::string_view body, CompletionRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  auto p = obj.find("prompt");
  if (p == obj.end() || p->is_null()) return bad("prompt", "'prompt' is required", "missing_required_parameter");
  if (p->is_string()) {
    out.prompt = p->get<std::string>();
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    out.prompt = (*p)[0].get<std::string>();
  } else if (p->is_array()) {
    return bad("prompt", "'prompt' must be a string or an array of exactly one string (batches and token-id "
                         "prompts are not supported)",
               "invalid_type");
  } else {
    return wrong_type("prompt", "a string", *p);
  }
  if (out.prompt.empty()) return bad("prompt", "'prompt' must not be empty");
  std::optional<bool> echo;
  SPW_TRY_FIELD(get_bool(obj, "echo", echo));
  if (echo.value_or(false)) return bad("echo", "echo is not supported by this server", "unsupported_parameter");
  std::optional<std::string> suffix;
  SPW_TRY_FIELD(get_string(obj, "suffix", suffix));
  if (suffix && !suffix->empty()) return bad("suffix", "suffix is not supported by this server", "unsupported_parameter");
  SPW_TRY_FIELD(parse_sampling(obj, /*chat=*/false, out.sampling, out.model));
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(std::string_view body, ChatRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  auto m = obj.find("messages");
  if (m == obj.end() || m->is_null()) {
    return bad("messages", "'messages' is required", "missing_required_parameter");
  }
  if (!m->is_array()) return wrong_type("messages", "an array", *m);
  if (m->empty()) return bad("messages", "'messages' must not be empty");
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
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
      return bad(at + ".role", "'" + at + ".role' must be one of system, user, assistant; got '" + cm.role + "'");
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
    out.messages.push_back(std::move(cm));
  }
  SPW_TRY_FIELD(parse_sampling(obj, /*chat=*/true, out.sampling, out.model));
  return std::nullopt;
}

std::string render_completion(const CompletionResult& r) {
  json j;
  j["id"] = r.id;
  j["object"] = "text_completion";
  j["created"] = r.created;
  j["model"] = r.model;
  j["choices"] = json::array({{{"text", r.text}, {"index", 0}, {"logprobs", nullptr},
                               {"finish_reason", nullable(r.finish_reason)}}});
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
  j["choices"] = json::array({{{"index", 0},
                               {"message", {{"role", "assistant"}, {"content", r.text}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullable(r.finish_reason)}}});
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
                      {{"text", c.text}, {"index", 0}, {"logprobs", nullptr},
                       {"finish_reason", nullable(c.finish_reason)}});
}

std::string render_chat_chunk(const ChunkFields& c) {
  json delta = json::object();
  if (c.role_delta) delta["role"] = "assistant";
  if (c.role_delta || !c.text.empty()) delta["content"] = c.text;
  return render_chunk(c, "chat.completion.chunk",
                      {{"index", 0}, {"delta", delta}, {"logprobs", nullptr},
                       {"finish_reason", nullable(c.finish_reason)}});
}

std::string render_error(const ApiError& e, const std::string& model) {
  json j;
  j["error"] = {{"message", e.message}, {"type", e.type}, {"param", nullable(e.param)}, {"code", nullable(e.code)}};
  if (!model.empty()) j["spillway"] = {{"model", model}, {"placement", nullptr}};
  return dump(j);
}

std::string render_health(const HealthInfo& h) {
  json j;
  j["status"] = "ok";
  j["model"] = h.model;
  j["backend"] = h.backend;
  j["queue"] = {{"depth", h.queue_depth}, {"capacity", h.queue_capacity}, {"running", h.running},
                {"workers", h.workers}};
  j["n_ctx"] = h.n_ctx;
  j["chat_template"] = nullable(h.chat_template);
  if (h.memory) {
    const HealthMemory& m = *h.memory;
    auto opt = [](const std::optional<uint64_t>& v) { return v ? json(*v) : json(nullptr); };
    j["host_memory"] = {{"budget_bytes", m.budget},       {"reserved_bytes", m.reserved},
                        {"available_bytes", m.available}, {"bound_by", m.bound_by},
                        {"rss_bytes", opt(m.process_rss)}, {"rss_anon_bytes", opt(m.process_rss_anon)},
                        {"rss_file_bytes", opt(m.process_rss_file)}};
  }
  if (h.device_memory) {
    const HealthDeviceMemory& d = *h.device_memory;
    json by_cat = json::object();
    for (const auto& [name, bytes] : d.allocated_by_category) by_cat[name] = bytes;
    j["device_memory"] = {
        {"device", d.device},
        {"healthy", d.healthy},
        {"health_reason", nullable(d.health_reason)},
        {"capacity_bytes", d.capacity},
        {"headroom_bytes", d.headroom},
        {"reserved_bytes", d.reserved},
        {"co_tenant_reserved_bytes", d.co_tenant_reserved},
        {"others_observed_bytes", d.others_observed},
        {"available_bytes", d.available},
        {"observed_heap_used_bytes", d.observed_heap_used ? json(*d.observed_heap_used) : json(nullptr)},
        {"observed_unknown", nullable(d.observed_unknown)},
        {"allocated_bytes", d.allocated},
        {"allocated_peak_bytes", d.allocated_peak},
        {"allocated_by_category", by_cat}};
  }
  return dump(j);
}

std::string render_request_record(const journal::Record& r) {
  json j;
  j["id"] = r.id;
  j["object"] = "spillway.request";
  j["state"] = std::string(journal::state_name(r.state));
  j["terminal"] = journal::is_terminal(r.state);
  j["resumable"] = r.outcome.resumable;
  j["endpoint"] = r.endpoint;
  j["idempotency_key"] = nullable(r.idempotency_key);
  j["created_ms"] = r.created_ms;
  j["updated_ms"] = r.updated_ms;
  j["attempts"] = r.attempts;
  j["placement"] = nullable(r.placement);
  j["finish_reason"] = nullable(r.outcome.finish_reason);
  j["text"] = r.outcome.text;
  j["usage"] = usage_json(r.outcome.prompt_tokens, r.outcome.completion_tokens);
  j["error"] = r.outcome.error_code.empty()
                   ? json(nullptr)
                   : json{{"code", r.outcome.error_code}, {"message", r.outcome.error_message}};
  return dump(j);
}

std::string render_models(const std::string& model, int64_t created) {
  json j;
  j["object"] = "list";
  j["data"] = json::array({{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "spillway"}}});
  return dump(j);
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
