// Helpers shared by the engine's tests: load generated / stored models, make
// CPU sessions. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/env.h"
#include "engine/kv_cache.h"
#include "engine/session.h"
#include "gguf/gguf.h"
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

inline std::shared_ptr<const Model> stories() {
  auto m = Model::load(Env::default_env(), stories_path());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

inline std::shared_ptr<KvPool> make_pool(const Model& m, int32_t block_tokens, int32_t n_blocks) {
  KvPoolOptions o;
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
