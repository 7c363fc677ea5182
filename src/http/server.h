// HttpServer: Spillway's OpenAI-compatible HTTP front end, over the
// hostile-client-safe transport of http/transport.h (limits, deadlines,
// connection caps, disconnects; read its contract).
//
// Routes:
//   GET  /health               {"status":"ok","model","backend","queue":{"depth","capacity",...}}
//   GET  /v1/models            the one served model
//   POST /v1/completions       prompt -> text (stream=true: Server-Sent Events)
//   POST /v1/chat/completions  messages -> assistant message, through the chat
//                              template fixed at start (the GGUF's
//                              tokenizer.chat_template or --chat-template)
//   GET  /v1/requests/{id}     a journaled request's state and result; {id}
//                              is the request_id a response carried (a
//                              random 53-bit number: ids cannot be guessed
//                              or enumerated) or its OpenAI id
//                              ("cmpl-<16 hex>", "chatcmpl-<16 hex>")
//   DELETE /v1/requests/{id}   cancels an in-flight request: a queued one at
//                              once (its KV blocks and reservations freed
//                              before the answer), a running one at its next
//                              token boundary; 404 when none is in flight
//   POST /v1/requests/{id}/resume  {"received_text", "stream"}: an
//                              interrupted request (a resumable error, or a
//                              server killed mid-request) continues from its
//                              journaled checkpoint, sending only what the
//                              client lacks; one killed before its first
//                              checkpoint continues from its prompt (not
//                              when it sampled with a server-chosen seed and
//                              the client already has text: 409). 409
//                              not_resumable otherwise, saying why
//   POST /v1/quote             a completion or chat body -> the decision
//                              admission would take now, per-path predictions
//   GET  /v1/status            paths, ledgers, reservations, decision counts
//   GET  /metrics              the same in the Prometheus text format (http/metrics.h)
//   POST /v1/reservations      {"name","bytes","ttl_s"}: a co-tenant's memory
//   GET  /v1/reservations      the live reservations
//   POST /v1/reservations/{id}/renew   heartbeat: extends the lease by ttl_s
//   DELETE /v1/reservations/{id}       releases it
//   GET  /health/live          200 while the process serves HTTP
//   GET  /health/ready         200 while some path accepts work, else 503
//   POST /v1/admin/faults      (only with options.admin_token) arms a fault on
//                              a path's device: {"kind", "path",
//                              "after_submits", "count", "factor"} -> 201
//                              with the armed fault and its id
//   GET  /v1/admin/faults      the armed faults (and spent ones) with counts
//   DELETE /v1/admin/faults    disarms every fault: {"disarmed": n}
// Authentication (options.api_keys, http/auth.h): with keys configured every
// /v1/* route and /metrics need "Authorization: Bearer <key>" (401
// invalid_api_key otherwise); /health, /health/live and /health/ready stay
// open. A request record (GET / DELETE /v1/requests/{id}, resume) is visible
// only to the key that created it: any other key gets 404 as for an unknown
// id. Idempotency keys are scoped per API key. The admin token (from this
// host) sees every request. Without keys every client is one user; create()
// refuses a non-loopback host without keys unless options.insecure_no_auth.
// Before anything costly, a completion is refused (and journaled as a summary:
// size, SHA-256, reason; never its body) when its prompt's bytes cannot fit
// any path's context whatever the tokenizer makes of them, or when every
// queue is full (429 with Retry-After from the queues' measured drain rate);
// a retry carrying the Idempotency-Key of a finished request is replayed
// whatever the load. A refusal after the request was journaled drops its
// stored body too. A repeated Idempotency-Key header is 400.
// The admin API is off by default: without admin_token, or for a peer that is
// not a loopback address, its routes answer 404 exactly as unknown paths do;
// a missing or wrong bearer token is 401 (compared in constant time); a bad
// body is 400 naming the field (`param`), and a path without a device (the
// CPU path) is 400 naming `path`. Armed faults act inside the backend, where
// real ones happen (backend/fault_injector.h).
// Every completion goes through the Gateway: admission decides its path
// (admit / delay / shrink / offload / redirect) before anything runs, or
// refuses it (429 with Retry-After when the queues are full, 503 when no path
// can serve it) with the decision's reason in the body's "spillway" object and
// the refusal journaled as resumable. A request may ask to be shrunk to fit
// with the header X-Spillway-Allow-Shrink: true. Responses carry the path,
// placement, model, decision, reason, degraded flag, limits, queue position
// and estimated delay in the body's "spillway" object (every stream chunk
// that has one) and in X-Spillway-* headers; while a streamed request waits in
// a queue it gets a chunk with "choices":[] and its position and estimated
// delay at least every keepalive_interval.
// With a journal, a valid completion request is recorded (state accepted)
// before it is queued, and its id is the response's request_id. A request
// whose Idempotency-Key header names a finished request gets that stored
// result ("replayed": true, nothing runs); one still in flight, or a key
// reused with another body, gets 409 (idempotency_conflict); a failed or
// cancelled one runs again under the same id. If the journal cannot record
// the request it is refused with 503 (journal_unavailable): nothing is
// accepted that could be lost; when its size budget is held by requests in
// flight, with 503 (journal_full, Retry-After) and, when finished rows can
// make room for one, a refusal summary (X-Spillway-Request-Id). The admission decision (admitted or refused:
// kind, path, reason, limits, predictions, per-path verdicts) is written to
// the record before the response, and GET /v1/requests/{id} shows it as
// "admission"; a failed write of it is logged, not fatal.
// Contract: request bodies are validated by http/openai.h (completions and
// chat) and http/spillway_api.h (resume, reservations, faults), 400 with an
// OpenAI-style error body naming the field; the scheduler's errors map to
// 400 (limits), 429 (queue full), 503 (shutting down / cancelled) and 500.
// A chat request when no template is known is 400 with a message telling the
// operator to start the server with --chat-template. Streams are
// "data: {chunk}\n\n" events ending with "data: [DONE]"; when no token arrives
// for keepalive_interval a ": keep-alive" comment is written so that a client
// that went away is noticed. A failed write (client disconnected) cancels the
// request, which frees its worker at the next token. Every successful body
// (and the first and last stream chunk) carries a "spillway" object. A
// request that asks for log-probabilities gets them in its choice, streamed
// in the chunk that completes each token's text (openai.h, "Log-
// probabilities"); a replay and a resume answer "logprobs": null.
// start() binds (port 0 picks a free port) and serves on a background thread;
// stop() stops accepting, ends open streams and joins. The first create()
// ignores SIGPIPE process-wide, so that writing to a closed socket is an
// error return and not a signal.
// Thread safety: start/stop/port may be called from any thread; handlers run on
// the transport's threads. The Gateway must outlive the HttpServer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "http/auth.h"
#include "http/openai.h"
#include "http/spillway_api.h"
#include "http/transport.h"
#include "gateway/gateway.h"
#include "serve/scheduler.h"
#include "tokenizer/chat_template.h"

namespace spw::http {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string model_name;
  // Other ids that name the served model in a request's `model` field (the
  // names clients are configured with); see http/models.h for what `model`
  // may be and the 404 for anything else.
  std::vector<std::string> model_aliases;
  std::optional<ChatTemplateKind> chat_template;  // none: chat requests are refused
  // The catalogue's models beyond the served one (gateway/builder.h): each
  // id with its own chat template, or the reason it is unavailable (listed
  // in /v1/models, 404 model_unavailable when named).
  struct CatalogueModel {
    std::string id;
    std::string unavailable;  // "": served
    std::optional<ChatTemplateKind> chat_template;
    bool chat_template_default = false;
  };
  std::vector<CatalogueModel> catalogue;
  // The template is a default chosen for a model that has none: chat
  // responses say so (X-Spillway-Chat-Template: NAME; default).
  bool chat_template_default = false;
  // Limits, deadlines and connection caps (host, port, log_requests and
  // render_error are set from the fields here).
  TransportOptions transport;
  // API keys; null or empty: no authentication (loopback only, unless
  // insecure_no_auth).
  std::shared_ptr<const ApiKeys> api_keys;
  bool insecure_no_auth = false;
  std::chrono::milliseconds keepalive_interval{1000};
  // OpenAI's default for /v1/completions when max_tokens is absent; chat
  // completions default to the room left in the context.
  int32_t completion_default_max_tokens = 16;
  bool log_requests = false;  // one line per request on stderr
  // Read on every GET /health (from the handler's thread); empty: no
  // host_memory section.
  std::function<HealthMemory()> host_memory;
  // Likewise for device_memory; empty: no device_memory section.
  std::function<HealthDeviceMemory()> device_memory;
  // Every accepted completion is recorded here before it is queued (the
  // scheduler's RequestObserver writes its progress); null: no journal, no
  // Idempotency-Key handling, and GET /v1/requests/{id} answers 404.
  std::shared_ptr<journal::Journal> journal;
  // Enables the admin API (/v1/admin/faults) for requests from this host
  // carrying "Authorization: Bearer <admin_token>"; empty: no admin API.
  std::string admin_token;
};

// The template a server should use: `name` (from --chat-template) when given
// (InvalidArgument listing the valid names when unknown), else the family
// detected from the GGUF's tokenizer.chat_template; nullopt when the model has
// none that Spillway recognises.
Result<std::optional<ChatTemplateKind>> resolve_chat_template(const gguf::GgufFile& file, const std::string& name);

// A listen address only this host can reach ("localhost", 127.0.0.0/8, ::1).
bool is_loopback_host(const std::string& host);
// Listening on `host` without API keys: OK on loopback or with
// insecure_no_auth, else InvalidArgument saying what to do (checked by
// create(), and by `spillway serve` before it loads the model).
Status check_listen_auth(const std::string& host, bool have_keys, bool insecure_no_auth);

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> create(Env& env, gateway::Gateway& gateway,
                                                    HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving on a background thread. Unavailable naming the
  // address when the bind fails.
  Status start();
  // The bound port (valid after start()).
  int port() const;
  const std::string& host() const;
  void stop();
  // Connections, timeouts and refusals so far.
  TransportStats transport_stats() const;

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spw::http
