#include "deploy/cli_split.h"

namespace deltaserve {

Result<std::vector<std::string>> take_option(std::vector<std::string>& args, const std::string& name, bool has_value) {
  std::vector<std::string> values, rest;
  const std::string flag = "--" + name;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == flag) {
      if (!has_value) {
        values.push_back("true");
      } else {
        if (i + 1 >= args.size()) return error("option ", flag, " needs a value");
        values.push_back(args[++i]);
      }
    } else if (a.rfind(flag + "=", 0) == 0) {
      if (!has_value) return error("option ", flag, " takes no value");
      values.push_back(a.substr(flag.size() + 1));
    } else {
      rest.push_back(a);
    }
  }
  args = std::move(rest);
  return values;
}

Result<std::optional<std::string>> take_last(std::vector<std::string>& args, const std::string& name, bool has_value) {
  auto v = take_option(args, name, has_value);
  if (!v) return v.status();
  if (v->empty()) return std::optional<std::string>();
  return std::optional<std::string>(v->back());
}

}  // namespace deltaserve
