// The transport's request parsing and checks (transport_parse.h), and the
// small types of transport.h: Disconnect, Request, Response, Router. Split
// from transport.cpp, which keeps the server (connections, accept, stop).
#include "http/transport_parse.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

namespace spw::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using wire::Parser;

// ---- Disconnect, Request, Response, Router --------------------------------

void Disconnect::on_gone(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!gone_.load(std::memory_order_acquire)) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void Disconnect::fire() {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_.exchange(true, std::memory_order_acq_rel)) return;
    run.swap(callbacks_);
  }
  for (auto& fn : run) fn();
}

namespace wire {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    const size_t j = path.find('/', i);
    out.emplace_back(path.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) break;
    i = j;
  }
  return out;
}

}  // namespace wire

std::string Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (wire::iequals(k, name)) return v;
  return {};
}

size_t Request::header_count(std::string_view name) const {
  return static_cast<size_t>(
      std::count_if(headers.begin(), headers.end(), [&](const auto& kv) { return wire::iequals(kv.first, name); }));
}

void Response::set_header(std::string name, std::string value) {
  for (auto& kv : headers) {
    if (wire::iequals(kv.first, name)) {
      kv.second = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

void Router::add(std::string method, std::string_view pattern, RouteKind kind, Handler handler, bool light) {
  Route r;
  r.method = std::move(method);
  r.segments = wire::split_path(pattern);
  r.kind = kind;
  r.light = light;
  r.takes_body = r.method == "POST" || r.method == "PUT" || r.method == "PATCH";
  r.handler = std::move(handler);
  routes_.push_back(std::move(r));
}

Router::Match Router::match(std::string_view method, std::string_view path) const {
  Match m;
  const std::vector<std::string> segs = wire::split_path(path);
  // A trailing slash names another resource ("/v1/models/"): not found.
  if (path.empty() || path.front() != '/' || (path.size() > 1 && path.back() == '/')) return m;
  const std::string_view want = method == "HEAD" ? std::string_view("GET") : method;
  for (const Route& r : routes_) {
    if (r.segments.size() != segs.size()) continue;
    std::vector<std::string> params;
    bool ok = true;
    for (size_t i = 0; i < segs.size() && ok; ++i) {
      if (r.segments[i] == "{}") {
        params.push_back(segs[i]);
      } else {
        ok = r.segments[i] == segs[i];
      }
    }
    if (!ok) continue;
    if (m.allow.find(r.method) == std::string::npos) {
      m.allow += (m.allow.empty() ? "" : ", ") + r.method;
      if (r.method == "GET") m.allow += ", HEAD";
    }
    if (m.route == nullptr && r.method == want) {
      m.route = &r;
      m.params = std::move(params);
    }
  }
  return m;
}

bool is_loopback_address(std::string_view addr) {
  return addr.starts_with("127.") || addr == "::1" || addr.starts_with("::ffff:127.");
}

// ---- Parsing and validation (shared by connections and parse_request) -----

namespace wire {

ParseError parse_error(int status, std::string code, std::string message) {
  return ParseError{status, std::move(code), std::move(message)};
}

// The transport's answer to a parser error; `unparsed`: the bytes the parser
// refused, from where it stopped (to tell a malformed line from a version
// we do not serve).
ParseError from_beast(const beast::error_code& ec, const TransportOptions& o, std::string_view unparsed) {
  if (ec == bhttp::error::header_limit) {
    return parse_error(431, "request_header_fields_too_large",
                       "the request line and headers exceed " + std::to_string(o.max_header_bytes) + " bytes");
  }
  if (ec == bhttp::error::body_limit) {
    return parse_error(413, "payload_too_large",
                       "the request body exceeds " + std::to_string(o.max_body_bytes) + " bytes");
  }
  if (ec == bhttp::error::bad_content_length) {
    return parse_error(400, "invalid_content_length", "Content-Length is not one non-negative decimal integer");
  }
  if (ec == bhttp::error::bad_transfer_encoding) {
    return parse_error(400, "invalid_transfer_encoding",
                       "Transfer-Encoding must be chunked (last), once, and not together with Content-Length");
  }
  if (ec == bhttp::error::bad_chunk || ec == bhttp::error::bad_chunk_extension) {
    return parse_error(400, "invalid_chunk", "malformed chunked body");
  }
  if (ec == bhttp::error::bad_version) {
    // Beast reads the line's end as part of the version: "HTTP/1.1" ended
    // by a bare LF is a malformed line, not an unsupported version.
    const std::string_view line = unparsed.substr(0, unparsed.find('\n'));
    if (line.size() < unparsed.size() && (line.ends_with(" HTTP/1.1") || line.ends_with(" HTTP/1.0"))) {
      return parse_error(400, "invalid_request_line", "the request line must end with CR LF, not a bare LF");
    }
    return parse_error(505, "http_version_not_supported", "only HTTP/1.0 and HTTP/1.1 are served");
  }
  return parse_error(400, "invalid_request", "malformed HTTP request (" + ec.message() + ")");
}

void configure(Parser& p, const TransportOptions& o) {
  p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
  // Counted as a chunked body arrives, too: Beast refuses the chunk that
  // crosses it.
  p.body_limit(static_cast<std::uint64_t>(o.max_body_bytes));
  p.eager(true);
}

// Head checks that Beast's parser leaves to the application.
std::optional<ParseError> check_head(const Parser::value_type& msg) {
  const std::string_view target(msg.target().data(), msg.target().size());
  if (target.empty() || target.front() != '/') {
    return parse_error(400, "invalid_target", "the request target must be a path starting with '/'");
  }
  for (char c : target) {
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) {
      return parse_error(400, "invalid_target", "the request target holds a control character");
    }
  }
  for (const auto& f : msg) {
    const std::string_view v(f.value().data(), f.value().size());
    for (char c : v) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f) {
        return parse_error(400, "invalid_header",
                           "header " + std::string(f.name_string()) + " holds a control character");
      }
    }
  }
  const auto ce = msg.find(bhttp::field::content_encoding);
  if (ce != msg.end() && !iequals(std::string_view(ce->value().data(), ce->value().size()), "identity")) {
    return parse_error(415, "unsupported_content_encoding",
                       "Content-Encoding " + std::string(ce->value().substr(0, 40)) +
                           " is not accepted: send the body uncompressed");
  }
  return std::nullopt;
}

bool all_of_chars(std::string_view s, std::string_view set, bool alnum) {
  for (char c : s) {
    const bool ok = (alnum && std::isalnum(static_cast<unsigned char>(c))) || set.find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool is_ipv4_literal(std::string_view h) {
  int parts = 0;
  while (true) {
    const size_t dot = h.find('.');
    const std::string_view part = h.substr(0, dot);
    if (part.empty() || part.size() > 3 || !all_of_chars(part, "0123456789", false)) return false;
    ++parts;
    if (dot == std::string_view::npos) break;
    h.remove_prefix(dot + 1);
  }
  return parts == 4;
}

}  // namespace wire

bool host_allowed(std::string_view host, const std::vector<std::string>& allowed) {
  if (host.empty()) return true;
  if (host.front() == '[') {
    // An IPv6 literal, with an optional port after the bracket.
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    const std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || !wire::all_of_chars(rest.substr(1), "0123456789", false))) return false;
    return wire::all_of_chars(host.substr(1, close - 1), "0123456789abcdefABCDEF:.", false);
  }
  const size_t colon = host.rfind(':');
  if (colon != std::string_view::npos) {
    if (!wire::all_of_chars(host.substr(colon + 1), "0123456789", false)) return false;
    host = host.substr(0, colon);
  }
  std::string name = wire::lower(std::string(host));
  if (!name.empty() && name.back() == '.') name.pop_back();  // "localhost." is localhost
  if (name.empty()) return false;
  if (wire::is_ipv4_literal(name)) return true;
  if (name == "localhost" || name.ends_with(".localhost")) return true;
  for (const std::string& a : allowed) {
    if (a == "*" || a == name) return true;
  }
  return false;
}

Status check_allowed_host(std::string_view name) {
  if (name == "*") return Status::ok_status();
  if (name.empty() || name.size() > 253 || !wire::all_of_chars(name, "-._", true) || name.front() == '.' ||
      name.front() == '-') {
    return Status::invalid_argument("'" + std::string(name.substr(0, 80)) +
                                    "' is not a host name (letters, digits, '-', '.', '_'; no port, no scheme)");
  }
  return Status::ok_status();
}

namespace wire {

// A body's Content-Type must say JSON (or be absent).
std::optional<ParseError> check_content_type(const Request& r) {
  if (r.body.empty() && !r.has_header("Content-Type")) return std::nullopt;
  const std::string ct = lower(r.header("Content-Type"));
  const std::string media = ct.substr(0, ct.find(';'));
  auto trim = [](std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.erase(s.begin());
    return s;
  };
  const std::string m = trim(media);
  if (m.empty() || m == "application/json" || m.ends_with("+json")) return std::nullopt;
  return parse_error(415, "unsupported_media_type",
                     "Content-Type " + m.substr(0, 60) +
                         " is not accepted: send the body as Content-Type: application/json");
}

Request request_from(Parser::value_type&& msg, std::string peer) {
  Request r;
  r.method = std::string(msg.method_string());
  r.target = std::string(msg.target());
  const size_t q = r.target.find('?');
  r.path = r.target.substr(0, q);
  if (q != std::string::npos) r.query = r.target.substr(q + 1);
  r.version = msg.version() == 10 ? 10u : 11u;
  for (const auto& f : msg) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  r.body = std::move(msg.body());
  r.peer = std::move(peer);
  return r;
}

}  // namespace wire

std::optional<ParsedRequest> parse_request(std::string_view bytes, const TransportOptions& options,
                                           ParseError* error) {
  Parser p;
  wire::configure(p, options);
  size_t used = 0;
  bool head_checked = false;
  while (!p.is_done()) {
    beast::error_code ec;
    const size_t n = p.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == bhttp::error::need_more) return std::nullopt;
    if (ec) {
      if (error) *error = wire::from_beast(ec, options, bytes.substr(used));
      return std::nullopt;
    }
    if (p.is_header_done() && !head_checked) {
      head_checked = true;
      if (auto e = wire::check_head(p.get())) {
        if (error) *error = *e;
        return std::nullopt;
      }
    }
    if (n == 0 && !p.is_done()) return std::nullopt;
  }
  ParsedRequest out;
  out.request = wire::request_from(p.release(), "fuzz");
  out.consumed = used;
  if (auto e = wire::check_content_type(out.request); e && !out.request.body.empty()) {
    if (error) *error = *e;
    return std::nullopt;
  }
  return out;
}

}  // namespace spw::http
