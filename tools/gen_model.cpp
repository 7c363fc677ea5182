// spillway-gen-model: writes a random Llama GGUF (see tools/modelgen/random_llama.h),
// or with --echo-period an echo model (tools/modelgen/echo_llama.h) whose greedy
// continuation replays the prompt's last L tokens cyclically.
//
//   spillway-gen-model --out m.gguf --preset 110m --type q8_0 --seed 7
//   spillway-gen-model --out m.gguf --preset 110m --mix q4_k_m   (llama.cpp's Q4_K_M recipe)
//   spillway-gen-model --out tiny.gguf --embd 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128
//   spillway-gen-model --out echo.gguf --echo-period 12 --vocab models/stories260K.gguf --ctx 2048
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <map>

#include "model/arch.h"
#include "tools/modelgen/echo_llama.h"
#include "tools/modelgen/random_llama.h"

namespace {

struct Preset {
  uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff;
};

const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> kPresets = {
      {"15m", {288, 6, 6, 6, 768}},
      {"110m", {768, 12, 12, 12, 2048}},
      {"500m", {1280, 24, 20, 4, 3584}},
      {"1b", {2048, 22, 32, 4, 5632}},
  };
  return kPresets;
}

int write_echo(spw::Env& env, const std::string& out, uint32_t period, uint32_t ctx, const std::string& vocab,
               float rope_base, float rms_eps) {
  spw::modelgen::EchoLlamaSpec spec;
  spec.period = period;
  spec.n_ctx = ctx;
  spec.vocab_path = vocab;
  spec.rope_freq_base = rope_base;
  spec.rms_eps = rms_eps;
  spw::modelgen::EchoLlamaStats stats;
  auto plan = spw::modelgen::echo_llama_writer(env, spec, &stats);
  if (!plan.ok()) {
    std::fprintf(stderr, "error: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  std::printf("echo model: period %u, n_embd %u, n_layer 1, n_head %u, n_ctx %u, n_vocab %u, f32\n", period,
              stats.n_embd, stats.n_head, ctx, stats.n_vocab);
  std::printf("attention margin %.1f logits (runner-up at distance L-1 +- %lld), output gap >= %.0f\n",
              stats.attention_margin, static_cast<long long>(stats.runner_up_offset),
              spw::modelgen::kEchoOutputGap);
  spw::Status st = plan->write_streaming(out);
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    return 1;
  }
  std::printf("wrote %s: %llu bytes (%.1f MiB)\n", out.c_str(), static_cast<unsigned long long>(stats.file_size),
              static_cast<double>(stats.file_size) / (1024.0 * 1024.0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using spw::gguf::GgmlType;
  CLI::App app{"Write a random-weight Llama GGUF model with a real tokenizer"};
  std::string out, preset, type = "q8_0";
  std::string vocab = "tests/data/ggml-vocab-llama-spm.gguf";
  uint32_t embd = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, ctx = 2048, head_dim = 0, rope_dims = 0;
  std::string arch = "llama";
  uint64_t seed = 1;
  uint32_t echo_period = 0;
  bool tied = false;
  float rope_base = 10000.0f, rms_eps = 1e-5f;
  app.add_option("--out", out, "output GGUF path")->required();
  std::vector<std::string> names;
  for (const auto& [n, p] : presets()) names.push_back(n);
  auto* o_preset = app.add_option("--preset", preset, "15m | 110m | 500m | 1b")->check(CLI::IsMember(names));
  auto* o_embd = app.add_option("--embd", embd, "n_embd (overrides the preset)");
  auto* o_layers = app.add_option("--layers", layers, "n_layer");
  auto* o_heads = app.add_option("--heads", heads, "n_head");
  auto* o_kv_heads = app.add_option("--kv-heads", kv_heads, "n_head_kv");
  auto* o_ffn = app.add_option("--ffn", ffn, "n_ff");
  auto* o_arch = app.add_option("--arch", arch, "llama | qwen2 (Q/K/V biases, NeoX RoPE) | qwen3 (Q/K norms, NeoX RoPE) | "
                                "phi3 (fused attn_qkv and gate+up ffn_up, NeoX RoPE) | qwen2moe (qwen2 with "
                                "experts and a shared expert) | qwen3moe (qwen3 with experts) | gemma2 | gemma3 "
                                "(post-norms, GELU, sliding-window layers, tied head); llama with "
                                "--experts is Mixtral")
                     ->check(CLI::Validator(
                         [](std::string& a) {
                           return spw::find_arch(a) ? std::string() : "not one of " + spw::supported_arch_names();
                         },
                         "ARCH"))
                     ->capture_default_str();
  auto* o_head_dim = app.add_option("--head-dim", head_dim, "head size (default n_embd / n_head; Qwen3 uses 128)");
  auto* o_rope_dims = app.add_option("--rope-dims", rope_dims,
                                     "rope.dimension_count (default the head size; smaller: partial RoPE, as "
                                     "Phi-4-mini's 96 of 128)");
  app.add_option("--ctx", ctx, "context length")->capture_default_str();
  uint32_t experts = 0, experts_used = 0, expert_ff = 0, shared_ff = 0;
  auto* o_experts = app.add_option("--experts", experts,
                                   "a mixture of experts: expert_count (qwen2moe and qwen3moe need it; llama with "
                                   "it is Mixtral)");
  auto* o_experts_used = app.add_option("--experts-used", experts_used, "experts each token uses (default 2)");
  auto* o_expert_ff = app.add_option("--expert-ffn", expert_ff, "one expert's FFN width (default --ffn)");
  auto* o_shared_ff = app.add_option("--shared-ffn", shared_ff, "qwen2moe's shared expert's FFN width (default --ffn)");
  uint32_t sliding_window = 0;
  float attn_softcap = 0.0f, final_softcap = 0.0f, rope_scale = 0.0f;
  auto* o_swa = app.add_option("--sliding-window", sliding_window,
                               "gemma2/gemma3: attention.sliding_window (gemma3 needs it; gemma2 reads 4096 without)");
  auto* o_softcap = app.add_option("--attn-softcap", attn_softcap, "gemma2: attn_logit_softcapping (absent: 50)");
  auto* o_final_softcap =
      app.add_option("--final-softcap", final_softcap, "gemma2: final_logit_softcapping (absent: 30)");
  auto* o_rope_scale = app.add_option("--rope-scale", rope_scale,
                                      "rope.scaling.type linear with this factor (> 1; gemma3: its global layers)");
  const std::map<std::string, GgmlType> types = {
      {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},   {"q8_0", GgmlType::kQ8_0}, {"q4_0", GgmlType::kQ4_0},
      {"q4_1", GgmlType::kQ4_1}, {"q5_0", GgmlType::kQ5_0}, {"q5_1", GgmlType::kQ5_1}, {"q4_k", GgmlType::kQ4_K},
      {"q5_k", GgmlType::kQ5_K}, {"q6_k", GgmlType::kQ6_K}};
  std::vector<std::string> type_names;
  for (const auto& [n, t] : types) type_names.push_back(n);
  auto* o_type = app.add_option("--type", type,
                                "every matrix of this type: f32 | f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | "
                                "q5_k | q6_k (quantised as llama.cpp's reference quantiser does; n_embd and n_ff "
                                "must be multiples of the block, 32 or 256 for the k types)")
                     ->check(CLI::IsMember(type_names))
                     ->capture_default_str();
  std::string mix;
  auto* o_mix = app.add_option("--mix", mix,
                               "llama.cpp's mixed recipe instead of one type: q4_k_m (Q4_K, with Q6_K for "
                               "output.weight and for attn_v/ffn_down of about half the layers) | q5_k_m (the same "
                               "over Q5_K); rows not divisible by 256 fall back as llama-quantize does")
                    ->check(CLI::IsMember({"q4_k_m", "q5_k_m"}))
                    ->excludes(o_type);
  auto* o_seed = app.add_option("--seed", seed, "weight seed")->capture_default_str();
  auto* o_tied = app.add_flag("--tied", tied, "no output.weight; the output projection reuses token_embd");
  app.add_option("--echo-period", echo_period,
                 "instead of random weights, an echo model (F32, 1 layer, n_embd > n_vocab, so a small "
                 "--vocab such as models/stories260K.gguf): greedy decoding of a prompt of >= L tokens "
                 "replays its last L tokens cyclically (next token = the token L positions back), at "
                 "every position < --ctx")
      ->check(CLI::Range(1u, 1u << 30))
      ->excludes(o_preset, o_embd, o_layers, o_heads, o_kv_heads, o_ffn, o_type, o_mix, o_seed, o_tied, o_arch,
                 o_head_dim, o_rope_dims, o_experts, o_experts_used, o_expert_ff, o_shared_ff, o_swa, o_softcap,
                 o_final_softcap, o_rope_scale);
  app.add_option("--vocab", vocab, "GGUF to copy tokenizer.* keys from")->capture_default_str();
  app.add_option("--rope-freq-base", rope_base)->capture_default_str();
  app.add_option("--rms-eps", rms_eps)->capture_default_str();
  std::string pooling;
  app.add_option("--pooling", pooling, "write <arch>.pooling_type: an embedding model (mean | cls | last)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  CLI11_PARSE(app, argc, argv);

  spw::Env& env = spw::Env::default_env();
#ifdef SPILLWAY_SOURCE_DIR
  // The default vocab path is relative to the repo root; find it from elsewhere too.
  if (!env.file_exists(vocab) && vocab.front() != '/') {
    const std::string alt = std::string(SPILLWAY_SOURCE_DIR) + "/" + vocab;
    if (env.file_exists(alt)) vocab = alt;
  }
#endif
  if (echo_period != 0) return write_echo(env, out, echo_period, ctx, vocab, rope_base, rms_eps);
  spw::modelgen::RandomLlamaSpec spec;
  if (!preset.empty()) {
    const Preset& p = presets().at(preset);
    spec.n_embd = p.n_embd;
    spec.n_layer = p.n_layer;
    spec.n_head = p.n_head;
    spec.n_head_kv = p.n_head_kv;
    spec.n_ff = p.n_ff;
  }
  if (embd) spec.n_embd = embd;
  if (layers) spec.n_layer = layers;
  if (heads) spec.n_head = heads;
  if (kv_heads) spec.n_head_kv = kv_heads;
  if (ffn) spec.n_ff = ffn;
  spec.arch = arch;
  spec.head_dim = head_dim;
  spec.rope_dims = rope_dims;
  spec.n_ctx = ctx;
  spec.type = types.at(type);
  if (mix == "q4_k_m") spec.mix = spw::modelgen::RandomLlamaMix::kQ4_K_M;
  if (mix == "q5_k_m") spec.mix = spw::modelgen::RandomLlamaMix::kQ5_K_M;
  spec.tied_output = tied;
  spec.sliding_window = sliding_window;
  spec.attn_softcap = attn_softcap;
  spec.final_softcap = final_softcap;
  spec.rope_scale_linear = rope_scale;
  spec.seed = seed;
  spec.rope_freq_base = rope_base;
  spec.rms_eps = rms_eps;
  spec.vocab_path = vocab;
  spec.pooling_type = pooling == "mean" ? 1 : pooling == "cls" ? 2 : pooling == "last" ? 3 : 0;
  spec.n_expert = experts;
  spec.n_expert_used = experts_used;
  spec.n_ff_exp = expert_ff;
  spec.n_ff_shexp = shared_ff;

  spw::modelgen::RandomLlamaStats stats;
  auto plan = spw::modelgen::random_llama_writer(env, spec, &stats);
  if (!plan.ok()) {
    std::fprintf(stderr, "error: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  std::printf("model: %s, n_embd %u, n_layer %u, n_head %u, n_head_kv %u, n_ff %u, n_ctx %u, n_vocab %u, %s%s\n",
              spec.arch.c_str(), spec.n_embd, spec.n_layer, spec.n_head, spec.n_head_kv, spec.n_ff, spec.n_ctx,
              stats.n_vocab, mix.empty() ? type.c_str() : mix.c_str(), tied ? ", tied output" : "");
  if (spec.n_expert > 0)
    std::printf("experts: %u, %u used per token, expert n_ff %u\n", spec.n_expert,
                spec.n_expert_used > 0 ? spec.n_expert_used : 2, spec.n_ff_exp > 0 ? spec.n_ff_exp : spec.n_ff);
  std::printf("parameters: %llu (%.1f M)\n", static_cast<unsigned long long>(stats.n_params),
              static_cast<double>(stats.n_params) / 1e6);
  const auto t0 = std::chrono::steady_clock::now();
  spw::Status st = plan->write_streaming(out);
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.to_string().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: %llu bytes (%.1f MiB) in %.2f s\n", out.c_str(),
              static_cast<unsigned long long>(stats.file_size),
              static_cast<double>(stats.file_size) / (1024.0 * 1024.0), secs);
  return 0;
}
