// Engine serving: a Scheduler whose workers run Sessions over one shared Model
// placed on the CPU, on one Vulkan device, or split (hybrid:N).
//
// Contract: make_engine_scheduler() opens the session group of
// engine/device_session.h (one backend per device shared by every worker, one
// KvPool per stage of kv_blocks blocks; 0: enough for every worker to hold a
// full context, n_workers * ceil(n_ctx / block_tokens)), one Session per
// worker, and the Scheduler over them. n_ctx 0 means the model's
// context_length; a larger n_ctx than context_length, n_workers < 1,
// n_threads < 1, a negative kv_blocks or queue is InvalidArgument naming the
// option; the Vulkan forms fail with the backend's Unavailable / NotFound when
// no device is there, ResourceExhausted when the weights or the pools exceed
// its memory budget. Each worker keeps the KV of its last request so that a
// following request with the same prefix skips that part of the prefill; when
// a pool is smaller than the default, a worker releases its KV after every
// request instead, so idle workers never starve busy ones. A request takes the
// KV for prompt + max_tokens before its first token, and fails with
// ResourceExhausted there when the pools have not that much left.
// Recovery: with layers on a Vulkan device the workers share their session
// group, which re-opens itself once the backend was re-initialised (after a
// device fault: VulkanBackend::reinitialize drops the uploaded weights and
// rejects the old KV pools). The first run that starts while no other worker
// of the group is mid-run drops the old group and opens it again with the
// same options (weights uploaded again, pools of the same sizes; on_reopened
// hears the outcome and its time). A run that finds the group stale while
// another worker is mid-run or re-opening it fails with Unavailable (no typed
// reason: it says nothing about the device); a failed re-open fails that run
// with the open's status (typed by the backend) and the next run tries again.
// Thread safety: as Scheduler.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "backend/fault_injector.h"
#include "backend/vulkan/device_spec.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/env.h"
#include "core/placement.h"
#include "core/status.h"
#include "engine/step_batcher.h"
#include "model/model.h"
#include "serve/scheduler.h"

namespace spw::serve {

struct EngineServeOptions {
  Placement device;                  // cpu (default), vulkan[:i], hybrid:N
  uint64_t device_memory_bytes = 0;  // Vulkan budget; 0 = largest device-local heap
  std::shared_ptr<VulkanBackend> vulkan;  // an open backend to use instead (see SessionGroupOptions)
  int32_t n_workers = 1;
  int32_t n_threads = 1;  // CPU backend threads, shared by all workers
  int32_t n_ctx = 0;      // 0: the model's context_length
  int32_t kv_blocks = 0;  // per stage; 0: n_workers full contexts
  int32_t kv_block_tokens = 16;
  KvType kv_type = KvType::kF32;  // SessionGroupOptions::kv_type (serve passes f16 by default)
  FaultInjector* cpu_faults = nullptr;  // SessionGroupOptions::cpu_faults (not owned)
  int32_t queue_capacity = 64;
  SchedulerHooks hooks;
  std::shared_ptr<RequestObserver> observer;  // e.g. a JournalObserver; null: none
  std::string path_name = "default";          // SchedulerOptions::path
  // Gate the queue on the pool's blocks (SchedulerOptions::kv_blocks_total =
  // the pool's n_blocks): requests start only when their KV is free, so a
  // pool smaller than workers x context is shared by short requests.
  bool kv_gate = false;
  admission::PathRates prior_rates{200.0, 20.0, 1.0, 0, false};
  int32_t checkpoint_every = 0;  // SchedulerOptions::checkpoint_every
  // Continuous batching (engine/step_batcher.h): the workers' decode steps
  // and prompt chunks share one pass over the weights, on every placement; a
  // step waits at most batch_max_wait_us for a member busy elsewhere. Off or
  // one worker: each runs alone.
  bool batching = true;
  int32_t batch_max_wait_us = 1000;
  // Prompts in chunks inside the steps (StepBatcherOptions::mix_prefill);
  // false runs them beside the steps, for comparison.
  bool mix_prefill = true;
  // Rows per batched step (StepBatcherOptions::step_tokens), at most the
  // sessions' n_ubatch (64), the rows the estimator prices; 0: n_ubatch.
  // 32: measured on the CPU path (docs/PERFORMANCE.md), a 274-token prompt
  // arriving beside 4 streams gets its first token as soon as with 64-token
  // steps while their inter-token gaps stay about half as long.
  int32_t step_tokens = 32;
  // With layers on Vulkan: told (on the worker's thread) after the session
  // group re-opened itself following a re-initialisation of the device, with
  // the outcome and how long it took (weights upload and pools). Null: none.
  std::function<void(const Status& outcome, double ms)> on_reopened;
};

struct EngineServing {
  std::unique_ptr<Scheduler> scheduler;
  // The Vulkan backend every worker shares; null when no layer runs on Vulkan.
  // For device-memory figures (memory_stats) and health.
  std::shared_ptr<VulkanBackend> vulkan;
  // What was built, e.g. "hybrid: layers 0-2 vulkan (llvmpipe ...), 3-4 cpu".
  std::string placement_detail;
  // The workers' step batcher (null: batching off or one worker).
  std::shared_ptr<StepBatcher> batcher;
  // On-demand paths only (null otherwise): gives the loaded weights and
  // sessions back once no worker runs on them (true; waits up to 5 s for a
  // worker still leaving its run), so that the next request loads again;
  // false while one still does.
  std::function<bool()> unload;
};

Result<EngineServing> make_engine_scheduler(Env& env, std::shared_ptr<const Model> model,
                                            const EngineServeOptions& options);

// A path whose model is loaded at its first request (replica "on-demand",
// and the catalogue's models beyond the first): nothing of the weights is
// mapped until a worker takes the path's first request; that worker calls
// `load`, opens the session group as make_engine_scheduler would (on any
// placement: with layers on Vulkan, options.vulkan's device, the group
// re-opening itself after a re-initialisation), and runs the request (which
// waits in the meantime, as running). A failed load fails that request with
// the loader's status and is tried again by the next one. Admission and the
// KV gate work from the start: the tokenizer and hparams are the file's,
// read at start, and the KV gate's budget is options.kv_blocks (0: n_workers
// full contexts).
struct OnDemandModel {
  std::function<Result<std::shared_ptr<const Model>>()> load;
  std::shared_ptr<const Tokenizer> tokenizer;
  LlamaHparams hparams;
  // Told once per load, on the loading worker's thread, how long it took.
  std::function<void(double load_ms)> on_loaded;
  // Around every run, on the worker's thread (null: none). begin_run comes
  // before the load and may block until the run may start (the gateway's
  // model residency makes room for a load there, or holds a run back while
  // another model's load waits for this one's memory); it returns early
  // with Cancelled when `cancel` is set, and an error fails the run with it.
  // end_run follows every begun run, with whether the model is loaded now
  // (false: its load failed).
  std::function<Status(const std::atomic<bool>& cancel)> begin_run;
  std::function<void(bool loaded)> end_run;
};
Result<EngineServing> make_on_demand_scheduler(Env& env, OnDemandModel model, const EngineServeOptions& options);

}  // namespace spw::serve
