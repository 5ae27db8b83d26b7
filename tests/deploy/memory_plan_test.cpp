// Memory plan figures for real configs, checked by hand in the comments.
#include "cache/memory_plan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>

#include "options/serve_options.h"
#include "deploy/hardware.h"
#include "deploy/plan_input.h"

namespace deltaserve {
namespace {

const std::string kSrc = DELTASERVE_SOURCE_DIR;
constexpr int64_t kGiB = int64_t{1} << 30;

ModelConfig load(const std::string& rel) {
  auto c = load_model_config(kSrc + "/" + rel);
  EXPECT_TRUE(c) << c.status().message();
  return *c;
}

ModelConfig qwen36_27b() { return load("tests/fixtures/qwen3.6-27b-config.json"); }

// Parameters stored in a safetensors file (vision tower excluded), read from its JSON header.
int64_t safetensors_params(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  auto j = nlohmann::json::parse(header);
  int64_t total = 0;
  for (auto& [name, t] : j.items()) {
    if (name == "__metadata__" || name.find("visual") != std::string::npos) continue;
    int64_t c = 1;
    for (auto d : t["shape"]) c *= d.get<int64_t>();
    total += c;
  }
  return total;
}

TEST(MemoryPlan, ParamCountMatchesRealCheckpoints) {
  // The tiny fixtures are real checkpoints: the count from config.json must equal the tensors.
  EXPECT_EQ(count_params(load("tests/fixtures/qwen35-tiny")).total(),
            safetensors_params(kSrc + "/tests/fixtures/qwen35-tiny/model.safetensors"));  // 1,033,128
  EXPECT_EQ(count_params(load("tests/fixtures/qwen3-tiny")).total(),
            safetensors_params(kSrc + "/tests/fixtures/qwen3-tiny/model.safetensors"));   // 180,928 (tied)
}

TEST(MemoryPlan, Qwen36_27bParams) {
  // H=5120, I=17408, V=248320; attention: 24 heads x 256 (q_proj doubled for the gate), 4 KV heads;
  // GDN: Hk=16, Hv=48, Dk=Dv=128, conv_dim = 2*2048 + 6144 = 10240, K=4.
  //   attention layer = 5120*12288 + 2*5120*1024 + 6144*5120 + 2*256          = 104,858,112
  //   GDN layer = 5120*10240 + 5120*6144 + 2*5120*48 + 10240*4 + 96 + 128 + 6144*5120 = 115,876,064
  //   MLP = 3*5120*17408 = 267,386,880; norms = 64*2*5120 + 5120 = 660,480
  //   embed + lm_head = 2 * 248320*5120 = 2,542,796,800
  //   text = 2,542,796,800 + 16*104,858,112 + 48*115,876,064 + 64*267,386,880 + 660,480 = 26,895,998,464
  //   MTP = 2*5120 + 2*5120*5120 + 104,858,112 + 267,386,880 + 3*5120               = 424,699,392
  ModelConfig c = qwen36_27b();
  ParamCount p = count_params(c);
  EXPECT_EQ(p.attention_layers, 16 * int64_t{104858112});
  EXPECT_EQ(p.linear_layers, 48 * int64_t{115876064});
  EXPECT_EQ(p.mtp, 424699392);
  EXPECT_EQ(p.total(), int64_t{27320697856});
}

TEST(MemoryPlan, Qwen36_27bKvAndStatePerGpu) {
  ModelConfig c = qwen36_27b();
  // 16 attention layers x 4 KV heads x 256 x 2 (K,V) x 2 B = 65,536 = 64 KiB per token.
  EXPECT_EQ(kv_bytes_per_token(memory_spec_of(c, false, 1), 2), 64 * 1024);
  // TP=2: 2 KV heads per GPU -> 32 KiB; with speculative decoding the MTP layer adds
  // 1 x 2 x 256 x 2 x 2 = 2 KiB -> 34 KiB.
  EXPECT_EQ(kv_bytes_per_token(memory_spec_of(c, false, 2), 2), 32 * 1024);
  EXPECT_EQ(kv_bytes_per_token(memory_spec_of(c, true, 2), 2), 34 * 1024);
  EXPECT_EQ(kv_bytes_per_token(memory_spec_of(c, true, 2), 1), 17 * 1024);  // fp8
  // TP=8 > 4 KV heads: each GPU keeps one head: 16 x 1 x 256 x 2 x 2 = 16 KiB.
  EXPECT_EQ(kv_bytes_per_token(memory_spec_of(c, false, 8), 2), 16 * 1024);
  // GDN state, f32: 48 layers x (48*128*128 + 10240*3) x 4 B = 48 x 3,268,608 = 156,893,184
  // (~150 MiB per sequence); half per GPU at TP=2.
  EXPECT_EQ(state_bytes_per_slot(memory_spec_of(c, false, 1)), 156893184);
  EXPECT_EQ(state_bytes_per_slot(memory_spec_of(c, false, 2)), 78446592);
  // Speculative rollback with k = 3 keeps the raw GDN inputs of 4 tokens per layer at TP=2:
  // 48 x 4 x (5,120 + 48) x 4 B = 3,969,024, so a request holds 82,415,616 B = 1.05x the plain state.
  EXPECT_EQ(pending_bytes_per_slot(memory_spec_of(c, true, 2), 4), 3969024);
  EXPECT_EQ(state_bytes_per_request(memory_spec_of(c, true, 2), 4), 82415616);
  EXPECT_LE(double(state_bytes_per_request(memory_spec_of(c, true, 2), 4)), 1.1 * 78446592);
  // --mamba-ssm-dtype bfloat16 at TP=2: conv 48 x 5,120 x 3 x 4 B = 2,949,120 (f32 still) +
  // recurrent 48 x 24 x 128 x 128 x 2 B = 37,748,736.
  EXPECT_EQ(state_bytes_per_slot(memory_spec_of(c, false, 2), 2), 40697856);
  EXPECT_EQ(state_bytes_per_request(memory_spec_of(c, true, 2), 4, 2), 40697856 + 3969024);
}

// The unit file of the story on 2x RTX A6000 (48 GiB each), as `plan --gpu-memory 48GiB` sees it.
MemoryPlanInput story_input() {
  MemoryPlanInput in;
  in.device = PlanDevice::Cuda;
  in.device_memory_bytes = 48 * kGiB;
  in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
  in.tp_size = 2;
  in.mem_fraction_static = 0.88;
  in.mamba_full_memory_ratio = 0.5;
  in.mamba_full_memory_ratio_explicit = true;
  in.spec_num_steps = 3;
  in.context_length = 131072;
  in.max_running_requests = 16;
  in.chunked_prefill_size = 8192;
  in.max_prefill_tokens = 8192;  // the auto budget (deploy/plan_input.cpp): one chunk a step
  return in;
}

TEST(MemoryPlan, StoryUnitFileOnTwoA6000s) {
  ModelConfig c = qwen36_27b();
  MemoryPlan p = plan_memory(c, story_input());
  ASSERT_TRUE(p.ok()) << p.status().message();
  // budget = 48 GiB x 0.88 - 768 MiB of CUDA context = 45,354,854,645 - 805,306,368 = 44,549,548,277
  EXPECT_EQ(p.budget_bytes, int64_t{44549548277});
  // weights per GPU = ((27,320,697,856 - 660,480 norms) / 2 + 660,480) x 2 B = 27,321,358,336 (25.44 GiB)
  EXPECT_EQ(p.weights_bytes_per_gpu, int64_t{27321358336});
  // cache = 44,549,548,277 - 27,321,358,336 = 17,228,189,941
  EXPECT_EQ(p.cache_bytes, int64_t{17228189941});
  // state per request = 78,446,592 + 3,969,024 pending rows = 82,415,616 (1.05x the plain state)
  EXPECT_EQ(p.state_bytes_per_request_per_gpu, 82415616);
  EXPECT_EQ(p.pending_depth, 4);
  EXPECT_EQ(p.kv_bytes_per_token_per_gpu, 34 * 1024);
  // state budget = cache x 0.5 / 1.5 = 5,742,729,980 -> 69 slots fit; 16 asked; the prefix cache
  // keeps one checkpoint (78,446,592 B) per request slot; the rest goes to KV.
  EXPECT_EQ(p.state_slots, 16);
  EXPECT_EQ(p.checkpoint_slots, 16);
  EXPECT_EQ(p.max_running_requests, 16);
  // KV = 17,228,189,941 - 16 x 82,415,616 - 16 x 78,446,592 = 14,654,394,613 / 34,816 = 420,909
  // -> 420,896 (blocks of 16); SGLang's own sizing for these flags gives 13 requests and ~248k tokens.
  EXPECT_EQ(p.kv_tokens, 420896);
  EXPECT_GE(p.kv_tokens, 420000);
  EXPECT_EQ(p.context_length, 131072);
  // The step buffers fit outside the budget: no out-of-memory warning. Reserve = a step of 8,256
  // tokens and 80 logit rows (tests/engine/step_memory_test.cpp, TheSeedsDeploymentByHand) + 512 MiB
  // of CUDA graphs + 384 MiB of NCCL buffers; 48 GiB x 0.12 = 5.76 GiB is left for it.
  EXPECT_TRUE(p.warnings.empty()) << p.warnings.front();
  StepShape s = step_shape(8192, 16, 3, 131072, 16);
  s.tp = 2;
  s.cuda = true;
  EXPECT_EQ(p.activation_reserve_bytes, step_memory(c, s).total() + (int64_t(512) << 20) + (int64_t(384) << 20));
  EXPECT_LT(p.activation_reserve_bytes, 48 * kGiB - static_cast<int64_t>(48 * kGiB * 0.88));
  // SGLang's budget of 16,384 prefill tokens a step would not fit: the plan says so.
  MemoryPlanInput big = story_input();
  big.max_prefill_tokens = 16384;
  MemoryPlan b = plan_memory(c, big);
  ASSERT_TRUE(b.ok());
  ASSERT_FALSE(b.warnings.empty());
  EXPECT_NE(b.warnings[0].find("expect out-of-memory under load"), std::string::npos) << b.warnings[0];

  // fp8 KV: half the bytes per token, twice the tokens: 14,654,394,613 / 17,408 -> 841,808.
  MemoryPlanInput in = story_input();
  in.kv_bytes_per_elem = 1;
  MemoryPlan q = plan_memory(c, in);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q.kv_tokens, 841808);
  EXPECT_GE(q.kv_tokens, 840000);

  // Without the prefix cache the checkpoints' memory is KV: 15,909,540,085 / 34,816 -> 456,960.
  in = story_input();
  in.prefix_cache = false;
  MemoryPlan r = plan_memory(c, in);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.checkpoint_slots, 0);
  EXPECT_EQ(r.kv_tokens, 456960);
}

// An explicit ratio that cannot hold the requests is refused with a message naming what fits.
TEST(MemoryPlan, ExplicitRatioThatCannotHoldTheRequestsIsAnError) {
  ModelConfig c = qwen36_27b();
  MemoryPlanInput in = story_input();
  in.mamba_full_memory_ratio = 0.05;  // state budget = cache x 0.05 / 1.05 = 820,389,997 -> 9 slots
  MemoryPlan p = plan_memory(c, in);
  ASSERT_FALSE(p.ok());
  const std::string err = p.status().message();
  EXPECT_NE(err.find("--max-running-requests 16 does not fit"), std::string::npos) << err;
  EXPECT_NE(err.find("Set --max-running-requests 9"), std::string::npos) << err;
  // With the ratio left at its default, the plan re-splits to honour 16 and says so.
  in.mamba_full_memory_ratio_explicit = false;
  MemoryPlan q = plan_memory(c, in);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q.max_running_requests, 16);
  ASSERT_FALSE(q.warnings.empty());
  EXPECT_NE(q.warnings[0].find("--max-running-requests 16"), std::string::npos);
}

// --max-total-tokens below one KV block: the error names the flag, not "add memory or GPUs".
TEST(MemoryPlan, MaxTotalTokensBelowOneBlockIsNamed) {
  ModelConfig c = qwen36_27b();
  MemoryPlanInput in = story_input();
  in.max_total_tokens = 1;
  MemoryPlan p = plan_memory(c, in);
  ASSERT_FALSE(p.ok());
  const std::string err = p.status().message();
  EXPECT_NE(err.find("--max-total-tokens 1 is less than one KV block of " + std::to_string(in.kv_block_size) + " tokens"),
            std::string::npos) << err;
  EXPECT_EQ(err.find("add memory or GPUs"), std::string::npos) << err;
}

// A step's prefill activations larger than the device can only fail when the engine allocates
// them (it aborted the process, after serve had opened its port): the plan refuses the count.
TEST(MemoryPlan, MaxPrefillTokensWhoseActivationsExceedTheDeviceIsNamed) {
  ModelConfig c = qwen36_27b();
  MemoryPlanInput in = story_input();
  in.max_prefill_tokens = 2'000'000'000;
  MemoryPlan p = plan_memory(c, in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("lower --max-prefill-tokens (2,000,000,000"),
            std::string::npos) << p.status().message();
  in.max_prefill_tokens = 16384;  // the seeds' value plans as before
  EXPECT_TRUE(plan_memory(c, in).ok());
  // A GPU too small for the weights: that is the error, not the (auto) prefill budget.
  in.max_prefill_tokens = 8192;
  in.device_memory_bytes = 4 * kGiB;
  p = plan_memory(c, in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("the weights"), std::string::npos) << p.status().message();
  EXPECT_EQ(p.status().message().find("--max-prefill-tokens"), std::string::npos) << p.status().message();
}

// The relaunch of the story: --speculative-num-steps 1, everything else default, same GPUs (as
// `plan --gpu-memory 48GiB`).
MemoryPlanInput relaunch_input() {
  MemoryPlanInput in;
  in.device_memory_bytes = 48 * kGiB;
  in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
  in.tp_size = 2;
  in.spec_num_steps = 1;
  in.chunked_prefill_size = 8192;
  in.max_prefill_tokens = 8192;
  return in;
}

TEST(MemoryPlan, RelaunchWithDefaults) {
  ModelConfig c = qwen36_27b();
  MemoryPlan p = plan_memory(c, relaunch_input());
  ASSERT_TRUE(p.ok()) << p.status().message();
  for (auto& w : p.warnings) ADD_FAILURE() << w;
  // Running requests are auto: the most r whose step buffers (logits of 3r rows, a step of
  // 8,192 + 2r tokens) leave room for r requests' state, each with its prefix-cache checkpoint.
  // r = 51: reserve = step_memory(51) + 512 MiB of CUDA graphs + 384 MiB of collective buffers.
  StepShape s = step_shape(8192, 51, 1, 262144, 16);
  s.tp = 2;
  s.cuda = true;
  EXPECT_EQ(p.activation_reserve_bytes, step_memory(c, s).total() + (int64_t(512) << 20) + (int64_t(384) << 20));
  EXPECT_EQ(p.activation_reserve_bytes, int64_t{4833001392});
  // auto fraction: 1 - 4.83/51.54 - 0.02 = 0.886 -> 0.88
  EXPECT_DOUBLE_EQ(p.mem_fraction_static, 0.88);
  // budget = 51,539,607,552 x 0.88 - 805,306,368 = 44,549,548,277; cache = - 27,321,358,336
  // = 17,228,189,941; state = x 0.9/1.9 = 8,160,721,551; per request 78,446,592 + 48 x 2 x 5,168 x 4
  // = 80,431,104, + its checkpoint 78,446,592 = 158,877,696 -> 51 slots and 51 checkpoints
  EXPECT_EQ(p.state_slots, 51);
  EXPECT_EQ(p.checkpoint_slots, 51);
  EXPECT_EQ(p.max_running_requests, 51);
  // KV = 17,228,189,941 - 51 x 158,877,696 = 9,125,427,445 / 34,816 = 262,104 -> 262,096
  EXPECT_EQ(p.kv_tokens, 262096);
  EXPECT_EQ(p.context_length, 262096);
  std::string table = render_memory_plan(p);
  EXPECT_NE(table.find("KV tokens"), std::string::npos);
  EXPECT_NE(table.find("a step of 8,294 tokens"), std::string::npos) << table;
}

// The prefix cache needs a checkpoint (a GDN state) per conversation it keeps: the plan's own
// choices and the flags' give request slots their checkpoints, and say so when they cannot.
TEST(MemoryPlan, MambaCacheSizeCountsRequestSlotsAndCheckpoints) {
  // --max-mamba-cache-size 20 alone: 10 request slots and 10 checkpoints (it once gave the whole
  // budget to 98 request slots and left no checkpoint: every prompt recomputed).
  MemoryPlanInput in = relaunch_input();
  in.max_state_slots = 20;
  MemoryPlan p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 10);
  EXPECT_EQ(p.checkpoint_slots, 10);
  for (auto& w : p.warnings) ADD_FAILURE() << w;
  // With --max-running-requests 16: 16 request slots, the 4 left are checkpoints.
  in.max_running_requests = 16;
  p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 16);
  EXPECT_EQ(p.checkpoint_slots, 4);
  // No room left for any: the plan says prompts are recomputed.
  in.max_running_requests = 20;
  p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 20);
  EXPECT_EQ(p.checkpoint_slots, 0);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("leaves no prefix-cache checkpoint"), std::string::npos) << p.warnings[0];
}

TEST(MemoryPlan, RaisedStateSplitKeepsACheckpointPerRequest) {
  // --max-running-requests 60 with the default ratio (51 fit with checkpoints): the plan raises the
  // state split for the request slots and their checkpoints (it once raised it for the slots
  // alone: 0 checkpoints, silently).
  MemoryPlanInput in = relaunch_input();
  in.max_running_requests = 60;
  MemoryPlan p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 60);
  EXPECT_EQ(p.checkpoint_slots, 60);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("--max-running-requests 60 with their prefix-cache checkpoints"), std::string::npos)
      << p.warnings[0];
  // 120 with their checkpoints would leave no KV: the slots alone, and the plan says the
  // checkpoints are missing.
  in.max_running_requests = 120;
  p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 120);
  EXPECT_EQ(p.checkpoint_slots, 0);
  bool said = false;
  for (auto& w : p.warnings) said = said || w.find("the prefix cache asks for 120 checkpoints (one per request slot); the state budget holds 0") != std::string::npos;
  EXPECT_TRUE(said);
  // An explicit ratio is kept: the slots fit, the checkpoints get what is left, with a warning.
  in.max_running_requests = 60;
  in.mamba_full_memory_ratio = 0.9;
  in.mamba_full_memory_ratio_explicit = true;
  p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 60);
  EXPECT_LT(p.checkpoint_slots, 60);
  EXPECT_GT(p.checkpoint_slots, 0);
  bool warned = false;
  for (auto& w : p.warnings) warned = warned || w.find("the prefix cache asks for 60 checkpoints") != std::string::npos;
  EXPECT_TRUE(warned);
  // One 80 GB GPU (TP1), 64 requests of up to 8,208 tokens (bench-offline's batch 64): their slots
  // and checkpoints would leave KV for ~27k tokens, 424 a request, so the batch never ran at once.
  // The running requests come first: the split is raised for their slots alone, KV keeps at least
  // 2,048 tokens a request, and the missing checkpoints are named.
  MemoryPlanInput one = relaunch_input();
  one.device_memory_bytes = 80 * kGiB;
  one.tp_size = 1;
  one.spec_num_steps = 0;
  one.max_running_requests = 64;
  one.context_length = 8208;
  p = plan_memory(qwen36_27b(), one);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 64);
  EXPECT_GE(p.kv_tokens, 64 * 2048);
  EXPECT_LT(p.checkpoint_slots, 64);
  bool named = false;
  for (auto& w : p.warnings) named = named || w.find("the prefix cache asks for 64 checkpoints") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(MemoryPlan, ExplicitContextThatCannotFitNamesTheMax) {
  ModelConfig c = qwen36_27b();
  MemoryPlanInput in;
  in.device_memory_bytes = 48 * kGiB;
  in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
  in.tp_size = 2;
  in.spec_num_steps = 1;
  in.context_length = 1000000;
  MemoryPlan p = plan_memory(c, in);
  ASSERT_FALSE(p.ok());
  const std::string err = p.status().message();
  EXPECT_NE(err.find("--context-length 1,000,000 does not fit"), std::string::npos) << err;
  EXPECT_NE(err.find("Set --context-length 278,016"), std::string::npos) << err;  // what the plan holds
  ASSERT_FALSE(p.warnings.empty());  // also beyond the model's 262,144
}

TEST(MemoryPlan, WeightsThatDoNotFitSayWhichTp) {
  MemoryPlanInput in;
  in.device_memory_bytes = 24 * kGiB;
  in.tp_size = 1;
  MemoryPlan p = plan_memory(qwen36_27b(), in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("use --tp-size 4"), std::string::npos) << p.status().message();
  // Only sizes the model splits into (stop 55: 12 GiB suggested 16, which 24 heads refuse; 8 fits).
  in.device_memory_bytes = 12 * kGiB;
  in.tp_size = 2;
  p = plan_memory(qwen36_27b(), in);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("use --tp-size 8"), std::string::npos) << p.status().message();
}

TEST(MemoryPlan, CpuBudgetAndDenseModel) {
  // qwen3-tiny: dense, tied, 4 layers x 2 KV heads x 16 x 2 x 4 B (f32 CPU cache) = 1,024 B/token.
  ModelConfig c = load("tests/fixtures/qwen3-tiny");
  MemoryPlanInput in;
  in.device = PlanDevice::Cpu;
  in.device_memory_bytes = 16 * kGiB;
  in.max_memory_bytes = 64 << 20;  // 64 MiB
  in.kv_bytes_per_elem = 4;
  MemoryPlan p = plan_memory(c, in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.kv_bytes_per_token_per_gpu, 1024);
  EXPECT_EQ(p.state_slots, 0);
  EXPECT_EQ(p.weights_bytes_per_gpu, 180928 * 2);
  // reserve: a step of 1,024 + 64 tokens with logits for 128 rows, contexts up to 4,096 (the
  // model's), on one thread (model/step_memory.h; tests/engine/step_memory_test.cpp holds it to
  // the engine's allocations)
  StepShape s = step_shape(1024, 64, 0, 4096, 16);
  EXPECT_EQ(p.activation_reserve_bytes, step_memory(c, s).total());
  // cache = 67,108,864 - 361,856 - reserve -> tokens of 1,024 B in blocks of 16
  EXPECT_EQ(p.kv_tokens, (67108864 - 361856 - p.activation_reserve_bytes) / 1024 / 16 * 16);
  EXPECT_EQ(p.max_running_requests, 64);  // CPU running-request cap
  EXPECT_EQ(p.context_length, 4096);
  // CPU tensor-parallel ranks are threads of one process sharing its memory: the weights are the
  // same; each rank keeps its own step buffers (the residual rows are whole on every rank).
  in.tp_size = 2;
  const MemoryPlan tp2 = plan_memory(c, in);
  ASSERT_TRUE(tp2.ok());
  s.tp = 2;
  EXPECT_EQ(tp2.activation_reserve_bytes, 2 * step_memory(c, s).total());
  EXPECT_LT(tp2.kv_tokens, p.kv_tokens);
  EXPECT_EQ(tp2.weights_bytes_per_gpu, p.weights_bytes_per_gpu);
}

TEST(MemoryPlan, SmallModelKvIsCappedAtRunningTimesContext) {
  // qwen35-tiny on a 1 GiB CPU budget: the KV that fits (~hundreds of thousands of tokens) is more
  // than 64 state slots x 4,096 tokens of context could ever use, so it stops at 262,144.
  MemoryPlanInput in;
  in.device = PlanDevice::Cpu;
  in.device_memory_bytes = 16 * kGiB;
  in.max_memory_bytes = kGiB;
  in.kv_bytes_per_elem = 4;
  MemoryPlan p = plan_memory(load("tests/fixtures/qwen35-tiny"), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p.state_slots, 64);
  EXPECT_EQ(p.kv_tokens, 64 * 4096);
  EXPECT_NE(render_memory_plan(p).find("running requests x context length"), std::string::npos);
}

// --mamba-ssm-dtype: bfloat16 halves the recurrent state of every request slot and checkpoint, so
// the same budget keeps more KV tokens; auto takes the config's mamba_ssm_dtype.
TEST(MemoryPlan, MambaSsmDtypeSizesTheState) {
  auto plan_with = [](std::vector<std::string> flags, const ModelConfig& c) {
    std::vector<std::string> args = {"--model-path", "x", "--tp-size", "2", "--mem-fraction-static", "0.88",
                                     "--mamba-full-memory-ratio", "0.5", "--speculative-algorithm", "NEXTN",
                                     "--speculative-num-steps", "3", "--context-length", "131072",
                                     "--max-running-requests", "15"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto opts = parse_serve_options(args);
    EXPECT_TRUE(opts) << opts.status().message();
    MemoryPlanInput in = memory_plan_input(*opts, PlanDevice::Cuda, 48 * kGiB, HostInfo{});
    in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
    return plan_memory(c, in);
  };
  const ModelConfig c = qwen36_27b();
  const MemoryPlan f32 = plan_with({}, c), bf16 = plan_with({"--mamba-ssm-dtype", "bfloat16"}, c);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ(f32.state_dtype, DType::F32);  // the config's mamba_ssm_dtype is float32
  EXPECT_EQ(bf16.state_dtype, DType::BF16);
  EXPECT_EQ(f32.state_bytes_per_request_per_gpu, 82415616);
  EXPECT_EQ(bf16.state_bytes_per_request_per_gpu, 40697856 + 3969024);
  EXPECT_EQ(bf16.state_bytes_per_slot_base, 40697856);
  // The same 15 requests and 15 checkpoints: (78,446,592 - 40,697,856) x 15 x 2 B more for KV.
  EXPECT_EQ(bf16.max_running_requests, f32.max_running_requests);
  EXPECT_EQ(bf16.checkpoint_slots, f32.checkpoint_slots);
  EXPECT_GE(bf16.kv_tokens - f32.kv_tokens, (78446592 - 40697856) * 30 / (34 * 1024) - 16);
  bool named = false;
  for (const PlanRow& r : bf16.rows) named = named || r.detail.find("recurrent bf16, --mamba-ssm-dtype") != std::string::npos;
  EXPECT_TRUE(named) << "the plan names the state dtype and where it came from";
  ModelConfig cb = c;
  cb.mamba_ssm_dtype = "bfloat16";
  EXPECT_EQ(plan_with({}, cb).state_dtype, DType::BF16);
  EXPECT_EQ(plan_with({"--mamba-ssm-dtype", "float32"}, cb).state_dtype, DType::F32);
  EXPECT_FALSE(parse_serve_options({"--model-path", "x", "--mamba-ssm-dtype", "float16"}));
}

// --dtype: the plan sizes the matmul weights as the engine loads them, bf16 (auto, bfloat16) or,
// on the CPU with float32, f32.
TEST(MemoryPlan, DtypeSizesTheWeightsAsTheEngineLoadsThem) {
  auto plan_with = [](PlanDevice device, std::vector<std::string> flags) {
    std::vector<std::string> args = {"--model-path", "x"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto opts = parse_serve_options(args);
    EXPECT_TRUE(opts) << opts.status().message();
    MemoryPlanInput in = memory_plan_input(*opts, device, 256 * kGiB, HostInfo{});
    if (device == PlanDevice::Cuda) in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
    return plan_memory(qwen36_27b(), in);
  };
  const MemoryPlan cuda = plan_with(PlanDevice::Cuda, {}), cuda_bf16 = plan_with(PlanDevice::Cuda, {"--dtype", "bfloat16"});
  ASSERT_TRUE(cuda.ok() && cuda_bf16.ok());
  EXPECT_EQ(cuda_bf16.weights_bytes_per_gpu, cuda.weights_bytes_per_gpu);
  EXPECT_EQ(cuda_bf16.kv_tokens, cuda.kv_tokens);
  const MemoryPlan cpu = plan_with(PlanDevice::Cpu, {}), cpu_f32 = plan_with(PlanDevice::Cpu, {"--dtype", "float32"});
  ASSERT_TRUE(cpu.ok() && cpu_f32.ok()) << cpu.status().message() << " / " << cpu_f32.status().message();
  EXPECT_EQ(cpu_f32.weights_bytes_per_gpu, 2 * cpu.weights_bytes_per_gpu);
  EXPECT_LT(cpu_f32.kv_tokens, cpu.kv_tokens);
}

TEST(MemoryPlan, FromServeFlagsAndJson) {
  auto opts = parse_serve_options({"--model-path", "x", "--tp-size", "2", "--mem-fraction-static", "0.88",
                                   "--mamba-full-memory-ratio", "0.5", "--speculative-algorithm", "NEXTN",
                                   "--speculative-num-steps", "3", "--context-length", "131072",
                                   "--max-running-requests", "15"});
  ASSERT_TRUE(opts) << opts.status().message();
  HostInfo host;
  MemoryPlanInput in = memory_plan_input(*opts, PlanDevice::Cuda, 48 * kGiB, host);
  in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
  EXPECT_EQ(in.spec_num_steps, 3);
  EXPECT_TRUE(in.mamba_full_memory_ratio_explicit);
  MemoryPlan p = plan_memory(qwen36_27b(), in);
  ASSERT_TRUE(p.ok()) << p.status().message();
  auto j = nlohmann::json::parse(memory_plan_json(p, in));
  EXPECT_EQ(j["weights_bytes_per_gpu"], int64_t{27321358336});
  EXPECT_EQ(j["kv_bytes_per_token_per_gpu"], 34816);
  EXPECT_EQ(j["state_bytes_per_request_per_gpu"], 82415616);
  // (44,549,548,277 - 27,321,358,336 - 15 x 82,415,616 - 15 x 78,446,592 checkpoints) / 34,816 -> 425,520
  EXPECT_EQ(j["kv_tokens"], 425520);
  EXPECT_EQ(j["max_total_num_tokens"], 425520);
  EXPECT_EQ(j["max_mamba_cache_size"], 30);
  EXPECT_EQ(j["kv_cache_dtype"], "bf16");
  EXPECT_EQ(j["max_running_requests"], 15);
  EXPECT_EQ(j["context_length"], 131072);
}

// Found by review (stop 55). (1) Auto running requests: the plan for the cap (256) failed on 2 x
// 32 GB with MTP (its step buffers lowered the automatic fraction below the weights), and that
// error was returned although 4 requests fit. (2) A context shorter than a block: KV was capped at
// running x context rounded once, so only 1 request fit, with 20 GiB unused. (3) An explicit
// --max-running-requests bound lower by --max-mamba-cache-size was lowered silently.
TEST(MemoryPlan, ReviewOfTheAutomaticChoices) {
  auto plan = [](const std::vector<std::string>& flags, int64_t gpu) {
    std::vector<std::string> args = {"--model-path", "x"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto opts = parse_serve_options(args);
    EXPECT_TRUE(opts) << opts.status().message();
    HostInfo host;
    MemoryPlanInput in = memory_plan_input(*opts, PlanDevice::Cuda, gpu, host);
    in.device_memory_used_bytes = MemoryPlanInput::kCudaContextBytes;
    return plan_memory(qwen36_27b(), in);
  };
  MemoryPlan a = plan({"--tp-size", "2", "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"}, 32 * kGiB);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_GE(a.max_running_requests, 2) << render_memory_plan(a);  // 3: the default state split's slots
  // Still an error when not one request fits: the weights alone.
  EXPECT_FALSE(plan({}, 24 * kGiB).ok());

  MemoryPlan b = plan({"--context-length", "1000", "--page-size", "4096"}, 80 * kGiB);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const MemoryPlan same = plan({"--context-length", "1000"}, 80 * kGiB);
  EXPECT_GT(b.max_running_requests, 1);
  EXPECT_EQ(b.max_running_requests, same.max_running_requests);
  EXPECT_GE(b.kv_tokens, b.max_running_requests * 4096);

  MemoryPlan c = plan({"--max-mamba-cache-size", "10", "--max-running-requests", "20"}, 80 * kGiB);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.max_running_requests, 10);
  bool named = false;
  for (const auto& w : c.warnings) named |= w.find("--max-running-requests 20 is lowered to 10") != std::string::npos &&
                                            w.find("--max-mamba-cache-size") != std::string::npos;
  EXPECT_TRUE(named) << render_memory_plan(c);
  // The 27B on a 200 GiB CPU budget, f32 KV, 4 running requests, over tp ranks and dp replicas.
  auto cpu_plan = [](int tp, int dp) {
    MemoryPlanInput in;
    in.device = PlanDevice::Cpu;
    in.device_memory_bytes = 512 * kGiB;
    in.max_memory_bytes = 200 * kGiB;
    in.tp_size = tp;
    in.dp_size = dp;
    in.kv_bytes_per_elem = 4;
    in.max_running_requests = 4;
    return plan_memory(qwen36_27b(), in);
  };
  // CPU ranks past num_key_value_heads (4) each keep a replicated KV head in the one process:
  // 8 ranks hold 8 heads' KV a token, twice what 4 ranks (or one) hold.
  auto cpu_kv = [&](int tp) { return cpu_plan(tp, 1).kv_bytes_per_token_per_gpu; };
  EXPECT_EQ(cpu_kv(1), 16 * 2 * 4 * 256 * 4);
  EXPECT_EQ(cpu_kv(4), cpu_kv(1));
  EXPECT_EQ(cpu_kv(8), 2 * cpu_kv(1));
  // CPU --dp-size: every replica loads the weights and its step buffers in the one process.
  const MemoryPlan one = cpu_plan(1, 1), two = cpu_plan(1, 2);
  ASSERT_TRUE(one.ok() && two.ok()) << one.status().message() << two.status().message();
  EXPECT_EQ(two.cache_bytes, one.cache_bytes - one.weights_bytes_per_gpu - one.activation_reserve_bytes);
  EXPECT_NE(render_memory_plan(two).find("data-parallel replicas"), std::string::npos);
  // --max-mamba-cache-size alone, larger than the default split holds: the warning names it (it
  // read "warning:  0 with their prefix-cache checkpoints ...").
  MemoryPlan d = plan({"--max-mamba-cache-size", "100"}, 80 * kGiB);
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_FALSE(d.warnings.empty());
  for (const auto& w : d.warnings) {
    EXPECT_EQ(w.find(" 0 "), std::string::npos) << w;
    EXPECT_NE(w.find("--max-mamba-cache-size 100"), std::string::npos) << w;
  }
}

TEST(Hardware, ParsesNvidiaSmiAndMeminfo) {
  auto gpus = parse_nvidia_smi_csv("NVIDIA RTX A6000, 49140\nNVIDIA RTX A6000, 49140\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].name, "NVIDIA RTX A6000");
  EXPECT_EQ(gpus[0].memory_bytes, int64_t{49140} << 20);
  int64_t total = 0, avail = 0;
  parse_meminfo("MemTotal:       131072000 kB\nMemFree: 1 kB\nMemAvailable:   65536000 kB\n", &total, &avail);
  EXPECT_EQ(total, int64_t{131072000} * 1024);
  EXPECT_EQ(avail, int64_t{65536000} * 1024);
  HostInfo h;
  h.gpus = gpus;
  EXPECT_EQ(h.summary(), "2x NVIDIA RTX A6000 (47.99 GiB)");
}

}  // namespace
}  // namespace deltaserve
