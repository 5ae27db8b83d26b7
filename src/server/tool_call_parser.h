// Tool-call parsers: turn the model's post-reasoning text into content plus OpenAI tool calls.
//
// * `qwen3_coder` (Qwen3.5/3.6): `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n
//   </function>\n</tool_call>`; values are converted with the tool's JSON schema
//   (qwen-chat-protocol.md §4.3) and streamed as SGLang does (§4.4): a header delta with id and
//   name, then `{`, one `"K": V` fragment per complete parameter, then `}`.
// * `hermes` (Qwen3): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; the header
//   and the whole arguments arrive when `</tool_call>` does.
//
// Both are streaming parsers: push() takes any split of the text, finish() ends it (closing a
// call cut off by max_tokens). The concatenation of all outputs is the same for every split, and
// the one-shot result is defined as push(all) + finish(). Text after the tool calls stays content
// (like SGLang streaming and newer vLLM).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace deltaserve {

struct ToolCallDelta {
  int index = 0;          // 0, 1, ... within one choice
  std::string id;         // set on the first delta of a call only
  std::string name;       // set on the first delta of a call only
  std::string arguments;  // a fragment of the arguments JSON ("" on the header delta)
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  void append(ToolParseDelta&& other);
};

// A complete call, as in a non-streaming response.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  virtual ToolParseDelta push(std::string_view text) = 0;
  virtual ToolParseDelta finish() = 0;
  // True once any call has started (finish_reason becomes "tool_calls").
  bool saw_tool_call() const { return n_calls_ > 0; }

 protected:
  int n_calls_ = 0;
};

enum class ToolParserKind { None, Qwen3Coder, Hermes };

Result<ToolParserKind> tool_parser_kind_from_name(const std::string& name);

// `tools` is the request's OpenAI tools array (for schema-typed values); may be null.
std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind,
                                                      const nlohmann::ordered_json& tools);

// Merges streamed deltas into whole calls.
std::vector<ToolCall> merge_tool_call_deltas(const std::vector<ToolCallDelta>& deltas);

// "call_" + 24 random hex digits.
std::string make_tool_call_id();

// The type a qwen3_coder parameter's value is read as (lower case): the schema's "type", else the
// first non-null typed member of anyOf/oneOf, else "enum" for an enum; "" for a schema made of
// references or combinators alone ("$ref", allOf, untyped anyOf: read as a literal); and "string"
// for one that names no type at all, as SGLang and vLLM read it ("123" stays "123").
std::string tool_param_type(const nlohmann::ordered_json& schema);
// Whether a value of that type is kept as its raw text (string, str, text, varchar, char, enum).
bool tool_param_is_text(const std::string& type);

// Converts one qwen3_coder parameter value by the schema of `function_name`'s `param_name`.
nlohmann::ordered_json convert_tool_param(const nlohmann::ordered_json& tools, const std::string& function_name,
                                  const std::string& param_name, const std::string& raw);

}  // namespace deltaserve
