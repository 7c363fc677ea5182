#include "engine/stop_rules.h"

#include <algorithm>
#include <utility>

namespace spw {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Step StopMatcher::push(std::string_view text) {
  Step step;
  if (stopped_) {
    step.stopped = true;
    return step;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);

  // Earliest complete occurrence of any stop string.
  size_t stop_at = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t pos = buf.find(s);
    if (pos < stop_at) stop_at = pos;
  }
  if (stop_at != std::string::npos) {
    stopped_ = true;
    step.stopped = true;
    buf.resize(stop_at);
    step.emit = std::move(buf);
    return step;
  }

  // Hold the longest suffix that is a proper prefix of some stop string: any
  // occurrence not yet complete must start there (an earlier start would have
  // been found above or is already ruled out).
  size_t hold_from = buf.size();
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, buf.size());
    for (size_t len = max_len; len > 0; --len) {
      const size_t start = buf.size() - len;
      if (start >= hold_from) break;  // a longer hold is already chosen
      if (std::string_view(buf).substr(start) == std::string_view(s).substr(0, len)) {
        hold_from = start;
        break;
      }
    }
  }
  held_ = buf.substr(hold_from);
  buf.resize(hold_from);
  step.emit = std::move(buf);
  return step;
}

std::string StopMatcher::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace spw
