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
// Mixture of experts (model/arch.h): expert_count [0: dense, where the
// architecture allows it; qwen2moe and qwen3moe need it], expert_used_count
// (1 <= it <= expert_count), expert_feed_forward_length [default:
// feed_forward_length for llama, feed_forward_length / expert_used_count
// for qwen2moe and qwen3moe, as llama.cpp], for a shared expert
// expert_shared_feed_forward_length [default feed_forward_length];
// expert_weights_norm (bool) overrides the architecture's renormalisation
// when present; expert_weights_scale multiplies the chosen experts' weights
// after it (absent or 0: 1, as llama.cpp; < 0 refused); expert_gating_func
// other than 1 (softmax; 2 is DeepSeek's sigmoid) is refused by name; more
// than 1024 experts is refused. feed_forward_length may be absent from an
// MoE file (it then takes the expert width).
// Gemma (model/arch.h): embd_scale sqrt(n_embd), post-norms and a GELU FFN;
// gemma2 reads attn_logit_softcapping [50] and final_logit_softcapping [30]
// (0: none; < 0 refused) and attention.sliding_window [4096]; gemma3 needs
// attention.sliding_window and reads rope.freq_base_swa [10000]. The query
// scale (attn_scale) is 1/sqrt(head_dim) except for the architecture's 27B
// layer count (ArchSpec::wide_query_scale_layers): 1/sqrt(n_embd / n_head).
// A missing required key is NotFound naming it; a wrong type is InvalidArgument
// (from the GGUF getters); a value that is inconsistent (zero, not divisible,
// n_rot odd or > head_dim, ...) is InvalidArgument naming the key and value.
// Thread safety: plain values / pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  // Mixture of experts (all zero for a dense model).
  int32_t n_expert = 0;       // <arch>.expert_count
  int32_t n_expert_used = 0;  // <arch>.expert_used_count
  int32_t n_ff_exp = 0;       // <arch>.expert_feed_forward_length: one expert's FFN width
  int32_t n_ff_shexp = 0;     // <arch>.expert_shared_feed_forward_length (0: no shared expert)
  bool moe_norm_topk = false;  // the chosen experts' weights renormalised to sum 1
  float moe_weights_scale = 1.0f;  // <arch>.expert_weights_scale: then multiplied by it
  // Gemma (model/arch.h); the defaults are the llama family's.
  float embd_scale = 1.0f;     // token embeddings are multiplied by it
  bool post_norms = false;     // blk.N.post_attention_norm / post_ffw_norm
  bool ffn_gelu = false;       // the FFN's gate is GELU (tanh form), not SiLU
  float attn_softcap = 0.0f;   // scores = cap * tanh(scores / cap) (0: none)
  float final_softcap = 0.0f;  // logits likewise (0: none)
  int32_t n_swa = 0;           // <arch>.attention.sliding_window (0: every layer global)
  int32_t swa_period = 0;      // which layers slide (is_swa)
  float rope_freq_base_swa = 0.0f;  // > 0: the sliding layers' RoPE base, without position scaling
  float attn_scale = 0.0f;     // the attention's score scale (0: 1/sqrt(head_dim))

  int32_t head_dim() const {
    if (n_embd_head > 0) return n_embd_head;
    return n_head > 0 ? n_embd / n_head : 0;
  }
  int32_t n_embd_q() const { return head_dim() * n_head; }     // Q (and attention output) floats per token
  int32_t n_embd_kv() const { return head_dim() * n_head_kv; }  // K (or V) floats per token per layer
  int32_t n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 0; }
  bool moe() const { return n_expert > 0; }
  // Whether layer il attends to its last n_swa positions only.
  bool is_swa(int32_t il) const { return n_swa > 0 && swa_period > 0 && il % swa_period < swa_period - 1; }
  // Whether layer il's RoPE is the sliding layers' own (rope_freq_base_swa,
  // no position scaling, no frequency factors).
  bool local_rope(int32_t il) const { return rope_freq_base_swa > 0.0f && is_swa(il); }
  // Whether some layer uses the sliding layers' own RoPE (a second cos/sin
  // table: the backends build it and the estimator prices it).
  bool has_local_rope() const { return rope_freq_base_swa > 0.0f && n_swa > 0; }
  float kq_scale() const;
  // The sliding-window layers among [begin, end), in order.
  std::vector<int32_t> swa_layers(int32_t begin, int32_t end) const {
    std::vector<int32_t> v;
    for (int32_t l = begin; l < end; ++l)
      if (is_swa(l)) v.push_back(l);
    return v;
  }
  // The widest FFN intermediate one layer computes: n_ff for a dense model,
  // else the wider of an expert's and the shared expert's (the backends'
  // gate/up activations are this wide).
  int32_t ffn_width() const { return moe() ? (n_ff_exp > n_ff_shexp ? n_ff_exp : n_ff_shexp) : n_ff; }

  // InvalidArgument naming the offending key and value.
  Status validate() const;
  std::string to_string() const;
};

Result<LlamaHparams> read_llama_hparams(const gguf::GgufFile& file);

// 4-byte words of a mixture of experts' FFN scratch for n rows
// (backend/cpu/moe.h lays it out; the backends allocate it and the estimator
// prices it): the gathered rows and the chosen experts' outputs, the
// router's probabilities, and the ranked weights, expert ids, row order,
// per-expert offsets and cursors. 0 for a dense model.
inline int64_t moe_scratch_words(const LlamaHparams& hp, int64_t n) {
  if (!hp.moe()) return 0;
  const int64_t k = hp.n_expert_used;
  return n * hp.n_embd + n * k * hp.n_embd + n * hp.n_expert + 3 * n * k + 2 * hp.n_expert + 1;
}

}  // namespace spw
