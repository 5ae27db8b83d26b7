// `deltaserve systemd-unit`: a unit file that runs `deltaserve serve` with the current settings,
// so the configuration lives in one reviewed file instead of in shell history.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "options/serve_options.h"
#include "util/status.h"

namespace deltaserve {

struct UnitFileOptions {
  std::string executable;         // absolute path of the deltaserve binary
  std::string description;        // "" = "deltaserve (<model>)"
  std::string user;               // "" = no User= line (root for system units); not with user_unit
  std::string working_directory;  // "" = none; else absolute
  std::vector<std::string> environment;  // "NAME=value"
  bool user_unit = false;         // WantedBy=default.target instead of multi-user.target
  // Type=notify (the binary sends READY=1 once it serves; systemd's start waits for it) and,
  // with watchdog_sec > 0, WatchdogSec= (serve pings while its engine makes progress). Set when
  // the binary was built with libsystemd; Type=simple otherwise.
  bool notify = false;
  double watchdog_sec = 0;
};

// What systemd would misread or refuse, each error naming the option (--executable,
// --working-directory, --description, --user, --env, --user-unit): an executable or working
// directory that is not an absolute path; a line break in any value, or a Description=, User= or
// WorkingDirectory= value ending in a backslash (written raw, it would continue onto the next
// line); an environment name outside [A-Za-z_][A-Za-z0-9_]* (systemd ignores the assignment);
// User= in a user unit (a user's service manager cannot switch users).
Status check_unit_file_options(const UnitFileOptions& unit);

// The path-valued serve settings (--model-path, --tokenizer-path, --chat-template,
// --speculative-token-map, --state-dir) made absolute against `cwd`: the service runs from / (or
// its WorkingDirectory=), not from where the unit was written.
Status make_serve_paths_absolute(ServeOptions& opts, const std::filesystem::path& cwd);

// Every explicit setting appears as a flag in ExecStart=; --state-dir is pinned to the resolved
// folder so that launches of the service are recorded in a known place. Flag names and values are
// told apart by position (a flag, then its value unless it is a switch), and every value is
// quoted with systemd_quote, so a value that starts with "--" is still a quoted value. `unit` is
// expected to pass check_unit_file_options; % in Description=, User= and WorkingDirectory= is
// written %% (systemd expands specifiers there).
std::string make_systemd_unit(const ServeOptions& opts, const UnitFileOptions& unit);

// Quotes one word for ExecStart= (systemd's own quoting rules: "…" with \" and \\; $ as $$,
// % as %%). For Environment= (`exec` false) a $ stays as it is: systemd expands no variables
// there, so $$ would reach the process as $$.
std::string systemd_quote(const std::string& word, bool exec = true);

}  // namespace deltaserve
