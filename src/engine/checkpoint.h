// Checkpoint: the complete state of a generation at a token boundary.
//
// Contract: a Checkpoint holds everything needed to continue a generation on
// any backend/device with an identical outcome: all tokens so far (prompt +
// generated), how many are prompt, the sampler state (RNG words and penalty
// window), the StopMatcher's held text, the Utf8Stream's pending bytes, the text
// emitted so far, the options and the model's compatibility fingerprint. The KV
// cache is NOT part of it: resume re-evaluates the tokens. It records the KV
// element type the generated tokens were chosen with (kv_type: "f32", "f16",
// "q8_0"; "" while none was generated, as in start_checkpoint): the same tokens on a KV
// of another type give other logits, so Generator::resume refuses a session
// of another KV type (FailedPrecondition naming both) rather than continue
// with an outcome the checkpoint does not promise.
// serialize_checkpoint() writes a versioned little-endian binary format:
//   "SPWCKPT\0" | u32 version | u64 payload_size | payload | u64 FNV-1a(payload)
// where payload is the fields in declaration order (strings and arrays are a
// u32 count then the items; floats as IEEE-754 bit patterns). Version 2 added
// kv_type at the end of the payload; version 3 after it the OpenAI/vLLM
// options: sampler.frequency_penalty, sampler.presence_penalty,
// sampler.logit_bias (u32 count, then i32 id and f32 bias each, in the
// options' order), options.min_tokens, options.stop_token_ids (ids); version
// 4 after them options.constraint (response_format): u8 kind (0 none, 1
// json_object, 2 json_schema) and the schema text. Older versions still
// parse (kv_type "": not recorded; the version 3 and 4 fields at their
// defaults, which is what those requests ran with). The grammar's state is
// not stored: it is a function of the generated tokens, and
// Generator::resume rebuilds it by feeding their bytes through the grammar
// again (engine/output_constraint.h). The counts the
// frequency and presence penalties use are not stored: resume rebuilds them
// from the generated tokens (engine/sampler.h).
// parse_checkpoint() returns Corruption naming the field for a bad magic,
// truncation, checksum mismatch, trailing bytes or inconsistent counts, and
// InvalidArgument for an unknown version.
// Safe points: a checkpoint is a safe point (check_safe_point OK) unless the
// generation has already finished (nothing is left to continue) or its text
// ends inside one of SafePointRules::spans: the last `open` marker in the
// emitted text is not followed by its `close` (say, inside a tool call, whose
// arguments must come from one run). Migration and resume only start from a
// safe point; FailedPrecondition with FailureReason::kNotSafePoint naming the
// open span otherwise. O(text) per check: callers check at checkpoint
// intervals and at failures, not per token.
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/generate.h"
#include "engine/sampler.h"

namespace spw {

struct Checkpoint {
  static constexpr uint32_t kVersion = 4;

  std::string model_fingerprint;
  std::vector<TokenId> tokens;  // prompt + generated
  int32_t n_prompt = 0;
  int32_t n_generated = 0;      // tokens.size() - n_prompt
  SamplerState sampler;
  std::string stop_held;
  std::string utf8_pending;
  std::string text;             // emitted so far
  FinishReason finish_reason = FinishReason::kNone;  // kNone unless the generation had already finished
  GenerateOptions options;
  std::string kv_type;          // KvType name the generated tokens were chosen with; "" = none yet
  // Log-probability entries not released yet (generate.h): in memory only,
  // for a migration within the process; not serialized, not compared. A
  // checkpoint read back from its bytes has none (nor options.logprobs).
  std::vector<PendingLogprobs> logprobs_pending;

  bool operator==(const Checkpoint& o) const;
};

// Marker pairs inside which a generation must not be split (see above).
struct SafePointRules {
  struct Span {
    std::string open, close;
  };
  std::vector<Span> spans;
  bool empty() const { return spans.empty(); }
};
Status check_safe_point(const Checkpoint& checkpoint, const SafePointRules& rules);

// The checkpoint of a generation that has started and produced nothing yet:
// the prompt, the sampler as `options.sampler` seeds it, no text. Resuming it
// is running the request from its prompt (a request interrupted before its
// first checkpoint continues from here; a greedy or client-seeded run gives
// the same text as the original one).
Checkpoint start_checkpoint(std::string model_fingerprint, std::vector<TokenId> prompt, GenerateOptions options);

std::string serialize_checkpoint(const Checkpoint& checkpoint);
Result<Checkpoint> parse_checkpoint(std::string_view bytes);

}  // namespace spw
