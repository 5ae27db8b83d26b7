// A small blocking HTTP/1.1 client for local servers (127.0.0.1 / localhost only): one request per
// connection, chunked or Content-Length bodies, with the body streamed to a callback (SSE).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct HttpUrl {
  std::string host;       // "127.0.0.1"
  int port = 80;
  std::string base_path;  // "" or "/prefix" (no trailing slash)
  std::string to_string() const;
};

// http://127.0.0.1:30000[/prefix]; refuses other schemes and non-local hosts.
Result<HttpUrl> parse_local_http_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;  // empty when a body callback consumed it
};

// Called with each piece of the (de-chunked) body as it arrives; return false to stop reading.
using BodyCallback = std::function<bool(std::string_view)>;

// `path` is appended to url.base_path. timeout_s bounds each socket read/write.
Result<HttpResponse> http_request(const HttpUrl& url, const std::string& method, const std::string& path,
                                  const std::string& body = "", const BodyCallback& on_body = nullptr,
                                  double timeout_s = 600);

// Splits a text/event-stream into events: feed() body pieces, get each `data:` payload.
class SseParser {
 public:
  explicit SseParser(std::function<void(const std::string& data)> on_data) : on_data_(std::move(on_data)) {}
  void feed(std::string_view piece);
  void finish();

 private:
  void line(const std::string& l);
  std::function<void(const std::string&)> on_data_;
  std::string buf_, data_;
  bool has_data_ = false;
};

}  // namespace deltaserve
