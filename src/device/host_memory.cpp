#include "device/host_memory.h"

#include <sys/resource.h>

#include <filesystem>
#include <utility>

#include "device/text_parse.h"

namespace spw::device {
namespace {

constexpr const char* kMeminfo = "/proc/meminfo";
constexpr const char* kSelfStatus = "/proc/self/status";
constexpr const char* kSelfSmaps = "/proc/self/smaps";

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

Reading<uint64_t> HostMemoryProbe::mapped_rss(const std::string& path) const {
  std::string want = path;
  if (is_real_root(root_)) {
    std::error_code ec;
    auto canon = std::filesystem::canonical(path, ec);
    if (ec) return Reading<uint64_t>::unknown("cannot resolve '" + path + "': " + ec.message());
    want = canon.string();
  }
  auto smaps = env_->read_file(join_root(root_, kSelfSmaps));
  if (!smaps.ok()) return Reading<uint64_t>::unknown(smaps.status().message());
  // An entry is a header line "start-end perms offset dev inode   pathname"
  // followed by "Key:  N kB" lines; the pathname is the rest of the header
  // after the fifth field.
  uint64_t total = 0;
  int entries = 0;
  bool in_file = false;
  std::string_view text = *smaps;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const size_t colon = line.find(':');
    const size_t space = line.find(' ');
    if (space != std::string_view::npos && (colon == std::string_view::npos || colon > space)) {
      // A header: skip five fields, the rest is the pathname.
      std::string_view rest = line;
      for (int f = 0; f < 5 && !rest.empty(); ++f) {
        rest = trim(rest);
        const size_t sp = rest.find(' ');
        rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp);
      }
      in_file = trim(rest) == want;
      if (in_file) ++entries;
      continue;
    }
    if (!in_file || line.substr(0, colon) != "Rss") continue;
    auto kb = parse_kb_value(line.substr(colon + 1));
    if (!kb.ok()) return Reading<uint64_t>::unknown("Rss of '" + want + "' in " + std::string(kSelfSmaps) + ": " +
                                                    kb.status().message());
    total += *kb;
  }
  if (entries == 0) return Reading<uint64_t>::unknown("'" + want + "' is not mapped (" + kSelfSmaps + ")");
  return Reading<uint64_t>::of(total, kSelfSmaps);
}

}  // namespace spw::device
