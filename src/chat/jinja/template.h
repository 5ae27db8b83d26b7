// Template: a parsed Jinja2 template, immutable and cheap to copy (the AST is shared), safe to
// render from several threads at once (rendering keeps all state on the stack).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "chat/jinja/ast.h"
#include "chat/jinja/runtime.h"
#include "chat/jinja/value.h"
#include "util/status.h"

namespace deltaserve::jinja {

class Template {
 public:
  // Syntax errors name the line: "template syntax error at line 3: unknown tag 'foo'".
  static Result<Template> parse(std::string_view source);
  // Render errors: "template error at line 7: <message>"; a raise_exception() message is passed
  // through verbatim after that prefix.
  Result<std::string> render(const Object& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace deltaserve::jinja
