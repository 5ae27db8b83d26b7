#include "deploy/plan_input.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "model/token_map.h"
#include "util/json_parse.h"

namespace deltaserve {

PlanDevice resolve_plan_device(const ServeOptions& opts, const HostInfo& host, bool cuda_built) {
  if (opts.device == "cpu") return PlanDevice::Cpu;
  if (opts.device == "cuda") return PlanDevice::Cuda;
  return cuda_built && !host.gpus.empty() ? PlanDevice::Cuda : PlanDevice::Cpu;
}

Status check_device_flags(const ServeOptions& o, PlanDevice device) {
  if (device == PlanDevice::Cuda) {
    if (o.is_explicit("max-memory"))
      return error("--max-memory is the CPU's memory budget; on GPUs use --mem-fraction-static (this run is on CUDA)");
    if (o.dtype == "float32")
      return error("--dtype float32: the CUDA matmuls read bfloat16 weights; use --dtype bfloat16 or auto (float32 "
                   "weights are built on the CPU, --device cpu)");
    if (o.enable_deterministic_inference)
      return error("--enable-deterministic-inference: the CUDA kernels are not batch invariant (cuBLAS picks its GEMM "
                   "algorithms by row count), so a request's tokens can depend on what it is batched with; the CPU's "
                   "kernels are (--device cpu), or remove the flag");
    return Status::ok();
  }
  const std::vector<std::string> gpu = explicit_gpu_only_flags(o);
  if (gpu.empty()) return Status::ok();
  std::string names;
  for (const auto& n : gpu) names += (names.empty() ? "" : ", ") + n;
  return error(names, gpu.size() == 1 ? " applies" : " apply", " to GPUs (--device cuda); this run is on the CPU: remove ",
               gpu.size() == 1 ? "it" : "them");
}

PrefillBudget resolve_prefill_budget(const ServeOptions& o, PlanDevice device) {
  PrefillBudget b;
  b.chunked_prefill_size = o.chunked_prefill_size > 0 ? o.chunked_prefill_size : device == PlanDevice::Cuda ? 8192 : 512;
  // Auto: one chunk a step, as SGLang budgets a step's prefill (its chunked-prefill size bounds the
  // tokens of every request's chunk together); the runner's activations scale with it.
  b.max_prefill_tokens = o.max_prefill_tokens > 0 ? o.max_prefill_tokens : b.chunked_prefill_size;
  return b;
}

MemoryPlanInput memory_plan_input(const ServeOptions& o, PlanDevice device, int64_t device_memory_bytes,
                                  const HostInfo& host) {
  MemoryPlanInput in;
  in.device = device;
  in.tp_size = static_cast<int>(o.tp_size);
  in.dp_size = static_cast<int>(std::max<int64_t>(1, o.dp_size));
  if (device_memory_bytes <= 0) {
    if (device == PlanDevice::Cuda) {
      int64_t smallest = 0;
      for (const auto& g : host.gpus)
        if (smallest == 0 || g.memory_bytes < smallest) smallest = g.memory_bytes;
      device_memory_bytes = smallest;
    } else {
      device_memory_bytes = host.ram_available_bytes;
    }
  }
  in.device_memory_bytes = device_memory_bytes;
  in.mem_fraction_static = o.mem_fraction_static;
  in.max_memory_bytes = o.max_memory;
  const bool cuda = device == PlanDevice::Cuda;
  // The matmul weights as the engine loads them (--dtype; auto: bf16, the checkpoints'). An f32
  // checkpoint under auto on the CPU loads in f32: the plan then counts half its weights' bytes.
  in.weight_bytes_per_param = o.dtype == "float32" ? 4 : 2;
  in.kv_cache_dtype = resolve_kv_cache_dtype(o, device);
  in.kv_bytes_per_elem = static_cast<int64_t>(dtype_size(in.kv_cache_dtype));
  if (o.mamba_ssm_dtype == "float32") in.state_dtype = DType::F32;
  if (o.mamba_ssm_dtype == "bfloat16") in.state_dtype = DType::BF16;
  in.kv_block_size = static_cast<int>(o.page_size);
  in.context_length = o.context_length;
  in.max_running_requests = o.max_running_requests;
  in.max_total_tokens = o.max_total_tokens;
  in.max_state_slots = o.max_mamba_cache_size;
  in.prefix_cache = !o.disable_radix_cache;
  in.mamba_full_memory_ratio = o.mamba_full_memory_ratio;
  in.mamba_full_memory_ratio_explicit = o.is_explicit("mamba-full-memory-ratio");
  in.spec_num_steps = o.speculative_enabled() ? static_cast<int>(o.speculative_num_steps) : 0;
  const PrefillBudget pb = resolve_prefill_budget(o, device);
  in.chunked_prefill_size = pb.chunked_prefill_size;
  in.max_prefill_tokens = pb.max_prefill_tokens;
  in.cuda_graphs = cuda && !o.disable_cuda_graph;
  in.cpu_threads = o.threads > 0 ? static_cast<int>(o.threads) : std::max(1, host.n_cpus);
  return in;
}

Result<std::vector<int32_t>> plan_token_map(const ServeOptions& opts, const ModelConfig& config, MemoryPlanInput& in) {
  if (in.spec_num_steps == 0 || opts.speculative_token_map.empty()) return std::vector<int32_t>();
  DS_ASSIGN_OR_RETURN(std::vector<int32_t> ids, read_token_map(opts.speculative_token_map, config.vocab_size));
  in.draft_vocab_size = static_cast<int64_t>(ids.size());
  return ids;
}

DType resolve_kv_cache_dtype(const ServeOptions& o, PlanDevice device) {
  if (o.kv_cache_dtype == "bf16" || o.kv_cache_dtype == "bfloat16") return DType::BF16;
  if (o.kv_cache_dtype == "fp8_e4m3") return DType::F8E4M3;
  if (o.kv_cache_dtype == "fp8_e5m2") return DType::F8E5M2;
  // auto: bf16 on a GPU (as SGLang with a bf16 model); f32 on the CPU, where the cache is small
  // next to the RAM and f32 attention is the fastest path.
  return device == PlanDevice::Cuda ? DType::BF16 : DType::F32;
}

std::string memory_plan_json(const MemoryPlan& p, const MemoryPlanInput& in) {
  nlohmann::ordered_json j;
  j["device"] = in.device == PlanDevice::Cuda ? "cuda" : "cpu";
  j["tp_size"] = in.tp_size;
  j["device_memory_bytes"] = in.device_memory_bytes;
  j["device_memory_used_bytes"] = in.device_memory_used_bytes;
  j["budget_bytes"] = p.budget_bytes;
  j["mem_fraction_static"] = p.mem_fraction_static;
  j["n_params"] = p.n_params;
  j["weights_bytes_per_gpu"] = p.weights_bytes_per_gpu;
  j["activation_reserve_bytes"] = p.activation_reserve_bytes;
  j["cache_bytes"] = p.cache_bytes;
  j["kv_budget_bytes"] = p.kv_budget_bytes;
  j["state_budget_bytes"] = p.state_budget_bytes;
  j["kv_bytes_per_token_per_gpu"] = p.kv_bytes_per_token_per_gpu;
  j["state_bytes_per_request_per_gpu"] = p.state_bytes_per_request_per_gpu;
  j["state_pending_depth"] = p.pending_depth;
  j["kv_tokens"] = p.kv_tokens;
  j["state_slots"] = p.state_slots;
  j["max_running_requests"] = p.max_running_requests;
  j["context_length"] = p.context_length;
  // The same figures under SGLang's names (/get_server_info reports these for the running engine).
  j["max_total_num_tokens"] = p.kv_tokens;
  j["max_mamba_cache_size"] = p.state_slots + p.checkpoint_slots;
  j["checkpoint_slots"] = p.checkpoint_slots;
  j["prefix_cache"] = in.prefix_cache;
  j["kv_cache_dtype"] = std::string(dtype_name(in.kv_cache_dtype));
  j["ok"] = p.ok();
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& r : p.rows)
    rows.push_back({{"item", r.item}, {"value", r.value}, {"detail", r.detail}, {"bound_by", r.bound_by},
                    {"to_raise", r.to_raise}});
  j["rows"] = rows;
  j["warnings"] = p.warnings;
  j["errors"] = p.errors;
  return dump_lossy(j, 2);
}

}  // namespace deltaserve
