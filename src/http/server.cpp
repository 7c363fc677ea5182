#include "http/server.h"

#include "http/status_page.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <csignal>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/digest.h"
#include "http/auth.h"
#include "http/completion_prompt.h"
#include "http/metrics.h"
#include "http/models.h"
#include "http/transport.h"
#include "http/openai.h"
#include "gateway/request_service.h"

namespace spw::http {

namespace {

constexpr const char* kJson = "application/json";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void set_error(Response& res, const ApiError& e, const std::string& model = "") {
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
  int64_t public_id = 0;  // the id clients see (request_id): random, unguessable
  std::string id;
  int64_t created = 0;
  std::string model;
  SpillwayInfo info;
  int32_t attempts = 0;  // the ticket's attempts when `info` was filled
  // A resume: checkpoint text the client lacks, sent before the ticket's.
  std::string unsent;
  // The request asked for log-probabilities (a replay or a resume never
  // has them: openai.h), and, for /v1/completions, the text_offset of the
  // next entry (characters of the prompt and of the text listed so far).
  bool logprobs = false;
  int64_t text_offset = 0;
  // /v1/completions with "echo": true: the prompt's text, sent before the
  // completion's (streaming: when the prompt's log-probability entries
  // come, if asked for, else at once); echo_sent once it was.
  std::string echo;
  bool echo_sent = false;
  // Chat with tools: the model's calls are parsed out of its text (null:
  // none asked for, or tool_choice "none").
  std::unique_ptr<ToolCallStream> tools;
  // Stream progress (touched only by the connection's thread).
  bool started = false;
  bool finished = false;
  // OpenAI's n; with n > 1 each choice's completions text_offset (no echo,
  // no tools, no resume with n > 1).
  int32_t n = 1;
  std::vector<int64_t> choice_offsets;
};

// How a chat request uses tools (generation_from_body): the format its
// template's models write calls in; kNone when it has none.
struct ToolUse {
  ToolFormat format = ToolFormat::kNone;
  bool parallel = true;
};

bool header_true(const Request& req, const char* name) {
  std::string v = req.header(name);
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

ApiError no_route(const Request& req) {
  ApiError e;
  e.http_status = 404;
  e.code = "not_found";
  e.message = "no route for " + req.method + " " + req.path;
  return e;
}

}  // namespace

bool is_loopback_host(const std::string& host) { return host == "localhost" || is_loopback_address(host); }

Status check_listen_auth(const std::string& host, bool have_keys, bool insecure_no_auth) {
  if (have_keys || insecure_no_auth || is_loopback_host(host)) return Status::ok_status();
  return Status::invalid_argument(
      "listening on " + host +
      " without an API key would let every device on the network read and cancel every request: give "
      "--api-key KEY (or api-key-hash in the config file; `spillway hash-key --generate` makes one), or "
      "--insecure-no-auth to accept that");
}

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
      : env_(env),
        gateway_(gateway),
        options_(std::move(options)),
        models_(ModelCatalog::build(options_.model_name, options_.model_aliases, gateway.paths())),
        service_(env, gateway, service_options()) {}

  ~Impl() { stop(); }

  Status start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (transport_) return Status::failed_precondition("http server already started");
    TransportOptions t = options_.transport;
    t.host = options_.host;
    t.port = options_.port;
    t.log_requests = options_.log_requests;
    // Keys are the defence against a browser reaching the API through DNS
    // rebinding; without them, the Host header is (transport.h).
    t.check_host = !keys_configured();
    t.render_error = [](int status, std::string_view code, std::string_view message) {
      ApiError e;
      e.http_status = status;
      e.type = status >= 500 ? "server_error" : "invalid_request_error";
      e.code = std::string(code);
      e.message = std::string(message);
      return render_error(e);
    };
    SPW_ASSIGN_OR_RETURN(transport_, Transport::create(std::move(t), routes()));
    if (Status st = transport_->start(); !st.ok()) {
      transport_.reset();
      return st;
    }
    port_ = transport_->port();
    return Status::ok_status();
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (transport_) transport_->stop();
  }

  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  TransportStats transport_stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return transport_ ? transport_->stats() : TransportStats{};
  }

 private:
  // Who is asking: the owner label of an API key ("" without keys), or the
  // admin (the --admin-token from this host), who sees every request.
  struct Principal {
    std::string owner;
    bool admin = false;
  };
  using AuthedHandler = std::function<void(const Request&, Response&, const Principal&)>;

  bool keys_configured() const { return options_.api_keys && !options_.api_keys->empty(); }

  bool is_admin(const Request& req) const {
    if (options_.admin_token.empty() || !is_loopback_address(req.peer)) return false;
    const std::string auth = req.header("Authorization");
    const std::optional<std::string_view> token = bearer_token(auth);
    return token && constant_time_equal(*token, options_.admin_token);
  }

  // nullopt: refused (401 written to res).
  std::optional<Principal> authorize(const Request& req, Response& res) const {
    if (is_admin(req)) return Principal{"", true};
    if (!keys_configured()) return Principal{};
    if (req.header_count("Authorization") > 1) {
      unauthorized(res, "send one Authorization header, not several");
      return std::nullopt;
    }
    const KeyCheck k = options_.api_keys->check(req.header("Authorization"));
    switch (k.kind) {
      case KeyCheck::kValid: return Principal{k.owner, false};
      case KeyCheck::kNone: unauthorized(res, "this server needs an API key: send Authorization: Bearer <key>"); break;
      case KeyCheck::kMalformed: unauthorized(res, "the Authorization header is not 'Bearer <key>'"); break;
      case KeyCheck::kInvalid: unauthorized(res, "the API key is not valid for this server"); break;
    }
    return std::nullopt;
  }

  static void unauthorized(Response& res, const std::string& message) {
    ApiError e;
    e.http_status = 401;
    e.code = "invalid_api_key";
    e.message = message;
    res.set_header("WWW-Authenticate", "Bearer");
    set_error(res, e);
  }

  Handler authed(AuthedHandler fn) {
    return [this, fn = std::move(fn)](const Request& req, Response& res) {
      if (auto p = authorize(req, res)) fn(req, res, *p);
    };
  }

  Router routes() {
    Router r;
    constexpr RouteKind kInline = RouteKind::kInline;
    constexpr RouteKind kWorker = RouteKind::kWorker;
    // Light routes stay answerable past the connection caps: what an
    // operator looks at when the server is flooded.
    // The status page: public (it holds no data; its calls to the API carry
    // the key), light (an operator must see it when the server is full).
    r.add("GET", "/", kInline, [](const Request&, Response& res) {
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                     "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
      res.set_header("Cache-Control", "no-store");
      res.set_content(std::string(status_page_html()), "text/html; charset=utf-8");
    }, /*light=*/true);
    r.add("GET", "/health", kInline, [this](const Request&, Response& res) { health(res); }, /*light=*/true);
    r.add("GET", "/health/live", kInline,
          [](const Request&, Response& res) { res.set_content(R"({"status":"live"})", kJson); }, true);
    r.add("GET", "/health/ready", kInline, [this](const Request&, Response& res) {
      const bool ready = gateway_.ready();
      res.status = ready ? 200 : 503;
      res.set_content(ready ? R"({"status":"ready"})" : R"({"status":"not_ready"})", kJson);
    }, true);
    r.add("GET", "/v1/status", kInline, authed([this](const Request&, Response& res, const Principal& p) {
      const TransportStats http = transport_->stats();  // set before any handler runs; no lock (stop() holds it)
      gateway::GatewayStatus st = gateway_.status();
      // A key sees its own leases; the ledgers' co-tenant totals stay (they
      // explain the decisions), not whose they are.
      std::erase_if(st.reservations, [&](const gateway::ReservationInfo& r) { return !p.admin && r.owner != p.owner; });
      res.set_content(render_status(st, &http), kJson);
    }), true);
    // On a worker thread: the journal's figures are an SQLite query, which
    // may wait for a writer's commit.
    r.add("GET", "/metrics", kWorker, authed([this](const Request&, Response& res, const Principal&) {
      const TransportStats http = transport_->stats();  // set before any handler runs; no lock (stop() holds it)
      const std::optional<journal::JournalStats> js = service_.journal_stats();
      res.set_content(render_metrics(gateway_.status(), &http, js ? &*js : nullptr),
                      "text/plain; version=0.0.4; charset=utf-8");
    }), true);
    r.add("GET", "/v1/models", kInline, authed([this](const Request&, Response& res, const Principal&) {
      res.set_content(render_models(models_, env_.wall_time_ms() / 1000), kJson);
    }));
    r.add("GET", "/v1/models/{}", kInline, authed([this](const Request& req, Response& res, const Principal&) {
      const ModelEntry* m = models_.find(req.params[0]);
      if (!m) return set_error(res, model_not_found(req.params[0], models_));
      res.set_content(render_model(*m, env_.wall_time_ms() / 1000), kJson);
    }));
    r.add("POST", "/v1/completions", kWorker, authed([this](const Request& req, Response& res, const Principal& p) {
      completion(req, res, p, false);
    }));
    r.add("POST", "/v1/chat/completions", kWorker,
          authed([this](const Request& req, Response& res, const Principal& p) { completion(req, res, p, true); }));
    r.add("GET", "/v1/requests", kInline,
          authed([this](const Request&, Response& res, const Principal& p) { list_requests(res, p); }));
    r.add("GET", "/v1/requests/{}", kWorker,
          authed([this](const Request& req, Response& res, const Principal& p) { request_record(req, res, p); }));
    r.add("DELETE", "/v1/requests/{}", kWorker,
          authed([this](const Request& req, Response& res, const Principal& p) { cancel_request(req, res, p); }));
    r.add("POST", "/v1/requests/{}/resume", kWorker,
          authed([this](const Request& req, Response& res, const Principal& p) { resume_request(req, res, p); }));
    r.add("POST", "/v1/quote", kWorker, authed([this](const Request& req, Response& res, const Principal&) { quote(req, res); }));
    r.add("POST", "/v1/reservations", kWorker,
          authed([this](const Request& req, Response& res, const Principal& p) { reserve(req, res, p); }));
    r.add("GET", "/v1/reservations", kInline, authed([this](const Request&, Response& res, const Principal& p) {
      res.set_content(render_reservations(gateway_.reservations(caller(p))), kJson);
    }));
    r.add("POST", "/v1/reservations/{}/renew", kWorker, authed([this](const Request& req, Response& res, const Principal& p) {
      const std::optional<uint64_t> id = reservation_id(req, res);
      if (!id) return;
      auto rr = gateway_.renew(*id, caller(p));
      if (!rr.ok()) return set_error(res, reservation_error(rr.status()));
      res.set_content(render_reservation(*rr), kJson);
    }));
    r.add("DELETE", "/v1/reservations/{}", kWorker, authed([this](const Request& req, Response& res, const Principal& p) {
      const std::optional<uint64_t> id = reservation_id(req, res);
      if (!id) return;
      Status st = gateway_.release(*id, caller(p));
      if (!st.ok()) return set_error(res, reservation_error(st));
      res.set_content(R"({"released":true})", kJson);
    }));
    if (!options_.admin_token.empty()) {
      r.add("POST", "/v1/admin/faults", kWorker, [this](const Request& req, Response& res) {
        if (admin_allowed(req, res)) arm_fault(req, res);
      });
      r.add("GET", "/v1/admin/faults", kWorker, [this](const Request& req, Response& res) {
        if (admin_allowed(req, res)) res.set_content(render_faults(armed_faults()), kJson);
      });
      r.add("DELETE", "/v1/admin/faults", kWorker, [this](const Request& req, Response& res) {
        if (admin_allowed(req, res)) disarm_faults(res);
      });
    }
    return r;
  }

  // A reservation id from the path: 1 to 18 decimal digits (400 otherwise).
  static std::optional<uint64_t> reservation_id(const Request& req, Response& res) {
    const std::string& t = req.params[0];
    if (t.empty() || t.size() > 18 || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      ApiError e;
      e.param = "id";
      e.code = "invalid_value";
      e.message = "reservation id: expected a decimal integer of at most 18 digits";
      set_error(res, e);
      return std::nullopt;
    }
    return std::stoull(t);
  }

  // The admin API: as if absent (404) for a peer that is not this host; 401
  // without the bearer token.
  bool admin_allowed(const Request& req, Response& res) {
    if (!is_loopback_address(req.peer)) {
      set_error(res, no_route(req));
      return false;
    }
    if (!is_admin(req)) {
      ApiError e;
      e.http_status = 401;
      e.code = "invalid_api_key";
      e.message = "the admin API needs the header Authorization: Bearer <the --admin-token of this server>";
      res.set_header("WWW-Authenticate", "Bearer");
      set_error(res, e);
      return false;
    }
    return true;
  }

  void arm_fault(const Request& req, Response& res) {
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
    // A path without a device takes slow faults on its cores only (the
    // other kinds are a device's).
    FaultInjector* faults = path->faults();
    if (faults == nullptr || (!path->device && fr.spec.kind != FaultKind::kSlow)) {
      ApiError e;
      e.param = "path";
      e.code = "invalid_value";
      e.message = "a " + std::string(fault_kind_name(fr.spec.kind)) + " fault needs a device; the " + path->name +
                  " path (" + path->placement + ") runs on none" + (faults ? " (it takes slow faults)" : "");
      return set_error(res, e);
    }
    Result<ArmedFault> armed = faults->arm(fr.spec);
    if (!armed.ok()) return set_error(res, api_error_from_status(armed.status()));
    const std::string where = fault_target(*path);
    std::fprintf(stderr, "spillway: admin: armed fault %llu: %s on %s (after %lld, count %lld)\n",
                 static_cast<unsigned long long>(armed->id), std::string(fault_kind_name(fr.spec.kind)).c_str(),
                 where.c_str(), static_cast<long long>(fr.spec.after), static_cast<long long>(fr.spec.count));
    res.status = 201;
    res.set_content(render_fault({path->name, where, *armed}), kJson);
  }

  // What a path's faults act on: its device's name, else its placement ("cpu").
  static std::string fault_target(const gateway::ExecutionPath& p) {
    return p.device ? p.device->name() : p.placement;
  }

  // Every injector's faults once (a device's, a CPU path's), labelled with
  // the first path on it.
  std::vector<FaultView> armed_faults() {
    std::vector<FaultView> out;
    std::vector<const FaultInjector*> seen;
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      FaultInjector* f = p.faults();
      if (f == nullptr || std::find(seen.begin(), seen.end(), f) != seen.end()) continue;
      seen.push_back(f);
      for (const ArmedFault& a : f->list()) out.push_back({p.name, fault_target(p), a});
    }
    return out;
  }

  void disarm_faults(Response& res) {
    const size_t n = armed_faults().size();
    for (const gateway::ExecutionPath& p : gateway_.paths()) {
      if (FaultInjector* f = p.faults()) f->disarm();
    }
    std::fprintf(stderr, "spillway: admin: disarmed %zu faults\n", n);
    res.set_content(render_disarmed(n), kJson);
  }

  void health(Response& res) {
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
  std::optional<ApiError> resolve_model(const std::string& requested, std::string* out) const {
    std::variant<std::string, ApiError> r = models_.resolve(requested);
    if (auto* e = std::get_if<ApiError>(&r)) return std::move(*e);
    *out = std::get<std::string>(std::move(r));
    return std::nullopt;
  }

  // A completion or chat body -> the engine's request (chat: through the
  // template, with its end-of-turn stops) and, when route_model is given, the
  // body's `model` resolved (ModelCatalog::resolve: a 404 for an id this
  // server does not serve; a stored body, parsed again without route_model,
  // keeps the id it was accepted under even if --alias changed since);
  // nullopt on success, else the error.
  std::optional<ApiError> generation_from_body(const std::string& body, bool chat, serve::GenerationRequest& g,
                                               SamplingFields& sampling, std::string* route_model = nullptr,
                                               ToolUse* tool_use = nullptr, std::string* prompt_text = nullptr,
                                               bool* echo = nullptr) {
    if (chat) {
      ChatRequest cr;
      if (auto e = parse_chat_request(body, cr)) return e;
      if (route_model) if (auto e = resolve_model(cr.model, route_model)) return e;
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
      if (!cr.tools.empty() && !chat_template_renders_tools(*options_.chat_template)) {
        ApiError e;
        e.param = "tools";
        e.code = "unsupported_parameter";
        e.message = "the server's chat template (" + std::string(chat_template_name(*options_.chat_template)) +
                    ") has no tool-call format Spillway renders; tools work with the chatml, llama3, mistral-v3, "
                    "mistral-v3-tekken and mistral-v7-tekken templates";
        return e;
      }
      Result<std::string> prompt = apply_chat_template(*options_.chat_template, cr.messages, true, special, cr.tools);
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
      if (!cr.tools.empty()) {
        // A call in progress is no place to split the generation: its
        // arguments must come from one run.
        const ToolFormat format = tool_format(*options_.chat_template);
        g.safe_points = tool_safe_points(format);
        if (tool_use) *tool_use = {format, cr.parallel_tool_calls};
      }
    } else {
      CompletionRequest cr;
      if (auto e = parse_completion_request(body, cr)) return e;
      if (route_model) if (auto e = resolve_model(cr.model, route_model)) return e;
      sampling = cr.sampling;
      if (!sampling.max_tokens) sampling.max_tokens = options_.completion_default_max_tokens;
      if (auto e = check_prompt_tokens(cr, gateway_.tokenizer().n_vocab())) return e;
      g = to_generation(sampling);
      // The prompt's text as its echo and text_offset read it: a token-id
      // prompt decoded (only for that: the engine gets the ids themselves).
      if (prompt_text) *prompt_text = cr.prompt_tokens ? gateway_.tokenizer().decode(*cr.prompt_tokens) : cr.prompt;
      if (echo) *echo = cr.echo;
      if (cr.echo && sampling.logprobs) g.prompt_logprobs = *sampling.logprobs;
      g.prompt = std::move(cr.prompt);
      g.prompt_tokens = std::move(cr.prompt_tokens);
      g.add_bos = true;  // when the vocabulary wants one (add_bos_token); not for token ids
    }
    // As llama.cpp's server: control-token texts in the prompt are those tokens.
    g.parse_special = true;
    // Ids are the served model's (a fallback model of a smaller vocabulary
    // ignores the ones past it: engine/sampler.h).
    return check_token_ids(sampling, gateway_.tokenizer().n_vocab());
  }

  void completion(const Request& req, Response& res, const Principal& who, bool chat) {
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
  static Result<bool> allow_migration(const Request& req) {
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
  void refuse(Response& res, const Status& st, const gateway::Refusal& refusal, int64_t public_id = 0) {
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

  // Headers from the call's route, then the body or the stream.
  void respond(const Request& req, const std::shared_ptr<Call>& call, Response& res, bool stream_it) {
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

  // POST /v1/requests/{id}/resume: an interrupted request (a resumable
  // error, or a server killed mid-request) continues from its journaled
  // checkpoint, after the text the client says it has.
  void resume_request(const Request& req, Response& res, const Principal& who) {
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
  Result<gateway::StoredRequest> parse_stored(const journal::Record& r) {
    gateway::StoredRequest out;
    SamplingFields sampling;
    if (auto e = generation_from_body(r.body, r.endpoint == "/v1/chat/completions", out.generation, sampling)) {
      return Status::invalid_argument(e->message);
    }
    out.seed_given = sampling.seed.has_value();
    out.n = sampling.n;
    out.max_tokens_requested = sampling.max_tokens;
    return out;
  }

  gateway::RequestServiceOptions service_options() {
    gateway::RequestServiceOptions o;
    o.journal = options_.journal;
    o.separate_owners = keys_configured();
    o.encode_decision = [](const admission::Decision& d) { return render_decision(d); };
    o.parse_stored = [this](const journal::Record& r) { return parse_stored(r); };
    return o;
  }

  static gateway::Caller service_caller(const Principal& p) { return {p.owner, p.admin}; }

  // 404 for a request id this client cannot see.
  static ApiError not_found(const std::string& text) {
    ApiError e;
    e.http_status = 404;
    e.code = "not_found";
    e.message = "request " + text.substr(0, 64) +
                " not found (never accepted, another client's, or older than the journal's retention)";
    return e;
  }

  // The OpenAI id: derived from the journal id when there is one, so that a
  // replay answers with the id of the original response.
  std::string response_id(bool chat, int64_t record_id) {
    const uint64_t v = record_id != 0 ? static_cast<uint64_t>(record_id) : env_.random_u64();
    return std::string(chat ? "chatcmpl-" : "cmpl-") + hex64(v);
  }

  // A finished request's stored result, as the original response was shaped
  // (a body, or a stream of one text chunk).
  void replay(Call& c, const journal::Record& r, bool stream, Response& res) {
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
      for (journal::StoredChoice& ch : more) out.more_choices.push_back({std::move(ch.text), std::move(ch.finish_reason), {}});
      res.set_content(c.chat ? render_chat_completion(out) : render_completion(out), kJson);
      return;
    }
    std::string body = chunk(c, "", "", /*first=*/true, /*with_info=*/true);
    if (!c.echo.empty()) body += chunk(c, c.echo, "", false, false);
    body += released_chunks(c, tool_pass(c, r.outcome.text, true), false, std::nullopt);
    // n > 1: each further choice's text in a chunk of its index.
    for (size_t i = 0; i < more.size(); ++i) {
      if (!more[i].text.empty()) body += chunk(c, more[i].text, "", false, false, std::nullopt, static_cast<int32_t>(i + 1));
    }
    for (size_t i = 0; i < more.size(); ++i) {
      body += chunk(c, "", more[i].finish_reason, false, false, std::nullopt, static_cast<int32_t>(i + 1));
    }
    body += chunk(c, "", finish_name(c, r.outcome.finish_reason), false, true);
    body += kSseDone;
    res.set_header("Cache-Control", "no-cache");
    res.set_content(body, "text/event-stream");
  }

  static ApiError bad_request_id(const std::string& text) {
    ApiError e;
    e.param = "id";
    e.code = "invalid_value";
    e.message = "request id '" + text.substr(0, 64) +
                "': expected the request_id a response carried, or its response id (cmpl-<hex>, chatcmpl-<hex>)";
    return e;
  }

  void request_record(const Request& req, Response& res, const Principal& who) {
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
  void cancel_request(const Request& req, Response& res, const Principal& who) {
    const std::string& text = req.params[0];
    const std::optional<int64_t> id = parse_request_id(text);
    if (!id) return set_error(res, bad_request_id(text));
    Result<gateway::CancelOutcome> c = service_.cancel(*id, service_caller(who));
    if (!c.ok()) {
      ApiError e;
      e.http_status = 404;
      e.code = "not_found";
      e.message = "request " + text.substr(0, 64) + " is not in flight (finished, never accepted, another client's, or unknown)";
      return set_error(res, e);
    }
    res.set_content(render_cancel(static_cast<uint64_t>(*id), c->cancelled, std::string(serve::request_state_name(c->state))),
                    kJson);
  }

  // The call ended: it leaves the in-flight list.
  void forget(const Call& c) { service_.finished(c.public_id); }

  // GET /v1/requests: the requests in flight this client may see, oldest
  // first, each with its path, decision, limits, queue position and
  // estimated delay as of now.
  void list_requests(Response& res, const Principal& who) {
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

  static ApiError reservation_error(const Status& st) {
    ApiError e = api_error_from_status(st);
    if (st.code() == StatusCode::kNotFound) {
      e.http_status = 404;
      e.code = "not_found";
    }
    return e;
  }

  // Reservations belong to the key that made them (the admin sees all).
  static gateway::ReservationCaller caller(const Principal& p) { return {p.owner, p.admin}; }

  void reserve(const Request& req, Response& res, const Principal& p) {
    ReservationRequest r;
    if (auto e = parse_reservation_request(req.body, r)) return set_error(res, *e);
    auto info = gateway_.reserve_cotenant(r.name, r.bytes, r.ttl_s, caller(p));
    if (!info.ok()) return set_error(res, reservation_error(info.status()));
    res.status = 201;
    res.set_content(render_reservation(*info), kJson);
  }

  // POST /v1/quote: a completion body (or a chat body: "messages") priced
  // without running anything.
  void quote(const Request& req, Response& res) {
    gateway::RouteRequest route;
    SamplingFields sampling;
    if (auto e = generation_from_body(req.body, is_chat_body(req.body), route.generation, sampling, &route.model)) {
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
      e.request_id = static_cast<uint64_t>(c.public_id);
    }
    return e;
  }

  void fill_times(Call& c) {
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
  static void start_tools(Call& c, const ToolUse& use) {
    if (use.format != ToolFormat::kNone) c.tools = std::make_unique<ToolCallStream>(use.format, c.public_id, use.parallel);
  }

  // Generated text through the call's tool-call stream (as is without one);
  // at_end releases what it holds back.
  static ToolCallStream::Released tool_pass(Call& c, std::string text, bool at_end) {
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
  static std::string finish_name(const Call& c, std::string reason) {
    if (reason == "stop" && c.tools && c.tools->calls_released() > 0) return "tool_calls";
    return reason;
  }
  static std::string finish_name(const Call& c, serve::FinishReason f) {
    return finish_name(c, std::string(serve::finish_reason_name(f)));
  }

  // Stream chunks for released text and calls (a content chunk, then one per
  // call, numbered in the response's order).
  std::string released_chunks(Call& c, ToolCallStream::Released r, bool with_info,
                              const std::optional<ChoiceLogprobs>& logprobs) {
    std::string out;
    if (!r.content.empty() || logprobs || with_info) out += chunk(c, std::move(r.content), "", false, with_info, logprobs);
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
  static void mark_closed(serve::RequestEvent& ev) {
    ev.kind = serve::RequestEvent::Kind::kFinished;
    ev.state = serve::RequestState::kFailed;
    ev.status = Status::internal("request stream ended without a result");
  }

  // Blocks until the ticket's next event; a closed ticket reads as a failed
  // finish (mark_closed).
  static void wait_event(Call& c, serve::RequestEvent& ev) {
    for (;;) {
      const serve::PopResult r = c.ticket->next_event(ev, std::chrono::seconds(1));
      if (r == serve::PopResult::kClosed) return mark_closed(ev);
      if (r != serve::PopResult::kTimeout) return;
    }
  }

  // Non-streaming with n > 1: every choice's events, then one body with the
  // choices by index.
  void whole_choices(Call& c, Response& res) {
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
      return std::string(serve::finish_reason_name(i < ev.choice_finish.size() ? ev.choice_finish[i] : ev.finish));
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
  void whole(Call& c, Response& res) {
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
  static std::optional<ChoiceLogprobs> chunk_logprobs(Call& c, std::vector<TokenLogprobs> entries) {
    if (!c.logprobs || entries.empty()) return std::nullopt;
    ChoiceLogprobs lp{std::move(entries), c.text_offset};
    for (const TokenLogprobs& e : lp.entries) c.text_offset += count_chars(e.token.piece);
    return lp;
  }

  // The echoed prompt as one chunk, with its entries (offsets from 0) when
  // the request asked for log-probabilities.
  std::string echo_chunk(Call& c, std::vector<TokenLogprobs> prompt_entries) {
    c.echo_sent = true;
    std::optional<ChoiceLogprobs> lp;
    if (c.logprobs && !prompt_entries.empty()) lp = ChoiceLogprobs{std::move(prompt_entries), 0};
    return chunk(c, c.echo, "", false, false, lp);
  }

  std::string chunk(const Call& c, std::string text, std::string finish, bool first, bool with_info,
                    const std::optional<ChoiceLogprobs>& logprobs = std::nullopt, int32_t index = 0) {
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

  void stream(const std::shared_ptr<Call>& call, Response& res) {
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
            out += sse_data(render_queued_chunk(c.id, c.created, c.model, c.chat, c.ticket->path(),
                                                p.queue_position, finite_ms(p.estimated_delay_s)));
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
            const serve::FinishReason f = k < ev.choice_finish.size() ? ev.choice_finish[k] : ev.finish;
            out += chunk(c, "", std::string(serve::finish_reason_name(f)), false, i + 1 == c.n, std::nullopt, i);
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

  Env& env_;
  gateway::Gateway& gateway_;
  const HttpServerOptions options_;
  const ModelCatalog models_;  // the ids `model` may name (built from options_: after it)
  gateway::RequestService service_;
  mutable std::mutex mu_;
  std::unique_ptr<Transport> transport_;
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
  SPW_RETURN_IF_ERROR(
      check_listen_auth(options.host, options.api_keys && !options.api_keys->empty(), options.insecure_no_auth));
  if (!options.admin_token.empty()) {
    SPW_RETURN_IF_ERROR(check_api_key_rules(options.admin_token, "the admin token (--admin-token)"));
  }
  std::vector<std::string> fallback_ids;
  for (const gateway::ExecutionPath& p : gateway.paths())
    if (p.fallback_model) fallback_ids.push_back(p.model);
  SPW_RETURN_IF_ERROR(validate_aliases(options.model_aliases, options.model_name, fallback_ids));
  return std::unique_ptr<HttpServer>(new HttpServer(std::make_unique<Impl>(env, gateway, std::move(options))));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;
Status HttpServer::start() { return impl_->start(); }
int HttpServer::port() const { return impl_->port(); }
const std::string& HttpServer::host() const { return impl_->host(); }
void HttpServer::stop() { impl_->stop(); }
TransportStats HttpServer::transport_stats() const { return impl_->transport_stats(); }

}  // namespace spw::http
