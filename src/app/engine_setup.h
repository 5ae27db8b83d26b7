// From the flags to an engine: the one path serve, generate and bench-offline take.
//
//   flags (src/options, defaults only there) -> device -> backend (CUDA context up) ->
//   measured free memory -> memory plan (src/cache/memory_plan.h) -> EngineConfig -> Engine
//
// Every capacity the engine gets comes from the plan, so `deltaserve plan` with the same flags
// and memory prints what serve allocates.
#pragma once

#include <memory>

#include "cache/memory_plan.h"
#include "deploy/plan_input.h"
#include "engine/engine.h"
#include "engine/node_link.h"
#include "model/config.h"
#include "options/serve_options.h"

namespace deltaserve {

struct EngineSetup {
  PlanDevice device = PlanDevice::Cpu;
  MemoryPlanInput plan_input;
  MemoryPlan plan;
  EngineConfig config;
  std::unique_ptr<Backend> backend;  // CUDA: made before planning (its free memory feeds the plan); CPU: null
};

// Validated options and the model's config. Errors: the plan's (every one joined), a device that
// cannot be made, a generation_config.json that cannot be read.
Result<EngineSetup> setup_engine(const ServeOptions& opts, const ModelConfig& model_config);

// The engines of --dp-size `dp` replicas of `config` (dp 1: the one engine, on `backend` when
// given). dp > 1 on the CPU: the process's threads, KV tokens, running requests and checkpoint
// slots (what the plan gave the process) are shared out between the replicas. GPUs: replica i
// runs on GPUs i * tp_size .. with the whole per-GPU plan (too few GPUs: an error naming both
// flags). A context length or running-request count the user gave (`given`) is honoured or refused
// (a replica's share too small), never lowered; an auto one is capped at a replica's share.
struct ReplicaLimitsGiven {
  bool context_length = false;        // --context-length was given
  bool max_running_requests = false;  // --max-running-requests was given
};
Result<std::vector<std::unique_ptr<Engine>>> make_replicas(const EngineConfig& config, std::unique_ptr<Backend> backend,
                                                           int dp, ReplicaLimitsGiven given = {});
// Refuses --dp-size > 1, --nnodes > 1 and the serve-only settings (explicit_serve_only_flags:
// --port, --api-key, --chat-template, ...) for the commands that drive one engine (generate,
// bench-offline).
Status single_replica_only(const ServeOptions& opts, const char* command);

// Multi-node (--nnodes > 1): what this node says of itself at --dist-init-addr. The model's
// identity (config.json's bytes, the load format) must match between nodes.
NodeLinkOptions node_link_options(const ServeOptions& opts, PlanDevice device);
// Nodes 1..N-1 of `deltaserve serve`: join node 0, build this node's ranks from node 0's engine
// config and replay its steps until it stops. No HTTP. Returns the process's exit code.
int follow_node_zero(const ServeOptions& opts);

}  // namespace deltaserve
