#include "model/layers/lm_head.h"

namespace deltaserve {

Result<LmHead> LmHead::load(WeightLoader& w, const Names& n, const ModelConfig& c, bool zero_centred,
                            bool have_checkpoint, const std::string& source) {
  LmHead h;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const std::size_t before = w.bytes_loaded();
  DS_ASSIGN_OR_RETURN(h.embed, w.embedding(n.embed, V, H));
  h.embed_bytes = w.bytes_loaded() - before;
  const bool tied = c.tie_word_embeddings || (have_checkpoint && !w.has(n.lm_head));
  if (!c.tie_word_embeddings && have_checkpoint && !w.has(n.lm_head))
    return error(source, ": missing tensor '", n.lm_head, "' (and tie_word_embeddings is false)");
  DS_ASSIGN_OR_RETURN(h.lm_head, w.linear({tied ? n.embed : n.lm_head}, {V}, H));
  DS_ASSIGN_OR_RETURN(h.final_norm, w.f32(n.norm, {H}, zero_centred));
  return h;
}

void LmHead::logits(Kernels& k, float eps, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
                    Tensor out, Tensor hidden_all, Activations& a) const {
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
  if (n_rows > 0) k.matmul(normed, *lm_head, out);
}

}  // namespace deltaserve
