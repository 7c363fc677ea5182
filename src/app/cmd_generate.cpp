// `spillway generate`: one generation on the CPU engine, streaming text to
// stdout, or with --json the token ids, text and timings.
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.h"
#include "backend/vulkan/device_spec.h"
#include "core/env.h"
#include "core/placement.h"
#include "device/host_memory.h"
#include "engine/device_session.h"
#include "engine/generate.h"
#include "model/model.h"

namespace spw::app {
namespace {

struct GenerateCliOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int32_t n_predict = 128;
  int threads = 1;
  int32_t ctx = 0;
  int32_t ubatch = 64;
  int32_t kv_block = 16;
  std::string kv_type = "f16";
  bool no_bos = false;
  bool ignore_eos = false;
  bool json = false;
  std::string device = "cpu";
  std::string device_memory;
  std::vector<std::string> stop;
  SamplerParams sampler;
  bool seed_given = false;
};


double per_second(int64_t count, int64_t ns) { return ns > 0 ? count * 1e9 / static_cast<double>(ns) : 0.0; }

int fail(const Status& s) {
  std::fprintf(stderr, "spillway generate: %s\n", s.to_string().c_str());
  return 1;
}

int run_generate(GenerateCliOptions o) {
  Env& env = Env::default_env();
  if (!o.prompt_file.empty()) {
    auto text = env.read_file(o.prompt_file);
    if (!text.ok()) return fail(text.status());
    o.prompt = *text;
  }
  if (!o.seed_given) o.sampler.seed = env.random_u64();
  if (Status s = validate_sampler_params(o.sampler); !s.ok()) return fail(s);

  const int64_t t_load0 = env.now_ns();
  auto model = Model::load(env, o.model);
  if (!model.ok()) return fail(model.status());
  const int64_t load_ns = env.now_ns() - t_load0;
  const Model& m = **model;

  DeviceSessionOptions dso;
  {
    auto placement = Placement::parse(o.device);
    if (!placement.ok()) return fail(placement.status().with_context("--device"));
    dso.device = *placement;
  }
  // What runs, by the name serve's responses and journal use.
  const std::string placement_name = dso.device.resolved(m.hparams().n_layer).name();
  if (!o.device_memory.empty()) {
    auto bytes = parse_memory_size(o.device_memory);
    if (!bytes.ok()) return fail(bytes.status());
    dso.device_memory_bytes = *bytes;
  }
  dso.n_threads = o.threads;
  dso.n_ctx = o.ctx;
  dso.n_ubatch = o.ubatch;
  dso.kv_block_tokens = o.kv_block;
  {
    auto kvt = parse_kv_type(o.kv_type);
    if (!kvt.ok()) return fail(kvt.status().with_context("--kv-type"));
    dso.kv_type = *kvt;
  }
  auto placed = open_device_session(*model, dso);
  if (!placed.ok()) {
    Status s = placed.status();
    if (dso.device.on_gpu()) {
      s = s.with_context("cannot use --device " + o.device + " (use --device cpu, or see `spillway devices`)");
    }
    return fail(s);
  }
  DeviceSession& ds = *placed;
  Session* session = ds.session.get();

  const Tokenizer& tok = m.tokenizer();
  std::vector<TokenId> prompt = tok.encode(o.prompt, !o.no_bos && tok.add_bos_default());
  if (prompt.empty()) return fail(Status::invalid_argument("prompt is empty (give --prompt TEXT or --no-bos off)"));

  GenerateOptions go;
  go.max_tokens = o.n_predict;
  go.sampler = o.sampler;
  go.stop = o.stop;
  go.ignore_eos = o.ignore_eos;

  TokenCallback print_text;
  if (!o.json) {
    std::fputs(o.prompt.c_str(), stdout);
    std::fflush(stdout);
    print_text = [](std::string_view text, TokenId, std::span<const TokenLogprobs>) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      return true;
    };
  }
  // The device's work per phase (--json, Vulkan and hybrid): the first
  // token's callback comes right after the prefill, and every later token's
  // evaluation is a decode step.
  VulkanWorkCounts work_start, work_prefill, work_end;
  bool prefilled = false;
  if (ds.vulkan) work_start = ds.vulkan->work_counts();
  if (o.json && ds.vulkan) {
    print_text = [&](std::string_view, TokenId, std::span<const TokenLogprobs>) {
      if (!prefilled) work_prefill = ds.vulkan->work_counts();
      prefilled = true;
      return true;
    };
  }
  auto result = generate(*session, prompt, go, print_text);
  if (ds.vulkan) work_end = ds.vulkan->work_counts();
  if (!result.ok()) return fail(result.status());
  const GenerateResult& r = *result;

  if (!o.json) {
    // The short name, then what was built when it says more.
    const std::string where =
        ds.placement == placement_name ? placement_name : placement_name + " [" + ds.placement + "]";
    std::printf("\n");
    const std::string finish(finish_reason_name(r.finish_reason));
    std::fprintf(stderr,
                 "spillway: on %s: %zu prompt tokens %.1f tok/s, %zu generated %.1f tok/s, finish=%s, load %.1f ms\n",
                 where.c_str(), r.prompt_tokens.size(),
                 per_second(static_cast<int64_t>(r.prompt_tokens.size()), r.prefill_ns), r.tokens.size(),
                 per_second(static_cast<int64_t>(r.tokens.size()), r.decode_ns), finish.c_str(), load_ns / 1e6);
    return 0;
  }

  const auto peak_rss = device::HostMemoryProbe(env).read().process_peak_rss_bytes;
  nlohmann::json j;
  j["model"] = o.model;
  j["prompt"] = o.prompt;
  j["prompt_tokens"] = r.prompt_tokens;
  j["tokens"] = r.tokens;
  j["text"] = r.text;
  j["finish_reason"] = finish_reason_name(r.finish_reason);
  j["seed"] = o.sampler.seed;
  j["threads"] = o.threads;
  j["device"] = dso.device.spec();     // the --device given, canonical
  j["placement"] = placement_name;     // what ran: "cpu", "vulkan", "hybrid:N"
  j["placement_detail"] = ds.placement;  // e.g. "hybrid: layers 0-2 vulkan (llvmpipe), 3-4 cpu"
  if (ds.vulkan) {
    // Every device byte went through the backend's allocator: report its books.
    const DeviceMemoryStats st = ds.vulkan->memory_stats();
    nlohmann::json used = nlohmann::json::object(), peak = nlohmann::json::object();
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const char* name = memory_category_name(static_cast<MemoryCategory>(c));
      used[name] = st.used_by_category[static_cast<size_t>(c)];
      peak[name] = st.peak_by_category[static_cast<size_t>(c)];
    }
    j["device_memory"] = {{"budget_bytes", st.budget_bytes}, {"used_bytes", st.used_bytes},
                          {"peak_bytes", st.peak_bytes},     {"used_by_category", used},
                          {"peak_by_category", peak},        {"budget_rejections", st.n_budget_rejections}};
  }
  if (ds.vulkan && prefilled) {
    // Queue submissions (each a host round trip) and compute dispatches.
    const VulkanWorkCounts pre = work_prefill - work_start, dec = work_end - work_prefill;
    const double steps = static_cast<double>(r.tokens.size() > 1 ? r.tokens.size() - 1 : 0);
    nlohmann::json per_step = nullptr;
    if (steps > 0) {
      per_step = {{"submissions", static_cast<double>(dec.submissions) / steps},
                  {"dispatches", static_cast<double>(dec.dispatches) / steps}};
    }
    j["device_work"] = {{"prefill", {{"submissions", pre.submissions}, {"dispatches", pre.dispatches}}},
                        {"decode_per_step", per_step}};
  }
  j["n_params"] = m.n_params();
  j["weight_bytes_per_token"] = m.weight_bytes_per_token();
  j["timings"] = {
      {"load_ms", load_ns / 1e6},
      {"prefill_ms", r.prefill_ns / 1e6},
      {"decode_ms", r.decode_ns / 1e6},
      {"prefill_tokens_per_s", per_second(static_cast<int64_t>(r.prompt_tokens.size()), r.prefill_ns)},
      // The first generated token's logits come from prefill; decode time covers
      // the evaluation of every generated token after it.
      {"decode_tokens_per_s", per_second(static_cast<int64_t>(r.tokens.size()), r.decode_ns)},
      // The host probe's figure (VmHWM, else getrusage): null when unknown.
      {"peak_rss_bytes", peak_rss.known() ? nlohmann::json(peak_rss.value()) : nlohmann::json(nullptr)},
  };
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GenerateCliOptions>();
  CLI::App* sub = app.add_subcommand("generate", "Generate text from a prompt on the CPU engine");
  sub->add_option("--model,-m", o->model, "GGUF model file")->required();
  auto* p = sub->add_option("--prompt,-p", o->prompt, "Prompt text");
  auto* f = sub->add_option("--file,-f", o->prompt_file, "Read the prompt from a file");
  p->excludes(f);
  sub->add_option("-n,--n-predict", o->n_predict, "Maximum tokens to generate")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--threads,-t", o->threads, "CPU threads")->check(CLI::Range(1, 256));
  sub->add_option("--device,-d", o->device, "cpu | vulkan[:INDEX|:NAME] | hybrid:N[:INDEX] (first N layers on Vulkan), the device ones "
                  "optionally +cpu-experts (a mixture of experts' experts on the CPU) or +cpu-experts:K (those of "
                  "layers 0..K-1)");
  sub->add_option("--device-memory", o->device_memory, "Vulkan memory budget, e.g. 512MiB (default: the device heap)");
  sub->add_option("--ctx,-c", o->ctx, "Context size (default: the model's)")->check(CLI::Range(0, 1 << 20));
  sub->add_option("--ubatch", o->ubatch, "Prefill batch size")->check(CLI::Range(1, 4096));
  sub->add_option("--kv-block", o->kv_block, "KV cache block size in tokens")->check(CLI::Range(1, 1024));
  sub->add_option("--kv-type", o->kv_type, "KV cache element type: f16, f32 or q8_0 (CPU only)")->capture_default_str();
  sub->add_option("--temp", o->sampler.temperature, "Temperature (0 = greedy)");
  sub->add_option("--top-k", o->sampler.top_k, "Top-k (0 = off)");
  sub->add_option("--top-p", o->sampler.top_p, "Top-p (1 = off)");
  sub->add_option("--min-p", o->sampler.min_p, "Min-p (0 = off)");
  sub->add_option("--repeat-penalty", o->sampler.repeat_penalty, "Repetition penalty (1 = off)");
  sub->add_option("--repeat-last-n", o->sampler.repeat_last_n, "Tokens the repetition penalty looks back");
  sub->add_option("--seed", o->sampler.seed, "Sampling seed (default: random, printed with --json)")
      ->each([o](const std::string&) { o->seed_given = true; });
  sub->add_option("--stop", o->stop, "Stop string (repeatable); not included in the output");
  sub->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-sequence (benchmarks)");
  sub->add_flag("--json", o->json, "Print token ids, text and timings as JSON");
  sub->callback([o, &exit_code] { exit_code = run_generate(*o); });
}

}  // namespace spw::app
