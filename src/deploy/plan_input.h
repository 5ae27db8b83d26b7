// Glue between the serve flags and the memory plan: which device, how much memory, and the
// MemoryPlanInput that serve, `deltaserve plan` and the launch records all compute the same way.
#pragma once

#include <string>
#include <vector>

#include "options/serve_options.h"
#include "deploy/hardware.h"
#include "cache/memory_plan.h"
#include "core/dtype.h"
#include "model/config.h"

namespace deltaserve {

// --device auto: cuda when the host has GPUs and this build's CUDA backend sees one (`cuda_built`:
// backend_factory.h cuda_available(), as serve's setup_engine passes it), else cpu. No default, so
// that `plan` and `serve` cannot resolve it differently.
PlanDevice resolve_plan_device(const ServeOptions& opts, const HostInfo& host, bool cuda_built);

// --chunked-prefill-size and --max-prefill-tokens with "auto" resolved (8192 on a GPU, 512 on the
// CPU; the step budget one chunk). The one place these defaults are decided.
struct PrefillBudget {
  int64_t chunked_prefill_size = 0;
  int64_t max_prefill_tokens = 0;
};
// Settings that mean nothing on `device`, refused by name (plan and serve alike): the GPU-only
// ones (explicit_gpu_only_flags) on the CPU, --max-memory (the CPU's budget) on GPUs.
Status check_device_flags(const ServeOptions& opts, PlanDevice device);

PrefillBudget resolve_prefill_budget(const ServeOptions& opts, PlanDevice device);

// --kv-cache-dtype resolved for the device.
DType resolve_kv_cache_dtype(const ServeOptions& opts, PlanDevice device);

// device_memory_bytes: per GPU for Cuda (0 = take it from host.gpus), RAM for Cpu (0 = host
// available RAM).
MemoryPlanInput memory_plan_input(const ServeOptions& opts, PlanDevice device,
                                  int64_t device_memory_bytes, const HostInfo& host);

// --speculative-token-map read (model/token_map.h) when speculative decoding is on, its size
// put in `in` (the memory plan copies the map's lm_head rows); empty without a map.
Result<std::vector<int32_t>> plan_token_map(const ServeOptions& opts, const ModelConfig& config, MemoryPlanInput& in);

// The plan as JSON (keys relied on outside the repo: weights_bytes_per_gpu,
// kv_bytes_per_token_per_gpu, state_bytes_per_request_per_gpu, kv_tokens, max_running_requests,
// context_length), plus rows, warnings and errors.
std::string memory_plan_json(const MemoryPlan& plan, const MemoryPlanInput& input);

}  // namespace deltaserve
