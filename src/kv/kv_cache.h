// Paged KV cache: a pool of fixed-size blocks shared by many sequences.
//
// Contract: a KvPool owns `n_blocks` blocks; each block holds K and V for
// `block_tokens` consecutive token positions of every layer in the pool's layer
// range [layer_begin, layer_end) (hybrid execution gives each backend the pool
// of its own layers). Rows are stored as KvPoolOptions::type (core/kv_type.h:
// f32, f16 or q8_0; the library default is f32, the server's f16): for a
// block b, layer l (relative to layer_begin) and token slot s, the K row is
// row_bytes() bytes at k_bytes(b, l) + s * row_bytes(), V likewise at
// v_bytes(b, l). For an F32 pool k(b, l) / v(b, l) are the same rows as
// floats (nullptr for other types). store_rows() converts a token's F32 K and
// V rows into the pool's type (F16: round to nearest even; Q8_0: the GGUF
// quantiser, bit for bit); rows_to_f32() converts n consecutive slots back to
// F32 (exact for F32, the exact value of each stored half or Q8_0 block).
// A Q8_0 pool needs n_embd_kv and head_dim to be multiples of 32 (create
// refuses it otherwise, check_kv_type); bytes_per_token() is the stored size.
// A BlockTable maps a sequence's logical positions to blocks: position p lives in
// block blocks()[p / block_tokens], slot p % block_tokens.
// KvPool::reserve(table, n) grows a table to hold n positions, a block at a time;
// when the pool cannot supply every block it returns ResourceExhausted and leaves
// the table and the pool exactly as they were (all-or-nothing). shrink() returns
// whole unused blocks to the pool. release() frees all blocks of a table.
// Sharing (several sequences continuing one prompt, OpenAI's n > 1): blocks
// are reference counted. fork(src, dst, n) makes an empty dst hold src's first
// n positions: the full blocks among them are shared (count + 1, no bytes
// move), and a partially filled last block is copied into a fresh block of
// dst's own (host pools: the bytes; a device pool refuses with
// FailedPrecondition, see share_prefix), because positions are append-only:
// a full block is never written again, and the partial one is the only block
// a sibling would write into. That is the copy-on-write, done at fork time.
// share_prefix(src, dst, n) shares only the full blocks among the first n
// positions (dst then holds n / block_tokens * block_tokens positions; the
// caller recomputes the rest), on any pool. Both are all-or-nothing:
// ResourceExhausted (no block for the copy) or InvalidArgument (dst not
// empty, n past src's blocks) leave both tables and the pool as they were.
// shrink/release drop a table's reference; a block returns to the free list
// when its last reference goes, so blocks_in_use() counts each shared block
// once. A table must not write into a block it shares (shared(b) > 1):
// make_tail_private() gives a table that is about to append at position n a
// private copy of the block holding n when that block is shared (host pools;
// FailedPrecondition on a device pool).
// Thread safety: the allocator (reserve/shrink/release and the counters) is
// guarded by a mutex, so sequences on different threads may share one pool. The
// K/V contents of a block are touched only by the owner of the table holding it.
// A BlockTable must be released into the pool it came from before the pool dies.
// Sliding-window layers (Gemma: KvPoolOptions::window > 0 and swa_layers)
// keep their K/V in a second plane of n_window_blocks blocks, apart from the
// other ("full") layers' plane of n_blocks. A table maps position p of a
// sliding layer to window_blocks()[p / block_tokens], and holds only the
// blocks a sliding layer can still read: slide(table, p, m), called before
// a pass appends positions [p, p + m), first gives back the blocks wholly
// below max(0, p - window - block_tokens + 1) (one block more than the
// window, so that a fork on a device pool, which recomputes from the start
// of its last block, still finds its keys), leaving -1 in their place, then
// maps the blocks up to p + m. A block given back goes to the table's own
// spare list (held for it, counted in use) unless another table shares it;
// mapping takes spare blocks first. reserve(table, n) also makes the table
// hold (mapped + spare) min(blocks_for_tokens(n), ring_blocks()) window
// blocks, the most it ever maps at once for chunks of at most max_chunk
// positions: after reserve(table, n) succeeds, appending up to n positions
// in such chunks takes no window block from the pool. shrink(table, n)
// moves the window blocks past n to the spare list (n > 0) or gives every
// block back (n == 0); window_covers(table, n, 0) says whether the
// positions a continuation from n would read are still mapped (false after
// a slide past them: the sequence must be evaluated again).
// fork, share_prefix and make_tail_private treat the window plane as the
// full one (holes stay holes; a fork gets no spare blocks). blocks_in_use(),
// blocks_free() and the exhaustion errors are the full plane's;
// window_blocks_in_use() the window plane's. Without a window a pool is one
// plane, exactly as before.
// Device backends: the block allocator and BlockTable are device-agnostic. A
// pool made by create() keeps its K/V in host memory (on_host() is true). A pool
// made by create_on_device() keeps them in a KvDeviceStorage supplied by a
// device backend (e.g. VulkanBackend::create_kv_pool); on_host() is false and
// k()/v() return nullptr, so only that backend can read or write its contents;
// block ids, tables, counters and reserve/shrink behave exactly as for host
// pools (hybrid = one pool per stage, see SessionStage).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/kv_type.h"
#include "core/status.h"

namespace spw {

struct KvPoolOptions {
  int32_t layer_begin = 0;
  int32_t layer_end = 0;    // exclusive
  int32_t n_embd_kv = 0;    // floats of K (or V) per token per layer
  int32_t block_tokens = 16;
  int32_t n_blocks = 0;     // capacity
  KvType type = KvType::kF32;  // element type of the stored rows
  // The model's head_dim, checked for q8_0 (each head's slice of a row must
  // be whole blocks); 0 = n_embd_kv (one head).
  int32_t head_dim = 0;
  // Sliding-window layers (see the contract): window > 0 puts the layers of
  // swa_layers (absolute ids inside [layer_begin, layer_end)) in a plane of
  // n_window_blocks blocks; max_chunk is the most positions one pass
  // appends to a sequence (a session's n_ubatch), which sizes ring_blocks().
  int32_t window = 0;
  std::vector<int32_t> swa_layers;
  int32_t n_window_blocks = 0;
  int32_t max_chunk = 0;
};

// Whether absolute layer `layer` of a pool with options o keeps its K/V in
// the window plane; the blocks of that layer's storage. One rule for the
// pool and the device storage made for it.
inline bool kv_window_layer(const KvPoolOptions& o, int32_t layer) {
  if (o.window <= 0) return false;
  for (int32_t l : o.swa_layers)
    if (l == layer) return true;
  return false;
}
inline int32_t kv_layer_blocks(const KvPoolOptions& o, int32_t layer) {
  return kv_window_layer(o, layer) ? o.n_window_blocks : o.n_blocks;
}

// Window blocks a sequence maps at most (KvPool::slide): positions
// [p - window - block_tokens + 1, p + max_chunk) at the worst alignment.
// The pool's ring_blocks() and the estimator's.
inline int32_t kv_window_ring_blocks(int32_t window, int32_t block_tokens, int32_t max_chunk) {
  return (window + block_tokens - 1 + max_chunk + block_tokens - 1) / block_tokens + 1;
}
// Window blocks per sequence a pool of sequences of up to n_ctx positions
// gives its sliding layers: min(ring, the context's blocks), or 0 when that
// saves nothing (the window spans the context: one plane then). The
// server's pools (engine/device_session.cpp) and the estimator use it.
inline int32_t kv_window_blocks_per_seq(int32_t window, int32_t block_tokens, int32_t max_chunk, int32_t n_ctx) {
  if (window <= 0 || block_tokens <= 0) return 0;
  const int32_t ctx_blocks = (n_ctx + block_tokens - 1) / block_tokens;
  const int32_t ring = kv_window_ring_blocks(window, block_tokens, std::max(max_chunk, 1));
  return ring < ctx_blocks ? ring : 0;
}

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
  // The full plane's blocks; the window plane's (-1 where given back).
  const std::vector<int32_t>& blocks() const { return blocks_[0]; }
  const std::vector<int32_t>& window_blocks() const { return blocks_[1]; }
  const std::vector<int32_t>& blocks(int plane) const { return blocks_[plane]; }
  int32_t capacity_tokens(int32_t block_tokens) const {
    return static_cast<int32_t>(blocks_[0].size()) * block_tokens;
  }

 private:
  friend class KvPool;
  std::vector<int32_t> blocks_[2];
  std::vector<int32_t> spare_;  // window blocks held for this table, unmapped
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
  // The plane of layer `layer` (relative to layer_begin): 0 full, 1 window.
  int plane(int32_t layer) const { return plane_of_[static_cast<size_t>(layer)]; }
  // Blocks of a plane's storage (n_blocks, n_window_blocks).
  int32_t plane_blocks(int p) const { return planes_[p].n_blocks; }
  bool has_window() const { return opts_.window > 0 && planes_[1].n_layers > 0; }
  int32_t ring_blocks() const;
  int32_t n_embd_kv() const { return opts_.n_embd_kv; }
  KvType type() const { return opts_.type; }
  // Bytes of one stored K (or V) row: kv_row_bytes(type, n_embd_kv).
  size_t row_bytes() const { return row_bytes_; }

  size_t bytes_per_token() const;  // K+V of the full plane's layers (all layers without a window)
  size_t bytes_per_block() const { return bytes_per_token() * static_cast<size_t>(opts_.block_tokens); }
  size_t window_bytes_per_block() const;  // K+V of the window plane's layers, one block
  size_t storage_bytes() const;           // both planes' K/V
  int32_t n_blocks() const { return opts_.n_blocks; }
  int32_t blocks_in_use() const;
  int32_t blocks_free() const;
  int32_t window_blocks_in_use() const;
  // Blocks needed to hold n_tokens positions.
  int32_t blocks_for_tokens(int32_t n_tokens) const {
    return (n_tokens + opts_.block_tokens - 1) / opts_.block_tokens;
  }

  // Makes `table` hold at least n_tokens positions (see contract).
  Status reserve(BlockTable& table, int32_t n_tokens);
  // Frees blocks beyond those needed for n_tokens positions.
  void shrink(BlockTable& table, int32_t n_tokens);
  void release(BlockTable& table) { shrink(table, 0); }
  // Sharing (see contract).
  Status fork(const BlockTable& src, BlockTable& dst, int32_t n_tokens);
  Status share_prefix(const BlockTable& src, BlockTable& dst, int32_t n_tokens);
  Status make_tail_private(BlockTable& table, int32_t n_tokens);
  // The window plane (see contract); no-ops / true without a window.
  Status slide(BlockTable& table, int32_t pos, int32_t n_tokens);
  // Whether the window blocks a pass appending [pos, pos + n_tokens) reads
  // (from max(0, pos - window - block_tokens + 1), slide's bound) are mapped.
  bool window_covers(const BlockTable& table, int32_t pos, int32_t n_tokens) const;
  // References to block b (0: free).
  int32_t refs(int32_t block) const;

  // Layer index `layer` is relative to layer_begin, `block` a block of that
  // layer's plane. Host pools only (nullptr for a device pool). The stored
  // rows of block b, layer l: K then V, each block_tokens rows of
  // row_bytes().
  uint8_t* k_bytes(int32_t block, int32_t layer) { return base(block, layer); }
  uint8_t* v_bytes(int32_t block, int32_t layer) {
    uint8_t* b = base(block, layer);
    return b ? b + block_layer_bytes() : nullptr;
  }
  const uint8_t* k_bytes(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->k_bytes(block, layer); }
  const uint8_t* v_bytes(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->v_bytes(block, layer); }
  // F32 pools only (nullptr for other types and device pools): the rows as
  // floats, K at k(b, l) + s * n_embd_kv.
  float* k(int32_t block, int32_t layer) { return as_f32(k_bytes(block, layer)); }
  float* v(int32_t block, int32_t layer) { return as_f32(v_bytes(block, layer)); }
  const float* k(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->k(block, layer); }
  const float* v(int32_t block, int32_t layer) const { return const_cast<KvPool*>(this)->v(block, layer); }

  // Host pools: stores one token's K and V rows (n_embd_kv floats each) in
  // slot `slot` of block `block`, layer `layer`, converted to the pool's type.
  void store_rows(int32_t block, int32_t layer, int32_t slot, const float* k_row, const float* v_row);
  // Host pools: the F32 values of n consecutive slots [slot0, slot0 + n) of
  // one block and layer, K (v = false) or V (v = true), into out (n *
  // n_embd_kv floats, row after row).
  void rows_to_f32(bool v, int32_t block, int32_t layer, int32_t slot0, int32_t n, float* out) const;

 private:
  explicit KvPool(const KvPoolOptions& o);
  size_t block_layer_bytes() const { return static_cast<size_t>(opts_.block_tokens) * row_bytes_; }
  uint8_t* base(int32_t block, int32_t layer) {
    if (!data_) return nullptr;
    const Plane& pl = planes_[plane_of_[static_cast<size_t>(layer)]];
    return data_.get() + pl.offset +
           (static_cast<size_t>(block) * static_cast<size_t>(pl.n_layers) +
            static_cast<size_t>(slot_of_[static_cast<size_t>(layer)])) * 2 * block_layer_bytes();
  }
  float* as_f32(uint8_t* p) const {
    return p != nullptr && opts_.type == KvType::kF32 ? reinterpret_cast<float*>(p) : nullptr;
  }

  // A plane's allocator and where its blocks' bytes start in data_.
  struct Plane {
    int32_t n_blocks = 0;
    int32_t n_layers = 0;
    size_t offset = 0;
    std::vector<int32_t> free;  // stack of free block ids
    std::vector<int32_t> refs;  // per block: tables holding it (0: free)
  };
  KvPoolOptions opts_;
  size_t row_bytes_ = 0;
  std::vector<int> plane_of_;     // per layer (relative)
  std::vector<int32_t> slot_of_;  // per layer: its index among its plane's layers
  Plane planes_[2];
  // The rows, as one array (the estimator counts it as one allocation); an
  // unsigned char array provides storage for the floats of an F32 pool
  // (operator new[] aligns it for any fundamental type).
  std::unique_ptr<uint8_t[]> data_;
  std::unique_ptr<KvDeviceStorage> device_storage_;
  mutable std::mutex mu_;
  // Copies block `from`'s bytes (every layer of the plane, K and V) into `to`. Host pools.
  void copy_block(int plane, int32_t from, int32_t to);
  // One reference less; the block is free at 0. mu_ held.
  void unref_locked(int plane, int32_t block);
  // Sets up planes_, plane_of_, slot_of_ from opts_ (after check_options).
  void init_planes();
  // The window plane's part of reserve / shrink; mu_ held.
  Status reserve_window_locked(BlockTable& table, int32_t n_tokens);
  void shrink_window_locked(BlockTable& table, int32_t n_tokens);
};

// n stored K/V elements of type t at src (kv_row_bytes(t, n) bytes; for q8_0
// n a multiple of 32 starting on a block) as F32: exact, every stored value
// is a float. The read path of KvPool::rows_to_f32 and of a backend that
// reads a pool's bytes itself (the CPU attention's Q8_0 head slices).
void kv_values_to_f32(KvType t, const uint8_t* src, float* out, size_t n);

// What a backend's forward pass reads and writes: one sequence in one pool.
struct KvSequence {
  KvPool* pool = nullptr;
  const BlockTable* table = nullptr;
};

}  // namespace spw
