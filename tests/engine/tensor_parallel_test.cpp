// Tensor parallelism on the CPU communicator (ranks are threads of this process): how a rank's
// share is cut (model/tensor_parallel.h), the collectives, refused shapes, and whole engines at
// --tp-size 2 against --tp-size 1: greedy tokens identical, with and without MTP speculative
// decoding, several requests batched together, prefix cache on. The per-fixture logits against
// the Hugging Face references at tp 2 / 4 are in tests/model/model_fixture_test.cpp (`_tp*`), on
// CUDA (CudaPeerCommunicator) in tests/model/cuda_model_test.cpp.
#include <gtest/gtest.h>

#include <thread>

#include "backend/backend_factory.h"
#include "backend/cpu/cpu_communicator.h"
#include "backend/split_communicator.h"
#include "engine/engine.h"
#include "engine/model_setup.h"
#include "engine/rank_group.h"
#include "model/tensor_parallel.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

TEST(TpShard, PartsAndVocabularyRowsCoverEverythingOnce) {
  for (int P : {1, 2, 3, 4, 8}) {
    for (int64_t V : {int64_t(10), int64_t(512), int64_t(248320), int64_t(151669)}) {
      int64_t next = 0;
      for (int r = 0; r < P; ++r) {
        const RowRange v = TpShard{r, P}.vocab(V);
        EXPECT_EQ(v.begin, next) << "V " << V << " P " << P << " rank " << r;
        EXPECT_LE(v.size(), (TpShard{r, P}.vocab_per_rank(V)));
        next = v.end;
      }
      EXPECT_EQ(next, V);
    }
    int64_t next = 0;
    for (int r = 0; r < P; ++r) {
      const RowRange h = TpShard{r, P}.part(24);
      EXPECT_EQ(h.begin, next);
      next = h.end;
    }
    EXPECT_EQ(next, 24);
  }
  // 2 KV heads over 4 ranks: ranks 0, 1 keep head 0 (their query heads 0..1 use it), 2, 3 head 1.
  EXPECT_EQ(TpShard({0, 4}).kv_heads(2).begin, 0);
  EXPECT_EQ(TpShard({1, 4}).kv_heads(2).begin, 0);
  EXPECT_EQ(TpShard({2, 4}).kv_heads(2).begin, 1);
  EXPECT_EQ(TpShard({3, 4}).kv_heads(2).size(), 1);
  EXPECT_EQ(TpShard({1, 2}).kv_heads(4).begin, 2);
  EXPECT_EQ(TpShard({1, 2}).kv_heads(4).size(), 2);
}

TEST(TpShard, ShapesThatDoNotSplitAreRefusedNamingTheField) {
  auto cfg = load_model_config(source_dir() / "tests/fixtures/qwen35-tiny");
  ASSERT_TRUE(cfg.is_ok());
  // qwen35-tiny: 6 query heads, 2 KV heads, 2 / 6 GDN key / value heads, intermediate 192.
  EXPECT_TRUE(check_tp_split(*cfg, 1, "x").is_ok());
  EXPECT_TRUE(check_tp_split(*cfg, 2, "x").is_ok());
  struct Case {
    int tp;
    const char* field;
  };
  for (Case c : {Case{4, "num_attention_heads"}, Case{3, "num_key_value_heads"}, Case{5, "intermediate_size"}}) {
    Status s = check_tp_split(*cfg, c.tp, "x");
    ASSERT_FALSE(s.is_ok()) << c.tp;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("--tp-size " + std::to_string(c.tp)), std::string::npos) << s.message();
  }
  // Stop 54: a vocabulary so small that the last rank's share is empty aborted the load.
  ModelConfig tiny_vocab = *cfg;
  tiny_vocab.vocab_size = 1;
  Status v = check_tp_split(tiny_vocab, 2, "x");
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.message().find("vocab_size"), std::string::npos) << v.message();
  // Through the loader: an error, not a crash.
  SetupOptions o;
  o.model_dir = (source_dir() / "tests/fixtures/qwen35-tiny").string();
  o.n_threads = 2;
  o.tp_size = 4;
  auto s = ModelSetup::create(o, 16, 1, 32, 16);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.status().message().find("num_attention_heads"), std::string::npos) << s.status().message();
}

TEST(CpuCommunicator, AllReduceSumsInRankOrderAndAllGatherConcatenates) {
  constexpr int P = 3, N = 1000;
  auto comms = make_cpu_communicators(P);
  std::vector<std::vector<float>> data(P), gathered(P, std::vector<float>(P * 4));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      Communicator& c = *comms[r];
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.size(), P);
      for (int round = 0; round < 50; ++round) {  // many rounds: the staging slots are reused
        auto& x = data[r];
        x.assign(N, 0.f);
        for (int i = 0; i < N; ++i) x[i] = 0.1f * float(r + 1) + 1e-3f * float(i) + float(round);
        c.all_reduce_sum(Tensor(x.data(), DType::F32, {N}));
        std::vector<float> mine = {float(r), float(r) + 0.5f, float(round), -1.f};
        c.all_gather(Tensor(mine.data(), DType::F32, {4}), Tensor(gathered[r].data(), DType::F32, {P * 4}));
        c.barrier();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < N; ++i) {
    float expect = 0.f;  // rank order, as the communicator sums
    for (int r = 0; r < P; ++r) expect += 0.1f * float(r + 1) + 1e-3f * float(i) + 49.f;
    for (int r = 0; r < P; ++r) ASSERT_EQ(data[r][i], expect) << "rank " << r << " element " << i;
  }
  for (int r = 0; r < P; ++r)
    for (int q = 0; q < P; ++q) {
      EXPECT_EQ(gathered[r][q * 4 + 0], float(q));
      EXPECT_EQ(gathered[r][q * 4 + 1], float(q) + 0.5f);
      EXPECT_EQ(gathered[r][q * 4 + 2], 49.f);
    }
}

// A communicator that forwards to a real one and counts the collectives it carried (which of
// SplitCommunicator's two a message went to).
class Counting final : public Communicator {
 public:
  explicit Counting(std::unique_ptr<Communicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  void all_reduce_sum(Tensor x) override { ++reduces; c_->all_reduce_sum(x); }
  void all_gather(const Tensor& in, Tensor out) override { ++gathers; c_->all_gather(in, out); }
  void barrier() override { c_->barrier(); }
  int reduces = 0, gathers = 0;

 private:
  std::unique_ptr<Communicator> c_;
};

TEST(SplitCommunicator, SmallMessagesTakeTheFirstAndLargeOnesTheSecond) {
  constexpr int P = 2;
  constexpr std::size_t kMax = 64;  // bytes: 16 floats go to the small one, 17 to the large
  auto small = make_cpu_communicators(P), large = make_cpu_communicators(P);
  std::vector<Counting*> cs, cl;
  std::vector<std::unique_ptr<Communicator>> split;
  for (int r = 0; r < P; ++r) {
    auto a = std::make_unique<Counting>(std::move(small[r])), b = std::make_unique<Counting>(std::move(large[r]));
    cs.push_back(a.get());
    cl.push_back(b.get());
    split.push_back(std::make_unique<SplitCommunicator>(std::move(a), std::move(b), kMax));
  }
  std::vector<std::vector<float>> x16(P, std::vector<float>(16)), x17(P, std::vector<float>(17)), g(P, std::vector<float>(34));
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      for (int i = 0; i < 16; ++i) x16[r][i] = float(r + 1) * float(i);
      for (int i = 0; i < 17; ++i) x17[r][i] = float(r + 1) + float(i);
      split[r]->all_reduce_sum(Tensor(x16[r].data(), DType::F32, {16}));
      split[r]->all_reduce_sum(Tensor(x17[r].data(), DType::F32, {17}));
      split[r]->all_gather(Tensor(x17[r].data(), DType::F32, {17}), Tensor(g[r].data(), DType::F32, {34}));
      split[r]->barrier();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(cs[r]->reduces, 1);
    EXPECT_EQ(cl[r]->reduces, 1);
    EXPECT_EQ(cl[r]->gathers, 1);
    EXPECT_EQ(cs[r]->gathers, 0);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(x16[r][i], 3.f * float(i));
    for (int i = 0; i < 17; ++i) EXPECT_EQ(x17[r][i], 3.f + 2.f * float(i));
    for (int i = 0; i < 34; ++i) EXPECT_EQ(g[r][i], x17[0][i % 17]);  // both ranks hold the reduced values
  }
}

TEST(TpTransport, PeerBelowNcclAboveAndRefusalsThatNameTheReason) {
  auto both = choose_tp_transport(true, "", true);
  ASSERT_TRUE(both.is_ok());
  EXPECT_EQ(both->transport, TpTransport::PeerAndNccl);
  EXPECT_NE(both->description.find("NCCL above"), std::string::npos) << both->description;
  auto no_nccl = choose_tp_transport(true, "cannot load libnccl.so.2", true);
  ASSERT_TRUE(no_nccl.is_ok());
  EXPECT_EQ(no_nccl->transport, TpTransport::Peer);
  EXPECT_NE(no_nccl->description.find("cannot load libnccl.so.2"), std::string::npos) << no_nccl->description;
  auto shared = choose_tp_transport(false, "ranks share a GPU", true);
  ASSERT_TRUE(shared.is_ok());
  EXPECT_EQ(shared->transport, TpTransport::Peer);
  auto nccl_only = choose_tp_transport(true, "", false);
  ASSERT_TRUE(nccl_only.is_ok());
  EXPECT_EQ(nccl_only->transport, TpTransport::Nccl);
  auto missing = choose_tp_transport(true, "cannot load libnccl.so.2", false);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("--disable-custom-all-reduce needs NCCL: cannot load"), std::string::npos);
  auto same_gpu = choose_tp_transport(false, "", false);
  ASSERT_FALSE(same_gpu.is_ok());
  EXPECT_NE(same_gpu.status().message().find("one GPU per rank"), std::string::npos);
}

TEST(TpTransport, DisableCustomAllReduceOnTheCpuIsRefused) {
  EngineConfig c = small_engine_config("models/tiny-coder");
  c.tp_size = 2;
  c.custom_all_reduce = false;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("--disable-custom-all-reduce applies to GPU tensor parallelism"), std::string::npos)
      << e.status().message();
  c.custom_all_reduce = true;
  auto ok = Engine::create(c);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_NE((*ok)->tp_transport().find("CPU threads"), std::string::npos) << (*ok)->tp_transport();
}

std::unique_ptr<Engine> make_engine(const std::string& model, int tp, int spec_steps) {
  EngineConfig c = small_engine_config(model);
  c.tp_size = tp;
  c.spec_num_steps = spec_steps;
  c.chunked_prefill_size = 24;  // the longer prompt prefills in chunks, beside the other's decode
  c.max_prefill_tokens = 48;
  c.prefix_cache = true;
  c.checkpoint_slots = 4;
  c.check_integrity_every_step = true;
  auto e = Engine::create(c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  return e.is_ok() ? std::move(*e) : nullptr;
}

struct EngineCase {
  const char* model;
  int spec_steps;
};

class TensorParallelEngine : public ::testing::TestWithParam<EngineCase> {};

TEST_P(TensorParallelEngine, GreedyTokensEqualOneRank) {
  const EngineCase c = GetParam();
  const int64_t V = load_model_config(source_dir() / c.model)->vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 3; ++p) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 10 + 25 * p; ++i) ids.push_back(static_cast<int32_t>((i * 37 + p * 101 + 5) % V));
    prompts.push_back(ids);
  }
  std::vector<std::vector<std::vector<int32_t>>> runs;
  for (int tp : {1, 2}) {
    auto e = make_engine(c.model, tp, c.spec_steps);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->tp_size(), tp);
    e->start();
    runs.push_back(greedy_continuations(*e, prompts, 24));
    // A second turn over the first prompt: served from the prefix cache, same tokens again.
    runs.back().push_back(greedy_continuations(*e, {prompts[0]}, 24)[0]);
    e->stop();
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (std::size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].size(), 24u);
    EXPECT_EQ(runs[1][i], runs[0][i]) << c.model << " request " << i;
  }
  EXPECT_EQ(runs[1][3], runs[1][0]);
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelEngine,
                         ::testing::Values(EngineCase{"models/tiny-coder", 0}, EngineCase{"models/tiny-coder", 3},
                                           EngineCase{"tests/fixtures/qwen35-tiny", 2},
                                           EngineCase{"tests/fixtures/qwen3-tiny", 0}),
                         [](const auto& info) {
                           std::string n = std::filesystem::path(info.param.model).filename().string();
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n + "_mtp" + std::to_string(info.param.spec_steps);
                         });

TEST(TensorParallelEngine, ShardsHoldTheirShareOfWeightsAndCache) {
  auto one = make_engine("models/tiny-coder", 1, 0);
  auto two = make_engine("models/tiny-coder", 2, 0);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  const EngineCapacity a = one->capacity(), b = two->capacity();
  EXPECT_EQ(b.tp_size, 2);
  // Everything is split but the norms and the MTP fc: a rank holds a little over half.
  EXPECT_LT(b.weight_bytes, a.weight_bytes * 0.55);
  EXPECT_GT(b.weight_bytes, a.weight_bytes * 0.45);
  EXPECT_EQ(b.kv_cache_bytes * 2, a.kv_cache_bytes);
  EXPECT_EQ(b.state_cache_bytes * 2, a.state_cache_bytes);
  EXPECT_EQ(b.kv_tokens, a.kv_tokens);
}

TEST(TensorParallelEngine, CudaWithoutAGpuPerRankIsRefusedClearly) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: tests/model/cuda_model_test.cpp runs the _tp cases";
  EngineConfig c = small_engine_config();
  c.device = Device::Cuda;
  c.tp_size = 2;
  auto e = Engine::create(c);
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("--tp-size 2"), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace deltaserve::test
