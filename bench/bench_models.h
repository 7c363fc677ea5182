// The generated models the benchmarks share (header-only): random weights
// with the real stories260K vocabulary, written by the project's own
// generator on first use and kept in a models folder, so every bench that
// names one measures the same file.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/env.h"
#include "gguf/ggml_types.h"
#include "tools/modelgen/random_llama.h"

namespace spw::bench {

// A llama of this shape and tensor type.
inline modelgen::RandomLlamaSpec llama_spec(int32_t n_embd, int32_t n_layer, int32_t n_head, int32_t n_ff,
                                            gguf::GgmlType type) {
  modelgen::RandomLlamaSpec spec;
  spec.n_embd = n_embd;
  spec.n_layer = n_layer;
  spec.n_head = n_head;
  spec.n_head_kv = n_head;
  spec.n_ff = n_ff;
  spec.n_ctx = 2048;
  spec.type = type;
  spec.vocab_path = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";
  return spec;
}

// models_dir/name, generated from `spec` unless it exists; "" (after a line
// on stderr naming `who`) when it cannot be written.
inline std::string ensure_model(const std::string& models_dir, const std::string& name,
                                const modelgen::RandomLlamaSpec& spec, const char* who) {
  std::filesystem::create_directories(models_dir);
  const std::string path = models_dir + "/" + name;
  if (std::filesystem::exists(path)) return path;
  const Status st = modelgen::write_random_llama(Env::default_env(), path, spec);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: generating %s: %s\n", who, path.c_str(), st.to_string().c_str());
    return "";
  }
  return path;
}

// The 110M-parameter Q8_0 model (~87 MiB) of recovery, checkpoint and
// batching benchmarks.
inline std::string ensure_110m_q8_0(const std::string& models_dir, const char* who) {
  return ensure_model(models_dir, "recovery-110m-q8_0.gguf", llama_spec(768, 12, 12, 2048, gguf::GgmlType::kQ8_0),
                      who);
}

}  // namespace spw::bench
