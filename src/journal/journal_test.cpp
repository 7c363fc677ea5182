// Journal against a real SQLite file in a temporary folder: the request
// lifecycle, idempotency rules, recovery after a process that died mid-request
// (simulated by reopening a file whose rows were left non-terminal), retention
// under a controlled wall clock, concurrent writers, the admission decision,
// generation checkpoints and their resume, and the migration of journals
// written with older schemas.
#include "journal/journal.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "core/sim_env.h"

namespace spw::journal {
namespace {

constexpr int64_t kNsPerMs = 1'000'000;

namespace fs = std::filesystem;

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spw-journal-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "journal.sqlite").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<Journal> open(JournalOptions o = {}) {
    auto j = Journal::open(env_, path_, o);
    EXPECT_TRUE(j.ok()) << j.status().to_string();
    return j.ok() ? std::move(*j) : nullptr;
  }
  fs::path dir_;
  std::string path_;
  // The journal reads only the wall clock; the test moves it with advance().
  SimEnv env_;
};

NewRequest req(const std::string& key, const std::string& body = R"({"prompt":"Once"})") {
  return NewRequest{key, "/v1/completions", body};
}

Outcome done(const std::string& text) {
  Outcome o;
  o.state = RequestState::kDone;
  o.finish_reason = "length";
  o.text = text;
  o.prompt_tokens = 2;
  o.completion_tokens = 5;
  return o;
}

TEST_F(JournalTest, LifecycleIsDurableAcrossReopen) {
  int64_t id = 0;
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    auto a = j->accept(req(""));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_FALSE(a->replay);
    id = a->record.id;
    EXPECT_GT(id, 0);
    EXPECT_EQ(a->record.state, RequestState::kAccepted);
    EXPECT_EQ(a->record.created_ms, env_.wall_time_ms());
    ASSERT_TRUE(j->mark_running(id, "cpu").ok());
    // A failover before the first token moves it: the placement follows.
    ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
    env_.advance(250 * kNsPerMs);
    ASSERT_TRUE(j->finish(id, done(" there was a girl")).ok());
    EXPECT_EQ(j->mark_running(id, "cpu").code(), StatusCode::kFailedPrecondition) << "terminal";
    EXPECT_EQ(j->finish(id, done("again")).code(), StatusCode::kFailedPrecondition) << "terminal once";
    Outcome not_terminal;
    not_terminal.state = RequestState::kRunning;
    EXPECT_EQ(j->finish(id, not_terminal).code(), StatusCode::kInvalidArgument);
  }
  auto j = open();
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->recovered(), 0);
  auto r = j->get(id);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->state, RequestState::kDone);
  EXPECT_EQ(r->placement, "vulkan");
  EXPECT_EQ(r->outcome.text, " there was a girl");
  EXPECT_EQ(r->outcome.finish_reason, "length");
  EXPECT_EQ(r->outcome.completion_tokens, 5);
  EXPECT_EQ(r->updated_ms - r->created_ms, 250);
  EXPECT_EQ(r->body, R"({"prompt":"Once"})");
  EXPECT_EQ(j->get(id + 100).status().code(), StatusCode::kNotFound);
  // Ids are never reused, also after a restart.
  auto b = j->accept(req(""));
  ASSERT_TRUE(b.ok());
  EXPECT_GT(b->record.id, id);
}

TEST_F(JournalTest, IdempotencyKeyReplaysConflictsAndRetries) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  auto a = j->accept(req("k1"));
  ASSERT_TRUE(a.ok());
  const int64_t id = a->record.id;
  // In flight: the retry is told to poll, nothing is created.
  auto busy = j->accept(req("k1"));
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("still in progress"), std::string::npos);
  EXPECT_NE(busy.status().message().find("/v1/requests/" + std::to_string(id)), std::string::npos);
  // Same key, different body: refused whatever the state.
  auto other = j->accept(req("k1", R"({"prompt":"Twice"})"));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("different body"), std::string::npos) << other.status().to_string();
  // Failed: the retry runs again under the same id.
  Outcome failed;
  failed.state = RequestState::kFailed;
  failed.resumable = true;
  failed.error_code = "device_lost";
  failed.error_message = "DeviceLost: vkQueueSubmit";
  ASSERT_TRUE(j->finish(id, failed).ok());
  auto retry = j->accept(req("k1"));
  ASSERT_TRUE(retry.ok()) << retry.status().to_string();
  EXPECT_FALSE(retry->replay);
  EXPECT_EQ(retry->record.id, id);
  EXPECT_EQ(retry->record.attempts, 2);
  EXPECT_EQ(retry->record.state, RequestState::kAccepted);
  EXPECT_TRUE(retry->record.outcome.error_code.empty()) << "the old error is cleared";
  // Done: the retry gets the stored result and must not run.
  ASSERT_TRUE(j->finish(id, done(" Lily")).ok());
  auto replay = j->accept(req("k1"));
  ASSERT_TRUE(replay.ok());
  EXPECT_TRUE(replay->replay);
  EXPECT_EQ(replay->record.id, id);
  EXPECT_EQ(replay->record.outcome.text, " Lily");
  EXPECT_EQ(replay->record.attempts, 2);
  // Keys are independent; requests without a key never collide.
  auto k2 = j->accept(req("k2"));
  auto n1 = j->accept(req(""));
  auto n2 = j->accept(req(""));
  ASSERT_TRUE(k2.ok() && n1.ok() && n2.ok());
  EXPECT_NE(n1->record.id, n2->record.id);
}

TEST_F(JournalTest, RowsLeftRunningByADeadProcessBecomeResumableFailures) {
  int64_t running = 0, accepted = 0, finished = 0;
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    running = j->accept(req("a"))->record.id;
    accepted = j->accept(req("b"))->record.id;
    finished = j->accept(req("c"))->record.id;
    ASSERT_TRUE(j->mark_running(running, "cpu").ok());
    ASSERT_TRUE(j->finish(finished, done("x")).ok());
    // The process "dies" here: the journal object goes without finishing them.
  }
  auto j = open();
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->recovered(), 2);
  for (int64_t id : {running, accepted}) {
    auto r = j->get(id);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->state, RequestState::kFailed);
    EXPECT_TRUE(r->outcome.resumable);
    EXPECT_EQ(r->outcome.error_code, "interrupted");
  }
  EXPECT_EQ(j->get(finished)->state, RequestState::kDone);
  // The client's retry with the same key runs it again.
  auto again = j->accept(req("a"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->record.id, running);
  EXPECT_EQ(again->record.attempts, 2);
}

TEST_F(JournalTest, RetentionDropsOldTerminalRowsOnly) {
  JournalOptions o;
  o.retention_ms = 60'000;
  o.prune_every = 2;
  auto j = open(o);
  ASSERT_NE(j, nullptr);
  const int64_t old_done = j->accept(req("old"))->record.id;
  ASSERT_TRUE(j->finish(old_done, done("x")).ok());
  const int64_t old_running = j->accept(req("slow"))->record.id;  // prune counter at 2: pruned nothing yet
  env_.advance(61'000 * kNsPerMs);
  ASSERT_TRUE(j->accept(req("new")).ok());
  ASSERT_TRUE(j->accept(req("new2")).ok());  // second accept since the last prune: prunes
  EXPECT_EQ(j->get(old_done).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(j->get(old_running).ok()) << "a request still in flight is never pruned";
}

TEST_F(JournalTest, ConcurrentWritersKeepEveryRequest) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::vector<int64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        // (Built with append: GCC 12 warns falsely on "t" + to_string(...).)
        std::string key = std::to_string(t);
        key.append("-").append(std::to_string(i));
        auto a = j->accept(req(key));
        if (!a.ok()) continue;
        if (!j->mark_running(a->record.id, "cpu").ok()) continue;
        if (j->finish(a->record.id, done(std::to_string(t * 1000 + i))).ok()) ids[t].push_back(a->record.id);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(ids[t].size(), static_cast<size_t>(kEach));
    for (int i = 0; i < kEach; ++i) {
      auto r = j->get(ids[t][i]);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->outcome.text, std::to_string(t * 1000 + i));
    }
  }
}

TEST_F(JournalTest, OneOwnerAtATime) {
  auto first = open();
  ASSERT_NE(first, nullptr);
  auto second = Journal::open(env_, path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("in use by another"), std::string::npos) << second.status().to_string();
  const int64_t id = first->accept(req(""))->record.id;
  first.reset();  // the owner goes: the lock with it
  auto third = open();
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->recovered(), 1) << "request " << id << " was left accepted";
}

TEST_F(JournalTest, AdmissionIsStoredReplacedAndSurvivesReopen) {
  const std::string admit = R"({"kind":"admit","path":"gpu","reason":"fits"})";
  const std::string shrink = R"({"kind":"shrink","path":"gpu","reason":"shrunk to 64 tokens"})";
  int64_t id = 0;
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    id = j->accept(req(""))->record.id;
    EXPECT_TRUE(j->get(id)->admission.empty()) << "none until the gateway decided";
    env_.advance(5 * kNsPerMs);
    ASSERT_TRUE(j->set_admission(id, admit).ok());
    auto r = j->get(id);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->admission, admit);
    EXPECT_EQ(r->state, RequestState::kAccepted) << "the state does not move";
    EXPECT_EQ(r->updated_ms, r->created_ms) << "updated_ms dates the state";
    // Any state: the request may have finished before the decision was written.
    ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
    ASSERT_TRUE(j->finish(id, done("x")).ok());
    ASSERT_TRUE(j->set_admission(id, shrink).ok());
    EXPECT_EQ(j->get(id)->admission, shrink) << "replaced, not appended";
    EXPECT_EQ(j->get(id)->outcome.text, "x") << "the result is untouched";
    // Unknown ids and documents that are not JSON objects change nothing.
    const Status missing = j->set_admission(id + 100, admit);
    EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.to_string();
    EXPECT_NE(missing.message().find(std::to_string(id + 100)), std::string::npos) << missing.to_string();
    EXPECT_EQ(j->set_admission(id, "{not json").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(j->set_admission(id, "[1,2]").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(j->get(id)->admission, shrink);
  }
  auto j = open();
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->get(id)->admission, shrink) << "durable across a restart";
  ASSERT_TRUE(j->set_admission(id, "").ok());
  EXPECT_TRUE(j->get(id)->admission.empty()) << "empty clears it";
}

TEST_F(JournalTest, ARetryAttemptGetsItsOwnAdmission) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const int64_t id = j->accept(req("k1"))->record.id;
  ASSERT_TRUE(j->set_admission(id, R"({"kind":"reject","failure":"queue_full"})").ok());
  Outcome refused;
  refused.state = RequestState::kFailed;
  refused.resumable = true;
  refused.error_code = "queue_full";
  ASSERT_TRUE(j->finish(id, refused).ok());
  auto retry = j->accept(req("k1"));
  ASSERT_TRUE(retry.ok()) << retry.status().to_string();
  EXPECT_EQ(retry->record.id, id);
  EXPECT_EQ(retry->record.attempts, 2);
  EXPECT_TRUE(retry->record.admission.empty()) << "the first attempt's refusal is not this attempt's decision";
  ASSERT_TRUE(j->set_admission(id, R"({"kind":"admit"})").ok());
  ASSERT_TRUE(j->finish(id, done(" Lily")).ok());
  // A replay serves the finished attempt: its decision stays with it.
  auto replay = j->accept(req("k1"));
  ASSERT_TRUE(replay.ok());
  EXPECT_TRUE(replay->replay);
  EXPECT_EQ(replay->record.admission, R"({"kind":"admit"})");
}

Outcome failure(bool resumable, RequestState state = RequestState::kFailed) {
  Outcome o;
  o.state = state;
  o.resumable = resumable;
  o.text = " there was";  // the partial result
  o.completion_tokens = 2;
  o.error_code = state == RequestState::kCancelled ? "cancelled" : "device_lost";
  o.error_message = "DeviceLost: vkQueueSubmit";
  return o;
}

// Bytes a checkpoint may hold: NULs (also leading and trailing), high bytes.
std::string checkpoint_bytes(size_t n, char seed) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>((i * 7 + static_cast<size_t>(seed)) % 256);
  b.front() = '\0';
  b.back() = '\0';
  return b;
}

TEST_F(JournalTest, CheckpointBytesRoundTripWithNulBytes) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const int64_t id = j->accept(req(""))->record.id;
  ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
  EXPECT_TRUE(j->get(id)->checkpoint.empty()) << "none until the first save";
  EXPECT_EQ(j->get(id)->checkpoint_tokens, 0);
  const std::string first = checkpoint_bytes(4096, 1);
  ASSERT_LT(first.find('\0', 1), first.size() - 1) << "NULs inside, not only at the ends";
  env_.advance(40 * kNsPerMs);
  const Status saved = j->save_checkpoint(id, first, 12);
  ASSERT_TRUE(saved.ok()) << saved.to_string();
  auto r = j->get(id);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->checkpoint.size(), first.size()) << "not cut at the first NUL";
  EXPECT_EQ(r->checkpoint, first);
  EXPECT_EQ(r->checkpoint_tokens, 12);
  EXPECT_EQ(r->state, RequestState::kRunning) << "the state does not move";
  EXPECT_EQ(r->updated_ms - r->created_ms, 40) << "a checkpoint is progress";
  // Replaced, not appended (here by a smaller one).
  const std::string second = std::string("\0\x01\0\xff", 4);
  ASSERT_TRUE(j->save_checkpoint(id, second, 20).ok());
  EXPECT_EQ(j->get(id)->checkpoint, second);
  EXPECT_EQ(j->get(id)->checkpoint_tokens, 20);
  // Malformed calls change nothing.
  EXPECT_EQ(j->save_checkpoint(id, second, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(j->save_checkpoint(id, "", 3).code(), StatusCode::kInvalidArgument);
  const Status missing = j->save_checkpoint(id + 100, first, 1);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.to_string();
  EXPECT_NE(missing.message().find(std::to_string(id + 100)), std::string::npos) << missing.to_string();
  EXPECT_EQ(j->get(id)->checkpoint, second);
  // Empty bytes clear it.
  ASSERT_TRUE(j->save_checkpoint(id, "", 0).ok());
  EXPECT_TRUE(j->get(id)->checkpoint.empty());
  EXPECT_EQ(j->get(id)->checkpoint_tokens, 0);
}

TEST_F(JournalTest, ACheckpointIsSavedOnlyWhileRunning) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const std::string bytes = checkpoint_bytes(64, 3);
  const int64_t accepted = j->accept(req(""))->record.id;
  const Status early = j->save_checkpoint(accepted, bytes, 1);
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition) << early.to_string();
  EXPECT_NE(early.message().find("is accepted"), std::string::npos) << early.to_string();
  ASSERT_TRUE(j->mark_running(accepted, "cpu").ok());
  ASSERT_TRUE(j->save_checkpoint(accepted, bytes, 1).ok());
  // A worker's late write after the request finished: refused, nothing moves.
  ASSERT_TRUE(j->finish(accepted, failure(true)).ok());
  const int64_t updated = j->get(accepted)->updated_ms;
  env_.advance(10 * kNsPerMs);
  const Status late = j->save_checkpoint(accepted, checkpoint_bytes(64, 9), 5);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.to_string();
  EXPECT_NE(late.message().find("is failed"), std::string::npos) << late.to_string();
  auto r = j->get(accepted);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RequestState::kFailed) << "not resurrected";
  EXPECT_EQ(r->checkpoint, bytes) << "what a resume reads is untouched";
  EXPECT_EQ(r->checkpoint_tokens, 1);
  EXPECT_EQ(r->updated_ms, updated);
  const int64_t finished = j->accept(req(""))->record.id;
  ASSERT_TRUE(j->mark_running(finished, "cpu").ok());
  ASSERT_TRUE(j->finish(finished, done("x")).ok());
  const Status after_done = j->save_checkpoint(finished, bytes, 1);
  EXPECT_EQ(after_done.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(after_done.message().find("is done"), std::string::npos) << after_done.to_string();
  EXPECT_TRUE(j->get(finished)->checkpoint.empty());
}

TEST_F(JournalTest, DoneClearsTheCheckpointFailureAndCancellationKeepIt) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const std::string bytes = checkpoint_bytes(1024, 5);
  int64_t ids[3];
  for (int64_t& id : ids) {
    id = j->accept(req(""))->record.id;
    ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
    ASSERT_TRUE(j->save_checkpoint(id, bytes, 7).ok());
  }
  ASSERT_TRUE(j->finish(ids[0], done(" Lily")).ok());
  ASSERT_TRUE(j->finish(ids[1], failure(true)).ok());
  ASSERT_TRUE(j->finish(ids[2], failure(false, RequestState::kCancelled)).ok());
  EXPECT_TRUE(j->get(ids[0])->checkpoint.empty()) << "no longer needed";
  EXPECT_EQ(j->get(ids[0])->checkpoint_tokens, 0);
  EXPECT_EQ(j->get(ids[0])->outcome.text, " Lily");
  for (int64_t id : {ids[1], ids[2]}) {
    EXPECT_EQ(j->get(id)->checkpoint, bytes) << "request " << id;
    EXPECT_EQ(j->get(id)->checkpoint_tokens, 7) << "request " << id;
  }
}

TEST_F(JournalTest, ARetryUnderTheKeyStartsWithoutTheCheckpoint) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const int64_t id = j->accept(req("k1"))->record.id;
  ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
  ASSERT_TRUE(j->save_checkpoint(id, checkpoint_bytes(256, 2), 9).ok());
  ASSERT_TRUE(j->finish(id, failure(true)).ok());
  auto retry = j->accept(req("k1"));
  ASSERT_TRUE(retry.ok()) << retry.status().to_string();
  EXPECT_EQ(retry->record.attempts, 2);
  EXPECT_TRUE(retry->record.checkpoint.empty()) << "the new attempt starts from scratch";
  EXPECT_EQ(retry->record.checkpoint_tokens, 0);
  EXPECT_TRUE(j->get(id)->checkpoint.empty());
}

TEST_F(JournalTest, RecoveryKeepsTheCheckpointAndReopenResumesFromIt) {
  const std::string bytes = checkpoint_bytes(16 * 1024, 4);
  int64_t id = 0, plain = 0;
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    id = j->accept(req("a"))->record.id;
    plain = j->accept(req("b"))->record.id;
    ASSERT_TRUE(j->set_admission(id, R"({"kind":"admit"})").ok());
    ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
    ASSERT_TRUE(j->save_checkpoint(id, bytes, 31).ok());
    ASSERT_TRUE(j->mark_running(plain, "cpu").ok());
    // The process is killed here, mid-generation.
  }
  auto j = open();
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->recovered(), 2);
  auto r = j->get(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RequestState::kFailed);
  EXPECT_TRUE(r->outcome.resumable);
  EXPECT_EQ(r->outcome.error_code, "interrupted");
  EXPECT_EQ(r->checkpoint, bytes) << "recovery keeps what a resume continues from";
  EXPECT_EQ(r->checkpoint_tokens, 31);
  // The resume: back to running on the CPU path, as the same attempt.
  env_.advance(75 * kNsPerMs);
  const Status resumed = j->reopen(id, "cpu");
  ASSERT_TRUE(resumed.ok()) << resumed.to_string();
  r = j->get(id);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state, RequestState::kRunning);
  EXPECT_EQ(r->placement, "cpu");
  EXPECT_EQ(r->attempts, 1) << "the same attempt continuing";
  EXPECT_FALSE(r->outcome.resumable);
  EXPECT_TRUE(r->outcome.error_code.empty());
  EXPECT_TRUE(r->outcome.error_message.empty());
  EXPECT_EQ(r->checkpoint, bytes);
  EXPECT_EQ(r->checkpoint_tokens, 31);
  EXPECT_EQ(r->admission, R"({"kind":"admit"})");
  EXPECT_EQ(r->updated_ms, env_.wall_time_ms());
  // It runs on: checkpoints and the result land as for any running request,
  // and a retry under its key while it runs is told to poll.
  ASSERT_TRUE(j->save_checkpoint(id, checkpoint_bytes(100, 8), 40).ok());
  EXPECT_EQ(j->accept(req("a")).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(j->finish(id, done(" there was a girl")).ok());
  EXPECT_TRUE(j->get(id)->checkpoint.empty());
  // The request without a checkpoint cannot be resumed, only retried.
  const Status no_ckpt = j->reopen(plain, "cpu");
  EXPECT_EQ(no_ckpt.code(), StatusCode::kFailedPrecondition) << no_ckpt.to_string();
  EXPECT_NE(no_ckpt.message().find("has no checkpoint"), std::string::npos) << no_ckpt.to_string();
}

TEST_F(JournalTest, ReopenRefusesWhatCannotBeResumedAndSaysWhy) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  const std::string bytes = checkpoint_bytes(512, 6);
  auto running_with_checkpoint = [&]() {
    const int64_t id = j->accept(req(""))->record.id;
    EXPECT_TRUE(j->mark_running(id, "vulkan").ok());
    EXPECT_TRUE(j->save_checkpoint(id, bytes, 3).ok());
    return id;
  };
  auto refused = [&](int64_t id, const std::string& why) {
    const int64_t updated = j->get(id)->updated_ms;
    const RequestState state = j->get(id)->state;
    env_.advance(kNsPerMs);
    const Status st = j->reopen(id, "cpu");
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
    EXPECT_NE(st.message().find(why), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("request " + std::to_string(id)), std::string::npos) << st.to_string();
    EXPECT_EQ(j->get(id)->state, state) << "nothing changes: " << why;
    EXPECT_EQ(j->get(id)->updated_ms, updated) << why;
  };
  // Unknown id.
  const Status missing = j->reopen(12345, "cpu");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.to_string();
  EXPECT_NE(missing.message().find("12345"), std::string::npos);
  // Finished: a retry replays it; there is nothing to resume.
  const int64_t finished = running_with_checkpoint();
  ASSERT_TRUE(j->finish(finished, done("x")).ok());
  refused(finished, "not resumable: state done");
  // In progress.
  refused(j->accept(req(""))->record.id, "it is accepted");
  const int64_t running = running_with_checkpoint();
  refused(running, "it is running");
  // A failure the classifier says must not run again (e.g. a bad request).
  const int64_t fatal = running_with_checkpoint();
  ASSERT_TRUE(j->finish(fatal, failure(false)).ok());
  refused(fatal, "not resumable: state failed (device_lost)");
  const int64_t cancelled = running_with_checkpoint();
  ASSERT_TRUE(j->finish(cancelled, failure(false, RequestState::kCancelled)).ok());
  refused(cancelled, "not resumable: state cancelled (cancelled)");
  // Resumable, but interrupted before its first checkpoint.
  const int64_t bare = j->accept(req(""))->record.id;
  ASSERT_TRUE(j->mark_running(bare, "vulkan").ok());
  ASSERT_TRUE(j->finish(bare, failure(true)).ok());
  refused(bare, "has no checkpoint");
  // A resumable cancellation with a checkpoint resumes; once only.
  const int64_t resumable_cancel = running_with_checkpoint();
  ASSERT_TRUE(j->finish(resumable_cancel, failure(true, RequestState::kCancelled)).ok());
  ASSERT_TRUE(j->reopen(resumable_cancel, "cpu").ok());
  refused(resumable_cancel, "it is running");
  // mark_running is not a resume: it never moves a terminal row.
  const int64_t failed = running_with_checkpoint();
  ASSERT_TRUE(j->finish(failed, failure(true)).ok());
  EXPECT_EQ(j->mark_running(failed, "cpu").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(j->get(failed)->state, RequestState::kFailed);
  // Resumed, failed again (still resumable, checkpoint kept): resumes again.
  ASSERT_TRUE(j->reopen(failed, "cpu").ok());
  ASSERT_TRUE(j->finish(failed, failure(true)).ok());
  ASSERT_TRUE(j->reopen(failed, "vulkan").ok());
  EXPECT_EQ(j->get(failed)->attempts, 1);
  EXPECT_EQ(j->get(failed)->placement, "vulkan");
}

TEST_F(JournalTest, ConcurrentReopensOfOneRequestExactlyOneSucceeds) {
  auto j = open();
  ASSERT_NE(j, nullptr);
  constexpr int kThreads = 8, kRounds = 20;
  const int64_t id = j->accept(req(""))->record.id;
  ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
  ASSERT_TRUE(j->save_checkpoint(id, checkpoint_bytes(1024, 7), 4).ok());
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(j->finish(id, failure(true)).ok());
    std::atomic<int> ready{0}, won{0}, refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        // All start together, so the reopens really race.
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        const Status st = j->reopen(id, "path-" + std::to_string(t));
        if (st.ok()) won.fetch_add(1);
        else if (st.code() == StatusCode::kFailedPrecondition) refused.fetch_add(1);
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(won.load(), 1) << "round " << round;
    ASSERT_EQ(refused.load(), kThreads - 1) << "round " << round;
    EXPECT_EQ(j->get(id)->state, RequestState::kRunning);
  }
}

// The schema of version 1 (before `admission`), verbatim: what a journal
// written by the previous Spillway holds.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  idempotency_key TEXT UNIQUE,
  endpoint TEXT NOT NULL,
  body TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  placement TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  resumable INTEGER NOT NULL DEFAULT 0,
  finish_reason TEXT NOT NULL DEFAULT '',
  text TEXT NOT NULL DEFAULT '',
  prompt_tokens INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  error_code TEXT NOT NULL DEFAULT '',
  error_message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
PRAGMA user_version=1;
)sql";

// Runs SQL on the journal file with a plain connection (no Journal open).
void raw_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "") << "\n" << sql;
  sqlite3_free(err);
  sqlite3_close(db);
}

int64_t user_version(const std::string& path) {
  sqlite3* db = nullptr;
  int64_t v = -1;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK) {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, nullptr) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW) {
      v = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
  }
  sqlite3_close(db);
  return v;
}

TEST_F(JournalTest, AJournalOfThePreviousSchemaIsMigratedKeepingItsRows) {
  raw_sql(path_, kSchemaV1);
  // Written a minute ago (within retention, so open() keeps them).
  const std::string then = std::to_string(env_.wall_time_ms() - 60'000);
  raw_sql(path_,
          "INSERT INTO requests (id, idempotency_key, endpoint, body, state, placement, created_ms, updated_ms, "
          "finish_reason, text, prompt_tokens, completion_tokens) VALUES "
          "(7, 'old-done', '/v1/completions', '{\"prompt\":\"Once\"}', 'done', 'cpu', " + then + ", " + then +
              ", 'length', ' there was', 2, 3);"
              "INSERT INTO requests (id, idempotency_key, endpoint, body, state, created_ms, updated_ms) VALUES "
              "(8, 'old-running', '/v1/completions', '{\"prompt\":\"Once\"}', 'running', " + then + ", " + then +
              ");");
  ASSERT_EQ(user_version(path_), 1);
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    auto finished = j->get(7);
    ASSERT_TRUE(finished.ok()) << finished.status().to_string();
    EXPECT_EQ(finished->state, RequestState::kDone);
    EXPECT_EQ(finished->outcome.text, " there was");
    EXPECT_EQ(finished->placement, "cpu");
    EXPECT_TRUE(finished->admission.empty()) << "decided before decisions were recorded";
    EXPECT_TRUE(finished->checkpoint.empty());
    // Recovery runs on migrated rows as on any others.
    EXPECT_EQ(j->recovered(), 1);
    EXPECT_EQ(j->get(8)->outcome.error_code, "interrupted");
    // The old keys still replay and retry; ids continue after the old ones.
    auto replay = j->accept({"old-done", "/v1/completions", R"({"prompt":"Once"})"});
    ASSERT_TRUE(replay.ok()) << replay.status().to_string();
    EXPECT_TRUE(replay->replay);
    EXPECT_EQ(replay->record.id, 7);
    auto fresh = j->accept(req(""));
    ASSERT_TRUE(fresh.ok());
    EXPECT_GT(fresh->record.id, 8);
    ASSERT_TRUE(j->set_admission(7, R"({"kind":"admit"})").ok());
  }
  EXPECT_EQ(user_version(path_), 3) << "migrated through every version";
  auto j = open();  // and it opens again as a current journal
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->get(7)->admission, R"({"kind":"admit"})");
}

TEST_F(JournalTest, AFailedMigrationLeavesTheFileAsItWas) {
  // Says version 1 but has no requests table: the ALTER TABLE fails.
  raw_sql(path_, "CREATE TABLE other (x INTEGER); PRAGMA user_version=1;");
  auto j = Journal::open(env_, path_);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kIOError);
  EXPECT_NE(j.status().message().find("migrating schema version 1 to 2"), std::string::npos) << j.status().to_string();
  EXPECT_NE(j.status().message().find(path_), std::string::npos) << j.status().to_string();
  EXPECT_EQ(user_version(path_), 1) << "rolled back with the migration";
}

// A version-2 journal (before `checkpoint`): version 1 plus its `admission`
// column, as the 1 -> 2 migration leaves it (a fresh version-2 file differs
// only in where the column is declared).
const std::string kSchemaV2 = std::string(kSchemaV1) +
                              "ALTER TABLE requests ADD COLUMN admission TEXT;\nPRAGMA user_version=2;\n";

TEST_F(JournalTest, AVersion2JournalIsMigratedToVersion3KeepingItsRows) {
  raw_sql(path_, kSchemaV2);
  const std::string then = std::to_string(env_.wall_time_ms() - 60'000);
  raw_sql(path_,
          "INSERT INTO requests (id, idempotency_key, endpoint, body, state, placement, created_ms, updated_ms, "
          "finish_reason, text, prompt_tokens, completion_tokens, admission) VALUES "
          "(7, 'old-done', '/v1/completions', '{\"prompt\":\"Once\"}', 'done', 'cpu', " + then + ", " + then +
              ", 'length', ' there was', 2, 3, '{\"kind\":\"admit\"}');"
              "INSERT INTO requests (id, idempotency_key, endpoint, body, state, attempts, resumable, created_ms, "
              "updated_ms, error_code) VALUES (8, 'old-failed', '/v1/completions', '{\"prompt\":\"Once\"}', 'failed', "
              "2, 1, " + then + ", " + then + ", 'device_lost');"
              "INSERT INTO requests (id, idempotency_key, endpoint, body, state, created_ms, updated_ms) VALUES "
              "(9, 'old-running', '/v1/completions', '{\"prompt\":\"Once\"}', 'running', " + then + ", " + then +
              ");");
  ASSERT_EQ(user_version(path_), 2);
  {
    auto j = open();
    ASSERT_NE(j, nullptr);
    EXPECT_EQ(j->recovered(), 1);
    auto finished = j->get(7);
    ASSERT_TRUE(finished.ok()) << finished.status().to_string();
    EXPECT_EQ(finished->state, RequestState::kDone);
    EXPECT_EQ(finished->outcome.text, " there was");
    EXPECT_EQ(finished->admission, R"({"kind":"admit"})") << "version 2's column is kept";
    auto failed = j->get(8);
    ASSERT_TRUE(failed.ok());
    EXPECT_EQ(failed->attempts, 2);
    EXPECT_EQ(failed->outcome.error_code, "device_lost");
    for (int64_t id : {7, 8, 9}) {
      EXPECT_TRUE(j->get(id)->checkpoint.empty()) << "request " << id << ": rows of version 2 have none";
      EXPECT_EQ(j->get(id)->checkpoint_tokens, 0);
    }
    EXPECT_EQ(j->get(9)->outcome.error_code, "interrupted");
    // The caller that resumes from the prompt asks for no checkpoint.
    EXPECT_NE(j->reopen(9, "cpu").message().find("has no checkpoint"), std::string::npos);
    ASSERT_TRUE(j->reopen(9, "cpu", /*require_checkpoint=*/false).ok());
    EXPECT_EQ(j->get(9)->state, RequestState::kRunning);
    EXPECT_FALSE(j->reopen(9, "cpu", false).ok()) << "reopened once";
    ASSERT_TRUE(j->finish(9, Outcome{}).ok());
    // Without a checkpoint an old interrupted row is retried, not resumed.
    EXPECT_NE(j->reopen(8, "cpu").message().find("has no checkpoint"), std::string::npos);
    auto retry = j->accept({"old-failed", "/v1/completions", R"({"prompt":"Once"})"});
    ASSERT_TRUE(retry.ok()) << retry.status().to_string();
    EXPECT_EQ(retry->record.attempts, 3);
    ASSERT_TRUE(j->mark_running(8, "vulkan").ok());
    ASSERT_TRUE(j->save_checkpoint(8, std::string("\0ckpt", 5), 2).ok());
  }
  EXPECT_EQ(user_version(path_), 3);
  auto j = open();  // a current journal now; the recovery keeps the new checkpoint
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(j->get(8)->checkpoint, std::string("\0ckpt", 5));
  EXPECT_TRUE(j->reopen(8, "cpu").ok());
}

TEST_F(JournalTest, BadFilesAreErrorsNamingThePath) {
  {
    std::ofstream f(path_);
    f << "this is not an SQLite database, just some text that is long enough to have a header";
  }
  auto j = Journal::open(env_, path_);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kIOError);
  EXPECT_NE(j.status().message().find(path_), std::string::npos) << j.status().to_string();
  auto missing_dir = Journal::open(env_, (dir_ / "no" / "such" / "dir" / "j.sqlite").string());
  ASSERT_FALSE(missing_dir.ok());
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kIOError);
  // A newer (or foreign) schema version: refused, not reinterpreted.
  fs::remove(path_);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=7", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto v = Journal::open(env_, path_);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
  EXPECT_NE(v.status().message().find("schema version 7"), std::string::npos) << v.status().to_string();
}

}  // namespace
}  // namespace spw::journal
