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
// supported_arch_names() lists them for error messages ("llama, qwen2, qwen3, phi3").
// Thread safety: immutable data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/hparams.h"

namespace spw {

struct ArchSpec {
  std::string_view name;
  RopeStyle rope_style = RopeStyle::kNormal;
  bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias
  bool qk_norm = false;   // blk.N.attn_{q,k}_norm.weight
  bool fused_qkv = false;      // blk.N.attn_qkv.weight [n_embd_q + 2 n_embd_kv rows] when present
  bool fused_gate_up = false;  // blk.N.ffn_up.weight [2 n_ff rows]: gate, then up
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

}  // namespace spw
