// Read bandwidth of host memory, measured once at start: the figure a path's
// rate prior divides the bytes a decode step streams by (admission/prior.h).
//
// Contract: measure_read_bandwidth(env, options) maps a buffer of
// options.buffer_bytes (populated at map time, so the timed passes see no page
// faults), reads it options.passes times with options.n_threads threads each
// summing its own slice, and returns the bytes per second of the fastest pass,
// timed on env's monotonic clock (with one thread, on its CPU clock when that
// is less: time spent waiting for a core is the neighbours', not the
// memory's). The fastest pass, not the mean: the passes are short (a few ms
// each) and the machine may be shared, so the slower ones measure the
// neighbours, not the memory (8 passes: on 2 shared cores a
// pass of a few ms is often preempted; one of 8 rarely all are). Cost:
// mapping the buffer plus passes x buffer / bandwidth: 115-150 ms for 64 MiB
// on the reference machine, of which ~90 ms is its sandbox faulting the
// populated pages in again at the first pass (docs/PERFORMANCE.md, "Rate
// prior"); a 64 MiB populated mapping alone takes 14-45 ms there.
// InvalidArgument for n_threads < 1, passes < 1 or a buffer under 1 MiB; ResourceExhausted when the buffer cannot be mapped;
// Unavailable when env's clock did not advance over a pass (a simulated Env:
// inject the figure instead, GatewayOptions::host_bandwidth).
// The gateway passes the size of what a decode step reads when that is
// smaller (gateway/builder.cpp): a step rereads its weights every step, so a
// model that fits in the caches is read from them. Why 64 MiB by default: larger than the last-level cache one core reaches
// (Zen 5: 32 MiB of L3 per CCD; the OS may report the socket's sum, 512 MiB
// on the reference VM, which no single core sees), and small enough to map in
// tens of ms. A machine whose core-local LLC exceeds it reads partly from
// cache: pass a larger buffer_bytes there.
// Thread safety: reentrant; the threads it starts are joined before it returns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/env.h"
#include "core/status.h"

namespace spw::admission {

struct BandwidthProbeOptions {
  int n_threads = 1;                       // the path's own thread count
  size_t buffer_bytes = size_t{64} << 20;  // see above
  int passes = 8;
};

Result<double> measure_read_bandwidth(Env& env, const BandwidthProbeOptions& options);

// The probe's read loop (also bench/memory_bandwidth_bench's): the sum of
// n words through four independent accumulators, so that it is bound by the
// loads, not by one chain of adds.
uint64_t read_sum(const uint64_t* p, size_t n);

}  // namespace spw::admission
