#include "app/cli_args.h"

#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdlib>

#include "options/serve_options.h"

namespace deltaserve {

bool CliArgs::takes_value(const std::string& serve_flag, const std::string& next) {
  const FlagSpec* f = find_serve_flag(serve_flag);
  if (f == nullptr) return next.rfind("--", 0) != 0;
  return f->type != FlagType::Bool;
}

Status CliArgs::refuse_bool_word(const std::string& serve_flag, const std::string& next) {
  const FlagSpec* f = find_serve_flag(serve_flag);
  if (f == nullptr || f->type != FlagType::Bool) return Status::ok();
  return refuse_separate_bool_value(*f, next);
}

Result<int> parse_top_k(const std::string& text) {
  auto v = parse_int("top-k", text);
  if (!v) return v.status();
  if (*v != -1 && (*v < 1 || *v > INT32_MAX)) return error("--top-k must be -1 (off) or 1..", INT32_MAX, " (got ", text, ")");
  return static_cast<int>(*v);
}

Result<long long> parse_int(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    return error("--", option, ": '", text, "' is not an integer");
  return v;
}

Result<double> parse_double(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    return error("--", option, ": '", text, "' is not a finite number");
  return v;
}

Result<std::vector<int>> parse_int_list(const std::string& option, const std::string& text) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto v = parse_int(option, item);
    if (!v) return v.status();
    if (*v < INT32_MIN || *v > INT32_MAX) return error("--", option, ": ", item, " out of range");
    out.push_back(static_cast<int>(*v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace deltaserve
