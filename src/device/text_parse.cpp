#include "device/text_parse.h"

#include <limits>

namespace spw::device {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Quotes at most 40 characters of bad input so a garbage file cannot flood a log.
std::string quoted(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out = "'";
  out += s.substr(0, kMax);
  if (s.size() > kMax) out += "...";
  out += "'";
  return out;
}

template <typename Fn>
std::map<std::string, std::string, std::less<>> parse_lines(std::string_view text, Fn split) {
  std::map<std::string, std::string, std::less<>> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    size_t sep = split(line);
    if (sep == std::string_view::npos) continue;
    std::string_view key = trim(line.substr(0, sep));
    if (key.empty()) continue;
    out.emplace(std::string(key), std::string(trim(line.substr(sep + 1))));  // first wins
  }
  return out;
}

}  // namespace

std::string join_root(std::string_view root, std::string_view abs_path) {
  while (!root.empty() && root.back() == '/') root.remove_suffix(1);
  std::string out(root);
  if (abs_path.empty() || abs_path.front() != '/') out += '/';
  out += abs_path;
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

Result<uint64_t> parse_u64(std::string_view text) {
  std::string_view t = trim(text);
  if (t.empty()) return Status::invalid_argument("empty number");
  uint64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return Status::invalid_argument("not an unsigned decimal: " + quoted(t));
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
      return Status::invalid_argument("number overflows 64 bits: " + quoted(t));
    }
    v = v * 10 + d;
  }
  return v;
}

Result<uint64_t> parse_hex_u64(std::string_view text) {
  std::string_view t = trim(text);
  if (t.size() < 3 || t[0] != '0' || (t[1] != 'x' && t[1] != 'X')) {
    return Status::invalid_argument("not a 0x-prefixed hex number: " + quoted(t));
  }
  t.remove_prefix(2);
  if (t.size() > 16) return Status::invalid_argument("hex number overflows 64 bits: " + quoted(t));
  uint64_t v = 0;
  for (char c : t) {
    uint64_t d;
    if (c >= '0' && c <= '9') d = static_cast<uint64_t>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<uint64_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<uint64_t>(c - 'A' + 10);
    else return Status::invalid_argument("not a hex number: " + quoted(t));
    v = (v << 4) | d;
  }
  return v;
}

Result<ByteLimit> parse_cgroup_limit(std::string_view text) {
  std::string_view t = trim(text);
  if (t == "max") return ByteLimit::none();
  auto n = parse_u64(t);
  if (!n.ok()) return Status::invalid_argument("expected 'max' or bytes: " + n.status().message());
  return ByteLimit::of(*n);
}

std::map<std::string, std::string, std::less<>> parse_colon_lines(std::string_view text) {
  return parse_lines(text, [](std::string_view line) { return line.find(':'); });
}

std::map<std::string, std::string, std::less<>> parse_space_lines(std::string_view text) {
  return parse_lines(text, [](std::string_view line) {
    std::string_view t = trim(line);
    size_t lead = static_cast<size_t>(t.data() - line.data());
    size_t sep = t.find_first_of(" \t");
    return sep == std::string_view::npos ? sep : lead + sep;
  });
}

Result<uint64_t> parse_kb_value(std::string_view value) {
  std::string_view t = trim(value);
  size_t sp = t.find_first_of(" \t");
  if (sp == std::string_view::npos) return Status::invalid_argument("no 'kB' unit in " + quoted(t));
  std::string_view unit = trim(t.substr(sp));
  if (unit != "kB") return Status::invalid_argument("unit is not 'kB' in " + quoted(t));
  SPW_ASSIGN_OR_RETURN(uint64_t kb, parse_u64(t.substr(0, sp)));
  if (kb > std::numeric_limits<uint64_t>::max() / 1024) {
    return Status::invalid_argument("kB value overflows 64-bit bytes: " + quoted(t));
  }
  return kb * 1024;
}

Reading<uint64_t> kb_field(const std::map<std::string, std::string, std::less<>>& fields,
                           std::string_view key, const std::string& source) {
  auto it = fields.find(key);
  if (it == fields.end()) {
    return Reading<uint64_t>::unknown(std::string(key) + " not found in " + source);
  }
  auto bytes = parse_kb_value(it->second);
  if (!bytes.ok()) {
    return Reading<uint64_t>::unknown(std::string(key) + " in " + source + ": " + bytes.status().message());
  }
  return Reading<uint64_t>::of(*bytes, source);
}

}  // namespace spw::device
