#include "model/layers/lm_head.h"

namespace deltaserve {

Result<LmHead> LmHead::load(WeightLoader& w, const Names& n, const ModelConfig& c, bool zero_centred,
                            bool have_checkpoint, const std::string& source, const TpShard& tp) {
  LmHead h;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  h.vocab = V;
  h.vocab_rows = tp.vocab(V);
  const std::size_t before = w.bytes_loaded();
  DS_ASSIGN_OR_RETURN(h.embed, w.embedding(n.embed, V, H, h.vocab_rows));
  h.embed_bytes = w.bytes_loaded() - before;
  const bool tied = c.tie_word_embeddings || (have_checkpoint && !w.has(n.lm_head));
  if (!c.tie_word_embeddings && have_checkpoint && !w.has(n.lm_head))
    return error(source, ": missing tensor '", n.lm_head, "' (and tie_word_embeddings is false)");
  DS_ASSIGN_OR_RETURN(h.lm_head, w.linear({LinearPart{tied ? n.embed : n.lm_head, V, {h.vocab_rows}}}, H));
  DS_ASSIGN_OR_RETURN(h.final_norm, w.f32(n.norm, {H}, zero_centred));
  return h;
}

void LmHead::size_activations(const TpShard& tp, Activations& a) const {
  a.tp = tp.size;
  a.vocab_per_rank = tp.vocab_per_rank(vocab);
}

void LmHead::embed_tokens(Kernels& k, const Tensor& ids, Tensor x, Communicator* comm) const {
  k.embed(embed.view, ids, x, vocab_rows.begin, vocab);
  if (comm) comm->all_reduce_sum(x);
}

void LmHead::logits(Kernels& k, float eps, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
                    Tensor out, Tensor hidden_all, Activations& a, Communicator* comm) const {
  const int64_t H = x.cols();
  Tensor normed = a.rows_norm.view(DType::F32, {n_rows, H});
  if (hidden_all.data) {
    k.rms_norm(x, norm.view, eps, hidden_all);
    if (n_rows > 0) k.gather_rows(hidden_all, rows, n_rows, normed);
  } else if (n_rows > 0) {
    Tensor picked = a.rows.view(DType::F32, {n_rows, H});
    k.gather_rows(x, rows, n_rows, picked);
    k.rms_norm(picked, norm.view, eps, normed);
  }
  if (comm == nullptr) {
    if (n_rows > 0) k.matmul(normed, *lm_head, out);
    return;
  }
  // Every rank takes part in the gather, even with no rows (the collectives stay in step).
  const int P = comm->size();
  const int64_t per = a.vocab_per_rank;
  DS_CHECK(n_rows <= a.max_logit_rows, n_rows, " logit rows exceed reserve(", a.max_logit_rows, ")");
  if (n_rows > 0) k.matmul(normed, *lm_head, a.logits_local.view(DType::F32, {n_rows, vocab_rows.size()}));
  const int64_t slot = int64_t(n_rows) * per;  // floats per rank in the gather
  comm->all_gather(a.logits_local.view(DType::F32, {slot}), a.logits_gather.view(DType::F32, {P * slot}));
  if (n_rows == 0) return;
  const auto* base = static_cast<const float*>(a.logits_gather.data());
  for (int r = 0; r < P; ++r) {
    const RowRange cols = TpShard{r, P}.vocab(vocab);
    if (cols.size() == 0) continue;
    Tensor part(const_cast<float*>(base + r * slot), DType::F32, {n_rows, cols.size()}, out.device);
    k.copy_columns(part, 0, out, cols.begin, cols.size());
  }
}

}  // namespace deltaserve
