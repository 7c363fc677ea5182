#include "core/kv_type.h"

#include <string>

namespace spw {

std::string_view kv_type_name(KvType t) {
  switch (t) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kQ8_0: return "q8_0";
  }
  return "?";
}

Result<KvType> parse_kv_type(std::string_view s) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (KvType t : kAllKvTypes)
    if (lower == kv_type_name(t)) return t;
  return Status::invalid_argument("unknown KV type '" + std::string(s) + "': expected f32, f16 or q8_0");
}

uint64_t kv_row_bytes(KvType t, uint64_t n) {
  switch (t) {
    case KvType::kF32: return 4 * n;
    case KvType::kF16: return 2 * n;
    case KvType::kQ8_0: return n / 32 * 34;
  }
  return 0;
}

Status check_kv_type(KvType t, int64_t n_embd_kv, int64_t head_dim) {
  if (t != KvType::kQ8_0) return Status();
  if (n_embd_kv % 32 != 0)
    return Status::invalid_argument("KV type q8_0 needs n_embd_kv to be a multiple of 32, got " +
                                    std::to_string(n_embd_kv));
  if (head_dim % 32 != 0)
    return Status::invalid_argument("KV type q8_0 needs head_dim to be a multiple of 32, got " +
                                    std::to_string(head_dim));
  return Status();
}

Status check_device_kv_type(KvType t, int64_t n_embd_kv, int64_t head_dim) {
  if (t == KvType::kQ8_0) return Status::unimplemented("KV type q8_0 is not supported by the Vulkan backend (use f16 or f32)");
  if (t == KvType::kF16 && (n_embd_kv % 2 != 0 || head_dim % 2 != 0))
    return Status::invalid_argument("KV type f16 on the Vulkan backend needs an even n_embd_kv and head_dim, got " +
                                    std::to_string(n_embd_kv) + " and " + std::to_string(head_dim));
  return Status();
}

}  // namespace spw
