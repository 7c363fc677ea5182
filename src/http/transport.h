// Transport: Spillway's HTTP/1.1 server (Boost.Beast's parser over Boost.Asio),
// built to keep serving while some of its clients are hostile, slow or gone.
//
// Why not cpp-httplib (which served before): it holds a thread per open
// connection, so a handful of connections trickling their headers starve
// every route, /health included; it has no deadline on a whole request head
// or body; it let a chunked or gzip body past its size limit; it dropped
// pipelined requests and streamed chunked to HTTP/1.0 clients.
// docs/PERFORMANCE.md has the measurements that chose this design.
//
// Model: a few I/O threads (options.io_threads) run every socket
// asynchronously, each connection on its own strand, so an idle or slow
// connection costs a socket and a buffer, never a thread. A route is either
// kInline (cheap, never blocks: health, status, metrics; run on the I/O
// thread, so they answer however many requests are running) or kWorker (may
// block: generation, journal reads; run on a thread of its own while its
// connection keeps reading, so a client that goes away is noticed at once).
//
// Contract, per connection:
//   - Limits: the request line and headers within max_header_bytes (431),
//     the body within max_body_bytes after de-chunking (413; chunked bodies
//     are counted as they arrive); Content-Encoding other than identity is
//     415 (a compressed body would be a decompression bomb), as is a
//     Content-Type that is not JSON on a route that takes a body; header
//     values with control characters, a malformed or conflicting
//     Content-Length / Transfer-Encoding, a target that is not a path: 400.
//     Every error body is rendered by options.render_error and never echoes
//     more than a short excerpt of the input.
//   - Deadlines: an idle keep-alive connection is closed after idle_timeout;
//     once the first byte of a request arrived, its whole head must arrive
//     within header_timeout and its whole body within body_timeout (408 and
//     close); a response write that makes no progress for write_timeout
//     closes the connection (a client that stopped reading).
//   - Connections: at most max_connections open, at most
//     max_connections_per_client from one address. Past either cap a
//     connection is still accepted (up to over_limit_reserve more) for the
//     routes marked `light` (health and status stay answerable while the
//     connections are exhausted, which is when an operator needs them); any
//     other route gets 503 too_many_connections with Retry-After, and the
//     connection is closed after one response. Past the reserve too, it is
//     closed at once. The listen backlog is the system's maximum.
//   - Pipelining: requests on one connection are answered one after
//     another, in order; bytes of the next request are read ahead (up to
//     max_pipelined_bytes) while one is handled.
//   - Disconnects: the end of the stream or an error on a connection whose
//     request is being handled fires Request::disconnect (on_gone), so a
//     non-streaming generation is cancelled as a streaming one is. A client
//     must keep its sending side open until its answer arrives, as HTTP
//     client libraries do (a half-close reads as a disconnect).
//   - HTTP/1.0 clients get Content-Length responses and close-delimited
//     streams (never chunked); "Connection: close" is honoured; HEAD works on
//     every GET route; a known path with another method is 405 with Allow.
// Thread safety: start/stop/port from any thread; handlers run concurrently
// (kInline on the I/O threads, kWorker on their own threads). stop() closes
// every connection (firing their disconnects), waits for running handlers
// to return and joins the I/O threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace spw::http {

// Fired once when a request's client goes away while it is handled.
class Disconnect {
 public:
  bool gone() const { return gone_.load(std::memory_order_acquire); }
  // Runs fn once when the client goes away: at once (on this thread) if it
  // already has, else on an I/O thread. Keep fn short and non-blocking.
  void on_gone(std::function<void()> fn);
  // The transport's side: marks the client gone and runs the callbacks.
  void fire();

 private:
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  std::vector<std::function<void()>> callbacks_;
};

struct Request {
  std::string method;  // "GET", "POST", ... (HEAD is served by GET routes with method "HEAD")
  std::string target;  // as sent: path and query
  std::string path;
  std::string query;   // after '?', empty when none
  unsigned version = 11;  // 10 or 11
  // In arrival order; names as sent (compare case-insensitively).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string peer;  // the client's address
  std::vector<std::string> params;  // the route's {} segments, in order
  std::shared_ptr<Disconnect> disconnect = std::make_shared<Disconnect>();

  // The first value of a header (case-insensitive name), or "".
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const { return header_count(name) > 0; }
  size_t header_count(std::string_view name) const;
};

class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Sends bytes (framed as a chunk, or raw for HTTP/1.0) and waits until
  // they were written. False: the client is gone (or the server stops).
  virtual bool write(std::string_view data) = 0;
  // The stream is complete; the provider is not called again.
  virtual void done() = 0;
};

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;
  std::string body;
  // A streamed body: called again and again on the handler's thread until it
  // returns false (abandoned) or has called sink.done(). status and headers
  // go out before its first call.
  std::function<bool(StreamSink&)> stream;
  // After a stream ends: true when it completed (done() was called).
  std::function<void(bool)> stream_end;

  void set_header(std::string name, std::string value);
  void set_content(std::string body_in, std::string type) {
    body = std::move(body_in);
    content_type = std::move(type);
  }
};

using Handler = std::function<void(const Request&, Response&)>;

enum class RouteKind { kInline, kWorker };

// Routes: a method and a path pattern of '/'-separated segments, where a
// segment "{}" matches one non-empty segment (passed in Request::params).
class Router {
 public:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    RouteKind kind = RouteKind::kWorker;
    bool light = false;  // served past the connection caps too
    bool takes_body = false;
    Handler handler;
  };
  void add(std::string method, std::string_view pattern, RouteKind kind, Handler handler, bool light = false);

  struct Match {
    const Route* route = nullptr;  // null: none for this method
    std::vector<std::string> params;
    std::string allow;  // the path's methods ("GET, HEAD"), when the path exists
  };
  Match match(std::string_view method, std::string_view path) const;

 private:
  std::vector<Route> routes_;
};

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  int io_threads = 2;
  size_t max_header_bytes = size_t{16} << 10;
  size_t max_body_bytes = size_t{16} << 20;
  size_t max_pipelined_bytes = size_t{64} << 10;
  std::chrono::milliseconds idle_timeout{60'000};
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds write_timeout{30'000};
  int max_connections = 512;
  int max_connections_per_client = 64;
  int over_limit_reserve = 64;
  // Header deadline of a connection accepted past a cap.
  std::chrono::milliseconds over_limit_header_timeout{2'000};
  // Renders an error body (the OpenAI error object). Required.
  std::function<std::string(int status, std::string_view code, std::string_view message)> render_error;
  // One line per request on stderr.
  bool log_requests = false;
  // Refuse (403 host_not_allowed, before the body is read) a request whose
  // Host header names neither an IP literal, nor localhost (or a name under
  // .localhost), nor one of `allowed_hosts`. Set on a server without API
  // keys, where a page whose DNS name is re-pointed at 127.0.0.1 (DNS
  // rebinding) could otherwise reach the API from a browser: the browser
  // still sends the page's own name as Host. A request without Host (HTTP/1.0
  // clients; browsers always send one) passes.
  bool check_host = false;
  std::vector<std::string> allowed_hosts;  // lower-case names without port; "*": any
};

// Whether the Host header value `host` passes TransportOptions::check_host
// with `allowed` (see there). Exposed for tests.
bool host_allowed(std::string_view host, const std::vector<std::string>& allowed);
// An --allowed-host entry: a DNS name (letters, digits, '-', '.', '_') or
// "*", without port; InvalidArgument naming the problem otherwise.
Status check_allowed_host(std::string_view name);

struct TransportStats {
  int64_t open_connections = 0;
  int64_t accepted = 0;
  int64_t over_limit = 0;       // accepted past a cap (light routes only)
  int64_t refused = 0;          // closed at once: past the reserve too
  int64_t timed_out = 0;        // idle, head, body or write deadlines
  int64_t client_errors = 0;    // 4xx sent by the transport itself
  int64_t disconnects = 0;      // clients gone while their request was handled
  int64_t workers_running = 0;
};

// What the transport makes of one request's bytes, as a connection would
// (limits and validation included), without a socket: for the fuzzer and
// tests. `consumed` is how many bytes the request took (a pipelined next one
// follows).
struct ParsedRequest {
  Request request;
  size_t consumed = 0;
};
struct ParseError {
  int status = 400;
  std::string code;
  std::string message;
};
// nullopt with `error` unset: more bytes needed.
std::optional<ParsedRequest> parse_request(std::string_view bytes, const TransportOptions& options,
                                           ParseError* error);

class Transport {
 public:
  static Result<std::unique_ptr<Transport>> create(TransportOptions options, Router router);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds (Unavailable naming the address when it cannot) and serves.
  Status start();
  int port() const;
  void stop();
  TransportStats stats() const;

  class Impl;

 private:
  explicit Transport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client's address is this host (127.0.0.0/8, ::1, v4-mapped 127.x).
bool is_loopback_address(std::string_view addr);

}  // namespace spw::http
