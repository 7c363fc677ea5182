// Gateway: co-tenant memory reservations on a device's ledger: reserve,
// renew, release, list, expiry (gateway.h's contract: reserve_cotenant).
// Split from gateway.cpp.
#include "gateway/gateway.h"

#include <set>
#include <string>
#include <vector>

#include "core/size.h"

namespace spw::gateway {

admission::MemoryLedger* Gateway::cotenant_ledger() const {
  // The first path's ledger is the first-choice device's (the GPU's when
  // there is one): co-tenants compete for that memory.
  for (const ExecutionPath& p : paths_)
    if (p.ledger) return p.ledger.get();
  return nullptr;
}

ReservationInfo Gateway::info_locked(uint64_t id, int64_t now) const {
  const Lease& l = leases_.at(id);
  ReservationInfo r;
  r.id = id;
  r.owner = l.owner;
  r.name = l.name;
  r.ledger = l.ledger->name();
  r.bytes = l.bytes;
  r.ttl_s = l.ttl_s;
  r.expires_in_s = static_cast<double>(l.expires_ns - now) / 1e9;
  r.after = l.ledger->snapshot();
  r.fits = r.after.used <= r.after.limit;
  return r;
}

namespace {
std::string lease_not_found(uint64_t id) { return "reservation " + std::to_string(id) + " (released or expired)"; }
bool may_touch(const ReservationCaller& who, const std::string& owner) { return who.admin || who.owner == owner; }
}  // namespace

std::string Gateway::takes_last_path(const admission::MemoryLedger& ledger, uint64_t bytes) const {
  // Asked of decide() itself, so that every rule of admission (contexts,
  // breakers, the CPU path's host budget) counts: the smallest request each
  // model can take, now and with the lease added to every path on its ledger.
  std::set<std::string> models;
  for (const ExecutionPath& p : paths_) models.insert(p.model);
  admission::RequestShape smallest;
  smallest.prompt_tokens = 1;
  smallest.max_tokens = 1;
  for (const std::string& m : models) {
    std::vector<admission::PathSnapshot> snaps = snapshots_for(m);
    if (decide(smallest, snaps).kind == admission::DecisionKind::kReject) continue;  // nothing to take away
    for (admission::PathSnapshot& s : snaps) {
      if (s.ledger != ledger.name()) continue;
      // max(co-tenants + bytes, others) <= max(co-tenants, others) + bytes:
      // the pessimistic side.
      s.ledger_used += bytes;
      s.ledger_cotenants += bytes;
    }
    const admission::Decision after = decide(smallest, snaps);
    if (after.kind == admission::DecisionKind::kReject)
      return "model " + m + " would have no path left: " + after.reason;
  }
  return "";
}

Result<ReservationInfo> Gateway::reserve_cotenant(const std::string& name, uint64_t bytes, double ttl_s,
                                                  const ReservationCaller& who) {
  if (name.empty() || name.size() > 64) return invalid_field("name", "name: 1 to 64 characters");
  if (Status st = check_byte_size(bytes, "bytes"); !st.ok()) return invalid_field("bytes", st.message());
  if (!(ttl_s > 0) || ttl_s > 86400.0) return invalid_field("ttl_s", "ttl_s: must be in (0, 86400]");
  admission::MemoryLedger* ledger = cotenant_ledger();
  if (!ledger) return Status::failed_precondition("this server keeps no memory ledger to reserve in");
  refresh();
  // One reservation is checked and declared at a time: two that each fit
  // the share alone must not both pass on the same figures.
  std::lock_guard<std::mutex> serial(reserve_mu_);
  const admission::LedgerSnapshot before = ledger->snapshot();
  uint64_t leased = 0;  // what clients' leases hold on this ledger now (refresh() dropped the lapsed ones)
  {
    std::lock_guard<std::mutex> lk(mu_);
    size_t mine = 0;
    for (const auto& [id, l] : leases_) {
      if (l.owner == who.owner) ++mine;
      if (l.ledger == ledger) leased += l.bytes;
    }
    if (mine >= kMaxReservationsPerOwner) {
      return Status::resource_exhausted("too many reservations for this API key (" +
                                        std::to_string(kMaxReservationsPerOwner) + "); release some first");
    }
    if (leases_.size() >= kMaxReservations) {
      return Status::resource_exhausted("too many reservations on this server (" + std::to_string(kMaxReservations) +
                                        "); release some first");
    }
  }
  if (policy_.reservation_max_share < 1.0) {
    const auto cap = static_cast<uint64_t>(policy_.reservation_max_share * static_cast<double>(before.limit));
    if (leased + bytes > cap) {
      return Status::failed_precondition(
          "reservation of " + admission::format_bytes(bytes) + " refused: co-tenant reservations on " + before.name +
          " would hold " + admission::format_bytes(leased + bytes) + ", more than " +
          std::to_string(static_cast<int>(policy_.reservation_max_share * 100 + 0.5)) + "% of its limit " +
          admission::format_bytes(before.limit) + " (" + admission::format_bytes(cap) +
          "; the operator sets the share with --reservation-max-share)");
    }
    const std::string last = takes_last_path(*ledger, bytes);
    if (!last.empty()) {
      return Status::failed_precondition("reservation of " + admission::format_bytes(bytes) + " on " + before.name +
                                         " refused: " + last +
                                         " (the operator allows it with --reservation-max-share 1)");
    }
  }
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  SPW_ASSIGN_OR_RETURN(admission::Ticket t, ledger->declare({admission::OwnerKind::kCoTenant, name}, bytes));
  const uint64_t id = next_lease_id_++;
  leases_[id] = Lease{who.owner, name, ledger, t, bytes, ttl_s, now + static_cast<int64_t>(ttl_s * 1e9)};
  return info_locked(id, now);
}

Result<ReservationInfo> Gateway::renew(uint64_t id, const ReservationCaller& who) {
  refresh();
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  auto it = leases_.find(id);
  // Another owner's lease is as absent as a released one: its existence is
  // none of the caller's business.
  if (it == leases_.end() || !may_touch(who, it->second.owner)) return Status::not_found(lease_not_found(id));
  it->second.expires_ns = now + static_cast<int64_t>(it->second.ttl_s * 1e9);
  return info_locked(id, now);
}

Status Gateway::release(uint64_t id, const ReservationCaller& who) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || !may_touch(who, it->second.owner)) return Status::not_found(lease_not_found(id));
  Status st = it->second.ledger->release(it->second.ticket);
  leases_.erase(it);
  return st;
}

std::vector<ReservationInfo> Gateway::reservations(const ReservationCaller& who) {
  refresh();
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<ReservationInfo> out;
  for (const auto& [id, l] : leases_)
    if (may_touch(who, l.owner)) out.push_back(info_locked(id, now));
  return out;
}

}  // namespace spw::gateway
