#include "device/inventory.h"

#include <cstdio>
#include <utility>

#include "core/size.h"

namespace spw::device {
namespace {

using Kind = Finding::Kind;

class FindingList {
 public:
  explicit FindingList(std::vector<Finding>& out) : out_(out) {}

  void number(const std::string& probe, const std::string& subject, const std::string& figure, Kind kind,
              const Reading<uint64_t>& r) {
    Finding f = base(probe, subject, figure, kind);
    f.known = r.known();
    if (r.known()) {
      f.number = r.value();
      f.source = r.source();
    } else {
      f.reason = r.reason();
    }
    out_.push_back(std::move(f));
  }
  void limit(const std::string& probe, const std::string& subject, const std::string& figure,
             const Reading<ByteLimit>& r) {
    Finding f = base(probe, subject, figure, Kind::kLimit);
    f.known = r.known();
    if (r.known()) {
      f.unlimited = r.value().unlimited;
      f.number = r.value().bytes;
      f.source = r.source();
    } else {
      f.reason = r.reason();
    }
    out_.push_back(std::move(f));
  }
  void text(const std::string& probe, const std::string& subject, const std::string& figure,
            const Reading<std::string>& r) {
    Finding f = base(probe, subject, figure, Kind::kText);
    f.known = r.known();
    if (r.known()) {
      f.text = r.value();
      f.source = r.source();
    } else {
      f.reason = r.reason();
    }
    out_.push_back(std::move(f));
  }
  void unknown(const std::string& probe, const std::string& subject, const std::string& figure,
               const std::string& reason) {
    text(probe, subject, figure, Reading<std::string>::unknown(reason));
  }

 private:
  static Finding base(const std::string& probe, const std::string& subject, const std::string& figure, Kind kind) {
    Finding f;
    f.probe = probe;
    f.subject = subject;
    f.figure = figure;
    f.kind = kind;
    return f;
  }
  std::vector<Finding>& out_;
};

}  // namespace

const char* finding_kind_name(Finding::Kind kind) {
  switch (kind) {
    case Kind::kBytes: return "bytes";
    case Kind::kCount: return "count";
    case Kind::kPercent: return "percent";
    case Kind::kCelsius: return "celsius";
    case Kind::kLimit: return "limit_bytes";
    case Kind::kText: break;
  }
  return "text";
}

std::string format_finding_value(const Finding& f) {
  switch (f.kind) {
    case Kind::kBytes:
      return format_byte_size(f.number);
    case Kind::kLimit:
      return f.unlimited ? "max (unlimited)" : format_byte_size(f.number);
    case Kind::kCount: return std::to_string(f.number);
    case Kind::kPercent: return std::to_string(f.number) + " %";
    case Kind::kCelsius: return std::to_string(f.number) + " C";
    case Kind::kText: break;
  }
  return f.text;
}

std::vector<Finding> make_findings(const DeviceInventory& inv) {
  std::vector<Finding> out;
  FindingList l(out);

  const HostMemory& h = inv.host;
  l.number("host", "host", "mem_total", Kind::kBytes, h.mem_total_bytes);
  l.number("host", "host", "mem_available", Kind::kBytes, h.mem_available_bytes);
  l.number("host", "host", "mem_free", Kind::kBytes, h.mem_free_bytes);
  l.number("host", "host", "swap_total", Kind::kBytes, h.swap_total_bytes);
  l.number("host", "host", "swap_free", Kind::kBytes, h.swap_free_bytes);
  l.number("process", "self", "rss", Kind::kBytes, h.process_rss_bytes);
  l.number("process", "self", "peak_rss", Kind::kBytes, h.process_peak_rss_bytes);
  l.number("process", "self", "rss_anon", Kind::kBytes, h.process_rss_anon_bytes);
  l.number("process", "self", "rss_file", Kind::kBytes, h.process_rss_file_bytes);

  const CgroupMemory& c = inv.cgroup;
  if (c.version == 0) {
    l.unknown("cgroup", "-", "cgroup", c.none_reason);
  } else {
    const std::string subj = c.path;
    l.text("cgroup", subj, "version",
           Reading<std::string>::of("v" + std::to_string(c.version), "/proc/self/cgroup"));
    l.limit("cgroup", subj, "memory_max", c.max);
    l.limit("cgroup", subj, "memory_max_effective", c.effective_max);
    l.limit("cgroup", subj, "memory_high", c.high);
    l.number("cgroup", subj, "memory_current", Kind::kBytes, c.current_bytes);
    l.number("cgroup", subj, "memory_peak", Kind::kBytes, c.peak_bytes);
    l.limit("cgroup", subj, "swap_max", c.swap_max);
    l.number("cgroup", subj, "oom_events", Kind::kCount, c.oom_events);
    l.number("cgroup", subj, "oom_kill_events", Kind::kCount, c.oom_kill_events);
  }

  const AmdSysfsReport& a = inv.amd;
  if (a.gpus.empty()) l.unknown("amd_sysfs", "-", "gpus", a.none_reason);
  for (const std::string& s : a.skipped) {
    l.text("amd_sysfs", "-", "skipped", Reading<std::string>::of(s, "sysfs:/sys/class/drm"));
  }
  for (const AmdGpu& g : a.gpus) {
    if (g.pci_device_id.known()) {
      char id[24];
      std::snprintf(id, sizeof id, "0x%04llx", static_cast<unsigned long long>(g.pci_device_id.value()));
      l.text("amd_sysfs", g.card, "pci_device_id", Reading<std::string>::of(id, g.pci_device_id.source()));
    } else {
      l.unknown("amd_sysfs", g.card, "pci_device_id", g.pci_device_id.reason());
    }
    l.number("amd_sysfs", g.card, "vram_total", Kind::kBytes, g.vram_total_bytes);
    l.number("amd_sysfs", g.card, "vram_used", Kind::kBytes, g.vram_used_bytes);
    l.number("amd_sysfs", g.card, "gtt_total", Kind::kBytes, g.gtt_total_bytes);
    l.number("amd_sysfs", g.card, "gtt_used", Kind::kBytes, g.gtt_used_bytes);
    l.number("amd_sysfs", g.card, "busy", Kind::kPercent, g.busy_percent);
  }

  const NvmlReport& n = inv.nvml;
  if (n.gpus.empty()) l.unknown("nvml", "-", "gpus", n.none_reason);
  for (const NvmlGpu& g : n.gpus) {
    const std::string subj = "gpu" + std::to_string(g.index);
    l.text("nvml", subj, "name", g.name);
    l.number("nvml", subj, "memory_total", Kind::kBytes, g.memory_total_bytes);
    l.number("nvml", subj, "memory_free", Kind::kBytes, g.memory_free_bytes);
    l.number("nvml", subj, "memory_used", Kind::kBytes, g.memory_used_bytes);
    l.number("nvml", subj, "temperature", Kind::kCelsius, g.temperature_c);
    if (g.health == DeviceHealth::kUnknown) {
      l.unknown("nvml", subj, "health", g.health_detail);
    } else {
      std::string t = device_health_name(g.health);
      if (!g.health_detail.empty()) t += " (" + g.health_detail + ")";
      l.text("nvml", subj, "health", Reading<std::string>::of(t, "nvml"));
    }
    if (!g.processes.known()) {
      l.unknown("nvml", subj, "processes", g.processes.reason());
    } else {
      l.number("nvml", subj, "processes", Kind::kCount,
               Reading<uint64_t>::of(g.processes.value().size(), g.processes.source()));
      for (const NvmlProcess& p : g.processes.value()) {
        l.number("nvml", subj + " pid " + std::to_string(p.pid), "process_memory_used", Kind::kBytes, p.used_bytes);
      }
    }
  }

  if (inv.vulkan.empty()) l.unknown("vulkan", "-", "heaps", inv.vulkan_none_reason);
  for (size_t d = 0; d < inv.vulkan.size(); ++d) {
    const VkDeviceBudget& dev = inv.vulkan[d];
    for (const VkHeapBudget& hb : dev.heaps) {
      std::string subj = "vk" + std::to_string(d) + " heap " + std::to_string(hb.heap_index) +
                         (hb.device_local ? " (device-local)" : " (host)");
      l.number("vulkan", subj, "heap_size", Kind::kBytes, hb.heap_size_bytes);
      l.number("vulkan", subj, "budget", Kind::kBytes, hb.budget_bytes);
      l.number("vulkan", subj, "usage", Kind::kBytes, hb.usage_bytes);
    }
  }
  return out;
}

DeviceInventory collect_all(const CollectOptions& options) {
  Env& env = options.env != nullptr ? *options.env : Env::default_env();
  DeviceInventory inv;
  inv.host = HostMemoryProbe(env, options.root).read();
  inv.cgroup = CgroupProbe(env, options.root).read();
  inv.amd = AmdSysfsProbe(env, options.root).read();
  if (options.nvml != nullptr) {
    inv.nvml = options.nvml->read();
  } else {
    NvmlProbe nvml(options.nvml_library);
    inv.nvml = nvml.read();
  }
  if (options.vulkan != nullptr) {
    inv.vulkan = options.vulkan->read();
    if (inv.vulkan.empty()) inv.vulkan_none_reason = "the Vulkan backend reports no devices";
  } else {
    inv.vulkan_none_reason = "no Vulkan backend open (VkMemoryBudgetProbe not provided); see the Vulkan device list";
  }
  inv.findings = make_findings(inv);
  return inv;
}

}  // namespace spw::device
