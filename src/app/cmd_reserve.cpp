// `spillway reserve --bytes SIZE [--name N] [--server URL] [--api-key K] [--ttl-s S] -- CMD ARGS...`:
// holds a co-tenant reservation on a running `spillway serve` for the
// lifetime of a child process, so that another service (transcription, image
// search) started under it is counted by admission from its first byte.
// It POSTs /v1/reservations, prints the reservation (and whether it left
// Spillway room) on stderr, runs CMD, renews the lease every ttl/3 while CMD
// runs, DELETEs the reservation when CMD exits and exits with CMD's status.
// SIGINT/SIGTERM are passed on to CMD. If the server cannot be reached or
// refuses, CMD is not started (exit 1): a service started without its
// reservation is exactly what this verb exists to prevent. If renewals fail
// while CMD runs (server restarted), a warning is printed and CMD keeps
// running; the lease then expires on its own. A server started with
// --api-key needs the key (--api-key, or $SPILLWAY_API_KEY as `spillway chat`
// reads it), sent as a bearer token on every call.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "backend/vulkan/device_spec.h"

namespace spw::app {
namespace {

struct ReserveOptions {
  std::string bytes;
  std::string name = "co-tenant";
  std::string server = "http://127.0.0.1:8080";
  std::string api_key;  // empty: $SPILLWAY_API_KEY, else none
  double ttl_s = 30;
  std::vector<std::string> command;
};

pid_t g_child = -1;

extern "C" void forward_signal(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// A client of the server with the bearer token set when there is a key.
httplib::Client server_client(const ReserveOptions& o, const std::string& key) {
  httplib::Client c(o.server);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  if (!key.empty()) c.set_bearer_token_auth(key);
  return c;
}

int run_reserve(const ReserveOptions& o) {
  std::string key = o.api_key;
  if (key.empty()) {
    if (const char* k = std::getenv("SPILLWAY_API_KEY")) key = k;
  }
  auto bytes = parse_memory_size(o.bytes);
  if (!bytes.ok()) {
    std::fprintf(stderr, "spillway reserve: --bytes %s: %s\n", o.bytes.c_str(), bytes.status().message().c_str());
    return 2;
  }
  if (o.command.empty()) {
    std::fprintf(stderr, "spillway reserve: no command given (spillway reserve --bytes 2GiB -- CMD ARGS...)\n");
    return 2;
  }
  httplib::Client http = server_client(o, key);
  const nlohmann::json req = {{"name", o.name}, {"bytes", *bytes}, {"ttl_s", o.ttl_s}};
  auto res = http.Post("/v1/reservations", req.dump(), "application/json");
  if (!res) {
    std::fprintf(stderr, "spillway reserve: cannot reach %s: %s; not starting the command\n", o.server.c_str(),
                 httplib::to_string(res.error()).c_str());
    return 1;
  }
  if (res->status != 201) {
    std::fprintf(stderr, "spillway reserve: %s refused the reservation (HTTP %d): %s%s\n", o.server.c_str(), res->status,
                 res->body.c_str(),
                 res->status != 401   ? ""
                 : key.empty()        ? "; the server wants an API key: --api-key or $SPILLWAY_API_KEY"
                                      : "; the API key given is not one of the server's");
    return 1;
  }
  const auto info = nlohmann::json::parse(res->body, nullptr, false);
  const uint64_t id = info.is_object() && info.contains("id") ? info["id"].get<uint64_t>() : 0;
  std::fprintf(stderr, "spillway reserve: reservation %llu for '%s' (%s) on %s: %s\n",
               static_cast<unsigned long long>(id), o.name.c_str(), o.bytes.c_str(),
               info.value("ledger", std::string("?")).c_str(),
               info.value("fits", true) ? "Spillway still has room" : "it leaves Spillway no room; new requests go elsewhere");

  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("spillway reserve: fork");
    (void)http.Delete("/v1/reservations/" + std::to_string(id));
    return 1;
  }
  if (pid == 0) {
    std::vector<char*> argv;
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "spillway reserve: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  g_child = pid;
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread heartbeat([&] {
    httplib::Client hb = server_client(o, key);
    const auto period = std::chrono::milliseconds(static_cast<int64_t>(o.ttl_s * 1000 / 3));
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, period, [&] { return done; })) {
      lk.unlock();
      auto r = hb.Post("/v1/reservations/" + std::to_string(id) + "/renew", "", "application/json");
      if (!r || r->status != 200) {
        std::fprintf(stderr, "spillway reserve: warning: renewing reservation %llu failed (%s)\n",
                     static_cast<unsigned long long>(id), r ? std::to_string(r->status).c_str() : "unreachable");
      }
      lk.lock();
    }
  });
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    done = true;
  }
  cv.notify_all();
  heartbeat.join();
  auto del = http.Delete("/v1/reservations/" + std::to_string(id));
  if (!del || del->status != 200) {
    std::fprintf(stderr, "spillway reserve: warning: releasing reservation %llu failed; it expires within %.0f s\n",
                 static_cast<unsigned long long>(id), o.ttl_s);
  } else {
    std::fprintf(stderr, "spillway reserve: reservation %llu released\n", static_cast<unsigned long long>(id));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

void add_reserve(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ReserveOptions>();
  CLI::App* sub = app.add_subcommand(
      "reserve", "Hold a memory reservation on a running `spillway serve` while a command runs (another service)");
  sub->add_option("--bytes", o->bytes, "Memory the command will use, e.g. 2GiB")->required();
  sub->add_option("--name", o->name, "Name shown in /v1/status")->capture_default_str();
  sub->add_option("--server", o->server, "The Spillway server")->capture_default_str();
  sub->add_option("--api-key", o->api_key, "API key of the server (default: $SPILLWAY_API_KEY)");
  sub->add_option("--ttl-s", o->ttl_s, "Lease length; renewed every ttl/3 while the command runs")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  sub->add_option("command", o->command, "The command to run under the reservation (after --)")->required();
  sub->callback([o, &exit_code] { exit_code = run_reserve(*o); });
}

}  // namespace spw::app
