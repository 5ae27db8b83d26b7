// `deltaserve systemd-unit [serve flags...]`: a unit file that runs `deltaserve serve` with these
// settings.
#include <pwd.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "app/commands.h"
#include "app/service_notify.h"
#include "options/serve_options.h"
#include "deploy/cli_split.h"
#include "deploy/systemd_unit.h"
#include "server/tool_call_parser.h"

namespace deltaserve {
namespace {

constexpr const char* kUsage =
    "usage: deltaserve systemd-unit [serve flags...] [--output FILE] [--user NAME] [--description TEXT]\n"
    "                               [--executable PATH] [--env NAME=VALUE]... [--working-directory DIR]\n"
    "                               [--user-unit]\n"
    "Writes a systemd unit (stdout, or FILE) whose ExecStart runs `deltaserve serve` with the given\n"
    "serve flags (or --config FILE.toml's settings). Install: sudo cp FILE /etc/systemd/system/ &&\n"
    "sudo systemctl daemon-reload && sudo systemctl enable --now NAME.\n"
    "--executable and --working-directory must be absolute paths; relative --model-path,\n"
    "--tokenizer-path, --chat-template, --speculative-token-map and --state-dir are made absolute\n"
    "(the service does not run from this folder). --env names are [A-Za-z_][A-Za-z0-9_]*; --user\n"
    "cannot go with --user-unit.\n";

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "/usr/local/bin/deltaserve";
}

}  // namespace

int cmd_systemd_unit(const Args& in_args) {
  // A line break would end the unit's line and start another (a stray directive): refused.
  for (std::size_t i = 0; i < in_args.size(); ++i)
    if (in_args[i].find_first_of("\r\n") != std::string::npos) {
      const std::string& flag = i > 0 && in_args[i].rfind("--", 0) != 0 ? in_args[i - 1] : in_args[i].substr(0, in_args[i].find('='));
      std::fprintf(stderr, "deltaserve systemd-unit: %s: a value with a line break cannot go into a unit file\n",
                   flag.c_str());
      return 2;
    }
  std::vector<std::string> args = in_args;
  UnitFileOptions unit;
  auto output = take_last(args, "output", true);
  auto user = output ? take_last(args, "user", true) : output;
  auto desc = user ? take_last(args, "description", true) : user;
  auto exe = desc ? take_last(args, "executable", true) : desc;
  auto wd = exe ? take_last(args, "working-directory", true) : exe;
  auto user_unit = wd ? take_last(args, "user-unit", false) : wd;
  auto env = user_unit ? take_option(args, "env", true) : Result<std::vector<std::string>>(user_unit.status());
  if (!env) {
    std::fprintf(stderr, "deltaserve systemd-unit: %s\n", env.status().message().c_str());
    return 2;
  }
  std::vector<std::string> warnings;
  auto opts = parse_serve_options(args, &warnings);
  if (!opts) {
    std::fprintf(stderr, "deltaserve systemd-unit: %s\n", opts.status().message().c_str());
    return 2;
  }
  if (opts->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (opts->model_path.empty()) {
    std::fprintf(stderr, "deltaserve systemd-unit: pass --model-path (the unit must say what it serves)\n");
    return 2;
  }
  // serve checks the tool-call parser before it loads; a unit that would fail at start is refused.
  if (auto k = tool_parser_kind_from_name(opts->tool_call_parser); !k) {
    std::fprintf(stderr, "deltaserve systemd-unit: %s\n", k.status().message().c_str());
    return 2;
  }
  for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  unit.executable = exe->value_or(self_exe());
  unit.user = user->value_or("");
  unit.description = desc->value_or("");
  unit.working_directory = wd->value_or("");
  unit.user_unit = user_unit->has_value();
  unit.environment = *env;
  unit.notify = service_notify_supported();
  unit.watchdog_sec = opts->watchdog_timeout;
  if (Status st = check_unit_file_options(unit); !st.is_ok()) {
    std::fprintf(stderr, "deltaserve systemd-unit: %s\n", st.message().c_str());
    return 2;
  }
  // The service runs from / (or --working-directory): relative paths are resolved here, where the
  // user meant them.
  std::error_code cwd_error;
  const std::filesystem::path cwd = std::filesystem::current_path(cwd_error);
  if (Status st = cwd_error ? error("the current folder: ", cwd_error.message()) : make_serve_paths_absolute(*opts, cwd);
      !st.is_ok()) {
    std::fprintf(stderr, "deltaserve systemd-unit: %s (give absolute paths)\n", st.message().c_str());
    return 2;
  }
  // The launch records go where the service's user can write: under --user NAME, that user's
  // home, not the home of whoever writes the unit.
  if (opts->state_dir.empty() && !unit.user.empty()) {
    const passwd* pw = getpwnam(unit.user.c_str());
    if (pw == nullptr || pw->pw_dir == nullptr || *pw->pw_dir == '\0') {
      std::fprintf(stderr,
                   "deltaserve systemd-unit: --user %s: no such user here, so the service's state folder is not "
                   "known: pass --state-dir DIR (a folder that user can write)\n",
                   unit.user.c_str());
      return 2;
    }
    Status st = set_serve_option(*opts, "state-dir", (std::filesystem::path(pw->pw_dir) / ".local" / "state" / "deltaserve").string());
    if (!st.is_ok()) {
      std::fprintf(stderr, "deltaserve systemd-unit: %s\n", st.message().c_str());
      return 2;
    }
  }
  // Values from --config (or anything the flags resolved to) are checked as the command line
  // was: a line break would end the unit's line and start a stray directive.
  for (const std::string& word : explicit_args(*opts))
    if (word.find_first_of("\r\n") != std::string::npos) {
      std::fprintf(stderr, "deltaserve systemd-unit: a value with a line break cannot go into a unit file: %s\n",
                   word.substr(0, word.find_first_of("\r\n")).c_str());
      return 2;
    }
  const std::string text = make_systemd_unit(*opts, unit);
  if (output->has_value()) {
    std::ofstream out(**output, std::ios::binary);
    out << text;
    if (!out) {
      std::fprintf(stderr, "deltaserve systemd-unit: cannot write %s\n", (*output)->c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote %s\n", (*output)->c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  return 0;
}

}  // namespace deltaserve
