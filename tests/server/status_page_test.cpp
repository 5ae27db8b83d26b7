// The status page over raw sockets against the FakeEngine: GET / is the HTML page (its element ids,
// headers, methods), /status.json has the plan and live figures and they equal /metrics on an idle
// server, the launch history comes from ServerConfig::launch_history, and the API-key split (the
// page loads without the key, its data does not).
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "server/openai_server.h"
#include "server_fixture.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;
using testing::FakeEngine;
using testing::http;
using testing::wait_until;


Result<std::string> plain_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json&,
                               const nlohmann::ordered_json&) {
  std::string out;
  for (const auto& m : messages) out += m["content"].get<std::string>() + "\n";
  return out;
}

// Unlabelled samples of a Prometheus text body: name -> value.
std::map<std::string, double> scrape(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

class StatusPageTest : public testing::ServerFixture {
 protected:
  void start(ServerConfig cfg = {}) {
    start_server(cfg, plain_chat, [](OpenAiServer& server) {
      nlohmann::ordered_json info = {{"max_total_num_tokens", 4096}, {"max_running_requests", 8},
                                     {"max_mamba_cache_size", 12},   {"checkpoint_slots", 4},
                                     {"kv_cache_dtype", "f32"},      {"page_size", 16},
                                     {"prefix_cache", true},         {"device", "cpu"},
                                     {"version", "9.9.9"},
                                     {"memory", {{"weights_bytes", 1000}, {"kv_cache_bytes", 2000}, {"state_cache_bytes", 300}}}};
      server.set_server_info(42, 3, info);
    });
  }
};

TEST_F(StatusPageTest, PageIsHtmlWithItsElements) {
  start();
  auto r = http(port_, "GET", "/");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_EQ(r.headers["cache-control"], "no-store");
  EXPECT_NE(r.headers["content-security-policy"].find("default-src 'none'"), std::string::npos);
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_EQ(r.body.rfind("<!doctype html>", 0), 0u);
  for (const char* id : {"plan-kv-tokens", "plan-kv-dtype", "plan-max-running", "plan-state-slots", "plan-context",
                         "running", "waiting", "kv-used", "kv-total", "slots-used", "slots-total", "gen-tokens",
                         "gen-tps", "accept-length", "launches-plot", "launches-body", "chat-form", "chat-input",
                         "chat-log", "chat-status", "api-key"}) {
    EXPECT_NE(r.body.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  }
  // It reads its data from /status.json and chats through /v1/chat/completions (relative URLs).
  EXPECT_NE(r.body.find("fetch('status.json'"), std::string::npos);
  EXPECT_NE(r.body.find("fetch('v1/chat/completions'"), std::string::npos);
  EXPECT_NE(r.body.find("</html>"), std::string::npos);

  // HEAD: the GET's headers, no body. Other methods: 405 with Allow.
  auto head = http(port_, "HEAD", "/");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_TRUE(head.body.empty());
  auto post = http(port_, "POST", "/", "{}");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers["allow"], "GET, HEAD");
  EXPECT_EQ(http(port_, "DELETE", "/status.json").status, 405);
  // /index.html and friends are not routes.
  EXPECT_EQ(http(port_, "GET", "/index.html").status, 404);

  // Both routes are labelled by the route table.
  auto m = http(port_, "GET", "/metrics");
  EXPECT_NE(m.body.find("deltaserve_http_requests_total{route=\"/\",code=\"200\"} 2"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("deltaserve_http_requests_total{route=\"/\",code=\"405\"} 1"), std::string::npos);
  EXPECT_NE(m.body.find("deltaserve_http_requests_total{route=\"/status.json\",code=\"405\"} 1"), std::string::npos);
  EXPECT_NE(m.body.find("route=\"unknown\",code=\"404\""), std::string::npos);
}

TEST_F(StatusPageTest, StatusJsonHasThePlanAndEqualsMetricsWhenIdle) {
  start();
  // Some traffic first, so the counters are not all zero.
  engine_.script = tokenizer_->encode("Hello there friend", false);
  auto c = http(port_, "POST", "/v1/completions", R"({"prompt": "abc", "max_tokens": 3})");
  ASSERT_EQ(c.status, 200) << c.body;
  ASSERT_TRUE(wait_until([&] { return engine_.n_live() == 0 && server_->active_jobs() == 0; }));

  auto r = http(port_, "GET", "/status.json");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  const json s = json::parse(r.body);
  EXPECT_EQ(s["model"], "tiny");
  EXPECT_EQ(s["launch_id"], 42);
  EXPECT_EQ(s["version"], "9.9.9");
  EXPECT_GE(s["uptime_seconds"].get<double>(), 0.0);
  const json& plan = s["plan"];
  EXPECT_EQ(plan["kv_tokens"], 4096);
  EXPECT_EQ(plan["kv_cache_dtype"], "f32");
  EXPECT_EQ(plan["max_running_requests"], 8);
  EXPECT_EQ(plan["checkpoint_slots"], 4);
  EXPECT_EQ(plan["context_length"], engine_.context);
  EXPECT_EQ(plan["page_size"], 16);
  EXPECT_EQ(plan["device"], "cpu");
  EXPECT_EQ(plan["speculative_num_steps"], 3);
  EXPECT_EQ(plan["memory"]["kv_cache_bytes"], 2000);
  // The plan equals /get_server_info's figures.
  const json info = json::parse(http(port_, "GET", "/get_server_info").body);
  EXPECT_EQ(plan["kv_tokens"], info["max_total_num_tokens"]);
  EXPECT_EQ(plan["max_running_requests"], info["max_running_requests"]);
  EXPECT_EQ(plan["context_length"], info["context_length"]);
  EXPECT_EQ(plan["kv_cache_dtype"], info["kv_cache_dtype"]);

  // Live figures: /status.json's name == /metrics' name without the deltaserve_ prefix.
  const auto metrics = scrape(http(port_, "GET", "/metrics").body);
  const json again = json::parse(http(port_, "GET", "/status.json").body);
  EXPECT_EQ(again["generation_tokens_total"], s["generation_tokens_total"]);  // idle: nothing moves
  EXPECT_EQ(s["generation_tokens_total"], 3);
  for (const char* k : {"requests_running", "requests_waiting", "kv_tokens_used", "kv_tokens_total", "state_slots_used",
                        "state_slots_total", "prompt_tokens_total", "prompt_tokens_cached_total",
                        "generation_tokens_total", "spec_draft_tokens_total", "spec_accepted_tokens_total",
                        "spec_verify_steps_total", "engine_steps_total", "preemptions_total", "http_streams_open"}) {
    auto it = metrics.find(std::string("deltaserve_") + k);
    ASSERT_NE(it, metrics.end()) << k;
    ASSERT_TRUE(s.contains(k)) << k;
    EXPECT_EQ(s[k].get<double>(), it->second) << k;
  }
  EXPECT_EQ(s["spec_accept_length"], 0.0);
  // No launch database behind this server: said so, not an empty list.
  EXPECT_TRUE(s["launches"].is_null());
  EXPECT_FALSE(s["launches_error"].get<std::string>().empty());
}

TEST_F(StatusPageTest, RunningRequestIsShownLive) {
  engine_.tick = std::chrono::milliseconds(20);
  start();
  engine_.script = std::vector<TokenId>(200, 100);
  std::thread client([&] { http(port_, "POST", "/v1/completions", R"({"prompt": "abc", "max_tokens": 100})"); });
  ASSERT_TRUE(wait_until([&] { return engine_.n_live() == 1; }));
  const json s = json::parse(http(port_, "GET", "/status.json").body);
  EXPECT_EQ(s["requests_running"], 1);
  EXPECT_GT(s["kv_tokens_used"].get<int64_t>(), 0);
  client.join();
  const json after = json::parse(http(port_, "GET", "/status.json").body);
  EXPECT_EQ(after["requests_running"], 0);
  EXPECT_EQ(after["generation_tokens_total"], 100);
}

TEST_F(StatusPageTest, LaunchHistoryFromTheConfig) {
  ServerConfig cfg;
  int calls = 0;
  cfg.launch_history = [&calls]() -> Result<nlohmann::ordered_json> {
    ++calls;
    return nlohmann::ordered_json::array({{{"launch_id", 42}, {"best_output_tokens_per_s", 12.5}},
                                          {{"launch_id", 41}, {"best_output_tokens_per_s", 0.0}}});
  };
  start(cfg);
  const json s = json::parse(http(port_, "GET", "/status.json").body);
  ASSERT_TRUE(s["launches"].is_array()) << s.dump();
  ASSERT_EQ(s["launches"].size(), 2u);
  EXPECT_EQ(s["launches"][0]["launch_id"], 42);
  EXPECT_EQ(s["launches"][0]["best_output_tokens_per_s"], 12.5);
  EXPECT_FALSE(s.contains("launches_error"));
  EXPECT_EQ(calls, 1);
}

TEST_F(StatusPageTest, LaunchHistoryErrorIsReported) {
  ServerConfig cfg;
  cfg.launch_history = []() -> Result<nlohmann::ordered_json> { return error("launch database: disk on fire"); };
  start(cfg);
  auto r = http(port_, "GET", "/status.json");
  ASSERT_EQ(r.status, 200);  // the live figures still come
  const json s = json::parse(r.body);
  EXPECT_TRUE(s["launches"].is_null());
  EXPECT_EQ(s["launches_error"], "launch database: disk on fire");
  EXPECT_EQ(s["plan"]["kv_tokens"], 4096);
}

TEST_F(StatusPageTest, WithApiKeyThePageLoadsButItsDataNeedsTheKey) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  auto page = http(port_, "GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("id=\"api-key\""), std::string::npos);
  EXPECT_EQ(http(port_, "HEAD", "/").status, 200);
  // The page carries no figures and no key.
  EXPECT_EQ(page.body.find("sekret"), std::string::npos);
  EXPECT_EQ(page.body.find("4096"), std::string::npos);
  // A POST to / is not exempt: 401 before its body is read, like every other route.
  EXPECT_EQ(http(port_, "POST", "/", "{}").status, 401);
  auto denied = http(port_, "GET", "/status.json");
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.headers["www-authenticate"], "Bearer");
  EXPECT_EQ(denied.body.find("4096"), std::string::npos);
  EXPECT_EQ(http(port_, "GET", "/status.json", "", {"Authorization: Bearer wrong"}).status, 401);
  auto ok = http(port_, "GET", "/status.json", "", {"Authorization: Bearer sekret"});
  ASSERT_EQ(ok.status, 200);
  EXPECT_EQ(json::parse(ok.body)["plan"]["kv_tokens"], 4096);
  // The chat the page sends needs it too.
  EXPECT_EQ(http(port_, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})").status, 401);
}

TEST_F(StatusPageTest, LoadingServerAnswers503) {
  ServerConfig cfg;
  cfg.start_loading = true;
  start(cfg);
  EXPECT_EQ(http(port_, "GET", "/").status, 503);
  EXPECT_EQ(http(port_, "GET", "/status.json").status, 503);
  server_->set_state(ServeState::Ready);
  EXPECT_EQ(http(port_, "GET", "/status.json").status, 200);
}

}  // namespace
}  // namespace deltaserve
