// `deltaserve config diff A B` and `deltaserve config show A`: A and B are launch ids, systemd
// unit files, shell command lines or scripts (sglang / deltaserve), or TOML files.
#include <cstdio>

#include "app/commands.h"
#include "options/serve_options.h"
#include "deploy/cli_split.h"
#include "deploy/config_diff.h"

namespace deltaserve {
namespace {

constexpr const char* kUsage =
    "usage: deltaserve config diff A B [--json] [--state-dir DIR]\n"
    "       deltaserve config show A [--toml] [--state-dir DIR]\n"
    "A and B: a launch id (see `deltaserve history`), a systemd unit file, a shell script or command\n"
    "line (python -m sglang.launch_server ..., sglang serve ..., deltaserve serve ...), or a config file\n"
    "(.toml, or SGLang's --config .yaml).\n"
    "Defaults are resolved on both sides; settings marked * change speed or memory.\n";

}  // namespace

int cmd_config(const Args& in_args) {
  std::vector<std::string> args = in_args;
  for (auto& a : args)
    if (a == "-h") a = "--help";
  auto json = take_last(args, "json", false);
  auto toml = json ? take_last(args, "toml", false) : json;
  auto state_dir = toml ? take_last(args, "state-dir", true) : toml;
  auto help = state_dir ? take_last(args, "help", false) : state_dir;
  if (!help) {
    std::fprintf(stderr, "deltaserve config: %s\n", help.status().message().c_str());
    return 2;
  }
  if (help->has_value() || args.empty()) {
    std::fputs(kUsage, help->has_value() ? stdout : stderr);
    return help->has_value() ? 0 : 2;
  }
  const std::filesystem::path dir = state_dir->has_value() ? std::filesystem::path(**state_dir) : default_state_dir();
  const std::string verb = args[0];
  // Options are taken out above; whatever still looks like one is unknown here.
  for (const auto& a : args)
    if (a.size() > 1 && a[0] == '-' && a.find(' ') == std::string::npos) {  // (a command line has spaces)
      std::fprintf(stderr, "deltaserve config: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  // Each verb's own output option: the other verb's is refused, not ignored.
  if (verb == "diff" && toml->has_value()) {
    std::fprintf(stderr, "deltaserve config diff: --toml is for `config show`; diff prints text or --json\n");
    return 2;
  }
  if (verb == "show" && json->has_value()) {
    std::fprintf(stderr, "deltaserve config show: --json is for `config diff`; show prints text or --toml\n");
    return 2;
  }
  if (verb == "diff" && args.size() == 3) {
    auto a = load_config_source(args[1], dir);
    if (!a) {
      std::fprintf(stderr, "deltaserve config diff: %s\n", a.status().message().c_str());
      return 1;
    }
    auto b = load_config_source(args[2], dir);
    if (!b) {
      std::fprintf(stderr, "deltaserve config diff: %s\n", b.status().message().c_str());
      return 1;
    }
    auto rows = diff_sources(*a, *b);
    if (json->has_value()) {
      std::printf("%s\n", diff_json(rows, *a, *b).c_str());
    } else {
      std::printf("A: %s (%s)\nB: %s (%s)\n", a->label.c_str(), a->kind.c_str(), b->label.c_str(), b->kind.c_str());
      std::fputs(render_diff(rows, "A", "B").c_str(), stdout);
      for (const auto& n : a->notes) std::printf("note (A): %s\n", n.c_str());
      for (const auto& n : b->notes) std::printf("note (B): %s\n", n.c_str());
    }
    return 0;
  }
  if (verb == "show" && args.size() == 2) {
    auto a = load_config_source(args[1], dir);
    if (!a) {
      std::fprintf(stderr, "deltaserve config show: %s\n", a.status().message().c_str());
      return 1;
    }
    if (toml->has_value()) {
      std::fputs(serve_options_to_toml(a->options, /*all=*/false).c_str(), stdout);
      return 0;
    }
    for (const auto& [k, v] : a->settings) std::printf("%-30s %s\n", k.c_str(), v.c_str());
    for (const auto& [k, v] : a->environment) std::printf("%-30s %s\n", k.c_str(), v.c_str());
    for (const auto& [k, v] : a->resolved) std::printf("%-30s %s\n", k.c_str(), v.c_str());
    for (const auto& n : a->notes) std::printf("note: %s\n", n.c_str());
    return 0;
  }
  std::fputs(kUsage, stderr);
  return 2;
}

}  // namespace deltaserve
