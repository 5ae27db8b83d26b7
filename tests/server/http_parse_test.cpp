// parse_http_request (server/http_parse.h): the checks HttpServer applies, on a byte string.
#include <gtest/gtest.h>

#include <string>

#include "server/http_parse.h"

namespace deltaserve {
namespace {

TEST(HttpParse, ParsesRequestWithBodyAndLowerCasesHeaders) {
  const std::string raw =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: h\r\nX-Api-KEY: k\r\nContent-Length: 5\r\n\r\nhello";
  auto r = parse_http_request(raw, 8192, 1024);
  ASSERT_TRUE(r.request);
  EXPECT_EQ(r.request->method, "POST");
  EXPECT_EQ(r.request->target, "/v1/completions?x=1");
  EXPECT_EQ(r.request->path, "/v1/completions");
  EXPECT_EQ(r.request->header("x-api-key"), "k");
  EXPECT_EQ(r.request->body, "hello");
  EXPECT_EQ(r.consumed, raw.size());
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpParse, PipelinedRequestsParseOneAfterAnother) {
  const std::string raw = "GET /health HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n";
  auto a = parse_http_request(raw, 8192, 1024);
  ASSERT_TRUE(a.request);
  EXPECT_EQ(a.request->path, "/health");
  auto b = parse_http_request(std::string_view(raw).substr(a.consumed), 8192, 1024);
  ASSERT_TRUE(b.request);
  EXPECT_EQ(b.request->path, "/metrics");
  EXPECT_FALSE(b.keep_alive);
}

TEST(HttpParse, ChunkedBodyIsDecoded) {
  auto r = parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                              8192, 1024);
  ASSERT_TRUE(r.request);
  EXPECT_EQ(r.request->body, "abcde");
}

TEST(HttpParse, RejectionsMatchTheServer) {
  auto both = parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
                                 8192, 1024);
  ASSERT_TRUE(both.rejection);
  EXPECT_EQ(both.rejection->status, 400);
  auto gzip = parse_http_request("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 8192, 1024);
  ASSERT_TRUE(gzip.rejection);
  EXPECT_EQ(gzip.rejection->status, 501);
  auto big = parse_http_request("POST / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", 8192, 1024);
  ASSERT_TRUE(big.rejection);
  EXPECT_EQ(big.rejection->status, 413);
  auto big_chunked = parse_http_request(
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + std::string(2048, 'a') + "\r\n0\r\n\r\n",
      8192, 1024);
  ASSERT_TRUE(big_chunked.rejection);
  EXPECT_EQ(big_chunked.rejection->status, 413);
  auto headers = parse_http_request("GET / HTTP/1.1\r\nX: " + std::string(10000, 'a') + "\r\n\r\n", 8192, 1024);
  ASSERT_TRUE(headers.rejection);
  EXPECT_EQ(headers.rejection->status, 431);
  auto garbage = parse_http_request("GARBAGE\r\n\r\n", 8192, 1024);
  ASSERT_TRUE(garbage.rejection);
  EXPECT_EQ(garbage.rejection->status, 400);
  auto negative = parse_http_request("POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 8192, 1024);
  ASSERT_TRUE(negative.rejection);
  EXPECT_EQ(negative.rejection->status, 400);
}

TEST(HttpParse, IncompleteInputNeedsMore) {
  for (std::string raw : {"", "GET / HTT", "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"}) {
    auto r = parse_http_request(raw, 8192, 1024);
    EXPECT_FALSE(r.request) << raw;
    EXPECT_FALSE(r.rejection) << raw;
    EXPECT_TRUE(r.incomplete) << raw;
  }
}

}  // namespace
}  // namespace deltaserve
