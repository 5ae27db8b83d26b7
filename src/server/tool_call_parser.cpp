#include "server/tool_call_parser.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>

#include "server/json_util.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

void ToolParseDelta::append(ToolParseDelta&& other) {
  content += other.content;
  for (auto& c : other.calls) calls.push_back(std::move(c));
}

Result<ToolParserKind> tool_parser_kind_from_name(const std::string& name) {
  if (name.empty() || name == "none") return ToolParserKind::None;
  if (name == "qwen3_coder" || name == "qwen3-coder") return ToolParserKind::Qwen3Coder;
  if (name == "hermes" || name == "qwen25" || name == "qwen") return ToolParserKind::Hermes;
  return error("unknown --tool-call-parser '", name, "' (supported: qwen3_coder, hermes)");
}

std::string make_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (4 * i)) & 0xF];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (4 * i)) & 0xF];
  return id;
}

std::vector<ToolCall> merge_tool_call_deltas(const std::vector<ToolCallDelta>& deltas) {
  std::map<int, ToolCall> by_index;
  for (const auto& d : deltas) {
    ToolCall& call = by_index[d.index];
    if (!d.id.empty()) call.id = d.id;
    if (!d.name.empty()) call.name = d.name;
    call.arguments += d.arguments;
  }
  std::vector<ToolCall> out;
  for (auto& [index, call] : by_index) out.push_back(std::move(call));
  return out;
}

// --- schema-typed values ---

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

const json* find_param_schema(const json& tools, const std::string& function_name,
                              const std::string& param_name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const json* fn = tool.contains("function") ? &tool["function"] : &tool;
    if (!fn->is_object() || fn->value("name", "") != function_name) continue;
    if (!fn->contains("parameters") || !(*fn)["parameters"].is_object()) return nullptr;
    const json& params = (*fn)["parameters"];
    const json& props =
        params.contains("properties") && params["properties"].is_object() ? params["properties"]
                                                                          : params;
    auto it = props.find(param_name);
    if (it == props.end() || !it->is_object()) return nullptr;
    return &*it;
  }
  return nullptr;
}

}  // namespace

std::string tool_param_type(const json& schema) {
  if (schema.contains("type") && schema["type"].is_string()) {
    return lower(schema["type"].get<std::string>());
  }
  if (schema.contains("type") && schema["type"].is_array()) {  // ["boolean", "null"]: its first non-null type
    for (const auto& t : schema["type"])
      if (t.is_string() && t != "null") return lower(t.get<std::string>());
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (schema.contains(key) && schema[key].is_array()) {
      for (const auto& member : schema[key]) {
        if (member.is_object() && member.contains("type") && member["type"].is_string() &&
            member["type"] != "null") {
          return lower(member["type"].get<std::string>());
        }
      }
    }
  }
  if (schema.contains("enum")) return "enum";
  for (const char* key : {"$ref", "anyOf", "oneOf", "allOf", "type"}) {
    if (schema.contains(key)) return "";
  }
  return "string";
}

bool tool_param_is_text(const std::string& type) {
  for (const char* t : {"string", "str", "text", "varchar", "char", "enum"}) {
    if (type == t) return true;
  }
  return false;
}

json convert_tool_param(const json& tools, const std::string& function_name,
                        const std::string& param_name, const std::string& raw) {
  if (lower(raw) == "null") return nullptr;
  const json* schema = find_param_schema(tools, function_name, param_name);
  if (!schema) return raw;
  const std::string type = tool_param_type(*schema);
  if (tool_param_is_text(type)) return raw;
  if (starts_with(type, "int") || starts_with(type, "uint") || starts_with(type, "long") ||
      starts_with(type, "short") || starts_with(type, "unsigned")) {
    std::string t = trim(raw);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(t.c_str(), &end, 10);
    if (!t.empty() && *end == '\0' && errno == 0) return v;
    return raw;
  }
  if (starts_with(type, "num") || starts_with(type, "float")) {
    std::string t = trim(raw);
    // Decimal forms only, as Python's float() reads them (strtod alone also takes "0x10").
    if (t.find_first_of("xXpP") != std::string::npos) return raw;
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || !std::isfinite(d)) return raw;
    bool looks_int = t.find_first_of(".eE") == std::string::npos;
    if (looks_int && std::fabs(d) < 9.0e18) return static_cast<long long>(d);
    return d;
  }
  if (type == "boolean" || type == "bool" || type == "binary") {
    return lower(trim(raw)) == "true";
  }
  if (type == "object" || type == "array" || type == "arr" || starts_with(type, "dict") ||
      starts_with(type, "list")) {
    json v = json::parse(raw, nullptr, false);
    if (!v.is_discarded()) return v;
    if (auto p = parse_python_literal(raw)) return *p;
    return raw;
  }
  // Types the parser does not name ($ref, allOf): the value as JSON (what a forced call's grammar
  // writes for them), else as a Python literal, else the text.
  json v = json::parse(raw, nullptr, false);
  if (!v.is_discarded()) return v;
  if (auto p = parse_python_literal(raw)) return *p;
  return raw;
}

// --- qwen3_coder ---

namespace {

constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

bool is_proper_prefix(std::string_view text, std::string_view tag) {
  return text.size() < tag.size() && tag.substr(0, text.size()) == text;
}

// Shared by both parsers: the text outside tool calls. Returns true when `<tool_call>` was
// consumed; false when more input is needed or the buffer is empty. A `<function=...>` without the
// wrapper is text (qwen-chat-protocol.md §4.2, §4.6: prose and reasoning that quote the markup
// must not become calls).
bool scan_text(std::string& buf, bool at_end, ToolParseDelta& out) {
  for (;;) {
    std::size_t lt = buf.find('<');
    if (lt == std::string::npos) {
      out.content += buf;
      buf.clear();
      return false;
    }
    out.content.append(buf, 0, lt);
    buf.erase(0, lt);
    if (starts_with(buf, kToolCallOpen)) {
      buf.erase(0, kToolCallOpen.size());
      return true;
    }
    if (!at_end && is_proper_prefix(buf, kToolCallOpen)) return false;
    out.content += '<';
    buf.erase(0, 1);
  }
}

class Qwen3CoderParser final : public ToolCallParser {
 public:
  explicit Qwen3CoderParser(json tools) : tools_(std::move(tools)) {}

  ToolParseDelta push(std::string_view text) override {
    buf_ += text;
    return run(false);
  }
  ToolParseDelta finish() override { return run(true); }

 private:
  enum class State { Text, InTool, InFunction, InParam };

  ToolParseDelta run(bool at_end) {
    ToolParseDelta out;
    for (;;) {
      bool progressed = false;
      switch (state_) {
        case State::Text:
          if (scan_text(buf_, at_end, out)) {
            state_ = State::InTool;
            progressed = true;
          }
          break;
        case State::InTool:
          progressed = step_in_tool(at_end, out);
          break;
        case State::InFunction:
          progressed = step_in_function(at_end, out);
          break;
        case State::InParam:
          progressed = step_in_param(at_end, out);
          break;
      }
      if (!progressed) break;
    }
    if (at_end) {
      if (state_ == State::InFunction) close_call(out);
      state_ = State::Text;
      buf_.clear();
    }
    return out;
  }

  // Discards text up to the next '<'. Returns false if the buffer ran out.
  bool skip_to_tag() {
    std::size_t lt = buf_.find('<');
    if (lt == std::string::npos) {
      buf_.clear();
      return false;
    }
    buf_.erase(0, lt);
    return true;
  }

  // Reads `<prefix NAME>` at the buffer start. nullopt-like: returns false if '>' has not arrived.
  bool read_named_tag(std::string_view prefix, std::string& name) {
    std::size_t gt = buf_.find('>', prefix.size());
    if (gt == std::string::npos) return false;
    name = trim(std::string_view(buf_).substr(prefix.size(), gt - prefix.size()));
    buf_.erase(0, gt + 1);
    return true;
  }

  bool step_in_tool(bool at_end, ToolParseDelta& out) {
    if (!skip_to_tag()) return false;
    if (starts_with(buf_, kFunctionOpen)) {
      std::string name;
      if (!read_named_tag(kFunctionOpen, name)) return false;  // wait (or dropped at end)
      function_name_ = name;
      index_ += 1;
      n_calls_ += 1;
      n_params_ = 0;
      out.calls.push_back(ToolCallDelta{index_, make_tool_call_id(), name, ""});
      state_ = State::InFunction;
      return true;
    }
    if (starts_with(buf_, kToolCallClose)) {
      buf_.erase(0, kToolCallClose.size());
      state_ = State::Text;
      return true;
    }
    if (!at_end && (is_proper_prefix(buf_, kFunctionOpen) ||
                    is_proper_prefix(buf_, kToolCallClose))) {
      return false;
    }
    buf_.erase(0, 1);
    return true;
  }

  bool step_in_function(bool at_end, ToolParseDelta& out) {
    if (!skip_to_tag()) return false;
    if (starts_with(buf_, kParamOpen)) {
      if (!read_named_tag(kParamOpen, param_name_)) return false;
      state_ = State::InParam;
      return true;
    }
    if (starts_with(buf_, kFunctionClose)) {
      buf_.erase(0, kFunctionClose.size());
      close_call(out);
      state_ = State::InTool;
      return true;
    }
    if (starts_with(buf_, kToolCallClose)) {
      buf_.erase(0, kToolCallClose.size());
      close_call(out);
      state_ = State::Text;
      return true;
    }
    if (!at_end && (is_proper_prefix(buf_, kParamOpen) || is_proper_prefix(buf_, kFunctionClose) ||
                    is_proper_prefix(buf_, kToolCallClose))) {
      return false;
    }
    buf_.erase(0, 1);
    return true;
  }

  bool step_in_param(bool at_end, ToolParseDelta& out) {
    std::size_t best = std::string::npos;
    std::string_view best_tag;
    for (std::string_view tag : {kParamClose, kParamOpen, kFunctionClose, kToolCallClose}) {
      std::size_t pos = buf_.find(tag);
      if (pos < best) {
        best = pos;
        best_tag = tag;
      }
    }
    if (best == std::string::npos) {
      if (!at_end) return false;
      emit_param(buf_, out);
      buf_.clear();
      state_ = State::InFunction;
      return false;
    }
    emit_param(buf_.substr(0, best), out);
    buf_.erase(0, best + (best_tag == kParamClose ? kParamClose.size() : 0));
    state_ = State::InFunction;
    return true;
  }

  void emit_param(std::string value, ToolParseDelta& out) {
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    json v = convert_tool_param(tools_, function_name_, param_name_, value);
    std::string fragment = python_json_dumps(json(param_name_)) + ": " + python_json_dumps(v);
    if (n_params_ == 0) {
      out.calls.push_back(ToolCallDelta{index_, "", "", "{"});
    } else {
      fragment = ", " + fragment;
    }
    out.calls.push_back(ToolCallDelta{index_, "", "", std::move(fragment)});
    n_params_ += 1;
  }

  void close_call(ToolParseDelta& out) {
    out.calls.push_back(ToolCallDelta{index_, "", "", n_params_ == 0 ? "{}" : "}"});
  }

  json tools_;
  std::string buf_;
  State state_ = State::Text;
  std::string function_name_, param_name_;
  int index_ = -1;
  int n_params_ = 0;
};

// --- hermes ---

class HermesParser final : public ToolCallParser {
 public:
  ToolParseDelta push(std::string_view text) override {
    buf_ += text;
    return run(false);
  }
  ToolParseDelta finish() override { return run(true); }

 private:
  ToolParseDelta run(bool at_end) {
    ToolParseDelta out;
    for (;;) {
      if (!in_tool_) {
        if (!scan_text(buf_, at_end, out)) break;
        in_tool_ = true;
      }
      std::size_t close = buf_.find(kToolCallClose);
      if (close == std::string::npos) {
        if (!at_end) break;
        emit_call(buf_, std::string(kToolCallOpen) + buf_, out);  // cut off: try what we have
        buf_.clear();
        in_tool_ = false;
        break;
      }
      // A JSON string of the arguments may hold "</tool_call>" itself: the call ends at the first
      // close before which the body is a call; until one comes, wait (at the end: the first close,
      // whose text is then kept as content).
      std::size_t end = close;
      while (end != std::string::npos && !is_call(buf_.substr(0, end))) end = buf_.find(kToolCallClose, end + 1);
      if (end == std::string::npos && !at_end) break;
      if (end != std::string::npos) close = end;
      std::string body = buf_.substr(0, close);
      emit_call(body, std::string(kToolCallOpen) + body + std::string(kToolCallClose), out);
      buf_.erase(0, close + kToolCallClose.size());
      in_tool_ = false;
    }
    if (at_end) buf_.clear();
    return out;
  }

  static bool is_call(const std::string& body) {
    json call = json::parse(trim(body), nullptr, false);
    return !call.is_discarded() && call.is_object() && call.contains("name") && call["name"].is_string();
  }

  void emit_call(const std::string& body, const std::string& raw, ToolParseDelta& out) {
    json call = json::parse(trim(body), nullptr, false);
    if (call.is_discarded() || !call.is_object() || !call.contains("name") ||
        !call["name"].is_string()) {
      out.content += raw;  // not a call after all: keep the text
      return;
    }
    json args = call.contains("arguments") ? call["arguments"]
                : call.contains("parameters") ? call["parameters"]
                                              : json::object();
    std::string arguments = args.is_string() ? args.get<std::string>() : python_json_dumps(args);
    index_ += 1;
    n_calls_ += 1;
    out.calls.push_back(ToolCallDelta{index_, make_tool_call_id(), call["name"], ""});
    out.calls.push_back(ToolCallDelta{index_, "", "", std::move(arguments)});
  }

  std::string buf_;
  bool in_tool_ = false;
  int index_ = -1;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolParserKind kind, const json& tools) {
  switch (kind) {
    case ToolParserKind::Qwen3Coder: return std::make_unique<Qwen3CoderParser>(tools);
    case ToolParserKind::Hermes: return std::make_unique<HermesParser>();
    case ToolParserKind::None: return nullptr;
  }
  return nullptr;
}

}  // namespace deltaserve
