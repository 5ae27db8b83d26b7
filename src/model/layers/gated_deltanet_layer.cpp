#include "model/layers/gated_deltanet_layer.h"

namespace deltaserve {

Result<GatedDeltaNetLayer> GatedDeltaNetLayer::load(WeightLoader& w, const std::string& prefix,
                                                    const ModelConfig& c) {
  GatedDeltaNetLayer l;
  const std::string p = prefix + ".linear_attn.";
  const int64_t H = c.hidden_size, Hv = c.linear_n_value_heads;
  const int64_t conv_dim = c.linear_conv_dim(), value_dim = c.linear_value_dim();
  DS_ASSIGN_OR_RETURN(l.in_proj, w.linear({p + "in_proj_qkv.weight", p + "in_proj_z.weight",
                                           p + "in_proj_b.weight", p + "in_proj_a.weight"},
                                          {conv_dim, value_dim, Hv, Hv}, H));
  DS_ASSIGN_OR_RETURN(l.out_proj, w.linear({p + "out_proj.weight"}, {H}, value_dim));
  DS_ASSIGN_OR_RETURN(l.conv_weight, w.f32(p + "conv1d.weight", {conv_dim, 1, c.linear_conv_kernel}));
  DS_ASSIGN_OR_RETURN(l.neg_exp_a, w.neg_exp(p + "A_log", Hv));
  DS_ASSIGN_OR_RETURN(l.dt_bias, w.f32(p + "dt_bias", {Hv}));
  DS_ASSIGN_OR_RETURN(l.norm, w.f32(p + "norm.weight", {c.linear_value_head_dim}));
  l.params.n_k_heads = c.linear_n_key_heads;
  l.params.n_v_heads = c.linear_n_value_heads;
  l.params.k_head_dim = c.linear_key_head_dim;
  l.params.v_head_dim = c.linear_value_head_dim;
  l.params.conv_kernel = c.linear_conv_kernel;
  l.params.eps = c.rms_norm_eps;
  l.params.conv_weight = l.conv_weight.view;
  l.params.neg_exp_a = l.neg_exp_a.view;
  l.params.dt_bias = l.dt_bias.view;
  l.params.norm = l.norm.view;
  return l;
}

void GatedDeltaNetLayer::forward(Kernels& k, const Tensor& x, const StateLayerView& state,
                                 const BatchMeta& meta, Tensor proj, Tensor core,
                                 Tensor residual) const {
  k.matmul(x, *in_proj, proj);
  k.gated_delta_net(params, proj, state, meta, core);
  k.matmul(core, *out_proj, residual, /*accumulate=*/true);
}

}  // namespace deltaserve
