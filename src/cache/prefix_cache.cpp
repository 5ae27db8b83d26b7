#include "cache/prefix_cache.h"

#include <algorithm>
#include <functional>
#include <queue>

namespace deltaserve {

PrefixCache::PrefixCache(int block_size, CacheAllocator& alloc)
    : block_size_(block_size), alloc_(alloc), root_(std::make_unique<Node>()) {}

PrefixCache::~PrefixCache() {
  // Nodes only (the pools may already be gone): children before parents.
  std::vector<Node*> order;
  walk(root_.get(), [&](const Node* c) { order.push_back(const_cast<Node*>(c)); });
  for (auto it = order.rbegin(); it != order.rend(); ++it) delete *it;
}

uint64_t PrefixCache::hash_block(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t PrefixCache::key_of(const Node* parent, std::span<const int32_t> tokens, std::string_view ns) const {
  uint64_t h = hash_block(tokens);
  if (parent == root_.get() && !ns.empty()) h ^= std::hash<std::string_view>{}(ns) * 0x9E3779B97F4A7C15ull;
  return h;
}

PrefixCache::Node* PrefixCache::child(Node* n, std::span<const int32_t> tokens, std::string_view ns) const {
  auto it = n->children.find(key_of(n, tokens, ns));
  if (it == n->children.end()) return nullptr;
  Node* c = it->second;
  if (n == root_.get() && c->ns != ns) return nullptr;
  return std::equal(tokens.begin(), tokens.end(), c->tokens.begin(), c->tokens.end()) ? c : nullptr;
}

PrefixCache::Match PrefixCache::match(std::span<const int32_t> tokens, int max_tokens, std::string_view ns) {
  Match m;
  const int n_blocks = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  const bool need_state = alloc_.has_state();
  const uint64_t now = ++clock_;
  Node* n = root_.get();
  std::vector<int32_t> path;
  for (int b = 0; b < n_blocks; ++b) {
    Node* c = child(n, tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_), ns);
    if (!c) break;
    c->last_use = now;
    path.push_back(c->block);
    if (!need_state || c->checkpoint >= 0) {
      m.n_tokens = (b + 1) * block_size_;
      m.checkpoint_slot = need_state ? c->checkpoint : -1;
    }
    n = c;
  }
  m.blocks.assign(path.begin(), path.begin() + m.n_tokens / block_size_);
  return m;
}

int PrefixCache::match_length(std::span<const int32_t> tokens, int max_tokens, std::string_view ns) const {
  const int n_blocks = std::min<int>(max_tokens, static_cast<int>(tokens.size())) / block_size_;
  const bool need_state = alloc_.has_state();
  int best = 0;
  Node* n = root_.get();
  for (int b = 0; b < n_blocks; ++b) {
    n = child(n, tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_), ns);
    if (!n) break;
    if (!need_state || n->checkpoint >= 0) best = (b + 1) * block_size_;
  }
  return best;
}

void PrefixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks, int n_blocks,
                         int checkpoint_slot, std::string_view ns) {
  DS_CHECK(n_blocks >= 0 && static_cast<size_t>(n_blocks) <= blocks.size() &&
               static_cast<size_t>(n_blocks) * block_size_ <= tokens.size(),
           "prefix cache insert of ", n_blocks, " blocks");
  const uint64_t now = ++clock_;
  Node* n = root_.get();
  for (int b = 0; b < n_blocks; ++b) {
    const auto tok = tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_);
    Node* c = child(n, tok, ns);
    if (!c) {
      const uint64_t key = key_of(n, tok, ns);
      if (n->children.count(key)) {  // a hash collision with other tokens: stop here
        if (checkpoint_slot >= 0) alloc_.release_checkpoint(checkpoint_slot);
        return;
      }
      auto owned = std::make_unique<Node>();
      c = owned.get();
      c->parent = n;
      c->tokens.assign(tok.begin(), tok.end());
      c->key = key;
      if (n == root_.get()) c->ns = std::string(ns);
      c->block = blocks[b];
      alloc_.blocks().retain(c->block);
      n->children.emplace(key, owned.release());
      ++n_nodes_;
    }
    c->last_use = now;
    n = c;
  }
  if (checkpoint_slot >= 0) {
    if (n != root_.get() && n->checkpoint < 0) {
      n->checkpoint = checkpoint_slot;
      ++n_checkpoints_;
    } else {
      alloc_.release_checkpoint(checkpoint_slot);
    }
  }
}

void PrefixCache::drop_checkpoint(Node* n) {
  if (n->checkpoint < 0) return;
  alloc_.release_checkpoint(n->checkpoint);
  n->checkpoint = -1;
  --n_checkpoints_;
}

void PrefixCache::remove_leaf(Node* n) {
  DS_CHECK(n->children.empty() && n->parent, "removing an inner node");
  drop_checkpoint(n);
  alloc_.blocks().release(n->block);
  n->parent->children.erase(n->key);
  --n_nodes_;
  delete n;
}

bool PrefixCache::evict_blocks(int n_blocks) {
  if (alloc_.blocks().n_free() >= n_blocks) return true;
  // Leaves, least recently used first; a parent whose last child goes becomes a leaf in turn.
  using Item = std::pair<uint64_t, Node*>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> leaves;
  walk(root_.get(), [&](const Node* c) {
    if (c->children.empty()) leaves.push({c->last_use, const_cast<Node*>(c)});
  });
  while (alloc_.blocks().n_free() < n_blocks && !leaves.empty()) {
    Node* n = leaves.top().second;
    leaves.pop();
    if (n->checkpoint >= 0 && n->checkpoint == pinned_slot_) continue;
    // A block a running sequence also holds would not come free: dropping it from the tree would
    // only lose the prefix (and its checkpoint) that sequence will leave cached. Its ancestors are
    // that sequence's too, so they never become leaves here.
    if (alloc_.blocks().ref_count(n->block) > 1) continue;
    Node* parent = n->parent;
    remove_leaf(n);
    if (parent != root_.get() && parent->children.empty()) leaves.push({parent->last_use, parent});
  }
  return alloc_.blocks().n_free() >= n_blocks;
}

bool PrefixCache::evict_checkpoint() {
  Node* oldest = nullptr;
  walk(root_.get(), [&](const Node* c) {
    if (c->checkpoint >= 0 && c->checkpoint != pinned_slot_ && (!oldest || c->last_use < oldest->last_use))
      oldest = const_cast<Node*>(c);
  });
  if (!oldest) return false;
  drop_checkpoint(oldest);
  return true;
}

bool PrefixCache::drop_superseded_checkpoint(std::span<const int32_t> tokens, int n_tokens, std::string_view ns) {
  if (n_tokens <= 0 || n_tokens % block_size_ != 0 || static_cast<size_t>(n_tokens) > tokens.size()) return false;
  Node* n = root_.get();
  for (int b = 0; n && b < n_tokens / block_size_; ++b)
    n = child(n, tokens.subspan(static_cast<size_t>(b) * block_size_, block_size_), ns);
  if (!n || n->checkpoint < 0 || n->checkpoint == pinned_slot_ || n->children.size() > 1) return false;
  drop_checkpoint(n);
  return true;
}

void PrefixCache::clear() {
  // Post-order: leaves first.
  std::vector<Node*> order;
  walk(root_.get(), [&](const Node* c) { order.push_back(const_cast<Node*>(c)); });
  for (auto it = order.rbegin(); it != order.rend(); ++it) remove_leaf(*it);
  DS_CHECK(n_nodes_ == 0 && n_checkpoints_ == 0, "prefix cache clear left ", n_nodes_, " nodes");
}

void PrefixCache::check_integrity() const {
  int nodes = 0, ckpts = 0;
  walk(root_.get(), [&](const Node* c) {
    ++nodes;
    ckpts += c->checkpoint >= 0;
    DS_CHECK(c->parent && c->parent->children.count(c->key) && c->parent->children.at(c->key) == c,
             "prefix cache node not under its parent");
    DS_CHECK(static_cast<int>(c->tokens.size()) == block_size_ && key_of(c->parent, c->tokens, c->ns) == c->key,
             "prefix cache node key");
    DS_CHECK(c->parent == root_.get() || c->ns.empty(), "prefix cache namespace below the first block");
    DS_CHECK(alloc_.blocks().ref_count(c->block) > 0, "prefix cache holds free block ", c->block);
  });
  DS_CHECK(nodes == n_nodes_ && ckpts == n_checkpoints_, "prefix cache counts: ", nodes, " nodes (counted ",
           n_nodes_, "), ", ckpts, " checkpoints (counted ", n_checkpoints_, ")");
}

}  // namespace deltaserve
