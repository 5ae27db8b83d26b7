// Test support for the HTTP layer: a scripted fake EngineService (own thread, one token per tick),
// a blocking HTTP/1.1 client over a raw socket, and an SSE reader.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_service.h"

namespace deltaserve::testing {

// Emits `script` (token ids) one per tick for each request, up to max_tokens, then Stop (or Length).
// With `script_for` set, each request gets its own script (e.g. derived from its prompt).
// A request with a TokenConstraint (and `vocab` set) samples like the real engine's sampling path
// would with logits that favour the script: logits 0, the script's token 10, then the
// constraint's apply(); the argmax is emitted and accept()ed, and a token in `eos` ends it (Stop).
class FakeEngine final : public EngineService {
 public:
  std::vector<TokenId> script;
  std::function<std::vector<TokenId>(const GenerateRequest&)> script_for;
  std::chrono::milliseconds tick{1};
  int64_t context = 256;
  // Every request is refused with this kind (None: served). Overloaded says "queue is full".
  EngineErrorKind reject_kind = EngineErrorKind::None;
  bool with_logprobs = true;
  int64_t vocab = 0;                 // logits row size for constrained requests (0: ignore constraints)
  std::vector<TokenId> eos;          // constrained requests stop on these
  int cached = 0;                    // prompt tokens reported as served from the prefix cache
  bool top_skips_sampled = false;    // top logprobs are the ids after the sampled one
  std::atomic<int> constraint_rejects{0};  // accept() refusals (must stay 0)
  // Scheduling: at most this many requests (the oldest ids) make progress per tick (0: all), as
  // the engine's --max-running-requests; the rest wait. hang: no step runs at all (a stuck engine).
  std::atomic<int> max_running{0};
  std::atomic<bool> hang{false};
  // Data parallelism: what replica_stats() reports (empty: one engine).
  std::vector<EngineStats> replicas;

  FakeEngine() : thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> l(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::shared_ptr<RequestStream> submit(GenerateRequest request) override {
    auto stream = std::make_shared<RequestStream>();
    stream->id = request.id;
    if (reject_kind != EngineErrorKind::None) {
      TokenEvent ev;
      ev.finish = FinishReason::Error;
      ev.error_kind = reject_kind;
      ev.error = std::string(engine_error_kind_name(reject_kind)) +
                 (reject_kind == EngineErrorKind::Overloaded ? ": request queue is full; retry later" : "");
      stream->events.push(std::move(ev));
      stream->events.close();
      return stream;
    }
    std::lock_guard<std::mutex> l(mutex_);
    std::vector<TokenId> own = script_for ? script_for(request) : std::vector<TokenId>{};
    live_[request.id] = Live{stream, std::move(request), 0, std::move(own), script_for != nullptr};
    submitted_.push_back(live_[request.id].request);
    cv_.notify_all();
    return stream;
  }
  void cancel(RequestId id) override {
    std::lock_guard<std::mutex> l(mutex_);
    cancelled_.insert(id);
    cv_.notify_all();
  }
  RequestId next_request_id() override { return next_id_.fetch_add(1); }
  // As the engine: the cache empties only when nothing runs.
  bool flush_cache() override {
    std::lock_guard<std::mutex> l(mutex_);
    ++flushes;
    return live_.empty();
  }
  int flushes = 0;
  EngineStats stats() const override {
    std::lock_guard<std::mutex> l(mutex_);
    EngineStats s;
    s.requests_running = static_cast<int>(live_.size());
    s.kv_tokens_used = 0;
    for (const auto& [id, live] : live_) {
      s.kv_tokens_used += static_cast<int64_t>(live.request.prompt.size()) + live.n_emitted;
    }
    s.state_slots_used = static_cast<int>(live_.size());
    s.generated_tokens_total = generated_;
    s.preemptions_total = 3;  // a figure the engine reports, passed on as it is
    s.steps_total = steps_;
    if (const int cap = max_running.load(); cap > 0 && s.requests_running > cap) {
      s.requests_waiting = s.requests_running - cap;
      s.requests_running = cap;
    }
    return s;
  }
  std::vector<EngineStats> replica_stats() const override {
    std::lock_guard<std::mutex> l(mutex_);
    return replicas;
  }
  int64_t context_length() const override { return context; }

  int n_live() const {
    std::lock_guard<std::mutex> l(mutex_);
    return static_cast<int>(live_.size());
  }
  std::set<RequestId> cancelled() const {
    std::lock_guard<std::mutex> l(mutex_);
    return cancelled_;
  }
  std::vector<GenerateRequest> submitted() const {
    std::lock_guard<std::mutex> l(mutex_);
    return submitted_;
  }

 private:
  struct Live {
    std::shared_ptr<RequestStream> stream;
    GenerateRequest request;
    int n_emitted = 0;
    std::vector<TokenId> own_script;
    bool has_own = false;
    const std::vector<TokenId>& script_of(const FakeEngine& e) const {
      return has_own ? own_script : e.script;
    }
  };

  void loop() {
    std::unique_lock<std::mutex> l(mutex_);
    while (!stop_) {
      if (live_.empty()) {
        cv_.wait(l, [&] { return stop_ || !live_.empty(); });
        continue;
      }
      l.unlock();
      std::this_thread::sleep_for(tick);
      l.lock();
      if (hang.load()) continue;
      ++steps_;
      std::vector<RequestId> done;
      int served = 0;
      for (auto& [id, live] : live_) {
        if (const int cap = max_running.load(); cap > 0 && served++ >= cap && !cancelled_.count(id)) continue;
        TokenEvent ev;
        if (cancelled_.count(id)) {
          ev.finish = FinishReason::Abort;
        } else {
          const std::vector<TokenId>& sc = live.script_of(*this);
          TokenId tok = live.n_emitted < static_cast<int>(sc.size()) ? sc[live.n_emitted] : 0;
          bool constrained_end = false;
          if (live.request.constraint && vocab > 0) {
            TokenConstraint& c = *live.request.constraint;
            std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
            if (tok < vocab) logits[static_cast<size_t>(tok)] = 10.0f;
            if (c.active(live.n_emitted)) c.apply(logits.data(), vocab, live.n_emitted);
            tok = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            if (!c.accept(tok)) ++constraint_rejects;
            constrained_end = std::find(eos.begin(), eos.end(), tok) != eos.end();
          }
          ev.tokens.push_back(tok);
          if (with_logprobs && live.request.sampling.top_logprobs >= 0) {
            TokenLogprob lp;
            lp.token = tok;
            lp.logprob = -0.5f;
            for (int k = 0; k < live.request.sampling.top_logprobs; ++k)
              lp.top.push_back({tok + k + (top_skips_sampled ? 1 : 0), -0.5f - k});
            ev.logprobs.push_back(lp);
          }
          ++live.n_emitted;
          ++generated_;
          if (constrained_end) {
            ev.finish = FinishReason::Stop;
          } else if (live.n_emitted >= live.request.sampling.max_tokens) {
            ev.finish = FinishReason::Length;
          } else if (live.n_emitted >= static_cast<int>(sc.size()) && !(live.request.constraint && vocab > 0)) {
            ev.finish = FinishReason::Stop;
          }
        }
        // As the engine: every event carries the prompt's counts.
        ev.n_prompt_tokens = static_cast<int>(live.request.prompt.size());
        ev.n_cached_tokens = std::min(cached, ev.n_prompt_tokens);
        if (ev.finish != FinishReason::None) {
          ev.n_generated_tokens = live.n_emitted;
          done.push_back(id);
        }
        live.stream->events.push(std::move(ev));
      }
      for (RequestId id : done) {
        live_[id].stream->events.close();
        live_.erase(id);
      }
    }
    for (auto& [id, live] : live_) {
      TokenEvent ev;
      ev.finish = FinishReason::Abort;
      live.stream->events.push(std::move(ev));
      live.stream->events.close();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<RequestId, Live> live_;
  std::set<RequestId> cancelled_;
  std::vector<GenerateRequest> submitted_;
  uint64_t generated_ = 0;
  uint64_t steps_ = 0;
  bool stop_ = false;
  std::atomic<RequestId> next_id_{1};
  std::thread thread_;
};

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

inline int connect_local(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline void send_all(int fd, const std::string& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

inline std::string build_request(const std::string& method, const std::string& path,
                                 const std::string& body,
                                 const std::vector<std::string>& extra_headers = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : extra_headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

inline std::string dechunk(const std::string& raw) {
  std::string out;
  std::size_t pos = 0;
  while (pos < raw.size()) {
    std::size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    std::size_t size = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (size == 0) break;
    out += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return out;
}

inline HttpResult parse_response(const std::string& raw) {
  HttpResult r;
  std::size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return r;
  std::string head = raw.substr(0, head_end);
  r.status = std::stoi(head.substr(9, 3));
  std::size_t pos = head.find("\r\n");
  while (pos != std::string::npos) {
    std::size_t next = head.find("\r\n", pos + 2);
    std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[name] = line.substr(colon + 2);
    }
    pos = next;
  }
  std::string body = raw.substr(head_end + 4);
  r.body = r.headers["transfer-encoding"] == "chunked" ? dechunk(body) : body;
  return r;
}

// Everything the socket delivers until the peer closes (or the receive timeout).
inline std::string read_all(int fd) {
  std::string raw;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<std::size_t>(n));
  }
  return raw;
}

inline void set_recv_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// `request` (raw bytes) on a new connection: everything the server sends until it closes.
inline std::string raw_exchange(int port, const std::string& request) {
  int fd = connect_local(port);
  if (fd < 0) return {};
  send_all(fd, request);
  std::string raw = read_all(fd);
  ::close(fd);
  return raw;
}

inline HttpResult http(int port, const std::string& method, const std::string& path,
                       const std::string& body = "",
                       const std::vector<std::string>& extra_headers = {}) {
  return parse_response(raw_exchange(port, build_request(method, path, body, extra_headers)));
}

// "data: ..." payloads of an SSE body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    std::size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

}  // namespace deltaserve::testing
