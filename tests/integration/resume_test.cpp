// Integration: POST /v1/requests/{id}/resume on the real `spillway serve`
// binary. A streamed greedy request (with frequency and presence penalties
// and a logit_bias, which the resume must carry on) is killed (SIGKILL)
// mid-stream; after a restart on the same journal its record is failed /
// interrupted / resumable with the checkpoint it reached, and a resume with
// everything the client had received continues it: received + continuation
// is the uninterrupted text, with the full usage, and the request is then
// done (a second resume: 409).
// Around it, the refusals: text that disagrees with the checkpoint (409 on
// received_text, still resumable), an unknown id (404), a body with an unknown
// field (400 naming it), a finished request (409), no journal (404).
//
// Killing mid-stream deterministically: on the CPU the bundled 260K model
// decodes hundreds of tokens a second, so "kill when some text arrived" races
// the end of the request. The crash test runs on the Vulkan path (lavapipe)
// and arms the admin API's `slow` fault to start after the first tokens'
// submissions: the first kKillAfterChunks tokens come at the device's normal
// rate, every later submission takes kSlowFactor times as long (about half a
// second a token on lavapipe), so the request is far from done when the client
// kills the server; faults are not persisted, so the restarted server decodes
// at full speed. The test skips without a Vulkan device; the refusals run on
// the CPU. Every wait is bounded; servers listen on 127.0.0.1, port 0.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "spillway_process.h"

namespace {

using nlohmann::json;
using spw::testing::Server;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "resume-admin-token-1";
constexpr const char* kPrompt = "Once upon a time";
constexpr int kMaxTokens = 128;
// The stream is killed once this many text chunks (one per token) arrived;
// the slow fault starts a few tokens later (3 submissions a token on the
// Vulkan path: the prompt's and each decode step's), so the server is at most
// a couple of tokens ahead of the client when it dies.
constexpr int kKillAfterChunks = 28;
constexpr int kSlowAfterSubmits = 3 * (kKillAfterChunks + 2);
constexpr int kSlowFactor = 20;
constexpr int kCheckpointEvery = 8;

std::optional<std::string> no_vulkan() {
  auto d = spw::list_vulkan_devices();
  if (!d.ok()) return d.status().to_string();
  if (d->empty()) return std::string("no Vulkan device");
  return std::nullopt;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Greedy, with OpenAI's penalties and a logit_bias (the EOS banned, so the
// run is kMaxTokens long whatever the penalties make of it): a resume that
// lost any of them, from the journal's checkpoint or from the stored body,
// would continue with other text than the uninterrupted run's.
std::string completion_body(bool stream) {
  json b = {{"prompt", kPrompt},           {"max_tokens", kMaxTokens},     {"temperature", 0},
            {"frequency_penalty", 0.5},    {"presence_penalty", 0.25},     {"logit_bias", {{"2", -100}}}};
  if (stream) b["stream"] = true;
  return b.dump();
}

std::string resume_path(int64_t id) { return "/v1/requests/" + std::to_string(id) + "/resume"; }

json get_record(httplib::Client& c, int64_t id) {
  auto r = c.Get(("/v1/requests/" + std::to_string(id)).c_str());
  if (!r || r->status != 200) return json::object();
  return json::parse(r->body);
}

// The complete "data: {...}" events of an SSE body (a trailing partial event,
// cut by the kill, is left out).
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  for (;;) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: {", 0) == 0) out.push_back(json::parse(ev.substr(6)));
  }
  return out;
}

// The state a test expects a record to be in after a refused resume.
void expect_still_resumable(httplib::Client& c, int64_t id, int checkpoint_tokens, const std::string& after) {
  const json rec = get_record(c, id);
  EXPECT_EQ(rec.value("state", ""), "failed") << after << ": " << rec.dump();
  EXPECT_EQ(rec.value("resumable", false), true) << after << ": " << rec.dump();
  EXPECT_EQ(rec.value("checkpoint_tokens", json()), json(checkpoint_tokens)) << after << ": " << rec.dump();
}

// A greedy stream of kMaxTokens killed (SIGKILL to the server) once
// `kill_after` text chunks arrived: the request id, the text received, its
// chunks; `error` says what went wrong instead.
struct Interrupted {
  int64_t id = 0;
  std::string received;
  int chunks = 0;
  std::string error;
};

Interrupted stream_and_kill(Server& s, httplib::Client& c, int kill_after) {
  Interrupted out;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = completion_body(true);
  req.set_header("Content-Type", "application/json");
  std::string raw;
  bool killed = false;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    raw.append(d, n);
    if (!killed) {
      int chunks = 0;
      for (const json& ev : sse_events(raw)) {
        if (ev.contains("choices") && !ev["choices"].empty() && !ev["choices"][0].value("text", "").empty()) ++chunks;
      }
      if (chunks >= kill_after) {
        killed = true;
        s.signal(SIGKILL);
      }
    }
    return true;  // read on: what the server sent before it died still arrives
  };
  (void)c.send(req);  // ends when the connection does
  if (!killed) {
    out.error = "the stream ended before " + std::to_string(kill_after) + " tokens arrived:\n" + raw;
    return out;
  }
  if (s.wait_exit(std::chrono::seconds(20)) != 128 + SIGKILL) {
    out.error = "the server did not die of SIGKILL";
    return out;
  }
  for (const json& ev : sse_events(raw)) {
    if (ev.contains("spillway") && ev["spillway"].contains("request_id")) out.id = ev["spillway"]["request_id"];
    if (ev.contains("error")) out.error = "an error event: " + raw;
    if (!ev.contains("choices") || ev["choices"].empty()) continue;
    const json& ch = ev["choices"][0];
    // A finished request cannot be interrupted: the slow fault is meant to
    // make that impossible, so this is a failure of the test's design.
    if (!ch["finish_reason"].is_null()) {
      out.error = "test design: the request finished before the kill (the slow fault did not slow it down):\n" + raw;
    }
    const std::string t = ch.value("text", "");
    if (!t.empty()) ++out.chunks;
    out.received += t;
  }
  if (out.id <= 0) out.error = "no request id in the stream:\n" + raw;
  return out;
}

TEST(Resume, AfterSigkillAndRestartResumeContinuesFromTheLastCheckpoint) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  const auto t0 = Clock::now();
  const std::string journal = (std::filesystem::temp_directory_path() /
                               ("spw-resume-" + std::to_string(getpid()) + ".sqlite"))
                                  .string();
  Server::remove_journal(journal);
  struct Cleanup {
    std::string path;
    ~Cleanup() { Server::remove_journal(path); }
  } cleanup{journal};
  const std::vector<std::string> flags = {"--device",           "vulkan", "--no-cpu-fallback", "--journal", journal,
                                          "--checkpoint-every", std::to_string(kCheckpointEvery),
                                          "--health-interval-s", "0",     "--admin-token",     kToken};

  std::string reference;
  int reference_tokens = 0;
  int64_t id = 0;
  std::string received;
  int received_chunks = 0;
  {
    Server s(flags);
    ASSERT_GT(s.port(), 0) << s.ready_line();
    ASSERT_NE(s.ready_line().find("paths=gpu:vulkan"), std::string::npos)
        << "the crash test needs the Vulkan path: " << s.ready_line();
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);

    // The uninterrupted greedy reference, on the same path.
    auto r = c.Post("/v1/completions", completion_body(false), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json ref = json::parse(r->body);
    ASSERT_EQ(ref["spillway"]["path"], "gpu") << r->body;
    reference = ref["choices"][0]["text"];
    reference_tokens = ref["usage"]["completion_tokens"];
    ASSERT_EQ(reference_tokens, kMaxTokens) << r->body;
    ASSERT_EQ(ref["choices"][0]["finish_reason"], "length") << r->body;

    // From a few tokens after the kill point on, the request crawls.
    const json slow = {{"kind", "slow"},
                       {"path", "gpu"},
                       {"after_submits", kSlowAfterSubmits},
                       {"factor", kSlowFactor},
                       {"count", 0}};
    r = c.Post("/v1/admin/faults", httplib::Headers{{"Authorization", std::string("Bearer ") + kToken}}, slow.dump(),
               "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 201) << r->body;

    Interrupted got = stream_and_kill(s, c, kKillAfterChunks);
    ASSERT_TRUE(got.error.empty()) << got.error;
    id = got.id;
    received = got.received;
    received_chunks = got.chunks;
    ASSERT_GE(received_chunks, kKillAfterChunks);
    ASSERT_LT(received_chunks, kMaxTokens) << "test design: the whole answer arrived before the kill";
    ASSERT_EQ(reference.substr(0, received.size()), received) << "the interrupted stream is not a prefix of the reference";
  }
  std::printf("killed after %d tokens received (%zu chars), %.2f s in\n", received_chunks, received.size(),
              seconds_since(t0));

  // Restarted on the same journal: the request is failed, interrupted,
  // resumable, with its last checkpoint.
  Server s(flags);
  ASSERT_GT(s.port(), 0) << s.ready_line();
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  const json rec = get_record(c, id);
  ASSERT_FALSE(rec.empty()) << "GET /v1/requests/" << id << " after the restart";
  EXPECT_EQ(rec["state"], "failed") << rec.dump();
  EXPECT_EQ(rec["terminal"], true) << rec.dump();
  EXPECT_EQ(rec["resumable"], true) << rec.dump();
  EXPECT_EQ(rec["error"]["code"], "interrupted") << rec.dump();
  ASSERT_TRUE(rec["checkpoint_tokens"].is_number_integer()) << rec.dump();
  const int checkpoint = rec["checkpoint_tokens"];
  EXPECT_GT(checkpoint, 0) << rec.dump();
  EXPECT_EQ(checkpoint % kCheckpointEvery, 0) << rec.dump();
  // The server was at most a few tokens ahead of the client (kill point
  // before the slow fault), so the checkpoint is at most one interval past
  // what the client had.
  EXPECT_LE(checkpoint, received_chunks + kCheckpointEvery) << rec.dump();

  // Text that disagrees with the checkpoint's: 409 on received_text; the
  // request stays resumable from the same checkpoint.
  std::string wrong = received;
  wrong[0] = wrong[0] == 'X' ? 'Y' : 'X';
  auto r = c.Post(resume_path(id).c_str(), json({{"received_text", wrong}, {"stream", false}}).dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["param"], "received_text") << r->body;
  EXPECT_EQ(e["error"]["code"], "replay_mismatch") << r->body;
  expect_still_resumable(c, id, checkpoint, "after the mismatching resume");

  // An unknown field: 400 naming it, nothing changes.
  r = c.Post(resume_path(id).c_str(), json({{"received_text", received}, {"max_tokens", 3}}).dump(),
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  e = json::parse(r->body);
  EXPECT_EQ(e["error"]["param"], "max_tokens") << r->body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos) << r->body;
  expect_still_resumable(c, id, checkpoint, "after the resume with an unknown field");

  // The resume with everything the client received (at or past the
  // checkpoint, or short of it: either way only the text after it comes).
  const auto t_resume = Clock::now();
  r = c.Post(resume_path(id).c_str(), json({{"received_text", received}, {"stream", false}}).dump(),
             "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  const std::string continuation = body["choices"][0]["text"];
  EXPECT_EQ(received + continuation, reference) << "received: " << json(received) << "\ncontinuation: "
                                                << json(continuation) << "\nreference: " << json(reference);
  EXPECT_EQ(body["spillway"]["resumed_at_token"], checkpoint) << r->body;
  EXPECT_EQ(r->get_header_value("X-Spillway-Resumed-At-Token"), std::to_string(checkpoint));
  EXPECT_EQ(body["spillway"]["request_id"], id) << r->body;
  EXPECT_EQ(body["usage"]["completion_tokens"], reference_tokens) << r->body;
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length") << r->body;
  EXPECT_EQ(body["object"], "text_completion") << r->body;
  std::printf("checkpoint at token %d, client had %d tokens; resume took %.2f s\n", checkpoint, received_chunks,
              seconds_since(t_resume));

  const json done = get_record(c, id);
  EXPECT_EQ(done["state"], "done") << done.dump();
  EXPECT_EQ(done["text"], reference) << done.dump();
  EXPECT_EQ(done["resumable"], false) << done.dump();

  // Done: nothing to resume.
  r = c.Post(resume_path(id).c_str(), json({{"received_text", received}}).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "not_resumable") << r->body;
  std::printf("crash test: %.2f s in all\n", seconds_since(t0));
}

// Killed before its first checkpoint (the kill comes 3 tokens in, the first
// checkpoint would be at token 1000): the journal has the request but no
// checkpoint, and a resume runs it from its prompt, regenerating silently
// what the client already has.
TEST(Resume, KilledBeforeItsFirstCheckpointResumesFromItsPrompt) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  const std::string journal = (std::filesystem::temp_directory_path() /
                               ("spw-resume0-" + std::to_string(getpid()) + ".sqlite"))
                                  .string();
  Server::remove_journal(journal);
  struct Cleanup {
    std::string path;
    ~Cleanup() { Server::remove_journal(path); }
  } cleanup{journal};
  const std::vector<std::string> flags = {"--device",           "vulkan", "--no-cpu-fallback", "--journal", journal,
                                          "--checkpoint-every", "1000",   "--health-interval-s", "0",
                                          "--admin-token",      kToken};
  constexpr int kKillAt = 3;
  std::string reference;
  Interrupted got;
  {
    Server s(flags);
    ASSERT_GT(s.port(), 0) << s.ready_line();
    ASSERT_NE(s.ready_line().find("paths=gpu:vulkan"), std::string::npos) << s.ready_line();
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", completion_body(false), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    reference = json::parse(r->body)["choices"][0]["text"];
    const json slow = {{"kind", "slow"}, {"path", "gpu"}, {"after_submits", 3 * (kKillAt + 2)}, {"factor", kSlowFactor},
                       {"count", 0}};
    r = c.Post("/v1/admin/faults", httplib::Headers{{"Authorization", std::string("Bearer ") + kToken}}, slow.dump(),
               "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 201) << r->body;
    got = stream_and_kill(s, c, kKillAt);
    ASSERT_TRUE(got.error.empty()) << got.error;
    ASSERT_GE(got.chunks, kKillAt);
  }
  Server s(flags);
  ASSERT_GT(s.port(), 0) << s.ready_line();
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  const json rec = get_record(c, got.id);
  EXPECT_EQ(rec["state"], "failed") << rec.dump();
  EXPECT_EQ(rec["error"]["code"], "interrupted") << rec.dump();
  EXPECT_TRUE(rec["checkpoint_tokens"].is_null()) << "no checkpoint was taken: " << rec.dump();
  auto r = c.Post(resume_path(got.id).c_str(), json({{"received_text", got.received}, {"stream", false}}).dump(),
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  EXPECT_EQ(got.received + body["choices"][0]["text"].get<std::string>(), reference);
  EXPECT_EQ(body["spillway"]["resumed_at_token"], 0) << r->body;
  EXPECT_EQ(body["usage"]["completion_tokens"], kMaxTokens) << r->body;
  const json done = get_record(c, got.id);
  EXPECT_EQ(done["state"], "done") << done.dump();
  EXPECT_EQ(done["text"], reference) << done.dump();
}

// The refusals that need no interrupted request, on the CPU.
TEST(Resume, RefusalsNameWhatIsWrong) {
  Server s({"--device", "cpu"});
  ASSERT_GT(s.port(), 0) << s.ready_line();
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":8,"temperature":0})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const int64_t done_id = json::parse(r->body)["spillway"]["request_id"];

  // Unknown id.
  r = c.Post(resume_path(done_id + 1000).c_str(), R"({"received_text":""})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "not_found") << r->body;

  // Not an id at all.
  r = c.Post("/v1/requests/seven/resume", R"({"received_text":""})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "id") << r->body;

  // Unknown field, wrong type: 400 naming the field.
  r = c.Post(resume_path(done_id).c_str(), R"({"received_text":"","temperature":0.5})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "temperature") << r->body;
  r = c.Post(resume_path(done_id).c_str(), R"({"received_text":5})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "received_text") << r->body;
  r = c.Post(resume_path(done_id).c_str(), R"({"received_text":"","stream":"yes"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "stream") << r->body;

  // A finished request: 409 not_resumable, and it stays done.
  r = c.Post(resume_path(done_id).c_str(), R"({"received_text":""})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "not_resumable") << r->body;
  EXPECT_EQ(get_record(c, done_id)["state"], "done");

  // Without a journal nothing can be resumed, and the answer says why.
  Server none({"--device", "cpu", "--journal", "none"});
  ASSERT_GT(none.port(), 0) << none.ready_line();
  httplib::Client cn("127.0.0.1", none.port());
  cn.set_read_timeout(30, 0);
  r = cn.Post(resume_path(1).c_str(), R"({"received_text":""})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("--journal"), std::string::npos)
      << r->body;
}

}  // namespace
