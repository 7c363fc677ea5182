// Byte-level BPE tokenizer, its pre-tokenizers, and the SPM lstrip/rstrip
// attributes (Phi-3), against llama.cpp's test-tokenizer-0 vectors in
// tests/data/vocab (see tests/data/vocab/PROVENANCE.md).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_test_util.h"

namespace spw {
namespace {

using testing::data_path;
using testing::escape;
using testing::ids_str;
using testing::LoadedVocab;
using testing::load_vocab;
using testing::read_all;
using testing::read_outputs;
using testing::split_inputs;
using testing::from_writer;

std::string vocab_file(const std::string& name) { return "tests/data/vocab/ggml-vocab-" + name + ".gguf"; }

struct VectorCase {
  const char* vocab;
  const char* pre;  // expected tokenizer.ggml.pre as we report it
  const char* model;
  bool round_trip;  // decode(encode(s)) == s for every input
};

class LlamaCppVectorsTest : public ::testing::TestWithParam<VectorCase> {};

// Every .inp case against .out (test-tokenizer-0: add_special = false,
// parse_special = false), and for BPE the text back through decode() and
// through token_piece() + Utf8Stream.
TEST_P(LlamaCppVectorsTest, MatchesEveryVector) {
  const VectorCase& c = GetParam();
  LoadedVocab l = load_vocab(vocab_file(c.vocab));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.model_name(), c.model);
  EXPECT_EQ(t.pre_tokenizer(), c.pre);
  auto inputs = split_inputs(read_all(data_path(vocab_file(c.vocab) + ".inp")));
  auto outputs = read_outputs(read_all(data_path(vocab_file(c.vocab) + ".out")));
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GE(inputs.size(), 40u);
  int failures = 0, round_trip_failures = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<TokenId> got = t.encode(inputs[i], false, false);
    if (got != outputs[i]) {
      ++failures;
      ADD_FAILURE() << c.vocab << " case " << i << " input '" << escape(inputs[i])
                    << "'\n expected:" << ids_str(outputs[i]) << "\n      got:" << ids_str(got);
    }
    if (!c.round_trip) continue;
    std::string decoded = t.decode(got);
    Utf8Stream stream;
    std::string streamed;
    for (TokenId id : got) streamed += stream.push(t.token_piece(id));
    streamed += stream.flush();
    if (decoded != inputs[i] || streamed != inputs[i]) {
      ++round_trip_failures;
      ADD_FAILURE() << c.vocab << " case " << i << " round trip of '" << escape(inputs[i]) << "' gave '"
                    << escape(decoded) << "' / streamed '" << escape(streamed) << "'";
    }
  }
  std::printf("%s: %zu/%zu vectors match llama.cpp\n", c.vocab, inputs.size() - failures, inputs.size());
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(round_trip_failures, 0);
}

// Our extra inputs (special tokens with and without parse_special, Phi-3's
// stripping, Unicode whitespace, invalid UTF-8, ...) against the ids
// llama.cpp's libllama gives for them (tests/data/vocab/tools).
TEST_P(LlamaCppVectorsTest, MatchesExtraVectors) {
  const VectorCase& c = GetParam();
  LoadedVocab l = load_vocab(vocab_file(c.vocab));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  auto inputs = split_inputs(read_all(data_path("tests/data/vocab/spillway-extra.inp")));
  auto outputs = read_outputs(read_all(data_path(vocab_file(c.vocab) + ".extra.out")));
  ASSERT_GE(inputs.size(), 20u);
  ASSERT_EQ(outputs.size(), 2 * inputs.size());
  int failures = 0;
  for (bool special : {false, true}) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<TokenId>& want = outputs[(special ? inputs.size() : 0) + i];
      std::vector<TokenId> got = t.encode(inputs[i], false, special);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << c.vocab << " extra case " << i << (special ? " (parse_special)" : "") << " input '"
                      << escape(inputs[i]) << "'\n expected:" << ids_str(want) << "\n      got:" << ids_str(got);
      }
    }
  }
  std::printf("%s: %zu/%zu extra vectors match llama.cpp\n", c.vocab, 2 * inputs.size() - failures,
              2 * inputs.size());
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Vocabs, LlamaCppVectorsTest,
    ::testing::Values(VectorCase{"gpt-2", "gpt-2", "gpt2", true}, VectorCase{"mpt", "mpt", "gpt2", true},
                      VectorCase{"refact", "refact", "gpt2", true},
                      VectorCase{"starcoder", "starcoder", "gpt2", true},
                      VectorCase{"falcon", "falcon", "gpt2", true},
                      VectorCase{"deepseek-coder", "deepseek-coder", "gpt2", true},
                      VectorCase{"deepseek-llm", "deepseek-llm", "gpt2", true},
                      // SPM with rstrip special tokens; SPM's decode is not
                      // lossless around stripped whitespace, so ids only.
                      VectorCase{"phi-3", "", "llama", false}),
    [](const ::testing::TestParamInfo<VectorCase>& info) {
      std::string n = info.param.vocab;
      for (char& ch : n) {
        if (ch == '-') ch = '_';
      }
      return n;
    });

TEST(BpeTokenizerTest, Gpt2Basics) {
  LoadedVocab l = load_vocab(vocab_file("gpt-2"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.n_vocab(), 50257);
  EXPECT_EQ(t.bos_id(), 50256);
  EXPECT_EQ(t.eos_id(), 50256);
  EXPECT_EQ(t.unk_id(), -1);
  EXPECT_EQ(t.eot_id(), 50256);  // "<|endoftext|>" found by text
  EXPECT_EQ(t.eog_ids(), std::vector<TokenId>{50256});
  EXPECT_FALSE(t.add_bos_default());  // llama.cpp's BPE default; the GGUF does not say
  EXPECT_FALSE(t.add_space_prefix());
  EXPECT_EQ(t.token_text(50256), "<|endoftext|>");
  EXPECT_EQ(t.token_type(50256), TokenType::kControl);

  // "Hello world": "Hello" and "Ġworld".
  std::vector<TokenId> ids = t.encode("Hello world", false);
  EXPECT_EQ(ids, (std::vector<TokenId>{15496, 995}));
  EXPECT_EQ(t.token_text(995), "\xC4\xA0world");
  EXPECT_EQ(t.token_piece(995), " world");
  EXPECT_EQ(t.decode(ids), "Hello world");
  // BOS only when asked for and the vocab has one.
  EXPECT_EQ(t.encode("Hello world", true), (std::vector<TokenId>{50256, 15496, 995}));
  EXPECT_EQ(t.encode("", true), std::vector<TokenId>{50256});
  EXPECT_EQ(t.encode("", false), std::vector<TokenId>{});

  // Control tokens: matched only with parse_special; rendered only on request.
  EXPECT_EQ(t.encode("a<|endoftext|>b", false, true), (std::vector<TokenId>{64, 50256, 65}));
  std::vector<TokenId> plain = t.encode("a<|endoftext|>b", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0) << ids_str(plain);
  EXPECT_EQ(t.decode(plain), "a<|endoftext|>b");
  EXPECT_EQ(t.token_piece(50256), "");
  EXPECT_EQ(t.token_piece(50256, true), "<|endoftext|>");
  EXPECT_EQ(t.decode({64, 50256, 65}), "ab");
  EXPECT_EQ(t.token_piece(-1), "");
  EXPECT_EQ(t.token_piece(50257), "");
}

TEST(BpeTokenizerTest, PiecesEndingMidCharacterStreamAsValidUtf8) {
  LoadedVocab l = load_vocab(vocab_file("gpt-2"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  // GPT-2 has few CJK tokens: these characters are split across byte tokens.
  const std::string text = "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\xA6\x99 ok";  // "你好世界 🦙 ok"
  std::vector<TokenId> ids = t.encode(text, false);
  int partial = 0;
  Utf8Stream stream;
  std::string out;
  for (TokenId id : ids) {
    std::string piece = t.token_piece(id);
    partial += is_valid_utf8(piece) ? 0 : 1;
    std::string emitted = stream.push(piece);
    EXPECT_TRUE(is_valid_utf8(emitted)) << "token " << id;
    out += emitted;
  }
  out += stream.flush();
  EXPECT_GT(partial, 0) << "expected some tokens to end mid-character:" << ids_str(ids);
  EXPECT_EQ(out, text);
  EXPECT_EQ(t.decode(ids), text);
}

TEST(BpeTokenizerTest, RandomTokenSequencesStreamAsValidUtf8) {
  LoadedVocab l = load_vocab(vocab_file("deepseek-llm"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> id_dist(-2, t.n_vocab() + 2);
  for (int iter = 0; iter < 2000; ++iter) {
    Utf8Stream s;
    std::string out;
    for (int k = 0; k < 20; ++k) out += s.push(t.token_piece(id_dist(rng), k % 3 == 0));
    out += s.flush();
    ASSERT_TRUE(is_valid_utf8(out)) << "iteration " << iter;
  }
}

TEST(BpeTokenizerTest, UserDefinedTokensMatchWithoutParseSpecial) {
  // MPT (GPT-NeoX's vocab) has user-defined whitespace-run tokens: HF splits
  // them out before the model, and llama.cpp (so we) does too.
  LoadedVocab l = load_vocab(vocab_file("mpt"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  TokenId run = -1;
  for (TokenId id = 0; id < t.n_vocab(); ++id) {
    if (t.token_type(id) == TokenType::kUserDefined && t.token_text(id) == "    ") run = id;
  }
  ASSERT_GE(run, 0);
  std::vector<TokenId> ids = t.encode("a    b", false, false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), run), ids.end()) << ids_str(ids);
  EXPECT_EQ(t.token_piece(run), "    ");
  EXPECT_EQ(t.decode(ids), "a    b");
}

TEST(BpeTokenizerTest, DeepseekSpecialsAndBos) {
  LoadedVocab l = load_vocab(vocab_file("deepseek-llm"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.bos_id(), 100000);
  EXPECT_EQ(t.eos_id(), 100001);
  EXPECT_EQ(t.pad_id(), 100001);
  EXPECT_TRUE(t.add_bos_default());  // tokenizer.ggml.add_bos_token
  EXPECT_TRUE(t.is_eog(100001));
  std::vector<TokenId> ids = t.encode("Hi", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 100000);
  EXPECT_EQ(t.decode(ids), "Hi");
}

TEST(BpeTokenizerTest, InvalidUtf8IsEncodedAsLlamaCppDoes) {
  // llama.cpp turns each byte that does not start a sequence into U+FFFD
  // before splitting, so the ids are those of the replaced text.
  LoadedVocab l = load_vocab(vocab_file("gpt-2"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  EXPECT_EQ(t.encode("a\xFF" "b", false), t.encode("a\xEF\xBF\xBD" "b", false));
  EXPECT_EQ(t.encode("\x80", false), t.encode("\xEF\xBF\xBD", false));
  // Truncated sequence at the end: its lead byte alone is replaced.
  EXPECT_EQ(t.encode("x\xE4\xBD", false), t.encode("x\xEF\xBF\xBD\xEF\xBF\xBD", false));
}

TEST(BpeTokenizerTest, FingerprintsDifferAndAreStable) {
  LoadedVocab a = load_vocab(vocab_file("starcoder"));
  LoadedVocab b = load_vocab(vocab_file("starcoder"));
  LoadedVocab c = load_vocab(vocab_file("refact"));
  LoadedVocab d = load_vocab("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(a.tok && b.tok && c.tok && d.tok);
  EXPECT_EQ(a.tok->fingerprint(), b.tok->fingerprint());
  EXPECT_NE(a.tok->fingerprint(), c.tok->fingerprint());
  EXPECT_NE(a.tok->fingerprint(), d.tok->fingerprint());
}

// ---- synthetic vocabularies ---------------------------------------------------


gguf::Value str_array(const std::vector<std::string>& v) {
  std::vector<gguf::Value> items;
  for (const std::string& s : v) items.push_back(gguf::Value::str(s));
  return gguf::Value::array(gguf::ValueType::kString, items);
}

// Tokens: a b c ab bc abc Ġ Ġa <|eot_id|> <tool>; merges rank by order.
gguf::GgufWriter tiny_bpe(const std::string& pre, const std::vector<std::string>& merges, bool with_merges = true) {
  gguf::GgufWriter w;
  w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  if (!pre.empty()) w.set("tokenizer.ggml.pre", gguf::Value::str(pre));
  w.set("tokenizer.ggml.tokens",
        str_array({"a", "b", "c", "ab", "bc", "abc", "\xC4\xA0", "\xC4\xA0" "a", "<|eot_id|>", "<tool>"}));
  std::vector<gguf::Value> types;
  for (int ty : {1, 1, 1, 1, 1, 1, 1, 1, 3, 4}) types.push_back(gguf::Value::i32(ty));
  w.set("tokenizer.ggml.token_type", gguf::Value::array(gguf::ValueType::kInt32, types));
  if (with_merges) w.set("tokenizer.ggml.merges", str_array(merges));
  return w;
}

TEST(BpeSyntheticTest, MergesByRankThenLeftmost) {
  {
    // "b c" outranks "a b": abc -> a + bc.
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(tiny_bpe("gpt-2", {"b c", "a b", "ab c"}), &keep);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)->encode("abc", false), (std::vector<TokenId>{0, 4}));
    EXPECT_EQ((*r)->pre_tokenizer(), "gpt-2");
  }
  {
    // "a b" first, then "ab c": abc -> abc.
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(tiny_bpe("gpt-2", {"a b", "b c", "ab c"}), &keep);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Tokenizer& t = **r;
    EXPECT_EQ(t.encode("abc", false), std::vector<TokenId>{5});
    // Space is the byte symbol Ġ; " a" merges only through "Ġ a".
    EXPECT_EQ(t.encode(" a", false), (std::vector<TokenId>{6, 0}));
    // Bytes with no token are dropped (llama.cpp's fallback finds none).
    EXPECT_EQ(t.encode("axb", false), (std::vector<TokenId>{0, 1}));
    // User-defined "<tool>" is split out without parse_special; "<|eot_id|>"
    // (control, and EOT by its text) only with it.
    EXPECT_EQ(t.encode("a<tool>b", false), (std::vector<TokenId>{0, 9, 1}));
    EXPECT_EQ(t.encode("a<|eot_id|>", false, true), (std::vector<TokenId>{0, 8}));
    EXPECT_EQ(t.eot_id(), 8);
    EXPECT_TRUE(t.is_eog(8));
    EXPECT_EQ(t.bos_id(), -1);  // no BOS unless the GGUF names one
    EXPECT_EQ(t.encode("ab", true), std::vector<TokenId>{3});
  }
  {
    // Equal-rank pairs cannot exist, but two occurrences of one pair tie:
    // the leftmost merges first. "bcbc" with "b c" then "c b": bc + bc.
    std::unique_ptr<gguf::GgufFile> keep;
    auto r = from_writer(tiny_bpe("gpt-2", {"b c", "c b"}), &keep);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)->encode("bcbc", false), (std::vector<TokenId>{4, 4}));
  }
}

TEST(BpeSyntheticTest, Llama3IgnoresMergesForWholeWordTokens) {
  // No merges at all: with llama-bpe a word that is a token is taken whole
  // (llama.cpp's ignore_merges); with gpt-2 it stays in characters.
  std::unique_ptr<gguf::GgufFile> k1, k2;
  auto llama3 = from_writer(tiny_bpe("llama-bpe", {}), &k1);
  auto gpt2 = from_writer(tiny_bpe("gpt-2", {}), &k2);
  ASSERT_TRUE(llama3.ok() && gpt2.ok());
  EXPECT_EQ((*llama3)->encode("abc", false), std::vector<TokenId>{5});
  EXPECT_EQ((*gpt2)->encode("abc", false), (std::vector<TokenId>{0, 1, 2}));
  // llama-bpe wants BOS by default (there is none here, so nothing is added).
  EXPECT_TRUE((*llama3)->add_bos_default());
  EXPECT_FALSE((*gpt2)->add_bos_default());
}

TEST(BpeSyntheticTest, MissingPreIsDefault) {
  std::unique_ptr<gguf::GgufFile> keep;
  auto r = from_writer(tiny_bpe("", {"a b"}), &keep);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->pre_tokenizer(), "default");
  EXPECT_EQ((*r)->encode("ab", false), std::vector<TokenId>{3});
}

TEST(BpeSyntheticTest, UnknownPreIsRefusedByName) {
  std::unique_ptr<gguf::GgufFile> keep;
  auto r = from_writer(tiny_bpe("no-such-pre", {"a b"}), &keep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tokenizer.ggml.pre 'no-such-pre'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("llama-bpe"), std::string::npos) << r.status().message();
  // deepseek-v3 and chameleon, the last two names llama.cpp maps, load.
  for (const char* pre : {"deepseek-v3", "chameleon"}) {
    auto ok = from_writer(tiny_bpe(pre, {"a b"}), &keep);
    ASSERT_TRUE(ok.ok()) << pre << ": " << ok.status().to_string();
    EXPECT_EQ((*ok)->pre_tokenizer(), pre);
  }
}

TEST(BpeSyntheticTest, MissingOrMalformedMergesAreCorruption) {
  gguf::GgufWriter w = tiny_bpe("gpt-2", {}, /*with_merges=*/false);
  std::unique_ptr<gguf::GgufFile> keep;
  auto r = from_writer(w, &keep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(r.status().message(), "missing metadata key 'tokenizer.ggml.merges'");

  gguf::GgufWriter w2 = tiny_bpe("gpt-2", {});
  w2.set("tokenizer.ggml.merges", gguf::Value::array(gguf::ValueType::kInt32, {gguf::Value::i32(1)}));
  auto r2 = from_writer(w2, &keep);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r2.status().message().find("tokenizer.ggml.merges"), std::string::npos);
}

// ---- SPM lstrip / rstrip (Phi-3) ------------------------------------------------

TEST(SpmStripTest, Phi3SpecialTokensSwallowFollowingWhitespace) {
  LoadedVocab l = load_vocab(vocab_file("phi-3"));
  ASSERT_NE(l.tok, nullptr);
  const Tokenizer& t = *l.tok;
  const TokenId user = t.find_token("<|user|>");
  const TokenId end = t.find_token("<|end|>");
  const TokenId eos = t.find_token("</s>");
  ASSERT_GE(user, 0);
  ASSERT_GE(end, 0);
  ASSERT_GE(eos, 0);
  auto cat = [](std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // rstrip: the whitespace after "<|user|>" goes; the text after a special
  // token still gets SPM's space prefix ("▁Hi").
  EXPECT_EQ(t.encode("<|user|>\n  Hi", false, true), cat({user}, t.encode("Hi", false)));
  EXPECT_EQ(t.encode("<|user|>Hi", false, true), t.encode("<|user|>\n  Hi", false, true));
  // No lstrip: the whitespace before "<|end|>" stays.
  std::vector<TokenId> before = t.encode("Hi \n<|end|>", false, true);
  EXPECT_EQ(before.back(), end);
  EXPECT_EQ(std::vector<TokenId>(before.begin(), before.end() - 1), t.encode("Hi \n", false));
  // "</s>" is user-defined here: split out (and rstripped) even without parse_special.
  EXPECT_EQ(t.encode("a</s>  b", false, false), cat(cat(t.encode("a", false), {eos}), t.encode("b", false)));
  // <s> keeps what follows it (llama.cpp exempts <unk>, <s>, <|endoftext|>).
  EXPECT_EQ(t.encode("<s> b", false, true), cat({1}, t.encode(" b", false)));
  // The same tokens in a vocabulary not named Phi-3 do not strip.
  LoadedVocab llama = load_vocab("tests/data/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(llama.tok, nullptr);
  EXPECT_EQ(llama.tok->encode("</s>  b", false, true),
            cat({2}, llama.tok->encode("  b", false)));
}

}  // namespace
}  // namespace spw
