// JinjaError: how the interpreter reports a template or render error internally.
// The evaluator is a deep recursive walk; threading Result<T> through every node would double the
// code, so errors travel as this exception and are turned into a Status at the public boundary
// (Template::parse / Template::render). Nothing outside src/chat/jinja sees it.
#pragma once

#include <stdexcept>
#include <string>

namespace deltaserve::jinja {

class JinjaError : public std::runtime_error {
 public:
  explicit JinjaError(std::string message, int line = 0)
      : std::runtime_error(message), message_(std::move(message)), line_(line) {}
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  void set_line_if_unset(int line) {
    if (line_ == 0) line_ = line;
  }

 private:
  std::string message_;
  int line_ = 0;  // 1-based template line, 0 = unknown
};

// raise_exception() from a template: the message is the template author's, shown verbatim.
class RaisedError : public JinjaError {
 public:
  using JinjaError::JinjaError;
};

}  // namespace deltaserve::jinja
