// Config sources and their diff: `deltaserve config diff A B` where each side is a launch id, a
// systemd unit file, a shell command line or script (SGLang `python -m sglang.launch_server`,
// `sglang serve`, or `deltaserve serve`, backslash-continued), or a config file (.toml, or SGLang's
// .yaml). Both sides
// are resolved to every setting (defaults included) before they are compared.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "deploy/unit_file.h"
#include "options/serve_options.h"
#include "util/status.h"

namespace deltaserve {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct ConfigSource {
  std::string label;               // "launch #3", "sglang.service", ...
  std::string kind;                // launch | systemd-unit | command | toml | yaml
  ServeOptions options;            // defaults resolved (resolve_serve_defaults)
  KeyValues settings;              // effective settings, table order
  KeyValues environment;           // Environment= / VAR=value assignments, "env:NAME"
  KeyValues resolved;              // a launch's resolved_launch_values (launch_db.h); empty otherwise
  std::vector<std::string> notes;  // e.g. a validation problem of that configuration
  // The secret settings' own values (--api-key; `settings` has them redacted), so that a diff can
  // tell two keys apart without printing them. Empty for a launch: its record keeps none.
  KeyValues secrets;
};

// `spec`: digits = launch id (read from <state_dir>/launches.sqlite); an existing file = unit,
// TOML (.toml), YAML (.yaml / .yml) or script (by content); anything else = a command line given as text.
Result<ConfigSource> load_config_source(const std::string& spec, const std::filesystem::path& state_dir);
// The same from text already read (`name` labels errors); a unit with its drop-ins' text.
Result<ConfigSource> config_source_from_unit(const std::string& text, const std::string& name,
                                             const std::vector<UnitDropIn>& drop_ins = {});
Result<ConfigSource> config_source_from_script(const std::string& text, const std::string& name);
Result<ConfigSource> config_source_from_toml(const std::string& text, const std::string& name);
// SGLang's --config FILE.yaml (flat `flag-name: value`; parse_serve_config_yaml_text).
Result<ConfigSource> config_source_from_yaml(const std::string& text, const std::string& name);
// Either: `kind` "toml" or "yaml".
Result<ConfigSource> config_source_from_config_file(const std::string& text, const std::string& name,
                                                    const std::string& kind);
// A recorded launch: its effective settings, explicit args and environment ("env:NAME").
ConfigSource config_source_from_settings(const KeyValues& settings, const std::vector<std::string>& args,
                                         const std::string& label, KeyValues environment = {});

// Word splitting: quotes, backslash escapes, backslash-newline continuation. Shell: also comments,
// it stops at the first unquoted control operator (|, ;, &&, ||, &) and drops redirections; $VAR
// and ${VAR} are replaced from `vars` (unknown ones stay literal); ${VAR:-word}, ${VAR-word},
// ${VAR:=word} and ${VAR=word} give word where VAR is unset (one `vars` lacks) or, with the colon,
// empty; the := and = forms also append VAR=word to `assigned` (when given), which later
// expansions of this text read first. Systemd (a unit's ExecStart=,
// Environment=; systemd.syntax(7)): no shell runs, so |, &, <, > and # are plain characters of a
// word, and a word that is a lone ";" ends the command.
enum class WordSyntax { Shell, Systemd };
// A shell text's commands, split at unquoted newlines, ;, |, || and && (and a lone &; not the & of
// a redirection such as 2>&1), each as written.
std::vector<std::string> split_shell_commands(const std::string& text);
Result<std::vector<std::string>> split_command_words(
    const std::string& text, const std::vector<std::pair<std::string, std::string>>& vars = {},
    WordSyntax syntax = WordSyntax::Shell, KeyValues* assigned = nullptr);
// Finds the server launcher in a command's words and returns the arguments after it:
// [env VAR=x ...] python[3] -m sglang.launch_server ARGS | sglang serve ARGS | deltaserve serve ARGS.
// Leading VAR=value words are returned in `env`.
bool find_server_args(const std::vector<std::string>& words, std::vector<std::string>* args,
                      KeyValues* env = nullptr);

struct DiffRow {
  std::string key;
  std::string a, b;
  bool affects_performance = false;
  std::string note;  // why it matters, for performance settings
};

// Settings that differ (table order; keys only on one side appear with "(unset)").
std::vector<DiffRow> diff_settings(const KeyValues& a, const KeyValues& b);
// Environment entries ("env:NAME") that differ, with why they matter.
std::vector<DiffRow> diff_environment(const KeyValues& a, const KeyValues& b);
// A launch's resolved values (plan capacities, device, version, host, model hashes) that differ.
std::vector<DiffRow> diff_resolved(const KeyValues& a, const KeyValues& b);
// Settings, then environment, then (when both sides are launches) resolved values.
std::vector<DiffRow> diff_sources(const ConfigSource& a, const ConfigSource& b);
std::string render_diff(const std::vector<DiffRow>& rows, const std::string& label_a, const std::string& label_b);
std::string diff_json(const std::vector<DiffRow>& rows, const ConfigSource& a, const ConfigSource& b);

}  // namespace deltaserve
