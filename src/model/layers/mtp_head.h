// MtpHead: Qwen3.5's multi-token-prediction head (NEXTN). Row p takes the embedding of the token
// after p and the previous hidden h_p:
//   x = fc([norm_e(embed(t_{p+1})) | norm_h(h_p)]);  x = DecoderLayer(x);  logits = lm_head(norm(x))
// Its attention layer keeps KV like any other (KV layer kv_idx, the sequence's block table); the
// embedding and lm_head are the main model's. Checkpoint names: mtp.{pre_fc_norm_embedding,
// pre_fc_norm_hidden, fc, norm}.weight and mtp.layers.0.*.
#pragma once

#include <memory>
#include <string>

#include "model/layers/decoder_layer.h"
#include "model/layers/lm_head.h"

namespace deltaserve {

struct MtpHead {
  DeviceTensor pre_norm_embedding, pre_norm_hidden, norm;  // [H] f32
  std::unique_ptr<LinearWeight> fc;                        // [H, 2H] (tensor parallel: [H, 2H/P], input columns)
  RowRange fc_cols;                                        // this rank's input columns of fc
  DecoderLayer layer;                                      // full attention

  static Result<MtpHead> load(WeightLoader& w, const std::string& prefix, const ModelConfig& c, bool zero_centred_norm,
                              int kv_idx, const TpShard& tp);
  void forward(Kernels& k, const ModelConfig& c, const LmHead& head, const MtpArgs& args, Activations& a,
               Communicator* comm) const;
};

}  // namespace deltaserve
