// Grammars that force tool calls (tool_choice "required" or a named function), in the format the
// server's tool-call parser reads back, with arguments valid under each tool's JSON schema:
//
// * qwen3_coder: <tool_call>\n<function=NAME>\n(<parameter=K>\nVALUE\n</parameter>\n)*</function>\n</tool_call>
//   Parameters in schema order, required ones always present. A string-typed parameter (as the
//   parser types it, qwen-chat-protocol.md §4.3) is raw text: its enum values, its pattern or
//   format, or any text without "</parameter>" (within min/maxLength: any characters but '<');
//   every other parameter is JSON valid under its schema.
// * hermes: <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, ARGS a JSON object valid
//   under the tool's schema (a schema that names no type, such as {}, is taken as an object's).
//
// `tools` is the OpenAI tools array to choose from; `parallel` allows several calls (separated
// by a newline), otherwise exactly one. Leading and trailing blank space is allowed.
//
// ToolCallMode::AfterText (tool_choice "auto" with `strict` tools): any text without the call tag
// ("<tool_call>"), then optionally the calls, nothing after them. A tool whose `function.strict`
// is not true keeps its name but takes any arguments (qwen3_coder: any parameters; hermes: any
// object); strict tools' arguments are held to their schemas as in a forced call. With
// `answer_schema` (the request's response_format schema, not null) the text is instead a JSON
// value under it: the output is that answer or the calls.
#pragma once

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/tool_call_parser.h"
#include "util/status.h"

namespace deltaserve {

enum class ToolCallMode { Forced, AfterText };

Result<Grammar> tool_call_grammar(ToolParserKind format, const nlohmann::ordered_json& tools, bool parallel,
                                  const JsonSchemaOptions& options = {}, ToolCallMode mode = ToolCallMode::Forced,
                                  const nlohmann::ordered_json& answer_schema = nullptr);

// Whether any tool of an OpenAI tools array has "function": {"strict": true}.
bool any_strict_tool(const nlohmann::ordered_json& tools);

}  // namespace deltaserve
