#include "chat/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unordered_map>

#include "chat/jinja/error.h"
#include "chat/jinja/py_string.h"

namespace deltaserve::jinja {

namespace {

constexpr std::int64_t kMaxRange = 1'000'000;  // range() guard: templates never need more

[[noreturn]] void fail(const std::string& msg) { throw JinjaError(msg); }

const Value* arg(const CallArgs& a, std::string_view name, int index) { return a.get(name, index); }

std::optional<std::string> opt_str(const CallArgs& a, std::string_view name, int index) {
  const Value* v = arg(a, name, index);
  if (!v || v->is_none() || v->is_undefined()) return std::nullopt;
  if (!v->is_string()) fail(std::string(name) + " must be a string, not " + v->type_name());
  return v->str();
}

std::string req_str(const CallArgs& a, std::string_view name, int index, const char* fn) {
  const Value* v = arg(a, name, index);
  if (!v) fail(std::string(fn) + "() missing argument '" + std::string(name) + "'");
  if (!v->is_string()) fail(std::string(fn) + "() argument must be str, not " + v->type_name());
  return v->str();
}

std::int64_t opt_int(const CallArgs& a, std::string_view name, int index, std::int64_t def) {
  const Value* v = arg(a, name, index);
  if (!v || v->is_none() || v->is_undefined()) return def;
  return to_index(*v, std::string(name).c_str());
}

bool opt_bool(const CallArgs& a, std::string_view name, int index, bool def) {
  const Value* v = arg(a, name, index);
  return v ? v->truthy() : def;
}

// Iteration as a Python for loop sees it: list items, dict keys, str characters.
Array iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Array: return v.arr();
    case Value::Kind::Object: {
      Array keys;
      for (const auto& kv : v.obj().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      Array chars;
      for (char32_t cp : utf8_decode(v.str())) {
        std::string s;
        utf8_append(s, cp);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    case Value::Kind::Undefined: return {};
    default: fail("'" + v.type_name() + "' object is not iterable");
  }
}

// jinja2 environment.getattr for filter helpers (map(attribute=...), selectattr, sort): supports
// dotted paths and integer components.
Value get_attribute(const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t pos = 0;
  while (pos <= path.size()) {
    std::size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_undefined()) throw_undefined(cur);
    if (cur.is_object()) {
      const Value* f = cur.obj().find(part);
      cur = f ? *f : Value::undefined("'dict object' has no attribute '" + part + "'");
    } else if (cur.is_array() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      std::size_t i = std::strtoull(part.c_str(), nullptr, 10);
      cur = i < cur.arr().size() ? cur.arr()[i] : Value::undefined("list index out of range");
    } else {
      cur = Value::undefined("'" + cur.type_name() + " object' has no attribute '" + part + "'");
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

CallArgs tail_args(const CallArgs& a, std::size_t from) {
  CallArgs out;
  for (std::size_t i = from; i < a.positional.size(); ++i) out.positional.push_back(a.positional[i]);
  out.keyword = a.keyword;
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

void escape_non_ascii(std::string& json) {
  if (is_ascii(json)) return;
  std::string out;
  for (char32_t cp : utf8_decode(json)) {
    char buf[16];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      char32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                    static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
      out += buf;
    }
  }
  json = std::move(out);
}

Value filter_tojson(const Value& v, const CallArgs& a) {
  // transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  // -> json.dumps. Note the positional order: `x | tojson(2)` sets ensure_ascii, not indent
  // (jinja2's own tojson takes indent first; transformers replaces it).
  int indent = -1;
  if (const Value* iv = arg(a, "indent", 1); iv && !iv->is_none()) {
    indent = static_cast<int>(std::clamp<std::int64_t>(to_index(*iv, "indent"), 0, 64));
  }
  std::string item_sep = indent < 0 ? ", " : ",", key_sep = ": ";
  if (const Value* sv = arg(a, "separators", 2); sv && !sv->is_none()) {
    if (!sv->is_array() || sv->arr().size() != 2 || !sv->arr()[0].is_string() || !sv->arr()[1].is_string())
      fail("tojson separators must be a pair of strings");
    item_sep = sv->arr()[0].str();
    key_sep = sv->arr()[1].str();
  }
  std::string out;
  v.append_json(out, indent, item_sep, key_sep, opt_bool(a, "sort_keys", 3, false));
  if (opt_bool(a, "ensure_ascii", 0, false)) escape_non_ascii(out);
  return Value(std::move(out));
}

Value filter_int(const Value& v, const CallArgs& a) {
  if (v.is_undefined()) throw_undefined(v);  // int(Undefined) raises in Python
  std::int64_t def = opt_int(a, "default", 0, 0);
  switch (v.kind()) {
    case Value::Kind::Int:
    case Value::Kind::Bool: return Value(v.as_int());
    case Value::Kind::Float: return std::isfinite(v.as_double()) ? Value(static_cast<std::int64_t>(v.as_double())) : Value(def);
    case Value::Kind::String: {
      std::string s = py_strip(v.str(), std::nullopt, true, true);
      std::int64_t base = opt_int(a, "base", 1, 10);
      char* end = nullptr;
      errno = 0;
      long long i = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (!s.empty() && end && *end == '\0' && errno == 0) return Value(static_cast<std::int64_t>(i));
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0' && std::isfinite(d)) return Value(static_cast<std::int64_t>(d));
      return Value(def);
    }
    default: return Value(def);
  }
}

Value filter_float(const Value& v, const CallArgs& a) {
  const Value* dv = arg(a, "default", 0);
  double def = dv ? dv->as_double() : 0.0;
  if (v.is_undefined()) throw_undefined(v);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    std::string s = py_strip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value(d);
  }
  return Value(def);
}

Value filter_map(const Value& v, const CallArgs& a) {
  Array out;
  if (const Value* attr = arg(a, "attribute", -1)) {
    const Value* def = arg(a, "default", -1);
    for (const Value& item : iterate(v)) {
      Value r = get_attribute(item, attr->to_str());
      if (r.is_undefined() && def) r = *def;
      out.push_back(std::move(r));
    }
    return Value::array(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string()) fail("map() needs a filter name or attribute=");
  std::string name = a.positional[0].str();
  CallArgs rest = tail_args(a, 1);
  for (const Value& item : iterate(v)) out.push_back(apply_filter(name, item, rest));
  return Value::array(std::move(out));
}

Value filter_select(const Value& v, const CallArgs& a, bool attr_mode, bool want) {
  Array out;
  std::size_t next = 0;
  std::string attr;
  if (attr_mode) {
    if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attr = a.positional[0].to_str();
    next = 1;
  }
  std::string test;
  if (a.positional.size() > next) test = a.positional[next].to_str();
  CallArgs rest = tail_args(a, next + 1);
  for (const Value& item : iterate(v)) {
    Value subject = attr_mode ? get_attribute(item, attr) : item;
    bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, rest);
    if (ok == want) out.push_back(item);
  }
  return Value::array(std::move(out));
}

// jinja2's comparison key of sort, dictsort, min, max and unique: strings compared lowercased
// unless case_sensitive (its default is False in all five).
Value fold_case(const Value& k, bool case_sensitive) {
  if (!case_sensitive && k.is_string()) return Value(ascii_lower(k.str()));
  return k;
}

Value filter_sort(const Value& v, const CallArgs& a) {
  Array items = iterate(v);
  bool reverse = opt_bool(a, "reverse", 0, false);
  bool case_sensitive = opt_bool(a, "case_sensitive", 1, false);
  std::optional<std::string> attr;
  if (const Value* av = arg(a, "attribute", 2); av && !av->is_none()) attr = av->to_str();
  auto key = [&](const Value& x) { return fold_case(attr ? get_attribute(x, *attr) : x, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = key(x).compare(key(y));
    return reverse ? c > 0 : c < 0;
  });
  return Value::array(std::move(items));
}

Value filter_indent(const Value& v, const CallArgs& a) {
  std::string width = "    ";
  if (const Value* w = arg(a, "width", 0)) {
    width = w->is_string() ? w->str() : std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(to_index(*w, "width"), 0, 1024)), ' ');
  }
  bool first = opt_bool(a, "first", 1, false), blank = opt_bool(a, "blank", 2, false);
  if (v.is_undefined()) throw_undefined(v);
  std::string s = v.to_str();
  std::string out;
  std::size_t pos = 0;
  bool is_first = true;
  while (true) {
    std::size_t nl = s.find('\n', pos);
    std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    bool indent_it = (is_first ? first : true) && (blank || !line.empty());
    if (!is_first) out.push_back('\n');
    if (indent_it) out += width;
    out += line;
    is_first = false;
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return Value(std::move(out));
}

// Python's "%s" % args formatting (s, d, i, r, f, %%).
std::string percent_format(const std::string& fmt, const Array& args) {
  std::string out;
  std::size_t ai = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%' || i + 1 >= fmt.size()) {
      out.push_back(fmt[i]);
      continue;
    }
    char c = fmt[++i];
    if (c == '%') { out.push_back('%'); continue; }
    if (ai >= args.size()) fail("not enough arguments for format string");
    const Value& x = args[ai++];
    if (c == 's') out += x.to_str();
    else if (c == 'r') out += x.repr();
    else if (c == 'd' || c == 'i') out += std::to_string(x.is_float() ? static_cast<std::int64_t>(x.as_double()) : x.as_int());
    else if (c == 'f') {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%f", x.as_double());
      out += buf;
    } else fail(std::string("unsupported format character '") + c + "'");
  }
  if (ai < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

// str.format: {} / {0} / {name}, no format specs beyond an empty one.
std::string brace_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  std::size_t auto_idx = 0;
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') { out.push_back('{'); ++i; continue; }
    if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') { out.push_back('}'); ++i; continue; }
    if (c != '{') { out.push_back(c); continue; }
    std::size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
      fail("format specs are not supported in str.format");
    const Value* v = nullptr;
    if (field.empty()) v = auto_idx < a.positional.size() ? &a.positional[auto_idx++] : nullptr;
    else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      std::size_t k = std::strtoull(field.c_str(), nullptr, 10);
      v = k < a.positional.size() ? &a.positional[k] : nullptr;
    } else {
      v = a.get(field, -1);
    }
    if (!v) fail("format: missing argument for '{" + field + "}'");
    out += v->to_str();
    i = close;
  }
  return out;
}

using FilterFn = Value (*)(const Value&, const CallArgs&);

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"tojson", filter_tojson},
      {"items", [](const Value& v, const CallArgs&) -> Value {
         if (v.is_undefined()) return Value::array({});
         if (!v.is_object()) fail("Can only get item pairs from a mapping.");
         Array out;
         for (const auto& [k, x] : v.obj().items) out.push_back(Value::array({Value(k), x}));
         return Value::array(std::move(out));
       }},
      {"length", [](const Value& v, const CallArgs&) -> Value {
         switch (v.kind()) {
           case Value::Kind::String: return Value(static_cast<std::int64_t>(utf8_length(v.str())));
           case Value::Kind::Array: return Value(static_cast<std::int64_t>(v.arr().size()));
           case Value::Kind::Object: return Value(static_cast<std::int64_t>(v.obj().items.size()));
           case Value::Kind::Undefined: return Value(0);
           default: fail("object of type '" + v.type_name() + "' has no len()");
         }
       }},
      {"trim", [](const Value& v, const CallArgs& a) -> Value {
         return Value(py_strip(v.to_str(), opt_str(a, "chars", 0), true, true));
       }},
      {"string", [](const Value& v, const CallArgs&) -> Value { return Value(v.to_str()); }},
      {"safe", [](const Value& v, const CallArgs&) -> Value { return v; }},
      {"escape", [](const Value& v, const CallArgs&) -> Value { return Value(html_escape(v.to_str())); }},
      {"upper", [](const Value& v, const CallArgs&) -> Value { return Value(ascii_upper(v.to_str())); }},
      {"lower", [](const Value& v, const CallArgs&) -> Value { return Value(ascii_lower(v.to_str())); }},
      {"capitalize", [](const Value& v, const CallArgs&) -> Value { return Value(py_capitalize(v.to_str())); }},
      {"title", [](const Value& v, const CallArgs&) -> Value { return Value(py_title(v.to_str())); }},
      {"default", [](const Value& v, const CallArgs& a) -> Value {
         const Value* d = arg(a, "default_value", 0);
         bool boolean = opt_bool(a, "boolean", 1, false);
         if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value(std::string());
         return v;
       }},
      {"first", [](const Value& v, const CallArgs&) -> Value {
         Array items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
       }},
      {"last", [](const Value& v, const CallArgs&) -> Value {
         Array items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
       }},
      {"join", [](const Value& v, const CallArgs& a) -> Value {
         std::string sep;
         if (const Value* s = arg(a, "d", 0)) sep = s->to_str();
         std::optional<std::string> attr;
         if (const Value* at = arg(a, "attribute", 1); at && !at->is_none()) attr = at->to_str();
         std::string out;
         bool first = true;
         for (const Value& x : iterate(v)) {
           if (!first) out += sep;
           first = false;
           (attr ? get_attribute(x, *attr) : x).append_str(out);
         }
         return Value(std::move(out));
       }},
      {"replace", [](const Value& v, const CallArgs& a) -> Value {
         std::string old_s = arg(a, "old", 0) ? arg(a, "old", 0)->to_str() : "";
         std::string new_s = arg(a, "new", 1) ? arg(a, "new", 1)->to_str() : "";
         return Value(py_replace(v.to_str(), old_s, new_s, opt_int(a, "count", 2, -1)));
       }},
      {"map", filter_map},
      {"select", [](const Value& v, const CallArgs& a) { return filter_select(v, a, false, true); }},
      {"reject", [](const Value& v, const CallArgs& a) { return filter_select(v, a, false, false); }},
      {"selectattr", [](const Value& v, const CallArgs& a) { return filter_select(v, a, true, true); }},
      {"rejectattr", [](const Value& v, const CallArgs& a) { return filter_select(v, a, true, false); }},
      {"int", filter_int},
      {"float", filter_float},
      {"list", [](const Value& v, const CallArgs&) -> Value { return Value::array(iterate(v)); }},
      {"abs", [](const Value& v, const CallArgs&) -> Value {
         if (v.is_int() || v.is_bool()) return Value(static_cast<std::int64_t>(std::llabs(v.as_int())));
         if (v.is_float()) return Value(std::fabs(v.as_double()));
         fail("bad operand type for abs(): '" + v.type_name() + "'");
       }},
      {"round", [](const Value& v, const CallArgs& a) -> Value {
         std::int64_t prec = opt_int(a, "precision", 0, 0);
         std::string method = arg(a, "method", 1) ? arg(a, "method", 1)->to_str() : "common";
         if (v.is_undefined()) throw_undefined(v);
         double m = std::pow(10.0, static_cast<double>(prec)), x = v.as_double() * m;
         if (method == "ceil" || method == "floor") return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / m);
         // "common" is Python's round(): an int stays an int; a float rounds half to even on its
         // exact value (2.5 -> 2.0, 2.675 at 2 digits -> 2.67, since 2.675 is 2.67499...).
         if (v.is_int() || v.is_bool()) return Value(v.as_int());
         const double d = v.as_double();
         if (!std::isfinite(d)) return Value(d);
         if (prec >= 0 && prec <= 30) {
           char buf[400];
           std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), d);  // exact, ties to even
           return Value(std::strtod(buf, nullptr));
         }
         return Value(std::nearbyint(x) / m);
       }},
      {"sum", [](const Value& v, const CallArgs& a) -> Value {
         std::optional<std::string> attr;
         if (const Value* at = arg(a, "attribute", 0); at && !at->is_none()) attr = at->to_str();
         Value total = arg(a, "start", 1) ? *arg(a, "start", 1) : Value(0);
         for (const Value& x0 : iterate(v)) {
           Value x = attr ? get_attribute(x0, *attr) : x0;
           if (!x.is_number() || !total.is_number()) fail("sum() of non-numbers");
           if (x.is_float() || total.is_float()) total = Value(total.as_double() + x.as_double());
           else total = Value(total.as_int() + x.as_int());
         }
         return total;
       }},
      {"min", [](const Value& v, const CallArgs& a) -> Value {
         Array items = iterate(v);
         if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
         const bool cs = opt_bool(a, "case_sensitive", 0, false);
         return *std::min_element(items.begin(), items.end(),
                                  [&](const Value& x, const Value& y) { return fold_case(x, cs).compare(fold_case(y, cs)) < 0; });
       }},
      {"max", [](const Value& v, const CallArgs& a) -> Value {
         Array items = iterate(v);
         if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
         const bool cs = opt_bool(a, "case_sensitive", 0, false);
         return *std::max_element(items.begin(), items.end(),
                                  [&](const Value& x, const Value& y) { return fold_case(x, cs).compare(fold_case(y, cs)) < 0; });
       }},
      {"unique", [](const Value& v, const CallArgs& a) -> Value {
         const bool cs = opt_bool(a, "case_sensitive", 0, false);
         Array out, keys;
         for (const Value& x : iterate(v)) {
           const Value k = fold_case(x, cs);
           bool seen = std::any_of(keys.begin(), keys.end(), [&](const Value& y) { return y.equals(k); });
           if (!seen) out.push_back(x), keys.push_back(k);
         }
         return Value::array(std::move(out));
       }},
      {"sort", filter_sort},
      {"reverse", [](const Value& v, const CallArgs&) -> Value {
         if (v.is_string()) {
           std::u32string u = utf8_decode(v.str());
           std::reverse(u.begin(), u.end());
           return Value(utf8_encode(u));
         }
         Array items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::array(std::move(items));
       }},
      {"dictsort", [](const Value& v, const CallArgs& a) -> Value {
         if (!v.is_object()) fail("dictsort expects a mapping");
         Array out;
         for (const auto& [k, x] : v.obj().items) out.push_back(Value::array({Value(k), x}));
         const bool cs = opt_bool(a, "case_sensitive", 0, false);
         bool by_value = arg(a, "by", 1) && arg(a, "by", 1)->to_str() == "value";
         bool reverse = opt_bool(a, "reverse", 2, false);
         std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
           int c = fold_case(x.arr()[by_value ? 1 : 0], cs).compare(fold_case(y.arr()[by_value ? 1 : 0], cs));
           return reverse ? c > 0 : c < 0;
         });
         return Value::array(std::move(out));
       }},
      {"indent", filter_indent},
      {"format", [](const Value& v, const CallArgs& a) -> Value { return Value(percent_format(v.to_str(), a.positional)); }},
      {"wordcount", [](const Value& v, const CallArgs&) -> Value {
         return Value(static_cast<std::int64_t>(py_split(v.to_str(), std::nullopt, -1).size()));
       }},
      {"attr", [](const Value& v, const CallArgs& a) -> Value {
         return get_attribute(v, req_str(a, "name", 0, "attr"));
       }},
      {"center", [](const Value& v, const CallArgs& a) -> Value {
         std::string s = v.to_str();
         std::int64_t width = opt_int(a, "width", 0, 80), n = static_cast<std::int64_t>(utf8_length(s));
         if (width <= n) return Value(s);
         std::int64_t left = (width - n) / 2 + ((width - n) % 2 != 0 && width % 2 != 0 ? 1 : 0);
         std::int64_t right = width - n - left;
         return Value(std::string(static_cast<std::size_t>(left), ' ') + s + std::string(static_cast<std::size_t>(right), ' '));
       }},
  };
  return table;
}

const std::unordered_map<std::string, std::string>& filter_aliases() {
  static const std::unordered_map<std::string, std::string> a = {
      {"count", "length"}, {"d", "default"}, {"e", "escape"}, {"forceescape", "escape"}};
  return a;
}

bool test_impl(const std::string& name, const Value& v, const CallArgs& a, bool* found) {
  *found = true;
  auto other = [&]() -> const Value& {
    if (a.positional.empty()) fail("test '" + name + "' needs an argument");
    return a.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object() && !v.obj().is_namespace;
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || (v.is_object() && !v.obj().is_namespace) || v.is_undefined();
  if (name == "callable") return v.is_callable();
  // str.islower()/isupper(): at least one cased character, and none of the other case.
  if (name == "lower") { std::string s = v.to_str(); return ascii_lower(s) == s && ascii_upper(s) != s; }
  if (name == "upper") { std::string s = v.to_str(); return ascii_upper(s) == s && ascii_lower(s) != s; }
  if (name == "escaped") return false;
  if ((name == "odd" || name == "even") && v.is_float()) {
    double m = std::fmod(v.as_double(), 2.0);
    if (m < 0) m += 2.0;
    return name == "odd" ? m == 1.0 : m == 0.0;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) fail("test '" + name + "' needs an integer");
    std::int64_t x = v.as_int();
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    std::int64_t d = to_index(other(), "divisibleby");
    if (d == 0) fail("integer division or modulo by zero");
    return d == -1 || x % d == 0;  // (INT64_MIN % -1 traps)
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.equals(other());
  if (name == "ne" || name == "!=") return !v.equals(other());
  if (name == "lt" || name == "lessthan" || name == "<") return v.compare(other()) < 0;
  if (name == "le" || name == "<=") return v.compare(other()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return v.compare(other()) > 0;
  if (name == "ge" || name == ">=") return v.compare(other()) >= 0;
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool()) return v.as_bool() == o.as_bool();
    return v.equals(o) && (v.is_int() || v.is_string());  // approximates Python identity
  }
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
    for (const Value& x : iterate(c))
      if (x.equals(v)) return true;
    return false;
  }
  *found = false;
  return false;
}

// ---- methods ----

Value str_method(const std::string& s, const std::string& name) {
  auto bind = [&](Function fn) { return Value::callable("str." + name, std::move(fn)); };
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return bind([s, starts](const CallArgs& a) -> Value {
      const Value* p = a.get("prefix", 0);
      if (!p) fail("startswith/endswith need an argument");
      auto check = [&](const Value& x) {
        if (!x.is_string()) fail("startswith/endswith first arg must be str or a tuple of str");
        const std::string& t = x.str();
        if (t.size() > s.size()) return false;
        return starts ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
      };
      if (p->is_array()) {
        for (const Value& x : p->arr())
          if (check(x)) return Value(true);
        return Value(false);
      }
      return Value(check(*p));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bind([s, l, r](const CallArgs& a) -> Value { return Value(py_strip(s, opt_str(a, "chars", 0), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return bind([s, right](const CallArgs& a) -> Value {
      auto sep = opt_str(a, "sep", 0);
      if (sep && sep->empty()) fail("empty separator");
      std::int64_t maxsplit = opt_int(a, "maxsplit", 1, -1);
      Array out;
      for (auto& part : right ? py_rsplit(s, sep, maxsplit) : py_split(s, sep, maxsplit)) out.emplace_back(std::move(part));
      return Value::array(std::move(out));
    });
  }
  if (name == "splitlines") {
    return bind([s](const CallArgs& a) -> Value {
      bool keep = opt_bool(a, "keepends", 0, false);
      Array out;
      std::size_t pos = 0;
      while (pos < s.size()) {
        std::size_t nl = s.find_first_of("\r\n", pos);
        if (nl == std::string::npos) { out.emplace_back(s.substr(pos)); break; }
        std::size_t end = nl + ((s[nl] == '\r' && nl + 1 < s.size() && s[nl + 1] == '\n') ? 2 : 1);
        out.emplace_back(s.substr(pos, (keep ? end : nl) - pos));
        pos = end;
      }
      return Value::array(std::move(out));
    });
  }
  if (name == "replace") {
    return bind([s](const CallArgs& a) -> Value {
      return Value(py_replace(s, req_str(a, "old", 0, "replace"), req_str(a, "new", 1, "replace"), opt_int(a, "count", 2, -1)));
    });
  }
  if (name == "upper") return bind([s](const CallArgs&) -> Value { return Value(ascii_upper(s)); });
  if (name == "lower") return bind([s](const CallArgs&) -> Value { return Value(ascii_lower(s)); });
  if (name == "title") return bind([s](const CallArgs&) -> Value { return Value(py_title(s)); });
  if (name == "capitalize") return bind([s](const CallArgs&) -> Value { return Value(py_capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    return bind([s, name](const CallArgs& a) -> Value {
      std::string sub = req_str(a, "sub", 0, name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(static_cast<std::int64_t>(utf8_length(s) + 1));
        std::int64_t n = 0;
        for (std::size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      std::size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (name == "index") fail("substring not found");
        return Value(-1);
      }
      return Value(static_cast<std::int64_t>(utf8_length(std::string_view(s).substr(0, p))));
    });
  }
  if (name == "join") {
    return bind([s](const CallArgs& a) -> Value {
      if (a.positional.empty()) fail("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(a.positional[0])) {
        if (!x.is_string()) fail("sequence item: expected str instance, " + x.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += x.str();
      }
      return Value(std::move(out));
    });
  }
  if (name == "format") return bind([s](const CallArgs& a) -> Value { return Value(brace_format(s, a)); });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower") {
    return bind([s, name](const CallArgs&) -> Value {
      if (s.empty()) return Value(false);
      if (name == "isspace") {
        for (char32_t cp : utf8_decode(s))
          if (!py_isspace(cp)) return Value(false);
        return Value(true);
      }
      if (name == "isupper") return Value(ascii_upper(s) == s && ascii_lower(s) != s);
      if (name == "islower") return Value(ascii_lower(s) == s && ascii_upper(s) != s);
      for (char c : s) {
        bool d = c >= '0' && c <= '9', al = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (name == "isdigit" && !d) return Value(false);
        if (name == "isalpha" && !al) return Value(false);
        if (name == "isalnum" && !d && !al) return Value(false);
      }
      return Value(true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& obj, const std::string& name) {
  auto bind = [&](Function fn) { return Value::callable("dict." + name, std::move(fn)); };
  if (name == "get") {
    return bind([obj](const CallArgs& a) -> Value {
      if (a.positional.empty()) fail("get expected at least 1 argument");
      const Value* def = a.get("default", 1);
      const Value& key = a.positional[0];
      const Value* f = key.is_string() ? obj.obj().find(key.str()) : nullptr;
      if (f) return *f;
      return def ? *def : Value::none();
    });
  }
  if (name == "items") return bind([obj](const CallArgs& a) { return apply_filter("items", obj, CallArgs{}); });
  if (name == "keys") return bind([obj](const CallArgs&) { return Value::array(iterate(obj)); });
  if (name == "values") {
    return bind([obj](const CallArgs&) {
      Array out;
      for (const auto& kv : obj.obj().items) out.push_back(kv.second);
      return Value::array(std::move(out));
    });
  }
  return Value();
}

Value list_method(const Value& list, const std::string& name) {
  if (name == "index" || name == "count") {
    return Value::callable("list." + name, [list, name](const CallArgs& a) -> Value {
      if (a.positional.empty()) fail(name + "() takes exactly one argument");
      std::int64_t n = 0;
      for (std::size_t i = 0; i < list.arr().size(); ++i) {
        if (!list.arr()[i].equals(a.positional[0])) continue;
        if (name == "index") return Value(static_cast<std::int64_t>(i));
        ++n;
      }
      if (name == "index") fail("value is not in list");
      return Value(n);
    });
  }
  return Value::undefined("'list object' has no attribute '" + name + "'");
}

}  // namespace

void throw_undefined(const Value& undefined) { throw JinjaError(undefined.undefined_hint()); }

std::int64_t to_index(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_undefined()) throw_undefined(v);
  fail(std::string(what) + ": '" + v.type_name() + "' object cannot be interpreted as an integer");
}

bool has_filter(const std::string& name) {
  return filters().count(name) || filter_aliases().count(name);
}

bool has_test(const std::string& name) {
  bool found = false;
  try {
    test_impl(name, Value(), CallArgs{{Value(0)}, {}}, &found);
  } catch (const JinjaError&) {
    found = true;
  }
  return found;
}

Value apply_filter(const std::string& name, const Value& value, const CallArgs& args) {
  auto alias = filter_aliases().find(name);
  const std::string& real = alias == filter_aliases().end() ? name : alias->second;
  auto it = filters().find(real);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(value, args);
}

bool apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  bool found = false;
  bool r = test_impl(name, value, args, &found);
  if (!found) fail("no test named '" + name + "'");
  return r;
}

Value get_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::String: return str_method(obj.str(), name);
    case Value::Kind::Object: return obj.obj().is_namespace ? Value() : dict_method(obj, name);
    case Value::Kind::Array: return list_method(obj, name);
    default: return Value();
  }
}

Object make_globals() {
  Object g;
  g.set("raise_exception", Value::callable("raise_exception", [](const CallArgs& a) -> Value {
          throw RaisedError(a.positional.empty() ? std::string("raise_exception called") : a.positional[0].to_str());
        }));
  g.set("namespace", Value::callable("namespace", [](const CallArgs& a) -> Value {
          Object ns;
          ns.is_namespace = true;
          for (const Value& p : a.positional) {
            if (!p.is_object()) fail("namespace() positional argument must be a mapping");
            for (const auto& [k, v] : p.obj().items) ns.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) ns.set(k, v);
          return Value::object(std::move(ns));
        }));
  g.set("dict", Value::callable("dict", [](const CallArgs& a) -> Value {
          Object d;
          for (const Value& p : a.positional) {
            if (!p.is_object()) fail("dict() positional argument must be a mapping");
            for (const auto& [k, v] : p.obj().items) d.set(k, v);
          }
          for (const auto& [k, v] : a.keyword) d.set(k, v);
          return Value::object(std::move(d));
        }));
  g.set("range", Value::callable("range", [](const CallArgs& a) -> Value {
          std::int64_t start = 0, stop = 0, step = 1;
          if (a.positional.size() == 1) {
            stop = to_index(a.positional[0], "range");
          } else if (a.positional.size() == 2 || a.positional.size() == 3) {
            start = to_index(a.positional[0], "range");
            stop = to_index(a.positional[1], "range");
            if (a.positional.size() == 3) step = to_index(a.positional[2], "range");
          } else {
            fail("range expected 1 to 3 arguments");
          }
          if (step == 0) fail("range() arg 3 must not be zero");
          Array out;
          for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (static_cast<std::int64_t>(out.size()) >= kMaxRange) fail("range too large");
            out.emplace_back(i);
          }
          return Value::array(std::move(out));
        }));
  g.set("strftime_now", Value::callable("strftime_now", [](const CallArgs& a) -> Value {
          std::string fmt = req_str(a, "format", 0, "strftime_now");
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace deltaserve::jinja
