// Env: the process's window onto time, randomness and files.
//
// Every module that reads a clock, draws a seed or touches the filesystem takes
// an Env& so that failover and scheduling logic can run under a simulated clock
// in tests. Env::default_env() is the real one (monotonic clock, /dev/urandom,
// POSIX files, mmap) and lives for the whole process.
// Timed waits (wait_until_ns) are measured on the Env's own clock, so code
// that waits for work or a deadline through its Env runs unchanged under
// core/sim_env.h's simulated clock.
// Thread safety: all methods of the default Env are safe to call concurrently;
// test Envs document their own rules.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/status.h"

namespace spw {

// A read-only view of a whole file. The bytes stay valid while the object lives.
class MappedFile {
 public:
  virtual ~MappedFile() = default;
  virtual const uint8_t* data() const = 0;
  virtual size_t size() const = 0;
  virtual const std::string& path() const = 0;
  // Residency of the bytes (not their content, hence const). page_in() asks
  // the kernel to read the whole range ahead and touches every page, so that
  // it is mapped when the call returns (the time it takes is the page-in cost
  // a first use would pay); page_out() drops this mapping's pages (they fault
  // in again from the page cache or the file on next use). Files that are
  // not kernel mappings (in-memory test files) are always resident: no-ops.
  virtual Status page_in() const { return Status::ok_status(); }
  virtual Status page_out() const { return Status::ok_status(); }
  // page_out() of the whole pages inside [offset, offset + length) (a range
  // whose bytes the process now holds elsewhere, as a repacked copy); the
  // pages the range shares with its neighbours stay. Clamped to the file.
  virtual Status page_out(size_t offset, size_t length) const {
    (void)offset;
    (void)length;
    return Status::ok_status();
  }
  // Whether every page of [offset, offset + length) is in memory now
  // (mincore; always for in-memory files). A hint: pages come and go.
  virtual bool resident(size_t offset, size_t length) const {
    (void)offset;
    (void)length;
    return true;
  }
};

// How map_file maps. prefault: populate the page tables now (MAP_POPULATE:
// reads the file ahead and maps every page), so the bytes are resident before
// the first request instead of faulting in during one; the process's RSS then
// shows the whole mapping, which is what the memory estimate counts.
struct MapOptions {
  bool prefault = false;
};

class Env {
 public:
  virtual ~Env() = default;

  // Monotonic nanoseconds since an arbitrary epoch; never goes backwards.
  virtual int64_t now_ns() = 0;
  // Wall-clock milliseconds since the Unix epoch (for logs and journals only).
  virtual int64_t wall_time_ms() = 0;
  // Nanoseconds the calling thread has run on a CPU (arbitrary epoch), for
  // measurements of work that must not count the time the thread waited for
  // a core (the start-up probes, admission/bandwidth.h and
  // backend/cpu/kernel_probe.h). The real Env reads the thread's CPU clock;
  // by default (a simulated or scripted Env) it is now_ns().
  virtual int64_t thread_cpu_ns() { return now_ns(); }
  virtual void sleep_for_ns(int64_t ns) = 0;

  // Waits on `cv` until notified or until now_ns() reaches `deadline_ns`.
  // `lock` (on the mutex that guards the caller's state) is held on entry and
  // on return, and released while waiting as by std::condition_variable::wait.
  // Returns false when the clock has reached deadline_ns (at once if it
  // already has), true when woken before that; wake-ups may be spurious, so
  // callers loop on their predicate (or use the overload below).
  // The real Env waits on steady_clock; SimEnv on its simulated clock.
  virtual bool wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                             int64_t deadline_ns) = 0;
  // Waits until pred() holds or the deadline passes; returns pred()'s final
  // value (as std::condition_variable::wait_until with a predicate). pred runs
  // with `lock` held.
  template <class Pred>
  bool wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, int64_t deadline_ns,
                     Pred pred) {
    while (!pred()) {
      if (!wait_until_ns(lock, cv, deadline_ns)) return pred();
    }
    return true;
  }

  // A seed-quality random 64-bit value (not for cryptography).
  virtual uint64_t random_u64() = 0;

  // Maps `path` read-only. IOError naming the path and errno text on failure.
  virtual Result<std::unique_ptr<MappedFile>> map_file(const std::string& path, const MapOptions& options) = 0;
  Result<std::unique_ptr<MappedFile>> map_file(const std::string& path) { return map_file(path, MapOptions{}); }
  virtual Result<std::string> read_file(const std::string& path) = 0;
  // Writes atomically: to `path.tmp`, fsync, rename.
  virtual Status write_file(const std::string& path, std::string_view data) = 0;
  virtual bool file_exists(const std::string& path) = 0;

  static Env& default_env();
};

// Wraps a byte buffer as a MappedFile (for tests, fuzzers, generated models).
std::unique_ptr<MappedFile> make_memory_file(std::string bytes, std::string name = "<memory>");

}  // namespace spw
