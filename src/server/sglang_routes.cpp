// SGLang's native routes on OpenAiServer, and GenerationJob's /generate output format:
//
//   POST /generate         {"text" | "input_ids", "sampling_params", "stream", "rid", "return_logprob", ...}
//                          -> {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
//                             "completion_tokens", "cached_tokens", "e2e_latency"}} (a list for batches
//                             or n > 1); streaming sends the cumulative text, then "data: [DONE]", which
//                             is what `bench_serving --backend sglang` reads.
//   POST /abort_request    {"rid": "...", "abort_all": false}: cancels requests by rid (any API)
//   POST|GET /flush_cache  empties the prefix cache when no request runs (else 400, nothing dropped)
//   POST /tokenize, /v1/tokenize      {"prompt": text | [texts] | "messages": [...]} -> {"tokens", "count", "max_model_len"}
//   POST /detokenize, /v1/detokenize  {"tokens": [ids] | [[ids]]} -> {"text"}
//   GET  /health_generate  as SGLang: submits a one-token generation and answers 200 as soon as the
//                          engine shows progress (a step finished, on any replica) since the probe
//                          began, or the probe's generation ends; 503 if it fails, or after
//                          SGLANG_HEALTH_CHECK_TIMEOUT seconds (default 20) without progress. A busy
//                          server answers at its next step, not after the requests queued before
//                          the probe. No API key needed (SGLang lets every /health* path through).
//   GET  /get_model_info
//   GET  /get_load         one entry per data-parallel replica (dp_rank 0..N-1)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "server/generation_job.h"
#include "server/json_fields.h"
#include "server/json_util.h"
#include "server/openai_server.h"
#include "server/request_fields.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

ApiError method_not_allowed(const std::string& use) { return ApiError::method_not_allowed(use); }

json finish_reason_object(const ChoiceState& s, int max_tokens) {
  const std::string& r = s.finish_reason();
  if (r.empty()) return nullptr;
  if (r == "length") return {{"type", "length"}, {"length", max_tokens}};
  if (r == "stop" || r == "tool_calls") return {{"type", "stop"}, {"matched", s.matched_stop()}};
  return {{"type", r == "error" ? "abort" : r}, {"message", r == "error" ? "the engine failed" : "aborted"}};
}

}  // namespace

// --- GenerationJob: the /generate output format ---

json GenerationJob::generate_item(std::size_t i, bool final) const {
  const Choice& c = choices_[i];
  const ChoiceState& s = *c.state;
  json meta = {{"id", request_.rid.empty() ? response_id_ : request_.rid},
               {"finish_reason", final ? finish_reason_object(s, prompts_[c.prompt].max_tokens) : json(nullptr)},
               {"prompt_tokens", static_cast<int>(prompts_[c.prompt].ids.size())},
               {"completion_tokens", s.n_generated()},
               {"cached_tokens", s.n_cached()},
               {"e2e_latency", std::chrono::duration<double>(Clock::now() - arrival_).count()}};
  if (request_.logprobs) {
    const bool with_text = request_.extra.value("return_text_in_logprobs", false);
    auto text_of = [&](TokenId id) -> json {
      if (!with_text) return nullptr;
      TokenId ids[1] = {id};
      return env_.tokenizer->decode(ids, false);
    };
    json lps = json::array(), tops = json::array();
    for (const auto& lp : s.logprobs()) {
      lps.push_back(json::array({std::isfinite(lp.logprob) ? lp.logprob : -9999.0f, lp.token, text_of(lp.token)}));
      json alt = json::array();
      for (const auto& [id, v] : lp.top) alt.push_back(json::array({std::isfinite(v) ? v : -9999.0f, id, text_of(id)}));
      tops.push_back(std::move(alt));
    }
    meta["input_token_logprobs"] = json::array();
    meta["output_token_logprobs"] = std::move(lps);
    if (request_.top_logprobs > 0) meta["output_top_logprobs"] = std::move(tops);
  }
  json item = {{"text", s.text()}, {"output_ids", s.token_ids()}, {"meta_info", std::move(meta)}};
  if (choices_.size() > 1) item["index"] = static_cast<int>(i);
  return item;
}

void GenerationJob::append_generate_chunk(std::size_t i, const ChoiceDelta& d, std::string& out) {
  if (d.text.empty() && d.token_ids.empty() && !d.finished) return;
  out += "data: ";
  out += safe_dump(generate_item(i, d.finished));
  out += "\n\n";
}

std::string GenerationJob::generate_response() const {
  if (choices_.size() == 1 && !request_.batched_prompt) return safe_dump(generate_item(0, true));
  json all = json::array();
  for (std::size_t i = 0; i < choices_.size(); ++i) all.push_back(generate_item(i, true));
  return safe_dump(all);
}

// --- OpenAiServer: the routes ---

void OpenAiServer::handle_sglang_generate(const HttpRequest& req, std::shared_ptr<HttpExchange> exchange) {
  const auto arrival = GenerationJob::Clock::now();
  json body;
  if (auto e = parse_body(req, body)) return send_error(*exchange, "/generate", *e);
  OpenAiRequest request;
  if (auto e = parse_generate_request(body, defaults_, request)) return send_error(*exchange, "/generate", *e);
  start_request(std::move(request), std::move(exchange), arrival);
}

namespace {

// SGLang's HEALTH_CHECK_TIMEOUT: SGLANG_HEALTH_CHECK_TIMEOUT seconds, 20 by default.
std::chrono::milliseconds health_check_timeout() {
  double s = 20;
  if (const char* env = std::getenv("SGLANG_HEALTH_CHECK_TIMEOUT")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && std::isfinite(v) && v > 0 && v < 86400) s = v;
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

// One-token generation for /health_generate. Answered once, on the connection's strand: by the
// probe's own stream (it ended: 200, or 503 if it failed), or by the watcher thread (the engine
// made progress since the probe began: 200; none within the timeout: 503).
struct HealthProbe : std::enable_shared_from_this<HealthProbe> {
  std::shared_ptr<HttpExchange> exchange;
  std::shared_ptr<RequestStream> stream;
  ServerMetrics* metrics = nullptr;
  std::atomic<bool> done{false};

  void check() {
    if (done) return;
    while (auto ev = stream->events.try_pop()) {
      if (ev->finish == FinishReason::None) continue;
      const bool ok = ev->finish != FinishReason::Error && ev->finish != FinishReason::Abort;
      if (ok) answer(200, "{}");
      else
        answer(503, ApiError{503, "health generation failed: " + (ev->error.empty() ? std::string(finish_reason_name(ev->finish)) : ev->error),
                             "server_unavailable", "", "engine_unhealthy"}.to_json());
      return;
    }
  }
  // On the strand; the first answer wins.
  void answer(int status, const std::string& body) {
    if (done.exchange(true)) return;
    metrics->count_request("/health_generate", status);
    HttpHeaders h;
    if (status == 503) h.emplace_back("Retry-After", "1");
    exchange->respond(status, "application/json", body, std::move(h));
    release();
  }
  // Answered (or the client left): drop the references that keep this probe, its exchange and
  // its connection alive (the stream's notify hook and the exchange's disconnect hook hold it;
  // found as a leak by the server suite under ASan).
  void release() {
    done = true;
    stream->events.set_notify(nullptr);
    exchange->on_disconnect(nullptr);
  }
};

}  // namespace

void OpenAiServer::handle_health_generate(const HttpRequest& req, std::shared_ptr<HttpExchange> exchange) {
  (void)req;
  auto probe = std::make_shared<HealthProbe>();
  probe->exchange = exchange;
  probe->metrics = &metrics_;
  GenerateRequest g;
  g.id = engine_.next_request_id();
  // Any short prompt: the first id of an encoded newline (every vocabulary has one).
  std::vector<TokenId> prompt = tokenizer_.encode("\n", false);
  if (prompt.empty()) prompt.push_back(0);
  g.prompt = prompt;
  g.sampling.max_tokens = 1;
  g.sampling.temperature = 0.0f;
  g.sampling.ignore_eos = true;
  const RequestId id = g.id;
  // Progress is counted from here: a step that finishes after this point (the probe's own, or one
  // of the requests already running) shows the engine is alive.
  const uint64_t steps_before = engine_.stats().steps_total;
  const auto deadline = std::chrono::steady_clock::now() + health_check_timeout();
  probe->stream = engine_.submit(std::move(g));
  std::weak_ptr<HealthProbe> weak = probe;
  probe->stream->events.set_notify([weak] {
    if (auto p = weak.lock()) p->exchange->post([p] { p->check(); });
  });
  exchange->on_disconnect([probe] { probe->release(); });
  exchange->post([probe] { probe->check(); });  // the events may have arrived before the hook
  // The watcher: polls the engine's step counter off the io threads. It counts as a job, so that
  // stop() waits for it (it reads engine_); it ends once the probe is answered, the client is
  // gone, or the server stops serving.
  active_jobs_.fetch_add(1);
  std::thread([this, weak, id, steps_before, deadline] {
    constexpr auto kPoll = std::chrono::milliseconds(20);
    for (;;) {
      std::this_thread::sleep_for(kPoll);
      auto p = weak.lock();
      if (!p || p->done.load()) break;
      int status = 0;
      std::string body;
      if (stopped_.load() || state() != ServeState::Ready) {
        status = 503;
        body = ApiError{503, "the server is shutting down", "server_unavailable", "", "shutting_down"}.to_json();
      } else if (engine_.stats().steps_total != steps_before) {
        status = 200;
        body = "{}";
      } else if (std::chrono::steady_clock::now() >= deadline) {
        status = 503;
        char why[160];
        std::snprintf(why, sizeof why, "health check timed out: the engine made no progress in %g s (SGLANG_HEALTH_CHECK_TIMEOUT)",
                      static_cast<double>(health_check_timeout().count()) / 1000.0);
        body = ApiError{503, why, "server_unavailable", "", "engine_unhealthy"}.to_json();
      }
      if (status == 0) continue;
      engine_.cancel(id);  // the probe's own generation is not needed any more (no-op if it ended)
      p->exchange->post([p, status, body] { p->answer(status, body); });
      break;
    }
    active_jobs_.fetch_sub(1);  // (last: stop() may return and the server go once it is 0)
  }).detach();
}

bool OpenAiServer::handle_sglang(const HttpRequest& req, std::shared_ptr<HttpExchange>& exchange) {
  const std::string& path = req.path;
  const bool get = req.method == "GET" || req.method == "HEAD";
  const bool post = req.method == "POST";
  static const char* kRoutes[] = {"/generate",      "/abort_request", "/flush_cache",    "/tokenize", "/v1/tokenize",
                                  "/detokenize",    "/v1/detokenize", "/health_generate", "/get_model_info",
                                  "/get_load"};
  bool mine = false;
  for (const char* r : kRoutes) mine = mine || path == r;
  if (!mine) return false;
  if (path == "/health_generate") {
    if (!get) return send_error(*exchange, path, method_not_allowed("GET")), true;
    handle_health_generate(req, std::move(exchange));
    return true;
  }
  if (!authorized(req)) {
    send_error(*exchange, path, ApiError::unauthorized("missing or invalid API key: send 'Authorization: Bearer <key>'"));
    return true;
  }
  if (path == "/generate") {
    if (!post) return send_error(*exchange, path, method_not_allowed("POST")), true;
    handle_sglang_generate(req, std::move(exchange));
    return true;
  }
  if (path == "/get_model_info") {
    if (!get) return send_error(*exchange, path, method_not_allowed("GET")), true;
    json prefs = json::object();
    if (defaults_.temperature) prefs["temperature"] = json_float(*defaults_.temperature);
    if (defaults_.top_p) prefs["top_p"] = json_float(*defaults_.top_p);
    if (defaults_.top_k) prefs["top_k"] = *defaults_.top_k;
    if (defaults_.min_p) prefs["min_p"] = json_float(*defaults_.min_p);
    if (defaults_.repetition_penalty) prefs["repetition_penalty"] = json_float(*defaults_.repetition_penalty);
    send_json(*exchange, path,
              {{"model_path", config_.model_path.empty() ? config_.served_model_name : config_.model_path},
               {"tokenizer_path", config_.model_path.empty() ? config_.served_model_name : config_.model_path},
               {"served_model_name", config_.served_model_name},
               {"is_generation", true},
               {"context_length", engine_.context_length()},
               {"vocab_size", tokenizer_.vocab_size()},
               {"eos_token_ids", defaults_.eos_token_ids},
               {"preferred_sampling_params", prefs.empty() ? json(nullptr) : prefs},
               {"weight_version", "default"},
               {"has_image_understanding", false},
               {"has_audio_understanding", false}});
    return true;
  }
  if (path == "/get_load") {
    if (!get) return send_error(*exchange, path, method_not_allowed("GET")), true;
    // As SGLang: one entry per data-parallel replica (scheduler), each with its dp_rank.
    std::vector<EngineStats> replicas = engine_.replica_stats();
    if (replicas.empty()) replicas.push_back(engine_.stats());
    json load = json::array();
    for (std::size_t rank = 0; rank < replicas.size(); ++rank) {
      const EngineStats& st = replicas[rank];
      load.push_back({{"dp_rank", static_cast<int>(rank)},
                      {"num_reqs", st.requests_running + st.requests_waiting},
                      {"num_running_reqs", st.requests_running},
                      {"num_waiting_reqs", st.requests_waiting},
                      {"num_tokens", st.kv_tokens_used}});
    }
    send_json(*exchange, path, load);
    return true;
  }
  if (path == "/flush_cache") {
    if (!post && !get) return send_error(*exchange, path, method_not_allowed("GET, POST")), true;
    if (!engine_.flush_cache())
      return send_error(*exchange, path,
                        ApiError::bad_request("the prefix cache cannot be flushed while requests are running or waiting",
                                              "", "requests_running")), true;
    send_json(*exchange, path, {{"success", true}, {"message", "Cache flushed."}});
    return true;
  }
  // The rest take a JSON body.
  if (!post) return send_error(*exchange, path, method_not_allowed("POST")), true;
  json body;
  if (auto e = parse_body(req, body)) return send_error(*exchange, path, *e), true;
  if (!body.is_object()) return send_error(*exchange, path, ApiError::bad_request("the request body must be a JSON object")), true;
  if (path == "/abort_request") {
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (it.key() == "finished_reason" || it.key() == "abort_message")
        return send_error(*exchange, path,
                          ApiError::bad_request("'" + it.key() + "' is not supported: an aborted request ends with "
                                                "finish_reason abort (message \"aborted\")",
                                                it.key())), true;
      if (it.key() != "rid" && it.key() != "abort_all")
        return send_error(*exchange, path, ApiError::bad_request("unrecognized request field '" + it.key() + "'", it.key(),
                                                                 "unrecognized_field")), true;
    }
    JsonFields f{body, std::nullopt};
    const bool all = f.boolean("abort_all").value_or(false);
    f.string("rid");
    if (f.err) return send_error(*exchange, path, *f.err), true;
    const std::string rid = body.contains("rid") && body["rid"].is_string() ? body["rid"].get<std::string>() : "";
    if (!all && rid.empty())
      return send_error(*exchange, path, ApiError::bad_request("give 'rid' (or 'abort_all': true)", "rid")), true;
    const int n = registry_.abort(rid, all);
    send_json(*exchange, path, {{"success", true}, {"aborted", n}});
    return true;
  }
  if (path == "/tokenize" || path == "/v1/tokenize") {
    for (auto it = body.begin(); it != body.end(); ++it) {
      static const char* kKnown[] = {"model", "prompt", "messages", "add_special_tokens", "return_token_strs",
                                     "add_generation_prompt", "chat_template_kwargs", "tools"};
      bool ok = false;
      for (const char* k : kKnown) ok = ok || it.key() == k;
      if (!ok)
        return send_error(*exchange, path, ApiError::bad_request("unrecognized request field '" + it.key() + "'", it.key(),
                                                                 "unrecognized_field")), true;
    }
    JsonFields f{body, std::nullopt};
    f.string("model");
    const bool strs = f.boolean("return_token_strs").value_or(false);
    // vLLM: add_special_tokens adds the tokenizer's BOS/EOS (its post-processor); the supported
    // tokenizers (byte-level BPE, Qwen's) add none, so both values encode alike. Special tokens in
    // the text are read as such either way (it once turned that off).
    (void)f.boolean("add_special_tokens");
    const bool gen_prompt = f.boolean("add_generation_prompt").value_or(true);
    if (f.err) return send_error(*exchange, path, *f.err), true;
    auto one = [&](const std::string& text) {
      std::vector<TokenId> ids = tokenizer_.encode(text, true);
      json r = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.context_length()}};
      if (strs) {
        json s = json::array();
        for (TokenId id : ids) s.push_back(tokenizer_.token_string(id));  // convert_ids_to_tokens
        r["token_strs"] = s;
      }
      return r;
    };
    if (body.contains("messages") && body.contains("prompt"))
      return send_error(*exchange, path, ApiError::bad_request("give 'prompt' or 'messages', not both", "prompt")), true;
    if (body.contains("messages")) {
      // vLLM: the chat template applied to messages.
      json chat_body = {{"messages", body["messages"]}};
      if (body.contains("tools")) chat_body["tools"] = body["tools"];
      if (body.contains("chat_template_kwargs")) chat_body["chat_template_kwargs"] = body["chat_template_kwargs"];
      OpenAiRequest chat;
      if (auto e = parse_chat_request(chat_body, defaults_, chat)) return send_error(*exchange, path, *e), true;
      if (!gen_prompt) chat.template_kwargs["add_generation_prompt"] = false;
      auto text = render_chat_ ? render_chat_(chat.messages, chat.tools, chat.template_kwargs)
                               : Result<std::string>(error("no chat template"));
      if (!text) return send_error(*exchange, path, ApiError::bad_request("chat template: " + text.status().message(), "messages")), true;
      send_json(*exchange, path, one(*text));
      return true;
    }
    if (!body.contains("prompt")) return send_error(*exchange, path, ApiError::bad_request("'prompt' is required", "prompt")), true;
    // The chat fields act on messages only.
    for (const char* k : {"tools", "chat_template_kwargs", "add_generation_prompt"})
      if (body.contains(k))
        return send_error(*exchange, path, ApiError::bad_request("'" + std::string(k) + "' applies to 'messages', not to 'prompt'", k)), true;
    const json& p = body["prompt"];
    if (p.is_string()) {
      send_json(*exchange, path, one(p.get<std::string>()));
      return true;
    }
    if (p.is_array()) {
      json tokens = json::array(), counts = json::array(), token_strs = json::array();
      for (const auto& x : p) {
        if (!x.is_string())
          return send_error(*exchange, path, ApiError::bad_request("'prompt' must be a string or a list of strings", "prompt")), true;
        json r = one(x.get<std::string>());
        tokens.push_back(r["tokens"]);
        counts.push_back(r["count"]);
        if (strs) token_strs.push_back(r["token_strs"]);
      }
      json out = {{"tokens", tokens}, {"count", counts}, {"max_model_len", engine_.context_length()}};
      if (strs) out["token_strs"] = token_strs;
      send_json(*exchange, path, out);
      return true;
    }
    return send_error(*exchange, path, ApiError::bad_request("'prompt' must be a string or a list of strings", "prompt")), true;
  }
  // /detokenize
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() != "model" && it.key() != "tokens" && it.key() != "skip_special_tokens")
      return send_error(*exchange, path, ApiError::bad_request("unrecognized request field '" + it.key() + "'", it.key(),
                                                               "unrecognized_field")), true;
  }
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return send_error(*exchange, path, ApiError::bad_request("'tokens' must be a list of token ids", "tokens")), true;
  JsonFields f{body, std::nullopt};
  f.string("model");
  const bool skip = f.boolean("skip_special_tokens").value_or(false);
  if (f.err) return send_error(*exchange, path, *f.err), true;
  auto decode = [&](const json& list, std::string& out) -> std::optional<ApiError> {
    std::vector<TokenId> ids;
    for (const auto& x : list) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tokenizer_.vocab_size())
        return ApiError::bad_request("'tokens' must hold token ids of the vocabulary (0.." +
                                         std::to_string(tokenizer_.vocab_size() - 1) + ")",
                                     "tokens");
      ids.push_back(x.get<TokenId>());
    }
    out = tokenizer_.decode(ids, skip);
    return std::nullopt;
  };
  const json& t = body["tokens"];
  if (!t.empty() && t[0].is_array()) {
    json texts = json::array();
    for (const auto& list : t) {
      if (!list.is_array())
        return send_error(*exchange, path, ApiError::bad_request("'tokens' must be a list of token ids, or a list of such lists",
                                                                 "tokens")), true;
      std::string text;
      if (auto e = decode(list, text)) return send_error(*exchange, path, *e), true;
      texts.push_back(text);
    }
    send_json(*exchange, path, {{"text", texts}});
    return true;
  }
  std::string text;
  if (auto e = decode(t, text)) return send_error(*exchange, path, *e), true;
  send_json(*exchange, path, {{"text", text}});
  return true;
}

}  // namespace deltaserve
