// CacheAllocator: what the scheduler needs from the cache: KV block ids and per-request slots.
// CacheMemory implements it over device storage; the scheduler's unit tests use a host-only one.
#pragma once

#include "cache/block_pool.h"
#include "cache/slot_pool.h"

namespace deltaserve {

class CacheAllocator {
 public:
  virtual ~CacheAllocator() = default;
  virtual BlockPool& blocks() = 0;
  virtual const BlockPool& blocks() const = 0;
  // A slot for a new running request, its state zeroed; -1 when none is free.
  [[nodiscard]] virtual int acquire_slot() = 0;
  virtual void release_slot(int slot) = 0;
  virtual int n_slots_free() const = 0;
  virtual int n_slots_total() const = 0;
  // Every block and slot is either free or held, once (DS_CHECK otherwise).
  virtual void check_integrity() const = 0;
};

}  // namespace deltaserve
