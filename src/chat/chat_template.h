// ChatTemplate: messages + tools + flags -> prompt string, rendered with the model's own Jinja2
// chat template so that the output is byte-exact with HF transformers' apply_chat_template
// (jinja2 sandbox, trim_blocks + lstrip_blocks, loopcontrols, tojson = json.dumps with
// ensure_ascii=False, raise_exception, strftime_now).
//
// JSON inputs are nlohmann::ordered_json because key order is observable: `tool | tojson` and
// `arguments | items` must walk keys in the order the client sent them. A caller holding a plain
// nlohmann::json (sorted keys) can assign it, but the rendered tools will then be key-sorted.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"
#include "util/status.h"

namespace deltaserve {

class ChatTemplate {
 public:
  static Result<ChatTemplate> parse(std::string source);
  // Template of a model dir. Order, as transformers loads it: chat_template.jinja if present
  // (it replaces the config's template), else `chat_template` in tokenizer_config.json (a string,
  // or a list of {name, template}: "default", and "tool_use" for requests with tools, as
  // transformers picks them). override_file (--chat-template) wins over both. Without either,
  // chat_template.json's "chat_template" (transformers' processors read it; vLLM falls back to it).
  static Result<ChatTemplate> load(const std::filesystem::path& model_dir,
                                   const std::optional<std::filesystem::path>& override_file = std::nullopt);
  // The same, with nullopt where the model has no template at all (serve then answers only
  // completions); one that is there but broken is still an error.
  static Result<std::optional<ChatTemplate>> find(const std::filesystem::path& model_dir,
                                                  const std::optional<std::filesystem::path>& override_file = std::nullopt);

  struct Input {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    nlohmann::ordered_json tools;  // null: no tools (the template sees `tools` = None)
    bool add_generation_prompt = true;
    // Extra template variables (enable_thinking, preserve_thinking, ...); they override the
    // variables above if names collide.
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    // Special-token strings from tokenizer_config.json; nullopt leaves the variable undefined,
    // as transformers does for a null token.
    std::optional<std::string> bos_token, eos_token;
  };

  // Before rendering, an assistant tool call's `function.arguments` given as a JSON string (the
  // OpenAI wire format) is parsed into an object, and a null/empty one becomes {}, as vLLM does
  // (templates such as Qwen3.6's walk it with |items, which needs a mapping). Invalid JSON there
  // is an error. The caller's JSON is not modified.
  Result<std::string> render(const Input& input) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  std::shared_ptr<const ChatTemplate> tool_use_;  // a list's "tool_use" template, for requests with tools
};

// bos_token / eos_token of a tokenizer_config.json value: a string, an {"content": ...} object
// (AddedToken form), or null/absent -> nullopt.
std::optional<std::string> special_token_text(const nlohmann::ordered_json& config, const char* key);

}  // namespace deltaserve
