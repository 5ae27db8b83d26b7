// Grammar -> per-rule DFAs: byte classes, Thompson NFAs (non-recursive rules inlined, recursive
// and shared rules as call edges), subset construction, then trimming (unproductive rules and
// nodes that cannot reach an end are removed, so every live position can still complete) and the
// left-recursion check.
#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <unordered_map>

#include "grammar/grammar_matcher.h"

namespace deltaserve {

namespace {

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull ^ v.size();
    for (int32_t x : v) {
      h ^= static_cast<uint32_t>(x);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

struct BitsetHash {
  size_t operator()(const std::bitset<256>& b) const { return std::hash<std::bitset<256>>()(b); }
};

// Aho-Corasick automaton over bytes: the strings containing none of the patterns.
struct ExcludeAutomaton {
  std::vector<std::array<int32_t, 256>> go;
  std::vector<uint8_t> dead;

  explicit ExcludeAutomaton(const std::vector<std::string>& patterns) {
    std::vector<std::array<int32_t, 256>> child(1);
    child[0].fill(-1);
    dead.assign(1, 0);
    for (const auto& p : patterns) {
      int32_t q = 0;
      for (unsigned char c : p) {
        if (child[static_cast<size_t>(q)][c] < 0) {
          child[static_cast<size_t>(q)][c] = static_cast<int32_t>(child.size());
          child.emplace_back();
          child.back().fill(-1);
          dead.push_back(0);
        }
        q = child[static_cast<size_t>(q)][c];
      }
      dead[static_cast<size_t>(q)] = 1;
    }
    go = child;
    std::vector<int32_t> fail(child.size(), 0);
    std::deque<int32_t> queue;
    for (int b = 0; b < 256; ++b) {
      int32_t c = child[0][static_cast<size_t>(b)];
      if (c < 0) {
        go[0][static_cast<size_t>(b)] = 0;
      } else {
        fail[static_cast<size_t>(c)] = 0;
        queue.push_back(c);
      }
    }
    while (!queue.empty()) {
      int32_t q = queue.front();
      queue.pop_front();
      dead[static_cast<size_t>(q)] |= dead[static_cast<size_t>(fail[static_cast<size_t>(q)])];
      for (int b = 0; b < 256; ++b) {
        int32_t c = child[static_cast<size_t>(q)][static_cast<size_t>(b)];
        if (c < 0) {
          go[static_cast<size_t>(q)][static_cast<size_t>(b)] = go[static_cast<size_t>(fail[static_cast<size_t>(q)])][static_cast<size_t>(b)];
        } else {
          fail[static_cast<size_t>(c)] = go[static_cast<size_t>(fail[static_cast<size_t>(q)])][static_cast<size_t>(b)];
          queue.push_back(c);
        }
      }
    }
  }
};

}  // namespace

class GrammarCompiler {
 public:
  GrammarCompiler(const Grammar& g, const GrammarLimits& limits) : g_(g), limits_(limits) {}

  Status run(CompiledGrammar& out) {
    const int n = g_.n_rules();
    if (g_.root < 0 || g_.root >= n) return error("grammar has no root rule");
    DS_RETURN_IF_ERROR(check_refs());
    find_recursive();
    compute_classes();
    out.classes_ = classes_;
    out.n_classes_ = n_classes_;

    called_index_.assign(static_cast<size_t>(n), -1);
    add_called(g_.root);
    for (size_t k = 0; k < called_.size(); ++k) {
      RuleAutomaton a;
      DS_RETURN_IF_ERROR(build_rule(called_[k], a));
      out.rules_.push_back(std::move(a));
    }
    out.root_ = 0;
    DS_RETURN_IF_ERROR(trim(out));
    DS_RETURN_IF_ERROR(check_left_recursion(out));
    int32_t offset = 0;
    for (auto& r : out.rules_) {
      r.node_offset = offset;
      offset += r.n_nodes;
    }
    out.n_nodes_total_ = offset;
    return Status::ok();
  }

 private:
  const Grammar& g_;
  GrammarLimits limits_;
  std::vector<uint8_t> recursive_;
  std::vector<int32_t> called_index_;  // grammar rule -> compiled rule
  std::vector<int32_t> called_;        // compiled rule -> grammar rule
  std::array<uint8_t, 256> classes_{};
  int n_classes_ = 1;
  std::array<uint8_t, 256> class_rep_{};  // one byte of each class
  int64_t nfa_total_ = 0;
  int64_t dfa_total_ = 0;
  int64_t subset_steps_ = 0;  // GrammarLimits::max_subset_steps

  // --- analysis ---

  template <typename Fn>
  static void for_each_ref(const Expr& e, Fn&& fn) {
    if (e.kind == Expr::Kind::Ref) fn(e.rule);
    for (const auto& it : e.items) for_each_ref(it, fn);
  }
  template <typename Fn>
  static void for_each_expr(const Expr& e, Fn&& fn) {
    fn(e);
    for (const auto& it : e.items) for_each_expr(it, fn);
  }

  Status check_refs() {
    for (int r = 0; r < g_.n_rules(); ++r) {
      std::string bad;
      for_each_ref(g_.rule(r).body, [&](int ref) {
        if ((ref < 0 || ref >= g_.n_rules()) && bad.empty()) bad = std::to_string(ref);
      });
      if (!bad.empty()) return error("rule '", g_.rule(r).name, "' refers to undefined rule #", bad);
    }
    return Status::ok();
  }

  void find_recursive() {
    const int n = g_.n_rules();
    std::vector<std::vector<int>> refs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for_each_ref(g_.rule(r).body, [&](int ref) { refs[static_cast<size_t>(r)].push_back(ref); });
      auto& v = refs[static_cast<size_t>(r)];
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
    recursive_.assign(static_cast<size_t>(n), 0);
    std::vector<uint8_t> seen(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      std::fill(seen.begin(), seen.end(), 0);
      std::vector<int> stack(refs[static_cast<size_t>(r)].begin(), refs[static_cast<size_t>(r)].end());
      while (!stack.empty()) {
        int x = stack.back();
        stack.pop_back();
        if (x == r) {
          recursive_[static_cast<size_t>(r)] = 1;
          break;
        }
        if (seen[static_cast<size_t>(x)]) continue;
        seen[static_cast<size_t>(x)] = 1;
        for (int y : refs[static_cast<size_t>(x)]) stack.push_back(y);
      }
    }
  }

  void compute_classes() {
    std::unordered_map<std::bitset<256>, int, BitsetHash> sets;
    for (int r = 0; r < g_.n_rules(); ++r) {
      for_each_expr(g_.rule(r).body, [&](const Expr& e) {
        if (e.kind == Expr::Kind::Bytes) sets.emplace(e.bytes, 0);
        if (e.kind == Expr::Kind::Exclude) {
          for (const auto& p : e.excluded)
            for (unsigned char c : p) {
              std::bitset<256> one;
              one.set(c);
              sets.emplace(one, 0);
            }
        }
      });
    }
    classes_.fill(0);
    int n = 1;
    for (const auto& [set, unused] : sets) {
      std::array<int, 512> remap;
      remap.fill(-1);
      int next = 0;
      for (int b = 0; b < 256; ++b) {
        int key = classes_[static_cast<size_t>(b)] * 2 + (set.test(static_cast<size_t>(b)) ? 1 : 0);
        if (remap[static_cast<size_t>(key)] < 0) remap[static_cast<size_t>(key)] = next++;
        classes_[static_cast<size_t>(b)] = static_cast<uint8_t>(remap[static_cast<size_t>(key)]);
      }
      n = next;
    }
    n_classes_ = n;
    for (int b = 255; b >= 0; --b) class_rep_[classes_[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
  }

  std::bitset<256> class_set(const std::bitset<256>& bytes) const {
    std::bitset<256> cs;
    for (int c = 0; c < n_classes_; ++c)
      if (bytes.test(class_rep_[static_cast<size_t>(c)])) cs.set(static_cast<size_t>(c));
    return cs;
  }

  int32_t add_called(int rule) {
    if (called_index_[static_cast<size_t>(rule)] < 0) {
      called_index_[static_cast<size_t>(rule)] = static_cast<int32_t>(called_.size());
      called_.push_back(rule);
    }
    return called_index_[static_cast<size_t>(rule)];
  }

  // --- NFA ---

  struct Nfa {
    std::vector<std::vector<int32_t>> eps;
    std::vector<std::vector<std::pair<int32_t, int32_t>>> bytes;  // (class-set id, target)
    std::vector<std::vector<std::pair<int32_t, int32_t>>> calls;  // (compiled rule, target)
    std::vector<std::bitset<256>> sets;
    std::unordered_map<std::bitset<256>, int32_t, BitsetHash> set_ids;
    int32_t add() {
      eps.emplace_back();
      bytes.emplace_back();
      calls.emplace_back();
      return static_cast<int32_t>(eps.size()) - 1;
    }
    int32_t set_id(const std::bitset<256>& cs) {
      auto [it, inserted] = set_ids.emplace(cs, static_cast<int32_t>(sets.size()));
      if (inserted) sets.push_back(cs);
      return it->second;
    }
  };

  Status too_big(int rule) const {
    return error("grammar too large: rule '", g_.rule(rule).name, "' expands to more than ",
                 limits_.max_nfa_states, " automaton states (large repetition counts or deep nesting)");
  }

  // Adds the automaton of `e` starting at `from`; returns its end state. Loops only ever go back
  // to states created here, so `from` may have other outgoing edges.
  Result<int32_t> build(Nfa& nfa, const Expr& e, int32_t from, int rule, int depth) {
    if (static_cast<int64_t>(nfa.eps.size()) + nfa_total_ > limits_.max_nfa_states) return too_big(rule);
    if (depth > 2000) return error("grammar nesting too deep in rule '", g_.rule(rule).name, "'");
    switch (e.kind) {
      case Expr::Kind::Empty: return from;
      case Expr::Kind::Bytes: {
        int32_t s = nfa.add();
        nfa.bytes[static_cast<size_t>(from)].push_back({nfa.set_id(class_set(e.bytes)), s});
        return s;
      }
      case Expr::Kind::Seq: {
        int32_t cur = from;
        for (const auto& it : e.items) {
          auto r = build(nfa, it, cur, rule, depth + 1);
          if (!r) return r;
          cur = *r;
        }
        return cur;
      }
      case Expr::Kind::Alt: {
        int32_t end = nfa.add();
        for (const auto& it : e.items) {
          int32_t s = nfa.add();
          nfa.eps[static_cast<size_t>(from)].push_back(s);
          auto r = build(nfa, it, s, rule, depth + 1);
          if (!r) return r;
          nfa.eps[static_cast<size_t>(*r)].push_back(end);
        }
        return end;
      }
      case Expr::Kind::Repeat: {
        int32_t cur = from;
        for (int i = 0; i < e.min; ++i) {
          int32_t s = nfa.add();
          nfa.eps[static_cast<size_t>(cur)].push_back(s);
          auto r = build(nfa, e.items[0], s, rule, depth + 1);
          if (!r) return r;
          cur = *r;
        }
        if (e.max < 0) {
          int32_t hub = nfa.add();
          nfa.eps[static_cast<size_t>(cur)].push_back(hub);
          int32_t s = nfa.add();
          nfa.eps[static_cast<size_t>(hub)].push_back(s);
          auto r = build(nfa, e.items[0], s, rule, depth + 1);
          if (!r) return r;
          nfa.eps[static_cast<size_t>(*r)].push_back(hub);
          return hub;
        }
        int32_t end = nfa.add();
        for (int i = e.min; i < e.max; ++i) {
          nfa.eps[static_cast<size_t>(cur)].push_back(end);
          int32_t s = nfa.add();
          nfa.eps[static_cast<size_t>(cur)].push_back(s);
          auto r = build(nfa, e.items[0], s, rule, depth + 1);
          if (!r) return r;
          cur = *r;
        }
        nfa.eps[static_cast<size_t>(cur)].push_back(end);
        return end;
      }
      case Expr::Kind::Ref: {
        const int ref = e.rule;
        if (recursive_[static_cast<size_t>(ref)] || g_.rule(ref).shared) {
          int32_t callee = add_called(ref);
          int32_t s = nfa.add();
          nfa.calls[static_cast<size_t>(from)].push_back({callee, s});
          return s;
        }
        int32_t s = nfa.add();
        nfa.eps[static_cast<size_t>(from)].push_back(s);
        return build(nfa, g_.rule(ref).body, s, ref, depth + 1);
      }
      case Expr::Kind::Exclude: {
        ExcludeAutomaton ac(e.excluded);
        const size_t nq = ac.go.size();
        std::vector<int32_t> state(nq, -1);
        for (size_t q = 0; q < nq; ++q)
          if (!ac.dead[q]) state[q] = nfa.add();
        int32_t end = nfa.add();
        nfa.eps[static_cast<size_t>(from)].push_back(state[0]);
        for (size_t q = 0; q < nq; ++q) {
          if (ac.dead[q]) continue;
          nfa.eps[static_cast<size_t>(state[q])].push_back(end);
          std::unordered_map<int32_t, std::bitset<256>> by_target;
          for (int c = 0; c < n_classes_; ++c) {
            int32_t t = ac.go[q][class_rep_[static_cast<size_t>(c)]];
            if (!ac.dead[static_cast<size_t>(t)]) by_target[t].set(static_cast<size_t>(c));
          }
          for (const auto& [t, cs] : by_target)
            nfa.bytes[static_cast<size_t>(state[q])].push_back({nfa.set_id(cs), state[static_cast<size_t>(t)]});
        }
        return end;
      }
    }
    return from;
  }

  // Subset construction for one rule.
  Status build_rule(int grammar_rule, RuleAutomaton& out) {
    Nfa nfa;
    int32_t start = nfa.add();
    auto end = build(nfa, g_.rule(grammar_rule).body, start, grammar_rule, 0);
    if (!end) return end.status();
    nfa_total_ += static_cast<int64_t>(nfa.eps.size());
    const int32_t accept = *end;
    const size_t n_states = nfa.eps.size();

    std::vector<uint32_t> mark(n_states, 0);
    uint32_t epoch = 0;
    std::vector<int32_t> stack;
    auto closure = [&](std::vector<int32_t>& set) {
      ++epoch;
      stack.assign(set.begin(), set.end());
      set.clear();
      while (!stack.empty()) {
        int32_t s = stack.back();
        stack.pop_back();
        if (mark[static_cast<size_t>(s)] == epoch) continue;
        mark[static_cast<size_t>(s)] = epoch;
        ++subset_steps_;
        // Keep only states with edges (or the accept state): smaller sets, same automaton.
        if (!nfa.bytes[static_cast<size_t>(s)].empty() || !nfa.calls[static_cast<size_t>(s)].empty() || s == accept)
          set.push_back(s);
        for (int32_t t : nfa.eps[static_cast<size_t>(s)]) stack.push_back(t);
      }
      std::sort(set.begin(), set.end());
    };

    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
    std::vector<std::vector<int32_t>> nodes;
    out.name = g_.rule(grammar_rule).name;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      int32_t id = static_cast<int32_t>(nodes.size());
      ids.emplace(set, id);
      nodes.push_back(std::move(set));
      return id;
    };
    std::vector<int32_t> first = {start};
    closure(first);
    out.start = intern(std::move(first));

    const size_t nc = static_cast<size_t>(n_classes_);
    std::vector<std::vector<int32_t>> bucket(nc);
    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> pre_ids;  // targets before closure -> node
    for (size_t d = 0; d < nodes.size(); ++d) {
      if (dfa_total_ + static_cast<int64_t>(nodes.size()) > limits_.max_dfa_nodes)
        return error("grammar too large: rule '", out.name, "' needs more than ", limits_.max_dfa_nodes,
                     " automaton nodes");
      subset_steps_ += static_cast<int64_t>(nodes[d].size());
      if (subset_steps_ > limits_.max_subset_steps)
        return error("grammar too complex: rule '", out.name, "' needs more than ", limits_.max_subset_steps,
                     " steps to compile (nested repetition counts multiply)");
      out.next.resize((d + 1) * nc, -1);
      out.final.push_back(0);
      out.has_bytes.push_back(0);
      out.call_begin.push_back(static_cast<int32_t>(out.calls.size()));
      std::vector<std::pair<int32_t, int32_t>> calls;
      for (auto& b : bucket) b.clear();
      for (int32_t s : nodes[d]) {
        if (s == accept) out.final[d] = 1;
        for (const auto& [set, t] : nfa.bytes[static_cast<size_t>(s)]) {
          const auto& cs = nfa.sets[static_cast<size_t>(set)];
          for (size_t c = 0; c < nc; ++c)
            if (cs.test(c)) bucket[c].push_back(t);
        }
        for (const auto& call : nfa.calls[static_cast<size_t>(s)]) calls.push_back(call);
      }
      for (size_t c = 0; c < nc; ++c) {
        auto& b = bucket[c];
        if (b.empty()) continue;
        std::sort(b.begin(), b.end());
        b.erase(std::unique(b.begin(), b.end()), b.end());
        auto it = pre_ids.find(b);
        int32_t target;
        if (it != pre_ids.end()) {
          target = it->second;
        } else {
          std::vector<int32_t> set = b;
          closure(set);
          target = intern(std::move(set));
          pre_ids.emplace(b, target);
        }
        out.next[d * nc + c] = target;
        out.has_bytes[d] = 1;
      }
      // Calls: one edge per callee, the continuation being the union of the NFA targets.
      std::sort(calls.begin(), calls.end());
      for (size_t i = 0; i < calls.size();) {
        size_t j = i;
        std::vector<int32_t> set;
        while (j < calls.size() && calls[j].first == calls[i].first) set.push_back(calls[j++].second);
        closure(set);
        int32_t target = intern(std::move(set));
        out.calls.push_back({calls[i].first, target});
        i = j;
      }
    }
    out.call_begin.push_back(static_cast<int32_t>(out.calls.size()));
    out.n_nodes = static_cast<int32_t>(nodes.size());
    dfa_total_ += out.n_nodes;
    return Status::ok();
  }

  // --- trimming and checks ---

  Status trim(CompiledGrammar& g) {
    const size_t nr = g.rules_.size();
    const size_t nc = static_cast<size_t>(n_classes_);
    // Productive rules: some path from start to an end, through productive callees only.
    std::vector<uint8_t> productive(nr, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < nr; ++r) {
        if (productive[r]) continue;
        const RuleAutomaton& a = g.rules_[r];
        std::vector<uint8_t> seen(static_cast<size_t>(a.n_nodes), 0);
        std::vector<int32_t> stack = {a.start};
        seen[static_cast<size_t>(a.start)] = 1;
        bool ok = false;
        while (!stack.empty() && !ok) {
          int32_t n = stack.back();
          stack.pop_back();
          if (a.final[static_cast<size_t>(n)]) ok = true;
          auto visit = [&](int32_t t) {
            if (t >= 0 && !seen[static_cast<size_t>(t)]) {
              seen[static_cast<size_t>(t)] = 1;
              stack.push_back(t);
            }
          };
          for (size_t c = 0; c < nc; ++c) visit(a.next[static_cast<size_t>(n) * nc + c]);
          for (int32_t k = a.call_begin[static_cast<size_t>(n)]; k < a.call_begin[static_cast<size_t>(n) + 1]; ++k)
            if (productive[static_cast<size_t>(a.calls[static_cast<size_t>(k)].first)]) visit(a.calls[static_cast<size_t>(k)].second);
        }
        if (ok) {
          productive[r] = 1;
          changed = true;
        }
      }
    }
    if (!productive[0]) return error("the grammar matches no string at all (rule '", g.rules_[0].name, "')");
    // Per rule: drop calls to unproductive rules and edges into nodes that cannot reach an end.
    for (size_t r = 0; r < nr; ++r) {
      RuleAutomaton& a = g.rules_[r];
      const size_t nn = static_cast<size_t>(a.n_nodes);
      std::vector<std::vector<int32_t>> rev(nn);
      for (size_t n = 0; n < nn; ++n) {
        for (size_t c = 0; c < nc; ++c) {
          int32_t t = a.next[n * nc + c];
          if (t >= 0) rev[static_cast<size_t>(t)].push_back(static_cast<int32_t>(n));
        }
        for (int32_t k = a.call_begin[n]; k < a.call_begin[n + 1]; ++k)
          if (productive[static_cast<size_t>(a.calls[static_cast<size_t>(k)].first)])
            rev[static_cast<size_t>(a.calls[static_cast<size_t>(k)].second)].push_back(static_cast<int32_t>(n));
      }
      std::vector<uint8_t> live(nn, 0);
      std::vector<int32_t> stack;
      for (size_t n = 0; n < nn; ++n)
        if (a.final[n]) {
          live[n] = 1;
          stack.push_back(static_cast<int32_t>(n));
        }
      while (!stack.empty()) {
        int32_t n = stack.back();
        stack.pop_back();
        for (int32_t p : rev[static_cast<size_t>(n)])
          if (!live[static_cast<size_t>(p)]) {
            live[static_cast<size_t>(p)] = 1;
            stack.push_back(p);
          }
      }
      std::vector<std::pair<int32_t, int32_t>> calls;
      std::vector<int32_t> begin;
      for (size_t n = 0; n < nn; ++n) {
        begin.push_back(static_cast<int32_t>(calls.size()));
        a.has_bytes[n] = 0;
        for (size_t c = 0; c < nc; ++c) {
          int32_t& t = a.next[n * nc + c];
          if (t >= 0 && !live[static_cast<size_t>(t)]) t = -1;
          if (t >= 0) a.has_bytes[n] = 1;
        }
        for (int32_t k = a.call_begin[n]; k < a.call_begin[n + 1]; ++k) {
          const auto& call = a.calls[static_cast<size_t>(k)];
          if (productive[static_cast<size_t>(call.first)] && live[static_cast<size_t>(call.second)]) calls.push_back(call);
        }
      }
      begin.push_back(static_cast<int32_t>(calls.size()));
      a.calls = std::move(calls);
      a.call_begin = std::move(begin);
    }
    return Status::ok();
  }

  Status check_left_recursion(const CompiledGrammar& g) {
    const size_t nr = g.rules_.size();
    // Nullable rules: an end is reachable from start through calls to nullable rules only.
    std::vector<uint8_t> nullable(nr, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < nr; ++r) {
        if (nullable[r]) continue;
        const RuleAutomaton& a = g.rules_[r];
        std::vector<uint8_t> seen(static_cast<size_t>(a.n_nodes), 0);
        std::vector<int32_t> stack = {a.start};
        bool ok = false;
        while (!stack.empty() && !ok) {
          int32_t n = stack.back();
          stack.pop_back();
          if (seen[static_cast<size_t>(n)]) continue;
          seen[static_cast<size_t>(n)] = 1;
          if (a.final[static_cast<size_t>(n)]) ok = true;
          for (int32_t k = a.call_begin[static_cast<size_t>(n)]; k < a.call_begin[static_cast<size_t>(n) + 1]; ++k)
            if (nullable[static_cast<size_t>(a.calls[static_cast<size_t>(k)].first)]) stack.push_back(a.calls[static_cast<size_t>(k)].second);
        }
        if (ok) {
          nullable[r] = 1;
          changed = true;
        }
      }
    }
    // From each rule's start, without consuming a byte: reaching a call to the rule itself loops.
    for (size_t r = 0; r < nr; ++r) {
      std::vector<std::vector<uint8_t>> seen(nr);
      std::vector<std::pair<int32_t, int32_t>> stack = {{static_cast<int32_t>(r), g.rules_[r].start}};
      while (!stack.empty()) {
        auto [x, n] = stack.back();
        stack.pop_back();
        auto& sx = seen[static_cast<size_t>(x)];
        if (sx.empty()) sx.assign(static_cast<size_t>(g.rules_[static_cast<size_t>(x)].n_nodes), 0);
        if (sx[static_cast<size_t>(n)]) continue;
        sx[static_cast<size_t>(n)] = 1;
        const RuleAutomaton& a = g.rules_[static_cast<size_t>(x)];
        for (int32_t k = a.call_begin[static_cast<size_t>(n)]; k < a.call_begin[static_cast<size_t>(n) + 1]; ++k) {
          auto [callee, cont] = a.calls[static_cast<size_t>(k)];
          if (callee == static_cast<int32_t>(r))
            return error("rule '", g.rules_[r].name, "' is left-recursive (it can call itself before consuming any text); "
                         "rewrite it with repetition");
          stack.push_back({callee, g.rules_[static_cast<size_t>(callee)].start});
          if (nullable[static_cast<size_t>(callee)]) stack.push_back({x, cont});
        }
      }
    }
    return Status::ok();
  }
};

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(
    const Grammar& grammar, std::shared_ptr<const TokenVocabulary> vocab, const GrammarLimits& limits) {
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar());
  g->vocab_ = std::move(vocab);
  GrammarCompiler compiler(grammar, limits);
  DS_RETURN_IF_ERROR(compiler.run(*g));
  g->chunks_ = std::make_unique<std::unique_ptr<Frame[]>[]>(kMaxChunks);
  g->masks_ = std::make_unique<GrammarMaskCache>(*g, limits.max_local_mask_bytes);
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

CompiledGrammar::~CompiledGrammar() = default;

CompiledGrammarStats CompiledGrammar::stats() const {
  return CompiledGrammarStats{n_rules(), n_nodes_total_, n_classes_};
}

int32_t CompiledGrammar::intern(const Frame& f) const {
  std::lock_guard<std::mutex> lock(frames_mutex_);
  auto it = frame_ids_.find(f);
  if (it != frame_ids_.end()) return it->second;
  const int32_t id = n_frames_.load(std::memory_order_relaxed);
  const int32_t chunk = id >> kChunkBits;
  if (chunk >= kMaxChunks) return -1;  // full: the caller drops the call (compiled_grammar.h)
  if (!chunks_[static_cast<size_t>(chunk)]) chunks_[static_cast<size_t>(chunk)] = std::make_unique<Frame[]>(size_t{1} << kChunkBits);
  chunks_[static_cast<size_t>(chunk)][static_cast<size_t>(id & ((1 << kChunkBits) - 1))] = f;
  n_frames_.store(id + 1, std::memory_order_release);
  frame_ids_.emplace(f, id);
  return id;
}

Frame CompiledGrammar::frame(int32_t id) const {
  return chunks_[static_cast<size_t>(id >> kChunkBits)][static_cast<size_t>(id & ((1 << kChunkBits) - 1))];
}

}  // namespace deltaserve
