// NodeCommand: what node 0 of a multi-node group sends the other nodes (engine/node_link.h), so
// their ranks do what its ranks do: the runner's calls (a forward, an MTP step, a state commit)
// and the cache's slot resets and copies. NodeMirror encodes them on node 0 (ModelRunner and
// CacheMemory call it before their own ranks run); FollowerNode decodes and replays them. Also
// the welcome: the engine config node 0 planned, which every node builds.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cache/cache_memory.h"
#include "engine/engine_config.h"
#include "engine/model_runner.h"
#include "engine/node_link.h"
#include "util/tcp.h"

namespace deltaserve {

enum class NodeOp : uint8_t { Run = 1, RunMtp = 2, CommitState = 3, ZeroSlot = 4, CopySlot = 5 };

class NodeMirror final : public SlotMirror, public RunnerMirror {
 public:
  explicit NodeMirror(NodeLink& link) : link_(link) {}
  void run(std::span<const RunItem> items) override;
  void run_mtp(std::span<const RunItem> items, ModelRunner::HiddenFrom from, std::span<const int32_t> hidden_rows) override;
  void commit_state(std::span<const StateCommit> commits) override;
  void zero_slot(int slot) override;
  void copy_slot(int src, int dst) override;

 private:
  void send();
  NodeLink& link_;
  ByteWriter w_;  // reused: its capacity stays between steps
};

// A decoded batch: items whose spans point into this object's arrays (valid until the next
// decode; the arrays keep their capacity between steps).
struct DecodedBatch {
  std::vector<RunItem> items;
  std::vector<int32_t> data;         // every item's tokens then blocks
  std::vector<std::pair<std::size_t, std::size_t>> tokens_at, blocks_at;  // [item] (offset, length) in data
  std::vector<int32_t> hidden_rows;  // RunMtp
  ModelRunner::HiddenFrom from = ModelRunner::HiddenFrom::Main;
  std::vector<StateCommit> commits;  // CommitState
};
// Reads a Run or RunMtp command's batch (after its op byte); false when malformed.
bool decode_batch(ByteReader& r, NodeOp op, DecodedBatch& out);
bool decode_commits(ByteReader& r, DecodedBatch& out);

// The welcome: node 0's engine config, what every node must build alike (capacity, KV dtype,
// speculation, graphs, prefix cache, weights' format). Each node keeps its own model path, device
// threads and sampling.
std::vector<uint8_t> encode_engine_config(const EngineConfig& c);
Status apply_engine_config(const std::vector<uint8_t>& bytes, EngineConfig& c);

}  // namespace deltaserve
