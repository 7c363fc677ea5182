// Byte-level BPE (GPT-2 style), written from the description of llama.cpp's
// llm_tokenizer_bpe_session (see tokenizer.h for the contract):
//  1. special tokens are split out of the text (vocab.h: partition);
//  2. each raw fragment is cut into words by the pre-tokenizer named by
//     tokenizer.ggml.pre (pre_tokenizer.h);
//  3. each word's bytes are written as GPT-2's byte symbols (every byte maps
//     to one printable code point) and merged by rank: repeatedly the adjacent
//     pair with the lowest rank in tokenizer.ggml.merges, leftmost on ties;
//  4. each final symbol is its token; a symbol that is not in the vocab falls
//     back to its single bytes looked up as one-byte tokens (dropped when
//     absent), as llama.cpp does.
#include "tokenizer/bpe.h"

#include "tokenizer/merge.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/hash.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace spw::tok_detail {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves;
// the others (controls, space, DEL, NBSP, soft hyphen) take U+0100.. in
// byte order, so every byte has a visible, non-space symbol.
struct ByteMap {
  uint32_t byte_to_cpt[256];
  std::string byte_to_utf8[256];
  int16_t cpt_to_byte[324];  // -1: not a byte symbol

  ByteMap() {
    auto keeps = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t next = 256;
    std::fill(std::begin(cpt_to_byte), std::end(cpt_to_byte), int16_t{-1});
    for (int b = 0; b < 256; ++b) {
      uint32_t c = keeps(b) ? static_cast<uint32_t>(b) : next++;
      byte_to_cpt[b] = c;
      cpt_to_byte[c] = static_cast<int16_t>(b);
      std::string& u = byte_to_utf8[b];
      if (c < 0x80) {
        u.push_back(static_cast<char>(c));
      } else {
        u.push_back(static_cast<char>(0xC0 | (c >> 6)));
        u.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The bytes a token's stored symbols stand for; nullopt-like false when a
// code point is not a byte symbol.
bool symbols_to_bytes(std::string_view text, std::string* out) {
  const ByteMap& m = byte_map();
  out->clear();
  size_t i = 0;
  while (i < text.size()) {
    auto c0 = static_cast<uint8_t>(text[i]);
    uint32_t cpt;
    if (c0 < 0x80) {
      cpt = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < text.size() && (static_cast<uint8_t>(text[i + 1]) & 0xC0) == 0x80) {
      cpt = ((c0 & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // three- and four-byte characters are never byte symbols
    }
    if (cpt >= 324 || m.cpt_to_byte[cpt] < 0) return false;
    out->push_back(static_cast<char>(m.cpt_to_byte[cpt]));
  }
  return true;
}

// Merge ranks keyed by the (left, right) symbol texts; looked up by views.
struct MergeHash {
  using is_transparent = void;
  size_t operator()(const std::pair<std::string_view, std::string_view>& k) const {
    size_t a = std::hash<std::string_view>{}(k.first), b = std::hash<std::string_view>{}(k.second);
    return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  }
  size_t operator()(const std::pair<std::string, std::string>& k) const {
    return (*this)(std::pair<std::string_view, std::string_view>(k.first, k.second));
  }
};
struct MergeEq {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return std::string_view(a.first) == std::string_view(b.first) &&
           std::string_view(a.second) == std::string_view(b.second);
  }
};

class BpeTokenizer final : public VocabTokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const gguf::GgufFile& file, std::string model);

  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_piece(TokenId id, bool render_special) const override;
  std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space) const override;
  std::string_view pre_tokenizer() const override { return pre_->name(); }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  void tokenize_word(const std::string& word, std::vector<TokenId>* out) const;
  int rank(std::string_view left, std::string_view right) const {
    auto it = ranks_.find(std::pair<std::string_view, std::string_view>(left, right));
    return it == ranks_.end() ? -1 : it->second;
  }
  uint64_t compute_fingerprint() const;

  std::unique_ptr<PreTokenizer> pre_;
  uint64_t merges_hash_ = 0;  // of tokenizer.ggml.merges as stored, for the fingerprint
  std::unordered_map<std::pair<std::string, std::string>, int, MergeHash, MergeEq> ranks_;
  std::vector<std::string> pieces_;  // token_piece without render_special, precomputed
  uint64_t fingerprint_ = 0;
};

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::load(const gguf::GgufFile& file, std::string model) {
  auto tok = std::make_unique<BpeTokenizer>();

  std::string pre_name;
  if (file.has("tokenizer.ggml.pre")) {
    SPW_ASSIGN_OR_RETURN(pre_name, file.get_string("tokenizer.ggml.pre"));
  }
  SPW_ASSIGN_OR_RETURN(tok->pre_, PreTokenizer::create(pre_name));

  // llama.cpp's BPE defaults: no BOS/EOS/UNK unless the GGUF names them
  // (llama.cpp defaults BOS and EOS to id 11, which in GPT-2-style vocabs
  // is an ordinary token such as ","; converted models always name them),
  // BOS added only for the pre-tokenizers that want it, no space prefix.
  VocabDefaults d;
  d.add_bos = tok->pre_->add_bos_default();
  SPW_RETURN_IF_ERROR(Vocab::load(file, std::move(model), d, &tok->v_));

  const gguf::Value* merges_v = file.find("tokenizer.ggml.merges");
  if (merges_v == nullptr) return Status::corruption("missing metadata key 'tokenizer.ggml.merges'");
  const auto* merges = std::get_if<gguf::Array>(&merges_v->v);
  if (merges == nullptr || merges_v->type != gguf::ValueType::kArray || merges->elem_type != gguf::ValueType::kString) {
    return Status::corruption("metadata key 'tokenizer.ggml.merges' is not an array of strings");
  }
  if (merges->items.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::corruption("metadata key 'tokenizer.ggml.merges' too long");
  }
  tok->ranks_.reserve(merges->items.size() * 2);
  Fnv1a64 merges_hash;
  merges_hash.u64(merges->items.size());
  for (size_t i = 0; i < merges->items.size(); ++i) {
    const auto* s = std::get_if<std::string>(&merges->items[i].v);
    if (s == nullptr) return Status::corruption("tokenizer.ggml.merges entry " + std::to_string(i) + " is not a string");
    merges_hash.str(*s);
    // "left right", split at the first space after the first byte. An entry
    // without one can never apply (llama.cpp stores it as an empty pair).
    size_t sp = s->find(' ', 1);
    if (sp == std::string::npos) continue;
    // The first occurrence of a pair keeps its rank, as in llama.cpp.
    tok->ranks_.emplace(std::make_pair(s->substr(0, sp), s->substr(sp + 1)), static_cast<int>(i));
  }
  tok->merges_hash_ = merges_hash.value();

  const size_t n = tok->v_.tokens.size();
  tok->pieces_.resize(n);
  std::string bytes;
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = tok->v_.tokens[i];
    switch (tok->v_.types[i]) {
      case TokenType::kNormal:
        // A stored text that is not all byte symbols is used as it is (what
        // HF's ByteLevel decoder does; llama.cpp writes an [UNK_BYTE_..] marker).
        tok->pieces_[i] = symbols_to_bytes(text, &bytes) ? bytes : text;
        break;
      case TokenType::kUserDefined:
        tok->pieces_[i] = text;
        break;
      default:  // control and unknown render only on request; byte, unused, undefined never (llama.cpp)
        break;
    }
  }
  tok->fingerprint_ = tok->compute_fingerprint();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

uint64_t BpeTokenizer::compute_fingerprint() const {
  Fnv1a64 h;
  h.str("spw-tokenizer-bpe-v1");
  h.str(v_.model);
  h.str(pre_->name());
  h.u64(v_.tokens.size());
  for (size_t i = 0; i < v_.tokens.size(); ++i) {
    h.str(v_.tokens[i]);
    h.u64(static_cast<uint64_t>(static_cast<int32_t>(v_.types[i])));
    h.u8(v_.strip[i]);
  }
  h.u64(merges_hash_);
  for (TokenId id : {v_.bos, v_.eos, v_.unk, v_.eot, v_.eom, v_.pad}) h.u64(static_cast<uint64_t>(static_cast<int64_t>(id)));
  h.u64((v_.add_bos ? 1 : 0) | (v_.add_eos ? 2 : 0) | (v_.add_space_prefix ? 4 : 0));
  return h.value();
}

void BpeTokenizer::tokenize_word(const std::string& word, std::vector<TokenId>* out) const {
  if (pre_->ignore_merges()) {
    TokenId id = v_.find(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  // Merge the pair with the lowest rank (higher priority = lower rank).
  const auto pieces = merge_pieces(word, [&](std::string_view l, std::string_view r) -> std::optional<double> {
    const int rk = rank(l, r);
    if (rk < 0) return std::nullopt;
    return -static_cast<double>(rk);
  });
  for (std::string_view piece : pieces) {
    TokenId id = v_.find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      TokenId bid = v_.find(std::string_view(&c, 1));
      if (bid >= 0) out->push_back(bid);
    }
  }
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && v_.bos >= 0) out.push_back(v_.bos);

  std::vector<Fragment> fragments;
  v_.partition(text, parse_special, &fragments);
  const ByteMap& m = byte_map();
  std::string encoded;
  for (const Fragment& f : fragments) {
    if (f.is_token) {
      out.push_back(f.token);
      continue;
    }
    for (const std::string& word : pre_->split(text.substr(f.offset, f.length))) {
      encoded.clear();
      for (char c : word) encoded.append(m.byte_to_utf8[static_cast<uint8_t>(c)]);
      tokenize_word(encoded, &out);
    }
  }
  return out;
}

std::string BpeTokenizer::token_piece(TokenId id, bool render_special) const {
  if (!v_.valid(id)) return {};
  const size_t i = static_cast<size_t>(id);
  if (render_special && (v_.types[i] == TokenType::kControl || v_.types[i] == TokenType::kUnknown)) {
    return v_.tokens[i];
  }
  return pieces_[i];
}

std::string BpeTokenizer::decode(const std::vector<TokenId>& ids, bool strip_leading_space) const {
  std::string out;
  bool remove_space = strip_leading_space && v_.add_space_prefix;
  for (TokenId id : ids) {
    if (!v_.valid(id)) continue;
    const std::string& piece = pieces_[static_cast<size_t>(id)];
    if (piece.empty()) continue;  // leading BOS etc. do not consume the strip
    if (remove_space && piece[0] == ' ') {
      out.append(piece, 1, std::string::npos);
    } else {
      out += piece;
    }
    remove_space = false;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_bpe(const gguf::GgufFile& file, std::string model) {
  return BpeTokenizer::load(file, std::move(model));
}

}  // namespace spw::tok_detail
