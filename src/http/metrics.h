// GET /metrics: the gateway's state in the Prometheus text exposition format
// (version 0.0.4), for scraping.
//
// Contract: render_metrics(status) writes, from one GatewayStatus snapshot,
// one `# HELP` and one `# TYPE` line per family followed by its samples, all
// names prefixed `spillway_`, label values escaped (\\, \", \n). Families:
//   per path (label path): requests_total{outcome} (done, cancelled, failed,
//     failed_over, adopted, rejected; the server's own warm-up and breaker
//     probes included, as in /v1/status), queue_depth, queue_capacity,
//     queue_oldest_seconds, running, workers, kv_blocks{state} (free, total),
//     and the histograms queue_wait_seconds, time_to_first_token_seconds
//     (from acceptance, queue included) and decode_tokens_per_second, of
//     client requests only;
//   decisions_total{kind} (admit, delay, shrink, offload, redirect, reject,
//     failover);
//   per ledger (label ledger): ledger_bytes{kind} (capacity, headroom,
//     limit, used, observed, others, and reserved_<owner>);
//   per device breaker (label device): breaker_state{state} (1 for the
//     current one of closed / open / half_open, else 0), breaker_trips_total,
//     device_faults_total, device_reinitializations_total,
//     device_health_failures_total;
//   per catalogue model's path (labels model, path; gateway/residency.h):
//     model_loaded
//     (1 / 0), model_memory_bytes, model_loads_total, model_evictions_total,
//     model_load_seconds (the last load, once measured);
//   reservations (co-tenant leases held) and ready (1 while a path accepts);
//   with the transport's counters: http_connections_open,
//   http_connections_total{outcome} (accepted, over_limit, refused),
//   http_timeouts_total, http_client_errors_total, http_disconnects_total;
//   per path with several workers: batch_steps_total and
//   batch_tokens_total{kind} (decode, prompt) of continuous batching;
//   with a journal: journal_rows{state} and journal_bytes{file} (db, wal).
// Counters are since the server started; a scrape never changes anything.
// Thread safety: a pure function of its argument.
#pragma once

#include <string>

#include "gateway/gateway.h"
#include "http/transport.h"
#include "journal/journal.h"

namespace spw::http {

std::string render_metrics(const gateway::GatewayStatus& status, const TransportStats* http = nullptr,
                           const journal::JournalStats* journal = nullptr);

}  // namespace spw::http
