// Regular expressions -> Expr, for SGLang's `regex`, JSON Schema `pattern` and EBNF.
//
// Syntax (ECMAScript / Python common subset): literals, `.` (any character but \n), classes
// `[a-z_]` `[^...]`, escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH \uHHHH \u{H..}, groups
// `(...)` `(?:...)` `(?P<n>...)` `(?<n>...)`, `|`, quantifiers * + ? {n} {n,} {n,m} (lazy `?` and
// possessive `+` suffixes accepted: the language is the same), `^` at the start and `$` at the end.
// The whole text must match (a pattern is anchored at both ends). Unsupported constructs
// (backreferences, lookaround, \b, inline flags, anchors in the middle) are errors naming them.
#pragma once

#include <string_view>

#include "grammar/grammar.h"
#include "util/status.h"

namespace deltaserve {

struct RegexOptions {
  // Emit every character the way it appears inside a JSON string: `"`, `\` and control characters
  // as escape sequences (for JSON Schema `pattern`, which constrains the decoded value).
  bool json_string = false;
};

Result<Expr> regex_to_expr(std::string_view pattern, const RegexOptions& options = {});
Result<Grammar> grammar_from_regex(std::string_view pattern);

// The JSON-string encoding of the characters in `set` (as in RegexOptions::json_string).
Expr json_string_chars(const CodepointRanges& set);

}  // namespace deltaserve
