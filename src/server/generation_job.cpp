#include "server/generation_job.h"

#include <algorithm>
#include <random>
#include <span>

#include "server/json_util.h"
#include "server/request_constraint.h"
#include "util/log.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  uint64_t bits = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 16 == 0) bits = rng();
    s += kHex[bits & 0xF];
    bits >>= 4;
  }
  return s;
}

json token_bytes(const std::string& raw) {
  json b = json::array();
  for (unsigned char c : raw) b.push_back(static_cast<int>(c));
  return b;
}

// How logprobs name a token: its text, or "token_id:N" (return_tokens_as_token_ids, vLLM).
struct TokenNames {
  const Tokenizer& tok;
  bool as_ids = false;
  std::string operator()(TokenId id) const {
    if (as_ids) return "token_id:" + std::to_string(id);
    TokenId ids[1] = {id};
    return tok.decode(ids, false);
  }
};


double clamp_logprob(float lp) {
  // JSON has no -inf; OpenAI clients expect a number.
  return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0;
}

json chat_logprobs(const TokenNames& name, const std::vector<TokenLogprob>& lps) {
  const Tokenizer& tok = name.tok;
  json content = json::array();
  for (const auto& lp : lps) {
    json top = json::array();
    for (const auto& [id, v] : lp.top) {
      top.push_back({{"token", name(id)},
                     {"logprob", clamp_logprob(v)},
                     {"bytes", token_bytes(tok.token_text(id))}});
    }
    content.push_back({{"token", name(lp.token)},
                       {"logprob", clamp_logprob(lp.logprob)},
                       {"bytes", token_bytes(tok.token_text(lp.token))},
                       {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

}  // namespace

int64_t TextOffset::take(const std::string& bytes) {
  // A token whose first byte continues the last character starts with that character.
  const bool continues = pending > 0 && !bytes.empty() && static_cast<unsigned char>(bytes[0]) >= lo &&
                         static_cast<unsigned char>(bytes[0]) <= hi;
  const int64_t at = chars - (continues ? 1 : 0);
  for (unsigned char b : bytes) {
    if (pending > 0 && b >= lo && b <= hi) {
      --pending;
      lo = 0x80, hi = 0xBF;
      continue;
    }
    // A new character (a byte that does not continue the last one ends it: one U+FFFD).
    ++chars;
    lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      pending = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      pending = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      pending = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
      pending = 0;  // ASCII, or a byte no character starts with (U+FFFD)
    }
  }
  return at;
}

namespace {

// Completions logprobs. text_offset (OpenAI, vLLM): where each token's text starts in the choice's
// text, in characters; `offset` runs over the whole choice (echo, then every chunk's tokens), also
// across text the stop matcher still holds. The top alternatives always hold the sampled token
// (vLLM: up to logprobs + 1 of them; with logprobs 0, the sampled token alone).
json completion_logprobs(const TokenNames& name, const std::vector<TokenLogprob>& lps, TextOffset& offset,
                         bool skip_special) {
  const Tokenizer& tok = name.tok;
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  std::string bytes;
  for (const auto& lp : lps) {
    tokens.push_back(name(lp.token));
    token_lps.push_back(clamp_logprob(lp.logprob));
    // The offset counts the token's text as the choice's text holds it, also when the token is
    // written as "token_id:N".
    bytes.clear();
    tok.append_token_bytes(lp.token, skip_special, bytes);
    offsets.push_back(offset.take(bytes));
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[name(id)] = clamp_logprob(v);
    if (!top.contains(tokens.back().get<std::string>())) top[tokens.back().get<std::string>()] = clamp_logprob(lp.logprob);
    tops.push_back(top);
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json arr = json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    arr.push_back({{"id", calls[i].id},
                   {"index", static_cast<int>(i)},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  return arr;
}

// Streamed tool-call deltas of one chunk, merged per call index.
json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json arr = json::array();
  for (const auto& d : deltas) {
    if (!arr.empty() && arr.back()["index"] == d.index && d.id.empty()) {
      arr.back()["function"]["arguments"] =
          arr.back()["function"]["arguments"].get<std::string>() + d.arguments;
      continue;
    }
    json item = {{"index", d.index}};
    json fn = {{"arguments", d.arguments}};
    if (!d.id.empty()) {
      item["id"] = d.id;
      item["type"] = "function";
      fn["name"] = d.name;
    }
    item["function"] = fn;
    arr.push_back(item);
  }
  return arr;
}

void append_sse(const json& payload, std::string& out) {
  out += "data: ";
  out += safe_dump(payload);
  out += "\n\n";
}

json usage_json(int prompt_tokens, int completion_tokens, int reasoning_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}},
          {"reasoning_tokens", reasoning_tokens},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens}}}};
}

// The one mapping from the engine's error kinds to HTTP.
ApiError api_error_for(EngineErrorKind kind, const std::string& message) {
  switch (kind) {
    case EngineErrorKind::BadRequest: return ApiError::bad_request(message);
    case EngineErrorKind::TooLong: return ApiError::bad_request(message, "", "context_length_exceeded");
    case EngineErrorKind::Overloaded: return ApiError::overloaded(message);
    case EngineErrorKind::None:
    case EngineErrorKind::Internal: break;
  }
  return ApiError::internal(message);
}

}  // namespace

GenerationJob::GenerationJob(JobEnv env, OpenAiRequest request, std::vector<JobPrompt> prompts,
                             ChoiceOptions options, std::shared_ptr<HttpExchange> exchange,
                             Clock::time_point arrival)
    : env_(std::move(env)),
      request_(std::move(request)),
      prompts_(std::move(prompts)),
      options_(std::move(options)),
      exchange_(std::move(exchange)),
      arrival_(arrival) {
  // A client's request_id (or rid) names a chat or completion response, as in vLLM ("chatcmpl-" +
  // request_id); Responses ids stay the server's: previous_response_id looks them up.
  const bool client_id = !request_.rid.empty() && (request_.kind == ApiKind::Chat || request_.kind == ApiKind::Completion);
  response_id_ = (request_.kind == ApiKind::Chat ? "chatcmpl-" : request_.kind == ApiKind::Responses ? "resp_" : "cmpl-") +
                 (client_id ? request_.rid : random_hex(32));
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  for (const auto& p : prompts_) n_prompt_tokens_ += static_cast<int>(p.ids.size());
  if (env_.active_jobs) env_.active_jobs->fetch_add(1);
}

GenerationJob::~GenerationJob() {
  if (env_.active_jobs) env_.active_jobs->fetch_sub(1);
  release_rid();
}

const std::string& GenerationJob::route() const {
  static const std::string kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"};
  return kRoutes[static_cast<int>(request_.kind)];
}

void GenerationJob::abort() {
  exchange_->post([job = shared_from_this()] {
    if (job->released_) return;
    for (auto& c : job->choices_) job->cancel_choice(c);
  });
}

void GenerationJob::start() {
  self_ = shared_from_this();
  std::weak_ptr<GenerationJob> weak = self_;
  exchange_->on_disconnect([weak] {
    if (auto job = weak.lock()) job->on_disconnect();
  });
  if (request_.stream) env_.metrics->stream_opened();
  const auto n = static_cast<std::size_t>(request_.n);
  choices_.resize(prompts_.size() * n);
  for (auto& c : choices_) c.state = std::make_unique<ChoiceState>(*env_.tokenizer, options_);
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    const std::size_t p = i / n, j = i % n;  // choice index = prompt index * n + j
    GenerateRequest g;
    g.id = env_.engine->next_request_id();
    g.prompt = prompts_[p].ids;
    g.sampling = request_.sampling;
    g.sampling.max_tokens = prompts_[p].max_tokens;
    // Each prompt's j-th choice gets seed + j: a prompt samples the same in a batch as alone.
    if (g.sampling.seed && j > 0) g.sampling.seed = *g.sampling.seed + j;
    g.constraint = make_constraint(request_.plan);  // one per sequence: it tracks its tokens
    g.cache_namespace = request_.cache_namespace;
    choices_[i].id = g.id;
    choices_[i].prompt = p;
    choices_[i].stream = env_.engine->submit(std::move(g));
  }
  if (env_.registry) {
    auto abort = [weak] {
      if (auto job = weak.lock()) job->abort();
    };
    if (registry_handle_) env_.registry->set_abort(registry_handle_, std::move(abort));
    else registry_handle_ = env_.registry->add(response_id_, std::move(abort));
  }
  if (logging()) log_received();
  // Hooks after all submits: the first drain sees every choice's stream.
  for (auto& c : choices_) {
    c.stream->events.set_notify([weak] {
      if (auto job = weak.lock()) job->schedule_drain();
    });
  }
}

void GenerationJob::schedule_drain() {
  if (drain_scheduled_.exchange(true)) return;
  exchange_->post([job = shared_from_this()] { job->drain(); });
}

void GenerationJob::drain() {
  drain_scheduled_.store(false);
  if (released_) return;
  std::string out;
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    while (!c.engine_done) {
      auto event = c.stream->events.try_pop();
      if (!event) {
        if (c.stream->events.closed()) {
          c.engine_done = true;
          stream_delta(i, c.state->on_closed("abort"), 0, out);
        }
        break;
      }
      process(i, *event, out);
      if (released_) return;
    }
  }
  if (request_.stream && head_sent_ && !responded_ && !out.empty()) exchange_->write(std::move(out));
  if (all_finished()) finish();
}

void GenerationJob::process(std::size_t i, const TokenEvent& event, std::string& out) {
  Choice& c = choices_[i];
  if (event.finish != FinishReason::None) c.engine_done = true;
  auto now = Clock::now();
  if (!event.tokens.empty() && !c.state->finished()) {
    if (!c.got_token) {
      const double ttft = std::chrono::duration<double>(now - arrival_).count();
      env_.metrics->observe_ttft(ttft);
      if (ttft_s_ < 0) ttft_s_ = ttft;
      for (std::size_t k = 1; k < event.tokens.size(); ++k) env_.metrics->observe_itl(0.0);
    } else {
      double dt = std::chrono::duration<double>(now - c.last_token_time).count() /
                  static_cast<double>(event.tokens.size());
      for (std::size_t k = 0; k < event.tokens.size(); ++k) env_.metrics->observe_itl(dt);
    }
    c.got_token = true;
    c.last_token_time = now;
  }
  if (event.finish != FinishReason::None && event.accept_length > 0.0) {
    env_.metrics->observe_accept_length(event.accept_length);
  }
  // An engine error before any output (queue full, prompt too long), or one the request caused
  // (its rules left no token to generate): an HTTP error, if nothing has been sent yet.
  const bool before_output = c.state->n_generated() == 0 && event.tokens.empty();
  if (event.finish == FinishReason::Error && (before_output || event.error_kind == EngineErrorKind::BadRequest) &&
      !head_sent_ && !responded_) {
    send_error_response(event.error_kind, event.error.empty() ? "the engine could not serve the request"
                                                              : event.error);
    return;
  }
  bool was_finished = c.state->finished();
  ChoiceDelta d = c.state->on_event(event);
  if (!was_finished && c.state->stop_matched()) cancel_choice(c);
  stream_delta(i, std::move(d), static_cast<int>(event.tokens.size()), out);
}

void GenerationJob::stream_delta(std::size_t i, ChoiceDelta d, int n_tokens, std::string& out) {
  Choice& c = choices_[i];
  const int interval = request_.stream_interval > 0 ? request_.stream_interval : env_.stream_interval;
  if (interval <= 1 || !request_.stream) {
    handle_delta(i, d, out);
    return;
  }
  ChoiceDelta& h = c.held;
  h.append(std::move(d));
  c.held_tokens += n_tokens;
  if (!h.finished && c.streamed && c.held_tokens < interval) return;
  if (c.held_tokens > 0) c.streamed = true;
  ChoiceDelta send = std::move(h);
  h = ChoiceDelta{};
  c.held_tokens = 0;
  handle_delta(i, send, out);
}

void GenerationJob::handle_delta(std::size_t i, const ChoiceDelta& d, std::string& out) {
  if (d.finished) env_.metrics->count_finish(d.finish_reason);
  if (request_.kind == ApiKind::Responses && !request_.stream && !responded_) {
    std::string none;  // the output items, built as a stream builds them (responses_final); no events
    append_responses_events(d, none);
    return;
  }
  if (!request_.stream || responded_) return;
  if (!head_sent_) {
    head_sent_ = true;
    exchange_->begin_stream(200, "text/event-stream");
    if (request_.kind == ApiKind::Responses) {
      responses_event("response.created", {{"response", responses_object("in_progress")}}, out);
      responses_event("response.in_progress", {{"response", responses_object("in_progress")}}, out);
    }
    if (request_.kind == ApiKind::Completion && request_.echo) {
      for (std::size_t k = 0; k < choices_.size(); ++k) {
        ChoiceDelta echo;
        echo.text = prompts_[choices_[k].prompt].echo_text;
        choices_[k].text_offset.take(echo.text);
        append_completion_chunk(k, echo, out);
      }
    }
  }
  switch (request_.kind) {
    case ApiKind::Chat: append_chat_chunk(i, d, out); break;
    case ApiKind::Completion: append_completion_chunk(i, d, out); break;
    case ApiKind::Generate: append_generate_chunk(i, d, out); break;
    case ApiKind::Responses: append_responses_events(d, out); break;
  }
}

void GenerationJob::append_chat_chunk(std::size_t i, const ChoiceDelta& d, std::string& out) {
  Choice& c = choices_[i];
  auto chunk = [&](json delta, json finish, json logprobs) {
    const bool last = !finish.is_null();
    json choice = {{"index", static_cast<int>(i)},
                   {"delta", std::move(delta)},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", std::move(finish)}};
    if (last) choice["matched_stop"] = d.matched_stop;
    if (request_.return_token_ids && !last) choice["token_ids"] = d.token_ids;
    json payload = {{"id", response_id_},
                    {"object", "chat.completion.chunk"},
                    {"created", created_},
                    {"model", env_.model_name},
                    {"choices", json::array({choice})}};
    if (request_.continuous_usage_stats) payload["usage"] = current_usage();
    if (!c.role_sent && (request_.return_token_ids || request_.return_prompt_token_ids))
      payload["prompt_token_ids"] = prompts_[c.prompt].ids;
    append_sse(payload, out);
  };
  if (!c.role_sent) {
    chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
    c.role_sent = true;
  }
  json delta = json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.text.empty()) delta["content"] = d.text;
  if (!d.tool_calls.empty()) delta["tool_calls"] = tool_call_deltas_json(d.tool_calls);
  json lp = request_.logprobs && !d.logprobs.empty() ? chat_logprobs(TokenNames{*env_.tokenizer, request_.tokens_as_ids}, d.logprobs)
                                                     : json(nullptr);
  if (!delta.empty() || !lp.is_null() || (request_.return_token_ids && !d.token_ids.empty())) chunk(delta, nullptr, lp);
  if (d.finished) {
    if (!d.error.empty()) {
      append_sse({{"error", {{"message", d.error}, {"type", "server_error"}, {"param", nullptr},
                             {"code", "engine_error"}}}},
                 out);
    }
    chunk(json::object(), d.finish_reason, nullptr);
  }
}

void GenerationJob::append_completion_chunk(std::size_t i, const ChoiceDelta& d,
                                            std::string& out) {
  // Tokens whose text is held back (an incomplete UTF-8 sequence, a possible stop string) still
  // reach a client that asked for token ids: every chunk carries the ids of its step.
  const bool ids = request_.return_token_ids && !d.token_ids.empty();
  if (d.text.empty() && d.logprobs.empty() && !d.finished && !ids) return;
  json lp = request_.logprobs && !d.logprobs.empty()
                ? completion_logprobs(TokenNames{*env_.tokenizer, request_.tokens_as_ids}, d.logprobs,
                                      choices_[i].text_offset, request_.skip_special_tokens)
                : json(nullptr);
  json choice = {{"index", static_cast<int>(i)},
                 {"text", d.text},
                 {"logprobs", lp},
                 {"finish_reason", d.finished ? json(d.finish_reason) : json(nullptr)}};
  if (d.finished) choice["matched_stop"] = d.matched_stop;
  if (request_.return_token_ids) choice["token_ids"] = d.token_ids;
  if (d.finished && !d.error.empty()) {  // as chat streams it: the error, then the choice's end
    append_sse({{"error", {{"message", d.error}, {"type", "server_error"}, {"param", nullptr}, {"code", "engine_error"}}}},
               out);
  }
  json payload = {{"id", response_id_},
                  {"object", "text_completion"},
                  {"created", created_},
                  {"model", env_.model_name},
                  {"choices", json::array({choice})}};
  if (request_.continuous_usage_stats) payload["usage"] = current_usage();
  append_sse(payload, out);
}

nlohmann::ordered_json GenerationJob::current_usage() const {
  int completion = 0, reasoning = 0;
  for (const auto& c : choices_) {
    completion += c.state->n_generated();
    reasoning += c.state->n_reasoning_tokens();
  }
  return usage_json(n_prompt_tokens_, completion, reasoning, cached_tokens());
}

int GenerationJob::cached_tokens() const {
  // Per prompt, what its choices were served from the prefix cache; the n choices of one prompt
  // share it, so the one that computed it counts (the least cached).
  std::vector<int> per_prompt(prompts_.size(), -1);
  for (const auto& c : choices_) {
    int& v = per_prompt[c.prompt];
    v = v < 0 ? c.state->n_cached() : std::min(v, c.state->n_cached());
  }
  int sum = 0;
  for (int v : per_prompt) sum += std::max(v, 0);
  return sum;
}

void GenerationJob::append_usage_chunk(std::string& out) {
  append_sse({{"id", response_id_},
              {"object", request_.kind == ApiKind::Chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", env_.model_name},
              {"choices", json::array()},
              {"usage", current_usage()}},
             out);
}

std::string GenerationJob::full_response() const {
  if (request_.kind == ApiKind::Generate) return generate_response();
  if (request_.kind == ApiKind::Responses) return safe_dump(responses_final());
  json choices = json::array();
  int completion = 0, reasoning = 0;
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& s = *choices_[i].state;
    completion += s.n_generated();
    reasoning += s.n_reasoning_tokens();
    if (request_.kind == ApiKind::Chat) {
      json message = {{"role", "assistant"}, {"content", s.text()}};
      // include_reasoning=false (vLLM): no reasoning field at all.
      if (options_.include_reasoning)
        message["reasoning_content"] = s.reasoning().empty() ? json(nullptr) : json(s.reasoning());
      auto calls = merge_tool_call_deltas(s.tool_call_deltas());
      if (!calls.empty()) message["tool_calls"] = tool_calls_json(calls);
      json lp = request_.logprobs ? chat_logprobs(TokenNames{*env_.tokenizer, request_.tokens_as_ids}, s.logprobs()) : json(nullptr);
      choices.push_back({{"index", static_cast<int>(i)},
                         {"message", message},
                         {"logprobs", lp},
                         {"finish_reason", s.finish_reason()},
                         {"matched_stop", s.matched_stop()}});
      if (request_.return_token_ids) choices.back()["token_ids"] = s.token_ids();
    } else {
      const std::string& echo = prompts_[choices_[i].prompt].echo_text;
      TextOffset offset;
      if (request_.echo) offset.take(echo);
      json lp = request_.logprobs ? completion_logprobs(TokenNames{*env_.tokenizer, request_.tokens_as_ids}, s.logprobs(), offset,
                                                        request_.skip_special_tokens)
                                  : json(nullptr);
      choices.push_back({{"index", static_cast<int>(i)},
                         {"text", request_.echo ? echo + s.text() : s.text()},
                         {"logprobs", lp},
                         {"finish_reason", s.finish_reason()},
                         {"matched_stop", s.matched_stop()}});
      if (request_.return_token_ids) choices.back()["token_ids"] = s.token_ids();
    }
  }
  json body = {{"id", response_id_},
               {"object", request_.kind == ApiKind::Chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", env_.model_name},
               {"choices", choices},
               {"usage", usage_json(n_prompt_tokens_, completion, reasoning, cached_tokens())}};
  if (request_.return_token_ids || request_.return_prompt_token_ids) {
    if (prompts_.size() == 1) {
      body["prompt_token_ids"] = prompts_[0].ids;
    } else {
      json all = json::array();
      for (const auto& p : prompts_) all.push_back(p.ids);
      body["prompt_token_ids"] = all;
    }
  }
  return safe_dump(body);
}

void GenerationJob::send_error_response(EngineErrorKind kind, const std::string& message) {
  const ApiError e = api_error_for(kind, message);
  const int status = e.status;
  env_.metrics->count_request(route(), status);
  status_ = status;
  HttpHeaders headers;
  if (status == 503) headers.emplace_back("Retry-After", "1");  // queue full: a retry soon may be admitted
  release_rid();
  exchange_->respond(status, "application/json", e.to_json(), std::move(headers));
  responded_ = true;
  for (auto& c : choices_) {
    if (!c.engine_done) cancel_choice(c);
    if (!c.state->finished()) c.state->on_closed("error");
  }
}

bool GenerationJob::all_finished() const {
  for (const auto& c : choices_) {
    if (!c.state->finished()) return false;
  }
  return true;
}

void GenerationJob::cancel_choice(Choice& c) {
  if (c.cancelled || c.engine_done) return;
  c.cancelled = true;
  env_.engine->cancel(c.id);
}

void GenerationJob::on_disconnect() {
  if (responded_ || disconnected_) return;
  disconnected_ = true;
  env_.metrics->add_abandoned();
  for (auto& c : choices_) cancel_choice(c);
}

void GenerationJob::release_rid() {
  if (env_.registry && registry_handle_) env_.registry->remove(registry_handle_);
  registry_handle_ = 0;
}

void GenerationJob::finish() {
  if (released_) return;
  release_rid();  // before the answer: a client may reuse its rid as soon as it has it
  if (!responded_ && !disconnected_) {
    if (request_.stream) {
      std::string out;
      if (request_.kind == ApiKind::Responses) {
        append_responses_end(out);
      } else {
        if (request_.include_usage && request_.kind != ApiKind::Generate) append_usage_chunk(out);
        out += "data: [DONE]\n\n";
      }
      exchange_->write(std::move(out));
      exchange_->end_stream();
    } else {
      // Every choice failed in the engine: an error instead of empty choices.
      bool all_error = true;
      std::string message;
      for (const auto& c : choices_) {
        if (c.state->finish_reason() != "error" || c.state->n_generated() > 0) all_error = false;
      }
      if (all_error) {
        exchange_->respond(500, "application/json",
                           ApiError::internal("generation failed").to_json());
        status_ = 500;
      } else {
        exchange_->respond(200, "application/json", full_response());
      }
    }
    if (status_ == 0) status_ = 200;
    env_.metrics->count_request(route(), status_);
    responded_ = true;
  }
  if (logging()) log_finished();
  env_.metrics->observe_e2e(std::chrono::duration<double>(Clock::now() - arrival_).count());
  if (request_.stream) env_.metrics->stream_closed();
  if (request_.kind == ApiKind::Responses && env_.on_response && !disconnected_) env_.on_response(responses_final());
  released_ = true;
  for (auto& c : choices_) c.stream->events.set_notify(nullptr);
  exchange_->post([job = std::move(self_)] {});  // drop the self-reference outside our frame
}

void GenerationJob::log_received() const {
  const RequestLog& log = *env_.request_log;
  std::string max_tokens, texts;
  for (std::size_t p = 0; p < prompts_.size(); ++p) {
    max_tokens += str_cat(p ? "," : "", prompts_[p].max_tokens);
    if (log.level < 2) continue;
    // Level 2 shows 2,048 characters: the first 2,048 tokens hold them (a 131k-token prompt is not
    // decoded whole for its log line).
    const std::span<const TokenId> ids(prompts_[p].ids);
    const std::size_t shown = log.level >= 3 ? ids.size() : std::min(ids.size(), RequestLog::kPartialTextChars);
    texts += str_cat(p ? ", " : "", log.text(env_.tokenizer->decode(ids.first(shown))),
                     shown < ids.size() ? str_cat(" (+", ids.size() - shown, " tokens)") : "");
  }
  // (The rid is the client's: JSON-quoted, so a line break in it cannot start a forged log line.)
  log.write(str_cat("request ", response_id_, " ", route(), request_.rid.empty() ? "" : " rid " + safe_dump(json(request_.rid)), ": ",
                    prompts_.size(), prompts_.size() == 1 ? " prompt, " : " prompts, ", n_prompt_tokens_,
                    " prompt tokens, n ", request_.n, ", max_tokens ", max_tokens,
                    request_.stream ? ", stream" : "", log.sampling(request_.sampling, request_.stop),
                    texts.empty() ? "" : " prompt [" + texts + "]"));
}

void GenerationJob::log_finished() const {
  const RequestLog& log = *env_.request_log;
  int completion_tokens = 0;
  std::string reasons, texts;
  for (std::size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& st = *choices_[i].state;
    completion_tokens += st.n_generated();
    reasons += str_cat(i ? "," : "", st.finish_reason().empty() ? "none" : st.finish_reason());
    if (log.level >= 2) {  // the text alone, or {reasoning .., text .., tool_call name(arguments) ..}
      const std::vector<ToolCall> calls = merge_tool_call_deltas(st.tool_call_deltas());
      std::string t = log.text(st.text());
      if (!st.reasoning().empty() || !calls.empty()) {
        t = str_cat(st.reasoning().empty() ? "{" : "{reasoning " + log.text(st.reasoning()) + ", ", "text ", t);
        for (const ToolCall& call : calls) t += str_cat(", tool_call ", log.text(call.name + "(" + call.arguments + ")"));
        t += "}";
      }
      texts += str_cat(i ? ", " : "", t);
    }
  }
  const double e2e = std::chrono::duration<double>(Clock::now() - arrival_).count();
  log.write(str_cat("response ", response_id_, " ", route(), ": ",
                    disconnected_ ? std::string("client disconnected") : str_cat("status ", status_), ", ",
                    completion_tokens, " completion tokens, finish ", reasons,
                    ttft_s_ >= 0 ? str_cat(", ttft ", static_cast<int64_t>(ttft_s_ * 1000 + 0.5), " ms") : "",
                    ", e2e ", static_cast<int64_t>(e2e * 1000 + 0.5), " ms",
                    texts.empty() ? "" : " output [" + texts + "]"));
}

}  // namespace deltaserve
