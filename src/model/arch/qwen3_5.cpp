// Qwen3.5 / Qwen3.6 hybrid: Gated DeltaNet and gated attention layers (config layer_types),
// zero-centred RMSNorm (stored as 1 + w), and an MTP head for speculative decoding.
// Qwen3_5ForConditionalGeneration nests the text model under "model.language_model.*" and ships a
// vision tower ("model.visual.*", skipped for text serving); Qwen3_5ForCausalLM is flat.
//
//   x = embed(ids)
//   for each layer:  x += (layer_types[i] == linear ? gated_delta_net : gated_attention)(norm_in(x))
//                    x += mlp(norm_post(x))
//   logits = lm_head(norm(x))              forward
//   MtpHead(embed(t_{p+1}), h_p)           forward_mtp (drafts)
//   replay accepted tokens into GDN state  commit_state (speculative rollback)
#include "model/arch/architectures.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/lm_head.h"
#include "model/tensor_parallel.h"
#include "model/layers/mtp_head.h"

namespace deltaserve {

namespace {

class Qwen3_5Model final : public Model {
 public:
  Qwen3_5Model(Backend& backend, ModelConfig config, Communicator* comm)
      : backend_(backend), config_(std::move(config)), comm_(comm), tp_(TpShard::of(comm)) {}

  Status load(const Checkpoint* ck, const ModelLoadOptions& o, const std::string& source) {
    DS_RETURN_IF_ERROR(check_tp_split(config_, tp_.size, source));
    WeightLoader w(ck, backend_, source, o.weight_dtype);
    const std::string base = config_.nested_layout ? "model.language_model" : "model";
    DS_ASSIGN_OR_RETURN(head_, LmHead::load(w, {base + ".embed_tokens.weight", base + ".norm.weight", "lm_head.weight"},
                                            config_, /*zero_centred_norm=*/true, ck != nullptr, source, tp_));
    int n_kv = 0, n_state = 0;
    for (int i = 0; i < config_.n_layers; ++i) {
      DS_ASSIGN_OR_RETURN(DecoderLayer l, DecoderLayer::load(w, base + ".layers." + std::to_string(i), config_,
                                                             config_.layer_types[i], true, tp_));
      if (l.attn) l.kv_idx = n_kv++;
      else l.state_idx = n_state++;
      layers_.push_back(std::move(l));
    }
    gdn_refs_.resize(static_cast<std::size_t>(n_state));
    decode_weight_bytes_ = w.bytes_loaded() - head_.embed_bytes;
    std::vector<std::string> ignored = {"model.visual."};
    if (o.load_mtp && config_.mtp_n_layers > 0 && (!ck || w.has("mtp.fc.weight"))) {
      if (config_.mtp_n_layers != 1)
        return error(source, ": only one MTP layer is supported (config has ", config_.mtp_n_layers, ")");
      DS_ASSIGN_OR_RETURN(MtpHead m, MtpHead::load(w, "mtp", config_, true, n_kv, tp_));
      mtp_ = std::move(m);
      if (!o.draft_vocab.empty()) DS_RETURN_IF_ERROR(head_.load_draft_vocab(w, backend_, o.draft_vocab));
    } else {
      ignored.push_back("mtp.");
    }
    if (auto left = w.unused(ignored); !left.empty()) return unexpected_tensors(source, left);
    weight_bytes_ = w.bytes_loaded();
    size_activations(config_, layers_, mtp_ ? &mtp_->layer : nullptr, act_);
    head_.size_activations(tp_, act_);
    return Status::ok();
  }

  const ModelConfig& config() const override { return config_; }
  MemorySpec memory_spec() const override { return memory_spec_of(config_, mtp_.has_value(), tp_.size); }
  std::vector<KvScale> kv_scales() const override {
    std::vector<KvScale> out(static_cast<std::size_t>(memory_spec().n_kv_layers));
    for (const auto& l : layers_)
      if (l.attn) out[l.kv_idx] = l.attn->kv_scale;
    if (mtp_) out[mtp_->layer.kv_idx] = mtp_->layer.attn->kv_scale;
    return out;
  }
  bool has_mtp() const override { return mtp_.has_value(); }
  void reserve(int max_tokens, int max_logit_rows) override {
    act_.reserve(backend_, max_tokens, max_logit_rows, mtp_.has_value());
  }
  std::size_t weight_bytes() const override { return weight_bytes_; }
  std::size_t decode_weight_bytes() const override { return decode_weight_bytes_; }

  void forward(const ForwardArgs& a) override {
    forward_decoder(backend_.kernels(), config_, head_, layers_, act_, comm_, a);
  }

  void forward_mtp(const MtpArgs& a) override {
    DS_CHECK(mtp_.has_value(), "model has no MTP head");
    mtp_->forward(backend_.kernels(), config_, head_, a, act_, comm_);
  }

  void commit_state(const BatchMeta& commit, const MemoryViews& memory) override {
    if (gdn_refs_.empty() || commit.n_seqs == 0) return;
    for (const auto& l : layers_)
      if (l.gdn) gdn_refs_[l.state_idx] = GdnLayerRef{&l.gdn->params, &memory.state[l.state_idx]};
    backend_.kernels().gdn_commit(gdn_refs_, commit);
  }

 private:
  Backend& backend_;
  ModelConfig config_;
  Communicator* comm_ = nullptr;  // tensor parallelism (nullptr: one rank)
  TpShard tp_;
  LmHead head_;
  std::vector<DecoderLayer> layers_;
  std::optional<MtpHead> mtp_;
  Activations act_;
  std::vector<GdnLayerRef> gdn_refs_;  // [GDN layers] for commit_state (sized at load)
  std::size_t weight_bytes_ = 0, decode_weight_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                            const ModelLoadOptions& o, const std::string& source) {
  auto m = std::make_unique<Qwen3_5Model>(b, c, o.comm);
  if (Status s = m->load(ck, o, source); !s) return s;
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace deltaserve
