// libFuzzer target for the SPM and byte-level BPE tokenizers, the BPE
// pre-tokenizers and Utf8Stream.
//
// For every input, as text, with each vocabulary (stories260K's SPM, GPT-2's
// BPE, Phi-3's SPM with rstrip special tokens): encode with and without
// special-token parsing; all ids must be in range; decoding the ids through
// Utf8Stream must give valid UTF-8; and when the input itself is valid UTF-8,
// decode(encode(text)) without special-token parsing must give the text back
// (SPM with byte fallback and byte-level BPE are lossless; Phi-3's stripping
// is not, so it is exempt). Every supported pre-tokenizer must split valid
// UTF-8 into words that concatenate to the input. A violated property aborts,
// which libFuzzer reports.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocab {
  std::unique_ptr<spw::gguf::GgufFile> file;
  std::unique_ptr<spw::Tokenizer> tok;
  bool lossless = true;  // decode(encode(valid UTF-8)) == input
};

Vocab* load(const char* rel, bool lossless) {
  auto* out = new Vocab();
  auto f = spw::gguf::GgufFile::open(spw::Env::default_env(), std::string(SPILLWAY_SOURCE_DIR) + "/" + rel);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
    std::abort();
  }
  out->file = std::move(*f);
  auto t = spw::Tokenizer::from_gguf(*out->file);
  if (!t.ok()) std::abort();
  out->tok = std::move(*t);
  out->lossless = lossless;
  return out;
}

// Never destroyed (like the vocabularies), so the leak checker at exit
// still sees them reachable.
const std::vector<Vocab*>& vocabs() {
  static const auto* v = new std::vector<Vocab*>{
      load("models/stories260K.gguf", true),
      load("tests/data/vocab/ggml-vocab-gpt-2.gguf", true),
      load("tests/data/vocab/ggml-vocab-phi-3.gguf", false),
  };
  return *v;
}

const std::vector<std::unique_ptr<spw::PreTokenizer>>& pre_tokenizers() {
  static const auto* v = [] {
    auto* out = new std::vector<std::unique_ptr<spw::PreTokenizer>>();
    for (std::string_view n : spw::PreTokenizer::supported_names()) {
      auto p = spw::PreTokenizer::create(n);
      if (!p.ok()) std::abort();
      out->push_back(std::move(*p));
    }
    return out;
  }();
  return *v;
}

void check(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

void check_vocab(const Vocab& v, std::string_view text, bool valid) {
  const spw::Tokenizer& tok = *v.tok;
  for (bool special : {false, true}) {
    std::vector<spw::TokenId> ids = tok.encode(text, /*add_bos=*/true, special);
    spw::Utf8Stream stream;
    std::string out;
    for (spw::TokenId id : ids) {
      check(id >= 0 && id < tok.n_vocab(), "token id in range");
      out += stream.push(tok.token_piece(id));
    }
    out += stream.flush();
    check(spw::is_valid_utf8(out), "streamed decode is valid UTF-8");
    if (!special && valid && v.lossless) {
      check(tok.decode(ids) == text, "decode(encode(text)) == text");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = spw::is_valid_utf8(text);
  for (const Vocab* v : vocabs()) check_vocab(*v, text, valid);
  if (valid) {
    for (const auto& p : pre_tokenizers()) {
      std::string joined;
      for (const std::string& w : p->split(text)) {
        check(!w.empty(), "pre-tokenizer words are not empty");
        joined += w;
      }
      check(joined == text, "pre-tokenizer words concatenate to the input");
    }
  }
  return 0;
}
