// Llama hyper-parameters read from GGUF metadata.
//
// Contract: read_llama_hparams() reads the `llama.*` keys (context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count,
// attention.head_count_kv [default head_count], rope.dimension_count [default
// head_dim], rope.freq_base [default 10000], attention.layer_norm_rms_epsilon
// [default 1e-5]) and takes n_vocab from the token embedding's second dimension.
// A missing required key is NotFound naming it; a wrong type is InvalidArgument
// (from the GGUF getters); a value that is inconsistent (zero, not divisible,
// n_rot odd or > head_dim, ...) is InvalidArgument naming the key and value.
// Thread safety: plain values / pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "gguf/gguf.h"

namespace spw {

struct LlamaHparams {
  int32_t n_ctx_train = 0;  // llama.context_length
  int32_t n_embd = 0;       // llama.embedding_length
  int32_t n_layer = 0;      // llama.block_count
  int32_t n_ff = 0;         // llama.feed_forward_length
  int32_t n_head = 0;       // llama.attention.head_count
  int32_t n_head_kv = 0;    // llama.attention.head_count_kv
  int32_t n_rot = 0;        // llama.rope.dimension_count
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  int32_t n_vocab = 0;

  int32_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  int32_t n_embd_kv() const { return head_dim() * n_head_kv; }  // K (or V) floats per token per layer
  int32_t n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 0; }

  // InvalidArgument naming the offending key and value.
  Status validate() const;
  std::string to_string() const;
};

Result<LlamaHparams> read_llama_hparams(const gguf::GgufFile& file);

}  // namespace spw
