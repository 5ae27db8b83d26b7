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
                                            const ModelConfig& c, bool zero_centred_norm) {
  AttentionLayer l;
  const std::string p = prefix + ".self_attn.";
  const int64_t H = c.hidden_size, hd = c.head_dim;
  const int64_t q_rows = int64_t(c.n_heads) * hd * (c.attn_output_gate ? 2 : 1);
  const int64_t kv_rows = int64_t(c.n_kv_heads) * hd;
  DS_ASSIGN_OR_RETURN(l.qkv_proj, w.linear({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"},
                                           {q_rows, kv_rows, kv_rows}, H));
  DS_ASSIGN_OR_RETURN(l.o_proj, w.linear({p + "o_proj.weight"}, {H}, int64_t(c.n_heads) * hd));
  DS_ASSIGN_OR_RETURN(l.q_norm, w.f32(p + "q_norm.weight", {hd}, zero_centred_norm));
  DS_ASSIGN_OR_RETURN(l.k_norm, w.f32(p + "k_norm.weight", {hd}, zero_centred_norm));
  l.params.n_heads = c.n_heads;
  l.params.n_kv_heads = c.n_kv_heads;
  l.params.head_dim = c.head_dim;
  l.params.rotary_dim = c.rotary_dim;
  l.params.rope_theta = static_cast<float>(c.rope_theta);
  l.params.output_gate = c.attn_output_gate;
  l.params.eps = c.rms_norm_eps;
  l.params.q_norm = l.q_norm.view;
  l.params.k_norm = l.k_norm.view;
  l.params.scale = 1.0f / std::sqrt(float(c.head_dim));
  DS_ASSIGN_OR_RETURN(auto ks, kv_cache_scale(w, p, 'k'));
  DS_ASSIGN_OR_RETURN(auto vs, kv_cache_scale(w, p, 'v'));
  l.kv_scale = KvScale{ks, vs};
  return l;
}

void AttentionLayer::forward(Kernels& k, const Tensor& x, const KvLayerView& kv,
                             const BatchMeta& meta, Tensor proj, Tensor attn, Tensor residual) const {
  k.matmul(x, *qkv_proj, proj);
  k.attention(params, proj, kv, meta, attn);
  k.matmul(attn, *o_proj, residual, /*accumulate=*/true);
}

}  // namespace deltaserve
