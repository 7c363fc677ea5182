// Echo models (tools/modelgen/echo_llama.h): layout, the attention peak
// recomputed from the stored weights, and the real engine (Session, generate,
// CPU and Vulkan placements) replaying the prompt's last `period` tokens.
#include "tools/modelgen/echo_llama.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstring>
#include <random>

#include "engine/device_session.h"
#include "engine/device_test_util.h"
#include "engine/engine_test_util.h"
#include "engine/generate.h"

namespace spw::modelgen {
namespace {

using gguf::GgmlType;
using ::testing::HasSubstr;

EchoLlamaSpec echo_spec(uint32_t period, uint32_t n_ctx = 2048) {
  EchoLlamaSpec s;
  s.period = period;
  s.n_ctx = n_ctx;
  s.vocab_path = spw::testing::stories_path();  // 512 tokens
  return s;
}

std::shared_ptr<const Model> echo_model(const EchoLlamaSpec& spec) {
  auto bytes = make_echo_llama(spec);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  if (!bytes.ok()) return nullptr;
  auto m = spw::testing::model_from_bytes(std::move(*bytes));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

// What the model must generate: prompt[P-L], ..., prompt[P-1], prompt[P-L], ...
std::vector<TokenId> replay(const std::vector<TokenId>& prompt, uint32_t period, size_t n) {
  std::vector<TokenId> out;
  for (size_t k = 0; k < n; ++k) out.push_back(prompt[prompt.size() - period + k % period]);
  return out;
}

// `n` random ids of the stories vocab, BOS first; none is EOS unless allowed.
std::vector<TokenId> random_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> id(3, 511);
  std::vector<TokenId> p{1};
  while (p.size() < n) p.push_back(id(rng));
  return p;
}

GenerateOptions greedy(int max_tokens, bool ignore_eos = true) {
  GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampler.temperature = 0.0f;
  o.ignore_eos = ignore_eos;
  return o;
}

Result<DeviceSession> open(const std::shared_ptr<const Model>& model, const std::string& placement) {
  DeviceSessionOptions o;
  o.device = Placement::parse(placement).value();
  o.n_ctx = model->hparams().n_ctx_train;
  return open_device_session(model, o);
}

// Greedy generation of 2L + 3 tokens on `placement` for random prompts of the
// given lengths (and a story text when `with_text`), compared with the replay.
void expect_replay(const std::string& placement, uint32_t period, const std::vector<size_t>& prompt_lengths,
                   bool with_text = true) {
  SCOPED_TRACE(placement + ", period " + std::to_string(period));
  auto model = echo_model(echo_spec(period));
  ASSERT_NE(model, nullptr);
  auto ds = open(model, placement);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  const int n = static_cast<int>(2 * period + 3);
  for (size_t len : prompt_lengths) {
    SCOPED_TRACE("prompt of " + std::to_string(len) + " tokens");
    const std::vector<TokenId> prompt = random_prompt(len, static_cast<uint32_t>(len * 31 + period));
    ASSERT_TRUE(ds->session->truncate(0).ok());
    auto r = generate(*ds->session, prompt, greedy(n));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, replay(prompt, period, n));
  }
  if (!with_text) return;
  // Text: a story prompt, long enough for the period.
  std::string text = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  std::vector<TokenId> prompt = model->tokenizer().encode(text, true);
  while (prompt.size() < period) {
    text += " She saw a big tree and a red ball.";
    prompt = model->tokenizer().encode(text, true);
  }
  ASSERT_TRUE(ds->session->truncate(0).ok());
  auto r = generate(*ds->session, prompt, greedy(n));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, replay(prompt, period, n));
}

TEST(EchoLlama, LayoutAndStats) {
  EchoLlamaStats stats;
  auto w = echo_llama_writer(Env::default_env(), echo_spec(7, 512), &stats);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(stats.n_vocab, 512u);
  EXPECT_EQ(stats.n_head, 9u);  // ceil(513 / 64)
  EXPECT_EQ(stats.n_embd, 576u);
  EXPECT_NEAR(stats.attention_margin, kEchoAttentionMargin, 1e-6);
  EXPECT_EQ(stats.runner_up_offset, 1);
  auto bytes = w->serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), stats.file_size);
  auto g = gguf::GgufFile::parse(make_memory_file(std::move(*bytes), "echo.gguf"));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*(*g)->get_string("general.architecture"), "llama");
  EXPECT_EQ(*(*g)->get_u32("llama.block_count"), 1u);
  EXPECT_EQ(*(*g)->get_u32("llama.context_length"), 512u);
  EXPECT_EQ(*(*g)->get_u32("llama.attention.head_count_kv"), 9u);
  EXPECT_EQ(*(*g)->get_u32("llama.rope.dimension_count"), 64u);
  EXPECT_EQ(*(*g)->get_u32("tokenizer.ggml.eos_token_id"), 2u);
  uint64_t n_params = 0;
  for (const gguf::TensorInfo& t : (*g)->tensors()) {
    EXPECT_EQ(t.type, static_cast<uint32_t>(GgmlType::kF32)) << t.name;
    n_params += t.n_elements;
  }
  EXPECT_EQ((*g)->tensors().size(), 12u);
  EXPECT_EQ(n_params, stats.n_params);
  auto m = Model::load_from(std::move(*g));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE((*m)->output_tied());
}

// The attention scores recomputed in double from the stored Q/K weights, with
// the engine's RMSNorm and RoPE: every head peaks at distance m - n = L - 1
// and beats every other distance in the context by the margin.
TEST(EchoLlama, StoredWeightsPeakAtThePeriodOverTheWholeContext) {
  for (uint32_t period : {1u, 7u, 40u, 2000u}) {
    SCOPED_TRACE(period);
    auto model = echo_model(echo_spec(period));
    ASSERT_NE(model, nullptr);
    const LlamaHparams& hp = model->hparams();
    const int64_t e = hp.n_embd, hd = hp.head_dim(), c = hp.n_vocab;
    const double xc = 1.0 / std::sqrt(2.0 / static_cast<double>(e) + hp.rms_eps);
    std::vector<std::complex<double>> q0;
    for (int32_t h = 0; h < hp.n_head; ++h) {
      std::vector<std::complex<double>> qk;  // per pair: q conj(k)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const int64_t row = h * hd + 2 * i;
        auto entry = [&](const WeightMatrix& w, int64_t r) {
          std::vector<float> buf(static_cast<size_t>(e));
          std::memcpy(buf.data(), w.data + r * w.row_bytes, w.row_bytes);
          for (int64_t j = 0; j < e; ++j) {
            if (j != c) {
              EXPECT_EQ(buf[static_cast<size_t>(j)], 0.0f) << "Q/K read only dim C";
            }
          }
          return static_cast<double>(buf[static_cast<size_t>(c)]) * xc;
        };
        const std::complex<double> q(entry(model->layer(0).wq, row), entry(model->layer(0).wq, row + 1));
        const std::complex<double> k(entry(model->layer(0).wk, row), entry(model->layer(0).wk, row + 1));
        qk.push_back(q * std::conj(k));
      }
      if (h == 0) {
        q0 = qk;
      } else {
        ASSERT_EQ(qk, q0) << "head " << h;
      }
    }
    // score(dist) = kq_scale * sum_i Re(q_i conj(k_i) e^{i theta_i dist}).
    std::vector<double> score(static_cast<size_t>(hp.n_ctx_train));
    for (int64_t dist = 0; dist < hp.n_ctx_train; ++dist) {
      double s = 0;
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double theta = std::pow(static_cast<double>(hp.rope_freq_base), -2.0 * i / hp.n_rot);
        s += (q0[static_cast<size_t>(i)] * std::polar(1.0, theta * static_cast<double>(dist))).real();
      }
      score[static_cast<size_t>(dist)] = s / std::sqrt(static_cast<double>(hd));
    }
    double runner_up = -1e300;
    for (size_t d = 0; d < score.size(); ++d) {
      if (d != period - 1) runner_up = std::max(runner_up, score[d]);
    }
    EXPECT_GE(score[period - 1] - runner_up, 0.99 * kEchoAttentionMargin);
  }
}

TEST(EchoLlama, CpuGreedyReplaysTheLastPeriod) {
  expect_replay("cpu", 7, {7, 8, 100});
  expect_replay("cpu", 40, {40, 41, 300, 1950});  // the last: up to position 2033 of 2048
}

TEST(EchoLlama, VulkanGreedyReplaysTheLastPeriod) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  expect_replay("vulkan", 7, {7, 100});
  expect_replay("vulkan", 40, {300}, /*with_text=*/false);  // lavapipe: ~70 ms a token
}

// The distribution is near one-hot: the next token's logit leads by the gap,
// and the server's default sampling (temperature 0.8, top-k/p, min-p) gives
// the same tokens as greedy.
TEST(EchoLlama, LogitGapAndSampledTokens) {
  const uint32_t period = 12;
  auto model = echo_model(echo_spec(period));
  ASSERT_NE(model, nullptr);
  auto ds = open(model, "cpu");
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  const std::vector<TokenId> prompt = random_prompt(64, 5);
  auto logits = ds->session->eval(prompt);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  const TokenId want = prompt[prompt.size() - period];
  float best_other = -1e30f;
  for (size_t j = 0; j < logits->size(); ++j) {
    if (static_cast<TokenId>(j) != want) best_other = std::max(best_other, (*logits)[j]);
  }
  EXPECT_GE((*logits)[static_cast<size_t>(want)] - best_other, 0.99 * kEchoOutputGap);

  GenerateOptions o;
  o.max_tokens = 3 * period;
  o.ignore_eos = true;
  o.sampler.seed = 3;  // defaults otherwise
  ASSERT_TRUE(ds->session->truncate(0).ok());
  auto r = generate(*ds->session, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, replay(prompt, period, 3 * period));
}

// The intended use: a known text at the end of the prompt, then an end
// marker. The model says the text again and the replayed marker ends it.
TEST(EchoLlama, ReplayedEosOrStopStringEndsTheGeneration) {
  const Tokenizer& tok = *spw::testing::stories_tokenizer();
  std::vector<TokenId> prompt = tok.encode("Once upon a time, there was a cat.", true);
  const std::vector<TokenId> said = tok.encode("Tom said hi to the dog.", false);
  std::string said_text;
  for (TokenId id : said) said_text += tok.token_piece(id);

  {  // ... text EOS: the replayed EOS stops with "stop", EOS not in the output.
    std::vector<TokenId> p = prompt;
    p.insert(p.end(), said.begin(), said.end());
    p.push_back(tok.eos_id());
    auto model = echo_model(echo_spec(static_cast<uint32_t>(said.size() + 1)));
    ASSERT_NE(model, nullptr);
    auto ds = open(model, "cpu");
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    auto r = generate(*ds->session, p, greedy(100, /*ignore_eos=*/false));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->finish_reason, FinishReason::kStop);
    EXPECT_EQ(r->tokens, said);
    EXPECT_EQ(r->text, said_text);
  }
  {  // ... text " END" with stop string "END": the text before it.
    std::vector<TokenId> p = prompt;
    const std::vector<TokenId> end = tok.encode(" END", false);
    p.insert(p.end(), said.begin(), said.end());
    p.insert(p.end(), end.begin(), end.end());
    auto model = echo_model(echo_spec(static_cast<uint32_t>(said.size() + end.size())));
    ASSERT_NE(model, nullptr);
    auto ds = open(model, "cpu");
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    GenerateOptions o = greedy(100);
    o.stop = {"END"};
    auto r = generate(*ds->session, p, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->finish_reason, FinishReason::kStop);
    std::string end_text;
    for (TokenId id : end) end_text += tok.token_piece(id);
    const std::string full = said_text + end_text;
    EXPECT_EQ(r->text, full.substr(0, full.find("END")));
  }
}

TEST(EchoLlama, RejectsBadSpecs) {
  auto expect_bad = [](EchoLlamaSpec s, const char* needle) {
    auto r = make_echo_llama(s);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    EXPECT_THAT(r.status().message(), HasSubstr(needle));
  };
  expect_bad(echo_spec(0), "period 0");
  expect_bad(echo_spec(64, 64), "period 64");
  EchoLlamaSpec s = echo_spec(7);
  s.vocab_path = spw::testing::source_path("tests/data/ggml-vocab-llama-spm.gguf");
  expect_bad(s, "32000 tokens");
  // Base 1: every pair turns at 1 rad per position, so distance 44 (~7 turns)
  // is nearly the peak again; fine in a 16-position context, not in 2048.
  s = echo_spec(4);
  s.rope_freq_base = 1.0f;
  expect_bad(s, "smaller n_ctx");
  s.n_ctx = 16;
  EXPECT_TRUE(make_echo_llama(s).ok());
  s.vocab_path.clear();
  expect_bad(s, "vocab_path");
}

}  // namespace
}  // namespace spw::modelgen
