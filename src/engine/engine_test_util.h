// Helpers shared by the engine's tests: load generated / stored models, make
// CPU sessions. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/env.h"
#include "kv/kv_cache.h"
#include "engine/session.h"
#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "model/model.h"
#include "tools/modelgen/random_llama.h"

namespace spw::testing {

inline std::string source_path(const std::string& rel) { return std::string(SPILLWAY_SOURCE_DIR) + "/" + rel; }
inline std::string stories_path() { return source_path("models/stories260K.gguf"); }

// The bundled model's tokenizer alone (no weights mapped), loaded once; null
// when the file cannot be read.
inline std::shared_ptr<const Tokenizer> stories_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = []() -> std::shared_ptr<const Tokenizer> {
    auto file = gguf::GgufFile::open(Env::default_env(), stories_path());
    if (!file.ok()) return nullptr;
    auto t = Tokenizer::from_gguf(**file);
    if (!t.ok()) return nullptr;
    return std::shared_ptr<const Tokenizer>(std::move(*t));
  }();
  return tok;
}

inline modelgen::RandomLlamaSpec small_spec(gguf::GgmlType type = gguf::GgmlType::kF32) {
  modelgen::RandomLlamaSpec s;
  s.n_embd = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 96;
  s.n_ctx = 128;
  s.type = type;
  s.seed = 7;
  s.vocab_path = stories_path();  // 512 tokens: small output head
  return s;
}

// A small Gemma (model/arch.h): gemma2 with caps its random scores and
// logits reach, or gemma3's five sliding layers and one global with linear
// RoPE scaling on the global one; a window of 4, so that a few dozen
// positions cross it.
inline modelgen::RandomLlamaSpec gemma_spec(const std::string& arch, gguf::GgmlType type = gguf::GgmlType::kF32) {
  modelgen::RandomLlamaSpec s = small_spec(type);
  s.arch = arch;
  s.head_dim = 32;
  s.sliding_window = 4;
  if (arch == "gemma2") {
    s.n_layer = 3;
    s.attn_softcap = 0.05f;
    s.final_softcap = 0.5f;
  } else {
    s.n_layer = 6;
    s.rope_freq_base = 1000000.0f;
    s.rope_scale_linear = 8.0f;
  }
  return s;
}

inline Result<std::shared_ptr<const Model>> model_from_bytes(std::string bytes) {
  SPW_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::parse(make_memory_file(std::move(bytes), "<generated>")));
  return Model::load_from(std::move(file));
}

inline std::shared_ptr<const Model> random_model(const modelgen::RandomLlamaSpec& spec) {
  auto bytes = modelgen::make_random_llama(spec);
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  if (!bytes.ok()) return nullptr;
  auto m = model_from_bytes(std::move(*bytes));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

// Rewrites a GGUF with each F32 2-D weight converted to target_of(tensor)
// (metadata and 1-D norm weights unchanged). Matrices whose rows are not a
// multiple of the target's block stay F32.
inline std::string reencode(const gguf::GgufFile& f,
                            const std::function<gguf::GgmlType(const gguf::TensorInfo&)>& target_of) {
  gguf::GgufWriter w(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    const gguf::GgmlType target = t.n_dims == 2 ? target_of(t) : gguf::GgmlType::kF32;
    const bool convert = t.n_dims == 2 && t.type == static_cast<uint32_t>(gguf::GgmlType::kF32) &&
                         t.ne[0] % gguf::ggml_type_info(static_cast<uint32_t>(target))->block_size == 0;
    if (!convert) {
      EXPECT_TRUE(w.add_tensor(t.name, static_cast<gguf::GgmlType>(t.type), dims,
                               std::string(reinterpret_cast<const char*>(t.data), t.nbytes))
                      .ok());
      continue;
    }
    auto nbytes = gguf::ggml_nbytes(static_cast<uint32_t>(target), t.n_elements);
    EXPECT_TRUE(nbytes.ok());
    std::string out(*nbytes, '\0');
    std::vector<float> row(t.ne[0]);
    const size_t row_bytes = *nbytes / t.ne[1];
    for (uint64_t r = 0; r < t.ne[1]; ++r) {
      std::memcpy(row.data(), t.data + r * t.ne[0] * 4, t.ne[0] * 4);
      EXPECT_TRUE(gguf::quantize_row(target, row.data(), out.data() + r * row_bytes, t.ne[0]).ok());
    }
    EXPECT_TRUE(w.add_tensor(t.name, target, dims, std::move(out)).ok());
  }
  auto bytes = w.serialize();
  EXPECT_TRUE(bytes.ok()) << bytes.status().to_string();
  return bytes.ok() ? *bytes : std::string();
}

// Every 2-D weight to one type.
inline std::string reencode(const gguf::GgufFile& f, gguf::GgmlType target) {
  return reencode(f, [target](const gguf::TensorInfo&) { return target; });
}

inline std::shared_ptr<const Model> stories() {
  auto m = Model::load(Env::default_env(), stories_path());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

inline std::shared_ptr<KvPool> make_pool(const Model& m, int32_t block_tokens, int32_t n_blocks,
                                         KvType type = KvType::kF32) {
  KvPoolOptions o;
  o.type = type;
  o.head_dim = m.hparams().head_dim();
  o.layer_begin = 0;
  o.layer_end = m.hparams().n_layer;
  o.n_embd_kv = m.hparams().n_embd_kv();
  o.block_tokens = block_tokens;
  o.n_blocks = n_blocks;
  auto p = KvPool::create(o);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : nullptr;
}

inline std::unique_ptr<Session> make_session(std::shared_ptr<const Model> m, std::shared_ptr<Backend> backend,
                                             std::shared_ptr<KvPool> pool, SessionOptions so = {}) {
  auto s = Session::create(std::move(m), std::move(backend), std::move(pool), so);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

}  // namespace spw::testing
