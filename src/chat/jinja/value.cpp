#include "chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/jinja/error.h"
#include "chat/jinja/py_string.h"

namespace deltaserve::jinja {

namespace {
constexpr int kMaxDepth = 256;  // nesting guard for repr/json of deeply nested values
}

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::get(std::string_view name, int index) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  if (index >= 0 && static_cast<std::size_t>(index) < positional.size()) return &positional[index];
  return nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.p_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value::Value(std::string s) : kind_(Kind::String), p_(std::make_shared<std::string>(std::move(s))) {}

Value Value::array(Array items) {
  Value v(Kind::Array);
  v.p_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::object(Object obj) {
  Value v(Kind::Object);
  v.p_ = std::make_shared<Object>(std::move(obj));
  return v;
}

Value Value::callable(std::string name, Function fn) {
  Value v(Kind::Callable);
  v.p_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return none();
    case T::boolean: return Value(j.get<bool>());
    case T::number_integer: return Value(j.get<std::int64_t>());
    case T::number_unsigned: {
      auto u = j.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(INT64_MAX)) return Value(static_cast<std::int64_t>(u));
      return Value(static_cast<double>(u));  // beyond int64: Python keeps a big int; rare
    }
    case T::number_float: return Value(j.get<double>());
    case T::string: return Value(j.get<std::string>());
    case T::array: {
      Array a;
      a.reserve(j.size());
      for (const auto& e : j) a.push_back(from_json(e));
      return array(std::move(a));
    }
    case T::object: {
      Object o;
      o.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) o.items.emplace_back(it.key(), from_json(it.value()));
      return object(std::move(o));
    }
    default: return none();  // binary / discarded: not produced by the JSON parser
  }
}

double Value::as_double() const {
  switch (kind_) {
    case Kind::Float: return n_.f;
    case Kind::Int: return static_cast<double>(n_.i);
    case Kind::Bool: return n_.b ? 1.0 : 0.0;
    default: return 0.0;
  }
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty = "value is undefined";
  return p_ ? str() : kEmpty;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return n_.b;
    case Kind::Int: return n_.i != 0;
    case Kind::Float: return n_.f != 0.0;
    case Kind::String: return !str().empty();
    case Kind::Array: return !arr().empty();
    case Kind::Object: return obj().is_namespace || !obj().items.empty();
    case Kind::Callable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return "list";
    case Kind::Object: return obj().is_namespace ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "?";
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out with Python's repr rule.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  std::size_t e_pos = sci.find('e');
  int exp10 = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (std::size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  std::string out = neg ? "-" : "";
  if (exp10 < -4 || exp10 >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (exp10 < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exp10 - 1), '0');
    out += digits;
  } else {
    int n_int = exp10 + 1;
    if (static_cast<int>(digits.size()) <= n_int) {
      out += digits;
      out.append(static_cast<std::size_t>(n_int - static_cast<int>(digits.size())), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(n_int));
      out += '.';
      out += digits.substr(static_cast<std::size_t>(n_int));
    }
  }
  return out;
}

namespace {

void append_repr(std::string& out, const Value& v, int depth) {
  if (depth > kMaxDepth) throw JinjaError("value nested too deeply");
  switch (v.kind()) {
    case Value::Kind::String: append_py_repr_string(out, v.str()); return;
    case Value::Kind::Array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.arr()) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, e, depth + 1);
      }
      out.push_back(']');
      return;
    }
    case Value::Kind::Object: {
      if (v.obj().is_namespace) {
        out += "<Namespace ";
      } else {
        out.push_back('{');
      }
      bool first = true;
      for (const auto& [k, e] : v.obj().items) {
        if (!first) out += ", ";
        first = false;
        if (v.obj().is_namespace) {
          out += k;
          out += '=';
        } else {
          append_py_repr_string(out, k);
          out += ": ";
        }
        append_repr(out, e, depth + 1);
      }
      out.push_back(v.obj().is_namespace ? '>' : '}');
      return;
    }
    default: v.append_str(out); return;
  }
}

}  // namespace

void Value::append_str(std::string& out) const {
  switch (kind_) {
    case Kind::Undefined: return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += n_.b ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(n_.i); return;
    case Kind::Float: out += format_float(n_.f); return;
    case Kind::String: out += str(); return;
    case Kind::Array:
    case Kind::Object: append_repr(out, *this, 0); return;
    case Kind::Callable: out += "<function " + fn().name + ">"; return;
  }
}

std::string Value::to_str() const {
  if (kind_ == Kind::String) return str();
  std::string out;
  append_str(out);
  return out;
}

std::string Value::repr() const {
  std::string out;
  if (kind_ == Kind::Undefined) return "Undefined";
  append_repr(out, *this, 0);
  return out;
}

void Value::append_json(std::string& out, int indent, std::string_view item_sep,
                        std::string_view key_sep, bool sort_keys, int depth) const {
  if (depth > kMaxDepth) throw JinjaError("value nested too deeply for tojson");
  auto newline = [&](int level) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(level), ' ');
  };
  switch (kind_) {
    case Kind::Undefined: throw JinjaError("Object of type Undefined is not JSON serializable");
    case Kind::Callable: throw JinjaError("Object of type function is not JSON serializable");
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += n_.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(n_.i); return;
    case Kind::Float:
      if (std::isnan(n_.f)) out += "NaN";
      else if (std::isinf(n_.f)) out += n_.f > 0 ? "Infinity" : "-Infinity";
      else out += format_float(n_.f);
      return;
    case Kind::String: append_json_string(out, str()); return;
    case Kind::Array: {
      if (arr().empty()) { out += "[]"; return; }
      out.push_back('[');
      bool first = true;
      for (const auto& e : arr()) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        e.append_json(out, indent, item_sep, key_sep, sort_keys, depth + 1);
      }
      newline(depth);
      out.push_back(']');
      return;
    }
    case Kind::Object: {
      if (obj().items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> order;
      order.reserve(obj().items.size());
      for (const auto& kv : obj().items) order.push_back(&kv);
      if (sort_keys)
        std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      bool first = true;
      for (const auto* kv : order) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        append_json_string(out, kv->first);
        out += key_sep;
        kv->second.append_json(out, indent, item_sep, key_sep, sort_keys, depth + 1);
      }
      newline(depth);
      out.push_back('}');
      return;
    }
  }
}

void Value::release_nested() {
  // Children this value alone owns move to a work list and are freed one at a time, each after its
  // own children moved out: the destructors below never recurse more than one level.
  std::vector<Value> work;
  auto take_children = [&work](Value& v) {
    auto take = [&work](Value& c) {
      if (c.p_ && (c.kind_ == Kind::Array || c.kind_ == Kind::Object) && c.p_.use_count() == 1) work.push_back(std::move(c));
    };
    if (v.kind_ == Kind::Array) {
      for (Value& c : *static_cast<Array*>(v.p_.get())) take(c);
    } else {
      for (auto& kv : static_cast<Object*>(v.p_.get())->items) take(kv.second);
    }
  };
  take_children(*this);
  while (!work.empty()) {
    Value v = std::move(work.back());
    work.pop_back();
    take_children(v);
  }
}

bool Value::equals_at(const Value& o, int depth) const {
  if (depth > kMaxDepth) throw JinjaError("value nested too deeply to compare");
  if (is_number() && o.is_number()) {
    if ((is_int() || is_bool()) && (o.is_int() || o.is_bool())) return as_int() == o.as_int();
    return as_double() == o.as_double();
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return str() == o.str();
    case Kind::Array: {
      if (p_ == o.p_) return true;  // Python's identity shortcut
      if (arr().size() != o.arr().size()) return false;
      for (std::size_t i = 0; i < arr().size(); ++i)
        if (!(arr())[i].equals_at(o.arr()[i], depth + 1)) return false;
      return true;
    }
    case Kind::Object: {
      if (p_ == o.p_) return true;
      if (obj().is_namespace || o.obj().is_namespace) return false;  // identity only, as in Python
      if (obj().items.size() != o.obj().items.size()) return false;
      for (const auto& [k, v] : obj().items) {
        const Value* other = o.obj().find(k);
        if (!other || !v.equals_at(*other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::Callable: return p_ == o.p_;
    default: return false;
  }
}

int Value::compare_at(const Value& o, int depth) const {
  if (depth > kMaxDepth) throw JinjaError("value nested too deeply to compare");
  if (is_number() && o.is_number()) {
    if ((is_int() || is_bool()) && (o.is_int() || o.is_bool()))
      return as_int() < o.as_int() ? -1 : (as_int() > o.as_int() ? 1 : 0);
    double a = as_double(), b = o.as_double();
    return a < b ? -1 : (a > b ? 1 : 0);
  }
  if (is_string() && o.is_string()) {
    // Byte order of UTF-8 equals code point order, which is what Python compares.
    int c = str().compare(o.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (is_array() && o.is_array()) {
    std::size_t n = std::min(arr().size(), o.arr().size());
    for (std::size_t i = 0; i < n; ++i) {
      if ((arr())[i].equals_at(o.arr()[i], depth + 1)) continue;
      return (arr())[i].compare_at(o.arr()[i], depth + 1);
    }
    return arr().size() < o.arr().size() ? -1 : (arr().size() > o.arr().size() ? 1 : 0);
  }
  throw JinjaError("'<' not supported between instances of '" + type_name() + "' and '" +
                   o.type_name() + "'");
}

}  // namespace deltaserve::jinja
