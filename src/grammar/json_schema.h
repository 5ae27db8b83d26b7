// JSON Schema -> Grammar (response_format json_schema, SGLang `json_schema`, tool arguments), and
// the grammar of any JSON object (response_format json_object).
//
// Supported: type (one or a list), properties / required / additionalProperties (bool or schema;
// absent with `properties` given = false, as XGrammar's strict mode and OpenAI structured
// outputs), min/maxProperties on maps, enum and const (their values of the schema's `type`; other
// keywords beside them are refused), items / prefixItems / minItems / maxItems,
// anyOf, oneOf (as anyOf: exclusivity is not enforced), allOf with one member, $ref to any JSON
// pointer in the document ($defs, definitions; recursion allowed), nullable (OpenAPI),
// string minLength / maxLength / pattern / format (date, time, date-time, email, uuid, ipv4,
// hostname, uri), integer and number minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (number bounds must be whole numbers), integer multipleOf 1. Annotations (title, description,
// default, examples, $schema, $id, $comment, ...) and keywords outside the JSON Schema vocabulary
// are ignored. Every other JSON Schema keyword is an error naming it and where it is.
//
// Output shape: properties in schema order; between JSON tokens at most `max_whitespace`
// whitespace characters (so a sampled value cannot run on in blank space); numbers with at most 16
// integer digits (18 for integers), 16 fraction digits and a 2-digit exponent (finite doubles).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "util/status.h"

namespace deltaserve {

struct JsonSchemaOptions {
  int max_whitespace = 16;  // longest run of blanks/newlines between tokens; -1 = no limit
};

Result<Grammar> grammar_from_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});
// Parses `text` first (errors say it is not JSON).
Result<Grammar> grammar_from_json_schema_text(std::string_view text, const JsonSchemaOptions& options = {});
// Any JSON object (response_format {"type": "json_object"}).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

// Builds schema expressions into an existing grammar (tool-call grammars combine several).
class JsonSchemaConverter {
 public:
  JsonSchemaConverter(Grammar& grammar, const JsonSchemaOptions& options);
  // JSON text valid under `schema`; `$ref`s resolve against `document` (the schema's root). A
  // reference's rule is shared by the calls given one document at one address; a different document,
  // even at an address used before (a local copy per call), gets its own rules.
  Result<Expr> value(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& document,
                     const std::string& path = "#");
  Expr whitespace() const;
  // Any JSON value / object (shared recursive rules).
  Expr any_value();
  Expr any_object();
  // The rest of a JSON string after its opening quote: characters, then the closing quote.
  Expr string_rest();

 private:
  struct Ctx;
  Result<Expr> convert(const nlohmann::ordered_json& schema, Ctx& ctx, const std::string& path, int depth);
  Result<Expr> convert_object(const nlohmann::ordered_json& s, Ctx& ctx, const std::string& path, int depth);
  Result<Expr> convert_array(const nlohmann::ordered_json& s, Ctx& ctx, const std::string& path, int depth);
  Result<Expr> convert_string(const nlohmann::ordered_json& s, const std::string& path);
  Result<Expr> convert_number(const nlohmann::ordered_json& s, bool integer, const std::string& path);
  Result<Expr> convert_ref(const std::string& ref, Ctx& ctx, const std::string& path, int depth);
  Expr const_value(const nlohmann::ordered_json& v);
  int document_index(const nlohmann::ordered_json& document);

  Grammar& g_;
  JsonSchemaOptions opts_;
  int any_value_ = -1, any_object_ = -1, any_array_ = -1, string_rest_ = -1;
  struct Document {
    nlohmann::ordered_json value;
    int index = -1;  // the documents given, numbered in order
  };

  std::map<const void*, Document> documents_;  // address -> the document given last there
  int documents_given_ = 0;
  std::map<std::pair<int, std::string>, int> ref_rules_;  // (document index, pointer) -> rule
};

// A string schema's minLength / maxLength (each absent, or a whole number in [0, 10000]); an
// error naming the key and `path` otherwise.
struct StringLengthBounds {
  std::optional<int64_t> min, max;
};
Result<StringLengthBounds> string_length_bounds(const nlohmann::ordered_json& schema, const std::string& path);

// The regex (ECMAScript syntax, unanchored text) a supported string `format` must match; nullptr
// for formats not supported (date, time, date-time, email, uuid, ipv4, hostname, uri are).
const char* json_string_format_regex(const std::string& format);

// Expression for the integers in [lo, hi] (either side may be open) as JSON writes them.
Expr integer_range_expr(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace deltaserve
