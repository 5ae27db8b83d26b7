// Parser: tokens -> AST (ast.h). Precedence follows jinja2's parser: conditional expression,
// or, and, not, comparisons (incl. in / not in), + -, ~, * / // %, **, unary - +, then postfix
// (.attr, [index/slice], call) and filters/tests, which bind tighter than every binary operator
// (`a + b | f` is `a + (b | f)`, `x | string if c else y | tojson` is a conditional of filters).
#pragma once

#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"
#include "util/status.h"

namespace deltaserve::jinja {

// Errors name the template line: "line 12: unknown tag 'foo'".
Result<Body> parse_template(const std::vector<Token>& tokens);

}  // namespace deltaserve::jinja
