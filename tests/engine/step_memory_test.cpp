// The step buffers the memory plan reserves (model/step_memory.h) against what an engine really
// allocates: on the CPU, the runner and the model's activations byte for byte (up to each
// buffer's 64-byte rounding), with and without MTP, one rank and two; on a GPU (`*cuda*`, run by
// tools/gpu-run.sh's tests stage; skipped without one) everything its backend allocated, the kernels' scratch included, after the
// largest prefill step and decode steps ran.
#include <gtest/gtest.h>

#ifdef DELTASERVE_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "engine/engine.h"
#include "model/step_memory.h"
#include "engine_fixture.h"

namespace deltaserve::test {
namespace {

struct Case {
  const char* name;
  int spec_steps;
  int tp;
};

EngineConfig config_of(const Case& k) {
  EngineConfig c = small_engine_config();
  c.spec_num_steps = k.spec_steps;
  c.tp_size = k.tp;
  c.max_prefill_tokens = 96;  // not the chunk (64): the runner is sized by the step budget
  return c;
}

StepMemory formula(const EngineConfig& c, const Engine& e, bool cuda) {
  const EngineCapacity cap = e.capacity();
  StepShape s = step_shape(c.max_prefill_tokens, c.max_running_requests, c.spec_num_steps, c.context_length,
                           cap.kv_block_size);
  s.tp = c.tp_size;
  s.cuda = cuda;
  s.cpu_threads = c.n_threads;
  auto mc = load_model_config(c.model_dir);
  EXPECT_TRUE(mc.is_ok());
  return step_memory(*mc, s);
}

class StepMemoryCpu : public ::testing::TestWithParam<Case> {};

TEST_P(StepMemoryCpu, RunnerAndActivationsAllocateWhatTheFormulaSays) {
  const EngineConfig c = config_of(GetParam());
  auto e = Engine::create(c);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  const StepMemory m = formula(c, **e, false);
  const int64_t got = (*e)->capacity().step_buffer_bytes;
  const int64_t want = m.activations + m.runner;
  // Each of the ~40 buffers is rounded up to 64 bytes at most; a buffer the formula misses or
  // counts twice is far more (the smallest, a [T, H] row block, is 96 x 256 x 4 = 96 KiB here).
  EXPECT_GE(got, want);
  EXPECT_LT(got - want, 64 * 64) << "measured " << got << ", formula " << want;
  // The scratch grows on the CPU in std::vectors, outside allocate(): nothing after the build.
  EXPECT_EQ((*e)->capacity().scratch_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(, StepMemoryCpu,
                         ::testing::Values(Case{"plain", 0, 1}, Case{"mtp3", 3, 1}, Case{"mtp3_tp2", 3, 2},
                                           Case{"plain_tp2", 0, 2}),
                         [](const auto& i) { return std::string(i.param.name); });

// The shape the plan reserves for is the one the engine sizes its runner by.
TEST(StepShape, MatchesTheRunnersLimits) {
  const StepShape s = step_shape(8192, 16, 3, 131072, 16);
  EXPECT_EQ(s.tokens, 8192 + 16 * 4);
  EXPECT_EQ(s.logit_rows, 16 * 4 + 16);
  EXPECT_EQ(s.seqs, 16);
  EXPECT_EQ(s.blocks_per_seq, (131072 + 4 + 15) / 16);
  EXPECT_EQ(s.verify_tokens, 4);
  EXPECT_TRUE(s.mtp);
}

// The 27B on one of the seeds' two GPUs (TP 2, MTP 3, 16 requests, a chunk of 8,192 a step), by hand:
//   rank shapes: H 5120, I 17408/2 = 8704, V 248,320 (124,160 a rank); attention 12 q heads (q | gate
//   512 rows each) + 2 KV heads x 256 x 2 = 7,168 projection rows, 3,072 output; GDN 8 key / 24 value
//   heads of 128: conv 2 x 1,024 + 3,072 = 5,120, projection 5,120 + 3,072 (z) + 48 (b, a) = 8,240.
//   T = 8,192 + 16 x 4 = 8,256; R = 16 x 4 + 16 = 80; S = 16; B = ceil(131,076 / 16) = 8,193.
//   activations = 8,256 x (4 x 5,120 + 8,240 + 3,072 + 3 x 8,704 + 2 x 5,120) x 4
//               = 8,256 x 68,144 x 4 = 2,250,387,456, + TP logits 80 x 124,160 x 4 x 3 = 119,193,600
//               = 2,369,581,056
//   runner = logits 80 x 248,320 x 4 = 79,462,400 + MTP rows 3 x 8,256 x 5,120 x 4 = 507,248,640
//          + chain 2 x 16 x 5,120 x 4 = 655,360 + kept ids 4 x 16 x 4 = 256
//          + ids 80 x 4 + sampling 80 x 24 + 2^18 x 16 = 4,196,224 + metadata (8,256 + 17 + 16
//            + 16 x 8,193 + 64) x 4 = 557,764 + ids 8,256 x 4 = 33,024 + commit 65 x 4 = 260
//          = 592,154,248
TEST(StepMemory, TheSeedsDeploymentByHand) {
  auto c = load_model_config(source_dir() / "tests/fixtures/qwen3.6-27b-config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  StepShape s = step_shape(8192, 16, 3, 131072, 16);
  s.tp = 2;
  s.cuda = true;
  const StepMemory m = step_memory(*c, s);
  EXPECT_EQ(m.activations, int64_t{2369581056});
  EXPECT_EQ(m.runner, int64_t{592154248});
  // Scratch: bf16 matmul input [T, 2H] (the MTP fc) 8,256 x 10,240 x 2 = 169,082,880 + attention
  // q f32 and fp16 8,256 x 3,072 x 6 = 152,174,592 + k|v fp16 8,256 x 512 x 4 = 16,908,288 + GDN
  // conv 8,256 x 5,120 x 4 = 169,082,880 + beta/decay 8,256 x 48 x 4 = 1,585,152 + chunk rows
  // 8,256 x 24 x 36 x 4 = 28,532,736 = 537,366,528, x 1.25, + 16 MiB + cuBLAS 32 MiB + peer
  // staging 2 x 4 MiB.
  const int64_t sc = 537366528;
  EXPECT_EQ(m.scratch, sc + sc / 4 + (int64_t(16) << 20) + (int64_t(32) << 20) + (int64_t(8) << 20));
}

// On a GPU: after a step of the whole prefill budget and decode steps, every byte the backend gave
// out for the runner, the activations and the kernels' scratch is within the formula's total.
TEST(StepMemory, cuda_EverythingAllocatedStaysWithinTheFormula) {
#ifndef DELTASERVE_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const Case& k : {Case{"plain", 0, 1}, Case{"mtp3", 3, 1}}) {
    EngineConfig c = config_of(k);
    c.device = Device::Cuda;
    auto e = Engine::create(c);
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    (*e)->start();
    // Two prompts of 48: one step of 96 prefill tokens (the budget), then decodes of both.
    std::vector<std::vector<int32_t>> prompts(2, std::vector<int32_t>(48));
    for (int i = 0; i < 48; ++i) prompts[0][i] = 100 + i, prompts[1][i] = 300 + 2 * i;
    const auto out = greedy_continuations(**e, prompts, 8);
    ASSERT_EQ(out.size(), 2u);
    const EngineCapacity cap = (*e)->capacity();
    const StepMemory m = formula(c, **e, true);
    EXPECT_GE(cap.step_buffer_bytes, m.activations + m.runner) << k.name;
    EXPECT_GT(cap.scratch_bytes, 0) << k.name;
    EXPECT_LE(cap.step_buffer_bytes + cap.scratch_bytes, m.total()) << k.name << ": runner " << cap.step_buffer_bytes
                                                                    << " + scratch " << cap.scratch_bytes;
    (*e)->stop();
  }
#endif
}

}  // namespace
}  // namespace deltaserve::test
