// Reading a systemd service unit the way systemd runs it: [Service]'s Environment= and
// ExecStart= (systemd.syntax(7), systemd.service(5)), for `config diff` / `config show`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

struct UnitExec {
  std::vector<std::string> words;                            // ExecStart=, split and expanded
  std::vector<std::pair<std::string, std::string>> environment;  // NAME, value (in order; later wins)
  std::vector<std::string> notes;                            // what was not read, and why
};

// `name` labels errors. Fails without a [Service] ExecStart= or on a quote left open.
Result<UnitExec> read_unit_exec(const std::string& text, const std::string& name);

}  // namespace deltaserve
