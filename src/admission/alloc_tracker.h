// Test-only heap accounting: replaces the global operator new/delete of the
// binary it is linked into, so tests can measure what the engine allocates
// (bytes requested, live and peak) without hooks in the engine.
//
// Contract: every replaceable operator new/delete form (plain, array,
// nothrow, aligned) records the requested size; live() is the bytes currently
// allocated through them, peak() the maximum of live() since reset_peak().
// Memory from malloc() directly is not seen. Counters are atomics, so
// allocations on worker threads are included.
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>

namespace spw::admission::testing {

int64_t live_bytes();
int64_t peak_bytes();
void reset_peak();  // peak := live

// Peak growth over live bytes at construction, during the scope's lifetime.
class PeakScope {
 public:
  PeakScope() : base_(live_bytes()) { reset_peak(); }
  int64_t peak_delta() const { return peak_bytes() - base_; }
  int64_t live_delta() const { return live_bytes() - base_; }

 private:
  int64_t base_;
};

}  // namespace spw::admission::testing
