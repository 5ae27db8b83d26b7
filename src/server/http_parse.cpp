#include "server/http_parse.h"

#include <algorithm>
#include <cctype>

namespace deltaserve {

namespace beast = boost::beast;
namespace http = boost::beast::http;

std::optional<HttpRejection> check_request_framing(const BeastRequest& req) {
  const std::size_t n_te = req.count(http::field::transfer_encoding);
  if (n_te == 0) return std::nullopt;
  if (req.count(http::field::content_length) > 0) {
    return HttpRejection{400, "both Transfer-Encoding and Content-Length are set"};
  }
  std::string te(req[http::field::transfer_encoding]);
  while (!te.empty() && (te.back() == ' ' || te.back() == '\t')) te.pop_back();
  std::size_t i = 0;
  while (i < te.size() && (te[i] == ' ' || te[i] == '\t')) ++i;
  te.erase(0, i);
  if (n_te != 1 || !beast::iequals(te, "chunked")) {
    return HttpRejection{501, "Transfer-Encoding '" + te + "' is not supported (only 'chunked')"};
  }
  return std::nullopt;
}

HttpRejection rejection_for_parse_error(beast::error_code ec, std::size_t max_body_bytes) {
  if (ec == http::error::body_limit) {
    return {413, "request body exceeds the limit of " + std::to_string(max_body_bytes) + " bytes"};
  }
  if (ec == http::error::header_limit) return {431, "request headers too large"};
  if (ec == http::error::buffer_overflow)  // a chunk header or trailer past the read buffer
    return {431, "request headers, chunk header or trailer too large"};
  return {400, "malformed HTTP request: " + ec.message()};
}

HttpRequest http_request_head(const BeastRequest& msg) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  // The absolute form (GET http://host/health, which a server must accept: RFC 9112 3.2.2) is
  // routed by its path, as the origin form.
  if (const auto scheme = req.target.find("://"); scheme != std::string::npos && req.target.front() != '/') {
    const auto slash = req.target.find_first_of("/?", scheme + 3);
    req.target = slash == std::string::npos ? "/" : req.target[slash] == '?' ? "/" + req.target.substr(slash)
                                                                             : req.target.substr(slash);
  }
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& field : msg) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    req.headers[name] = std::string(field.value());
  }
  return req;
}

HttpParseResult parse_http_request(std::string_view bytes, std::size_t max_header_bytes,
                                   std::size_t max_body_bytes) {
  HttpParseResult out;
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(max_header_bytes, UINT32_MAX)));
  parser.body_limit(max_body_bytes);
  beast::error_code ec;
  // Feeds the parser as a connection would: everything not yet consumed, until it stops.
  auto feed = [&](auto done) {
    while (!done()) {
      const std::size_t n = parser.put(boost::asio::buffer(bytes.data() + out.consumed,
                                                           bytes.size() - out.consumed), ec);
      out.consumed += n;
      if (ec == http::error::need_more || (!ec && n == 0)) {
        ec = {};
        out.incomplete = true;
        return false;
      }
      if (ec) {
        out.rejection = rejection_for_parse_error(ec, max_body_bytes);
        return false;
      }
    }
    return true;
  };
  if (!feed([&] { return parser.is_header_done(); })) return out;
  if (auto r = check_request_framing(parser.get())) {
    out.rejection = std::move(r);
    return out;
  }
  if (auto cl = parser.content_length(); cl && *cl > max_body_bytes) {
    out.rejection = HttpRejection{413, "request body of " + std::to_string(*cl) +
                                           " bytes exceeds the limit of " +
                                           std::to_string(max_body_bytes) + " bytes"};
    return out;
  }
  if (!feed([&] { return parser.is_done(); })) return out;
  auto msg = parser.release();
  out.keep_alive = msg.keep_alive();
  out.request = http_request_head(msg);
  out.request->body = std::move(msg.body());
  return out;
}

}  // namespace deltaserve
