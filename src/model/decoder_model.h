// DecoderModel: the layer loop shared by dense Qwen3 and hybrid Qwen3.5/3.6 (Gated DeltaNet +
// gated attention), plus the Qwen3.5 MTP head. The arch files (arch/*.cpp) only choose naming and
// options; registry.cpp maps `architectures` to them.
//
//   x = embed(ids)
//   for each layer:  x += mixer(norm_in(x));  x += mlp(norm_post(x))
//   h = norm_final(x);  logits = h · lm_headᵀ   (only for the requested output rows)
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/layers/attention_layer.h"
#include "model/layers/gated_deltanet_layer.h"
#include "model/layers/mlp.h"
#include "model/model.h"

namespace deltaserve {

struct DecoderNaming {
  std::string layers;   // e.g. "model.language_model.layers"
  std::string embed;    // e.g. "model.language_model.embed_tokens.weight"
  std::string norm;     // final norm weight
  std::string lm_head;  // "lm_head.weight" (unused when tied)
  std::string mtp;      // "mtp" (prefix of the MTP head's tensors)
  std::vector<std::string> ignored_prefixes;  // e.g. the vision tower
};

struct DecoderOptions {
  bool zero_centred_norm = false;  // Qwen3.5: y = x̂ · (1 + w)
  bool load_mtp = true;
};

class DecoderModel final : public Model {
 public:
  static Result<std::unique_ptr<DecoderModel>> load(const ModelConfig& config,
                                                    const Checkpoint* checkpoint, Backend& backend,
                                                    const DecoderNaming& naming,
                                                    const DecoderOptions& options,
                                                    const std::string& source);

  const ModelConfig& config() const override { return config_; }
  MemorySpec memory_spec() const override;
  std::vector<KvScale> kv_scales() const override;
  bool has_mtp() const override { return mtp_.has_value(); }
  void reserve(int max_tokens) override;
  void forward(const ForwardArgs& args) override;
  void forward_mtp(const MtpArgs& args) override;
  void commit_state(const BatchMeta& commit, const MemoryViews& memory) override;
  std::size_t weight_bytes() const override { return weight_bytes_; }
  std::size_t decode_weight_bytes() const override { return decode_weight_bytes_; }

 private:
  struct Layer {
    LayerType type = LayerType::FullAttention;
    DeviceTensor input_norm, post_norm;  // [H] f32
    std::optional<AttentionLayer> attn;
    std::optional<GatedDeltaNetLayer> gdn;
    Mlp mlp;
    int kv_idx = -1, state_idx = -1;
  };
  struct MtpHead {
    DeviceTensor pre_norm_embedding, pre_norm_hidden, norm;  // [H] f32
    std::unique_ptr<LinearWeight> fc;                        // [H, 2H]
    Layer layer;
  };

  DecoderModel(Backend& backend, ModelConfig config) : backend_(backend), config_(std::move(config)) {}
  static Result<Layer> load_layer(WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                  LayerType type, bool zero_centred);
  // Runs one decoder layer on the residual stream x [T, H].
  void run_layer(const Layer& layer, int T, const BatchMeta& meta, const MemoryViews& memory, Tensor x);
  // Final norm of the requested rows of x and their logits.
  void head(int T, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
            Tensor logits, Tensor hidden_all);

  Backend& backend_;
  ModelConfig config_;
  DeviceTensor embed_;                    // [V, H]
  std::unique_ptr<LinearWeight> lm_head_; // [V, H]
  DeviceTensor final_norm_;               // [H]
  std::vector<Layer> layers_;
  std::optional<MtpHead> mtp_;
  std::size_t weight_bytes_ = 0, decode_weight_bytes_ = 0;
  std::vector<GdnLayerRef> gdn_refs_;  // [GDN layers] for commit_state (sized at load)

  // Activation buffers for up to max_tokens_ rows (sized once by reserve()).
  int max_tokens_ = 0;
  int64_t max_proj_ = 0, max_mix_ = 0;
  DeviceBuffer x_buf_, h_buf_, proj_buf_, mix_buf_, gu_buf_, act_buf_, rows_buf_, rows_norm_buf_, mtp_in_buf_;
};

}  // namespace deltaserve
