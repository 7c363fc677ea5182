// Continuous batching on one path (CPU by default, --device vulkan or
// hybrid:N): aggregate decode throughput and per-stream inter-token latency
// at 1, 2, 4 and 8 concurrent streams, with the workers' step batcher on and
// off side by side in one run (interleaved rounds), and the time to first
// token of a long prompt that arrives while four streams run, with its
// prompt mixed into the steps in chunks (the server's way), run beside the
// steps, and without batching.
//
// Model: --model PATH, or by default the generated 110M-parameter Q8_0 model
// recovery_bench also uses (spillway-gen-model's 110M shape with the
// stories260K vocabulary, kept in --models-dir). Each configuration builds a
// fresh engine scheduler (serve::make_engine_scheduler: CPU, --threads,
// n_workers = streams, context 512), warms it up with one request, then
// submits `streams` greedy requests at once, each with its own prompt and
// --tokens max tokens. Timestamps come from the scheduler's after_token hook
// (the worker's thread, after every token). Aggregate tokens/s = all
// generated tokens / (last token - submit); inter-token latency = the gaps
// between one stream's consecutive tokens, all streams pooled. A random
// model may sample its end-of-generation token early: the generated count
// is reported. The long-prompt case runs 4 streams of 2 x --tokens on 5
// workers, submits bench/prompt.txt (274 tokens) once every stream has 16
// tokens, and reports its time to first token and the gaps (p50, p99,
// longest) the 4 streams saw meanwhile.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "core/placement.h"
#include "model/model.h"
#include "serve/engine_executor.h"
#include "bench_models.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Timeline {
  std::mutex mu;
  std::map<uint64_t, std::vector<int64_t>> tokens;  // request id -> token times (ns)
  void add(uint64_t id, int64_t ns) {
    std::lock_guard<std::mutex> lk(mu);
    tokens[id].push_back(ns);
  }
};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

struct Result {
  int streams = 0;
  bool batching = false;
  int64_t tokens = 0;
  double seconds = 0;
  double tps = 0;
  double itl_p50_ms = 0, itl_p99_ms = 0;
  int32_t max_batch = 0;
  double mean_batch = 0;
};

const char* kPrompts[] = {"Once upon a time", "The little dog", "Lily and Ben went to the park", "One day",
                          "The sun was shining", "Tom had a red ball", "In a small town", "The cat sat"};

// How a long prompt meets the running streams.
enum class Mode { kOff, kBeside, kMixed };
const char* mode_name(Mode m) { return m == Mode::kOff ? "off" : m == Mode::kBeside ? "beside" : "mixed"; }

spw::Placement g_device = spw::Placement::cpu();

std::unique_ptr<spw::serve::Scheduler> build(const std::shared_ptr<const spw::Model>& model, int workers, int threads,
                                             Mode mode, Timeline* tl, std::shared_ptr<spw::StepBatcher>* batcher,
                                             int step_tokens = 0) {
  spw::serve::EngineServeOptions o;
  o.device = g_device;
  o.n_workers = workers;
  o.n_threads = threads;
  o.n_ctx = 512;
  o.batching = mode != Mode::kOff;
  o.mix_prefill = mode == Mode::kMixed;
  o.step_tokens = step_tokens;
  o.hooks.after_token = [tl](uint64_t id, int32_t) { tl->add(id, now_ns()); };
  auto s = spw::serve::make_engine_scheduler(spw::Env::default_env(), model, o);
  if (!s.ok()) {
    std::fprintf(stderr, "batching_bench: %s\n", s.status().to_string().c_str());
    std::exit(1);
  }
  *batcher = s->batcher;
  return std::move(s->scheduler);
}

spw::serve::GenerationRequest request(const std::string& prompt, int tokens) {
  spw::serve::GenerationRequest g;
  g.prompt = prompt;
  g.sampler.temperature = 0;
  g.max_tokens = tokens;
  return g;
}

void wait_done(const std::vector<std::shared_ptr<spw::serve::Ticket>>& ts) {
  for (const auto& t : ts) {
    spw::serve::RequestEvent ev;
    while (t->next_event(ev, std::chrono::seconds(60)) != spw::serve::PopResult::kClosed) {
    }
  }
}

Result run_streams(const std::shared_ptr<const spw::Model>& model, int streams, int threads, int tokens,
                   bool batching) {
  Timeline tl;
  std::shared_ptr<spw::StepBatcher> batcher;
  auto s = build(model, streams, threads, batching ? Mode::kMixed : Mode::kOff, &tl, &batcher);
  wait_done({*s->submit(request("Warm up", 4))});
  {
    std::lock_guard<std::mutex> lk(tl.mu);
    tl.tokens.clear();
  }
  const spw::StepBatcherStats before = batcher ? batcher->stats() : spw::StepBatcherStats{};
  const int64_t t0 = now_ns();
  std::vector<std::shared_ptr<spw::serve::Ticket>> ts;
  for (int i = 0; i < streams; ++i) ts.push_back(*s->submit(request(kPrompts[i % 8], tokens)));
  wait_done(ts);
  Result r;
  r.streams = streams;
  r.batching = batching;
  int64_t last = t0;
  std::vector<double> gaps;
  for (auto& [id, times] : tl.tokens) {
    r.tokens += static_cast<int64_t>(times.size());
    last = std::max(last, times.back());
    for (size_t i = 1; i < times.size(); ++i) gaps.push_back(static_cast<double>(times[i] - times[i - 1]) / 1e6);
  }
  r.seconds = static_cast<double>(last - t0) / 1e9;
  r.tps = static_cast<double>(r.tokens) / r.seconds;
  r.itl_p50_ms = percentile(gaps, 0.5);
  r.itl_p99_ms = percentile(gaps, 0.99);
  if (batcher) {
    const spw::StepBatcherStats st = batcher->stats();
    r.max_batch = st.max_batch;
    const uint64_t steps = st.steps - before.steps;
    r.mean_batch = steps ? static_cast<double>(st.tokens - before.tokens) / static_cast<double>(steps) : 0;
  }
  s->shutdown(std::chrono::milliseconds(0));
  return r;
}

struct LongPrompt {
  Mode mode = Mode::kOff;
  int step_tokens = 0;
  double ttft_ms = 0;
  // The running streams' inter-token gaps while it waited for its first token.
  double gap_p50_ms = 0, gap_p99_ms = 0, max_gap_ms = 0;
};

LongPrompt run_long_prompt(const std::shared_ptr<const spw::Model>& model, int threads, int tokens,
                           const std::string& long_prompt, Mode mode, int step_tokens) {
  Timeline tl;
  std::shared_ptr<spw::StepBatcher> batcher;
  auto s = build(model, 5, threads, mode, &tl, &batcher, step_tokens);
  wait_done({*s->submit(request("Warm up", 4))});
  {
    std::lock_guard<std::mutex> lk(tl.mu);
    tl.tokens.clear();
  }
  std::vector<std::shared_ptr<spw::serve::Ticket>> ts;
  for (int i = 0; i < 4; ++i) ts.push_back(*s->submit(request(kPrompts[i], 2 * tokens)));
  for (;;) {
    bool ready = true;
    for (const auto& t : ts) ready = ready && t->generated() >= 16;
    if (ready) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const int64_t t0 = now_ns();
  auto lp = *s->submit(request(long_prompt, 1));
  wait_done({lp});
  LongPrompt out;
  out.mode = mode;
  out.step_tokens = step_tokens;
  int64_t first = 0;
  {
    std::lock_guard<std::mutex> lk(tl.mu);
    auto it = tl.tokens.find(lp->id());
    if (it != tl.tokens.end() && !it->second.empty()) first = it->second.front();
    const int64_t t1 = first;
    std::vector<double> gaps;
    for (const auto& t : ts) {
      const auto& times = tl.tokens[t->id()];
      for (size_t i = 1; i < times.size(); ++i) {
        if (times[i] < t0 || times[i - 1] > t1) continue;
        gaps.push_back(static_cast<double>(times[i] - times[i - 1]) / 1e6);
      }
    }
    out.gap_p50_ms = percentile(gaps, 0.5);
    out.gap_p99_ms = percentile(gaps, 0.99);
    out.max_gap_ms = percentile(gaps, 1.0);
  }
  out.ttft_ms = static_cast<double>(first - t0) / 1e6;
  wait_done(ts);
  s->shutdown(std::chrono::milliseconds(0));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Continuous batching: aggregate tokens/s and inter-token latency per stream count, batcher on/off"};
  std::string model_path, models_dir = "build/bench-models", json_path;
  std::string prompt_file = std::string(SPILLWAY_SOURCE_DIR) + "/bench/prompt.txt";
  int threads = 2, tokens = 128, reps = 2;
  std::vector<int> stream_counts = {1, 2, 4, 8};
  std::vector<int> step_tokens_list = {16, 32, 64};
  app.add_option("--model", model_path, "GGUF (default: the generated 110M Q8_0 model)");
  app.add_option("--models-dir", models_dir, "Where generated models are kept")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--tokens", tokens, "Generated tokens per stream")->capture_default_str();
  app.add_option("--reps", reps, "Interleaved rounds")->capture_default_str();
  app.add_option("--streams", stream_counts, "Stream counts")->delimiter(',')->capture_default_str();
  app.add_option("--prompt-file", prompt_file, "The long prompt")->capture_default_str();
  app.add_option("--step-tokens", step_tokens_list, "Step sizes for the long prompt mixed into the steps")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--json", json_path, "Write every sample as JSON");
  std::string device = "cpu";
  app.add_option("--device", device, "Placement: cpu, vulkan[:i], hybrid:N[:i]")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto where = spw::Placement::parse(device);
  if (!where.ok()) {
    std::fprintf(stderr, "batching_bench: %s\n", where.status().to_string().c_str());
    return 2;
  }
  g_device = *where;

  if (model_path.empty()) {
    model_path = spw::bench::ensure_110m_q8_0(models_dir, "batching_bench");
    if (model_path.empty()) return 1;
  }
  auto loaded = spw::Model::load(spw::Env::default_env(), model_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "batching_bench: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  std::shared_ptr<const spw::Model> model = std::move(*loaded);
  std::ifstream pf(prompt_file);
  std::stringstream ss;
  ss << pf.rdbuf();
  const std::string long_prompt = ss.str();

  nlohmann::json samples = nlohmann::json::array();
  std::map<std::pair<int, bool>, std::vector<Result>> by;
  // (mode, step tokens; 0 where the mode has no steps to size) -> rounds
  std::map<std::pair<Mode, int>, std::vector<LongPrompt>> longs;
  for (int rep = 0; rep < reps; ++rep) {
    for (int streams : stream_counts) {
      for (bool batching : {rep % 2 == 0, rep % 2 != 0}) {  // ABBA across rounds
        Result r = run_streams(model, streams, threads, tokens, batching);
        by[{streams, batching}].push_back(r);
        samples.push_back({{"case", "streams"}, {"streams", streams}, {"batching", batching}, {"tokens", r.tokens},
                           {"seconds", r.seconds}, {"tps", r.tps}, {"itl_p50_ms", r.itl_p50_ms},
                           {"itl_p99_ms", r.itl_p99_ms}, {"max_batch", r.max_batch}, {"mean_batch", r.mean_batch}});
        std::fprintf(stderr, "streams %d batching %s: %.1f tok/s (%lld tokens), itl p50 %.1f ms p99 %.1f ms, batch %.2f\n",
                     streams, batching ? "on " : "off", r.tps, static_cast<long long>(r.tokens), r.itl_p50_ms,
                     r.itl_p99_ms, r.mean_batch);
      }
    }
    if (!long_prompt.empty()) {
      std::vector<std::pair<Mode, int>> modes = {{Mode::kOff, 0}, {Mode::kBeside, 0}};
      for (int st : step_tokens_list) modes.push_back({Mode::kMixed, st});
      if (rep % 2 != 0) std::reverse(modes.begin(), modes.end());
      for (auto [mode, st] : modes) {
        LongPrompt l = run_long_prompt(model, threads, tokens, long_prompt, mode, st);
        longs[{mode, st}].push_back(l);
        samples.push_back({{"case", "long_prompt"}, {"mode", mode_name(mode)}, {"step_tokens", st},
                           {"ttft_ms", l.ttft_ms}, {"gap_p50_ms", l.gap_p50_ms}, {"gap_p99_ms", l.gap_p99_ms},
                           {"max_gap_ms", l.max_gap_ms}});
        std::fprintf(stderr, "long prompt, %s (step %d): ttft %.0f ms, streams' gaps p50 %.0f p99 %.0f max %.0f ms\n",
                     mode_name(mode), st, l.ttft_ms, l.gap_p50_ms, l.gap_p99_ms, l.max_gap_ms);
      }
    }
  }
  auto median = [](std::vector<double> v) { return percentile(std::move(v), 0.5); };
  std::printf("| streams | batching off: tok/s | batching on: tok/s | on/off | ITL p50 off / on (ms) | ITL p99 off / on (ms) | mean batch |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int streams : stream_counts) {
    auto pick = [&](bool b, auto f) {
      std::vector<double> v;
      for (const Result& r : by[{streams, b}]) v.push_back(f(r));
      return median(v);
    };
    const double off = pick(false, [](const Result& r) { return r.tps; });
    const double on = pick(true, [](const Result& r) { return r.tps; });
    std::printf("| %d | %.1f | %.1f | %.2fx | %.1f / %.1f | %.1f / %.1f | %.2f |\n", streams, off, on, on / off,
                pick(false, [](const Result& r) { return r.itl_p50_ms; }), pick(true, [](const Result& r) { return r.itl_p50_ms; }),
                pick(false, [](const Result& r) { return r.itl_p99_ms; }), pick(true, [](const Result& r) { return r.itl_p99_ms; }),
                pick(true, [](const Result& r) { return r.mean_batch; }));
  }
  if (!longs.empty()) {
    std::printf("\n| long prompt while 4 streams run | ttft ms | streams' gap p50 / p99 / max ms |\n|---|---|---|\n");
  }
  for (const auto& [key, rounds] : longs) {
    const auto [mode, st] = key;
    std::vector<double> ttft, p50, p99, mx;
    for (const LongPrompt& l : rounds) {
      ttft.push_back(l.ttft_ms);
      p50.push_back(l.gap_p50_ms);
      p99.push_back(l.gap_p99_ms);
      mx.push_back(l.max_gap_ms);
    }
    if (!ttft.empty()) {
      const std::string what = mode == Mode::kOff      ? "no batching"
                               : mode == Mode::kBeside ? "batching, prompt beside the steps"
                                                       : "batching, prompt mixed into steps of " + std::to_string(st) +
                                                             " tokens";
      std::printf("| %s | %.0f | %.0f / %.0f / %.0f |\n", what.c_str(), median(ttft), median(p50), median(p99),
                  median(mx));
    }
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << samples.dump(1) << "\n";
  }
  return 0;
}
