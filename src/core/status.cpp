#include "core/status.h"

namespace spw {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDeviceLost: return "DeviceLost";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string_view failure_reason_name(FailureReason r) {
  switch (r) {
    case FailureReason::kNone: return "none";
    case FailureReason::kInvalidField: return "invalid_value";
    case FailureReason::kContextFull: return "context_length_exceeded";
    case FailureReason::kQueueFull: return "queue_full";
    case FailureReason::kKvExhausted: return "kv_exhausted";
    case FailureReason::kDeviceOutOfMemory: return "device_out_of_memory";
    case FailureReason::kHostMemoryExhausted: return "host_memory_exhausted";
    case FailureReason::kNoPath: return "no_path";
    case FailureReason::kShuttingDown: return "shutting_down";
    case FailureReason::kDeviceLost: return "device_lost";
    case FailureReason::kTimeout: return "timeout";
    case FailureReason::kCancelled: return "cancelled";
    case FailureReason::kJournalUnavailable: return "journal_unavailable";
    case FailureReason::kIdempotencyConflict: return "idempotency_conflict";
    case FailureReason::kUnhealthy: return "unhealthy";
    case FailureReason::kResumable: return "resumable";
    case FailureReason::kNotSafePoint: return "not_safe_point";
    case FailureReason::kReplayMismatch: return "replay_mismatch";
    case FailureReason::kJournalFull: return "journal_full";
    case FailureReason::kNotResumable: return "not_resumable";
  }
  return "unknown";
}

Status Status::with_reason(FailureReason reason, std::string field) const {
  if (ok()) return *this;
  Status s = *this;
  s.reason_ = reason;
  s.field_ = std::move(field);
  return s;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string s(status_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m), reason_, field_);
}

}  // namespace spw
