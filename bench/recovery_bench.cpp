// recovery_bench: how long a client waits when the GPU fails under its
// request, per CPU replica mode: from the fault to the first token served by
// the CPU path.
//
// For each replica mode (warm, mmap, on-demand) and each repetition, a fresh
// in-process gateway (build_gateway: --device vulkan, a CPU fallback path on
// the same model, warm-up on, no journal) serves one greedy request on the
// GPU; then a device loss is armed at the GPU's next queue submission (the
// FaultInjector the admin API uses) and the next request is submitted. It
// fails before its first token, fails over to the CPU path (same ticket) and
// is served there; measured from the submit: time to its first token, total
// time, and the CPU replica's own load time when it had to load (on-demand).
// With --evict the model file's page cache is dropped (posix_fadvise
// DONTNEED: pages no process maps) just before the fault, as memory pressure
// would: the cold case for mmap and on-demand replicas, whose pages are not
// held; a warm replica keeps its pages mapped, so eviction cannot touch them.
// A baseline request on a healthy GPU is timed the same way for comparison.
//
// Model: --model PATH, or by default a generated 110M-parameter Q8_0 model
// (spillway-gen-model's preset, stories vocabulary) kept in --models-dir, big
// enough for page-in to show. Needs a Vulkan device (lavapipe works).
//
// Output: a table on stdout; --json FILE writes every sample.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/vulkan/vulkan_backend.h"
#include "core/env.h"
#include "gateway/builder.h"
#include "tools/modelgen/random_llama.h"

namespace {

using Clock = std::chrono::steady_clock;
using spw::gateway::BuiltGateway;

struct Sample {
  std::string mode;
  bool evicted = false;
  int rep = 0;
  std::string path;        // where the faulted request was served
  int attempts = 0;        // failovers it went through
  double ttft_ms = 0;      // submit -> first token
  double total_ms = 0;     // submit -> finished
  double replica_load_ms = -1;  // on-demand: the load it waited for
  double baseline_ttft_ms = 0;  // the same request on the healthy GPU
  bool ok = false;
  std::string error;
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Submits a greedy request and drains it: (ttft ms, total ms, ticket).
struct Run {
  double ttft_ms = -1, total_ms = -1;
  std::shared_ptr<spw::serve::Ticket> ticket;
  std::string error;
};

Run run_one(spw::gateway::Gateway& gw) {
  spw::gateway::RouteRequest r;
  r.generation.prompt = "Once upon a time";
  r.generation.max_tokens = 16;
  r.generation.sampler.temperature = 0;
  Run out;
  const auto t0 = Clock::now();
  auto a = gw.submit(r);
  if (!a.ok()) {
    out.error = a.status().to_string();
    return out;
  }
  out.ticket = a->ticket;
  spw::serve::RequestEvent ev;
  const auto deadline = t0 + std::chrono::minutes(5);
  while (Clock::now() < deadline) {
    const auto pr = a->ticket->next_event(ev, std::chrono::milliseconds(100));
    if (pr == spw::serve::PopResult::kClosed) break;
    if (pr != spw::serve::PopResult::kItem) continue;
    if (ev.kind == spw::serve::RequestEvent::Kind::kText && out.ttft_ms < 0) out.ttft_ms = ms_since(t0);
    if (ev.kind == spw::serve::RequestEvent::Kind::kFinished) {
      out.total_ms = ms_since(t0);
      if (ev.state != spw::serve::RequestState::kDone) out.error = ev.status.to_string();
      break;
    }
  }
  return out;
}

void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

Sample measure(const std::string& model, const std::string& mode, bool evicted, int rep, int threads) {
  Sample s;
  s.mode = mode;
  s.evicted = evicted;
  s.rep = rep;
  spw::gateway::GatewayOptions o;
  o.model = model;
  o.device = "vulkan";
  o.ctx = 256;
  o.journal = "none";
  o.threads = threads;
  o.replica = mode;
  o.health_interval_s = 0;  // only the armed fault acts
  auto b = spw::gateway::build_gateway(spw::Env::default_env(), o);
  if (!b.ok()) {
    s.error = b.status().to_string();
    return s;
  }
  if (!b->vulkan || b->gateway->paths().front().name != "gpu") {
    s.error = "no GPU path was built";
    return s;
  }
  const Run base = run_one(*b->gateway);
  s.baseline_ttft_ms = base.ttft_ms;
  if (evicted) evict(model);
  (void)b->vulkan->faults().arm({spw::FaultKind::kDeviceLost, 0, 1, 1.0});
  const Run r = run_one(*b->gateway);
  s.ttft_ms = r.ttft_ms;
  s.total_ms = r.total_ms;
  s.error = r.error;
  if (r.ticket) {
    s.path = r.ticket->path();
    s.attempts = r.ticket->attempts();
  }
  for (const auto& p : b->gateway->paths()) {
    if (p.name == "cpu") s.replica_load_ms = p.replica->info().loaded_in_ms;
  }
  s.ok = r.error.empty() && s.path == "cpu" && s.attempts == 1;
  if (r.error.empty() && !s.ok) s.error = "served on " + s.path + " after " + std::to_string(s.attempts) + " moves";
  b->gateway->shutdown(std::chrono::milliseconds(0));
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time from a GPU fault to the first token served by the CPU path, per replica mode"};
  std::string model, models_dir = "build/bench-models", json_path;
  int reps = 3, threads = 2;
  bool evict_too = true;
  app.add_option("--model", model, "GGUF to serve (default: a generated 110M Q8_0 model)");
  app.add_option("--models-dir", models_dir, "Where the generated model is kept")->capture_default_str();
  app.add_option("--reps", reps, "Repetitions per mode")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--json", json_path, "Write every sample as JSON");
  app.add_flag("!--no-evict", evict_too, "Skip the page-cache-evicted runs");
  CLI11_PARSE(app, argc, argv);

  if (model.empty()) {
    std::filesystem::create_directories(models_dir);
    model = models_dir + "/recovery-110m-q8_0.gguf";
    if (!std::filesystem::exists(model)) {
      spw::modelgen::RandomLlamaSpec spec;
      spec.n_embd = 768;
      spec.n_layer = 12;
      spec.n_head = 12;
      spec.n_head_kv = 12;
      spec.n_ff = 2048;
      spec.n_ctx = 2048;
      spec.type = spw::gguf::GgmlType::kQ8_0;
      spec.vocab_path = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
      const spw::Status st = spw::modelgen::write_random_llama(spw::Env::default_env(), model, spec);
      if (!st.ok()) {
        std::fprintf(stderr, "recovery_bench: generating %s: %s\n", model.c_str(), st.to_string().c_str());
        return 1;
      }
    }
  }
  std::printf("model %s (%.1f MiB), %d reps, %d threads\n", model.c_str(),
              static_cast<double>(std::filesystem::file_size(model)) / (1024.0 * 1024.0), reps, threads);

  std::vector<Sample> samples;
  for (const char* mode : {"warm", "mmap", "on-demand"}) {
    for (bool evicted : {false, true}) {
      if (evicted && !evict_too) continue;
      for (int rep = 0; rep < reps; ++rep) {
        samples.push_back(measure(model, mode, evicted, rep, threads));
        const Sample& s = samples.back();
        if (!s.ok) std::fprintf(stderr, "recovery_bench: %s%s rep %d: %s\n", mode, evicted ? " evicted" : "", rep,
                                s.error.c_str());
      }
    }
  }

  std::printf("\n| replica | page cache | runs ok | fault -> first token on CPU, ms (median) | total ms | replica load ms | healthy GPU first token ms |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const char* mode : {"warm", "mmap", "on-demand"}) {
    for (bool evicted : {false, true}) {
      std::vector<double> ttft, total, load, base;
      int ok = 0, n = 0;
      for (const Sample& s : samples) {
        if (s.mode != mode || s.evicted != evicted) continue;
        ++n;
        if (!s.ok) continue;
        ++ok;
        ttft.push_back(s.ttft_ms);
        total.push_back(s.total_ms);
        if (s.replica_load_ms >= 0) load.push_back(s.replica_load_ms);
        base.push_back(s.baseline_ttft_ms);
      }
      if (n == 0) continue;
      std::printf("| %s | %s | %d/%d | %.1f | %.1f | %s | %.1f |\n", mode, evicted ? "evicted" : "as left", ok, n,
                  median(ttft), median(total), load.empty() ? "-" : std::to_string(median(load)).c_str(),
                  median(base));
    }
  }
  if (!json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Sample& s : samples) {
      j.push_back({{"mode", s.mode}, {"evicted", s.evicted}, {"rep", s.rep}, {"ok", s.ok}, {"path", s.path},
                   {"attempts", s.attempts}, {"ttft_ms", s.ttft_ms}, {"total_ms", s.total_ms},
                   {"replica_load_ms", s.replica_load_ms}, {"baseline_ttft_ms", s.baseline_ttft_ms},
                   {"error", s.error}});
    }
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  const bool all_ok = std::all_of(samples.begin(), samples.end(), [](const Sample& s) { return s.ok; });
  return all_ok ? 0 : 1;
}
