// Separating a subcommand's own options from the serve flags that follow them
// (`deltaserve plan --json --gpu-memory 48GiB --tp-size 2 ...`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace deltaserve {

// Removes every `--name VALUE` / `--name=VALUE` (has_value) or `--name` from args and returns the
// values (for a flag, one "true" per occurrence). A missing value is an error naming the option.
Result<std::vector<std::string>> take_option(std::vector<std::string>& args, const std::string& name, bool has_value);

// The last value of take_option, if any.
Result<std::optional<std::string>> take_last(std::vector<std::string>& args, const std::string& name, bool has_value);

}  // namespace deltaserve
