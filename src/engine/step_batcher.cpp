#include "engine/step_batcher.h"

#include <algorithm>

namespace spw {

StepBatcher::StepBatcher(Env& env, int64_t max_wait_ns) : env_(env), max_wait_ns_(std::max<int64_t>(0, max_wait_ns)) {}

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

Result<std::span<const float>> StepBatcher::step(Session& session, TokenId token) {
  Entry mine{&session, token, Status(), false};
  std::unique_lock<std::mutex> lk(mu_);
  if (pending_.empty()) oldest_ns_ = env_.now_ns();
  pending_.push_back(&mine);
  cv_.notify_all();
  while (!mine.done) {
    const bool all_here = static_cast<int32_t>(pending_.size()) >= members_;
    const bool waited = env_.now_ns() >= oldest_ns_ + max_wait_ns_;
    if (!running_ && !pending_.empty() && (all_here || waited)) {
      // This thread runs the step for everyone waiting now.
      running_ = true;
      std::vector<Entry*> batch;
      batch.swap(pending_);
      lk.unlock();
      std::vector<Session*> sessions;
      std::vector<TokenId> tokens;
      for (Entry* e : batch) {
        sessions.push_back(e->session);
        tokens.push_back(e->token);
      }
      std::vector<Status> st = Session::eval_batch(sessions, tokens);
      lk.lock();
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i]->status = std::move(st[i]);
        batch[i]->done = true;
      }
      running_ = false;
      ++stats_.steps;
      stats_.tokens += batch.size();
      stats_.max_batch = std::max(stats_.max_batch, static_cast<int32_t>(batch.size()));
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
  lk.unlock();
  if (!mine.status.ok()) return mine.status;
  return std::span<const float>(session.last_logits());
}

}  // namespace spw
