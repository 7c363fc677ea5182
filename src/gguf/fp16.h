// IEEE 754 binary16 <-> binary32 conversion, portable (no F16C needed).
//
// Contract:
// - fp16_to_fp32 is exact for every one of the 65536 bit patterns: zeros keep
//   their sign, subnormals become normal floats, inf stays inf, NaN stays NaN
//   (payload shifted into the top mantissa bits).
// - fp32_to_fp16 rounds to nearest, ties to even (what F16C's _cvtss_sh with
//   rounding mode 0 and ggml's GGML_FP32_TO_FP16 do): values whose magnitude
//   rounds past 65504 become inf; values below half the smallest subnormal
//   (2^-25) become signed zero; subnormal results are produced, not flushed.
//   NaN stays a (quiet) NaN, keeping the sign and the top payload bits.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace spw::gguf {

inline float fp16_to_fp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal: value = mant * 2^-24; normalise so the leading 1 is implicit.
      uint32_t e = 113;  // biased exponent of 2^-14
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    if (x == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (x < 0x38800000u) {  // below 2^-14: result is subnormal or zero
    if (x <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 ties to even zero
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t h = (x - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// Bulk forms over n elements (any n).
void fp16_to_fp32_row(const uint16_t* src, float* dst, size_t n);
void fp32_to_fp16_row(const float* src, uint16_t* dst, size_t n);

}  // namespace spw::gguf
