// BPE pre-tokenizers. The id-level checks against llama.cpp's vectors are in
// bpe_test.cpp; here: the splits of the pre-tokenizers whose vocabularies are
// not available (Llama 3's llama-bpe, qwen2, smollm, deepseek-v3, chameleon),
// against splits made offline with Python's `regex` module from llama.cpp's
// regexes (deepseek-v3's \p{S} without '~' written as a set difference), and
// checked there against llama.cpp's own unicode_regex_split: no differences
// in 352 cases. This checks the split, not the ids.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace spw {
namespace {

struct SplitCase {
  const char* pre;
  const char* input;
  std::vector<const char*> words;
};

// Provenance: tests/data/vocab/tools/make_split_vectors.py.
const std::vector<SplitCase>& split_cases() {
  static const std::vector<SplitCase> kCases = {
#include "tokenizer/pre_tokenizer_splits.inc"
  };
  return kCases;
}

std::string show(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += "[" + w + "]";
  return s;
}

// Every stored split of the given pre-tokenizers against ours; `expected`
// cases in all.
void expect_splits_match(std::initializer_list<const char*> pres, int expected) {
  int checked = 0, failures = 0;
  for (const char* pre : pres) {
    auto p = PreTokenizer::create(pre);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    for (const SplitCase& c : split_cases()) {
      if (std::string(c.pre) != pre) continue;
      std::vector<std::string> want(c.words.begin(), c.words.end());
      std::vector<std::string> got = (*p)->split(c.input);
      ++checked;
      if (got != want) {
        ++failures;
        ADD_FAILURE() << pre << " input '" << c.input << "'\n expected " << show(want) << "\n      got " << show(got);
      }
    }
  }
  std::printf("pre-tokenizer splits: %d/%d match\n", checked - failures, checked);
  EXPECT_EQ(checked, expected);
  EXPECT_EQ(failures, 0);
}

TEST(PreTokenizerTest, SplitsMatchLlamaCppRegexesForLlama3Qwen2Smollm) {
  expect_splits_match({"llama-bpe", "qwen2", "smollm"}, 198);
}

// llama.cpp's test-tokenizer-0 texts and our extra texts (66), plus 11
// targeted ones (digit runs, CJK and kana ranges, '~', symbols, marks,
// newlines and whitespace runs, chameleon's sentinels), for each set.
TEST(PreTokenizerTest, SplitsMatchLlamaCppRegexesForDeepseekV3Chameleon) {
  expect_splits_match({"deepseek-v3", "chameleon"}, 154);
}

TEST(PreTokenizerTest, DeepseekV3TildeIsNotASymbol) {
  // llama.cpp's \p{S} leaves out ASCII '~': it prefixes letters like a
  // space would, never joins a punctuation run, and alone it is the text
  // between matches. (Plain \p{S} would give " ~~", " ~", "a", " (~)".)
  auto p = PreTokenizer::create("deepseek-v3");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->split(" ~~b ~a (~) 12345"),
            (std::vector<std::string>{" ", "~", "~b", " ", "~a", " (", "~", ")", " ", "123", "45"}));
  EXPECT_EQ((*p)->split("\xE4\xB8\x80\xE3\x81\x82x"),
            (std::vector<std::string>{"\xE4\xB8\x80\xE3\x81\x82", "x"}));
  // Invalid UTF-8, as llama.cpp's unicode_regex_split splits it (run through
  // tests/data/vocab/tools/llama_split_ref.cpp): a surrogate is "other" and
  // prefixes a letter; U+FFFD (from a stray byte) is a symbol.
  EXPECT_EQ((*p)->split("\xED\xA0\x80" "a"), (std::vector<std::string>{"\xED\xA0\x80" "a"}));
  EXPECT_EQ((*p)->split("x\xED\xA0\x80\xED\xA0\x80!"),
            (std::vector<std::string>{"x", "\xED\xA0\x80\xED\xA0\x80", "!"}));
  EXPECT_EQ((*p)->split("\xFF" "a"), (std::vector<std::string>{"\xEF\xBF\xBD", "a"}));
  EXPECT_EQ((*p)->split("a\xEF\xBF\xBD!b"), (std::vector<std::string>{"a", "\xEF\xBF\xBD!", "b"}));
  EXPECT_FALSE((*p)->add_bos_default());
  EXPECT_FALSE((*p)->ignore_merges());
  auto c = PreTokenizer::create("chameleon");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->add_bos_default());
}

TEST(PreTokenizerTest, Llama3SplitsAsDocumented) {
  auto p = PreTokenizer::create("llama-bpe");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->split("I'M 12345 ok!!\n\n  x"),
            (std::vector<std::string>{"I", "'M", " ", "123", "45", " ok", "!!\n\n", " ", " x"}));
  EXPECT_TRUE((*p)->ignore_merges());
  EXPECT_TRUE((*p)->add_bos_default());
  EXPECT_EQ((*p)->name(), "llama-bpe");
}

TEST(PreTokenizerTest, WhitespaceIsUnicodeWhiteSpaceOnly) {
  // U+180E is \s for PCRE's UCP mode but not for llama.cpp (nor Unicode's
  // White_Space since 6.3): it must not join a whitespace run.
  auto p = PreTokenizer::create("gpt-2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->split("a \xE1\xA0\x8E b"), (std::vector<std::string>{"a", " \xE1\xA0\x8E", " b"}));
  // U+3000 is whitespace: "\s+(?!\S)" keeps the last one for the word.
  EXPECT_EQ((*p)->split("a\xE3\x80\x80\xE3\x80\x80" "b"),
            (std::vector<std::string>{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
}

TEST(PreTokenizerTest, DeepseekTrailingWhitespaceIsItsOwnWord) {
  // deepseek-llm: newlines are cut out first, then "\s+$" takes trailing
  // whitespace (its `$` is ECMAScript's: only at the end of the word).
  auto p = PreTokenizer::create("deepseek-llm");
  ASSERT_TRUE(p.ok());
  std::vector<std::string> w = (*p)->split("x  \n");
  std::string joined;
  for (const auto& s : w) joined += s;
  EXPECT_EQ(joined, "x  \n");
  EXPECT_EQ(w, (std::vector<std::string>{"x", "  ", "\n"}));
}

TEST(PreTokenizerTest, InvalidUtf8BecomesReplacementCharacters) {
  auto p = PreTokenizer::create("gpt-2");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->split("a\xFF"), (std::vector<std::string>{"a", "\xEF\xBF\xBD"}));
  EXPECT_EQ((*p)->split("\xC0\xAF"), (std::vector<std::string>{"/"}));  // overlong: decoded, not rejected
  EXPECT_EQ((*p)->split(""), std::vector<std::string>{});
  // Beyond U+10FFFF (llama.cpp throws there): U+FFFD.
  EXPECT_EQ((*p)->split("\xF7\xBF\xBF\xBF"), std::vector<std::string>{"\xEF\xBF\xBD"});
}

TEST(PreTokenizerTest, NamesAsLlamaCppMapsThem) {
  std::vector<std::string_view> names = PreTokenizer::supported_names();
  for (std::string_view n : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "deepseek-llm", "deepseek-coder",
                             "falcon", "starcoder", "mpt", "refact", "smollm", "command-r", "olmo", "tekken",
                             "deepseek-v3", "chameleon"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
    auto p = PreTokenizer::create(n);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status().to_string();
    EXPECT_EQ((*p)->name(), n);
    // Every pre-tokenizer keeps every byte of valid UTF-8.
    const std::string text = "Hello, World! 123 4567 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99\n\n\t x's  ";
    std::string joined;
    for (const auto& w : (*p)->split(text)) joined += w;
    EXPECT_EQ(joined, text) << n;
  }
  auto empty = PreTokenizer::create("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->name(), "default");
  auto bad = PreTokenizer::create("gpt-5");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message().rfind("tokenizer.ggml.pre 'gpt-5' is not a supported BPE pre-tokenizer", 0), 0u)
      << bad.status().message();
}

TEST(PreTokenizerTest, LongWhitespaceRunsStayFast) {
  auto p = PreTokenizer::create("llama-bpe");
  ASSERT_TRUE(p.ok());
  std::string text = "a" + std::string(200000, ' ') + "b";
  auto w = (*p)->split(text);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[1].size(), 199999u);
  EXPECT_EQ(w[2], " b");
  // deepseek-llm's "\s+$" against a long run that does not reach the end.
  auto d = PreTokenizer::create("deepseek-llm");
  ASSERT_TRUE(d.ok());
  auto dw = (*d)->split(std::string(100000, ' ') + "5");
  ASSERT_EQ(dw.size(), 2u);
  EXPECT_EQ(dw[1], "5");
}

}  // namespace
}  // namespace spw
