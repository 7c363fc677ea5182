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
// Mid-stream (--scenario midstream or all): per replica mode, a fresh gateway
// as above (context 512) on --midstream-model, by default a generated
// 15M-shape F32 model (288 dim / 6 layers / FFN 768, stories vocabulary,
// 24 MiB) in --models-dir: the 110M Q8_0 model fails the start-up
// equivalence check between lavapipe and the CPU (see docs/PERFORMANCE.md),
// so nothing could migrate on it. Greedy, prompt --midstream-prompt-file
// (default bench/prompt.txt, 274 tokens), --midstream-tokens generated
// tokens: first an uninterrupted run on the healthy GPU (the reference
// text), then the same request streamed again, and once --fault-after
// tokens of it were generated (Ticket::generated, polled every millisecond)
// a device loss is armed at the GPU's next queue submission. With the
// paths' equivalence verified at start (warm, mmap), the scheduler moves the
// request to the CPU path from its checkpoint at the last token boundary:
// the CPU re-evaluates prompt + generated tokens and the stream goes on.
// Measured: the gap between the last text event before the fault and the
// first one after it (client side; it includes the failing GPU step, the
// failover decision, the CPU path's re-prefill and one CPU token), the
// tokens re-prefilled (the checkpoint's prompt + generated), whether the
// whole streamed text equals the uninterrupted GPU run's and an
// uninterrupted CPU run's (the CPU path's scheduler directly, after the
// fault), and the paths' usual per-token times for comparison. An
// on-demand replica is never checked for equivalence (checking would load
// it), so its request ends with a resumable error (FailureReason::
// kResumable, its checkpoint kept); measured: last text event -> that error.
//
// Output: a table on stdout; --json FILE writes every sample (field
// "scenario": "first-token" or "midstream").
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/fault_injector.h"
#include "backend/vulkan/vulkan_backend.h"
#include "bench_models.h"
#include "core/env.h"
#include "gateway/builder.h"

namespace {

using Clock = std::chrono::steady_clock;
using spw::gateway::BuiltGateway;

struct Sample {
  std::string mode;
  bool evicted = false;
  int rep = 0;
  std::string path;             // where the faulted request was served
  int attempts = 0;             // failovers it went through
  double ttft_ms = 0;           // submit -> first token
  double total_ms = 0;          // submit -> finished
  double replica_load_ms = -1;  // on-demand: the load it waited for
  double baseline_ttft_ms = 0;  // the same request on the healthy GPU
  bool ok = false;
  std::string error;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

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
  o.device = spw::Placement::vulkan();
  o.ctx = 256;
  o.journal = "none";
  o.threads = threads;
  o.replica = *spw::gateway::parse_replica_mode(mode);
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

// --- Mid-stream: a fault after K streamed tokens ---------------------------

struct MidSample {
  std::string mode;
  int rep = 0;
  std::string equivalence;        // the start-up check's verdict for gpu <-> cpu
  std::string equivalence_after;  // the same once the fault and the CPU runs are over (an on-demand replica loaded)
  std::string outcome;            // "migrated", "resumable error", or the other error
  std::string path;               // where it finished
  int migrations = 0;
  int32_t completion_tokens = 0;
  int32_t fault_after_token = -1;  // generated tokens in the checkpoint it moved / stopped at
  int32_t n_prompt = 0;
  int32_t reprefill_tokens = -1;  // tokens the CPU path evaluated again (prompt + generated)
  size_t replay_bytes = 0;        // text regenerated silently (streamed after the checkpoint)
  double gap_ms = -1;             // last text before the fault -> first text after it (or the error)
  double fault_to_next_ms = -1;   // the fault seen fired (polled every ms) -> first text after it (or the error)
  double gpu_ref_ttft_ms = -1;    // the reference run on the GPU: submit -> first text
  double build_ms = -1;           // build_gateway (warm-up and equivalence check included)
  double total_ms = -1;           // submit -> final event
  double gpu_token_ms = -1;       // median gap between text events on the healthy GPU (reference run)
  double cpu_token_ms = -1;       // the same after the move, on the CPU
  double cpu_ref_ttft_ms = -1;    // uninterrupted CPU run: submit -> first text (prompt prefill)
  bool equal_gpu = false;         // streamed text == uninterrupted GPU run's
  bool equal_cpu = false;         // streamed text == uninterrupted CPU run's
  bool refs_equal = false;        // the two uninterrupted runs agree
  bool prefix_of_gpu = false;     // streamed text is a prefix of the GPU run's (what a resumable error leaves)
  long first_diff = -1;           // first differing byte against the GPU reference (-1: none)
  bool ok = false;
  std::string error;
};

struct StreamEvent {
  double ms;      // since submit
  size_t offset;  // of its first byte in the streamed text
  size_t len;
};

struct Streamed {
  std::shared_ptr<spw::serve::Ticket> ticket;
  std::vector<StreamEvent> events;
  std::string text;
  spw::serve::RequestEvent fin;
  bool finished = false;
  double fin_ms = -1;
  double fired_ms = -1;  // when the armed fault was first seen fired
  std::string error;     // submit refused, or no final event
};

// Streams one request; with `faults`, arms a device loss at the next queue
// submission once `fault_after` tokens were generated.
Streamed stream_request(const std::function<spw::Result<std::shared_ptr<spw::serve::Ticket>>()>& submit,
                        spw::FaultInjector* faults, int fault_after) {
  Streamed out;
  const auto t0 = Clock::now();
  auto a = submit();
  if (!a.ok()) {
    out.error = a.status().to_string();
    return out;
  }
  out.ticket = *a;
  bool armed = faults == nullptr;
  uint64_t fault_id = 0;
  spw::serve::RequestEvent ev;
  const auto deadline = t0 + std::chrono::minutes(5);
  while (Clock::now() < deadline) {
    const bool watching = !armed || (fault_id != 0 && out.fired_ms < 0);
    const auto pr = out.ticket->next_event(ev, std::chrono::milliseconds(watching ? 1 : 100));
    if (!armed && out.ticket->generated() >= fault_after) {
      auto f = faults->arm({spw::FaultKind::kDeviceLost, 0, 1, 1.0});
      if (f.ok()) fault_id = f->id;
      armed = true;
    } else if (fault_id != 0 && out.fired_ms < 0) {
      for (const spw::ArmedFault& f : faults->list()) {
        if (f.id == fault_id && f.fired > 0) out.fired_ms = ms_since(t0);
      }
    }
    if (pr == spw::serve::PopResult::kClosed) break;
    if (pr != spw::serve::PopResult::kItem) continue;
    if (ev.kind == spw::serve::RequestEvent::Kind::kText) {
      out.events.push_back({ms_since(t0), out.text.size(), ev.text.size()});
      out.text += ev.text;
      continue;
    }
    out.fin = ev;
    out.finished = true;
    out.fin_ms = ms_since(t0);
    return out;
  }
  out.error = "no final event";
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

double median_gap(const std::vector<StreamEvent>& ev, size_t from, size_t to) {
  std::vector<double> gaps;
  for (size_t i = from + 1; i < to && i < ev.size(); ++i) gaps.push_back(ev[i].ms - ev[i - 1].ms);
  return median(gaps);
}

MidSample measure_midstream(const std::string& model, const std::string& mode, int rep, int threads,
                            const std::string& prompt, int max_tokens, int fault_after) {
  MidSample s;
  s.mode = mode;
  s.rep = rep;
  spw::gateway::GatewayOptions o;
  o.model = model;
  o.device = spw::Placement::vulkan();
  o.ctx = 512;
  o.journal = "none";  // the resume point is the last token boundary with or without one
  o.threads = threads;
  o.replica = *spw::gateway::parse_replica_mode(mode);
  o.health_interval_s = 0;
  const auto tb = Clock::now();
  auto b = spw::gateway::build_gateway(spw::Env::default_env(), o);
  s.build_ms = ms_since(tb);
  if (!b.ok()) {
    s.error = b.status().to_string();
    return s;
  }
  spw::gateway::Gateway& gw = *b->gateway;
  if (!b->vulkan || gw.paths().front().name != "gpu") {
    s.error = "no GPU path was built";
    return s;
  }
  size_t cpu = gw.paths().size();
  for (size_t i = 0; i < gw.paths().size(); ++i) {
    if (gw.paths()[i].name == "cpu") cpu = i;
  }
  if (cpu == gw.paths().size()) {
    s.error = "no CPU path was built";
    return s;
  }
  const spw::Status allowed = gw.migration_allowed(0, cpu);
  s.equivalence = allowed.ok() ? "passed" : allowed.message();
  spw::gateway::RouteRequest r;
  r.generation.prompt = prompt;
  r.generation.max_tokens = max_tokens;
  r.generation.sampler.temperature = 0;
  auto via_gateway = [&]() -> spw::Result<std::shared_ptr<spw::serve::Ticket>> {
    auto a = gw.submit(r);
    if (!a.ok()) return a.status();
    return a->ticket;
  };
  // The uninterrupted reference on the healthy GPU.
  const Streamed ref = stream_request(via_gateway, nullptr, 0);
  if (!ref.finished || ref.fin.state != spw::serve::RequestState::kDone || ref.ticket->path() != "gpu") {
    s.error = "GPU reference run: " + (ref.error.empty() ? ref.fin.status.to_string() : ref.error) + " on " +
              (ref.ticket ? ref.ticket->path() : std::string("-"));
    b->gateway->shutdown(std::chrono::milliseconds(0));
    return s;
  }
  s.gpu_token_ms = median_gap(ref.events, 0, ref.events.size());
  if (!ref.events.empty()) s.gpu_ref_ttft_ms = ref.events.front().ms;
  // The faulted run.
  const Streamed run = stream_request(via_gateway, &b->vulkan->faults(), fault_after);
  s.total_ms = run.fin_ms;
  s.completion_tokens = run.fin.completion_tokens;
  if (run.ticket) {
    s.path = run.ticket->path();
    s.migrations = run.ticket->migrations();
  }
  std::shared_ptr<const spw::Checkpoint> cp;
  if (!run.finished) {
    s.error = run.error;
  } else if (run.fin.state == spw::serve::RequestState::kDone) {
    s.outcome = s.migrations > 0 ? "migrated" : "not interrupted";
    cp = run.ticket->job().resume;  // the checkpoint it moved from
    s.replay_bytes = run.ticket->job().replay.size();
  } else if (run.fin.status.reason() == spw::FailureReason::kResumable) {
    s.outcome = "resumable error";
    cp = run.ticket->checkpoint();  // kept for a resume
  } else {
    s.outcome = "error";
    s.error = run.fin.status.to_string();
  }
  if (cp) {
    s.fault_after_token = cp->n_generated;
    s.n_prompt = cp->n_prompt;
    s.reprefill_tokens = static_cast<int32_t>(cp->tokens.size());
    // Text events starting at or after this byte came from the CPU path: the
    // GPU streamed at most the checkpoint's text plus the replayed part.
    const size_t boundary = cp->text.size() + s.replay_bytes;
    size_t k = 0;
    while (k < run.events.size() && run.events[k].offset < boundary) ++k;
    const double before_ms = k > 0 ? run.events[k - 1].ms : 0;  // 0: the submit
    double after_ms = -1;
    if (s.outcome == "migrated" && k < run.events.size()) {
      after_ms = run.events[k].ms;
      s.cpu_token_ms = median_gap(run.events, k, run.events.size());
    } else if (s.outcome == "resumable error") {
      after_ms = run.fin_ms;
    }
    if (after_ms >= 0) {
      s.gap_ms = after_ms - before_ms;
      if (run.fired_ms >= 0) s.fault_to_next_ms = after_ms - run.fired_ms;
    }
  }
  // The uninterrupted CPU run, after the fault (it loads an on-demand
  // replica). A short request with another prompt first, so that the CPU
  // worker's kept KV holds no prefix of this prompt and the first token
  // time is the whole prompt's prefill (and no replica load).
  spw::serve::GenerationRequest g = r.generation;
  spw::serve::GenerationRequest other = g;
  other.prompt = "The little dog";
  other.max_tokens = 1;
  auto on_cpu_other = [&]() { return gw.paths()[cpu].scheduler->submit(other); };
  (void)stream_request(on_cpu_other, nullptr, 0);
  auto on_cpu = [&]() { return gw.paths()[cpu].scheduler->submit(g); };
  const Streamed cref = stream_request(on_cpu, nullptr, 0);
  if (cref.finished && cref.fin.state == spw::serve::RequestState::kDone && !cref.events.empty()) {
    s.cpu_ref_ttft_ms = cref.events.front().ms;
  }
  s.equal_gpu = run.text == ref.text;
  s.equal_cpu = cref.finished && run.text == cref.text;
  s.refs_equal = cref.finished && ref.text == cref.text;
  s.prefix_of_gpu = ref.text.compare(0, run.text.size(), run.text) == 0;
  const spw::Status allowed_after = gw.migration_allowed(0, cpu);
  s.equivalence_after = allowed_after.ok() ? "passed" : allowed_after.message();
  if (!s.equal_gpu) {
    size_t i = 0;
    while (i < run.text.size() && i < ref.text.size() && run.text[i] == ref.text[i]) ++i;
    s.first_diff = static_cast<long>(i);
  }
  const bool expect_migration = allowed.ok();
  if (s.error.empty()) {
    if (expect_migration && s.outcome != "migrated") {
      s.error = "expected a migration, got: " + s.outcome + " " + run.fin.status.to_string();
    } else if (!expect_migration && s.outcome != "resumable error") {
      s.error = "expected a resumable error (" + s.equivalence + "), got: " + s.outcome;
    } else if (s.outcome == "migrated" && (s.path != "cpu" || s.migrations != 1)) {
      s.error = "finished on " + s.path + " after " + std::to_string(s.migrations) + " migrations";
    } else if (s.outcome == "migrated" && s.completion_tokens != max_tokens) {
      s.error = "completion_tokens " + std::to_string(s.completion_tokens) + " != " + std::to_string(max_tokens);
    } else if (s.outcome == "migrated" && !s.equal_gpu && s.refs_equal) {
      s.error = "BUG: the migrated text differs from the uninterrupted runs at byte " + std::to_string(s.first_diff);
    } else if (s.outcome == "resumable error" && !s.prefix_of_gpu) {
      s.error = "BUG: the text streamed before the resumable error is not a prefix of the uninterrupted run's";
    } else if (s.gap_ms < 0) {
      s.error = "no text event after the fault";
    }
  }
  s.ok = s.error.empty();
  b->gateway->shutdown(std::chrono::milliseconds(0));
  return s;
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time from a GPU fault to the first token served by the CPU path, per replica mode"};
  std::string model, models_dir = "build/bench-models", json_path, scenario = "all";
  std::string mid_model, mid_prompt_file = std::string(SPILLWAY_SOURCE_DIR) + "/bench/prompt.txt";
  int reps = 3, threads = 2, mid_reps = 1, mid_tokens = 48, fault_after = 16;
  bool evict_too = true;
  app.add_option("--model", model, "GGUF to serve (default: a generated 110M Q8_0 model)");
  app.add_option("--models-dir", models_dir, "Where the generated models are kept")->capture_default_str();
  app.add_option("--reps", reps, "Repetitions per mode")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--json", json_path, "Write every sample as JSON");
  app.add_flag("!--no-evict", evict_too, "Skip the page-cache-evicted runs");
  app.add_option("--scenario", scenario, "first-token | midstream | all")
      ->check(CLI::IsMember({"first-token", "midstream", "all"}))
      ->capture_default_str();
  app.add_option("--midstream-model", mid_model,
                 "GGUF for the mid-stream scenario (default: a generated 15M-shape F32 model)");
  app.add_option("--midstream-reps", mid_reps, "Mid-stream repetitions per mode")->capture_default_str();
  app.add_option("--midstream-tokens", mid_tokens, "Generated tokens of the mid-stream request")->capture_default_str();
  app.add_option("--fault-after", fault_after, "Generated tokens before the device loss is armed")
      ->capture_default_str();
  app.add_option("--midstream-prompt-file", mid_prompt_file, "Prompt of the mid-stream request")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const bool first_token = scenario != "midstream";
  const bool midstream = scenario != "first-token";

  std::filesystem::create_directories(models_dir);
  if (first_token && model.empty()) {
    model = spw::bench::ensure_110m_q8_0(models_dir, "recovery_bench");
    if (model.empty()) return 1;
  }
  if (midstream && mid_model.empty()) {
    mid_model =
        spw::bench::ensure_model(models_dir, "midstream-15m-f32.gguf",
                                 spw::bench::llama_spec(288, 6, 6, 768, spw::gguf::GgmlType::kF32), "recovery_bench");
    if (mid_model.empty()) return 1;
  }

  std::vector<Sample> samples;
  if (first_token) {
    std::printf("model %s (%.1f MiB), %d reps, %d threads\n", model.c_str(),
                static_cast<double>(std::filesystem::file_size(model)) / (1024.0 * 1024.0), reps, threads);
    std::fflush(stdout);
    for (const char* mode : {"warm", "mmap", "on-demand"}) {
      for (bool evicted : {false, true}) {
        if (evicted && !evict_too) continue;
        for (int rep = 0; rep < reps; ++rep) {
          samples.push_back(measure(model, mode, evicted, rep, threads));
          const Sample& s = samples.back();
          if (!s.ok)
            std::fprintf(stderr, "recovery_bench: %s%s rep %d: %s\n", mode, evicted ? " evicted" : "", rep,
                         s.error.c_str());
        }
      }
    }

    std::printf(
        "\n| replica | page cache | runs ok | fault -> first token on CPU, ms (median) | total ms | replica load ms | "
        "healthy GPU first token ms |\n");
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
  }

  std::vector<MidSample> mids;
  if (midstream) {
    const std::string prompt = read_file(mid_prompt_file);
    if (prompt.empty()) {
      std::fprintf(stderr, "recovery_bench: empty prompt file %s\n", mid_prompt_file.c_str());
      return 1;
    }
    std::printf(
        "\nmid-stream: model %s (%.1f MiB), prompt %s (%zu bytes), %d tokens, device loss armed after %d, "
        "%d reps, %d threads\n",
        mid_model.c_str(), static_cast<double>(std::filesystem::file_size(mid_model)) / (1024.0 * 1024.0),
        mid_prompt_file.c_str(), prompt.size(), mid_tokens, fault_after, mid_reps, threads);
    std::fflush(stdout);
    for (const char* mode : {"warm", "mmap", "on-demand"}) {
      for (int rep = 0; rep < mid_reps; ++rep) {
        mids.push_back(measure_midstream(mid_model, mode, rep, threads, prompt, mid_tokens, fault_after));
        const MidSample& s = mids.back();
        if (!s.ok) std::fprintf(stderr, "recovery_bench: mid-stream %s rep %d: %s\n", mode, rep, s.error.c_str());
      }
    }
    std::printf(
        "\n| replica | equivalence at start | rep | outcome | fault after token | re-prefilled tokens "
        "(prompt + generated) | last text before -> first after (or the error), ms | fault fired -> first "
        "after, ms | healthy GPU ms/token | CPU ms/token after | uninterrupted CPU first token ms | text = "
        "uninterrupted GPU run | = CPU run |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const MidSample& s : mids) {
      std::string eq_gpu = s.equal_gpu ? "yes" : "no, from byte " + std::to_string(s.first_diff);
      if (s.outcome == "resumable error") eq_gpu = s.prefix_of_gpu ? "a prefix of it" : "NOT a prefix of it";
      std::printf("| %s | %s | %d%s | %s | %d | %s | %.1f | %s | %.1f | %s | %.1f | %s | %s |\n", s.mode.c_str(),
                  s.equivalence.c_str(), s.rep, s.ok ? "" : " (FAILED)", s.outcome.c_str(), s.fault_after_token,
                  s.reprefill_tokens < 0 ? "-"
                                         : (std::to_string(s.reprefill_tokens) + " (" + std::to_string(s.n_prompt) +
                                            " + " + std::to_string(s.reprefill_tokens - s.n_prompt) + ")")
                                               .c_str(),
                  s.gap_ms, s.fault_to_next_ms < 0 ? "-" : fmt("%.1f", s.fault_to_next_ms).c_str(), s.gpu_token_ms,
                  s.cpu_token_ms < 0 ? "-" : fmt("%.1f", s.cpu_token_ms).c_str(), s.cpu_ref_ttft_ms, eq_gpu.c_str(),
                  s.outcome == "resumable error" ? "-" : (s.equal_cpu ? "yes" : "no"));
    }
    for (const MidSample& s : mids) {
      std::printf(
          "%s rep %d: gateway built in %.0f ms; GPU reference first token %.1f ms; faulted request %.1f ms "
          "in all, %d completion tokens, on %s; uninterrupted GPU and CPU runs %s; migration gpu -> cpu "
          "afterwards: %s\n",
          s.mode.c_str(), s.rep, s.build_ms, s.gpu_ref_ttft_ms, s.total_ms, s.completion_tokens, s.path.c_str(),
          s.refs_equal ? "agree" : "DIFFER", s.equivalence_after.c_str());
    }
  }

  if (!json_path.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const Sample& s : samples) {
      j.push_back({{"scenario", "first-token"},
                   {"mode", s.mode},
                   {"evicted", s.evicted},
                   {"rep", s.rep},
                   {"ok", s.ok},
                   {"path", s.path},
                   {"attempts", s.attempts},
                   {"ttft_ms", s.ttft_ms},
                   {"total_ms", s.total_ms},
                   {"replica_load_ms", s.replica_load_ms},
                   {"baseline_ttft_ms", s.baseline_ttft_ms},
                   {"error", s.error}});
    }
    for (const MidSample& s : mids) {
      j.push_back({{"scenario", "midstream"},
                   {"model", mid_model},
                   {"mode", s.mode},
                   {"rep", s.rep},
                   {"ok", s.ok},
                   {"equivalence", s.equivalence},
                   {"equivalence_after", s.equivalence_after},
                   {"outcome", s.outcome},
                   {"path", s.path},
                   {"migrations", s.migrations},
                   {"completion_tokens", s.completion_tokens},
                   {"fault_after_token", s.fault_after_token},
                   {"n_prompt", s.n_prompt},
                   {"reprefill_tokens", s.reprefill_tokens},
                   {"replay_bytes", s.replay_bytes},
                   {"gap_ms", s.gap_ms},
                   {"total_ms", s.total_ms},
                   {"gpu_token_ms", s.gpu_token_ms},
                   {"cpu_token_ms", s.cpu_token_ms},
                   {"cpu_ref_ttft_ms", s.cpu_ref_ttft_ms},
                   {"equal_gpu", s.equal_gpu},
                   {"equal_cpu", s.equal_cpu},
                   {"refs_equal", s.refs_equal},
                   {"prefix_of_gpu", s.prefix_of_gpu},
                   {"first_diff", s.first_diff},
                   {"fault_to_next_ms", s.fault_to_next_ms},
                   {"gpu_ref_ttft_ms", s.gpu_ref_ttft_ms},
                   {"build_ms", s.build_ms},
                   {"error", s.error}});
    }
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  const bool all_ok = std::all_of(samples.begin(), samples.end(), [](const Sample& s) { return s.ok; }) &&
                      std::all_of(mids.begin(), mids.end(), [](const MidSample& s) { return s.ok; });
  return all_ok ? 0 : 1;
}
