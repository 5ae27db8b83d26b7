// `deltaserve token-map`: a draft vocabulary for --speculative-token-map from a corpus: the
// model's tokenizer encodes every file under --corpus, and the --size most frequent tokens are
// written as a JSON array (most frequent first). The share of the corpus's tokens the map covers
// is printed: drafts of tokens outside it are lost, so it bounds what a draft can propose.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "app/cli_args.h"
#include "app/commands.h"
#include "tokenizer/tokenizer.h"

namespace deltaserve {

namespace {

void print_help() {
  std::printf(
      "usage: deltaserve token-map --model DIR --corpus PATH --size N --out FILE\n\n"
      "  --model DIR     directory with tokenizer.json (the model the map is for)\n"
      "  --corpus PATH   a text file, or a directory whose files (recursively) are read\n"
      "  --size N        tokens in the map (SGLang's FR-Spec maps hold 32768 of Qwen's 248k)\n"
      "  --out FILE      where the JSON array of token ids is written\n");
}

int fail(int code, const std::string& msg) {
  std::fprintf(stderr, "deltaserve token-map: %s\n", msg.c_str());
  return code;
}

}  // namespace

int cmd_token_map(const Args& args) {
  CliArgs cli({"model", "corpus", "size", "out"}, {"help"});
  if (Status s = cli.parse(args); !s) return fail(2, s.message());
  if (cli.flag("help")) {
    print_help();
    return 0;
  }
  const auto model = cli.get("model"), corpus = cli.get("corpus"), size_text = cli.get("size"), out = cli.get("out");
  if (!model || !corpus || !size_text || !out) return fail(2, "--model, --corpus, --size and --out are required");
  int64_t size = 0;
  try {
    std::size_t used = 0;
    size = std::stoll(*size_text, &used);
    if (used != size_text->size()) size = 0;
  } catch (...) {
    size = 0;
  }
  if (size < 1) return fail(2, "--size must be a positive integer (got '" + *size_text + "')");
  auto tokenizer = Tokenizer::load(*model);
  if (!tokenizer) return fail(1, tokenizer.status().message());

  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(*corpus, ec)) {
    for (auto it = fs::recursive_directory_iterator(*corpus, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_regular_file()) files.push_back(it->path());
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(*corpus, ec)) {
    files.push_back(*corpus);
  }
  if (files.empty()) return fail(1, "--corpus " + *corpus + ": no file to read there");

  std::vector<int64_t> count(static_cast<std::size_t>(tokenizer->vocab_size()), 0);
  int64_t total = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    for (int32_t id : tokenizer->encode(ss.str(), /*parse_special=*/false)) {
      if (id >= 0 && static_cast<std::size_t>(id) < count.size()) ++count[static_cast<std::size_t>(id)];
      ++total;
    }
  }
  if (total == 0) return fail(1, "--corpus " + *corpus + ": the files hold no text");
  std::vector<int32_t> ids;
  for (std::size_t i = 0; i < count.size(); ++i)
    if (count[i] > 0) ids.push_back(static_cast<int32_t>(i));
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return count[a] > count[b]; });
  if (static_cast<int64_t>(ids.size()) > size) ids.resize(static_cast<std::size_t>(size));
  int64_t covered = 0;
  for (int32_t id : ids) covered += count[static_cast<std::size_t>(id)];

  std::ofstream o(*out, std::ios::binary);
  if (!o) return fail(1, "--out " + *out + ": cannot write the file");
  o << "[";
  for (std::size_t i = 0; i < ids.size(); ++i) o << (i ? (i % 16 ? ", " : ",\n ") : "") << ids[i];
  o << "]\n";
  if (!o) return fail(1, "--out " + *out + ": write failed");
  std::printf("wrote %zu tokens to %s: %.2f%% of the %lld tokens in %zu files under %s\n", ids.size(), out->c_str(),
              100.0 * double(covered) / double(total), static_cast<long long>(total), files.size(), corpus->c_str());
  return 0;
}

}  // namespace deltaserve
