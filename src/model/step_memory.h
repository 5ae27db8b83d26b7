// StepMemory: the bytes one rank's forward steps work in, beyond the weights and the caches, sized
// once for the largest step the runner accepts. Three parts, each mirroring the code that
// allocates it:
//   activations  the model's rows [T, ...] and TP logits (layers/activations.h, Activations::reserve)
//   runner       ModelRunner's logits [R, V], MTP hidden rows, batch metadata and staging
//                (engine/model_runner.cpp, its constructor)
//   scratch      the kernels' scratch, grown on first use (backend/cuda: CudaKernels::scratch, 25%
//                slack; backend/cpu: CpuKernels::scratch_f32; the CPU communicator's slots) and the
//                fixed pieces (cuBLAS workspace, the peer all-reduce staging)
// One set of formulas: the memory plan reserves their total (cache/memory_plan.cpp), and tests
// hold the allocations to them (tests/engine/step_memory_test.cpp on the CPU; the `cuda` label on
// a GPU, after the largest steps ran).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace deltaserve {

// The runner's limits (engine/model_runner.h RunnerLimits), from the scheduling settings: a step
// holds at most the prefill budget plus every running request's decode (1 + k tokens), and
// logits for every decode position plus one row per request.
struct StepShape {
  int64_t tokens = 0;       // T: tokens of one forward
  int64_t logit_rows = 0;   // R: rows of logits of one forward
  int64_t seqs = 0;         // S: sequences of one forward
  int64_t blocks_per_seq = 0;  // B: block-table row length (context / block size, rounded up)
  int64_t context = 0;      // longest context (the CPU attention's score rows)
  int verify_tokens = 0;    // k + 1 with speculative decoding, else 0
  bool mtp = false;         // the MTP head runs (hidden rows kept for it)
  int64_t draft_vocab = 0;  // --speculative-token-map tokens (0: none)
  int tp = 1;               // tensor-parallel ranks
  bool cuda = false;        // CUDA backend (else the CPU's)
  int cpu_threads = 1;      // CPU backend: compute threads (per-thread score rows)
};

StepShape step_shape(int64_t max_prefill_tokens, int64_t max_running_requests, int spec_num_steps,
                     int64_t context_length, int64_t block_size);

struct StepMemory {
  int64_t activations = 0;
  int64_t runner = 0;   // device (or, on the CPU, process) memory; pinned host staging excluded on CUDA
  int64_t scratch = 0;
  int64_t total() const { return activations + runner + scratch; }
};

StepMemory step_memory(const ModelConfig& c, const StepShape& s);

// Entries one sampling run carries penalties for at most (the runner's device sampling buffer).
inline constexpr int64_t kMaxPenaltyEntries = int64_t(1) << 18;
// The one-shot peer all-reduce's staging (two buffers per rank) stops at this size; NCCL above.
inline constexpr int64_t kPeerAllReduceMaxBytes = int64_t(4) << 20;

}  // namespace deltaserve
