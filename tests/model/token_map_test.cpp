// --speculative-token-map files (model/token_map.h): the forms read (a JSON array, text split by
// whitespace or commas), sorted and unique ids, and each refusal naming the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/token_map.h"

namespace deltaserve::test {
namespace {

std::filesystem::path write(const std::string& name, const std::string& bytes) {
  const auto p = std::filesystem::path(::testing::TempDir()) / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

TEST(TokenMap, ReadsAJsonArrayOrSeparatedIdsSortedAndUnique) {
  auto json = read_token_map(write("map.json", "[17, 3, 4095,\n 3, 0]\n"), 4096);
  ASSERT_TRUE(json.is_ok()) << json.status().message();
  EXPECT_EQ(*json, (std::vector<int32_t>{0, 3, 17, 4095}));
  auto text = read_token_map(write("map.txt", "5\n2 9\t2\r\n"), 10);
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  EXPECT_EQ(*text, (std::vector<int32_t>{2, 5, 9}));
}

TEST(TokenMap, RefusesWhatIsNotAListOfIdsInTheVocabulary) {
  struct Case {
    std::string name, bytes, needle;
  };
  const std::vector<Case> cases = {
      {"big.json", "[1, 2, 4096]", "token id 4096 (byte 7) is outside the model's vocabulary of 4096"},
      {"huge.txt", "1 123456789012345678901234567890", "is outside the model's vocabulary of 4096"},
      {"neg.json", "[1, -2]", "unexpected '-' at byte 4"},
      {"float.json", "[1.5]", "unexpected '.'"},
      {"obj.json", "{\"ids\": [1]}", "unexpected '{'"},
      {"empty.json", "[]", "no token ids"},
      {"hot_token_id.pt", std::string("PK\x03\x04", 4) + "archive/data.pkl", "a torch.save file"},
      {"pickle.pt", "\x80\x02]q\x00", "a torch.save file"},
  };
  for (const auto& c : cases) {
    const auto p = write(c.name, c.bytes);
    auto r = read_token_map(p, 4096);
    ASSERT_FALSE(r.is_ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("--speculative-token-map " + p.string()), std::string::npos)
        << r.status().message();
  }
  auto missing = read_token_map("/nonexistent/map.json", 4096);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/map.json: cannot read"), std::string::npos);
}

}  // namespace
}  // namespace deltaserve::test
