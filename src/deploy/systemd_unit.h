// `deltaserve systemd-unit`: a unit file that runs `deltaserve serve` with the current settings,
// so the configuration lives in one reviewed file instead of in shell history.
#pragma once

#include <string>
#include <vector>

#include "options/serve_options.h"

namespace deltaserve {

struct UnitFileOptions {
  std::string executable;         // absolute path of the deltaserve binary
  std::string description;        // "" = "deltaserve (<model>)"
  std::string user;               // "" = no User= line (root for system units)
  std::string working_directory;  // "" = none
  std::vector<std::string> environment;  // "NAME=value"
  bool user_unit = false;         // WantedBy=default.target instead of multi-user.target
  // Type=notify (the binary sends READY=1 once it serves; systemd's start waits for it) and,
  // with watchdog_sec > 0, WatchdogSec= (serve pings while its engine makes progress). Set when
  // the binary was built with libsystemd; Type=simple otherwise.
  bool notify = false;
  double watchdog_sec = 0;
};

// Every explicit setting appears as a flag in ExecStart=; --state-dir is pinned to the resolved
// folder so that launches of the service are recorded in a known place.
std::string make_systemd_unit(const ServeOptions& opts, const UnitFileOptions& unit);

// Quotes one word for ExecStart= (systemd's own quoting rules: "…" with \" and \\; $ as $$,
// % as %%). For Environment= (`exec` false) a $ stays as it is: systemd expands no variables
// there, so $$ would reach the process as $$.
std::string systemd_quote(const std::string& word, bool exec = true);

}  // namespace deltaserve
