#include "core/env.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

namespace spw {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

class PosixMappedFile final : public MappedFile {
 public:
  PosixMappedFile(std::string path, void* addr, size_t size)
      : path_(std::move(path)), addr_(addr), size_(size) {}
  ~PosixMappedFile() override {
    if (addr_ != nullptr && size_ > 0) munmap(addr_, size_);
  }
  const uint8_t* data() const override { return static_cast<const uint8_t*>(addr_); }
  size_t size() const override { return size_; }
  const std::string& path() const override { return path_; }
  Status page_in() const override {
    if (addr_ == nullptr || size_ == 0) return Status::ok_status();
    if (::madvise(addr_, size_, MADV_WILLNEED) != 0) {
      return Status::io_error("madvise(WILLNEED) '" + path_ + "': " + errno_text(errno));
    }
    // WILLNEED only starts readahead; touching one byte per page maps them all.
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const volatile uint8_t* p = static_cast<const uint8_t*>(addr_);
    uint8_t sink = 0;
    for (size_t off = 0; off < size_; off += page) sink ^= p[off];
    (void)sink;
    return Status::ok_status();
  }
  Status page_out() const override {
    if (addr_ == nullptr || size_ == 0) return Status::ok_status();
    if (::madvise(addr_, size_, MADV_DONTNEED) != 0) {
      return Status::io_error("madvise(DONTNEED) '" + path_ + "': " + errno_text(errno));
    }
    return Status::ok_status();
  }
  Status page_out(size_t offset, size_t length) const override {
    if (addr_ == nullptr || offset >= size_) return Status::ok_status();
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t end = range_end(offset, length) / page * page;
    const size_t begin = (offset + page - 1) / page * page;
    if (begin >= end) return Status::ok_status();
    if (::madvise(static_cast<uint8_t*>(addr_) + begin, end - begin, MADV_DONTNEED) != 0) {
      return Status::io_error("madvise(DONTNEED) '" + path_ + "': " + errno_text(errno));
    }
    return Status::ok_status();
  }
  bool resident(size_t offset, size_t length) const override {
    if (addr_ == nullptr || offset >= size_ || length == 0) return true;
    const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t begin = offset / page * page;
    const size_t end = range_end(offset, length);
    std::vector<unsigned char> vec((end - begin + page - 1) / page);
    if (::mincore(static_cast<uint8_t*>(addr_) + begin, end - begin, vec.data()) != 0) return false;
    for (unsigned char v : vec)
      if ((v & 1) == 0) return false;
    return true;
  }

 private:
  // offset + length, clamped to the file (offset < size_).
  size_t range_end(size_t offset, size_t length) const { return length > size_ - offset ? size_ : offset + length; }

  std::string path_;
  void* addr_;
  size_t size_;
};

class MemoryFile final : public MappedFile {
 public:
  MemoryFile(std::string bytes, std::string name) : bytes_(std::move(bytes)), name_(std::move(name)) {}
  const uint8_t* data() const override { return reinterpret_cast<const uint8_t*>(bytes_.data()); }
  size_t size() const override { return bytes_.size(); }
  const std::string& path() const override { return name_; }

 private:
  std::string bytes_;
  std::string name_;
};

class PosixEnv final : public Env {
 public:
  int64_t now_ns() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t wall_time_ms() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t thread_cpu_ns() override {
    timespec ts{};
    if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return now_ns();
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  void sleep_for_ns(int64_t ns) override {
    if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  }
  // now_ns() is steady_clock's count since its epoch, so the deadline is a
  // steady_clock time point as it stands: one absolute wait, no drift from
  // converting to a relative timeout.
  bool wait_until_ns(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, int64_t deadline_ns) override {
    if (now_ns() >= deadline_ns) return false;
    const std::chrono::steady_clock::time_point deadline(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::nanoseconds(deadline_ns)));
    cv.wait_until(lock, deadline);
    // Judged on the clock, not on cv_status, so "false" means exactly that
    // now_ns() reached the deadline.
    return now_ns() < deadline_ns;
  }
  uint64_t random_u64() override {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  Result<std::unique_ptr<MappedFile>> map_file(const std::string& path, const MapOptions& options) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::io_error("cannot open '" + path + "': " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return Status::io_error("cannot stat '" + path + "': " + errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::invalid_argument("'" + path + "' is not a regular file");
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* addr = nullptr;
    if (size > 0) {
      addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | (options.prefault ? MAP_POPULATE : 0), fd, 0);
      if (addr == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return Status::io_error("cannot mmap '" + path + "': " + errno_text(err));
      }
    }
    ::close(fd);  // the mapping keeps the file alive
    return std::unique_ptr<MappedFile>(new PosixMappedFile(path, addr, size));
  }

  Result<std::string> read_file(const std::string& path) override {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::io_error("cannot open '" + path + "': " + errno_text(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return Status::io_error("cannot read '" + path + "'");
    return ss.str();
  }

  Status write_file(const std::string& path, std::string_view data) override {
    std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::io_error("cannot create '" + tmp + "': " + errno_text(errno));
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd, data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        return Status::io_error("cannot write '" + tmp + "': " + errno_text(err));
      }
      off += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) {
      int err = errno;
      ::close(fd);
      return Status::io_error("cannot fsync '" + tmp + "': " + errno_text(err));
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return Status::io_error("cannot rename '" + tmp + "' to '" + path + "': " + errno_text(errno));
    }
    return Status::ok_status();
  }

  bool file_exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
};

}  // namespace

Env& Env::default_env() {
  static PosixEnv* env = new PosixEnv();  // never destroyed: used by static teardown
  return *env;
}

std::unique_ptr<MappedFile> make_memory_file(std::string bytes, std::string name) {
  return std::make_unique<MemoryFile>(std::move(bytes), std::move(name));
}

}  // namespace spw
