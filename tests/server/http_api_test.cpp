// The OpenAI HTTP API against a scripted FakeEngine and the tiny-coder tokenizer: routes, errors,
// streaming, stop strings, n, parsers, cancellation on disconnect, many concurrent streams.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/openai_server.h"
#include "server_fixture.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;
using testing::FakeEngine;
using testing::http;
using testing::sse_data;
using testing::wait_until;


Result<std::string> chatml(const nlohmann::ordered_json& messages, const nlohmann::ordered_json&,
                           const nlohmann::ordered_json& kwargs) {
  std::string out;
  for (const auto& m : messages) {
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m["content"].get<std::string>() +
           "<|im_end|>\n";
  }
  out += "<|im_start|>assistant\n";
  bool thinking = !(kwargs.contains("enable_thinking") && kwargs["enable_thinking"] == false);
  out += thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  return out;
}

class HttpApiTest : public testing::ServerFixture {
 protected:
  void start(ServerConfig cfg = {}) { start_server(cfg, chatml); }
  void script(const std::string& text) { engine_.script = tokenizer_->encode(text, true); }
};

TEST_F(HttpApiTest, HealthModelsMetrics) {
  start();
  auto h = http(port_, "GET", "/health");
  EXPECT_EQ(h.status, 200);
  auto m = http(port_, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(json::parse(m.body)["data"][0]["id"], "tiny");
  auto metrics = http(port_, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name :
       {"deltaserve_requests_running", "deltaserve_requests_waiting", "deltaserve_kv_tokens_used",
        "deltaserve_state_slots_used", "deltaserve_prompt_tokens_total",
        "deltaserve_generation_tokens_total", "deltaserve_time_to_first_token_seconds_bucket",
        "deltaserve_inter_token_latency_seconds_count", "deltaserve_spec_accept_length_sum",
        "deltaserve_spec_accepted_tokens_total", "deltaserve_spec_draft_tokens_total"}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
}

TEST_F(HttpApiTest, UnknownRouteAndMethod) {
  start();
  auto r = http(port_, "GET", "/v2/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(error_of(r)["code"], "not_found");
  EXPECT_EQ(http(port_, "GET", "/v1/chat/completions").status, 405);
}

TEST_F(HttpApiTest, MalformedAndHostileBodies) {
  ServerConfig cfg;
  cfg.max_request_bytes = 4096;
  start(cfg);
  auto r = post("/v1/chat/completions", "{\"messages\": [");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r)["type"], "invalid_request_error");
  r = post("/v1/chat/completions", std::string(1500, '[') + std::string(1500, ']'));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("nesting"), std::string::npos);
  r = post("/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"bad \xFF\xFE utf8\"}]}");
  EXPECT_EQ(r.status, 400);
  r = post("/v1/chat/completions", std::string(10000, ' '));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(error_of(r)["code"], "request_too_large");
  r = post("/v1/chat/completions", "[1, 2]");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);  // still alive
}

// JSON inside strings (tool-call arguments, json_schema, structural_tag as text) is held to the
// same nesting limit as the body: 100,000 levels in 200 KB once crashed the server in rendering.
TEST_F(HttpApiTest, DeepJsonInsideStringsIs400) {
  start();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}},
                                         {{"role", "assistant"}, {"content", ""},
                                          {"tool_calls", json::array({{{"type", "function"},
                                                                       {"function", {{"name", "f"}, {"arguments", "{\"a\":" + deep + "}"}}}}})}},
                                         {{"role", "user"}, {"content", "again"}}})}};
  auto r = post("/v1/chat/completions", body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(error_of(r)["param"], "messages[1].tool_calls[0].function.arguments") << r.body;
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("nested deeper than"), std::string::npos) << r.body;
  json schema = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", deep}}}}}};
  r = post("/v1/chat/completions", schema.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);  // still alive
}

TEST_F(HttpApiTest, FieldValidationNamesTheField) {
  start();
  auto check = [&](const std::string& body, const std::string& param) {
    auto r = post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_EQ(error_of(r)["param"], param) << r.body;
  };
  std::string msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
  check("{" + msgs + ", \"temperature\": -1}", "temperature");
  check("{" + msgs + ", \"temperature\": \"hot\"}", "temperature");
  check("{" + msgs + ", \"top_p\": 1.5}", "top_p");
  check("{" + msgs + ", \"n\": 0}", "n");
  check("{" + msgs + ", \"max_tokens\": 100000}", "max_tokens");
  check("{" + msgs + ", \"stop\": 5}", "stop");
  check("{" + msgs + ", \"top_logprobs\": 3}", "top_logprobs");
  check("{" + msgs + ", \"stream_options\": {\"include_usage\": true}}", "stream_options");
  check("{\"messages\": [{\"role\": \"wizard\", \"content\": \"hi\"}]}", "messages[0].role");
  check("{\"messages\": []}", "messages");
  check("{}", "messages");
  std::string long_text;
  for (int i = 0; i < 400; ++i) long_text += "word ";
  check("{\"messages\": [{\"role\": \"user\", \"content\": \"" + long_text + "\"}]}",
        "messages");
  auto r = post("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": -3}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r)["param"], "max_tokens");
  // NaN is not JSON: malformed.
  EXPECT_EQ(post("/v1/chat/completions", "{" + msgs + ", \"temperature\": NaN}").status, 400);
}

TEST_F(HttpApiTest, ApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  script("Hello");
  EXPECT_EQ(http(port_, "GET", "/v1/models").status, 401);
  EXPECT_EQ(http(port_, "GET", "/v1/models", "", {"Authorization: Bearer wrong"}).status, 401);
  EXPECT_EQ(http(port_, "GET", "/v1/models", "", {"Authorization: Bearer sekret"}).status, 200);
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
  auto r = post("/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 2}");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r)["type"], "authentication_error");
}

TEST_F(HttpApiTest, ChatNonStreaming) {
  start();
  script("Hello there, friend.");
  auto r = post("/v1/chat/completions",
                R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":50,
                    "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello there, friend.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], engine_.script.size());
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"],
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  // generation_config.json defaults reached the engine (temperature 0.6, top_k 20, top_p 0.95).
  auto sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_FLOAT_EQ(sub[0].sampling.temperature, 0.6f);
  EXPECT_EQ(sub[0].sampling.top_k, 20);
  EXPECT_FLOAT_EQ(sub[0].sampling.top_p, 0.95f);
  EXPECT_EQ(sub[0].sampling.max_tokens, 50);
  expect_idle();
}

TEST_F(HttpApiTest, ChatStreamingWithUsage) {
  start();
  script("One two three four.");
  auto r = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"temperature":0,
                    "stream_options":{"include_usage":true},"seed":7,
                    "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/event-stream");
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  std::string finish;
  json usage;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c.contains("usage")) {
      usage = c["usage"];
      EXPECT_TRUE(c["choices"].empty());
      continue;
    }
    const json& ch = c["choices"][0];
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    }
    if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content, "One two three four.");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage["completion_tokens"], engine_.script.size());
  EXPECT_EQ(usage["reasoning_tokens"], 0);
  EXPECT_EQ(usage["completion_tokens_details"]["reasoning_tokens"], 0);
  EXPECT_EQ(engine_.submitted()[0].sampling.seed.value(), 7u);
  EXPECT_FLOAT_EQ(engine_.submitted()[0].sampling.temperature, 0.0f);
  expect_idle();
}

TEST_F(HttpApiTest, CompletionsAndLength) {
  start();
  script("alpha beta gamma delta epsilon");
  auto r = post("/v1/completions", R"({"prompt":"Say:","max_tokens":3,"logprobs":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["choices"][0]["text"], tokenizer_->decode(std::vector<TokenId>(
                                         engine_.script.begin(), engine_.script.begin() + 3)));
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 3u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);

  auto s = post("/v1/completions", R"({"prompt":"Say:","max_tokens":100,"stream":true})");
  ASSERT_EQ(s.status, 200);
  std::string text;
  for (const auto& e : sse_data(s.body)) {
    if (e == "[DONE]") break;
    json c = json::parse(e);
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "alpha beta gamma delta epsilon");
  expect_idle();
}

TEST_F(HttpApiTest, StopStringCancelsEngine) {
  start();
  engine_.tick = std::chrono::milliseconds(2);
  script("Hello world and more text that goes on and on and on and on and on");
  auto r = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"hi"}],"stop":["world"],
                    "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(engine_.cancelled().size(), 1u);
  expect_idle();
}

TEST_F(HttpApiTest, NChoicesGetDistinctSeeds) {
  start();
  script("abc");
  auto r = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"hi"}],"n":3,"seed":100,
                    "logprobs":true,"top_logprobs":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["logprobs"]["content"].size(), engine_.script.size());
    EXPECT_EQ(j["choices"][i]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  }
  auto sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 3u);
  EXPECT_EQ(*sub[0].sampling.seed, 100u);
  EXPECT_EQ(*sub[1].sampling.seed, 101u);
  EXPECT_EQ(*sub[2].sampling.seed, 102u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3 * engine_.script.size());
  expect_idle();
}

TEST_F(HttpApiTest, ReasoningSplitAndUsage) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  start(cfg);
  script("Let me think.\n</think>\n\nThe answer.");
  auto r = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"q"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Let me think.\n");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "\n\nThe answer.");
  int think_tokens = static_cast<int>(tokenizer_->encode("Let me think.\n</think>", true).size());
  EXPECT_EQ(j["usage"]["reasoning_tokens"], think_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens_details"]["reasoning_tokens"], think_tokens);

  auto s = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"q"}],"stream":true})");
  std::string reasoning, content;
  for (const auto& e : sse_data(s.body)) {
    if (e == "[DONE]") break;
    json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "Let me think.\n");
  EXPECT_EQ(content, "\n\nThe answer.");

  // Thinking off: all content.
  auto off = post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"q"}],
                      "chat_template_kwargs":{"enable_thinking":false}})");
  json o = json::parse(off.body);
  EXPECT_TRUE(o["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_EQ(o["usage"]["reasoning_tokens"], 0);
  expect_idle();
}

TEST_F(HttpApiTest, ToolCallsQwen3Coder) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  script(
      "User wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
      "Paris\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
  std::string body = R"({"messages":[{"role":"user","content":"weather?"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}]})";
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_TRUE(j["choices"][0]["message"].is_object()) << r.body;
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["reasoning_content"], "User wants weather.\n");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");

  json sbody = json::parse(body);
  sbody["stream"] = true;
  auto s = post("/v1/chat/completions", sbody.dump());
  std::string args, name, id, finish;
  for (const auto& e : sse_data(s.body)) {
    if (e == "[DONE]") break;
    json chunk = json::parse(e);
    const json& ch = chunk["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) continue;
    for (const auto& tc : ch["delta"]["tool_calls"]) {
      EXPECT_EQ(tc["index"], 0);
      if (tc.contains("id")) id = tc["id"];
      if (tc["function"].contains("name")) name = tc["function"]["name"];
      args += tc["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(id.substr(0, 5), "call_");
  EXPECT_EQ(args, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(finish, "tool_calls");
  expect_idle();
}

TEST_F(HttpApiTest, QueueFullIs503) {
  start();
  engine_.reject_kind = EngineErrorKind::Overloaded;
  auto r = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(r.status, 503);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("queue"), std::string::npos);
  auto s = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"hi"}],"stream":true})");
  EXPECT_EQ(s.status, 503);
  expect_idle();
}

// Each engine error kind maps to one HTTP status, whatever its message says.
TEST_F(HttpApiTest, EngineErrorKindsMapToOneStatusEach) {
  start();
  const std::pair<EngineErrorKind, int> cases[] = {{EngineErrorKind::BadRequest, 400},
                                                   {EngineErrorKind::TooLong, 400},
                                                   {EngineErrorKind::Overloaded, 503},
                                                   {EngineErrorKind::Internal, 500}};
  for (auto [kind, status] : cases) {
    engine_.reject_kind = kind;
    auto r = post("/v1/completions", R"({"prompt":"hi","max_tokens":2})");
    EXPECT_EQ(r.status, status) << engine_error_kind_name(kind) << ": " << r.body;
    EXPECT_NE(error_of(r)["message"].get<std::string>().find(engine_error_kind_name(kind)), std::string::npos)
        << r.body;
  }
  engine_.reject_kind = EngineErrorKind::TooLong;
  EXPECT_EQ(error_of(post("/v1/completions", R"({"prompt":"hi"})"))["code"], "context_length_exceeded");
  engine_.reject_kind = EngineErrorKind::None;
  expect_idle();
}

TEST_F(HttpApiTest, DisconnectMidStreamCancels) {
  start();
  engine_.tick = std::chrono::milliseconds(5);
  script(std::string(200, 'x'));
  int fd = testing::connect_local(port_);
  ASSERT_GE(fd, 0);
  testing::send_all(fd, testing::build_request(
                            "POST", "/v1/completions",
                            R"({"prompt":"go","max_tokens":200,"stream":true})"));
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);  // headers + first chunk
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return engine_.cancelled().size() == 1; }));
  expect_idle();
}

TEST_F(HttpApiTest, ManyConcurrentStreamsWithDisconnects) {
  start();
  engine_.tick = std::chrono::milliseconds(2);
  script("The quick brown fox jumps over the lazy dog again and again and again.");
  constexpr int kStreams = 64;
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      int fd = testing::connect_local(port_);
      if (fd < 0) return;
      testing::send_all(fd, testing::build_request(
                                "POST", "/v1/chat/completions",
                                R"({"messages":[{"role":"user","content":"hi"}],"stream":true,
                                    "chat_template_kwargs":{"enable_thinking":false}})"));
      std::string raw;
      char buf[4096];
      for (;;) {
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<std::size_t>(n));
        if (i % 2 == 1 && raw.size() > 300) break;  // odd clients hang up mid-stream
      }
      ::close(fd);
      if (i % 2 == 0 && raw.find("data: [DONE]") != std::string::npos) ++ok;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kStreams / 2);
  expect_idle();
  auto metrics = http(port_, "GET", "/metrics");
  EXPECT_NE(metrics.body.find("deltaserve_requests_running 0\n"), std::string::npos);
  EXPECT_NE(metrics.body.find("deltaserve_kv_tokens_used 0\n"), std::string::npos);
  EXPECT_NE(metrics.body.find("deltaserve_state_slots_used 0\n"), std::string::npos);
}

TEST_F(HttpApiTest, ContinuousUsageAndEcho) {
  start();
  script("one two");
  auto r = post("/v1/completions",
                R"({"prompt":"Say:","stream":true,"echo":true,
                    "stream_options":{"include_usage":true,"continuous_usage_stats":true}})");
  ASSERT_EQ(r.status, 200);
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["text"], "Say:");
  int last_completion = -1;
  std::string text;
  for (const auto& e : events) {
    if (e == "[DONE]") break;
    json c = json::parse(e);
    ASSERT_TRUE(c.contains("usage")) << e;
    EXPECT_GE(c["usage"]["completion_tokens"].get<int>(), last_completion);
    last_completion = c["usage"]["completion_tokens"];
    if (!c["choices"].empty()) text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Say:one two");
  EXPECT_EQ(last_completion, static_cast<int>(engine_.script.size()));
  // continuous_usage_stats alone does nothing: usage on every chunk needs include_usage too (vLLM).
  r = post("/v1/completions", R"({"prompt":"Say:","stream":true,"stream_options":{"continuous_usage_stats":true}})");
  ASSERT_EQ(r.status, 200);
  for (const auto& e : sse_data(r.body)) {
    if (e == "[DONE]") break;
    EXPECT_FALSE(json::parse(e).contains("usage")) << e;
  }
  expect_idle();
}

TEST_F(HttpApiTest, HermesToolCalls) {
  ServerConfig cfg;
  cfg.tool_call_parser = "hermes";
  start(cfg);
  script("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  auto r = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"go"}],
                    "tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"x\": 1}");
  // tool_choice "none": no parsing, the markup stays content.
  auto n = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"go"}],"tool_choice":"none",
                    "tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})");
  json nj = json::parse(n.body);
  EXPECT_FALSE(nj["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(nj["choices"][0]["finish_reason"], "stop");
  expect_idle();
}

TEST_F(HttpApiTest, KeepAliveServesSeveralRequests) {
  start();
  script("ok");
  int fd = testing::connect_local(port_);
  ASSERT_GE(fd, 0);
  std::string req = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string raw;
  for (int i = 0; i < 3; ++i) testing::send_all(fd, req);
  // Three pipelined responses, each framed by its Content-Length.
  char buf[4096];
  int parsed = 0;
  while (parsed < 3) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    raw.append(buf, static_cast<std::size_t>(n));
    for (;;) {
      std::size_t head_end = raw.find("\r\n\r\n");
      if (head_end == std::string::npos) break;
      ASSERT_EQ(raw.substr(0, 12), "HTTP/1.1 200") << raw;
      std::size_t cl = raw.find("Content-Length: ");
      ASSERT_LT(cl, head_end);
      std::size_t len = std::stoul(raw.substr(cl + 16));
      if (raw.size() < head_end + 4 + len) break;
      json body = json::parse(raw.substr(head_end + 4, len));
      EXPECT_EQ(body["data"][0]["id"], "tiny");
      raw.erase(0, head_end + 4 + len);
      ++parsed;
    }
  }
  EXPECT_TRUE(raw.empty());
  ::close(fd);
}


// --- batched prompts on /v1/completions, matched_stop, reasoning options ---

// Each request's output names its prompt: "<" + prompt text + ">".
void script_echoing_prompt(FakeEngine& engine, const Tokenizer& tok) {
  engine.script_for = [&tok](const GenerateRequest& g) {
    return tok.encode("<" + tok.decode(g.prompt) + ">", true);
  };
}

TEST_F(HttpApiTest, BatchedPromptsIndicesUsageAndEcho) {
  start();
  script_echoing_prompt(engine_, *tokenizer_);
  const std::vector<std::string> prompts = {"alpha", "beta gamma", "def f(x):"};
  auto r = post("/v1/completions",
                R"({"prompt":["alpha","beta gamma","def f(x):"],"n":2,"echo":true,"seed":5,
                    "max_tokens":50})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 6u);
  int prompt_tokens = 0, completion_tokens = 0;
  for (const auto& p : prompts) {
    prompt_tokens += static_cast<int>(tokenizer_->encode(p, true).size());
    completion_tokens += 2 * static_cast<int>(tokenizer_->encode("<" + p + ">", true).size());
  }
  for (int i = 0; i < 6; ++i) {
    const std::string& p = prompts[static_cast<std::size_t>(i / 2)];
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], p + "<" + p + ">") << i;  // echo: its own prompt
    EXPECT_EQ(j["choices"][i]["finish_reason"], "stop");
  }
  // Each prompt counted once, not n times; completions summed over all six choices.
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + completion_tokens);
  // Submitted in choice order; prompt p's j-th choice has seed + j (as the prompt alone would).
  auto sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(sub[i].prompt, tokenizer_->encode(prompts[i / 2], true)) << i;
    EXPECT_EQ(*sub[i].sampling.seed, 5u + i % 2) << i;
    EXPECT_EQ(sub[i].sampling.max_tokens, 50);
  }
  expect_idle();
}

TEST_F(HttpApiTest, BatchedPromptsStreamed) {
  start();
  script_echoing_prompt(engine_, *tokenizer_);
  auto r = post("/v1/completions",
                R"({"prompt":["one","two three"],"n":2,"echo":true,"stream":true,
                    "stream_options":{"include_usage":true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  std::map<int, json> matched;
  json usage;
  bool done = false;
  for (const auto& e : sse_data(r.body)) {
    if (e == "[DONE]") {
      done = true;
      break;
    }
    json c = json::parse(e);
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    ASSERT_EQ(c["choices"].size(), 1u);
    const json& ch = c["choices"][0];
    int idx = ch["index"];
    EXPECT_FALSE(finish.count(idx)) << "text after the finish chunk of " << idx;
    text[idx] += ch["text"].get<std::string>();
    if (!ch["finish_reason"].is_null()) {
      finish[idx] = ch["finish_reason"];
      ASSERT_TRUE(ch.contains("matched_stop")) << e;
      matched[idx] = ch["matched_stop"];
    }
  }
  EXPECT_TRUE(done);
  ASSERT_EQ(text.size(), 4u);
  EXPECT_EQ(text[0], "one<one>");
  EXPECT_EQ(text[1], "one<one>");
  EXPECT_EQ(text[2], "two three<two three>");
  EXPECT_EQ(text[3], "two three<two three>");
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(finish[i], "stop");
    // The fake engine stops on the script's last token: that id is the matched stop.
    EXPECT_EQ(matched[i], tokenizer_->encode(">", true).back());
  }
  const int prompt_tokens = static_cast<int>(tokenizer_->encode("one", true).size() +
                                             tokenizer_->encode("two three", true).size());
  const int completion_tokens =
      2 * static_cast<int>(tokenizer_->encode("<one>", true).size() +
                           tokenizer_->encode("<two three>", true).size());
  EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(usage["completion_tokens"], completion_tokens);
  expect_idle();
}

TEST_F(HttpApiTest, BatchedTokenIdPromptsGetTheirOwnDefaultMaxTokens) {
  start();
  script("ok");
  std::vector<TokenId> a = tokenizer_->encode("short", true);
  // A prompt 5 tokens short of the context: the default of 16 is cut to the room left.
  std::vector<TokenId> b(static_cast<size_t>(engine_.context - 5), a.front());
  json body = {{"prompt", json::array({a, b})}};
  auto r = post("/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], "ok");
  auto sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 2u);
  // No max_tokens: 16, as OpenAI, SGLang and vLLM default for /v1/completions.
  EXPECT_EQ(sub[0].sampling.max_tokens, 16);
  EXPECT_EQ(sub[1].sampling.max_tokens, 5);
  EXPECT_EQ(j["usage"]["prompt_tokens"], a.size() + b.size());
  // Chat without max_tokens may still use the rest of the context.
  auto c = post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_EQ(c.status, 200) << c.body;
  auto sub2 = engine_.submitted();
  ASSERT_EQ(sub2.size(), 3u);
  EXPECT_EQ(sub2[2].sampling.max_tokens, static_cast<int>(engine_.context - sub2[2].prompt.size()));
  expect_idle();
}

TEST_F(HttpApiTest, BatchedPromptValidation) {
  start();
  script("ok");
  auto expect_400 = [&](const std::string& body, const std::string& param,
                        const std::string& in_message) {
    auto r = post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    json e = error_of(r);
    EXPECT_EQ(e["param"], param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(in_message), std::string::npos) << r.body;
  };
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word ";
  expect_400(R"({"prompt":["fine",""]})", "prompt", "prompt[1] is empty");
  expect_400(R"({"prompt":[[1,2],[]]})", "prompt", "prompt[1] is empty");
  expect_400(R"({"prompt":["fine","also fine","x"],"n":1,"max_tokens":1,"echo":1})", "echo",
             "boolean");
  expect_400(R"({"prompt":["ok","fine","))" + long_text + R"("]})", "prompt", "prompt[2] has ");
  // max_tokens that leaves no room after one prompt names that prompt.
  expect_400(R"({"prompt":["a","))" + long_text.substr(0, 200) + R"("],"max_tokens":250})",
             "max_tokens", "prompt[1] has ");
  expect_400(R"({"prompt":[[1,2],[3,99999999]]})", "prompt", "prompt[1]: token id 99999999");
  expect_400(R"({"prompt":[[1,2],[3,-1]]})", "prompt", "prompt[1] token ids");
  expect_400(R"({"prompt":["a",[1,2]]})", "prompt", "prompt[1] must be a string");
  expect_400(R"({"prompt":[[1,2],"a"]})", "prompt", "prompt[1] must be a list of token ids");
  expect_400(R"({"prompt":[]})", "prompt", "empty list");
  expect_400(R"({"prompt":[{"x":1}]})", "prompt", "must be a string");
  // prompts x n is capped.
  json many = json::array();
  for (int i = 0; i < kMaxSequencesPerRequest / 4 + 1; ++i) many.push_back("p");
  expect_400(json{{"prompt", many}, {"n", 4}}.dump(), "n", "sequences");
  json too_many = json::array();
  for (int i = 0; i <= kMaxSequencesPerRequest; ++i) too_many.push_back("p");
  expect_400(json{{"prompt", too_many}}.dump(), "prompt", "prompts");
  // A single prompt's errors keep the single-prompt wording.
  expect_400(R"({"prompt":""})", "prompt", "the prompt is empty");
  // Nothing reached the engine.
  EXPECT_TRUE(engine_.submitted().empty());
  // At the cap exactly: accepted.
  json at_cap = json::array();
  for (int i = 0; i < kMaxSequencesPerRequest / 4; ++i) at_cap.push_back("p");
  auto ok = post("/v1/completions", json{{"prompt", at_cap}, {"n", 4}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["choices"].size(),
            static_cast<std::size_t>(kMaxSequencesPerRequest));
  expect_idle();
}

TEST_F(HttpApiTest, DisconnectCancelsEveryBatchedSequence) {
  start();
  engine_.tick = std::chrono::milliseconds(5);
  script(std::string(200, 'x'));
  int fd = testing::connect_local(port_);
  ASSERT_GE(fd, 0);
  testing::send_all(fd, testing::build_request(
                            "POST", "/v1/completions",
                            R"({"prompt":["go","stop"],"n":2,"max_tokens":200,"stream":true})"));
  char buf[4096];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  EXPECT_TRUE(wait_until([&] { return engine_.cancelled().size() == 4; }))
      << engine_.cancelled().size();
  expect_idle();
}

TEST_F(HttpApiTest, MatchedStop) {
  start();
  // A stop string: the string.
  script("Hello world and more text");
  auto r = post("/v1/chat/completions",
                R"({"messages":[{"role":"user","content":"hi"}],"stop":["zzz","world"],
                    "chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["matched_stop"], "world");

  // EOS: its token id (hidden from the text), non-streaming and in the streamed finish chunk.
  script("Hi there<|im_end|>");
  const TokenId im_end = *tokenizer_->token_id("<|im_end|>");
  ASSERT_EQ(engine_.script.back(), im_end);
  auto e = post("/v1/completions", R"({"prompt":"x"})");
  json ej = json::parse(e.body);
  EXPECT_EQ(ej["choices"][0]["text"], "Hi there");
  EXPECT_EQ(ej["choices"][0]["matched_stop"], im_end);
  auto es = post("/v1/chat/completions",
                 R"({"messages":[{"role":"user","content":"hi"}],"stream":true,
                     "chat_template_kwargs":{"enable_thinking":false}})");
  json finish_chunk;
  for (const auto& ev : sse_data(es.body)) {
    if (ev == "[DONE]") break;
    json c = json::parse(ev);
    const json& ch = c["choices"][0];
    if (!ch["finish_reason"].is_null()) finish_chunk = ch;
    else EXPECT_FALSE(ch.contains("matched_stop")) << ev;
  }
  EXPECT_EQ(finish_chunk["finish_reason"], "stop");
  EXPECT_EQ(finish_chunk["matched_stop"], im_end);

  // Length: null (present).
  auto l = post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  json lj = json::parse(l.body);
  EXPECT_EQ(lj["choices"][0]["finish_reason"], "length");
  ASSERT_TRUE(lj["choices"][0].contains("matched_stop"));
  EXPECT_TRUE(lj["choices"][0]["matched_stop"].is_null());

  // A stop_token_ids entry: that id.
  script("a b c d e f");
  const TokenId c_id = engine_.script[2];
  engine_.script.resize(3);  // the fake engine stops after the script, on c_id
  auto t = post("/v1/completions",
                json{{"prompt", "x"}, {"stop_token_ids", json::array({c_id})}}.dump());
  json tj = json::parse(t.body);
  EXPECT_EQ(tj["choices"][0]["matched_stop"], c_id);
  expect_idle();
}

TEST_F(HttpApiTest, ReasoningOptions) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  start(cfg);
  script("Let me think about it.\n</think>\n\nThe answer.");
  const std::string q = R"("messages":[{"role":"user","content":"q"}])";
  const int think_tokens =
      static_cast<int>(tokenizer_->encode("Let me think about it.\n</think>", true).size());

  // include_reasoning=false: split off and dropped; no reasoning field at all.
  auto r = post("/v1/chat/completions", "{" + q + R"(,"include_reasoning":false})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content")) << r.body;
  EXPECT_EQ(j["choices"][0]["message"]["content"], "\n\nThe answer.");
  EXPECT_EQ(j["usage"]["reasoning_tokens"], think_tokens);  // still generated, still counted
  auto rs = post("/v1/chat/completions", "{" + q + R"(,"include_reasoning":false,"stream":true})");
  std::string content;
  for (const auto& e : sse_data(rs.body)) {
    if (e == "[DONE]") break;
    json d = json::parse(e)["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("reasoning_content")) << e;
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(content, "\n\nThe answer.");

  // stream_reasoning=false: one reasoning delta, when </think> arrives, before the content.
  auto h = post("/v1/chat/completions", "{" + q + R"(,"stream_reasoning":false,"stream":true})");
  int reasoning_chunks = 0;
  bool content_before_reasoning = false;
  content.clear();
  std::string reasoning;
  for (const auto& e : sse_data(h.body)) {
    if (e == "[DONE]") break;
    json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      ++reasoning_chunks;
      reasoning = d["reasoning_content"];
    }
    if (d.contains("content") && !d["content"].get<std::string>().empty()) {
      if (reasoning_chunks == 0) content_before_reasoning = true;
      content += d["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning_chunks, 1);
  EXPECT_EQ(reasoning, "Let me think about it.\n");
  EXPECT_FALSE(content_before_reasoning);
  EXPECT_EQ(content, "\n\nThe answer.");
  // Streamed by default: one delta per token.
  auto d = post("/v1/chat/completions", "{" + q + R"(,"stream":true})");
  int default_chunks = 0;
  for (const auto& e : sse_data(d.body)) {
    if (e == "[DONE]") break;
    if (json::parse(e)["choices"][0]["delta"].contains("reasoning_content")) ++default_chunks;
  }
  EXPECT_GT(default_chunks, 1);
  // Non-streaming: stream_reasoning changes nothing.
  auto n = post("/v1/chat/completions", "{" + q + R"(,"stream_reasoning":false})");
  EXPECT_EQ(json::parse(n.body)["choices"][0]["message"]["reasoning_content"],
            "Let me think about it.\n");

  // separate_reasoning=false: no split, the raw text in content (tiny-coder marks </think>
  // special, so keep special tokens to see it).
  auto raw = post("/v1/chat/completions",
                  "{" + q + R"(,"separate_reasoning":false,"skip_special_tokens":false})");
  json rj = json::parse(raw.body);
  EXPECT_EQ(rj["choices"][0]["message"]["content"],
            "Let me think about it.\n</think>\n\nThe answer.");
  EXPECT_TRUE(rj["choices"][0]["message"]["reasoning_content"].is_null());

  for (const char* field : {"include_reasoning", "stream_reasoning", "separate_reasoning"}) {
    auto bad = post("/v1/chat/completions", "{" + q + ",\"" + field + "\":\"yes\"}");
    EXPECT_EQ(bad.status, 400);
    EXPECT_EQ(error_of(bad)["param"], field);
  }
  expect_idle();
}

TEST_F(HttpApiTest, ReasoningOptionsWithoutParserAreIgnored) {
  start();  // no --reasoning-parser
  script("Let me think.\n</think>\n\nDone.");
  const std::string q = R"("messages":[{"role":"user","content":"q"}])";
  auto plain = post("/v1/chat/completions", "{" + q + "}");
  auto r = post("/v1/chat/completions",
                "{" + q + R"(,"include_reasoning":false,"stream_reasoning":false})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["message"], json::parse(plain.body)["choices"][0]["message"]);
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("Done."),
            std::string::npos);
  EXPECT_TRUE(j["choices"][0]["message"]["reasoning_content"].is_null());
  expect_idle();
}

}  // namespace
}  // namespace deltaserve
