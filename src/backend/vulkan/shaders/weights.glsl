// Reading GGUF weight blocks out of a uint buffer `w` (declared by the includer
// as `readonly buffer W { uint w[]; }`), byte for byte as gguf/quant_blocks.h
// lays them out. WTYPE selects the type:
//   0 F32, 1 F16, 2 Q8_0, 3 Q4_0, 4 Q4_1, 5 Q5_0, 6 Q5_1, 7 Q4_K, 8 Q5_K, 9 Q6_K.
// Every block size and field offset is even, and rows start at multiples of
// the (even) row size, so 16-bit fields are read whole and 32-bit reads need at
// most two words.
#define WT_F32 0
#define WT_F16 1
#define WT_Q8_0 2
#define WT_Q4_0 3
#define WT_Q4_1 4
#define WT_Q5_0 5
#define WT_Q5_1 6
#define WT_Q4_K 7
#define WT_Q5_K 8
#define WT_Q6_K 9

// Bytes per block and elements per block of the quantised types.
#if WTYPE == WT_Q8_0
#define BLOCK_BYTES 34u
#elif WTYPE == WT_Q4_0
#define BLOCK_BYTES 18u
#elif WTYPE == WT_Q4_1
#define BLOCK_BYTES 20u
#elif WTYPE == WT_Q5_0
#define BLOCK_BYTES 22u
#elif WTYPE == WT_Q5_1
#define BLOCK_BYTES 24u
#elif WTYPE == WT_Q4_K
#define BLOCK_BYTES 144u
#elif WTYPE == WT_Q5_K
#define BLOCK_BYTES 176u
#elif WTYPE == WT_Q6_K
#define BLOCK_BYTES 210u
#endif
#if WTYPE >= WT_Q4_K
#define BLOCK_ELEMS 256u
#else
#define BLOCK_ELEMS 32u
#endif

uint w_u8(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xffu; }
uint w_u16(uint o) { return (w[o >> 2] >> ((o & 2u) * 8u)) & 0xffffu; }  // o even
uint w_u32(uint o) {                                                       // o even
  const uint i = o >> 2;
  return (o & 2u) == 0u ? w[i] : (w[i] >> 16) | (w[i + 1u] << 16);
}
float w_half(uint o) { return unpackHalf2x16(w_u16(o)).x; }

// The 4 bits of `bits` (bit i for byte i) as bit 4 of each byte of a word.
uint fifth_bits(uint bits) {
  return ((bits & 1u) | ((bits & 2u) << 7) | ((bits & 4u) << 14) | ((bits & 8u) << 21)) << 4;
}

#if WTYPE == WT_Q4_K || WTYPE == WT_Q5_K
// Scale and min of sub-block j < 8 from the 12-byte field at `o`
// (gguf::unpack_scale_min_k4).
ivec2 k4_scale_min(uint o, uint j) {
  if (j < 4u) return ivec2(int(w_u8(o + j) & 63u), int(w_u8(o + j + 4u) & 63u));
  const uint s = w_u8(o + j + 4u);
  return ivec2(int((s & 15u) | ((w_u8(o + j - 4u) >> 6) << 4)), int((s >> 4) | ((w_u8(o + j) >> 6) << 4)));
}
#endif

// Codes of elements 4i..4i+3 of 32-element unit u of the block at `o`, one
// unsigned byte each (the type's bias is subtracted by the caller: 8 for Q4_0,
// 16 for Q5_0, 32 for Q6_K). A unit is a legacy block (u = 0), a Q4_K/Q5_K
// sub-block, or Q6_K elements 32u..32u+31.
uint unit_codes(uint o, uint u, uint i) {
#if WTYPE == WT_Q4_0 || WTYPE == WT_Q4_1 || WTYPE == WT_Q5_0 || WTYPE == WT_Q5_1
  // Byte j holds element j (low nibble) and j + 16 (high nibble).
  const uint qs = WTYPE == WT_Q4_0 ? 2u : WTYPE == WT_Q4_1 ? 4u : WTYPE == WT_Q5_0 ? 6u : 8u;
  const uint hi = i >> 2, k = i & 3u;
  uint c = (w_u32(o + qs + 4u * k) >> (4u * hi)) & 0x0f0f0f0fu;
#if WTYPE == WT_Q5_0 || WTYPE == WT_Q5_1
  const uint qh = w_u32(o + (WTYPE == WT_Q5_0 ? 2u : 4u));
  c |= fifth_bits((qh >> (4u * i)) & 15u);
#endif
  return c;
#elif WTYPE == WT_Q4_K || WTYPE == WT_Q5_K
  // Sub-block u: chunk u/2's 32 bytes, low nibbles for even u, high for odd.
  const uint qs = WTYPE == WT_Q4_K ? 16u : 48u;
  uint c = (w_u32(o + qs + 32u * (u >> 1) + 4u * i) >> (4u * (u & 1u))) & 0x0f0f0f0fu;
#if WTYPE == WT_Q5_K
  c |= ((w_u32(o + 16u + 4u * i) >> u) & 0x01010101u) << 4;
#endif
  return c;
#elif WTYPE == WT_Q6_K
  const uint h = u >> 2, k = u & 3u;
  const uint lo = (w_u32(o + 64u * h + 32u * (k & 1u) + 4u * i) >> (4u * (k >> 1))) & 0x0f0f0f0fu;
  const uint hb = (w_u32(o + 128u + 32u * h + 4u * i) >> (2u * k)) & 0x03030303u;
  return lo | (hb << 4);
#else
  return 0u;
#endif
}

// Element c of the row at byte `rb`, dequantised as gguf/quant.h's reference
// dequantisers compute it (each product rounded once: `precise`).
float dequant(uint rb, uint c) {
#if WTYPE == WT_F32
  return uintBitsToFloat(w[(rb >> 2) + c]);
#elif WTYPE == WT_F16
  return w_half(rb + 2u * c);
#elif WTYPE == WT_Q8_0
  const uint o = rb + (c / 32u) * 34u;
  const int q = bitfieldExtract(int(w_u8(o + 2u + c % 32u)), 0, 8);
  precise const float v = w_half(o) * float(q);
  return v;
#else
  const uint o = rb + (c / BLOCK_ELEMS) * BLOCK_BYTES;
  const uint e = c % BLOCK_ELEMS;
#if WTYPE <= WT_Q5_1
  // unit_codes' word i holds elements 4i..4i+3.
  const int q = int((unit_codes(o, 0u, e >> 2) >> (8u * (e & 3u))) & 0xffu);
#if WTYPE == WT_Q4_0
  precise const float v = float(q - 8) * w_half(o);
#elif WTYPE == WT_Q5_0
  precise const float v = float(q - 16) * w_half(o);
#else
  precise const float v = float(q) * w_half(o) + w_half(o + 2u);
#endif
  return v;
#elif WTYPE == WT_Q4_K || WTYPE == WT_Q5_K
  const uint u = e / 32u, l = e % 32u;
  const int q = int((unit_codes(o, u, l >> 2) >> (8u * (l & 3u))) & 0xffu);
  const ivec2 sm = k4_scale_min(o + 4u, u);
  precise const float dl = w_half(o) * float(sm.x);
  precise const float ml = w_half(o + 2u) * float(sm.y);
  precise const float v = dl * float(q) - ml;
  return v;
#else  // Q6_K
  const uint u = e / 32u, l = e % 32u;
  const int q = int((unit_codes(o, u, l >> 2) >> (8u * (l & 3u))) & 0xffu);
  const int sc = bitfieldExtract(int(w_u8(o + 192u + e / 16u)), 0, 8);
  precise const float v = w_half(o + 208u) * float(sc) * float(q - 32);
  return v;
#endif
#endif
}
