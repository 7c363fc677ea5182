// Generated models shared by the estimator's CPU and Vulkan accuracy tests.
// Test-only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine_test_util.h"
#include "tools/modelgen/random_llama.h"

namespace spw::admission::testing {

// A small llama shape over the 512-token stories vocabulary (a small output
// head keeps lavapipe and ASan runs short).
inline modelgen::RandomLlamaSpec spec(gguf::GgmlType type, uint32_t n_embd, uint32_t n_ff, uint32_t n_head,
                                      uint32_t n_head_kv, uint32_t n_layer, bool tied = false, uint64_t seed = 11) {
  modelgen::RandomLlamaSpec s;
  s.n_embd = n_embd;
  s.n_ff = n_ff;
  s.n_head = n_head;
  s.n_head_kv = n_head_kv;
  s.n_layer = n_layer;
  s.n_ctx = 512;
  s.type = type;
  s.tied_output = tied;
  s.seed = seed;
  s.vocab_path = spw::testing::stories_path();
  return s;
}

// `s` as another architecture (model/arch.h): qwen2's biases, qwen3's Q/K
// norms with a head size of its own.
inline modelgen::RandomLlamaSpec as_arch(modelgen::RandomLlamaSpec s, const char* arch, uint32_t head_dim = 0) {
  s.arch = arch;
  s.head_dim = head_dim;
  return s;
}

// `s` as a mixture of experts of `arch` (qwen2moe, qwen3moe; llama for
// Mixtral): n experts, `used` per token, each n_ff_exp wide.
inline modelgen::RandomLlamaSpec as_moe(modelgen::RandomLlamaSpec s, const char* arch, uint32_t n, uint32_t used,
                                        uint32_t n_ff_exp) {
  s.arch = arch;
  s.n_expert = n;
  s.n_expert_used = used;
  s.n_ff_exp = n_ff_exp;
  return s;
}

// The model of `s`, loaded from memory (null, with a test failure, on error).
inline std::shared_ptr<const Model> generated(const modelgen::RandomLlamaSpec& s) {
  return spw::testing::random_model(s);
}

}  // namespace spw::admission::testing
