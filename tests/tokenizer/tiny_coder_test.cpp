// models/tiny-coder: the prompts of reference.json encode to the first prompt_len ids of the
// reference token sequences (reference.safetensors, written by transformers), and decoding the
// whole sequences gives prompt_text + completion_text.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "test_tokenizers.h"

namespace deltaserve::testing {
namespace {

// Reads one I32/I64 1-D tensor from a safetensors file: 8-byte little-endian header length, JSON
// header {name: {dtype, shape, data_offsets}}, then the data.
std::vector<TokenId> read_token_tensor(const std::filesystem::path& path, const std::string& name) {
  auto file = MmapFile::open(path);
  if (!file) {
    ADD_FAILURE() << file.status().message();
    return {};
  }
  const auto bytes = file->view();
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
  const auto& entry = header.at(name);
  const std::string dtype = entry.at("dtype").get<std::string>();
  const std::size_t begin = entry.at("data_offsets")[0].get<std::size_t>();
  const std::size_t end = entry.at("data_offsets")[1].get<std::size_t>();
  const char* data = bytes.data() + 8 + header_len;
  std::vector<TokenId> ids;
  if (dtype == "I32") {
    for (std::size_t off = begin; off < end; off += 4) {
      std::int32_t v;
      std::memcpy(&v, data + off, 4);
      ids.push_back(v);
    }
  } else if (dtype == "I64") {
    for (std::size_t off = begin; off < end; off += 8) {
      std::int64_t v;
      std::memcpy(&v, data + off, 8);
      ids.push_back(static_cast<TokenId>(v));
    }
  } else {
    ADD_FAILURE() << name << " has dtype " << dtype;
  }
  return ids;
}

TEST(TinyCoder, PromptsMatchReferenceTokens) {
  const auto ref = read_json(tiny_coder_dir() / "reference.json");
  const auto& cases = ref.at("cases");
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    const std::string prompt = c.at("prompt_text").get<std::string>();
    const std::size_t prompt_len = c.at("prompt_len").get<std::size_t>();
    const auto tokens =
        read_token_tensor(tiny_coder_dir() / "reference.safetensors", name + ".tokens");
    ASSERT_GE(tokens.size(), prompt_len) << name;

    const auto ids = tiny_coder().encode(prompt);
    EXPECT_EQ(ids, std::vector<TokenId>(tokens.begin(),
                                        tokens.begin() + static_cast<std::ptrdiff_t>(prompt_len)))
        << name;
    EXPECT_EQ(tiny_coder().decode(ids), prompt) << name;
    EXPECT_EQ(tiny_coder().decode(tokens), prompt + c.at("completion_text").get<std::string>())
        << name;
  }
}

TEST(TinyCoder, ConfigOverridesAddedTokenFlags) {
  // tokenizer.json marks <tool_response> special, tokenizer_config.json's added_tokens_decoder
  // says it is not; transformers applies the config, so skip_special decoding keeps it.
  const auto config = read_json(tiny_coder_dir() / "tokenizer_config.json");
  for (auto it = config.at("added_tokens_decoder").begin();
       it != config["added_tokens_decoder"].end(); ++it) {
    const TokenId id = static_cast<TokenId>(std::stoi(it.key()));
    EXPECT_EQ(tiny_coder().is_special(id), it.value().at("special").get<bool>()) << it.key();
    EXPECT_EQ(tiny_coder().token_id(it.value().at("content").get<std::string>()), id);
  }
  EXPECT_EQ(tiny_coder().eos_token(), config.at("eos_token").get<std::string>());
}

}  // namespace
}  // namespace deltaserve::testing
