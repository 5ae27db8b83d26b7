// `deltaserve plan`: the memory plan `serve` would use for these flags, explained.
//   deltaserve plan --model DIR | --model-config FILE [--gpu-memory 48GiB|detect] [--tp-size N]
//                   [serve flags...] [--json]
#include <cstdio>

#include "app/commands.h"
#include "backend/backend_factory.h"
#include "options/serve_options.h"
#include "deploy/cli_split.h"
#include "deploy/hardware.h"
#include "deploy/plan_input.h"
#include "cache/memory_plan.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "server/tool_call_parser.h"

namespace deltaserve {
namespace {

constexpr const char* kUsage =
    "usage: deltaserve plan [--model DIR | --model-config FILE] [--gpu-memory SIZE|detect]\n"
    "                       [--tp-size N] [serve flags...] [--json]\n"
    "Prints the memory plan `deltaserve serve` would use with these flags: weights, KV bytes per\n"
    "token, GDN state per request, activation reserve, then KV tokens, state slots, max running\n"
    "requests and context length, each with the limit that bound it and what to change to raise it.\n"
    "  --model-config FILE   a config.json instead of a model directory\n"
    "  --gpu-memory SIZE     memory of each GPU (e.g. 48GiB), or `detect` (nvidia-smi); implies cuda\n"
    "  --json                machine-readable output\n"
    "Exit status 1 when an explicit setting cannot fit (the message says what would).\n"
    "Serve flags: see `deltaserve serve --help`.\n";

}  // namespace

int cmd_plan(const Args& in_args) {
  std::vector<std::string> args = in_args;
  auto json = take_last(args, "json", false);
  auto config_file = json ? take_last(args, "model-config", true) : json;
  auto gpu_memory = config_file ? take_last(args, "gpu-memory", true) : config_file;
  if (!gpu_memory) {
    std::fprintf(stderr, "deltaserve plan: %s\n", gpu_memory.status().message().c_str());
    return 2;
  }
  auto opts_r = parse_serve_options(args);
  if (!opts_r) {
    std::fprintf(stderr, "deltaserve plan: %s\n", opts_r.status().message().c_str());
    return 2;
  }
  ServeOptions opts = std::move(*opts_r);
  if (opts.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // No model given: the bundled one, as serve does.
  std::string model_source = config_file->value_or(opts.model_path.empty() ? default_model_dir() : opts.model_path);
  auto config = load_model_config(model_source);
  if (!config) {
    std::fprintf(stderr, "deltaserve plan: %s\n", config.status().message().c_str());
    return 2;
  }
  // What serve checks before it plans, plan checks too (exit 2 as serve's).
  Status early = check_tp_split(*config, static_cast<int>(opts.tp_size), model_source);
  if (early) early = tool_parser_kind_from_name(opts.tool_call_parser).status();
  if (early && gpu_memory->has_value() && opts.device == "cpu")
    early = error("--gpu-memory sizes GPUs; it does not apply with --device cpu (the CPU's budget is --max-memory)");
  if (!early) {
    std::fprintf(stderr, "deltaserve plan: %s\n", early.message().c_str());
    return 2;
  }
  // The device as serve's setup_engine resolves it (engine_setup.cpp): a GPU counts only where this
  // build's CUDA backend sees one (cuda_available), not wherever nvidia-smi lists one, so a CPU-only
  // build on a GPU host, or CUDA_VISIBLE_DEVICES="", plans for the CPU that serve then runs on.
  const bool cuda_usable = cuda_available();
  HostInfo host = detect_host(cuda_usable);
  PlanDevice device;
  int64_t device_memory = 0;
  if (gpu_memory->has_value() && opts.device != "cpu") {
    device = PlanDevice::Cuda;
    if (**gpu_memory != "detect") {
      auto bytes = parse_byte_size("gpu-memory", **gpu_memory);
      if (!bytes || *bytes <= 0) {
        std::fprintf(stderr, "deltaserve plan: %s\n",
                     bytes ? "--gpu-memory must be positive" : bytes.status().message().c_str());
        return 2;
      }
      device_memory = *bytes;
    } else if (host.gpus.empty()) {
      std::fprintf(stderr, "deltaserve plan: --gpu-memory detect: no GPU found (nvidia-smi); pass "
                           "--gpu-memory SIZE, or --device cpu\n");
      return 2;
    }
  } else {
    // No --gpu-memory: plan for the GPUs of this host when there are any (and --device allows).
    device = resolve_plan_device(opts, host, cuda_usable);
    if (device == PlanDevice::Cuda && (!cuda_usable || host.gpus.empty())) {
      std::fprintf(stderr, "deltaserve plan: --device cuda: this build has no CUDA backend, or no CUDA device is "
                           "visible; pass --gpu-memory SIZE to plan for a GPU\n");
      return 2;
    }
  }
  if (Status s = check_device_flags(opts, device); !s) {
    std::fprintf(stderr, "deltaserve plan: %s\n", s.message().c_str());
    return 2;
  }
  MemoryPlanInput input = memory_plan_input(opts, device, device_memory, host);
  // serve measures what its CUDA context takes; here it is the documented assumption.
  if (device == PlanDevice::Cuda) input.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
  if (auto map = plan_token_map(opts, *config, input); !map.is_ok()) {
    std::fprintf(stderr, "deltaserve plan: %s\n", map.status().message().c_str());
    return 2;
  }
  MemoryPlan plan = plan_memory(*config, input);
  if (json->has_value()) {
    std::printf("%s\n", memory_plan_json(plan, input).c_str());
  } else {
    std::printf("model %s (%s)\n", model_source.c_str(), config->architecture.c_str());
    if (device == PlanDevice::Cpu) std::printf("device cpu\n");
    std::fputs(render_memory_plan(plan).c_str(), stdout);
    for (const auto& w : unsupported_option_warnings(opts)) std::printf("warning: %s\n", w.c_str());
  }
  return plan.ok() ? 0 : 1;
}

}  // namespace deltaserve
