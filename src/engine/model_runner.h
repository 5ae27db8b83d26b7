// ModelRunner: turns a list of (sequence, tokens to feed) into one forward pass. It owns the
// host staging arrays and their device mirrors (sized once; nothing is allocated per step) and
// hands the model BatchMeta + MemoryViews.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/cache_memory.h"
#include "model/model.h"

namespace deltaserve {

// One sequence's slice of a batch.
struct RunItem {
  std::span<const int32_t> tokens;       // tokens fed this step
  int32_t n_past = 0;                    // tokens of this sequence already in the cache
  std::span<const int32_t> blocks;       // its KV block table (covers n_past + tokens.size())
  int32_t slot = 0;                      // its GDN state slot
  bool logits_all = false;               // logits for every fed token (else only the last)
  bool no_logits = false;                // a prefill chunk that does not reach the end
};

struct RunnerLimits {
  int max_tokens = 0;        // tokens per forward
  int max_seqs = 0;          // sequences per forward
  int max_blocks_per_seq = 0;
  int max_logit_rows = 0;    // rows of logits per forward
  int graph_max_seqs = 0;    // decode batches of up to this many sequences replay a CUDA graph (0: off)
};

class ModelRunner {
 public:
  ModelRunner(Backend& backend, Model& model, CacheMemory& cache, const RunnerLimits& limits);

  // Runs the model. After it returns, logits(i) is the i-th output row (items in order; each item
  // contributes its last token, or all its tokens with logits_all, or none with no_logits).
  // hidden_all (optional, device [T, H]) receives the final-normed hidden of every fed token.
  void run(std::span<const RunItem> items, bool write_snapshots = false, Tensor hidden_all = {},
           const LayerObserver* observer = nullptr);
  // MTP head over the same kind of batch: ids are the next tokens, hidden_in [T, H] the
  // previous hidden states; output rows as in run(). hidden_out optional [T, H].
  void run_mtp(std::span<const RunItem> items, const Tensor& hidden_in, Tensor hidden_out = {});

  int n_output_rows() const { return n_out_; }
  const float* logits(int row) const { return host_logits_ + int64_t(row) * vocab_; }
  int64_t vocab() const { return vocab_; }
  int n_tokens() const { return meta_.n_tokens; }
  const RunnerLimits& limits() const { return limits_; }

 private:
  void build(std::span<const RunItem> items, bool write_snapshots);
  void fetch_logits();
  // Runs the forward of a plain decode batch (one token and its logits per sequence) from the
  // graph captured for its size, capturing it on the second batch of that size. False when the
  // batch has to run eagerly.
  bool run_graph(std::span<const RunItem> items, const ForwardArgs& a);

  Backend& backend_;
  Model& model_;
  CacheMemory& cache_;
  RunnerLimits limits_;
  int64_t vocab_;
  // Host staging (pinned-equivalent on the CPU: the same memory the kernels read).
  DeviceBuffer host_i32_;            // ids | positions | seq_start | context_len | block_table | slots | out_rows
  int32_t *ids_, *positions_, *seq_start_, *context_len_, *block_table_, *slots_, *out_rows_;
  DeviceBuffer dev_i32_;             // device mirror of positions .. slots (GPU backends)
  DeviceBuffer dev_ids_;             // device copy of ids (GPU backends)
  DeviceBuffer logits_buf_;          // [max_logit_rows, vocab] f32 (device)
  DeviceBuffer host_logits_store_;   // GPU backends: page-locked host copy of logits
  const float* host_logits_ = nullptr;
  BatchMeta meta_;
  int n_out_ = 0;
  // Decode graphs by batch size. Every buffer a forward touches sits at a fixed address (staging,
  // device mirrors, logits, the model's activations, the backend's scratch), so a graph replays
  // any decode batch of its size; the backend's graph_epoch says when scratch has moved.
  struct DecodeGraph {
    std::unique_ptr<DeviceGraph> graph;
    uint64_t epoch = 0;
    bool warm = false;  // ran eagerly once: every buffer is sized for this shape
  };
  std::vector<DecodeGraph> graphs_;  // [graph_max_seqs + 1]
};

}  // namespace deltaserve
