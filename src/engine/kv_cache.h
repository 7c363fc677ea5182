// Paged KV cache: a pool of fixed-size blocks shared by many sequences.
//
// Contract: a KvPool owns `n_blocks` blocks; each block holds K and V for
// `block_tokens` consecutive token positions of every layer in the pool's layer
// range [layer_begin, layer_end) (hybrid execution gives each backend the pool
// of its own layers). Storage is host F32: for a block b, layer l (relative to
// layer_begin) and token slot s, K lives at k(b, l) + s * n_embd_kv and V at
// v(b, l) + s * n_embd_kv. (F16 KV can come later; bytes_per_token() already
// reports the real size so admission control needs no change.)
// A BlockTable maps a sequence's logical positions to blocks: position p lives in
// block blocks()[p / block_tokens], slot p % block_tokens.
// KvPool::reserve(table, n) grows a table to hold n positions, a block at a time;
// when the pool cannot supply every block it returns ResourceExhausted and leaves
// the table and the pool exactly as they were (all-or-nothing). shrink() returns
// whole unused blocks to the pool. release() frees all blocks of a table.
// Thread safety: the allocator (reserve/shrink/release and the counters) is
// guarded by a mutex, so sequences on different threads may share one pool. The
// K/V contents of a block are touched only by the owner of the table holding it.
// A BlockTable must be released into the pool it came from before the pool dies.
// Device backends: the block allocator and BlockTable are device-agnostic. A
// pool made by create() keeps its K/V in host memory (on_host() is true). A pool
// made by create_on_device() keeps them in a KvDeviceStorage supplied by a
// device backend (e.g. VulkanBackend::create_kv_pool); on_host() is false and
// k()/v() return nullptr, so only that backend can read or write its contents;
// block ids, tables, counters and reserve/shrink behave exactly as for host
// pools (hybrid = one pool per stage, see SessionStage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace spw {

struct KvPoolOptions {
  int32_t layer_begin = 0;
  int32_t layer_end = 0;    // exclusive
  int32_t n_embd_kv = 0;    // floats of K (or V) per token per layer
  int32_t block_tokens = 16;
  int32_t n_blocks = 0;     // capacity
};

// K/V storage that lives in a device backend's memory. Opaque to the engine:
// the backend that made it downcasts it. Destroyed with the pool.
class KvDeviceStorage {
 public:
  virtual ~KvDeviceStorage() = default;
  virtual std::string device_name() const = 0;  // "vulkan:0"
  virtual size_t bytes() const = 0;             // device bytes held
};

class BlockTable {
 public:
  BlockTable() = default;
  const std::vector<int32_t>& blocks() const { return blocks_; }
  int32_t capacity_tokens(int32_t block_tokens) const {
    return static_cast<int32_t>(blocks_.size()) * block_tokens;
  }

 private:
  friend class KvPool;
  std::vector<int32_t> blocks_;
};

class KvPool {
 public:
  // InvalidArgument naming the bad option. Allocates all storage up front
  // (ResourceExhausted if that fails) and touches every page (zero-fills), so
  // the memory is committed when the pool is made, not mid-generation.
  static Result<std::shared_ptr<KvPool>> create(const KvPoolOptions& opts);
  // Same options checks; K/V live in `storage` (non-null, sized by the caller
  // for opts), no host storage is allocated.
  static Result<std::shared_ptr<KvPool>> create_on_device(const KvPoolOptions& opts,
                                                          std::unique_ptr<KvDeviceStorage> storage);

  bool on_host() const { return device_storage_ == nullptr; }
  KvDeviceStorage* device_storage() const { return device_storage_.get(); }

  const KvPoolOptions& options() const { return opts_; }
  int32_t block_tokens() const { return opts_.block_tokens; }
  int32_t n_layers() const { return opts_.layer_end - opts_.layer_begin; }
  int32_t n_embd_kv() const { return opts_.n_embd_kv; }

  size_t bytes_per_token() const;  // K+V, all layers of the pool
  size_t bytes_per_block() const { return bytes_per_token() * static_cast<size_t>(opts_.block_tokens); }
  int32_t n_blocks() const { return opts_.n_blocks; }
  int32_t blocks_in_use() const;
  int32_t blocks_free() const;
  // Blocks needed to hold n_tokens positions.
  int32_t blocks_for_tokens(int32_t n_tokens) const {
    return (n_tokens + opts_.block_tokens - 1) / opts_.block_tokens;
  }

  // Makes `table` hold at least n_tokens positions (see contract).
  Status reserve(BlockTable& table, int32_t n_tokens);
  // Frees blocks beyond those needed for n_tokens positions.
  void shrink(BlockTable& table, int32_t n_tokens);
  void release(BlockTable& table) { shrink(table, 0); }

  // Layer index `layer` is relative to layer_begin. Host pools only (nullptr
  // for a device pool).
  float* k(int32_t block, int32_t layer) { return base(block, layer); }
  float* v(int32_t block, int32_t layer) { return base(block, layer) + block_layer_floats(); }
  const float* k(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->k(block, layer); }
  const float* v(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->v(block, layer); }

 private:
  explicit KvPool(const KvPoolOptions& o) : opts_(o) {}
  size_t block_layer_floats() const {
    return static_cast<size_t>(opts_.block_tokens) * static_cast<size_t>(opts_.n_embd_kv);
  }
  float* base(int32_t block, int32_t layer) {
    if (!data_) return nullptr;
    return data_.get() + (static_cast<size_t>(block) * static_cast<size_t>(n_layers()) +
                          static_cast<size_t>(layer)) * 2 * block_layer_floats();
  }

  KvPoolOptions opts_;
  std::unique_ptr<float[]> data_;
  std::unique_ptr<KvDeviceStorage> device_storage_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;  // stack of free block ids
};

// What a backend's forward pass reads and writes: one sequence in one pool.
struct KvSequence {
  KvPool* pool = nullptr;
  const BlockTable* table = nullptr;
};

}  // namespace spw
