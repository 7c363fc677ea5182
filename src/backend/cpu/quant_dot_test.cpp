// Low-bit dot products (quant_dot.h) and the matmul that uses them:
//  * SIMD kernels equal the scalar kernels bitwise, and the 4-token kernels
//    equal the 1-token kernel per token (the invariance contract);
//  * each dot is within a stated bound of the double-precision dot of the
//    dequantised weights with the original (unquantised) activations;
//  * matmul over a batch equals token-by-token matmul bitwise, with 1 or 3
//    threads, fused or not, for every type and a Q4_K_M-like mix.
#include "backend/cpu/quant_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernel_variant_test_env.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "gguf/fp16.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

namespace spw::cpu {
namespace {

using gguf::GgmlType;

const GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

std::string tname(GgmlType t) { return gguf::ggml_type_name(static_cast<uint32_t>(t)); }
int64_t block_of(GgmlType t) { return gguf::ggml_type_info(static_cast<uint32_t>(t))->block_size; }

std::vector<float> randv(std::mt19937& g, size_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint8_t> quantize_rows(GgmlType t, const std::vector<float>& src, int64_t rows, int64_t cols) {
  const size_t rb = *gguf::ggml_nbytes(static_cast<uint32_t>(t), static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(gguf::quantize_row(t, src.data() + r * cols, out.data() + rb * r, static_cast<size_t>(cols)).ok());
  return out;
}

// Quantised activations of one token in the type's activation format.
struct Act {
  std::vector<uint8_t> blocks;
  std::vector<float> d, s;
  ActRow row;
};
Act make_act(GgmlType t, const float* x, int64_t n) {
  const ActFormat f = act_format(t);
  const int64_t nb = n / act_block_elems(f);
  Act a;
  a.blocks.resize(static_cast<size_t>(nb) * act_block_bytes(f));
  a.d.resize(static_cast<size_t>(nb));
  a.s.resize(static_cast<size_t>(nb));
  quantize_act_row(f, x, n, a.blocks.data(), a.d.data(), a.s.data());
  a.row = {a.blocks.data(), a.d.data(), a.s.data()};
  return a;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Widths with and without a partial group of 8 legacy blocks.
std::vector<int64_t> widths(GgmlType t) {
  if (block_of(t) == 256) return {256, 512, 1280, 2816};
  return {32, 96, 256, 288, 1056, 4096};
}

TEST(QuantDot, SimdEqualsScalarAndGroupsEqualSingles) {
  std::printf("quant_dot ISA: %s\n", quant_dot_isa());
  std::mt19937 g(7);
  for (GgmlType t : kTypes) {
    for (int64_t n : widths(t)) {
      const std::vector<float> w = randv(g, static_cast<size_t>(n), 0.05f);
      const std::vector<uint8_t> wq = quantize_rows(t, w, 1, n);
      std::vector<Act> acts;
      for (int k = 0; k < 4; ++k) {
        std::vector<float> x = randv(g, static_cast<size_t>(n), 1.0f);
        if (k == 3) x[static_cast<size_t>(n / 2)] = 40.0f;  // an outlier sets one block's scale
        acts.push_back(make_act(t, x.data(), n));
      }
      const ActRow rows[4] = {acts[0].row, acts[1].row, acts[2].row, acts[3].row};
      float simd4[4], scal4[4];
      quant_dot(t)->four(wq.data(), rows, n, simd4);
      quant_dot_scalar(t)->four(wq.data(), rows, n, scal4);
      for (int k = 0; k < 4; ++k) {
        float s1, c1;
        quant_dot(t)->one(wq.data(), &rows[k], n, &s1);
        quant_dot_scalar(t)->one(wq.data(), &rows[k], n, &c1);
        EXPECT_EQ(bits(s1), bits(c1)) << tname(t) << " n=" << n << " token " << k << ": simd " << s1 << " scalar " << c1;
        EXPECT_EQ(bits(s1), bits(simd4[k])) << tname(t) << " n=" << n << " token " << k;
        EXPECT_EQ(bits(c1), bits(scal4[k])) << tname(t) << " n=" << n << " token " << k;
      }
    }
  }
}

// Bound on |kernel - sum_i w^_i x_i| (w^ the dequantised weights, x the
// original activations). The kernel computes, up to float rounding, the dot
// of w^ with the quantised activations x^ (the _1 types through s = d*sum q,
// stored as fp16), so the error is the activation rounding weighted by |w|:
//   Q8_0 / Q8_1 block: |x - x^| <= delta = d/2 + 127 |d - fp16(d)| <= d (1/2 + 127 * 2^-11)
//     (q = round(x / d) uses the float d, x^ uses its fp16 rounding);
//     for Q8_1 the offset term m * s adds |m| (32 delta + |s| 2^-11 + 32 * 127 d 2^-11);
//     the codes multiply x^ as d_w q_w = w^ - m, hence |w^| + |m| below;
//   Q8_K block: delta = d/2 (float d, no fp16 rounding; the mins use the
//     exact block sums, so there is no extra term).
// Float rounding of the accumulation: 1e-6 of sum |w^ x| (a few hundred
// float operations at 2^-24, and int32 -> float conversion of sums > 2^24).
double dot_bound(GgmlType t, const std::vector<float>& wd, const uint8_t* wq, const Act& a, int64_t n) {
  const ActFormat f = act_format(t);
  const int64_t ab = act_block_elems(f);
  double bound = 0;
  for (int64_t b = 0; b < n / ab; ++b) {
    double d, delta, s = 0;
    if (f == ActFormat::kQ8_K) {
      d = reinterpret_cast<const gguf::BlockQ8_K*>(a.blocks.data())[b].d;
      delta = 0.5 * std::fabs(d) * (1 + 1e-6);  // d = -max / 127 carries the sign of the max
    } else {
      // The block's d as stored (fp16); the float d it rounds differs by
      // at most 2^-11 relative, covered by the 1e-3 margin.
      d = a.d[static_cast<size_t>(b)];
      delta = d * (0.5 + 128.0 / 2048.0) * (1 + 1e-3);
      s = a.s[static_cast<size_t>(b)];
    }
    for (int64_t i = b * ab; i < (b + 1) * ab; ++i) bound += std::fabs(wd[static_cast<size_t>(i)]) * delta;
    if (f == ActFormat::kQ8_1) {
      // The weights' offset m of this 32-block: w^ - d_w q_w, recovered from
      // the weight block itself.
      const auto* wb = reinterpret_cast<const uint8_t*>(wq) + b * (t == GgmlType::kQ4_1 ? 20 : 24);
      uint16_t mh;
      std::memcpy(&mh, wb + 2, 2);
      const double m = std::fabs(static_cast<double>(gguf::fp16_to_fp32(mh)));
      bound += m * 32 * delta + m * (32 * delta + std::fabs(s) / 2048 + 32 * 127 * d / 2048);
    }
  }
  return bound + 1e-7;
}

TEST(QuantDot, WithinTheActivationRoundingBoundOfTheDequantisedDot) {
  std::mt19937 g(11);
  for (GgmlType t : kTypes) {
    double worst_ratio = 0;
    for (int64_t n : widths(t)) {
      for (int rep = 0; rep < 4; ++rep) {
        const std::vector<float> w = randv(g, static_cast<size_t>(n), 0.05f);
        std::vector<float> x = randv(g, static_cast<size_t>(n), 1.0f);
        if (rep == 1) x[3] = -25.0f;
        const std::vector<uint8_t> wq = quantize_rows(t, w, 1, n);
        std::vector<float> wd(static_cast<size_t>(n));
        ASSERT_TRUE(gguf::dequantize_row(t, wq.data(), wd.data(), static_cast<size_t>(n)).ok());
        const Act a = make_act(t, x.data(), n);
        float got;
        quant_dot(t)->one(wq.data(), &a.row, n, &got);
        double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          exact += static_cast<double>(wd[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)];
          mag += std::fabs(static_cast<double>(wd[static_cast<size_t>(i)]) * x[static_cast<size_t>(i)]);
        }
        const double bound = dot_bound(t, wd, wq.data(), a, n) + 1e-6 * mag;
        const double err = std::fabs(static_cast<double>(got) - exact);
        EXPECT_LE(err, bound) << tname(t) << " n=" << n << " rep " << rep << ": " << got << " vs " << exact;
        worst_ratio = std::max(worst_ratio, err / bound);
      }
    }
    std::printf("[measure] %s: worst |dot - dequantised F32 dot| / bound = %.3f\n", tname(t).c_str(), worst_ratio);
  }
}

// ---------------------------------------------------------------- matmul

struct Owned {
  std::vector<uint8_t> bytes;
  std::string name;
  WeightMatrix w;
};
Owned make_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& g) {
  Owned m;
  m.bytes = quantize_rows(t, randv(g, static_cast<size_t>(rows * cols), 0.05f), rows, cols);
  m.name = tname(t);
  m.w.data = m.bytes.data();
  m.w.type = t;
  m.w.n_rows = rows;
  m.w.n_cols = cols;
  m.w.row_bytes = m.bytes.size() / static_cast<size_t>(rows);
  m.w.name = &m.name;
  return m;
}

TEST(QuantMatmul, BatchThreadAndFusionInvariant) {
  std::mt19937 g(3);
  ThreadPool pool(3);
  // K types at 512 columns, legacy at 288 (a partial group of 8 blocks);
  // 37 rows (a partial row tile) and 9 tokens (two token groups + 1).
  for (GgmlType t : kTypes) {
    const int64_t cols = block_of(t) == 256 ? 512 : 288, rows = 37, n_tok = 9;
    Owned m = make_matrix(t, rows, cols, g);
    const std::vector<float> x = randv(g, static_cast<size_t>(cols * n_tok), 1.0f);
    std::vector<float> batch(static_cast<size_t>(rows * n_tok)), threaded(batch.size()), single(batch.size());
    matmul(m.w, x.data(), n_tok, batch.data(), nullptr);
    matmul(m.w, x.data(), n_tok, threaded.data(), &pool);
    for (int64_t k = 0; k < n_tok; ++k) matmul(m.w, x.data() + k * cols, 1, single.data() + k * rows, nullptr);
    EXPECT_TRUE(batch == single) << tname(t) << ": batched differs from token-by-token";
    EXPECT_TRUE(batch == threaded) << tname(t) << ": 3 threads differ from 1";
    // Row r, token k against the kernel on its own (what the contract promises).
    const Act a = make_act(t, x.data() + 4 * cols, cols);
    float one;
    quant_dot(t)->one(m.w.data + 5 * m.w.row_bytes, &a.row, cols, &one);
    EXPECT_EQ(bits(one), bits(batch[4 * rows + 5])) << tname(t);
  }
}

TEST(QuantMatmul, MixedTypesFuseLikeSeparateCalls) {
  // A Q4_K_M-like attention block: Q/K as Q4_K, V as Q6_K (same Q8_K
  // activations: one fused group), and a Q8_0 + Q4_0 pair (Q8_0 activations)
  // next to a Q4_1 (Q8_1: its own group).
  std::mt19937 g(5);
  const int64_t cols = 512, n_tok = 6;
  const std::vector<float> x = randv(g, static_cast<size_t>(cols * n_tok), 1.0f);
  ThreadPool pool(2);
  for (const auto& types : {std::vector<GgmlType>{GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K},
                            std::vector<GgmlType>{GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_K}}) {
    std::vector<Owned> ms;
    for (GgmlType t : types) ms.push_back(make_matrix(t, 40, cols, g));
    std::vector<std::vector<float>> fused(ms.size()), sep(ms.size());
    std::vector<MatmulOut> outs;
    for (size_t i = 0; i < ms.size(); ++i) {
      fused[i].resize(static_cast<size_t>(40 * n_tok));
      sep[i].resize(fused[i].size());
      outs.push_back({&ms[i].w, fused[i].data()});
      matmul(ms[i].w, x.data(), n_tok, sep[i].data(), nullptr);
    }
    matmul_fused(outs.data(), static_cast<int>(outs.size()), x.data(), n_tok, &pool);
    for (size_t i = 0; i < ms.size(); ++i) EXPECT_TRUE(fused[i] == sep[i]) << ms[i].name;
  }
}

TEST(QuantMatmul, DequantizeRowIsTheReference) {
  std::mt19937 g(9);
  for (GgmlType t : kTypes) {
    Owned m = make_matrix(t, 3, 256, g);
    std::vector<float> a(256), b(256);
    dequantize_row(m.w, 2, a.data());
    ASSERT_TRUE(gguf::dequantize_row(t, m.w.data + 2 * m.w.row_bytes, b.data(), 256).ok());
    EXPECT_TRUE(a == b) << tname(t);
  }
}

}  // namespace
}  // namespace spw::cpu
