// Kernels against scalar double references on random inputs of odd sizes.
#include "backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernel_variant_test_env.h"
#include "backend/cpu/packed_weights.h"
#include "gguf/fp16.h"
#include "gguf/quant.h"

namespace spw::cpu {
namespace {

std::vector<float> randv(std::mt19937& g, size_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct OwnedMatrix {
  std::string bytes;
  std::string name = "w";
  WeightMatrix w;
};

// Builds a weight matrix of `type`; `ref` receives the exactly representable
// (dequantised) values so the reference sees what the kernel sees.
OwnedMatrix make_matrix(gguf::GgmlType type, int64_t rows, int64_t cols, const std::vector<float>& src,
                        std::vector<double>& ref) {
  OwnedMatrix m;
  ref.assign(static_cast<size_t>(rows * cols), 0.0);
  if (type == gguf::GgmlType::kF32) {
    m.bytes.assign(reinterpret_cast<const char*>(src.data()), src.size() * 4);
    for (size_t i = 0; i < src.size(); ++i) ref[i] = src[i];
    m.w.row_bytes = static_cast<size_t>(cols) * 4;
  } else if (type == gguf::GgmlType::kF16) {
    m.bytes.resize(src.size() * 2);
    for (size_t i = 0; i < src.size(); ++i) {
      uint16_t h = fp32_to_fp16(src[i]);
      std::memcpy(&m.bytes[i * 2], &h, 2);
      ref[i] = fp16_to_fp32(h);
    }
    m.w.row_bytes = static_cast<size_t>(cols) * 2;
  } else {
    const int64_t nb = cols / 32;
    std::vector<BlockQ8_0> blocks(static_cast<size_t>(rows * nb));
    for (int64_t r = 0; r < rows; ++r) quantize_row_q8_0(src.data() + r * cols, blocks.data() + r * nb, cols);
    m.bytes.assign(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(BlockQ8_0));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; ++b)
        for (int j = 0; j < 32; ++j)
          ref[static_cast<size_t>(r * cols + b * 32 + j)] =
              static_cast<double>(fp16_to_fp32(blocks[static_cast<size_t>(r * nb + b)].d)) *
              blocks[static_cast<size_t>(r * nb + b)].qs[j];
    m.w.row_bytes = static_cast<size_t>(nb) * sizeof(BlockQ8_0);
  }
  m.w.data = reinterpret_cast<const uint8_t*>(m.bytes.data());
  m.w.type = type;
  m.w.n_rows = rows;
  m.w.n_cols = cols;
  m.w.name = &m.name;
  return m;
}

TEST(Fp16, RoundTripAndSpecials) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(1e6f), 0x7c00);
  EXPECT_FLOAT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(fp16_to_fp32(0x0001), 5.9604645e-8f);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(5.9604645e-8f), 0x0001);
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h))), h);
}

TEST(Q8_0, QuantizeMatchesDefinition) {
  std::mt19937 g(1);
  auto x = randv(g, 96, 3.0f);
  x[5] = 0.0f;
  std::vector<BlockQ8_0> q(3);
  quantize_row_q8_0(x.data(), q.data(), 96);
  for (int b = 0; b < 3; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    EXPECT_EQ(q[b].d, fp32_to_fp16(d));
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[b].qs[j], static_cast<int8_t>(std::lround(x[b * 32 + j] / d)));
  }
  std::vector<float> z(32, 0.0f);
  quantize_row_q8_0(z.data(), q.data(), 32);
  EXPECT_EQ(q[0].d, 0);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], 0);
}

struct MatCase {
  gguf::GgmlType type;
  int64_t rows, cols, tokens;
};

class MatmulTest : public ::testing::TestWithParam<MatCase> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const MatCase c = GetParam();
  std::mt19937 g(static_cast<uint32_t>(c.rows * 131 + c.cols * 7 + c.tokens));
  auto src = randv(g, static_cast<size_t>(c.rows * c.cols));
  std::vector<double> wref;
  OwnedMatrix m = make_matrix(c.type, c.rows, c.cols, src, wref);
  auto x = randv(g, static_cast<size_t>(c.tokens * c.cols));
  std::vector<float> y(static_cast<size_t>(c.tokens * c.rows), -1.0f);
  ThreadPool pool(2);
  matmul(m.w, x.data(), c.tokens, y.data(), &pool);

  // Q8_0 also quantises the activations: reference uses the quantised x.
  std::vector<double> xref(x.begin(), x.end());
  if (c.type == gguf::GgmlType::kQ8_0) {
    const int64_t nb = c.cols / 32;
    std::vector<BlockQ8_0> xq(static_cast<size_t>(nb));
    for (int64_t t = 0; t < c.tokens; ++t) {
      quantize_row_q8_0(x.data() + t * c.cols, xq.data(), c.cols);
      for (int64_t b = 0; b < nb; ++b)
        for (int j = 0; j < 32; ++j)
          xref[static_cast<size_t>(t * c.cols + b * 32 + j)] =
              static_cast<double>(fp16_to_fp32(xq[static_cast<size_t>(b)].d)) * xq[static_cast<size_t>(b)].qs[j];
    }
  }
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t r = 0; r < c.rows; ++r) {
      double s = 0, sa = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        const double p = wref[static_cast<size_t>(r * c.cols + k)] * xref[static_cast<size_t>(t * c.cols + k)];
        s += p;
        sa += std::fabs(p);
      }
      ASSERT_NEAR(y[static_cast<size_t>(t * c.rows + r)], s, 1e-5 * sa + 1e-6)
          << "row " << r << " token " << t;
    }
  }
  // Batch invariance: each token alone gives bitwise the same row, 1 thread too.
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<float> y1(static_cast<size_t>(c.rows));
    matmul(m.w, x.data() + t * c.cols, 1, y1.data(), nullptr);
    ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + t * c.rows, y1.size() * 4)) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, MatmulTest,
                         ::testing::Values(MatCase{gguf::GgmlType::kF32, 37, 53, 1},
                                           MatCase{gguf::GgmlType::kF32, 71, 129, 5},
                                           MatCase{gguf::GgmlType::kF32, 3, 7, 3},
                                           MatCase{gguf::GgmlType::kF16, 37, 53, 1},
                                           MatCase{gguf::GgmlType::kF16, 45, 131, 7},
                                           MatCase{gguf::GgmlType::kQ8_0, 37, 96, 1},
                                           MatCase{gguf::GgmlType::kQ8_0, 67, 320, 9},
                                           MatCase{gguf::GgmlType::kQ8_0, 5, 32, 2}));

TEST(Kernels, FusedMatmulEqualsSeparate) {
  std::mt19937 g(9);
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0}) {
    const int64_t cols = 128, tokens = 6;
    const int64_t rows[3] = {40, 17, 300};
    std::vector<OwnedMatrix> ms;
    std::vector<double> ref;
    for (int64_t r : rows) ms.push_back(make_matrix(type, r, cols, randv(g, static_cast<size_t>(r * cols)), ref));
    for (auto& m : ms) m.w.data = reinterpret_cast<const uint8_t*>(m.bytes.data());  // after moves
    auto x = randv(g, static_cast<size_t>(tokens * cols));
    ThreadPool pool(2);
    std::vector<std::vector<float>> fused(3), sep(3);
    std::vector<MatmulOut> outs;
    for (int i = 0; i < 3; ++i) {
      fused[static_cast<size_t>(i)].resize(static_cast<size_t>(rows[i] * tokens));
      sep[static_cast<size_t>(i)].resize(static_cast<size_t>(rows[i] * tokens));
      outs.push_back({&ms[static_cast<size_t>(i)].w, fused[static_cast<size_t>(i)].data()});
      matmul(ms[static_cast<size_t>(i)].w, x.data(), tokens, sep[static_cast<size_t>(i)].data(), nullptr);
    }
    matmul_fused(outs.data(), 3, x.data(), tokens, &pool);
    for (int i = 0; i < 3; ++i)
      ASSERT_EQ(0, std::memcmp(fused[static_cast<size_t>(i)].data(), sep[static_cast<size_t>(i)].data(),
                               sep[static_cast<size_t>(i)].size() * 4))
          << gguf::ggml_type_name(static_cast<uint32_t>(type)) << " matrix " << i;
  }
}

// Any weight type through gguf's reference quantiser (the low-bit types too).
OwnedMatrix make_any(gguf::GgmlType type, int64_t rows, int64_t cols, std::mt19937& g) {
  if (type == gguf::GgmlType::kF32 || type == gguf::GgmlType::kF16 || type == gguf::GgmlType::kQ8_0) {
    std::vector<double> ref;
    return make_matrix(type, rows, cols, randv(g, static_cast<size_t>(rows * cols)), ref);
  }
  OwnedMatrix m;
  const auto row_bytes = static_cast<size_t>(gguf::ggml_nbytes(static_cast<uint32_t>(type), static_cast<uint64_t>(cols)).value());
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    auto src = randv(g, static_cast<size_t>(cols));
    EXPECT_TRUE(gguf::quantize_row(type, src.data(), m.bytes.data() + static_cast<size_t>(r) * row_bytes,
                                   static_cast<size_t>(cols)).ok());
  }
  m.w.row_bytes = row_bytes;
  m.w.data = reinterpret_cast<const uint8_t*>(m.bytes.data());
  m.w.type = type;
  m.w.n_rows = rows;
  m.w.n_cols = cols;
  m.w.name = &m.name;
  return m;
}

// The prefill GEMM (register tiles over rows x tokens inside blocks of rows x
// tokens split across threads) against the one-token path, bitwise, for every
// weight type: row counts that are not multiples of the tile or the block,
// token counts on both sides of the GEMM threshold and of the tile and block
// edges, column counts with 16-wide and
// scalar tails for F32/F16, and 1 to 4 threads.
TEST(Kernels, GemmBitwiseEqualsPerToken) {
  struct Shape {
    int64_t rows, cols;
  };
  const std::vector<gguf::GgmlType> types = {
      gguf::GgmlType::kF32,  gguf::GgmlType::kF16,  gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_0,
      gguf::GgmlType::kQ4_1, gguf::GgmlType::kQ5_0, gguf::GgmlType::kQ5_1, gguf::GgmlType::kQ4_K,
      gguf::GgmlType::kQ5_K, gguf::GgmlType::kQ6_K};
  const int64_t token_counts[] = {7, 8, 9, 13, 50, 61, 97};
  std::mt19937 g(15);
  for (auto type : types) {
    const bool k_type = type == gguf::GgmlType::kQ4_K || type == gguf::GgmlType::kQ5_K || type == gguf::GgmlType::kQ6_K;
    std::vector<Shape> shapes;
    if (k_type) shapes = {{101, 256}, {50, 512}};
    else if (type == gguf::GgmlType::kF32 || type == gguf::GgmlType::kF16) shapes = {{101, 96}, {53, 75}, {49, 131}, {7, 16}};
    else shapes = {{101, 96}, {53, 160}, {7, 32}};
    for (const Shape& sh : shapes) {
      OwnedMatrix m = make_any(type, sh.rows, sh.cols, g);
      for (int64_t tokens : token_counts) {
        auto x = randv(g, static_cast<size_t>(tokens * sh.cols), 2.0f);
        std::vector<float> ref(static_cast<size_t>(tokens * sh.rows));
        for (int64_t t = 0; t < tokens; ++t)
          matmul(m.w, x.data() + t * sh.cols, 1, ref.data() + t * sh.rows, nullptr);
        for (int threads = 1; threads <= 4; ++threads) {
          ThreadPool pool(threads);
          std::vector<float> y(ref.size(), -7.0f);
          matmul(m.w, x.data(), tokens, y.data(), &pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 4))
              << gguf::ggml_type_name(static_cast<uint32_t>(type)) << " " << sh.rows << "x" << sh.cols << " tokens "
              << tokens << " threads " << threads;
        }
      }
    }
  }
}

// A one-token matmul (decode's matvec; F32 runs four rows at a time with
// AVX-512) gives each row's dot_f32 / dot_f16 bitwise, which is what the
// GEMM's tiles replay: row counts around the group of four, columns with
// 16-wide and scalar tails, 1 and 2 threads (the work is above the parallel
// threshold for the larger shapes).
TEST(Kernels, OneTokenMatmulEqualsRowDots) {
  std::mt19937 g(18);
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16}) {
    for (int64_t rows : {1, 3, 4, 5, 9, 38, 517}) {
      for (int64_t cols : {16, 53, 96, 131, 768}) {
        std::vector<double> wref;
        OwnedMatrix m = make_matrix(type, rows, cols, randv(g, static_cast<size_t>(rows * cols)), wref);
        auto x = randv(g, static_cast<size_t>(cols), 2.0f);
        std::vector<float> ref(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* row = m.w.data + static_cast<size_t>(r) * m.w.row_bytes;
          ref[static_cast<size_t>(r)] = type == gguf::GgmlType::kF32
                                            ? dot_f32(reinterpret_cast<const float*>(row), x.data(), cols)
                                            : dot_f16(reinterpret_cast<const uint16_t*>(row), x.data(), cols);
        }
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          std::vector<float> y(ref.size(), -7.0f);
          matmul(m.w, x.data(), 1, y.data(), &pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 4))
              << gguf::ggml_type_name(static_cast<uint32_t>(type)) << " " << rows << "x" << cols << " threads "
              << threads;
        }
      }
    }
  }
}

// A matrix large enough that the GEMM runs in parallel (above the work
// threshold, several row and token blocks per thread), for the types with
// their own register tiles and one type per other activation format (Q4_0:
// Q8_0 rows read by a low-bit kernel, Q4_1: Q8_1, Q4_K: Q8_K): 1, 2 and 3
// threads give the same bits as 1 token at a time.
TEST(Kernels, GemmParallelBlocksBitwise) {
  std::mt19937 g(16);
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_0,
                    gguf::GgmlType::kQ4_1, gguf::GgmlType::kQ4_K}) {
    const int64_t rows = 197, cols = 256, tokens = 131;
    OwnedMatrix m = make_any(type, rows, cols, g);
    auto x = randv(g, static_cast<size_t>(tokens * cols));
    std::vector<float> ref(static_cast<size_t>(tokens * rows));
    for (int64_t t = 0; t < tokens; ++t) matmul(m.w, x.data() + t * cols, 1, ref.data() + t * rows, nullptr);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(ref.size());
      matmul(m.w, x.data(), tokens, y.data(), &pool);
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 4))
          << gguf::ggml_type_name(static_cast<uint32_t>(type)) << " threads " << threads;
    }
  }
}

// The kQ8_0x16 layout (packed_weights.h): unpacking a record gives back the
// 16 rows' blocks (any variant can pack); where the variant computes from it,
// a packed matrix gives bitwise what the file layout gives, one token at a
// time and as a batch (the per-row path's tiles of 4 and 1, the GEMM's of 8,
// and their edges), on 1 to 3 threads, and both are the block order spelled
// out here with std::fma (KernelTraits::q8_0_x16).
TEST(Kernels, PackedQ8_0BitwiseEqualsFileLayout) {
  std::mt19937 g(19);
  struct Shape {
    int64_t rows, cols;
  };
  // Row counts of 1, 3, 5 (2 + 3) and 7 + 6 groups: the AMX tiles of 1, 2 and 3 groups.
  for (const Shape sh : {Shape{16, 32}, Shape{48, 96}, Shape{80, 64}, Shape{112, 256}, Shape{208, 768}}) {
    std::vector<double> wref;
    OwnedMatrix m = make_matrix(gguf::GgmlType::kQ8_0, sh.rows, sh.cols,
                                randv(g, static_cast<size_t>(sh.rows * sh.cols)), wref);
    const PackedMatrix p = pack(m.w);
    ASSERT_EQ(p.view.layout, WeightLayout::kQ8_0x16);
    const int64_t nb = sh.cols / 32;
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(m.w.data);
    for (int64_t r = 0; r < sh.rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* rec = p.bytes.get() + static_cast<size_t>((r / 16) * nb + b) * kQ8_0x16RecordBytes;
        const BlockQ8_0& want = blocks[r * nb + b];
        uint16_t d;
        std::memcpy(&d, rec + kQ8_0x16Scales + 2 * (r % 16), 2);
        ASSERT_EQ(d, want.d) << "row " << r << " block " << b;
        for (int k = 0; k < 32; ++k)
          ASSERT_EQ(static_cast<int>(rec[((k / 4) * 16 + r % 16) * 4 + k % 4]) - 128, want.qs[k])
              << "row " << r << " block " << b << " code " << k;
      }
    if (!active_kernel_traits().q8_0_x16) continue;  // this variant keeps the file layout
    ASSERT_TRUE(wants_packed(m.w));
    for (int64_t tokens : {1, 3, 4, 7, 8, 9, 13, 50, 97}) {
      auto x = randv(g, static_cast<size_t>(tokens * sh.cols), 2.0f);
      std::vector<float> ref(static_cast<size_t>(tokens * sh.rows));
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<BlockQ8_0> xq(static_cast<size_t>(nb));
        quantize_row_q8_0(x.data() + t * sh.cols, xq.data(), sh.cols);
        for (int64_t r = 0; r < sh.rows; ++r) {
          float acc = 0.0f;
          for (int64_t b = 0; b < nb; ++b) {
            int32_t dot = 0;
            for (int k = 0; k < 32; ++k) dot += blocks[r * nb + b].qs[k] * xq[static_cast<size_t>(b)].qs[k];
            acc = std::fma(static_cast<float>(dot),
                           fp16_to_fp32(blocks[r * nb + b].d) * fp16_to_fp32(xq[static_cast<size_t>(b)].d), acc);
          }
          ref[static_cast<size_t>(t * sh.rows + r)] = acc;
        }
      }
      for (int threads = 1; threads <= 3; ++threads) {
        ThreadPool pool(threads);
        for (const WeightMatrix* w : {static_cast<const WeightMatrix*>(&m.w), &p.view}) {
          std::vector<float> y(ref.size(), -7.0f);
          matmul(*w, x.data(), tokens, y.data(), &pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 4))
              << (w == &m.w ? "file layout " : "packed ") << sh.rows << "x" << sh.cols << " tokens " << tokens
              << " threads " << threads;
        }
      }
    }
    // A fused call mixing the packed matrix with file-layout ones (a model's
    // Q/K/V where one height is not a multiple of 16) gives each its own bits.
    OwnedMatrix odd = make_any(gguf::GgmlType::kQ8_0, 37, sh.cols, g);
    for (int64_t tokens : {1, 9}) {
      auto x = randv(g, static_cast<size_t>(tokens * sh.cols));
      std::vector<float> a(static_cast<size_t>(tokens * sh.rows)), b(static_cast<size_t>(tokens * 37));
      std::vector<float> a1(a.size()), b1(b.size());
      const MatmulOut outs[2] = {{&p.view, a.data()}, {&odd.w, b.data()}};
      ThreadPool pool(2);
      matmul_fused(outs, 2, x.data(), tokens, &pool);
      matmul(m.w, x.data(), tokens, a1.data(), nullptr);
      matmul(odd.w, x.data(), tokens, b1.data(), nullptr);
      ASSERT_EQ(0, std::memcmp(a.data(), a1.data(), a.size() * 4)) << "fused packed, tokens " << tokens;
      ASSERT_EQ(0, std::memcmp(b.data(), b1.data(), b.size() * 4)) << "fused file layout, tokens " << tokens;
    }
  }
}

// The kQ4_Kx16 layout: where the variant computes from it, a packed Q4_K
// matrix gives bitwise what quant_dot's kernels give over the file layout
// (which are bitwise the scalar kernels: quant_dot_test), one token at a
// time and as a batch, on 1 to 3 threads.
TEST(Kernels, PackedQ4_KBitwiseEqualsFileLayout) {
  if (!active_kernel_traits().q8_0_x16) GTEST_SKIP() << "this variant keeps the file layout";
  std::mt19937 g(20);
  for (const int64_t rows : {16, 48, 80, 208}) {
    for (const int64_t cols : {256, 768}) {
      OwnedMatrix m = make_any(gguf::GgmlType::kQ4_K, rows, cols, g);
      ASSERT_TRUE(wants_packed(m.w));
      const PackedMatrix p = pack(m.w);
      ASSERT_EQ(p.view.layout, WeightLayout::kQ4_Kx16);
      ASSERT_EQ(layout_bytes(p.view.layout, rows, cols, m.w.nbytes()), m.w.nbytes() / 144 * 148);  // 2368 / 16
      for (int64_t tokens : {1, 3, 4, 5, 9, 50}) {
        auto x = randv(g, static_cast<size_t>(tokens * cols), 2.0f);
        std::vector<float> ref(static_cast<size_t>(tokens * rows));
        for (int64_t t = 0; t < tokens; ++t) matmul(m.w, x.data() + t * cols, 1, ref.data() + t * rows, nullptr);
        for (int threads = 1; threads <= 3; ++threads) {
          ThreadPool pool(threads);
          std::vector<float> y(ref.size(), -7.0f);
          matmul(p.view, x.data(), tokens, y.data(), &pool);
          ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 4))
              << rows << "x" << cols << " tokens " << tokens << " threads " << threads;
        }
      }
    }
  }
}

// Fused GEMM (Q/K/V-like matrices of different heights, prefill-sized batch)
// equals the one-token path.
TEST(Kernels, FusedGemmEqualsPerToken) {
  std::mt19937 g(17);
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ6_K}) {
    const int64_t cols = 256, tokens = 57;
    const int64_t rows[3] = {100, 52, 9};
    std::vector<OwnedMatrix> ms;
    ms.reserve(3);
    for (int64_t r : rows) ms.push_back(make_any(type, r, cols, g));
    for (auto& m : ms) m.w.data = reinterpret_cast<const uint8_t*>(m.bytes.data());
    auto x = randv(g, static_cast<size_t>(tokens * cols));
    ThreadPool pool(2);
    std::vector<std::vector<float>> fused(3);
    std::vector<MatmulOut> outs;
    for (int i = 0; i < 3; ++i) {
      fused[static_cast<size_t>(i)].resize(static_cast<size_t>(rows[i] * tokens));
      outs.push_back({&ms[static_cast<size_t>(i)].w, fused[static_cast<size_t>(i)].data()});
    }
    matmul_fused(outs.data(), 3, x.data(), tokens, &pool);
    for (int i = 0; i < 3; ++i)
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> one(static_cast<size_t>(rows[i]));
        matmul(ms[static_cast<size_t>(i)].w, x.data() + t * cols, 1, one.data(), nullptr);
        ASSERT_EQ(0, std::memcmp(one.data(), fused[static_cast<size_t>(i)].data() + t * rows[i], one.size() * 4))
            << gguf::ggml_type_name(static_cast<uint32_t>(type)) << " matrix " << i << " token " << t;
      }
  }
}

// The attention helpers give the plain loops' bits: four scores at once
// against dot_f32 per position, and the register-accumulated weighted sum
// of V rows against a plain loop with kernels.h's rounding (one fused
// multiply-add per term where the target has FMA), at every optimisation
// level (the sanitizer builds are -O1, where GCC does not contract).
TEST(Kernels, AttentionHelpersMatchPlainLoops) {
  std::mt19937 g(18);
  for (int64_t dim : {64, 128, 48, 80, 112, 256, 272, 7}) {
    const int64_t n_pos = 37;
    auto q = randv(g, static_cast<size_t>(dim));
    auto kv = randv(g, static_cast<size_t>(n_pos * dim));
    std::vector<const float*> rows(static_cast<size_t>(n_pos));
    for (int64_t p = 0; p < n_pos; ++p) rows[static_cast<size_t>(p)] = kv.data() + (n_pos - 1 - p) * dim;
    for (int64_t p = 0; p + 4 <= n_pos; p += 4) {
      float four[4];
      dot_f32_x4(q.data(), &rows[static_cast<size_t>(p)], dim, four);
      for (int j = 0; j < 4; ++j) {
        const float one = dot_f32(rows[static_cast<size_t>(p + j)], q.data(), dim);
        ASSERT_EQ(0, std::memcmp(&one, &four[j], 4)) << "dim " << dim << " position " << p + j;
      }
      // Two query rows at once (the second a K row read as a query).
      const float* qs[2] = {q.data(), rows[static_cast<size_t>(n_pos / 2)]};
      float eight[8];
      dot_f32_2x4(qs, &rows[static_cast<size_t>(p)], dim, eight, eight + 4);
      for (int r = 0; r < 2; ++r) {
        for (int j = 0; j < 4; ++j) {
          const float one = dot_f32(rows[static_cast<size_t>(p + j)], qs[r], dim);
          ASSERT_EQ(0, std::memcmp(&one, &eight[4 * r + j], 4)) << "dim " << dim << " row " << r << " position "
                                                                 << p + j;
        }
      }
    }
    // Two query rows against eight positions at once.
    for (int64_t p = 0; p + 8 <= n_pos; p += 8) {
      const float* qs[2] = {q.data(), rows[static_cast<size_t>(n_pos / 2)]};
      float two[16];
      dot_f32_2x8(qs, &rows[static_cast<size_t>(p)], dim, two, two + 8);
      for (int j = 0; j < 8; ++j) {
        for (int r = 0; r < 2; ++r) {
          const float rj = dot_f32(rows[static_cast<size_t>(p + j)], qs[r], dim);
          ASSERT_EQ(0, std::memcmp(&rj, &two[8 * r + j], 4)) << "2x8 dim " << dim << " row " << r << " position "
                                                              << p + j;
        }
      }
    }
    auto a = randv(g, static_cast<size_t>(n_pos));
    std::vector<float> ref(static_cast<size_t>(dim), 0.0f), got(static_cast<size_t>(dim), -1.0f);
    for (int64_t p = 0; p < n_pos; ++p) {
      const float ap = a[static_cast<size_t>(p)];
      const float* vp = rows[static_cast<size_t>(p)];
      // One rounding per term where the variant has FMA (kernels.h), two otherwise.
      if (active_kernel_variant().uses("fma")) {
        for (int64_t d = 0; d < dim; ++d)
          ref[static_cast<size_t>(d)] = std::fma(ap, vp[d], ref[static_cast<size_t>(d)]);
      } else {
        for (int64_t d = 0; d < dim; ++d) ref[static_cast<size_t>(d)] = ap * vp[d] + ref[static_cast<size_t>(d)];
      }
    }
    weighted_rows(rows.data(), a.data(), n_pos, dim, got.data());
    ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * 4)) << "dim " << dim;
    // In pieces (as cpu_backend goes, 16 positions at a time for a chunk of
    // heads): the first without `accumulate`, the rest with it, same bits.
    for (int64_t piece : {1, 5, 16}) {
      std::fill(got.begin(), got.end(), -1.0f);
      for (int64_t p0 = 0; p0 < n_pos; p0 += piece)
        weighted_rows(rows.data() + p0, a.data() + p0, std::min(piece, n_pos - p0), dim, got.data(), p0 > 0);
      ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * 4)) << "dim " << dim << " pieces of " << piece;
    }
    // Four weight rows at once (attention's query rows), the second piece
    // accumulating: each output is what weighted_rows gives for its row.
    std::vector<std::vector<float>> a4(4), got4(4, std::vector<float>(static_cast<size_t>(dim), -1.0f));
    for (auto& ar : a4) ar = randv(g, static_cast<size_t>(n_pos));
    const float* a4p[4] = {a4[0].data(), a4[1].data(), a4[2].data(), a4[3].data()};
    float* o4[4] = {got4[0].data(), got4[1].data(), got4[2].data(), got4[3].data()};
    const int64_t cut = n_pos / 3;
    weighted_rows_x4(rows.data(), a4p, cut, dim, o4);
    const float* a4q[4] = {a4p[0] + cut, a4p[1] + cut, a4p[2] + cut, a4p[3] + cut};
    weighted_rows_x4(rows.data() + cut, a4q, n_pos - cut, dim, o4, /*accumulate=*/true);
    for (int r = 0; r < 4; ++r) {
      weighted_rows(rows.data(), a4p[r], n_pos, dim, got.data());
      ASSERT_EQ(0, std::memcmp(got.data(), got4[static_cast<size_t>(r)].data(), got.size() * 4))
          << "dim " << dim << " row " << r;
    }
  }
}

// The F16 forms (an F16 KV cache read in place) give bitwise what the F32
// forms give on the rows converted to F32.
TEST(Kernels, AttentionHelpersOverHalvesMatchConvertedRows) {
  std::mt19937 g(21);
  for (int64_t dim : {64, 128, 48, 80, 112, 256, 272, 7}) {
    const int64_t n_pos = 37;
    const auto q = randv(g, static_cast<size_t>(dim)), q2 = randv(g, static_cast<size_t>(dim));
    const auto kv = randv(g, static_cast<size_t>(n_pos * dim));
    std::vector<uint16_t> halves(kv.size());
    std::vector<float> conv(kv.size());
    for (size_t i = 0; i < kv.size(); ++i) conv[i] = fp16_to_fp32(halves[i] = fp32_to_fp16(kv[i]));
    std::vector<const uint16_t*> hr(static_cast<size_t>(n_pos));
    std::vector<const float*> fr(static_cast<size_t>(n_pos));
    for (int64_t p = 0; p < n_pos; ++p) {
      hr[static_cast<size_t>(p)] = halves.data() + p * dim;
      fr[static_cast<size_t>(p)] = conv.data() + p * dim;
    }
    auto same = [](const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; };
    for (int64_t p = 0; p + 4 <= n_pos; p += 4) {
      float h4[4], f4[4];
      dot_f32_x4(q.data(), hr.data() + p, dim, h4);
      dot_f32_x4(q.data(), fr.data() + p, dim, f4);
      ASSERT_TRUE(same(h4, f4, 4)) << "dot_f32_x4 dim " << dim << " at " << p;
      const float* qs[2] = {q.data(), q2.data()};
      float h8[8], f8[8];
      dot_f32_2x4(qs, hr.data() + p, dim, h8, h8 + 4);
      dot_f32_2x4(qs, fr.data() + p, dim, f8, f8 + 4);
      ASSERT_TRUE(same(h8, f8, 8)) << "dot_f32_2x4 dim " << dim << " at " << p;
      const float one = dot_f16(hr[static_cast<size_t>(p)], q.data(), dim);
      ASSERT_TRUE(same(&one, &f4[0], 1)) << "dot_f16 dim " << dim;
      if (p + 8 <= n_pos) {
        float h16[16], f16[16];
        dot_f32_2x8(qs, hr.data() + p, dim, h16, h16 + 8);
        dot_f32_2x8(qs, fr.data() + p, dim, f16, f16 + 8);
        ASSERT_TRUE(same(h16, f16, 16)) << "dot_f32_2x8 dim " << dim << " at " << p;
      }
    }
    const auto a = randv(g, static_cast<size_t>(4 * n_pos));
    const float* ar[4] = {a.data(), a.data() + n_pos, a.data() + 2 * n_pos, a.data() + 3 * n_pos};
    std::vector<float> ho(static_cast<size_t>(4 * dim)), fo(ho.size());
    float* hp[4] = {ho.data(), ho.data() + dim, ho.data() + 2 * dim, ho.data() + 3 * dim};
    float* fp[4] = {fo.data(), fo.data() + dim, fo.data() + 2 * dim, fo.data() + 3 * dim};
    weighted_rows_x4(hr.data(), ar, n_pos, dim, hp);
    weighted_rows_x4(fr.data(), ar, n_pos, dim, fp);
    ASSERT_TRUE(same(ho.data(), fo.data(), ho.size())) << "weighted_rows_x4 dim " << dim;
    weighted_rows(hr.data(), a.data(), n_pos, dim, ho.data());
    weighted_rows(fr.data(), a.data(), n_pos, dim, fo.data());
    ASSERT_TRUE(same(ho.data(), fo.data(), static_cast<size_t>(dim))) << "weighted_rows dim " << dim;
  }
}

// The activation quantiser (SIMD where built) gives gguf's reference bits,
// including x * id landing exactly on .5 (roundf rounds away from zero),
// all-zero blocks, a block whose maximum is negative, and tiny values.
TEST(Kernels, QuantizeQ8_0BitwiseGguf) {
  std::mt19937 g(19);
  const int64_t nb = 64;
  std::vector<float> x = randv(g, static_cast<size_t>(nb * 32), 3.0f);
  // Block 0: multiples of amax/254 give x * id = k + 0.5 (or close to it).
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(2 * (j - 16) + 1) * (127.0f / 254.0f);
  x[31] = 127.0f;
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(32 + j)] = 0.0f;          // block 1: zeros
  x[64 + 5] = -9.0f;                                                              // block 2: negative max
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(96 + j)] *= 1e-30f;         // block 3: tiny
  for (int b = 4; b < 12; ++b)                                                    // blocks 4..11: halves of a grid
    for (int j = 0; j < 32; ++j) x[static_cast<size_t>(b * 32 + j)] = static_cast<float>((j * 7 + b) % 64 - 32) * 0.5f;
  std::vector<BlockQ8_0> got(static_cast<size_t>(nb)), want(static_cast<size_t>(nb));
  quantize_row_q8_0(x.data(), got.data(), nb * 32);
  gguf::quantize_row_q8_0(x.data(), want.data(), static_cast<size_t>(nb * 32));
  for (int64_t b = 0; b < nb; ++b)
    ASSERT_EQ(0, std::memcmp(&got[static_cast<size_t>(b)], &want[static_cast<size_t>(b)], sizeof(BlockQ8_0))) << "block " << b;
}

TEST(Kernels, QuantizeMatchesGgufReference) {
  std::mt19937 g(10);
  auto x = randv(g, 32 * 9, 4.0f);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
  x[40] = 127.5f / 64.0f;                                          // ties round away from zero
  std::vector<BlockQ8_0> mine(9), ref(9);
  quantize_row_q8_0(x.data(), mine.data(), x.size());
  gguf::quantize_row_q8_0(x.data(), ref.data(), x.size());
  EXPECT_EQ(0, std::memcmp(mine.data(), ref.data(), 9 * sizeof(BlockQ8_0)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = fp16_to_fp32(static_cast<uint16_t>(h)), b = gguf::fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a)) << h;
    } else {
      ASSERT_EQ(a, b) << h;
    }
  }
  for (float f : x) ASSERT_EQ(fp32_to_fp16(f * 1e-3f), gguf::fp32_to_fp16(f * 1e-3f)) << f;
}

TEST(Kernels, DequantizeRow) {
  std::mt19937 g(3);
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0}) {
    auto src = randv(g, 3 * 64);
    std::vector<double> ref;
    OwnedMatrix m = make_matrix(type, 3, 64, src, ref);
    std::vector<float> row(64);
    dequantize_row(m.w, 2, row.data());
    for (int i = 0; i < 64; ++i) ASSERT_EQ(row[static_cast<size_t>(i)], static_cast<float>(ref[static_cast<size_t>(128 + i)]));
  }
}

TEST(Kernels, RmsNorm) {
  std::mt19937 g(4);
  const int n = 77;
  auto x = randv(g, n, 2.0f), w = randv(g, n);
  std::vector<float> y(n);
  rms_norm(x.data(), w.data(), n, 1e-5f, y.data());
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double sc = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[static_cast<size_t>(i)], x[static_cast<size_t>(i)] * sc * w[static_cast<size_t>(i)], 1e-5);
}

TEST(Kernels, RopeRotatesConsecutivePairs) {
  std::mt19937 g(5);
  const int n_heads = 3, hd = 10, n_rot = 6, pos0 = 17, n_tok = 2;
  const float base = 10000.0f;
  std::vector<float> c(n_tok * n_rot / 2), s(n_tok * n_rot / 2);
  rope_table(pos0, n_tok, n_rot, base, c.data(), s.data());
  for (int t = 0; t < n_tok; ++t) {
    auto x = randv(g, n_heads * hd);
    auto y = x;
    rope_apply(y.data(), n_heads, hd, n_rot, c.data() + t * n_rot / 2, s.data() + t * n_rot / 2);
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double x0 = x[static_cast<size_t>(h * hd + 2 * i)], x1 = x[static_cast<size_t>(h * hd + 2 * i + 1)];
        double r0 = x0, r1 = x1;
        if (2 * i < n_rot) {
          const double th = (pos0 + t) * std::pow(static_cast<double>(base), -2.0 * i / n_rot);
          r0 = x0 * std::cos(th) - x1 * std::sin(th);
          r1 = x0 * std::sin(th) + x1 * std::cos(th);
        }
        EXPECT_NEAR(y[static_cast<size_t>(h * hd + 2 * i)], r0, 1e-6);
        EXPECT_NEAR(y[static_cast<size_t>(h * hd + 2 * i + 1)], r1, 1e-6);
      }
    }
  }
}

TEST(Kernels, SoftmaxSwigluAdd) {
  std::mt19937 g(6);
  const int n = 33;
  auto x = randv(g, n, 20.0f);
  auto y = x;
  softmax(y.data(), n);
  double mx = -1e30, sum = 0;
  for (float v : x) mx = std::max<double>(mx, v);
  for (float v : x) sum += std::exp(v - mx);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[static_cast<size_t>(i)], std::exp(x[static_cast<size_t>(i)] - mx) / sum, 1e-6);

  auto a = randv(g, n, 5.0f), b = randv(g, n);
  std::vector<float> o(n);
  swiglu(a.data(), b.data(), o.data(), n);
  for (int i = 0; i < n; ++i) {
    const double gv = a[static_cast<size_t>(i)];
    EXPECT_NEAR(o[static_cast<size_t>(i)], gv / (1 + std::exp(-gv)) * b[static_cast<size_t>(i)], 1e-5);
  }
  auto acc = a;
  add(acc.data(), b.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(acc[static_cast<size_t>(i)], a[static_cast<size_t>(i)] + b[static_cast<size_t>(i)]);
}

// Gemma's tanh, GELU gate and soft-capping: tanh_steps within 1.2e-7 of
// tanh (odd, exactly +-1 far out), and geglu / softcap (16 values at a time)
// give, value by value, the bits of their definitions over tanh_steps, at
// lengths that end inside a 16-value group and in place.
TEST(Kernels, TanhStepsGegluSoftcap) {
  double worst = 0;
  for (int i = -20000; i <= 20000; ++i) {
    const float x = static_cast<float>(i) * 0.001f;
    const float t = tanh_steps(x);
    worst = std::max(worst, std::abs(static_cast<double>(t) - std::tanh(static_cast<double>(x))));
    EXPECT_EQ(t, -tanh_steps(-x)) << x;
  }
  EXPECT_LT(worst, 1.2e-7);
  EXPECT_EQ(tanh_steps(50.0f), 1.0f);
  EXPECT_EQ(tanh_steps(-1e30f), -1.0f);
  EXPECT_EQ(tanh_steps(0.0f), 0.0f);

  std::mt19937 g(7);
  constexpr float kSqrt2OverPi = 0.797884560802865355f;
  for (int n : {1, 15, 16, 33, 100}) {
    auto a = randv(g, n, 6.0f), b = randv(g, n);
    std::vector<float> o(static_cast<size_t>(n));
    geglu(a.data(), b.data(), o.data(), n);
    for (int i = 0; i < n; ++i) {
      const float x = a[static_cast<size_t>(i)];
      const float t = tanh_steps((kSqrt2OverPi * x) * std::fma(0.044715f * x, x, 1.0f));
      EXPECT_EQ(o[static_cast<size_t>(i)], ((0.5f * x) * (1.0f + t)) * b[static_cast<size_t>(i)]) << n << " " << i;
      // GELU's tanh form within float rounding of the double formula.
      const double xd = x, gelu = 0.5 * xd * (1 + std::tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd)));
      EXPECT_NEAR(o[static_cast<size_t>(i)], gelu * b[static_cast<size_t>(i)], 1e-5 * (1 + std::abs(gelu)));
    }
    auto in_place = a;
    geglu(in_place.data(), b.data(), in_place.data(), n);
    EXPECT_EQ(in_place, o);
    auto c = randv(g, n, 40.0f);
    auto capped = c;
    softcap(capped.data(), n, 5.0f);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(capped[static_cast<size_t>(i)], 5.0f * tanh_steps(c[static_cast<size_t>(i)] / 5.0f)) << n << " " << i;
      EXPECT_LT(std::abs(capped[static_cast<size_t>(i)]), 5.0f + 1e-6f);
    }
  }
}

}  // namespace
}  // namespace spw::cpu
