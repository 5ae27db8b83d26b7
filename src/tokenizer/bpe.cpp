#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>

namespace deltaserve {

namespace {

// Pieces up to this many bytes use the quadratic in-place merge (fast for short words); longer
// ones (runs of spaces or punctuation) use the heap so a 1 MB run stays n log n.
constexpr int kSmallPieceBytes = 48;

}  // namespace

Result<std::unique_ptr<Bpe>> Bpe::create(
    std::vector<std::string> token_bytes,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  std::unique_ptr<Bpe> bpe(new Bpe());
  bpe->token_bytes_ = std::move(token_bytes);
  bpe->byte_ids_.fill(-1);
  std::size_t index_capacity = 16;
  while (index_capacity < bpe->token_bytes_.size() * 2) index_capacity *= 2;
  bpe->index_.assign(index_capacity, -1);
  bpe->index_mask_ = index_capacity - 1;
  for (std::size_t id = 0; id < bpe->token_bytes_.size(); ++id) {
    const std::string& bytes = bpe->token_bytes_[id];
    if (bytes.empty()) continue;
    std::size_t slot = hash_bytes(bytes) & bpe->index_mask_;
    while (bpe->index_[slot] >= 0 && bpe->token_bytes_[bpe->index_[slot]] != bytes) {
      slot = (slot + 1) & bpe->index_mask_;
    }
    if (bpe->index_[slot] < 0) bpe->index_[slot] = static_cast<TokenId>(id);  // first id wins
    if (bytes.size() == 1)
      bpe->byte_ids_[static_cast<unsigned char>(bytes[0])] = static_cast<TokenId>(id);
  }

  for (CacheShard& shard : bpe->cache_) shard.slots.resize(kCacheSlotsPerShard);
  std::size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  bpe->merge_table_.assign(capacity, MergeEntry{kEmptyKey, 0, 0});
  bpe->merge_mask_ = capacity - 1;
  std::string joined;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = bpe->find(left), r = bpe->find(right);
    joined = left + right;
    const auto m = bpe->find(joined);
    if (!l || !r || !m) {
      return error("BPE merge #", rank, " refers to a token that is not in the vocab");
    }
    const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(*l)) << 32) |
                              static_cast<std::uint32_t>(*r);
    std::size_t slot = hash(key) & bpe->merge_mask_;
    while (bpe->merge_table_[slot].key != kEmptyKey && bpe->merge_table_[slot].key != key) {
      slot = (slot + 1) & bpe->merge_mask_;
    }
    // A pair listed twice keeps its last rank: HF collects the merges into a map in file order.
    if (bpe->merge_table_[slot].key != key) ++bpe->n_merges_;
    bpe->merge_table_[slot] = MergeEntry{key, static_cast<std::uint32_t>(rank), *m};
  }
  return bpe;
}

std::string_view Bpe::token_bytes(TokenId id) const {
  if (id < 0 || id >= size()) return {};
  return token_bytes_[static_cast<std::size_t>(id)];
}

std::optional<TokenId> Bpe::find(std::string_view bytes) const {
  if (bytes.empty()) return std::nullopt;
  for (std::size_t slot = hash_bytes(bytes) & index_mask_;; slot = (slot + 1) & index_mask_) {
    const TokenId id = index_[slot];
    if (id < 0) return std::nullopt;
    if (token_bytes_[static_cast<std::size_t>(id)] == bytes) return id;
  }
}

void Bpe::encode(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  std::uint64_t h = 0;
  CacheShard* shard = nullptr;
  std::size_t slot = 0;
  if (cacheable) {
    h = hash_bytes(piece);
    shard = &cache_[h % kCacheShards];
    slot = (h / kCacheShards) & (kCacheSlotsPerShard - 1);
    TokenId hit[kMaxCachedIds];
    std::size_t n_hit = 0;
    {
      std::lock_guard lock(shard->mu);
      const CacheEntry& e = shard->slots[slot];
      if (e.n_ids != 0 && e.hash == h && e.key_len == piece.size() &&
          std::memcmp(e.key, piece.data(), piece.size()) == 0) {
        n_hit = e.n_ids;
        std::memcpy(hit, e.ids, n_hit * sizeof(TokenId));
      }
    }
    if (n_hit != 0) {
      out.insert(out.end(), hit, hit + n_hit);
      return;
    }
  }

  // Bytes without a token are dropped, as HF does when the model has no unk token.
  TokenId small[kSmallPieceBytes];
  std::vector<TokenId> long_ids;
  TokenId* sym = small;
  if (piece.size() > kSmallPieceBytes) {
    long_ids.resize(piece.size());
    sym = long_ids.data();
  }
  int n = 0;
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) sym[n++] = id;
  }
  const std::size_t first = out.size();
  if (n <= kSmallPieceBytes) {
    merge_small(sym, n, out);
  } else {
    merge_large(sym, n, out);
  }

  const std::size_t n_ids = out.size() - first;
  if (cacheable && n_ids != 0 && n_ids <= kMaxCachedIds) {
    std::lock_guard lock(shard->mu);
    CacheEntry& e = shard->slots[slot];
    e.hash = h;
    e.key_len = static_cast<std::uint8_t>(piece.size());
    e.n_ids = static_cast<std::uint8_t>(n_ids);
    std::memcpy(e.key, piece.data(), piece.size());
    std::memcpy(e.ids, out.data() + first, n_ids * sizeof(TokenId));
  }
}

std::uint64_t Bpe::hash_bytes(std::string_view s) {
  // Multiply-xorshift over 8-byte words; pieces are short, so this beats a general-purpose hash.
  std::uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  if (i < s.size()) {
    std::uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

void Bpe::encode_with_heap(std::string_view piece, std::vector<TokenId>& out) const {
  std::vector<TokenId> ids;
  for (char c : piece) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) ids.push_back(id);
  }
  if (!ids.empty()) merge_large(ids.data(), static_cast<int>(ids.size()), out);
}

void Bpe::merge_small(const TokenId* input, int n, std::vector<TokenId>& out) const {
  DS_CHECK(n >= 0 && n <= kSmallPieceBytes, "merge_small got ", n, " symbols");
  // sym[i] with rank[i]/merged[i] describing the pair (sym[i], sym[i + 1]).
  TokenId sym[kSmallPieceBytes];
  TokenId merged[kSmallPieceBytes];
  std::uint32_t rank[kSmallPieceBytes];
  std::copy(input, input + n, sym);
  if (n == 1) {
    out.push_back(sym[0]);
    return;
  }
  for (int i = 0; i + 1 < n; ++i) std::tie(rank[i], merged[i]) = lookup_merge(sym[i], sym[i + 1]);
  while (n > 1) {
    int best = -1;
    std::uint32_t best_rank = kNoRank;
    for (int i = 0; i + 1 < n; ++i) {
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    }
    if (best < 0) break;
    sym[best] = merged[best];
    // Remove sym[best + 1] and its pair entry.
    for (int i = best + 1; i + 1 < n; ++i) sym[i] = sym[i + 1];
    for (int i = best + 1; i + 2 < n; ++i) rank[i] = rank[i + 1], merged[i] = merged[i + 1];
    --n;
    if (best > 0)
      std::tie(rank[best - 1], merged[best - 1]) = lookup_merge(sym[best - 1], sym[best]);
    if (best + 1 < n) std::tie(rank[best], merged[best]) = lookup_merge(sym[best], sym[best + 1]);
  }
  out.insert(out.end(), sym, sym + n);
}

void Bpe::merge_large(const TokenId* input, int n, std::vector<TokenId>& out) const {
  // Doubly linked symbols plus a min-heap of candidate pairs ordered by (rank, position), like HF.
  // Stale heap entries are skipped when the pair at that position no longer matches.
  struct Sym {
    TokenId id;
    int prev, next;
  };
  struct Cand {
    std::uint32_t rank;
    int pos;
    TokenId left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Sym> syms(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) syms[i] = {input[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  const auto push_pair = [&](int pos) {
    const int nx = syms[pos].next;
    if (nx < 0) return;
    const auto [r, m] = lookup_merge(syms[pos].id, syms[nx].id);
    if (r != kNoRank) heap.push(Cand{r, pos, syms[pos].id, syms[nx].id, m});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& s = syms[c.pos];
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;  // stale
    const int gone = s.next;
    s.id = c.merged;
    s.next = syms[gone].next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    syms[gone].id = -1;  // dead symbols never match a candidate again
    syms[gone].next = -1;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(c.pos);
  }
  for (int i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace deltaserve
