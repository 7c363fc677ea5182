// JsonMatcher: runs a compiled Grammar (json_schema.h) over output bytes, and
// says which tokens of a vocabulary may come next.
//
// Contract: the matcher's state is the set of ways (stacks of frames: the
// root, then each open object, array, string, number or literal) the bytes
// fed so far can be read as a prefix of a document the grammar accepts.
// feed(bytes) moves it over the bytes and returns true, or returns false and
// leaves it unchanged when they cannot continue such a prefix. complete() is
// true when the bytes are a whole document (end-of-generation may come);
// nothing follows a complete document but the end, except digits of a
// number at the root. The grammar has no dead ends (json_schema.h refuses or
// prunes what cannot complete), so after any accepted prefix either some
// byte may follow or the document is complete — except past kMaxDepth
// nesting on a schema that forces deeper containers, or when more than
// kMaxStacks readings are alive (a union of many look-alike branches: the
// later readings are dropped, which narrows but never dead-ends).
//
// allowed_tokens(vocab, mask) sets bit t of `mask` for every token t whose
// bytes, fed now, would be accepted. It walks the vocabulary's byte trie
// (VocabTrie) depth first, stepping the state once per trie node, so bytes
// shared by many tokens are checked once, and a rejected prefix skips its
// whole subtree: the cost is the number of trie nodes whose prefix is
// allowed (in a string: most of the vocabulary's trie; after a value: a
// handful), not vocabulary x token length. Tokens with no bytes (control
// tokens) are never set: the caller adds end-of-generation when complete().
// The same bytes give the same state, so a state rebuilt by feeding the bytes
// generated so far (a checkpoint's tokens) equals the live one (operator==).
// Thread safety: a JsonMatcher belongs to one generation and one thread; the
// Grammar and VocabTrie it reads are immutable and shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/json_schema.h"

namespace spw::grammar {

// The most readings a state keeps (see the contract).
inline constexpr size_t kMaxStacks = 64;

// A vocabulary's token bytes as a trie in preorder (the root left out): each
// node's subtree is the nodes up to `skip`.
class VocabTrie {
 public:
  // pieces[id]: the bytes token `id` adds to the text; empty: never allowed
  // by a mask (control and unused tokens).
  explicit VocabTrie(std::span<const std::string> pieces);
  int32_t n_vocab() const { return n_vocab_; }
  size_t n_nodes() const { return nodes_.size(); }
  int max_depth() const { return max_depth_; }

  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;   // 1 for a first byte
    uint32_t skip = 0;    // index of the first node after this subtree
    uint32_t ids_begin = 0, ids_end = 0;  // tokens whose bytes end here: ids()[begin, end)
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
  int32_t n_vocab_ = 0;
  int max_depth_ = 0;
};

// One frame of a reading (internal; public for tests and snapshots).
enum class FrameKind : uint8_t { kRoot, kObject, kArray, kString, kKey, kNumber, kLiteral };
struct Frame {
  FrameKind kind = FrameKind::kRoot;
  uint8_t state = 0;
  uint8_t ws = 0;        // whitespace bytes in the current gap
  uint8_t sub = 0;       // string: hex digits read / UTF-8 bytes to come; number: integer only
  int32_t node = -1;     // schema node (a key: its object's)
  int32_t aux = -1;      // object: the current value's node; key, literal: trie node
  uint32_t count = 0;    // array: items; string: code points; number: digits of the current part
  uint32_t scratch = 0;  // string: \u value so far, or the next UTF-8 byte's range (lo | hi << 8)
  uint64_t seen = 0;     // object: declared properties written
  bool operator==(const Frame&) const = default;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const Grammar> grammar);
  ~JsonMatcher();
  JsonMatcher(const JsonMatcher&) = delete;
  JsonMatcher& operator=(const JsonMatcher&) = delete;

  bool feed(std::string_view bytes);
  bool complete() const;
  // Some byte may follow (tests; the mask answers this per token).
  bool can_continue();
  // The bytes that may follow, ascending (tests).
  std::vector<uint8_t> allowed_bytes();
  void allowed_tokens(const VocabTrie& vocab, std::vector<uint64_t>& mask);

  // The readings, bottom frame first (tests, equality).
  std::vector<std::vector<Frame>> stacks() const;
  bool operator==(const JsonMatcher& o) const { return stacks() == o.stacks(); }
  const Grammar& grammar() const { return *grammar_; }

  struct Impl;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spw::grammar
