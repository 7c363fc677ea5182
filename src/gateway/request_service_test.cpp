// RequestService on real components: the bundled model on the CPU path
// (build_gateway), a real SQLite journal in a temporary folder. What the
// HTTP server and the drill's simulation both rely on: idempotent replay,
// the early refusal recorded as a summary, ownership of records and
// cancels, typed errors, resume of a request that has nothing to continue,
// and the in-flight list without a journal.
#include "gateway/request_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "core/failure.h"
#include "gateway/builder.h"
#include "serve/testing/collect.h"

namespace spw::gateway {
namespace {

using serve::testing::collect;

std::string stories() { return std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf"; }

class RequestServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("spw_request_service_test_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    service_.reset();
    if (built_.gateway) built_.gateway->shutdown(std::chrono::milliseconds(0));
    built_ = {};
    std::filesystem::remove_all(dir_);
  }

  void build(bool with_journal, bool separate_owners = true) {
    GatewayOptions o;
    o.model = stories();
    o.device = Placement::cpu();
    o.ctx = 256;
    o.threads = 1;
    o.journal = with_journal ? (dir_ / "journal.db").string() : "none";
    o.host_bandwidth = 20e9;  // no probe: not what this test is about
    Result<BuiltGateway> b = build_gateway(Env::default_env(), o);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    built_ = std::move(*b);
    RequestServiceOptions ro;
    ro.journal = built_.journal;
    ro.separate_owners = separate_owners;
    ro.encode_decision = [](const admission::Decision& d) {
      return std::string("{\"kind\":\"") + std::string(admission::decision_kind_name(d.kind)) + "\"}";
    };
    ro.parse_stored = [](const journal::Record& r) -> Result<StoredRequest> {
      StoredRequest s;
      s.generation.prompt = r.body;  // the tests' bodies are their prompts
      s.generation.max_tokens = 8;
      s.seed_given = true;
      return s;
    };
    service_ = std::make_unique<RequestService>(Env::default_env(), *built_.gateway, std::move(ro));
  }

  static Submission submission(const std::string& owner, const std::string& prompt, const std::string& key = "") {
    Submission s;
    s.caller.owner = owner;
    s.endpoint = "/v1/completions";
    s.body = prompt;
    s.idempotency_key = key;
    s.route.generation.prompt = prompt;
    s.route.generation.max_tokens = 8;
    s.route.generation.sampler.temperature = 0;
    s.prompt_bytes = prompt.size();
    return s;
  }

  std::filesystem::path dir_;
  BuiltGateway built_;
  std::unique_ptr<RequestService> service_;
};

TEST_F(RequestServiceTest, AKeyedRetryOfAFinishedRequestReplaysItUnderItsId) {
  build(/*with_journal=*/true);
  SubmitOutcome first = service_->submit(submission("alice", "Once upon a time", "k1"));
  ASSERT_EQ(first.kind, SubmitOutcome::Kind::kAccepted) << first.status.to_string();
  ASSERT_NE(first.record_id, 0);
  ASSERT_NE(first.public_id, 0);
  const std::string text = collect(*first.ticket).text;
  ASSERT_FALSE(text.empty());
  service_->finished(first.public_id);
  // The observer's final write lands after the last event: wait for the row.
  Result<journal::Record> r = service_->find_record(first.public_id, {"alice", false});
  for (int i = 0; i < 200 && r.ok() && !journal::is_terminal(r->state); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    r = service_->find_record(first.public_id, {"alice", false});
  }
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->state, journal::RequestState::kDone);
  // The decision was journaled before the submit returned.
  EXPECT_NE(r->admission.find("\"kind\""), std::string::npos) << r->admission;

  SubmitOutcome again = service_->submit(submission("alice", "Once upon a time", "k1"));
  ASSERT_EQ(again.kind, SubmitOutcome::Kind::kReplay) << again.status.to_string();
  EXPECT_EQ(again.public_id, first.public_id);
  ASSERT_TRUE(again.record.has_value());
  EXPECT_EQ(again.record->outcome.text, text);
  // The same key with another body is a conflict, typed.
  SubmitOutcome other = service_->submit(submission("alice", "Another body", "k1"));
  ASSERT_EQ(other.kind, SubmitOutcome::Kind::kRefused);
  EXPECT_EQ(other.status.reason(), FailureReason::kIdempotencyConflict);
  EXPECT_EQ(other.status.field(), "Idempotency-Key");
  EXPECT_EQ(classify(other.status).http_status, 409);
  // Another owner's key space is its own: the same key runs anew.
  SubmitOutcome bob = service_->submit(submission("bob", "Once upon a time", "k1"));
  ASSERT_EQ(bob.kind, SubmitOutcome::Kind::kAccepted) << bob.status.to_string();
  EXPECT_NE(bob.public_id, first.public_id);
  collect(*bob.ticket);
}

TEST_F(RequestServiceTest, RecordsAndCancelsAreTheirOwnersOnly) {
  build(/*with_journal=*/true);
  SubmitOutcome a = service_->submit(submission("alice", "Once upon a time"));
  ASSERT_EQ(a.kind, SubmitOutcome::Kind::kAccepted) << a.status.to_string();
  Result<journal::Record> seen_by_bob = service_->find_record(a.public_id, {"bob", false});
  EXPECT_EQ(seen_by_bob.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(service_->find_record(a.public_id, {"", true}).ok()) << "the admin sees every request";
  EXPECT_EQ(service_->cancel(a.public_id, {"bob", false}).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(service_->in_flight({"bob", false}).empty());
  collect(*a.ticket);
  // Finished: not in flight any more, for anyone.
  EXPECT_EQ(service_->cancel(a.public_id, {"alice", false}).status().code(), StatusCode::kNotFound);
}

TEST_F(RequestServiceTest, APromptThatFitsNoContextIsRefusedEarlyAndRecordedAsASummary) {
  build(/*with_journal=*/true);
  Submission s = submission("alice", "x");
  s.prompt_bytes = 1 << 20;  // more bytes than any context holds tokens of
  const SubmitOutcome out = service_->submit(std::move(s));
  ASSERT_EQ(out.kind, SubmitOutcome::Kind::kRefused);
  EXPECT_EQ(out.status.reason(), FailureReason::kContextFull) << out.status.to_string();
  ASSERT_NE(out.public_id, 0) << "the refusal is recorded";
  Result<journal::Record> r = service_->find_record(out.public_id, {"alice", false});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->state, journal::RequestState::kFailed);
  EXPECT_FALSE(r->body_kept) << "a refusal keeps the body's size and digest, not the body";
}

TEST_F(RequestServiceTest, AResumeOfAFinishedRequestIsNotResumableTyped) {
  build(/*with_journal=*/true);
  SubmitOutcome a = service_->submit(submission("alice", "Once upon a time"));
  ASSERT_EQ(a.kind, SubmitOutcome::Kind::kAccepted) << a.status.to_string();
  collect(*a.ticket);
  Result<journal::Record> r = service_->find_record(a.public_id, {"alice", false});
  for (int i = 0; i < 200 && r.ok() && !journal::is_terminal(r->state); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    r = service_->find_record(a.public_id, {"alice", false});
  }
  ResumeCommand c;
  c.caller.owner = "alice";
  c.public_id = a.public_id;
  Result<ResumeOutcome> resumed = service_->resume(c);
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.status().reason(), FailureReason::kNotResumable) << resumed.status().to_string();
  EXPECT_EQ(classify(resumed.status()).http_status, 409);
  c.caller.owner = "bob";
  EXPECT_EQ(service_->resume(c).status().code(), StatusCode::kNotFound);
}

TEST_F(RequestServiceTest, WithoutAJournalIdsAreRandomAndTheInFlightListIsPerOwner) {
  build(/*with_journal=*/false);
  SubmitOutcome a = service_->submit(submission("alice", "Once upon a time"));
  ASSERT_EQ(a.kind, SubmitOutcome::Kind::kAccepted) << a.status.to_string();
  EXPECT_EQ(a.record_id, 0);
  EXPECT_GT(a.public_id, 0);
  EXPECT_LT(a.public_id, int64_t{1} << 53);
  const std::vector<InFlightRequest> mine = service_->in_flight({"alice", false});
  if (!serve::is_terminal(a.ticket->state())) {
    ASSERT_EQ(mine.size(), 1u);
    EXPECT_EQ(mine[0].public_id, a.public_id);
  }
  EXPECT_TRUE(service_->in_flight({"bob", false}).empty());
  EXPECT_FALSE(service_->find_record(a.public_id, {"alice", false}).ok());
  collect(*a.ticket);
  service_->finished(a.public_id);
  EXPECT_TRUE(service_->in_flight({"alice", false}).empty());
  ResumeCommand c;
  c.public_id = a.public_id;
  EXPECT_EQ(service_->resume(c).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace spw::gateway
