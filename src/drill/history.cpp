// History recording and its JSON form (nlohmann-json; no exception leaves
// this file).
#include "drill/history.h"

#include <limits>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

namespace spw::drill {

using nlohmann::json;

const char* op_type_name(OpType t) {
  switch (t) {
    case OpType::kInvoke: return "invoke";
    case OpType::kOk: return "ok";
    case OpType::kFail: return "fail";
    case OpType::kInfo: return "info";
  }
  return "info";
}

namespace {

bool parse_op_type(const std::string& s, OpType& out) {
  for (OpType t : {OpType::kInvoke, OpType::kOk, OpType::kFail, OpType::kInfo}) {
    if (s == op_type_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

}  // namespace

Op HistoryRecorder::invoke(Op op) {
  std::lock_guard<std::mutex> lock(mu_);
  op.index = static_cast<int64_t>(h_.ops.size());
  op.op_id = op.index + 1;
  op.type = OpType::kInvoke;
  h_.ops.push_back(op);
  return op;
}

void HistoryRecorder::complete(const Op& invoked, Op result) {
  // The request fields are the invoke's: a completion describes the same
  // request, and the checker may read either record.
  result.op_id = invoked.op_id;
  result.client = invoked.client;
  result.f = invoked.f;
  result.continues = invoked.continues;
  result.phase = invoked.phase;
  result.cls = invoked.cls;
  result.prompt_key = invoked.prompt_key;
  result.stream = invoked.stream;
  result.greedy = invoked.greedy;
  result.seed = invoked.seed;
  result.max_tokens = invoked.max_tokens;
  result.idempotency_key = invoked.idempotency_key;
  if (result.type == OpType::kInvoke) result.type = OpType::kInfo;
  std::lock_guard<std::mutex> lock(mu_);
  result.index = static_cast<int64_t>(h_.ops.size());
  h_.ops.push_back(std::move(result));
}

void HistoryRecorder::add_sample(Sample s) {
  std::lock_guard<std::mutex> lock(mu_);
  h_.samples.push_back(std::move(s));
}

void HistoryRecorder::add_event(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  h_.events.push_back(std::move(e));
}

History HistoryRecorder::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(h_);
}

// ---------------------------------------------------------------- to JSON

namespace {

json op_to_json(const Op& o) {
  return json{
      {"index", o.index},
      {"op_id", o.op_id},
      {"client", o.client},
      {"type", op_type_name(o.type)},
      {"t_ms", o.t_ms},
      {"f", o.f},
      {"continues", o.continues},
      {"phase", o.phase},
      {"cls", o.cls},
      {"prompt_key", o.prompt_key},
      {"stream", o.stream},
      {"greedy", o.greedy},
      {"seed", o.seed},
      {"max_tokens", o.max_tokens},
      {"idempotency_key", o.idempotency_key},
      {"http_status", o.http_status},
      {"error_code", o.error_code},
      {"error_message", o.error_message},
      {"request_id", o.request_id},
      {"accepted", o.accepted},
      {"path", o.path},
      {"placement", o.placement},
      {"model", o.model},
      {"decision", o.decision},
      {"reason", o.reason},
      {"degraded", o.degraded},
      {"degraded_shown", o.degraded_shown},
      {"replayed", o.replayed},
      {"text", o.text},
      {"completion_tokens", o.completion_tokens},
      {"finish_reason", o.finish_reason},
      {"ttft_ms", o.ttft_ms},
      {"latency_ms", o.latency_ms},
      {"queue_ms", o.queue_ms},
      {"failovers", o.failovers},
      {"migrations", o.migrations},
  };
}

json sample_to_json(const Sample& s) {
  json paths = json::array();
  for (const auto& p : s.paths) {
    paths.push_back(json{{"name", p.name},
                         {"queue_depth", p.queue_depth},
                         {"running", p.running},
                         {"oldest_queued_s", p.oldest_queued_s},
                         {"breaker", p.breaker}});
  }
  return json{{"t_ms", s.t_ms},
              {"up", s.up},
              {"paths", std::move(paths)},
              {"device_capacity", s.device_capacity},
              {"device_limit", s.device_limit},
              {"device_ours", s.device_ours},
              {"device_cotenants", s.device_cotenants},
              {"device_used", s.device_used},
              {"host_budget", s.host_budget},
              {"host_reserved", s.host_reserved},
              {"host_rss", s.host_rss},
              {"competing_bytes", s.competing_bytes}};
}

json final_to_json(const FinalRecord& f) {
  json j{{"request_id", f.request_id}, {"found", f.found},   {"state", f.state}, {"error_code", f.error_code},
         {"text", f.text},             {"placement", f.placement}, {"runs", f.runs}};
  j["admitted_under_reserve"] = f.admitted_under_reserve ? json(*f.admitted_under_reserve) : json(nullptr);
  return j;
}

}  // namespace

std::string history_to_json(const History& h) {
  json j;
  j["scenario"] = h.scenario;
  j["mode"] = h.mode;
  j["seed"] = h.seed;
  j["duration_ms"] = h.duration_ms;
  j["first_path"] = h.first_path;
  json ops = json::array();
  for (const auto& o : h.ops) ops.push_back(op_to_json(o));
  j["ops"] = std::move(ops);
  json samples = json::array();
  for (const auto& s : h.samples) samples.push_back(sample_to_json(s));
  j["samples"] = std::move(samples);
  json events = json::array();
  for (const auto& e : h.events) events.push_back(json{{"t_ms", e.t_ms}, {"kind", e.kind}, {"detail", e.detail}});
  j["events"] = std::move(events);
  json finals = json::array();
  for (const auto& [id, f] : h.finals) {
    json fj = final_to_json(f);
    fj["request_id"] = id;  // the map's key is the truth
    finals.push_back(std::move(fj));
  }
  j["finals"] = std::move(finals);
  json ref = json::object();
  for (const auto& [k, v] : h.reference) ref[k] = v;
  j["reference"] = std::move(ref);
  // replace: model text can end mid-character; dump() would throw on it.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// -------------------------------------------------------------- from JSON

namespace {

// Reads the fields of one JSON object into a struct, naming each by its path
// on error. Absent fields keep the struct's value.
class ObjReader {
 public:
  ObjReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  Status status() const { return st_; }

  template <typename T>
  ObjReader& get(const char* key, T& out) {
    if (!st_.ok()) return *this;
    auto it = j_.find(key);
    if (it == j_.end()) return *this;
    const json& v = *it;
    const std::string where = path_ + "." + key;
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) return fail(where, "a boolean");
      out = v.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) return fail(where, "a string");
      out = v.get<std::string>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number()) return fail(where, "a number");
      out = v.get<double>();
    } else if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_unsigned()) return fail(where, "an unsigned integer");
      out = v.get<T>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) return fail(where, "an integer");
      if constexpr (sizeof(T) < sizeof(int64_t)) {
        const int64_t x = v.get<int64_t>();
        if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) return fail(where, "a 32-bit integer");
      }
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail(where, "a signed 64-bit integer");
      }
      out = v.get<T>();
    }
    return *this;
  }

  ObjReader& fail(const std::string& where, const char* expected) {
    st_ = Status::invalid_argument("history: " + where + ": expected " + expected);
    return *this;
  }

 private:
  const json& j_;
  std::string path_;
  Status st_;
};

Status need_object(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::invalid_argument("history: " + where + ": expected an object");
  return Status::ok_status();
}

// The array under `key` of `j` (absent: nullptr).
Result<const json*> array_field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return static_cast<const json*>(nullptr);
  if (!it->is_array()) return Status::invalid_argument(std::string("history: ") + key + ": expected an array");
  return &*it;
}

Result<Op> op_from_json(const json& j, const std::string& where) {
  SPW_RETURN_IF_ERROR(need_object(j, where));
  Op o;
  std::string type = op_type_name(o.type);
  ObjReader r(j, where);
  r.get("index", o.index)
      .get("op_id", o.op_id)
      .get("client", o.client)
      .get("type", type)
      .get("t_ms", o.t_ms)
      .get("f", o.f)
      .get("continues", o.continues)
      .get("phase", o.phase)
      .get("cls", o.cls)
      .get("prompt_key", o.prompt_key)
      .get("stream", o.stream)
      .get("greedy", o.greedy)
      .get("seed", o.seed)
      .get("max_tokens", o.max_tokens)
      .get("idempotency_key", o.idempotency_key)
      .get("http_status", o.http_status)
      .get("error_code", o.error_code)
      .get("error_message", o.error_message)
      .get("request_id", o.request_id)
      .get("accepted", o.accepted)
      .get("path", o.path)
      .get("placement", o.placement)
      .get("model", o.model)
      .get("decision", o.decision)
      .get("reason", o.reason)
      .get("degraded", o.degraded)
      .get("degraded_shown", o.degraded_shown)
      .get("replayed", o.replayed)
      .get("text", o.text)
      .get("completion_tokens", o.completion_tokens)
      .get("finish_reason", o.finish_reason)
      .get("ttft_ms", o.ttft_ms)
      .get("latency_ms", o.latency_ms)
      .get("queue_ms", o.queue_ms)
      .get("failovers", o.failovers)
      .get("migrations", o.migrations);
  SPW_RETURN_IF_ERROR(r.status());
  if (!parse_op_type(type, o.type)) {
    return Status::invalid_argument("history: " + where + ".type: unknown op type '" + type +
                                    "' (expected invoke, ok, fail or info)");
  }
  return o;
}

Result<Sample> sample_from_json(const json& j, const std::string& where) {
  SPW_RETURN_IF_ERROR(need_object(j, where));
  Sample s;
  ObjReader r(j, where);
  r.get("t_ms", s.t_ms)
      .get("up", s.up)
      .get("device_capacity", s.device_capacity)
      .get("device_limit", s.device_limit)
      .get("device_ours", s.device_ours)
      .get("device_cotenants", s.device_cotenants)
      .get("device_used", s.device_used)
      .get("host_budget", s.host_budget)
      .get("host_reserved", s.host_reserved)
      .get("host_rss", s.host_rss)
      .get("competing_bytes", s.competing_bytes);
  SPW_RETURN_IF_ERROR(r.status());
  auto it = j.find("paths");
  if (it != j.end()) {
    if (!it->is_array()) return Status::invalid_argument("history: " + where + ".paths: expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string pw = where + ".paths[" + std::to_string(i) + "]";
      const json& pj = (*it)[i];
      SPW_RETURN_IF_ERROR(need_object(pj, pw));
      PathSample p;
      ObjReader pr(pj, pw);
      pr.get("name", p.name)
          .get("queue_depth", p.queue_depth)
          .get("running", p.running)
          .get("oldest_queued_s", p.oldest_queued_s)
          .get("breaker", p.breaker);
      SPW_RETURN_IF_ERROR(pr.status());
      s.paths.push_back(std::move(p));
    }
  }
  return s;
}

Result<FinalRecord> final_from_json(const json& j, const std::string& where) {
  SPW_RETURN_IF_ERROR(need_object(j, where));
  FinalRecord f;
  ObjReader r(j, where);
  r.get("request_id", f.request_id)
      .get("found", f.found)
      .get("state", f.state)
      .get("error_code", f.error_code)
      .get("text", f.text)
      .get("placement", f.placement)
      .get("runs", f.runs);
  SPW_RETURN_IF_ERROR(r.status());
  auto it = j.find("admitted_under_reserve");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return Status::invalid_argument("history: " + where + ".admitted_under_reserve: expected a boolean or null");
    }
    f.admitted_under_reserve = it->get<bool>();
  }
  return f;
}

}  // namespace

Result<History> history_from_json(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("history: not a JSON document");
  if (!j.is_object()) return Status::invalid_argument("history: expected a JSON object");
  if (!j.contains("ops")) return Status::invalid_argument("history: ops: missing (not a drill history)");
  History h;
  ObjReader r(j, "history");
  r.get("scenario", h.scenario)
      .get("mode", h.mode)
      .get("seed", h.seed)
      .get("duration_ms", h.duration_ms)
      .get("first_path", h.first_path);
  SPW_RETURN_IF_ERROR(r.status());

  SPW_ASSIGN_OR_RETURN(const json* ops, array_field(j, "ops"));
  for (size_t i = 0; ops != nullptr && i < ops->size(); ++i) {
    SPW_ASSIGN_OR_RETURN(Op o, op_from_json((*ops)[i], "ops[" + std::to_string(i) + "]"));
    h.ops.push_back(std::move(o));
  }
  SPW_ASSIGN_OR_RETURN(const json* samples, array_field(j, "samples"));
  for (size_t i = 0; samples != nullptr && i < samples->size(); ++i) {
    SPW_ASSIGN_OR_RETURN(Sample s, sample_from_json((*samples)[i], "samples[" + std::to_string(i) + "]"));
    h.samples.push_back(std::move(s));
  }
  SPW_ASSIGN_OR_RETURN(const json* events, array_field(j, "events"));
  for (size_t i = 0; events != nullptr && i < events->size(); ++i) {
    const std::string where = "events[" + std::to_string(i) + "]";
    SPW_RETURN_IF_ERROR(need_object((*events)[i], where));
    Event e;
    ObjReader er((*events)[i], where);
    er.get("t_ms", e.t_ms).get("kind", e.kind).get("detail", e.detail);
    SPW_RETURN_IF_ERROR(er.status());
    h.events.push_back(std::move(e));
  }
  SPW_ASSIGN_OR_RETURN(const json* finals, array_field(j, "finals"));
  for (size_t i = 0; finals != nullptr && i < finals->size(); ++i) {
    const std::string where = "finals[" + std::to_string(i) + "]";
    SPW_ASSIGN_OR_RETURN(FinalRecord f, final_from_json((*finals)[i], where));
    if (h.finals.count(f.request_id) != 0) {
      return Status::invalid_argument("history: " + where + ".request_id: " + std::to_string(f.request_id) +
                                      " appears twice");
    }
    h.finals.emplace(f.request_id, std::move(f));
  }
  auto ref = j.find("reference");
  if (ref != j.end()) {
    if (!ref->is_object()) return Status::invalid_argument("history: reference: expected an object");
    for (auto it = ref->begin(); it != ref->end(); ++it) {
      if (!it->is_string()) return Status::invalid_argument("history: reference." + it.key() + ": expected a string");
      h.reference[it.key()] = it->get<std::string>();
    }
  }
  return h;
}

}  // namespace spw::drill
