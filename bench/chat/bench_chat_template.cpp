// Parse and render time of the Qwen3.6 chat template (tests/fixtures/qwen3.6-chat_template.jinja)
// for a 10-message agent conversation with two tools. Run:
//   build-chat/bench/chat/bench_chat_template
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "chat/chat_template.h"
#include "util/mmap_file.h"

namespace {

using deltaserve::ChatTemplate;
using ojson = nlohmann::ordered_json;

std::string template_source() {
  auto text = deltaserve::read_text_file(std::filesystem::path(DELTASERVE_SOURCE_DIR) /
                                         "tests/fixtures/qwen3.6-chat_template.jinja");
  if (!text) std::abort();
  return *text;
}

// system, user, assistant(2 tool calls), tool, tool, assistant(1 call, string args), tool,
// assistant, user, assistant: 10 messages, as an agent loop sends them.
ChatTemplate::Input conversation() {
  ChatTemplate::Input in;
  in.tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}},
       "required": ["query"]}}}])");
  in.messages = ojson::parse(R"([
    {"role": "system", "content": "You are a helpful assistant. Answer concisely and cite sources."},
    {"role": "user", "content": "What's the weather in Paris and Berlin today, and any news about the Seine?"},
    {"role": "assistant", "content": "I'll check both cities.", "reasoning_content": "Two weather lookups, then a search.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
                    {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18, \"sky\": \"cloudy\"}"},
    {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 15, \"sky\": \"rain\"}"},
    {"role": "assistant", "content": "", "reasoning_content": "Now the news.",
     "tool_calls": [{"id": "c3", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"Seine news\", \"n\": 3}"}}]},
    {"role": "tool", "tool_call_id": "c3", "content": "1. Swimming in the Seine reopens. 2. River traffic update. 3. Flood warning lifted."},
    {"role": "assistant", "content": "Paris: 18°C, cloudy. Berlin: 15°C, rain. Seine: swimming has reopened.", "reasoning_content": "Summarize."},
    {"role": "user", "content": "Thanks! Should I take an umbrella in Berlin?"},
    {"role": "assistant", "content": "Yes, rain is expected in Berlin today.", "reasoning_content": "It rains there."}
  ])");
  in.add_generation_prompt = false;
  return in;
}

void BM_ParseQwen36(benchmark::State& state) {
  const std::string src = template_source();
  for (auto _ : state) {
    auto t = ChatTemplate::parse(src);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_ParseQwen36)->Unit(benchmark::kMicrosecond);

void BM_RenderQwen36_10Messages(benchmark::State& state) {
  auto t = ChatTemplate::parse(template_source());
  if (!t) std::abort();
  const ChatTemplate::Input in = conversation();
  std::size_t bytes = 0;
  for (auto _ : state) {
    auto r = t->render(in);
    if (!r) std::abort();
    bytes = r->size();
    benchmark::DoNotOptimize(r);
  }
  state.counters["prompt_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderQwen36_10Messages)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
