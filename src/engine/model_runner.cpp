#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>

namespace deltaserve {

ModelRunner::ModelRunner(RankGroup& ranks, CacheMemory& cache, const RunnerLimits& limits)
    : group_(ranks),
      cache_(cache),
      limits_(limits),
      vocab_(ranks.model().config().vocab_size),
      hidden_(ranks.model().config().hidden_size) {
  DS_CHECK(cache.n_ranks() == ranks.size(), "cache for ", cache.n_ranks(), " ranks, group of ", ranks.size());
  if (!ranks.graphs_ok()) limits_.graph_max_seqs = 0;  // collectives that synchronise on the host
  verify_tokens_ = cache.config().pending_depth;
  Backend& backend = ranks.backend(0);
  const int64_t T = limits.max_tokens, S = limits.max_seqs, B = limits.max_blocks_per_seq;
  n_meta_i32_ = T + (S + 1) + S + S * B + S + S + S + S;
  // The staging areas are host memory on every backend (page-locked on CUDA).
  const int64_t token_rows = std::max(limits.max_logit_rows, 1);
  tokens_host_ = backend.allocate_host(2 * token_rows * 4);
  for (int i = 0; i < 2; ++i) {
    Flight& f = flights_[i];
    f.staging = backend.allocate_host((n_meta_i32_ + T + T) * 4);
    f.tokens = static_cast<int32_t*>(tokens_host_.data()) + i * token_rows;
    for (int r = 0; r < ranks.size(); ++r) f.done.push_back(ranks.backend(r).make_event());
  }
  take_flight();
  const bool gpu = backend.device() != Device::Cpu;
  if (gpu) host_logits_store_ = backend.allocate_host(int64_t(limits.max_logit_rows) * vocab_ * 4);
  if (gpu) tokens_dev_ = backend.allocate(std::max(limits.max_logit_rows, 1) * 4);
  sample_bytes_ = std::max(limits.max_logit_rows, 1) * sizeof(SampleRow) + kPenaltyCapacity * sizeof(PenaltyEntry);
  sample_host_ = backend.allocate_host(2 * sample_bytes_);  // a region per flight
  if (gpu) sample_dev_ = backend.allocate(sample_bytes_);
  commit_host_ = backend.allocate_host((4 * S + 1) * 4);
  if (limits.mtp) {
    kept_dev_ = backend.allocate(std::max(verify_tokens_, 1) * S * 4);
    kept_host_ = gpu ? backend.allocate_host(std::max(verify_tokens_, 1) * S * 4) : DeviceBuffer();
    kept_host_ptr_ = static_cast<const int32_t*>(gpu ? kept_host_.data() : kept_dev_.data());
    kept_rows_.assign(static_cast<std::size_t>(std::max(verify_tokens_, 1)), 0);
  }
  ranks_.resize(static_cast<std::size_t>(ranks.size()));
  for (int i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks_[i];
    Backend& b = ranks.backend(i);
    r.backend = &b;
    r.model = &ranks.model(i);
    r.memory = &cache.views(i);
    if (gpu) {
      r.dev_i32 = b.allocate(n_meta_i32_ * 4);
      r.dev_ids = b.allocate(T * 4);
      r.commit_dev = b.allocate((4 * S + 1) * 4);
      if (i > 0) r.tokens_dev = b.allocate(std::max(limits.max_logit_rows, 1) * 4);
      if (i > 0) r.sample_dev = b.allocate(std::max(limits.max_logit_rows, 1) * sizeof(SampleRow));
    }
    r.logits_buf = b.allocate(int64_t(limits.max_logit_rows) * vocab_ * 4);
    if (limits.mtp) {
      r.hidden_main = b.allocate(T * hidden_ * 4);
      r.mtp_in = b.allocate(T * hidden_ * 4);
      r.mtp_out = b.allocate(T * hidden_ * 4);
      r.chain[0] = b.allocate(S * hidden_ * 4);
      r.chain[1] = b.allocate(S * hidden_ * 4);
    }
    r.model->reserve(limits.max_tokens, limits.max_logit_rows);
    r.graphs.resize(static_cast<std::size_t>(std::max(0, limits.graph_max_seqs)) + 1);
    r.verify_graphs.resize(r.graphs.size() * static_cast<std::size_t>(verify_tokens_ + 1));
    if (limits.mtp) {
      r.mtp_graphs.resize(2 * r.graphs.size());
      r.catchup_graphs.resize(r.verify_graphs.size());
    }
  }
  // Tensor parallel collectives: the residual stream [T, H] (all-reduce) and one rank's
  // vocabulary-parallel logits [rows, ceil(V / P)] (all-gather).
  const int64_t P = ranks.tp_size();
  group_.reserve_collectives(static_cast<std::size_t>(std::max(
      T * hidden_ * 4, int64_t(limits.max_logit_rows) * ((vocab_ + P - 1) / P) * 4)));
}

bool ModelRunner::run_graph(Rank& r, std::span<const RunItem> items, const ForwardArgs& a) {
  const int S = static_cast<int>(items.size());
  if (S > limits_.graph_max_seqs) return false;
  // A decode batch (one token per sequence, its logits) or a verification batch (the same k + 1
  // tokens per sequence, every logit, GDN state deferred): one graph per shape.
  const int n = static_cast<int>(items[0].tokens.size());
  const bool verify = items[0].defer_state;
  if (verify ? n > verify_tokens_ : n != 1) return false;
  for (const RunItem& it : items)
    if (static_cast<int>(it.tokens.size()) != n || it.no_logits || it.defer_state != verify || it.logits_all != verify)
      return false;
  DecodeGraph& g = verify ? r.verify_graphs[static_cast<std::size_t>(S * (verify_tokens_ + 1) + n)] : r.graphs[S];
  return replay(r, g, [&] { r.model->forward(a); });
}

bool ModelRunner::run_mtp_graph(Rank& r, std::span<const RunItem> items, int out_which, const MtpArgs& a) {
  const int S = static_cast<int>(items.size());
  if (S > limits_.graph_max_seqs) return false;
  // The output rows (each sequence's last token) are then fixed by the shape.
  const int n = static_cast<int>(items[0].tokens.size());
  if (out_which > 0 ? n != 1 : n > verify_tokens_) return false;
  for (const RunItem& it : items)
    if (static_cast<int>(it.tokens.size()) != n || it.no_logits || it.logits_all || it.defer_state) return false;
  DecodeGraph& g = out_which > 0 ? r.mtp_graphs[static_cast<std::size_t>(2 * S + out_which - 1)]
                                 : r.catchup_graphs[static_cast<std::size_t>(S * (verify_tokens_ + 1) + n)];
  return replay(r, g, [&] { r.model->forward_mtp(a); });
}

bool ModelRunner::replay(Rank& r, DecodeGraph& g, const std::function<void()>& forward) {
  if (!g.graph || g.epoch != r.backend->graph_epoch()) {
    g.graph.reset();
    if (!g.warm) {
      g.warm = true;
      return false;
    }
    g.epoch = r.backend->graph_epoch();
    g.graph = r.backend->capture(forward);
    if (!g.graph) return false;
  }
  r.backend->replay(*g.graph);
  if (&r == &ranks_[0]) ++graph_replays_;
  return true;
}

int ModelRunner::take_flight() {
  const int i = next_flight_;
  DS_CHECK(!flights_[i].pending, "a third run launched before the first was waited for");
  next_flight_ ^= 1;
  const int64_t T = limits_.max_tokens, S = limits_.max_seqs, B = limits_.max_blocks_per_seq;
  int32_t* p = static_cast<int32_t*>(flights_[i].staging.data());
  positions_ = p; p += T;
  seq_start_ = p; p += S + 1;
  context_len_ = p; p += S;
  block_table_ = p; p += S * B;
  slots_ = p; p += S;
  defer_ = p; p += S;
  ckpt_at_ = p; p += S;
  ckpt_slot_ = p; p += S;
  ids_ = p; p += T;
  out_rows_ = p;
  tokens_out_ = flights_[i].tokens;
  return i;
}

void ModelRunner::build(std::span<const RunItem> items) {
  const int S = static_cast<int>(items.size());
  DS_CHECK(S > 0 && S <= limits_.max_seqs, "batch of ", S, " sequences");
  const int B = limits_.max_blocks_per_seq, bs = cache_.config().block_size;
  int t = 0, n_out = 0, max_seq_tokens = 0, max_ctx = 0;
  bool any_defer = false, any_ckpt = false;
  for (int s = 0; s < S; ++s) {
    const RunItem& it = items[s];
    const int n = static_cast<int>(it.tokens.size());
    DS_CHECK(n > 0 && t + n <= limits_.max_tokens, "batch overflows max_tokens");
    const int ctx = it.n_past + n;
    DS_CHECK(int64_t(it.blocks.size()) * bs >= ctx && int64_t(it.blocks.size()) <= B,
             "sequence has ", it.blocks.size(), " blocks for ", ctx, " tokens");
    seq_start_[s] = t;
    context_len_[s] = ctx;
    slots_[s] = it.slot;
    defer_[s] = it.defer_state ? 1 : 0;
    any_defer = any_defer || it.defer_state;
    DS_CHECK(it.checkpoint_at < n && (it.checkpoint_at < 0 || (it.checkpoint_slot >= 0 && !it.defer_state)),
             "checkpoint at token ", it.checkpoint_at, " of a run of ", n);
    ckpt_at_[s] = it.checkpoint_at;
    ckpt_slot_[s] = it.checkpoint_slot;
    any_ckpt = any_ckpt || it.checkpoint_at >= 0;
    std::fill_n(block_table_ + int64_t(s) * B, B, -1);
    std::copy(it.blocks.begin(), it.blocks.end(), block_table_ + int64_t(s) * B);
    for (int j = 0; j < n; ++j) {
      ids_[t + j] = it.tokens[j];
      positions_[t + j] = it.n_past + j;
    }
    if (it.logits_all) {
      for (int j = 0; j < n; ++j) out_rows_[n_out++] = t + j;
    } else if (!it.no_logits) {
      out_rows_[n_out++] = t + n - 1;
    }
    t += n;
    max_seq_tokens = std::max(max_seq_tokens, n);
    max_ctx = std::max(max_ctx, ctx);
  }
  seq_start_[S] = t;
  DS_CHECK(n_out <= limits_.max_logit_rows, n_out, " logit rows > ", limits_.max_logit_rows);
  n_out_ = n_out;

  meta_ = BatchMeta{};
  meta_.n_tokens = t;
  meta_.n_seqs = S;
  meta_.positions = positions_;
  meta_.seq_start = seq_start_;
  meta_.context_len = context_len_;
  meta_.block_table = block_table_;
  meta_.state_slot = slots_;
  meta_.state_defer = any_defer ? defer_ : nullptr;
  meta_.checkpoint_at = any_ckpt || limits_.checkpoints ? ckpt_at_ : nullptr;
  meta_.checkpoint_slot = any_ckpt || limits_.checkpoints ? ckpt_slot_ : nullptr;
  meta_.max_blocks = B;
  meta_.block_size = bs;
  meta_.max_seq_tokens = max_seq_tokens;
  meta_.max_context = max_ctx;
}

void ModelRunner::upload_meta(Rank& r, bool async) {
  Backend& b = *r.backend;
  const Device dev = b.device();
  int32_t* d = positions_;
  if (dev != Device::Cpu) {
    // One copy of the contiguous staging prefix [positions .. defer] (ids travel separately).
    const Tensor dst = r.dev_i32.view(DType::I32, {n_meta_i32_});
    if (async) b.copy_to_device_async(dst, positions_);
    else b.copy_to_device(dst, positions_);
    d = static_cast<int32_t*>(r.dev_i32.data());
  }
  const int64_t T = limits_.max_tokens, SM = limits_.max_seqs, B = limits_.max_blocks_per_seq;
  const int t = meta_.n_tokens, S = meta_.n_seqs;
  r.meta = meta_;
  r.meta.d_positions = Tensor(d, DType::I32, {t}, dev);
  r.meta.d_seq_start = Tensor(d + T, DType::I32, {S + 1}, dev);
  r.meta.d_context_len = Tensor(d + T + SM + 1, DType::I32, {S}, dev);
  r.meta.d_block_table = Tensor(d + T + 2 * SM + 1, DType::I32, {S, B}, dev);
  r.meta.d_state_slot = Tensor(d + T + 2 * SM + 1 + SM * B, DType::I32, {S}, dev);
  r.meta.d_state_defer = Tensor(d + T + 3 * SM + 1 + SM * B, DType::I32, {S}, dev);
  r.meta.d_checkpoint_at = Tensor(d + T + 4 * SM + 1 + SM * B, DType::I32, {S}, dev);
  r.meta.d_checkpoint_slot = Tensor(d + T + 5 * SM + 1 + SM * B, DType::I32, {S}, dev);
}

Tensor ModelRunner::upload_ids(Rank& r, bool async) {
  if (r.backend->device() == Device::Cpu) return Tensor(ids_, DType::I32, {meta_.n_tokens});
  Tensor ids(static_cast<int32_t*>(r.dev_ids.data()), DType::I32, {meta_.n_tokens}, r.backend->device());
  if (async) r.backend->copy_to_device_async(ids, ids_);
  else r.backend->copy_to_device(ids, ids_);
  return ids;
}

Tensor ModelRunner::chained_ids(Rank& r) {
  const int n = meta_.n_tokens;
  if (r.backend->device() == Device::Cpu) return Tensor(ids_, DType::I32, {n});  // launch() copied them
  const DeviceBuffer& rows = &r == &ranks_[0] ? tokens_dev_ : r.tokens_dev;
  Tensor ids(static_cast<int32_t*>(r.dev_ids.data()), DType::I32, {n}, r.backend->device());
  r.backend->copy(ids, rows.view(DType::I32, {n}));  // device to device, in stream order
  return ids;
}

void ModelRunner::clear_host_outputs() {
  host_logits_ = nullptr;
  host_tokens_ = nullptr;
}

void ModelRunner::fetch_logits() {
  host_tokens_ = nullptr;
  Rank& r = ranks_[0];
  if (r.backend->device() == Device::Cpu) {
    host_logits_ = static_cast<const float*>(r.logits_buf.data());
  } else {
    r.backend->copy_to_host(host_logits_store_.data(), r.logits_buf.view(DType::F32, {std::max(n_out_, 1), vocab_}));
    host_logits_ = static_cast<const float*>(host_logits_store_.data());
  }
}

void ModelRunner::fetch_argmax(bool async) {
  host_logits_ = nullptr;
  host_tokens_ = tokens_out_;
  if (n_out_ == 0) return;
  Rank& r = ranks_[0];
  const Tensor logits = r.logits_buf.view(DType::F32, {n_out_, vocab_});
  if (r.backend->device() == Device::Cpu) {
    r.backend->kernels().argmax_rows(logits, Tensor(tokens_out_, DType::I32, {n_out_}));
  } else {
    const Tensor dev = tokens_dev_.view(DType::I32, {n_out_});
    r.backend->kernels().argmax_rows(logits, dev);
    if (async) r.backend->copy_to_host_async(tokens_out_, dev);
    else r.backend->copy_to_host(tokens_out_, dev);
  }
}

void ModelRunner::fetch_keep() {
  clear_host_outputs();
  DS_CHECK(can_keep(), "Fetch::Keep needs one rank and limits.mtp");
  DS_CHECK(n_kept_ < static_cast<int>(kept_rows_.size()), "more than ", kept_rows_.size(), " kept MTP outputs");
  DS_CHECK(n_out_ <= limits_.max_seqs, n_out_, " rows to keep > ", limits_.max_seqs);
  Rank& r = ranks_[0];
  const std::size_t off = std::size_t(n_kept_) * limits_.max_seqs * 4;
  if (n_out_ > 0)
    r.backend->kernels().argmax_rows(r.logits_buf.view(DType::F32, {n_out_, vocab_}),
                                     kept_dev_.view(DType::I32, {n_out_}, off));
  kept_rows_[static_cast<std::size_t>(n_kept_++)] = n_out_;
}

void ModelRunner::take_kept() {
  Rank& r = ranks_[0];
  if (n_kept_ > 0 && r.backend->device() != Device::Cpu)
    r.backend->copy_to_host(kept_host_.data(), kept_dev_.view(DType::I32, {int64_t(n_kept_) * limits_.max_seqs}));
  n_taken_ = n_kept_;
  n_kept_ = 0;
}

Tensor ModelRunner::kept_ids(Rank& r, int slot) {
  const int n = meta_.n_tokens;
  DS_CHECK(slot >= 0 && slot < n_kept_ && n == meta_.n_seqs && n == kept_rows_[static_cast<std::size_t>(slot)],
           "ids from keep slot ", slot, ": ", n, " tokens, ", meta_.n_seqs, " sequences");
  const Tensor src = kept_dev_.view(DType::I32, {n}, std::size_t(slot) * limits_.max_seqs * 4);
  if (r.backend->device() == Device::Cpu) return src;
  Tensor ids(static_cast<int32_t*>(r.dev_ids.data()), DType::I32, {n}, r.backend->device());
  r.backend->copy(ids, src);  // device to device, in stream order: no wait
  return ids;
}

char* ModelRunner::stage_sampling(int ticket, const Sampling& sampling) {
  DS_CHECK(static_cast<int>(sampling.rows.size()) == n_out_, sampling.rows.size(), " sampling rows for ", n_out_,
           " output rows");
  const int64_t n_pen = static_cast<int64_t>(sampling.penalties.size());
  DS_CHECK(n_pen <= kPenaltyCapacity, n_pen, " penalty entries > ", kPenaltyCapacity);
  // This flight's region: rows then penalties (one copy to the device). It stays untouched until
  // the flight is waited for.
  char* h = static_cast<char*>(sample_host_.data()) + std::size_t(ticket) * sample_bytes_;
  std::memcpy(h, sampling.rows.data(), std::size_t(n_out_) * sizeof(SampleRow));
  if (n_pen > 0) std::memcpy(h + penalty_offset(), sampling.penalties.data(), std::size_t(n_pen) * sizeof(PenaltyEntry));
  return h;
}

void ModelRunner::fetch_sampled(const char* staged, int64_t n_pen) {
  host_logits_ = nullptr;
  host_tokens_ = tokens_out_;
  if (n_out_ == 0) return;
  const std::size_t rows_bytes = std::size_t(n_out_) * sizeof(SampleRow);
  Rank& r = ranks_[0];
  Backend& b = *r.backend;
  Tensor logits = r.logits_buf.view(DType::F32, {n_out_, vocab_});
  if (b.device() == Device::Cpu) {
    const Tensor rows(const_cast<char*>(staged), DType::I32, {int64_t(rows_bytes / 4)}, b.device());
    const Tensor pens(const_cast<char*>(staged) + penalty_offset(), DType::I32, {n_pen * 4}, b.device());
    b.kernels().sample_rows(logits, rows, pens, Tensor(tokens_out_, DType::I32, {n_out_}));
    return;
  }
  // Queued: the copies read the flight's staging in stream order, the tokens come back with the
  // flight's event.
  const std::size_t bytes = n_pen > 0 ? penalty_offset() + std::size_t(n_pen) * sizeof(PenaltyEntry) : rows_bytes;
  b.copy_to_device_async(sample_dev_.view(DType::I32, {int64_t(bytes / 4)}), staged);
  char* d = static_cast<char*>(sample_dev_.data());
  const Tensor rows(d, DType::I32, {int64_t(rows_bytes / 4)}, b.device());
  const Tensor pens(d + penalty_offset(), DType::I32, {n_pen * 4}, b.device());
  const Tensor dev = tokens_dev_.view(DType::I32, {n_out_});
  b.kernels().sample_rows(logits, rows, pens, dev);
  b.copy_to_host_async(tokens_out_, dev);
}

void ModelRunner::run(std::span<const RunItem> items, const LayerObserver* observer, Fetch fetch,
                      const Sampling* sampling) {
  wait(launch(items, observer, fetch, sampling));
}

int ModelRunner::launch(std::span<const RunItem> items, const LayerObserver* observer, Fetch fetch,
                        const Sampling* sampling, bool ids_from_last) {
  DS_CHECK(fetch != Fetch::Sample || sampling != nullptr, "Fetch::Sample without sampling settings");
  DS_CHECK(fetch != Fetch::Keep, "Fetch::Keep is for run_mtp");
  DS_CHECK(!ids_from_last || can_chain(),
           "ids from the last launch need a single node (the other nodes replay host ids)");
  if (mirror_) mirror_->run(items);
  const Flight& prev = flights_[next_flight_ ^ 1];
  const int ticket = take_flight();
  Flight& f = flights_[ticket];
  build(items);
  if (ids_from_last) {
    const int n = meta_.n_tokens;
    DS_CHECK(prev.ids_chainable && prev.n_out == n && n == meta_.n_seqs, "ids from the last launch: ", n, " tokens, ",
             meta_.n_seqs, " sequences, ", prev.n_out, " rows before (tokens on every rank: ", prev.ids_chainable, ")");
    // The CPU's last run is done: its rows are on the host already.
    if (ranks_[0].backend->device() == Device::Cpu) std::copy_n(prev.tokens, n, ids_);
  }
  // Every copy is queued: the staging stays untouched until wait(ticket) has seen each rank's
  // event. Ranks > 0 of a GPU group pick this run's tokens too (the argmax, or the same draw from
  // the same gathered logits; not under penalties, which a chained run never follows), for a
  // chained next run.
  const char* staged = fetch == Fetch::Sample ? stage_sampling(ticket, *sampling) : nullptr;
  const int64_t n_pen = fetch == Fetch::Sample ? static_cast<int64_t>(sampling->penalties.size()) : 0;
  const bool every_rank_picks = fetch == Fetch::Argmax || (fetch == Fetch::Sample && n_pen == 0);
  const bool other_ranks_pick =
      every_rank_picks && group_.size() > 1 && n_out_ > 0 && ranks_[0].backend->device() != Device::Cpu;
  group_.run([&](int rank) {
    Rank& r = ranks_[rank];
    upload_meta(r, true);
    ForwardArgs a;
    a.meta = &r.meta;
    a.memory = r.memory;
    a.output_rows = out_rows_;
    a.n_output_rows = n_out_;
    a.logits = r.logits_buf.view(DType::F32, {std::max(n_out_, 1), vocab_});
    if (limits_.mtp) a.hidden = r.hidden_main.view(DType::F32, {meta_.n_tokens, hidden_});
    a.observer = rank == 0 ? observer : nullptr;  // every rank holds the same residual stream
    a.ids = ids_from_last ? chained_ids(r) : upload_ids(r, true);
    if (observer != nullptr || !run_graph(r, items, a)) r.model->forward(a);
    if (rank > 0 && other_ranks_pick) {
      const Tensor logits = r.logits_buf.view(DType::F32, {n_out_, vocab_});
      const Tensor picked = r.tokens_dev.view(DType::I32, {n_out_});
      if (fetch == Fetch::Argmax) {
        r.backend->kernels().argmax_rows(logits, picked);
      } else {
        const Tensor rows = r.sample_dev.view(DType::I32, {int64_t(n_out_) * int64_t(sizeof(SampleRow) / 4)});
        r.backend->copy_to_device_async(rows, staged);
        r.backend->kernels().sample_rows(logits, rows, Tensor(nullptr, DType::I32, {0}, r.backend->device()), picked);
      }
    }
    if (rank > 0) r.backend->record(*f.done[rank]);
  });
  if (fetch == Fetch::Argmax) fetch_argmax(true);
  else if (fetch == Fetch::Sample) fetch_sampled(staged, n_pen);
  else if (fetch == Fetch::Logits) fetch_logits();
  else clear_host_outputs();  // Fetch::None: nothing comes back
  f.n_out = n_out_;
  f.fetch = fetch;
  f.ids_chainable = every_rank_picks;
  f.logits = host_logits_;
  ranks_[0].backend->record(*f.done[0]);
  f.pending = true;
  mtp_last_ = -1;
  n_kept_ = 0;
  return ticket;
}

void ModelRunner::wait(int ticket) {
  DS_CHECK(ticket == 0 || ticket == 1, "wait(", ticket, ")");
  Flight& f = flights_[ticket];
  if (f.pending)
    for (std::size_t r = 0; r < ranks_.size(); ++r) ranks_[r].backend->wait(*f.done[r]);
  f.pending = false;
  n_out_ = f.n_out;
  host_tokens_ = f.fetch == Fetch::Argmax || f.fetch == Fetch::Sample ? f.tokens : nullptr;
  host_logits_ = f.logits;
}

void ModelRunner::run_mtp(std::span<const RunItem> items, HiddenFrom from, std::span<const int32_t> hidden_rows,
                          Fetch fetch, int ids_from_kept) {
  DS_CHECK(limits_.mtp, "run_mtp without limits.mtp");
  DS_CHECK(ids_from_kept < 0 || can_keep(), "run_mtp: ids from a keep slot need one rank");
  DS_CHECK(from == HiddenFrom::Main || mtp_last_ >= 0, "run_mtp from the MTP head before any MTP step");
  const int src_which = mtp_last_;
  const int src_rows = from == HiddenFrom::Main ? meta_.n_tokens : mtp_last_rows_;
  const int n = static_cast<int>(hidden_rows.size());
  // Catch-up batches (from Main) write mtp_out; chain steps alternate between the chain buffers.
  int out_which = 0;
  if (from == HiddenFrom::Mtp) {
    DS_CHECK(n <= limits_.max_seqs, "MTP chain of ", n, " rows");
    out_which = 1 + chain_next_;
    chain_next_ ^= 1;
  } else {
    chain_next_ = 0;
  }
  if (mirror_) mirror_->run_mtp(items, from, hidden_rows);
  DS_CHECK(!flights_[0].pending && !flights_[1].pending, "run_mtp while a launched run is outstanding");
  Flight& f = flights_[take_flight()];
  f.fetch = Fetch::None;  // not a launch: nothing may chain from it
  f.ids_chainable = false;
  f.n_out = 0;
  // Gather the input hidden states before build() replaces the batch (src_rows refers to the
  // previous batch).
  group_.run([&](int rank) {
    Rank& r = ranks_[rank];
    const DeviceBuffer& src = from == HiddenFrom::Main ? r.hidden_main : r.mtp_buffer(src_which);
    r.backend->kernels().gather_rows(src.view(DType::F32, {std::max(src_rows, 1), hidden_}), hidden_rows.data(), n,
                                     r.mtp_in.view(DType::F32, {n, hidden_}));
  });
  build(items);
  DS_CHECK(meta_.n_tokens == n, "run_mtp: ", n, " hidden rows for ", meta_.n_tokens, " tokens");
  group_.run([&](int rank) {
    Rank& r = ranks_[rank];
    upload_meta(r, false);
    MtpArgs a;
    a.meta = &r.meta;
    a.memory = r.memory;
    a.output_rows = out_rows_;
    a.n_output_rows = n_out_;
    a.logits = r.logits_buf.view(DType::F32, {std::max(n_out_, 1), vocab_});
    a.hidden_in = r.mtp_in.view(DType::F32, {n, hidden_});
    a.hidden_out = r.mtp_buffer(out_which).view(DType::F32, {n, hidden_});
    a.ids = ids_from_kept >= 0 ? kept_ids(r, ids_from_kept) : upload_ids(r, false);
    if (!run_mtp_graph(r, items, out_which, a)) r.model->forward_mtp(a);
  });
  DS_CHECK(fetch != Fetch::Sample, "run_mtp samples greedily (Fetch::Argmax, Keep) or returns logits");
  if (fetch == Fetch::Argmax) fetch_argmax(false);
  else if (fetch == Fetch::Keep) fetch_keep();
  else if (fetch == Fetch::Logits) fetch_logits();
  else clear_host_outputs();  // Fetch::None: nothing comes back
  mtp_last_ = out_which;
  mtp_last_rows_ = n;
}

void ModelRunner::commit_state(std::span<const StateCommit> commits) {
  if (commits.empty() || !cache_.has_state()) return;
  if (mirror_) mirror_->commit_state(commits);
  const int S = static_cast<int>(commits.size());
  DS_CHECK(S <= limits_.max_seqs, "commit_state of ", S, " sequences");
  // seq_start [S+1] | slots [S] | checkpoint_at [S] | checkpoint_slot [S]: one copy.
  int32_t* h = static_cast<int32_t*>(commit_host_.data());
  int32_t* seq_start = h;
  int32_t* slots = h + S + 1;
  int32_t* ck_at = slots + S;
  int32_t* ck_slot = ck_at + S;
  int t = 0;
  bool any_ckpt = false;
  for (int s = 0; s < S; ++s) {
    const StateCommit& c = commits[s];
    DS_CHECK(c.checkpoint_at < c.n_tokens && (c.checkpoint_at < 0 || c.checkpoint_slot >= 0), "commit checkpoint");
    seq_start[s] = t;
    slots[s] = c.slot;
    ck_at[s] = c.checkpoint_at;
    ck_slot[s] = c.checkpoint_slot;
    any_ckpt = any_ckpt || c.checkpoint_at >= 0;
    t += c.n_tokens;
  }
  seq_start[S] = t;
  group_.run([&](int rank) {
    Rank& r = ranks_[rank];
    BatchMeta m;
    m.n_seqs = S;
    m.n_tokens = t;
    m.seq_start = seq_start;
    m.state_slot = slots;
    m.checkpoint_at = any_ckpt ? ck_at : nullptr;
    m.checkpoint_slot = any_ckpt ? ck_slot : nullptr;
    const Device dev = r.backend->device();
    int32_t* d = h;
    if (dev != Device::Cpu) {
      r.backend->copy_to_device(r.commit_dev.view(DType::I32, {4 * S + 1}), h);
      d = static_cast<int32_t*>(r.commit_dev.data());
    }
    m.d_seq_start = Tensor(d, DType::I32, {S + 1}, dev);
    m.d_state_slot = Tensor(d + S + 1, DType::I32, {S}, dev);
    m.d_checkpoint_at = Tensor(d + 2 * S + 1, DType::I32, {S}, dev);
    m.d_checkpoint_slot = Tensor(d + 3 * S + 1, DType::I32, {S}, dev);
    r.model->commit_state(m, *r.memory);
  });
}

}  // namespace deltaserve
