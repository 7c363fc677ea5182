// Sampler: turns one step's logits into the next token, deterministically.
//
// Contract: every step first adjusts the raw logits, in this order:
//   1. logit_bias (OpenAI): each listed token's bias is added to its logit;
//   2. repeat_penalty (llama.cpp) over the recent-token window;
//   3. frequency_penalty and presence_penalty (OpenAI) over the tokens
//      generated in this request: logit -= presence * (count > 0) +
//      frequency * count;
//   4. the step's banned tokens (sample()'s `banned`: the generator's
//      min_tokens) become -inf;
//   5. with an `allowed` set (sample()'s: the generator's response_format
//      grammar), every token outside it becomes -inf, so that the draw (or
//      the argmax) is the best allowed token whatever bias or penalty says;
// then the chain is llama.cpp's default order: top-k -> top-p -> min-p ->
// temperature -> one draw from the softmax using Rng::next_double(). With
// temperature <= 0 the sampler is greedy: the adjustments apply, then argmax
// over the adjusted logits, the lowest id winning ties (no random number is
// consumed, so greedy output does not depend on the seed).
//
//  * logit_bias: at most kMaxLogitBias entries, each id at most once, biases
//    in [-100, 100] (OpenAI's range). Added, as OpenAI and llama.cpp do, not
//    turned into a mask: -100 divides a token's weight by e^(100/T) (over
//    10^21 at T <= 2: never drawn in practice, and never the argmax of a
//    real model's logits), +100 multiplies it so and makes it the choice
//    unless another token is favoured too. Bias first, so that the penalties act on what the client
//    asked the logits to be (llama.cpp's order: its logit-bias sampler comes
//    before its penalties). Ids past the logits' size are ignored (the
//    server checks them against the vocabulary; a fallback model's may be
//    smaller).
//  * repeat_penalty (llama.cpp semantics): each distinct token among the last
//    repeat_last_n accepted tokens (prompt included) has its logit divided by
//    the penalty when positive and multiplied by it when <= 0. 1 disables;
//    repeat_last_n 0 too.
//  * frequency_penalty, presence_penalty in [-2, 2] (OpenAI's range; 0
//    disables; negative ones favour repetition). Their counts cover the
//    tokens generated in this request only, not the prompt: that is
//    OpenAI's definition ("the text so far" of the completion), which
//    clients tune these values against. llama.cpp counts them over its
//    last-n window, prompt included; repeat_penalty keeps that llama-style
//    window, so both readings are available.
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
// state()/restore() carry what influences future draws: the RNG words and the
// recent-token window are the SamplerState; the generated-token counts are
// rebuilt by restore() from the generated tokens, which a checkpoint holds
// anyway (storing them too would be a second copy of the same facts, one
// that could disagree with the tokens). A restored sampler continues
// identically.
//
// validate_sampler_params returns InvalidArgument naming the field for: NaN or
// infinite values; negative temperature (use 0 for greedy), top_p or min_p;
// min_p > 1; repeat_penalty <= 0; negative repeat_last_n; a frequency or
// presence penalty outside [-2, 2]; more than kMaxLogitBias logit_bias
// entries, a negative or repeated id, a bias outside [-100, 100]. top_k may be
// any value (<= 0 disables). The Sampler itself does not validate: call
// validate first.
// Thread safety: none; a Sampler belongs to one session and is used by one
// thread at a time. sample() reads `logits` only.
//
// step_logprobs() (beside the Sampler, for OpenAI's `logprobs`) reports what
// the model thought of one step, not what the sampler did with it: the
// log-softmax of the raw logits in double (before logit bias, penalties,
// top-k/p, min-p and temperature), as llama.cpp's server reports by default.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/rng.h"
#include "tokenizer/tokenizer.h"

namespace spw {

// The most logit_bias entries a request may carry. Each costs an add per
// step (nothing beside the O(n_vocab) pass every step makes), but every entry
// is also stored in each of the request's checkpoints and journal rows; 1024
// is far more than a client that bans or favours a few words sends (OpenAI
// documents no limit; its tokenizers spell a word in a handful of tokens).
inline constexpr size_t kMaxLogitBias = 1024;
inline constexpr float kMaxLogitBiasValue = 100.0f;   // |bias| <= this
inline constexpr float kMaxCountPenalty = 2.0f;       // |frequency|, |presence| <= this

struct LogitBias {
  TokenId id = 0;
  float bias = 0.0f;  // added to the logit
  bool operator==(const LogitBias&) const = default;
};

struct SamplerParams {
  float temperature = 0.8f;     // <= 0 means greedy (argmax, lowest id wins ties)
  int32_t top_k = 40;           // <= 0 disables
  float top_p = 0.95f;          // >= 1 disables
  float min_p = 0.05f;          // <= 0 disables
  float repeat_penalty = 1.0f;  // 1 disables; divide positive logits, multiply negative
  int32_t repeat_last_n = 64;   // window of recent tokens the penalty looks at
  uint64_t seed = 0;
  // OpenAI's, over the tokens generated in this request (see the contract).
  float frequency_penalty = 0.0f;  // 0 disables; times each token's count
  float presence_penalty = 0.0f;   // 0 disables; once for each token seen
  std::vector<LogitBias> logit_bias;  // any order (the server sorts by id); ids unique

  bool operator==(const SamplerParams&) const = default;
};

Status validate_sampler_params(const SamplerParams& p);

// With the generated tokens (restore()), everything needed to continue
// identically.
struct SamplerState {
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
  // `banned` tokens are -inf for this step (after the bias and penalties, so
  // no bias lifts them; ids past the logits are ignored). Does not accept()
  // the token: the caller does, once it is emitted. Consumes exactly one Rng
  // draw unless greedy (or all logits are -inf/NaN, or one is +inf: then the
  // argmax, no draw). Empty logits return -1.
  // `allowed`: a bit set over token ids (bit id % 64 of word id / 64); empty
  // allows every token, otherwise a token without its bit (or past its
  // words) is -inf this step. A set that allows nothing leaves every logit
  // -inf: the lowest id is returned (the caller must not ask that).
  TokenId sample(std::span<const float> logits, std::span<const TokenId> banned = {},
                 std::span<const uint64_t> allowed = {});
  // Records the prompt: its tokens enter the repeat_penalty window only (the
  // OpenAI penalties count generated tokens).
  void accept_prompt(std::span<const TokenId> prompt);
  // Records a generated token, once it is emitted: the window and the counts.
  void accept(TokenId id);

  // The tokens that survive the adjustments, top-k, top-p and min-p for these
  // logits, in the order the draw scans them (most probable first). Greedy:
  // just the argmax. For tests and diagnostics; consumes no randomness.
  std::vector<TokenId> candidates(std::span<const float> logits, std::span<const TokenId> banned = {},
                                  std::span<const uint64_t> allowed = {}) const;

  const SamplerParams& params() const { return params_; }
  SamplerState state() const;
  // Continues from `s` with `generated` the tokens generated so far (in order;
  // the counts of the OpenAI penalties are rebuilt from them).
  void restore(const SamplerState& s, std::span<const TokenId> generated);

 private:
  struct Candidate {
    TokenId id;
    float logit;
  };
  // Fills `cand` with the filtered candidates (sorted) and returns true, or
  // returns false with cand = {argmax} for greedy / degenerate logits.
  bool filter(std::span<const float> logits, std::span<const TokenId> banned, std::span<const uint64_t> allowed,
              std::vector<Candidate>& cand) const;
  // Steps 1-5 of the contract on `cand` (cand[i].id == i).
  void adjust(std::vector<Candidate>& cand, std::span<const TokenId> banned, std::span<const uint64_t> allowed) const;
  bool counts_tokens() const { return params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f; }

  SamplerParams params_;
  Rng rng_;
  std::vector<TokenId> recent_;
  // Generated tokens -> how often (kept only while a count penalty is set).
  std::unordered_map<TokenId, int32_t> counts_;
  // Reused across calls to avoid per-token allocation.
  std::vector<Candidate> scratch_;
  std::vector<double> weights_;
};

}  // namespace spw
