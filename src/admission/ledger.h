// Memory ledgers: two-phase reservations against a device's (or the host's)
// memory, pessimistic about what probes report.
//
// Contract (MemoryLedger, the shared mechanism):
//   reserve(owner, bytes)  -> Ticket, or ResourceExhausted whose message gives
//                             the request, available, capacity, headroom and the
//                             used figure with its parts (and what bounds the
//                             limit); bytes == 0 is InvalidArgument.
//   commit(ticket, actual) -> the engine has allocated `actual` bytes for the
//                             ticket: the reservation becomes `actual`. Shrinking
//                             always succeeds; growing needs the extra to be
//                             available, else ResourceExhausted and the
//                             reservation is ROLLED BACK (released: the engine
//                             could not allocate, so nothing of it is held; the
//                             ticket is gone). May be called again (KV growth).
//   release(ticket)        -> frees the reservation; NotFound for an unknown or
//                             already released/rolled-back ticket.
//   observe(used_bytes)    -> a probe's reading of total used memory on the
//                             device (ours + others). DeviceLedger only.
// Accounting. Ours = reservations of owner kinds kModelWeights and kRequest;
// co-tenant = kCoTenant (another service's declared reservation). A = bytes our
// committed tickets hold (what the engine says it allocated).
//   limit     = capacity - headroom,  headroom = headroom_bytes + headroom_fraction * capacity
//   others    = max(0, observed - A_min)
//   used      = reserved_ours + max(reserved_cotenant, others)
//   available = max(0, limit - used)
// i.e. available = capacity - headroom - max(sum of reservations, observed usage
// attributable to others + our reservations). A_min is the least A has been since
// the previous observe(): a reading taken in that window may or may not include
// allocations committed or released in it, and assuming it saw the smallest A
// attributes the most to others. Why the pessimistic side: probe readings lag
// and overstate or understate in ways we cannot see — a caching allocator keeps
// freed blocks (memory we released still reads as used), kernels still in
// flight hold buffers, and another service can allocate between our check and
// our allocation; and our uncommitted reservations may or may not already be
// in a reading, so they are counted on top of it. Memory we release is
// therefore available again only after the next observe() shows it free. A
// co-tenant's reservation and its observed use are the same memory, hence max
// rather than sum. Every successful reserve/commit keeps used <= limit, so the
// sum of all reservations never exceeds capacity - headroom; observe() can
// make used exceed the limit (others grew) and then available() is 0.
// HostLedger: the same mechanism (subclass, no copy) where the capacity comes
// from readings passed in as plain numbers: budget = min(mem_available_share *
// MemAvailable, cgroup_share * (memory.max - memory.current)); the readings
// already reflect what we allocated, so capacity = budget + A_min and others =
// 0 (with HostBudgetPolicy::cap_bytes the budget is at most that). Rejections
// name the limit that bound (MemAvailable, cgroup or cap).
// Thread safety: every method takes the ledger's mutex; a ledger may be shared
// by any number of threads. Tickets are plain values.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace spw::admission {

enum class OwnerKind { kModelWeights = 0, kRequest = 1, kCoTenant = 2 };
inline constexpr int kNumOwnerKinds = 3;
std::string_view owner_kind_name(OwnerKind k);

struct Owner {
  OwnerKind kind = OwnerKind::kRequest;
  std::string id;  // e.g. model name, request id, service name (for messages)
};

struct Ticket {
  uint64_t id = 0;  // 0 is never issued
  bool valid() const { return id != 0; }
};

struct HeadroomPolicy {
  uint64_t bytes = 0;     // absolute reserve
  double fraction = 0.0;  // of capacity, in [0, 1)
};

struct LedgerSnapshot {
  std::string name;
  uint64_t capacity = 0;
  uint64_t headroom = 0;
  uint64_t limit = 0;  // capacity - headroom (0 if headroom >= capacity)
  uint64_t reserved[kNumOwnerKinds] = {0, 0, 0};
  uint64_t reserved_ours = 0;    // weights + requests
  uint64_t reserved_total = 0;   // all kinds
  uint64_t committed_ours = 0;   // A
  uint64_t committed_ours_min = 0;  // A_min since the last observe
  uint64_t observed = 0;
  uint64_t others = 0;
  uint64_t used = 0;
  uint64_t available = 0;
  size_t n_tickets = 0;
};

std::string format_bytes(uint64_t bytes);  // "1.50 GiB (1610612736 B)"

class MemoryLedger {
 public:
  virtual ~MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  Result<Ticket> reserve(const Owner& owner, uint64_t bytes);
  // Records memory that someone else uses or is about to use (a co-tenant's
  // declared reservation): unlike reserve() it never refuses for lack of
  // room, because refusing would not stop the other process; afterwards
  // used may exceed the limit and available() is 0 until it is released.
  // InvalidArgument for bytes == 0 or an owner kind other than kCoTenant.
  Result<Ticket> declare(const Owner& owner, uint64_t bytes);
  Status commit(Ticket ticket, uint64_t actual_bytes);
  Status release(Ticket ticket);

  uint64_t available() const;
  LedgerSnapshot snapshot() const;
  const std::string& name() const { return name_; }

 protected:
  MemoryLedger(std::string name, uint64_t capacity, HeadroomPolicy headroom, bool capacity_tracks_ours);

  // Under mu_. Subclasses set the inputs of the formula.
  void set_capacity_locked(uint64_t capacity) { capacity_ = capacity; }
  uint64_t capacity_locked() const { return capacity_; }
  void set_capacity_ceiling_locked(uint64_t ceiling) { capacity_ceiling_ = ceiling; }
  uint64_t committed_ours_min_locked() const { return committed_ours_min_; }
  void set_observed_locked(uint64_t observed);
  // Extra words for rejection messages ("bound by cgroup ..."); under mu_.
  void set_limit_note_locked(std::string note) { limit_note_ = std::move(note); }

  mutable std::mutex mu_;

 private:
  struct Entry {
    Owner owner;
    uint64_t bytes = 0;
    bool committed = false;
  };
  struct Figures {
    uint64_t capacity, headroom, limit, others, used, available;
  };
  Figures figures_locked() const;
  std::string describe_locked(const Figures& f) const;
  void set_committed_locked(uint64_t a);

  std::string name_;
  uint64_t capacity_ = 0;
  HeadroomPolicy headroom_;
  bool capacity_tracks_ours_ = false;  // host: capacity_ is the free budget, add A_min
  std::optional<uint64_t> capacity_ceiling_;  // host cap: the total never exceeds it
  uint64_t observed_ = 0;
  uint64_t reserved_[kNumOwnerKinds] = {0, 0, 0};
  uint64_t committed_ours_ = 0;
  uint64_t committed_ours_min_ = 0;
  std::string limit_note_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Entry> entries_;
};

class DeviceLedger final : public MemoryLedger {
 public:
  // InvalidArgument: capacity 0, fraction outside [0, 1), headroom >= capacity.
  static Result<std::unique_ptr<DeviceLedger>> create(std::string name, uint64_t capacity,
                                                      HeadroomPolicy headroom = {});
  // Total used bytes on the device as a probe read it (see the window rule).
  void observe(uint64_t used_bytes);
  // A reading of the whole physical heap (heap_size, heap_used: ours +
  // others) when this ledger's capacity may be a smaller budget on it (`serve
  // --device-memory`). Others then only count for what they take out of our
  // budget: observe(max(0, heap_used - (heap_size - capacity))), which makes
  // available = min(budget left, heap_size - heap_used - ours' uncommitted
  // part - headroom). With capacity == heap_size it is observe(heap_used).
  void observe_heap(uint64_t heap_size, uint64_t heap_used);

 private:
  using MemoryLedger::MemoryLedger;
};

// Host readings, plain numbers (the probes live in src/device).
struct HostReadings {
  uint64_t mem_available = 0;              // /proc/meminfo MemAvailable, bytes
  std::optional<uint64_t> cgroup_max;      // memory.max; nullopt = "max" or no cgroup v2
  uint64_t cgroup_current = 0;             // memory.current
};

struct HostBudgetPolicy {
  double mem_available_share = 0.5;  // (0, 1]
  double cgroup_share = 0.8;         // (0, 1]
  HeadroomPolicy headroom;           // applied to the budget, usually 0
  // A fixed ceiling (`serve --host-budget`) on the total the ledger's owners
  // may hold, committed bytes included (the shares bound what is still free);
  // binding limit "cap". For a machine shared with services that do not show
  // in MemAvailable yet, and for tests.
  std::optional<uint64_t> cap_bytes;
};

class HostLedger final : public MemoryLedger {
 public:
  // InvalidArgument for a share outside (0, 1] or a bad headroom fraction.
  static Result<std::unique_ptr<HostLedger>> create(std::string name, HostBudgetPolicy policy,
                                                    const HostReadings& readings);
  // New readings (taken after the previous call returned). cgroup_current >
  // cgroup_max reads as no room.
  void update(const HostReadings& readings);
  // Which limit binds now: "MemAvailable", "cgroup" or "cap".
  std::string binding_limit() const;

 private:
  HostLedger(std::string name, HostBudgetPolicy policy);
  void apply_locked(const HostReadings& r);
  HostBudgetPolicy policy_;
  std::string binding_;
};

}  // namespace spw::admission
