// The bench client against a fake local OpenAI server (chunked SSE), percentiles, SVG, and
// attaching results to the launch the server reports.
#include "deploy/bench.h"
#include "deploy/bench_multiturn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace deltaserve {
namespace {

// Minimal HTTP server: one thread per connection, Connection: close.
class FakeServer {
 public:
  // with_ids: each step's event carries its token ids, and every third one has no text (held back,
  // as a server holds an incomplete UTF-8 sequence); the last two steps come in one event.
  explicit FakeServer(int64_t launch_id, bool with_ids = false) : launch_id_(launch_id), with_ids_(with_ids) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_thread_ = std::thread([this] { loop(); });
  }
  ~FakeServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accept_thread_.join();
    for (auto& t : conns_) t.join();
  }
  int port() const { return port_; }
  std::atomic<int> completions{0};
  std::atomic<int> flushes{0};
  // Options for the review tests (stop 56), set before the first request:
  bool tokenize = false;          // answer /tokenize: two ids per word
  bool spec_counters = false;     // server_info carries counters: 1000 earlier steps with none accepted,
                                  // then each completion one step with two accepted (its accept length 3)
  bool null_usage = false;        // usage.completion_tokens is null
  std::mutex mu;
  std::vector<nlohmann::json> prompts;  // every /v1/completions prompt, in arrival order

 private:
  void loop() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      conns_.emplace_back([this, c] { handle(c); });
    }
  }
  static void send_all(int c, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(c, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }
  static std::string chunk(const std::string& s) {
    char head[32];
    std::snprintf(head, sizeof head, "%zx\r\n", s.size());
    return head + s + "\r\n";
  }
  void handle(int c) {
    std::string req;
    char buf[4096];
    size_t he;
    while ((he = req.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) { ::close(c); return; }
      req.append(buf, static_cast<size_t>(n));
    }
    size_t cl = 0;
    if (auto p = req.find("Content-Length: "); p != std::string::npos) cl = std::stoul(req.substr(p + 16));
    while (req.size() < he + 4 + cl) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    auto reply = [&](const std::string& body) {
      send_all(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    };
    if (req.rfind("GET /v1/models", 0) == 0) {
      reply(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
    } else if (req.rfind("POST /flush_cache", 0) == 0) {
      ++flushes;
      reply("{}");
    } else if (req.rfind("POST /tokenize", 0) == 0 && tokenize) {
      auto body = nlohmann::json::parse(req.substr(he + 4));
      nlohmann::json tokens = nlohmann::json::array();
      for (const auto& text : body["prompt"]) {
        nlohmann::json ids = nlohmann::json::array();
        std::istringstream words(text.get<std::string>());
        for (std::string w; words >> w;) ids.push_back(ids.size()), ids.push_back(ids.size());
        tokens.push_back(ids);
      }
      reply(nlohmann::json{{"tokens", tokens}}.dump());
    } else if (req.rfind("GET /v1/server_info", 0) == 0 && spec_counters) {
      const int done = completions.load();
      reply(nlohmann::json{{"launch_id", launch_id_}, {"accept_length", 1.0 + 2.0 * done / (1000 + done)},
                           {"spec_verify_steps_total", 1000 + done}, {"spec_accepted_tokens_total", 2 * done}}
                .dump());
    } else if (req.rfind("GET /v1/server_info", 0) == 0) {
      reply(R"({"launch_id":)" + std::to_string(launch_id_) +
            (started_at.empty() ? std::string() : R"(,"launch_started_at":")" + started_at + R"(","launch_db":")" + launch_db + R"(")") +
            R"(,"internal_states":[{"avg_spec_accept_length":2.75}]})");
    } else if (req.rfind("POST /v1/completions", 0) == 0) {
      auto body = nlohmann::json::parse(req.substr(he + 4));
      const int n = body["max_tokens"].get<int>();
      {
        std::lock_guard<std::mutex> lock(mu);
        prompts.push_back(body["prompt"]);
      }
      send_all(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                  "Connection: close\r\n\r\n");
      for (int i = 0; i < n; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::string ev = R"(data: {"choices":[{"index":0,"text":"tok"}]})" "\n\n";
        if (with_ids_) {
          if (i == n - 2) continue;  // sent with the last one
          const char* text = i % 3 == 1 ? "" : "tok";
          const std::string ids = i == n - 1 && n >= 2 ? "[5,6]" : "[5]";
          ev = std::string(R"(data: {"choices":[{"index":0,"text":")") + text + R"(","token_ids":)" + ids + "}]}\n\n";
        }
        // Split one event across two HTTP chunks to exercise the SSE reassembly.
        send_all(c, chunk(ev.substr(0, 10)) + chunk(ev.substr(10)));
      }
      send_all(c, chunk(R"(data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":)" +
                        (null_usage ? std::string("null") : std::to_string(n)) + "}}\n\n") +
                      chunk("data: [DONE]\n\n") + "0\r\n\r\n");
      ++completions;  // (after the answer: server_info's counters then include it)
    } else {
      send_all(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
    ::close(c);
  }
  int fd_ = -1;
  int port_ = 0;
  int64_t launch_id_;

 public:
  std::string started_at;  // reported as launch_started_at when set (before the first request)
  std::string launch_db = "/srv/ds/launches.sqlite";  // reported with it

 private:
  bool with_ids_ = false;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::vector<std::thread> conns_;
};

// Found by review (stop 56): every level (and every rerun) sent the same prompts, served from the
// prefix cache the level before filled; --input-len counted words (1.24 tokens each on tiny-coder);
// the accept column was the server's average since it started; a null count in the usage chunk
// threw on a worker thread (terminate).
TEST(Bench, LevelsAreFreshPromptsOfExactTokensWithTheirOwnAcceptLength) {
  FakeServer server(1);
  server.tokenize = true;
  server.spec_counters = true;
  server.null_usage = true;
  BenchOptions opts;
  opts.url = *parse_local_http_url("http://127.0.0.1:" + std::to_string(server.port()));
  opts.concurrency = {1, 2};
  opts.num_prompts = 3;
  opts.input_len = 5;
  opts.output_len = 4;
  auto rep = run_bench(opts, /*verbose=*/false);
  ASSERT_TRUE(rep) << rep.status().message();
  EXPECT_EQ(server.flushes.load(), 2);
  ASSERT_EQ(server.prompts.size(), 7u);  // the warm-up, then 3 a level
  std::vector<std::string> seen;
  for (const auto& p : server.prompts) {
    ASSERT_TRUE(p.is_array()) << p.dump();  // token ids
    EXPECT_EQ(p.size(), 5u) << p.dump();
    seen.push_back(p.dump());
  }
  // Each prompt is its own (the fake's ids number the words: compare the texts bench tokenized).
  ASSERT_EQ(rep->levels.size(), 2u);
  for (const auto& L : rep->levels) {
    EXPECT_EQ(L.n_failed, 0) << L.first_error;
    EXPECT_EQ(L.output_tokens, 3 * 4);  // usage's null count: the streamed tokens
    EXPECT_DOUBLE_EQ(L.accept_length, 3.0);  // the level's own: two accepted a step
  }
  auto a = make_bench_prompts(opts, 3, 0), b = make_bench_prompts(opts, 3, 1), a2 = make_bench_prompts(opts, 3, 0);
  ASSERT_TRUE(a && b && a2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*a)[i].text, (*a2)[i].text);  // seeded
    for (int j = 0; j < 3; ++j) EXPECT_NE((*a)[i].text, (*b)[j].text);
  }
  // Without /tokenize (another server) the prompts stay words; --no-flush-cache sends no flush.
  FakeServer plain(1);
  opts.url = *parse_local_http_url("http://127.0.0.1:" + std::to_string(plain.port()));
  opts.flush_cache = false;
  opts.warmup_requests = 0;
  auto rep2 = run_bench(opts, /*verbose=*/false);
  ASSERT_TRUE(rep2) << rep2.status().message();
  EXPECT_EQ(plain.flushes.load(), 0);
  ASSERT_EQ(plain.prompts.size(), 6u);
  EXPECT_TRUE(plain.prompts[0].is_string());
}

TEST(Bench, Percentiles) {
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 100), 4);
}

TEST(Bench, UrlsAreLocalOnly) {
  EXPECT_TRUE(parse_local_http_url("http://127.0.0.1:30000"));
  auto v1 = parse_local_http_url("http://localhost:8000/v1");
  ASSERT_TRUE(v1);
  EXPECT_EQ(v1->host, "127.0.0.1");
  EXPECT_EQ(v1->base_path, "");
  EXPECT_FALSE(parse_local_http_url("https://127.0.0.1:30000"));
  EXPECT_FALSE(parse_local_http_url("http://example.com:30000"));
  EXPECT_FALSE(parse_local_http_url("http://127.0.0.1:99999"));
}

TEST(Bench, AgainstAFakeServerAttachesToItsLaunch) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto db = LaunchDb::open(dir);
  ASSERT_TRUE(db) << db.status().message();
  LaunchRecord r;
  r.model.path = "fake";
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id);

  FakeServer server(*id);
  BenchOptions opts;
  auto url = parse_local_http_url("http://127.0.0.1:" + std::to_string(server.port()));
  ASSERT_TRUE(url);
  opts.url = *url;
  opts.concurrency = {1, 4};
  opts.num_prompts = 8;
  opts.input_len = 16;
  opts.output_len = 6;
  auto rep = run_bench(opts, /*verbose=*/false);
  ASSERT_TRUE(rep) << rep.status().message();
  EXPECT_EQ(server.completions.load(), 17);  // a warm-up request, then 8 a level
  EXPECT_EQ(server.flushes.load(), 2);       // the prefix cache before each level
  EXPECT_EQ(rep->model, "fake-model");
  EXPECT_EQ(rep->launch_id, *id);
  ASSERT_EQ(rep->levels.size(), 2u);
  for (const auto& L : rep->levels) {
    EXPECT_EQ(L.n_requests, 8);
    EXPECT_EQ(L.n_failed, 0) << L.first_error;
    EXPECT_EQ(L.output_tokens, 8 * 6);
    EXPECT_EQ(L.input_tokens, 8 * 7);
    EXPECT_GT(L.output_tokens_per_s, 0);
    EXPECT_GT(L.ttft_p50, 0);
    EXPECT_GE(L.itl_p50, 1.0);  // the server sleeps 2 ms between tokens
    EXPECT_GE(L.e2e_p50, L.ttft_p50);
    EXPECT_DOUBLE_EQ(L.accept_length, 2.75);
  }
  const std::string svg = bench_svg(*rep);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  auto j = nlohmann::json::parse(bench_json(*rep));
  EXPECT_EQ(j["levels"].size(), 2u);
  EXPECT_EQ(j["launch_id"], *id);
  EXPECT_NE(bench_table(*rep).find("out tok/s"), std::string::npos);

  auto got = (*db)->get(*id);
  ASSERT_TRUE(got);
  EXPECT_TRUE(check_bench_launch(*rep, *got, (*db)->path().string()));  // no start time reported: the id
  for (const auto& m : bench_measurements(*rep)) ASSERT_TRUE((*db)->add_measurement(m));
  got = (*db)->get(*id);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->n_measurements, 2);
  EXPECT_GT(got->best_output_tokens_per_s, 0);
  std::filesystem::remove_all(dir);
}

// The server's launch id names a launch in the server's database: bench attaches to the local
// record only when its start time is the one the server reports (an id repeats across databases:
// another user's state dir, another host).
TEST(Bench, AttachesOnlyToTheServersOwnLaunch) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds-bench-own-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto db = LaunchDb::open(dir);
  ASSERT_TRUE(db) << db.status().message();
  LaunchRecord r;
  r.model.path = "fake";
  r.started_at = "2026-12-05T10:00:00Z";
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id);
  // The server's own database and time; another time; (stop 54) the same id and time in another
  // database, as two servers started in the same second with their own --state-dir report.
  for (const int round : {0, 1, 2}) {
    const std::string reported = round == 1 ? "2026-11-01T08:00:00Z" : "2026-12-05T10:00:00Z";
    FakeServer server(*id);
    server.started_at = reported;
    if (round < 2) server.launch_db = (*db)->path().string();
    BenchOptions opts;
    opts.url = *parse_local_http_url("http://127.0.0.1:" + std::to_string(server.port()));
    opts.concurrency = {1};
    opts.num_prompts = 1;
    opts.input_len = 4;
    opts.output_len = 2;
    auto rep = run_bench(opts, /*verbose=*/false);
    ASSERT_TRUE(rep) << rep.status().message();
    EXPECT_EQ(rep->launch_started_at, reported);
    auto rec = (*db)->get(*id);
    ASSERT_TRUE(rec);
    Status s = check_bench_launch(*rep, *rec, (*db)->path().string());
    if (round == 0) {
      EXPECT_TRUE(s) << s.message();
    } else {
      ASSERT_FALSE(s);
      EXPECT_NE(s.message().find(round == 1 ? "another database" : "not in"), std::string::npos) << s.message();
      if (round == 2) {
        EXPECT_NE(s.message().find("/srv/ds/launches.sqlite"), std::string::npos) << s.message();
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// Gaps are per token: a chunk without text still counts (its token ids), and a chunk of two tokens
// counts two gaps of half its own.
TEST(Bench, InterTokenGapsCountTokenIdsNotTextChunks) {
  FakeServer server(1, /*with_ids=*/true);
  BenchOptions opts;
  auto url = parse_local_http_url("http://127.0.0.1:" + std::to_string(server.port()));
  ASSERT_TRUE(url);
  opts.url = *url;
  BenchPrompt p{"hello", 9, {}};
  const RequestResult r = run_completion(opts, "fake-model", p);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.streamed_tokens, 9);
  EXPECT_EQ(r.output_tokens, 9);  // the usage agrees
  ASSERT_EQ(r.itl_ms.size(), 8u);  // every token after the first
  EXPECT_DOUBLE_EQ(r.itl_ms[6], r.itl_ms[7]);  // the last event's two tokens share its gap
  // The server sleeps 2 ms a step; a loaded machine may read two events at once (a gap near 0), so
  // the check is that the gaps are real, not which one is.
  EXPECT_GE(*std::max_element(r.itl_ms.begin(), r.itl_ms.end()), 1.0);
  EXPECT_EQ(r.text, "toktoktoktoktoktok");  // steps 0, 2, 3, 5, 6 and 8 (7 came with 8) carry text
}

TEST(Bench, PoissonArrivalsAreSeededAndAtTheRate) {
  EXPECT_EQ(bench_arrivals(4, 0, 1), std::vector<double>(4, 0.0));
  const auto a = bench_arrivals(4000, 50.0, 7);
  EXPECT_EQ(a, bench_arrivals(4000, 50.0, 7));
  EXPECT_NE(a, bench_arrivals(4000, 50.0, 8));
  EXPECT_EQ(a[0], 0.0);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_GE(a[i], a[i - 1]);
  // 3999 exponential gaps of mean 20 ms: their mean within 5% (about 3 standard errors).
  EXPECT_NEAR(a.back() / 3999.0, 0.020, 0.001);
}

TEST(Bench, DatasetsAndErrors) {
  const auto dir = std::filesystem::temp_directory_path() / ("ds-bench-ds-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"def f(x):\", \"output_len\": 32}\n\n{\"prompt\": \"hi\"}\n";
  auto ds = load_bench_dataset((dir / "p.jsonl").string(), 64);
  ASSERT_TRUE(ds) << ds.status().message();
  ASSERT_EQ(ds->size(), 2u);
  EXPECT_EQ((*ds)[0].max_tokens, 32);
  EXPECT_EQ((*ds)[1].max_tokens, 64);
  std::ofstream(dir / "sharegpt.json")
      << R"([{"conversations":[{"from":"human","value":"Hello?"},{"from":"gpt","value":"Hi"}]}])";
  auto sg = load_bench_dataset((dir / "sharegpt.json").string(), 16);
  ASSERT_TRUE(sg);
  EXPECT_EQ((*sg)[0].text, "Hello?");
  std::ofstream(dir / "bad.jsonl") << "{\"prompt\": 1\nnot json\n";
  EXPECT_FALSE(load_bench_dataset((dir / "bad.jsonl").string(), 16));
  // Stop 54: a turn's value or role of another type threw out of the command (type_error.302).
  for (const char* turn : {R"({"from":"human","value":5})", R"({"from":1,"value":"x"})"}) {
    std::ofstream(dir / "types.jsonl") << R"({"conversations":[)" << turn << "]}\n";
    auto t = load_bench_dataset((dir / "types.jsonl").string(), 16);
    ASSERT_FALSE(t) << turn;
    EXPECT_NE(t.status().message().find("must be strings"), std::string::npos) << t.status().message();
  }
  std::ofstream(dir / "mt.jsonl") << R"({"system":5,"turns":["hi"]})" << "\n";
  MultiTurnOptions mt;
  mt.dataset = (dir / "mt.jsonl").string();
  auto conv = make_conversations(BenchOptions{}, mt);
  ASSERT_FALSE(conv);
  EXPECT_NE(conv.status().message().find("\"system\" must be a string"), std::string::npos) << conv.status().message();
  EXPECT_FALSE(load_bench_dataset((dir / "missing.jsonl").string(), 16));
  std::filesystem::remove_all(dir);

  // Nobody listening: a clear error, not a crash.
  BenchOptions opts;
  opts.url = *parse_local_http_url("http://127.0.0.1:1");
  auto rep = run_bench(opts, false);
  ASSERT_FALSE(rep);
  EXPECT_NE(rep.status().message().find("cannot connect"), std::string::npos) << rep.status().message();
}

}  // namespace
}  // namespace deltaserve
