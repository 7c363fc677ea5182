// The supported architectures (see arch.h).
#include "model/arch.h"

#include <array>
#include <vector>

namespace spw {
namespace {

constexpr std::array<ArchSpec, 4> kArchs = {{
    {"llama", RopeStyle::kNormal, false, false, false, false},
    {"qwen2", RopeStyle::kNeox, true, false, false, false},
    {"qwen3", RopeStyle::kNeox, false, true, false, false},
    {"phi3", RopeStyle::kNeox, false, false, true, true},
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

std::string supported_arch_names() {
  std::string s;
  for (const ArchSpec& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace spw
