// CacheMemory: the device storage of everything a sequence keeps between steps, and the
// bookkeeping of who holds what.
//   KV:    per attention layer, K and V as [n_blocks, block_size, n_kv_heads, head_dim]
//   state: per GDN layer, conv [n_slots, conv_dim, K-1] and recurrent [n_slots, Hv, Dv, Dk], plus
//          `snapshot_depth` per-position copies of each for speculative rollback.
// Blocks grow with a sequence's tokens; a state slot is one per live sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "cache/block_pool.h"
#include "model/model.h"

namespace deltaserve {

struct CacheConfig {
  int n_blocks = 0;
  int block_size = 16;
  int n_slots = 0;           // GDN state slots (ignored without GDN layers)
  int snapshot_depth = 0;    // 0 without speculative decoding; else tokens per verify step
  // KV element type: F32, BF16, F8E4M3 or F8E5M2; unset = the backend's activation dtype.
  std::optional<DType> kv_dtype;
  // Per KV layer (Model::kv_scales(), the MTP layer last); empty = 1. Applied to fp8 caches only
  // (a bf16 / f32 cache holds the values themselves).
  std::vector<KvScale> kv_scales;
};

class CacheMemory {
 public:
  CacheMemory(Backend& backend, const MemorySpec& spec, const CacheConfig& config);

  const CacheConfig& config() const { return config_; }
  const MemoryViews& views() const { return views_; }
  BlockPool& blocks() { return blocks_; }
  const BlockPool& blocks() const { return blocks_; }
  bool has_state() const { return spec_.n_state_layers > 0; }

  // State slots.
  int n_slots_free() const { return static_cast<int>(free_slots_.size()); }
  int n_slots_total() const { return has_state() ? config_.n_slots : 0; }
  [[nodiscard]] int acquire_slot();  // -1 when none is free; the slot's state is zeroed
  void release_slot(int slot);
  // After verification: make each pick's snapshot the slot's live state in every GDN layer
  // (one kernel call per layer for the whole batch).
  void restore_snapshots(const std::vector<SnapshotPick>& picks);
  void restore_snapshot(int slot, int j) { restore_snapshots({SnapshotPick{slot, j}}); }

  DType kv_dtype() const { return kv_dtype_; }
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token(spec_, kv_dtype_); }
  static int64_t kv_bytes_per_token(const MemorySpec& spec, DType kv_dtype);
  static int64_t state_bytes_per_slot(const MemorySpec& spec, int snapshot_depth);

 private:
  void zero_slot(int slot);
  Backend& backend_;
  MemorySpec spec_;
  CacheConfig config_;
  DType kv_dtype_;
  BlockPool blocks_;
  std::vector<DeviceBuffer> buffers_;
  MemoryViews views_;
  std::vector<int> free_slots_;
  std::vector<uint8_t> slot_in_use_;
  DeviceBuffer zeros_;  // one slot's worth of zeros, for resetting a slot
};

}  // namespace deltaserve
