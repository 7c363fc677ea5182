// Checker: a drill's History -> the figures and the gates.
//
// The checker is a pure function of a History (drill/history.h); the live
// drill, the simulation and a saved report.json all go through it, so a gate
// means the same thing everywhere.
//
// A request, for the counts below, is the operations joined by `continues`
// (resume, retry, cancel of an earlier operation) or by a shared request id
// (an idempotent retry answered with the id it already had): one story from
// the client's side, however many HTTP calls it took. Texts received across a
// request's operations concatenate (a resume appends; a retry that ran starts
// over; a replay is the whole stored result).
// Figures (all from the history; none is taken from the server's own
// counters without a client-side cross-check):
//   - success rate: accepted requests whose client ended with their whole
//     text (counting resumes and idempotent retries) / accepted requests;
//   - lost: accepted requests (the server gave a request id or began a
//     response) with no terminal record the client can read at the end (the
//     journal's final record missing, or not terminal, and no ok operation);
//   - duplicated side effects (request ids): the text the client received
//     (summed over the operation and its continuations) is not one copy of
//     the journal's text (equal when the client's operation ended ok, else a
//     prefix of it; the clean reference stands in when the journal has no
//     finished text), or a replay's text differs from the journal's, or an
//     Idempotency-Key under which more than one generation ran (a retry that
//     ran again instead of replaying after the first ended ok, or two request
//     ids for one key), or the journal counts more runs (FinalRecord::runs)
//     than a request whose first operation ended ok needed (1 + its
//     failovers + migrations);
//   - token equivalence: ok greedy requests whose text equals the clean
//     reference run's text for their prompt_key (those whose key has no
//     reference are not counted);
//   - latency p50/p95/p99 (ms, ok operations, invoke to completion) by class
//     and by path; time to first token likewise;
//   - queue depth (max) and queue age (max oldest_queued_s) by path;
//   - peak device reservation (device_used) against the reserve line
//     (device_limit), and the admissions to GPU-side paths whose recorded
//     pressure exceeded the line (FinalRecord::admitted_under_reserve false);
//   - peak host memory (max of host_reserved and host_rss) against host_budget;
//   - recovery time per device fault event (events "alloc_fail",
//     "device_lost"): the fault (when it fired: the first "fault_fired"
//     event naming its kind after it was armed, or the breaker's opening if
//     seen earlier (the drill polls the armed faults); without one, when it
//     was armed) -> the first sample or event showing the
//     breaker open (a path's breaker not "closed", or an event
//     "breaker_open") -> the first token served on the CPU path after the
//     fault (an operation on path or placement "cpu" whose invoke time +
//     ttft_ms is at or after the fault; ms; -1 when it did not happen); per
//     "kill" event: the kill -> the "restart" event -> the first token served
//     on any path after the restart;
//   - degraded visibility: degraded ok/fail operations whose response showed
//     it (Op::degraded_shown) / degraded operations.
// Gates (each passes or fails with the request ids involved):
//   no_lost, no_duplicates, host_budget (peak host <= budget, when a budget
//   was sampled), reserve_line (no GPU-side admission over the line), and
//   degraded_visible (every degraded response showed it).
// Thread safety: pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "drill/history.h"

namespace spw::drill {

struct Percentiles {
  int64_t n = 0;
  double p50 = 0, p95 = 0, p99 = 0, max = 0;
};

struct Gate {
  std::string name;        // no_lost | no_duplicates | host_budget | reserve_line | degraded_visible
  bool passed = true;
  std::string detail;      // the figures behind it, one sentence
  std::vector<int64_t> request_ids;  // the requests involved when it failed
};

struct Recovery {
  double fault_ms = 0;
  std::string fault;       // the event kind
  double breaker_open_ms = -1;   // from the fault (-1: not seen)
  double first_cpu_token_ms = -1;  // from the fault (-1: none)
  // A kill: from the kill to the "restart" event, and to the first token any
  // path served after the restart (-1: not seen). Device faults: restart_ms
  // is -1 and first_token_ms is the first token on any path after the fault.
  double restart_ms = -1;
  double first_token_ms = -1;
};

struct Figures {
  int64_t operations = 0;        // invoke/complete pairs
  int64_t accepted = 0;
  int64_t succeeded = 0;
  double success_rate = 0;       // succeeded / accepted (1 when none accepted)
  int64_t refused = 0;           // definite refusals before acceptance (429/503/400)
  int64_t lost = 0;
  int64_t duplicated = 0;
  int64_t equivalence_checked = 0, equivalence_equal = 0;
  int64_t degraded = 0, degraded_shown = 0;
  int64_t cancelled = 0, resumed = 0, replayed = 0;
  std::map<std::string, Percentiles> latency_by_class, latency_by_path;
  std::map<std::string, Percentiles> ttft_by_path;
  std::map<std::string, int32_t> max_queue_depth;   // by path
  std::map<std::string, double> max_queue_age_s;    // by path
  uint64_t device_peak = 0, device_limit = 0, device_capacity = 0;
  uint64_t host_peak = 0, host_budget = 0;
  std::vector<Recovery> recoveries;
};

struct CheckResult {
  std::string scenario, mode;
  uint64_t seed = 0;
  Figures figures;
  std::vector<Gate> gates;
  bool passed = true;            // every gate passed
  std::vector<std::string> failed_gates() const;
};

CheckResult check(const History& h);

// Percentiles of `values` (nearest-rank); n = 0 gives zeros.
Percentiles percentiles(std::vector<double> values);

}  // namespace spw::drill
