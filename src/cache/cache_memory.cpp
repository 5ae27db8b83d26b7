#include "cache/cache_memory.h"

namespace deltaserve {

int64_t CacheMemory::kv_bytes_per_token(const MemorySpec& s, DType kv_dtype) {
  return int64_t(s.n_kv_layers) * 2 * s.n_kv_heads * s.head_dim * int64_t(dtype_size(kv_dtype));
}

int64_t CacheMemory::state_bytes_per_slot(const MemorySpec& s, int snapshot_depth) {
  const int64_t conv = s.conv_dim * (s.conv_kernel - 1);
  const int64_t rec = int64_t(s.n_v_heads) * s.v_head_dim * s.k_head_dim;
  return int64_t(s.n_state_layers) * (conv + rec) * 4 * (1 + snapshot_depth);
}

CacheMemory::CacheMemory(Backend& backend, const MemorySpec& spec, const CacheConfig& config)
    : backend_(backend),
      spec_(spec),
      config_(config),
      kv_dtype_(config.kv_dtype.value_or(backend.activation_dtype())),
      blocks_(config.n_blocks) {
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
    }
    if (fp8 && !config.kv_scales.empty()) {
      v.k_scale = config.kv_scales[l].k;
      v.v_scale = config.kv_scales[l].v;
    }
    views_.kv.push_back(v);
  }
  if (spec.n_state_layers > 0) {
    const int64_t ns = config.n_slots, d = config.snapshot_depth, km1 = spec.conv_kernel - 1;
    for (int l = 0; l < spec.n_state_layers; ++l) {
      StateLayerView v;
      auto alloc = [&](std::initializer_list<int64_t> shape) {
        int64_t n = 1;
        for (auto x : shape) n *= x;
        buffers_.push_back(backend.allocate(std::max<int64_t>(n, 1) * 4));
        return buffers_.back().view(DType::F32, shape);
      };
      v.conv = alloc({ns, spec.conv_dim, km1});
      v.recurrent = alloc({ns, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim});
      if (d > 0) {
        v.conv_snap = alloc({ns * d, spec.conv_dim, km1});
        v.recurrent_snap = alloc({ns * d, spec.n_v_heads, spec.v_head_dim, spec.k_head_dim});
      }
      v.snapshot_depth = static_cast<int>(d);
      views_.state.push_back(v);
    }
    const int64_t per_slot = std::max(spec.conv_dim * km1, int64_t(spec.n_v_heads) * spec.v_head_dim * spec.k_head_dim);
    zeros_ = backend.allocate(per_slot * 4);
    slot_in_use_.assign(ns, 0);
    for (int i = static_cast<int>(ns) - 1; i >= 0; --i) free_slots_.push_back(i);
  }
}

int CacheMemory::acquire_slot() {
  if (!has_state()) return 0;  // dense models keep no state; slot 0 is a placeholder
  if (free_slots_.empty()) return -1;
  int s = free_slots_.back();
  free_slots_.pop_back();
  slot_in_use_[s] = 1;
  zero_slot(s);
  return s;
}

void CacheMemory::release_slot(int slot) {
  if (!has_state()) return;
  DS_CHECK(slot >= 0 && slot < config_.n_slots && slot_in_use_[slot], "releasing free slot ", slot);
  slot_in_use_[slot] = 0;
  free_slots_.push_back(slot);
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

void CacheMemory::restore_snapshots(const std::vector<SnapshotPick>& picks) {
  if (picks.empty()) return;
  for (const auto& v : views_.state) backend_.kernels().restore_snapshots(v, picks.data(), static_cast<int>(picks.size()));
}

}  // namespace deltaserve
