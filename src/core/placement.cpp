#include "core/placement.h"

#include <algorithm>
#include <cstdlib>

namespace spw {
namespace {

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

Status bad_placement(std::string_view text) {
  return Status::invalid_argument("placement '" + std::string(text) +
                                  "': expected cpu, vulkan, vulkan:INDEX, vulkan:NAME, hybrid:N or hybrid:N:INDEX, "
                                  "the device ones optionally followed by +cpu-experts or +cpu-experts:K");
}

constexpr std::string_view kCpuExperts = "+cpu-experts";

std::string experts_suffix(const Placement& p) {
  if (!p.cpu_experts) return "";
  return std::string(kCpuExperts) + (p.cpu_expert_layers > 0 ? ":" + std::to_string(p.cpu_expert_layers) : "");
}

}  // namespace

Result<Placement> Placement::parse(std::string_view text) {
  const size_t at = text.rfind(kCpuExperts);
  if (at == std::string_view::npos) return parse_base(text);
  const std::string_view tail = text.substr(at + kCpuExperts.size());
  int32_t k = 0;
  if (!tail.empty()) {
    const std::string_view digits = tail.substr(1);
    if (tail[0] != ':' || !all_digits(digits) || digits.size() > 6) return bad_placement(text);
    k = static_cast<int32_t>(std::strtol(std::string(digits).c_str(), nullptr, 10));
    if (k < 1) return bad_placement(text);
  }
  auto base = parse_base(text.substr(0, at));
  if (!base.ok() || base->kind == Kind::kCpu) return bad_placement(text);
  return base->with_cpu_experts(k);
}

Result<Placement> Placement::parse_base(std::string_view t) {
  constexpr std::string_view kVulkan = "vulkan";
  constexpr std::string_view kHybrid = "hybrid:";
  if (t == "cpu") return cpu();
  if (t == kVulkan) return vulkan();
  if (t.substr(0, kVulkan.size() + 1) == "vulkan:") {
    const std::string_view dev = t.substr(kVulkan.size() + 1);
    if (dev.empty()) return bad_placement(t);  // "vulkan:"
    return vulkan(std::string(dev));
  }
  if (t.substr(0, kHybrid.size()) == kHybrid) {
    const std::string_view rest = t.substr(kHybrid.size());
    const size_t colon = rest.find(':');
    const std::string_view n = rest.substr(0, colon);
    if (!all_digits(n) || n.size() > 6) return bad_placement(t);
    std::string dev;
    if (colon != std::string_view::npos) {
      dev = std::string(rest.substr(colon + 1));
      if (dev.empty()) return bad_placement(t);  // "hybrid:N:"
    }
    return hybrid(static_cast<int32_t>(std::strtol(std::string(n).c_str(), nullptr, 10)), std::move(dev));
  }
  return bad_placement(t);
}

std::string Placement::name() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kVulkan: return "vulkan" + experts_suffix(*this);
    case Kind::kHybrid: return "hybrid:" + std::to_string(gpu_layers) + experts_suffix(*this);
  }
  return "?";
}

std::string Placement::spec() const {
  if (kind == Kind::kCpu || vulkan_device.empty()) return name();
  const std::string base = kind == Kind::kVulkan ? "vulkan" : "hybrid:" + std::to_string(gpu_layers);
  return base + ":" + vulkan_device + experts_suffix(*this);
}

int32_t Placement::gpu_layer_count(int32_t n_layer) const {
  switch (kind) {
    case Kind::kCpu: return 0;
    case Kind::kVulkan: return n_layer;
    case Kind::kHybrid: return std::clamp(gpu_layers, 0, std::max(n_layer, 0));
  }
  return 0;
}

Placement Placement::resolved(int32_t n_layer) const {
  if (kind == Kind::kCpu) return cpu();
  const int32_t n = gpu_layer_count(n_layer);
  if (n == 0) return cpu();
  Placement p = n >= n_layer ? vulkan(vulkan_device) : hybrid(n, vulkan_device);
  // Experts of every device layer on the CPU is "+cpu-experts", whatever K said.
  return cpu_experts ? p.with_cpu_experts(cpu_expert_layers >= n ? 0 : cpu_expert_layers) : p;
}

bool operator==(const Placement& a, const Placement& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == Placement::Kind::kCpu) return true;
  return a.vulkan_device == b.vulkan_device && a.cpu_experts == b.cpu_experts &&
         (!a.cpu_experts || a.cpu_expert_layers == b.cpu_expert_layers) &&
         (a.kind != Placement::Kind::kHybrid || a.gpu_layers == b.gpu_layers);
}

}  // namespace spw
