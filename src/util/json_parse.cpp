#include "util/json_parse.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace deltaserve {

namespace {

using ojson = nlohmann::ordered_json;
using Entries = ojson::object_t::Container;  // std::vector<std::pair<const std::string, ojson>>

// Objects up to this many keys look for a duplicate linearly; larger ones build a hash index.
constexpr std::size_t kLinearKeys = 16;

class OrderedSax {
 public:
  OrderedSax(ojson& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return put(nullptr) != nullptr; }
  bool boolean(bool v) { return put(v) != nullptr; }
  bool number_integer(ojson::number_integer_t v) { return put(v) != nullptr; }
  bool number_unsigned(ojson::number_unsigned_t v) { return put(v) != nullptr; }
  bool number_float(ojson::number_float_t v, const std::string&) { return put(v) != nullptr; }
  bool string(ojson::string_t& v) { return put(std::move(v)) != nullptr; }
  bool binary(ojson::binary_t& v) { return put(ojson::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) {
    if (too_deep()) return false;
    ojson* v = put(ojson::object());
    levels_.push_back(Level{v, nullptr});
    return true;
  }
  bool key(ojson::string_t& k) {
    Level& level = levels_.back();
    Entries& entries = level.value->get_ref<ojson::object_t&>();
    std::size_t found = entries.size();
    if (!level.index && entries.size() > kLinearKeys) {
      level.index = std::make_unique<std::unordered_map<std::string, std::size_t>>();
      level.index->reserve(entries.size() * 2);
      for (std::size_t i = 0; i < entries.size(); ++i) level.index->emplace(entries[i].first, i);
    }
    if (level.index) {
      auto it = level.index->find(k);
      if (it != level.index->end()) found = it->second;
      else level.index->emplace(k, entries.size());
    } else {
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].first == k) {
          found = i;
          break;
        }
      }
    }
    if (found < entries.size()) {
      element_ = &entries[found].second;  // a repeated key: the last value wins, in place
    } else {
      entries.emplace_back(std::move(k), nullptr);
      element_ = &entries.back().second;
    }
    return true;
  }
  bool end_object() {
    levels_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    if (too_deep()) return false;
    ojson* v = put(ojson::array());
    levels_.push_back(Level{v, nullptr});
    return true;
  }
  bool end_array() {
    levels_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool too_deep() {
    if (static_cast<int>(levels_.size()) < max_depth_) return false;
    error_ = "arrays and objects nested deeper than " + std::to_string(max_depth_) + " levels";
    return true;
  }

  struct Level {
    ojson* value;
    std::unique_ptr<std::unordered_map<std::string, std::size_t>> index;
  };

  // Places a value: the root, the next array element, or the value of the last key. The pointer
  // stays valid while the value's own children are built (its container does not grow meanwhile).
  template <typename V>
  ojson* put(V&& v) {
    if (levels_.empty()) {
      root_ = ojson(std::forward<V>(v));
      return &root_;
    }
    ojson* top = levels_.back().value;
    if (top->is_array()) {
      auto& arr = top->get_ref<ojson::array_t&>();
      arr.emplace_back(std::forward<V>(v));
      return &arr.back();
    }
    *element_ = ojson(std::forward<V>(v));
    return element_;
  }

  ojson& root_;
  int max_depth_;
  std::vector<Level> levels_;
  ojson* element_ = nullptr;
  std::string error_;
};

}  // namespace

bool parse_ordered_json(std::string_view text, ojson& out, std::string* error, int max_depth) {
  out = nullptr;
  OrderedSax sax(out, max_depth);
  bool ok = false;
  try {
    ok = ojson::sax_parse(text, &sax);
  } catch (const ojson::exception& e) {  // e.g. a number out of range
    if (error) *error = e.what();
    return false;
  }
  if (!ok && error) *error = sax.error().empty() ? "malformed JSON" : sax.error();
  return ok;
}

}  // namespace deltaserve
