// Reasoning and tool-call parsers on crafted model outputs (qwen-chat-protocol.md §3, §4):
// one-shot results, and the streaming property (every split point gives the same result).
#include <gtest/gtest.h>

#include "server/json_util.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;

// --- reasoning ---

struct Split {
  std::string reasoning, content;
};

Split stream_reasoning(const std::vector<std::string>& pieces, bool force) {
  ReasoningParser p(force);
  Split s;
  for (const auto& piece : pieces) {
    auto d = p.push(piece);
    s.reasoning += d.reasoning;
    s.content += d.content;
  }
  auto d = p.finish();
  s.reasoning += d.reasoning;
  s.content += d.content;
  return s;
}

void expect_reasoning_split_invariant(const std::string& text, bool force) {
  ReasoningDelta one = ReasoningParser::parse(text, force);
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    Split s = stream_reasoning({text.substr(0, cut), text.substr(cut)}, force);
    EXPECT_EQ(s.reasoning, one.reasoning) << "cut " << cut << " of " << text;
    EXPECT_EQ(s.content, one.content) << "cut " << cut << " of " << text;
  }
  // Byte by byte.
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Split s = stream_reasoning(bytes, force);
  EXPECT_EQ(s.reasoning, one.reasoning);
  EXPECT_EQ(s.content, one.content);
}

TEST(ReasoningParser, ThinkingOnSplitsAtThinkEnd) {
  auto r = ReasoningParser::parse("Plan A.\n</think>\n\nAnswer.", true);
  EXPECT_EQ(r.reasoning, "Plan A.\n");
  EXPECT_EQ(r.content, "\n\nAnswer.");
}

TEST(ReasoningParser, CutOffIsAllReasoning) {
  auto r = ReasoningParser::parse("Plan A. still thinking", true);
  EXPECT_EQ(r.reasoning, "Plan A. still thinking");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, ToolCallEndsReasoning) {
  auto r = ReasoningParser::parse("Need a tool.\n<tool_call>\n<function=f>\n</function>", true);
  EXPECT_EQ(r.reasoning, "Need a tool.\n");
  EXPECT_EQ(r.content, "<tool_call>\n<function=f>\n</function>");
}

TEST(ReasoningParser, OldStyleLeadingThink) {
  auto r = ReasoningParser::parse("<think>Plan</think>Answer", true);
  EXPECT_EQ(r.reasoning, "Plan");
  EXPECT_EQ(r.content, "Answer");
  auto r2 = ReasoningParser::parse("<think>Plan</think>Answer", false);
  EXPECT_EQ(r2.reasoning, "Plan");
  EXPECT_EQ(r2.content, "Answer");
}

TEST(ReasoningParser, ThinkingOffIsContent) {
  auto r = ReasoningParser::parse("Answer.", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Answer.");
  auto r2 = ReasoningParser::parse("x</think>y", false);
  EXPECT_EQ(r2.content, "x</think>y");
}

TEST(ReasoningParser, StreamingMatchesOneShotAtEverySplit) {
  for (bool force : {true, false}) {
    for (const char* text :
         {"Plan A.\n</think>\n\nAnswer.", "Sure thing.\n</think>\n\nHi!", "<think>x</think>y",
          "a</thi", "a</think", "</think>", "<think>", "<thin", "reason <tool_call>\n<function=f>",
          "a < b </ c </think> d < e", "no tags at all", "", "<", "</", "<<</think>>",
          "x<tool_cal", "\xE4\xB8\xAD\xE6\x96\x87</think>\xE4\xB8\xAD"}) {
      expect_reasoning_split_invariant(text, force);
    }
  }
}

TEST(ReasoningParser, StreamsDeltasAsTheyArrive) {
  ReasoningParser p(true);
  EXPECT_EQ(p.push("Sure").reasoning, "Sure");
  EXPECT_EQ(p.push(" thing").reasoning, " thing");
  auto d = p.push(".\n");
  EXPECT_EQ(d.reasoning, ".\n");
  d = p.push("</think>");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(p.push("\n\n").content, "\n\n");
  EXPECT_EQ(p.push("Hi").content, "Hi");
}

TEST(ReasoningParser, RepeatedLeadingThinkIsStripped) {
  for (bool force : {true, false}) {
    auto r = ReasoningParser::parse("<think><think>Plan</think>Answer", force);
    EXPECT_EQ(r.reasoning, "Plan");
    EXPECT_EQ(r.content, "Answer");
    r = ReasoningParser::parse("<think>\n<think>\nPlan</think>Answer", force);
    EXPECT_EQ(r.reasoning, "\nPlan");
    EXPECT_EQ(r.content, "Answer");
    // Only leading tags: one in the middle of the reasoning stays.
    r = ReasoningParser::parse("<think>a <think> b</think>c", force);
    EXPECT_EQ(r.reasoning, "a <think> b");
    for (const char* text : {"<think><think>Plan</think>Answer", "<think>\n<think>\nPlan</think>Answer",
                             "<think>\n\nPlan</think>x", "<think>\n"})
      expect_reasoning_split_invariant(text, force);
  }
}

// Only </think> and <tool_call> end the reasoning: reasoning that quotes tool-call markup stays
// reasoning (qwen-chat-protocol.md §3.3, §4.6), with the </think> after it splitting as usual.
TEST(ReasoningParser, BareFunctionDoesNotEndReasoning) {
  const std::string text = "The XML form is <function=foo> ok.\n</think>\n\nHere it is.";
  auto r = ReasoningParser::parse(text, true);
  EXPECT_EQ(r.reasoning, "The XML form is <function=foo> ok.\n");
  EXPECT_EQ(r.content, "\n\nHere it is.");
  expect_reasoning_split_invariant(text, true);
  auto t = ReasoningParser::parse("Need a tool.\n<tool_call>\n<function=f>\n</function>", true);
  EXPECT_EQ(t.reasoning, "Need a tool.\n");
  EXPECT_EQ(t.content, "<tool_call>\n<function=f>\n</function>");
}

// --- qwen3_coder ---

json weather_tools() {
  return json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
    "type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},
    "ratio":{"type":"number"},"flag":{"type":"boolean"},"opts":{"type":"object"},
    "tags":{"type":"array"},"any":{},"id":{"description":"record id"},"ref":{"$ref":"#/$defs/L"}},
    "$defs":{"L":{"type":"array"}}}}}])");
}

struct ToolResult {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallDelta> deltas;
};

ToolResult run_tools(ToolParserKind kind, const json& tools, const std::vector<std::string>& pieces) {
  auto p = make_tool_call_parser(kind, tools);
  ToolResult r;
  for (const auto& piece : pieces) {
    auto d = p->push(piece);
    r.content += d.content;
    r.deltas.insert(r.deltas.end(), d.calls.begin(), d.calls.end());
  }
  auto d = p->finish();
  r.content += d.content;
  r.deltas.insert(r.deltas.end(), d.calls.begin(), d.calls.end());
  r.calls = merge_tool_call_deltas(r.deltas);
  return r;
}

void expect_tool_split_invariant(ToolParserKind kind, const json& tools, const std::string& text) {
  ToolResult one = run_tools(kind, tools, {text});
  auto same = [&](const ToolResult& r, const std::string& where) {
    EXPECT_EQ(r.content, one.content) << where;
    ASSERT_EQ(r.calls.size(), one.calls.size()) << where;
    for (std::size_t i = 0; i < r.calls.size(); ++i) {
      EXPECT_EQ(r.calls[i].name, one.calls[i].name) << where;
      EXPECT_EQ(r.calls[i].arguments, one.calls[i].arguments) << where;
    }
  };
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    same(run_tools(kind, tools, {text.substr(0, cut), text.substr(cut)}),
         "cut " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  same(run_tools(kind, tools, bytes), "bytewise");
}

const char* kWeatherCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

TEST(Qwen3CoderParser, OneCallWithSchemaTypes) {
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {std::string("\n\n") + kWeatherCall});
  EXPECT_EQ(r.content, "\n\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(r.calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(r.calls[0].id.size(), 29u);
}

TEST(Qwen3CoderParser, StreamingDeltaShapeAsSglang) {
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {kWeatherCall});
  ASSERT_EQ(r.deltas.size(), 5u);
  EXPECT_EQ(r.deltas[0].name, "get_weather");
  EXPECT_EQ(r.deltas[0].arguments, "");
  EXPECT_FALSE(r.deltas[0].id.empty());
  EXPECT_EQ(r.deltas[1].arguments, "{");
  EXPECT_EQ(r.deltas[2].arguments, "\"city\": \"Paris\"");
  EXPECT_EQ(r.deltas[3].arguments, ", \"days\": 3");
  EXPECT_EQ(r.deltas[4].arguments, "}");
}

TEST(Qwen3CoderParser, ValueConversions) {
  json tools = weather_tools();
  auto conv = [&](const char* name, const char* raw) {
    return python_json_dumps(convert_tool_param(tools, "get_weather", name, raw));
  };
  EXPECT_EQ(conv("city", "42"), "\"42\"");
  EXPECT_EQ(conv("city", "null"), "null");
  EXPECT_EQ(conv("days", "3"), "3");
  EXPECT_EQ(conv("days", "3.5"), "\"3.5\"");
  EXPECT_EQ(conv("ratio", "3"), "3");
  EXPECT_EQ(conv("ratio", "3.0"), "3.0");
  EXPECT_EQ(conv("ratio", "abc"), "\"abc\"");
  EXPECT_EQ(conv("ratio", "0x10"), "\"0x10\"");  // Python's float() refuses hex: kept as text
  EXPECT_EQ(conv("ratio", "1e3"), "1000.0");
  EXPECT_EQ(conv("flag", "True"), "true");
  EXPECT_EQ(conv("flag", "yes"), "false");
  EXPECT_EQ(conv("opts", "{\"a\": 1}"), "{\"a\": 1}");
  EXPECT_EQ(conv("opts", "{'a': 1, 'b': [True, None]}"), "{\"a\": 1, \"b\": [true, null]}");
  EXPECT_EQ(conv("tags", "[1,2"), "\"[1,2\"");
  // A schema that names no type is read as a string, as SGLang and vLLM read it; one made of a
  // reference is read as a literal.
  EXPECT_EQ(conv("any", "[1, 2]"), "\"[1, 2]\"");
  EXPECT_EQ(conv("id", "123"), "\"123\"");
  EXPECT_EQ(conv("id", "True"), "\"True\"");
  EXPECT_EQ(conv("ref", "[1, 2]"), "[1, 2]");
  EXPECT_EQ(conv("unknown", "7"), "\"7\"");
  EXPECT_EQ(python_json_dumps(convert_tool_param(tools, "nope", "x", "7")), "\"7\"");
}

TEST(Qwen3CoderParser, MultilineValueKeepsInnerWhitespace) {
  std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n  two\n\nlines  \n</parameter>\n"
      "</function>\n</tool_call>";
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {text});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"  two\\n\\nlines  \"}");
}

TEST(Qwen3CoderParser, ParallelCallsAndNoParams) {
  std::string text = std::string(kWeatherCall) + "\n<tool_call>\n<function=g>\n</function>\n</tool_call>";
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {text});
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "g");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(Qwen3CoderParser, MissingParameterCloseTolerated) {
  std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n"
      "</function>\n</tool_call>";
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {text});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": 3})");
}

TEST(Qwen3CoderParser, TruncatedCallIsClosed) {
  std::string text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {text});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Par"})");
}

TEST(Qwen3CoderParser, TextWithoutToolCallIsContent) {
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(),
                     {"if a < b then <function=x> is prose"});
  EXPECT_EQ(r.content, "if a < b then <function=x> is prose");
  EXPECT_TRUE(r.calls.empty());
}

TEST(Qwen3CoderParser, TextAfterCallsIsKept) {
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(),
                     {std::string("Before ") + kWeatherCall + " after"});
  EXPECT_EQ(r.content, "Before  after");
  EXPECT_EQ(r.calls.size(), 1u);
}

TEST(Qwen3CoderParser, StreamingMatchesOneShotAtEverySplit) {
  json tools = weather_tools();
  for (std::string text :
       {std::string("\n\n") + kWeatherCall,
        std::string(kWeatherCall) + "\n<tool_call>\n<function=g>\n</function>\n</tool_call>",
        std::string("a<b ") + kWeatherCall + " tail <tool",
        std::string("<tool_call>\n<function=get_weather>\n<parameter=opts>\n{\"k\": [1, 2]}\n"
                    "</parameter>\n<parameter=flag>\ntrue\n</parameter>\n</function>\n</tool_call>"),
        std::string("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")}) {
    expect_tool_split_invariant(ToolParserKind::Qwen3Coder, tools, text);
  }
}

// Without the <tool_call> wrapper, <function=...> is text, known tool name or not: prose that
// shows the markup is not a call (qwen-chat-protocol.md §4.2: no <tool_call>, everything is content).
TEST(Qwen3CoderParser, FunctionBlockWithoutToolCallWrapperIsText) {
  for (const std::string& text :
       {std::string("Sure.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\nDone."),
        std::string("Use <function=get_weather> to query weather. Anything else?"),
        std::string("see <function=nope>\n</function>")}) {
    auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(), {text});
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
    expect_tool_split_invariant(ToolParserKind::Qwen3Coder, weather_tools(), text);
  }
  // The wrapped block after such prose is still a call.
  auto r = run_tools(ToolParserKind::Qwen3Coder, weather_tools(),
                     {"Use <function=get_weather>.\n<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n"
                      "</parameter>\n</function>\n</tool_call>"});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"days": 2})");
  EXPECT_EQ(r.content, "Use <function=get_weather>.\n");
}

// --- hermes ---

TEST(HermesParser, JsonCall) {
  std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 3}}\n</tool_call>";
  auto r = run_tools(ToolParserKind::Hermes, weather_tools(), {text});
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": 3})");
  expect_tool_split_invariant(ToolParserKind::Hermes, weather_tools(), text);
}

TEST(HermesParser, InvalidJsonStaysContent) {
  std::string text = "<tool_call>\nnot json\n</tool_call>";
  auto r = run_tools(ToolParserKind::Hermes, json(), {text});
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
}

// Stop 54: a JSON string in the arguments may hold "</tool_call>" (a forced call's grammar allows
// it); the call ended at that first close, did not parse, and came back as content.
TEST(HermesParser, CloseTagInsideAnArgumentStringDoesNotEndTheCall) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x</tool_call>y\", \"days\": 3}}\n"
      "</tool_call>";
  auto r = run_tools(ToolParserKind::Hermes, weather_tools(), {text});
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "x</tool_call>y", "days": 3})");
  expect_tool_split_invariant(ToolParserKind::Hermes, weather_tools(), text);
  // Text that is no call at all still comes back as it was, at the end.
  const std::string bad = "<tool_call>\nnot json\n</tool_call> and more </tool_call> tail";
  auto b = run_tools(ToolParserKind::Hermes, json(), {bad});
  EXPECT_EQ(b.content, bad);
  EXPECT_TRUE(b.calls.empty());
}

// Stop 54: parameters typed by $ref, allOf or a list of types came back as strings (the value
// converter only tried Python literals, which know True but not true).
TEST(Qwen3CoderParser, RefAllOfAndTypeListValuesAreJson) {
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "f"},
                                     {"parameters",
                                      {{"type", "object"},
                                       {"$defs", {{"Opt", {{"type", "object"}}}}},
                                       {"properties",
                                        {{"o", {{"$ref", "#/$defs/Opt"}}},
                                         {"u", {{"type", {"boolean", "null"}}}},
                                         {"w", {{"allOf", {{{"type", "boolean"}}}}}},
                                         {"s", {{"type", {"string", "null"}}}}}}}}}}}});
  const std::string text =
      "<tool_call>\n<function=f>\n<parameter=o>\n{\"on\": false, \"n\": 0}\n</parameter>\n"
      "<parameter=u>\ntrue\n</parameter>\n<parameter=w>\ntrue\n</parameter>\n<parameter=s>\ntrue\n</parameter>\n"
      "</function>\n</tool_call>";
  auto r = run_tools(ToolParserKind::Qwen3Coder, tools, {text});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"o": {"on": false, "n": 0}, "u": true, "w": true, "s": "true"})");
}

// --- json helpers ---

TEST(JsonUtil, NestingDepth) {
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": "[[[["}]})", 100), 3);
  EXPECT_EQ(json_nesting_depth(std::string(10000, '['), 64), 65);
}

TEST(JsonUtil, PythonDumps) {
  json v = json::parse(R"({"b": 1, "a": [1, 2.5, "x\u00e9"], "c": {"d": null}})");
  EXPECT_EQ(python_json_dumps(v), "{\"b\": 1, \"a\": [1, 2.5, \"x\xC3\xA9\"], \"c\": {\"d\": null}}");
}

// Floats echoed as settings: the shortest decimal that reads back as the float.
TEST(JsonUtil, FloatsEchoShort) {
  EXPECT_EQ(nlohmann::json(json_float(0.6f)).dump(), "0.6");
  EXPECT_EQ(nlohmann::json(json_float(0.95f)).dump(), "0.95");
  EXPECT_EQ(nlohmann::json(json_float(1.0f)).dump(), "1.0");
  EXPECT_EQ(nlohmann::json(json_float(1e-5f)).dump(), "1e-05");
  for (float f : {0.1f, 0.3f, 0.7f, 1.05f, 123.456f, 3.4e38f, 1.17549435e-38f})
    EXPECT_EQ(static_cast<float>(json_float(f)), f) << f;
}

TEST(JsonUtil, SanitizeUtf8) {
  EXPECT_EQ(sanitize_utf8("ok\xFFok"), "ok\xEF\xBF\xBDok");
  EXPECT_EQ(sanitize_utf8("\xE4\xB8\xAD"), "\xE4\xB8\xAD");
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD"), 5u);
}

// Numbers past int64 or double range are not read (stop 56): strtoll clamped 10**20 to INT64_MAX
// and strtod made 1e999 inf (written as null); the caller keeps the raw text instead.
TEST(PythonLiteral, NumbersOutOfRangeAreNotReadAsOtherNumbers) {
  auto ok = parse_python_literal("{'n': 5, 'x': [1.5, None, True], 'big': 9223372036854775807}");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->dump(), R"({"n":5,"x":[1.5,null,true],"big":9223372036854775807})");
  for (const char* text : {"{'n': 99999999999999999999}", "{'n': -99999999999999999999}", "{'n': 1e999}", "[-1e999]"})
    EXPECT_FALSE(parse_python_literal(text).has_value()) << text;
}

}  // namespace
}  // namespace deltaserve
