// Placement: where a model's layers run -- all on the CPU, all on one Vulkan
// device, or split (hybrid) -- the one type serve, generate, estimate and
// the estimator use, so that one place is spelled one way everywhere. No
// Vulkan headers; works in builds without Vulkan.
//
// Contract: parse() accepts exactly
//   "cpu"                 everything on the CPU backend;
//   "vulkan" / "vulkan:I" / "vulkan:NAME"  everything on one Vulkan device
//                         (I = index, NAME = case-insensitive name substring,
//                         passed on as VulkanBackendOptions::device);
//   "hybrid:N" / "hybrid:N:I"  layers [0, N) on Vulkan device I (default the
//                         first), the rest on the CPU (N: 1 to 6 decimal
//                         digits; clamped to n_layer by gpu_layer_count).
// and each device form followed by "+cpu-experts": a mixture of experts'
// router and experts run on the CPU, from the mapped file, the rest of its
// layers as the form says (backend/vulkan/vulkan_backend.h); a dense model
// has no experts and refuses it at open (engine/device_session.h);
// "+cpu-experts:K" (K: 1 to 6 digits, >= 1) keeps only the experts of
// layers [0, K) on the CPU, the later device layers' on the device (the
// split llama.cpp's --n-cpu-moe K makes: as many experts on the device as
// fit). resolved() writes K >= the device layers as plain "+cpu-experts".
// Anything else is InvalidArgument quoting the text and naming these forms
// (callers add which option it came from, e.g. "--device").
// spec() is the canonical text of a placement, selector included, and
// parse(p.spec()) == p for every placement parse() can return (hybrid N in
// 0..999999; N is written without leading zeros). name() is the short spelling every response, log line
// and journal record uses: "cpu", "vulkan" or "hybrid:N" (the device ones
// with "+cpu-experts" when set), without the device selector. A placement given by the user may say more layers than a model
// has; resolved(n_layer) is the placement as it actually runs for a model of
// n_layer layers (hybrid:0 is cpu, hybrid:N with N >= n_layer is vulkan), so
// name() of a resolved placement is canonical: one running layout, one name.
// Fields: vulkan_device and cpu_experts are meaningful for vulkan and hybrid
// only, gpu_layers for hybrid only (the static constructors leave the others empty/0), and
// operator== compares the meaningful fields only.
// Thread safety: a value type; all members are const and pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace spw {

struct Placement {
  enum class Kind { kCpu, kVulkan, kHybrid };

  Kind kind = Kind::kCpu;
  std::string vulkan_device;  // VulkanBackendOptions::device ("" = the first device)
  int32_t gpu_layers = 0;     // hybrid: layers [0, gpu_layers) on Vulkan
  bool cpu_experts = false;   // vulkan / hybrid: a mixture's experts on the CPU ("+cpu-experts")
  int32_t cpu_expert_layers = 0;  // with cpu_experts: > 0, only layers [0, K)'s ("+cpu-experts:K"); 0: all

  static Placement cpu() { return {}; }
  static Placement vulkan(std::string device = "") { return {Kind::kVulkan, std::move(device), 0, false, 0}; }
  static Placement hybrid(int32_t n, std::string device = "") {
    return {Kind::kHybrid, std::move(device), n, false, 0};
  }
  // This placement with a mixture's experts on the CPU, all of them (k = 0)
  // or layers [0, k)'s (cpu stays cpu).
  Placement with_cpu_experts(int32_t k = 0) const {
    Placement p = *this;
    p.cpu_experts = kind != Kind::kCpu;
    p.cpu_expert_layers = p.cpu_experts ? k : 0;
    return p;
  }
  // Whether layer il's experts run on the CPU (a CPU stage's always do).
  bool experts_on_cpu(int32_t il) const {
    const bool on_device = kind == Kind::kVulkan || (kind == Kind::kHybrid && il < gpu_layers);
    return !on_device || (cpu_experts && (cpu_expert_layers <= 0 || il < cpu_expert_layers));
  }

  static Result<Placement> parse(std::string_view text);

  // "cpu", "vulkan", "hybrid:N", "+cpu-experts[:K]" after a device one (no device selector).
  std::string name() const;
  // "cpu", "vulkan", "vulkan:SEL", "hybrid:N", "hybrid:N:SEL": parse() inverts it.
  std::string spec() const;

  // How many layers, from layer 0, run on Vulkan for a model of n_layer
  // layers: 0 for cpu, n_layer for vulkan, hybrid's N clamped to [0, n_layer].
  int32_t gpu_layer_count(int32_t n_layer) const;
  // The placement as it runs for n_layer layers: cpu and vulkan stay as they
  // are; hybrid becomes cpu (no selector) when its clamped N is 0, vulkan
  // (same selector) when N >= n_layer, else stays hybrid:N. Idempotent.
  Placement resolved(int32_t n_layer) const;

  // Some layer runs on Vulkan (for any model with a layer): vulkan, or
  // hybrid with N > 0.
  bool on_gpu() const { return kind == Kind::kVulkan || (kind == Kind::kHybrid && gpu_layers > 0); }

  friend bool operator==(const Placement& a, const Placement& b);

 private:
  static Result<Placement> parse_base(std::string_view text);  // without the +cpu-experts suffix
};

}  // namespace spw
