// AmdSysfsProbe: VRAM and GTT use of AMD GPUs from the amdgpu driver's sysfs
// files under /sys/class/drm/cardN/device/.
//
// Contract: read() lists /sys/class/drm for entries named cardN (connector
// entries like card0-DP-1 and render nodes are ignored), keeps those whose
// device/vendor is 0x1002 and reads mem_info_vram_total, mem_info_vram_used,
// mem_info_gtt_total, mem_info_gtt_used (bytes) and gpu_busy_percent. Cards of
// other vendors, or whose vendor file is unreadable, are listed in `skipped`
// with the reason. A missing or malformed file makes only its own Reading
// unknown; used > total or busy > 100 is treated as malformed. When no AMD card
// is found `gpus` is empty and none_reason says why. Sources are the logical
// sysfs path, prefixed "sysfs:". Listing the directory uses std::filesystem
// under the root (Env has no directory listing); files are read through Env.
// Thread safety: read() is const and safe to call concurrently if the Env is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "device/reading.h"

namespace spw::device {

inline constexpr uint64_t kAmdPciVendor = 0x1002;

struct AmdGpu {
  std::string card;        // "card0"
  std::string device_dir;  // logical, "/sys/class/drm/card0/device"
  Reading<uint64_t> pci_device_id;
  Reading<uint64_t> vram_total_bytes;
  Reading<uint64_t> vram_used_bytes;
  Reading<uint64_t> gtt_total_bytes;
  Reading<uint64_t> gtt_used_bytes;
  Reading<uint64_t> busy_percent;
};

struct AmdSysfsReport {
  std::vector<AmdGpu> gpus;          // ordered by card number
  std::vector<std::string> skipped;  // "card1: vendor 0x8086, not AMD"
  std::string none_reason;           // set when gpus is empty
};

class AmdSysfsProbe {
 public:
  explicit AmdSysfsProbe(Env& env, std::string root = "/");

  AmdSysfsReport read() const;

 private:
  Env* env_;
  std::string root_;
};

}  // namespace spw::device
