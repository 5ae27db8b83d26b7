// Full (gated) attention mixer: fused q(+gate)/k/v projection, the attention kernel, o_proj.
// Checkpoint names: <prefix>.self_attn.{q_proj,k_proj,v_proj,o_proj,q_norm,k_norm}.weight, and
// optionally the fp8 KV cache scales under the names SGLang / vLLM accept (scalars):
//   self_attn.{k_scale,v_scale}             (compressed-tensors, Quark)
//   self_attn.attn.{k_scale,v_scale}        (the attention module's own parameter names)
//   self_attn.k_proj.k_scale, v_proj.v_scale (NVIDIA ModelOpt)
//   self_attn.kv_scale                      (deprecated: one scale for both)
#pragma once

#include <memory>
#include <string>

#include "backend/communicator.h"
#include "model/config.h"
#include "model/model.h"
#include "model/layers/normed_input.h"
#include "model/weight_loader.h"

namespace deltaserve {

struct AttentionLayer {
  // Shapes per tensor-parallel rank (n_heads, n_kv_heads: this rank's, params.n_heads / n_kv_heads).
  std::unique_ptr<LinearWeight> qkv_proj;  // [q_cols + 2*kv_cols, H]
  std::unique_ptr<LinearWeight> o_proj;    // [H, n_heads*head_dim]
  DeviceTensor q_norm, k_norm;             // [head_dim] f32
  AttentionParams params;
  KvScale kv_scale;                        // from the checkpoint, else 1

  static Result<AttentionLayer> load(WeightLoader& w, const std::string& prefix,
                                     const ModelConfig& c, bool zero_centred_norm, const TpShard& tp);
  int64_t proj_cols() const { return qkv_proj->n(); }
  int64_t mix_cols() const { return int64_t(params.n_heads) * params.head_dim; }
  // residual += o_proj(attention(rms_norm(in.x))). proj scratch [T, proj_cols()]; attn scratch
  // [T, mix_cols()]. comm (tensor parallelism): the ranks' partial o_proj outputs are summed into
  // the residual (one all-reduce).
  void forward(Kernels& k, const NormedInput& in, const KvLayerView& kv, const BatchMeta& meta,
               Tensor proj, Tensor attn, Tensor residual, Communicator* comm) const;
};

}  // namespace deltaserve
