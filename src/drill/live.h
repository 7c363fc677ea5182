// Live drill: a Scenario (drill/scenario.h) replayed against a real
// `spillway serve` process, with real HTTP clients, a real competing GPU
// workload (`spillway occupy`, declared through `spillway reserve` or not)
// and a nemesis that arms faults through the admin API and kill -9s the
// server; everything every client saw is recorded as a History
// (drill/history.h) for the checker.
//
// run_live(scenario, options):
//   1. Server: options.server_url, or (empty) its own `spillway serve` from
//      scenario.server: a free port (--port 0, read from the ready line), a
//      journal and logs in options.work_dir, a random --admin-token,
//      --device-memory, --overflow options.overflow, then
//      scenario.server.args verbatim. Waits for GET /health/ready.
//      Against an external server (server_url) there is no admin token, no
//      kill and no RSS: device faults and kills are recorded as events saying
//      they were skipped and why.
//   2. Reference: each class's prompt once, not streamed, greedy (seeded
//      classes with kReferenceSeed), no faults: History::reference by
//      prompt_key ("<class>/greedy" or "<class>/seed=<n>").
//   3. Phases in order. Per load entry `concurrency` client threads take
//      Poisson arrivals (exponential gaps at rate_per_s, from scenario.seed)
//      until the phase ends; each request is an invoke and one completion
//      (ok: the whole text; fail: an HTTP error or a stream error event;
//      info: no answer or a cut connection). An interrupted accepted request
//      is continued: its record is read after /health/ready answers again,
//      then resumed (POST /v1/requests/{id}/resume with the text received, a
//      new op f="resume" continuing it) or, for an idempotent request without
//      a checkpoint, sent again under its key (f="retry"). A share of the
//      idempotent ok requests (retry_share) is sent a second time with the
//      same key: the server must replay (op f="retry").
//      A sampler thread reads GET /v1/status every 250 ms into a Sample (and
//      the server's VmRSS when we started it); up=false when it does not
//      answer; breaker state changes become events.
//      The nemesis brings the competing workload to each phase's
//      cotenant_bytes (declared: one `spillway reserve ... -- spillway occupy`
//      process per increment, killed newest first to shrink) and
//      undeclared_bytes (`spillway occupy` alone), and fires each fault at
//      its second: pressure (declared co-tenant to `bytes`), alloc_fail and
//      device_lost (POST /v1/admin/faults; device_lost only once a stream of
//      its own runs on that path, so it lands mid-generation; alloc_fail
//      followed by a probe request whose prompt nearly fills the path's
//      context, whose prefill makes the first device allocation since start
//      and so meets the fault before generation), cancel_queued
//      (its own streams until one waits in the CPU path's queue, DELETE it:
//      op f="cancel"), kill (SIGKILL, restart on the same journal and port
//      after restart_after_s).
//   4. Drain: at most scenario.drain_s for client threads to end; then
//      GET /v1/requests/{id} of every request id seen -> History::finals.
//      Everything started is stopped (co-tenants, the server).
// Every wait is bounded (HTTP connect/read timeouts, polls with deadlines);
// all traffic is on loopback.
// Failure: the Result is an error only when the drill could not run at all
// (binary missing, server did not start or become ready, work_dir not
// writable); faults, refusals and lost requests during the run are data in
// the History, never errors. No exception escapes.
// Thread safety: run_live may run once at a time per work_dir; callbacks are
// called from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "drill/history.h"
#include "drill/scenario.h"

namespace spw::drill {

// The seed of seeded (non-greedy) classes' reference requests.
inline constexpr uint64_t kReferenceSeed = 1234;

struct LiveOptions {
  // Empty: start our own server; else drive this one (http://HOST:PORT).
  std::string server_url;
  // The `spillway` binary: serve, reserve and occupy are run from it.
  std::string spillway_binary;
  // Journal, server and co-tenant logs go here (created).
  std::string work_dir;
  // Relative paths of scenario.server.model are tried from the current
  // directory, then from each of these (the scenario file's folder...).
  std::vector<std::string> search_dirs;
  // `spillway serve --overflow`: planned | none | naive. Also History::mode
  // ("live" for planned).
  std::string overflow = "planned";
  // Called after each phase with the history so far (for --step); may block.
  std::function<void(const std::string& phase, const History& interim)> on_phase_end;
  // Progress lines (one per phase, fault, restart); null: silent.
  std::function<void(const std::string&)> log;
  double ready_timeout_s = 90;   // server start to /health/ready
  double sample_period_s = 0.25;
};

Result<History> run_live(const Scenario& scenario, const LiveOptions& options);

// Prompt key of a request: requests with one key expect one text.
std::string prompt_key(const std::string& cls, bool greedy, uint64_t seed);

}  // namespace spw::drill
