#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace spw {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

Status check_finite(float v, const char* field) {
  if (!std::isfinite(v)) {
    return invalid_field(field, std::string("sampler param ") + field + " must be finite, got " + std::to_string(v));
  }
  return Status::ok_status();
}

Status check_count_penalty(float v, const char* field) {
  SPW_RETURN_IF_ERROR(check_finite(v, field));
  if (v < -kMaxCountPenalty || v > kMaxCountPenalty) {
    return invalid_field(field, std::string("sampler param ") + field + " must be in [-2, 2], got " +
                                    std::to_string(v));
  }
  return Status::ok_status();
}

Status check_logit_bias(const std::vector<LogitBias>& biases) {
  if (biases.size() > kMaxLogitBias) {
    return invalid_field("logit_bias", "sampler param logit_bias may hold at most " + std::to_string(kMaxLogitBias) +
                                           " entries, got " + std::to_string(biases.size()));
  }
  std::vector<TokenId> ids;
  ids.reserve(biases.size());
  for (const LogitBias& b : biases) {
    if (b.id < 0) {
      return invalid_field("logit_bias", "sampler param logit_bias: token id " + std::to_string(b.id) + " is negative");
    }
    if (!std::isfinite(b.bias) || b.bias < -kMaxLogitBiasValue || b.bias > kMaxLogitBiasValue) {
      return invalid_field("logit_bias", "sampler param logit_bias: the bias of token " + std::to_string(b.id) +
                                             " must be in [-100, 100], got " + std::to_string(b.bias));
    }
    ids.push_back(b.id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
    return invalid_field("logit_bias", "sampler param logit_bias: token " + std::to_string(*dup) + " is listed twice");
  }
  return Status::ok_status();
}

}  // namespace

StepLogprobs step_logprobs(std::span<const float> logits, TokenId chosen, int32_t n_top) {
  StepLogprobs out;
  out.chosen.id = chosen;
  const size_t n = logits.size();
  if (n == 0) return out;
  const auto logit = [&](size_t i) {
    const float l = logits[i];
    return std::isnan(l) ? kNegInf : l;
  };
  float max_logit = kNegInf;
  size_t n_max = 0;  // how many reach max_logit (for the degenerate case)
  for (size_t i = 0; i < n; ++i) {
    const float l = logit(i);
    if (l > max_logit) {
      max_logit = l;
      n_max = 1;
    } else if (l == max_logit) {
      ++n_max;
    }
  }
  // log-sum-exp around the max, so that exp never overflows; in double so
  // that the report does not depend on the order of a float sum.
  double lse = 0.0;
  if (std::isfinite(max_logit)) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logit(i)) - max_logit);
    lse = static_cast<double>(max_logit) + std::log(sum);
  }
  const double at_max = -std::log(static_cast<double>(n_max));
  const auto lp = [&](size_t i) -> double {
    const float l = logit(i);
    if (!std::isfinite(max_logit)) return l == max_logit ? at_max : -std::numeric_limits<double>::infinity();
    return static_cast<double>(l) - lse;
  };
  if (chosen >= 0 && static_cast<size_t>(chosen) < n) out.chosen.logprob = lp(static_cast<size_t>(chosen));
  if (n_top <= 0) return out;
  const size_t k = std::min(static_cast<size_t>(n_top), n);
  std::vector<TokenId> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<TokenId>(i);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](TokenId a, TokenId b) {
    const float la = logit(static_cast<size_t>(a)), lb = logit(static_cast<size_t>(b));
    return la > lb || (la == lb && a < b);
  });
  out.top.reserve(k);
  for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], lp(static_cast<size_t>(ids[i]))});
  return out;
}

Status validate_sampler_params(const SamplerParams& p) {
  SPW_RETURN_IF_ERROR(check_finite(p.temperature, "temperature"));
  SPW_RETURN_IF_ERROR(check_finite(p.top_p, "top_p"));
  SPW_RETURN_IF_ERROR(check_finite(p.min_p, "min_p"));
  SPW_RETURN_IF_ERROR(check_finite(p.repeat_penalty, "repeat_penalty"));
  if (p.temperature < 0.0f) {
    return invalid_field("temperature", "sampler param temperature must be >= 0 (0 = greedy), got " +
                                    std::to_string(p.temperature));
  }
  if (p.top_p < 0.0f) {
    return invalid_field("top_p", "sampler param top_p must be >= 0, got " + std::to_string(p.top_p));
  }
  if (p.min_p < 0.0f || p.min_p > 1.0f) {
    return invalid_field("min_p", "sampler param min_p must be in [0, 1], got " + std::to_string(p.min_p));
  }
  if (p.repeat_penalty <= 0.0f) {
    return invalid_field("repeat_penalty", "sampler param repeat_penalty must be > 0, got " +
                                    std::to_string(p.repeat_penalty));
  }
  if (p.repeat_last_n < 0) {
    return invalid_field("repeat_last_n", "sampler param repeat_last_n must be >= 0, got " +
                                    std::to_string(p.repeat_last_n));
  }
  SPW_RETURN_IF_ERROR(check_count_penalty(p.frequency_penalty, "frequency_penalty"));
  SPW_RETURN_IF_ERROR(check_count_penalty(p.presence_penalty, "presence_penalty"));
  return check_logit_bias(p.logit_bias);
}

Sampler::Sampler(SamplerParams params) : params_(params), rng_(params.seed) {}

void Sampler::accept_prompt(std::span<const TokenId> prompt) {
  const size_t window = params_.repeat_last_n > 0 ? static_cast<size_t>(params_.repeat_last_n) : 0;
  if (window == 0) return;
  // Only the prompt's tail can be in the window.
  const size_t from = prompt.size() > window ? prompt.size() - window : 0;
  for (size_t i = from; i < prompt.size(); ++i) {
    if (recent_.size() >= window) recent_.erase(recent_.begin(), recent_.begin() + (recent_.size() - window + 1));
    recent_.push_back(prompt[i]);
  }
}

void Sampler::accept(TokenId id) {
  if (counts_tokens()) ++counts_[id];
  const size_t window = params_.repeat_last_n > 0 ? static_cast<size_t>(params_.repeat_last_n) : 0;
  if (window == 0) return;
  if (recent_.size() >= window) recent_.erase(recent_.begin(), recent_.begin() + (recent_.size() - window + 1));
  recent_.push_back(id);
}

SamplerState Sampler::state() const {
  SamplerState s;
  s.rng = rng_.state();
  s.recent = recent_;
  return s;
}

void Sampler::restore(const SamplerState& s, std::span<const TokenId> generated) {
  rng_.set_state(s.rng);
  recent_ = s.recent;
  const size_t window = params_.repeat_last_n > 0 ? static_cast<size_t>(params_.repeat_last_n) : 0;
  if (recent_.size() > window) recent_.erase(recent_.begin(), recent_.end() - window);
  counts_.clear();
  if (counts_tokens()) {
    for (TokenId id : generated) ++counts_[id];
  }
}

void Sampler::adjust(std::vector<Candidate>& cand, std::span<const TokenId> banned,
                     std::span<const uint64_t> allowed) const {
  const size_t n = cand.size();
  const auto in_range = [n](TokenId id) { return id >= 0 && static_cast<size_t>(id) < n; };
  for (const LogitBias& b : params_.logit_bias) {
    if (in_range(b.id)) cand[static_cast<size_t>(b.id)].logit += b.bias;
  }
  // Each distinct recent token once.
  if (params_.repeat_penalty != 1.0f && !recent_.empty()) {
    std::vector<TokenId> seen(recent_);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (TokenId id : seen) {
      if (!in_range(id)) continue;
      float& l = cand[static_cast<size_t>(id)].logit;
      l = l <= 0.0f ? l * params_.repeat_penalty : l / params_.repeat_penalty;
    }
  }
  // The map's order does not matter: each token's logit changes on its own.
  for (const auto& [id, count] : counts_) {
    if (!in_range(id) || count <= 0) continue;
    cand[static_cast<size_t>(id)].logit -=
        params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }
  for (TokenId id : banned) {
    if (in_range(id)) cand[static_cast<size_t>(id)].logit = kNegInf;
  }
  if (!allowed.empty()) {
    for (size_t i = 0; i < n; ++i) {
      if (i / 64 >= allowed.size() || ((allowed[i / 64] >> (i % 64)) & 1) == 0) cand[i].logit = kNegInf;
    }
  }
}

bool Sampler::filter(std::span<const float> logits, std::span<const TokenId> banned,
                     std::span<const uint64_t> allowed, std::vector<Candidate>& cand) const {
  cand.clear();
  const size_t n = logits.size();
  if (n == 0) return false;
  cand.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float l = logits[i];
    cand[i] = {static_cast<TokenId>(i), std::isnan(l) ? kNegInf : l};
  }
  adjust(cand, banned, allowed);

  // Argmax, lowest id on ties (strict >).
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (cand[i].logit > cand[best].logit) best = i;
  }
  const float max_logit = cand[best].logit;
  // Greedy, or nothing a softmax can weigh (all -inf, or a +inf that would make
  // every other weight NaN): the argmax decides.
  if (params_.temperature <= 0.0f || !std::isfinite(max_logit)) {
    const Candidate top = cand[best];
    cand.assign(1, top);
    return false;
  }

  // -inf has probability 0; dropping it first keeps sorting cheap on masked logits.
  cand.erase(std::remove_if(cand.begin(), cand.end(), [](const Candidate& c) { return c.logit == kNegInf; }),
             cand.end());
  const auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand.size()) {
    const auto k = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(), by_logit);
    cand.resize(k);
  } else {
    std::sort(cand.begin(), cand.end(), by_logit);
  }

  if (params_.top_p < 1.0f && cand.size() > 1) {
    double total = 0.0;
    for (const Candidate& c : cand) total += std::exp(static_cast<double>(c.logit) - max_logit);
    const double target = static_cast<double>(params_.top_p) * total;
    double cum = 0.0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
      cum += std::exp(static_cast<double>(cand[i].logit) - max_logit);
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(keep);
  }

  if (params_.min_p > 0.0f && cand.size() > 1) {
    // p_i / p_max = exp(l_i - l_max); cand is sorted, so cut at the first miss.
    size_t keep = 1;
    while (keep < cand.size() &&
           std::exp(static_cast<double>(cand[keep].logit) - max_logit) >= static_cast<double>(params_.min_p)) {
      ++keep;
    }
    cand.resize(keep);
  }
  return true;
}

std::vector<TokenId> Sampler::candidates(std::span<const float> logits, std::span<const TokenId> banned,
                                         std::span<const uint64_t> allowed) const {
  std::vector<Candidate> cand;
  filter(logits, banned, allowed, cand);
  std::vector<TokenId> ids;
  ids.reserve(cand.size());
  for (const Candidate& c : cand) ids.push_back(c.id);
  return ids;
}

TokenId Sampler::sample(std::span<const float> logits, std::span<const TokenId> banned,
                        std::span<const uint64_t> allowed) {
  std::vector<Candidate>& cand = scratch_;
  if (!filter(logits, banned, allowed, cand)) return cand.empty() ? -1 : cand[0].id;
  if (cand.size() == 1) {
    // Still consume one draw so the RNG stream does not depend on how many
    // candidates the filters left (keeps checkpoints simple to reason about).
    rng_.next_double();
    return cand[0].id;
  }
  const double inv_t = 1.0 / static_cast<double>(params_.temperature);
  const double max_logit = cand[0].logit;
  double total = 0.0;
  // w_i = exp((l_i - l_max) / T): softmax(logits / T) up to the normalising total.
  std::vector<double>& w = weights_;
  w.resize(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) {
    w[i] = std::exp((static_cast<double>(cand[i].logit) - max_logit) * inv_t);
    total += w[i];
  }
  const double u = rng_.next_double() * total;
  double cum = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    cum += w[i];
    if (u < cum) return cand[i].id;
  }
  return cand.back().id;  // rounding left u at the very top
}

}  // namespace spw
