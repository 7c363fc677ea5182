// Cost of one admission decision (admission::decide) and of the ETA's event
// simulation, over paths as loaded as a home server's get: a GPU path with
// 4 workers busy and a queue, a CPU fallback path. The decision runs on the
// request's HTTP thread before anything is queued, so it must stay far below
// a token's time (tens of microseconds at most).
#include <benchmark/benchmark.h>

#include "admission/controller.h"

namespace {

using namespace spw::admission;

PathSnapshot path(const char* name, PathRole role, int workers, int queued, int blocks_total) {
  PathSnapshot p;
  p.name = name;
  p.placement = name;
  p.role = role;
  p.n_ctx = 2048;
  p.workers = workers;
  p.queue_capacity = 64;
  p.kv_block_tokens = 16;
  p.kv_blocks_total = blocks_total;
  p.kv_blocks_free = blocks_total / 4;
  for (int i = 0; i < workers; ++i) p.running.push_back({200, 256, 40 + i * 10, 29, 1.0 + i});
  for (int i = 0; i < queued; ++i) p.queued.push_back({100 + 10 * i, 128, 0, 15, 0});
  p.ledger = "vulkan:0";
  p.ledger_limit = 8ull << 30;
  p.ledger_used = 6ull << 30;
  p.rates = {800.0, 40.0, 0.8, 100, true};
  return p;
}

void BM_Decide(benchmark::State& state) {
  const int queued = static_cast<int>(state.range(0));
  std::vector<PathSnapshot> paths{path("gpu", PathRole::kPrimary, 4, queued, 512),
                                  path("cpu", PathRole::kFallback, 1, 2, 128)};
  RequestShape req;
  req.prompt_tokens = 300;
  req.max_tokens = 256;
  AdmissionPolicy policy;
  for (auto _ : state) {
    Decision d = decide(req, paths, policy);
    benchmark::DoNotOptimize(d.kind);
  }
}
BENCHMARK(BM_Decide)->Arg(0)->Arg(8)->Arg(64);

void BM_StartDelay(benchmark::State& state) {
  const PathSnapshot p = path("gpu", PathRole::kPrimary, 4, static_cast<int>(state.range(0)), 512);
  for (auto _ : state) benchmark::DoNotOptimize(estimate_start_delay(p, 40));
}
BENCHMARK(BM_StartDelay)->Arg(0)->Arg(8)->Arg(64);

}  // namespace

BENCHMARK_MAIN();
