#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/cpu_features.h"
#include "gguf/fp16.h"
#include "gguf/gguf.h"
#include "gguf/quant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace spw::gguf {
namespace {

using ::testing::HasSubstr;

std::string src_path(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }

Result<std::unique_ptr<GgufFile>> parse_bytes(std::string bytes) {
  return GgufFile::parse(make_memory_file(std::move(bytes), "test.gguf"));
}

uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---------------------------------------------------------------- fp16

TEST(Fp16, HandComputedValues) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(0.5f), 0x3800);
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);              // max finite
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7bff);            // just below the tie
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);              // tie rounds to even = inf
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (0)
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25) * 1.0000001f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // tie 1.5 ulp -> even 2
  EXPECT_EQ(fp32_to_fp16(std::ldexp(5.0f, -25)), 0x0002);  // tie 2.5 ulp -> even 2
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(fp32_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into normal
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -10)), 0x3c01);
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);       // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);       // tie -> even
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(fp32_to_fp16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t qnan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7c00, 0x7c00);
  EXPECT_NE(qnan & 0x03ff, 0);
  // A signalling NaN whose payload lies only in the low bits must stay NaN.
  float snan;
  uint32_t snan_bits = 0x7f800001u;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_NE(fp32_to_fp16(snan) & 0x03ff, 0);

  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f2u(fp16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7c00)));
  EXPECT_LT(fp16_to_fp32(0xfc00), 0.0f);
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7c01)));
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
    } else {
      ASSERT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

#if defined(__x86_64__)
// The CPU's F16C converters, where it has them (the build's baseline does not
// assume them).
__attribute__((target("f16c"))) uint16_t f16c_to_half(float f) { return _cvtss_sh(f, 0); }
__attribute__((target("f16c"))) float f16c_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The hardware converter is the reference for rounding: compare over a
// stride of all 2^32 float bit patterns (NaN payloads excepted).
TEST(Fp16, MatchesF16cHardware) {
  const CpuFeatures& cpu = host_cpu_features();
  if (!(cpu.f16c && cpu.os_avx)) GTEST_SKIP() << "this CPU has no F16C";
  for (uint64_t u = 0; u < (1ull << 32); u += 251) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, 4);
    const uint16_t hw = f16c_to_half(f);
    const uint16_t sw = fp32_to_fp16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(fp16_to_fp32(sw)));
      continue;
    }
    ASSERT_EQ(sw, hw) << "float bits 0x" << std::hex << bits;
    ASSERT_EQ(f2u(fp16_to_fp32(hw)), f2u(f16c_to_float(hw)));
  }
}
#endif

// ---------------------------------------------------------------- Q8_0

TEST(Q8_0, HandComputedBlock) {
  // amax 127 -> d = 1 exactly; roundf rounds halves away from zero.
  float x[32] = {};
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.5f;
  x[4] = 1.5f;
  x[5] = -126.4f;
  uint8_t blk[kQ8_0BlockBytes];
  quantize_row_q8_0(x, blk, 32);
  uint16_t d;
  std::memcpy(&d, blk, 2);
  EXPECT_EQ(d, 0x3c00);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 3);
  EXPECT_EQ(q[2], -3);
  EXPECT_EQ(q[3], 1);
  EXPECT_EQ(q[4], 2);
  EXPECT_EQ(q[5], -126);
  for (int j = 6; j < 32; ++j) EXPECT_EQ(q[j], 0);
  float y[32];
  dequantize_row_q8_0(blk, y, 32);
  EXPECT_EQ(y[0], 127.0f);
  EXPECT_EQ(y[1], 3.0f);
  EXPECT_EQ(y[5], -126.0f);
}

TEST(Q8_0, ScaleStoredAsFp16AndQuantsUseFp32Scale) {
  // x[j] = j - 16: amax 16, d = 16/127 = 0.125984..., fp16 0x3008 (0.1259765625);
  // quants use 1/d in fp32: q = roundf((j - 16) * 7.9375).
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  uint8_t blk[kQ8_0BlockBytes];
  quantize_row_q8_0(x, blk, 32);
  uint16_t d;
  std::memcpy(&d, blk, 2);
  EXPECT_EQ(d, 0x3008);
  const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], -119);
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[18], 16);   // 15.875
  EXPECT_EQ(q[31], 119);  // 119.0625
  float y[32];
  dequantize_row_q8_0(blk, y, 32);
  EXPECT_FLOAT_EQ(y[0], -127.0f * 0.1259765625f);
  EXPECT_FLOAT_EQ(y[31], 119.0f * 0.1259765625f);
}

TEST(Q8_0, ZeroBlockAndMultiBlockErrorBound) {
  std::vector<float> x(32 * 8, 0.0f);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t i = 32; i < x.size(); ++i) x[i] = nd(rng) * static_cast<float>(i / 32);
  std::vector<uint8_t> blk(8 * kQ8_0BlockBytes);
  quantize_row_q8_0(x.data(), blk.data(), x.size());
  for (int j = 0; j < 34; ++j) EXPECT_EQ(blk[j], 0) << j;  // zero block: d = 0, q = 0
  std::vector<float> y(x.size());
  dequantize_row_q8_0(blk.data(), y.data(), y.size());
  for (size_t b = 0; b < 8; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    for (int j = 0; j < 32; ++j) {
      // Half a quant step, plus the fp16 rounding of d (rel 2^-11) times |q| <= 127.
      EXPECT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), d * 0.5f + amax * 0.0005f + 1e-7f);
    }
  }
  Status bad = dequantize_row(GgmlType::kQ3_K, blk.data(), y.data(), 256);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("Q3_K"));
  EXPECT_FALSE(dequantize_row(GgmlType::kQ8_0, blk.data(), y.data(), 33).ok());
}

TEST(F16Row, DequantizeAndGeneric) {
  const float x[5] = {1.0f, -0.5f, 65504.0f, 0.1f, 0.0f};
  uint8_t h[10];
  quantize_row_f16(x, h, 5);
  float y[5];
  dequantize_row_f16(h, y, 5);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[2], 65504.0f);
  EXPECT_EQ(y[3], fp16_to_fp32(0x2e66));
  float z[5];
  ASSERT_TRUE(dequantize_row(GgmlType::kF16, h, z, 5).ok());
  EXPECT_EQ(std::memcmp(y, z, sizeof y), 0);
}

// ---------------------------------------------------------------- types

TEST(GgmlTypes, InfoAndNbytes) {
  ASSERT_NE(ggml_type_info(8), nullptr);
  EXPECT_STREQ(ggml_type_info(8)->name, "Q8_0");
  EXPECT_EQ(ggml_type_info(8)->block_size, 32u);
  EXPECT_EQ(ggml_type_info(8)->type_size, 34u);
  EXPECT_EQ(ggml_type_info(4), nullptr);  // removed Q4_2
  EXPECT_EQ(ggml_type_info(31), nullptr);
  EXPECT_EQ(ggml_type_name(77), "unknown(77)");
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(*ggml_nbytes(0, 10), 40u);
  EXPECT_EQ(*ggml_nbytes(1, 10), 20u);
  EXPECT_EQ(*ggml_nbytes(8, 64), 68u);
  EXPECT_EQ(*ggml_nbytes(12, 256), 144u);
  EXPECT_EQ(ggml_nbytes(8, 33).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ggml_nbytes(99, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ggml_nbytes(0, 1ull << 63).status().code(), StatusCode::kCorruption);
}

// ---------------------------------------------------------------- writer round trip

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

GgufWriter make_small_writer(uint32_t alignment = kDefaultAlignment) {
  GgufWriter w(alignment);
  w.set("general.architecture", Value::str("llama"));
  w.set("u8", Value{ValueType::kUint8, uint64_t{200}});
  w.set("i8", Value{ValueType::kInt8, int64_t{-100}});
  w.set("u16", Value{ValueType::kUint16, uint64_t{60000}});
  w.set("i16", Value{ValueType::kInt16, int64_t{-30000}});
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("f32", Value::f32(1.5f));
  w.set("bool", Value::boolean(true));
  w.set("str", Value::str("hello \xe2\x96\x81 world"));
  w.set("u64", Value::u64(1ull << 60));
  w.set("i64", Value{ValueType::kInt64, int64_t{-(1ll << 60)}});
  w.set("f64", Value{ValueType::kFloat64, 0.1});
  w.set("arr.str", Value::array(ValueType::kString, {Value::str("a"), Value::str(""), Value::str("ccc")}));
  w.set("arr.nested", Value::array(ValueType::kArray,
                                   {Value::array(ValueType::kInt32, {Value::i32(1), Value::i32(-2)}),
                                    Value::array(ValueType::kInt32, {})}));
  w.set("arr.empty", Value::array(ValueType::kFloat32, {}));
  std::vector<float> a(3 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  EXPECT_TRUE(w.add_tensor("a.f32", GgmlType::kF32, {3, 4}, f32_bytes(a)).ok());
  std::string h(2 * 5, '\0');
  quantize_row_f16(a.data(), h.data(), 5);
  EXPECT_TRUE(w.add_tensor("b.f16", GgmlType::kF16, {5}, h).ok());
  std::vector<float> q(64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(static_cast<float>(i));
  std::string qb(2 * kQ8_0BlockBytes, '\0');
  quantize_row_q8_0(q.data(), qb.data(), 64);
  EXPECT_TRUE(w.add_tensor("c.q8_0", GgmlType::kQ8_0, {32, 2}, qb).ok());
  return w;
}

TEST(GgufRoundTrip, EveryValueTypeAndTensorType) {
  for (uint32_t alignment : {32u, 1u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    GgufWriter w = make_small_writer(alignment);
    auto bytes = w.serialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    EXPECT_EQ(bytes->size(), *w.serialized_size());
    auto f = parse_bytes(*bytes);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const GgufFile& g = **f;
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.alignment(), alignment);
    EXPECT_EQ(g.data_offset() % alignment, 0u);
    EXPECT_EQ(g.has("general.alignment"), alignment != 32);

    EXPECT_EQ(*g.get_string("general.architecture"), "llama");
    EXPECT_EQ(g.find("u8")->type, ValueType::kUint8);
    EXPECT_EQ(*g.get_u32("u8"), 200u);
    EXPECT_EQ(*g.get_i64("i8"), -100);
    EXPECT_EQ(g.find("i8")->type, ValueType::kInt8);
    EXPECT_EQ(*g.get_u32("u16"), 60000u);
    EXPECT_EQ(*g.get_i64("i16"), -30000);
    EXPECT_EQ(*g.get_u32("u32"), 4000000000u);
    EXPECT_EQ(*g.get_i64("i32"), -2000000000);
    EXPECT_EQ(*g.get_f32("f32"), 1.5f);
    EXPECT_EQ(*g.get_bool("bool"), true);
    EXPECT_EQ(*g.get_string("str"), "hello \xe2\x96\x81 world");
    EXPECT_EQ(*g.get_u64("u64"), 1ull << 60);
    EXPECT_EQ(*g.get_i64("i64"), -(1ll << 60));
    EXPECT_EQ(*g.get_f64("f64"), 0.1);
    EXPECT_EQ(g.find("f64")->type, ValueType::kFloat64);
    auto strs = g.get_array("arr.str", ValueType::kString);
    ASSERT_TRUE(strs.ok());
    ASSERT_EQ((*strs)->items.size(), 3u);
    EXPECT_EQ(std::get<std::string>((*strs)->items[2].v), "ccc");
    EXPECT_EQ(std::get<std::string>((*strs)->items[1].v), "");
    auto nested = g.get_array("arr.nested", ValueType::kArray);
    ASSERT_TRUE(nested.ok());
    ASSERT_EQ((*nested)->items.size(), 2u);
    const Array& inner = std::get<Array>((*nested)->items[0].v);
    EXPECT_EQ(inner.elem_type, ValueType::kInt32);
    ASSERT_EQ(inner.items.size(), 2u);
    EXPECT_EQ(std::get<int64_t>(inner.items[1].v), -2);
    EXPECT_TRUE(std::get<Array>((*nested)->items[1].v).items.empty());
    EXPECT_TRUE((*g.get_array("arr.empty", ValueType::kFloat32))->items.empty());

    // Metadata keeps file order.
    EXPECT_EQ(g.metadata()[alignment != 32 ? 1 : 0].first, "general.architecture");

    ASSERT_EQ(g.tensors().size(), 3u);
    const TensorInfo* a = g.find_tensor("a.f32");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->n_dims, 2u);
    EXPECT_EQ(a->ne[0], 3u);
    EXPECT_EQ(a->ne[1], 4u);
    EXPECT_EQ(a->ne[2], 1u);
    EXPECT_EQ(a->n_elements, 12u);
    EXPECT_EQ(a->nbytes, 48u);
    EXPECT_EQ(a->type, 0u);
    float a5;
    std::memcpy(&a5, a->data + 5 * 4, 4);
    EXPECT_EQ(a5, 0.25f);
    const TensorInfo* b = g.find_tensor("b.f16");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->type, 1u);
    EXPECT_EQ(b->nbytes, 10u);
    float bf[5];
    dequantize_row_f16(b->data, bf, 5);
    EXPECT_EQ(bf[4], 0.0f);
    EXPECT_EQ(bf[0], -1.0f);
    const TensorInfo* c = g.find_tensor("c.q8_0");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->type, 8u);
    EXPECT_EQ(c->nbytes, 68u);
    float cf[64];
    dequantize_row_q8_0(c->data, cf, 64);
    EXPECT_NEAR(cf[1], std::sin(1.0f), 0.01f);
    for (const TensorInfo& t : g.tensors()) {
      EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      ASSERT_LE(g.data_offset() + t.offset + t.nbytes, bytes->size());
      EXPECT_EQ(std::memcmp(t.data, bytes->data() + g.data_offset() + t.offset, t.nbytes), 0);
    }
    EXPECT_EQ(g.find_tensor("nope"), nullptr);
  }
}

TEST(GgufRoundTrip, StreamedTensorsMatchInMemory) {
  GgufWriter mem;
  GgufWriter streamed;
  std::vector<float> v(100);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  ASSERT_TRUE(mem.add_tensor("t", GgmlType::kF32, {100}, f32_bytes(v)).ok());
  int calls = 0;
  ASSERT_TRUE(streamed
                  .add_tensor_streamed("t", GgmlType::kF32, {100},
                                       [&](std::string* out) {
                                         ++calls;
                                         *out = f32_bytes(v);
                                         return Status::ok_status();
                                       })
                  .ok());
  EXPECT_EQ(*mem.serialize(), *streamed.serialize());
  EXPECT_EQ(calls, 1);

  const std::string path = ::testing::TempDir() + "/spw_gguf_stream_test.gguf";
  ASSERT_TRUE(streamed.write_streaming(path).ok());
  auto back = Env::default_env().read_file(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *mem.serialize());
  EXPECT_FALSE(Env::default_env().file_exists(path + ".tmp"));
  ASSERT_TRUE(mem.write(Env::default_env(), path).ok());
  auto opened = GgufFile::open(Env::default_env(), path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  EXPECT_EQ((*opened)->path(), path);

  // A producer that lies about the size is an error, and leaves no file behind.
  GgufWriter liar;
  ASSERT_TRUE(liar.add_tensor_streamed("t", GgmlType::kF32, {4}, [](std::string* out) {
                    out->assign(3, 'x');
                    return Status::ok_status();
                  }).ok());
  const std::string liar_path = ::testing::TempDir() + "/spw_gguf_liar.gguf";
  EXPECT_FALSE(liar.write_streaming(liar_path).ok());
  EXPECT_FALSE(Env::default_env().file_exists(liar_path));
  EXPECT_FALSE(Env::default_env().file_exists(liar_path + ".tmp"));
}

TEST(GgufWriter, RejectsBadInput) {
  GgufWriter w;
  EXPECT_EQ(w.add_tensor("x", GgmlType::kF32, {4}, std::string(15, '\0')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", GgmlType::kQ8_0, {33}, std::string(34, '\0')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", GgmlType::kF32, {4, 0}, "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", GgmlType::kF32, {1, 1, 1, 1, 1}, std::string(4, '\0')).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", static_cast<GgmlType>(77), {4}, "").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.add_tensor("x", GgmlType::kF32, {1}, std::string(4, '\0')).ok());
  Status dup = w.add_tensor("x", GgmlType::kF32, {1}, std::string(4, '\0'));
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("'x'"));

  GgufWriter v;
  v.set("k", Value{ValueType::kUint8, uint64_t{300}});
  auto r = v.serialize();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'k'"));
  GgufWriter v2;
  v2.set("mixed", Value::array(ValueType::kInt32, {Value::i32(1), Value::str("x")}));
  EXPECT_THAT(v2.serialize().status().message(), HasSubstr("'mixed'"));
  GgufWriter v3;
  v3.set("k", Value{ValueType::kString, uint64_t{1}});
  EXPECT_FALSE(v3.serialize().ok());
  EXPECT_FALSE(GgufWriter(3).serialize().ok());
  // Without tensors there is no data section, so no padding to the alignment.
  GgufWriter empty(1u << 20);
  auto empty_bytes = empty.serialize();
  ASSERT_TRUE(empty_bytes.ok());
  EXPECT_LT(empty_bytes->size(), 100u);
  auto empty_back = parse_bytes(*empty_bytes);
  ASSERT_TRUE(empty_back.ok()) << empty_back.status().to_string();
  EXPECT_EQ((*empty_back)->alignment(), 1u << 20);
  // set() replaces.
  GgufWriter v4;
  v4.set("k", Value::u32(1));
  v4.set("k", Value::u32(2));
  auto f = parse_bytes(*v4.serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ(*(*f)->get_u32("k"), 2u);
}

TEST(GgufGetters, TypeRulesAndErrors) {
  GgufWriter w;
  w.set("u8", Value{ValueType::kUint8, uint64_t{7}});
  w.set("neg", Value::i32(-5));
  w.set("big", Value::u64(1ull << 40));
  w.set("huge", Value::u64(~0ull));
  w.set("f", Value::f32(0.25f));
  w.set("s", Value::str("x"));
  w.set("b", Value::boolean(false));
  w.set("arr", Value::array(ValueType::kInt32, {Value::i32(3)}));
  auto f = parse_bytes(*w.serialize());
  ASSERT_TRUE(f.ok());
  const GgufFile& g = **f;
  EXPECT_EQ(*g.get_u32("u8"), 7u);
  EXPECT_EQ(*g.get_u64("u8"), 7u);
  EXPECT_EQ(*g.get_i64("u8"), 7);
  EXPECT_EQ(*g.get_f64("u8"), 7.0);
  EXPECT_EQ(*g.get_i64("neg"), -5);
  EXPECT_EQ(*g.get_f32("neg"), -5.0f);
  auto neg_u = g.get_u32("neg");
  EXPECT_EQ(neg_u.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(neg_u.status().message(), HasSubstr("'neg'"));
  EXPECT_THAT(neg_u.status().message(), HasSubstr("int32"));
  EXPECT_EQ(g.get_u32("big").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*g.get_u64("big"), 1ull << 40);
  EXPECT_EQ(g.get_i64("huge").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*g.get_f32("f"), 0.25f);
  EXPECT_EQ(g.get_u32("f").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.get_f32("s").status().code(), StatusCode::kInvalidArgument);
  auto s_as_bool = g.get_bool("s");
  EXPECT_THAT(s_as_bool.status().message(), HasSubstr("string"));
  EXPECT_THAT(s_as_bool.status().message(), HasSubstr("bool"));
  EXPECT_EQ(*g.get_bool("b"), false);
  EXPECT_EQ(g.get_string("b").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*g.get_array("arr", ValueType::kInt32))->items.size(), 1u);
  EXPECT_EQ(g.get_array("arr", ValueType::kUint32).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.get_array("s", ValueType::kUint32).status().code(), StatusCode::kInvalidArgument);
  auto missing = g.get_u32("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'nope'"));
  EXPECT_EQ(*g.get_u32_or("nope", 9), 9u);
  EXPECT_EQ(*g.get_u32_or("u8", 9), 7u);
  EXPECT_EQ(g.get_u32_or("s", 9).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*g.get_f32_or("nope", 2.5f), 2.5f);
  EXPECT_EQ(*g.get_bool_or("nope", true), true);
  EXPECT_EQ(*g.get_bool_or("b", true), false);
  EXPECT_EQ(*g.get_string_or("nope", "d"), "d");
  EXPECT_EQ(*g.get_string_or("s", "d"), "x");
  EXPECT_TRUE(g.find("u8")->is_integer());
  EXPECT_FALSE(g.find("f")->is_integer());
  EXPECT_TRUE(g.find("f")->is_float());
}

// ---------------------------------------------------------------- real files

TEST(GgufRealFiles, Stories260K) {
  auto f = GgufFile::open(Env::default_env(), src_path("models/stories260K.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(*g.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(*g.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(*g.get_u32("llama.feed_forward_length"), 172u);
  EXPECT_EQ(*g.get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(*g.get_u32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(*g.get_u32("llama.context_length"), 2048u);
  EXPECT_FLOAT_EQ(*g.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(*g.get_string("tokenizer.ggml.model"), "llama");
  auto tokens = g.get_array("tokenizer.ggml.tokens", ValueType::kString);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ((*tokens)->items.size(), 512u);
  EXPECT_EQ(std::get<std::string>((*tokens)->items[1].v), "<s>");
  EXPECT_EQ((*g.get_array("tokenizer.ggml.scores", ValueType::kFloat32))->items.size(), 512u);
  EXPECT_EQ((*g.get_array("tokenizer.ggml.token_type", ValueType::kInt32))->items.size(), 512u);
  EXPECT_EQ(*g.get_u32("tokenizer.ggml.padding_token_id"), 0xffffffffu);
  EXPECT_EQ(g.tensors().size(), 3u + 5u * 9u);
  const TensorInfo* emb = g.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, 0u);
  EXPECT_EQ(emb->n_dims, 2u);
  EXPECT_EQ(emb->ne[0], 64u);
  EXPECT_EQ(emb->ne[1], 512u);
  const TensorInfo* k = g.find_tensor("blk.4.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne[0], 64u);
  EXPECT_EQ(k->ne[1], 32u);  // GQA: 4 kv heads x head dim 8
  const TensorInfo* down = g.find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne[0], 172u);
  EXPECT_EQ(down->ne[1], 64u);
  const TensorInfo* last = g.find_tensor("blk.4.ffn_norm.weight");
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(g.data_offset() + last->offset + last->nbytes, g.file_size());
  float norm0;
  std::memcpy(&norm0, g.find_tensor("output_norm.weight")->data, 4);
  EXPECT_TRUE(std::isfinite(norm0));
  EXPECT_GT(norm0, 0.0f);
}

TEST(GgufRealFiles, LlamaTinyRandomF16) {
  auto f = GgufFile::open(Env::default_env(), src_path("tests/data/llama-2-tiny-random.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const GgufFile& g = **f;
  EXPECT_EQ(*g.get_string("general.name"), "LLaMA v2");
  EXPECT_EQ(*g.get_u32("llama.embedding_length"), 8u);
  EXPECT_EQ(*g.get_u32("llama.block_count"), 1u);
  EXPECT_EQ(*g.get_u32("general.file_type"), 1u);
  EXPECT_EQ((*g.get_array("tokenizer.ggml.tokens", ValueType::kString))->items.size(), 32000u);
  EXPECT_EQ(g.tensors().size(), 12u);
  EXPECT_EQ(g.find_tensor("token_embd.weight")->type, static_cast<uint32_t>(GgmlType::kF16));
  EXPECT_EQ(g.find_tensor("token_embd.weight")->ne[1], 32000u);
  EXPECT_EQ(g.find_tensor("output.weight")->type, static_cast<uint32_t>(GgmlType::kF16));
  EXPECT_EQ(g.find_tensor("output_norm.weight")->type, static_cast<uint32_t>(GgmlType::kF32));
  EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->ne[0], 32u);
}

TEST(GgufRealFiles, VocabOnlyFile) {
  auto f = GgufFile::open(Env::default_env(), src_path("tests/data/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const GgufFile& g = **f;
  EXPECT_TRUE(g.tensors().empty());
  EXPECT_EQ(*g.get_string("general.name"), "llama-spm");
  EXPECT_EQ(*g.get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(*g.get_u32("llama.vocab_size"), 32000u);
  EXPECT_EQ(*g.get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*g.get_bool("tokenizer.ggml.add_eos_token"), false);
  auto tokens = g.get_array("tokenizer.ggml.tokens", ValueType::kString);
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ((*tokens)->items.size(), 32000u);
  EXPECT_EQ(std::get<std::string>((*tokens)->items[0].v), "<unk>");
  EXPECT_EQ(std::get<std::string>((*tokens)->items[2].v), "</s>");
  EXPECT_LE(g.data_offset(), g.file_size());
}

TEST(GgufRealFiles, MissingFileIsIOError) {
  auto f = GgufFile::open(Env::default_env(), src_path("tests/data/does-not-exist.gguf"));
  EXPECT_EQ(f.status().code(), StatusCode::kIOError);
}

// ---------------------------------------------------------------- corruption

// Checks the invariants a successful parse promises (data inside the file).
void expect_consistent(const GgufFile& g, size_t size) {
  for (const TensorInfo& t : g.tensors()) {
    EXPECT_LE(g.data_offset() + t.offset + t.nbytes, size) << t.name;
  }
}

TEST(GgufCorruption, TruncateSmallFileAtEveryOffset) {
  const std::string full = *make_small_writer().serialize();
  for (size_t n = 0; n < full.size(); ++n) {
    auto f = parse_bytes(full.substr(0, n));
    ASSERT_FALSE(f.ok()) << "truncated to " << n << " bytes parsed";
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().to_string();
    EXPECT_THAT(f.status().message(), HasSubstr("test.gguf"));
  }
  EXPECT_TRUE(parse_bytes(full).ok());
  // A cut inside a string names the key being read and the offset.
  auto f = parse_bytes(full.substr(0, 40));
  EXPECT_THAT(f.status().message(), HasSubstr("offset"));
}

TEST(GgufCorruption, TruncateRealFilesAtStride) {
  for (const char* rel : {"models/stories260K.gguf", "tests/data/llama-2-tiny-random.gguf",
                          "tests/data/ggml-vocab-llama-spm.gguf"}) {
    auto bytes = Env::default_env().read_file(src_path(rel));
    ASSERT_TRUE(bytes.ok());
    const auto full_parse = parse_bytes(*bytes);
    ASSERT_TRUE(full_parse.ok());
    const bool has_tensors = !(*full_parse)->tensors().empty();
    const uint64_t header_end = (*full_parse)->data_offset();
    // Dense over the first bytes, then ~24 cuts spread over the rest (a parse
    // of a 32000-token vocab costs ~1 ms, ~20 ms under ASan).
    const size_t stride = bytes->size() / 24 + 1;
    for (size_t n = 0; n < bytes->size(); n += (n < 512 ? 7 : stride)) {
      auto f = parse_bytes(bytes->substr(0, n));
      if (has_tensors || n < header_end) {
        ASSERT_FALSE(f.ok()) << rel << " truncated to " << n;
        EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
      }
    }
  }
}

TEST(GgufCorruption, FlippedBytesNeverCrash) {
  const std::string full = *make_small_writer().serialize();
  std::mt19937 rng(12345);
  size_t failures = 0, trials = 0;
  auto header = parse_bytes(full);
  ASSERT_TRUE(header.ok());
  const size_t header_size = (*header)->data_offset();
  for (size_t pos = 0; pos < header_size; ++pos) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string b = full;
      b[pos] = static_cast<char>(b[pos] ^ mask);
      auto f = parse_bytes(b);
      ++trials;
      if (!f.ok()) {
        ++failures;
        EXPECT_FALSE(f.status().message().empty());
      } else {
        expect_consistent(**f, b.size());
      }
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::string b = full;
    for (int k = 0; k < 4; ++k) b[rng() % header_size] = static_cast<char>(rng());
    auto f = parse_bytes(b);
    if (f.ok()) expect_consistent(**f, b.size());
  }
  // Most header bytes matter: lengths, types, counts.
  EXPECT_GT(failures, trials / 4);
}

// Hand-assembles GGUF bytes, so tests can write what GgufWriter refuses to.
class Raw {
 public:
  Raw& u8(uint8_t x) { return put(x); }
  Raw& u32(uint32_t x) { return put(x); }
  Raw& u64(uint64_t x) { return put(x); }
  Raw& str(std::string_view s) {
    u64(s.size());
    b_.append(s);
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kGgufMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
  Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t a = 32) {
    b_.resize((b_.size() + a - 1) / a * a, '\0');
    return *this;
  }
  Raw& zeros(size_t n) {
    b_.append(n, '\0');
    return *this;
  }
  std::string bytes() const { return b_; }
  size_t size() const { return b_.size(); }

 private:
  template <typename T>
  Raw& put(T x) {
    b_.append(reinterpret_cast<const char*>(&x), sizeof x);
    return *this;
  }
  std::string b_;
};

Status parse_status(const Raw& r) {
  auto f = parse_bytes(r.bytes());
  return f.ok() ? Status::ok_status() : f.status();
}

void expect_error(const Raw& r, StatusCode code, std::initializer_list<const char*> needles) {
  Status s = parse_status(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const char* n : needles) EXPECT_THAT(s.message(), HasSubstr(n));
}

TEST(GgufHostile, ValidRawBaseline) {
  Raw r;
  r.header(2, 1).kv_u32("general.alignment", 32);
  r.tensor("a", {8}, 0, 0).tensor("b", {32, 2}, 8, 32).pad().zeros(32 + 68);
  ASSERT_TRUE(parse_status(r).ok()) << parse_status(r).to_string();
}

TEST(GgufHostile, MagicAndVersion) {
  Raw bad_magic;
  bad_magic.u32(0x46554746).u32(3).u64(0).u64(0);
  expect_error(bad_magic, StatusCode::kCorruption, {"magic"});
  Raw v1;
  v1.header(0, 0, 1);
  expect_error(v1, StatusCode::kInvalidArgument, {"version 1"});
  Raw v9;
  v9.header(0, 0, 9);
  expect_error(v9, StatusCode::kInvalidArgument, {"version 9"});
  Raw v2;
  v2.header(0, 0, 2);
  EXPECT_TRUE(parse_status(v2).ok());
  EXPECT_EQ((*parse_bytes(v2.bytes()))->version(), 2u);
}

TEST(GgufHostile, HugeCounts) {
  Raw t;
  t.header(1ull << 62, 0);
  expect_error(t, StatusCode::kCorruption, {"tensor_count", "offset 8"});
  Raw k;
  k.header(0, ~0ull);
  expect_error(k, StatusCode::kCorruption, {"metadata_kv_count", "offset 16"});
  Raw arr;
  arr.header(0, 1).str("tokens").u32(9).u32(8).u64(1ull << 60);
  expect_error(arr, StatusCode::kCorruption, {"'tokens'", "array count", "offset"});
  Raw arr_u8;  // count = 10 u8 but only 5 bytes left
  arr_u8.header(0, 1).str("bytes").u32(9).u32(0).u64(10).zeros(5);
  expect_error(arr_u8, StatusCode::kCorruption, {"'bytes'", "array count 10"});
}

TEST(GgufHostile, HugeStringLength) {
  Raw key;
  key.header(0, 1).u64(~0ull).zeros(16);
  expect_error(key, StatusCode::kCorruption, {"string length", "offset 24"});
  Raw val;
  val.header(0, 1).str("name").u32(8).u64(1ull << 40).zeros(3);
  expect_error(val, StatusCode::kCorruption, {"'name'", "string length 1099511627776"});
  Raw tname;
  tname.header(1, 0).u64(1000).zeros(40);
  expect_error(tname, StatusCode::kCorruption, {"tensor #0", "string length"});
}

TEST(GgufHostile, UnknownValueTypes) {
  Raw r;
  r.header(0, 1).str("weird").u32(13).u32(0);
  expect_error(r, StatusCode::kInvalidArgument, {"'weird'", "value type 13", "offset 37"});
  Raw a;
  a.header(0, 1).str("weird").u32(9).u32(0xdeadbeef).u64(0);
  expect_error(a, StatusCode::kInvalidArgument, {"'weird'", "element value type"});
}

TEST(GgufHostile, NestedArraysTooDeep) {
  Raw r;
  r.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 10; ++i) r.u32(9).u64(1);
  r.u32(0).u64(0);
  expect_error(r, StatusCode::kCorruption, {"'deep'", "nested"});
  Raw ok;  // two levels are fine
  ok.header(0, 1).str("two").u32(9).u32(9).u64(1).u32(4).u64(2).u32(1).u32(2);
  ASSERT_TRUE(parse_status(ok).ok()) << parse_status(ok).to_string();
}

TEST(GgufHostile, BadBoolAndDuplicateKeys) {
  Raw b;
  b.header(0, 1).str("flag").u32(7).u8(2);
  expect_error(b, StatusCode::kCorruption, {"'flag'", "bool"});
  Raw d;
  d.header(0, 2).kv_u32("k", 1).kv_u32("k", 2);
  expect_error(d, StatusCode::kCorruption, {"duplicate", "'k'", "offset"});
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 0x80000001u}) {
    Raw r;
    r.header(0, 1).kv_u32("general.alignment", a);
    expect_error(r, StatusCode::kCorruption, {"general.alignment", "power of two"});
  }
  Raw s;
  s.header(0, 1).str("general.alignment").u32(8).str("32");
  expect_error(s, StatusCode::kCorruption, {"general.alignment"});
  Raw big;  // 64-aligned file with a tensor at offset 32: misaligned
  big.header(2, 1).kv_u32("general.alignment", 64).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32);
  big.pad(64).zeros(128);
  expect_error(big, StatusCode::kCorruption, {"'b'", "offset 32", "alignment 64"});
}

TEST(GgufHostile, TensorShapeAndType) {
  Raw dims;
  dims.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0);
  expect_error(dims, StatusCode::kCorruption, {"'t'", "n_dims 5", "offset 33"});
  Raw dims0;
  dims0.header(1, 0).tensor("t", {}, 0, 0).zeros(64);
  expect_error(dims0, StatusCode::kCorruption, {"'t'", "n_dims 0"});
  Raw zero;
  zero.header(1, 0).tensor("t", {4, 0}, 0, 0).pad().zeros(32);
  expect_error(zero, StatusCode::kCorruption, {"'t'", "ne[1] is zero"});
  Raw overflow;
  overflow.header(1, 0).tensor("t", {1ull << 40, 1ull << 30}, 0, 0).pad().zeros(32);
  expect_error(overflow, StatusCode::kCorruption, {"'t'", "overflow"});
  Raw bytes_overflow;  // elements fit in int64 but bytes do not
  bytes_overflow.header(1, 0).tensor("t", {1ull << 62}, 0, 0).pad().zeros(32);
  expect_error(bytes_overflow, StatusCode::kCorruption, {"'t'", "overflow"});
  Raw unknown;
  unknown.header(1, 0).tensor("blk.0.w", {32}, 77, 0).pad().zeros(64);
  expect_error(unknown, StatusCode::kInvalidArgument, {"'blk.0.w'", "77", "offset"});
  Raw removed;
  removed.header(1, 0).tensor("w", {32}, 4, 0).pad().zeros(64);
  expect_error(removed, StatusCode::kInvalidArgument, {"'w'", "type id 4"});
  Raw block;
  block.header(1, 0).tensor("q", {33}, 8, 0).pad().zeros(64);
  expect_error(block, StatusCode::kCorruption, {"'q'", "block size 32"});
  Raw kblock;  // a Q4_K row of 64: a quarter of a super-block
  kblock.header(1, 0).tensor("k", {64, 4}, 12, 0).pad().zeros(160);
  expect_error(kblock, StatusCode::kCorruption, {"'k'", "Q4_K", "block size 256"});
  Raw unnamed;
  unnamed.header(1, 0).tensor("", {8}, 0, 0).pad().zeros(32);
  expect_error(unnamed, StatusCode::kCorruption, {"tensor #0", "empty name"});
  Raw dup;
  dup.header(2, 0).tensor("x", {8}, 0, 0).tensor("x", {8}, 0, 32).pad().zeros(64);
  expect_error(dup, StatusCode::kCorruption, {"duplicate", "'x'"});
}

TEST(GgufHostile, TensorDataPlacement) {
  Raw past;
  past.header(1, 0).tensor("t", {16}, 0, 0).pad().zeros(63);
  expect_error(past, StatusCode::kCorruption, {"'t'", "past"});
  Raw far;
  far.header(1, 0).tensor("t", {16}, 0, ~0ull << 5).pad().zeros(64);
  expect_error(far, StatusCode::kCorruption, {"'t'", "past"});
  Raw misaligned;
  misaligned.header(1, 0).tensor("t", {1}, 0, 4).pad().zeros(64);
  expect_error(misaligned, StatusCode::kCorruption, {"'t'", "alignment 32"});
  Raw overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad().zeros(128);
  expect_error(overlap, StatusCode::kCorruption, {"overlaps", "'a'", "'b'"});
  Raw same;
  same.header(2, 0).tensor("a", {4}, 0, 0).tensor("b", {4}, 0, 0).pad().zeros(64);
  expect_error(same, StatusCode::kCorruption, {"overlaps"});
  Raw header_past;  // table ends, but the padded data section would start past EOF
  header_past.header(1, 0).tensor("a", {1}, 0, 0);
  expect_error(header_past, StatusCode::kCorruption, {"data section"});
}

}  // namespace
}  // namespace spw::gguf
