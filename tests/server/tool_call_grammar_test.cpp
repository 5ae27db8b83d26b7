// Forced tool-call grammars (tool_choice "required" / a function): what they let the model write,
// checked by matching whole texts and by parsing them back with the server's tool-call parser.
#include "server/tool_call_grammar.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../grammar/grammar_test_util.h"
#include "server/tool_call_parser.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;
using testing::byte_vocab;
using testing::compile_or_die;
using testing::matches;

json tool(const std::string& name, json parameters) {
  json fn = {{"name", name}};
  if (!parameters.is_null()) fn["parameters"] = std::move(parameters);
  return {{"type", "function"}, {"function", fn}};
}

std::string hermes(const std::string& name, const std::string& arguments) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + arguments + "}\n</tool_call>";
}

// A hermes call's arguments are a JSON object even when the tool's schema does not say so ({}, or
// properties without "type"; the fuzzer found `"arguments": 782e3` under a schema of unknown
// keywords): what the parser and clients read as arguments.
TEST(ToolCallGrammar, HermesArgumentsAreAnObjectWhenTheSchemaLeavesTheTypeOpen) {
  const json tools = json::array({tool("any", json::object()),
                                  tool("loose", {{"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}),
                                  tool("none", nullptr)});
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Hermes, tools, /*parallel=*/false), byte_vocab());
  ASSERT_TRUE(g);
  for (const std::string name : {"any", "none"}) {
    EXPECT_TRUE(matches(g, hermes(name, "{}"))) << name;
    EXPECT_TRUE(matches(g, hermes(name, R"({"x": [1, null]})"))) << name;
    for (const char* not_object : {"782e3", "\"text\"", "[1]", "null", "true"})
      EXPECT_FALSE(matches(g, hermes(name, not_object))) << name << " " << not_object;
  }
  EXPECT_TRUE(matches(g, hermes("loose", R"({"city": "Paris"})")));
  EXPECT_FALSE(matches(g, hermes("loose", "{}")));  // its required property applies now
  EXPECT_FALSE(matches(g, hermes("loose", "5")));
  // What the grammar takes, the parser reads back as a call with object arguments.
  auto parser = make_tool_call_parser(ToolParserKind::Hermes, tools);
  ToolParseDelta out = parser->push(hermes("loose", R"({"city": "Paris"})"));
  out.append(parser->finish());
  const std::vector<ToolCall> calls = merge_tool_call_deltas(out.calls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "loose");
  EXPECT_TRUE(json::parse(calls[0].arguments).is_object()) << calls[0].arguments;
}

// A typed schema keeps its own type: a tool whose parameters say "object" is unchanged.
TEST(ToolCallGrammar, HermesTypedSchemasKeepTheirType) {
  const json tools = json::array({tool("typed", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}})});
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Hermes, tools, /*parallel=*/false), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, hermes("typed", R"({"n": 3})")));
  EXPECT_TRUE(matches(g, hermes("typed", "{}")));
  EXPECT_FALSE(matches(g, hermes("typed", "3")));
}

}  // namespace
}  // namespace deltaserve
