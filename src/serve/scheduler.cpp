#include "serve/scheduler.h"

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

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kNone: break;
  }
  return "";
}

Ticket::Ticket(Env& env, uint64_t id, int64_t record_id, ExecJob job, AppliedLimits limits)
    : env_(env), id_(id), record_id_(record_id), job_(std::move(job)), limits_(limits), submitted_ns_(env.now_ns()) {}

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
  if (options.n_ctx <= 1) {
    return Status::invalid_argument("scheduler: n_ctx must be > 1, got " + std::to_string(options.n_ctx));
  }
  std::unique_ptr<Scheduler> s(new Scheduler(env, std::move(tokenizer), std::move(options)));
  s->executors_ = std::move(executors);
  s->stats_.n_workers = static_cast<int32_t>(s->executors_.size());
  s->stats_.queue_capacity = s->options_.queue_capacity;
  for (auto& e : s->executors_) {
    Executor* ex = e.get();
    s->workers_.emplace_back([sp = s.get(), ex] { sp->worker_loop(ex); });
  }
  return s;
}

Scheduler::Scheduler(Env& env, std::shared_ptr<const Tokenizer> tokenizer, SchedulerOptions options)
    : env_(env), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {}

Scheduler::~Scheduler() { shutdown(std::chrono::milliseconds(0)); }

Result<std::shared_ptr<Ticket>> Scheduler::submit(const GenerationRequest& request) {
  if (request.prompt.empty()) return Status::invalid_argument("prompt: must not be empty");
  SPW_RETURN_IF_ERROR(validate_sampler_params(request.sampler));
  if (request.max_tokens && *request.max_tokens <= 0) {
    return Status::invalid_argument("max_tokens: must be >= 1, got " + std::to_string(*request.max_tokens));
  }
  {
    // Cheap early rejection: do not tokenize for a request that cannot queue.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.rejected;
      return Status::unavailable("server is shutting down");
    }
  }

  ExecJob job;
  job.prompt = tokenizer_->encode(request.prompt, request.add_bos && tokenizer_->add_bos_default(),
                                  request.parse_special);
  if (job.prompt.empty()) return Status::invalid_argument("prompt: tokenizes to no tokens");
  const int32_t n_ctx = options_.n_ctx;
  const auto n_prompt = static_cast<int64_t>(job.prompt.size());
  if (n_prompt >= n_ctx) {
    return Status::invalid_argument("prompt: " + std::to_string(n_prompt) +
                                    " tokens does not fit the context of " + std::to_string(n_ctx) +
                                    " tokens (at most " + std::to_string(n_ctx - 1) +
                                    " prompt tokens; the server's --ctx sets the limit)");
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

  std::shared_ptr<Ticket> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ++stats_.rejected;
      return Status::unavailable("server is shutting down");
    }
    if (static_cast<int32_t>(queue_.size()) >= options_.queue_capacity) {
      ++stats_.rejected;
      return Status::resource_exhausted("request queue is full (" + std::to_string(queue_.size()) +
                                        " waiting, capacity " + std::to_string(options_.queue_capacity) +
                                        "); retry later");
    }
    t.reset(new Ticket(env_, next_id_++, request.record_id, std::move(job), limits));
    queue_.push_back(t);
    ++stats_.submitted;
  }
  work_cv_.notify_one();
  return t;
}

bool Scheduler::cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const std::shared_ptr<Ticket>& t) { return t->id() == request_id; });
  if (it != queue_.end()) {
    std::shared_ptr<Ticket> t = *it;
    queue_.erase(it);
    RequestEvent ev;
    ev.kind = RequestEvent::Kind::kFinished;
    ev.state = RequestState::kCancelled;
    ev.status = Status::cancelled("request cancelled while queued");
    finish_locked(*t, std::move(ev));
    return true;
  }
  auto r = running_.find(request_id);
  if (r == running_.end()) return false;
  r->second->cancel_.store(true, std::memory_order_release);
  return true;
}

void Scheduler::finish_locked(Ticket& t, RequestEvent ev, bool observed) {
  if (!observed && options_.observer) options_.observer->on_finish(t, ev, std::string());
  t.finished_ns_.store(env_.now_ns(), std::memory_order_release);
  t.state_.store(ev.state, std::memory_order_release);
  switch (ev.state) {
    case RequestState::kDone: ++stats_.done; break;
    case RequestState::kCancelled: ++stats_.cancelled; break;
    default: ++stats_.failed; break;
  }
  t.events_.push(std::move(ev));
  t.events_.close();
}

void Scheduler::worker_loop(Executor* executor) {
  for (;;) {
    std::shared_ptr<Ticket> t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and nothing left
      t = std::move(queue_.front());
      queue_.pop_front();
      t->started_ns_.store(env_.now_ns(), std::memory_order_release);
      t->state_.store(RequestState::kRunning, std::memory_order_release);
      running_.emplace(t->id(), t);
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
  std::string text_so_far;  // for the observer
  if (t->cancel_.load(std::memory_order_acquire)) {
    fin.state = RequestState::kCancelled;
    fin.status = Status::cancelled("request cancelled before it started");
  } else {
    auto on_text = [&](std::string_view text) {
      if (text.empty()) return;
      if (options_.observer) text_so_far.append(text);
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kText;
      ev.text = std::string(text);
      t->events_.push(std::move(ev));
    };
    auto on_token = [&](int32_t n) {
      n_generated = n;
      if (options_.hooks.after_token) options_.hooks.after_token(id, n);
    };
    Result<ExecOutcome> r = executor->run(t->job_, on_text, on_token, t->cancel_);
    if (r.ok()) {
      fin.state = RequestState::kDone;
      fin.finish = r->finish;
      fin.completion_tokens = r->completion_tokens;
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
  if (options_.observer) options_.observer->on_finish(*t, fin, text_so_far);
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(id);
    finish_locked(*t, std::move(fin), /*observed=*/true);
  }
  idle_cv_.notify_all();
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
      idle_cv_.wait_for(lock, grace, [&] { return queue_.empty() && running_.empty(); });
    }
    if (joined_) return;  // another shutdown() finished meanwhile
    while (!queue_.empty()) {
      std::shared_ptr<Ticket> t = std::move(queue_.front());
      queue_.pop_front();
      RequestEvent ev;
      ev.kind = RequestEvent::Kind::kFinished;
      ev.state = RequestState::kCancelled;
      ev.status = Status::cancelled("server shut down before the request started");
      finish_locked(*t, std::move(ev));
    }
    for (auto& [id, t] : running_) t->cancel_.store(true, std::memory_order_release);
    joined_ = true;
    workers.swap(workers_);
  }
  for (auto& w : workers) w.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.queue_depth = static_cast<int32_t>(queue_.size());
  s.running = static_cast<int32_t>(running_.size());
  return s;
}

}  // namespace spw::serve
