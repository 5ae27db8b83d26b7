// The HTTP API audit's findings (cached_tokens, nested unknown keys, seed range, min_tokens with
// stop strings, echo, text_offset, typed booleans on the SGLang routes, no-effect field types,
// logit_bias keys, Responses error names) over HTTP against the FakeEngine and tiny-coder's tokenizer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/openai_server.h"
#include "server_fixture.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;
using testing::sse_data;

Result<std::string> chatml(const json& messages, const json&, const json& kwargs) {
  std::string out;
  for (const auto& m : messages) {
    out += "<|im_start|>" + m["role"].get<std::string>();
    if (m.contains("name")) out += " " + m["name"].get<std::string>();
    out += "\n" + m.value("content", std::string()) + "<|im_end|>\n";
  }
  if (kwargs.contains("add_generation_prompt") && kwargs["add_generation_prompt"] == false) return out;
  return out + "<|im_start|>assistant\n<think>\n\n</think>\n\n";
}

class ApiValidationTest : public testing::ServerFixture {
 protected:
  void start(ServerConfig cfg = {}) { start_server(cfg, chatml); }
  void script(const std::string& text) { engine_.script = tokenizer_->encode(text, true); }
  testing::HttpResult post_json(const std::string& path, const json& body) { return post(path, body.dump()); }
  json ok(const testing::HttpResult& r) {
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // A 400 whose param is `param`; returns the error.
  json refused(const std::string& path, const json& body, const std::string& param) {
    auto r = post_json(path, body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    json e = error_of(r);
    EXPECT_EQ(e["param"], param) << body.dump() << " -> " << r.body;
    return e;
  }
  static json chat(json extra = json::object()) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 4}};
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    return b;
  }
};

TEST_F(ApiValidationTest, CachedTokensAreReportedOnGenerateAndResponses) {
  start();
  script("ok");
  engine_.cached = 2;
  json g = ok(post_json("/generate", {{"text", "def hello_world():"}, {"sampling_params", {{"max_new_tokens", 3}}}}));
  EXPECT_EQ(g["meta_info"]["cached_tokens"], 2) << g.dump();
  json r = ok(post_json("/v1/responses", {{"input", "hello there"}, {"max_output_tokens", 3}}));
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 2) << r.dump();
  json c = ok(post_json("/v1/chat/completions", chat()));
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  // A stop string ends the choice in the server, which answers before the engine's final event
  // (the count once came only on that event: 0 was reported).
  script("Hello world and more words after it");
  engine_.tick = std::chrono::milliseconds(20);
  for (bool stream : {false, true}) {
    auto r = post_json("/v1/chat/completions",
                       chat({{"stop", json::array({"world"})}, {"max_tokens", 30}, {"stream", stream},
                             {"stream_options", stream ? json{{"include_usage", true}} : json(nullptr)}}));
    ASSERT_EQ(r.status, 200) << r.body;
    json usage;
    if (stream) {
      for (const auto& d : testing::sse_data(r.body))
        if (d != "[DONE]" && json::parse(d).contains("usage") && !json::parse(d)["usage"].is_null()) usage = json::parse(d)["usage"];
    } else {
      usage = json::parse(r.body)["usage"];
    }
    EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 2) << r.body;
  }
  json m = ok(post_json("/generate", {{"text", "def hello_world():"}, {"sampling_params", {{"max_new_tokens", 30}, {"stop", "world"}}}}));
  EXPECT_EQ(m["meta_info"]["cached_tokens"], 2) << m.dump();
  expect_idle();
}

TEST_F(ApiValidationTest, UnknownNestedKeysAreRefusedByPath) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";  // tools under "auto" are served only with a parser
  start(cfg);
  script("ok");
  const std::string C = "/v1/chat/completions";
  refused(C, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}, {"foo", 1}}})}}, "messages[0].foo");
  refused(C, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "tool"}, {"content", "x"}, {"bar", 1}}})}},
          "messages[1].bar");
  refused(C, chat({{"stream", true}, {"stream_options", {{"include_usage", true}, {"foo", 1}}}}), "stream_options.foo");
  refused(C, chat({{"response_format", {{"type", "json_object"}, {"foo", 1}}}}), "response_format.foo");
  refused(C, chat({{"response_format", {{"type", "text"}, {"json_schema", {{"schema", {{"type", "integer"}}}}}}}}),
          "response_format.json_schema");
  refused(C, chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}, {"foo", 1}}}}}}),
          "response_format.json_schema.foo");
  refused(C, chat({{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"foo", 1}}}}})}}),
          "tools[0].function.foo");
  refused(C, chat({{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}, {"bar", 2}}})}}), "tools[0].bar");
  refused(C, chat({{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}, {"x", 1}}}}}}),
          "tool_choice.function.x");
  // A wrongly typed reasoning_content is an error, not dropped.
  refused(C, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "a"}, {"reasoning_content", 5}},
                                        {{"role", "user"}, {"content", "b"}}})}},
          "messages[1].reasoning_content");
  refused(C, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}, {"name", 5}}})}}, "messages[0].name");
  refused(C, {{"messages", json::array({{{"role", "assistant"}, {"content", "a"}, {"refusal", "no"}}, {{"role", "user"}, {"content", "b"}}})}},
          "messages[0].refusal");
  // Responses tools and tool_choice.
  refused("/v1/responses", {{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"foo", 1}}})}}, "tools[0].foo");
  refused(C, chat({{"reasoning", {{"effort", "low"}, {"foo", 1}}}}), "reasoning.foo");
  refused("/v1/responses", {{"input", "x"}, {"reasoning", {{"foo", 1}}}}, "reasoning.foo");
  refused("/v1/responses", {{"input", "x"}, {"text", {{"format", {{"type", "text"}}}, {"foo", 1}}}}, "text.foo");
  refused("/v1/responses",
          {{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}, {"tool_choice", {{"type", "function"}, {"name", "f"}, {"foo", 1}}}},
          "tool_choice.foo");
  // What OpenAI / vLLM clients legitimately send is served; `name` reaches the template.
  ok(post_json(C, {{"messages", json::array({{{"role", "system"}, {"content", "s"}, {"name", "sys"}},
                                             {{"role", "user"}, {"content", "hi"}, {"name", "bob"}},
                                             {{"role", "assistant"}, {"content", "a"}, {"name", "bot"}, {"refusal", nullptr},
                                              {"tool_calls", json::array()}, {"reasoning_content", "r"}},
                                             {{"role", "user"}, {"content", "again"}}})},
                   {"max_tokens", 2}}));
  const std::string prompt = tokenizer_->decode(engine_.submitted().back().prompt, false);
  EXPECT_NE(prompt.find("<|im_start|>user bob\nhi"), std::string::npos) << prompt;
  ok(post_json(C, chat({{"tools", json::array({{{"type", "function"},
                                                {"function", {{"name", "f"}, {"description", "d"}, {"parameters", json::object()}, {"strict", true}}}}})}})));
  ok(post_json(C, chat({{"response_format", {{"type", "json_schema"},
                                              {"json_schema", {{"name", "n"}, {"description", "d"}, {"strict", true}, {"schema", {{"type", "integer"}}}}}}}})));
  ok(post_json(C, chat({{"stream", true}, {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", false}}}})));
  ok(post_json("/v1/responses", {{"input", "x"}, {"max_output_tokens", 2},
                                 {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"description", "d"}, {"parameters", json::object()}, {"strict", true}}})},
                                 {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"strict", true}, {"schema", {{"type", "integer"}}}}}}}}));
  expect_idle();
}

TEST_F(ApiValidationTest, SeedOutsideInt64IsRefused) {
  start();
  script("ok");
  for (const char* seed : {"9223372036854775808", "18446744073709551615"}) {
    auto r = post("/v1/completions", std::string(R"({"prompt":"x","max_tokens":2,"seed":)") + seed + "}");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(error_of(r)["param"], "seed");
  }
  ok(post("/v1/completions", R"({"prompt":"x","max_tokens":2,"seed":9223372036854775807})"));
  ok(post("/v1/completions", R"({"prompt":"x","max_tokens":2,"seed":-9223372036854775808})"));
  expect_idle();
}

TEST_F(ApiValidationTest, StopStringsWaitForMinTokens) {
  start();
  script("a): b): c): d): e");
  json plain = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":16,"stop":"):"})"));
  EXPECT_EQ(plain["choices"][0]["text"], "a");
  json j = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":16,"stop":"):","min_tokens":5})"));
  EXPECT_GT(j["usage"]["completion_tokens"].get<int>(), 5) << j.dump();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_NE(j["choices"][0]["text"], "a");
  expect_idle();
}

TEST_F(ApiValidationTest, EchoRefusesLogprobsAndEchoesTheTruncatedPrompt) {
  start();
  script("ok");
  json e = refused("/v1/completions", {{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, "echo");
  EXPECT_NE(e["message"].get<std::string>().find("prompt logprobs"), std::string::npos);
  const std::string prompt = "one two three four five six seven";
  const auto ids = tokenizer_->encode(prompt, true);
  ASSERT_GT(ids.size(), 3u);
  json j = ok(post_json("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"truncate_prompt_tokens", 3}, {"max_tokens", 2}}));
  const std::string kept = tokenizer_->decode(std::vector<TokenId>(ids.end() - 3, ids.end()), false);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["choices"][0]["text"], kept + "ok");
  expect_idle();
}

TEST_F(ApiValidationTest, CompletionTextOffsets) {
  start();
  script("one two three");
  // Streaming: the offsets run over the whole choice.
  auto r = post("/v1/completions", R"({"prompt":"x","max_tokens":8,"stream":true,"logprobs":1})");
  ASSERT_EQ(r.status, 200);
  std::string text;
  int checked = 0;
  for (const auto& ev : sse_data(r.body)) {
    if (ev == "[DONE]") break;
    json c = json::parse(ev);
    const json& lp = c["choices"][0]["logprobs"];
    if (!lp.is_null()) {
      ASSERT_EQ(lp["text_offset"].size(), 1u);
      EXPECT_EQ(lp["text_offset"][0], static_cast<int>(text.size())) << ev;
      ++checked;
    }
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "one two three");
  EXPECT_GE(checked, 3);
  // return_tokens_as_token_ids: the offsets still count the text.
  json j = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":8,"logprobs":1,"return_tokens_as_token_ids":true})"));
  const json& lp = j["choices"][0]["logprobs"];
  int64_t at = 0;
  for (size_t k = 0; k < engine_.script.size(); ++k) {
    EXPECT_EQ(lp["text_offset"][k], at) << j.dump();
    EXPECT_EQ(lp["tokens"][k], "token_id:" + std::to_string(engine_.script[k]));
    at += static_cast<int64_t>(tokenizer_->decode(std::vector<TokenId>{engine_.script[k]}, false).size());
  }
  EXPECT_EQ(at, static_cast<int64_t>(j["choices"][0]["text"].get<std::string>().size()));
  // The sampled token is always among top_logprobs (vLLM), also when the engine's top-k misses it.
  engine_.top_skips_sampled = true;
  json t = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":8,"logprobs":2})"));
  const json& tl = t["choices"][0]["logprobs"];
  for (size_t k = 0; k < tl["tokens"].size(); ++k) {
    EXPECT_TRUE(tl["top_logprobs"][k].contains(tl["tokens"][k].get<std::string>())) << t.dump();
    EXPECT_EQ(tl["top_logprobs"][k].size(), 3u);
  }
  expect_idle();
}

// text_offset counts characters of the choice's text (OpenAI, vLLM), not bytes of each token
// decoded alone (a token holding half of "中" decoded alone is U+FFFD, 3 bytes, and the offsets
// ran past the text's end); a token that completes a character starts where the character does.
// Streamed, the offsets run on across text the stop matcher holds back. logprobs 0 still gives
// top_logprobs: the sampled token alone (vLLM), not null.
TEST_F(ApiValidationTest, CompletionTextOffsetsCountCharacters) {
  start();
  const std::string want = "a\xc3\xa9" "b\xe4\xb8\xad" " c \xf0\x9f\x98\x80!";  // "aéb中 c 😀!"
  script(want);
  // The reference: complete characters in the raw bytes of the tokens before each one.
  auto complete_chars = [](const std::string& bytes) {
    int64_t n = 0;
    for (std::size_t i = 0; i < bytes.size();) {
      const unsigned char b = static_cast<unsigned char>(bytes[i]);
      const std::size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
      if (i + len > bytes.size()) break;
      ++n;
      i += len;
    }
    return n;
  };
  std::vector<int64_t> expected;
  std::string prefix;
  bool split = false;  // some character is split over tokens (else the test shows nothing)
  for (TokenId t : engine_.script) {
    expected.push_back(complete_chars(prefix));
    const std::string b = tokenizer_->token_text(t);
    split |= complete_chars(prefix + b) - complete_chars(prefix) != complete_chars(b) ||
             (!b.empty() && (static_cast<unsigned char>(b[0]) & 0xC0) == 0x80);
    prefix += b;
  }
  EXPECT_TRUE(split) << "tiny-coder's tokens no longer split a character: pick other text";
  json j = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":32,"logprobs":0})"));
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(j["choices"][0]["text"], want);
  ASSERT_EQ(lp["text_offset"].size(), expected.size()) << j.dump();
  for (std::size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(lp["text_offset"][k], expected[k]) << k << " " << j.dump();
    ASSERT_TRUE(lp["top_logprobs"][k].is_object()) << j.dump();
    EXPECT_EQ(lp["top_logprobs"][k].size(), 1u);
    EXPECT_TRUE(lp["top_logprobs"][k].contains(lp["tokens"][k].get<std::string>())) << j.dump();
  }
  // Found by review (stop 55). Ill-formed bytes: E0 80 is two U+FFFD in the text (E0 needs A0-BF
  // next), so each of these one-byte tokens starts its own character.
  {
    auto byte_token = [&](const std::string& b) -> std::optional<TokenId> {
      for (TokenId id = 0; id < 512; ++id)
        if (tokenizer_->token_text(id) == b) return id;
      return std::nullopt;
    };
    const auto e0 = byte_token("\xe0"), b80 = byte_token("\x80");
    ASSERT_TRUE(e0 && b80);
    engine_.script = {*e0, *b80, *b80, *e0, *b80, *b80, *e0, *b80};
    json bad = ok(post("/v1/completions", R"({"prompt":"x","max_tokens":8,"logprobs":0})"));
    std::string replacement;
    for (int k = 0; k < 8; ++k) replacement += "\xef\xbf\xbd";
    EXPECT_EQ(bad["choices"][0]["text"], replacement);
    EXPECT_EQ(bad["choices"][0]["logprobs"]["text_offset"], json({0, 1, 2, 3, 4, 5, 6, 7})) << bad.dump();
    script(want);
  }
  // Streamed, with a stop string that holds text back while it might match: the same offsets.
  auto r = post("/v1/completions", R"({"prompt":"x","max_tokens":32,"stream":true,"logprobs":1,"stop":["c zz"]})");
  ASSERT_EQ(r.status, 200);
  std::vector<int64_t> streamed;
  for (const auto& ev : sse_data(r.body)) {
    if (ev == "[DONE]") break;
    const json chunk = json::parse(ev);
    const json& l = chunk["choices"][0]["logprobs"];
    if (!l.is_null())
      for (const auto& o : l["text_offset"]) streamed.push_back(o.get<int64_t>());
  }
  EXPECT_EQ(streamed, expected);
  expect_idle();
}

// With ignore_eos an EOS ends nothing, so it is text like any token: shown when
// skip_special_tokens is false (vLLM), where it used to be hidden as the choice's stop token.
TEST_F(ApiValidationTest, IgnoredEosIsTextWhenSpecialTokensAreKept) {
  start();
  const auto defaults = load_generation_defaults(testing::kTinyCoderDir, 0);
  ASSERT_TRUE(defaults.is_ok());
  ASSERT_FALSE(defaults->eos_token_ids.empty());
  const TokenId eos = defaults->eos_token_ids.front();
  const std::string eos_text = tokenizer_->token_text(eos);
  engine_.script = tokenizer_->encode("ab", false);
  engine_.script.push_back(eos);
  for (TokenId t : tokenizer_->encode("cd", false)) engine_.script.push_back(t);
  const int n = static_cast<int>(engine_.script.size());
  json shown = ok(post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", n}, {"ignore_eos", true},
                                                {"skip_special_tokens", false}}));
  EXPECT_EQ(shown["choices"][0]["text"], "ab" + eos_text + "cd");
  json dropped = ok(post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", n}, {"ignore_eos", true}}));
  EXPECT_EQ(dropped["choices"][0]["text"], "abcd");
  json hidden = ok(post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", n}, {"skip_special_tokens", false}}));
  EXPECT_EQ(hidden["choices"][0]["text"].get<std::string>().find(eos_text), std::string::npos) << hidden.dump();
  expect_idle();
}

TEST_F(ApiValidationTest, SglangRouteBooleansAreTypedAndNamed) {
  start();
  script("ok");
  refused("/abort_request", {{"abort_all", "yes"}}, "abort_all");
  refused("/abort_request", {{"rid", 5}}, "rid");
  refused("/generate", {{"text", "a"}, {"return_logprob", "yes"}}, "return_logprob");
  refused("/generate", {{"text", "a"}, {"return_text_in_logprobs", 1}}, "return_text_in_logprobs");
  refused("/tokenize", {{"prompt", "a"}, {"add_special_tokens", "no"}}, "add_special_tokens");
  refused("/tokenize", {{"prompt", "a"}, {"return_token_strs", 1}}, "return_token_strs");
  refused("/tokenize", {{"prompt", "a"}, {"model", 5}}, "model");
  refused("/tokenize", {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"add_generation_prompt", "x"}},
          "add_generation_prompt");
  refused("/detokenize", {{"tokens", {1}}, {"skip_special_tokens", "x"}}, "skip_special_tokens");
  ok(post_json("/tokenize", {{"prompt", "a"}, {"add_special_tokens", false}, {"return_token_strs", true}, {"model", "tiny"}}));
  ok(post_json("/detokenize", {{"tokens", {1}}, {"skip_special_tokens", true}}));
  expect_idle();
}

TEST_F(ApiValidationTest, SmallerFieldChecks) {
  start();
  script("ok");
  const std::string P = "/v1/completions";
  json base = {{"prompt", "x"}, {"max_tokens", 2}};
  auto with = [&](const char* k, json v) {
    json b = base;
    b[k] = std::move(v);
    return b;
  };
  refused(P, with("user", 5), "user");
  refused(P, with("safety_identifier", json::array()), "safety_identifier");
  refused(P, with("metadata", "x"), "metadata");
  refused(P, with("metadata", {{"k", 1}}), "metadata.k");
  ok(post_json(P, with("metadata", {{"k", "v"}})));
  refused(P, with("stop_token_ids", {99999}), "stop_token_ids");
  refused("/generate", {{"text", "x"}, {"sampling_params", {{"stop_token_ids", {99999}}}}}, "sampling_params.stop_token_ids");
  for (const char* key : {"088", "+88", " 88", "88 ", "0x58", ""}) refused(P, with("logit_bias", {{key, 1}}), "logit_bias");
  ok(post_json(P, with("logit_bias", {{"88", 1}, {"0", -1}})));
  // /v1/responses names its own fields.
  refused("/v1/responses", {{"input", json::array()}}, "input");
  refused("/v1/responses", {{"input", json::array({{{"role", "wizard"}, {"content", "x"}}})}}, "input[0].role");
  // A "type" that is not a string: refused naming the field (it threw json's type_error before).
  refused("/v1/responses", {{"input", json::array({{{"type", json::array()}, {"role", "user"}}})}}, "input[0].type");
  refused("/v1/responses", {{"input", json::array({{{"role", "user"}, {"content", json::array({{{"type", 7}}})}}})}},
          "input[0].content[0].type");
  refused("/v1/responses", {{"input", "x"}, {"tools", json::array({{{"type", 1}, {"name", "f"}}})}}, "tools[0]");
  json e = refused("/v1/responses", {{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens");
  EXPECT_EQ(e["message"].get<std::string>().find("'max_tokens'"), std::string::npos) << e.dump();
  e = refused("/v1/responses", {{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}}}}}}, "text.format.schema");
  EXPECT_EQ(e["message"].get<std::string>().find("response_format"), std::string::npos) << e.dump();
  expect_idle();
}

// A function's arguments are a JSON object: a parameters schema of another type is refused, as
// OpenAI refuses it (a forced call would otherwise write a bare string or number as arguments).
TEST_F(ApiValidationTest, ToolParametersMustBeAnObjectSchema) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  script("ok");
  const std::string C = "/v1/chat/completions";
  auto tool = [](json params) {
    return json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", std::move(params)}}}}});
  };
  for (const json& type : {json("string"), json("array"), json(7), json::array({"object", "null"})}) {
    json e = refused(C, chat({{"tools", tool({{"type", type}})}}), "tools[0].function.parameters.type");
    EXPECT_NE(e["message"].get<std::string>().find(type.dump()), std::string::npos) << e.dump();
    refused(C, chat({{"tools", tool({{"type", type}})}, {"tool_choice", "required"}}),
            "tools[0].function.parameters.type");
  }
  // A long value is cut in the message.
  json e = refused(C, chat({{"tools", tool({{"type", json::array({std::string(500, 'x')})}})}}),
                   "tools[0].function.parameters.type");
  EXPECT_LT(e["message"].get<std::string>().size(), 200u) << e.dump();
  e = refused("/v1/responses",
              {{"input", "x"},
               {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "string"}}}}})}},
              "tools[0].parameters.type");
  EXPECT_EQ(e["message"].get<std::string>().find("function"), std::string::npos) << e.dump();
  // An object schema, and one that names no type (taken as an object's), are served.
  ok(post_json(C, chat({{"tools", tool({{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}})}})));
  ok(post_json(C, chat({{"tools", tool(json::object())}})));
  expect_idle();
}

// tool_choice "required" with an empty tools list has no tool to call: refused (it once ran
// unconstrained and answered in text), on chat completions and /v1/responses alike.
TEST_F(ApiValidationTest, RequiredToolChoiceNeedsATool) {
  start();
  script("ok");
  json e = refused("/v1/chat/completions", chat({{"tools", json::array()}, {"tool_choice", "required"}}), "tool_choice");
  EXPECT_NE(e["message"].get<std::string>().find("empty list"), std::string::npos) << e.dump();
  refused("/v1/responses", {{"input", "x"}, {"tools", json::array()}, {"tool_choice", "required"}}, "tool_choice");
  ok(post_json("/v1/chat/completions", chat({{"tools", json::array()}, {"tool_choice", "auto"}})));
  expect_idle();
}

TEST_F(ApiValidationTest, ResponsesIncompleteMessageStatus) {
  start();
  script("one two three four five");
  json r = ok(post_json("/v1/responses", {{"input", "x"}, {"max_output_tokens", 2}}));
  EXPECT_EQ(r["status"], "incomplete");
  ASSERT_EQ(r["output"].size(), 1u);
  EXPECT_EQ(r["output"][0]["status"], "incomplete");
  auto s = post_json("/v1/responses", {{"input", "x"}, {"max_output_tokens", 2}, {"stream", true}});
  ASSERT_EQ(s.status, 200);
  bool seen = false;
  for (const auto& ev : sse_data(s.body)) {
    json j = json::parse(ev, nullptr, false);
    if (j.is_discarded() || j.value("type", "") != "response.output_item.done") continue;
    EXPECT_EQ(j["item"]["status"], "incomplete") << ev;
    seen = true;
  }
  EXPECT_TRUE(seen);
  script("one");
  r = ok(post_json("/v1/responses", {{"input", "x"}, {"max_output_tokens", 20}}));
  EXPECT_EQ(r["output"][0]["status"], "completed");
  expect_idle();
}

TEST_F(ApiValidationTest, BlankContentBeforeToolCallIsEmpty) {
  ServerConfig cfg;
  cfg.tool_call_parser = "hermes";
  start(cfg);
  script("  \n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
  json j = ok(post_json("/v1/chat/completions", {{"messages", json::array({{{"role", "user"}, {"content", "go"}}})}, {"tools", tools}}));
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["content"], "") << j.dump();
  json r = ok(post_json("/v1/responses", {{"input", "go"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"parameters", json::object()}}})}}));
  ASSERT_EQ(r["output"].size(), 1u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "function_call");
  expect_idle();
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// allowed_token_ids that the other rules exclude from the first token on are a 400 naming the
// conflict (a later conflict ends the request with an error: EngineConstraint tests).
TEST_F(ApiValidationTest, AllowedTokenIdsThatOtherRulesExcludeAreRefused) {
  start();
  script("ok");
  const int a = tokenizer_->encode("a", false).front(), z = tokenizer_->encode("z", false).front();
  json e = refused("/v1/completions",
                   {{"prompt", "x"}, {"max_tokens", 4}, {"allowed_token_ids", {a}}, {"bad_words", {"a"}}},
                   "allowed_token_ids");
  EXPECT_NE(e["message"].get<std::string>().find("bad word"), std::string::npos) << e.dump();
  e = refused("/v1/completions",
              {{"prompt", "x"}, {"max_tokens", 4}, {"allowed_token_ids", {a}}, {"stop_token_ids", {a}}, {"min_tokens", 2}},
              "min_tokens");
  EXPECT_NE(e["message"].get<std::string>().find("only end ids"), std::string::npos) << e.dump();
  refused("/v1/chat/completions", chat({{"allowed_token_ids", {z}}, {"regex", "yes"}}), "allowed_token_ids");
  // Compatible rules pass.
  ok(post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}, {"allowed_token_ids", {a, z}}, {"bad_words", {"a"}}}));
  ok(post_json("/v1/completions", {{"prompt", "x"}, {"max_tokens", 4}, {"allowed_token_ids", {a}}, {"regex", "a+"}}));
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// Whether the answer starts in reasoning comes from the rendered prompt: a template whose default
// is thinking off closes the think block itself, and the reply is content (SGLang #20786 put it
// all in reasoning_content); one that leaves <think> open starts in reasoning.
class ThinkingDefaultTest : public testing::ServerFixture {};

TEST_F(ThinkingDefaultTest, ReasoningStartsWhereThePromptOpensThink) {
  bool default_on = false;
  ServerConfig cfg;
  cfg.reasoning_parser = "qwen3";
  start_server(cfg, [&](const json& messages, const json&, const json& kwargs) -> Result<std::string> {
    const bool on = kwargs.contains("enable_thinking") ? kwargs["enable_thinking"].get<bool>() : default_on;
    std::string out = "<|im_start|>user\n" + messages.back().value("content", std::string()) + "<|im_end|>\n";
    return out + "<|im_start|>assistant\n" + (on ? "<think>\n" : "<think>\n\n</think>\n\n");
  });
  auto ask = [&](json extra) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 16}};
    for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
    auto r = post("/v1/chat/completions", b.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["choices"][0]["message"];
  };
  engine_.script = tokenizer_->encode("The answer is 4.", false);
  json off = ask(json::object());  // the template's default: off
  EXPECT_EQ(off["content"], "The answer is 4.") << off.dump();
  EXPECT_TRUE(off["reasoning_content"].is_null()) << off.dump();
  engine_.script = tokenizer_->encode("Add them.\n</think>\n\n4", false);
  json on = ask({{"chat_template_kwargs", {{"enable_thinking", true}}}});
  EXPECT_EQ(on["reasoning_content"], "Add them.\n") << on.dump();
  EXPECT_EQ(on["content"], "\n\n4") << on.dump();
  default_on = true;  // a template that defaults on, asked for nothing: reasoning first
  json dflt = ask(json::object());
  EXPECT_EQ(dflt["reasoning_content"], "Add them.\n") << dflt.dump();
}

}  // namespace
}  // namespace deltaserve

namespace deltaserve {
namespace {

// Found by review (stop 56), each accepted and then not (or wrongly) applied before.
TEST_F(ApiValidationTest, ToolsUnderAutoNeedAParserAndStrictToolsAreEnforced) {
  start();  // no --tool-call-parser
  script("ok");
  const std::string C = "/v1/chat/completions";
  auto tool = [](bool strict) {
    json fn = {{"name", "get"},
               {"parameters", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}}}};
    if (strict) fn["strict"] = true;
    return json::array({{{"type", "function"}, {"function", fn}}});
  };
  // The calls would come back as text: refused, as vLLM refuses "auto" without a parser.
  json e = refused(C, chat({{"tools", tool(false)}}), "tools");
  EXPECT_NE(e["message"].get<std::string>().find("--tool-call-parser"), std::string::npos) << e.dump();
  refused(C, chat({{"tools", tool(false)}, {"tool_choice", "auto"}}), "tools");
  refused("/v1/responses", {{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}}, "tools");
  ok(post_json(C, chat({{"tools", tool(false)}, {"tool_choice", "none"}})));  // not rendered, nothing to parse
  ok(post_json(C, chat({{"tools", json::array()}})));
  expect_idle();
}

TEST_F(ApiValidationTest, StrictToolsUnderAutoHoldTheArgumentsToTheSchema) {
  ServerConfig cfg;
  cfg.tool_call_parser = "qwen3_coder";
  start(cfg);
  engine_.vocab = tokenizer_->vocab_size();
  engine_.eos = {8183, 8185};
  const std::string C = "/v1/chat/completions";
  const json tools = json::array(
      {{{"type", "function"},
        {"function", {{"name", "get"}, {"strict", true},
                      {"parameters", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}}}}}}});
  const std::string call = "<tool_call>\n<function=get>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>";
  // A valid call after some text: taken as it is, and parsed.
  engine_.script = tokenizer_->encode("Sure.\n\n" + call, true);
  engine_.script.push_back(8185);
  json j = ok(post_json(C, chat({{"tools", tools}, {"max_tokens", 60}})));
  ASSERT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u) << j.dump();
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], R"({"n": 5})") << j.dump();
  EXPECT_EQ(engine_.constraint_rejects.load(), 0);
  // An argument outside the schema (text where the schema says integer) is not written.
  engine_.script = tokenizer_->encode("<tool_call>\n<function=get>\n<parameter=n>\nfive\n</parameter>\n</function>\n</tool_call>", true);
  engine_.script.push_back(8185);
  j = ok(post_json(C, chat({{"tools", tools}, {"max_tokens", 60}})));
  EXPECT_EQ(j.dump().find("five"), std::string::npos) << j.dump();
  EXPECT_EQ(engine_.constraint_rejects.load(), 0);
  // With a JSON response_format the output is that answer or the calls: the same call is taken...
  engine_.script = tokenizer_->encode(call, true);
  engine_.script.push_back(8185);
  j = ok(post_json(C, chat({{"tools", tools}, {"max_tokens", 60}, {"response_format", {{"type", "json_object"}}}})));
  EXPECT_EQ(j["choices"][0]["message"]["tool_calls"].size(), 1u) << j.dump();
  // ...and so is an answer under the schema, but not text outside it.
  engine_.script = tokenizer_->encode(R"({"a": 1})", true);
  engine_.script.push_back(8185);
  j = ok(post_json(C, chat({{"tools", tools}, {"max_tokens", 60}, {"response_format", {{"type", "json_object"}}}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"], R"({"a": 1})") << j.dump();
  engine_.script = tokenizer_->encode("Sure.", true);
  j = ok(post_json(C, chat({{"tools", tools}, {"max_tokens", 8}, {"response_format", {{"type", "json_object"}}}})));
  EXPECT_EQ(j["choices"][0]["message"]["content"].get<std::string>().rfind("Sure", 0), std::string::npos) << j.dump();
  EXPECT_EQ(engine_.constraint_rejects.load(), 0);
  // Strict tools and a constraint that is not JSON: refused, naming both.
  json e = refused(C, chat({{"tools", tools}, {"regex", "[a-z]+"}}), "tools");
  EXPECT_NE(e["message"].get<std::string>().find("regex"), std::string::npos) << e.dump();
  expect_idle();
}

TEST_F(ApiValidationTest, ReviewOfStop56RequestFields) {
  start();
  script("ok");
  const std::string C = "/v1/chat/completions";
  // reasoning_effort and reasoning.effort: each checked, and they must agree.
  refused(C, chat({{"reasoning_effort", "high"}, {"reasoning", {{"effort", "none"}}}}), "reasoning.effort");
  refused(C, chat({{"reasoning_effort", "high"}, {"reasoning", 5}}), "reasoning");
  refused(C, chat({{"reasoning_effort", "high"}, {"reasoning", {{"bogus", 1}}}}), "reasoning.bogus");
  refused(C, chat({{"reasoning_effort", ""}}), "reasoning_effort");
  ok(post_json(C, chat({{"reasoning_effort", "low"}, {"reasoning", {{"effort", "low"}}}})));
  // A client's request_id names the response, as in vLLM.
  json j = ok(post_json(C, chat({{"request_id", "my-req-1"}})));
  EXPECT_EQ(j["id"], "chatcmpl-my-req-1");
  j = ok(post_json("/v1/completions", {{"prompt", "p"}, {"max_tokens", 2}, {"request_id", "abc"}}));
  EXPECT_EQ(j["id"], "cmpl-abc");
  j = ok(post_json(C, chat()));
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_GT(j["id"].get<std::string>().size(), 20u);
  // The context error names the field the client sent.
  json e = refused(C, chat({{"max_tokens", nullptr}, {"max_completion_tokens", 100000}}), "max_completion_tokens");
  EXPECT_EQ(e["message"].get<std::string>().rfind("max_completion_tokens is 100000", 0), 0u) << e.dump();
  refused(C, chat({{"max_tokens", nullptr}, {"max_completion_tokens", 2}, {"min_tokens", 3}}), "min_tokens");
  // No-effect fields keep their types; /generate's stream_options too, and top logprobs need return_logprob.
  refused(C, chat({{"prompt_cache_key", 5}}), "prompt_cache_key");
  ok(post_json(C, chat({{"prompt_cache_key", "k"}})));
  refused("/generate", {{"text", "def f("}, {"sampling_params", {{"max_new_tokens", 2}}}, {"stream_options", 5}}, "stream_options");
  refused("/generate", {{"text", "def f("}, {"sampling_params", {{"max_new_tokens", 2}}}, {"stream_options", {{"foo", 1}}}},
          "stream_options.foo");
  refused("/generate", {{"text", "def f("}, {"sampling_params", {{"max_new_tokens", 2}}}, {"top_logprobs_num", 3}}, "top_logprobs_num");
  ok(post_json("/generate", {{"text", "def f("}, {"sampling_params", {{"max_new_tokens", 2}}}, {"top_logprobs_num", 3}, {"return_logprob", true}}));
  expect_idle();
}

// Without a chat template the chat routes answer 400 (the server starts: completions need none).
TEST_F(ApiValidationTest, NoChatTemplateIsARequestError) {
  start_server(ServerConfig{}, nullptr);
  script("ok");
  json e = refused("/v1/chat/completions", chat(), "messages");
  EXPECT_NE(e["message"].get<std::string>().find("chat template"), std::string::npos) << e.dump();
  ok(post_json("/v1/completions", {{"prompt", "p"}, {"max_tokens", 2}}));
  expect_idle();
}

}  // namespace
}  // namespace deltaserve
