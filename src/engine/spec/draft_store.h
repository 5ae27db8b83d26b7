// DraftStore: the drafts of every running request between the step that proposes them and the
// step that verifies them, indexed by the request's slot. Row `slot` holds the verification input
// [last token, d_1 .. d_k]; with sampling, q_j (the distribution d_j was drawn from) is kept too.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sequence.h"

namespace deltaserve {

class DraftStore {
 public:
  DraftStore(int n_slots, int k) : k_(k), feed_(static_cast<size_t>(n_slots) * (k + 1), 0), q_(n_slots) {}
  int k() const { return k_; }
  // The tokens a verifying sequence feeds: its last token and its n_drafts drafts.
  std::span<const int32_t> feed(const Sequence& s) const {
    return {feed_.data() + static_cast<size_t>(s.slot) * (k_ + 1), static_cast<size_t>(1 + s.n_drafts)};
  }
  std::span<const int32_t> drafts(const Sequence& s) const { return feed(s).subspan(1); }
  // Starts a new chain after the sequence's last token.
  void begin(Sequence& s) {
    feed_[static_cast<size_t>(s.slot) * (k_ + 1)] = s.tokens.back();
    s.n_drafts = 0;
  }
  void push(Sequence& s, int32_t token) {
    DS_CHECK(s.n_drafts < k_, "more than ", k_, " drafts");
    feed_[static_cast<size_t>(s.slot) * (k_ + 1) + 1 + s.n_drafts] = token;
    ++s.n_drafts;
  }
  // q_j of a sequence's draft j (sampling mode), sized on first use.
  std::vector<float>& q(const Sequence& s, int j) {
    auto& v = q_[static_cast<size_t>(s.slot)];
    if (static_cast<int>(v.size()) <= j) v.resize(static_cast<size_t>(j) + 1);
    return v[static_cast<size_t>(j)];
  }
  const std::vector<float>& q(const Sequence& s, int j) const { return q_[static_cast<size_t>(s.slot)][static_cast<size_t>(j)]; }

 private:
  int k_;
  std::vector<int32_t> feed_;                    // [n_slots, k + 1]
  std::vector<std::vector<std::vector<float>>> q_;  // [n_slots][j][vocab]
};

}  // namespace deltaserve
