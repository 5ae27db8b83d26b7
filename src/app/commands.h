// One function per `deltaserve` subcommand. Each takes the arguments after the subcommand name
// and returns the process exit code. main.cpp holds the one table that maps names to these.
#pragma once

#include <string>
#include <vector>

namespace deltaserve {

using Args = std::vector<std::string>;

int cmd_logits(const Args& args);
int cmd_generate(const Args& args);
int cmd_bench_offline(const Args& args);

}  // namespace deltaserve
