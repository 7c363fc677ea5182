// The checker: figures and gates from a History (see checker.h).
//
// Unit of account. An operation is an invoke and its completion (same op_id).
// A request is the set of operations connected by `continues` (resume,
// retry, cancel of an earlier operation) or by a shared request id (an
// idempotent retry that the server answered with the id it already had):
// that is one story from the client's side, however many HTTP calls it took.
// Counts of accepted, succeeded, lost, refused and cancelled are of requests;
// the duplication checks look at each request id and each Idempotency-Key.
#include "drill/checker.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/size.h"

namespace spw::drill {

std::vector<std::string> CheckResult::failed_gates() const {
  std::vector<std::string> out;
  for (const auto& g : gates) {
    if (!g.passed) out.push_back(g.name);
  }
  return out;
}

Percentiles percentiles(std::vector<double> values) {
  Percentiles p;
  p.n = static_cast<int64_t>(values.size());
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least q of the values at or
  // below it, i.e. the ceil(q * n)-th value (1-based).
  auto rank = [&](double q) {
    const double r = std::ceil(q * static_cast<double>(values.size()) - 1e-9);
    const size_t i = r < 1 ? 0 : static_cast<size_t>(r) - 1;
    return values[std::min(i, values.size() - 1)];
  };
  p.p50 = rank(0.50);
  p.p95 = rank(0.95);
  p.p99 = rank(0.99);
  p.max = values.back();
  return p;
}

namespace {

// One operation: its invoke and completion merged.
struct OpView {
  int64_t op_id = 0;
  int64_t order = 0;        // invoke position (completion's when no invoke was recorded)
  const Op* inv = nullptr;
  const Op* done = nullptr;  // nullptr: never completed (outcome unknown)
  // Request fields come from the invoke, outcome fields from the completion.
  const Op& req() const { return inv != nullptr ? *inv : *done; }
  const Op& out() const { return done != nullptr ? *done : *inv; }
  OpType type() const { return done != nullptr ? done->type : OpType::kInfo; }
  bool completed() const { return done != nullptr; }
  double t_invoke() const {
    if (inv != nullptr) return inv->t_ms;
    return done->latency_ms >= 0 ? done->t_ms - done->latency_ms : done->t_ms;
  }
  double t_done() const { return done != nullptr ? done->t_ms : -1; }
  int64_t request_id() const {
    if (done != nullptr && done->request_id != 0) return done->request_id;
    return inv != nullptr ? inv->request_id : 0;
  }
  bool accepted() const {
    return request_id() != 0 || (done != nullptr && done->accepted) || (inv != nullptr && inv->accepted);
  }
  // complete | resume | retry generate text; cancel and read do not.
  bool generating() const { return req().f != "cancel" && req().f != "read"; }
  bool ok() const { return type() == OpType::kOk; }
  bool replayed() const { return done != nullptr && done->replayed; }
  std::string path_name() const {
    const Op& o = out();
    if (!o.path.empty()) return o.path;
    if (!o.placement.empty()) return o.placement;
    return "unknown";
  }
  bool on_cpu() const { return out().path == "cpu" || out().placement == "cpu"; }
  // The moment the first text arrived (-1: none).
  double first_token_t() const {
    if (done == nullptr || done->ttft_ms < 0) return -1;
    return t_invoke() + done->ttft_ms;
  }
  double latency() const {
    if (done == nullptr) return -1;
    if (done->latency_ms >= 0) return done->latency_ms;
    return done->t_ms - t_invoke();
  }
};

struct UnionFind {
  std::vector<size_t> parent;
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), size_t{0}); }
  size_t find(size_t x) {
    while (parent[x] != x) {
      parent[x] = parent[parent[x]];
      x = parent[x];
    }
    return x;
  }
  void unite(size_t a, size_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

bool terminal_state(const std::string& s) { return s == "done" || s == "failed" || s == "cancelled"; }

std::string fmt(double v, int prec = 1) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(prec);
  o << v;
  return o.str();
}

std::string ids_text(const std::vector<int64_t>& ids, size_t limit = 10) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > limit) s += ", ... (" + std::to_string(ids.size()) + " in all)";
  return s;
}

// The text a client holds for a sequence of its generating operations: a
// resume or a plain completion appends what it received, a retry that ran
// starts over (the client sent the whole request again), a replay is the
// whole stored result.
std::string client_text(const std::vector<const OpView*>& ops) {
  std::string text;
  for (const OpView* v : ops) {
    if (!v->generating() || !v->completed()) continue;  // nothing known received
    const Op& o = v->out();
    if (v->replayed()) {
      if (v->ok()) text = o.text;
    } else if (v->req().f == "retry") {
      // A retry's text starts over (a replay or a run from the start under
      // the same id); one that received nothing (the server was down) says
      // nothing about what the client holds.
      if (v->ok() || !o.text.empty()) text = o.text;
    } else {
      text += o.text;
    }
  }
  return text;
}

// One operation per op_id, its invoke and completion paired.
struct Operations {
  std::vector<OpView> views;
  std::unordered_map<int64_t, size_t> by_id;  // op_id -> index in views
};

// ---- operations: pair invokes and completions by op_id.
Operations pair_operations(const History& h) {
  Operations ops;
  std::vector<OpView>& views = ops.views;
  std::unordered_map<int64_t, size_t>& by_id = ops.by_id;
  for (size_t i = 0; i < h.ops.size(); ++i) {
    const Op& o = h.ops[i];
    auto it = by_id.find(o.op_id);
    if (it == by_id.end()) {
      OpView v;
      v.op_id = o.op_id;
      v.order = static_cast<int64_t>(i);
      (o.type == OpType::kInvoke ? v.inv : v.done) = &o;
      by_id.emplace(o.op_id, views.size());
      views.push_back(v);
    } else {
      OpView& v = views[it->second];
      if (o.type == OpType::kInvoke) {
        if (v.inv == nullptr) v.inv = &o;
      } else if (v.done == nullptr) {
        v.done = &o;
      }
    }
  }
  return ops;
}

using Groups = std::map<size_t, std::vector<const OpView*>>;  // root -> ops in invoke order

// ---- requests: operations joined by `continues` and by request id.
Groups group_requests(const Operations& ops) {
  const std::vector<OpView>& views = ops.views;
  UnionFind uf(views.size());
  std::unordered_map<int64_t, size_t> first_with_rid;
  for (size_t i = 0; i < views.size(); ++i) {
    const int64_t cont = views[i].req().continues;
    if (cont != 0) {
      auto it = ops.by_id.find(cont);
      if (it != ops.by_id.end()) uf.unite(i, it->second);
    }
    const int64_t rid = views[i].request_id();
    if (rid != 0) {
      auto [it, inserted] = first_with_rid.emplace(rid, i);
      if (!inserted) uf.unite(i, it->second);
    }
  }
  Groups groups;
  for (size_t i = 0; i < views.size(); ++i) groups[uf.find(i)].push_back(&views[i]);
  return groups;
}

const FinalRecord* final_of(const History& h, int64_t rid) {
  auto it = h.finals.find(rid);
  return it == h.finals.end() ? nullptr : &it->second;
}

// The accepted requests that ended with neither an ok response nor a
// terminal journal record (the no_lost gate's evidence).
struct Lost {
  std::vector<int64_t> ids;
  int64_t without_id = 0;
};

// Per request: accepted, succeeded, lost, refused, cancelled, resumed, and
// the token equivalence of its text.
Lost count_requests(const History& h, const Groups& groups, Figures& fig) {
  Lost lost;
  for (auto& [root, ops] : groups) {
    std::set<int64_t> rids;
    bool accepted = false, succeeded = false, failed_answer = false, cancelled = false, resumed = false;
    for (const OpView* v : ops) {
      if (v->request_id() != 0) rids.insert(v->request_id());
      accepted = accepted || v->accepted();
      if (v->generating() && v->ok()) succeeded = true;
      if (v->type() == OpType::kFail && v->out().http_status != 0) failed_answer = true;
      if (v->req().f == "cancel" && v->ok()) cancelled = true;
      if (v->req().f == "resume") resumed = true;
    }
    bool terminal_record = false;
    for (int64_t rid : rids) {
      const FinalRecord* f = final_of(h, rid);
      if (f != nullptr && f->found && terminal_state(f->state)) terminal_record = true;
      if (f != nullptr && f->found && f->state == "cancelled") cancelled = true;
    }
    if (accepted) {
      ++fig.accepted;
      if (succeeded) ++fig.succeeded;
      if (!succeeded && !terminal_record) {
        ++fig.lost;
        if (rids.empty()) ++lost.without_id;
        lost.ids.insert(lost.ids.end(), rids.begin(), rids.end());
      }
    } else if (failed_answer) {
      ++fig.refused;
    }
    if (cancelled) ++fig.cancelled;
    if (resumed) ++fig.resumed;

    // Token equivalence: the whole text the client ended with, for a greedy
    // request whose prompt has a clean reference.
    const Op& first = ops.front()->req();
    if (succeeded && first.greedy) {
      auto ref = h.reference.find(first.prompt_key);
      if (ref != h.reference.end()) {
        ++fig.equivalence_checked;
        if (client_text(ops) == ref->second) ++fig.equivalence_equal;
      }
    }
  }
  fig.success_rate = fig.accepted == 0 ? 1.0 : static_cast<double>(fig.succeeded) / static_cast<double>(fig.accepted);
  return lost;
}

// ---- duplicated side effects.
using Duplicates = std::map<int64_t, std::string>;  // request id -> why (the first reason found)

void flag_duplicate(Duplicates& dup, int64_t rid, std::string why) {
  if (rid != 0) dup.emplace(rid, std::move(why));
}

// Checks (1) and (4), per request id.
void check_texts_and_runs(const History& h, const Groups& groups, Duplicates& dup) {
  auto flag = [&](int64_t rid, std::string why) { flag_duplicate(dup, rid, std::move(why)); };
  // (1) Text: per request id, what the client received against the journal's
  // text (or the clean reference when the journal has no finished text).
  std::map<int64_t, std::vector<const OpView*>> by_rid;
  for (auto& [root, ops] : groups) {
    std::set<int64_t> rids;
    for (const OpView* v : ops) {
      if (v->request_id() != 0) rids.insert(v->request_id());
    }
    for (const OpView* v : ops) {
      if (!v->generating()) continue;
      if (v->request_id() != 0) {
        by_rid[v->request_id()].push_back(v);
      } else if (rids.size() == 1) {
        by_rid[*rids.begin()].push_back(v);  // before the id was seen: the same request
      }
    }
  }
  for (auto& [rid, ops] : by_rid) {
    const FinalRecord* f = final_of(h, rid);
    const bool journal_text = f != nullptr && f->found && f->state == "done";
    std::optional<std::string> expected;
    if (journal_text) {
      expected = f->text;
    } else {
      auto ref = h.reference.find(ops.front()->req().prompt_key);
      if (ref != h.reference.end()) expected = ref->second;
    }
    std::vector<const OpView*> direct;
    bool ok_direct = false;
    for (const OpView* v : ops) {
      if (v->replayed()) {
        if (v->ok() && journal_text && v->out().text != f->text) {
          flag(rid, "a replay's text differs from the journal's");
        }
        continue;
      }
      direct.push_back(v);
      if (v->ok()) ok_direct = true;
    }
    if (expected && !direct.empty()) {
      const std::string received = client_text(direct);
      if (ok_direct ? received != *expected : expected->compare(0, received.size(), received) != 0) {
        flag(rid, ok_direct ? "the text received is not the journal's text once"
                            : "the text received is not a prefix of the journal's text");
      }
    }
    // (4) Generations: more runs than the first, successful, operation needed.
    const OpView* first = ops.front();
    if (f != nullptr && f->found && first->ok() && !first->replayed()) {
      const int32_t allowed = 1 + first->out().failovers + first->out().migrations;
      if (f->runs > allowed) {
        flag(rid, "the journal counts " + std::to_string(f->runs) + " runs after the first finished");
      }
    }
  }
}

// (2) and (3): each Idempotency-Key maps to one request id and runs once.
void check_idempotency_keys(const std::vector<OpView>& views, Duplicates& dup) {
  auto flag = [&](int64_t rid, std::string why) { flag_duplicate(dup, rid, std::move(why)); };
  std::map<std::string, std::vector<const OpView*>> by_key;
  for (const OpView& v : views) {
    if (!v.req().idempotency_key.empty() && v.generating()) by_key[v.req().idempotency_key].push_back(&v);
  }
  for (auto& [key, ops] : by_key) {
    std::set<int64_t> rids;
    for (const OpView* v : ops) {
      if (v->request_id() != 0) rids.insert(v->request_id());
    }
    if (rids.size() > 1) {
      for (int64_t rid : rids) {
        flag(rid, "Idempotency-Key '" + key + "' has " + std::to_string(rids.size()) + " request ids");
      }
    }
    for (const OpView* b : ops) {
      if (!b->ok() || b->replayed()) continue;
      for (const OpView* a : ops) {
        if (a == b || !a->ok() || a->order >= b->order) continue;
        if (a->t_done() <= b->t_invoke()) {
          flag(b->request_id() != 0 ? b->request_id() : a->request_id(),
               "a retry under Idempotency-Key '" + key + "' ran again after the first attempt finished");
          break;
        }
      }
    }
  }
}

// Degraded responses that did not show it (the degraded_visible gate's evidence).
struct Hidden {
  std::vector<int64_t> ids;
  int64_t without_id = 0;
};

// ---- latency, degraded, replays.
Hidden tally_latency_and_degraded(const std::vector<OpView>& views, Figures& fig) {
  Hidden hidden;
  std::map<std::string, std::vector<double>> lat_cls, lat_path, ttft_path;
  for (const OpView& v : views) {
    if (!v.completed()) continue;
    const Op& o = *v.done;
    if (v.generating() && v.ok()) {
      const double l = v.latency();
      if (l >= 0) {
        lat_cls[v.req().cls].push_back(l);
        lat_path[v.path_name()].push_back(l);
      }
      if (o.ttft_ms >= 0) ttft_path[v.path_name()].push_back(o.ttft_ms);
    }
    if (v.replayed() && v.ok()) ++fig.replayed;
    if ((v.type() == OpType::kOk || v.type() == OpType::kFail) && o.degraded) {
      ++fig.degraded;
      if (o.degraded_shown) {
        ++fig.degraded_shown;
      } else if (v.request_id() != 0) {
        hidden.ids.push_back(v.request_id());
      } else {
        ++hidden.without_id;
      }
    }
  }
  for (auto& [k, vals] : lat_cls) fig.latency_by_class[k] = percentiles(std::move(vals));
  for (auto& [k, vals] : lat_path) fig.latency_by_path[k] = percentiles(std::move(vals));
  for (auto& [k, vals] : ttft_path) fig.ttft_by_path[k] = percentiles(std::move(vals));
  return hidden;
}

// The first sample whose host memory was over its own budget.
struct HostOver {
  bool over = false;
  double t = 0;
  uint64_t peak = 0, budget = 0;
};

// ---- samples: queues, device and host memory.
HostOver read_samples(const History& h, Figures& fig) {
  HostOver over;
  uint64_t min_limit = 0;
  for (const Sample& s : h.samples) {
    for (const PathSample& p : s.paths) {
      auto& q = fig.max_queue_depth[p.name];
      q = std::max(q, p.queue_depth);
      auto& a = fig.max_queue_age_s[p.name];
      a = std::max(a, p.oldest_queued_s);
    }
    fig.device_peak = std::max(fig.device_peak, s.device_used);
    fig.device_capacity = std::max(fig.device_capacity, s.device_capacity);
    if (s.device_limit > 0) min_limit = min_limit == 0 ? s.device_limit : std::min(min_limit, s.device_limit);
    const uint64_t host = std::max(s.host_reserved, s.host_rss);
    fig.host_peak = std::max(fig.host_peak, host);
    if (s.host_budget > 0) {
      // The tightest budget seen: the gate below compares each sample with
      // its own budget; the figure shows the strictest one.
      fig.host_budget = fig.host_budget == 0 ? s.host_budget : std::min(fig.host_budget, s.host_budget);
      if (host > s.host_budget && !over.over) {
        over.over = true;
        over.t = s.t_ms;
        over.peak = host;
        over.budget = s.host_budget;
      }
    }
  }
  fig.device_limit = min_limit;
  return over;
}

// The moment of the first text after `t` of any generating operation (on the
// CPU path only: cpu_only); -1: none.
double first_token_after(const std::vector<OpView>& views, double t, bool cpu_only) {
  double best = -1;
  for (const OpView& v : views) {
    if (!v.generating() || (cpu_only && !v.on_cpu())) continue;
    const double ft = v.first_token_t();
    if (ft >= t && (best < 0 || ft < best)) best = ft;
  }
  return best;
}

// An armed device fault `e`: when it fired (its arming time when no firing was seen).
double device_fault_time(const Event* e, const std::vector<const Event*>& events) {
  // An armed fault fires at the device's next event of its kind: time
  // runs from its firing (the drill's fault_fired event, polled, or the
  // breaker opening if that was seen first), not from its arming.
  for (const Event* f : events) {
    if (f->kind != "fault_fired" || f->t_ms < e->t_ms || f->detail.rfind(e->kind + " ", 0) != 0) continue;
    double fired = f->t_ms;
    for (const Event* b : events) {
      if (b->kind == "breaker_open" && b->t_ms >= e->t_ms && b->t_ms < fired) fired = b->t_ms;
    }
    return fired;
  }
  return e->t_ms;
}

// A device fault's recovery from fault_t: the breaker opening (seen in a
// sample or as an event), the first CPU token, the first token anywhere.
void device_recovery(const History& h, const std::vector<OpView>& views, const std::vector<const Event*>& events,
                     double fault_t, Recovery& r) {
  double open = -1;
  for (const Sample& s : h.samples) {
    if (s.t_ms < fault_t) continue;
    const bool any_open = std::any_of(s.paths.begin(), s.paths.end(), [](const PathSample& p) {
      return !p.breaker.empty() && p.breaker != "closed";
    });
    if (any_open && (open < 0 || s.t_ms < open)) open = s.t_ms;
  }
  for (const Event* b : events) {
    if (b->kind == "breaker_open" && b->t_ms >= fault_t && (open < 0 || b->t_ms < open)) open = b->t_ms;
  }
  if (open >= 0) r.breaker_open_ms = open - fault_t;
  const double cpu = first_token_after(views, fault_t, true);
  if (cpu >= 0) r.first_cpu_token_ms = cpu - fault_t;
  const double any = first_token_after(views, fault_t, false);
  if (any >= 0) r.first_token_ms = any - fault_t;
}

// A kill's recovery: the restart, then the first token after it.
void kill_recovery(const std::vector<OpView>& views, const std::vector<const Event*>& events, const Event* e,
                   Recovery& r) {
  double from = e->t_ms;
  for (const Event* b : events) {
    if (b->kind == "restart" && b->t_ms >= e->t_ms) {
      r.restart_ms = b->t_ms - e->t_ms;
      from = b->t_ms;
      break;
    }
  }
  const double any = first_token_after(views, from, false);
  if (any >= 0) r.first_token_ms = any - e->t_ms;
}

// ---- recovery per fault.
void measure_recoveries(const History& h, const std::vector<OpView>& views, Figures& fig) {
  std::vector<const Event*> events;
  for (const Event& e : h.events) events.push_back(&e);
  std::stable_sort(events.begin(), events.end(), [](const Event* a, const Event* b) { return a->t_ms < b->t_ms; });
  for (const Event* e : events) {
    const bool device_fault = e->kind == "alloc_fail" || e->kind == "device_lost";
    if (!device_fault && e->kind != "kill") continue;
    Recovery r;
    r.fault_ms = e->t_ms;
    r.fault = e->kind;
    if (device_fault) r.fault_ms = device_fault_time(e, events);
    const double fault_t = r.fault_ms;
    if (device_fault) {
      device_recovery(h, views, events, fault_t, r);
    } else {
      kill_recovery(views, events, e, r);
    }
    fig.recoveries.push_back(r);
  }
}

// ---- gates.
Gate no_lost_gate(const Figures& fig, Lost lost) {
  Gate g;
  g.name = "no_lost";
  g.passed = fig.lost == 0;
  std::sort(lost.ids.begin(), lost.ids.end());
  g.request_ids = lost.ids;
  g.detail = std::to_string(fig.lost) + " of " + std::to_string(fig.accepted) +
             " accepted requests ended with neither an ok response nor a terminal journal record";
  if (lost.without_id > 0) g.detail += " (" + std::to_string(lost.without_id) + " without a request id)";
  if (!lost.ids.empty()) g.detail += ": " + ids_text(lost.ids);
  return g;
}

Gate no_duplicates_gate(const Duplicates& dup) {
  Gate g;
  g.name = "no_duplicates";
  g.passed = dup.empty();
  for (const auto& [rid, why] : dup) g.request_ids.push_back(rid);
  g.detail = std::to_string(dup.size()) + " request ids with a duplicated side effect";
  if (!dup.empty()) g.detail += "; request " + std::to_string(dup.begin()->first) + ": " + dup.begin()->second;
  return g;
}

Gate host_budget_gate(const Figures& fig, const HostOver& over) {
  Gate g;
  g.name = "host_budget";
  g.passed = !over.over;
  if (fig.host_budget == 0) {
    g.detail = "no host budget sampled (peak host memory " + format_byte_size(fig.host_peak) + ")";
  } else if (over.over) {
    g.detail = "host memory " + format_byte_size(over.peak) + " over its budget " + format_byte_size(over.budget) +
               " at " + fmt(over.t / 1000.0) + " s (peak " + format_byte_size(fig.host_peak) + ")";
  } else {
    g.detail = "peak host memory " + format_byte_size(fig.host_peak) + " within the budget " +
               format_byte_size(fig.host_budget);
  }
  return g;
}

Gate reserve_line_gate(const History& h, const Figures& fig) {
  Gate g;
  g.name = "reserve_line";
  int64_t checked = 0;
  for (const auto& [rid, f] : h.finals) {
    if (!f.admitted_under_reserve) continue;
    ++checked;
    if (!*f.admitted_under_reserve) g.request_ids.push_back(rid);
  }
  g.passed = g.request_ids.empty();
  g.detail = std::to_string(g.request_ids.size()) + " of " + std::to_string(checked) +
             " GPU-side admissions over the reserve line; peak device " + format_byte_size(fig.device_peak) +
             " against the line " + format_byte_size(fig.device_limit);
  if (!g.request_ids.empty()) g.detail += ": " + ids_text(g.request_ids);
  return g;
}

Gate degraded_visible_gate(const Figures& fig, Hidden hidden) {
  Gate g;
  g.name = "degraded_visible";
  g.passed = fig.degraded == fig.degraded_shown;
  std::sort(hidden.ids.begin(), hidden.ids.end());
  hidden.ids.erase(std::unique(hidden.ids.begin(), hidden.ids.end()), hidden.ids.end());
  g.request_ids = hidden.ids;
  g.detail = std::to_string(fig.degraded_shown) + " of " + std::to_string(fig.degraded) +
             " degraded responses showed it";
  if (hidden.without_id > 0) g.detail += " (" + std::to_string(hidden.without_id) + " hidden without a request id)";
  if (!hidden.ids.empty()) g.detail += "; hidden: " + ids_text(hidden.ids);
  return g;
}

}  // namespace

CheckResult check(const History& h) {
  CheckResult res;
  res.scenario = h.scenario;
  res.mode = h.mode;
  res.seed = h.seed;
  Figures& fig = res.figures;

  const Operations ops = pair_operations(h);
  fig.operations = static_cast<int64_t>(ops.views.size());
  const Groups groups = group_requests(ops);
  Lost lost = count_requests(h, groups, fig);
  Duplicates dup;
  check_texts_and_runs(h, groups, dup);
  check_idempotency_keys(ops.views, dup);
  fig.duplicated = static_cast<int64_t>(dup.size());
  Hidden hidden = tally_latency_and_degraded(ops.views, fig);
  const HostOver host_over = read_samples(h, fig);
  measure_recoveries(h, ops.views, fig);

  res.gates.push_back(no_lost_gate(fig, std::move(lost)));
  res.gates.push_back(no_duplicates_gate(dup));
  res.gates.push_back(host_budget_gate(fig, host_over));
  res.gates.push_back(reserve_line_gate(h, fig));
  res.gates.push_back(degraded_visible_gate(fig, std::move(hidden)));
  res.passed = std::all_of(res.gates.begin(), res.gates.end(), [](const Gate& g) { return g.passed; });
  return res;
}

}  // namespace spw::drill
