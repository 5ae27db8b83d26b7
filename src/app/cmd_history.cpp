// `deltaserve history`: recorded launches with their key settings and best measured throughput.
//   deltaserve history [--model SUBSTRING] [--json] [--state-dir DIR] [--limit N]
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "app/cli_args.h"
#include "app/commands.h"
#include "options/serve_options.h"
#include "deploy/cli_split.h"
#include "deploy/launch_db.h"
#include "util/json_parse.h"

namespace deltaserve {

int cmd_history(const Args& in_args) {
  std::vector<std::string> args = in_args;
  for (auto& a : args)
    if (a == "-h") a = "--help";
  auto help = take_last(args, "help", false);
  auto json = help ? take_last(args, "json", false) : help;
  auto model = json ? take_last(args, "model", true) : json;
  auto state_dir = model ? take_last(args, "state-dir", true) : model;
  auto limit = state_dir ? take_last(args, "limit", true) : state_dir;
  if (!limit) {
    std::fprintf(stderr, "deltaserve history: %s\n", limit.status().message().c_str());
    return 2;
  }
  if (!args.empty()) {
    std::fprintf(stderr, "deltaserve history: unknown argument '%s'\n", args[0].c_str());
    return 2;
  }
  if (help->has_value()) {
    std::printf("usage: deltaserve history [--model SUBSTRING] [--json] [--state-dir DIR] [--limit N]\n"
                "Lists recorded `serve` launches (newest first) with key settings and the best measured\n"
                "output throughput (from `deltaserve bench`).\n");
    return 0;
  }
  int n = 50;
  if (limit->has_value()) {
    auto v = parse_int("limit", **limit);
    if (!v || *v < 1 || *v > 1000000) {
      std::fprintf(stderr, "deltaserve history: --limit must be 1..1000000 (got '%s')\n", (*limit)->c_str());
      return 2;
    }
    n = static_cast<int>(*v);
  }
  const std::filesystem::path dir = state_dir->has_value() ? std::filesystem::path(**state_dir) : default_state_dir();
  auto db = LaunchDb::open_for_reading(dir);
  if (!db) {
    std::fprintf(stderr, "deltaserve history: %s\n", db.status().message().c_str());
    return 1;
  }
  if (!*db) {  // nothing recorded there (and nothing created)
    if (json->has_value()) std::printf("[]\n");
    else std::printf("no launches recorded in %s (no launch database there)\n", LaunchDb::file_in(dir).c_str());
    return 0;
  }
  auto launches = (*db)->list(model->value_or(""), n);
  if (!launches) {
    std::fprintf(stderr, "deltaserve history: %s\n", launches.status().message().c_str());
    return 1;
  }
  if (json->has_value()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& l : *launches) {
      nlohmann::ordered_json cfg = nlohmann::ordered_json::object(), derived = nlohmann::ordered_json::object();
      for (const auto& [k, v] : l.config) cfg[k] = v;
      for (const auto& [k, v] : l.derived) derived[k] = v;
      out.push_back({{"launch_id", l.id}, {"started_at", l.started_at}, {"stopped_at", l.stopped_at},
                     {"exit_status", l.exit_status}, {"state", launch_state(l)}, {"pid", l.pid},
                     {"boot_id", l.boot_id}, {"hostname", l.hostname}, {"hardware", l.host_summary},
                     {"version", l.version}, {"model_path", l.model.path}, {"model_config_hash", l.model.config_hash},
                     {"weight_index_hash", l.model.weight_index_hash},
                     {"best_output_tokens_per_s", l.best_output_tokens_per_s},
                     {"best_concurrency", l.best_concurrency}, {"measurements", l.n_measurements},
                     {"args", l.args}, {"config", cfg}, {"derived", derived}});
    }
    std::printf("%s\n", dump_lossy(out, 2).c_str());
    return 0;
  }
  if (launches->empty()) {
    if (model->has_value())
      std::printf("no launches of a model matching '%s' in %s\n", (*model)->c_str(), (*db)->path().c_str());
    else
      std::printf("no launches recorded in %s\n", (*db)->path().c_str());
    return 0;
  }
  std::printf("%4s  %-20s  %-9s  %-28s  %2s  %4s  %8s  %8s  %5s  %5s  %s\n", "id", "started (UTC)", "status", "model",
              "tp", "mtp", "context", "running", "mem", "ratio", "best tok/s");
  bool any_resolved = false;
  for (const auto& l : *launches) {
    auto get = [&](const char* k) {
      std::string v = l.config_value(k);
      return v.empty() ? std::string("-") : v;
    };
    // A setting left to auto shows what the launch's plan made of it, marked "*".
    auto resolved = [&](const char* k, const char* plan_key, bool fraction) {
      std::string v = get(k);
      if (v != "-" && v != "auto" && v != "0") return v;
      for (const auto& [dk, dv] : l.derived)
        if (dk == plan_key && !dv.empty()) {
          if (!fraction) return any_resolved = true, dv + "*";
          const double f = std::strtod(dv.c_str(), nullptr);
          if (f <= 0) break;  // the CPU's plan has no fraction
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.2f*", f);
          any_resolved = true;
          return std::string(buf);
        }
      return v;
    };
    std::string model_name = l.model.path;
    if (model_name.size() > 28) model_name = "..." + model_name.substr(model_name.size() - 25);
    std::string status = launch_state(l);
    if (status.size() > 9 && status.rfind("failed", 0) == 0) status = "failed";  // the column; --json has all
    // MTP draft steps: what the start-up probe chose ("*" where it differs from the setting).
    std::string spec = get("speculative-algorithm") == "-" ? "off" : get("speculative-num-steps");
    for (const auto& [dk, dv] : l.derived)
      if (dk == "spec.num_steps" && spec != "off" && dv != spec) spec = dv + "*", any_resolved = true;
    std::string best = l.n_measurements ? std::to_string(static_cast<long long>(l.best_output_tokens_per_s + 0.5)) +
                                              " @" + std::to_string(l.best_concurrency)
                                        : "-";
    std::printf("%4lld  %-20s  %-9s  %-28s  %2s  %4s  %8s  %8s  %5s  %5s  %s\n", static_cast<long long>(l.id),
                l.started_at.c_str(), status.c_str(), model_name.c_str(), get("tp-size").c_str(), spec.c_str(),
                resolved("context-length", "plan.context_length", false).c_str(),
                resolved("max-running-requests", "plan.max_running_requests", false).c_str(),
                resolved("mem-fraction-static", "plan.mem_fraction_static", true).c_str(),
                get("mamba-full-memory-ratio").c_str(), best.c_str());
  }
  if (any_resolved) std::printf("(* auto: the value the launch chose: its memory plan, or its MTP probe)\n");
  std::printf("(%s; `deltaserve config diff ID1 ID2` compares two launches)\n", (*db)->path().c_str());
  return 0;
}

}  // namespace deltaserve
