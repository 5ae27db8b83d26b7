// Developer tool (not a test): render a template file with an input JSON file, for cross-checking
// against Python jinja2 by hand. Usage: chat_render_tool TEMPLATE INPUT.json
#include <cstdio>
#include <iostream>

#include "chat/chat_template.h"
#include "util/mmap_file.h"

int main(int argc, char** argv) {
  using namespace deltaserve;
  if (argc != 3) {
    std::fprintf(stderr, "usage: chat_render_tool TEMPLATE INPUT.json\n");
    return 2;
  }
  auto src = read_text_file(argv[1]);
  auto in = read_text_file(argv[2]);
  if (!src || !in) {
    std::fprintf(stderr, "cannot read inputs\n");
    return 1;
  }
  auto ct = ChatTemplate::parse(*src);
  if (!ct) {
    std::fprintf(stderr, "%s\n", ct.status().message().c_str());
    return 1;
  }
  auto j = nlohmann::ordered_json::parse(*in);
  ChatTemplate::Input input;
  input.messages = j.value("messages", nlohmann::ordered_json::array());
  input.tools = j.value("tools", nlohmann::ordered_json());
  input.add_generation_prompt = j.value("add_generation_prompt", true);
  input.kwargs = j.value("kwargs", nlohmann::ordered_json::object());
  auto out = ct->render(input);
  if (!out) {
    std::fprintf(stderr, "%s\n", out.status().message().c_str());
    return 1;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}
