// Rng: portable, seedable PRNG whose whole state can be saved and restored
// (the sampler's, and SimEnv's random_u64).
//
// Contract: xoshiro256** (Blackman & Vigna) with its 256-bit state filled from
// the seed by splitmix64, as the xoshiro authors recommend. The sequence for a
// seed is identical on every platform and compiler (pure 64-bit integer
// arithmetic), which is what makes a generation checkpoint resumable on another
// machine. next_double() takes the top 53 bits, so it is uniform in [0, 1) and
// never returns 1.0. set_state() with an all-zero state would make the generator
// emit zeros forever; it is accepted (the caller restores what state() gave, and
// state() is never all zero) but documented here as the one bad input.
// Thread safety: none; one Rng per sampler, used by one thread at a time.
#pragma once

#include <array>

#include "core/hash.h"
#include <cstdint>

namespace spw {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& word : s_) word = splitmix64(x);
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits (the double mantissa width).
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

  // One splitmix64 step (core/hash.h): advances `x` and returns the mixed output.
  static uint64_t splitmix64(uint64_t& x) { return ::spw::splitmix64(x); }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  std::array<uint64_t, 4> s_{};
};

}  // namespace spw
