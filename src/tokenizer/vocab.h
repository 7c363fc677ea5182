// Vocabulary state shared by the GGUF tokenizers (SPM in spm.cpp, byte-level
// BPE in bpe.cpp). Internal to src/tokenizer: the public contract is
// tokenizer.h.
//
// Contract: Vocab::load reads the tokenizer.ggml.* keys every vocabulary type
// has (tokens, scores, token_type, special ids, add_bos/add_eos/
// add_space_prefix) with the per-type defaults the caller passes, finds
// end-of-turn tokens by text, and lists the special tokens that
// partition() splits out of raw text. Errors: Corruption naming the key.
//
// Special-token partitioning follows llama.cpp's tokenizer_st_partition:
// special tokens (control, user-defined, unknown) are tried longest text first;
// each cuts every raw-text fragment at each leftmost non-overlapping
// occurrence. Without parse_special only user-defined tokens are matched (HF's
// added tokens are split out before the model always). A token with the
// lstrip (rstrip) attribute swallows the ASCII whitespace before (after) it.
// GGUF carries no such attributes; llama.cpp (and thus we) set them by model
// name: every special token of a Phi-3 vocabulary (general.name containing
// "phi3" or "phi-3") rstrips, except <unk>, <s> and <|endoftext|>; "<mask>"
// lstrips in jina-v2-{de,es,code} vocabularies.
// Thread safety: immutable after load.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::tok_detail {

// Transparent hash so lookups by string_view do not allocate.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// A piece of the input after special-token partitioning.
struct Fragment {
  bool is_token = false;
  TokenId token = -1;
  size_t offset = 0;  // raw text: [offset, offset + length) of the input
  size_t length = 0;
};

// Ids and flags a vocabulary type assumes when the GGUF does not say.
// -1: none.
struct VocabDefaults {
  TokenId bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
};

enum TokenStrip : uint8_t { kStripNone = 0, kLstrip = 1, kRstrip = 2 };

struct Vocab {
  static Status load(const gguf::GgufFile& file, std::string model, const VocabDefaults& defaults, Vocab* out);

  bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < tokens.size(); }
  TokenId find(std::string_view text) const {
    auto it = token_to_id.find(text);
    return it == token_to_id.end() ? -1 : it->second;
  }
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const;

  std::string model;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  std::vector<uint8_t> strip;  // TokenStrip bits per token
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id;
  std::vector<TokenId> special_tokens;  // control, user-defined, unknown; longest text first
  std::vector<TokenId> eog;             // sorted
  TokenId bos = -1, eos = -1, unk = -1, eot = -1, eom = -1, pad = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
};

// Reads `key` (when present) as an array of `expected_len` numbers.
// Corruption on a wrong length or a non-numeric element.
Status read_numeric_array(const gguf::GgufFile& file, std::string_view key, size_t expected_len, bool integer,
                          std::vector<double>* out);

// Byte length of a UTF-8 sequence from its first byte, as llama.cpp's
// unicode_len_utf8 computes it (continuation/invalid lead bytes count as 1).
inline size_t utf8_len(uint8_t c) {
  static constexpr size_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[c >> 4];
}

// Implements Tokenizer's vocabulary accessors over a Vocab; the SPM and BPE
// tokenizers add encoding and pieces.
class VocabTokenizer : public Tokenizer {
 public:
  int32_t n_vocab() const override { return static_cast<int32_t>(v_.tokens.size()); }
  TokenId bos_id() const override { return v_.bos; }
  TokenId eos_id() const override { return v_.eos; }
  TokenId unk_id() const override { return v_.unk; }
  TokenId eot_id() const override { return v_.eot; }
  TokenId eom_id() const override { return v_.eom; }
  TokenId pad_id() const override { return v_.pad; }
  bool add_bos_default() const override { return v_.add_bos; }
  bool add_eos_default() const override { return v_.add_eos; }
  bool add_space_prefix() const override { return v_.add_space_prefix; }
  TokenType token_type(TokenId id) const override {
    return v_.valid(id) ? v_.types[static_cast<size_t>(id)] : TokenType::kUndefined;
  }
  const std::string& token_text(TokenId id) const override {
    static const std::string kEmpty;
    return v_.valid(id) ? v_.tokens[static_cast<size_t>(id)] : kEmpty;
  }
  float token_score(TokenId id) const override { return v_.valid(id) ? v_.scores[static_cast<size_t>(id)] : 0.0f; }
  TokenId find_token(std::string_view text) const override { return v_.find(text); }
  bool is_eog(TokenId id) const override {
    return id >= 0 && std::binary_search(v_.eog.begin(), v_.eog.end(), id);
  }
  const std::vector<TokenId>& eog_ids() const override { return v_.eog; }
  std::string_view model_name() const override { return v_.model; }

 protected:
  Vocab v_;
};

}  // namespace spw::tok_detail
