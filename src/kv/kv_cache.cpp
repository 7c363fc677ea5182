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
  return check_kv_type(o.type, o.n_embd_kv, o.head_dim > 0 ? o.head_dim : o.n_embd_kv);
}
}  // namespace

KvPool::KvPool(const KvPoolOptions& o)
    : opts_(o), row_bytes_(static_cast<size_t>(kv_row_bytes(o.type, static_cast<uint64_t>(o.n_embd_kv)))) {}

Result<std::shared_ptr<KvPool>> KvPool::create_on_device(const KvPoolOptions& o,
                                                         std::unique_ptr<KvDeviceStorage> storage) {
  SPW_RETURN_IF_ERROR(check_options(o));
  if (!storage) return Status::invalid_argument("KvPool: null device storage");
  std::shared_ptr<KvPool> p(new KvPool(o));
  p->device_storage_ = std::move(storage);
  p->refs_.assign(static_cast<size_t>(o.n_blocks), 0);
  p->free_.reserve(static_cast<size_t>(o.n_blocks));
  for (int32_t b = o.n_blocks - 1; b >= 0; --b) p->free_.push_back(b);
  return p;
}

Result<std::shared_ptr<KvPool>> KvPool::create(const KvPoolOptions& o) {
  SPW_RETURN_IF_ERROR(check_options(o));
  std::shared_ptr<KvPool> p(new KvPool(o));
  const size_t bytes = static_cast<size_t>(o.n_blocks) * static_cast<size_t>(o.layer_end - o.layer_begin) * 2 *
                       p->block_layer_bytes();
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
  p->refs_.assign(static_cast<size_t>(o.n_blocks), 0);
  p->free_.reserve(static_cast<size_t>(o.n_blocks));
  // Stack: lowest ids handed out first.
  for (int32_t b = o.n_blocks - 1; b >= 0; --b) p->free_.push_back(b);
  return p;
}

size_t KvPool::bytes_per_token() const { return 2 * static_cast<size_t>(n_layers()) * row_bytes_; }

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
  return opts_.n_blocks - static_cast<int32_t>(free_.size());
}

int32_t KvPool::blocks_free() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int32_t>(free_.size());
}

Status KvPool::reserve(BlockTable& table, int32_t n_tokens) {
  const int32_t need = blocks_for_tokens(n_tokens) - static_cast<int32_t>(table.blocks_.size());
  if (need <= 0) return Status();
  std::lock_guard<std::mutex> lk(mu_);
  if (static_cast<int32_t>(free_.size()) < need) {
    return Status(StatusCode::kResourceExhausted, "KV pool exhausted: need " + std::to_string(need) + " more blocks of " +
                                      std::to_string(opts_.block_tokens) + " tokens, " +
                                      std::to_string(free_.size()) + " of " + std::to_string(opts_.n_blocks) +
                                      " free", FailureReason::kKvExhausted);
  }
  table.blocks_.reserve(table.blocks_.size() + static_cast<size_t>(need));
  for (int32_t i = 0; i < need; ++i) {
    table.blocks_.push_back(free_.back());
    refs_[static_cast<size_t>(free_.back())] = 1;
    free_.pop_back();
  }
  return Status();
}

void KvPool::unref_locked(int32_t block) {
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

int32_t KvPool::refs(int32_t block) const {
  std::lock_guard<std::mutex> lk(mu_);
  return block >= 0 && block < opts_.n_blocks ? refs_[static_cast<size_t>(block)] : 0;
}

void KvPool::copy_block(int32_t from, int32_t to) {
  const size_t per_block = static_cast<size_t>(n_layers()) * 2 * block_layer_bytes();
  std::memcpy(base(to, 0), base(from, 0), per_block);
}

namespace {
Status check_share(const BlockTable& dst, int32_t n_tokens, int32_t bt, const std::vector<int32_t>& src_blocks,
                   const char* what) {
  if (!dst.blocks().empty()) return Status::invalid_argument(std::string("KvPool::") + what + ": the target table is not empty");
  if (n_tokens < 0 || n_tokens > static_cast<int32_t>(src_blocks.size()) * bt) {
    return Status::invalid_argument(std::string("KvPool::") + what + ": " + std::to_string(n_tokens) +
                                    " positions, the source holds " + std::to_string(src_blocks.size() * bt));
  }
  return Status();
}
}  // namespace

Status KvPool::share_prefix(const BlockTable& src, BlockTable& dst, int32_t n_tokens) {
  SPW_RETURN_IF_ERROR(check_share(dst, n_tokens, opts_.block_tokens, src.blocks_, "share_prefix"));
  const size_t full = static_cast<size_t>(n_tokens / opts_.block_tokens);
  std::lock_guard<std::mutex> lk(mu_);
  dst.blocks_.assign(src.blocks_.begin(), src.blocks_.begin() + static_cast<std::ptrdiff_t>(full));
  for (int32_t b : dst.blocks_) ++refs_[static_cast<size_t>(b)];
  return Status();
}

Status KvPool::fork(const BlockTable& src, BlockTable& dst, int32_t n_tokens) {
  SPW_RETURN_IF_ERROR(check_share(dst, n_tokens, opts_.block_tokens, src.blocks_, "fork"));
  const bool partial = n_tokens % opts_.block_tokens != 0;
  if (partial && !on_host()) {
    return Status::failed_precondition("KvPool::fork: a device pool cannot copy a block's bytes (use share_prefix)");
  }
  const size_t full = static_cast<size_t>(n_tokens / opts_.block_tokens);
  std::lock_guard<std::mutex> lk(mu_);
  if (partial && free_.empty()) {
    return Status(StatusCode::kResourceExhausted,
                  "KV pool exhausted: fork needs 1 more block of " + std::to_string(opts_.block_tokens) +
                      " tokens, 0 of " + std::to_string(opts_.n_blocks) + " free",
                  FailureReason::kKvExhausted);
  }
  dst.blocks_.assign(src.blocks_.begin(), src.blocks_.begin() + static_cast<std::ptrdiff_t>(full));
  for (int32_t b : dst.blocks_) ++refs_[static_cast<size_t>(b)];
  if (partial) {
    const int32_t copy = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(copy)] = 1;
    // The source's block is not written meanwhile: its owner is the caller.
    copy_block(src.blocks_[full], copy);
    dst.blocks_.push_back(copy);
  }
  return Status();
}

Status KvPool::make_tail_private(BlockTable& table, int32_t n_tokens) {
  if (n_tokens % opts_.block_tokens == 0) return Status();  // the next write opens a new block
  const size_t i = static_cast<size_t>(n_tokens / opts_.block_tokens);
  if (i >= table.blocks_.size()) return Status();
  std::lock_guard<std::mutex> lk(mu_);
  const int32_t b = table.blocks_[i];
  if (refs_[static_cast<size_t>(b)] <= 1) return Status();
  if (!on_host()) {
    return Status::failed_precondition("KvPool: block " + std::to_string(b) +
                                       " is shared and a device pool cannot copy it");
  }
  if (free_.empty()) {
    return Status(StatusCode::kResourceExhausted,
                  "KV pool exhausted: a shared block needs a private copy, 0 of " + std::to_string(opts_.n_blocks) +
                      " free",
                  FailureReason::kKvExhausted);
  }
  const int32_t copy = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(copy)] = 1;
  copy_block(b, copy);
  table.blocks_[i] = copy;
  unref_locked(b);
  return Status();
}

void KvPool::shrink(BlockTable& table, int32_t n_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for_tokens(n_tokens < 0 ? 0 : n_tokens));
  if (table.blocks_.size() <= keep) return;
  std::lock_guard<std::mutex> lk(mu_);
  while (table.blocks_.size() > keep) {
    unref_locked(table.blocks_.back());
    table.blocks_.pop_back();
  }
}

}  // namespace spw
