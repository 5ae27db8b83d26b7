#include "chat/jinja/parser.h"

#include <initializer_list>
#include <string_view>

#include "chat/jinja/error.h"

namespace deltaserve::jinja {

namespace {

constexpr int kMaxNesting = 200;  // fuzz guard: "((((((..." must not overflow the stack
// An expression tree's depth: chains (1+1+...+1, x|trim|trim..., x.a.a...) nest one node per link
// without nesting the parser, and evaluating or freeing 30,000 links overflowed the stack.
constexpr int kMaxExprDepth = 1000;

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_all() {
    std::string_view end;
    Body body = parse_body({}, &end);
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().type == T::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == T::Name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  [[noreturn]] void fail(const std::string& msg) const { throw JinjaError(msg, cur().line); }
  std::string describe(const Token& tk) const {
    switch (tk.type) {
      case T::Eof: return "end of template";
      case T::VarEnd: return "'}}'";
      case T::BlockEnd: return "'%}'";
      case T::Text: return "template text";
      case T::String: return "string";
      case T::Int:
      case T::Float: return "number";
      default: return "'" + tk.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != T::Name) fail("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd) fail("expected end of statement '%}', got " + describe(cur()));
    advance();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->fail("template nested too deeply");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  ExprPtr make(Expr::Kind k, int line) { return std::make_unique<Expr>(k, line); }
  // The node's depth from its children's (each sealed when it was built); too deep is an error
  // while the tree is still shallow enough to free.
  ExprPtr seal(ExprPtr e) {
    int d = 0;
    for (const ExprPtr* c : {&e->a, &e->b, &e->c})
      if (*c) d = std::max(d, (*c)->depth);
    for (const auto& c : e->args)
      if (c) d = std::max(d, c->depth);
    for (const auto& c : e->values)
      if (c) d = std::max(d, c->depth);
    for (const auto& [k, c] : e->kwargs)
      if (c) d = std::max(d, c->depth);
    e->depth = d + 1;
    if (e->depth > kMaxExprDepth) fail("expression nested too deeply (over " + std::to_string(kMaxExprDepth) + " levels)");
    return e;
  }

  // ---- statements ----
  // Parses until a block tag named in `enders` (left unconsumed after its name; *end = name) or
  // end of input (only allowed when enders is empty).
  Body parse_body(std::initializer_list<std::string_view> enders, std::string_view* end) {
    DepthGuard g(this);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == T::Eof) {
        if (enders.size() != 0) {
          std::string want;
          for (auto e : enders) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
          fail("unexpected end of template, expected " + want);
        }
        return body;
      }
      if (tk.type == T::Text) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text, tk.line);
        s->text = tk.text;
        body.push_back(std::move(s));
        advance();
      } else if (tk.type == T::VarBegin) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Output, tk.line);
        advance();
        s->expr = parse_tuple_or_expr();
        if (cur().type != T::VarEnd) fail("expected '}}', got " + describe(cur()));
        advance();
        body.push_back(std::move(s));
      } else if (tk.type == T::BlockBegin) {
        const Token& name = peek();
        if (name.type == T::Name) {
          for (auto e : enders) {
            if (name.text == e) {
              advance();
              advance();
              *end = e;
              return body;
            }
          }
        }
        advance();
        StmtPtr s = parse_statement();
        if (s) body.push_back(std::move(s));
      } else {
        fail("unexpected " + describe(tk));
      }
    }
  }

  StmtPtr parse_statement() {
    int line = cur().line;
    if (cur().type != T::Name) fail("expected a tag name, got " + describe(cur()));
    std::string tag = cur().text;
    advance();
    if (tag == "if") return parse_if(line);
    if (tag == "for") return parse_for(line);
    if (tag == "set") return parse_set(line);
    if (tag == "macro") return parse_macro(line);
    if (tag == "call") return parse_call_block(line);
    if (tag == "filter") return parse_filter_block(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside of a loop");
      expect_block_end();
      return std::make_unique<Stmt>(tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
    }
    if (tag == "generation") {
      // transformers' AssistantTracker extension tag: renders its body unchanged.
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Kind::If, line);
      auto t = make(Expr::Kind::Literal, line);
      t->value = Value(true);
      s->conds.push_back(std::move(t));
      std::string_view end;
      s->bodies.push_back(parse_body({"endgeneration"}, &end));
      expect_block_end();
      return s;
    }
    static const char* kEnders[] = {"endif", "elif", "else", "endfor", "endset", "endmacro",
                                    "endcall", "endfilter", "endgeneration", "endraw"};
    for (const char* e : kEnders)
      if (tag == e) fail("unexpected '" + tag + "' (no open block it could close)");
    fail("unknown or unsupported tag '" + tag + "'");
  }

  StmtPtr parse_if(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::If, line);
    while (true) {
      s->conds.push_back(parse_tuple_or_expr());
      expect_block_end();
      std::string_view end;
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, &end));
      if (end == "elif") continue;
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &end);
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (is_name("in") || is_op("=") || is_op(")")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::For, line);
    s->targets = parse_targets();
    if (!skip_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
    s->expr = parse_tuple_or_expr(/*with_condexpr=*/false);
    if (skip_name("if")) s->cond = parse_expression();
    if (skip_name("recursive")) s->recursive = true;
    expect_block_end();
    ++loop_depth_;
    std::string_view end;
    s->body = parse_body({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
    std::string first = expect_name();
    if (skip_op(".")) {
      s->targets = {first};
      s->text = expect_name();
    } else {
      s->targets = {first};
      while (skip_op(",")) s->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      s->expr = parse_tuple_or_expr();
      expect_block_end();
      return s;
    }
    if (!s->text.empty() || s->targets.size() != 1) fail("block set needs a single name");
    // Block set: {% set x %}...{% endset %}, optionally {% set x | filter %}.
    if (is_op("|")) s->cond = parse_filter_chain(nullptr);
    expect_block_end();
    std::string_view end;
    s->body = parse_body({"endset"}, &end);
    expect_block_end();
    return s;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Macro, line);
    s->text = expect_name();
    s->params = parse_params();
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    std::string_view end;
    s->body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved;
    if (cur().type == T::Name) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::CallBlock, line);
    if (is_op("(")) s->params = parse_params();
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::Call) fail("expected a macro call in call block");
    expect_block_end();
    std::string_view end;
    s->body = parse_body({"endcall"}, &end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::FilterBlock, line);
    s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
    expect_block_end();
    std::string_view end;
    s->body = parse_body({"endfilter"}, &end);
    expect_block_end();
    return s;
  }

  // ---- expressions ----
  // `a, b` at statement level builds a tuple (a list here).
  ExprPtr parse_tuple_or_expr(bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::List, line);
    list->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == T::VarEnd || cur().type == T::BlockEnd || is_name("if")) break;
      list->args.push_back(parse_expression(with_condexpr));
    }
    return seal(std::move(list));
  }

  ExprPtr parse_expression(bool with_condexpr = true) {
    DepthGuard g(this);
    int line = cur().line;
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      advance();
      auto c = make(Expr::Kind::Cond, line);
      c->a = parse_or();   // condition
      c->b = std::move(e); // value if true
      if (skip_name("else")) c->c = parse_expression();
      e = seal(std::move(c));
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->op = op == "//" ? 'f' : op == "**" ? 'p' : op == "and" ? '&' : op == "or" ? '|' : op[0];
    e->a = std::move(l);
    e->b = std::move(r);
    return seal(std::move(e));
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr e = parse_and();
    while (skip_name("or")) e = binary("or", std::move(e), parse_and(), line);
    return e;
  }

  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr e = parse_not();
    while (skip_name("and")) e = binary("and", std::move(e), parse_not(), line);
    return e;
  }

  ExprPtr parse_not() {
    DepthGuard g(this);
    int line = cur().line;
    if (skip_name("not")) {
      auto e = make(Expr::Kind::Unary, line);
      e->name = "not";
      e->op = '!';
      e->a = parse_not();
      return seal(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == T::Name && peek().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->op_codes.push_back(op == "==" ? '=' : op == "!=" ? 'n' : op == "<=" ? 'l' : op == ">=" ? 'g' :
                              op == "in" ? 'i' : op == "notin" ? 'x' : op[0]);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? seal(std::move(cmp)) : std::move(first);
  }

  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      advance();
      e = binary(op, std::move(e), parse_concat(), line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr e = parse_math2();
    while (skip_op("~")) e = binary("~", std::move(e), parse_math2(), line);
    return e;
  }

  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      advance();
      e = binary(op, std::move(e), parse_pow(), line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr e = parse_unary();
    while (skip_op("**")) e = binary("**", std::move(e), parse_unary(), line);
    return e;
  }

  ExprPtr parse_unary(bool with_filter = true) {
    DepthGuard g(this);
    int line = cur().line;
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      std::string op = cur().text;
      advance();
      e = make(Expr::Kind::Unary, line);
      e->name = op;
      e->op = op[0];
      e->a = parse_unary(false);
      e = seal(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    switch (tk.type) {
      case T::Name: {
        std::string n = tk.text;
        advance();
        auto e = make(Expr::Kind::Literal, line);
        if (n == "true" || n == "True") e->value = Value(true);
        else if (n == "false" || n == "False") e->value = Value(false);
        else if (n == "none" || n == "None") e->value = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = n;
        }
        return e;
      }
      case T::String: {
        std::string s = tk.text;
        advance();
        while (cur().type == T::String) {  // adjacent literals concatenate
          s += cur().text;
          advance();
        }
        auto e = make(Expr::Kind::Literal, line);
        e->value = Value(std::move(s));
        return e;
      }
      case T::Int: {
        auto e = make(Expr::Kind::Literal, line);
        e->value = Value(tk.int_value);
        advance();
        return e;
      }
      case T::Float: {
        auto e = make(Expr::Kind::Literal, line);
        e->value = Value(tk.float_value);
        advance();
        return e;
      }
      case T::Op:
        if (tk.text == "(") {
          advance();
          if (skip_op(")")) return make(Expr::Kind::List, line);  // ()
          ExprPtr first = parse_expression();
          if (skip_op(")")) return first;
          auto list = make(Expr::Kind::List, line);
          list->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (is_op(")")) break;
            list->args.push_back(parse_expression());
          }
          expect_op(")");
          return seal(std::move(list));
        }
        if (tk.text == "[") {
          advance();
          auto list = make(Expr::Kind::List, line);
          while (!is_op("]")) {
            list->args.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return seal(std::move(list));
        }
        if (tk.text == "{") {
          advance();
          auto dict = make(Expr::Kind::Dict, line);
          while (!is_op("}")) {
            dict->args.push_back(parse_expression());
            expect_op(":");
            dict->values.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return seal(std::move(dict));
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(tk) + " in expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == T::Int) {  // x.0 is x[0]
          auto g = make(Expr::Kind::GetItem, line);
          g->a = std::move(e);
          g->b = make(Expr::Kind::Literal, line);
          g->b->value = Value(cur().int_value);
          advance();
          e = seal(std::move(g));
        } else {
          auto g = make(Expr::Kind::GetAttr, line);
          g->a = std::move(e);
          g->name = expect_name();
          e = seal(std::move(g));
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    int n_colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (n_colons < 2 && skip_op(":")) {
      ++n_colons;
      if (!is_op(":") && !is_op("]")) parts[n_colons] = parse_expression();
    }
    expect_op("]");
    if (n_colons == 0) {
      if (!parts[0]) fail("empty subscript");
      auto g = make(Expr::Kind::GetItem, line);
      g->a = std::move(obj);
      g->b = std::move(parts[0]);
      return seal(std::move(g));
    }
    auto s = make(Expr::Kind::Slice, line);
    s->a = std::move(obj);
    s->b = std::move(parts[0]);
    s->c = std::move(parts[1]);
    if (parts[2]) s->args.push_back(std::move(parts[2]));
    return seal(std::move(s));
  }

  void parse_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().type == T::Name && peek().type == T::Op && peek().text == "=") {
        std::string k = cur().text;
        advance();
        advance();
        e->kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e->kwargs.empty()) fail("positional argument follows keyword argument");
        e->args.push_back(parse_expression());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make(Expr::Kind::Call, cur().line);
    c->a = std::move(callee);
    parse_args(c.get());
    return seal(std::move(c));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| f(args) | g ...`; base may be null (filter blocks, block set).
  ExprPtr parse_filter_chain(ExprPtr base, bool leading_pipe = true) {
    bool first = true;
    while ((first && !leading_pipe) || is_op("|")) {
      if (!(first && !leading_pipe)) advance();
      first = false;
      auto f = make(Expr::Kind::Filter, cur().line);
      f->name = expect_name();
      while (skip_op(".")) f->name += "." + expect_name();
      if (is_op("(")) parse_args(f.get());
      f->a = std::move(base);
      base = seal(std::move(f));
    }
    return base;
  }

  ExprPtr parse_test(ExprPtr e) {
    int line = cur().line;
    advance();  // is
    auto t = make(Expr::Kind::Test, line);
    t->negated = skip_name("not");
    t->name = expect_name();
    while (skip_op(".")) t->name += "." + expect_name();
    t->a = std::move(e);
    if (is_op("(")) {
      parse_args(t.get());
    } else if ((cur().type == T::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                !is_name("if")) ||
               cur().type == T::String || cur().type == T::Int || cur().type == T::Float ||
               is_op("[") || is_op("{")) {
      // `is divisibleby 3`, `is sameas false`: one bare argument.
      t->args.push_back(parse_postfix(parse_primary()));
    }
    return seal(std::move(t));
  }

  const std::vector<Token>& t_;
  std::size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<Body> parse_template(const std::vector<Token>& tokens) {
  try {
    Parser p(tokens);
    return p.parse_all();
  } catch (const JinjaError& e) {
    if (e.line() > 0) return error("template syntax error at line ", e.line(), ": ", e.message());
    return error("template syntax error: ", e.message());
  }
}

}  // namespace deltaserve::jinja
