// Session over the CPU backend: paged KV equivalence, exhaustion, threads,
// batch invariance, hybrid stages.
#include "engine/session.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "engine/batch_test_util.h"
#include "engine/engine_test_util.h"

namespace spw {
namespace {

using testing::make_pool;
using testing::make_session;

std::vector<TokenId> some_tokens(int n, int n_vocab, int salt = 0) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + 11 + salt * 101) % n_vocab;
  t[0] = 1;  // BOS
  return t;
}

std::vector<float> all_logits(Session& s, std::span<const TokenId> toks) {
  auto r = s.eval_all_logits(toks);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<float>{};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Session, PagedKvMatchesContiguousBlock) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  auto toks = some_tokens(45, m->hparams().n_vocab);
  auto s_contig = make_session(m, cpu, make_pool(*m, 512, 1));
  auto ref = all_logits(*s_contig, toks);
  ASSERT_EQ(ref.size(), toks.size() * 512u);
  for (int bt : {1, 16}) {
    auto s = make_session(m, cpu, make_pool(*m, bt, 64));
    EXPECT_TRUE(bitwise_equal(all_logits(*s, toks), ref)) << "block_tokens " << bt;
  }
}

TEST(Session, BatchSizeAndUbatchInvariance) {
  auto m = testing::random_model(testing::small_spec(gguf::GgmlType::kQ8_0));
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  auto toks = some_tokens(30, m->hparams().n_vocab);
  auto s_all = make_session(m, cpu, make_pool(*m, 16, 8));
  auto ref = all_logits(*s_all, toks);
  SessionOptions so;
  so.n_ubatch = 7;
  auto s_ub = make_session(m, cpu, make_pool(*m, 16, 8), so);
  EXPECT_TRUE(bitwise_equal(all_logits(*s_ub, toks), ref));
  // One token at a time: eval() logits equal the batched rows.
  auto s_one = make_session(m, cpu, make_pool(*m, 4, 16));
  const size_t V = static_cast<size_t>(m->hparams().n_vocab);
  for (size_t i = 0; i < toks.size(); ++i) {
    auto r = s_one->eval(std::span<const TokenId>(&toks[i], 1));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(0, std::memcmp(r->data(), ref.data() + i * V, V * sizeof(float))) << "position " << i;
  }
  EXPECT_EQ(s_one->n_past(), 30);
}

TEST(Session, InterleavedSequencesShareAPool) {
  auto m = testing::random_model(testing::small_spec(gguf::GgmlType::kF16));
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  auto a = some_tokens(20, m->hparams().n_vocab, 1), b = some_tokens(23, m->hparams().n_vocab, 2);
  auto ra = all_logits(*make_session(m, cpu, make_pool(*m, 4, 8)), a);
  auto rb = all_logits(*make_session(m, cpu, make_pool(*m, 4, 8)), b);

  auto shared = make_pool(*m, 4, 16);
  auto sa = make_session(m, cpu, shared), sb = make_session(m, cpu, shared);
  std::vector<float> la, lb;
  // Alternate chunks so the two sequences' blocks interleave in the pool.
  for (size_t off = 0; off < 23; off += 5) {
    if (off < a.size()) {
      auto r = sa->eval_all_logits(std::span<const TokenId>(a).subspan(off, std::min<size_t>(5, a.size() - off)));
      ASSERT_TRUE(r.ok());
      la.insert(la.end(), r->begin(), r->end());
    }
    auto r = sb->eval_all_logits(std::span<const TokenId>(b).subspan(off, std::min<size_t>(5, b.size() - off)));
    ASSERT_TRUE(r.ok());
    lb.insert(lb.end(), r->begin(), r->end());
  }
  EXPECT_TRUE(bitwise_equal(la, ra));
  EXPECT_TRUE(bitwise_equal(lb, rb));
  EXPECT_EQ(shared->blocks_in_use(), 5 + 6);
  sa.reset();
  EXPECT_EQ(shared->blocks_in_use(), 6);  // a's blocks returned on destruction
}

TEST(Session, KvExhaustionLeavesSessionUsable) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  auto pool = make_pool(*m, 4, 3);  // 12 positions
  auto s = make_session(m, cpu, pool);
  auto toks = some_tokens(16, 512);
  ASSERT_TRUE(s->eval(std::span<const TokenId>(toks).first(10)).ok());
  const auto before = std::vector<float>(s->last_logits().begin(), s->last_logits().end());
  auto r = s->eval(std::span<const TokenId>(toks).subspan(10, 5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s->n_past(), 10);
  EXPECT_EQ(pool->blocks_in_use(), 3);
  EXPECT_TRUE(bitwise_equal(std::vector<float>(s->last_logits().begin(), s->last_logits().end()), before));
  // After truncating, re-evaluation matches a fresh session exactly.
  ASSERT_TRUE(s->truncate(6).ok());
  EXPECT_EQ(pool->blocks_in_use(), 2);
  auto r2 = s->eval(std::span<const TokenId>(toks).subspan(6, 6));
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  auto fresh = make_session(m, cpu, make_pool(*m, 16, 4));
  auto rf = fresh->eval(std::span<const TokenId>(toks).first(12));
  ASSERT_TRUE(rf.ok());
  EXPECT_EQ(0, std::memcmp(r2->data(), rf->data(), 512 * sizeof(float)));
}

// reserve_kv takes every block a request will need before it starts: a second
// session then cannot take them, and the first one's evals never run short.
TEST(Session, ReserveKvHoldsBlocksForTheWholeRequest) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  auto pool = make_pool(*m, 4, 4);  // 16 positions in all
  SessionOptions so;
  so.n_ctx = 16;
  auto a = make_session(m, cpu, pool, so);
  auto b = make_session(m, cpu, pool, so);
  ASSERT_TRUE(a->reserve_kv(10).ok());
  EXPECT_EQ(pool->blocks_in_use(), 3);
  auto no = b->reserve_kv(8);  // 2 blocks, 1 free
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->blocks_in_use(), 3) << "a failed reservation takes nothing";
  EXPECT_TRUE(b->reserve_kv(4).ok());
  auto toks = some_tokens(10, 512);
  ASSERT_TRUE(a->eval(toks).ok()) << "the reserved positions are there";
  EXPECT_EQ(pool->blocks_in_use(), 4);
  EXPECT_EQ(a->reserve_kv(17).code(), StatusCode::kInvalidArgument) << "beyond n_ctx";
  ASSERT_TRUE(a->truncate(0).ok());
  ASSERT_TRUE(b->truncate(0).ok());
  EXPECT_EQ(pool->blocks_in_use(), 0);
}

TEST(Session, RejectsBadInputWithoutChangingState) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(1);
  SessionOptions so;
  so.n_ctx = 8;
  auto s = make_session(m, cpu, make_pool(*m, 16, 4), so);
  std::vector<TokenId> bad = {1, 512};
  EXPECT_EQ(s->eval(bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->eval(std::span<const TokenId>()).status().code(), StatusCode::kInvalidArgument);
  auto toks = some_tokens(9, 512);
  EXPECT_EQ(s->eval(toks).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s->n_past(), 0);
  EXPECT_EQ(s->truncate(1).code(), StatusCode::kInvalidArgument);
}

TEST(Session, TwoThreadsEqualOneThread) {
  // Big enough that matmuls and attention really take the parallel path.
  auto spec = testing::small_spec(gguf::GgmlType::kQ8_0);
  spec.n_embd = 256;
  spec.n_ff = 512;
  auto m = testing::random_model(spec);
  ASSERT_NE(m, nullptr);
  auto toks = some_tokens(40, m->hparams().n_vocab);
  auto one = all_logits(*make_session(m, std::make_shared<CpuBackend>(1), make_pool(*m, 16, 4)), toks);
  auto two = all_logits(*make_session(m, std::make_shared<CpuBackend>(2), make_pool(*m, 16, 4)), toks);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], two[i], 1e-5) << i;
  EXPECT_TRUE(bitwise_equal(one, two));  // stronger: the reduction order never changes
}

TEST(Session, HybridStagesMatchSingleBackend) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  auto toks = some_tokens(21, 512);
  auto ref = all_logits(*make_session(m, std::make_shared<CpuBackend>(1), make_pool(*m, 16, 4)), toks);
  auto pool_for = [&](int32_t b, int32_t e) {
    KvPoolOptions o;
    o.layer_begin = b;
    o.layer_end = e;
    o.n_embd_kv = m->hparams().n_embd_kv();
    o.block_tokens = 8;
    o.n_blocks = 4;
    return *KvPool::create(o);
  };
  std::vector<SessionStage> stages = {{std::make_shared<CpuBackend>(1), pool_for(0, 2), 0, 2},
                                      {std::make_shared<CpuBackend>(2), pool_for(2, 5), 2, 5}};
  auto s = Session::create_staged(m, stages);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(bitwise_equal(all_logits(**s, toks), ref));

  std::vector<SessionStage> gap = {{std::make_shared<CpuBackend>(1), pool_for(0, 2), 0, 2},
                                   {std::make_shared<CpuBackend>(1), pool_for(3, 5), 3, 5}};
  EXPECT_EQ(Session::create_staged(m, gap).status().code(), StatusCode::kInvalidArgument);
}


// Continuous batching: one pass decodes a token of several sequences of
// different lengths in one pool; each equals its own eval, bitwise, and an
// error in one (a bad token, a full context) leaves it out, not the others.
TEST(Session, EvalBatchEqualsEachSequenceAlone) {
  auto m = testing::random_model(testing::small_spec(gguf::GgmlType::kQ8_0));
  ASSERT_NE(m, nullptr);
  const int32_t V = m->hparams().n_vocab;
  for (int threads : {1, 2}) {
    auto cpu = std::make_shared<CpuBackend>(threads);
    auto pool = make_pool(*m, 4, 64);
    const std::vector<int> lengths = {1, 9, 4, 17};
    std::vector<std::unique_ptr<Session>> batched, alone;
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto toks = some_tokens(lengths[i], V, static_cast<int>(i));
      batched.push_back(make_session(m, cpu, pool));
      alone.push_back(make_session(m, cpu, make_pool(*m, 4, 16)));
      ASSERT_TRUE(batched.back()->eval(toks).ok());
      ASSERT_TRUE(alone.back()->eval(toks).ok());
    }
    std::vector<Session*> ptrs;
    for (auto& b : batched) ptrs.push_back(b.get());
    for (int step = 0; step < 3; ++step) {
      std::vector<TokenId> next;
      for (size_t i = 0; i < ptrs.size(); ++i) next.push_back(static_cast<TokenId>((step * 13 + i * 7 + 3) % V));
      std::vector<Status> st = Session::eval_batch(ptrs, next);
      ASSERT_EQ(st.size(), ptrs.size());
      for (size_t i = 0; i < ptrs.size(); ++i) {
        ASSERT_TRUE(st[i].ok()) << st[i].to_string();
        auto one = alone[i]->eval(std::span<const TokenId>(&next[i], 1));
        ASSERT_TRUE(one.ok());
        const std::vector<float> a(ptrs[i]->last_logits().begin(), ptrs[i]->last_logits().end());
        const std::vector<float> b(one->begin(), one->end());
        EXPECT_TRUE(bitwise_equal(a, b)) << "threads " << threads << " step " << step << " sequence " << i;
        EXPECT_EQ(ptrs[i]->tokens(), alone[i]->tokens());
      }
    }
    // One bad token: only that sequence fails, unchanged.
    const int32_t before = ptrs[1]->n_past();
    std::vector<TokenId> mixed = {5, V + 3, 6, 7};
    std::vector<Status> st = Session::eval_batch(ptrs, mixed);
    EXPECT_TRUE(st[0].ok());
    EXPECT_EQ(st[1].code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(st[2].ok());
    EXPECT_TRUE(st[3].ok());
    EXPECT_EQ(ptrs[1]->n_past(), before);
    // The same session twice is refused for its second entry.
    std::vector<Session*> twice = {ptrs[0], ptrs[0]};
    std::vector<TokenId> two = {1, 2};
    st = Session::eval_batch(twice, two);
    EXPECT_TRUE(st[0].ok());
    EXPECT_EQ(st[1].code(), StatusCode::kInvalidArgument);
  }
}

// Prompt chunks and decode tokens in the same passes (chunked prefill), by
// eval_batch and through the StepBatcher's threads: bitwise each alone.
TEST(Session, MixedPromptAndDecodePassesEqualEachSequenceAlone) {
  auto m = testing::random_model(testing::small_spec(gguf::GgmlType::kQ8_0));
  ASSERT_NE(m, nullptr);
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    auto cpu = std::make_shared<CpuBackend>(threads);
    testing::expect_mixed_batches_equal_alone(m, cpu, [&] { return make_pool(*m, 4, 64); });
  }
}

TEST(StepBatcher, MixesAPromptIntoTheDecodeSteps) {
  auto m = testing::random_model(testing::small_spec(gguf::GgmlType::kQ8_0));
  ASSERT_NE(m, nullptr);
  auto cpu = std::make_shared<CpuBackend>(2);
  testing::expect_batcher_mixes_prompts(m, cpu, [&] { return make_pool(*m, 4, 32); });
}

}  // namespace
}  // namespace spw
