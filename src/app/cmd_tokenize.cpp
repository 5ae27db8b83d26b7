// `deltaserve tokenize`: encode one text with a model directory's tokenizer and print the ids as
// one JSON line, {"ids": [1, 2, 3]}, for comparison with HF `tokenizer.encode`.
#include <cstdio>
#include <string>

#include "app/cli_args.h"
#include "app/commands.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {

namespace {

void print_help() {
  std::printf(
      "usage: deltaserve tokenize --model DIR --text TEXT [--no-special]\n\n"
      "  --model DIR     directory with tokenizer.json (and optionally tokenizer_config.json)\n"
      "  --text TEXT     text to encode (special tokens such as <|im_start|> are recognised)\n"
      "  --no-special    encode special tokens as plain text (HF split_special_tokens=True)\n");
}

}  // namespace

int cmd_tokenize(const Args& args) {
  CliArgs cli({"model", "text"}, {"help", "no-special"});
  if (Status s = cli.parse(args); !s) {
    std::fprintf(stderr, "deltaserve tokenize: %s\n", s.message().c_str());
    return 2;
  }
  if (cli.flag("help")) {
    print_help();
    return 0;
  }
  const auto model = cli.get("model");
  const auto text = cli.get("text");
  if (!model || !text) {
    std::fprintf(stderr, "deltaserve tokenize: --model and --text are required\n");
    return 2;
  }
  auto tokenizer = Tokenizer::load(*model);
  if (!tokenizer) {
    std::fprintf(stderr, "deltaserve tokenize: %s\n", tokenizer.status().message().c_str());
    return 1;
  }
  const auto ids = tokenizer->encode(*text, /*parse_special=*/!cli.flag("no-special"));
  std::string out = "{\"ids\": [";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace deltaserve
