#include "serve/scheduler.h"

#include "core/failure.h"
#include "engine/generate.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace spw::serve {

std::string_view request_state_name(RequestState s) {
  switch (s) {
    case RequestState::kQueued: return "queued";
    case RequestState::kRunning: return "running";
    case RequestState::kDone: return "done";
    case RequestState::kCancelled: return "cancelled";
    case RequestState::kFailed: return "failed";
  }
  return "unknown";
}

Ticket::Ticket(Env& env, PreparedRequest p, std::string path)
    : env_(env),
      id_(p.id),
      record_id_(p.record_id),
      job_(std::move(p.job)),
      limits_(p.limits),
      path_(std::move(path)),
      decision_(std::move(p.decision)),
      kv_blocks_(p.kv_blocks),
      internal_(p.internal),
      allow_migration_(p.allow_migration),
      model_(std::move(p.model)),
      checkpoint_(job_.resume),
      text_(std::move(p.text_before)),
      on_finished_(std::move(p.on_finished)),
      submitted_ns_(env.now_ns()) {}

AppliedLimits Ticket::limits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limits_;
}

std::string Ticket::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return path_;
}

std::shared_ptr<const Checkpoint> Ticket::checkpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checkpoint_;
}

admission::Decision Ticket::decision() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decision_;
}

int64_t Ticket::queue_ns() const {
  int64_t started = started_ns_.load(std::memory_order_acquire);
  if (started != 0) return started - submitted_ns_;
  int64_t finished = finished_ns_.load(std::memory_order_acquire);
  return (finished != 0 ? finished : env_.now_ns()) - submitted_ns_;
}

int64_t Ticket::run_ns() const {
  int64_t started = started_ns_.load(std::memory_order_acquire);
  if (started == 0) return 0;
  int64_t finished = finished_ns_.load(std::memory_order_acquire);
  return (finished != 0 ? finished : env_.now_ns()) - started;
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(Env& env, std::shared_ptr<const Tokenizer> tokenizer,
                                                     std::vector<std::unique_ptr<Executor>> executors,
                                                     SchedulerOptions options) {
  if (!tokenizer) return Status::invalid_argument("scheduler: no tokenizer");
  if (executors.empty()) return Status::invalid_argument("scheduler: need at least one worker");
  for (const auto& e : executors) {
    if (!e) return Status::invalid_argument("scheduler: null executor");
  }
  if (options.queue_capacity < 0) {
    return Status::invalid_argument("scheduler: queue_capacity must be >= 0, got " +
                                    std::to_string(options.queue_capacity));
  }
  if (options.kv_blocks_total < 0 || options.kv_block_tokens < 1) {
    return Status::invalid_argument("scheduler: kv_blocks_total must be >= 0 and kv_block_tokens >= 1");
  }
  if (options.n_ctx <= 1) {
    return Status::invalid_argument("scheduler: n_ctx must be > 1, got " + std::to_string(options.n_ctx));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(env, std::move(tokenizer), std::move(options)));
  s->executors_ = std::move(executors);
  s->stats_.n_workers = static_cast<int32_t>(s->executors_.size());
  s->stats_.queue_capacity = s->options_.queue_capacity;
  s->kv_blocks_free_ = s->options_.kv_blocks_total;
  s->rates_ = s->options_.prior_rates;
  for (auto& e : s->executors_) {
    Executor* ex = e.get();
    s->workers_.emplace_back([sp = s.get(), ex] { sp->worker_loop(ex); });
  }
  return s;
}

Scheduler::Scheduler(Env& env, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options)
    : env_(env), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  // Seconds from 1 ms to ~2 min by factors of 2.5; decode rates from 1 to
  // ~60k tokens/s: wide enough for a GPU and a 2-core CPU on any model.
  stats_.queue_wait_s = Histogram(Histogram::exponential(0.001, 2.5, 14));
  stats_.ttft_s = Histogram(Histogram::exponential(0.001, 2.5, 14));
  stats_.decode_tps = Histogram(Histogram::exponential(1.0, 2.5, 13));
}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

Status validate_generation_request(const GenerationRequest& request) {
  if (request.pooling != Pooling::kNone) {
    if (request.embed_texts.empty() == request.embed_token_ids.empty()) {
      return invalid_field("input", "input: one or more texts, or one or more token-id arrays");
    }
    for (const std::string& t : request.embed_texts)
      if (t.empty()) return invalid_field("input", "input: an empty string cannot be embedded");
    for (const auto& ids : request.embed_token_ids)
      if (ids.empty()) return invalid_field("input", "input: an empty token array cannot be embedded");
    return Status::ok_status();
  }
  if (request.prompt_tokens ? request.prompt_tokens->empty() : request.prompt.empty()) {
    return invalid_field("prompt", "prompt: must not be empty");
  }
  SPW_RETURN_IF_ERROR(validate_sampler_params(request.sampler));
  if (request.max_tokens && *request.max_tokens <= 0) {
    return invalid_field("max_tokens", "max_tokens: must be >= 1, got " + std::to_string(*request.max_tokens));
  }
  if (request.n < 1 || request.n > kMaxChoices) {
    return invalid_field("n", "n: must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(request.n));
  }
  if (request.min_tokens < 0) {
    return invalid_field("min_tokens", "min_tokens: must be >= 0, got " + std::to_string(request.min_tokens));
  }
  for (TokenId id : request.stop_token_ids) {
    if (id < 0) return invalid_field("stop_token_ids", "stop_token_ids: token id " + std::to_string(id) + " is negative");
  }
  return Status::ok_status();
}

Result<std::vector<TokenId>> encode_prompt(const Tokenizer& tokenizer, const GenerationRequest& request) {
  if (request.prompt_tokens) {
    const std::vector<TokenId>& ids = *request.prompt_tokens;
    if (ids.empty()) return invalid_field("prompt", "prompt: must not be empty");
    const int32_t n_vocab = tokenizer.n_vocab();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= n_vocab) {
        return invalid_field("prompt", "prompt[" + std::to_string(i) + "]: token id " + std::to_string(ids[i]) +
                                           " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
      }
    }
    return ids;
  }
  std::vector<TokenId> tokens =
      tokenizer.encode(request.prompt, request.add_bos && tokenizer.add_bos_default(), request.parse_special);
  if (tokens.empty()) return invalid_field("prompt", "prompt: tokenizes to no tokens");
  return tokens;
}

Result<std::shared_ptr<Ticket>> Scheduler::submit(const GenerationRequest& request) {
  SPW_RETURN_IF_ERROR(validate_generation_request(request));
  {
    // Cheap early rejection: do not tokenize for a request that cannot queue.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.rejected;
      return Status(StatusCode::kUnavailable, "server is shutting down", FailureReason::kShuttingDown);
    }
  }

  ExecJob job;
  SPW_ASSIGN_OR_RETURN(job.prompt, encode_prompt(*tokenizer_, request));
  const int32_t n_ctx = options_.n_ctx;
  const auto n_prompt = static_cast<int64_t>(job.prompt.size());
  if (n_prompt >= n_ctx) {
    return Status(StatusCode::kInvalidArgument,
                  "prompt: " + std::to_string(n_prompt) + " tokens does not fit the context of " +
                      std::to_string(n_ctx) + " tokens (at most " + std::to_string(n_ctx - 1) +
                      " prompt tokens; the server's --ctx sets the limit)",
                  FailureReason::kContextFull, "prompt");
  }
  AppliedLimits limits;
  limits.n_ctx = n_ctx;
  limits.prompt_tokens = static_cast<int32_t>(n_prompt);
  limits.max_tokens_requested = request.max_tokens;
  const auto room = static_cast<int32_t>(n_ctx - n_prompt);
  limits.max_tokens = request.max_tokens ? std::min(*request.max_tokens, room) : room;
  limits.max_tokens_clamped = request.max_tokens && *request.max_tokens > room;
  job.sampler = request.sampler;
  job.max_tokens = limits.max_tokens;
  job.stop = request.stop;
  job.ignore_eos = request.ignore_eos;
  job.min_tokens = request.min_tokens;
  job.constraint = request.constraint;
  job.stop_token_ids = request.stop_token_ids;
  job.logprobs = request.logprobs;
  job.prompt_logprobs = request.prompt_logprobs;
  job.n = request.n;
  PreparedRequest p;
  p.record_id = request.record_id;
  p.internal = request.internal;
  p.kv_blocks =
      admission::kv_blocks_for_choices(limits.prompt_tokens, limits.max_tokens, options_.kv_block_tokens, request.n);
  p.job = std::move(job);
  p.limits = limits;
  return submit_prepared(std::move(p));
}

Result<std::shared_ptr<Ticket>> Scheduler::submit_prepared(PreparedRequest request) {
  std::shared_ptr<Ticket> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.rejected;
      return Status(StatusCode::kUnavailable, "server is shutting down", FailureReason::kShuttingDown);
    }
    if (static_cast<int32_t>(queue_.size()) >= options_.queue_capacity) {
      ++stats_.rejected;
      return Status(StatusCode::kResourceExhausted,
                    "request queue of path " + options_.path + " is full (" + std::to_string(queue_.size()) +
                        " waiting, capacity " + std::to_string(options_.queue_capacity) + "); retry later",
                    FailureReason::kQueueFull);
    }
    if (request.id == 0) request.id = next_id_++;
    t.reset(new Ticket(env_, std::move(request), options_.path));
    queue_.push_back(t);
    ++stats_.submitted;
  }
  work_cv_.notify_one();
  return t;
}

void Scheduler::set_failover(FailoverFn fn) {
  std::lock_guard<std::mutex> lock(mu_);
  failover_ = std::move(fn);
}

Status Scheduler::adopt(const std::shared_ptr<Ticket>& t, const PreparedRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status(StatusCode::kUnavailable, "server is shutting down", FailureReason::kShuttingDown);
    if (static_cast<int32_t>(queue_.size()) >= options_.queue_capacity) {
      return Status(StatusCode::kResourceExhausted, "request queue of path " + options_.path + " is full",
                    FailureReason::kQueueFull);
    }
    {
      std::lock_guard<std::mutex> tl(t->mu_);
      t->limits_ = request.limits;
      t->path_ = options_.path;
      t->decision_ = request.decision;
    }
    t->job_.max_tokens = request.job.max_tokens;
    t->kv_blocks_.store(request.kv_blocks, std::memory_order_release);
    t->attempts_.fetch_add(1, std::memory_order_acq_rel);
    if (t->job_.resume) t->migrations_.fetch_add(1, std::memory_order_acq_rel);
    t->holds_kv_ = false;
    t->started_ns_.store(0, std::memory_order_release);
    t->state_.store(RequestState::kQueued, std::memory_order_release);
    queue_.push_back(t);
    ++stats_.adopted;
  }
  work_cv_.notify_one();
  return Status::ok_status();
}

bool Scheduler::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

int32_t Scheduler::queue_position(uint64_t request_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (queue_[i]->id() == request_id) return static_cast<int32_t>(i) + 1;
  }
  return 0;
}

admission::PathRates Scheduler::rates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rates_;
}

LoadSnapshot Scheduler::load() const {
  const int64_t now = env_.now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  LoadSnapshot s;
  s.kv_blocks_total = options_.kv_blocks_total;
  s.kv_blocks_free = kv_blocks_free_;
  s.rates = rates_;
  auto item = [&](const Ticket& t) {
    admission::WorkItem w;
    // Under the ticket's lock: a ticket failing over stays listed here while
    // the next path's adopt() rewrites its limits.
    const AppliedLimits limits = t.limits();
    w.prompt_tokens = limits.prompt_tokens;
    w.max_tokens = limits.max_tokens;
    w.generated = t.generated();
    w.kv_blocks = t.kv_blocks();
    const int64_t started = t.started_ns_.load(std::memory_order_acquire);
    w.elapsed_s = started != 0 ? static_cast<double>(now - started) / 1e9 : 0.0;
    return w;
  };
  for (const auto& [id, t] : running_) s.running.push_back(item(*t));
  for (const auto& [id, t] : moving_) s.running.push_back(item(*t));
  for (const auto& t : queue_) s.queued.push_back(item(*t));
  if (!queue_.empty()) s.oldest_queued_s = static_cast<double>(now - queue_.front()->submitted_ns_) / 1e9;
  return s;
}

bool Scheduler::head_fits_locked() const {
  if (queue_.empty()) return false;
  if (options_.kv_blocks_total == 0) return true;
  const int32_t need = queue_.front()->kv_blocks();
  return need <= kv_blocks_free_ || need > options_.kv_blocks_total;
}

void Scheduler::record_rates_locked(const Ticket& t, int64_t first_token_ns, int32_t completion_tokens,
                                    int64_t end_ns) {
  const int64_t started = t.started_ns_.load(std::memory_order_acquire);
  if (started == 0 || first_token_ns <= started || completion_tokens < 1) return;
  const double a = rates_.measured ? options_.rate_ewma_alpha : 1.0;
  // Prefill: P tokens at positions 0..P-1 from start to the first token.
  const AppliedLimits limits = t.limits();
  const double p = limits.prompt_tokens;
  prefill_fit_.add(p, p * (p - 1.0) / 2.0, static_cast<double>(first_token_ns - started) / 1e9, a);
  (void)prefill_fit_.solve(rates_.prefill_tps, rates_.prefill_s_per_pos);
  // Decode: the tokens after the first, one step each at positions P..P+n-1.
  if (completion_tokens > 1 && end_ns > first_token_ns) {
    const double n = completion_tokens - 1;
    decode_fit_.add(n, n * p + n * (n - 1.0) / 2.0, static_cast<double>(end_ns - first_token_ns) / 1e9, a);
    (void)decode_fit_.solve(rates_.decode_tps, rates_.decode_s_per_pos);
  }
  if (limits.max_tokens > 0) {
    rates_.completion_share = a * (static_cast<double>(completion_tokens) / static_cast<double>(limits.max_tokens)) +
                              (1.0 - a) * rates_.completion_share;
  }
  ++rates_.samples;
  rates_.measured = true;
}

bool Scheduler::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const std::shared_ptr<Ticket>& t) { return t->id() == request_id; });
  if (it != queue_.end()) {
    std::shared_ptr<Ticket> t = *it;
    queue_.erase(it);
    work_cv_.notify_all();  // a new head of the queue may fit the KV gate
    RequestEvent ev;
    ev.kind = RequestEvent::Kind::kFinished;
    ev.state = RequestState::kCancelled;
    ev.status = Status(StatusCode::kCancelled, "request cancelled while queued", FailureReason::kCancelled);
    finish_locked(*t, std::move(ev));
    return true;
  }
  auto r = running_.find(request_id);
  if (r == running_.end()) {
    // Between paths: the next path sees the flag before it starts it.
    auto m = moving_.find(request_id);
    if (m == moving_.end()) return false;
    m->second->cancel_.store(true, std::memory_order_release);
    return true;
  }
  r->second->cancel_.store(true, std::memory_order_release);
  return true;
}

void Scheduler::finish_locked(Ticket& t, RequestEvent ev, bool observed) {
  // Stamped before the observer runs, so that the times it records (the
  // journal, for replays) are the ones the response reports.
  int64_t unset = 0;
  t.finished_ns_.compare_exchange_strong(unset, env_.now_ns(), std::memory_order_acq_rel);
  if (!observed && options_.observer) options_.observer->on_finish(t, ev, std::string());
  if (t.holds_kv_) {
    kv_blocks_free_ += t.kv_blocks_;
    t.holds_kv_ = false;
    work_cv_.notify_all();  // the head of the queue may fit now
  }
  t.state_.store(ev.state, std::memory_order_release);
  switch (ev.state) {
    case RequestState::kDone: ++stats_.done; break;
    case RequestState::kCancelled: ++stats_.cancelled; break;
    default: ++stats_.failed; break;
  }
  t.events_.push(std::move(ev));
  t.events_.close();
  if (t.on_finished_) {
    auto f = std::move(t.on_finished_);
    t.on_finished_ = nullptr;
    f(t);
  }
}

void Scheduler::worker_loop(Executor* executor) {
  for (;;) {
    std::shared_ptr<Ticket> t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return (stopping_ && queue_.empty()) || head_fits_locked(); });
      if (queue_.empty()) return;  // stopping and nothing left
      t = std::move(queue_.front());
      queue_.pop_front();
      if (options_.kv_blocks_total > 0 && t->kv_blocks() <= kv_blocks_free_) {
        kv_blocks_free_ -= t->kv_blocks();
        t->holds_kv_ = true;
      }
      if (head_fits_locked()) work_cv_.notify_one();  // the next one may fit as well
      const int64_t now = env_.now_ns();
      t->started_ns_.store(now, std::memory_order_release);
      t->state_.store(RequestState::kRunning, std::memory_order_release);
      running_.emplace(t->id(), t);
      if (!t->internal()) stats_.queue_wait_s.observe(static_cast<double>(now - t->submitted_ns_) / 1e9);
    }
    if (options_.observer) options_.observer->on_start(*t, options_.placement);
    run_one(executor, t);
  }
}

void Scheduler::run_one(Executor* executor, const std::shared_ptr<Ticket>& t) {
  const uint64_t id = t->id();
  if (options_.hooks.before_run) options_.hooks.before_run(id);
  RequestEvent fin;
  fin.kind = RequestEvent::Kind::kFinished;
  int32_t n_generated = 0;
  int64_t first_token_ns = 0;
  const size_t text_before = t->text_.size();  // the client holds it already
  const bool resumed = t->job_.resume != nullptr;
  if (t->cancel_.load(std::memory_order_acquire)) {
    fin.state = RequestState::kCancelled;
    fin.status = Status(StatusCode::kCancelled, "request cancelled before it started", FailureReason::kCancelled);
  } else {
    ExecCallbacks cb;
    cb.on_text = [&](std::string_view text, std::span<const TokenLogprobs> logprobs) {
      if (text.empty() && logprobs.empty()) return;
      t->text_.append(text);
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kText;
      ev.text = std::string(text);
      if (!logprobs.empty()) {
        ev.logprobs.assign(logprobs.begin(), logprobs.end());
        t->logprobs_sent_ = logprobs.back().index + 1;
      }
      t->events_.push(std::move(ev));
    };
    if (t->job_.n > 1) t->choice_texts_.resize(static_cast<size_t>(t->job_.n));
    cb.on_choice_text = [&](int32_t choice, std::string_view text, std::span<const TokenLogprobs> logprobs) {
      if (text.empty() && logprobs.empty()) return;
      if (choice < 0 || static_cast<size_t>(choice) >= t->choice_texts_.size()) return;
      t->choice_texts_[static_cast<size_t>(choice)].append(text);
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kText;
      ev.choice = choice;
      ev.text = std::string(text);
      ev.logprobs.assign(logprobs.begin(), logprobs.end());
      t->events_.push(std::move(ev));
    };
    cb.on_prompt_logprobs = [&](std::span<const TokenLogprobs> entries) {
      if (t->prompt_logprobs_sent_ || entries.empty()) return;
      t->prompt_logprobs_sent_ = true;
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kText;
      ev.prompt_logprobs.assign(entries.begin(), entries.end());
      t->events_.push(std::move(ev));
    };
    cb.on_token = [&](int32_t n) {
      if (n_generated == 0) first_token_ns = env_.now_ns();
      n_generated = n;
      t->generated_.store(n, std::memory_order_release);
      if (options_.hooks.after_token) options_.hooks.after_token(id, n);
    };
    cb.on_checkpoint = [&](std::shared_ptr<const Checkpoint> cp) {
      if (!cp) return;
      {
        std::lock_guard<std::mutex> lock(t->mu_);
        t->checkpoint_ = cp;
      }
      if (options_.observer && !t->internal()) options_.observer->on_checkpoint(*t, *cp);
    };
    ExecJob& job = t->job_;  // no other thread touches it while this worker runs it
    job.checkpoint_every = t->record_id() != 0 ? options_.checkpoint_every : 0;
    // The path's spans and the request's own (a tool call's).
    job.safe_points = options_.safe_points;
    job.safe_points.spans.insert(job.safe_points.spans.end(), job.request_safe_points.spans.begin(),
                                 job.request_safe_points.spans.end());
    Result<ExecOutcome> r = executor->run(job, cb, t->cancel_);
    if (r.ok()) {
      fin.state = RequestState::kDone;
      fin.finish = r->finish;
      fin.completion_tokens = r->completion_tokens;
      fin.choice_finish = r->choice_finish;
      fin.choice_tokens = r->choice_tokens;
      fin.embeddings = r->embeddings;
    } else if (r.status().code() == StatusCode::kCancelled) {
      fin.state = RequestState::kCancelled;
      fin.status = r.status();
      fin.completion_tokens = n_generated;
    } else {
      fin.state = RequestState::kFailed;
      fin.status = r.status();
      fin.completion_tokens = n_generated;
    }
  }
  if (fin.state == RequestState::kFailed && !t->internal() && classify(fin.status).device_fault) {
    const bool started = n_generated > 0 || t->text_.size() > text_before || resumed;
    std::shared_ptr<const Checkpoint> cp = t->checkpoint();
    if (!started) {
      if (try_failover(t, fin.status).ok()) return;
    } else if (cp) {
      // Continue from the checkpoint; the text streamed since it is the
      // replay the next run must regenerate silently. A checkpoint is taken
      // at a token boundary whose text was all streamed, so it is a prefix.
      t->job_.resume = cp;
      t->job_.replay = t->text_.size() >= cp->text.size() ? t->text_.substr(cp->text.size()) : std::string();
      t->job_.logprobs_sent = t->logprobs_sent_;
      const Status moved = try_failover(t, fin.status);
      if (moved.ok()) return;
      fin.cause = fin.status;
      fin.status = Status(StatusCode::kUnavailable,
                          "generation interrupted after " + std::to_string(cp->n_generated) + " tokens by " +
                              fin.status.to_string() + "; it did not move to another path (" + moved.message() +
                              "); its checkpoint is kept: POST /v1/requests/{id}/resume continues it",
                          FailureReason::kResumable);
    }
  }
  {
    int64_t unset = 0;  // as finish_locked: the end before the observer
    t->finished_ns_.compare_exchange_strong(unset, env_.now_ns(), std::memory_order_acq_rel);
  }
  // n > 1: choice 0's text; the observer reads the others from the ticket
  // (Ticket::choice_texts).
  if (options_.observer) options_.observer->on_finish(*t, fin, t->choice_texts_.empty() ? t->text_ : t->choice_texts_[0]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(id);
    if (fin.state == RequestState::kDone && !resumed) {
      const int64_t end_ns = env_.now_ns();
      record_rates_locked(*t, first_token_ns, fin.completion_tokens, end_ns);
      if (!t->internal() && first_token_ns > 0) {
        stats_.ttft_s.observe(static_cast<double>(first_token_ns - t->submitted_ns_) / 1e9);
        if (fin.completion_tokens > 1 && end_ns > first_token_ns) {
          stats_.decode_tps.observe((fin.completion_tokens - 1) / (static_cast<double>(end_ns - first_token_ns) / 1e9));
        }
      }
    }
    finish_locked(*t, std::move(fin), /*observed=*/true);
  }
  idle_cv_.notify_all();
}

Status Scheduler::try_failover(const std::shared_ptr<Ticket>& t, const Status& failure) {
  FailoverFn fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failover_) return Status::unavailable("no other path is configured");
    if (t->cancel_.load(std::memory_order_acquire)) return Status::cancelled("the request was cancelled");
    fn = failover_;
    // Its blocks come back before another path is chosen. It leaves the
    // running requests for the moving ones until the move is done, so that
    // it is never in no path at all (cancel() finds it; a snapshot counts
    // it), and so that, should it come back to this path and start here
    // again before this thread is done, that run's entry is its own.
    if (t->holds_kv_) {
      kv_blocks_free_ += t->kv_blocks();
      t->holds_kv_ = false;
      work_cv_.notify_all();
    }
    running_.erase(t->id());
    moving_.emplace(t->id(), t);
  }
  const Status moved = fn(t, failure);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto range = moving_.equal_range(t->id());
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == t) {
        moving_.erase(it);
        break;
      }
    }
    if (!moved.ok()) {
      running_.emplace(t->id(), t);  // run_one fails it here; its blocks are already back
      return moved;
    }
    ++stats_.failed_over;
  }
  idle_cv_.notify_all();
  if (options_.observer) options_.observer->on_failover(*t, failure);
  return Status::ok_status();
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  std::vector<std::thread> workers;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (joined_) return;
    stopping_ = true;
    work_cv_.notify_all();
    // Drain: queued and running requests may still finish within the grace.
    if (grace.count() > 0) {
      idle_cv_.wait_for(lock, grace, [&] { return queue_.empty() && running_.empty() && moving_.empty(); });
    }
    if (joined_) return;  // another shutdown() finished meanwhile
    while (!queue_.empty()) {
      std::shared_ptr<Ticket> t = std::move(queue_.front());
      queue_.pop_front();
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kFinished;
      ev.state = RequestState::kCancelled;
      ev.status = Status(StatusCode::kCancelled, "server shut down before the request started", FailureReason::kShuttingDown);
      finish_locked(*t, std::move(ev));
    }
    for (auto& [id, t] : running_) t->cancel_.store(true, std::memory_order_release);
    for (auto& [id, t] : moving_) t->cancel_.store(true, std::memory_order_release);
    joined_ = true;
    workers.swap(workers_);
  }
  for (auto& w : workers) w.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queue_depth = static_cast<int32_t>(queue_.size());
  s.running = static_cast<int32_t>(running_.size() + moving_.size());
  return s;
}

}  // namespace spw::serve
