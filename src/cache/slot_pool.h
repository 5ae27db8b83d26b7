// SlotPool: ids of per-request slots [0, n). A running request holds one for its lifetime: it
// indexes the request's GDN state (hybrid models) and its speculative-decoding rows. No tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "util/status.h"

namespace deltaserve {

class SlotPool {
 public:
  explicit SlotPool(int n_slots) : in_use_(n_slots, 0) {
    free_.reserve(n_slots);
    for (int i = n_slots - 1; i >= 0; --i) free_.push_back(i);  // low ids first
  }
  int n_total() const { return static_cast<int>(in_use_.size()); }
  int n_free() const { return static_cast<int>(free_.size()); }
  int n_used() const { return n_total() - n_free(); }
  [[nodiscard]] int acquire() {  // -1 when none is free
    if (free_.empty()) return -1;
    const int s = free_.back();
    free_.pop_back();
    in_use_[s] = 1;
    return s;
  }
  void release(int slot) {
    DS_CHECK(slot >= 0 && slot < n_total() && in_use_[slot], "releasing slot ", slot, " not in use");
    in_use_[slot] = 0;
    free_.push_back(slot);
  }
  bool in_use(int slot) const { return slot >= 0 && slot < n_total() && in_use_[slot]; }
  // free + used == total, no duplicates in the free list.
  void check_integrity() const {
    int used = 0;
    for (auto u : in_use_) used += u;
    DS_CHECK(used + n_free() == n_total(), "slot pool leak: used ", used, " free ", n_free());
    std::vector<uint8_t> seen(in_use_.size(), 0);
    for (int s : free_) {
      DS_CHECK(!in_use_[s] && !seen[s], "slot ", s, " twice in the free list");
      seen[s] = 1;
    }
  }

 private:
  std::vector<int> free_;
  std::vector<uint8_t> in_use_;
};

}  // namespace deltaserve
