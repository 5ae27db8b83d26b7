// Tokenizer of models/tiny-coder: encode arbitrary bytes (with and without special-token
// parsing), decode the ids back, decode arbitrary ids, and stream them through the incremental
// detokenizer. ASCII text (no specials parsed) must round-trip exactly; out-of-vocabulary ids are
// skipped; the streamed text equals the whole decode.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

using deltaserve::Tokenizer;
using deltaserve::TokenId;

static const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    auto t = Tokenizer::load(DELTASERVE_SOURCE_DIR "/models/tiny-coder");
    if (!t) {
      std::fprintf(stderr, "cannot load tokenizer: %s\n", t.status().message().c_str());
      std::abort();
    }
    return *t;
  }();
  return tok;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = tokenizer();
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const int vocab = tok.vocab_size();
  for (bool special : {false, true}) {
    auto ids = tok.encode(text, special);
    for (TokenId id : ids) FUZZ_CHECK(id >= 0 && id < vocab);
    std::string back = tok.decode(ids);
    bool ascii = true;
    for (unsigned char c : text) ascii = ascii && c < 0x80;
    if (ascii && !special) FUZZ_CHECK(back == text);
  }
  // The bytes as token ids (some out of range), decoded whole and streamed.
  std::vector<TokenId> ids;
  for (std::size_t i = 0; i + 2 <= size; i += 2) {
    uint16_t v;
    std::memcpy(&v, data + i, 2);
    ids.push_back(static_cast<TokenId>(v % (vocab + 8)) - 4);
  }
  std::vector<TokenId> valid;
  for (TokenId id : ids) if (id >= 0 && id < vocab) valid.push_back(id);
  const std::string whole = tok.decode(valid);
  FUZZ_CHECK(tok.decode(ids) == whole);  // ids outside the vocabulary are skipped
  deltaserve::IncrementalDetokenizer detok(tok);
  std::string streamed;
  for (TokenId id : valid) streamed += detok.push(id);
  streamed += detok.flush();
  FUZZ_CHECK(streamed == whole);  // detokenizer.h: the concatenation equals decode()
  return 0;
}
