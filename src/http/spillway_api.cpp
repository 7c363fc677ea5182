// Spillway's own JSON (spillway_api.h): /health, /v1/status, /v1/quote,
// reservations, the requests list, request records and the admission
// decision the journal stores, resume bodies and the admin fault API. The
// OpenAI wire format is openai.cpp's; the helpers both use, json_fields.cpp's.
#include "http/spillway_api.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/vulkan/device_spec.h"
#include "core/failure.h"
#include "core/size.h"
#include "gguf/ggml_types.h"
#include "http/json_fields.h"

namespace spw::http {

using namespace json_fields;

std::string render_health(const HealthInfo& h) {
  json j;
  j["status"] = "ok";
  j["model"] = h.model;
  j["backend"] = h.backend;
  j["queue"] = {
      {"depth", h.queue_depth}, {"capacity", h.queue_capacity}, {"running", h.running}, {"workers", h.workers}};
  j["n_ctx"] = h.n_ctx;
  j["chat_template"] = nullable(h.chat_template);
  if (h.memory) {
    const HealthMemory& m = *h.memory;
    auto opt = [](const std::optional<uint64_t>& v) { return v ? json(*v) : json(nullptr); };
    j["host_memory"] = {{"budget_bytes", m.budget},
                        {"reserved_bytes", m.reserved},
                        {"available_bytes", m.available},
                        {"bound_by", m.bound_by},
                        {"rss_bytes", opt(m.process_rss)},
                        {"rss_anon_bytes", opt(m.process_rss_anon)},
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

namespace {

// Seconds to milliseconds for JSON; an unknown (infinite) time is null.
json ms(double seconds) { return std::isfinite(seconds) ? json(seconds * 1000.0) : json(nullptr); }

// The limits a decision applied (on its path): shared by the quote and the
// journal's admission record.
json decision_limits_json(const admission::Decision& d) {
  return {{"n_ctx", d.n_ctx},
          {"prompt_tokens", d.prompt_tokens},
          {"max_tokens", d.max_tokens},
          {"max_tokens_requested", d.max_tokens_requested ? json(*d.max_tokens_requested) : json(nullptr)},
          {"max_tokens_clamped", d.max_tokens_clamped},
          {"shrunk", d.shrunk},
          {"kv_blocks", d.kv_blocks}};
}

// The status a decision answers with (a decision's http_status is only set
// on reject).
int decision_http_status(const admission::Decision& d) {
  return d.kind == admission::DecisionKind::kReject ? d.http_status : 200;
}

// A decision with everything it was made from, in the names /v1/quote uses.
json decision_json(const admission::Decision& d) {
  const bool reject = d.kind == admission::DecisionKind::kReject;
  json j = {{"kind", std::string(admission::decision_kind_name(d.kind))},
            {"path", nullable(d.path)},
            {"reason", d.reason},
            {"failure",
             d.failure == FailureReason::kNone ? json(nullptr) : json(std::string(failure_reason_name(d.failure)))},
            {"http_status", decision_http_status(d)},
            {"degraded", d.degraded()},
            {"limits", decision_limits_json(d)},
            {"queue_position", d.queue_position},
            {"estimated_delay_ms", ms(d.timing.delay_s)},
            {"predicted_ttft_ms", ms(d.timing.ttft_s)},
            {"predicted_total_ms", ms(d.timing.total_s)},
            {"pressure", std::isfinite(d.pressure) ? json(d.pressure) : json(nullptr)},
            {"verdicts", verdicts_json(d)}};
  // Only a queue-full refusal has an estimate of when to come back.
  if (reject) j["retry_after_s"] = d.http_status == 429 ? json(d.retry_after_s) : json(nullptr);
  return j;
}

}  // namespace

std::string render_decision(const admission::Decision& d) { return dump(decision_json(d)); }

StoredRoute stored_route(std::string_view decision_json) {
  StoredRoute out;
  const json j = json::parse(decision_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  auto text = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  out.path = text("path");
  out.decision = text("kind");
  out.reason = text("reason");
  auto d = j.find("degraded");
  out.degraded = d != j.end() && d->is_boolean() && d->get<bool>();
  return out;
}

std::string render_request_record(const journal::Record& r) {
  json j;
  j["id"] = r.id;
  j["object"] = "spillway.request";
  j["state"] = std::string(journal::state_name(r.state));
  j["terminal"] = journal::is_terminal(r.state);
  j["resumable"] = r.outcome.resumable;
  // A resume continues from here: generated tokens the checkpoint holds
  // (null: none kept).
  j["checkpoint_tokens"] = r.checkpoint.empty() ? json(nullptr) : json(r.checkpoint_tokens);
  j["endpoint"] = r.endpoint;
  j["idempotency_key"] = nullable(r.idempotency_key);
  j["created_ms"] = r.created_ms;
  j["updated_ms"] = r.updated_ms;
  j["attempts"] = r.attempts;
  j["placement"] = nullable(r.placement);
  j["finish_reason"] = nullable(r.outcome.finish_reason);
  j["text"] = r.outcome.text;
  // n > 1: every choice by index (text and finish_reason above are choice 0's).
  if (!r.outcome.choices.empty()) {
    json choices =
        json::array({{{"index", 0}, {"text", r.outcome.text}, {"finish_reason", nullable(r.outcome.finish_reason)}}});
    Result<std::vector<journal::StoredChoice>> more = journal::decode_choices(r.outcome.choices);
    if (more.ok()) {
      for (size_t i = 0; i < more->size(); ++i) {
        choices.push_back(
            {{"index", i + 1}, {"text", (*more)[i].text}, {"finish_reason", nullable((*more)[i].finish_reason)}});
      }
    }
    j["choices"] = std::move(choices);
  }
  j["usage"] = usage_json(r.outcome.prompt_tokens, r.outcome.completion_tokens);
  j["error"] = r.outcome.error_code.empty()
                   ? json(nullptr)
                   : json{{"code", r.outcome.error_code}, {"message", r.outcome.error_message}};
  // Stored by us as a JSON object (the journal checks it); anything else
  // (a hand-edited file) shows as null rather than failing the read.
  json admission = r.admission.empty() ? json(nullptr) : json::parse(r.admission, nullptr, /*allow_exceptions=*/false);
  j["admission"] = admission.is_object() ? std::move(admission) : json(nullptr);
  // The request body as stored: its size and digest always; the body itself
  // is not kept (body_kept false) for a refused request, so that refusals
  // cost a summary, not their payload, nor, over the journal's body limit,
  // once nothing can run from it (done, or failed for good).
  j["body"] = {{"bytes", r.body_bytes},
               {"sha256", nullable(r.body_sha256)},
               {"kept", r.body_kept},
               {"refusal_reason", nullable(r.refusal_reason)}};
  j["owner"] = nullable(r.owner);
  return dump(j);
}

namespace {

json ledger_json(const admission::LedgerSnapshot& l) {
  json by = json::object();
  for (int k = 0; k < admission::kNumOwnerKinds; ++k) {
    by[std::string(admission::owner_kind_name(static_cast<admission::OwnerKind>(k)))] = l.reserved[k];
  }
  return {{"name", l.name},
          {"capacity_bytes", l.capacity},
          {"headroom_bytes", l.headroom},
          {"limit_bytes", l.limit},
          {"reserved_bytes", by},
          {"observed_bytes", l.observed},
          {"others_bytes", l.others},
          {"used_bytes", l.used},
          {"available_bytes", l.available},
          {"pressure", l.limit > 0 ? static_cast<double>(l.used) / static_cast<double>(l.limit) : 0.0}};
}

json reservation_json(const gateway::ReservationInfo& r) {
  return {{"id", r.id},
          {"object", "spillway.reservation"},
          {"name", r.name},
          {"ledger", r.ledger},
          {"bytes", r.bytes},
          {"ttl_s", r.ttl_s},
          {"expires_in_s", r.expires_in_s},
          {"fits", r.fits},
          {"note", r.fits ? "counted by admission from now on"
                          : "accepted, but it leaves Spillway no room under its safe limit: new requests go to "
                            "other paths until it is released"},
          {"ledger_after", ledger_json(r.after)}};
}

json reservations_json(const std::vector<gateway::ReservationInfo>& rs) {
  json a = json::array();
  for (const auto& r : rs) a.push_back(reservation_json(r));
  return a;
}

json rates_json(const admission::PathRates& r) {
  // Speeds at position 0 and what each earlier position adds to a token
  // (attention): the line admission predicts times with.
  return {{"prefill_tokens_per_s", r.prefill_tps},
          {"decode_tokens_per_s", r.decode_tps},
          {"prefill_us_per_token_per_position", r.prefill_s_per_pos * 1e6},
          {"decode_us_per_token_per_position", r.decode_s_per_pos * 1e6},
          {"completion_share", r.completion_share},
          {"samples", r.samples},
          {"measured", r.measured}};
}

// A path's rate prior (admission/prior.h): the bandwidth and bytes it came
// from, and the rates the path started with.
json prior_json(const admission::RatePrior& p) {
  auto bw = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  json kernels = json::array();  // the host share's weight types and their decode kernels' rates
  for (const admission::KernelRate& k : p.kernels) {
    kernels.push_back({{"type", gguf::ggml_type_name(k.ggml_type)},
                       {"bytes_per_s_per_thread", bw(k.bytes_per_s)},
                       {"source", k.bytes_per_s <= 0 ? json(nullptr) : json(k.measured ? "measured" : "reference")}});
  }
  return {{"computed", p.computed},
          {"why_not", p.computed ? json(nullptr) : json(p.why)},
          {"host_bandwidth_bytes_per_s", bw(p.host_bandwidth)},
          {"device_bandwidth_bytes_per_s", bw(p.device_bandwidth)},
          {"device_bandwidth_source", nullable(p.device_bandwidth_source)},
          {"weight_bytes_per_token", p.weight_bytes_per_token},
          {"kv_bytes_per_position", p.kv_bytes_per_position},
          {"kernel_ms_per_token", p.compute_s_per_token * 1e3},
          {"kernels", kernels},
          {"step_overhead_us", p.constants.step_overhead_s * 1e6},
          {"prefill_per_decode", p.constants.prefill_per_decode},
          {"decode_bandwidth_share", p.constants.decode_bandwidth_share},
          {"rates", rates_json(p.rates)}};
}

json replica_json(const gateway::ReplicaInfo& r) {
  auto measured = [](double ms) { return ms < 0 ? json(nullptr) : json(ms); };
  return {{"mode", r.mode},
          {"why", r.why},
          {"loaded", r.loaded},
          {"load_ms", measured(r.load_ms)},
          {"page_in_ms", measured(r.page_in_ms)},
          {"recovery_ms", r.recovery_ms},
          {"loaded_in_ms", measured(r.loaded_in_ms)}};
}

// A path's device breaker (null on a path without one). Times are seconds
// relative to the snapshot (the breaker runs on the monotonic clock).
// The path's continuous batching: passes over the weights and what they
// carried (null: not batched).
json batching_json(const std::optional<StepBatcherStats>& b) {
  if (!b) return nullptr;
  return {
      {"steps", b->steps},
      {"decode_tokens", b->tokens},
      {"prompt_tokens", b->prompt_tokens},
      {"mixed_steps", b->mixed_steps},
      {"mean_decode_tokens_per_step", b->steps ? static_cast<double>(b->tokens) / static_cast<double>(b->steps) : 0.0},
      {"max_batch", b->max_batch},
      {"max_rows", b->max_rows},
      {"straggler_steps", b->straggler_steps}};
}

json breaker_json(const std::optional<gateway::BreakerSnapshot>& b) {
  if (!b) return nullptr;
  json trips = json::array();
  for (const gateway::BreakerTrip& t : b->recent_trips) {
    trips.push_back({{"ago_s", static_cast<double>(b->now_ns - t.at_ns) / 1e9},
                     {"reason", t.reason},
                     {"failure", t.failure},
                     {"detail", t.detail},
                     {"cooldown_s", t.cooldown_s}});
  }
  const bool open = b->state == gateway::BreakerState::kOpen;
  return {{"device", b->name},
          {"state", std::string(gateway::breaker_state_name(b->state))},
          {"since_s", b->since_s()},
          {"reason", gateway::breaker_unavailable_reason(*b)},
          {"trips", b->trips},
          {"last_trips", trips},
          {"cooldown_s", b->cooldown_s},
          {"next_probe_in_s", open ? json(b->next_probe_in_s()) : json(nullptr)},
          {"probes", {{"needed", b->probes_needed}, {"passed", b->probes_passed}, {"run", b->probes_run}}},
          {"window", {{"outcomes", b->window_outcomes}, {"device_faults", b->window_faults}}},
          {"consecutive_device_faults", b->consecutive_faults},
          {"counts", {{"device_faults", b->faults}, {"successes", b->successes}, {"ignored", b->ignored}}}};
}

// A path's device: health checks and recovery after faults (null on a path
// without a device). reopen_ms: this path's last session-group re-open.
json device_json(const std::optional<gateway::DeviceStatus>& d, const std::string& path) {
  if (!d) return nullptr;
  auto measured = [](double ms) { return ms < 0 ? json(nullptr) : json(ms); };
  json reopen = nullptr;
  if (auto it = d->reopens.find(path); it != d->reopens.end()) {
    reopen = {{"reopens", it->second.reopens},
              {"failed", it->second.failed},
              {"last_ms", measured(it->second.last_ms)},
              {"last_error", nullable(it->second.last_error)}};
  }
  return {{"name", d->name},
          {"healthy", d->healthy},
          {"reinitializations", d->reinitializations},
          {"failed_reinitializations", d->failed_reinitializations},
          {"last_recovery_ms", measured(d->last_recovery_ms)},
          {"last_recovery_error", nullable(d->last_recovery_error)},
          {"session_group", reopen},
          {"health_checks", d->health_checks},
          {"health_failures", d->health_failures},
          {"last_health_check_ms", measured(d->last_health_check_ms)},
          {"last_health_failure", nullable(d->last_health_failure)}};
}

}  // namespace

std::string render_quote(const gateway::Quote& q) {
  const admission::Decision& d = q.decision;
  json paths = json::array();
  for (const gateway::PathQuote& p : q.paths) {
    paths.push_back({{"path", p.path},
                     {"placement", p.placement},
                     {"model", p.model},
                     {"can_serve", p.eligible},
                     {"reason", p.reason},
                     {"estimated_delay_ms", ms(p.timing.delay_s)},
                     {"predicted_ttft_ms", ms(p.timing.ttft_s)},
                     {"predicted_total_ms", ms(p.timing.total_s)},
                     {"prefill_tokens_per_s", p.prefill_tps},
                     {"decode_tokens_per_s", p.decode_tps},
                     {"rates_measured", p.rates_measured},
                     {"rates_source", p.rates_source}});
  }
  json j = {{"object", "spillway.quote"},
            {"decision", std::string(admission::decision_kind_name(d.kind))},
            {"reason", d.reason},
            {"path", nullable(d.path)},
            {"placement", nullable(q.placement)},
            {"model", nullable(q.model)},
            {"fallback_model", q.fallback_model},
            {"degraded", d.degraded()},
            {"limits", decision_limits_json(d)},
            {"queue_position", d.queue_position},
            {"estimated_delay_ms", ms(d.timing.delay_s)},
            {"predicted_ttft_ms", ms(d.timing.ttft_s)},
            {"predicted_total_ms", ms(d.timing.total_s)},
            {"http_status", decision_http_status(d)},
            {"verdicts", verdicts_json(d)},
            {"paths", paths}};
  return dump(j);
}

std::string render_status(const gateway::GatewayStatus& s, const TransportStats* http) {
  json paths = json::array();
  for (const gateway::PathStatus& p : s.paths) {
    paths.push_back({{"name", p.name},
                     {"placement", p.placement},
                     {"model", p.model},
                     {"fingerprint", nullable(p.fingerprint)},
                     {"cpu_kernels", nullable(p.cpu_kernels)},
                     {"fallback_model", p.fallback_model},
                     {"role", p.role},
                     {"replica", replica_json(p.replica)},
                     {"startup_ms", p.startup_ms},
                     {"workers", p.workers},
                     {"running", p.running},
                     {"queue_depth", p.queue_depth},
                     {"queue_capacity", p.queue_capacity},
                     {"oldest_queued_s", p.oldest_queued_s},
                     {"n_ctx", p.n_ctx},
                     {"kv",
                      {{"block_tokens", p.kv_block_tokens},
                       {"blocks_total", p.kv_blocks_total},
                       {"blocks_free", p.kv_blocks_free},
                       {"type", p.kv_type}}},
                     {"rates", rates_json(p.rates)},
                     {"rates_source", gateway::rates_source(p.rates, p.prior)},
                     {"rate_prior", prior_json(p.prior)},
                     {"breaker", breaker_json(p.breaker)},
                     {"device", device_json(p.device, p.name)},
                     {"batching", batching_json(p.batching)},
                     {"requests",
                      {{"submitted", p.stats.submitted},
                       {"rejected", p.stats.rejected},
                       {"done", p.stats.done},
                       {"cancelled", p.stats.cancelled},
                       {"failed", p.stats.failed},
                       {"failed_over", p.stats.failed_over},
                       {"adopted", p.stats.adopted}}}});
  }
  json not_built = json::array();
  for (const auto& n : s.not_built) not_built.push_back({{"path", n.name}, {"reason", n.reason}});
  json ledgers = json::array();
  for (const auto& l : s.ledgers) ledgers.push_back(ledger_json(l));
  json decisions = json::object();
  for (size_t k = 0; k < gateway::kNumDecisionCounters; ++k) {
    decisions[std::string(gateway::decision_counter_name(static_cast<gateway::DecisionCounter>(k)))] = s.decisions[k];
  }
  json equivalence = json::array();
  for (const gateway::EquivalenceInfo& e : s.equivalence) {
    equivalence.push_back({{"paths", {e.a, e.b}},
                           {"placements", {e.placement_a, e.placement_b}},
                           {"fingerprint", e.fingerprint},
                           {"passed", e.passed},
                           {"detail", e.detail},
                           {"ms", e.ms},
                           {"source", e.source},
                           {"checked_ms", e.checked_ms}});
  }
  json recent = json::array();
  for (const gateway::RecentDecision& d : s.recent_decisions) {
    recent.push_back({{"wall_ms", d.wall_ms},
                      {"kind", gateway::decision_counter_name(d.kind)},
                      {"path", nullable(d.path)},
                      {"reason", d.reason},
                      {"degraded", d.degraded}});
  }
  json models = json::array();
  for (const gateway::ResidentModelInfo& m : s.models) models.push_back(resident_model_json(m));
  json j = {
      {"object", "spillway.status"},  {"ready", s.ready},           {"paths", paths}, {"models", models},
      {"paths_not_built", not_built}, {"ledgers", ledgers},         {"reservations", reservations_json(s.reservations)},
      {"decisions", decisions},       {"recent_decisions", recent}, {"equivalence", equivalence},
      {"overflow", s.overflow}};
  if (!s.host_cpu.kernels.empty()) {
    j["host_cpu"] = {{"brand", nullable(s.host_cpu.brand)},
                     {"features", s.host_cpu.features},
                     {"kernels", s.host_cpu.kernels},
                     {"kernels_isa", s.host_cpu.kernels_isa},
                     {"kernels_built", s.host_cpu.built}};
  }
  if (http) {
    j["http"] = {{"open_connections", http->open_connections},
                 {"accepted", http->accepted},
                 {"over_limit", http->over_limit},
                 {"refused", http->refused},
                 {"timed_out", http->timed_out},
                 {"client_errors", http->client_errors},
                 {"disconnects", http->disconnects},
                 {"workers_running", http->workers_running}};
  }
  return dump(j);
}

std::string render_reservation(const gateway::ReservationInfo& r) { return dump(reservation_json(r)); }

std::string render_live_requests(const std::vector<LiveRequestView>& rs) {
  json data = json::array();
  for (const LiveRequestView& r : rs) {
    data.push_back({{"id", r.id},
                    {"request_id", r.info.request_id},
                    {"object", "spillway.request"},
                    {"endpoint", r.endpoint},
                    {"state", r.state},
                    {"generated_tokens", r.generated},
                    {"age_s", r.age_s},
                    {"spillway", spillway_json(r.info)}});
  }
  return dump({{"object", "list"}, {"data", data}});
}

// A list object as OpenAI's list endpoints answer ({"object":"list","data"}).
std::string render_reservations(const std::vector<gateway::ReservationInfo>& rs) {
  return dump({{"object", "list"}, {"data", reservations_json(rs)}});
}

std::string render_cancel(uint64_t request_id, bool cancelled, const std::string& state) {
  return dump({{"id", request_id}, {"object", "spillway.request"}, {"cancelled", cancelled}, {"state", state}});
}

std::optional<ApiError> parse_reservation_request(std::string_view body, ReservationRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  SPW_TRY_FIELD(refuse_unknown(obj, "POST /v1/reservations", {kReservationFields}));
  auto n = obj.find("name");
  if (n == obj.end() || !n->is_string() || n->get<std::string>().empty() || n->get<std::string>().size() > 64) {
    return bad("name", "'name' is required: a string of 1 to 64 characters naming the service", "invalid_value");
  }
  out.name = n->get<std::string>();
  auto b = obj.find("bytes");
  if (b == obj.end())
    return bad("bytes", "'bytes' is required (an integer, or a size such as \"2GiB\")", "missing_required_parameter");
  if (b->is_number_unsigned()) {
    out.bytes = b->get<uint64_t>();
    // The same domain as a size string (core/size.h): no size a sum could wrap on.
    if (Status st = check_byte_size(out.bytes, "'bytes'"); !st.ok()) return bad("bytes", st.message(), "invalid_value");
  } else if (b->is_string()) {
    auto v = parse_memory_size(b->get<std::string>());
    if (!v.ok()) {  // its message quotes the whole string
      return bad("bytes", "'bytes' must be a positive integer or a size such as \"2GiB\" or \"512M\", got '" +
                              input_excerpt(b->get<std::string>()) + "'");
    }
    out.bytes = *v;
  } else {
    return bad("bytes", "'bytes' must be a positive integer or a size string such as \"2GiB\"", "invalid_value");
  }
  if (out.bytes == 0) return bad("bytes", "'bytes' must be > 0", "invalid_value");
  auto t = obj.find("ttl_s");
  if (t != obj.end() && !t->is_null()) {
    if (!t->is_number() || !(t->get<double>() > 0) || t->get<double>() > 86400) {
      return bad("ttl_s", "'ttl_s' must be a number of seconds in (0, 86400]", "invalid_value");
    }
    out.ttl_s = t->get<double>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_resume_request(std::string_view body, ResumeBody& out) {
  json obj;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return std::nullopt;  // empty: defaults
  SPW_TRY_FIELD(parse_object(body, obj));
  SPW_TRY_FIELD(refuse_unknown(obj, "POST /v1/requests/{id}/resume", {kResumeFields}));
  for (const auto& [key, value] : obj.items()) {
    if (key == "received_text") {
      if (!value.is_string()) return wrong_type("received_text", "a string", value);
      out.received_text = value.get<std::string>();
    } else if (key == "stream") {
      if (!value.is_boolean()) return wrong_type("stream", "a boolean", value);
      out.stream = value.get<bool>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_fault_request(std::string_view body, FaultRequest& out) {
  json obj;
  SPW_TRY_FIELD(parse_object(body, obj));
  SPW_TRY_FIELD(refuse_unknown(obj, "POST /v1/admin/faults", {kFaultFields}));
  auto k = obj.find("kind");
  std::string names;
  for (int i = 0; i < kNumFaultKinds; ++i) {
    names += (i ? ", " : "") + std::string(fault_kind_name(static_cast<FaultKind>(i)));
  }
  if (k == obj.end() || k->is_null())
    return bad("kind", "'kind' is required: one of " + names, "missing_required_parameter");
  if (!k->is_string()) return wrong_type("kind", "a string", *k);
  const std::optional<FaultKind> kind = fault_kind_from_name(k->get<std::string>());
  if (!kind) {
    return bad("kind", "'kind' must be one of " + names + ", got \"" + input_excerpt(k->get<std::string>()) + "\"");
  }
  out.spec.kind = *kind;
  std::optional<std::string> path;
  SPW_TRY_FIELD(get_string(obj, "path", path));
  out.path = path.value_or("");
  std::optional<int64_t> after, count;
  SPW_TRY_FIELD(get_int(obj, "after_submits", after));
  if (after && *after < 0) return bad("after_submits", "'after_submits' must be >= 0");
  out.spec.after = after.value_or(0);
  SPW_TRY_FIELD(get_int(obj, "count", count));
  if (count && *count < 0) return bad("count", "'count' must be >= 0 (0: until disarmed)");
  out.spec.count = count.value_or(1);
  std::optional<double> factor;
  SPW_TRY_FIELD(get_number(obj, "factor", factor));
  if (*kind == FaultKind::kSlow) {
    if (!factor)
      return bad("factor", "'factor' is required for a slow fault: a number in (1, 1000]",
                 "missing_required_parameter");
    SPW_TRY_FIELD(in_range("factor", *factor, 1.0, 1000.0, true));
    out.spec.factor = *factor;
  } else if (factor) {
    return bad("factor", "'factor' applies to slow faults only");
  }
  return std::nullopt;
}

namespace {

json fault_json(const FaultView& f) {
  const FaultSpec& s = f.fault.spec;
  return {{"id", f.fault.id},
          {"object", "spillway.fault"},
          {"kind", std::string(fault_kind_name(s.kind))},
          {"path", f.path},
          {"device", f.device},
          {"after_submits", s.after},
          {"count", s.count},
          {"factor", s.kind == FaultKind::kSlow ? json(s.factor) : json(nullptr)},
          {"seen", f.fault.seen},
          {"fired", f.fault.fired},
          {"spent", f.fault.spent()}};
}

}  // namespace

std::string render_fault(const FaultView& f) { return dump(fault_json(f)); }

std::string render_faults(const std::vector<FaultView>& fs) {
  json data = json::array();
  for (const FaultView& f : fs) data.push_back(fault_json(f));
  return dump(json{{"object", "list"}, {"data", data}});
}

std::string render_disarmed(size_t n) { return dump(json{{"disarmed", n}}); }

}  // namespace spw::http
