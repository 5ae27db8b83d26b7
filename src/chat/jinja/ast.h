// AST of a parsed template. Expressions and statements are tagged structs walked by a switch in
// runtime.cpp (no visitor machinery). Every node keeps its 1-based source line for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace deltaserve::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Literal,    // value
    Name,       // name
    GetAttr,    // a.name
    GetItem,    // a[b]
    Slice,      // a[b:c:d] (b/c/d may be null)
    Call,       // a(args, kwargs)
    Filter,     // a | name(args)   (a may be null inside {% filter %})
    Test,       // a is [not] name(args)
    Unary,      // op a            (op: not, -, +)
    Binary,     // a op b          (op: + - * / // % ** ~ and or)
    Compare,    // a op b op c ... (ops: == != < <= > >= in notin)
    Cond,       // b if a else c
    List,       // [items] or (items,)
    Dict,       // {k: v}
  };
  Kind kind;
  int line = 0;
  int depth = 1;               // of the tree below (Parser::seal): bounded, so evaluating and freeing it cannot overflow the stack
  Value value;                 // Literal
  std::string name;            // Name, GetAttr, Filter, Test, Unary/Binary op
  ExprPtr a, b, c;             // operands
  std::vector<ExprPtr> args;   // Call/Filter/Test positional args; List items; Dict keys
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call/Filter/Test keyword args
  std::vector<ExprPtr> values;                          // Dict values
  std::vector<std::string> ops;                         // Compare operators (args = operands)
  bool negated = false;                                 // Test: `is not`
  // Unary/Binary operator as one char, resolved at parse time so evaluation does not compare
  // strings: + - * / % ~ as themselves, 'f' //, 'p' **, '&' and, '|' or, '!' not.
  // Compare: one char per entry of `ops`: '=' ==, 'n' !=, '<', 'l' <=, '>', 'g' >=, 'i' in,
  // 'x' not in.
  char op = 0;
  std::string op_codes;

  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    Text,       // text
    Output,     // {{ expr }}
    If,         // conds[i] -> bodies[i]; else_body
    For,        // targets in iter [if cond]: body else else_body
    Set,        // targets (or ns.attr via attr) = expr, or block set (body, filter)
    Macro,      // name(params): body
    CallBlock,  // {% call(params) expr %} body {% endcall %}
    FilterBlock,  // {% filter f %} body
    Break,
    Continue,
  };
  Kind kind;
  int line = 0;
  std::string text;                  // Text; Macro name; Set attribute name (ns.attr)
  ExprPtr expr;                      // Output / For iter / Set value / CallBlock call / FilterBlock
  ExprPtr cond;                      // For filter condition
  std::vector<ExprPtr> conds;        // If
  std::vector<Body> bodies;          // If bodies
  Body body;                         // For/Macro/CallBlock/FilterBlock/block Set
  Body else_body;                    // If/For
  std::vector<std::string> targets;  // For/Set names (Set ns.attr: targets = {ns}, text = attr)
  std::vector<MacroParam> params;    // Macro/CallBlock
  bool recursive = false;            // For ... recursive

  Stmt(Kind k, int l) : kind(k), line(l) {}
};

}  // namespace deltaserve::jinja
