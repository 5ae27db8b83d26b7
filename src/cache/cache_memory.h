// CacheMemory: the device storage of everything a sequence keeps between steps, and the
// bookkeeping of who holds what.
//   KV:      per attention layer, K and V as [n_blocks, block_size, n_kv_heads, head_dim]
//   state:   per GDN layer, conv [n_slots + n_checkpoints, conv_dim, K-1] and recurrent
//            [n_slots + n_checkpoints, Hv, Dv, Dk] (f32): request slots, then checkpoints
//   pending: per GDN layer, with speculative decoding, a verification run's raw inputs
//            [n_slots * pending_depth, conv_dim + 2*Hv] (see BatchMeta::state_defer)
// Blocks grow with a sequence's tokens; a slot is one per running request (its GDN state and
// pending rows; dense models have slots too, holding nothing on the device).
// Sizes come from model/memory_spec.h, the formulas the memory plan uses. Tensor parallelism:
// one copy of the storage per rank (each on its rank's backend, holding that rank's heads), one
// set of block and slot ids for the group.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_allocator.h"
#include "model/model.h"

namespace deltaserve {

// Multi-node: the ranks of the other nodes hold their own copies of the GDN state; node 0's
// cache tells them of every slot it resets or copies (engine/node_command.h).
class SlotMirror {
 public:
  virtual ~SlotMirror() = default;
  virtual void zero_slot(int slot) = 0;
  virtual void copy_slot(int src, int dst) = 0;
};

struct CacheConfig {
  int n_blocks = 0;
  int block_size = 16;
  int n_slots = 0;           // running requests at most
  int pending_depth = 0;     // 0 without speculative decoding; else 1 + draft tokens
  int n_checkpoints = 0;     // GDN state checkpoints for the prefix cache (0 for dense models)
  // KV element type: F32, BF16, F8E4M3 or F8E5M2; unset = the backend's activation dtype.
  std::optional<DType> kv_dtype;
  // Per KV layer (Model::kv_scales(), the MTP layer last); empty = 1. Applied to fp8 caches only
  // (a bf16 / f32 cache holds the values themselves).
  std::vector<KvScale> kv_scales;
  // The GDN recurrent state's element type: F32 or BF16 (the conv windows and pending rows stay F32).
  DType state_dtype = DType::F32;
};

class CacheMemory final : public CacheAllocator {
 public:
  // backends: one per tensor-parallel rank; spec: one rank's.
  CacheMemory(std::vector<Backend*> backends, const MemorySpec& spec, const CacheConfig& config);
  CacheMemory(Backend& backend, const MemorySpec& spec, const CacheConfig& config)
      : CacheMemory(std::vector<Backend*>{&backend}, spec, config) {}

  const CacheConfig& config() const { return config_; }
  const MemorySpec& spec() const { return spec_; }
  int n_ranks() const { return static_cast<int>(ranks_.size()); }
  const MemoryViews& views(int rank = 0) const { return ranks_[rank].views; }
  BlockPool& blocks() override { return blocks_; }
  const BlockPool& blocks() const override { return blocks_; }
  bool has_state() const override { return spec_.n_state_layers > 0; }
  void copy_slot(int src, int dst) override;

  // Slots. A fresh slot's GDN state is zeroed.
  [[nodiscard]] int acquire_slot() override;
  void release_slot(int slot) override;
  int n_slots_free() const override { return slots_.n_free(); }
  int n_slots_total() const override { return slots_.n_total(); }
  [[nodiscard]] int acquire_checkpoint() override;
  void release_checkpoint(int slot) override;
  int n_checkpoints_free() const override { return checkpoints_.n_free(); }
  int n_checkpoints_total() const override { return checkpoints_.n_total(); }
  void check_integrity() const override;

  // Multi-node, node 0: slot resets and copies are told to the other nodes first.
  void set_mirror(SlotMirror* m) { mirror_ = m; }
  // Another node's replay of node 0's slot operations: the storage only (node 0 keeps the
  // bookkeeping of who holds which slot).
  void zero_slot_storage(int slot);
  void copy_slot_storage(int src, int dst);

  // Bytes this cache allocated on each device (per rank): KV, and GDN state + pending rows.
  int64_t kv_bytes() const { return kv_bytes_; }
  int64_t state_bytes() const { return state_bytes_; }
  DType kv_dtype() const { return kv_dtype_; }
  int64_t kv_bytes_per_token() const { return deltaserve::kv_bytes_per_token(spec_, int64_t(dtype_size(kv_dtype_))); }

 private:
  // Slot `slot`'s part [n] of a per-slot state tensor [n_slots + n_checkpoints, ...].
  static Tensor slot_of(const Tensor& t, int slot);
  // One rank's storage.
  struct RankStorage {
    Backend* backend = nullptr;
    std::vector<DeviceBuffer> buffers;
    MemoryViews views;
    DeviceBuffer zeros;  // one slot's worth of zeros, for resetting a slot
  };
  void allocate(RankStorage& r);
  MemorySpec spec_;
  CacheConfig config_;
  DType kv_dtype_;
  BlockPool blocks_;
  SlotPool slots_;
  SlotPool checkpoints_;  // ids offset by n_slots
  std::vector<RankStorage> ranks_;
  SlotMirror* mirror_ = nullptr;
  int64_t kv_bytes_ = 0, state_bytes_ = 0;
};

}  // namespace deltaserve
