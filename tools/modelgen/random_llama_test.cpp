#include "tools/modelgen/random_llama.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gguf/fp16.h"
#include "gguf/quant.h"

namespace spw::modelgen {
namespace {

using gguf::GgmlType;
using ::testing::HasSubstr;

std::string src_path(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }

RandomLlamaSpec small_gqa(GgmlType type, uint64_t seed = 7) {
  RandomLlamaSpec s;
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 96;
  s.n_ctx = 128;
  s.type = type;
  s.seed = seed;
  s.rope_freq_base = 500000.0f;
  s.rms_eps = 1e-6f;
  s.vocab_path = src_path("models/stories260K.gguf");  // 512-token llama SPM vocab
  return s;
}

std::unique_ptr<gguf::GgufFile> parse(std::string bytes) {
  auto f = gguf::GgufFile::parse(make_memory_file(std::move(bytes), "random.gguf"));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return f.ok() ? std::move(f).value() : nullptr;
}

std::vector<float> values(const gguf::TensorInfo& t) {
  std::vector<float> v(t.n_elements);
  EXPECT_TRUE(gguf::dequantize_row(static_cast<GgmlType>(t.type), t.data, v.data(), v.size()).ok());
  return v;
}

void expect_shape(const gguf::GgufFile& g, const std::string& name, std::vector<uint64_t> ne,
                  GgmlType type) {
  const gguf::TensorInfo* t = g.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  ASSERT_EQ(t->n_dims, ne.size()) << name;
  for (size_t i = 0; i < ne.size(); ++i) EXPECT_EQ(t->ne[i], ne[i]) << name << " dim " << i;
  EXPECT_EQ(t->type, static_cast<uint32_t>(type)) << name;
}

TEST(RandomLlama, SmallGqaModelHasLlamaLayout) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(gguf::ggml_type_name(static_cast<uint32_t>(type)));
    RandomLlamaSpec spec = small_gqa(type);
    auto bytes = make_random_llama(spec);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    auto g = parse(*bytes);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(*g->get_string("general.architecture"), "llama");
    EXPECT_THAT(*g->get_string("general.name"), HasSubstr("random"));
    EXPECT_EQ(*g->get_u32("llama.context_length"), 128u);
    EXPECT_EQ(*g->get_u32("llama.embedding_length"), 64u);
    EXPECT_EQ(*g->get_u32("llama.block_count"), 2u);
    EXPECT_EQ(*g->get_u32("llama.feed_forward_length"), 96u);
    EXPECT_EQ(*g->get_u32("llama.attention.head_count"), 4u);
    EXPECT_EQ(*g->get_u32("llama.attention.head_count_kv"), 2u);
    EXPECT_EQ(*g->get_u32("llama.rope.dimension_count"), 16u);
    EXPECT_EQ(*g->get_f32("llama.rope.freq_base"), 500000.0f);
    EXPECT_EQ(*g->get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-6f);
    const uint32_t ft = type == GgmlType::kF32 ? 0 : type == GgmlType::kF16 ? 1 : 7;
    EXPECT_EQ(*g->get_u32("general.file_type"), ft);
    // Tokenizer copied from the vocab file, value for value.
    auto vocab = gguf::GgufFile::open(Env::default_env(), spec.vocab_path);
    ASSERT_TRUE(vocab.ok());
    size_t n_tok_keys = 0;
    for (const auto& [key, value] : (*vocab)->metadata()) {
      if (key.rfind("tokenizer.", 0) != 0) continue;
      ++n_tok_keys;
      const gguf::Value* copied = g->find(key);
      ASSERT_NE(copied, nullptr) << key;
      EXPECT_EQ(copied->type, value.type) << key;
    }
    EXPECT_GE(n_tok_keys, 5u);
    auto tokens = g->get_array("tokenizer.ggml.tokens", gguf::ValueType::kString);
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ((*tokens)->items.size(), 512u);
    EXPECT_EQ(std::get<std::string>((*tokens)->items[1].v), "<s>");
    EXPECT_EQ(*g->get_u32("tokenizer.ggml.bos_token_id"), 1u);
    EXPECT_EQ(*g->get_u32("llama.vocab_size"), 512u);

    EXPECT_EQ(g->tensors().size(), 3u + 2u * 9u);
    expect_shape(*g, "token_embd.weight", {64, 512}, type);
    expect_shape(*g, "output_norm.weight", {64}, GgmlType::kF32);
    expect_shape(*g, "output.weight", {64, 512}, type);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      expect_shape(*g, p + "attn_norm.weight", {64}, GgmlType::kF32);
      expect_shape(*g, p + "attn_q.weight", {64, 64}, type);
      expect_shape(*g, p + "attn_k.weight", {64, 32}, type);
      expect_shape(*g, p + "attn_v.weight", {64, 32}, type);
      expect_shape(*g, p + "attn_output.weight", {64, 64}, type);
      expect_shape(*g, p + "ffn_norm.weight", {64}, GgmlType::kF32);
      expect_shape(*g, p + "ffn_gate.weight", {64, 96}, type);
      expect_shape(*g, p + "ffn_up.weight", {64, 96}, type);
      expect_shape(*g, p + "ffn_down.weight", {96, 64}, type);
    }
  }
}

TEST(RandomLlama, SameSeedSameBytesDifferentSeedDifferentWeights) {
  auto a = make_random_llama(small_gqa(GgmlType::kQ8_0, 11));
  auto b = make_random_llama(small_gqa(GgmlType::kQ8_0, 11));
  auto c = make_random_llama(small_gqa(GgmlType::kQ8_0, 12));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  ASSERT_EQ(a->size(), c->size());
  EXPECT_NE(*a, *c);
  auto ga = parse(*a);
  auto gc = parse(*c);
  const auto* ta = ga->find_tensor("blk.1.ffn_up.weight");
  const auto* tc = gc->find_tensor("blk.1.ffn_up.weight");
  EXPECT_NE(std::memcmp(ta->data, tc->data, ta->nbytes), 0);
}

TEST(RandomLlama, WeightStatisticsAndStream) {
  RandomLlamaSpec spec = small_gqa(GgmlType::kF32);
  auto g = parse(*make_random_llama(spec));
  ASSERT_NE(g, nullptr);
  // Values are exactly the documented stream.
  std::vector<float> q = values(*g->find_tensor("blk.0.attn_q.weight"));
  WeightStream ws(spec.seed, "blk.0.attn_q.weight");
  for (int i = 0; i < 100; ++i) {
    const float z = ws.next_normal() * 0.02f;
    ASSERT_EQ(q[i], 0.0f + z) << i;
  }
  auto moments = [](const std::vector<float>& v, double* mean, double* sd) {
    double s = 0, s2 = 0;
    for (float x : v) {
      s += x;
      s2 += double(x) * x;
    }
    *mean = s / v.size();
    *sd = std::sqrt(s2 / v.size() - *mean * *mean);
  };
  double mean, sd;
  moments(values(*g->find_tensor("token_embd.weight")), &mean, &sd);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.001);
  moments(values(*g->find_tensor("blk.1.ffn_down.weight")), &mean, &sd);
  EXPECT_NEAR(sd, 0.02 / 2.0, 0.001);  // 0.02 / sqrt(2 * n_layer)
  std::vector<float> norm = values(*g->find_tensor("blk.1.attn_norm.weight"));
  moments(norm, &mean, &sd);
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_GT(sd, 0.002);
  EXPECT_LT(sd, 0.02);
  for (float x : norm) EXPECT_NEAR(x, 1.0f, 0.04f);
  for (float x : q) ASSERT_LE(std::fabs(x), 0.02f * 3.47f);
}

TEST(RandomLlama, QuantisedTypesRoundTheF32Values) {
  auto f32 = parse(*make_random_llama(small_gqa(GgmlType::kF32, 5)));
  auto f16 = parse(*make_random_llama(small_gqa(GgmlType::kF16, 5)));
  auto q8 = parse(*make_random_llama(small_gqa(GgmlType::kQ8_0, 5)));
  ASSERT_TRUE(f32 && f16 && q8);
  size_t checked = 0;
  for (const gguf::TensorInfo& t : f32->tensors()) {
    std::vector<float> ref = values(t);
    std::vector<float> h = values(*f16->find_tensor(t.name));
    std::vector<float> q = values(*q8->find_tensor(t.name));
    ASSERT_EQ(ref.size(), h.size());
    ASSERT_EQ(ref.size(), q.size());
    const bool is_matrix = t.n_dims == 2;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!is_matrix) {  // norms stay F32 in every file
        ASSERT_EQ(ref[i], h[i]) << t.name;
        ASSERT_EQ(ref[i], q[i]) << t.name;
        continue;
      }
      ASSERT_EQ(h[i], gguf::fp16_to_fp32(gguf::fp32_to_fp16(ref[i]))) << t.name << " " << i;
    }
    if (is_matrix) {
      for (size_t b = 0; b < ref.size() / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(ref[b * 32 + j]));
        for (int j = 0; j < 32; ++j) {
          ASSERT_NEAR(q[b * 32 + j], ref[b * 32 + j], amax / 127.0f * 0.5f + amax * 1e-3f)
              << t.name << " " << b * 32 + j;
        }
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 21u);
}

// Every low-bit file holds exactly what gguf::quantize_row makes of the F32
// file's rows (whose bytes are llama.cpp's: gguf/quant_lowbit_test), and its
// metadata names the llama.cpp file type.
TEST(RandomLlama, LowBitTypesAreTheQuantisedF32Rows) {
  RandomLlamaSpec spec = small_gqa(GgmlType::kF32, 5);
  spec.n_embd = 256;
  spec.n_ff = 512;
  auto f32 = parse(*make_random_llama(spec));
  ASSERT_NE(f32, nullptr);
  const std::pair<GgmlType, uint32_t> cases[] = {{GgmlType::kQ4_0, 2}, {GgmlType::kQ4_1, 3}, {GgmlType::kQ5_0, 8},
                                                 {GgmlType::kQ5_1, 9}, {GgmlType::kQ4_K, 14}, {GgmlType::kQ5_K, 16},
                                                 {GgmlType::kQ6_K, 18}};
  for (const auto& [type, ftype] : cases) {
    spec.type = type;
    auto q = parse(*make_random_llama(spec));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(*q->get_i64("general.file_type"), ftype);
    for (const gguf::TensorInfo& t : f32->tensors()) {
      const gguf::TensorInfo* qt = q->find_tensor(t.name);
      ASSERT_NE(qt, nullptr);
      if (t.n_dims != 2) {
        EXPECT_EQ(qt->type, 0u) << t.name;
        continue;
      }
      ASSERT_EQ(qt->type, static_cast<uint32_t>(type)) << t.name;
      std::string want(static_cast<size_t>(qt->nbytes), '\0');
      const size_t rb = static_cast<size_t>(qt->nbytes / t.ne[1]);
      for (uint64_t r = 0; r < t.ne[1]; ++r)
        ASSERT_TRUE(gguf::quantize_row(type, reinterpret_cast<const float*>(t.data) + r * t.ne[0], want.data() + r * rb,
                                       t.ne[0]).ok());
      EXPECT_EQ(std::memcmp(want.data(), qt->data, want.size()), 0) << t.name << " " << qt->type;
    }
  }
}

TEST(RandomLlama, Q4KMMixFollowsLlamaCppRecipe) {
  RandomLlamaSpec spec = small_gqa(GgmlType::kF32, 5);
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.n_layer = 8;
  spec.mix = RandomLlamaMix::kQ4_K_M;
  auto g = parse(*make_random_llama(spec));
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(*g->get_i64("general.file_type"), 15);
  auto type_of = [&](const std::string& n) { return static_cast<GgmlType>(g->find_tensor(n)->type); };
  EXPECT_EQ(type_of("output.weight"), GgmlType::kQ6_K);
  EXPECT_EQ(type_of("token_embd.weight"), GgmlType::kQ4_K);
  // use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2  ->  layers 0, 3, 6, 7.
  for (uint32_t l = 0; l < 8; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const GgmlType more = (l == 0 || l == 3 || l == 6 || l == 7) ? GgmlType::kQ6_K : GgmlType::kQ4_K;
    EXPECT_EQ(type_of(p + "attn_v.weight"), more) << l;
    EXPECT_EQ(type_of(p + "ffn_down.weight"), more) << l;
    for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
      EXPECT_EQ(type_of(p + n), GgmlType::kQ4_K) << p << n;
  }
  // Tied: the head is token_embd, so it gets the head's Q6_K. Rows of 64
  // (n_embd) take llama-quantize's fallbacks: Q4_K -> Q5_0, Q6_K -> Q8_0,
  // the head Q8_0; ffn_down's rows are n_ff = 512 wide and stay K.
  spec.tied_output = true;
  EXPECT_EQ(random_llama_tensor_type(spec, "token_embd.weight", 0, 256), GgmlType::kQ6_K);
  EXPECT_EQ(random_llama_tensor_type(spec, "token_embd.weight", 0, 64), GgmlType::kQ8_0);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.1.attn_q.weight", 1, 64), GgmlType::kQ5_0);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.0.attn_v.weight", 0, 64), GgmlType::kQ8_0);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.0.ffn_down.weight", 0, 512), GgmlType::kQ6_K);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.1.attn_q.weight", 1, 48), GgmlType::kF16);
  spec.mix = RandomLlamaMix::kQ5_K_M;
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.1.attn_q.weight", 1, 256), GgmlType::kQ5_K);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.1.attn_q.weight", 1, 64), GgmlType::kQ5_1);
  EXPECT_EQ(random_llama_tensor_type(spec, "blk.3.ffn_down.weight", 3, 512), GgmlType::kQ6_K);
  // A 64-wide mix validates (fallbacks), a pure K type does not.
  spec = small_gqa(GgmlType::kF32);
  spec.mix = RandomLlamaMix::kQ4_K_M;
  EXPECT_TRUE(make_random_llama(spec).ok());
}

TEST(RandomLlama, TiedOutputAndFullVocab) {
  RandomLlamaSpec spec = small_gqa(GgmlType::kF16);
  spec.tied_output = true;
  spec.vocab_path = src_path("tests/data/ggml-vocab-llama-spm.gguf");
  RandomLlamaStats stats;
  auto w = random_llama_writer(Env::default_env(), spec, &stats);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(stats.n_vocab, 32000u);
  EXPECT_EQ(stats.n_params, random_llama_param_count(spec, 32000));
  EXPECT_EQ(stats.n_params, 32000u * 64 + 64 + 2u * (2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96));
  auto bytes = w->serialize();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), stats.file_size);
  auto g = parse(*bytes);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(g->tensors().size(), 2u + 2u * 9u);
  expect_shape(*g, "token_embd.weight", {64, 32000}, GgmlType::kF16);
  EXPECT_EQ(*g->get_string("tokenizer.ggml.pre"), "default");
  EXPECT_EQ(*g->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ((*g->get_array("tokenizer.ggml.scores", gguf::ValueType::kFloat32))->items.size(), 32000u);
}

TEST(RandomLlama, StreamingWriteMatchesInMemory) {
  RandomLlamaSpec spec = small_gqa(GgmlType::kQ8_0, 3);
  const std::string path = ::testing::TempDir() + "/spw_random_llama_test.gguf";
  ASSERT_TRUE(write_random_llama(Env::default_env(), path, spec).ok());
  auto on_disk = Env::default_env().read_file(path);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(*on_disk, *make_random_llama(spec));
  auto g = gguf::GgufFile::open(Env::default_env(), path);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ((*g)->tensors().size(), 21u);
}

TEST(RandomLlama, RejectsBadSpecs) {
  auto expect_bad = [](RandomLlamaSpec s, const char* needle) {
    auto r = make_random_llama(s);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    EXPECT_THAT(r.status().message(), HasSubstr(needle));
  };
  RandomLlamaSpec s = small_gqa(GgmlType::kF32);
  s.n_head = 5;
  expect_bad(s, "n_head 5");
  s = small_gqa(GgmlType::kF32);
  s.n_head_kv = 3;
  expect_bad(s, "n_head_kv 3");
  s = small_gqa(GgmlType::kQ8_0);
  s.n_ff = 100;
  expect_bad(s, "multiples of 32");
  s = small_gqa(GgmlType::kQ4_K);  // 64 and 96 are not multiples of 256
  expect_bad(s, "Q4_K needs n_embd and n_ff to be multiples of 256");
  s = small_gqa(GgmlType::kQ4_0);
  s.n_ff = 100;
  expect_bad(s, "Q4_0 needs n_embd and n_ff to be multiples of 32");
  s = small_gqa(GgmlType::kQ3_K);
  expect_bad(s, "Q3_K has no quantiser");
  s = small_gqa(GgmlType::kF32);
  s.n_layer = 0;
  expect_bad(s, "nonzero");
  s = small_gqa(GgmlType::kF32);
  s.vocab_path.clear();
  expect_bad(s, "vocab_path");
  s = small_gqa(GgmlType::kF32);
  s.vocab_path = src_path("tests/data/missing.gguf");
  EXPECT_EQ(make_random_llama(s).status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace spw::modelgen
