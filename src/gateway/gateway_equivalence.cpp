// Gateway: the equivalence check between paths that serve one model on
// different placements, and the migration rule it decides (gateway.h's
// contract: verify_equivalence, migration_allowed). Split from gateway.cpp.
#include "gateway/gateway.h"

#include <cmath>
#include <string>
#include <vector>

namespace spw::gateway {

namespace {

std::string equivalence_key(const std::string& fingerprint, std::string a, std::string b) {
  if (b < a) std::swap(a, b);
  return fingerprint + "|" + a + "|" + b;
}

}  // namespace

Status Gateway::migration_allowed(size_t from, size_t to) const {
  const ExecutionPath& a = paths_[from];
  const ExecutionPath& b = paths_[to];
  if (a.fingerprint.empty() || a.fingerprint != b.fingerprint) {
    return Status::failed_precondition("serves another model than " + a.name + " (compatibility fingerprints differ)");
  }
  if (a.numerics() == b.numerics()) return Status::ok_status();  // one backend and variant: bitwise by contract
  std::lock_guard<std::mutex> lk(mu_);
  auto it = equivalence_.find(equivalence_key(a.fingerprint, a.numerics(), b.numerics()));
  if (it == equivalence_.end()) {
    return Status::failed_precondition("equivalence with " + a.name + " not verified");
  }
  if (!it->second.passed) {
    return Status::failed_precondition("equivalence check with " + a.name + " failed: " + it->second.detail);
  }
  return Status::ok_status();
}

std::vector<EquivalenceInfo> Gateway::verify_equivalence() {
  std::lock_guard<std::mutex> one(verify_mu_);
  // Runs one request on a path as the server's own and returns its text (or
  // the failure): each side's run is bounded on the Env's clock.
  struct Run {
    std::shared_ptr<serve::Ticket> ticket;
    Status status;
  };
  auto start = [&](const ExecutionPath& path, const std::vector<TokenId>& prompt, const SamplerParams& sampler,
                   int32_t max_tokens) {
    serve::PreparedRequest p;
    p.id = next_ticket_id_.fetch_add(1);
    p.internal = true;
    p.job.prompt = prompt;
    p.job.sampler = sampler;
    p.job.max_tokens = max_tokens;
    const auto n_prompt = static_cast<int32_t>(prompt.size());
    p.limits.n_ctx = path.scheduler->n_ctx();
    p.limits.prompt_tokens = n_prompt;
    p.limits.max_tokens = max_tokens;
    p.kv_blocks = admission::kv_blocks_for(n_prompt + max_tokens, path.scheduler->kv_block_tokens());
    p.decision.path = path.name;
    p.decision.reason = "equivalence check";
    Result<std::shared_ptr<serve::Ticket>> t = path.scheduler->submit_prepared(std::move(p));
    return t.ok() ? Run{*t, Status()} : Run{nullptr, t.status()};
  };
  auto finish = [&](Run& r, const ExecutionPath& path, std::string& text) -> Status {
    if (!r.ticket) return r.status;
    const int64_t deadline = env_.now_ns() + static_cast<int64_t>(std::llround(policy_.equivalence_timeout_s * 1e9));
    serve::RequestEvent ev;
    for (;;) {
      const serve::PopResult pr = r.ticket->next_event(ev, std::chrono::milliseconds(20));
      if (pr == serve::PopResult::kClosed) return Status::internal("equivalence run ended without a result");
      if (pr == serve::PopResult::kTimeout) {
        if (env_.now_ns() > deadline) {
          (void)path.scheduler->cancel(r.ticket->id());
          return Status(StatusCode::kDeadlineExceeded, "the run did not finish in time", FailureReason::kTimeout);
        }
        continue;
      }
      if (ev.kind == serve::RequestEvent::Kind::kText) {
        text += ev.text;
        continue;
      }
      return ev.state == serve::RequestState::kDone ? Status() : ev.status;
    }
  };
  for (size_t i = 0; i < paths_.size(); ++i) {
    for (size_t j = i + 1; j < paths_.size(); ++j) {
      const ExecutionPath& a = paths_[i];
      const ExecutionPath& b = paths_[j];
      if (a.fingerprint.empty() || a.fingerprint != b.fingerprint || a.numerics() == b.numerics()) continue;
      // Catalogue models' paths are not run here: the check would load each
      // of them at start. A verdict of this run for their fingerprint and
      // numerics (the served model's, if it is the same file) still applies
      // to them through migration_allowed.
      if (policy_.residency && (policy_.residency->manages(a.name) || policy_.residency->manages(b.name))) continue;
      const std::string key = equivalence_key(a.fingerprint, a.numerics(), b.numerics());
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (equivalence_.count(key) != 0) continue;
      }
      EquivalenceInfo info;
      info.a = a.name;
      info.b = b.name;
      info.placement_a = a.numerics();
      info.placement_b = b.numerics();
      info.fingerprint = a.fingerprint;
      const EquivalenceStore& store = policy_.equivalence_store;
      const std::string stored_key = key + "|" + store.scope;
      if (store.load) {
        if (std::optional<EquivalenceInfo> kept = store.load(stored_key)) {
          info.passed = kept->passed;
          info.detail = kept->detail;
          info.ms = kept->ms;
          info.checked_ms = kept->checked_ms;
          info.source = "stored";
          emit({GatewayEventKind::kEquivalence, "", std::nullopt,
                "equivalence " + a.name + " <-> " + b.name + ": " + (info.passed ? "passed" : "FAILED") +
                    " (kept from an earlier run), " + info.detail});
          std::lock_guard<std::mutex> lk(mu_);
          equivalence_[key] = info;
          continue;
        }
      }
      // An on-demand replica not loaded yet is loaded by the check's own
      // runs (its first work) and given back after, so the mode keeps its
      // promise (nothing held until a request needs it) and is still a
      // verified migration target.
      const bool unload_a = !a.replica->info().loaded && a.unload;
      const bool unload_b = !b.replica->info().loaded && b.unload;
      info.passed = true;
      info.checked_ms = env_.wall_time_ms();
      const int64_t t0 = env_.now_ns();
      int32_t runs = 0;
      bool compared = true;
      for (const std::string& prompt_text : policy_.equivalence_prompts) {
        for (bool seeded : {false, true}) {
          serve::GenerationRequest g;
          g.prompt = prompt_text;
          g.sampler.temperature = seeded ? policy_.equivalence_temperature : 0.0f;
          g.sampler.seed = policy_.equivalence_seed;
          Result<std::vector<TokenId>> prompt = serve::encode_prompt(*a.tokenizer, g);
          const int32_t room =
              prompt.ok() ? std::min(a.scheduler->n_ctx(), b.scheduler->n_ctx()) - static_cast<int32_t>(prompt->size())
                          : 0;
          const int32_t n = std::min(policy_.equivalence_tokens, room);
          if (!prompt.ok() || n < 1) continue;
          Run ra = start(a, *prompt, g.sampler, n);
          Run rb = start(b, *prompt, g.sampler, n);
          std::string ta, tb;
          const Status sa = finish(ra, a, ta);
          const Status sb = finish(rb, b, tb);
          const std::string what = std::string(seeded ? "seeded" : "greedy") + " \"" + prompt_text + "\"";
          if (!sa.ok() || !sb.ok()) {
            info.passed = false;
            compared = false;
            info.detail = what + " did not run: " + (sa.ok() ? sb : sa).to_string();
          } else if (ta != tb) {
            size_t k = 0;
            while (k < ta.size() && k < tb.size() && ta[k] == tb[k]) ++k;
            info.passed = false;
            info.detail = what + ": texts differ at byte " + std::to_string(k) + " (\"" + ta + "\" vs \"" + tb + "\")";
          }
          if (!info.passed) break;
          ++runs;
        }
        if (!info.passed) break;
      }
      if (info.passed && runs == 0) {
        info.passed = false;
        compared = false;
        info.detail = "no prompt fits both paths' contexts";
      } else if (info.passed) {
        info.detail = std::to_string(runs) + " runs (greedy and seeded) of " +
                      std::to_string(policy_.equivalence_tokens) + " tokens gave the same text";
      }
      info.ms = static_cast<double>(env_.now_ns() - t0) / 1e6;
      emit({GatewayEventKind::kEquivalence, "", std::nullopt,
            "equivalence " + a.name + " <-> " + b.name + ": " + (info.passed ? "passed, " : "FAILED, ") + info.detail});
      for (const auto& [unload, path] : {std::pair{unload_a, &a}, std::pair{unload_b, &b}}) {
        if (unload && path->unload()) path->replica->mark_unloaded();
      }
      // A verdict is kept only when texts were compared: a run that could
      // not start or finish says nothing about the paths.
      if (store.save && compared) store.save(stored_key, info);
      std::lock_guard<std::mutex> lk(mu_);
      equivalence_[key] = info;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<EquivalenceInfo> out;
  for (const auto& [k, v] : equivalence_) out.push_back(v);
  return out;
}

}  // namespace spw::gateway
