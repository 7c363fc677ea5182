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
// supported_arch_names() lists them for error messages ("llama, qwen2, qwen3").
// Thread safety: immutable data.
#pragma once

#include <string>
#include <string_view>

#include "model/hparams.h"

namespace spw {

struct ArchSpec {
  std::string_view name;
  RopeStyle rope_style = RopeStyle::kNormal;
  bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias
  bool qk_norm = false;   // blk.N.attn_{q,k}_norm.weight
};

const ArchSpec* find_arch(std::string_view name);
std::string supported_arch_names();

}  // namespace spw
