// Random Llama-architecture GGUF models, for tests and benchmarks.
//
// Contract: builds a GGUF v3 file with llama.cpp's `llama` tensor names, shapes
// (ne[0] first) and metadata keys, random weights, and every `tokenizer.*` key
// copied from the GGUF at `vocab_path` (so the model has a real tokenizer and
// n_vocab = that vocab's token count).
//   token_embd.weight [n_embd, n_vocab]   (matrix type)
//   output_norm.weight [n_embd]           (F32)
//   output.weight [n_embd, n_vocab]       (matrix type; absent when tied_output)
//   blk.N.attn_norm.weight [n_embd]       (F32)
//   blk.N.attn_q.weight [n_embd, n_embd_q], attn_k / attn_v [n_embd, n_embd_kv],
//   blk.N.attn_output.weight [n_embd_q, n_embd]
//   blk.N.ffn_norm.weight [n_embd]        (F32)
//   blk.N.ffn_gate / ffn_up [n_embd, n_ff], ffn_down [n_ff, n_embd]
// with n_embd_q = head_dim * n_head, n_embd_kv = head_dim * n_head_kv, and the
// architecture's extra tensors (see RandomLlamaSpec::arch).
// Weights are a pure function of (seed, tensor name, element index): each
// tensor has its own splitmix64 stream seeded from the seed and the name, and
// each value is an approximately normal sample (sum of four 16-bit uniforms,
// integer arithmetic then one float scale, so it is bit-identical on any IEEE
// platform without relying on libm). Matrices have std 0.02, the two residual
// projections (attn_output, ffn_down) 0.02 / sqrt(2 n_layer) so activations stay
// bounded through deep stacks; norm weights are 1 + 0.01 * noise. F16 and
// quantised files of the same seed therefore hold the F32 file's values,
// rounded by gguf::quantize_row (fp32_to_fp16, or the type's quantiser, which
// writes the bytes llama.cpp's reference quantiser writes for the same
// floats). Same spec => byte-identical file.
//
// Types: `type` is the type of every matrix (F32, F16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: "pure", n_embd and n_ff must be multiples of
// its block, 32 or 256). `mix` instead follows llama.cpp's llama-quant.cpp
// recipe for a llama model (random_llama_tensor_type):
//   Q4_K_M: every matrix Q4_K, except output.weight (token_embd.weight when
//           the output is tied) Q6_K, and attn_v / ffn_down of layer i Q6_K
//           when use_more_bits(i, n_layer): i < n/8, i >= 7n/8, or
//           (i - n/8) % 3 == 2 -- about half the layers;
//   Q5_K_M: the same with Q5_K as the base type.
// A matrix whose rows are not a multiple of 256 falls back as llama.cpp does
// (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 if even 32 does not
// divide it; the output head goes straight to Q8_0). Not reproduced: the
// 70B attn_v rule and anything importance-matrix driven.
//
// Memory: tensors are generated row by row while the file is written, so peak
// RAM is about the largest single tensor's encoded bytes (write_random_llama
// with the default Env), or the whole file (make_random_llama, other Envs).
//
// Failure: InvalidArgument naming the field for an inconsistent spec (zero
// sizes, n_embd not divisible by n_head, n_head not divisible by n_head_kv, odd
// head dim, a matrix type without a quantiser, a pure type whose block does not
// divide n_embd and n_ff, empty vocab_path); errors from reading the vocab GGUF
// (IOError, Corruption, NotFound for a missing tokenizer.ggml.tokens); IOError
// from writing.
// Thread safety: functions are reentrant; no shared state.
// Hand-built (not random) models whose greedy output is known: echo_llama.h
// (`spillway-gen-model --echo-period L`).
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "gguf/gguf.h"

namespace spw::modelgen {

enum class RandomLlamaMix { kNone, kQ4_K_M, kQ5_K_M };

struct RandomLlamaSpec {
  // general.architecture, one of model/arch.h's; its spec's optional tensors
  // are written: Q/K/V biases (qwen2: blk.N.attn_{q,k,v}.bias, std 0.02),
  // per-head Q/K norms (qwen3: blk.N.attn_{q,k}_norm.weight [head_dim], 1 +
  // noise); phi3 writes Q, K and V as one blk.N.attn_qkv.weight and the
  // FFN's gate and up as one blk.N.ffn_up.weight (gate rows first), std
  // 0.02 as the separate tensors. Keys use its prefix.
  std::string arch = "llama";
  uint32_t head_dim = 0;  // 0: n_embd / n_head; else written as attention.key_length / value_length
  uint32_t rope_dims = 0;  // rope.dimension_count; 0: the head size (partial RoPE when smaller, even)
  uint32_t n_embd = 64;
  uint32_t n_layer = 2;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t n_ff = 128;
  uint32_t n_ctx = 256;
  gguf::GgmlType type = gguf::GgmlType::kF32;  // 2-D matrices and token_embd; norms are F32
  RandomLlamaMix mix = RandomLlamaMix::kNone;  // when set, overrides `type` (see above)
  bool tied_output = false;                    // no output.weight: the output uses token_embd
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  uint64_t seed = 1;
  std::string vocab_path;  // GGUF whose tokenizer.* keys are copied
  // <arch>.pooling_type written when > 0 (1 mean, 2 cls, 3 last): an
  // embedding model as llama.cpp reads one.
  uint32_t pooling_type = 0;
  // Mixture of experts (model/arch.h): n_expert > 0 writes the router
  // blk.N.ffn_gate_inp.weight [n_embd, n_expert] (F32, as llama.cpp's
  // quantiser leaves it; std 2 / sqrt(n_embd), so its logits spread over a
  // few units as a trained router's do) and the experts as 3-D
  // blk.N.ffn_{gate,up}_exps [n_embd, n_ff_exp, n_expert] and ffn_down_exps
  // [n_ff_exp, n_embd, n_expert] (the matrix type) instead of ffn_gate/up/
  // down, with expert_count, expert_used_count and
  // expert_feed_forward_length; qwen2moe also writes the shared expert
  // (ffn_{gate,up,down}_shexp, n_ff_shexp wide, and ffn_gate_inp_shexp
  // [n_embd], F32) and expert_shared_feed_forward_length. Required (> 0) for
  // qwen2moe and qwen3moe, optional for llama (Mixtral).
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 0;  // 0: 2
  uint32_t n_ff_exp = 0;       // 0: n_ff
  uint32_t n_ff_shexp = 0;     // 0: n_ff
  float expert_weights_scale = 0.0f;  // written as <arch>.expert_weights_scale when > 0
  // Gemma (gemma2, gemma3; model/arch.h): blk.N.post_attention_norm and
  // post_ffw_norm [n_embd] (F32, 1 + noise) are written, and the head is
  // always tied (Gemma files have no output.weight; tied_output is implied).
  // attention.sliding_window is written when > 0 (gemma3 needs it);
  // gemma2's attn_logit_softcapping / final_logit_softcapping when > 0
  // (absent, a reader takes 50 and 30).
  uint32_t sliding_window = 0;
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // > 1: rope.scaling.type "linear" with this rope.scaling.factor (Gemma 3's
  // global layers; a llama reads it for every layer).
  float rope_scale_linear = 0.0f;
};

// Whether the spec's model has no output.weight (tied_output, or an
// architecture whose head is always the embedding).
bool random_llama_tied(const RandomLlamaSpec& spec);

struct RandomLlamaStats {
  uint32_t n_vocab = 0;
  uint64_t n_params = 0;   // all weights, norms included
  uint64_t file_size = 0;  // bytes the file will have
};

// Checks the spec's own consistency (not the vocab file).
Status validate_random_llama_spec(const RandomLlamaSpec& spec);

// The type a matrix gets: `spec.type`, or the mix's recipe for tensor `name`
// (llama.cpp naming) of layer `layer` (ignored for the non-layer tensors) with
// rows of `ne0` elements.
gguf::GgmlType random_llama_tensor_type(const RandomLlamaSpec& spec, const std::string& name, uint32_t layer,
                                        uint64_t ne0);

// Total weight count for `spec` with `n_vocab` tokens.
uint64_t random_llama_param_count(const RandomLlamaSpec& spec, uint64_t n_vocab);

// A writer holding the metadata and lazily generated tensors; nothing heavy
// happens until it is serialised. Reads the vocab through `env`. Fills `stats`
// when given.
Result<gguf::GgufWriter> random_llama_writer(Env& env, const RandomLlamaSpec& spec,
                                             RandomLlamaStats* stats = nullptr);

// Writes the model to `out_path` atomically (tmp + rename). With
// Env::default_env() it streams (memory ~ largest tensor); with any other Env
// it serialises in memory and calls env.write_file.
Status write_random_llama(Env& env, const std::string& out_path, const RandomLlamaSpec& spec);
// The same for any generated model's writer (write_random_llama and
// write_echo_llama both end here).
Status write_generated_model(Env& env, const std::string& out_path, gguf::GgufWriter& writer);

// The whole model file in memory (for small test models); vocab read through
// Env::default_env() or the given Env.
Result<std::string> make_random_llama(const RandomLlamaSpec& spec);
Result<std::string> make_random_llama(Env& env, const RandomLlamaSpec& spec);

// The sample stream behind one tensor: element i (row-major, ne[0] fastest) of
// tensor `tensor_name` is mean + std * (i-th next_normal()), before fp16/Q8_0
// rounding, where (mean, std) are (0, 0.02), (0, 0.02/sqrt(2 n_layer)) or
// (1, 0.01) as described above. Exposed so tests can recompute weights.
class WeightStream {
 public:
  WeightStream(uint64_t seed, std::string_view tensor_name);
  // Approximately N(0, 1), in [-2*sqrt(3), 2*sqrt(3)].
  float next_normal();

 private:
  uint64_t state_;
};

}  // namespace spw::modelgen
