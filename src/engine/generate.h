// Generation loop: prompt -> tokens and text, with sampler, stop rules and
// resumable checkpoints.
//
// Contract: Generator::start evaluates the prompt in a Session (reusing the
// session's KV for the longest common prefix of its tokens and the prompt) and
// then step() produces one token at a time:
//   sample (Sampler over the last logits) -> EOS/EOG ends with "stop" unless
//   ignore_eos -> accept -> token_piece -> Utf8Stream -> StopMatcher -> callback.
// The token that completes a stop string is kept in `tokens`, the stop string is
// not in `text`; an EOS token is in neither. finish_reason is "stop" (EOS or stop
// string), "length" (max_tokens reached, or the session's context is full) or
// "cancelled" (callback returned false, or *cancel became true). On "length"
// and EOS the held-back text (partial UTF-8 as U+FFFD, partial stop-string
// prefix) is flushed and emitted; on cancel it is dropped.
// The callback is called once per generated token with the text that became
// safe to show (possibly empty) and the token id, and once more with id = -1
// for text flushed at the end (only when non-empty). Returning false cancels.
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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/stop_rules.h"
#include "tokenizer/tokenizer.h"

namespace spw {

struct GenerateOptions {
  int32_t max_tokens = 256;  // <= 0: no limit but the context size
  SamplerParams sampler;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Take the KV for the whole request (prompt + max_tokens, at most n_ctx)
  // before evaluating anything, so that a shared pool running out fails the
  // request before its first token instead of in the middle of it (a server's
  // request boundary). Not checkpointed: it is a property of where it runs.
  bool reserve_kv = false;
};

struct GenerateResult {
  std::vector<TokenId> prompt_tokens, tokens;
  std::string text;
  std::string finish_reason;  // "stop", "length", "cancelled"; "" while running
  int64_t prefill_ns = 0;     // prompt evaluation (or re-evaluation on resume)
  int64_t decode_ns = 0;      // everything after
};

// (text that is now safe to show, token id or -1 for the final flush) -> keep going?
using TokenCallback = std::function<bool(std::string_view text, TokenId id)>;

struct Checkpoint;  // engine/checkpoint.h

class Generator {
 public:
  static Result<std::unique_ptr<Generator>> start(Session& session, std::vector<TokenId> prompt,
                                                  const GenerateOptions& options);
  static Result<std::unique_ptr<Generator>> resume(Session& session, const Checkpoint& checkpoint);

  // One token. Returns true while generation continues, false once finished.
  Result<bool> step(const TokenCallback& cb = {});
  // Steps until finished; *cancel (if given) is checked before every token.
  Result<GenerateResult> run(const TokenCallback& cb = {}, const std::atomic<bool>* cancel = nullptr);
  // Ends the generation as "cancelled" (no flush).
  void cancel();

  bool finished() const { return !result_.finish_reason.empty(); }
  const GenerateResult& result() const { return result_; }
  int32_t n_generated() const { return static_cast<int32_t>(result_.tokens.size()); }
  // The state at the current token boundary (see checkpoint.h).
  Checkpoint checkpoint() const;

 private:
  Generator(Session& session, const GenerateOptions& options);
  void finish(const std::string& reason, const TokenCallback& cb, bool flush);
  Status evaluate_from_prefix(std::span<const TokenId> all_tokens);

  Session& session_;
  GenerateOptions options_;
  Sampler sampler_;
  StopMatcher stop_;
  Utf8Stream utf8_;
  GenerateResult result_;
  bool pending_eval_ = false;  // the last sampled token is not in the KV yet
};

// Convenience wrappers around Generator.
Result<GenerateResult> generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TokenCallback& cb = {}, const std::atomic<bool>* cancel = nullptr);
Result<GenerateResult> resume(Session& session, const Checkpoint& checkpoint, const TokenCallback& cb = {},
                              const std::atomic<bool>* cancel = nullptr);

}  // namespace spw
