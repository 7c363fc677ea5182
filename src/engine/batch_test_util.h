// Checks of continuous batching shared by the CPU and Vulkan tests: the same
// assertions on any backend whose pools `make_pool` makes. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "engine/session.h"
#include "engine/step_batcher.h"
#include "model/model.h"

namespace spw::testing {

using PoolMaker = std::function<std::shared_ptr<KvPool>()>;

inline std::vector<TokenId> batch_tokens(int n, int n_vocab, int salt) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 37 + 11 + salt * 101) % n_vocab;
  t[0] = 1;  // BOS
  return t;
}

inline bool same_floats(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::unique_ptr<Session> session_on(const std::shared_ptr<const Model>& m, const std::shared_ptr<Backend>& b,
                                           std::shared_ptr<KvPool> pool) {
  auto s = Session::create(m, b, std::move(pool));
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

// Passes that mix decode tokens and prompt chunks: four sessions in one pool,
// two decoding from prompts of 6 and 11 tokens, two prefilling prompts of 9
// and 17 tokens in chunks of 5 (then decoding), stepped through
// Session::eval_batch. After every part that wants logits, each session's
// logits equal, bitwise, those of the same tokens evaluated alone (a prompt
// at once, in a pool of its own); a chunk that wants none leaves them empty.
inline void expect_mixed_batches_equal_alone(const std::shared_ptr<const Model>& m, const std::shared_ptr<Backend>& b,
                                             const PoolMaker& make_pool) {
  const int32_t V = m->hparams().n_vocab;
  auto shared = make_pool();
  ASSERT_NE(shared, nullptr);
  const std::vector<int> lengths = {6, 11, 9, 17};
  std::vector<std::unique_ptr<Session>> batched, alone;
  std::vector<std::vector<TokenId>> prompt;
  std::vector<size_t> fed;  // prompt tokens evaluated so far in the batch
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompt.push_back(batch_tokens(lengths[i], V, static_cast<int>(i)));
    batched.push_back(session_on(m, b, shared));
    alone.push_back(session_on(m, b, make_pool()));
    ASSERT_NE(batched.back(), nullptr);
    ASSERT_NE(alone.back(), nullptr);
    fed.push_back(0);
    if (i < 2) {  // already decoding
      ASSERT_TRUE(batched[i]->eval(prompt[i]).ok());
      ASSERT_TRUE(alone[i]->eval(prompt[i]).ok());
      fed[i] = prompt[i].size();
    }
  }
  int mixed = 0;
  for (int step = 0; step < 8; ++step) {
    std::vector<BatchPart> parts;
    std::vector<std::vector<TokenId>> toks(batched.size());
    std::vector<bool> chunk(batched.size(), false);
    bool has_chunk = false, has_decode = false;
    for (size_t i = 0; i < batched.size(); ++i) {
      if (fed[i] < prompt[i].size()) {
        const size_t k = std::min<size_t>(5, prompt[i].size() - fed[i]);
        toks[i].assign(prompt[i].begin() + static_cast<long>(fed[i]), prompt[i].begin() + static_cast<long>(fed[i] + k));
        fed[i] += k;
        parts.push_back({batched[i].get(), toks[i], fed[i] == prompt[i].size()});
        chunk[i] = true;
        has_chunk = true;
      } else {
        toks[i] = {static_cast<TokenId>((step * 13 + static_cast<int>(i) * 7 + 3) % V)};
        parts.push_back({batched[i].get(), toks[i], true});
        has_decode = true;
      }
    }
    mixed += has_chunk && has_decode;
    std::vector<Status> st = Session::eval_batch(parts);
    ASSERT_EQ(st.size(), parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      ASSERT_TRUE(st[i].ok()) << st[i].to_string();
      Session& s = *parts[i].session;
      if (!parts[i].logits) {
        EXPECT_TRUE(s.last_logits().empty()) << "a chunk that wants no logits gets none";
        continue;
      }
      // Alone: a finished prompt at once, a decode token by itself.
      auto one = alone[i]->eval(chunk[i] ? prompt[i] : toks[i]);
      ASSERT_TRUE(one.ok()) << one.status().to_string();
      EXPECT_TRUE(same_floats(s.last_logits(), *one)) << "step " << step << " sequence " << i;
      EXPECT_EQ(s.tokens(), alone[i]->tokens()) << "step " << step << " sequence " << i;
    }
  }
  EXPECT_GE(mixed, 3) << "passes held prompt chunks and decode tokens together";
}

// The StepBatcher mixes a prompt into the steps of a decoding member: with
// two members and no straggler timeout, every step holds the decoder's token
// and a chunk of step_tokens - 1 prompt tokens. Both sessions end bitwise
// where they would alone; a prompt that cannot get its KV fails whole,
// leaving its session as it was, without stopping the other member.
inline void expect_batcher_mixes_prompts(const std::shared_ptr<const Model>& m, const std::shared_ptr<Backend>& b,
                                         const PoolMaker& make_pool) {
  const int32_t V = m->hparams().n_vocab;
  auto shared = make_pool();
  ASSERT_NE(shared, nullptr);
  auto dec = session_on(m, b, shared), pre = session_on(m, b, shared);
  auto dec_alone = session_on(m, b, make_pool()), pre_alone = session_on(m, b, make_pool());
  ASSERT_TRUE(dec && pre && dec_alone && pre_alone);
  const auto p0 = batch_tokens(5, V, 1), p1 = batch_tokens(40, V, 2);
  ASSERT_TRUE(dec->eval(p0).ok());
  ASSERT_TRUE(dec_alone->eval(p0).ok());

  StepBatcherOptions bo;
  bo.max_wait_ns = int64_t{60} * 1'000'000'000;  // steps start only with both members there
  bo.step_tokens = 8;
  StepBatcher batcher(Env::default_env(), bo);
  std::optional<StepBatcher::Membership> m_dec, m_pre;
  m_dec.emplace(batcher.join(*dec));
  m_pre.emplace(batcher.join(*pre));
  std::vector<TokenId> dec_tokens;
  Status dec_st, pre_st;
  std::thread decoder([&] {
    std::optional<StepBatcher::Membership> mine = std::move(m_dec);
    for (int i = 0; i < 12 && dec_st.ok(); ++i) {
      const TokenId t = static_cast<TokenId>((i * 29 + 7) % V);
      dec_tokens.push_back(t);
      dec_st = dec->eval(std::span<const TokenId>(&t, 1)).status();
    }
  });
  std::thread prefiller([&] {
    std::optional<StepBatcher::Membership> mine = std::move(m_pre);
    pre_st = pre->eval(p1).status();
  });
  decoder.join();
  prefiller.join();
  ASSERT_TRUE(dec_st.ok()) << dec_st.to_string();
  ASSERT_TRUE(pre_st.ok()) << pre_st.to_string();
  const StepBatcherStats st = batcher.stats();
  EXPECT_EQ(st.prompt_tokens, 40u);
  EXPECT_EQ(st.tokens, 12u);
  EXPECT_EQ(st.mixed_steps, 6u) << "ceil(40 / 7) steps carried a chunk beside the decode token";
  EXPECT_EQ(st.max_rows, 8);
  EXPECT_EQ(st.straggler_steps, 0u);
  EXPECT_EQ(batcher.members(), 0);
  auto alone_pre = pre_alone->eval(p1);
  ASSERT_TRUE(alone_pre.ok());
  EXPECT_TRUE(same_floats(pre->last_logits(), *alone_pre)) << "the chunked prompt's logits";
  auto alone_dec = dec_alone->eval(dec_tokens);
  ASSERT_TRUE(alone_dec.ok());
  EXPECT_TRUE(same_floats(dec->last_logits(), *alone_dec)) << "the decoder's logits";

  // A prompt larger than the pool's free blocks: refused whole, before any
  // chunk runs, the session unchanged; the decoder goes on.
  const int32_t before = pre->n_past();
  const auto huge = batch_tokens(shared->n_blocks() * shared->block_tokens(), V, 3);
  {
    StepBatcher again(Env::default_env(), bo);
    auto mp = again.join(*pre);
    auto r = pre->eval(huge);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(pre->n_past(), before);
    EXPECT_EQ(again.stats().steps, 0u);
  }
  const TokenId t = 3;
  EXPECT_TRUE(pre->eval(std::span<const TokenId>(&t, 1)).ok()) << "usable after the refusal";
}

}  // namespace spw::testing
