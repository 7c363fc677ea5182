// A llama-architecture model with a byte-level BPE vocabulary (as DeepSeek
// LLM/Coder and Llama 3 ship): random weights around DeepSeek Coder's real
// vocabulary, loaded by Model and run by the engine on the CPU. Checks that
// the BPE tokenizer is what the model, the prompt and the streamed text use.
#include <gtest/gtest.h>

#include "engine/device_session.h"
#include "engine/engine_test_util.h"
#include "engine/generate.h"
#include "tools/modelgen/random_llama.h"

namespace spw::modelgen {
namespace {

TEST(BpeLlama, LoadsEncodesAndStreamsValidText) {
  RandomLlamaSpec s;
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 96;
  s.n_ctx = 256;
  s.type = gguf::GgmlType::kF16;
  s.seed = 11;
  s.vocab_path = spw::testing::source_path("tests/data/vocab/ggml-vocab-deepseek-coder.gguf");
  auto bytes = make_random_llama(s);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto model = spw::testing::model_from_bytes(std::move(*bytes));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const Tokenizer& tok = (*model)->tokenizer();
  EXPECT_EQ(tok.model_name(), "gpt2");
  EXPECT_EQ(tok.pre_tokenizer(), "deepseek-coder");
  EXPECT_EQ(tok.n_vocab(), 32256);
  EXPECT_TRUE(tok.add_bos_default());

  const std::string text = "def add(a, b):\n    return a + b  # \xE5\x8A\xA0\xE6\xB3\x95";  // "加法"
  std::vector<TokenId> prompt = tok.encode(text, tok.add_bos_default());
  ASSERT_GE(prompt.size(), 5u);
  EXPECT_EQ(prompt[0], tok.bos_id());
  EXPECT_EQ(tok.decode(prompt), text);

  DeviceSessionOptions o;
  o.device = Placement::parse("cpu").value();
  o.n_ctx = 256;
  auto ds = open_device_session(*model, o);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  GenerateOptions g;
  g.max_tokens = 48;
  g.sampler.temperature = 1.5f;  // random weights: sample widely, so byte tokens come up too
  g.sampler.seed = 5;
  g.ignore_eos = true;
  auto r = generate(*ds->session, prompt, g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tokens.size(), 48u);
  EXPECT_TRUE(is_valid_utf8(r->text));
  // The streamed text is the generated tokens' pieces through Utf8Stream.
  Utf8Stream stream;
  std::string expected;
  for (TokenId id : r->tokens) expected += stream.push(tok.token_piece(id));
  expected += stream.flush();
  EXPECT_EQ(r->text, expected);
}

}  // namespace
}  // namespace spw::modelgen
