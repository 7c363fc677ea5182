// engine_bench: prefill and decode speed of the CPU engine.
//
//   spw_engine_bench [--model PATH | --gen EMBD,LAYERS,HEADS,FF,TYPE[,tied]]
//                    [--threads N] [--prompt N] [--gen-tokens N] [--ubatch N]
// Prints tokens/s and effective weight bandwidth (weight bytes per token over
// the measured time per token). Not a test; a measuring tool.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/env.h"
#include "engine/session.h"
#include "tools/modelgen/random_llama.h"

using namespace spw;

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  std::string model_path, gen;
  int threads = 1, n_prompt = 128, n_gen = 64, ubatch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") model_path = argv[i + 1];
    else if (a == "--gen") gen = argv[i + 1];
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--prompt") n_prompt = std::atoi(argv[i + 1]);
    else if (a == "--gen-tokens") n_gen = std::atoi(argv[i + 1]);
    else if (a == "--ubatch") ubatch = std::atoi(argv[i + 1]);
  }
  Env& env = Env::default_env();
  if (!gen.empty()) {
    modelgen::RandomLlamaSpec spec;
    char type[16] = {0}, tied[8] = {0};
    if (std::sscanf(gen.c_str(), "%u,%u,%u,%u,%15[^,],%7s", &spec.n_embd, &spec.n_layer, &spec.n_head, &spec.n_ff,
                    type, tied) < 5) {
      std::fprintf(stderr, "bad --gen\n");
      return 2;
    }
    spec.n_head_kv = spec.n_head;
    spec.n_ctx = 1024;
    spec.type = std::strcmp(type, "Q8_0") == 0 ? gguf::GgmlType::kQ8_0
                : std::strcmp(type, "F16") == 0 ? gguf::GgmlType::kF16
                                                : gguf::GgmlType::kF32;
    spec.tied_output = std::strcmp(tied, "tied") == 0;
    spec.vocab_path = std::string(SPILLWAY_SOURCE_DIR) + "/tests/data/ggml-vocab-llama-spm.gguf";
    model_path = "/tmp/spw_bench_" + gen + ".gguf";
    if (!env.file_exists(model_path)) {
      Status st = modelgen::write_random_llama(env, model_path, spec);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        return 1;
      }
    }
  }
  auto m = Model::load(env, model_path);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
    return 1;
  }
  const Model& model = **m;
  const auto& hp = model.hparams();
  KvPoolOptions ko;
  ko.layer_end = hp.n_layer;
  ko.n_embd_kv = hp.n_embd_kv();
  ko.block_tokens = 16;
  ko.n_blocks = (n_prompt + n_gen) / 16 + 2;
  auto pool = KvPool::create(ko);
  auto cpu = std::make_shared<CpuBackend>(threads);
  SessionOptions so;
  so.n_ubatch = ubatch;
  so.n_ctx = n_prompt + n_gen + 1;
  auto s = Session::create(*m, cpu, *pool, so);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
    return 1;
  }
  std::vector<TokenId> prompt(static_cast<size_t>(n_prompt));
  for (int i = 0; i < n_prompt; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % hp.n_vocab;
  // Warm the mapping (page cache) so the first measured pass is not I/O.
  {
    auto w = (*s)->eval(std::span<const TokenId>(prompt).first(1));
    (void)(*s)->truncate(0);
  }
  double t0 = now_s();
  auto r = (*s)->eval(prompt);
  double t1 = now_s();
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
    return 1;
  }
  TokenId next = 0;
  double t2 = now_s();
  for (int i = 0; i < n_gen; ++i) {
    auto lg = (*s)->last_logits();
    next = static_cast<TokenId>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    auto e = (*s)->eval(std::span<const TokenId>(&next, 1));
    if (!e.ok()) {
      std::fprintf(stderr, "%s\n", e.status().to_string().c_str());
      return 1;
    }
  }
  double t3 = now_s();
  const double bpt = static_cast<double>(model.weight_bytes_per_token());
  const double dec_tps = n_gen / (t3 - t2);
  std::printf("model=%s params=%.1fM weight_bytes/token=%.1fMB threads=%d | prefill %d tok: %.1f tok/s | "
              "decode %d tok: %.1f tok/s, %.2f ms/tok, effective %.2f GB/s\n",
              model_path.c_str(), model.n_params() / 1e6, bpt / 1e6, threads, n_prompt, n_prompt / (t1 - t0),
              n_gen, dec_tps, 1e3 / dec_tps, bpt * dec_tps / 1e9);
  return 0;
}
