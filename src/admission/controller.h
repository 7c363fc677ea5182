// Admission controller: the per-request decision over a server's execution
// paths, as a pure function of (request shape, path snapshots, policy).
//
// Contract: decide(request, paths, policy) never allocates device memory,
// never blocks and reads no clock; the same inputs give the same Decision.
// `paths` are in preference order: the first-choice path first (the GPU path
// when there is one), then offload paths (hybrid), then the CPU path. For each
// path it checks, in order, and records why a path was passed over:
//   1. usable: the path is up (not out of service);
//   2. context: prompt_tokens < n_ctx (else the path cannot serve the prompt);
//      max_tokens is clamped to the room left (n_ctx - prompt_tokens);
//   3. KV blocks: blocks(prompt + max_tokens) <= the path's whole KV budget
//      (a prompt that can never fit there is sent elsewhere BEFORE it is
//      accepted, never failed mid-generation);
//   4. memory pressure: the path's ledger used / limit <= policy threshold,
//      with the request's own extra bytes (memory not already in the plan)
//      added to used; over it the path is skipped (co-tenants grew, observed
//      use rose): later decisions move, running requests are untouched;
//   5. queue room: queued < queue_capacity;
//   6. wait: the estimated start delay (see estimate_start_delay) must be
//      <= policy.max_delay_s on the first-choice path; a path that can start
//      within it is taken (admit when the delay is ~0, delay otherwise).
// The first path passing all checks wins: kAdmit/kDelay on the first path,
// kOffload on a hybrid path, kRedirect on a CPU path. Before leaving the first
// path for a KV reason, when shrinking is allowed (request or policy) and the
// path could run at least policy.min_shrink_tokens, max_tokens is lowered to
// what fits now: kShrink. When no path passes: kReject with 429 (every path
// that could serve it has a full queue; retry_after_s from the queue's ETA)
// or 503 (no path can serve it: context, KV, pressure or out of service),
// reason naming each path's refusal; but a prompt that no path's context
// can hold (out of service or not) is 400 kContextFull: no retry helps.
// Estimated times come from each path's measured rates: prefill tokens/s,
// decode tokens/s and the mean share of max_tokens requests really generate.
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw::admission {

enum class DecisionKind { kAdmit, kDelay, kShrink, kOffload, kRedirect, kReject };
std::string_view decision_kind_name(DecisionKind k);  // "admit", "delay", ...

enum class PathRole { kPrimary, kOffload, kFallback };
std::string_view path_role_name(PathRole r);

// What the request asks for, after tokenization.
struct RequestShape {
  int32_t prompt_tokens = 0;
  std::optional<int32_t> max_tokens;  // nullopt: up to the end of the context
  bool allow_shrink = false;          // X-Spillway-Allow-Shrink: true
  // OpenAI's n: choices sharing the prompt's KV (kv_blocks_for_choices); the
  // run's time is priced as n x max_tokens generated tokens.
  int32_t n = 1;
};

// A unit of work a path already holds (for the ETA).
struct WorkItem {
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int32_t generated = 0;   // tokens so far (running)
  int32_t kv_blocks = 0;   // blocks it holds (running) or will take (queued)
  double elapsed_s = 0;    // running: time since it started
};

// Measured speeds of a path (fitted over recent finished requests; `measured`
// false while only the configured prior is known). A token's cost grows with
// its position (attention reads every earlier position's K/V), so a path's
// speed is a line, not a number: a token at position p costs
//   1 / tps + s_per_pos * p   seconds,
// for prefill and decode separately. With s_per_pos 0 it is a flat rate.
struct PathRates {
  double prefill_tps = 0;     // prompt tokens per second at the start of the context
  double decode_tps = 0;      // generated tokens per second, per request, at position 0
  double completion_share = 1.0;  // mean completion_tokens / max_tokens
  uint64_t samples = 0;
  bool measured = false;
  double prefill_s_per_pos = 0;  // seconds added per prompt token per earlier position
  double decode_s_per_pos = 0;   // seconds added per generated token per earlier position
};

// Seconds to prefill `prompt_tokens` (positions 0..P-1) and to generate
// `tokens` tokens after a prompt of `prompt_tokens`, starting at the
// `from`-th generated token (positions P+from..P+tokens-1). Infinity when the
// rates are unknown (<= 0).
double prefill_s(const PathRates& r, int32_t prompt_tokens);
double decode_s(const PathRates& r, int32_t prompt_tokens, double from, double tokens);

// The fit behind PathRates: seconds t of a run of n tokens whose positions
// sum to s, modelled as t = n * c + s * d (c = 1 / tps, d = s_per_pos), by
// least squares over the samples with exponentially decaying weights (each
// add() multiplies the older samples' weight by 1 - alpha). A light ridge on
// d keeps the line sane when every sample sat at about the same position;
// d < 0 (noise) falls back to a flat rate.
class CostFit {
 public:
  void add(double n, double s, double t, double alpha);
  bool empty() const { return snn_ <= 0; }
  // tps = 1 / c and s_per_pos = d; false while empty.
  bool solve(double& tps, double& s_per_pos) const;

 private:
  double snn_ = 0, sns_ = 0, sss_ = 0, snt_ = 0, sst_ = 0;
};

// One path as admission sees it at one instant.
struct PathSnapshot {
  std::string name;          // "gpu", "hybrid", "cpu"
  std::string placement;     // "vulkan", "hybrid:2", "cpu"
  std::string model;         // the model that serves on this path
  bool fallback_model = false;  // a different (smaller) model than the first path's
  PathRole role = PathRole::kPrimary;
  bool usable = true;
  std::string unusable_reason;
  int32_t n_ctx = 0;
  int32_t workers = 1;
  int32_t queue_capacity = 0;
  int32_t kv_block_tokens = 16;
  int32_t kv_blocks_total = 0;   // the path's whole KV budget (0: unlimited)
  int32_t kv_blocks_free = 0;    // not held by running requests
  std::vector<WorkItem> running;
  std::vector<WorkItem> queued;  // in queue order
  // Memory ledger of the path's device (the GPU's, or the host's for CPU).
  std::string ledger;            // "vulkan:0", "host"
  uint64_t ledger_limit = 0;     // capacity - headroom (0: no ledger)
  uint64_t ledger_used = 0;      // ours + max(co-tenants, observed others)
  uint64_t ledger_cotenants = 0;
  // What a free-memory reading alone would say (the naive check a gateway
  // without a plan makes; Overflow::kNaive in gateway.h): the ledger's
  // capacity with no headroom, and used = our reservations + observed use by
  // others, without co-tenants' declarations.
  uint64_t ledger_capacity = 0;
  uint64_t ledger_reading_used = 0;
  // A request's memory beyond the path's committed plan. 0 for the gateway's
  // paths today: their KV pools and scratch are allocated at start, and a
  // request's KV is the KV gate's business (kv_blocks_*).
  uint64_t request_extra_bytes = 0;
  PathRates rates;
  // Seconds until the path can start any work: the predicted load time of an
  // on-demand replica that is not loaded yet (0: ready). Added to every wait.
  double startup_s = 0;
};

struct AdmissionPolicy {
  // Largest used/limit a path may be at (with the request) to take new work.
  double pressure_threshold = 1.0;
  // Longest estimated wait for the first-choice path before leaving it.
  double max_delay_s = 2.0;
  // A wait below this is "admit" rather than "delay".
  double admit_delay_s = 0.05;
  bool allow_shrink = false;     // shrink without the request asking
  int32_t min_shrink_tokens = 16;
};

// Predicted timings of a request on one path.
struct Timing {
  double delay_s = 0;  // until a worker starts it
  double ttft_s = 0;   // delay + prefill
  double total_s = 0;  // ttft + expected decode
};

struct PathVerdict {
  std::string path;
  bool eligible = false;
  std::string reason;  // why not (or "fits")
  Timing timing;
};

struct Decision {
  DecisionKind kind = DecisionKind::kReject;
  int32_t path_index = -1;   // into the `paths` given; -1 for reject
  std::string path;          // its name
  std::string reason;        // one sentence with the figures
  FailureReason failure = FailureReason::kNone;  // reject: kQueueFull, kNoPath or kContextFull
  int http_status = 200;     // reject: 429, 503 or 400
  double retry_after_s = 0;  // reject 429
  // Limits applied (on the chosen path).
  int32_t n_ctx = 0;
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  std::optional<int32_t> max_tokens_requested;
  bool max_tokens_clamped = false;  // requested more than the context leaves
  bool shrunk = false;              // lowered to fit memory (kShrink)
  int32_t kv_blocks = 0;            // blocks for prompt + max_tokens
  int32_t queue_position = 0;       // 1-based position at acceptance (0: starts at once)
  Timing timing;
  double pressure = 0;              // chosen path's ledger used / limit with the request
  std::vector<PathVerdict> verdicts;  // every path considered, in order
  bool degraded() const { return kind == DecisionKind::kRedirect || kind == DecisionKind::kOffload; }
};

Decision decide(const RequestShape& request, const std::vector<PathSnapshot>& paths, const AdmissionPolicy& policy);

// A path's ledger used / limit with the request's extra bytes (check 4 of
// decide(); Decision::pressure); 0 for a path without a ledger.
double pressure_of(const PathSnapshot& path);

// Blocks for n_tokens positions.
int32_t kv_blocks_for(int32_t n_tokens, int32_t block_tokens);
// n choices of max_tokens after one prompt (engine/generate.h ChoiceGroup):
// the blocks before the one holding the prompt's last position once, and
// per choice the blocks from there to prompt + max_tokens (its copy of that
// block, which it evaluates again for its logits, and its generated tokens').
// n = 1: kv_blocks_for(prompt + max_tokens).
int32_t kv_blocks_for_choices(int32_t prompt_tokens, int32_t max_tokens, int32_t block_tokens, int32_t n);

// When a request needing `kv_blocks` would start on `path` if queued behind
// its current work: an event simulation of the path's FIFO queue with
// `workers` slots and the KV budget, each item lasting prompt / prefill_tps +
// expected tokens / decode_tps (expected = max_tokens * completion_share;
// running items count what is left), plus the path's startup_s. Seconds from
// now; infinity when the rates are unknown (0) and there is work ahead.
double estimate_start_delay(const PathSnapshot& path, int32_t kv_blocks);
// Prefill + expected decode of a request on the path, seconds.
double estimate_run_s(const PathRates& rates, int32_t prompt_tokens, int32_t max_tokens);

}  // namespace spw::admission
