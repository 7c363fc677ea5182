#include "admission/ledger.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/size.h"

namespace spw::admission {

namespace {
bool is_ours(OwnerKind k) { return k != OwnerKind::kCoTenant; }
uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }
std::string owner_str(const Owner& o) { return std::string(owner_kind_name(o.kind)) + " '" + o.id + "'"; }
// Sizes beyond the one domain (core/size.h) are refused at the door, so the
// ledger's sums (at most a few thousand entries of at most 2^50 each) cannot
// wrap around: one wrapped total once erased every co-tenant's declaration.
Status check_entry_size(const std::string& ledger, std::string_view what, uint64_t bytes, const Owner& owner) {
  if (bytes == 0) return Status::invalid_argument("ledger '" + ledger + "': " + std::string(what) + " of 0 bytes for " + owner_str(owner));
  return check_byte_size(bytes, "ledger '" + ledger + "': " + std::string(what) + " for " + owner_str(owner));
}
Status check_headroom(const HeadroomPolicy& h) {
  if (!(h.fraction >= 0.0) || !(h.fraction < 1.0))
    return Status::invalid_argument("ledger headroom fraction " + std::to_string(h.fraction) +
                                    " is outside [0, 1)");
  return Status();
}
}  // namespace

std::string_view owner_kind_name(OwnerKind k) {
  switch (k) {
    case OwnerKind::kModelWeights: return "model-weights";
    case OwnerKind::kRequest: return "request";
    case OwnerKind::kCoTenant: return "co-tenant";
  }
  return "?";
}

// The readable size and the exact count: ledger messages explain refusals
// whose arithmetic a reader may want to redo.
std::string format_bytes(uint64_t b) {
  return b < 1024 ? format_byte_size(b) : format_byte_size(b) + " (" + std::to_string(b) + " B)";
}

MemoryLedger::MemoryLedger(std::string name, uint64_t capacity, HeadroomPolicy headroom, bool tracks)
    : name_(std::move(name)), capacity_(capacity), headroom_(headroom), capacity_tracks_ours_(tracks) {}

MemoryLedger::Figures MemoryLedger::figures_locked() const {
  Figures f{};
  f.capacity = capacity_tracks_ours_ ? capacity_ + committed_ours_min_ : capacity_;
  // A fixed ceiling caps the total, what we hold included.
  if (capacity_ceiling_) f.capacity = std::min(f.capacity, *capacity_ceiling_);
  f.headroom = headroom_.bytes + static_cast<uint64_t>(std::ceil(headroom_.fraction * static_cast<double>(f.capacity)));
  f.limit = sat_sub(f.capacity, f.headroom);
  f.others = capacity_tracks_ours_ ? 0 : sat_sub(observed_, committed_ours_min_);
  const uint64_t ours = reserved_[0] + reserved_[1];
  f.used = ours + std::max(reserved_[2], f.others);
  f.available = sat_sub(f.limit, f.used);
  return f;
}

std::string MemoryLedger::describe_locked(const Figures& f) const {
  std::string s = "available " + format_bytes(f.available) + " = capacity " + format_bytes(f.capacity) +
                  " - headroom " + format_bytes(f.headroom) + " - used " + format_bytes(f.used) + " (ours " +
                  format_bytes(reserved_[0] + reserved_[1]) + " reserved, co-tenant " + format_bytes(reserved_[2]) +
                  " reserved, others observed " + format_bytes(f.others) + ")";
  if (!limit_note_.empty()) s += "; " + limit_note_;
  return s;
}

void MemoryLedger::set_committed_locked(uint64_t a) {
  committed_ours_ = a;
  committed_ours_min_ = std::min(committed_ours_min_, a);
}

void MemoryLedger::set_observed_locked(uint64_t observed) {
  observed_ = observed;
  committed_ours_min_ = committed_ours_;  // a new window starts
}

Result<Ticket> MemoryLedger::reserve(const Owner& owner, uint64_t bytes) {
  SPW_RETURN_IF_ERROR(check_entry_size(name_, "reserve", bytes, owner));
  std::lock_guard<std::mutex> lk(mu_);
  const Figures f = figures_locked();
  if (bytes > f.limit)
    return Status::resource_exhausted("ledger '" + name_ + "': cannot reserve " + format_bytes(bytes) + " for " +
                                      owner_str(owner) + ": more than the whole limit; " + describe_locked(f));
  // A co-tenant reservation overlapping observed others only adds its excess.
  const uint64_t ours = reserved_[0] + reserved_[1];
  uint64_t used_after;
  if (is_ours(owner.kind)) used_after = ours + bytes + std::max(reserved_[2], f.others);
  else used_after = ours + std::max(reserved_[2] + bytes, f.others);
  if (used_after > f.limit) {
    return Status::resource_exhausted("ledger '" + name_ + "': cannot reserve " + format_bytes(bytes) + " for " +
                                      owner_str(owner) + ": " + describe_locked(f));
  }
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{owner, bytes, false});
  reserved_[static_cast<int>(owner.kind)] += bytes;
  return Ticket{id};
}

Result<Ticket> MemoryLedger::declare(const Owner& owner, uint64_t bytes) {
  SPW_RETURN_IF_ERROR(check_entry_size(name_, "declaration", bytes, owner));
  if (owner.kind != OwnerKind::kCoTenant) {
    return Status::invalid_argument("ledger '" + name_ + "': only a co-tenant's memory is declared, not " +
                                    owner_str(owner) + "'s");
  }
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{owner, bytes, false});
  reserved_[static_cast<int>(owner.kind)] += bytes;
  return Ticket{id};
}

Status MemoryLedger::commit(Ticket t, uint64_t actual) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(t.id);
  if (it == entries_.end())
    return Status::not_found("ledger '" + name_ + "': commit of unknown ticket " + std::to_string(t.id));
  Entry& e = it->second;
  if (actual > kMaxByteSize) return check_entry_size(name_, "commit", actual, e.owner);
  const int k = static_cast<int>(e.owner.kind);
  const bool ours = is_ours(e.owner.kind);
  if (actual > e.bytes) {
    const uint64_t extra = actual - e.bytes;
    const Figures f = figures_locked();
    const bool too_big = extra > f.limit;
    const uint64_t ours_res = reserved_[0] + reserved_[1];
    uint64_t used_after = ours ? ours_res + extra + std::max(reserved_[2], f.others)
                               : ours_res + std::max(reserved_[2] + extra, f.others);
    if (too_big || used_after > f.limit) {
      const std::string msg = "ledger '" + name_ + "': commit of " + format_bytes(actual) + " for " +
                              owner_str(e.owner) + " exceeds its reservation of " + format_bytes(e.bytes) +
                              " by " + format_bytes(extra) + ", which does not fit: " + describe_locked(f) +
                              "; reservation rolled back";
      // Roll back: the engine could not allocate, so nothing of it is held.
      reserved_[k] -= e.bytes;
      if (e.committed && ours) set_committed_locked(committed_ours_ - e.bytes);
      entries_.erase(it);
      return Status::resource_exhausted(msg);
    }
  }
  reserved_[k] = reserved_[k] - e.bytes + actual;
  if (ours) set_committed_locked(committed_ours_ - (e.committed ? e.bytes : 0) + actual);
  e.bytes = actual;
  e.committed = true;
  return Status();
}

Status MemoryLedger::release(Ticket t) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(t.id);
  if (it == entries_.end())
    return Status::not_found("ledger '" + name_ + "': release of unknown ticket " + std::to_string(t.id));
  const Entry& e = it->second;
  reserved_[static_cast<int>(e.owner.kind)] -= e.bytes;
  if (e.committed && is_ours(e.owner.kind)) set_committed_locked(committed_ours_ - e.bytes);
  entries_.erase(it);
  return Status();
}

uint64_t MemoryLedger::available() const {
  std::lock_guard<std::mutex> lk(mu_);
  return figures_locked().available;
}

LedgerSnapshot MemoryLedger::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  const Figures f = figures_locked();
  LedgerSnapshot s;
  s.name = name_;
  s.capacity = f.capacity;
  s.headroom = f.headroom;
  s.limit = f.limit;
  for (int i = 0; i < kNumOwnerKinds; ++i) s.reserved[i] = reserved_[i];
  s.reserved_ours = reserved_[0] + reserved_[1];
  s.reserved_total = s.reserved_ours + reserved_[2];
  s.committed_ours = committed_ours_;
  s.committed_ours_min = committed_ours_min_;
  s.observed = observed_;
  s.others = f.others;
  s.used = f.used;
  s.available = f.available;
  s.n_tickets = entries_.size();
  return s;
}

// ---------------------------------------------------------------- DeviceLedger

Result<std::unique_ptr<DeviceLedger>> DeviceLedger::create(std::string name, uint64_t capacity,
                                                           HeadroomPolicy headroom) {
  if (capacity == 0) return Status::invalid_argument("device ledger '" + name + "': capacity 0");
  SPW_RETURN_IF_ERROR(check_headroom(headroom));
  const uint64_t h = headroom.bytes + static_cast<uint64_t>(std::ceil(headroom.fraction * static_cast<double>(capacity)));
  if (h >= capacity)
    return Status::invalid_argument("device ledger '" + name + "': headroom " + format_bytes(h) +
                                    " leaves nothing of capacity " + format_bytes(capacity));
  return std::unique_ptr<DeviceLedger>(new DeviceLedger(std::move(name), capacity, headroom, false));
}

void DeviceLedger::observe(uint64_t used_bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  set_observed_locked(used_bytes);
}

void DeviceLedger::observe_heap(uint64_t heap_size, uint64_t heap_used) {
  std::lock_guard<std::mutex> lk(mu_);
  // Memory outside our budget's share of the heap is others' to use freely.
  const uint64_t outside = sat_sub(heap_size, capacity_locked());
  set_observed_locked(sat_sub(heap_used, outside));
}

// ---------------------------------------------------------------- HostLedger

HostLedger::HostLedger(std::string name, HostBudgetPolicy policy)
    : MemoryLedger(std::move(name), 0, policy.headroom, true), policy_(policy) {}

Result<std::unique_ptr<HostLedger>> HostLedger::create(std::string name, HostBudgetPolicy policy,
                                                       const HostReadings& readings) {
  auto share_ok = [](double s) { return s > 0.0 && s <= 1.0; };
  if (!share_ok(policy.mem_available_share))
    return Status::invalid_argument("host ledger '" + name + "': mem_available_share " +
                                    std::to_string(policy.mem_available_share) + " is outside (0, 1]");
  if (!share_ok(policy.cgroup_share))
    return Status::invalid_argument("host ledger '" + name + "': cgroup_share " +
                                    std::to_string(policy.cgroup_share) + " is outside (0, 1]");
  SPW_RETURN_IF_ERROR(check_headroom(policy.headroom));
  std::unique_ptr<HostLedger> l(new HostLedger(std::move(name), policy));
  l->update(readings);
  return l;
}

void HostLedger::apply_locked(const HostReadings& r) {
  const uint64_t by_mem =
      static_cast<uint64_t>(std::floor(policy_.mem_available_share * static_cast<double>(r.mem_available)));
  std::string note = "MemAvailable " + format_bytes(r.mem_available) + " x " + std::to_string(policy_.mem_available_share) +
                     " = " + format_bytes(by_mem);
  uint64_t budget = by_mem;
  binding_ = "MemAvailable";
  if (r.cgroup_max) {
    const uint64_t room = sat_sub(*r.cgroup_max, r.cgroup_current);
    const uint64_t by_cg = static_cast<uint64_t>(std::floor(policy_.cgroup_share * static_cast<double>(room)));
    note += ", cgroup memory.max " + format_bytes(*r.cgroup_max) + " - memory.current " +
            format_bytes(r.cgroup_current) + " x " + std::to_string(policy_.cgroup_share) + " = " + format_bytes(by_cg);
    if (by_cg < by_mem) {
      budget = by_cg;
      binding_ = "cgroup";
    }
  }
  if (policy_.cap_bytes) {
    // The cap bounds the total (our committed bytes included); the shares
    // bound what is still free. Which binds depends on what we hold.
    note += ", cap " + format_bytes(*policy_.cap_bytes) + " in all";
    set_capacity_ceiling_locked(*policy_.cap_bytes);
    if (*policy_.cap_bytes < budget + committed_ours_min_locked()) binding_ = "cap";
  }
  set_capacity_locked(budget);
  set_observed_locked(0);  // starts a new A_min window
  set_limit_note_locked("host budget bound by " + binding_ + " (" + note + ")");
}

void HostLedger::update(const HostReadings& r) {
  std::lock_guard<std::mutex> lk(mu_);
  apply_locked(r);
}

std::string HostLedger::binding_limit() const {
  std::lock_guard<std::mutex> lk(mu_);
  return binding_;
}

}  // namespace spw::admission
