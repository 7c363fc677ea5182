// `spillway estimate`: memory a model + serving plan needs, by category and
// device (admission/estimator.h), from the GGUF header only.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "admission/estimator.h"
#include "app/commands.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/vulkan/device_spec.h"
#include "core/env.h"
#include "core/placement.h"
#include "device/host_memory.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace spw::app {
namespace {

using admission::Amount;
using admission::DeviceEstimate;
using admission::Estimate;

struct EstimateOptions {
  std::string model;
  int32_t ctx = 0;
  std::optional<int32_t> batch;   // default: 512, or the context when smaller
  std::optional<int32_t> ubatch;  // default: 64, or the batch when smaller
  int32_t parallel = 1;
  int32_t threads = 1;
  int32_t block_tokens = 16;
  std::string device = "cpu";
  std::string kv_type = "f16";  // as serve's default
  bool logits_all = false;
  std::optional<int32_t> prompt_tokens;
  std::optional<int32_t> max_tokens;
  std::string host_baseline = "observed";
  bool json = false;
  std::string fit;  // a device budget: list the placements that fit it
};

// The host's fixed runtime overhead: what a spillway process holds before it
// loads a model. "observed" reads this process's RSS now (it is the same
// binary, before any model is opened); a size overrides it; when the probe
// cannot tell, the estimator's documented constant stays.
Status host_baseline(Env& env, const std::string& spec, admission::DeviceCosts& host, std::string& source) {
  if (spec == "observed") {
    const auto rss = device::HostMemoryProbe(env).read().process_rss_bytes;
    if (rss.known()) {
      host.fixed_overhead = rss.value();
      source = "observed: " + rss.source();
    } else {
      source = "default constant (RSS unknown: " + rss.reason() + ")";
    }
    return Status();
  }
  auto bytes = parse_memory_size(spec);
  if (!bytes.ok()) return bytes.status().with_context("--host-baseline " + spec + ": expected observed or a size");
  host.fixed_overhead = *bytes;
  source = "--host-baseline";
  return Status();
}

// --device: what serve and generate accept (Placement::parse), plus "gpu",
// this command's older spelling of "vulkan", kept as a synonym.
Result<Placement> parse_device(const std::string& s) {
  auto p = Placement::parse(s == "gpu" ? std::string("vulkan") : s);
  if (!p.ok()) return p.status().with_context("--device");
  return p;
}

nlohmann::json amount_json(const Amount& a) {
  return {{"bytes", a.bytes}, {"allowance", a.allowance}, {"allocations", a.n_allocations}};
}

nlohmann::json device_json(const DeviceEstimate& d) {
  nlohmann::json j = {{"device", std::string(admission::device_kind_name(d.device))},
                      {"weights", amount_json(d.weights)},
                      {"kv", amount_json(d.kv)},
                      {"scratch", amount_json(d.scratch)},
                      {"logits", amount_json(d.logits)},
                      {"overhead", amount_json(d.overhead)},
                      {"bytes", d.bytes()},
                      {"allowance", d.allowance()},
                      {"total", d.total()},
                      {"kv_bytes_per_token", d.kv_bytes_per_token},
                      {"kv_bytes_per_block", d.kv_bytes_per_block},
                      {"kv_window_bytes_per_block", d.kv_window_bytes_per_block},
                      {"kv_window_blocks_per_seq", d.kv_window_blocks_per_seq},
                      {"mapped_other", d.mapped_other}};
  // Each device's scratch is a different set of buffers: the CPU backend's per
  // session, the Vulkan backend's per backend (admission/estimator.h).
  if (d.device == admission::DeviceKind::kHost) {
    const auto& t = d.terms;
    j["scratch_terms_per_session"] = {{"hidden", t.hidden},
                                      {"session_state", t.session_state},
                                      {"tokens", t.tokens},
                                      {"layer_activations", t.layer_activations},
                                      {"matmul_prep", t.matmul_prep},
                                      {"attention_row", t.attention_row},
                                      {"attention_workers", t.attention_workers},
                                      {"output_transient", t.output_transient},
                                      {"logits_row", t.logits_row},
                                      {"logits", t.logits}};
  } else {
    const auto& g = d.gpu_terms;
    j["scratch_buffers_per_backend"] = {
        {"io_hidden", g.io_hidden}, {"x", g.x},     {"io_rope", g.io_rope},
        {"io_blocks", g.io_blocks}, {"cur", g.cur},             {"q", g.q},     {"att", g.att},
        {"k", g.k},                 {"v", g.v},                 {"gate", g.gate}, {"up", g.up},
        {"xq", g.xq},               {"xd", g.xd},               {"scores", g.scores}, {"io_logits", g.io_logits},
        {"staging", g.staging}};
  }
  return j;
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}

void print_row(const char* name, const Amount& h, const Amount& g, bool gpu) {
  std::printf("  %-10s %14llu %12llu", name, static_cast<unsigned long long>(h.bytes),
              static_cast<unsigned long long>(h.allowance));
  if (gpu)
    std::printf("   %14llu %12llu", static_cast<unsigned long long>(g.bytes),
                static_cast<unsigned long long>(g.allowance));
  std::printf("\n");
}

// --fit: the placements from all on the device down to all on the CPU, each
// estimated with the same plan, until the first that fits the device budget
// (its whole GPU total, allowances included): the one with the most layers
// on the device, which is the one to run. A mixture of experts tries each
// split with its experts on the device, then on the CPU (+cpu-experts:
// backend/vulkan/vulkan_backend.h); when all on the CPU fits, the fewest
// layers K whose experts must leave (+cpu-experts:K), found by bisection
// (the device's total falls as K grows). The best is the last row.
struct FitRow {
  Placement placement;
  uint64_t gpu_total = 0;
  uint64_t host_total = 0;
  bool fits = false;
};

Result<std::vector<FitRow>> fit_rows(const gguf::GgufFile& f, const admission::Plan& base,
                                     const admission::EstimatorConfig& config, uint64_t budget, int32_t n_layer,
                                     bool moe) {
  std::vector<FitRow> rows;
  auto row = [&](const Placement& where) -> Result<FitRow> {
    admission::Plan p = base;
    p.placement = where;
    SPW_ASSIGN_OR_RETURN(Estimate e, admission::estimate(f, p, config));
    FitRow r{p.placement, e.gpu().used ? e.gpu().total() : 0, e.host().total(), false};
    r.fits = r.gpu_total <= budget;
    rows.push_back(r);
    return r;
  };
  for (int32_t n = n_layer; n >= 0; --n) {
    const Placement at = n == n_layer ? Placement::vulkan() : n == 0 ? Placement::cpu() : Placement::hybrid(n);
    SPW_ASSIGN_OR_RETURN(FitRow r, row(at));
    if (r.fits) return rows;
    if (!moe || n == 0) continue;
    // A mixture's experts on the CPU (its attention and KV stay on the
    // device: what serve does too): all of them, then as few layers' as fit.
    SPW_ASSIGN_OR_RETURN(FitRow all, row(at.with_cpu_experts()));
    if (!all.fits) continue;
    size_t best = rows.size() - 1;
    int32_t lo = 1, hi = n - 1;  // the fewest K in [lo, hi] that fits, if any
    while (lo <= hi) {
      const int32_t k = lo + (hi - lo) / 2;
      SPW_ASSIGN_OR_RETURN(FitRow rk, row(at.with_cpu_experts(k)));
      if (rk.fits) {
        best = rows.size() - 1;
        hi = k - 1;
      } else {
        lo = k + 1;
      }
    }
    // The best one last (the caller's answer), the others in the order tried.
    std::rotate(rows.begin() + static_cast<std::ptrdiff_t>(best), rows.begin() + static_cast<std::ptrdiff_t>(best) + 1,
                rows.end());
    return rows;
  }
  return rows;
}

int run_fit(const EstimateOptions& o, const gguf::GgufFile& f, const admission::Plan& plan,
            const admission::EstimatorConfig& config) {
  auto budget = parse_memory_size(o.fit);
  if (!budget.ok()) {
    std::fprintf(stderr, "spillway estimate: --fit %s: expected a size such as 6GiB\n", o.fit.c_str());
    return 1;
  }
  auto hp = read_llama_hparams(f);
  if (!hp.ok()) {
    std::fprintf(stderr, "spillway estimate: %s\n", hp.status().to_string().c_str());
    return 1;
  }
  auto rows = fit_rows(f, plan, config, *budget, hp->n_layer, hp->moe());
  if (!rows.ok()) {
    std::fprintf(stderr, "spillway estimate: %s\n", rows.status().to_string().c_str());
    return 1;
  }
  const FitRow& best = rows->back();
  const int32_t k = best.placement.cpu_expert_layers;
  const std::string experts = !best.placement.cpu_experts ? ""
                              : k > 0 ? ", the experts of layers 0-" + std::to_string(k - 1) + " on the CPU"
                                      : ", experts on the CPU";
  if (o.json) {
    nlohmann::json c = nlohmann::json::array();
    for (const FitRow& r : *rows)
      c.push_back({{"device", r.placement.spec()}, {"gpu_total", r.gpu_total}, {"host_total", r.host_total},
                   {"fits", r.fits}});
    nlohmann::json j = {{"model", o.model},
                        {"budget", *budget},
                        {"candidates", c},
                        {"best", best.placement.spec()},
                        {"gpu_layers", best.placement.gpu_layer_count(hp->n_layer)},
                        {"cpu_experts", best.placement.cpu_experts}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model     %s\n", o.model.c_str());
  std::printf("budget    %llu bytes of device memory (%s MiB), ctx %d, parallel %d\n",
              static_cast<unsigned long long>(*budget), mib(*budget).c_str(), plan.n_ctx, plan.n_parallel);
  std::printf("\n  %-22s %16s %16s  %s\n", "placement", "gpu total", "host total", "fits");
  for (const FitRow& r : *rows)
    std::printf("  %-22s %16llu %16llu  %s\n", r.placement.spec().c_str(),
                static_cast<unsigned long long>(r.gpu_total), static_cast<unsigned long long>(r.host_total),
                r.fits ? "yes" : "no");
  std::printf("\nbest      %s: %d of %d layers on the device%s\n", best.placement.spec().c_str(),
              best.placement.gpu_layer_count(hp->n_layer), hp->n_layer, experts.c_str());
  return 0;
}

int run_estimate(const EstimateOptions& o) {
  admission::Plan plan;
  plan.n_ctx = o.ctx;
  // Defaults follow the engine's: a batch never exceeds the context it fills.
  plan.n_batch = o.batch.value_or(o.ctx > 0 ? std::min(512, o.ctx) : 512);
  plan.n_ubatch = o.ubatch.value_or(std::min(64, plan.n_batch));
  plan.n_parallel = o.parallel;
  plan.n_threads = o.threads;
  plan.kv_block_tokens = o.block_tokens;
  plan.logits_all = o.logits_all;
  if (auto kvt = parse_kv_type(o.kv_type); kvt.ok()) {
    plan.kv_type = *kvt;
  } else {
    std::fprintf(stderr, "spillway estimate: --kv-type: %s\n", kvt.status().message().c_str());
    return 1;
  }
  if (auto placement = parse_device(o.device); placement.ok()) {
    plan.placement = *placement;
  } else {
    std::fprintf(stderr, "spillway estimate: %s\n", placement.status().to_string().c_str());
    return 1;
  }
  Env& env = Env::default_env();
  admission::EstimatorConfig config;
  config.host_kernels.q8_0_x16 = cpu::active_kernel_traits().q8_0_x16;
  std::string baseline_source;
  if (Status st = host_baseline(env, o.host_baseline, config.host, baseline_source); !st.ok()) {
    std::fprintf(stderr, "spillway estimate: %s\n", st.to_string().c_str());
    return 1;
  }
  auto file = gguf::GgufFile::open(env, o.model);
  if (!file.ok()) {
    std::fprintf(stderr, "spillway estimate: %s\n", file.status().to_string().c_str());
    return 1;
  }
  if (!o.fit.empty()) return run_fit(o, **file, plan, config);
  auto est = admission::estimate(**file, plan, config);
  if (!est.ok()) {
    std::fprintf(stderr, "spillway estimate: %s\n", est.status().to_string().c_str());
    return 1;
  }
  const Estimate& e = *est;
  std::optional<admission::RequestEstimate> req;
  if (o.prompt_tokens || o.max_tokens) {
    auto r = e.request(o.prompt_tokens.value_or(0), o.max_tokens.value_or(0));
    if (!r.ok()) {
      std::fprintf(stderr, "spillway estimate: %s\n", r.status().to_string().c_str());
      return 1;
    }
    req = *r;
  }
  const bool gpu = e.gpu().used;
  // e.plan.placement is resolved for the model: the placement serve would run.
  const Placement& placement = e.plan.placement;

  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["host_baseline"] = {{"bytes", e.config.host.fixed_overhead}, {"source", baseline_source}};
    j["plan"] = {{"device", placement.spec()},
                 {"placement", placement.name()},
                 {"n_gpu_layers", placement.gpu_layer_count(e.hparams.n_layer)},
                 {"n_ctx", e.plan.n_ctx},
                 {"n_batch", e.plan.n_batch},
                 {"n_ubatch", e.plan.n_ubatch},
                 {"n_parallel", e.plan.n_parallel},
                 {"n_threads", e.plan.n_threads},
                 {"kv_type", std::string(admission::kv_type_name(e.plan.kv_type))},
                 {"kv_block_tokens", e.plan.kv_block_tokens},
                 {"logits_all", e.plan.logits_all}};
    j["hparams"] = e.hparams.to_string();
    nlohmann::json stages = nlohmann::json::array();
    for (const auto& s : e.stages)
      stages.push_back({{"device", std::string(admission::device_kind_name(s.device))},
                        {"layer_begin", s.layer_begin},
                        {"layer_end", s.layer_end},
                        {"embedding", s.embedding},
                        {"output", s.output}});
    j["stages"] = stages;
    j["weights_total"] = e.weights_total;
    j["kv_bytes_per_token"] = e.kv_bytes_per_token;
    nlohmann::json devs = nlohmann::json::array();
    devs.push_back(device_json(e.host()));
    if (gpu) devs.push_back(device_json(e.gpu()));
    j["devices"] = devs;
    j["total"] = e.total();
    if (req) {
      nlohmann::json r = {{"prompt_tokens", req->prompt_tokens},
                          {"max_new_tokens", req->max_new_tokens},
                          {"tokens", req->tokens},
                          {"blocks", req->blocks}};
      for (int d = 0; d < admission::kNumDeviceKinds; ++d) {
        if (!e.devices[d].used) continue;
        const auto kind = static_cast<admission::DeviceKind>(d);
        r[std::string(admission::device_kind_name(kind))] = {{"kv", amount_json(req->kv[d])},
                                                              {"scratch", amount_json(req->scratch[d])},
                                                              {"total", req->total(kind)}};
      }
      j["request"] = r;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("model     %s\n", o.model.c_str());
  std::printf("hparams   %s\n", e.hparams.to_string().c_str());
  std::printf("plan      placement %s, ctx %d, batch %d, ubatch %d, parallel %d, threads %d, KV %s in blocks of %d\n",
              placement.name().c_str(), e.plan.n_ctx, e.plan.n_batch, e.plan.n_ubatch, e.plan.n_parallel,
              e.plan.n_threads,
              std::string(admission::kv_type_name(e.plan.kv_type)).c_str(), e.plan.kv_block_tokens);
  std::printf("baseline  %llu bytes host runtime overhead (%s)\n",
              static_cast<unsigned long long>(e.config.host.fixed_overhead), baseline_source.c_str());
  for (const auto& s : e.stages)
    std::printf("stage     %-4s layers [%d, %d)%s%s\n", std::string(admission::device_kind_name(s.device)).c_str(),
                s.layer_begin, s.layer_end, s.embedding ? " +embedding" : "", s.output ? " +output" : "");
  std::printf("KV        %llu bytes/token (full-context layers), %llu bytes/block on host",
              static_cast<unsigned long long>(e.kv_bytes_per_token),
              static_cast<unsigned long long>(e.host().kv_bytes_per_block));
  if (gpu) std::printf(", %llu bytes/block on gpu", static_cast<unsigned long long>(e.gpu().kv_bytes_per_block));
  // Sliding-window layers (Gemma): a ring of blocks per sequence, not the context's.
  for (const auto* d : {&e.host(), gpu ? &e.gpu() : nullptr}) {
    if (d == nullptr || d->kv_window_blocks_per_seq == 0) continue;
    std::printf("\nKV window sliding-window layers: %llu blocks of %llu bytes per sequence on %s, whatever the context",
                static_cast<unsigned long long>(d->kv_window_blocks_per_seq),
                static_cast<unsigned long long>(d->kv_window_bytes_per_block), d == &e.host() ? "host" : "gpu");
  }
  std::printf("\n\n  %-10s %14s %12s", "category", "host bytes", "allowance");
  if (gpu) std::printf("   %14s %12s", "gpu bytes", "allowance");
  std::printf("\n");
  const DeviceEstimate& h = e.host();
  const DeviceEstimate& g = e.gpu();
  print_row("weights", h.weights, g.weights, gpu);
  print_row("kv", h.kv, g.kv, gpu);
  print_row("scratch", h.scratch, g.scratch, gpu);
  print_row("logits", h.logits, g.logits, gpu);
  print_row("overhead", h.overhead, g.overhead, gpu);
  print_row("sum", Amount{h.bytes(), h.allowance(), 0}, Amount{g.bytes(), g.allowance(), 0}, gpu);
  std::printf("  %-10s %14llu (%s MiB)", "total", static_cast<unsigned long long>(h.total()), mib(h.total()).c_str());
  if (gpu) std::printf("   %14llu (%s MiB)", static_cast<unsigned long long>(g.total()), mib(g.total()).c_str());
  std::printf("\n");
  if (req) {
    std::printf("\nrequest   %d prompt + %d new = %d tokens, %d KV blocks per stage\n", req->prompt_tokens,
                req->max_new_tokens, req->tokens, req->blocks);
    for (int d = 0; d < admission::kNumDeviceKinds; ++d) {
      if (!e.devices[d].used) continue;
      const auto kind = static_cast<admission::DeviceKind>(d);
      std::printf("  %-4s kv %llu + %llu, scratch+logits %llu + %llu, reserve %llu bytes\n",
                  std::string(admission::device_kind_name(kind)).c_str(),
                  static_cast<unsigned long long>(req->kv[d].bytes),
                  static_cast<unsigned long long>(req->kv[d].allowance),
                  static_cast<unsigned long long>(req->scratch[d].bytes),
                  static_cast<unsigned long long>(req->scratch[d].allowance),
                  static_cast<unsigned long long>(req->total(kind)));
    }
  }
  return 0;
}

}  // namespace

void add_estimate(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<EstimateOptions>();
  CLI::App* sub = app.add_subcommand("estimate", "Estimate the memory a model and serving plan need, per device");
  sub->add_option("--model,-m", o->model, "GGUF file")->required();
  sub->add_option("--ctx", o->ctx, "Context positions per sequence (0 = the model's)");
  sub->add_option("--batch", o->batch, "Tokens per eval call (default 512, at most --ctx)");
  sub->add_option("--ubatch", o->ubatch, "Tokens per forward pass (default 64, at most --batch)");
  sub->add_option("--parallel", o->parallel, "Concurrent sequences");
  sub->add_option("--threads", o->threads, "CPU backend threads");
  sub->add_option("--block-tokens", o->block_tokens, "KV block size in tokens");
  sub->add_option("--device", o->device,
                  "cpu | vulkan[:INDEX|:NAME] | hybrid:N[:INDEX] as for serve and generate (the first N layers "
                  "on Vulkan; hybrid:0 is cpu, N >= the layer count is vulkan; +cpu-experts: a mixture's experts on "
                  "the CPU, +cpu-experts:K those of layers 0..K-1 only); gpu = vulkan (older spelling)");
  sub->add_option("--kv-type", o->kv_type, "KV cache element type: f16, f32 or q8_0 (CPU only)")->capture_default_str();
  sub->add_flag("--logits-all", o->logits_all, "Logits for every row (eval_all_logits)");
  sub->add_option("--prompt-tokens", o->prompt_tokens, "Request: prompt tokens");
  sub->add_option("--max-tokens", o->max_tokens, "Request: maximum new tokens");
  sub->add_option("--host-baseline", o->host_baseline,
                  "Host runtime overhead before a model is loaded: observed (this process's RSS) or a size");
  sub->add_flag("--json", o->json, "Print JSON");
  sub->add_option("--fit", o->fit,
                  "A device memory budget (e.g. 6GiB): estimate vulkan, then hybrid:N from N = layers - 1 down, "
                  "then cpu, and name the first that fits (the most layers on the device); a mixture of experts "
                  "tries each with its experts on the device, then on the CPU: all, or the fewest first layers' "
                  "(+cpu-experts:K) that fit")
      ->excludes(sub->get_option("--device"));
  sub->callback([o, &exit_code] { exit_code = run_estimate(*o); });
}

}  // namespace spw::app
