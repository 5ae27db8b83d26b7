// ChoiceState on crafted engine events (tiny-coder tokenizer): matched_stop (stop string, stop
// token id, null otherwise) and the per-request reasoning options include_reasoning /
// stream_reasoning.
#include <gtest/gtest.h>

#include <memory>

#include "server/choice_state.h"

namespace deltaserve {
namespace {

const std::string kModelDir = std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";
constexpr TokenId kImEnd = 8185;  // <|im_end|>, an EOS id of tiny-coder

class ChoiceStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::load(kModelDir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    tokenizer_ = std::make_unique<Tokenizer>(*tok);
  }

  std::vector<TokenId> ids(const std::string& text) const { return tokenizer_->encode(text, true); }

  // Feeds `tokens` one per event; the last event carries `finish`. Returns every delta.
  std::vector<ChoiceDelta> run(ChoiceState& state, const std::vector<TokenId>& tokens,
                               FinishReason finish) const {
    std::vector<ChoiceDelta> out;
    for (std::size_t k = 0; k < tokens.size() && !state.finished(); ++k) {
      TokenEvent ev;
      ev.tokens.push_back(tokens[k]);
      if (k + 1 == tokens.size()) ev.finish = finish;
      out.push_back(state.on_event(ev));
    }
    return out;
  }

  // Chat with the hermes tool parser and one tool, f.
  static ChoiceOptions chat_hermes_options() {
    ChoiceOptions t;
    t.chat = true;
    t.tool_parser = ToolParserKind::Hermes;
    t.tools = nlohmann::ordered_json::parse(
        R"([{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])");
    t.hidden_ids = {kImEnd};
    return t;
  }

  static ChoiceOptions chat_reasoning_options() {
    ChoiceOptions o;
    o.chat = true;
    o.reasoning = true;
    o.start_in_reasoning = true;
    o.hidden_ids = {8183, kImEnd};
    return o;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(ChoiceStateTest, MatchedStopIsTheStopString) {
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"zzz", "world"};
  ChoiceState s(*tokenizer_, o);
  auto deltas = run(s, ids("Hello world and more"), FinishReason::Length);
  ASSERT_TRUE(s.finished());
  EXPECT_TRUE(s.stop_matched());
  EXPECT_EQ(s.finish_reason(), "stop");
  EXPECT_EQ(s.text(), "Hello ");
  EXPECT_EQ(s.matched_stop(), "world");
  EXPECT_TRUE(s.matched_stop().is_string());
  // The finishing delta carries it too; earlier deltas do not.
  EXPECT_TRUE(deltas.back().finished);
  EXPECT_EQ(deltas.back().matched_stop, "world");
  for (std::size_t k = 0; k + 1 < deltas.size(); ++k) EXPECT_TRUE(deltas[k].matched_stop.is_null());
}

// Several tokens in one event (speculative decoding): a stop string that ends at one of them ends
// the choice there; the tokens after it are not counted or returned, as with one token an event.
TEST_F(ChoiceStateTest, StopStringInsideAMultiTokenEventCutsTheTokensAfterIt) {
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"world"};
  const std::vector<TokenId> tokens = ids("Hello world and more text");
  ChoiceState one(*tokenizer_, o), many(*tokenizer_, o);
  run(one, tokens, FinishReason::Length);
  ASSERT_TRUE(one.finished());
  ASSERT_LT(one.n_generated(), static_cast<int>(tokens.size()));
  TokenEvent ev;
  ev.tokens = tokens;
  for (TokenId t : tokens) ev.logprobs.push_back(TokenLogprob{t, -1.0f, {}});
  ev.finish = FinishReason::Length;
  ev.n_prompt_tokens = 7;
  ChoiceDelta d = many.on_event(ev);
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.finish_reason, "stop");
  EXPECT_EQ(d.text, "Hello ");
  EXPECT_EQ(many.n_generated(), one.n_generated());
  EXPECT_EQ(d.token_ids, std::vector<TokenId>(tokens.begin(), tokens.begin() + one.n_generated()));
  EXPECT_EQ(d.logprobs.size(), static_cast<size_t>(one.n_generated()));
  EXPECT_EQ(many.n_prompt(), 7);
}

TEST_F(ChoiceStateTest, MatchedStopIsTheEosTokenId) {
  ChoiceOptions o;
  o.chat = false;
  o.hidden_ids = {8183, kImEnd};
  ChoiceState s(*tokenizer_, o);
  std::vector<TokenId> tokens = ids("abc def");
  tokens.push_back(kImEnd);
  auto deltas = run(s, tokens, FinishReason::Stop);
  ASSERT_TRUE(s.finished());
  EXPECT_EQ(s.finish_reason(), "stop");
  EXPECT_EQ(s.text(), "abc def");  // the EOS token is counted, not detokenized
  EXPECT_EQ(s.n_generated(), static_cast<int>(tokens.size()));
  ASSERT_TRUE(s.matched_stop().is_number_integer());
  EXPECT_EQ(s.matched_stop().get<int>(), kImEnd);
  EXPECT_EQ(deltas.back().matched_stop, kImEnd);
}

TEST_F(ChoiceStateTest, MatchedStopIsAStopTokenIdFromSeveralTokensInOneEvent) {
  // Speculative decoding delivers several tokens per event; the stop token is the last one.
  ChoiceOptions o;
  o.chat = false;
  const TokenId stop_id = ids("x").back();
  o.hidden_ids = {stop_id};
  ChoiceState s(*tokenizer_, o);
  TokenEvent ev;
  ev.tokens = ids("ab cd");
  ev.tokens.push_back(stop_id);
  ev.finish = FinishReason::Stop;
  ChoiceDelta d = s.on_event(ev);
  EXPECT_EQ(d.matched_stop, stop_id);
  EXPECT_EQ(s.text(), "ab cd");
}

TEST_F(ChoiceStateTest, MatchedStopIsNullForLengthAbortAndToolCalls) {
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"never"};
  ChoiceState length(*tokenizer_, o);
  run(length, ids("one two three"), FinishReason::Length);
  EXPECT_EQ(length.finish_reason(), "length");
  EXPECT_TRUE(length.matched_stop().is_null());

  ChoiceState closed(*tokenizer_, o);
  run(closed, ids("one two"), FinishReason::None);
  ChoiceDelta d = closed.on_closed("abort");
  EXPECT_EQ(closed.finish_reason(), "abort");
  EXPECT_TRUE(d.matched_stop.is_null());
  EXPECT_TRUE(closed.matched_stop().is_null());

  // A stop that ends in tool calls reports finish_reason tool_calls and no matched stop (SGLang).
  const ChoiceOptions t = chat_hermes_options();
  ChoiceState tools(*tokenizer_, t);
  std::vector<TokenId> call = ids("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  call.push_back(kImEnd);
  run(tools, call, FinishReason::Stop);
  EXPECT_EQ(tools.finish_reason(), "tool_calls");
  EXPECT_TRUE(tools.matched_stop().is_null());
}

// Stop 54: blanks around tool calls were streamed as content deltas ("    \n "), while the whole
// response's content was "": the stream must add up to the response. Blanks before other text
// still come, in order, and blanks alone (no call) are content.
TEST_F(ChoiceStateTest, BlankContentAroundToolCallsIsDroppedStreamedOrNot) {
  const ChoiceOptions t = chat_hermes_options();
  auto streamed = [&](const std::string& text, ChoiceState& state) {
    std::vector<TokenId> tokens = ids(text);
    tokens.push_back(kImEnd);
    std::string content;
    for (const ChoiceDelta& d : run(state, tokens, FinishReason::Stop)) content += d.text;
    return content;
  };
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  ChoiceState blanks(*tokenizer_, t);
  EXPECT_EQ(streamed("    \n " + call + "\n ", blanks), "");
  EXPECT_EQ(blanks.text(), "");
  EXPECT_EQ(blanks.finish_reason(), "tool_calls");
  ChoiceState words(*tokenizer_, t);
  EXPECT_EQ(streamed("\n Sure.\n\n" + call, words), "\n Sure.\n\n");
  EXPECT_EQ(words.text(), "\n Sure.\n\n");
  ChoiceState no_call(*tokenizer_, t);
  EXPECT_EQ(streamed("  \n ", no_call), "  \n ");
  EXPECT_EQ(no_call.text(), "  \n ");
}

TEST_F(ChoiceStateTest, StreamReasoningFalseSendsReasoningInOneDeltaWhenItEnds) {
  const std::string reasoning = "Let me think about this carefully.\n";
  std::vector<TokenId> tokens = ids(reasoning + "</think>\n\nThe answer is 4.");
  tokens.push_back(kImEnd);

  ChoiceOptions streamed = chat_reasoning_options();
  ChoiceState a(*tokenizer_, streamed);
  auto da = run(a, tokens, FinishReason::Stop);
  int reasoning_deltas = 0;
  for (const auto& d : da) reasoning_deltas += d.reasoning.empty() ? 0 : 1;
  EXPECT_GT(reasoning_deltas, 1);  // default: streamed token by token

  ChoiceOptions held = chat_reasoning_options();
  held.stream_reasoning = false;
  ChoiceState b(*tokenizer_, held);
  auto db = run(b, tokens, FinishReason::Stop);
  std::size_t reasoning_at = db.size(), first_content_at = db.size();
  std::string content;
  for (std::size_t k = 0; k < db.size(); ++k) {
    if (!db[k].reasoning.empty()) {
      EXPECT_EQ(reasoning_at, db.size()) << "a second reasoning delta at " << k;
      reasoning_at = k;
      EXPECT_EQ(db[k].reasoning, reasoning);
    }
    if (!db[k].text.empty() && first_content_at == db.size()) first_content_at = k;
    content += db[k].text;
  }
  ASSERT_LT(reasoning_at, db.size());
  // Sent when </think> arrives, before the content, not at the end of the stream.
  EXPECT_LE(reasoning_at, first_content_at);
  EXPECT_LT(reasoning_at + 1, db.size());
  EXPECT_EQ(content, "\n\nThe answer is 4.");
  // The accumulated (non-streaming) result is the same either way.
  EXPECT_EQ(b.reasoning(), a.reasoning());
  EXPECT_EQ(b.text(), a.text());
  EXPECT_EQ(b.n_generated(), a.n_generated());
  EXPECT_EQ(b.matched_stop(), kImEnd);
}

TEST_F(ChoiceStateTest, StreamReasoningFalseFlushesHeldReasoningAtTheEnd) {
  // Cut off by max_tokens while still reasoning: the held reasoning goes out with the last delta.
  ChoiceOptions held = chat_reasoning_options();
  held.stream_reasoning = false;
  ChoiceState s(*tokenizer_, held);
  auto deltas = run(s, ids("still thinking about it"), FinishReason::Length);
  ASSERT_FALSE(deltas.empty());
  for (std::size_t k = 0; k + 1 < deltas.size(); ++k) EXPECT_TRUE(deltas[k].reasoning.empty()) << k;
  EXPECT_TRUE(deltas.back().finished);
  EXPECT_EQ(deltas.back().reasoning, "still thinking about it");
  EXPECT_EQ(s.reasoning(), "still thinking about it");

  // The same when the stream is closed (aborted) mid-reasoning.
  ChoiceState c(*tokenizer_, held);
  run(c, ids("half a thought"), FinishReason::None);
  ChoiceDelta last = c.on_closed("abort");
  EXPECT_EQ(last.reasoning, "half a thought");
}

TEST_F(ChoiceStateTest, IncludeReasoningFalseDropsReasoning) {
  std::vector<TokenId> tokens = ids("Plan A.\n</think>\n\nDone.");
  tokens.push_back(kImEnd);
  for (bool stream_reasoning : {true, false}) {
    ChoiceOptions o = chat_reasoning_options();
    o.include_reasoning = false;
    o.stream_reasoning = stream_reasoning;
    o.count_reasoning_tokens = true;
    o.think_end_id = tokenizer_->token_id("</think>");
    ChoiceState s(*tokenizer_, o);
    auto deltas = run(s, tokens, FinishReason::Stop);
    for (const auto& d : deltas) EXPECT_TRUE(d.reasoning.empty());
    EXPECT_EQ(s.reasoning(), "");
    EXPECT_EQ(s.text(), "\n\nDone.");  // split off, not left in the content
    // The tokens were still generated: usage keeps counting them.
    EXPECT_EQ(s.n_reasoning_tokens(), static_cast<int>(ids("Plan A.\n</think>").size()));
  }
}

// A prompt that did not open <think>: a reply whose first token opens it reasons up to </think>
// and those tokens are counted (they were 0); a reply that starts otherwise has none.
TEST_F(ChoiceStateTest, ReasoningTokensCountWhenTheReplyOpensThink) {
  ChoiceOptions o = chat_reasoning_options();
  o.start_in_reasoning = false;
  o.count_reasoning_tokens = true;
  o.think_start_id = tokenizer_->token_id("<think>");
  o.think_end_id = tokenizer_->token_id("</think>");
  std::vector<TokenId> tokens = ids("<think>Plan.</think>Answer");
  ASSERT_EQ(tokens.front(), *o.think_start_id);
  tokens.push_back(kImEnd);
  ChoiceState s(*tokenizer_, o);
  run(s, tokens, FinishReason::Stop);
  EXPECT_EQ(s.reasoning(), "Plan.");
  EXPECT_EQ(s.n_reasoning_tokens(), static_cast<int>(ids("<think>Plan.</think>").size()));
  ChoiceState plain(*tokenizer_, o);
  std::vector<TokenId> answer = ids("Answer </think> more");
  answer.push_back(kImEnd);
  run(plain, answer, FinishReason::Stop);
  EXPECT_EQ(plain.n_reasoning_tokens(), 0);
}

// vLLM: stop strings are not checked in the text of the first min_tokens tokens.
TEST_F(ChoiceStateTest, StopStringsWaitForMinTokens) {
  const std::vector<TokenId> toks = ids("a): b): c): d): e");
  ChoiceOptions o;
  o.chat = false;
  o.stop = {"):"};
  {
    ChoiceState s(*tokenizer_, o);
    run(s, toks, FinishReason::Length);
    EXPECT_EQ(s.text(), "a");  // without min_tokens: the first "):"
    EXPECT_EQ(s.finish_reason(), "stop");
  }
  // The first min_tokens tokens' text is never matched: generation goes on to a later "):".
  o.min_tokens = 5;
  ChoiceState s(*tokenizer_, o);
  run(s, toks, FinishReason::Length);
  EXPECT_EQ(s.finish_reason(), "stop");
  EXPECT_GT(s.n_generated(), 5);
  std::string expected;  // the text before the first "):" that ends after token 5
  {
    std::string prefix;
    for (int k = 0; k < 5; ++k) prefix += tokenizer_->decode(std::vector<TokenId>{toks[static_cast<size_t>(k)]}, false);
    const std::string full = "a): b): c): d): e";
    const std::size_t at = full.find("):", prefix.size() >= 1 ? prefix.size() - 1 : 0);
    ASSERT_NE(at, std::string::npos);
    expected = full.substr(0, at);
  }
  EXPECT_EQ(s.text(), expected);
  EXPECT_EQ(s.matched_stop(), "):");
  // Several tokens in one event, min_tokens ending inside it: the same text.
  ChoiceState batched(*tokenizer_, o);
  TokenEvent ev;
  ev.tokens = toks;
  ev.finish = FinishReason::Length;
  batched.on_event(ev);
  EXPECT_EQ(batched.text(), expected);
  EXPECT_EQ(batched.finish_reason(), "stop");
}

}  // namespace
}  // namespace deltaserve
