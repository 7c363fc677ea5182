#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "core/env.h"
#include "gguf/gguf.h"
#include "tokenizer/vocab_test_util.h"

namespace spw {
namespace {

using testing::data_path;
using testing::escape;
using testing::ids_str;
using testing::read_all;
using testing::read_outputs;
using testing::split_inputs;
using testing::from_writer;
using Loaded = testing::LoadedVocab;

Loaded load(const std::string& rel) { return testing::load_vocab(rel); }

TEST(TokenizerVocabTest, LlamaSpmMatchesEveryLlamaCppVector) {
  Loaded l = load("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(l.tok, nullptr);
  auto inputs = split_inputs(read_all(data_path("tests/data/ggml-vocab-llama-spm.gguf.inp")));
  auto outputs = read_outputs(read_all(data_path("tests/data/ggml-vocab-llama-spm.gguf.out")));
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GE(inputs.size(), 40u);
  int failures = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    // test-tokenizer-0: add_special = false, parse_special = false.
    std::vector<TokenId> got = l.tok->encode(inputs[i], false, false);
    if (got != outputs[i]) {
      ++failures;
      ADD_FAILURE() << "case " << i << " input '" << escape(inputs[i]) << "'\n expected:" << ids_str(outputs[i])
                    << "\n      got:" << ids_str(got);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerVocabTest, LlamaSpmBasics) {
  Loaded l = load("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.n_vocab(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.eot_id(), -1);
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_TRUE(t.add_space_prefix());
  EXPECT_EQ(t.model_name(), "llama");
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_FALSE(t.is_eog(-1));
  EXPECT_EQ(t.eog_ids(), std::vector<TokenId>{2});
  EXPECT_EQ(t.token_type(1), TokenType::kControl);
  EXPECT_EQ(t.token_type(0), TokenType::kUnknown);
  EXPECT_EQ(t.token_type(3), TokenType::kByte);
  EXPECT_EQ(t.token_type(32000), TokenType::kUndefined);
  EXPECT_EQ(t.token_text(1), "<s>");
  EXPECT_EQ(t.token_text(-5), "");
  EXPECT_EQ(t.find_token("<s>"), 1);
  EXPECT_EQ(t.find_token("no such token ever"), -1);

  // BOS handling.
  EXPECT_EQ(t.encode("", true), std::vector<TokenId>{1});
  EXPECT_EQ(t.encode("", false), std::vector<TokenId>{});
  std::vector<TokenId> hello = t.encode("Hello world", true);
  ASSERT_GE(hello.size(), 3u);
  EXPECT_EQ(hello[0], 1);
  EXPECT_EQ(std::vector<TokenId>(hello.begin() + 1, hello.end()), t.encode("Hello world", false));
  EXPECT_EQ(t.decode(hello), "Hello world");
  EXPECT_EQ(t.decode(hello, false), " Hello world");

  // Pieces.
  EXPECT_EQ(t.token_piece(1), "");
  EXPECT_EQ(t.token_piece(1, true), "<s>");
  EXPECT_EQ(t.token_piece(0), "");
  EXPECT_EQ(t.token_piece(0x0A + 3), "\n");  // <0x0A>
  EXPECT_EQ(t.token_piece(t.find_token("\xE2\x96\x81Hello")), " Hello");
  EXPECT_EQ(t.token_piece(99999), "");
}

TEST(TokenizerVocabTest, ParseSpecialRecognisesControlTokens) {
  Loaded l = load("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  const std::string text = "<s>[INST] Hi [/INST] Hello</s><s>[INST] Again [/INST]";

  std::vector<TokenId> special = t.encode(text, false, true);
  // The space prefix is applied to the first fragment and after each special
  // token (llama.cpp's is_prev_special), so each "[INST]" is "▁[INST]".
  std::vector<TokenId> expected = {1};
  for (TokenId id : t.encode("[INST] Hi [/INST] Hello", false)) expected.push_back(id);
  expected.push_back(2);
  expected.push_back(1);
  for (TokenId id : t.encode("[INST] Again [/INST]", false)) expected.push_back(id);
  EXPECT_EQ(special, expected) << ids_str(special);
  EXPECT_EQ(special[1], t.find_token("\xE2\x96\x81["));

  // Without parse_special "<s>" is plain text: no BOS/EOS ids appear.
  std::vector<TokenId> plain = t.encode(text, false, false);
  for (TokenId id : plain) {
    EXPECT_NE(id, 1);
    EXPECT_NE(id, 2);
  }
  EXPECT_EQ(t.decode(plain), text);

  // Text before the first special token gets the prefix; a special token at
  // the very start means the following text still does.
  EXPECT_EQ(t.encode("a</s>", false, true), (std::vector<TokenId>{t.find_token("\xE2\x96\x81" "a"), 2}));
  EXPECT_EQ(t.encode("</s>", false, true), std::vector<TokenId>{2});
  EXPECT_EQ(t.encode("</s></s>", true, true), (std::vector<TokenId>{1, 2, 2}));
  // Control tokens are dropped from decode; user text around them survives.
  EXPECT_EQ(t.decode(special), "[INST] Hi [/INST] Hello [INST] Again [/INST]");
}

TEST(TokenizerVocabTest, LoadsAndEncodesFast) {
  auto f = gguf::GgufFile::open(Env::default_env(), data_path("tests/data/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto t0 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::from_gguf(**f);
  auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(tok.ok());
  std::string text;
  while (text.size() < 4096) text += "The quick brown fox jumps over the lazy dog. Привет, мир! 你好世界 🦙\n";
  auto ids = (*tok)->encode(text, true);
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ((*tok)->decode(ids), text);
  double load_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  double enc_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  std::printf("vocab load %.2f ms, encode %zu bytes -> %zu tokens in %.2f ms\n", load_ms, text.size(), ids.size(),
              enc_ms);
  // Generous bounds (sanitizer builds are slow); a regression to quadratic
  // behaviour would blow far past them.
  EXPECT_LT(load_ms, 2000.0);
  EXPECT_LT(enc_ms, 2000.0);
}

TEST(TokenizerStoriesTest, OnceUponATimeRoundTrips) {
  Loaded l = load("models/stories260K.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.n_vocab(), 512);
  EXPECT_EQ(t.pad_id(), -1);  // stored as 0xFFFFFFFF
  std::vector<TokenId> ids = t.encode("Once upon a time", true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  // Every token is a real vocab piece and at least some merging happened.
  EXPECT_LT(ids.size(), std::string("Once upon a time").size());
  EXPECT_EQ(t.decode(ids), "Once upon a time");
  // Characters outside the tiny vocab fall back to bytes and still round-trip.
  std::string odd = "Zoë 🦙 naïve";
  std::vector<TokenId> odd_ids = t.encode(odd, false);
  bool saw_byte = false;
  for (TokenId id : odd_ids) saw_byte |= t.token_type(id) == TokenType::kByte;
  EXPECT_TRUE(saw_byte);
  EXPECT_EQ(t.decode(odd_ids), odd);
}

TEST(TokenizerLlama2Test, MultilingualRoundTrip) {
  Loaded l = load("tests/data/llama-2-tiny-random.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.n_vocab(), 32000);
  const std::string text =
      "Hello, world! Grüße aus München. Привет, как дела? 日本語のテキスト。 한국어 텍스트. "
      "مرحبا بالعالم 🦙🚀 \t tabs\nnew lines\n\n  double  spaces ";
  std::vector<TokenId> ids = t.encode(text, true);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(t.decode(ids), text);
  // Same vocabulary as the llama-spm test file, so the same ids and fingerprint.
  Loaded ref = load("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(ref.tok, nullptr);
  EXPECT_EQ(ref.tok->encode(text, true), ids);
}

TEST(TokenizerFingerprintTest, StableAndSensitive) {
  Loaded a = load("tests/data/ggml-vocab-llama-spm.gguf");
  Loaded b = load("tests/data/ggml-vocab-llama-spm.gguf");
  Loaded c = load("models/stories260K.gguf");
  ASSERT_TRUE(a.tok && b.tok && c.tok);
  EXPECT_EQ(a.tok->fingerprint(), b.tok->fingerprint());
  EXPECT_NE(a.tok->fingerprint(), c.tok->fingerprint());
  EXPECT_NE(a.tok->fingerprint(), 0u);
}

// ---- Utf8Stream --------------------------------------------------------------

TEST(Utf8StreamTest, HoldsBackIncompleteCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.push("a\xE2"), "a");
  EXPECT_EQ(s.pending(), "\xE2");
  EXPECT_EQ(s.push("\x96"), "");
  EXPECT_EQ(s.push("\x81" "b"), "\xE2\x96\x81" "b");
  EXPECT_EQ(s.pending(), "");
  EXPECT_EQ(s.flush(), "");
  // Four-byte emoji one byte at a time.
  std::string llama = "\xF0\x9F\xA6\x99";
  std::string out;
  for (char c : llama) out += s.push(std::string(1, c));
  EXPECT_EQ(out, llama);
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacement) {
  const std::string r = "\xEF\xBF\xBD";
  Utf8Stream s;
  EXPECT_EQ(s.push("\xFF" "a"), r + "a");
  EXPECT_EQ(s.push("\x80"), r);                   // lone continuation
  EXPECT_EQ(s.push("\xC0\xAF"), r + r);           // overlong: C0 never valid
  EXPECT_EQ(s.push("\xED\xA0\x80"), r + r + r);   // surrogate
  EXPECT_EQ(s.push("\xE2\x96" "x"), r + "x");     // truncated by ASCII: one U+FFFD
  EXPECT_EQ(s.push("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
  EXPECT_EQ(s.push("\xE2\x96"), "");
  EXPECT_EQ(s.flush(), r);  // unfinished at end of stream
  EXPECT_EQ(s.pending(), "");
  EXPECT_EQ(s.flush(), "");
}

TEST(Utf8StreamTest, PendingSurvivesCheckpoint) {
  Utf8Stream a;
  EXPECT_EQ(a.push("\xF0\x9F"), "");
  Utf8Stream b;
  b.set_pending(a.pending());
  EXPECT_EQ(b.push("\xA6\x99"), "\xF0\x9F\xA6\x99");
}

TEST(Utf8StreamTest, ByteFallbackTokenEndingMidCharacter) {
  Loaded l = load("models/stories260K.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  // "🦙" is not in the 512-token vocab: four byte tokens.
  std::vector<TokenId> ids = t.encode("🦙", false);
  std::vector<TokenId> bytes;
  for (TokenId id : ids) {
    if (t.token_type(id) == TokenType::kByte) bytes.push_back(id);
  }
  ASSERT_EQ(bytes.size(), 4u) << ids_str(ids);
  Utf8Stream s;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = t.token_piece(ids[i]);
    std::string emitted = s.push(piece);
    if (t.token_type(ids[i]) == TokenType::kByte && ids[i] != bytes.back()) {
      EXPECT_EQ(emitted, "") << "a partial character must be held back";
    }
    out += emitted;
  }
  out += s.flush();
  EXPECT_EQ(out, t.decode(ids, false));
  EXPECT_NE(out.find("\xF0\x9F\xA6\x99"), std::string::npos);
}

TEST(Utf8StreamTest, RandomTokenSequencesDecodeToValidUtf8) {
  Loaded l = load("models/stories260K.gguf");
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> id_dist(-2, t.n_vocab() + 2);
  std::uniform_int_distribution<int> len_dist(0, 40);
  std::uniform_int_distribution<int> byte_bias(0, 3);
  for (int iter = 0; iter < 3000; ++iter) {
    Utf8Stream s;
    std::string out;
    int len = len_dist(rng);
    for (int k = 0; k < len; ++k) {
      // Favour byte tokens (ids 3..258) so that broken sequences are common.
      TokenId id = byte_bias(rng) == 0 ? id_dist(rng) : 3 + static_cast<TokenId>(rng() % 256);
      out += s.push(t.token_piece(id));
      // Checkpoint/restore in the middle sometimes.
      if (k % 7 == 3) {
        Utf8Stream r;
        r.set_pending(s.pending());
        s = r;
      }
    }
    out += s.flush();
    ASSERT_TRUE(is_valid_utf8(out)) << "iteration " << iter;
  }
  EXPECT_TRUE(is_valid_utf8("plain \xE2\x96\x81 ok"));
  EXPECT_FALSE(is_valid_utf8("\xE2\x96"));
  EXPECT_FALSE(is_valid_utf8("\xC1\xBF"));
}

// ---- Rejections --------------------------------------------------------------


std::vector<gguf::Value> strs(std::initializer_list<const char*> v) {
  std::vector<gguf::Value> out;
  for (const char* s : v) out.push_back(gguf::Value::str(s));
  return out;
}

TEST(TokenizerRejectTest, UnsupportedModelIsRefusedByName) {
  gguf::GgufWriter w;
  w.set("general.architecture", gguf::Value::str("bert"));
  w.set("tokenizer.ggml.model", gguf::Value::str("bert"));
  w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::kString, strs({"a", "b", "ab"})));
  std::unique_ptr<gguf::GgufFile> keep;
  auto r = from_writer(w, &keep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "tokenizer model 'bert' is not supported; supported: llama (SPM), gpt2 (byte-level BPE)");
}

TEST(TokenizerRejectTest, MissingOrInconsistentArraysAreCorruption) {
  {
    gguf::GgufWriter w;
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(w, &keep);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_NE(r.status().message().find("tokenizer.ggml.tokens"), std::string::npos) << r.status().message();
  }
  {
    gguf::GgufWriter w;
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::kString, strs({"<unk>", "<s>", "</s>"})));
    w.set("tokenizer.ggml.scores",
          gguf::Value::array(gguf::ValueType::kFloat32, {gguf::Value::f32(0), gguf::Value::f32(0)}));
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(w, &keep);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("tokenizer.ggml.scores"), std::string::npos) << m;
    EXPECT_NE(m.find("2"), std::string::npos) << m;
    EXPECT_NE(m.find("3"), std::string::npos) << m;
  }
  {
    gguf::GgufWriter w;
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::kString, strs({"<unk>", "<s>", "</s>"})));
    w.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::kInt32, {gguf::Value::i32(2)}));
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(w, &keep);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
    EXPECT_NE(r.status().message().find("tokenizer.ggml.token_type' has 1 entries but tokenizer.ggml.tokens has 3"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(TokenizerSyntheticTest, MergesByScoreAndUserDefinedTokens) {
  // A hand-built vocab: checks score-ordered merging, leftmost tie-breaking,
  // byte fallback to UNK when there are no byte tokens, user-defined tokens
  // matched without parse_special, and EOT detection by text.
  gguf::GgufWriter w;
  w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
  std::vector<const char*> toks = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c",
                                   "ab",    "bc",  "\xE2\x96\x81" "a", "<|im_end|>", "<tool>"};
  std::vector<gguf::Value> tv, sv, yv;
  std::vector<float> scores = {0, 0, 0, -1, -2, -2, -2, -1.5f, -0.5f, -3, 0, 0};
  std::vector<int> types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4};
  for (size_t i = 0; i < toks.size(); ++i) {
    tv.push_back(gguf::Value::str(toks[i]));
    sv.push_back(gguf::Value::f32(scores[i]));
    yv.push_back(gguf::Value::i32(types[i]));
  }
  w.set("tokenizer.ggml.tokens", gguf::Value::array(gguf::ValueType::kString, tv));
  w.set("tokenizer.ggml.scores", gguf::Value::array(gguf::ValueType::kFloat32, sv));
  w.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::kInt32, yv));
  w.set("tokenizer.ggml.add_space_prefix", gguf::Value::boolean(false));
  std::unique_ptr<gguf::GgufFile> keep;
  auto r = from_writer(w, &keep);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Tokenizer& t = **r;
  EXPECT_FALSE(t.add_space_prefix());
  // "abc": "bc" (-0.5) beats "ab" (-1.5).
  EXPECT_EQ(t.encode("abc", false), (std::vector<TokenId>{4, 8}));
  // "ab" alone merges.
  EXPECT_EQ(t.encode("ab", false), std::vector<TokenId>{7});
  // No byte tokens: unknown characters become UNK, one per byte.
  EXPECT_EQ(t.encode("x\xC3\xA9", false), (std::vector<TokenId>{0, 0, 0}));
  // User-defined "<tool>" is matched even without parse_special; "<s>" is not.
  EXPECT_EQ(t.encode("a<tool>b", false, false), (std::vector<TokenId>{4, 11, 5}));
  EXPECT_EQ(t.token_piece(11), "<tool>");
  // "<|im_end|>" is found by text: EOT, end-of-generation, control.
  EXPECT_EQ(t.eot_id(), 10);
  EXPECT_TRUE(t.is_eog(10));
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_EQ(t.token_type(10), TokenType::kControl);
  EXPECT_EQ(t.encode("a<|im_end|>", false, true), (std::vector<TokenId>{4, 10}));
  EXPECT_EQ(t.token_piece(10), "");
  // Without add_space_prefix decode keeps a leading space.
  EXPECT_EQ(t.decode({3, 4}), " a");
}

}  // namespace
}  // namespace spw
