// GrammarMatcher: one sequence's position in a CompiledGrammar, advanced token by token, with the
// mask of tokens allowed next and rollback (speculative drafts are accepted, then undone).
//
//   GrammarMatcher m(compiled);
//   const TokenBitset& allowed = m.next_token_mask();  // EOS ids included when m.can_end()
//   m.accept_token(sampled);                           // false (state unchanged) if not allowed
//   m.rollback(2);                                     // undo the last two accepted tokens
//
// A state is a sorted set of Frames (the alternatives a nondeterministic grammar keeps open), each
// ready to consume a byte, plus whether the text so far is a complete match.
//
// Masks. The tokens a position (rule, node) accepts without leaving its rule do not depend on the
// caller, so they are computed once per grammar by walking the vocabulary trie from that node with
// an unknown caller (kSentinel): the "local" mask, plus the trie nodes where the rule ended with
// bytes of the token left over ("pops"). A state's mask is the union of its positions' local
// masks plus, for each pop, a walk of that trie subtree from the caller's continuation; it is
// cached per state. All caches are shared by the grammar's matchers (thread-safe).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/token_vocabulary.h"

namespace deltaserve {

struct MatchFlags {
  bool accept = false;  // a stack emptied: the grammar is complete here
  bool popped = false;  // a frame returned to kSentinel
};

// Byte-level stepping (no caches). Scratch buffers make it cheap; not thread-safe.
class GrammarStepper {
 public:
  explicit GrammarStepper(const CompiledGrammar& g) : g_(g) {}
  // Adds to `out` the positions reachable from `arrived` (a frame that just reached its node)
  // without consuming a byte; `out` stays duplicate-free within one begin()/... sequence.
  void begin() { visited_.clear(); }
  void closure(const Frame& arrived, std::vector<Frame>& out, MatchFlags& flags);
  // out = every position after consuming `byte` from one of `cur`, sorted.
  void step(std::span<const Frame> cur, uint8_t byte, std::vector<Frame>& out, MatchFlags& flags);
  // The initial state of the grammar.
  void initial(std::vector<Frame>& out, MatchFlags& flags);

 private:
  const CompiledGrammar& g_;
  std::vector<Frame> visited_, stack_;
};

class GrammarMaskCache {
 public:
  struct Local {
    // Tokens accepted inside the rule (or ending exactly at its end): a bitset, or (sparse, the
    // usual case at structural positions) the ids, which keeps cached masks small.
    TokenBitset accepted;
    std::vector<int32_t> ids;
    bool sparse = false;
    std::vector<int32_t> pops;     // trie nodes after which the rule has ended, bytes remaining
    void add_to(TokenBitset& mask) const {
      if (!sparse) return mask.merge(accepted);
      for (int32_t id : ids) mask.set(id);
    }
  };
  GrammarMaskCache(const CompiledGrammar& g, int64_t max_bytes);
  ~GrammarMaskCache();

  const Local* find_local(int32_t global_node) const {
    return local_[static_cast<size_t>(global_node)].load(std::memory_order_acquire);
  }
  // Caches `local` for the node and returns the cached one (its own, or one another thread stored
  // first). Past max_bytes of cached masks it caches nothing more and returns nullptr, leaving
  // `local` with the caller: a long grammar (regex [\s\S]{20000}) visits a node per token, each
  // a mask of the vocabulary (31 KB at 248k tokens), and the cache lives as long as the grammar.
  const Local* store_local(int32_t global_node, std::unique_ptr<Local>& local);
  std::shared_ptr<const TokenBitset> find_state(const std::vector<int32_t>& key);
  void store_state(const std::vector<int32_t>& key, std::shared_ptr<const TokenBitset> mask);

  struct Stats {
    int64_t local_masks = 0, state_masks = 0, state_hits = 0, state_misses = 0;
    int64_t local_bytes = 0;
  };
  Stats stats() const;

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };
  std::unique_ptr<std::atomic<const Local*>[]> local_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Local>> owned_;
  int64_t owned_bytes_ = 0, max_bytes_ = 0;
  std::unordered_map<std::vector<int32_t>, std::shared_ptr<const TokenBitset>, KeyHash> states_;
  int64_t hits_ = 0, misses_ = 0;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by one token. EOS ids are accepted only when can_end() (then is_terminated()).
  bool accept_token(int32_t id);
  // Advances by raw text (tests, forced prefixes); all of it or nothing.
  bool accept_string(std::string_view text);
  // Undoes the last n accepted tokens (or strings).
  void rollback(int n);
  int n_accepted() const { return static_cast<int>(accept_.size()) - 1; }

  // The tokens allowed next: valid until the next call on this matcher.
  const TokenBitset& next_token_mask();
  bool can_end() const { return accept_.back() != 0; }
  bool is_terminated() const { return terminated_.back() != 0; }
  // No text can follow (only EOS is allowed).
  bool must_end() const { return state().empty(); }

  const CompiledGrammar& grammar() const { return *g_; }

 private:
  std::span<const Frame> state() const {
    return {frames_.data() + begin_.back(), frames_.size() - begin_.back()};
  }
  bool advance(std::string_view bytes, std::vector<Frame>& out, bool& accept);
  void push_state(std::span<const Frame> frames, bool accept, bool terminated);
  const GrammarMaskCache::Local& local(const Frame& f);
  // Marks the tokens in trie range [begin, end) (below depth `base`) accepted from `start`;
  // records local pops when `pops` is set.
  void walk(int32_t begin, int32_t end, int32_t base, std::span<const Frame> start, TokenBitset& mask,
            std::vector<int32_t>* pops);

  std::shared_ptr<const CompiledGrammar> g_;
  GrammarStepper stepper_;
  std::vector<Frame> frames_;      // every state on the history stack, concatenated
  std::vector<size_t> begin_;      // where each state starts in frames_
  std::vector<uint8_t> accept_, terminated_;
  std::shared_ptr<const TokenBitset> mask_;  // of the current state (reset when it changes)
  // Scratch.
  std::vector<std::vector<Frame>> levels_;
  std::vector<Frame> tmp_a_, tmp_b_;
  // Local masks the cache had no room for, kept while next_token_mask() uses them.
  std::vector<std::unique_ptr<GrammarMaskCache::Local>> uncached_;
  std::vector<int32_t> key_;
};

}  // namespace deltaserve
