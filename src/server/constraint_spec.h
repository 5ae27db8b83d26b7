// ConstraintSpec: what a request asks the output to match (structured output or a forced tool
// call), before compilation. The request parsers fill it; GrammarService compiles it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace deltaserve {

struct ConstraintSpec {
  enum class Kind { None, JsonSchema, JsonObject, Regex, Ebnf, StructuralTag, Choice, ToolCall };
  Kind kind = Kind::None;
  std::string param;            // the request field it came from (errors name it)
  nlohmann::ordered_json json;  // JsonSchema: the schema; StructuralTag: the tag; Choice: the
                                // strings; ToolCall: {"format", "tools", "parallel"}
  std::string text;             // Regex, Ebnf

  bool empty() const { return kind == Kind::None; }
  std::string cache_key() const;
};

}  // namespace deltaserve
