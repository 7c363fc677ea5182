// Echo Llama GGUF models: hand-built weights whose greedy continuation replays
// the prompt's last `period` tokens cyclically. For tests that need the real
// engine (and server) to emit a known text: put the text at the end of the
// prompt and the model says it again.
//
// Contract: builds a GGUF v3 `llama` file (same tensor names, shapes and
// metadata keys as random_llama.h, every `tokenizer.*` key copied from the GGUF
// at `vocab_path`, n_vocab = its token count V) with F32 weights such that, for
// a prompt t_0 .. t_{P-1} with P >= period = L, greedy decoding generates
//   t_{P-L}, t_{P-L+1}, ..., t_{P-1}, t_{P-L}, ...
// i.e. the token at position p is the token at position p - L, for every
// position p with L <= p < n_ctx (llama.context_length). What the model
// predicts at positions before L is unspecified. Control tokens are replayed
// like any other (an EOS / end-of-turn token in the replayed span ends a
// generation that does not ignore EOS; stop strings match the replayed text).
// The distribution is near one-hot, not only its argmax: the replayed token's
// logit beats every other by >= kEchoOutputGap, so sampling at temperature
// <= 1 gives the same tokens except with probability < V * e^-40 per token.
//
// Construction (one layer; engine conventions: RMSNorm, llama.cpp "normal"
// RoPE on pairs (2i, 2i+1) with theta_i = pos * base^(-2i/n_rot), softmax of
// q.k / sqrt(head_dim), F32 KV):
//   head_dim = n_rot = 64, n_head = n_head_kv = ceil((V + 1) / 64),
//   n_embd = 64 n_head, n_ff = 32, one block.
//   token_embd[t] = e_t + e_C with C = V (a constant dimension), so every
//     token's RMSNorm output is (e_t + e_C) * xc, xc = 1/sqrt(2/n_embd + eps).
//   attn_q / attn_k read only dimension C, identically in every head, so q and
//     k are position-independent before RoPE. In rotary pair i, k = (a, 0) and
//     q = a (cos phi_i, sin phi_i) with phi_i = -theta_i (L - 1); after RoPE the
//     score of query m on key n is (a^2 / 8) sum_i cos(theta_i (m - n - L + 1)),
//     maximal exactly at m - n = L - 1. a is chosen so that the runner-up over
//     every offset reachable inside the context (m - n - L + 1 in
//     [-(L-1), n_ctx - L], checked one by one in double when the model is
//     built) is >= kEchoAttentionMargin below the peak: softmax weights off
//     the peak are < n_ctx * e^-kEchoAttentionMargin.
//   attn_v = identity on the one-hot dimensions [0, V) (head h carries dims
//     [64h, 64h + 64)); attn_output = (kEchoResidual / xc) * identity on [0, V):
//     the residual becomes e_t + e_C + kEchoResidual * e_t', t' the token L - 1
//     positions back.
//   ffn_gate / ffn_up / ffn_down = 0 (the FFN adds nothing), all norms = 1.
//   output.weight = g * identity on [0, V) (row j reads dimension j), g chosen
//     so that logit(t') - logit(any other) >= kEchoOutputGap.
// Context limit: the build checks every offset inside n_ctx. With the default
// rope_freq_base 10000 the runner-up is offset +-1 at any context (checked to
// 2^22 positions), so a session run with a context longer than n_ctx still
// echoes; the build fails with InvalidArgument only if some offset inside
// n_ctx comes within 1e-3 (relative) of the peak, which no practical base /
// context does (rope_freq_base 1 with n_ctx 2048 does: distance 44 ~ 7 turns).
// Size: about (2 V + 4 n_embd) n_embd floats (8 MB for the 512-token
// models/stories260K.gguf vocab); V is limited to kEchoMaxVocab.
//
// Failure: InvalidArgument naming the field for period 0 or period >= n_ctx,
// n_ctx < 2, a non-positive rope_freq_base / rms_eps, an empty vocab_path, a
// vocab of more than kEchoMaxVocab tokens, or an n_ctx whose offsets the RoPE
// cannot separate (above); errors from reading the vocab GGUF as
// random_llama_writer; IOError from writing.
// Thread safety: functions are reentrant; no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "gguf/gguf.h"

namespace spw::modelgen {

inline constexpr uint32_t kEchoHeadDim = 64;
inline constexpr uint32_t kEchoFfn = 32;
inline constexpr uint32_t kEchoMaxVocab = 8192;
inline constexpr double kEchoAttentionMargin = 50.0;  // softmax logits, worst offset
inline constexpr double kEchoResidual = 8.0;          // weight of the attended token in the residual
inline constexpr double kEchoOutputGap = 40.0;        // logit(t') - logit(any other token), at least

struct EchoLlamaSpec {
  uint32_t period = 1;  // L
  uint32_t n_ctx = 2048;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  std::string vocab_path;  // GGUF whose tokenizer.* keys are copied
};

struct EchoLlamaStats {
  uint32_t n_vocab = 0;
  uint32_t n_embd = 0;
  uint32_t n_head = 0;
  // Softmax-logit gap between the peak (distance m - n = L-1) and the
  // runner-up over the context, and how far that runner-up's distance is
  // from L-1 (either side).
  double attention_margin = 0;
  int64_t runner_up_offset = 0;
  double q_k_magnitude = 0;  // a above: |q| = |k| per rotary pair after RMSNorm
  double output_gain = 0;    // g above
  uint64_t n_params = 0;
  uint64_t file_size = 0;
};

// Checks the spec's own fields (not the vocab file, not the RoPE margin).
Status validate_echo_llama_spec(const EchoLlamaSpec& spec);

// A writer holding the metadata and lazily generated tensors. Reads the vocab
// through `env`. Fills `stats` when given.
Result<gguf::GgufWriter> echo_llama_writer(Env& env, const EchoLlamaSpec& spec,
                                           EchoLlamaStats* stats = nullptr);

// As write_random_llama / make_random_llama.
Status write_echo_llama(Env& env, const std::string& out_path, const EchoLlamaSpec& spec);
Result<std::string> make_echo_llama(const EchoLlamaSpec& spec);
Result<std::string> make_echo_llama(Env& env, const EchoLlamaSpec& spec);

}  // namespace spw::modelgen
