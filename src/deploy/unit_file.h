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

// systemd's system unit directories, highest priority first (systemd.unit(5)).
inline const std::vector<std::string> kSystemdUnitDirs = {"/etc/systemd/system", "/run/systemd/system",
                                                          "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
                                                          "/lib/systemd/system"};

// The drop-ins systemd reads after the unit file at `unit_path` (`systemctl edit` writes overrides
// there), in file-name order, each named by its path. *.conf files in NAME.service.d beside the
// unit; and when the unit lives in one of `unit_dirs` (systemd's own), in each of them: NAME.d,
// then the unit name's dash prefixes (a-b-.service.d, a-.service.d) and the type's (service.d).
// A file name met again later (a lower-priority directory, a less specific name) is masked, as
// systemd masks it. Fails on one that cannot be read.
Result<std::vector<UnitDropIn>> read_unit_drop_ins(const std::string& unit_path, const std::string& label,
                                                   const std::vector<std::string>& unit_dirs = kSystemdUnitDirs);

// `name` labels errors. Fails without a [Service] ExecStart= or on a quote left open. The drop-ins'
// lines come after the unit's, as systemd reads them (systemd.unit(5)): Environment= adds, a later
// ExecStart= replaces (systemd wants an empty "ExecStart=" first, which clears it).
Result<UnitExec> read_unit_exec(const std::string& text, const std::string& name,
                                const std::vector<UnitDropIn>& drop_ins = {});

}  // namespace deltaserve
