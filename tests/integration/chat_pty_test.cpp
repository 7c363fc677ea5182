// `spillway chat` in a real pseudo-terminal (forkpty), against the real
// `spillway serve` binary on loopback: what a person at the terminal sees
// and does, not the client's functions.
//   - an answer is streamed with the path, placement, model, decision and
//     limits it ran under, then its finish line;
//   - while the server's one worker is busy, the next question shows its
//     queue position and estimated delay; Ctrl-C (the terminal's ^C, a
//     SIGINT from the line discipline) cancels that request on the server
//     and brings the prompt back, the program still running;
//   - ^C at the prompt only says how to leave; /quit exits 0.
// The server runs a generated model wide enough that a long prompt keeps its
// worker busy for a while (prefill time does not depend on when a random
// model samples its end of text).
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pty.h>
#include <sys/socket.h>
#include <termios.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/env.h"
#include "spillway_process.h"
#include "tools/modelgen/random_llama.h"

namespace spw {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// `spillway chat` on the slave side of a new pty; the test holds the master.
class Terminal {
 public:
  explicit Terminal(const std::vector<std::string>& args) {
    struct winsize ws {};
    ws.ws_row = 40;
    ws.ws_col = 200;
    pid_ = forkpty(&master_, nullptr, nullptr, &ws);
    if (pid_ == 0) {
      std::vector<std::string> a = {SPILLWAY_BINARY, "chat"};
      a.insert(a.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Terminal() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) close(master_);
  }
  bool started() const { return pid_ > 0 && master_ >= 0; }

  void type(const std::string& keys) { ASSERT_EQ(write(master_, keys.data(), keys.size()), static_cast<ssize_t>(keys.size())); }

  // Reads until `needle` appears in what was read since `from` (an offset
  // into everything read), or the deadline. The offset just past it.
  std::optional<size_t> expect(const std::string& needle, size_t from, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      const size_t at = seen_.find(needle, from);
      if (at != std::string::npos) return at + needle.size();
      if (Clock::now() >= deadline) return std::nullopt;
      pollfd p{master_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(master_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;  // the program exited (EIO on the master)
      seen_.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string& seen() const { return seen_; }
  size_t end() const { return seen_.size(); }

  bool alive() {
    int st = 0;
    return waitpid(pid_, &st, WNOHANG) == 0;
  }
  std::optional<int> wait_exit(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      // Keep draining so that the program never blocks on a full pty.
      (void)expect("\x01never\x01", seen_.size(), std::chrono::seconds(0));
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  int master_ = -1;
  bool reaped_ = false;
  std::string seen_;
};

std::string slow_model() {
  static const std::string path = [] {
    // ~14M parameters: slow enough per token that the two long requests
    // below hold the one worker for seconds even on this session's faster
    // CPU path (with 5M, the queue drained before ^C in a loaded full run).
    modelgen::RandomLlamaSpec s;
    s.n_embd = 384;
    s.n_layer = 8;
    s.n_head = 8;
    s.n_head_kv = 8;
    s.n_ff = 1024;
    s.n_ctx = 2048;
    s.vocab_path = testing::kStoriesModel;
    const std::string p =
        (std::filesystem::temp_directory_path() / ("spw-chat-pty-" + std::to_string(getpid()) + ".gguf")).string();
    const Status st = modelgen::write_random_llama(Env::default_env(), p, s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return p;
  }();
  return path;
}

// About 1,500 tokens; 400 under a sanitizer, which is slow enough as it is.
std::string long_prompt() {
#if defined(SPW_SANITIZE_THREAD) || defined(SPW_SANITIZE_ADDRESS)
  constexpr int kRepeats = 30;
#else
  constexpr int kRepeats = 110;
#endif
  std::string p = "Story: ";
  for (int i = 0; i < kRepeats; ++i) p += "the little dog ran to the park and ";
  return p;
}

// A completion sent over a plain socket and left in flight (the response is
// not read until the socket is closed): keeps the server's worker busy with
// no client thread in this process.
class PendingRequest {
 public:
  PendingRequest(int port, const std::string& body) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                            "Connection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    sent_ = write(fd_, req.data(), req.size()) == static_cast<ssize_t>(req.size());
  }
  ~PendingRequest() {
    if (fd_ >= 0) close(fd_);
  }
  bool sent() const { return sent_; }

 private:
  int fd_ = -1;
  bool sent_ = false;
};

constexpr const char* kAdmin = "chat-pty-admin-token";

// Arms (slow = true) a slow fault of factor 50 on the server's cpu path, or
// disarms every fault, through the admin API.
bool set_slow_cpu(int port, bool slow) {
  httplib::Client c("127.0.0.1", port);
  const httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kAdmin}};
  if (!slow) {
    auto r = c.Delete("/v1/admin/faults", auth);
    return r && r->status == 200;
  }
  auto r = c.Post("/v1/admin/faults", auth, R"({"kind":"slow","path":"cpu","factor":50,"count":0})",
                  "application/json");
  return r && r->status == 201;
}

json in_flight(const std::string& url) {
  httplib::Client c(url);
  auto r = c.Get("/v1/requests");
  return r && r->status == 200 ? json::parse(r->body)["data"] : json::array();
}

TEST(ChatInAPty, StreamsWithItsRouteShowsTheQueueAndCtrlCCancelsTheRequestNotTheProgram) {
  const std::string model = slow_model();
  testing::Server srv({"--model", model, "--parallel", "1", "--journal", "none", "--admin-token", kAdmin});
  ASSERT_GT(srv.port(), 0) << srv.ready_line();
  Terminal t({"--url", srv.url(), "--max-tokens", "8"});
  ASSERT_TRUE(t.started());
  auto at = t.expect("> ", 0, std::chrono::seconds(20));
  ASSERT_TRUE(at) << t.seen();

  // One question: the route line, then the answer, then the finish line.
  t.type("Once upon a time\n");
  auto route = t.expect("[path cpu (cpu) \xc2\xb7 model", *at, std::chrono::seconds(30));
  ASSERT_TRUE(route) << t.seen();
  auto limits = t.expect("limits: context 2048, max tokens 8]", *route, std::chrono::seconds(30));
  ASSERT_TRUE(limits) << t.seen();
  auto fin = t.expect("[finish: ", *limits, std::chrono::seconds(60));
  ASSERT_TRUE(fin) << t.seen();
  at = t.expect("> ", *fin, std::chrono::seconds(10));
  ASSERT_TRUE(at) << t.seen();

  // ^C at the prompt: a hint, nothing else.
  t.type("\x03");
  auto hint = t.expect("[Ctrl-C cancels a request while it runs; /quit exits]", *at, std::chrono::seconds(10));
  ASSERT_TRUE(hint) << t.seen();
  ASSERT_TRUE(t.alive());

  // Keep the one worker busy with two long prompts, then ask: the question
  // waits in the queue and the terminal says where and for how long. The cpu
  // path is slowed 50x (an armed slow fault, the admin API) until the
  // cancellation is checked, so the question stays queued behind them
  // however fast the machine (sizing the work to outlast typing and ^C was
  // undone by every faster CPU path). Closing the sockets at the end cancels
  // what is left.
  ASSERT_TRUE(set_slow_cpu(srv.port(), true));
  const json busy_body = {{"prompt", long_prompt()}, {"max_tokens", 400}};
  PendingRequest busy1(srv.port(), busy_body.dump()), busy2(srv.port(), busy_body.dump());
  ASSERT_TRUE(busy1.sent() && busy2.sent());
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (in_flight(srv.url()).size() < 2 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(in_flight(srv.url()).size(), 2u) << "the two long requests are in flight";
  t.type("Tell me a story\n");
  auto waiting = t.expect("[waiting in the queue: position ", *hint, std::chrono::seconds(30));
  ASSERT_TRUE(waiting) << t.seen();
  auto delay = t.expect("estimated delay ", *waiting, std::chrono::seconds(5));
  ASSERT_TRUE(delay) << t.seen();
  // Which request is the terminal's: the one queued behind the long ones.
  json mine;
  for (const json& r : in_flight(srv.url()))
    if (r["state"] == "queued") mine = r;
  ASSERT_TRUE(mine.is_object()) << in_flight(srv.url()).dump();

  // ^C: the request is cancelled on the server, the program goes on.
  t.type("\x03");
  auto cancelling = t.expect("[cancelling request " + std::to_string(mine["request_id"].get<int64_t>()) + "]",
                             *delay, std::chrono::seconds(20));
  ASSERT_TRUE(cancelling) << t.seen();
  // Queued when ^C came, normally; on a loaded machine the long requests may
  // have finished first and it runs: cancelled either way, and said so.
  auto cancelled = t.expect("[cancelled", *cancelling, std::chrono::seconds(20));
  ASSERT_TRUE(cancelled) << t.seen();
  const std::string said = t.seen().substr(*cancelled, t.seen().find(']', *cancelled) - *cancelled);
  EXPECT_TRUE(said.empty() || said == " while it ran") << t.seen();
  at = t.expect("> ", *cancelled, std::chrono::seconds(10));
  ASSERT_TRUE(at) << t.seen();
  ASSERT_TRUE(t.alive()) << "Ctrl-C cancels the request, not the program";
  // Gone from the server (at once from the queue; at its next token if it ran).
  auto listed = [&] {
    for (const json& r : in_flight(srv.url()))
      if (r["request_id"] == mine["request_id"]) return true;
    return false;
  };
  const auto gone_by = Clock::now() + std::chrono::seconds(20);
  while (listed() && Clock::now() < gone_by) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(listed()) << "it left the server";
  EXPECT_TRUE(set_slow_cpu(srv.port(), false));
  {
    httplib::Client c(srv.url());
    auto st = c.Get("/v1/status");
    ASSERT_TRUE(st && st->status == 200);
    EXPECT_GE(json::parse(st->body)["paths"][0]["requests"]["cancelled"].get<int>(), 1) << st->body;
  }

  t.type("/quit\n");
  EXPECT_EQ(t.wait_exit(std::chrono::seconds(20)), std::optional<int>(0)) << t.seen();
  std::filesystem::remove(model);
}

}  // namespace
}  // namespace spw
