#include "grammar/json_schema.h"

#include <cmath>
#include <optional>
#include <set>

#include "grammar/regex.h"
#include "util/json_parse.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxDepth = 64;

// JSON Schema keywords this converter does not implement: an error names them.
const std::set<std::string>& unsupported_keywords() {
  static const std::set<std::string> k = {
      "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
      "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains",
      "minContains", "maxContains", "uniqueItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
      "$recursiveAnchor", "multipleOf"};
  return k;
}

// Keywords that constrain something (siblings of $ref or anyOf beyond these are refused).
const std::set<std::string>& structural_keywords() {
  static const std::set<std::string> k = {
      "type", "properties", "required", "additionalProperties", "minProperties", "maxProperties",
      "enum", "const", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "anyOf",
      "oneOf", "allOf", "$ref", "nullable", "minLength", "maxLength", "pattern", "format", "minimum",
      "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  return k;
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

std::string uint_text(uint64_t v) { return std::to_string(v); }

uint64_t pow10(int n) {
  uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

// Same-length decimal strings lo <= hi: every string of that length between them.
Expr digits_between(const std::string& lo, const std::string& hi) {
  const size_t n = lo.size();
  if (n == 0) return Expr::empty();
  if (lo == hi) return Expr::literal(lo);
  if (lo[0] == hi[0]) return Expr::seq({Expr::literal(lo.substr(0, 1)), digits_between(lo.substr(1), hi.substr(1))});
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  const bool lo_zeros = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_nines = hi_rest.find_first_not_of('9') == std::string::npos;
  std::vector<Expr> alts;
  if (!lo_zeros)
    alts.push_back(Expr::seq({Expr::literal(lo.substr(0, 1)), digits_between(lo_rest, std::string(n - 1, '9'))}));
  const char mid_lo = static_cast<char>(lo_zeros ? lo[0] : lo[0] + 1);
  const char mid_hi = static_cast<char>(hi_nines ? hi[0] : hi[0] - 1);
  if (mid_lo <= mid_hi)
    alts.push_back(Expr::seq({Expr::byte_range(static_cast<unsigned char>(mid_lo), static_cast<unsigned char>(mid_hi)),
                              Expr::repeat(Expr::byte_range('0', '9'), static_cast<int>(n - 1), static_cast<int>(n - 1))}));
  if (!hi_nines)
    alts.push_back(Expr::seq({Expr::literal(hi.substr(0, 1)), digits_between(std::string(n - 1, '0'), hi_rest)}));
  return Expr::alt(std::move(alts));
}

// Numbers are kept to what a double (and an int64) holds: at most 18 integer digits.
constexpr uint64_t kMaxMagnitude = 999'999'999'999'999'999ull;

// Non-negative integers in [a, b] (b absent: up to kMaxMagnitude), no leading zeros.
Expr magnitude_range(uint64_t a, std::optional<uint64_t> b_in) {
  const uint64_t b = b_in ? *b_in : std::max(a, kMaxMagnitude);
  if (b < a) return Expr::nothing();
  std::vector<Expr> alts;
  const int la = static_cast<int>(uint_text(a).size());
  const int lb = static_cast<int>(uint_text(b).size());
  for (int len = la; len <= lb; ++len) {
    const uint64_t lo = len == la ? a : pow10(len - 1);
    const uint64_t hi = len == lb ? b : pow10(len) - 1;
    if (lo > hi) continue;
    alts.push_back(digits_between(uint_text(lo), uint_text(hi)));
  }
  return Expr::alt(std::move(alts));
}

uint64_t magnitude(int64_t v) { return v < 0 ? uint64_t(0) - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

// Fraction kinds for bounded numbers.
enum class Frac { Any, Zero, NonZero, None };

Frac frac_and(Frac a, Frac b) {
  if (a == Frac::None || b == Frac::None) return Frac::None;
  if (a == Frac::Any) return b;
  if (b == Frac::Any) return a;
  return a == b ? a : Frac::None;
}

// Fractions have at most 16 digits (a double holds ~17 significant digits), so a sampled number
// always ends.
Expr frac_expr(Frac f) {
  Expr digit = Expr::byte_range('0', '9');
  switch (f) {
    case Frac::Any: return Expr::opt(Expr::seq({Expr::literal("."), Expr::repeat(digit, 1, 16)}));
    case Frac::Zero: return Expr::opt(Expr::seq({Expr::literal("."), Expr::repeat(Expr::literal("0"), 1, 16)}));
    case Frac::NonZero:
      return Expr::seq({Expr::literal("."), Expr::repeat(digit, 0, 15), Expr::byte_range('1', '9')});
    case Frac::None: break;
  }
  return Expr::nothing();
}

struct Piece {
  uint64_t lo = 0;
  std::optional<uint64_t> hi;
  Frac frac = Frac::Any;
};

std::vector<Piece> intersect(const std::vector<Piece>& a, const std::vector<Piece>& b) {
  std::vector<Piece> out;
  for (const auto& x : a)
    for (const auto& y : b) {
      Piece p;
      p.lo = std::max(x.lo, y.lo);
      if (x.hi && y.hi) p.hi = std::min(*x.hi, *y.hi);
      else if (x.hi) p.hi = x.hi;
      else p.hi = y.hi;
      p.frac = frac_and(x.frac, y.frac);
      if (p.frac == Frac::None || (p.hi && *p.hi < p.lo)) continue;
      out.push_back(p);
    }
  return out;
}

struct Bound {
  int64_t v = 0;
  bool exclusive = false;
};

// Pieces (integer part range, fraction kind) of the magnitudes m = I.f on one side of zero.
std::vector<Piece> side_pieces(bool negative, const std::optional<Bound>& lower, const std::optional<Bound>& upper) {
  const std::vector<Piece> all = {Piece{0, std::nullopt, Frac::Any}};
  std::vector<Piece> lo = all, hi = all;
  if (!negative) {
    if (lower) {
      const int64_t L = lower->v;
      if (!lower->exclusive) {
        if (L > 0) lo = {Piece{static_cast<uint64_t>(L), std::nullopt, Frac::Any}};
      } else if (L >= 0) {
        lo = {Piece{static_cast<uint64_t>(L) + 1, std::nullopt, Frac::Any}, Piece{static_cast<uint64_t>(L), static_cast<uint64_t>(L), Frac::NonZero}};
      }
    }
    if (upper) {
      const int64_t U = upper->v;
      if (!upper->exclusive) {
        if (U < 0) return {};
        hi = {Piece{static_cast<uint64_t>(U), static_cast<uint64_t>(U), Frac::Zero}};
        if (U >= 1) hi.push_back(Piece{0, static_cast<uint64_t>(U) - 1, Frac::Any});
      } else {
        if (U <= 0) return {};
        hi = {Piece{0, static_cast<uint64_t>(U) - 1, Frac::Any}};
      }
    }
  } else {
    // x = -m: x >= L  <=>  m <= -L;  x <= U  <=>  m >= -U.
    if (lower) {
      const int64_t L = lower->v;
      if (!lower->exclusive) {
        if (L > 0) return {};
        const uint64_t m = magnitude(L);
        lo = {Piece{m, m, Frac::Zero}};
        if (m >= 1) lo.push_back(Piece{0, m - 1, Frac::Any});
      } else {
        if (L >= 0) return {};
        const uint64_t m = magnitude(L);
        lo = {Piece{0, m - 1, Frac::Any}};
      }
    }
    if (upper) {
      const int64_t U = upper->v;
      if (!upper->exclusive) {
        if (U < 0) hi = {Piece{magnitude(U), std::nullopt, Frac::Any}};
      } else if (U <= 0) {
        const uint64_t m = magnitude(U);
        hi = {Piece{m + 1, std::nullopt, Frac::Any}, Piece{m, m, Frac::NonZero}};
      }
    }
  }
  return intersect(lo, hi);
}

// Any JSON number a double holds: up to 16 integer digits, an exponent of up to 2 digits.
Expr number_plain() {
  Expr digit = Expr::byte_range('0', '9');
  std::bitset<256> e, sign;
  e.set('e');
  e.set('E');
  sign.set('+');
  sign.set('-');
  Expr intpart = Expr::alt({Expr::literal("0"), Expr::seq({Expr::byte_range('1', '9'), Expr::repeat(digit, 0, 15)})});
  return Expr::seq({Expr::opt(Expr::literal("-")), intpart, frac_expr(Frac::Any),
                    Expr::opt(Expr::seq({Expr::byte_set(e), Expr::opt(Expr::byte_set(sign)), Expr::repeat(digit, 1, 2)}))});
}

// A JSON escape that stands for a Unicode scalar value: \ and one of "\/bfnrt, or \u and four hex
// digits that are not a surrogate, or a high surrogate \uD800-\uDBFF followed by a low one
// \uDC00-\uDFFF. A lone surrogate fits RFC 8259's grammar but is no character: parsers refuse it
// (ours does, so a tool call's arguments would not parse) or keep a broken one. Never produced.
Expr json_escape() {
  auto set = [](std::string_view chars) {
    std::bitset<256> b;
    for (char c : chars) b.set(static_cast<unsigned char>(c));
    return Expr::byte_set(b);
  };
  const Expr h = set("0123456789abcdefABCDEF"), d = set("dD");
  Expr scalar = Expr::alt({Expr::seq({set("0123456789abcefABCEF"), h, h, h}),  // \u0000-\uCFFF, \uE000-\uFFFF
                           Expr::seq({d, set("01234567"), h, h}),                 // \uD000-\uD7FF
                           Expr::seq({d, set("89abAB"), h, h, Expr::literal("\\u"), d, set("cdefCDEF"), h, h})});
  return Expr::seq({Expr::literal("\\"), Expr::alt({set("\"\\/bfnrt"), Expr::seq({Expr::literal("u"), scalar})})});
}

// One character of a JSON string: raw (not '"', '\\' or a control character) or an escape.
Expr json_char() {
  return Expr::alt({Expr::codepoints({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negate=*/true), json_escape()});
}

// A JSON number given as a bound: a whole number that fits int64, or an error.
Result<int64_t> whole_bound(const json& v, const std::string& keyword, const std::string& path, bool integer_type,
                            bool round_up) {
  if (!v.is_number()) return error("json_schema: '", keyword, "' at ", path, " must be a number");
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return error("json_schema: '", keyword, "' at ", path, " is out of range");
    return v.get<int64_t>();
  }
  double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 9.0e18) return error("json_schema: '", keyword, "' at ", path, " is out of range");
  if (std::floor(d) == d) return static_cast<int64_t>(d);
  if (!integer_type)
    return error("json_schema: '", keyword, "' at ", path, " is ", v.dump(),
                 ": bounds of a 'number' must be whole numbers (fractional bounds are not supported)");
  return static_cast<int64_t>(round_up ? std::ceil(d) : std::floor(d));
}

}  // namespace

// Every part has a length bound, so a sampled value always ends.
const char* json_string_format_regex(const std::string& f) {
  if (f == "date") return R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
  if (f == "time") return R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  if (f == "date-time")
    return R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  if (f == "email")
    return R"([a-zA-Z0-9_+-]{1,32}(\.[a-zA-Z0-9_+-]{1,32}){0,3}@[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){0,3}\.[a-zA-Z]{2,6})";
  if (f == "uuid") return R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
  if (f == "ipv4") return R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})";
  if (f == "hostname")
    return R"([a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){0,4})";
  if (f == "uri") return R"([a-zA-Z][a-zA-Z0-9+.-]{0,15}://[a-zA-Z0-9.-]{1,64}(:\d{1,5})?(/[a-zA-Z0-9._~!$&'()*+,;=:@-]{0,32}){0,8})";
  return nullptr;
}

namespace {

// JSON pointer token decoding: ~1 -> /, ~0 -> ~, %XX.
std::string pointer_token(const std::string& t) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '~' && i + 1 < t.size()) {
      out += t[i + 1] == '1' ? '/' : '~';
      ++i;
    } else if (t[i] == '%' && i + 2 < t.size() && std::isxdigit(static_cast<unsigned char>(t[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(t[i + 2]))) {
      out += static_cast<char>(std::stoi(t.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += t[i];
    }
  }
  return out;
}

bool plain_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c >= 0x7F || c == '"' || c == '\\') return false;
  return true;
}

Expr key_node(const std::string& prefix, const std::vector<std::string>& names, const Expr& rest) {
  std::vector<Expr> alts;
  std::bitset<256> next;
  bool is_name = false;
  for (const auto& n : names) {
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    if (n.size() == prefix.size()) is_name = true;
    else next.set(static_cast<unsigned char>(n[prefix.size()]));
  }
  if (!is_name) alts.push_back(Expr::literal("\""));
  CodepointRanges taken;
  for (unsigned b = 0; b < 128; ++b) {
    if (!next.test(b)) continue;
    taken.push_back({b, b});
    alts.push_back(Expr::seq({Expr::literal(std::string(1, static_cast<char>(b))),
                              key_node(prefix + static_cast<char>(b), names, rest)}));
  }
  // Any other first character, then any rest of a string.
  taken.push_back({0, 0x1F});
  taken.push_back({'"', '"'});
  taken.push_back({'\\', '\\'});
  Expr first = Expr::alt({Expr::codepoints(taken, /*negate=*/true), json_escape()});
  alts.push_back(Expr::seq({std::move(first), rest}));
  return Expr::alt(std::move(alts));
}

// A JSON string key (quotes included) that is none of `names`, so that an additional property
// cannot repeat a declared one. Names that need escaping or are not ASCII fall back to any key.
Expr key_except(const std::vector<std::string>& names, const Expr& rest) {
  for (const auto& n : names)
    if (!plain_ascii(n)) return Expr::seq({Expr::literal("\""), rest});
  return Expr::seq({Expr::literal("\""), key_node("", names, rest)});
}

}  // namespace

Expr integer_range_expr(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  if (!hi || *hi >= 0) {
    const uint64_t a = lo ? static_cast<uint64_t>(std::max<int64_t>(*lo, 0)) : 0;
    std::optional<uint64_t> b;
    if (hi) b = static_cast<uint64_t>(*hi);
    alts.push_back(magnitude_range(a, b));
  }
  if (!lo || *lo < 0) {
    const uint64_t m_lo = hi && *hi < 0 ? magnitude(*hi) : 1;
    std::optional<uint64_t> m_hi;
    if (lo) m_hi = magnitude(*lo);
    if (!m_hi || m_lo <= *m_hi) alts.push_back(Expr::seq({Expr::literal("-"), magnitude_range(m_lo, m_hi)}));
  }
  return Expr::alt(std::move(alts));
}

struct JsonSchemaConverter::Ctx {
  const json* document = nullptr;
  int index = -1;  // of the document in documents_
};

JsonSchemaConverter::JsonSchemaConverter(Grammar& grammar, const JsonSchemaOptions& options)
    : g_(grammar), opts_(options) {}

Expr JsonSchemaConverter::whitespace() const {
  std::bitset<256> ws;
  ws.set(' ');
  ws.set('\t');
  ws.set('\n');
  ws.set('\r');
  return Expr::repeat(Expr::byte_set(ws), 0, opts_.max_whitespace);
}

Expr JsonSchemaConverter::string_rest() {
  if (string_rest_ < 0) {
    string_rest_ = g_.add_rule("json_string_rest",
                               Expr::seq({Expr::star(json_char()), Expr::literal("\"")}),
                               /*shared=*/true);
  }
  return Expr::ref(string_rest_);
}

Expr JsonSchemaConverter::any_value() {
  if (any_value_ < 0) {
    any_value_ = g_.add_rule("json_value");
    any_object_ = g_.add_rule("json_object");
    any_array_ = g_.add_rule("json_array");
    Expr ws = whitespace();
    Expr sep = Expr::seq({ws, Expr::literal(","), ws});
    Expr member = Expr::seq({Expr::literal("\""), string_rest(), ws, Expr::literal(":"), ws, Expr::ref(any_value_)});
    g_.set_body(any_object_, Expr::seq({Expr::literal("{"), ws,
                                        Expr::opt(Expr::seq({member, Expr::star(Expr::seq({sep, member}))})), ws,
                                        Expr::literal("}")}));
    g_.set_body(any_array_, Expr::seq({Expr::literal("["), ws,
                                       Expr::opt(Expr::seq({Expr::ref(any_value_),
                                                            Expr::star(Expr::seq({sep, Expr::ref(any_value_)}))})),
                                       ws, Expr::literal("]")}));
    g_.set_body(any_value_, Expr::alt({Expr::ref(any_object_), Expr::ref(any_array_),
                                       Expr::seq({Expr::literal("\""), string_rest()}), number_plain(),
                                       Expr::literal("true"), Expr::literal("false"), Expr::literal("null")}));
  }
  return Expr::ref(any_value_);
}

Expr JsonSchemaConverter::any_object() {
  any_value();
  return Expr::ref(any_object_);
}

Expr JsonSchemaConverter::const_value(const json& v) {
  Expr ws = whitespace();
  if (v.is_object()) {
    std::vector<Expr> items = {Expr::literal("{"), ws};
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) items.push_back(Expr::seq({ws, Expr::literal(","), ws}));
      first = false;
      items.push_back(Expr::literal(json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace)));
      items.push_back(ws);
      items.push_back(Expr::literal(":"));
      items.push_back(ws);
      items.push_back(const_value(it.value()));
    }
    items.push_back(ws);
    items.push_back(Expr::literal("}"));
    return Expr::seq(std::move(items));
  }
  if (v.is_array()) {
    std::vector<Expr> items = {Expr::literal("["), ws};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) items.push_back(Expr::seq({ws, Expr::literal(","), ws}));
      items.push_back(const_value(v[i]));
    }
    items.push_back(ws);
    items.push_back(Expr::literal("]"));
    return Expr::seq(std::move(items));
  }
  return Expr::literal(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

Result<Expr> JsonSchemaConverter::value(const json& schema, const json& document, const std::string& path) {
  Ctx ctx{&document, document_index(document)};
  return convert(schema, ctx, path, 0);
}

// Callers pass a document by reference, often a copy made for the call: the address finds the
// document given last there, the value decides whether this is it (a local copy of another tool's
// schema may sit at the same address). A new one is kept, to compare the next call's against.
int JsonSchemaConverter::document_index(const json& document) {
  Document& d = documents_[&document];
  if (d.index < 0 || d.value != document) d = {document, documents_given_++};
  return d.index;
}

Result<Expr> JsonSchemaConverter::convert_ref(const std::string& ref, Ctx& ctx, const std::string& path, int depth) {
  if (ref.empty() || ref[0] != '#')
    return error("json_schema: $ref ", quote(ref), " at ", path, " points outside the schema (only local '#...' references are supported)");
  const auto key = std::make_pair(ctx.index, ref);
  auto it = ref_rules_.find(key);
  if (it != ref_rules_.end()) return Expr::ref(it->second);
  // Resolve the pointer.
  const json* target = ctx.document;
  std::string rest = ref.substr(1);
  if (!rest.empty()) {
    if (rest[0] != '/') return error("json_schema: $ref ", quote(ref), " at ", path, " is not a JSON pointer ('#/...')");
    size_t pos = 1;
    while (pos <= rest.size()) {
      size_t slash = rest.find('/', pos);
      if (slash == std::string::npos) slash = rest.size();
      const std::string token = pointer_token(rest.substr(pos, slash - pos));
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < target->size()) {
        target = &(*target)[std::stoul(token)];
      } else {
        return error("json_schema: $ref ", quote(ref), " at ", path, " does not resolve");
      }
      pos = slash + 1;
    }
  }
  const int rule = g_.add_rule("ref " + ref);
  ref_rules_[key] = rule;
  auto body = convert(*target, ctx, ref, depth + 1);
  if (!body) return body;
  g_.set_body(rule, std::move(*body));
  return Expr::ref(rule);
}

Result<Expr> JsonSchemaConverter::convert(const json& s, Ctx& ctx, const std::string& path, int depth) {
  if (depth > kMaxDepth) return error("json_schema: nested deeper than ", kMaxDepth, " levels at ", path);
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    return error("json_schema: the schema at ", path, " is false: no value is valid");
  }
  if (!s.is_object()) return error("json_schema: the schema at ", path, " must be an object or a boolean");
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (!unsupported_keywords().count(k)) continue;
    // Keywords whose value here constrains nothing are fine.
    if (k == "uniqueItems" && it.value() == false) continue;
    if (k == "patternProperties" && it.value().is_object() && it.value().empty()) continue;
    if (k == "multipleOf" && it.value().is_number() && it.value().get<double>() == 1.0 &&
        s.value("type", json()) == "integer")
      continue;
    return error("json_schema: unsupported keyword '", k, "' at ", path);
  }
  auto siblings = [&](const char* keyword) -> std::string {
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() != keyword && structural_keywords().count(it.key()) && it.key() != "nullable") return it.key();
    }
    return "";
  };
  if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
    json inner = s;
    inner.erase("nullable");
    auto e = convert(inner, ctx, path, depth + 1);
    if (!e) return e;
    return Expr::alt({std::move(*e), Expr::literal("null")});
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) return error("json_schema: $ref at ", path, " must be a string");
    if (std::string other = siblings("$ref"); !other.empty())
      return error("json_schema: $ref together with '", other, "' at ", path, " is not supported");
    return convert_ref(s["$ref"].get<std::string>(), ctx, path, depth);
  }
  if (s.contains("const") || s.contains("enum")) {
    // The listed values, those of them that are of the schema's `type`; other keywords beside them
    // (maxLength, minimum, ...) are refused rather than ignored.
    const char* key = s.contains("const") ? "const" : "enum";
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "const" && it.key() != "enum" && it.key() != "type" && structural_keywords().count(it.key()))
        return error("json_schema: '", key, "' together with '", it.key(), "' at ", path, " is not supported");
    const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array() || values.empty()) return error("json_schema: 'enum' at ", path, " must be a non-empty list");
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      for (const auto& x : t.is_array() ? t : json::array({t})) {
        if (!x.is_string()) return error("json_schema: 'type' at ", path, " must be a string or a list of strings");
        types.push_back(x.get<std::string>());
      }
    }
    auto of_type = [&](const json& v) {
      if (types.empty()) return true;
      for (const auto& t : types) {
        if ((t == "string" && v.is_string()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
            (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "number" && v.is_number()) ||
            (t == "integer" && (v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) ==
                                                                                      v.get<double>()))))
          return true;
      }
      return false;
    };
    std::vector<Expr> alts;
    for (const auto& v : values)
      if (of_type(v)) alts.push_back(const_value(v));
    if (alts.empty()) return error("json_schema: no value of '", key, "' at ", path, " is of its 'type'");
    return Expr::alt(std::move(alts));
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(key)) continue;
    const json& list = s[key];
    if (!list.is_array() || list.empty())
      return error("json_schema: '", key, "' at ", path, " must be a non-empty list");
    if (std::string other = siblings(key); !other.empty())
      return error("json_schema: '", key, "' together with '", other, "' at ", path, " is not supported");
    if (std::string(key) == "allOf" && list.size() != 1)
      return error("json_schema: 'allOf' with more than one schema at ", path, " is not supported");
    std::vector<Expr> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto e = convert(list[i], ctx, path + "/" + key + "/" + std::to_string(i), depth + 1);
      if (!e) return e;
      alts.push_back(std::move(*e));
    }
    return Expr::alt(std::move(alts));
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) return error("json_schema: 'type' at ", path, " must be a string or a list of strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return error("json_schema: 'type' at ", path, " must be a string or a list of strings");
    }
  } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties") ||
             s.contains("minProperties") || s.contains("maxProperties")) {
    types.push_back("object");
  } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
    types.push_back("array");
  } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || s.contains("format")) {
    types.push_back("string");
  } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
    types.push_back("number");
  } else {
    return any_value();
  }
  std::vector<Expr> alts;
  for (const auto& t : types) {
    Result<Expr> e = Expr::empty();
    if (t == "object") e = convert_object(s, ctx, path, depth);
    else if (t == "array") e = convert_array(s, ctx, path, depth);
    else if (t == "string") e = convert_string(s, path);
    else if (t == "integer") e = convert_number(s, true, path);
    else if (t == "number") e = convert_number(s, false, path);
    else if (t == "boolean") e = Expr::alt({Expr::literal("true"), Expr::literal("false")});
    else if (t == "null") e = Expr::literal("null");
    else return error("json_schema: unknown type ", quote(t), " at ", path);
    if (!e) return e;
    alts.push_back(std::move(*e));
  }
  return Expr::alt(std::move(alts));
}

Result<Expr> JsonSchemaConverter::convert_object(const json& s, Ctx& ctx, const std::string& path, int depth) {
  Expr ws = whitespace();
  Expr sep = Expr::seq({ws, Expr::literal(","), ws});
  const json empty = json::object();
  const json& props = s.contains("properties") ? s["properties"] : empty;
  if (!props.is_object()) return error("json_schema: 'properties' at ", path, " must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return error("json_schema: 'required' at ", path, " must be a list of names");
    for (const auto& r : s["required"]) {
      if (!r.is_string()) return error("json_schema: 'required' at ", path, " must be a list of names");
      if (!props.contains(r.get<std::string>()))
        return error("json_schema: required property ", quote(r.get<std::string>()), " at ", path,
                     " is not declared in 'properties'");
      required.insert(r.get<std::string>());
    }
  }
  // Additional properties: none when properties are declared and nothing says otherwise.
  std::optional<Expr> extra_value;
  if (s.contains("additionalProperties")) {
    const json& ap = s["additionalProperties"];
    if (ap.is_boolean()) {
      if (ap.get<bool>()) extra_value = any_value();
    } else if (ap.is_object()) {
      auto e = convert(ap, ctx, path + "/additionalProperties", depth + 1);
      if (!e) return e;
      extra_value = std::move(*e);
    } else {
      return error("json_schema: 'additionalProperties' at ", path, " must be a boolean or a schema");
    }
  } else if (props.empty()) {
    extra_value = any_value();
  }
  std::optional<int64_t> min_props, max_props;
  for (const char* key : {"minProperties", "maxProperties"}) {
    if (!s.contains(key)) continue;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
      return error("json_schema: '", key, "' at ", path, " must be a non-negative integer");
    if (!props.empty())
      return error("json_schema: '", key, "' at ", path, " is only supported on objects without 'properties'");
    (std::string(key) == "minProperties" ? min_props : max_props) = s[key].get<int64_t>();
  }
  std::optional<Expr> extra;
  if (extra_value) {
    std::vector<std::string> declared;
    for (auto it = props.begin(); it != props.end(); ++it) declared.push_back(it.key());
    extra = Expr::seq({key_except(declared, string_rest()), ws, Expr::literal(":"), ws, *extra_value});
  }

  if (props.empty()) {
    if (!extra) {
      if (min_props.value_or(0) > 0)
        return error("json_schema: 'minProperties' at ", path, " cannot hold: no property is allowed there");
      return Expr::seq({Expr::literal("{"), ws, Expr::literal("}")});
    }
    const int64_t lo = min_props.value_or(0);
    const int64_t hi = max_props ? *max_props : -1;
    if (hi >= 0 && hi < lo) return error("json_schema: maxProperties < minProperties at ", path);
    if (lo > 1000 || hi > 1000) return error("json_schema: min/maxProperties above 1000 at ", path, " are not supported");
    Expr content = Expr::nothing();
    if (hi != 0) {
      content = Expr::seq({*extra, Expr::repeat(Expr::seq({sep, *extra}), static_cast<int>(std::max<int64_t>(lo - 1, 0)),
                                                hi < 0 ? -1 : static_cast<int>(hi - 1))});
    }
    if (lo == 0) content = Expr::alt({std::move(content), Expr::empty()});
    return Expr::seq({Expr::literal("{"), ws, std::move(content), ws, Expr::literal("}")});
  }

  std::vector<std::string> names;
  std::vector<Expr> members;
  for (auto it = props.begin(); it != props.end(); ++it) {
    auto v = convert(it.value(), ctx, path + "/properties/" + it.key(), depth + 1);
    if (!v) return v;
    names.push_back(it.key());
    members.push_back(Expr::seq({Expr::literal(json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace)), ws,
                                 Expr::literal(":"), ws, std::move(*v)}));
  }
  const size_t n = members.size();
  // After(i): members i.. once something has been written (each preceded by a comma). Written out
  // in place, each possible first member copies all those after it: n^2 in size (100 optional
  // properties were refused as too complex; 800 took 55 s and 4.9 GB). Past a few properties it is
  // a chain of shared rules instead, after(i) = [sep member_i] after(i + 1): linear.
  constexpr size_t kInlineProperties = 8;
  std::vector<Expr> after_rule;  // [n + 1] references to after(i), when chained
  if (n > kInlineProperties) {
    after_rule.resize(n + 1);
    after_rule[n] = Expr::ref(g_.add_rule("json_object_rest", extra ? Expr::star(Expr::seq({sep, *extra})) : Expr::empty(),
                                          /*shared=*/true));
    for (size_t j = n; j-- > 1;) {
      Expr m = Expr::seq({sep, members[j]});
      Expr item = required.count(names[j]) ? std::move(m) : Expr::opt(std::move(m));
      after_rule[j] = Expr::ref(g_.add_rule("json_object_rest", Expr::seq({std::move(item), after_rule[j + 1]}), true));
    }
  }
  auto after = [&](size_t i) {
    if (!after_rule.empty()) return after_rule[i];
    std::vector<Expr> seq;
    for (size_t j = i; j < n; ++j) {
      Expr m = Expr::seq({sep, members[j]});
      seq.push_back(required.count(names[j]) ? std::move(m) : Expr::opt(std::move(m)));
    }
    if (extra) seq.push_back(Expr::star(Expr::seq({sep, *extra})));
    return Expr::seq(std::move(seq));
  };
  size_t first_required = n;
  for (size_t j = 0; j < n; ++j)
    if (required.count(names[j])) {
      first_required = j;
      break;
    }
  std::vector<Expr> firsts;
  for (size_t k = 0; k < n && k <= first_required; ++k) firsts.push_back(Expr::seq({members[k], after(k + 1)}));
  if (first_required == n) {
    if (extra) firsts.push_back(Expr::seq({*extra, Expr::star(Expr::seq({sep, *extra}))}));
    firsts.push_back(Expr::empty());
  }
  return Expr::seq({Expr::literal("{"), ws, Expr::alt(std::move(firsts)), ws, Expr::literal("}")});
}

Result<Expr> JsonSchemaConverter::convert_array(const json& s, Ctx& ctx, const std::string& path, int depth) {
  Expr ws = whitespace();
  Expr sep = Expr::seq({ws, Expr::literal(","), ws});
  int64_t min_items = 0, max_items = -1;
  for (const char* key : {"minItems", "maxItems"}) {
    if (!s.contains(key)) continue;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
      return error("json_schema: '", key, "' at ", path, " must be a non-negative integer");
    (std::string(key) == "minItems" ? min_items : max_items) = s[key].get<int64_t>();
  }
  if (max_items >= 0 && max_items < min_items) return error("json_schema: maxItems < minItems at ", path);
  if (min_items > 10000 || max_items > 10000) return error("json_schema: minItems/maxItems above 10000 at ", path, " are not supported");
  // Tuple items: prefixItems (2020-12) or an items list (draft 4-7) with additionalItems.
  const json* prefix = nullptr;
  const json* rest = nullptr;
  std::string rest_path = path + "/items";
  if (s.contains("prefixItems")) {
    prefix = &s["prefixItems"];
    if (s.contains("items")) rest = &s["items"];
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix = &s["items"];
    if (s.contains("additionalItems")) {
      rest = &s["additionalItems"];
      rest_path = path + "/additionalItems";
    }
  } else if (s.contains("items")) {
    rest = &s["items"];
  }
  std::vector<Expr> fixed;
  if (prefix) {
    if (!prefix->is_array()) return error("json_schema: prefixItems at ", path, " must be a list");
    for (size_t i = 0; i < prefix->size(); ++i) {
      auto e = convert((*prefix)[i], ctx, path + "/prefixItems/" + std::to_string(i), depth + 1);
      if (!e) return e;
      fixed.push_back(std::move(*e));
    }
  }
  std::optional<Expr> item;
  if (!rest) {
    if (!prefix) item = any_value();  // no items keyword: anything
  } else if (!(rest->is_boolean() && !rest->get<bool>())) {
    auto e = convert(*rest, ctx, rest_path, depth + 1);
    if (!e) return e;
    item = std::move(*e);
  }
  const int64_t p = static_cast<int64_t>(fixed.size());
  if (p > 0) {
    // Every prefix item is written, then the extra items the bounds allow.
    if (max_items >= 0 && max_items < p)
      return error("json_schema: maxItems at ", path, " is smaller than the number of prefixItems");
    std::vector<Expr> seq = {Expr::literal("["), ws};
    for (int64_t i = 0; i < p; ++i) {
      if (i) seq.push_back(sep);
      seq.push_back(fixed[static_cast<size_t>(i)]);
    }
    const int64_t lo = std::max<int64_t>(min_items - p, 0);
    const int64_t hi = max_items < 0 ? -1 : max_items - p;
    if (item && hi != 0) {
      seq.push_back(Expr::repeat(Expr::seq({sep, *item}), static_cast<int>(lo), static_cast<int>(hi)));
    } else if (lo > 0) {
      return error("json_schema: minItems at ", path, " needs more items than the tuple allows");
    }
    seq.push_back(ws);
    seq.push_back(Expr::literal("]"));
    return Expr::seq(std::move(seq));
  }
  if (!item) {
    if (min_items > 0) return error("json_schema: 'items' is false at ", path, " but minItems is above 0");
    return Expr::seq({Expr::literal("["), ws, Expr::literal("]")});
  }
  Expr content = Expr::nothing();
  if (max_items != 0) {
    content = Expr::seq({*item, Expr::repeat(Expr::seq({sep, *item}), static_cast<int>(std::max<int64_t>(min_items - 1, 0)),
                                             max_items < 0 ? -1 : static_cast<int>(max_items - 1))});
  }
  if (min_items == 0) content = Expr::alt({std::move(content), Expr::empty()});
  return Expr::seq({Expr::literal("["), ws, std::move(content), ws, Expr::literal("]")});
}

Result<StringLengthBounds> string_length_bounds(const json& s, const std::string& path) {
  StringLengthBounds b;
  for (const char* key : {"minLength", "maxLength"}) {
    if (!s.contains(key)) continue;
    const json& v = s[key];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      return error("json_schema: '", key, "' at ", path, " must be a non-negative integer");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > 10000 : v.get<int64_t>() > 10000)
      return error("json_schema: '", key, "' above 10000 at ", path, " is not supported");
    (std::string(key) == "minLength" ? b.min : b.max) = v.get<int64_t>();
  }
  if (b.min && b.max && *b.max < *b.min) return error("json_schema: maxLength < minLength at ", path);
  return b;
}

Result<Expr> JsonSchemaConverter::convert_string(const json& s, const std::string& path) {
  DS_ASSIGN_OR_RETURN(StringLengthBounds bounds, string_length_bounds(s, path));
  const std::optional<int64_t> min_len = bounds.min, max_len = bounds.max;
  const bool has_pattern = s.contains("pattern"), has_format = s.contains("format");
  if (has_pattern && has_format) return error("json_schema: 'pattern' together with 'format' at ", path, " is not supported");
  if ((has_pattern || has_format) && (min_len || max_len))
    return error("json_schema: '", has_pattern ? "pattern" : "format", "' together with minLength/maxLength at ", path,
                 " is not supported");
  RegexOptions ro;
  ro.json_string = true;
  if (has_pattern) {
    if (!s["pattern"].is_string()) return error("json_schema: 'pattern' at ", path, " must be a string");
    auto e = regex_to_expr(s["pattern"].get<std::string>(), ro);
    if (!e) return error("json_schema: 'pattern' at ", path, ": ", e.status().message());
    return Expr::seq({Expr::literal("\""), std::move(*e), Expr::literal("\"")});
  }
  if (has_format) {
    if (!s["format"].is_string()) return error("json_schema: 'format' at ", path, " must be a string");
    const std::string f = s["format"].get<std::string>();
    const char* re = json_string_format_regex(f);
    if (!re) return error("json_schema: unsupported string format ", quote(f), " at ", path,
                          " (supported: date, time, date-time, email, uuid, ipv4, hostname, uri)");
    auto e = regex_to_expr(re, ro);
    if (!e) return e;
    return Expr::seq({Expr::literal("\""), std::move(*e), Expr::literal("\"")});
  }
  if (!min_len && !max_len) return Expr::seq({Expr::literal("\""), string_rest()});
  Expr ch = json_char();
  return Expr::seq({Expr::literal("\""),
                    Expr::repeat(std::move(ch), static_cast<int>(min_len.value_or(0)), max_len ? static_cast<int>(*max_len) : -1),
                    Expr::literal("\"")});
}

Result<Expr> JsonSchemaConverter::convert_number(const json& s, bool integer, const std::string& path) {
  std::optional<Bound> lower, upper;
  auto tighten_lower = [&](Bound b) {
    if (!lower || b.v > lower->v || (b.v == lower->v && b.exclusive)) lower = b;
  };
  auto tighten_upper = [&](Bound b) {
    if (!upper || b.v < upper->v || (b.v == upper->v && b.exclusive)) upper = b;
  };
  const bool draft4_excl_min = s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean();
  const bool draft4_excl_max = s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean();
  // Draft 4's boolean exclusive bounds: an integer's fractional bound, rounded inwards, already
  // excludes it (minimum 1.5 exclusive: 2 and up), so only a whole bound is made exclusive.
  auto whole = [](const json& v) { return v.is_number_integer() || (v.is_number() && std::floor(v.get<double>()) == v.get<double>()); };
  if (s.contains("minimum")) {
    auto v = whole_bound(s["minimum"], "minimum", path, integer, true);
    if (!v) return v.status();
    tighten_lower(Bound{*v, draft4_excl_min && s["exclusiveMinimum"].get<bool>() && whole(s["minimum"])});
  }
  if (s.contains("maximum")) {
    auto v = whole_bound(s["maximum"], "maximum", path, integer, false);
    if (!v) return v.status();
    tighten_upper(Bound{*v, draft4_excl_max && s["exclusiveMaximum"].get<bool>() && whole(s["maximum"])});
  }
  if (s.contains("exclusiveMinimum") && !draft4_excl_min) {
    const json& x = s["exclusiveMinimum"];
    auto v = whole_bound(x, "exclusiveMinimum", path, integer, false);
    if (!v) return v.status();
    // For integers a fractional bound was floored: x > floor(b) is the same set.
    tighten_lower(Bound{*v, true});
  }
  if (s.contains("exclusiveMaximum") && !draft4_excl_max) {
    auto v = whole_bound(s["exclusiveMaximum"], "exclusiveMaximum", path, integer, true);
    if (!v) return v.status();
    tighten_upper(Bound{*v, true});
  }
  if (integer) {
    std::optional<int64_t> lo, hi;
    if (lower) {
      if (lower->exclusive && lower->v == INT64_MAX) return error("json_schema: no integer satisfies the bounds at ", path);
      lo = lower->exclusive ? lower->v + 1 : lower->v;
    }
    if (upper) {
      if (upper->exclusive && upper->v == INT64_MIN) return error("json_schema: no integer satisfies the bounds at ", path);
      hi = upper->exclusive ? upper->v - 1 : upper->v;
    }
    if (lo && hi && *hi < *lo) return error("json_schema: no integer satisfies the bounds at ", path);
    if (!lo && !hi) {
      Expr digit = Expr::byte_range('0', '9');
      return Expr::seq({Expr::opt(Expr::literal("-")),
                        Expr::alt({Expr::literal("0"), Expr::seq({Expr::byte_range('1', '9'), Expr::repeat(digit, 0, 17)})})});
    }
    return integer_range_expr(lo, hi);
  }
  if (!lower && !upper) return number_plain();
  std::vector<Expr> alts;
  for (bool negative : {false, true}) {
    for (const Piece& p : side_pieces(negative, lower, upper)) {
      Expr e = Expr::seq({magnitude_range(p.lo, p.hi), frac_expr(p.frac)});
      alts.push_back(negative ? Expr::seq({Expr::literal("-"), std::move(e)}) : std::move(e));
    }
  }
  Expr out = Expr::alt(std::move(alts));
  if (out.is_nothing()) return error("json_schema: no number satisfies the bounds at ", path);
  return out;
}

Result<Grammar> grammar_from_json_schema(const json& schema, const JsonSchemaOptions& options) {
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter c(g, options);
  auto v = c.value(schema, schema, "#");
  if (!v) return v.status();
  Expr ws = c.whitespace();
  g.set_body(root, Expr::seq({ws, std::move(*v), ws}));
  g.root = root;
  return g;
}

Result<Grammar> grammar_from_json_schema_text(std::string_view text, const JsonSchemaOptions& options) {
  json schema;
  if (!parse_ordered_json(text, schema)) return error("json_schema: the schema is not valid JSON");
  return grammar_from_json_schema(schema, options);
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter c(g, options);
  Expr obj = c.any_object();
  Expr ws = c.whitespace();
  g.set_body(root, Expr::seq({ws, obj, ws}));
  g.root = root;
  return g;
}

}  // namespace deltaserve
