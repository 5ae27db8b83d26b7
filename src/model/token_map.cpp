#include "model/token_map.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace deltaserve {

Result<std::vector<int32_t>> read_token_map(const std::filesystem::path& path, int64_t vocab) {
  const std::string where = "--speculative-token-map " + path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(where, ": cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (text.rfind("PK\x03\x04", 0) == 0 || (!text.empty() && static_cast<unsigned char>(text[0]) == 0x80))
    return error(where, ": a torch.save file (zip or pickle); give the ids as JSON or text, e.g. python -c \"import "
                 "torch, json; json.dump(torch.load('hot_token_id.pt').tolist(), open('hot_token_id.json', 'w'))\"");
  std::vector<int32_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || (c == '[' && ids.empty()) || c == ']') {
      ++i;
      continue;
    }
    if (c < '0' || c > '9')
      return error(where, ": unexpected '", std::string(1, c), "' at byte ", i,
                   " (expected token ids: a JSON array of integers or ids separated by whitespace or commas)");
    const std::size_t start = i;
    int64_t v = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) v = std::min<int64_t>(v * 10 + (text[i] - '0'), vocab);
    if (v >= vocab)
      return error(where, ": token id ", text.substr(start, std::min<std::size_t>(i - start, 20)), " (byte ", start,
                   ") is outside the model's vocabulary of ", vocab);
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return error(where, ": no token ids in the file");
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace deltaserve
