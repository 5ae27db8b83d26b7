// BlockPool: ids of fixed-size KV blocks. A free list and a count; no tensors inside.
#pragma once

#include <cstdint>
#include <vector>

#include "util/status.h"

namespace deltaserve {

class BlockPool {
 public:
  explicit BlockPool(int n_blocks);
  int n_total() const { return n_total_; }
  int n_free() const { return static_cast<int>(free_.size()); }
  int n_used() const { return n_total_ - n_free(); }
  // Appends n block ids to out; returns false (and takes none) when fewer than n are free.
  [[nodiscard]] bool allocate(int n, std::vector<int32_t>& out);
  void release(int32_t block);
  // free + used == total, no duplicates in the free list.
  void check_integrity() const;

 private:
  int n_total_;
  std::vector<int32_t> free_;
  std::vector<uint8_t> in_use_;
};

}  // namespace deltaserve
