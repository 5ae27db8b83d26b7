// deltaserve logits --model DIR --tokens 1,2,3 --out FILE.safetensors [--mtp] [--threads N] [--tp-size N]
// Writes f32 `logits` [T, vocab] for every position and, with --mtp, `mtp_logits` [T-1, vocab]
// teacher-forced: row p feeds (t_{p+1}, h_p) at position p, predicting t_{p+2}.
#include <cstdio>
#include <vector>

#include "app/cli_args.h"
#include "app/commands.h"
#include "engine/model_setup.h"
#include "options/serve_options.h"
#include "engine/model_runner.h"
#include "model/safetensors.h"

namespace deltaserve {

int cmd_logits(const Args& args) {
  CliArgs cli({"model", "tokens", "out", "threads", "device", "tp-size"}, {"mtp", "help"});
  if (Status s = cli.parse(args); !s) {
    std::fprintf(stderr, "deltaserve logits: %s\n", s.message().c_str());
    return 2;
  }
  if (cli.flag("help") || !cli.get("tokens") || !cli.get("out")) {
    std::fprintf(cli.flag("help") ? stdout : stderr,
                 "usage: deltaserve logits --model DIR --tokens 1,2,3 --out FILE.safetensors [--mtp] [--threads N]\n"
                 "                        [--device cpu|cuda] [--tp-size N]\n");
    return cli.flag("help") ? 0 : 2;
  }
  auto tokens = parse_int_list("tokens", *cli.get("tokens"));
  if (!tokens) {
    std::fprintf(stderr, "deltaserve logits: %s\n", tokens.status().message().c_str());
    return 2;
  }
  const bool want_mtp = cli.flag("mtp");
  auto threads = parse_int("threads", cli.get_or("threads", "0"));
  if (!threads || *threads < 0 || *threads > kMaxThreads) {
    std::fprintf(stderr, "deltaserve logits: %s\n",
                 threads ? str_cat("--threads must be 0..", kMaxThreads, " (0: all usable CPUs)").c_str()
                         : threads.status().message().c_str());
    return 2;
  }
  auto tp = parse_int("tp-size", cli.get_or("tp-size", "1"));
  if (!tp || *tp < 1 || *tp > 64) {
    std::fprintf(stderr, "deltaserve logits: --tp-size must be 1..64\n");
    return 2;
  }
  const int T = static_cast<int>(tokens->size());
  SetupOptions opt;
  opt.model_dir = cli.get_or("model", default_model_dir());
  opt.n_threads = static_cast<int>(*threads);
  opt.device = cli.get_or("device", "cpu");
  opt.tp_size = static_cast<int>(*tp);
  opt.pending_depth = want_mtp ? 1 : 0;  // keeps the main model's hidden states for the MTP head
  auto setup = ModelSetup::create(opt, /*max_tokens=*/T, /*max_seqs=*/1, /*max_context=*/T + 1,
                                  /*max_logit_rows=*/T);
  if (!setup) {
    std::fprintf(stderr, "deltaserve logits: %s\n", setup.status().message().c_str());
    return 1;
  }
  ModelSetup& m = **setup;
  const int64_t V = m.model->config().vocab_size;
  for (int t : *tokens)
    if (t < 0 || t >= V) {
      std::fprintf(stderr, "deltaserve logits: token id %d out of range [0, %lld)\n", t, (long long)V);
      return 2;
    }
  if (want_mtp && !m.model->has_mtp()) {
    std::fprintf(stderr, "deltaserve logits: --mtp: the model has no MTP head\n");
    return 2;
  }
  std::vector<int32_t> blocks;
  int slot = m.cache->acquire_slot();
  DS_CHECK(slot >= 0, "no state slot");
  DS_CHECK(m.cache->blocks().allocate(m.blocks_for(T), blocks), "no KV blocks");

  RunItem item{*tokens, 0, blocks, slot, /*logits_all=*/true, false};
  m.runner->run(std::span<const RunItem>(&item, 1));
  std::vector<float> logits(m.runner->logits(0), m.runner->logits(0) + int64_t(T) * V);

  std::vector<NamedF32> out{{"logits", {T, V}, logits.data()}};
  std::vector<float> mtp_logits;
  if (want_mtp && T >= 2) {
    std::vector<int32_t> next(tokens->begin() + 1, tokens->end());
    RunItem mi{next, 0, blocks, slot, true, false};
    std::vector<int32_t> rows(T - 1);
    for (int i = 0; i < T - 1; ++i) rows[i] = i;
    m.runner->run_mtp(std::span<const RunItem>(&mi, 1), ModelRunner::HiddenFrom::Main, rows);
    mtp_logits.assign(m.runner->logits(0), m.runner->logits(0) + int64_t(T - 1) * V);
    out.push_back({"mtp_logits", {T - 1, V}, mtp_logits.data()});
  }
  if (Status s = write_safetensors_f32(*cli.get("out"), out); !s) {
    std::fprintf(stderr, "deltaserve logits: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

}  // namespace deltaserve
