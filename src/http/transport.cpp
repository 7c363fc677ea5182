#include "http/transport.h"

#include "http/transport_parse.h"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <thread>
#include <unordered_set>

namespace spw::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

using wire::check_content_type;
using wire::check_head;
using wire::configure;
using wire::from_beast;
using wire::iequals;
using wire::Parser;
using wire::parse_error;
using wire::request_from;

// ---- The server ------------------------------------------------------------

namespace {

std::string status_line(int status) {
  const std::string_view reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.empty() ? "Unknown" : reason) + "\r\n";
}

// Header text as sent: a handler's value never splits the head.
std::string header_line(std::string_view name, std::string_view value) {
  std::string out(name);
  out += ": ";
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 && c != '\t') || u == 0x7f ? ' ' : c;
  }
  out += "\r\n";
  return out;
}

std::string chunk_frame(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out(size);
  out.append(data);
  out += "\r\n";
  return out;
}

// One blocking handoff between a handler's thread and a connection's strand.
class Waiter {
 public:
  void set(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = ok;
    cv_.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return result_.has_value(); });
    return *result_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<bool> result_;
};

}  // namespace

class Connection;

class Transport::Impl {
 public:
  Impl(TransportOptions o, Router r)
      : options_(std::move(o)), router_(std::move(r)), acceptor_(asio::make_strand(ioc_)) {}
  ~Impl() { stop(); }

  Status start();
  void stop();
  int port() const { return port_; }
  TransportStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    TransportStats s = stats_;
    s.open_connections = open_;
    s.workers_running = workers_;
    return s;
  }

  // Runs fn on a thread of its own; stop() joins it. Finished threads are
  // joined by the next spawn, so their number stays that of running ones.
  void spawn(std::function<void()> fn) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_list_.begin(); it != workers_list_.end();) {
      if (it->done->load(std::memory_order_acquire)) {
        it->thread.join();
        it = workers_list_.erase(it);
      } else {
        ++it;
      }
    }
    ++workers_;
    workers_list_.push_back(Worker{std::thread([this, done, fn = std::move(fn)]() mutable {
                                     {
                                       auto run = std::move(fn);  // destroyed (with what it holds) first
                                       run();
                                     }
                                     std::lock_guard<std::mutex> l(mu_);
                                     --workers_;
                                     done->store(true, std::memory_order_release);
                                     cv_.notify_all();
                                   }),
                                   done});
  }

  void count(int64_t TransportStats::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(stats_.*field);
  }
  void released(const std::string& peer);

  const TransportOptions options_;
  const Router router_;

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void accept();
  void on_accept(const beast::error_code& ec, tcp::socket socket);

  // Declared before the io_context: handlers it destroys (holding
  // connections) still find them.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> per_client_;
  std::vector<std::weak_ptr<Connection>> conns_;
  std::vector<Worker> workers_list_;
  TransportStats stats_;
  int64_t open_ = 0;
  int64_t workers_ = 0;
  int port_ = 0;
  bool running_ = false;
  bool stopping_ = false;
  std::mutex start_mu_;
  std::vector<std::thread> threads_;

 public:
  asio::io_context ioc_;

 private:
  tcp::acceptor acceptor_;  // on a strand: accepts and the close in stop() never overlap
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Transport::Impl& t, tcp::socket socket, std::string peer, bool over_limit)
      : t_(t),
        sock_(std::move(socket)),
        read_timer_(sock_.get_executor()),
        write_timer_(sock_.get_executor()),
        buf_(t.options_.max_header_bytes + t.options_.max_pipelined_bytes + 8192),
        peer_(std::move(peer)),
        over_limit_(over_limit) {}

  ~Connection() { t_.released(peer_); }

  void start() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->begin_request(); });
  }

  // From any thread: closes the socket on the strand.
  void close_async() {
    asio::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // From a handler's thread: queues bytes on the strand and waits until they
  // are written. False when the connection is closed.
  bool write_and_wait(std::string bytes) {
    auto w = std::make_shared<Waiter>();
    asio::post(sock_.get_executor(), [self = shared_from_this(), bytes = std::move(bytes), w]() mutable {
      if (self->state_ == State::kClosed) return w->set(false);
      self->write(std::move(bytes), [w](bool ok) { w->set(ok); });
    });
    return w->wait();
  }

  // From a handler's thread: the response (or a stream's head) is ready.
  void respond_async(std::shared_ptr<Response> res, bool head_only) {
    asio::post(sock_.get_executor(),
               [self = shared_from_this(), res, head_only] { self->send_response(*res, head_only); });
  }

 private:
  enum class State { kHead, kBody, kHandling, kClosed };

  const TransportOptions& o() const { return t_.options_; }

  void begin_request() {
    if (state_ == State::kClosed) return;
    state_ = State::kHead;
    parser_.emplace();
    configure(*parser_, o());
    route_ = nullptr;
    params_.clear();
    head_bytes_ = 0;
    if (eof_ && buf_.size() == 0) return close();
    request_started_ = buf_.size() > 0;
    arm_read(request_started_ ? head_timeout() : o().idle_timeout);
    process();
  }

  std::chrono::milliseconds head_timeout() const {
    return over_limit_ ? o().over_limit_header_timeout : o().header_timeout;
  }

  void arm_read(std::chrono::milliseconds d) {
    const uint64_t gen = ++read_gen_;
    read_timer_.expires_after(d);
    read_timer_.async_wait([self = shared_from_this(), gen](const beast::error_code& ec) {
      if (ec || gen != self->read_gen_) return;
      self->on_read_timeout();
    });
  }
  void disarm_read() {
    ++read_gen_;
    read_timer_.cancel();
  }

  void on_read_timeout() {
    if (state_ == State::kClosed || state_ == State::kHandling) return;
    t_.count(&TransportStats::timed_out);
    if (state_ == State::kHead && !request_started_) return close();  // an idle keep-alive connection
    const bool head = state_ == State::kHead;
    const auto secs = (head ? head_timeout() : o().body_timeout).count() / 1000.0;
    char msg[160];
    std::snprintf(msg, sizeof msg, "the request %s did not arrive within %.1f s", head ? "head" : "body", secs);
    send_error(parse_error(408, "request_timeout", msg));
  }

  void fill() {
    if (reading_ || state_ == State::kClosed || eof_) return;
    // While a request is handled, read ahead only so far (pipelined requests
    // wait in the buffer; the client's sending then stalls).
    if (state_ == State::kHandling && buf_.size() >= o().max_pipelined_bytes) return;
    const size_t room = buf_.max_size() - buf_.size();
    if (room == 0) {
      if (state_ == State::kHandling) return;
      return send_error(from_beast(bhttp::error::header_limit, o()));
    }
    reading_ = true;
    // Into a buffer of its own, copied into buf_ when the read completes: a
    // region of buf_ prepared now would be stale by then, because parsing
    // consumes buf_ while the read is pending (a read ahead during a handler,
    // then the next request parsed from what was buffered), and a flat_buffer
    // that is emptied starts again at its beginning: the read's bytes would
    // land past it and the commit would take old bytes (a request parsed
    // twice, then garbage).
    sock_.async_read_some(asio::buffer(rbuf_.data(), std::min<size_t>(room, rbuf_.size())),
                          [self = shared_from_this()](const beast::error_code& ec, size_t n) { self->on_fill(ec, n); });
  }

  void on_fill(const beast::error_code& ec, size_t n) {
    reading_ = false;
    if (state_ == State::kClosed) return;
    if (ec) {
      eof_ = true;
      if (state_ == State::kHandling) {
        // The client went away (or half-closed) while its request ran.
        if (disconnect_ && !disconnect_->gone()) {
          t_.count(&TransportStats::disconnects);
          disconnect_->fire();
        }
        if (ec != asio::error::eof) close();
        return;
      }
      return close();  // mid-request or idle: nobody to answer
    }
    buf_.commit(asio::buffer_copy(buf_.prepare(n), asio::buffer(rbuf_.data(), n)));
    if (state_ == State::kHandling) return fill();
    if (state_ == State::kHead && !request_started_) {
      request_started_ = true;
      arm_read(head_timeout());
    }
    process();
  }

  void process() {
    while ((state_ == State::kHead || state_ == State::kBody) && buf_.size() > 0) {
      beast::error_code ec;
      if (state_ == State::kHead) {
        // Beast counts its header limit per put(), not across the fields it
        // consumed from earlier reads; so the head's length is counted here:
        // what was consumed, plus what is buffered up to its blank line.
        const std::string_view b(static_cast<const char*>(buf_.data().data()), buf_.size());
        size_t here = b.size();
        if (head_bytes_ > 0 && b.starts_with("\r\n")) {
          here = 2;
        } else if (const size_t end = b.find("\r\n\r\n"); end != std::string_view::npos) {
          here = end + 4;
        }
        if (head_bytes_ + here > o().max_header_bytes) {
          return send_error(from_beast(bhttp::error::header_limit, o()));
        }
      }
      const size_t n = parser_->put(buf_.data(), ec);
      buf_.consume(n);
      if (state_ == State::kHead && !parser_->is_header_done()) head_bytes_ += n;
      if (ec == bhttp::error::need_more) break;
      if (ec) {
        return send_error(
            from_beast(ec, o(), std::string_view(static_cast<const char*>(buf_.data().data()), buf_.size())));
      }
      if (state_ == State::kHead && parser_->is_header_done()) {
        state_ = State::kBody;
        if (auto e = on_head()) return send_error(*e);
      }
      if (parser_->is_done()) return dispatch();
      if (n == 0) break;
    }
    if (state_ == State::kHead || state_ == State::kBody) fill();
  }

  std::optional<ParseError> on_head() {
    const Parser::value_type& msg = parser_->get();
    if (auto e = check_head(msg)) return e;
    if (o().check_host) {
      if (auto e = check_host_header(msg)) return e;
    }
    const std::string method(msg.method_string());
    const std::string_view target(msg.target().data(), msg.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    Router::Match m = t_.router_.match(method, path);
    if (m.route == nullptr) {
      if (m.allow.empty()) {
        return parse_error(404, "not_found", "no route for " + method + " " + std::string(path.substr(0, 200)));
      }
      allow_ = m.allow;
      return parse_error(405, "method_not_allowed",
                         method + " is not allowed on " + std::string(path.substr(0, 200)) + " (allowed: " + m.allow + ")");
    }
    if (over_limit_ && !m.route->light) {
      return parse_error(503, "too_many_connections",
                         "this server has too many open connections (from this client or in all); retry later");
    }
    route_ = m.route;
    params_ = std::move(m.params);
    // A client that asked to be told before it sends its body.
    const auto expect = msg.find(bhttp::field::expect);
    if (expect != msg.end() && msg.version() == 11 && !parser_->is_done() &&
        iequals(std::string_view(expect->value().data(), expect->value().size()), "100-continue")) {
      write("HTTP/1.1 100 Continue\r\n\r\n", nullptr);
    }
    if (!parser_->is_done()) arm_read(o().body_timeout);
    return std::nullopt;
  }

  std::optional<ParseError> check_host_header(const Parser::value_type& msg) const {
    auto range = msg.equal_range(bhttp::field::host);
    if (std::distance(range.first, range.second) > 1) {
      return parse_error(400, "invalid_header", "send one Host header, not several");
    }
    if (range.first == range.second) return std::nullopt;
    const std::string_view host(range.first->value().data(), range.first->value().size());
    if (host_allowed(host, o().allowed_hosts)) return std::nullopt;
    return parse_error(403, "host_not_allowed",
                       "Host '" + std::string(host.substr(0, 100)) +
                           "' is not one this server answers to: a server without API keys answers only to IP "
                           "addresses and localhost (a page reaching it under another name could be DNS "
                           "rebinding); start it with --allowed-host NAME, or with API keys");
  }

  void dispatch() {
    disarm_read();
    state_ = State::kHandling;
    request_started_ = false;
    keep_alive_ = parser_->keep_alive() && !over_limit_;
    version_ = parser_->get().version();
    const Router::Route* route = route_;
    auto req = std::make_shared<Request>(request_from(parser_->release(), peer_));
    req->params = std::move(params_);
    head_ = req->method == "HEAD";
    if (route->takes_body) {
      if (auto e = check_content_type(*req)) return send_error(*e);
    }
    disconnect_ = req->disconnect;
    method_ = req->method;
    path_ = req->path.substr(0, 200);
    if (route->kind == RouteKind::kInline) {
      Response res;
      run_handler(*route, *req, res);
      return send_response(res, false);
    }
    fill();  // read ahead: notices a client that goes away
    t_.spawn([self = shared_from_this(), route, req] {
      auto res = std::make_shared<Response>();
      self->run_handler(*route, *req, *res);
      if (!res->stream) return self->respond_async(res, false);
      self->run_stream(res);
    });
  }

  void run_handler(const Router::Route& route, const Request& req, Response& res) {
    try {
      route.handler(req, res);
    } catch (const std::exception& ex) {
      res = Response{};
      res.status = 500;
      res.set_content(o().render_error(500, "internal_error", std::string("internal error: ") + ex.what()),
                      "application/json");
    } catch (...) {
      res = Response{};
      res.status = 500;
      res.set_content(o().render_error(500, "internal_error", "internal error"), "application/json");
    }
  }

  // On the handler's thread: the head, then the provider until it is done.
  void run_stream(const std::shared_ptr<Response>& res) {
    respond_async(res, /*head_only=*/true);
    const bool chunked = version_ == 11;
    class Sink : public StreamSink {
     public:
      Sink(Connection& c, bool chunked) : c_(c), chunked_(chunked) {}
      bool write(std::string_view data) override {
        if (data.empty()) return !failed_;
        if (failed_) return false;
        if (!c_.write_and_wait(chunked_ ? chunk_frame(data) : std::string(data))) failed_ = true;
        return !failed_;
      }
      void done() override { done_ = true; }
      bool is_done() const { return done_; }
      bool failed() const { return failed_; }

     private:
      Connection& c_;
      bool chunked_;
      bool done_ = false;
      bool failed_ = false;
    } sink(*this, chunked);
    bool complete = false;
    if (!head_) {
      for (;;) {
        if (!res->stream(sink)) break;
        if (sink.is_done()) {
          complete = !sink.failed();
          break;
        }
      }
    } else {
      complete = true;
    }
    if (complete && chunked && !head_) complete = write_and_wait("0\r\n\r\n");
    if (res->stream_end) res->stream_end(complete);
    asio::post(sock_.get_executor(), [self = shared_from_this(), complete] {
      if (!complete || !self->keep_alive_) return self->close();
      self->after_response();
    });
  }

  void send_error(const ParseError& e) {
    if (state_ == State::kClosed) return;
    if (e.status < 500 && e.status != 408) t_.count(&TransportStats::client_errors);
    disarm_read();
    Response res;
    res.status = e.status;
    res.set_content(o().render_error(e.status, e.code, e.message), "application/json");
    if (e.status == 405) res.set_header("Allow", allow_);
    if (e.status == 503) res.set_header("Retry-After", "1");
    // The rest of the request (a body not read, a broken stream) cannot be
    // trusted to frame the next one.
    keep_alive_ = false;
    state_ = State::kHandling;
    if (method_.empty() && parser_ && parser_->is_header_done()) method_ = std::string(parser_->get().method_string());
    send_response(res, false);
  }

  // On the strand. head_only: a stream's head (the body follows in chunks,
  // or close-delimited for HTTP/1.0).
  void send_response(const Response& res, bool head_only) {
    if (state_ == State::kClosed) return;
    if (o().log_requests) {
      std::fprintf(stderr, "spillway: %s %s -> %d\n", method_.c_str(), path_.c_str(), res.status);
    }
    std::string out = status_line(res.status);
    for (const auto& [k, v] : res.headers) {
      if (iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding") || iequals(k, "Connection")) continue;
      out += header_line(k, v);
    }
    if (!res.content_type.empty()) out += header_line("Content-Type", res.content_type);
    if (head_only) {
      if (version_ == 11) {
        out += "Transfer-Encoding: chunked\r\n";
      } else {
        keep_alive_ = false;  // HTTP/1.0: the stream ends when the connection does
      }
    } else {
      out += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
    }
    out += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    out += "\r\n";
    if (!head_only && !head_) out += res.body;
    if (head_only) return write(std::move(out), nullptr);
    write(std::move(out), [self = shared_from_this()](bool ok) {
      if (!ok || !self->keep_alive_) return self->close();
      self->after_response();
    });
  }

  void after_response() {
    if (state_ == State::kClosed) return;
    disconnect_.reset();
    method_.clear();
    path_.clear();
    allow_.clear();
    begin_request();
  }

  struct Out {
    std::string bytes;
    std::function<void(bool)> done;
  };

  void write(std::string bytes, std::function<void(bool)> done) {
    if (state_ == State::kClosed) {
      if (done) done(false);
      return;
    }
    out_.push_back(Out{std::move(bytes), std::move(done)});
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    const uint64_t gen = ++write_gen_;
    write_timer_.expires_after(o().write_timeout);
    write_timer_.async_wait([self = shared_from_this(), gen](const beast::error_code& ec) {
      if (ec || gen != self->write_gen_ || !self->writing_) return;
      self->t_.count(&TransportStats::timed_out);
      self->close();  // the client stopped reading
    });
    asio::async_write(sock_, asio::buffer(out_.front().bytes),
                      [self = shared_from_this()](const beast::error_code& ec, size_t) { self->on_write(ec); });
  }

  void on_write(const beast::error_code& ec) {
    writing_ = false;
    ++write_gen_;
    write_timer_.cancel();
    if (out_.empty()) return;
    Out done = std::move(out_.front());
    out_.pop_front();
    if (ec) {
      if (done.done) done.done(false);
      return close();
    }
    if (done.done) done.done(true);  // may queue (and start) the next write itself
    if (!writing_ && !out_.empty() && state_ != State::kClosed) do_write();
  }

  void close() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    disarm_read();
    write_timer_.cancel();
    beast::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
    if (disconnect_ && !disconnect_->gone()) disconnect_->fire();
    // Writes still queued will never go out: their waiters learn it now.
    // (The one in flight completes with operation_aborted.)
    std::deque<Out> pending;
    pending.swap(out_);
    if (writing_ && !pending.empty()) {
      out_.push_back(std::move(pending.front()));
      pending.pop_front();
    }
    for (Out& p : pending)
      if (p.done) p.done(false);
  }

  Transport::Impl& t_;
  tcp::socket sock_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  beast::flat_buffer buf_;
  std::array<char, 16384> rbuf_;  // what the pending read writes into (fill)
  std::optional<Parser> parser_;
  const std::string peer_;
  const bool over_limit_;
  State state_ = State::kHead;
  bool reading_ = false;
  bool writing_ = false;
  bool eof_ = false;
  bool request_started_ = false;
  bool keep_alive_ = true;
  bool head_ = false;
  unsigned version_ = 11;
  size_t head_bytes_ = 0;  // of the current request's head, consumed by the parser so far
  uint64_t read_gen_ = 0;
  uint64_t write_gen_ = 0;
  const Router::Route* route_ = nullptr;
  std::vector<std::string> params_;
  std::shared_ptr<Disconnect> disconnect_;
  std::deque<Out> out_;
  std::string allow_;
  std::string method_;
  std::string path_;
};

Status Transport::Impl::start() {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (running_) return Status::failed_precondition("http server already started");
  beast::error_code ec;
  tcp::resolver resolver(ioc_);
  auto results = resolver.resolve(options_.host, std::to_string(options_.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return Status::unavailable("cannot resolve listen address '" + options_.host + "': " + ec.message());
  }
  const tcp::endpoint ep = results.begin()->endpoint();
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (ec) {
    beast::error_code ignored;
    acceptor_.close(ignored);
    return Status::unavailable("cannot bind " + where + " (" + ec.message() + ": in use, or not a local address)");
  }
  // Bursts of connections queue in the kernel rather than being refused.
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::unavailable("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_.local_endpoint().port();
  guard_.emplace(ioc_.get_executor());
  running_ = true;
  accept();
  const int n = std::max(1, options_.io_threads);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { ioc_.run(); });
  return Status::ok_status();
}

void Transport::Impl::accept() {
  acceptor_.async_accept(asio::make_strand(ioc_), [this](const beast::error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void Transport::Impl::on_accept(const beast::error_code& ec, tcp::socket socket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
  }
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of descriptors (or another transient error): pause instead of
    // spinning on a listen queue that cannot be drained.
    auto timer = std::make_shared<asio::steady_timer>(acceptor_.get_executor(), std::chrono::milliseconds(50));
    timer->async_wait([this, timer](const beast::error_code&) { accept(); });
    return;
  }
  beast::error_code e2;
  const tcp::endpoint remote = socket.remote_endpoint(e2);
  std::string peer = e2 ? std::string("unknown") : remote.address().to_string();
  socket.set_option(tcp::no_delay(true), e2);
  bool over = false;
  bool refuse = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int& mine = per_client_[peer];
    over = open_ >= options_.max_connections || mine >= options_.max_connections_per_client;
    refuse = over && open_ >= static_cast<int64_t>(options_.max_connections) + options_.over_limit_reserve;
    if (refuse) {
      ++stats_.refused;
      if (mine == 0) per_client_.erase(peer);
    } else {
      ++open_;
      ++mine;
      ++stats_.accepted;
      if (over) ++stats_.over_limit;
    }
  }
  if (refuse) {
    socket.close(e2);
  } else {
    auto c = std::make_shared<Connection>(*this, std::move(socket), std::move(peer), over);
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_.erase(std::remove_if(conns_.begin(), conns_.end(), [](const auto& w) { return w.expired(); }),
                   conns_.end());
      conns_.push_back(c);
    }
    c->start();
  }
  accept();
}

void Transport::Impl::released(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  auto it = per_client_.find(peer);
  if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  cv_.notify_all();
}

void Transport::Impl::stop() {
  std::lock_guard<std::mutex> start_lock(start_mu_);
  if (!running_) return;
  std::vector<std::shared_ptr<Connection>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (const auto& w : conns_)
      if (auto c = w.lock()) live.push_back(std::move(c));
    conns_.clear();
  }
  asio::post(acceptor_.get_executor(), [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
  });
  for (const auto& c : live) c->close_async();
  live.clear();
  {
    // Handlers see their clients gone (writes fail, disconnects fire) and
    // return; connections go when their last handler lets go.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return workers_ == 0; });
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return open_ == 0; });
  }
  std::vector<Worker> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished.swap(workers_list_);
  }
  for (Worker& w : finished) w.thread.join();
  guard_.reset();
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  running_ = false;
}

Result<std::unique_ptr<Transport>> Transport::create(TransportOptions options, Router router) {
  if (options.port < 0 || options.port > 65535) {
    return Status::invalid_argument("port must be in [0, 65535], got " + std::to_string(options.port));
  }
  if (!options.render_error) return Status::invalid_argument("TransportOptions::render_error is required");
  if (options.max_connections < 1 || options.max_connections_per_client < 1 || options.over_limit_reserve < 0) {
    return Status::invalid_argument("connection caps must be >= 1 (reserve >= 0)");
  }
  return std::unique_ptr<Transport>(new Transport(std::make_unique<Impl>(std::move(options), std::move(router))));
}

Transport::Transport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Transport::~Transport() = default;
Status Transport::start() { return impl_->start(); }
int Transport::port() const { return impl_->port(); }
void Transport::stop() { impl_->stop(); }
TransportStats Transport::stats() const { return impl_->stats(); }

}  // namespace spw::http
