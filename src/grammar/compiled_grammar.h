// CompiledGrammar: a Grammar as a set of byte-level automata (one DFA per rule that must stay a
// rule: the root, recursive rules and rules marked `shared`; all other rules are inlined), bound to
// a TokenVocabulary, plus the token-mask caches every GrammarMatcher of this grammar shares.
//
// Each rule's DFA has byte edges (through byte classes: bytes no rule tells apart share a class)
// and call edges (callee rule, continuation node). A matcher position is a Frame: a rule, a node
// of its DFA, and the frame to resume when the rule completes (a pushdown stack kept as a tree of
// interned frames, so positions are three integers and stacks are shared).
//
// Compilation rejects grammars the matcher cannot run: left recursion, grammars matching nothing,
// and automata over the size limit. Errors name the rule.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_vocabulary.h"
#include "util/status.h"

namespace deltaserve {

struct RuleAutomaton {
  std::string name;
  int32_t start = 0;
  int32_t n_nodes = 0;
  int32_t node_offset = 0;               // first global node id (mask caches index by it)
  std::vector<int32_t> next;             // [node * n_classes + class] -> node, -1: no edge
  std::vector<uint8_t> final;            // [node] the rule may end here
  std::vector<uint8_t> has_bytes;        // [node] some byte edge leaves it
  std::vector<int32_t> call_begin;       // [node .. node + 1) range of `calls`
  std::vector<std::pair<int32_t, int32_t>> calls;  // (callee rule, continuation node)
};

// A pushdown position: `node` of `rule`'s DFA, resuming frame `parent` when the rule ends.
struct Frame {
  int32_t rule = 0;
  int32_t node = 0;
  int32_t parent = -1;  // kBottom: the rule is the grammar's root
  bool operator==(const Frame& o) const { return rule == o.rule && node == o.node && parent == o.parent; }
  bool operator<(const Frame& o) const {
    return rule != o.rule ? rule < o.rule : node != o.node ? node < o.node : parent < o.parent;
  }
};
constexpr int32_t kBottom = -1;    // below the root rule: the grammar is complete
constexpr int32_t kSentinel = -2;  // "some unknown caller" (token masks computed per rule node)

struct GrammarLimits {
  int64_t max_nfa_states = 4'000'000;
  int64_t max_dfa_nodes = 400'000;
  // Steps of the subset construction (NFA states visited by the closures and the nodes' edges),
  // all rules together: nested counted repetitions such as (a{1,200}){1,200} stay small as NFAs
  // but cost n^4 steps to determinize (minutes), on a thread that serves requests.
  int64_t max_subset_steps = 30'000'000;
  // Bytes of token masks cached per rule node (GrammarMaskCache::store_local) over the grammar's
  // life; past it, masks are computed for each use and not kept.
  int64_t max_local_mask_bytes = int64_t{256} << 20;
};

struct CompiledGrammarStats {
  int n_rules = 0;
  int n_nodes = 0;
  int n_classes = 0;
};

class GrammarMaskCache;  // grammar_matcher.cpp

class CompiledGrammar {
 public:
  static Result<std::shared_ptr<const CompiledGrammar>> compile(
      const Grammar& grammar, std::shared_ptr<const TokenVocabulary> vocab, const GrammarLimits& limits = {});
  ~CompiledGrammar();

  const TokenVocabulary& vocab() const { return *vocab_; }
  const std::shared_ptr<const TokenVocabulary>& vocab_ptr() const { return vocab_; }
  int n_classes() const { return n_classes_; }
  uint8_t byte_class(uint8_t b) const { return classes_[b]; }
  const std::array<uint8_t, 256>& byte_classes() const { return classes_; }
  const RuleAutomaton& rule(int32_t r) const { return rules_[static_cast<size_t>(r)]; }
  int n_rules() const { return static_cast<int>(rules_.size()); }
  int32_t root() const { return root_; }
  int32_t n_nodes_total() const { return n_nodes_total_; }
  CompiledGrammarStats stats() const;

  // Interned stack frames (thread-safe). intern() returns a stable id; frame(id) reads it. They
  // are never freed: a recursive grammar gains frames for every new stack shape it meets. With
  // the arena full (kMaxFrames), intern() returns -1 and the stepper drops that call: the text
  // can no longer go deeper there, and a matcher left no token ends its request.
  int32_t intern(const Frame& f) const;
  Frame frame(int32_t id) const;
  int32_t n_frames() const { return n_frames_.load(std::memory_order_acquire); }
  static constexpr int32_t kMaxFrames = int32_t{1} << 26;  // 64M frames: chunks of 4096

  GrammarMaskCache& masks() const { return *masks_; }

 private:
  CompiledGrammar() = default;
  friend class GrammarCompiler;

  std::shared_ptr<const TokenVocabulary> vocab_;
  std::array<uint8_t, 256> classes_{};
  int n_classes_ = 1;
  std::vector<RuleAutomaton> rules_;
  int32_t root_ = 0;
  int32_t n_nodes_total_ = 0;

  // Frame arena: chunks never move, so reads need no lock once an id has been handed out.
  static constexpr int kChunkBits = 12;
  static constexpr int kMaxChunks = kMaxFrames >> kChunkBits;
  mutable std::mutex frames_mutex_;
  mutable std::unique_ptr<std::unique_ptr<Frame[]>[]> chunks_;
  mutable std::atomic<int32_t> n_frames_{0};
  struct FrameHash {
    size_t operator()(const Frame& f) const {
      uint64_t h = static_cast<uint64_t>(static_cast<uint32_t>(f.rule)) * 0x9E3779B97F4A7C15ull;
      h ^= static_cast<uint64_t>(static_cast<uint32_t>(f.node)) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
      h ^= static_cast<uint64_t>(static_cast<uint32_t>(f.parent)) + 0x85EBCA77C2B2AE63ull + (h << 6) + (h >> 2);
      return static_cast<size_t>(h);
    }
  };
  mutable std::unordered_map<Frame, int32_t, FrameHash> frame_ids_;

  std::unique_ptr<GrammarMaskCache> masks_;
};

}  // namespace deltaserve
