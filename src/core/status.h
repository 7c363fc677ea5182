// Status and Result<T>: errors as values.
//
// Contract: a Status is either OK (no message) or carries a code and a
// human-readable message naming what failed (field, offset, value). A Status
// may also carry a typed FailureReason and the request field it concerns:
// that, not the message text, is what other layers act on (core/failure.h
// classifies it once for HTTP, the journal and the breaker). The message is
// for people only; no code may search it. Result<T>
// holds either a T or a non-OK Status. Neither throws; accessing value() of an
// error Result is a programming error (asserts in debug builds).
// Thread safety: immutable values; safe to copy across threads.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace spw {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kCorruption,
  kIOError,
  kResourceExhausted,
  kUnavailable,
  kDeviceLost,
  kCancelled,
  kDeadlineExceeded,
  kUnimplemented,
  kFailedPrecondition,
  kInternal,
};

std::string_view status_code_name(StatusCode code);

// Why a request could not be served, beyond the generic code. kNone: the code
// alone says it (a library error with no request meaning). Stable names
// (failure_reason_name) appear in HTTP error codes and journal records.
enum class FailureReason : uint8_t {
  kNone = 0,
  kInvalidField,         // a request field is wrong; field() names it
  kContextFull,          // the prompt does not fit the context limit
  kQueueFull,            // the chosen path's queue is full
  kKvExhausted,          // the KV pool has not the blocks for prompt + max_tokens
  kDeviceOutOfMemory,    // the device (or its budget) refused an allocation
  kHostMemoryExhausted,  // the host budget cannot hold the request
  kNoPath,               // no execution path can serve the request now
  kShuttingDown,         // the server stops accepting
  kDeviceLost,           // driver reset / device lost
  kTimeout,              // a device wait or a deadline ran out
  kCancelled,            // the client or an operator cancelled
  kJournalUnavailable,   // the request journal could not record it
  kIdempotencyConflict,  // the Idempotency-Key is in flight or bound to another body
  kUnhealthy,            // a health check failed
  kResumable,            // generation stopped after text was streamed; its checkpoint is kept for a resume
  kNotSafePoint,         // a checkpoint here could not be migrated or resumed (e.g. inside a tool call)
  kReplayMismatch,       // a resumed generation regenerated text that differs from what the client has
  kJournalFull,          // the request journal's size budget is held by requests still running or resumable
  kNotResumable,         // a resume names a request that has nothing to continue (finished, no checkpoint, running)
};
inline constexpr int kNumFailureReasons = 20;
std::string_view failure_reason_name(FailureReason r);  // "queue_full", "kv_exhausted", ...

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  Status(StatusCode code, std::string message, FailureReason reason, std::string field = {})
      : code_(code), message_(std::move(message)), reason_(reason), field_(std::move(field)) {}

  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status device_lost(std::string m) { return {StatusCode::kDeviceLost, std::move(m)}; }
  static Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  FailureReason reason() const { return reason_; }
  // The request field the failure concerns ("max_tokens", "prompt"); empty: none.
  const std::string& field() const { return field_; }
  // A copy with the typed reason (and field) set; OK stays OK.
  Status with_reason(FailureReason reason, std::string field = {}) const;
  // "Corruption: tensor 'x' data ends past file end (offset 123)".
  std::string to_string() const;

  // Returns a copy with `context` prepended to the message ("context: message").
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  FailureReason reason_ = FailureReason::kNone;
  std::string field_;
};

// InvalidArgument about one request field: reason kInvalidField, field set.
inline Status invalid_field(std::string field, std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message), FailureReason::kInvalidField, std::move(field));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace spw

#define SPW_CONCAT_INNER(a, b) a##b
#define SPW_CONCAT(a, b) SPW_CONCAT_INNER(a, b)

#define SPW_RETURN_IF_ERROR(expr)             \
  do {                                        \
    ::spw::Status spw_status_ = (expr);       \
    if (!spw_status_.ok()) return spw_status_; \
  } while (0)

#define SPW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// SPW_ASSIGN_OR_RETURN(auto x, make_x()); returns the error Status if any.
#define SPW_ASSIGN_OR_RETURN(lhs, expr) \
  SPW_ASSIGN_OR_RETURN_IMPL(SPW_CONCAT(spw_result_, __LINE__), lhs, expr)
