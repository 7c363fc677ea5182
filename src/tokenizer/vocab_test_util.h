// Test helpers for tokenizer tests: loading vocabularies from tests/data and
// reading llama.cpp's test-tokenizer-0 vector files (.inp/.out).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace spw::testing {

inline std::string data_path(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct LoadedVocab {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

inline LoadedVocab load_vocab(const std::string& rel) {
  LoadedVocab l;
  auto f = gguf::GgufFile::open(Env::default_env(), data_path(rel));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return l;
  l.file = std::move(f).value();
  auto t = Tokenizer::from_gguf(*l.file);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (t.ok()) l.tok = std::move(t).value();
  return l;
}

inline std::string ids_str(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s.push_back(' ');
    s.append(std::to_string(id));
  }
  return s;
}

inline std::string escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else o.push_back(static_cast<char>(c));
  }
  return o;
}

// Splits the .inp file exactly as llama.cpp's test-tokenizer-0 does: inputs
// are separated by "\n__ggml_vocab_test__\n"; the text after the last
// separator (empty here) is not an input.
inline std::vector<std::string> split_inputs(const std::string& raw) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      out.push_back(raw.substr(pos));
      break;
    }
    out.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  return out;
}

inline std::vector<std::vector<TokenId>> read_outputs(const std::string& raw) {
  std::vector<std::vector<TokenId>> out;
  std::istringstream in(raw);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    long v;
    while (ls >> v) ids.push_back(static_cast<TokenId>(v));
    out.push_back(ids);
  }
  return out;
}

// A tokenizer from a vocabulary built in memory; `keep` owns the file it reads.
inline Result<std::unique_ptr<Tokenizer>> from_writer(const gguf::GgufWriter& w,
                                                      std::unique_ptr<gguf::GgufFile>* keep) {
  auto bytes = w.serialize();
  if (!bytes.ok()) return bytes.status();
  auto f = gguf::GgufFile::parse(make_memory_file(std::move(bytes).value(), "tok.gguf"));
  if (!f.ok()) return f.status();
  *keep = std::move(f).value();
  return Tokenizer::from_gguf(**keep);
}

}  // namespace spw::testing
