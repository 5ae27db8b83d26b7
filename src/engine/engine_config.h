// EngineConfig: everything the engine needs to start, as native values. Nothing here has a
// default the engine chooses: serve, generate and bench-offline fill it from the one flag table
// (src/options) and the memory plan (src/cache/memory_plan.h) through app/engine_setup.h, and
// tests fill it explicitly. Engine::create refuses a config with a capacity left unset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/weight_loader.h"

namespace deltaserve {

class NodeLink;

struct EngineConfig {
  std::filesystem::path model_dir;
  bool dummy_weights = false;        // --load-format dummy: random weights shaped by config.json
  WeightDType weight_dtype = WeightDType::Auto;  // --dtype: the matmul weights' dtype (model/weight_loader.h)
  Device device = Device::Cpu;
  int n_threads = 0;                 // CPU threads for kernels; 0 = all usable CPUs
  bool custom_all_reduce = true;     // CUDA tensor parallelism: the one-shot peer all-reduce for small messages
  int tp_size = 1;                   // tensor-parallel ranks (--tp-size; CPU: threads of this process)
  // Multi-node (--nnodes > 1): this engine runs on node 0 of the group the link joins; its ranks
  // are the first tp_size / nnodes, and every step is replayed by the other nodes
  // (engine/node_link.h). nullptr: one node. Not owned.
  NodeLink* node_link = nullptr;
  // Data parallelism (--dp-size): this engine is replica dp_rank of dp_size; on CUDA its ranks run
  // on GPUs dp_rank * tp_size .. + tp_size - 1.
  int dp_rank = 0;
  int dp_size = 1;

  // Capacity (all required, > 0).
  int max_running_requests = 0;      // sequences decoding at once (= slots)
  int max_waiting_requests = 0;      // queue bound; a full queue rejects new requests
  int64_t context_length = 0;        // prompt + generated tokens per sequence
  int64_t kv_tokens = 0;             // KV cache capacity in tokens (over all sequences)
  int kv_block_size = 0;             // tokens per KV block
  DType kv_cache_dtype = DType::F32; // F32, BF16, F8E4M3 or F8E5M2 (--kv-cache-dtype)
  DType state_dtype = DType::F32;    // GDN recurrent state: F32 or BF16 (--mamba-ssm-dtype)

  // Per-step token budget (continuous batching; both required).
  int chunked_prefill_size = 0;      // longest prefill chunk of one sequence per step
  int max_prefill_tokens = 0;        // prefill tokens per step over all sequences
  // Prefill tokens in a step that also decodes running sequences (each of their next tokens waits
  // for the whole step). 0: auto, from the step times measured so far (StepCost: such a step
  // stays within kMixedStepRatio decode steps); > 0: that many (max_prefill_tokens or more: no
  // separate limit).
  int mixed_prefill_tokens = 0;

  // Prefix cache (radix tree over KV blocks + GDN state checkpoints): off with
  // --disable-radix-cache. checkpoint_slots: GDN states kept for it (models with GDN layers);
  // decode_checkpoints: each running request keeps one at its last block boundary, cached when it
  // finishes (--mamba-scheduler-strategy extra_buffer); otherwise only prompt and prefill-chunk
  // ends are checkpointed (no_buffer).
  bool prefix_cache = false;
  int checkpoint_slots = 0;
  bool decode_checkpoints = false;
  bool schedule_lpm = false;         // --schedule-policy lpm: longest cached prefix first

  // Tokens drawn on the device (Kernels::sample_rows) on steps where every row is a plain draw;
  // else the host samples every non-greedy row from fetched logits (--sampling-backend).
  bool device_sampling = false;

  // Speculative decoding (MTP / NEXTN): 0 = off.
  int spec_num_steps = 0;
  // The drafts' vocabulary (--speculative-token-map, model/token_map.h): sorted token ids, empty
  // for the whole vocabulary.
  std::vector<int32_t> spec_token_map;
  // Overlap scheduling (engine/engine.h): a greedy decode step is launched before the tokens of
  // the step before it are read (--disable-overlap-schedule turns it off; on by default on GPUs,
  // where the host work then hides behind the device's). One rank on one node, no speculative
  // decoding; other steps run one at a time.
  bool overlap_schedule = false;
  // Decode batches of up to this many sequences replay a CUDA graph per batch size (GPU only).
  // -1: auto (max running requests, at most 64); 0: off (--disable-cuda-graph).
  int cuda_graph_max_bs = -1;
  // Seeds the generator that gives each request without a `seed` its own (--random-seed; any
  // value, 0 included, as SGLang): none = from std::random_device, so unseeded requests differ
  // between runs.
  std::optional<uint64_t> random_seed;

  std::vector<int32_t> extra_eos_token_ids;  // e.g. from generation_config.json

  // Tests: Scheduler::check_integrity() after every step (blocks, slots, checkpoints accounted).
  bool check_integrity_every_step = false;
};

}  // namespace deltaserve
