// Lexer: template source -> tokens. Whitespace control follows HF transformers' environment:
// trim_blocks=True (the first newline after a block or comment tag is dropped) and
// lstrip_blocks=True (spaces/tabs before a block or comment tag at the start of a line are
// dropped), plus the explicit `{%-`/`-%}` (strip all whitespace) and `{%+`/`+%}` (disable) marks.
// Like jinja2, newlines are normalized to \n and one trailing newline of the source is dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace deltaserve::jinja {

struct Token {
  enum class Type : std::uint8_t {
    Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof
  };
  Type type = Type::Eof;
  std::string text;  // Text/Name/String payload, or the operator
  std::int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
};

Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace deltaserve::jinja
