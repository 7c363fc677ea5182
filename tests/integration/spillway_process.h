// SpillwayProcess: the real `spillway` binary as a child process, for
// integration tests. Test-only, header-only.
//
// Server: `spillway serve` on the bundled model (or the --model given),
// 127.0.0.1, a free port
// (--port 0, read from the ready line within 60 s), one thread, a journal of
// its own in the temp folder (removed at the end) unless the flags name one,
// plus the given flags; SIGKILLed and reaped by the destructor unless it
// already exited (signal() + wait_exit()).
// run(): any `spillway` verb, waiting for its exit (bounded), with its exit
// code and stderr.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace spw::testing {

inline const std::string kStoriesModel = std::string(SPILLWAY_SOURCE_DIR) + "/models/stories260K.gguf";

class Server {
 public:
  explicit Server(std::vector<std::string> extra) {
    int out[2];
    if (pipe(out) != 0) return;
    std::vector<std::string> args = {SPILLWAY_BINARY, "serve", "--port", "0", "--threads", "1"};
    // The bundled model unless the test names another.
    if (std::find(extra.begin(), extra.end(), "--model") == extra.end()) args.insert(args.end(), {"--model", kStoriesModel});
    // Each server its own journal, unless the test names one (or none).
    if (std::find(extra.begin(), extra.end(), "--journal") == extra.end()) {
      static int n = 0;
      own_journal_ = (std::filesystem::temp_directory_path() /
                      ("spw-serve-" + std::to_string(getpid()) + "-" + std::to_string(++n) + ".sqlite"))
                         .string();
      args.insert(args.end(), {"--journal", own_journal_});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    ready_ = line.substr(0, line.find('\n'));
    std::smatch m;
    if (std::regex_search(ready_, m, std::regex("^spillway: listening on http://127\\.0\\.0\\.1:([0-9]+) "))) {
      port_ = std::stoi(m[1]);
    }
  }
  ~Server() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
    if (!own_journal_.empty()) remove_journal(own_journal_);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Still running (not exited, not killed by a signal).
  bool alive() const {
    int status = 0;
    return pid_ > 0 && !exited_ && waitpid(pid_, &status, WNOHANG) == 0;
  }
  // VmRSS from /proc/PID/status, in bytes (0: unreadable).
  uint64_t rss_bytes() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
    return 0;
  }
  const std::string& ready_line() const { return ready_; }
  void signal(int sig) { kill(pid_, sig); }
  // Exit status within `timeout`, or nullopt.
  std::optional<int> wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }

  static void remove_journal(const std::string& path) {
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::filesystem::remove(path + suffix);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  int port_ = 0;
  bool exited_ = false;
  std::string ready_;
  std::string own_journal_;
};

struct Finished {
  int exit_code = -1;  // -1: did not exit within the limit (killed)
  std::string err;     // stderr
};

// Starts `spillway ARGS...`; returns its pid and the read end of its stderr.
inline pid_t start(const std::vector<std::string>& verb_args, int* err_fd) {
  int err[2];
  if (pipe(err) != 0) return -1;
  std::vector<std::string> args = {SPILLWAY_BINARY};
  args.insert(args.end(), verb_args.begin(), verb_args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(err[1], 2);
    close(err[0]);
    close(err[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(err[1]);
  *err_fd = err[0];
  return pid;
}

// Waits (bounded) for a process from start(), reading its stderr meanwhile.
inline Finished wait_for(pid_t pid, int err_fd, std::chrono::seconds limit) {
  Finished f;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  for (;;) {
    pollfd p{err_fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[512];
      const ssize_t n = read(err_fd, buf, sizeof buf);
      if (n > 0) f.err.append(buf, static_cast<size_t>(n));
    }
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(err_fd);
      return f;
    }
  }
  for (;;) {  // the rest of stderr
    char buf[512];
    const ssize_t n = read(err_fd, buf, sizeof buf);
    if (n <= 0) break;
    f.err.append(buf, static_cast<size_t>(n));
  }
  close(err_fd);
  f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return f;
}

}  // namespace spw::testing
