// Sentence embeddings (engine/embedding.h) on generated models that declare a
// pooling type: against the double-precision reference (tests/reference, its
// own pooling code), the CPU against the Vulkan device (lavapipe in CI), and
// the refusals.
#include "engine/embedding.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/device_session.h"
#include "engine/device_test_util.h"
#include "engine/engine_test_util.h"
#include "tests/reference/llama_reference.h"

namespace spw {
namespace {

double cosine(const std::vector<float>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Embedder {
  std::shared_ptr<const Model> model;
  std::string bytes;
};

Embedder pooling_model(uint32_t pooling) {
  modelgen::RandomLlamaSpec spec = testing::small_spec();
  spec.pooling_type = pooling;
  auto bytes = modelgen::make_random_llama(spec);
  EXPECT_TRUE(bytes.ok());
  Embedder e;
  e.bytes = *bytes;
  auto m = testing::model_from_bytes(*bytes);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  e.model = *m;
  return e;
}

Result<SessionGroup> group(const std::shared_ptr<const Model>& m, const std::string& device) {
  SessionGroupOptions o;
  o.device = Placement::parse(device).value();
  o.n_sessions = 1;
  o.n_ctx = 128;
  return open_session_group(m, o);
}

const std::vector<TokenId> kTokens = {1, 400, 35, 77, 259, 12, 401, 99, 3, 250, 11, 480, 7};

TEST(Embedding, MatchesTheReferenceForEachPooling) {
  for (uint32_t pooling : {1u, 2u, 3u}) {
    SCOPED_TRACE(pooling);
    Embedder e = pooling_model(pooling);
    ASSERT_NE(e.model, nullptr);
    EXPECT_EQ(static_cast<uint32_t>(e.model->hparams().pooling), pooling);
    ASSERT_TRUE(embedding_support(e.model->hparams()).ok());
    auto file = gguf::GgufFile::parse(make_memory_file(e.bytes, "<generated>"));
    ASSERT_TRUE(file.ok());
    auto ref = reference::LlamaReference::load(**file);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto want = (*ref)->embed(kTokens, static_cast<int>(pooling));
    ASSERT_TRUE(want.ok());
    auto g = group(e.model, "cpu");
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    Session& s = *g->sessions.front();
    ASSERT_TRUE(s.eval(std::vector<TokenId>{5, 6, 7}).ok());  // earlier tokens are dropped first
    auto got = embed_tokens(s, kTokens, e.model->hparams().pooling);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->size(), static_cast<size_t>(e.model->hparams().n_embd));
    EXPECT_GT(cosine(*got, *want), 0.99999);
    double norm = 0;
    for (float v : *got) norm += static_cast<double>(v) * v;
    EXPECT_NEAR(norm, 1.0, 1e-5);
    EXPECT_EQ(s.n_past(), static_cast<int32_t>(kTokens.size()));
    // The same again: the session's state does not leak into the next one.
    auto again = embed_tokens(s, kTokens, e.model->hparams().pooling);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *got);
  }
}

TEST(Embedding, PoolingsDifferAndPrefixesMatterOnlyAsTheyShould) {
  Embedder e = pooling_model(1);
  auto g = group(e.model, "cpu");
  ASSERT_TRUE(g.ok());
  Session& s = *g->sessions.front();
  auto mean = embed_tokens(s, kTokens, Pooling::kMean);
  auto cls = embed_tokens(s, kTokens, Pooling::kCls);
  auto last = embed_tokens(s, kTokens, Pooling::kLast);
  ASSERT_TRUE(mean.ok() && cls.ok() && last.ok());
  EXPECT_LT(cosine(*mean, widen(*last)), 0.9999);
  // Causal: the first token's state does not see the rest.
  auto first_alone = embed_tokens(s, std::vector<TokenId>(kTokens.begin(), kTokens.begin() + 1), Pooling::kCls);
  ASSERT_TRUE(first_alone.ok());
  EXPECT_EQ(*first_alone, *cls);
}

TEST(Embedding, VulkanEqualsTheCpu) {
  std::string why;
  if (!vulkan_available(&why)) GTEST_SKIP() << why;
  for (uint32_t pooling : {1u, 3u}) {
    SCOPED_TRACE(pooling);
    Embedder e = pooling_model(pooling);
    auto cpu = group(e.model, "cpu");
    auto gpu = group(e.model, "vulkan");
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status().to_string();
    auto a = embed_tokens(*cpu->sessions.front(), kTokens, e.model->hparams().pooling);
    auto b = embed_tokens(*gpu->sessions.front(), kTokens, e.model->hparams().pooling);
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
    EXPECT_GT(cosine(*a, widen(*b)), 0.9999);
  }
}

TEST(Embedding, ModelsWithoutPoolingOrCausalAttentionAreRefusedSayingWhy) {
  LlamaHparams hp;
  Status st = embedding_support(hp);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("pooling_type is none"), std::string::npos) << st.message();
  hp.pooling = Pooling::kRank;
  EXPECT_FALSE(embedding_support(hp).ok());
  hp.pooling = Pooling::kMean;
  hp.causal = false;
  st = embedding_support(hp);
  EXPECT_NE(st.message().find("not causal"), std::string::npos) << st.message();
  Embedder e = pooling_model(1);
  auto g = group(e.model, "cpu");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(embed_tokens(*g->sessions.front(), {}, Pooling::kMean).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(embed_tokens(*g->sessions.front(), kTokens, Pooling::kNone).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spw
