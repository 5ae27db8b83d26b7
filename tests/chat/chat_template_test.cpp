// ChatTemplate: the HF reference renderings of the Qwen3 tokenizer fixture (byte-exact), model-dir
// loading rules, and the tiny-coder model's template.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "chat/chat_template.h"
#include "util/mmap_file.h"

namespace deltaserve {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kSource(DELTASERVE_SOURCE_DIR);

ojson read_json(const fs::path& p) {
  auto text = read_text_file(p);
  EXPECT_TRUE(text.is_ok()) << p;
  return ojson::parse(text.is_ok() ? *text : std::string("null"));
}

// Every "chat" case of tests/fixtures/tokenizer-qwen3/reference.json was produced by transformers'
// apply_chat_template with the template in tokenizer_config.json.
TEST(ChatTemplateQwen3, MatchesHfReferenceRenderings) {
  const fs::path dir = kSource / "tests/fixtures/tokenizer-qwen3";
  auto ct = ChatTemplate::load(dir);
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  ojson config = read_json(dir / "tokenizer_config.json");
  ojson ref = read_json(dir / "reference.json");
  ASSERT_TRUE(ref["chat"].is_array());
  ASSERT_FALSE(ref["chat"].empty());
  int n = 0;
  for (const auto& c : ref["chat"]) {
    ChatTemplate::Input in;
    in.messages = c["messages"];
    in.tools = c["tools"];
    in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    in.kwargs = c["kwargs"];
    in.bos_token = special_token_text(config, "bos_token");
    in.eos_token = special_token_text(config, "eos_token");
    auto r = ct->render(in);
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(*r, c["rendered"].get<std::string>()) << "case " << n;
    ++n;
  }
  EXPECT_EQ(n, static_cast<int>(ref["chat"].size()));
}

TEST(ChatTemplateQwen3, StringArgumentsStillRenderThroughTojson) {
  // The Qwen3 template prints string arguments raw, but render() parses them first (vLLM does the
  // same for every template), so they come out in tojson's spacing.
  auto ct = ChatTemplate::load(kSource / "tests/fixtures/tokenizer-qwen3");
  ASSERT_TRUE(ct.is_ok());
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": "{\"b\":1,\"a\":\"x\"}"}}]}])");
  in.add_generation_prompt = false;
  auto r = ct->render(in);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  // The last assistant turn after the last user query gets a think block even with no reasoning
  // (Qwen3: `loop.last or reasoning_content`). Empty content: no "\n" before the first
  // <tool_call>. Key order b, a is kept.
  EXPECT_EQ(*r,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n"
            "{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": \"x\"}}\n</tool_call><|im_end|>\n");
}

// Tool-call arguments given as a string are parsed before rendering; one nested 100,000 deep
// (200 KB) once overflowed the stack in the recursive value conversion. It is an error now.
TEST(ChatTemplateQwen3, DeeplyNestedStringArgumentsAreAnErrorNotACrash) {
  auto ct = ChatTemplate::load(kSource / "tests/fixtures/tokenizer-qwen3");
  ASSERT_TRUE(ct.is_ok());
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}])");
  in.messages[1]["tool_calls"][0]["function"]["arguments"] =
      "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  in.add_generation_prompt = false;
  auto r = ct->render(in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nested deeper than"), std::string::npos) << r.status().message();
}

TEST(ChatTemplate, TinyCoderTemplateRenders) {
  const fs::path dir = kSource / "models/tiny-coder";
  auto ct = ChatTemplate::load(dir);
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  ojson config = read_json(dir / "tokenizer_config.json");
  EXPECT_EQ(special_token_text(config, "eos_token"), std::optional<std::string>("<|endoftext|>"));
  EXPECT_EQ(special_token_text(config, "bos_token"), std::nullopt);  // null in the config
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])");
  in.kwargs = {{"enable_thinking", false}};
  auto r = ct->render(in);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

class ChatTemplateLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("ds_chat_load_" + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  std::string render_with(const Result<ChatTemplate>& ct) {
    EXPECT_TRUE(ct.is_ok()) << ct.status().message();
    if (!ct.is_ok()) return {};
    ChatTemplate::Input in;
    in.messages = ojson::parse(R"([{"role": "user", "content": "x"}])");
    in.bos_token = "<s>";
    auto r = ct->render(in);
    return r.is_ok() ? *r : r.status().message();
  }
  fs::path dir_;
};

TEST_F(ChatTemplateLoad, StringInTokenizerConfig) {
  write("tokenizer_config.json", R"({"chat_template": "{{ bos_token }}A{{ messages[0].content }}"})");
  EXPECT_EQ(render_with(ChatTemplate::load(dir_)), "<s>Ax");
}

TEST_F(ChatTemplateLoad, NamedListUsesDefault) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(render_with(ChatTemplate::load(dir_)), "D");
  // Stop 54: with tools, transformers renders the "tool_use" entry (it was ignored).
  auto ct = ChatTemplate::load(dir_);
  ASSERT_TRUE(ct.is_ok()) << ct.status().message();
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([{"role": "user", "content": "x"}])");
  in.tools = ojson::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  auto r = ct->render(in);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, "T");
}

TEST_F(ChatTemplateLoad, JinjaFileReplacesConfigAndOverrideWinsOverBoth) {
  // transformers loads chat_template.jinja over the config's chat_template.
  write("tokenizer_config.json", R"({"chat_template": "config"})");
  write("chat_template.jinja", "file\n");  // the trailing newline is dropped, as in jinja2
  EXPECT_EQ(render_with(ChatTemplate::load(dir_)), "file");
  write("override.jinja", "override");
  EXPECT_EQ(render_with(ChatTemplate::load(dir_, dir_ / "override.jinja")), "override");
}

TEST_F(ChatTemplateLoad, Errors) {
  EXPECT_FALSE(ChatTemplate::load(dir_).is_ok());  // nothing there
  write("tokenizer_config.json", R"({"eos_token": "x"})");
  auto r = ChatTemplate::load(dir_);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("no chat template"), std::string::npos) << r.status().message();
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_FALSE(ChatTemplate::load(dir_).is_ok());
  write("tokenizer_config.json", R"({"chat_template": "line1\n{% if %}"})");
  r = ChatTemplate::load(dir_);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(ChatTemplate::load(dir_, dir_ / "missing.jinja").is_ok());
  // Stop 54: a directory where the template file should be rendered an empty template.
  fs::create_directories(dir_ / "chat_template.jinja");
  r = ChatTemplate::load(dir_);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("directory"), std::string::npos) << r.status().message();
}

TEST(ChatTemplate, SpecialTokenForms) {
  ojson config = ojson::parse(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "unk_token": null})");
  EXPECT_EQ(special_token_text(config, "bos_token"), std::optional<std::string>("<s>"));
  EXPECT_EQ(special_token_text(config, "eos_token"), std::optional<std::string>("</s>"));
  EXPECT_EQ(special_token_text(config, "unk_token"), std::nullopt);
  EXPECT_EQ(special_token_text(config, "pad_token"), std::nullopt);
}

TEST(ChatTemplate, UndefinedVsNoneVariables) {
  // tools=null is passed as None (defined, falsy); a missing kwarg is undefined; bos_token is
  // undefined when the tokenizer has none.
  auto ct = ChatTemplate::parse("{{ tools is defined }}{{ tools is none }}{{ enable_thinking is defined }}{{ bos_token is defined }}");
  ASSERT_TRUE(ct.is_ok());
  ChatTemplate::Input in;
  EXPECT_EQ(*ct->render(in), "TrueTrueFalseFalse");
}

}  // namespace
}  // namespace deltaserve
