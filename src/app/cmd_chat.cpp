// `spillway chat [--url URL] [--api-key KEY] [--model M] [--max-tokens N]
// [--system TEXT]`: a terminal client for a running `spillway serve`.
//
// Each line typed is a user turn of one conversation, sent to
// /v1/chat/completions as a stream; the answer is printed as it arrives, and
// around it what Spillway says of the request: while it waits, its queue
// position and estimated delay (updated from the server's queued chunks);
// then the path and placement it runs on, the model (a fallback model is
// marked as such), the decision and, when degraded, its reason, and the
// limits applied (context, max tokens, clamped or not); at the end the
// finish reason, tokens and time, and a migration if one happened. Ctrl-C
// cancels the request in progress at once (DELETE /v1/requests/{id} from a
// watcher thread, whether it waits in a queue or runs; then the stream is
// dropped), never the program;
// at the prompt it says how to leave. `/quit` (or end of input) exits 0.
// The key comes from --api-key or $SPILLWAY_API_KEY. A server that cannot be
// reached or answers an error is reported and the prompt comes back.
// Lines starting "[" are Spillway's; everything else is the model's text.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.h"

namespace spw::app {
namespace {

using nlohmann::json;

struct ChatOptions {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;
  int max_tokens = 256;
  std::string system;
};

std::atomic<bool> g_generating{false};
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  if (g_generating.load()) {
    g_interrupted.store(true);
    return;
  }
  static const char kHint[] = "\n[Ctrl-C cancels a request while it runs; /quit exits]\n> ";
  (void)!write(STDOUT_FILENO, kHint, sizeof kHint - 1);
}

std::string fmt_ms(double ms) {
  char b[32];
  if (ms < 1000) {
    std::snprintf(b, sizeof b, "%.0f ms", ms);
  } else {
    std::snprintf(b, sizeof b, "%.1f s", ms / 1000);
  }
  return b;
}

// What the first chunk's spillway object says of where and how it runs.
std::string route_line(const json& s) {
  std::string out = "[path " + s.value("path", std::string("?")) + " (" + s.value("placement", std::string("?")) +
                    ") · model " + s.value("model", std::string("?"));
  if (s.value("fallback_model", false)) out += " (FALLBACK MODEL: not the one asked for)";
  out += " · " + s.value("decision", std::string("?"));
  if (s.contains("limits") && s["limits"].is_object()) {
    const json& l = s["limits"];
    out += " · limits: context " + std::to_string(l.value("n_ctx", 0)) + ", max tokens " +
           std::to_string(l.value("max_tokens", 0));
    if (l.value("max_tokens_clamped", false)) {
      out += " (clamped from " + std::to_string(l.value("max_tokens_requested", 0)) + ")";
    }
  }
  out += "]";
  if (s.value("degraded", false)) {
    out += "\n[degraded: " + s.value("reason", std::string("")) + "]";
  }
  return out;
}

class Chat {
 public:
  explicit Chat(ChatOptions o) : o_(std::move(o)), http_(o_.url) {
    http_.set_connection_timeout(5, 0);
    http_.set_read_timeout(600, 0);
    if (!o_.system.empty()) history_.push_back({{"role", "system"}, {"content", o_.system}});
  }

  // One user turn: streams the answer; false when the server could not be
  // reached at all (the caller keeps going either way).
  void turn(const std::string& line) {
    history_.push_back({{"role", "user"}, {"content", line}});
    json body = {{"messages", history_}, {"stream", true}, {"max_tokens", o_.max_tokens}};
    if (!o_.model.empty()) body["model"] = o_.model;

    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    if (!o_.api_key.empty()) req.set_header("Authorization", "Bearer " + o_.api_key);
    int status = 0;
    std::string error_body, buffer, answer;
    bool routed = false, waiting = false;
    std::string finish;
    json last_info;
    request_id_.store(0);
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      request_id_.store(std::strtoll(r.get_header_value("X-Spillway-Request-Id").c_str(), nullptr, 10));
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (g_interrupted.load()) return false;
      if (status != 200) {
        error_body.append(data, n);
        return error_body.size() < 65536;
      }
      buffer.append(data, n);
      size_t end;
      while ((end = buffer.find("\n\n")) != std::string::npos) {
        const std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") continue;
        const json ev = json::parse(payload, nullptr, false);
        if (!ev.is_object()) continue;
        if (ev.contains("error")) {
          if (waiting) std::printf("\n");
          std::printf("\n[error: %s]\n", ev["error"].value("message", std::string("?")).c_str());
          continue;
        }
        const json* info = ev.contains("spillway") && ev["spillway"].is_object() ? &ev["spillway"] : nullptr;
        if (info != nullptr && info->value("state", std::string()) == "queued") {
          const json& d = (*info)["estimated_delay_ms"];
          std::printf("\r[waiting in the queue: position %d, estimated delay %s]   ",
                      info->value("queue_position", 0), d.is_number() ? fmt_ms(d.get<double>()).c_str() : "unknown");
          waiting = true;
          std::fflush(stdout);
          continue;
        }
        if (info != nullptr && !routed) {
          if (waiting) std::printf("\n");
          std::printf("%s\n", route_line(*info).c_str());
          routed = true;
        }
        if (info != nullptr) last_info = *info;
        if (ev.contains("choices") && ev["choices"].is_array() && !ev["choices"].empty()) {
          const json& c = ev["choices"][0];
          if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()) {
            const std::string piece = c["delta"]["content"].get<std::string>();
            answer += piece;
            std::fwrite(piece.data(), 1, piece.size(), stdout);
          }
          if (c.contains("finish_reason") && c["finish_reason"].is_string()) finish = c["finish_reason"];
        }
        std::fflush(stdout);
      }
      return !g_interrupted.load();
    };

    g_interrupted.store(false);
    g_generating.store(true);
    // ^C cancels on the server at once, queued or running, without waiting
    // for the stream's next chunk.
    std::atomic<bool> over{false};
    std::string cancel_note;
    std::thread watcher([&] {
      while (!over.load()) {
        if (g_interrupted.load() && request_id_.load() != 0) {
          cancel_note = cancel();
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = http_.send(req, res, err);
    over.store(true);
    watcher.join();
    g_generating.store(false);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    if (g_interrupted.load()) {
      if (cancel_note.empty()) cancel_note = cancel();  // ^C before the headers came
      std::printf("\n[cancelling request %lld]\n%s\n", static_cast<long long>(request_id_.load()), cancel_note.c_str());
      std::fflush(stdout);
      history_.erase(history_.size() - 1);  // the turn did not happen
      return;
    }
    if (!sent && status == 0) {
      std::printf("[cannot reach %s: %s]\n", o_.url.c_str(), httplib::to_string(err).c_str());
      history_.erase(history_.size() - 1);
      return;
    }
    if (status != 200) {
      const json e = json::parse(error_body, nullptr, false);
      std::string msg = e.is_object() && e.contains("error") ? e["error"].value("message", error_body) : error_body;
      std::printf("[HTTP %d: %s]\n", status, msg.c_str());
      history_.erase(history_.size() - 1);
      return;
    }
    std::printf("\n[%s · %s", finish.empty() ? "ended" : ("finish: " + finish).c_str(), fmt_ms(ms).c_str());
    if (last_info.is_object() && last_info.value("migrations", 0) > 0) {
      std::printf(" · moved to path %s mid-answer (%s)", last_info.value("path", std::string("?")).c_str(),
                  last_info.value("reason", std::string("")).c_str());
    }
    std::printf("]\n");
    history_.push_back({{"role", "assistant"}, {"content", answer}});
  }

 private:
  // DELETE /v1/requests/{id}; what happened, as a line to print.
  std::string cancel() {
    const int64_t id = request_id_.load();
    if (id == 0) return "[cancelled before the server answered]";
    httplib::Client c(o_.url);
    c.set_connection_timeout(5, 0);
    c.set_read_timeout(10, 0);
    httplib::Headers h;
    if (!o_.api_key.empty()) h.emplace("Authorization", "Bearer " + o_.api_key);
    auto r = c.Delete(("/v1/requests/" + std::to_string(id)).c_str(), h);
    if (r && r->status == 200) {
      const json j = json::parse(r->body, nullptr, false);
      const bool running = j.is_object() && j.value("state", std::string()) == "running";
      return running ? "[cancelled while it ran]" : "[cancelled]";
    }
    if (r && r->status == 404) return "[cancelled: it is no longer in flight]";
    return "[cancel failed: " + (r ? "HTTP " + std::to_string(r->status) : httplib::to_string(r.error())) + "]";
  }

  ChatOptions o_;
  httplib::Client http_;
  json history_ = json::array();
  std::atomic<int64_t> request_id_{0};
};

// One line of input without its newline; nullopt at end of input. read(2)
// directly rather than through iostreams: a signal (^C) is then handled
// while the program waits at the prompt, also where a runtime defers
// signals to the next system call it sees (ThreadSanitizer does).
std::optional<std::string> read_line() {
  static std::string pending;
  for (;;) {
    const size_t nl = pending.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return line;
    }
    char buf[4096];
    const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (pending.empty()) return std::nullopt;
      std::string last;
      last.swap(pending);
      return last;
    }
    pending.append(buf, static_cast<size_t>(n));
  }
}

int run_chat(ChatOptions o) {
  if (o.api_key.empty()) {
    if (const char* k = std::getenv("SPILLWAY_API_KEY")) o.api_key = k;
  }
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART: a read at the prompt returns EINTR (read_line goes on),
  // which is also where ThreadSanitizer runs a deferred handler.
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
  std::printf("[spillway chat with %s · /quit exits · Ctrl-C cancels a request]\n", o.url.c_str());
  Chat chat(o);
  for (;;) {
    std::printf("> ");
    std::fflush(stdout);
    const std::optional<std::string> line = read_line();
    if (!line || *line == "/quit" || *line == "/exit") break;
    if (line->empty()) continue;
    chat.turn(*line);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

void add_chat(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* sub = app.add_subcommand("chat", "Chat with a running `spillway serve` in the terminal (Ctrl-C cancels a "
                                             "request, /quit exits)");
  sub->add_option("--url", o->url, "The server")->capture_default_str();
  sub->add_option("--api-key", o->api_key, "API key (default: $SPILLWAY_API_KEY)");
  sub->add_option("--model", o->model, "Model id to ask for (default: the server's)");
  sub->add_option("--max-tokens", o->max_tokens, "Most tokens per answer")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--system", o->system, "A system message opening the conversation");
  sub->callback([o, &exit_code] { exit_code = run_chat(*o); });
}

}  // namespace spw::app
