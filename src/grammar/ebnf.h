// EBNF (GBNF / XGrammar style, what SGLang's `ebnf` field takes) -> Grammar.
//
//   root   ::= answer ("," answer)*          # comments run to the end of the line
//   answer ::= "yes" | "no" | [0-9]{1,3} | 'single quoted'
//
// Rules are `name ::= alternatives`; a rule ends where the next `name ::=` starts. Elements:
// "strings" / 'strings' (escapes \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH), classes [a-z] [^"\\],
// rule names, (groups), and the postfix operators * + ? {n} {n,} {n,m}. The start rule is `root`.
// Undefined rules, a missing root and left recursion are errors that name the rule.
#pragma once

#include <string_view>

#include "grammar/grammar.h"
#include "util/status.h"

namespace deltaserve {

Result<Grammar> grammar_from_ebnf(std::string_view text, std::string_view root_rule = "root");

}  // namespace deltaserve
