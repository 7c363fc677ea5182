#include "device/host_memory.h"

#include <sys/resource.h>

#include <utility>

#include "device/text_parse.h"

namespace spw::device {
namespace {

constexpr const char* kMeminfo = "/proc/meminfo";
constexpr const char* kSelfStatus = "/proc/self/status";

bool is_real_root(const std::string& root) { return trim(root) == "/" || trim(root).empty(); }

template <typename... T>
void set_all_unknown(const std::string& reason, T&... readings) {
  ((readings = Reading<uint64_t>::unknown(reason)), ...);
}

// Marks `r` unknown when it exceeds `bound` (both known): a file that says
// "more available than total" is inconsistent and neither figure is safe.
void check_not_above(Reading<uint64_t>& r, const char* r_name, const Reading<uint64_t>& bound,
                     const char* bound_name, const char* file) {
  if (!r.known() || !bound.known() || r.value() <= bound.value()) return;
  r = Reading<uint64_t>::unknown(std::string(r_name) + " (" + std::to_string(r.value()) + " bytes) exceeds " +
                                 bound_name + " (" + std::to_string(bound.value()) + " bytes) in " + file);
}

}  // namespace

HostMemoryProbe::HostMemoryProbe(Env& env, std::string root) : env_(&env), root_(std::move(root)) {}

HostMemory HostMemoryProbe::read() const {
  HostMemory m;
  const std::string meminfo_src = kMeminfo;
  auto meminfo = env_->read_file(join_root(root_, kMeminfo));
  if (!meminfo.ok()) {
    set_all_unknown(meminfo.status().message(), m.mem_total_bytes, m.mem_available_bytes, m.mem_free_bytes,
                    m.swap_total_bytes, m.swap_free_bytes);
  } else {
    auto f = parse_colon_lines(*meminfo);
    m.mem_total_bytes = kb_field(f, "MemTotal", meminfo_src);
    m.mem_available_bytes = kb_field(f, "MemAvailable", meminfo_src);
    m.mem_free_bytes = kb_field(f, "MemFree", meminfo_src);
    m.swap_total_bytes = kb_field(f, "SwapTotal", meminfo_src);
    m.swap_free_bytes = kb_field(f, "SwapFree", meminfo_src);
    if (m.mem_total_bytes.known() && m.mem_total_bytes.value() == 0) {
      m.mem_total_bytes = Reading<uint64_t>::unknown("MemTotal is 0 in /proc/meminfo");
    }
    check_not_above(m.mem_available_bytes, "MemAvailable", m.mem_total_bytes, "MemTotal", kMeminfo);
    check_not_above(m.mem_free_bytes, "MemFree", m.mem_total_bytes, "MemTotal", kMeminfo);
    check_not_above(m.swap_free_bytes, "SwapFree", m.swap_total_bytes, "SwapTotal", kMeminfo);
  }

  const std::string status_src = kSelfStatus;
  auto status = env_->read_file(join_root(root_, kSelfStatus));
  if (!status.ok()) {
    set_all_unknown(status.status().message(), m.process_rss_bytes, m.process_peak_rss_bytes,
                    m.process_rss_anon_bytes, m.process_rss_file_bytes);
  } else {
    auto f = parse_colon_lines(*status);
    m.process_rss_bytes = kb_field(f, "VmRSS", status_src);
    m.process_peak_rss_bytes = kb_field(f, "VmHWM", status_src);
    m.process_rss_anon_bytes = kb_field(f, "RssAnon", status_src);
    m.process_rss_file_bytes = kb_field(f, "RssFile", status_src);
    // The kernel computes VmHWM as max(recorded peak, current RSS), so a lower
    // peak means the file is not what it claims to be.
    if (m.process_rss_bytes.known() && m.process_peak_rss_bytes.known() &&
        m.process_peak_rss_bytes.value() < m.process_rss_bytes.value()) {
      m.process_peak_rss_bytes = Reading<uint64_t>::unknown(
          "VmHWM (" + std::to_string(m.process_peak_rss_bytes.value()) + " bytes) is below VmRSS (" +
          std::to_string(m.process_rss_bytes.value()) + " bytes) in /proc/self/status");
    }
  }
  if (!m.process_peak_rss_bytes.known() && is_real_root(root_)) {
    struct rusage ru {};
    if (::getrusage(RUSAGE_SELF, &ru) == 0 && ru.ru_maxrss > 0) {
      // Linux reports ru_maxrss in kilobytes.
      m.process_peak_rss_bytes = Reading<uint64_t>::of(static_cast<uint64_t>(ru.ru_maxrss) * 1024, "getrusage");
    }
  }
  return m;
}

}  // namespace spw::device
