// The warm-up `serve` runs on a CUDA engine before it reports ready (SGLang's server warm-up;
// --skip-server-warmup skips it). Two greedy requests alone, of 24 and 48 prompt tokens (prefill
// steps in the GEMM buckets of 17-32 and 33-64 rows), then batches of 1, 2, 4, ... up to the
// engine's max running requests (at most kMaxWarmupBatch) of 16-token greedy requests, each batch
// submitted at once and drained. Their steps capture the decode (and, with MTP, verification) CUDA
// graphs of those batch sizes and time the GEMM algorithm buckets (backend/cuda/cuda_gemm.h), so
// that the first requests served do not wait for them (on the H200, 29 buckets timed inside a
// 16-stream HTTP benchmark cost it 2-5% of its throughput; bench/RESULTS.md, stop 41). The
// warm-up's requests count in the engine's statistics like any others.
#pragma once

#include <vector>

#include "engine/engine.h"

namespace deltaserve {

constexpr int kMaxWarmupBatch = 64;  // the GEMM buckets' range (CudaOptions::gemm_tune_rows)

struct WarmupResult {
  std::vector<int> batches;  // the batch sizes run
  double seconds = 0;
  int tokens = 0;  // generated tokens received
  int failed = 0;  // requests that ended in an error
};

// The batch sizes a warm-up runs for an engine of `max_batch` running requests: 1, 2, 4, ... up to
// min(max_batch, kMaxWarmupBatch).
std::vector<int> warm_up_engine_sizes(int max_batch);
// Runs the warm-up on a started engine; returns when every request has finished.
WarmupResult warm_up_engine(Engine& engine, int max_batch);

}  // namespace deltaserve
