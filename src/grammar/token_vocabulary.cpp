#include "grammar/token_vocabulary.h"

#include <algorithm>
#include <bit>
#include <numeric>

namespace deltaserve {

void TokenBitset::set_all() {
  std::fill(words_.begin(), words_.end(), ~uint64_t{0});
  if (n_ % 64) words_.back() = (uint64_t{1} << (n_ % 64)) - 1;
}

void TokenBitset::clear() { std::fill(words_.begin(), words_.end(), 0); }

void TokenBitset::merge(const TokenBitset& other) {
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
}

void TokenBitset::intersect(const TokenBitset& other) {
  for (size_t i = 0; i < words_.size(); ++i) words_[i] &= other.words_[i];
}

int32_t TokenBitset::count() const {
  int32_t c = 0;
  for (uint64_t w : words_) c += std::popcount(w);
  return c;
}

std::vector<int32_t> TokenBitset::ids() const {
  std::vector<int32_t> out;
  for (size_t w = 0; w < words_.size(); ++w) {
    uint64_t bits = words_[w];
    while (bits) {
      out.push_back(static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits))));
      bits &= bits - 1;
    }
  }
  return out;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::create(std::vector<std::string> token_bytes,
                                                               std::vector<uint8_t> special,
                                                               std::vector<int32_t> eos_ids) {
  auto v = std::make_shared<TokenVocabulary>();
  const size_t n = token_bytes.size();
  v->bytes_ = std::move(token_bytes);
  v->special_ = std::move(special);
  v->special_.resize(n, 0);
  v->eos_flag_.assign(n, 0);
  for (int32_t id : eos_ids) {
    if (id < 0 || static_cast<size_t>(id) >= n || v->eos_flag_[static_cast<size_t>(id)]) continue;
    v->eos_flag_[static_cast<size_t>(id)] = 1;
    v->eos_ids_.push_back(id);
  }
  // Text tokens sorted by bytes: a trie in DFS preorder falls out of the common prefixes.
  std::vector<int32_t> order;
  order.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!v->special_[i] && !v->eos_flag_[i] && !v->bytes_[i].empty()) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    int c = v->bytes_[static_cast<size_t>(a)].compare(v->bytes_[static_cast<size_t>(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  // Root.
  v->byte_.push_back(0);
  v->depth_.push_back(0);
  v->end_.push_back(0);
  std::vector<int32_t> node_of_token;  // parallel to `order`: the node each token ends at
  node_of_token.reserve(order.size());
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d on the current branch
  std::string_view prev;
  for (int32_t id : order) {
    std::string_view s = v->bytes_[static_cast<size_t>(id)];
    v->max_len_ = std::max(v->max_len_, static_cast<int>(s.size()));
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < s.size() && prev[lcp] == s[lcp]) ++lcp;
    // Close the nodes deeper than the common prefix.
    while (path.size() > lcp + 1) {
      v->end_[static_cast<size_t>(path.back())] = static_cast<int32_t>(v->byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(v->byte_.size()));
      v->byte_.push_back(static_cast<uint8_t>(s[d]));
      v->depth_.push_back(static_cast<int32_t>(d + 1));
      v->end_.push_back(0);
    }
    node_of_token.push_back(path.back());
    prev = s;
  }
  while (!path.empty()) {
    v->end_[static_cast<size_t>(path.back())] = static_cast<int32_t>(v->byte_.size());
    path.pop_back();
  }
  // Tokens per node (CSR). Nodes were created in increasing order along `order`.
  const size_t n_nodes = v->byte_.size();
  v->tok_begin_.assign(n_nodes + 1, 0);
  for (int32_t node : node_of_token) ++v->tok_begin_[static_cast<size_t>(node) + 1];
  std::partial_sum(v->tok_begin_.begin(), v->tok_begin_.end(), v->tok_begin_.begin());
  v->tok_ids_.resize(order.size());
  std::vector<int32_t> fill(v->tok_begin_.begin(), v->tok_begin_.end() - 1);
  for (size_t k = 0; k < order.size(); ++k)
    v->tok_ids_[static_cast<size_t>(fill[static_cast<size_t>(node_of_token[k])]++)] = order[k];
  return v;
}

}  // namespace deltaserve
