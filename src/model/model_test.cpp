// Model loading: hparams, binding, and every documented load error.
#include "model/model.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "engine/engine_test_util.h"

namespace spw {
namespace {

using testing::model_from_bytes;
using testing::small_spec;

// Rebuilds a GGUF with edits: `skip` drops tensors, `retype` changes one.
std::string rebuild(const gguf::GgufFile& f, const std::function<void(gguf::GgufWriter&)>& extra_meta,
                    const std::set<std::string>& skip,
                    const std::function<bool(const gguf::TensorInfo&, gguf::GgufWriter&)>& replace = {}) {
  gguf::GgufWriter w(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  if (extra_meta) extra_meta(w);
  for (const auto& t : f.tensors()) {
    if (skip.count(t.name)) continue;
    if (replace && replace(t, w)) continue;
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    EXPECT_TRUE(w.add_tensor(t.name, static_cast<gguf::GgmlType>(t.type), dims,
                             std::string(reinterpret_cast<const char*>(t.data), t.nbytes))
                    .ok());
  }
  auto bytes = w.serialize();
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

// `f` with one more tensor, `name`: 8 F32 zeros (a tensor the loader must
// refuse by its name, whatever it holds).
std::string with_extra_tensor(const gguf::GgufFile& f, const std::string& name) {
  return rebuild(f, [&](gguf::GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor(name, gguf::GgmlType::kF32, {8}, std::string(8 * sizeof(float), '\0')).ok());
  }, {});
}

std::unique_ptr<gguf::GgufFile> base_file(gguf::GgmlType type = gguf::GgmlType::kF32) {
  auto bytes = modelgen::make_random_llama(small_spec(type));
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto f = gguf::GgufFile::parse(make_memory_file(*bytes));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return std::move(*f);
}

TEST(Model, LoadsStories260K) {
  auto m = testing::stories();
  ASSERT_NE(m, nullptr);
  const auto& hp = m->hparams();
  EXPECT_EQ(hp.n_embd, 64);
  EXPECT_EQ(hp.n_layer, 5);
  EXPECT_EQ(hp.n_head, 8);
  EXPECT_EQ(hp.n_head_kv, 4);
  EXPECT_EQ(hp.n_vocab, 512);
  EXPECT_EQ(hp.n_rot, 8);
  EXPECT_EQ(m->tokenizer().n_vocab(), 512);
  EXPECT_GT(m->n_params(), 200000);
  EXPECT_LT(m->n_params(), 320000);
  EXPECT_FALSE(m->fingerprint().empty());
  EXPECT_NE(m->fingerprint().find("types=F32"), std::string::npos);
}

TEST(Model, BindsGeneratedModelsOfEveryType) {
  for (auto type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kQ8_0}) {
    auto m = testing::random_model(small_spec(type));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->hparams().n_head_kv, 2);
    EXPECT_EQ(m->layer(1).wk.n_rows, 32);
    EXPECT_EQ(static_cast<uint32_t>(m->layer(0).wq.type), static_cast<uint32_t>(type));
    EXPECT_FALSE(m->output_tied());
    EXPECT_EQ(m->bytes_by_type().count(gguf::ggml_type_name(static_cast<uint32_t>(type))), 1u);
  }
}

TEST(Model, TiedOutputUsesTokenEmbedding) {
  auto spec = small_spec();
  spec.tied_output = true;
  auto m = testing::random_model(spec);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->output_tied());
  EXPECT_EQ(m->output().data, m->tok_embd().data);
}

TEST(Model, FingerprintDiffersBySeedAndType) {
  auto a = testing::random_model(small_spec());
  auto spec = small_spec();
  spec.seed = 8;
  auto b = testing::random_model(spec);
  auto c = testing::random_model(small_spec(gguf::GgmlType::kF16));
  auto a2 = testing::random_model(small_spec());
  ASSERT_TRUE(a && b && c && a2);
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  EXPECT_NE(a->fingerprint(), c->fingerprint());
  EXPECT_EQ(a->fingerprint(), a2->fingerprint());
  EXPECT_EQ(a->fingerprint_hash(), a2->fingerprint_hash());
}

TEST(Model, MissingTensorIsNotFound) {
  auto f = base_file();
  auto r = model_from_bytes(rebuild(*f, {}, {"blk.1.ffn_up.weight"}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("blk.1.ffn_up.weight"), std::string::npos) << r.status().to_string();
}

TEST(Model, WrongArchitectureIsInvalidArgument) {
  auto f = base_file();
  auto r = model_from_bytes(rebuild(*f, [](gguf::GgufWriter& w) {
    w.set("general.architecture", gguf::Value::str("gpt2"));
  }, {}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos);
  EXPECT_NE(r.status().message().find("llama, qwen2, qwen3, phi3"), std::string::npos) << r.status().to_string();
}

// Phi-3's fused tensors are bound as row ranges of the file's bytes: Q, K, V
// are consecutive rows of attn_qkv, gate and up the two halves of ffn_up.
TEST(Model, Phi3FusedTensorsAreBoundAsRowRanges) {
  auto spec = small_spec(gguf::GgmlType::kQ8_0);
  spec.arch = "phi3";
  auto bytes = modelgen::make_random_llama(spec);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto f = gguf::GgufFile::parse(make_memory_file(*bytes));
  ASSERT_TRUE(f.ok());
  const gguf::TensorInfo* qkv = (*f)->find_tensor("blk.1.attn_qkv.weight");
  const gguf::TensorInfo* up = (*f)->find_tensor("blk.1.ffn_up.weight");
  ASSERT_NE(qkv, nullptr);
  ASSERT_NE(up, nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.1.ffn_gate.weight"), nullptr);
  auto m = Model::load_from(std::move(*f));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const LlamaHparams& hp = (*m)->hparams();
  const LlamaLayerWeights& L = (*m)->layer(1);
  const size_t row = L.wq.row_bytes;
  EXPECT_EQ(L.wq.data, qkv->data);
  EXPECT_EQ(L.wq.n_rows, hp.n_embd_q());
  EXPECT_EQ(L.wk.data, qkv->data + row * static_cast<size_t>(hp.n_embd_q()));
  EXPECT_EQ(L.wv.data, L.wk.data + row * static_cast<size_t>(hp.n_embd_kv()));
  EXPECT_EQ(L.wv.data + L.wv.nbytes(), qkv->data + qkv->nbytes);
  EXPECT_EQ(L.w_gate.data, up->data);
  EXPECT_EQ(L.w_up.data, up->data + up->nbytes / 2);
  EXPECT_EQ(L.w_up.n_rows, hp.n_ff);
  EXPECT_EQ(*L.w_up.name, "blk.1.ffn_up.weight");
  // Parameters and bytes count the fused tensors once, as the file has them.
  EXPECT_EQ(static_cast<uint64_t>((*m)->n_params()), modelgen::random_llama_param_count(spec, 512));
}

modelgen::RandomLlamaSpec moe_spec(const char* arch) {
  auto spec = small_spec(gguf::GgmlType::kQ8_0);
  spec.arch = arch;
  spec.n_expert = 4;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 64;
  spec.n_ff_shexp = 96;
  return spec;
}

std::unique_ptr<gguf::GgufFile> parsed(const modelgen::RandomLlamaSpec& spec) {
  auto bytes = modelgen::make_random_llama(spec);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto f = gguf::GgufFile::parse(make_memory_file(*bytes));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return std::move(*f);
}

// A mixture of experts: the router, one matrix per expert pointing into the
// 3-D tensors, Qwen2-MoE's shared expert; the bytes a token streams count
// the experts it uses, not all of them.
TEST(Model, ExpertsAreBoundAsMatricesOfTheStackedTensors) {
  for (const char* arch : {"qwen2moe", "qwen3moe", "llama"}) {
    SCOPED_TRACE(arch);
    const auto spec = moe_spec(arch);
    auto f = parsed(spec);
    const gguf::TensorInfo* gate = f->find_tensor("blk.1.ffn_gate_exps.weight");
    const gguf::TensorInfo* down = f->find_tensor("blk.1.ffn_down_exps.weight");
    ASSERT_NE(gate, nullptr);
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(f->find_tensor("blk.1.ffn_gate.weight"), nullptr);
    auto m = Model::load_from(std::move(f));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const LlamaHparams& hp = (*m)->hparams();
    EXPECT_EQ(hp.n_expert, 4);
    EXPECT_EQ(hp.n_expert_used, 2);
    EXPECT_EQ(hp.n_ff_exp, 64);
    EXPECT_EQ(hp.moe_norm_topk, std::string(arch) != "qwen2moe");
    const LlamaLayerWeights& L = (*m)->layer(1);
    ASSERT_TRUE(L.is_moe());
    EXPECT_EQ(L.w_gate.data, nullptr);
    EXPECT_EQ(L.moe.router.n_rows, 4);
    EXPECT_EQ(L.moe.router.type, gguf::GgmlType::kF32);  // left unquantised, as llama.cpp does
    ASSERT_EQ(L.moe.gate.size(), 4u);
    for (size_t e = 0; e < 4; ++e) {
      EXPECT_EQ(L.moe.gate[e].n_rows, 64);
      EXPECT_EQ(L.moe.gate[e].n_cols, hp.n_embd);
      EXPECT_EQ(L.moe.gate[e].data, gate->data + e * gate->nbytes / 4);
      EXPECT_EQ(L.moe.down[e].n_rows, hp.n_embd);
      EXPECT_EQ(L.moe.down[e].data, down->data + e * down->nbytes / 4);
    }
    const bool shared = std::string(arch) == "qwen2moe";
    EXPECT_EQ(hp.n_ff_shexp, shared ? 96 : 0);
    EXPECT_EQ(L.moe.shared_gate.n_rows, shared ? 96 : 0);
    EXPECT_EQ(L.moe.shared_router.size(), shared ? static_cast<size_t>(hp.n_embd) : 0u);
    int n_matrices = 0;
    L.for_each_matrix([&](const WeightMatrix&) { ++n_matrices; });
    EXPECT_EQ(n_matrices, 4 + 1 + 3 * 4 + (shared ? 3 : 0));
    EXPECT_EQ(static_cast<uint64_t>((*m)->n_params()), modelgen::random_llama_param_count(spec, 512));
    // Per token: attention, the router, 2 of the 4 experts, the shared expert, the head.
    uint64_t per_token = (*m)->output().nbytes();
    for (int32_t il = 0; il < hp.n_layer; ++il) {
      const LlamaLayerWeights& l = (*m)->layer(il);
      per_token += l.wq.nbytes() + l.wk.nbytes() + l.wv.nbytes() + l.wo.nbytes() + l.moe.router.nbytes() +
                   2 * (l.moe.gate[0].nbytes() + l.moe.up[0].nbytes() + l.moe.down[0].nbytes()) +
                   l.moe.shared_gate.nbytes() + l.moe.shared_up.nbytes() + l.moe.shared_down.nbytes();
    }
    EXPECT_EQ((*m)->weight_bytes_per_token(), per_token);
  }
}

// What a mixture of experts cannot run with is refused by name.
TEST(Model, ExpertErrorsNameTheProblem) {
  auto f = parsed(moe_spec("qwen3moe"));
  const auto expect_error = [](const std::string& bytes, StatusCode code, const std::string& needle) {
    auto r = model_from_bytes(bytes);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  };
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_count", gguf::Value::u32(0)); }, {}),
               StatusCode::kInvalidArgument, "qwen3moe.expert_count");
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_used_count", gguf::Value::u32(5)); }, {}),
               StatusCode::kInvalidArgument, "qwen3moe.expert_used_count");
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_count", gguf::Value::u32(100000)); }, {}),
               StatusCode::kInvalidArgument, "qwen3moe.expert_count");
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_gating_func", gguf::Value::u32(2)); }, {}),
               StatusCode::kInvalidArgument, "sigmoid");
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_weights_scale", gguf::Value::f32(-1)); },
                       {}),
               StatusCode::kInvalidArgument, "qwen3moe.expert_weights_scale");
  auto scaled = model_from_bytes(
      rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_weights_scale", gguf::Value::f32(2.5f)); }, {}));
  ASSERT_TRUE(scaled.ok()) << scaled.status().to_string();
  EXPECT_FLOAT_EQ((*scaled)->hparams().moe_weights_scale, 2.5f);
  auto unset = model_from_bytes(
      rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_weights_scale", gguf::Value::f32(0)); }, {}));
  ASSERT_TRUE(unset.ok()) << unset.status().to_string();
  EXPECT_FLOAT_EQ((*unset)->hparams().moe_weights_scale, 1.0f);
  expect_error(rebuild(*f, {}, {"blk.0.ffn_up_exps.weight"}), StatusCode::kNotFound, "blk.0.ffn_up_exps.weight");
  // One expert fewer in the stack than expert_count: the shape, named.
  expect_error(rebuild(*f, [](gguf::GgufWriter& w) { w.set("qwen3moe.expert_count", gguf::Value::u32(3)); }, {}),
               StatusCode::kCorruption, "ffn_gate_inp.weight");
  // The early Mixtral layout, one 2-D tensor per expert.
  expect_error(with_extra_tensor(*f, "blk.0.ffn_gate.0.weight"), StatusCode::kInvalidArgument,
               "blk.0.ffn_gate.0.weight");
  // A dense architecture ignores a stray expert_count.
  auto qwen2 = small_spec(gguf::GgmlType::kF32);
  qwen2.arch = "qwen2";
  auto dense = parsed(qwen2);
  auto m = model_from_bytes(rebuild(*dense, [](gguf::GgufWriter& w) {
    w.set("qwen2.expert_count", gguf::Value::u32(8));
  }, {}));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_FALSE((*m)->hparams().moe());
}

// Phi-3's 128k variants (LongRoPE) are refused naming the tensor.
TEST(Model, LongRopeIsRefusedByName) {
  auto spec = small_spec();
  spec.arch = "phi3";
  auto bytes = modelgen::make_random_llama(spec);
  ASSERT_TRUE(bytes.ok());
  auto f = gguf::GgufFile::parse(make_memory_file(*bytes));
  ASSERT_TRUE(f.ok());
  auto r = model_from_bytes(with_extra_tensor(**f, "rope_factors_long.weight"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rope_factors_long.weight"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("LongRoPE"), std::string::npos) << r.status().to_string();
}

TEST(Model, RopeScalingIsReadAppliedOrRefusedByName) {
  auto f = base_file();
  auto linear = model_from_bytes(rebuild(*f, [](gguf::GgufWriter& w) {
    w.set("llama.rope.scaling.type", gguf::Value::str("linear"));
    w.set("llama.rope.scaling.factor", gguf::Value::f32(4.0f));
  }, {}));
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  EXPECT_FLOAT_EQ((*linear)->hparams().rope_freq_scale, 0.25f);
  auto yarn = model_from_bytes(rebuild(*f, [](gguf::GgufWriter& w) {
    w.set("llama.rope.scaling.type", gguf::Value::str("yarn"));
  }, {}));
  ASSERT_FALSE(yarn.ok());
  EXPECT_EQ(yarn.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(yarn.status().message().find("'yarn'"), std::string::npos) << yarn.status().to_string();
  // Llama 3's frequency factors: a tensor of n_rot / 2 values, bound when present.
  const int32_t half = (*linear)->hparams().n_rot / 2;
  auto factors = model_from_bytes(rebuild(*f, [&](gguf::GgufWriter& w) {
    std::vector<float> v(static_cast<size_t>(half), 1.0f);
    v.back() = 8.0f;
    EXPECT_TRUE(w.add_tensor("rope_freqs.weight", gguf::GgmlType::kF32, {static_cast<uint64_t>(half)},
                             std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4)).ok());
  }, {}));
  ASSERT_TRUE(factors.ok()) << factors.status().to_string();
  ASSERT_EQ((*factors)->rope_freq_factors().size(), static_cast<size_t>(half));
  EXPECT_EQ((*factors)->rope_freq_factors().back(), 8.0f);
}

TEST(Model, ArchitectureSpecificTensorsAreRequired) {
  // A qwen2 file is a llama file with biases: without them, NotFound naming one.
  auto f = base_file();
  auto r = model_from_bytes(rebuild(*f, [&](gguf::GgufWriter& w) {
    w.set("general.architecture", gguf::Value::str("qwen2"));
    for (const char* k : {"context_length", "embedding_length", "block_count", "feed_forward_length",
                          "attention.head_count", "attention.head_count_kv"}) {
      const gguf::Value* v = f->find(std::string("llama.") + k);
      ASSERT_NE(v, nullptr) << k;
      w.set(std::string("qwen2.") + k, *v);
    }
  }, {}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
  EXPECT_NE(r.status().message().find("blk.0.attn_q.bias"), std::string::npos) << r.status().to_string();
}

TEST(Model, WrongShapeIsCorruption) {
  auto f = base_file();
  auto r = model_from_bytes(rebuild(*f, {}, {}, [](const gguf::TensorInfo& t, gguf::GgufWriter& w) {
    if (t.name != "blk.0.ffn_gate.weight") return false;
    // Same bytes, transposed shape: [n_ff, n_embd] instead of [n_embd, n_ff].
    EXPECT_TRUE(w.add_tensor(t.name, gguf::GgmlType::kF32, {t.ne[1], t.ne[0]},
                             std::string(reinterpret_cast<const char*>(t.data), t.nbytes)).ok());
    return true;
  }));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("blk.0.ffn_gate.weight"), std::string::npos);
  EXPECT_NE(r.status().message().find("[96, 64]"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("[64, 96]"), std::string::npos) << r.status().to_string();
}

// blk.1.attn_v.weight ([64, 32]) replaced by zero bytes of `type`.
Result<std::shared_ptr<const Model>> with_attn_v_of(const gguf::GgufFile& f, gguf::GgmlType type) {
  return model_from_bytes(rebuild(f, {}, {}, [type](const gguf::TensorInfo& t, gguf::GgufWriter& w) {
    if (t.name != "blk.1.attn_v.weight") return false;
    const uint64_t n = t.ne[0] * t.ne[1];
    auto nb = gguf::ggml_nbytes(static_cast<uint32_t>(type), n);
    EXPECT_TRUE(nb.ok());
    EXPECT_TRUE(w.add_tensor(t.name, type, {t.ne[0], t.ne[1]}, std::string(*nb, '\0')).ok());
    return true;
  }));
}

TEST(Model, UnsupportedTypeIsInvalidArgument) {
  auto f = base_file();
  auto r = with_attn_v_of(*f, gguf::GgmlType::kIQ4_NL);  // a 32-block type Spillway does not compute
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("blk.1.attn_v.weight"), std::string::npos);
  EXPECT_NE(r.status().message().find("IQ4_NL"), std::string::npos) << r.status().to_string();
}

TEST(Model, LowBitTypesBindInAMixedFile) {
  auto f = base_file();
  // 64-wide rows are whole blocks of the 32-element types. (A K type there
  // would be a quarter super-block: the GGUF reader already refuses any
  // tensor whose ne[0] is not a multiple of its block, naming it -- see
  // gguf_test's GgufHostile.TensorShapeAndType -- and Model::bind checks the
  // row length again for its matrices.)
  for (auto type : {gguf::GgmlType::kQ4_0, gguf::GgmlType::kQ4_1, gguf::GgmlType::kQ5_0, gguf::GgmlType::kQ5_1}) {
    auto r = with_attn_v_of(*f, type);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)->layer(1).wv.type, type);
    EXPECT_EQ((*r)->layer(0).wv.type, gguf::GgmlType::kF32);  // a mixed file binds as it is
    EXPECT_EQ((*r)->bytes_by_type().count(gguf::ggml_type_name(static_cast<uint32_t>(type))), 1u);
  }
}

TEST(Model, Q4KMMixBindsEachTensorWithItsType) {
  auto spec = small_spec();
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.n_layer = 3;
  spec.mix = modelgen::RandomLlamaMix::kQ4_K_M;
  auto m = testing::random_model(spec);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->output().type, gguf::GgmlType::kQ6_K);
  EXPECT_EQ(m->tok_embd().type, gguf::GgmlType::kQ4_K);
  EXPECT_EQ(m->layer(2).wv.type, gguf::GgmlType::kQ6_K);  // use_more_bits(2, 3): 2 >= 7 * 3 / 8
  EXPECT_EQ(m->layer(2).w_down.type, gguf::GgmlType::kQ6_K);
  EXPECT_EQ(m->layer(1).wv.type, gguf::GgmlType::kQ4_K);
  EXPECT_EQ(m->layer(1).wq.type, gguf::GgmlType::kQ4_K);
  EXPECT_EQ(m->bytes_by_type().size(), 3u);  // F32 norms, Q4_K, Q6_K
  EXPECT_NE(m->fingerprint().find("types=F32,Q4_K,Q6_K"), std::string::npos) << m->fingerprint();
}

TEST(Model, BadHparamsNameTheKey) {
  auto f = base_file();
  auto r = model_from_bytes(rebuild(*f, [](gguf::GgufWriter& w) {
    w.set("llama.attention.head_count_kv", gguf::Value::u32(3));
  }, {}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("llama.attention.head_count_kv = 3"), std::string::npos)
      << r.status().to_string();

  auto r2 = model_from_bytes(rebuild(*f, [](gguf::GgufWriter& w) {
    w.set("llama.rope.dimension_count", gguf::Value::u32(7));
  }, {}));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("llama.rope.dimension_count = 7"), std::string::npos);
}

TEST(Model, MissingFileIsIOError) {
  auto r = Model::load(Env::default_env(), "/nonexistent/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
}

}  // namespace
}  // namespace spw
