// Reading a systemd service unit the way systemd runs it: [Service]'s Environment= and
// ExecStart= (systemd.syntax(7), systemd.service(5)), for `config diff` / `config show`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace deltaserve {

// A drop-in of the unit (NAME.service.d/*.conf): read after the unit itself, in file-name order.
struct UnitDropIn {
  std::string name;  // labels errors and notes
  std::string text;
};

struct UnitExec {
  std::vector<std::string> words;                            // ExecStart=, split and expanded
  std::vector<std::pair<std::string, std::string>> environment;  // NAME, value (in order; later wins)
  std::vector<std::string> notes;                            // what was not read, and why
};

// The drop-ins systemd reads after the unit file at `unit_path` (`systemctl edit` writes overrides
// there): NAME.service.d/*.conf beside it, in file-name order, each named "<label>.d/<file>".
// Drop-ins in systemd's other directories (/run/systemd/system, ...) are not looked for. Fails on
// one that cannot be read.
Result<std::vector<UnitDropIn>> read_unit_drop_ins(const std::string& unit_path, const std::string& label);

// `name` labels errors. Fails without a [Service] ExecStart= or on a quote left open. The drop-ins'
// lines come after the unit's, as systemd reads them (systemd.unit(5)): Environment= adds, a later
// ExecStart= replaces (systemd wants an empty "ExecStart=" first, which clears it).
Result<UnitExec> read_unit_exec(const std::string& text, const std::string& name,
                                const std::vector<UnitDropIn>& drop_ins = {});

}  // namespace deltaserve
