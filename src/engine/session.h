// Session: the per-request state of one token sequence over a shared Model.
//
// Contract: a Session owns its block tables in one or more KvPools (one per
// stage; a stage is a backend running a contiguous layer range, so hybrid
// execution is several stages) and the tokens evaluated so far. eval(tokens)
// appends tokens at positions n_past().., prefilling them in ubatches of at most
// `n_ubatch` tokens (weights are streamed once per ubatch), and returns the
// logits of the last appended token (n_vocab floats, valid until the next call
// that mutates the session). eval_all_logits() returns the logits of every
// appended token instead ([n][n_vocab], row-major).
// Failure leaves the session exactly as it was before the call:
//   - empty input, or a token id outside [0, n_vocab): InvalidArgument;
//   - n_past() + n > n_ctx(): ResourceExhausted naming the context size;
//   - the KV pool has not enough free blocks: ResourceExhausted (nothing is
//     appended; the session stays usable, e.g. after truncate()).
// truncate(n) drops tokens and KV past position n (n <= n_past()), returning
// unneeded blocks to the pool; last_logits() is then empty until the next eval.
// Sliding-window layers (KvPool's window plane) keep only the blocks their
// window still reads: before each ubatch the session slides each stage's
// table; a truncate (or a failed multi-ubatch eval) back past what the window
// kept makes the next eval first evaluate the session's tokens again from
// position 0 (as llama.cpp's SWA cache does), a cost in time, never in
// results (batch invariance).
// reserve_kv(n) takes the KV blocks for positions [0, n) in every stage now
// (all or nothing: ResourceExhausted from a pool leaves the tables as they
// were; n > n_ctx() is InvalidArgument), so that a later eval up to n cannot
// run out of blocks half-way; truncate() below n gives them back.
// Because backends are batch-size invariant, eval of tokens one by one or all at
// once gives bitwise equal logits (checkpoint/resume depends on this).
// eval_batch() appends tokens to several sessions in one pass over the
// weights (continuous batching): each part is a session's next tokens (one
// when it decodes, a chunk of its prompt when it prefills); they must run the
// same stages (one session group: equal backends and layer ranges per stage),
// each session at most once. Per session the outcome equals its own
// eval(tokens) (bitwise where the backend's batch invariance holds),
// including the errors: a session whose token is out of range, whose context
// is full or whose pool has no block left gets that error and is left out of
// the pass; a backend error fails every session of the pass, each left as
// before. The output head runs only for the parts that want logits (a
// prompt's last chunk, every decode step); the others' last_logits() is then
// empty.
// Every row's logits (a request that asks for its prompt's log-probabilities,
// OpenAI's echo with logprobs): while a RowLogitsSink is set, every eval and
// eval_batch part of the session also runs the output head on each appended
// row and hands the rows to the sink in position order (the position of the
// first, the rows, row-major n_vocab floats each) before the call returns.
// The head runs on groups of rows no larger than the pass already computed
// (one row in eval, the step's heads in eval_batch), so no logits buffer
// grows beyond what a pass without the sink holds: the cost is time (one
// head matmul per row), not memory. The rows are the same logits an eval
// of the tokens one by one returns (batch invariance; the head of the last
// row is computed twice).
// A session that is a member of a StepBatcher (engine/step_batcher.h) sends
// its evals through it, which gathers them into eval_batch calls (a prompt
// in chunks, so that it shares the passes of the sequences decoding).
// Thread safety: one Session is used by one thread at a time. Many Sessions may
// share one Model, one KvPool and one Backend concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace spw {

class StepBatcher;
class Session;

// One session's part of a batched pass (Session::eval_batch).
struct BatchPart {
  Session* session = nullptr;
  std::span<const TokenId> tokens;
  bool logits = true;  // compute the last token's logits
};

// Layers [layer_begin, layer_end) of the model run on `backend` with their KV in
// `pool` (whose layer range must equal the stage's).
struct SessionStage {
  std::shared_ptr<Backend> backend;
  std::shared_ptr<KvPool> pool;
  int32_t layer_begin = 0;
  int32_t layer_end = 0;
};

struct SessionOptions {
  int32_t n_ctx = 0;      // maximum positions; 0 = the model's context_length
  int32_t n_ubatch = 64;  // prefill batch size
};

using RowLogitsSink = std::function<void(int32_t first_pos, int32_t rows, std::span<const float> logits)>;
// Every appended row's hidden state after the last layer, before the output
// norm (n_embd floats a row, row-major; positions from first_pos), in
// position order, before the call that appended them returns: what a
// pooled sentence embedding is made of (engine/embedding.h). Costs nothing
// beyond the call: the rows are the pass's own.
using RowHiddenSink = std::function<void(int32_t first_pos, int32_t rows, std::span<const float> hidden)>;

class Session {
 public:
  // Single backend, all layers. InvalidArgument when the pool's geometry does
  // not match the model.
  static Result<std::unique_ptr<Session>> create(std::shared_ptr<const Model> model,
                                                 std::shared_ptr<Backend> backend,
                                                 std::shared_ptr<KvPool> pool,
                                                 SessionOptions options = {});
  // Hybrid: stages must cover [0, n_layer) contiguously, in order. Embedding
  // runs on the first stage's backend, the output head on the last's. Each
  // stage's pool must be one its backend accepts (Backend::accepts_kv: host
  // pools for the CPU, the device's own pools for Vulkan), else
  // InvalidArgument. Backend::prepare errors (e.g. ResourceExhausted from a
  // device budget) are returned as they are.
  static Result<std::unique_ptr<Session>> create_staged(std::shared_ptr<const Model> model,
                                                        std::vector<SessionStage> stages,
                                                        SessionOptions options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Result<std::span<const float>> eval(std::span<const TokenId> tokens);
  static std::vector<Status> eval_batch(std::span<const BatchPart> parts);
  // One token per session.
  static std::vector<Status> eval_batch(std::span<Session* const> sessions, std::span<const TokenId> tokens);
  Result<std::vector<float>> eval_all_logits(std::span<const TokenId> tokens);
  Status truncate(int32_t n);
  Status reserve_kv(int32_t n_positions);
  // A second session continuing from this one's tokens (OpenAI's n > 1): the
  // same model, stages and options, its own block tables sharing this one's
  // KV (KvPool::fork: full blocks shared, the partial last block copied). On
  // a device pool (no byte copy there) it shares the blocks before the one
  // holding the last position and evaluates the positions from there again
  // (at most block_tokens).
  // last_logits() are this session's. Not a member of any StepBatcher, no
  // row sink. Either session may then append: neither writes a shared block
  // (eval gives the position it appends at a private block first). Errors:
  // the pool's (ResourceExhausted for the copied block), nothing taken.
  // Not while this session is mid-eval.
  Result<std::unique_ptr<Session>> fork();
  // See "Every row's logits" above; an empty function removes it.
  void set_row_logits_sink(RowLogitsSink sink) { row_sink_ = std::move(sink); }
  void set_row_hidden_sink(RowHiddenSink sink) { hidden_sink_ = std::move(sink); }

  int32_t n_past() const { return static_cast<int32_t>(tokens_.size()); }
  const std::vector<TokenId>& tokens() const { return tokens_; }
  std::span<const float> last_logits() const { return last_logits_; }
  int32_t n_ctx() const { return n_ctx_; }
  int32_t n_vocab() const;
  const Model& model() const { return *model_; }
  const std::shared_ptr<const Model>& model_ptr() const { return model_; }
  const SessionOptions& options() const { return options_; }
  // The element type of its KV (the first stage's pool; open_session_group
  // gives every stage the same type). Checkpoints record it.
  KvType kv_type() const { return stages_.front().pool->type(); }

 private:
  friend class StepBatcher;
  Session() = default;
  Status run(std::span<const TokenId> tokens, std::vector<float>* all_logits);
  // The checks of an eval of n more tokens: ids in range, context room.
  Status check_append(std::span<const TokenId> tokens) const;
  // Sliding-window layers: evaluates tokens_ again from position 0 (the
  // sinks not called) after their window was given back (stale_).
  Status replay();
  // Marks the session stale when a stage's window no longer covers what a
  // continuation from n reads.
  void check_window(int32_t n);
  // The head over `rows` rows of `hidden` in groups of at most `group`, each
  // group handed to row_sink_ (positions from first_pos).
  Status sink_rows(const float* hidden, int32_t rows, int32_t first_pos, int32_t group);

  std::shared_ptr<const Model> model_;
  std::vector<SessionStage> stages_;
  std::vector<BlockTable> tables_;  // one per stage
  SessionOptions options_;
  int32_t n_ctx_ = 0;
  std::vector<TokenId> tokens_;
  std::vector<float> last_logits_;
  std::vector<float> hidden_;  // scratch [n_ubatch][n_embd]
  RowLogitsSink row_sink_;
  RowHiddenSink hidden_sink_;
  StepBatcher* batcher_ = nullptr;  // while a member (StepBatcher::Membership)
  bool stale_ = false;  // the sliding layers' KV must be computed again (replay)
};

}  // namespace spw
