#include "engine/stop_rules.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace spw {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
  build();
}

void StopMatcher::build() {
  // The trie is built from the stop strings in sorted order: a string then
  // shares with the trie exactly its common prefix with the previous one
  // (strings with a common prefix are adjacent when sorted), so no child
  // lookup is needed while building, and each node's children are created in
  // increasing byte order, which the edge arrays below rely on.
  std::vector<uint32_t> order(stops_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [this](uint32_t a, uint32_t b) { return stops_[a] < stops_[b]; });
  size_t total = 0;
  for (const std::string& s : stops_) total += s.size();
  nodes_.reserve(total + 1);
  std::vector<uint32_t> parent;
  std::vector<unsigned char> label;
  parent.reserve(total + 1);
  label.reserve(total + 1);
  nodes_.push_back(Node{});
  parent.push_back(kRoot);
  label.push_back(0);
  std::vector<uint32_t> path{kRoot};  // path[d]: the node at depth d of the previous string
  const std::string* prev = nullptr;
  for (const uint32_t p : order) {
    const std::string& s = stops_[p];
    size_t common = 0;
    if (prev != nullptr) {
      const size_t n = std::min(prev->size(), s.size());
      while (common < n && (*prev)[common] == s[common]) ++common;
    }
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      Node node;
      node.depth = static_cast<uint32_t>(d + 1);
      node.pattern = p;
      nodes_.push_back(node);
      parent.push_back(path[d]);
      label.push_back(static_cast<unsigned char>(s[d]));
      path.push_back(static_cast<uint32_t>(nodes_.size() - 1));
    }
    nodes_[path[s.size()]].match_len = static_cast<uint32_t>(s.size());
    prev = &s;
  }

  // Edges grouped by parent; within a parent in creation order, i.e. by byte.
  const size_t n = nodes_.size();
  edge_begin_.assign(n + 1, 0);
  for (size_t v = 1; v < n; ++v) ++edge_begin_[parent[v] + 1];
  for (size_t i = 0; i < n; ++i) edge_begin_[i + 1] += edge_begin_[i];
  edge_label_.resize(n - 1);
  edge_target_.resize(n - 1);
  std::vector<uint32_t> fill(edge_begin_.begin(), edge_begin_.end() - 1);
  for (size_t v = 1; v < n; ++v) {
    const uint32_t e = fill[parent[v]]++;
    edge_label_[e] = label[v];
    edge_target_[e] = static_cast<uint32_t>(v);
  }

  // Failure links breadth first: a node's link is shallower, so it (and its
  // match_len) is final before the node is reached.
  std::vector<uint32_t> queue;
  queue.reserve(n);
  queue.push_back(kRoot);
  for (size_t head = 0; head < queue.size(); ++head) {
    const uint32_t u = queue[head];
    for (uint32_t e = edge_begin_[u]; e < edge_begin_[u + 1]; ++e) {
      const uint32_t v = edge_target_[e];
      uint32_t f = kRoot;
      if (u != kRoot) {
        for (uint32_t g = nodes_[u].fail;; g = nodes_[g].fail) {
          const uint32_t t = child(g, edge_label_[e]);
          if (t != kRoot) {
            f = t;
            break;
          }
          if (g == kRoot) break;
        }
      }
      nodes_[v].fail = f;
      // A stop string ending here is the longest one that does (the others
      // are suffixes of it, on the failure chain).
      if (nodes_[v].match_len == 0) nodes_[v].match_len = nodes_[f].match_len;
      queue.push_back(v);
    }
  }
}

uint32_t StopMatcher::child(uint32_t node, unsigned char byte) const {
  const auto first = edge_label_.begin() + edge_begin_[node];
  const auto last = edge_label_.begin() + edge_begin_[node + 1];
  const auto it = std::lower_bound(first, last, byte);
  if (it == last || *it != byte) return kRoot;
  return edge_target_[static_cast<size_t>(it - edge_label_.begin())];
}

uint32_t StopMatcher::next(uint32_t node, unsigned char byte) {
  // Each failure step makes the state shallower and each byte deepens it by
  // at most one, so the steps over a generation are at most its bytes.
  for (;;) {
    ++transitions_;
    const uint32_t t = child(node, byte);
    if (t != kRoot || node == kRoot) return t;
    node = nodes_[node].fail;
  }
}

void StopMatcher::append_front(std::string& out, size_t n, uint32_t held_node, std::string_view text) const {
  out.reserve(out.size() + n);
  const size_t from_prefix = std::min(n, held_prefix_.size());
  out.append(held_prefix_, 0, from_prefix);
  n -= from_prefix;
  const Node& h = nodes_[held_node];
  const size_t from_node = std::min<size_t>(n, h.depth);
  if (from_node > 0) out.append(stops_[h.pattern], 0, from_node);
  n -= from_node;
  out.append(text.substr(0, n));
}

StopMatcher::Step StopMatcher::push(std::string_view text) {
  Step step;
  if (stopped_) {
    step.stopped = true;
    return step;
  }
  const uint32_t from = state_;
  const size_t before = held_prefix_.size() + nodes_[from].depth;  // held bytes, positions 0..before-1
  size_t stop_at = pending_stop_;
  uint32_t s = from;
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t consumed = before + i;
    // Where the current candidate starts never moves back, and every stop
    // string that completes later starts at or after it: once it is past the
    // earliest stop found, the rest of the chunk cannot hold an earlier one.
    if (stop_at != kNone && consumed - nodes_[s].depth >= stop_at) break;
    s = next(s, static_cast<unsigned char>(text[i]));
    const uint32_t len = nodes_[s].match_len;
    if (len != 0) stop_at = std::min(stop_at, consumed + 1 - len);
  }
  if (stop_at != kNone) {
    stopped_ = true;
    step.stopped = true;
    append_front(step.emit, stop_at, from, text);
    held_prefix_.clear();
    state_ = kRoot;
    pending_stop_ = kNone;
    return step;
  }
  // The new held text is the prefix `s` stands for: the last depth bytes.
  state_ = s;
  append_front(step.emit, before + text.size() - nodes_[s].depth, from, text);
  held_prefix_.clear();
  return step;
}

std::string StopMatcher::flush() {
  held();
  std::string out = std::move(held_text_);
  held_text_.clear();
  held_prefix_.clear();
  state_ = kRoot;
  pending_stop_ = kNone;
  return out;
}

const std::string& StopMatcher::held() const {
  held_text_ = held_prefix_;
  const Node& h = nodes_[state_];
  if (h.depth > 0) held_text_.append(stops_[h.pattern], 0, h.depth);
  return held_text_;
}

void StopMatcher::set_held(std::string held) {
  // Fed from the root, the automaton ends in the state it would have reached
  // had this text been held by push(); a stop string inside it is remembered
  // for the next push, which would have found it in the held text.
  uint32_t s = kRoot;
  size_t stop_at = kNone;
  for (size_t i = 0; i < held.size(); ++i) {
    s = next(s, static_cast<unsigned char>(held[i]));
    const uint32_t len = nodes_[s].match_len;
    if (len != 0) stop_at = std::min(stop_at, i + 1 - len);
  }
  state_ = s;
  held.resize(held.size() - nodes_[s].depth);
  held_prefix_ = std::move(held);
  pending_stop_ = stop_at;
}

}  // namespace spw
