// The request-field table (src/server/request_fields.cpp) against the server and the docs: every
// row, for every API it lists, is sent with its example value; honoured and no-effect fields are
// served, "only default" fields get a 400 naming them (and their accepted value is served), and
// docs/api-fields.md lists the row with the same status.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "server/openai_server.h"
#include "server/request_fields.h"
#include "test_support.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;

const std::string kModelDir = std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";

Result<std::string> chatml(const json& messages, const json&, const json& kwargs) {
  std::string out;
  for (const auto& m : messages) out += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m.value("content", "") + "<|im_end|>\n";
  if (kwargs.contains("add_generation_prompt") && kwargs["add_generation_prompt"] == false) return out;
  return out + "<|im_start|>assistant\n";
}

struct ApiCase {
  FieldApi api;
  const char* path;
  const char* section;  // the docs heading
};
const ApiCase kApis[] = {{FieldApi::Chat, "/v1/chat/completions", "POST /v1/chat/completions"},
                         {FieldApi::Completion, "/v1/completions", "POST /v1/completions"},
                         {FieldApi::Generate, "/generate", "POST /generate (top level)"},
                         {FieldApi::GenerateSampling, "/generate", "POST /generate: sampling_params"},
                         {FieldApi::Responses, "/v1/responses", "POST /v1/responses"}};

json base_request(FieldApi api) {
  switch (api) {
    case FieldApi::Chat:
      return {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
              {"chat_template_kwargs", {{"enable_thinking", false}}},
              {"max_tokens", 8}};
    case FieldApi::Completion: return {{"prompt", "hi"}, {"max_tokens", 8}};
    case FieldApi::Generate:
    case FieldApi::GenerateSampling: return {{"text", "hi"}, {"sampling_params", {{"max_new_tokens", 8}}}};
    case FieldApi::Responses: return {{"input", "hi"}, {"max_output_tokens", 8}};
  }
  return json::object();
}

// The request that carries `value` for `field` (plus what the field needs around it).
json request_with(FieldApi api, const std::string& field, const json& value) {
  json b = base_request(api);
  if (api == FieldApi::GenerateSampling) {
    b["sampling_params"][field] = value;
    return b;
  }
  b[field] = value;
  if (field == "input_ids") b.erase("text");
  if (field == "stream_options" && api != FieldApi::Generate) b["stream"] = true;
  if (field == "top_logprobs" && api == FieldApi::Chat) b["logprobs"] = true;
  if (field == "continue_final_message")
    b["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hel"}}});
  return b;
}

json example_for(const RequestField& f, FieldApi api) {
  const std::string name = f.name;
  if (name == "logprobs" && api == FieldApi::Completion) return 1;
  if (name == "tools" && api == FieldApi::Responses) return json::parse(R"([{"type":"function","name":"f"}])");
  return json::parse(f.example);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class RequestFieldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::load(kModelDir);
    ASSERT_TRUE(tok.is_ok());
    tokenizer_ = std::make_unique<Tokenizer>(*tok);
    engine_.vocab = tokenizer_->vocab_size();
    engine_.eos = {8183, 8185};
    engine_.script = tokenizer_->encode("ok", true);
    ServerConfig cfg;
    cfg.port = 0;
    cfg.served_model_name = "tiny";
    cfg.tool_call_parser = "qwen3_coder";  // the tools rows: served only with a parser
    server_ = std::make_unique<OpenAiServer>(cfg, engine_, *tokenizer_, chatml, *load_generation_defaults(kModelDir, 0));
    ASSERT_TRUE(server_->start().is_ok());
  }
  void TearDown() override { server_->stop(); }
  testing::HttpResult send(const ApiCase& a, const json& body) {
    return testing::http(server_->port(), "POST", a.path, body.dump());
  }

  testing::FakeEngine engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<OpenAiServer> server_;
};

TEST_F(RequestFieldsTest, EveryRowDoesWhatItSays) {
  int checked = 0;
  for (const RequestField& f : request_fields()) {
    for (const ApiCase& a : kApis) {
      if (!(f.apis & static_cast<uint8_t>(a.api)) || !f.example) continue;
      const std::string where = std::string(a.section) + " " + f.name;
      const std::string param = (a.api == FieldApi::GenerateSampling ? "sampling_params." : "") + std::string(f.name);
      auto r = send(a, request_with(a.api, f.name, example_for(f, a.api)));
      if (f.support == FieldSupport::OnlyDefault) {
        ASSERT_EQ(r.status, 400) << where << ": " << r.body;
        json e = json::parse(r.body)["error"];
        EXPECT_EQ(e["param"], param) << where << ": " << r.body;
        EXPECT_EQ(e["code"], "unsupported_field") << where;
        // Each accepted value is served.
        for (const auto& ok : json::parse(f.accepted)) {
          auto r2 = send(a, request_with(a.api, f.name, ok));
          EXPECT_EQ(r2.status, 200) << where << " = " << ok.dump() << ": " << r2.body;
        }
      } else {
        EXPECT_EQ(r.status, 200) << where << ": " << r.body;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_TRUE(testing::wait_until([&] { return server_->active_jobs() == 0 && engine_.n_live() == 0; }));
}

TEST_F(RequestFieldsTest, UnknownFieldsAreRefusedEverywhere) {
  for (const ApiCase& a : kApis) {
    json b = base_request(a.api);
    if (a.api == FieldApi::GenerateSampling) b["sampling_params"]["frobnicate"] = 1;
    else b["frobnicate"] = 1;
    auto r = send(a, b);
    ASSERT_EQ(r.status, 400) << a.section << ": " << r.body;
    json e = json::parse(r.body)["error"];
    EXPECT_EQ(e["code"], "unrecognized_field") << a.section;
    EXPECT_NE(e["param"].get<std::string>().find("frobnicate"), std::string::npos) << a.section;
  }
}

TEST(RequestFieldsDoc, ListsEveryRowWithItsStatus) {
  const std::string doc = read_file(std::string(DELTASERVE_SOURCE_DIR) + "/docs/api-fields.md");
  ASSERT_FALSE(doc.empty());
  for (const ApiCase& a : kApis) {
    const size_t start = doc.find(std::string("### ") + a.section + "\n");
    ASSERT_NE(start, std::string::npos) << a.section;
    const size_t end = doc.find("\n### ", start + 4);
    const std::string section = doc.substr(start, end == std::string::npos ? std::string::npos : end - start);
    for (const RequestField& f : request_fields()) {
      if (!(f.apis & static_cast<uint8_t>(a.api))) continue;
      const std::string status = f.support == FieldSupport::Honoured   ? "honoured"
                                 : f.support == FieldSupport::NoEffect ? "accepted, no effect"
                                                                       : std::string("only ") + f.accepted;
      const std::string row = std::string("| `") + f.name + "` | " + status + " |";
      EXPECT_NE(section.find(row), std::string::npos) << a.section << ": missing " << row;
    }
  }
}

}  // namespace
}  // namespace deltaserve
