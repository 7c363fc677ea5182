#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cpu_features.h"
#include "gguf/fp16.h"
#include "gguf/quant.h"

namespace spw {

namespace {
Status check_options(const KvPoolOptions& o) {
  auto bad = [](const std::string& what, int64_t v) {
    return Status::invalid_argument("KvPool: " + what + " = " + std::to_string(v) + " is invalid");
  };
  if (o.layer_begin < 0) return bad("layer_begin", o.layer_begin);
  if (o.layer_end <= o.layer_begin) return bad("layer_end", o.layer_end);
  if (o.n_embd_kv <= 0) return bad("n_embd_kv", o.n_embd_kv);
  if (o.block_tokens <= 0) return bad("block_tokens", o.block_tokens);
  if (o.n_blocks <= 0) return bad("n_blocks", o.n_blocks);
  if (o.head_dim < 0 || (o.head_dim > 0 && o.n_embd_kv % o.head_dim != 0)) return bad("head_dim", o.head_dim);
  if (o.type != KvType::kF32 && o.type != KvType::kF16 && o.type != KvType::kQ8_0)
    return bad("type", static_cast<int64_t>(o.type));
  if (o.window < 0) return bad("window", o.window);
  if (o.window > 0) {
    bool any = false;
    for (size_t i = 0; i < o.swa_layers.size(); ++i) {
      const int32_t l = o.swa_layers[i];
      if (i > 0 && l <= o.swa_layers[i - 1]) return bad("swa_layers (not increasing) at", l);
      any = any || (l >= o.layer_begin && l < o.layer_end);
    }
    if (any && o.n_window_blocks <= 0) return bad("n_window_blocks", o.n_window_blocks);
    if (any && o.max_chunk <= 0) return bad("max_chunk", o.max_chunk);
  }
  return check_kv_type(o.type, o.n_embd_kv, o.head_dim > 0 ? o.head_dim : o.n_embd_kv);
}

Status exhausted(const char* plane, int32_t need, int32_t bt, size_t free, int32_t total) {
  return Status(StatusCode::kResourceExhausted,
                std::string("KV pool exhausted: need ") + std::to_string(need) + " more " + plane + "blocks of " +
                    std::to_string(bt) + " tokens, " + std::to_string(free) + " of " + std::to_string(total) + " free",
                FailureReason::kKvExhausted);
}

int32_t mapped(const std::vector<int32_t>& blocks) {
  return static_cast<int32_t>(std::count_if(blocks.begin(), blocks.end(), [](int32_t b) { return b >= 0; }));
}
}  // namespace

KvPool::KvPool(const KvPoolOptions& o)
    : opts_(o), row_bytes_(static_cast<size_t>(kv_row_bytes(o.type, static_cast<uint64_t>(o.n_embd_kv)))) {}

void KvPool::init_planes() {
  plane_of_.assign(static_cast<size_t>(n_layers()), 0);
  slot_of_.assign(static_cast<size_t>(n_layers()), 0);
  for (int32_t l = opts_.layer_begin; l < opts_.layer_end; ++l)
    plane_of_[static_cast<size_t>(l - opts_.layer_begin)] = kv_window_layer(opts_, l) ? 1 : 0;
  for (size_t i = 0; i < plane_of_.size(); ++i) slot_of_[i] = planes_[plane_of_[i]].n_layers++;
  planes_[0].n_blocks = opts_.n_blocks;
  planes_[1].n_blocks = planes_[1].n_layers > 0 ? opts_.n_window_blocks : 0;
  planes_[1].offset = static_cast<size_t>(planes_[0].n_blocks) * static_cast<size_t>(planes_[0].n_layers) * 2 *
                      block_layer_bytes();
  for (Plane& pl : planes_) {
    pl.refs.assign(static_cast<size_t>(pl.n_blocks), 0);
    pl.free.reserve(static_cast<size_t>(pl.n_blocks));
    // Stack: lowest ids handed out first.
    for (int32_t b = pl.n_blocks - 1; b >= 0; --b) pl.free.push_back(b);
  }
}

int32_t KvPool::ring_blocks() const {
  return kv_window_ring_blocks(opts_.window, opts_.block_tokens, opts_.max_chunk);
}

Result<std::shared_ptr<KvPool>> KvPool::create_on_device(const KvPoolOptions& o,
                                                         std::unique_ptr<KvDeviceStorage> storage) {
  SPW_RETURN_IF_ERROR(check_options(o));
  if (!storage) return Status::invalid_argument("KvPool: null device storage");
  std::shared_ptr<KvPool> p(new KvPool(o));
  p->device_storage_ = std::move(storage);
  p->init_planes();
  return p;
}

Result<std::shared_ptr<KvPool>> KvPool::create(const KvPoolOptions& o) {
  SPW_RETURN_IF_ERROR(check_options(o));
  std::shared_ptr<KvPool> p(new KvPool(o));
  p->init_planes();
  const size_t bytes = p->storage_bytes();
  p->data_.reset(new (std::nothrow) uint8_t[bytes]);
  if (!p->data_) return Status::resource_exhausted("KvPool: cannot allocate " + std::to_string(bytes) + " bytes");
  // Commit the pages now: an untouched allocation is only address space, and
  // the kernel would find (or fail to find) the memory mid-generation, where
  // the answer is the OOM killer rather than a status. Touching it here makes
  // the pool's bytes real at plan time, as the estimator and the host ledger
  // count them.
  // (All-zero bytes are +0.0 in every type: a zero half, a Q8_0 block of
  // scale 0.)
  std::memset(p->data_.get(), 0, bytes);
  return p;
}

size_t KvPool::bytes_per_token() const { return 2 * static_cast<size_t>(planes_[0].n_layers) * row_bytes_; }
size_t KvPool::window_bytes_per_block() const {
  return 2 * static_cast<size_t>(planes_[1].n_layers) * block_layer_bytes();
}
size_t KvPool::storage_bytes() const {
  return static_cast<size_t>(planes_[0].n_blocks) * bytes_per_block() +
         static_cast<size_t>(planes_[1].n_blocks) * window_bytes_per_block();
}

namespace {
// F16 rows: F16C where the CPU has it (the portable conversion branches per
// element; the attention reads F16 rows in place through the CPU kernels,
// this converts rows appended and copied). Both are exact to F32 and round
// to nearest even from F32 (gguf/fp16.h), so the stored and read bits do not
// depend on the CPU (kv_cache_test checks them). The binary's baseline has
// no F16C: the loops below raise their own target and run where CPUID and
// the OS's AVX state say they can.
#if defined(__x86_64__) && defined(__GNUC__)
#define SPW_KV_F16C 1
// F16C and AVX, with the OS saving the YMM registers (core/cpu_features.h).
bool cpu_has_f16c() {
  const CpuFeatures& f = host_cpu_features();
  return f.f16c && f.avx && f.os_avx;
}
__attribute__((target("avx,f16c"))) size_t f16_from_f32_f16c(const float* x, uint8_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  return i;
}
__attribute__((target("avx,f16c"))) size_t f16_to_f32_f16c(const uint8_t* src, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
  return i;
}
#endif

void f16_from_f32(const float* x, uint8_t* dst, size_t n) {
  size_t i = 0;
#if defined(SPW_KV_F16C)
  if (cpu_has_f16c()) i = f16_from_f32_f16c(x, dst, n);
#endif
  gguf::quantize_row_f16(x + i, dst + 2 * i, n - i);
}
void f16_to_f32(const uint8_t* src, float* y, size_t n) {
  size_t i = 0;
#if defined(SPW_KV_F16C)
  if (cpu_has_f16c()) i = f16_to_f32_f16c(src, y, n);
#endif
  gguf::dequantize_row_f16(src + 2 * i, y + i, n - i);
}

void store_row(KvType t, const float* x, uint8_t* dst, size_t n) {
  switch (t) {
    case KvType::kF32: std::memcpy(dst, x, n * sizeof(float)); return;
    case KvType::kF16: f16_from_f32(x, dst, n); return;
    case KvType::kQ8_0: gguf::quantize_row_q8_0(x, dst, n); return;
  }
}
}  // namespace

void kv_values_to_f32(KvType t, const uint8_t* src, float* y, size_t n) {
  switch (t) {
    case KvType::kF32: std::memcpy(y, src, n * sizeof(float)); return;
    case KvType::kF16: f16_to_f32(src, y, n); return;
    case KvType::kQ8_0: gguf::dequantize_row_q8_0(src, y, n); return;
  }
}

void KvPool::store_rows(int32_t block, int32_t layer, int32_t slot, const float* k_row, const float* v_row) {
  const size_t n = static_cast<size_t>(opts_.n_embd_kv);
  const size_t off = static_cast<size_t>(slot) * row_bytes_;
  store_row(opts_.type, k_row, k_bytes(block, layer) + off, n);
  store_row(opts_.type, v_row, v_bytes(block, layer) + off, n);
}

void KvPool::rows_to_f32(bool v, int32_t block, int32_t layer, int32_t slot0, int32_t n, float* out) const {
  const uint8_t* src = (v ? v_bytes(block, layer) : k_bytes(block, layer)) + static_cast<size_t>(slot0) * row_bytes_;
  // Consecutive slots are consecutive rows, and every type's rows are whole
  // blocks (q8_0: n_embd_kv % 32 == 0), so n rows convert as one.
  kv_values_to_f32(opts_.type, src, out, static_cast<size_t>(n) * static_cast<size_t>(opts_.n_embd_kv));
}

int32_t KvPool::blocks_in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return planes_[0].n_blocks - static_cast<int32_t>(planes_[0].free.size());
}

int32_t KvPool::blocks_free() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int32_t>(planes_[0].free.size());
}

int32_t KvPool::window_blocks_in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return planes_[1].n_blocks - static_cast<int32_t>(planes_[1].free.size());
}

Status KvPool::reserve(BlockTable& table, int32_t n_tokens) {
  std::vector<int32_t>& blocks = table.blocks_[0];
  Plane& pl = planes_[0];
  const int32_t need = blocks_for_tokens(n_tokens) - static_cast<int32_t>(blocks.size());
  std::lock_guard<std::mutex> lk(mu_);
  if (need > 0 && static_cast<int32_t>(pl.free.size()) < need)
    return exhausted("", need, opts_.block_tokens, pl.free.size(), pl.n_blocks);
  SPW_RETURN_IF_ERROR(reserve_window_locked(table, n_tokens));  // first: it may fail, the full plane not
  for (int32_t i = 0; i < need; ++i) {
    blocks.push_back(pl.free.back());
    pl.refs[static_cast<size_t>(pl.free.back())] = 1;
    pl.free.pop_back();
  }
  return Status();
}

Status KvPool::reserve_window_locked(BlockTable& table, int32_t n_tokens) {
  if (!has_window()) return Status();
  Plane& pl = planes_[1];
  const int32_t want = std::min(blocks_for_tokens(n_tokens), ring_blocks());
  const int32_t need = want - mapped(table.blocks_[1]) - static_cast<int32_t>(table.spare_.size());
  if (need <= 0) return Status();
  if (static_cast<int32_t>(pl.free.size()) < need)
    return exhausted("window ", need, opts_.block_tokens, pl.free.size(), pl.n_blocks);
  for (int32_t i = 0; i < need; ++i) {
    table.spare_.push_back(pl.free.back());
    pl.refs[static_cast<size_t>(pl.free.back())] = 1;
    pl.free.pop_back();
  }
  return Status();
}

Status KvPool::slide(BlockTable& table, int32_t pos, int32_t n_tokens) {
  if (!has_window()) return Status();
  const int32_t bt = opts_.block_tokens;
  std::vector<int32_t>& blocks = table.blocks_[1];
  Plane& pl = planes_[1];
  std::lock_guard<std::mutex> lk(mu_);
  // Give back what no row at pos or later reads (a shared block's
  // reference only: the sharer still reads it).
  const int32_t first_kept = std::max(0, pos - opts_.window - bt + 1) / bt;
  for (int32_t b = 0; b < std::min(first_kept, static_cast<int32_t>(blocks.size())); ++b) {
    int32_t& id = blocks[static_cast<size_t>(b)];
    if (id < 0) continue;
    if (pl.refs[static_cast<size_t>(id)] == 1) {
      table.spare_.push_back(id);
    } else {
      unref_locked(1, id);
    }
    id = -1;
  }
  const int32_t end = blocks_for_tokens(pos + n_tokens);
  if (static_cast<int32_t>(blocks.size()) < end) blocks.resize(static_cast<size_t>(end), -1);
  int32_t holes = 0;
  for (int32_t b = first_kept; b < end; ++b) holes += blocks[static_cast<size_t>(b)] < 0 ? 1 : 0;
  const auto avail = static_cast<int32_t>(table.spare_.size() + pl.free.size());
  if (holes > avail) return exhausted("window ", holes - avail, bt, pl.free.size(), pl.n_blocks);
  for (int32_t b = first_kept; b < end; ++b) {
    int32_t& id = blocks[static_cast<size_t>(b)];
    if (id >= 0) continue;
    if (!table.spare_.empty()) {
      id = table.spare_.back();
      table.spare_.pop_back();
    } else {
      id = pl.free.back();
      pl.free.pop_back();
      pl.refs[static_cast<size_t>(id)] = 1;
    }
  }
  return Status();
}

bool KvPool::window_covers(const BlockTable& table, int32_t pos, int32_t n_tokens) const {
  if (!has_window() || pos + n_tokens <= 0) return true;
  const std::vector<int32_t>& blocks = table.blocks_[1];
  const int32_t bt = opts_.block_tokens;
  const int32_t end = blocks_for_tokens(pos + n_tokens);
  if (static_cast<int32_t>(blocks.size()) < end) return false;
  for (int32_t b = std::max(0, pos - opts_.window - bt + 1) / bt; b < end; ++b)
    if (blocks[static_cast<size_t>(b)] < 0) return false;
  return true;
}

void KvPool::unref_locked(int plane, int32_t block) {
  Plane& pl = planes_[plane];
  if (--pl.refs[static_cast<size_t>(block)] == 0) pl.free.push_back(block);
}

int32_t KvPool::refs(int32_t block) const {
  std::lock_guard<std::mutex> lk(mu_);
  return block >= 0 && block < opts_.n_blocks ? planes_[0].refs[static_cast<size_t>(block)] : 0;
}

void KvPool::copy_block(int plane, int32_t from, int32_t to) {
  const Plane& pl = planes_[plane];
  const size_t per_block = static_cast<size_t>(pl.n_layers) * 2 * block_layer_bytes();
  std::memcpy(data_.get() + pl.offset + static_cast<size_t>(to) * per_block,
              data_.get() + pl.offset + static_cast<size_t>(from) * per_block, per_block);
}

namespace {
Status check_share(const BlockTable& dst, int32_t n_tokens, int32_t bt, const std::vector<int32_t>& src_blocks,
                   const char* what) {
  if (!dst.blocks().empty() || !dst.window_blocks().empty())
    return Status::invalid_argument(std::string("KvPool::") + what + ": the target table is not empty");
  if (n_tokens < 0 || n_tokens > static_cast<int32_t>(src_blocks.size()) * bt) {
    return Status::invalid_argument(std::string("KvPool::") + what + ": " + std::to_string(n_tokens) +
                                    " positions, the source holds " + std::to_string(src_blocks.size() * bt));
  }
  return Status();
}
}  // namespace

Status KvPool::share_prefix(const BlockTable& src, BlockTable& dst, int32_t n_tokens) {
  SPW_RETURN_IF_ERROR(check_share(dst, n_tokens, opts_.block_tokens, src.blocks_[0], "share_prefix"));
  const size_t full = static_cast<size_t>(n_tokens / opts_.block_tokens);
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; p < 2; ++p) {
    const std::vector<int32_t>& from = src.blocks_[p];
    dst.blocks_[p].assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(std::min(full, from.size())));
    for (int32_t b : dst.blocks_[p])
      if (b >= 0) ++planes_[p].refs[static_cast<size_t>(b)];
  }
  return Status();
}

Status KvPool::fork(const BlockTable& src, BlockTable& dst, int32_t n_tokens) {
  SPW_RETURN_IF_ERROR(check_share(dst, n_tokens, opts_.block_tokens, src.blocks_[0], "fork"));
  const bool partial = n_tokens % opts_.block_tokens != 0;
  if (partial && !on_host()) {
    return Status::failed_precondition("KvPool::fork: a device pool cannot copy a block's bytes (use share_prefix)");
  }
  const size_t full = static_cast<size_t>(n_tokens / opts_.block_tokens);
  const int n_planes = has_window() ? 2 : 1;
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; partial && p < n_planes; ++p) {
    if (planes_[p].free.empty())
      return exhausted(p == 0 ? "" : "window ", 1, opts_.block_tokens, 0, planes_[p].n_blocks);
  }
  for (int p = 0; p < n_planes; ++p) {
    const std::vector<int32_t>& from = src.blocks_[p];
    std::vector<int32_t>& to = dst.blocks_[p];
    to.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(std::min(full, from.size())));
    for (int32_t b : to)
      if (b >= 0) ++planes_[p].refs[static_cast<size_t>(b)];
    if (partial && full < from.size() && from[full] >= 0) {
      Plane& pl = planes_[p];
      const int32_t copy = pl.free.back();
      pl.free.pop_back();
      pl.refs[static_cast<size_t>(copy)] = 1;
      // The source's block is not written meanwhile: its owner is the caller.
      copy_block(p, from[full], copy);
      to.resize(full, -1);
      to.push_back(copy);
    }
  }
  return Status();
}

Status KvPool::make_tail_private(BlockTable& table, int32_t n_tokens) {
  if (n_tokens % opts_.block_tokens == 0) return Status();  // the next write opens a new block
  const size_t i = static_cast<size_t>(n_tokens / opts_.block_tokens);
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; p < 2; ++p) {
    std::vector<int32_t>& blocks = table.blocks_[p];
    if (i >= blocks.size() || blocks[i] < 0) continue;
    Plane& pl = planes_[p];
    const int32_t b = blocks[i];
    if (pl.refs[static_cast<size_t>(b)] <= 1) continue;
    if (!on_host()) {
      return Status::failed_precondition("KvPool: block " + std::to_string(b) +
                                         " is shared and a device pool cannot copy it");
    }
    if (pl.free.empty()) {
      return Status(StatusCode::kResourceExhausted,
                    "KV pool exhausted: a shared block needs a private copy, 0 of " + std::to_string(pl.n_blocks) +
                        " free",
                    FailureReason::kKvExhausted);
    }
    const int32_t copy = pl.free.back();
    pl.free.pop_back();
    pl.refs[static_cast<size_t>(copy)] = 1;
    copy_block(p, b, copy);
    blocks[i] = copy;
    unref_locked(p, b);
  }
  return Status();
}

void KvPool::shrink(BlockTable& table, int32_t n_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for_tokens(n_tokens < 0 ? 0 : n_tokens));
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int32_t>& blocks = table.blocks_[0];
  while (blocks.size() > keep) {
    unref_locked(0, blocks.back());
    blocks.pop_back();
  }
  shrink_window_locked(table, n_tokens);
}

void KvPool::shrink_window_locked(BlockTable& table, int32_t n_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for_tokens(n_tokens < 0 ? 0 : n_tokens));
  std::vector<int32_t>& blocks = table.blocks_[1];
  while (blocks.size() > keep) {
    const int32_t id = blocks.back();
    blocks.pop_back();
    if (id < 0) continue;
    // Held for the table while it lives (its reservation), unless shared.
    if (n_tokens > 0 && planes_[1].refs[static_cast<size_t>(id)] == 1) {
      table.spare_.push_back(id);
    } else {
      unref_locked(1, id);
    }
  }
  if (n_tokens <= 0) {
    for (int32_t id : table.spare_) unref_locked(1, id);
    table.spare_.clear();
  }
}

}  // namespace spw
