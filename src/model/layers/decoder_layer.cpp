#include "model/layers/decoder_layer.h"

#include "model/layers/lm_head.h"

#include <algorithm>

namespace deltaserve {

Result<DecoderLayer> DecoderLayer::load(WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                        LayerType type, bool zero_centred, const TpShard& tp) {
  DecoderLayer l;
  l.type = type;
  const int64_t H = c.hidden_size;
  DS_ASSIGN_OR_RETURN(l.input_norm, w.f32(prefix + ".input_layernorm.weight", {H}, zero_centred));
  DS_ASSIGN_OR_RETURN(l.post_norm, w.f32(prefix + ".post_attention_layernorm.weight", {H}, zero_centred));
  if (type == LayerType::FullAttention) {
    DS_ASSIGN_OR_RETURN(auto attn, AttentionLayer::load(w, prefix, c, zero_centred, tp));
    l.attn = std::move(attn);
  } else {
    DS_ASSIGN_OR_RETURN(auto gdn, GatedDeltaNetLayer::load(w, prefix, c, tp));
    l.gdn = std::move(gdn);
  }
  DS_ASSIGN_OR_RETURN(l.mlp, Mlp::load(w, prefix, c, tp));
  return l;
}

void DecoderLayer::forward(Kernels& k, const ModelConfig& c, int T, const BatchMeta& meta, const MemoryViews& memory,
                           Activations& a, Tensor x, Communicator* comm) const {
  const int64_t H = c.hidden_size;
  Tensor h = a.h.view(DType::F32, {T, H});  // scratch of the norms (unwritten where they fold into a GEMV)
  Tensor proj = a.proj.view(DType::F32, {T, proj_cols()});
  Tensor mix = a.mix.view(DType::F32, {T, mix_cols()});
  const NormedInput mixer_in{x, input_norm.view, c.rms_norm_eps, h};
  if (attn) attn->forward(k, mixer_in, memory.kv[kv_idx], meta, proj, mix, x, comm);
  else gdn->forward(k, mixer_in, memory.state[state_idx], meta, proj, mix, x, comm);
  const int64_t I = mlp.intermediate();
  mlp.forward(k, NormedInput{x, post_norm.view, c.rms_norm_eps, h}, a.gu.view(DType::F32, {T, 2 * I}),
              a.act.view(DType::F32, {T, I}), x, comm);
}

void size_activations(const ModelConfig& c, std::span<const DecoderLayer> layers, const DecoderLayer* extra,
                      Activations& a) {
  a.hidden = c.hidden_size;
  a.intermediate = 0;
  auto consider = [&](const DecoderLayer& l) {
    a.max_proj = std::max(a.max_proj, l.proj_cols());
    a.max_mix = std::max(a.max_mix, l.mix_cols());
    a.intermediate = std::max(a.intermediate, l.mlp.intermediate());
  };
  for (const auto& l : layers) consider(l);
  if (extra) consider(*extra);
}

void forward_decoder(Kernels& k, const ModelConfig& c, const LmHead& head, std::span<const DecoderLayer> layers,
                     Activations& act, Communicator* comm, const ForwardArgs& a) {
  const int T = a.meta->n_tokens;
  DS_CHECK(T <= act.max_tokens, "batch of ", T, " tokens exceeds reserve(", act.max_tokens, ")");
  Tensor x = act.x.view(DType::F32, {T, c.hidden_size});  // [T, H], the residual stream
  head.embed_tokens(k, a.ids, x, comm);
  if (a.observer) (*a.observer)(-1, x);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    layers[i].forward(k, c, T, *a.meta, *a.memory, act, x, comm);
    if (a.observer) (*a.observer)(static_cast<int>(i), x);
  }
  head.logits(k, c.rms_norm_eps, x, head.final_norm, a.output_rows, a.n_output_rows, a.logits, a.hidden, act, comm);
}

}  // namespace deltaserve
