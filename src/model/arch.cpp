// The supported architectures (see arch.h).
#include "model/arch.h"

#include <array>
#include <vector>

namespace spw {
namespace {

constexpr std::array<ArchSpec, 8> kArchs = {{
    {.name = "llama", .moe = MoeKind::kOptional, .moe_norm_topk = true},
    {.name = "qwen2", .rope_style = RopeStyle::kNeox, .qkv_bias = true},
    {.name = "qwen3", .rope_style = RopeStyle::kNeox, .qk_norm = true},
    {.name = "phi3", .rope_style = RopeStyle::kNeox, .fused_qkv = true, .fused_gate_up = true},
    {.name = "qwen2moe", .rope_style = RopeStyle::kNeox, .qkv_bias = true, .moe = MoeKind::kRequired,
     .shared_expert = true},
    {.name = "qwen3moe", .rope_style = RopeStyle::kNeox, .qk_norm = true, .moe = MoeKind::kRequired,
     .moe_norm_topk = true},
    {.name = "gemma2", .rope_style = RopeStyle::kNeox, .gemma_style = true, .softcap = true, .swa_period = 2,
     .wide_query_scale_layers = 46},
    {.name = "gemma3", .rope_style = RopeStyle::kNeox, .qk_norm = true, .gemma_style = true, .swa_period = 6,
     .swa_local_rope = true, .wide_query_scale_layers = 62},
}};

}  // namespace

const ArchSpec* find_arch(std::string_view name) {
  for (const ArchSpec& a : kArchs) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::vector<int64_t> fused_parts(const ArchSpec& arch, const LlamaHparams& hp, std::string_view name,
                                 int64_t n_rows) {
  const int64_t q = hp.n_embd_q(), kv = hp.n_embd_kv(), ff = hp.n_ff;
  if (arch.fused_qkv && name.ends_with(".attn_qkv.weight") && n_rows == q + 2 * kv) return {q, kv, kv};
  if (arch.fused_gate_up && name.ends_with(".ffn_up.weight") && n_rows == 2 * ff) return {ff, ff};
  return {n_rows};
}

bool is_expert_tensor(std::string_view name) {
  return name.find(".ffn_gate_inp") != std::string_view::npos || name.find("_exps.") != std::string_view::npos ||
         name.find("_shexp.") != std::string_view::npos;
}

std::string supported_arch_names() {
  std::string s;
  for (const ArchSpec& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace spw
