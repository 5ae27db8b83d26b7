#include "deploy/systemd_unit.h"

#include "deploy/launch_db.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace deltaserve {

namespace {

// A value written raw after "Key=": specifiers (%) escaped as %%.
std::string escape_specifiers(const std::string& value) {
  std::string out;
  for (char c : value) out += c == '%' ? std::string("%%") : std::string(1, c);
  return out;
}

// A value written raw may hold no line break and may not end in a backslash (systemd joins the
// next line to it).
Status check_raw_value(const char* option, const std::string& value) {
  if (value.find_first_of("\r\n") != std::string::npos)
    return error(option, ": a value with a line break cannot go into a unit file");
  if (!value.empty() && value.back() == '\\')
    return error(option, " '", value, "': a value ending in a backslash would continue onto the unit's next line");
  return Status::ok();
}

bool valid_env_name(const std::string& name) {  // [A-Za-z_][A-Za-z0-9_]*
  const auto word = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (name.empty() || !word(name.front())) return false;
  for (char c : name)
    if (!word(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

}  // namespace

Status check_unit_file_options(const UnitFileOptions& unit) {
  if (unit.executable.empty() || unit.executable.front() != '/')
    return error("--executable '", unit.executable, "': systemd needs an absolute path");
  DS_RETURN_IF_ERROR(check_raw_value("--executable", unit.executable));
  if (!unit.working_directory.empty() && unit.working_directory.front() != '/')
    return error("--working-directory '", unit.working_directory, "': systemd needs an absolute path");
  DS_RETURN_IF_ERROR(check_raw_value("--working-directory", unit.working_directory));
  DS_RETURN_IF_ERROR(check_raw_value("--description", unit.description));
  DS_RETURN_IF_ERROR(check_raw_value("--user", unit.user));
  if (unit.user_unit && !unit.user.empty())
    return error("--user ", unit.user, " with --user-unit: a user unit runs as the user whose service manager "
                 "starts it (systemd refuses User= there); leave out one of them");
  for (const std::string& e : unit.environment) {
    const std::size_t eq = e.find('=');
    if (eq == std::string::npos) return error("--env wants NAME=VALUE, got '", e, "'");
    if (!valid_env_name(e.substr(0, eq)))
      return error("--env '", e, "': '", e.substr(0, eq),
                   "' is not an environment variable name systemd accepts ([A-Za-z_][A-Za-z0-9_]*)");
    if (e.find_first_of("\r\n") != std::string::npos)
      return error("--env ", e.substr(0, eq), ": a value with a line break cannot go into a unit file");
  }
  return Status::ok();
}

Status make_serve_paths_absolute(ServeOptions& opts, const std::filesystem::path& cwd) {
  for (const char* name : {"model-path", "tokenizer-path", "chat-template", "speculative-token-map", "state-dir"}) {
    if (!opts.is_explicit(name)) continue;
    const std::string value = serve_option_text(opts, name);
    if (value.empty() || std::filesystem::path(value).is_absolute()) continue;
    DS_RETURN_IF_ERROR(set_serve_option(opts, name, (cwd / value).string()));
  }
  return Status::ok();
}

std::string systemd_quote(const std::string& word, bool exec) {
  bool plain = !word.empty();
  for (char c : word)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || std::string("-_./:=,+@").find(c) != std::string::npos))
      plain = false;
  std::string out;
  for (char c : word) {
    if (c == '%') out += "%%";
    else if (c == '$' && exec) out += "$$";
    else if (!plain && (c == '"' || c == '\\')) out += std::string("\\") + c;
    else out += c;
  }
  return plain ? out : "\"" + out + "\"";
}

std::string make_systemd_unit(const ServeOptions& opts, const UnitFileOptions& unit) {
  ServeOptions o = opts;
  if (o.state_dir.empty()) Status ignored = set_serve_option(o, "state-dir", default_state_dir().string());
  o.explicit_keys.erase("config");  // the unit carries the settings themselves
  std::string out;
  out += "# Written by `deltaserve systemd-unit` on " + utc_now_iso() + ".\n";
  out += "# Settings not listed are deltaserve defaults; `deltaserve config diff` compares this file\n";
  out += "# with a launch id, another unit file, a shell command or a TOML file.\n";
  out += "[Unit]\n";
  // (Description expands specifiers too: a % is written %%.)
  out += "Description=" +
         escape_specifiers(unit.description.empty() ? "deltaserve (" + o.model_path + ")" : unit.description) + "\n";
  out += "After=network-online.target\nWants=network-online.target\n\n";
  if (unit.notify) {
    out += "[Service]\nType=notify\nNotifyAccess=main\n";
    if (unit.watchdog_sec > 0)
      out += "WatchdogSec=" + std::to_string(static_cast<long long>(std::ceil(unit.watchdog_sec))) + "\n";
  } else {
    out += "[Service]\nType=simple\n";
  }
  if (!unit.user.empty()) out += "User=" + escape_specifiers(unit.user) + "\n";
  if (!unit.working_directory.empty()) out += "WorkingDirectory=" + escape_specifiers(unit.working_directory) + "\n";
  for (const auto& e : unit.environment) out += "Environment=" + systemd_quote(e, /*exec=*/false) + "\n";
  out += "ExecStart=" + systemd_quote(unit.executable) + " serve";
  std::vector<std::string> args = explicit_args(o);
  // explicit_args: "--name" and its value, or "--name" / "--name=false" alone for a switch. Told
  // apart by position, never by a leading "--" (a value may start with one: `--api-key --a%b`).
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    out += " \\\n    " + systemd_quote(flag);
    const std::string name = flag.substr(2, flag.find('=') == std::string::npos ? std::string::npos : flag.find('=') - 2);
    if (serve_flag_type(name) != FlagType::Bool && i + 1 < args.size()) out += " " + systemd_quote(args[++i]);
  }
  // Stop: SIGTERM, then --shutdown-timeout for running requests, then a margin before SIGKILL.
  const long long stop_sec = std::max(60LL, static_cast<long long>(std::ceil(o.shutdown_timeout)) + 30);
  out += "\nRestart=on-failure\nRestartSec=10\nTimeoutStartSec=900\nTimeoutStopSec=" + std::to_string(stop_sec) +
         "\nKillSignal=SIGTERM\n";
  out += "LimitNOFILE=65536\n\n[Install]\n";
  out += std::string("WantedBy=") + (unit.user_unit ? "default.target" : "multi-user.target") + "\n";
  return out;
}

}  // namespace deltaserve
