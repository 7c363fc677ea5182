// Durations as people write them: keep-alive flags, config files and
// requests' keep_alive (Ollama's spelling).
//
// Contract: parse_duration_s() accepts a number of seconds ("300", "1.5",
// "-1") or a sequence of number+unit parts with units h, m, s and ms
// ("5m", "1h30m", "90s", "250ms", "-1m"), a leading '-' for the whole
// duration; surrounding spaces allowed. A negative result means "forever"
// wherever keep-alive is meant, so any negative value is returned as -1.
// InvalidArgument naming the text otherwise (an empty text, an unknown unit,
// a number without digits, NaN/inf, more than kMaxDurationS).
// Thread safety: pure.
#pragma once

#include <string_view>

#include "core/status.h"

namespace spw {

inline constexpr double kMaxDurationS = 10.0 * 365 * 24 * 3600;  // ten years

Result<double> parse_duration_s(std::string_view text);

}  // namespace spw
