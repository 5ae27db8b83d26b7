#include "cache/block_pool.h"

namespace deltaserve {

BlockPool::BlockPool(int n_blocks) : n_total_(n_blocks), refs_(n_blocks, 0) {
  free_.reserve(n_blocks);
  // Hand out low ids first (pop from the back).
  for (int i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool BlockPool::allocate(int n, std::vector<int32_t>& out) {
  if (n > n_free()) return false;
  for (int i = 0; i < n; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    refs_[b] = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::retain(int32_t block) {
  DS_CHECK(block >= 0 && block < n_total_ && refs_[block] > 0, "retaining block ", block, " not in use");
  ++refs_[block];
}

void BlockPool::release(int32_t block) {
  DS_CHECK(block >= 0 && block < n_total_ && refs_[block] > 0, "releasing block ", block, " not in use");
  if (--refs_[block] == 0) free_.push_back(block);
}

void BlockPool::check_integrity() const {
  int used = 0;
  for (auto r : refs_) {
    DS_CHECK(r >= 0, "negative block reference count");
    used += r > 0;
  }
  DS_CHECK(used + n_free() == n_total_, "block pool leak: used ", used, " free ", n_free());
  std::vector<uint8_t> seen(n_total_, 0);
  for (auto b : free_) {
    DS_CHECK(refs_[b] == 0 && !seen[b], "block ", b, " twice in the free list or held while free");
    seen[b] = 1;
  }
}

}  // namespace deltaserve
