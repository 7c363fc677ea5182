// HttpServer::Impl, the operator's routes: GET /health, POST /v1/quote
// (a request priced without running it), /v1/reservations (memory leased
// to co-tenants) and the admin fault API (/v1/admin/faults, loopback and
// the admin token only). Apart from generation because none of them runs
// a request.
#include <algorithm>
#include <cstdio>

#include "http/server_impl.h"

namespace spw::http {

namespace {

ApiError no_route(const Request& req) {
  ApiError e;
  e.http_status = 404;
  e.code = "not_found";
  e.message = "no route for " + req.method + " " + req.path;
  return e;
}

}  // namespace

// A reservation id from the path: 1 to 18 decimal digits (400 otherwise).
std::optional<uint64_t> HttpServer::Impl::reservation_id(const Request& req, Response& res) {
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
bool HttpServer::Impl::admin_allowed(const Request& req, Response& res) {
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

void HttpServer::Impl::arm_fault(const Request& req, Response& res) {
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
std::string HttpServer::Impl::fault_target(const gateway::ExecutionPath& p) {
  return p.device ? p.device->name() : p.placement;
}

// Every injector's faults once (a device's, a CPU path's), labelled with
// the first path on it.
std::vector<FaultView> HttpServer::Impl::armed_faults() {
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

void HttpServer::Impl::disarm_faults(Response& res) {
  const size_t n = armed_faults().size();
  for (const gateway::ExecutionPath& p : gateway_.paths()) {
    if (FaultInjector* f = p.faults()) f->disarm();
  }
  std::fprintf(stderr, "spillway: admin: disarmed %zu faults\n", n);
  res.set_content(render_disarmed(n), kJson);
}

void HttpServer::Impl::health(Response& res) {
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

ApiError HttpServer::Impl::reservation_error(const Status& st) {
  ApiError e = api_error_from_status(st);
  if (st.code() == StatusCode::kNotFound) {
    e.http_status = 404;
    e.code = "not_found";
  }
  return e;
}

void HttpServer::Impl::reserve(const Request& req, Response& res, const Principal& p) {
  ReservationRequest r;
  if (auto e = parse_reservation_request(req.body, r)) return set_error(res, *e);
  auto info = gateway_.reserve_cotenant(r.name, r.bytes, r.ttl_s, caller(p));
  if (!info.ok()) return set_error(res, reservation_error(info.status()));
  res.status = 201;
  res.set_content(render_reservation(*info), kJson);
}

// POST /v1/quote: a completion body (or a chat body: "messages") priced
// without running anything.
void HttpServer::Impl::quote(const Request& req, Response& res) {
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

}  // namespace spw::http
