// checkpoint_bench: what journaled generation checkpoints cost a real
// generation, as `spillway serve --checkpoint-every N` writes them.
//
// For each model, one engine scheduler per checkpoint interval (default
// 0 = none, 32, 8, 1; serve::make_engine_scheduler on the CPU, --threads
// threads, one worker), each with a serve::JournalObserver over one real
// journal::Journal file (WAL, synchronous=FULL: every checkpoint is one
// commit that reaches the disk before the worker goes on) in a fresh folder
// under --dir (default: the temporary directory, TMPDIR else /tmp). Every
// request is journaled (accept(), then the observer's mark_running,
// checkpoints and finish), so the variants differ only in their checkpoints.
// Each request is greedy on --prompt for --tokens generated tokens; the
// default prompt runs to max_tokens on both default models (no EOS), which
// the bench checks (completion_tokens == --tokens, else the sample is marked
// and the exit status is 1). Rounds interleave the variants (one request of
// each per round, the order rotated every round: ABCD, BCDA, ...) so that a
// drift in the machine's load hits all of them alike; one unjournaled warm-up
// request per scheduler comes first.
// Measured per request: decode tokens/s between the first and the last
// generated token (the scheduler's after_token hook, on the worker: the
// checkpoints written in between are inside that window; there are
// (tokens - 1) / every of them, none after the last token), the request's wall
// time from submit to its final event, the checkpoints written (the observer
// counts them) and the wall time of each save_checkpoint. Reported per
// variant: medians, the ratio of the median decode rate to the no-checkpoint
// variant's, the median of the per-round paired ratios, and the time the
// worker spent in save_checkpoint per request and its share of the request's
// wall time (the direct cost: the worker waits for each commit; it stays
// readable where the machine's noise swamps the tokens/s ratio), and the
// median gap from a token to the next where a checkpoint was written in
// between, against the other gaps (what one checkpoint adds to the stream).
// The fsync behind each commit costs what the disk makes it, and it varies
// with whatever else writes to that disk (on a shared virtual disk, several-
// fold from one minute to the next): compare variants of one run only.
//
// Models: --model PATH (repeatable), or by default the bundled
// models/stories260K.gguf (260K parameters: a token costs ~0.3 ms here, the
// worst case for a fixed per-checkpoint cost) and the generated 110M-shape
// Q8_0 model recovery_bench uses (same spec and file, kept in --models-dir).
//
// Output: a table on stdout; --json FILE writes the configuration, every
// sample and the summary.
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "journal/journal.h"
#include "model/model.h"
#include "serve/engine_executor.h"
#include "serve/journal_observer.h"
#include "bench_models.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The JournalObserver, plus a count and the wall time of every checkpoint it
// writes (one request runs at a time per scheduler, so plain reset/read
// between requests is enough; the atomics order the worker's writes).
class CountingObserver final : public spw::serve::RequestObserver {
 public:
  explicit CountingObserver(std::shared_ptr<spw::journal::Journal> j) : inner_(std::move(j)) {}
  void on_start(const spw::serve::Ticket& t, const std::string& placement) override { inner_.on_start(t, placement); }
  void on_finish(const spw::serve::Ticket& t, const spw::serve::RequestEvent& fin, const std::string& text) override {
    inner_.on_finish(t, fin, text);
  }
  void on_checkpoint(const spw::serve::Ticket& t, const spw::Checkpoint& cp) override {
    const auto t0 = Clock::now();
    inner_.on_checkpoint(t, cp);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    save_us_.push_back(us);
    last_bytes_ = spw::serialize_checkpoint(cp).size();  // outside the timed part
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    save_us_.clear();
    last_bytes_ = 0;
  }
  std::vector<double> save_us() const {
    std::lock_guard<std::mutex> lock(mu_);
    return save_us_;
  }
  size_t last_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_bytes_;
  }
  uint64_t write_errors() const { return inner_.write_errors(); }

 private:
  spw::serve::JournalObserver inner_;
  mutable std::mutex mu_;
  std::vector<double> save_us_;
  size_t last_bytes_ = 0;
};

// Generated-token times of the running request, from the hook (written by
// the worker; read after the request's final event, which the ticket's
// channel orders after them).
struct TokenTimes {
  std::atomic<int64_t> first_ns{0}, last_ns{0};
  std::atomic<int32_t> n{0};
  std::vector<int64_t> at_ns;  // [n] = when token n came (1-based)
  void reset(int tokens) {
    first_ns = 0;
    last_ns = 0;
    n = 0;
    at_ns.assign(static_cast<size_t>(tokens) + 2, 0);
  }
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Variant {
  int every = 0;
  std::unique_ptr<spw::serve::Scheduler> scheduler;
  std::shared_ptr<CountingObserver> observer;
  std::shared_ptr<TokenTimes> times;
};

struct Sample {
  std::string model;
  int every = 0;
  int round = 0;
  int order = 0;  // position in its round
  int32_t completion_tokens = 0;
  std::string finish;
  double decode_tps = 0;
  double wall_ms = 0;
  int checkpoints = 0;
  double save_us_median = -1, save_us_max = -1, save_ms_total = 0;
  // Median gap from token k to k+1 where a checkpoint was written after
  // token k, and over the other tokens: what one checkpoint adds to the
  // token timeline.
  double ckpt_gap_ms = -1, plain_gap_ms = -1;
  size_t checkpoint_bytes = 0;  // the last one written
  bool ok = false;
  std::string error;
};

struct Outcome {
  spw::serve::RequestEvent fin;
  double wall_ms = -1;
  std::string error;
};

Outcome run_request(spw::serve::Scheduler& s, const spw::serve::GenerationRequest& g) {
  Outcome out;
  const auto t0 = Clock::now();
  auto t = s.submit(g);
  if (!t.ok()) {
    out.error = t.status().to_string();
    return out;
  }
  spw::serve::RequestEvent ev;
  const auto deadline = t0 + std::chrono::minutes(10);
  while (Clock::now() < deadline) {
    const auto pr = (*t)->next_event(ev, std::chrono::milliseconds(100));
    if (pr == spw::serve::PopResult::kClosed) break;
    if (pr != spw::serve::PopResult::kItem || ev.kind != spw::serve::RequestEvent::Kind::kFinished) continue;
    out.wall_ms = ms_between(t0, Clock::now());
    out.fin = ev;
    if (ev.state != spw::serve::RequestState::kDone) out.error = ev.status.to_string();
    return out;
  }
  out.error = "no final event";
  return out;
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

std::string fs_type(const fs::path& p) {
  struct statfs st {};
  if (::statfs(p.c_str(), &st) != 0) return "unknown";
  switch (static_cast<unsigned long>(st.f_type)) {
    case 0xEF53: return "ext2/3/4";
    case 0x01021994: return "tmpfs";
    case 0x794c7630: return "overlayfs";
    case 0x9123683E: return "btrfs";
    case 0x58465342: return "xfs";
    default: {
      std::ostringstream o;
      o << "0x" << std::hex << st.f_type;
      return o.str();
    }
  }
}

std::string generated_model(const std::string& models_dir) {
  return spw::bench::ensure_110m_q8_0(models_dir, "checkpoint_bench");  // recovery_bench's file and spec
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of journaled generation checkpoints (--checkpoint-every) on real CPU generation"};
  std::vector<std::string> models;
  std::string models_dir = "build/bench-models", dir, json_path, prompt = "Once upon a time";
  std::vector<int> everys = {0, 32, 8, 1};
  int tokens = 256, threads = 2, ctx = 512, reps_small = 20, reps_large = 8;
  app.add_option("--model", models, "GGUF to run (repeatable; default: stories260K and a generated 110M Q8_0)");
  app.add_option("--models-dir", models_dir, "Where the generated model is kept")->capture_default_str();
  app.add_option("--dir", dir, "Folder for the journal file (default: the temporary directory)");
  app.add_option("--every", everys, "Checkpoint intervals to compare (0: none; the first is the baseline)")
      ->capture_default_str();
  app.add_option("--tokens", tokens, "Generated tokens per request")->capture_default_str();
  app.add_option("--prompt", prompt, "Prompt (must not reach EOS before --tokens)")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads")->capture_default_str();
  app.add_option("--ctx", ctx, "Context per request")->capture_default_str();
  app.add_option("--reps-small", reps_small, "Rounds for models under 10M parameters")->capture_default_str();
  app.add_option("--reps-large", reps_large, "Rounds for the others")->capture_default_str();
  app.add_option("--json", json_path, "Write the configuration, every sample and the summary as JSON");
  CLI11_PARSE(app, argc, argv);
  if (everys.empty() || tokens < 2) {
    std::fprintf(stderr, "checkpoint_bench: need at least one --every and --tokens >= 2\n");
    return 2;
  }

  if (models.empty()) {
    models.push_back(std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf");
    const std::string gen = generated_model(models_dir);
    if (gen.empty()) return 1;
    models.push_back(gen);
  }
  const fs::path base = dir.empty() ? fs::temp_directory_path() : fs::path(dir);
  const fs::path jdir = base / ("spw-checkpoint-bench-" + std::to_string(::getpid()));
  fs::remove_all(jdir);
  fs::create_directories(jdir);
  const std::string journal_path = (jdir / "journal.sqlite").string();
  spw::Env& env = spw::Env::default_env();
  auto jr = spw::journal::Journal::open(env, journal_path);
  if (!jr.ok()) {
    std::fprintf(stderr, "checkpoint_bench: journal %s: %s\n", journal_path.c_str(), jr.status().to_string().c_str());
    return 1;
  }
  std::shared_ptr<spw::journal::Journal> journal = std::move(*jr);
  std::printf("journal %s (%s), %d generated tokens per request, %d threads, prompt \"%s\"\n", journal_path.c_str(),
              fs_type(jdir).c_str(), tokens, threads, prompt.c_str());

  struct Summary {
    std::string model;
    double params_m = 0;
    int every = 0, runs = 0, ok = 0;
    double tps = 0, ratio = 0, paired_ratio = 0, wall_ms = 0, ckpts = 0, save_us = 0, bytes = 0;
    double save_ms_total = 0, save_share = 0;  // time in save_checkpoint per request, and its share of the request
    double ckpt_gap_ms = -1, plain_gap_ms = -1;  // token gaps with / without a checkpoint (medians of medians)
    double added_ms_per_ckpt = 0;  // (wall - baseline wall) / checkpoints
  };
  std::vector<Sample> samples;
  std::vector<Summary> summary;
  bool all_ok = true;

  for (const std::string& model_path : models) {
    auto m = spw::Model::load(env, model_path);
    if (!m.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s: %s\n", model_path.c_str(), m.status().to_string().c_str());
      return 1;
    }
    std::shared_ptr<const spw::Model> model = *m;
    const double params_m = static_cast<double>(model->n_params()) / 1e6;
    const std::string name = fs::path(model_path).filename().string();
    const int reps = params_m < 10 ? reps_small : reps_large;
    std::printf("\nmodel %s (%.1f M parameters, %.1f MiB), %d rounds\n", name.c_str(), params_m,
                static_cast<double>(fs::file_size(model_path)) / (1024.0 * 1024.0), reps);
    std::fflush(stdout);

    std::vector<Variant> variants;
    for (int every : everys) {
      Variant v;
      v.every = every;
      v.observer = std::make_shared<CountingObserver>(journal);
      v.times = std::make_shared<TokenTimes>();
      spw::serve::EngineServeOptions o;
      o.n_threads = threads;
      o.n_ctx = ctx;
      o.observer = v.observer;
      o.checkpoint_every = every;
      o.path_name = "cpu";
      o.hooks.after_token = [times = v.times](uint64_t, int32_t n) {
        const int64_t t = now_ns();
        if (n == 1) times->first_ns.store(t);
        times->last_ns.store(t);
        times->n.store(n);
        if (n >= 0 && static_cast<size_t>(n) < times->at_ns.size()) times->at_ns[static_cast<size_t>(n)] = t;
      };
      auto s = spw::serve::make_engine_scheduler(env, model, o);
      if (!s.ok()) {
        std::fprintf(stderr, "checkpoint_bench: scheduler: %s\n", s.status().to_string().c_str());
        return 1;
      }
      v.scheduler = std::move(s->scheduler);
      // Warm-up, not journaled: pages, KV, caches.
      spw::serve::GenerationRequest w;
      w.prompt = prompt;
      w.sampler.temperature = 0;
      w.max_tokens = 16;
      v.times->reset(16);
      const Outcome wo = run_request(*v.scheduler, w);
      if (!wo.error.empty()) {
        std::fprintf(stderr, "checkpoint_bench: warm-up: %s\n", wo.error.c_str());
        return 1;
      }
      variants.push_back(std::move(v));
    }

    const size_t first_sample = samples.size();
    for (int round = 0; round < reps; ++round) {
      for (size_t i = 0; i < variants.size(); ++i) {
        Variant& v = variants[(i + static_cast<size_t>(round)) % variants.size()];
        Sample s;
        s.model = name;
        s.every = v.every;
        s.round = round;
        s.order = static_cast<int>(i);
        const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}};
        auto a = journal->accept({"", "/v1/completions", body.dump(), ""});
        if (!a.ok()) {
          std::fprintf(stderr, "checkpoint_bench: accept: %s\n", a.status().to_string().c_str());
          return 1;
        }
        spw::serve::GenerationRequest g;
        g.prompt = prompt;
        g.sampler.temperature = 0;
        g.max_tokens = tokens;
        g.record_id = a->record.id;
        v.observer->reset();
        v.times->reset(tokens);
        const uint64_t errors_before = v.observer->write_errors();
        const Outcome o = run_request(*v.scheduler, g);
        s.wall_ms = o.wall_ms;
        s.completion_tokens = o.fin.completion_tokens;
        s.finish = std::string(spw::finish_reason_name(o.fin.finish));
        const int32_t n = v.times->n.load();
        const double span_s = static_cast<double>(v.times->last_ns.load() - v.times->first_ns.load()) / 1e9;
        s.decode_tps = n > 1 && span_s > 0 ? (n - 1) / span_s : 0;
        {
          std::vector<double> ck, plain;
          for (int32_t k = 1; k < n; ++k) {
            const int64_t a = v.times->at_ns[static_cast<size_t>(k)], b = v.times->at_ns[static_cast<size_t>(k) + 1];
            if (a == 0 || b == 0) continue;
            (v.every > 0 && k % v.every == 0 ? ck : plain).push_back(static_cast<double>(b - a) / 1e6);
          }
          s.ckpt_gap_ms = median(ck);
          s.plain_gap_ms = median(plain);
        }
        const std::vector<double> saves = v.observer->save_us();
        s.checkpoints = static_cast<int>(saves.size());
        s.checkpoint_bytes = v.observer->last_bytes();
        if (!saves.empty()) {
          s.save_us_median = median(saves);
          s.save_us_max = *std::max_element(saves.begin(), saves.end());
          for (double us : saves) s.save_ms_total += us / 1000.0;
        }
        // Every `every` tokens while the generation goes on: none after the
        // last token (a finished generation has nothing to continue).
        const int expected_ckpts = v.every > 0 ? (tokens - 1) / v.every : 0;
        s.error = o.error;
        if (s.error.empty() && s.completion_tokens != tokens) {
          s.error = "generated " + std::to_string(s.completion_tokens) + " of " + std::to_string(tokens) +
                    " tokens (finish " + s.finish + "): pick a prompt that does not reach EOS";
        } else if (s.error.empty() && s.checkpoints != expected_ckpts) {
          s.error = "wrote " + std::to_string(s.checkpoints) + " checkpoints, expected " +
                    std::to_string(expected_ckpts);
        } else if (s.error.empty() && v.observer->write_errors() != errors_before) {
          s.error = "journal write errors";
        }
        // The row must be done, its checkpoint cleared (kDone clears it).
        if (s.error.empty()) {
          auto rec = journal->get(g.record_id);
          if (!rec.ok() || rec->state != spw::journal::RequestState::kDone || !rec->checkpoint.empty()) {
            s.error = "journal row not done / checkpoint kept";
          }
        }
        s.ok = s.error.empty();
        if (!s.ok) {
          all_ok = false;
          std::fprintf(stderr, "checkpoint_bench: %s every %d round %d: %s\n", name.c_str(), v.every, round,
                       s.error.c_str());
        }
        samples.push_back(s);
      }
    }

    // Summary per variant; paired ratios against the first variant per round.
    std::vector<double> base_tps_by_round(static_cast<size_t>(reps), -1), base_wall_by_round(static_cast<size_t>(reps), -1);
    for (size_t k = first_sample; k < samples.size(); ++k) {
      const Sample& s = samples[k];
      if (s.every == everys.front() && s.ok) {
        base_tps_by_round[static_cast<size_t>(s.round)] = s.decode_tps;
        base_wall_by_round[static_cast<size_t>(s.round)] = s.wall_ms;
      }
    }
    double base_tps = -1, base_wall = -1;
    for (const Variant& v : variants) {
      Summary sm;
      sm.model = name;
      sm.params_m = params_m;
      sm.every = v.every;
      std::vector<double> tps, wall, ckpts, save, bytes, paired, save_total, share, ckgap, plgap;
      for (size_t k = first_sample; k < samples.size(); ++k) {
        const Sample& s = samples[k];
        if (s.every != v.every) continue;
        ++sm.runs;
        if (!s.ok) continue;
        ++sm.ok;
        tps.push_back(s.decode_tps);
        wall.push_back(s.wall_ms);
        ckpts.push_back(s.checkpoints);
        if (s.save_us_median >= 0) save.push_back(s.save_us_median);
        bytes.push_back(static_cast<double>(s.checkpoint_bytes));
        save_total.push_back(s.save_ms_total);
        if (s.ckpt_gap_ms >= 0) ckgap.push_back(s.ckpt_gap_ms);
        if (s.plain_gap_ms >= 0) plgap.push_back(s.plain_gap_ms);
        if (s.wall_ms > 0) share.push_back(s.save_ms_total / s.wall_ms);
        const double b = base_tps_by_round[static_cast<size_t>(s.round)];
        if (b > 0) paired.push_back(s.decode_tps / b);
      }
      sm.tps = median(tps);
      sm.wall_ms = median(wall);
      sm.ckpts = median(ckpts);
      sm.save_us = median(save);
      sm.bytes = median(bytes);
      sm.paired_ratio = median(paired);
      sm.save_ms_total = median(save_total);
      sm.save_share = median(share);
      sm.ckpt_gap_ms = median(ckgap);
      sm.plain_gap_ms = median(plgap);
      if (base_tps < 0) {
        base_tps = sm.tps;
        base_wall = sm.wall_ms;
      }
      sm.ratio = base_tps > 0 ? sm.tps / base_tps : -1;
      sm.added_ms_per_ckpt = sm.ckpts > 0 ? (sm.wall_ms - base_wall) / sm.ckpts : 0;
      summary.push_back(sm);
    }
    for (Variant& v : variants) v.scheduler->shutdown(std::chrono::milliseconds(0));
  }

  std::printf("\n| model | checkpoint every | runs ok | checkpoints / request | checkpoint bytes (last) | decode tok/s (median) "
              "| vs every 0 (medians) | paired ratio (median) | request ms (median) | save_checkpoint us (median) "
              "| ms in saves / request (median) | share of request time | token gap ms: after a checkpoint / others |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Summary& s : summary) {
    std::printf("| %s | %s | %d/%d | %.0f | %s | %.1f | %.3f | %.3f | %.1f | %s | %s | %s | %s / %s |\n", s.model.c_str(),
                s.every == 0 ? "0 (none)" : std::to_string(s.every).c_str(), s.ok, s.runs, s.ckpts,
                s.bytes > 0 ? fmt("%.0f", s.bytes).c_str() : "-", s.tps, s.ratio, s.paired_ratio, s.wall_ms,
                s.save_us > 0 ? fmt("%.0f", s.save_us).c_str() : "-",
                s.ckpts > 0 ? fmt("%.1f", s.save_ms_total).c_str() : "-",
                s.ckpts > 0 ? fmt("%.1f%%", 100.0 * s.save_share).c_str() : "-",
                s.ckpt_gap_ms >= 0 ? fmt("%.3f", s.ckpt_gap_ms).c_str() : "-",
                s.plain_gap_ms >= 0 ? fmt("%.3f", s.plain_gap_ms).c_str() : "-");
  }

  if (!json_path.empty()) {
    nlohmann::json j;
    j["config"] = {{"journal", journal_path}, {"filesystem", fs_type(jdir)}, {"tokens", tokens},
                   {"threads", threads}, {"ctx", ctx}, {"prompt", prompt}, {"every", everys}, {"models", models}};
    j["samples"] = nlohmann::json::array();
    for (const Sample& s : samples) {
      j["samples"].push_back({{"model", s.model}, {"every", s.every}, {"round", s.round}, {"order", s.order},
                              {"ok", s.ok}, {"completion_tokens", s.completion_tokens}, {"finish", s.finish},
                              {"decode_tps", s.decode_tps}, {"wall_ms", s.wall_ms}, {"checkpoints", s.checkpoints},
                              {"checkpoint_bytes", s.checkpoint_bytes}, {"save_us_median", s.save_us_median},
                              {"save_us_max", s.save_us_max}, {"save_ms_total", s.save_ms_total},
                              {"ckpt_gap_ms", s.ckpt_gap_ms}, {"plain_gap_ms", s.plain_gap_ms},
                              {"error", s.error}});
    }
    j["summary"] = nlohmann::json::array();
    for (const Summary& s : summary) {
      j["summary"].push_back({{"model", s.model}, {"params_m", s.params_m}, {"every", s.every}, {"runs", s.runs},
                              {"ok", s.ok}, {"decode_tps_median", s.tps}, {"ratio_of_medians", s.ratio},
                              {"paired_ratio_median", s.paired_ratio}, {"wall_ms_median", s.wall_ms},
                              {"checkpoints_median", s.ckpts}, {"save_us_median", s.save_us},
                              {"checkpoint_bytes_median", s.bytes}, {"added_ms_per_checkpoint", s.added_ms_per_ckpt},
                              {"save_ms_per_request_median", s.save_ms_total}, {"save_share_median", s.save_share},
                              {"ckpt_gap_ms", s.ckpt_gap_ms}, {"plain_gap_ms", s.plain_gap_ms}});
    }
    std::ofstream(json_path) << j.dump(1) << "\n";
  }
  journal.reset();
  std::error_code ec;
  fs::remove_all(jdir, ec);
  return all_ok ? 0 : 1;
}
