// Gated DeltaNet mixer: fused [qkv | z | b | a] projection, the GDN kernel, out_proj.
// Checkpoint names: <prefix>.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj}.weight,
// conv1d.weight [conv_dim, 1, K], A_log [Hv], dt_bias [Hv], norm.weight [Dv].
#pragma once

#include <memory>
#include <string>

#include "backend/communicator.h"
#include "model/config.h"
#include "model/layers/normed_input.h"
#include "model/weight_loader.h"

namespace deltaserve {

struct GatedDeltaNetLayer {
  // Shapes per tensor-parallel rank (Hk, Hv, conv_dim, value_dim: this rank's heads).
  std::unique_ptr<LinearWeight> in_proj;   // [conv_dim + value_dim + 2*Hv, H]
  std::unique_ptr<LinearWeight> out_proj;  // [H, value_dim]
  DeviceTensor conv_weight, neg_exp_a, dt_bias, norm;
  GdnParams params;

  static Result<GatedDeltaNetLayer> load(WeightLoader& w, const std::string& prefix,
                                         const ModelConfig& c, const TpShard& tp);
  int64_t proj_cols() const { return in_proj->n(); }
  int64_t mix_cols() const { return params.value_dim(); }
  // residual += out_proj(gdn(rms_norm(in.x))). proj scratch [T, proj_cols()]; core scratch
  // [T, mix_cols()]. comm: as AttentionLayer::forward.
  void forward(Kernels& k, const NormedInput& in, const StateLayerView& state, const BatchMeta& meta,
               Tensor proj, Tensor core, Tensor residual, Communicator* comm) const;
};

}  // namespace deltaserve
