// Live drill: see live.h for the contract. Layout of this file: process
// helpers, the drill's shared context (clock, recorder, server control),
// one HTTP exchange (a completion, a resume, a replay) parsed into what the
// client saw, a client's request with its continuations, the sampler, the
// competing workload, the nemesis, and run_live() tying them together.
// Every exception of nlohmann or httplib is caught here: none leaves
// run_live.
#include "drill/live.h"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/placement.h"
#include "core/size.h"

namespace spw::drill {

std::string prompt_key(const std::string& cls, bool greedy, uint64_t seed) {
  return greedy ? cls + "/greedy" : cls + "/seed=" + std::to_string(seed);
}

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- helpers

json parse_json(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? json() : j;
}
std::string jstr(const json& j, const char* k) {
  if (!j.is_object()) return "";
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
int64_t jint(const json& j, const char* k, int64_t dflt = 0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : dflt;
}
uint64_t juint(const json& j, const char* k) {
  const int64_t v = jint(j, k, 0);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}
double jdbl(const json& j, const char* k, double dflt = 0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : dflt;
}
bool jbool(const json& j, const char* k) {
  if (!j.is_object()) return false;
  auto it = j.find(k);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// Starts argv[0] with stdin from /dev/null and stdout/stderr appended to the
// given files; every other descriptor is closed in the child (our client
// sockets must not outlive their connection in a co-tenant). -1 on failure.
pid_t spawn(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const long max_fd = std::min<long>(sysconf(_SC_OPEN_MAX), 4096);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: async-signal-safe calls only until exec.
  const int in = open("/dev/null", O_RDONLY);
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (in < 0 || out < 0 || err < 0) _exit(126);
  dup2(in, 0);
  dup2(out, 1);
  dup2(err, 2);
  for (long fd = 3; fd < max_fd; ++fd) close(static_cast<int>(fd));
  setpgid(0, 0);  // our signals only: a ^C at the terminal reaches the drill, which stops its children itself
  execv(argv[0], argv.data());
  _exit(127);
}

// Exit status (as a shell reports it) within `timeout`, or nullopt.
std::optional<int> wait_exit(pid_t pid, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (r < 0) return -1;  // not our child any more
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// SIGTERM (or `sig`), then SIGKILL after `grace_s`; reaped either way.
void stop_process(pid_t pid, int sig, double grace_s) {
  if (pid <= 0) return;
  kill(pid, sig);
  if (sig != SIGKILL && wait_exit(pid, grace_s)) return;
  kill(pid, SIGKILL);
  (void)wait_exit(pid, 10);
}

uint64_t vm_rss(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      try {
        return std::stoull(line.substr(6)) * 1024;  // kB
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  std::string s;
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    s += hex[v >> 4];
    s += hex[v & 15];
  }
  return s;
}

// The server's --device (a Placement spec: "vulkan", "vulkan:1",
// "hybrid:N[:i]") -> the Vulkan device `spillway occupy` takes: the same
// selector, or the first device.
std::string occupy_device(const std::string& device) {
  const Result<Placement> p = Placement::parse(device);
  if (!p.ok() || p->vulkan_device.empty()) return "vulkan";
  return "vulkan:" + p->vulkan_device;
}

const char* mode_name(const std::string& overflow) {
  if (overflow == "none") return "no_failover";
  if (overflow == "naive") return "naive_free_memory";
  return "live";
}

// ---------------------------------------------------------------- context

// What one HTTP exchange gave the client.
struct Exchange {
  int http_status = 0;
  bool connect_failed = false;   // nothing reached the server
  bool cut = false;              // sent, but no complete answer (connection broke, timeout, abort)
  std::string transport;         // httplib's error name when cut or not connected
  bool finished = false;         // a complete answer: a body, or a stream that reached [DONE]
  bool error_event = false;      // an error body or stream event
  std::string error_code, error_message;
  bool resumable = false;        // the error named a request to resume
  int64_t request_id = 0;
  std::string path, placement, model, decision, reason;
  bool degraded = false, degraded_shown = false, replayed = false;
  bool queued = false;           // the last thing heard: waiting in a queue
  int32_t queue_position = 0;
  std::string text;
  std::string finish_reason;
  int32_t completion_tokens = 0;
  double ttft_ms = -1, queue_ms = -1;
  int32_t migrations = 0, failovers = 0;
};

// A streamed request in flight, as the nemesis sees it (cancel_queued,
// device_lost pick theirs from here).
struct InFlight {
  int64_t request_id = 0;
  std::string path;
  bool queued = false;
  bool generating = false;  // text arrived
};

struct Armed {
  int64_t id = 0;
  std::string kind, path;
  int64_t count = 1;
  bool reported = false;
};

class Drill {
 public:
  Drill(const Scenario& sc, const LiveOptions& o) : sc_(sc), o_(o), t0_(Clock::now()) {}
  ~Drill() {
    abort_.store(true);
    join_workers();
  }

  const Scenario& sc_;
  const LiveOptions& o_;
  const Clock::time_point t0_;
  std::string host_ = "127.0.0.1";
  std::atomic<int> port_{0};
  std::string admin_token_;
  bool own_server_ = false;
  std::atomic<pid_t> server_pid_{-1};
  std::vector<std::string> server_args_;  // without --port
  int server_starts_ = 0;
  std::atomic<bool> server_down_{false};  // we killed it and it is not back yet
  std::atomic<bool> abort_{false};        // past the hard deadline: clients give up
  std::atomic<bool> stop_sampler_{false};
  std::atomic<uint64_t> competing_{0};
  std::string first_path_ = "gpu", cpu_path_;
  std::set<std::string> gpu_side_;        // paths on a device (vulkan/hybrid placements)
  std::map<std::string, json> path_info_; // name -> status entry at start

  double now_ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(); }
  std::string url() const { return "http://" + host_ + ":" + std::to_string(port_.load()); }
  void log(const std::string& line) const {
    if (o_.log) o_.log(line);
  }

  // The recorder, behind our own lock so that an interim copy (--step) is
  // consistent.
  Op invoke(Op op) {
    std::lock_guard<std::mutex> lk(rec_mu_);
    return rec_.invoke(std::move(op));
  }
  void complete(const Op& inv, Op res) {
    std::lock_guard<std::mutex> lk(rec_mu_);
    rec_.complete(inv, std::move(res));
  }
  void event(const std::string& kind, const std::string& detail) {
    {
      std::lock_guard<std::mutex> lk(rec_mu_);
      rec_.add_event(Event{now_ms(), kind, detail});
    }
    log("[" + std::to_string(static_cast<int64_t>(now_ms())) + " ms] " + kind + ": " + detail);
  }
  void sample(Sample s) {
    std::lock_guard<std::mutex> lk(rec_mu_);
    rec_.add_sample(std::move(s));
  }
  History snapshot() {
    std::lock_guard<std::mutex> lk(rec_mu_);
    return rec_.unsafe_history();
  }
  History take() {
    std::lock_guard<std::mutex> lk(rec_mu_);
    return rec_.take();
  }
  History& unsafe_history() { return rec_.unsafe_history(); }

  void saw_request(int64_t id) {
    if (id <= 0) return;
    std::lock_guard<std::mutex> lk(ids_mu_);
    ids_.insert(id);
  }
  std::vector<int64_t> request_ids() {
    std::lock_guard<std::mutex> lk(ids_mu_);
    return {ids_.begin(), ids_.end()};
  }
  void mark_cancelled(int64_t id) {
    std::lock_guard<std::mutex> lk(ids_mu_);
    cancelled_.insert(id);
  }
  bool was_cancelled(int64_t id) {
    std::lock_guard<std::mutex> lk(ids_mu_);
    return cancelled_.count(id) > 0;
  }
  void unmark_cancelled(int64_t id) {
    std::lock_guard<std::mutex> lk(ids_mu_);
    cancelled_.erase(id);
  }

  // In-flight streams by a local key.
  int64_t track(const InFlight& f) {
    std::lock_guard<std::mutex> lk(fl_mu_);
    const int64_t k = ++fl_next_;
    inflight_[k] = f;
    return k;
  }
  void update(int64_t k, const InFlight& f) {
    std::lock_guard<std::mutex> lk(fl_mu_);
    inflight_[k] = f;
  }
  void untrack(int64_t k) {
    std::lock_guard<std::mutex> lk(fl_mu_);
    inflight_.erase(k);
  }
  std::vector<InFlight> inflight() {
    std::lock_guard<std::mutex> lk(fl_mu_);
    std::vector<InFlight> v;
    for (auto& [k, f] : inflight_) v.push_back(f);
    return v;
  }

  void armed(Armed a) {
    std::lock_guard<std::mutex> lk(armed_mu_);
    armed_.push_back(std::move(a));
  }
  std::vector<Armed>& armed_unlocked() { return armed_; }
  std::mutex armed_mu_;

  // Threads that run requests (clients, the nemesis's own streams).
  void spawn_worker(std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(th_mu_);
    ++active_;
    workers_.emplace_back([this, fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& e) {
        event("drill_error", std::string("client thread: ") + e.what());
      }
      --active_;
    });
  }
  int active() const { return active_.load(); }
  void join_workers() {
    std::vector<std::thread> ws;
    {
      std::lock_guard<std::mutex> lk(th_mu_);
      ws.swap(workers_);
    }
    for (auto& t : ws) t.join();
  }
  std::atomic<int> next_client_{1};

 private:
  std::mutex rec_mu_;
  HistoryRecorder rec_;
  std::mutex ids_mu_;
  std::set<int64_t> ids_, cancelled_;
  std::mutex fl_mu_;
  int64_t fl_next_ = 0;
  std::map<int64_t, InFlight> inflight_;
  std::vector<Armed> armed_;
  std::mutex th_mu_;
  std::vector<std::thread> workers_;
  std::atomic<int> active_{0};
};

std::unique_ptr<httplib::Client> client(const Drill& d, int read_timeout_s) {
  auto c = std::make_unique<httplib::Client>(d.host_, d.port_.load());
  c->set_connection_timeout(2, 0);
  c->set_read_timeout(read_timeout_s, 0);
  c->set_write_timeout(5, 0);
  return c;
}

// GET path -> (status, body); status 0: no answer.
std::pair<int, std::string> get(const Drill& d, const std::string& path, int timeout_s = 2,
                                const httplib::Headers& h = {}) {
  try {
    auto c = client(d, timeout_s);
    auto r = c->Get(path.c_str(), h);
    if (!r) return {0, httplib::to_string(r.error())};
    return {r->status, r->body};
  } catch (const std::exception& e) {
    return {0, e.what()};
  }
}

bool wait_ready(Drill& d, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (!d.server_down_.load() && get(d, "/health/ready", 1).first == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

// ---------------------------------------------------------------- server

std::string resolve_model(const Scenario& sc, const LiveOptions& o) {
  const fs::path m(sc.server.model);
  if (m.is_absolute() || fs::exists(m)) return m.string();
  for (const auto& dir : o.search_dirs) {
    const fs::path p = fs::path(dir) / m;
    if (fs::exists(p)) return p.string();
  }
  return m.string();  // serve names it when missing
}

// Starts the server (port 0 the first time, then the same port) and waits
// for its ready line and /health/ready.
Status start_server(Drill& d) {
  const int n = ++d.server_starts_;
  const std::string out = (fs::path(d.o_.work_dir) / ("serve-" + std::to_string(n) + ".out")).string();
  const std::string err = (fs::path(d.o_.work_dir) / ("serve-" + std::to_string(n) + ".log")).string();
  std::vector<std::string> args = d.server_args_;
  args.insert(args.begin() + 2, {"--port", std::to_string(d.port_.load())});
  const pid_t pid = spawn(args, out, err);
  if (pid < 0) return Status::internal("fork failed starting the server");
  d.server_pid_.store(pid);
  const auto deadline = Clock::now() + std::chrono::duration<double>(d.o_.ready_timeout_s);
  int port = 0;
  while (Clock::now() < deadline) {
    if (auto code = wait_exit(pid, 0)) {
      d.server_pid_.store(-1);
      return Status::unavailable("spillway serve exited with status " + std::to_string(*code) +
                                 " before it was ready; its log (" + err + ") ends: " + tail(read_file(err), 1500));
    }
    const std::string text = read_file(out);
    const std::string mark = "listening on http://127.0.0.1:";
    const size_t at = text.find(mark);
    if (at != std::string::npos) {
      port = std::atoi(text.c_str() + at + mark.size());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port <= 0) {
    stop_process(pid, SIGKILL, 0);
    d.server_pid_.store(-1);
    return Status::deadline_exceeded("spillway serve printed no ready line within " +
                                     std::to_string(static_cast<int>(d.o_.ready_timeout_s)) + " s; its log (" + err +
                                     ") ends: " + tail(read_file(err), 1500));
  }
  d.port_.store(port);
  const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  d.server_down_.store(false);
  if (!wait_ready(d, std::max(1.0, left))) {
    return Status::deadline_exceeded("spillway serve on port " + std::to_string(port) +
                                     " did not answer /health/ready 200 in time; log: " + err);
  }
  return Status();
}

// ---------------------------------------------------------------- exchange

void take_spillway(const json& sp, Exchange& x) {
  if (!sp.is_object()) return;
  if (jstr(sp, "state") == "queued") {
    x.queued = true;
    if (!jstr(sp, "path").empty()) x.path = jstr(sp, "path");
    x.queue_position = static_cast<int32_t>(jint(sp, "queue_position"));
    return;
  }
  if (const int64_t id = jint(sp, "request_id"); id > 0) x.request_id = id;
  if (sp.contains("path") && sp["path"].is_string()) x.path = sp["path"].get<std::string>();
  if (!jstr(sp, "placement").empty()) x.placement = jstr(sp, "placement");
  if (!jstr(sp, "model").empty()) x.model = jstr(sp, "model");
  if (!jstr(sp, "decision").empty()) x.decision = jstr(sp, "decision");
  if (!jstr(sp, "reason").empty()) x.reason = jstr(sp, "reason");
  if (sp.contains("degraded") && sp["degraded"].is_boolean()) x.degraded = sp["degraded"].get<bool>();
  if (jbool(sp, "replayed")) x.replayed = true;
  if (sp.contains("queue_ms") && sp["queue_ms"].is_number()) x.queue_ms = sp["queue_ms"].get<double>();
  x.migrations = std::max<int32_t>(x.migrations, static_cast<int32_t>(jint(sp, "migrations")));
  if (x.reason.rfind("failover from", 0) == 0) x.failovers = std::max(x.failovers, 1);
  if (sp.contains("queue_position") && sp["queue_position"].is_number()) {
    x.queue_position = static_cast<int32_t>(jint(sp, "queue_position"));
    x.queued = x.queue_position > 0 && x.text.empty();
  }
  // Shown: said degraded, and where (path, model), with which limits and
  // what delay to expect.
  if (x.degraded && sp["path"].is_string() && sp["model"].is_string() && sp.contains("limits") &&
      sp["limits"].is_object() && sp.contains("estimated_delay_ms")) {
    x.degraded_shown = true;
  }
}

void take_error(const json& e, Exchange& x) {
  x.error_event = true;
  if (!e.is_object()) return;
  x.error_code = jstr(e, "code");
  x.error_message = jstr(e, "message");
  if (const int64_t id = jint(e, "request_id"); id > 0) {
    x.request_id = id;
    x.resumable = true;
  }
  if (x.error_code == "resumable") x.resumable = true;
}

// One completion-shaped body (a completion, or a stream chunk).
void take_body(const json& j, Exchange& x, double t_invoke_ms, const Drill& d) {
  if (!j.is_object()) return;
  if (j.contains("error")) take_error(j["error"], x);
  if (j.contains("spillway")) take_spillway(j["spillway"], x);
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const json& ch = j["choices"][0];
    const std::string t = jstr(ch, "text");
    if (!t.empty()) {
      if (x.ttft_ms < 0) x.ttft_ms = d.now_ms() - t_invoke_ms;
      x.text += t;
      x.queued = false;
    }
    if (!jstr(ch, "finish_reason").empty()) x.finish_reason = jstr(ch, "finish_reason");
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    x.completion_tokens = static_cast<int32_t>(jint(j["usage"], "completion_tokens", x.completion_tokens));
  }
}

// POSTs `body` to `path` (a completion or a resume) and reads the answer, a
// stream event at a time when `stream`; `progress` sees the exchange after
// the headers and each event.
Exchange exchange(Drill& d, const std::string& path, const std::string& body, const httplib::Headers& headers,
                  bool stream, double t_invoke_ms, const std::function<void(const Exchange&)>& progress) {
  Exchange x;
  try {
    auto c = client(d, stream ? 20 : 90);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = headers;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    std::string raw, buf;
    bool sse = false;
    req.response_handler = [&](const httplib::Response& r) {
      x.http_status = r.status;
      sse = r.get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
      const std::string id = r.get_header_value("X-Spillway-Request-Id");
      if (!id.empty()) x.request_id = std::atoll(id.c_str());
      if (!r.get_header_value("X-Spillway-Path").empty()) x.path = r.get_header_value("X-Spillway-Path");
      if (r.get_header_value("X-Spillway-Replayed") == "true") x.replayed = true;
      // The headers go out at admission; a queued stream's first chunk only
      // with its first token (or the keep-alive), so the queue position is
      // read here.
      const std::string pos = r.get_header_value("X-Spillway-Queue-Position");
      if (!pos.empty()) {
        x.queue_position = std::atoi(pos.c_str());
        x.queued = x.queue_position > 0;
      }
      if (progress) progress(x);
      return !d.abort_.load();
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (!sse) {
        raw.append(data, n);
        return !d.abort_.load();
      }
      buf.append(data, n);
      size_t end;
      while ((end = buf.find("\n\n")) != std::string::npos) {
        const std::string ev = buf.substr(0, end);
        buf.erase(0, end + 2);
        std::istringstream lines(ev);
        std::string line;
        while (std::getline(lines, line)) {
          if (line.rfind("data: ", 0) != 0) continue;  // ": keep-alive" and others
          const std::string payload = line.substr(6);
          if (payload == "[DONE]") {
            x.finished = true;
            continue;
          }
          take_body(parse_json(payload), x, t_invoke_ms, d);
          if (progress) progress(x);
        }
      }
      return !d.abort_.load();
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = c->send(req, res, err);
    if (!sent) {
      x.transport = httplib::to_string(err);
      if (err == httplib::Error::Connection) {
        x.connect_failed = true;
      } else {
        x.cut = true;
      }
      x.finished = false;
      return x;
    }
    if (!sse) {
      const json j = parse_json(raw);
      take_body(j, x, t_invoke_ms, d);
      x.finished = j.is_object();
      if (!j.is_object()) {
        x.error_code = "unparsable_body";
        x.error_message = tail(raw, 300);
      }
    } else if (!x.finished) {
      x.cut = true;  // the stream ended without [DONE]
      x.transport = "stream ended without [DONE]";
    }
    if (x.http_status != 200 && !x.error_event) x.error_event = true;
  } catch (const std::exception& e) {
    x.cut = true;
    x.transport = std::string("exception: ") + e.what();
  }
  return x;
}

// The completion op of `inv` from what the exchange gave.
Op completion_of(const Drill& d, const Op& inv, const Exchange& x) {
  Op r = inv;
  r.t_ms = d.now_ms();
  r.http_status = x.http_status;
  r.error_code = x.error_code;
  r.error_message = x.error_message;
  if (x.connect_failed || (x.cut && x.http_status == 0)) {
    r.error_code = r.error_code.empty() ? (x.connect_failed ? "connection_failed" : "no_answer") : r.error_code;
    r.error_message = r.error_message.empty() ? x.transport : r.error_message;
  } else if (x.cut && r.error_message.empty()) {
    r.error_message = x.transport;
  }
  r.request_id = x.request_id > 0 ? x.request_id : inv.request_id;
  r.accepted = x.request_id > 0 || (x.http_status == 200 && (x.finished || !x.text.empty()));
  r.path = x.path;
  r.placement = x.placement;
  // A replay's spillway object names the placement only: the path of that
  // placement, so that figures by path count it where it ran.
  if (r.path.empty() && !r.placement.empty()) {
    for (const auto& [name, info] : d.path_info_)
      if (jstr(info, "placement") == r.placement) r.path = name;
  }
  r.model = x.model;
  r.decision = x.decision;
  r.reason = x.reason;
  r.degraded = x.degraded || (!x.path.empty() && x.path != d.first_path_);
  r.degraded_shown = x.degraded_shown;
  r.replayed = x.replayed;
  r.text = x.text;
  r.completion_tokens = x.completion_tokens;
  r.finish_reason = x.finish_reason;
  r.ttft_ms = x.ttft_ms;
  r.latency_ms = r.t_ms - inv.t_ms;
  r.queue_ms = x.queue_ms;
  r.failovers = x.failovers;
  r.migrations = x.migrations;
  if (x.connect_failed) {
    r.type = OpType::kFail;  // nothing was sent: it definitely did not happen
  } else if (x.cut) {
    r.type = OpType::kInfo;
  } else if (x.http_status == 200 && x.finished && !x.error_event && !x.finish_reason.empty()) {
    r.type = OpType::kOk;
  } else if (x.http_status == 200 && x.finished && !x.error_event) {
    r.type = OpType::kInfo;  // answered, but without a finish: not whole
  } else {
    r.type = OpType::kFail;
  }
  return r;
}

// ---------------------------------------------------------------- requests

// The request fields of `op` only: the invoke of a continuation carries what
// is asked, not what the operation it continues received.
Op request_part(const Op& op) {
  Op r;
  r.client = op.client;
  r.f = op.f;
  r.continues = op.continues;
  r.phase = op.phase;
  r.cls = op.cls;
  r.prompt_key = op.prompt_key;
  r.stream = op.stream;
  r.greedy = op.greedy;
  r.seed = op.seed;
  r.max_tokens = op.max_tokens;
  r.idempotency_key = op.idempotency_key;
  return r;
}

struct RequestPlan {
  const RequestClass* cls = nullptr;
  std::string phase;
  int32_t client = 0;
  bool idempotent = false;
  bool retry_after = false;  // send it again with the same key once ok
  uint64_t seed = 0;
};

std::string completion_body(const RequestClass& cls, uint64_t seed) {
  std::string prompt;
  for (int32_t i = 0; i < std::max(1, cls.prompt_repeat); ++i) prompt += cls.prompt;
  json b = {{"prompt", prompt}, {"max_tokens", cls.max_tokens}, {"stream", cls.stream}};
  if (cls.greedy) {
    b["temperature"] = 0;
  } else {
    b["temperature"] = 0.8;
    b["seed"] = seed;
  }
  return b.dump();
}

// Runs one exchange as an op (invoke + completion), tracking the stream for
// the nemesis. `on_progress` (optional) also sees it.
Op run_op(Drill& d, Op base, const std::string& path, const std::string& body, const httplib::Headers& h,
          Exchange* out, const std::function<void(const Exchange&)>& on_progress = nullptr) {
  const Op inv = d.invoke(std::move(base));
  const int64_t key = d.track(InFlight{});
  auto progress = [&](const Exchange& x) {
    if (x.request_id > 0) d.saw_request(x.request_id);
    d.update(key, InFlight{x.request_id, x.path, x.queued, !x.text.empty()});
    if (on_progress) on_progress(x);
  };
  Exchange x = exchange(d, path, body, h, inv.stream, inv.t_ms, progress);
  d.untrack(key);
  d.saw_request(x.request_id);
  Op res = completion_of(d, inv, x);
  d.complete(inv, res);
  res.op_id = inv.op_id;
  if (out) *out = std::move(x);
  return res;
}

// Reads the journal's record of `id` (bounded retries while the server is
// coming back); null when unreadable.
json read_record(Drill& d, int64_t id, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    auto [st, body] = get(d, "/v1/requests/" + std::to_string(id), 3);
    if (st == 200) return parse_json(body);
    if (st == 404 || Clock::now() >= deadline) return json();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

bool terminal_state(const std::string& s) { return s == "done" || s == "failed" || s == "cancelled"; }

// An accepted request whose answer was cut or ended resumable: read its
// record once the server answers, then read the finished text, resume from
// the checkpoint, or (idempotent, no checkpoint) send it again under its key.
void continue_request(Drill& d, const Op& first, const std::string& body, int64_t rid, std::string received) {
  int64_t last = first.op_id;
  bool tried_without_checkpoint = false;
  for (int round = 0; round < 5 && !d.abort_.load(); ++round) {
    if (!wait_ready(d, 60)) {
      d.event("client_gave_up", "request " + std::to_string(rid) + ": server not ready within 60 s");
      return;
    }
    json rec = read_record(d, rid, 10);
    // Still in flight on the server (our side timed out): wait for its end.
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (rec.is_object() && !terminal_state(jstr(rec, "state")) && Clock::now() < until && !d.abort_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      rec = read_record(d, rid, 10);
    }
    if (!rec.is_object() || !terminal_state(jstr(rec, "state"))) return;
    const std::string state = jstr(rec, "state");
    Op base = request_part(first);
    base.request_id = rid;  // the request this continues (a retry under a key may get it anew)
    base.continues = last;
    base.t_ms = d.now_ms();
    if (state == "done") {
      // It finished while we were cut off: the rest of its text is stored.
      base.f = "read";
      const Op inv = d.invoke(base);
      Op r = inv;
      r.t_ms = d.now_ms();
      const std::string stored = jstr(rec, "text");
      r.type = OpType::kOk;
      r.http_status = 200;
      r.request_id = rid;
      r.accepted = true;
      r.placement = jstr(rec, "placement");
      if (rec.contains("admission") && rec["admission"].is_object()) r.path = jstr(rec["admission"], "path");
      r.finish_reason = jstr(rec, "finish_reason");
      r.latency_ms = r.t_ms - inv.t_ms;
      if (stored.compare(0, received.size(), received) == 0) {
        r.text = stored.substr(received.size());
      } else {
        r.text = stored;
        r.error_message = "stored text does not continue the text received";
      }
      d.complete(inv, r);
      return;
    }
    if (d.was_cancelled(rid) || state == "cancelled") return;
    // A resumable record is resumed, checkpoint or not: without one the
    // server says why it cannot (409), which the history keeps; a keyed
    // request then goes again under its key.
    const bool has_checkpoint = rec.contains("checkpoint_tokens") && rec["checkpoint_tokens"].is_number();
    if (jbool(rec, "resumable") && !(tried_without_checkpoint && !has_checkpoint)) {
      tried_without_checkpoint = tried_without_checkpoint || !has_checkpoint;
      base.f = "resume";
      const json rb = {{"received_text", received}, {"stream", first.stream}};
      Exchange x;
      Op r = run_op(d, base, "/v1/requests/" + std::to_string(rid) + "/resume", rb.dump(), {}, &x);
      last = r.op_id;
      received += x.text;
      if (r.type == OpType::kOk) return;
      if (r.type == OpType::kFail && !x.resumable && r.http_status != 409 && r.http_status != 503) return;
      if (r.http_status == 409 && !has_checkpoint && first.idempotency_key.empty()) return;
      continue;
    }
    if (!first.idempotency_key.empty()) {
      base.f = "retry";
      Exchange x;
      Op r = run_op(d, base, "/v1/completions", body, {{"Idempotency-Key", first.idempotency_key}}, &x);
      last = r.op_id;
      received = x.text;  // a retry runs (or replays) from the start
      if (r.type == OpType::kOk) return;
      if (r.type == OpType::kFail && !x.resumable) return;
      if (x.request_id > 0) rid = x.request_id;
      continue;
    }
    return;  // failed for good, as its record says
  }
}

void run_request(Drill& d, const RequestPlan& p) {
  const RequestClass& cls = *p.cls;
  Op base;
  base.client = p.client;
  base.t_ms = d.now_ms();
  base.f = "complete";
  base.phase = p.phase;
  base.cls = cls.name;
  base.prompt_key = prompt_key(cls.name, cls.greedy, p.seed);
  base.stream = cls.stream;
  base.greedy = cls.greedy;
  base.seed = p.seed;
  base.max_tokens = cls.max_tokens;
  httplib::Headers h;
  if (p.idempotent) {
    static std::atomic<int64_t> n{0};
    base.idempotency_key = "drill-" + random_hex(6) + "-" + std::to_string(++n);
    h.emplace("Idempotency-Key", base.idempotency_key);
  }
  const std::string body = completion_body(cls, p.seed);
  Exchange x;
  const Op r = run_op(d, base, "/v1/completions", body, h, &x);
  if (r.type == OpType::kOk) {
    if (p.idempotent && p.retry_after) {
      Op again = base;
      again.f = "retry";
      again.continues = r.op_id;
      again.t_ms = d.now_ms();
      run_op(d, again, "/v1/completions", body, h, nullptr);
    }
    return;
  }
  if (x.request_id > 0 && d.was_cancelled(x.request_id)) return;
  const bool interrupted = r.type == OpType::kInfo || (r.type == OpType::kFail && x.resumable);
  if (interrupted && x.request_id > 0) {
    continue_request(d, r, body, x.request_id, x.text);
  } else if (r.type == OpType::kInfo && p.idempotent) {
    // Cut before we learned an id: the key finds it (replay, or a re-run
    // of a failed one under the same id).
    if (!wait_ready(d, 60)) return;
    Op again = request_part(base);
    again.f = "retry";
    again.continues = r.op_id;
    again.t_ms = d.now_ms();
    Exchange y;
    const Op r2 = run_op(d, again, "/v1/completions", body, h, &y);
    if ((r2.type == OpType::kInfo || (r2.type == OpType::kFail && y.resumable)) && y.request_id > 0) {
      continue_request(d, r2, body, y.request_id, y.text);
    }
  }
}

// ---------------------------------------------------------------- arrivals

class Arrivals {
 public:
  Arrivals(uint64_t seed, const RequestClass* cls, double rate, double start_ms, double end_ms, std::string phase)
      : rng_(seed), cls_(cls), rate_(rate), next_ms_(start_ms), end_ms_(end_ms), phase_(std::move(phase)) {
    advance();
  }
  // The next arrival (time, plan) while the phase lasts.
  std::optional<std::pair<double, RequestPlan>> take() {
    std::lock_guard<std::mutex> lk(mu_);
    if (next_ms_ >= end_ms_) return std::nullopt;
    RequestPlan p;
    p.cls = cls_;
    p.phase = phase_;
    std::uniform_real_distribution<double> u(0, 1);
    p.idempotent = u(rng_) < cls_->idempotency_share;
    p.retry_after = u(rng_) < cls_->retry_share;
    p.seed = cls_->greedy ? 0 : rng_() % 1000000;
    const double at = next_ms_;
    advance();
    return std::make_pair(at, p);
  }
  double end_ms() const { return end_ms_; }

 private:
  void advance() {
    std::exponential_distribution<double> gap(rate_);
    next_ms_ += gap(rng_) * 1000.0;
  }
  std::mutex mu_;
  std::mt19937_64 rng_;
  const RequestClass* cls_;
  double rate_, next_ms_, end_ms_;
  std::string phase_;
};

void sleep_until_ms(Drill& d, double t_ms) {
  while (!d.abort_.load()) {
    const double left = t_ms - d.now_ms();
    if (left <= 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(std::min(left, 100.0)) + 1));
  }
}

// ---------------------------------------------------------------- sampler

void sampler(Drill& d) {
  std::map<std::string, std::string> breaker;
  bool was_up = true;
  const httplib::Headers admin = {{"Authorization", "Bearer " + d.admin_token_}};
  while (!d.stop_sampler_.load()) {
    const double t = d.now_ms();
    Sample s;
    s.t_ms = t;
    s.competing_bytes = d.competing_.load();
    auto [st, body] = get(d, "/v1/status", 1);
    const json j = st == 200 ? parse_json(body) : json();
    s.up = j.is_object();
    if (s.up) {
      if (j.contains("paths") && j["paths"].is_array()) {
        for (const json& p : j["paths"]) {
          PathSample ps;
          ps.name = jstr(p, "name");
          ps.queue_depth = static_cast<int32_t>(jint(p, "queue_depth"));
          ps.running = static_cast<int32_t>(jint(p, "running"));
          ps.oldest_queued_s = jdbl(p, "oldest_queued_s");
          if (p.contains("breaker") && p["breaker"].is_object()) ps.breaker = jstr(p["breaker"], "state");
          auto prev = breaker.find(ps.name);
          const std::string before = prev == breaker.end() ? "closed" : prev->second;
          if (!ps.breaker.empty() && ps.breaker != before) {
            std::string detail = ps.name + ": " + before + " -> " + ps.breaker;
            const json& b = p["breaker"];
            if (!jstr(b, "reason").empty()) detail += " (" + jstr(b, "reason") + ")";
            d.event("breaker_" + ps.breaker, detail);
          }
          if (!ps.breaker.empty()) breaker[ps.name] = ps.breaker;
          s.paths.push_back(ps);
        }
      }
      bool device_done = false;
      if (j.contains("ledgers") && j["ledgers"].is_array()) {
        for (const json& l : j["ledgers"]) {
          uint64_t reserved_total = 0, cotenants = 0;
          if (l.contains("reserved_bytes") && l["reserved_bytes"].is_object()) {
            for (auto& [k, v] : l["reserved_bytes"].items()) {
              const uint64_t b = v.is_number() ? v.get<uint64_t>() : 0;
              if (k == "co-tenant") cotenants += b;
              else reserved_total += b;
            }
          }
          if (jstr(l, "name") == "host") {
            s.host_budget = juint(l, "limit_bytes");
            s.host_reserved = reserved_total + cotenants;
          } else if (!device_done) {
            device_done = true;
            s.device_capacity = juint(l, "capacity_bytes");
            s.device_limit = juint(l, "limit_bytes");
            s.device_ours = reserved_total;
            s.device_cotenants = cotenants + juint(l, "others_bytes");
            s.device_used = juint(l, "used_bytes");
          }
        }
      }
    }
    if (d.own_server_) {
      const pid_t pid = d.server_pid_.load();
      s.host_rss = vm_rss(pid);
      // An exit we did not cause is a finding: record it once.
      if (pid > 0 && !d.server_down_.load()) {
        if (auto code = wait_exit(pid, 0)) {
          d.server_pid_.store(-1);
          d.event("server_exited", "spillway serve exited on its own with status " + std::to_string(*code));
        }
      }
    }
    if (s.up != was_up && !d.server_down_.load()) {
      d.event(s.up ? "server_up" : "server_unresponsive", "GET /v1/status " + std::string(s.up ? "answers" : "does not answer"));
    }
    was_up = s.up;
    const bool up = s.up;
    d.sample(std::move(s));
    // Armed device faults: report each when it fires.
    if (d.own_server_ && up) {
      bool pending = false;
      {
        std::lock_guard<std::mutex> lk(d.armed_mu_);
        for (const Armed& a : d.armed_unlocked()) pending = pending || !a.reported;
      }
      if (pending) {
        auto [fst, fbody] = get(d, "/v1/admin/faults", 1, admin);
        const json fj = fst == 200 ? parse_json(fbody) : json();
        if (fj.is_object() && fj.contains("data") && fj["data"].is_array()) {
          std::lock_guard<std::mutex> lk(d.armed_mu_);
          for (Armed& a : d.armed_unlocked()) {
            for (const json& f : fj["data"]) {
              if (a.reported || jint(f, "id") != a.id || jint(f, "fired") <= 0) continue;
              a.reported = true;
              d.event("fault_fired", a.kind + " on " + a.path + " (fault " + std::to_string(a.id) + "): fired " +
                                         std::to_string(jint(f, "fired")) + " of " + std::to_string(a.count) +
                                         " after " + std::to_string(jint(f, "seen")) + " events");
            }
          }
        }
      }
    }
    const double next = t + d.o_.sample_period_s * 1000.0;
    while (!d.stop_sampler_.load() && d.now_ms() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------- competing workload

class CoTenants {
 public:
  explicit CoTenants(Drill& d) : d_(d), device_(occupy_device(d.sc_.server.device)) {}
  ~CoTenants() { stop_all(); }

  // Brings the declared and undeclared holdings to their targets.
  void set(uint64_t declared, uint64_t undeclared) {
    adjust(true, declared);
    adjust(false, undeclared);
  }
  // After a restart the server has forgotten every reservation: the declared
  // holders are started again (their `spillway reserve` registers anew).
  void redeclare() {
    uint64_t declared = 0;
    for (const Holder& h : holders_) declared += h.declared ? h.bytes : 0;
    if (declared == 0) return;
    adjust(true, 0);
    adjust(true, declared);
  }
  void stop_all() {
    for (auto it = holders_.rbegin(); it != holders_.rend(); ++it) stop_process(it->pid, SIGTERM, 5);
    holders_.clear();
    publish();
  }
  uint64_t total() const {
    uint64_t t = 0;
    for (const Holder& h : holders_) t += h.bytes;
    return t;
  }

 private:
  struct Holder {
    pid_t pid;
    uint64_t bytes;
    bool declared;
  };

  uint64_t held(bool declared) const {
    uint64_t t = 0;
    for (const Holder& h : holders_) t += h.declared == declared ? h.bytes : 0;
    return t;
  }
  void publish() { d_.competing_.store(total()); }

  void adjust(bool declared, uint64_t target) {
    const char* what = declared ? "cotenant" : "undeclared";
    while (held(declared) > target) {  // shrink: newest first
      auto it = std::find_if(holders_.rbegin(), holders_.rend(), [&](const Holder& h) { return h.declared == declared; });
      stop_process(it->pid, SIGTERM, 5);
      const uint64_t b = it->bytes;
      holders_.erase(std::next(it).base());
      publish();
      d_.event(what, "released " + format_byte_size(b) + "; now " + format_byte_size(held(declared)));
    }
    if (held(declared) < target) start(declared, target - held(declared));
  }

  void start(bool declared, uint64_t bytes) {
    const std::string bin = d_.o_.spillway_binary;
    const int n = ++count_;
    const std::string out = (fs::path(d_.o_.work_dir) / ("occupy-" + std::to_string(n) + ".out")).string();
    const std::string err = (fs::path(d_.o_.work_dir) / ("occupy-" + std::to_string(n) + ".log")).string();
    std::vector<std::string> occupy = {bin, "occupy", "--device", device_, "--bytes", std::to_string(bytes)};
    std::vector<std::string> args;
    if (declared) {
      args = {bin, "reserve", "--bytes", std::to_string(bytes), "--server", d_.url(), "--name", "drill-cotenant",
              "--ttl-s", "10", "--"};
    }
    args.insert(args.end(), occupy.begin(), occupy.end());
    const pid_t pid = spawn(args, out, err);
    const char* what = declared ? "cotenant" : "undeclared";
    if (pid < 0) {
      d_.event(what, "could not start the competing workload (fork failed)");
      return;
    }
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      if (read_file(out).find("holding") != std::string::npos) {
        holders_.push_back({pid, bytes, declared});
        publish();
        std::string detail =
            "holding " + format_byte_size(bytes) + " more on " + device_ +
            (declared ? " (declared: spillway reserve -- spillway occupy)" : " (spillway occupy, told nobody)") +
            "; now " + format_byte_size(held(declared));
        if (!declared) detail += "; " + observability();
        d_.event(what, detail);
        return;
      }
      if (auto code = wait_exit(pid, 0)) {
        d_.event(what, "the competing workload of " + format_byte_size(bytes) + " exited with status " +
                           std::to_string(*code) + " before holding: " + tail(read_file(err), 400));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop_process(pid, SIGTERM, 2);
    d_.event(what, "the competing workload of " + format_byte_size(bytes) + " did not report holding within 30 s");
  }

  // Whether the server can see memory nobody declared (/health's device
  // reading), said plainly.
  std::string observability() {
    auto [st, body] = get(d_, "/health", 2);
    const json j = st == 200 ? parse_json(body) : json();
    if (!j.is_object() || !j.contains("device_memory") || !j["device_memory"].is_object()) {
      return "undeclared usage not observable: the server reports no device memory reading";
    }
    const json& dm = j["device_memory"];
    if (!jstr(dm, "observed_unknown").empty()) {
      return "undeclared usage not observable on this device (" + jstr(dm, "observed_unknown") + ")";
    }
    return "observable: the server reads the device heap (others observed " +
           format_byte_size(juint(dm, "others_observed_bytes")) + ")";
  }

  Drill& d_;
  std::string device_;
  std::vector<Holder> holders_;
  int count_ = 0;
};

// ---------------------------------------------------------------- nemesis

const RequestClass* longest_class(const Scenario& sc, bool need_stream) {
  const RequestClass* best = nullptr;
  for (const RequestClass& c : sc.classes) {
    if (need_stream && !c.stream) continue;
    if (!best || c.max_tokens * c.prompt_repeat > best->max_tokens * best->prompt_repeat) best = &c;
  }
  return best;
}

// A stream of the nemesis's own (recorded like any client's), always
// streamed: it is how the nemesis knows a request runs or waits.
void nemesis_stream(Drill& d, const RequestClass* cls, const std::string& phase) {
  if (!cls) return;
  RequestClass c = *cls;
  c.stream = true;
  auto owned = std::make_shared<RequestClass>(c);
  RequestPlan p;
  p.cls = owned.get();
  p.phase = phase;
  p.client = 1000 + d.next_client_++;
  p.seed = c.greedy ? 0 : kReferenceSeed;
  d.spawn_worker([&d, owned, p] { run_request(d, p); });
}

Status post_fault(Drill& d, const json& body, json* answer) {
  try {
    auto c = client(d, 5);
    auto r = c->Post("/v1/admin/faults", {{"Authorization", "Bearer " + d.admin_token_}}, body.dump(), "application/json");
    if (!r) return Status::unavailable("POST /v1/admin/faults: " + httplib::to_string(r.error()));
    *answer = parse_json(r->body);
    if (r->status != 201) return Status::failed_precondition("POST /v1/admin/faults: HTTP " + std::to_string(r->status) + " " + tail(r->body, 300));
    return Status();
  } catch (const std::exception& e) {
    return Status::internal(std::string("POST /v1/admin/faults: ") + e.what());
  }
}

// Tokens of `prompt` as the server counts them (POST /v1/quote); -1 when it
// does not answer.
int64_t quoted_prompt_tokens(Drill& d, const std::string& prompt) {
  try {
    auto c = client(d, 5);
    const json body = {{"prompt", prompt}, {"max_tokens", 1}};
    auto r = c->Post("/v1/quote", body.dump(), "application/json");
    if (!r || r->status != 200) return -1;
    const json q = parse_json(r->body);
    if (!q.is_object() || !q.contains("limits") || !q["limits"].is_object()) return -1;
    return jint(q["limits"], "prompt_tokens", -1);
  } catch (const std::exception&) {
    return -1;
  }
}

// The allocation an armed alloc_fail meets. Spillway allocates a path's
// weights, KV pool and scratch at start, so serving allocates device memory
// only when a request needs more scratch than any before it: the attention
// scores grow with the positions a prefill attends to. The probe is a
// streamed request whose prompt nearly fills the path's context, longer
// than any class's, so its prefill is what allocates, before generation.
void alloc_probe(Drill& d, const std::string& path, const std::string& phase) {
  const RequestClass* base = longest_class(d.sc_, false);
  auto it = d.path_info_.find(path);
  if (!base || it == d.path_info_.end()) return;
  const int64_t n_ctx = jint(it->second, "n_ctx", 0);
  auto c = std::make_shared<RequestClass>(*base);
  c->name = "alloc_probe";
  c->max_tokens = 8;
  c->greedy = true;
  c->idempotency_share = 0;
  c->retry_share = 0;
  // The most repeats of the class prompt that leave room for the tokens.
  int32_t best = std::max(1, base->prompt_repeat);
  for (int32_t r = best + 1; r <= best * 8; ++r) {
    std::string p;
    for (int32_t i = 0; i < r; ++i) p += base->prompt;
    const int64_t n = quoted_prompt_tokens(d, p);
    if (n < 0 || n + c->max_tokens + 2 > n_ctx) break;
    c->prompt_repeat = r;
  }
  RequestPlan plan;
  plan.cls = c.get();
  plan.phase = phase;
  plan.client = 1000 + d.next_client_++;
  d.spawn_worker([&d, c, plan] { run_request(d, plan); });
}

void arm_device_fault(Drill& d, const FaultSpec& f, const std::string& phase) {
  const std::string kind(fault_kind_name(f.kind));
  if (!d.own_server_) {
    d.event(kind, "skipped: an external server (--server) gives the drill no admin token");
    return;
  }
  std::string note;
  if (f.kind == FaultKind::kDeviceLost) {
    // Mid-generation: a stream must be generating on that path when armed.
    auto generating = [&] {
      for (const InFlight& fl : d.inflight())
        if (fl.generating && fl.path == f.path) return true;
      return false;
    };
    if (!generating()) {
      nemesis_stream(d, longest_class(d.sc_, false), phase);
      const auto until = Clock::now() + std::chrono::seconds(15);
      while (!generating() && Clock::now() < until && !d.abort_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!generating()) note = "; no stream was generating on " + f.path + " within 15 s (armed anyway)";
    }
  }
  json body = {{"kind", kind}, {"path", f.path}, {"count", f.count}};
  if (f.kind == FaultKind::kDeviceLost) body["after_submits"] = f.after_submits;
  json answer;
  const Status st = post_fault(d, body, &answer);
  if (!st.ok()) {
    d.event(kind, "arming failed: " + st.message());
    return;
  }
  d.armed(Armed{jint(answer, "id"), kind, f.path, f.count, false});
  if (f.kind == FaultKind::kAllocFail) note += "; a long-prompt probe meets it (the first allocation since start)";
  d.event(kind, "armed on " + f.path + " (fault " + std::to_string(jint(answer, "id")) + ", count " +
                    std::to_string(f.count) + (f.kind == FaultKind::kDeviceLost ? ", after " + std::to_string(f.after_submits) + " submissions" : "") + ")" + note);
  if (f.kind == FaultKind::kAllocFail) alloc_probe(d, f.path, phase);
}

// Cancels a request that waits in the CPU path's queue: the nemesis's own
// streams fill the queues until one waits there; DELETE it (op "cancel").
void cancel_one_queued(Drill& d, const std::string& queue_path, const std::string& phase) {
  const std::string target = !queue_path.empty() ? queue_path : !d.cpu_path_.empty() ? d.cpu_path_ : d.first_path_;
  const RequestClass* cls = longest_class(d.sc_, false);
  // A burst large enough to fill the path's workers and put some in its queue.
  int burst = 6;
  if (auto it = d.path_info_.find(target); it != d.path_info_.end()) {
    burst = static_cast<int>(std::clamp<int64_t>(jint(it->second, "workers", 1) + jint(it->second, "queue_capacity", 4), 2, 12));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto next_burst = Clock::now();
  int launched = 0;
  std::optional<InFlight> any;
  std::set<int64_t> tried;  // DELETEs that found the request gone from the queue
  while (Clock::now() < deadline && !d.abort_.load()) {
    std::optional<InFlight> pick;
    for (const InFlight& f : d.inflight()) {
      if (!f.queued || f.request_id <= 0 || d.was_cancelled(f.request_id) || tried.count(f.request_id)) continue;
      if (f.path == target) pick = f;
      if (!any) any = f;
    }
    if (pick) {
      Op base;
      base.client = 999;
      base.t_ms = d.now_ms();
      base.f = "cancel";
      base.phase = phase;
      base.request_id = pick->request_id;
      base.path = pick->path;
      const Op inv = d.invoke(base);
      d.mark_cancelled(pick->request_id);
      Op r = inv;
      try {
        auto c = client(d, 5);
        auto res = c->Delete(("/v1/requests/" + std::to_string(pick->request_id)).c_str());
        r.t_ms = d.now_ms();
        r.latency_ms = r.t_ms - inv.t_ms;
        if (!res) {
          r.type = OpType::kInfo;
          r.error_message = httplib::to_string(res.error());
        } else {
          r.http_status = res->status;
          const json j = parse_json(res->body);
          r.type = res->status == 200 && jbool(j, "cancelled") ? OpType::kOk : OpType::kFail;
          r.accepted = res->status == 200;
          r.error_message = "state at cancel: " + jstr(j, "state");
          if (j.contains("error")) r.error_code = jstr(j["error"], "code");
        }
      } catch (const std::exception& e) {
        r.type = OpType::kInfo;
        r.error_message = e.what();
      }
      // On a fast machine the request can leave the queue between the look
      // and the DELETE: that race is no failure of the server (the answer
      // says the state it found), so it is recorded as info and another
      // queued request is tried until the deadline.
      const bool raced = r.type == OpType::kFail && r.http_status == 200;
      if (raced) r.type = OpType::kInfo;
      d.complete(inv, r);
      d.event("cancel_queued", "DELETE /v1/requests/" + std::to_string(pick->request_id) + " (waiting on " + pick->path +
                                   "): HTTP " + std::to_string(r.http_status) + ", " + r.error_message +
                                   (raced ? " (it left the queue first; trying another)" : ""));
      if (!raced) return;
      d.unmark_cancelled(pick->request_id);  // it runs on: its outcome counts as any other's
      tried.insert(pick->request_id);
      continue;
    }
    if (Clock::now() >= next_burst && launched < 3 * burst) {
      for (int i = 0; i < burst; ++i) nemesis_stream(d, cls, phase);
      launched += burst;
      next_burst = Clock::now() + std::chrono::seconds(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  d.event("cancel_queued", "no request was seen waiting in the " + target + " queue within 10 s (" +
                               std::to_string(launched) + " streams sent to fill it" +
                               (any ? "; one waited on " + any->path : std::string()) + "); nothing cancelled");
}

void kill_server(Drill& d, const FaultSpec& f, CoTenants& cot) {
  if (!d.own_server_) {
    d.event("kill", "skipped: the drill did not start this server (--server)");
    return;
  }
  d.server_down_.store(true);
  const pid_t pid = d.server_pid_.exchange(-1);
  if (pid > 0) {
    kill(pid, SIGKILL);
    (void)wait_exit(pid, 10);
  }
  char after[32];
  std::snprintf(after, sizeof after, "%.1f", f.restart_after_s);
  d.event("kill", "SIGKILL to spillway serve (pid " + std::to_string(pid) + "); restart in " + after + " s");
  {
    std::lock_guard<std::mutex> lk(d.armed_mu_);
    for (Armed& a : d.armed_unlocked()) {
      if (!a.reported) d.event("fault_lost", a.kind + " (fault " + std::to_string(a.id) + ") had not fired when the server died");
      a.reported = true;
    }
  }
  sleep_until_ms(d, d.now_ms() + f.restart_after_s * 1000.0);
  const double t = d.now_ms();
  Status st = start_server(d);
  if (!st.ok()) {
    // The port may still be held briefly; one more try before giving up.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    st = start_server(d);
  }
  if (!st.ok()) {
    d.event("restart_failed", st.message());
    return;
  }
  d.event("restart", "spillway serve back on the same journal and port " + std::to_string(d.port_.load()) + " after " +
                         std::to_string(static_cast<int64_t>(d.now_ms() - t)) + " ms of start-up");
  cot.redeclare();
}

void fire(Drill& d, const FaultSpec& f, const Phase& ph, CoTenants& cot) {
  switch (f.kind) {
    case FaultKind::kPressure:
      d.event("pressure", "competing workload to " + format_byte_size(f.bytes) + " (declared)");
      cot.set(f.bytes, ph.undeclared_bytes);
      return;
    case FaultKind::kAllocFail:
    case FaultKind::kDeviceLost:
      arm_device_fault(d, f, ph.name);
      return;
    case FaultKind::kCancelQueued:
      for (int32_t i = 0; i < std::max(1, f.count); ++i) cancel_one_queued(d, f.path, ph.name);
      return;
    case FaultKind::kKill:
      kill_server(d, f, cot);
      return;
  }
}

// ---------------------------------------------------------------- the run

Status read_paths(Drill& d) {
  auto [st, body] = get(d, "/v1/status", 5);
  const json j = st == 200 ? parse_json(body) : json();
  if (!j.is_object() || !j.contains("paths") || !j["paths"].is_array() || j["paths"].empty()) {
    return Status::unavailable("GET /v1/status gave no paths (HTTP " + std::to_string(st) + "): " + tail(body, 300));
  }
  d.first_path_ = jstr(j["paths"][0], "name");
  for (const json& p : j["paths"]) {
    const std::string name = jstr(p, "name"), placement = jstr(p, "placement");
    d.path_info_[name] = p;
    const Result<Placement> where = Placement::parse(placement);
    if (!where.ok()) continue;  // a placement this drill does not know: neither side
    if (where->kind == Placement::Kind::kCpu && d.cpu_path_.empty()) d.cpu_path_ = name;
    if (where->kind != Placement::Kind::kCpu) d.gpu_side_.insert(name);
  }
  std::string names;
  for (const auto& [n, p] : d.path_info_) names += (names.empty() ? "" : ", ") + n + "=" + jstr(p, "placement");
  std::string not_built;
  if (j.contains("paths_not_built") && j["paths_not_built"].is_array()) {
    for (const json& n : j["paths_not_built"]) not_built += "; not built: " + jstr(n, "path") + " (" + jstr(n, "reason") + ")";
  }
  d.event("server", "paths " + names + "; first choice " + d.first_path_ + "; overflow " + jstr(j, "overflow") + not_built);
  return Status();
}

Status reference_pass(Drill& d) {
  History& h = d.unsafe_history();
  for (const RequestClass& cls : d.sc_.classes) {
    RequestClass c = cls;
    c.stream = false;
    const uint64_t seed = c.greedy ? 0 : kReferenceSeed;
    const std::string key = prompt_key(c.name, c.greedy, seed);
    if (h.reference.count(key)) continue;
    Exchange x = exchange(d, "/v1/completions", completion_body(c, seed), {}, false, d.now_ms(), nullptr);
    if (x.http_status != 200 || x.finish_reason.empty()) {
      return Status::unavailable("reference run of class '" + c.name + "' failed: HTTP " + std::to_string(x.http_status) +
                                 " " + x.error_code + " " + x.error_message + x.transport);
    }
    h.reference[key] = x.text;
  }
  return Status();
}

void read_finals(Drill& d) {
  std::map<int64_t, FinalRecord> finals;
  for (int64_t id : d.request_ids()) {
    FinalRecord f;
    f.request_id = id;
    const json r = read_record(d, id, 5);
    if (r.is_object()) {
      f.found = true;
      f.state = jstr(r, "state");
      if (r.contains("error") && r["error"].is_object()) f.error_code = jstr(r["error"], "code");
      f.text = jstr(r, "text");
      f.placement = jstr(r, "placement");
      f.runs = static_cast<int32_t>(jint(r, "attempts", 1));
      if (r.contains("admission") && r["admission"].is_object()) {
        const json& a = r["admission"];
        const std::string path = jstr(a, "path");
        if (d.gpu_side_.count(path) && a.contains("pressure") && a["pressure"].is_number()) {
          f.admitted_under_reserve = a["pressure"].get<double>() <= 1.0;
        }
      }
    }
    finals[id] = std::move(f);
  }
  History& h = d.unsafe_history();
  h.finals = std::move(finals);
}

}  // namespace

Result<History> run_live(const Scenario& sc, const LiveOptions& o) {
  try {
    std::error_code ec;
    fs::create_directories(o.work_dir, ec);
    if (ec) return Status::io_error("cannot create the drill's work folder " + o.work_dir + ": " + ec.message());
    if (sc.classes.empty()) return Status::invalid_argument("scenario '" + sc.name + "' has no request classes");

    Drill d(sc, o);
    History& h0 = d.unsafe_history();
    h0.scenario = sc.name;
    h0.mode = mode_name(o.overflow);
    h0.seed = sc.seed;

    // 1. The server.
    if (o.server_url.empty()) {
      if (o.spillway_binary.empty() || !fs::exists(o.spillway_binary)) {
        return Status::invalid_argument("the spillway binary '" + o.spillway_binary + "' does not exist");
      }
      d.own_server_ = true;
      d.admin_token_ = random_hex(16);
      const std::string journal = (fs::path(o.work_dir) / "journal.sqlite").string();
      for (const char* suffix : {"", "-wal", "-shm", ".lock"}) fs::remove(journal + suffix, ec);
      d.server_args_ = {o.spillway_binary, "serve", "--host", "127.0.0.1", "--model", resolve_model(sc, o),
                        "--device", sc.server.device, "--journal", journal, "--admin-token", d.admin_token_,
                        "--overflow", o.overflow.empty() ? "planned" : o.overflow,
                        // The drill's co-tenant stands for real memory: it may take it all.
                        "--reservation-max-share", "1"};
      if (!sc.server.device_memory.empty()) {
        d.server_args_.insert(d.server_args_.end(), {"--device-memory", sc.server.device_memory});
      }
      d.server_args_.insert(d.server_args_.end(), sc.server.args.begin(), sc.server.args.end());
      d.port_.store(0);
      d.log("starting spillway serve (overflow " + o.overflow + ") in " + o.work_dir);
      SPW_RETURN_IF_ERROR(start_server(d));
    } else {
      const std::string prefix = "http://";
      std::string rest = o.server_url.rfind(prefix, 0) == 0 ? o.server_url.substr(prefix.size()) : o.server_url;
      while (!rest.empty() && rest.back() == '/') rest.pop_back();
      const size_t colon = rest.rfind(':');
      if (colon == std::string::npos) return Status::invalid_argument("--server " + o.server_url + ": expected http://HOST:PORT");
      d.host_ = rest.substr(0, colon);
      d.port_.store(std::atoi(rest.c_str() + colon + 1));
      if (d.port_.load() <= 0) return Status::invalid_argument("--server " + o.server_url + ": expected http://HOST:PORT");
      if (!wait_ready(d, o.ready_timeout_s)) return Status::unavailable(o.server_url + " did not answer /health/ready 200");
    }
    // From here everything we started is stopped on every return.
    CoTenants cot(d);
    auto stop_all = [&] {
      d.abort_.store(true);
      d.stop_sampler_.store(true);
      cot.stop_all();
      if (d.own_server_) {
        const pid_t pid = d.server_pid_.exchange(-1);
        stop_process(pid, SIGTERM, 15);
      }
    };
    if (Status st = read_paths(d); !st.ok()) {
      stop_all();
      return st;
    }
    h0.first_path = d.first_path_;

    // 2. The clean reference run.
    d.log("reference run: " + std::to_string(sc.classes.size()) + " classes");
    if (Status st = reference_pass(d); !st.ok()) {
      stop_all();
      return st;
    }

    // 3. Phases, with the sampler throughout.
    std::thread sampler_thread([&d] { sampler(d); });
    struct Joiner {
      Drill& d;
      std::thread& t;
      ~Joiner() {
        d.stop_sampler_.store(true);
        if (t.joinable()) t.join();
      }
    } sampler_joiner{d, sampler_thread};
    const double hard_deadline_ms = d.now_ms() + (sc.total_s() + sc.drain_s + 120.0) * 1000.0;
    uint64_t phase_index = 0;
    for (const Phase& ph : sc.phases) {
      ++phase_index;
      const double start = d.now_ms();
      const double end = start + ph.duration_s * 1000.0;
      d.event("phase", ph.name + " (" + std::to_string(static_cast<int>(ph.duration_s)) + " s; co-tenant " +
                           format_byte_size(ph.cotenant_bytes) + ", undeclared " +
                           format_byte_size(ph.undeclared_bytes) + ")");
      uint64_t load_index = 0;
      for (const Phase::Load& l : ph.load) {
        ++load_index;
        const RequestClass* cls = sc.find_class(l.cls);
        if (!cls || l.rate_per_s <= 0) continue;
        auto arrivals = std::make_shared<Arrivals>(sc.seed * 1000003 + phase_index * 1009 + load_index, cls,
                                                   l.rate_per_s, start, end, ph.name);
        for (int32_t i = 0; i < std::max(1, l.concurrency); ++i) {
          const int32_t id = d.next_client_++;
          d.spawn_worker([&d, arrivals, id] {
            while (auto a = arrivals->take()) {
              sleep_until_ms(d, a->first);
              if (d.abort_.load() || d.now_ms() >= arrivals->end_ms()) break;
              a->second.client = id;
              run_request(d, a->second);
            }
          });
        }
      }
      // The nemesis, on this thread: the phase's holdings, then its faults.
      cot.set(ph.cotenant_bytes, ph.undeclared_bytes);
      std::vector<FaultSpec> faults = ph.faults;
      std::stable_sort(faults.begin(), faults.end(), [](const FaultSpec& a, const FaultSpec& b) { return a.at_s < b.at_s; });
      for (const FaultSpec& f : faults) {
        sleep_until_ms(d, start + f.at_s * 1000.0);
        fire(d, f, ph, cot);
      }
      sleep_until_ms(d, end);
      if (o.on_phase_end) o.on_phase_end(ph.name, d.snapshot());
    }

    // 4. Drain: in-flight requests end, interrupted ones are continued.
    cot.stop_all();
    const double drain_end = d.now_ms() + sc.drain_s * 1000.0;
    d.event("drain", std::to_string(d.active()) + " clients still busy; waiting up to " +
                         std::to_string(static_cast<int>(sc.drain_s)) + " s");
    while (d.active() > 0 && d.now_ms() < std::min(drain_end, hard_deadline_ms)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (d.active() > 0) {
      d.event("drain_timeout", std::to_string(d.active()) + " clients still busy at the end of the drain: aborted");
      d.abort_.store(true);
    }
    d.join_workers();
    if (d.own_server_ && d.server_pid_.load() <= 0) {
      // It died on its own (recorded): start it once more to read the journal.
      if (Status st = start_server(d); st.ok()) d.event("restart", "for the final reads, after an unplanned exit");
    }
    d.abort_.store(false);
    read_finals(d);
    d.stop_sampler_.store(true);
    if (sampler_thread.joinable()) sampler_thread.join();
    const double duration = d.now_ms();
    stop_all();
    History h = d.take();
    h.duration_ms = duration;
    return h;
  } catch (const std::exception& e) {
    return Status::internal(std::string("live drill: unexpected exception: ") + e.what());
  }
}

}  // namespace spw::drill
