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
//
// "Earliest" means among the occurrences complete in the text known so far:
// when a push completes several, the one that starts first wins, even if a
// shorter one ends before it. The held text is exactly the longest suffix of
// the text so far that is a proper prefix of some stop string, so it is
// shorter than the longest stop string.
//
// Cost: the stop strings are compiled once, in the constructor, into an
// Aho-Corasick automaton (memory linear in their total length). push() then
// costs O(bytes pushed + bytes emitted) amortised over a generation, however
// long or many the stop strings are: a hostile 1 MB stop string makes the
// constructor slower, never each token. set_held() costs O(its length) once.
// held() builds its string from the automaton state (O(held_size())): use
// held_size() on a per-token path.
// Thread safety: none; one matcher per generation.
#pragma once

#include <cstddef>
#include <cstdint>
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

  // The held-back text (part of a checkpoint). The reference stays valid
  // until the next call on this matcher.
  const std::string& held() const;
  size_t held_size() const { return held_prefix_.size() + nodes_[state_].depth; }
  // Restores held-back text saved by held(). Any text is accepted (a
  // checkpoint from elsewhere): the next push() treats it exactly as if it
  // had been held, stop strings inside it included.
  void set_held(std::string held);

  const std::vector<std::string>& stop_strings() const { return stops_; }
  bool stopped() const { return stopped_; }

  // For tests: automaton transitions (goto and failure links) taken so far.
  // Bounded by twice the bytes pushed and restored, whatever the stop strings.
  uint64_t transitions() const { return transitions_; }

 private:
  static constexpr uint32_t kRoot = 0;
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // A trie node: the prefix of stops_[pattern] of length `depth`.
  struct Node {
    uint32_t depth = 0;
    uint32_t pattern = 0;
    uint32_t fail = kRoot;  // longest proper suffix of this prefix that is a node
    // Length of the longest stop string ending here (this node's or one on
    // its failure chain); 0 if none.
    uint32_t match_len = 0;
  };

  void build();
  // The child of `node` on `byte`, or kRoot when there is none.
  uint32_t child(uint32_t node, unsigned char byte) const;
  // Goto/failure transition on one byte.
  uint32_t next(uint32_t node, unsigned char byte);
  // Appends the first `n` bytes of held text + `text` (the held text being
  // held_prefix_ followed by the prefix node `held_node` stands for) to out.
  void append_front(std::string& out, size_t n, uint32_t held_node, std::string_view text) const;

  std::vector<std::string> stops_;
  std::vector<Node> nodes_;
  // Children of node i are edge_label_/edge_target_[edge_begin_[i], edge_begin_[i + 1]),
  // sorted by label: sparse, so memory stays linear in the stop strings' bytes.
  std::vector<uint32_t> edge_begin_;
  std::vector<unsigned char> edge_label_;
  std::vector<uint32_t> edge_target_;

  // The held text is held_prefix_ followed by the prefix nodes_[state_]
  // stands for. held_prefix_ is empty except after set_held() with text that
  // is not itself such a prefix (it is emitted, or stopped in, by the next push).
  uint32_t state_ = kRoot;
  std::string held_prefix_;
  // After set_held(): where the earliest stop string inside the held text
  // starts (kNone: there is none).
  size_t pending_stop_ = kNone;
  bool stopped_ = false;
  uint64_t transitions_ = 0;
  mutable std::string held_text_;  // held()'s result
};

}  // namespace spw
