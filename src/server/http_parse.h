// The checks HttpServer applies to each request's bytes, as pure functions: the server runs them
// on its async Beast parser, parse_http_request() runs the same sequence on a byte string (the
// fuzz target tests/fuzz/fuzz_http_request.cpp and the unit tests drive it without sockets).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <boost/beast/http.hpp>

#include "server/http_server.h"

namespace deltaserve {

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;

// An error answer the HTTP layer sends itself (the connection is closed after it).
struct HttpRejection {
  int status = 400;
  std::string message;
};

// Framing of a parsed head: only `Transfer-Encoding: chunked` is read; Transfer-Encoding together
// with Content-Length is refused (request smuggling).
std::optional<HttpRejection> check_request_framing(const BeastRequest& head);

// A parse error of the Beast parser as the answer the server gives (413, 431 or 400).
HttpRejection rejection_for_parse_error(boost::beast::error_code ec, std::size_t max_body_bytes);

// Method, target, path (target before '?'), lower-cased header names; no body.
HttpRequest http_request_head(const BeastRequest& msg);

struct HttpParseResult {
  std::optional<HttpRequest> request;        // a complete request
  std::optional<HttpRejection> rejection;    // what the server would answer instead
  bool incomplete = false;                   // more bytes are needed
  bool keep_alive = false;
  std::size_t consumed = 0;                  // bytes of `bytes` used by this request
};

// Parses one request from the start of `bytes` with the server's limits and checks.
HttpParseResult parse_http_request(std::string_view bytes, std::size_t max_header_bytes,
                                   std::size_t max_body_bytes);

}  // namespace deltaserve
