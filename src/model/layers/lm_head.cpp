#include "model/layers/lm_head.h"

#include <limits>

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
  h.lm_head_name = tied ? n.embed : n.lm_head;
  DS_ASSIGN_OR_RETURN(h.lm_head, w.linear({LinearPart{h.lm_head_name, V, {h.vocab_rows}}}, H));
  DS_ASSIGN_OR_RETURN(h.final_norm, w.f32(n.norm, {H}, zero_centred));
  return h;
}

Status LmHead::load_draft_vocab(WeightLoader& w, Backend& backend, std::span<const int32_t> ids) {
  DraftVocab d;
  // This rank's tokens of the map as runs of consecutive ids (the rows a LinearPart takes).
  std::vector<RowRange> runs;
  std::vector<int32_t> column_row(static_cast<std::size_t>(vocab_rows.size()), -1);
  for (int32_t id : ids) {
    DS_CHECK(id >= 0 && id < vocab, "draft token ", id, " outside the vocabulary");
    if (id < vocab_rows.begin || id >= vocab_rows.end) continue;
    if (!runs.empty() && runs.back().end == id) ++runs.back().end;
    else runs.push_back(RowRange{id, id + 1});
    column_row[static_cast<std::size_t>(id - vocab_rows.begin)] = static_cast<int32_t>(d.rows++);
  }
  const int64_t H = embed.view.cols();
  if (d.rows > 0) {
    DS_ASSIGN_OR_RETURN(d.lm_head, w.linear({LinearPart{lm_head_name, vocab, runs}}, H));
  }
  d.column_row.buffer = backend.allocate(column_row.size() * sizeof(int32_t));
  d.column_row.view = d.column_row.buffer.view(DType::I32, {vocab_rows.size()});
  backend.copy_to_device(d.column_row.view, column_row.data());
  draft = std::move(d);
  return Status::ok();
}

void LmHead::size_activations(const TpShard& tp, Activations& a) const {
  a.tp = tp.size;
  a.vocab_per_rank = tp.vocab_per_rank(vocab);
  a.draft_rows = draft ? draft->rows : 0;
}

void LmHead::embed_tokens(Kernels& k, const Tensor& ids, Tensor x, Communicator* comm) const {
  k.embed(embed.view, ids, x, vocab_rows.begin, vocab);
  if (comm) comm->all_reduce_sum(x);
}

void LmHead::logits(Kernels& k, float eps, Tensor x, const DeviceTensor& norm, const int32_t* rows, int n_rows,
                    Tensor out, Tensor hidden_all, Activations& a, Communicator* comm, bool use_draft) const {
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
  // This rank's V_r columns of the rows into `dst`: the whole lm_head, or the draft vocabulary's
  // rows spread over the columns (-inf where the map has no token).
  auto project = [&](Tensor dst) {
    if (!use_draft || !draft) {
      k.matmul(normed, *lm_head, dst);
      return;
    }
    DS_CHECK(n_rows <= a.max_logit_rows, n_rows, " logit rows exceed reserve(", a.max_logit_rows, ")");
    Tensor scored = a.draft_logits.view(DType::F32, {n_rows, draft->rows});
    if (draft->rows > 0) k.matmul(normed, *draft->lm_head, scored);
    k.gather_columns(scored, draft->column_row.view, dst, -std::numeric_limits<float>::infinity());
  };
  if (comm == nullptr) {
    if (n_rows > 0) project(out);
    return;
  }
  // Every rank takes part in the gather, even with no rows (the collectives stay in step).
  const int P = comm->size();
  const int64_t per = a.vocab_per_rank;
  DS_CHECK(n_rows <= a.max_logit_rows, n_rows, " logit rows exceed reserve(", a.max_logit_rows, ")");
  if (n_rows > 0) project(a.logits_local.view(DType::F32, {n_rows, vocab_rows.size()}));
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
