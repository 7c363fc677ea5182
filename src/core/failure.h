// Failure classification: what a failed Status means to every layer, decided
// in one place from its code and typed FailureReason (never from its text).
//
// Contract: classify(status) for a non-OK Status returns
//   http_status / type / code  the OpenAI-style error the HTTP layer answers
//                              with (code is failure_reason_name when a reason
//                              is set, else a name for the StatusCode);
//   resumable                  running the same request again later may
//                              succeed (nothing complete was delivered): the
//                              journal records it so, and an Idempotency-Key
//                              retry runs it again;
//   device_fault               the failure says the device itself is unwell
//                              (lost, out of memory against the plan, timed
//                              out, failed health check): the circuit breaker
//                              counts it; a client's error never does;
//   retry_elsewhere            a request that failed so BEFORE its first token
//                              may be retried at once on another path
//                              (failover at the request boundary).
// Classifying an OK Status is a programming error (returns a 500 class).
// Thread safety: pure function.
#pragma once

#include <string_view>

#include "core/status.h"

namespace spw {

struct FailureClass {
  int http_status = 500;
  std::string_view type = "server_error";  // OpenAI error "type"
  std::string_view code = "internal_error";
  bool resumable = false;
  bool device_fault = false;
  bool retry_elsewhere = false;
};

FailureClass classify(const Status& status);

}  // namespace spw
