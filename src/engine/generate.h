// Generation loop: prompt -> tokens and text, with sampler, stop rules and
// resumable checkpoints.
//
// Contract: Generator::start evaluates the prompt in a Session (reusing the
// session's KV for the longest common prefix of its tokens and the prompt) and
// then step() produces one token at a time:
//   sample (Sampler over the last logits) -> EOS/EOG ends with "stop" unless
//   ignore_eos, one of stop_token_ids ends with "stop" -> accept ->
//   token_piece -> Utf8Stream -> StopMatcher -> callback.
// With options.constraint (OpenAI's response_format: engine/output_constraint.h)
// every sample is restricted to the tokens that keep the output a prefix of
// a document the grammar accepts, and to end-of-generation once it is
// complete; so a generation that ends with "stop" by an end-of-generation
// token holds a whole document (one cut by max_tokens, a stop string or a
// stop token does not). A constraint with ignore_eos or min_tokens > 0 is
// InvalidArgument naming that field: both would hold the end back past the
// end of the document, where nothing else may follow. The grammar's state is
// not stored in a checkpoint: resume() rebuilds it from the generated tokens.
// While fewer than min_tokens tokens are generated, the tokens that would end
// the generation (EOG unless ignore_eos, and stop_token_ids) are banned from
// the sampler's choice (vLLM's min_tokens; stop strings still end it).
// The token that completes a stop string is kept in `tokens`, the stop string is
// not in `text`; an EOS token, and a stop_token_ids token, are in neither (as
// an end, not output). finish_reason is kStop (EOS, a stop token or a stop
// string), kLength (max_tokens reached, or the session's context is full) or
// kCancelled (callback returned false, or *cancel became true). On kLength
// and EOS the held-back text (partial UTF-8 as U+FFFD, partial stop-string
// prefix) is flushed and emitted; on cancel it is dropped.
// The callback is called once per generated token with the text that became
// safe to show (possibly empty), the token id and the log-probability entries
// released with that text (below; empty unless asked for), and once more with
// id = -1 for text and entries flushed at the end (only when either is
// non-empty). Returning false cancels.
// Log-probabilities (options.logprobs >= 0; nothing is computed otherwise):
// every generated token but an EOS gets a TokenLogprobs entry (step_logprobs
// of the logits it was sampled from, with options.logprobs alternatives, and
// the bytes of each). Alignment with the text: a token's text ends where the
// character holding its last byte ends in the decoded text (a token of no
// bytes: where the text before it ends; a character that turns out invalid
// UTF-8, shown as U+FFFD: where the Utf8Stream's output ends once it knows,
// i.e. with the first character after it). Its entry is released in the
// callback whose text reaches that end, never earlier, never later. So each
// entry is released exactly once, in generation order, never ahead of its
// text, and the released entries' bytes, concatenated, decode to a prefix of
// the text released so far (byte for byte when they are valid UTF-8). Text
// held back for a possible stop string or an incomplete character holds its
// entries back with it. At the end: on "length" and EOS the flush releases
// every entry still held (an open character flushes as U+FFFD); on a stop
// string, tokens whose text ends past where the stop string begins (the one
// completing it included) are never released, as their text is not all in
// the output; on cancel nothing more is released. GenerateResult::logprobs
// collects what was released. A checkpoint keeps the entries still held (in
// memory only: serialize_checkpoint drops them), so that a generation resumed
// from it releases them when their text comes; one resumed from a serialized
// checkpoint releases entries for the tokens it generates only.
// The next token's logits are computed lazily at the start of the next step,
// so checkpoint() after any step captures a clean token boundary; resume()
// re-evaluates all tokens of a checkpoint in a (fresh) session, possibly on
// another backend, and continues: because the backend is batch-size invariant
// and the sampler state is restored, the final tokens and text equal those of
// an uninterrupted run (greedy and seeded sampling alike).
// Errors: InvalidArgument for an empty prompt or bad sampler params;
// FailedPrecondition when a checkpoint's model fingerprint differs from the
// session's model; Session errors (ResourceExhausted for KV/context) pass
// through, leaving the generator unusable but the session consistent.
// Thread safety: a Generator and its Session are used by one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/finish_reason.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/stop_rules.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace spw {

struct GenerateOptions {
  int32_t max_tokens = 256;  // <= 0: no limit but the context size
  SamplerParams sampler;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // vLLM's: EOG tokens (unless ignore_eos) and stop_token_ids are banned
  // while fewer tokens than this are generated; <= 0: never.
  int32_t min_tokens = 0;
  // vLLM's: sampling one of these ends the generation ("stop"), whatever
  // ignore_eos says. Ids outside the vocabulary never match.
  std::vector<TokenId> stop_token_ids;
  // OpenAI's response_format (json_object / json_schema): the source of the
  // grammar that masks every sample (see the contract). Checkpointed.
  grammar::ConstraintSpec constraint;
  // Take the KV for the whole request (prompt + max_tokens, at most n_ctx)
  // before evaluating anything, so that a shared pool running out fails the
  // request before its first token instead of in the middle of it (a server's
  // request boundary). Not checkpointed: it is a property of where it runs.
  bool reserve_kv = false;
  // Log-probability entries (see the contract): < 0 none; else each entry
  // carries this many most likely alternatives. Not serialized in a
  // checkpoint: it changes no token, only what a response reports.
  int32_t logprobs = -1;
  // The prompt's log-probabilities (OpenAI's echo with logprobs): >= 0 makes
  // start() evaluate the whole prompt (no KV prefix reused) with the
  // session's row sink and list every prompt token in
  // GenerateResult::prompt_logprobs with this many alternatives; < 0 none.
  // Only start() computes them (a resumed generation never does); not
  // serialized in a checkpoint.
  int32_t prompt_logprobs = -1;
};

// A token with its log-probability and the bytes it stands for.
struct PieceLogprob {
  TokenId id = -1;
  double logprob = 0;  // natural log; -inf for a token the logits rule out
  // The chosen token: exactly the bytes it added to the text (token_piece; a
  // control token's are none). An alternative: token_piece with
  // render_special, so that an end-of-generation alternative reads "</s>".
  // Either may be part of a UTF-8 character.
  std::string piece;
};

// One generated token as a response lists it (GenerateOptions::logprobs).
struct TokenLogprobs {
  // Which generated token (0-based over the whole generation: a resumed one
  // continues the count), so that a consumer can tell entries it already has.
  int32_t index = 0;
  PieceLogprob token;
  std::vector<PieceLogprob> top;  // most likely first (step_logprobs)
};

// An entry not released yet, and where its text ends counted back from the
// end of what was produced: `after` output bytes were decoded after it
// (decoded = true), or, while its last byte is still in the Utf8Stream,
// `after` raw bytes were pushed after it. Part of a Checkpoint.
struct PendingLogprobs {
  TokenLogprobs entry;
  bool decoded = false;
  int64_t after = 0;
};

struct GenerateResult {
  std::vector<TokenId> prompt_tokens, tokens;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;  // kNone while running
  // The log-probability entries released, in order (GenerateOptions::logprobs
  // >= 0; a resumed Generator's since its checkpoint).
  std::vector<TokenLogprobs> logprobs;
  // GenerateOptions::prompt_logprobs: one entry per prompt token, index =
  // its position. Entry 0 has no log-probability (nothing predicts the
  // first token): logprob NaN and no alternatives. Each entry's token piece
  // is its bytes in the prompt's text (prompt_piece: the space a
  // SentencePiece vocabulary prefixes is dropped from the first non-empty
  // piece, as decode() drops it), so the pieces concatenated are
  // decode(prompt). The others' logprob and alternatives come from the
  // logits of the position before (step_logprobs: the same numbers a
  // token-by-token evaluation gives).
  std::vector<TokenLogprobs> prompt_logprobs;
  int64_t prefill_ns = 0;     // prompt evaluation (or re-evaluation on resume)
  int64_t decode_ns = 0;      // everything after
};

// (text that is now safe to show, token id or -1 for the final flush, the
// log-probability entries released with the text) -> keep going?
using TokenCallback =
    std::function<bool(std::string_view text, TokenId id, std::span<const TokenLogprobs> logprobs)>;

struct Checkpoint;  // engine/checkpoint.h
class OutputConstraint;  // engine/output_constraint.h

class Generator {
 public:
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  static Result<std::unique_ptr<Generator>> start(Session& session, std::vector<TokenId> prompt,
                                                  const GenerateOptions& options);
  static Result<std::unique_ptr<Generator>> resume(Session& session, const Checkpoint& checkpoint);

  // One token. Returns true while generation continues, false once finished.
  Result<bool> step(const TokenCallback& cb = {});
  // Steps until finished; *cancel (if given) is checked before every token.
  Result<GenerateResult> run(const TokenCallback& cb = {}, const std::atomic<bool>* cancel = nullptr);
  // Ends the generation as kCancelled (no flush).
  void cancel();

  bool finished() const { return result_.finish_reason != FinishReason::kNone; }
  const GenerateResult& result() const { return result_; }
  int32_t n_generated() const { return static_cast<int32_t>(result_.tokens.size()); }
  // The state at the current token boundary (see checkpoint.h).
  Checkpoint checkpoint() const;

 private:
  friend class ChoiceGroup;  // evaluates its choices' pending tokens in one pass
  Generator(Session& session, const GenerateOptions& options);
  // The constraint of options_ (if any), replaying `generated` into it.
  Status init_constraint(std::span<const TokenId> generated);
  void finish(FinishReason reason, const TokenCallback& cb, bool flush);
  Status evaluate_from_prefix(std::span<const TokenId> all_tokens);
  // start() with options_.prompt_logprobs: the whole prompt evaluated with
  // the session's row sink filling result_.prompt_logprobs.
  Status evaluate_with_prompt_logprobs(std::span<const TokenId> prompt);
  // Moves the pending entries past one push of `piece` into the Utf8Stream,
  // which held `pending_before` and decoded `decoded` bytes (see
  // PendingLogprobs).
  void advance_logprobs(std::string_view pending_before, std::string_view piece, size_t decoded);
  // Appends to released_ the pending entries whose text is all emitted now
  // that `held` decoded bytes are not (the StopMatcher's hold, or what a
  // stop string cut off).
  void release_logprobs(size_t held);
  // released_ moved into result_.logprobs after the callback saw it.
  void keep_released();

  // What this step's sample must not pick (the min_tokens rule).
  std::span<const TokenId> banned_now() const;
  bool is_stop_token(TokenId id) const;

  Session& session_;
  GenerateOptions options_;
  Sampler sampler_;
  // The tokens that end a generation here (EOG unless ignore_eos, and
  // stop_token_ids), sorted: banned until min_tokens.
  std::vector<TokenId> enders_;
  StopMatcher stop_;
  Utf8Stream utf8_;
  GenerateResult result_;
  bool pending_eval_ = false;  // the last sampled token is not in the KV yet
  std::deque<PendingLogprobs> pending_logprobs_;  // oldest first
  std::vector<TokenLogprobs> released_;  // for the callback being called
  std::unique_ptr<OutputConstraint> constraint_;  // null: free text
  std::vector<uint64_t> allowed_;                 // this step's mask (reused)
};

// The prompt's token pieces as their text reads in the prompt (see
// GenerateResult::prompt_logprobs).
std::vector<std::string> prompt_pieces(const Tokenizer& tok, std::span<const TokenId> prompt);

// OpenAI's n > 1: n generations continuing one prompt, which is evaluated
// once. ChoiceGroup::start starts choice 0 on `session` (Generator::start:
// the prompt evaluated, reusing the session's KV prefix), then forks the
// session n - 1 times (Session::fork: the prompt's full KV blocks shared,
// its partial last block copied, so a choice costs its generated tokens' KV
// and one re-evaluated prompt token for its logits) and starts choice i on
// fork i (a choice evaluates the prompt's last position again for its
// logits: when that position ends a shared block, the choice's first eval
// copies the block, KvPool::make_tail_private). Choice i samples with seed options.sampler.seed + i (choice_seed,
// wrapping), and has every other option of `options` (penalties, stop rules,
// constraint, logprobs); only choice 0 computes prompt_logprobs. So choice
// i's tokens and text equal those of a lone generate() with seed + i, and
// greedy choices are all equal. step() steps every unfinished choice once,
// in index order; the callback hears which choice the text belongs to. The
// choices' last sampled tokens are evaluated together first, in one pass
// over the weights (Session::eval_batch; the same logits as one by one,
// by batch invariance): n choices cost about one sequence's weight reads
// per step. A choice whose part of the pass fails evaluates alone in its
// step (and reports its error there).
// n outside [1, kMaxChoices] is InvalidArgument; a fork or start that fails
// (ResourceExhausted: the pool has no blocks for a choice) fails start and
// gives back every block it took. Forks are destroyed with the group; the
// group must not outlive `session`.
inline constexpr int32_t kMaxChoices = 16;
inline uint64_t choice_seed(uint64_t base, int32_t choice) { return base + static_cast<uint64_t>(choice); }

using ChoiceCallback = std::function<bool(int32_t choice, std::string_view text, TokenId id,
                                          std::span<const TokenLogprobs> logprobs)>;

class ChoiceGroup {
 public:
  static Result<std::unique_ptr<ChoiceGroup>> start(Session& session, std::vector<TokenId> prompt,
                                                    const GenerateOptions& options, int32_t n);
  int32_t size() const { return static_cast<int32_t>(gens_.size()); }
  Generator& choice(int32_t i) { return *gens_.at(static_cast<size_t>(i)); }
  const Generator& choice(int32_t i) const { return *gens_.at(static_cast<size_t>(i)); }
  bool finished() const;
  // One token of every unfinished choice; true while one continues. A
  // callback returning false cancels that choice only.
  Result<bool> step(const ChoiceCallback& cb = {});
  void cancel();
  Result<std::vector<GenerateResult>> run(const ChoiceCallback& cb = {}, const std::atomic<bool>* cancel = nullptr);

 private:
  ChoiceGroup() = default;
  std::vector<std::unique_ptr<Session>> forks_;  // choices 1.. (destroyed after gens_)
  std::vector<std::unique_ptr<Generator>> gens_;
};

Result<std::vector<GenerateResult>> generate_choices(Session& session, std::span<const TokenId> prompt,
                                                     const GenerateOptions& options, int32_t n,
                                                     const ChoiceCallback& cb = {},
                                                     const std::atomic<bool>* cancel = nullptr);

// Convenience wrappers around Generator.
Result<GenerateResult> generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TokenCallback& cb = {}, const std::atomic<bool>* cancel = nullptr);
Result<GenerateResult> resume(Session& session, const Checkpoint& checkpoint, const TokenCallback& cb = {},
                              const std::atomic<bool>* cancel = nullptr);

}  // namespace spw
