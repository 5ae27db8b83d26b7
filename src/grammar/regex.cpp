#include "grammar/regex.h"

#include <cstdio>
#include <string>
#include <vector>

namespace deltaserve {

namespace {

constexpr int kMaxRepeat = 100000;

CodepointRanges digit_set() { return {{'0', '9'}}; }
CodepointRanges word_set() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
CodepointRanges space_set() {
  return {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
          {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}
CodepointRanges complement(const CodepointRanges& in) {
  CodepointRanges r = normalize_ranges(in), out;
  uint32_t next = 0;
  for (const auto& x : r) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

class RegexParser {
 public:
  RegexParser(std::string_view text, const RegexOptions& o) : opts_(o) {
    // Decode UTF-8 (invalid bytes are taken as Latin-1 code points).
    for (size_t i = 0; i < text.size();) {
      unsigned char c = static_cast<unsigned char>(text[i]);
      uint32_t cp = c;
      size_t n = 1;
      if (c >= 0xC0 && c < 0xE0 && i + 1 < text.size()) {
        cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
        n = 2;
      } else if (c >= 0xE0 && c < 0xF0 && i + 2 < text.size()) {
        cp = ((c & 0x0Fu) << 12) | ((static_cast<unsigned char>(text[i + 1]) & 0x3Fu) << 6) |
             (static_cast<unsigned char>(text[i + 2]) & 0x3Fu);
        n = 3;
      } else if (c >= 0xF0 && i + 3 < text.size()) {
        cp = ((c & 0x07u) << 18) | ((static_cast<unsigned char>(text[i + 1]) & 0x3Fu) << 12) |
             ((static_cast<unsigned char>(text[i + 2]) & 0x3Fu) << 6) | (static_cast<unsigned char>(text[i + 3]) & 0x3Fu);
        n = 4;
      }
      cps_.push_back(cp);
      i += n;
    }
  }

  Result<Expr> parse() {
    auto e = alternation(0);
    if (!e) return e;
    if (pos_ < cps_.size()) {
      if (cps_[pos_] == ')') return fail("unbalanced ')'");
      return fail("unexpected character");
    }
    return e;
  }

 private:
  const RegexOptions& opts_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;

  Status fail(const std::string& what) const {
    return error("regex: ", what, " at position ", pos_);
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFFu; }

  Expr chars(const CodepointRanges& set) const {
    return opts_.json_string ? json_string_chars(set) : Expr::codepoints(set);
  }

  Result<Expr> alternation(int depth) {
    if (depth > 200) return fail("nesting too deep");
    std::vector<Expr> alts;
    for (;;) {
      auto c = concat(depth);
      if (!c) return c;
      alts.push_back(std::move(*c));
      if (!at_end() && peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alts.size() == 1) return std::move(alts[0]);
    return Expr::alt(std::move(alts));
  }

  Result<Expr> concat(int depth) {
    std::vector<Expr> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const size_t start = pos_;
      if (peek() == '^') {
        if (start != 0) return fail("'^' is only supported at the start of the pattern");
        ++pos_;
        continue;
      }
      if (peek() == '$') {
        if (start + 1 != cps_.size()) return fail("'$' is only supported at the end of the pattern");
        ++pos_;
        continue;
      }
      auto atom_r = atom(depth);
      if (!atom_r) return atom_r;
      Expr e = std::move(*atom_r);
      // Quantifier.
      if (!at_end()) {
        int lo = -1, hi = -1;
        const uint32_t q = peek();
        if (q == '*') {
          lo = 0;
          hi = -1;
          ++pos_;
        } else if (q == '+') {
          lo = 1;
          hi = -1;
          ++pos_;
        } else if (q == '?') {
          lo = 0;
          hi = 1;
          ++pos_;
        } else if (q == '{') {
          size_t save = pos_;
          if (!counted(lo, hi)) {
            if (lo == -2) return fail("repetition count above " + std::to_string(kMaxRepeat));
            if (lo == -3) return fail("repetition {n,m} with m < n");
            pos_ = save;  // a literal '{'
            lo = -1;
          }
        }
        if (lo >= 0) {
          if (!at_end() && (peek() == '?' || peek() == '+')) ++pos_;  // lazy / possessive
          if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' ||
                            (peek() == '{' && looks_counted())))
            return fail("multiple repetition operators");
          e = Expr::repeat(std::move(e), lo, hi);
        }
      }
      items.push_back(std::move(e));
    }
    return Expr::seq(std::move(items));
  }

  bool looks_counted() const {
    size_t p = pos_ + 1;
    return p < cps_.size() && ((cps_[p] >= '0' && cps_[p] <= '9') || cps_[p] == ',');
  }

  // {n} {n,} {n,m} {,m}; lo = -2: too big, -3: m < n.
  bool counted(int& lo, int& hi) {
    ++pos_;  // '{'
    auto number = [&](int& out) {
      size_t start = pos_;
      long v = 0;
      while (!at_end() && peek() >= '0' && peek() <= '9') {
        v = v * 10 + static_cast<long>(peek() - '0');
        if (v > kMaxRepeat) v = kMaxRepeat + 1;
        ++pos_;
      }
      out = static_cast<int>(v);
      return pos_ > start;
    };
    int a = 0, b = 0;
    bool has_a = number(a);
    if (!at_end() && peek() == '}') {
      if (!has_a) return false;
      ++pos_;
      lo = hi = a;
    } else if (!at_end() && peek() == ',') {
      ++pos_;
      bool has_b = number(b);
      if (at_end() || peek() != '}' || (!has_a && !has_b)) return false;
      ++pos_;
      lo = has_a ? a : 0;
      hi = has_b ? b : -1;
    } else {
      return false;
    }
    if (lo > kMaxRepeat || hi > kMaxRepeat) {
      lo = -2;
      return false;
    }
    if (hi >= 0 && hi < lo) {
      lo = -3;
      return false;
    }
    return true;
  }

  Result<Expr> atom(int depth) {
    const uint32_t c = peek();
    if (c == '(') return group(depth);
    if (c == '[') {
      CodepointRanges set;
      DS_RETURN_IF_ERROR(char_class(set));
      if (set.empty()) return fail("empty character class");
      return chars(set);
    }
    if (c == '.') {
      ++pos_;
      return chars(complement({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?') return fail("nothing to repeat");
    if (c == '\\') {
      CodepointRanges set;
      std::string literal;
      DS_RETURN_IF_ERROR(escape(set, false));
      return chars(set);
    }
    ++pos_;
    return chars({{c, c}});
  }

  Result<Expr> group(int depth) {
    ++pos_;  // '('
    if (peek() == '?') {
      const uint32_t k = peek(1);
      if (k == ':') {
        pos_ += 2;
      } else if (k == 'P' && peek(2) == '<') {
        pos_ += 3;
        while (!at_end() && peek() != '>') ++pos_;
        if (at_end()) return fail("unterminated group name");
        ++pos_;
      } else if (k == '<' && peek(2) != '=' && peek(2) != '!') {
        pos_ += 2;
        while (!at_end() && peek() != '>') ++pos_;
        if (at_end()) return fail("unterminated group name");
        ++pos_;
      } else if (k == '=' || k == '!') {
        return fail("lookahead assertions are not supported");
      } else if (k == '<') {
        return fail("lookbehind assertions are not supported");
      } else if (k == 'P' && peek(2) == '=') {
        return fail("backreferences are not supported");
      } else {
        return fail("inline flags and other (?...) groups are not supported");
      }
    }
    auto e = alternation(depth + 1);
    if (!e) return e;
    if (at_end() || peek() != ')') return fail("missing ')'");
    ++pos_;
    return e;
  }

  static int hex_value(uint32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }

  Status hex_digits(int n, uint32_t& out) {
    out = 0;
    for (int i = 0; i < n; ++i) {
      int h = hex_value(peek());
      if (h < 0) return fail("bad hexadecimal escape");
      out = out * 16 + static_cast<uint32_t>(h);
      ++pos_;
    }
    return Status::ok();
  }

  // After '\': a class (\d ...) or one character, added to `set`.
  Status escape(CodepointRanges& set, bool in_class) {
    ++pos_;  // '\'
    if (at_end()) return fail("pattern ends with '\\'");
    const uint32_t c = peek();
    ++pos_;
    auto add = [&](const CodepointRanges& r) { set.insert(set.end(), r.begin(), r.end()); };
    switch (c) {
      case 'd': add(digit_set()); return Status::ok();
      case 'D': add(complement(digit_set())); return Status::ok();
      case 'w': add(word_set()); return Status::ok();
      case 'W': add(complement(word_set())); return Status::ok();
      case 's': add(space_set()); return Status::ok();
      case 'S': add(complement(space_set())); return Status::ok();
      case 'n': set.push_back({'\n', '\n'}); return Status::ok();
      case 'r': set.push_back({'\r', '\r'}); return Status::ok();
      case 't': set.push_back({'\t', '\t'}); return Status::ok();
      case 'f': set.push_back({'\f', '\f'}); return Status::ok();
      case 'v': set.push_back({'\v', '\v'}); return Status::ok();
      case '0': set.push_back({0, 0}); return Status::ok();
      case 'x': {
        uint32_t v;
        DS_RETURN_IF_ERROR(hex_digits(2, v));
        set.push_back({v, v});
        return Status::ok();
      }
      case 'u': {
        uint32_t v = 0;
        if (peek() == '{') {
          ++pos_;
          int n = 0;
          while (!at_end() && peek() != '}') {
            int h = hex_value(peek());
            if (h < 0 || ++n > 6) return fail("bad \\u{...} escape");
            v = v * 16 + static_cast<uint32_t>(h);
            ++pos_;
          }
          if (at_end() || n == 0) return fail("bad \\u{...} escape");
          ++pos_;
        } else {
          DS_RETURN_IF_ERROR(hex_digits(4, v));
          // A surrogate pair as two escapes (ECMAScript, JSON Schema's patterns) is one character.
          if (is_high_surrogate(v) && peek() == '\\' && peek(1) == 'u') {
            const size_t at = pos_;
            pos_ += 2;
            uint32_t lo = 0;
            if (hex_digits(4, lo).is_ok() && is_low_surrogate(lo)) v = from_surrogates(v, lo);
            else pos_ = at;
          }
        }
        if (v > 0x10FFFF) return fail("code point above U+10FFFF");
        if (is_surrogate(v)) return fail("lone surrogate escape: \\uD800-\\uDFFF only as a high-low pair");
        set.push_back({v, v});
        return Status::ok();
      }
      case 'b':
        if (in_class) {
          set.push_back({8, 8});
          return Status::ok();
        }
        return fail("word boundaries (\\b) are not supported");
      case 'B': return fail("word boundaries (\\B) are not supported");
      case 'A': case 'Z': case 'z': case 'G': return fail("anchors (\\A, \\Z, \\z, \\G) are not supported");
      case 'p': case 'P': return fail("Unicode property classes (\\p{...}) are not supported");
      case 'k': return fail("backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') return fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return fail(std::string("unknown escape \\") + static_cast<char>(c));
        set.push_back({c, c});  // an escaped punctuation character stands for itself
        return Status::ok();
    }
  }

  Status char_class(CodepointRanges& out) {
    ++pos_;  // '['
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    if (peek() == '[' && peek(1) == ':') return fail("POSIX classes ([:alpha:]) are not supported");
    CodepointRanges set;
    bool first = true;
    for (;;) {
      if (at_end()) return fail("missing ']'");
      uint32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      // One member: a character (maybe the start of a range) or a class escape.
      uint32_t lo;
      if (c == '\\') {
        CodepointRanges one;
        DS_RETURN_IF_ERROR(escape(one, true));
        if (one.size() != 1 || one[0].first != one[0].second) {
          set.insert(set.end(), one.begin(), one.end());
          continue;
        }
        lo = one[0].first;
      } else {
        lo = c;
        ++pos_;
      }
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < cps_.size()) {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          CodepointRanges one;
          DS_RETURN_IF_ERROR(escape(one, true));
          if (one.size() != 1 || one[0].first != one[0].second) return fail("a class escape cannot end a range");
          hi = one[0].first;
        } else {
          hi = peek();
          ++pos_;
        }
        if (hi < lo) return fail("character range out of order");
        set.push_back({lo, hi});
      } else {
        set.push_back({lo, lo});
      }
    }
    set = normalize_ranges(set);
    out = negate ? complement(set) : set;
    return Status::ok();
  }
};

}  // namespace

Expr json_string_chars(const CodepointRanges& set_in) {
  CodepointRanges set = normalize_ranges(set_in);
  // Characters JSON writes raw: everything but control characters, '"' and '\'.
  CodepointRanges raw;
  std::vector<Expr> alts;
  for (const auto& [lo, hi] : set) {
    for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp) {
      if (cp < 0x20 || cp == '"' || cp == '\\') {
        std::string esc;
        switch (cp) {
          case '"': esc = "\\\""; break;
          case '\\': esc = "\\\\"; break;
          case '\b': esc = "\\b"; break;
          case '\f': esc = "\\f"; break;
          case '\n': esc = "\\n"; break;
          case '\r': esc = "\\r"; break;
          case '\t': esc = "\\t"; break;
          default: {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            esc = buf;
          }
        }
        alts.push_back(Expr::literal(esc));
      } else {
        raw.push_back({cp, cp});
      }
      if (cp == 0x5C) break;
    }
    if (hi > 0x5C) raw.push_back({std::max<uint32_t>(lo, 0x5D), hi});
  }
  if (!raw.empty()) alts.insert(alts.begin(), Expr::codepoints(raw));
  return Expr::alt(std::move(alts));
}

Result<Expr> regex_to_expr(std::string_view pattern, const RegexOptions& options) {
  RegexParser p(pattern, options);
  return p.parse();
}

Result<Grammar> grammar_from_regex(std::string_view pattern) {
  auto e = regex_to_expr(pattern);
  if (!e) return e.status();
  Grammar g;
  g.root = g.add_rule("root", std::move(*e));
  return g;
}

}  // namespace deltaserve
