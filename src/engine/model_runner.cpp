#include "engine/model_runner.h"

#include <algorithm>
#include <cstring>

namespace deltaserve {

ModelRunner::ModelRunner(Backend& backend, Model& model, CacheMemory& cache, const RunnerLimits& limits)
    : backend_(backend), model_(model), cache_(cache), limits_(limits), vocab_(model.config().vocab_size) {
  const int64_t T = limits.max_tokens, S = limits.max_seqs, B = limits.max_blocks_per_seq;
  const int64_t n_i32 = T + T + (S + 1) + S + S * B + S + T;
  // The staging area is host memory on every backend (page-locked on CUDA).
  host_i32_ = backend.allocate_host(n_i32 * 4);
  int32_t* p = static_cast<int32_t*>(host_i32_.data());
  ids_ = p; p += T;
  positions_ = p; p += T;
  seq_start_ = p; p += S + 1;
  context_len_ = p; p += S;
  block_table_ = p; p += S * B;
  slots_ = p; p += S;
  out_rows_ = p;
  if (backend.device() != Device::Cpu) {
    dev_i32_ = backend.allocate((n_i32 - T) * 4);
    dev_ids_ = backend.allocate(T * 4);
  }
  logits_buf_ = backend.allocate(int64_t(limits.max_logit_rows) * vocab_ * 4);
  if (backend.device() != Device::Cpu) host_logits_store_ = backend.allocate_host(int64_t(limits.max_logit_rows) * vocab_ * 4);
  model_.reserve(limits.max_tokens);
  graphs_.resize(static_cast<std::size_t>(std::max(0, limits.graph_max_seqs)) + 1);
}

bool ModelRunner::run_graph(std::span<const RunItem> items, const ForwardArgs& a) {
  const int S = static_cast<int>(items.size());
  if (S > limits_.graph_max_seqs) return false;
  for (const RunItem& it : items)
    if (it.tokens.size() != 1 || it.logits_all || it.no_logits) return false;
  DecodeGraph& g = graphs_[S];
  if (!g.graph || g.epoch != backend_.graph_epoch()) {
    g.graph.reset();
    if (!g.warm) {
      g.warm = true;
      return false;
    }
    g.epoch = backend_.graph_epoch();
    g.graph = backend_.capture([&] { model_.forward(a); });
    if (!g.graph) return false;
  }
  backend_.replay(*g.graph);
  return true;
}

void ModelRunner::build(std::span<const RunItem> items, bool write_snapshots) {
  const int S = static_cast<int>(items.size());
  DS_CHECK(S > 0 && S <= limits_.max_seqs, "batch of ", S, " sequences");
  const int B = limits_.max_blocks_per_seq, bs = cache_.config().block_size;
  int t = 0, n_out = 0, max_seq_tokens = 0, max_ctx = 0;
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
  meta_.max_blocks = B;
  meta_.block_size = bs;
  meta_.max_seq_tokens = max_seq_tokens;
  meta_.max_context = max_ctx;
  meta_.write_snapshots = write_snapshots;
  const Device dev = backend_.device();
  if (dev == Device::Cpu) {
    meta_.d_positions = Tensor(positions_, DType::I32, {t});
    meta_.d_seq_start = Tensor(seq_start_, DType::I32, {S + 1});
    meta_.d_context_len = Tensor(context_len_, DType::I32, {S});
    meta_.d_block_table = Tensor(block_table_, DType::I32, {S, B});
    meta_.d_state_slot = Tensor(slots_, DType::I32, {S});
  } else {
    // One copy of the contiguous staging prefix [positions .. slots] (ids travel separately).
    const int64_t T = limits_.max_tokens, SM = limits_.max_seqs;
    const int64_t n = T + (SM + 1) + SM + SM * B + SM;
    Tensor dst = dev_i32_.view(DType::I32, {n});
    backend_.copy_to_device(dst, positions_);
    int32_t* d = static_cast<int32_t*>(dev_i32_.data());
    meta_.d_positions = Tensor(d, DType::I32, {t}, dev);
    meta_.d_seq_start = Tensor(d + T, DType::I32, {S + 1}, dev);
    meta_.d_context_len = Tensor(d + T + SM + 1, DType::I32, {S}, dev);
    meta_.d_block_table = Tensor(d + T + 2 * SM + 1, DType::I32, {S, B}, dev);
    meta_.d_state_slot = Tensor(d + T + 2 * SM + 1 + SM * B, DType::I32, {S}, dev);
  }
}

void ModelRunner::fetch_logits() {
  if (backend_.device() == Device::Cpu) {
    host_logits_ = static_cast<const float*>(logits_buf_.data());
  } else {
    backend_.copy_to_host(host_logits_store_.data(), logits_buf_.view(DType::F32, {std::max(n_out_, 1), vocab_}));
    host_logits_ = static_cast<const float*>(host_logits_store_.data());
  }
}

void ModelRunner::run(std::span<const RunItem> items, bool write_snapshots, Tensor hidden_all,
                      const LayerObserver* observer) {
  build(items, write_snapshots);
  ForwardArgs a;
  a.meta = &meta_;
  a.memory = &cache_.views();
  a.output_rows = out_rows_;
  a.n_output_rows = n_out_;
  a.logits = logits_buf_.view(DType::F32, {std::max(n_out_, 1), vocab_});
  a.hidden = hidden_all;
  a.observer = observer;
  a.ids = Tensor(ids_, DType::I32, {meta_.n_tokens});
  if (backend_.device() != Device::Cpu) {
    a.ids = Tensor(static_cast<int32_t*>(dev_ids_.data()), DType::I32, {meta_.n_tokens}, backend_.device());
    backend_.copy_to_device(a.ids, ids_);
  }
  const bool graphable = !write_snapshots && !hidden_all.data && observer == nullptr;
  if (!graphable || !run_graph(items, a)) model_.forward(a);
  fetch_logits();
}

void ModelRunner::run_mtp(std::span<const RunItem> items, const Tensor& hidden_in, Tensor hidden_out) {
  build(items, false);
  MtpArgs a;
  a.meta = &meta_;
  a.memory = &cache_.views();
  a.output_rows = out_rows_;
  a.n_output_rows = n_out_;
  a.logits = logits_buf_.view(DType::F32, {std::max(n_out_, 1), vocab_});
  a.hidden_in = hidden_in;
  a.hidden_out = hidden_out;
  a.ids = Tensor(ids_, DType::I32, {meta_.n_tokens});
  if (backend_.device() != Device::Cpu) {
    a.ids = Tensor(static_cast<int32_t*>(dev_ids_.data()), DType::I32, {meta_.n_tokens}, backend_.device());
    backend_.copy_to_device(a.ids, ids_);
  }
  model_.forward_mtp(a);
  fetch_logits();
}

}  // namespace deltaserve
