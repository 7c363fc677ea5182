// Integration: the `spillway serve` binary itself. Starts it on 127.0.0.1 with
// --port 0, reads the "listening on" line from its stdout, talks HTTP to it,
// and stops it with SIGTERM/SIGINT (graceful: exit 0, in-flight work ends).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backend/vulkan/vulkan_backend.h"
#include "spillway_process.h"

namespace {

using nlohmann::json;

const std::string kStories = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";

// Runs a command to its end; its stdout and stderr, and its exit status.
// Bounded: a command that should have refused to start but serves instead is
// killed after 60 s (coreutils' timeout -s KILL: status 137) rather than hanging the
// suite until ctest's timeout.
std::pair<int, std::string> run_to_end(const std::string& cmd) {
  FILE* f = popen(("timeout -s KILL 60 " + cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, out};
}

// Vulkan placements need a device (lavapipe in CI); the reason otherwise.
std::optional<std::string> no_vulkan() {
  auto d = spw::list_vulkan_devices();
  if (!d.ok()) return d.status().to_string();
  if (d->empty()) return std::string("no Vulkan device");
  return std::nullopt;
}

using ServeProcess = spw::testing::Server;


TEST(ServeCli, PrintsReadyLineServesAndStopsOnSigterm) {
  ServeProcess p({"--queue", "4"});
  ASSERT_GT(p.port(), 0) << "ready line: " << p.ready_line();
  EXPECT_NE(p.ready_line().find("model=stories260K"), std::string::npos) << p.ready_line();
  httplib::Client c("127.0.0.1", p.port());
  c.set_read_timeout(30, 0);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["queue"]["capacity"], 4);
  auto r = c.Post("/v1/completions", R"({"prompt":"Once upon a time","temperature":0,"max_tokens":40})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(json::parse(r->body)["choices"][0]["text"].get<std::string>().find("Lily"), std::string::npos);
  auto st = c.Get("/v1/status");
  ASSERT_TRUE(st);
  EXPECT_EQ(json::parse(st->body)["overflow"], "planned") << "Spillway's own mode unless a drill baseline asks";
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 0);
}

// The drill's baselines are a flag away, and a wrong name is refused at start.
TEST(ServeCli, OverflowBaselinesShowInStatusAndABadNameFailsAtStart) {
  ServeProcess naive({"--overflow", "naive"});
  ASSERT_GT(naive.port(), 0) << naive.ready_line();
  httplib::Client c("127.0.0.1", naive.port());
  c.set_read_timeout(30, 0);
  auto st = c.Get("/v1/status");
  ASSERT_TRUE(st);
  EXPECT_EQ(json::parse(st->body)["overflow"], "naive");
  ServeProcess bad({"--overflow", "yolo"});
  EXPECT_EQ(bad.port(), 0);
  EXPECT_NE(bad.wait_exit(std::chrono::seconds(20)), 0);
}

// The bundled model has no chat template: the server still answers an
// OpenAI chat client out of the box, with the documented default (ChatML),
// and says so in the ready line and in every chat response; --chat-template
// picks another, not marked default.
TEST(ServeCli, AModelWithoutAChatTemplateServesChatWithTheDefaultNamed) {
  ServeProcess p({});
  ASSERT_GT(p.port(), 0) << "ready line: " << p.ready_line();
  EXPECT_NE(p.ready_line().find("chat_template=chatml(default)"), std::string::npos) << p.ready_line();
  httplib::Client c("127.0.0.1", p.port());
  c.set_read_timeout(30, 0);
  auto r = c.Post("/v1/chat/completions",
                  R"({"model":"stories260K","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":8})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Spillway-Chat-Template"), "chatml; default");
  const json body = json::parse(r->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(body["usage"]["completion_tokens"].get<int>(), 0);

  ServeProcess z({"--chat-template", "zephyr"});
  ASSERT_GT(z.port(), 0) << z.ready_line();
  EXPECT_NE(z.ready_line().find("chat_template=zephyr "), std::string::npos) << z.ready_line();
  httplib::Client cz("127.0.0.1", z.port());
  cz.set_read_timeout(30, 0);
  r = cz.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4})",
              "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Spillway-Chat-Template"), "zephyr");
}

TEST(ServeCli, SigintLetsAnInFlightStreamFinish) {
  // A grace far longer than the stream needs even in a sanitizer build, so the
  // stream finishes by itself rather than racing the grace timer.
  ServeProcess p({"--grace", "300"});
  ASSERT_GT(p.port(), 0) << "ready line: " << p.ready_line();
  httplib::Client c("127.0.0.1", p.port());
  c.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt":"Once upon a time","seed":3,"max_tokens":400,"stream":true})";
  req.set_header("Content-Type", "application/json");
  std::string body;
  bool signalled = false;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    body.append(d, n);
    if (!signalled && body.find("\"text\":\" ") != std::string::npos) {  // generation has begun
      signalled = true;
      p.signal(SIGINT);
    }
    return true;
  };
  auto r = c.send(req);
  ASSERT_TRUE(r);
  EXPECT_TRUE(signalled);
  EXPECT_NE(body.find("\"finish_reason\":\""), std::string::npos) << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_TRUE(body.ends_with("data: [DONE]\n\n"));
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(30)), 0);
}

// The plan is checked against the host budget before the model is loaded: a
// budget below the estimate refuses to start, naming what the plan needs and
// which limit bound; a budget above it starts and says what was reserved.
TEST(ServeCli, PlanAboveTheHostBudgetRefusesToStart) {
  const auto [status, out] = run_to_end(std::string(SPILLWAY_BINARY) + " serve --model " + kStories +
                                        " --port 0 --threads 1 --ctx 2048 --host-budget 2MiB");
  EXPECT_EQ(status, 1) << out;
  // The only path (cpu) does not fit, so no path is built; the message names
  // the plan's host figure and what to lower.
  EXPECT_NE(out.find("no execution path fits: cpu: its plan needs"), std::string::npos) << out;
  EXPECT_NE(out.find("of host memory"), std::string::npos) << out;
  EXPECT_NE(out.find("Lower --cpu-ctx"), std::string::npos) << out;
  EXPECT_NE(out.find("bound by cap"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << out;

  ServeProcess ok({"--ctx", "2048", "--host-budget", "64MiB"});
  ASSERT_NE(ok.port(), 0) << "a plan inside the budget starts";
  // /health shows the ledger: the plan reserved inside the cap, and the RSS.
  httplib::Client c("127.0.0.1", ok.port());
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  ASSERT_EQ(h->status, 200);
  const json m = json::parse(h->body)["host_memory"];
  ASSERT_TRUE(m.is_object()) << h->body;
  EXPECT_EQ(m["bound_by"], "cap") << h->body;
  EXPECT_EQ(m["budget_bytes"].get<uint64_t>(), 64u << 20) << h->body;
  EXPECT_GT(m["reserved_bytes"].get<uint64_t>(), 3u << 20) << h->body;  // weights + a 2.5 MiB KV pool
  EXPECT_EQ(m["available_bytes"].get<uint64_t>(),
            m["budget_bytes"].get<uint64_t>() - m["reserved_bytes"].get<uint64_t>()) << h->body;
  EXPECT_GT(m["rss_bytes"].get<uint64_t>(), m["rss_file_bytes"].get<uint64_t>()) << h->body;
  ok.signal(SIGTERM);
  EXPECT_EQ(ok.wait_exit(std::chrono::seconds(20)), 0);
}

// --device vulkan: the same greedy text as the CPU server, every response
// saying where it ran, and /health's device_memory showing the device ledger
// (capacity, headroom, the declared co-tenant, the plan) and the allocator.
TEST(ServeCli, VulkanPlacementAnswersAsTheCpuDoesAndShowsDeviceMemory) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  const std::string body = R"({"prompt":"Once upon a time","temperature":0,"max_tokens":24})";
  std::string cpu_text;
  {
    ServeProcess cpu({"--ctx", "256"});
    ASSERT_GT(cpu.port(), 0) << cpu.ready_line();
    httplib::Client c("127.0.0.1", cpu.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    cpu_text = json::parse(r->body)["choices"][0]["text"];
    EXPECT_EQ(json::parse(r->body)["spillway"]["placement"], "cpu");
    EXPECT_FALSE(json::parse(c.Get("/health")->body).contains("device_memory"));
    cpu.signal(SIGTERM);
    EXPECT_EQ(cpu.wait_exit(std::chrono::seconds(20)), 0);
  }
  for (const std::string device : {"vulkan", "hybrid:2"}) {
    SCOPED_TRACE(device);
    ServeProcess p({"--ctx", "256", "--parallel", "2", "--device", device, "--device-memory", "64MiB",
                    "--device-headroom", "4MiB", "--co-tenant", "whisper=16MiB"});
    ASSERT_GT(p.port(), 0) << p.ready_line();
    const std::string short_name = device == "vulkan" ? "vulkan" : "hybrid:2";
    EXPECT_NE(p.ready_line().find("placement=" + short_name), std::string::npos) << p.ready_line();
    httplib::Client c("127.0.0.1", p.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["text"], cpu_text);
    EXPECT_EQ(j["spillway"]["placement"], short_name);
    EXPECT_EQ(r->get_header_value("X-Spillway-Placement"), short_name);
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    const json health = json::parse(h->body);
    EXPECT_EQ(health["backend"], short_name);
    const json d = health["device_memory"];
    ASSERT_TRUE(d.is_object()) << h->body;
    EXPECT_EQ(d["healthy"], true);
    EXPECT_EQ(d["capacity_bytes"].get<uint64_t>(), 64u << 20);
    // 4 MiB + 5% of 64 MiB
    EXPECT_EQ(d["headroom_bytes"].get<uint64_t>(), (4u << 20) + 3355444u) << h->body;
    EXPECT_EQ(d["co_tenant_reserved_bytes"].get<uint64_t>(), 16u << 20);
    const uint64_t reserved = d["reserved_bytes"].get<uint64_t>();
    EXPECT_GE(reserved, d["allocated_bytes"].get<uint64_t>()) << "the plan covers what the allocator holds";
    EXPECT_GT(d["allocated_by_category"]["weights"].get<uint64_t>(), 0u);
    EXPECT_GT(d["allocated_by_category"]["kv"].get<uint64_t>(), 0u);
    // lavapipe has no VK_EXT_memory_budget: nothing observed, and it says so.
    if (d["observed_heap_used_bytes"].is_null()) {
      EXPECT_NE(d["observed_unknown"].get<std::string>().find("VK_EXT_memory_budget"), std::string::npos);
      EXPECT_EQ(d["available_bytes"].get<uint64_t>(),
                (64u << 20) - d["headroom_bytes"].get<uint64_t>() - reserved - (16u << 20)) << h->body;
    }
    p.signal(SIGTERM);
    EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 0);
  }
}

// A GPU plan over the device ledger's limit refuses to start before the model
// is loaded, naming the plan and the ledger's figures; so does a co-tenant
// reservation that takes the room the plan needed.
TEST(ServeCli, PlanAboveTheDeviceLedgerRefusesToStart) {
  if (auto why = no_vulkan()) GTEST_SKIP() << *why;
  const std::string base = std::string(SPILLWAY_BINARY) + " serve --model " + kStories + " --port 0 --threads 1 ";
  {
    // Without the CPU fallback the GPU path is the only one: when not even
    // the weights, scratch and two KV blocks fit, nothing can serve and the
    // server refuses to start, naming the figures. (With the fallback it
    // starts on the CPU path and says why the GPU path was not built; a
    // budget that fits fewer KV blocks than parallel x ctx builds a smaller
    // pool: tests/npm covers both.)
    const auto [status, out] =
        run_to_end(base + "--device vulkan --ctx 2048 --parallel 2 --device-memory 2MiB --no-cpu-fallback");
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("no execution path fits: gpu: weights and scratch need"), std::string::npos) << out;
    EXPECT_NE(out.find("per KV block"), std::string::npos) << out;
    EXPECT_EQ(out.find("listening"), std::string::npos) << out;
  }
  {
    const auto [status, out] =
        run_to_end(base + "--device vulkan --ctx 256 --device-memory 64MiB --co-tenant sd=60MiB --no-cpu-fallback");
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("no execution path fits: gpu:"), std::string::npos) << out;
    EXPECT_NE(out.find("co-tenants"), std::string::npos) << out;
  }
  // lavapipe's (and an integrated GPU's) device memory is host memory: the
  // GPU's share of the plan counts against the host budget too. The budget
  // sits halfway between what the CPU plan and the GPU plan need of the host,
  // as this binary reports them (each refused under a 1 MiB budget): both
  // include the process's own RSS before loading, which differs between a
  // release and a sanitizer build by more than the gap between the plans.
  const auto devices = spw::list_vulkan_devices();
  if (devices.ok() && (devices->front().type == "cpu" || devices->front().type == "integrated-gpu")) {
    auto needs = [&](const std::string& flags) -> uint64_t {
      const auto [status, out] = run_to_end(base + flags + " --ctx 2048 --parallel 2 --host-budget 1MiB");
      std::smatch m;
      if (status != 1 || !std::regex_search(out, m, std::regex(R"(cannot reserve [^(]*\((\d+) B\))"))) {
        ADD_FAILURE() << "expected a refusal naming the bytes: " << out;
        return 0;
      }
      return std::stoull(m[1]);
    };
    const uint64_t cpu_need = needs("--device cpu");
    const uint64_t gpu_need = needs("--device vulkan --no-cpu-fallback");
    ASSERT_GT(gpu_need, cpu_need + (4u << 20)) << "the GPU plan holds its device memory on the host too";
    const std::string budget = std::to_string((cpu_need + gpu_need) / 2);
    const auto [status, out] =
        run_to_end(base + "--device vulkan --ctx 2048 --parallel 2 --host-budget " + budget + " --no-cpu-fallback");
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("host side of the GPU plan"), std::string::npos) << out;
    ServeProcess cpu({"--ctx", "2048", "--parallel", "2", "--host-budget", budget});
    EXPECT_GT(cpu.port(), 0) << "the same plan on the CPU fits";
    cpu.signal(SIGTERM);
    EXPECT_EQ(cpu.wait_exit(std::chrono::seconds(20)), 0);
  }
  {
    const auto [status, out] = run_to_end(base + "--device vulkan --co-tenant whisper");
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("NAME=SIZE"), std::string::npos) << out;
  }
  {
    const auto [status, out] = run_to_end(base + "--device tpu");
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("--device"), std::string::npos) << out;
  }
}

// Invariant 1 across a crash: a request accepted by a server that is then
// killed (SIGKILL, mid-stream) is, after a restart on the same journal, a
// terminal "failed, resumable" record; the client's retry with the same
// Idempotency-Key runs it to the end under the same id.
TEST(ServeCli, RequestInterruptedByACrashIsReadableAfterRestartAndRetryable) {
  const std::string journal = (std::filesystem::temp_directory_path() /
                               ("spw-crash-" + std::to_string(getpid()) + ".sqlite")).string();
  ServeProcess::remove_journal(journal);
  const std::string body = R"({"prompt":"Once upon a time","seed":7,"max_tokens":400,"stream":true})";
  int64_t id = 0;
  {
    ServeProcess p({"--journal", journal});
    ASSERT_GT(p.port(), 0) << p.ready_line();
    httplib::Client c("127.0.0.1", p.port());
    c.set_read_timeout(30, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.set_header("Idempotency-Key", "crash-1");
    std::string got;
    bool killed = false;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      got.append(d, n);
      if (!killed && got.find("\"text\":\" ") != std::string::npos) {  // generating
        killed = true;
        p.signal(SIGKILL);
        return false;
      }
      return true;
    };
    (void)c.send(req);
    ASSERT_TRUE(killed) << got;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(got, m, std::regex("\"request_id\":([0-9]+)"))) << got;
    id = std::stoll(m[1]);
    EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 128 + SIGKILL);
  }
  ServeProcess q({"--journal", journal});
  ASSERT_GT(q.port(), 0) << q.ready_line();
  httplib::Client c("127.0.0.1", q.port());
  c.set_read_timeout(60, 0);
  auto r = c.Get(("/v1/requests/" + std::to_string(id)).c_str());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json rec = json::parse(r->body);
  EXPECT_EQ(rec["state"], "failed") << r->body;
  EXPECT_EQ(rec["terminal"], true);
  EXPECT_EQ(rec["resumable"], true);
  EXPECT_EQ(rec["error"]["code"], "interrupted");
  // The retry: same key, same body; runs again and finishes.
  auto again = c.Post("/v1/completions", httplib::Headers{{"Idempotency-Key", "crash-1"}}, body, "application/json");
  ASSERT_TRUE(again);
  ASSERT_EQ(again->status, 200);
  EXPECT_TRUE(again->body.ends_with("data: [DONE]\n\n"));
  EXPECT_EQ(again->get_header_value("X-Spillway-Request-Id"), std::to_string(id));
  rec = json::parse(c.Get(("/v1/requests/" + std::to_string(id)).c_str())->body);
  EXPECT_EQ(rec["state"], "done");
  EXPECT_EQ(rec["attempts"], 2);
  EXPECT_FALSE(rec["text"].get<std::string>().empty());
  // A second server on the same journal while this one runs is refused.
  const auto [status, out] = run_to_end(std::string(SPILLWAY_BINARY) + " serve --model " + kStories +
                                        " --port 0 --threads 1 --journal " + journal);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("in use by another Spillway process"), std::string::npos) << out;
  q.signal(SIGTERM);
  EXPECT_EQ(q.wait_exit(std::chrono::seconds(20)), 0);
  ServeProcess::remove_journal(journal);
}

TEST(ServeCli, BadChatTemplateNameFailsAtStart) {
  ServeProcess p({"--chat-template", "nonsense"});
  EXPECT_EQ(p.port(), 0);
  EXPECT_EQ(p.wait_exit(std::chrono::seconds(20)), 1);
}

}  // namespace
