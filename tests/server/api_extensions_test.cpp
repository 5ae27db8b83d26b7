// Structured output, forced tool calls, the newly honoured request fields, SGLang's native routes,
// the Responses API, CORS and the sglang:* metrics, over HTTP against the FakeEngine (which applies
// each request's TokenConstraint the way the engine's sampling path does) and the tiny-coder
// tokenizer.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "server/json_util.h"
#include "server/openai_server.h"
#include "server/request_log.h"
#include "test_support.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;  // property order matters to schema grammars
using testing::FakeEngine;
using testing::http;
using testing::sse_data;
using testing::wait_until;

const std::string kModelDir = std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";
constexpr TokenId kImEnd = 8185;     // tiny-coder <|im_end|> (an EOS id)
constexpr TokenId kImStart = 8184;   // <|im_start|> (special)

Result<std::string> chatml(const nlohmann::ordered_json& messages, const nlohmann::ordered_json&,
                           const nlohmann::ordered_json& kwargs) {
  std::string out;
  for (const auto& m : messages) {
    out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m.value("content", std::string()) + "<|im_end|>\n";
  }
  if (kwargs.contains("add_generation_prompt") && kwargs["add_generation_prompt"] == false) return out;
  out += "<|im_start|>assistant\n";
  bool thinking = !(kwargs.contains("enable_thinking") && kwargs["enable_thinking"] == false);
  out += thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
  return out;
}

class ApiTest : public ::testing::Test {
 protected:
  void start(ServerConfig cfg = {}, ChatRenderFn render = chatml) {
    auto tok = Tokenizer::load(kModelDir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    tokenizer_ = std::make_unique<Tokenizer>(*tok);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    if (cfg.served_model_name == "default") cfg.served_model_name = "tiny";
    engine_.vocab = tokenizer_->vocab_size();
    engine_.eos = {8183, kImEnd};
    server_ = std::make_unique<OpenAiServer>(cfg, engine_, *tokenizer_, std::move(render), *load_generation_defaults(kModelDir, 0));
    auto st = server_->start();
    ASSERT_TRUE(st.is_ok()) << st.message();
    port_ = server_->port();
  }
  void script(const std::string& text, bool eos = true) {
    engine_.script = tokenizer_->encode(text, true);
    if (eos) engine_.script.push_back(kImEnd);
  }
  void TearDown() override {
    if (server_) server_->stop();
    EXPECT_EQ(engine_.constraint_rejects.load(), 0);
  }
  testing::HttpResult post(const std::string& path, const json& body, std::vector<std::string> headers = {}) {
    return http(port_, "POST", path, body.dump(), headers);
  }
  json ok_json(const testing::HttpResult& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.body;
    return j;
  }
  json error_of(const testing::HttpResult& r, int status = 400) {
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(!j.is_discarded() && j.contains("error")) << r.body;
    return j.is_discarded() ? json() : j["error"];
  }
  static json chat(json extra = json::object()) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
              {"chat_template_kwargs", {{"enable_thinking", false}}},
              {"max_tokens", 24}};
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    return b;
  }
  // Does the grammar of `schema` accept `text` as a prefix (prefix = true) or exactly?
  bool schema_accepts(const std::string& schema, const std::string& text, bool prefix) {
    auto g = grammar_from_json_schema_text(schema);
    EXPECT_TRUE(g.is_ok());
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    auto c = CompiledGrammar::compile(*g, TokenVocabulary::create(bytes, {}, {}));
    EXPECT_TRUE(c.is_ok());
    GrammarMatcher m(*c);
    return m.accept_string(text) && (prefix || m.can_end());
  }
  void expect_idle() {
    EXPECT_TRUE(wait_until([&] { return server_->active_jobs() == 0 && engine_.n_live() == 0; }));
  }

  FakeEngine engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
};

const char* kPointSchema = R"({"type":"object","properties":{"x":{"type":"integer"},"label":{"type":"string","maxLength":6}},"required":["x","label"]})";

// --- structured output ---

TEST_F(ApiTest, JsonSchemaLetsAValidOutputThroughUnchanged) {
  start();
  script(R"({"x": 12, "label": "pt"})");
  json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "point"}, {"schema", json::parse(kPointSchema)}}}};
  json j = ok_json(post("/v1/chat/completions", chat({{"response_format", rf}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], R"({"x": 12, "label": "pt"})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(schema_accepts(kPointSchema, j["choices"][0]["message"]["content"], false));
  expect_idle();
}

TEST_F(ApiTest, JsonSchemaForcesAnInvalidOutputIntoShape) {
  start();
  script("hello world, not json");
  json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "point"}, {"schema", json::parse(kPointSchema)}}}};
  json j = ok_json(post("/v1/chat/completions", chat({{"response_format", rf}, {"max_tokens", 12}})));
  const std::string text = j["choices"][0]["message"]["content"];
  EXPECT_NE(text, "hello world, not json");
  EXPECT_FALSE(text.empty());
  EXPECT_TRUE(schema_accepts(kPointSchema, text, true)) << text;
  expect_idle();
}

TEST_F(ApiTest, GrammarStartsAfterThinkWhenThePromptOpensIt) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  start(cfg);
  // Reasoning is free text; the JSON comes after </think>.
  engine_.script = tokenizer_->encode("free *thoughts*", true);
  engine_.script.push_back(*tokenizer_->token_id("</think>"));
  for (TokenId id : tokenizer_->encode(R"({"x": 1, "label": "a"})", true)) engine_.script.push_back(id);
  engine_.script.push_back(kImEnd);
  json body = chat({{"response_format", {{"type", "json_object"}}}});
  body.erase("chat_template_kwargs");
  json j = ok_json(post("/v1/chat/completions", body));
  EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "free *thoughts*");
  EXPECT_EQ(j["choices"][0]["message"]["content"], R"({"x": 1, "label": "a"})");
  expect_idle();
}

TEST_F(ApiTest, ResponseFormatErrors) {
  start();
  json e = error_of(post("/v1/chat/completions", chat({{"response_format", {{"type", "bogus"}}}})));
  EXPECT_EQ(e["param"], "response_format.type");
  EXPECT_NE(e["message"].get<std::string>().find("bogus"), std::string::npos);
  e = error_of(post("/v1/chat/completions",
                    chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "a"}}}}}})));
  EXPECT_EQ(e["param"], "response_format.json_schema.schema");
  // Chat's form without its json_schema object: the error names that object (stop 55).
  e = error_of(post("/v1/chat/completions", chat({{"response_format", {{"type", "json_schema"}}}})));
  EXPECT_EQ(e["param"], "response_format.json_schema") << e.dump();
  e = error_of(post("/v1/chat/completions",
                    chat({{"response_format", {{"type", "json_schema"},
                                               {"json_schema", {{"name", "a"}, {"schema", {{"type", "array"}, {"uniqueItems", true}}}}}}}})));
  EXPECT_EQ(e["param"], "response_format.json_schema.schema");
  EXPECT_NE(e["message"].get<std::string>().find("uniqueItems"), std::string::npos);
  e = error_of(post("/v1/chat/completions", chat({{"regex", "[a-z]+"}, {"response_format", {{"type", "json_object"}}}})));
  EXPECT_NE(e["message"].get<std::string>().find("give only one"), std::string::npos);
  e = error_of(post("/v1/completions", {{"prompt", "x"}, {"regex", "(a"}}));
  EXPECT_EQ(e["param"], "regex");
  // Past the compile budget (it took minutes on a request thread): a 400 naming the field.
  e = error_of(post("/v1/completions", {{"prompt", "x"}, {"regex", "(a{1,200}){1,200}"}}));
  EXPECT_EQ(e["param"], "regex");
  EXPECT_NE(e["message"].get<std::string>().find("too complex"), std::string::npos) << e.dump();
  e = error_of(post("/v1/completions", {{"prompt", "x"}, {"ebnf", "root ::= root \"a\" | \"b\""}}));
  EXPECT_NE(e["message"].get<std::string>().find("left-recursive"), std::string::npos);
}

TEST_F(ApiTest, RegexEbnfChoiceAndSglangJsonSchema) {
  start();
  script("abc123");
  json j = ok_json(post("/v1/completions", {{"prompt", "x"}, {"regex", "[a-c]+[0-9]+"}, {"max_tokens", 6}}));
  EXPECT_EQ(j["choices"][0]["text"], "abc123");
  script("maybe");
  j = ok_json(post("/v1/completions", {{"prompt", "x"}, {"ebnf", "root ::= \"yes\" | \"no\""}, {"max_tokens", 6}}));
  const std::string yn = j["choices"][0]["text"];
  EXPECT_TRUE(yn == "yes" || yn == "no") << yn;
  j = ok_json(post("/v1/completions", {{"prompt", "x"}, {"guided_choice", {"red", "green"}}, {"max_tokens", 6}}));
  const std::string rg = j["choices"][0]["text"];
  EXPECT_TRUE(rg == "red" || rg == "green") << rg;
  script("42");
  j = ok_json(post("/v1/completions", {{"prompt", "x"}, {"json_schema", R"({"type":"integer","maximum":50})"}, {"max_tokens", 6}}));
  EXPECT_EQ(j["choices"][0]["text"], "42");
  expect_idle();
}

// --- tool calls ---

json weather_tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}}])");
}

TEST_F(ApiTest, ToolChoiceRequiredNeedsAToolParser) {
  start();
  json e = error_of(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"tool_choice", "required"}})));
  EXPECT_EQ(e["param"], "tool_choice");
  EXPECT_NE(e["message"].get<std::string>().find("--tool-call-parser"), std::string::npos);
  e = error_of(post("/v1/chat/completions", chat({{"tool_choice", "required"}})));
  EXPECT_EQ(e["param"], "tool_choice");
}

TEST_F(ApiTest, ToolChoiceRequiredQwen3Coder) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  script(call);
  json j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"tool_choice", "required"}, {"max_tokens", 80}})));
  const json& msg = j["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << j.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city":"Paris","days":3})"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  // Plain text is not allowed: the output is forced into a call.
  script("Sure, the weather is fine.");
  j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"tool_choice", "required"}, {"max_tokens", 60}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u) << j.dump();
  expect_idle();
}

TEST_F(ApiTest, NamedToolChoiceForcesThatFunction) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  // The script calls get_weather; the request names get_time: the grammar wins.
  script("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>");
  json tc = {{"type", "function"}, {"function", {{"name", "get_time"}}}};
  json j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"tool_choice", tc}, {"max_tokens", 60}})));
  const json& calls = j["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << j.dump();
  EXPECT_EQ(calls[0]["function"]["name"], "get_time");
  const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args["zone"] == "UTC" || args["zone"] == "CET") << args;
  expect_idle();
}

TEST_F(ApiTest, ToolChoiceRequiredHermes) {
  ServerConfig cfg;
  cfg.tool_call_parser = "hermes";
  start(cfg);
  script("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>");
  json j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"tool_choice", "required"}, {"max_tokens", 60}})));
  const json& calls = j["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 1u) << j.dump();
  EXPECT_EQ(calls[0]["function"]["name"], "get_time");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json::parse(R"({"zone":"UTC"})"));
  expect_idle();
}

TEST_F(ApiTest, ParallelToolCallsFalseKeepsOneCall) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  const std::string one = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>";
  script(one + "\n" + one);
  json j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"max_tokens", 100}})));
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 2u);
  j = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"parallel_tool_calls", false}, {"max_tokens", 100}})));
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  // Forced and not parallel: the grammar allows exactly one call, then the end.
  j = ok_json(post("/v1/chat/completions",
                   chat({{"tools", weather_tools()}, {"tool_choice", "required"}, {"parallel_tool_calls", false}, {"max_tokens", 100}})));
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_LT(j["usage"]["completion_tokens"].get<int>(), static_cast<int>(engine_.script.size()));
  expect_idle();
}

// --- logits processing and output fields ---

TEST_F(ApiTest, LogitBiasAllowedIdsMinTokensBadWords) {
  start();
  script("hello there");
  const TokenId x = tokenizer_->encode("x", false).front();
  json j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 4}, {"logit_bias", {{std::to_string(x), 100}}},
                                            {"return_token_ids", true}}));
  EXPECT_EQ(j["choices"][0]["token_ids"], json::array({x, x, x, x}));
  EXPECT_EQ(j["choices"][0]["text"], "xxxx");
  const TokenId a = tokenizer_->encode("a", false).front(), b = tokenizer_->encode("b", false).front();
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 5}, {"allowed_token_ids", {a, b}}}));
  for (char c : j["choices"][0]["text"].get<std::string>()) EXPECT_TRUE(c == 'a' || c == 'b') << j.dump();
  // The script ends after one token; min_tokens keeps the end tokens away until 4.
  engine_.script = {x, kImEnd};
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 8}, {"min_tokens", 4}}));
  EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 4) << j.dump();
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 8}}));
  EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), 2) << j.dump();
  script("foo bar baz");
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 8}, {"bad_words", {"bar"}}}));
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>().find("bar"), std::string::npos) << j.dump();
  json e = error_of(post("/v1/completions", {{"prompt", "p"}, {"logit_bias", {{"99999999", 1}}}}));
  EXPECT_EQ(e["param"], "logit_bias");
  e = error_of(post("/v1/completions", {{"prompt", "p"}, {"logit_bias", {{"5", 101}}}}));
  EXPECT_EQ(e["param"], "logit_bias");
  e = error_of(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 2}, {"min_tokens", 3}}));
  EXPECT_EQ(e["param"], "min_tokens");
  expect_idle();
}

TEST_F(ApiTest, StopTrimStopRegexSkipSpecialTokenIds) {
  start();
  script("hello world and more", false);
  json j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "world"}}));
  EXPECT_EQ(j["choices"][0]["text"], "hello ");
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "world"}, {"no_stop_trim", true}}));
  EXPECT_EQ(j["choices"][0]["text"], "hello world");
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "world"}, {"include_stop_str_in_output", true}}));
  EXPECT_EQ(j["choices"][0]["text"], "hello world");
  script("abc 123 def", false);
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop_regex", "[0-9]{2}"}}));
  EXPECT_EQ(j["choices"][0]["text"], "abc 12");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["matched_stop"], "[0-9]{2}");
  // The output ends while the stop matcher holds its tail back ("2" could begin "2 end"): the
  // regex still sees it, streamed or not.
  script("abc 12", false);
  // A completion's text (put together when streamed) and its last body or chunk.
  auto text_and_last = [](const testing::HttpResult& r, bool stream) {
    std::pair<std::string, json> out;
    if (!stream) {
      out.second = json::parse(r.body);
      out.first = out.second["choices"][0]["text"];
      return out;
    }
    for (const auto& d : sse_data(r.body)) {
      if (d == "[DONE]") continue;
      out.second = json::parse(d);
      out.first += out.second["choices"][0]["text"].get<std::string>();
    }
    return out;
  };
  for (bool stream : {false, true}) {
    auto r = post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "2 end"}, {"stop_regex", "[0-9]{2}"},
                                      {"stream", stream}});
    ASSERT_EQ(r.status, 200) << r.body;
    const auto [text, last] = text_and_last(r, stream);
    EXPECT_EQ(text, "abc 12") << stream;
    EXPECT_EQ(last["choices"][0]["finish_reason"], "stop") << stream;
    EXPECT_EQ(last["choices"][0]["matched_stop"], "[0-9]{2}") << stream;
  }
  // ... and cuts it where it ends: "ab" is held ("abc" could follow), "a" matched.
  script("xab", false);
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "abc"}, {"stop_regex", "a"}}));
  EXPECT_EQ(j["choices"][0]["text"], "xa");
  EXPECT_EQ(j["choices"][0]["matched_stop"], "a");
  // Found by review (stop 55): with min_tokens, the first token's "x", held back by the stop
  // matcher ("xyz" could follow), came out later and the regex matched it there.
  ASSERT_EQ(tokenizer_->decode(std::vector<TokenId>{87, 64}, false), "xa");
  for (bool stream : {false, true}) {
    engine_.script = {87, 64, 87, 64};  // x a x a
    auto r = post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop", "xyz"}, {"stop_regex", "x"},
                                      {"min_tokens", 1}, {"stream", stream}});
    ASSERT_EQ(r.status, 200) << r.body;
    const auto [text, last] = text_and_last(r, stream);
    EXPECT_EQ(text, "xax") << stream;
    EXPECT_EQ(last["choices"][0]["matched_stop"], "x") << stream;
  }
  EXPECT_EQ(error_of(post("/v1/completions", {{"prompt", "p"}, {"stop_regex", "a(?=b)"}}))["param"], "stop_regex");
  // Anchors (stop 55; they were refused with the position in a pattern the user never wrote): '$'
  // is where the output ends so far, as any match; '^' anchors at the output's start.
  script("xab ab", false);
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop_regex", "b$"}}));
  EXPECT_EQ(j["choices"][0]["text"], "xab");
  EXPECT_EQ(j["choices"][0]["matched_stop"], "b$");
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop_regex", "^ab"}}));
  EXPECT_EQ(j["choices"][0]["text"], "xab ab");  // "ab" occurs, but not at the start
  EXPECT_NE(j["choices"][0]["matched_stop"], "^ab") << j.dump();
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stop_regex", "^xa"}}));
  EXPECT_EQ(j["choices"][0]["text"], "xa");
  // A special token in the middle of the output: hidden by default, visible with false.
  engine_.script = tokenizer_->encode("ab", true);
  engine_.script.push_back(kImStart);
  for (TokenId id : tokenizer_->encode("cd", true)) engine_.script.push_back(id);
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}}));
  EXPECT_EQ(j["choices"][0]["text"], "abcd");
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"skip_special_tokens", false}}));
  EXPECT_EQ(j["choices"][0]["text"], "ab<|im_start|>cd");
  j = ok_json(post("/v1/chat/completions", chat({{"skip_special_tokens", false}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "ab<|im_start|>cd");
  j = ok_json(post("/v1/chat/completions", chat()));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "abcd");
  // Token ids.
  j = ok_json(post("/v1/completions", {{"prompt", "p q"}, {"max_tokens", 20}, {"return_token_ids", true}}));
  EXPECT_EQ(j["prompt_token_ids"], tokenizer_->encode("p q", true));
  EXPECT_EQ(j["choices"][0]["token_ids"], engine_.script);
  j = ok_json(post("/v1/completions", {{"prompt", "p q"}, {"max_tokens", 20}, {"return_prompt_token_ids", true}}));
  EXPECT_EQ(j["prompt_token_ids"], tokenizer_->encode("p q", true));
  EXPECT_FALSE(j["choices"][0].contains("token_ids"));
  expect_idle();
}

// continue_final_message with a template that trims the message (Qwen3.6's `|trim`): the text is
// found without its outer whitespace, as transformers (vLLM) finds it; it was a 400 before.
TEST_F(ApiTest, ContinueFinalMessageThroughATrimmingTemplate) {
  auto tmpl = ChatTemplate::load(kModelDir, std::filesystem::path(DELTASERVE_SOURCE_DIR) /
                                                "tests/fixtures/qwen3.6-chat_template.jinja");
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  const ChatTemplate& t = *tmpl;
  start({}, [&t](const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                 const nlohmann::ordered_json& kwargs) {
    ChatTemplate::Input in;
    in.messages = messages;
    in.tools = tools;
    in.kwargs = kwargs;
    return t.render(in);
  });
  script("lo");
  // "m", "e", "end", "|": also inside the closing "<|im_end|>", where a plain rfind cut (stop 56).
  for (const char* content : {"Hel ", "```python\n", "  Indented", "Hel", "m", "e", "end", "|"}) {
    ok_json(post("/v1/chat/completions",
                 {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", content}}})},
                  {"continue_final_message", true}, {"add_generation_prompt", false}, {"max_tokens", 4}}));
    const std::string prompt = tokenizer_->decode(engine_.submitted().back().prompt, false);
    std::string want = content;
    want = want.substr(want.find_first_not_of(" \n"));
    want = want.substr(0, want.find_last_not_of(" \n") + 1);
    ASSERT_GE(prompt.size(), want.size());
    EXPECT_EQ(prompt.substr(prompt.size() - want.size()), want) << prompt;
  }
  expect_idle();
}

TEST_F(ApiTest, PromptFieldsAndValidation) {
  start();
  script("lo");
  json j = ok_json(post("/v1/chat/completions",
                        {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hel"}}})},
                         {"continue_final_message", true}, {"max_tokens", 4}}));
  auto sub = engine_.submitted();
  std::string prompt = tokenizer_->decode(sub.back().prompt, false);
  EXPECT_EQ(prompt.substr(prompt.size() - 3), "Hel") << prompt;
  json e = error_of(post("/v1/chat/completions", chat({{"continue_final_message", true}})));
  EXPECT_EQ(e["param"], "continue_final_message");
  ok_json(post("/v1/chat/completions", chat({{"add_generation_prompt", false}})));
  prompt = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_EQ(prompt.find("<|im_start|>assistant"), std::string::npos) << prompt;
  ok_json(post("/v1/completions", {{"prompt", "one two three four five"}, {"truncate_prompt_tokens", 2}}));
  EXPECT_EQ(engine_.submitted().back().prompt.size(), 2u);
  EXPECT_EQ(error_of(post("/v1/chat/completions", chat({{"reasoning_effort", "banana"}})))["param"], "reasoning_effort");
  ok_json(post("/v1/chat/completions", chat({{"reasoning_effort", "low"}})));
  EXPECT_EQ(error_of(post("/v1/chat/completions", chat({{"reasoning", {{"effort", "max"}}}})))["param"], "reasoning.effort");
  e = error_of(post("/v1/chat/completions", chat({{"frobnicate", 1}})));
  EXPECT_EQ(e["param"], "frobnicate");
  EXPECT_EQ(e["code"], "unrecognized_field");
  e = error_of(post("/v1/completions", {{"prompt", "x"}, {"lora_path", "/adapters/missing"}}));
  EXPECT_EQ(e["param"], "lora_path");
  EXPECT_EQ(error_of(post("/v1/chat/completions", chat({{"tool_choice", "maybe"}, {"tools", weather_tools()}})))["param"],
            "tool_choice");
  expect_idle();
}

TEST_F(ApiTest, AbortByRid) {
  start();
  engine_.tick = std::chrono::milliseconds(20);
  script(std::string(200, 'a'), false);
  testing::HttpResult r;
  std::thread t([&] { r = post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 150}, {"rid", "job-7"}}); });
  ASSERT_TRUE(wait_until([&] { return engine_.n_live() == 1; }));
  // A second request with the rid in flight is refused (an abort by rid would cancel both).
  json dup = error_of(post("/generate", {{"text", "q"}, {"rid", "job-7"}}));
  EXPECT_EQ(dup["param"], "rid");
  EXPECT_EQ(engine_.n_live(), 1);
  auto a = ok_json(post("/abort_request", {{"rid", "job-7"}}));
  EXPECT_EQ(a["aborted"], 1);
  t.join();
  json j = ok_json(r);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "abort");
  // Once it is over, the rid is free again.
  engine_.tick = std::chrono::milliseconds(1);
  ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 2}, {"rid", "job-7"}}));
  EXPECT_EQ(ok_json(post("/abort_request", {{"rid", "nobody"}}))["aborted"], 0);
  EXPECT_EQ(error_of(post("/abort_request", json::object()))["param"], "rid");
  EXPECT_EQ(error_of(post("/abort_request", {{"rid", "x"}, {"abort_message", "maintenance"}}))["param"], "abort_message");
  expect_idle();
}

// --- SGLang native routes ---

TEST_F(ApiTest, GenerateNative) {
  start();
  script("one two three four", false);
  ASSERT_GE(engine_.script.size(), 4u);
  const std::vector<TokenId> first3(engine_.script.begin(), engine_.script.begin() + 3);
  json j = ok_json(post("/generate", {{"text", "Hello"}, {"sampling_params", {{"max_new_tokens", 3}, {"temperature", 0}}}}));
  EXPECT_EQ(j["text"], tokenizer_->decode(first3, false));
  EXPECT_EQ(j["output_ids"], first3);
  EXPECT_EQ(j["meta_info"]["completion_tokens"], 3);
  EXPECT_EQ(j["meta_info"]["prompt_tokens"], tokenizer_->encode("Hello", true).size());
  EXPECT_EQ(j["meta_info"]["finish_reason"], json({{"type", "length"}, {"length", 3}}));
  // input_ids, a batch: a list back.
  j = ok_json(post("/generate", {{"input_ids", {{1, 2}, {3}}}, {"sampling_params", {{"max_new_tokens", 2}}}}));
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["meta_info"]["prompt_tokens"], 1);
  // Default max_new_tokens 128 (SGLang) and a stop token.
  script("xy");
  j = ok_json(post("/generate", {{"text", "Hello"}}));
  EXPECT_EQ(j["text"], "xy");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(j["meta_info"]["finish_reason"]["matched"], kImEnd);
  EXPECT_EQ(engine_.submitted().back().sampling.max_tokens, std::min<int>(128, static_cast<int>(engine_.context - 1)));
  // Constraints and logprobs in sampling_params / top level.
  script("123", false);
  j = ok_json(post("/generate", {{"text", "n="}, {"sampling_params", {{"max_new_tokens", 3}, {"regex", "[0-9]+"}}},
                                 {"return_logprob", true}, {"top_logprobs_num", 2}, {"return_text_in_logprobs", true}}));
  EXPECT_EQ(j["text"], "123");
  ASSERT_EQ(j["meta_info"]["output_token_logprobs"].size(), 3u);
  EXPECT_EQ(j["meta_info"]["output_token_logprobs"][0][2], "1");
  EXPECT_EQ(j["meta_info"]["output_top_logprobs"][0].size(), 2u);
  EXPECT_EQ(error_of(post("/generate", {{"text", "x"}, {"input_ids", {1}}}))["param"], "input_ids");
  EXPECT_EQ(error_of(post("/generate", {{"text", "x"}, {"sampling_params", {{"max_new_tokens", 0}}}}))["param"],
            "sampling_params.max_new_tokens");
  EXPECT_EQ(error_of(post("/generate", {{"text", "x"}, {"sampling_params", {{"bogus", 1}}}}))["param"], "sampling_params.bogus");
  EXPECT_EQ(error_of(post("/generate", {{"text", "x"}, {"lora_path", "a"}}))["param"], "lora_path");
  // Later checks name /generate's fields too (stop 55: they named max_tokens, min_new_tokens and
  // logit_bias without their sampling_params).
  json e = error_of(post("/generate", {{"text", "x"}, {"sampling_params", {{"max_new_tokens", 1000000}}}}));
  EXPECT_EQ(e["param"], "sampling_params.max_new_tokens") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("max_new_tokens is 1000000"), std::string::npos) << e.dump();
  e = error_of(post("/generate", {{"text", "x"}, {"sampling_params", {{"max_new_tokens", 2}, {"min_new_tokens", 5}}}}));
  EXPECT_EQ(e["param"], "sampling_params.min_new_tokens") << e.dump();
  EXPECT_EQ(e["message"].get<std::string>().find("max_tokens"), std::string::npos) << e.dump();
  expect_idle();
}

TEST_F(ApiTest, GenerateStreamsCumulativeTextAsBenchServingReadsIt) {
  start();
  script("one two three four five", false);
  ASSERT_GE(engine_.script.size(), 4u);
  const std::string want = tokenizer_->decode(std::vector<TokenId>(engine_.script.begin(), engine_.script.begin() + 4), false);
  // The payload `python -m sglang.bench_serving --backend sglang` sends.
  json payload = {{"text", "Hello"},
                  {"sampling_params", {{"temperature", 0.0}, {"max_new_tokens", 4}, {"ignore_eos", true}}},
                  {"stream", true},
                  {"lora_path", nullptr},
                  {"return_logprob", false},
                  {"logprob_start_len", -1}};
  auto r = post("/generate", payload);
  ASSERT_EQ(r.status, 200) << r.body;
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string prev;
  int last_tokens = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    const std::string text = e["text"];
    EXPECT_EQ(text.compare(0, prev.size(), prev), 0) << "not cumulative: " << text;
    EXPECT_GE(e["meta_info"]["completion_tokens"].get<int>(), last_tokens);
    last_tokens = e["meta_info"]["completion_tokens"];
    prev = text;
  }
  EXPECT_EQ(prev, want);
  EXPECT_EQ(last_tokens, 4);
  EXPECT_EQ(json::parse(events[events.size() - 2])["meta_info"]["finish_reason"]["type"], "length");
  expect_idle();
}

// A streamed completion with return_token_ids carries every token id, also those of steps whose
// text is held back (here: "world" might start the stop string "world!"), so a client such as
// `deltaserve bench` counts every token and times every step.
TEST_F(ApiTest, StreamedCompletionTokenIdsIncludeStepsWithHeldBackText) {
  start();
  script("hello world and more", false);
  auto r = post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 20}, {"stream", true}, {"stop", "world!"},
                                    {"return_token_ids", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<TokenId> ids;
  std::string text;
  int with_ids = 0, empty_text_with_ids = 0, usage_tokens = -1;
  for (const auto& d : sse_data(r.body)) {
    if (d == "[DONE]") continue;
    json e = json::parse(d);
    if (e.contains("usage") && e["usage"].is_object()) usage_tokens = e["usage"]["completion_tokens"];
    for (const auto& c : e["choices"]) {
      text += c["text"].get<std::string>();
      if (!c.contains("token_ids") || c["token_ids"].empty()) continue;
      ++with_ids;
      if (c["text"].get<std::string>().empty()) ++empty_text_with_ids;
      for (const auto& id : c["token_ids"]) ids.push_back(id.get<TokenId>());
    }
  }
  EXPECT_EQ(text, "hello world and more");
  EXPECT_EQ(ids, engine_.script);
  EXPECT_EQ(usage_tokens, static_cast<int>(engine_.script.size()));
  EXPECT_GE(empty_text_with_ids, 1) << "no step's text was held back: the case is not exercised";
  EXPECT_GE(with_ids, static_cast<int>(engine_.script.size()) - 1);
  expect_idle();
}

// Found by review (stop 53), as vLLM does them: /tokenize reads special tokens whatever
// add_special_tokens says (it adds BOS/EOS, none here) and token_strs are convert_ids_to_tokens'
// strings ("Ġworld"), not decoded text (pieces of a character came back as U+FFFD); a batch
// /detokenize takes lists only; bad_words drops leading blanks, reads special tokens, and bans the
// word with and without a space before it.
TEST_F(ApiTest, TokenizeStringsAndBadWordsAsVllm) {
  start();
  const TokenId im_start = *tokenizer_->token_id("<|im_start|>");
  json j = ok_json(post("/tokenize", {{"prompt", "<|im_start|>user"}, {"add_special_tokens", false}}));
  EXPECT_EQ(j["tokens"][0], im_start) << j.dump();
  j = ok_json(post("/tokenize", {{"prompt", " world \xf0\x9f\x9a\x80"}, {"return_token_strs", true}}));
  std::string joined;
  for (const auto& t : j["tokens"]) {
    const std::string str = tokenizer_->token_string(t.get<TokenId>());
    EXPECT_EQ(tokenizer_->token_id(str), t.get<TokenId>()) << str;  // each string names its token
    joined += str;
  }
  std::string want;
  for (const auto& t : j["token_strs"]) want += t.get<std::string>();
  EXPECT_EQ(want, joined);
  EXPECT_EQ(j["token_strs"][0].get<std::string>().rfind("\xc4\xa0", 0), 0u) << j.dump();  // "Ġ..."
  EXPECT_EQ(error_of(post("/detokenize", {{"tokens", json::array({json::array({1}), json::object({{"a", 1}})})}}))["param"],
            "tokens");
  EXPECT_EQ(error_of(post("/detokenize", {{"tokens", json::array({json::array({1}), 11})}}))["param"], "tokens");
  // bad_words: " return" also bans "return"; "<|im_end|>" is the special token.
  const auto ret = tokenizer_->encode("return", false), sp_ret = tokenizer_->encode(" return", false);
  ASSERT_EQ(ret.size(), 1u);
  ASSERT_EQ(sp_ret.size(), 1u);
  engine_.script = {ret[0], sp_ret[0], kImEnd, ret[0]};
  j = ok_json(post("/v1/completions", {{"prompt", "p"}, {"max_tokens", 4}, {"bad_words", {" return", "<|im_end|>"}},
                                       {"return_token_ids", true}, {"ignore_eos", true}}));
  for (const auto& t : j["choices"][0]["token_ids"]) {
    EXPECT_NE(t, ret[0]) << j.dump();
    EXPECT_NE(t, sp_ret[0]) << j.dump();
    EXPECT_NE(t, kImEnd) << j.dump();
  }
  expect_idle();
}

TEST_F(ApiTest, TokenizeDetokenizeInfoLoadFlushHealth) {
  start();
  for (const char* path : {"/tokenize", "/v1/tokenize"}) {
    json j = ok_json(post(path, {{"prompt", "def f(x):"}}));
    EXPECT_EQ(j["tokens"], tokenizer_->encode("def f(x):", true));
    EXPECT_EQ(j["count"], j["tokens"].size());
    EXPECT_EQ(j["max_model_len"], engine_.context);
  }
  json j = ok_json(post("/tokenize", {{"prompt", {"a", "bb"}}}));
  EXPECT_EQ(j["tokens"].size(), 2u);
  EXPECT_FALSE(j.contains("token_strs"));
  // A batch with return_token_strs: a list per prompt (it was dropped); chat fields without
  // messages are refused, not ignored.
  j = ok_json(post("/tokenize", {{"prompt", {"a", "bb"}}, {"return_token_strs", true}}));
  ASSERT_EQ(j["token_strs"].size(), 2u);
  EXPECT_EQ(j["token_strs"][1].size(), j["tokens"][1].size());
  EXPECT_EQ(error_of(post("/tokenize", {{"prompt", "a"}, {"add_generation_prompt", false}}))["param"], "add_generation_prompt");
  // Both prompt and messages: refused (the prompt was ignored).
  EXPECT_EQ(error_of(post("/tokenize", {{"prompt", "a"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}))["param"],
            "prompt");
  j = ok_json(post("/tokenize", {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"return_token_strs", true}}));
  const json msgs = json::parse(R"([{"role":"user","content":"hi"}])");
  EXPECT_EQ(j["tokens"], tokenizer_->encode(*chatml(msgs, nullptr, json::object()), true));
  EXPECT_EQ(j["token_strs"].size(), j["tokens"].size());
  for (const char* path : {"/detokenize", "/v1/detokenize"}) {
    j = ok_json(post(path, {{"tokens", tokenizer_->encode("def f(x):", true)}}));
    EXPECT_EQ(j["text"], "def f(x):");
  }
  EXPECT_EQ(error_of(post("/detokenize", {{"tokens", {999999}}}))["param"], "tokens");
  j = ok_json(http(port_, "GET", "/get_model_info"));
  EXPECT_EQ(j["is_generation"], true);
  EXPECT_EQ(j["served_model_name"], "tiny");
  j = ok_json(http(port_, "GET", "/get_load"));
  ASSERT_TRUE(j.is_array());
  EXPECT_EQ(j[0]["num_reqs"], 0);
  j = ok_json(post("/flush_cache", json::object()));
  EXPECT_EQ(j["success"], true);
  EXPECT_EQ(engine_.flushes, 1) << "/flush_cache asks the engine";
  EXPECT_EQ(http(port_, "GET", "/health_generate").status, 200);
  ASSERT_FALSE(engine_.submitted().empty());
  EXPECT_EQ(engine_.submitted().back().sampling.max_tokens, 1);
  engine_.reject_kind = EngineErrorKind::Internal;
  EXPECT_EQ(http(port_, "GET", "/health_generate").status, 503);
  engine_.reject_kind = EngineErrorKind::None;
  expect_idle();
}

// /health_generate as SGLang's: a busy engine (one running slot, taken by a long request) answers
// 200 at its next step, not once the long request ends; the probe's own queued generation is
// cancelled. (It used to wait behind every request queued before it.)
TEST_F(ApiTest, HealthGenerateAnswersOnProgressBehindALongRequest) {
  engine_.context = 8192;
  start();
  engine_.max_running = 1;
  engine_.tick = std::chrono::milliseconds(5);
  engine_.script = std::vector<TokenId>(3000, 42);  // ~15 s at 5 ms a token
  int long_status = 0;
  std::thread client([&] {
    long_status = post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3000}, {"ignore_eos", true}}).status;
  });
  if (!wait_until([&] { return engine_.n_live() == 1; })) {
    client.join();
    FAIL() << "the long request did not start: " << long_status;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = http(port_, "GET", "/health_generate");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_LT(took, 3.0);
  const auto probe = engine_.submitted().back();
  EXPECT_EQ(probe.sampling.max_tokens, 1);
  EXPECT_TRUE(wait_until([&] { return engine_.cancelled().count(probe.id) > 0; })) << "the probe's generation stays queued";
  server_->abort_all();
  client.join();
  expect_idle();
}

// A hung engine (no step at all): 503 after SGLANG_HEALTH_CHECK_TIMEOUT (SGLang's 20 s by default),
// not a probe that never answers (with --watchdog-timeout 0 nothing else would end it).
TEST_F(ApiTest, HealthGenerateTimesOutOnAHungEngine) {
  ::setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "0.5", 1);
  start();
  engine_.hang = true;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = http(port_, "GET", "/health_generate");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::unsetenv("SGLANG_HEALTH_CHECK_TIMEOUT");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("engine_unhealthy"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("SGLANG_HEALTH_CHECK_TIMEOUT"), std::string::npos) << r.body;
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 5.0);
  const auto probe = engine_.submitted().back();
  EXPECT_TRUE(wait_until([&] { return engine_.cancelled().count(probe.id) > 0; }));
  engine_.hang = false;
  expect_idle();
}

// SGLang's API-key middleware lets every /health* path through: GET /health_generate needs no key
// (a cluster's readiness probe sends none); other methods and the other SGLang routes still do.
TEST_F(ApiTest, HealthGenerateNeedsNoApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  EXPECT_EQ(http(port_, "GET", "/health_generate").status, 200);
  EXPECT_EQ(http(port_, "HEAD", "/health_generate").status, 200);
  EXPECT_EQ(http(port_, "POST", "/health_generate", "{}").status, 401);
  EXPECT_EQ(http(port_, "GET", "/get_load").status, 401);
  EXPECT_EQ(http(port_, "GET", "/get_load", "", {"Authorization: Bearer sekret"}).status, 200);
}

// --dp-size N: /get_load has one entry per replica with its dp_rank (it summed them under rank 0),
// and /get_server_info's internal_states one per scheduler, as SGLang's.
TEST_F(ApiTest, GetLoadAndInternalStatesArePerReplica) {
  EngineStats a, b;
  a.requests_running = 2;
  a.requests_waiting = 1;
  a.kv_tokens_used = 100;
  a.spec_verify_steps_total = 10;
  a.spec_accepted_tokens_total = 15;
  b.requests_running = 0;
  b.requests_waiting = 4;
  b.kv_tokens_used = 7;
  engine_.replicas = {a, b};
  start();
  const json load = ok_json(http(port_, "GET", "/get_load"));
  ASSERT_EQ(load.size(), 2u) << load.dump();
  EXPECT_EQ(load[0]["dp_rank"], 0);
  EXPECT_EQ(load[0]["num_reqs"], 3);
  EXPECT_EQ(load[0]["num_running_reqs"], 2);
  EXPECT_EQ(load[0]["num_waiting_reqs"], 1);
  EXPECT_EQ(load[0]["num_tokens"], 100);
  EXPECT_EQ(load[1]["dp_rank"], 1);
  EXPECT_EQ(load[1]["num_reqs"], 4);
  EXPECT_EQ(load[1]["num_running_reqs"], 0);
  EXPECT_EQ(load[1]["num_tokens"], 7);
  const json info = ok_json(http(port_, "GET", "/get_server_info"));
  ASSERT_EQ(info["internal_states"].size(), 2u) << info.dump();
  EXPECT_DOUBLE_EQ(info["internal_states"][0]["avg_spec_accept_length"].get<double>(), 2.5);
  EXPECT_TRUE(info["internal_states"][1]["avg_spec_accept_length"].is_null());
  engine_.replicas.clear();
  EXPECT_EQ(ok_json(http(port_, "GET", "/get_load")).size(), 1u);  // one engine: one entry, rank 0
  EXPECT_EQ(ok_json(http(port_, "GET", "/get_server_info"))["internal_states"].size(), 1u);
}

TEST_F(ApiTest, ModelIdsWithSlashes) {
  ServerConfig cfg;
  cfg.served_model_name = "Qwen/Qwen3.6-27B";
  start(cfg);
  EXPECT_EQ(ok_json(http(port_, "GET", "/v1/models/Qwen%2FQwen3.6-27B"))["id"], "Qwen/Qwen3.6-27B");
  EXPECT_EQ(ok_json(http(port_, "GET", "/v1/models/Qwen/Qwen3.6-27B"))["id"], "Qwen/Qwen3.6-27B");
  EXPECT_EQ(http(port_, "GET", "/v1/models/Qwen%2Fother").status, 404);
  EXPECT_EQ(http(port_, "GET", "/v1/models/bad%zz").status, 400);
}

TEST_F(ApiTest, Cors) {
  ServerConfig cfg;
  cfg.enable_cors = true;
  cfg.allowed_origins = {"https://app.example"};
  start(cfg);
  script("ok");
  auto r = http(port_, "OPTIONS", "/v1/chat/completions", "",
                {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                 "Access-Control-Request-Headers: content-type, authorization"});
  EXPECT_EQ(r.status, 204);
  EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
  EXPECT_NE(r.headers["access-control-allow-methods"].find("POST"), std::string::npos);
  EXPECT_EQ(r.headers["access-control-allow-headers"], "content-type, authorization");
  r = post("/v1/chat/completions", chat(), {"Origin: https://app.example"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
  r = post("/v1/chat/completions", chat({{"stream", true}}), {"Origin: https://app.example"});
  EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
  r = post("/v1/chat/completions", chat(), {"Origin: https://evil.example"});
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
  EXPECT_EQ(http(port_, "OPTIONS", "/v1/models", "", {"Origin: https://evil.example"}).status, 403);
  expect_idle();
}

TEST_F(ApiTest, CorsOffByDefault) {
  start();
  EXPECT_EQ(http(port_, "OPTIONS", "/v1/chat/completions", "", {"Origin: https://app.example"}).status, 405);
  auto r = http(port_, "GET", "/v1/models", "", {"Origin: https://app.example"});
  EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
}

TEST_F(ApiTest, SglangMetricNames) {
  start();
  script("ok");
  ok_json(post("/v1/completions", {{"prompt", "p"}}));
  auto m = http(port_, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  for (const char* name : {"sglang:num_running_reqs{model_name=\"tiny\"}", "sglang:num_queue_reqs{", "sglang:token_usage{",
                           "sglang:gen_throughput{", "sglang:prompt_tokens_total{", "sglang:generation_tokens_total{",
                           "sglang:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=",
                           "sglang:e2e_request_latency_seconds_count{model_name=\"tiny\"}",
                           "sglang:inter_token_latency_seconds_sum{", "deltaserve_requests_running"}) {
    EXPECT_NE(m.body.find(name), std::string::npos) << name;
  }
  // Found by review (stop 55). Bucket bounds as Prometheus's Python client writes them (le is
  // matched as a string: "0.10000000000000001" matched no le="0.1" selector).
  EXPECT_NE(m.body.find("sglang:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.1\"}"), std::string::npos);
  EXPECT_NE(m.body.find("sglang:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"1.0\"}"), std::string::npos);
  EXPECT_EQ(m.body.find("0000000000"), std::string::npos);
  // num_requests_total counts finished generations, not HTTP requests (a scrape counted itself).
  auto total = [&] {
    const std::string body = http(port_, "GET", "/metrics").body;
    const std::string key = "sglang:num_requests_total{model_name=\"tiny\"} ";
    const std::size_t at = body.find(key);
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + key.size()));
  };
  EXPECT_EQ(total(), 1.0);
  EXPECT_EQ(total(), 1.0);
  ok_json(post("/v1/completions", {{"prompt", "p"}, {"n", 2}}));
  EXPECT_TRUE(wait_until([&] { return total() == 3.0; })) << total();
  // /get_server_info carries SGLang's internal_states (its bench_serving reads
  // internal_states[0].avg_spec_accept_length after every run).
  const json info = ok_json(http(port_, "GET", "/get_server_info"));
  ASSERT_TRUE(info.contains("internal_states")) << info.dump();
  ASSERT_EQ(info["internal_states"].size(), 1u);
  EXPECT_TRUE(info["internal_states"][0].contains("avg_spec_accept_length"));
}

// --- the Responses API ---

TEST_F(ApiTest, ResponsesCreateRetrieveDelete) {
  start();
  script("Hi there");
  json j = ok_json(post("/v1/responses", {{"model", "tiny"}, {"input", "hello"}, {"instructions", "Be brief."}, {"max_output_tokens", 20}}));
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  const std::string id = j["id"];
  ASSERT_EQ(j["output"].size(), 1u);
  EXPECT_EQ(j["output"][0]["type"], "message");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "Hi there");
  EXPECT_EQ(j["usage"]["output_tokens"], static_cast<int>(engine_.script.size()));
  const std::string prompt = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_NE(prompt.find("<|im_start|>system\nBe brief.<|im_end|>"), std::string::npos) << prompt;
  json got = ok_json(http(port_, "GET", "/v1/responses/" + id));
  EXPECT_EQ(got["id"], id);
  EXPECT_EQ(got["output"], j["output"]);
  // previous_response_id replays the conversation.
  script("Bye");
  j = ok_json(post("/v1/responses", {{"input", "again"}, {"previous_response_id", id}}));
  const std::string prompt2 = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_NE(prompt2.find("hello"), std::string::npos);
  EXPECT_NE(prompt2.find("Hi there"), std::string::npos);
  EXPECT_NE(prompt2.find("again"), std::string::npos);
  EXPECT_EQ(ok_json(http(port_, "DELETE", "/v1/responses/" + id))["deleted"], true);
  EXPECT_EQ(http(port_, "GET", "/v1/responses/" + id).status, 404);
  // store false: not kept.
  j = ok_json(post("/v1/responses", {{"input", "x"}, {"store", false}}));
  EXPECT_EQ(http(port_, "GET", "/v1/responses/" + j["id"].get<std::string>()).status, 404);
  EXPECT_EQ(j["store"], false);
  // store null is the default (kept); temperature and top_p null, the defaults, echoed as used.
  j = ok_json(post("/v1/responses", {{"input", "x"}, {"store", nullptr}, {"temperature", nullptr}, {"top_p", nullptr}}));
  EXPECT_EQ(j["store"], true);
  EXPECT_TRUE(j["temperature"].is_number()) << j.dump();
  EXPECT_TRUE(j["top_p"].is_number()) << j.dump();
  EXPECT_EQ(http(port_, "GET", "/v1/responses/" + j["id"].get<std::string>()).status, 200);
  EXPECT_EQ(error_of(post("/v1/responses", {{"input", "x"}, {"text", {{"format", {{"type", "bogus"}}}}}}))["param"], "text.format.type");
  EXPECT_EQ(error_of(post("/v1/responses", {{"input", "x"}, {"background", true}}))["param"], "background");
  expect_idle();
}

TEST_F(ApiTest, ResponsesStreamingEvents) {
  start();
  script("Hi there");
  auto r = post("/v1/responses", {{"input", "hello"}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> types;
  std::string text;
  int seq = 0;
  for (const auto& d : sse_data(r.body)) {
    json e = json::parse(d);
    types.push_back(e["type"]);
    EXPECT_EQ(e["sequence_number"], seq++);
    if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
  }
  EXPECT_EQ(text, "Hi there");
  ASSERT_GE(types.size(), 8u);
  EXPECT_EQ(types[0], "response.created");
  EXPECT_EQ(types[1], "response.in_progress");
  EXPECT_EQ(types[2], "response.output_item.added");
  EXPECT_EQ(types[3], "response.content_part.added");
  EXPECT_EQ(types.back(), "response.completed");
  EXPECT_NE(std::find(types.begin(), types.end(), "response.output_text.done"), types.end());
  EXPECT_NE(std::find(types.begin(), types.end(), "response.output_item.done"), types.end());
  EXPECT_NE(r.body.find("event: response.completed\n"), std::string::npos);
  expect_idle();
}

TEST_F(ApiTest, ResponsesWithForcedToolCall) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  script("<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>");
  json tools = json::parse(R"([{"type":"function","name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}])");
  json j = ok_json(post("/v1/responses", {{"input", "time?"}, {"tools", tools}, {"tool_choice", "required"}, {"max_output_tokens", 60}}));
  ASSERT_EQ(j["output"].size(), 1u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "function_call");
  EXPECT_EQ(j["output"][0]["name"], "get_time");
  EXPECT_EQ(json::parse(j["output"][0]["arguments"].get<std::string>()), json::parse(R"({"zone":"CET"})"));
  // The tool result goes back as input items.
  json input = json::array({{{"role", "user"}, {"content", "time?"}},
                            {{"type", "function_call"}, {"call_id", j["output"][0]["call_id"]}, {"name", "get_time"}, {"arguments", "{\"zone\": \"CET\"}"}},
                            {{"type", "function_call_output"}, {"call_id", j["output"][0]["call_id"]}, {"output", "12:00"}}});
  script("It is noon.");
  j = ok_json(post("/v1/responses", {{"input", input}, {"tools", tools}}));
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "It is noon.");
  expect_idle();
}

// Found by review (stop 53). A streamed response is stored as streamed (the store rebuilt it and
// dropped a blank message); text after a tool call is a second message with its own id; a
// function_call_output given as text parts reaches the model as text, not JSON; an assistant
// message and the calls after it are one turn; previous_response_id keeps the input's system
// messages (only the earlier instructions go); errors of later checks name max_output_tokens;
// /v1/responses/{id}/input_items is refused by name.
TEST_F(ApiTest, ResponsesStoredAsStreamedAndInputItemsAsChatTurns) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  json tools = json::parse(R"([{"type":"function","name":"f","parameters":{"type":"object","properties":{"d":{"type":"string"}},"required":["d"]}}])");
  script("Let me see. <tool_call>\n<function=f>\n<parameter=d>\nx\n</parameter>\n</function>\n</tool_call> and more");
  auto r = post("/v1/responses", {{"input", "go"}, {"tools", tools}, {"stream", true}, {"max_output_tokens", 80}});
  ASSERT_EQ(r.status, 200) << r.body;
  json completed;
  for (const auto& d : sse_data(r.body)) {
    json e = json::parse(d);
    if (e["type"] == "response.completed") completed = e["response"];
  }
  ASSERT_TRUE(completed.is_object()) << r.body;
  std::set<std::string> ids;
  for (const auto& item : completed["output"]) EXPECT_TRUE(ids.insert(item["id"].get<std::string>()).second) << completed.dump();
  json stored = ok_json(http(port_, "GET", "/v1/responses/" + completed["id"].get<std::string>()));
  EXPECT_EQ(stored["output"], completed["output"]);
  // An assistant message, its call and the call's output (as text parts): one assistant turn with
  // the call, and the output's text.
  script("ok");
  json input = json::array({{{"role", "user"}, {"content", "weather?"}},
                            {{"type", "message"}, {"role", "assistant"}, {"content", "Let me check."}},
                            {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{\"d\": \"x\"}"}},
                            {{"type", "function_call_output"}, {"call_id", "c1"},
                             {"output", json::array({{{"type", "input_text"}, {"text", "sunny"}}})}}});
  ok_json(post("/v1/responses", {{"input", input}, {"tools", tools}}));
  const std::string prompt = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_NE(prompt.find("sunny"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("input_text"), std::string::npos) << prompt;
  const std::size_t first = prompt.find("<|im_start|>assistant");
  ASSERT_NE(first, std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Let me check.", first), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("<|im_start|>assistant", first + 1), prompt.rfind("<|im_start|>assistant")) << prompt;
  // previous_response_id: the input's system message stays, the instructions go.
  json turn1 = ok_json(post("/v1/responses", {{"instructions", "OLD RULES"},
                                              {"input", json::array({{{"role", "system"}, {"content", "Answer in French."}},
                                                                     {{"role", "user"}, {"content", "hi"}}})}}));
  ok_json(post("/v1/responses", {{"input", "again"}, {"previous_response_id", turn1["id"]}}));
  const std::string prompt2 = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_NE(prompt2.find("Answer in French."), std::string::npos) << prompt2;
  EXPECT_EQ(prompt2.find("OLD RULES"), std::string::npos) << prompt2;
  // A later check's error names the Responses field.
  json e = error_of(post("/v1/responses", {{"input", "x"}, {"max_output_tokens", 1000000}}));
  EXPECT_EQ(e["param"], "max_output_tokens") << e.dump();
  EXPECT_EQ(e["message"].get<std::string>().find("max_tokens"), std::string::npos) << e.dump();
  auto items = http(port_, "GET", "/v1/responses/" + turn1["id"].get<std::string>() + "/input_items");
  EXPECT_EQ(items.status, 404);
  EXPECT_NE(items.body.find("input_items and cancel are not built"), std::string::npos) << items.body;
  expect_idle();
}

// Found by review (stop 55). A response gives the same output items streamed or not: the order of
// text and calls as generated, no empty message beside a reasoning item, and the item that
// max_output_tokens cuts off (reasoning included) marked incomplete.
TEST_F(ApiTest, ResponsesGiveTheSameItemsStreamedOrNot) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  json tools = json::parse(R"([{"type":"function","name":"f","parameters":{"type":"object","properties":{"d":{"type":"string"}},"required":["d"]}}])");
  // Items without their ids (which name the response) and call ids (random).
  auto items_of = [](json output) {
    for (auto& item : output) {
      item.erase("id");
      item.erase("call_id");
    }
    return output;
  };
  auto streamed_output = [&](json body) {
    body["stream"] = true;
    auto r = post("/v1/responses", body);
    EXPECT_EQ(r.status, 200) << r.body;
    json final_obj;
    for (const auto& d : sse_data(r.body)) {
      json e = json::parse(d);
      if (e.contains("response") && e["response"]["status"] != "in_progress") final_obj = e["response"];
    }
    return final_obj;
  };
  auto script_tokens = [&](const std::string& thoughts, const std::string& rest) {
    engine_.script = tokenizer_->encode(thoughts, true);
    engine_.script.push_back(*tokenizer_->token_id("</think>"));
    for (TokenId id : tokenizer_->encode(rest, true)) engine_.script.push_back(id);
  };
  // Reasoning, a call, then text: reasoning, function_call, message, in that order either way.
  script_tokens("plan it", "<tool_call>\n<function=f>\n<parameter=d>\nx\n</parameter>\n</function>\n</tool_call> done");
  json body = {{"input", "go"}, {"tools", tools}, {"max_output_tokens", 80}};
  json whole = ok_json(post("/v1/responses", body));
  ASSERT_EQ(whole["output"].size(), 3u) << whole.dump();
  EXPECT_EQ(whole["output"][0]["type"], "reasoning");
  EXPECT_EQ(whole["output"][1]["type"], "function_call");
  EXPECT_EQ(whole["output"][2]["type"], "message");
  json streamed = streamed_output(body);
  EXPECT_EQ(items_of(streamed["output"]), items_of(whole["output"])) << streamed.dump() << "\n" << whole.dump();
  // Cut off while reasoning: one reasoning item, incomplete, and no empty message.
  engine_.script = tokenizer_->encode("a long plan that goes on and on", true);
  body = {{"input", "go"}, {"max_output_tokens", 3}};
  whole = ok_json(post("/v1/responses", body));
  EXPECT_EQ(whole["status"], "incomplete");
  ASSERT_EQ(whole["output"].size(), 1u) << whole.dump();
  EXPECT_EQ(whole["output"][0]["type"], "reasoning");
  EXPECT_EQ(whole["output"][0]["status"], "incomplete");
  streamed = streamed_output(body);
  EXPECT_EQ(streamed["status"], "incomplete");
  EXPECT_EQ(items_of(streamed["output"]), items_of(whole["output"])) << streamed.dump();
  // Nothing generated but the end: one empty message either way.
  engine_.script = {kImEnd};
  whole = ok_json(post("/v1/responses", {{"input", "go"}}));
  ASSERT_EQ(whole["output"].size(), 1u) << whole.dump();
  EXPECT_EQ(whole["output"][0]["type"], "message");
  EXPECT_EQ(whole["output"][0]["content"][0]["text"], "");
  streamed = streamed_output({{"input", "go"}});
  EXPECT_EQ(items_of(streamed["output"]), items_of(whole["output"])) << streamed.dump();
  expect_idle();
}

// --stream-interval N (SGLang's flag): a streamed choice is sent every N tokens, its first token at
// once and its end whenever it comes; the N tokens' text (content, reasoning) is one chunk, and
// what the client puts together is what interval 1 gives: the same reasoning, content, finish
// reason, usage and, for completions, logprob text offsets that run over the text.
TEST_F(ApiTest, StreamIntervalSendsEveryNTokensAsOneChunk) {
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  cfg.stream_interval = 4;
  start(cfg);
  const std::string thoughts = "free thoughts about the question", answer = "the answer is forty two";
  engine_.script = tokenizer_->encode(thoughts, true);
  engine_.script.push_back(*tokenizer_->token_id("</think>"));
  for (TokenId id : tokenizer_->encode(answer, true)) engine_.script.push_back(id);
  engine_.script.push_back(kImEnd);
  const int n_tokens = static_cast<int>(engine_.script.size());
  json body = chat({{"stream", true}, {"max_tokens", 100}, {"stream_options", {{"include_usage", true}}}});
  body.erase("chat_template_kwargs");
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  std::string reasoning, content, finish;
  int token_chunks = 0, first_len = -1, completion_tokens = -1;
  for (const auto& ev : sse_data(r.body)) {
    if (ev == "[DONE]") continue;
    json j = json::parse(ev);
    if (j.contains("usage") && !j["usage"].is_null()) completion_tokens = j["usage"]["completion_tokens"];
    if (j["choices"].empty()) continue;
    const json& ch = j["choices"][0];
    const json& d = ch["delta"];
    std::string piece = d.value("reasoning_content", std::string()) + d.value("content", std::string());
    if (!piece.empty()) {
      if (first_len < 0) first_len = static_cast<int>(piece.size());
      ++token_chunks;
    }
    reasoning += d.value("reasoning_content", std::string());
    content += d.value("content", std::string());
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(reasoning, thoughts);
  EXPECT_EQ(content, answer);
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(completion_tokens, n_tokens);
  // The first token alone, then at most one chunk per 4 tokens (+1: the </think> split).
  const std::vector<TokenId> first{engine_.script[0]};
  EXPECT_EQ(first_len, static_cast<int>(tokenizer_->decode(first, false).size()));
  EXPECT_LE(token_chunks, 1 + (n_tokens - 1 + 3) / 4 + 1) << r.body;
  EXPECT_GE(token_chunks, 3) << r.body;

  // Completions with logprobs: each chunk's text_offset continues from the text sent before it.
  script("alpha beta gamma delta epsilon zeta eta theta");
  auto c = post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 100}, {"stream", true}, {"logprobs", 1}});
  ASSERT_EQ(c.status, 200) << c.body;
  std::string text;
  int chunks = 0;
  for (const auto& ev : sse_data(c.body)) {
    if (ev == "[DONE]") continue;
    json j = json::parse(ev);
    const json& ch = j["choices"][0];
    if (ch["logprobs"].is_null()) continue;
    ++chunks;
    const json& lp = ch["logprobs"];
    int64_t at = static_cast<int64_t>(text.size());
    for (std::size_t k = 0; k < lp["tokens"].size(); ++k) {
      EXPECT_EQ(lp["text_offset"][k], at) << ev;
      at += static_cast<int64_t>(lp["tokens"][k].get<std::string>().size());
    }
    text += ch["text"].get<std::string>();
  }
  EXPECT_EQ(text, "alpha beta gamma delta epsilon zeta eta theta");
  EXPECT_LT(chunks, static_cast<int>(engine_.script.size()));

  // SGLang's per-request sampling_params.stream_interval on /generate overrides the server's: 1
  // streams every token (each event carries the text so far); out of 1..1024 it is refused by name.
  auto count_events = [&](int interval) {
    auto g = post("/generate", {{"text", "x"}, {"stream", true},
                                {"sampling_params", {{"max_new_tokens", 100}, {"stream_interval", interval}}}});
    EXPECT_EQ(g.status, 200) << g.body;
    std::string last;
    int n = 0;
    for (const auto& ev : sse_data(g.body))
      if (ev != "[DONE]") ++n, last = json::parse(ev)["text"];
    EXPECT_EQ(last, "alpha beta gamma delta epsilon zeta eta theta") << g.body;
    return n;
  };
  const int every = count_events(1), by_eight = count_events(8);
  EXPECT_GE(every, static_cast<int>(engine_.script.size()) - 1);
  EXPECT_LE(by_eight, 1 + (static_cast<int>(engine_.script.size()) + 7) / 8 + 1);
  EXPECT_EQ(error_of(post("/generate", {{"text", "x"}, {"sampling_params", {{"stream_interval", 0}}}}))["param"],
            "sampling_params.stream_interval");
  expect_idle();
}

// --log-requests: what a RequestLog sink receives.
class CollectedLines : public RequestLogSink {
 public:
  void line(const std::string& text) override {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.push_back(text);
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_.size();
  }
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(lines_);
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

TEST(RequestLogText, QuotedCutAtLevelTwoWholeAtThreeNoneBelow) {
  RequestLog log;
  log.level = 2;
  EXPECT_EQ(log.text("a \"b\"\nc"), "\"a \\\"b\\\"\\nc\"");  // one line, JSON-quoted
  // 2,047 bytes, then a 2-byte character across the 2,048 boundary: cut before it.
  const std::string long_text = std::string(2047, 'a') + "\xc3\xa9" + std::string(100, 'b');
  EXPECT_EQ(log.text(long_text), "\"" + std::string(2047, 'a') + "\" (+102 bytes)");
  EXPECT_EQ(log.text(std::string(2048, 'a')), "\"" + std::string(2048, 'a') + "\"");
  log.level = 3;
  EXPECT_EQ(log.text(long_text), safe_dump(long_text));
  log.level = 1;
  EXPECT_EQ(log.text("x"), "");
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 7;
  EXPECT_EQ(log.sampling(p, {"zeta"}),
            " sampling {\"temperature\":0.5,\"top_p\":1.0,\"top_k\":-1,\"min_p\":0.0,\"presence_penalty\":0.0,"
            "\"frequency_penalty\":0.0,\"repetition_penalty\":1.0,\"seed\":7,\"stop\":[\"zeta\"]}");
  log.level = 0;
  EXPECT_EQ(log.sampling(p, {}), "");
}

TEST_F(ApiTest, LogRequestsWritesALineWhenARequestStartsAndOneWhenItsResponseEnds) {
  CollectedLines log;
  ServerConfig cfg;
  cfg.request_log.level = 2;
  cfg.request_log.sink = &log;
  start(cfg);
  script("alpha beta gamma");
  json j = ok_json(post("/v1/completions", json{{"prompt", "hello world"}, {"max_tokens", 50}, {"temperature", 0.5},
                                                  {"stop", {"zeta"}}}));
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  std::vector<std::string> lines = log.take();
  const std::string id = j["id"];
  const int prompt_tokens = j["usage"]["prompt_tokens"], completion_tokens = j["usage"]["completion_tokens"];
  EXPECT_EQ(lines[0].rfind(str_cat("request ", id, " /v1/completions: 1 prompt, ", prompt_tokens,
                                   " prompt tokens, n 1, max_tokens 50 sampling {\"temperature\":0.5,"), 0),
            0u)
      << lines[0];
  EXPECT_TRUE(has(lines[0], "\"stop\":[\"zeta\"]}")) << lines[0];
  EXPECT_TRUE(has(lines[0], " prompt [\"hello world\"]")) << lines[0];
  EXPECT_EQ(lines[1].rfind(str_cat("response ", id, " /v1/completions: status 200, ", completion_tokens,
                                   " completion tokens, finish stop, ttft "), 0),
            0u)
      << lines[1];
  EXPECT_TRUE(has(lines[1], " output [" + safe_dump(j["choices"][0]["text"].get<std::string>()) + "]")) << lines[1];

  // A chat stream: its text and reasoning in the output; an engine refusal: its status.
  server_->stop();
  cfg.reasoning_parser = "qwen3";
  start(cfg);
  engine_.script = tokenizer_->encode("some thought", true);
  engine_.script.push_back(*tokenizer_->token_id("</think>"));
  for (TokenId id : tokenizer_->encode("the answer", true)) engine_.script.push_back(id);
  engine_.script.push_back(kImEnd);
  json body = chat({{"stream", true}});
  body.erase("chat_template_kwargs");
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  EXPECT_TRUE(has(lines[0], " /v1/chat/completions: 1 prompt, ") && has(lines[0], ", stream sampling {")) << lines[0];
  EXPECT_TRUE(has(lines[1], "status 200, ") &&
              has(lines[1], " output [{reasoning \"some thought\", text \"the answer\"}]"))
      << lines[1];
  engine_.reject_kind = EngineErrorKind::Overloaded;
  EXPECT_EQ(post("/v1/chat/completions", chat()).status, 503);
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  EXPECT_TRUE(has(lines[1], ": status 503, 0 completion tokens, finish error, e2e ")) << lines[1];
  EXPECT_FALSE(has(lines[1], "ttft")) << lines[1];
  engine_.reject_kind = EngineErrorKind::None;

  // A tool call: its name and arguments; a prompt past 2,048 tokens: only its first 2,048 decoded.
  server_->stop();
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  script("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>");
  json tc = ok_json(post("/v1/chat/completions", chat({{"tools", weather_tools()}, {"max_tokens", 80}})));
  ASSERT_EQ(tc["choices"][0]["message"]["tool_calls"].size(), 1u) << tc.dump();
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  EXPECT_TRUE(has(lines[1], "finish tool_calls") &&
              has(lines[1], "tool_call \"get_weather({\\\"city\\\": \\\"Paris\\\"})\"}]"))
      << lines[1];
  engine_.context = 100000;
  std::string words;
  for (int i = 0; i < 1100; ++i) words += " w" + std::to_string(i % 10);
  script("ok");
  json lp = ok_json(post("/v1/completions", json{{"prompt", words}, {"max_tokens", 4}}));
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  const int n_prompt = lp["usage"]["prompt_tokens"];
  ASSERT_GT(n_prompt, 2048);
  EXPECT_TRUE(has(lines[0], str_cat(" bytes) (+", n_prompt - 2048, " tokens)]"))) << lines[0].substr(lines[0].size() - 80);
  EXPECT_TRUE(has(lines[0], " prompt [\" w0 w1 w2")) << lines[0].substr(0, 200);

  // A client's rid is quoted: a line break in it cannot start a line of its own (stop 55: a forged
  // "INFO response ..." line).
  script("ok");
  ok_json(post("/generate", {{"text", "def"}, {"rid", "x\nINFO response cmpl-fake"}, {"sampling_params", {{"max_new_tokens", 2}}}}));
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  for (const std::string& line : lines) EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_TRUE(has(lines[0], " rid \"x\\nINFO response cmpl-fake\": ")) << lines[0];

  // Level 0: metadata only.
  server_->stop();
  cfg.request_log.level = 0;
  start(cfg);
  script("alpha beta gamma");
  ok_json(post("/v1/completions", json{{"prompt", "hello world"}, {"max_tokens", 50}}));
  ASSERT_TRUE(wait_until([&] { return log.size() == 2; })) << log.size();
  lines = log.take();
  for (const std::string& line : lines) {
    EXPECT_FALSE(has(line, "sampling") || has(line, "hello") || has(line, "alpha")) << line;
  }
  EXPECT_TRUE(has(lines[1], "status 200, ")) << lines[1];
  expect_idle();
}

}  // namespace
}  // namespace deltaserve
