// FollowerNode: nodes 1..N-1 of a multi-node group. It builds what node 0's engine builds from
// node 0's engine config (rank_group_options, cache_config, runner_limits) for this node's ranks,
// then replays node 0's commands (engine/node_command.h) on them: every forward, MTP step, state
// commit and slot reset runs here too, and the ranks meet node 0's in the collectives. It has no
// scheduler, sampler or HTTP server: node 0 decides and answers.
#pragma once

#include <memory>

#include "cache/cache_memory.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/node_command.h"
#include "engine/node_link.h"
#include "engine/rank_group.h"

namespace deltaserve {

class FollowerNode {
 public:
  // config: this node's (model path, device, threads) with node 0's welcome applied.
  static Result<std::unique_ptr<FollowerNode>> create(const EngineConfig& config, NodeLink& link);
  // Replays node 0's commands until node 0 stops (ok) or goes away (an error naming it).
  Status run();
  const RankGroup& ranks() const { return *ranks_; }

 private:
  explicit FollowerNode(NodeLink& link) : link_(link) {}
  NodeLink& link_;
  std::unique_ptr<RankGroup> ranks_;
  std::unique_ptr<CacheMemory> cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<uint8_t> cmd_;  // the command being replayed
  DecodedBatch batch_;
};

}  // namespace deltaserve
