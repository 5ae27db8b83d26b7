// CacheAllocator: what the scheduler needs from the cache: KV block ids, per-request slots, and
// checkpoint slots (GDN state saved for the prefix cache). Slot ids share one index space:
// [0, n_slots_total) are request slots, [n_slots_total, n_slots_total + n_checkpoints_total)
// checkpoints. CacheMemory implements it over device storage; the scheduler's unit tests use a
// host-only one.
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
  // A checkpoint slot (state only, no speculative rows); -1 when none is free.
  [[nodiscard]] virtual int acquire_checkpoint() = 0;
  virtual void release_checkpoint(int slot) = 0;
  virtual int n_checkpoints_free() const = 0;
  virtual int n_checkpoints_total() const = 0;
  // Whether slots hold recurrent (GDN) state: then a cached prefix is usable only up to a state
  // checkpoint, and resuming copies that checkpoint into the request's slot.
  virtual bool has_state() const = 0;
  // Copies the GDN state of slot src into slot dst (a checkpoint into a live slot, or back).
  virtual void copy_slot(int src, int dst) = 0;
  // Every block and slot is either free or held, once (DS_CHECK otherwise).
  virtual void check_integrity() const = 0;
};

}  // namespace deltaserve
