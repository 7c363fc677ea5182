// HttpServer::Impl, declared once for the files that define its members
// (internal to spw_http; http/server.h is the interface). One class whose
// member functions are grouped by what they serve, a file a group, so that
// each file can be read on its own:
//   server.cpp             start/stop, authentication, the route table;
//   server_generation.cpp  POST /v1/completions and /v1/chat/completions: the
//                          body to a generation, submission and refusal, the
//                          response whole or streamed;
//   server_requests.cpp    request records: resume, replay of a finished
//                          request, GET and DELETE /v1/requests[/{id}];
//   server_admin.cpp       /health, /v1/quote, /v1/reservations and the admin
//                          fault API.
// Each member's comment is at its definition. The helpers below are shared
// by those files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gateway/request_service.h"
#include "http/models.h"
#include "http/openai.h"
#include "http/server.h"
#include "http/spillway_api.h"
#include "http/tool_calls.h"
#include "http/transport.h"

namespace spw::http {

inline constexpr const char* kJson = "application/json";

// The error's status and body (render_error); Retry-After: 1 on a 429 or a 503.
void set_error(Response& res, const ApiError& e, const std::string& model = "");
// A header that says yes: "true", "1" or "yes" in any case.
bool header_true(const Request& req, const char* name);
// Milliseconds of a predicted time; nullopt when the rates cannot say (infinite).
std::optional<double> finite_ms(double seconds);

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

// A model's chat template (the served one's, or a catalogue model's).
struct ModelChat {
  std::optional<ChatTemplateKind> kind;
  bool is_default = false;
};

// The catalogue's ids with their unavailability ("" : served), for ModelCatalog.
inline std::vector<std::pair<std::string, std::string>> catalogue_ids(
    const std::vector<HttpServerOptions::CatalogueModel>& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& m : c) out.emplace_back(m.id, m.unavailable);
  return out;
}

class HttpServer::Impl {
 public:
  Impl(Env& env, gateway::Gateway& gateway, HttpServerOptions options)
      : env_(env),
        gateway_(gateway),
        options_(std::move(options)),
        models_(ModelCatalog::build(options_.model_name, options_.model_aliases, gateway.paths(),
                                    catalogue_ids(options_.catalogue))),
        service_(env, gateway, service_options()) {}

  ~Impl() { stop(); }

  Status start();
  void stop();
  int port() const { return port_; }
  const std::string& host() const { return options_.host; }
  TransportStats transport_stats() const;

 private:
  // Who is asking: the owner label of an API key ("" without keys), or the
  // admin (the --admin-token from this host), who sees every request.
  struct Principal {
    std::string owner;
    bool admin = false;
  };
  using AuthedHandler = std::function<void(const Request&, Response&, const Principal&)>;

  bool keys_configured() const { return options_.api_keys && !options_.api_keys->empty(); }

  // Authentication and routing (server.cpp).
  bool is_admin(const Request& req) const;
  std::optional<Principal> authorize(const Request& req, Response& res) const;
  static void unauthorized(Response& res, const std::string& message);
  Handler authed(AuthedHandler fn);
  Router routes();

  // Generation: completions and chat completions (server_generation.cpp).
  serve::GenerationRequest to_generation(const SamplingFields& s);
  std::optional<ApiError> resolve_model(const std::string& requested, std::string* out) const;
  // The chat template of a model id (a catalogue model's own; else the
  // served model's, which a fallback model shares).
  ModelChat model_chat(const std::string& model) const {
    for (const HttpServerOptions::CatalogueModel& m : options_.catalogue) {
      if (m.id == model) return {m.chat_template, m.chat_template_default};
    }
    return {options_.chat_template, options_.chat_template_default};
  }
  std::optional<ApiError> generation_from_body(const std::string& body, bool chat, serve::GenerationRequest& g,
                                               SamplingFields& sampling, std::string* route_model = nullptr,
                                               ToolUse* tool_use = nullptr, std::string* prompt_text = nullptr,
                                               bool* echo = nullptr, std::string* read_model = nullptr);
  void completion(const Request& req, Response& res, const Principal& who, bool chat);
  static Result<bool> allow_migration(const Request& req);
  void refuse(Response& res, const Status& st, const gateway::Refusal& refusal, int64_t public_id = 0);
  void respond(const Request& req, const std::shared_ptr<Call>& call, Response& res, bool stream_it);
  const gateway::ExecutionPath& path_named(const std::string& name) const;
  void fill_route(Call& c);
  ApiError error_for(const Call& c, const Status& st);
  void fill_times(Call& c);
  static void start_tools(Call& c, const ToolUse& use);
  static ToolCallStream::Released tool_pass(Call& c, std::string text, bool at_end);
  static std::string finish_name(const Call& c, std::string reason);
  static std::string finish_name(const Call& c, FinishReason f);
  std::string released_chunks(Call& c, ToolCallStream::Released r, bool with_info,
                              const std::optional<ChoiceLogprobs>& logprobs);
  static void mark_closed(serve::RequestEvent& ev);
  static void wait_event(Call& c, serve::RequestEvent& ev);
  void whole_choices(Call& c, Response& res);
  void whole(Call& c, Response& res);
  static std::optional<ChoiceLogprobs> chunk_logprobs(Call& c, std::vector<TokenLogprobs> entries);
  std::string echo_chunk(Call& c, std::vector<TokenLogprobs> prompt_entries);
  std::string chunk(const Call& c, std::string text, std::string finish, bool first, bool with_info,
                    const std::optional<ChoiceLogprobs>& logprobs = std::nullopt, int32_t index = 0);
  void stream(const std::shared_ptr<Call>& call, Response& res);

  // Request records: resume, replay, GET/DELETE /v1/requests (server_requests.cpp).
  void resume_request(const Request& req, Response& res, const Principal& who);
  Result<gateway::StoredRequest> parse_stored(const journal::Record& r);
  gateway::RequestServiceOptions service_options();
  static ApiError not_found(const std::string& text);
  std::string response_id(bool chat, int64_t record_id);
  void replay(Call& c, const journal::Record& r, bool stream, Response& res);
  static ApiError bad_request_id(const std::string& text);
  void request_record(const Request& req, Response& res, const Principal& who);
  void cancel_request(const Request& req, Response& res, const Principal& who);
  void list_requests(Response& res, const Principal& who);
  static gateway::Caller service_caller(const Principal& p) { return {p.owner, p.admin}; }
  // The call ended: it leaves the in-flight list.
  void forget(const Call& c) { service_.finished(c.public_id); }

  // Health, quotes, reservations and the admin fault API (server_admin.cpp).
  static std::optional<uint64_t> reservation_id(const Request& req, Response& res);
  bool admin_allowed(const Request& req, Response& res);
  void arm_fault(const Request& req, Response& res);
  static std::string fault_target(const gateway::ExecutionPath& p);
  std::vector<FaultView> armed_faults();
  void disarm_faults(Response& res);
  void health(Response& res);
  static ApiError reservation_error(const Status& st);
  void reserve(const Request& req, Response& res, const Principal& p);
  void quote(const Request& req, Response& res);
  void embeddings(const Request& req, Response& res, const Principal& who);
  void route_headers(const Call& c, Response& res);
  // Reservations belong to the key that made them (the admin sees all).
  static gateway::ReservationCaller caller(const Principal& p) { return {p.owner, p.admin}; }

  Env& env_;
  gateway::Gateway& gateway_;
  const HttpServerOptions options_;
  const ModelCatalog models_;  // the ids `model` may name (built from options_: after it)
  gateway::RequestService service_;
  mutable std::mutex mu_;
  std::unique_ptr<Transport> transport_;
  int port_ = 0;
};

}  // namespace spw::http
