// libFuzzer target for the HTTP request -> OpenAI request path: the bytes a
// client sends, through the transport's parser and checks (limits, header
// validation, Content-Type) as a connection applies them, then the body
// through the OpenAI parsers of the route it names.
//
// Properties beyond "never crash": a parsed request never took more bytes
// than it was given, its body stays within the limit, a refusal is a 4xx/5xx
// with a code, every error body the server would render stays short (no
// echo of the input, however large or hostile), and an accepted reservation
// holds a size and a lease inside their domains (no size a ledger's sum
// could wrap on: core/size.h).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/size.h"
#include "http/openai.h"
#include "http/spillway_api.h"
#include "http/transport.h"

namespace {

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "property violated: %s\n", what);
  std::abort();
}

void check_error(const std::optional<spw::http::ApiError>& e) {
  if (!e) return;
  if (e->http_status < 400 || e->http_status > 599) violated("an error with a non-error status");
  if (spw::http::render_error(*e).size() > 2048) violated("an error body over 2 KB");
}

void parse_body(const std::string& path, const std::string& body) {
  using namespace spw::http;
  if (path == "/v1/completions") {
    CompletionRequest r;
    check_error(parse_completion_request(body, r));
  } else if (path == "/v1/chat/completions") {
    ChatRequest r;
    check_error(parse_chat_request(body, r));
  } else if (path.ends_with("/resume")) {
    ResumeBody r;
    check_error(parse_resume_request(body, r));
  } else if (path == "/v1/reservations") {
    ReservationRequest r;
    const std::optional<ApiError> e = parse_reservation_request(body, r);
    check_error(e);
    if (!e && (r.bytes == 0 || r.bytes > spw::kMaxByteSize)) violated("a reservation size outside (0, 1 PiB]");
    if (!e && !(r.ttl_s > 0 && r.ttl_s <= 86400)) violated("a reservation lease outside (0, 86400] s");
    if (!e && (r.name.empty() || r.name.size() > 64)) violated("a reservation name outside 1..64 bytes");
  } else if (path == "/v1/admin/faults") {
    FaultRequest r;
    check_error(parse_fault_request(body, r));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  spw::http::TransportOptions o;
  o.max_header_bytes = 4096;
  o.max_body_bytes = 32768;
  spw::http::ParseError err;
  std::optional<spw::http::ParsedRequest> p = spw::http::parse_request(bytes, o, &err);
  if (p) {
    if (p->consumed > size) violated("consumed more bytes than given");
    if (p->request.body.size() > o.max_body_bytes) violated("a body over the limit");
    parse_body(p->request.path, p->request.body);
  } else if (!err.code.empty()) {
    if (err.status < 400 || err.status > 599) violated("a transport refusal with a non-error status");
    if (err.message.size() > 512) violated("a transport error message over 512 bytes");
  }
  // The same bytes as a body of every route: most inputs never get past the
  // request line, and the JSON parsers deserve the fuzzer's time too.
  const std::string body(bytes);
  for (const char* path :
       {"/v1/completions", "/v1/chat/completions", "/v1/requests/1/resume", "/v1/reservations", "/v1/admin/faults"}) {
    parse_body(path, body);
  }
  return 0;
}
