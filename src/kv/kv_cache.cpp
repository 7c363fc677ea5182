#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#if defined(__F16C__)
#include <immintrin.h>
#endif

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
  p->free_.reserve(static_cast<size_t>(o.n_blocks));
  // Stack: lowest ids handed out first.
  for (int32_t b = o.n_blocks - 1; b >= 0; --b) p->free_.push_back(b);
  return p;
}

size_t KvPool::bytes_per_token() const { return 2 * static_cast<size_t>(n_layers()) * row_bytes_; }

namespace {
// F16 rows: F16C where the build has it (the attention converts every
// position's rows at every step, and the portable conversion branches per
// element: 4x slower decode at 1024 positions on the 110M model). Both are
// exact to F32 and round to nearest even from F32 (gguf/fp16.h), so the
// stored and read bits do not depend on the build (kv_cache_test checks them).
void f16_from_f32(const float* x, uint8_t* dst, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
#endif
  gguf::quantize_row_f16(x + i, dst + 2 * i, n - i);
}
void f16_to_f32(const uint8_t* src, float* y, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i))));
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
    free_.pop_back();
  }
  return Status();
}

void KvPool::shrink(BlockTable& table, int32_t n_tokens) {
  const size_t keep = static_cast<size_t>(blocks_for_tokens(n_tokens < 0 ? 0 : n_tokens));
  if (table.blocks_.size() <= keep) return;
  std::lock_guard<std::mutex> lk(mu_);
  while (table.blocks_.size() > keep) {
    free_.push_back(table.blocks_.back());
    table.blocks_.pop_back();
  }
}

}  // namespace spw
