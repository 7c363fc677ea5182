#include "http/server.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "http/metrics.h"
#include "http/openai.h"
#include "serve/journal_observer.h"

namespace spw::http {

namespace {

constexpr const char* kJson = "application/json";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void set_error(httplib::Response& res, const ApiError& e, const std::string& model = "") {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(render_error(e, model), kJson);
}

// Everything one generation request needs while it runs (shared with the
// stream provider, which outlives the handler call).
struct Call {
  bool chat = false;
  bool include_usage = false;
  std::shared_ptr<serve::Ticket> ticket;
  int64_t record_id = 0;  // the journal's id; 0: not journaled
  std::string id;
  int64_t created = 0;
  std::string model;
  SpillwayInfo info;
  int32_t attempts = 0;  // the ticket's attempts when `info` was filled
  // A resume: checkpoint text the client lacks, sent before the ticket's.
  std::string unsent;
  // Stream progress (touched only by the connection's thread).
  bool started = false;
  bool finished = false;
};

bool header_true(const httplib::Request& req, const char* name) {
  std::string v = req.get_header_value(name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return v == "true" || v == "1" || v == "yes";
}

// Milliseconds of a predicted time; nullopt when the rates cannot say (infinite).
std::optional<double> finite_ms(double seconds) {
  return std::isfinite(seconds) ? std::optional<double>(seconds * 1000.0) : std::nullopt;
}

// A request id from the path: the journal's number, or the OpenAI id of a
// response ("cmpl-<16 hex>" / "chatcmpl-<16 hex>", the number in hex).
std::optional<int64_t> parse_request_id(const std::string& text) {
  auto digits = [](const std::string& s, int base) -> std::optional<int64_t> {
    if (s.empty() || s.size() > (base == 10 ? 18u : 16u)) return std::nullopt;
    uint64_t v = 0;
    for (char ch : s) {
      int d = -1;
      if (ch >= '0' && ch <= '9') d = ch - '0';
      else if (base == 16 && ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
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

std::vector<const char*> turn_end_markers(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return {"<|im_end|>", "<|im_start|>"};
    case ChatTemplateKind::kLlama3: return {"<|eot_id|>", "<|start_header_id|>"};
    case ChatTemplateKind::kGemma: return {"<end_of_turn>", "<start_of_turn>"};
    case ChatTemplateKind::kZephyr: return {"<|user|>", "<|system|>"};
    default: return {"[INST]"};
  }
}

// The peer is this host: 127.0.0.0/8, ::1, or IPv4-mapped 127.x.
bool loopback_peer(const std::string& addr) {
  return addr.starts_with("127.") || addr == "::1" || addr.starts_with("::ffff:127.");
}

// Equal strings, in a time that depends only on the lengths (the admin token
// must not leak through how soon a wrong guess is refused).
bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

ApiError no_route(const httplib::Request& req) {
  ApiError e;
  e.http_status = 404;
  e.code = "not_found";
  e.message = "no route for " + req.method + " " + req.path;
  return e;
}

}  // namespace

Result<std::optional<ChatTemplateKind>> resolve_chat_template(const gguf::GgufFile& file, const std::string& name) {
  if (!name.empty()) {
    SPW_ASSIGN_OR_RETURN(ChatTemplateKind kind, chat_template_from_name(name));
    return std::optional<ChatTemplateKind>(kind);
  }
  const gguf::Value* v = file.find("tokenizer.chat_template");
  if (v == nullptr || v->type != gguf::ValueType::kString) return std::optional<ChatTemplateKind>();
  Result<ChatTemplateKind> kind = detect_chat_template(std::get<std::string>(v->v));
  if (!kind.ok()) return std::optional<ChatTemplateKind>();
  return std::optional<ChatTemplateKind>(*kind);
}

class HttpServer::Impl {
 public:
  Impl(Env& env, gateway::Gateway& gateway, HttpServerOptions options)
      : env_(env), gateway_(gateway), options_(std::move(options)) {}

  ~Impl() { stop(); }

  Status start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (thread_.joinable()) return Status::failed_precondition("http server already started");
    routes();
    if (options_.port == 0) {
      port_ = svr_.bind_to_any_port(options_.host);
      if (port_ <= 0) return Status::unavailable("cannot bind " + options_.host + " to any port");
    } else {
      if (!svr_.bind_to_port(options_.host, options_.port)) {
        return Status::unavailable("cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                                   " (in use, or not a local address)");
      }
      port_ = options_.port;
    }
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    // httplib's stop() is a no-op until the accept loop runs; wait for it so
    // that a stop() right after start() cannot be lost.
    for (int i = 0; i < 5000 && !svr_.is_running(); ++i) env_.sleep_for_ns(1'000'000);
    if (!svr_.is_running()) return Status::internal("http server did not start within 5 s");
    return Status::ok_status();
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    svr_.stop();
    thread_.join();
  }

  int port() const { return port_; }
  const std::string& host() const { return options_.host; }

 private:
  void routes() {
    size_t capacity = 4;
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      const serve::SchedulerStats st = p.scheduler->stats();
      capacity += static_cast<size_t>(st.n_workers + st.queue_capacity);
    }
    size_t threads = options_.http_threads > 0 ? static_cast<size_t>(options_.http_threads) : std::min<size_t>(capacity, 512);
    svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr_.set_payload_max_length(size_t{16} << 20);
    svr_.set_tcp_nodelay(true);

    svr_.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_models(options_.model_name, env_.wall_time_ms() / 1000), kJson);
    });
    svr_.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
    svr_.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
    svr_.Get(R"(/v1/requests/([^/]+))",
             [this](const httplib::Request& req, httplib::Response& res) { request_record(req, res); });
    svr_.Delete(R"(/v1/requests/([^/]+))",
                [this](const httplib::Request& req, httplib::Response& res) { cancel_request(req, res); });
    svr_.Post(R"(/v1/requests/([^/]+)/resume)",
              [this](const httplib::Request& req, httplib::Response& res) { resume_request(req, res); });
    svr_.Post("/v1/quote", [this](const httplib::Request& req, httplib::Response& res) { quote(req, res); });
    svr_.Get("/v1/status", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_status(gateway_.status()), kJson);
    });
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_metrics(gateway_.status()), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr_.Post("/v1/reservations",
              [this](const httplib::Request& req, httplib::Response& res) { reserve(req, res); });
    svr_.Get("/v1/reservations", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(render_reservations(gateway_.reservations()), kJson);
    });
    svr_.Post(R"(/v1/reservations/(\d{1,18})/renew)", [this](const httplib::Request& req, httplib::Response& res) {
      auto r = gateway_.renew(std::stoull(req.matches[1].str()));
      if (!r.ok()) return set_error(res, reservation_error(r.status()));
      res.set_content(render_reservation(*r), kJson);
    });
    svr_.Delete(R"(/v1/reservations/(\d{1,18}))", [this](const httplib::Request& req, httplib::Response& res) {
      Status st = gateway_.release(std::stoull(req.matches[1].str()));
      if (!st.ok()) return set_error(res, reservation_error(st));
      res.set_content(R"({"released":true})", kJson);
    });
    svr_.Get("/health/live", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"live"})", kJson);
    });
    svr_.Get("/health/ready", [this](const httplib::Request&, httplib::Response& res) {
      const bool ready = gateway_.ready();
      res.status = ready ? 200 : 503;
      res.set_content(ready ? R"({"status":"ready"})" : R"({"status":"not_ready"})", kJson);
    });

    if (!options_.admin_token.empty()) {
      svr_.Post("/v1/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
        if (admin_allowed(req, res)) arm_fault(req, res);
      });
      svr_.Get("/v1/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
        if (admin_allowed(req, res)) res.set_content(render_faults(armed_faults()), kJson);
      });
      svr_.Delete("/v1/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
        if (admin_allowed(req, res)) disarm_faults(res);
      });
    }

    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      ApiError e;
      e.http_status = res.status;
      e.code = res.status == 404 ? "not_found" : "http_" + std::to_string(res.status);
      e.message = res.status == 404 ? "no route for " + req.method + " " + req.path
                                    : "HTTP " + std::to_string(res.status) + " for " + req.method + " " + req.path;
      res.set_content(render_error(e), kJson);
    });
    svr_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.code = "internal_error";
      e.message = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& ex) {
        e.message = std::string("internal error: ") + ex.what();
      } catch (...) {
      }
      set_error(res, e);
    });
    if (options_.log_requests) {
      svr_.set_logger([](const httplib::Request& req, const httplib::Response& res) {
        std::fprintf(stderr, "spillway: %s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
      });
    }
  }

  // The admin API: as if absent (404) for a peer that is not this host; 401
  // without the bearer token.
  bool admin_allowed(const httplib::Request& req, httplib::Response& res) {
    if (!loopback_peer(req.remote_addr)) {
      set_error(res, no_route(req));
      return false;
    }
    const std::string auth = req.get_header_value("Authorization");
    constexpr std::string_view kBearer = "Bearer ";
    const bool ok = auth.size() > kBearer.size() && std::string_view(auth).substr(0, kBearer.size()) == kBearer &&
                    constant_time_equal(std::string_view(auth).substr(kBearer.size()), options_.admin_token);
    if (!ok) {
      ApiError e;
      e.http_status = 401;
      e.code = "invalid_api_key";
      e.message = "the admin API needs the header Authorization: Bearer <the --admin-token of this server>";
      res.set_header("WWW-Authenticate", "Bearer");
      set_error(res, e);
    }
    return ok;
  }

  void arm_fault(const httplib::Request& req, httplib::Response& res) {
    FaultRequest fr;
    if (auto err = parse_fault_request(req.body, fr)) return set_error(res, *err);
    const gateway::ExecutionPath* path = fr.path.empty() ? &gateway_.primary() : nullptr;
    std::string names;
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      names += (names.empty() ? "" : ", ") + p.name;
      if (p.name == fr.path) path = &p;
    }
    if (path == nullptr) {
      ApiError e;
      e.param = "path";
      e.code = "invalid_value";
      e.message = "no path named \"" + fr.path + "\" (paths: " + names + ")";
      return set_error(res, e);
    }
    FaultInjector* faults = path->device ? path->device->faults() : nullptr;
    if (faults == nullptr) {
      ApiError e;
      e.param = "path";
      e.code = "invalid_value";
      e.message = "a " + std::string(fault_kind_name(fr.spec.kind)) + " fault needs a device; the " + path->name +
                  " path (" + path->placement + ") runs on none";
      return set_error(res, e);
    }
    Result<ArmedFault> armed = faults->arm(fr.spec);
    if (!armed.ok()) return set_error(res, api_error_from_status(armed.status()));
    std::fprintf(stderr, "spillway: admin: armed fault %llu: %s on %s (after %lld, count %lld)\n",
                 static_cast<unsigned long long>(armed->id), std::string(fault_kind_name(fr.spec.kind)).c_str(),
                 path->device->name().c_str(), static_cast<long long>(fr.spec.after),
                 static_cast<long long>(fr.spec.count));
    res.status = 201;
    res.set_content(render_fault({path->name, path->device->name(), *armed}), kJson);
  }

  // Every device's faults once, labelled with the first path on it.
  std::vector<FaultView> armed_faults() {
    std::vector<FaultView> out;
    std::vector<const FaultInjector*> seen;
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      FaultInjector* f = p.device ? p.device->faults() : nullptr;
      if (f == nullptr || std::find(seen.begin(), seen.end(), f) != seen.end()) continue;
      seen.push_back(f);
      for (const ArmedFault& a : f->list()) out.push_back({p.name, p.device->name(), a});
    }
    return out;
  }

  void disarm_faults(httplib::Response& res) {
    const size_t n = armed_faults().size();
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      if (FaultInjector* f = p.device ? p.device->faults() : nullptr) f->disarm();
    }
    std::fprintf(stderr, "spillway: admin: disarmed %zu faults\n", n);
    res.set_content(render_disarmed(n), kJson);
  }

  void health(httplib::Response& res) {
    const serve::Scheduler& primary = *gateway_.primary().scheduler;
    const serve::SchedulerStats st = primary.stats();
    HealthInfo h;
    h.model = options_.model_name;
    h.queue_depth = st.queue_depth;
    h.queue_capacity = st.queue_capacity;
    h.running = st.running;
    h.workers = st.n_workers;
    h.n_ctx = primary.n_ctx();
    h.backend = primary.placement();
    if (options_.chat_template) h.chat_template = std::string(chat_template_name(*options_.chat_template));
    if (options_.host_memory) h.memory = options_.host_memory();
    if (options_.device_memory) h.device_memory = options_.device_memory();
    res.set_content(render_health(h), kJson);
  }

  serve::GenerationRequest to_generation(const SamplingFields& s) {
    serve::GenerationRequest g;
    if (s.temperature) g.sampler.temperature = *s.temperature;
    if (s.top_p) g.sampler.top_p = *s.top_p;
    if (s.top_k) g.sampler.top_k = *s.top_k;
    if (s.min_p) g.sampler.min_p = *s.min_p;
    if (s.repeat_penalty) g.sampler.repeat_penalty = *s.repeat_penalty;
    if (s.repeat_last_n) g.sampler.repeat_last_n = *s.repeat_last_n;
    // A request without a seed gets a fresh one, reported back so it can be replayed.
    g.sampler.seed = s.seed ? *s.seed : env_.random_u64();
    g.max_tokens = s.max_tokens;
    g.stop = s.stop;
    return g;
  }

  // A completion or chat body -> the engine's request (chat: through the
  // template, with its end-of-turn stops); nullopt on success, else the error.
  std::optional<ApiError> generation_from_body(const std::string& body, bool chat, serve::GenerationRequest& g,
                                               SamplingFields& sampling) {
    if (chat) {
      ChatRequest cr;
      if (auto e = parse_chat_request(body, cr)) return e;
      if (!options_.chat_template) {
        ApiError e;
        e.param = "messages";
        e.code = "chat_template_missing";
        e.message =
            "model '" + options_.model_name +
            "' has no chat template that Spillway recognises (tokenizer.chat_template is missing or of an "
            "unknown family); start the server with --chat-template NAME (e.g. chatml, llama2, llama3, "
            "mistral, zephyr, gemma), or use /v1/completions";
        return e;
      }
      // The template writes BOS itself where its reference does, with the
      // vocabulary's own BOS/EOS texts; so the tokenizer must not add another.
      const Tokenizer& tok = gateway_.tokenizer();
      ChatSpecialTexts special;
      if (tok.bos_id() >= 0) special.bos = tok.token_text(tok.bos_id());
      if (tok.eos_id() >= 0) special.eos = tok.token_text(tok.eos_id());
      Result<std::string> prompt = apply_chat_template(*options_.chat_template, cr.messages, true, special);
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
      for (const char* marker : turn_end_markers(*options_.chat_template)) g.stop.emplace_back(marker);
    } else {
      CompletionRequest cr;
      if (auto e = parse_completion_request(body, cr)) return e;
      sampling = cr.sampling;
      if (!sampling.max_tokens) sampling.max_tokens = options_.completion_default_max_tokens;
      g = to_generation(sampling);
      g.prompt = std::move(cr.prompt);
      g.add_bos = true;  // when the vocabulary wants one (add_bos_token)
    }
    // As llama.cpp's server: control-token texts in the prompt are those tokens.
    g.parse_special = true;
    return std::nullopt;
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    serve::GenerationRequest g;
    SamplingFields sampling;
    if (auto e = generation_from_body(req.body, chat, g, sampling)) return set_error(res, *e, options_.model_name);

    auto call = std::make_shared<Call>();
    call->chat = chat;
    call->include_usage = sampling.include_usage;
    call->model = options_.model_name;
    call->info.model = options_.model_name;
    if (options_.journal) {
      const std::string key = req.get_header_value("Idempotency-Key");
      if (key.size() > 255 || std::any_of(key.begin(), key.end(), [](char ch) { return ch < 0x20 || ch > 0x7e; })) {
        ApiError e;
        e.param = "Idempotency-Key";
        e.code = "invalid_value";
        e.message = "Idempotency-Key: at most 255 printable ASCII characters";
        return set_error(res, e, options_.model_name);
      }
      Result<journal::AcceptResult> acc = options_.journal->accept({key, req.path, req.body});
      if (!acc.ok()) return set_error(res, journal_error(acc.status()), options_.model_name);
      call->record_id = acc->record.id;
      if (acc->replay) return replay(*call, acc->record, sampling.stream, res);
      g.record_id = call->record_id;
    }
    gateway::RouteRequest route;
    route.generation = std::move(g);
    route.allow_shrink = header_true(req, "X-Spillway-Allow-Shrink");
    Result<bool> migrate = allow_migration(req);
    if (!migrate.ok()) {
      if (call->record_id != 0) (void)options_.journal->finish(call->record_id, refused_outcome(migrate.status()));
      return set_error(res, api_error_from_status(migrate.status()), options_.model_name);
    }
    route.allow_migration = *migrate;
    gateway::Refusal refusal;
    Result<gateway::Admitted> admitted = gateway_.submit(route, &refusal);
    // The decision goes into the journal before any response is written, so
    // that a GET /v1/requests/{id} after the response sees why it went where
    // it went (or was refused). No verdicts: refused before any decision (a
    // field or the tokenizer), nothing to record.
    // The attempt whose decision was recorded: a later failover records again.
    const int32_t recorded_attempts = admitted.ok() ? admitted->ticket->attempts() : 0;
    if (call->record_id != 0) {
      const admission::Decision d = admitted.ok() ? admitted->ticket->decision() : refusal.decision;
      if (!d.verdicts.empty()) record_admission(call->record_id, d);
    }
    if (!admitted.ok()) {
      if (call->record_id != 0) {
        // Refused before it queued: the journal says so, why, and whether a
        // retry may succeed.
        (void)options_.journal->finish(call->record_id, refused_outcome(admitted.status()));
      }
      return refuse(res, admitted.status(), refusal);
    }

    call->ticket = admitted->ticket;
    call->id = response_id(chat, call->record_id);
    call->created = env_.wall_time_ms() / 1000;
    fill_route(*call);
    call->attempts = recorded_attempts;
    call->info.request_id = call->record_id != 0 ? static_cast<uint64_t>(call->record_id) : call->ticket->id();
    call->info.seed = call->ticket->seed();
    respond(call, res, sampling.stream);
  }

  // What the journal records for a request refused before it queued.
  static journal::Outcome refused_outcome(const Status& st, std::string text = {}) {
    serve::RequestEvent fin;
    fin.kind = serve::RequestEvent::Kind::kFinished;
    fin.state = serve::RequestState::kFailed;
    fin.status = st;
    return serve::JournalObserver::outcome_of(fin, text, 0);
  }

  // X-Spillway-Migrate: "auto" (default) or "never".
  static Result<bool> allow_migration(const httplib::Request& req) {
    if (!req.has_header("X-Spillway-Migrate")) return true;
    std::string v = req.get_header_value("X-Spillway-Migrate");
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (v == "auto") return true;
    if (v == "never") return false;
    return invalid_field("X-Spillway-Migrate", "X-Spillway-Migrate: expected \"auto\" or \"never\", got \"" +
                                                   req.get_header_value("X-Spillway-Migrate") + "\"");
  }

  // A refusal by the gateway: its error, the decision's reason and Retry-After.
  void refuse(httplib::Response& res, const Status& st, const gateway::Refusal& refusal) {
    const ApiError e = api_error_from_status(st);
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

  // Headers from the call's route, then the body or the stream.
  void respond(const std::shared_ptr<Call>& call, httplib::Response& res, bool stream_it) {
    const bool chat = call->chat;
    // The headers say what fill_route read (one reading of the ticket).
    res.set_header("X-Spillway-Placement", call->info.placement);
    res.set_header("X-Spillway-Path", call->info.path);
    res.set_header("X-Spillway-Model", call->model);
    res.set_header("X-Spillway-Fallback-Model", call->info.fallback_model ? "true" : "false");
    res.set_header("X-Spillway-Decision", call->info.decision);
    res.set_header("X-Spillway-Degraded", call->info.degraded ? "true" : "false");
    res.set_header("X-Spillway-Queue-Position", std::to_string(call->info.queue_position));
    if (call->info.estimated_delay_ms) {
      res.set_header("X-Spillway-Estimated-Delay-Ms", std::to_string(static_cast<int64_t>(*call->info.estimated_delay_ms)));
    }
    res.set_header("X-Spillway-Max-Tokens", std::to_string(call->info.limits.max_tokens));
    res.set_header("X-Spillway-Context", std::to_string(call->info.limits.n_ctx));
    res.set_header("X-Spillway-Request-Id", std::to_string(call->info.request_id));
    if (chat && options_.chat_template) {
      res.set_header("X-Spillway-Chat-Template", std::string(chat_template_name(*options_.chat_template)) +
                                                     (options_.chat_template_default ? "; default" : ""));
    }

    if (stream_it) {
      stream(call, res);
    } else {
      whole(*call, res);
    }
  }

  // POST /v1/requests/{id}/resume: an interrupted request (a resumable
  // error, or a server killed mid-request) continues from its journaled
  // checkpoint, after the text the client says it has.
  void resume_request(const httplib::Request& req, httplib::Response& res) {
    const std::string text = req.matches[1];
    ApiError e;
    e.http_status = 404;
    e.code = "not_found";
    if (!options_.journal) {
      e.message = "this server keeps no request journal (start it with --journal PATH), so nothing can be resumed";
      return set_error(res, e);
    }
    const std::optional<int64_t> id = parse_request_id(text);
    if (!id) {
      e.http_status = 400;
      e.code = "invalid_value";
      e.param = "id";
      e.message = "request id '" + text + "': expected a positive integer or a response id (cmpl-<hex>, chatcmpl-<hex>)";
      return set_error(res, e);
    }
    ResumeBody body;
    if (auto err = parse_resume_request(req.body, body)) return set_error(res, *err);
    Result<bool> migrate = allow_migration(req);
    if (!migrate.ok()) return set_error(res, api_error_from_status(migrate.status()));
    Result<journal::Record> r = options_.journal->get(*id);
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kNotFound) return set_error(res, journal_error(r.status()));
      e.message = r.status().message() + " (never accepted, or older than the journal's retention)";
      return set_error(res, e);
    }
    auto conflict = [&](const std::string& why) {
      ApiError c;
      c.http_status = 409;
      c.code = "not_resumable";
      c.message = "request " + text + " cannot be resumed: " + why;
      set_error(res, c);
    };
    if (!journal::can_resume(*r)) {
      return conflict(r->checkpoint.empty() ? "it has no checkpoint (state " + std::string(journal::state_name(r->state)) + ")"
                                            : "it is " + std::string(journal::state_name(r->state)));
    }
    // A run the server died in before its first checkpoint (a kill during
    // the prefill or the first tokens) continues from its prompt: the
    // checkpoint it would have had at its start.
    const bool from_prompt = r->checkpoint.empty();
    Result<Checkpoint> cp = from_prompt ? start_checkpoint_of(*r, body.received_text) : parse_checkpoint(r->checkpoint);
    if (!cp.ok()) return conflict(from_prompt ? cp.status().message() : "its checkpoint is unreadable: " + cp.status().message());
    // Taken back to running before anything runs: a second resume of the
    // same id gets 409 from here on.
    if (Status st = options_.journal->reopen(*id, "", /*require_checkpoint=*/!from_prompt); !st.ok()) {
      if (st.code() == StatusCode::kFailedPrecondition) return conflict(st.message());
      return set_error(res, journal_error(st));
    }
    auto call = std::make_shared<Call>();
    call->chat = r->endpoint == "/v1/chat/completions";
    call->record_id = *id;
    call->model = options_.model_name;
    call->info.model = options_.model_name;
    gateway::ResumeRequest rr;
    rr.record_id = *id;
    {
      // What the original request asked for, reported in the limits again.
      serve::GenerationRequest original;
      SamplingFields sampling;
      if (!generation_from_body(r->body, call->chat, original, sampling)) rr.max_tokens_requested = sampling.max_tokens;
    }
    rr.checkpoint = std::make_shared<const Checkpoint>(std::move(*cp));
    rr.received_text = body.received_text;
    rr.allow_migration = *migrate;
    gateway::Refusal refusal;
    Result<gateway::Resumed> resumed = gateway_.resume(rr, &refusal);
    if (!refusal.decision.verdicts.empty()) record_admission(*id, resumed.ok() ? resumed->admitted.ticket->decision() : refusal.decision);
    if (!resumed.ok()) {
      // Still resumable from the same checkpoint (the journal keeps it),
      // unless the client's text disagrees with it.
      Status st = resumed.status();
      journal::Outcome o = refused_outcome(st, r->outcome.text);
      o.error_code = r->outcome.error_code;
      o.error_message = r->outcome.error_message + " (resume refused: " + st.message() + ")";
      o.resumable = true;
      (void)options_.journal->finish(*id, o);
      if (st.reason() == FailureReason::kReplayMismatch) {
        ApiError m = api_error_from_status(st);
        m.param = "received_text";
        return set_error(res, m);
      }
      return refuse(res, st, refusal);
    }
    call->ticket = resumed->admitted.ticket;
    call->unsent = std::move(resumed->unsent);
    call->id = response_id(call->chat, *id);
    call->created = env_.wall_time_ms() / 1000;
    fill_route(*call);
    call->info.request_id = static_cast<uint64_t>(*id);
    call->info.seed = call->ticket->seed();
    call->info.resumed_at_token = rr.checkpoint->n_generated;
    res.set_header("X-Spillway-Resumed-At-Token", std::to_string(rr.checkpoint->n_generated));
    respond(call, res, body.stream);
  }

  // The checkpoint a journaled request had at its start, from its stored
  // body. The seed of a sampled request that did not send one was the
  // server's and is not kept: such a run can restart only when the client
  // has none of its text (another seed would contradict it).
  Result<Checkpoint> start_checkpoint_of(const journal::Record& r, const std::string& received_text) {
    serve::GenerationRequest g;
    SamplingFields sampling;
    if (auto e = generation_from_body(r.body, r.endpoint == "/v1/chat/completions", g, sampling)) {
      return Status::failed_precondition("its stored body no longer parses: " + e->message);
    }
    if (!sampling.seed && g.sampler.temperature > 0 && !received_text.empty()) {
      return Status::failed_precondition(
          "it was interrupted before its first checkpoint and sampled with a seed the server chose and did not "
          "keep, so the text already received cannot be continued; send the request again (with a seed to make "
          "it repeatable)");
    }
    return gateway_.start_checkpoint(g);
  }

  // The OpenAI id: derived from the journal id when there is one, so that a
  // replay answers with the id of the original response.
  std::string response_id(bool chat, int64_t record_id) {
    const uint64_t v = record_id != 0 ? static_cast<uint64_t>(record_id) : env_.random_u64();
    return std::string(chat ? "chatcmpl-" : "cmpl-") + hex64(v);
  }

  // A failed write is logged and the request goes on (as JournalObserver's):
  // the decision is an explanation, the request's own record is already safe.
  void record_admission(int64_t record_id, const admission::Decision& d) {
    const Status st = options_.journal->set_admission(record_id, render_decision(d));
    if (!st.ok()) {
      std::fprintf(stderr, "spillway: journal: recording the admission of request %lld: %s\n",
                   static_cast<long long>(record_id), st.to_string().c_str());
    }
  }

  static ApiError journal_error(const Status& st) {
    ApiError e;
    e.message = st.message();
    if (st.reason() == FailureReason::kIdempotencyConflict) {
      e.http_status = 409;
      e.param = "Idempotency-Key";
      e.code = "idempotency_conflict";
    } else {
      e.http_status = 503;
      e.type = "server_error";
      e.code = "journal_unavailable";
      e.message = "the request journal cannot record the request, so it is not accepted: " + st.to_string();
    }
    return e;
  }

  // A finished request's stored result, as the original response was shaped
  // (a body, or a stream of one text chunk).
  void replay(Call& c, const journal::Record& r, bool stream, httplib::Response& res) {
    c.id = response_id(c.chat, r.id);
    c.created = r.created_ms / 1000;
    c.info.placement = r.placement;
    // Where it ran, as its response said (the decision it ran under).
    const StoredRoute route = stored_route(r.admission);
    c.info.path = route.path;
    c.info.decision = route.decision;
    c.info.reason = route.reason;
    c.info.degraded = route.degraded;
    c.info.request_id = static_cast<uint64_t>(r.id);
    c.info.limits.n_ctx = gateway_.primary().scheduler->n_ctx();
    c.info.limits.prompt_tokens = r.outcome.prompt_tokens;
    c.info.limits.max_tokens = r.outcome.completion_tokens;
    c.info.replayed = true;
    res.set_header("X-Spillway-Placement", r.placement);
    res.set_header("X-Spillway-Request-Id", std::to_string(r.id));
    res.set_header("X-Spillway-Replayed", "true");
    res.status = 200;
    if (!stream) {
      CompletionResult out;
      out.id = c.id;
      out.created = c.created;
      out.model = c.model;
      out.text = r.outcome.text;
      out.finish_reason = r.outcome.finish_reason;
      out.prompt_tokens = r.outcome.prompt_tokens;
      out.completion_tokens = r.outcome.completion_tokens;
      out.spillway = c.info;
      res.set_content(c.chat ? render_chat_completion(out) : render_completion(out), kJson);
      return;
    }
    std::string body = chunk(c, "", "", /*first=*/true, /*with_info=*/true);
    body += chunk(c, r.outcome.text, "", false, false);
    body += chunk(c, "", r.outcome.finish_reason, false, true);
    body += kSseDone;
    res.set_header("Cache-Control", "no-cache");
    res.set_content(body, "text/event-stream");
  }

  void request_record(const httplib::Request& req, httplib::Response& res) {
    ApiError e;
    e.http_status = 404;
    e.code = "not_found";
    const std::string text = req.matches[1];
    const std::optional<int64_t> parsed = parse_request_id(text);
    if (!options_.journal) {
      e.message = "this server keeps no request journal (start it with --journal PATH)";
      return set_error(res, e);
    }
    if (!parsed) {
      e.http_status = 400;
      e.code = "invalid_value";
      e.param = "id";
      e.message = "request id '" + text + "': expected a positive integer or a response id (cmpl-<hex>, chatcmpl-<hex>)";
      return set_error(res, e);
    }
    const int64_t id = *parsed;
    Result<journal::Record> r = options_.journal->get(id);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound) {
        e.message = r.status().message() + " (never accepted, or older than the journal's retention)";
        return set_error(res, e);
      }
      return set_error(res, journal_error(r.status()));
    }
    res.status = 200;
    res.set_content(render_request_record(*r), kJson);
  }

  // DELETE /v1/requests/{id}: the id is the journal's (or, without a journal,
  // the ticket's), as the response's spillway.request_id says.
  void cancel_request(const httplib::Request& req, httplib::Response& res) {
    const std::string text = req.matches[1];
    const std::optional<int64_t> id = parse_request_id(text);
    if (!id) {
      ApiError e;
      e.param = "id";
      e.message = "request id '" + text + "': expected a positive integer or a response id (cmpl-<hex>, chatcmpl-<hex>)";
      return set_error(res, e);
    }
    std::shared_ptr<serve::Ticket> t = options_.journal ? gateway_.find_by_record(*id)
                                                        : gateway_.find(static_cast<uint64_t>(*id));
    if (!t || serve::is_terminal(t->state())) {
      ApiError e;
      e.http_status = 404;
      e.code = "not_found";
      e.message = "request " + text + " is not in flight (finished, never accepted, or unknown)";
      return set_error(res, e);
    }
    const bool cancelled = gateway_.cancel(t->id());
    res.set_content(render_cancel(static_cast<uint64_t>(*id), cancelled, std::string(serve::request_state_name(t->state()))),
                    kJson);
  }

  static ApiError reservation_error(const Status& st) {
    ApiError e = api_error_from_status(st);
    if (st.code() == StatusCode::kNotFound) {
      e.http_status = 404;
      e.code = "not_found";
    }
    return e;
  }

  void reserve(const httplib::Request& req, httplib::Response& res) {
    ReservationRequest r;
    if (auto e = parse_reservation_request(req.body, r)) return set_error(res, *e);
    auto info = gateway_.reserve_cotenant(r.name, r.bytes, r.ttl_s);
    if (!info.ok()) return set_error(res, reservation_error(info.status()));
    res.status = 201;
    res.set_content(render_reservation(*info), kJson);
  }

  // POST /v1/quote: a completion body (or a chat body: "messages") priced
  // without running anything.
  void quote(const httplib::Request& req, httplib::Response& res) {
    gateway::RouteRequest route;
    SamplingFields sampling;
    if (auto e = generation_from_body(req.body, is_chat_body(req.body), route.generation, sampling)) {
      return set_error(res, *e, options_.model_name);
    }
    route.allow_shrink = header_true(req, "X-Spillway-Allow-Shrink");
    auto q = gateway_.quote(route);
    if (!q.ok()) return set_error(res, api_error_from_status(q.status()), options_.model_name);
    res.set_content(render_quote(*q), kJson);
  }

  // The path a decision chose (a failover before the first token moves a
  // request once, with a new decision).
  const gateway::ExecutionPath& path_named(const std::string& name) const {
    for (const gateway::ExecutionPath& p : gateway_.paths())
      if (p.name == name) return p;
    return gateway_.primary();
  }

  // The spillway object's route fields from one reading of the ticket's
  // decision (path and decision change together, under the ticket's lock).
  void fill_route(Call& c) {
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
  ApiError error_for(const Call& c, const Status& st) {
    ApiError e = api_error_from_status(st);
    if (st.reason() == FailureReason::kResumable && c.record_id != 0) {
      e.request_id = static_cast<uint64_t>(c.record_id);
    }
    return e;
  }

  void fill_times(Call& c) {
    // Failed over since the headers went out: the final object says where it
    // really ran, and the journal gets the decision it ran under.
    if (c.ticket->attempts() != c.attempts) {
      fill_route(c);
      if (c.record_id != 0 && options_.journal) record_admission(c.record_id, c.ticket->decision());
    }
    c.info.queue_ms = static_cast<double>(c.ticket->queue_ns()) / 1e6;
    c.info.run_ms = static_cast<double>(c.ticket->run_ns()) / 1e6;
  }

  // Non-streaming: collect every event, then answer once.
  void whole(Call& c, httplib::Response& res) {
    std::string text = c.unsent;
    serve::RequestEvent ev;
    for (;;) {
      serve::PopResult r = c.ticket->next_event(ev, std::chrono::seconds(1));
      if (r == serve::PopResult::kTimeout) continue;
      if (r == serve::PopResult::kClosed) {
        ev.kind = serve::RequestEvent::Kind::kFinished;
        ev.state = serve::RequestState::kFailed;
        ev.status = Status::internal("request stream ended without a result");
      }
      if (ev.kind == serve::RequestEvent::Kind::kText) {
        text += ev.text;
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
    r.text = std::move(text);
    r.finish_reason = std::string(serve::finish_reason_name(ev.finish));
    r.prompt_tokens = c.info.limits.prompt_tokens;
    r.completion_tokens = ev.completion_tokens;
    r.spillway = c.info;
    res.status = 200;
    res.set_content(c.chat ? render_chat_completion(r) : render_completion(r), kJson);
  }

  std::string chunk(const Call& c, std::string text, std::string finish, bool first, bool with_info) {
    ChunkFields f;
    f.id = c.id;
    f.created = c.created;
    f.model = c.model;
    f.text = std::move(text);
    f.finish_reason = std::move(finish);
    f.role_delta = first && c.chat;
    f.spillway = with_info ? &c.info : nullptr;
    return sse_data(c.chat ? render_chat_chunk(f) : render_completion_chunk(f));
  }

  void stream(const std::shared_ptr<Call>& call, httplib::Response& res) {
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    const auto keepalive = options_.keepalive_interval;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, call, keepalive](size_t /*offset*/, httplib::DataSink& sink) -> bool {
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
            c.started = true;
            fill_times(c);
            out = chunk(c, "", "", /*first=*/true, /*with_info=*/true);
            if (!c.unsent.empty()) out += chunk(c, std::move(c.unsent), "", false, false);
          }
          serve::RequestEvent ev;
          serve::PopResult r = c.ticket->next_event(ev, keepalive);
          if (r == serve::PopResult::kTimeout) {
            if (c.ticket->state() == serve::RequestState::kQueued) {
              // Still waiting: where it stands and how long it may take.
              const gateway::Progress p = gateway_.progress(*c.ticket);
              if (p.queue_position > 0) {
                out += sse_data(render_queued_chunk(c.id, c.created, c.model, c.chat, c.ticket->path(),
                                                    p.queue_position, finite_ms(p.estimated_delay_s)));
              }
            }
            if (out.empty()) out = std::string(kSseKeepAlive);
            return sink.write(out.data(), out.size()) ? true : fail();
          }
          // Send every event already waiting in one write.
          while (r == serve::PopResult::kItem && ev.kind == serve::RequestEvent::Kind::kText) {
            // Moved to another path since the last chunk (a failover or a
            // migration): the first text from there says where it runs now,
            // degraded included, rather than only the stream's last chunk.
            const bool moved = c.ticket->attempts() != c.attempts;
            if (moved) fill_times(c);
            out += chunk(c, std::move(ev.text), "", false, /*with_info=*/moved);
            r = c.ticket->next_event(ev, std::chrono::milliseconds(0));
          }
          if (r == serve::PopResult::kTimeout) {
            return sink.write(out.data(), out.size()) ? true : fail();
          }
          if (r == serve::PopResult::kClosed) {
            ev.kind = serve::RequestEvent::Kind::kFinished;
            ev.state = serve::RequestState::kFailed;
            ev.status = Status::internal("request stream ended without a result");
          }
          // Finished.
          c.finished = true;
          fill_times(c);
          if (ev.state == serve::RequestState::kDone) {
            out += chunk(c, "", std::string(serve::finish_reason_name(ev.finish)), false, true);
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
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        },
        [this, call](bool /*success*/) {
          if (!serve::is_terminal(call->ticket->state())) gateway_.cancel(call->ticket->id());
        });
  }

  Env& env_;
  gateway::Gateway& gateway_;
  const HttpServerOptions options_;
  httplib::Server svr_;
  std::mutex mu_;
  std::thread thread_;
  int port_ = 0;
};

Result<std::unique_ptr<HttpServer>> HttpServer::create(Env& env, gateway::Gateway& gateway,
                                                       HttpServerOptions options) {
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] { std::signal(SIGPIPE, SIG_IGN); });
  if (options.port < 0 || options.port > 65535) {
    return Status::invalid_argument("port must be in [0, 65535], got " + std::to_string(options.port));
  }
  if (options.keepalive_interval.count() <= 0) {
    return Status::invalid_argument("keepalive_interval must be > 0");
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::make_unique<Impl>(env, gateway, std::move(options))));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;
Status HttpServer::start() { return impl_->start(); }
int HttpServer::port() const { return impl_->port(); }
const std::string& HttpServer::host() const { return impl_->host(); }
void HttpServer::stop() { impl_->stop(); }

}  // namespace spw::http
