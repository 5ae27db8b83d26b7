// Beast is used only to parse requests; responses are formatted by hand (status line, headers,
// chunked framing), which keeps the write path a plain byte queue per connection.
#include <poll.h>
#include <sys/socket.h>
#include <cerrno>
#include "server/http_server.h"
#include "server/http_parse.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <future>
#include <optional>

#include "util/log.h"

namespace deltaserve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

const char* http_status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 403: return "Forbidden";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

struct HttpServer::Impl {
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<std::size_t> n_connections{0};
  std::atomic<std::size_t> n_pending_writes{0};  // queue_write() calls not yet written or dropped
  std::mutex mutex;
  std::condition_variable cv;
  bool stopped = false;
  bool accept_closed = false;  // stop_accepting() ran (guarded by mutex)
  HttpServerConfig config;
  HttpHandler handler;
  // Accept back-off when the process is out of descriptors (EMFILE/ENFILE): instead of
  // retrying at once (a busy loop: the listening socket stays readable), wait, doubling up to 1 s;
  // one log line per interval counts the failures.
  std::optional<net::steady_timer> accept_timer;
  std::chrono::milliseconds accept_delay{10};
  std::chrono::steady_clock::time_point last_accept_log{};
  std::uint64_t accept_failures_unlogged = 0;
  void accept();
  void on_accept_error(const beast::error_code& ec);
};

// One TCP connection. Lives while an async operation or an exchange refers to it.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // The read buffer holds a request head (and a chunk header or trailer) plus one read ahead: a
  // trailer or chunk extension past that fails the read (buffer_overflow, a 431) instead of
  // growing it without bound (Beast's header_limit covers the head only).
  HttpConnection(tcp::socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)), server_(server), buffer_(server.config.max_header_bytes + (64u << 10)) {
    server_.n_connections.fetch_add(1);
  }
  ~HttpConnection() {
    server_.n_pending_writes.fetch_sub(n_queued_);
    server_.n_connections.fetch_sub(1);
  }

  void start() { do_read_header(); }

  template <typename Fn>
  void post(Fn&& fn) {
    net::post(stream_.get_executor(), std::forward<Fn>(fn));
  }

  // --- called on the strand by HttpExchange ---
  void send_head(int status, const std::string& content_type, const HttpHeaders& headers,
                 bool chunked, std::size_t content_length, std::string body = {}) {
    if (closed_ || head_sent_) return;
    head_sent_ = true;
    std::string head;
    head.reserve(256);
    head += "HTTP/1.1 " + std::to_string(status) + " " + http_status_text(status) + "\r\n";
    head += "Content-Type: " + content_type + "\r\n";
    for (const auto& [k, v] : headers) head += k + ": " + v + "\r\n";
    if (chunked && http10_) {
      // HTTP/1.0 has no chunked coding (RFC 9112 6.1): the body is sent as is and ends when the
      // connection closes.
      keep_alive_ = false;
      head += "Cache-Control: no-cache\r\n";
    } else if (chunked) {
      head += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
    } else {
      head += "Content-Length: " + std::to_string(content_length) + "\r\n";
    }
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    head += "\r\n";
    if (!head_request_) head += body;  // a HEAD response has the headers of a GET, no body
    queue_write(std::move(head));
  }
  void send_chunk(const std::string& data) {
    if (closed_ || data.empty() || head_request_) return;
    if (http10_) return queue_write(data);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string framed;
    framed.reserve(data.size() + 16);
    framed += size;
    framed += data;
    framed += "\r\n";
    queue_write(std::move(framed));
  }
  void complete_response(bool chunked) {
    if (closed_ || response_complete_) return;
    if (chunked && !head_request_ && !http10_) queue_write("0\r\n\r\n");
    response_complete_ = true;
    maybe_finish_exchange();
  }

  HttpServer::Impl& server() { return server_; }
  void set_close_after_response() { keep_alive_ = false; }
  bool is_current(const HttpExchange* exchange) const {
    return !closed_ && !response_complete_ && exchange_.get() == exchange;
  }

 private:
  void do_read_header() {
    if (closed_) return;
    head_request_ = false;  // (until this request's head says otherwise: an error before it has a body)
    http10_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.config.max_header_bytes));
    parser_->body_limit(server_.config.max_body_bytes);
    stream_.expires_after(std::chrono::seconds(server_.config.keep_alive_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              self->on_header(ec);
                            });
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec) return fail_read(ec);
    auto& req = parser_->get();
    head_request_ = req.method() == http::verb::head;
    http10_ = req.version() < 11;
    // The head as it came: trailer fields of a chunked body are not merged into it (RFC 9110
    // 6.5.1; a trailer "Authorization" overrode the header's), and the body is added in on_body.
    head_ = request_head(req);
    keep_alive_ = req.keep_alive();
    // Framing: only "chunked" is a transfer coding we read; with Content-Length as well the
    // length is ambiguous (request smuggling), so both are refused and the connection closed.
    if (auto r = check_request_framing(req)) return reject(r->status, r->message);
    if (server_.config.screen) {
      if (auto early = server_.config.screen(head_)) return send_early(std::move(*early));
    }
    if (auto cl = parser_->content_length(); cl && *cl > server_.config.max_body_bytes) {
      return reject(413, "request body of " + std::to_string(*cl) + " bytes exceeds the limit of " +
                             std::to_string(server_.config.max_body_bytes) + " bytes");
    }
    auto expect = req[http::field::expect];
    if (!expect.empty() && beast::iequals(expect, "100-continue") && !http10_) {  // (ignored from 1.0: RFC 9110 10.1.1)
      write_raw_now("HTTP/1.1 100 Continue\r\n\r\n");
    }
    stream_.expires_after(std::chrono::seconds(300));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->on_body(ec);
                     });
  }

  void fail_read(beast::error_code ec) {
    if (ec != http::error::body_limit && ec != http::error::header_limit &&
        (ec == http::error::end_of_stream || ec == net::error::eof ||
         ec == beast::error::timeout || ec == net::error::operation_aborted ||
         ec == net::error::connection_reset || buffer_.size() == 0)) {
      return close();
    }
    auto r = rejection_for_parse_error(ec, server_.config.max_body_bytes);
    reject(r.status, r.message);
  }

  static HttpRequest request_head(const http::request<http::string_body>& msg) {
    return http_request_head(msg);
  }

  // A screened request: answer, never read the body, close after a short bounded drain (so the
  // client can read the answer instead of a reset).
  void send_early(HttpEarlyResponse r) {
    head_sent_ = false;
    keep_alive_ = false;
    const std::size_t length = r.body.size();
    send_head(r.status, r.content_type, r.headers, false, length, std::move(r.body));
    response_complete_ = true;
    lingering_close_ = true;
    linger_limit_ = 64u << 10;
    maybe_finish_exchange();
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (ec) return fail_read(ec);
    stream_.expires_never();
    auto req_msg = parser_->release();
    HttpRequest req = std::move(head_);
    req.body = std::move(req_msg.body());
    head_sent_ = false;
    response_complete_ = false;
    exchange_ = std::make_shared<HttpExchange>(shared_from_this());
    watch_peer();
    auto exchange = exchange_;
    try {
      server_.handler(std::move(req), exchange);
    } catch (const std::exception& e) {
      log_warn("http: handler threw: ", e.what());
      if (!head_sent_) {
        send_error_now(500, std::string("internal error: ") + e.what());
      }
    }
  }

  // While a response is pending, wait for the socket to become readable: readable with nothing
  // to read means the peer closed (or reset) the connection.
  void watch_peer() {
    if (closed_ || watching_) return;
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read,
                                [self = shared_from_this()](beast::error_code ec) {
                                  self->watching_ = false;
                                  self->on_peer_readable(ec);
                                });
  }

  void on_peer_readable(beast::error_code ec) {
    if (closed_ || !exchange_) return;
    if (ec == net::error::operation_aborted) return;
    if (ec) return close();
    // Readiness alone proves nothing: the reactor can report a socket readable when the bytes
    // that made it so were already consumed (edge-triggered epoll). Read: 0 bytes means the peer
    // closed; EAGAIN means nothing (more) happened, so watch again.
    // Bytes after the request (a stray CRLF, a pipelined request) are read into the buffer the
    // next request is parsed from, so the watch goes on and still sees a later hang-up. Past the
    // header limit the client is pipelining more than one request head's worth: stop reading
    // (a failing write still detects a hang-up).
    const int fd = stream_.socket().native_handle();
    for (;;) {
      if (buffer_.size() >= server_.config.max_header_bytes) return watch_hangup_by_polling();
      auto space = buffer_.prepare(4096);
      const ssize_t n = ::recv(fd, space.data(), space.size(), MSG_DONTWAIT);
      if (n == 0) return close();
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return close();
      }
      buffer_.commit(static_cast<std::size_t>(n));
    }
    watch_peer();
  }

  // The buffer is full (the client pipelined more than a request head's worth): the socket stays
  // readable, so its readiness tells nothing more. Poll for the peer's FIN or reset instead, every
  // 200 ms while the exchange lasts (a non-streamed reply writes nothing until it ends, so no write
  // would notice the hang-up). One loop at a time: re-arming the timer cancels the earlier wait.
  void watch_hangup_by_polling() {
    if (!hangup_timer_) hangup_timer_.emplace(stream_.get_executor());
    hangup_timer_->expires_after(std::chrono::milliseconds(200));
    hangup_timer_->async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || !self->exchange_) return;
      pollfd p{self->stream_.socket().native_handle(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) return self->close();
      self->watch_hangup_by_polling();
    });
  }

  void reject(int status, const std::string& message) {
    keep_alive_ = false;
    send_error_now(status, message);
  }

  void send_error_now(int status, const std::string& message) {
    head_sent_ = false;
    keep_alive_ = false;
    std::string body = server_.config.error_body ? server_.config.error_body(status, message)
                                                 : message + "\n";
    std::size_t length = body.size();
    send_head(status, server_.config.error_body ? "application/json" : "text/plain", {}, false,
              length, std::move(body));
    response_complete_ = true;
    lingering_close_ = true;
    maybe_finish_exchange();
  }

  void queue_write(std::string data) {
    pending_ += data;
    ++n_queued_;
    server_.n_pending_writes.fetch_add(1);
    if (!writing_) do_write();
  }
  // The writes counted in n_pending_writes that are done (written or dropped with the socket).
  void writes_done(std::size_t n) {
    if (n == 0) return;
    n_queued_ -= n;
    server_.n_pending_writes.fetch_sub(n);
  }

  void write_raw_now(std::string data) { queue_write(std::move(data)); }

  void do_write() {
    if (closed_ || pending_.empty()) return;
    writing_ = true;
    in_flight_.swap(pending_);
    pending_.clear();
    n_in_flight_ = n_queued_;
    stream_.expires_after(std::chrono::seconds(300));
    net::async_write(stream_, net::buffer(in_flight_),
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->on_write(ec);
                     });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    in_flight_.clear();
    writes_done(n_in_flight_);
    n_in_flight_ = 0;
    if (closed_) return;
    if (ec) return close();
    if (!pending_.empty()) return do_write();
    maybe_finish_exchange();
  }

  // After the last byte of a complete response is written: next request, or close.
  void maybe_finish_exchange() {
    if (closed_ || !response_complete_ || writing_ || !pending_.empty()) return;
    if (exchange_) exchange_.reset();
    if (lingering_close_) return linger();
    if (!keep_alive_) return close();
    beast::error_code ec;
    stream_.socket().cancel(ec);  // stops the peer watch
    // No response is complete until the next request has one: an interim "100 Continue" written
    // for it must not end its exchange (that cancelled the body's read and dropped the request).
    response_complete_ = false;
    do_read_header();
  }

  // Error responses sent before the body was read: half-close and drain what the client is
  // still sending, so it reads our response instead of a reset.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));
    drain_buffer_.resize(64 * 1024);
    stream_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > self->linger_limit_) return self->close();
                              self->linger_more();
                            });
  }
  void linger_more() {
    stream_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > self->linger_limit_) return self->close();
                              self->linger_more();
                            });
  }

 public:
  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    if (auto exchange = std::move(exchange_)) exchange->notify_disconnect();
  }

 private:
  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest head_;  // the current request's head, from on_header
  std::optional<net::steady_timer> hangup_timer_;
  std::shared_ptr<HttpExchange> exchange_;  // the pending exchange (cycle broken when complete)
  std::string pending_, in_flight_;
  std::vector<char> drain_buffer_;
  std::size_t drained_ = 0;
  std::size_t n_queued_ = 0;     // this connection's share of n_pending_writes
  std::size_t n_in_flight_ = 0;  // of which the async_write in progress carries this many
  std::size_t linger_limit_ = 256u << 20;  // bytes drained before a lingering close gives up
  bool writing_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool head_sent_ = false;
  bool response_complete_ = false;
  bool watching_ = false;
  bool lingering_close_ = false;
  bool head_request_ = false;  // the current request is HEAD: responses carry no body
  bool http10_ = false;        // the current request is HTTP/1.0: no chunked coding, no 100 Continue
};

// --- HttpExchange ---
// Each operation is posted to the strand and dropped there unless this exchange is still the
// connection's current one, so a late write can never leak into the next keep-alive response.

HttpExchange::HttpExchange(std::shared_ptr<HttpConnection> connection)
    : connection_(std::move(connection)) {}
HttpExchange::~HttpExchange() = default;

void HttpExchange::respond(int status, std::string content_type, std::string body,
                           HttpHeaders headers) {
  headers.insert(headers.end(), extra_headers_.begin(), extra_headers_.end());
  connection_->post([self = shared_from_this(), status, ct = std::move(content_type),
                     b = std::move(body), h = std::move(headers)]() mutable {
    HttpConnection& c = *self->connection_;
    if (!c.is_current(self.get())) return;
    std::size_t length = b.size();  // before the move below (argument order is unspecified)
    if (self->close_after_) c.set_close_after_response();
    c.send_head(status, ct, h, false, length, std::move(b));  // one write: head + body
    c.complete_response(false);
  });
}

void HttpExchange::begin_stream(int status, std::string content_type, HttpHeaders headers) {
  headers.insert(headers.end(), extra_headers_.begin(), extra_headers_.end());
  connection_->post([self = shared_from_this(), status, ct = std::move(content_type),
                     h = std::move(headers)]() {
    HttpConnection& c = *self->connection_;
    if (!c.is_current(self.get())) return;
    if (self->close_after_) c.set_close_after_response();
    c.send_head(status, ct, h, true, 0);
  });
}

void HttpExchange::write(std::string data) {
  connection_->post([self = shared_from_this(), d = std::move(data)]() {
    HttpConnection& c = *self->connection_;
    if (c.is_current(self.get())) c.send_chunk(d);
  });
}

void HttpExchange::end_stream() {
  connection_->post([self = shared_from_this()]() {
    HttpConnection& c = *self->connection_;
    if (c.is_current(self.get())) c.complete_response(true);
  });
}

void HttpExchange::post(std::function<void()> fn) { connection_->post(std::move(fn)); }

void HttpExchange::on_disconnect(std::function<void()> fn) {
  connection_->post([self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->disconnect_fired_) {
      if (fn) fn();
      return;
    }
    self->on_disconnect_ = std::move(fn);
  });
}

void HttpExchange::notify_disconnect() {
  disconnected_.store(true);
  if (disconnect_fired_) return;
  disconnect_fired_ = true;
  if (auto fn = std::move(on_disconnect_)) fn();
}

// --- HttpServer ---

void HttpServer::Impl::accept() {
  if (!acceptor || !acceptor->is_open()) return;
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      return on_accept_error(ec);
    }
    accept_delay = std::chrono::milliseconds(10);
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<HttpConnection>(std::move(socket), *this)->start();
    accept();
  });
}

void HttpServer::Impl::on_accept_error(const beast::error_code& ec) {
  const bool out_of_resources = ec.value() == EMFILE || ec.value() == ENFILE ||
                                ec.value() == ENOBUFS || ec.value() == ENOMEM;
  const auto now = std::chrono::steady_clock::now();
  ++accept_failures_unlogged;
  if (now - last_accept_log >= std::chrono::seconds(10)) {
    log_warn("http: accept failed: ", ec.message(), " (", accept_failures_unlogged,
             accept_failures_unlogged == 1 ? " failure" : " failures", " since the last message)",
             out_of_resources ? "; pausing accepts until descriptors free up" : "");
    last_accept_log = now;
    accept_failures_unlogged = 0;
  }
  if (!out_of_resources) return accept();  // e.g. a connection reset before it was accepted
  if (!accept_timer) accept_timer.emplace(ioc);
  accept_timer->expires_after(accept_delay);
  accept_delay = std::min<std::chrono::milliseconds>(accept_delay * 2, std::chrono::seconds(1));
  accept_timer->async_wait([this](beast::error_code wait_ec) {
    if (!wait_ec) accept();
  });
}

HttpServer::HttpServer(HttpServerConfig config, HttpHandler handler)
    : config_(std::move(config)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  // Many concurrent streams need many descriptors: raise the soft limit to the hard one.
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  impl_ = std::make_unique<Impl>();
  impl_->config = config_;
  impl_->handler = handler_;
  beast::error_code ec;
  // An IP address, or a host name (e.g. localhost) bound at its first IPv4 address (else its
  // first address): localhost is 127.0.0.1 to clients, not ::1.
  tcp::endpoint endpoint;
  if (auto address = net::ip::make_address(config_.host, ec); !ec) {
    endpoint = tcp::endpoint(address, static_cast<unsigned short>(config_.port));
  } else {
    tcp::resolver resolver(impl_->ioc);
    auto found = resolver.resolve(config_.host, std::to_string(config_.port), tcp::resolver::passive, ec);
    if (ec || found.empty())
      return error("invalid --host '", config_.host, "': not an IP address, and the name does not resolve (",
                   ec ? ec.message() : std::string("no address"), ")");
    endpoint = found.begin()->endpoint();
    for (const auto& f : found)
      if (f.endpoint().address().is_v4()) {
        endpoint = f.endpoint();
        break;
      }
  }
  impl_->acceptor.emplace(impl_->ioc);
  impl_->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor->bind(endpoint, ec);
  if (!ec) impl_->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    // An IPv6 address in brackets ("[::1]:8000"), as in a URL: "::1:8000" reads as another address.
    const bool v6 = config_.host.find(':') != std::string::npos && config_.host.front() != '[';
    return error("cannot listen on ", v6 ? "[" + config_.host + "]" : config_.host, ":", config_.port, ": ", ec.message());
  }
  bound_port_ = impl_->acceptor->local_endpoint().port();
  impl_->accept();
  int n = std::max(1, config_.n_threads);
  for (int i = 0; i < n; ++i) {
    impl_->threads.emplace_back([this] {
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {
          log_warn("http: io thread caught: ", e.what());
        }
      }
    });
  }
  return Status::ok();
}

void HttpServer::stop_accepting() {
  if (!impl_) return;
  {
    // Once is enough. A second call (OpenAiServer::stop after cmd_serve's graceful shutdown) found
    // the io threads gone (without the acceptor or a connection, run() had nothing left to do):
    // its post never ran, and it waited the full 5 s below before every stop.
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->accept_closed) return;
    impl_->accept_closed = true;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto closed = done->get_future();
  net::post(impl_->ioc, [this, done] {
    beast::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
    if (impl_->accept_timer) impl_->accept_timer->cancel();
    done->set_value();
  });
  // The io threads run until stop(); if they were stopped already nothing is listening anyway.
  closed.wait_for(std::chrono::seconds(5));
}

void HttpServer::stop() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
    if (impl_->accept_timer) impl_->accept_timer->cancel();
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
  impl_->cv.notify_all();
}

void HttpServer::wait() {
  if (!impl_) return;
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->cv.wait(lock, [&] { return impl_->stopped; });
}

std::size_t HttpServer::pending_writes() const {
  return impl_ ? impl_->n_pending_writes.load() : 0;
}

std::size_t HttpServer::open_connections() const {
  return impl_ ? impl_->n_connections.load() : 0;
}

}  // namespace deltaserve
