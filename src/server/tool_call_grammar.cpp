#include "server/tool_call_grammar.h"

#include <algorithm>

#include "grammar/regex.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The type convert_tool_param (tool_call_parser.cpp) reads a parameter's value as.
std::string parser_type(const json& schema) {
  if (schema.contains("type") && schema["type"].is_string()) return lower(schema["type"].get<std::string>());
  for (const char* key : {"anyOf", "oneOf"}) {
    if (schema.contains(key) && schema[key].is_array())
      for (const auto& m : schema[key])
        if (m.is_object() && m.contains("type") && m["type"].is_string() && m["type"] != "null")
          return lower(m["type"].get<std::string>());
  }
  if (schema.contains("enum")) return "enum";
  return "";
}

bool string_like(const std::string& t) {
  return t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" || t == "enum";
}

Result<Expr> coder_value(const json& schema, const json& document, const std::string& path, JsonSchemaConverter& conv) {
  const std::string type = parser_type(schema);
  if (!string_like(type)) return conv.value(schema, document, path);
  // Raw text, as the parser keeps it.
  if (schema.contains("enum") && schema["enum"].is_array()) {
    std::vector<Expr> alts;
    for (const auto& v : schema["enum"]) alts.push_back(Expr::literal(v.is_string() ? v.get<std::string>() : v.dump()));
    return Expr::alt(std::move(alts));
  }
  if (schema.contains("pattern") && schema["pattern"].is_string()) {
    auto e = regex_to_expr(schema["pattern"].get<std::string>());
    if (!e) return error("tool parameter ", path, " 'pattern': ", e.status().message());
    return e;
  }
  if (schema.contains("format") && schema["format"].is_string()) {
    const char* re = json_string_format_regex(schema["format"].get<std::string>());
    if (!re)
      return error("tool parameter ", path, ": unsupported string format '", schema["format"].get<std::string>(), "'");
    return regex_to_expr(re);
  }
  const bool bounded = schema.contains("minLength") || schema.contains("maxLength");
  if (bounded) {
    const int lo = schema.value("minLength", 0);
    const int hi = schema.contains("maxLength") && schema["maxLength"].is_number_integer() ? schema["maxLength"].get<int>() : -1;
    if (lo < 0 || lo > 10000 || hi > 10000 || (hi >= 0 && hi < lo))
      return error("tool parameter ", path, ": bad or too large minLength/maxLength");
    return Expr::repeat(Expr::codepoints({{'<', '<'}}, /*negate=*/true), lo, hi);
  }
  return Expr::exclude({"</parameter>"});
}

Result<Expr> coder_call(const json& fn, JsonSchemaConverter& conv) {
  const std::string name = fn["name"].get<std::string>();
  std::vector<Expr> seq = {Expr::literal("<tool_call>\n<function=" + name + ">\n")};
  const json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json::object();
  if (params.contains("properties") && params["properties"].is_object()) {
    std::vector<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const auto& r : params["required"])
        if (r.is_string()) required.push_back(r.get<std::string>());
    const json& props = params["properties"];
    for (auto it = props.begin(); it != props.end(); ++it) {
      auto v = coder_value(it.value(), params, "'" + name + "." + it.key() + "'", conv);
      if (!v) return v;
      Expr p = Expr::seq({Expr::literal("<parameter=" + it.key() + ">\n"), std::move(*v), Expr::literal("\n</parameter>\n")});
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      seq.push_back(req ? std::move(p) : Expr::opt(std::move(p)));
    }
  }
  seq.push_back(Expr::literal("</function>\n</tool_call>"));
  return Expr::seq(std::move(seq));
}

Result<Expr> hermes_call(const json& fn, JsonSchemaConverter& conv) {
  const std::string name = fn["name"].get<std::string>();
  Expr ws = conv.whitespace();
  Expr args = conv.any_object();
  if (fn.contains("parameters") && fn["parameters"].is_object()) {
    // Arguments are a JSON object (what the parser and every client read). A schema that says
    // nothing of its type ({}, or properties without "type") would admit any value: make it an
    // object's. Combinators and references keep their own types.
    json params = fn["parameters"];
    bool typed = false;
    for (const char* k : {"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"}) typed = typed || params.contains(k);
    if (!typed) params["type"] = "object";
    auto a = conv.value(params, params, "#");
    if (!a) return error("tool '", name, "' parameters: ", a.status().message());
    args = std::move(*a);
  }
  return Expr::seq({Expr::literal("<tool_call>\n{"), ws, Expr::literal("\"name\""), ws, Expr::literal(":"), ws,
                    Expr::literal(json(name).dump()), ws, Expr::literal(","), ws, Expr::literal("\"arguments\""), ws,
                    Expr::literal(":"), ws, std::move(args), ws, Expr::literal("}\n</tool_call>")});
}

}  // namespace

Result<Grammar> tool_call_grammar(ToolParserKind format, const json& tools, bool parallel, const JsonSchemaOptions& options) {
  if (format == ToolParserKind::None)
    return error("forcing a tool call needs a tool-call parser (start the server with --tool-call-parser)");
  if (!tools.is_array() || tools.empty()) return error("forcing a tool call needs at least one tool");
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter conv(g, options);
  std::vector<Expr> calls;
  for (const auto& t : tools) {
    const json& fn = t.contains("function") ? t["function"] : t;
    auto c = format == ToolParserKind::Qwen3Coder ? coder_call(fn, conv) : hermes_call(fn, conv);
    if (!c) return c.status();
    calls.push_back(std::move(*c));
  }
  Expr call = Expr::alt(std::move(calls));
  std::bitset<256> blank;
  blank.set(' ');
  blank.set('\n');
  Expr lead = Expr::repeat(Expr::byte_set(blank), 0, 4);
  Expr body = parallel ? Expr::seq({call, Expr::star(Expr::seq({Expr::repeat(Expr::byte_set(blank), 1, 2), call}))}) : call;
  g.set_body(root, Expr::seq({lead, std::move(body), Expr::repeat(Expr::byte_set(blank), 0, 2)}));
  g.root = root;
  return g;
}

}  // namespace deltaserve
