// The steps build_gateway (builder.h) composes a server from, each with its
// own contract, exposed for the other composition of the same server: the
// drill's simulation (drill/simulation.cpp), which fakes the device and the
// engines but must wire the breaker, the observers, the schedulers and the
// gateway's policy exactly as `spillway serve` does, from the same typed
// GatewayOptions. Steps that touch the real device or model files (the GPU
// and CPU memory plans, the replica choice, the engines) stay private to
// builder.cpp: the simulation has its own stand-ins for them.
// Thread safety: every function is called on the composing thread; the
// objects they return are thread-safe as their own headers say.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "admission/controller.h"
#include "admission/ledger.h"
#include "core/env.h"
#include "core/status.h"
#include "gateway/breaker.h"
#include "gateway/builder.h"
#include "gateway/device_control.h"
#include "gateway/gateway.h"
#include "journal/journal.h"
#include "serve/scheduler.h"

namespace spw {
class VulkanBackend;
}

namespace spw::gateway {

// Positions per KV block on every path (the pools, the KV gate, the plans).
inline constexpr int32_t kBlockTokens = 16;

// The range checks on options that need no file or device (workers >= 1,
// queues and contexts >= 0, admission, replica budget, offload, breaker,
// health and bandwidth figures). InvalidArgument with field() the option's
// key and a message starting with it (builder.h). The checks that need the
// model (ctx against its context_length, offload_layers against its layers,
// the fallback model's tokenizer) are build_gateway's.
Status check_options(const GatewayOptions& o);

// --- Host ledger.
// The host's memory now: MemAvailable (Unavailable when unknown) and the
// cgroup's limit and use when it has one.
Result<admission::HostReadings> host_readings(Env& env);
// Everything the server holds in host memory: host_memory_share of what the
// readings leave (builder.h), capped at host_budget when given.
Result<std::shared_ptr<admission::HostLedger>> make_host_ledger(Env& env, const GatewayOptions& o);

// --- Journal.
// Opens options.journal ("" : default_journal_path(), its folder made;
// "none": null) with the retention and size budgets of the options.
Result<std::shared_ptr<journal::Journal>> open_journal(Env& env, const GatewayOptions& o);

// --- Breaker and device control.
// The GPU device's breaker options (breaker_* options); InvalidArgument
// naming the option (e.g. field "breaker-cooldown-s") when out of range.
Result<BreakerOptions> breaker_options(const GatewayOptions& o);
// What the gateway may do to a Vulkan device: its health check, its
// re-initialisation (before the breaker's probes) and its armed faults for
// the admin API. Holds the backend weakly (the paths' session groups own it):
// once it is gone the checks fail as unhealthy.
std::shared_ptr<DeviceControl> make_device_control(Env& env, const std::shared_ptr<VulkanBackend>& vulkan);

// --- Observers.
// A path's request observer: the journal's (null: none) and, on a GPU-side
// path (breaker non-null), the device breaker's, each told every outcome.
// Null when both are.
std::shared_ptr<serve::RequestObserver> path_observer(std::shared_ptr<serve::RequestObserver> journal,
                                                      std::shared_ptr<CircuitBreaker> breaker);

// --- Gateway policy.
// The admission, overflow, observe, health and reservation settings of the
// options. What a composition adds itself: observe (its ledgers' readings),
// log, equivalence_store.
GatewayPolicy gateway_policy(const GatewayOptions& o);

// --- Scheduling, per path role.
// What the options give one path: the first-choice path (kPrimary) runs
// parallel workers, queue and ctx; the CPU fallback (kFallback) cpu_parallel,
// cpu_queue and cpu_ctx (0: first_ctx, the first path's resolved context);
// the offload path (kOffload) one worker, offload_queue and first_ctx.
// first_ctx must be resolved (> 0). A CPU first-choice path is kPrimary.
struct PathShape {
  int32_t workers = 1;
  int32_t queue = 0;
  int32_t ctx = 0;
};
PathShape path_shape(const GatewayOptions& o, admission::PathRole role, int32_t first_ctx);
// The KV blocks a path wants: kv_blocks when given for the first-choice
// path, else its workers' full contexts (a GPU pool is then bounded by what
// the device ledger has left).
int32_t wanted_kv_blocks(const GatewayOptions& o, admission::PathRole role, const PathShape& shape);
// The scheduler settings every path takes from the options and its shape:
// queue capacity, context, KV block size, checkpoint interval, path name and
// observer. The engine's settings (workers, KV pool, gate, batching, prior
// rates, hooks) are the composition's.
serve::SchedulerOptions scheduler_options(const GatewayOptions& o, const std::string& path, const PathShape& shape,
                                          std::shared_ptr<serve::RequestObserver> observer);

}  // namespace spw::gateway
