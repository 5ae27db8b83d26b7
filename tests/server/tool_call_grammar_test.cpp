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

// Two tools whose schemas name the same "$ref" with different definitions: each call resolves it
// in its own schema (the converter keys its reference rules by the schema document's address), in
// both formats.
TEST(ToolCallGrammar, RefsResolveInTheirOwnToolsSchema) {
  auto with_ref = [](const char* type, bool typed) {
    json p = {{"$defs", {{"V", {{"type", type}}}}}, {"properties", {{"v", {{"$ref", "#/$defs/V"}}}}}, {"required", {"v"}}};
    if (typed) p["type"] = "object";
    return p;
  };
  for (bool typed : {false, true}) {
    const json tools = json::array({tool("ints", with_ref("integer", typed)), tool("strs", with_ref("string", typed))});
    auto g = compile_or_die(tool_call_grammar(ToolParserKind::Hermes, tools, /*parallel=*/false), byte_vocab());
    ASSERT_TRUE(g);
    EXPECT_TRUE(matches(g, hermes("ints", R"({"v": 7})"))) << typed;
    EXPECT_FALSE(matches(g, hermes("ints", R"({"v": "a"})"))) << typed;
    EXPECT_TRUE(matches(g, hermes("strs", R"({"v": "a"})"))) << typed;
    EXPECT_FALSE(matches(g, hermes("strs", R"({"v": 7})"))) << typed;
    auto c = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, /*parallel=*/false), byte_vocab());
    ASSERT_TRUE(c);
    auto coder = [](const std::string& name, const std::string& v) {
      return "<tool_call>\n<function=" + name + ">\n<parameter=v>\n" + v + "\n</parameter>\n</function>\n</tool_call>";
    };
    EXPECT_TRUE(matches(c, coder("ints", "7"))) << typed;
    EXPECT_FALSE(matches(c, coder("ints", "abc"))) << typed;
    // A "$ref" has no type the parser reads as text: its value is written as JSON.
    EXPECT_TRUE(matches(c, coder("strs", "\"abc\""))) << typed;
    EXPECT_FALSE(matches(c, coder("strs", "7"))) << typed;
  }
}

// A qwen3_coder string parameter's minLength / maxLength: read as JSON Schema reads them (the
// raw text between the tags is bounded), and a wrong one is refused naming the key, not thrown
// out of the JSON library or cut to 32 bits.
TEST(ToolCallGrammar, CoderStringLengthsAreCheckedAsJsonSchemaChecksThem) {
  auto with = [](json bounds) {
    json p = {{"type", "string"}};
    p.update(bounds);
    return json::array({tool("f", {{"type", "object"}, {"properties", {{"s", p}}}, {"required", {"s"}}})});
  };
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, with({{"minLength", 2}, {"maxLength", 3}}), false),
                          byte_vocab());
  ASSERT_TRUE(g);
  auto call = [](const std::string& v) {
    return "<tool_call>\n<function=f>\n<parameter=s>\n" + v + "\n</parameter>\n</function>\n</tool_call>";
  };
  EXPECT_FALSE(matches(g, call("a")));
  EXPECT_TRUE(matches(g, call("ab")));
  EXPECT_TRUE(matches(g, call("abc")));
  EXPECT_FALSE(matches(g, call("abcd")));
  for (const json& bad : {json{{"minLength", "3"}}, json{{"minLength", nullptr}}, json{{"maxLength", 2.5}},
                          json{{"maxLength", -1}}, json{{"maxLength", 4294967301ll}}, json{{"minLength", 3}, {"maxLength", 2}}}) {
    auto r = tool_call_grammar(ToolParserKind::Qwen3Coder, with(bad), false);
    ASSERT_FALSE(r.is_ok()) << bad.dump();
    const std::string m = r.status().message();
    EXPECT_TRUE(m.find("minLength") != std::string::npos || m.find("maxLength") != std::string::npos) << m;
  }
}

// A qwen3_coder parameter whose schema names no type is raw text, as the parser reads it (and
// SGLang and vLLM): the grammar admits what the parser keeps as a string.
TEST(ToolCallGrammar, CoderUntypedParameterIsText) {
  const json tools = json::array({tool("f", {{"type", "object"}, {"properties", {{"id", {{"description", "record id"}}}}},
                                              {"required", {"id"}}})});
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, false), byte_vocab());
  ASSERT_TRUE(g);
  for (const char* v : {"abc def", "123", "\"quoted\""})
    EXPECT_TRUE(matches(g, std::string("<tool_call>\n<function=f>\n<parameter=id>\n") + v +
                               "\n</parameter>\n</function>\n</tool_call>"))
        << v;
}

// Stop 54: a text value could contain "</function>", "<parameter=" or "</tool_call>", at which the
// parser ends the value (a sampled value lost its required neighbours, or gained an undeclared
// key); an enum value holding one, and names holding '>' (read back up to the first '>') are
// refused by name.
TEST(ToolCallGrammar, CoderValuesCannotHoldTheTagsThatEndThem) {
  const json tools = json::array({tool("f", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}},
                                              {"required", {"a"}}})});
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, false), byte_vocab());
  ASSERT_TRUE(g);
  auto call = [](const std::string& v) {
    return "<tool_call>\n<function=f>\n<parameter=a>\n" + v + "\n</parameter>\n</function>\n</tool_call>";
  };
  EXPECT_TRUE(matches(g, call("x < y and a <b> c")));
  for (const char* tag : {"</parameter>", "<parameter=c>", "</function>", "</tool_call>"})
    EXPECT_FALSE(matches(g, call(std::string("x") + tag + "y"))) << tag;

  auto refused = [](const json& t, const std::string& what) {
    auto r = tool_call_grammar(ToolParserKind::Qwen3Coder, json::array({t}), false);
    ASSERT_FALSE(r.is_ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  refused(tool("f", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}, {"enum", {"ok", "x</function>"}}}}}}}),
          "</function>");
  refused(tool("get>x", {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}), "get>x");
  refused(tool("f", {{"type", "object"}, {"properties", {{"a>b", {{"type", "integer"}}}}}}), "a>b");
  refused(tool("f g", json()), "f g");
  // Hermes writes names as JSON strings: any name is fine there.
  EXPECT_TRUE(tool_call_grammar(ToolParserKind::Hermes, json::array({tool("get>x", json())}), false).is_ok());
}

// Found by review (stop 55). A parameter typed ["integer", "string"] (or anyOf integer / string):
// the parser reads the value as an integer and keeps other text raw, so the forced grammar writes
// the string raw too; as a JSON string the quotes stayed in the arguments ("\"abc\"").
TEST(ToolCallGrammar, CoderUnionWithAStringWritesTheStringRaw) {
  for (const json& p : {json{{"type", {"integer", "string"}}},
                        json{{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 5}}}}}}) {
    const json tools = json::array({tool("f", {{"type", "object"}, {"properties", {{"p", p}}}, {"required", {"p"}}})});
    auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, false), byte_vocab());
    ASSERT_TRUE(g) << p.dump();
    auto call = [](const std::string& v) {
      return "<tool_call>\n<function=f>\n<parameter=p>\n" + v + "\n</parameter>\n</function>\n</tool_call>";
    };
    EXPECT_TRUE(matches(g, call("42"))) << p.dump();
    EXPECT_TRUE(matches(g, call("abc"))) << p.dump();
    EXPECT_FALSE(matches(g, call("a</parameter>b"))) << p.dump();
    // What the parser makes of the raw forms: the integer, and the text without quotes.
    EXPECT_EQ(convert_tool_param(tools, "f", "p", "42"), json(42));
    EXPECT_EQ(convert_tool_param(tools, "f", "p", "abc"), json("abc"));
  }
  // The string's own keywords hold: maxLength 5 in the anyOf member.
  const json tools = json::array({tool("f", {{"type", "object"},
                                              {"properties", {{"p", {{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 5}}}}}}}},
                                              {"required", {"p"}}})});
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, false), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_FALSE(matches(g, "<tool_call>\n<function=f>\n<parameter=p>\nabcdefgh\n</parameter>\n</function>\n</tool_call>"));
}

// tool_choice "auto" with strict tools (stop 56): text without the call tag, then optionally the
// calls; a strict tool's arguments follow its schema, a tool that is not strict takes any.
TEST(ToolCallGrammar, AfterTextModeHoldsStrictToolsAndLeavesTheOthersFree) {
  json strict = tool("get", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}});
  strict["function"]["strict"] = true;
  const json tools = json::array({strict, tool("free", {{"type", "object"}, {"properties", {{"q", {{"type", "integer"}}}}}})});
  EXPECT_TRUE(any_strict_tool(tools));
  EXPECT_FALSE(any_strict_tool(json::array({tool("free", json::object())})));
  auto coder = [](const std::string& name, const std::string& params) {
    return "<tool_call>\n<function=" + name + ">\n" + params + "</function>\n</tool_call>";
  };
  auto param = [](const std::string& k, const std::string& v) { return "<parameter=" + k + ">\n" + v + "\n</parameter>\n"; };
  auto g = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, /*parallel=*/true, {}, ToolCallMode::AfterText),
                          byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "Just an answer, no call."));
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "Sure.\n\n" + coder("get", param("n", "5"))));
  EXPECT_TRUE(matches(g, coder("get", param("n", "5")) + "\n" + coder("free", param("anything", "text <b"))));
  EXPECT_FALSE(matches(g, coder("get", param("n", "five"))));       // strict: n is an integer
  EXPECT_FALSE(matches(g, coder("get", "")));                       // strict: n is required
  EXPECT_FALSE(matches(g, coder("get", param("n", "5")) + "more"));  // nothing after the calls
  EXPECT_FALSE(matches(g, coder("other", "")));                     // only the tools given
  EXPECT_FALSE(matches(g, "text <tool_call>\nnot a call"));
  // One call only without parallel; hermes: a free tool takes any object.
  auto one = compile_or_die(tool_call_grammar(ToolParserKind::Qwen3Coder, tools, /*parallel=*/false, {}, ToolCallMode::AfterText),
                            byte_vocab());
  ASSERT_TRUE(one);
  EXPECT_FALSE(matches(one, coder("get", param("n", "5")) + "\n" + coder("get", param("n", "6"))));
  auto h = compile_or_die(tool_call_grammar(ToolParserKind::Hermes, tools, /*parallel=*/false, {}, ToolCallMode::AfterText),
                          byte_vocab());
  ASSERT_TRUE(h);
  EXPECT_TRUE(matches(h, "ok " + hermes("free", R"({"q": "not an integer"})")));
  EXPECT_FALSE(matches(h, hermes("get", R"({"n": "5"})")));
  EXPECT_TRUE(matches(h, hermes("get", R"({"n": 5})")));
}

}  // namespace
}  // namespace deltaserve
