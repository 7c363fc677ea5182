// OutputConstraint: OpenAI's response_format on the host side of the
// generation loop, so that it acts the same on every placement (CPU,
// Vulkan, hybrid): the backends only produce logits, and this masks them.
//
// Contract: create(spec, tokenizer) compiles the spec (grammar/json_schema.h;
// its errors pass through: InvalidArgument, kInvalidField, field
// "response_format") and takes the tokenizer's vocabulary trie, which is
// built once per vocabulary (keyed by Tokenizer::fingerprint) and shared by
// every request of the process. Each step, allowed(mask) fills a bit set
// over token ids for Sampler::sample: the tokens whose bytes keep the output
// a prefix of an accepted document, plus the end-of-generation tokens when
// the document is complete (then they are the only ones unless the document
// may still grow, e.g. a number's digits). Tokens without bytes (control,
// unknown, unused, end-of-generation) are never allowed as text. accept(id)
// moves the state over a sampled token's bytes; a token the mask did not
// allow is FailedPrecondition (a caller bug or a corrupt checkpoint), and
// so is replaying generated tokens that do not fit the grammar. An empty
// mask (no token can continue and the document is not complete: only past
// kMaxDepth nesting, or a vocabulary missing bytes) is ResourceExhausted
// from allowed() naming it, rather than a token chosen against the grammar.
// The state is a function of the generated tokens: replay(tokens) on a new
// OutputConstraint gives the live one's state (what a checkpoint resumes).
// Thread safety: one per generation; the shared trie is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "grammar/json_matcher.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace spw {

// The vocabulary trie of a tokenizer (built on first use, then cached).
std::shared_ptr<const grammar::VocabTrie> vocab_trie_for(const Tokenizer& tokenizer);

class OutputConstraint {
 public:
  static Result<std::unique_ptr<OutputConstraint>> create(const grammar::ConstraintSpec& spec,
                                                          const Tokenizer& tokenizer);
  Status allowed(std::vector<uint64_t>& mask);
  Status accept(TokenId id);
  Status replay(std::span<const TokenId> generated);
  bool complete() const { return matcher_.complete(); }
  const grammar::JsonMatcher& matcher() const { return matcher_; }

 private:
  OutputConstraint(std::shared_ptr<const grammar::Grammar> g, std::shared_ptr<const grammar::VocabTrie> v,
                   const Tokenizer& t)
      : matcher_(std::move(g)), vocab_(std::move(v)), tokenizer_(t) {}
  grammar::JsonMatcher matcher_;
  std::shared_ptr<const grammar::VocabTrie> vocab_;
  const Tokenizer& tokenizer_;
};

}  // namespace spw
