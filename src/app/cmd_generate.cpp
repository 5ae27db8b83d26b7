// deltaserve generate (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N
//     [--temperature T --top-p P --top-k K --min-p M --seed S] [--ignore-eos] [--json] [serve flags]
// Runs prefill then decode through the same Engine the server uses, configured the way serve is
// (app/engine_setup.h: the flag table and the memory plan).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/cli_args.h"
#include "app/engine_setup.h"
#include "app/speculation_choice.h"
#include "app/commands.h"
#include "options/serve_options.h"
#include "engine/engine.h"
#include "engine/model_setup.h"
#include "model/generation_config.h"
#include "tokenizer/tokenizer.h"
#include "util/log.h"
#include "util/timer.h"

namespace deltaserve {

namespace {

int fail(const std::string& msg, int code) {
  std::fprintf(stderr, "deltaserve generate: %s\n", msg.c_str());
  return code;
}

const char* kUsage =
    "usage: deltaserve generate (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N]\n"
    "         [--temperature T] [--top-p P] [--top-k K] [--min-p M] [--seed S] [--ignore-eos] [--json]\n"
    "         [serve flags: --model-path DIR --device cpu|cuda --load-format dummy --context-length N\n"
    "          --speculative-algorithm NEXTN --speculative-num-steps K --threads N ...]\n"
    "Engine settings are serve's (`deltaserve serve --help`), with the same defaults and memory plan.\n";

}  // namespace

int cmd_generate(const Args& args) {
  CliArgs cli({"prompt", "prompt-ids", "max-tokens", "temperature", "top-p", "top-k", "min-p", "seed"},
              {"ignore-eos", "json", "help"});
  std::vector<std::string> serve_args;
  if (Status s = cli.parse(args, &serve_args); !s) return fail(s.message(), 2);
  if (cli.flag("help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (cli.has("prompt") == cli.has("prompt-ids")) return fail("give exactly one of --prompt or --prompt-ids", 2);
  std::vector<std::string> warnings;
  auto opts = parse_serve_options(serve_args, &warnings);
  if (!opts) return fail(opts.status().message(), 2);
  for (const auto& w : warnings) std::fprintf(stderr, "deltaserve generate: warning: %s\n", w.c_str());
  set_log_level(opts->log_level);
  if (opts->model_path.empty()) opts->model_path = default_model_dir();
  if (Status s = single_replica_only(*opts, "generate"); !s) return fail(s.message(), 2);
  auto model_config = load_model_config(opts->model_path);
  if (!model_config) return fail(model_config.status().message(), 1);
  auto setup = setup_engine(*opts, *model_config);
  if (!setup) return fail(setup.status().message(), 1);
  const EngineConfig& ec = setup->config;

  auto gen = load_generation_defaults(ec.model_dir, model_config->vocab_size);
  if (!gen) return fail(gen.status().message(), 1);

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
    auto x = parse_top_k(*v);
    if (!x) return fail(x.status().message(), 2);
    sp.top_k = *x;
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

  // --tokenizer-path as serve reads it; a tokenizer it names must load (the model's may be absent).
  std::optional<Tokenizer> tokenizer;
  if (!opts->tokenizer_path.empty()) {
    auto t = Tokenizer::load(opts->tokenizer_path);
    if (!t) return fail(str_cat("--tokenizer-path: ", t.status().message()), 1);
    tokenizer = std::move(*t);
  } else if (std::error_code fs_ec; std::filesystem::exists(ec.model_dir / "tokenizer.json", fs_ec)) {
    // The model's tokenizer is optional, but one that is there and broken is an error with its
    // reason, not "needs a tokenizer" (or EOS ids and text silently missing with --prompt-ids).
    auto t = Tokenizer::load(ec.model_dir);
    if (!t) return fail(t.status().message(), 1);
    tokenizer = std::move(*t);
  }
  std::vector<int32_t> prompt;
  if (auto text = cli.get("prompt")) {
    if (!tokenizer)
      return fail(str_cat("--prompt needs a tokenizer in ", ec.model_dir.string(), " (use --prompt-ids or --tokenizer-path)"), 1);
    prompt = tokenizer->encode(*text);
  } else {
    auto ids = parse_int_list("prompt-ids", *cli.get("prompt-ids"));
    if (!ids) return fail(ids.status().message(), 2);
    prompt.assign(ids->begin(), ids->end());
  }
  setup->config.extra_eos_token_ids =
      end_token_ids(model_config->eos_token_ids, *gen, tokenizer ? tokenizer->eos_token_id() : std::nullopt);
  auto engine = Engine::create(ec, std::move(setup->backend));
  if (!engine) return fail(engine.status().message(), 1);
  Engine& e = **engine;
  const SpeculationChoice spec_choice = choose_speculation(e, *opts);
  if (spec_choice.measured) std::fprintf(stderr, "%s\n", spec_choice.summary().c_str());
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
    j["speculative_num_steps"] = e.speculative_steps();
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
