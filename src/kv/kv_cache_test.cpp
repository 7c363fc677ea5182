#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gguf/fp16.h"
#include "gguf/quant.h"

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

KvPoolOptions typed(KvType t, int32_t n_embd_kv, int32_t head_dim, int32_t blocks = 3, int32_t bt = 4) {
  KvPoolOptions o;
  o.layer_begin = 1;
  o.layer_end = 3;
  o.n_embd_kv = n_embd_kv;
  o.head_dim = head_dim;
  o.block_tokens = bt;
  o.n_blocks = blocks;
  o.type = t;
  return o;
}

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Row storage per type: f32 4 B, f16 2 B, q8_0 34 B per 32 elements, so a
// pool's bytes follow its type exactly.
TEST(KvPoolTypes, SizesFollowTheType) {
  EXPECT_EQ(kv_row_bytes(KvType::kF32, 64), 256u);
  EXPECT_EQ(kv_row_bytes(KvType::kF16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvType::kQ8_0, 64), 68u);
  for (KvType t : kAllKvTypes) {
    auto pool = KvPool::create(typed(t, 64, 32));
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    EXPECT_EQ((*pool)->type(), t);
    EXPECT_EQ((*pool)->row_bytes(), kv_row_bytes(t, 64));
    EXPECT_EQ((*pool)->bytes_per_token(), 2u * 2u * kv_row_bytes(t, 64));
    EXPECT_EQ((*pool)->bytes_per_block(), 4u * (*pool)->bytes_per_token());
    // Float views exist only for F32 pools.
    EXPECT_EQ((*pool)->k(0, 0) != nullptr, t == KvType::kF32);
    EXPECT_NE((*pool)->k_bytes(0, 0), nullptr);
  }
}

TEST(KvPoolTypes, ParseAndNames) {
  for (KvType t : kAllKvTypes) {
    auto p = parse_kv_type(kv_type_name(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, t);
  }
  EXPECT_EQ(*parse_kv_type("F16"), KvType::kF16);
  auto bad = parse_kv_type("bf16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'bf16'"), std::string::npos) << bad.status().to_string();
}

// Q8_0 blocks of 32 must not straddle rows or heads.
TEST(KvPoolTypes, Q8_0RefusesRowsOrHeadsNotMultiplesOf32) {
  auto r = KvPool::create(typed(KvType::kQ8_0, 48, 16));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("n_embd_kv"), std::string::npos) << r.status().to_string();
  r = KvPool::create(typed(KvType::kQ8_0, 64, 16));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("head_dim"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("16"), std::string::npos) << r.status().to_string();
  // F16 and F32 store any shape.
  EXPECT_TRUE(KvPool::create(typed(KvType::kF16, 3, 3)).ok());
}

// F16: every value a half represents comes back bit for bit; others round
// to nearest, ties to even (gguf::fp32_to_fp16), including subnormals,
// overflow to inf and signed zeros.
TEST(KvPoolTypes, F16RoundTripIsExactForHalvesAndRoundsToNearestEven) {
  const int32_t n = 8;
  auto pool = *KvPool::create(typed(KvType::kF16, n, n, 2, 2));
  std::vector<float> k(n), v(n);
  // All 65536 halves that are not NaN, eight at a time, K and V.
  for (uint32_t h0 = 0; h0 < 65536; h0 += 2 * n) {
    for (int32_t i = 0; i < n; ++i) {
      k[i] = gguf::fp16_to_fp32(static_cast<uint16_t>(h0 + i));
      v[i] = gguf::fp16_to_fp32(static_cast<uint16_t>(h0 + n + i));
    }
    pool->store_rows(1, 1, 1, k.data(), v.data());
    std::vector<float> kb(n), vb(n);
    pool->rows_to_f32(false, 1, 1, 1, 1, kb.data());
    pool->rows_to_f32(true, 1, 1, 1, 1, vb.data());
    for (int32_t i = 0; i < n; ++i) {
      if (std::isnan(k[i]) || std::isnan(v[i])) continue;
      ASSERT_EQ(bits(kb[i]), bits(k[i])) << h0 + i;
      ASSERT_EQ(bits(vb[i]), bits(v[i])) << h0 + n + i;
    }
  }
  // Rounding: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1);
  // 1 + 3 * 2^-11 ties up to 1 + 2^-9; just above halfway rounds up; 65520
  // rounds past 65504 to inf; 2^-25 ties to 0; 3 * 2^-26 rounds to the
  // smallest subnormal 2^-24; -0 stays -0.
  const float in[n] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-20f, 65520.0f,
                       0x1p-25f, 3 * 0x1p-26f, -0.0f, -2.5f};
  const float want[n] = {1.0f, 1.0f + 0x1p-9f, 1.0f + 0x1p-10f, INFINITY, 0.0f, 0x1p-24f, -0.0f, -2.5f};
  pool->store_rows(0, 0, 0, in, in);
  std::vector<float> out(n);
  pool->rows_to_f32(true, 0, 0, 0, 1, out.data());
  for (int32_t i = 0; i < n; ++i) EXPECT_EQ(bits(out[i]), bits(want[i])) << i;
  // The stored bytes are the halves themselves.
  uint16_t h;
  std::memcpy(&h, pool->k_bytes(0, 0) + 2, 2);
  EXPECT_EQ(h, gguf::fp32_to_fp16(in[1]));
}

// Q8_0: the stored bytes are the GGUF quantiser's blocks, and reading them
// back is its dequantisation; slots and blocks do not overlap.
TEST(KvPoolTypes, Q8_0RowsAreTheGgufQuantisersBlocks) {
  const int32_t n = 64, bt = 4;
  auto pool = *KvPool::create(typed(KvType::kQ8_0, n, 32, 3, bt));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> rows(static_cast<size_t>(3 * 2 * bt * 2 * n));
  for (float& x : rows) x = dist(rng);
  auto row = [&](int b, int l, int s, int kv) { return rows.data() + ((((b * 2 + l) * bt + s) * 2 + kv) * n); };
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 2; ++l)
      for (int s = 0; s < bt; ++s) pool->store_rows(b, l, s, row(b, l, s, 0), row(b, l, s, 1));
  std::vector<uint8_t> want(68);
  std::vector<float> deq(static_cast<size_t>(bt * n)), got(static_cast<size_t>(bt * n));
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 2; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        const uint8_t* base = kv ? pool->v_bytes(b, l) : pool->k_bytes(b, l);
        for (int s = 0; s < bt; ++s) {
          gguf::quantize_row_q8_0(row(b, l, s, kv), want.data(), n);
          ASSERT_EQ(std::memcmp(base + s * 68, want.data(), 68), 0) << b << l << s << kv;
          gguf::dequantize_row_q8_0(want.data(), deq.data() + s * n, n);
        }
        // Slots 1..3 in one call, as the attention reads a run of slots.
        pool->rows_to_f32(kv == 1, b, l, 1, bt - 1, got.data());
        for (int i = 0; i < (bt - 1) * n; ++i) ASSERT_EQ(bits(got[i]), bits(deq[n + i])) << i;
      }
}

// F32 pools keep their rows bit for bit, through store_rows and k()/v().
TEST(KvPoolTypes, F32StoreIsACopy) {
  auto pool = *KvPool::create(typed(KvType::kF32, 5, 5));
  const float k[5] = {1.5f, -0.0f, 0x1p-140f, 3e38f, -7.25f}, v[5] = {2, 3, 4, 5, 6};
  pool->store_rows(2, 1, 3, k, v);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(bits(pool->k(2, 1)[3 * 5 + i]), bits(k[i]));
    EXPECT_EQ(pool->v(2, 1)[3 * 5 + i], v[i]);
  }
}


// Sharing: fork shares the full blocks, copies the partial last one.
TEST(KvPoolShare, ForkSharesFullBlocksAndCopiesThePartialOne) {
  auto pool = *KvPool::create(opts(6));  // 4 tokens a block
  BlockTable a;
  ASSERT_TRUE(pool->reserve(a, 10).ok());  // 3 blocks, the last holds 2 positions
  for (int b = 0; b < 3; ++b)
    for (int l = 0; l < 2; ++l)
      for (int i = 0; i < 4 * 3; ++i) {
        pool->k(a.blocks()[b], l)[i] = static_cast<float>(100 * b + 10 * l + i);
        pool->v(a.blocks()[b], l)[i] = static_cast<float>(-(100 * b + 10 * l + i));
      }
  BlockTable f;
  ASSERT_TRUE(pool->fork(a, f, 10).ok());
  ASSERT_EQ(f.blocks().size(), 3u);
  EXPECT_EQ(f.blocks()[0], a.blocks()[0]);
  EXPECT_EQ(f.blocks()[1], a.blocks()[1]);
  EXPECT_NE(f.blocks()[2], a.blocks()[2]);
  EXPECT_EQ(pool->refs(a.blocks()[0]), 2);
  EXPECT_EQ(pool->refs(a.blocks()[2]), 1);
  EXPECT_EQ(pool->refs(f.blocks()[2]), 1);
  EXPECT_EQ(pool->blocks_in_use(), 4);  // a shared block counts once
  EXPECT_EQ(pool->blocks_free(), 2);
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 4 * 3; ++i) {
      EXPECT_EQ(pool->k(f.blocks()[2], l)[i], pool->k(a.blocks()[2], l)[i]);
      EXPECT_EQ(pool->v(f.blocks()[2], l)[i], pool->v(a.blocks()[2], l)[i]);
    }
  // The copy is the fork's own: writing it leaves the source as it was.
  pool->k(f.blocks()[2], 1)[7] = 12345.0f;
  EXPECT_EQ(pool->k(a.blocks()[2], 1)[7], 200.0f + 10.0f + 7.0f);
  // The fork grows by its own blocks.
  ASSERT_TRUE(pool->reserve(f, 13).ok());
  EXPECT_EQ(pool->blocks_in_use(), 5);
  // Release in either order: shared blocks free with their last reference.
  pool->release(a);
  EXPECT_EQ(pool->blocks_in_use(), 4);
  EXPECT_EQ(pool->refs(f.blocks()[0]), 1);
  pool->release(f);
  EXPECT_EQ(pool->blocks_in_use(), 0);
  EXPECT_EQ(pool->blocks_free(), 6);
}

TEST(KvPoolShare, ForkOnABlockBoundaryCopiesNothing) {
  auto pool = *KvPool::create(opts(3));
  BlockTable a, f;
  ASSERT_TRUE(pool->reserve(a, 8).ok());
  ASSERT_TRUE(pool->fork(a, f, 8).ok());
  EXPECT_EQ(f.blocks(), a.blocks());
  EXPECT_EQ(pool->blocks_in_use(), 2);
  // A shorter fork takes fewer blocks.
  BlockTable g;
  ASSERT_TRUE(pool->fork(a, g, 4).ok());
  EXPECT_EQ(g.blocks().size(), 1u);
  EXPECT_EQ(pool->refs(a.blocks()[0]), 3);
  pool->release(f);
  pool->release(g);
  pool->release(a);
  EXPECT_EQ(pool->blocks_free(), 3);
}

TEST(KvPoolShare, ForkIsAllOrNothing) {
  auto pool = *KvPool::create(opts(3));
  BlockTable a, f;
  ASSERT_TRUE(pool->reserve(a, 10).ok());  // all 3 blocks
  Status st = pool->fork(a, f, 10);        // the partial block needs a 4th
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(f.blocks().empty());
  for (int32_t b : a.blocks()) EXPECT_EQ(pool->refs(b), 1);
  EXPECT_EQ(pool->blocks_free(), 0);
  // Bad arguments change nothing either.
  EXPECT_EQ(pool->fork(a, f, 13).code(), StatusCode::kInvalidArgument);
  BlockTable full;
  ASSERT_TRUE(pool->share_prefix(a, full, 8).ok());
  EXPECT_EQ(pool->fork(a, full, 4).code(), StatusCode::kInvalidArgument);  // not empty
  EXPECT_EQ(full.blocks().size(), 2u);
  pool->release(full);
  pool->release(a);
  EXPECT_EQ(pool->blocks_free(), 3);
}

TEST(KvPoolShare, MakeTailPrivateCopiesASharedBlockBeforeAWrite) {
  auto pool = *KvPool::create(opts(4));
  BlockTable a, f;
  ASSERT_TRUE(pool->reserve(a, 8).ok());
  pool->k(a.blocks()[1], 0)[0] = 42.0f;
  ASSERT_TRUE(pool->fork(a, f, 8).ok());  // both blocks shared
  pool->shrink(f, 6);                     // f continues at position 6, inside shared block 1
  ASSERT_EQ(pool->refs(a.blocks()[1]), 2);
  ASSERT_TRUE(pool->make_tail_private(f, 6).ok());
  EXPECT_NE(f.blocks()[1], a.blocks()[1]);
  EXPECT_EQ(pool->refs(a.blocks()[1]), 1);
  EXPECT_EQ(pool->k(f.blocks()[1], 0)[0], 42.0f);
  EXPECT_EQ(pool->blocks_in_use(), 3);
  // A private or boundary tail needs nothing.
  ASSERT_TRUE(pool->make_tail_private(a, 6).ok());
  ASSERT_TRUE(pool->make_tail_private(f, 4).ok());
  EXPECT_EQ(pool->blocks_in_use(), 3);
  pool->release(a);
  pool->release(f);
  EXPECT_EQ(pool->blocks_free(), 4);
}

class FakeDeviceStorage : public KvDeviceStorage {
 public:
  std::string device_name() const override { return "fake:0"; }
  size_t bytes() const override { return 0; }
};

// A device pool shares full blocks and refuses the byte copy.
TEST(KvPoolShare, DevicePoolSharesFullBlocksOnly) {
  auto pool = *KvPool::create_on_device(opts(4), std::make_unique<FakeDeviceStorage>());
  BlockTable a, f, g;
  ASSERT_TRUE(pool->reserve(a, 10).ok());
  EXPECT_EQ(pool->fork(a, f, 10).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(f.blocks().empty());
  ASSERT_TRUE(pool->fork(a, f, 8).ok());  // whole blocks: nothing to copy
  ASSERT_TRUE(pool->share_prefix(a, g, 10).ok());
  EXPECT_EQ(g.blocks().size(), 2u);
  EXPECT_EQ(pool->refs(a.blocks()[0]), 3);
  EXPECT_EQ(pool->blocks_in_use(), 3);
  pool->shrink(g, 5);
  EXPECT_EQ(pool->make_tail_private(g, 5).code(), StatusCode::kFailedPrecondition);
  pool->release(a);
  pool->release(f);
  pool->release(g);
  EXPECT_EQ(pool->blocks_free(), 4);
}


// A pool of 3 layers whose layer 1 slides (window 6, blocks of 4 positions,
// chunks of at most 5): ring = ceil((6 + 3 + 5 + 3) / 4) + 1 = 5 window blocks.
KvPoolOptions window_opts(int32_t blocks, int32_t window_blocks) {
  KvPoolOptions o = opts(blocks);
  o.layer_end = 3;
  o.window = 6;
  o.swa_layers = {1};
  o.n_window_blocks = window_blocks;
  o.max_chunk = 5;
  return o;
}

TEST(KvPoolWindow, PlanesSizeAndReserveTheRing) {
  auto pool = KvPool::create(window_opts(40, 10));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  KvPool& p = **pool;
  EXPECT_TRUE(p.has_window());
  EXPECT_EQ(p.ring_blocks(), 5);
  EXPECT_EQ(p.plane(0), 0);
  EXPECT_EQ(p.plane(1), 1);
  EXPECT_EQ(p.plane(2), 0);
  EXPECT_EQ(p.bytes_per_token(), 2u * 2 * 3 * sizeof(float));  // the two full layers
  EXPECT_EQ(p.window_bytes_per_block(), 2u * 4 * 3 * sizeof(float));
  EXPECT_EQ(p.storage_bytes(), 40 * p.bytes_per_block() + 10 * p.window_bytes_per_block());
  BlockTable t;
  ASSERT_TRUE(p.reserve(t, 2).ok());  // a short sequence holds what it needs: one block
  EXPECT_EQ(p.window_blocks_in_use(), 1);
  ASSERT_TRUE(p.reserve(t, 100).ok());  // a long one the ring, not 25 blocks
  EXPECT_EQ(p.blocks_in_use(), 25);
  EXPECT_EQ(p.window_blocks_in_use(), 5);
  p.release(t);
  EXPECT_EQ(p.blocks_in_use(), 0);
  EXPECT_EQ(p.window_blocks_in_use(), 0);
  // Without room for the ring, nothing is taken (all or nothing across planes).
  auto small = KvPool::create(window_opts(40, 4));
  ASSERT_TRUE(small.ok());
  BlockTable u;
  const Status st = (*small)->reserve(u, 100);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("window"), std::string::npos) << st.to_string();
  EXPECT_EQ((*small)->blocks_in_use(), 0);
  EXPECT_EQ((*small)->window_blocks_in_use(), 0);
}

// Sliding through 100 positions in chunks of up to 5: the table never maps
// more than the ring, takes nothing past its reservation, keeps every
// position a row of the next chunk reads (with what it wrote there), and
// gives back the rest.
TEST(KvPoolWindow, SlideKeepsTheWindowAndRecyclesTheRest) {
  auto pool = KvPool::create(window_opts(40, 10));
  ASSERT_TRUE(pool.ok());
  KvPool& p = **pool;
  BlockTable t;
  ASSERT_TRUE(p.reserve(t, 100).ok());
  const int32_t in_use = p.window_blocks_in_use();
  std::mt19937 rng(3);
  for (int32_t pos = 0; pos < 100;) {
    const int32_t m = std::min<int32_t>(1 + static_cast<int32_t>(rng() % 5), 100 - pos);
    ASSERT_TRUE(p.slide(t, pos, m).ok()) << pos;
    EXPECT_EQ(p.window_blocks_in_use(), in_use) << "took a block past the reservation at " << pos;
    ASSERT_TRUE(p.window_covers(t, pos, m)) << pos;
    int32_t mapped = 0;
    for (int32_t b : t.window_blocks()) mapped += b >= 0 ? 1 : 0;
    EXPECT_LE(mapped, p.ring_blocks());
    // Rows of this chunk see positions back to pos - 5 (window 6): still
    // there with the values written.
    for (int32_t q = std::max(0, pos - 5); q < pos; ++q) {
      const int32_t b = t.window_blocks()[static_cast<size_t>(q / 4)];
      ASSERT_GE(b, 0) << q;
      float k[3];
      p.rows_to_f32(false, b, 1, q % 4, 1, k);
      EXPECT_EQ(k[0], static_cast<float>(q)) << q;
    }
    for (int32_t q = pos; q < pos + m; ++q) {
      const float row[3] = {static_cast<float>(q), 1.0f, 2.0f};
      p.store_rows(t.window_blocks()[static_cast<size_t>(q / 4)], 1, q % 4, row, row);
    }
    pos += m;
  }
  EXPECT_EQ(t.window_blocks().front(), -1);  // given back
  EXPECT_FALSE(p.window_covers(t, 10, 0));   // a continuation from 10 would need it
  EXPECT_TRUE(p.window_covers(t, 100, 0));
  p.shrink(t, 98);  // kept for the table
  EXPECT_EQ(p.window_blocks_in_use(), in_use);
  p.release(t);
  EXPECT_EQ(p.window_blocks_in_use(), 0);
}

TEST(KvPoolWindow, ForkSharesTheWindowAndCopiesItsTail) {
  auto pool = KvPool::create(window_opts(40, 12));
  ASSERT_TRUE(pool.ok());
  KvPool& p = **pool;
  BlockTable a;
  ASSERT_TRUE(p.reserve(a, 30).ok());
  for (int32_t pos = 0; pos < 30; pos += 5) {
    ASSERT_TRUE(p.slide(a, pos, 5).ok());
    for (int32_t q = pos; q < pos + 5; ++q) {
      const float row[3] = {static_cast<float>(q), 0.0f, 0.0f};
      p.store_rows(a.window_blocks()[static_cast<size_t>(q / 4)], 1, q % 4, row, row);
    }
  }
  BlockTable b;
  ASSERT_TRUE(p.fork(a, b, 30).ok());
  ASSERT_EQ(b.window_blocks().size(), 8u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(b.window_blocks()[i], a.window_blocks()[i]) << i;  // holes too
  EXPECT_NE(b.window_blocks()[7], a.window_blocks()[7]);  // positions 28, 29: a private copy
  float k[3];
  p.rows_to_f32(false, b.window_blocks()[7], 1, 1, 1, k);
  EXPECT_EQ(k[0], 29.0f);
  EXPECT_TRUE(p.window_covers(b, 30, 0));
  p.release(a);
  p.release(b);
  EXPECT_EQ(p.window_blocks_in_use(), 0);
  EXPECT_EQ(p.blocks_in_use(), 0);
}

}  // namespace
}  // namespace spw
