// ModelRunner: turns a list of (sequence, tokens to feed) into one forward pass. It owns the
// host staging arrays and their device mirrors, the logits, the hidden-state buffers the MTP head
// reads, and the decode graphs (all sized once; nothing is allocated per step), and hands the
// model BatchMeta + MemoryViews.
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
  int32_t slot = 0;                      // its slot (GDN state, pending rows)
  bool logits_all = false;               // logits for every fed token (else only the last)
  bool no_logits = false;                // a prefill chunk that does not reach the end
  bool defer_state = false;              // speculative verification: GDN state waits for commit_state
  int32_t checkpoint_at = -1;            // prefix cache: save the GDN state after this fed token
  int32_t checkpoint_slot = -1;          //   into this checkpoint slot
};

// After a verification: replay the first n_tokens of the slot's deferred run into its state.
struct StateCommit {
  int32_t slot = 0;
  int32_t n_tokens = 0;
  int32_t checkpoint_at = -1;    // prefix cache: save the state after this replayed token
  int32_t checkpoint_slot = -1;  //   into this checkpoint slot
};

struct RunnerLimits {
  int max_tokens = 0;        // tokens per forward
  int max_seqs = 0;          // sequences per forward
  int max_blocks_per_seq = 0;
  int max_logit_rows = 0;    // rows of logits per forward
  int graph_max_seqs = 0;    // decode batches of up to this many sequences replay a CUDA graph (0: off)
  bool mtp = false;          // keep hidden states for the MTP head (speculative decoding)
  // Prefix-cache checkpoints may be written: every batch then carries the checkpoint arrays (all
  // -1 when none), so a captured decode graph replays whichever checkpoints a step asks for.
  bool checkpoints = false;
};

class ModelRunner {
 public:
  ModelRunner(Backend& backend, Model& model, CacheMemory& cache, const RunnerLimits& limits);

  // Runs the model. After it returns, logits(i) is the i-th output row (items in order; each item
  // contributes its last token, or all its tokens with logits_all, or none with no_logits). With
  // limits.mtp, the final-normed hidden of every fed token is kept for run_mtp.
  void run(std::span<const RunItem> items, const LayerObserver* observer = nullptr);

  // The MTP head (NEXTN) over a batch whose ids are the next tokens: batch row r takes hidden row
  // hidden_rows[r] of the last run() (from = Main) or of the last run_mtp() (from = Mtp). Output
  // rows as in run(); its hidden states are kept for the next run_mtp(.., Mtp, ..).
  enum class HiddenFrom : uint8_t { Main, Mtp };
  void run_mtp(std::span<const RunItem> items, HiddenFrom from, std::span<const int32_t> hidden_rows);

  // Speculative rollback: the accepted tokens of deferred runs become the GDN state.
  void commit_state(std::span<const StateCommit> commits);

  // The final-normed hidden of every token of the last run() [n_tokens, H] (device; limits.mtp).
  Tensor hidden() const { return hidden_main_.view(DType::F32, {meta_.n_tokens, hidden_}); }
  int n_output_rows() const { return n_out_; }
  const float* logits(int row) const { return host_logits_ + int64_t(row) * vocab_; }
  int64_t vocab() const { return vocab_; }
  int n_tokens() const { return meta_.n_tokens; }
  const RunnerLimits& limits() const { return limits_; }

 private:
  void build(std::span<const RunItem> items);
  Tensor upload_ids();
  void fetch_logits();
  // Runs the forward of a plain decode batch (one token and its logits per sequence) from the
  // graph captured for its size, capturing it on the second batch of that size. False when the
  // batch has to run eagerly.
  bool run_graph(std::span<const RunItem> items, const ForwardArgs& a);

  Backend& backend_;
  Model& model_;
  CacheMemory& cache_;
  RunnerLimits limits_;
  int64_t vocab_, hidden_;
  // Host staging (page-locked on CUDA; on the CPU the same memory the kernels read):
  //   positions [T] | seq_start [S+1] | context_len [S] | block_table [S, B] | slots [S] | defer [S]
  //   | checkpoint_at [S] | checkpoint_slot [S] (one contiguous copy to the device) then ids [T] |
  //   out_rows [T].
  DeviceBuffer host_i32_;
  int32_t *positions_, *seq_start_, *context_len_, *block_table_, *slots_, *defer_, *ckpt_at_, *ckpt_slot_, *ids_,
      *out_rows_;
  int64_t n_meta_i32_ = 0;           // elements of the contiguous prefix
  DeviceBuffer dev_i32_;             // device mirror of the prefix (GPU backends)
  DeviceBuffer dev_ids_;             // device copy of ids (GPU backends)
  DeviceBuffer logits_buf_;          // [max_logit_rows, vocab] f32 (device)
  DeviceBuffer host_logits_store_;   // GPU backends: page-locked host copy of logits
  const float* host_logits_ = nullptr;
  BatchMeta meta_;
  int n_out_ = 0;
  // MTP (limits.mtp): every fed token's hidden from run(), the gathered input of run_mtp, the
  // catch-up output and two chain buffers that alternate (a chain step reads one, writes the other).
  DeviceBuffer hidden_main_;         // [max_tokens, H]
  DeviceBuffer mtp_in_;              // [max_tokens, H]
  DeviceBuffer mtp_out_;             // [max_tokens, H]
  DeviceBuffer chain_[2];            // [max_seqs, H]
  const DeviceBuffer* mtp_last_ = nullptr;  // where the last run_mtp wrote
  int mtp_last_rows_ = 0;
  int chain_next_ = 0;
  // commit_state staging: seq_start [S+1] | slots [S] | checkpoint_at [S] | checkpoint_slot [S],
  // host and device.
  DeviceBuffer commit_host_, commit_dev_;
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
