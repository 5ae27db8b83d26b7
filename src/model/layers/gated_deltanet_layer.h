// Gated DeltaNet mixer: fused [qkv | z | b | a] projection, the GDN kernel, out_proj.
// Checkpoint names: <prefix>.linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj}.weight,
// conv1d.weight [conv_dim, 1, K], A_log [Hv], dt_bias [Hv], norm.weight [Dv].
#pragma once

#include <memory>
#include <string>

#include "model/config.h"
#include "model/weight_loader.h"

namespace deltaserve {

struct GatedDeltaNetLayer {
  std::unique_ptr<LinearWeight> in_proj;   // [conv_dim + value_dim + 2*Hv, H]
  std::unique_ptr<LinearWeight> out_proj;  // [H, value_dim]
  DeviceTensor conv_weight, neg_exp_a, dt_bias, norm;
  GdnParams params;

  static Result<GatedDeltaNetLayer> load(WeightLoader& w, const std::string& prefix,
                                         const ModelConfig& c);
  int64_t proj_cols() const { return in_proj->n(); }
  // residual += out_proj(gdn(x)). proj scratch [T, proj_cols()]; core scratch [T, value_dim].
  void forward(Kernels& k, const Tensor& x, const StateLayerView& state, const BatchMeta& meta,
               Tensor proj, Tensor core, Tensor residual) const;
};

}  // namespace deltaserve
