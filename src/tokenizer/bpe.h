// Byte-level BPE model (HF `tokenizers` models::bpe::BPE with byte_fallback off, no dropout, no
// subword prefix/suffix): works on raw bytes; tokenizer.json's byte-level strings are converted at
// load. Merging matches HF `Word::merge_all`: repeatedly apply the lowest-rank adjacent pair, the
// leftmost one on ties.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/token_id.h"
#include "util/status.h"

namespace deltaserve {

class Bpe {
 public:
  // `token_bytes[id]` are the raw bytes of token `id` (empty for ids that are not in the vocab).
  // `merges` are (left, right) token byte strings in rank order; each concatenation must be a
  // token.
  static Result<std::unique_ptr<Bpe>> create(
      std::vector<std::string> token_bytes,
      const std::vector<std::pair<std::string, std::string>>& merges);

  Bpe(const Bpe&) = delete;
  Bpe& operator=(const Bpe&) = delete;

  // Appends the tokens of one pre-token (raw bytes) to `out`. Thread-safe.
  void encode(std::string_view piece, std::vector<TokenId>& out) const;
  // The same result without the cache and always through the heap merge (normally used only for
  // long pieces); tests compare it with encode() to check the two merge paths agree.
  void encode_with_heap(std::string_view piece, std::vector<TokenId>& out) const;

  int size() const { return static_cast<int>(token_bytes_.size()); }
  // Raw bytes of a vocab token; empty for an id outside the vocab.
  std::string_view token_bytes(TokenId id) const;
  std::optional<TokenId> find(std::string_view bytes) const;
  int n_merges() const { return n_merges_; }

 private:
  Bpe() = default;

  struct MergeEntry {
    std::uint64_t key;  // (left << 32) | right; kEmptyKey when unused
    std::uint32_t rank;
    TokenId merged;
  };
  static constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};
  static constexpr std::uint32_t kNoRank = ~std::uint32_t{0};

  // The rank and result of merging (left, right); rank kNoRank when they do not merge.
  std::pair<std::uint32_t, TokenId> lookup_merge(TokenId left, TokenId right) const {
    const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
                              static_cast<std::uint32_t>(right);
    std::size_t slot = hash(key) & merge_mask_;
    while (true) {
      const MergeEntry& e = merge_table_[slot];
      if (e.key == key) return {e.rank, e.merged};
      if (e.key == kEmptyKey) return {kNoRank, -1};
      slot = (slot + 1) & merge_mask_;
    }
  }
  static std::uint64_t hash(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return x;
  }

  void merge_small(const TokenId* ids, int n, std::vector<TokenId>& out) const;
  void merge_large(const TokenId* ids, int n, std::vector<TokenId>& out) const;

  // Per-pre-token result cache: direct-mapped slots (a new entry evicts the one in its slot), in
  // shards with their own mutex so concurrent encodes rarely contend. Bounded by construction.
  // An entry is one 64-byte cache line with the key and ids inline: no pointer chasing. Longer
  // pieces or results are simply not cached.
  static constexpr std::size_t kMaxCachedPieceBytes = 22;
  static constexpr std::size_t kMaxCachedIds = 8;
  struct alignas(64) CacheEntry {
    std::uint64_t hash = 0;
    std::uint8_t key_len = 0;
    std::uint8_t n_ids = 0;  // 0: empty slot
    char key[kMaxCachedPieceBytes];
    TokenId ids[kMaxCachedIds];
  };
  static_assert(sizeof(CacheEntry) == 64);
  struct CacheShard {
    std::mutex mu;
    std::vector<CacheEntry> slots;
  };
  static constexpr int kCacheShards = 16;
  static constexpr std::size_t kCacheSlotsPerShard = 4096;  // power of two; 4 MB in all
  static std::uint64_t hash_bytes(std::string_view s);

  std::vector<std::string> token_bytes_;
  // Open-addressing index bytes -> id over token_bytes_ (-1 = empty slot); flat, so building it
  // for 150k tokens and probing it 3x per merge at load stays cheap.
  std::vector<TokenId> index_;
  std::size_t index_mask_ = 0;
  std::array<TokenId, 256> byte_ids_{};  // token of each single byte, -1 if none
  std::vector<MergeEntry> merge_table_;
  std::size_t merge_mask_ = 0;
  int n_merges_ = 0;
  mutable std::array<CacheShard, kCacheShards> cache_;  // slots allocated by create()
};

}  // namespace deltaserve
