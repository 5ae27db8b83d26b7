#include "server/openai_request.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "server/json_fields.h"
#include "server/json_util.h"
#include "server/request_fields.h"
#include "util/json_parse.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

// Fields shared by chat and completions: sampling, n, stream, stop, max_tokens.
std::optional<ApiError> parse_common(const json& body, const SamplingDefaults& defaults,
                                     OpenAiRequest& out) {
  JsonFields f{body, std::nullopt};
  if (auto m = f.string("model")) out.model = *m;
  SamplingParams& s = out.sampling;
  s.temperature = defaults.temperature.value_or(1.0f);
  s.top_p = defaults.top_p.value_or(1.0f);
  s.top_k = defaults.top_k.value_or(-1);
  s.min_p = defaults.min_p.value_or(0.0f);
  s.repetition_penalty = defaults.repetition_penalty.value_or(1.0f);

  if (auto v = f.number("temperature", 0.0, kMaxLogitScale)) s.temperature = static_cast<float>(*v);
  if (s.temperature < kGreedyTemperature) s.temperature = 0.0f;  // vLLM: below 1e-5 is greedy
  if (auto v = f.number("top_p", 0.0, 1.0)) {
    if (*v <= 0.0) return ApiError::bad_request("'top_p' must be in (0, 1], got 0", "top_p");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, INT32_MAX)) s.top_k = static_cast<int>(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) s.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0.0, kMaxLogitScale)) {
    if (*v <= 0.0)
      return ApiError::bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("sampling_seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("n", 1, kMaxChoices)) out.n = static_cast<int>(*v);
  if (auto v = f.integer("max_tokens", 1, INT32_MAX)) out.max_tokens = static_cast<int>(*v);
  if (auto v = f.integer("max_completion_tokens", 1, INT32_MAX)) {
    out.max_tokens = static_cast<int>(*v);
    out.max_tokens_param = "max_completion_tokens";
  }
  if (auto v = f.boolean("stream")) out.stream = *v;
  if (auto v = f.boolean("ignore_eos")) s.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) out.skip_special_tokens = *v;
  if (f.err) return f.err;

  if (f.has("stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object())
      return ApiError::bad_request("'stream_options' must be an object", "stream_options");
    if (!out.stream)
      return ApiError::bad_request("'stream_options' is only allowed when 'stream' is true",
                                   "stream_options");
    if (auto e = check_nested_fields(so, "stream_options", "stream_options")) return e;
    JsonFields g{so, std::nullopt};
    if (auto v = g.boolean("include_usage")) out.include_usage = *v;
    if (auto v = g.boolean("continuous_usage_stats")) out.continuous_usage_stats = *v;
    if (g.err) {
      g.err->param = "stream_options." + g.err->param;
      return g.err;
    }
    // Usage on every chunk only with the final usage chunk asked for too (vLLM's rule).
    out.continuous_usage_stats = out.continuous_usage_stats && out.include_usage;
  }

  if (f.has("stop")) {
    const json& st = body["stop"];
    if (st.is_string()) {
      if (!st.get<std::string>().empty()) out.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      if (st.size() > 16) return ApiError::bad_request("'stop' has more than 16 strings", "stop");
      for (const auto& x : st) {
        if (!x.is_string())
          return ApiError::bad_request("'stop' must be a string or a list of strings", "stop");
        if (!x.get<std::string>().empty()) out.stop.push_back(x.get<std::string>());
      }
    } else {
      return ApiError::bad_request("'stop' must be a string or a list of strings", "stop");
    }
  }
  if (f.has("stop_token_ids")) {
    const json& st = body["stop_token_ids"];
    if (!st.is_array())
      return ApiError::bad_request("'stop_token_ids' must be a list of integers", "stop_token_ids");
    for (const auto& x : st) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        return ApiError::bad_request("'stop_token_ids' must be a list of token ids",
                                     "stop_token_ids");
      s.stop_token_ids.push_back(x.get<TokenId>());
    }
  }
  return std::nullopt;
}

std::optional<ApiError> flatten_text_parts(const json& content, const std::string& param,
                                           std::string& out) {
  for (std::size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    std::string p = param + "[" + std::to_string(k) + "]";
    if (part.is_string()) {
      out += part.get<std::string>();
      continue;
    }
    if (!part.is_object())
      return ApiError::bad_request("content parts must be objects", p);
    if (part.contains("type") && !part["type"].is_string())
      return ApiError::bad_request("a content part's 'type' must be a string", p + ".type");
    std::string type = part.value("type", "text");
    if (type == "text" || type == "input_text") {
      if (!part.contains("text") || !part["text"].is_string())
        return ApiError::bad_request("a text content part needs a string 'text'", p + ".text");
      out += part["text"].get<std::string>();
    } else {
      return ApiError::bad_request("content part type '" + type + "' is not supported by this model",
                                   p + ".type");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> normalize_message(const json& m, std::size_t i, json& out) {
  std::string param = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return ApiError::bad_request(param + " must be an object", param);
  if (!m.contains("role") || !m["role"].is_string())
    return ApiError::bad_request(param + ".role is required", param + ".role");
  std::string role = m["role"].get<std::string>();
  if (role == "developer") role = "system";
  if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
    return ApiError::bad_request("unknown role '" + role + "' in " + param +
                                     " (expected system, developer, user, assistant or tool)",
                                 param + ".role");
  }
  if (auto e = check_nested_fields(m, role == "assistant" ? "assistant message" : role == "tool" ? "tool message" : "message",
                                   param))
    return e;
  for (const char* key : {"name", "tool_call_id", "reasoning_content", "reasoning"}) {
    if (m.contains(key) && !m[key].is_null() && !m[key].is_string())
      return ApiError::bad_request(param + "." + key + " must be a string", param + "." + key);
  }
  out = json::object();
  out["role"] = role;
  // vLLM passes `name` on to the chat template.
  if (m.contains("name") && !m["name"].is_null()) out["name"] = m["name"];
  // content
  std::string text;
  if (!m.contains("content") || m["content"].is_null()) {
    if (role != "assistant")
      return ApiError::bad_request(param + ".content is required", param + ".content");
  } else if (m["content"].is_string()) {
    text = m["content"].get<std::string>();
  } else if (m["content"].is_array()) {
    if (auto e = flatten_text_parts(m["content"], param + ".content", text)) return e;
  } else {
    return ApiError::bad_request(param + ".content must be a string or a list of parts",
                                 param + ".content");
  }
  out["content"] = text;
  if (role == "assistant") {
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (m.contains(key) && m[key].is_string()) {
        out["reasoning_content"] = m[key];
        break;
      }
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& calls = m["tool_calls"];
      if (!calls.is_array())
        return ApiError::bad_request(param + ".tool_calls must be a list", param + ".tool_calls");
      json norm = json::array();
      for (std::size_t k = 0; k < calls.size(); ++k) {
        std::string cp = param + ".tool_calls[" + std::to_string(k) + "]";
        const json& c = calls[k];
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          return ApiError::bad_request(cp + " needs a 'function' object", cp + ".function");
        const json& fn = c["function"];
        if (!fn.contains("name") || !fn["name"].is_string())
          return ApiError::bad_request(cp + ".function.name is required", cp + ".function.name");
        json args = json::object();
        if (fn.contains("arguments")) {
          if (fn["arguments"].is_string()) {
            std::string why;
            if (!parse_ordered_json(fn["arguments"].get<std::string>(), args, &why))
              return ApiError::bad_request(cp + ".function.arguments must be valid JSON: " + why,
                                           cp + ".function.arguments");
          } else {
            args = fn["arguments"];
          }
          if (!args.is_object())
            return ApiError::bad_request(cp + ".function.arguments must be a JSON object",
                                         cp + ".function.arguments");
        }
        json nc = c;
        nc["function"] = {{"name", fn["name"]}, {"arguments", args}};
        norm.push_back(nc);
      }
      out["tool_calls"] = norm;
    }
  }
  if (role == "tool" && m.contains("tool_call_id") && !m["tool_call_id"].is_null()) out["tool_call_id"] = m["tool_call_id"];
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const json& body, OpenAiRequest& out) {
  out.tools = nullptr;
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    if (!body["parallel_tool_calls"].is_boolean())
      return ApiError::bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    out.parallel_tool_calls = body["parallel_tool_calls"].get<bool>();
  }
  if (!body.contains("tools") || body["tools"].is_null()) {
    if (body.contains("tool_choice") && !body["tool_choice"].is_null() && body["tool_choice"] != "none" &&
        body["tool_choice"] != "auto")
      return ApiError::bad_request("'tool_choice' requires 'tools'", "tool_choice");
    return std::nullopt;
  }
  const json& tools = body["tools"];
  if (!tools.is_array()) return ApiError::bad_request("'tools' must be a list", "tools");
  for (std::size_t i = 0; i < tools.size(); ++i) {
    std::string p = "tools[" + std::to_string(i) + "]";
    const json& t = tools[i];
    if (t.is_object() && t.contains("type") && !t["type"].is_string())
      return ApiError::bad_request(p + ".type must be a string", p + ".type");
    if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") ||
        !t["function"].is_object())
      return ApiError::bad_request(p + " must be {\"type\": \"function\", \"function\": {...}}", p);
    const json& fn = t["function"];
    if (auto e = check_nested_fields(t, "tools[]", p)) return e;
    if (auto e = check_nested_fields(fn, "tools[].function", p + ".function")) return e;
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      return ApiError::bad_request(p + ".function.name is required", p + ".function.name");
    if (fn.contains("description") && !fn["description"].is_null() && !fn["description"].is_string())
      return ApiError::bad_request(p + ".function.description must be a string", p + ".function.description");
    if (fn.contains("strict") && !fn["strict"].is_null() && !fn["strict"].is_boolean())
      return ApiError::bad_request(p + ".function.strict must be a boolean", p + ".function.strict");
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
      return ApiError::bad_request(p + ".function.parameters must be an object",
                                   p + ".function.parameters");
    // The arguments are a JSON object (OpenAI refuses any other schema type): a forced call's
    // grammar and the parsers both expect one. A schema that names no type is taken as an object's.
    if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("type") &&
        fn["parameters"]["type"] != "object") {
      std::string got = fn["parameters"]["type"].dump(-1, ' ', false, json::error_handler_t::replace);
      if (got.size() > 64) got = got.substr(0, 61) + "...";
      return ApiError::bad_request(p + ".function.parameters must be a JSON Schema of type \"object\", got type " + got,
                                   p + ".function.parameters.type");
    }
  }
  json selected = tools;
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      std::string c = tc.get<std::string>();
      if (c != "none" && c != "auto" && c != "required")
        return ApiError::bad_request("'tool_choice' must be none, auto, required or a function, got '" + c + "'",
                                     "tool_choice");
      out.tool_choice = c;
      if (c == "none") return std::nullopt;  // tools not rendered, no parsing
      if (c == "required" && tools.empty())
        return ApiError::bad_request("'tool_choice' 'required' needs at least one tool in 'tools' (got an empty list)",
                                     "tool_choice");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      if (auto e = check_nested_fields(tc, "tool_choice", "tool_choice")) return e;
      if (auto e = check_nested_fields(tc["function"], "tool_choice.function", "tool_choice.function")) return e;
      std::string name = tc["function"]["name"];
      selected = json::array();
      for (const auto& t : tools) {
        if (t["function"]["name"] == name) selected.push_back(t);
      }
      if (selected.empty())
        return ApiError::bad_request("tool_choice names unknown function '" + name + "'",
                                     "tool_choice");
      if (tc.contains("type") && tc["type"] != "function")
        return ApiError::bad_request("'tool_choice.type' must be 'function'", "tool_choice.type");
      out.tool_choice = "function";
    } else {
      return ApiError::bad_request("'tool_choice' must be none, auto, required or a function",
                                   "tool_choice");
    }
  }
  if (!selected.empty()) out.tools = selected;
  return std::nullopt;
}

// `prompt`: a string, a list of token ids, a list of strings, or a list of token-id lists.
std::optional<ApiError> parse_prompts(const json& p, OpenAiRequest& out) {
  auto ids_of = [](const json& list, const std::string& where,
                   std::vector<TokenId>& ids) -> std::optional<ApiError> {
    for (const auto& x : list) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        return ApiError::bad_request(where + " token ids must be non-negative integers", "prompt");
      ids.push_back(x.get<TokenId>());
    }
    return std::nullopt;
  };
  const char* kShape =
      "'prompt' must be a string, a list of token ids, a list of strings or a list of token-id "
      "lists";
  if (p.is_string()) {
    out.prompts.push_back(CompletionPrompt{p.get<std::string>(), {}, false});
    return std::nullopt;
  }
  if (!p.is_array()) return ApiError::bad_request(kShape, "prompt");
  if (p.empty()) return ApiError::bad_request("'prompt' must not be an empty list", "prompt");
  if (p[0].is_number()) {  // one prompt of token ids
    CompletionPrompt one;
    one.is_ids = true;
    if (auto e = ids_of(p, "'prompt'", one.ids)) return e;
    out.prompts.push_back(std::move(one));
    return std::nullopt;
  }
  // A list of prompts: all strings or all token-id lists.
  const bool strings = p[0].is_string();
  if (!strings && !p[0].is_array()) return ApiError::bad_request(kShape, "prompt");
  out.batched_prompt = p.size() > 1;
  if (p.size() > static_cast<std::size_t>(kMaxSequencesPerRequest)) {
    return ApiError::bad_request("'prompt' has " + std::to_string(p.size()) +
                                     " prompts; at most " +
                                     std::to_string(kMaxSequencesPerRequest) +
                                     " sequences (prompts x n) per request",
                                 "prompt");
  }
  out.prompts.reserve(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const std::string where = "prompt[" + std::to_string(i) + "]";
    CompletionPrompt one;
    if (strings) {
      if (!p[i].is_string())
        return ApiError::bad_request(where + " must be a string like prompt[0] (a list of prompts "
                                             "is all strings or all token-id lists)",
                                     "prompt");
      one.text = p[i].get<std::string>();
    } else {
      if (!p[i].is_array())
        return ApiError::bad_request(where + " must be a list of token ids like prompt[0] (a list "
                                             "of prompts is all strings or all token-id lists)",
                                     "prompt");
      one.is_ids = true;
      if (auto e = ids_of(p[i], where, one.ids)) return e;
    }
    out.prompts.push_back(std::move(one));
  }
  return std::nullopt;
}


// A JSON value given either as JSON or as a string holding JSON (SGLang sends json_schema and
// structural_tag as strings).
std::optional<ApiError> json_or_text(const json& v, const std::string& param, json& out) {
  if (v.is_string()) {
    std::string why;
    if (!parse_ordered_json(v.get<std::string>(), out, &why))
      return ApiError::bad_request("'" + param + "' is not valid JSON: " + why, param);
    return std::nullopt;
  }
  if (!v.is_object() && !v.is_boolean())
    return ApiError::bad_request("'" + param + "' must be a JSON schema (object) or a string holding one", param);
  out = v;
  return std::nullopt;
}

std::optional<ApiError> set_constraint(OpenAiRequest& out, ConstraintSpec spec) {
  if (!out.constraint.empty()) {
    return ApiError::bad_request("'" + spec.param + "' and '" + out.constraint.param +
                                     "' both constrain the output; give only one",
                                 spec.param);
  }
  out.constraint = std::move(spec);
  return std::nullopt;
}

std::optional<ApiError> parse_response_format(const json& rf, const std::string& param, OpenAiRequest& out) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return ApiError::bad_request("'" + param + "' must be an object with a 'type'", param);
  const std::string type = rf["type"].get<std::string>();
  ConstraintSpec spec;
  spec.param = param;
  const bool nested_schema = type == "json_schema" && rf.contains("json_schema");
  if (type == "text" || type == "json_object" || type == "structural_tag" || nested_schema) {
    if (auto e = check_nested_fields(rf, "response_format " + type, param)) return e;
  }
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    spec.kind = ConstraintSpec::Kind::JsonObject;
  } else if (type == "json_schema") {
    // OpenAI: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; the Responses
    // API puts name/schema beside type.
    const json& js = nested_schema ? rf["json_schema"] : rf;
    const std::string where = nested_schema ? param + ".json_schema" : param;
    if (!js.is_object()) return ApiError::bad_request("'" + where + "' must be an object", where);
    if (auto e = check_nested_fields(js, nested_schema ? "json_schema" : "text.format json_schema", where)) return e;
    for (const char* k : {"name", "description"})
      if (js.contains(k) && !js[k].is_null() && !js[k].is_string())
        return ApiError::bad_request("'" + where + "." + k + "' must be a string", where + "." + k);
    if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
      return ApiError::bad_request("'" + where + ".strict' must be a boolean", where + ".strict");
    const char* key = js.contains("schema") ? "schema" : js.contains("schema_") ? "schema_" : nullptr;
    // Chat's form nests it: {"type": "json_schema", "json_schema": {"schema": ...}} (the Responses
    // API's flat form: as_responses_error names text.format.schema).
    if (!key && !nested_schema && param == "response_format")
      return ApiError::bad_request("'response_format.json_schema' is required with type 'json_schema' (an object holding "
                                   "'schema')", "response_format.json_schema", "missing_required_field");
    if (!key) return ApiError::bad_request("'" + where + ".schema' is required", where + ".schema", "missing_required_field");
    if (auto e = json_or_text(js[key], where + ".schema", spec.json)) return e;
    spec.kind = ConstraintSpec::Kind::JsonSchema;
    spec.param = where + ".schema";
  } else if (type == "structural_tag") {
    spec.kind = ConstraintSpec::Kind::StructuralTag;
    spec.json = rf;
  } else {
    return ApiError::bad_request("'" + param + ".type' must be one of text, json_object, json_schema, structural_tag; got '" +
                                     type + "'",
                                 param + ".type");
  }
  return set_constraint(out, std::move(spec));
}

std::optional<ApiError> token_id_list(const json& v, const std::string& param, std::vector<TokenId>& out) {
  if (!v.is_array()) return ApiError::bad_request("'" + param + "' must be a list of token ids", param);
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
      return ApiError::bad_request("'" + param + "' must be a list of token ids", param);
    out.push_back(x.get<TokenId>());
  }
  return std::nullopt;
}

std::optional<ApiError> string_list(const json& v, const std::string& param, std::vector<std::string>& out,
                                    bool allow_single) {
  if (allow_single && v.is_string()) {
    out.push_back(v.get<std::string>());
    return std::nullopt;
  }
  if (!v.is_array()) return ApiError::bad_request("'" + param + "' must be a list of strings", param);
  for (const auto& x : v) {
    if (!x.is_string()) return ApiError::bad_request("'" + param + "' must be a list of strings", param);
    out.push_back(x.get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_constraint_fields(const json& body, bool sglang_names, OpenAiRequest& out) {
  auto has = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };
  JsonFields f{body, std::nullopt};
  if (auto v = f.integer(sglang_names ? "min_new_tokens" : "min_tokens", 0, INT32_MAX)) out.min_tokens = static_cast<int>(*v);
  if (auto v = f.boolean("no_stop_trim")) out.no_stop_trim = *v;
  if (!sglang_names) {
    if (auto v = f.boolean("include_stop_str_in_output")) out.no_stop_trim = out.no_stop_trim || *v;
  }
  if (f.err) return f.err;
  if (has("logit_bias")) {
    const json& lb = body["logit_bias"];
    if (!lb.is_object()) return ApiError::bad_request("'logit_bias' must map token ids to numbers", "logit_bias");
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      const std::string& k = it.key();
      // Canonical decimal only ("088", "+88", " 88" are refused), so no two keys name one id.
      const bool canonical = !k.empty() && k.size() <= 10 && k.find_first_not_of("0123456789") == std::string::npos &&
                             (k == "0" || k[0] != '0');
      char* end = nullptr;
      errno = 0;
      long long id = canonical ? std::strtoll(k.c_str(), &end, 10) : -1;
      if (!canonical || *end != '\0' || errno || id < 0 || id > INT32_MAX)
        return ApiError::bad_request("'logit_bias' keys must be token ids, got '" + k + "'", "logit_bias");
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) || it.value().get<double>() < -100.0 ||
          it.value().get<double>() > 100.0)
        return ApiError::bad_request("'logit_bias' values must be numbers in [-100, 100]", "logit_bias");
      out.logit_bias.emplace_back(static_cast<TokenId>(id), it.value().get<float>());
    }
  }
  if (has("allowed_token_ids")) {
    if (auto e = token_id_list(body["allowed_token_ids"], "allowed_token_ids", out.allowed_token_ids)) return e;
    if (out.allowed_token_ids.empty())
      return ApiError::bad_request("'allowed_token_ids' must not be empty", "allowed_token_ids");
  }
  if (has("bad_words")) {
    if (auto e = string_list(body["bad_words"], "bad_words", out.bad_words, false)) return e;
  }
  if (has("stop_regex")) {
    if (auto e = string_list(body["stop_regex"], "stop_regex", out.stop_regex, true)) return e;
  }
  // Structured output sources.
  if (has("response_format")) {
    if (auto e = parse_response_format(body["response_format"], "response_format", out)) return e;
  }
  for (const char* key : {"regex", "guided_regex"}) {
    if (!has(key)) continue;
    if (!body[key].is_string()) return ApiError::bad_request(std::string("'") + key + "' must be a string", key);
    ConstraintSpec spec{ConstraintSpec::Kind::Regex, key, nullptr, body[key].get<std::string>()};
    if (auto e = set_constraint(out, std::move(spec))) return e;
  }
  for (const char* key : {"ebnf", "guided_grammar"}) {
    if (!has(key)) continue;
    if (!body[key].is_string()) return ApiError::bad_request(std::string("'") + key + "' must be a string", key);
    ConstraintSpec spec{ConstraintSpec::Kind::Ebnf, key, nullptr, body[key].get<std::string>()};
    if (auto e = set_constraint(out, std::move(spec))) return e;
  }
  for (const char* key : {"json_schema", "guided_json"}) {
    if (!has(key)) continue;
    ConstraintSpec spec{ConstraintSpec::Kind::JsonSchema, key, nullptr, ""};
    if (auto e = json_or_text(body[key], key, spec.json)) return e;
    if (auto e = set_constraint(out, std::move(spec))) return e;
  }
  if (has("structural_tag")) {
    ConstraintSpec spec{ConstraintSpec::Kind::StructuralTag, "structural_tag", nullptr, ""};
    if (auto e = json_or_text(body["structural_tag"], "structural_tag", spec.json)) return e;
    if (auto e = set_constraint(out, std::move(spec))) return e;
  }
  if (has("guided_choice")) {
    ConstraintSpec spec{ConstraintSpec::Kind::Choice, "guided_choice", json::array(), ""};
    std::vector<std::string> choices;
    if (auto e = string_list(body["guided_choice"], "guided_choice", choices, false)) return e;
    if (choices.empty()) return ApiError::bad_request("'guided_choice' must not be empty", "guided_choice");
    for (auto& c : choices) spec.json.push_back(c);
    if (auto e = set_constraint(out, std::move(spec))) return e;
  }
  if (has("structured_outputs")) {
    const json& so = body["structured_outputs"];
    if (!so.is_object()) return ApiError::bad_request("'structured_outputs' must be an object", "structured_outputs");
    for (auto it = so.begin(); it != so.end(); ++it) {
      const std::string k = it.key();
      const std::string param = "structured_outputs." + k;
      const json& v = it.value();
      if (v.is_null()) continue;
      ConstraintSpec spec;
      spec.param = param;
      if (k == "json") {
        spec.kind = ConstraintSpec::Kind::JsonSchema;
        if (auto e = json_or_text(v, param, spec.json)) return e;
      } else if (k == "regex" || k == "grammar") {
        if (!v.is_string()) return ApiError::bad_request("'" + param + "' must be a string", param);
        spec.kind = k == "regex" ? ConstraintSpec::Kind::Regex : ConstraintSpec::Kind::Ebnf;
        spec.text = v.get<std::string>();
      } else if (k == "choice") {
        std::vector<std::string> choices;
        if (auto e = string_list(v, param, choices, false)) return e;
        if (choices.empty()) return ApiError::bad_request("'" + param + "' must not be empty", param);
        spec.kind = ConstraintSpec::Kind::Choice;
        spec.json = json::array();
        for (auto& c : choices) spec.json.push_back(c);
      } else if (k == "json_object") {
        if (!v.is_boolean()) return ApiError::bad_request("'" + param + "' must be a boolean", param);
        if (!v.get<bool>()) continue;
        spec.kind = ConstraintSpec::Kind::JsonObject;
      } else if (k == "structural_tag") {
        spec.kind = ConstraintSpec::Kind::StructuralTag;
        if (auto e = json_or_text(v, param, spec.json)) return e;
      } else if (k == "disable_any_whitespace" || k == "disable_fallback" || k == "disable_additional_properties" ||
                 k == "whitespace_pattern") {
        return ApiError::bad_request("'" + param + "' is not supported: the grammar engine has fixed JSON options", param,
                                     "unsupported_field");
      } else {
        return ApiError::bad_request("unrecognized field '" + param + "'", param, "unrecognized_field");
      }
      if (auto e = set_constraint(out, std::move(spec))) return e;
    }
  }
  return std::nullopt;
}

namespace {

// Output and prompt-handling fields shared by chat and completions.
std::optional<ApiError> parse_output_fields(const json& body, OpenAiRequest& out) {
  JsonFields f{body, std::nullopt};
  if (auto v = f.boolean("return_token_ids")) out.return_token_ids = *v;
  if (auto v = f.boolean("return_prompt_token_ids")) out.return_prompt_token_ids = *v;
  if (auto v = f.boolean("return_tokens_as_token_ids")) out.tokens_as_ids = *v;
  if (auto v = f.integer("truncate_prompt_tokens", -1, INT32_MAX)) {
    if (*v == 0) return ApiError::bad_request("'truncate_prompt_tokens' must be -1 or at least 1", "truncate_prompt_tokens");
    out.truncate_prompt_tokens = static_cast<int>(*v);
  }
  if (auto v = f.string("rid")) out.rid = *v;
  if (auto v = f.string("request_id")) out.rid = *v;
  // No-effect fields still have OpenAI's types.
  f.string("user");
  f.string("safety_identifier");
  f.string("prompt_cache_key");
  if (f.err) return f.err;
  if (auto e = parse_cache_namespace(body, out)) return e;
  if (f.has("metadata")) {
    const json& md = body["metadata"];
    if (!md.is_object()) return ApiError::bad_request("'metadata' must be an object of strings", "metadata");
    for (auto it = md.begin(); it != md.end(); ++it)
      if (!it.value().is_string())
        return ApiError::bad_request("'metadata." + it.key() + "' must be a string", "metadata." + it.key());
  }
  return parse_constraint_fields(body, false, out);
}

}  // namespace

std::optional<ApiError> parse_cache_namespace(const json& body, OpenAiRequest& out) {
  JsonFields f{body, std::nullopt};
  std::string salt, key;
  if (auto v = f.string("cache_salt")) {
    if (v->empty()) return ApiError::bad_request("'cache_salt' must be a non-empty string", "cache_salt");
    salt = *v;
  }
  if (auto v = f.string("extra_key")) key = *v;
  if (f.err) return f.err;
  // Length-prefixed, so that no (salt, key) pair spells another.
  if (!salt.empty() || !key.empty()) out.cache_namespace = std::to_string(salt.size()) + ":" + salt + key;
  return std::nullopt;
}

ApiError as_generate_error(ApiError err) {
  // Chat's name (or the bare /generate one) -> sampling_params.<SGLang's>; the message's words too.
  static const std::pair<std::string, std::string> kNames[] = {
      {"max_tokens", "max_new_tokens"}, {"min_tokens", "min_new_tokens"}, {"logit_bias", "logit_bias"}};
  for (const auto& [chat, sglang] : kNames)
    if (err.param == chat || err.param == sglang) err.param = "sampling_params." + sglang;
  if (err.param.rfind("sampling_params.", 0) != 0) return err;
  for (const auto& [chat, sglang] : kNames)
    for (size_t at = err.message.find(chat); chat != sglang && at != std::string::npos; at = err.message.find(chat, at + sglang.size()))
      err.message.replace(at, chat.size(), sglang);
  return err;
}

std::optional<ApiError> parse_chat_request(const json& body, const SamplingDefaults& defaults,
                                           OpenAiRequest& out) {
  out = OpenAiRequest{};
  out.kind = ApiKind::Chat;
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  if (auto e = check_request_fields(body, FieldApi::Chat)) return e;
  if (auto e = parse_common(body, defaults, out)) return e;
  if (auto e = parse_output_fields(body, out)) return e;
  if (!body.contains("messages"))
    return ApiError::bad_request("'messages' is required", "messages", "missing_required_field");
  const json& msgs = body["messages"];
  if (!msgs.is_array() || msgs.empty())
    return ApiError::bad_request("'messages' must be a non-empty list", "messages");
  out.messages = json::array();
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    json m;
    if (auto e = normalize_message(msgs[i], i, m)) return e;
    out.messages.push_back(std::move(m));
  }
  if (auto e = parse_tools(body, out)) return e;

  JsonFields f{body, std::nullopt};
  if (auto v = f.boolean("logprobs")) out.logprobs = *v;
  if (auto v = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
    if (!out.logprobs && *v > 0)
      return ApiError::bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    out.top_logprobs = static_cast<int>(*v);
  }
  if (auto v = f.boolean("separate_reasoning")) out.separate_reasoning = *v;
  if (auto v = f.boolean("include_reasoning")) out.include_reasoning = *v;
  if (auto v = f.boolean("stream_reasoning")) out.stream_reasoning = *v;
  if (auto v = f.boolean("add_generation_prompt")) out.add_generation_prompt = *v;
  if (auto v = f.boolean("continue_final_message")) out.continue_final_message = *v;
  if (f.err) return f.err;
  if (out.continue_final_message) {
    if (out.add_generation_prompt && body.contains("add_generation_prompt"))
      return ApiError::bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                                   "continue_final_message");
    out.add_generation_prompt = false;
    if (out.messages.back().value("role", "") != "assistant")
      return ApiError::bad_request("'continue_final_message' needs the last message to be from the assistant",
                                   "continue_final_message");
  }
  if (out.logprobs) out.sampling.top_logprobs = out.top_logprobs;

  out.template_kwargs = json::object();
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object())
      return ApiError::bad_request("'chat_template_kwargs' must be an object",
                                   "chat_template_kwargs");
    out.template_kwargs = body["chat_template_kwargs"];
    // Names the server sets itself: a request may not replace them through the template.
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
                                 "bos_token", "eos_token"}) {
      if (out.template_kwargs.contains(reserved))
        return ApiError::bad_request(std::string("'chat_template_kwargs' may not set '") + reserved +
                                         "' (the server sets it from the request)",
                                     std::string("chat_template_kwargs.") + reserved);
    }
  }
  // reasoning_effort "none" turns thinking off unless the kwargs say otherwise.
  std::string effort;
  std::string effort_param;
  // reasoning_effort (chat) and reasoning.effort (Responses): each is checked whenever it is given,
  // and both given must agree.
  auto check_effort = [](const std::string& e, const std::string& param) -> std::optional<ApiError> {
    if (e != "none" && e != "minimal" && e != "low" && e != "medium" && e != "high")
      return ApiError::bad_request("'" + param + "' must be one of none, minimal, low, medium, high; got '" + e + "'",
                                   param);
    return std::nullopt;
  };
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    effort_param = "reasoning_effort";
    if (!body["reasoning_effort"].is_string())
      return ApiError::bad_request("'reasoning_effort' must be a string", effort_param);
    effort = body["reasoning_effort"];
    if (auto e = check_effort(effort, effort_param)) return e;
  }
  if (body.contains("reasoning") && !body["reasoning"].is_null()) {
    const json& r = body["reasoning"];
    if (!r.is_object()) return ApiError::bad_request("'reasoning' must be an object", "reasoning");
    if (auto e = check_nested_fields(r, "reasoning", "reasoning")) return e;
    if (r.contains("summary") && !r["summary"].is_null())
      return ApiError::bad_request("'reasoning.summary' is not supported (reasoning is returned as it is)",
                                   "reasoning.summary", "unsupported_field");
    if (r.contains("effort") && !r["effort"].is_null()) {
      if (!r["effort"].is_string()) return ApiError::bad_request("'reasoning.effort' must be a string", "reasoning.effort");
      const std::string e = r["effort"];
      if (auto err = check_effort(e, "reasoning.effort")) return err;
      if (!effort_param.empty() && e != effort)
        return ApiError::bad_request("'reasoning_effort' is '" + effort + "' but 'reasoning.effort' is '" + e +
                                         "'; give one, or the same value",
                                     "reasoning.effort");
      effort = e;
      effort_param = "reasoning.effort";
    }
  }
  if (!effort.empty() && !out.template_kwargs.contains("enable_thinking")) {
    out.template_kwargs["enable_thinking"] = effort != "none";
  }
  const json& et = out.template_kwargs.contains("enable_thinking")
                       ? out.template_kwargs["enable_thinking"]
                       : json();
  out.enable_thinking = !(et.is_boolean() && !et.get<bool>());
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const json& body,
                                                 const SamplingDefaults& defaults,
                                                 OpenAiRequest& out) {
  out = OpenAiRequest{};
  out.kind = ApiKind::Completion;
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  if (auto e = check_request_fields(body, FieldApi::Completion)) return e;
  if (auto e = parse_common(body, defaults, out)) return e;
  if (auto e = parse_output_fields(body, out)) return e;
  if (!body.contains("prompt") || body["prompt"].is_null())
    return ApiError::bad_request("'prompt' is required", "prompt", "missing_required_field");
  if (auto e = parse_prompts(body["prompt"], out)) return e;
  const auto n_prompts = static_cast<int64_t>(out.prompts.size());
  if (n_prompts * out.n > kMaxSequencesPerRequest) {
    return ApiError::bad_request("'n' is " + std::to_string(out.n) + " for " +
                                     std::to_string(n_prompts) + " prompts: " +
                                     std::to_string(n_prompts * out.n) +
                                     " sequences, more than the " +
                                     std::to_string(kMaxSequencesPerRequest) +
                                     " allowed per request (prompts x n)",
                                 "n");
  }
  JsonFields f{body, std::nullopt};
  if (auto v = f.integer("logprobs", 0, kMaxTopLogprobs)) {
    out.logprobs = true;
    out.top_logprobs = static_cast<int>(*v);
  }
  if (auto v = f.boolean("echo")) out.echo = *v;
  if (f.err) return f.err;
  // vLLM puts the prompt's logprobs into an echo; the engine does not compute them.
  if (out.echo && out.logprobs)
    return ApiError::bad_request("'echo' with 'logprobs' is not supported: prompt logprobs are not computed", "echo",
                                 "unsupported_field");
  if (out.logprobs) out.sampling.top_logprobs = out.top_logprobs;
  return std::nullopt;
}

std::optional<ApiError> parse_generate_request(const json& body, const SamplingDefaults& defaults, OpenAiRequest& out) {
  out = OpenAiRequest{};
  out.kind = ApiKind::Generate;
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  if (auto e = check_request_fields(body, FieldApi::Generate)) return e;
  const bool has_text = body.contains("text") && !body["text"].is_null();
  const bool has_ids = body.contains("input_ids") && !body["input_ids"].is_null();
  if (has_text == has_ids) return ApiError::bad_request("give exactly one of 'text' and 'input_ids'", has_text ? "input_ids" : "text");
  // Prompts: one or a batch.
  if (has_text) {
    const json& t = body["text"];
    if (t.is_string()) {
      out.prompts.push_back(CompletionPrompt{t.get<std::string>(), {}, false});
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) return ApiError::bad_request("'text' must be a string or a list of strings", "text");
        out.prompts.push_back(CompletionPrompt{x.get<std::string>(), {}, false});
      }
      out.batched_prompt = true;
    } else {
      return ApiError::bad_request("'text' must be a string or a non-empty list of strings", "text");
    }
  } else {
    const json& ids = body["input_ids"];
    auto one = [&](const json& list, CompletionPrompt& cp) -> std::optional<ApiError> {
      if (!list.is_array()) return ApiError::bad_request("'input_ids' must be a list of token ids or a list of such lists", "input_ids");
      cp.is_ids = true;
      for (const auto& x : list) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
          return ApiError::bad_request("'input_ids' must hold non-negative token ids", "input_ids");
        cp.ids.push_back(x.get<TokenId>());
      }
      return std::nullopt;
    };
    if (ids.is_array() && !ids.empty() && ids[0].is_array()) {
      for (const auto& list : ids) {
        CompletionPrompt cp;
        if (auto e = one(list, cp)) return e;
        out.prompts.push_back(std::move(cp));
      }
      out.batched_prompt = true;
    } else {
      CompletionPrompt cp;
      if (auto e = one(ids, cp)) return e;
      out.prompts.push_back(std::move(cp));
    }
  }
  if (out.prompts.size() > static_cast<size_t>(kMaxSequencesPerRequest))
    return ApiError::bad_request("too many prompts in one request", has_text ? "text" : "input_ids");
  // sampling_params: one object (a list must repeat the same one).
  json sp = json::object();
  if (body.contains("sampling_params") && !body["sampling_params"].is_null()) {
    const json& v = body["sampling_params"];
    if (v.is_array()) {
      if (v.empty()) return ApiError::bad_request("'sampling_params' must not be an empty list", "sampling_params");
      for (const auto& x : v)
        if (x != v[0])
          return ApiError::bad_request("per-prompt sampling_params are not supported: give one object", "sampling_params");
      sp = v[0];
    } else {
      sp = v;
    }
    if (!sp.is_object()) return ApiError::bad_request("'sampling_params' must be an object", "sampling_params");
  }
  if (auto e = check_request_fields(sp, FieldApi::GenerateSampling, "sampling_params.")) return e;
  // The shared sampling parser reads OpenAI names; SGLang's extra names are mapped here.
  json common = sp;
  if (common.contains("max_new_tokens")) {
    common["max_tokens"] = common["max_new_tokens"];
    common.erase("max_new_tokens");
  }
  auto prefix = [](std::optional<ApiError> e) {
    if (e && !e->param.empty()) {
      if (e->param == "max_tokens") e->param = "max_new_tokens";
      e->param = "sampling_params." + e->param;
      e->message = "sampling_params: " + e->message;
    }
    return e;
  };
  // parse_completion_request would want a prompt: run the pieces it shares with /generate.
  OpenAiRequest tmp;
  json with_prompt = common;
  with_prompt["prompt"] = "x";
  // Fields of sampling_params unknown to /v1/completions were refused above by the table.
  with_prompt.erase("min_new_tokens");
  with_prompt.erase("no_stop_trim");
  with_prompt.erase("stop_regex");
  with_prompt.erase("json_schema");
  with_prompt.erase("regex");
  with_prompt.erase("ebnf");
  with_prompt.erase("structural_tag");
  with_prompt.erase("logit_bias");
  with_prompt.erase("custom_params");
  with_prompt.erase("stream_interval");
  with_prompt.erase("spaces_between_special_tokens");
  if (auto e = prefix(parse_completion_request(with_prompt, defaults, tmp))) return e;
  {
    JsonFields f{sp, std::nullopt};
    if (auto v = f.integer("stream_interval", 1, 1024)) out.stream_interval = static_cast<int>(*v);
    if (auto e = prefix(f.err)) return e;
  }
  out.sampling = tmp.sampling;
  out.n = tmp.n;
  out.stop = tmp.stop;
  out.max_tokens = tmp.max_tokens;
  out.skip_special_tokens = tmp.skip_special_tokens;
  if (auto e = prefix(parse_constraint_fields(sp, /*sglang_names=*/true, out))) return e;
  if (static_cast<int64_t>(out.prompts.size()) * out.n > kMaxSequencesPerRequest)
    return ApiError::bad_request("too many sequences (prompts x n) in one request", "sampling_params.n");
  // Top level.
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return ApiError::bad_request("'stream' must be a boolean", "stream");
    out.stream = body["stream"].get<bool>();
  }
  if (body.contains("rid") && !body["rid"].is_null()) {
    const json& rid = body["rid"];
    if (rid.is_string()) out.rid = rid.get<std::string>();
    else if (rid.is_array() && rid.size() == 1 && rid[0].is_string()) out.rid = rid[0].get<std::string>();
    else return ApiError::bad_request("'rid' must be a string", "rid");
  }
  if (auto e = parse_cache_namespace(body, out)) return e;
  JsonFields f{body, std::nullopt};
  const bool want_lp = f.boolean("return_logprob").value_or(false);
  const bool text_in_lps = f.boolean("return_text_in_logprobs").value_or(false);
  if (f.err) return f.err;
  int top = 0;
  if (body.contains("top_logprobs_num") && !body["top_logprobs_num"].is_null()) {
    const json& t = body["top_logprobs_num"];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > kMaxTopLogprobs)
      return ApiError::bad_request("'top_logprobs_num' must be an integer in [0, 20]", "top_logprobs_num");
    top = t.get<int>();
  }
  if (top > 0 && !want_lp)
    return ApiError::bad_request("'top_logprobs_num' needs 'return_logprob': true", "top_logprobs_num");
  // stream_options has no effect here (every chunk's meta_info has the counts) but keeps its types.
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) return ApiError::bad_request("'stream_options' must be an object", "stream_options");
    if (auto e = check_nested_fields(so, "stream_options", "stream_options")) return e;
    JsonFields g{so, std::nullopt};
    g.boolean("include_usage");
    g.boolean("continuous_usage_stats");
    if (g.err) {
      g.err->param = "stream_options." + g.err->param;
      return g.err;
    }
  }
  if (want_lp) {
    out.logprobs = true;
    out.top_logprobs = top;
    out.sampling.top_logprobs = top;
  }
  out.extra = {{"return_text_in_logprobs", text_in_lps}};
  return std::nullopt;
}

}  // namespace deltaserve
