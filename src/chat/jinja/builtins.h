// Filters, tests, methods and globals that HF chat templates use, with the semantics of Python
// jinja2 as configured by transformers: `tojson` is json.dumps(ensure_ascii=False) with Python's
// default separators (", " / ": ", or "," / ": " with indent) and insertion key order (not
// jinja2's own sorted, HTML-escaping tojson); raise_exception() raises with the given message.
#pragma once

#include <string>

#include "chat/jinja/value.h"

namespace deltaserve::jinja {

// All throw JinjaError on misuse (unknown name, wrong types, undefined misuse).
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

// `obj.name` for Python methods on str/dict/list (str.startswith, dict.items, ...): a bound
// callable, or Undefined when `obj` has no such method.
Value get_method(const Value& obj, const std::string& name);

// Globals every template sees: raise_exception, namespace, range, dict, strftime_now, joiner.
Object make_globals();

// The message an Undefined raises when it is used (attribute access, arithmetic, iteration of
// attributes...).
[[noreturn]] void throw_undefined(const Value& undefined);

// Python-style int/float coercion helpers shared with the runtime.
std::int64_t to_index(const Value& v, const char* what);

}  // namespace deltaserve::jinja
