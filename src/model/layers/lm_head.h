// LmHead: the model's ends. Token embedding on the way in; on the way out, the final RMSNorm of
// the rows that need logits and the vocabulary projection (tied to the embedding or its own).
// Checkpoint names come from the architecture (embed_tokens, norm, lm_head).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "model/layers/activations.h"
#include "model/model.h"
#include "backend/communicator.h"
#include "model/weight_loader.h"

namespace deltaserve {

struct LmHead {
  // Vocabulary-parallel (tensor parallelism): this rank holds rows vocab_rows of both tables.
  DeviceTensor embed;                       // [V_r, H]
  std::unique_ptr<LinearWeight> lm_head;    // [V_r, H]
  int64_t vocab = 0;                        // V
  RowRange vocab_rows;                      // V_r = vocab_rows.size()
  DeviceTensor final_norm;                  // [H] f32
  std::size_t embed_bytes = 0;              // of the embedding table (not streamed per decode step)
  std::string lm_head_name;                 // the checkpoint tensor lm_head was loaded from

  // The MTP drafts' vocabulary (--speculative-token-map, model/token_map.h): this rank's rows of
  // the lm_head for the map's tokens, and for each of the rank's V_r columns the row that scores
  // it (-1: not in the map, logit -inf).
  struct DraftVocab {
    std::unique_ptr<LinearWeight> lm_head;  // [D_r, H] (nullptr when D_r = 0)
    int64_t rows = 0;                       // D_r
    DeviceTensor column_row;                // [V_r] i32
  };
  std::optional<DraftVocab> draft;

  struct Names {
    std::string embed, norm, lm_head;
  };
  static Result<LmHead> load(WeightLoader& w, const Names& names, const ModelConfig& c, bool zero_centred_norm,
                             bool have_checkpoint, const std::string& source, const TpShard& tp);
  // Loads `draft` for the sorted token ids (after load(), before size_activations).
  Status load_draft_vocab(WeightLoader& w, Backend& backend, std::span<const int32_t> ids);
  // Sets a's vocabulary-parallel sizes (before a.reserve).
  void size_activations(const TpShard& tp, Activations& a) const;
  // x [T, H] = embed[ids] (each rank its rows, then summed over the group).
  void embed_tokens(Kernels& k, const Tensor& ids, Tensor x, Communicator* comm) const;
  // logits [n_rows, V] of rows `rows` of x after `norm`; hidden_all (optional [T, H]) receives the
  // normed hidden of every row. With comm, every rank computes its vocabulary columns and gathers
  // the full rows, so sampling sees exactly the logits of one rank. use_draft (with `draft`): only
  // the map's tokens are scored, the rest of each row is -inf.
  void logits(Kernels& k, float eps, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
              Tensor logits, Tensor hidden_all, Activations& a, Communicator* comm, bool use_draft = false) const;
};

}  // namespace deltaserve
