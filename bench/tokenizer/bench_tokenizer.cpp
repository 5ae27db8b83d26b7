// Encode/decode throughput of the Qwen3 tokenizer, single thread unless noted.
//   code:  ~4 MB of C++ (this repo's src/ plus /usr/include/c++ headers, found at run time)
//   prose: ~2 MB of deterministic multilingual text (Latin, Cyrillic, CJK, Korean, Arabic,
//          numbers, emoji)
// Bytes processed are input bytes, so bytes_per_second is encode MB/s.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/mmap_file.h"

namespace deltaserve {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kCodeBytes = 4u << 20;
constexpr std::size_t kProseBytes = 2u << 20;

const Tokenizer& tokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::load(fs::path(DELTASERVE_SOURCE_DIR) / "tests/fixtures/tokenizer-qwen3");
    if (!t) {
      std::fprintf(stderr, "%s\n", t.status().message().c_str());
      std::exit(1);
    }
    return new Tokenizer(std::move(*t));
  }();
  return *tok;
}

void append_tree(const fs::path& root, std::string& out, std::size_t limit) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return;
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());  // deterministic corpus
  for (const auto& f : files) {
    if (out.size() >= limit) return;
    auto text = read_text_file(f);
    if (text) out += *text;
  }
}

const std::string& code_corpus() {
  static const std::string corpus = [] {
    std::string s;
    append_tree(fs::path(DELTASERVE_SOURCE_DIR) / "src", s, kCodeBytes);
    for (const char* dir : {"/usr/include/c++"}) append_tree(dir, s, kCodeBytes);
    if (s.size() > kCodeBytes) s.resize(kCodeBytes);
    return s;
  }();
  return corpus;
}

const std::string& prose_corpus() {
  static const std::string corpus = [] {
    static const std::vector<std::vector<std::string>> kLanguages = {
        {"the", "quick", "model", "serves", "tokens", "while", "Streaming", "results", "over",
         "HTTP", "and", "caching", "prefixes", "isn't", "they'll", "we've"},
        {"über", "Straße", "größer", "Bären", "déjà", "vu", "café", "naïve", "façade", "élève",
         "año", "mañana", "coração", "ação"},
        {"привет", "мир", "модель", "токены", "быстро", "работает", "сервер", "очередь"},
        {"我们", "的", "模型", "服务", "速度", "很快", "中文", "文本", "测试", "分词器"},
        {"日本語", "の", "テキスト", "と", "トークン", "です", "ひらがな", "カタカナ"},
        {"안녕하세요", "세계", "모델", "토큰", "빠르게", "서버"},
        {"مرحبا", "بالعالم", "النموذج", "الرموز", "بسرعة"},
        {"12345", "3.14159", "2026", "42", "0x1F", "100%", "$19.99"},
        {"🚀", "🔥", "👍🏽", "❤️", "👨‍👩‍👧", "✨"},
    };
    static const char* kPunct[] = {" ",  " ",  " ",  " ",  ", ",   ". ",
                                   "! ", "? ", "; ", "\n", "\n\n", " - "};
    std::mt19937 rng(2024);
    std::string s;
    while (s.size() < kProseBytes) {
      const auto& lang = kLanguages[rng() % kLanguages.size()];
      const int n = 3 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) {
        s += lang[rng() % lang.size()];
        s += kPunct[rng() % std::size(kPunct)];
      }
    }
    s.resize(kProseBytes);
    // Do not end inside a multi-byte character.
    while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) s.pop_back();
    return s;
  }();
  return corpus;
}

void encode_bench(benchmark::State& state, const std::string& text) {
  const Tokenizer& tok = tokenizer();
  std::size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["bytes_per_token"] =
      static_cast<double>(text.size()) / static_cast<double>(n_tokens);
}

void BM_EncodeCode(benchmark::State& state) { encode_bench(state, code_corpus()); }
void BM_EncodeProse(benchmark::State& state) { encode_bench(state, prose_corpus()); }

// Many short requests (~1 KB prompts) rather than one big text.
void BM_EncodeCodeChunks1K(benchmark::State& state) {
  const std::string& text = code_corpus();
  const Tokenizer& tok = tokenizer();
  for (auto _ : state) {
    for (std::size_t off = 0; off < text.size(); off += 1024) {
      auto ids = tok.encode(std::string_view(text).substr(off, 1024));
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
}

void BM_DecodeCode(benchmark::State& state) {
  const auto ids = tokenizer().encode(code_corpus());
  for (auto _ : state) {
    auto text = tokenizer().decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * code_corpus().size()));
}

void BM_DetokenizeStreamProse(benchmark::State& state) {
  const auto ids = tokenizer().encode(prose_corpus());
  for (auto _ : state) {
    IncrementalDetokenizer detok(tokenizer());
    std::size_t n = 0;
    for (TokenId id : ids) n += detok.push(id).size();
    n += detok.flush().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * prose_corpus().size()));
}

BENCHMARK(BM_EncodeCode)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeProse)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeCodeChunks1K)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_DecodeCode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DetokenizeStreamProse)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace deltaserve

BENCHMARK_MAIN();
