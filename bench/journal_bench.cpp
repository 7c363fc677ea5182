// Cost of Journal::save_checkpoint on a real journal file (WAL, synchronous=
// FULL, as the server runs it: every call is a commit that reaches the disk
// before it returns) for checkpoints of 1 KiB, 16 KiB and 128 KiB, and of
// mark_running on the same file for comparison (a small row update: the
// commit's fixed cost). How often a worker may checkpoint follows from these:
// a save that costs a sizeable share of a token's time must be rarer than
// every token. The file lives in a fresh folder under the temporary directory
// (TMPDIR, else /tmp): point TMPDIR at the disk the journal will live on, since
// the fsync dominates and differs by device and filesystem.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/env.h"
#include "journal/journal.h"

namespace {

namespace fs = std::filesystem;
using spw::journal::Journal;

// A journal in its own folder, removed with it; one running request to write to.
class BenchJournal {
 public:
  explicit BenchJournal(const std::string& name) {
    dir_ = fs::temp_directory_path() / ("spw-journal-bench-" + std::to_string(getpid()) + "-" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto j = Journal::open(spw::Env::default_env(), (dir_ / "journal.sqlite").string());
    if (!j.ok()) {
      error_ = j.status().to_string();
      return;
    }
    journal_ = std::move(*j);
    auto a = journal_->accept({"", "/v1/completions", R"({"prompt":"Once upon a time","max_tokens":256})", ""});
    if (!a.ok()) {
      error_ = a.status().to_string();
      return;
    }
    id_ = a->record.id;
    const spw::Status st = journal_->mark_running(id_, "vulkan");
    if (!st.ok()) error_ = st.to_string();
  }
  ~BenchJournal() {
    journal_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Journal* journal() { return journal_.get(); }
  int64_t id() const { return id_; }
  const std::string& error() const { return error_; }

 private:
  fs::path dir_;
  std::unique_ptr<Journal> journal_;
  int64_t id_ = 0;
  std::string error_;
};

// Opaque bytes as a checkpoint holds them: pseudo-random, NULs included.
std::string checkpoint_bytes(size_t n) {
  std::string b(n, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = static_cast<char>(x);
  }
  return b;
}

void BM_SaveCheckpoint(benchmark::State& state) {
  BenchJournal bj("save-" + std::to_string(state.range(0)));
  if (!bj.error().empty()) {
    state.SkipWithError(bj.error().c_str());
    return;
  }
  const std::string bytes = checkpoint_bytes(static_cast<size_t>(state.range(0)));
  int32_t tokens = 0;
  for (auto _ : state) {
    const spw::Status st = bj.journal()->save_checkpoint(bj.id(), bytes, ++tokens);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SaveCheckpoint)->Arg(1 << 10)->Arg(16 << 10)->Arg(128 << 10)->Unit(benchmark::kMicrosecond);

// The same commit without a payload: a running row's placement rewritten.
void BM_MarkRunning(benchmark::State& state) {
  BenchJournal bj("mark-running");
  if (!bj.error().empty()) {
    state.SkipWithError(bj.error().c_str());
    return;
  }
  for (auto _ : state) {
    const spw::Status st = bj.journal()->mark_running(bj.id(), "vulkan");
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
}
BENCHMARK(BM_MarkRunning)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
