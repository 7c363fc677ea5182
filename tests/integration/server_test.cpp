// Integration: the real HTTP server (in-process, 127.0.0.1, a free port) over
// the real CPU engine and models/stories260K.gguf, driven by httplib::Client.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "engine/engine_test_util.h"
#include "gateway/gateway.h"
#include "http/server.h"
#include "model/model.h"
#include "serve/engine_executor.h"
#include "serve/journal_observer.h"

namespace spw {
namespace {

using nlohmann::json;

using spw::testing::stories;  // engine/engine_test_util.h

// Holds workers in before_run until opened (deterministic queue states).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool armed = false;
  bool open = false;
  int waiting = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    if (!armed) return;
    ++waiting;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  bool wait_for_waiters(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return waiting >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

struct ServerConfig {
  int32_t queue = 8;
  int32_t workers = 1;
  std::optional<ChatTemplateKind> chat_template;
  bool gate = false;
  int slow_token_ms = 0;  // sleep after every token (disconnect tests)
  std::string journal;    // SQLite file; empty: no journal
  std::vector<std::string> aliases;  // --alias
  // A second CPU path ("small") serving the same file under the id
  // "stories260K-small", marked fallback_model as --fallback-model marks one.
  bool fallback_path = false;
};

class TestServer {
 public:
  explicit TestServer(const ServerConfig& c) {
    auto model = stories();
    if (!model) return;
    gate_.armed = c.gate;
    serve::EngineServeOptions o;
    o.n_workers = c.workers;
    o.queue_capacity = c.queue;
    o.hooks.before_run = [this](uint64_t) { gate_.wait(); };
    const int slow = c.slow_token_ms;
    if (slow > 0) {
      o.hooks.after_token = [slow](uint64_t, int32_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(slow));
      };
    }
    if (!c.journal.empty()) {
      auto j = journal::Journal::open(Env::default_env(), c.journal);
      EXPECT_TRUE(j.ok()) << j.status().to_string();
      if (!j.ok()) return;
      journal_ = std::move(*j);
      o.observer = std::make_shared<serve::JournalObserver>(journal_);
    }
    auto s = serve::make_engine_scheduler(Env::default_env(), model, o);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return;
    // One path, as `serve --device cpu` builds it, behind the gateway.
    gateway::ExecutionPath path;
    path.name = "cpu";
    path.placement = s->scheduler->placement();
    path.model = "stories260K";
    path.scheduler = std::move(s->scheduler);
    path.tokenizer = std::shared_ptr<const Tokenizer>(model, &model->tokenizer());
    std::vector<gateway::ExecutionPath> paths;
    paths.push_back(std::move(path));
    if (c.fallback_path) {
      serve::EngineServeOptions fo;
      fo.n_workers = 1;
      fo.queue_capacity = c.queue;
      auto fs = serve::make_engine_scheduler(Env::default_env(), model, fo);
      EXPECT_TRUE(fs.ok()) << fs.status().to_string();
      if (!fs.ok()) return;
      gateway::ExecutionPath f;
      f.name = "small";
      f.placement = fs->scheduler->placement();
      f.model = "stories260K-small";
      f.fallback_model = true;
      f.role = admission::PathRole::kFallback;
      f.scheduler = std::move(fs->scheduler);
      f.tokenizer = std::shared_ptr<const Tokenizer>(model, &model->tokenizer());
      paths.push_back(std::move(f));
    }
    auto g = gateway::Gateway::create(Env::default_env(), std::move(paths), {}, {});
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!g.ok()) return;
    gateway_ = std::move(*g);
    http::HttpServerOptions ho;
    ho.host = "127.0.0.1";
    ho.port = 0;
    ho.model_name = "stories260K";
    ho.model_aliases = c.aliases;
    ho.chat_template = c.chat_template;
    ho.keepalive_interval = std::chrono::milliseconds(50);
    ho.journal = journal_;
    auto h = http::HttpServer::create(Env::default_env(), *gateway_, ho);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return;
    http_ = std::move(h).value();
    Status st = http_->start();
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) http_.reset();
  }
  ~TestServer() {
    gate_.release();
    if (gateway_) gateway_->shutdown(std::chrono::milliseconds(0));
    if (http_) http_->stop();
  }
  bool ok() const { return http_ != nullptr; }
  int port() const { return http_->port(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(30, 0);
    c.set_connection_timeout(5, 0);
    return c;
  }
  serve::Scheduler& scheduler() { return *gateway_->primary().scheduler; }
  gateway::Gateway& gateway() { return *gateway_; }
  Gate& gate() { return gate_; }

 private:
  Gate gate_;
  std::shared_ptr<journal::Journal> journal_;
  std::unique_ptr<gateway::Gateway> gateway_;
  std::unique_ptr<http::HttpServer> http_;
};

httplib::Result post(const TestServer& s, const std::string& path, const json& body) {
  httplib::Client c = s.client();
  return c.Post(path.c_str(), body.dump(), "application/json");
}

// A parsed SSE stream: the JSON payloads and whether it ended with [DONE].
struct Sse {
  std::vector<json> events;
  bool done = false;
  int keepalives = 0;
};

Sse parse_sse(const std::string& body) {
  Sse s;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind(":", 0) == 0) {
      ++s.keepalives;
    } else if (ev == "data: [DONE]") {
      s.done = true;
    } else if (ev.rfind("data: ", 0) == 0) {
      EXPECT_FALSE(s.done) << "event after [DONE]";
      s.events.push_back(json::parse(ev.substr(6)));
    } else {
      ADD_FAILURE() << "not an SSE data event: " << ev;
    }
  }
  EXPECT_EQ(pos, body.size()) << "trailing bytes in stream";
  return s;
}

void expect_error_shape(const httplib::Result& r, int status, const std::string& param) {
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r->body;
  }
}

const json kGreedy = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 60}};

TEST(Server, HealthAndModels) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  httplib::Client c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  json j = json::parse(h->body);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["model"], "stories260K");
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_EQ(j["queue"]["depth"], 0);
  EXPECT_EQ(j["queue"]["capacity"], 8);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "stories260K");
  auto nf = c.Get("/v1/nothing");
  expect_error_shape(nf, 404, "");
}

TEST(Server, GreedyCompletionAndItsStreamAgree) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  auto r = post(s, "/v1/completions", kGreedy);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Spillway-Placement"), "cpu");
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  EXPECT_NE(text.find("Lily"), std::string::npos) << text;
  const std::string finish = j["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 1);
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 0);
  EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 60);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(j["spillway"]["placement"], "cpu");
  EXPECT_EQ(j["spillway"]["model"], "stories260K");
  EXPECT_EQ(j["spillway"]["limits"]["max_tokens"], 60);
  EXPECT_EQ(j["spillway"]["limits"]["max_tokens_clamped"], false);

  json sb = kGreedy;
  sb["stream"] = true;
  sb["stream_options"] = {{"include_usage", true}};
  auto sr = post(s, "/v1/completions", sb);
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200) << sr->body;
  EXPECT_NE(sr->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  Sse sse = parse_sse(sr->body);
  EXPECT_TRUE(sse.done);
  ASSERT_GE(sse.events.size(), 3u);
  std::string streamed;
  std::string stream_finish;
  json usage;
  for (const json& e : sse.events) {
    EXPECT_EQ(e["object"], "text_completion");
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    streamed += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) stream_finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(stream_finish, finish);
  EXPECT_EQ(sse.events.front()["spillway"]["placement"], "cpu");
  EXPECT_EQ(usage["completion_tokens"], j["usage"]["completion_tokens"]);
}

TEST(Server, MaxTokensIsClampedToTheContextAndReported) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  json b = kGreedy;
  b["max_tokens"] = 1000000;
  b["stop"] = "Lily";  // keep it short; the clamp shows in limits either way
  auto r = post(s, "/v1/completions", b);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  const json& lim = j["spillway"]["limits"];
  EXPECT_EQ(lim["max_tokens_clamped"], true);
  EXPECT_EQ(lim["max_tokens_requested"], 1000000);
  EXPECT_EQ(lim["max_tokens"].get<int>(), lim["n_ctx"].get<int>() - lim["prompt_tokens"].get<int>());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().find("Lily"), std::string::npos);
}

TEST(Server, PromptLongerThanTheContextIs400NamingTheLimit) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  std::string p;
  for (int i = 0; i < 700; ++i) p += "Once upon a time ";
  auto r = post(s, "/v1/completions", {{"prompt", p}, {"max_tokens", 4}});
  expect_error_shape(r, 400, "prompt");
  json j = json::parse(r->body);
  EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
  const std::string n_ctx = std::to_string(stories()->hparams().n_ctx_train);
  EXPECT_NE(j["error"]["message"].get<std::string>().find(n_ctx), std::string::npos) << r->body;
}

TEST(Server, ChatWithoutTemplateTellsToUseChatTemplateFlag) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  auto r = post(s, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  expect_error_shape(r, 400, "messages");
  EXPECT_NE(r->body.find("--chat-template"), std::string::npos) << r->body;
}

TEST(Server, ChatWithTemplateAnswersAndStreams) {
  ServerConfig c;
  c.chat_template = ChatTemplateKind::kChatML;
  TestServer s(c);
  ASSERT_TRUE(s.ok());
  json body = {{"messages", {{{"role", "system"}, {"content", "You tell stories."}},
                             {{"role", "user"}, {"content", "Once upon a time"}}}},
               {"temperature", 0},
               {"max_tokens", 20}};
  auto r = post(s, "/v1/chat/completions", body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string());
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 5);
  EXPECT_EQ(j["spillway"]["placement"], "cpu");

  body["stream"] = true;
  auto sr = post(s, "/v1/chat/completions", body);
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200);
  Sse sse = parse_sse(sr->body);
  EXPECT_TRUE(sse.done);
  ASSERT_GE(sse.events.size(), 2u);
  EXPECT_EQ(sse.events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(sse.events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (const json& e : sse.events) {
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(content, j["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(sse.events.back()["choices"][0]["finish_reason"], j["choices"][0]["finish_reason"]);
  EXPECT_EQ(sse.events.back()["spillway"]["placement"], "cpu");
}

TEST(Server, InvalidBodiesAre400WithTheErrorShape) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  httplib::Client c = s.client();
  auto raw = c.Post("/v1/completions", "{not json", "application/json");
  expect_error_shape(raw, 400, "");
  EXPECT_EQ(json::parse(raw->body)["error"]["type"], "invalid_request_error");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", ""}}), 400, "prompt");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", 3}}), 400, "prompt");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", "a"}, {"max_tokens", -1}}), 400, "max_tokens");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", "a"}, {"temperature", "NaN"}}), 400, "temperature");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", "a"}, {"stop", {1, 2}}}), 400, "stop[0]");
  expect_error_shape(post(s, "/v1/completions", {{"prompt", "a"}, {"stream", "yes"}}), 400, "stream");
  auto nan = c.Post("/v1/completions", R"({"prompt":"a","temperature":NaN})", "application/json");
  expect_error_shape(nan, 400, "");
  expect_error_shape(post(s, "/v1/chat/completions", {{"messages", "hi"}}), 400, "messages");
  EXPECT_EQ(s.scheduler().stats().submitted, 0u);
}

TEST(Server, FullQueueIs429) {
  ServerConfig c;
  c.queue = 1;
  c.workers = 1;
  c.gate = true;
  TestServer s(c);
  ASSERT_TRUE(s.ok());
  json body = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 200}};
  std::optional<httplib::Result> ra, rb;
  std::thread ta([&] { ra.emplace(post(s, "/v1/completions", body)); });
  ASSERT_TRUE(s.gate().wait_for_waiters(1));  // A holds the only worker
  std::thread tb([&] { rb.emplace(post(s, "/v1/completions", body)); });
  for (int i = 0; i < 1000 && s.scheduler().stats().queue_depth < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(s.scheduler().stats().queue_depth, 1);  // B waits
  // C and D find the queue full.
  for (int k = 0; k < 2; ++k) {
    auto rc = post(s, "/v1/completions", body);
    expect_error_shape(rc, 429, "");
    EXPECT_EQ(json::parse(rc->body)["error"]["code"], "queue_full");
    // Retry-After is the path's estimated wait, in whole seconds (>= 1).
    EXPECT_GE(std::stoi(rc->get_header_value("Retry-After")), 1);
    EXPECT_EQ(json::parse(rc->body)["spillway"]["decision"], "reject");
  }
  httplib::Client hc = s.client();
  auto h = hc.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["queue"]["depth"], 1);
  s.gate().release();
  ta.join();
  tb.join();
  ASSERT_TRUE(ra && *ra);
  ASSERT_TRUE(rb && *rb);
  EXPECT_EQ((*ra)->status, 200) << (*ra)->body;
  EXPECT_EQ((*rb)->status, 200) << (*rb)->body;
  // Admission refused C and D before they reached the path's queue.
  EXPECT_EQ(s.gateway().status().decided(gateway::DecisionCounter::kReject), 2u);
}

// Streams a completion and hangs up after the first chunk that carries text.
bool stream_and_hang_up(const TestServer& s, const json& body) {
  httplib::Client c = s.client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  bool got_data = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (std::string(data, n).find("data: {") != std::string::npos) got_data = true;
    return !got_data;  // false: abort the transfer and close the connection
  };
  auto r = c.send(req);
  (void)r;
  return got_data;
}

bool wait_until(const std::function<bool()>& pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

TEST(Server, DisconnectDuringStreamCancelsAndFreesTheWorker) {
  ServerConfig c;
  c.slow_token_ms = 5;  // >= 5 s for 1000 tokens: the cancel must win by far
  TestServer s(c);
  ASSERT_TRUE(s.ok());
  json body = {{"prompt", "Once upon a time"}, {"temperature", 0.8}, {"seed", 7}, {"max_tokens", 1000},
               {"stream", true}};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(stream_and_hang_up(s, body));
  ASSERT_TRUE(wait_until([&] { return s.scheduler().stats().cancelled == 1; }));
  EXPECT_EQ(s.scheduler().stats().done, 0u);
  EXPECT_EQ(s.scheduler().stats().running, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // The worker is free: a following request completes.
  auto r = post(s, "/v1/completions", {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 5}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST(Server, DisconnectWhileQueuedFreesTheQueueSlot) {
  ServerConfig c;
  c.queue = 1;
  c.gate = true;
  TestServer s(c);
  ASSERT_TRUE(s.ok());
  json body = {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 5}};
  std::optional<httplib::Result> ra;
  std::thread ta([&] { ra.emplace(post(s, "/v1/completions", body)); });
  ASSERT_TRUE(s.gate().wait_for_waiters(1));
  json sb = body;
  sb["stream"] = true;
  ASSERT_TRUE(stream_and_hang_up(s, sb));  // queued behind A, then gone
  // Keep-alive comments notice the closed socket; the queued request is cancelled.
  ASSERT_TRUE(wait_until([&] { return s.scheduler().stats().cancelled == 1; }));
  EXPECT_EQ(s.scheduler().stats().queue_depth, 0);
  s.gate().release();
  ta.join();
  ASSERT_TRUE(ra && *ra);
  EXPECT_EQ((*ra)->status, 200);
}

// A fresh journal file per test, removed afterwards.
struct TempJournal {
  std::string path;
  TempJournal() {
    path = (std::filesystem::temp_directory_path() /
            ("spw-server-journal-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".sqlite"))
               .string();
    remove();
  }
  ~TempJournal() { remove(); }
  void remove() {
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::filesystem::remove(path + suffix);
  }
};

json get_json(const TestServer& s, const std::string& path, int* status = nullptr) {
  httplib::Client c = s.client();
  auto r = c.Get(path.c_str());
  if (!r) return json();
  if (status) *status = r->status;
  return json::parse(r->body);
}

// Every accepted request is in the journal and readable by id; a retry with a
// finished request's Idempotency-Key gets the stored answer without running
// again (non-stream and stream), a key reused with another body is a 409.
TEST(Server, JournalRecordsRequestsAndReplaysIdempotentRetries) {
  TempJournal tj;
  ServerConfig cfg;
  cfg.journal = tj.path;
  TestServer s(cfg);
  ASSERT_TRUE(s.ok());
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":24,"temperature":0})";
  httplib::Client c = s.client();
  httplib::Headers key{{"Idempotency-Key", "story-1"}};
  auto first = c.Post("/v1/completions", key, body, "application/json");
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const json a = json::parse(first->body);
  const uint64_t id = a["spillway"]["request_id"];
  EXPECT_EQ(first->get_header_value("X-Spillway-Request-Id"), std::to_string(id));
  EXPECT_FALSE(a["spillway"].contains("replayed"));
  int status = 0;
  const json rec = get_json(s, "/v1/requests/" + std::to_string(id), &status);
  ASSERT_EQ(status, 200) << rec.dump();
  EXPECT_EQ(rec["state"], "done");
  EXPECT_EQ(rec["terminal"], true);
  EXPECT_EQ(rec["text"], a["choices"][0]["text"]);
  EXPECT_EQ(rec["finish_reason"], "length");
  EXPECT_EQ(rec["usage"]["completion_tokens"], 24);
  EXPECT_EQ(rec["placement"], "cpu");
  EXPECT_EQ(rec["idempotency_key"], "story-1");
  EXPECT_EQ(rec["error"], nullptr);
  // The decision it ran under, with its reason and figures.
  const json& adm = rec["admission"];
  ASSERT_TRUE(adm.is_object()) << rec.dump();
  EXPECT_EQ(adm["kind"], "admit") << adm.dump();
  EXPECT_EQ(adm["kind"], a["spillway"]["decision"]);
  EXPECT_EQ(adm["path"], "cpu");
  EXPECT_FALSE(adm["reason"].get<std::string>().empty());
  EXPECT_EQ(adm["reason"], a["spillway"]["reason"]);
  EXPECT_EQ(adm["failure"], nullptr);
  EXPECT_EQ(adm["http_status"], 200);
  EXPECT_EQ(adm["limits"]["max_tokens"], 24);
  EXPECT_EQ(adm["limits"]["max_tokens_requested"], 24);
  EXPECT_EQ(adm["limits"]["prompt_tokens"], a["usage"]["prompt_tokens"]);
  EXPECT_GT(adm["limits"]["kv_blocks"].get<int>(), 0);
  EXPECT_EQ(adm["queue_position"], 0);
  ASSERT_EQ(adm["verdicts"].size(), 1u);
  EXPECT_EQ(adm["verdicts"][0]["path"], "cpu");
  EXPECT_EQ(adm["verdicts"][0]["eligible"], true);

  const uint64_t ran = s.scheduler().stats().submitted;
  auto again = c.Post("/v1/completions", key, body, "application/json");
  ASSERT_TRUE(again);
  ASSERT_EQ(again->status, 200) << again->body;
  const json b = json::parse(again->body);
  EXPECT_EQ(b["choices"][0]["text"], a["choices"][0]["text"]);
  EXPECT_EQ(b["id"], a["id"]) << "the original response's id";
  EXPECT_EQ(b["spillway"]["replayed"], true);
  // Where it ran and under which decision, as the original said.
  EXPECT_EQ(b["spillway"]["path"], a["spillway"]["path"]) << again->body;
  EXPECT_EQ(b["spillway"]["decision"], a["spillway"]["decision"]) << again->body;
  EXPECT_EQ(b["spillway"]["degraded"], a["spillway"]["degraded"]) << again->body;
  EXPECT_EQ(again->get_header_value("X-Spillway-Replayed"), "true");
  EXPECT_EQ(get_json(s, "/v1/requests/" + std::to_string(id))["admission"], adm) << "a replay decides nothing";
  // The same retry as a stream: the stored text in one chunk, then [DONE].
  json stream_body = json::parse(body);
  stream_body["stream"] = true;
  httplib::Headers key2{{"Idempotency-Key", "story-2"}};
  auto s1 = c.Post("/v1/completions", key2, stream_body.dump(), "application/json");
  auto s2 = c.Post("/v1/completions", key2, stream_body.dump(), "application/json");
  ASSERT_TRUE(s1 && s2);
  const Sse e1 = parse_sse(s1->body), e2 = parse_sse(s2->body);
  EXPECT_TRUE(e1.done && e2.done);
  std::string t1, t2;
  for (const json& e : e1.events) t1 += e["choices"].empty() ? "" : e["choices"][0]["text"].get<std::string>();
  for (const json& e : e2.events) t2 += e["choices"].empty() ? "" : e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(t1, a["choices"][0]["text"].get<std::string>()) << "greedy: the same story";
  EXPECT_EQ(t2, t1);
  EXPECT_EQ(e2.events.back()["spillway"]["replayed"], true);
  EXPECT_EQ(s.scheduler().stats().submitted, ran + 1) << "only story-2's first request ran";

  auto conflict = c.Post("/v1/completions", key, R"({"prompt":"Another story","max_tokens":4})", "application/json");
  ASSERT_TRUE(conflict);
  EXPECT_EQ(conflict->status, 409) << conflict->body;
  EXPECT_EQ(json::parse(conflict->body)["error"]["code"], "idempotency_conflict");
  httplib::Headers bad_key{{"Idempotency-Key", std::string(300, 'k')}};
  auto bad = c.Post("/v1/completions", bad_key, body, "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "Idempotency-Key");

  get_json(s, "/v1/requests/999999", &status);
  EXPECT_EQ(status, 404);
  get_json(s, "/v1/requests/abc", &status);
  EXPECT_EQ(status, 400);
}

// A request the scheduler refuses after the journal accepted it (queue full)
// ends in the journal as failed, resumable, with the reason and the decision;
// its retry under the same Idempotency-Key is decided (and recorded) anew.
TEST(Server, JournalRecordsRefusedRequestsAsResumableFailures) {
  TempJournal tj;
  ServerConfig cfg;
  cfg.journal = tj.path;
  cfg.queue = 1;
  cfg.gate = true;
  TestServer s(cfg);
  ASSERT_TRUE(s.ok());
  const json body = json::parse(R"({"prompt":"Once upon a time","max_tokens":4,"temperature":0})");
  // 1 runs (held at the gate), 2 waits in the queue, 3 finds it full.
  // Request ids are random: each is read from its response.
  std::string id1, id2;
  auto id_of = [](const httplib::Result& r) {
    return r ? r->get_header_value("X-Spillway-Request-Id") : std::string();
  };
  std::thread running([&] { id1 = id_of(post(s, "/v1/completions", body)); });
  std::thread queued;
  struct Release {
    TestServer& s;
    std::thread& a;
    std::thread& b;
    ~Release() {
      s.gate().release();
      if (a.joinable()) a.join();
      if (b.joinable()) b.join();
    }
  } release{s, running, queued};
  ASSERT_TRUE(s.gate().wait_for_waiters(1));
  queued = std::thread([&] { id2 = id_of(post(s, "/v1/completions", body)); });
  for (int i = 0; i < 1000 && s.scheduler().stats().queue_depth < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(s.scheduler().stats().queue_depth, 1);
  httplib::Client c = s.client();
  const httplib::Headers key{{"Idempotency-Key", "third"}};
  auto r = c.Post("/v1/completions", key, body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  // Refused before it was tokenized (every queue full): a summary row, the
  // body not kept, its id in the header.
  const std::string id3 = r->get_header_value("X-Spillway-Request-Id");
  ASSERT_FALSE(id3.empty());
  EXPECT_GE(std::stoi(r->get_header_value("Retry-After")), 1);
  int status = 0;
  const json rec = get_json(s, "/v1/requests/" + id3, &status);
  ASSERT_EQ(status, 200) << rec.dump();
  EXPECT_EQ(rec["state"], "failed");
  EXPECT_EQ(rec["resumable"], true);
  EXPECT_EQ(rec["error"]["code"], "queue_full");
  EXPECT_NE(rec["error"]["message"].get<std::string>().find("queue full"), std::string::npos);
  // Why, and with which figures: the same decision the 429 body carried.
  const json& adm = rec["admission"];
  ASSERT_TRUE(adm.is_object()) << rec.dump();
  EXPECT_EQ(adm["kind"], "reject") << adm.dump();
  EXPECT_EQ(adm["failure"], "queue_full");
  EXPECT_EQ(adm["http_status"], 429);
  EXPECT_EQ(adm["path"], nullptr);
  EXPECT_EQ(adm["reason"], json::parse(r->body)["spillway"]["reason"]);
  EXPECT_GT(adm["retry_after_s"].get<double>(), 0.0);
  ASSERT_EQ(adm["verdicts"].size(), 1u);
  EXPECT_EQ(adm["verdicts"][0]["path"], "cpu");
  EXPECT_EQ(adm["verdicts"][0]["eligible"], false);
  EXPECT_EQ(adm["verdicts"][0]["reason"], json::parse(r->body)["spillway"]["paths"][0]["reason"]);
  s.gate().release();
  running.join();
  queued.join();
  ASSERT_FALSE(id1.empty() || id2.empty());
  EXPECT_NE(id1, id2);
  // The queued one was admitted behind the running one.
  const json queued_adm = get_json(s, "/v1/requests/" + id2)["admission"];
  EXPECT_EQ(queued_adm["path"], "cpu") << queued_adm.dump();
  EXPECT_EQ(queued_adm["queue_position"], 1) << queued_adm.dump();
  EXPECT_EQ(get_json(s, "/v1/requests/" + id1)["state"], "done");
  EXPECT_EQ(get_json(s, "/v1/requests/" + id2)["state"], "done");
  // The retry runs under the same id with its own decision, not the refusal.
  auto retry = c.Post("/v1/completions", key, body.dump(), "application/json");
  ASSERT_TRUE(retry);
  ASSERT_EQ(retry->status, 200) << retry->body;
  EXPECT_EQ(retry->get_header_value("X-Spillway-Request-Id"), id3) << "the same request, attempted again";
  const json again = get_json(s, "/v1/requests/" + id3);
  EXPECT_EQ(again["state"], "done");
  EXPECT_EQ(again["attempts"], 2);
  EXPECT_EQ(again["admission"]["kind"], json::parse(retry->body)["spillway"]["decision"]) << again.dump();
  EXPECT_EQ(again["admission"]["path"], "cpu");
  EXPECT_EQ(again["admission"]["failure"], nullptr);
}

// A prompt no path's context can hold: refused by admission with 400, and the
// record says so (no retry helps: no retry_after_s).
TEST(Server, JournalRecordsTheDecisionOfAPromptTooLong) {
  TempJournal tj;
  ServerConfig cfg;
  cfg.journal = tj.path;
  TestServer s(cfg);
  ASSERT_TRUE(s.ok());
  std::string p;
  for (int i = 0; i < 700; ++i) p += "Once upon a time ";
  auto r = post(s, "/v1/completions", {{"prompt", p}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 400) << r->body;
  const json rec = get_json(s, "/v1/requests/" + r->get_header_value("X-Spillway-Request-Id"));
  EXPECT_EQ(rec["state"], "failed");
  EXPECT_EQ(rec["resumable"], false);
  const json& adm = rec["admission"];
  ASSERT_TRUE(adm.is_object()) << rec.dump();
  EXPECT_EQ(adm["kind"], "reject");
  EXPECT_EQ(adm["failure"], "context_length_exceeded");
  EXPECT_EQ(adm["http_status"], 400);
  EXPECT_EQ(adm["retry_after_s"], nullptr);
  EXPECT_GT(adm["limits"]["prompt_tokens"].get<int>(), 700) << adm.dump();
  ASSERT_EQ(adm["verdicts"].size(), 1u);
  EXPECT_EQ(adm["verdicts"][0]["eligible"], false);
  EXPECT_NE(adm["verdicts"][0]["reason"].get<std::string>().find("does not fit its context"), std::string::npos)
      << adm.dump();
}

// `model` names the served id, an alias, or the fallback model (which keeps
// the request to the paths serving it); anything else is a 404.
TEST(Server, ModelIdsAliasesAndTheFallbackModel) {
  ServerConfig cfg;
  cfg.aliases = {"gpt-4o-mini", "org/tiny"};
  cfg.fallback_path = true;
  cfg.chat_template = ChatTemplateKind::kChatML;
  TestServer s(cfg);
  ASSERT_TRUE(s.ok());
  int status = 0;
  const json list = get_json(s, "/v1/models", &status);
  EXPECT_EQ(status, 200);
  ASSERT_EQ(list["data"].size(), 4u) << list.dump();
  EXPECT_EQ(list["data"][0]["id"], "stories260K");
  EXPECT_EQ(list["data"][0]["spillway"]["role"], "primary");
  EXPECT_EQ(list["data"][0]["spillway"]["paths"], json::array({"cpu"}));
  EXPECT_EQ(list["data"][1]["id"], "gpt-4o-mini");
  EXPECT_EQ(list["data"][1]["spillway"]["role"], "alias");
  EXPECT_EQ(list["data"][1]["spillway"]["alias_of"], "stories260K");
  EXPECT_EQ(list["data"][2]["id"], "org/tiny");
  EXPECT_EQ(list["data"][3]["id"], "stories260K-small");
  EXPECT_EQ(list["data"][3]["spillway"]["role"], "fallback");
  EXPECT_EQ(list["data"][3]["spillway"]["paths"], json::array({"small"}));
  for (const json& m : list["data"]) EXPECT_EQ(m["object"], "model");

  const json one = get_json(s, "/v1/models/gpt-4o-mini", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(one["id"], "gpt-4o-mini");
  EXPECT_EQ(one["spillway"]["role"], "alias");
  httplib::Client c = s.client();
  auto missing = c.Get("/v1/models/gpt-5");
  expect_error_shape(missing, 404, "model");
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "model_not_found");

  // The served id, an alias and no model at all run the served model on
  // its first-choice path; the response names the model that ran.
  for (const json& model : {json("stories260K"), json("gpt-4o-mini"), json("org/tiny"), json()}) {
    json body = kGreedy;
    body["max_tokens"] = 4;
    if (!model.is_null()) body["model"] = model;
    auto r = post(s, "/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["model"], "stories260K") << model;
    EXPECT_EQ(j["spillway"]["path"], "cpu") << model;
    EXPECT_EQ(j["spillway"]["fallback_model"], false) << model;
  }
  // The fallback model by its id: only its path is eligible.
  {
    json body = kGreedy;
    body["max_tokens"] = 4;
    body["model"] = "stories260K-small";
    auto r = post(s, "/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["model"], "stories260K-small");
    EXPECT_EQ(j["spillway"]["path"], "small");
    EXPECT_EQ(j["spillway"]["fallback_model"], true);
    EXPECT_NE(j["spillway"]["reason"].get<std::string>().find("serves model stories260K, not stories260K-small"),
              std::string::npos)
        << j["spillway"].dump();
    const json q = json::parse(post(s, "/v1/quote", body)->body);
    EXPECT_EQ(q["model"], "stories260K-small") << q.dump();
  }
  // Anything else: 404 naming what is served, for both endpoints and the
  // quote; nothing was queued.
  const uint64_t submitted = s.scheduler().stats().submitted;
  for (const char* route : {"/v1/completions", "/v1/chat/completions", "/v1/quote"}) {
    json body = {{"model", "gpt-5"}, {"max_tokens", 4}};
    if (std::string(route) == "/v1/chat/completions") body["messages"] = {{{"role", "user"}, {"content", "hi"}}};
    else body["prompt"] = "hi";
    auto r = post(s, route, body);
    expect_error_shape(r, 404, "model");
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["code"], "model_not_found") << route;
    const std::string msg = e["message"];
    EXPECT_NE(msg.find("'gpt-5'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpt-4o-mini (alias)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("stories260K-small (fallback)"), std::string::npos) << msg;
  }
  EXPECT_EQ(s.scheduler().stats().submitted, submitted);
}

TEST(Server, RequestsRouteWithoutJournalSaysSo) {
  TestServer s({});
  ASSERT_TRUE(s.ok());
  int status = 0;
  const json j = get_json(s, "/v1/requests/1", &status);
  EXPECT_EQ(status, 404);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("--journal"), std::string::npos);
}

}  // namespace
}  // namespace spw
