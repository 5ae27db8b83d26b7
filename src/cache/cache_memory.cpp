#include "cache/cache_memory.h"

#include <algorithm>

namespace deltaserve {

CacheMemory::CacheMemory(Backend& backend, const MemorySpec& spec, const CacheConfig& config)
    : backend_(backend), spec_(spec), config_(config), blocks_(config.n_blocks), slots_(config.n_slots) {
  const DType act = backend.activation_dtype();
  const int64_t nb = config.n_blocks, bs = config.block_size;
  for (int l = 0; l < spec.n_kv_layers; ++l) {
    KvLayerView v;
    for (Tensor* t : {&v.k, &v.v}) {
      buffers_.push_back(backend.allocate(nb * bs * spec.n_kv_heads * spec.head_dim * dtype_size(act)));
      *t = buffers_.back().view(act, {nb, bs, spec.n_kv_heads, spec.head_dim});
      kv_bytes_ += static_cast<int64_t>(buffers_.back().size());
    }
    views_.kv.push_back(v);
  }
  if (spec.n_state_layers > 0) {
    const int64_t ns = config.n_slots, d = config.pending_depth, km1 = spec.conv_kernel - 1;
    auto alloc = [&](std::initializer_list<int64_t> shape) {
      int64_t n = 1;
      for (auto x : shape) n *= x;
      buffers_.push_back(backend.allocate(std::max<int64_t>(n, 1) * 4));
      state_bytes_ += static_cast<int64_t>(buffers_.back().size());
      return buffers_.back().view(DType::F32, shape);
    };
    for (int l = 0; l < spec.n_state_layers; ++l) {
      StateLayerView v;
      v.conv = alloc({ns, spec.conv_dim, km1});
      v.recurrent = alloc({ns, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim});
      if (d > 0) v.pending = alloc({ns * d, spec.conv_dim + 2LL * spec.n_v_heads});
      v.pending_depth = static_cast<int>(d);
      views_.state.push_back(v);
    }
    const int64_t per_slot = std::max(spec.conv_dim * km1, int64_t(spec.n_v_heads) * spec.v_head_dim * spec.k_head_dim);
    zeros_ = backend.allocate(per_slot * 4);
  }
}

int CacheMemory::acquire_slot() {
  const int s = slots_.acquire();
  if (s >= 0 && has_state()) zero_slot(s);
  return s;
}

void CacheMemory::release_slot(int slot) { slots_.release(slot); }

void CacheMemory::check_integrity() const {
  blocks_.check_integrity();
  slots_.check_integrity();
}

void CacheMemory::zero_slot(int slot) {
  for (const auto& v : views_.state) {
    const int64_t conv = v.conv.numel() / v.conv.dim(0), rec = v.recurrent.numel() / v.recurrent.dim(0);
    backend_.copy(Tensor(v.conv.f32() + slot * conv, DType::F32, {conv}, v.conv.device),
                  zeros_.view(DType::F32, {conv}));
    backend_.copy(Tensor(v.recurrent.f32() + slot * rec, DType::F32, {rec}, v.recurrent.device),
                  zeros_.view(DType::F32, {rec}));
  }
}

}  // namespace deltaserve
