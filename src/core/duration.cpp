#include "core/duration.h"

#include <cctype>
#include <cmath>
#include <string>

namespace spw {

Result<double> parse_duration_s(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Status::invalid_argument("duration '" + std::string(text) + "': " + why +
                                    " (seconds, or parts such as 5m, 1h30m, 90s, 250ms; negative: forever)");
  };
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  if (t.empty()) return bad("empty");
  bool negative = false;
  if (t.front() == '-' || t.front() == '+') {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  if (t.empty()) return bad("no number");
  double total = 0;
  bool any_unit = false;
  while (!t.empty()) {
    size_t i = 0;
    bool digits = false;
    while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) {
      digits = digits || t[i] != '.';
      ++i;
    }
    if (!digits) return bad("expected a number");
    const std::string num(t.substr(0, i));
    if (num.find('.') != num.rfind('.')) return bad("a number with two points");
    const double v = std::stod(num);
    t.remove_prefix(i);
    size_t j = 0;
    while (j < t.size() && std::isalpha(static_cast<unsigned char>(t[j]))) ++j;
    const std::string_view unit = t.substr(0, j);
    t.remove_prefix(j);
    double scale = 0;
    if (unit.empty()) {
      if (any_unit || !t.empty()) return bad("a number without a unit after other parts");
      scale = 1;
    } else if (unit == "h") {
      scale = 3600;
    } else if (unit == "m") {
      scale = 60;
    } else if (unit == "s") {
      scale = 1;
    } else if (unit == "ms") {
      scale = 1e-3;
    } else {
      return bad("unknown unit '" + std::string(unit) + "'");
    }
    any_unit = any_unit || !unit.empty();
    total += v * scale;
  }
  if (!std::isfinite(total) || total > kMaxDurationS) return bad("longer than ten years");
  if (negative && total > 0) return -1.0;
  return total;
}

}  // namespace spw
