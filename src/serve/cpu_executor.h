// CPU serving: a Scheduler whose workers run Sessions over one shared Model,
// one shared CpuBackend and one shared KvPool.
//
// Contract: make_cpu_scheduler() builds a CpuBackend with n_threads threads, a
// KvPool of kv_blocks blocks (0: enough for every worker to hold a full
// context, n_workers * ceil(n_ctx / block_tokens)), one Session per worker and
// the Scheduler over them. n_ctx 0 means the model's context_length; a larger
// n_ctx than context_length, n_workers < 1, n_threads < 1 or a negative
// kv_blocks is InvalidArgument naming the option. Each worker keeps the KV of
// its last request so that a following request with the same prefix skips
// that part of the prefill; when the pool is smaller than the default, a
// worker releases its KV after every request instead, so idle workers never
// starve busy ones. A request that needs more KV than the pool has left fails
// with ResourceExhausted.
// Thread safety: as Scheduler.
#pragma once

#include <memory>

#include "core/env.h"
#include "core/status.h"
#include "model/model.h"
#include "serve/scheduler.h"

namespace spw::serve {

struct CpuServeOptions {
  int32_t n_workers = 1;
  int32_t n_threads = 1;  // CPU backend threads, shared by all workers
  int32_t n_ctx = 0;      // 0: the model's context_length
  int32_t kv_blocks = 0;  // 0: n_workers full contexts
  int32_t kv_block_tokens = 16;
  int32_t queue_capacity = 64;
  SchedulerHooks hooks;
};

Result<std::unique_ptr<Scheduler>> make_cpu_scheduler(Env& env, std::shared_ptr<const Model> model,
                                                      const CpuServeOptions& options);

}  // namespace spw::serve
