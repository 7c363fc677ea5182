// Tokenizer::from_gguf dispatches on tokenizer.ggml.model to the SPM
// (spm.cpp) or byte-level BPE (bpe.cpp) implementation; Utf8Stream is here.
#include "tokenizer/tokenizer.h"

#include <string>
#include <utility>

#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"

namespace spw {

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  if (!file.has("tokenizer.ggml.model")) return Status::corruption("missing metadata key 'tokenizer.ggml.model'");
  SPW_ASSIGN_OR_RETURN(std::string model, file.get_string("tokenizer.ggml.model"));
  if (model == "llama") return tok_detail::load_spm(file, std::move(model));
  if (model == "gpt2") return tok_detail::load_bpe(file, std::move(model));
  return Status::invalid_argument("tokenizer model '" + model +
                                  "' is not supported; supported: llama (SPM), gpt2 (byte-level BPE)");
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
