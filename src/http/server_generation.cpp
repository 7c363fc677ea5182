// HttpServer::Impl, generation: POST /v1/completions and
// /v1/chat/completions. The body becomes the engine's request (chat through
// the template), the gateway admits or refuses it, and the response goes out
// whole or as a stream of chunks, tool calls parsed out of the text. Apart
// from server.cpp because it is the largest group and the one a change to the
// OpenAI routes touches.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iterator>
#include <variant>

#include "http/completion_prompt.h"
#include "http/server_impl.h"

#include "core/duration.h"

namespace spw::http {

namespace {

std::vector<const char*> turn_end_markers(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML:
      return {"<|im_end|>", "<|im_start|>"};
    case ChatTemplateKind::kLlama3:
      return {"<|eot_id|>", "<|start_header_id|>"};
    case ChatTemplateKind::kGemma:
      return {"<end_of_turn>", "<start_of_turn>"};
    case ChatTemplateKind::kZephyr:
      return {"<|user|>", "<|system|>"};
    default:
      return {"[INST]"};
  }
}

}  // namespace

serve::GenerationRequest HttpServer::Impl::to_generation(const SamplingFields& s) {
  serve::GenerationRequest g;
  if (s.temperature) g.sampler.temperature = *s.temperature;
  if (s.top_p) g.sampler.top_p = *s.top_p;
  if (s.top_k) g.sampler.top_k = *s.top_k;
  if (s.min_p) g.sampler.min_p = *s.min_p;
  if (s.repeat_penalty) g.sampler.repeat_penalty = *s.repeat_penalty;
  if (s.repeat_last_n) g.sampler.repeat_last_n = *s.repeat_last_n;
  if (s.frequency_penalty) g.sampler.frequency_penalty = *s.frequency_penalty;
  if (s.presence_penalty) g.sampler.presence_penalty = *s.presence_penalty;
  g.sampler.logit_bias = s.logit_bias;
  g.ignore_eos = s.ignore_eos;
  g.min_tokens = s.min_tokens.value_or(0);
  g.constraint = s.constraint;
  g.stop_token_ids = s.stop_token_ids;
  // A request without a seed gets a fresh one, reported back so it can be
  // replayed: 53 bits, so that a client can send it back (openai.h: seed).
  g.sampler.seed = s.seed ? *s.seed : env_.random_u64() >> 11;
  g.max_tokens = s.max_tokens;
  g.stop = s.stop;
  g.logprobs = s.logprobs ? *s.logprobs : -1;
  g.n = s.n;
  return g;
}

// The route model for a body's `model` (into *out); the 404 for an id this
// server does not answer to.
std::optional<ApiError> HttpServer::Impl::resolve_model(const std::string& requested, std::string* out) const {
  std::variant<std::string, ApiError> r = models_.resolve(requested);
  if (auto* e = std::get_if<ApiError>(&r)) return std::move(*e);
  *out = std::get<std::string>(std::move(r));
  return std::nullopt;
}

// A completion or chat body -> the engine's request (chat: through the
// template, with its end-of-turn stops) and, when route_model is given, the
// body's `model` resolved (ModelCatalog::resolve: a 404 for an id this
// server does not serve; a stored body, parsed again without route_model,
// keeps the id it was accepted under even if --alias changed since, and is
// read with the served model's tokenizer and template when its id is no
// longer served); read_model (optional): the route model the body was read
// for either way. nullopt on success, else the error.
std::optional<ApiError> HttpServer::Impl::generation_from_body(const std::string& body, bool chat,
                                                               serve::GenerationRequest& g, SamplingFields& sampling,
                                                               std::string* route_model, ToolUse* tool_use,
                                                               std::string* prompt_text, bool* echo,
                                                               std::string* read_model) {
  std::string model;
  auto resolve = [&](const std::string& requested) -> std::optional<ApiError> {
    if (route_model) {
      if (auto e = resolve_model(requested, route_model)) return e;
      model = *route_model;
    } else if (auto r = models_.resolve(requested); std::holds_alternative<std::string>(r)) {
      model = std::get<std::string>(r);
    }
    return std::nullopt;
  };
  if (chat) {
    ChatRequest cr;
    if (auto e = parse_chat_request(body, cr)) return e;
    if (auto e = resolve(cr.model)) return e;
    const ModelChat mc = model_chat(model);
    if (!mc.kind) {
      ApiError e;
      e.param = "messages";
      e.code = "chat_template_missing";
      e.message = "model '" + (model.empty() ? options_.model_name : model) +
                  "' has no chat template that Spillway recognises (tokenizer.chat_template is missing or of an "
                  "unknown family); start the server with --chat-template NAME (e.g. chatml, llama2, llama3, "
                  "mistral, zephyr, gemma), or use /v1/completions";
      return e;
    }
    // The template writes BOS itself where its reference does, with the
    // vocabulary's own BOS/EOS texts; so the tokenizer must not add another.
    const Tokenizer& tok = gateway_.tokenizer_for(model);
    ChatSpecialTexts special;
    if (tok.bos_id() >= 0) special.bos = tok.token_text(tok.bos_id());
    if (tok.eos_id() >= 0) special.eos = tok.token_text(tok.eos_id());
    if (!cr.tools.empty() && !chat_template_renders_tools(*mc.kind)) {
      ApiError e;
      e.param = "tools";
      e.code = "unsupported_parameter";
      e.message = "the server's chat template (" + std::string(chat_template_name(*mc.kind)) +
                  ") has no tool-call format Spillway renders; tools work with the chatml, llama3, mistral-v3, "
                  "mistral-v3-tekken and mistral-v7-tekken templates";
      return e;
    }
    Result<std::string> prompt = apply_chat_template(*mc.kind, cr.messages, true, special, cr.tools);
    if (!prompt.ok()) {
      ApiError e = api_error_from_status(prompt.status());
      if (e.http_status == 400 && e.param.empty()) e.param = "messages";
      return e;
    }
    sampling = cr.sampling;
    g = to_generation(sampling);
    g.prompt = std::move(prompt).value();
    g.add_bos = false;
    // End-of-turn markers: control tokens in real chat vocabularies (then
    // is_eog ends the turn), but plain text in others; stop on them either way.
    for (const char* marker : turn_end_markers(*mc.kind)) g.stop.emplace_back(marker);
    if (!cr.tools.empty()) {
      // A call in progress is no place to split the generation: its
      // arguments must come from one run.
      const ToolFormat format = tool_format(*mc.kind);
      g.safe_points = tool_safe_points(format);
      if (tool_use) *tool_use = {format, cr.parallel_tool_calls};
    }
  } else {
    CompletionRequest cr;
    if (auto e = parse_completion_request(body, cr)) return e;
    if (auto e = resolve(cr.model)) return e;
    sampling = cr.sampling;
    if (!sampling.max_tokens) sampling.max_tokens = options_.completion_default_max_tokens;
    if (auto e = check_prompt_tokens(cr, gateway_.tokenizer_for(model).n_vocab())) return e;
    g = to_generation(sampling);
    // The prompt's text as its echo and text_offset read it: a token-id
    // prompt decoded (only for that: the engine gets the ids themselves).
    if (prompt_text) *prompt_text = cr.prompt_tokens ? gateway_.tokenizer_for(model).decode(*cr.prompt_tokens) : cr.prompt;
    if (echo) *echo = cr.echo;
    if (cr.echo && sampling.logprobs) g.prompt_logprobs = *sampling.logprobs;
    g.prompt = std::move(cr.prompt);
    g.prompt_tokens = std::move(cr.prompt_tokens);
    g.add_bos = true;  // when the vocabulary wants one (add_bos_token); not for token ids
  }
  // As llama.cpp's server: control-token texts in the prompt are those tokens.
  g.parse_special = true;
  if (read_model) *read_model = model;
  // Ids are the served model's (a fallback model of a smaller vocabulary
  // ignores the ones past it: engine/sampler.h).
  return check_token_ids(sampling, gateway_.tokenizer_for(model).n_vocab());
}

void HttpServer::Impl::completion(const Request& req, Response& res, const Principal& who, bool chat) {
  // Header checks first: they cost nothing.
  const size_t n_keys = req.header_count("Idempotency-Key");
  if (n_keys > 1) {
    ApiError e;
    e.param = "Idempotency-Key";
    e.code = "invalid_value";
    e.message = "Idempotency-Key: sent " + std::to_string(n_keys) + " times; send it once";
    return set_error(res, e, options_.model_name);
  }
  const std::string key = req.header("Idempotency-Key");
  if (key.size() > 255 || std::any_of(key.begin(), key.end(), [](char ch) { return ch < 0x20 || ch > 0x7e; })) {
    ApiError e;
    e.param = "Idempotency-Key";
    e.code = "invalid_value";
    e.message = "Idempotency-Key: at most 255 printable ASCII characters";
    return set_error(res, e, options_.model_name);
  }
  Result<bool> migrate = allow_migration(req);
  if (!migrate.ok()) return set_error(res, api_error_from_status(migrate.status()), options_.model_name);

  serve::GenerationRequest g;
  SamplingFields sampling;
  std::string route_model;
  ToolUse tool_use;
  std::string prompt_text;
  bool echo = false;
  if (auto e = generation_from_body(req.body, chat, g, sampling, &route_model, &tool_use, &prompt_text, &echo)) {
    return set_error(res, *e, options_.model_name);
  }

  auto call = std::make_shared<Call>();
  call->chat = chat;
  call->include_usage = sampling.include_usage;
  call->logprobs = sampling.logprobs.has_value();
  if (!chat) call->text_offset = count_chars(prompt_text);  // OpenAI counts from the prompt's start
  call->n = sampling.n;
  call->choice_offsets.assign(static_cast<size_t>(call->n), call->text_offset);
  if (echo) call->echo = std::move(prompt_text);
  call->model = options_.model_name;
  call->info.model = options_.model_name;
  gateway::RouteRequest route;
  route.generation = std::move(g);
  route.allow_shrink = header_true(req, "X-Spillway-Allow-Shrink");
  route.allow_migration = *migrate;
  route.model = std::move(route_model);
  route.keep_alive_s = sampling.keep_alive_s;
  if (req.has_header("X-Spillway-Keep-Alive")) {
    auto ka = parse_duration_s(req.header("X-Spillway-Keep-Alive"));
    if (!ka.ok()) {
      ApiError e;
      e.param = "X-Spillway-Keep-Alive";
      e.code = "invalid_value";
      e.message = "X-Spillway-Keep-Alive: " + ka.status().message();
      return set_error(res, e, options_.model_name);
    }
    route.keep_alive_s = *ka;
  }

  gateway::Submission sub;
  sub.caller = service_caller(who);
  sub.endpoint = req.path;
  sub.body = req.body;
  sub.idempotency_key = key;
  sub.chat = chat;
  // A token-id prompt's length is known exactly at submit: no bound here.
  sub.prompt_bytes = route.generation.prompt_tokens ? 0 : route.generation.prompt.size();
  sub.route = std::move(route);
  gateway::SubmitOutcome out = service_.submit(std::move(sub));
  if (out.kind == gateway::SubmitOutcome::Kind::kRefused) {
    return refuse(res, out.status, out.refusal, out.public_id);
  }
  call->record_id = out.record_id;
  call->public_id = out.public_id;
  start_tools(*call, tool_use);
  if (out.kind == gateway::SubmitOutcome::Kind::kReplay) return replay(*call, *out.record, sampling.stream, res);
  call->ticket = out.ticket;
  call->id = response_id(chat, call->public_id);
  call->created = env_.wall_time_ms() / 1000;
  fill_route(*call);
  call->attempts = out.recorded_attempts;
  call->info.request_id = static_cast<uint64_t>(call->public_id);
  call->info.seed = call->ticket->seed();
  respond(req, call, res, sampling.stream);
}

// X-Spillway-Migrate: "auto" (default) or "never".
Result<bool> HttpServer::Impl::allow_migration(const Request& req) {
  if (!req.has_header("X-Spillway-Migrate")) return true;
  std::string v = req.header("X-Spillway-Migrate");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (v == "auto") return true;
  if (v == "never") return false;
  return invalid_field("X-Spillway-Migrate", "X-Spillway-Migrate: expected \"auto\" or \"never\", got \"" +
                                                 req.header("X-Spillway-Migrate") + "\"");
}

// A refusal by the gateway: its error, the decision's reason and Retry-After.
// public_id: the journal row the refusal was recorded as (0: none), so
// that the client can read why and a retry can name it.
void HttpServer::Impl::refuse(Response& res, const Status& st, const gateway::Refusal& refusal, int64_t public_id) {
  const ApiError e = api_error_from_status(st);
  // In the header only: the error object's request_id means "resume
  // this", which a refusal is not.
  if (public_id != 0) res.set_header("X-Spillway-Request-Id", std::to_string(public_id));
  if (refusal.decision.kind != admission::DecisionKind::kReject || refusal.decision.verdicts.empty()) {
    return set_error(res, e, options_.model_name);
  }
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) {  // worth retrying: say when
    const double retry = refusal.decision.http_status == 429 ? refusal.decision.retry_after_s : 1.0;
    res.set_header("Retry-After", std::to_string(static_cast<int>(std::ceil(std::max(1.0, retry)))));
  }
  res.set_header("X-Spillway-Decision", "reject");
  res.set_content(render_refusal(e, options_.model_name, refusal.decision), kJson);
}

// Where a call runs and why, as headers: what fill_route read (one reading
// of the ticket). Completions and embeddings alike.
void HttpServer::Impl::route_headers(const Call& c, Response& res) {
  res.set_header("X-Spillway-Placement", c.info.placement);
  res.set_header("X-Spillway-Path", c.info.path);
  res.set_header("X-Spillway-Model", c.model);
  res.set_header("X-Spillway-Fallback-Model", c.info.fallback_model ? "true" : "false");
  res.set_header("X-Spillway-Decision", c.info.decision);
  res.set_header("X-Spillway-Degraded", c.info.degraded ? "true" : "false");
  res.set_header("X-Spillway-Queue-Position", std::to_string(c.info.queue_position));
  if (c.info.estimated_delay_ms) {
    res.set_header("X-Spillway-Estimated-Delay-Ms", std::to_string(static_cast<int64_t>(*c.info.estimated_delay_ms)));
  }
}

// Headers from the call's route, then the body or the stream.
void HttpServer::Impl::respond(const Request& req, const std::shared_ptr<Call>& call, Response& res, bool stream_it) {
  const bool chat = call->chat;
  route_headers(*call, res);
  res.set_header("X-Spillway-Max-Tokens", std::to_string(call->info.limits.max_tokens));
  res.set_header("X-Spillway-Context", std::to_string(call->info.limits.n_ctx));
  res.set_header("X-Spillway-Request-Id", std::to_string(call->info.request_id));
  if (const ModelChat mc = model_chat(call->model); chat && mc.kind) {
    res.set_header("X-Spillway-Chat-Template",
                   std::string(chat_template_name(*mc.kind)) + (mc.is_default ? "; default" : ""));
  }

  // A client that goes away cancels its request at the next token
  // boundary, streaming or not (the transport notices the closed socket).
  req.disconnect->on_gone([this, t = call->ticket] {
    if (!serve::is_terminal(t->state())) gateway_.cancel(t->id());
  });
  if (stream_it) {
    stream(call, res);
  } else {
    whole(*call, res);
    forget(*call);
  }
}

// The path a decision chose (a failover before the first token moves a
// request once, with a new decision).
const gateway::ExecutionPath& HttpServer::Impl::path_named(const std::string& name) const {
  for (const gateway::ExecutionPath& p : gateway_.paths())
    if (p.name == name) return p;
  return gateway_.primary();
}

// The spillway object's route fields from one reading of the ticket's
// decision (path and decision change together, under the ticket's lock).
void HttpServer::Impl::fill_route(Call& c) {
  c.attempts = c.ticket->attempts();
  const admission::Decision d = c.ticket->decision();
  const gateway::ExecutionPath& path = path_named(d.path);
  c.model = path.model.empty() ? options_.model_name : path.model;
  c.info.model = c.model;
  c.info.placement = path.placement;
  c.info.path = path.name;
  c.info.fallback_model = path.fallback_model;
  c.info.decision = std::string(admission::decision_kind_name(d.kind));
  c.info.reason = d.reason;
  c.info.degraded = d.degraded();
  c.info.shrunk = d.shrunk;
  c.info.queue_position = d.queue_position;
  c.info.estimated_delay_ms = finite_ms(d.timing.delay_s);
  c.info.predicted_ttft_ms = finite_ms(d.timing.ttft_s);
  c.info.predicted_total_ms = finite_ms(d.timing.total_s);
  c.info.limits = c.ticket->limits();
  c.info.migrations = c.ticket->migrations();
}

// A request's error; a resumable one names the request to resume.
ApiError HttpServer::Impl::error_for(const Call& c, const Status& st) {
  ApiError e = api_error_from_status(st);
  if (st.reason() == FailureReason::kResumable && c.record_id != 0) {
    e.request_id = static_cast<uint64_t>(c.public_id);
  }
  return e;
}

void HttpServer::Impl::fill_times(Call& c) {
  // Failed over since the headers went out: the final object says where it
  // really ran, and the journal gets the decision it ran under.
  if (c.ticket->attempts() != c.attempts) {
    fill_route(c);
    service_.record_decision(c.record_id, c.ticket->decision());
  }
  c.info.queue_ms = static_cast<double>(c.ticket->queue_ns()) / 1e6;
  c.info.run_ms = static_cast<double>(c.ticket->run_ns()) / 1e6;
}

// The call's tool-call stream, once its public id (which the calls' ids
// carry) is known.
void HttpServer::Impl::start_tools(Call& c, const ToolUse& use) {
  if (use.format != ToolFormat::kNone)
    c.tools = std::make_unique<ToolCallStream>(use.format, c.public_id, use.parallel);
}

// Generated text through the call's tool-call stream (as is without one);
// at_end releases what it holds back.
ToolCallStream::Released HttpServer::Impl::tool_pass(Call& c, std::string text, bool at_end) {
  if (!c.tools) return {std::move(text), {}};
  ToolCallStream::Released r = c.tools->feed(text);
  if (at_end) {
    ToolCallStream::Released f = c.tools->finish();
    r.content += f.content;
    std::move(f.calls.begin(), f.calls.end(), std::back_inserter(r.calls));
  }
  return r;
}

// OpenAI's finish_reason "tool_calls" when the model stopped ("stop")
// after calling; `reason` otherwise (a run's, or a replay's stored one).
std::string HttpServer::Impl::finish_name(const Call& c, std::string reason) {
  if (reason == "stop" && c.tools && c.tools->calls_released() > 0) return "tool_calls";
  return reason;
}

std::string HttpServer::Impl::finish_name(const Call& c, FinishReason f) {
  return finish_name(c, std::string(finish_reason_name(f)));
}

// Stream chunks for released text and calls (a content chunk, then one per
// call, numbered in the response's order).
std::string HttpServer::Impl::released_chunks(Call& c, ToolCallStream::Released r, bool with_info,
                                              const std::optional<ChoiceLogprobs>& logprobs) {
  std::string out;
  if (!r.content.empty() || logprobs || with_info)
    out += chunk(c, std::move(r.content), "", false, with_info, logprobs);
  const int32_t first = c.tools ? c.tools->calls_released() - static_cast<int32_t>(r.calls.size()) : 0;
  for (size_t i = 0; i < r.calls.size(); ++i) {
    ChunkFields f;
    f.id = c.id;
    f.created = c.created;
    f.model = c.model;
    f.tool_call = &r.calls[i];
    f.tool_call_index = first + static_cast<int32_t>(i);
    out += sse_data(render_chat_chunk(f));
  }
  return out;
}

// A ticket closed without its finish event: the request failed.
void HttpServer::Impl::mark_closed(serve::RequestEvent& ev) {
  ev.kind = serve::RequestEvent::Kind::kFinished;
  ev.state = serve::RequestState::kFailed;
  ev.status = Status::internal("request stream ended without a result");
}

// Blocks until the ticket's next event; a closed ticket reads as a failed
// finish (mark_closed).
void HttpServer::Impl::wait_event(Call& c, serve::RequestEvent& ev) {
  for (;;) {
    const serve::PopResult r = c.ticket->next_event(ev, std::chrono::seconds(1));
    if (r == serve::PopResult::kClosed) return mark_closed(ev);
    if (r != serve::PopResult::kTimeout) return;
  }
}

// Non-streaming with n > 1: every choice's events, then one body with the
// choices by index.
void HttpServer::Impl::whole_choices(Call& c, Response& res) {
  const auto n = static_cast<size_t>(c.n);
  std::vector<std::string> texts(n);
  std::vector<std::vector<TokenLogprobs>> entries(n);
  serve::RequestEvent ev;
  for (;;) {
    wait_event(c, ev);
    if (ev.kind == serve::RequestEvent::Kind::kText) {
      const auto i = static_cast<size_t>(ev.choice);
      if (i >= n) continue;
      texts[i] += ev.text;
      std::move(ev.logprobs.begin(), ev.logprobs.end(), std::back_inserter(entries[i]));
      continue;
    }
    break;
  }
  if (ev.state != serve::RequestState::kDone) return set_error(res, error_for(c, ev.status), options_.model_name);
  fill_times(c);
  CompletionResult r;
  r.id = c.id;
  r.created = c.created;
  r.model = c.model;
  auto finish_of = [&](size_t i) {
    return std::string(finish_reason_name(i < ev.choice_finish.size() ? ev.choice_finish[i] : ev.finish));
  };
  r.text = std::move(texts[0]);
  r.finish_reason = finish_of(0);
  if (c.logprobs) r.logprobs = ChoiceLogprobs{std::move(entries[0]), c.text_offset};
  for (size_t i = 1; i < n; ++i) {
    CompletionResult::Choice ch;
    ch.text = std::move(texts[i]);
    ch.finish_reason = finish_of(i);
    if (c.logprobs) ch.logprobs = ChoiceLogprobs{std::move(entries[i]), c.text_offset};
    r.more_choices.push_back(std::move(ch));
  }
  r.prompt_tokens = c.info.limits.prompt_tokens;
  r.completion_tokens = ev.completion_tokens;
  r.spillway = c.info;
  res.status = 200;
  res.set_content(c.chat ? render_chat_completion(r) : render_completion(r), kJson);
}

// Non-streaming: collect every event, then answer once.
void HttpServer::Impl::whole(Call& c, Response& res) {
  if (c.n > 1) return whole_choices(c, res);
  std::string text = c.unsent;
  std::vector<TokenLogprobs> entries, prompt_entries;
  serve::RequestEvent ev;
  for (;;) {
    wait_event(c, ev);
    if (ev.kind == serve::RequestEvent::Kind::kText) {
      text += ev.text;
      std::move(ev.logprobs.begin(), ev.logprobs.end(), std::back_inserter(entries));
      if (!ev.prompt_logprobs.empty()) prompt_entries = std::move(ev.prompt_logprobs);
      continue;
    }
    break;
  }
  if (ev.state != serve::RequestState::kDone) return set_error(res, error_for(c, ev.status), options_.model_name);
  fill_times(c);
  CompletionResult r;
  r.id = c.id;
  r.created = c.created;
  r.model = c.model;
  ToolCallStream::Released released = tool_pass(c, std::move(text), true);
  r.text = c.echo + released.content;
  r.tool_calls = std::move(released.calls);
  r.finish_reason = finish_name(c, ev.finish);
  r.prompt_tokens = c.info.limits.prompt_tokens;
  r.completion_tokens = ev.completion_tokens;
  r.spillway = c.info;
  if (c.logprobs && !prompt_entries.empty()) {
    // Echoed: the prompt's entries first, offsets from the echo's start.
    prompt_entries.insert(prompt_entries.end(), std::make_move_iterator(entries.begin()),
                          std::make_move_iterator(entries.end()));
    r.logprobs = ChoiceLogprobs{std::move(prompt_entries), 0};
  } else if (c.logprobs) {
    r.logprobs = ChoiceLogprobs{std::move(entries), c.text_offset};
  }
  res.status = 200;
  res.set_content(c.chat ? render_chat_completion(r) : render_completion(r), kJson);
}

// A chunk's log-probabilities: an event's entries when the request asked
// (advancing the completions' text_offset past them); nullopt otherwise.
std::optional<ChoiceLogprobs> HttpServer::Impl::chunk_logprobs(Call& c, std::vector<TokenLogprobs> entries) {
  if (!c.logprobs || entries.empty()) return std::nullopt;
  ChoiceLogprobs lp{std::move(entries), c.text_offset};
  for (const TokenLogprobs& e : lp.entries) c.text_offset += count_chars(e.token.piece);
  return lp;
}

// The echoed prompt as one chunk, with its entries (offsets from 0) when
// the request asked for log-probabilities.
std::string HttpServer::Impl::echo_chunk(Call& c, std::vector<TokenLogprobs> prompt_entries) {
  c.echo_sent = true;
  std::optional<ChoiceLogprobs> lp;
  if (c.logprobs && !prompt_entries.empty()) lp = ChoiceLogprobs{std::move(prompt_entries), 0};
  return chunk(c, c.echo, "", false, false, lp);
}

std::string HttpServer::Impl::chunk(const Call& c, std::string text, std::string finish, bool first, bool with_info,
                                    const std::optional<ChoiceLogprobs>& logprobs, int32_t index) {
  ChunkFields f;
  f.index = index;
  f.id = c.id;
  f.created = c.created;
  f.model = c.model;
  f.text = std::move(text);
  f.finish_reason = std::move(finish);
  f.role_delta = first && c.chat;
  f.spillway = with_info ? &c.info : nullptr;
  f.logprobs = logprobs ? &*logprobs : nullptr;
  return sse_data(c.chat ? render_chat_chunk(f) : render_completion_chunk(f));
}

void HttpServer::Impl::stream(const std::shared_ptr<Call>& call, Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const auto keepalive = options_.keepalive_interval;
  res.content_type = "text/event-stream";
  res.stream = [this, call, keepalive](StreamSink& sink) -> bool {
    Call& c = *call;
    if (c.finished) {
      sink.done();
      return true;
    }
    auto fail = [&] {
      // The client went away: free the worker at its next token.
      gateway_.cancel(c.ticket->id());
      return false;
    };
    std::string out;
    if (!c.started) {
      // The opening chunk (path, degraded, queue position, estimated
      // delay, limits) goes out at once, not with the first token or the
      // first keep-alive: a request queued behind a long one would
      // otherwise learn where it stands only a keep-alive interval later.
      c.started = true;
      fill_times(c);
      out = chunk(c, "", "", /*first=*/true, /*with_info=*/true);
      // The echo waits for the prompt's entries when they were asked for.
      if (!c.echo.empty() && !c.logprobs) out += echo_chunk(c, {});
      if (!c.unsent.empty()) out += released_chunks(c, tool_pass(c, std::move(c.unsent), false), false, std::nullopt);
      return sink.write(out) ? true : fail();
    }
    serve::RequestEvent ev;
    serve::PopResult r = c.ticket->next_event(ev, keepalive);
    if (r == serve::PopResult::kTimeout) {
      if (c.ticket->state() == serve::RequestState::kQueued) {
        // Still waiting: where it stands and how long it may take.
        const gateway::Progress p = gateway_.progress(*c.ticket);
        if (p.queue_position > 0) {
          out += sse_data(render_queued_chunk(c.id, c.created, c.model, c.chat, c.ticket->path(), p.queue_position,
                                              finite_ms(p.estimated_delay_s)));
        }
      }
      if (out.empty()) out = std::string(kSseKeepAlive);
      return sink.write(out) ? true : fail();
    }
    // Send every event already waiting in one write.
    while (c.n > 1 && r == serve::PopResult::kItem && ev.kind == serve::RequestEvent::Kind::kText) {
      // n > 1: each choice's text in chunks of its index (no echo, tools
      // or resume with n > 1).
      const bool moved = c.ticket->attempts() != c.attempts;
      if (moved) fill_times(c);
      const auto i = static_cast<size_t>(ev.choice);
      if (i < c.choice_offsets.size()) {
        std::swap(c.text_offset, c.choice_offsets[i]);
        std::optional<ChoiceLogprobs> lp = chunk_logprobs(c, std::move(ev.logprobs));
        std::swap(c.text_offset, c.choice_offsets[i]);
        out += chunk(c, std::move(ev.text), "", false, moved, lp, ev.choice);
      }
      r = c.ticket->next_event(ev, std::chrono::milliseconds(0));
    }
    while (r == serve::PopResult::kItem && ev.kind == serve::RequestEvent::Kind::kText) {
      // Moved to another path since the last chunk (a failover or a
      // migration): the first text from there says where it runs now,
      // degraded included, rather than only the stream's last chunk.
      const bool moved = c.ticket->attempts() != c.attempts;
      if (moved) fill_times(c);
      if (!c.echo.empty() && !c.echo_sent) out += echo_chunk(c, std::move(ev.prompt_logprobs));
      out += released_chunks(c, tool_pass(c, std::move(ev.text), false), /*with_info=*/moved,
                             chunk_logprobs(c, std::move(ev.logprobs)));
      r = c.ticket->next_event(ev, std::chrono::milliseconds(0));
    }
    if (r == serve::PopResult::kTimeout) {
      return sink.write(out) ? true : fail();
    }
    if (r == serve::PopResult::kClosed) mark_closed(ev);
    // Finished.
    c.finished = true;
    fill_times(c);
    if (ev.state == serve::RequestState::kDone) {
      if (c.tools) out += released_chunks(c, tool_pass(c, "", true), false, std::nullopt);
      if (c.n > 1) {
        // Each choice's finish_reason in a chunk of its index; the last
        // carries the spillway info as for n = 1.
        for (int32_t i = 0; i < c.n; ++i) {
          const auto k = static_cast<size_t>(i);
          const FinishReason f = k < ev.choice_finish.size() ? ev.choice_finish[k] : ev.finish;
          out += chunk(c, "", std::string(finish_reason_name(f)), false, i + 1 == c.n, std::nullopt, i);
        }
      } else {
        out += chunk(c, "", finish_name(c, ev.finish), false, true);
      }
      if (c.include_usage) {
        ChunkFields f;
        f.id = c.id;
        f.created = c.created;
        f.model = c.model;
        f.usage_only = true;
        f.prompt_tokens = c.info.limits.prompt_tokens;
        f.completion_tokens = ev.completion_tokens;
        out += sse_data(c.chat ? render_chat_chunk(f) : render_completion_chunk(f));
      }
    } else {
      out += sse_data(render_error(error_for(c, ev.status)));
    }
    out += kSseDone;
    if (!sink.write(out)) return false;
    sink.done();
    return true;
  };
  res.stream_end = [this, call](bool /*complete*/) {
    if (!serve::is_terminal(call->ticket->state())) gateway_.cancel(call->ticket->id());
    forget(*call);
  };
}

}  // namespace spw::http
