#include "tokenizer/tokenizer_json.h"

namespace deltaserve {

namespace {

using nlohmann::json;

// SAX handler for nlohmann::json::sax_parse (static interface: every method is required).
class Handler {
 public:
  explicit Handler(TokenizerJson& out) : out_(out) {}

  bool null() { return scalar(json()); }
  bool boolean(bool v) { return scalar(json(v)); }
  bool number_integer(json::number_integer_t v) {
    if (mode() == Mode::kVocab) {
      out_.vocab.emplace_back(std::move(vocab_key_), v);
      return true;
    }
    return scalar(json(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode() == Mode::kVocab) {
      out_.vocab.emplace_back(std::move(vocab_key_), static_cast<long long>(v));
      return true;
    }
    return scalar(json(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) { return scalar(json(v)); }
  bool string(json::string_t& v) {
    switch (mode()) {
      case Mode::kMerges:  // "a b" form
        out_.merges.emplace_back(std::move(v), std::string());
        return true;
      case Mode::kMergePair:
        pair_.push_back(std::move(v));
        return pair_.size() <= 2 || fail("a merge has more than two parts");
      case Mode::kVocab:
        return fail("model.vocab has a non-integer id");
      case Mode::kDom:
        return scalar(json(std::move(v)));
    }
    return false;
  }
  bool binary(json::binary_t&) { return fail("binary value"); }

  bool start_object(std::size_t) {
    if (mode() == Mode::kDom && in_model() && key_ == "vocab") {
      out_.has_vocab = true;
      modes_.push_back(Mode::kVocab);
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected object in model.vocab/merges");
    const bool is_model = dom_.size() == 1 && dom_.back()->is_object() && key_ == "model";
    json* obj = insert(json::object());
    if (is_model) model_ = obj;
    dom_.push_back(obj);
    modes_.push_back(Mode::kDom);
    return true;
  }
  bool key(json::string_t& k) {
    if (mode() == Mode::kVocab) {
      vocab_key_ = std::move(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    if (mode() == Mode::kDom) dom_.pop_back();
    modes_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (mode() == Mode::kDom && in_model() && key_ == "merges") {
      out_.has_merges = true;
      modes_.push_back(Mode::kMerges);
      return true;
    }
    if (mode() == Mode::kMerges) {
      pair_.clear();
      modes_.push_back(Mode::kMergePair);
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected array in model.vocab/merges");
    dom_.push_back(insert(json::array()));
    modes_.push_back(Mode::kDom);
    return true;
  }
  bool end_array() {
    if (mode() == Mode::kMergePair) {
      if (pair_.size() != 2) return fail("a merge is not a pair");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
    } else if (mode() == Mode::kDom) {
      dom_.pop_back();
    }
    modes_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_ = str_cat("invalid JSON at byte ", position, ": ", e.what());
    return false;
  }

  const std::string& error_message() const { return error_; }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  Mode mode() const { return modes_.empty() ? Mode::kDom : modes_.back(); }
  bool in_model() const { return model_ != nullptr && !dom_.empty() && dom_.back() == model_; }
  bool fail(const char* what) {
    error_ = what;
    return false;
  }
  bool scalar(json v) {
    if (mode() != Mode::kDom) return fail("unexpected value in model.vocab/merges");
    insert(std::move(v));
    return true;
  }
  // Adds `v` to the innermost open container (or makes it the root). Containers never move while a
  // child is open, so the pointers on dom_ stay valid.
  json* insert(json v) {
    if (dom_.empty()) {
      out_.rest = std::move(v);
      return &out_.rest;
    }
    json& parent = *dom_.back();
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(v);
      return &slot;
    }
    parent.push_back(std::move(v));
    return &parent.back();
  }

  TokenizerJson& out_;
  std::vector<json*> dom_;
  std::vector<Mode> modes_;
  std::string key_, vocab_key_;
  std::vector<std::string> pair_;
  json* model_ = nullptr;
  std::string error_;
};

}  // namespace

Result<TokenizerJson> read_tokenizer_json(std::string_view text) {
  TokenizerJson out;
  Handler handler(out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &handler);
  if (!ok) {
    return error(handler.error_message().empty() ? "invalid JSON" : handler.error_message());
  }
  return out;
}

}  // namespace deltaserve
