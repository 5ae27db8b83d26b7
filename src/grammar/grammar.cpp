#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

namespace deltaserve {

Expr Expr::byte_set(const std::bitset<256>& set) {
  Expr e;
  e.kind = Kind::Bytes;
  e.bytes = set;
  if (set.none()) return nothing();
  return e;
}

Expr Expr::byte_range(unsigned lo, unsigned hi) {
  std::bitset<256> s;
  for (unsigned b = lo; b <= hi && b < 256; ++b) s.set(b);
  return byte_set(s);
}

Expr Expr::literal(std::string_view text) {
  if (text.empty()) return empty();
  std::vector<Expr> items;
  items.reserve(text.size());
  for (unsigned char c : text) items.push_back(byte_range(c, c));
  if (items.size() == 1) return std::move(items[0]);
  return seq(std::move(items));
}

Expr Expr::seq(std::vector<Expr> items) {
  std::vector<Expr> flat;
  flat.reserve(items.size());
  for (auto& it : items) {
    if (it.is_nothing()) return nothing();
    if (it.kind == Kind::Empty) continue;
    if (it.kind == Kind::Seq) {
      for (auto& sub : it.items) flat.push_back(std::move(sub));
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.empty()) return empty();
  if (flat.size() == 1) return std::move(flat[0]);
  Expr e;
  e.kind = Kind::Seq;
  e.items = std::move(flat);
  return e;
}

Expr Expr::alt(std::vector<Expr> items) {
  std::vector<Expr> flat;
  flat.reserve(items.size());
  for (auto& it : items) {
    if (it.is_nothing()) continue;
    if (it.kind == Kind::Alt) {
      for (auto& sub : it.items) flat.push_back(std::move(sub));
    } else {
      flat.push_back(std::move(it));
    }
  }
  if (flat.size() == 1) return std::move(flat[0]);
  Expr e;
  e.kind = Kind::Alt;
  e.items = std::move(flat);
  return e;
}

Expr Expr::repeat(Expr item, int min, int max) {
  if (max >= 0 && max < min) return nothing();
  if (max == 0) return empty();
  if (item.is_nothing()) return min == 0 ? empty() : nothing();
  if (item.kind == Kind::Empty) return empty();
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Kind::Repeat;
  e.min = min;
  e.max = max;
  e.items.push_back(std::move(item));
  return e;
}

Expr Expr::ref(int rule) {
  Expr e;
  e.kind = Kind::Ref;
  e.rule = rule;
  return e;
}

Expr Expr::exclude(std::vector<std::string> substrings) {
  Expr e;
  e.kind = Kind::Exclude;
  for (auto& s : substrings)
    if (!s.empty()) e.excluded.push_back(std::move(s));
  return e;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

CodepointRanges normalize_ranges(CodepointRanges ranges) {
  for (auto& r : ranges) {
    if (r.first > r.second) std::swap(r.first, r.second);
    r.second = std::min<uint32_t>(r.second, 0x10FFFF);
  }
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges out;
  for (const auto& r : ranges) {
    if (r.first > 0x10FFFF) continue;
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

namespace {

// Splits [lo, hi] (scalar values of one UTF-8 length, no surrogates) until each piece is a
// product of byte ranges, and appends one Seq per piece.
void utf8_pieces(uint32_t lo, uint32_t hi, std::vector<Expr>& out) {
  // Surrogates are not scalar values.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_pieces(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_pieces(0xE000, hi, out);
    return;
  }
  // One encoded length per piece.
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_pieces(lo, edge, out);
      utf8_pieces(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back(Expr::byte_range(lo, hi));
    return;
  }
  const int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
  // Align on continuation-byte boundaries so every byte position ranges independently.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_pieces(lo, lo | m, out);
        utf8_pieces((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_pieces(lo, (hi & ~m) - 1, out);
        utf8_pieces(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, a);
  append_utf8(hi, b);
  std::vector<Expr> seq;
  for (size_t k = 0; k < a.size(); ++k)
    seq.push_back(Expr::byte_range(static_cast<unsigned char>(a[k]), static_cast<unsigned char>(b[k])));
  out.push_back(Expr::seq(std::move(seq)));
}

}  // namespace

Expr Expr::codepoints(const CodepointRanges& ranges_in, bool negate) {
  CodepointRanges ranges = normalize_ranges(ranges_in);
  if (negate) {
    CodepointRanges inv;
    uint32_t next = 0;
    for (const auto& r : ranges) {
      if (r.first > next) inv.push_back({next, r.first - 1});
      next = r.second + 1;
    }
    if (next <= 0x10FFFF) inv.push_back({next, 0x10FFFF});
    ranges = std::move(inv);
  }
  // Single-byte members merge into one byte set.
  std::bitset<256> ascii;
  std::vector<Expr> alts;
  for (const auto& r : ranges) {
    uint32_t lo = r.first, hi = r.second;
    if (lo < 0x80) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii.set(c);
      if (hi < 0x80) continue;
      lo = 0x80;
    }
    utf8_pieces(lo, hi, alts);
  }
  if (ascii.any()) alts.insert(alts.begin(), Expr::byte_set(ascii));
  return Expr::alt(std::move(alts));
}

int Grammar::add_rule(std::string name, bool shared) {
  rules_.push_back(GrammarRule{std::move(name), Expr::empty(), shared});
  return static_cast<int>(rules_.size()) - 1;
}

int Grammar::add_rule(std::string name, Expr body, bool shared) {
  rules_.push_back(GrammarRule{std::move(name), std::move(body), shared});
  return static_cast<int>(rules_.size()) - 1;
}

int Grammar::find(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {

void shift_refs(Expr& e, int offset) {
  if (e.kind == Expr::Kind::Ref) e.rule += offset;
  for (auto& it : e.items) shift_refs(it, offset);
}

}  // namespace

int Grammar::import(const Grammar& other) {
  const int offset = n_rules();
  for (int i = 0; i < other.n_rules(); ++i) {
    GrammarRule r = other.rule(i);
    shift_refs(r.body, offset);
    rules_.push_back(std::move(r));
  }
  return other.root + offset;
}

namespace {

std::string byte_text(unsigned b) {
  if (b == '\\' || b == ']' || b == '[' || b == '-' || b == '^') return std::string("\\") + static_cast<char>(b);
  if (b >= 0x20 && b < 0x7F) return std::string(1, static_cast<char>(b));
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02X", b);
  return buf;
}

void print(const Expr& e, const Grammar* g, std::string& out) {
  switch (e.kind) {
    case Expr::Kind::Empty: out += "\"\""; return;
    case Expr::Kind::Bytes: {
      if (e.bytes.count() == 1) {
        for (unsigned b = 0; b < 256; ++b)
          if (e.bytes.test(b)) {
            out += "'" + byte_text(b) + "'";
          }
        return;
      }
      out += '[';
      for (unsigned b = 0; b < 256;) {
        if (!e.bytes.test(b)) {
          ++b;
          continue;
        }
        unsigned c = b;
        while (c + 1 < 256 && e.bytes.test(c + 1)) ++c;
        out += byte_text(b);
        if (c > b) out += "-" + byte_text(c);
        b = c + 1;
      }
      out += ']';
      return;
    }
    case Expr::Kind::Seq:
    case Expr::Kind::Alt: {
      if (e.items.empty()) {
        out += "(!)";
        return;
      }
      out += '(';
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i) out += e.kind == Expr::Kind::Alt ? " | " : " ";
        print(e.items[i], g, out);
      }
      out += ')';
      return;
    }
    case Expr::Kind::Repeat:
      print(e.items[0], g, out);
      out += "{" + std::to_string(e.min) + "," + (e.max < 0 ? std::string() : std::to_string(e.max)) + "}";
      return;
    case Expr::Kind::Ref:
      out += g && e.rule >= 0 && e.rule < g->n_rules() ? g->rule(e.rule).name : "#" + std::to_string(e.rule);
      return;
    case Expr::Kind::Exclude:
      out += "exclude(";
      for (size_t i = 0; i < e.excluded.size(); ++i) out += (i ? ", \"" : "\"") + e.excluded[i] + "\"";
      out += ")";
      return;
  }
}

}  // namespace

std::string expr_to_string(const Expr& e, const Grammar* g) {
  std::string out;
  print(e, g, out);
  return out;
}

std::string Grammar::to_string() const {
  std::string out;
  for (int i = 0; i < n_rules(); ++i) {
    out += rules_[static_cast<size_t>(i)].name + (i == root ? " (root)" : "") + " ::= ";
    print(rules_[static_cast<size_t>(i)].body, this, out);
    out += '\n';
  }
  return out;
}

}  // namespace deltaserve
