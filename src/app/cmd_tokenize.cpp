// `spillway tokenize`: token ids of a text as a JSON array. Loads only the GGUF
// header and vocabulary, not the weights' pages.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::app {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;
};

int run_tokenize(const TokenizeOptions& o) {
  Env& env = Env::default_env();
  std::string text = o.text;
  if (!o.file.empty()) {
    auto r = env.read_file(o.file);
    if (!r.ok()) {
      std::fprintf(stderr, "spillway tokenize: %s\n", r.status().to_string().c_str());
      return 1;
    }
    text = *r;
  }
  auto file = gguf::GgufFile::open(env, o.model);
  if (!file.ok()) {
    std::fprintf(stderr, "spillway tokenize: %s\n", file.status().to_string().c_str());
    return 1;
  }
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok.ok()) {
    std::fprintf(stderr, "spillway tokenize: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  const Tokenizer& t = **tok;
  std::vector<TokenId> ids = t.encode(text, !o.no_bos && t.add_bos_default(), o.parse_special);
  nlohmann::json out = nlohmann::json::array();
  for (TokenId id : ids) {
    if (o.pieces) {
      // "piece": the token as the vocabulary stores it (SPM's "▁Hello",
      // byte-level BPE's "Ġhello"); "text": the bytes it stands for.
      out.push_back({{"id", id}, {"piece", t.token_text(id)}, {"text", t.token_piece(id, true)}});
    } else {
      out.push_back(id);
    }
  }
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  sub->add_option("--model,-m", o->model, "GGUF file with a vocabulary (SPM or byte-level BPE)")->required();
  auto* text = sub->add_option("text", o->text, "Text to tokenize");
  auto* file = sub->add_option("--file,-f", o->file, "Read the text from a file");
  text->excludes(file);
  sub->add_flag("--no-bos", o->no_bos, "Do not add the BOS token");
  sub->add_flag("--special", o->parse_special, "Recognise control-token texts such as <s>");
  sub->add_flag("--pieces", o->pieces,
                "Print {id, piece, text} objects instead of bare ids (piece as stored in the vocab, text as decoded)");
  sub->callback([o, &exit_code] { exit_code = run_tokenize(*o); });
}

}  // namespace spw::app
