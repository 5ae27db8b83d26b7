// JSON helpers for the server: a depth guard run before parsing (nlohmann's parser recurses),
// Python-style serialization (json.dumps defaults: ", " and ": ", no ASCII escaping) for tool-call
// arguments, and a dump that never throws on invalid UTF-8.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deltaserve {

// Maximum nesting of arrays/objects in `text`, ignoring brackets inside strings. Stops counting
// (returns limit + 1) as soon as `limit` is exceeded.
int json_nesting_depth(std::string_view text, int limit);

// json.dumps(value, ensure_ascii=False) as Python writes it.
std::string python_json_dumps(const nlohmann::ordered_json& value);

// value.dump() with invalid UTF-8 replaced by U+FFFD instead of throwing.
std::string safe_dump(const nlohmann::ordered_json& value);

// Replaces invalid UTF-8 sequences in `text` with U+FFFD.
std::string sanitize_utf8(std::string_view text);
// Length of the longest prefix of `text` that does not end inside a UTF-8 sequence.
std::size_t utf8_complete_prefix(std::string_view text);

// A float as the shortest decimal that reads back as it (0.6f -> 0.6, not 0.6000000238418579):
// for settings echoed in responses.
double json_float(float value);

// Python ast.literal_eval for the literals models write: dicts, lists, tuples, strings in ' or ",
// numbers, True/False/None. nullopt if `text` is not such a literal.
std::optional<nlohmann::ordered_json> parse_python_literal(std::string_view text);

}  // namespace deltaserve
