// PrefixCache: a radix tree over token ids at KV-block granularity, for prompts that repeat a
// prefix (multi-turn conversations, shared system prompts, n > 1).
//
// A node is one full block of block_size tokens under its parent's path: the KV block holding them
// (one reference owned by the tree, shared copy-free with every sequence that matches it) and,
// optionally, a GDN state checkpoint: a slot holding the recurrent state after the node's last
// token. A model with GDN layers can only resume where its state was saved, so a match ends at the
// deepest matched node with a checkpoint; a model without them resumes at any matched block.
//
// Namespaces (vLLM's cache_salt, SGLang's extra_key): a prefix cached under one is matched only by
// requests under the same one; "" is the shared default. The namespace is part of the key of a
// path's first block (the root's children), so paths never cross between namespaces.
//
// Memory comes from the same pools as running requests (KV blocks, slots) and goes back LRU-first
// when they need it: evict() never touches what a running sequence holds (a shared block stays
// alive while a sequence references it). Pure host bookkeeping: the device work (copying a
// checkpoint into a request's slot) goes through CacheAllocator.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/cache_allocator.h"

namespace deltaserve {

class PrefixCache {
 public:
  PrefixCache(int block_size, CacheAllocator& alloc);
  ~PrefixCache();

  struct Match {
    int n_tokens = 0;               // usable cached prefix (a multiple of block_size)
    std::vector<int32_t> blocks;    // its KV blocks (not yet retained by the caller)
    int checkpoint_slot = -1;       // the GDN state after n_tokens (models with state), else -1
  };
  // The longest usable cached prefix of tokens (in namespace ns), at most max_tokens long. Marks
  // the path as used.
  Match match(std::span<const int32_t> tokens, int max_tokens, std::string_view ns = {});
  // match()'s n_tokens without marking anything used (for ordering the waiting queue).
  int match_length(std::span<const int32_t> tokens, int max_tokens, std::string_view ns = {}) const;
  // Caches the first n_blocks full blocks of a sequence (its tokens and block table) in namespace
  // ns: nodes that are new retain the sequence's block. checkpoint_slot >= 0 holds the state after
  // block n_blocks - 1 and passes to the tree (released at once if that node already has one).
  void insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks, int n_blocks, int checkpoint_slot,
              std::string_view ns = {});

  // Frees LRU cached blocks (leaves first) until `n_blocks` blocks are free in the pool, or nothing
  // more can go. Returns whether they are free.
  bool evict_blocks(int n_blocks);
  // Frees the least recently used checkpoint's slot; false when there is none.
  bool evict_checkpoint();
  // Frees the checkpoint after the first n_tokens of tokens when a deeper one on the same path is
  // about to replace it: the node is on no branch (at most one child) and not pinned. A multi-turn
  // conversation's previous turn gives way to its new one, not another conversation's.
  bool drop_superseded_checkpoint(std::span<const int32_t> tokens, int n_tokens, std::string_view ns = {});
  // Keeps a checkpoint from eviction between match() and its use (one at a time).
  void pin(int checkpoint_slot) { pinned_slot_ = checkpoint_slot; }
  void unpin() { pinned_slot_ = -1; }
  // Drops everything (/flush_cache).
  void clear();

  int n_cached_blocks() const { return n_nodes_; }
  int n_checkpoints() const { return n_checkpoints_; }
  // Calls fn(block) for every block the tree holds a reference to, and fn_slot(slot) per checkpoint.
  template <typename BlockFn, typename SlotFn>
  void for_each_held(BlockFn&& fn, SlotFn&& fn_slot) const;
  // Tree structure: parents/children agree, counts match, every held block is in use.
  void check_integrity() const;

 private:
  struct Node {
    Node* parent = nullptr;
    std::vector<int32_t> tokens;   // [block_size]
    uint64_t key = 0;              // key_of(parent, tokens, ns) (the parent's children are keyed by it)
    std::string ns;                // the root's children: the namespace of the path ("" default)
    int32_t block = -1;
    int32_t checkpoint = -1;       // slot, or -1
    uint64_t last_use = 0;
    std::unordered_map<uint64_t, Node*> children;
  };
  static uint64_t hash_block(std::span<const int32_t> tokens);
  // A child's key: the hash of its tokens, with the namespace mixed in under the root.
  uint64_t key_of(const Node* parent, std::span<const int32_t> tokens, std::string_view ns) const;
  Node* child(Node* n, std::span<const int32_t> tokens, std::string_view ns) const;
  void drop_checkpoint(Node* n);
  void remove_leaf(Node* n);
  template <typename Fn>
  void walk(const Node* n, Fn&& fn) const;

  int block_size_;
  CacheAllocator& alloc_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  int n_nodes_ = 0, n_checkpoints_ = 0;
  int pinned_slot_ = -1;
};

template <typename Fn>
void PrefixCache::walk(const Node* n, Fn&& fn) const {
  for (const auto& [key, c] : n->children) {
    fn(c);
    walk(c, fn);
  }
}

template <typename BlockFn, typename SlotFn>
void PrefixCache::for_each_held(BlockFn&& fn, SlotFn&& fn_slot) const {
  walk(root_.get(), [&](const Node* n) {
    fn(n->block);
    if (n->checkpoint >= 0) fn_slot(n->checkpoint);
  });
}

}  // namespace deltaserve
