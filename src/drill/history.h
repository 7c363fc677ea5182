// History: what a drill saw, recorded Jepsen-style, for the checker.
//
// Every client operation is recorded twice: an `invoke` when it is sent and
// one completion: `ok` (the operation succeeded and the client has its whole
// result), `fail` (the server answered with a definite refusal or error: the
// operation did not take effect, or took effect only as the journal records),
// or `info` (the outcome is unknown to the client: the connection broke, the
// server died). Completions carry what the client received, verbatim where it
// matters (the text). A request later continued (resume, idempotent retry)
// is a new operation that names the one it continues (`continues`).
// Beside the operations: samples of the server's state taken on a period
// (memory, queues, breakers), nemesis events (faults armed, kills, restarts,
// co-tenant steps), the journal's final record of every request id the
// clients were given (read back after the run), and the reference texts of a
// clean run.
// Contract: plain values; history_to_json / history_from_json round-trip
// every field (report.json embeds the history; --replay of a saved history
// reruns the checker). Times are milliseconds from the start of the drill on
// the drill's clock (real for live, simulated for the simulation).
// Thread safety: values; a recorder that appends from several client threads
// must lock around it (HistoryRecorder does).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace spw::drill {

enum class OpType { kInvoke, kOk, kFail, kInfo };
const char* op_type_name(OpType t);  // "invoke", "ok", "fail", "info"

struct Op {
  int64_t index = 0;     // position in the history (set by the recorder)
  int64_t op_id = 0;     // the same for an invoke and its completion
  int32_t client = 0;    // which client thread (Jepsen's process)
  OpType type = OpType::kInvoke;
  double t_ms = 0;
  std::string f = "complete";  // complete | resume | retry | cancel | read
  int64_t continues = 0;       // op_id of the operation this one continues (resume, retry); 0: none
  std::string phase;           // phase it was invoked in
  // The request (on invoke; copied onto the completion for convenience).
  std::string cls;             // request class name
  std::string prompt_key;      // class + sampling: requests with one key expect one text
  bool stream = true;
  bool greedy = true;
  uint64_t seed = 0;
  int32_t max_tokens = 0;
  std::string idempotency_key;  // "" = none
  // What the client received (completions).
  int32_t http_status = 0;      // 0: no HTTP answer at all
  std::string error_code;       // the OpenAI error body's code ("resumable", "queue_full", ...)
  std::string error_message;
  int64_t request_id = 0;       // journal id the server gave (0: none seen)
  bool accepted = false;        // the server acknowledged it (a request id, a 200 or a first chunk)
  std::string path, placement, model;  // the `spillway` object's, at the end
  std::string decision;         // admit | delay | shrink | offload | redirect | reject
  std::string reason;
  bool degraded = false;        // served (or queued) anywhere but the first-choice path
  // A degraded response showed what it was: the spillway object had
  // degraded=true, its path, model, limits and estimated delay, from the
  // first chunk (stream) or in the body.
  bool degraded_shown = false;
  bool replayed = false;        // an idempotent replay of a stored result
  std::string text;             // every byte of text received, in order
  int32_t completion_tokens = 0;
  std::string finish_reason;
  double ttft_ms = -1;          // first text from invoke (-1: none)
  double latency_ms = -1;       // completion from invoke
  double queue_ms = -1;         // the server's reported queue wait (-1: not reported)
  int32_t failovers = 0, migrations = 0;
};

// The server's state at one moment (GET /v1/status and the process's RSS).
struct PathSample {
  std::string name;
  int32_t queue_depth = 0, running = 0;
  double oldest_queued_s = 0;
  std::string breaker;          // closed | open | half_open | "" (none)
};
struct Sample {
  double t_ms = 0;
  bool up = true;               // false: the server did not answer
  std::vector<PathSample> paths;
  // The device ledger (first GPU path's), bytes.
  uint64_t device_capacity = 0, device_limit = 0;   // limit = capacity - headroom (the reserve line)
  uint64_t device_ours = 0, device_cotenants = 0, device_used = 0;
  // The host ledger and the server process.
  uint64_t host_budget = 0, host_reserved = 0;
  uint64_t host_rss = 0;        // VmRSS of the server process (0: not readable)
  // The competing workload's holding at this moment (declared + undeclared).
  uint64_t competing_bytes = 0;
};

struct Event {
  double t_ms = 0;
  std::string kind;    // fault kinds, "breaker_open", "breaker_closed", "restart", "phase", ...
  std::string detail;
};

// The journal's record of a request id, read back after the run.
struct FinalRecord {
  int64_t request_id = 0;
  bool found = false;     // GET /v1/requests/{id} answered with a record
  std::string state;      // done | failed | cancelled | running | queued | accepted ...
  std::string error_code;
  std::string text;       // the stored result text ("" when none)
  std::string placement;
  // On a GPU-side path at admission: whether its device's reserved memory
  // plus this request's need stayed under the reserve line (from the stored
  // decision); nullopt: not on a GPU-side path, or not recorded.
  std::optional<bool> admitted_under_reserve;
  int32_t runs = 1;       // generations started for it (attempts), where known
};

struct History {
  std::string scenario;
  std::string mode;             // "live" | "simulation" | baseline names
  uint64_t seed = 0;
  double duration_ms = 0;
  std::string first_path = "gpu";  // the first-choice path (degraded = anything else)
  std::vector<Op> ops;
  std::vector<Sample> samples;
  std::vector<Event> events;
  std::map<int64_t, FinalRecord> finals;           // by request id
  std::map<std::string, std::string> reference;   // prompt_key -> text of the clean run
};

// Appends operations from several client threads (index assigned in order).
class HistoryRecorder {
 public:
  // Returns the op with index and op_id set: index = its position in ops
  // (from 0), op_id = index + 1 for an invoke, so that 0 never names an
  // operation (Op::continues = 0 means none). type is set to invoke.
  Op invoke(Op op);
  // Appends the completion (result.type: ok | fail | info; an invoke type is
  // recorded as info) with the invoke's op_id and its request fields (client,
  // f, continues, phase, cls, prompt_key, stream, greedy, seed, max_tokens,
  // idempotency_key) copied over; t_ms and what was received are result's.
  void complete(const Op& invoked, Op result);
  void add_sample(Sample s);
  void add_event(Event e);
  History take();               // moves the history out (call once, at the end)
  History& unsafe_history() { return h_; }  // before any thread starts

 private:
  std::mutex mu_;
  History h_;
};

// One JSON document: {"scenario", "mode", "seed", "duration_ms",
// "first_path", "ops": [...], "samples": [...], "events": [...],
// "finals": [{"request_id", ...}, ...], "reference": {prompt_key: text}};
// every struct field under its own name, op types by op_type_name, an unset
// admitted_under_reserve as null. Text that is not valid UTF-8 is written
// with U+FFFD in place of the bad bytes (JSON cannot carry them).
std::string history_to_json(const History& h);
// The inverse. Missing fields keep their defaults (older files); a field of
// the wrong type, an unknown op type, or a document that is not an object
// with an "ops" array is InvalidArgument naming the field ("ops[3].t_ms").
Result<History> history_from_json(const std::string& text);

}  // namespace spw::drill
