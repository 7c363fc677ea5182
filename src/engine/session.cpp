#include "engine/session.h"

#include "engine/step_batcher.h"

#include <algorithm>
#include <string>

namespace spw {

Result<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Model> model,
                                                 std::shared_ptr<Backend> backend, std::shared_ptr<KvPool> pool,
                                                 SessionOptions options) {
  if (!model) return Status::invalid_argument("Session: null model");
  std::vector<SessionStage> stages(1);
  stages[0].backend = std::move(backend);
  stages[0].pool = std::move(pool);
  stages[0].layer_begin = 0;
  stages[0].layer_end = model->hparams().n_layer;
  return create_staged(std::move(model), std::move(stages), options);
}

Result<std::unique_ptr<Session>> Session::create_staged(std::shared_ptr<const Model> model,
                                                        std::vector<SessionStage> stages,
                                                        SessionOptions options) {
  if (!model) return Status::invalid_argument("Session: null model");
  const LlamaHparams& hp = model->hparams();
  if (stages.empty()) return Status::invalid_argument("Session: no stages");
  int32_t next = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const SessionStage& s = stages[i];
    const std::string where = "Session stage " + std::to_string(i) + ": ";
    if (!s.backend || !s.pool) return Status::invalid_argument(where + "null backend or pool");
    if (s.layer_begin != next || s.layer_end <= s.layer_begin || s.layer_end > hp.n_layer)
      return Status::invalid_argument(where + "layers [" + std::to_string(s.layer_begin) + ", " +
                                      std::to_string(s.layer_end) + ") do not continue from layer " +
                                      std::to_string(next));
    if (!s.backend->accepts_kv(*s.pool))
      return Status::invalid_argument(where + "backend " + s.backend->name() + " cannot use this KV pool's storage (" +
                                      (s.pool->on_host() ? std::string("host") : s.pool->device_storage()->device_name()) +
                                      "); make the pool with that backend's create_kv_pool()");
    const KvPoolOptions& po = s.pool->options();
    if (po.layer_begin != s.layer_begin || po.layer_end != s.layer_end)
      return Status::invalid_argument(where + "KV pool covers layers [" + std::to_string(po.layer_begin) + ", " +
                                      std::to_string(po.layer_end) + ")");
    if (po.n_embd_kv != hp.n_embd_kv())
      return Status::invalid_argument(where + "KV pool n_embd_kv = " + std::to_string(po.n_embd_kv) +
                                      ", model needs " + std::to_string(hp.n_embd_kv()));
    SPW_RETURN_IF_ERROR(s.backend->prepare(*model, s.layer_begin, s.layer_end, i == 0, i + 1 == stages.size()));
    next = s.layer_end;
  }
  if (next != hp.n_layer)
    return Status::invalid_argument("Session: stages end at layer " + std::to_string(next) + " of " +
                                    std::to_string(hp.n_layer));
  if (options.n_ubatch <= 0)
    return Status::invalid_argument("Session: n_ubatch = " + std::to_string(options.n_ubatch));
  if (options.n_ctx < 0) return Status::invalid_argument("Session: n_ctx = " + std::to_string(options.n_ctx));
  std::unique_ptr<Session> s(new Session());
  s->n_ctx_ = options.n_ctx == 0 ? hp.n_ctx_train : options.n_ctx;
  s->model_ = std::move(model);
  s->stages_ = std::move(stages);
  s->tables_.resize(s->stages_.size());
  s->options_ = options;
  return s;
}

Result<std::unique_ptr<Session>> Session::fork() {
  std::unique_ptr<Session> s(new Session());
  s->model_ = model_;
  s->stages_ = stages_;
  s->tables_.resize(stages_.size());
  s->options_ = options_;
  s->n_ctx_ = n_ctx_;
  const int32_t n = n_past();
  bool host = true;
  for (const SessionStage& st : stages_) host = host && st.pool->on_host();
  auto undo = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) stages_[j].pool->release(s->tables_[j]);
  };
  for (size_t i = 0; i < stages_.size(); ++i) {
    Status st = host ? stages_[i].pool->fork(tables_[i], s->tables_[i], n)
                     : stages_[i].pool->share_prefix(tables_[i], s->tables_[i], n > 0 ? n - 1 : 0);
    if (!st.ok()) {
      undo(i);
      s->tables_.assign(stages_.size(), BlockTable{});
      return st;
    }
  }
  if (host) {
    s->tokens_ = tokens_;
    s->last_logits_ = last_logits_;
    s->stale_ = stale_;
    return s;
  }
  // A device pool: the positions from the block holding the last one are
  // computed again (at most block_tokens; the same logits, batch
  // invariance), so that the fork never writes a shared block, also when a
  // generation re-evaluates its prompt's last position.
  const int32_t bt = stages_.front().pool->block_tokens();
  const int32_t shared = n > 0 ? (n - 1) / bt * bt : 0;
  s->tokens_.assign(tokens_.begin(), tokens_.begin() + shared);
  if (shared < n) {
    Result<std::span<const float>> r = s->eval(std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(shared)));
    if (!r.ok()) return r.status();  // s's destructor gives its blocks back
    if (last_logits_.empty()) s->last_logits_.clear();
  } else {
    s->last_logits_ = last_logits_;
  }
  return s;
}

Session::~Session() {
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i].pool->release(tables_[i]);
}

int32_t Session::n_vocab() const { return model_->hparams().n_vocab; }

Status Session::check_append(std::span<const TokenId> tokens) const {
  const LlamaHparams& hp = model_->hparams();
  if (tokens.empty()) return Status::invalid_argument("Session::eval: no tokens");
  for (TokenId t : tokens)
    if (t < 0 || t >= hp.n_vocab)
      return Status::invalid_argument("Session::eval: token id " + std::to_string(t) + " out of range [0, " +
                                      std::to_string(hp.n_vocab) + ")");
  const auto n = static_cast<int64_t>(tokens.size());
  const int32_t n0 = n_past();
  if (n0 + n > n_ctx_)
    return Status(StatusCode::kResourceExhausted, "context full: " + std::to_string(n0) + " + " + std::to_string(n) +
                  " tokens exceed n_ctx = " + std::to_string(n_ctx_), FailureReason::kContextFull);
  return Status();
}

Status Session::replay() {
  std::vector<TokenId> t = std::move(tokens_);
  tokens_.clear();
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i].pool->release(tables_[i]);
  stale_ = false;
  // The replayed rows were handed to the sinks when they were first appended.
  RowLogitsSink rows = std::move(row_sink_);
  RowHiddenSink hidden = std::move(hidden_sink_);
  row_sink_ = nullptr;
  hidden_sink_ = nullptr;
  Status st = t.empty() ? Status() : run(t, nullptr);
  row_sink_ = std::move(rows);
  hidden_sink_ = std::move(hidden);
  if (!st.ok()) {
    tokens_ = std::move(t);
    stale_ = true;
  }
  return st;
}

void Session::check_window(int32_t n) {
  for (size_t i = 0; i < stages_.size(); ++i)
    if (!stages_[i].pool->window_covers(tables_[i], n, 0)) stale_ = true;
}

Status Session::run(std::span<const TokenId> tokens, std::vector<float>* all_logits) {
  const LlamaHparams& hp = model_->hparams();
  SPW_RETURN_IF_ERROR(check_append(tokens));
  if (stale_) SPW_RETURN_IF_ERROR(replay());
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t n0 = n_past();
  // A block shared with a fork is never written: the one position n0 falls
  // in gets a private copy first (a no-op unless it is shared).
  for (size_t i = 0; i < stages_.size(); ++i) SPW_RETURN_IF_ERROR(stages_[i].pool->make_tail_private(tables_[i], n0));
  // Reserve KV in every stage first: all-or-nothing.
  for (size_t i = 0; i < stages_.size(); ++i) {
    Status st = stages_[i].pool->reserve(tables_[i], n0 + n);
    if (!st.ok()) {
      for (size_t j = 0; j <= i; ++j) stages_[j].pool->shrink(tables_[j], n0);
      return st;
    }
  }
  const int64_t E = hp.n_embd;
  const int64_t V = hp.n_vocab;
  const int32_t ub = options_.n_ubatch;
  if (all_logits) all_logits->assign(static_cast<size_t>(n) * static_cast<size_t>(V), 0.0f);
  std::vector<float> logits;
  for (int32_t off = 0; off < n; off += ub) {
    const int32_t m = std::min(ub, n - off);
    hidden_.resize(static_cast<size_t>(m) * static_cast<size_t>(E));
    // Sliding-window layers: their blocks for this ubatch (KvPool::slide).
    Status st;
    for (size_t i = 0; st.ok() && i < stages_.size(); ++i) st = stages_[i].pool->slide(tables_[i], n0 + off, m);
    if (st.ok()) {
      st = stages_.front().backend->embed(*model_, tokens.subspan(static_cast<size_t>(off), static_cast<size_t>(m)),
                                          hidden_.data());
    }
    for (size_t i = 0; st.ok() && i < stages_.size(); ++i) {
      KvSequence kv{stages_[i].pool.get(), &tables_[i]};
      st = stages_[i].backend->forward_layers(*model_, stages_[i].layer_begin, stages_[i].layer_end, kv, n0 + off,
                                              m, hidden_.data());
    }
    if (st.ok() && hidden_sink_) {
      hidden_sink_(n0 + off, m, std::span<const float>(hidden_.data(), static_cast<size_t>(m) * static_cast<size_t>(E)));
    }
    if (st.ok() && row_sink_) st = sink_rows(hidden_.data(), m, n0 + off, 1);
    if (st.ok()) {
      if (all_logits) {
        st = stages_.back().backend->output(*model_, hidden_.data(), m,
                                            all_logits->data() + static_cast<size_t>(off) * static_cast<size_t>(V));
      } else if (off + m == n) {
        logits.resize(static_cast<size_t>(V));
        st = stages_.back().backend->output(*model_, hidden_.data() + static_cast<size_t>(m - 1) * E, 1,
                                            logits.data());
      }
    }
    if (!st.ok()) {
      // Undo: positions >= n0 may hold partial KV; they are simply not counted.
      for (size_t j = 0; j < stages_.size(); ++j) stages_[j].pool->shrink(tables_[j], n0);
      // A later ubatch's slide may have given back window blocks the
      // positions before n0 need: the next eval evaluates them again.
      check_window(n0);
      return st;
    }
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (all_logits) {
    last_logits_.assign(all_logits->end() - V, all_logits->end());
  } else {
    last_logits_ = std::move(logits);
  }
  return Status();
}

Result<std::span<const float>> Session::eval(std::span<const TokenId> tokens) {
  if (batcher_ != nullptr) return batcher_->eval(*this, tokens);
  SPW_RETURN_IF_ERROR(run(tokens, nullptr));
  return std::span<const float>(last_logits_);
}

std::vector<Status> Session::eval_batch(std::span<Session* const> sessions, std::span<const TokenId> tokens) {
  if (sessions.size() != tokens.size()) {
    return std::vector<Status>(sessions.size(), Status::invalid_argument("Session::eval_batch: one token per session"));
  }
  std::vector<BatchPart> parts;
  parts.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) parts.push_back({sessions[i], tokens.subspan(i, 1), true});
  return eval_batch(parts);
}

std::vector<Status> Session::eval_batch(std::span<const BatchPart> parts) {
  std::vector<Status> out(parts.size());
  if (parts.empty()) return out;
  const Session& first = *parts[0].session;
  const LlamaHparams& hp = first.model_->hparams();
  // The pass runs the first session's stages: every other must run the same.
  std::vector<size_t> in;  // indices that take part
  for (size_t i = 0; i < parts.size(); ++i) {
    Session& s = *parts[i].session;
    bool same = s.model_.get() == first.model_.get() && s.stages_.size() == first.stages_.size();
    for (size_t k = 0; same && k < s.stages_.size(); ++k) {
      same = s.stages_[k].backend == first.stages_[k].backend && s.stages_[k].layer_begin == first.stages_[k].layer_begin &&
             s.stages_[k].layer_end == first.stages_[k].layer_end;
    }
    for (size_t j = 0; same && j < i; ++j) same = parts[j].session != parts[i].session;
    if (!same) {
      out[i] = Status::invalid_argument("Session::eval_batch: sessions of different stages, or one twice");
      continue;
    }
    Status st = s.check_append(parts[i].tokens);
    if (st.ok() && s.stale_) st = s.replay();  // a sliding window given back (replay)
    const int32_t n0 = s.n_past();
    const auto n = static_cast<int32_t>(parts[i].tokens.size());
    for (size_t k = 0; st.ok() && k < s.stages_.size(); ++k) st = s.stages_[k].pool->make_tail_private(s.tables_[k], n0);
    for (size_t k = 0; st.ok() && k < s.stages_.size(); ++k) {
      st = s.stages_[k].pool->reserve(s.tables_[k], n0 + n);
      if (st.ok()) st = s.stages_[k].pool->slide(s.tables_[k], n0, n);  // one chunk: nothing before n0 lost
      if (!st.ok()) {
        for (size_t j = 0; j <= k; ++j) s.stages_[j].pool->shrink(s.tables_[j], n0);
      }
    }
    if (!st.ok()) {
      out[i] = st;
      continue;
    }
    in.push_back(i);
  }
  if (in.empty()) return out;
  const int64_t E = hp.n_embd;
  const int64_t V = hp.n_vocab;
  std::vector<TokenId> toks;
  for (size_t i : in) toks.insert(toks.end(), parts[i].tokens.begin(), parts[i].tokens.end());
  const auto rows = static_cast<int64_t>(toks.size());
  std::vector<float> hidden(static_cast<size_t>(rows * E));
  Status st = first.stages_.front().backend->embed(*first.model_, toks, hidden.data());
  for (size_t k = 0; st.ok() && k < first.stages_.size(); ++k) {
    std::vector<SeqSlice> slices;
    for (size_t i : in) {
      Session& s = *parts[i].session;
      slices.push_back({KvSequence{s.stages_[k].pool.get(), &s.tables_[k]}, s.n_past(),
                        static_cast<int32_t>(parts[i].tokens.size())});
    }
    st = first.stages_[k].backend->forward_batch(*first.model_, first.stages_[k].layer_begin,
                                                 first.stages_[k].layer_end, slices, hidden.data());
  }
  // The head for the last row of each part that wants logits, in one call.
  std::vector<float> heads;
  int64_t n_heads = 0;
  {
    int64_t row = 0;
    for (size_t i : in) {
      row += static_cast<int64_t>(parts[i].tokens.size());
      if (!parts[i].logits) continue;
      heads.insert(heads.end(), hidden.begin() + (row - 1) * E, hidden.begin() + row * E);
      ++n_heads;
    }
  }
  std::vector<float> logits(static_cast<size_t>(n_heads * V));
  if (st.ok() && n_heads > 0) {
    st = first.stages_.back().backend->output(*first.model_, heads.data(), static_cast<int32_t>(n_heads),
                                              logits.data());
  }
  // Sessions that want every row's logits: the head over the rest of their
  // rows, in groups no larger than the pass's own head call.
  {
    int64_t row = 0;
    for (size_t i : in) {
      Session& s = *parts[i].session;
      const auto n = static_cast<int32_t>(parts[i].tokens.size());
      if (st.ok() && s.hidden_sink_) {
        s.hidden_sink_(s.n_past(), n,
                       std::span<const float>(hidden.data() + row * E, static_cast<size_t>(n) * static_cast<size_t>(E)));
      }
      if (st.ok() && s.row_sink_) {
        st = s.sink_rows(hidden.data() + row * E, n, s.n_past(), static_cast<int32_t>(std::max<int64_t>(n_heads, 1)));
      }
      row += n;
    }
  }
  int64_t head = 0;
  for (size_t i : in) {
    Session& s = *parts[i].session;
    if (!st.ok()) {
      for (size_t k = 0; k < s.stages_.size(); ++k) s.stages_[k].pool->shrink(s.tables_[k], s.n_past());
      out[i] = st;
      continue;
    }
    s.tokens_.insert(s.tokens_.end(), parts[i].tokens.begin(), parts[i].tokens.end());
    if (parts[i].logits) {
      s.last_logits_.assign(logits.begin() + head * V, logits.begin() + (head + 1) * V);
      ++head;
    } else {
      s.last_logits_.clear();
    }
  }
  return out;
}

Status Session::sink_rows(const float* hidden, int32_t rows, int32_t first_pos, int32_t group) {
  const int64_t E = model_->hparams().n_embd;
  const int64_t V = model_->hparams().n_vocab;
  std::vector<float> logits(static_cast<size_t>(std::min(group, rows) * V));
  for (int32_t r = 0; r < rows; r += group) {
    const int32_t g = std::min(group, rows - r);
    SPW_RETURN_IF_ERROR(stages_.back().backend->output(*model_, hidden + static_cast<int64_t>(r) * E, g, logits.data()));
    row_sink_(first_pos + r, g, std::span<const float>(logits.data(), static_cast<size_t>(g * V)));
  }
  return Status();
}

Result<std::vector<float>> Session::eval_all_logits(std::span<const TokenId> tokens) {
  std::vector<float> all;
  SPW_RETURN_IF_ERROR(run(tokens, &all));
  return all;
}

Status Session::truncate(int32_t n) {
  if (n < 0 || n > n_past())
    return Status::invalid_argument("Session::truncate(" + std::to_string(n) + "): n_past = " +
                                    std::to_string(n_past()));
  tokens_.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i].pool->shrink(tables_[i], n);
  last_logits_.clear();
  if (n == 0) stale_ = false;
  check_window(n);  // back past the sliding window: evaluated again by the next eval
  return Status();
}

Status Session::reserve_kv(int32_t n) {
  if (n < 0 || n > n_ctx_) {
    return Status::invalid_argument("Session::reserve_kv(" + std::to_string(n) + "): n_ctx = " +
                                    std::to_string(n_ctx_));
  }
  for (size_t i = 0; i < stages_.size(); ++i) {
    Status st = stages_[i].pool->reserve(tables_[i], n);
    if (!st.ok()) {
      // Give back what this call took in the earlier stages.
      for (size_t j = 0; j < i; ++j) stages_[j].pool->shrink(tables_[j], n_past());
      return st;
    }
  }
  return Status();
}

}  // namespace spw
