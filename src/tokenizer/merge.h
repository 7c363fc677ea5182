// The greedy pairwise merge both BPE flavours run on one piece of text:
// SentencePiece-BPE (spm.cpp: the pair whose joined text is the
// highest-scoring vocab token) and byte-level BPE (bpe.cpp: the pair with the
// lowest merge rank).
//
// Contract: merge_pieces(text, priority) splits `text` into UTF-8 characters
// (a truncated sequence at the end is one piece), then repeatedly merges the
// adjacent pair with the highest priority(left, right) (ties: the leftmost
// pair), where priority returns std::nullopt for a pair that may not merge, and
// returns the surviving pieces in order. Pairs are re-examined as their
// neighbours change, as llama.cpp's tokenizers do (a queue of candidate pairs;
// a stale entry is one whose sides' lengths no longer add up).
// Thread safety: pure function.
#pragma once

#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace spw::tok_detail {

template <class Priority>
std::vector<std::string_view> merge_pieces(std::string_view text, Priority priority) {
  struct Symbol {
    int prev;
    int next;
    size_t offset;
    size_t n;  // bytes; 0 once merged into the left neighbour
  };
  struct Pair {
    int left;
    int right;
    double priority;
    size_t size;
  };
  struct PairLess {
    bool operator()(const Pair& l, const Pair& r) const {
      return l.priority < r.priority || (l.priority == r.priority && l.left > r.left);
    }
  };
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len = std::min(utf8_len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{index - 1, offs + len == text.size() ? -1 : index + 1, offs, len});
    offs += len;
  }
  std::priority_queue<Pair, std::vector<Pair>, PairLess> queue;
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const std::optional<double> p = priority(text.substr(l.offset, l.n), text.substr(r.offset, r.n));
    if (p) queue.push(Pair{left, right, *p, l.n + r.n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Pair b = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(b.left)];
    Symbol& r = symbols[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale: a side merged since
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  std::vector<std::string_view> pieces;
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    pieces.push_back(text.substr(symbols[static_cast<size_t>(i)].offset, symbols[static_cast<size_t>(i)].n));
  }
  return pieces;
}

}  // namespace spw::tok_detail
