// JSON parsing into nlohmann::ordered_json in linear time.
//
// ordered_json keeps object keys in document order (tool schemas, tool-call arguments and
// json_schema properties must keep it), but its DOM parser inserts every key with a linear search
// for a duplicate: an object with n keys costs O(n²) (100k keys: ~18 s). This parser builds the
// same value through the SAX interface and finds duplicates with a hash index once an object has
// more than a few keys, so any body parses in O(size). Semantics match ordered_json::parse: a
// repeated key keeps its first position and takes the last value.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deltaserve {

// Arrays and objects nested deeper than this are refused: every JSON text a request carries (its
// body, and tool-call arguments or schemas given as strings inside it) is walked recursively later
// (chat template values, schema conversion), and 100,000 levels overflow the stack.
inline constexpr int kMaxJsonParseDepth = 64;

// Parses `text` into `out`. On malformed JSON, or nesting deeper than max_depth, returns false and,
// if `error` is set, stores the reason there (nlohmann's parse_error message; out is then
// unspecified).
bool parse_ordered_json(std::string_view text, nlohmann::ordered_json& out, std::string* error = nullptr,
                        int max_depth = kMaxJsonParseDepth);

// `value` as JSON text, with any bytes of its strings that are not UTF-8 written as U+FFFD:
// nlohmann's dump() throws on them, and a model path or a flag value with such bytes aborted serve
// while it recorded the launch.
template <typename Json>
std::string dump_lossy(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace deltaserve
