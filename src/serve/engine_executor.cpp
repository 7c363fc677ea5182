#include "serve/engine_executor.h"

#include "engine/checkpoint.h"
#include "engine/device_session.h"
#include "engine/embedding.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "engine/step_batcher.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace spw::serve {
namespace {

// A request's generation options as the job gives them; reserve_kv: every
// token's KV is taken before the first one, so a request fails at its
// boundary, never mid-stream.
GenerateOptions generate_options(const ExecJob& job) {
  GenerateOptions o;
  o.max_tokens = job.max_tokens;
  o.sampler = job.sampler;
  o.stop = job.stop;
  o.ignore_eos = job.ignore_eos;
  o.min_tokens = job.min_tokens;
  o.constraint = job.constraint;
  o.stop_token_ids = job.stop_token_ids;
  o.reserve_kv = true;
  o.logprobs = job.logprobs;
  return o;
}

// A request with n > 1 choices (ExecJob::n): a ChoiceGroup over the prompt,
// evaluated once on the worker's session; the choices decode on forks of it
// that share the prompt's KV, each step one pass for all of them
// (Session::eval_batch). The prompt goes through the group's StepBatcher
// (`member`, shared with the other running requests); then the session
// leaves it, since its steps no longer go through Session::eval, and a
// member that never arrives would hold every other member's step for up to
// max_wait. No checkpoint is reported (a
// migration or a resume would need one per choice), so a fault after the
// first token ends the request with its own error.
Result<ExecOutcome> run_choices(Session& session, const ExecJob& job, const ExecCallbacks& cb,
                                const std::atomic<bool>& cancel, std::optional<StepBatcher::Membership>& member) {
  if (job.resume) return Status::failed_precondition("a request with n > 1 cannot be resumed from a checkpoint");
  // Every choice's KV is taken before the first token (reserve_kv).
  SPW_ASSIGN_OR_RETURN(auto group, ChoiceGroup::start(session, job.prompt, generate_options(job), job.n));
  member.reset();
  int32_t tokens = 0;
  auto on_piece = [&](int32_t choice, std::string_view text, TokenId id, std::span<const TokenLogprobs> logprobs) {
    if ((!text.empty() || !logprobs.empty()) && cb.on_choice_text) cb.on_choice_text(choice, text, logprobs);
    if (id >= 0 && cb.on_token) cb.on_token(++tokens);
    return !cancel.load(std::memory_order_acquire);
  };
  while (!group->finished()) {
    if (cancel.load(std::memory_order_acquire)) {
      group->cancel();
      break;
    }
    SPW_RETURN_IF_ERROR(group->step(on_piece).status());
  }
  ExecOutcome out;
  for (int32_t i = 0; i < group->size(); ++i) {
    const GenerateResult& r = group->choice(i).result();
    if (r.finish_reason == FinishReason::kCancelled) return Status::cancelled("request cancelled");
    const FinishReason f = r.finish_reason;
    const auto n = static_cast<int32_t>(r.tokens.size());
    out.choice_finish.push_back(f);
    out.choice_tokens.push_back(n);
    out.completion_tokens += n;
  }
  out.finish = out.choice_finish.front();
  return out;
}

// An embeddings job: each input pooled in turn on the session (its prompt
// passes share the batched steps like any prompt), the cancel flag read
// between inputs.
Result<ExecOutcome> run_embeddings(Session& session, const ExecJob& job, const std::atomic<bool>& cancel) {
  auto vectors = std::make_shared<Embeddings>();
  vectors->vectors.reserve(job.embed_inputs.size());
  for (const std::vector<TokenId>& input : job.embed_inputs) {
    if (cancel.load(std::memory_order_acquire)) return Status::cancelled("request cancelled");
    SPW_ASSIGN_OR_RETURN(std::vector<float> v, embed_tokens(session, input, job.pooling));
    vectors->vectors.push_back(std::move(v));
    vectors->prompt_tokens += static_cast<int64_t>(input.size());
  }
  ExecOutcome out;
  out.finish = FinishReason::kStop;
  out.embeddings = std::move(vectors);
  return out;
}

// One request on one session of a group: a Generator started from the
// prompt or resumed from a checkpoint, stepped here so that checkpoints are
// taken between steps (a clean token boundary, never inside a step).
Result<ExecOutcome> run_on_session(Session& session, bool keep_kv, StepBatcher* batcher, const ExecJob& job,
                                   const ExecCallbacks& cb, const std::atomic<bool>& cancel) {
  struct KvRelease {  // a pool smaller than the default: never keep KV between requests
    Session& s;
    bool keep;
    ~KvRelease() {
      if (!keep) (void)s.truncate(0);
    }
  } release{session, keep_kv};
  // Every eval of this request, its prompt in chunks and then its decode
  // steps, shares the group's batched steps with the other running requests.
  // Declared after `release`: the session leaves the batch before its KV is
  // given back.
  std::optional<StepBatcher::Membership> member;
  if (batcher != nullptr) member.emplace(batcher->join(session));
  if (job.pooling != Pooling::kNone) return run_embeddings(session, job, cancel);
  if (job.n > 1) return run_choices(session, job, cb, cancel, member);
  Result<std::unique_ptr<Generator>> started = [&]() -> Result<std::unique_ptr<Generator>> {
    if (job.resume) {
      Checkpoint cp = *job.resume;
      cp.options.max_tokens = job.max_tokens;  // the path's limit may differ from the first one's
      cp.options.reserve_kv = true;
      cp.options.logprobs = job.logprobs;  // what this response reports, not part of the state
      return Generator::resume(session, cp);
    }
    GenerateOptions o = generate_options(job);
    o.prompt_logprobs = job.prompt_logprobs;
    return Generator::start(session, job.prompt, o);
  }();
  if (!started.ok()) return started.status();
  Generator& g = **started;
  if (!g.result().prompt_logprobs.empty() && cb.on_prompt_logprobs) cb.on_prompt_logprobs(g.result().prompt_logprobs);

  // The last safe boundary: where a failure continues from when the current
  // one is not safe. Without rules every boundary is safe, so nothing is kept.
  std::shared_ptr<const Checkpoint> last_safe = job.resume;
  if (!last_safe && !job.safe_points.empty()) last_safe = std::make_shared<const Checkpoint>(g.checkpoint());
  auto report = [&](bool at_failure) {
    if (!cb.on_checkpoint) return;
    auto cp = std::make_shared<const Checkpoint>(g.checkpoint());
    if (check_safe_point(*cp, job.safe_points).ok()) {
      last_safe = cp;
      cb.on_checkpoint(std::move(cp));
    } else if (at_failure && last_safe) {
      cb.on_checkpoint(last_safe);
    }
  };

  size_t replayed = 0;  // bytes of job.replay regenerated so far
  std::string mismatch;
  auto on_piece = [&](std::string_view text, TokenId id, std::span<const TokenLogprobs> logprobs) {
    if (replayed < job.replay.size() && !text.empty()) {
      const size_t k = std::min(text.size(), job.replay.size() - replayed);
      if (text.substr(0, k) != std::string_view(job.replay).substr(replayed, k)) {
        mismatch = "the regenerated text differs from the text the client holds at byte " +
                   std::to_string(job.resume ? job.resume->text.size() + replayed : replayed);
        return false;
      }
      replayed += k;
      text.remove_prefix(k);
    }
    // Entries the client has (streamed before a migration) are not sent
    // again; they come first (in generation order).
    while (!logprobs.empty() && logprobs.front().index < job.logprobs_sent) logprobs = logprobs.subspan(1);
    if (!text.empty() || !logprobs.empty()) cb.on_text(text, logprobs);
    if (id >= 0 && cb.on_token) cb.on_token(g.n_generated());
    return !cancel.load(std::memory_order_acquire);
  };
  const int32_t every = job.checkpoint_every;
  while (!g.finished()) {
    if (cancel.load(std::memory_order_acquire)) {
      g.cancel();
      break;
    }
    Result<bool> r = g.step(on_piece);
    if (!r.ok()) {
      if (g.n_generated() > 0 || job.resume) report(/*at_failure=*/true);
      return r.status();
    }
    if (*r && every > 0 && g.n_generated() % every == 0) report(/*at_failure=*/false);
  }
  if (!mismatch.empty()) return Status(StatusCode::kFailedPrecondition, mismatch, FailureReason::kReplayMismatch);
  if (g.result().finish_reason == FinishReason::kCancelled) return Status::cancelled("request cancelled");
  if (replayed < job.replay.size()) {
    return Status(StatusCode::kFailedPrecondition,
                  "the regenerated text ended after " + std::to_string(replayed) + " of the " +
                      std::to_string(job.replay.size()) + " bytes the client holds beyond the checkpoint",
                  FailureReason::kReplayMismatch);
  }
  ExecOutcome out;
  out.finish = g.result().finish_reason;
  out.completion_tokens = g.n_generated();
  return out;
}

class SessionExecutor final : public Executor {
 public:
  SessionExecutor(std::unique_ptr<Session> session, bool keep_kv, std::shared_ptr<StepBatcher> batcher)
      : session_(std::move(session)), keep_kv_(keep_kv), batcher_(std::move(batcher)) {}

  Result<ExecOutcome> run(const ExecJob& job, const ExecCallbacks& cb, const std::atomic<bool>& cancel) override {
    return run_on_session(*session_, keep_kv_, batcher_.get(), job, cb, cancel);
  }

 private:
  std::unique_ptr<Session> session_;  // holds its stages' pools and backends
  bool keep_kv_;
  std::shared_ptr<StepBatcher> batcher_;  // the group's; null: no batching
};

// The session group of a path with layers on a Vulkan device, shared by its
// workers, which re-opens itself after the device was re-initialised: the
// backend then no longer accepts the group's device pool (accepts_kv), its
// uploaded weights are gone, and every session of the group is useless. The
// first worker to start a run while no other worker of the group is mid-run
// drops the old group (so its memory is free again) and opens it anew, same
// options: weights uploaded again, pools of the same sizes (the KV gate's
// budget stays right). A run that finds the group stale while another worker
// runs or rebuilds fails with Unavailable (no typed reason: the device is
// not known to be bad, it is being brought back), as does one after a
// re-open that failed (with that failure's status, typed by the backend);
// the next run tries again.
class DeviceGroup {
 public:
  DeviceGroup(Env& env, std::shared_ptr<const Model> model, SessionGroupOptions options, SessionGroup group,
              std::function<void(const Status&, double)> on_reopened)
      : env_(env),
        model_(std::move(model)),
        options_(std::move(options)),
        group_(std::move(group)),
        on_reopened_(std::move(on_reopened)) {
    // Re-opens use the same backend, whoever opened it first.
    options_.vulkan = group_.vulkan;
    keep_kv_ = group_.full_pool;
  }

  // The worker's session for one run, counted as running until end().
  Result<Session*> begin(size_t worker) {
    std::unique_lock<std::mutex> lk(mu_);
    if (rebuilding_ || (stale_locked() && running_ > 0)) {
      return Status::unavailable("the " + options_.device.name() +
                                 " session group is being re-opened after the device was re-initialised");
    }
    if (stale_locked()) {
      rebuilding_ = true;
      SessionGroup old = std::move(group_);
      group_ = SessionGroup{};
      lk.unlock();
      const int64_t t0 = env_.now_ns();
      old = SessionGroup{};  // sessions, then pools: their device memory is free before the new ones
      Result<SessionGroup> g = open_session_group(model_, options_);
      const double ms = static_cast<double>(env_.now_ns() - t0) / 1e6;
      if (on_reopened_) on_reopened_(g.ok() ? Status() : g.status(), ms);
      lk.lock();
      rebuilding_ = false;
      if (!g.ok()) return g.status().with_context("re-opening the session group");
      group_ = std::move(*g);
      keep_kv_ = group_.full_pool;
    }
    ++running_;
    return group_.sessions.at(worker).get();
  }
  void end() {
    std::lock_guard<std::mutex> lk(mu_);
    --running_;
  }
  bool keep_kv() const { return keep_kv_; }
  StepBatcher* batcher() const { return batcher_.get(); }
  void set_batcher(std::shared_ptr<StepBatcher> b) { batcher_ = std::move(b); }

 private:
  bool stale_locked() const {
    if (group_.sessions.empty()) return true;  // a re-open failed: try again
    return group_.vulkan && group_.n_gpu_layers > 0 && !group_.pools.empty() &&
           !group_.vulkan->accepts_kv(*group_.pools.front());
  }

  Env& env_;
  const std::shared_ptr<const Model> model_;
  SessionGroupOptions options_;
  std::mutex mu_;
  SessionGroup group_;
  int32_t running_ = 0;
  bool rebuilding_ = false;
  bool keep_kv_ = false;  // written under mu_ with no worker running
  const std::function<void(const Status&, double)> on_reopened_;
  std::shared_ptr<StepBatcher> batcher_;  // survives re-opens (it holds no session)
};

class DeviceGroupExecutor final : public Executor {
 public:
  DeviceGroupExecutor(std::shared_ptr<DeviceGroup> group, size_t worker) : group_(std::move(group)), worker_(worker) {}
  Result<ExecOutcome> run(const ExecJob& job, const ExecCallbacks& cb, const std::atomic<bool>& cancel) override {
    SPW_ASSIGN_OR_RETURN(Session * s, group_->begin(worker_));
    Result<ExecOutcome> r = run_on_session(*s, group_->keep_kv(), group_->batcher(), job, cb, cancel);
    group_->end();
    return r;
  }

 private:
  std::shared_ptr<DeviceGroup> group_;
  size_t worker_;
};

// The group's step batcher: with several workers and batching on (one
// worker has nothing to batch with). Every backend's forward_batch shares
// the weight pass among the step's sequences (CPU, Vulkan, and so hybrid).
// A step's rows are bounded by the sessions' ubatch (the estimator's m).
std::shared_ptr<StepBatcher> make_batcher(Env& env, const EngineServeOptions& o) {
  if (!o.batching || o.n_workers < 2) return nullptr;
  StepBatcherOptions bo;
  bo.max_wait_ns = static_cast<int64_t>(o.batch_max_wait_us) * 1000;
  const int32_t ub = SessionGroupOptions{}.n_ubatch;
  bo.step_tokens = o.step_tokens > 0 ? std::min(o.step_tokens, ub) : ub;
  bo.mix_prefill = o.mix_prefill;
  return std::make_shared<StepBatcher>(env, bo);
}

// The options' checks and the n_ctx they resolve to (0: the model's).
Result<int32_t> check_options(const LlamaHparams& hp, const EngineServeOptions& o) {
  if (o.n_workers < 1) return Status::invalid_argument("--parallel must be >= 1, got " + std::to_string(o.n_workers));
  if (o.n_threads < 1) return Status::invalid_argument("--threads must be >= 1, got " + std::to_string(o.n_threads));
  if (o.kv_blocks < 0) return Status::invalid_argument("--kv-blocks must be >= 0, got " + std::to_string(o.kv_blocks));
  if (o.queue_capacity < 0) {
    return Status::invalid_argument("--queue must be >= 0, got " + std::to_string(o.queue_capacity));
  }
  if (o.kv_block_tokens < 1) {
    return Status::invalid_argument("--kv-block must be >= 1, got " + std::to_string(o.kv_block_tokens));
  }
  const int32_t n_ctx = o.n_ctx == 0 ? hp.n_ctx_train : o.n_ctx;
  if (n_ctx < 2 || n_ctx > hp.n_ctx_train) {
    return Status::invalid_argument("--ctx must be in [2, " + std::to_string(hp.n_ctx_train) +
                                    "] (the model's context_length), got " + std::to_string(n_ctx));
  }
  return n_ctx;
}

SessionGroupOptions group_options(const EngineServeOptions& o, int32_t n_ctx) {
  SessionGroupOptions go;
  go.device = o.device;
  go.device_memory_bytes = o.device_memory_bytes;
  go.vulkan = o.vulkan;
  go.n_sessions = o.n_workers;
  go.n_threads = o.n_threads;
  go.n_ctx = n_ctx;
  go.kv_blocks = o.kv_blocks;
  go.kv_block_tokens = o.kv_block_tokens;
  go.kv_type = o.kv_type;
  go.cpu_faults = o.cpu_faults;
  return go;
}

SchedulerOptions scheduler_options(const EngineServeOptions& o, const LlamaHparams& hp, int32_t n_ctx) {
  SchedulerOptions so;
  so.queue_capacity = o.queue_capacity;
  so.n_ctx = n_ctx;
  so.hooks = o.hooks;
  so.observer = o.observer;
  so.placement = o.device.resolved(hp.n_layer).name();  // as the group clamps it
  so.path = o.path_name;
  so.kv_block_tokens = o.kv_block_tokens;
  so.prior_rates = o.prior_rates;
  so.checkpoint_every = o.checkpoint_every;
  return so;
}

// A session group's workers' executors: with layers on a Vulkan device a
// DeviceGroup they share (it re-opens itself after the device is
// re-initialised), else one SessionExecutor per session. The executors own
// the sessions (which hold their stages' pools and backends).
std::vector<std::unique_ptr<Executor>> group_executors(Env& env, std::shared_ptr<const Model> model,
                                                       const SessionGroupOptions& go, SessionGroup group,
                                                       const std::shared_ptr<StepBatcher>& batcher,
                                                       std::function<void(const Status&, double)> on_reopened) {
  std::vector<std::unique_ptr<Executor>> executors;
  if (group.vulkan && group.n_gpu_layers > 0) {
    const size_t n = group.sessions.size();
    auto shared = std::make_shared<DeviceGroup>(env, std::move(model), go, std::move(group), std::move(on_reopened));
    shared->set_batcher(batcher);
    for (size_t i = 0; i < n; ++i) executors.push_back(std::make_unique<DeviceGroupExecutor>(shared, i));
  } else {
    for (auto& s : group.sessions) {
      executors.push_back(std::make_unique<SessionExecutor>(std::move(s), group.full_pool, batcher));
    }
  }
  return executors;
}

// The session group of an on-demand path, opened by the first worker that
// needs it; every worker then runs its own session of the group.
class OnDemandGroup {
 public:
  OnDemandGroup(Env& env, OnDemandModel model, SessionGroupOptions options, std::shared_ptr<StepBatcher> batcher,
                std::function<void(const Status&, double)> on_reopened)
      : env_(env),
        model_(std::move(model)),
        options_(std::move(options)),
        batcher_(std::move(batcher)),
        on_reopened_(std::move(on_reopened)) {}

  // The worker's executor, loading the model first when it is not loaded;
  // the caller runs on it and then calls release(). Counted, so that
  // unload() never takes a group a worker is running on.
  Result<Executor*> acquire(size_t worker) {
    std::lock_guard<std::mutex> lk(mu_);
    if (executors_.empty()) {
      const int64_t t0 = env_.now_ns();
      SPW_ASSIGN_OR_RETURN(std::shared_ptr<const Model> m, model_.load());
      if (m->tokenizer().fingerprint() != model_.tokenizer->fingerprint()) {
        return Status::failed_precondition("on-demand model " + m->file().path() +
                                           " changed since start (its tokenizer differs)");
      }
      SPW_ASSIGN_OR_RETURN(SessionGroup g, open_session_group(m, options_));
      executors_ = group_executors(env_, m, options_, std::move(g), batcher_, on_reopened_);
      loaded_ = m;
      if (model_.on_loaded) model_.on_loaded(static_cast<double>(env_.now_ns() - t0) / 1e6);
    }
    ++active_;
    return executors_.at(worker).get();
  }

  void release() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      --active_;
    }
    idle_.notify_all();
  }

  // Gives the weights and sessions back (the next acquire() loads again).
  // A worker that just delivered a request's last event may still be
  // leaving run(): waits for that up to `wait_ns` (the Env's clock), then
  // false, keeping them, if a worker still runs on them.
  bool unload(int64_t wait_ns) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!env_.wait_until_ns(lk, idle_, env_.now_ns() + wait_ns, [&] { return active_ == 0; })) return false;
    executors_.clear();  // sessions, pools, backends
    // The device backend is the server's, shared by every model on the
    // device: it keeps a model's uploaded weights until told (keyed by the
    // Model, which dies here; a later Model at the same address is not it).
    if (options_.vulkan && loaded_) options_.vulkan->release_model(*loaded_);
    loaded_.reset();
    return true;
  }

  const OnDemandModel& model() const { return model_; }
  bool loaded() {
    std::lock_guard<std::mutex> lk(mu_);
    return !executors_.empty();
  }

 private:
  Env& env_;
  const OnDemandModel model_;
  const SessionGroupOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Executor>> executors_;  // empty until loaded
  std::shared_ptr<const Model> loaded_;               // the model the executors run, while loaded
  int active_ = 0;  // workers between acquire() and release()
  std::condition_variable idle_;  // active_ fell
  const std::shared_ptr<StepBatcher> batcher_;
  const std::function<void(const Status&, double)> on_reopened_;
};

class OnDemandExecutor final : public Executor {
 public:
  OnDemandExecutor(std::shared_ptr<OnDemandGroup> group, size_t worker) : group_(std::move(group)), worker_(worker) {}
  Result<ExecOutcome> run(const ExecJob& job, const ExecCallbacks& cb, const std::atomic<bool>& cancel) override {
    const OnDemandModel& m = group_->model();
    if (m.begin_run) SPW_RETURN_IF_ERROR(m.begin_run(cancel));
    Result<ExecOutcome> out = [&]() -> Result<ExecOutcome> {
      SPW_ASSIGN_OR_RETURN(Executor * e, group_->acquire(worker_));
      Result<ExecOutcome> r = e->run(job, cb, cancel);
      group_->release();
      return r;
    }();
    if (m.end_run) m.end_run(group_->loaded());
    return out;
  }

 private:
  std::shared_ptr<OnDemandGroup> group_;
  size_t worker_;
};

}  // namespace

Result<EngineServing> make_engine_scheduler(Env& env, std::shared_ptr<const Model> model,
                                            const EngineServeOptions& o) {
  if (!model) return Status::invalid_argument("serve: no model");
  const LlamaHparams& hp = model->hparams();
  SPW_ASSIGN_OR_RETURN(const int32_t n_ctx, check_options(hp, o));
  const SessionGroupOptions go = group_options(o, n_ctx);
  SPW_ASSIGN_OR_RETURN(SessionGroup group, open_session_group(model, go));
  SchedulerOptions so = scheduler_options(o, hp, n_ctx);
  if (o.kv_gate && !group.pools.empty()) so.kv_blocks_total = group.pools.front()->n_blocks();
  EngineServing out;
  out.vulkan = group.vulkan;
  out.placement_detail = group.placement;
  auto batcher = make_batcher(env, o);
  out.batcher = batcher;
  std::vector<std::unique_ptr<Executor>> executors =
      group_executors(env, model, go, std::move(group), batcher, o.on_reopened);
  // The tokenizer lives inside the model: share the model's lifetime.
  std::shared_ptr<const Tokenizer> tok(model, &model->tokenizer());
  SPW_ASSIGN_OR_RETURN(out.scheduler, Scheduler::create(env, std::move(tok), std::move(executors), std::move(so)));
  return out;
}

Result<EngineServing> make_on_demand_scheduler(Env& env, OnDemandModel model, const EngineServeOptions& o) {
  if (!model.load || !model.tokenizer) return Status::invalid_argument("serve: on-demand model without loader or tokenizer");
  const LlamaHparams hp = model.hparams;
  SPW_ASSIGN_OR_RETURN(const int32_t n_ctx, check_options(hp, o));
  SchedulerOptions so = scheduler_options(o, hp, n_ctx);
  if (o.kv_gate) {
    so.kv_blocks_total =
        o.kv_blocks > 0 ? o.kv_blocks : o.n_workers * ((n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens);
  }
  std::shared_ptr<const Tokenizer> tok = model.tokenizer;
  auto batcher = make_batcher(env, o);
  auto group =
      std::make_shared<OnDemandGroup>(env, std::move(model), group_options(o, n_ctx), batcher, o.on_reopened);
  std::vector<std::unique_ptr<Executor>> executors;
  for (int32_t i = 0; i < o.n_workers; ++i) {
    executors.push_back(std::make_unique<OnDemandExecutor>(group, static_cast<size_t>(i)));
  }
  EngineServing out;
  out.batcher = batcher;
  out.vulkan = o.vulkan;
  out.unload = [group] { return group->unload(int64_t{5'000'000'000}); };
  out.placement_detail = so.placement + " (on-demand: loaded at the first request)";
  SPW_ASSIGN_OR_RETURN(out.scheduler, Scheduler::create(env, std::move(tok), std::move(executors), std::move(so)));
  return out;
}

}  // namespace spw::serve
