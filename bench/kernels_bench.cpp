// CPU matmul kernels: bytes of weights streamed per second for F32, F16, Q8_0,
// Q4_K and Q6_K at decode shape (one token) and prefill shape (64 tokens), 1 and 2
// threads. Decode speed is this rate over a model's weight bytes per token, so
// the per-type ratios here are what the engine can reach at most.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/thread_pool.h"
#include "gguf/quant.h"
#include "model/model.h"

namespace {

using spw::WeightMatrix;
using spw::gguf::GgmlType;

// A 4096 x 4096 matrix: 64 MiB in F32, far beyond the caches, as real weights are.
constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 4096;

struct Fixture {
  std::vector<uint8_t> bytes;
  spw::cpu::PackedMatrix packed;  // the layout the kernel variant computes from, if not the file's
  WeightMatrix w;
};

const Fixture& fixture(GgmlType type, int64_t rows = kRows, int64_t cols = kCols) {
  static std::unique_ptr<Fixture> cache[3][31];  // by shape (4096 square, taller, wider), ggml type id
  const auto slot = static_cast<size_t>(type);
  auto& cached = cache[rows == kRows && cols == kCols ? 0 : (rows > cols ? 1 : 2)][slot];
  if (!cached) {
    auto f = std::make_unique<Fixture>();
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> row(static_cast<size_t>(cols));
    uint64_t row_bytes = spw::gguf::ggml_nbytes(static_cast<uint32_t>(type), static_cast<uint64_t>(cols)).value();
    f->bytes.resize(row_bytes * rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& x : row) x = dist(rng);
      (void)spw::gguf::quantize_row(type, row.data(), f->bytes.data() + r * row_bytes, cols);
    }
    f->w.data = f->bytes.data();
    f->w.type = type;
    f->w.n_cols = cols;
    f->w.n_rows = rows;
    f->w.row_bytes = row_bytes;
    if (spw::cpu::wants_packed(f->w)) {
      f->packed = spw::cpu::pack(f->w);
      f->w = f->packed.view;
    }
    cached = std::move(f);
  }
  return *cached;
}

void BM_Matmul(benchmark::State& state, GgmlType type) {
  const int64_t n_tokens = state.range(0);
  const int n_threads = static_cast<int>(state.range(1));
  const Fixture& f = fixture(type);
  spw::ThreadPool pool(n_threads);
  std::vector<float> x(static_cast<size_t>(n_tokens * kCols), 0.01f);
  std::vector<float> y(static_cast<size_t>(n_tokens * kRows));
  for (auto _ : state) {
    spw::cpu::matmul(f.w, x.data(), n_tokens, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(f.w.nbytes()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * n_tokens), benchmark::Counter::kIsRate);
}

// Prefill at gen-model 110M's FFN shape (2048 x 768, the gate/up matrices):
// 256 tokens, the GEMM path (register tiles, blocks split over threads).
// tokens/s here is the matmul's, not a model's.
constexpr int64_t kFfnRows = 2048;
constexpr int64_t kFfnCols = 768;

// rows x cols = 2048 x 768 (gate/up: activation rows of 3 KiB) or 768 x
// 2048 (the FFN down projection: activation rows of 8 KiB, so a tile's token
// rows no longer fit in L1 as the other shape's do).
void BM_GemmShape(benchmark::State& state, GgmlType type, int64_t rows, int64_t cols) {
  const int64_t n_tokens = state.range(0);
  const int n_threads = static_cast<int>(state.range(1));
  const Fixture& f = fixture(type, rows, cols);
  spw::ThreadPool pool(n_threads);
  std::mt19937 rng(rows == kFfnRows ? 2 : 3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tokens * cols));
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(n_tokens * rows));
  for (auto _ : state) {
    spw::cpu::matmul(f.w, x.data(), n_tokens, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * rows * cols * static_cast<double>(n_tokens) / 1e9,
      benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * n_tokens), benchmark::Counter::kIsRate);
}
void BM_Gemm(benchmark::State& state, GgmlType type) { BM_GemmShape(state, type, kFfnRows, kFfnCols); }
void BM_GemmDown(benchmark::State& state, GgmlType type) { BM_GemmShape(state, type, kFfnCols, kFfnRows); }

BENCHMARK_CAPTURE(BM_Gemm, f32, GgmlType::kF32)->ArgsProduct({{256}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemm, f16, GgmlType::kF16)->ArgsProduct({{256}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemm, q8_0, GgmlType::kQ8_0)->ArgsProduct({{256}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemm, q4_k, GgmlType::kQ4_K)->ArgsProduct({{256}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Gemm, q6_k, GgmlType::kQ6_K)->ArgsProduct({{256}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmDown, f32, GgmlType::kF32)->ArgsProduct({{256}, {1}})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmDown, f16, GgmlType::kF16)->ArgsProduct({{256}, {1}})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmDown, q8_0, GgmlType::kQ8_0)->ArgsProduct({{256}, {1}})->UseRealTime();

BENCHMARK_CAPTURE(BM_Matmul, f32, GgmlType::kF32)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, f16, GgmlType::kF16)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q8_0, GgmlType::kQ8_0)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q4_k, GgmlType::kQ4_K)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q6_k, GgmlType::kQ6_K)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
