// Value: the dynamic type templates compute with. It mirrors the Python objects that HF's jinja2
// sees after json.loads: None, bool, int, float, str, list, dict (insertion ordered), plus
// jinja2's Undefined and callables (macros, bound methods, globals such as raise_exception).
// Arrays and objects are shared (reference semantics, as in Python), which namespace() relies on;
// everything except a namespace is immutable once built.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace deltaserve::jinja {

class Value;
using Array = std::vector<Value>;

// A Python dict with string keys, insertion ordered. Lookups are linear: template dicts are small
// (messages, tool schemas), and order matters for tojson/items byte-exactness.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // only namespace() objects accept `set ns.attr = ...`
  bool is_loop = false;       // a for-loop's `loop` object (gets loop.cycle on demand)

  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Argument `name` given by keyword or at position `index` (-1: keyword only); nullptr if absent.
  const Value* get(std::string_view name, int index) const;
};

// Callables throw JinjaError on bad arguments.
using Function = std::function<Value(const CallArgs&)>;
struct Callable {
  std::string name;
  Function fn;
};

class Value {
 public:
  enum class Kind : std::uint8_t { Undefined, None, Bool, Int, Float, String, Array, Object, Callable };

  Value() = default;  // Undefined
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // The last owner of a list or dict frees it level by level (release_nested), so a value nested
  // 100k deep (a namespace attribute wrapped in a loop) does not overflow the stack as it goes.
  ~Value() {
    if (p_ && (kind_ == Kind::Array || kind_ == Kind::Object) && p_.use_count() == 1) release_nested();
  }
  static Value undefined(std::string hint);  // hint: the jinja2-style message used when misused
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool) { n_.b = b; }                     // NOLINT
  Value(std::int64_t i) : kind_(Kind::Int) { n_.i = i; }              // NOLINT
  Value(int i) : kind_(Kind::Int) { n_.i = i; }                       // NOLINT
  Value(double f) : kind_(Kind::Float) { n_.f = f; }                  // NOLINT
  Value(std::string s);                                               // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                     // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}                // NOLINT
  static Value array(Array items);
  static Value object(Object obj);
  static Value callable(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return n_.b; }
  std::int64_t as_int() const { return kind_ == Kind::Bool ? (n_.b ? 1 : 0) : n_.i; }
  double as_double() const;  // Int, Float or Bool
  const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
  const Array& arr() const { return *static_cast<const Array*>(p_.get()); }
  const Object& obj() const { return *static_cast<const Object*>(p_.get()); }
  Object& mutable_obj() const { return *static_cast<Object*>(p_.get()); }  // namespace only
  const Callable& fn() const { return *static_cast<const Callable*>(p_.get()); }
  const std::string& undefined_hint() const;

  bool truthy() const;
  std::string type_name() const;  // Python's type name, for error messages
  // Python str(): strings raw, None -> "None", True -> "True", lists/dicts as Python repr.
  std::string to_str() const;
  void append_str(std::string& out) const;
  std::string repr() const;
  // json.dumps(ensure_ascii=False) with the given indent (<0: none) and separators; throws on
  // Undefined/callables as Python does.
  void append_json(std::string& out, int indent, std::string_view item_sep,
                   std::string_view key_sep, bool sort_keys, int depth = 0) const;

  // Python ==, and <, <= ... (throws JinjaError on unorderable types, and on lists or dicts nested
  // too deeply to walk).
  bool equals(const Value& other) const { return equals_at(other, 0); }
  int compare(const Value& other) const { return compare_at(other, 0); }

 private:
  explicit Value(Kind k) : kind_(k) {}
  void release_nested();
  bool equals_at(const Value& other, int depth) const;
  int compare_at(const Value& other, int depth) const;
  // 32 bytes: copies are one refcount bump, which matters for loops over long message lists.
  Kind kind_ = Kind::Undefined;
  union {
    bool b;
    std::int64_t i;
    double f;
  } n_{.i = 0};
  // String payload (or Undefined hint), Array, Object or Callable, by kind_.
  std::shared_ptr<void> p_;
};

// Python float repr(): shortest round-trip digits, scientific below 1e-4 or from 1e16.
std::string format_float(double f);

}  // namespace deltaserve::jinja
