#include "serve/scheduler.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "engine/engine_test_util.h"
#include "engine/generate.h"
#include "model/model.h"
#include "serve/engine_executor.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/placement.h"
#include "serve/journal_observer.h"
#include "serve/testing/collect.h"
#include "serve/testing/fake_executor.h"

namespace spw::serve {
namespace {

using spw::testing::stories;  // engine/engine_test_util.h
using spw::serve::testing::Collected;  // serve/testing/collect.h
using spw::serve::testing::collect;

GenerationRequest greedy(std::string prompt, int32_t max_tokens) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampler.temperature = 0;
  g.max_tokens = max_tokens;
  return g;
}


// A gate that holds workers in before_run until opened.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int waiting = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    ++waiting;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void wait_for_waiters(int n) {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return waiting >= n; }));
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

std::unique_ptr<Scheduler> make(EngineServeOptions o) {
  auto model = stories();
  if (!model) return nullptr;
  auto s = make_engine_scheduler(Env::default_env(), model, o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s->scheduler) : nullptr;
}

TEST(Scheduler, GreedyCompletionTellsAboutLily) {
  auto s = make({});
  ASSERT_NE(s, nullptr);
  auto t = s->submit(greedy("Once upon a time", 60));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->limits().n_ctx, stories()->hparams().n_ctx_train);
  EXPECT_EQ((*t)->limits().max_tokens, 60);
  EXPECT_FALSE((*t)->limits().max_tokens_clamped);
  EXPECT_GT((*t)->limits().prompt_tokens, 1);
  Collected c = collect(**t);
  EXPECT_EQ(c.n_finished, 1);
  EXPECT_EQ(c.fin.state, RequestState::kDone);
  EXPECT_EQ((*t)->state(), RequestState::kDone);
  EXPECT_NE(c.text.find("Lily"), std::string::npos) << c.text;
  EXPECT_GT(c.fin.completion_tokens, 0);
  EXPECT_LE(c.fin.completion_tokens, 60);
  EXPECT_TRUE(c.fin.finish == FinishReason::kLength || c.fin.finish == FinishReason::kStop);
  EXPECT_GE((*t)->run_ns(), 0);
  SchedulerStats st = s->stats();
  EXPECT_EQ(st.done, 1u);
  EXPECT_EQ(st.queue_depth, 0);
  EXPECT_EQ(st.running, 0);

  // Same request again (this worker reuses the prompt's KV): identical text.
  auto t2 = s->submit(greedy("Once upon a time", 60));
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(collect(**t2).text, c.text);
}

// OpenAI's n: one request, n choices by index; choice i is the lone
// request with seed + i; the KV gate prices the shared prompt once.
void n_choices_equal_lone_requests(int32_t workers) {
  EngineServeOptions o;
  o.n_workers = workers;
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  GenerationRequest g = greedy("Once upon a time", 24);
  g.sampler.temperature = 1.0f;
  g.sampler.seed = 77;
  g.n = 3;
  auto t = s->submit(g);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const int32_t p = (*t)->limits().prompt_tokens;
  EXPECT_EQ((*t)->kv_blocks(), admission::kv_blocks_for_choices(p, 24, 16, 3));
  std::vector<std::string> texts(3);
  RequestEvent fin;
  for (;;) {
    RequestEvent ev;
    const PopResult r = (*t)->next_event(ev, std::chrono::seconds(30));
    ASSERT_EQ(r, PopResult::kItem);
    if (ev.kind == RequestEvent::Kind::kFinished) {
      fin = ev;
      break;
    }
    ASSERT_GE(ev.choice, 0);
    ASSERT_LT(ev.choice, 3);
    texts[static_cast<size_t>(ev.choice)] += ev.text;
  }
  ASSERT_EQ(fin.state, RequestState::kDone) << fin.status.to_string();
  ASSERT_EQ(fin.choice_finish.size(), 3u);
  ASSERT_EQ(fin.choice_tokens.size(), 3u);
  EXPECT_EQ(fin.completion_tokens, fin.choice_tokens[0] + fin.choice_tokens[1] + fin.choice_tokens[2]);
  EXPECT_EQ((*t)->choice_texts(), texts);
  for (int32_t i = 0; i < 3; ++i) {
    GenerationRequest one = g;
    one.n = 1;
    one.sampler.seed = choice_seed(77, i);
    auto lone = s->submit(one);
    ASSERT_TRUE(lone.ok());
    Collected c = collect(**lone);
    EXPECT_EQ(c.text, texts[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(c.fin.completion_tokens, fin.choice_tokens[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(c.fin.finish, fin.choice_finish[static_cast<size_t>(i)]) << i;
  }
  EXPECT_NE(texts[0], texts[1]);
  GenerationRequest bad = g;
  bad.n = kMaxChoices + 1;
  EXPECT_EQ(s->submit(bad).status().code(), StatusCode::kInvalidArgument);
}

// Beside a request with n > 1 (which leaves the step batcher after its
// prompt), another worker's request gets its own text.
TEST(Scheduler, NChoicesBesideABatchedRequestLeaveItsTextAlone) {
  EngineServeOptions o;
  o.n_workers = 2;
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto alone = s->submit(greedy("Lily and Ben went to the park", 40));
  ASSERT_TRUE(alone.ok());
  const std::string expected = collect(**alone).text;
  GenerationRequest many = greedy("Once upon a time", 40);
  many.n = 4;
  auto t = s->submit(many);
  auto other = s->submit(greedy("Lily and Ben went to the park", 40));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(other.ok());
  Collected c = collect(**other);
  Collected m = collect(**t);
  EXPECT_EQ(c.text, expected);
  ASSERT_EQ(m.fin.state, RequestState::kDone) << m.fin.status.to_string();
  ASSERT_EQ((*t)->choice_texts().size(), 4u);
  for (const std::string& x : (*t)->choice_texts()) EXPECT_EQ(x, (*t)->choice_texts()[0]);
  EXPECT_FALSE((*t)->choice_texts()[0].empty());
}

TEST(Scheduler, NChoicesEqualLoneRequestsWithSeedPlusI) { n_choices_equal_lone_requests(1); }
TEST(Scheduler, NChoicesEqualLoneRequestsWithSeedPlusIBatched) { n_choices_equal_lone_requests(2); }

TEST(Scheduler, StopStringEndsWithStopAndIsNotEmitted) {
  auto s = make({});
  ASSERT_NE(s, nullptr);
  auto base = s->submit(greedy("Once upon a time", 60));
  ASSERT_TRUE(base.ok());
  const std::string full = collect(**base).text;
  const size_t at = full.find("Lily");
  ASSERT_NE(at, std::string::npos);
  GenerationRequest g = greedy("Once upon a time", 60);
  g.stop = {"Lily"};
  auto t = s->submit(g);
  ASSERT_TRUE(t.ok());
  Collected c = collect(**t);
  EXPECT_EQ(c.fin.finish, FinishReason::kStop);
  EXPECT_EQ(c.text, full.substr(0, at));
}

TEST(Scheduler, ClampsMaxTokensAndRejectsPromptsThatDoNotFit) {
  EngineServeOptions o;
  o.n_ctx = 24;
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto t = s->submit(greedy("Once upon a time", 1000));
  ASSERT_TRUE(t.ok());
  const AppliedLimits& l = (*t)->limits();
  EXPECT_EQ(l.n_ctx, 24);
  EXPECT_TRUE(l.max_tokens_clamped);
  EXPECT_EQ(l.max_tokens_requested, 1000);
  EXPECT_EQ(l.max_tokens, 24 - l.prompt_tokens);
  Collected c = collect(**t);
  EXPECT_EQ(c.fin.state, RequestState::kDone);
  EXPECT_LE(c.fin.completion_tokens, l.max_tokens);

  std::string long_prompt;
  for (int i = 0; i < 20; ++i) long_prompt += "Once upon a time ";
  auto bad = s->submit(greedy(long_prompt, 4));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("context of 24 tokens"), std::string::npos) << bad.status().message();

  EXPECT_EQ(s->submit(greedy("", 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->submit(greedy("x", 0)).status().code(), StatusCode::kInvalidArgument);
  GenerationRequest nan = greedy("x", 4);
  nan.sampler.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(s->submit(nan).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->stats().submitted, 1u);
}

TEST(Scheduler, FullQueueRejectsWithResourceExhausted) {
  Gate gate;
  EngineServeOptions o;
  o.queue_capacity = 1;
  o.hooks.before_run = [&](uint64_t) { gate.wait(); };
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto a = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(a.ok());
  gate.wait_for_waiters(1);  // a is running (held)
  EXPECT_EQ((*a)->state(), RequestState::kRunning);
  auto b = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->state(), RequestState::kQueued);
  auto c = s->submit(greedy("Once upon a time", 8));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("capacity 1"), std::string::npos);
  SchedulerStats st = s->stats();
  EXPECT_EQ(st.queue_depth, 1);
  EXPECT_EQ(st.running, 1);
  EXPECT_EQ(st.rejected, 1u);
  gate.release();
  EXPECT_EQ(collect(**a).fin.state, RequestState::kDone);
  EXPECT_EQ(collect(**b).fin.state, RequestState::kDone);
  EXPECT_EQ(s->stats().done, 2u);
}

TEST(Scheduler, CancelQueuedFinishesAtOnce) {
  Gate gate;
  EngineServeOptions o;
  o.hooks.before_run = [&](uint64_t) { gate.wait(); };
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto a = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(a.ok());
  gate.wait_for_waiters(1);
  auto b = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(s->cancel((*b)->id()));
  EXPECT_EQ((*b)->state(), RequestState::kCancelled);
  Collected cb = collect(**b);  // already closed: does not wait for the worker
  EXPECT_EQ(cb.n_finished, 1);
  EXPECT_EQ(cb.fin.state, RequestState::kCancelled);
  EXPECT_EQ(cb.fin.status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(cb.text.empty());
  EXPECT_FALSE(s->cancel((*b)->id()));  // no longer live
  EXPECT_EQ(s->stats().queue_depth, 0);
  gate.release();
  EXPECT_EQ(collect(**a).fin.state, RequestState::kDone);
  EXPECT_FALSE(s->cancel((*a)->id()));
  EXPECT_FALSE(s->cancel(12345));
}

TEST(Scheduler, CancelRunningStopsAtTokenBoundaryAndFreesTheWorker) {
  std::mutex mu;
  Scheduler* sp = nullptr;
  EngineServeOptions o;
  // Cancel request 1 from inside its own run, after its 5th token.
  o.hooks.after_token = [&](uint64_t id, int32_t n) {
    if (id == 1 && n == 5) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(sp->cancel(id));
    }
  };
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu);
    sp = s.get();
  }
  auto a = s->submit(greedy("Once upon a time", 200));
  ASSERT_TRUE(a.ok());
  ASSERT_EQ((*a)->id(), 1u);
  Collected ca = collect(**a);
  EXPECT_EQ(ca.fin.state, RequestState::kCancelled);
  EXPECT_EQ(ca.fin.completion_tokens, 5);
  EXPECT_FALSE(ca.text.empty());
  // The worker is free again and the session still produces the same story.
  auto b = s->submit(greedy("Once upon a time", 60));
  ASSERT_TRUE(b.ok());
  Collected cb = collect(**b);
  EXPECT_EQ(cb.fin.state, RequestState::kDone);
  EXPECT_EQ(cb.text.substr(0, ca.text.size()), ca.text);
  SchedulerStats st = s->stats();
  EXPECT_EQ(st.cancelled, 1u);
  EXPECT_EQ(st.done, 1u);
}

TEST(Scheduler, ShutdownCancelsQueuedAndRefusesNewWork) {
  Gate gate;
  EngineServeOptions o;
  o.hooks.before_run = [&](uint64_t) { gate.wait(); };
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto a = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(a.ok());
  gate.wait_for_waiters(1);
  auto b = s->submit(greedy("Once upon a time", 8));
  ASSERT_TRUE(b.ok());
  std::thread stopper([&] { s->shutdown(std::chrono::milliseconds(0)); });
  // b is cancelled by the shutdown even while the worker is still held.
  Collected cb = collect(**b);
  EXPECT_EQ(cb.fin.state, RequestState::kCancelled);
  auto c = s->submit(greedy("Once upon a time", 8));
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  gate.release();
  stopper.join();
  // a was running past the 0 ms grace: cancelled at its first boundary.
  EXPECT_EQ(collect(**a).fin.state, RequestState::kCancelled);
}

TEST(Scheduler, ShutdownWithGraceDrainsQueuedAndRunning) {
  auto s = make({});
  ASSERT_NE(s, nullptr);
  auto a = s->submit(greedy("Once upon a time", 40));
  auto b = s->submit(greedy("Once upon a time", 40));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  s->shutdown(std::chrono::seconds(30));  // drains both: one runs, one waits
  Collected ca = collect(**a);
  EXPECT_EQ(ca.fin.state, RequestState::kDone);
  EXPECT_NE(ca.text.find("Lily"), std::string::npos);
  EXPECT_EQ(collect(**b).fin.state, RequestState::kDone);
  EXPECT_EQ(s->submit(greedy("Once upon a time", 4)).status().code(), StatusCode::kUnavailable);
}

TEST(Scheduler, ManyClientsOnTwoWorkersGetTheSameGreedyText) {
  EngineServeOptions o;
  o.n_workers = 2;
  o.queue_capacity = 64;
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto ref = s->submit(greedy("Once upon a time", 30));
  ASSERT_TRUE(ref.ok());
  const std::string expected = collect(**ref).text;
  ASSERT_FALSE(expected.empty());
  constexpr int kThreads = 4, kPerThread = 3;
  std::vector<std::thread> clients;
  std::mutex mu;
  std::vector<std::string> texts;
  for (int i = 0; i < kThreads; ++i) {
    clients.emplace_back([&] {
      for (int k = 0; k < kPerThread; ++k) {
        auto t = s->submit(greedy("Once upon a time", 30));
        ASSERT_TRUE(t.ok()) << t.status().to_string();
        Collected c = collect(**t);
        std::lock_guard<std::mutex> lock(mu);
        texts.push_back(c.text);
        (void)s->stats();
      }
    });
  }
  for (auto& c : clients) c.join();
  ASSERT_EQ(texts.size(), static_cast<size_t>(kThreads * kPerThread));
  for (const auto& t : texts) EXPECT_EQ(t, expected);
  EXPECT_EQ(s->stats().done, static_cast<uint64_t>(kThreads * kPerThread + 1));
}

TEST(Scheduler, SmallKvPoolFailsRequestsCleanly) {
  EngineServeOptions o;
  o.kv_blocks = 1;  // 16 positions for everyone
  auto s = make(o);
  ASSERT_NE(s, nullptr);
  auto t = s->submit(greedy("Once upon a time", 100));
  ASSERT_TRUE(t.ok());
  Collected c = collect(**t);
  EXPECT_EQ(c.fin.state, RequestState::kFailed);
  EXPECT_EQ(c.fin.status.code(), StatusCode::kResourceExhausted);
  // The KV for the whole request is taken up front: it fails before its first
  // token, not half-way through the stream.
  EXPECT_TRUE(c.text.empty()) << c.text;
  EXPECT_NE(c.fin.status.message().find("before generation"), std::string::npos) << c.fin.status.to_string();
  EXPECT_EQ(s->stats().failed, 1u);
  // The pool was returned: a short request still fits.
  auto ok = s->submit(greedy("Once upon a time", 3));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(collect(**ok).fin.state, RequestState::kDone);
}

TEST(Scheduler, RejectsBadOptions) {
  auto model = stories();
  ASSERT_NE(model, nullptr);
  EngineServeOptions o;
  o.n_ctx = 100000;
  auto r = make_engine_scheduler(Env::default_env(), model, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--ctx"), std::string::npos);
  o = {};
  o.n_workers = 0;
  EXPECT_EQ(make_engine_scheduler(Env::default_env(), model, o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.queue_capacity = -1;
  EXPECT_EQ(make_engine_scheduler(Env::default_env(), model, o).status().code(), StatusCode::kInvalidArgument);
}


// Records every checkpoint a scheduler reports (a real observer: the
// journal's is below).
class CheckpointLog final : public RequestObserver {
 public:
  void on_start(const Ticket&, const std::string&) override {}
  void on_finish(const Ticket&, const RequestEvent&, const std::string&) override {}
  void on_checkpoint(const Ticket&, const Checkpoint& cp) override {
    std::lock_guard<std::mutex> lock(mu);
    all.push_back(cp);
  }
  std::mutex mu;
  std::vector<Checkpoint> all;
};

// The engine executor's checkpoints resume on a fresh session with the
// stream continuing exactly; text the client already holds past the
// checkpoint is regenerated and compared, never emitted.
TEST(Scheduler, EngineCheckpointsResumeWithReplayAndDetectADivergence) {
  auto model = stories();
  ASSERT_NE(model, nullptr);
  auto log = std::make_shared<CheckpointLog>();
  EngineServeOptions o;
  o.observer = log;
  o.checkpoint_every = 8;
  auto serving = make_engine_scheduler(Env::default_env(), model, o);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Scheduler& s = *serving->scheduler;
  GenerationRequest g = greedy("Once upon a time", 40);
  g.record_id = 7;  // journaled requests are checkpointed
  auto t = s.submit(g);
  ASSERT_TRUE(t.ok());
  Collected whole = collect(**t);
  ASSERT_EQ(whole.fin.state, RequestState::kDone);
  ASSERT_EQ(whole.fin.completion_tokens, 40) << "the story goes on past 40 tokens";
  std::vector<Checkpoint> cps;
  {
    std::lock_guard<std::mutex> lock(log->mu);
    cps = log->all;
  }
  ASSERT_EQ(cps.size(), 4u) << "at 8, 16, 24, 32 (not at the end: it finished)";
  for (size_t i = 0; i < cps.size(); ++i) {
    EXPECT_EQ(cps[i].n_generated, static_cast<int32_t>(8 * (i + 1)));
    EXPECT_EQ(whole.text.compare(0, cps[i].text.size(), cps[i].text), 0) << "a checkpoint's text was streamed";
  }
  const Checkpoint& cp = cps[1];
  // Serialised and parsed as the journal stores it.
  Result<Checkpoint> stored = parse_checkpoint(serialize_checkpoint(cp));
  ASSERT_TRUE(stored.ok());
  auto resume_job = [&](std::string replay) {
    PreparedRequest p;
    p.job.resume = std::make_shared<const Checkpoint>(*stored);
    p.job.replay = std::move(replay);
    p.job.max_tokens = 40;
    p.job.sampler = cp.options.sampler;
    p.limits.n_ctx = s.n_ctx();
    p.limits.prompt_tokens = cp.n_prompt;
    p.limits.max_tokens = 40;
    p.text_before = cp.text + p.job.replay;
    return p;
  };
  const std::string after = whole.text.substr(cp.text.size());
  ASSERT_GT(after.size(), 6u);
  auto r = s.submit_prepared(resume_job(after.substr(0, 6)));
  ASSERT_TRUE(r.ok());
  Collected rc = collect(**r);
  EXPECT_EQ(rc.fin.state, RequestState::kDone) << rc.fin.status.to_string();
  EXPECT_EQ(rc.text, after.substr(6)) << "continues after the replayed text";
  EXPECT_EQ(rc.fin.completion_tokens, 40);
  EXPECT_EQ((*r)->text(), whole.text);

  auto bad = s.submit_prepared(resume_job("#" + after.substr(1, 5)));
  ASSERT_TRUE(bad.ok());
  Collected bc = collect(**bad);
  EXPECT_EQ(bc.fin.state, RequestState::kFailed);
  EXPECT_EQ(bc.fin.status.reason(), FailureReason::kReplayMismatch) << bc.fin.status.to_string();
  EXPECT_EQ(bc.text, "");
}

// Log-probability entries across a migration: the run that continues from
// an in-memory checkpoint (entries still held in it included) and replays
// what the client has sends every entry the client lacks, once. The fault is
// put after each event of an uninterrupted run in turn.
TEST(Scheduler, EngineMigrationSendsEachLogprobsEntryOnce) {
  auto model = stories();
  ASSERT_NE(model, nullptr);
  auto log = std::make_shared<CheckpointLog>();
  EngineServeOptions o;
  o.observer = log;
  o.checkpoint_every = 1;
  auto serving = make_engine_scheduler(Env::default_env(), model, o);
  ASSERT_TRUE(serving.ok()) << serving.status().to_string();
  Scheduler& s = *serving->scheduler;
  GenerationRequest g = greedy("Once upon a time", 40);
  g.record_id = 7;  // journaled requests are checkpointed
  g.stop = {"Lily!!!", "e zz"};  // held back often, never complete
  g.logprobs = 2;
  auto t = s.submit(g);
  ASSERT_TRUE(t.ok());
  std::vector<RequestEvent> events;  // the kText ones
  RequestEvent ev;
  while ((*t)->next_event(ev, std::chrono::seconds(30)) == PopResult::kItem) {
    if (ev.kind == RequestEvent::Kind::kText) events.push_back(ev);
  }
  ASSERT_EQ(ev.state, RequestState::kDone);
  std::vector<TokenLogprobs> all;
  std::string text;
  for (const RequestEvent& e : events) {
    all.insert(all.end(), e.logprobs.begin(), e.logprobs.end());
    text += e.text;
  }
  ASSERT_EQ(all.size(), 40u);
  for (size_t k = 0; k < all.size(); ++k) ASSERT_EQ(all[k].index, static_cast<int32_t>(k));
  // A checkpoint that holds entries whose text is not out yet.
  std::optional<Checkpoint> cp;
  {
    std::lock_guard<std::mutex> lock(log->mu);
    for (const Checkpoint& c : log->all) {
      if (!c.logprobs_pending.empty()) {
        cp = c;
        break;
      }
    }
  }
  ASSERT_TRUE(cp.has_value()) << "no checkpoint held an entry";
  int tried = 0;
  std::string have;
  size_t have_entries = 0;
  for (const RequestEvent& e : events) {
    have += e.text;
    have_entries += e.logprobs.size();
    if (have.size() < cp->text.size()) continue;  // the fault came before the checkpoint
    PreparedRequest p;
    p.job.resume = std::make_shared<const Checkpoint>(*cp);
    p.job.replay = have.substr(cp->text.size());
    p.job.max_tokens = 40;
    p.job.sampler = cp->options.sampler;
    p.job.logprobs = 2;
    p.job.logprobs_sent = static_cast<int32_t>(have_entries);
    p.limits.n_ctx = s.n_ctx();
    p.limits.prompt_tokens = cp->n_prompt;
    p.limits.max_tokens = 40;
    p.text_before = have;
    auto r = s.submit_prepared(std::move(p));
    ASSERT_TRUE(r.ok());
    Collected rc = collect(**r);
    ASSERT_EQ(rc.fin.state, RequestState::kDone) << rc.fin.status.to_string();
    EXPECT_EQ(have + rc.text, text);
    ASSERT_EQ(have_entries + rc.logprobs.size(), all.size()) << "after " << have.size() << " bytes";
    for (size_t k = 0; k < rc.logprobs.size(); ++k) {
      EXPECT_EQ(rc.logprobs[k].index, all[have_entries + k].index);
      EXPECT_EQ(rc.logprobs[k].token.logprob, all[have_entries + k].token.logprob);
    }
    ++tried;
  }
  EXPECT_GT(tried, 3);
}

// A fault after tokens with nowhere to go: a resumable error, and the
// journal (a real SQLite file) keeps the checkpoint a resume continues from.
TEST(Scheduler, AnInterruptedJournaledRequestKeepsItsCheckpointInTheJournal) {
  const std::string dir = ::testing::TempDir() + "/spw_sched_ckpt_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto journal = journal::Journal::open(Env::default_env(), dir + "/journal.sqlite");
  ASSERT_TRUE(journal.ok()) << journal.status().to_string();
  std::shared_ptr<journal::Journal> j = std::move(*journal);
  auto faults = std::make_shared<testing::FakeFaults>();
  SchedulerOptions o;
  o.n_ctx = 256;
  o.checkpoint_every = 4;
  o.observer = std::make_shared<JournalObserver>(j);
  auto s = Scheduler::create(Env::default_env(), spw::testing::stories_tokenizer(),
                             testing::make_fake_executors(Env::default_env(), 1, testing::FakeSpeed{0, 0, 0}, faults), o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto acc = j->accept({"", "/v1/completions", "{}", ""});
  ASSERT_TRUE(acc.ok());
  faults->fail_after(10, Status(StatusCode::kDeviceLost, "injected device loss", FailureReason::kDeviceLost));
  GenerationRequest g = greedy("Once upon a time", 30);
  g.record_id = acc->record.id;
  auto t = (*s)->submit(g);
  ASSERT_TRUE(t.ok());
  Collected c = collect(**t);
  EXPECT_EQ(c.fin.status.reason(), FailureReason::kResumable) << c.fin.status.to_string();
  EXPECT_EQ(c.text, testing::FakeExecutor::text_of(10));
  auto rec = j->get(acc->record.id);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->state, journal::RequestState::kFailed);
  EXPECT_TRUE(rec->outcome.resumable);
  EXPECT_EQ(rec->outcome.error_code, "resumable");
  EXPECT_EQ(rec->outcome.text, testing::FakeExecutor::text_of(10));
  EXPECT_EQ(rec->checkpoint_tokens, 10) << "the failing boundary's checkpoint replaced the one at 8";
  Result<Checkpoint> cp = parse_checkpoint(rec->checkpoint);
  ASSERT_TRUE(cp.ok()) << cp.status().to_string();
  EXPECT_EQ(cp->n_generated, 10);
  EXPECT_EQ(cp->text, testing::FakeExecutor::text_of(10));
  (*s)->shutdown(std::chrono::milliseconds(0));
  std::filesystem::remove_all(dir);
}


// Continuous batching: requests with different prompts, samplers, stop rules
// and lengths running side by side in one batch give exactly the text each
// gives alone; checkpoints taken inside the batch resume inside one too.
void batched_equals_alone(const Placement& where) {
  auto model = stories();
  ASSERT_NE(model, nullptr);
  std::vector<GenerationRequest> reqs;
  const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Ben went to the park", "One day",
                           "The sun was shining", "Tom had a red ball"};
  for (int i = 0; i < 6; ++i) {
    GenerationRequest g = greedy(prompts[i], 24 + 8 * i);
    if (i % 2 == 1) {
      g.sampler.temperature = 0.8f;
      g.sampler.seed = 1000 + i;
    }
    if (i == 4) g.stop = {"."};
    g.record_id = 100 + i;  // checkpointed
    reqs.push_back(g);
  }
  EngineServeOptions alone_o;
  alone_o.device = where;
  alone_o.n_workers = 1;
  auto alone = make_engine_scheduler(Env::default_env(), model, alone_o);
  ASSERT_TRUE(alone.ok()) << alone.status().to_string();
  EXPECT_EQ(alone->batcher, nullptr) << "one worker: nothing to batch with";
  std::vector<std::string> want;
  for (const auto& g : reqs) {
    auto t = alone->scheduler->submit(g);
    ASSERT_TRUE(t.ok());
    Collected c = collect(**t);
    ASSERT_EQ(c.fin.state, RequestState::kDone);
    want.push_back(c.text);
  }

  auto log = std::make_shared<CheckpointLog>();
  EngineServeOptions o;
  o.device = where;
  o.n_workers = 4;
  o.n_threads = 2;
  o.observer = log;
  o.checkpoint_every = 8;
  auto batched = make_engine_scheduler(Env::default_env(), model, o);
  ASSERT_TRUE(batched.ok()) << batched.status().to_string();
  ASSERT_NE(batched->batcher, nullptr);
  std::vector<std::shared_ptr<Ticket>> tickets;
  for (const auto& g : reqs) {
    auto t = batched->scheduler->submit(g);
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  for (size_t i = 0; i < tickets.size(); ++i) {
    Collected c = collect(*tickets[i]);
    EXPECT_EQ(c.fin.state, RequestState::kDone);
    EXPECT_EQ(c.text, want[i]) << "request " << i << " in a batch";
  }
  const StepBatcherStats st = batched->batcher->stats();
  EXPECT_GE(st.max_batch, 2) << "requests shared steps";
  EXPECT_GT(st.tokens, st.steps) << "more tokens than passes over the weights";
  EXPECT_GT(st.prompt_tokens, 0u) << "prompts ran in the steps, in chunks";
  EXPECT_EQ(batched->batcher->members(), 0) << "every run left the batch";

  // Resume checkpoints taken in the batch, again side by side.
  std::vector<Checkpoint> cps;
  {
    std::lock_guard<std::mutex> lock(log->mu);
    cps = log->all;
  }
  ASSERT_GE(cps.size(), 4u);
  std::vector<std::pair<std::shared_ptr<Ticket>, std::string>> resumed;
  for (size_t i = 0; i < 4; ++i) {
    const Checkpoint& cp = cps[cps.size() - 1 - i];
    // Which request: the one whose uninterrupted text starts with it and
    // whose prompt tokens it holds.
    PreparedRequest p;
    p.job.resume = std::make_shared<const Checkpoint>(cp);
    p.job.max_tokens = cp.options.max_tokens;
    p.job.sampler = cp.options.sampler;
    p.limits.n_ctx = batched->scheduler->n_ctx();
    p.limits.prompt_tokens = cp.n_prompt;
    p.limits.max_tokens = cp.options.max_tokens;
    p.text_before = cp.text;
    auto t = batched->scheduler->submit_prepared(std::move(p));
    ASSERT_TRUE(t.ok());
    resumed.emplace_back(*t, cp.text);
  }
  for (auto& [t, prefix] : resumed) {
    Collected c = collect(*t);
    EXPECT_EQ(c.fin.state, RequestState::kDone);
    const std::string whole = prefix + c.text;
    EXPECT_NE(std::find(want.begin(), want.end(), whole), want.end()) << "resumed text matches no request: " << whole;
  }
}

TEST(Scheduler, BatchedWorkersGiveEachRequestItsTextAlone) { batched_equals_alone(Placement::cpu()); }

// Every layer on Vulkan (lavapipe here; skipped without a device): the
// device's forward_batch shares the pass.
TEST(Scheduler, BatchedVulkanWorkersGiveEachRequestItsTextAlone) {
  auto devs = list_vulkan_devices();
  if (!devs.ok() || devs->empty()) GTEST_SKIP() << "no Vulkan device";
  auto where = Placement::parse("vulkan");
  ASSERT_TRUE(where.ok());
  batched_equals_alone(*where);
}

// Hybrid: layers 0-1 on Vulkan, the rest on the CPU, both batched.
TEST(Scheduler, BatchedHybridWorkersGiveEachRequestItsTextAlone) {
  auto devs = list_vulkan_devices();
  if (!devs.ok() || devs->empty()) GTEST_SKIP() << "no Vulkan device";
  auto where = Placement::parse("hybrid:2");
  ASSERT_TRUE(where.ok());
  batched_equals_alone(*where);
}

}  // namespace
}  // namespace spw::serve
