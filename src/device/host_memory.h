// HostMemoryProbe: host RAM and swap from /proc/meminfo, and this process's
// resident set (now and peak) from /proc/self/status.
//
// Contract: read() returns one Reading per figure, in bytes (the kernel's kB
// values times 1024). A figure is unknown, with a reason naming the file and
// key, when the file cannot be read, the key is absent (MemAvailable needs
// Linux 3.14+), its number is malformed, or it contradicts another figure of the
// same file (MemAvailable > MemTotal, VmHWM < VmRSS): such a file is not
// trusted rather than half-believed. Nothing is estimated. When the root is the
// real "/" and VmHWM is unavailable, the peak comes from getrusage(RUSAGE_SELF)
// (source "getrusage"). Sources name the logical path ("/proc/meminfo")
// whatever the root; reasons name the real path read.
// Thread safety: read() is const and safe to call concurrently if the Env is.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "device/reading.h"

namespace spw::device {

struct HostMemory {
  Reading<uint64_t> mem_total_bytes;      // MemTotal
  Reading<uint64_t> mem_available_bytes;  // MemAvailable (kernel's estimate of what can be allocated without swapping)
  Reading<uint64_t> mem_free_bytes;       // MemFree
  Reading<uint64_t> swap_total_bytes;     // SwapTotal
  Reading<uint64_t> swap_free_bytes;      // SwapFree
  Reading<uint64_t> process_rss_bytes;       // VmRSS of this process
  Reading<uint64_t> process_peak_rss_bytes;  // VmHWM of this process (or getrusage ru_maxrss)
  // VmRSS split: anonymous pages (heap, stacks, KV) and file-backed pages (the
  // mapped model). The file part is page cache the kernel can drop and read
  // back; the anonymous part is what only swap could take.
  Reading<uint64_t> process_rss_anon_bytes;  // RssAnon
  Reading<uint64_t> process_rss_file_bytes;  // RssFile
};

class HostMemoryProbe {
 public:
  // `root` is prepended to every path: "/" reads this machine, a fixture
  // directory reads a fake one. `env` must outlive the probe.
  explicit HostMemoryProbe(Env& env, std::string root = "/");

  HostMemory read() const;

  // Resident bytes of this process's mappings of the file `path` (the sum of
  // "Rss:" over its /proc/self/smaps entries): how much of a mapped model is
  // in memory now. On the real root the path is made canonical first (smaps
  // names files that way). Unknown, with the reason, when smaps cannot be read
  // or parsed, or no mapping of the file exists.
  Reading<uint64_t> mapped_rss(const std::string& path) const;

 private:
  Env* env_;
  std::string root_;
};

}  // namespace spw::device
