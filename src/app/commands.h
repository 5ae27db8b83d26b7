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
int cmd_chat_template(const Args& args);
int cmd_serve(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_token_map(const Args& args);

// Deployment (serve_options, memory plan, launch records): cmd_plan.cpp, cmd_history.cpp, ...
int cmd_plan(const Args& args);
int cmd_history(const Args& args);
int cmd_config(const Args& args);
int cmd_bench(const Args& args);
int cmd_systemd_unit(const Args& args);

}  // namespace deltaserve
