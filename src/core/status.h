// Status and Result<T>: errors as values.
//
// Contract: a Status is either OK (no message) or carries a code and a
// human-readable message naming what failed (field, offset, value). Result<T>
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

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

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
  // "Corruption: tensor 'x' data ends past file end (offset 123)".
  std::string to_string() const;

  // Returns a copy with `context` prepended to the message ("context: message").
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

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
