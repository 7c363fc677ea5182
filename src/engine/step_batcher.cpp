#include "engine/step_batcher.h"

#include <algorithm>

namespace spw {

StepBatcher::StepBatcher(Env& env, StepBatcherOptions options)
    : env_(env),
      max_wait_ns_(std::max<int64_t>(0, options.max_wait_ns)),
      step_tokens_(std::max<int32_t>(1, options.step_tokens)),
      mix_prefill_(options.mix_prefill) {}

StepBatcher::Membership::~Membership() {
  if (batcher_ != nullptr) batcher_->leave(*session_);
}

StepBatcher::Membership StepBatcher::join(Session& session) {
  std::lock_guard<std::mutex> lk(mu_);
  session.batcher_ = this;
  ++members_;
  return Membership(this, &session);
}

void StepBatcher::leave(Session& session) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    session.batcher_ = nullptr;
    --members_;
  }
  // The members still waiting may be all there are now.
  cv_.notify_all();
}

int32_t StepBatcher::members() const {
  std::lock_guard<std::mutex> lk(mu_);
  return members_;
}

StepBatcherStats StepBatcher::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

Result<std::span<const float>> StepBatcher::eval(Session& session, std::span<const TokenId> tokens) {
  auto entry = [&session](std::span<const TokenId> t) {
    Entry e;
    e.session = &session;
    e.tokens = t;
    return e;
  };
  if (tokens.size() == 1) {
    Entry e = entry(tokens);
    SPW_RETURN_IF_ERROR(step(e));
    return std::span<const float>(session.last_logits());
  }
  if (!mix_prefill_) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      --members_;
    }
    cv_.notify_all();  // the members waiting may be all there are now
    Status st = session.run(tokens, nullptr);
    std::lock_guard<std::mutex> lk(mu_);
    ++members_;
    SPW_RETURN_IF_ERROR(st);
    return std::span<const float>(session.last_logits());
  }
  // A prompt: checked and its KV taken up front (all or nothing, as
  // Session::eval), then fed to the steps a chunk at a time.
  SPW_RETURN_IF_ERROR(session.check_append(tokens));
  const int32_t n0 = session.n_past();
  SPW_RETURN_IF_ERROR(session.reserve_kv(n0 + static_cast<int32_t>(tokens.size())));
  while (!tokens.empty()) {
    Entry e = entry(tokens);
    Status st = step(e);
    if (!st.ok()) {
      (void)session.truncate(n0);
      return st;
    }
    tokens = tokens.subspan(static_cast<size_t>(e.taken));
  }
  return std::span<const float>(session.last_logits());
}

Status StepBatcher::step(Entry& mine) {
  std::unique_lock<std::mutex> lk(mu_);
  if (pending_.empty()) oldest_ns_ = env_.now_ns();
  pending_.push_back(&mine);
  cv_.notify_all();
  while (!mine.done) {
    const bool all_here = static_cast<int32_t>(pending_.size()) >= members_;
    const bool waited = env_.now_ns() >= oldest_ns_ + max_wait_ns_;
    if (!running_ && !pending_.empty() && (all_here || waited)) {
      // This thread runs the step for everyone waiting now: every decode
      // token, then prompt chunks in arrival order while rows are left.
      running_ = true;
      std::vector<Entry*> batch, left;
      int32_t rows = 0;
      for (Entry* e : pending_) {
        if (e->tokens.size() == 1) {
          e->taken = 1;
          ++rows;
          batch.push_back(e);
        }
      }
      bool first_prompt = true;
      int32_t prompt_rows = 0;
      for (Entry* e : pending_) {
        if (e->tokens.size() == 1) continue;
        const int32_t room = std::max(step_tokens_ - rows, first_prompt ? 1 : 0);
        first_prompt = false;
        e->taken = std::min(room, static_cast<int32_t>(e->tokens.size()));
        if (e->taken == 0) {
          left.push_back(e);
          continue;
        }
        rows += e->taken;
        prompt_rows += e->taken;
        batch.push_back(e);
      }
      pending_.swap(left);
      lk.unlock();
      std::vector<BatchPart> parts;
      parts.reserve(batch.size());
      for (Entry* e : batch) {
        const bool last = e->taken == static_cast<int32_t>(e->tokens.size());
        parts.push_back({e->session, e->tokens.first(static_cast<size_t>(e->taken)), last});
      }
      std::vector<Status> st = Session::eval_batch(parts);
      lk.lock();
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i]->status = std::move(st[i]);
        batch[i]->done = true;
      }
      running_ = false;
      ++stats_.steps;
      stats_.tokens += static_cast<uint64_t>(rows - prompt_rows);
      stats_.prompt_tokens += static_cast<uint64_t>(prompt_rows);
      if (prompt_rows > 0 && rows > prompt_rows) ++stats_.mixed_steps;
      stats_.max_batch = std::max(stats_.max_batch, static_cast<int32_t>(batch.size()));
      stats_.max_rows = std::max(stats_.max_rows, rows);
      if (!all_here) ++stats_.straggler_steps;
      if (!pending_.empty()) oldest_ns_ = env_.now_ns();  // the next step's wait starts now
      cv_.notify_all();
      continue;
    }
    if (running_) {
      cv_.wait(lk);  // the step under way ends with a notify
    } else {
      (void)env_.wait_until_ns(lk, cv_, oldest_ns_ + max_wait_ns_);
    }
  }
  return mine.status;
}

}  // namespace spw
