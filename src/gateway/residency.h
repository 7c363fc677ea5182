// ModelResidency: which of the catalogue's models hold memory now, and the
// load / keep / evict decisions between them (issue 32).
//
// Contract. The first model of a server (the one its GPU, offload and CPU
// paths serve, as before) is always resident and is not managed here. Every
// other model of the catalogue is served by on-demand paths
// (serve::OnDemandModel: its first-choice path on the served model's
// placement and, beside a GPU one, a CPU fallback path), each a residency
// unit named by its path ("gpu/coder", "cpu/coder") whose memory plan
// (weights, KV pool and scratch per ledger: the device's and/or the host's;
// `ModelCharge`) is reserved in the shared ledgers only while that unit is
// resident. The calls below take a unit's name; a model's units are
// resident, loaded and evicted independently (the GPU copy may go while the
// CPU copy stays):
//   begin_run(name)  the on-demand executor's hook before each run. A
//                    resident model runs at once (its last use is now),
//                    unless it is draining (below): then the run waits. A
//                    model that is not resident is made so: when its plan
//                    fits what the ledgers have available it is reserved
//                    (the run then loads the weights); otherwise the least
//                    recently used resident models that are idle (no run in
//                    progress), not pinned and resident for at least
//                    min_residency_s are evicted (their path's unload(), then
//                    their tickets released and the ledgers re-observed),
//                    oldest use first, until it fits. When the room is held
//                    by models that are running or too recently loaded, the
//                    run waits on the Env's clock, and those models are
//                    marked draining once past min_residency_s: their new
//                    runs wait too, so a model whose clients keep it busy is
//                    still given up after its minimum residency, and two
//                    models that cannot both fit are served in runs instead
//                    of one load per request (the no-thrash rule; 0 turns it
//                    off, for comparison). Returns Cancelled when the run's
//                    cancel flag is set while it waits, ResourceExhausted
//                    (kNoPath) when the plan cannot fit even with every
//                    unpinned model evicted (pinned ones, co-tenants and the
//                    first model hold the rest: the message names the
//                    figures), or after room_wait_s without room.
//   end_run(name, loaded)  after every begun run; `loaded` false (its load
//                    failed) gives the reservation back.
//   loaded(name, ms) a load's measured time: the next load's prediction.
//   plan(name, ledger)  what admission needs about a model that is not
//                    resident: the bytes it adds to `ledger`, the bytes
//                    evictable models hold there, the wait before its load
//                    can start and a note naming what would be evicted.
//   expire()         evicts every idle, unpinned resident model whose
//                    keep-alive has lapsed since its last use (the gateway
//                    calls it on its refresh schedule).
//   start_expiry() starts a thread that calls expire() when the next
//                    keep-alive lapses (on the Env's clock), so an idle server
//                    gives models back without any request; stopped and joined
//                    by the destructor.
//   set_keep_alive(model, s)  a request's keep_alive, for every unit of
//                    that model: s seconds from its last use (< 0: until
//                    evicted for room; 0: given back when its runs end).
// Pinned and preloaded models are loaded at start by a warm-up run on their
// path (builder.cpp); pinned ones are never evicted.
// Thread safety: every method may be called from any thread. The unload and
// observe callbacks are called with no residency lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission/ledger.h"
#include "core/env.h"
#include "core/status.h"

namespace spw::gateway {

class Replica;

// Memory a model holds on one ledger while resident.
struct ModelCharge {
  std::shared_ptr<admission::MemoryLedger> ledger;
  uint64_t bytes = 0;
};

struct ResidencyOptions {
  double keep_alive_s = 300;    // a model's default keep-alive after its last use (< 0: forever)
  double min_residency_s = 30;  // loaded at least this long before another model's load may evict it
  double room_wait_s = 600;     // longest a run waits for room
  // Re-reads observed usage into the ledgers (after an eviction, before the
  // reservation that follows it); null: none.
  std::function<void()> observe;
  std::function<void(const std::string&)> log;  // one line per load and eviction; null: none
};

// One managed model as status and /v1/models show it.
struct ResidentModelInfo {
  std::string name;   // the unit: its path's name ("gpu/coder")
  std::string model;  // the model it serves ("coder")
  std::string state;  // "loaded", "loading" (reserved, weights coming in), "unloaded"
  bool pinned = false;
  bool draining = false;  // another model waits for its memory: new runs wait
  double keep_alive_s = 300;
  double keep_alive_left_s = -1;  // resident and idle: seconds until expiry (-1: not counting)
  int64_t last_used_ms = 0;       // the Env's wall clock; 0: never
  double resident_s = 0;          // since its reservation (0: not resident)
  int32_t running = 0;            // runs in progress
  int32_t waiting = 0;            // runs waiting in begin_run
  uint64_t bytes = 0;             // its plan, all ledgers
  std::vector<std::pair<std::string, uint64_t>> charges;  // ledger name, bytes
  uint64_t loads = 0;
  uint64_t evictions = 0;
  double predicted_load_ms = 0;  // the next load: the last measured, else the prior
  double last_load_ms = -1;      // -1: never loaded
  std::string last_evicted_for;  // the model whose load evicted it last ("" : keep-alive or never)
};

// What admission needs about a model that is not resident.
struct LoadPlan {
  bool resident = true;
  uint64_t extra_bytes = 0;    // its plan on the ledger asked about
  uint64_t reclaim_bytes = 0;  // held there by models that may be evicted for it (not pinned)
  double wait_s = 0;           // before room can be made (minimum residencies), load time excluded
  std::string note;            // "loads coder (40 MiB), evicting chat" (empty when resident)
};

class ModelResidency {
 public:
  ModelResidency(Env& env, ResidencyOptions options);
  ~ModelResidency();

  // Build time: a unit (its path's name), the model it serves, its plan,
  // whether pinned, its keep-alive (none: the options') and its predicted
  // load time. InvalidArgument for a duplicate unit.
  Status add(const std::string& name, const std::string& model, std::vector<ModelCharge> charges, bool pinned,
             std::optional<double> keep_alive_s, double predicted_load_ms);
  // Its path's unload (serve::EngineServing::unload) and replica (marked
  // loaded / unloaded, its recovery time kept at the predicted load).
  void bind(const std::string& name, std::function<bool()> unload, std::shared_ptr<Replica> replica);
  bool manages(const std::string& name) const;
  // Some unit serves `model` (a catalogue model's name).
  bool manages_model(const std::string& model) const;

  Status begin_run(const std::string& name, const std::atomic<bool>& cancel);
  void end_run(const std::string& name, bool loaded);
  void loaded(const std::string& name, double ms);

  LoadPlan plan(const std::string& name, const admission::MemoryLedger* ledger) const;
  void set_keep_alive(const std::string& model, double seconds);
  void expire();
  void start_expiry();
  std::vector<ResidentModelInfo> list() const;

 private:
  struct Model;
  struct Room;
  Room find_room_locked(const Model& m, int64_t now) const;
  bool reserve_locked(Model& m);
  // Evicts `victim` (unlocks around its unload and the observe); false when
  // its path would not give it up (a run still on it).
  bool evict_locked(std::unique_lock<std::mutex>& lk, Model& victim, const std::string& for_model);
  void clear_drains_locked(const std::string& for_model);
  double keep_alive_left_locked(const Model& m, int64_t now) const;

  Env& env_;
  const ResidencyOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<Model>> models_;
  bool stop_ = false;
  std::thread expiry_;
};

}  // namespace spw::gateway
