// Reference (de)quantisers of Q4_0, Q4_1, Q5_0, Q5_1, Q8_1, Q4_K, Q5_K, Q6_K
// and Q8_K (gguf/quant.h):
//  * quantisers: bit-identical to llama.cpp's quantize_row_<type>_ref for a
//    fixed 2048-float input (kExpected below);
//  * dequantisers: bit-exact against a plain element-by-element decoder
//    written here from the layout description in quant_blocks.h (in double,
//    then rounded once: every ggml dequantised value is one rounding of an
//    exact value, see quant.h);
//  * round trips: each element within the half-step bound of its type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/hash.h"
#include "gguf/fp16.h"
#include "gguf/ggml_types.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

namespace spw::gguf {
namespace {

// ---------------------------------------------------------------- fixed input

// The input the expected bytes were produced from: an LCG (Numerical Recipes
// constants) whose top 24 bits become exact floats. Superblocks: 0-3 uniform
// in [-1, 1) * 2^-b; 4 a sum of four uniforms (~N(0, 0.02^2)); 5 the same at
// half the scale with every 29th element x16 (outliers); 6 edge cases per
// 32-group: zeros, +0.5 constant, -0.25 constant, one spike, all positive,
// all negative, and two groups of ~1e-9 values (their scales round to fp16
// zero/subnormal); 7 all zeros.
constexpr int kN = 2048;

struct Lcg {
  uint32_t s = 12345u;
  uint32_t next() { return s = s * 1664525u + 1013904223u; }
  float uni() { return static_cast<float>(static_cast<int32_t>(next() >> 8) - (1 << 23)) * (1.0f / 8388608.0f); }
  float gau() {
    int32_t sum = 0;
    for (int i = 0; i < 4; ++i) sum += static_cast<int32_t>(next() >> 8) - (1 << 23);
    return static_cast<float>(sum) * (1.0f / 16777216.0f);
  }
};

std::vector<float> fixed_input() {
  std::vector<float> x(kN);
  Lcg r;
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 256; ++i) x[256 * b + i] = r.uni() * std::ldexp(1.0f, -b);
  for (int i = 0; i < 256; ++i) x[1024 + i] = r.gau() * 0.03125f;
  for (int i = 0; i < 256; ++i) {
    float v = r.gau() * 0.015625f;
    if (i % 29 == 3) v *= 16.0f;
    x[1280 + i] = v;
  }
  float* s = x.data() + 1536;
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  for (int i = 32; i < 64; ++i) s[i] = 0.5f;
  for (int i = 64; i < 96; ++i) s[i] = -0.25f;
  for (int i = 96; i < 128; ++i) s[i] = i == 101 ? -3.0f : 0.0f;
  for (int i = 128; i < 160; ++i) s[i] = std::fabs(r.uni());
  for (int i = 160; i < 192; ++i) s[i] = -std::fabs(r.uni());
  for (int i = 192; i < 256; ++i) s[i] = r.uni() * 1e-9f;
  for (int i = 1792; i < kN; ++i) x[i] = 0.0f;
  return x;
}

uint64_t fnv(const void* p, size_t n) { return Fnv1a64().bytes(p, n).value(); }

// Provenance: FNV-1a 64 of the bytes written by llama.cpp's
// quantize_row_<type>_ref (peer checkout at c392e5094, ggml/src/ggml-quants.c)
// for fixed_input(), from a throwaway C program compiled outside this
// repository with gcc 12 (-O2, baseline x86-64 like ggml-base; -O3
// -march=native gave the same bytes for this input). kInputFnv is the
// program's hash of the input floats, so a drift of fixed_input() is told
// apart from a quantiser difference.
constexpr uint64_t kInputFnv = 0x83f2babc6bd9ddf2ull;
struct Expected {
  const char* name;
  void (*quantize)(const float*, void*, size_t);
  size_t block_bytes;
  int block_elems;
  uint64_t fnv;
};
const Expected kExpected[] = {
    {"Q4_0", quantize_row_q4_0, 18, 32, 0xc08ff3672c78f654ull},
    {"Q4_1", quantize_row_q4_1, 20, 32, 0x51ef0cac44156f08ull},
    {"Q5_0", quantize_row_q5_0, 22, 32, 0x11a10fd69e30c5e4ull},
    {"Q5_1", quantize_row_q5_1, 24, 32, 0x49105364178ce7c9ull},
    {"Q8_1", quantize_row_q8_1, 36, 32, 0xe2a5718b1861a63eull},
    {"Q4_K", quantize_row_q4_K, 144, 256, 0xbbd08cbcd64a3fb2ull},
    {"Q5_K", quantize_row_q5_K, 176, 256, 0xbef36c7d14d04631ull},
    {"Q6_K", quantize_row_q6_K, 210, 256, 0x4f6a6eb5a09dd46cull},
    {"Q8_K", quantize_row_q8_K, 292, 256, 0x08c9d7c5fa1459b3ull},
};

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

// The word-wise unpacking of a K-quant's 12 scale bytes gives what the
// per-sub-block one gives, for every bit pattern tried.
TEST(QuantRef, ScalesAndMinsUnpackAllAtOnceAsOneByOne) {
  std::mt19937 g(17);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t s[12];
    for (uint8_t& v : s) v = static_cast<uint8_t>(trial < 256 ? (trial * 37 + (&v - s) * 101) & 255 : byte(g));
    uint32_t sc8[2], m8[2];
    unpack_scales_mins_k4(s, sc8, m8);
    uint8_t sc[8], m[8];
    std::memcpy(sc, sc8, 8);
    std::memcpy(m, m8, 8);
    for (int j = 0; j < 8; ++j) {
      uint8_t want_sc, want_m;
      unpack_scale_min_k4(s, j, &want_sc, &want_m);
      ASSERT_EQ(sc[j], want_sc) << "trial " << trial << " j " << j;
      ASSERT_EQ(m[j], want_m) << "trial " << trial << " j " << j;
    }
  }
}

TEST(QuantRef, FixedInputIsTheOneTheExpectedBytesCameFrom) {
  const std::vector<float> x = fixed_input();
  EXPECT_EQ(fnv(x.data(), x.size() * sizeof(float)), kInputFnv);
}

TEST(QuantRef, QuantisersMatchLlamaCppBytes) {
  const std::vector<float> x = fixed_input();
  for (const Expected& e : kExpected) {
    const size_t nbytes = kN / static_cast<size_t>(e.block_elems) * e.block_bytes;
    std::vector<uint8_t> out(nbytes, 0xAA);
    e.quantize(x.data(), out.data(), kN);
    EXPECT_EQ(fnv(out.data(), nbytes), e.fnv) << e.name;
  }
}

TEST(QuantRef, FirstBlocksSpelledOut) {
  // The first block of three types in full, from the same program: a failing
  // hash above can be located by eye here.
  const std::vector<float> x = fixed_input();
  BlockQ4_0 q40;
  quantize_row_q4_0(x.data(), &q40, 32);
  EXPECT_EQ(hex(reinterpret_cast<uint8_t*>(&q40), 18), "e6afaf1fa716015e9887b6935fe4f02fb5f9");
  BlockQ4_K q4k;
  quantize_row_q4_K(x.data(), &q4k, 256);
  EXPECT_EQ(hex(reinterpret_cast<uint8_t*>(&q4k), 144),
            "3b180e24fdfbf2febcfcf2fcf5ef5ffd704098fa0ec15758f99cb0abaf21fbc776cf56bf9fca763874b68ae261fdc520"
            "4bc5b55d2d41d066cfbc18b3d68f3ee56e3ba8cffa0fa50d5e108aeaf0495fe05e319b0915d44fec1a5686073424cf35"
            "00599a66adb020199829661648c44980d485daaac1b9fe70d205bc1de5289592e23a9acce425359e71579e8ab3945955");
  BlockQ6_K q6k;
  quantize_row_q6_K(x.data(), &q6k, 256);
  EXPECT_EQ(hex(reinterpret_cast<uint8_t*>(&q6k), 210),
            "f04043899b560083f63331b07ff4ad5d7723e633611695b08de57586daaa3ceffe52257e80f2d3845e131b2aa85aacf1"
            "632f5dc01afc64e69383fe6428c0ae5bc5651109856a00ae1673814158aa6228302a1e9ccd52712966eb1c2dd6b44b71"
            "641c659107e7d0ea6607c3318e7a315f209586c80ccf97b537d789f411a211c224d4da7e330cc656fefb28cbdbb03edd"
            "8ad05a0414c16ace8af655133b90823fe4a3d991f29ec47cf1268a02e212acb230d65a052be8e042ba924551666dd6a8"
            "78827a966094698089607f7985837b9b1c0c");
}

// ---------------------------------------------------------------- plain decoder

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
double h(const uint8_t* p) { return fp16_to_fp32(u16(p)); }

// Element i of a block of `type`, straight from the layout description (byte
// offsets, not the structs), in double.
double plain_value(GgmlType type, const uint8_t* b, int i) {
  switch (type) {
    case GgmlType::kQ4_0: {  // d; qs[16]
      const int q = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
      return h(b) * (q - 8);
    }
    case GgmlType::kQ4_1: {  // d, m; qs[16]
      const int q = i < 16 ? b[4 + i] & 15 : b[4 + i - 16] >> 4;
      return h(b) * q + h(b + 2);
    }
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {  // d, [m]; qh[4]; qs[16]
      const int o = type == GgmlType::kQ5_0 ? 2 : 4;
      const uint32_t qh = b[o] | b[o + 1] << 8 | b[o + 2] << 16 | static_cast<uint32_t>(b[o + 3]) << 24;
      const int lo = i < 16 ? b[o + 4 + i] & 15 : b[o + 4 + i - 16] >> 4;
      const int q = lo | static_cast<int>((qh >> i) & 1) << 4;
      return type == GgmlType::kQ5_0 ? h(b) * (q - 16) : h(b) * q + h(b + 2);
    }
    case GgmlType::kQ8_1:  // d, s; qs[32]
      return h(b) * static_cast<int8_t>(b[4 + i]);
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {  // d, dmin; scales[12]; [qh[32];] qs[128]
      const uint8_t* s = b + 4;
      const int sub = i / 32, l = i % 32;
      int sc, m;
      if (sub < 4) {
        sc = s[sub] & 63;
        m = s[sub + 4] & 63;
      } else {
        sc = (s[sub + 4] & 15) | (s[sub - 4] >> 6) << 4;
        m = (s[sub + 4] >> 4) | (s[sub] >> 6) << 4;
      }
      const uint8_t* qs = b + (type == GgmlType::kQ4_K ? 16 : 48);
      int q = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
      if (type == GgmlType::kQ5_K) q |= ((b[16 + l] >> sub) & 1) << 4;
      return h(b) * sc * q - h(b + 2) * m;
    }
    case GgmlType::kQ6_K: {  // ql[128]; qh[64]; scales[16]; d
      const int half = i / 128, l = i % 32, k = (i % 128) / 32;
      const uint8_t* ql = b + 64 * half;
      const uint8_t* qh = b + 128 + 32 * half;
      const int q = ((ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) | ((qh[l] >> (2 * k)) & 3) << 4;
      return h(b + 208) * static_cast<int8_t>(b[192 + i / 16]) * (q - 32);
    }
    case GgmlType::kQ8_K: {  // float d; qs[256]; bsums[16]
      float d;
      std::memcpy(&d, b, 4);
      return static_cast<double>(d) * static_cast<int8_t>(b[4 + i]);
    }
    default:
      ADD_FAILURE();
      return 0;
  }
}

struct TypeCase {
  GgmlType type;
  void (*quantize)(const float*, void*, size_t);
  void (*dequantize)(const void*, float*, size_t);
  int block_elems;
  size_t block_bytes;
  // Round-trip bound per element, in units of the block's amplitude
  // (max|x| or max-min over the block): half a step of the code grid plus the
  // scales' own rounding (fp16 super-scale, 6-bit sub-scales for K types).
  double rel_bound;
};

const TypeCase kTypes[] = {
    {GgmlType::kQ4_0, quantize_row_q4_0, dequantize_row_q4_0, 32, 18, 1.0 / 16 + 1e-3},
    {GgmlType::kQ4_1, quantize_row_q4_1, dequantize_row_q4_1, 32, 20, 1.0 / 30 + 1e-3},
    {GgmlType::kQ5_0, quantize_row_q5_0, dequantize_row_q5_0, 32, 22, 1.0 / 32 + 1e-3},
    {GgmlType::kQ5_1, quantize_row_q5_1, dequantize_row_q5_1, 32, 24, 1.0 / 62 + 1e-3},
    {GgmlType::kQ8_1, quantize_row_q8_1, dequantize_row_q8_1, 32, 36, 1.0 / 254 + 1e-3},
    {GgmlType::kQ4_K, quantize_row_q4_K, dequantize_row_q4_K, 256, 144, 0.12},
    {GgmlType::kQ5_K, quantize_row_q5_K, dequantize_row_q5_K, 256, 176, 0.06},
    {GgmlType::kQ6_K, quantize_row_q6_K, dequantize_row_q6_K, 256, 210, 0.03},
    {GgmlType::kQ8_K, quantize_row_q8_K, dequantize_row_q8_K, 256, 292, 1.0 / 254 + 1e-6},
};

TEST(QuantRef, DequantisersAreBitExactAgainstThePlainDecoder) {
  // Quantised fixed input plus random bytes (every code and scale pattern,
  // including ones no quantiser writes); fp16 fields forced finite.
  const std::vector<float> x = fixed_input();
  for (const TypeCase& c : kTypes) {
    const size_t nblocks = kN / static_cast<size_t>(c.block_elems);
    std::vector<uint8_t> q(nblocks * c.block_bytes * 2);
    c.quantize(x.data(), q.data(), kN);
    Lcg r;
    for (size_t i = nblocks * c.block_bytes; i < q.size(); ++i) q[i] = static_cast<uint8_t>(r.next() >> 24);
    for (size_t b = nblocks; b < 2 * nblocks; ++b) {
      uint8_t* blk = q.data() + b * c.block_bytes;
      auto tame = [](uint8_t* p) { p[1] &= 0x3f; };  // exponent < 16: finite, |v| < 2
      if (c.type == GgmlType::kQ6_K) {
        tame(blk + 208);
      } else if (c.type == GgmlType::kQ8_K) {
        const float d = static_cast<float>(r.next() % 1000) * 1e-5f;
        std::memcpy(blk, &d, 4);
      } else {
        tame(blk);
        if (c.type != GgmlType::kQ4_0 && c.type != GgmlType::kQ5_0) tame(blk + 2);
      }
    }
    const size_t n = 2 * static_cast<size_t>(kN);
    std::vector<float> y(n);
    c.dequantize(q.data(), y.data(), n);
    int bad = 0;
    for (size_t i = 0; i < n && bad < 5; ++i) {
      const uint8_t* blk = q.data() + (i / static_cast<size_t>(c.block_elems)) * c.block_bytes;
      const float want = static_cast<float>(plain_value(c.type, blk, static_cast<int>(i % c.block_elems)));
      uint32_t a, b;
      std::memcpy(&a, &y[i], 4);
      std::memcpy(&b, &want, 4);
      if (a != b) {
        ++bad;
        ADD_FAILURE() << ggml_type_name(static_cast<uint32_t>(c.type)) << " element " << i << ": " << y[i]
                      << " vs plain " << want;
      }
    }
  }
}

TEST(QuantRef, RoundTripWithinHalfAStepOfEachBlock) {
  const std::vector<float> x = fixed_input();
  for (const TypeCase& c : kTypes) {
    const size_t nbytes = kN / static_cast<size_t>(c.block_elems) * c.block_bytes;
    std::vector<uint8_t> q(nbytes);
    std::vector<float> y(kN);
    c.quantize(x.data(), q.data(), kN);
    c.dequantize(q.data(), y.data(), kN);
    for (int b0 = 0; b0 < kN; b0 += c.block_elems) {
      float lo = 0, hi = 0;  // the range includes 0 (affine types clamp min <= 0 for K)
      for (int i = b0; i < b0 + c.block_elems; ++i) {
        lo = std::min(lo, x[static_cast<size_t>(i)]);
        hi = std::max(hi, x[static_cast<size_t>(i)]);
      }
      const double amp = std::max<double>(hi - lo, std::max(std::fabs(lo), std::fabs(hi)));
      for (int i = b0; i < b0 + c.block_elems; ++i) {
        const auto ui = static_cast<size_t>(i);
        ASSERT_LE(std::fabs(static_cast<double>(y[ui]) - x[ui]), c.rel_bound * amp + 1e-7)
            << ggml_type_name(static_cast<uint32_t>(c.type)) << " element " << i << " x=" << x[ui];
      }
    }
  }
}

TEST(QuantRef, Q8KBlockSumsAndZeroBlock) {
  const std::vector<float> x = fixed_input();
  std::vector<BlockQ8_K> q(kN / 256);
  quantize_row_q8_K(x.data(), q.data(), kN);
  for (const BlockQ8_K& b : q) {
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += b.qs[16 * g + i];
      EXPECT_EQ(b.bsums[g], s);
    }
    for (int8_t v : b.qs) EXPECT_GE(v, -127);
  }
  EXPECT_EQ(q.back().d, 0.0f);  // superblock 7 is all zeros
}

TEST(QuantRef, DispatchKnowsTheNewTypesAndRefusesPartialBlocks) {
  const std::vector<float> x = fixed_input();
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                     GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    EXPECT_TRUE(has_reference_codec(t));
    const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t));
    ASSERT_NE(info, nullptr);
    EXPECT_TRUE(info->supported) << info->name;
    std::vector<uint8_t> q(*ggml_nbytes(static_cast<uint32_t>(t), kN));
    ASSERT_TRUE(quantize_row(t, x.data(), q.data(), kN).ok());
    std::vector<float> y(kN);
    ASSERT_TRUE(dequantize_row(t, q.data(), y.data(), kN).ok());
    const Status bad = quantize_row(t, x.data(), q.data(), info->block_size + 16);
    EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.message().find(info->name), std::string::npos) << bad.message();
  }
  EXPECT_FALSE(has_reference_codec(GgmlType::kQ2_K));
  const Status st = dequantize_row(GgmlType::kQ3_K, x.data(), nullptr, 256);
  EXPECT_NE(st.message().find("Q3_K"), std::string::npos);
}

}  // namespace
}  // namespace spw::gguf
