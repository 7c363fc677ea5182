// Portable non-cryptographic hashing and seed mixing.
//
// Fnv1a64: 64-bit FNV-1a over bytes, with helpers that fix the byte order of
// integers (little-endian) and length-prefix strings, so a hash depends only on
// the values fed in, never on the platform or on std::hash. Used for model and
// tokenizer fingerprints and checkpoint checksums, which must be equal on every
// machine that serves the same model.
// splitmix64: one step of Steele et al.'s SplitMix64, the generator the
// xoshiro authors recommend for expanding a seed.
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace spw {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffset = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;

  Fnv1a64& bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= kPrime;
    }
    return *this;
  }
  Fnv1a64& u8(uint8_t x) { return bytes(&x, 1); }
  Fnv1a64& u32(uint32_t x) { return le(x, 4); }
  Fnv1a64& u64(uint64_t x) { return le(x, 8); }
  // Length (u64) then bytes, so ("ab","c") and ("a","bc") differ.
  Fnv1a64& str(std::string_view s) {
    u64(s.size());
    return bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  Fnv1a64& le(uint64_t x, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(x >> (8 * i));
    return bytes(b, static_cast<size_t>(n));
  }
  uint64_t h_ = kOffset;
};

// FNV-1a of the raw bytes of `s` (no length prefix).
inline uint64_t fnv1a64(std::string_view s) { return Fnv1a64().bytes(s.data(), s.size()).value(); }

// Advances `state` and returns the next SplitMix64 output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace spw
