// Journal against a real SQLite file in a temporary folder: the request
// lifecycle, idempotency rules, recovery after a process that died mid-request
// (simulated by reopening a file whose rows were left non-terminal), retention
// under a controlled wall clock, and concurrent writers.
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
    ASSERT_TRUE(j->mark_running(id, "vulkan").ok());
    EXPECT_EQ(j->mark_running(id, "cpu").code(), StatusCode::kFailedPrecondition) << "already running";
    env_.advance(250 * kNsPerMs);
    ASSERT_TRUE(j->finish(id, done(" there was a girl")).ok());
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
  // Another schema version: refused, not reinterpreted.
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
