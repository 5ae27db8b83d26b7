// Interpreter: walks the AST with jinja2's scoping rules, which chat templates depend on:
// * each for-loop iteration gets a fresh scope, so `{% set %}` inside a loop never leaks out
//   (hence namespace() for loop-carried state); `if` does not create a scope;
// * macros run in their own scope whose parent is the template's top level;
// * a missing name or attribute is Undefined: it prints as "", is falsy, iterates as empty, and
//   raises only when used further (attribute access, arithmetic, calling it).
// Limits keep a hostile or buggy template from exhausting memory or time.
#pragma once

#include <cstdint>
#include <string>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace deltaserve::jinja {

struct RenderLimits {
  std::size_t max_output_bytes = 64u << 20;
  int max_call_depth = 64;                    // nested macro calls
  std::uint64_t max_steps = 20'000'000;       // statements + loop iterations + expressions
};

// Renders `body` with `context` as the template's variables (plus the builtin globals).
// Throws JinjaError (with the template line where known).
std::string render_body(const Body& body, const Object& context, const RenderLimits& limits);

}  // namespace deltaserve::jinja
