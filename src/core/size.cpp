#include "core/size.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>

namespace spw {

Result<uint64_t> parse_byte_size(std::string_view text, bool allow_zero) {
  auto bad = [&] {
    return Status::invalid_argument("size '" + std::string(text) + "': expected e.g. 512M, 1.5GiB or a byte count" +
                                    (allow_zero ? "" : " above 0"));
  };
  std::string s(text);
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }), s.end());
  // The number is digits and at most one point (strtod alone would also
  // take a sign, an exponent, "inf", "nan" or hex).
  size_t n = 0;
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.')) ++n;
  const std::string number = s.substr(0, n);
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) return bad();
  const double v = std::strtod(number.c_str(), nullptr);
  std::string suf = s.substr(n);
  for (char& c : suf) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (!suf.empty() && std::string_view("KMGT").find(suf[0]) != std::string_view::npos) {
    for (char c : std::string_view("KMGT")) {
      mult *= 1024;
      if (c == suf[0]) break;
    }
    suf.erase(0, 1);
    if (suf == "IB" || suf == "B") suf.clear();
  } else if (suf == "B") {
    suf.clear();
  }
  if (!suf.empty()) return bad();
  const double bytes = std::round(v * mult);
  if (bytes < 1 && !allow_zero) return bad();
  // Compared as a double before the conversion (a double beyond 2^64 has no
  // defined conversion); kMaxByteSize is a power of two, exact in a double.
  if (bytes > static_cast<double>(kMaxByteSize)) {
    return Status::invalid_argument("size '" + std::string(text) + "': more than the largest size accepted, " +
                                    std::to_string(kMaxByteSize) + " bytes (1 PiB)");
  }
  return static_cast<uint64_t>(bytes);
}

Status check_byte_size(uint64_t bytes, std::string_view what, bool allow_zero) {
  if (bytes == 0 && !allow_zero) return Status::invalid_argument(std::string(what) + ": must be above 0 bytes");
  if (bytes > kMaxByteSize) {
    return Status::invalid_argument(std::string(what) + ": " + std::to_string(bytes) +
                                    " bytes is more than the largest size accepted, " + std::to_string(kMaxByteSize) +
                                    " bytes (1 PiB)");
  }
  return Status();
}

std::string format_byte_size(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, kUnits[u]);
  return buf;
}

}  // namespace spw
