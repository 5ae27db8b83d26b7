#include "chat/jinja/runtime.h"

#include <cmath>

#include "chat/jinja/builtins.h"
#include "chat/jinja/error.h"
#include "chat/jinja/py_string.h"

namespace deltaserve::jinja {

namespace {

[[noreturn]] void fail(const std::string& msg) { throw JinjaError(msg); }

struct Scope {
  Object vars;
  Scope* parent = nullptr;

  Scope() = default;
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope() {
    if (alive_) *alive_ = false;
  }
  // A flag that turns false when this scope ends: a macro defined in it reads it while it lasts.
  std::shared_ptr<bool> alive() {
    if (!alive_) alive_ = std::make_shared<bool>(true);
    return alive_;
  }

  const Value* lookup(std::string_view name) const {
    for (const Scope* s = this; s; s = s->parent)
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }

 private:
  std::shared_ptr<bool> alive_;
};

enum class Flow { Normal, Break, Continue };

class Interpreter {
 public:
  Interpreter(const Object& context, const RenderLimits& limits) : limits_(limits) {
    globals_.vars = make_globals();
    root_.vars = context;
    root_.parent = &globals_;
    scope_ = &root_;
  }

  std::string run(const Body& body) {
    std::string out;
    out_ = &out;
    exec_body(body);
    return out;
  }

 private:
  // ---- helpers ----
  void step() {
    if (++steps_ > limits_.max_steps) fail("template exceeded its step limit (infinite loop?)");
  }

  void emit(std::string_view s) {
    if (out_->size() + s.size() > limits_.max_output_bytes) fail("template output exceeds the size limit");
    out_->append(s);
  }

  struct ScopeGuard {
    ScopeGuard(Interpreter* in, Scope* s) : in_(in), saved_(in->scope_) { in->scope_ = s; }
    ~ScopeGuard() { in_->scope_ = saved_; }
    Interpreter* in_;
    Scope* saved_;
  };

  struct OutputGuard {
    OutputGuard(Interpreter* in, std::string* o) : in_(in), saved_(in->out_) { in->out_ = o; }
    ~OutputGuard() { in_->out_ = saved_; }
    Interpreter* in_;
    std::string* saved_;
  };

  // ---- statements ----
  Flow exec_body(const Body& body) {
    for (const auto& s : body) {
      Flow f = exec(*s);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s) {
    step();
    try {
      return exec_inner(s);
    } catch (JinjaError& e) {
      e.set_line_if_unset(s.line);
      throw;
    }
  }

  Flow exec_inner(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::Text: emit(s.text); return Flow::Normal;
      case Stmt::Kind::Output: {
        Value v = eval(*s.expr);
        if (v.is_string()) {
          emit(v.str());
        } else {
          std::string tmp;
          v.append_str(tmp);
          emit(tmp);
        }
        return Flow::Normal;
      }
      case Stmt::Kind::If:
        for (std::size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i]).truthy()) return exec_body(s.bodies[i]);
        return exec_body(s.else_body);
      case Stmt::Kind::For: return exec_for(s);
      case Stmt::Kind::Set: exec_set(s); return Flow::Normal;
      case Stmt::Kind::Macro: {
        // A macro reads the scope it is defined in (a loop's variables, an enclosing macro's
        // parameters), as jinja2's closures do; one kept past that scope is an error when called.
        const Stmt* def = &s;
        Scope* defining = scope_;
        std::shared_ptr<bool> alive = defining == &root_ ? nullptr : defining->alive();
        scope_->vars.set(s.text, Value::callable(s.text, [this, def, defining, alive](const CallArgs& a) {
                           if (alive && !*alive) fail("macro '" + def->text + "' used after the block that defined it ended");
                           return call_macro(*def, a, nullptr, defining);
                         }));
        return Flow::Normal;
      }
      case Stmt::Kind::CallBlock: exec_call_block(s); return Flow::Normal;
      case Stmt::Kind::FilterBlock: {
        std::string captured = capture(s.body);
        Value v = apply_filter_chain(*s.expr, Value(std::move(captured)));
        emit(v.to_str());
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  std::string capture(const Body& body) {
    std::string buf;
    OutputGuard g(this, &buf);
    exec_body(body);
    return buf;
  }

  // Filters of a {% filter %} block or block set: the chain's innermost base is null.
  Value apply_filter_chain(const Expr& f, Value base) {
    if (f.kind != Expr::Kind::Filter) fail("expected a filter");
    Value input = f.a ? apply_filter_chain(*f.a, std::move(base)) : std::move(base);
    return apply_filter(f.name, input, eval_args(f));
  }

  void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scope.vars.set(targets[0], v);
      return;
    }
    if (!v.is_array()) fail("cannot unpack non-sequence " + v.type_name());
    if (v.arr().size() != targets.size())
      fail(v.arr().size() < targets.size() ? "not enough values to unpack" : "too many values to unpack");
    for (std::size_t i = 0; i < targets.size(); ++i) scope.vars.set(targets[i], v.arr()[i]);
  }

  // The sequence a for loop walks; arrays are iterated in place (no copy).
  Value iterable_value(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::Array: return v;
      case Value::Kind::Undefined: return Value::array({});
      case Value::Kind::Object:
      case Value::Kind::String: return apply_filter("list", v, CallArgs{});
      default: fail("'" + v.type_name() + "' object is not iterable");
    }
  }

  Flow exec_for(const Stmt& s) {
    if (s.recursive) fail("recursive for loops are not supported");
    Value seq = iterable_value(eval(*s.expr));
    if (s.cond) {  // `for x in xs if cond`: filtered before loop.length is known
      Array kept;
      for (const Value& item : seq.arr()) {
        Scope tmp;
        tmp.parent = scope_;
        bind_targets(tmp, s.targets, item);
        ScopeGuard g(this, &tmp);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      }
      seq = Value::array(std::move(kept));
    }
    const Array& items = seq.arr();
    if (items.empty()) return exec_body(s.else_body);
    const std::int64_t n = static_cast<std::int64_t>(items.size());
    static const Value kNoPrev = Value::undefined("there is no previous item");
    static const Value kNoNext = Value::undefined("there is no next item");
    for (std::int64_t i = 0; i < n; ++i) {
      step();
      Scope iter;
      iter.parent = scope_;
      Object loop;
      loop.is_loop = true;
      loop.items.reserve(11);
      loop.items.emplace_back("index", Value(i + 1));
      loop.items.emplace_back("index0", Value(i));
      loop.items.emplace_back("first", Value(i == 0));
      loop.items.emplace_back("last", Value(i == n - 1));
      loop.items.emplace_back("length", Value(n));
      loop.items.emplace_back("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : kNoPrev);
      loop.items.emplace_back("nextitem", i + 1 < n ? items[static_cast<std::size_t>(i + 1)] : kNoNext);
      loop.items.emplace_back("revindex", Value(n - i));
      loop.items.emplace_back("revindex0", Value(n - i - 1));
      loop.items.emplace_back("depth", Value(1));
      loop.items.emplace_back("depth0", Value(0));
      iter.vars.items.reserve(s.targets.size() + 1);
      iter.vars.items.emplace_back("loop", Value::object(std::move(loop)));
      bind_targets(iter, s.targets, items[static_cast<std::size_t>(i)]);
      ScopeGuard g(this, &iter);
      Flow f = exec_body(s.body);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void exec_set(const Stmt& s) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr);
    } else {
      v = Value(capture(s.body));
      if (s.cond) v = apply_filter_chain(*s.cond, std::move(v));
    }
    if (!s.text.empty()) {  // {% set ns.attr = v %}
      const Value* target = scope_->lookup(s.targets[0]);
      if (!target || !target->is_object() || !target->obj().is_namespace)
        fail("cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
      target->mutable_obj().set(s.text, std::move(v));
      return;
    }
    bind_targets(*scope_, s.targets, v);
  }

  Value call_macro(const Stmt& def, const CallArgs& a, const Value* caller = nullptr, Scope* defining = nullptr) {
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      fail("maximum macro recursion depth exceeded");
    }
    struct DepthDown {
      int* d;
      ~DepthDown() { --*d; }
    } down{&call_depth_};
    Scope scope;
    scope.parent = defining ? defining : &root_;
    if (a.positional.size() > def.params.size())
      fail("macro '" + def.text + "' takes not more than " + std::to_string(def.params.size()) + " argument(s)");
    for (const auto& [k, v] : a.keyword) {
      if (k == "caller") continue;
      bool known = false;
      for (const auto& p : def.params) known = known || p.name == k;
      if (!known) fail("macro '" + def.text + "' has no argument named '" + k + "'");
    }
    ScopeGuard g(this, &scope);
    for (std::size_t i = 0; i < def.params.size(); ++i) {
      const MacroParam& p = def.params[i];
      const Value* given = a.get(p.name, static_cast<int>(i));
      if (given) scope.vars.set(p.name, *given);
      else if (p.default_value) scope.vars.set(p.name, eval(*p.default_value));
      else scope.vars.set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
    }
    if (const Value* c = a.get("caller", -1)) scope.vars.set("caller", *c);
    else if (caller) scope.vars.set("caller", *caller);
    return Value(capture(def.body));
  }

  void exec_call_block(const Stmt& s) {
    const Stmt* def = &s;
    Scope* defining = scope_;
    // `caller` reads the scope of its call block: kept past the block (`set ns.c = caller`), it
    // would read a scope that is gone, so it is an error there (jinja2's closure keeps it alive).
    auto alive = std::make_shared<bool>(true);
    struct Ends {
      std::shared_ptr<bool> alive;
      ~Ends() { *alive = false; }
    } ends{alive};
    Value caller = Value::callable("caller", [this, def, defining, alive](const CallArgs& a) -> Value {
      if (!*alive) fail("'caller' of a call block used after the block ended");
      Scope scope;
      scope.parent = defining;
      for (std::size_t i = 0; i < def->params.size(); ++i) {
        const MacroParam& p = def->params[i];
        const Value* given = a.get(p.name, static_cast<int>(i));
        if (given) scope.vars.set(p.name, *given);
        else if (p.default_value) scope.vars.set(p.name, eval(*p.default_value));
        else scope.vars.set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
      }
      ScopeGuard g(this, &scope);
      return Value(capture(def->body));
    });
    const Expr& call = *s.expr;
    Value fn = eval(*call.a);
    CallArgs args = eval_args(call);
    args.keyword.emplace_back("caller", caller);
    Value r = invoke(fn, args);
    emit(r.to_str());
  }

  // ---- expressions ----
  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    a.positional.reserve(e.args.size());
    for (const auto& x : e.args) a.positional.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x));
    return a;
  }

  Value invoke(const Value& fn, const CallArgs& args) {
    if (fn.is_undefined()) throw_undefined(fn);
    if (!fn.is_callable()) fail("'" + fn.type_name() + "' object is not callable");
    return fn.fn().fn(args);
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (JinjaError& err) {
      err.set_line_if_unset(e.line);
      throw;
    }
  }

  Value get_attr(const Value& obj, const std::string& name) {
    switch (obj.kind()) {
      case Value::Kind::Undefined: throw_undefined(obj);
      case Value::Kind::Object: {
        if (obj.obj().is_loop && name == "cycle") {
          std::int64_t i = obj.obj().find("index0")->as_int();
          return Value::callable("loop.cycle", [i](const CallArgs& a) -> Value {
            if (a.positional.empty()) fail("no items for cycling given");
            return a.positional[static_cast<std::size_t>(i) % a.positional.size()];
          });
        }
        if (!obj.obj().is_namespace && !obj.obj().is_loop) {
          // jinja2 tries Python attributes first, so d.items is the method, not d['items'].
          Value m = get_method(obj, name);
          if (m.is_callable()) return m;
        }
        if (const Value* v = obj.obj().find(name)) return *v;
        return Value::undefined("'" + std::string(obj.obj().is_namespace ? "Namespace" : "dict object") +
                                "' has no attribute '" + name + "'");
      }
      case Value::Kind::String:
      case Value::Kind::Array: return get_method(obj, name);
      default:
        return Value::undefined("'" + obj.to_str() + "' has no attribute '" + name + "'");
    }
  }

  Value get_item(const Value& obj, const Value& key) {
    switch (obj.kind()) {
      case Value::Kind::Undefined: throw_undefined(obj);
      case Value::Kind::Object:
        if (key.is_string()) {
          if (const Value* v = obj.obj().find(key.str())) return *v;
          return get_attr(obj, key.str());
        }
        return Value::undefined("'dict object' has no attribute '" + key.to_str() + "'");
      case Value::Kind::Array: {
        if (key.is_string()) return get_method(obj, key.str());
        if (!key.is_int() && !key.is_bool()) return Value::undefined("list indices must be integers");
        std::int64_t n = static_cast<std::int64_t>(obj.arr().size()), i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("list object has no element " + key.to_str());
        return obj.arr()[static_cast<std::size_t>(i)];
      }
      case Value::Kind::String: {
        if (key.is_string()) return get_method(obj, key.str());
        if (!key.is_int()) return Value::undefined("string indices must be integers");
        std::u32string u = utf8_decode(obj.str());
        std::int64_t n = static_cast<std::int64_t>(u.size()), i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("string index out of range");
        std::string out;
        utf8_append(out, u[static_cast<std::size_t>(i)]);
        return Value(std::move(out));
      }
      default: return Value::undefined("'" + obj.to_str() + "' has no attribute '" + key.to_str() + "'");
    }
  }

  // Python slice index normalization (PySlice_AdjustIndices).
  static void slice_bounds(std::int64_t n, const Value& start_v, const Value& stop_v, std::int64_t step,
                           std::int64_t* start, std::int64_t* stop) {
    auto adjust = [&](const Value& v, std::int64_t def, bool is_start) {
      if (v.is_none() || v.is_undefined()) return def;
      std::int64_t x = to_index(v, "slice");
      if (x < 0) {
        x += n;
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
      }
      (void)is_start;
      return x;
    };
    *start = adjust(start_v, step < 0 ? n - 1 : 0, true);
    *stop = adjust(stop_v, step < 0 ? -1 : n, false);
  }

  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.a);
    Value start = e.b ? eval(*e.b) : Value::none();
    Value stop = e.c ? eval(*e.c) : Value::none();
    std::int64_t step = 1;
    if (!e.args.empty()) {
      Value sv = eval(*e.args[0]);
      if (!sv.is_none()) step = to_index(sv, "slice step");
    }
    if (step == 0) fail("slice step cannot be zero");
    if (obj.is_undefined()) throw_undefined(obj);
    auto pick = [&](std::int64_t n, auto&& take) {
      std::int64_t b, en;
      slice_bounds(n, start, stop, step, &b, &en);
      // (i += step is checked: a step near INT64_MAX wrapped i around to a negative index.)
      for (std::int64_t i = b; step > 0 ? i < en : i > en;) {
        take(static_cast<std::size_t>(i));
        if (__builtin_add_overflow(i, step, &i)) break;
      }
    };
    if (obj.is_array()) {
      Array out;
      pick(static_cast<std::int64_t>(obj.arr().size()), [&](std::size_t i) { out.push_back(obj.arr()[i]); });
      return Value::array(std::move(out));
    }
    if (obj.is_string()) {
      std::u32string u = utf8_decode(obj.str()), out;
      pick(static_cast<std::int64_t>(u.size()), [&](std::size_t i) { out.push_back(u[i]); });
      return Value(utf8_encode(out));
    }
    fail("'" + obj.type_name() + "' object is not subscriptable");
  }

  Value arithmetic(const std::string& op, const Value& l, const Value& r) {
    if (l.is_undefined()) throw_undefined(l);
    if (r.is_undefined()) throw_undefined(r);
    auto unsupported = [&]() -> Value {
      if (op == "+" && l.is_string())
        fail("can only concatenate str (not \"" + r.type_name() + "\") to str");
      if (op == "+" && l.is_array()) fail("can only concatenate list (not \"" + r.type_name() + "\") to list");
      fail("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" + r.type_name() + "'");
    };
    if (l.is_number() && r.is_number()) {
      bool ints = !l.is_float() && !r.is_float();
      if (op == "/") {
        if (r.as_double() == 0.0) fail("division by zero");
        return Value(l.as_double() / r.as_double());
      }
      if (ints) {
        std::int64_t a = l.as_int(), b = r.as_int(), out = 0;
        if (op == "+") { if (__builtin_add_overflow(a, b, &out)) fail("integer overflow"); return Value(out); }
        if (op == "-") { if (__builtin_sub_overflow(a, b, &out)) fail("integer overflow"); return Value(out); }
        if (op == "*") { if (__builtin_mul_overflow(a, b, &out)) fail("integer overflow"); return Value(out); }
        if (op == "//" || op == "%") {
          if (b == 0) fail("integer division or modulo by zero");
          if (b == -1) {  // (INT64_MIN / -1 traps)
            if (op == "%") return Value(std::int64_t{0});
            if (__builtin_sub_overflow(std::int64_t{0}, a, &out)) fail("integer overflow");
            return Value(out);
          }
          std::int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) { --q; m += b; }  // Python floors
          return Value(op == "//" ? q : m);
        }
        if (op == "**") {
          if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
          // By squaring: a loop of b multiplications never ended for 1 ** 9e18 (0, -1 as well).
          std::int64_t acc = 1, base = a;
          for (std::int64_t e = b; e > 0; e >>= 1) {
            if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) fail("integer overflow");
            if (e > 1 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
          }
          return Value(acc);
        }
      } else {
        double a = l.as_double(), b = r.as_double();
        if (op == "+") return Value(a + b);
        if (op == "-") return Value(a - b);
        if (op == "*") return Value(a * b);
        if (op == "**") return Value(std::pow(a, b));
        if (b == 0.0) fail("float division by zero");
        if (op == "//") return Value(std::floor(a / b));
        if (op == "%") {
          double m = std::fmod(a, b);
          if (m != 0.0 && ((m < 0) != (b < 0))) m += b;
          return Value(m);
        }
      }
    }
    if (op == "+" && l.is_string() && r.is_string()) {
      if (l.str().size() + r.str().size() > limits_.max_output_bytes) fail("string too large");
      std::string s;
      s.reserve(l.str().size() + r.str().size());
      s += l.str();
      s += r.str();
      return Value(std::move(s));
    }
    if (op == "+" && l.is_array() && r.is_array()) {
      Array a = l.arr();
      a.insert(a.end(), r.arr().begin(), r.arr().end());
      return Value::array(std::move(a));
    }
    if (op == "*" && ((l.is_string() || l.is_array()) && (r.is_int() || r.is_bool()))) {
      std::int64_t n = std::max<std::int64_t>(0, r.as_int());
      // A list's unit is its elements' size in memory (a Value each): [0] * 50,000,000 passed as
      // 50M "bytes" and took 2.1 GB.
      std::size_t unit = l.is_string() ? l.str().size() : l.arr().size() * sizeof(Value);
      if (unit == 0) return l.is_string() ? Value(std::string()) : Value::array({});  // ("" * 10**18 looped 10**18 times)
      if (static_cast<std::uint64_t>(n) > limits_.max_output_bytes / unit) fail("repetition too large");
      if (l.is_string()) {
        std::string s;
        for (std::int64_t i = 0; i < n; ++i) s += l.str();
        return Value(std::move(s));
      }
      Array a;
      for (std::int64_t i = 0; i < n; ++i) a.insert(a.end(), l.arr().begin(), l.arr().end());
      return Value::array(std::move(a));
    }
    if (op == "*" && (l.is_int() || l.is_bool()) && (r.is_string() || r.is_array())) return arithmetic(op, r, l);
    if (op == "%" && l.is_string()) {
      Array args = r.is_array() ? r.arr() : Array{r};
      return apply_filter("format", l, CallArgs{args, {}});
    }
    return unsupported();
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind()) {
      case Value::Kind::String:
        if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + item.type_name());
        return container.str().find(item.str()) != std::string::npos;
      case Value::Kind::Array:
        for (const Value& x : container.arr())
          if (x.equals(item)) return true;
        return false;
      case Value::Kind::Object:
        return item.is_string() && container.obj().find(item.str()) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail("argument of type '" + container.type_name() + "' is not iterable");
    }
  }

  Value eval_inner(const Expr& e) {
    step();
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: {
        if (const Value* v = scope_->lookup(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::GetAttr: return get_attr(eval(*e.a), e.name);
      case Expr::Kind::GetItem: {
        Value obj = eval(*e.a);
        return get_item(obj, eval(*e.b));
      }
      case Expr::Kind::Slice: return eval_slice(e);
      case Expr::Kind::Call: {
        Value fn = eval(*e.a);
        CallArgs args = eval_args(e);
        return invoke(fn, args);
      }
      case Expr::Kind::Filter: {
        Value v = e.a ? eval(*e.a) : Value();
        return apply_filter(e.name, v, eval_args(e));
      }
      case Expr::Kind::Test: {
        Value v = eval(*e.a);
        bool r = apply_test(e.name, v, eval_args(e));
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.a);
        if (e.op == '!') return Value(!v.truthy());
        if (v.is_undefined()) throw_undefined(v);
        if (!v.is_number()) fail("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.op == '+') return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Kind::Binary: {
        if (e.op == '&') {
          Value l = eval(*e.a);
          return l.truthy() ? eval(*e.b) : l;
        }
        if (e.op == '|') {
          Value l = eval(*e.a);
          return l.truthy() ? l : eval(*e.b);
        }
        Value l = eval(*e.a);
        Value r = eval(*e.b);
        if (e.op == '~') {
          std::string s;
          l.append_str(s);
          r.append_str(s);
          if (s.size() > limits_.max_output_bytes) fail("string too large");
          return Value(std::move(s));
        }
        return arithmetic(e.name, l, r);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.args[0]);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          const char op = e.op_codes[i];
          bool ok;
          if (op == '=') ok = left.equals(right);
          else if (op == 'n') ok = !left.equals(right);
          else if (op == 'i') ok = contains(right, left);
          else if (op == 'x') ok = !contains(right, left);
          else {
            if (left.is_undefined()) throw_undefined(left);
            if (right.is_undefined()) throw_undefined(right);
            int c = left.compare(right);
            ok = op == '<' ? c < 0 : op == 'l' ? c <= 0 : op == '>' ? c > 0 : c >= 0;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      case Expr::Kind::List: {
        Array a;
        a.reserve(e.args.size());
        for (const auto& x : e.args) a.push_back(eval(*x));
        return Value::array(std::move(a));
      }
      case Expr::Kind::Dict: {
        Object o;
        for (std::size_t i = 0; i < e.args.size(); ++i) o.set(eval(*e.args[i]).to_str(), eval(*e.values[i]));
        return Value::object(std::move(o));
      }
    }
    fail("unknown expression");
  }

  RenderLimits limits_;
  Scope globals_;
  Scope root_;
  Scope* scope_ = nullptr;
  std::string* out_ = nullptr;
  std::uint64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string render_body(const Body& body, const Object& context, const RenderLimits& limits) {
  Interpreter in(context, limits);
  return in.run(body);
}

}  // namespace deltaserve::jinja
