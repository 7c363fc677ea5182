// StopMatcher: finds stop strings in streamed text without ever showing them.
//
// Contract: push() receives decoded text as it is produced. Text that could
// still be the beginning of a stop string is held back; everything before it is
// returned in Step::emit. When a stop string occurs (possibly split across many
// pushes, possibly overlapping other candidates), the earliest occurrence in the
// stream wins: Step::stopped is true, emit holds the text before it, and the
// stop string and anything after it are discarded. After a stop, further
// push() calls return {"", true}. flush() ends a generation that did not stop
// and returns the held-back text. held()/set_held() save and restore the
// held-back text for a checkpoint (the stopped flag is not part of it: a
// checkpoint is only taken while generation runs). Empty stop strings are
// ignored. Works on bytes: since stop strings and pushed text are UTF-8, a held
// boundary always falls on a character boundary.
// Thread safety: none; one matcher per generation.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace spw {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop_strings);

  struct Step {
    std::string emit;
    bool stopped = false;
  };
  // Feeds newly decoded text. `emit` is text now safe to show; when `stopped`,
  // emit is the text before the stop string and the rest is discarded.
  Step push(std::string_view text);
  // End of generation without a stop: returns the held-back text.
  std::string flush();

  const std::string& held() const { return held_; }  // part of a checkpoint
  void set_held(std::string held) { held_ = std::move(held); }

  const std::vector<std::string>& stop_strings() const { return stops_; }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace spw
