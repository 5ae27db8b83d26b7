// Encodings of tests/fixtures/tokenizer-qwen3/reference.json (produced by transformers
// AutoTokenizer) must match exactly, and decoding must give back the reference text.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>

#include <fstream>

#include <thread>
#include <vector>

#include "test_tokenizers.h"

namespace deltaserve::testing {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json ref = read_json(qwen3_dir() / "reference.json");
  return ref;
}

std::vector<TokenId> ids_of(const nlohmann::json& j) { return j.get<std::vector<TokenId>>(); }

TEST(Qwen3Reference, EncodeMatchesEveryCase) {
  const auto& cases = reference().at("encode");
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(qwen3().encode(text), ids_of(c.at("ids"))) << "text: " << text;
  }
}

TEST(Qwen3Reference, DecodeMatchesEveryCase) {
  for (const auto& c : reference().at("encode")) {
    const auto ids = ids_of(c.at("ids"));
    EXPECT_EQ(qwen3().decode(ids), c.at("decoded").get<std::string>());
  }
}

TEST(Qwen3Reference, EncodeRenderedChatPrompts) {
  const auto& chats = reference().at("chat");
  ASSERT_FALSE(chats.empty());
  for (const auto& c : chats) {
    const std::string rendered = c.at("rendered").get<std::string>();
    const auto ids = ids_of(c.at("ids"));
    EXPECT_EQ(qwen3().encode(rendered), ids) << rendered;
    EXPECT_EQ(qwen3().decode(ids), rendered);
  }
}

TEST(Qwen3Reference, ConcurrentEncodeIsDeterministic) {
  // Shared tokenizer, shared merge cache: every thread must see the reference ids every time.
  const auto& cases = reference().at("encode");
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (const auto& c : cases) {
          if (qwen3().encode(c.at("text").get<std::string>()) != ids_of(c.at("ids"))) ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

TEST(Qwen3Reference, SpecialTokensAndMetadata) {
  const auto& tok = qwen3();
  // Ids come from the fixture's chat case: "<|im_start|>user\n..." starts with <|im_start|>.
  const auto chat_ids = ids_of(reference().at("chat")[0].at("ids"));
  const TokenId im_start = chat_ids[0];
  EXPECT_EQ(tok.token_id("<|im_start|>"), im_start);
  EXPECT_TRUE(tok.is_special(im_start));
  EXPECT_EQ(tok.token_text(im_start), "<|im_start|>");
  EXPECT_EQ(tok.eos_token(), "<|im_end|>");  // tokenizer_config.json eos_token
  EXPECT_EQ(tok.eos_token_id(), tok.token_id("<|im_end|>"));
  EXPECT_EQ(tok.bos_token(), "");
  EXPECT_FALSE(tok.bos_token_id().has_value());

  // <think> is an added token but not special: kept by skip_special decoding.
  const auto think = tok.token_id("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_FALSE(tok.is_special(*think));
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>x</think>");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "user\nhi<think>x</think>");

  // vocab_size counts the added tokens (their ids follow the model vocab).
  const auto json = read_json(qwen3_dir() / "tokenizer.json");
  TokenId max_id = 0;
  for (const auto& t : json.at("added_tokens"))
    max_id = std::max(max_id, t.at("id").get<TokenId>());
  EXPECT_EQ(tok.vocab_size(), max_id + 1);
  // Vocab entries are looked up in their tokenizer.json (byte-level) spelling.
  for (auto it = json["model"]["vocab"].begin(); it != json["model"]["vocab"].end(); ++it) {
    if (it.value().get<int>() % 997 != 0) continue;
    EXPECT_EQ(tok.token_id(it.key()), it.value().get<TokenId>()) << it.key();
  }
}

TEST(Qwen3Reference, ParseSpecialOffTokenizesMarkersAsText) {
  const auto& tok = qwen3();
  const std::string text = "<|im_start|>user";
  const auto plain = tok.encode(text, /*parse_special=*/false);
  const auto im_start = tok.token_id("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  for (TokenId id : plain) EXPECT_NE(id, *im_start);
  EXPECT_GT(plain.size(), 2u);
  EXPECT_EQ(tok.decode(plain), text);
}

TEST(Qwen3Reference, UnknownIdsAreSkippedByDecode) {
  const auto& tok = qwen3();
  const std::vector<TokenId> ids = {-5, tok.vocab_size(), 1 << 30};
  EXPECT_EQ(tok.decode(ids), "");
  EXPECT_EQ(tok.token_text(-1), "");
}

TEST(TokenizerLoad, MissingDirectoryNamesTheFile) {
  auto tok = Tokenizer::load(source_dir() / "no/such/dir");
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos)
      << tok.status().message();
}

TEST(TokenizerLoad, BadJsonIsAnError) {
  auto tok = Tokenizer::from_json("{ not json", "");
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("tokenizer.json"), std::string::npos);
  auto tok2 = Tokenizer::from_json(R"({"model": {"type": "Unigram"}})", "");
  EXPECT_FALSE(tok2.is_ok());
}

// An added token far beyond the vocabulary sized every per-token table to its id (2^31 - 1:
// an overflow and a crash; 2.5e8: a gigabyte); a key that is not a number threw. Both are errors.
TEST(TokenizerLoad, AddedTokenIdsFarBeyondTheVocabularyAreErrors) {
  std::ifstream in(source_dir() / "tests/fixtures/tokenizer-qwen3/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string tok = ss.str();
  for (const char* key : {"2147483647", "250000000", "x7", "-3"}) {
    const std::string config = std::string(R"({"added_tokens_decoder":{")") + key + R"(":{"content":"<zz>","special":true}}})";
    auto t = Tokenizer::from_json(tok, config);
    ASSERT_FALSE(t.is_ok()) << key;
    EXPECT_NE(t.status().message().find(key[0] == '2' ? "beyond" : "not a token id"), std::string::npos)
        << t.status().message();
  }
  // An id just past the vocabulary's and its added tokens' is a plain new token.
  auto ok = Tokenizer::from_json(tok, R"({"added_tokens_decoder":{"151700":{"content":"<zz>","special":true}}})");
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->token_id("<zz>"), 151700);
}


// Stop 56: tiny-coder's tokenizer.json (small: fast to edit and reload) after `edit`.
Result<Tokenizer> tiny_coder_with(const std::function<void(nlohmann::json&)>& edit) {
  static const nlohmann::json base = read_json(tiny_coder_dir() / "tokenizer.json");
  nlohmann::json j = base;
  edit(j);
  return Tokenizer::from_json(j.dump(), "");
}

// `inner` wrapped in `depth` single-step Sequences of `list_key`.
nlohmann::json wrap_in_sequences(nlohmann::json inner, const char* list_key, int depth) {
  for (int i = 0; i < depth; ++i) inner = {{"type", "Sequence"}, {list_key, nlohmann::json::array({inner})}};
  return inner;
}

// Stop 56: Sequence steps nested 30,000 deep overflowed the stack in the recursive parsers (a
// SIGSEGV). Past 64 levels they are an error; the shallow nesting real files use still loads.
TEST(TokenizerLoad, DeeplyNestedSequencesAreErrors) {
  struct Part { const char* key; const char* list_key; };
  for (const Part& p : {Part{"normalizer", "normalizers"}, Part{"pre_tokenizer", "pretokenizers"},
                        Part{"decoder", "decoders"}, Part{"post_processor", "processors"}}) {
    for (int depth : {3, 200}) {
      auto tok = tiny_coder_with([&](nlohmann::json& j) {
        const nlohmann::json inner =
            j[p.key].is_null() ? nlohmann::json{{"type", "ByteLevel"}, {"trim_offsets", false}} : j[p.key];
        j[p.key] = wrap_in_sequences(inner, p.list_key, depth);
      });
      if (depth == 3) {
        EXPECT_TRUE(tok.is_ok()) << p.key << ": " << tok.status().message();
        continue;
      }
      ASSERT_FALSE(tok.is_ok()) << p.key;
      EXPECT_NE(tok.status().message().find("nested too deeply"), std::string::npos) << tok.status().message();
    }
  }
}

// Stop 56: an added token's id was read with get<int32_t>: 5.5 became 5 and 2^32 + 5 wrapped to
// 5, silently replacing vocab entry 5. Ids are integers in [0, INT32_MAX].
TEST(TokenizerLoad, AddedTokenIdsMustBeInt32Integers) {
  for (const char* id : {"5.5", "4294967301", "-1", "\"7\"", "null", "[5]", "2147483648"}) {
    auto tok = tiny_coder_with([&](nlohmann::json& j) { j["added_tokens"][1]["id"] = nlohmann::json::parse(id); });
    ASSERT_FALSE(tok.is_ok()) << id;
    EXPECT_NE(tok.status().message().find("added token '<|im_start|>' has id"), std::string::npos)
        << id << ": " << tok.status().message();
  }
  auto tok = tiny_coder_with([](nlohmann::json&) {});
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  EXPECT_EQ(tok->token_id("<|im_start|>"), 8184);
}

// Stop 56: the post-processor was never read: a TemplateProcessing that adds a BOS was silently not
// applied. Post-processors that add tokens (or are unknown) are refused by name; those that add
// nothing to a single sequence (ByteLevel, as in Qwen3's file; a plain TemplateProcessing) load.
TEST(TokenizerLoad, PostProcessorsThatAddTokensAreRefused) {
  const auto with_post = [](const std::string& post) {
    return tiny_coder_with([&](nlohmann::json& j) { j["post_processor"] = nlohmann::json::parse(post); });
  };
  const std::string bos_template = R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [8183], "tokens": ["<|endoftext|>"]}}})";
  const std::pair<std::string, const char*> bad[] = {
      {bos_template, "TemplateProcessing adds special tokens (<|endoftext|>)"},
      {R"({"type": "Sequence", "processors": [{"type": "ByteLevel"}, )" + bos_template + "]}", "<|endoftext|>"},
      {R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})", "'RobertaProcessing'"},
      {R"({"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]})", "'BertProcessing'"},
  };
  for (const auto& [post, needle] : bad) {
    auto tok = with_post(post);
    ASSERT_FALSE(tok.is_ok()) << post;
    EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().message();
  }
  for (const char* ok : {"null", R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false})",
                         R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}},
                                      {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}})"}) {
    auto tok = with_post(ok);
    ASSERT_TRUE(tok.is_ok()) << ok << ": " << tok.status().message();
    EXPECT_EQ(tok->encode("def f(x):"), tiny_coder().encode("def f(x):"));
  }
  // The bundled tokenizers load (Qwen3's has a ByteLevel post-processor).
  EXPECT_GT(qwen3().vocab_size(), 0);
  EXPECT_GT(tiny_coder().vocab_size(), 0);
}

}  // namespace
}  // namespace deltaserve::testing
