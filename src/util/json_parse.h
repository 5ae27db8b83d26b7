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

// Parses `text` into `out`. On malformed JSON returns false and, if `error` is set, stores
// nlohmann's parse_error message there (out is then unspecified).
bool parse_ordered_json(std::string_view text, nlohmann::ordered_json& out, std::string* error = nullptr);

}  // namespace deltaserve
