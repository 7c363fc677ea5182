// libFuzzer target for the SPM tokenizer and Utf8Stream.
//
// For every input, as text: encode with and without special-token parsing; all
// ids must be in range; decoding the ids through Utf8Stream must give valid
// UTF-8; and when the input itself is valid UTF-8 and holds no control-token
// text, decode(encode(text)) must give the text back (SPM with byte fallback is
// lossless). A violated property aborts, which libFuzzer reports.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocab {
  std::unique_ptr<spw::gguf::GgufFile> file;
  std::unique_ptr<spw::Tokenizer> tok;
};

const Vocab& vocab() {
  static Vocab* v = [] {
    auto* out = new Vocab();
    auto f = spw::gguf::GgufFile::open(spw::Env::default_env(),
                                       std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf");
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
      std::abort();
    }
    out->file = std::move(*f);
    auto t = spw::Tokenizer::from_gguf(*out->file);
    if (!t.ok()) std::abort();
    out->tok = std::move(*t);
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const spw::Tokenizer& tok = *vocab().tok;
  std::string_view text(reinterpret_cast<const char*>(data), size);
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
    if (!special && spw::is_valid_utf8(text)) {
      check(tok.decode(ids) == text, "decode(encode(text)) == text");
    }
  }
  return 0;
}
