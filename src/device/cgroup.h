// CgroupProbe: the memory limits and usage of the cgroup this process runs in.
//
// Contract: read() finds the process's cgroup from /proc/self/cgroup and the
// hierarchy's mount point from /proc/self/mountinfo (falling back to the
// conventional /sys/fs/cgroup, or /sys/fs/cgroup/memory for v1, when mountinfo
// is absent), then reads the memory files of that cgroup directory:
//   cgroup v2 ("0::/path", memory controller enabled): memory.max, memory.high,
//     memory.current, memory.peak, memory.swap.max, memory.events (oom, oom_kill);
//   cgroup v1 (a "memory" controller line), only when v2 has no memory files:
//     memory.limit_in_bytes, memory.usage_in_bytes, memory.max_usage_in_bytes,
//     memory.oom_control (oom_kill). v1 has no memory.high, swap.max or oom
//     count and reports them unknown; a v1 limit of 2^62 bytes or more is the
//     kernel's "unlimited" (it prints LONG_MAX rounded to a page).
// effective_max is the tightest limit of the cgroup and its ancestors up to the
// hierarchy root visible to this process: a parent's memory.max binds its
// children too. When no memory cgroup can be located (no /proc/self/cgroup,
// root cgroup without memory files, controller not enabled) version is 0,
// none_reason says why, and every Reading is unknown with that reason. A file
// that is missing or malformed makes only its own Reading unknown. Sources look
// like "cgroup:/sys/fs/cgroup/app.slice/memory.max" (v1: "cgroup-v1:...") with
// the logical path; reasons name the real path read.
// Thread safety: read() is const and safe to call concurrently if the Env is.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "device/reading.h"

namespace spw::device {

struct CgroupMemory {
  int version = 0;          // 2 or 1; 0 when no memory cgroup was located
  std::string path;         // cgroup path from /proc/self/cgroup, e.g. "/user.slice/app"
  std::string directory;    // logical directory read, e.g. "/sys/fs/cgroup/user.slice/app"
  std::string none_reason;  // why version == 0

  Reading<ByteLimit> max;            // memory.max | memory.limit_in_bytes
  Reading<ByteLimit> effective_max;  // min of max over this cgroup and its ancestors
  Reading<ByteLimit> high;           // memory.high (v2 only)
  Reading<uint64_t> current_bytes;   // memory.current | memory.usage_in_bytes
  Reading<uint64_t> peak_bytes;      // memory.peak (Linux 5.19+) | memory.max_usage_in_bytes
  Reading<ByteLimit> swap_max;       // memory.swap.max (v2 only)
  Reading<uint64_t> oom_events;      // memory.events "oom" (v2 only)
  Reading<uint64_t> oom_kill_events; // memory.events "oom_kill" | memory.oom_control "oom_kill"
};

class CgroupProbe {
 public:
  // `root` is prepended to every path ("/" = this machine). `env` must outlive
  // the probe.
  explicit CgroupProbe(Env& env, std::string root = "/");

  CgroupMemory read() const;

 private:
  Env* env_;
  std::string root_;
};

}  // namespace spw::device
