// SPM (llama) tokenizer: a port of the behaviour of llama.cpp's
// llm_tokenizer_spm_session and tokenizer_st_partition, written from the
// algorithm description (see tokenizer.h for the contract).
#include "tokenizer/tokenizer.h"

#include "core/hash.h"

#include <algorithm>
#include <cstring>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>

namespace spw {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 "▁"

// Transparent hash so lookups by string_view do not allocate.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};


// Byte length of a UTF-8 sequence from its first byte, as llama.cpp's
// unicode_len_utf8 computes it (continuation/invalid lead bytes count as 1).
size_t utf8_len(uint8_t c) {
  static constexpr size_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[c >> 4];
}

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

struct Fragment {
  bool is_token = false;
  TokenId token = -1;
  size_t offset = 0;  // raw text: [offset, offset + length) of the input
  size_t length = 0;
};

class SpmTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const gguf::GgufFile& file, std::string model);

  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_piece(TokenId id, bool render_special) const override;
  std::string decode(const std::vector<TokenId>& ids, bool strip_leading_space) const override;

  int32_t n_vocab() const override { return static_cast<int32_t>(tokens_.size()); }
  TokenId bos_id() const override { return bos_; }
  TokenId eos_id() const override { return eos_; }
  TokenId unk_id() const override { return unk_; }
  TokenId eot_id() const override { return eot_; }
  TokenId eom_id() const override { return eom_; }
  TokenId pad_id() const override { return pad_; }
  bool add_bos_default() const override { return add_bos_; }
  bool add_eos_default() const override { return add_eos_; }
  bool add_space_prefix() const override { return add_space_prefix_; }
  TokenType token_type(TokenId id) const override {
    return valid(id) ? types_[static_cast<size_t>(id)] : TokenType::kUndefined;
  }
  const std::string& token_text(TokenId id) const override {
    static const std::string kEmpty;
    return valid(id) ? tokens_[static_cast<size_t>(id)] : kEmpty;
  }
  float token_score(TokenId id) const override { return valid(id) ? scores_[static_cast<size_t>(id)] : 0.0f; }
  TokenId find_token(std::string_view text) const override {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
  }
  bool is_eog(TokenId id) const override {
    return id >= 0 && std::find(eog_.begin(), eog_.end(), id) != eog_.end();
  }
  const std::vector<TokenId>& eog_ids() const override { return eog_; }
  std::string_view model_name() const override { return model_; }
  uint64_t fingerprint() const override { return fingerprint_; }

 private:
  bool valid(TokenId id) const { return id >= 0 && static_cast<size_t>(id) < tokens_.size(); }
  TokenId text_to_token(std::string_view text) const { return find_token(text); }
  TokenId byte_to_token(uint8_t byte) const { return byte_to_token_[byte]; }
  void partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const;
  void tokenize_spm(const std::string& text, std::vector<TokenId>* out) const;
  uint64_t compute_fingerprint() const;

  std::string model_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_to_id_;
  TokenId byte_to_token_[256] = {};
  std::vector<TokenId> special_tokens_;  // control, user-defined, unknown; longest text first
  std::vector<TokenId> eog_;
  TokenId bos_ = 1, eos_ = 2, unk_ = 0, eot_ = -1, eom_ = -1, pad_ = -1;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = true;
  uint64_t fingerprint_ = 0;
};

// Reads an array of any numeric element type as doubles (scores) or integers
// (token types). Corruption on a wrong length or non-numeric element.
Status read_numeric_array(const gguf::GgufFile& file, std::string_view key, size_t expected_len, bool integer,
                          std::vector<double>* out) {
  const gguf::Value* v = file.find(key);
  if (v == nullptr) return Status::ok_status();
  const auto* arr = std::get_if<gguf::Array>(&v->v);
  if (arr == nullptr || v->type != gguf::ValueType::kArray) {
    return Status::corruption("metadata key '" + std::string(key) + "' is not an array");
  }
  if (arr->items.size() != expected_len) {
    return Status::corruption("metadata key '" + std::string(key) + "' has " + std::to_string(arr->items.size()) +
                              " entries but tokenizer.ggml.tokens has " + std::to_string(expected_len));
  }
  out->resize(expected_len);
  for (size_t i = 0; i < expected_len; ++i) {
    const gguf::Value& item = arr->items[i];
    if (integer && !item.is_integer()) {
      return Status::corruption("metadata key '" + std::string(key) + "' entry " + std::to_string(i) +
                                " is not an integer (" + std::string(gguf::value_type_name(item.type)) + ")");
    }
    if (auto* d = std::get_if<double>(&item.v)) {
      (*out)[i] = *d;
    } else if (auto* u = std::get_if<uint64_t>(&item.v); u && item.is_integer()) {
      (*out)[i] = static_cast<double>(*u);
    } else if (auto* s = std::get_if<int64_t>(&item.v); s && item.is_integer()) {
      (*out)[i] = static_cast<double>(*s);
    } else {
      return Status::corruption("metadata key '" + std::string(key) + "' entry " + std::to_string(i) +
                                " is not numeric (" + std::string(gguf::value_type_name(item.type)) + ")");
    }
  }
  return Status::ok_status();
}

Result<std::unique_ptr<Tokenizer>> SpmTokenizer::load(const gguf::GgufFile& file, std::string model) {
  auto tok = std::make_unique<SpmTokenizer>();
  tok->model_ = std::move(model);

  const gguf::Value* tokens_v = file.find("tokenizer.ggml.tokens");
  if (tokens_v == nullptr) return Status::corruption("missing metadata key 'tokenizer.ggml.tokens'");
  const auto* tokens_arr = std::get_if<gguf::Array>(&tokens_v->v);
  if (tokens_arr == nullptr || tokens_v->type != gguf::ValueType::kArray ||
      tokens_arr->elem_type != gguf::ValueType::kString) {
    return Status::corruption("metadata key 'tokenizer.ggml.tokens' is not an array of strings");
  }
  const size_t n = tokens_arr->items.size();
  if (n == 0) return Status::corruption("metadata key 'tokenizer.ggml.tokens' is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return Status::corruption("metadata key 'tokenizer.ggml.tokens' too long");

  std::vector<double> scores, types;
  SPW_RETURN_IF_ERROR(read_numeric_array(file, "tokenizer.ggml.scores", n, false, &scores));
  SPW_RETURN_IF_ERROR(read_numeric_array(file, "tokenizer.ggml.token_type", n, true, &types));

  tok->tokens_.resize(n);
  tok->scores_.assign(n, 0.0f);
  tok->types_.assign(n, TokenType::kNormal);  // llama.cpp's default without a type array
  tok->token_to_id_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const auto* s = std::get_if<std::string>(&tokens_arr->items[i].v);
    if (s == nullptr) return Status::corruption("tokenizer.ggml.tokens entry " + std::to_string(i) + " is not a string");
    // llama.cpp renames empty tokens so that every token has a distinct text.
    tok->tokens_[i] = s->empty() ? "[EMPTY_" + std::to_string(i) + "]" : *s;
    if (!scores.empty()) tok->scores_[i] = static_cast<float>(scores[i]);
    if (!types.empty()) {
      double t = types[i];
      tok->types_[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(static_cast<int32_t>(t)) : TokenType::kUndefined;
    }
    // A later duplicate wins, as in llama.cpp's token_to_id map.
    tok->token_to_id_.insert_or_assign(tok->tokens_[i], static_cast<TokenId>(i));
  }

  // Special ids: llama defaults, overridden by metadata when in range
  // (llama.cpp keeps the default for out-of-range ids such as 0xFFFFFFFF).
  auto special = [&](std::string_view key, TokenId dflt) -> Result<TokenId> {
    if (!file.has(key)) return dflt;
    SPW_ASSIGN_OR_RETURN(uint64_t id, file.get_u64(key));
    if (id >= n) return dflt;
    return static_cast<TokenId>(id);
  };
  SPW_ASSIGN_OR_RETURN(tok->bos_, special("tokenizer.ggml.bos_token_id", 1));
  SPW_ASSIGN_OR_RETURN(tok->eos_, special("tokenizer.ggml.eos_token_id", 2));
  SPW_ASSIGN_OR_RETURN(tok->unk_, special("tokenizer.ggml.unknown_token_id", 0));
  SPW_ASSIGN_OR_RETURN(tok->eot_, special("tokenizer.ggml.eot_token_id", -1));
  SPW_ASSIGN_OR_RETURN(tok->eom_, special("tokenizer.ggml.eom_token_id", -1));
  SPW_ASSIGN_OR_RETURN(tok->pad_, special("tokenizer.ggml.padding_token_id", -1));
  if (!tok->valid(tok->bos_)) tok->bos_ = -1;
  if (!tok->valid(tok->eos_)) tok->eos_ = -1;
  if (!tok->valid(tok->unk_)) tok->unk_ = -1;
  SPW_ASSIGN_OR_RETURN(tok->add_bos_, file.get_bool_or("tokenizer.ggml.add_bos_token", true));
  SPW_ASSIGN_OR_RETURN(tok->add_eos_, file.get_bool_or("tokenizer.ggml.add_eos_token", false));
  SPW_ASSIGN_OR_RETURN(tok->add_space_prefix_, file.get_bool_or("tokenizer.ggml.add_space_prefix", true));

  // Turn-end tokens by text, as llama.cpp does for vocabs that do not name
  // them: the first found becomes EOT (and is treated as a control token).
  static constexpr std::string_view kEotTexts[] = {"<|eot_id|>", "<|im_end|>",    "<|end|>", "<end_of_turn>",
                                                   "<|endoftext|>", "<EOT>", "_<EOT>"};
  for (std::string_view t : kEotTexts) {
    TokenId id = tok->find_token(t);
    if (id < 0) continue;
    if (tok->eot_ < 0) tok->eot_ = id;
    if (tok->types_[static_cast<size_t>(id)] != TokenType::kControl &&
        tok->types_[static_cast<size_t>(id)] != TokenType::kUserDefined) {
      tok->types_[static_cast<size_t>(id)] = TokenType::kControl;
    }
    tok->eog_.push_back(id);
  }
  if (TokenId id = tok->find_token("<|eom_id|>"); id >= 0) tok->eog_.push_back(id);
  for (TokenId id : {tok->eos_, tok->eot_, tok->eom_}) {
    if (id >= 0) tok->eog_.push_back(id);
  }
  std::sort(tok->eog_.begin(), tok->eog_.end());
  tok->eog_.erase(std::unique(tok->eog_.begin(), tok->eog_.end()), tok->eog_.end());

  // Byte fallback: "<0xXX>" (upper-case hex, as SentencePiece writes it), else
  // the raw one-byte token, else UNK (llama.cpp would abort here).
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    TokenId id = tok->find_token(name);
    if (id < 0) {
      const char raw[1] = {static_cast<char>(b)};
      id = tok->find_token(std::string_view(raw, 1));
    }
    tok->byte_to_token_[b] = id >= 0 ? id : tok->unk_;
  }

  for (size_t i = 0; i < n; ++i) {
    TokenType t = tok->types_[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      tok->special_tokens_.push_back(static_cast<TokenId>(i));
    }
  }
  // Longest first (ties by id, for a deterministic order).
  std::stable_sort(tok->special_tokens_.begin(), tok->special_tokens_.end(), [&](TokenId a, TokenId b) {
    return tok->tokens_[static_cast<size_t>(a)].size() > tok->tokens_[static_cast<size_t>(b)].size();
  });

  tok->fingerprint_ = tok->compute_fingerprint();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

uint64_t SpmTokenizer::compute_fingerprint() const {
  Fnv1a64 h;  // core/hash.h: platform-independent, unlike std::hash
  h.str("spw-tokenizer-v1");
  h.str(model_);
  h.u64(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) {
    h.str(tokens_[i]);
    uint32_t bits = 0;
    std::memcpy(&bits, &scores_[i], sizeof bits);
    h.u64(bits);
    h.u64(static_cast<uint64_t>(static_cast<int32_t>(types_[i])));
  }
  for (TokenId id : {bos_, eos_, unk_, eot_, eom_, pad_}) h.u64(static_cast<uint64_t>(static_cast<int64_t>(id)));
  h.u64((add_bos_ ? 1 : 0) | (add_eos_ ? 2 : 0) | (add_space_prefix_ ? 4 : 0));
  return h.value();
}

// Splits `text` into raw-text fragments and special-token fragments: for each
// special token (longest first), every raw fragment is cut at each leftmost
// non-overlapping occurrence. Without parse_special only user-defined tokens
// are matched (llama.cpp pre-tokenises those always, like HF added tokens).
void SpmTokenizer::partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const {
  fragments->clear();
  if (text.empty()) return;
  fragments->push_back({false, -1, 0, text.size()});
  std::vector<Fragment> next;
  for (TokenId id : special_tokens_) {
    TokenType type = types_[static_cast<size_t>(id)];
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string& s = tokens_[static_cast<size_t>(id)];
    if (s.empty()) continue;
    bool changed = false;
    next.clear();
    for (const Fragment& f : *fragments) {
      if (f.is_token) {
        next.push_back(f);
        continue;
      }
      std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0;
      while (true) {
        size_t m = raw.find(s, pos);
        if (m == std::string_view::npos) break;
        changed = true;
        if (m > pos) next.push_back({false, -1, f.offset + pos, m - pos});
        next.push_back({true, id, 0, 0});
        pos = m + s.size();
      }
      if (pos < raw.size()) next.push_back({false, -1, f.offset + pos, raw.size() - pos});
    }
    if (changed) fragments->swap(next);
  }
}

struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the escaped text
  size_t n;       // bytes; 0 once merged into the left neighbour
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Highest score first; equal scores: leftmost first.
struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

void SpmTokenizer::tokenize_spm(const std::string& text, std::vector<TokenId>* out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  size_t offs = 0;
  int index = 0;
  while (offs < text.size()) {
    size_t len = std::min(utf8_len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    Symbol sym{index - 1, 0, offs, len};
    offs += len;
    sym.next = offs == text.size() ? -1 : index + 1;
    ++index;
    symbols.push_back(sym);
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  std::string_view tv(text);
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    std::string_view joined = tv.substr(l.offset, l.n + r.n);  // symbols are contiguous
    TokenId id = text_to_token(joined);
    if (id < 0) return;
    queue.push(Bigram{left, right, scores_[static_cast<size_t>(id)], joined.size()});
  };

  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(b.left)];
    Symbol& r = symbols[static_cast<size_t>(b.right)];
    // Stale entry: one side already merged (sizes only grow or drop to 0).
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  // Resegment: every merged symbol is a vocab token by construction; a single
  // character that is not becomes byte-fallback tokens.
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    std::string_view piece = tv.substr(s.offset, s.n);
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
  if (add_bos && bos_ >= 0) out.push_back(bos_);

  std::vector<Fragment> fragments;
  partition(text, parse_special, &fragments);

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
    if (add_space_prefix_ && prev_special) buf.push_back(' ');
    buf.append(text.substr(f.offset, f.length));
    std::string escaped = replace_all(buf, " ", kSpaceMarker);
    tokenize_spm(escaped, &out);
    prev_special = false;
  }
  return out;
}

std::string SpmTokenizer::token_piece(TokenId id, bool render_special) const {
  if (!valid(id)) return {};
  const std::string& text = tokens_[static_cast<size_t>(id)];
  switch (types_[static_cast<size_t>(id)]) {
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
  bool remove_space = strip_leading_space && add_space_prefix_;
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

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  if (!file.has("tokenizer.ggml.model")) return Status::corruption("missing metadata key 'tokenizer.ggml.model'");
  SPW_ASSIGN_OR_RETURN(std::string model, file.get_string("tokenizer.ggml.model"));
  if (model != "llama") {
    return Status::invalid_argument("tokenizer model '" + model + "' is not supported; supported: llama (SPM)");
  }
  return SpmTokenizer::load(file, std::move(model));
}

// ---- Utf8Stream -------------------------------------------------------------

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Decodes `s` the way the WHATWG UTF-8 decoder does: each maximal ill-formed
// subpart becomes one U+FFFD. When `hold_tail`, an incomplete but so-far valid
// sequence at the end is left in `*tail` instead of being replaced.
std::string decode_utf8(std::string_view s, bool hold_tail, std::string* tail) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // bounds of the first continuation byte
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2, lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      need = 2;
    } else if (b == 0xED) {
      need = 2, hi = 0x9F;  // no surrogates
    } else if (b == 0xF0) {
      need = 3, lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else if (b == 0xF4) {
      need = 3, hi = 0x8F;  // <= U+10FFFF
    } else {
      out.append(kReplacement);
      ++i;
      continue;
    }
    size_t k = 1;
    bool bad = false;
    for (; k <= need; ++k) {
      if (i + k >= s.size()) break;
      auto c = static_cast<uint8_t>(s[i + k]);
      uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (c < l || c > h) {
        bad = true;
        break;
      }
    }
    if (bad) {
      out.append(kReplacement);
      i += k;  // the offending byte starts the next attempt
      continue;
    }
    if (k <= need) {  // ran out of input
      if (hold_tail) {
        tail->assign(s.substr(i));
      } else {
        out.append(kReplacement);
      }
      return out;
    }
    out.append(s.substr(i, need + 1));
    i += need + 1;
  }
  return out;
}
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  std::string input = std::move(pending_);
  pending_.clear();
  input.append(bytes);
  return decode_utf8(input, true, &pending_);
}

std::string Utf8Stream::flush() {
  std::string input = std::move(pending_);
  pending_.clear();
  return decode_utf8(input, false, nullptr);
}

bool is_valid_utf8(std::string_view s) {
  std::string tail;
  std::string decoded = decode_utf8(s, false, &tail);
  return decoded == s;
}

}  // namespace spw
