#include "engine/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/env.h"
#include "engine/checkpoint.h"
#include "engine/output_constraint.h"

namespace spw {

Generator::Generator(Session& session, const GenerateOptions& options)
    : session_(session), options_(options), sampler_(options.sampler), stop_(options.stop) {
  // Only min_tokens needs the list; the ids a step checks come from the
  // tokenizer and the options, so a resumed generator rebuilds the same one.
  if (options_.min_tokens > 0) {
    if (!options_.ignore_eos) enders_ = session_.model().tokenizer().eog_ids();
    enders_.insert(enders_.end(), options_.stop_token_ids.begin(), options_.stop_token_ids.end());
    std::sort(enders_.begin(), enders_.end());
    enders_.erase(std::unique(enders_.begin(), enders_.end()), enders_.end());
  }
}

Generator::~Generator() = default;

Status Generator::init_constraint(std::span<const TokenId> generated) {
  if (!options_.constraint.active()) return Status::ok_status();
  if (options_.ignore_eos) {
    return invalid_field("ignore_eos", "ignore_eos cannot be combined with response_format: a complete JSON document "
                                       "can only be followed by the end of the generation");
  }
  if (options_.min_tokens > 0) {
    return invalid_field("min_tokens", "min_tokens cannot be combined with response_format: the JSON document may be "
                                       "complete before min_tokens, and nothing may follow it");
  }
  SPW_ASSIGN_OR_RETURN(constraint_, OutputConstraint::create(options_.constraint, session_.model().tokenizer()));
  return constraint_->replay(generated);
}

std::span<const TokenId> Generator::banned_now() const {
  if (n_generated() >= options_.min_tokens) return {};
  return enders_;
}

bool Generator::is_stop_token(TokenId id) const {
  // A handful of ids at most (the server bounds the list): a scan beats a set.
  return std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(), id) !=
         options_.stop_token_ids.end();
}

Status Generator::evaluate_from_prefix(std::span<const TokenId> all) {
  // Reuse the session's KV for the common prefix, but always evaluate at least
  // the last token so that its logits are fresh.
  const auto& have = session_.tokens();
  size_t common = 0;
  while (common < have.size() && common < all.size() && have[common] == all[common]) ++common;
  common = std::min(common, all.size() - 1);
  SPW_RETURN_IF_ERROR(session_.truncate(static_cast<int32_t>(common)));
  if (options_.reserve_kv) {
    const int64_t want = options_.max_tokens > 0 ? static_cast<int64_t>(all.size()) + options_.max_tokens
                                                 : session_.n_ctx();
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(want, session_.n_ctx()));
    if (Status st = session_.reserve_kv(n); !st.ok()) {
      return st.with_context("before generation: the request needs KV for " + std::to_string(n) + " positions");
    }
  }
  auto r = session_.eval(all.subspan(common));
  return r.status();
}

std::vector<std::string> prompt_pieces(const Tokenizer& tok, std::span<const TokenId> prompt) {
  std::vector<std::string> out;
  out.reserve(prompt.size());
  bool strip = tok.add_space_prefix();
  for (TokenId id : prompt) {
    std::string piece = tok.token_piece(id);
    if (strip && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      strip = false;
    }
    out.push_back(std::move(piece));
  }
  return out;
}

Status Generator::evaluate_with_prompt_logprobs(std::span<const TokenId> prompt) {
  const Tokenizer& tok = session_.model().tokenizer();
  const int32_t n_top = options_.prompt_logprobs;
  const auto n = static_cast<int32_t>(prompt.size());
  const int64_t V = session_.n_vocab();
  std::vector<std::string> pieces = prompt_pieces(tok, prompt);
  std::vector<TokenLogprobs> entries(prompt.size());
  for (int32_t i = 0; i < n; ++i) {
    entries[static_cast<size_t>(i)].index = i;
    entries[static_cast<size_t>(i)].token = {prompt[static_cast<size_t>(i)], std::numeric_limits<double>::quiet_NaN(),
                                             std::move(pieces[static_cast<size_t>(i)])};
  }
  // Row p's logits predict token p + 1 (the last row's, the first generated
  // token: the sampler's, not listed).
  session_.set_row_logits_sink([&](int32_t first, int32_t rows, std::span<const float> logits) {
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t next = first + r + 1;
      if (next <= 0 || next >= n) continue;
      const StepLogprobs lp =
          step_logprobs(logits.subspan(static_cast<size_t>(r * V), static_cast<size_t>(V)), prompt[static_cast<size_t>(next)], n_top);
      TokenLogprobs& e = entries[static_cast<size_t>(next)];
      e.token.logprob = lp.chosen.logprob;
      e.top.clear();
      for (const TokenLogprob& t : lp.top) e.top.push_back({t.id, t.logprob, tok.token_piece(t.id, /*render_special=*/true)});
    }
  });
  struct Unset {
    Session& s;
    ~Unset() { s.set_row_logits_sink({}); }
  } unset{session_};
  // Every row is needed: nothing of the session's KV is reused.
  SPW_RETURN_IF_ERROR(session_.truncate(0));
  if (options_.reserve_kv) {
    const int64_t want = options_.max_tokens > 0 ? static_cast<int64_t>(n) + options_.max_tokens : session_.n_ctx();
    const int32_t m = static_cast<int32_t>(std::min<int64_t>(want, session_.n_ctx()));
    if (Status st = session_.reserve_kv(m); !st.ok()) {
      return st.with_context("before generation: the request needs KV for " + std::to_string(m) + " positions");
    }
  }
  SPW_RETURN_IF_ERROR(session_.eval(prompt).status());
  result_.prompt_logprobs = std::move(entries);
  return Status();
}

Result<std::unique_ptr<Generator>> Generator::start(Session& session, std::vector<TokenId> prompt,
                                                    const GenerateOptions& options) {
  if (prompt.empty()) return Status::invalid_argument("generate: empty prompt");
  SPW_RETURN_IF_ERROR(validate_sampler_params(options.sampler));
  std::unique_ptr<Generator> g(new Generator(session, options));
  SPW_RETURN_IF_ERROR(g->init_constraint({}));
  Env& env = Env::default_env();
  const int64_t t0 = env.now_ns();
  if (options.prompt_logprobs >= 0) {
    SPW_RETURN_IF_ERROR(g->evaluate_with_prompt_logprobs(prompt));
  } else {
    SPW_RETURN_IF_ERROR(g->evaluate_from_prefix(prompt));
  }
  g->result_.prefill_ns = env.now_ns() - t0;
  g->sampler_.accept_prompt(prompt);
  g->result_.prompt_tokens = std::move(prompt);
  return g;
}

Result<std::unique_ptr<Generator>> Generator::resume(Session& session, const Checkpoint& cp) {
  if (cp.model_fingerprint != session.model().fingerprint())
    return Status::failed_precondition("checkpoint is for model '" + cp.model_fingerprint + "', session has '" +
                                       session.model().fingerprint() + "'");
  if (!cp.kv_type.empty() && cp.kv_type != kv_type_name(session.kv_type()))
    return Status::failed_precondition("checkpoint was computed with a " + cp.kv_type + " KV cache, session has " +
                                       std::string(kv_type_name(session.kv_type())) +
                                       " (its continuation would differ; resume on a " + cp.kv_type + " KV)");
  if (cp.n_prompt <= 0 || static_cast<size_t>(cp.n_prompt) > cp.tokens.size() ||
      cp.n_generated != static_cast<int32_t>(cp.tokens.size()) - cp.n_prompt)
    return Status::invalid_argument("checkpoint: inconsistent n_prompt/n_generated");
  SPW_RETURN_IF_ERROR(validate_sampler_params(cp.options.sampler));
  std::unique_ptr<Generator> g(new Generator(session, cp.options));
  g->result_.prompt_tokens.assign(cp.tokens.begin(), cp.tokens.begin() + cp.n_prompt);
  g->result_.tokens.assign(cp.tokens.begin() + cp.n_prompt, cp.tokens.end());
  g->result_.text = cp.text;
  g->result_.finish_reason = cp.finish_reason;
  g->sampler_.restore(cp.sampler, g->result_.tokens);
  if (Status st = g->init_constraint(g->result_.tokens); !st.ok()) {
    return st.code() == StatusCode::kFailedPrecondition ? Status::corruption("checkpoint: " + st.message()) : st;
  }
  g->stop_.set_held(cp.stop_held);
  g->utf8_.set_pending(cp.utf8_pending);
  if (cp.options.logprobs >= 0) {
    g->pending_logprobs_.assign(cp.logprobs_pending.begin(), cp.logprobs_pending.end());
  }
  if (!g->finished()) {
    Env& env = Env::default_env();
    const int64_t t0 = env.now_ns();
    SPW_RETURN_IF_ERROR(g->evaluate_from_prefix(cp.tokens));
    g->result_.prefill_ns = env.now_ns() - t0;
  }
  return g;
}

void Generator::advance_logprobs(std::string_view pending_before, std::string_view piece, size_t decoded) {
  // Where each byte of this push completes a character in its decoded text:
  // the stream's own decoder fed one byte at a time gives the same text.
  // Only needed for entries whose last byte was held (a split character).
  std::vector<int64_t> done_at;  // decoded bytes once byte i is in; -1 while its character is open
  const auto n_pending = static_cast<int64_t>(pending_before.size());
  for (PendingLogprobs& p : pending_logprobs_) {
    if (p.decoded) {
      p.after += static_cast<int64_t>(decoded);
      continue;
    }
    if (done_at.empty()) {
      std::string bytes(pending_before);
      bytes.append(piece);
      Utf8Stream u;
      int64_t out = 0;
      for (char c : bytes) {
        out += static_cast<int64_t>(u.push(std::string_view(&c, 1)).size());
        done_at.push_back(u.pending().empty() ? out : -1);
      }
    }
    // Its last byte (a token of no bytes: the byte before it) is held, so it
    // is among pending_before, `after` bytes from its end.
    const int64_t last = n_pending - 1 - p.after;
    int64_t end = -1;
    for (auto i = std::max<int64_t>(last, 0); i < static_cast<int64_t>(done_at.size()) && end < 0; ++i) {
      end = done_at[static_cast<size_t>(i)];
    }
    if (end < 0) {
      p.after += static_cast<int64_t>(piece.size());  // its character is still open
    } else {
      p.decoded = true;
      p.after = static_cast<int64_t>(decoded) - end;
    }
  }
}

void Generator::release_logprobs(size_t held) {
  // Emitted: everything decoded but the last `held` bytes; an entry's text
  // ends `after` bytes before the end of everything decoded.
  while (!pending_logprobs_.empty() && pending_logprobs_.front().decoded &&
         pending_logprobs_.front().after >= static_cast<int64_t>(held)) {
    released_.push_back(std::move(pending_logprobs_.front().entry));
    pending_logprobs_.pop_front();
  }
}

void Generator::keep_released() {
  for (TokenLogprobs& e : released_) result_.logprobs.push_back(std::move(e));
  released_.clear();
}

void Generator::finish(FinishReason reason, const TokenCallback& cb, bool flush) {
  if (flush) {
    const size_t held_before = stop_.held_size();
    std::string rest = utf8_.flush();
    StopMatcher::Step st = stop_.push(rest);
    std::string out = std::move(st.emit);
    if (!st.stopped) out += stop_.flush();
    // Flushed, every held character ends here (an open one as U+FFFD).
    for (PendingLogprobs& p : pending_logprobs_) {
      p.after = p.decoded ? p.after + static_cast<int64_t>(rest.size()) : 0;
      p.decoded = true;
    }
    release_logprobs(held_before + rest.size() - out.size());
    if (!out.empty() || !released_.empty()) {
      result_.text += out;
      if (cb) cb(out, -1, released_);
      keep_released();
    }
  }
  // Whatever is still held is never released: its text is not in the output.
  pending_logprobs_.clear();
  result_.finish_reason = reason;
}

void Generator::cancel() {
  if (!finished()) result_.finish_reason = FinishReason::kCancelled;
}

Result<bool> Generator::step(const TokenCallback& cb) {
  if (finished()) return false;
  Env& env = Env::default_env();
  const int64_t t0 = env.now_ns();
  struct Timer {
    GenerateResult& r;
    Env& env;
    int64_t t0;
    ~Timer() { r.decode_ns += env.now_ns() - t0; }
  } timer{result_, env, t0};

  if (options_.max_tokens > 0 && n_generated() >= options_.max_tokens) {
    finish(FinishReason::kLength, cb, true);
    return false;
  }
  if (pending_eval_) {
    if (session_.n_past() >= session_.n_ctx()) {
      finish(FinishReason::kLength, cb, true);
      return false;
    }
    const TokenId last = result_.tokens.back();
    auto r = session_.eval(std::span<const TokenId>(&last, 1));
    if (!r.ok()) return r.status();
    pending_eval_ = false;
  }
  if (constraint_) SPW_RETURN_IF_ERROR(constraint_->allowed(allowed_));
  const TokenId id = sampler_.sample(session_.last_logits(), banned_now(), constraint_ ? allowed_ : std::span<const uint64_t>{});
  const Tokenizer& tok = session_.model().tokenizer();
  if (id < 0) return Status::internal("sampler returned no token");
  if ((!options_.ignore_eos && tok.is_eog(id)) || is_stop_token(id)) {
    finish(FinishReason::kStop, cb, true);
    return false;
  }
  if (constraint_) SPW_RETURN_IF_ERROR(constraint_->accept(id));
  sampler_.accept(id);
  result_.tokens.push_back(id);
  pending_eval_ = true;
  const std::string piece = tok.token_piece(id);
  const size_t held_before = stop_.held_size();
  std::string pending_before;
  if (options_.logprobs >= 0) pending_before = utf8_.pending();
  const std::string decoded = utf8_.push(piece);
  StopMatcher::Step st = stop_.push(decoded);
  result_.text += st.emit;
  if (options_.logprobs >= 0) {
    // From the logits `id` was sampled from (the next eval replaces them).
    const StepLogprobs lp = step_logprobs(session_.last_logits(), id, options_.logprobs);
    TokenLogprobs e;
    e.index = n_generated() - 1;
    e.token = {id, lp.chosen.logprob, piece};
    e.top.reserve(lp.top.size());
    for (const TokenLogprob& t : lp.top) {
      e.top.push_back({t.id, t.logprob, tok.token_piece(t.id, /*render_special=*/true)});
    }
    // The earlier entries move past this push; this one ends where the
    // push's text ends, or, while its last byte begins a character the
    // stream still holds, waits for that character.
    advance_logprobs(pending_before, piece, decoded.size());
    pending_logprobs_.push_back({std::move(e), utf8_.pending().empty(), 0});
    // Decoded but not emitted: the matcher's hold, or, on a stop, the stop
    // string and what followed it.
    release_logprobs(held_before + decoded.size() - st.emit.size());
  }
  const bool keep_going = cb ? cb(st.emit, id, released_) : true;
  keep_released();
  if (st.stopped) {
    finish(FinishReason::kStop, cb, false);
    return false;
  }
  if (!keep_going) {
    finish(FinishReason::kCancelled, cb, false);
    return false;
  }
  if (options_.max_tokens > 0 && n_generated() >= options_.max_tokens) {
    finish(FinishReason::kLength, cb, true);
    return false;
  }
  return true;
}

Result<GenerateResult> Generator::run(const TokenCallback& cb, const std::atomic<bool>* cancel_flag) {
  while (!finished()) {
    if (cancel_flag != nullptr && cancel_flag->load(std::memory_order_relaxed)) {
      cancel();
      break;
    }
    auto r = step(cb);
    if (!r.ok()) return r.status();
  }
  return result_;
}

Checkpoint Generator::checkpoint() const {
  Checkpoint cp;
  cp.model_fingerprint = session_.model().fingerprint();
  cp.tokens = result_.prompt_tokens;
  cp.tokens.insert(cp.tokens.end(), result_.tokens.begin(), result_.tokens.end());
  cp.n_prompt = static_cast<int32_t>(result_.prompt_tokens.size());
  cp.n_generated = static_cast<int32_t>(result_.tokens.size());
  cp.sampler = sampler_.state();
  cp.stop_held = stop_.held();
  cp.utf8_pending = utf8_.pending();
  cp.text = result_.text;
  cp.finish_reason = result_.finish_reason;
  cp.options = options_;
  // What the generated tokens were chosen with; none yet: the checkpoint
  // is start_checkpoint's, valid on any KV type.
  if (!result_.tokens.empty()) cp.kv_type = std::string(kv_type_name(session_.kv_type()));
  cp.logprobs_pending.assign(pending_logprobs_.begin(), pending_logprobs_.end());
  return cp;
}

Result<GenerateResult> generate(Session& session, std::span<const TokenId> prompt, const GenerateOptions& options,
                                const TokenCallback& cb, const std::atomic<bool>* cancel) {
  SPW_ASSIGN_OR_RETURN(auto g, Generator::start(session, std::vector<TokenId>(prompt.begin(), prompt.end()), options));
  return g->run(cb, cancel);
}

Result<std::unique_ptr<ChoiceGroup>> ChoiceGroup::start(Session& session, std::vector<TokenId> prompt,
                                                        const GenerateOptions& options, int32_t n) {
  if (n < 1 || n > kMaxChoices) {
    return Status::invalid_argument("n must be in [1, " + std::to_string(kMaxChoices) + "], got " + std::to_string(n));
  }
  std::unique_ptr<ChoiceGroup> g(new ChoiceGroup());
  SPW_ASSIGN_OR_RETURN(auto first, Generator::start(session, prompt, options));
  g->gens_.push_back(std::move(first));
  GenerateOptions o = options;
  o.prompt_logprobs = -1;
  for (int32_t i = 1; i < n; ++i) {
    // The session holds exactly the prompt here (choice 0 has not stepped),
    // so every fork shares the prompt's blocks and nothing more.
    SPW_ASSIGN_OR_RETURN(auto fork, session.fork());
    o.sampler.seed = choice_seed(options.sampler.seed, i);
    SPW_ASSIGN_OR_RETURN(auto gen, Generator::start(*fork, prompt, o));
    g->forks_.push_back(std::move(fork));
    g->gens_.push_back(std::move(gen));
  }
  return g;
}

bool ChoiceGroup::finished() const {
  for (const auto& gen : gens_)
    if (!gen->finished()) return false;
  return true;
}

Result<bool> ChoiceGroup::step(const ChoiceCallback& cb) {
  // Every choice's pending token in one pass (what each step() would
  // evaluate first), when more than one has one.
  std::vector<Session*> sessions;
  std::vector<TokenId> tokens;
  std::vector<Generator*> members;
  for (auto& gen : gens_) {
    Generator& g = *gen;
    if (g.finished() || !g.pending_eval_) continue;
    if (g.options_.max_tokens > 0 && g.n_generated() >= g.options_.max_tokens) continue;
    if (g.session_.n_past() >= g.session_.n_ctx()) continue;
    sessions.push_back(&g.session_);
    tokens.push_back(g.result_.tokens.back());
    members.push_back(&g);
  }
  if (members.size() > 1) {
    const std::vector<Status> st = Session::eval_batch(sessions, tokens);
    for (size_t k = 0; k < members.size(); ++k)
      if (st[k].ok()) members[k]->pending_eval_ = false;
  }
  for (size_t i = 0; i < gens_.size(); ++i) {
    Generator& gen = *gens_[i];
    if (gen.finished()) continue;
    TokenCallback one;
    if (cb) {
      const auto c = static_cast<int32_t>(i);
      one = [&cb, c](std::string_view text, TokenId id, std::span<const TokenLogprobs> lp) {
        return cb(c, text, id, lp);
      };
    }
    SPW_ASSIGN_OR_RETURN(bool more, gen.step(one));
    (void)more;
  }
  return !finished();
}

void ChoiceGroup::cancel() {
  for (auto& gen : gens_)
    if (!gen->finished()) gen->cancel();
}

Result<std::vector<GenerateResult>> ChoiceGroup::run(const ChoiceCallback& cb, const std::atomic<bool>* cancel_flag) {
  while (!finished()) {
    if (cancel_flag != nullptr && cancel_flag->load(std::memory_order_acquire)) {
      cancel();
      break;
    }
    SPW_RETURN_IF_ERROR(step(cb).status());
  }
  std::vector<GenerateResult> out;
  out.reserve(gens_.size());
  for (const auto& gen : gens_) out.push_back(gen->result());
  return out;
}

Result<std::vector<GenerateResult>> generate_choices(Session& session, std::span<const TokenId> prompt,
                                                     const GenerateOptions& options, int32_t n,
                                                     const ChoiceCallback& cb, const std::atomic<bool>* cancel) {
  SPW_ASSIGN_OR_RETURN(auto g, ChoiceGroup::start(session, std::vector<TokenId>(prompt.begin(), prompt.end()),
                                                  options, n));
  return g->run(cb, cancel);
}

Result<GenerateResult> resume(Session& session, const Checkpoint& checkpoint, const TokenCallback& cb,
                              const std::atomic<bool>* cancel) {
  SPW_ASSIGN_OR_RETURN(auto g, Generator::resume(session, checkpoint));
  return g->run(cb, cancel);
}

}  // namespace spw
