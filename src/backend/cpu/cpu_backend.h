// CpuBackend: the llama forward pass on host CPU cores.
//
// Contract: implements Backend (see backend/backend.h) with the kernels in
// kernels.h over weights used in place from the model's mapping, a fixed
// ThreadPool of n_threads (matmuls and attention are split over output rows /
// heads), and K/V in host KvPools. Results are bitwise independent of
// n_threads and of batch size.
// Fault injection: set_faults() attaches a FaultInjector (backend/
// fault_injector.h) whose `slow` faults count one event per forward pass:
// a firing one makes the pass take `factor` times its wall time (the CPU
// path under a co-tenant's load, for drills and for tests that need a queue
// to stay queued); disarming ends a stretch in progress within 10 ms. The
// other kinds are device faults and never fire here.
// Thread safety: one CpuBackend may serve several sessions concurrently; their
// parallel regions take turns on the pool. set_faults() before use.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/fault_injector.h"
#include "backend/cpu/thread_pool.h"

namespace spw {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads = 1);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  int n_threads() const { return pool_->n_threads(); }
  ThreadPool& pool() { return *pool_; }
  void set_faults(FaultInjector* faults) { faults_ = faults; }

  Status prepare(const Model& model, int32_t layer_begin, int32_t layer_end, bool embedding,
                 bool output) override;
  Status embed(const Model& model, std::span<const TokenId> tokens, float* hidden) override;
  Status forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end, const KvSequence& kv,
                        int32_t pos0, int32_t n_tokens, float* hidden) override;
  // Every sequence's rows share each weight pass (matmuls over all rows);
  // attention stays per row, through its own sequence's KV.
  Status forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end, std::span<const SeqSlice> slices,
                       float* hidden) override;
  Status output(const Model& model, const float* hidden, int32_t n_rows, float* logits) override;

 private:
  Status run_batch(const Model& model, int32_t layer_begin, int32_t layer_end, std::span<const SeqSlice> slices,
                   float* hidden);

  std::unique_ptr<ThreadPool> pool_;
  FaultInjector* faults_ = nullptr;  // not owned; null: none
};

namespace cpu {
// The embedding of every backend: hidden[t] = row tokens[t] of token_embd,
// dequantised on the host from the model's mapping (cpu::dequantize_row).
// A row gather reads n_embd elements a token, so no device does it better
// than a copy back would cost; the Vulkan backend calls this too, so the
// embedding is bitwise the same on every placement and token_embd needs no
// device copy unless it is also the (tied) output head. InvalidArgument for
// an id outside [0, n_vocab).
Status embed_tokens(const Model& model, std::span<const TokenId> tokens, float* hidden);
}  // namespace cpu

}  // namespace spw
