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
#pragma once

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "server/tool_call_parser.h"
#include "util/status.h"

namespace deltaserve {

Result<Grammar> tool_call_grammar(ToolParserKind format, const nlohmann::ordered_json& tools, bool parallel,
                                  const JsonSchemaOptions& options = {});

}  // namespace deltaserve
