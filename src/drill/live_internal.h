// The live drill's private parts shared by its files (live.h is the
// contract): process helpers, the drill's shared context (clock, recorder,
// server control, HTTP client), a client's request plan, and the competing
// workload. live.cpp: the server, one HTTP exchange, a client's requests,
// arrivals, the sampler and run_live(); live_nemesis.cpp: the nemesis.
#pragma once

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

namespace spw::drill::live_detail {


using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- helpers

inline json parse_json(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? json() : j;
}
inline std::string jstr(const json& j, const char* k) {
  if (!j.is_object()) return "";
  auto it = j.find(k);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}
inline int64_t jint(const json& j, const char* k, int64_t dflt = 0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : dflt;
}
inline uint64_t juint(const json& j, const char* k) {
  const int64_t v = jint(j, k, 0);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}
inline double jdbl(const json& j, const char* k, double dflt = 0) {
  if (!j.is_object()) return dflt;
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : dflt;
}
inline bool jbool(const json& j, const char* k) {
  if (!j.is_object()) return false;
  auto it = j.find(k);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
inline std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// Starts argv[0] with stdin from /dev/null and stdout/stderr appended to the
// given files; every other descriptor is closed in the child (our client
// sockets must not outlive their connection in a co-tenant). -1 on failure.
inline pid_t spawn(const std::vector<std::string>& args, const std::string& out_path, const std::string& err_path) {
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
inline std::optional<int> wait_exit(pid_t pid, double timeout_s) {
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
inline void stop_process(pid_t pid, int sig, double grace_s) {
  if (pid <= 0) return;
  kill(pid, sig);
  if (sig != SIGKILL && wait_exit(pid, grace_s)) return;
  kill(pid, SIGKILL);
  (void)wait_exit(pid, 10);
}

inline uint64_t vm_rss(pid_t pid) {
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

inline std::string random_hex(int bytes) {
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
inline std::string occupy_device(const std::string& device) {
  const Result<Placement> p = Placement::parse(device);
  if (!p.ok() || p->vulkan_device.empty()) return "vulkan";
  return "vulkan:" + p->vulkan_device;
}

inline const char* mode_name(const std::string& overflow) {
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

inline std::unique_ptr<httplib::Client> client(const Drill& d, int read_timeout_s) {
  auto c = std::make_unique<httplib::Client>(d.host_, d.port_.load());
  c->set_connection_timeout(2, 0);
  c->set_read_timeout(read_timeout_s, 0);
  c->set_write_timeout(5, 0);
  return c;
}

// GET path -> (status, body); status 0: no answer.
inline std::pair<int, std::string> get(const Drill& d, const std::string& path, int timeout_s = 2,
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

inline bool wait_ready(Drill& d, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    if (!d.server_down_.load() && get(d, "/health/ready", 1).first == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

struct RequestPlan {
  const RequestClass* cls = nullptr;
  std::string phase;
  int32_t client = 0;
  bool idempotent = false;
  bool retry_after = false;  // send it again with the same key once ok
  uint64_t seed = 0;
};

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

// Defined in live.cpp.
Status start_server(Drill& d);
void run_request(Drill& d, const RequestPlan& p);
void sleep_until_ms(Drill& d, double t_ms);
// Defined in live_nemesis.cpp: fires one fault of phase `ph`.
void fire(Drill& d, const FaultSpec& f, const Phase& ph, CoTenants& cot);

}  // namespace spw::drill::live_detail
