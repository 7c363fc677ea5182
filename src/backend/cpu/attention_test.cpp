#include "backend/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/kernel_variant_test_env.h"

namespace spw::cpu {
namespace {

// Distance in units in the last place between a float and the true value.
double ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(w, std::numeric_limits<float>::infinity()) - w;
  return std::abs(static_cast<double>(got) - want) / ulp;
}

TEST(ExpNeg, WithinTwoUlpOfExpOverTheSoftmaxRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = 0.0f; x >= -87.0f; x = std::nextafter(x, -100.0f) - 1e-4f * std::abs(x) - 1e-7f) {
    const double u = ulps(exp_neg(x), std::exp(static_cast<double>(x)));
    if (u > worst) worst = u, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(exp_neg(0.0f), 1.0f);
  EXPECT_EQ(exp_neg(-88.0f), 0.0f);
  EXPECT_EQ(exp_neg(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_neg(std::numeric_limits<float>::quiet_NaN()), 0.0f);
}

// A value's exponential does not depend on where it falls: in the 16-lane
// body, in a masked tail, or on its own.
TEST(ExpNeg, SameBitsInEveryLaneAndTail) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> d(-90.0f, 2.0f);
  for (int64_t n = 1; n <= 41; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(g);
    const float shift = 1.5f;
    std::vector<float> y = x;
    exp_neg_shifted(y.data(), n, shift);
    for (int64_t i = 0; i < n; ++i) {
      const float want = exp_neg(x[static_cast<size_t>(i)] - shift);
      ASSERT_EQ(0, std::memcmp(&want, &y[static_cast<size_t>(i)], 4)) << "n " << n << " i " << i;
    }
  }
}

// A one-layer KV pool and sequences with random K/V, for attention() alone.
struct Fixture {
  AttentionShape shape;
  int32_t n_kv = 0;
  std::shared_ptr<KvPool> pool;
  std::vector<BlockTable> tables;
  std::mt19937 g{11};

  Fixture(int32_t n_head, int32_t n_head_kv, int32_t hd, int32_t block_tokens, int n_seqs, int32_t n_pos,
          KvType type = KvType::kF32) {
    shape = {n_head, n_head_kv, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
    n_kv = n_head_kv * hd;
    KvPoolOptions o;
    o.layer_begin = 0;
    o.layer_end = 1;
    o.n_embd_kv = n_kv;
    o.block_tokens = block_tokens;
    o.n_blocks = n_seqs * ((n_pos + block_tokens - 1) / block_tokens);
    o.type = type;
    o.head_dim = hd;
    pool = *KvPool::create(o);
    tables.resize(static_cast<size_t>(n_seqs));
    // Scores spread over several units, so the softmax has a real range and
    // the running maximum moves from tile to tile.
    std::normal_distribution<float> d(0.0f, 1.5f);
    for (auto& t : tables) {
      EXPECT_TRUE(pool->reserve(t, n_pos).ok());
      std::vector<float> k(static_cast<size_t>(n_kv)), v(k.size());
      for (int32_t p = 0; p < n_pos; ++p) {
        for (size_t i = 0; i < k.size(); ++i) k[i] = d(g), v[i] = d(g);
        pool->store_rows(t.blocks()[static_cast<size_t>(p / block_tokens)], 0, p % block_tokens, k.data(), v.data());
      }
    }
  }
  SeqSlice slice(int seq, int32_t pos0, int32_t n) const {
    return {KvSequence{pool.get(), &tables[static_cast<size_t>(seq)]}, pos0, n};
  }
  std::vector<float> queries(int64_t rows) {
    std::normal_distribution<float> d(0.0f, 1.5f);
    std::vector<float> q(static_cast<size_t>(rows * shape.n_head * shape.head_dim));
    for (float& x : q) x = d(g);
    return q;
  }
  // Softmax attention of one row and head in double precision, from the pool.
  void reference(const SeqSlice& sl, int32_t pos, const float* q_row, double* out) const {
    const int32_t hd = shape.head_dim, bt = pool->block_tokens();
    for (int32_t h = 0; h < shape.n_head; ++h) {
      const int64_t off = static_cast<int64_t>(h / (shape.n_head / shape.n_head_kv)) * hd;
      std::vector<double> s(static_cast<size_t>(pos + 1));
      double mx = -1e300;
      for (int32_t p = 0; p <= pos; ++p) {
        const int32_t blk = sl.kv.table->blocks()[static_cast<size_t>(p / bt)];
        const float* k = pool->k(blk, 0) + static_cast<int64_t>(p % bt) * n_kv + off;
        double dot = 0.0;
        for (int32_t i = 0; i < hd; ++i) dot += static_cast<double>(k[i]) * q_row[h * hd + i];
        s[static_cast<size_t>(p)] = dot * shape.kq_scale;
        mx = std::max(mx, s[static_cast<size_t>(p)]);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int32_t i = 0; i < hd; ++i) out[h * hd + i] = 0.0;
      for (int32_t p = 0; p <= pos; ++p) {
        const int32_t blk = sl.kv.table->blocks()[static_cast<size_t>(p / bt)];
        const float* v = pool->v(blk, 0) + static_cast<int64_t>(p % bt) * n_kv + off;
        for (int32_t i = 0; i < hd; ++i) out[h * hd + i] += s[static_cast<size_t>(p)] / sum * v[i];
      }
    }
  }
};

// Heads of 48 (three 16-lane chunks), 64 and 40 (not a multiple of 16), GQA
// and not, blocks smaller and larger than a tile; a prompt chunk that starts
// mid-tile and ends past the diagonal of several tiles.
TEST(Attention, MatchesDoublePrecisionSoftmax) {
  struct Case {
    int32_t n_head, n_head_kv, hd, bt;
  };
  for (const Case c : {Case{4, 2, 48, 16}, Case{2, 2, 64, 64}, Case{3, 1, 40, 8}}) {
    Fixture f(c.n_head, c.n_head_kv, c.hd, c.bt, 1, 110);
    const SeqSlice sl = f.slice(0, 5, 105);  // positions 5..109
    const std::vector<float> q = f.queries(105);
    std::vector<float> out(q.size(), 0.0f);
    ThreadPool pool(2);
    attention(std::span<const SeqSlice>(&sl, 1), 0, f.shape, q.data(), out.data(), &pool);
    const int64_t nq = static_cast<int64_t>(c.n_head) * c.hd;
    std::vector<double> want(static_cast<size_t>(nq));
    double worst = 0.0;
    for (int32_t r = 0; r < 105; ++r) {
      f.reference(sl, 5 + r, q.data() + r * nq, want.data());
      for (int64_t i = 0; i < nq; ++i)
        worst = std::max(worst, std::abs(out[static_cast<size_t>(r * nq + i)] - want[static_cast<size_t>(i)]));
    }
    // Outputs are averages of N(0, 1.5) values and the scores have a spread
    // of a few units: float scores carry ~1e-6 absolute error, which moves
    // the outputs by about as much. A wrong rescale or mask is ~1e-1.
    EXPECT_LT(worst, 5e-6) << "heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.hd << " bt " << c.bt;
  }
}

// backend.h's contract: a row's result is bitwise the same whether it runs in
// a prompt chunk, on its own (decode), next to other sequences' rows, or on
// any number of threads.
TEST(Attention, BitwiseIndependentOfBatchSplitAndThreads) {
  Fixture f(4, 2, 48, 16, 2, 100);
  const int32_t n = 100;
  const int64_t nq = 4 * 48;
  const std::vector<float> q0 = f.queries(n);
  const SeqSlice whole = f.slice(0, 0, n);
  std::vector<float> ref(q0.size());
  attention(std::span<const SeqSlice>(&whole, 1), 0, f.shape, q0.data(), ref.data(), nullptr);

  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    // Row by row, as decode steps.
    for (int32_t r = 0; r < n; ++r) {
      const SeqSlice one = f.slice(0, r, 1);
      std::vector<float> out(static_cast<size_t>(nq));
      attention(std::span<const SeqSlice>(&one, 1), 0, f.shape, q0.data() + r * nq, out.data(), &pool);
      ASSERT_EQ(0, std::memcmp(out.data(), ref.data() + r * nq, out.size() * 4)) << "row " << r << " threads "
                                                                                 << threads;
    }
    // Ubatches of 37 rows, each batched after a chunk of the other sequence.
    const std::vector<float> q1 = f.queries(n);
    for (int32_t p0 = 0; p0 < n; p0 += 37) {
      const int32_t m = std::min(37, n - p0);
      const SeqSlice both[2] = {f.slice(1, 0, 13), f.slice(0, p0, m)};
      std::vector<float> q(static_cast<size_t>((13 + m) * nq));
      std::copy_n(q1.data(), 13 * nq, q.data());
      std::copy_n(q0.data() + p0 * nq, m * nq, q.data() + 13 * nq);
      std::vector<float> out(q.size());
      attention(both, 0, f.shape, q.data(), out.data(), &pool);
      ASSERT_EQ(0, std::memcmp(out.data() + 13 * nq, ref.data() + p0 * nq, static_cast<size_t>(m * nq) * 4))
          << "chunk at " << p0 << " threads " << threads;
    }
  }
}

// An F16 or Q8_0 pool computes bit for bit what an F32 pool holding its
// stored values computes (its slices are converted exactly, a tile at a time).
TEST(Attention, TypedPoolsComputeWhatF32PoolsOfTheirValuesDo) {
  for (KvType type : {KvType::kF16, KvType::kQ8_0}) {
    Fixture typed(4, 2, 64, 16, 1, 90, type);
    Fixture plain(4, 2, 64, 16, 1, 90, KvType::kF32);
    std::vector<float> k(static_cast<size_t>(typed.n_kv)), v(k.size());
    for (int32_t p = 0; p < 90; ++p) {
      const int32_t blk = typed.tables[0].blocks()[static_cast<size_t>(p / 16)];
      ASSERT_EQ(blk, plain.tables[0].blocks()[static_cast<size_t>(p / 16)]);
      typed.pool->rows_to_f32(false, blk, 0, p % 16, 1, k.data());
      typed.pool->rows_to_f32(true, blk, 0, p % 16, 1, v.data());
      plain.pool->store_rows(blk, 0, p % 16, k.data(), v.data());
    }
    const std::vector<float> q = typed.queries(80);
    const SeqSlice a = typed.slice(0, 10, 80), b = plain.slice(0, 10, 80);
    std::vector<float> got(q.size()), want(q.size());
    ThreadPool pool(2);
    attention(std::span<const SeqSlice>(&a, 1), 0, typed.shape, q.data(), got.data(), &pool);
    attention(std::span<const SeqSlice>(&b, 1), 0, plain.shape, q.data(), want.data(), &pool);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << kv_type_name(type);
  }
}

TEST(Attention, ItemsAreQueryTilesTimesHeads) {
  Fixture f(4, 2, 48, 16, 2, 100);
  const SeqSlice s[3] = {f.slice(0, 0, 33), f.slice(1, 0, 1), f.slice(0, 40, 64)};
  EXPECT_EQ(attention_items(s, 4), (2 + 1 + 2) * 4);
  // Scratch does not grow with the context.
  EXPECT_EQ(attention_scratch_floats(48, false), kQueryTile * (kKvTile + 48 + 2));
  EXPECT_EQ(attention_scratch_floats(48, true), kQueryTile * (kKvTile + 48 + 2) + 2 * kKvTile * 48);
}

}  // namespace
}  // namespace spw::cpu
