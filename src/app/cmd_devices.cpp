// `spillway devices [--json]`: every memory and device figure Spillway can read
// on this machine, with where each came from, and "unknown (reason)" for what
// it cannot read. Exit code 0 even when figures are unknown: that is a finding,
// not a failure.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "backend/cpu/kernel_variant.h"
#include "backend/vulkan/device_spec.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/cpu_features.h"
#include "core/env.h"
#include "device/inventory.h"

namespace spw::app {
namespace {

struct DevicesOptions {
  bool json = false;
  std::string root = "/";
  std::string nvml_library = device::kNvmlLibrary;
};

nlohmann::json finding_to_json(const device::Finding& f) {
  nlohmann::json j = {{"probe", f.probe},
                      {"subject", f.subject},
                      {"figure", f.figure},
                      {"kind", device::finding_kind_name(f.kind)},
                      {"known", f.known}};
  if (f.known) {
    if (f.kind == device::Finding::Kind::kText) {
      j["value"] = f.text;
    } else if (f.kind == device::Finding::Kind::kLimit && f.unlimited) {
      j["value"] = "max";
    } else {
      j["value"] = f.number;
    }
    j["display"] = device::format_finding_value(f);
    j["source"] = f.source;
  } else {
    j["reason"] = f.reason;
  }
  return j;
}

// Vulkan devices as the loader lists them (a listing needs no backend; the
// per-heap budget needs VK_EXT_memory_budget, else it is unknown).
nlohmann::json vulkan_json(const Result<std::vector<VulkanDeviceInfo>>& devices) {
  if (!devices.ok()) return {{"known", false}, {"reason", devices.status().to_string()}};
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& d : *devices) {
    nlohmann::json heaps = nlohmann::json::array();
    for (const auto& h : d.heaps) {
      nlohmann::json hj = {{"size_bytes", h.size_bytes}, {"device_local", h.device_local}};
      hj["budget_bytes"] = h.budget_bytes >= 0 ? nlohmann::json(h.budget_bytes) : nlohmann::json(nullptr);
      hj["usage_bytes"] = h.usage_bytes >= 0 ? nlohmann::json(h.usage_bytes) : nlohmann::json(nullptr);
      heaps.push_back(hj);
    }
    arr.push_back({{"index", d.index}, {"name", d.name}, {"type", d.type}, {"vendor", d.vendor},
                   {"driver", d.driver}, {"api_version", d.api_version}, {"memory_budget_ext", d.memory_budget_ext},
                   {"compute_queue", d.has_compute_queue}, {"heaps", heaps}, {"source", "vkEnumeratePhysicalDevices"}});
  }
  return {{"known", true}, {"devices", arr}};
}

// The CPU (CPUID and XGETBV; on AArch64 the hardware capability words) and
// the kernel variants built into this binary: which run here, and which the
// CPU kernels use (kernel_variant.h).
nlohmann::json cpu_json() {
  const CpuFeatures& f = host_cpu_features();
  const cpu::KernelVariantInfo active = cpu::active_kernel_variant();
  nlohmann::json variants = nlohmann::json::array();
  for (const cpu::KernelVariantInfo& v : cpu::kernel_variants()) {
    variants.push_back(
        {{"name", v.name}, {"isa", v.isa}, {"runs_here", v.runs_here}, {"active", v.name == active.name}});
  }
  return {{"vendor", f.vendor},     {"brand", f.brand},     {"features", f.usable()},
          {"kernels", active.name}, {"variants", variants},
#if defined(__aarch64__)
          {"source", "hwcap"}};
#else
          {"source", "cpuid, xgetbv"}};
#endif
}

std::string format_cpu(const nlohmann::json& c) {
  std::string out = "  " + std::string(c["brand"].get<std::string>().empty() ? "unknown model" : c["brand"]) + "\n";
  std::string features;
  for (const auto& x : c["features"]) features += (features.empty() ? "" : " ") + x.get<std::string>();
  out += "  features: " + (features.empty() ? std::string("none of the extensions the kernels use") : features) + "\n";
  for (const auto& v : c["variants"]) {
    const std::string isa = v["isa"].get<std::string>();
    out +=
        std::string(v["active"].get<bool>() ? "  * " : "    ") + v["name"].get<std::string>() + " (" +
        (isa.empty() ? "scalar" : isa) + ")" +
        (v["runs_here"].get<bool>() ? (v["active"].get<bool>() ? ": CPU kernels run this" : "") : ": not on this CPU") +
        "\n";
  }
  return out;
}

int run_devices(const DevicesOptions& o) {
  device::CollectOptions c;
  c.env = &Env::default_env();
  c.root = o.root;
  c.nvml_library = o.nvml_library;
  device::DeviceInventory inv = device::collect_all(c);

  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& f : inv.findings) arr.push_back(finding_to_json(f));
    nlohmann::json j = {
        {"root", o.root}, {"findings", arr}, {"cpu", cpu_json()}, {"vulkan", vulkan_json(list_vulkan_devices())}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::string group;
  for (const auto& f : inv.findings) {
    std::string g = f.probe + (f.subject == "-" || f.subject == f.probe ? "" : " " + f.subject);
    if (g != group) {
      std::printf("%s%s\n", group.empty() ? "" : "\n", g.c_str());
      group = g;
    }
    if (f.known) {
      std::printf("  %-22s %-28s from %s\n", f.figure.c_str(), device::format_finding_value(f).c_str(),
                  f.source.c_str());
    } else {
      std::printf("  %-22s unknown (%s)\n", f.figure.c_str(), f.reason.c_str());
    }
  }
  std::printf("\ncpu kernels\n%s", format_cpu(cpu_json()).c_str());
  auto vk = list_vulkan_devices();
  std::printf("\nvulkan devices\n");
  if (vk.ok()) {
    std::printf("%s", format_vulkan_devices(*vk).c_str());
  } else {
    std::printf("  unknown (%s)\n", vk.status().to_string().c_str());
  }
  return 0;
}

}  // namespace

void add_devices(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<DevicesOptions>();
  CLI::App* sub = app.add_subcommand("devices", "Show host, cgroup and GPU memory readings and where each came from");
  sub->add_flag("--json", o->json, "Print JSON");
  sub->add_option("--root", o->root, "Read /proc and /sys below this directory (fixture trees)")->capture_default_str();
  sub->add_option("--nvml-library", o->nvml_library, "NVML library name or path to dlopen")->capture_default_str();
  sub->callback([o, &exit_code] { exit_code = run_devices(*o); });
}

}  // namespace spw::app
