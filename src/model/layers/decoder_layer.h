// DecoderLayer: one pre-norm residual block, the unit every architecture stacks:
//   x += mixer(norm_in(x));  x += mlp(norm_post(x))
// The mixer is gated full attention (KV layer kv_idx) or a Gated DeltaNet (state layer
// state_idx). Checkpoint names: <prefix>.{input_layernorm, post_attention_layernorm}.weight, the
// mixer's (self_attn.* / linear_attn.*) and mlp.*.
#pragma once

#include <optional>
#include <string>

#include "model/layers/activations.h"
#include "model/layers/attention_layer.h"
#include "model/layers/gated_deltanet_layer.h"
#include "model/layers/mlp.h"
#include "model/model.h"

namespace deltaserve {

struct DecoderLayer {
  LayerType type = LayerType::FullAttention;
  DeviceTensor input_norm, post_norm;  // [H] f32
  std::optional<AttentionLayer> attn;
  std::optional<GatedDeltaNetLayer> gdn;
  Mlp mlp;
  int kv_idx = -1, state_idx = -1;

  // tp: this tensor-parallel rank's share of the mixer and MLP (norms are replicated).
  static Result<DecoderLayer> load(WeightLoader& w, const std::string& prefix, const ModelConfig& c, LayerType type,
                                   bool zero_centred_norm, const TpShard& tp);
  // Widths this layer needs in Activations.
  int64_t proj_cols() const { return attn ? attn->proj_cols() : gdn->proj_cols(); }
  int64_t mix_cols() const { return attn ? attn->mix_cols() : gdn->mix_cols(); }
  // x [T, H] in place. comm: the tensor-parallel group (nullptr: one rank).
  void forward(Kernels& k, const ModelConfig& c, int T, const BatchMeta& meta, const MemoryViews& memory,
               Activations& a, Tensor x, Communicator* comm) const;
};

struct LmHead;

// The decoder-only forward every architecture runs: embed a.ids, each layer in order (a.observer
// sees the embeddings as layer -1, then each layer's output), the final norm and the logits.
void forward_decoder(Kernels& k, const ModelConfig& c, const LmHead& head, std::span<const DecoderLayer> layers,
                     Activations& act, Communicator* comm, const ForwardArgs& a);

// Sizes a.{hidden, max_proj, max_mix, intermediate} for these layers (before a.reserve).
void size_activations(const ModelConfig& c, std::span<const DecoderLayer> layers, const DecoderLayer* extra,
                      Activations& a);

}  // namespace deltaserve
