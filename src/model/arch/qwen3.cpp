// Dense Qwen3 (Qwen3ForCausalLM): embedding, every layer gated-free attention + SwiGLU MLP with
// plain RMSNorm (x̂ · w), final norm, lm_head (tied in the small models). Weights under "model.*".
//
//   x = embed(ids)
//   for each layer:  x += attention(norm_in(x));  x += mlp(norm_post(x))
//   logits = lm_head(norm(x))  (only the rows that need them)
#include "model/arch/architectures.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/lm_head.h"
#include "model/tensor_parallel.h"

namespace deltaserve {

namespace {

class Qwen3Model final : public Model {
 public:
  Qwen3Model(Backend& backend, ModelConfig config, Communicator* comm)
      : backend_(backend), config_(std::move(config)), comm_(comm), tp_(TpShard::of(comm)) {}

  Status load(const Checkpoint* ck, WeightDType weight_dtype, const std::string& source) {
    DS_RETURN_IF_ERROR(check_tp_split(config_, tp_.size, source));
    WeightLoader w(ck, backend_, source, weight_dtype);
    DS_ASSIGN_OR_RETURN(head_, LmHead::load(w, {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"},
                                            config_, /*zero_centred_norm=*/false, ck != nullptr, source, tp_));
    for (int i = 0; i < config_.n_layers; ++i) {
      DS_ASSIGN_OR_RETURN(DecoderLayer l, DecoderLayer::load(w, "model.layers." + std::to_string(i), config_,
                                                             LayerType::FullAttention, false, tp_));
      l.kv_idx = i;
      layers_.push_back(std::move(l));
    }
    if (auto left = w.unused({}); !left.empty()) return unexpected_tensors(source, left);
    weight_bytes_ = w.bytes_loaded();
    size_activations(config_, layers_, nullptr, act_);
    head_.size_activations(tp_, act_);
    return Status::ok();
  }

  const ModelConfig& config() const override { return config_; }
  MemorySpec memory_spec() const override { return memory_spec_of(config_, false, tp_.size); }
  std::vector<KvScale> kv_scales() const override {
    std::vector<KvScale> out;
    for (const auto& l : layers_) out.push_back(l.attn->kv_scale);
    return out;
  }
  bool has_mtp() const override { return false; }
  void reserve(int max_tokens, int max_logit_rows) override {
    act_.reserve(backend_, max_tokens, max_logit_rows, false);
  }
  std::size_t weight_bytes() const override { return weight_bytes_; }
  std::size_t decode_weight_bytes() const override { return weight_bytes_ - head_.embed_bytes; }

  void forward(const ForwardArgs& a) override {
    forward_decoder(backend_.kernels(), config_, head_, layers_, act_, comm_, a);
  }
  void forward_mtp(const MtpArgs&) override { DS_CHECK(false, "Qwen3 has no MTP head"); }
  void commit_state(const BatchMeta&, const MemoryViews&) override {}  // no recurrent state

 private:
  Backend& backend_;
  ModelConfig config_;
  Communicator* comm_ = nullptr;  // tensor parallelism (nullptr: one rank)
  TpShard tp_;
  LmHead head_;
  std::vector<DecoderLayer> layers_;
  Activations act_;
  std::size_t weight_bytes_ = 0;
};

}  // namespace

Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& c, const Checkpoint* ck, Backend& b,
                                          const ModelLoadOptions& o, const std::string& source) {
  auto m = std::make_unique<Qwen3Model>(b, c, o.comm);
  if (Status s = m->load(ck, o.weight_dtype, source); !s) return s;
  return std::unique_ptr<Model>(std::move(m));
}

}  // namespace deltaserve
