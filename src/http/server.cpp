// HttpServer: creation, start and stop, authentication (API keys, the admin
// token) and the route table, which hands each route to the member that
// serves it (server_impl.h says which file holds which). Also the free
// functions of server.h and the helpers the server's files share.
#include "http/server.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <optional>
#include <vector>

#include "http/auth.h"
#include "http/metrics.h"
#include "http/server_impl.h"
#include "http/status_page.h"

namespace spw::http {

void set_error(Response& res, const ApiError& e, const std::string& model) {
  res.status = e.http_status;
  if (e.http_status == 429 || e.http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(render_error(e, model), kJson);
}

bool header_true(const Request& req, const char* name) {
  std::string v = req.header(name);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return v == "true" || v == "1" || v == "yes";
}

std::optional<double> finite_ms(double seconds) {
  return std::isfinite(seconds) ? std::optional<double>(seconds * 1000.0) : std::nullopt;
}

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

Status HttpServer::Impl::start() {
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

void HttpServer::Impl::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (transport_) transport_->stop();
}

TransportStats HttpServer::Impl::transport_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return transport_ ? transport_->stats() : TransportStats{};
}

bool HttpServer::Impl::is_admin(const Request& req) const {
  if (options_.admin_token.empty() || !is_loopback_address(req.peer)) return false;
  const std::string auth = req.header("Authorization");
  const std::optional<std::string_view> token = bearer_token(auth);
  return token && constant_time_equal(*token, options_.admin_token);
}

// nullopt: refused (401 written to res).
auto HttpServer::Impl::authorize(const Request& req, Response& res) const -> std::optional<Principal> {
  if (is_admin(req)) return Principal{"", true};
  if (!keys_configured()) return Principal{};
  if (req.header_count("Authorization") > 1) {
    unauthorized(res, "send one Authorization header, not several");
    return std::nullopt;
  }
  const KeyCheck k = options_.api_keys->check(req.header("Authorization"));
  switch (k.kind) {
    case KeyCheck::kValid:
      return Principal{k.owner, false};
    case KeyCheck::kNone:
      unauthorized(res, "this server needs an API key: send Authorization: Bearer <key>");
      break;
    case KeyCheck::kMalformed:
      unauthorized(res, "the Authorization header is not 'Bearer <key>'");
      break;
    case KeyCheck::kInvalid:
      unauthorized(res, "the API key is not valid for this server");
      break;
  }
  return std::nullopt;
}

void HttpServer::Impl::unauthorized(Response& res, const std::string& message) {
  ApiError e;
  e.http_status = 401;
  e.code = "invalid_api_key";
  e.message = message;
  res.set_header("WWW-Authenticate", "Bearer");
  set_error(res, e);
}

Handler HttpServer::Impl::authed(AuthedHandler fn) {
  return [this, fn = std::move(fn)](const Request& req, Response& res) {
    if (auto p = authorize(req, res)) fn(req, res, *p);
  };
}

Router HttpServer::Impl::routes() {
  Router r;
  constexpr RouteKind kInline = RouteKind::kInline;
  constexpr RouteKind kWorker = RouteKind::kWorker;
  // Light routes stay answerable past the connection caps: what an
  // operator looks at when the server is flooded.
  // The status page: public (it holds no data; its calls to the API carry
  // the key), light (an operator must see it when the server is full).
  r.add(
      "GET", "/", kInline,
      [](const Request&, Response& res) {
        res.set_header("Content-Security-Policy",
                       "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
                       "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
        res.set_header("Cache-Control", "no-store");
        res.set_content(std::string(status_page_html()), "text/html; charset=utf-8");
      },
      /*light=*/true);
  r.add(
      "GET", "/health", kInline, [this](const Request&, Response& res) { health(res); }, /*light=*/true);
  r.add(
      "GET", "/health/live", kInline,
      [](const Request&, Response& res) { res.set_content(R"({"status":"live"})", kJson); }, true);
  r.add(
      "GET", "/health/ready", kInline,
      [this](const Request&, Response& res) {
        const bool ready = gateway_.ready();
        res.status = ready ? 200 : 503;
        res.set_content(ready ? R"({"status":"ready"})" : R"({"status":"not_ready"})", kJson);
      },
      true);
  r.add("GET", "/v1/status", kInline, authed([this](const Request&, Response& res, const Principal& p) {
          const TransportStats http = transport_->stats();  // set before any handler runs; no lock (stop() holds it)
          gateway::GatewayStatus st = gateway_.status();
          // A key sees its own leases; the ledgers' co-tenant totals stay (they
          // explain the decisions), not whose they are.
          std::erase_if(st.reservations,
                        [&](const gateway::ReservationInfo& r) { return !p.admin && r.owner != p.owner; });
          res.set_content(render_status(st, &http), kJson);
        }),
        true);
  // On a worker thread: the journal's figures are an SQLite query, which
  // may wait for a writer's commit.
  r.add("GET", "/metrics", kWorker, authed([this](const Request&, Response& res, const Principal&) {
          const TransportStats http = transport_->stats();  // set before any handler runs; no lock (stop() holds it)
          const std::optional<journal::JournalStats> js = service_.journal_stats();
          res.set_content(render_metrics(gateway_.status(), &http, js ? &*js : nullptr),
                          "text/plain; version=0.0.4; charset=utf-8");
        }),
        true);
  r.add("GET", "/v1/models", kInline, authed([this](const Request&, Response& res, const Principal&) {
          res.set_content(render_models(models_, env_.wall_time_ms() / 1000, gateway_.models()), kJson);
        }));
  r.add("GET", "/v1/models/{}", kInline, authed([this](const Request& req, Response& res, const Principal&) {
          const ModelEntry* m = models_.find(req.params[0]);
          if (!m) return set_error(res, model_not_found(req.params[0], models_));
          res.set_content(render_model(*m, env_.wall_time_ms() / 1000, gateway_.models()), kJson);
        }));
  r.add("POST", "/v1/completions", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { completion(req, res, p, false); }));
  r.add("POST", "/v1/chat/completions", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { completion(req, res, p, true); }));
  r.add("POST", "/v1/embeddings", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { embeddings(req, res, p); }));
  r.add("GET", "/v1/requests", kInline,
        authed([this](const Request&, Response& res, const Principal& p) { list_requests(res, p); }));
  r.add("GET", "/v1/requests/{}", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { request_record(req, res, p); }));
  r.add("DELETE", "/v1/requests/{}", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { cancel_request(req, res, p); }));
  r.add("POST", "/v1/requests/{}/resume", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { resume_request(req, res, p); }));
  r.add("POST", "/v1/quote", kWorker,
        authed([this](const Request& req, Response& res, const Principal&) { quote(req, res); }));
  r.add("POST", "/v1/reservations", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) { reserve(req, res, p); }));
  r.add("GET", "/v1/reservations", kInline, authed([this](const Request&, Response& res, const Principal& p) {
          res.set_content(render_reservations(gateway_.reservations(caller(p))), kJson);
        }));
  r.add("POST", "/v1/reservations/{}/renew", kWorker,
        authed([this](const Request& req, Response& res, const Principal& p) {
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

Result<std::unique_ptr<HttpServer>> HttpServer::create(Env& env, gateway::Gateway& gateway, HttpServerOptions options) {
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
