#include "http/metrics.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

namespace spw::http {
namespace {

std::string escape(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // The shortest form that reads back as the same double (1.5, not
  // 1.5000000000000000).
  char buf[40];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string labels(const Labels& l) {
  if (l.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < l.size(); ++i) {
    if (i) out += ",";
    out += l[i].first + "=\"" + escape(l[i].second) + "\"";
  }
  return out + "}";
}

// Families are written whole (HELP, TYPE, samples), in the order declared.
class Writer {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    name_ = "spillway_" + name;
    out_ += "# HELP " + name_ + " " + help + "\n# TYPE " + name_ + " " + type + "\n";
  }
  void sample(const Labels& l, double v, const std::string& suffix = "") {
    out_ += name_ + suffix + labels(l) + " " + number(v) + "\n";
  }
  void histogram(const Labels& l, const Histogram& h) {
    const std::vector<uint64_t> cum = h.cumulative();
    for (size_t i = 0; i < cum.size(); ++i) {
      Labels with = l;
      with.emplace_back("le", i < h.bounds().size() ? number(h.bounds()[i]) : "+Inf");
      sample(with, static_cast<double>(cum[i]), "_bucket");
    }
    sample(l, h.sum(), "_sum");
    sample(l, static_cast<double>(h.count()), "_count");
  }
  std::string take() { return std::move(out_); }

 private:
  std::string name_;
  std::string out_;
};

}  // namespace

std::string render_metrics(const gateway::GatewayStatus& s, const TransportStats* http,
                           const journal::JournalStats* journal) {
  Writer w;
  const auto& paths = s.paths;
  w.family("requests_total", "counter",
           "Requests by path and how they ended (or moved); the server's own (warm-up, breaker probes) included.");
  for (const auto& p : paths) {
    const serve::SchedulerStats& st = p.stats;
    for (const auto& [outcome, n] : std::vector<std::pair<const char*, uint64_t>>{
             {"done", st.done}, {"cancelled", st.cancelled}, {"failed", st.failed},
             {"failed_over", st.failed_over}, {"adopted", st.adopted}, {"rejected", st.rejected}}) {
      w.sample({{"path", p.name}, {"outcome", outcome}}, static_cast<double>(n));
    }
  }
  auto per_path = [&](const char* name, const char* help, auto value) {
    w.family(name, "gauge", help);
    for (const auto& p : paths) w.sample({{"path", p.name}}, value(p));
  };
  per_path("queue_depth", "Requests waiting in the path's queue.",
           [](const gateway::PathStatus& p) { return double(p.queue_depth); });
  per_path("queue_capacity", "Requests the path's queue may hold.",
           [](const gateway::PathStatus& p) { return double(p.queue_capacity); });
  per_path("queue_oldest_seconds", "Age of the oldest queued request (0: none).",
           [](const gateway::PathStatus& p) { return p.oldest_queued_s; });
  per_path("running", "Requests generating on the path now.",
           [](const gateway::PathStatus& p) { return double(p.running); });
  per_path("workers", "Requests the path generates at once at most.",
           [](const gateway::PathStatus& p) { return double(p.workers); });
  w.family("kv_blocks", "gauge", "The path's KV pool in blocks (free or total; 0 total: not gated).");
  for (const auto& p : paths) {
    w.sample({{"path", p.name}, {"state", "free"}}, p.kv_blocks_free);
    w.sample({{"path", p.name}, {"state", "total"}}, p.kv_blocks_total);
  }
  w.family("batch_steps_total", "counter", "Batched passes over the weights of the path's workers (continuous batching).");
  for (const auto& p : paths)
    if (p.batching) w.sample({{"path", p.name}}, double(p.batching->steps));
  w.family("batch_tokens_total", "counter", "Tokens through batched passes: decode tokens and prompt tokens.");
  for (const auto& p : paths) {
    if (!p.batching) continue;
    w.sample({{"path", p.name}, {"kind", "decode"}}, double(p.batching->tokens));
    w.sample({{"path", p.name}, {"kind", "prompt"}}, double(p.batching->prompt_tokens));
  }
  w.family("queue_wait_seconds", "histogram", "Time from acceptance to a worker starting the request.");
  for (const auto& p : paths) w.histogram({{"path", p.name}}, p.stats.queue_wait_s);
  w.family("time_to_first_token_seconds", "histogram", "Time from acceptance to the first token, queue included.");
  for (const auto& p : paths) w.histogram({{"path", p.name}}, p.stats.ttft_s);
  w.family("decode_tokens_per_second", "histogram", "Decode rate of each finished request after its first token.");
  for (const auto& p : paths) w.histogram({{"path", p.name}}, p.stats.decode_tps);

  w.family("decisions_total", "counter", "Admission decisions by kind (failover: re-decided after a device fault; migrate: moved at a checkpoint).");
  for (size_t k = 0; k < gateway::kNumDecisionCounters; ++k) {
    w.sample({{"kind", std::string(gateway::decision_counter_name(static_cast<gateway::DecisionCounter>(k)))}},
             static_cast<double>(s.decisions[k]));
  }

  w.family("ledger_bytes", "gauge", "Memory ledgers: capacity, headroom, limit, used, observed, others, reserved by owner.");
  for (const admission::LedgerSnapshot& l : s.ledgers) {
    for (const auto& [kind, v] : std::vector<std::pair<std::string, uint64_t>>{
             {"capacity", l.capacity}, {"headroom", l.headroom}, {"limit", l.limit}, {"used", l.used},
             {"observed", l.observed}, {"others", l.others}}) {
      w.sample({{"ledger", l.name}, {"kind", kind}}, static_cast<double>(v));
    }
    for (int k = 0; k < admission::kNumOwnerKinds; ++k) {
      w.sample({{"ledger", l.name},
                {"kind", "reserved_" + std::string(admission::owner_kind_name(static_cast<admission::OwnerKind>(k)))}},
               static_cast<double>(l.reserved[k]));
    }
  }

  // One breaker and device per device name (the gpu and hybrid paths share them).
  std::vector<const gateway::PathStatus*> devices;
  std::set<std::string> seen;
  for (const auto& p : paths)
    if (p.breaker && seen.insert(p.breaker->name).second) devices.push_back(&p);
  w.family("breaker_state", "gauge", "Circuit breaker per device: 1 for its current state.");
  for (const auto* p : devices) {
    for (auto st : {gateway::BreakerState::kClosed, gateway::BreakerState::kOpen, gateway::BreakerState::kHalfOpen}) {
      w.sample({{"device", p->breaker->name}, {"state", std::string(gateway::breaker_state_name(st))}},
               p->breaker->state == st ? 1.0 : 0.0);
    }
  }
  w.family("breaker_trips_total", "counter", "Times the device's breaker opened.");
  for (const auto* p : devices) w.sample({{"device", p->breaker->name}}, static_cast<double>(p->breaker->trips));
  w.family("device_faults_total", "counter", "Device faults the breaker recorded (requests and health checks).");
  for (const auto* p : devices) w.sample({{"device", p->breaker->name}}, static_cast<double>(p->breaker->faults));
  w.family("device_reinitializations_total", "counter", "Successful re-initialisations of the device.");
  for (const auto* p : devices) {
    w.sample({{"device", p->breaker->name}}, p->device ? static_cast<double>(p->device->reinitializations) : 0.0);
  }
  w.family("device_health_failures_total", "counter", "Failed health checks of the device.");
  for (const auto* p : devices) {
    w.sample({{"device", p->breaker->name}}, p->device ? static_cast<double>(p->device->health_failures) : 0.0);
  }

  // The catalogue's models beyond the served one (gateway/residency.h).
  if (!s.models.empty()) {
    w.family("model_loaded", "gauge", "1 while a catalogue model's path holds its memory (loaded or loading), else 0.");
    for (const auto& m : s.models) w.sample({{"model", m.model}, {"path", m.name}}, m.state == "unloaded" ? 0.0 : 1.0);
    w.family("model_memory_bytes", "gauge", "The catalogue model's memory plan (held while loaded), all ledgers.");
    for (const auto& m : s.models) w.sample({{"model", m.model}, {"path", m.name}}, static_cast<double>(m.bytes));
    w.family("model_loads_total", "counter", "Loads of the catalogue model (reservations of its plan).");
    for (const auto& m : s.models) w.sample({{"model", m.model}, {"path", m.name}}, static_cast<double>(m.loads));
    w.family("model_evictions_total", "counter",
             "Times the catalogue model was given back (for another model's load or its keep-alive).");
    for (const auto& m : s.models) {
      w.sample({{"model", m.model}, {"path", m.name}}, static_cast<double>(m.evictions));
    }
    w.family("model_load_seconds", "gauge", "The catalogue model's last measured load time.");
    for (const auto& m : s.models) {
      if (m.last_load_ms >= 0) w.sample({{"model", m.model}, {"path", m.name}}, m.last_load_ms / 1e3);
    }
  }

  w.family("reservations", "gauge", "Co-tenant reservations held.");
  w.sample({}, static_cast<double>(s.reservations.size()));
  w.family("ready", "gauge", "1 while some path accepts work.");
  w.sample({}, s.ready ? 1.0 : 0.0);
  if (journal) {
    w.family("journal_rows", "gauge", "Rows of the request journal by state (terminal rows until retention prunes them).");
    for (const auto& [state, n] : journal->rows_by_state) w.sample({{"state", state}}, static_cast<double>(n));
    w.family("journal_bytes", "gauge", "Size of the request journal on disk: the database and its write-ahead log.");
    w.sample({{"file", "db"}}, static_cast<double>(journal->file_bytes));
    w.sample({{"file", "wal"}}, static_cast<double>(journal->wal_bytes));
    w.family("journal_used_bytes", "gauge",
             "Pages of the journal's database in use (its file less the free pages SQLite reuses).");
    w.sample({}, static_cast<double>(journal->used_bytes));
    w.family("journal_max_bytes", "gauge",
             "The journal's size budget (--journal-max-bytes; 0: none): past it finished requests are pruned, "
             "oldest first, and a new request that cannot fit is refused (503 journal_full).");
    w.sample({}, static_cast<double>(journal->max_bytes));
    w.family("journal_pruned_for_space_total", "counter",
             "Finished requests deleted from the journal to keep within its size budget, since start.");
    w.sample({}, static_cast<double>(journal->pruned_for_space));
  }
  if (http) {
    w.family("http_connections_open", "gauge", "HTTP connections open now.");
    w.sample({}, static_cast<double>(http->open_connections));
    w.family("http_connections_total", "counter",
             "HTTP connections by how they were taken: accepted (all kept), over_limit (past a connection cap: "
             "health and status only), refused (past the reserve too: closed at once).");
    w.sample({{"outcome", "accepted"}}, static_cast<double>(http->accepted));
    w.sample({{"outcome", "over_limit"}}, static_cast<double>(http->over_limit));
    w.sample({{"outcome", "refused"}}, static_cast<double>(http->refused));
    w.family("http_timeouts_total", "counter", "Connections closed by a deadline (idle, request head, body, write).");
    w.sample({}, static_cast<double>(http->timed_out));
    w.family("http_client_errors_total", "counter",
             "Requests the transport refused itself (4xx: limits, malformed requests, unknown routes).");
    w.sample({}, static_cast<double>(http->client_errors));
    w.family("http_disconnects_total", "counter", "Clients gone while their request was handled (it was cancelled).");
    w.sample({}, static_cast<double>(http->disconnects));
  }
  return w.take();
}

}  // namespace spw::http
