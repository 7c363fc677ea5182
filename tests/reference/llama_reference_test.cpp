#include "tests/reference/llama_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "core/env.h"
#include "gguf/gguf.h"

namespace spw::reference {
namespace {

const std::string kStories = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";

// The vocabulary straight from tokenizer.ggml.* (deliberately not spw::Tokenizer:
// this test checks the reference forward pass, independent of other modules).
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<double> scores;
  std::map<std::string, TokenId> index;
  TokenId bos = 1, eos = 2;
};

Vocab read_vocab(const gguf::GgufFile& f) {
  Vocab v;
  auto toks = f.get_array("tokenizer.ggml.tokens", gguf::ValueType::kString);
  auto scores = f.get_array("tokenizer.ggml.scores", gguf::ValueType::kFloat32);
  EXPECT_TRUE(toks.ok()) << toks.status().to_string();
  EXPECT_TRUE(scores.ok()) << scores.status().to_string();
  if (!toks.ok() || !scores.ok()) return v;
  for (const gguf::Value& t : (*toks)->items) v.tokens.push_back(std::get<std::string>(t.v));
  for (const gguf::Value& s : (*scores)->items) v.scores.push_back(std::get<double>(s.v));
  for (size_t i = 0; i < v.tokens.size(); ++i) v.index.emplace(v.tokens[i], static_cast<TokenId>(i));
  if (auto b = f.get_u32("tokenizer.ggml.bos_token_id"); b.ok()) v.bos = static_cast<TokenId>(*b);
  if (auto e = f.get_u32("tokenizer.ggml.eos_token_id"); e.ok()) v.eos = static_cast<TokenId>(*e);
  return v;
}

// Minimal SentencePiece-BPE encoding (space prefix, spaces as U+2581, repeatedly
// merge the adjacent pair whose union has the best score, leftmost first). Enough
// for an ASCII prompt whose characters are all in the vocabulary.
std::vector<TokenId> encode(const Vocab& v, const std::string& text) {
  std::string s = " " + text;
  std::vector<std::string> sym;
  for (char c : s) sym.push_back(c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c));
  for (;;) {
    int best = -1;
    double best_score = -1e300;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = v.index.find(sym[i] + sym[i + 1]);
      if (it != v.index.end() && v.scores[static_cast<size_t>(it->second)] > best_score) {
        best_score = v.scores[static_cast<size_t>(it->second)];
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    sym[static_cast<size_t>(best)] += sym[static_cast<size_t>(best) + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<TokenId> ids;
  for (const std::string& p : sym) {
    auto it = v.index.find(p);
    EXPECT_NE(it, v.index.end()) << "piece not in vocab: " << p;
    if (it != v.index.end()) ids.push_back(it->second);
  }
  return ids;
}

std::string decode(const Vocab& v, const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') {
      out += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
    } else if (!t.empty() && t.front() == '<' && t.back() == '>') {
      continue;  // control tokens (<s>, </s>, <unk>)
    } else {
      for (size_t i = 0; i < t.size(); ++i) {
        if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
          out += ' ';
          i += 2;
        } else {
          out += t[i];
        }
      }
    }
  }
  return out;
}

class StoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = gguf::GgufFile::open(Env::default_env(), kStories);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    file_ = std::move(f).value();
    auto r = LlamaReference::load(*file_);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ref_ = std::move(r).value();
    vocab_ = read_vocab(*file_);
    ASSERT_EQ(static_cast<int64_t>(vocab_.tokens.size()), ref_->hparams().n_vocab);
  }
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<LlamaReference> ref_;
  Vocab vocab_;
};

TEST_F(StoriesTest, HparamsAsInFile) {
  const ReferenceHparams& hp = ref_->hparams();
  EXPECT_EQ(hp.n_vocab, 512);
  EXPECT_EQ(hp.n_embd, 64);
  EXPECT_EQ(hp.n_layer, 5);
  EXPECT_EQ(hp.n_head, 8);
  EXPECT_EQ(hp.n_head_kv, 4);  // stories260K is itself a GQA model
  EXPECT_EQ(hp.head_dim, 8);
}

TEST_F(StoriesTest, GreedyContinuesOnceUponATimeAboutLily) {
  std::vector<TokenId> prompt = {vocab_.bos};
  const std::vector<TokenId> text = encode(vocab_, "Once upon a time");
  prompt.insert(prompt.end(), text.begin(), text.end());
  EXPECT_EQ(decode(vocab_, prompt), " Once upon a time");

  auto gen = ref_->greedy(prompt, 80, vocab_.eos);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  const std::string story = decode(vocab_, *gen);
  std::cout << "reference story: Once upon a time" << story << "\n";
  EXPECT_NE(story.find("Lily"), std::string::npos) << story;
  EXPECT_NE(story.find("girl"), std::string::npos) << story;

  // forward() over the whole sequence agrees with greedy()'s argmax choices and
  // is finite everywhere.
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), gen->begin(), gen->end());
  if (all.back() == vocab_.eos) all.pop_back();
  auto logits = ref_->forward(all);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  const auto n_vocab = static_cast<size_t>(ref_->hparams().n_vocab);
  ASSERT_EQ(logits->size(), all.size() * n_vocab);
  for (double l : *logits) ASSERT_TRUE(std::isfinite(l));
  for (size_t p = prompt.size() - 1; p + 1 < all.size(); ++p) {
    const double* row = logits->data() + p * n_vocab;
    size_t best = 0;
    for (size_t v = 1; v < n_vocab; ++v) {
      if (row[v] > row[best]) best = v;
    }
    EXPECT_EQ(static_cast<TokenId>(best), all[p + 1]) << "position " << p;
  }
}

TEST_F(StoriesTest, RejectsBadTokens) {
  const std::vector<TokenId> empty;
  EXPECT_EQ(ref_->forward(empty).status().code(), StatusCode::kInvalidArgument);
  const std::vector<TokenId> bad = {1, 512};
  auto r = ref_->forward(bad);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("512"), std::string::npos);
  const std::vector<TokenId> neg = {-1};
  EXPECT_EQ(ref_->greedy(neg, 3).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(StoriesTest, LogitsOfAPrefixDoNotDependOnLaterTokens) {
  // Causality: position p sees tokens 0..p only.
  const std::vector<TokenId> a = {1, 100, 200, 300};
  const std::vector<TokenId> b = {1, 100, 201, 7};
  auto la = ref_->forward(a);
  auto lb = ref_->forward(b);
  ASSERT_TRUE(la.ok() && lb.ok());
  const auto n_vocab = static_cast<size_t>(ref_->hparams().n_vocab);
  for (size_t i = 0; i < 2 * n_vocab; ++i) ASSERT_EQ((*la)[i], (*lb)[i]);
  bool differs = false;
  for (size_t i = 2 * n_vocab; i < 3 * n_vocab; ++i) differs |= (*la)[i] != (*lb)[i];
  EXPECT_TRUE(differs);
}

TEST(LlamaReferenceTest, LoadsRealF16File) {
  // llama-2-tiny-random: F16 matrices, F32 norms, 32000-token vocab.
  auto f = gguf::GgufFile::open(Env::default_env(), std::string(SPILLWAY_SOURCE_DIR) +
                                                         "/tests/data/llama-2-tiny-random.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto r = LlamaReference::load(**f);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->hparams().n_vocab, 32000);
  EXPECT_FALSE((*r)->output_tied());
  const std::vector<TokenId> tokens = {1, 450, 4996, 17354, 1701};
  auto logits = (*r)->forward(tokens);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  double norm = 0;
  for (double l : *logits) {
    ASSERT_TRUE(std::isfinite(l));
    norm = std::max(norm, std::abs(l));
  }
  EXPECT_GT(norm, 0.0);
}

// Copies a file's metadata and tensors, letting `edit` change or drop them.
std::string rewrite(const gguf::GgufFile& f, const std::string& drop_tensor, const std::string& arch,
                    const std::string& reshape_tensor) {
  gguf::GgufWriter w(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  if (!arch.empty()) w.set("general.architecture", gguf::Value::str(arch));
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name == drop_tensor) continue;
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    if (t.name == reshape_tensor) std::swap(dims[0], dims[1]);
    EXPECT_TRUE(w.add_tensor(t.name, static_cast<gguf::GgmlType>(t.type), dims,
                             std::string(reinterpret_cast<const char*>(t.data), t.nbytes))
                    .ok());
  }
  auto bytes = w.serialize();
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  return bytes.ok() ? *bytes : std::string();
}

Result<std::unique_ptr<LlamaReference>> load_bytes(std::string bytes) {
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::parse(make_memory_file(std::move(bytes))));
  return LlamaReference::load(*file);
}

TEST_F(StoriesTest, LoadErrorsNameTheProblem) {
  auto tied = load_bytes(rewrite(*file_, "output.weight", "", ""));
  ASSERT_TRUE(tied.ok()) << tied.status().to_string();
  EXPECT_TRUE((*tied)->output_tied());

  auto missing = load_bytes(rewrite(*file_, "blk.3.ffn_up.weight", "", ""));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("blk.3.ffn_up.weight"), std::string::npos);

  auto arch = load_bytes(rewrite(*file_, "", "gpt2", ""));
  EXPECT_EQ(arch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(arch.status().message().find("gpt2"), std::string::npos);

  auto shape = load_bytes(rewrite(*file_, "", "", "blk.0.attn_k.weight"));
  EXPECT_EQ(shape.status().code(), StatusCode::kCorruption);
  EXPECT_NE(shape.status().message().find("blk.0.attn_k.weight"), std::string::npos);
}

}  // namespace
}  // namespace spw::reference
