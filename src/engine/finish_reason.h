// Why a generation ended, as one typed value from the engine up: the
// scheduler, the journal observer and the HTTP layer read it without
// comparing text. Text appears only where a format needs it: the checkpoint
// and journal columns (finish_reason_name / parse_finish_reason), and the
// OpenAI wire format (http, which also maps kStop to "tool_calls").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace spw {

// kNone: still running. kStop: an end-of-generation token, a stop token or a
// stop string. kLength: max_tokens or the end of the context. kCancelled: the
// caller cancelled it (Generator::cancel, or the run's cancel flag).
enum class FinishReason : uint8_t { kNone, kStop, kLength, kCancelled };

// "", "stop", "length", "cancelled".
constexpr std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kNone: break;
  }
  return "";
}

// The reason finish_reason_name spells as `name` ("" is kNone); nullopt for
// any other text (a corrupt or newer record).
constexpr std::optional<FinishReason> parse_finish_reason(std::string_view name) {
  for (FinishReason r : {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled}) {
    if (finish_reason_name(r) == name) return r;
  }
  return std::nullopt;
}

}  // namespace spw
