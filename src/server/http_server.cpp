// Beast is used only to parse requests; responses are formatted by hand (status line, headers,
// chunked framing), which keeps the write path a plain byte queue per connection.
#include <sys/socket.h>
#include <cerrno>
#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <mutex>
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
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

struct HttpServer::Impl {
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<std::size_t> n_connections{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool stopped = false;
  HttpServerConfig config;
  HttpHandler handler;
  void accept();
};

// One TCP connection. Lives while an async operation or an exchange refers to it.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, HttpServer::Impl& server)
      : stream_(std::move(socket)), server_(server) {
    server_.n_connections.fetch_add(1);
  }
  ~HttpConnection() { server_.n_connections.fetch_sub(1); }

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
    if (chunked) {
      head += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
    } else {
      head += "Content-Length: " + std::to_string(content_length) + "\r\n";
    }
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    head += "\r\n";
    head += body;
    queue_write(std::move(head));
  }
  void send_chunk(const std::string& data) {
    if (closed_ || data.empty()) return;
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
    if (chunked) queue_write("0\r\n\r\n");
    response_complete_ = true;
    maybe_finish_exchange();
  }

  HttpServer::Impl& server() { return server_; }
  bool is_current(const HttpExchange* exchange) const {
    return !closed_ && !response_complete_ && exchange_.get() == exchange;
  }

 private:
  void do_read_header() {
    if (closed_) return;
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
    if (auto cl = parser_->content_length(); cl && *cl > server_.config.max_body_bytes) {
      return reject(413, "request body of " + std::to_string(*cl) + " bytes exceeds the limit of " +
                             std::to_string(server_.config.max_body_bytes) + " bytes");
    }
    auto expect = req[http::field::expect];
    if (!expect.empty() && beast::iequals(expect, "100-continue")) {
      write_raw_now("HTTP/1.1 100 Continue\r\n\r\n");
    }
    stream_.expires_after(std::chrono::seconds(300));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->on_body(ec);
                     });
  }

  void fail_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      return reject(413, "request body exceeds the limit of " +
                             std::to_string(server_.config.max_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit) return reject(431, "request headers too large");
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || buffer_.size() == 0) {
      return close();
    }
    reject(400, "malformed HTTP request: " + ec.message());
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (ec) return fail_read(ec);
    stream_.expires_never();
    auto req_msg = parser_->release();
    HttpRequest req;
    req.method = std::string(req_msg.method_string());
    req.target = std::string(req_msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& field : req_msg) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      req.headers[name] = std::string(field.value());
    }
    req.body = std::move(req_msg.body());
    keep_alive_ = req_msg.keep_alive();
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
    // that made it so were already consumed (edge-triggered epoll). Peek: 0 bytes means the
    // peer closed; EAGAIN means nothing happened, so watch again.
    char byte;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return close();
    if (n < 0) return watch_peer();
    // The client sent more bytes (a pipelined request); those wait for the next read. We can no
    // longer detect a hang-up by readiness, but a failing write still will.
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
    if (!writing_) do_write();
  }

  void write_raw_now(std::string data) { queue_write(std::move(data)); }

  void do_write() {
    if (closed_ || pending_.empty()) return;
    writing_ = true;
    in_flight_.swap(pending_);
    pending_.clear();
    stream_.expires_after(std::chrono::seconds(300));
    net::async_write(stream_, net::buffer(in_flight_),
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       self->on_write(ec);
                     });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    in_flight_.clear();
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
                              if (ec || self->drained_ > (256u << 20)) return self->close();
                              self->linger_more();
                            });
  }
  void linger_more() {
    stream_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > (256u << 20)) return self->close();
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
  std::shared_ptr<HttpExchange> exchange_;  // the pending exchange (cycle broken when complete)
  std::string pending_, in_flight_;
  std::vector<char> drain_buffer_;
  std::size_t drained_ = 0;
  bool writing_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool head_sent_ = false;
  bool response_complete_ = false;
  bool watching_ = false;
  bool lingering_close_ = false;
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
    c.send_head(status, ct, h, false, length, std::move(b));  // one write: head + body
    c.complete_response(false);
  });
}

void HttpExchange::begin_stream(int status, std::string content_type, HttpHeaders headers) {
  headers.insert(headers.end(), extra_headers_.begin(), extra_headers_.end());
  connection_->post([self = shared_from_this(), status, ct = std::move(content_type),
                     h = std::move(headers)]() {
    HttpConnection& c = *self->connection_;
    if (c.is_current(self.get())) c.send_head(status, ct, h, true, 0);
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
      fn();
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
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      log_warn("http: accept failed: ", ec.message());
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<HttpConnection>(std::move(socket), *this)->start();
    }
    accept();
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
  auto address = net::ip::make_address(config_.host, ec);
  if (ec) return error("invalid --host '", config_.host, "': ", ec.message());
  tcp::endpoint endpoint(address, static_cast<unsigned short>(config_.port));
  impl_->acceptor.emplace(impl_->ioc);
  impl_->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor->bind(endpoint, ec);
  if (!ec) impl_->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return error("cannot listen on ", config_.host, ":", config_.port, ": ", ec.message());
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

std::size_t HttpServer::open_connections() const {
  return impl_ ? impl_->n_connections.load() : 0;
}

}  // namespace deltaserve
