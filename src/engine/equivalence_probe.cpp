#include "engine/equivalence_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/generate.h"

namespace spw {
namespace {

struct Top2 {
  TokenId best = 0;
  float first = -INFINITY;
  float second = -INFINITY;
};

// Argmax with ties to the lowest id, as the greedy sampler picks.
Top2 top2(std::span<const float> logits) {
  Top2 t;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (v > t.first) {
      t.second = t.first;
      t.first = v;
      t.best = static_cast<TokenId>(i);
    } else if (v > t.second) {
      t.second = v;
    }
  }
  return t;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

Result<std::vector<TokenId>> sample_tokens(Session& s, const std::vector<TokenId>& prompt, const EquivalenceOptions& o) {
  SPW_RETURN_IF_ERROR(s.truncate(0));
  GenerateOptions go;
  go.max_tokens = o.n_tokens;
  go.sampler.temperature = o.sampling_temperature;
  go.sampler.seed = o.seed;
  go.ignore_eos = true;
  SPW_ASSIGN_OR_RETURN(GenerateResult r, generate(s, prompt, go));
  return r.tokens;
}

}  // namespace

Result<EquivalenceVerdict> run_equivalence_probe(Session& a, Session& b, const EquivalenceOptions& o) {
  if (a.model().tokenizer().fingerprint() != b.model().tokenizer().fingerprint()) {
    return Status::failed_precondition("equivalence probe: sessions use different vocabularies");
  }
  if (o.require_same_model && a.model().fingerprint() != b.model().fingerprint()) {
    return Status::failed_precondition("equivalence probe: sessions serve different models (" +
                                       a.model().fingerprint() + " vs " + b.model().fingerprint() + ")");
  }
  const std::string kv_a(kv_type_name(a.kv_type())), kv_b(kv_type_name(b.kv_type()));
  if (o.require_same_kv_type && a.kv_type() != b.kv_type()) {
    return Status::failed_precondition("equivalence probe: sessions keep their KV as " + kv_a + " and " + kv_b +
                                       " (compare placements on the KV type they serve with)");
  }
  if (o.n_tokens < 1) return Status::invalid_argument("equivalence probe: n_tokens must be >= 1");
  const Tokenizer& tok = a.model().tokenizer();
  EquivalenceVerdict v;
  int64_t positions = 0, agree = 0;
  for (const std::string& text : o.prompts) {
    PromptEquivalence p;
    p.prompt = text;
    std::vector<TokenId> prompt = tok.encode(text, tok.add_bos_default());
    SPW_RETURN_IF_ERROR(a.truncate(0));
    SPW_RETURN_IF_ERROR(b.truncate(0));
    SPW_ASSIGN_OR_RETURN(auto la_span, a.eval(prompt));
    SPW_ASSIGN_OR_RETURN(auto lb_span, b.eval(prompt));
    std::vector<float> la(la_span.begin(), la_span.end()), lb(lb_span.begin(), lb_span.end());
    for (int32_t i = 0; i < o.n_tokens; ++i) {
      const Top2 ta = top2(la), tb = top2(lb);
      const float diff = max_abs_diff(la, lb);
      p.max_logit_diff = std::max(p.max_logit_diff, diff);
      ++p.n_positions;
      if (ta.best == tb.best) {
        ++p.n_agree;
      } else if (p.first_divergence < 0) {
        p.first_divergence = i;
        p.margin_at_divergence = ta.first - ta.second;
        p.near_tie = p.margin_at_divergence <= 2.0f * diff;
      }
      if (i + 1 == o.n_tokens || a.n_past() + 1 > a.n_ctx()) break;
      const TokenId next[1] = {ta.best};  // teacher forcing with A's token
      SPW_ASSIGN_OR_RETURN(la_span, a.eval(next));
      SPW_ASSIGN_OR_RETURN(lb_span, b.eval(next));
      la.assign(la_span.begin(), la_span.end());
      lb.assign(lb_span.begin(), lb_span.end());
    }
    SPW_ASSIGN_OR_RETURN(auto sa, sample_tokens(a, prompt, o));
    SPW_ASSIGN_OR_RETURN(auto sb, sample_tokens(b, prompt, o));
    p.sampled_equal = sa == sb;
    positions += p.n_positions;
    agree += p.n_agree;
    v.max_logit_diff = std::max(v.max_logit_diff, p.max_logit_diff);
    v.prompts.push_back(std::move(p));
  }
  v.agreement_rate = positions > 0 ? static_cast<double>(agree) / static_cast<double>(positions) : 1.0;
  v.equivalent = agree == positions && std::all_of(v.prompts.begin(), v.prompts.end(),
                                                   [](const PromptEquivalence& p) { return p.sampled_equal; });
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s: greedy agreement %.1f%% over %lld positions, max logit diff %.3g",
                v.equivalent ? "equivalent" : "NOT equivalent", 100.0 * v.agreement_rate,
                static_cast<long long>(positions), static_cast<double>(v.max_logit_diff));
  v.summary = buf;
  v.summary += a.kv_type() == b.kv_type() ? ", " + kv_a + " KV" : ", " + kv_a + " vs " + kv_b + " KV";
  for (const auto& p : v.prompts) {
    if (p.first_divergence >= 0) {
      std::snprintf(buf, sizeof buf, "; '%s' diverges at token %d (%s, margin %.3g)", p.prompt.c_str(),
                    p.first_divergence, p.near_tie ? "near-tie" : "not a near-tie",
                    static_cast<double>(p.margin_at_divergence));
      v.summary += buf;
    } else if (!p.sampled_equal) {
      v.summary += "; '" + p.prompt + "' seeded sampling differs";
    }
  }
  return v;
}

}  // namespace spw
