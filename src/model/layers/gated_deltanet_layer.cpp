#include "model/layers/gated_deltanet_layer.h"

namespace deltaserve {

Result<GatedDeltaNetLayer> GatedDeltaNetLayer::load(WeightLoader& w, const std::string& prefix,
                                                    const ModelConfig& c, const TpShard& tp) {
  GatedDeltaNetLayer l;
  const std::string p = prefix + ".linear_attn.";
  const int64_t H = c.hidden_size, Hv = c.linear_n_value_heads, Dk = c.linear_key_head_dim,
                Dv = c.linear_value_head_dim;
  const int64_t conv_dim = c.linear_conv_dim(), value_dim = c.linear_value_dim(), key_dim = c.linear_key_dim();
  // This rank's key heads kh and value heads vh: rows of q, k and v within in_proj_qkv / conv1d,
  // of z, and of the per-head b, a, A_log, dt_bias.
  const RowRange kh = tp.part(c.linear_n_key_heads), vh = tp.part(Hv);
  const std::vector<RowRange> qkv_rows = {kh.scaled(Dk), kh.scaled(Dk).shifted(key_dim),
                                          vh.scaled(Dv).shifted(2 * key_dim)};
  DS_ASSIGN_OR_RETURN(l.in_proj, w.linear({LinearPart{p + "in_proj_qkv.weight", conv_dim, qkv_rows},
                                           LinearPart{p + "in_proj_z.weight", value_dim, {vh.scaled(Dv)}},
                                           LinearPart{p + "in_proj_b.weight", Hv, {vh}},
                                           LinearPart{p + "in_proj_a.weight", Hv, {vh}}},
                                          H));
  DS_ASSIGN_OR_RETURN(l.out_proj, w.linear({LinearPart{p + "out_proj.weight", H, {}}}, value_dim, vh.scaled(Dv)));
  DS_ASSIGN_OR_RETURN(l.conv_weight, w.f32(p + "conv1d.weight", {conv_dim, 1, c.linear_conv_kernel}, false, qkv_rows));
  DS_ASSIGN_OR_RETURN(l.neg_exp_a, w.neg_exp(p + "A_log", Hv, {vh}));
  DS_ASSIGN_OR_RETURN(l.dt_bias, w.f32(p + "dt_bias", {Hv}, false, {vh}));
  DS_ASSIGN_OR_RETURN(l.norm, w.f32(p + "norm.weight", {c.linear_value_head_dim}));
  l.params.n_k_heads = static_cast<int>(kh.size());
  l.params.n_v_heads = static_cast<int>(vh.size());
  l.params.k_head_dim = c.linear_key_head_dim;
  l.params.v_head_dim = c.linear_value_head_dim;
  l.params.conv_kernel = c.linear_conv_kernel;
  l.params.eps = c.rms_norm_eps;
  l.params.conv_weight = l.conv_weight.view;
  l.params.neg_exp_a = l.neg_exp_a.view;
  l.params.dt_bias = l.dt_bias.view;
  l.params.norm = l.norm.view;
  l.params.then = l.out_proj.get();
  return l;
}

void GatedDeltaNetLayer::forward(Kernels& k, const NormedInput& in, const StateLayerView& state,
                                 const BatchMeta& meta, Tensor proj, Tensor core,
                                 Tensor residual, Communicator* comm) const {
  k.rms_norm_matmul(in.x, in.norm, in.eps, *in_proj, proj, false, in.normed);
  k.gated_delta_net(params, proj, state, meta, core);
  k.matmul(core, *out_proj, residual, /*accumulate=*/comm == nullptr || comm->rank() == 0);
  if (comm) comm->all_reduce_sum(residual);
}

}  // namespace deltaserve
