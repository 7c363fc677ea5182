// Tokenizer built from a GGUF vocabulary.
//
// Contract: Tokenizer::from_gguf reads tokenizer.ggml.* metadata (model, pre,
// tokens, scores, token_type, merges, bos/eos/unk/pad ids, add_bos_token,
// add_eos_token, add_space_prefix) and returns a tokenizer for
//   - `tokenizer.ggml.model = "llama"`: SentencePiece BPE with byte fallback
//     (spm.cpp), and
//   - `tokenizer.ggml.model = "gpt2"`: byte-level BPE (bpe.cpp) with the
//     pre-tokenizer named by `tokenizer.ggml.pre` (pre_tokenizer.h: default,
//     gpt-2, llama-bpe, qwen2, deepseek-llm, deepseek-coder, falcon,
//     starcoder, mpt, refact, smollm, ... ; missing means "default"),
// both as llama.cpp implements them. Any other model name, or a `pre` value
// that is not supported, is InvalidArgument naming it; missing or
// inconsistent arrays are Corruption naming the key. encode() reproduces
// llama.cpp's token ids exactly (tested against its vectors). token_piece()
// returns the raw bytes a token stands for (SPM byte-fallback tokens <0xAB>
// become that byte, U+2581 a space; BPE symbols map back to bytes through
// GPT-2's byte table), which can end in the middle of a UTF-8 character: use
// Utf8Stream to emit text.
//
// Details that follow llama.cpp (and thus HF):
// - Special tokens are split out first (longest token text first). User-
//   defined tokens are matched in the input even without parse_special;
//   control and unknown tokens only with it. Tokens with llama.cpp's
//   lstrip/rstrip attributes (Phi-3's special tokens) swallow the whitespace
//   beside them (vocab.h).
// - SPM: the space prefix ("▁") is added before the first raw-text fragment
//   and before every raw-text fragment that follows a special token when
//   parse_special splits the input (llama.cpp's is_prev_special rule).
// - BPE: BOS/EOS/UNK are none unless the GGUF names them; add_bos_token
//   defaults to true only for the pre-tokenizers llama.cpp adds BOS for
//   (Llama 3, Tekken). decode() does not apply llama.cpp's
//   clean_up_tokenization_spaces pass: it is the concatenation of the
//   pieces, so decode() and streamed token_piece() text always agree.
// - encode() never appends EOS, whatever add_eos_default() says: callers
//   tokenize prompts, which must not end the sequence.
// - Vocabularies that do not name EOT get it by text ("<|im_end|>",
//   "<|eot_id|>", "<end_of_turn>", ...); such tokens count as end-of-generation
//   and are made control tokens, as llama.cpp does.
// Thread safety: immutable after construction; all const methods are safe to
// call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"

namespace spw {

using TokenId = int32_t;

enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::GgufFile& file);
  virtual ~Tokenizer() = default;

  // Text to token ids. `add_bos` prepends BOS (when the vocab has one).
  // `parse_special` recognises control/user-defined token texts such as "<s>"
  // inside `text` as those tokens; otherwise they are tokenised as plain text.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                      bool parse_special = false) const = 0;
  // Raw bytes of one token for output. Control tokens (BOS/EOS) give "".
  // `render_special` returns the text of control/unknown tokens instead.
  // Out-of-range ids and unused tokens give "".
  virtual std::string token_piece(TokenId id, bool render_special = false) const = 0;
  // Concatenated pieces (control tokens give nothing), with SPM's leading
  // space removed from the first non-empty piece when `strip_leading_space`
  // and the vocab adds a space prefix (BPE vocabs do only when the GGUF sets
  // add_space_prefix). Unlike llama.cpp, a leading BOS does not
  // use up the strip, so decode(encode(s, true)) == s for ordinary text.
  // The result may hold invalid UTF-8 (byte tokens); use Utf8Stream to clean.
  virtual std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space = true) const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual TokenId bos_id() const = 0;  // -1 when none
  virtual TokenId eos_id() const = 0;  // -1 when none
  virtual TokenId unk_id() const = 0;
  virtual TokenId eot_id() const = 0;  // -1 when none
  virtual TokenId eom_id() const = 0;  // -1 when none
  virtual TokenId pad_id() const = 0;  // -1 when none
  virtual bool add_bos_default() const = 0;  // tokenizer.ggml.add_bos_token (default true for llama)
  virtual bool add_eos_default() const = 0;  // tokenizer.ggml.add_eos_token (default false)
  virtual bool add_space_prefix() const = 0;  // tokenizer.ggml.add_space_prefix (default true)
  virtual TokenType token_type(TokenId id) const = 0;  // kUndefined when out of range
  virtual const std::string& token_text(TokenId id) const = 0;  // as stored in the vocab; "" when out of range
  virtual float token_score(TokenId id) const = 0;
  // Exact vocab lookup of a token text (e.g. "<|im_end|>"); -1 when absent.
  virtual TokenId find_token(std::string_view text) const = 0;
  // End-of-generation tokens: EOS, and EOT/EOM where the vocab names them.
  virtual bool is_eog(TokenId id) const = 0;
  virtual const std::vector<TokenId>& eog_ids() const = 0;  // sorted
  virtual std::string_view model_name() const = 0;  // tokenizer.ggml.model
  // BPE: the pre-tokenizer in use ("default" when the GGUF names none);
  // SPM: "" (it has none).
  virtual std::string_view pre_tokenizer() const = 0;
  // Stable hash of the vocabulary and its settings (for compatibility fingerprints).
  virtual uint64_t fingerprint() const = 0;
};

// Turns a stream of token byte pieces into valid UTF-8 text: bytes of an
// unfinished character are held back until it completes. Invalid sequences are
// replaced by U+FFFD, one per maximal ill-formed subpart (the WHATWG/Unicode
// rule). The pending bytes are part of a generation checkpoint.
class Utf8Stream {
 public:
  // Appends bytes; returns the text that is now complete.
  std::string push(std::string_view bytes);
  // Ends the stream: returns the held-back incomplete character as one U+FFFD, or "".
  std::string flush();
  const std::string& pending() const { return pending_; }
  void set_pending(std::string p) { pending_ = std::move(p); }

 private:
  std::string pending_;
};

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace spw
