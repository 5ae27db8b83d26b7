#include "chat/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "chat/jinja/py_string.h"

namespace deltaserve::jinja {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python "unicode-escape" decoding of a string literal body, which is what jinja2 applies.
// Unknown escapes keep their backslash.
std::string unescape(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (std::size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'v': out.push_back('\v'); break;
      case '\n': break;  // line continuation
      case 'x': case 'u': case 'U': {
        int n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        char32_t cp = 0;
        bool ok = true;
        for (int k = 1; ok && k <= n; ++k) {
          if (i + k >= body.size()) { ok = false; break; }
          int h = hex_value(body[i + k]);
          if (h < 0) ok = false;
          else cp = cp * 16 + static_cast<char32_t>(h);
        }
        if (!ok || cp > 0x10ffff) {
          out.push_back('\\');
          out.push_back(e);
        } else {
          utf8_append(out, cp);
          i += static_cast<std::size_t>(n);
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + (body[++i] - '0');
          utf8_append(out, static_cast<char32_t>(v));
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  Result<std::vector<Token>> run() {
    std::size_t pos = 0;
    while (pos < src_.size()) {
      std::size_t start = find_tag(pos);
      if (start == std::string::npos) {
        emit_text(pos, src_.size(), false);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      std::string text = src_.substr(pos, start - pos);
      if (mod == '-') {
        std::size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: drop spaces/tabs between the line start and the tag.
        std::size_t nl = text.rfind('\n');
        std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool line_starting = l_pos > 0 || pos == 0 || src_[pos - 1] == '\n';
        if (line_starting) {
          bool all_ws = true;
          for (std::size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
          if (all_ws) text.resize(l_pos);
        }
      }
      add_text(text, pos);
      line_ = line_at(start);
      std::size_t body = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        // The comment body starts after `{#`; `{#-` / `{#+` marks are part of `body` here.
        std::size_t end = src_.find("#}", body);
        if (end == std::string::npos) return error("line ", line_, ": unterminated comment");
        bool strip = end > body && src_[end - 1] == '-';
        pos = after_end(end + 2, strip, end > body && src_[end - 1] == '+', true);
        continue;
      }
      tokens_.push_back(tok(kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin));
      auto r = lex_tag(body, kind == '{');
      if (!r) return r.status();
      pos = *r;
      if (kind == '%' && is_raw_open()) {
        auto rr = lex_raw(pos);
        if (!rr) return rr.status();
        pos = *rr;
      }
    }
    Token eof = tok(Token::Type::Eof);
    eof.line = line_at(src_.size());
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t pos) const {
    while (true) {
      std::size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char n = src_[p + 1];
      if (n == '{' || n == '%' || n == '#') return p;
      pos = p + 1;
    }
  }

  int line_at(std::size_t offset) {
    // Incremental: offsets only grow.
    while (line_scan_ < offset && line_scan_ < src_.size()) {
      if (src_[line_scan_] == '\n') ++line_count_;
      ++line_scan_;
    }
    return line_count_;
  }

  Token tok(Token::Type t) const {
    Token k;
    k.type = t;
    k.line = line_;
    return k;
  }

  void add_text(const std::string& text, std::size_t at) {
    if (text.empty()) return;
    Token t = tok(Token::Type::Text);
    t.line = line_at(at);
    t.text = text;
    tokens_.push_back(std::move(t));
  }

  void emit_text(std::size_t from, std::size_t to, bool) { add_text(src_.substr(from, to - from), from); }

  // Position after a closing tag at `pos`, applying `-` (strip all whitespace) or trim_blocks.
  std::size_t after_end(std::size_t pos, bool strip, bool plus, bool block) const {
    if (strip) {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
    } else if (block && !plus && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  Result<std::size_t> lex_tag(std::size_t pos, bool is_var) {
    int depth = 0;
    while (true) {
      while (pos < src_.size() && is_ws(src_[pos])) ++pos;
      if (pos >= src_.size()) return error("line ", line_, ": unexpected end of template inside a tag");
      line_ = line_at(pos);
      const char* close = is_var ? "}}" : "%}";
      if (depth == 0) {
        bool strip = src_[pos] == '-' || src_[pos] == '+';
        std::size_t c = pos + (strip ? 1 : 0);
        if (src_.compare(c, 2, close) == 0) {
          tokens_.push_back(tok(is_var ? Token::Type::VarEnd : Token::Type::BlockEnd));
          return after_end(c + 2, src_[pos] == '-', src_[pos] == '+', !is_var);
        }
      }
      char c = src_[pos];
      if (is_name_start(c)) {
        std::size_t e = pos;
        while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        Token t = tok(Token::Type::Name);
        t.text = src_.substr(pos, e - pos);
        tokens_.push_back(std::move(t));
        pos = e;
      } else if (is_digit(c)) {
        std::size_t e = pos;
        while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        bool is_float = false;
        if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
          is_float = true;
          ++e;
          while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          std::size_t f = e + 1;
          if (f < src_.size() && (src_[f] == '+' || src_[f] == '-')) ++f;
          if (f < src_.size() && is_digit(src_[f])) {
            is_float = true;
            e = f;
            while (e < src_.size() && is_digit(src_[e])) ++e;
          }
        }
        std::string digits;
        for (std::size_t i = pos; i < e; ++i)
          if (src_[i] != '_') digits.push_back(src_[i]);
        Token t = tok(is_float ? Token::Type::Float : Token::Type::Int);
        errno = 0;
        if (is_float) {
          t.float_value = std::strtod(digits.c_str(), nullptr);
        } else {
          t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) return error("line ", line_, ": integer literal too large");
        }
        tokens_.push_back(std::move(t));
        pos = e;
      } else if (c == '\'' || c == '"') {
        std::size_t e = pos + 1;
        while (e < src_.size() && src_[e] != c) e += (src_[e] == '\\') ? 2 : 1;
        if (e >= src_.size()) return error("line ", line_, ": unterminated string literal");
        Token t = tok(Token::Type::String);
        t.text = unescape(std::string_view(src_).substr(pos + 1, e - pos - 1));
        tokens_.push_back(std::move(t));
        pos = e + 1;
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t2 : kTwo)
          if (src_.compare(pos, 2, t2) == 0) op = t2;
        if (op.empty()) {
          if (std::string_view("+-*/%~<>()[]{},.:|=;!").find(c) == std::string_view::npos)
            return error("line ", line_, ": unexpected character '", std::string(1, c), "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        Token t = tok(Token::Type::Op);
        t.text = op;
        tokens_.push_back(std::move(t));
        pos += op.size();
      }
    }
  }

  // The last tokens are BlockBegin Name(raw) BlockEnd.
  bool is_raw_open() const {
    std::size_t n = tokens_.size();
    return n >= 3 && tokens_[n - 3].type == Token::Type::BlockBegin &&
           tokens_[n - 2].type == Token::Type::Name && tokens_[n - 2].text == "raw" &&
           tokens_[n - 1].type == Token::Type::BlockEnd;
  }

  // After `{% raw %}`: everything up to `{% endraw %}` is text.
  Result<std::size_t> lex_raw(std::size_t pos) {
    tokens_.resize(tokens_.size() - 3);
    std::size_t search = pos;
    while (true) {
      std::size_t p = src_.find("{%", search);
      if (p == std::string::npos) return error("line ", line_, ": missing {% endraw %}");
      std::size_t q = p + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = p + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      bool strip_after = q < src_.size() && src_[q] == '-';
      bool plus_after = q < src_.size() && src_[q] == '+';
      if (strip_after || plus_after) ++q;
      if (src_.compare(q, 2, "%}") != 0) return error("line ", line_, ": malformed endraw tag");
      std::string text = src_.substr(pos, p - pos);
      if (strip_before) {
        std::size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else {
        std::size_t nl = text.rfind('\n');
        std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        bool all_ws = true;
        for (std::size_t i = l_pos; i < text.size(); ++i) all_ws = all_ws && is_ws(text[i]);
        if (all_ws && (l_pos > 0 || src_[pos - 1] == '\n')) text.resize(l_pos);
      }
      add_text(text, pos);
      return after_end(q + 2, strip_after, plus_after, true);
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  std::size_t line_scan_ = 0;
  int line_count_ = 1;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  Lexer lexer(normalize_newlines(source));
  return lexer.run();
}

}  // namespace deltaserve::jinja
