#include "admission/controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>

#include "admission/ledger.h"
#include "core/size.h"

namespace spw::admission {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmt_s(double s) {
  if (!std::isfinite(s)) return "unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string fmt_pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", x * 100.0);
  return buf;
}

double expected_tokens(const PathRates& r, int32_t max_tokens) {
  const double share = std::clamp(r.completion_share, 0.0, 1.0);
  return std::max(1.0, share * static_cast<double>(max_tokens));
}

double remaining_s(const PathRates& r, const WorkItem& w) {
  if (r.decode_tps <= 0 || r.prefill_tps <= 0) return kInf;
  const double expected = expected_tokens(r, w.max_tokens);
  const double from = std::min(static_cast<double>(w.generated), expected - 1.0);
  double t = decode_s(r, w.prompt_tokens, from, expected);
  if (w.generated == 0) t += std::max(0.0, prefill_s(r, w.prompt_tokens) - w.elapsed_s);
  return t;
}

}  // namespace

std::string_view decision_kind_name(DecisionKind k) {
  switch (k) {
    case DecisionKind::kAdmit: return "admit";
    case DecisionKind::kDelay: return "delay";
    case DecisionKind::kShrink: return "shrink";
    case DecisionKind::kOffload: return "offload";
    case DecisionKind::kRedirect: return "redirect";
    case DecisionKind::kReject: return "reject";
  }
  return "unknown";
}

std::string_view path_role_name(PathRole r) {
  switch (r) {
    case PathRole::kPrimary: return "primary";
    case PathRole::kOffload: return "offload";
    case PathRole::kFallback: return "fallback";
  }
  return "unknown";
}

int32_t kv_blocks_for(int32_t n_tokens, int32_t block_tokens) {
  if (block_tokens <= 0) return 0;
  return (std::max(0, n_tokens) + block_tokens - 1) / block_tokens;
}

int32_t kv_blocks_for_choices(int32_t prompt_tokens, int32_t max_tokens, int32_t block_tokens, int32_t n) {
  if (block_tokens <= 0) return 0;
  const int32_t whole = kv_blocks_for(prompt_tokens + max_tokens, block_tokens);
  // The blocks before the one holding the prompt's last position: a choice
  // evaluates that position again for its logits, in a block of its own.
  const int32_t shared = std::max(0, prompt_tokens - 1) / block_tokens;
  const int64_t total = shared + static_cast<int64_t>(std::max(1, n)) * (whole - shared);
  return static_cast<int32_t>(std::min<int64_t>(total, std::numeric_limits<int32_t>::max()));
}

double prefill_s(const PathRates& r, int32_t prompt_tokens) {
  if (r.prefill_tps <= 0) return kInf;
  const double p = std::max(0, prompt_tokens);
  return p / r.prefill_tps + std::max(0.0, r.prefill_s_per_pos) * p * (p - 1.0) / 2.0;
}

double decode_s(const PathRates& r, int32_t prompt_tokens, double from, double tokens) {
  if (r.decode_tps <= 0) return kInf;
  const double n = std::max(0.0, tokens - from);
  // Positions P+from .. P+tokens-1: their sum is n * (first + last) / 2.
  const double first = static_cast<double>(std::max(0, prompt_tokens)) + from;
  return n / r.decode_tps + std::max(0.0, r.decode_s_per_pos) * n * (2.0 * first + n - 1.0) / 2.0;
}

void CostFit::add(double n, double s, double t, double alpha) {
  if (!(n > 0) || !(t >= 0) || !(s >= 0)) return;
  const double keep = empty() ? 0.0 : 1.0 - std::clamp(alpha, 0.0, 1.0);
  snn_ = keep * snn_ + n * n;
  sns_ = keep * sns_ + n * s;
  sss_ = keep * sss_ + s * s;
  snt_ = keep * snt_ + n * t;
  sst_ = keep * sst_ + s * t;
}

bool CostFit::solve(double& tps, double& s_per_pos) const {
  if (empty()) return false;
  // Ridge on d: 1% of its own scale, so that samples all at one position
  // (collinear n and s) still give a finite, mostly flat line.
  const double sss = sss_ * 1.01;
  const double det = snn_ * sss - sns_ * sns_;
  double c = snt_ / snn_;
  double d = 0;
  if (det > 0 && sss_ > 0) {
    const double c2 = (snt_ * sss - sns_ * sst_) / det;
    const double d2 = (snn_ * sst_ - sns_ * snt_) / det;
    if (d2 >= 0 && c2 > 0) {
      c = c2;
      d = d2;
    }
  }
  if (!(c > 0)) return false;
  tps = 1.0 / c;
  s_per_pos = d;
  return true;
}

double estimate_run_s(const PathRates& r, int32_t prompt_tokens, int32_t max_tokens) {
  if (r.decode_tps <= 0 || r.prefill_tps <= 0) return kInf;
  return prefill_s(r, prompt_tokens) + decode_s(r, prompt_tokens, 0, expected_tokens(r, max_tokens));
}

double estimate_start_delay(const PathSnapshot& p, int32_t kv_blocks) {
  const size_t slots = static_cast<size_t>(std::max(1, p.workers));
  const bool limited = p.kv_blocks_total > 0;
  if (limited && kv_blocks > p.kv_blocks_total) return kInf;
  // Active items as (finish time, blocks), earliest first.
  using Active = std::pair<double, int32_t>;
  std::priority_queue<Active, std::vector<Active>, std::greater<>> active;
  int64_t free_blocks = limited ? p.kv_blocks_free : std::numeric_limits<int32_t>::max();
  for (const WorkItem& w : p.running) active.emplace(remaining_s(p.rates, w), w.kv_blocks);
  double t = 0;
  // Starts an item needing `blocks` at the earliest time a slot and the
  // blocks are free (FIFO: never before the previous start); returns it.
  auto start = [&](int32_t blocks, double duration) {
    for (;;) {
      if (active.size() < slots && (!limited || free_blocks >= blocks)) {
        active.emplace(t + duration, blocks);
        free_blocks -= blocks;
        return t;
      }
      if (active.empty()) return kInf;
      const Active a = active.top();
      active.pop();
      t = std::max(t, a.first);
      free_blocks += a.second;
      if (!std::isfinite(t)) return kInf;
    }
  };
  for (const WorkItem& q : p.queued) {
    if (!std::isfinite(start(q.kv_blocks, estimate_run_s(p.rates, q.prompt_tokens, q.max_tokens)))) return kInf;
  }
  // A replica still to load delays everything on the path by its load time.
  return std::max(0.0, p.startup_s) + start(kv_blocks, 0);
}

double pressure_of(const PathSnapshot& p) {
  return p.ledger_limit > 0
             ? static_cast<double>(p.ledger_used + p.request_extra_bytes) / static_cast<double>(p.ledger_limit)
             : 0.0;
}

namespace {

// The first path passed over only because its wait is long: the request
// waits there when no other path can take it (queueing beats refusing).
struct Waiting {
  int32_t i = -1, n_ctx = 0, max_tokens = 0, blocks = 0;
  double delay = 0, pressure = 0;
};

// One path's figures for the request, as decide's walk over the paths
// computes them before it judges the path.
struct Candidate {
  int32_t i = 0;
  const PathSnapshot& p;
  int32_t max_tokens = 0;
  int32_t n = 1;
  int32_t blocks = 0;
  std::string times_n;
  bool primary = false;
  double pressure = 0;
  bool pressure_ok = false;
  bool queue_ok = false;
};

// decide's state while it walks the paths in order.
struct Decider {
  Decider(const RequestShape& req, const std::vector<PathSnapshot>& paths, const AdmissionPolicy& policy, Decision& d)
      : req(req), paths(paths), policy(policy), d(d), may_shrink(req.allow_shrink || policy.allow_shrink) {}

  // Path `idx`: its verdict recorded; true when the request goes there.
  bool consider(size_t idx);
  // The waiting fallback, then the reason (and for a rejection the status).
  void conclude();
  void fill(Decision& out, int32_t i, DecisionKind kind, int32_t n_ctx, int32_t max_tokens, int32_t blocks,
            double delay, double pressure) const;
  bool try_shrink(const Candidate& c, PathVerdict& v);
  void reject(std::string reason);

  const RequestShape& req;
  const std::vector<PathSnapshot>& paths;
  const AdmissionPolicy& policy;
  Decision& d;
  const bool may_shrink;
  bool queue_full_somewhere = false;
  double retry_after = kInf;
  Waiting waiting;
};

void Decider::fill(Decision& out, int32_t i, DecisionKind kind, int32_t n_ctx, int32_t max_tokens, int32_t blocks,
                   double delay, double pressure) const {
  const PathSnapshot& p = paths[static_cast<size_t>(i)];
  out.kind = kind;
  out.path_index = i;
  out.path = p.name;
  out.n_ctx = n_ctx;
  out.max_tokens = max_tokens;
  out.kv_blocks = blocks;
  out.pressure = pressure;
  out.timing.delay_s = delay;
  out.timing.ttft_s = delay + prefill_s(p.rates, req.prompt_tokens);
  out.timing.total_s = delay + estimate_run_s(p.rates, req.prompt_tokens, max_tokens * std::max(1, req.n));
  const bool waits = !p.queued.empty() || static_cast<int32_t>(p.running.size()) >= p.workers ||
                     (p.kv_blocks_total > 0 && blocks > p.kv_blocks_free);
  out.queue_position = waits ? static_cast<int32_t>(p.queued.size()) + 1 : 0;
  out.max_tokens_clamped = req.max_tokens && *req.max_tokens > n_ctx - req.prompt_tokens;
  out.http_status = 200;
}

// Shrink on the first-choice path: the largest max_tokens whose blocks
// are free now (so it starts without waiting on KV).
bool Decider::try_shrink(const Candidate& c, PathVerdict& v) {
  const PathSnapshot& p = c.p;
  const int32_t max_tokens = c.max_tokens;
  const int32_t n = c.n;
  if (!c.primary || !may_shrink || !c.pressure_ok || !c.queue_ok || p.kv_blocks_total <= 0) return false;
  const int32_t fit_blocks = std::min(p.kv_blocks_total, p.kv_blocks_free);
  // The largest per-choice length whose n choices fit fit_blocks.
  const int32_t shared = std::max(0, req.prompt_tokens - 1) / p.kv_block_tokens;
  const int32_t per_choice = fit_blocks > shared ? (fit_blocks - shared) / n : 0;
  const int32_t fit_tokens = (shared + per_choice) * p.kv_block_tokens - req.prompt_tokens;
  if (fit_tokens < policy.min_shrink_tokens || fit_tokens >= max_tokens) return false;
  const int32_t b = kv_blocks_for_choices(req.prompt_tokens, fit_tokens, p.kv_block_tokens, n);
  const double delay = estimate_start_delay(p, b);
  if (!(delay <= policy.max_delay_s)) return false;
  fill(d, c.i, DecisionKind::kShrink, p.n_ctx, fit_tokens, b, delay, c.pressure);
  d.shrunk = true;
  v.eligible = true;
  v.reason = "shrunk max_tokens " + std::to_string(max_tokens) + " -> " + std::to_string(fit_tokens) + c.times_n +
             " to fit the " + std::to_string(fit_blocks) + " free KV blocks";
  v.timing = d.timing;
  d.verdicts.push_back(v);
  return true;
}

bool Decider::consider(size_t idx) {
  const int32_t i = static_cast<int32_t>(idx);
  const PathSnapshot& p = paths[idx];
  PathVerdict v;
  v.path = p.name;
  auto skip = [&](std::string why) {
    v.reason = std::move(why);
    d.verdicts.push_back(v);
  };
  if (!p.usable) {
    skip("out of service (" + p.unusable_reason + ")");
    return false;
  }
  if (req.prompt_tokens >= p.n_ctx) {
    skip("prompt of " + std::to_string(req.prompt_tokens) + " tokens does not fit its context of " +
         std::to_string(p.n_ctx));
    return false;
  }
  const int32_t room = p.n_ctx - req.prompt_tokens;
  const int32_t max_tokens = req.max_tokens ? std::min(*req.max_tokens, room) : room;
  const int32_t n = std::max(1, req.n);
  const int32_t blocks = kv_blocks_for_choices(req.prompt_tokens, max_tokens, p.kv_block_tokens, n);
  const std::string times_n = n > 1 ? " x n = " + std::to_string(n) + " choices" : "";
  const bool primary = p.role == PathRole::kPrimary;
  const double pressure = pressure_of(p);
  const bool pressure_ok = p.ledger_limit == 0 || pressure <= policy.pressure_threshold;
  const bool queue_ok = static_cast<int32_t>(p.queued.size()) < p.queue_capacity;
  const Candidate c{i, p, max_tokens, n, blocks, times_n, primary, pressure, pressure_ok, queue_ok};

  if (p.kv_blocks_total > 0 && blocks > p.kv_blocks_total) {
    if (try_shrink(c, v)) return true;
    skip("needs " + std::to_string(blocks) + " KV blocks for " + std::to_string(req.prompt_tokens) + " + " +
         std::to_string(max_tokens) + " tokens" + times_n + ", its whole KV budget is " +
         std::to_string(p.kv_blocks_total));
    return false;
  }
  if (!pressure_ok) {
    skip("memory pressure on " + p.ledger + ": " + fmt_pct(pressure) + " of the safe limit " +
         format_byte_size(p.ledger_limit) + " (used " + format_byte_size(p.ledger_used) + ", co-tenants " +
         format_byte_size(p.ledger_cotenants) + ", this request " + format_byte_size(p.request_extra_bytes) +
         "), threshold " + fmt_pct(policy.pressure_threshold));
    return false;
  }
  if (!queue_ok) {
    queue_full_somewhere = true;
    retry_after = std::min(retry_after, estimate_start_delay(p, blocks));
    skip("queue full (" + std::to_string(p.queued.size()) + " of " + std::to_string(p.queue_capacity) + ")");
    return false;
  }
  const double delay = estimate_start_delay(p, blocks);
  if (primary && !(delay <= policy.max_delay_s)) {
    if (try_shrink(c, v)) return true;
    v.timing.delay_s = delay;
    if (waiting.i < 0) waiting = {i, p.n_ctx, max_tokens, blocks, delay, pressure};
    skip("estimated wait " + fmt_s(delay) + " exceeds max_delay " + fmt_s(policy.max_delay_s));
    return false;
  }
  DecisionKind kind = DecisionKind::kRedirect;
  if (primary) kind = delay <= policy.admit_delay_s ? DecisionKind::kAdmit : DecisionKind::kDelay;
  else if (p.role == PathRole::kOffload) kind = DecisionKind::kOffload;
  fill(d, i, kind, p.n_ctx, max_tokens, blocks, delay, pressure);
  v.eligible = true;
  v.timing = d.timing;
  v.reason = "fits: " + std::to_string(blocks) + " KV blocks" +
             (p.kv_blocks_total > 0 ? " (" + std::to_string(p.kv_blocks_free) + " of " +
                                          std::to_string(p.kv_blocks_total) + " free)"
                                    : std::string()) +
             (p.ledger_limit > 0 ? ", pressure " + fmt_pct(pressure) : std::string()) + ", estimated wait " +
             fmt_s(delay);
  d.verdicts.push_back(v);
  return true;
}

void Decider::conclude() {
  if (d.path_index < 0 && waiting.i >= 0) {
    fill(d, waiting.i, DecisionKind::kDelay, waiting.n_ctx, waiting.max_tokens, waiting.blocks, waiting.delay,
         waiting.pressure);
  }

  // One sentence: why each earlier path was passed over, then the choice.
  std::string reason;
  for (const PathVerdict& v : d.verdicts) {
    if (!reason.empty()) reason += "; ";
    reason += v.path + ": " + v.reason;
  }
  if (d.path_index >= 0) {
    if (d.kind == DecisionKind::kDelay && waiting.i == d.path_index) {
      reason += "; no other path can take it, so it waits on " + d.path;
    }
    d.reason = std::string(decision_kind_name(d.kind)) + " on " + d.path + " (" + reason + ")";
    return;
  }
  reject(std::move(reason));
}

// No path takes it: 400 when no path's context holds the prompt, 429 when a
// full queue stood in the way, else 503.
void Decider::reject(std::string reason) {
  d.kind = DecisionKind::kReject;
  if (paths.empty()) reason = "the server has no execution path";
  int32_t max_ctx = 0;
  for (const PathSnapshot& p : paths) max_ctx = std::max(max_ctx, p.n_ctx);
  if (!paths.empty() && req.prompt_tokens >= max_ctx) {
    // No path's context holds it, out of service or not: the client's to fix.
    d.http_status = 400;
    d.failure = FailureReason::kContextFull;
    d.reason = "prompt: " + std::to_string(req.prompt_tokens) + " tokens does not fit the context of " +
               std::to_string(max_ctx) + " tokens of any path (at most " + std::to_string(max_ctx - 1) +
               " prompt tokens; the server's --ctx sets the limit)";
  } else if (queue_full_somewhere) {
    d.http_status = 429;
    d.failure = FailureReason::kQueueFull;
    d.retry_after_s = std::isfinite(retry_after) ? std::clamp(retry_after, 1.0, 60.0) : 1.0;
    d.reason = "every path that could serve it has a full queue (" + reason + ")";
  } else {
    d.http_status = 503;
    d.failure = FailureReason::kNoPath;
    d.reason = "no path can serve it (" + reason + ")";
  }
}

}  // namespace

Decision decide(const RequestShape& req, const std::vector<PathSnapshot>& paths, const AdmissionPolicy& policy) {
  Decision d;
  d.prompt_tokens = req.prompt_tokens;
  d.max_tokens_requested = req.max_tokens;
  Decider decider(req, paths, policy, d);
  for (size_t idx = 0; idx < paths.size(); ++idx) {
    if (decider.consider(idx)) break;
  }
  decider.conclude();
  return d;
}

}  // namespace spw::admission
