#include "core/failure.h"

namespace spw {
namespace {

constexpr std::string_view kInvalid = "invalid_request_error";
constexpr std::string_view kServer = "server_error";
constexpr std::string_view kRate = "rate_limit_error";

FailureClass by_reason(FailureReason r) {
  const std::string_view code = failure_reason_name(r);
  switch (r) {
    case FailureReason::kInvalidField:
    case FailureReason::kContextFull:
      return {400, kInvalid, code, false, false, false};
    case FailureReason::kQueueFull:
      return {429, kRate, code, true, false, false};
    case FailureReason::kKvExhausted:
      // The pool is shared: another path (or a later try) may have the blocks.
      return {429, kRate, code, true, false, true};
    case FailureReason::kHostMemoryExhausted:
    case FailureReason::kNoPath:
    case FailureReason::kShuttingDown:
      return {503, kServer, code, true, false, false};
    case FailureReason::kDeviceOutOfMemory:
    case FailureReason::kDeviceLost:
    case FailureReason::kUnhealthy:
      return {503, kServer, code, true, true, true};
    case FailureReason::kTimeout:
      return {504, kServer, code, true, true, true};
    case FailureReason::kCancelled:
      return {499, kServer, code, true, false, false};
    case FailureReason::kJournalUnavailable:
      return {503, kServer, code, true, false, false};
    case FailureReason::kJournalFull:
      // Room comes back as running requests finish and their rows become
      // prunable: worth retrying later, on this server (not a device fault).
      return {503, kServer, code, true, false, false};
    case FailureReason::kIdempotencyConflict:
      return {409, kInvalid, code, false, false, false};
    case FailureReason::kResumable:
      // Interrupted after text was streamed: POST /v1/requests/{id}/resume
      // continues it; never a device verdict of its own (the fault that
      // caused it was counted where it happened).
      return {503, kServer, code, true, false, false};
    case FailureReason::kNotSafePoint:
      return {409, kInvalid, code, true, false, false};
    case FailureReason::kNotResumable:
      return {409, kInvalid, code, false, false, false};
    case FailureReason::kReplayMismatch:
      // The regenerated text differs from what the client holds: continuing
      // would splice two different generations, so it ends here.
      return {409, kInvalid, code, false, false, false};
    case FailureReason::kNone:
      break;
  }
  return {};
}

FailureClass by_code(StatusCode c) {
  switch (c) {
    case StatusCode::kInvalidArgument: return {400, kInvalid, "invalid_value", false, false, false};
    case StatusCode::kNotFound: return {404, kInvalid, "not_found", false, false, false};
    case StatusCode::kResourceExhausted: return {429, kRate, "resource_exhausted", true, false, false};
    case StatusCode::kUnavailable: return {503, kServer, "unavailable", true, false, false};
    case StatusCode::kDeviceLost: return {503, kServer, "device_lost", true, true, true};
    case StatusCode::kCancelled: return {499, kServer, "cancelled", true, false, false};
    case StatusCode::kDeadlineExceeded: return {504, kServer, "deadline_exceeded", true, true, true};
    case StatusCode::kFailedPrecondition: return {409, kInvalid, "failed_precondition", false, false, false};
    default: return {500, kServer, "internal_error", false, false, false};
  }
}

}  // namespace

FailureClass classify(const Status& status) {
  if (status.ok()) return {};
  if (status.reason() != FailureReason::kNone) return by_reason(status.reason());
  return by_code(status.code());
}

}  // namespace spw
