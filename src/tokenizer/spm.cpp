// SPM (llama) tokenizer: a port of the behaviour of llama.cpp's
// llm_tokenizer_spm_session, written from the algorithm description (see
// tokenizer.h for the contract, vocab.h for the shared vocabulary and
// special-token partitioning).
#include "tokenizer/spm.h"

#include "tokenizer/merge.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <string>
#include <utility>

#include "core/hash.h"
#include "tokenizer/vocab.h"

namespace spw::tok_detail {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁"

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    size_t next = s.find(from, pos);
    if (next == std::string_view::npos) break;
    out.append(s, pos, next - pos);
    out.append(to);
    pos = next + from.size();
  }
  out.append(s, pos, std::string_view::npos);
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xAB>" -> 0xAB, or -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int hi = hex_value(text[3]);
  int lo = hex_value(text[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class SpmTokenizer final : public VocabTokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const gguf::GgufFile& file, std::string model);

  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_piece(TokenId id, bool render_special) const override;
  std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space) const override;
  std::string_view pre_tokenizer() const override { return {}; }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  TokenId text_to_token(std::string_view text) const { return v_.find(text); }
  TokenId byte_to_token(uint8_t byte) const { return byte_to_token_[byte]; }
  void tokenize_spm(const std::string& text, std::vector<TokenId>* out) const;
  uint64_t compute_fingerprint() const;

  TokenId byte_to_token_[256] = {};
  uint64_t fingerprint_ = 0;
};

Result<std::unique_ptr<Tokenizer>> SpmTokenizer::load(const gguf::GgufFile& file, std::string model) {
  auto tok = std::make_unique<SpmTokenizer>();
  // llama.cpp's SPM defaults: BOS 1, EOS 2, UNK 0, add BOS, space prefix.
  VocabDefaults d;
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  d.add_bos = true;
  d.add_eos = false;
  d.add_space_prefix = true;
  SPW_RETURN_IF_ERROR(Vocab::load(file, std::move(model), d, &tok->v_));

  // Byte fallback: "<0xXX>" (upper-case hex, as SentencePiece writes it), else
  // the raw one-byte token, else UNK (llama.cpp would abort here).
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    TokenId id = tok->v_.find(name);
    if (id < 0) {
      const char raw[1] = {static_cast<char>(b)};
      id = tok->v_.find(std::string_view(raw, 1));
    }
    tok->byte_to_token_[b] = id >= 0 ? id : tok->v_.unk;
  }
  tok->fingerprint_ = tok->compute_fingerprint();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

uint64_t SpmTokenizer::compute_fingerprint() const {
  Fnv1a64 h;  // core/hash.h: platform-independent, unlike std::hash
  h.str("spw-tokenizer-v1");
  h.str(v_.model);
  h.u64(v_.tokens.size());
  for (size_t i = 0; i < v_.tokens.size(); ++i) {
    h.str(v_.tokens[i]);
    uint32_t bits = 0;
    std::memcpy(&bits, &v_.scores[i], sizeof bits);
    h.u64(bits);
    h.u64(static_cast<uint64_t>(static_cast<int32_t>(v_.types[i])));
  }
  for (TokenId id : {v_.bos, v_.eos, v_.unk, v_.eot, v_.eom, v_.pad}) h.u64(static_cast<uint64_t>(static_cast<int64_t>(id)));
  h.u64((v_.add_bos ? 1 : 0) | (v_.add_eos ? 2 : 0) | (v_.add_space_prefix ? 4 : 0));
  // lstrip/rstrip change the ids; hashed only where set, so vocabularies
  // without them keep the fingerprint they had before attributes existed.
  if (std::any_of(v_.strip.begin(), v_.strip.end(), [](uint8_t s) { return s != 0; })) {
    h.str("strip");
    for (uint8_t s : v_.strip) h.u8(s);
  }
  return h.value();
}

void SpmTokenizer::tokenize_spm(const std::string& text, std::vector<TokenId>* out) const {
  // Merge the pair whose joined text is the highest-scoring token (symbols
  // are contiguous, so the joined text is one substring).
  const auto pieces = merge_pieces(text, [&](std::string_view l, std::string_view r) -> std::optional<double> {
    const TokenId id = text_to_token(std::string_view(l.data(), l.size() + r.size()));
    if (id < 0) return std::nullopt;
    return v_.scores[static_cast<size_t>(id)];
  });
  // Resegment: every merged symbol is a vocab token by construction; a single
  // character that is not becomes byte-fallback tokens.
  for (std::string_view piece : pieces) {
    TokenId id = text_to_token(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : piece) {
      TokenId bid = byte_to_token(static_cast<uint8_t>(c));
      if (bid >= 0) out->push_back(bid);
    }
  }
}

std::vector<TokenId> SpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 2 + 2);
  if (add_bos && v_.bos >= 0) out.push_back(v_.bos);

  std::vector<Fragment> fragments;
  v_.partition(text, parse_special, &fragments);

  // The space prefix goes before the first fragment and before any raw text
  // that follows a special token (llama.cpp's is_prev_special; this is also
  // what SentencePiece does when HF splits on added tokens).
  bool prev_special = true;
  std::string buf;
  for (const Fragment& f : fragments) {
    if (f.is_token) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    buf.clear();
    if (v_.add_space_prefix && prev_special) buf.push_back(' ');
    buf.append(text.substr(f.offset, f.length));
    std::string escaped = replace_all(buf, " ", kSpaceMarker);
    tokenize_spm(escaped, &out);
    prev_special = false;
  }
  return out;
}

std::string SpmTokenizer::token_piece(TokenId id, bool render_special) const {
  if (!v_.valid(id)) return {};
  const std::string& text = v_.tokens[static_cast<size_t>(id)];
  switch (v_.types[static_cast<size_t>(id)]) {
    case TokenType::kNormal:
      return replace_all(text, kSpaceMarker, " ");
    case TokenType::kByte: {
      int b = parse_byte_token(text);
      if (b < 0) return text;
      return std::string(1, static_cast<char>(b));
    }
    case TokenType::kUserDefined:
      return text;
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? text : std::string();
    case TokenType::kUndefined:
    case TokenType::kUnused:
      return {};
  }
  return {};
}

std::string SpmTokenizer::decode(const std::vector<TokenId>& ids, bool strip_leading_space) const {
  std::string out;
  bool remove_space = strip_leading_space && v_.add_space_prefix;
  for (TokenId id : ids) {
    std::string piece = token_piece(id, false);
    if (piece.empty()) continue;  // leading BOS etc. do not consume the strip
    if (remove_space && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    out += piece;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_spm(const gguf::GgufFile& file, std::string model) {
  return SpmTokenizer::load(file, std::move(model));
}

}  // namespace spw::tok_detail
