#include "grammar/grammar_matcher.h"

#include <algorithm>

namespace deltaserve {

// --- GrammarStepper ---

void GrammarStepper::closure(const Frame& arrived, std::vector<Frame>& out, MatchFlags& flags) {
  stack_.clear();
  stack_.push_back(arrived);
  while (!stack_.empty()) {
    const Frame f = stack_.back();
    stack_.pop_back();
    if (std::find(visited_.begin(), visited_.end(), f) != visited_.end()) continue;
    visited_.push_back(f);
    const RuleAutomaton& a = g_.rule(f.rule);
    const size_t n = static_cast<size_t>(f.node);
    if (a.has_bytes[n]) out.push_back(f);
    for (int32_t k = a.call_begin[n]; k < a.call_begin[n + 1]; ++k) {
      const auto& [callee, cont] = a.calls[static_cast<size_t>(k)];
      const int32_t parent = g_.intern(Frame{f.rule, cont, f.parent});
      if (parent < 0) continue;  // the frame arena is full: this call is not followed
      stack_.push_back(Frame{callee, g_.rule(callee).start, parent});
    }
    if (a.final[n]) {
      if (f.parent == kBottom) {
        flags.accept = true;
      } else if (f.parent == kSentinel) {
        flags.popped = true;
      } else {
        stack_.push_back(g_.frame(f.parent));
      }
    }
  }
}

void GrammarStepper::step(std::span<const Frame> cur, uint8_t byte, std::vector<Frame>& out, MatchFlags& flags) {
  out.clear();
  visited_.clear();
  flags = MatchFlags{};
  const size_t nc = static_cast<size_t>(g_.n_classes());
  const size_t cls = g_.byte_class(byte);
  for (const Frame& f : cur) {
    const int32_t t = g_.rule(f.rule).next[static_cast<size_t>(f.node) * nc + cls];
    if (t < 0) continue;
    const RuleAutomaton& a = g_.rule(f.rule);
    // Fast path: a plain byte edge to a node that neither calls nor ends.
    if (!a.final[static_cast<size_t>(t)] && a.call_begin[static_cast<size_t>(t)] == a.call_begin[static_cast<size_t>(t) + 1]) {
      const Frame nf{f.rule, t, f.parent};
      if (std::find(visited_.begin(), visited_.end(), nf) == visited_.end()) {
        visited_.push_back(nf);
        out.push_back(nf);
      }
      continue;
    }
    closure(Frame{f.rule, t, f.parent}, out, flags);
  }
  if (out.size() > 1) std::sort(out.begin(), out.end());
}

void GrammarStepper::initial(std::vector<Frame>& out, MatchFlags& flags) {
  out.clear();
  visited_.clear();
  flags = MatchFlags{};
  closure(Frame{g_.root(), g_.rule(g_.root()).start, kBottom}, out, flags);
  std::sort(out.begin(), out.end());
}

// --- GrammarMaskCache ---

size_t GrammarMaskCache::KeyHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 1469598103934665603ull ^ v.size();
  for (int32_t x : v) {
    h ^= static_cast<uint32_t>(x);
    h *= 1099511628211ull;
  }
  return static_cast<size_t>(h ^ (h >> 31));
}

GrammarMaskCache::GrammarMaskCache(const CompiledGrammar& g, int64_t max_bytes)
    : local_(std::make_unique<std::atomic<const Local*>[]>(static_cast<size_t>(g.n_nodes_total()))), max_bytes_(max_bytes) {
  for (int32_t i = 0; i < g.n_nodes_total(); ++i) local_[static_cast<size_t>(i)].store(nullptr);
}

GrammarMaskCache::~GrammarMaskCache() = default;

const GrammarMaskCache::Local* GrammarMaskCache::store_local(int32_t global_node, std::unique_ptr<Local>& local) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (const Local* have = local_[static_cast<size_t>(global_node)].load(std::memory_order_acquire)) return have;
  const int64_t bytes = static_cast<int64_t>(sizeof(Local) + local->accepted.words().size() * 8 +
                                             (local->ids.size() + local->pops.size()) * 4);
  if (owned_bytes_ + bytes > max_bytes_) return nullptr;
  owned_bytes_ += bytes;
  const Local* p = local.get();
  owned_.push_back(std::move(local));
  local_[static_cast<size_t>(global_node)].store(p, std::memory_order_release);
  return p;
}

std::shared_ptr<const TokenBitset> GrammarMaskCache::find_state(const std::vector<int32_t>& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(key);
  if (it == states_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return it->second;
}

void GrammarMaskCache::store_state(const std::vector<int32_t>& key, std::shared_ptr<const TokenBitset> mask) {
  constexpr size_t kMaxStates = 1024;  // at most ~32 MB of masks at 248k tokens; then start over
  std::lock_guard<std::mutex> lock(mutex_);
  if (states_.size() >= kMaxStates) states_.clear();
  states_.emplace(key, std::move(mask));
}

GrammarMaskCache::Stats GrammarMaskCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return Stats{static_cast<int64_t>(owned_.size()), static_cast<int64_t>(states_.size()), hits_, misses_, owned_bytes_};
}

// --- GrammarMatcher ---

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : g_(std::move(grammar)), stepper_(*g_) {
  MatchFlags flags;
  stepper_.initial(tmp_a_, flags);
  begin_.push_back(0);
  frames_ = tmp_a_;
  accept_.push_back(flags.accept ? 1 : 0);
  terminated_.push_back(0);
  levels_.resize(static_cast<size_t>(g_->vocab().max_token_bytes()) + 2);
}

void GrammarMatcher::push_state(std::span<const Frame> frames, bool accept, bool terminated) {
  mask_.reset();
  begin_.push_back(frames_.size());
  frames_.insert(frames_.end(), frames.begin(), frames.end());
  accept_.push_back(accept ? 1 : 0);
  terminated_.push_back(terminated ? 1 : 0);
}

bool GrammarMatcher::advance(std::string_view bytes, std::vector<Frame>& out, bool& accept) {
  std::span<const Frame> cur = state();
  accept = can_end();
  if (bytes.empty()) {
    out.assign(cur.begin(), cur.end());
    return true;
  }
  std::vector<Frame>* a = &tmp_a_;
  std::vector<Frame>* b = &tmp_b_;
  a->assign(cur.begin(), cur.end());
  for (size_t i = 0; i < bytes.size(); ++i) {
    MatchFlags flags;
    stepper_.step(*a, static_cast<uint8_t>(bytes[i]), *b, flags);
    const bool last = i + 1 == bytes.size();
    if (b->empty() && !(last && flags.accept)) return false;
    accept = flags.accept;
    std::swap(a, b);
  }
  out.swap(*a);
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (is_terminated()) return false;
  const TokenVocabulary& v = g_->vocab();
  if (id < 0 || id >= v.size()) return false;
  if (v.is_eos(id)) {
    if (!can_end()) return false;
    push_state({}, true, true);
    return true;
  }
  if (v.is_special(id) || v.bytes(id).empty()) return false;
  std::vector<Frame> out;
  bool accept = false;
  if (!advance(v.bytes(id), out, accept)) return false;
  push_state(out, accept, false);
  return true;
}

bool GrammarMatcher::accept_string(std::string_view text) {
  if (is_terminated()) return false;
  std::vector<Frame> out;
  bool accept = false;
  if (!advance(text, out, accept)) return false;
  push_state(out, accept, false);
  return true;
}

void GrammarMatcher::rollback(int n) {
  n = std::min(n, n_accepted());
  if (n <= 0) return;
  const size_t keep = begin_.size() - static_cast<size_t>(n);
  mask_.reset();
  frames_.resize(begin_[keep]);
  begin_.resize(keep);
  accept_.resize(keep);
  terminated_.resize(keep);
}

void GrammarMatcher::walk(int32_t begin, int32_t end, int32_t base, std::span<const Frame> start, TokenBitset& mask,
                          std::vector<int32_t>* pops) {
  const TokenVocabulary& v = g_->vocab();
  const uint8_t* bytes = v.node_bytes();
  const int32_t* depth = v.node_depths();
  const int32_t* sub_end = v.subtree_ends();
  const int32_t* tb = v.token_begins();
  const int32_t* tids = v.token_ids();
  levels_[0].assign(start.begin(), start.end());
  int32_t i = begin;
  while (i < end) {
    const size_t d = static_cast<size_t>(depth[i] - base);
    MatchFlags flags;
    stepper_.step(levels_[d - 1], bytes[i], levels_[d], flags);
    if (flags.popped && pops) pops->push_back(i);
    const bool alive = !levels_[d].empty();
    if (alive || flags.popped || flags.accept) {
      for (int32_t k = tb[i]; k < tb[i + 1]; ++k) mask.set(tids[k]);
    }
    i = alive ? i + 1 : sub_end[i];
  }
}

const GrammarMaskCache::Local& GrammarMatcher::local(const Frame& f) {
  const int32_t global = g_->rule(f.rule).node_offset + f.node;
  GrammarMaskCache& cache = g_->masks();
  if (const auto* have = cache.find_local(global)) return *have;
  auto local = std::make_unique<GrammarMaskCache::Local>();
  local->accepted = TokenBitset(g_->vocab().size());
  const Frame start{f.rule, f.node, kSentinel};
  walk(1, g_->vocab().n_nodes(), 0, std::span<const Frame>(&start, 1), local->accepted, &local->pops);
  std::sort(local->pops.begin(), local->pops.end());
  local->pops.erase(std::unique(local->pops.begin(), local->pops.end()), local->pops.end());
  if (local->accepted.count() <= g_->vocab().size() / 64) {
    local->ids = local->accepted.ids();
    local->accepted = TokenBitset();
    local->sparse = true;
  }
  if (const auto* stored = cache.store_local(global, local)) return *stored;
  uncached_.push_back(std::move(local));
  return *uncached_.back();
}

const TokenBitset& GrammarMatcher::next_token_mask() {
  if (mask_) return *mask_;
  const TokenVocabulary& v = g_->vocab();
  const std::span<const Frame> cur = state();
  const bool accept = can_end();
  if (is_terminated() || cur.empty()) {
    auto m = std::make_shared<TokenBitset>(v.size());
    if (accept) {
      for (int32_t id : v.eos_ids()) m->set(id);
    }
    mask_ = std::move(m);
    return *mask_;
  }
  key_.clear();
  for (const Frame& f : cur) {
    key_.push_back(f.rule);
    key_.push_back(f.node);
    key_.push_back(f.parent);
  }
  key_.push_back(accept ? 1 : 0);
  GrammarMaskCache& cache = g_->masks();
  std::shared_ptr<const TokenBitset> m = cache.find_state(key_);
  if (!m) {
    auto built = std::make_shared<TokenBitset>(v.size());
    // Copy the positions: walks below reuse the scratch buffers.
    std::vector<Frame> positions(cur.begin(), cur.end());
    for (const Frame& f : positions) local(f).add_to(*built);
    for (const Frame& f : positions) {
      if (f.parent < 0) continue;  // the root rule ending leaves nothing to consume the rest
      const GrammarMaskCache::Local& loc = local(f);
      if (loc.pops.empty()) continue;
      std::vector<Frame> resume;
      MatchFlags flags;
      stepper_.begin();
      stepper_.closure(g_->frame(f.parent), resume, flags);
      if (resume.empty()) continue;
      std::sort(resume.begin(), resume.end());
      for (int32_t node : loc.pops)
        walk(node + 1, v.subtree_end(node), v.node_depth(node), resume, *built, nullptr);
    }
    if (accept)
      for (int32_t id : v.eos_ids()) built->set(id);
    uncached_.clear();
    m = built;
    cache.store_state(key_, m);
  }
  mask_ = std::move(m);
  return *mask_;
}

}  // namespace deltaserve
