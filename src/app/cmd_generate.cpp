// deltaserve generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N
//     [--temperature T --top-p P --top-k K --min-p M --seed S] [--ignore-eos] [--json]
//     [--speculative-algorithm NEXTN --speculative-num-steps K ...] [--threads N] [--device cpu|cuda]
// Runs prefill then token-by-token decode through the same Engine the server uses.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli_args.h"
#include "app/commands.h"
#include "options/serve_options.h"
#include "engine/engine.h"
#include "engine/model_setup.h"
#include "model/generation_config.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

namespace deltaserve {

namespace {

int fail(const std::string& msg, int code) {
  std::fprintf(stderr, "deltaserve generate: %s\n", msg.c_str());
  return code;
}

const char* kUsage =
    "usage: deltaserve generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]\n"
    "         [--temperature T] [--top-p P] [--top-k K] [--min-p M] [--seed S] [--ignore-eos] [--json]\n"
    "         [--speculative-algorithm NEXTN] [--speculative-num-steps K] [--speculative-eagle-topk 1]\n"
    "         [--speculative-num-draft-tokens K+1] [--threads N] [--device cpu|cuda] [--load-format auto|dummy]\n"
    "         [--context-length N]\n";

}  // namespace

int cmd_generate(const Args& args) {
  CliArgs cli({"model", "model-path", "prompt", "prompt-ids", "max-tokens", "temperature", "top-p", "top-k", "min-p",
               "seed", "threads", "device", "load-format", "context-length", "speculative-algorithm",
               "speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"},
              {"ignore-eos", "json", "help"});
  if (Status s = cli.parse(args); !s) return fail(s.message(), 2);
  if (cli.flag("help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (cli.has("prompt") == cli.has("prompt-ids")) return fail("give exactly one of --prompt or --prompt-ids", 2);

  EngineConfig ec;
  ec.model_dir = cli.get("model-path").value_or(cli.get_or("model", default_model_dir()));
  const std::string device = cli.get_or("device", "cpu");
  if (device != "cpu" && device != "cuda") return fail("--device: expected cpu or cuda, got '" + device + "'", 2);
  ec.device = device == "cuda" ? Device::Cuda : Device::Cpu;
  const std::string load_format = cli.get_or("load-format", "auto");
  if (load_format != "auto" && load_format != "dummy" && load_format != "safetensors")
    return fail("--load-format: expected auto, safetensors or dummy", 2);
  ec.dummy_weights = load_format == "dummy";
  if (auto v = cli.get("threads")) {
    auto n = parse_int("threads", *v);
    if (!n || *n < 0 || *n > 1024) return fail(n ? "--threads: out of range" : n.status().message(), 2);
    ec.n_threads = static_cast<int>(*n);
  }
  if (auto v = cli.get("context-length")) {
    auto n = parse_int("context-length", *v);
    if (!n || *n < 2) return fail(n ? "--context-length: must be at least 2" : n.status().message(), 2);
    ec.context_length = *n;
  }
  // Speculative flags: the same table and validation as `serve`.
  ServeOptions spec_opts;
  for (const char* f : {"speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
                        "speculative-num-draft-tokens"})
    if (auto v = cli.get(f))
      if (Status s = set_serve_option(spec_opts, f, *v); !s) return fail(s.message(), 2);
  if (Status s = validate_serve_options(spec_opts); !s) return fail(s.message(), 2);
  ec.spec_num_steps = spec_opts.speculative_enabled() ? static_cast<int>(spec_opts.speculative_num_steps) : 0;
  ec.max_running_requests = 1;

  auto gen = load_generation_defaults(ec.model_dir);
  if (!gen) return fail(gen.status().message(), 1);
  ec.extra_eos_token_ids = gen->eos_token_ids;

  SamplingParams sp;
  sp.temperature = gen->temperature.value_or(1.0f);
  sp.top_p = gen->top_p.value_or(1.0f);
  sp.top_k = gen->top_k.value_or(-1);
  sp.min_p = gen->min_p.value_or(0.0f);
  sp.repetition_penalty = gen->repetition_penalty.value_or(1.0f);
  sp.max_tokens = 16;
  sp.ignore_eos = cli.flag("ignore-eos");
  struct FloatFlag { const char* name; float* dst; float lo, hi; };
  for (FloatFlag f : {FloatFlag{"temperature", &sp.temperature, 0.f, 100.f}, FloatFlag{"top-p", &sp.top_p, 1e-6f, 1.f},
                      FloatFlag{"min-p", &sp.min_p, 0.f, 1.f}}) {
    if (auto v = cli.get(f.name)) {
      auto x = parse_double(f.name, *v);
      if (!x) return fail(x.status().message(), 2);
      if (*x < f.lo || *x > f.hi) return fail(str_cat("--", f.name, ": ", *v, " is outside [", f.lo, ", ", f.hi, "]"), 2);
      *f.dst = static_cast<float>(*x);
    }
  }
  if (auto v = cli.get("top-k")) {
    auto x = parse_int("top-k", *v);
    if (!x) return fail(x.status().message(), 2);
    sp.top_k = static_cast<int>(*x);
  }
  if (auto v = cli.get("max-tokens")) {
    auto x = parse_int("max-tokens", *v);
    if (!x || *x < 1) return fail(x ? "--max-tokens: must be at least 1" : x.status().message(), 2);
    sp.max_tokens = static_cast<int>(std::min<long long>(*x, 1 << 30));
  }
  if (auto v = cli.get("seed")) {
    auto x = parse_int("seed", *v);
    if (!x) return fail(x.status().message(), 2);
    sp.seed = static_cast<uint64_t>(*x);
  }

  std::optional<Tokenizer> tokenizer;
  if (auto t = Tokenizer::load(ec.model_dir); t) tokenizer = std::move(*t);
  std::vector<int32_t> prompt;
  if (auto text = cli.get("prompt")) {
    if (!tokenizer) return fail(str_cat("--prompt needs a tokenizer in ", ec.model_dir.string(), " (use --prompt-ids)"), 1);
    prompt = tokenizer->encode(*text);
  } else {
    auto ids = parse_int_list("prompt-ids", *cli.get("prompt-ids"));
    if (!ids) return fail(ids.status().message(), 2);
    prompt.assign(ids->begin(), ids->end());
  }
  if (ec.context_length == 0)
    ec.context_length = std::max<int64_t>(int64_t(prompt.size()) + sp.max_tokens + 1, 16);
  ec.kv_tokens = ec.context_length + 64;
  ec.max_prefill_tokens = std::max<int>(2048, static_cast<int>(prompt.size()));
  ec.chunked_prefill_size = ec.max_prefill_tokens;

  auto engine = Engine::create(ec);
  if (!engine) return fail(engine.status().message(), 1);
  Engine& e = **engine;
  e.start();
  GenerateRequest req;
  req.id = e.next_request_id();
  req.prompt = prompt;
  req.sampling = sp;
  const double t0 = now_seconds();
  auto stream = e.submit(std::move(req));
  std::vector<int32_t> out;
  double t_first = 0;
  TokenEvent last;
  while (auto ev = stream->events.pop()) {
    if (!ev->tokens.empty() && out.empty()) t_first = now_seconds();
    out.insert(out.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->finish != FinishReason::None) {
      last = std::move(*ev);
      break;
    }
  }
  const double t_end = now_seconds();
  e.stop();
  if (last.finish == FinishReason::Error) return fail(last.error, 1);

  const double prefill_s = t_first > 0 ? t_first - t0 : t_end - t0;
  const double decode_s = t_first > 0 ? t_end - t_first : 0.0;
  const int decode_tokens = out.empty() ? 0 : static_cast<int>(out.size()) - 1;
  const std::string text = tokenizer ? tokenizer->decode(out, /*skip_special=*/true) : "";
  if (cli.flag("json")) {
    nlohmann::json j;
    j["token_ids"] = out;
    j["text"] = text;
    j["prompt_tokens"] = prompt.size();
    j["completion_tokens"] = out.size();
    j["finish_reason"] = finish_reason_name(last.finish);
    j["prefill_seconds"] = prefill_s;
    j["decode_seconds"] = decode_s;
    j["decode_tokens_per_second"] = decode_s > 0 ? decode_tokens / decode_s : 0.0;
    j["prefill_tokens_per_second"] = prefill_s > 0 ? double(prompt.size()) / prefill_s : 0.0;
    if (ec.spec_num_steps > 0) j["accept_length"] = last.accept_length;
    j["speculative_num_steps"] = ec.spec_num_steps;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", tokenizer ? text.c_str() : "");
    std::fprintf(stderr, "prompt %zu tokens, generated %zu (%s); prefill %.3f s, decode %.1f tok/s%s\n",
                 prompt.size(), out.size(), finish_reason_name(last.finish), prefill_s,
                 decode_s > 0 ? decode_tokens / decode_s : 0.0,
                 ec.spec_num_steps > 0 ? str_cat(", accept length ", last.accept_length).c_str() : "");
  }
  return 0;
}

}  // namespace deltaserve
