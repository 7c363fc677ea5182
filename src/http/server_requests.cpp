// HttpServer::Impl, request records: what the journal keeps of a request,
// read back. POST /v1/requests/{id}/resume continues an interrupted request
// from its checkpoint, a retry with a finished request's Idempotency-Key
// replays its stored result, GET /v1/requests[/{id}] lists the requests in
// flight or shows one's record, DELETE cancels one. Apart from generation
// because none of it runs a request from a new body.
#include <cstdio>

#include "http/server_impl.h"

namespace spw::http {

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A request id from the path: the journal's number, or the OpenAI id of a
// response ("cmpl-<16 hex>" / "chatcmpl-<16 hex>", the number in hex).
std::optional<int64_t> parse_request_id(const std::string& text) {
  auto digits = [](const std::string& s, int base) -> std::optional<int64_t> {
    if (s.empty() || s.size() > (base == 10 ? 18u : 16u)) return std::nullopt;
    uint64_t v = 0;
    for (char ch : s) {
      int d = -1;
      if (ch >= '0' && ch <= '9')
        d = ch - '0';
      else if (base == 16 && ch >= 'a' && ch <= 'f')
        d = ch - 'a' + 10;
      if (d < 0) return std::nullopt;
      v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    if (v == 0 || v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  };
  for (const char* prefix : {"chatcmpl-", "cmpl-"}) {
    if (text.starts_with(prefix)) return digits(text.substr(std::string_view(prefix).size()), 16);
  }
  return digits(text, 10);
}

}  // namespace

// POST /v1/requests/{id}/resume: an interrupted request (a resumable
// error, or a server killed mid-request) continues from its journaled
// checkpoint, after the text the client says it has.
void HttpServer::Impl::resume_request(const Request& req, Response& res, const Principal& who) {
  const std::string text = req.params[0];
  if (!service_.has_journal()) {
    ApiError e;
    e.http_status = 404;
    e.code = "not_found";
    e.message = "this server keeps no request journal (start it with --journal PATH), so nothing can be resumed";
    return set_error(res, e);
  }
  std::optional<int64_t> id = parse_request_id(text);
  if (!id) {
    ApiError e;
    e.code = "invalid_value";
    e.param = "id";
    e.message = "request id '" + text + "': expected a positive integer or a response id (cmpl-<hex>, chatcmpl-<hex>)";
    return set_error(res, e);
  }
  ResumeBody body;
  if (auto err = parse_resume_request(req.body, body)) return set_error(res, *err);
  Result<bool> migrate = allow_migration(req);
  if (!migrate.ok()) return set_error(res, api_error_from_status(migrate.status()));
  gateway::ResumeCommand cmd;
  cmd.caller = service_caller(who);
  cmd.public_id = *id;
  cmd.received_text = body.received_text;
  cmd.allow_migration = *migrate;
  gateway::Refusal refusal;
  Result<gateway::ResumeOutcome> resumed = service_.resume(cmd, &refusal);
  if (!resumed.ok()) {
    const Status& st = resumed.status();
    if (st.code() == StatusCode::kNotFound) return set_error(res, not_found(text));
    if (st.reason() == FailureReason::kReplayMismatch || st.reason() == FailureReason::kNotResumable ||
        st.reason() == FailureReason::kJournalUnavailable) {
      return set_error(res, api_error_from_status(st));
    }
    return refuse(res, st, refusal);
  }
  auto call = std::make_shared<Call>();
  call->chat = resumed->endpoint == "/v1/chat/completions";
  call->record_id = resumed->record_id;
  call->model = options_.model_name;
  call->info.model = options_.model_name;
  call->ticket = resumed->ticket;
  call->unsent = std::move(resumed->unsent);
  call->public_id = *id;
  call->id = response_id(call->chat, *id);
  call->created = env_.wall_time_ms() / 1000;
  fill_route(*call);
  call->info.request_id = static_cast<uint64_t>(*id);
  call->info.seed = call->ticket->seed();
  call->info.resumed_at_token = resumed->resumed_at_token;
  res.set_header("X-Spillway-Resumed-At-Token", std::to_string(resumed->resumed_at_token));
  respond(req, call, res, body.stream);
}

// A journaled body read back (a resume's limits and start checkpoint).
Result<gateway::StoredRequest> HttpServer::Impl::parse_stored(const journal::Record& r) {
  gateway::StoredRequest out;
  SamplingFields sampling;
  // out.model: the model it named, as served now (an id no longer served:
  // the service's model, which the body was then read for).
  if (auto e = generation_from_body(r.body, r.endpoint == "/v1/chat/completions", out.generation, sampling, nullptr,
                                    nullptr, nullptr, nullptr, &out.model)) {
    return Status::invalid_argument(e->message);
  }
  out.seed_given = sampling.seed.has_value();
  out.n = sampling.n;
  out.max_tokens_requested = sampling.max_tokens;
  return out;
}

gateway::RequestServiceOptions HttpServer::Impl::service_options() {
  gateway::RequestServiceOptions o;
  o.journal = options_.journal;
  o.separate_owners = keys_configured();
  o.encode_decision = [](const admission::Decision& d) { return render_decision(d); };
  o.parse_stored = [this](const journal::Record& r) { return parse_stored(r); };
  return o;
}

// 404 for a request id this client cannot see.
ApiError HttpServer::Impl::not_found(const std::string& text) {
  ApiError e;
  e.http_status = 404;
  e.code = "not_found";
  e.message = "request " + text.substr(0, 64) +
              " not found (never accepted, another client's, or older than the journal's retention)";
  return e;
}

// The OpenAI id: derived from the journal id when there is one, so that a
// replay answers with the id of the original response.
std::string HttpServer::Impl::response_id(bool chat, int64_t record_id) {
  const uint64_t v = record_id != 0 ? static_cast<uint64_t>(record_id) : env_.random_u64();
  return std::string(chat ? "chatcmpl-" : "cmpl-") + hex64(v);
}

// A finished request's stored result, as the original response was shaped
// (a body, or a stream of one text chunk).
void HttpServer::Impl::replay(Call& c, const journal::Record& r, bool stream, Response& res) {
  c.id = response_id(c.chat, r.public_id);
  c.created = r.created_ms / 1000;
  c.info.placement = r.placement;
  // Where it ran, as its response said (the decision it ran under).
  const StoredRoute route = stored_route(r.admission);
  c.info.path = route.path;
  c.info.decision = route.decision;
  c.info.reason = route.reason;
  c.info.degraded = route.degraded;
  c.info.request_id = static_cast<uint64_t>(r.public_id);
  c.info.limits.n_ctx = gateway_.primary().scheduler->n_ctx();
  c.info.limits.prompt_tokens = r.outcome.prompt_tokens;
  c.info.limits.max_tokens = r.outcome.completion_tokens;
  // What the original response said about itself.
  c.info.limits.max_tokens_requested = r.outcome.max_tokens_requested;
  if (r.outcome.seed) c.info.seed = *r.outcome.seed;
  c.info.queue_ms = r.outcome.queue_ms;
  c.info.run_ms = r.outcome.run_ms;
  c.info.replayed = true;
  res.set_header("X-Spillway-Placement", r.placement);
  res.set_header("X-Spillway-Request-Id", std::to_string(r.public_id));
  res.set_header("X-Spillway-Replayed", "true");
  res.status = 200;
  // n > 1: choices 1.. (a stored value that does not decode shows none).
  std::vector<journal::StoredChoice> more;
  if (!r.outcome.choices.empty()) {
    Result<std::vector<journal::StoredChoice>> d = journal::decode_choices(r.outcome.choices);
    if (d.ok()) more = std::move(*d);
  }
  if (!stream) {
    CompletionResult out;
    out.id = c.id;
    out.created = c.created;
    out.model = c.model;
    // The stored text parsed as the original response parsed it: the same
    // calls with the same ids (they carry the request's id).
    ToolCallStream::Released released = tool_pass(c, r.outcome.text, true);
    out.text = c.echo + released.content;
    out.tool_calls = std::move(released.calls);
    out.finish_reason = finish_name(c, r.outcome.finish_reason);
    out.prompt_tokens = r.outcome.prompt_tokens;
    out.completion_tokens = r.outcome.completion_tokens;
    out.spillway = c.info;
    for (journal::StoredChoice& ch : more)
      out.more_choices.push_back({std::move(ch.text), std::move(ch.finish_reason), {}});
    res.set_content(c.chat ? render_chat_completion(out) : render_completion(out), kJson);
    return;
  }
  std::string body = chunk(c, "", "", /*first=*/true, /*with_info=*/true);
  if (!c.echo.empty()) body += chunk(c, c.echo, "", false, false);
  body += released_chunks(c, tool_pass(c, r.outcome.text, true), false, std::nullopt);
  // n > 1: each further choice's text in a chunk of its index.
  for (size_t i = 0; i < more.size(); ++i) {
    if (!more[i].text.empty())
      body += chunk(c, more[i].text, "", false, false, std::nullopt, static_cast<int32_t>(i + 1));
  }
  for (size_t i = 0; i < more.size(); ++i) {
    body += chunk(c, "", more[i].finish_reason, false, false, std::nullopt, static_cast<int32_t>(i + 1));
  }
  body += chunk(c, "", finish_name(c, r.outcome.finish_reason), false, true);
  body += kSseDone;
  res.set_header("Cache-Control", "no-cache");
  res.set_content(body, "text/event-stream");
}

ApiError HttpServer::Impl::bad_request_id(const std::string& text) {
  ApiError e;
  e.param = "id";
  e.code = "invalid_value";
  e.message = "request id '" + text.substr(0, 64) +
              "': expected the request_id a response carried, or its response id (cmpl-<hex>, chatcmpl-<hex>)";
  return e;
}

void HttpServer::Impl::request_record(const Request& req, Response& res, const Principal& who) {
  ApiError e;
  e.http_status = 404;
  e.code = "not_found";
  const std::string& text = req.params[0];
  if (!service_.has_journal()) {
    e.message = "this server keeps no request journal (start it with --journal PATH)";
    return set_error(res, e);
  }
  const std::optional<int64_t> parsed = parse_request_id(text);
  if (!parsed) return set_error(res, bad_request_id(text));
  Result<journal::Record> r = service_.find_record(*parsed, service_caller(who));
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kNotFound) return set_error(res, not_found(text));
    return set_error(res, api_error_from_status(r.status()));
  }
  // Clients know a request by its public id; the journal's row number
  // stays inside.
  journal::Record shown = std::move(*r);
  shown.id = shown.public_id;
  res.status = 200;
  res.set_content(render_request_record(shown), kJson);
}

// DELETE /v1/requests/{id}: the id the response's spillway.request_id
// carried.
void HttpServer::Impl::cancel_request(const Request& req, Response& res, const Principal& who) {
  const std::string& text = req.params[0];
  const std::optional<int64_t> id = parse_request_id(text);
  if (!id) return set_error(res, bad_request_id(text));
  Result<gateway::CancelOutcome> c = service_.cancel(*id, service_caller(who));
  if (!c.ok()) {
    ApiError e;
    e.http_status = 404;
    e.code = "not_found";
    e.message =
        "request " + text.substr(0, 64) + " is not in flight (finished, never accepted, another client's, or unknown)";
    return set_error(res, e);
  }
  res.set_content(
      render_cancel(static_cast<uint64_t>(*id), c->cancelled, std::string(serve::request_state_name(c->state))), kJson);
}

// GET /v1/requests: the requests in flight this client may see, oldest
// first, each with its path, decision, limits, queue position and
// estimated delay as of now.
void HttpServer::Impl::list_requests(Response& res, const Principal& who) {
  std::vector<LiveRequestView> out;
  const int64_t now = env_.now_ns();
  for (const gateway::InFlightRequest& e : service_.in_flight(service_caller(who))) {
    const int64_t public_id = e.public_id;
    const std::shared_ptr<serve::Ticket>& t = e.ticket;
    Call c;
    c.ticket = t;
    fill_route(c);
    const gateway::Progress p = gateway_.progress(*t);
    c.info.queue_position = p.queue_position;
    c.info.estimated_delay_ms = p.queue_position > 0 ? finite_ms(p.estimated_delay_s) : std::optional<double>(0.0);
    c.info.request_id = static_cast<uint64_t>(public_id);
    c.info.seed = t->seed();
    LiveRequestView v;
    v.id = response_id(e.chat, public_id);
    v.endpoint = e.chat ? "chat.completions" : "completions";
    v.state = std::string(serve::request_state_name(t->state()));
    v.info = std::move(c.info);
    v.generated = t->generated();
    v.age_s = static_cast<double>(now - e.accepted_ns) / 1e9;
    out.push_back(std::move(v));
  }
  res.set_content(render_live_requests(out), kJson);
}

}  // namespace spw::http
