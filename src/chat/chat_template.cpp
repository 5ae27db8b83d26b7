#include "chat/chat_template.h"

#include <algorithm>

#include "util/json_parse.h"
#include "util/mmap_file.h"

namespace deltaserve {

namespace {

using ojson = nlohmann::ordered_json;

// vLLM's _postprocess_messages: string arguments -> parsed JSON, missing/empty -> {}.
Status normalize_tool_call_arguments(ojson& messages) {
  if (!messages.is_array()) return Status::ok();
  for (std::size_t m = 0; m < messages.size(); ++m) {
    ojson& msg = messages[m];
    if (!msg.is_object() || msg.value("role", "") != "assistant") continue;
    auto calls = msg.find("tool_calls");
    if (calls == msg.end() || !calls->is_array()) continue;
    for (std::size_t c = 0; c < calls->size(); ++c) {
      ojson& call = (*calls)[c];
      if (!call.is_object()) continue;
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end() || args->is_null() || (args->is_string() && args->get<std::string>().empty())) {
        (*fn)["arguments"] = ojson::object();
        continue;
      }
      if (!args->is_string()) continue;
      ojson parsed;
      std::string why;
      if (!parse_ordered_json(args->get<std::string>(), parsed, &why))
        return error("messages[", m, "].tool_calls[", c, "].function.arguments is not valid JSON: ", why);
      *args = std::move(parsed);
    }
  }
  return Status::ok();
}

// True if some assistant tool call has `arguments` that normalize_tool_call_arguments rewrites;
// lets render() skip copying the messages in the common case.
bool needs_argument_normalization(const ojson& messages) {
  if (!messages.is_array()) return false;
  for (const auto& msg : messages) {
    if (!msg.is_object()) continue;
    auto calls = msg.find("tool_calls");
    if (calls == msg.end() || !calls->is_array()) continue;
    for (const auto& call : *calls) {
      if (!call.is_object()) continue;
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end() || args->is_null() || args->is_string()) return true;
    }
  }
  return false;
}

}  // namespace

std::optional<std::string> special_token_text(const ojson& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  auto t = jinja::Template::parse(source);
  if (!t) return t.status();
  ChatTemplate ct;
  ct.source_ = std::move(source);
  ct.template_ = std::move(t).value();
  return ct;
}

Result<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir,
                                        const std::optional<std::filesystem::path>& override_file) {
  DS_ASSIGN_OR_RETURN(std::optional<ChatTemplate> found, find(model_dir, override_file));
  if (!found) return error(model_dir.string(), ": the model has no chat template");
  return std::move(*found);
}

Result<std::optional<ChatTemplate>> ChatTemplate::find(const std::filesystem::path& model_dir,
                                                       const std::optional<std::filesystem::path>& override_file) {
  auto from_file = [](const std::filesystem::path& path) -> Result<ChatTemplate> {
    std::error_code dir_ec;
    if (std::filesystem::is_directory(path, dir_ec)) return error(path.string(), ": is a directory, not a template file");
    auto text = read_text_file(path);
    if (!text) return text.status();
    auto ct = parse(std::move(text).value());
    if (!ct) return error(path.string(), ": ", ct.status().message());
    return ct;
  };
  // chat_template.json: only where neither place below has a template.
  auto from_json_file = [&model_dir]() -> Result<std::optional<ChatTemplate>> {
    const auto path = model_dir / "chat_template.json";
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::optional<ChatTemplate>();
    DS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
    const ojson j = ojson::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("chat_template") || !j["chat_template"].is_string())
      return error(path.string(), ": expected an object with a string \"chat_template\"");
    auto ct = parse(j["chat_template"].get<std::string>());
    if (!ct) return error(path.string(), ": ", ct.status().message());
    return std::optional<ChatTemplate>(std::move(*ct));
  };
  if (override_file) {
    DS_ASSIGN_OR_RETURN(ChatTemplate ct, from_file(*override_file));
    return std::optional<ChatTemplate>(std::move(ct));
  }
  std::error_code ec;
  if (std::filesystem::exists(model_dir / "chat_template.jinja", ec)) {
    DS_ASSIGN_OR_RETURN(ChatTemplate ct, from_file(model_dir / "chat_template.jinja"));
    return std::optional<ChatTemplate>(std::move(ct));
  }
  const auto config_path = model_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path, ec)) return from_json_file();
  auto text = read_text_file(config_path);
  if (!text) return text.status();
  ojson config = ojson::parse(*text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return error(config_path.string(), ": not a JSON object");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return from_json_file();
  std::string source, tool_use;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) continue;
      const ojson& name = entry.contains("name") ? entry["name"] : ojson();
      if (name == "default") source = entry["template"].get<std::string>();
      if (name == "tool_use") tool_use = entry["template"].get<std::string>();
    }
    if (source.empty()) return error(config_path.string(), ": chat_template list has no \"default\" entry");
  } else {
    return error(config_path.string(), ": chat_template must be a string or a list");
  }
  auto ct = parse(std::move(source));
  if (!ct) return error(config_path.string(), ": ", ct.status().message());
  if (!tool_use.empty()) {
    auto tu = parse(std::move(tool_use));
    if (!tu) return error(config_path.string(), ": the \"tool_use\" template: ", tu.status().message());
    ct->tool_use_ = std::make_shared<const ChatTemplate>(std::move(*tu));
  }
  return std::optional<ChatTemplate>(std::move(*ct));
}

Result<std::string> ChatTemplate::render(const Input& input) const {
  if (tool_use_ && !input.tools.is_null()) return tool_use_->render(input);
  jinja::Object ctx;
  if (needs_argument_normalization(input.messages)) {
    ojson messages = input.messages;
    DS_RETURN_IF_ERROR(normalize_tool_call_arguments(messages));
    ctx.set("messages", jinja::Value::from_json(messages));
  } else {
    ctx.set("messages", jinja::Value::from_json(input.messages));
  }
  ctx.set("tools", jinja::Value::from_json(input.tools));  // null -> None, as transformers passes
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value(input.add_generation_prompt));
  if (input.bos_token) ctx.set("bos_token", jinja::Value(*input.bos_token));
  if (input.eos_token) ctx.set("eos_token", jinja::Value(*input.eos_token));
  if (input.kwargs.is_object()) {
    // A JSON object's keys are distinct: each is checked against the few set above only (Object::set
    // scans every key, so 300k kwargs took minutes of CPU).
    const std::size_t fixed = ctx.items.size();
    ctx.items.reserve(fixed + input.kwargs.size());
    for (auto it = input.kwargs.begin(); it != input.kwargs.end(); ++it) {
      auto same = std::find_if(ctx.items.begin(), ctx.items.begin() + static_cast<std::ptrdiff_t>(fixed),
                               [&](const auto& kv) { return kv.first == it.key(); });
      if (same != ctx.items.begin() + static_cast<std::ptrdiff_t>(fixed)) same->second = jinja::Value::from_json(it.value());
      else ctx.items.emplace_back(it.key(), jinja::Value::from_json(it.value()));
    }
  } else if (!input.kwargs.is_null()) {
    return error("chat template kwargs must be a JSON object");
  }
  return template_.render(ctx);
}

}  // namespace deltaserve
