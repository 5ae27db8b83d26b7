#include "cache/cache_memory.h"

#include <algorithm>

namespace deltaserve {

CacheMemory::CacheMemory(Backend& backend, const MemorySpec& spec, const CacheConfig& config)
    : backend_(backend),
      spec_(spec),
      config_(config),
      kv_dtype_(config.kv_dtype.value_or(backend.activation_dtype())),
      blocks_(config.n_blocks),
      slots_(config.n_slots),
      checkpoints_(spec.n_state_layers > 0 ? config.n_checkpoints : 0) {
  const DType kvt = kv_dtype_;
  DS_CHECK(kvt == DType::F32 || kvt == DType::BF16 || kvt == DType::F8E4M3 || kvt == DType::F8E5M2,
           "KV cache dtype ", dtype_name(kvt));
  DS_CHECK(config.kv_scales.empty() || int(config.kv_scales.size()) == spec.n_kv_layers, "kv_scales: ",
           config.kv_scales.size(), " for ", spec.n_kv_layers, " KV layers");
  const bool fp8 = kvt == DType::F8E4M3 || kvt == DType::F8E5M2;
  const int64_t nb = config.n_blocks, bs = config.block_size;
  for (int l = 0; l < spec.n_kv_layers; ++l) {
    KvLayerView v;
    for (Tensor* t : {&v.k, &v.v}) {
      buffers_.push_back(backend.allocate(nb * bs * spec.n_kv_heads * spec.head_dim * dtype_size(kvt)));
      *t = buffers_.back().view(kvt, {nb, bs, spec.n_kv_heads, spec.head_dim});
      kv_bytes_ += static_cast<int64_t>(buffers_.back().size());
    }
    if (fp8 && !config.kv_scales.empty()) {
      v.k_scale = config.kv_scales[l].k;
      v.v_scale = config.kv_scales[l].v;
    }
    views_.kv.push_back(v);
  }
  if (spec.n_state_layers > 0) {
    const int64_t ns = config.n_slots, d = config.pending_depth, km1 = spec.conv_kernel - 1;
    const int64_t n_states = ns + checkpoints_.n_total();
    auto alloc = [&](std::initializer_list<int64_t> shape) {
      int64_t n = 1;
      for (auto x : shape) n *= x;
      buffers_.push_back(backend.allocate(std::max<int64_t>(n, 1) * 4));
      state_bytes_ += static_cast<int64_t>(buffers_.back().size());
      return buffers_.back().view(DType::F32, shape);
    };
    for (int l = 0; l < spec.n_state_layers; ++l) {
      StateLayerView v;
      v.conv = alloc({n_states, spec.conv_dim, km1});
      v.recurrent = alloc({n_states, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim});
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
  for (const auto& v : views_.state) {
    const int64_t conv = v.conv.numel() / v.conv.dim(0), rec = v.recurrent.numel() / v.recurrent.dim(0);
    backend_.copy(Tensor(v.conv.f32() + dst * conv, DType::F32, {conv}, v.conv.device),
                  Tensor(v.conv.f32() + src * conv, DType::F32, {conv}, v.conv.device));
    backend_.copy(Tensor(v.recurrent.f32() + dst * rec, DType::F32, {rec}, v.recurrent.device),
                  Tensor(v.recurrent.f32() + src * rec, DType::F32, {rec}, v.recurrent.device));
  }
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
