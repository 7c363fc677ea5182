#include "gateway/residency.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "gateway/gateway.h"

namespace spw::gateway {

struct ModelResidency::Model {
  std::string name;   // the unit (path)
  std::string model;  // the model it serves
  std::vector<ModelCharge> charges;
  std::vector<admission::Ticket> tickets;  // one per charge while reserved
  bool pinned = false;
  double keep_alive_s = 300;
  double predicted_load_ms = 0;
  double last_load_ms = -1;
  bool reserved = false;  // tickets held: loading or loaded
  bool loaded = false;    // a load finished since the reservation
  bool evicting = false;  // its unload is under way (unlocked)
  int64_t reserved_ns = 0;
  int64_t last_used_ns = 0;
  int64_t last_used_ms = 0;
  int32_t running = 0;
  int32_t waiting = 0;
  std::string drain_for;  // a waiting model needs its memory ("": none)
  uint64_t loads = 0;
  uint64_t evictions = 0;
  std::string last_evicted_for;
  std::function<bool()> unload;
  std::shared_ptr<Replica> replica;

  uint64_t bytes_on(const admission::MemoryLedger* l) const {
    uint64_t b = 0;
    for (const ModelCharge& c : charges)
      if (c.ledger.get() == l) b += c.bytes;
    return b;
  }
  // "coder (gpu/coder)"; the model alone when the unit has its name.
  std::string label() const { return model.empty() || model == name ? name : model + " (" + name + ")"; }
  uint64_t total_bytes() const {
    uint64_t b = 0;
    for (const ModelCharge& c : charges) b += c.bytes;
    return b;
  }
};

// Where a model's plan would find room now: nothing to evict (fits), the
// victims to evict now, or why it must wait (until wait_ns) or can never fit.
struct ModelResidency::Room {
  bool fits_now = false;
  std::vector<Model*> evict_now;  // LRU first
  std::vector<Model*> needed;     // every victim the plan needs (evictable now or later)
  bool never = false;
  std::string why;
  int64_t wait_until_ns = 0;  // the earliest minimum residency among the needed ones
};

namespace {
constexpr int64_t kPollNs = 50'000'000;  // cancel flag and reservations re-checked this often while waiting
int64_t seconds_ns(double s) { return static_cast<int64_t>(s * 1e9); }
}  // namespace

ModelResidency::ModelResidency(Env& env, ResidencyOptions options) : env_(env), options_(std::move(options)) {}
ModelResidency::~ModelResidency() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (expiry_.joinable()) expiry_.join();
}

void ModelResidency::start_expiry() {
  std::lock_guard<std::mutex> lk(mu_);
  if (expiry_.joinable()) return;
  expiry_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      // The next lapse among the idle resident models; an hour when none
      // (any change notifies cv_ and the loop looks again).
      const int64_t now = env_.now_ns();
      int64_t next = now + seconds_ns(3600);
      bool due = false;
      for (const auto& [n, v] : models_) {
        if (v->evicting || v->last_used_ns == 0) continue;
        const double left = keep_alive_left_locked(*v, now);
        if (left < 0) continue;
        if (left == 0) due = true;
        next = std::min(next, now + seconds_ns(left) + 1);
      }
      if (due) {
        lk.unlock();
        expire();
        lk.lock();
        // A model whose path would not give it up is tried again later,
        // not in a loop.
        next = env_.now_ns() + kPollNs;
      }
      env_.wait_until_ns(lk, cv_, next);
    }
  });
}

Status ModelResidency::add(const std::string& name, const std::string& model, std::vector<ModelCharge> charges,
                           bool pinned, std::optional<double> keep_alive_s, double predicted_load_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  if (models_.count(name)) return Status::invalid_argument("unit " + name + " is in the catalogue twice");
  auto m = std::make_unique<Model>();
  m->name = name;
  m->model = model;
  m->charges = std::move(charges);
  m->pinned = pinned;
  m->keep_alive_s = keep_alive_s.value_or(options_.keep_alive_s);
  m->predicted_load_ms = predicted_load_ms;
  models_[name] = std::move(m);
  return Status::ok_status();
}

void ModelResidency::bind(const std::string& name, std::function<bool()> unload, std::shared_ptr<Replica> replica) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return;
  it->second->unload = std::move(unload);
  it->second->replica = std::move(replica);
}

bool ModelResidency::manages(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  return models_.count(name) > 0;
}

bool ModelResidency::manages_model(const std::string& model) const {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [n, m] : models_)
    if (m->model == model) return true;
  return false;
}

ModelResidency::Room ModelResidency::find_room_locked(const Model& m, int64_t now) const {
  Room room;
  room.fits_now = true;
  // Candidates: resident, not pinned, not this model, least recently used first.
  std::vector<Model*> lru;
  for (const auto& [n, v] : models_) {
    if (v.get() != &m && v->reserved && !v->pinned && !v->evicting) lru.push_back(v.get());
  }
  // Those that could go now (idle, past their minimum residency) first,
  // least recently used first within each group: a running model is chosen
  // only when the idle ones are not enough (its load then waits for it).
  const int64_t min_res = seconds_ns(options_.min_residency_s);
  auto now_ok = [&](const Model* v) { return v->running == 0 && now - v->reserved_ns >= min_res; };
  std::sort(lru.begin(), lru.end(), [&](const Model* a, const Model* b) {
    if (now_ok(a) != now_ok(b)) return now_ok(a);
    return a->last_used_ns < b->last_used_ns;
  });
  std::vector<Model*> chosen;
  for (const ModelCharge& c : m.charges) {
    const uint64_t available = c.ledger->available();
    // What earlier charges' victims free on this ledger counts too.
    uint64_t freed = 0;
    for (const Model* v : chosen) freed += v->bytes_on(c.ledger.get());
    if (available + freed >= c.bytes) continue;
    for (Model* v : lru) {
      if (available + freed >= c.bytes) break;
      if (std::find(chosen.begin(), chosen.end(), v) != chosen.end()) continue;
      const uint64_t b = v->bytes_on(c.ledger.get());
      if (b == 0) continue;
      chosen.push_back(v);
      freed += b;
    }
    if (available + freed < c.bytes) {
      room.never = true;
      room.why = "model " + m.label() + " needs " + admission::format_bytes(c.bytes) + " on " + c.ledger->name() + "; " +
                 admission::format_bytes(available) + " is available there and the models that may be evicted hold " +
                 admission::format_bytes(freed) + " (the rest is the first model's, pinned models', co-tenants' " +
                 "and the headroom)";
      return room;
    }
  }
  room.needed = chosen;
  room.fits_now = chosen.empty();
  bool all_now = true;
  room.wait_until_ns = std::numeric_limits<int64_t>::max();
  for (Model* v : chosen) {
    const bool old_enough = now - v->reserved_ns >= min_res;
    if (v->running == 0 && old_enough) {
      room.evict_now.push_back(v);
    } else {
      all_now = false;
      if (!old_enough) room.wait_until_ns = std::min(room.wait_until_ns, v->reserved_ns + min_res);
    }
  }
  if (!all_now) room.evict_now.clear();  // evict only when the whole plan can then be met
  return room;
}

bool ModelResidency::reserve_locked(Model& m) {
  std::vector<admission::Ticket> tickets;
  for (const ModelCharge& c : m.charges) {
    auto t = c.ledger->reserve({admission::OwnerKind::kModelWeights, m.name}, std::max<uint64_t>(1, c.bytes));
    if (!t.ok()) {
      for (size_t i = 0; i < tickets.size(); ++i) (void)m.charges[i].ledger->release(tickets[i]);
      return false;
    }
    tickets.push_back(*t);
  }
  m.tickets = std::move(tickets);
  m.reserved = true;
  m.loaded = false;
  m.reserved_ns = env_.now_ns();
  return true;
}

bool ModelResidency::evict_locked(std::unique_lock<std::mutex>& lk, Model& v, const std::string& for_model) {
  v.evicting = true;
  std::function<bool()> unload = v.unload;
  lk.unlock();
  const bool ok = !unload || unload();
  lk.lock();
  v.evicting = false;
  if (!ok || v.running > 0) {
    cv_.notify_all();
    return false;
  }
  for (size_t i = 0; i < v.tickets.size(); ++i) (void)v.charges[i].ledger->release(v.tickets[i]);
  v.tickets.clear();
  v.reserved = false;
  v.loaded = false;
  v.drain_for.clear();
  ++v.evictions;
  v.last_evicted_for = for_model;
  if (v.replica) v.replica->mark_unloaded();
  std::function<void(const std::string&)> log = options_.log;
  std::function<void()> observe = options_.observe;
  const std::string line = "model " + v.label() + " unloaded (" + admission::format_bytes(v.total_bytes()) + ")" +
                           (for_model.empty() ? ": keep-alive lapsed" : ": room for " + for_model);
  lk.unlock();
  if (observe) observe();
  if (log) log(line);
  lk.lock();
  cv_.notify_all();
  return true;
}

void ModelResidency::clear_drains_locked(const std::string& for_model) {
  for (auto& [n, v] : models_) {
    if (v->drain_for == for_model) v->drain_for.clear();
  }
  cv_.notify_all();
}

Status ModelResidency::begin_run(const std::string& name, const std::atomic<bool>& cancel) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = models_.find(name);
  // A path wired to a unit that was never added would run without its
  // memory reserved: fail it loudly instead.
  if (it == models_.end()) return Status::internal("model residency: no unit named " + name);
  Model& m = *it->second;
  ++m.waiting;
  const int64_t deadline = env_.now_ns() + seconds_ns(options_.room_wait_s);
  auto leave = [&](Status st) {
    --m.waiting;
    clear_drains_locked(m.name);
    return st;
  };
  for (;;) {
    if (cancel.load(std::memory_order_acquire)) return leave(Status::cancelled("request cancelled"));
    const int64_t now = env_.now_ns();
    if (m.reserved && !m.evicting && m.drain_for.empty()) {
      ++m.running;
      m.last_used_ns = now;
      m.last_used_ms = env_.wall_time_ms();
      return leave(Status::ok_status());
    }
    int64_t wake = now + kPollNs;
    if (!m.reserved && !m.evicting) {
      Room room = find_room_locked(m, now);
      if (room.never) return leave(Status(StatusCode::kResourceExhausted, room.why, FailureReason::kNoPath));
      if (room.fits_now) {
        if (reserve_locked(m)) {
          // Running from here on (before any unlock): nobody may evict what
          // this run is about to load.
          ++m.loads;
          ++m.running;
          m.last_used_ns = now;
          m.last_used_ms = env_.wall_time_ms();
          Status st = leave(Status::ok_status());
          if (options_.log) {
            const std::string line = "model " + m.label() + " reserved " + admission::format_bytes(m.total_bytes()) +
                                     ", loading";
            lk.unlock();
            options_.log(line);
          }
          return st;
        }
        // The ledger's observed use rose between the check and the
        // reservation: look again shortly.
      } else if (!room.evict_now.empty()) {
        for (Model* v : room.evict_now) {
          if (!v->reserved || v->evicting || v->running > 0) break;
          if (!evict_locked(lk, *v, m.model.empty() ? m.name : m.model)) break;
        }
        continue;
      } else {
        // Wait for the victims: mark the ones past their minimum residency
        // draining (their new runs wait), then sleep until one may go.
        const int64_t min_res = seconds_ns(options_.min_residency_s);
        for (Model* v : room.needed) {
          if (now - v->reserved_ns >= min_res && v->drain_for.empty()) v->drain_for = m.name;
        }
        if (room.wait_until_ns < wake) wake = std::max(now + 1, room.wait_until_ns);
      }
    }
    if (now >= deadline) {
      return leave(Status(StatusCode::kResourceExhausted,
                          "model " + m.label() + " waited " + std::to_string(static_cast<int64_t>(options_.room_wait_s)) +
                              " s for memory held by other models",
                          FailureReason::kNoPath));
    }
    env_.wait_until_ns(lk, cv_, std::min(wake, deadline));
  }
}

void ModelResidency::end_run(const std::string& name, bool loaded) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return;
  Model& m = *it->second;
  --m.running;
  m.last_used_ns = env_.now_ns();
  m.last_used_ms = env_.wall_time_ms();
  if (!loaded && m.running == 0 && m.reserved && !m.loaded) {
    // The load failed: nothing of the plan is held.
    for (size_t i = 0; i < m.tickets.size(); ++i) (void)m.charges[i].ledger->release(m.tickets[i]);
    m.tickets.clear();
    m.reserved = false;
  }
  const bool give_back = m.reserved && m.running == 0 && m.waiting == 0 && !m.pinned && m.keep_alive_s == 0;
  cv_.notify_all();
  if (give_back) (void)evict_locked(lk, m, "");
}

void ModelResidency::loaded(const std::string& name, double ms) {
  std::shared_ptr<Replica> replica;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = models_.find(name);
    if (it == models_.end()) return;
    Model& m = *it->second;
    m.loaded = true;
    m.last_load_ms = ms;
    m.predicted_load_ms = ms;
    replica = m.replica;
    cv_.notify_all();
  }
  if (replica) {
    replica->set_recovery_ms(ms);
    replica->mark_loaded(ms);
  }
  if (options_.log) options_.log("model unit " + name + " loaded in " + std::to_string(static_cast<int64_t>(ms)) + " ms");
}

LoadPlan ModelResidency::plan(const std::string& name, const admission::MemoryLedger* ledger) const {
  LoadPlan p;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return p;
  const Model& m = *it->second;
  if (m.reserved && !m.evicting) return p;
  p.resident = false;
  p.extra_bytes = m.bytes_on(ledger);
  // Being evicted: its own tickets still count in the ledger until its
  // unload ends, and are gone before it can be reserved again.
  if (m.reserved) p.reclaim_bytes += m.bytes_on(ledger);
  const int64_t now = env_.now_ns();
  for (const auto& [n, v] : models_) {
    if (v.get() != &m && v->reserved && !v->pinned) p.reclaim_bytes += v->bytes_on(ledger);
  }
  Room room = find_room_locked(m, now);
  p.note = "loads " + m.label() + " (" + admission::format_bytes(m.total_bytes()) + ", ~" +
           std::to_string(static_cast<int64_t>(m.predicted_load_ms)) + " ms)";
  if (!room.never && !room.needed.empty()) {
    std::string names;
    for (const Model* v : room.needed) names += (names.empty() ? "" : ", ") + v->label();
    p.note += ", evicting " + names;
    if (room.evict_now.empty() && room.wait_until_ns != std::numeric_limits<int64_t>::max()) {
      p.wait_s = static_cast<double>(room.wait_until_ns - now) / 1e9;
    }
  }
  return p;
}

void ModelResidency::set_keep_alive(const std::string& model, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [n, m] : models_)
    if (m->model == model) m->keep_alive_s = seconds;
}

double ModelResidency::keep_alive_left_locked(const Model& m, int64_t now) const {
  if (!m.reserved || m.pinned || m.running > 0 || m.waiting > 0 || m.keep_alive_s < 0) return -1;
  const double idle = static_cast<double>(now - m.last_used_ns) / 1e9;
  return std::max(0.0, m.keep_alive_s - idle);
}

void ModelResidency::expire() {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t now = env_.now_ns();
  std::vector<Model*> lapsed;
  for (auto& [n, v] : models_) {
    if (v->evicting || v->last_used_ns == 0) continue;
    if (keep_alive_left_locked(*v, now) == 0) lapsed.push_back(v.get());
  }
  for (Model* v : lapsed) (void)evict_locked(lk, *v, "");
}

std::vector<ResidentModelInfo> ModelResidency::list() const {
  std::vector<ResidentModelInfo> out;
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = env_.now_ns();
  for (const auto& [n, v] : models_) {
    ResidentModelInfo i;
    i.name = v->name;
    i.model = v->model;
    i.state = !v->reserved ? "unloaded" : v->loaded ? "loaded" : "loading";
    i.pinned = v->pinned;
    i.draining = !v->drain_for.empty();
    i.keep_alive_s = v->keep_alive_s;
    i.keep_alive_left_s = v->last_used_ns == 0 ? -1 : keep_alive_left_locked(*v, now);
    i.last_used_ms = v->last_used_ms;
    i.resident_s = v->reserved ? static_cast<double>(now - v->reserved_ns) / 1e9 : 0;
    i.running = v->running;
    i.waiting = v->waiting;
    i.bytes = v->total_bytes();
    for (const ModelCharge& c : v->charges) i.charges.emplace_back(c.ledger->name(), c.bytes);
    i.loads = v->loads;
    i.evictions = v->evictions;
    i.predicted_load_ms = v->predicted_load_ms;
    i.last_load_ms = v->last_load_ms;
    i.last_evicted_for = v->last_evicted_for;
    out.push_back(std::move(i));
  }
  return out;
}

}  // namespace spw::gateway
