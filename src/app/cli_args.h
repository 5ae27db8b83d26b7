// A small option parser for subcommands: `--name value`, `--name=value` and boolean `--name`.
// Every option must be declared; an unknown one is an error naming it.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "util/status.h"

namespace deltaserve {

class CliArgs {
 public:
  // value_options take a value; flag_options are booleans.
  CliArgs(std::set<std::string> value_options, std::set<std::string> flag_options)
      : value_options_(std::move(value_options)), flag_options_(std::move(flag_options)) {}

  // Without `serve_flags`, an undeclared option is an error. With it, undeclared options (and
  // their values: every serve flag takes one but the booleans) are passed through there, for the
  // one flag table to parse (src/options/serve_options.h).
  Status parse(const std::vector<std::string>& args, std::vector<std::string>* serve_flags = nullptr) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      // -h is --help wherever --help is declared (as for serve and the top level).
      const std::string& a = args[i] == "-h" && flag_options_.count("help") ? std::string("--help") : args[i];
      if (a.rfind("--", 0) != 0) return error("unexpected argument '", a, "'");
      std::string name = a.substr(2), value;
      bool has_value = false;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (flag_options_.count(name)) {
        if (has_value) return error("option --", name, " takes no value");
        flags_.insert(name);
      } else if (value_options_.count(name)) {
        if (!has_value) {
          if (i + 1 >= args.size()) return error("option --", name, " needs a value");
          value = args[++i];
        }
        values_[name] = value;
      } else if (serve_flags) {
        serve_flags->push_back(a);
        // A name the table does not know takes the next word unless it is an option itself:
        // the table then refuses the name, rather than the word being taken for an argument.
        if (!has_value && i + 1 < args.size()) {
          if (takes_value(name, args[i + 1])) {
            serve_flags->push_back(args[++i]);
          } else if (Status s = refuse_bool_word(name, args[i + 1]); !s) {
            return s;
          }
        }
      } else {
        return error("unknown option --", name);
      }
    }
    return Status::ok();
  }

  bool has(const std::string& name) const { return values_.count(name) || flags_.count(name); }
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  std::optional<std::string> get(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  std::string get_or(const std::string& name, const std::string& fallback) const {
    auto v = get(name);
    return v ? *v : fallback;
  }

 private:
  static bool takes_value(const std::string& serve_flag, const std::string& next);
  // `--bool-serve-flag false`: refused as the serve parser refuses it (refuse_separate_bool_value).
  static Status refuse_bool_word(const std::string& serve_flag, const std::string& next);
  std::set<std::string> value_options_, flag_options_;
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

// Strict numeric parsing with an error that names the option.
Result<long long> parse_int(const std::string& option, const std::string& text);
Result<double> parse_double(const std::string& option, const std::string& text);
Result<std::vector<int>> parse_int_list(const std::string& option, const std::string& text);
// --top-k as SGLang takes it: -1 (off) or at least 1.
Result<int> parse_top_k(const std::string& text);

}  // namespace deltaserve
