// The memory plan: how `serve` splits a device's memory between weights, KV cache, GDN state
// slots and an activation reserve, and the capacities that follow (KV tokens, state slots, max
// running requests, context length). Each figure carries the limit that bound it and what to
// change to raise it; an explicit user setting that cannot fit is an error naming what would fit,
// never a silent cap.
//
//   MemoryPlanInput in;                 // from the serve flags (deploy/plan_input.h fills it)
//   in.device_memory_bytes = 48 << 30;  in.tp_size = 2;  ...
//   MemoryPlan plan = plan_memory(model_config, in);
//   if (!plan.ok()) return plan.status();          // every error, joined
//   cache.n_blocks = plan.kv_tokens / in.kv_block_size;  cache.n_slots = plan.state_slots;
//   log(render_memory_plan(plan));                 // the table `deltaserve plan` prints
//
// Sizes are per GPU (per process on the CPU). Weights are counted from the config (embeddings,
// lm_head unless tied, every layer, the MTP head; the vision tower is not loaded for text).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "core/dtype.h"
#include "model/memory_spec.h"
#include "model/step_memory.h"
#include "util/status.h"

namespace deltaserve {

enum class PlanDevice : uint8_t { Cpu, Cuda };

struct MemoryPlanInput {
  PlanDevice device = PlanDevice::Cuda;
  int64_t device_memory_bytes = 0;  // per GPU (Cuda) or RAM the budget is taken from (Cpu)
  // Cuda: memory already in use on the GPU before the weights load (the CUDA context, cuBLAS,
  // other processes). serve measures it after its CUDA context is up; `plan --gpu-memory X`
  // assumes kCudaContextBytes. As SGLang does, it comes out of the static budget.
  int64_t device_memory_used_bytes = 0;
  int tp_size = 1;                  // GPUs the model is split over (Cpu: ranks share the process memory)
  int dp_size = 1;                  // Cpu: replicas in the process, each with its own weights and step
                                    // buffers; they share the budget's KV and state (Cuda: per GPU as is)

  // Budget. Cuda: device_memory_bytes * mem_fraction_static (0 = auto) - device_memory_used_bytes.
  // Cpu: max_memory_bytes (0 = auto: kCpuAutoShare of device_memory_bytes).
  double mem_fraction_static = 0;
  int64_t max_memory_bytes = 0;

  int64_t weight_bytes_per_param = 2;  // bf16 checkpoints
  int64_t kv_bytes_per_elem = 2;       // bf16 KV; 1 for fp8; 4 for an f32 CPU cache
  DType kv_cache_dtype = DType::BF16;  // what the cache stores (kv_bytes_per_elem is its size)
  std::optional<DType> state_dtype;    // GDN recurrent state, F32 or BF16 (--mamba-ssm-dtype); unset: the config's
  int kv_block_size = 16;

  // Requests (0 = auto). `*_explicit` marks a value the user typed: it is honoured or refused.
  int64_t context_length = 0;
  int64_t max_running_requests = 0;
  int64_t max_total_tokens = 0;     // cap on KV tokens
  int64_t max_state_slots = 0;      // --max-mamba-cache-size (request slots + checkpoints with the prefix cache)
  bool prefix_cache = true;         // off: --disable-radix-cache
  double mamba_full_memory_ratio = 0.9;  // state bytes / KV bytes of the cache budget (SGLang)
  bool mamba_full_memory_ratio_explicit = false;

  int spec_num_steps = 0;           // MTP draft steps k; 0 = speculative decoding off
  int64_t draft_vocab_size = 0;     // tokens of --speculative-token-map (0: none); its lm_head rows are copied
  int64_t chunked_prefill_size = 512;  // prefill chunk tokens (resolved: deploy/plan_input.h)
  int64_t max_prefill_tokens = 1024;   // prefill tokens per step (resolved)
  bool cuda_graphs = true;
  int cpu_threads = 1;              // Cpu: kernel threads (each keeps a row of attention scores)

  static constexpr double kCpuAutoShare = 0.7;
  // The CUDA context with cuBLAS on an H200 (CUDA 13): measured 0.57 GiB in use before any
  // allocation (bench/RESULTS.md, "Memory: plan vs allocation"); rounded up.
  static constexpr int64_t kCudaContextBytes = int64_t{768} << 20;
};

// One line of the explanation: what, how much, why that much, how to get more.
struct PlanRow {
  std::string item;       // "KV tokens"
  std::string value;      // "331,776"
  std::string detail;     // how it was computed
  std::string bound_by;   // the limit that set it ("" for inputs)
  std::string to_raise;   // what to change to raise it ("" if nothing applies)
};

struct MemoryPlan {
  // Per GPU (or per process on the CPU).
  int64_t budget_bytes = 0;                    // what weights + KV + state may use
  double mem_fraction_static = 0;              // effective (Cuda)
  int64_t weights_bytes_per_gpu = 0;
  int64_t n_params = 0;                        // whole model, text + MTP
  int64_t activation_reserve_bytes = 0;        // Cuda: outside the budget; Cpu: inside it
  int64_t cache_bytes = 0;                     // budget - weights (- reserve on Cpu)
  int64_t kv_budget_bytes = 0;
  int64_t state_budget_bytes = 0;
  int64_t kv_bytes_per_token_per_gpu = 0;      // attention layers (+ MTP layer when spec is on)
  int64_t state_bytes_per_request_per_gpu = 0; // GDN state + speculative pending rows
  int64_t state_bytes_per_slot_base = 0;       // GDN state of one sequence (conv + recurrent)
  int pending_depth = 0;                       // speculative rows per request (k+1 with spec, else 0)
  DType state_dtype = DType::F32;              // the GDN recurrent state's (input's, or the config's mamba_ssm_dtype)

  int64_t kv_tokens = 0;
  int64_t state_slots = 0;                     // request slots (0 for models without GDN layers)
  int64_t checkpoint_slots = 0;                // GDN state checkpoints for the prefix cache
  int64_t max_running_requests = 0;
  int64_t context_length = 0;

  std::vector<PlanRow> rows;
  std::vector<std::string> warnings;
  std::vector<std::string> errors;             // explicit settings that cannot fit, etc.

  bool ok() const { return errors.empty(); }
  Status status() const;
};

// Parameters the engine loads for text serving (vision tower excluded), whole model.
struct ParamCount {
  int64_t embedding = 0, lm_head = 0, attention_layers = 0, linear_layers = 0, mlp = 0,
          norms = 0, mtp = 0;
  int64_t total() const {
    return embedding + lm_head + attention_layers + linear_layers + mlp + norms + mtp;
  }
};
ParamCount count_params(const ModelConfig& config);

MemoryPlan plan_memory(const ModelConfig& config, const MemoryPlanInput& input);

// The table serve prints at start-up and `deltaserve plan` prints.
std::string render_memory_plan(const MemoryPlan& plan);

// "1.50 GiB", "64.0 KiB", "512 B".
std::string human_bytes(int64_t bytes);

}  // namespace deltaserve
