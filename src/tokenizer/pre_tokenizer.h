// Pre-tokenizers of byte-level BPE vocabularies: split text into the words
// that BPE merges within, selected by GGUF `tokenizer.ggml.pre` the way
// llama.cpp maps it.
//
// Contract: PreTokenizer::create(name) accepts the names llama.cpp maps to a
// regex set (supported_names(); "" means "default", as llama.cpp does with a
// warning) and refuses any other with InvalidArgument naming the value.
// split(text) applies the set's regexes in order, each to every word the
// previous ones produced; a regex cuts a word into its matches and the
// stretches between them (both kept), exactly as llama.cpp's
// unicode_regex_split does. The words' concatenation is the input after
// llama.cpp's lenient UTF-8 decoding (each byte that does not start a
// well-formed-enough sequence becomes U+FFFD, EF BF BD; other sequences are
// re-encoded from their code points).
//
// How llama.cpp's matching differs from plain PCRE, and how we match it:
// - `\s` is exactly Unicode White_Space (llama.cpp's table); PCRE's UCP `\s`
//   also takes U+180E. Non-ASCII whitespace is replaced by U+000B in the
//   subject and `\s` in the patterns by [\t\n\x0B\f\r ] (what llama.cpp's
//   std::regex fallback effectively does, and what its gpt2/llama3 fast paths
//   compute with their table).
// - Consequently a literal non-ASCII whitespace in a character class (U+3000
//   in DeepSeek's class) never matches it, as in llama.cpp.
// - `$` matches only at the very end of the word (ECMAScript semantics;
//   PCRE2_DOLLAR_ENDONLY).
// - Each regex sees one word at a time: lookarounds and `$` do not see the
//   neighbouring words.
// - `\p{S}` is llama.cpp's: Unicode's symbols without ASCII '~' (llama.cpp
//   matches categories on a collapsed text in which ASCII stands for itself
//   and \p{S} lists only $+<=>^`| of ASCII). deepseek-v3 is the one set that
//   uses \p{S}; there '~' is "other": it may prefix letters, is never part
//   of a punctuation/symbol run, and a '~' nothing matches stays a piece of
//   its own. Surrogates (and code points beyond U+10FFFF) are "other" too,
//   as in llama.cpp's table.
// Categories (\p{L}, \p{N}, \p{P}, \p{M}, \p{S}) come from PCRE2's Unicode tables
// (Unicode 14 in Debian 12's PCRE2 10.42), not llama.cpp's; code points whose
// category differs between the two Unicode versions may split differently.
// Code points llama.cpp cannot re-encode (> U+10FFFF from F4..F7 lead bytes;
// llama.cpp throws) become U+FFFD. When PCRE2 gives up on a word (its match
// or backtracking limit, only on pathological input), the rest of that word
// stays unsplit.
// Thread safety: immutable after create(); split() is safe concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace spw {

class PreTokenizer {
 public:
  static Result<std::unique_ptr<PreTokenizer>> create(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  std::vector<std::string> split(std::string_view text) const;

  // The name as given ("" reads "default").
  const std::string& name() const { return name_; }
  // llama.cpp's per-name settings: take a word that is itself a token
  // whole, without merging (Llama 3, Tekken); add BOS unless the GGUF says.
  bool ignore_merges() const { return ignore_merges_; }
  bool add_bos_default() const { return add_bos_; }
  // The regexes as llama.cpp writes them (before our \s rewriting).
  const std::vector<std::string>& patterns() const { return patterns_; }

  static std::vector<std::string_view> supported_names();

 private:
  struct Regex;
  PreTokenizer() = default;

  std::string name_;
  std::vector<std::string> patterns_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
};

}  // namespace spw
