// SGLang's structural tag (response_format {"type": "structural_tag", ...}) -> Grammar:
//
//   {"type": "structural_tag",
//    "structures": [{"begin": "<function=get_weather>", "schema": {...}, "end": "</function>"}],
//    "triggers": ["<function="]}
//
// Free text, except that once a trigger appears the text must go on with one of the structures
// whose `begin` starts with that trigger: `begin`, JSON valid under `schema`, `end`; then free
// text again. Every `begin` must start with a trigger. The newer XGrammar form ("format": {...})
// is refused with an error that says so.
#pragma once

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "util/status.h"

namespace deltaserve {

Result<Grammar> grammar_from_structural_tag(const nlohmann::ordered_json& spec, const JsonSchemaOptions& options = {});

}  // namespace deltaserve
