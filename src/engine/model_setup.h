// ModelSetup: backend + model + cache + runner for the offline commands that drive the model
// directly (logits, tests). The server and `generate` go through Engine instead.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_memory.h"
#include "engine/model_runner.h"
#include "engine/rank_group.h"
#include "model/model.h"

namespace deltaserve {

struct SetupOptions {
  std::string model_dir;
  int n_threads = 0;
  std::string device = "cpu";
  int tp_size = 1;        // tensor-parallel ranks (CPU: threads of this process)
  bool dummy_weights = false;
  WeightDType weight_dtype = WeightDType::Auto;  // the matmul weights' (--dtype)
  int pending_depth = 0;  // > 0: speculative rows for runs of this many tokens (and MTP hidden states)
  // KV cache element type (F32, BF16, F8E4M3, F8E5M2); unset = the backend's activation dtype.
  // fp8 caches take the checkpoint's per-layer k / v scales (Model::kv_scales()).
  std::optional<DType> kv_dtype;
  DType state_dtype = DType::F32;  // the GDN recurrent state's (F32 or BF16)
  bool cuda_graphs = true;  // GPU backends: decode, verification and MTP batches replay CUDA graphs
  std::vector<int32_t> draft_vocab;  // the MTP head's token map (model/token_map.h); empty: all
};

struct ModelSetup {
  std::unique_ptr<RankGroup> ranks;
  Backend* backend = nullptr;  // rank 0's
  Model* model = nullptr;      // rank 0's shard (config() is the whole model's)
  std::unique_ptr<CacheMemory> cache;
  std::unique_ptr<ModelRunner> runner;
  int blocks_for(int n_tokens) const {
    const int bs = cache->config().block_size;
    return (n_tokens + bs - 1) / bs;
  }
  static Result<std::unique_ptr<ModelSetup>> create(const SetupOptions& o, int max_tokens, int max_seqs,
                                                    int max_context, int max_logit_rows);
};

}  // namespace deltaserve
