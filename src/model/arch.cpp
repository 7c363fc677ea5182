// The supported architectures (see arch.h).
#include "model/arch.h"

#include <array>

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

std::string supported_arch_names() {
  std::string s;
  for (const ArchSpec& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

}  // namespace spw
