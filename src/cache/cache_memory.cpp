#include "cache/cache_memory.h"

#include <algorithm>

namespace deltaserve {

CacheMemory::CacheMemory(std::vector<Backend*> backends, const MemorySpec& spec, const CacheConfig& config)
    : spec_(spec),
      config_(config),
      kv_dtype_(config.kv_dtype.value_or(backends.at(0)->activation_dtype())),
      blocks_(config.n_blocks),
      slots_(config.n_slots),
      checkpoints_(spec.n_state_layers > 0 ? config.n_checkpoints : 0) {
  const DType kvt = kv_dtype_;
  DS_CHECK(kvt == DType::F32 || kvt == DType::BF16 || kvt == DType::F8E4M3 || kvt == DType::F8E5M2,
           "KV cache dtype ", dtype_name(kvt));
  DS_CHECK(config.kv_scales.empty() || int(config.kv_scales.size()) == spec.n_kv_layers, "kv_scales: ",
           config.kv_scales.size(), " for ", spec.n_kv_layers, " KV layers");
  ranks_.resize(backends.size());
  for (std::size_t r = 0; r < backends.size(); ++r) {
    ranks_[r].backend = backends[r];
    // Every rank holds the same shapes: count the bytes of one (a per-GPU figure).
    const int64_t kv_before = kv_bytes_, state_before = state_bytes_;
    allocate(ranks_[r]);
    if (r > 0) {
      kv_bytes_ = kv_before;
      state_bytes_ = state_before;
    }
  }
}

void CacheMemory::allocate(RankStorage& rs) {
  Backend& backend = *rs.backend;
  const DType kvt = kv_dtype_;
  const bool fp8 = kvt == DType::F8E4M3 || kvt == DType::F8E5M2;
  const MemorySpec& spec = spec_;
  const CacheConfig& config = config_;
  DS_CHECK(config.state_dtype == DType::F32 || config.state_dtype == DType::BF16, "GDN state dtype ",
           dtype_name(config.state_dtype));
  const int64_t nb = config.n_blocks, bs = config.block_size;
  for (int l = 0; l < spec.n_kv_layers; ++l) {
    KvLayerView v;
    for (Tensor* t : {&v.k, &v.v}) {
      rs.buffers.push_back(backend.allocate(nb * bs * spec.n_kv_heads * spec.head_dim * dtype_size(kvt)));
      *t = rs.buffers.back().view(kvt, {nb, bs, spec.n_kv_heads, spec.head_dim});
      kv_bytes_ += static_cast<int64_t>(rs.buffers.back().size());
    }
    if (fp8 && !config.kv_scales.empty()) {
      v.k_scale = config.kv_scales[l].k;
      v.v_scale = config.kv_scales[l].v;
    }
    rs.views.kv.push_back(v);
  }
  if (spec.n_state_layers > 0) {
    const int64_t ns = config.n_slots, d = config.pending_depth, km1 = spec.conv_kernel - 1;
    const int64_t n_states = ns + checkpoints_.n_total();
    auto alloc = [&](DType t, std::initializer_list<int64_t> shape) {
      int64_t n = 1;
      for (auto x : shape) n *= x;
      rs.buffers.push_back(backend.allocate(std::max<int64_t>(n, 1) * static_cast<int64_t>(dtype_size(t))));
      state_bytes_ += static_cast<int64_t>(rs.buffers.back().size());
      return rs.buffers.back().view(t, shape);
    };
    for (int l = 0; l < spec.n_state_layers; ++l) {
      StateLayerView v;
      v.conv = alloc(DType::F32, {n_states, spec.conv_dim, km1});
      v.recurrent = alloc(config.state_dtype, {n_states, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim});
      if (d > 0) v.pending = alloc(DType::F32, {ns * d, spec.conv_dim + 2LL * spec.n_v_heads});
      v.pending_depth = static_cast<int>(d);
      rs.views.state.push_back(v);
    }
    const int64_t per_slot = std::max(spec.conv_dim * km1, int64_t(spec.n_v_heads) * spec.v_head_dim * spec.k_head_dim);
    rs.zeros = backend.allocate(per_slot * 4);  // zero bits: 0 in f32 and bf16 alike
  }
}

Tensor CacheMemory::slot_of(const Tensor& t, int slot) {
  const int64_t n = t.numel() / t.dim(0);
  return Tensor(static_cast<char*>(t.data) + int64_t(slot) * n * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype, {n},
                t.device);
}

int CacheMemory::acquire_slot() {
  const int s = slots_.acquire();
  if (s >= 0 && has_state()) {
    if (mirror_) mirror_->zero_slot(s);
    zero_slot_storage(s);
  }
  return s;
}

void CacheMemory::release_slot(int slot) { slots_.release(slot); }

int CacheMemory::acquire_checkpoint() {
  const int c = checkpoints_.acquire();
  return c < 0 ? -1 : c + slots_.n_total();
}

void CacheMemory::release_checkpoint(int slot) { checkpoints_.release(slot - slots_.n_total()); }

void CacheMemory::check_integrity() const {
  blocks_.check_integrity();
  slots_.check_integrity();
  checkpoints_.check_integrity();
}

void CacheMemory::copy_slot(int src, int dst) {
  auto held = [&](int s) { return slots_.in_use(s) || checkpoints_.in_use(s - slots_.n_total()); };
  DS_CHECK(held(src) && held(dst) && src != dst, "copy_slot ", src, " -> ", dst);
  if (mirror_) mirror_->copy_slot(src, dst);
  copy_slot_storage(src, dst);
}

void CacheMemory::copy_slot_storage(int src, int dst) {
  const int n = slots_.n_total() + checkpoints_.n_total();
  DS_CHECK(src >= 0 && src < n && dst >= 0 && dst < n && src != dst, "copy_slot ", src, " -> ", dst);
  for (const RankStorage& r : ranks_)
    for (const auto& v : r.views.state)
      for (const Tensor* t : {&v.conv, &v.recurrent}) r.backend->copy(slot_of(*t, dst), slot_of(*t, src));
}

void CacheMemory::zero_slot_storage(int slot) {
  DS_CHECK(slot >= 0 && slot < slots_.n_total(), "zero_slot ", slot);
  for (const RankStorage& r : ranks_)
    for (const auto& v : r.views.state)
      for (const Tensor* t : {&v.conv, &v.recurrent}) {
        const Tensor dst = slot_of(*t, slot);
        r.backend->copy(dst, r.zeros.view(dst.dtype, {dst.numel()}));
      }
}

}  // namespace deltaserve
