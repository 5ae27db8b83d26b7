// `deltaserve chat-template`: render a conversation with the model's chat template and print the
// prompt exactly (no trailing newline added), for byte-for-byte comparison with HF
// apply_chat_template(tokenize=False).
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/cli_args.h"
#include "app/commands.h"
#include "chat/chat_template.h"
#include "util/json_parse.h"
#include "util/mmap_file.h"

namespace deltaserve {

namespace {

void print_help() {
  std::printf(
      "usage: deltaserve chat-template --model DIR --input FILE.json [--chat-template FILE]\n\n"
      "  --model DIR            model dir (chat_template.jinja or tokenizer_config.json; bos/eos tokens)\n"
      "  --input FILE.json      {\"messages\": [...], \"tools\": [...] or null,\n"
      "                          \"add_generation_prompt\": bool, \"kwargs\": {...}}\n"
      "                         add_generation_prompt defaults to false, as in HF's\n"
      "                         apply_chat_template (the server's chat requests default to true)\n"
      "  --chat-template FILE   use this template instead of the model's\n"
      "JSON nested deeper than 64 levels is refused.\n");
}

int fail(const std::string& message) {
  std::fprintf(stderr, "deltaserve chat-template: %s\n", message.c_str());
  return 1;
}

// A JSON object from `path`: parsed in linear time with a depth limit (deep nesting overflowed the
// stack when the value was copied), and the reason it is not one named.
Result<nlohmann::ordered_json> read_json_object(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return error(path.string(), ": is a directory");
  auto text = read_text_file(path);
  if (!text) return text.status();
  nlohmann::ordered_json j;
  std::string why;
  if (!parse_ordered_json(*text, j, &why)) return error(path.string(), ": not valid JSON: ", why);
  if (!j.is_object()) return error(path.string(), ": not a JSON object (", j.type_name(), ")");
  return j;
}

}  // namespace

int cmd_chat_template(const Args& args) {
  CliArgs cli({"model", "input", "chat-template"}, {"help"});
  if (Status s = cli.parse(args); !s) {
    std::fprintf(stderr, "deltaserve chat-template: %s\n", s.message().c_str());
    return 2;
  }
  if (cli.flag("help")) {
    print_help();
    return 0;
  }
  auto model = cli.get("model");
  auto input_path = cli.get("input");
  if (!model || !input_path) {
    std::fprintf(stderr, "deltaserve chat-template: --model and --input are required\n");
    return 2;
  }
  using ojson = nlohmann::ordered_json;
  std::optional<std::filesystem::path> override_file;
  if (auto t = cli.get("chat-template")) override_file = *t;

  auto tmpl = ChatTemplate::load(*model, override_file);
  if (!tmpl) return fail(tmpl.status().message());

  ChatTemplate::Input in;
  const std::filesystem::path config_path = std::filesystem::path(*model) / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    auto parsed = read_json_object(config_path);
    if (!parsed) return fail(parsed.status().message());
    const ojson& config = *parsed;
    in.bos_token = special_token_text(config, "bos_token");
    in.eos_token = special_token_text(config, "eos_token");
  }

  auto parsed = read_json_object(*input_path);
  if (!parsed) return fail(parsed.status().message());
  ojson& j = *parsed;
  // HF's apply_chat_template defaults add_generation_prompt to false; this command is compared
  // with it byte for byte (ChatTemplate::Input's default, true, is the server's).
  in.add_generation_prompt = false;
  if (!j.contains("messages") || !j["messages"].is_array()) return fail(*input_path + ": \"messages\" must be a list");
  in.messages = j["messages"];
  if (j.contains("tools")) in.tools = j["tools"];
  if (j.contains("add_generation_prompt")) {
    if (!j["add_generation_prompt"].is_boolean()) return fail("\"add_generation_prompt\" must be a boolean");
    in.add_generation_prompt = j["add_generation_prompt"].get<bool>();
  }
  if (j.contains("kwargs") && !j["kwargs"].is_null()) {
    if (!j["kwargs"].is_object()) return fail("\"kwargs\" must be an object");
    in.kwargs = j["kwargs"];
  }

  auto prompt = tmpl->render(in);
  if (!prompt) return fail(prompt.status().message());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace deltaserve
