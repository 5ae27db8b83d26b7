// Jinja: any source parses or fails with a Status; what parses renders (within limits) or fails
// with a Status, against a chat-like context.
#include <cstdint>
#include <string_view>

#include "chat/jinja/template.h"
#include "fuzz_util.h"

using namespace deltaserve::jinja;

static const Object& context() {
  static const Object ctx = Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": "<think>r</think>a",
                  "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1, "y": [1, "2"]}}}]},
                 {"role": "tool", "content": "t"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>",
    "x": [1, "a", null, 2.5, {"k": "v"}], "n": 3, "s": "héllo"})")).obj();
  return ctx;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view src(reinterpret_cast<const char*>(data), size);
  auto t = Template::parse(src);
  if (!t) {
    FUZZ_CHECK(!t.status().message().empty());
    return 0;
  }
  RenderLimits limits;
  limits.max_steps = 100000;
  limits.max_output_bytes = 1 << 20;
  auto r = t->render(context(), limits);
  if (!r) FUZZ_CHECK(!r.status().message().empty());
  else FUZZ_CHECK(r->size() <= (1u << 20) + 65536);
  return 0;
}
