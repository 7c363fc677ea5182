#include "engine/kv_cache.h"

#include <gtest/gtest.h>

#include <set>

namespace spw {
namespace {

KvPoolOptions opts(int32_t blocks, int32_t bt = 4) {
  KvPoolOptions o;
  o.layer_begin = 0;
  o.layer_end = 2;
  o.n_embd_kv = 3;
  o.block_tokens = bt;
  o.n_blocks = blocks;
  return o;
}

TEST(KvPool, RejectsBadOptions) {
  auto o = opts(4);
  o.block_tokens = 0;
  auto r = KvPool::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("block_tokens"), std::string::npos);
}

TEST(KvPool, ReserveGrowsByBlocksAndSizesAreExact) {
  auto pool = *KvPool::create(opts(5));
  EXPECT_EQ(pool->bytes_per_token(), 2u * 2u * 3u * sizeof(float));
  EXPECT_EQ(pool->bytes_per_block(), pool->bytes_per_token() * 4);
  BlockTable t;
  ASSERT_TRUE(pool->reserve(t, 1).ok());
  EXPECT_EQ(t.blocks().size(), 1u);
  ASSERT_TRUE(pool->reserve(t, 4).ok());
  EXPECT_EQ(t.blocks().size(), 1u);
  ASSERT_TRUE(pool->reserve(t, 5).ok());
  EXPECT_EQ(t.blocks().size(), 2u);
  EXPECT_EQ(pool->blocks_in_use(), 2);
  EXPECT_EQ(pool->blocks_free(), 3);
  pool->shrink(t, 3);
  EXPECT_EQ(t.blocks().size(), 1u);
  pool->release(t);
  EXPECT_EQ(pool->blocks_free(), 5);
}

TEST(KvPool, ExhaustionIsAllOrNothing) {
  auto pool = *KvPool::create(opts(3));
  BlockTable a, b;
  ASSERT_TRUE(pool->reserve(a, 8).ok());  // 2 blocks
  const auto before = b.blocks();
  Status st = pool->reserve(b, 9);        // needs 3, only 1 free
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b.blocks(), before);
  EXPECT_EQ(pool->blocks_free(), 1);
  ASSERT_TRUE(pool->reserve(b, 4).ok());
  std::set<int32_t> ids(a.blocks().begin(), a.blocks().end());
  ids.insert(b.blocks().begin(), b.blocks().end());
  EXPECT_EQ(ids.size(), 3u);  // no block handed out twice
  pool->release(a);
  pool->release(b);
}

TEST(KvPool, BlocksDoNotOverlap) {
  auto pool = *KvPool::create(opts(2));
  for (int b = 0; b < 2; ++b)
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < 4 * 3; ++i) {
        pool->k(b, l)[i] = static_cast<float>(1000 * b + 100 * l + i);
        pool->v(b, l)[i] = static_cast<float>(-(1000 * b + 100 * l + i));
      }
  for (int b = 0; b < 2; ++b)
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < 4 * 3; ++i) {
        ASSERT_EQ(pool->k(b, l)[i], static_cast<float>(1000 * b + 100 * l + i));
        ASSERT_EQ(pool->v(b, l)[i], static_cast<float>(-(1000 * b + 100 * l + i)));
      }
}

}  // namespace
}  // namespace spw
