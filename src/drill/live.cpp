// Live drill: see live.h for the contract. This file: the server, one HTTP
// exchange (a completion, a resume, a replay) parsed into what the client
// saw, a client's request with its continuations, arrivals, the sampler, and
// run_live() tying them together; the helpers, the shared context and the
// competing workload are in live_internal.h, the nemesis in live_nemesis.cpp.
// Every exception of nlohmann or httplib is caught here: none leaves
// run_live.
#include "drill/live.h"

#include "drill/live_internal.h"

namespace spw::drill {

std::string prompt_key(const std::string& cls, bool greedy, uint64_t seed) {
  return greedy ? cls + "/greedy" : cls + "/seed=" + std::to_string(seed);
}

namespace live_detail {

// ---------------------------------------------------------------- server

// A scenario's file: as given when it exists (or is absolute), else under
// the first of o.search_dirs that has it.
std::string resolve_file(const std::string& file, const LiveOptions& o) {
  const fs::path m(file);
  if (m.is_absolute() || fs::exists(m)) return m.string();
  for (const auto& dir : o.search_dirs) {
    const fs::path p = fs::path(dir) / m;
    if (fs::exists(p)) return p.string();
  }
  return m.string();  // serve names it when missing
}

std::string resolve_model(const Scenario& sc, const LiveOptions& o) { return resolve_file(sc.server.model, o); }

// Starts the server (port 0 the first time, then the same port) and waits
// for its ready line and /health/ready.
Status start_server(Drill& d) {
  const int n = ++d.server_starts_;
  const std::string out = (fs::path(d.o_.work_dir) / ("serve-" + std::to_string(n) + ".out")).string();
  const std::string err = (fs::path(d.o_.work_dir) / ("serve-" + std::to_string(n) + ".log")).string();
  std::vector<std::string> args = d.server_args_;
  args.insert(args.begin() + 2, {"--port", std::to_string(d.port_.load())});
  const pid_t pid = spawn(args, out, err);
  if (pid < 0) return Status::internal("fork failed starting the server");
  d.server_pid_.store(pid);
  const auto deadline = Clock::now() + std::chrono::duration<double>(d.o_.ready_timeout_s);
  int port = 0;
  while (Clock::now() < deadline) {
    if (auto code = wait_exit(pid, 0)) {
      d.server_pid_.store(-1);
      return Status::unavailable("spillway serve exited with status " + std::to_string(*code) +
                                 " before it was ready; its log (" + err + ") ends: " + tail(read_file(err), 1500));
    }
    const std::string text = read_file(out);
    const std::string mark = "listening on http://127.0.0.1:";
    const size_t at = text.find(mark);
    if (at != std::string::npos) {
      port = std::atoi(text.c_str() + at + mark.size());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port <= 0) {
    stop_process(pid, SIGKILL, 0);
    d.server_pid_.store(-1);
    return Status::deadline_exceeded("spillway serve printed no ready line within " +
                                     std::to_string(static_cast<int>(d.o_.ready_timeout_s)) + " s; its log (" + err +
                                     ") ends: " + tail(read_file(err), 1500));
  }
  d.port_.store(port);
  const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  d.server_down_.store(false);
  if (!wait_ready(d, std::max(1.0, left))) {
    return Status::deadline_exceeded("spillway serve on port " + std::to_string(port) +
                                     " did not answer /health/ready 200 in time; log: " + err);
  }
  return Status();
}

// ---------------------------------------------------------------- exchange

void take_spillway(const json& sp, Exchange& x) {
  if (!sp.is_object()) return;
  if (jstr(sp, "state") == "queued") {
    x.queued = true;
    if (!jstr(sp, "path").empty()) x.path = jstr(sp, "path");
    x.queue_position = static_cast<int32_t>(jint(sp, "queue_position"));
    return;
  }
  if (const int64_t id = jint(sp, "request_id"); id > 0) x.request_id = id;
  if (sp.contains("path") && sp["path"].is_string()) x.path = sp["path"].get<std::string>();
  if (!jstr(sp, "placement").empty()) x.placement = jstr(sp, "placement");
  if (!jstr(sp, "model").empty()) x.model = jstr(sp, "model");
  if (!jstr(sp, "decision").empty()) x.decision = jstr(sp, "decision");
  if (!jstr(sp, "reason").empty()) x.reason = jstr(sp, "reason");
  if (sp.contains("degraded") && sp["degraded"].is_boolean()) x.degraded = sp["degraded"].get<bool>();
  if (jbool(sp, "replayed")) x.replayed = true;
  if (sp.contains("queue_ms") && sp["queue_ms"].is_number()) x.queue_ms = sp["queue_ms"].get<double>();
  x.migrations = std::max<int32_t>(x.migrations, static_cast<int32_t>(jint(sp, "migrations")));
  if (x.reason.rfind("failover from", 0) == 0) x.failovers = std::max(x.failovers, 1);
  if (sp.contains("queue_position") && sp["queue_position"].is_number()) {
    x.queue_position = static_cast<int32_t>(jint(sp, "queue_position"));
    x.queued = x.queue_position > 0 && x.text.empty();
  }
  // Shown: said degraded, and where (path, model), with which limits and
  // what delay to expect.
  if (x.degraded && sp["path"].is_string() && sp["model"].is_string() && sp.contains("limits") &&
      sp["limits"].is_object() && sp.contains("estimated_delay_ms")) {
    x.degraded_shown = true;
  }
}

void take_error(const json& e, Exchange& x) {
  x.error_event = true;
  if (!e.is_object()) return;
  x.error_code = jstr(e, "code");
  x.error_message = jstr(e, "message");
  if (const int64_t id = jint(e, "request_id"); id > 0) {
    x.request_id = id;
    x.resumable = true;
  }
  if (x.error_code == "resumable") x.resumable = true;
}

// One completion-shaped body (a completion, or a stream chunk).
void take_body(const json& j, Exchange& x, double t_invoke_ms, const Drill& d) {
  if (!j.is_object()) return;
  if (j.contains("error")) take_error(j["error"], x);
  if (j.contains("spillway")) take_spillway(j["spillway"], x);
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const json& ch = j["choices"][0];
    const std::string t = jstr(ch, "text");
    if (!t.empty()) {
      if (x.ttft_ms < 0) x.ttft_ms = d.now_ms() - t_invoke_ms;
      x.text += t;
      x.queued = false;
    }
    if (!jstr(ch, "finish_reason").empty()) x.finish_reason = jstr(ch, "finish_reason");
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    x.completion_tokens = static_cast<int32_t>(jint(j["usage"], "completion_tokens", x.completion_tokens));
  }
}

// POSTs `body` to `path` (a completion or a resume) and reads the answer, a
// stream event at a time when `stream`; `progress` sees the exchange after
// the headers and each event.
Exchange exchange(Drill& d, const std::string& path, const std::string& body, const httplib::Headers& headers,
                  bool stream, double t_invoke_ms, const std::function<void(const Exchange&)>& progress) {
  Exchange x;
  try {
    auto c = client(d, stream ? 20 : 90);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = headers;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    std::string raw, buf;
    bool sse = false;
    req.response_handler = [&](const httplib::Response& r) {
      x.http_status = r.status;
      sse = r.get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
      const std::string id = r.get_header_value("X-Spillway-Request-Id");
      if (!id.empty()) x.request_id = std::atoll(id.c_str());
      if (!r.get_header_value("X-Spillway-Path").empty()) x.path = r.get_header_value("X-Spillway-Path");
      if (r.get_header_value("X-Spillway-Replayed") == "true") x.replayed = true;
      // The headers go out at admission; a queued stream's first chunk only
      // with its first token (or the keep-alive), so the queue position is
      // read here.
      const std::string pos = r.get_header_value("X-Spillway-Queue-Position");
      if (!pos.empty()) {
        x.queue_position = std::atoi(pos.c_str());
        x.queued = x.queue_position > 0;
      }
      if (progress) progress(x);
      return !d.abort_.load();
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (!sse) {
        raw.append(data, n);
        return !d.abort_.load();
      }
      buf.append(data, n);
      size_t end;
      while ((end = buf.find("\n\n")) != std::string::npos) {
        const std::string ev = buf.substr(0, end);
        buf.erase(0, end + 2);
        std::istringstream lines(ev);
        std::string line;
        while (std::getline(lines, line)) {
          if (line.rfind("data: ", 0) != 0) continue;  // ": keep-alive" and others
          const std::string payload = line.substr(6);
          if (payload == "[DONE]") {
            x.finished = true;
            continue;
          }
          take_body(parse_json(payload), x, t_invoke_ms, d);
          if (progress) progress(x);
        }
      }
      return !d.abort_.load();
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = c->send(req, res, err);
    if (!sent) {
      x.transport = httplib::to_string(err);
      if (err == httplib::Error::Connection) {
        x.connect_failed = true;
      } else {
        x.cut = true;
      }
      x.finished = false;
      return x;
    }
    if (!sse) {
      const json j = parse_json(raw);
      take_body(j, x, t_invoke_ms, d);
      x.finished = j.is_object();
      if (!j.is_object()) {
        x.error_code = "unparsable_body";
        x.error_message = tail(raw, 300);
      }
    } else if (!x.finished) {
      x.cut = true;  // the stream ended without [DONE]
      x.transport = "stream ended without [DONE]";
    }
    if (x.http_status != 200 && !x.error_event) x.error_event = true;
  } catch (const std::exception& e) {
    x.cut = true;
    x.transport = std::string("exception: ") + e.what();
  }
  return x;
}

// The completion op of `inv` from what the exchange gave.
Op completion_of(const Drill& d, const Op& inv, const Exchange& x) {
  Op r = inv;
  r.t_ms = d.now_ms();
  r.http_status = x.http_status;
  r.error_code = x.error_code;
  r.error_message = x.error_message;
  if (x.connect_failed || (x.cut && x.http_status == 0)) {
    r.error_code = r.error_code.empty() ? (x.connect_failed ? "connection_failed" : "no_answer") : r.error_code;
    r.error_message = r.error_message.empty() ? x.transport : r.error_message;
  } else if (x.cut && r.error_message.empty()) {
    r.error_message = x.transport;
  }
  r.request_id = x.request_id > 0 ? x.request_id : inv.request_id;
  r.accepted = x.request_id > 0 || (x.http_status == 200 && (x.finished || !x.text.empty()));
  r.path = x.path;
  r.placement = x.placement;
  // A replay's spillway object names the placement only: the path of that
  // placement, so that figures by path count it where it ran.
  if (r.path.empty() && !r.placement.empty()) {
    for (const auto& [name, info] : d.path_info_) {
      if (jstr(info, "placement") == r.placement && (x.model.empty() || jstr(info, "model") == x.model)) {
        r.path = name;
        break;
      }
    }
  }
  r.model = x.model;
  r.decision = x.decision;
  r.reason = x.reason;
  // Degraded: not on its model's first-choice path (the first path, or a
  // catalogue model's own primary one, "gpu/NAME").
  bool first_choice = x.path == d.first_path_;
  if (auto it = d.path_info_.find(x.path); it != d.path_info_.end()) {
    first_choice = first_choice || jstr(it->second, "role") == "primary";
  }
  r.degraded = x.degraded || (!x.path.empty() && !first_choice);
  r.degraded_shown = x.degraded_shown;
  r.replayed = x.replayed;
  r.text = x.text;
  r.completion_tokens = x.completion_tokens;
  r.finish_reason = x.finish_reason;
  r.ttft_ms = x.ttft_ms;
  r.latency_ms = r.t_ms - inv.t_ms;
  r.queue_ms = x.queue_ms;
  r.failovers = x.failovers;
  r.migrations = x.migrations;
  if (x.connect_failed) {
    r.type = OpType::kFail;  // nothing was sent: it definitely did not happen
  } else if (x.cut) {
    r.type = OpType::kInfo;
  } else if (x.http_status == 200 && x.finished && !x.error_event && !x.finish_reason.empty()) {
    r.type = OpType::kOk;
  } else if (x.http_status == 200 && x.finished && !x.error_event) {
    r.type = OpType::kInfo;  // answered, but without a finish: not whole
  } else {
    r.type = OpType::kFail;
  }
  return r;
}

// ---------------------------------------------------------------- requests

// The request fields of `op` only: the invoke of a continuation carries what
// is asked, not what the operation it continues received.
Op request_part(const Op& op) {
  Op r;
  r.client = op.client;
  r.f = op.f;
  r.continues = op.continues;
  r.phase = op.phase;
  r.cls = op.cls;
  r.prompt_key = op.prompt_key;
  r.stream = op.stream;
  r.greedy = op.greedy;
  r.seed = op.seed;
  r.max_tokens = op.max_tokens;
  r.idempotency_key = op.idempotency_key;
  return r;
}

std::string completion_body(const RequestClass& cls, uint64_t seed) {
  std::string prompt;
  for (int32_t i = 0; i < std::max(1, cls.prompt_repeat); ++i) prompt += cls.prompt;
  json b = {{"prompt", prompt}, {"max_tokens", cls.max_tokens}, {"stream", cls.stream}};
  if (!cls.model.empty()) b["model"] = cls.model;
  if (cls.greedy) {
    b["temperature"] = 0;
  } else {
    b["temperature"] = 0.8;
    b["seed"] = seed;
  }
  return b.dump();
}

// Runs one exchange as an op (invoke + completion), tracking the stream for
// the nemesis. `on_progress` (optional) also sees it.
Op run_op(Drill& d, Op base, const std::string& path, const std::string& body, const httplib::Headers& h,
          Exchange* out, const std::function<void(const Exchange&)>& on_progress = nullptr) {
  const Op inv = d.invoke(std::move(base));
  const int64_t key = d.track(InFlight{});
  auto progress = [&](const Exchange& x) {
    if (x.request_id > 0) d.saw_request(x.request_id);
    d.update(key, InFlight{x.request_id, x.path, x.queued, !x.text.empty()});
    if (on_progress) on_progress(x);
  };
  Exchange x = exchange(d, path, body, h, inv.stream, inv.t_ms, progress);
  d.untrack(key);
  d.saw_request(x.request_id);
  Op res = completion_of(d, inv, x);
  d.complete(inv, res);
  res.op_id = inv.op_id;
  if (out) *out = std::move(x);
  return res;
}

// Reads the journal's record of `id` (bounded retries while the server is
// coming back); null when unreadable.
json read_record(Drill& d, int64_t id, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    auto [st, body] = get(d, "/v1/requests/" + std::to_string(id), 3);
    if (st == 200) return parse_json(body);
    if (st == 404 || Clock::now() >= deadline) return json();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

bool terminal_state(const std::string& s) { return s == "done" || s == "failed" || s == "cancelled"; }

// An accepted request whose answer was cut or ended resumable: read its
// record once the server answers, then read the finished text, resume from
// the checkpoint, or (idempotent, no checkpoint) send it again under its key.
void continue_request(Drill& d, const Op& first, const std::string& body, int64_t rid, std::string received) {
  int64_t last = first.op_id;
  bool tried_without_checkpoint = false;
  for (int round = 0; round < 5 && !d.abort_.load(); ++round) {
    if (!wait_ready(d, 60)) {
      d.event("client_gave_up", "request " + std::to_string(rid) + ": server not ready within 60 s");
      return;
    }
    json rec = read_record(d, rid, 10);
    // Still in flight on the server (our side timed out): wait for its end.
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (rec.is_object() && !terminal_state(jstr(rec, "state")) && Clock::now() < until && !d.abort_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      rec = read_record(d, rid, 10);
    }
    if (!rec.is_object() || !terminal_state(jstr(rec, "state"))) return;
    const std::string state = jstr(rec, "state");
    Op base = request_part(first);
    base.request_id = rid;  // the request this continues (a retry under a key may get it anew)
    base.continues = last;
    base.t_ms = d.now_ms();
    if (state == "done") {
      // It finished while we were cut off: the rest of its text is stored.
      base.f = "read";
      const Op inv = d.invoke(base);
      Op r = inv;
      r.t_ms = d.now_ms();
      const std::string stored = jstr(rec, "text");
      r.type = OpType::kOk;
      r.http_status = 200;
      r.request_id = rid;
      r.accepted = true;
      r.placement = jstr(rec, "placement");
      if (rec.contains("admission") && rec["admission"].is_object()) r.path = jstr(rec["admission"], "path");
      r.finish_reason = jstr(rec, "finish_reason");
      r.latency_ms = r.t_ms - inv.t_ms;
      if (stored.compare(0, received.size(), received) == 0) {
        r.text = stored.substr(received.size());
      } else {
        r.text = stored;
        r.error_message = "stored text does not continue the text received";
      }
      d.complete(inv, r);
      return;
    }
    if (d.was_cancelled(rid) || state == "cancelled") return;
    // A resumable record is resumed, checkpoint or not: without one the
    // server says why it cannot (409), which the history keeps; a keyed
    // request then goes again under its key.
    const bool has_checkpoint = rec.contains("checkpoint_tokens") && rec["checkpoint_tokens"].is_number();
    if (jbool(rec, "resumable") && !(tried_without_checkpoint && !has_checkpoint)) {
      tried_without_checkpoint = tried_without_checkpoint || !has_checkpoint;
      base.f = "resume";
      const json rb = {{"received_text", received}, {"stream", first.stream}};
      Exchange x;
      Op r = run_op(d, base, "/v1/requests/" + std::to_string(rid) + "/resume", rb.dump(), {}, &x);
      last = r.op_id;
      received += x.text;
      if (r.type == OpType::kOk) return;
      if (r.type == OpType::kFail && !x.resumable && r.http_status != 409 && r.http_status != 503) return;
      if (r.http_status == 409 && !has_checkpoint && first.idempotency_key.empty()) return;
      continue;
    }
    if (!first.idempotency_key.empty()) {
      base.f = "retry";
      Exchange x;
      Op r = run_op(d, base, "/v1/completions", body, {{"Idempotency-Key", first.idempotency_key}}, &x);
      last = r.op_id;
      received = x.text;  // a retry runs (or replays) from the start
      if (r.type == OpType::kOk) return;
      if (r.type == OpType::kFail && !x.resumable) return;
      if (x.request_id > 0) rid = x.request_id;
      continue;
    }
    return;  // failed for good, as its record says
  }
}

void run_request(Drill& d, const RequestPlan& p) {
  const RequestClass& cls = *p.cls;
  Op base;
  base.client = p.client;
  base.t_ms = d.now_ms();
  base.f = "complete";
  base.phase = p.phase;
  base.cls = cls.name;
  base.prompt_key = prompt_key(cls.name, cls.greedy, p.seed);
  base.stream = cls.stream;
  base.greedy = cls.greedy;
  base.seed = p.seed;
  base.max_tokens = cls.max_tokens;
  httplib::Headers h;
  if (p.idempotent) {
    static std::atomic<int64_t> n{0};
    base.idempotency_key = "drill-" + random_hex(6) + "-" + std::to_string(++n);
    h.emplace("Idempotency-Key", base.idempotency_key);
  }
  const std::string body = completion_body(cls, p.seed);
  Exchange x;
  const Op r = run_op(d, base, "/v1/completions", body, h, &x);
  if (r.type == OpType::kOk) {
    if (p.idempotent && p.retry_after) {
      Op again = base;
      again.f = "retry";
      again.continues = r.op_id;
      again.t_ms = d.now_ms();
      run_op(d, again, "/v1/completions", body, h, nullptr);
    }
    return;
  }
  if (x.request_id > 0 && d.was_cancelled(x.request_id)) return;
  const bool interrupted = r.type == OpType::kInfo || (r.type == OpType::kFail && x.resumable);
  if (interrupted && x.request_id > 0) {
    continue_request(d, r, body, x.request_id, x.text);
  } else if (r.type == OpType::kInfo && p.idempotent) {
    // Cut before we learned an id: the key finds it (replay, or a re-run
    // of a failed one under the same id).
    if (!wait_ready(d, 60)) return;
    Op again = request_part(base);
    again.f = "retry";
    again.continues = r.op_id;
    again.t_ms = d.now_ms();
    Exchange y;
    const Op r2 = run_op(d, again, "/v1/completions", body, h, &y);
    if ((r2.type == OpType::kInfo || (r2.type == OpType::kFail && y.resumable)) && y.request_id > 0) {
      continue_request(d, r2, body, y.request_id, y.text);
    }
  }
}

// ---------------------------------------------------------------- arrivals

class Arrivals {
 public:
  Arrivals(uint64_t seed, const RequestClass* cls, double rate, double start_ms, double end_ms, std::string phase)
      : rng_(seed), cls_(cls), rate_(rate), next_ms_(start_ms), end_ms_(end_ms), phase_(std::move(phase)) {
    advance();
  }
  // The next arrival (time, plan) while the phase lasts.
  std::optional<std::pair<double, RequestPlan>> take() {
    std::lock_guard<std::mutex> lk(mu_);
    if (next_ms_ >= end_ms_) return std::nullopt;
    RequestPlan p;
    p.cls = cls_;
    p.phase = phase_;
    std::uniform_real_distribution<double> u(0, 1);
    p.idempotent = u(rng_) < cls_->idempotency_share;
    p.retry_after = u(rng_) < cls_->retry_share;
    p.seed = cls_->greedy ? 0 : rng_() % 1000000;
    const double at = next_ms_;
    advance();
    return std::make_pair(at, p);
  }
  double end_ms() const { return end_ms_; }

 private:
  void advance() {
    std::exponential_distribution<double> gap(rate_);
    next_ms_ += gap(rng_) * 1000.0;
  }
  std::mutex mu_;
  std::mt19937_64 rng_;
  const RequestClass* cls_;
  double rate_, next_ms_, end_ms_;
  std::string phase_;
};

void sleep_until_ms(Drill& d, double t_ms) {
  while (!d.abort_.load()) {
    const double left = t_ms - d.now_ms();
    if (left <= 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(std::min(left, 100.0)) + 1));
  }
}

// ---------------------------------------------------------------- sampler

void sampler(Drill& d) {
  std::map<std::string, std::string> breaker;
  bool was_up = true;
  const httplib::Headers admin = {{"Authorization", "Bearer " + d.admin_token_}};
  while (!d.stop_sampler_.load()) {
    const double t = d.now_ms();
    Sample s;
    s.t_ms = t;
    s.competing_bytes = d.competing_.load();
    auto [st, body] = get(d, "/v1/status", 1);
    const json j = st == 200 ? parse_json(body) : json();
    s.up = j.is_object();
    if (s.up) {
      if (j.contains("paths") && j["paths"].is_array()) {
        for (const json& p : j["paths"]) {
          PathSample ps;
          ps.name = jstr(p, "name");
          ps.queue_depth = static_cast<int32_t>(jint(p, "queue_depth"));
          ps.running = static_cast<int32_t>(jint(p, "running"));
          ps.oldest_queued_s = jdbl(p, "oldest_queued_s");
          if (p.contains("breaker") && p["breaker"].is_object()) ps.breaker = jstr(p["breaker"], "state");
          auto prev = breaker.find(ps.name);
          const std::string before = prev == breaker.end() ? "closed" : prev->second;
          if (!ps.breaker.empty() && ps.breaker != before) {
            std::string detail = ps.name + ": " + before + " -> " + ps.breaker;
            const json& b = p["breaker"];
            if (!jstr(b, "reason").empty()) detail += " (" + jstr(b, "reason") + ")";
            d.event("breaker_" + ps.breaker, detail);
          }
          if (!ps.breaker.empty()) breaker[ps.name] = ps.breaker;
          s.paths.push_back(ps);
        }
      }
      bool device_done = false;
      if (j.contains("ledgers") && j["ledgers"].is_array()) {
        for (const json& l : j["ledgers"]) {
          uint64_t reserved_total = 0, cotenants = 0;
          if (l.contains("reserved_bytes") && l["reserved_bytes"].is_object()) {
            for (auto& [k, v] : l["reserved_bytes"].items()) {
              const uint64_t b = v.is_number() ? v.get<uint64_t>() : 0;
              if (k == "co-tenant") cotenants += b;
              else reserved_total += b;
            }
          }
          if (jstr(l, "name") == "host") {
            s.host_budget = juint(l, "limit_bytes");
            s.host_reserved = reserved_total + cotenants;
          } else if (!device_done) {
            device_done = true;
            s.device_capacity = juint(l, "capacity_bytes");
            s.device_limit = juint(l, "limit_bytes");
            s.device_ours = reserved_total;
            s.device_cotenants = cotenants + juint(l, "others_bytes");
            s.device_used = juint(l, "used_bytes");
          }
        }
      }
    }
    if (d.own_server_) {
      const pid_t pid = d.server_pid_.load();
      s.host_rss = vm_rss(pid);
      // An exit we did not cause is a finding: record it once.
      if (pid > 0 && !d.server_down_.load()) {
        if (auto code = wait_exit(pid, 0)) {
          d.server_pid_.store(-1);
          d.event("server_exited", "spillway serve exited on its own with status " + std::to_string(*code));
        }
      }
    }
    if (s.up != was_up && !d.server_down_.load()) {
      d.event(s.up ? "server_up" : "server_unresponsive", "GET /v1/status " + std::string(s.up ? "answers" : "does not answer"));
    }
    was_up = s.up;
    const bool up = s.up;
    d.sample(std::move(s));
    // Armed device faults: report each when it fires.
    if (d.own_server_ && up) {
      bool pending = false;
      {
        std::lock_guard<std::mutex> lk(d.armed_mu_);
        for (const Armed& a : d.armed_unlocked()) pending = pending || !a.reported;
      }
      if (pending) {
        auto [fst, fbody] = get(d, "/v1/admin/faults", 1, admin);
        const json fj = fst == 200 ? parse_json(fbody) : json();
        if (fj.is_object() && fj.contains("data") && fj["data"].is_array()) {
          std::lock_guard<std::mutex> lk(d.armed_mu_);
          for (Armed& a : d.armed_unlocked()) {
            for (const json& f : fj["data"]) {
              if (a.reported || jint(f, "id") != a.id || jint(f, "fired") <= 0) continue;
              a.reported = true;
              d.event("fault_fired", a.kind + " on " + a.path + " (fault " + std::to_string(a.id) + "): fired " +
                                         std::to_string(jint(f, "fired")) + " of " + std::to_string(a.count) +
                                         " after " + std::to_string(jint(f, "seen")) + " events");
            }
          }
        }
      }
    }
    const double next = t + d.o_.sample_period_s * 1000.0;
    while (!d.stop_sampler_.load() && d.now_ms() < next) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------- the run

Status read_paths(Drill& d) {
  auto [st, body] = get(d, "/v1/status", 5);
  const json j = st == 200 ? parse_json(body) : json();
  if (!j.is_object() || !j.contains("paths") || !j["paths"].is_array() || j["paths"].empty()) {
    return Status::unavailable("GET /v1/status gave no paths (HTTP " + std::to_string(st) + "): " + tail(body, 300));
  }
  d.first_path_ = jstr(j["paths"][0], "name");
  for (const json& p : j["paths"]) {
    const std::string name = jstr(p, "name"), placement = jstr(p, "placement");
    d.path_info_[name] = p;
    const Result<Placement> where = Placement::parse(placement);
    if (!where.ok()) continue;  // a placement this drill does not know: neither side
    if (where->kind == Placement::Kind::kCpu && d.cpu_path_.empty()) d.cpu_path_ = name;
    if (where->kind != Placement::Kind::kCpu) d.gpu_side_.insert(name);
  }
  std::string names;
  for (const auto& [n, p] : d.path_info_) names += (names.empty() ? "" : ", ") + n + "=" + jstr(p, "placement");
  std::string not_built;
  if (j.contains("paths_not_built") && j["paths_not_built"].is_array()) {
    for (const json& n : j["paths_not_built"]) not_built += "; not built: " + jstr(n, "path") + " (" + jstr(n, "reason") + ")";
  }
  d.event("server", "paths " + names + "; first choice " + d.first_path_ + "; overflow " + jstr(j, "overflow") + not_built);
  return Status();
}

Status reference_pass(Drill& d) {
  History& h = d.unsafe_history();
  for (const RequestClass& cls : d.sc_.classes) {
    RequestClass c = cls;
    c.stream = false;
    const uint64_t seed = c.greedy ? 0 : kReferenceSeed;
    const std::string key = prompt_key(c.name, c.greedy, seed);
    if (h.reference.count(key)) continue;
    Exchange x = exchange(d, "/v1/completions", completion_body(c, seed), {}, false, d.now_ms(), nullptr);
    if (x.http_status != 200 || x.finish_reason.empty()) {
      return Status::unavailable("reference run of class '" + c.name + "' failed: HTTP " + std::to_string(x.http_status) +
                                 " " + x.error_code + " " + x.error_message + x.transport);
    }
    h.reference[key] = x.text;
  }
  return Status();
}

void read_finals(Drill& d) {
  std::map<int64_t, FinalRecord> finals;
  for (int64_t id : d.request_ids()) {
    FinalRecord f;
    f.request_id = id;
    const json r = read_record(d, id, 5);
    if (r.is_object()) {
      f.found = true;
      f.state = jstr(r, "state");
      if (r.contains("error") && r["error"].is_object()) f.error_code = jstr(r["error"], "code");
      f.text = jstr(r, "text");
      f.placement = jstr(r, "placement");
      f.runs = static_cast<int32_t>(jint(r, "attempts", 1));
      if (r.contains("admission") && r["admission"].is_object()) {
        const json& a = r["admission"];
        const std::string path = jstr(a, "path");
        if (d.gpu_side_.count(path) && a.contains("pressure") && a["pressure"].is_number()) {
          f.admitted_under_reserve = a["pressure"].get<double>() <= 1.0;
        }
      }
    }
    finals[id] = std::move(f);
  }
  History& h = d.unsafe_history();
  h.finals = std::move(finals);
}

}  // namespace live_detail

using namespace live_detail;

Result<History> run_live(const Scenario& sc, const LiveOptions& o) {
  try {
    std::error_code ec;
    fs::create_directories(o.work_dir, ec);
    if (ec) return Status::io_error("cannot create the drill's work folder " + o.work_dir + ": " + ec.message());
    if (sc.classes.empty()) return Status::invalid_argument("scenario '" + sc.name + "' has no request classes");

    Drill d(sc, o);
    History& h0 = d.unsafe_history();
    h0.scenario = sc.name;
    h0.mode = mode_name(o.overflow);
    h0.seed = sc.seed;

    // 1. The server.
    if (o.server_url.empty()) {
      if (o.spillway_binary.empty() || !fs::exists(o.spillway_binary)) {
        return Status::invalid_argument("the spillway binary '" + o.spillway_binary + "' does not exist");
      }
      d.own_server_ = true;
      d.admin_token_ = random_hex(16);
      const std::string journal = (fs::path(o.work_dir) / "journal.sqlite").string();
      for (const char* suffix : {"", "-wal", "-shm", ".lock"}) fs::remove(journal + suffix, ec);
      d.server_args_ = {o.spillway_binary, "serve", "--host", "127.0.0.1", "--model", resolve_model(sc, o),
                        "--device", sc.server.device, "--journal", journal, "--admin-token", d.admin_token_,
                        "--overflow", o.overflow.empty() ? "planned" : o.overflow,
                        // The drill's co-tenant stands for real memory: it may take it all.
                        "--reservation-max-share", "1"};
      if (!sc.server.device_memory.empty()) {
        d.server_args_.insert(d.server_args_.end(), {"--device-memory", sc.server.device_memory});
      }
      d.server_args_.insert(d.server_args_.end(), sc.server.args.begin(), sc.server.args.end());
      // The catalogue (NAME=FILE), its files found as the model's is.
      for (const std::string& m : sc.server.models) {
        const size_t eq = m.find('=');
        d.server_args_.insert(d.server_args_.end(), {"--model", m.substr(0, eq + 1) + resolve_file(m.substr(eq + 1), o)});
      }
      d.port_.store(0);
      d.log("starting spillway serve (overflow " + o.overflow + ") in " + o.work_dir);
      SPW_RETURN_IF_ERROR(start_server(d));
    } else {
      const std::string prefix = "http://";
      std::string rest = o.server_url.rfind(prefix, 0) == 0 ? o.server_url.substr(prefix.size()) : o.server_url;
      while (!rest.empty() && rest.back() == '/') rest.pop_back();
      const size_t colon = rest.rfind(':');
      if (colon == std::string::npos) return Status::invalid_argument("--server " + o.server_url + ": expected http://HOST:PORT");
      d.host_ = rest.substr(0, colon);
      d.port_.store(std::atoi(rest.c_str() + colon + 1));
      if (d.port_.load() <= 0) return Status::invalid_argument("--server " + o.server_url + ": expected http://HOST:PORT");
      if (!wait_ready(d, o.ready_timeout_s)) return Status::unavailable(o.server_url + " did not answer /health/ready 200");
    }
    // From here everything we started is stopped on every return.
    CoTenants cot(d);
    auto stop_all = [&] {
      d.abort_.store(true);
      d.stop_sampler_.store(true);
      cot.stop_all();
      if (d.own_server_) {
        const pid_t pid = d.server_pid_.exchange(-1);
        stop_process(pid, SIGTERM, 15);
      }
    };
    if (Status st = read_paths(d); !st.ok()) {
      stop_all();
      return st;
    }
    h0.first_path = d.first_path_;

    // 2. The clean reference run.
    d.log("reference run: " + std::to_string(sc.classes.size()) + " classes");
    if (Status st = reference_pass(d); !st.ok()) {
      stop_all();
      return st;
    }

    // 3. Phases, with the sampler throughout.
    std::thread sampler_thread([&d] { sampler(d); });
    struct Joiner {
      Drill& d;
      std::thread& t;
      ~Joiner() {
        d.stop_sampler_.store(true);
        if (t.joinable()) t.join();
      }
    } sampler_joiner{d, sampler_thread};
    const double hard_deadline_ms = d.now_ms() + (sc.total_s() + sc.drain_s + 120.0) * 1000.0;
    uint64_t phase_index = 0;
    for (const Phase& ph : sc.phases) {
      ++phase_index;
      const double start = d.now_ms();
      const double end = start + ph.duration_s * 1000.0;
      d.event("phase", ph.name + " (" + std::to_string(static_cast<int>(ph.duration_s)) + " s; co-tenant " +
                           format_byte_size(ph.cotenant_bytes) + ", undeclared " +
                           format_byte_size(ph.undeclared_bytes) + ")");
      uint64_t load_index = 0;
      for (const Phase::Load& l : ph.load) {
        ++load_index;
        const RequestClass* cls = sc.find_class(l.cls);
        if (!cls || l.rate_per_s <= 0) continue;
        auto arrivals = std::make_shared<Arrivals>(sc.seed * 1000003 + phase_index * 1009 + load_index, cls,
                                                   l.rate_per_s, start, end, ph.name);
        for (int32_t i = 0; i < std::max(1, l.concurrency); ++i) {
          const int32_t id = d.next_client_++;
          d.spawn_worker([&d, arrivals, id] {
            while (auto a = arrivals->take()) {
              sleep_until_ms(d, a->first);
              if (d.abort_.load() || d.now_ms() >= arrivals->end_ms()) break;
              a->second.client = id;
              run_request(d, a->second);
            }
          });
        }
      }
      // The nemesis, on this thread: the phase's holdings, then its faults.
      cot.set(ph.cotenant_bytes, ph.undeclared_bytes);
      std::vector<FaultSpec> faults = ph.faults;
      std::stable_sort(faults.begin(), faults.end(), [](const FaultSpec& a, const FaultSpec& b) { return a.at_s < b.at_s; });
      for (const FaultSpec& f : faults) {
        sleep_until_ms(d, start + f.at_s * 1000.0);
        fire(d, f, ph, cot);
      }
      sleep_until_ms(d, end);
      if (o.on_phase_end) o.on_phase_end(ph.name, d.snapshot());
    }

    // 4. Drain: in-flight requests end, interrupted ones are continued.
    cot.stop_all();
    const double drain_end = d.now_ms() + sc.drain_s * 1000.0;
    d.event("drain", std::to_string(d.active()) + " clients still busy; waiting up to " +
                         std::to_string(static_cast<int>(sc.drain_s)) + " s");
    while (d.active() > 0 && d.now_ms() < std::min(drain_end, hard_deadline_ms)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (d.active() > 0) {
      d.event("drain_timeout", std::to_string(d.active()) + " clients still busy at the end of the drain: aborted");
      d.abort_.store(true);
    }
    d.join_workers();
    if (d.own_server_ && d.server_pid_.load() <= 0) {
      // It died on its own (recorded): start it once more to read the journal.
      if (Status st = start_server(d); st.ok()) d.event("restart", "for the final reads, after an unplanned exit");
    }
    d.abort_.store(false);
    read_finals(d);
    d.stop_sampler_.store(true);
    if (sampler_thread.joinable()) sampler_thread.join();
    const double duration = d.now_ms();
    stop_all();
    History h = d.take();
    h.duration_ms = duration;
    return h;
  } catch (const std::exception& e) {
    return Status::internal(std::string("live drill: unexpected exception: ") + e.what());
  }
}

}  // namespace spw::drill
