#include "serve/engine_executor.h"

#include "engine/device_session.h"
#include "engine/generate.h"
#include "engine/session.h"

#include <mutex>

namespace spw::serve {
namespace {

class SessionExecutor final : public Executor {
 public:
  SessionExecutor(std::unique_ptr<Session> session, bool keep_kv) : session_(std::move(session)), keep_kv_(keep_kv) {}

  Result<ExecOutcome> run(const ExecJob& job, const std::function<void(std::string_view)>& on_text,
                          const std::function<void(int32_t)>& on_token, const std::atomic<bool>& cancel) override {
    GenerateOptions o;
    o.max_tokens = job.max_tokens;
    o.sampler = job.sampler;
    o.stop = job.stop;
    o.reserve_kv = true;  // fail at the request boundary, never mid-stream
    int32_t n = 0;
    auto cb = [&](std::string_view text, TokenId id) {
      if (!text.empty()) on_text(text);
      if (id >= 0) on_token(++n);
      return !cancel.load(std::memory_order_acquire);
    };
    Result<GenerateResult> r = generate(*session_, job.prompt, o, cb, &cancel);
    if (!keep_kv_) (void)session_->truncate(0);
    if (!r.ok()) return r.status();
    if (r->finish_reason == "cancelled") return Status::cancelled("request cancelled");
    ExecOutcome out;
    out.finish = r->finish_reason == "length" ? FinishReason::kLength : FinishReason::kStop;
    out.completion_tokens = static_cast<int32_t>(r->tokens.size());
    return out;
  }

 private:
  std::unique_ptr<Session> session_;  // holds its stages' pools and backends
  bool keep_kv_;
};

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
  return so;
}

// The session group of an on-demand path, opened by the first worker that
// needs it; every worker then runs its own session of the group.
class OnDemandGroup {
 public:
  OnDemandGroup(Env& env, OnDemandModel model, SessionGroupOptions options)
      : env_(env), model_(std::move(model)), options_(std::move(options)) {}

  Result<Executor*> executor(size_t worker) {
    std::lock_guard<std::mutex> lk(mu_);
    if (executors_.empty()) {
      const int64_t t0 = env_.now_ns();
      SPW_ASSIGN_OR_RETURN(std::shared_ptr<const Model> m, model_.load());
      if (m->tokenizer().fingerprint() != model_.tokenizer->fingerprint()) {
        return Status::failed_precondition("on-demand model " + m->file().path() +
                                           " changed since start (its tokenizer differs)");
      }
      SPW_ASSIGN_OR_RETURN(SessionGroup g, open_session_group(m, options_));
      std::vector<std::unique_ptr<Executor>> ex;
      for (auto& s : g.sessions) ex.push_back(std::make_unique<SessionExecutor>(std::move(s), g.full_pool));
      group_ = std::move(g);
      executors_ = std::move(ex);
      if (model_.on_loaded) model_.on_loaded(static_cast<double>(env_.now_ns() - t0) / 1e6);
    }
    return executors_.at(worker).get();
  }

 private:
  Env& env_;
  const OnDemandModel model_;
  const SessionGroupOptions options_;
  std::mutex mu_;
  SessionGroup group_;  // backends and pools the executors' sessions use
  std::vector<std::unique_ptr<Executor>> executors_;  // empty until loaded
};

class OnDemandExecutor final : public Executor {
 public:
  OnDemandExecutor(std::shared_ptr<OnDemandGroup> group, size_t worker) : group_(std::move(group)), worker_(worker) {}
  Result<ExecOutcome> run(const ExecJob& job, const std::function<void(std::string_view)>& on_text,
                          const std::function<void(int32_t)>& on_token, const std::atomic<bool>& cancel) override {
    SPW_ASSIGN_OR_RETURN(Executor * e, group_->executor(worker_));
    return e->run(job, on_text, on_token, cancel);
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
  SPW_ASSIGN_OR_RETURN(SessionGroup group, open_session_group(model, group_options(o, n_ctx)));
  std::vector<std::unique_ptr<Executor>> executors;
  for (auto& s : group.sessions) {
    executors.push_back(std::make_unique<SessionExecutor>(std::move(s), group.full_pool));
  }
  SchedulerOptions so = scheduler_options(o, hp, n_ctx);
  if (o.kv_gate && !group.pools.empty()) so.kv_blocks_total = group.pools.front()->n_blocks();
  // The tokenizer lives inside the model: share the model's lifetime.
  std::shared_ptr<const Tokenizer> tok(model, &model->tokenizer());
  EngineServing out;
  SPW_ASSIGN_OR_RETURN(out.scheduler, Scheduler::create(env, std::move(tok), std::move(executors), std::move(so)));
  out.vulkan = std::move(group.vulkan);
  out.placement_detail = std::move(group.placement);
  return out;
}

Result<EngineServing> make_on_demand_scheduler(Env& env, OnDemandModel model, const EngineServeOptions& o) {
  if (!model.load || !model.tokenizer) return Status::invalid_argument("serve: on-demand model without loader or tokenizer");
  if (o.device.gpu_layer_count(model.hparams.n_layer) != 0) {
    return Status::invalid_argument("an on-demand replica runs on the cpu placement only, got " + o.device.name());
  }
  const LlamaHparams hp = model.hparams;
  SPW_ASSIGN_OR_RETURN(const int32_t n_ctx, check_options(hp, o));
  SchedulerOptions so = scheduler_options(o, hp, n_ctx);
  if (o.kv_gate) {
    so.kv_blocks_total =
        o.kv_blocks > 0 ? o.kv_blocks : o.n_workers * ((n_ctx + o.kv_block_tokens - 1) / o.kv_block_tokens);
  }
  std::shared_ptr<const Tokenizer> tok = model.tokenizer;
  auto group = std::make_shared<OnDemandGroup>(env, std::move(model), group_options(o, n_ctx));
  std::vector<std::unique_ptr<Executor>> executors;
  for (int32_t i = 0; i < o.n_workers; ++i) {
    executors.push_back(std::make_unique<OnDemandExecutor>(group, static_cast<size_t>(i)));
  }
  EngineServing out;
  SPW_ASSIGN_OR_RETURN(out.scheduler, Scheduler::create(env, std::move(tok), std::move(executors), std::move(so)));
  out.placement_detail = "cpu (on-demand: loaded at the first request)";
  return out;
}

}  // namespace spw::serve
