#include "server/tool_call_grammar.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "grammar/regex.h"
#include "server/tool_call_parser.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

// The tags that end a qwen3_coder parameter value (tool_call_parser.cpp, step_in_param).
constexpr const char* kCoderTags[] = {"</parameter>", "<parameter=", "</function>", "</tool_call>"};

// A function or parameter name is written inside "<function=NAME>" / "<parameter=NAME>" and read
// back up to the first '>': one holding '<', '>' or a blank cannot be read back as itself.
Status check_coder_name(const std::string& name, const std::string& what) {
  for (unsigned char c : name)
    if (c == '<' || c == '>' || c <= ' ' || c == 0x7f)
      return error(what, " '", name, "' holds '<', '>', a blank or a control character, which the qwen3_coder format cannot carry");
  return Status::ok();
}

// A union whose first type is not text but which admits a string (type ["integer", "string"],
// anyOf [{integer}, {string}]): the schema without the string, and the string's own schema. The
// parser reads such a value by its first type and keeps any other text raw, so the string is
// written raw, as a text parameter's is; as a JSON string its quotes would stay in the value.
std::optional<std::pair<json, json>> split_string_alternative(const json& schema) {
  if (schema.contains("type") && schema["type"].is_array()) {
    json rest = json::array();
    bool has_string = false;
    for (const auto& t : schema["type"]) {
      if (t == "string") has_string = true;
      else rest.push_back(t);
    }
    if (!has_string) return std::nullopt;
    json other = schema, text = schema;
    other["type"] = rest;
    text["type"] = "string";
    return std::pair{other, text};
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key) || !schema[key].is_array()) continue;
    json rest = json::array(), text;
    for (const auto& m : schema[key]) {
      if (text.is_null() && m.is_object() && m.value("type", json()) == "string") text = m;
      else rest.push_back(m);
    }
    if (text.is_null()) return std::nullopt;
    json other = schema;
    other[key] = rest;
    return std::pair{other, text};
  }
  return std::nullopt;
}

Result<Expr> coder_value(const json& schema, const json& document, const std::string& path, JsonSchemaConverter& conv) {
  if (!tool_param_is_text(tool_param_type(schema))) {
    if (auto split = split_string_alternative(schema)) {
      DS_ASSIGN_OR_RETURN(Expr other, conv.value(split->first, document, path));
      DS_ASSIGN_OR_RETURN(Expr text, coder_value(split->second, document, path, conv));
      return Expr::alt({std::move(other), std::move(text)});
    }
    return conv.value(schema, document, path);
  }
  // Raw text, as the parser keeps it.
  if (schema.contains("enum") && schema["enum"].is_array()) {
    std::vector<Expr> alts;
    for (const auto& v : schema["enum"]) {
      std::string text = v.is_string() ? v.get<std::string>() : v.dump();
      for (const char* tag : kCoderTags)
        if (text.find(tag) != std::string::npos)
          return error("tool parameter ", path, ": enum value ", v.dump(), " contains '", tag,
                       "', which would end the parameter in the qwen3_coder format");
      alts.push_back(Expr::literal(text));
    }
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
  DS_ASSIGN_OR_RETURN(StringLengthBounds bounds, string_length_bounds(schema, path));
  if (bounds.min || bounds.max) {
    return Expr::repeat(Expr::codepoints({{'<', '<'}}, /*negate=*/true), static_cast<int>(bounds.min.value_or(0)),
                        bounds.max ? static_cast<int>(*bounds.max) : -1);
  }
  // The parser ends a value at the first of these tags: none may occur inside one.
  return Expr::exclude(std::vector<std::string>(std::begin(kCoderTags), std::end(kCoderTags)));
}

Result<Expr> coder_call(const json& fn, JsonSchemaConverter& conv) {
  const std::string name = fn["name"].get<std::string>();
  DS_RETURN_IF_ERROR(check_coder_name(name, "tool name"));
  std::vector<Expr> seq = {Expr::literal("<tool_call>\n<function=" + name + ">\n")};
  const json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json::object();
  if (params.contains("properties") && params["properties"].is_object()) {
    std::vector<std::string> required;
    if (params.contains("required") && params["required"].is_array())
      for (const auto& r : params["required"])
        if (r.is_string()) required.push_back(r.get<std::string>());
    const json& props = params["properties"];
    for (auto it = props.begin(); it != props.end(); ++it) {
      DS_RETURN_IF_ERROR(check_coder_name(it.key(), "tool '" + name + "' parameter"));
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

// A qwen3_coder call to `name` with any parameters (a tool that is not strict, in AfterText mode).
Result<Expr> coder_call_any(const json& fn) {
  const std::string name = fn["name"].get<std::string>();
  DS_RETURN_IF_ERROR(check_coder_name(name, "tool name"));
  Expr param_name = Expr::plus(Expr::codepoints({{0, ' '}, {'<', '<'}, {'>', '>'}, {0x7f, 0x7f}}, /*negate=*/true));
  Expr value = Expr::exclude(std::vector<std::string>(std::begin(kCoderTags), std::end(kCoderTags)));
  Expr param = Expr::seq({Expr::literal("<parameter="), std::move(param_name), Expr::literal(">\n"), std::move(value),
                          Expr::literal("\n</parameter>\n")});
  return Expr::seq({Expr::literal("<tool_call>\n<function=" + name + ">\n"), Expr::star(std::move(param)),
                    Expr::literal("</function>\n</tool_call>")});
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

bool any_strict_tool(const json& tools) {
  if (!tools.is_array()) return false;
  return std::any_of(tools.begin(), tools.end(), [](const json& t) {
    const json& fn = t.contains("function") ? t["function"] : t;
    return fn.is_object() && fn.value("strict", json()) == true;
  });
}

Result<Grammar> tool_call_grammar(ToolParserKind format, const json& tools, bool parallel, const JsonSchemaOptions& options,
                                  ToolCallMode mode, const json& answer_schema) {
  if (format == ToolParserKind::None)
    return error("forcing a tool call needs a tool-call parser (start the server with --tool-call-parser)");
  if (!tools.is_array() || tools.empty()) return error("forcing a tool call needs at least one tool");
  const bool after_text = mode == ToolCallMode::AfterText;
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter conv(g, options);
  std::vector<Expr> calls;
  for (const auto& t : tools) {
    const json& fn = t.contains("function") ? t["function"] : t;
    const bool loose = after_text && fn.value("strict", json()) != true;
    Result<Expr> c = format == ToolParserKind::Qwen3Coder
                         ? (loose ? coder_call_any(fn) : coder_call(fn, conv))
                         : hermes_call(loose ? json{{"name", fn["name"]}} : fn, conv);
    if (!c) return c.status();
    calls.push_back(std::move(*c));
  }
  Expr call = Expr::alt(std::move(calls));
  std::bitset<256> blank;
  blank.set(' ');
  blank.set('\n');
  Expr lead = Expr::repeat(Expr::byte_set(blank), 0, 4);
  Expr body = parallel ? Expr::seq({call, Expr::star(Expr::seq({Expr::repeat(Expr::byte_set(blank), 1, 2), call}))}) : call;
  Expr tail = Expr::repeat(Expr::byte_set(blank), 0, 2);
  if (after_text && !answer_schema.is_null()) {
    auto answer = conv.value(answer_schema, answer_schema, "#");
    if (!answer) return error("response_format: ", answer.status().message());
    g.set_body(root, Expr::alt({std::move(*answer), Expr::seq({lead, std::move(body), std::move(tail)})}));
  } else if (after_text) {
    g.set_body(root, Expr::seq({Expr::exclude({"<tool_call>"}), Expr::opt(Expr::seq({std::move(body), std::move(tail)}))}));
  } else {
    g.set_body(root, Expr::seq({lead, std::move(body), std::move(tail)}));
  }
  g.root = root;
  return g;
}

}  // namespace deltaserve
