// ModelRunner: turns a list of (sequence, tokens to feed) into one forward pass. It owns the
// host staging arrays (two sets: a run may be launched while the last one computes) and their
// device mirrors, the logits, the hidden-state buffers the MTP head reads, and the decode graphs
// (all sized once; nothing is allocated per step), and hands the model BatchMeta + MemoryViews. With tensor parallelism it builds the host staging once and
// runs every rank's shard at once (RankGroup::run), each with its own device mirrors, logits and
// hidden buffers and cache views; the logits come from rank 0 (every rank gathers the full rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "cache/cache_memory.h"
#include "engine/rank_group.h"
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

class RunnerMirror;

struct RunnerLimits {
  int max_tokens = 0;        // tokens per forward
  int max_seqs = 0;          // sequences per forward
  int max_blocks_per_seq = 0;
  int max_logit_rows = 0;    // rows of logits per forward
  int graph_max_seqs = 0;    // decode, verification and MTP batches of up to this many sequences
                             // replay a CUDA graph (0: off)
  bool mtp = false;          // keep hidden states for the MTP head (speculative decoding)
  // Prefix-cache checkpoints may be written: every batch then carries the checkpoint arrays (all
  // -1 when none), so a captured decode graph replays whichever checkpoints a step asks for.
  bool checkpoints = false;
};

class ModelRunner {
 public:
  ModelRunner(RankGroup& ranks, CacheMemory& cache, const RunnerLimits& limits);

  // What run() brings back to the host: every output row's logits, or one token per row picked
  // on the device: each row's argmax (Fetch::Argmax), or a draw under each row's SampleRow and
  // penalties (Fetch::Sample, Kernels::sample_rows). One int per row crosses instead of a
  // 248k-float row.
  // Fetch::Keep (run_mtp, one rank): the argmax ids stay on the device, in keep slot k after k
  // earlier Keep runs since take_kept(); a later run_mtp with ids_from_kept = k feeds row i of slot
  // k as item i's one token (the items' own tokens are placeholders). take_kept() copies the slots
  // to the host with one wait; kept(slot, row) reads them. An MTP draft chain so runs without a
  // host round trip between its steps.
  // Fetch::None: nothing comes back (another node replaying node 0's step; engine/follower_node.h).
  enum class Fetch : uint8_t { Logits, Argmax, Sample, Keep, None };
  struct Sampling {
    std::span<const SampleRow> rows;          // [n output rows]
    std::span<const PenaltyEntry> penalties;  // at most penalty_capacity()
  };
  // Penalty entries one Fetch::Sample run can take (more: sample on the host).
  static constexpr int64_t kPenaltyCapacity = kMaxPenaltyEntries;  // model/step_memory.h

  // Runs the model. After it returns, logits(i) (or with Fetch::Argmax / Sample, token(i)) is the
  // i-th output row (items in order; each item contributes its last token, or all its tokens with
  // logits_all, or none with no_logits). With limits.mtp, the final-normed hidden of every fed
  // token is kept for run_mtp.
  void run(std::span<const RunItem> items, const LayerObserver* observer = nullptr, Fetch fetch = Fetch::Logits,
           const Sampling* sampling = nullptr);
  int32_t token(int row) const { return host_tokens_[row]; }

  // Overlap scheduling (engine/engine.cpp): run() is launch() then wait(). launch() queues the
  // run and returns a ticket; with Fetch::Argmax or Sample on a GPU it returns before the device
  // is done (the other fetches wait inside it). wait(ticket) blocks until that run's tokens (or
  // logits) are on the host, and token() / logits() then read them. Two launches may be outstanding: each
  // has its own host staging and token rows, so the next batch is built and queued while the last
  // one computes. ids_from_last: item i's one token is output row i of the previous launch (a
  // Fetch::Argmax batch, or a Fetch::Sample one without penalties, whose every item has one output
  // row), copied on the device (with tensor parallelism each rank picks the rows from its own
  // gathered logits: the same argmax, or the same draw); the items' own tokens are placeholders.
  // Needs can_chain(): not on a multi-node group, whose other nodes replay host ids.
  int launch(std::span<const RunItem> items, const LayerObserver* observer = nullptr, Fetch fetch = Fetch::Logits,
             const Sampling* sampling = nullptr, bool ids_from_last = false);
  void wait(int ticket);
  bool can_chain() const { return mirror_ == nullptr; }

  // The MTP head (NEXTN) over a batch whose ids are the next tokens: batch row r takes hidden row
  // hidden_rows[r] of the last run() (from = Main) or of the last run_mtp() (from = Mtp). Output
  // rows as in run() (Fetch::Argmax: token(i) instead of logits(i)); its hidden states are kept
  // for the next run_mtp(.., Mtp, ..).
  enum class HiddenFrom : uint8_t { Main, Mtp };
  void run_mtp(std::span<const RunItem> items, HiddenFrom from, std::span<const int32_t> hidden_rows,
               Fetch fetch = Fetch::Logits, int ids_from_kept = -1);
  bool can_keep() const { return group_.tp_size() == 1 && limits_.mtp; }

  // Multi-node (node 0): every run, run_mtp and commit_state is first told to the other nodes,
  // whose ranks then run it beside these (nullptr: one node).
  void set_mirror(RunnerMirror* m) { mirror_ = m; }
  void take_kept();
  int32_t kept(int slot, int row) const {
    DS_CHECK(slot >= 0 && slot < n_taken_ && row >= 0 && row < kept_rows_[slot], "kept(", slot, ", ", row, ")");
    return kept_host_ptr_[int64_t(slot) * limits_.max_seqs + row];
  }

  // Speculative rollback: the accepted tokens of deferred runs become the GDN state.
  void commit_state(std::span<const StateCommit> commits);

  // The final-normed hidden of every token of the last run() [n_tokens, H] (rank 0's device; limits.mtp).
  Tensor hidden() const { return ranks_[0].hidden_main.view(DType::F32, {meta_.n_tokens, hidden_}); }
  int n_output_rows() const { return n_out_; }
  const float* logits(int row) const {
    DS_CHECK(host_logits_ != nullptr, "logits() after a Fetch::Argmax run");
    DS_CHECK(host_tokens_ == nullptr, "logits() of a row picked on the device");
    return host_logits_ + int64_t(row) * vocab_;
  }
  int64_t vocab() const { return vocab_; }
  int n_tokens() const { return meta_.n_tokens; }
  // Forwards replayed from CUDA graphs so far (decode, verification and MTP steps).
  int64_t graph_replays() const { return graph_replays_; }
  const RunnerLimits& limits() const { return limits_; }

 private:
  // Decode graphs by batch size; verification and MTP catch-up graphs by batch size and tokens per
  // sequence; MTP chain graphs by batch size and output buffer. Every buffer a forward touches sits
  // at a fixed address (staging, device mirrors, logits, hidden states, the model's activations,
  // the backend's scratch), so a graph replays any batch of its shape; the backend's graph_epoch
  // says when scratch has moved.
  struct DecodeGraph {
    std::unique_ptr<DeviceGraph> graph;
    uint64_t epoch = 0;
    bool warm = false;  // ran eagerly once: every buffer is sized for this shape
  };
  // What each tensor-parallel rank has of its own.
  struct Rank {
    Backend* backend = nullptr;
    Model* model = nullptr;
    const MemoryViews* memory = nullptr;
    BatchMeta meta;                    // the shared host fields + this rank's device mirrors
    DeviceBuffer dev_i32;              // device mirror of the staging prefix (GPU backends)
    DeviceBuffer dev_ids;              // device copy of ids (GPU backends)
    DeviceBuffer logits_buf;           // [max_logit_rows, vocab] f32 (device)
    // MTP (limits.mtp): every fed token's hidden from run(), the gathered input of run_mtp, the
    // catch-up output and two chain buffers that alternate (a chain step reads one, writes the other).
    DeviceBuffer hidden_main;          // [max_tokens, H]
    DeviceBuffer mtp_in;               // [max_tokens, H]
    DeviceBuffer mtp_out;              // [max_tokens, H]
    DeviceBuffer chain[2];             // [max_seqs, H]
    DeviceBuffer commit_dev;           // commit_state staging on the device
    DeviceBuffer tokens_dev;           // ranks > 0 of a GPU group: this rank's picked rows (chained ids)
    DeviceBuffer sample_dev;           // ranks > 0 of a GPU group: SampleRow [max_logit_rows]
    std::vector<DecodeGraph> graphs;   // [graph_max_seqs + 1]
    std::vector<DecodeGraph> verify_graphs;  // [graph_max_seqs + 1][verify_tokens_ + 1]
    std::vector<DecodeGraph> mtp_graphs;     // MTP chain steps: [graph_max_seqs + 1][output chain buffer 0, 1]
    std::vector<DecodeGraph> catchup_graphs; // MTP catch-up steps: [graph_max_seqs + 1][verify_tokens_ + 1]
    const DeviceBuffer& mtp_buffer(int which) const { return which == 0 ? mtp_out : chain[which - 1]; }
  };

  // One launch's host side. The two alternate; run_mtp and commit_state need neither outstanding.
  struct Flight {
    // Host staging (page-locked on CUDA; on the CPU the same memory the kernels read):
    //   positions [T] | seq_start [S+1] | context_len [S] | block_table [S, B] | slots [S] | defer [S]
    //   | checkpoint_at [S] | checkpoint_slot [S] (one contiguous copy to the device) then ids [T] |
    //   out_rows [T].
    DeviceBuffer staging;
    int32_t* tokens = nullptr;         // [max_logit_rows] picked on the device (in tokens_host_)
    const float* logits = nullptr;     // host logits after the fetch (nullptr: none)
    int n_out = 0;
    Fetch fetch = Fetch::None;
    bool ids_chainable = false;         // argmax, or a draw without penalties: every rank picks the same
                                        // tokens, so a next launch may feed them (ids_from_last)
    // Per rank, recorded after the run's last work there (rank 0: its last copy to the host).
    std::vector<std::unique_ptr<DeviceEvent>> done;
    bool pending = false;               // launched, not waited for
  };
  // Points the staging pointers (positions_ ..) at the next flight's staging; returns its index.
  int take_flight();
  void build(std::span<const RunItem> items);
  // This rank's device copy of the batch (GPU backends) and its meta; async: queued (launch()).
  void upload_meta(Rank& r, bool async);
  Tensor upload_ids(Rank& r, bool async);
  // ids_from_last: the previous launch's output rows as this batch's ids, on rank r's device
  // (CPU: copied into the host staging once, before the ranks run).
  Tensor chained_ids(Rank& r);
  void fetch_logits();
  void clear_host_outputs();  // no logits or tokens on the host (Fetch::None)
  void fetch_argmax(bool async);
  // Fetch::Sample: copies the settings into flight `ticket`'s region of sample_host_ (returned),
  // then (fetch_sampled) draws on rank 0 and queues the tokens' copy to the host.
  char* stage_sampling(int ticket, const Sampling& sampling);
  void fetch_sampled(const char* staged, int64_t n_penalties);
  std::size_t penalty_offset() const { return std::size_t(std::max(limits_.max_logit_rows, 1)) * sizeof(SampleRow); }
  void fetch_keep();
  // The ids of this batch from keep slot `slot` (one token per sequence), on rank r's device.
  Tensor kept_ids(Rank& r, int slot);
  // Runs the forward of a decode batch (one token and its logits per sequence) or a verification
  // batch (k + 1 tokens, every logit, state deferred) from the graph captured for its shape. False
  // when the batch has to run eagerly.
  bool run_graph(Rank& r, std::span<const RunItem> items, const ForwardArgs& a);
  // The same for an MTP step, its input hidden states gathered into mtp_in beforehand: a chain
  // step (one token per sequence, output into chain buffer out_which - 1; a graph per size and
  // output buffer) or a catch-up step after a verification (out_which 0: the same number of
  // tokens, at most a verification's, for every sequence; a graph per size and tokens per
  // sequence). Catch-ups of uneven lengths run eagerly.
  bool run_mtp_graph(Rank& r, std::span<const RunItem> items, int out_which, const MtpArgs& a);
  // Replays g, capturing `forward` into it on the shape's second run (the first sizes every
  // buffer eagerly) or after the backend's scratch moved. False: run `forward` eagerly.
  bool replay(Rank& r, DecodeGraph& g, const std::function<void()>& forward);

  RankGroup& group_;
  CacheMemory& cache_;
  RunnerMirror* mirror_ = nullptr;
  RunnerLimits limits_;
  int64_t vocab_, hidden_;
  int verify_tokens_ = 0;            // most tokens of a verification run (the cache's pending depth)
  std::vector<Rank> ranks_;
  Flight flights_[2];
  int next_flight_ = 0;
  // The staging of the flight being built (Flight::staging's layout).
  int32_t *positions_, *seq_start_, *context_len_, *block_table_, *slots_, *defer_, *ckpt_at_, *ckpt_slot_, *ids_,
      *out_rows_;
  int32_t* tokens_out_ = nullptr;    // its token rows
  int64_t n_meta_i32_ = 0;           // elements of the contiguous prefix
  DeviceBuffer host_logits_store_;   // GPU backends: page-locked host copy of rank 0's logits
  const float* host_logits_ = nullptr;
  DeviceBuffer tokens_dev_;          // [max_logit_rows] i32 on rank 0's device (GPU backends)
  DeviceBuffer tokens_host_;         // [2][max_logit_rows] i32, host: each flight's rows
  const int32_t* host_tokens_ = nullptr;  // set after a Fetch::Argmax / Sample run
  // Fetch::Sample staging: SampleRow [max_logit_rows] | PenaltyEntry [kPenaltyCapacity] (sample_bytes_),
  // on the host (page-locked) one region per flight, and on rank 0's device.
  DeviceBuffer sample_host_, sample_dev_;
  std::size_t sample_bytes_ = 0;
  // Fetch::Keep: [verify_tokens_][max_seqs] i32 on rank 0's device (the CPU: host memory, which
  // kept_host_ptr_ then points at), its host copy, and each slot's rows.
  DeviceBuffer kept_dev_, kept_host_;
  const int32_t* kept_host_ptr_ = nullptr;
  std::vector<int> kept_rows_;
  int n_kept_ = 0, n_taken_ = 0;
  BatchMeta meta_;                   // host fields of the current batch
  int n_out_ = 0;
  int mtp_last_ = -1;                // where the last run_mtp wrote: 0 mtp_out, 1/2 chain[0/1]
  int mtp_last_rows_ = 0;
  int64_t graph_replays_ = 0;
  int chain_next_ = 0;
  // commit_state staging: seq_start [S+1] | slots [S] | checkpoint_at [S] | checkpoint_slot [S].
  DeviceBuffer commit_host_;
};

// What node 0's runner sends the other nodes of a multi-node group (engine/node_command.h).
class RunnerMirror {
 public:
  virtual ~RunnerMirror() = default;
  virtual void run(std::span<const RunItem> items) = 0;
  virtual void run_mtp(std::span<const RunItem> items, ModelRunner::HiddenFrom from,
                       std::span<const int32_t> hidden_rows) = 0;
  virtual void commit_state(std::span<const StateCommit> commits) = 0;
};

}  // namespace deltaserve
