// Backend: where the llama forward pass runs (CPU now, Vulkan later).
//
// Contract: a forward pass is split into three calls so that a request can run
// layers [0, N) on one backend and [N, n_layer) on another (hybrid offload), and
// so that a session can be re-evaluated on a different backend after migration:
//   embed()          token ids -> hidden states       [n_tokens][n_embd] (host F32)
//   forward_layers() hidden -> hidden through layers [layer_begin, layer_end) for
//                    a batch of consecutive positions pos0 .. pos0+n_tokens-1 of
//                    ONE sequence, reading/writing that sequence's KV through
//                    `kv` (whose pool covers at least those layers and whose
//                    table already holds pos0+n_tokens positions: the caller
//                    reserves first, so a failed reservation never reaches here).
//                    Positions < pos0 must already be in the KV. Causal attention.
//   forward_batch()  the same for several sequences in one pass over the
//                    weights (continuous batching): slice i is n_tokens rows at
//                    positions pos0.. of the sequence whose KV is slices[i].kv;
//                    their rows are consecutive in `hidden`, in slice order.
//                    Each row's result equals what forward_layers gives for its
//                    sequence alone (bitwise on one backend). The default runs
//                    the slices one after another; a backend that can share
//                    the weight pass (the CPU) overrides it.
//   output()         hidden -> logits [n_rows][n_vocab] (final RMSNorm + head)
// Hidden states cross the interface in host memory: they are n_embd floats per
// token, which is cheap next to the weights, and it keeps backends independent.
// Numerical contract: for a given backend, each token's result does not depend
// on the batch size, the split into ubatches, or the number of threads (results
// are bitwise equal), so a session re-evaluated from its tokens continues
// exactly as the original. Different backends agree within float tolerance.
// Errors: InvalidArgument for bad ranges/sizes; a device backend returns
// DeviceLost / ResourceExhausted as Status, never crashes.
// KV storage: create_kv_pool() makes a pool whose K/V this backend can use
// (host F32 by default; a device backend puts them in its memory), and
// accepts_kv() says whether a given pool's storage is usable here (default:
// host pools only). Session::create_staged rejects a mismatch.
// Thread safety: a Backend may be shared by several sessions on different
// threads; implementations serialise internally where they must (the CPU
// backend runs one parallel region at a time on its thread pool).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace spw {

// One sequence's rows in a batched forward pass (Backend::forward_batch).
struct SeqSlice {
  KvSequence kv;
  int32_t pos0 = 0;
  int32_t n_tokens = 0;
};

// The checks every forward_batch makes before it runs (one copy for every
// backend): each slice has a pool and a table, the layers lie inside the
// pool's, its KV width is the model's, n_tokens > 0, pos0 >= 0, and the table
// holds pos0 + n_tokens positions. InvalidArgument naming what is wrong.
inline Status check_slices(const LlamaHparams& hp, int32_t layer_begin, int32_t layer_end,
                           std::span<const SeqSlice> slices) {
  if (slices.empty()) return Status::invalid_argument("forward_batch: no sequences");
  for (const SeqSlice& sl : slices) {
    const KvPool* pool = sl.kv.pool;
    if (pool == nullptr || sl.kv.table == nullptr) return Status::invalid_argument("forward_layers: no KV");
    const auto& kvo = pool->options();
    if (layer_begin < kvo.layer_begin || layer_end > kvo.layer_end || layer_begin > layer_end ||
        layer_end > hp.n_layer) {
      return Status::invalid_argument("forward_layers: layers [" + std::to_string(layer_begin) + ", " +
                                      std::to_string(layer_end) + ") outside the KV pool's [" +
                                      std::to_string(kvo.layer_begin) + ", " + std::to_string(kvo.layer_end) + ")");
    }
    if (kvo.n_embd_kv != hp.n_embd_kv()) return Status::invalid_argument("forward_layers: KV width mismatch");
    const int32_t bt = pool->block_tokens();
    if (sl.n_tokens <= 0 || sl.pos0 < 0 || sl.kv.table->capacity_tokens(bt) < sl.pos0 + sl.n_tokens) {
      return Status::invalid_argument("forward_layers: KV table holds " +
                                      std::to_string(sl.kv.table->capacity_tokens(bt)) + " positions, need " +
                                      std::to_string(sl.pos0 + sl.n_tokens));
    }
    // Sliding-window layers: the window's blocks mapped (KvPool::slide).
    if (pool->has_window() && !pool->window_covers(*sl.kv.table, sl.pos0, sl.n_tokens))
      return Status::invalid_argument("forward_layers: the KV window of positions [" + std::to_string(sl.pos0) +
                                      ", " + std::to_string(sl.pos0 + sl.n_tokens) +
                                      ") is not mapped (KvPool::slide first)");
  }
  return Status();
}

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "vulkan:0", ...
  virtual std::string name() const = 0;

  // Makes the weights of layers [layer_begin, layer_end) (and embedding/output
  // when asked) usable by this backend (a device backend uploads them). The CPU
  // backend needs nothing. Must be called before using those layers.
  virtual Status prepare(const Model& model, int32_t layer_begin, int32_t layer_end,
                         bool embedding, bool output) = 0;

  // hidden: n_tokens * n_embd floats. InvalidArgument for an id out of range.
  virtual Status embed(const Model& model, std::span<const TokenId> tokens, float* hidden) = 0;

  virtual Status forward_layers(const Model& model, int32_t layer_begin, int32_t layer_end,
                                const KvSequence& kv, int32_t pos0, int32_t n_tokens,
                                float* hidden) = 0;

  virtual Status forward_batch(const Model& model, int32_t layer_begin, int32_t layer_end,
                               std::span<const SeqSlice> slices, float* hidden) {
    int64_t row = 0;
    for (const SeqSlice& s : slices) {
      SPW_RETURN_IF_ERROR(forward_layers(model, layer_begin, layer_end, s.kv, s.pos0, s.n_tokens,
                                         hidden + row * model.hparams().n_embd));
      row += s.n_tokens;
    }
    return Status();
  }

  // Computes logits for `n_rows` hidden rows (n_rows * n_embd floats) into
  // logits (n_rows * n_vocab floats). `hidden` is not modified.
  virtual Status output(const Model& model, const float* hidden, int32_t n_rows, float* logits) = 0;

  // `owner` names the pool in a device backend's memory accounting.
  virtual Result<std::shared_ptr<KvPool>> create_kv_pool(const KvPoolOptions& opts, const std::string& owner) {
    (void)owner;
    return KvPool::create(opts);
  }
  virtual bool accepts_kv(const KvPool& pool) const { return pool.on_host(); }
};

}  // namespace spw
