#include "grammar/structural_tag.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

Result<Grammar> grammar_from_structural_tag(const json& spec, const JsonSchemaOptions& options) {
  if (!spec.is_object()) return error("structural_tag: must be an object");
  if (spec.contains("format"))
    return error("structural_tag: the 'format' form is not supported; use 'structures' and 'triggers'");
  // Keys other than these are refused by name (a misspelt "schemas" meant any JSON value).
  for (const auto& [key, unused] : spec.items())
    if (key != "type" && key != "structures" && key != "triggers")
      return error("structural_tag: unknown key '", key, "' (expected 'structures' and 'triggers')");
  if (!spec.contains("structures") || !spec["structures"].is_array() || spec["structures"].empty())
    return error("structural_tag: 'structures' must be a non-empty list");
  if (!spec.contains("triggers") || !spec["triggers"].is_array() || spec["triggers"].empty())
    return error("structural_tag: 'triggers' must be a non-empty list of strings");
  // The free text excludes every trigger through an automaton of ~2 KB a trigger byte, built
  // before the grammar's own limits apply: 40,000 triggers of 20 bytes took 2.2 GB. Real ones are
  // a few tags.
  constexpr size_t kMaxTriggerBytes = 16 * 1024;
  std::vector<std::string> triggers;
  size_t trigger_bytes = 0;
  for (const auto& t : spec["triggers"]) {
    if (!t.is_string() || t.get<std::string>().empty())
      return error("structural_tag: 'triggers' must be a non-empty list of non-empty strings");
    triggers.push_back(t.get<std::string>());
    if ((trigger_bytes += triggers.back().size()) > kMaxTriggerBytes)
      return error("structural_tag: 'triggers' hold more than ", kMaxTriggerBytes, " bytes in all");
  }
  Grammar g;
  const int root = g.add_rule("root");
  JsonSchemaConverter conv(g, options);
  std::vector<Expr> structures;
  const json& list = spec["structures"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "structures[" + std::to_string(i) + "]";
    const json& s = list[i];
    if (!s.is_object() || !s.contains("begin") || !s["begin"].is_string() || !s.contains("end") || !s["end"].is_string())
      return error("structural_tag: ", where, " needs string 'begin' and 'end'");
    for (const auto& [key, unused] : s.items())
      if (key != "begin" && key != "schema" && key != "parameters" && key != "end")
        return error("structural_tag: unknown key '", key, "' in ", where, " (expected 'begin', 'schema', 'end')");
    const std::string begin = s["begin"].get<std::string>();
    bool triggered = false;
    for (const auto& t : triggers) triggered = triggered || begin.compare(0, t.size(), t) == 0;
    if (!triggered) return error("structural_tag: ", where, ".begin '", begin, "' does not start with any trigger");
    const json schema = s.contains("schema") ? s["schema"] : s.contains("parameters") ? s["parameters"] : json(true);
    auto v = conv.value(schema, schema, "#");
    if (!v) return error("structural_tag: ", where, ".schema: ", v.status().message());
    structures.push_back(Expr::seq({Expr::literal(begin), std::move(*v), Expr::literal(s["end"].get<std::string>())}));
  }
  Expr text = Expr::exclude(triggers);
  g.set_body(root, Expr::seq({Expr::star(Expr::seq({text, Expr::alt(std::move(structures))})), text}));
  g.root = root;
  return g;
}

}  // namespace deltaserve
