// Spillway's own JSON: the bodies of the endpoints that are not OpenAI's
// (GET /health, GET /v1/status, POST /v1/quote, /v1/reservations, GET and
// DELETE /v1/requests[/{id}], POST /v1/requests/{id}/resume,
// /v1/admin/faults) and the admission decision the journal stores. The OpenAI
// wire format (completions, chat completions, stream chunks, errors) is
// http/openai.h's; errors here are its ApiError, rendered by render_error.
//
// Contract: parse_*_request() read a request body as strictly as openai.h's
// parsers do (one JSON object, no NUL byte, UTF-8 only: 400 invalid_json; a
// field not listed in the endpoint's k*Fields: 400 unknown_parameter naming
// it; a field of the wrong type or out of range: 400 naming it in `param`),
// quoting client input only as input_excerpt(); nullopt on success, `out`
// filled. render_*() produce the response bodies, field names and shapes as
// documented beside each below. Both keep JSON inside this library (strings
// in, strings out).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/gateway.h"
#include "http/openai.h"
#include "http/transport.h"
#include "journal/journal.h"

namespace spw::http {

// POST /v1/quote.
std::string render_quote(const gateway::Quote& q);
// GET /v1/status.
// http: the transport's counters, as "http" (connections open, accepted,
// over_limit, refused, timed_out, client_errors, disconnects,
// workers_running); null: no "http" object.
std::string render_status(const gateway::GatewayStatus& s, const TransportStats* http = nullptr);
std::string render_reservation(const gateway::ReservationInfo& r);
// GET /v1/reservations: {"object": "list", "data": [...]}.
std::string render_reservations(const std::vector<gateway::ReservationInfo>& rs);
// A request in flight as GET /v1/requests lists it: where it runs and under
// which decision (info: the spillway object, with queue_position and
// estimated_delay_ms as of now, not as at acceptance), its state and tokens.
struct LiveRequestView {
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  std::string endpoint;  // "completions" or "chat.completions"
  std::string state;     // "queued", "running"
  SpillwayInfo info;
  int32_t generated = 0;
  double age_s = 0;  // since acceptance
};
// GET /v1/requests: {"object": "list", "data": [...]}, oldest first.
std::string render_live_requests(const std::vector<LiveRequestView>& rs);
// DELETE /v1/requests/{id}.
std::string render_cancel(uint64_t request_id, bool cancelled, const std::string& state);
// POST /v1/reservations body: {"name","bytes","ttl_s"} (bytes: integer or
// "2GiB"-style string; other fields: unknown_parameter); nullopt on success.
inline constexpr std::string_view kReservationFields[] = {"name", "bytes", "ttl_s"};
struct ReservationRequest {
  std::string name;
  uint64_t bytes = 0;
  double ttl_s = 30;
};
std::optional<ApiError> parse_reservation_request(std::string_view body, ReservationRequest& out);

// POST /v1/requests/{id}/resume body: {"received_text": the text the client
// already has of the request's output (default ""), "stream": bool (default
// false)}; other fields are refused (400 unknown_parameter naming them).
inline constexpr std::string_view kResumeFields[] = {"received_text", "stream"};
struct ResumeBody {
  std::string received_text;
  bool stream = false;
};
std::optional<ApiError> parse_resume_request(std::string_view body, ResumeBody& out);

// POST /v1/admin/faults body: {"kind", "path", "after_submits", "count",
// "factor"}. kind is required and one of fault_kind_name()'s names; path
// (default: empty = the first path) a string; after_submits and count
// integers >= 0 (defaults 0 and 1; count 0 = until disarmed); factor a number
// in (1, 1000], required for "slow" and refused for the other kinds. A 400
// names the field in `param`; other fields: unknown_parameter.
inline constexpr std::string_view kFaultFields[] = {"kind", "path", "after_submits", "count", "factor"};
struct FaultRequest {
  FaultSpec spec;
  std::string path;  // "" = the first path
};
std::optional<ApiError> parse_fault_request(std::string_view body, FaultRequest& out);
// One armed fault as the admin API shows it, with the path and device it is
// armed on.
struct FaultView {
  std::string path;
  std::string device;
  ArmedFault fault;
};
std::string render_fault(const FaultView& f);
// GET: {"object":"list","data":[fault...]}; DELETE: {"disarmed": n}.
std::string render_faults(const std::vector<FaultView>& fs);
std::string render_disarmed(size_t n);

// Host memory as the server's ledger and probes see it (all bytes). Absent
// from /health when the server was built without a ledger (tests).
struct HealthMemory {
  uint64_t budget = 0;     // the ledger's limit: what the server may hold
  uint64_t reserved = 0;   // our reservations (the serving plan)
  uint64_t available = 0;  // budget left for more
  std::string bound_by;    // "MemAvailable", "cgroup" or "cap"
  std::optional<uint64_t> process_rss, process_rss_anon, process_rss_file;  // observed; null = unknown
};

// Device memory as the server's device ledger and the Vulkan allocator see it
// (bytes). Absent from /health when no layer runs on a GPU.
struct HealthDeviceMemory {
  std::string device;  // e.g. "vulkan:0 (llvmpipe ...)"
  bool healthy = true;
  std::string health_reason;        // empty when healthy
  uint64_t capacity = 0;            // the ledger's capacity: --device-memory or the largest device-local heap
  uint64_t headroom = 0;            // kept free for kernels, the driver and co-tenants' bursts
  uint64_t reserved = 0;            // our reservations (the serving plan)
  uint64_t co_tenant_reserved = 0;  // declared by --co-tenant
  uint64_t others_observed = 0;     // observed use not ours beyond the co-tenants' reservations
  uint64_t available = 0;
  // The last heap reading (VK_EXT_memory_budget): bytes used on the heap by
  // everyone; null with `observed_unknown` saying why.
  std::optional<uint64_t> observed_heap_used;
  std::string observed_unknown;
  uint64_t allocated = 0;  // the allocator's live bytes
  uint64_t allocated_peak = 0;
  std::vector<std::pair<std::string, uint64_t>> allocated_by_category;  // weights, kv, scratch, staging
};

struct HealthInfo {
  std::string model;
  std::string backend = "cpu";
  int32_t queue_depth = 0;
  int32_t queue_capacity = 0;
  int32_t running = 0;
  int32_t workers = 0;
  int32_t n_ctx = 0;
  std::string chat_template;  // empty: none
  std::optional<HealthMemory> memory;
  std::optional<HealthDeviceMemory> device_memory;
};
std::string render_health(const HealthInfo& h);
// The admission decision as the journal stores it (Journal::set_admission)
// and GET /v1/requests/{id} shows it: a JSON object {"kind","path"|null,
// "reason","failure" (failure_reason_name)|null,"http_status","degraded",
// "limits":{"n_ctx","prompt_tokens","max_tokens","max_tokens_requested",
// "max_tokens_clamped","shrunk","kv_blocks"},"queue_position",
// "estimated_delay_ms","predicted_ttft_ms","predicted_total_ms" (null when
// unknown),"pressure","verdicts":[{"path","eligible","reason"}]}, plus
// "retry_after_s" on a reject (null unless 429). Field names as /v1/quote's.
// A string, so that no JSON type escapes this library.
std::string render_decision(const admission::Decision& d);

// The route a stored decision (render_decision's JSON, the journal's
// admission column) gave: for a replayed result's spillway object. Fields
// the document lacks stay empty (false); an unparsable one gives all empty.
struct StoredRoute {
  std::string path, decision, reason;
  bool degraded = false;
};
StoredRoute stored_route(std::string_view decision_json);
// GET /v1/requests/{id}: {"id","object":"spillway.request","state","terminal",
// "resumable","endpoint","idempotency_key","created_ms","updated_ms",
// "attempts","placement","finish_reason","text","usage",
// "error":{"code","message"}|null,"admission":render_decision's object|null,
// "body":{"bytes","sha256","kept","refusal_reason"},"owner":API key label|null}.
// Times in Unix ms. "id" is whatever the caller put in r.id (the server puts
// the public id there).
std::string render_request_record(const journal::Record& r);

}  // namespace spw::http
