#include "grammar/json_schema.h"

#include <nlohmann/json.hpp>

#include "grammar/structural_tag.h"
#include "grammar_test_util.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;
using testing::byte_vocab;
using testing::compile_or_die;
using testing::matches;

struct SchemaCase {
  const char* name;
  const char* schema;
  std::vector<const char*> valid;
  std::vector<const char*> invalid;
};

// Each schema with instances the grammar must accept and instances it must reject (written by hand
// from the JSON Schema specification). Rejected instances are invalid, or valid but outside what
// the grammar generates by design: properties out of schema order, undeclared properties when
// additionalProperties is absent (strict), exponents when a number has bounds.
const std::vector<SchemaCase>& cases() {
  static const std::vector<SchemaCase> k = {
      {"string", R"({"type":"string"})", {R"("")", R"("abc")", R"("a\"b\\c\n\u00e9")", R"("中文")"}, {"abc", R"("a"b")", "1", R"("a
b")"}},
      {"integer", R"({"type":"integer"})", {"0", "-7", "123456789"}, {"01", "1.5", "-", "1e3", R"("1")"}},
      {"number", R"({"type":"number"})", {"0", "-1.25", "3e10", "2.5E-3"}, {"1.", ".5", "+1", "0x1"}},
      {"boolean", R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
      {"null", R"({"type":"null"})", {"null"}, {"None", "0"}},
      {"type list", R"({"type":["string","null"]})", {"null", R"("x")"}, {"1"}},
      {"object required", R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})",
       {R"({"name":"Ann","age":3})", R"({ "name" : "Ann" , "age" : 3 })", "{\n  \"name\": \"A\",\n  \"age\": 1\n}"},
       {R"({"name":"Ann"})", R"({"age":3,"name":"Ann"})", R"({"name":"Ann","age":3,"x":1})", R"({"name":1,"age":3})"}},
      {"object optional", R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}},"required":["b"]})",
       {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"}, {R"({})", R"({"a":1})", R"({"a":1,"c":3})", R"({,"b":1})"}},
      {"object all optional", R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}}})",
       {"{}", R"({"a":1})", R"({"b":true})", R"({"a":1,"b":false})"}, {R"({"b":true,"a":1})", R"({"c":1})", R"({"a":1,})"}},
      {"additionalProperties true", R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})",
       {R"({"a":1})", R"({"a":1,"zz":[1,{"q":null}]})", R"({"x":"y"})", "{}"}, {R"({"a":"s"})"}},
      {"additionalProperties schema", R"({"type":"object","additionalProperties":{"type":"integer"}})",
       {"{}", R"({"x":1,"y":-2})"}, {R"({"x":"1"})"}},
      {"map size", R"({"type":"object","additionalProperties":{"type":"boolean"},"minProperties":1,"maxProperties":2})",
       {R"({"a":true})", R"({"a":true,"b":false})"}, {"{}", R"({"a":true,"b":false,"c":true})"}},
      {"empty object", R"({"type":"object","properties":{},"additionalProperties":false})", {"{}", "{ }"}, {R"({"a":1})"}},
      {"nested", R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["id","tags"]}},"required":["user"]})",
       {R"({"user":{"id":1,"tags":[]}})", R"({"user":{"id":1,"tags":["a","b"]}})"}, {R"({"user":{"id":1}})", R"({"user":{"id":1,"tags":[1]}})"}},
      {"enum", R"({"enum":["red","green",3,null,{"k":[1]}]})", {R"("red")", R"("green")", "3", "null", R"({"k":[1]})", R"({ "k" : [ 1 ] })"}, {R"("blue")", "4", R"({"k":[2]})"}},
      {"const", R"({"const":"fixed"})", {R"("fixed")"}, {R"("fixe")", R"("fixedd")"}},
      {"array bounds", R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})", {"[1,2]", "[1, 2, 3]"}, {"[]", "[1]", "[1,2,3,4]", "[1,,2]"}},
      {"array any", R"({"type":"array"})", {"[]", R"([1,"a",null,[true]])"}, {"[", "[1,]"}},
      {"tuple", R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})", {R"(["a",1])"}, {R"(["a"])", R"([1,"a"])", R"(["a",1,2])"}},
      {"tuple draft4", R"({"type":"array","items":[{"type":"boolean"}],"additionalItems":{"type":"null"},"maxItems":3})", {"[true]", "[false,null,null]"}, {"[true,1]", "[null]", "[true,null,null,null]"}},
      {"anyOf", R"({"anyOf":[{"type":"integer"},{"type":"object","properties":{"x":{"type":"string"}},"required":["x"]}]})", {"5", R"({"x":"y"})"}, {R"("5")", "{}"}},
      {"oneOf", R"({"oneOf":[{"type":"boolean"},{"type":"null"}]})", {"true", "null"}, {"0"}},
      {"allOf single", R"({"allOf":[{"type":"string","maxLength":2}]})", {R"("ab")"}, {R"("abc")"}},
      {"$defs ref", R"({"$defs":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"]}},"type":"object","properties":{"a":{"$ref":"#/$defs/pt"},"b":{"$ref":"#/$defs/pt"}},"required":["a","b"]})",
       {R"({"a":{"x":1,"y":2},"b":{"x":0.5,"y":-1}})"}, {R"({"a":{"x":1},"b":{"x":0,"y":0}})"}},
      {"definitions ref", R"({"definitions":{"s":{"type":"string","enum":["a","b"]}},"type":"array","items":{"$ref":"#/definitions/s"}})", {R"(["a","b","a"])", "[]"}, {R"(["c"])"}},
      {"recursive ref", R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}},"$ref":"#/$defs/node"})",
       {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"}, {R"({"v":1,"kids":[{"v":2}]})"}},
      {"root recursion", R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["next"]})",
       {R"({"next":null})", R"({"next":{"next":null}})"}, {R"({"next":{}})"}},
      {"string lengths", R"({"type":"string","minLength":2,"maxLength":4})", {R"("ab")", R"("a\nb")", R"("éèêë")"}, {R"("a")", R"("abcde")"}},
      {"pattern", R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"}, {R"("ab-123")", R"("AB-12")"}},
      {"pattern with quote", R"({"type":"string","pattern":"a\"b"})", {R"("a\"b")"}, {R"("a"b")"}},
      {"format date", R"({"type":"string","format":"date"})", {R"("2024-02-29")"}, {R"("2024-13-01")", R"("24-01-01")"}},
      {"format date-time", R"({"type":"string","format":"date-time"})", {R"("2024-01-02T03:04:05Z")", R"("2024-01-02T03:04:05.123+02:00")"}, {R"("2024-01-02 03:04:05")"}},
      {"format uuid", R"({"type":"string","format":"uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
      {"format email", R"({"type":"string","format":"email"})", {R"("a.b@example.com")"}, {R"("a@b")", R"("@x.com")"}},
      {"format ipv4", R"({"type":"string","format":"ipv4"})", {R"("192.168.0.1")", R"("0.0.0.0")"}, {R"("256.1.1.1")", R"("1.2.3")"}},
      {"integer range", R"({"type":"integer","minimum":-15,"maximum":120})", {"-15", "-9", "0", "7", "99", "120"}, {"-16", "121", "1000", "-100"}},
      {"integer exclusive", R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10})", {"1", "9"}, {"0", "10", "-1"}},
      {"integer min only", R"({"type":"integer","minimum":42})", {"42", "99", "100", "123456"}, {"41", "0", "-42"}},
      {"integer max only", R"({"type":"integer","maximum":-3})", {"-3", "-10", "-999"}, {"-2", "0", "3"}},
      {"number bounds", R"({"type":"number","minimum":0,"maximum":10})", {"0", "0.5", "9.99", "10", "10.0"}, {"-0.5", "10.5", "11", "1e1"}},
      {"number exclusive", R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", {"0.5", "0.001"}, {"0", "0.0", "1", "1.5", "-0.1"}},
      {"number negative range", R"({"type":"number","minimum":-2,"maximum":-1})", {"-1", "-1.5", "-2", "-2.0"}, {"-2.5", "-0.5", "0"}},
      {"draft4 exclusive", R"({"type":"number","minimum":5,"exclusiveMinimum":true})", {"5.5", "6"}, {"5", "4"}},
      // Stop 55: a fractional draft-4 bound of an integer was rounded inwards and then excluded too.
      {"draft4 fractional exclusive min", R"({"type":"integer","minimum":1.5,"exclusiveMinimum":true,"maximum":2})", {"2"}, {"1", "3"}},
      {"draft4 fractional exclusive max", R"({"type":"integer","minimum":1,"maximum":1.5,"exclusiveMaximum":true})", {"1"}, {"0", "2"}},
      // Past 8 properties the members after the first are a chain of rules (stop 55): the same language.
      {"many optional", R"({"type":"object","properties":{"p0":{"type":"integer"},"p1":{"type":"integer"},"p2":{"type":"integer"},"p3":{"type":"integer"},"p4":{"type":"integer"},"p5":{"type":"integer"},"p6":{"type":"integer"},"p7":{"type":"integer"},"p8":{"type":"integer"},"p9":{"type":"integer"}},"required":["p5"]})",
       {R"({"p5":1})", R"({"p0":1,"p5":2})", R"({"p5":1,"p9":2})", R"({"p0":0,"p1":1,"p2":2,"p3":3,"p4":4,"p5":5,"p6":6,"p7":7,"p8":8,"p9":9})", R"({ "p4" : 1 , "p5" : 2 })"},
       {"{}", R"({"p0":1})", R"({"p6":1,"p5":2})", R"({"p5":1,"p5":2})", R"({"p5":1,})", R"({"p5":1,"x":2})", R"({,"p5":1})"}},
      {"many optional, extra", R"({"type":"object","properties":{"a0":{"type":"null"},"a1":{"type":"null"},"a2":{"type":"null"},"a3":{"type":"null"},"a4":{"type":"null"},"a5":{"type":"null"},"a6":{"type":"null"},"a7":{"type":"null"},"a8":{"type":"null"}},"additionalProperties":{"type":"integer"}})",
       {"{}", R"({"a8":null})", R"({"x":1})", R"({"a2":null,"a7":null,"x":1,"y":2})"}, {R"({"x":1,"a2":null})", R"({"a1":null,"a1":null})", R"({"x":null})"}},
      {"nullable", R"({"type":"string","nullable":true})", {"null", R"("x")"}, {"1"}},
      {"empty schema", R"({})", {"1", R"({"a":[1,2,{"b":null}]})", R"("s")"}, {"nul", "[1,]"}},
      {"true schema", "true", {"[]", "false"}, {"{"}},
      {"annotations ignored", R"({"title":"T","description":"d","type":"integer","default":3,"examples":[1],"x-custom":1})", {"3"}, {"\"3\""}},
      {"enum with type", R"({"type":"string","enum":["a","b",null,1]})", {R"("a")", R"("b")"}, {"null", "1", R"("c")"}},
      {"const with type list", R"({"type":["integer","null"],"const":4})", {"4"}, {"null", "5"}},
  };
  return k;
}

TEST(JsonSchema, ThirtyPlusSchemasAcceptAndReject) {
  auto vocab = byte_vocab();
  ASSERT_GE(cases().size(), 30u);
  for (const auto& c : cases()) {
    auto g = compile_or_die(grammar_from_json_schema_text(c.schema), vocab);
    ASSERT_TRUE(g) << c.name;
    for (const char* s : c.valid) {
      EXPECT_TRUE(matches(g, s)) << c.name << " should accept " << s;
      // What the grammar accepts is JSON.
      EXPECT_FALSE(json::parse(s, nullptr, false).is_discarded()) << c.name << ": test instance " << s;
    }
    for (const char* s : c.invalid) EXPECT_FALSE(matches(g, s)) << c.name << " should reject " << s;
  }
}

// Random complete outputs of every schema are JSON (independent parser) and keep the grammar's
// promises that can be checked generically.
TEST(JsonSchema, RandomOutputsParseAsJson) {
  auto vocab = byte_vocab({"\":", "\",\"", "{\"", "\"}", "[1", ",\"", "true", "null", "12", "\"a", "bc\""});
  std::mt19937_64 rng(3);
  for (const auto& c : cases()) {
    auto g = compile_or_die(grammar_from_json_schema_text(c.schema), vocab);
    ASSERT_TRUE(g);
    int complete = 0;
    for (int walk = 0; walk < 20; ++walk) {
      GrammarMatcher m(g);
      std::string text;
      for (int step = 0; step < 400 && !m.is_terminated(); ++step) {
        std::vector<int32_t> ids = m.next_token_mask().ids();
        ASSERT_FALSE(ids.empty()) << c.name << " dead end after " << text;
        int32_t pick = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
        // Head for the end once the text is long: EOS, else a closing token, else random.
        if (step > 60) {
          int best = 0;
          for (int32_t id : ids) {
            std::string_view b = m.grammar().vocab().bytes(id);
            const int rank = id == 0 ? 4 : b == "}" ? 3 : b == "]" ? 2 : b == "\"" ? 1 : 0;
            if (rank > best) {
              best = rank;
              pick = id;
            }
          }
        }
        ASSERT_TRUE(m.accept_token(pick));
        if (pick != 0) text += m.grammar().vocab().bytes(pick);
      }
      if (!m.is_terminated()) continue;
      ++complete;
      json v = json::parse(text, nullptr, false);
      EXPECT_FALSE(v.is_discarded()) << c.name << " produced " << json(text).dump();
    }
    EXPECT_GT(complete, 0) << c.name;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"type":"string","not":{"const":"x"}})", "'not' at #"},
      {R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})", "'uniqueItems' at #/properties/a"},
      {R"({"if":{"type":"string"},"then":{"maxLength":3}})", "'if'"},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "'patternProperties'"},
      {R"({"type":"number","multipleOf":0.5})", "'multipleOf'"},
      {R"({"type":"array","contains":{"type":"integer"}})", "'contains'"},
      {R"({"type":"object","propertyNames":{"maxLength":3}})", "'propertyNames'"},
      {R"({"type":"string","format":"iso-currency"})", "format 'iso-currency'"},
      {R"({"type":"number","minimum":0.5})", "whole numbers"},
      {R"({"allOf":[{"type":"string"},{"maxLength":2}]})", "allOf"},
      {R"({"$ref":"other.json#/a"})", "outside the schema"},
      {R"({"$ref":"#/$defs/missing"})", "does not resolve"},
      {R"({"type":"strin"})", "unknown type 'strin'"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "'b'"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "no integer"},
      {R"(false)", "no value is valid"},
      {R"({"type":"string","pattern":"(a)\\1"})", "backreference"},
      {R"([1,2])", "must be an object or a boolean"},
      {R"({"type":"string","const":5})", "no value of 'const' at # is of its 'type'"},
      {R"({"type":"string","enum":["abcdef","x"],"maxLength":2})", "'enum' together with 'maxLength'"},
      {R"({"type":"object","additionalProperties":false,"minProperties":1})", "'minProperties' at # cannot hold"},
  };
  for (const auto& [schema, what] : bad) {
    auto g = grammar_from_json_schema_text(schema);
    ASSERT_FALSE(g.is_ok()) << schema;
    EXPECT_NE(g.status().message().find(what), std::string::npos) << schema << ": " << g.status().message();
  }
  EXPECT_FALSE(grammar_from_json_schema_text("{not json").is_ok());
}

TEST(JsonSchema, IntegerRangesExhaustive) {
  // Every integer in a window against every bound pair from a small set.
  auto vocab = byte_vocab();
  const std::vector<std::optional<int64_t>> bounds = {std::nullopt, -101, -10, -9, -1, 0, 1, 9, 10, 99, 100, 1234};
  for (const auto& lo : bounds)
    for (const auto& hi : bounds) {
      if (lo && hi && *hi < *lo) continue;
      Grammar g;
      g.root = g.add_rule("root", integer_range_expr(lo, hi));
      auto c = compile_or_die(g, vocab);
      ASSERT_TRUE(c);
      for (int64_t v = -1300; v <= 1300; ++v) {
        const bool want = (!lo || v >= *lo) && (!hi || v <= *hi);
        ASSERT_EQ(matches(c, std::to_string(v)), want)
            << "value " << v << " lo " << (lo ? std::to_string(*lo) : "-") << " hi " << (hi ? std::to_string(*hi) : "-");
      }
      EXPECT_FALSE(matches(c, "007"));
      EXPECT_FALSE(matches(c, "-0"));
    }
}

// Found by review (stop 55): each possible first property copied every property after it, so 100
// optional properties were refused as too complex and 800 took 55 s and 4.9 GB. Now linear.
TEST(JsonSchema, ManyOptionalPropertiesCompile) {
  json props = json::object();
  for (int i = 0; i < 400; ++i) props["property_number_" + std::to_string(i)] = {{"type", "integer"}};
  const json schema = {{"type", "object"}, {"properties", props}};
  auto g = compile_or_die(grammar_from_json_schema_text(schema.dump()), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"property_number_399":1})"));
  EXPECT_TRUE(matches(g, R"({"property_number_0":1,"property_number_200":2,"property_number_399":3})"));
  EXPECT_FALSE(matches(g, R"({"property_number_200":2,"property_number_0":1})"));
  EXPECT_FALSE(matches(g, R"({"property_number_400":1})"));
}

TEST(JsonSchema, JsonObjectGrammar) {
  auto g = compile_or_die(json_object_grammar(), byte_vocab());
  ASSERT_TRUE(g);
  for (const char* s : {"{}", R"({"a":1})", R"( {"a":[1,{"b":"c"}],"d":null} )", "{\n\"x\": true\n}"})
    EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"[]", "1", R"("s")", R"({"a":})", R"({a:1})", "{", R"({"a":1}x)"})
    EXPECT_FALSE(matches(g, s)) << s;
}

// \u escapes name Unicode scalar values: a surrogate pair is one character, a lone surrogate is
// none (nlohmann::json refuses it, so a tool call's arguments would fail to parse). Values and the
// keys of additional properties (key_except) alike, every hex case.
TEST(JsonSchema, EscapesAreScalarValuesNotLoneSurrogates) {
  auto vocab = byte_vocab();
  auto str = compile_or_die(grammar_from_json_schema_text(R"({"type":"string"})"), vocab);
  auto obj = compile_or_die(
      grammar_from_json_schema_text(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})"),
      vocab);
  ASSERT_TRUE(str && obj);
  for (const char* s : {R"("\u0041\u00e9\uCFFF\uD7FF\ue000\uFFFF")", R"("\uD83D\uDE00")", R"("x\udbff\udfffy")",
                        R"("\uD800\uDC00")"}) {
    EXPECT_TRUE(matches(str, s)) << s;
    EXPECT_FALSE(json::parse(s, nullptr, false).is_discarded()) << s;  // the reference agrees
    EXPECT_TRUE(matches(obj, std::string("{") + s + ":1}")) << s;
  }
  for (const char* s : {R"("\uD800")", R"("\uDC00")", R"("\udfff")", R"("\uD83Dx")", R"("\uD83D\u0041")",
                        R"("\uDE00\uD83D")", R"("\uD800\uD800")", R"("\u12")", R"("\uDBFF\")"}) {
    EXPECT_FALSE(matches(str, s)) << s;
    EXPECT_TRUE(json::parse(s, nullptr, false).is_discarded()) << s;
    EXPECT_FALSE(matches(obj, std::string("{") + s + ":1}")) << s;
  }
}

TEST(JsonSchema, WhitespaceIsBounded) {
  JsonSchemaOptions o;
  o.max_whitespace = 3;
  auto g = compile_or_die(grammar_from_json_schema_text(R"({"type":"array","items":{"type":"integer"}})", o), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "[   1]"));
  EXPECT_FALSE(matches(g, "[    1]"));
}

TEST(JsonSchema, MasksMatchBruteForce) {
  auto vocab = byte_vocab({"{\"", "\":", "\": ", "\",", "\"}", "\"name", "name\":", "12", "3,", "[1", "],", "]}", "true",
                           "tr", "ue}", "null", "\"\"", ",\"", "\\\"", "\\u00", "\xC3\xA9", "\xC3", "\xA9\""});
  for (const char* schema :
       {R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer","minimum":1,"maximum":300}},"required":["name"]})",
        R"({"type":"array","items":{"anyOf":[{"type":"boolean"},{"type":"null"},{"type":"string","maxLength":3}]},"maxItems":4})",
        R"({"$defs":{"t":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["k"]}},"$ref":"#/$defs/t"})",
        R"({})"}) {
    auto g = compile_or_die(grammar_from_json_schema_text(schema), vocab);
    ASSERT_TRUE(g);
    EXPECT_GT(testing::check_masks_by_walking(g, 8, 24, 5), 16) << schema;
  }
}

TEST(StructuralTag, FreeTextThenStructures) {
  json spec = json::parse(R"({"type":"structural_tag",
    "structures":[{"begin":"<function=get_weather>","schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"end":"</function>"}],
    "triggers":["<function="]})");
  auto g = compile_or_die(grammar_from_structural_tag(spec), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, "any text at all"));
  EXPECT_TRUE(matches(g, R"(Let me check. <function=get_weather>{"city":"Paris"}</function> done)"));
  EXPECT_TRUE(matches(g, R"(<function=get_weather>{"city":"A"}</function><function=get_weather>{"city":"B"}</function>)"));
  EXPECT_FALSE(matches(g, R"(<function=other>{"city":"Paris"}</function>)"));
  EXPECT_FALSE(matches(g, R"(<function=get_weather>{"town":"Paris"}</function>)"));
  EXPECT_FALSE(matches(g, R"(<function=get_weather>{"city":"Paris"})"));
  auto bad = grammar_from_structural_tag(json::parse(R"({"structures":[{"begin":"x","end":"y"}],"triggers":["<f"]})"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("does not start with any trigger"), std::string::npos);
  EXPECT_FALSE(grammar_from_structural_tag(json::parse(R"({"type":"structural_tag","format":{}})")).is_ok());
  // Stop 54: unknown keys were ignored, and a misspelt "schemas" meant any JSON value.
  for (const char* text : {R"({"structures":[{"begin":"<a>","schemas":{"type":"integer"},"end":"</a>"}],"triggers":["<a>"]})",
                           R"({"structures":[{"begin":"<a>","schema":{},"end":"</a>"}],"triggers":["<a>"],"bogus":true})"}) {
    auto r = grammar_from_structural_tag(json::parse(text));
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_NE(r.status().message().find("unknown key"), std::string::npos) << r.status().message();
  }
  // Stop 55: triggers past 16 KB in all are refused before their automaton is built (40,000 of
  // 20 bytes took 2.2 GB to refuse).
  json many = json::parse(R"({"structures":[{"begin":"<f>","schema":{},"end":"</f>"}],"triggers":["<f"]})");
  for (int i = 0; i < 1000; ++i) many["triggers"].push_back("<trigger-number-" + std::to_string(i) + ">");
  auto r = grammar_from_structural_tag(many);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("bytes in all"), std::string::npos) << r.status().message();
}

// Two structures whose schemas define the same "$ref" differently: each resolves it in its own
// schema (the converter once kept a reference's rule by the document's address, and the loop's local
// copy of each schema sat at one address).
TEST(StructuralTag, RefsResolveInTheirOwnStructuresSchema) {
  json spec = json::parse(R"({"type":"structural_tag","triggers":["<f="],"structures":[
    {"begin":"<f=ints>","end":"</f>","schema":{"$defs":{"V":{"type":"integer"}},"type":"object","properties":{"v":{"$ref":"#/$defs/V"}},"required":["v"]}},
    {"begin":"<f=strs>","end":"</f>","schema":{"$defs":{"V":{"type":"string"}},"type":"object","properties":{"v":{"$ref":"#/$defs/V"}},"required":["v"]}}]})");
  auto g = compile_or_die(grammar_from_structural_tag(spec), byte_vocab());
  ASSERT_TRUE(g);
  EXPECT_TRUE(matches(g, R"(<f=ints>{"v":7}</f>)"));
  EXPECT_FALSE(matches(g, R"(<f=ints>{"v":"a"}</f>)"));
  EXPECT_TRUE(matches(g, R"(<f=strs>{"v":"a"}</f>)"));
  EXPECT_FALSE(matches(g, R"(<f=strs>{"v":7}</f>)"));
}

// The converter directly: documents given at one address one after another (a caller's local copy
// per call) keep their own references; one document given twice shares its reference's rule.
TEST(JsonSchema, ConverterTellsDocumentsAtOneAddressApart) {
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter conv(g, {});
  std::vector<Expr> alts;
  json doc;  // one address, three documents
  for (const char* type : {"integer", "string", "string"}) {
    doc = {{"$defs", {{"V", {{"type", type}}}}}, {"$ref", "#/$defs/V"}};
    auto v = conv.value(doc, doc);
    ASSERT_TRUE(v.is_ok()) << v.status().message();
    alts.push_back(Expr::seq({Expr::literal(std::string(type) + ":"), std::move(*v)}));
  }
  const int rules = g.n_rules();
  ASSERT_TRUE(conv.value(doc, doc).is_ok());
  EXPECT_EQ(g.n_rules(), rules);  // the last document again: its "$ref" rule is reused
  g.set_body(root, Expr::alt(std::move(alts)));
  g.root = root;
  auto c = compile_or_die(std::move(g), byte_vocab());
  ASSERT_TRUE(c);
  EXPECT_TRUE(matches(c, "integer:7"));
  EXPECT_FALSE(matches(c, "integer:\"a\""));
  EXPECT_TRUE(matches(c, "string:\"a\""));
  EXPECT_FALSE(matches(c, "string:7"));
}

}  // namespace
}  // namespace deltaserve
