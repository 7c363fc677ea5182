// Sampler: turns one step's logits into the next token, deterministically.
//
// Contract: the chain is llama.cpp's default order: repetition penalty over the
// recent-token window -> top-k -> top-p -> min-p -> temperature -> one draw from
// the softmax using Rng::next_double(). With temperature <= 0 the sampler is
// greedy: only the penalty applies, then argmax, the lowest id winning ties (no
// random number is consumed, so greedy output does not depend on the seed).
//
//  * repeat_penalty (llama.cpp semantics): each distinct token among the last
//    repeat_last_n accepted tokens has its logit divided by the penalty when
//    positive and multiplied by it when <= 0. 1 disables; repeat_last_n 0 too.
//  * top_k <= 0 disables; top_k >= n_vocab keeps everything.
//  * top_p >= 1 disables; otherwise keeps the smallest most-probable prefix whose
//    probability (softmax at temperature 1, over what top-k left) reaches top_p.
//  * min_p <= 0 disables; otherwise keeps tokens with p >= min_p * p_max.
//  Every filter keeps at least one token. Candidates are ordered by logit
//  descending, ties by lower id, so the result never depends on sort stability.
//  NaN logits are treated as -inf (never chosen unless everything is NaN/-inf,
//  in which case the lowest id is returned).
//
// Identical params, logits and accepted tokens give identical tokens on every
// platform: probabilities are computed in double from float logits, and the
// draw is a linear scan against one uniform double.
// state()/restore() capture everything that influences future draws (RNG words
// and the recent-token window), so a restored sampler continues identically.
//
// validate_sampler_params returns InvalidArgument naming the field for: NaN or
// infinite values; negative temperature (use 0 for greedy), top_p or min_p;
// min_p > 1; repeat_penalty <= 0; negative repeat_last_n. top_k may be any value
// (<= 0 disables). The Sampler itself does not validate: call validate first.
// Thread safety: none; a Sampler belongs to one session and is used by one
// thread at a time. sample() reads `logits` only.
//
// step_logprobs() (beside the Sampler, for OpenAI's `logprobs`) reports what
// the model thought of one step, not what the sampler did with it: the
// log-softmax of the raw logits in double (before repetition penalty,
// top-k/p, min-p and temperature), as llama.cpp's server reports by default.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/rng.h"
#include "tokenizer/tokenizer.h"

namespace spw {

struct SamplerParams {
  float temperature = 0.8f;     // <= 0 means greedy (argmax, lowest id wins ties)
  int32_t top_k = 40;           // <= 0 disables
  float top_p = 0.95f;          // >= 1 disables
  float min_p = 0.05f;          // <= 0 disables
  float repeat_penalty = 1.0f;  // 1 disables; divide positive logits, multiply negative
  int32_t repeat_last_n = 64;   // window of recent tokens the penalty looks at
  uint64_t seed = 0;
};

Status validate_sampler_params(const SamplerParams& p);

struct SamplerState {  // everything needed to continue identically
  std::array<uint64_t, 4> rng{};
  std::vector<TokenId> recent;  // last repeat_last_n accepted tokens, oldest first
};

// One token's log-probability under the model at one step (natural log;
// -inf for a token the logits rule out: a -inf or NaN logit).
struct TokenLogprob {
  TokenId id = -1;
  double logprob = 0;
};

// A step's report: the chosen token's log-probability, and the n_top most
// likely tokens (fewer when the vocabulary is smaller) in descending order,
// ties by lower id (as the sampler orders candidates). The chosen token has
// its log-probability whether or not it is among them.
struct StepLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
};

// log p_i = l_i - log(sum_j exp(l_j)) over every raw logit in double, NaN as
// -inf (as the sampler treats it). When no logit is finite (all -inf/NaN, or
// some +inf) the report is the limit the sampler's argmax rule implies: the
// tokens at the maximal logit share the probability equally, the others get
// -inf. O(n_vocab) plus a partial sort of n_top; n_top <= 0 sorts nothing.
// Empty logits give {{chosen, 0}, {}}.
StepLogprobs step_logprobs(std::span<const float> logits, TokenId chosen, int32_t n_top);

class Sampler {
 public:
  explicit Sampler(SamplerParams params);

  // Picks the next token from raw logits (n_vocab floats). Does not mutate them.
  // Does not accept() the token: the caller does, once it is emitted. Consumes
  // exactly one Rng draw unless greedy (or all logits are -inf/NaN, or one is
  // +inf: then the argmax, no draw). Empty logits return -1.
  TokenId sample(std::span<const float> logits);
  // Records an emitted token (for repetition penalty). Prompt tokens are accepted too.
  void accept(TokenId id);

  // The tokens that survive penalty, top-k, top-p and min-p for these logits, in
  // the order the draw scans them (most probable first). Greedy: just the argmax.
  // For tests and diagnostics; consumes no randomness.
  std::vector<TokenId> candidates(std::span<const float> logits) const;

  const SamplerParams& params() const { return params_; }
  SamplerState state() const;
  void restore(const SamplerState& s);

 private:
  struct Candidate {
    TokenId id;
    float logit;
  };
  // Fills `cand` with the filtered candidates (sorted) and returns true, or
  // returns false with cand = {argmax} for greedy / degenerate logits.
  bool filter(std::span<const float> logits, std::vector<Candidate>& cand) const;

  SamplerParams params_;
  Rng rng_;
  std::vector<TokenId> recent_;
  // Reused across calls to avoid per-token allocation.
  std::vector<Candidate> scratch_;
  std::vector<double> weights_;
};

}  // namespace spw
