// Model: knows layers and weights; never scheduling, HTTP, or a concrete backend.
// The engine hands it a batch (BatchMeta + token ids) and views of its cache memory.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "model/config.h"
#include "model/memory_spec.h"
#include "model/weight_loader.h"

namespace deltaserve {

// Scales of one KV layer for an fp8 cache (stored = x / scale; see KvLayerView), from the
// checkpoint's k_scale / v_scale tensors; 1 when it has none.
struct KvScale {
  float k = 1.f;
  float v = 1.f;
};

struct MemoryViews {
  std::vector<KvLayerView> kv;        // [n_kv_layers]
  std::vector<StateLayerView> state;  // [n_state_layers]
};

// Called with the residual stream after each layer (layer = -1: the embeddings). Off unless set.
using LayerObserver = std::function<void(int layer, const Tensor& residual /*[T, H]*/)>;

struct ForwardArgs {
  const BatchMeta* meta = nullptr;
  Tensor ids;                          // [T] i32 (device)
  const MemoryViews* memory = nullptr;
  const int32_t* output_rows = nullptr;  // host; rows of the batch that need logits
  int n_output_rows = 0;
  Tensor logits;                       // [n_output_rows, vocab] f32 (device)
  Tensor hidden;                       // optional [T, H]: final-normed hidden of every row
  const LayerObserver* observer = nullptr;
};

// MTP draft step (NEXTN): row p takes the token after p (ids) and the main model's (or the
// previous MTP step's) final hidden at p, and predicts the token two after p.
struct MtpArgs {
  const BatchMeta* meta = nullptr;     // positions p; the MTP layer's KV uses the same block tables
  Tensor ids;                          // [T] i32: t_{p+1}
  Tensor hidden_in;                    // [T, H]
  const MemoryViews* memory = nullptr;
  const int32_t* output_rows = nullptr;
  int n_output_rows = 0;
  Tensor logits;                       // [n_output_rows, vocab]
  Tensor hidden_out;                   // optional [T, H]: mtp.norm output (the next step's hidden)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual MemorySpec memory_spec() const = 0;
  // One per KV layer, in MemorySpec order (the attention layers, then the MTP layer).
  virtual std::vector<KvScale> kv_scales() const = 0;
  virtual bool has_mtp() const = 0;
  // Sizes the internal activation buffers for batches of up to max_tokens tokens and
  // max_logit_rows rows of logits (call once).
  virtual void reserve(int max_tokens, int max_logit_rows) = 0;
  virtual void forward(const ForwardArgs& args) = 0;
  virtual void forward_mtp(const MtpArgs& args) = 0;
  // Speculative rollback: replays each sequence's accepted tokens (commit.seq_start: how many,
  // commit.state_slot: whose) from the pending rows of a deferred forward into the GDN state of
  // every layer (Kernels::gdn_commit). No-op for models without GDN layers.
  virtual void commit_state(const BatchMeta& commit, const MemoryViews& memory) = 0;
  virtual std::size_t weight_bytes() const = 0;
  // Bytes of weights one decode step reads: everything but the embedding table (one row per
  // token) and the MTP head. Both: this tensor-parallel rank's shard.
  virtual std::size_t decode_weight_bytes() const = 0;
};

struct ModelLoadOptions {
  bool dummy_weights = false;  // random weights from config.json alone
  bool load_mtp = true;
  WeightDType weight_dtype = WeightDType::Auto;  // --dtype: the matmul weights' dtype
  // The MTP drafts' vocabulary (model/token_map.h), sorted token ids; empty: the whole vocabulary.
  std::vector<int32_t> draft_vocab;
  // Tensor parallelism: this rank's communicator (nullptr: one rank). The model loads rank
  // comm->rank()'s shard (model/tensor_parallel.h) and all-reduces between its layers; its
  // config() stays the whole model's, memory_spec() is one rank's.
  Communicator* comm = nullptr;
};

// The registry: reads config.json, picks the architecture, loads weights onto the backend.
Result<std::unique_ptr<Model>> load_model(const std::filesystem::path& dir, Backend& backend,
                                          const ModelLoadOptions& options);

}  // namespace deltaserve
