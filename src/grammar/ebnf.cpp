#include "grammar/ebnf.h"

#include <map>
#include <string>

namespace deltaserve {

namespace {

constexpr int kMaxRepeat = 100000;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : s_(text) {}

  Result<Grammar> parse(std::string_view root_name) {
    skip_space(true);
    while (!at_end()) {
      const size_t at = pos_;
      std::string name = read_name();
      if (name.empty()) return fail("expected a rule name");
      skip_space(true);
      if (s_.substr(pos_, 3) != "::=") return fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      int id = rule_id(name);
      if (defined_.count(name)) return fail("rule '" + name + "' is defined twice");
      defined_[name] = at;
      auto body = alternatives(0);
      if (!body) return body.status();
      g_.set_body(id, std::move(*body));
      skip_space(true);
    }
    for (const auto& [name, at] : used_) {
      if (!defined_.count(name))
        return error("ebnf: rule '", name, "' is used (line ", line_at(at), ") but never defined");
    }
    const int root = g_.find(root_name);
    if (root < 0 || !defined_.count(std::string(root_name)))
      return error("ebnf: the grammar has no '", std::string(root_name), "' rule");
    g_.root = root;
    return std::move(g_);
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<std::string, size_t> defined_, used_;

  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  size_t line_no() const { return line_at(pos_); }
  size_t line_at(size_t pos) const {
    size_t n = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) n += s_[i] == '\n';
    return n;
  }
  Status fail(const std::string& what) const {
    return error("ebnf: ", what, " (line ", line_no(), ")");
  }

  // Skips blanks and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  int rule_id(const std::string& name) {
    int id = g_.find(name);
    return id >= 0 ? id : g_.add_rule(name);
  }

  // Is the text at pos_ the start of the next rule (`name ::=`)?
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && is_name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\r' || s_[p] == '\n')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  Result<Expr> alternatives(int depth) {
    if (depth > 200) return fail("nesting too deep");
    std::vector<Expr> alts;
    for (;;) {
      auto seq = sequence(depth);
      if (!seq) return seq;
      alts.push_back(std::move(*seq));
      skip_space(true);
      if (peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return Expr::alt(std::move(alts));
  }

  Result<Expr> sequence(int depth) {
    std::vector<Expr> items;
    for (;;) {
      skip_space(true);
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      auto e = element(depth);
      if (!e) return e;
      // Postfix operators.
      for (;;) {
        char q = peek();
        if (q == '*') {
          ++pos_;
          *e = Expr::star(std::move(*e));
        } else if (q == '+') {
          ++pos_;
          *e = Expr::plus(std::move(*e));
        } else if (q == '?') {
          ++pos_;
          *e = Expr::opt(std::move(*e));
        } else if (q == '{') {
          int lo, hi;
          DS_RETURN_IF_ERROR(counted(lo, hi));
          *e = Expr::repeat(std::move(*e), lo, hi);
        } else {
          break;
        }
      }
      items.push_back(std::move(*e));
    }
    return Expr::seq(std::move(items));
  }

  Status counted(int& lo, int& hi) {
    ++pos_;  // '{'
    auto number = [&](int& out) {
      size_t start = pos_;
      long v = 0;
      while (peek() >= '0' && peek() <= '9') {
        v = std::min<long>(v * 10 + (peek() - '0'), kMaxRepeat + 1);
        ++pos_;
      }
      out = static_cast<int>(v);
      return pos_ > start;
    };
    skip_space(false);
    int a = 0, b = 0;
    bool has_a = number(a);
    skip_space(false);
    if (peek() == '}') {
      if (!has_a) return fail("empty repetition count {}");
      ++pos_;
      lo = hi = a;
    } else if (peek() == ',') {
      ++pos_;
      skip_space(false);
      bool has_b = number(b);
      skip_space(false);
      if (peek() != '}') return fail("bad repetition count");
      ++pos_;
      lo = has_a ? a : 0;
      hi = has_b ? b : -1;
    } else {
      return fail("bad repetition count");
    }
    if (lo > kMaxRepeat || hi > kMaxRepeat) return fail("repetition count above " + std::to_string(kMaxRepeat));
    if (hi >= 0 && hi < lo) return fail("repetition {n,m} with m < n");
    return Status::ok();
  }

  // One escaped or plain character (as a code point) inside a string or class.
  Result<uint32_t> character() {
    if (at_end()) return fail("unterminated string or class");
    unsigned char c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      char e = peek();
      ++pos_;
      auto hex = [&](int n) -> Result<uint32_t> {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
          char h = peek();
          int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return fail("bad hexadecimal escape");
          v = v * 16 + static_cast<uint32_t>(d);
          ++pos_;
        }
        if (v > 0x10FFFF) return fail("code point above U+10FFFF");
        return v;
      };
      switch (e) {
        case 'n': return uint32_t{'\n'};
        case 'r': return uint32_t{'\r'};
        case 't': return uint32_t{'\t'};
        case 'f': return uint32_t{'\f'};
        case 'v': return uint32_t{'\v'};
        case 'b': return uint32_t{'\b'};
        case '0': return uint32_t{0};
        case 'x': return hex(2);
        case 'u': {
          // A surrogate pair written as two escapes (JSON's way) is one character; a lone
          // surrogate is none (its UTF-8 would be invalid).
          auto v = hex(4);
          if (!v) return v;
          if (is_high_surrogate(*v) && peek() == '\\' && peek(1) == 'u') {
            const size_t at = pos_;
            pos_ += 2;
            auto lo = hex(4);
            if (!lo) return lo;
            if (is_low_surrogate(*lo)) return from_surrogates(*v, *lo);
            pos_ = at;
          }
          if (is_surrogate(*v)) return fail("lone surrogate escape: \\uD800-\\uDFFF only as a high-low pair");
          return v;
        }
        case 'U': {
          auto v = hex(8);
          if (v && is_surrogate(*v)) return fail("surrogate code point escape: not a character");
          return v;
        }
        case '\0': return fail("unterminated escape");
        default: return static_cast<uint32_t>(static_cast<unsigned char>(e));
      }
    }
    // UTF-8 sequence.
    uint32_t cp = c;
    size_t n = 1;
    if (c >= 0xC0 && c < 0xE0) {
      cp = c & 0x1Fu;
      n = 2;
    } else if (c >= 0xE0 && c < 0xF0) {
      cp = c & 0x0Fu;
      n = 3;
    } else if (c >= 0xF0) {
      cp = c & 0x07u;
      n = 4;
    }
    ++pos_;
    for (size_t k = 1; k < n; ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(peek()) & 0x3Fu);
      ++pos_;
    }
    return cp;
  }

  Result<Expr> element(int depth) {
    char c = peek();
    if (c == '"' || c == '\'') {
      const char quote = c;
      ++pos_;
      std::string bytes;
      while (!at_end() && peek() != quote) {
        if (peek() == '\n') return fail("newline inside a string literal");
        auto cp = character();
        if (!cp) return cp.status();
        append_utf8(*cp, bytes);
      }
      if (at_end()) return fail("unterminated string literal");
      ++pos_;
      return Expr::literal(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = false;
      if (peek() == '^') {
        negate = true;
        ++pos_;
      }
      CodepointRanges set;
      while (!at_end() && peek() != ']') {
        auto lo = character();
        if (!lo) return lo.status();
        uint32_t hi = *lo;
        if (peek() == '-' && peek(1) != ']') {
          ++pos_;
          auto h = character();
          if (!h) return h.status();
          hi = *h;
          if (hi < *lo) return fail("character range out of order");
        }
        set.push_back({*lo, hi});
      }
      if (at_end()) return fail("missing ']'");
      ++pos_;
      if (set.empty() && !negate) return fail("empty character class []");
      return Expr::codepoints(set, negate);
    }
    if (c == '(') {
      ++pos_;
      auto e = alternatives(depth + 1);
      if (!e) return e;
      skip_space(true);
      if (peek() != ')') return fail("missing ')'");
      ++pos_;
      return e;
    }
    if (is_name_char(c)) {
      const size_t at = pos_;
      std::string name = read_name();
      used_.emplace(name, at);
      return Expr::ref(rule_id(name));
    }
    return fail(std::string("unexpected character '") + c + "'");
  }
};

}  // namespace

Result<Grammar> grammar_from_ebnf(std::string_view text, std::string_view root_rule) {
  EbnfParser p(text);
  return p.parse(root_rule);
}

}  // namespace deltaserve
