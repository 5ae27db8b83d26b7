#include "model/layers/mtp_head.h"

namespace deltaserve {

Result<MtpHead> MtpHead::load(WeightLoader& w, const std::string& prefix, const ModelConfig& c, bool zc, int kv_idx,
                              const TpShard& tp) {
  MtpHead m;
  const int64_t H = c.hidden_size;
  const std::string p = prefix + ".";
  DS_ASSIGN_OR_RETURN(m.pre_norm_embedding, w.f32(p + "pre_fc_norm_embedding.weight", {H}, zc));
  DS_ASSIGN_OR_RETURN(m.pre_norm_hidden, w.f32(p + "pre_fc_norm_hidden.weight", {H}, zc));
  DS_ASSIGN_OR_RETURN(m.norm, w.f32(p + "norm.weight", {H}, zc));
  // Row-parallel over the 2H input columns (the partial outputs are all-reduced), so nothing of
  // the head is replicated but its norms (the memory plan counts it split).
  m.fc_cols = tp.part(2 * H);
  DS_ASSIGN_OR_RETURN(m.fc, w.linear({LinearPart{p + "fc.weight", H, {}}}, 2 * H, m.fc_cols));
  DS_ASSIGN_OR_RETURN(m.layer, DecoderLayer::load(w, p + "layers.0", c, LayerType::FullAttention, zc, tp));
  m.layer.kv_idx = kv_idx;
  return m;
}

void MtpHead::forward(Kernels& k, const ModelConfig& c, const LmHead& head, const MtpArgs& args, Activations& a,
                      Communicator* comm) const {
  const int T = args.meta->n_tokens;
  DS_CHECK(T <= a.max_tokens, "batch of ", T, " tokens exceeds reserve(", a.max_tokens, ")");
  const int64_t H = c.hidden_size;
  Tensor x = a.x.view(DType::F32, {T, H});
  Tensor both = a.mtp_in.view(DType::F32, {T, 2 * H});  // [norm_e(embed(t)) | norm_h(h)]
  head.embed_tokens(k, args.ids, x, comm);
  k.rms_norm(x, pre_norm_embedding.view, c.rms_norm_eps, both, 2 * H);
  Tensor second_half(static_cast<float*>(both.data) + H, DType::F32, {T, H}, both.device);
  k.rms_norm(args.hidden_in, pre_norm_hidden.view, c.rms_norm_eps, second_half, 2 * H);
  if (comm == nullptr) {
    k.matmul(both, *fc, x);
  } else {
    // This rank's input columns, contiguous (a.h is free until the layer below), then the sum.
    Tensor mine = a.h.view(DType::F32, {T, fc_cols.size()});
    k.copy_columns(both, fc_cols.begin, mine, 0, fc_cols.size());
    k.matmul(mine, *fc, x);
    comm->all_reduce_sum(x);
  }
  layer.forward(k, c, T, *args.meta, *args.memory, a, x, comm);
  head.logits(k, c.rms_norm_eps, x, norm, args.output_rows, args.n_output_rows, args.logits, args.hidden_out, a,
              comm, /*use_draft=*/true);
}

}  // namespace deltaserve
