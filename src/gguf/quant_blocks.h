// Block layouts of ggml's quantised weight types (and of the activation
// formats the CPU dot products pair them with), byte for byte as GGUF stores
// them: little-endian, no padding, fp16 fields as raw IEEE half bits.
//
// Notation: a block of `QK` elements x[0..QK) is stored as integer codes plus
// one or two scales; "d" is a scale, "m"/"dmin" an offset, fp16 unless noted.
// A code's element index is given for every layout because the nibble order is
// not the obvious one (ggml packs element j and element j + QK/2 into one byte).
//
// 32-element blocks (legacy types):
//   Q4_0 (18 B): d; qs[16]. x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8), j < 16.
//   Q4_1 (20 B): d, m; qs[16]. x[j] = d * (qs[j] & 15) + m, x[j+16] = d * (qs[j] >> 4) + m.
//   Q5_0 (22 B): d; qh (32 bits, little-endian); qs[16]. The 5th bit of code i is
//                bit i of qh; x[j] = d * (((qs[j] & 15) | bit j << 4) - 16),
//                x[j+16] = d * (((qs[j] >> 4) | bit (j+16) << 4) - 16).
//   Q5_1 (24 B): d, m; qh; qs[16]. As Q5_0 without the -16, plus m.
//   Q8_1 (36 B, activations of Q4_1/Q5_1): d, s = fp16(d * sum(qs)) with the
//                float d; qs[32] int8. x[j] = d * qs[j].
// 256-element super-blocks (K types; QK_K = 256):
//   Q4_K (144 B): d, dmin; scales[12]; qs[128]. Eight sub-blocks of 32, each
//                with a 6-bit scale sc and a 6-bit min m (unpack_scale_min_k4):
//                x = d * sc * q - dmin * m. Codes: for chunk c < 4 (64 elements),
//                qs[32c + l] holds sub-block 2c element l in its low nibble and
//                sub-block 2c+1 element l in its high nibble.
//   Q5_K (176 B): d, dmin; scales[12]; qh[32]; qs[128]. As Q4_K with a 5th bit:
//                element l of sub-block s has bit (qh[l] >> s) & 1 as bit 4.
//   Q6_K (210 B): ql[128]; qh[64]; scales[16] int8; d. Sixteen sub-blocks of
//                16, x = d * scales[i / 16] * (q - 32), q 6 bits. For half h < 2
//                (128 elements, ql + 64h, qh + 32h) and l < 32: element
//                128h + l + 32k has low nibble (ql[l + 32 (k & 1)] >> 4 (k >> 1)) & 15
//                and high bits (qh[l] >> 2k) & 3, for k < 4.
//   Q3_K (110 B) and Q2_K (84 B): known for their sizes; not computed.
//   Q8_K (292 B, activations of the K types): float d; qs[256] int8;
//                bsums[16] int16 = sums of qs in groups of 16. x = d * qs.
//
// The 12-byte `scales` of Q4_K/Q5_K packs eight 6-bit scales and eight 6-bit
// mins: for j < 4, sc_j = scales[j] & 63 and m_j = scales[j+4] & 63; for
// j >= 4, sc_j = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4 and
// m_j = (scales[j+4] >> 4) | (scales[j] >> 6) << 4.
//
// The structs are plain bytes (uint16_t fp16 fields are aligned at even
// offsets, and every size is a multiple of 2), so arrays of them are exactly
// the GGUF tensor data. Tensor data is 32-byte aligned in GGUF, so casting a
// row pointer to these types is well-defined on x86 (the only alignment the
// fields need is 2, or 4 for Q8_K which only lives in our own buffers).
#pragma once

#include <cstdint>
#include <cstring>

namespace spw::gguf {

inline constexpr int kQK = 32;    // legacy block size
inline constexpr int kQK_K = 256;  // K-quant super-block size

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// 6-bit scale and min of sub-block j < 8 of a Q4_K/Q5_K `scales` field.
inline void unpack_scale_min_k4(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// All eight at once, as unpack_scale_min_k4 gives them one by one, with
// word operations on the 12 bytes (s[0..3] hold scales 0-3 and the top bits
// of scales 4-7, s[4..7] mins 0-3 and the top bits of mins 4-7, s[8..11] the
// low nibbles of scales 4-7 and, above them, of mins 4-7): what a kernel
// does per super-block without a branch per sub-block. sc8 and m8 are the
// bytes sc[0..7] and m[0..7] in little-endian words (sc8[0] = scales 0-3).
inline void unpack_scales_mins_k4(const uint8_t* s, uint32_t sc8[2], uint32_t m8[2]) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  sc8[0] = w[0] & 0x3f3f3f3fu;
  m8[0] = w[1] & 0x3f3f3f3fu;
  sc8[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  m8[1] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
}

}  // namespace spw::gguf
