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
  WeightMatrix w;
};

const Fixture& fixture(GgmlType type) {
  static std::unique_ptr<Fixture> cache[31];  // by ggml type id
  const auto slot = static_cast<size_t>(type);
  if (!cache[slot]) {
    auto f = std::make_unique<Fixture>();
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> row(kCols);
    uint64_t row_bytes = spw::gguf::ggml_nbytes(static_cast<uint32_t>(type), kCols).value();
    f->bytes.resize(row_bytes * kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      for (float& x : row) x = dist(rng);
      (void)spw::gguf::quantize_row(type, row.data(), f->bytes.data() + r * row_bytes, kCols);
    }
    f->w.data = f->bytes.data();
    f->w.type = type;
    f->w.n_cols = kCols;
    f->w.n_rows = kRows;
    f->w.row_bytes = row_bytes;
    cache[slot] = std::move(f);
  }
  return *cache[slot];
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

BENCHMARK_CAPTURE(BM_Matmul, f32, GgmlType::kF32)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, f16, GgmlType::kF16)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q8_0, GgmlType::kQ8_0)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q4_k, GgmlType::kQ4_K)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();
BENCHMARK_CAPTURE(BM_Matmul, q6_k, GgmlType::kQ6_K)->ArgsProduct({{1, 64}, {1, 2}})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
