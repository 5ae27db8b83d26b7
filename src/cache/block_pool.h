// BlockPool: ids of fixed-size KV blocks with reference counts. A running sequence holds one
// reference to each block of its table; the prefix cache holds one to each block it keeps. A block
// is free when nobody holds it. No tensors inside.
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
  // Appends n fresh block ids (one reference each) to out; returns false (and takes none) when
  // fewer than n are free.
  [[nodiscard]] bool allocate(int n, std::vector<int32_t>& out);
  void retain(int32_t block);   // one more holder of a block in use
  void release(int32_t block);  // one holder fewer; the block is free at zero
  int ref_count(int32_t block) const { return refs_[block]; }
  // free + used == total, no duplicates in the free list, free blocks have no holders.
  void check_integrity() const;

 private:
  int n_total_;
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;
};

}  // namespace deltaserve
