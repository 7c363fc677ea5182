// kv_capacity_bench: how many more full-context requests fit in one memory
// budget with an F16 or Q8_0 KV cache than with F32 (`--kv-type`).
//
// For each model, KV type and budget, the estimator (admission/estimator.h,
// the figure admission control uses) gives the largest n_parallel whose whole
// plan -- weights, n_parallel full-context KV, scratch, logits, overhead, each
// with its allowance -- fits the budget: on the host for the CPU placement,
// on the device for the Vulkan placement (f32 and f16 only: the Vulkan backend
// refuses q8_0). The gain is that count over F32's. Then the real pool is
// allocated for the host figure (session_group_host_pool + KvPool::create,
// the server's layout) and its heap bytes measured through the replaced
// operator new (admission/alloc_tracker.h): the estimate's KV storage must be
// the pool's array exactly and its kv category within the allowance.
// --speed also times decode at a long context per type on the CPU (the F16 /
// Q8_0 rows are converted to F32 as attention reads them): tokens/s of
// --decode steps after a --fill-token prompt, one session, --threads threads.
//
// Models: the bundled stories260K (head_dim 8: no q8_0) and the generated
// 110M-shape Q8_0 model recovery_bench uses (768 wide, 12 layers, 12 heads of
// 64, context 2048), kept in --models-dir; or --model PATH (repeatable).
// Output: a table on stdout; --json FILE writes every row. Exit 1 when an
// exactness check fails.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "admission/alloc_tracker.h"
#include "admission/estimator.h"
#include "bench_models.h"
#include "core/kv_type.h"
#include "core/size.h"
#include "engine/device_session.h"

namespace spw {
namespace {

namespace tracker = admission::testing;
using nlohmann::json;

admission::Plan plan_for(const Placement& where, int32_t n_ctx, int32_t n_parallel, int n_threads, KvType t) {
  admission::Plan p;  // the server's per-path plan (gateway/builder.cpp path_plan)
  p.placement = where;
  p.n_ctx = n_ctx;
  p.n_batch = n_ctx;
  p.n_ubatch = std::min(64, n_ctx);
  p.n_parallel = n_parallel;
  p.n_threads = n_threads;
  p.kv_type = t;
  return p;
}

uint64_t device_total(const admission::Estimate& e, bool gpu) { return gpu ? e.gpu().total() : e.host().total(); }

// Largest n_parallel in [1, 4096] whose plan fits `budget` (0: none fits).
Result<int32_t> fits(const gguf::GgufFile& f, const Placement& where, int32_t n_ctx, int n_threads, KvType t,
                     uint64_t budget) {
  const bool gpu = where.on_gpu();
  int32_t lo = 0, hi = 4096;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    SPW_ASSIGN_OR_RETURN(admission::Estimate e, admission::estimate(f, plan_for(where, n_ctx, mid, n_threads, t)));
    if (device_total(e, gpu) <= budget) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(b) / (1 << 20));
  return buf;
}

// Decode tokens/s at a context of `fill` tokens, one CPU session.
Result<double> decode_rate(const std::shared_ptr<const Model>& m, KvType t, int32_t fill, int32_t steps, int threads) {
  SessionGroupOptions o;
  o.n_threads = threads;
  o.n_ctx = fill + steps + 1;
  o.kv_type = t;
  SPW_ASSIGN_OR_RETURN(SessionGroup g, open_session_group(m, o));
  Session& s = *g.sessions[0];
  const int32_t V = m->hparams().n_vocab;
  std::vector<TokenId> prompt(static_cast<size_t>(fill));
  for (int32_t i = 0; i < fill; ++i) prompt[static_cast<size_t>(i)] = (i * 37 + 11) % V;
  SPW_RETURN_IF_ERROR(s.eval(prompt).status());
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < steps; ++i) {
    const TokenId tok = (i * 13 + 5) % V;
    SPW_RETURN_IF_ERROR(s.eval(std::span<const TokenId>(&tok, 1)).status());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return steps / secs;
}

int run(const std::vector<std::string>& model_paths, const std::vector<std::string>& budget_texts, int32_t ctx_opt,
        int threads, bool speed, int32_t fill, int32_t decode, const std::string& json_path) {
  std::vector<uint64_t> budgets;
  for (const auto& b : budget_texts) {
    auto v = parse_byte_size(b);
    if (!v.ok()) {
      std::fprintf(stderr, "kv_capacity_bench: --budget: %s\n", v.status().to_string().c_str());
      return 2;
    }
    budgets.push_back(*v);
  }
  json rows = json::array();
  int failures = 0;
  for (const std::string& path : model_paths) {
    auto loaded = Model::load(Env::default_env(), path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kv_capacity_bench: %s: %s\n", path.c_str(), loaded.status().to_string().c_str());
      return 2;
    }
    const std::shared_ptr<const Model> m = *loaded;
    const LlamaHparams& hp = m->hparams();
    const int32_t n_ctx = ctx_opt > 0 ? std::min(ctx_opt, hp.n_ctx_train) : hp.n_ctx_train;
    const std::string name = path.substr(path.find_last_of('/') + 1);
    std::printf("\n%s: %d layers, n_embd_kv %d, head_dim %d, context %d; KV per token f32 %s B, f16 %s B, q8_0 %s\n",
                name.c_str(), hp.n_layer, hp.n_embd_kv(), hp.head_dim(), n_ctx,
                std::to_string(2ull * hp.n_layer * kv_row_bytes(KvType::kF32, hp.n_embd_kv())).c_str(),
                std::to_string(2ull * hp.n_layer * kv_row_bytes(KvType::kF16, hp.n_embd_kv())).c_str(),
                check_kv_type(KvType::kQ8_0, hp.n_embd_kv(), hp.head_dim()).ok()
                    ? (std::to_string(2ull * hp.n_layer * kv_row_bytes(KvType::kQ8_0, hp.n_embd_kv())) + " B").c_str()
                    : "n/a (head_dim % 32 != 0)");
    std::printf("%-8s %-6s %10s %10s %8s %14s %14s\n", "where", "kv", "budget", "requests", "vs f32", "KV/request MiB",
                "plan MiB");
    for (const bool gpu : {false, true}) {
      const Placement where = gpu ? Placement::vulkan() : Placement::cpu();
      for (uint64_t budget : budgets) {
        int32_t f32_count = 0;
        for (KvType t : kAllKvTypes) {
          if (!check_kv_type(t, hp.n_embd_kv(), hp.head_dim()).ok()) continue;
          if (gpu && t == KvType::kQ8_0) continue;  // CPU only
          auto n = fits(m->file(), where, n_ctx, threads, t, budget);
          if (!n.ok()) {
            std::fprintf(stderr, "%s: %s\n", name.c_str(), n.status().to_string().c_str());
            ++failures;
            continue;
          }
          if (t == KvType::kF32) f32_count = *n;
          auto e = admission::estimate(m->file(), plan_for(where, n_ctx, std::max(1, *n), threads, t));
          if (!e.ok()) {
            ++failures;
            continue;
          }
          const admission::DeviceEstimate& d = gpu ? e->gpu() : e->host();
          const uint64_t kv_per_request = d.kv_bytes_per_block * ((static_cast<uint64_t>(n_ctx) + 15) / 16);
          const double gain = f32_count > 0 ? static_cast<double>(*n) / f32_count : 0.0;
          std::printf("%-8s %-6s %10s %10d %7.2fx %14s %14s\n", gpu ? "vulkan" : "cpu",
                      std::string(kv_type_name(t)).c_str(), mib(budget).c_str(), *n, gain, mib(kv_per_request).c_str(),
                      mib(device_total(*e, gpu)).c_str());
          json row = {{"model", name},         {"placement", gpu ? "vulkan" : "cpu"},
                      {"kv_type", kv_type_name(t)}, {"budget", budget},
                      {"n_ctx", n_ctx},        {"requests", *n},
                      {"gain_vs_f32", gain},   {"kv_bytes_per_request", kv_per_request},
                      {"plan_bytes", device_total(*e, gpu)}};
          // The real pool of the host figure: its array is the estimate's
          // KV storage to the byte.
          if (!gpu && *n > 0) {
            SessionGroupOptions go;
            go.n_sessions = *n;
            go.n_threads = threads;
            go.n_ctx = n_ctx;
            go.kv_type = t;
            auto po = session_group_host_pool(*m, go);
            if (!po.ok()) {
              ++failures;
              continue;
            }
            const int64_t before = tracker::live_bytes();
            auto pool = KvPool::create(*po);
            if (!pool.ok()) {
              std::fprintf(stderr, "%s: %s\n", name.c_str(), pool.status().to_string().c_str());
              ++failures;
              continue;
            }
            const int64_t measured = tracker::live_bytes() - before;
            const uint64_t storage = static_cast<uint64_t>((*pool)->n_blocks()) * (*pool)->bytes_per_block();
            const bool exact = storage == d.kv_storage && measured >= static_cast<int64_t>(storage) &&
                               measured <= static_cast<int64_t>(d.kv.with_allowance());
            row["pool_storage_bytes"] = storage;
            row["pool_heap_bytes"] = measured;
            row["estimate_kv"] = {{"storage", d.kv_storage}, {"bytes", d.kv.bytes}, {"allowance", d.kv.allowance}};
            row["exact"] = exact;
            if (!exact) {
              std::printf("  MISMATCH: pool array %llu B (heap %lld) vs estimate storage %llu, kv %llu + %llu\n",
                          static_cast<unsigned long long>(storage), static_cast<long long>(measured),
                          static_cast<unsigned long long>(d.kv_storage), static_cast<unsigned long long>(d.kv.bytes),
                          static_cast<unsigned long long>(d.kv.allowance));
              ++failures;
            }
          }
          rows.push_back(row);
        }
      }
    }
    if (speed) {
      const int32_t f = std::min(fill, hp.n_ctx_train - decode - 1);
      std::printf("decode at context %d, %d threads:", f, threads);
      for (KvType t : kAllKvTypes) {
        if (!check_kv_type(t, hp.n_embd_kv(), hp.head_dim()).ok()) continue;
        auto r = decode_rate(m, t, f, decode, threads);
        if (!r.ok()) {
          std::fprintf(stderr, "%s: %s\n", name.c_str(), r.status().to_string().c_str());
          ++failures;
          continue;
        }
        std::printf("  %s %.1f tok/s", std::string(kv_type_name(t)).c_str(), *r);
        rows.push_back({{"model", name}, {"kv_type", kv_type_name(t)}, {"decode_context", f},
                        {"decode_tokens_per_s", *r}, {"threads", threads}});
      }
      std::printf("\n");
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << rows.dump(2) << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace spw

int main(int argc, char** argv) {
  CLI::App app("KV cache capacity per KV type in a memory budget (docs/PERFORMANCE.md)");
  std::vector<std::string> models, budgets = {"512MiB", "2GiB"};
  std::string models_dir = "bench-models", json_path;
  int32_t ctx = 0, fill = 1024, decode = 32;
  int threads = 1;
  bool speed = false;
  app.add_option("--model", models, "GGUF model (repeatable; default: stories260K and the 110M-shape Q8_0)");
  app.add_option("--models-dir", models_dir, "Where the generated model is kept")->capture_default_str();
  app.add_option("--budget", budgets, "Memory budget (repeatable)")->capture_default_str();
  app.add_option("--ctx", ctx, "Context per request (0: the model's)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads in the plan and the decode timing")->capture_default_str();
  app.add_flag("--speed", speed, "Also time decode at a long context per KV type");
  app.add_option("--fill", fill, "Context before the timed decode steps")->capture_default_str();
  app.add_option("--decode", decode, "Timed decode steps")->capture_default_str();
  app.add_option("--json", json_path, "Write every row as JSON");
  CLI11_PARSE(app, argc, argv);
  if (models.empty()) {
    models.push_back(std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf");
    const std::string m110 = spw::bench::ensure_110m_q8_0(models_dir, "kv_capacity_bench");
    if (m110.empty()) return 2;
    models.push_back(m110);
  }
  return spw::run(models, budgets, ctx, threads, speed, fill, decode, json_path);
}
