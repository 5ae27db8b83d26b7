#include "chat/jinja/py_string.h"

#include <algorithm>
#include <cstdio>

namespace deltaserve::jinja {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int extra;
    if (c < 0x80) { cp = c; extra = 0; }
    else if ((c >> 5) == 0x6) { cp = c & 0x1f; extra = 1; }
    else if ((c >> 4) == 0xe) { cp = c & 0x0f; extra = 2; }
    else if ((c >> 3) == 0x1e) { cp = c & 0x07; extra = 3; }
    else { out.push_back(0xfffd); ++i; continue; }
    bool ok = i + extra < s.size();  // truncated sequence -> U+FFFD
    for (int k = 1; ok && k <= extra; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) ok = false;
      else cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) { out.push_back(0xfffd); ++i; continue; }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) utf8_append(out, cp);
  return out;
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

bool py_isspace(char32_t cp) {
  // Python str.isspace(): bidi class WS/B/S or category Zs.
  switch (cp) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e:
    case 0x1f: case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200a;
  }
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  if (!chars && is_ascii(s)) {  // fast path, the common case
    auto sp = [](char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f); };
    std::size_t b = 0, e = s.size();
    if (left) while (b < e && sp(s[b])) ++b;
    if (right) while (e > b && sp(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t cp) {
    return chars ? set.find(cp) != std::u32string::npos : py_isspace(cp);
  };
  std::size_t b = 0, e = u.size();
  if (left) while (b < e && strip_it(u[b])) ++b;
  if (right) while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    std::size_t pos = 0;
    while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
      std::size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = utf8_decode(s);
  std::size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && py_isspace(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) >= maxsplit) {
      out.push_back(utf8_encode(std::u32string_view(u).substr(i)));  // the rest as it is (Python)
      return out;
    }
    std::size_t j = i;
    while (j < u.size() && !py_isspace(u[j])) ++j;
    out.push_back(utf8_encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   std::int64_t maxsplit) {
  if (!sep || maxsplit < 0) {
    if (!sep && maxsplit >= 0) {
      // Whitespace rsplit with a limit: split from the right.
      std::u32string u = utf8_decode(s);
      std::vector<std::string> rev;
      std::size_t e = u.size();
      while (e > 0) {
        while (e > 0 && py_isspace(u[e - 1])) --e;
        if (e == 0) break;
        if (static_cast<std::int64_t>(rev.size()) >= maxsplit) {
          rev.push_back(utf8_encode(std::u32string_view(u).substr(0, e)));  // the rest as it is (Python)
          e = 0;
          break;
        }
        std::size_t b = e;
        while (b > 0 && !py_isspace(u[b - 1])) --b;
        rev.push_back(utf8_encode(std::u32string_view(u).substr(b, e - b)));
        e = b;
      }
      std::reverse(rev.begin(), rev.end());
      return rev;
    }
    return py_split(s, sep, -1);
  }
  std::vector<std::string> rev;
  std::size_t end = s.size();
  while (static_cast<std::int64_t>(rev.size()) < maxsplit) {
    if (end < sep->size()) break;
    std::size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    rev.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  rev.emplace_back(s.substr(0, end));
  std::reverse(rev.begin(), rev.end());
  return rev;
}

std::string py_replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                       std::int64_t count) {
  std::string out;
  if (old_s.empty()) {
    // Python inserts `new` between every code point (and at both ends).
    std::u32string u = utf8_decode(s);
    std::int64_t n = 0;
    for (std::size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) { out += new_s; ++n; }
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  std::size_t pos = 0;
  std::int64_t n = 0;
  while (count < 0 || n < count) {
    std::size_t hit = s.find(old_s, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_s);
    pos = hit + old_s.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = static_cast<char>(c - 32);
    else if (upper && prev_cased) c = static_cast<char>(c + 32);
    // Non-ASCII bytes count as letters (most are), so "héllo" -> "Héllo" as in Python.
    prev_cased = lower || upper || static_cast<unsigned char>(c) >= 0x80;
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);  // ensure_ascii=False: non-ASCII (and DEL) pass through raw
        }
    }
  }
  out.push_back('"');
}

void append_py_repr_string(std::string& out, std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  out.push_back(q);
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') { out.push_back('\\'); out.push_back(ch); }
    else if (ch == '\n') out += "\\n";
    else if (ch == '\r') out += "\\r";
    else if (ch == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  out.push_back(q);
}

}  // namespace deltaserve::jinja
