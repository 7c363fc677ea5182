// Hyper-parameters of a llama-family transformer read from GGUF metadata.
//
// Contract: read_llama_hparams() refuses (InvalidArgument naming it and the
// supported ones) a general.architecture that model/arch.h does not list, takes
// that architecture's RoPE style, and reads its `<arch>.*` keys: context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count,
// attention.head_count_kv [default head_count], attention.key_length and
// attention.value_length [default embedding_length / head_count; they must be
// equal], rope.dimension_count [default the head size], rope.freq_base
// [default 10000], attention.layer_norm_rms_epsilon [default 1e-5], and the
// RoPE scaling keys: rope.scaling.type "none" or "linear" (with
// rope.scaling.factor, or the older rope.scale_linear), where "linear" divides
// every position by the factor; "llama3" (Llama 3.1+: the frequency factors
// come from the rope_freqs.weight tensor, which the model binds; the scaling
// keys only describe how they were made). "yarn" and "longrope" are refused by
// name (their attention scaling is not implemented). n_vocab comes from the
// token embedding's second dimension.
// A missing required key is NotFound naming it; a wrong type is InvalidArgument
// (from the GGUF getters); a value that is inconsistent (zero, not divisible,
// n_rot odd or > head_dim, ...) is InvalidArgument naming the key and value.
// Thread safety: plain values / pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "gguf/gguf.h"

namespace spw {

// Which pairs of a head's dimensions RoPE rotates together: llama's "normal"
// (2i, 2i+1) or GPT-NeoX's (i, i + n_rot/2), which Qwen2/Qwen3 use.
enum class RopeStyle { kNormal, kNeox };

// How a model's GGUF says its token states pool into one sentence
// embedding (<arch>.pooling_type: 0 none, 1 mean, 2 cls, 3 last; 4 rank, a
// reranker's, is kept as kRank and not embedded).
enum class Pooling { kNone, kMean, kCls, kLast, kRank };
std::string_view pooling_name(Pooling p);  // "none", "mean", "cls", "last", "rank"

struct LlamaHparams {
  std::string arch = "llama";  // general.architecture; the keys' prefix
  int32_t n_ctx_train = 0;  // <arch>.context_length
  int32_t n_embd = 0;       // <arch>.embedding_length
  int32_t n_layer = 0;      // <arch>.block_count
  int32_t n_ff = 0;         // <arch>.feed_forward_length
  int32_t n_head = 0;       // <arch>.attention.head_count
  int32_t n_head_kv = 0;    // <arch>.attention.head_count_kv
  int32_t n_embd_head = 0;  // <arch>.attention.key_length (0: n_embd / n_head)
  int32_t n_rot = 0;        // <arch>.rope.dimension_count
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // positions are multiplied by this (1 / the linear factor)
  RopeStyle rope_style = RopeStyle::kNormal;
  float rms_eps = 1e-5f;
  int32_t n_vocab = 0;
  Pooling pooling = Pooling::kNone;  // <arch>.pooling_type (absent: none)
  bool causal = true;                // <arch>.attention.causal (absent: true)

  int32_t head_dim() const {
    if (n_embd_head > 0) return n_embd_head;
    return n_head > 0 ? n_embd / n_head : 0;
  }
  int32_t n_embd_q() const { return head_dim() * n_head; }     // Q (and attention output) floats per token
  int32_t n_embd_kv() const { return head_dim() * n_head_kv; }  // K (or V) floats per token per layer
  int32_t n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 0; }

  // InvalidArgument naming the offending key and value.
  Status validate() const;
  std::string to_string() const;
};

Result<LlamaHparams> read_llama_hparams(const gguf::GgufFile& file);

}  // namespace spw
