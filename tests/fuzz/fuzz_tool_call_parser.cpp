// Tool-call parsers (qwen3_coder, hermes): any model output, pushed in one piece (non-streaming)
// or in arbitrary pieces (streaming), gives the same content and the same calls (names and
// arguments; tool_call_parser.h promises it), and no more content than was pushed.
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "server/tool_call_parser.h"

using namespace deltaserve;

static const nlohmann::ordered_json& tools() {
  static const auto t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "hot": {"type": "boolean"},
                     "temp": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}])");
  return t;
}

struct Parsed {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

static Parsed run(ToolParserKind kind, std::string_view text, std::string_view seed, bool streaming) {
  auto parser = make_tool_call_parser(kind, tools());
  std::vector<ToolCallDelta> deltas;
  std::string content;
  auto take = [&](ToolParseDelta&& d) {
    content += d.content;
    for (auto& c : d.calls) deltas.push_back(std::move(c));
  };
  if (streaming) {
    for (auto part : fuzz::split_by(text, seed)) take(parser->push(part));
  } else {
    take(parser->push(text));
  }
  take(parser->finish());
  FUZZ_CHECK(content.size() <= text.size());
  Parsed out{content, {}};
  for (const auto& call : merge_tool_call_deltas(deltas)) out.calls.emplace_back(call.name, call.arguments);
  return out;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const auto kind = (data[0] & 1) ? ToolParserKind::Hermes : ToolParserKind::Qwen3Coder;
  const std::size_t seed_len = std::min<std::size_t>(data[1] % 8, size - 2);
  std::string_view seed(reinterpret_cast<const char*>(data) + 2, seed_len);
  std::string_view text(reinterpret_cast<const char*>(data) + 2 + seed_len, size - 2 - seed_len);
  const Parsed whole = run(kind, text, seed, false);
  const Parsed streamed = run(kind, text, seed, true);
  FUZZ_CHECK(streamed.content == whole.content);
  FUZZ_CHECK(streamed.calls == whole.calls);
  return 0;
}
