// HttpServer: HTTP/1.1 over Boost.Asio/Beast with keep-alive, fixed or chunked (SSE) responses and
// disconnect detection. It knows nothing about LLMs: a Handler gets each parsed request plus an
// HttpExchange through which it answers, now or later, from any thread.
//
// Threads: `n_threads` io threads run one io_context. Each connection has a strand, so everything
// about one connection (reads, writes, the handler call, posted work) runs serialized; no thread
// ever blocks waiting for tokens. While a response is pending the connection watches its socket,
// and a peer that hangs up fires the exchange's disconnect callback once.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path plus query, as sent
  std::string path;                            // target without the query
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

class HttpConnection;

// One request/response exchange. Every method is thread-safe (it posts to the connection's strand)
// and a no-op after the peer is gone. Answer with exactly one respond() or one begin_stream() ...
// end_stream() sequence.
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  explicit HttpExchange(std::shared_ptr<HttpConnection> connection);
  ~HttpExchange();
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  void respond(int status, std::string content_type, std::string body, HttpHeaders headers = {});
  // A header every response of this exchange carries (e.g. CORS). Call from the handler, before
  // answering.
  void add_header(std::string name, std::string value) { extra_headers_.emplace_back(std::move(name), std::move(value)); }
  // The connection closes after this response (Connection: close), as while the server drains.
  // Call before respond / begin_stream.
  void close_after_response() { close_after_ = true; }
  // Sends the status line and headers with Transfer-Encoding: chunked; write() sends one chunk.
  void begin_stream(int status, std::string content_type, HttpHeaders headers = {});
  void write(std::string data);
  void end_stream();

  // Runs `fn` on the connection's strand (serialized with its I/O). Runs even after disconnect.
  void post(std::function<void()> fn);
  // `fn` runs once, on the strand, if the peer closes before the response is complete. Set it
  // before the work that must be cancelled starts; if the peer is already gone, it runs at once
  // (posted). nullptr removes the hook (and whatever it holds).
  void on_disconnect(std::function<void()> fn);
  bool disconnected() const { return disconnected_.load(); }

 private:
  friend class HttpConnection;
  void notify_disconnect();  // on strand

  std::shared_ptr<HttpConnection> connection_;
  std::atomic<bool> disconnected_{false};
  std::function<void()> on_disconnect_;  // touched only on the strand
  bool disconnect_fired_ = false;
  HttpHeaders extra_headers_;
  bool close_after_ = false;  // set before respond / begin_stream post their work
};

using HttpHandler = std::function<void(HttpRequest&&, std::shared_ptr<HttpExchange>)>;

// A response the server sends instead of reading a request's body (e.g. 401): the connection
// is closed after it.
struct HttpEarlyResponse {
  int status = 400;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
};

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 0;                                // 0 = any free port (see HttpServer::port())
  int n_threads = 2;
  std::size_t max_body_bytes = 32u << 20;      // larger bodies get 413
  std::size_t max_header_bytes = 64u << 10;
  int keep_alive_timeout_s = 120;              // idle connection lifetime between requests
  // Body for errors the HTTP layer answers itself (413, 431, 400 for broken HTTP); JSON if set.
  std::function<std::string(int status, const std::string& message)> error_body;
  // Called with each request's head (method, target, path, headers; no body) before the body is
  // read: a response it returns is sent at once, the body is never read and the connection is
  // closed (authentication: an unauthenticated client cannot make the server read its body).
  std::function<std::optional<HttpEarlyResponse>(const HttpRequest& head)> screen;
};

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the io threads. Returns an error if the address cannot be bound.
  Status start();
  int port() const { return bound_port_; }
  // Stops accepting, closes connections and joins the io threads. Safe to call twice.
  void stop();
  // Closes the listening socket (new connections are refused); open connections keep being
  // served. For a graceful shutdown: stop_accepting(), let requests finish, then stop().
  void stop_accepting();
  // Blocks until stop() is called from another thread (or a signal handler thread).
  void wait();
  std::size_t open_connections() const;
  // Response bytes queued on connections or being written (a graceful stop waits for 0).
  std::size_t pending_writes() const;

  struct Impl;

 private:
  HttpServerConfig config_;
  HttpHandler handler_;
  std::unique_ptr<Impl> impl_;
  int bound_port_ = 0;
};

const char* http_status_text(int status);

}  // namespace deltaserve
