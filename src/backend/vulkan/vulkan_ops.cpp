// The single ops on host data (conformance tests and diagnostics) and the
// health check's one tiny device operation.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/vulkan/vulkan_backend_internal.h"

namespace spw {

// ------------------------------------------------------------------ single ops

namespace {
// Host-visible temporaries for one op, freed when it returns.
struct OpBuffers {
  std::vector<DeviceBuffer> bufs;
};
}  // namespace

Status VulkanBackend::op_matmul(const WeightMatrix& w, const float* x, int32_t n_tokens, float* y) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  if (n_tokens <= 0) return Status::invalid_argument("op_matmul: n_tokens <= 0");
  const int64_t block = cpu::act_block_elems(cpu::act_format(w.type));
  if (w.n_cols % block != 0)
    return Status::invalid_argument("op_matmul: " + std::string(gguf::ggml_type_name(static_cast<uint32_t>(w.type))) +
                                    " needs n_cols % " + std::to_string(block) + " == 0");
  DevMatrix m;
  SPW_RETURN_IF_ERROR(im.upload_matrix(w, "op", m));
  im.staging.reset();
  const uint64_t n = static_cast<uint64_t>(n_tokens);
  const uint64_t xin = n * static_cast<uint64_t>(w.n_cols) * 4, yout = n * static_cast<uint64_t>(w.n_rows) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(xin, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(yout, MemoryCategory::kScratch, "op", true));
  const uint64_t nb = static_cast<uint64_t>(w.n_cols) / 32 + 1;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bq, im.alloc(n * nb * 32, MemoryCategory::kScratch, "op"));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bd, im.alloc(n * nb * 4, MemoryCategory::kScratch, "op"));
  std::memcpy(bx.mapped(), x, xin);
  Impl::Recorder rec(im);
  MatmulInput(rec, bx.buffer(), bq.buffer(), bd.buffer(), n * static_cast<uint64_t>(w.n_cols))
      .matmul(m, static_cast<uint32_t>(n), by.buffer(), static_cast<uint32_t>(w.n_rows));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), yout);
  return Status();
}

Status VulkanBackend::op_quantize(cpu::ActFormat f, const float* x, int64_t n, int8_t* qs, uint32_t* scales) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const int64_t block = cpu::act_block_elems(f);
  if (f == cpu::ActFormat::kFloat || n <= 0 || n % block != 0)
    return Status::invalid_argument("op_quantize: n must be a positive multiple of the format's block");
  const uint64_t un = static_cast<uint64_t>(n), nb = un / static_cast<uint64_t>(block);
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(un * 4, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bq, im.alloc(un, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bd, im.alloc(nb * 4, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, un * 4);
  Impl::Recorder rec(im);
  record_quantize(rec, f, bx.buffer(), bq.buffer(), bd.buffer(), un);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(qs, bq.mapped(), un);  // little-endian packing = byte order
  std::memcpy(scales, bd.mapped(), nb * 4);
  return Status();
}

Status VulkanBackend::op_rms_norm(const float* x, const float* weight, int32_t n, int32_t n_tokens, float eps,
                                  float* y) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(n_tokens) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bw, im.alloc(static_cast<uint64_t>(n) * 4, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, bytes);
  std::memcpy(bw.mapped(), weight, static_cast<size_t>(n) * 4);
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, 4);
  Impl::Recorder rec(im);
  rec.rms_rows(bx.buffer(), bw.buffer(), by.buffer(), static_cast<uint64_t>(n), static_cast<uint64_t>(n_tokens),
               eps_bits);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), bytes);
  return Status();
}

Status VulkanBackend::op_swiglu(const float* gate, const float* up, int64_t n, float* out) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bg, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bu, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(bg.mapped(), gate, bytes);
  std::memcpy(bu.mapped(), up, bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(n)};
  Impl::Recorder rec(im);
  rec.dispatch_flat(rec.swiglu_shader(), {bg.buffer(), bu.buffer()}, pc, sizeof pc, static_cast<uint64_t>(n));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(out, bg.mapped(), bytes);
  return Status();
}

Status VulkanBackend::op_add(float* y, const float* x, int64_t n) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint64_t bytes = static_cast<uint64_t>(n) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer by, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  std::memcpy(by.mapped(), y, bytes);
  std::memcpy(bx.mapped(), x, bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(n)};
  Impl::Recorder rec(im);
  rec.dispatch_flat("add", {by.buffer(), bx.buffer()}, pc, sizeof pc, static_cast<uint64_t>(n));
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(y, by.mapped(), bytes);
  return Status();
}

Status VulkanBackend::health_check() {
  // The injected failure is the check's own (as a wrong answer would be):
  // it touches nothing, and the device stays healthy.
  if (impl_->faults.take_health_failure()) {
    return Status(StatusCode::kUnavailable, "health check of " + name() + " failed (injected)",
                  FailureReason::kUnhealthy);
  }
  // A submission holding the queue longer than a fence wait may last is
  // hung (each of its waits ends at the fence timeout): the check says so
  // instead of joining the wait, so the prober and shutdown stay bounded.
  std::unique_lock<TimedMutex> lk(impl_->mu, std::defer_lock);
  if (!lk.try_lock_for(std::chrono::milliseconds(impl_->opts.fence_timeout_ms))) {
    return Status(StatusCode::kDeadlineExceeded,
                  "health check of " + name() + ": the queue stayed busy for the whole fence timeout (" +
                      std::to_string(impl_->opts.fence_timeout_ms) + " ms)",
                  FailureReason::kTimeout);
  }
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  constexpr int64_t kN = 64;
  std::vector<float> y(kN), x(kN);
  for (int64_t i = 0; i < kN; ++i) {
    y[static_cast<size_t>(i)] = static_cast<float>(i);
    x[static_cast<size_t>(i)] = 0.5f;
  }
  const uint64_t bytes = kN * 4;
  Result<DeviceBuffer> by = im.alloc(bytes, MemoryCategory::kScratch, "health", true);
  Result<DeviceBuffer> bx = by.ok() ? im.alloc(bytes, MemoryCategory::kScratch, "health", true) : by.status();
  if (!bx.ok()) {
    // The budget is full (no typed reason: nothing is wrong with the
    // device): check the queue and fence alone with an empty submission.
    if (bx.status().reason() != FailureReason::kNone) return bx.status();
    Impl::Recorder rec(im);
    return rec.finish();
  }
  std::memcpy(by->mapped(), y.data(), bytes);
  std::memcpy(bx->mapped(), x.data(), bytes);
  const uint32_t pc[1] = {static_cast<uint32_t>(kN)};
  Impl::Recorder rec(im);
  rec.dispatch_flat("add", {by->buffer(), bx->buffer()}, pc, sizeof pc, static_cast<uint64_t>(kN));
  SPW_RETURN_IF_ERROR(rec.finish());
  const auto* out = static_cast<const float*>(by->mapped());
  for (int64_t i = 0; i < kN; ++i) {
    if (out[i] != static_cast<float>(i) + 0.5f) {
      const std::string msg = "health check of " + name() + ": wrong result at " + std::to_string(i);
      im.ctx->mark_unhealthy(msg, FailureReason::kUnhealthy);
      return Status(StatusCode::kInternal, msg, FailureReason::kUnhealthy);
    }
  }
  return Status();
}

Status VulkanBackend::op_rope(float* x, int32_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                              int32_t pos0, float freq_base) {
  std::lock_guard<TimedMutex> lk(impl_->mu);
  Impl& im = *impl_;
  SPW_RETURN_IF_ERROR(im.healthy_or_error());
  const uint32_t half = static_cast<uint32_t>(n_rot / 2);
  const uint64_t n = static_cast<uint64_t>(n_tokens);
  const uint64_t bytes = n * static_cast<uint64_t>(n_heads) * static_cast<uint64_t>(head_dim) * 4;
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bx, im.alloc(bytes, MemoryCategory::kScratch, "op", true));
  SPW_ASSIGN_OR_RETURN(DeviceBuffer bt,
                       im.alloc(2 * n * std::max<uint32_t>(half, 1) * 4, MemoryCategory::kScratch, "op", true));
  std::memcpy(bx.mapped(), x, bytes);
  float* cs = static_cast<float*>(bt.mapped());
  cpu::rope_table(pos0, n_tokens, n_rot, freq_base, cs, cs + n * half);
  const uint32_t pc[5] = {static_cast<uint32_t>(n), static_cast<uint32_t>(n_heads), static_cast<uint32_t>(head_dim),
                          half, static_cast<uint32_t>(n_heads * head_dim)};
  Impl::Recorder rec(im);
  rec.dispatch_flat(rec.exact_attention() ? "rope_f64" : "rope", {bx.buffer(), bt.buffer()}, pc, sizeof pc,
                    n * static_cast<uint64_t>(n_heads) * half);
  SPW_RETURN_IF_ERROR(rec.finish());
  std::memcpy(x, bx.mapped(), bytes);
  return Status();
}

}  // namespace spw
