// Equivalence probe: do two placements of a model produce the same tokens?
//
// Contract: run_equivalence_probe() feeds each prompt to both sessions and
// decodes n_tokens greedily in lockstep, always continuing with session A's
// token (teacher forcing, so one divergence does not hide later agreement). At
// every position it compares the two argmax tokens and the logits: the largest
// absolute logit difference, and at a divergence the top-1/top-2 margin of A's
// logits, which classifies it as a near-tie (margin <= 2 x the logit
// difference at that position: rounding differences can flip it) or a real
// difference. Then it samples n_tokens with the same seed on both (Generator,
// temperature `sampling_temperature`) and compares the token lists.
// The verdict is equivalent only when every greedy position and every seeded
// run agree. The server migrates a request only between placements whose
// probe passed (design invariant 6).
// Both sessions must serve the same model file (FailedPrecondition otherwise,
// unless require_same_model is off; the vocabularies must match in any case)
// and keep their KV in the same element type (Session::kv_type; unless
// require_same_kv_type is off): a placement is verified on the KV type it
// serves with, which the summary names ("..., f16 KV")
// and are truncated to 0 before each prompt; their KV is left holding the last
// run. Errors from the sessions (ResourceExhausted for a too-long prompt, a
// device error) are returned as they are.
// Thread safety: uses both sessions from the calling thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/session.h"

namespace spw {

struct EquivalenceOptions {
  std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Ben went to the park"};
  int32_t n_tokens = 32;
  float sampling_temperature = 0.8f;
  uint64_t seed = 42;
  // Off only to measure how far two different files of one model (say F32 and
  // Q8_0) are apart; a migration decision always requires the same model.
  bool require_same_model = true;
  // Off only to measure what the KV type itself changes (f16 vs f32).
  bool require_same_kv_type = true;
};

struct PromptEquivalence {
  std::string prompt;
  int32_t n_positions = 0;         // greedy positions compared
  int32_t n_agree = 0;             // positions with equal argmax
  int32_t first_divergence = -1;   // generated-token index, -1 when none
  float max_logit_diff = 0.0f;     // over all positions
  float margin_at_divergence = 0;  // A's top-1 minus top-2 logit there
  bool near_tie = false;           // divergence explained by a near-tie
  bool sampled_equal = true;       // seeded sampling gave identical tokens
};

struct EquivalenceVerdict {
  bool equivalent = false;
  double agreement_rate = 0.0;  // agreeing greedy positions / all positions
  float max_logit_diff = 0.0f;
  std::vector<PromptEquivalence> prompts;
  std::string summary;  // one line for logs and `spillway` output
};

Result<EquivalenceVerdict> run_equivalence_probe(Session& a, Session& b, const EquivalenceOptions& options = {});

}  // namespace spw
