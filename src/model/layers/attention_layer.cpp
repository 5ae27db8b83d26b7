#include "model/layers/attention_layer.h"

#include <cmath>
#include <optional>

namespace deltaserve {

namespace {

// The k ('k') or v ('v') cache scale of one attention layer (p = "<layer>.self_attn."): the one
// of its accepted names the checkpoint has; 1 when it has none, an error when it has two.
Result<float> kv_cache_scale(WeightLoader& w, const std::string& p, char which) {
  const std::string x(1, which);
  const std::string names[] = {p + x + "_scale", p + "attn." + x + "_scale", p + x + "_proj." + x + "_scale",
                               p + "kv_scale"};
  std::optional<float> found;
  std::string found_name;
  for (const auto& n : names) {
    DS_ASSIGN_OR_RETURN(std::optional<float> v, w.optional_scalar(n));
    if (!v) continue;
    if (found) return error("checkpoint has two ", x, " cache scales for one layer: '", found_name, "' and '", n, "'");
    found = v;
    found_name = n;
  }
  return found.value_or(1.f);
}

}  // namespace

Result<AttentionLayer> AttentionLayer::load(WeightLoader& w, const std::string& prefix,
                                            const ModelConfig& c, bool zero_centred_norm, const TpShard& tp) {
  AttentionLayer l;
  const std::string p = prefix + ".self_attn.";
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_per_head = hd * (c.attn_output_gate ? 2 : 1);  // q | gate rows of one head
  const RowRange heads = tp.part(c.n_heads), kv = tp.kv_heads(c.n_kv_heads);
  DS_ASSIGN_OR_RETURN(l.qkv_proj, w.linear({LinearPart{p + "q_proj.weight", c.n_heads * q_per_head, {heads.scaled(q_per_head)}},
                                            LinearPart{p + "k_proj.weight", c.n_kv_heads * hd, {kv.scaled(hd)}},
                                            LinearPart{p + "v_proj.weight", c.n_kv_heads * hd, {kv.scaled(hd)}}},
                                           H));
  DS_ASSIGN_OR_RETURN(l.o_proj, w.linear({LinearPart{p + "o_proj.weight", H, {}}}, int64_t(c.n_heads) * hd,
                                         heads.scaled(hd)));
  DS_ASSIGN_OR_RETURN(l.q_norm, w.f32(p + "q_norm.weight", {hd}, zero_centred_norm));
  DS_ASSIGN_OR_RETURN(l.k_norm, w.f32(p + "k_norm.weight", {hd}, zero_centred_norm));
  l.params.n_heads = static_cast<int>(heads.size());
  l.params.n_kv_heads = static_cast<int>(kv.size());
  l.params.head_dim = c.head_dim;
  l.params.rotary_dim = c.rotary_dim;
  l.params.rope_theta = static_cast<float>(c.rope_theta);
  l.params.output_gate = c.attn_output_gate;
  l.params.eps = c.rms_norm_eps;
  l.params.q_norm = l.q_norm.view;
  l.params.k_norm = l.k_norm.view;
  l.params.scale = 1.0f / std::sqrt(float(c.head_dim));
  l.params.then = l.o_proj.get();
  DS_ASSIGN_OR_RETURN(auto ks, kv_cache_scale(w, p, 'k'));
  DS_ASSIGN_OR_RETURN(auto vs, kv_cache_scale(w, p, 'v'));
  l.kv_scale = KvScale{ks, vs};
  return l;
}

void AttentionLayer::forward(Kernels& k, const NormedInput& in, const KvLayerView& kv,
                             const BatchMeta& meta, Tensor proj, Tensor attn, Tensor residual,
                             Communicator* comm) const {
  k.rms_norm_matmul(in.x, in.norm, in.eps, *qkv_proj, proj, false, in.normed);
  k.attention(params, proj, kv, meta, attn);
  // Tensor parallel: rank 0 adds its partial sum to the residual, the others replace theirs with
  // it; the all-reduce leaves residual + every partial on every rank.
  k.matmul(attn, *o_proj, residual, /*accumulate=*/comm == nullptr || comm->rank() == 0);
  if (comm) comm->all_reduce_sum(residual);
}

}  // namespace deltaserve
