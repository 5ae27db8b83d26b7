#include "model/decoder_model.h"

#include <algorithm>

namespace deltaserve {

Result<DecoderModel::Layer> DecoderModel::load_layer(WeightLoader& w, const std::string& prefix,
                                                     const ModelConfig& c, LayerType type,
                                                     bool zero_centred) {
  Layer l;
  l.type = type;
  const int64_t H = c.hidden_size;
  DS_ASSIGN_OR_RETURN(l.input_norm, w.f32(prefix + ".input_layernorm.weight", {H}, zero_centred));
  DS_ASSIGN_OR_RETURN(l.post_norm, w.f32(prefix + ".post_attention_layernorm.weight", {H}, zero_centred));
  if (type == LayerType::FullAttention) {
    DS_ASSIGN_OR_RETURN(auto attn, AttentionLayer::load(w, prefix, c, zero_centred));
    l.attn = std::move(attn);
  } else {
    DS_ASSIGN_OR_RETURN(auto gdn, GatedDeltaNetLayer::load(w, prefix, c));
    l.gdn = std::move(gdn);
  }
  DS_ASSIGN_OR_RETURN(l.mlp, Mlp::load(w, prefix, c));
  return l;
}

Result<std::unique_ptr<DecoderModel>> DecoderModel::load(const ModelConfig& config,
                                                         const Checkpoint* checkpoint,
                                                         Backend& backend,
                                                         const DecoderNaming& naming,
                                                         const DecoderOptions& options,
                                                         const std::string& source) {
  std::unique_ptr<DecoderModel> m(new DecoderModel(backend, config));
  WeightLoader w(checkpoint, backend, source);
  const ModelConfig& c = m->config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  DS_ASSIGN_OR_RETURN(m->embed_, w.embedding(naming.embed, V, H));
  const std::size_t embed_bytes = w.bytes_loaded();
  const std::string lm_name =
      (c.tie_word_embeddings || (checkpoint && !w.has(naming.lm_head))) ? naming.embed : naming.lm_head;
  if (!c.tie_word_embeddings && checkpoint && !w.has(naming.lm_head))
    return error(source, ": missing tensor '", naming.lm_head, "' (and tie_word_embeddings is false)");
  DS_ASSIGN_OR_RETURN(m->lm_head_, w.linear({lm_name}, {V}, H));
  DS_ASSIGN_OR_RETURN(m->final_norm_, w.f32(naming.norm, {H}, options.zero_centred_norm));

  int n_kv = 0, n_state = 0;
  for (int i = 0; i < c.n_layers; ++i) {
    DS_ASSIGN_OR_RETURN(Layer l, load_layer(w, naming.layers + "." + std::to_string(i), c,
                                            c.layer_types[i], options.zero_centred_norm));
    if (l.type == LayerType::FullAttention) l.kv_idx = n_kv++;
    else l.state_idx = n_state++;
    m->layers_.push_back(std::move(l));
  }

  m->gdn_refs_.resize(n_state);
  m->decode_weight_bytes_ = w.bytes_loaded() - embed_bytes;
  std::vector<std::string> ignored = naming.ignored_prefixes;
  if (options.load_mtp && c.mtp_n_layers > 0 && (!checkpoint || w.has(naming.mtp + ".fc.weight"))) {
    if (c.mtp_n_layers != 1) return error(source, ": only one MTP layer is supported (config has ", c.mtp_n_layers, ")");
    MtpHead mtp;
    const std::string p = naming.mtp + ".";
    const bool zc = options.zero_centred_norm;
    DS_ASSIGN_OR_RETURN(mtp.pre_norm_embedding, w.f32(p + "pre_fc_norm_embedding.weight", {H}, zc));
    DS_ASSIGN_OR_RETURN(mtp.pre_norm_hidden, w.f32(p + "pre_fc_norm_hidden.weight", {H}, zc));
    DS_ASSIGN_OR_RETURN(mtp.norm, w.f32(p + "norm.weight", {H}, zc));
    DS_ASSIGN_OR_RETURN(mtp.fc, w.linear({p + "fc.weight"}, {H}, 2 * H));
    DS_ASSIGN_OR_RETURN(mtp.layer, load_layer(w, p + "layers.0", c, LayerType::FullAttention, zc));
    mtp.layer.kv_idx = n_kv;
    m->mtp_ = std::move(mtp);
  } else {
    ignored.push_back(naming.mtp + ".");
  }
  auto leftovers = w.unused(ignored);
  if (!leftovers.empty()) {
    std::string list;
    for (std::size_t i = 0; i < leftovers.size() && i < 5; ++i) list += (i ? ", " : "") + leftovers[i];
    return error(source, ": ", leftovers.size(), " unexpected tensor(s) in the checkpoint: ", list);
  }
  m->weight_bytes_ = w.bytes_loaded();
  return m;
}

MemorySpec DecoderModel::memory_spec() const { return memory_spec_of(config_, mtp_.has_value()); }

std::vector<KvScale> DecoderModel::kv_scales() const {
  std::vector<KvScale> out(static_cast<std::size_t>(memory_spec().n_kv_layers));
  for (const auto& l : layers_)
    if (l.attn) out[l.kv_idx] = l.attn->kv_scale;
  if (mtp_) out[mtp_->layer.kv_idx] = mtp_->layer.attn->kv_scale;
  return out;
}

void DecoderModel::reserve(int max_tokens) {
  if (max_tokens <= max_tokens_) return;
  max_tokens_ = max_tokens;
  const int64_t T = max_tokens, H = config_.hidden_size;
  max_proj_ = 0;
  max_mix_ = 0;
  auto consider = [&](const Layer& l) {
    if (l.attn) {
      max_proj_ = std::max(max_proj_, l.attn->proj_cols());
      max_mix_ = std::max<int64_t>(max_mix_, int64_t(config_.n_heads) * config_.head_dim);
    } else {
      max_proj_ = std::max(max_proj_, l.gdn->proj_cols());
      max_mix_ = std::max(max_mix_, config_.linear_value_dim());
    }
  };
  for (const auto& l : layers_) consider(l);
  if (mtp_) consider(mtp_->layer);
  const int64_t I = config_.intermediate_size;
  const std::size_t f = sizeof(float);
  x_buf_ = backend_.allocate(T * H * f);
  h_buf_ = backend_.allocate(T * H * f);
  proj_buf_ = backend_.allocate(T * max_proj_ * f);
  mix_buf_ = backend_.allocate(T * max_mix_ * f);
  gu_buf_ = backend_.allocate(T * 2 * I * f);
  act_buf_ = backend_.allocate(T * I * f);
  rows_buf_ = backend_.allocate(T * H * f);
  rows_norm_buf_ = backend_.allocate(T * H * f);
  mtp_in_buf_ = mtp_ ? backend_.allocate(T * 2 * H * f) : DeviceBuffer();
}

void DecoderModel::run_layer(const Layer& l, int T, const BatchMeta& meta, const MemoryViews& memory,
                             Tensor x) {
  Kernels& k = backend_.kernels();
  const int64_t H = config_.hidden_size;
  Tensor h = h_buf_.view(DType::F32, {T, H});
  k.rms_norm(x, l.input_norm.view, config_.rms_norm_eps, h);
  if (l.attn) {
    l.attn->forward(k, h, memory.kv[l.kv_idx], meta, proj_buf_.view(DType::F32, {T, l.attn->proj_cols()}),
                    mix_buf_.view(DType::F32, {T, int64_t(config_.n_heads) * config_.head_dim}), x);
  } else {
    l.gdn->forward(k, h, memory.state[l.state_idx], meta,
                   proj_buf_.view(DType::F32, {T, l.gdn->proj_cols()}),
                   mix_buf_.view(DType::F32, {T, config_.linear_value_dim()}), x);
  }
  k.rms_norm(x, l.post_norm.view, config_.rms_norm_eps, h);
  const int64_t I = l.mlp.intermediate();
  l.mlp.forward(k, h, gu_buf_.view(DType::F32, {T, 2 * I}), act_buf_.view(DType::F32, {T, I}), x);
}

void DecoderModel::head(int T, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
                        Tensor logits, Tensor hidden_all) {
  Kernels& k = backend_.kernels();
  const int64_t H = config_.hidden_size;
  Tensor normed = rows_norm_buf_.view(DType::F32, {n_rows, H});
  if (hidden_all.data) {
    k.rms_norm(x, norm.view, config_.rms_norm_eps, hidden_all);
    if (n_rows > 0) k.gather_rows(hidden_all, rows, n_rows, normed);
  } else if (n_rows > 0) {
    Tensor picked = rows_buf_.view(DType::F32, {n_rows, H});
    k.gather_rows(x, rows, n_rows, picked);
    k.rms_norm(picked, norm.view, config_.rms_norm_eps, normed);
  }
  if (n_rows > 0) k.matmul(normed, *lm_head_, logits);
  (void)T;
}

void DecoderModel::forward(const ForwardArgs& a) {
  const int T = a.meta->n_tokens;
  DS_CHECK(T <= max_tokens_, "batch of ", T, " tokens exceeds reserve(", max_tokens_, ")");
  Kernels& k = backend_.kernels();
  Tensor x = x_buf_.view(DType::F32, {T, config_.hidden_size});
  k.embed(embed_.view, a.ids, x);
  if (a.observer) (*a.observer)(-1, x);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    run_layer(layers_[i], T, *a.meta, *a.memory, x);
    if (a.observer) (*a.observer)(static_cast<int>(i), x);
  }
  head(T, x, final_norm_, a.output_rows, a.n_output_rows, a.logits, a.hidden);
}

void DecoderModel::commit_state(const BatchMeta& commit, const MemoryViews& memory) {
  if (gdn_refs_.empty() || commit.n_seqs == 0) return;
  for (const Layer& l : layers_)
    if (l.gdn) gdn_refs_[l.state_idx] = GdnLayerRef{&l.gdn->params, &memory.state[l.state_idx]};
  backend_.kernels().gdn_commit(gdn_refs_, commit);
}

void DecoderModel::forward_mtp(const MtpArgs& a) {
  DS_CHECK(mtp_.has_value(), "model has no MTP head");
  const int T = a.meta->n_tokens;
  DS_CHECK(T <= max_tokens_, "batch of ", T, " tokens exceeds reserve(", max_tokens_, ")");
  Kernels& k = backend_.kernels();
  const int64_t H = config_.hidden_size;
  Tensor x = x_buf_.view(DType::F32, {T, H});
  Tensor both = mtp_in_buf_.view(DType::F32, {T, 2 * H});  // [norm_e(embed(t)) | norm_h(h)]
  k.embed(embed_.view, a.ids, x);
  k.rms_norm(x, mtp_->pre_norm_embedding.view, config_.rms_norm_eps, both, 2 * H);
  Tensor second_half(static_cast<float*>(both.data) + H, DType::F32, {T, H}, both.device);
  k.rms_norm(a.hidden_in, mtp_->pre_norm_hidden.view, config_.rms_norm_eps, second_half, 2 * H);
  k.matmul(both, *mtp_->fc, x);
  run_layer(mtp_->layer, T, *a.meta, *a.memory, x);
  head(T, x, mtp_->norm, a.output_rows, a.n_output_rows, a.logits, a.hidden_out);
}

}  // namespace deltaserve
