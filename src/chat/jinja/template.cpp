#include "chat/jinja/template.h"

#include <new>

#include "chat/jinja/error.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/parser.h"

namespace deltaserve::jinja {

Result<Template> Template::parse(std::string_view source) {
  auto tokens = tokenize(source);
  if (!tokens) return Status::error("template syntax error at " + tokens.status().message());
  auto body = parse_template(*tokens);
  if (!body) return body.status();
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body).value());
  return t;
}

Result<std::string> Template::render(const Object& context, const RenderLimits& limits) const {
  DS_CHECK(body_ != nullptr, "render() on a default-constructed Template");
  try {
    return render_body(*body_, context, limits);
  } catch (const RaisedError& e) {
    return error("template raised an exception at line ", e.line(), ": ", e.message());
  } catch (const JinjaError& e) {
    if (e.line() > 0) return error("template error at line ", e.line(), ": ", e.message());
    return error("template error: ", e.message());
  } catch (const std::bad_alloc&) {
    return error("template error: out of memory while rendering");
  }
}

}  // namespace deltaserve::jinja
