// TokenVocabulary: the model's tokens as byte strings, arranged in a trie (in DFS preorder) so a
// token mask is one walk that prunes every subtree the grammar rejects at its first byte.
// TokenBitset: one bit per token id.
//
// Built once per tokenizer (server start-up) and shared by every compiled grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deltaserve {

class TokenBitset {
 public:
  TokenBitset() = default;
  explicit TokenBitset(int32_t n) : n_(n), words_((static_cast<size_t>(n) + 63) / 64, 0) {}
  int32_t size() const { return n_; }
  bool test(int32_t i) const { return (words_[static_cast<size_t>(i) >> 6] >> (i & 63)) & 1u; }
  void set(int32_t i) { words_[static_cast<size_t>(i) >> 6] |= uint64_t{1} << (i & 63); }
  void reset(int32_t i) { words_[static_cast<size_t>(i) >> 6] &= ~(uint64_t{1} << (i & 63)); }
  void set_all();
  void clear();
  void merge(const TokenBitset& other);  // this |= other (same size)
  void intersect(const TokenBitset& other);
  int32_t count() const;
  const std::vector<uint64_t>& words() const { return words_; }
  std::vector<int32_t> ids() const;  // the set bits, ascending

 private:
  int32_t n_ = 0;
  std::vector<uint64_t> words_;
};

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes token `id` adds to the text ("" for ids never produced as text).
  // special[id]: a control token (chat markers, EOS) that never matches grammar text; may be
  // empty (none). eos_ids: tokens that end generation: allowed exactly when the grammar can end.
  static std::shared_ptr<const TokenVocabulary> create(std::vector<std::string> token_bytes,
                                                       std::vector<uint8_t> special,
                                                       std::vector<int32_t> eos_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  std::string_view bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool is_special(int32_t id) const { return special_[static_cast<size_t>(id)] != 0; }
  bool is_eos(int32_t id) const { return eos_flag_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  int max_token_bytes() const { return max_len_; }

  // The trie, DFS preorder. Node 0 is the root (the empty prefix); every other node i adds
  // node_byte(i) to its parent's prefix, has depth node_depth(i) (its prefix length), and its
  // subtree is [i, subtree_end(i)). node_tokens(i): the ids whose bytes are exactly that prefix.
  int32_t n_nodes() const { return static_cast<int32_t>(byte_.size()); }
  uint8_t node_byte(int32_t i) const { return byte_[static_cast<size_t>(i)]; }
  int32_t node_depth(int32_t i) const { return depth_[static_cast<size_t>(i)]; }
  int32_t subtree_end(int32_t i) const { return end_[static_cast<size_t>(i)]; }
  std::span<const int32_t> node_tokens(int32_t i) const {
    return {tok_ids_.data() + tok_begin_[static_cast<size_t>(i)],
            static_cast<size_t>(tok_begin_[static_cast<size_t>(i) + 1] - tok_begin_[static_cast<size_t>(i)])};
  }
  const uint8_t* node_bytes() const { return byte_.data(); }
  const int32_t* node_depths() const { return depth_.data(); }
  const int32_t* subtree_ends() const { return end_.data(); }
  const int32_t* token_begins() const { return tok_begin_.data(); }
  const int32_t* token_ids() const { return tok_ids_.data(); }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_, eos_flag_;
  std::vector<int32_t> eos_ids_;
  int max_len_ = 0;
  std::vector<uint8_t> byte_;
  std::vector<int32_t> depth_, end_, tok_begin_, tok_ids_;
};

}  // namespace deltaserve
