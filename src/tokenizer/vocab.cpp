// Shared vocabulary loading and special-token partitioning (see vocab.h).
// The behaviour follows llama.cpp's llama_vocab::impl::load and
// tokenizer_st_partition; the code is written from that description.
#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

namespace spw::tok_detail {

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

namespace {

// A string-valued key, or "" when absent or not a string (only used to pick
// per-model quirks, so a malformed value just means no quirk).
std::string string_or_empty(const gguf::GgufFile& file, std::string_view key) {
  if (!file.has(key)) return {};
  auto r = file.get_string(key);
  return r.ok() ? *r : std::string();
}

// llama.cpp sets lstrip/rstrip by model name because GGUF does not store HF's
// AddedToken attributes (see vocab.h).
void set_strip_attributes(const gguf::GgufFile& file, Vocab* v) {
  std::string name = string_or_empty(file, "general.name");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string pre = string_or_empty(file, "tokenizer.ggml.pre");
  auto set = [&](std::string_view text, uint8_t bit, bool on) {
    TokenId id = v->find(text);
    if (id < 0) return;
    uint8_t& s = v->strip[static_cast<size_t>(id)];
    s = on ? (s | bit) : (s & ~bit);
  };
  if (pre.find("jina-v2-de") != std::string::npos || pre.find("jina-v2-es") != std::string::npos ||
      pre.find("jina-v2-code") != std::string::npos) {
    set("<mask>", kLstrip, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : v->special_tokens) v->strip[static_cast<size_t>(id)] |= kRstrip;
    set("</s>", kRstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kRstrip, false);
  }
}

bool is_ascii_space(char c) {
  // C isspace() in the "C" locale, which llama.cpp's stripping uses.
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

Status Vocab::load(const gguf::GgufFile& file, std::string model_name, const VocabDefaults& d, Vocab* out) {
  Vocab& v = *out;
  v.model = std::move(model_name);

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

  v.tokens.resize(n);
  v.scores.assign(n, 0.0f);
  v.types.assign(n, TokenType::kNormal);  // llama.cpp's default without a type array
  v.strip.assign(n, kStripNone);
  v.token_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const auto* s = std::get_if<std::string>(&tokens_arr->items[i].v);
    if (s == nullptr) return Status::corruption("tokenizer.ggml.tokens entry " + std::to_string(i) + " is not a string");
    // llama.cpp renames empty tokens so that every token has a distinct text.
    v.tokens[i] = s->empty() ? "[EMPTY_" + std::to_string(i) + "]" : *s;
    if (!scores.empty()) v.scores[i] = static_cast<float>(scores[i]);
    if (!types.empty()) {
      double t = types[i];
      v.types[i] = (t >= 0 && t <= 6) ? static_cast<TokenType>(static_cast<int32_t>(t)) : TokenType::kUndefined;
    }
    // A later duplicate wins, as in llama.cpp's token_to_id map.
    v.token_to_id.insert_or_assign(v.tokens[i], static_cast<TokenId>(i));
  }

  // Special ids: the type's defaults, overridden by metadata when in range
  // (llama.cpp keeps the default for out-of-range ids such as 0xFFFFFFFF).
  auto special = [&](std::string_view key, TokenId dflt) -> Result<TokenId> {
    if (!file.has(key)) return dflt;
    SPW_ASSIGN_OR_RETURN(uint64_t id, file.get_u64(key));
    if (id >= n) return dflt;
    return static_cast<TokenId>(id);
  };
  SPW_ASSIGN_OR_RETURN(v.bos, special("tokenizer.ggml.bos_token_id", d.bos));
  SPW_ASSIGN_OR_RETURN(v.eos, special("tokenizer.ggml.eos_token_id", d.eos));
  SPW_ASSIGN_OR_RETURN(v.unk, special("tokenizer.ggml.unknown_token_id", d.unk));
  SPW_ASSIGN_OR_RETURN(v.eot, special("tokenizer.ggml.eot_token_id", -1));
  SPW_ASSIGN_OR_RETURN(v.eom, special("tokenizer.ggml.eom_token_id", -1));
  SPW_ASSIGN_OR_RETURN(v.pad, special("tokenizer.ggml.padding_token_id", -1));
  if (!v.valid(v.bos)) v.bos = -1;
  if (!v.valid(v.eos)) v.eos = -1;
  if (!v.valid(v.unk)) v.unk = -1;
  SPW_ASSIGN_OR_RETURN(v.add_bos, file.get_bool_or("tokenizer.ggml.add_bos_token", d.add_bos));
  SPW_ASSIGN_OR_RETURN(v.add_eos, file.get_bool_or("tokenizer.ggml.add_eos_token", d.add_eos));
  SPW_ASSIGN_OR_RETURN(v.add_space_prefix, file.get_bool_or("tokenizer.ggml.add_space_prefix", d.add_space_prefix));

  // Turn-end tokens by text, as llama.cpp does for vocabs that do not name
  // them: the first found becomes EOT. llama.cpp then makes such a token a
  // control token whatever its stored type (so it is matched only with
  // parse_special and renders as nothing).
  auto make_control = [&](TokenId id) { v.types[static_cast<size_t>(id)] = TokenType::kControl; };
  static constexpr std::string_view kEotTexts[] = {"<|eot_id|>", "<|im_end|>",    "<|end|>", "<end_of_turn>",
                                                   "<|endoftext|>", "<EOT>", "_<EOT>"};
  for (std::string_view t : kEotTexts) {
    TokenId id = v.find(t);
    if (id < 0) continue;
    if (v.eot < 0) v.eot = id;
    make_control(id);
    v.eog.push_back(id);
  }
  // DeepSeek's turn end is an EOT candidate but not end-of-generation by
  // text (it is EOS in DeepSeek vocabularies anyway).
  if (TokenId id = v.find("<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>");
      id >= 0 && v.eot < 0) {
    v.eot = id;
    make_control(id);
  }
  if (TokenId id = v.find("<|eom_id|>"); id >= 0) {
    if (v.eom < 0) v.eom = id;
    make_control(id);
    v.eog.push_back(id);
  }
  for (TokenId id : {v.eos, v.eot, v.eom}) {
    if (id >= 0) v.eog.push_back(id);
  }
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());

  for (size_t i = 0; i < n; ++i) {
    TokenType t = v.types[i];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      v.special_tokens.push_back(static_cast<TokenId>(i));
    }
  }
  // Longest first (ties by id, for a deterministic order).
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(), [&](TokenId a, TokenId b) {
    return v.tokens[static_cast<size_t>(a)].size() > v.tokens[static_cast<size_t>(b)].size();
  });
  set_strip_attributes(file, &v);
  return Status::ok_status();
}

void Vocab::partition(std::string_view text, bool parse_special, std::vector<Fragment>* fragments) const {
  fragments->clear();
  if (text.empty()) return;
  fragments->push_back({false, -1, 0, text.size()});
  std::vector<Fragment> next;
  for (TokenId id : special_tokens) {
    TokenType type = types[static_cast<size_t>(id)];
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string& s = tokens[static_cast<size_t>(id)];
    if (s.empty()) continue;
    const uint8_t st = strip[static_cast<size_t>(id)];
    bool changed = false;
    next.clear();
    for (const Fragment& f : *fragments) {
      if (f.is_token) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.length;
      size_t pos = f.offset;
      while (pos < end) {
        size_t m = text.substr(0, end).find(s, pos);
        if (m == std::string_view::npos) break;
        changed = true;
        size_t left_end = m;
        if (st & kLstrip) {
          while (left_end > pos && is_ascii_space(text[left_end - 1])) --left_end;
        }
        if (left_end > pos) next.push_back({false, -1, pos, left_end - pos});
        next.push_back({true, id, 0, 0});
        pos = m + s.size();
        if (st & kRstrip) {
          while (pos < end && is_ascii_space(text[pos])) ++pos;
        }
      }
      if (pos < end) next.push_back({false, -1, pos, end - pos});
    }
    if (changed) fragments->swap(next);
  }
}

}  // namespace spw::tok_detail
