#include "deploy/systemd_unit.h"

#include "deploy/launch_db.h"

#include <algorithm>
#include <cmath>

namespace deltaserve {

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
  std::string description = unit.description.empty() ? "deltaserve (" + o.model_path + ")" : unit.description;
  for (std::size_t i = 0; (i = description.find('%', i)) != std::string::npos; i += 2) description.insert(i, "%");
  out += "Description=" + description + "\n";
  out += "After=network-online.target\nWants=network-online.target\n\n";
  if (unit.notify) {
    out += "[Service]\nType=notify\nNotifyAccess=main\n";
    if (unit.watchdog_sec > 0)
      out += "WatchdogSec=" + std::to_string(static_cast<long long>(std::ceil(unit.watchdog_sec))) + "\n";
  } else {
    out += "[Service]\nType=simple\n";
  }
  if (!unit.user.empty()) out += "User=" + unit.user + "\n";
  if (!unit.working_directory.empty()) out += "WorkingDirectory=" + unit.working_directory + "\n";
  for (const auto& e : unit.environment) out += "Environment=" + systemd_quote(e, /*exec=*/false) + "\n";
  out += "ExecStart=" + systemd_quote(unit.executable) + " serve";
  std::vector<std::string> args = explicit_args(o);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) == 0) out += " \\\n    " + args[i];
    else out += " " + systemd_quote(args[i]);
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
