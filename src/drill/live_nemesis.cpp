// The live drill's nemesis (live_internal.h): device faults armed through the
// admin API, allocation probes, queue cancellations, server kills, and the
// streams it starts to have something to hit.
#include "drill/live_internal.h"

namespace spw::drill::live_detail {

// ---------------------------------------------------------------- nemesis

const RequestClass* longest_class(const Scenario& sc, bool need_stream) {
  const RequestClass* best = nullptr;
  for (const RequestClass& c : sc.classes) {
    if (need_stream && !c.stream) continue;
    if (!best || c.max_tokens * c.prompt_repeat > best->max_tokens * best->prompt_repeat) best = &c;
  }
  return best;
}

// A stream of the nemesis's own (recorded like any client's), always
// streamed: it is how the nemesis knows a request runs or waits.
void nemesis_stream(Drill& d, const RequestClass* cls, const std::string& phase) {
  if (!cls) return;
  RequestClass c = *cls;
  c.stream = true;
  auto owned = std::make_shared<RequestClass>(c);
  RequestPlan p;
  p.cls = owned.get();
  p.phase = phase;
  p.client = 1000 + d.next_client_++;
  p.seed = c.greedy ? 0 : kReferenceSeed;
  d.spawn_worker([&d, owned, p] { run_request(d, p); });
}

Status post_fault(Drill& d, const json& body, json* answer) {
  try {
    auto c = client(d, 5);
    auto r = c->Post("/v1/admin/faults", {{"Authorization", "Bearer " + d.admin_token_}}, body.dump(), "application/json");
    if (!r) return Status::unavailable("POST /v1/admin/faults: " + httplib::to_string(r.error()));
    *answer = parse_json(r->body);
    if (r->status != 201) return Status::failed_precondition("POST /v1/admin/faults: HTTP " + std::to_string(r->status) + " " + tail(r->body, 300));
    return Status();
  } catch (const std::exception& e) {
    return Status::internal(std::string("POST /v1/admin/faults: ") + e.what());
  }
}

// Tokens of `prompt` as the server counts them (POST /v1/quote); -1 when it
// does not answer.
int64_t quoted_prompt_tokens(Drill& d, const std::string& prompt) {
  try {
    auto c = client(d, 5);
    const json body = {{"prompt", prompt}, {"max_tokens", 1}};
    auto r = c->Post("/v1/quote", body.dump(), "application/json");
    if (!r || r->status != 200) return -1;
    const json q = parse_json(r->body);
    if (!q.is_object() || !q.contains("limits") || !q["limits"].is_object()) return -1;
    return jint(q["limits"], "prompt_tokens", -1);
  } catch (const std::exception&) {
    return -1;
  }
}

// The allocation an armed alloc_fail meets. Spillway allocates a path's
// weights, KV pool and scratch at start, so serving allocates device memory
// only when a request needs more scratch than any before it: the attention
// scores grow with the positions a prefill attends to. The probe is a
// streamed request whose prompt nearly fills the path's context, longer
// than any class's, so its prefill is what allocates, before generation.
void alloc_probe(Drill& d, const std::string& path, const std::string& phase) {
  const RequestClass* base = longest_class(d.sc_, false);
  auto it = d.path_info_.find(path);
  if (!base || it == d.path_info_.end()) return;
  const int64_t n_ctx = jint(it->second, "n_ctx", 0);
  auto c = std::make_shared<RequestClass>(*base);
  c->name = "alloc_probe";
  c->max_tokens = 8;
  c->greedy = true;
  c->idempotency_share = 0;
  c->retry_share = 0;
  // The most repeats of the class prompt that leave room for the tokens.
  int32_t best = std::max(1, base->prompt_repeat);
  for (int32_t r = best + 1; r <= best * 8; ++r) {
    std::string p;
    for (int32_t i = 0; i < r; ++i) p += base->prompt;
    const int64_t n = quoted_prompt_tokens(d, p);
    if (n < 0 || n + c->max_tokens + 2 > n_ctx) break;
    c->prompt_repeat = r;
  }
  RequestPlan plan;
  plan.cls = c.get();
  plan.phase = phase;
  plan.client = 1000 + d.next_client_++;
  d.spawn_worker([&d, c, plan] { run_request(d, plan); });
}

void arm_device_fault(Drill& d, const FaultSpec& f, const std::string& phase) {
  const std::string kind(fault_kind_name(f.kind));
  if (!d.own_server_) {
    d.event(kind, "skipped: an external server (--server) gives the drill no admin token");
    return;
  }
  std::string note;
  if (f.kind == FaultKind::kDeviceLost) {
    // Mid-generation: a stream must be generating on that path when armed.
    auto generating = [&] {
      for (const InFlight& fl : d.inflight())
        if (fl.generating && fl.path == f.path) return true;
      return false;
    };
    if (!generating()) {
      nemesis_stream(d, longest_class(d.sc_, false), phase);
      const auto until = Clock::now() + std::chrono::seconds(15);
      while (!generating() && Clock::now() < until && !d.abort_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!generating()) note = "; no stream was generating on " + f.path + " within 15 s (armed anyway)";
    }
  }
  json body = {{"kind", kind}, {"path", f.path}, {"count", f.count}};
  if (f.kind == FaultKind::kDeviceLost) body["after_submits"] = f.after_submits;
  json answer;
  const Status st = post_fault(d, body, &answer);
  if (!st.ok()) {
    d.event(kind, "arming failed: " + st.message());
    return;
  }
  d.armed(Armed{jint(answer, "id"), kind, f.path, f.count, false});
  if (f.kind == FaultKind::kAllocFail) note += "; a long-prompt probe meets it (the first allocation since start)";
  d.event(kind, "armed on " + f.path + " (fault " + std::to_string(jint(answer, "id")) + ", count " +
                    std::to_string(f.count) + (f.kind == FaultKind::kDeviceLost ? ", after " + std::to_string(f.after_submits) + " submissions" : "") + ")" + note);
  if (f.kind == FaultKind::kAllocFail) alloc_probe(d, f.path, phase);
}

// Cancels a request that waits in the CPU path's queue: the nemesis's own
// streams fill the queues until one waits there; DELETE it (op "cancel").
void cancel_one_queued(Drill& d, const std::string& queue_path, const std::string& phase) {
  const std::string target = !queue_path.empty() ? queue_path : !d.cpu_path_.empty() ? d.cpu_path_ : d.first_path_;
  const RequestClass* cls = longest_class(d.sc_, false);
  // A burst large enough to fill the path's workers and put some in its queue.
  int burst = 6;
  if (auto it = d.path_info_.find(target); it != d.path_info_.end()) {
    burst = static_cast<int>(std::clamp<int64_t>(jint(it->second, "workers", 1) + jint(it->second, "queue_capacity", 4), 2, 12));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto next_burst = Clock::now();
  int launched = 0;
  std::optional<InFlight> any;
  std::set<int64_t> tried;  // DELETEs that found the request gone from the queue
  while (Clock::now() < deadline && !d.abort_.load()) {
    std::optional<InFlight> pick;
    for (const InFlight& f : d.inflight()) {
      if (!f.queued || f.request_id <= 0 || d.was_cancelled(f.request_id) || tried.count(f.request_id)) continue;
      if (f.path == target) pick = f;
      if (!any) any = f;
    }
    if (pick) {
      Op base;
      base.client = 999;
      base.t_ms = d.now_ms();
      base.f = "cancel";
      base.phase = phase;
      base.request_id = pick->request_id;
      base.path = pick->path;
      const Op inv = d.invoke(base);
      d.mark_cancelled(pick->request_id);
      Op r = inv;
      try {
        auto c = client(d, 5);
        auto res = c->Delete(("/v1/requests/" + std::to_string(pick->request_id)).c_str());
        r.t_ms = d.now_ms();
        r.latency_ms = r.t_ms - inv.t_ms;
        if (!res) {
          r.type = OpType::kInfo;
          r.error_message = httplib::to_string(res.error());
        } else {
          r.http_status = res->status;
          const json j = parse_json(res->body);
          r.type = res->status == 200 && jbool(j, "cancelled") ? OpType::kOk : OpType::kFail;
          r.accepted = res->status == 200;
          r.error_message = "state at cancel: " + jstr(j, "state");
          if (j.contains("error")) r.error_code = jstr(j["error"], "code");
        }
      } catch (const std::exception& e) {
        r.type = OpType::kInfo;
        r.error_message = e.what();
      }
      // On a fast machine the request can leave the queue between the look
      // and the DELETE: that race is no failure of the server (the answer
      // says the state it found), so it is recorded as info and another
      // queued request is tried until the deadline.
      const bool raced = r.type == OpType::kFail && r.http_status == 200;
      if (raced) r.type = OpType::kInfo;
      d.complete(inv, r);
      d.event("cancel_queued", "DELETE /v1/requests/" + std::to_string(pick->request_id) + " (waiting on " + pick->path +
                                   "): HTTP " + std::to_string(r.http_status) + ", " + r.error_message +
                                   (raced ? " (it left the queue first; trying another)" : ""));
      if (!raced) return;
      d.unmark_cancelled(pick->request_id);  // it runs on: its outcome counts as any other's
      tried.insert(pick->request_id);
      continue;
    }
    if (Clock::now() >= next_burst && launched < 3 * burst) {
      for (int i = 0; i < burst; ++i) nemesis_stream(d, cls, phase);
      launched += burst;
      next_burst = Clock::now() + std::chrono::seconds(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  d.event("cancel_queued", "no request was seen waiting in the " + target + " queue within 10 s (" +
                               std::to_string(launched) + " streams sent to fill it" +
                               (any ? "; one waited on " + any->path : std::string()) + "); nothing cancelled");
}

void kill_server(Drill& d, const FaultSpec& f, CoTenants& cot) {
  if (!d.own_server_) {
    d.event("kill", "skipped: the drill did not start this server (--server)");
    return;
  }
  d.server_down_.store(true);
  const pid_t pid = d.server_pid_.exchange(-1);
  if (pid > 0) {
    kill(pid, SIGKILL);
    (void)wait_exit(pid, 10);
  }
  char after[32];
  std::snprintf(after, sizeof after, "%.1f", f.restart_after_s);
  d.event("kill", "SIGKILL to spillway serve (pid " + std::to_string(pid) + "); restart in " + after + " s");
  {
    std::lock_guard<std::mutex> lk(d.armed_mu_);
    for (Armed& a : d.armed_unlocked()) {
      if (!a.reported) d.event("fault_lost", a.kind + " (fault " + std::to_string(a.id) + ") had not fired when the server died");
      a.reported = true;
    }
  }
  sleep_until_ms(d, d.now_ms() + f.restart_after_s * 1000.0);
  const double t = d.now_ms();
  Status st = start_server(d);
  if (!st.ok()) {
    // The port may still be held briefly; one more try before giving up.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    st = start_server(d);
  }
  if (!st.ok()) {
    d.event("restart_failed", st.message());
    return;
  }
  d.event("restart", "spillway serve back on the same journal and port " + std::to_string(d.port_.load()) + " after " +
                         std::to_string(static_cast<int64_t>(d.now_ms() - t)) + " ms of start-up");
  cot.redeclare();
}

void fire(Drill& d, const FaultSpec& f, const Phase& ph, CoTenants& cot) {
  switch (f.kind) {
    case FaultKind::kPressure:
      d.event("pressure", "competing workload to " + format_byte_size(f.bytes) + " (declared)");
      cot.set(f.bytes, ph.undeclared_bytes);
      return;
    case FaultKind::kAllocFail:
    case FaultKind::kDeviceLost:
      arm_device_fault(d, f, ph.name);
      return;
    case FaultKind::kCancelQueued:
      for (int32_t i = 0; i < std::max(1, f.count); ++i) cancel_one_queued(d, f.path, ph.name);
      return;
    case FaultKind::kKill:
      kill_server(d, f, cot);
      return;
  }
}

}  // namespace spw::drill::live_detail
