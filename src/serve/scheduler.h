// Scheduler: a bounded request queue in front of N engine workers.
//
// Contract: submit() tokenizes the prompt on the caller's thread, applies the
// per-request limits and either enqueues the request or rejects it:
//   - empty prompt, invalid sampler parameters, max_tokens <= 0, or a prompt
//     that leaves no room in the context (prompt tokens >= n_ctx):
//     InvalidArgument naming the field and the limit;
//   - the queue already holds queue_capacity waiting requests: ResourceExhausted;
//   - shutdown() has begun: Unavailable.
// max_tokens is clamped to the room left in the context (n_ctx - prompt
// tokens); the AppliedLimits of the Ticket say whether it was. A request moves
// through queued -> running -> done | cancelled | failed (queued -> cancelled
// when cancelled before a worker takes it). Its Ticket receives, in order, a
// kText event for each piece of text that is safe to show (stop strings are
// never emitted), with the log-probability entries released with it when the
// request asked for them (GenerationRequest::logprobs; engine/generate.h says
// which go with which text), and exactly one kFinished event; then the event
// channel is closed. cancel() works in every state: a queued request finishes
// at once, a running one at its next token boundary; cancelling a finished
// one is a no-op.
// shutdown(grace) stops accepting (Unavailable), lets queued and running
// requests finish for up to `grace`, then cancels whatever is left (queued ones
// at once, running ones at their next token boundary) and joins the workers;
// the destructor does shutdown(0).
// Times (queue wait, run time) come from the Env's monotonic clock.
// Execution paths (the gateway's): submit_prepared() takes a request already
// tokenized and decided by admission (limits, KV blocks, the Decision it was
// admitted under). With
// kv_blocks_total > 0 the queue is KV-gated: a worker starts the request at
// the head of the queue only once its kv_blocks are free in the path's budget
// (FIFO, so a long request is not overtaken forever), takes them, and gives
// them back when the request finishes; a request needing more than the whole
// budget is started anyway and fails at its KV reservation (admission never
// sends one). Measured rates (prefill and decode tokens/s and their growth
// with position, the share of max_tokens really generated) are fitted over
// finished requests with decaying weights (admission::CostFit, the newest
// weighing rate_ewma_alpha), starting from SchedulerOptions::prior_rates.
// Thread safety: all public methods may be called from any thread. Each worker
// owns one Executor and uses it from its own thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/histogram.h"
#include "admission/controller.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "model/hparams.h"
#include "engine/finish_reason.h"
#include "engine/sampler.h"
#include "serve/channel.h"
#include "tokenizer/tokenizer.h"

namespace spw::serve {

enum class RequestState { kQueued, kRunning, kDone, kCancelled, kFailed };
std::string_view request_state_name(RequestState s);
inline bool is_terminal(RequestState s) {
  return s == RequestState::kDone || s == RequestState::kCancelled || s == RequestState::kFailed;
}

// Why a finished (kDone) generation ended is the engine's FinishReason
// (engine/finish_reason.h): kStop or kLength; a cancelled run is kCancelled
// (the scheduler reports it as RequestState::kCancelled, not as a finish).

// What a client asks for, in engine terms (the HTTP layer fills it in).
struct GenerationRequest {
  std::string prompt;  // final prompt text (chat template already applied)
  // A prompt sent as token ids (/v1/completions' "prompt": [1, 2, 3]): the
  // prompt tokens exactly as given (no BOS added, add_bos and parse_special
  // do not apply), each checked against the vocabulary by encode_prompt;
  // `prompt` is then empty. nullopt: tokenize `prompt`.
  std::optional<std::vector<TokenId>> prompt_tokens;
  bool add_bos = true;
  bool parse_special = true;  // recognise control-token texts such as "<|im_start|>"
  SamplerParams sampler;
  std::optional<int32_t> max_tokens;  // nullopt: up to the end of the context
  std::vector<std::string> stop;
  // End-of-generation rules (GenerateOptions' fields of the same names).
  bool ignore_eos = false;
  int32_t min_tokens = 0;
  std::vector<TokenId> stop_token_ids;
  // OpenAI's response_format as the source of a grammar that masks every
  // step's tokens (GenerateOptions::constraint); kNone: free text.
  grammar::ConstraintSpec constraint;
  // The durable id (the journal's) the RequestObserver reports under; 0: none.
  int64_t record_id = 0;
  // The server's own request (a warm-up): see PreparedRequest::internal.
  bool internal = false;
  // Log-probability entries per generated token (GenerateOptions::logprobs):
  // < 0 none; else this many alternatives in each.
  int32_t logprobs = -1;
  // Log-probabilities of the prompt's tokens (GenerateOptions::
  // prompt_logprobs): < 0 none; else this many alternatives in each.
  int32_t prompt_logprobs = -1;
  // Spans of this request's output inside which it must not be split (a tool
  // call's), besides the path's own (SchedulerOptions::safe_points).
  SafePointRules safe_points;
  // OpenAI's n: choices generated from one evaluation of the prompt
  // (engine/generate.h ChoiceGroup), choice i sampled with seed + i.
  int32_t n = 1;
  // An embeddings request (/v1/embeddings) when pooling is not kNone: each
  // input is pooled into one vector (engine/embedding.h) instead of a
  // generation; inputs as text (tokenized as `prompt` would be) or as token
  // ids. `prompt` / `prompt_tokens` are then ignored.
  Pooling pooling = Pooling::kNone;
  std::vector<std::string> embed_texts;
  std::vector<std::vector<TokenId>> embed_token_ids;
};

// The checks every submitter makes before tokenizing: a non-empty prompt
// (text, or token ids),
// valid sampler parameters, max_tokens >= 1 when given, min_tokens >= 0, no
// negative stop_token_ids; InvalidArgument (kInvalidField) naming the field
// otherwise.
Status validate_generation_request(const GenerationRequest& request);
// The request's prompt tokens (BOS as the request and the vocabulary say);
// InvalidArgument (kInvalidField "prompt") when it tokenizes to nothing.
// Token ids (prompt_tokens) are returned as they are, after checking each is
// in [0, n_vocab) (InvalidArgument naming the index, the id and n_vocab).
Result<std::vector<TokenId>> encode_prompt(const Tokenizer& tokenizer, const GenerationRequest& request);

// The limits submit() applied to one request (reported to the client).
struct AppliedLimits {
  int32_t n_ctx = 0;
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;  // effective completion-token limit
  std::optional<int32_t> max_tokens_requested;
  bool max_tokens_clamped = false;  // requested more than the context leaves
};

// An embeddings request's result: one vector per input, in input order,
// and the tokens its inputs came to.
struct Embeddings {
  std::vector<std::vector<float>> vectors;
  int64_t prompt_tokens = 0;
};

struct RequestEvent {
  enum class Kind { kText, kFinished };
  Kind kind = Kind::kText;
  int32_t choice = 0;                          // kText: which choice (n > 1)
  std::string text;                            // kText
  // kText: the entries released with `text` (possibly with empty text), in
  // generation order; each entry of a request reaches its stream once, also
  // across a failover or migration (ExecJob::logprobs_sent).
  std::vector<TokenLogprobs> logprobs;
  // kText (with empty text, before any generated text): the prompt's
  // entries (GenerationRequest::prompt_logprobs), once per request.
  std::vector<TokenLogprobs> prompt_logprobs;
  RequestState state = RequestState::kRunning;  // kFinished: kDone, kCancelled or kFailed
  FinishReason finish = FinishReason::kNone;   // kFinished with kDone
  Status status;                               // kFinished with kCancelled/kFailed: why
  // kFinished with a resumable error (FailureReason::kResumable): the fault
  // that interrupted it (a device fault, for the breaker); OK otherwise.
  Status cause;
  int32_t completion_tokens = 0;               // kFinished (all choices')
  // kFinished with kDone and n > 1: each choice's finish and tokens, by
  // index (`finish` is choice 0's).
  std::vector<FinishReason> choice_finish;
  std::vector<int32_t> choice_tokens;
  // kFinished with kDone of an embeddings request: its vectors, by input.
  std::shared_ptr<const Embeddings> embeddings;
};

// What a worker runs: tokens in, text out through `on_text`.
struct ExecJob {
  std::vector<TokenId> prompt;
  SamplerParams sampler;
  // Completion tokens in all (a resumed job counts the checkpoint's too).
  int32_t max_tokens = 0;
  std::vector<std::string> stop;
  // GenerateOptions' end-of-generation rules (a resumed job's come from its
  // checkpoint, as its sampler's do).
  bool ignore_eos = false;
  int32_t min_tokens = 0;
  std::vector<TokenId> stop_token_ids;
  grammar::ConstraintSpec constraint;  // GenerateOptions::constraint (a resumed job's: its checkpoint's)
  // Continue from this checkpoint (a migration or a resume) instead of
  // starting from `prompt`: its tokens are evaluated again, its sampler,
  // stop-rule and UTF-8 state restored.
  std::shared_ptr<const Checkpoint> resume;
  // Text the client already holds beyond resume->text: generated again,
  // compared byte for byte and NOT emitted; a difference fails the run with
  // FailureReason::kReplayMismatch (continuing would splice two generations).
  std::string replay;
  // > 0: report a checkpoint every this many generated tokens (at safe points).
  int32_t checkpoint_every = 0;
  // Where the run may be split: the path's spans (SchedulerOptions) and the
  // request's (request_safe_points, GenerationRequest::safe_points), joined
  // by the scheduler before each run.
  SafePointRules safe_points;
  SafePointRules request_safe_points;
  // Log-probability entries (GenerateOptions::logprobs; it overrides the
  // resume checkpoint's): < 0 none.
  int32_t logprobs = -1;
  // The client holds the entries of generated tokens [0, logprobs_sent)
  // already (a migration: the ones streamed before the fault): they are not
  // passed again, whether the run regenerates them in the replay or a
  // checkpoint held them.
  int32_t logprobs_sent = 0;
  // The prompt's entries (GenerationRequest::prompt_logprobs): < 0 none;
  // computed only by a run that starts from the prompt (not a resume).
  int32_t prompt_logprobs = -1;
  // Choices (GenerationRequest::n). A job with n > 1 reports no checkpoint
  // (a migration or resume would need one per choice): a fault after its
  // first token ends it with its own error.
  int32_t n = 1;
  // An embeddings job (pooling not kNone): each input's pooled vector
  // (engine/embedding.h) into ExecOutcome::embeddings, nothing generated.
  Pooling pooling = Pooling::kNone;
  std::vector<std::vector<TokenId>> embed_inputs;
};

struct ExecOutcome {
  FinishReason finish = FinishReason::kStop;  // choice 0's
  int32_t completion_tokens = 0;              // all choices'
  // An embeddings job's vectors, by input.
  std::shared_ptr<const Embeddings> embeddings;
  // n > 1: by choice.
  std::vector<FinishReason> choice_finish;
  std::vector<int32_t> choice_tokens;
};

// What a run reports as it goes (see Executor).
struct ExecCallbacks {
  // Text that is safe to show (never the replayed part), with the
  // log-probability entries released with it (never one the client has:
  // ExecJob::logprobs_sent); called with empty text when only entries came.
  std::function<void(std::string_view text, std::span<const TokenLogprobs> logprobs)> on_text;
  // After every generated token, n = completion tokens so far (a resumed
  // job's included).
  std::function<void(int32_t)> on_token;
  // A checkpoint at a safe token boundary: every job.checkpoint_every tokens,
  // and, when the run fails after its generation started, the last safe one
  // (the boundary after the last token when that is safe). Null: not wanted.
  std::function<void(std::shared_ptr<const Checkpoint>)> on_checkpoint;
  // The prompt's log-probability entries (ExecJob::prompt_logprobs), once
  // the prompt is evaluated, before any text.
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
  // A job with n > 1: each choice's text instead of on_text (never the
  // replayed part; n > 1 jobs are not resumed). on_token then counts the
  // tokens of all choices.
  std::function<void(int32_t choice, std::string_view text, std::span<const TokenLogprobs> logprobs)> on_choice_text;
};

// One worker's engine. run() generates for `job` through `cb` (see
// ExecCallbacks); it polls `cancel` at token boundaries and returns Cancelled
// once set. Other errors (KV pool exhausted, backend failure, a replay
// mismatch) are returned as Status.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual Result<ExecOutcome> run(const ExecJob& job, const ExecCallbacks& cb, const std::atomic<bool>& cancel) = 0;
};

class Ticket;

// Told of every accepted request's progress, e.g. to journal it. on_start runs
// on the worker's thread as the request starts, with the placement it runs on; on_finish runs once per
// request with its final event and all the text it emitted, BEFORE the client
// can see that final event (so a record read after the response is already
// terminal). Calls may come from any worker thread at once, and on_finish for
// a request cancelled while queued or at shutdown runs under the scheduler's
// lock: keep them short and never call back into the Scheduler. For a
// request with n > 1, on_finish's text is choice 0's and
// Ticket::choice_texts() holds every choice's.
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  virtual void on_start(const Ticket& ticket, const std::string& placement) = 0;
  virtual void on_finish(const Ticket& ticket, const RequestEvent& final_event, const std::string& text) = 0;
  // The request failed on this path before its first token and moved to
  // another path (Scheduler::set_failover); it will start there again. Runs
  // after the move, on the failing worker's thread.
  virtual void on_failover(const Ticket& /*ticket*/, const Status& /*failure*/) {}
  // A checkpoint of a running request (ExecCallbacks::on_checkpoint), on the
  // worker's thread, before the request's final event.
  virtual void on_checkpoint(const Ticket& /*ticket*/, const Checkpoint& /*checkpoint*/) {}
};

// Instrumentation seams, called on worker threads; tests use them to hold a
// worker (queue-full, shutdown) or to slow generation (disconnect handling).
struct SchedulerHooks {
  std::function<void(uint64_t request_id)> before_run;
  std::function<void(uint64_t request_id, int32_t n_generated)> after_token;
};

struct SchedulerOptions {
  int32_t queue_capacity = 64;  // waiting requests (running ones not counted)
  int32_t n_ctx = 0;            // context positions per request; must be > 0
  SchedulerHooks hooks;
  // Where the executors run ("cpu", "vulkan", "hybrid:N"): what every
  // response's `placement` says.
  std::string placement = "cpu";
  std::shared_ptr<RequestObserver> observer;  // null: none
  // The execution path's name ("gpu", "cpu", ...) for responses and logs.
  std::string path = "default";
  // KV gate: the path's KV budget in blocks (0: no gate) of kv_block_tokens.
  int32_t kv_blocks_total = 0;
  int32_t kv_block_tokens = 16;
  // What the ETA uses before any request finished here (see PathRates).
  admission::PathRates prior_rates{200.0, 20.0, 1.0, 0, false};
  double rate_ewma_alpha = 0.3;  // weight of the newest finished request
  // Journaled requests (record_id != 0) report a checkpoint every this many
  // generated tokens (0: only when a run fails), for resume after a crash.
  int32_t checkpoint_every = 0;
  // Where a generation may be split (ExecJob::safe_points).
  SafePointRules safe_points;
};

// A request tokenized and decided by admission (see the contract above).
struct PreparedRequest {
  uint64_t id = 0;           // unique across paths (the gateway's); 0: the scheduler numbers it
  int64_t record_id = 0;     // the journal's id; 0: none
  ExecJob job;               // prompt tokens, sampler, max_tokens (already limited), stop
  AppliedLimits limits;
  int32_t kv_blocks = 0;     // blocks for prompt + max_tokens (the KV gate's need)
  admission::Decision decision;
  // A request the server runs for itself (a circuit breaker's probe), not a
  // client's: observers that count client outcomes skip it (Ticket::internal).
  bool internal = false;
  // May continue on another path after text was streamed (a migration at a
  // checkpoint); false: a fault mid-stream ends it with a resumable error
  // (the client's X-Spillway-Migrate: never).
  bool allow_migration = true;
  // The model the client named (gateway::RouteRequest::model): a failover
  // before the first token keeps to paths serving it. Empty: any.
  std::string model;
  // Text the client already holds before this request's first event (a
  // resume: the checkpoint's text plus any replay); it starts Ticket::text().
  std::string text_before;
  // Called once when the request reaches its terminal state, after its final
  // event is queued and its KV blocks are back, on the thread that finished
  // it and under the scheduler's lock: keep it short and never call back into
  // the Scheduler (it is how a waiter on another clock learns of the end).
  std::function<void(const Ticket&)> on_finished;
};

// A path's load at one instant, for admission and status.
struct LoadSnapshot {
  std::vector<admission::WorkItem> running;
  std::vector<admission::WorkItem> queued;  // in queue order
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  admission::PathRates rates;
  double oldest_queued_s = 0;
};

struct SchedulerStats {
  int32_t queue_depth = 0;
  int32_t queue_capacity = 0;
  int32_t running = 0;
  int32_t n_workers = 0;
  uint64_t submitted = 0;  // accepted into the queue
  uint64_t rejected = 0;   // queue full or shutting down
  uint64_t done = 0;
  uint64_t cancelled = 0;
  uint64_t failed = 0;
  uint64_t failed_over = 0;  // moved to another path before the first token
  uint64_t adopted = 0;      // taken over from another path's failover
  // Latencies on this path (client requests; the server's own are left out):
  // queue wait of every request that started, and for every finished one
  // its time to first token from acceptance and its decode rate.
  Histogram queue_wait_s;
  Histogram ttft_s;
  Histogram decode_tps;
};

class Scheduler;

// The submitter's view of one request. Shared between the scheduler and the
// submitter; the event stream is single-consumer. A request that failed over
// before its first token (Scheduler::adopt) keeps its Ticket, id and stream:
// path(), decision(), limits() and kv_blocks() then say where it runs now and
// attempts() counts the moves (copies, taken under the ticket's lock).
class Ticket {
 public:
  uint64_t id() const { return id_; }
  AppliedLimits limits() const;
  uint64_t seed() const { return job_.sampler.seed; }
  std::string path() const;
  // The admission decision it runs under (default for submit()).
  admission::Decision decision() const;
  int32_t kv_blocks() const { return kv_blocks_.load(std::memory_order_acquire); }
  // Paths it failed over from, before its first token or by a migration
  // (0: none); migrations() counts the latter.
  int32_t attempts() const { return attempts_.load(std::memory_order_acquire); }
  int32_t migrations() const { return migrations_.load(std::memory_order_acquire); }
  bool allow_migration() const { return allow_migration_; }
  const std::string& model() const { return model_; }
  // The last safe checkpoint a run reported (null: none yet).
  std::shared_ptr<const Checkpoint> checkpoint() const;
  // The whole generation's text so far: PreparedRequest::text_before plus
  // everything streamed (read by the worker running it, or once finished).
  const std::string& text() const { return text_; }
  // n > 1: each choice's text so far (text() is then empty); empty for n = 1.
  const std::vector<std::string>& choice_texts() const { return choice_texts_; }
  // The job it runs (its resume point after a migration); stable while no
  // worker runs it.
  const ExecJob& job() const { return job_; }
  int32_t generated() const { return generated_.load(std::memory_order_acquire); }
  int64_t record_id() const { return record_id_; }
  // The server's own request (see PreparedRequest::internal).
  bool internal() const { return internal_; }
  RequestState state() const { return state_.load(std::memory_order_acquire); }
  // Nanoseconds spent queued / running so far (or in total, once finished).
  int64_t queue_ns() const;
  int64_t run_ns() const;

  PopResult next_event(RequestEvent& ev, std::chrono::milliseconds timeout) {
    return events_.pop_for(ev, timeout);
  }

 private:
  friend class Scheduler;
  Ticket(Env& env, PreparedRequest prepared, std::string path);

  Env& env_;
  const uint64_t id_;
  const int64_t record_id_;
  // The job: written only while no worker runs it (by the worker that just
  // failed it, before it offers the ticket to another path, and by adopt).
  ExecJob job_;
  mutable std::mutex mu_;  // guards limits_, path_, decision_
  AppliedLimits limits_;
  std::string path_;
  admission::Decision decision_;
  std::atomic<int32_t> kv_blocks_;
  std::atomic<int32_t> attempts_{0};
  std::atomic<int32_t> migrations_{0};
  const bool internal_;
  const bool allow_migration_;
  const std::string model_;
  std::shared_ptr<const Checkpoint> checkpoint_;  // under mu_
  std::string text_;  // written by the worker running it
  std::vector<std::string> choice_texts_;  // n > 1; as text_
  // Entries of generated tokens [0, logprobs_sent_) are in the stream;
  // written by the worker running it.
  int32_t logprobs_sent_ = 0;
  // The prompt's entries are in the stream (a restart after a failover
  // before the first token does not send them again); worker-written.
  bool prompt_logprobs_sent_ = false;
  std::function<void(const Ticket&)> on_finished_;  // called once, by finish_locked
  bool holds_kv_ = false;             // under the scheduler's mutex
  std::atomic<int32_t> generated_{0};
  std::atomic<RequestState> state_{RequestState::kQueued};
  std::atomic<bool> cancel_{false};
  const int64_t submitted_ns_;
  std::atomic<int64_t> started_ns_{0};
  std::atomic<int64_t> finished_ns_{0};
  Channel<RequestEvent> events_;
};

// Where a request that failed with a device fault goes next (see
// Scheduler::set_failover): called on the failing worker's thread with no
// scheduler lock held; OK when another path adopted the ticket, else why not
// (which a migration's resumable error names). The ticket's job() says which
// kind: no resume point, a restart before the first token; a resume point,
// a migration from it.
using FailoverFn = std::function<Status(const std::shared_ptr<Ticket>& ticket, const Status& failure)>;

class Scheduler {
 public:
  // One worker per executor (at least one). InvalidArgument for bad options.
  static Result<std::unique_ptr<Scheduler>> create(Env& env, std::shared_ptr<const Tokenizer> tokenizer,
                                                   std::vector<std::unique_ptr<Executor>> executors,
                                                   SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  Result<std::shared_ptr<Ticket>> submit(const GenerationRequest& request);
  // A request already tokenized and limited (see the contract). Unavailable
  // (kShuttingDown) after shutdown began, ResourceExhausted (kQueueFull) when
  // the queue is full.
  Result<std::shared_ptr<Ticket>> submit_prepared(PreparedRequest request);
  // Failover and migration. With a FailoverFn set, a client request whose
  // run fails with a device fault (classify(status).device_fault) is not
  // finished here: its KV blocks come back and `fn` is asked to place it
  // elsewhere, under the same ticket and stream.
  //   - Before any token or text (and not resumed): a restart (the job
  //     unchanged); if `fn` refuses, it fails with its own error.
  //   - After tokens or text, with a checkpoint reported by the run (or the
  //     one it resumed from): the job becomes a resume from that checkpoint,
  //     replaying the text streamed since it (ExecJob::replay), so the
  //     stream goes on with the next token, none repeated, none skipped; if
  //     `fn` refuses (another model, no verified equivalence, the client's
  //     "never", no path free), it fails with FailureReason::kResumable
  //     naming why, its checkpoint kept for a resume.
  //   - After tokens with no checkpoint: fails with its own error.
  // The observer hears on_failover (not on_finish) for a ticket that moved.
  // Set before work arrives (the gateway does it at creation).
  void set_failover(FailoverFn fn);
  // Takes over a ticket another path's failover gave up (same id, same event
  // stream): the new limits, decision and KV need from `request` (its job's
  // max_tokens too), attempts + 1 (and migrations + 1 when the job resumes),
  // queued at the back. Errors as submit_prepared; the caller keeps the
  // ticket on an error.
  Status adopt(const std::shared_ptr<Ticket>& ticket, const PreparedRequest& request);
  // 1-based position in the queue, 0 when not queued (running or finished).
  int32_t queue_position(uint64_t request_id) const;
  LoadSnapshot load() const;
  admission::PathRates rates() const;
  // Returns false when no live request has this id (unknown or already finished).
  bool cancel(uint64_t request_id);
  void shutdown(std::chrono::milliseconds grace);

  SchedulerStats stats() const;
  int32_t n_ctx() const { return options_.n_ctx; }
  const std::string& placement() const { return options_.placement; }
  const std::string& path() const { return options_.path; }
  int32_t queue_capacity() const { return options_.queue_capacity; }
  int32_t kv_block_tokens() const { return options_.kv_block_tokens; }
  // shutdown() has begun: new requests are refused.
  bool stopping() const;
  int32_t n_workers() const { return static_cast<int32_t>(executors_.size()); }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  Scheduler(Env& env, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options);
  void worker_loop(Executor* executor);
  void run_one(Executor* executor, const std::shared_ptr<Ticket>& t);
  // Moves `t` to a terminal state, counts it and closes its stream; tells the
  // observer first unless `observed` (run_one did, outside the lock). mu_ held.
  void finish_locked(Ticket& t, RequestEvent ev, bool observed = false);
  // The head of the queue may start now (KV gate). mu_ held.
  bool head_fits_locked() const;
  // Offers a request that failed with a device fault to failover_ (see
  // set_failover); OK when another path took it, else why not. mu_ not held.
  Status try_failover(const std::shared_ptr<Ticket>& t, const Status& failure);
  // Folds one finished request into the rates. mu_ held.
  void record_rates_locked(const Ticket& t, int64_t first_token_ns, int32_t completion_tokens, int64_t end_ns);

  Env& env_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  const SchedulerOptions options_;
  std::vector<std::unique_ptr<Executor>> executors_;
  std::vector<std::thread> workers_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // queue non-empty or stopping
  std::condition_variable idle_cv_;   // a running request finished
  std::deque<std::shared_ptr<Ticket>> queue_;
  std::unordered_map<uint64_t, std::shared_ptr<Ticket>> running_;
  // Failed here, being offered to another path (try_failover). A multimap:
  // a ticket that came back and failed here again is in it twice.
  std::unordered_multimap<uint64_t, std::shared_ptr<Ticket>> moving_;
  bool stopping_ = false;
  bool joined_ = false;
  uint64_t next_id_ = 1;
  SchedulerStats stats_;
  int32_t kv_blocks_free_ = 0;
  admission::PathRates rates_;
  FailoverFn failover_;
  admission::CostFit prefill_fit_, decode_fit_;  // behind rates_ (see PathRates)
};

}  // namespace spw::serve
