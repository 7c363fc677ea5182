#include "serve/engine_executor.h"

#include "engine/device_session.h"
#include "engine/generate.h"
#include "engine/session.h"

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

}  // namespace

Result<EngineServing> make_engine_scheduler(Env& env, std::shared_ptr<const Model> model,
                                            const EngineServeOptions& o) {
  if (!model) return Status::invalid_argument("serve: no model");
  const LlamaHparams& hp = model->hparams();
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
  SessionGroupOptions go;
  go.device = o.device;
  go.device_memory_bytes = o.device_memory_bytes;
  go.vulkan = o.vulkan;
  go.n_sessions = o.n_workers;
  go.n_threads = o.n_threads;
  go.n_ctx = n_ctx;
  go.kv_blocks = o.kv_blocks;
  go.kv_block_tokens = o.kv_block_tokens;
  SPW_ASSIGN_OR_RETURN(SessionGroup group, open_session_group(model, go));
  std::vector<std::unique_ptr<Executor>> executors;
  for (auto& s : group.sessions) {
    executors.push_back(std::make_unique<SessionExecutor>(std::move(s), group.full_pool));
  }
  SchedulerOptions so;
  so.queue_capacity = o.queue_capacity;
  so.n_ctx = n_ctx;
  so.hooks = o.hooks;
  so.observer = o.observer;
  so.placement = o.device.resolved(hp.n_layer).name();  // as the group clamps it
  so.path = o.path_name;
  so.kv_block_tokens = o.kv_block_tokens;
  if (o.kv_gate && !group.pools.empty()) so.kv_blocks_total = group.pools.front()->n_blocks();
  so.prior_rates = o.prior_rates;
  // The tokenizer lives inside the model: share the model's lifetime.
  std::shared_ptr<const Tokenizer> tok(model, &model->tokenizer());
  EngineServing out;
  SPW_ASSIGN_OR_RETURN(out.scheduler, Scheduler::create(env, std::move(tok), std::move(executors), std::move(so)));
  out.vulkan = std::move(group.vulkan);
  out.placement_detail = std::move(group.placement);
  return out;
}

}  // namespace spw::serve
