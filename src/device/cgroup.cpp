#include "device/cgroup.h"

#include <utility>
#include <vector>

#include "device/text_parse.h"

namespace spw::device {
namespace {

constexpr const char* kSelfCgroup = "/proc/self/cgroup";
constexpr const char* kSelfMountinfo = "/proc/self/mountinfo";
// v1 prints "unlimited" as LONG_MAX rounded down to a page; no real limit is
// anywhere near 4 EiB.
constexpr uint64_t kV1UnlimitedAtLeast = uint64_t{1} << 62;

struct Located {
  bool ok = false;
  std::string path;       // cgroup path
  std::string directory;  // logical directory
  std::string mount_point;
  std::string reason;
};

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (true) {
    size_t end = s.find(sep, pos);
    if (end == std::string_view::npos) {
      out.push_back(s.substr(pos));
      return out;
    }
    out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_octal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      char a = s[i + 1], b = s[i + 2], c = s[i + 3];
      if (a >= '0' && a <= '3' && b >= '0' && b <= '7' && c >= '0' && c <= '7') {
        out += static_cast<char>((a - '0') * 64 + (b - '0') * 8 + (c - '0'));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

struct Mount {
  bool found = false;
  std::string root;         // the hierarchy path mounted there
  std::string mount_point;  // where
};

struct Mounts {
  Mount v2;
  Mount v1_memory;
};

Mounts parse_mountinfo(std::string_view text) {
  Mounts m;
  for (std::string_view line : split(text, '\n')) {
    std::vector<std::string_view> f;
    for (std::string_view t : split(trim(line), ' ')) {
      if (!t.empty()) f.push_back(t);
    }
    size_t dash = 0;
    for (size_t i = 6; i < f.size(); ++i) {
      if (f[i] == "-") {
        dash = i;
        break;
      }
    }
    if (dash == 0 || dash + 1 >= f.size()) continue;  // not a mountinfo line
    std::string_view fstype = f[dash + 1];
    std::string_view superopts = dash + 3 < f.size() ? f[dash + 3] : std::string_view();
    Mount mount{true, unescape_octal(f[3]), unescape_octal(f[4])};
    if (fstype == "cgroup2" && !m.v2.found) {
      m.v2 = mount;
    } else if (fstype == "cgroup" && !m.v1_memory.found) {
      for (std::string_view opt : split(superopts, ',')) {
        if (opt == "memory") m.v1_memory = mount;
      }
    }
  }
  return m;
}

std::string parent_dir(const std::string& p) {
  size_t slash = p.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return p.substr(0, slash);
}

class Reader {
 public:
  Reader(Env& env, const std::string& root, std::string prefix) : env_(env), root_(root), prefix_(std::move(prefix)) {}

  Result<std::string> text(const std::string& logical) { return env_.read_file(join_root(root_, logical)); }
  bool exists(const std::string& logical) { return env_.file_exists(join_root(root_, logical)); }
  std::string source(const std::string& logical) const { return prefix_ + logical; }

  Reading<uint64_t> u64(const std::string& logical) {
    auto t = text(logical);
    if (!t.ok()) return Reading<uint64_t>::unknown(t.status().message());
    auto v = parse_u64(*t);
    if (!v.ok()) return Reading<uint64_t>::unknown(logical + ": " + v.status().message());
    return Reading<uint64_t>::of(*v, source(logical));
  }

  Reading<ByteLimit> limit(const std::string& logical, bool v1) {
    if (v1) {
      Reading<uint64_t> n = u64(logical);
      if (!n.known()) return Reading<ByteLimit>::unknown(n.reason());
      ByteLimit l = n.value() >= kV1UnlimitedAtLeast ? ByteLimit::none() : ByteLimit::of(n.value());
      return Reading<ByteLimit>::of(l, n.source());
    }
    auto t = text(logical);
    if (!t.ok()) return Reading<ByteLimit>::unknown(t.status().message());
    auto v = parse_cgroup_limit(*t);
    if (!v.ok()) return Reading<ByteLimit>::unknown(logical + ": " + v.status().message());
    return Reading<ByteLimit>::of(*v, source(logical));
  }

  Reading<uint64_t> keyed(const std::string& logical, const std::string& key) {
    auto t = text(logical);
    if (!t.ok()) return Reading<uint64_t>::unknown(t.status().message());
    auto fields = parse_space_lines(*t);
    auto it = fields.find(key);
    if (it == fields.end()) return Reading<uint64_t>::unknown("'" + key + "' not found in " + logical);
    auto v = parse_u64(it->second);
    if (!v.ok()) return Reading<uint64_t>::unknown(logical + " '" + key + "': " + v.status().message());
    return Reading<uint64_t>::of(*v, source(logical) + " " + key);
  }

 private:
  Env& env_;
  const std::string& root_;
  std::string prefix_;
};

// Maps a cgroup path onto the directory where its hierarchy is mounted.
Located locate(Reader& r, const std::string& cgroup_path, const Mount& mount, const char* default_mount,
               const char* probe_file, const char* what) {
  Located l;
  l.path = cgroup_path;
  std::string mount_root = mount.found ? mount.root : "/";
  l.mount_point = mount.found ? mount.mount_point : default_mount;
  if (cgroup_path.empty() || cgroup_path.front() != '/' || cgroup_path.find("/..") != std::string::npos) {
    l.reason = std::string(what) + " path '" + cgroup_path + "' in /proc/self/cgroup is not below this namespace's root";
    return l;
  }
  std::string rel;
  if (mount_root == "/") {
    rel = cgroup_path == "/" ? "" : cgroup_path;
  } else if (cgroup_path == mount_root) {
    rel = "";
  } else if (cgroup_path.compare(0, mount_root.size() + 1, mount_root + "/") == 0) {
    rel = cgroup_path.substr(mount_root.size());
  } else {
    l.reason = std::string(what) + " path '" + cgroup_path + "' is outside the mounted hierarchy root '" +
               mount_root + "' at " + l.mount_point;
    return l;
  }
  l.directory = l.mount_point + rel;
  if (!r.exists(l.directory + "/" + probe_file)) {
    l.reason = std::string("no ") + probe_file + " in " + l.directory + " (" + what +
               (rel.empty() ? " root cgroup, or memory controller not enabled)" : " memory controller not enabled)");
    return l;
  }
  l.ok = true;
  return l;
}

// The tightest limit from `dir` up to `top` (inclusive); levels without the
// file (the hierarchy root) are skipped.
Reading<ByteLimit> effective_limit(Reader& r, const std::string& dir, const std::string& top, const char* file,
                                   bool v1) {
  Reading<ByteLimit> best;
  std::string level = dir;
  for (int depth = 0; depth < 64; ++depth) {
    std::string f = level + "/" + file;
    if (r.exists(f)) {
      Reading<ByteLimit> l = r.limit(f, v1);
      if (!l.known()) return Reading<ByteLimit>::unknown("ancestor limit unreadable: " + l.reason());
      if (!best.known() || (!l.value().unlimited && (best.value().unlimited || l.value().bytes < best.value().bytes))) {
        best = l;
      }
    }
    if (level == top || level.size() <= top.size() || level == "/") break;
    level = parent_dir(level);
  }
  if (!best.known()) return Reading<ByteLimit>::unknown(std::string("no ") + file + " readable in " + dir + " or its ancestors");
  return best;
}

void set_unknown(CgroupMemory& m, const std::string& reason) {
  m.max = m.effective_max = m.high = m.swap_max = Reading<ByteLimit>::unknown(reason);
  m.current_bytes = m.peak_bytes = m.oom_events = m.oom_kill_events = Reading<uint64_t>::unknown(reason);
}

}  // namespace

CgroupProbe::CgroupProbe(Env& env, std::string root) : env_(&env), root_(std::move(root)) {}

CgroupMemory CgroupProbe::read() const {
  CgroupMemory m;
  auto cg = env_->read_file(join_root(root_, kSelfCgroup));
  if (!cg.ok()) {
    m.none_reason = cg.status().message();
    set_unknown(m, m.none_reason);
    return m;
  }
  bool have_v2 = false, have_v1 = false;
  std::string v2_path, v1_path;
  for (std::string_view line : split(*cg, '\n')) {
    line = trim(line);
    size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view id = line.substr(0, c1);
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string_view path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {
      have_v2 = true;
      v2_path = std::string(path);
    } else {
      for (std::string_view c : split(controllers, ',')) {
        if (c == "memory" && !have_v1) {
          have_v1 = true;
          v1_path = std::string(path);
        }
      }
    }
  }
  if (!have_v2 && !have_v1) {
    m.none_reason = "no cgroup v2 ('0::') or v1 memory line in /proc/self/cgroup";
    set_unknown(m, m.none_reason);
    return m;
  }

  Mounts mounts;
  auto mi = env_->read_file(join_root(root_, kSelfMountinfo));
  if (mi.ok()) mounts = parse_mountinfo(*mi);

  std::string reasons;
  if (have_v2) {
    Reader r(*env_, root_, "cgroup:");
    if (mi.ok() && !mounts.v2.found) {
      reasons = "no cgroup2 filesystem in /proc/self/mountinfo";
    } else {
      Located l = locate(r, v2_path, mounts.v2, "/sys/fs/cgroup", "memory.max", "cgroup v2");
      if (l.ok) {
        m.version = 2;
        m.path = l.path;
        m.directory = l.directory;
        const std::string d = l.directory + "/";
        m.max = r.limit(d + "memory.max", false);
        m.effective_max = effective_limit(r, l.directory, l.mount_point, "memory.max", false);
        m.high = r.limit(d + "memory.high", false);
        m.current_bytes = r.u64(d + "memory.current");
        m.peak_bytes = r.u64(d + "memory.peak");
        m.swap_max = r.limit(d + "memory.swap.max", false);
        m.oom_events = r.keyed(d + "memory.events", "oom");
        m.oom_kill_events = r.keyed(d + "memory.events", "oom_kill");
        return m;
      }
      reasons = l.reason;
    }
  }
  if (have_v1) {
    Reader r(*env_, root_, "cgroup-v1:");
    std::string why;
    if (mi.ok() && !mounts.v1_memory.found) {
      why = "no cgroup v1 memory filesystem in /proc/self/mountinfo";
    } else {
      Located l = locate(r, v1_path, mounts.v1_memory, "/sys/fs/cgroup/memory", "memory.limit_in_bytes",
                         "cgroup v1");
      if (l.ok) {
        m.version = 1;
        m.path = l.path;
        m.directory = l.directory;
        const std::string d = l.directory + "/";
        m.max = r.limit(d + "memory.limit_in_bytes", true);
        m.effective_max = effective_limit(r, l.directory, l.mount_point, "memory.limit_in_bytes", true);
        m.high = Reading<ByteLimit>::unknown("cgroup v1 has no memory.high");
        m.current_bytes = r.u64(d + "memory.usage_in_bytes");
        m.peak_bytes = r.u64(d + "memory.max_usage_in_bytes");
        m.swap_max = Reading<ByteLimit>::unknown("cgroup v1 has no memory.swap.max (memsw counts memory+swap)");
        m.oom_events = Reading<uint64_t>::unknown("cgroup v1 has no oom event count");
        m.oom_kill_events = r.keyed(d + "memory.oom_control", "oom_kill");
        return m;
      }
      why = l.reason;
    }
    reasons += (reasons.empty() ? "" : "; ") + why;
  }
  m.none_reason = reasons;
  set_unknown(m, m.none_reason);
  return m;
}

}  // namespace spw::device
