#include "admission/alloc_tracker.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

namespace spw::admission::testing {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// Each block carries its requested size in a header of `align` bytes (at
// least 16, keeping malloc's alignment); the size sits just before the
// user pointer, the header start just before that.
constexpr size_t kMinHeader = 16;

void note_alloc(size_t n) {
  const int64_t now = g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
  int64_t p = g_peak.load(std::memory_order_relaxed);
  while (now > p && !g_peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

void* alloc(size_t n, size_t align) {
  const size_t header = align > kMinHeader ? align : kMinHeader;
  void* raw = nullptr;
  if (align > kMinHeader) {
    raw = std::aligned_alloc(align, (n + header + align - 1) / align * align);
  } else {
    raw = std::malloc(n + header);
  }
  if (raw == nullptr) return nullptr;
  auto* user = static_cast<unsigned char*>(raw) + header;
  std::memcpy(user - sizeof(size_t), &n, sizeof(size_t));
  std::memcpy(user - 2 * sizeof(size_t), &header, sizeof(size_t));
  note_alloc(n);
  return user;
}

void dealloc(void* p) {
  if (p == nullptr) return;
  auto* user = static_cast<unsigned char*>(p);
  size_t n, header;
  std::memcpy(&n, user - sizeof(size_t), sizeof(size_t));
  std::memcpy(&header, user - 2 * sizeof(size_t), sizeof(size_t));
  g_live.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
  std::free(user - header);
}

void* alloc_or_throw(size_t n, size_t align) {
  void* p = alloc(n == 0 ? 1 : n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

int64_t live_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace spw::admission::testing

void* operator new(size_t n) { return spw::admission::testing::alloc_or_throw(n, 0); }
void* operator new[](size_t n) { return spw::admission::testing::alloc_or_throw(n, 0); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  return spw::admission::testing::alloc(n == 0 ? 1 : n, 0);
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  return spw::admission::testing::alloc(n == 0 ? 1 : n, 0);
}
void* operator new(size_t n, std::align_val_t a) {
  return spw::admission::testing::alloc_or_throw(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a) {
  return spw::admission::testing::alloc_or_throw(n, static_cast<size_t>(a));
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return spw::admission::testing::alloc(n == 0 ? 1 : n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return spw::admission::testing::alloc(n == 0 ? 1 : n, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { spw::admission::testing::dealloc(p); }
void operator delete[](void* p) noexcept { spw::admission::testing::dealloc(p); }
void operator delete(void* p, size_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete[](void* p, size_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { spw::admission::testing::dealloc(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { spw::admission::testing::dealloc(p); }
void operator delete(void* p, std::align_val_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete[](void* p, std::align_val_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { spw::admission::testing::dealloc(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  spw::admission::testing::dealloc(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  spw::admission::testing::dealloc(p);
}
