#include "device/amd_sysfs.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "device/text_parse.h"

namespace spw::device {
namespace {

constexpr const char* kDrmDir = "/sys/class/drm";

// "card12" -> 12; -1 for anything else ("card0-DP-1", "renderD128", "version").
int card_number(const std::string& name) {
  if (name.size() < 5 || name.compare(0, 4, "card") != 0 || name.size() > 12) return -1;
  int n = 0;
  for (size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%04llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

AmdSysfsProbe::AmdSysfsProbe(Env& env, std::string root) : env_(&env), root_(std::move(root)) {}

AmdSysfsReport AmdSysfsProbe::read() const {
  AmdSysfsReport report;
  std::error_code ec;
  const std::string drm_real = join_root(root_, kDrmDir);
  std::filesystem::directory_iterator it(drm_real, ec);
  if (ec) {
    report.none_reason = "cannot list " + drm_real + ": " + ec.message();
    return report;
  }
  std::vector<std::pair<int, std::string>> cards;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    std::string name = it->path().filename().string();
    int n = card_number(name);
    if (n >= 0) cards.emplace_back(n, name);
  }
  if (ec) {
    report.none_reason = "error listing " + drm_real + ": " + ec.message();
    return report;
  }
  std::sort(cards.begin(), cards.end());

  for (const auto& [n, card] : cards) {
    const std::string dir = std::string(kDrmDir) + "/" + card + "/device";
    auto read_text = [&](const std::string& file) { return env_->read_file(join_root(root_, dir + "/" + file)); };
    auto vendor_text = read_text("vendor");
    if (!vendor_text.ok()) {
      report.skipped.push_back(card + ": " + vendor_text.status().message());
      continue;
    }
    auto vendor = parse_hex_u64(*vendor_text);
    if (!vendor.ok()) {
      report.skipped.push_back(card + ": " + dir + "/vendor: " + vendor.status().message());
      continue;
    }
    if (*vendor != kAmdPciVendor) {
      report.skipped.push_back(card + ": vendor " + hex(*vendor) + ", not AMD");
      continue;
    }
    auto number = [&](const std::string& file, bool is_hex) {
      auto t = read_text(file);
      if (!t.ok()) return Reading<uint64_t>::unknown(t.status().message());
      auto v = is_hex ? parse_hex_u64(*t) : parse_u64(*t);
      if (!v.ok()) return Reading<uint64_t>::unknown(dir + "/" + file + ": " + v.status().message());
      return Reading<uint64_t>::of(*v, "sysfs:" + dir + "/" + file);
    };
    auto used_within = [&](Reading<uint64_t>& used, const Reading<uint64_t>& total, const char* what) {
      if (used.known() && total.known() && used.value() > total.value()) {
        used = Reading<uint64_t>::unknown(std::string(what) + " used (" + std::to_string(used.value()) +
                                          ") exceeds total (" + std::to_string(total.value()) + ") in " + dir);
      }
    };
    AmdGpu g;
    g.card = card;
    g.device_dir = dir;
    g.pci_device_id = number("device", true);
    g.vram_total_bytes = number("mem_info_vram_total", false);
    g.vram_used_bytes = number("mem_info_vram_used", false);
    g.gtt_total_bytes = number("mem_info_gtt_total", false);
    g.gtt_used_bytes = number("mem_info_gtt_used", false);
    g.busy_percent = number("gpu_busy_percent", false);
    used_within(g.vram_used_bytes, g.vram_total_bytes, "VRAM");
    used_within(g.gtt_used_bytes, g.gtt_total_bytes, "GTT");
    if (g.busy_percent.known() && g.busy_percent.value() > 100) {
      g.busy_percent = Reading<uint64_t>::unknown("gpu_busy_percent " + std::to_string(g.busy_percent.value()) +
                                                  " is above 100 in " + dir);
    }
    report.gpus.push_back(std::move(g));
  }
  if (report.gpus.empty()) {
    report.none_reason = cards.empty() ? "no cardN entries in " + std::string(kDrmDir)
                                       : "no card with vendor 0x1002 in " + std::string(kDrmDir);
  }
  return report;
}

}  // namespace spw::device
