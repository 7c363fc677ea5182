// estimator_accuracy: the memory estimator (admission/estimator.h) against what
// the engine really uses, over a matrix of models, types, placements, contexts,
// batch sizes and parallel sequences.
//
//   estimator_accuracy [--matrix quick|full] [--models-dir DIR] [--json FILE]
//                      [--markdown FILE] [--tolerance 0.10] [--only SUBSTR]
//
// Each case runs in a fresh child process (this binary re-executed with
// --run-case), so the peak RSS it reports belongs to that case alone. The child
// loads the model the way `spillway serve` does (prefaulted mapping), builds the
// sessions the way the server does (CPU: one backend and one KV pool shared by
// the sequences, engine/device_session.h), fills every sequence's context to
// n_ctx (prefill, two decode steps, a full ubatch ending at n_ctx: the
// estimator's worst case), and reports what it measured next to the estimate it
// computed for the same plan, with the host's fixed overhead set to the RSS it
// observed before loading anything (the estimator's "observed baseline").
//
// Measured, per case:
//   CPU placement (host):
//     weights         resident bytes of the model's mapping (/proc/self/smaps)
//     model heap      operator-new bytes live after Model::load
//     kv              operator-new bytes of KvPool::create
//     scratch+logits  peak operator-new growth from the session group's
//                     creation to the end of the run (all sequences)
//     total           VmHWM (peak RSS) of the whole process
//   Vulkan / hybrid placement (GPU): the DeviceAllocator's peak per category
//     (weights, kv, scratch, staging) and its overall peak. The host side of
//     those cases is not compared: the Vulkan driver's own allocations (on
//     lavapipe, device memory itself is host memory) land in the same heap and
//     RSS.
// A row passes when |estimate - measured| / measured <= tolerance and measured
// <= estimate + allowance (the estimator's documented margin). With several
// sequences the sessions' transient peaks overlap by chance, so the scratch
// row's lower bound is not checked there (the upper bound is).
// Exit status: 0 all rows pass, 1 a row fails or a case errors, 2 bad usage.
//
// Heap figures come from admission/alloc_tracker (operator new replaced in this
// binary); RSS and heap are not meaningful under ASan/TSan, so CI runs this in
// the release build only.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "admission/alloc_tracker.h"
#include "admission/estimator.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/cpu/packed_weights.h"
#include "backend/vulkan/device_spec.h"
#include "core/env.h"
#include "core/placement.h"
#include "device/host_memory.h"
#include "engine/device_session.h"
#include "engine/step_batcher.h"
#include "model/model.h"
#include "tools/modelgen/random_llama.h"

extern char** environ;

namespace spw {
namespace {

using admission::Amount;
using admission::DeviceEstimate;
using nlohmann::json;
namespace tracker = admission::testing;

// ---------------------------------------------------------------- matrix ----

struct ModelDef {
  std::string key;      // file stem
  std::string preset;   // "" = the bundled stories260K
  gguf::GgmlType type = gguf::GgmlType::kF32;
  modelgen::RandomLlamaMix mix = modelgen::RandomLlamaMix::kNone;  // overrides type
};

struct Case {
  std::string model;    // ModelDef::key
  std::string device;   // cpu | vulkan | hybrid:N
  int32_t ctx = 256;
  int32_t ubatch = 64;
  int32_t parallel = 1;
  int32_t threads = 1;
  int32_t kv_block = 16;
  std::string kv_type = "f32";  // the pools' element type (--kv-type)
};

struct Preset {
  uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff;
  const char* arch = "llama";
  uint32_t n_expert = 0, n_expert_used = 0;  // a mixture of experts (n_ff: each expert's)
};

// The shapes of spillway-gen-model's presets (tools/gen_model.cpp).
const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> k = {
      {"15m", {288, 6, 6, 6, 768}},
      {"110m", {768, 12, 12, 12, 2048}},
      {"500m", {1280, 24, 20, 4, 3584}},
      // A Qwen3-MoE shape in small: 16 experts, 2 used per token (the
      // router, experts and routing scratch on the host on every placement).
      {"moe", {256, 4, 4, 2, 256, "qwen3moe", 16, 2}},
  };
  return k;
}

std::vector<ModelDef> model_defs() {
  using T = gguf::GgmlType;
  return {{"stories260K", "", T::kF32},   {"15m-f32", "15m", T::kF32},   {"15m-f16", "15m", T::kF16},
          {"15m-q8_0", "15m", T::kQ8_0},  {"110m-f32", "110m", T::kF32}, {"110m-f16", "110m", T::kF16},
          {"110m-q8_0", "110m", T::kQ8_0}, {"500m-f16", "500m", T::kF16}, {"500m-q8_0", "500m", T::kQ8_0},
          // The low-bit types: a legacy one (15m's 288-wide rows hold 32-blocks,
          // not 256-element super-blocks) and the common Q4_K_M mix.
          {"15m-q4_0", "15m", T::kQ4_0},   {"110m-q4_k_m", "110m", T::kF32, modelgen::RandomLlamaMix::kQ4_K_M},
          {"moe-q8_0", "moe", T::kQ8_0}};
}

std::vector<Case> matrix(const std::string& which) {
  // {model, device, ctx, ubatch, parallel, threads, kv_block}
  std::vector<Case> quick = {
      {"stories260K", "cpu", 256, 64, 1, 1, 16},
      {"stories260K", "cpu", 2048, 16, 1, 2, 16},
      {"stories260K", "cpu", 512, 64, 4, 2, 16},
      {"stories260K", "vulkan", 512, 64, 1, 1, 16},
      {"stories260K", "hybrid:2", 256, 32, 1, 1, 32},
      {"stories260K", "vulkan", 256, 32, 3, 1, 16},
      {"15m-q8_0", "cpu", 512, 64, 1, 2, 16},
      {"15m-q8_0", "vulkan", 128, 16, 1, 1, 16},
  };
  if (which == "quick") return quick;
  std::vector<Case> full = quick;
  // The 110m and 500m models on lavapipe hold 32 and 24 positions: lavapipe
  // computes a token of the 500m model in ~2.4 s on an AVX2 EPYC (Zen 3), and
  // their memory terms (weights, pools, scratch by ubatch and context) are
  // the same formulas at any size, so twice the positions only doubled CI's
  // longest test.
  const std::vector<Case> more = {
      {"15m-f32", "cpu", 512, 64, 1, 1, 16},
      {"15m-f32", "cpu", 256, 32, 2, 2, 16},
      {"15m-f16", "cpu", 1024, 128, 1, 2, 16},
      {"15m-f16", "hybrid:3", 128, 16, 1, 1, 16},
      {"15m-q8_0", "hybrid:3", 128, 16, 2, 1, 16},
      {"15m-f32", "vulkan", 128, 32, 1, 1, 16},
      {"110m-f32", "cpu", 256, 64, 1, 2, 16},
      {"110m-f16", "cpu", 512, 64, 1, 2, 16},
      {"110m-q8_0", "cpu", 1024, 128, 1, 2, 32},
      {"110m-q8_0", "cpu", 256, 32, 3, 2, 16},
      {"110m-q8_0", "vulkan", 32, 8, 1, 1, 16},
      {"110m-f16", "hybrid:6", 32, 8, 1, 1, 16},
      {"500m-q8_0", "cpu", 512, 64, 1, 2, 16},
      {"500m-f16", "cpu", 256, 32, 1, 2, 16},
      {"500m-q8_0", "vulkan", 24, 8, 1, 1, 16},
      {"500m-q8_0", "hybrid:12", 24, 8, 1, 1, 16},
      {"15m-q4_0", "cpu", 256, 32, 1, 1, 16},
      {"110m-q4_k_m", "cpu", 512, 64, 1, 2, 16},
      {"110m-q4_k_m", "vulkan", 32, 8, 1, 1, 16},
      {"110m-q4_k_m", "hybrid:6", 32, 8, 1, 1, 16},
      // The KV types (the server's default f16, and q8_0 on the CPU): the
      // pools, the device KV buffers and the attention's conversion tile.
      {"110m-q8_0", "cpu", 512, 64, 2, 2, 16, "f16"},
      {"110m-q8_0", "cpu", 512, 64, 2, 2, 16, "q8_0"},
      {"110m-q8_0", "cpu", 1024, 32, 1, 1, 32, "q8_0"},
      {"15m-q8_0", "cpu", 1024, 32, 1, 2, 16, "f16"},  // head_dim 48: no q8_0
      {"110m-q8_0", "vulkan", 32, 8, 1, 1, 16, "f16"},
      {"15m-f16", "hybrid:3", 128, 16, 1, 1, 16, "f16"},
      // A mixture of experts: on the CPU, on the device (all layers, and a
      // split), and on the device with its experts on the CPU.
      {"moe-q8_0", "cpu", 512, 64, 1, 2, 16},
      {"moe-q8_0", "vulkan", 128, 32, 1, 2, 16},
      {"moe-q8_0", "hybrid:2", 128, 16, 2, 1, 16},
      {"moe-q8_0", "vulkan+cpu-experts", 128, 32, 1, 2, 16},
  };
  full.insert(full.end(), more.begin(), more.end());
  return full;
}

std::string case_name(const Case& c) {
  return c.model + " " + c.device + " ctx=" + std::to_string(c.ctx) + " ub=" + std::to_string(c.ubatch) +
         " par=" + std::to_string(c.parallel) + " thr=" + std::to_string(c.threads) +
         " bt=" + std::to_string(c.kv_block) + (c.kv_type == "f32" ? "" : " kv=" + c.kv_type);
}

// ----------------------------------------------------------------- child ----

uint64_t reading(const device::Reading<uint64_t>& r) { return r.value_or(0); }

std::vector<TokenId> tokens(int32_t n, int32_t n_vocab, int32_t salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + 11 + salt * 101) % n_vocab;
  return t;
}

// Fills a session to n_ctx: prefill, two decode steps, one full ubatch ending at
// n_ctx (the estimator's worst case: its attention rows span the whole context).
// With a batcher every eval is batched with the other sessions' (prompt
// chunks and decode steps, as the server's workers run them:
// engine/step_batcher.h), so the measured peak covers a batched step's
// buffers too.
Status fill_context(Session& s, int32_t n_ctx, int32_t n_ubatch, int32_t n_vocab, int32_t salt,
                    StepBatcher* batcher = nullptr) {
  const int32_t prefill = n_ctx - n_ubatch - 2;
  if (prefill < 1) {
    return Status::invalid_argument("ctx " + std::to_string(n_ctx) + " too small for ubatch " +
                                    std::to_string(n_ubatch));
  }
  std::optional<StepBatcher::Membership> member;
  if (batcher != nullptr) member.emplace(batcher->join(s));
  SPW_RETURN_IF_ERROR(s.eval(tokens(prefill, n_vocab, salt)).status());
  SPW_RETURN_IF_ERROR(s.eval(tokens(1, n_vocab, salt + 1)).status());
  SPW_RETURN_IF_ERROR(s.eval(tokens(1, n_vocab, salt + 2)).status());
  SPW_RETURN_IF_ERROR(s.eval(tokens(n_ubatch, n_vocab, salt + 3)).status());
  if (s.n_past() != n_ctx) return Status::internal("session did not reach n_ctx");
  return Status();
}

// Fills every session of the group to the context on its own thread, as the
// server's workers run them.
Status fill_group(SessionGroup& group, const Case& c, int32_t n_vocab) {
  std::vector<Status> st(group.sessions.size());
  std::vector<std::thread> workers;
  StepBatcherOptions bo;
  bo.step_tokens = c.ubatch;
  StepBatcher batcher(Env::default_env(), bo);
  StepBatcher* b = group.sessions.size() > 1 ? &batcher : nullptr;
  for (size_t i = 0; i < group.sessions.size(); ++i) {
    workers.emplace_back(
        [&, i] { st[i] = fill_context(*group.sessions[i], c.ctx, c.ubatch, n_vocab, static_cast<int32_t>(i), b); });
  }
  for (auto& w : workers) w.join();
  for (const Status& s : st) SPW_RETURN_IF_ERROR(s);
  return Status();
}

json amount(const Amount& a) { return {{"bytes", a.bytes}, {"allowance", a.allowance}}; }

Result<json> run_child(const Case& c, const std::string& model_path) {
  Env& env = Env::default_env();
  device::HostMemoryProbe probe(env);
  const device::HostMemory m0 = probe.read();
  if (!m0.process_rss_bytes.known() || !m0.process_rss_file_bytes.known()) {
    return Status::unavailable("process RSS unknown: " + m0.process_rss_bytes.reason());
  }
  json out;
  out["baseline_rss"] = m0.process_rss_bytes.value();

  const int64_t heap0 = tracker::live_bytes();
  auto model = Model::load(env, model_path);
  if (!model.ok()) return model.status();
  const device::HostMemory m1 = probe.read();
  const int64_t model_heap = tracker::live_bytes() - heap0;
  const LlamaHparams& hp = (*model)->hparams();

  auto spec = Placement::parse(c.device);
  if (!spec.ok()) return spec.status();
  admission::Plan plan;
  plan.placement = *spec;
  plan.n_ctx = c.ctx;
  plan.n_batch = c.ctx;
  plan.n_ubatch = c.ubatch;
  plan.n_parallel = c.parallel;
  plan.n_threads = c.threads;
  plan.kv_block_tokens = c.kv_block;
  SPW_ASSIGN_OR_RETURN(plan.kv_type, parse_kv_type(c.kv_type));
  admission::EstimatorConfig cfg;
  cfg.host.fixed_overhead = m0.process_rss_bytes.value();
  cfg.host_kernels.q8_0_x16 = cpu::active_kernel_traits().q8_0_x16;

  const auto t0 = std::chrono::steady_clock::now();
  json measured;
  if (!spec->on_gpu()) {
    SessionGroupOptions go;
    go.n_sessions = c.parallel;
    go.n_threads = c.threads;
    go.n_ctx = c.ctx;
    go.n_ubatch = c.ubatch;
    go.kv_block_tokens = c.kv_block;
    go.kv_type = plan.kv_type;
    SPW_ASSIGN_OR_RETURN(KvPoolOptions po, session_group_host_pool(**model, go));
    const int64_t heap_kv0 = tracker::live_bytes();
    SPW_ASSIGN_OR_RETURN(std::shared_ptr<KvPool> pool, KvPool::create(po));
    const int64_t kv_heap = tracker::live_bytes() - heap_kv0;
    // The kernels' packed weights (backend/cpu/packed_weights.h: the AVX-512
    // VNNI variants repack Q8_0) are weights the process holds on the heap
    // instead of the mapping's pages: made here, as the sessions' backend
    // would, and counted with the mapped bytes.
    const int64_t heap_packed0 = tracker::live_bytes();
    cpu::pack_resident(**model, 0, hp.n_layer, true);
    const int64_t packed_heap = tracker::live_bytes() - heap_packed0;
    tracker::PeakScope scratch;
    SPW_ASSIGN_OR_RETURN(SessionGroup group, open_session_group(*model, go, pool));
    SPW_RETURN_IF_ERROR(fill_group(group, c, hp.n_vocab));
    // Read before anything else allocates (the probes read files into strings).
    const int64_t scratch_peak = scratch.peak_delta();
    auto mapped = probe.mapped_rss(model_path);
    if (!mapped.known()) return Status::unavailable("mapped RSS of the model: " + mapped.reason());
    measured["weights"] = mapped.value() + packed_heap;
    measured["model_heap"] = model_heap;
    measured["kv"] = kv_heap;
    measured["scratch_logits"] = scratch_peak;
    measured["peak_rss"] = reading(probe.read().process_peak_rss_bytes);
  } else {
    // The server's layout: `parallel` sessions over one backend per device
    // and one pool per stage.
    SessionGroupOptions go;
    go.device = *spec;
    // lavapipe on two busy cores can take longer than the default 30 s
    // watchdog for one submission of a 500M model; this measures memory, not
    // speed, so wait for it.
    VulkanBackendOptions vo;
    vo.device = spec->vulkan_device;
    vo.fence_timeout_ms = 10 * 60 * 1000;
    SPW_ASSIGN_OR_RETURN(go.vulkan, VulkanBackend::create(vo));
    go.n_sessions = c.parallel;
    go.n_threads = c.threads;
    go.n_ctx = c.ctx;
    go.n_ubatch = c.ubatch;
    go.kv_block_tokens = c.kv_block;
    go.kv_type = plan.kv_type;
    SPW_ASSIGN_OR_RETURN(SessionGroup ds, open_session_group(*model, go));
    if (!ds.vulkan) return Status::internal("no Vulkan backend in a GPU case");
    SPW_RETURN_IF_ERROR(fill_group(ds, c, hp.n_vocab));
    const VulkanDeviceInfo& info = ds.vulkan->device_info();
    cfg.gpu_limits.max_buffer_bytes = largest_buffer_bytes(info);
    const DeviceMemoryStats ms = ds.vulkan->memory_stats();
    auto peak = [&](MemoryCategory k) { return ms.peak_by_category[static_cast<size_t>(k)]; };
    measured["weights"] = peak(MemoryCategory::kWeights);
    measured["kv"] = peak(MemoryCategory::kKv);
    measured["scratch"] = peak(MemoryCategory::kScratch);
    measured["staging"] = peak(MemoryCategory::kStaging);
    measured["peak"] = ms.peak_bytes;
    out["device_name"] = info.name;
  }
  out["run_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  SPW_ASSIGN_OR_RETURN(admission::Estimate e, admission::estimate((*model)->file(), plan, cfg));
  const DeviceEstimate& h = e.host();
  const DeviceEstimate& g = e.gpu();
  out["estimate"] = {
      {"host",
       {{"weights", amount(h.weights)},
        {"kv", amount(h.kv)},
        {"scratch_logits", amount(Amount{h.scratch.bytes + h.logits.bytes, h.scratch.allowance + h.logits.allowance})},
        // The overhead beyond the fixed baseline and the engine's code pages
        // is the model's heap.
        {"model_heap", amount(Amount{h.overhead.bytes - cfg.host.fixed_overhead - cfg.host.engine_code,
                                     h.overhead.allowance})},
        {"total", amount(Amount{h.bytes(), h.allowance()})}}},
      {"gpu",
       {{"weights", amount(g.weights)},
        {"kv", amount(g.kv)},
        {"scratch", amount(g.scratch)},
        {"staging", amount(g.overhead)},
        {"total", amount(Amount{g.bytes(), g.allowance()})}}}};
  out["measured"] = measured;
  out["gpu"] = spec->on_gpu();
  out["params"] = (*model)->n_params();
  return out;
}

// ---------------------------------------------------------------- parent ----

// Runs argv, returns its stdout; stderr passes through. Non-zero exit -> error.
Result<std::string> run_process(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe(fds) != 0) return Status::io_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0].c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::io_error("cannot run " + args[0] + ": " + std::strerror(rc));
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::internal("child exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  }
  return out;
}

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

Status ensure_model(const ModelDef& d, const std::string& dir, const std::string& source_dir, std::string& path) {
  if (d.preset.empty()) {
    path = source_dir + "/models/stories260K.gguf";
    return Status();
  }
  path = dir + "/" + d.key + ".gguf";
  if (std::filesystem::exists(path)) return Status();  // written atomically, so complete
  const Preset& p = presets().at(d.preset);
  modelgen::RandomLlamaSpec s;
  s.n_embd = p.n_embd;
  s.n_layer = p.n_layer;
  s.n_head = p.n_head;
  s.n_head_kv = p.n_head_kv;
  s.n_ff = p.n_ff;
  s.arch = p.arch;
  s.n_expert = p.n_expert;
  s.n_expert_used = p.n_expert_used;
  s.n_ctx = 2048;
  s.type = d.type;
  s.mix = d.mix;
  s.seed = 7;
  s.vocab_path = source_dir + "/tests/data/ggml-vocab-llama-spm.gguf";
  std::fprintf(stderr, "generating %s ...\n", path.c_str());
  const std::string tmp = path + ".partial";
  SPW_RETURN_IF_ERROR(modelgen::write_random_llama(Env::default_env(), tmp, s));
  std::filesystem::rename(tmp, path);
  return Status();
}

struct Row {
  std::string case_name, device, category;
  uint64_t estimate = 0, allowance = 0, measured = 0;
  double error = 0;  // (estimate - measured) / measured
  bool check_lower = true;
  bool pass = true;
};

std::string mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(b) / (1 << 20));
  return s;
}

int parent(const std::string& which, const std::string& models_dir, const std::string& json_path,
           const std::string& md_path, double tolerance, const std::string& only) {
  const std::string source_dir = SPILLWAY_SOURCE_DIR;
  std::filesystem::create_directories(models_dir);
  std::map<std::string, ModelDef> defs;
  for (const auto& d : model_defs()) defs[d.key] = d;
  std::vector<Row> rows;
  json cases = json::array();
  int failures = 0;
  const std::string self = self_path();
  for (const Case& c : matrix(which)) {
    const std::string name = case_name(c);
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    std::string path;
    if (Status s = ensure_model(defs.at(c.model), models_dir, source_dir, path); !s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), s.to_string().c_str());
      ++failures;
      continue;
    }
    auto out = run_process({self, "--run-case", "--model-path", path, "--model", c.model, "--device", c.device,
                            "--ctx", std::to_string(c.ctx), "--ubatch", std::to_string(c.ubatch), "--parallel",
                            std::to_string(c.parallel), "--threads", std::to_string(c.threads), "--kv-block",
                            std::to_string(c.kv_block), "--kv-type", c.kv_type});
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), out.status().to_string().c_str());
      ++failures;
      continue;
    }
    json j = json::parse(*out, nullptr, false);
    if (j.is_discarded() || !j.contains("measured")) {
      std::fprintf(stderr, "%s: unreadable child output: %s\n", name.c_str(), out->c_str());
      ++failures;
      continue;
    }
    j["case"] = name;
    const bool gpu = j["gpu"].get<bool>();
    const json& est = j["estimate"][gpu ? "gpu" : "host"];
    const json& meas = j["measured"];
    auto add = [&](const std::string& cat, const std::string& est_key, const std::string& meas_key, bool lower) {
      Row r;
      r.case_name = name;
      r.device = gpu ? "gpu" : "host";
      r.category = cat;
      r.estimate = est[est_key]["bytes"].get<uint64_t>();
      r.allowance = est[est_key]["allowance"].get<uint64_t>();
      r.measured = meas[meas_key].get<uint64_t>();
      r.check_lower = lower;
      const double m = static_cast<double>(std::max<uint64_t>(r.measured, 1));
      r.error = (static_cast<double>(r.estimate) - m) / m;
      const bool over = r.measured > r.estimate + r.allowance;
      const bool off = r.measured == 0 ? r.estimate != 0 : (lower ? std::abs(r.error) > tolerance : r.error < -tolerance);
      r.pass = !over && !off;
      if (!r.pass) ++failures;
      rows.push_back(r);
    };
    if (gpu) {
      add("weights", "weights", "weights", true);
      add("kv", "kv", "kv", true);
      add("scratch", "scratch", "scratch", true);
      add("staging", "staging", "staging", true);
      add("total", "total", "peak", true);
    } else {
      add("weights", "weights", "weights", true);
      add("model heap", "model_heap", "model_heap", true);
      add("kv", "kv", "kv", true);
      add("scratch+logits", "scratch_logits", "scratch_logits", c.parallel == 1);
      add("total (peak RSS)", "total", "peak_rss", true);
    }
    std::fprintf(stderr, "%-48s %s in %.1f s\n", name.c_str(),
                 std::all_of(rows.end() - 5, rows.end(), [](const Row& r) { return r.pass; }) ? "ok"
                                                                                                         : "FAIL",
                 j.value("run_s", 0.0));
    cases.push_back(j);
  }

  // Markdown: every row, then the worst |error| per device and category.
  std::string md = "| case | device | category | estimate MiB | allowance MiB | measured MiB | error | |\n"
                   "|---|---|---|---:|---:|---:|---:|---|\n";
  std::map<std::string, std::pair<double, std::string>> worst;
  for (const Row& r : rows) {
    char err[32];
    std::snprintf(err, sizeof err, "%+.2f%%", 100 * r.error);
    md += "| " + r.case_name + " | " + r.device + " | " + r.category + " | " + mib(r.estimate) + " | " +
          mib(r.allowance) + " | " + mib(r.measured) + " | " + err + " | " +
          (r.pass ? (r.check_lower ? "ok" : "ok (upper bound only)") : "**FAIL**") + " |\n";
    const std::string key = r.device + " " + r.category;
    const double e = r.check_lower ? std::abs(r.error) : std::max(0.0, -r.error);
    if (e >= worst[key].first) worst[key] = {e, r.case_name};
  }
  md += "\n| device / category | worst abs error | case |\n|---|---:|---|\n";
  for (const auto& [k, v] : worst) {
    char err[32];
    std::snprintf(err, sizeof err, "%.2f%%", 100 * v.first);
    md += "| " + k + " | " + err + " | " + v.second + " |\n";
  }
  std::printf("%s", md.c_str());
  if (!md_path.empty()) std::ofstream(md_path) << md;
  if (!json_path.empty()) std::ofstream(json_path) << json{{"cases", cases}, {"tolerance", tolerance}}.dump(2);
  std::printf("\n%zu rows, %d failing (tolerance %.0f%%)\n", rows.size(), failures, 100 * tolerance);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace spw

int main(int argc, char** argv) {
  CLI::App app{"Memory estimator vs measured use, over a matrix of models and plans"};
  std::string which = "full", models_dir = "estimator-models", json_path, md_path, only;
  double tolerance = 0.10;
  bool run_case = false;
  spw::Case c;
  std::string model_path;
  app.add_option("--matrix", which, "quick | full")->check(CLI::IsMember({"quick", "full"}));
  app.add_option("--models-dir", models_dir, "Where generated models are kept (reused when present)");
  app.add_option("--json", json_path, "Write every case's estimate and measurement as JSON");
  app.add_option("--markdown", md_path, "Write the table as Markdown");
  app.add_option("--tolerance", tolerance, "Largest relative error a row may have");
  app.add_option("--only", only, "Run only cases whose name contains this");
  // Child mode (internal).
  app.add_flag("--run-case", run_case, "Run one case and print its JSON (internal)");
  app.add_option("--model-path", model_path);
  app.add_option("--model", c.model);
  app.add_option("--device", c.device);
  app.add_option("--ctx", c.ctx);
  app.add_option("--ubatch", c.ubatch);
  app.add_option("--parallel", c.parallel);
  app.add_option("--threads", c.threads);
  app.add_option("--kv-block", c.kv_block);
  app.add_option("--kv-type", c.kv_type);
  CLI11_PARSE(app, argc, argv);
  if (run_case) {
    auto r = spw::run_child(c, model_path);
    if (!r.ok()) {
      std::fprintf(stderr, "estimator_accuracy: %s\n", r.status().to_string().c_str());
      return 1;
    }
    std::printf("%s\n", r->dump().c_str());
    return 0;
  }
  return spw::parent(which, models_dir, json_path, md_path, tolerance, only);
}
