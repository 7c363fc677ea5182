// Architectures: what distinguishes the llama-family models Spillway runs.
//
// Contract: find_arch(name) returns the spec of a supported
// general.architecture, or nullptr. A spec says which optional parts the
// architecture's layers have and how RoPE pairs dimensions; the model binds
// the tensors the spec names and the backends implement each feature once
// (so a new architecture of this family is one spec, in arch.cpp, not edits
// across the backends):
//   llama  (Llama 1-3.x, Mistral, SmolLM, TinyLlama): RoPE "normal".
//   qwen2  (Qwen2, Qwen2.5): biases on Q, K and V; RoPE NeoX.
//   qwen3  (Qwen3 dense): per-head RMSNorm of Q and K before RoPE
//          (attn_q_norm / attn_k_norm, [head_dim]); RoPE NeoX.
//   phi3   (Phi-3, Phi-3.5, Phi-4-mini): Q, K and V in one matrix
//          (attn_qkv, rows Q then K then V) and the FFN's gate and up in
//          ffn_up (rows gate then up; no ffn_gate); RoPE NeoX, partial where
//          rope.dimension_count < the head size (Phi-4-mini). The model
//          binds each part as a row range of the fused tensor, so the
//          backends see the llama layer and compute it unchanged. Files with
//          separate attn_q/k/v are bound as llama's. LongRoPE (the 128k
//          variants' rope_factors_long/short) is refused by name; the
//          sliding window some files declare is ignored, as llama.cpp does
//          (it only matters past 2k tokens of a 4k model).
// Mixture of experts (LlamaHparams::n_expert > 0): each layer's FFN is a
// router (ffn_gate_inp, [n_expert rows]) choosing n_expert_used of the
// experts stored as 3-D ffn_{gate,up,down}_exps tensors ([cols, rows,
// n_expert]); the token's output is the chosen experts' SwiGLU FFNs weighted
// by their softmax probabilities (over all experts), renormalised to sum 1
// where the architecture says so (moe_norm_topk).
//   llama      with expert_count > 0: Mixtral; normalised.
//   qwen2moe   (Qwen1.5-MoE, Qwen2-MoE) Qwen2's attention; not normalised; a
//              shared expert (ffn_{gate,up,down}_shexp) added to every
//              token, scaled by sigmoid(ffn_gate_inp_shexp . x).
//   qwen3moe   (Qwen3-30B-A3B, Qwen3-235B-A22B) Qwen3's attention;
//              normalised.
// The legacy per-expert tensors (blk.N.ffn_gate.E.weight, early Mixtral
// files) are refused by name.
// Gemma (gemma_style):
//   gemma2  (Gemma 2): the token embedding scaled by sqrt(n_embd); a second
//           RMSNorm on the attention's and on the FFN's output before each
//           residual add (post_attention_norm, post_ffw_norm); a GELU-gated
//           FFN (tanh form); attention scores and the final logits
//           soft-capped (cap * tanh(x / cap)); sliding-window attention on
//           the even layers (swa_period 2); RoPE NeoX; the head tied to
//           token_embd.
//   gemma3  (Gemma 3, text): Gemma 2 without soft-capping, with Qwen3's
//           per-head Q/K norms; five sliding-window layers then one global
//           (swa_period 6); the sliding layers' RoPE has its own base
//           (10000) and no position scaling, the global layers' the file's
//           base and linear scaling. A vision tower (an mmproj file, or v.*
//           tensors) is not supported; text-only use works.
// A sliding layer l (l % swa_period < swa_period - 1) attends to the
// positions p - n_swa < q <= p only (LlamaHparams::is_swa).
// supported_arch_names() lists them for error messages ("llama, qwen2, qwen3, phi3, ...").
// Thread safety: immutable data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/hparams.h"

namespace spw {

// Whether an architecture's layers are mixtures of experts.
enum class MoeKind : uint8_t {
  kNone,      // dense FFN only
  kOptional,  // experts when <arch>.expert_count > 0 (llama: Mixtral)
  kRequired,  // always (qwen2moe, qwen3moe): expert_count must be > 0
};

struct ArchSpec {
  std::string_view name;
  RopeStyle rope_style = RopeStyle::kNormal;
  bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias
  bool qk_norm = false;   // blk.N.attn_{q,k}_norm.weight
  bool fused_qkv = false;      // blk.N.attn_qkv.weight [n_embd_q + 2 n_embd_kv rows] when present
  bool fused_gate_up = false;  // blk.N.ffn_up.weight [2 n_ff rows]: gate, then up
  MoeKind moe = MoeKind::kNone;
  bool moe_norm_topk = false;  // the chosen experts' weights renormalised to sum 1
  bool shared_expert = false;  // blk.N.ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp
  // Gemma: embedding scale, post-norms (blk.N.post_attention_norm,
  // post_ffw_norm), GELU FFN.
  bool gemma_style = false;
  bool softcap = false;        // attention and final logit soft-capping (gemma2)
  int32_t swa_period = 0;      // sliding-window layers: l % period < period - 1 (0: none)
  bool swa_local_rope = false; // sliding layers: RoPE base rope.freq_base_swa [10000], no scaling (gemma3)
  // The layer count of the architecture's 27B model, whose query scale is
  // 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim) (its
  // query_pre_attn_scalar, which the GGUF does not store; llama.cpp's rule).
  int32_t wide_query_scale_layers = 0;
};

const ArchSpec* find_arch(std::string_view name);
std::string supported_arch_names();

// The rows of each part a tensor named `name` with `n_rows` rows is bound as,
// in order: a fused tensor's parts (attn_qkv: Q, K, V; a fused_gate_up
// ffn_up: gate, up), else the tensor whole ({n_rows}, also for a fused
// tensor whose rows do not add up, which the model refuses by its shape).
// One rule for the model's binding (row ranges) and the estimator (a part's
// upload and packing).
std::vector<int64_t> fused_parts(const ArchSpec& arch, const LlamaHparams& hp, std::string_view name,
                                 int64_t n_rows);

// Whether a tensor is part of a mixture of experts' FFN: the router
// (ffn_gate_inp), the experts (ffn_*_exps) or the shared expert (ffn_*_shexp,
// ffn_gate_inp_shexp). The Vulkan backend keeps these on the host; the
// estimator places them there.
bool is_expert_tensor(std::string_view name);

}  // namespace spw
