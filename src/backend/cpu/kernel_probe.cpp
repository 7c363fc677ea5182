#include "backend/cpu/kernel_probe.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_weights.h"
#include "gguf/quant.h"

namespace spw::cpu {

namespace {
constexpr int64_t kCols = 2048;  // a multiple of every block size (256 for the K types)
}  // namespace

Result<double> measure_decode_kernel_rate(Env& env, gguf::GgmlType type, const KernelProbeOptions& o) {
  const std::string name = gguf::ggml_type_name(static_cast<uint32_t>(type));
  if (!gguf::has_reference_codec(type)) {
    return Status::invalid_argument("kernel probe: the CPU backend does not run weight type " + name);
  }
  if (o.passes < 1 || o.matrix_bytes == 0 || o.bytes_per_pass < o.matrix_bytes) {
    return Status::invalid_argument("kernel probe: passes must be >= 1 and bytes_per_pass >= matrix_bytes > 0");
  }
  SPW_ASSIGN_OR_RETURN(const uint64_t row_bytes, gguf::ggml_nbytes(static_cast<uint32_t>(type), kCols));
  // Values in [-1, 1) from a fixed sequence: the kernels' time does not
  // depend on them (integer dots; no denormals), only their layout does.
  std::vector<float> x(kCols);
  uint32_t s = 12345;
  for (float& v : x) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  int64_t rows = std::max<int64_t>(16, static_cast<int64_t>(o.matrix_bytes / row_bytes));
  // A type the variant computes from a packed layout (packed_weights.h):
  // rows in multiples of 64, so both sizes below are whole 16-row groups.
  WeightMatrix shape;  // wants_packed asks the type and the height only
  shape.type = type;
  shape.n_rows = kQ8_0x16Rows;
  const bool packs = wants_packed(shape);
  if (packs) rows = std::max<int64_t>(64, rows / 64 * 64);
  std::vector<uint8_t> data(static_cast<size_t>(rows) * row_bytes);
  SPW_RETURN_IF_ERROR(gguf::quantize_row(type, x.data(), data.data(), kCols));
  for (int64_t r = 1; r < rows; ++r) std::memcpy(data.data() + r * row_bytes, data.data(), row_bytes);
  std::vector<float> y(static_cast<size_t>(rows));
  // The fastest pass's nanoseconds per matmul over the first n rows.
  auto per_call_ns = [&](int64_t n) -> double {
    WeightMatrix w;
    w.data = data.data();
    w.type = type;
    w.n_cols = kCols;
    w.n_rows = n;
    w.row_bytes = row_bytes;
    // In the layout the variant computes the model's matrices from.
    PackedMatrix packed;
    if (packs) packed = pack(w);
    const WeightMatrix& m = packs ? packed.view : w;
    const int64_t reps = std::max<int64_t>(1, static_cast<int64_t>(o.bytes_per_pass / w.nbytes()));
    matmul(m, x.data(), 1, y.data(), nullptr);  // warm: the rows into the cache, the code paged in
    int64_t best_ns = 0;
    for (int pass = 0; pass < o.passes; ++pass) {
      const int64_t t0 = env.now_ns(), c0 = env.thread_cpu_ns();
      for (int64_t i = 0; i < reps; ++i) matmul(m, x.data(), 1, y.data(), nullptr);
      // The time this thread ran (one thread: nullptr pool), not the time it
      // waited for a core on a busy host.
      const int64_t ns = std::min(env.now_ns() - t0, env.thread_cpu_ns() - c0);
      if (ns > 0 && (best_ns == 0 || ns < best_ns)) best_ns = ns;
    }
    return static_cast<double>(best_ns) / static_cast<double>(reps);
  };
  const int64_t small = rows / 4;
  const double t_small = per_call_ns(small);
  const double t_big = per_call_ns(rows);
  volatile float sink = y[0];  // the results stay observable
  (void)sink;
  if (t_small <= 0 || t_big <= 0) {
    return Status(StatusCode::kUnavailable, "kernel probe: the clock did not advance over a pass (a simulated clock?)");
  }
  // The marginal rate: a call's fixed part (quantising the activation row,
  // setting up) cancels out; decode's matrices are large enough that the
  // bytes dominate it. A noisy pair that leaves no difference falls back to
  // the plain ratio.
  const double extra_bytes = static_cast<double>((rows - small) * static_cast<int64_t>(row_bytes));
  if (t_big > t_small) return extra_bytes / ((t_big - t_small) / 1e9);
  return static_cast<double>(rows * static_cast<int64_t>(row_bytes)) / (t_big / 1e9);
}

}  // namespace spw::cpu
