// Text normalizers from tokenizer.json `normalizer` (HF `tokenizers` normalizers). Only what the
// Qwen family uses is supported: none, NFC, or a Sequence of NFC.
#pragma once

#include <string>
#include <string_view>

#include "util/status.h"

namespace deltaserve {

enum class NormalizerKind { kNone, kNfc };

class Normalizer {
 public:
  Normalizer() = default;
  // NFC builds its code point table here (a few ms, once per process), not on the first request.
  explicit Normalizer(NormalizerKind kind);
  NormalizerKind kind() const { return kind_; }
  bool is_identity() const { return kind_ == NormalizerKind::kNone; }

  // Normalizes valid UTF-8 `text`. Returns a view of `text` itself when nothing changes (the common
  // case), otherwise a view of `scratch`.
  std::string_view apply(std::string_view text, std::string& scratch) const;

 private:
  NormalizerKind kind_ = NormalizerKind::kNone;
};

// NFC of valid UTF-8 (utf8proc).
std::string nfc(std::string_view text);
// True when `text` is certainly already in NFC (quick check over code points that are NFC_QC=Yes
// with canonical combining class 0); false means "maybe", not "no".
bool is_nfc_quick(std::string_view text);

}  // namespace deltaserve
