// TokenConstraints through the real Engine on tiny-coder (CPU): every sampled token (plain
// samples, verification rows, MTP drafts) is masked; greedy output under a grammar is the same
// with speculative decoding as without (drafts are checked against the grammar and rolled back);
// sampled JSON at temperature 1 is valid; logit_bias and min_tokens act on the same path.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/engine.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "server/grammar_service.h"
#include "server/request_constraint.h"
#include "tokenizer/tokenizer.h"
#include "../model/fixture.h"

namespace deltaserve::test {
namespace {

constexpr int32_t kEndOfText = 8183, kImEnd = 8185;

std::unique_ptr<Engine> make_engine(int spec_steps, std::vector<int32_t> token_map = {}) {
  EngineConfig c;
  c.spec_token_map = std::move(token_map);
  c.model_dir = source_dir() / "models/tiny-coder";
  c.n_threads = 2;
  c.spec_num_steps = spec_steps;
  c.max_running_requests = 8;
  c.max_waiting_requests = 64;
  c.context_length = 512;
  c.kv_tokens = 512 * 8;
  c.kv_block_size = 16;
  c.chunked_prefill_size = 64;
  c.max_prefill_tokens = 128;
  c.extra_eos_token_ids = {kEndOfText, kImEnd};
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  (*e)->start();
  return std::move(*e);
}

const Tokenizer& tokenizer() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::load(source_dir() / "models/tiny-coder");
    EXPECT_TRUE(r.is_ok());
    return new Tokenizer(*r);
  }();
  return *t;
}

GrammarService& grammars() {
  static GrammarService* g = new GrammarService(tokenizer(), {kEndOfText, kImEnd});
  return *g;
}

// Forwards to a RequestConstraint and counts what the engine does with it.
class Counting final : public TokenConstraint {
 public:
  explicit Counting(std::shared_ptr<TokenConstraint> inner) : inner_(std::move(inner)) {}
  bool active(int n) const override { return inner_->active(n); }
  void apply(float* l, int64_t v, int n) override {
    ++applied;
    inner_->apply(l, v, n);
  }
  bool accept(int32_t t) override {
    ++accepted;
    const bool ok = inner_->accept(t);
    if (!ok) ++refused;
    return ok;
  }
  void rollback(int n) override {
    rolled_back += n;
    inner_->rollback(n);
  }
  int exhausted_at() const override { return inner_->exhausted_at(); }
  std::atomic<int> applied{0}, accepted{0}, refused{0}, rolled_back{0};

 private:
  std::shared_ptr<TokenConstraint> inner_;
};

struct Generation {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  std::shared_ptr<Counting> counts;
};

Generation generate(Engine& e, const std::string& prompt, std::shared_ptr<const ConstraintPlan> plan, int max_tokens,
             float temperature, uint64_t seed, std::vector<int32_t> stop_token_ids = {}) {
  GenerateRequest r;
  r.id = e.next_request_id();
  r.prompt = tokenizer().encode(prompt, true);
  r.sampling.temperature = temperature;
  r.sampling.max_tokens = max_tokens;
  r.sampling.seed = seed;
  r.sampling.stop_token_ids = std::move(stop_token_ids);
  Generation out;
  out.counts = std::make_shared<Counting>(make_constraint(plan));
  r.constraint = out.counts;
  auto stream = e.submit(std::move(r));
  while (auto ev = stream->events.pop()) {
    out.tokens.insert(out.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      out.finish = ev->finish;
      break;
    }
  }
  return out;
}

std::shared_ptr<ConstraintPlan> grammar_plan(ConstraintSpec spec) {
  auto g = grammars().compile(spec);
  EXPECT_TRUE(g.is_ok()) << g.status().message();
  auto plan = std::make_shared<ConstraintPlan>();
  plan->grammar = *g;
  plan->end_ids = {kEndOfText, kImEnd};
  return plan;
}

// The text (EOS excluded) and whether the grammar matches it completely.
std::pair<std::string, bool> check(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<int32_t>& tokens) {
  GrammarMatcher m(g);
  std::vector<int32_t> text_ids;
  bool ok = true;
  for (int32_t t : tokens) {
    ok = ok && m.accept_token(t);
    if (t != kEndOfText && t != kImEnd) text_ids.push_back(t);
  }
  return {tokenizer().decode(text_ids, false), ok && (m.is_terminated() || m.can_end())};
}

// Found by review (stop 55). A recursive grammar's interned stack frames are never freed, and a
// cached one long in use aborted the server when its arena filled (64M frames). Past
// GrammarService::kRetireFrames the next request gets a fresh compile; the old grammar keeps
// working for those still using it.
TEST(EngineConstraint, AGrammarWithManyFramesIsCompiledAfresh) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Ebnf;
  spec.param = "ebnf";
  spec.text = R"(root ::= "a" root "x" | "b" root "y" | "c")";
  auto first = grammars().compile(spec);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  const std::shared_ptr<const CompiledGrammar> g = *first;
  GrammarStepper stepper(*g);
  std::vector<Frame> cur, next;
  MatchFlags flags;
  stepper.initial(cur, flags);
  std::mt19937 rng(1);
  // Every new nesting (a random path of a/b) is a stack shape not seen before: a new frame.
  for (int i = 0; g->n_frames() <= GrammarService::kRetireFrames; ++i) {
    ASSERT_LT(i, 4 * GrammarService::kRetireFrames);
    stepper.step(cur, rng() % 2 ? 'a' : 'b', next, flags);
    ASSERT_FALSE(next.empty());
    cur.swap(next);
  }
  auto again = grammars().compile(spec);
  ASSERT_TRUE(again.is_ok());
  EXPECT_NE(again->get(), g.get());
  EXPECT_LT((*again)->n_frames(), 100);
  stepper.step(cur, 'c', next, flags);
  EXPECT_FALSE(next.empty());
}

TEST(EngineConstraint, GreedyRegexIsTheSameWithAndWithoutMtp) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Regex;
  spec.text = "    (return|if) [a-z0-9 +*/()<>=:-]{1,40}\n";
  auto plan = grammar_plan(spec);
  auto plain = make_engine(0);
  Generation a = generate(*plain, "def fibonacci(n):\n", plan, 60, 0.0f, 1);
  plain->stop();
  auto spec_engine = make_engine(3);
  Generation b = generate(*spec_engine, "def fibonacci(n):\n", plan, 60, 0.0f, 1);
  spec_engine->stop();
  EXPECT_EQ(a.tokens, b.tokens);
  auto [text, ok] = check(plan->grammar, a.tokens);
  EXPECT_TRUE(ok) << text;
  EXPECT_EQ(a.finish, FinishReason::Stop) << text;
  EXPECT_EQ(a.counts->refused.load(), 0);
  EXPECT_EQ(b.counts->refused.load(), 0);
  EXPECT_GT(b.counts->rolled_back.load(), 0);  // drafts were proposed under the grammar, then undone
}

// A token map (--speculative-token-map) that holds none of the tokens the grammar allows: every
// constrained draft row is -inf throughout, so no draft is proposed (rather than an arbitrary
// token the grammar refuses), greedy and sampled; the output is plain decoding's.
TEST(EngineConstraint, NoDraftWhenTheTokenMapHoldsNoTokenTheGrammarAllows) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Regex;
  spec.text = "    (return|if) [a-z0-9 +*/()<>=:-]{1,40}\n";
  auto plan = grammar_plan(spec);
  const std::vector<int32_t> map = {kImEnd};  // the grammar allows the end only after the newline
  auto plain = make_engine(0);
  Generation a = generate(*plain, "def fibonacci(n):\n", plan, 60, 0.0f, 1);
  plain->stop();
  auto mapped = make_engine(3, map);
  Generation b = generate(*mapped, "def fibonacci(n):\n", plan, 60, 0.0f, 1);
  Generation b_sampled = generate(*mapped, "def fibonacci(n):\n", plan, 60, 1.0f, 5);
  mapped->stop();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.counts->refused.load(), 0);
  EXPECT_EQ(b_sampled.counts->refused.load(), 0);
  auto [text, ok] = check(plan->grammar, b_sampled.tokens);
  EXPECT_TRUE(ok) << text;
  EXPECT_EQ(b_sampled.finish, FinishReason::Stop) << text;
}

TEST(EngineConstraint, SampledJsonIsValidWithMtp) {
  const char* schema =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":8},"n":{"type":"integer","minimum":0,"maximum":99},"ok":{"type":"boolean"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3}},"required":["name","n","ok","tags"]})";
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonSchema;
  spec.json = nlohmann::ordered_json::parse(schema);
  auto plan = grammar_plan(spec);
  for (int k : {0, 3}) {
    auto e = make_engine(k);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      Generation r = generate(*e, "data = ", plan, 200, 1.0f, seed);
      auto [text, ok] = check(plan->grammar, r.tokens);
      EXPECT_EQ(r.finish, FinishReason::Stop) << "k " << k << " seed " << seed << ": " << text;
      EXPECT_TRUE(ok) << "k " << k << " seed " << seed << ": " << text;
      EXPECT_EQ(r.counts->refused.load(), 0);
      EXPECT_GT(r.counts->applied.load(), 0);
    }
    e->stop();
  }
}

TEST(EngineConstraint, LogitBiasAndMinTokens) {
  const int32_t x = tokenizer().encode("x", false).front();
  auto plan = std::make_shared<ConstraintPlan>();
  plan->logit_bias = {{x, 100.0f}};
  for (int k : {0, 2}) {
    auto e = make_engine(k);
    Generation r = generate(*e, "def f():\n", plan, 12, 1.0f, 5);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(12, x)) << "k " << k;
    e->stop();
  }
  // min_tokens: the end tokens are masked, so a prompt that ends the reply at once runs longer.
  auto e = make_engine(0);
  auto no_plan = std::make_shared<ConstraintPlan>();
  no_plan->logit_bias = {{kImEnd, 100.0f}};
  no_plan->end_ids = {kEndOfText, kImEnd};
  Generation quick = generate(*e, "x", no_plan, 20, 0.0f, 1);
  EXPECT_EQ(quick.tokens.size(), 1u);
  auto min_plan = std::make_shared<ConstraintPlan>(*no_plan);
  min_plan->min_tokens = 5;
  Generation longer = generate(*e, "x", min_plan, 20, 0.0f, 1);
  ASSERT_EQ(longer.tokens.size(), 6u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(longer.tokens[i], kImEnd);
  EXPECT_EQ(longer.tokens[5], kImEnd);
  e->stop();
}

}  // namespace
}  // namespace deltaserve::test

namespace deltaserve::test {
namespace {

// Rules that exclude each other leave no token: the row allows only the first end id, the
// constraint reports where (undone with the token), and the engine ends the request there with an
// error, without that token, with and without MTP drafts.
TEST(EngineConstraint, RulesThatLeaveNoTokenEndTheRequestWithAnError) {
  const int32_t a = tokenizer().encode("a", false).front();
  const int64_t V = static_cast<int64_t>(tokenizer().vocab_size());
  auto conflict = std::make_shared<ConstraintPlan>();
  conflict->allowed_ids = {a};
  conflict->bad_words = {{a}};
  conflict->end_ids = {kEndOfText, kImEnd};
  auto c = make_constraint(conflict);
  std::vector<float> row(V, 1.0f);
  c->apply(row.data(), V, 0);
  for (int64_t i = 0; i < V; ++i) ASSERT_EQ(row[i] > -INFINITY, i == kEndOfText) << i;
  EXPECT_EQ(c->exhausted_at(), -1);
  ASSERT_TRUE(c->accept(kEndOfText));
  EXPECT_EQ(c->exhausted_at(), 0);
  c->rollback(1);
  EXPECT_EQ(c->exhausted_at(), -1);

  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Regex;
  spec.text = "a{2}";
  auto plan = grammar_plan(spec);
  plan->allowed_ids = {a};  // after "aa" only an end fits the grammar, and no end id is allowed
  for (int k : {0, 2}) {
    auto e = make_engine(k);
    Generation r = generate(*e, "def f(", plan, 8, 0.0f, 1);
    EXPECT_EQ(r.finish, FinishReason::Error) << "k " << k;
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{a, a})) << "k " << k;
    e->stop();
  }
}

// The fused masked copy (what the sampler calls) gives exactly what copying then apply() gives,
// along a sequence of accepted tokens, with a bias, a bad word and min_tokens on top of the grammar.
TEST(EngineConstraint, FusedApplyFromEqualsCopyThenApply) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::Regex;
  spec.text = "(def|class) [a-z_]+\\(\\)";
  auto plan = grammar_plan(spec);
  plan->logit_bias = {{10, 2.5f}, {11, -7.0f}};
  plan->bad_words = {{40, 41}};
  plan->min_tokens = 3;
  const int64_t V = static_cast<int64_t>(tokenizer().vocab_size());
  auto a = make_constraint(plan), b = make_constraint(plan);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> src(V), d1(V), d2(V);
  for (int n = 0; n < 12; ++n) {
    if (!a->active(n)) break;
    for (auto& x : src) x = nd(rng);
    a->apply_from(src.data(), d1.data(), V, n);
    d2 = src;
    b->apply(d2.data(), V, n);
    ASSERT_EQ(std::memcmp(d1.data(), d2.data(), V * sizeof(float)), 0) << "step " << n;
    const int32_t tok = static_cast<int32_t>(std::max_element(d1.begin(), d1.end()) - d1.begin());
    ASSERT_GT(d1[tok], -INFINITY);
    ASSERT_TRUE(a->accept(tok));
    ASSERT_TRUE(b->accept(tok));
  }
}

}  // namespace
}  // namespace deltaserve::test

namespace deltaserve::test {
namespace {

// Found by review (stop 56). A stop id the grammar also allows as text (':' under a JSON schema)
// stayed in the row but the constraint refused it unless the match was complete, so an MTP draft
// of it left the grammar a token behind: the rollback then unwound an accepted token, and the
// output broke the grammar (and differed from plain decoding). Now the stop id is fed as text.
TEST(EngineConstraint, AStopIdTheGrammarAllowsAsTextKeepsMtpExact) {
  const int32_t colon = tokenizer().encode(":", false).front();
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonObject;
  auto plan = grammar_plan(spec);
  plan->end_ids.push_back(colon);
  auto plain = make_engine(0);
  Generation a = generate(*plain, "Return JSON:\n", plan, 60, 0.0f, 1, {colon});
  plain->stop();
  auto spec_engine = make_engine(3);
  Generation b = generate(*spec_engine, "Return JSON:\n", plan, 60, 0.0f, 1, {colon});
  spec_engine->stop();
  EXPECT_EQ(a.tokens, b.tokens) << tokenizer().decode(a.tokens, false) << " | " << tokenizer().decode(b.tokens, false);
  EXPECT_EQ(a.counts->refused.load(), 0);
  EXPECT_EQ(b.counts->refused.load(), 0);
  // The colon is fed as text: the grammar reads everything drawn, up to and with the stop id.
  GrammarMatcher m(plan->grammar);
  for (int32_t t : b.tokens) EXPECT_TRUE(m.accept_token(t)) << tokenizer().decode(b.tokens, false);
  // A stop id the grammar cannot read (an end id) still ends a complete match only.
  auto c = make_constraint(plan);
  EXPECT_FALSE(c->accept(kImEnd));
}

// Found by review (stop 56). A verification's bonus row past max_tokens (cut by the scheduler,
// never emitted) that the rules left empty ended the request with an error; plain decoding never
// samples that row and finished by length.
TEST(EngineConstraint, AnEmptyRowPastMaxTokensIsNotAnError) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::JsonSchema;
  spec.json = nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
  auto plan = grammar_plan(spec);
  const int32_t brace = tokenizer().encode("{", false).front(), quote = tokenizer().encode("\"", false).front();
  plan->allowed_ids = {brace, quote};  // `{"` then nothing the grammar allows: the third row is empty
  for (int k : {0, 3}) {
    auto e = make_engine(k);
    for (float temperature : {0.0f, 0.8f}) {
      Generation r = generate(*e, "def quicksort(xs):", plan, 2, temperature, 1);
      EXPECT_EQ(r.finish, FinishReason::Length) << "k " << k << " T " << temperature;
      EXPECT_EQ(r.tokens, (std::vector<int32_t>{brace, quote})) << "k " << k << " T " << temperature;
      Generation longer = generate(*e, "def quicksort(xs):", plan, 3, temperature, 1);
      EXPECT_EQ(longer.finish, FinishReason::Error) << "k " << k << " T " << temperature;
    }
    e->stop();
  }
}

}  // namespace
}  // namespace deltaserve::test
