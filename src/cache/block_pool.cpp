#include "cache/block_pool.h"

namespace deltaserve {

BlockPool::BlockPool(int n_blocks) : n_total_(n_blocks), in_use_(n_blocks, 0) {
  free_.reserve(n_blocks);
  // Hand out low ids first (pop from the back).
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool BlockPool::allocate(int n, std::vector<int32_t>& out) {
  if (n > n_free()) return false;
  for (int i = 0; i < n; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    in_use_[b] = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::release(int32_t block) {
  DS_CHECK(block >= 0 && block < n_total_ && in_use_[block], "releasing block ", block, " not in use");
  in_use_[block] = 0;
  free_.push_back(block);
}

void BlockPool::check_integrity() const {
  int used = 0;
  for (auto u : in_use_) used += u;
  DS_CHECK(used + n_free() == n_total_, "block pool leak: used ", used, " free ", n_free());
  std::vector<uint8_t> seen(n_total_, 0);
  for (auto b : free_) {
    DS_CHECK(!in_use_[b] && !seen[b], "block ", b, " twice in the free list");
    seen[b] = 1;
  }
}

}  // namespace deltaserve
