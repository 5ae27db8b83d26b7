// The Qwen3.6 chat template (tests/fixtures/qwen3.6-chat_template.jinja, a copy of
// ../shared/reference/qwen3.6-chat_template.jinja, 7,764 bytes). Expected strings are derived by
// hand from the template text; comments mark the subtle parts. They were cross-checked once
// against Python jinja2 with transformers' settings.
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "util/mmap_file.h"

namespace deltaserve {
namespace {

using ojson = nlohmann::ordered_json;

const std::filesystem::path kTemplate =
    std::filesystem::path(DELTASERVE_SOURCE_DIR) / "tests/fixtures/qwen3.6-chat_template.jinja";

// The fixed instruction text the template emits after </tools> (copied from the template).
const std::string kToolInstructions =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be "
    "specified\n- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function "
    "calls\n</IMPORTANT>";

class Qwen36Template : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ct = ChatTemplate::load("/nonexistent", kTemplate);
    ASSERT_TRUE(ct.is_ok()) << ct.status().message();
    tmpl_ = std::move(ct).value();
  }

  std::string render(const ChatTemplate::Input& in) {
    auto r = tmpl_->render(in);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? *r : std::string();
  }

  static ojson tools() {
    return ojson::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Météo du jour",
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                      "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    ])");
  }

  // system + user + assistant (reasoning, content, two tool calls) + two consecutive tool results.
  static ojson agent_messages(const ojson& weather_args, const ojson& time_args) {
    ojson m = ojson::parse(R"([
      {"role": "system", "content": "  You are helpful.\n"},
      {"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "content": "Let me check.", "reasoning_content": "\nNeed weather.\n",
       "tool_calls": [
         {"id": "call_1", "type": "function", "function": {"name": "get_weather"}},
         {"id": "call_2", "type": "function", "function": {"name": "get_time"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "tool", "tool_call_id": "call_2", "content": " 12:00 "}
    ])");
    m[2]["tool_calls"][0]["function"]["arguments"] = weather_args;
    m[2]["tool_calls"][1]["function"]["arguments"] = time_args;
    return m;
  }

  static std::string tools_system_turn() {
    // Each tool is the whole OpenAI object through tojson: ", "/": " separators, key order kept,
    // non-ASCII raw (ensure_ascii=False). The system text is trimmed and follows after "\n\n".
    return "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Météo du jour\", "
           "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, "
           "\"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}}\n"
           "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {}}}\n</tools>" +
           kToolInstructions + "\n\nYou are helpful.<|im_end|>\n";
  }

  static std::string agent_expected_body() {
    return tools_system_turn() +
           "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
           // After the last user query, so the think block is kept; reasoning is trimmed.
           // Non-empty content: the first call is preceded by "\n\n", later ones by "\n".
           // String argument values are written raw, numbers via tojson.
           "<|im_start|>assistant\n<think>\nNeed weather.\n</think>\n\nLet me check.\n\n"
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
           "<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>"
           "<|im_end|>\n"
           // Consecutive tool messages share one user turn; their content is trimmed.
           "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
           "</tool_response><|im_end|>\n";
  }

  std::optional<ChatTemplate> tmpl_;
};

TEST_F(Qwen36Template, AgentTurnWithObjectArguments) {
  ChatTemplate::Input in;
  in.messages = agent_messages(ojson::parse(R"({"city": "Paris", "days": 3})"), ojson::parse(R"({"tz": "CET"})"));
  in.tools = tools();
  // Default kwargs: enable_thinking undefined -> the generation prompt opens a think block.
  EXPECT_EQ(render(in), agent_expected_body() + "<|im_start|>assistant\n<think>\n");
}

TEST_F(Qwen36Template, StringArgumentsAreParsedFirst) {
  // OpenAI clients send arguments as a JSON string; render() parses it (as vLLM does), so the
  // output equals the object case. Compact JSON in, the template's own formatting out.
  ChatTemplate::Input in;
  in.messages = agent_messages(R"({"city":"Paris","days":3})", R"({"tz":"CET"})");
  in.tools = tools();
  EXPECT_EQ(render(in), agent_expected_body() + "<|im_start|>assistant\n<think>\n");
  // The caller's JSON is untouched.
  EXPECT_TRUE(in.messages[2]["tool_calls"][0]["function"]["arguments"].is_string());
}

TEST_F(Qwen36Template, InvalidStringArgumentsAreAnError) {
  ChatTemplate::Input in;
  in.messages = agent_messages("{not json", R"({})");
  auto r = tmpl_->render(in);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("messages[2].tool_calls[0].function.arguments is not valid JSON"),
            std::string::npos)
      << r.status().message();
}

TEST_F(Qwen36Template, ThinkingDisabledAndNoGenerationPrompt) {
  ChatTemplate::Input in;
  in.messages = agent_messages(ojson::parse(R"({"city": "Paris", "days": 3})"), ojson::parse(R"({"tz": "CET"})"));
  in.tools = tools();
  in.kwargs = {{"enable_thinking", false}};
  // enable_thinking is exactly false: an empty think block is pre-filled.
  EXPECT_EQ(render(in), agent_expected_body() + "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  in.add_generation_prompt = false;
  EXPECT_EQ(render(in), agent_expected_body());
}

TEST_F(Qwen36Template, ArgumentValueFormatting) {
  // Non-string values go through tojson (true/null/JSON), strings are raw with newlines kept.
  // Empty content: no "\n\n" before the first <tool_call>. No tools list: no system turn.
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([
    {"role": "user", "content": "Run it"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f",
      "arguments": {"s": "hi\nthere", "b": true, "z": null, "o": {"k": [1, 2]}, "l": ["x"], "x": 1.5}}}]}
  ])");
  in.add_generation_prompt = false;
  EXPECT_EQ(render(in),
            "<|im_start|>user\nRun it<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=f>\n"
            "<parameter=s>\nhi\nthere\n</parameter>\n<parameter=b>\ntrue\n</parameter>\n"
            "<parameter=z>\nnull\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n"
            "<parameter=l>\n[\"x\"]\n</parameter>\n<parameter=x>\n1.5\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n");
}

TEST_F(Qwen36Template, HistoryReasoningDroppedUnlessPreserved) {
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
    {"role": "user", "content": "Bye"}
  ])");
  // Without tools the system message is its own turn. The assistant turn comes before the last
  // user query, so by default its reasoning is dropped entirely (no think block at all).
  const std::string head = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n";
  const std::string tail = "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n<think>\n";
  EXPECT_EQ(render(in), head + "<|im_start|>assistant\nHello!<|im_end|>\n" + tail);
  // preserve_thinking=true keeps it (append-only prompts, better prefix-cache reuse).
  in.kwargs = {{"preserve_thinking", true}};
  EXPECT_EQ(render(in), head + "<|im_start|>assistant\n<think>\ngreet\n</think>\n\nHello!<|im_end|>\n" + tail);
  // `preserve_thinking is true` is an identity test: a truthy 1 does not count.
  in.kwargs = {{"preserve_thinking", 1}};
  EXPECT_EQ(render(in), head + "<|im_start|>assistant\nHello!<|im_end|>\n" + tail);
}

TEST_F(Qwen36Template, InlineThinkIsSplitOutOfContent) {
  // No reasoning_content: the text before </think> (after <think>, newlines trimmed) becomes the
  // reasoning, the rest (leading newlines removed) the content. Last turn, so the block is kept.
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\n\nsimple\n</think>\n\n4"}
  ])");
  in.add_generation_prompt = false;
  EXPECT_EQ(render(in), "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nsimple\n</think>\n\n4<|im_end|>\n");
}

TEST_F(Qwen36Template, ToolResponseOnlyUserIsNotAQuery) {
  // A user message that is entirely <tool_response>...</tool_response> does not count as the
  // last query, so the assistant turn before it still keeps its think block.
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "a", "reasoning_content": "r"},
    {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}
  ])");
  EXPECT_EQ(render(in),
            "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST_F(Qwen36Template, MultimodalContentList) {
  ChatTemplate::Input in;
  in.messages = ojson::parse(R"([{"role": "user", "content": [
    {"type": "text", "text": "look "}, {"type": "image", "image": "a.png"}, {"type": "video", "video": "b.mp4"}]}])");
  in.kwargs = {{"add_vision_id", true}};
  EXPECT_EQ(render(in),
            "<|im_start|>user\nlook Picture 1: <|vision_start|><|image_pad|><|vision_end|>"
            "Video 1: <|vision_start|><|video_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST_F(Qwen36Template, TemplateErrorsSurface) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}])", "Unexpected message role."},
      {R"([{"role": "assistant", "content": "x"}])", "No user query found in messages."},
      {R"([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])", "System message must be at the beginning."},
      {R"([])", "No messages provided."},
      {R"([{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "y"}])", "System message cannot contain images."},
  };
  for (const auto& [messages, message] : cases) {
    ChatTemplate::Input in;
    in.messages = ojson::parse(messages);
    auto r = tmpl_->render(in);
    ASSERT_FALSE(r.is_ok()) << messages;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace deltaserve
