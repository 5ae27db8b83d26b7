#include "server/json_util.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "server/api_error.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

std::string ApiError::to_json() const {
  json e = {{"message", sanitize_utf8(message)},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}}.dump();
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > limit) return limit + 1;
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

namespace {

void dump_python(const json& v, std::string& out) {
  switch (v.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace);
        out += ": ";
        dump_python(it.value(), out);
      }
      out += '}';
      break;
    }
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump_python(item, out);
      }
      out += ']';
      break;
    }
    default:
      out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

}  // namespace

std::string python_json_dumps(const json& value) {
  std::string out;
  dump_python(value, out);
  return out;
}

std::string safe_dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// Length of the valid UTF-8 sequence at text[i], or 0 if invalid / truncated.
std::size_t utf8_seq_len(std::string_view text, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char c = b(i);
  std::size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
      cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

}  // namespace

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t n = utf8_seq_len(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::size_t utf8_complete_prefix(std::string_view text) {
  // Look back at most 3 bytes for the start of a multi-byte sequence that is cut off.
  std::size_t n = text.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    std::size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                    : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

// --- Python literal parser ---

namespace {

class PyLiteralParser {
 public:
  explicit PyLiteralParser(std::string_view s) : s_(s) {}

  std::optional<json> parse() {
    auto v = value(0);
    if (!v) return std::nullopt;
    skip_ws();
    if (pos_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool word(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      std::size_t end = pos_ + w.size();
      if (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_'))
        return false;
      pos_ = end;
      return true;
    }
    return false;
  }

  std::optional<json> value(int depth) {
    if (depth > 64) return std::nullopt;
    skip_ws();
    if (pos_ >= s_.size()) return std::nullopt;
    char c = s_[pos_];
    if (c == '{') return dict(depth);
    if (c == '[' || c == '(') return list(depth, c == '[' ? ']' : ')');
    if (c == '\'' || c == '"') return string();
    if (word("True")) return json(true);
    if (word("False")) return json(false);
    if (word("None")) return json(nullptr);
    return number();
  }

  std::optional<json> dict(int depth) {
    ++pos_;
    json obj = json::object();
    if (eat('}')) return obj;
    for (;;) {
      auto k = value(depth + 1);
      if (!k || !eat(':')) return std::nullopt;
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      std::string key = k->is_string() ? k->get<std::string>() : k->dump();
      obj[key] = std::move(*v);
      if (eat(',')) {
        if (eat('}')) return obj;
        continue;
      }
      if (eat('}')) return obj;
      return std::nullopt;
    }
  }

  std::optional<json> list(int depth, char close) {
    ++pos_;
    json arr = json::array();
    if (eat(close)) return arr;
    for (;;) {
      auto v = value(depth + 1);
      if (!v) return std::nullopt;
      arr.push_back(std::move(*v));
      if (eat(',')) {
        if (eat(close)) return arr;
        continue;
      }
      if (eat(close)) return arr;
      return std::nullopt;
    }
  }

  std::optional<json> string() {
    char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == quote) return json(out);
      if (c == '\\' && pos_ < s_.size()) {
        char e = s_[pos_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case '0': out += '\0'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          default:
            out += '\\';
            out += e;
        }
        continue;
      }
      out += c;
    }
    return std::nullopt;
  }

  std::optional<json> number() {
    std::size_t start = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    bool is_float = false;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' ||
                 ((c == '-' || c == '+') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E'))) {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    std::string text(s_.substr(start, pos_ - start));
    if (text.empty() || text == "-" || text == "+") return std::nullopt;
    // Out of int64 or double range: not read (the caller keeps the raw text), where strtoll would
    // clamp to INT64_MAX and strtod give inf, which JSON writes as null.
    char* end = nullptr;
    errno = 0;
    if (!is_float) {
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (*end == '\0' && errno != ERANGE) return json(v);
      return std::nullopt;
    }
    double d = std::strtod(text.c_str(), &end);
    if (*end != '\0' || !std::isfinite(d)) return std::nullopt;
    return json(d);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::optional<json> parse_python_literal(std::string_view text) {
  return PyLiteralParser(text).parse();
}

double json_float(float value) {
  if (!std::isfinite(value)) return value;
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(value));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == value) return d;
  }
  return value;
}

}  // namespace deltaserve
