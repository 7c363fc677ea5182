#include "tests/reference/llama_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <numbers>
#include <random>
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

// ---- Gemma 2 / Gemma 3 ----------------------------------------------------
// Tiny gemma files written from scratch: F32 weights from a fixed seed (the same
// spec gives the same bytes, so two specs differing in one key share weights).
// head_dim (6) differs from n_embd / n_head (8) on purpose, and n_head_kv = 1
// makes it GQA.
constexpr int64_t kGVocab = 32, kGEmbd = 16, kGHead = 2, kGHeadKv = 1, kGHeadDim = 6, kGFf = 24;

struct GemmaSpec {
  std::string arch = "gemma2";
  int64_t n_layer = 2;
  int64_t window = -1;                   // attention.sliding_window; -1: absent
  double attn_cap = -1, final_cap = -1;  // the softcapping keys; -1: absent
  double freq_base = 10000;
  double freq_base_swa = -1;             // rope.freq_base_swa; -1: absent
  std::string scaling;                   // rope.scaling.type; empty: absent
  double scaling_factor = -1;            // rope.scaling.factor; -1: absent
  double out_gain = 1;                   // output_norm's weights are about this
  std::string drop_tensor;
};

std::string gemma_file(const GemmaSpec& s) {
  gguf::GgufWriter w;
  const std::string a = s.arch + ".";
  const auto u32 = [](int64_t v) { return gguf::Value::u32(static_cast<uint32_t>(v)); };
  const auto f32 = [](double v) { return gguf::Value::f32(static_cast<float>(v)); };
  w.set("general.architecture", gguf::Value::str(s.arch));
  w.set(a + "context_length", u32(256));
  w.set(a + "embedding_length", u32(kGEmbd));
  w.set(a + "block_count", u32(s.n_layer));
  w.set(a + "feed_forward_length", u32(kGFf));
  w.set(a + "attention.head_count", u32(kGHead));
  w.set(a + "attention.head_count_kv", u32(kGHeadKv));
  w.set(a + "attention.key_length", u32(kGHeadDim));
  w.set(a + "attention.value_length", u32(kGHeadDim));
  w.set(a + "attention.layer_norm_rms_epsilon", f32(1e-6));
  w.set(a + "rope.freq_base", f32(s.freq_base));
  if (s.window >= 0) w.set(a + "attention.sliding_window", u32(s.window));
  if (s.attn_cap >= 0) w.set(a + "attn_logit_softcapping", f32(s.attn_cap));
  if (s.final_cap >= 0) w.set(a + "final_logit_softcapping", f32(s.final_cap));
  if (s.freq_base_swa >= 0) w.set(a + "rope.freq_base_swa", f32(s.freq_base_swa));
  if (!s.scaling.empty()) w.set(a + "rope.scaling.type", gguf::Value::str(s.scaling));
  if (s.scaling_factor >= 0) w.set(a + "rope.scaling.factor", f32(s.scaling_factor));

  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  // Values offset + gain * U(-1, 1); a norm is about 1 (its "+1" already folded in).
  const auto add = [&](const std::string& name, std::vector<uint64_t> dims, float offset, float gain) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = offset + gain * uni(rng);
    if (name == s.drop_tensor) return;  // after drawing, so the other tensors keep their values
    ASSERT_TRUE(w.add_tensor(name, gguf::GgmlType::kF32, dims,
                             std::string(reinterpret_cast<const char*>(v.data()), n * sizeof(float)))
                    .ok())
        << name;
  };
  const auto norm = [&](const std::string& name, uint64_t n) { add(name, {n}, 1.0f, 0.2f); };
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  add("token_embd.weight", {u(kGEmbd), u(kGVocab)}, 0, 1);
  add("output_norm.weight", {u(kGEmbd)}, static_cast<float>(s.out_gain), 0.2f * static_cast<float>(s.out_gain));
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", u(kGEmbd));
    add(p + "attn_q.weight", {u(kGEmbd), u(kGHead * kGHeadDim)}, 0, 1);
    add(p + "attn_k.weight", {u(kGEmbd), u(kGHeadKv * kGHeadDim)}, 0, 1);
    add(p + "attn_v.weight", {u(kGEmbd), u(kGHeadKv * kGHeadDim)}, 0, 1);
    if (s.arch == "gemma3") {
      norm(p + "attn_q_norm.weight", u(kGHeadDim));
      norm(p + "attn_k_norm.weight", u(kGHeadDim));
    }
    add(p + "attn_output.weight", {u(kGHead * kGHeadDim), u(kGEmbd)}, 0, 1);
    norm(p + "post_attention_norm.weight", u(kGEmbd));
    norm(p + "ffn_norm.weight", u(kGEmbd));
    add(p + "ffn_gate.weight", {u(kGEmbd), u(kGFf)}, 0, 1);
    add(p + "ffn_up.weight", {u(kGEmbd), u(kGFf)}, 0, 1);
    add(p + "ffn_down.weight", {u(kGFf), u(kGEmbd)}, 0, 1);
    norm(p + "post_ffw_norm.weight", u(kGEmbd));
  }
  auto bytes = w.serialize();
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  return bytes.ok() ? *bytes : std::string();
}

std::unique_ptr<LlamaReference> load_gemma(const GemmaSpec& s) {
  auto r = load_bytes(gemma_file(s));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Logits of position p (one row of forward()).
std::vector<double> row_at(const LlamaReference& ref, const std::vector<TokenId>& tokens, size_t p) {
  auto l = ref.forward(tokens);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  if (!l.ok()) return {};
  const auto n = static_cast<size_t>(ref.hparams().n_vocab);
  return std::vector<double>(l->begin() + static_cast<std::ptrdiff_t>(p * n),
                             l->begin() + static_cast<std::ptrdiff_t>((p + 1) * n));
}

TEST(GemmaReferenceTest, HparamsAsWrittenAndDefaults) {
  GemmaSpec g2;
  g2.n_layer = 4;
  g2.window = 3;
  g2.attn_cap = 20;
  g2.final_cap = 2;
  auto r = load_gemma(g2);
  ASSERT_NE(r, nullptr);
  const ReferenceHparams& hp = r->hparams();
  EXPECT_EQ(hp.n_vocab, kGVocab);
  EXPECT_EQ(hp.head_dim, kGHeadDim);
  EXPECT_EQ(hp.sliding_window, 3);
  EXPECT_EQ(hp.attn_softcap, 20.0);
  EXPECT_EQ(hp.final_softcap, 2.0);
  EXPECT_EQ(hp.swa_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_DOUBLE_EQ(hp.attn_scale, 1.0 / std::sqrt(6.0));  // head_dim, not n_embd / n_head
  EXPECT_DOUBLE_EQ(hp.embd_scale, 4.0);
  EXPECT_TRUE(hp.gelu && hp.post_norms && hp.neox && !hp.qk_norm);
  EXPECT_EQ(hp.rope_freq_base_swa, hp.rope_freq_base);
  EXPECT_TRUE(r->output_tied());

  auto d = load_gemma(GemmaSpec{});  // gemma2 defaults
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->hparams().sliding_window, 4096);
  EXPECT_EQ(d->hparams().attn_softcap, 50.0);
  EXPECT_EQ(d->hparams().final_softcap, 30.0);

  GemmaSpec g3;
  g3.arch = "gemma3";
  g3.n_layer = 6;
  g3.window = 5;
  g3.attn_cap = 20;  // ignored by gemma3
  g3.final_cap = 2;
  g3.freq_base = 1e6;
  g3.scaling = "linear";
  g3.scaling_factor = 8;
  auto r3 = load_gemma(g3);
  ASSERT_NE(r3, nullptr);
  const ReferenceHparams& h3 = r3->hparams();
  EXPECT_EQ(h3.sliding_window, 5);
  EXPECT_EQ(h3.attn_softcap, 0.0);
  EXPECT_EQ(h3.final_softcap, 0.0);
  EXPECT_EQ(h3.swa_layers, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_TRUE(h3.qk_norm);
  EXPECT_EQ(h3.rope_freq_base, 1e6);
  EXPECT_EQ(h3.rope_freq_base_swa, 10000.0);
  EXPECT_EQ(h3.rope_freq_scale, 0.125);
  g3.freq_base_swa = 500;
  auto r3b = load_gemma(g3);
  ASSERT_NE(r3b, nullptr);
  EXPECT_EQ(r3b->hparams().rope_freq_base_swa, 500.0);

  // The 27B depths take the scale from n_embd / n_head (16 / 2 = 8).
  GemmaSpec big2;
  big2.n_layer = 46;
  auto b2 = load_gemma(big2);
  ASSERT_NE(b2, nullptr);
  EXPECT_DOUBLE_EQ(b2->hparams().attn_scale, 1.0 / std::sqrt(8.0));
  GemmaSpec big3;
  big3.arch = "gemma3";
  big3.n_layer = 62;
  big3.window = 4;
  auto b3 = load_gemma(big3);
  ASSERT_NE(b3, nullptr);
  EXPECT_DOUBLE_EQ(b3->hparams().attn_scale, 1.0 / std::sqrt(8.0));
  EXPECT_FALSE(b3->hparams().swa_layers[59]);
  EXPECT_TRUE(b3->hparams().swa_layers[60]);
}

// Position 0 attends to itself only (softmax of one score is 1, and RoPE at 0 is
// the identity), so its logits follow from the layer formulas with attention
// replaced by v: a check of the embedding scale, the post-norms, gelu_tanh, the
// tied output and the final cap, written here from the contract.
TEST(GemmaReferenceTest, PositionZeroMatchesTheFormulas) {
  GemmaSpec s;
  s.n_layer = 1;
  s.final_cap = 3;
  const std::string bytes = gemma_file(s);
  auto file = gguf::GgufFile::parse(make_memory_file(bytes));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto ref = LlamaReference::load(**file);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const auto w = [&](const std::string& name) {
    const gguf::TensorInfo* t = (*file)->find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> f(t ? t->nbytes / 4 : 0);
    if (t) std::memcpy(f.data(), t->data, t->nbytes);
    return std::vector<double>(f.begin(), f.end());
  };
  const auto mat = [](const std::vector<double>& m, const std::vector<double>& x) {
    std::vector<double> y(m.size() / x.size(), 0.0);
    for (size_t r = 0; r < y.size(); ++r)
      for (size_t c = 0; c < x.size(); ++c) y[r] += m[r * x.size() + c] * x[c];
    return y;
  };
  const auto rms = [](const std::vector<double>& x, const std::vector<double>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double k = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + static_cast<double>(1e-6f));
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * k * g[i];
    return y;
  };
  const TokenId tok = 11;
  const std::vector<double> embd = w("token_embd.weight");
  std::vector<double> x(embd.begin() + tok * kGEmbd, embd.begin() + (tok + 1) * kGEmbd);
  for (double& e : x) e *= 4.0;  // sqrt(n_embd)
  const std::vector<double> v = mat(w("blk.0.attn_v.weight"), rms(x, w("blk.0.attn_norm.weight")));
  std::vector<double> attn = v;  // both query heads read kv head 0
  attn.insert(attn.end(), v.begin(), v.end());
  const std::vector<double> o = rms(mat(w("blk.0.attn_output.weight"), attn), w("blk.0.post_attention_norm.weight"));
  for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
  const std::vector<double> h = rms(x, w("blk.0.ffn_norm.weight"));
  std::vector<double> g = mat(w("blk.0.ffn_gate.weight"), h);
  const std::vector<double> up = mat(w("blk.0.ffn_up.weight"), h);
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i];
    g[i] = 0.5 * a * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (a + 0.044715 * a * a * a))) * up[i];
  }
  const std::vector<double> f = rms(mat(w("blk.0.ffn_down.weight"), g), w("blk.0.post_ffw_norm.weight"));
  for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
  std::vector<double> logits = mat(embd, rms(x, w("output_norm.weight")));
  for (double& l : logits) l = 3.0 * std::tanh(l / 3.0);

  const std::vector<TokenId> tokens = {tok, 2, 7};
  auto got = (*ref)->forward(tokens);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR((*got)[i], logits[i], 1e-12) << i;

  // The attention cap acts on later positions: a tight one changes them.
  s.attn_cap = 0.5;
  auto tight = load_gemma(s);
  ASSERT_NE(tight, nullptr);
  auto tl = tight->forward(tokens);
  ASSERT_TRUE(tl.ok());
  EXPECT_TRUE(std::equal(tl->begin(), tl->begin() + kGVocab, got->begin()));  // position 0: one key, any cap
  EXPECT_FALSE(std::equal(tl->begin() + kGVocab, tl->end(), got->begin() + kGVocab));
}

TEST(GemmaReferenceTest, FinalSoftCapBoundsEveryLogit) {
  GemmaSpec s;
  s.window = 3;
  s.out_gain = 3;  // large logits
  s.final_cap = 1e6;  // effectively uncapped
  auto loose = load_gemma(s);
  s.final_cap = 2;
  auto capped = load_gemma(s);
  ASSERT_NE(loose, nullptr);
  ASSERT_NE(capped, nullptr);
  const std::vector<TokenId> tokens = {1, 5, 9, 30, 2};
  auto big = loose->forward(tokens);
  auto small = capped->forward(tokens);
  ASSERT_TRUE(big.ok() && small.ok());
  ASSERT_EQ(big->size(), small->size());
  double max_big = 0;
  for (size_t i = 0; i < big->size(); ++i) {
    max_big = std::max(max_big, std::abs((*big)[i]));
    ASSERT_LT(std::abs((*small)[i]), 2.0) << i;
    // Same weights, so the capped logit is 2 tanh(uncapped / 2) (uncapped to ~1e-12).
    EXPECT_NEAR((*small)[i], 2.0 * std::tanh((*big)[i] / 2.0), 1e-9) << i;
  }
  EXPECT_GT(max_big, 2.0) << "the cap must matter for this test to mean anything";
}

TEST(GemmaReferenceTest, SlidingWindowHidesOldTokens) {
  GemmaSpec s;
  s.arch = "gemma3";
  s.n_layer = 1;  // layer 0 slides
  s.window = 4;
  auto one = load_gemma(s);
  ASSERT_NE(one, nullptr);
  const std::vector<TokenId> base = {3, 14, 15, 9, 26, 5, 31, 8};
  const size_t p = 7;
  const std::vector<double> ref_row = row_at(*one, base, p);
  std::vector<TokenId> far = base;
  for (size_t i = 0; i + 4 <= p; ++i) far[i] = static_cast<TokenId>((far[i] + 7) % kGVocab);  // positions <= p - 4
  EXPECT_EQ(row_at(*one, far, p), ref_row);  // bitwise
  std::vector<TokenId> near = base;
  near[p - 3] = static_cast<TokenId>((near[p - 3] + 7) % kGVocab);
  EXPECT_NE(row_at(*one, near, p), ref_row);

  // 24 positions: five sliding layers of window 4 reach back 5 * 3 = 15
  // positions, not to position 0; the sixth (global) layer does.
  std::vector<TokenId> tokens(24);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>((5 * i + 2) % kGVocab);
  std::vector<TokenId> first_changed = tokens;
  first_changed[0] = static_cast<TokenId>((tokens[0] + 1) % kGVocab);
  const size_t last = tokens.size() - 1;
  s.n_layer = 5;
  auto five = load_gemma(s);
  ASSERT_NE(five, nullptr);
  EXPECT_EQ(row_at(*five, first_changed, last), row_at(*five, tokens, last));
  s.n_layer = 6;
  auto six = load_gemma(s);
  ASSERT_NE(six, nullptr);
  EXPECT_NE(row_at(*six, first_changed, last), row_at(*six, tokens, last));
}

TEST(GemmaReferenceTest, Gemma3RopeBaseAndScalingOnlyOnGlobalLayers) {
  const std::vector<TokenId> tokens = {3, 14, 15, 9, 26, 5};
  GemmaSpec plain;
  plain.arch = "gemma3";
  plain.n_layer = 1;
  plain.window = 8;
  GemmaSpec scaled = plain;
  scaled.freq_base = 1e6;
  scaled.scaling = "linear";
  scaled.scaling_factor = 8;
  auto p1 = load_gemma(plain), s1 = load_gemma(scaled);
  ASSERT_NE(p1, nullptr);
  ASSERT_NE(s1, nullptr);
  // A sliding layer ignores rope.freq_base and the scaling ...
  EXPECT_EQ(*s1->forward(tokens), *p1->forward(tokens));
  // ... but not rope.freq_base_swa.
  scaled.freq_base_swa = 100;
  auto w1 = load_gemma(scaled);
  ASSERT_NE(w1, nullptr);
  EXPECT_NE(*w1->forward(tokens), *p1->forward(tokens));
  // A global layer (layer 5) sees the scaling.
  plain.n_layer = 6;
  GemmaSpec factor1 = plain;
  factor1.scaling = "linear";
  factor1.scaling_factor = 1;
  plain.scaling = "linear";
  plain.scaling_factor = 8;
  auto p6 = load_gemma(plain), f6 = load_gemma(factor1);
  ASSERT_NE(p6, nullptr);
  ASSERT_NE(f6, nullptr);
  EXPECT_NE(*p6->forward(tokens), *f6->forward(tokens));
  factor1.scaling = "none";
  auto n6 = load_gemma(factor1);
  ASSERT_NE(n6, nullptr);
  EXPECT_EQ(*n6->forward(tokens), *f6->forward(tokens));  // factor 1 is no scaling
}

TEST(GemmaReferenceTest, LoadErrorsNameTheProblem) {
  GemmaSpec g3;
  g3.arch = "gemma3";
  auto no_window = load_bytes(gemma_file(g3));
  EXPECT_EQ(no_window.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_window.status().message().find("gemma3.attention.sliding_window"), std::string::npos)
      << no_window.status().to_string();

  GemmaSpec g2;
  g2.drop_tensor = "blk.0.post_ffw_norm.weight";
  auto no_post = load_bytes(gemma_file(g2));
  EXPECT_EQ(no_post.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_post.status().message().find("blk.0.post_ffw_norm.weight"), std::string::npos);

  g3.window = 4;
  g3.drop_tensor = "blk.1.attn_k_norm.weight";
  auto no_k_norm = load_bytes(gemma_file(g3));
  EXPECT_EQ(no_k_norm.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_k_norm.status().message().find("blk.1.attn_k_norm.weight"), std::string::npos);

  // Linear RoPE scaling is a gemma3 thing only.
  g2.drop_tensor.clear();
  g2.scaling = "linear";
  g2.scaling_factor = 8;
  auto scaled2 = load_bytes(gemma_file(g2));
  EXPECT_EQ(scaled2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(scaled2.status().message().find("linear"), std::string::npos);
  g3.drop_tensor.clear();
  g3.scaling = "yarn";
  auto yarn3 = load_bytes(gemma_file(g3));
  EXPECT_EQ(yarn3.status().code(), StatusCode::kInvalidArgument);
  g3.scaling = "linear";  // without a factor
  auto no_factor = load_bytes(gemma_file(g3));
  EXPECT_EQ(no_factor.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_factor.status().message().find("gemma3.rope.scaling.factor"), std::string::npos);
}

TEST(GemmaReferenceTest, ForwardAndGreedyAgreeWithSlidingWindow) {
  GemmaSpec s;
  s.window = 3;
  auto ref = load_gemma(s);
  ASSERT_NE(ref, nullptr);
  const std::vector<TokenId> prompt = {4, 17};
  auto gen = ref->greedy(prompt, 5);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  ASSERT_EQ(gen->size(), 5u);
  std::vector<TokenId> all = prompt;
  all.insert(all.end(), gen->begin(), gen->end() - 1);  // 6 positions
  auto logits = ref->forward(all);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  const auto n_vocab = static_cast<size_t>(kGVocab);
  ASSERT_EQ(logits->size(), all.size() * n_vocab);
  for (size_t p = prompt.size() - 1; p < all.size(); ++p) {
    const double* row = logits->data() + p * n_vocab;
    const auto best = static_cast<TokenId>(std::max_element(row, row + n_vocab) - row);  // first max
    EXPECT_EQ(best, (*gen)[p + 1 - prompt.size()]) << "position " << p;
  }

  // The window matters from position 3 on (3 - 0 >= 3), not before.
  s.window = 4096;
  auto wide = load_gemma(s);
  ASSERT_NE(wide, nullptr);
  auto wide_logits = wide->forward(all);
  ASSERT_TRUE(wide_logits.ok());
  for (size_t p = 0; p < all.size(); ++p) {
    const bool same = std::equal(logits->begin() + static_cast<std::ptrdiff_t>(p * n_vocab),
                                 logits->begin() + static_cast<std::ptrdiff_t>((p + 1) * n_vocab),
                                 wide_logits->begin() + static_cast<std::ptrdiff_t>(p * n_vocab));
    EXPECT_EQ(same, p < 3) << "position " << p;
  }
}

}  // namespace
}  // namespace spw::reference
