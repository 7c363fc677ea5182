// LlamaReference: a naive, double-precision llama forward pass for tests.
//
// Contract: LlamaReference::load reads a llama-family GGUF (general.architecture
// "llama", "gemma2" or "gemma3" as described below, or "qwen2" with Q/K/V
// biases added after the projections, or "qwen3" with each head of Q and K
// RMS-normalised before RoPE, or "phi3" with Q, K and V as the row blocks of
// attn_qkv and the FFN's gate and up as the first and second halves of
// ffn_up's rows (HF's Phi3 qkv_proj and gate_up_proj);
// all three with NeoX RoPE; or a mixture of experts as Hugging Face's
// MixtralSparseMoeBlock (llama with expert_count > 0), Qwen2MoeSparseMoeBlock
// (qwen2moe: Qwen2's attention; a shared expert gated by
// sigmoid(shared_expert_gate . h), top-k weights not renormalised) and
// Qwen3MoeSparseMoeBlock (qwen3moe: Qwen3's attention; renormalised):
// p = softmax(router h) over all experts, the expert_used_count largest,
// FFN output sum_i p_i expert_i(h) (p renormalised to sum 1 for Mixtral and
// Qwen3-MoE), each expert a SwiGLU FFN read from the 3-D
// ffn_{gate,up,down}_exps tensors;
// keys under the architecture's prefix; the head size from
// attention.key_length when present) straight from spw::gguf::GgufFile metadata and tensors -- it shares
// no code with the engine (src/model, src/backend) so that it can judge it. All
// weights are dequantised once to double (F32, F16 exactly; Q8_0 as d * q;
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K decoded from ggml's block layouts by
// this file's own decoder), so this is for tiny test models only (memory is 8
// bytes per parameter). forward() computes, in double, the logits of every position of
// a token sequence starting at position 0:
//   x = token_embd[token]
//   per layer: h = RMSNorm(x) * attn_norm; q,k,v = Wq h, Wk h, Wv h;
//     RoPE "normal" mode (pairs (2i, 2i+1) within each head, i < n_rot/2,
//     theta = pos * freq_base^(-2i/n_rot)); causal grouped-query attention
//     (head h reads kv head h / (n_head / n_head_kv), scale 1/sqrt(head_dim));
//     x += Wo attn; h = RMSNorm(x) * ffn_norm; x += Wdown(silu(Wgate h) * Wup h)
//   logits = Woutput (RMSNorm(x) * output_norm); Woutput = token_embd if absent.
// A weight with ne = [in, out] is out rows of in contiguous elements; output j
// is row j dotted with the input. RoPE scaling: load() rejects files that set
// <arch>.rope.scaling.type to anything but "none", except gemma3's "linear".
//
// Gemma 2 and Gemma 3 (text), general.architecture "gemma2" / "gemma3", as Hugging
// Face's Gemma2ForCausalLM / Gemma3ForCausalLM, in the GGUF llama.cpp's converter
// writes (norm weights already hold Gemma's "+1", so every norm is RMSNorm(x) * w;
// output.weight is usually absent, i.e. tied):
//   x = token_embd[token] * sqrt(n_embd)
//   per layer l: h = RMSNorm(x) * attn_norm; q,k,v = Wq h, Wk h, Wv h;
//     (gemma3: per-head RMSNorm of q and k with attn_q_norm / attn_k_norm);
//     NeoX RoPE; score = (q . k) * attn_scale, then (gemma2) soft-capped:
//     score = attn_softcap * tanh(score / attn_softcap); causal mask and, on a
//     sliding layer, also key j masked for query i when i - j >= sliding_window;
//     o = Wo attn; x += RMSNorm(o) * post_attention_norm;
//     h = RMSNorm(x) * ffn_norm; f = Wdown(gelu_tanh(Wgate h) * Wup h);
//     x += RMSNorm(f) * post_ffw_norm
//   logits = Wout (RMSNorm(x) * output_norm); (gemma2) logits = final_softcap *
//   tanh(logits / final_softcap). gelu_tanh(a) = 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))).
// Sliding layers: gemma2 the even ones (l % 2 == 0); gemma3 those with l % 6 < 5
// (l = 5, 11, ... are global) -- llama.cpp's swa patterns 2 and 6.
// attn_scale = 1/sqrt(head_dim), except 1/sqrt(n_embd / n_head) (integer division)
// for a 46-layer gemma2 and a 62-layer gemma3 (the 27B models, whose
// query_pre_attn_scalar the GGUF does not store: llama.cpp's rule).
// gemma2: attention.sliding_window (default 4096), attn_logit_softcapping (default
// 50), final_logit_softcapping (default 30); every layer RoPEs with rope.freq_base.
// gemma3: attention.sliding_window required (NotFound naming it), no soft-capping
// (the keys are ignored); sliding layers RoPE with base rope.freq_base_swa (default
// 10000) and unscaled positions, global layers with rope.freq_base and, for
// rope.scaling.type "linear", positions divided by rope.scaling.factor.
// forward(), embed() and greedy() all run the same per-token step.
// Errors: InvalidArgument for a non-llama architecture, an unsupported tensor
// type, a token id out of range or bad hyper-parameters (naming key / tensor /
// value); NotFound for a missing key or tensor; Corruption for a wrong shape
// (naming the tensor and the expected and actual dims).
// Thread safety: immutable after load; const methods may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"

namespace spw::reference {

using TokenId = int32_t;  // same as spw::TokenId (tokenizer/tokenizer.h)

struct ReferenceHparams {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_rot = 0;
  int64_t head_dim = 0;
  double rope_freq_base = 10000.0;
  double rms_eps = 1e-5;
  bool neox = false;      // qwen2, qwen3, phi3: RoPE pairs (i, i + n_rot/2)
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3
  int64_t n_expert = 0;       // 0: a dense FFN
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;     // qwen2moe's shared expert
  bool norm_topk = false;     // Mixtral, Qwen3-MoE
  double weights_scale = 1.0; // <arch>.expert_weights_scale (absent or 0: 1)
  // Attention and embedding constants; the gemma2 / gemma3 ones are described
  // in the contract above, the defaults are every other architecture's.
  double attn_scale = 0;              // q . k multiplier: 1/sqrt(head_dim) unless gemma 27B
  double embd_scale = 1.0;            // token_embd row multiplier (gemma: sqrt(n_embd))
  double attn_softcap = 0;            // 0: none; else score = cap * tanh(score / cap)
  double final_softcap = 0;           // 0: none; else logit = cap * tanh(logit / cap)
  int64_t sliding_window = 0;         // 0: no sliding layers
  std::vector<bool> swa_layers;       // [n_layer]: layer l is sliding (window above)
  double rope_freq_base_swa = 10000;  // sliding layers' RoPE base (gemma2: rope_freq_base)
  double rope_freq_scale = 1.0;       // global layers' position multiplier (1 / linear factor)
  bool gelu = false;                  // gemma: gelu_tanh gates the FFN instead of silu
  bool post_norms = false;            // gemma: post_attention_norm and post_ffw_norm
};

class LlamaReference {
 public:
  static Result<std::unique_ptr<LlamaReference>> load(const gguf::GgufFile& file);

  const ReferenceHparams& hparams() const { return hp_; }
  bool output_tied() const { return output_tied_; }

  // Logits for every position: result[p * n_vocab + v]. InvalidArgument for an
  // empty sequence or an id outside [0, n_vocab).
  Result<std::vector<double>> forward(std::span<const TokenId> tokens) const;

  // A sentence embedding as llama.cpp's llama-embedding makes one: every
  // position's state after the output norm, pooled (pooling 1 mean over the
  // positions, 2 the first, 3 the last: <arch>.pooling_type's numbers), then
  // scaled to unit Euclidean length. Its own arithmetic (double), written
  // from that definition, not from the engine's. InvalidArgument as
  // forward(), or for another pooling.
  Result<std::vector<double>> embed(std::span<const TokenId> tokens, int pooling) const;

  // Greedy continuation (argmax, lowest id on ties) of `prompt` by up to `n_new`
  // tokens, stopping after `stop_token` when it is >= 0 (it is included).
  // Uses an incremental KV cache: same arithmetic as forward().
  Result<std::vector<TokenId>> greedy(std::span<const TokenId> prompt, int n_new, TokenId stop_token = -1) const;

 private:
  struct Matrix {  // rows x cols, row-major: out = M * in
    int64_t rows = 0;
    int64_t cols = 0;
    std::vector<double> w;
  };
  struct Layer {
    std::vector<double> attn_norm, ffn_norm;
    std::vector<double> post_attn_norm, post_ffw_norm;  // gemma
    std::vector<double> bq, bk, bv, q_norm, k_norm;  // qwen2 biases, qwen3 head norms
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
    Matrix router;                                  // [n_expert][n_embd]
    std::vector<Matrix> e_gate, e_up, e_down;       // per expert
    Matrix s_gate, s_up, s_down;                    // qwen2moe's shared expert
    std::vector<double> s_router;                   // [n_embd]
  };
  struct Cache {  // per layer: [pos][n_head_kv * head_dim]
    std::vector<std::vector<double>> k, v;
    int64_t n_past = 0;
  };

  LlamaReference() = default;
  static Result<Matrix> load_matrix(const gguf::GgufFile& file, const std::string& name, int64_t cols,
                                    int64_t rows);
  static Result<std::vector<double>> load_vector(const gguf::GgufFile& file, const std::string& name,
                                                 int64_t n);
  // A [cols, rows, n] tensor as n matrices.
  static Result<std::vector<Matrix>> load_stacked(const gguf::GgufFile& file, const std::string& name, int64_t cols,
                                                  int64_t rows, int64_t n);
  // The FFN of layer L on h (dense or mixture of experts), into out.
  void ffn(const Layer& L, const std::vector<double>& h, std::vector<double>& out) const;
  // Rows [first, first + n) of m, copied (a fused tensor's part).
  static Matrix rows_of(const Matrix& m, int64_t first, int64_t n);
  // The gemma2 / gemma3 fields of hp (see the contract); hp's dims already read.
  static Status load_gemma_hparams(const gguf::GgufFile& file, const std::string& arch, bool linear_scaling,
                                   ReferenceHparams& hp);
  Status check_tokens(std::span<const TokenId> tokens) const;
  // Appends one token at position cache.n_past and writes its logits.
  void step(Cache& cache, TokenId token, std::vector<double>& logits, std::vector<double>* normed = nullptr) const;
  Cache new_cache() const;

  ReferenceHparams hp_;
  Matrix tok_embd_;  // n_vocab rows of n_embd
  std::vector<double> output_norm_;
  Matrix output_;    // empty when tied
  bool output_tied_ = false;
  std::vector<Layer> layers_;
};

}  // namespace spw::reference
