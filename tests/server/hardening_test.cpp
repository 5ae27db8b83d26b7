// Hardening of the HTTP API (issue #16), each against a real OpenAiServer + HttpServer over raw
// sockets, with a scripted FakeEngine and the tiny-coder tokenizer: huge JSON objects, the
// descriptor limit, prompts tokenized off the io threads, hang-ups after stray bytes, auth before
// the body, fixed metric labels, transfer codings, HEAD / 405 / 503 details.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/time.h>

#include <chrono>
#include <optional>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/server_warmup.h"
#include "server/http_server.h"
#include "server/openai_server.h"
#include "server/server_metrics.h"
#include "server_fixture.h"
#include "util/json_parse.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;
using testing::connect_local;
using testing::FakeEngine;
using testing::http;
using testing::send_all;
using testing::raw_exchange;
using testing::read_all;
using testing::set_recv_timeout;
using testing::wait_until;
using Clock = std::chrono::steady_clock;


Result<std::string> chatml(const nlohmann::ordered_json& messages, const nlohmann::ordered_json&,
                           const nlohmann::ordered_json&) {
  std::string out;
  for (const auto& m : messages)
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m["content"].get<std::string>() + "<|im_end|>\n";
  return out + "<|im_start|>assistant\n";
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class HardeningTest : public testing::ServerFixture {
 protected:
  void start(ServerConfig cfg = {}) { start_server(cfg, chatml); }
  // The engine emits a script of 300 tokens, one per `tick`.
  void long_script(std::chrono::milliseconds tick) {
    engine_.tick = tick;
    std::string words;
    for (int i = 0; i < 300; ++i) words += " x";
    engine_.script = tokenizer_->encode(words, false);
  }
  // A non-streamed completion of up to 200 tokens on a kept-alive connection: its socket, once the
  // engine runs it (-1 if the engine never did).
  int send_keep_alive_completion() {
    int fd = connect_local(port_);
    if (fd < 0) return fd;
    std::string req = testing::build_request("POST", "/v1/completions", R"({"prompt":"go","max_tokens":200})");
    req.replace(req.find("Connection: close"), 17, "Connection: keep-alive");
    send_all(fd, req);
    if (wait_until([&] { return engine_.n_live() == 1; })) return fd;
    ::close(fd);
    return -1;
  }
  // A streamed completion of up to 200 tokens on its own thread, its body into *out; returns once
  // the engine runs it.
  std::thread stream_long_completion(std::string* out) {
    long_script(std::chrono::milliseconds(5));
    std::thread running([this, out] {
      *out = post("/v1/completions", R"({"prompt":"a","max_tokens":200,"stream":true})").body;
    });
    EXPECT_TRUE(wait_until([&] { return engine_.n_live() == 1; }));
    return running;
  }
};

// --- H1: JSON objects with many keys parse in linear time ---

TEST(OrderedJsonParse, KeepsOrderDuplicatesAndErrors) {
  nlohmann::ordered_json j;
  ASSERT_TRUE(parse_ordered_json(R"({"b":1,"a":[1,{"z":2,"y":3}],"c":null,"b":4})", j));
  // Key order is the document's; a repeated key keeps its first place and takes the last value
  // (as ordered_json::parse does).
  EXPECT_EQ(j.dump(), R"({"b":4,"a":[1,{"z":2,"y":3}],"c":null})");
  EXPECT_EQ(j, nlohmann::ordered_json::parse(R"({"b":1,"a":[1,{"z":2,"y":3}],"c":null,"b":4})"));
  // Duplicates in a large object (hash-indexed) behave the same.
  std::string big = "{";
  for (int i = 0; i < 100; ++i) big += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  big += "\"k7\":\"again\"}";
  ASSERT_TRUE(parse_ordered_json(big, j));
  EXPECT_EQ(j.size(), 100u);
  EXPECT_EQ(j["k7"], "again");
  EXPECT_EQ(j.begin().key(), "k0");
  EXPECT_EQ(j, nlohmann::ordered_json::parse(big));
  std::string why;
  EXPECT_FALSE(parse_ordered_json(R"({"a":1,})", j, &why));
  EXPECT_NE(why.find("parse error"), std::string::npos) << why;
  EXPECT_FALSE(parse_ordered_json("[1] 2", j, &why));
  EXPECT_TRUE(parse_ordered_json("\"s\"", j));
  EXPECT_EQ(j, "s");
}

TEST_F(HardeningTest, ObjectWithHundredThousandKeysIsFast) {
  start();
  engine_.script = tokenizer_->encode("ok", false);
  // 100k extra keys in a message and at the top level (both 400: unknown field). ordered_json's
  // own parser takes ~18 s for either.
  std::string keys;
  for (int i = 0; i < 100000; ++i) keys += "\"key" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  const std::string in_message =
      R"({"messages":[{)" + keys + R"("role":"user","content":"hi"}],"max_tokens":2})";
  ASSERT_GT(in_message.size(), 1'000'000u);
  auto t0 = Clock::now();
  auto r = post("/v1/chat/completions", in_message);
  EXPECT_LT(seconds_since(t0), 5.0);  // linear parse ~0.1 s; the quadratic one took 9-18 s
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_NE(r.body.find("messages[0].key0"), std::string::npos) << r.body.substr(0, 300);
  const std::string top = "{" + keys + R"("messages":[{"role":"user","content":"hi"}]})";
  t0 = Clock::now();
  r = post("/v1/chat/completions", top);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  expect_idle();
}

// --- H2: at the descriptor limit the accept loop backs off ---

TEST_F(HardeningTest, AcceptBacksOffAtDescriptorLimit) {
#if defined(__SANITIZE_ADDRESS__)
  // With every descriptor taken, the sanitizers' own checks fail (UBSan's vptr check probes
  // memory through a pipe, reports "invalid vptr" when it cannot open one, and aborts).
  GTEST_SKIP() << "exhausts file descriptors, which the sanitizer runtime needs";
#endif
  start();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Client sockets are made before the limit drops (connect needs no new descriptor); the
  // server can then accept none of them.
  std::vector<int> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(::socket(AF_INET, SOCK_STREAM, 0));
  int max_fd = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    max_fd = std::max(max_fd, std::stoi(e.path().filename().string()));
  ::testing::internal::CaptureStderr();
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(max_fd + 1);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;  // every free number below the limit: the server cannot accept
  for (int f; (f = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(f);
  EXPECT_EQ(errno, EMFILE);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int fd : clients) EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  getrusage(RUSAGE_SELF, &after);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  for (int f : fillers) ::close(f);
  const std::string log = ::testing::internal::GetCapturedStderr();
  auto cpu = [](const rusage& u) {
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  // A spinning accept loop burns a core (~1.5 CPU-s here) and logs every failure.
  EXPECT_LT(cpu(after) - cpu(before), 0.3);
  std::size_t lines = 0;
  for (std::size_t p = 0; (p = log.find("accept failed", p)) != std::string::npos; ++p) ++lines;
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 2u) << log.substr(0, 500);
  // With descriptors back the server accepts again (the waiting clients and new ones).
  send_all(clients[0], testing::build_request("GET", "/health", ""));
  set_recv_timeout(clients[0], 5000);
  EXPECT_EQ(testing::parse_response(read_all(clients[0])).status, 200);
  for (int fd : clients) ::close(fd);
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
}

// --- H3: a huge prompt is tokenized off the io thread ---

TEST_F(HardeningTest, HugePromptDoesNotBlockHealth) {
  ServerConfig cfg;
  cfg.n_http_threads = 1;  // one io thread: any blocking work on it stalls every connection
  start(cfg);
  // One long "word" whose BPE takes over a second: sized by timing the tokenizer (4 MB took 1.5 s
  // on one of our machines and 0.5 s on another), at most 24 MB (bodies over 32 MB get 413).
  std::size_t n = 4u << 20;
  for (;;) {
    auto t0 = Clock::now();
    (void)tokenizer_->encode(std::string(n, 'x'), false);
    if (seconds_since(t0) > 1.3 || n >= (24u << 20)) break;
    n = std::min<std::size_t>(n * 2, 24u << 20);
  }
  const std::string prompt(n, 'x');
  const std::string body = json{{"prompt", prompt}, {"max_tokens", 1}}.dump();
  double big_s = 0;
  std::thread big([&] {
    auto t0 = Clock::now();
    auto r = post("/v1/completions", body);
    big_s = seconds_since(t0);
    EXPECT_EQ(r.status, 400);  // longer than the fake engine's context
    EXPECT_EQ(error_of(r)["code"], "context_length_exceeded");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the request is being tokenized
  double worst = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    EXPECT_EQ(http(port_, "GET", "/health").status, 200);
    worst = std::max(worst, seconds_since(t0));
  }
  big.join();
  // Tokenized on the io thread, /health would wait for most of the big request (> 0.8 s).
  ASSERT_GT(big_s, 1.0) << "the prompt must take a while to tokenize for this test to mean anything";
  EXPECT_LT(worst, 0.5) << "the big request took " << big_s << " s";
}

// --- H4: a hang-up is seen even when bytes follow the request ---

TEST_F(HardeningTest, HangUpAfterStrayBytesCancels) {
  start();
  long_script(std::chrono::milliseconds(10));
  ASSERT_GE(engine_.script.size(), 200u);
  for (const std::string& extra : {std::string("\r\n"), std::string("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")}) {
    const auto cancelled_before = engine_.cancelled().size();
    const int fd = send_keep_alive_completion();  // nothing is written until it ends
    ASSERT_GE(fd, 0);
    // The extra bytes arrive after the request was read (so they sit in the socket, not in the
    // parser's buffer), then the client hangs up.
    send_all(fd, extra);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::close(fd);
    EXPECT_TRUE(wait_until([&] { return engine_.cancelled().size() == cancelled_before + 1; },
                           std::chrono::milliseconds(1000)))
        << "hang-up after " << json(extra).dump() << " not detected";
    expect_idle();
  }
}

TEST_F(HardeningTest, PipelinedRequestStillServedAfterWatch) {
  start();
  engine_.tick = std::chrono::milliseconds(50);
  engine_.script = tokenizer_->encode(" a b c d e f", false);
  int fd = connect_local(port_);
  ASSERT_GE(fd, 0);
  std::string first = testing::build_request("POST", "/v1/completions", R"({"prompt":"go","max_tokens":3})");
  first.replace(first.find("Connection: close"), 17, "Connection: keep-alive");
  // The second request arrives while the first is generating: the peer watch reads it into the
  // connection's buffer, and it is answered after the first.
  send_all(fd, first);
  ASSERT_TRUE(wait_until([&] { return engine_.n_live() == 1; }));
  send_all(fd, testing::build_request("GET", "/health", ""));
  std::string raw = read_all(fd);
  ::close(fd);
  ASSERT_NE(raw.find("HTTP/1.1 200"), std::string::npos) << raw;
  EXPECT_NE(raw.find("HTTP/1.1 200", raw.find("HTTP/1.1 200") + 1), std::string::npos) << raw;
  EXPECT_NE(raw.find("\"text_completion\""), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\n\r\n{}"), std::string::npos) << raw;
}

// "Expect: 100-continue" on a connection that already carried a response (curl sends it for large
// bodies and reuses connections): the interim 100 is written, then the body is read and answered.
// The finished exchange's state once made that interim write end the exchange, which cancelled the
// body read and dropped the request.
TEST_F(HardeningTest, ExpectContinueOnAReusedConnection) {
  start();
  engine_.script = tokenizer_->encode(" a b", false);
  int fd = connect_local(port_);
  ASSERT_GE(fd, 0);
  std::string get = testing::build_request("GET", "/health", "");
  get.replace(get.find("Connection: close"), 17, "Connection: keep-alive");
  send_all(fd, get);
  std::string raw;
  char buf[4096];
  auto read_until = [&](const std::string& what) {
    while (raw.find(what) == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return false;
      raw.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  ASSERT_TRUE(read_until("\r\n\r\n{}")) << raw;
  raw.clear();
  const std::string body = R"({"prompt":"go","max_tokens":2})";
  std::string post = testing::build_request("POST", "/v1/completions", "", {"Expect: 100-continue"});
  post = post.substr(0, post.find("Content-Length: ")) + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  send_all(fd, post);
  ASSERT_TRUE(read_until("HTTP/1.1 100 Continue\r\n\r\n")) << raw;
  send_all(fd, body);
  raw += read_all(fd);
  ::close(fd);
  const std::string answer = raw.substr(raw.find("\r\n\r\n") + 4);
  EXPECT_EQ(testing::parse_response(answer).status, 200) << raw;
  EXPECT_NE(answer.find("\"text_completion\""), std::string::npos) << raw;
}

// --- S2 / S5: authentication ---

TEST_F(HardeningTest, UnauthenticatedBodyIsNeverRead) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  int fd = connect_local(port_);
  ASSERT_GE(fd, 0);
  set_recv_timeout(fd, 3000);
  // Announce 10 MB and send none of it: the answer must come from the head alone.
  send_all(fd,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Content-Length: 10000000\r\n\r\n{\"messages\":");
  auto t0 = Clock::now();
  const std::string raw = read_all(fd);
  ::close(fd);
  EXPECT_LT(seconds_since(t0), 2.0);
  auto r = testing::parse_response(raw);
  EXPECT_EQ(r.status, 401) << raw;
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_EQ(r.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(error_of(r)["type"], "authentication_error");
  // With the key the same head is read normally (here: the body is short, so 400).
  auto ok = post("/v1/chat/completions", R"({"messages":[]})", {"Authorization: Bearer sekret"});
  EXPECT_NE(ok.status, 401);
}

TEST_F(HardeningTest, ApiKeyGuardsEveryRouteButHealthAndMetrics) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  for (const char* path : {"/server_info", "/v1/server_info", "/get_server_info", "/v1/models", "/v1/models/tiny",
                           "/get_model_info", "/get_load", "/v1/responses/x", "/nope",
                           "/v2/anything", "/status.json", "/index.html"}) {
    auto r = http(port_, "GET", path);
    EXPECT_EQ(r.status, 401) << path;
    auto with_key = http(port_, "GET", path, "", {"Authorization: Bearer sekret"});
    EXPECT_NE(with_key.status, 401) << path;
  }
  EXPECT_EQ(http(port_, "GET", "/nope", "", {"Authorization: Bearer sekret"}).status, 404);
  for (const char* path : {"/generate", "/tokenize", "/v1/completions", "/flush_cache", "/abort_request"})
    EXPECT_EQ(post(path, "{}").status, 401) << path;
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
  EXPECT_EQ(http(port_, "GET", "/v1/health").status, 200);
  EXPECT_EQ(http(port_, "GET", "/health_generate").status, 200);  // as SGLang's /health* (a probe sends no key)
  EXPECT_EQ(post("/health_generate", "{}").status, 401);
  EXPECT_EQ(http(port_, "GET", "/metrics").status, 200);
  // The status page's HTML is static and open; its data (/status.json, above) is not.
  EXPECT_EQ(http(port_, "GET", "/").status, 200);
  EXPECT_EQ(http(port_, "HEAD", "/").status, 200);
  EXPECT_EQ(post("/", "{}").status, 401);
}

// --- S3: metric labels come from the route table ---

TEST_F(HardeningTest, MetricRouteLabelsAreFixed) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  http(port_, "GET", "/made-up-path-1");                                                // 401
  http(port_, "GET", "/made%22up\\path", "", {"Authorization: Bearer sekret"});          // 404
  http(port_, "POST", "/v1/models/some-model-name", "", {"Authorization: Bearer sekret"});  // 405
  http(port_, "GET", "/v1/models/other-model", "", {"Authorization: Bearer sekret"});    // 404
  const std::string m = http(port_, "GET", "/metrics").body;
  EXPECT_EQ(m.find("made"), std::string::npos) << m;
  EXPECT_EQ(m.find("some-model-name"), std::string::npos);
  EXPECT_EQ(m.find("other-model"), std::string::npos);
  EXPECT_NE(m.find(R"(route="unknown",code="401")"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(route="unknown",code="404")"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(route="/v1/models",code="405")"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(route="/v1/models",code="404")"), std::string::npos) << m;
  EXPECT_EQ(metric_route_label("/v1/chat/completions"), "/v1/chat/completions");
  EXPECT_EQ(metric_route_label("/x\"}\n"), "unknown");
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST_F(HardeningTest, ModelNameLabelIsEscaped) {
  ServerConfig cfg;
  start(cfg);
  server_->metrics().set_model_name("we\"ird\nname");
  const std::string m = http(port_, "GET", "/metrics").body;
  EXPECT_NE(m.find(R"(model_name="we\"ird\nname")"), std::string::npos) << m.substr(0, 2000);
  EXPECT_EQ(m.find("we\"ird\nname"), std::string::npos);
}

// --- S4: transfer codings ---

TEST_F(HardeningTest, TransferEncodingOtherThanChunkedIsRefused) {
  start();
  engine_.script = tokenizer_->encode("ok", false);
  auto raw_request = [&](const std::string& head_lines, const std::string& body) {
    int fd = connect_local(port_);
    set_recv_timeout(fd, 3000);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head_lines +
                     "\r\n" + body);
    auto t0 = Clock::now();
    std::string raw = read_all(fd);  // the server closes: no keep-alive after a framing error
    ::close(fd);
    EXPECT_LT(seconds_since(t0), 2.5) << head_lines;
    return testing::parse_response(raw);
  };
  const std::string body = R"({"prompt":"hi","max_tokens":2})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  const std::string chunked = std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
  // Exactly "chunked" is served.
  EXPECT_EQ(raw_request("Transfer-Encoding: chunked\r\nConnection: close\r\n", chunked).status, 200);
  auto gz = raw_request("Transfer-Encoding: gzip, chunked\r\n", chunked);
  EXPECT_TRUE(gz.status == 501 || gz.status == 400) << gz.status;
  EXPECT_EQ(gz.headers["connection"], "close");
  auto identity = raw_request("Transfer-Encoding: identity\r\n", body);
  EXPECT_TRUE(identity.status == 501 || identity.status == 400) << identity.status;
  auto both = raw_request("Transfer-Encoding: chunked\r\nContent-Length: " + std::to_string(chunked.size()) + "\r\n",
                          chunked);
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(both.headers["connection"], "close");
  auto twice = raw_request("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked);
  EXPECT_TRUE(twice.status == 501 || twice.status == 400) << twice.status;
  expect_idle();
}

// --- W1 / W2 / W3 ---

TEST_F(HardeningTest, WrongJsonTypesAre400) {
  start();
  engine_.script = tokenizer_->encode("ok", false);
  for (const char* body : {
           R"({"messages":[{"role":"user","content":[{"type":5,"text":"x"}]}]})",
           R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":5,"function":{"name":"f"}}]})",
           R"({"messages":[{"role":"user","content":[{"type":"text","text":5}]}]})",
       }) {
    auto r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    auto e = error_of(r);
    EXPECT_EQ(e["type"], "invalid_request_error") << r.body;
  }
  expect_idle();
}

TEST_F(HardeningTest, ReservedTemplateKwargsAre400) {
  start();
  engine_.script = tokenizer_->encode("ok", false);
  for (const char* name : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "documents"}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"chat_template_kwargs", {{name, true}}}};
    auto r = post("/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 400) << name << ": " << r.body;
    EXPECT_EQ(error_of(r)["param"], "chat_template_kwargs." + std::string(name));
  }
  json ok = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  EXPECT_EQ(post("/v1/chat/completions", ok.dump()).status, 200);
  expect_idle();
}

TEST_F(HardeningTest, TinyTemperatureIsGreedy) {
  start();
  engine_.script = tokenizer_->encode("ok", false);
  ASSERT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1,"temperature":1e-6})").status, 200);
  ASSERT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1,"temperature":0.5})").status, 200);
  auto sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 2u);
  EXPECT_TRUE(sub[0].sampling.greedy());
  EXPECT_EQ(sub[0].sampling.temperature, 0.0f);
  EXPECT_FALSE(sub[1].sampling.greedy());
  SamplingParams p;
  p.temperature = 9e-6f;
  EXPECT_TRUE(p.greedy());
  p.temperature = 1e-5f;
  EXPECT_FALSE(p.greedy());
  // A temperature (or repetition_penalty) past f32's useful range is a 400 naming it: 1e300 became
  // inf as a float, 1/inf = 0, and the request silently decoded greedily.
  for (const char* field : {"temperature", "repetition_penalty"}) {
    auto r = post("/v1/completions", std::string(R"({"prompt":"a","max_tokens":1,")") + field + R"(":1e300})");
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_EQ(error_of(r)["param"], field) << r.body;
  }
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":1,"temperature":1e6})").status, 200);
}

TEST_F(HardeningTest, HeadHasNoBodyAnd405HasAllow) {
  start();
  int fd = connect_local(port_);
  // Two HEADs on one keep-alive connection: if the first carried a body, the second response
  // would not start where the first one's headers end.
  send_all(fd, "HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nHEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string raw = read_all(fd);
  ::close(fd);
  const std::size_t first_end = raw.find("\r\n\r\n");
  ASSERT_NE(first_end, std::string::npos) << raw;
  EXPECT_EQ(raw.compare(first_end + 4, 12, "HTTP/1.1 200"), 0) << raw;
  EXPECT_NE(raw.find("Content-Length: "), std::string::npos);
  EXPECT_EQ(raw.substr(raw.size() - 4), "\r\n\r\n") << raw;
  EXPECT_EQ(raw.find("\"data\""), std::string::npos) << raw;

  auto r = http(port_, "POST", "/health", "{}");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET, HEAD");
  r = http(port_, "GET", "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "POST");
  r = http(port_, "PUT", "/v1/responses/abc");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET, HEAD, DELETE");
}

// Stop 54 (a review of the transport): a chunked body's trailer and a chunk extension were read
// into a buffer without bound (400 MB of trailer grew the server by 400 MB, then got a 200), and
// the trailer's fields were merged into the headers (a trailer "Authorization" overrode the
// header's key). Now both end in a 431 once past the header limit, and trailers are dropped.
TEST_F(HardeningTest, ChunkedTrailersAndExtensionsAreBoundedAndNeverHeaders) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  engine_.script = tokenizer_->encode(" a", false);
  const std::string body = R"({"prompt":"go","max_tokens":1})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  const std::string head =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n"
      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  // A trailer that would override the key: answered as the headers say (200), not 401.
  {
    int fd = connect_local(port_);
    ASSERT_GE(fd, 0);
    send_all(fd, head + size + "\r\n" + body + "\r\n0\r\nAuthorization: Bearer nope\r\n\r\n");
    const std::string raw = read_all(fd);
    ::close(fd);
    EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw.substr(0, 200);
  }
  // 4 MB of trailer lines (the header limit is 64 KiB): a 431, well before the end.
  for (const bool extension : {false, true}) {
    int fd = connect_local(port_);
    ASSERT_GE(fd, 0);
    set_recv_timeout(fd, 10000);
    send_all(fd, head + size + (extension ? ";x=" : "\r\n" + body + "\r\n0\r\n"));
    const std::string line = extension ? std::string(60000, 'a') : "X-T: " + std::string(60000, 'a') + "\r\n";
    bool refused_early = false;
    for (int i = 0; i < 70; ++i) {
      if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) < 0) {
        refused_early = true;
        break;
      }
    }
    ::shutdown(fd, SHUT_WR);  // (ends the server's drain of what it did not read)
    const std::string raw = read_all(fd);
    ::close(fd);
    EXPECT_EQ(raw.rfind("HTTP/1.1 431", 0), 0u) << (extension ? "extension: " : "trailer: ") << raw.substr(0, 200);
    (void)refused_early;
  }
  expect_idle();
}

// Stop 54: a client that pipelined more than the read buffer takes (64 KiB) behind a running
// non-streamed request, then hung up, was not noticed: the request ran to its end.
TEST_F(HardeningTest, HangUpAfterALargePipelinedBodyCancels) {
  start();
  long_script(std::chrono::milliseconds(10));
  const int fd = send_keep_alive_completion();
  ASSERT_GE(fd, 0);
  const std::string big = "{\"prompt\":\"" + std::string(100000, 'a') + "\"}";
  send_all(fd, testing::build_request("POST", "/v1/completions", big));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto cancelled_before = engine_.cancelled().size();
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return engine_.cancelled().size() == cancelled_before + 1; },
                         std::chrono::milliseconds(1500)))
      << "hang-up behind 100 KB of pipelined bytes not detected";
  expect_idle();
}

// Stop 54: HTTP/1.0 clients got chunked framing (which 1.0 does not have: the client could not
// find the body's end on a kept-alive connection) and a "100 Continue"; a HEAD refused with a 401
// carried the error body; a request in absolute form (GET http://host/path) was a 404; and a
// draining server told keep-alive clients to keep the connection.
TEST_F(HardeningTest, Http10StreamsHeadErrorsAbsoluteFormAndDrainingClose) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  engine_.script = tokenizer_->encode(" a b c", false);
  {
    const std::string body = R"({"prompt":"go","max_tokens":3,"stream":true})";
    int fd = connect_local(port_);
    ASSERT_GE(fd, 0);
    send_all(fd, "POST /v1/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer sekret\r\n"
                 "Connection: keep-alive\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
                 "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    const std::string raw = read_all(fd);  // ends: the server closes the connection
    ::close(fd);
    EXPECT_EQ(raw.rfind("HTTP/1.1 200", 0), 0u) << raw.substr(0, 300);
    const std::string headers = raw.substr(0, raw.find("\r\n\r\n"));
    EXPECT_EQ(headers.find("Transfer-Encoding"), std::string::npos) << headers;
    EXPECT_NE(headers.find("Connection: close"), std::string::npos) << headers;
    EXPECT_EQ(raw.find("100 Continue"), std::string::npos) << raw.substr(0, 300);
    const std::string answer = raw.substr(raw.find("\r\n\r\n") + 4);
    EXPECT_EQ(answer.rfind("data: {", 0), 0u) << answer.substr(0, 100);  // no chunk-size line first
    EXPECT_NE(answer.find("data: [DONE]\n\n"), std::string::npos) << answer;
    EXPECT_EQ(answer.find("\r\n0\r\n"), std::string::npos) << answer;
  }
  const std::string head = raw_exchange(port_, "HEAD /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 401", 0), 0u) << head;
  ASSERT_GE(head.size(), 4u);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n") << head;  // the headers only
  const std::string absolute =
      raw_exchange(port_, "GET http://example.test:8000/health?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(absolute.rfind("HTTP/1.1 200", 0), 0u) << absolute;
  server_->set_state(ServeState::Draining);
  // Returns: the server closes after its answer.
  const std::string draining = raw_exchange(port_, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
  EXPECT_EQ(draining.rfind("HTTP/1.1 503", 0), 0u) << draining;
  EXPECT_NE(draining.find("Connection: close"), std::string::npos) << draining;
}

TEST_F(HardeningTest, QueueFull503HasRetryAfter) {
  start();
  engine_.reject_kind = EngineErrorKind::Overloaded;
  auto r = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.status, 503);
  EXPECT_FALSE(r.headers["retry-after"].empty());
  auto s = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  EXPECT_EQ(s.status, 503);
  EXPECT_FALSE(s.headers["retry-after"].empty());
  engine_.reject_kind = EngineErrorKind::None;
  expect_idle();
}

// --- serving states: 503 while the model loads and while draining ---

TEST_F(HardeningTest, LoadingAndDrainingAnswer503) {
  ServerConfig cfg;
  cfg.start_loading = true;
  start(cfg);
  engine_.script = tokenizer_->encode("ok", false);
  auto h = http(port_, "GET", "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(json::parse(h.body)["status"], "loading");
  EXPECT_EQ(h.headers["retry-after"], "1");
  auto c = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(c.status, 503);
  EXPECT_EQ(error_of(c)["code"], "loading");
  EXPECT_EQ(http(port_, "GET", "/metrics").status, 200);
  EXPECT_TRUE(engine_.submitted().empty());

  server_->set_state(ServeState::Ready);
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
  EXPECT_EQ(post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})").status, 200);
  expect_idle();  // (the answered job may let go of the server a moment after its response: CI saw busy() 2 below)

  // Draining: a stream already running finishes; new requests are refused.
  engine_.tick = std::chrono::milliseconds(5);
  engine_.script = tokenizer_->encode(std::string(60, 'z'), false);
  std::string streamed;
  std::thread running([&] {
    streamed = post("/v1/completions", R"({"prompt":"a","max_tokens":40,"stream":true})").body;
  });
  ASSERT_TRUE(wait_until([&] { return engine_.n_live() == 1; }));
  server_->set_state(ServeState::Draining);
  EXPECT_EQ(server_->busy(), 1);
  auto d = http(port_, "GET", "/health");
  EXPECT_EQ(d.status, 503);
  EXPECT_EQ(json::parse(d.body)["status"], "shutting_down");
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"a","max_tokens":2})").status, 503);
  running.join();
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
  EXPECT_EQ(streamed.find("\"abort\""), std::string::npos);
  expect_idle();
  EXPECT_EQ(server_->busy(), 0);
}

TEST_F(HardeningTest, AbortAllEndsStreamsWithAbortAndDone) {
  start();
  std::string streamed;
  std::thread running = stream_long_completion(&streamed);
  EXPECT_TRUE(wait_until([&] { return server_->abort_all() == 1; }));
  running.join();
  EXPECT_NE(streamed.find(R"("finish_reason":"abort")"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
  expect_idle();
}

// stop() with a request still generating: a job's destructor reaches into the server (its job
// count, the registry, its HTTP connection), so stop() aborts what runs and returns only once every
// job is gone. Before, the engine thread later dropped the job after the server was destroyed (a
// use after free; under ASan and load it showed in ThinkingDefaultTest one run in ~30).
TEST_F(HardeningTest, StopEndsLiveRequestsBeforeReturning) {
  start();
  std::string streamed;
  std::thread running = stream_long_completion(&streamed);
  server_->stop();
  EXPECT_EQ(server_->active_jobs(), 0);
  running.join();
  EXPECT_NE(streamed.find(R"("finish_reason":"abort")"), std::string::npos) << streamed;
  EXPECT_TRUE(wait_until([&] { return engine_.n_live() == 0; }));
  server_.reset();  // and the engine lives on (as the fixture's does): nothing refers back
}

// --host takes a host name as uvicorn does (localhost was "Invalid argument" at start, after
// plan and systemd-unit had accepted it); a name that does not resolve is an error naming it.
TEST(HttpServerHost, HostNamesResolveAndUnknownOnesAreErrors) {
  HttpServerConfig cfg;
  cfg.host = "localhost";
  HttpServer server(cfg, [](HttpRequest&&, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "hi"); });
  Status st = server.start();
  ASSERT_TRUE(st.is_ok()) << st.message();
  testing::HttpResult r = testing::http(server.port(), "GET", "/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hi");
  server.stop();
  HttpServerConfig bad;
  bad.host = "no-such-host.invalid";
  HttpServer other(bad, [](HttpRequest&&, std::shared_ptr<HttpExchange>) {});
  Status e = other.start();
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.message().find("invalid --host 'no-such-host.invalid'"), std::string::npos) << e.message();
}

// An IPv6 --host is bracketed in "cannot listen on [::1]:PORT" (launchers parse the address; it
// read "::1:PORT").
TEST(HttpServerHost, CannotListenNamesAnIpv6AddressInBrackets) {
  HttpServerConfig cfg;
  cfg.host = "::1";
  HttpServer first(cfg, [](HttpRequest&&, std::shared_ptr<HttpExchange> ex) { ex->respond(200, "text/plain", "hi"); });
  if (Status st = first.start(); !st.is_ok()) GTEST_SKIP() << "no IPv6 loopback here: " << st.message();
  HttpServerConfig same = cfg;
  same.port = first.port();
  HttpServer second(same, [](HttpRequest&&, std::shared_ptr<HttpExchange>) {});
  Status e = second.start();
  first.stop();
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.message().find("cannot listen on [::1]:" + std::to_string(same.port) + ": "), std::string::npos)
      << e.message();
}

// serve's watchdog (app/server_warmup.h): with --dp-size 2, a replica that has work but makes no
// step is stuck even while the other replica steps on (the summed step counter it watched moved,
// so it never fired); an idle replica is never stuck, and a step resets the clock.
TEST(EngineProgressWatch, AStuckReplicaIsSeenWhileAnotherMakesProgress) {
  using Clock = EngineProgressWatch::Clock;
  const auto t0 = Clock::now();
  const auto timeout = std::chrono::seconds(10);
  EngineProgressWatch watch;
  EngineStats busy, stuck, idle;
  busy.requests_running = 3;
  stuck.requests_waiting = 2;
  stuck.steps_total = 7;
  std::optional<EngineProgressWatch::Stuck> fired;
  int fired_at = -1;
  for (int s = 0; s <= 20 && !fired; ++s) {
    busy.steps_total += 5;
    fired = watch.update({busy, stuck, idle}, t0 + std::chrono::seconds(s), timeout);
    if (fired) fired_at = s;
  }
  ASSERT_TRUE(fired) << "the stuck replica was not seen";
  EXPECT_EQ(fired_at, 11);
  EXPECT_EQ(fired->replica, 1);
  EXPECT_EQ(fired->pending, 2);
  EXPECT_GT(fired->stalled, timeout);

  // A step (or no work) resets the replica's clock; an engine without replicas is watched whole.
  EngineProgressWatch again;
  for (int s = 0; s <= 30; ++s) {
    busy.steps_total += 5;
    if (s % 9 == 0) ++stuck.steps_total;
    EXPECT_FALSE(again.update({busy, stuck, idle}, t0 + std::chrono::seconds(s), timeout)) << s;
  }
  EXPECT_FALSE(again.update({busy, stuck, idle}, t0 + std::chrono::hours(1), std::chrono::seconds(0)));  // 0: off
  FakeEngine engine;
  EXPECT_EQ(engine_progress_snapshot(engine).size(), 1u);
  engine.replicas = {busy, stuck};
  EXPECT_EQ(engine_progress_snapshot(engine).size(), 2u);
}

}  // namespace
}  // namespace deltaserve
