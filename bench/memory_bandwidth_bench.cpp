// Read bandwidth of this machine, the ceiling for memory-bound decode.
// Decode of one token streams every weight byte once, so tokens/s <=
// bandwidth / weight bytes. Reported as bytes_per_second at 1 and 2 threads.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "admission/bandwidth.h"

namespace {

constexpr size_t kBytes = size_t{1} << 30;  // far beyond any cache

const std::vector<uint64_t>& buffer() {
  static std::vector<uint64_t> buf = [] {
    std::vector<uint64_t> b(kBytes / sizeof(uint64_t));
    for (size_t i = 0; i < b.size(); ++i) b[i] = i * 0x9E3779B97F4A7C15ull;
    return b;
  }();
  return buf;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const auto& buf = buffer();
  const int n_threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::vector<uint64_t> partial(n_threads);
    std::vector<std::thread> threads;
    size_t chunk = buf.size() / n_threads;
    for (int t = 0; t < n_threads; ++t) {
      threads.emplace_back([&, t] { partial[t] = spw::admission::read_sum(buf.data() + t * chunk, chunk); });
    }
    for (auto& th : threads) th.join();
    uint64_t total = 0;
    for (uint64_t v : partial) total += v;
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kBytes));
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
