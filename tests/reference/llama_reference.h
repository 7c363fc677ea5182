// LlamaReference: a naive, double-precision llama forward pass for tests.
//
// Contract: LlamaReference::load reads a llama-family GGUF (general.architecture
// "llama", or "qwen2" with Q/K/V biases added after the projections, or "qwen3"
// with each head of Q and K RMS-normalised before RoPE, or "phi3" with Q, K
// and V as the row blocks of attn_qkv and the FFN's gate and up as the first
// and second halves of ffn_up's rows (HF's Phi3 qkv_proj and gate_up_proj);
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
// is row j dotted with the input. RoPE scaling keys are not supported (absent in
// the test models); load() rejects files that set llama.rope.scaling.type to
// anything but "none".
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
