// bench_cuda_decode: the engine's forward passes on one GPU with dummy (random bf16) weights.
//
//   bench_cuda_decode [--model DIR] [--ctx N] [--steps N] [--prefill N] [--batch N] [--no-graph]
//                     [--prefill-chunk N] [--prefill-only] [--kv-dtype f32|bf16|fp8_e4m3|fp8_e5m2]
//                     [--mixed N[,N...]] [--mixed-only]
//
// Reports: weight-load time; TTFT of a --prefill-token prompt; decode tokens/s at batch 1 (CUDA
// graph of Model::forward; and eager through ModelRunner) with the fraction of HBM bandwidth that
// the weight stream reaches; one 4-token verification forward (GDN state deferred), its commit + 3
// single-token MTP steps; aggregate decode tokens/s at --batch concurrent sequences; a per-op
// time breakdown (CUDA events around each Kernels call) for decode and prefill. --mixed N: what a
// continuous-batching step that mixes --batch - 1 decode rows with one sequence's N-token prefill
// chunk costs through ModelRunner (eager, greedy argmax), against each part alone, and its ops;
// a list of N times each; --mixed-only skips every other section (the GEMMs' row tiles: N against
// N + 1 rows around a multiple of 64 or 128).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cache/cache_memory.h"
#include "backend/backend_factory.h"
#include "engine/model_runner.h"
#include "model/model.h"
#include "bench_check.h"

using namespace deltaserve;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Opts {
  std::string model = std::string(DELTASERVE_SOURCE_DIR) + "/bench/configs/qwen3.6-27b";
  int ctx = 128, steps = 64, prefill = 8192, batch = 16;
  int prefill_chunk = 0;      // > 0: the TTFT prompt goes through forwards of this many tokens
  bool graph = true;
  bool prefill_only = false;  // stop after the TTFT section
  std::vector<int> mixed;     // time a step mixing --batch - 1 decode rows with a chunk of each many tokens
  bool mixed_only = false;    // only the mixed steps
  DType kv_dtype = DType::F32;  // KV cache element type (scales 1: dummy weights have none)
};

// Bytes of matmul weights one plain decode step streams (main model + lm_head; no MTP, no embedding).
double decode_weight_bytes(const ModelConfig& c) {
  const double H = double(c.hidden_size), I = double(c.intermediate_size);
  double b = 0;
  for (auto t : c.layer_types) {
    if (t == LayerType::FullAttention) {
      const double q = double(c.n_heads) * c.head_dim * (c.attn_output_gate ? 2 : 1);
      const double kv = double(c.n_kv_heads) * c.head_dim;
      b += (q + 2 * kv) * H + H * double(c.n_heads) * c.head_dim;
    } else {
      const double proj = double(c.linear_conv_dim() + c.linear_value_dim() + 2LL * c.linear_n_value_heads);
      b += proj * H + H * double(c.linear_value_dim());
    }
    b += 3 * I * H;
  }
  b += double(c.vocab_size) * H;
  return b * 2;
}

// A fixed-shape batch (n_seqs sequences x tok tokens each) whose Model::forward (or forward_mtp)
// is captured once in a CUDA graph and replayed; the metadata travels from a ring of pinned host
// staging areas (one per replay) so that no host write races an earlier copy.
class GraphStep {
 public:
  GraphStep(Backend& be, Model& model, CacheMemory& cache, const MemoryViews& views,
            std::vector<std::vector<int32_t>> blocks,
            std::vector<int32_t> slots, int tok, bool mtp, bool verify, int ring)
      : be_(be), model_(model), cache_(cache), views_(views), blocks_(std::move(blocks)), slots_(std::move(slots)),
        S_(static_cast<int>(slots_.size())), tok_(tok), mtp_(mtp), verify_(verify), ring_(ring) {
    T_ = S_ * tok_;
    B_ = 0;
    for (auto& b : blocks_) B_ = std::max<int>(B_, b.size());
    stride_ = T_ + T_ + (S_ + 1) + S_ + S_ * B_ + S_ + S_;
    CK(cudaMallocHost(&host_, sizeof(int32_t) * stride_ * ring_));
    dev_ = be.allocate(sizeof(int32_t) * stride_);
    const int64_t H = model.config().hidden_size, V = model.config().vocab_size;
    logits_ = be.allocate(sizeof(float) * S_ * V);
    hidden_a_ = be.allocate(sizeof(float) * T_ * H);
    hidden_b_ = be.allocate(sizeof(float) * T_ * H);
    for (int s = 0; s < S_; ++s) out_rows_.push_back(s * tok_ + tok_ - 1);
    stream_ = static_cast<cudaStream_t>(cuda_stream(be));
    int32_t* d = static_cast<int32_t*>(dev_.data());
    ids_ = Tensor(d, DType::I32, {T_}, Device::Cuda);
    meta_.n_tokens = T_;
    meta_.n_seqs = S_;
    meta_.max_blocks = B_;
    meta_.block_size = cache.config().block_size;
    meta_.max_seq_tokens = tok_;
    meta_.d_positions = Tensor(d + T_, DType::I32, {T_}, Device::Cuda);
    meta_.d_seq_start = Tensor(d + 2 * T_, DType::I32, {S_ + 1}, Device::Cuda);
    meta_.d_context_len = Tensor(d + 2 * T_ + S_ + 1, DType::I32, {S_}, Device::Cuda);
    meta_.d_block_table = Tensor(d + 2 * T_ + 2 * S_ + 1, DType::I32, {S_, B_}, Device::Cuda);
    meta_.d_state_slot = Tensor(d + 2 * T_ + 2 * S_ + 1 + S_ * B_, DType::I32, {S_}, Device::Cuda);
    meta_.d_state_defer = Tensor(d + 2 * T_ + 3 * S_ + 1 + S_ * B_, DType::I32, {S_}, Device::Cuda);
  }
  ~GraphStep() {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaFreeHost(host_);
  }
  // Stages sequence s at n_past (same for all sequences) into ring slot r and queues its copy.
  void stage(int n_past, int r) {
    int32_t* h = host_ + int64_t(stride_) * (r % ring_);
    int32_t *ids = h, *pos = h + T_, *start = pos + T_, *ctx = start + S_ + 1, *bt = ctx + S_, *sl = bt + S_ * B_;
    int32_t* defer = sl + S_;
    for (int s = 0; s < S_; ++s) {
      start[s] = s * tok_;
      defer[s] = verify_ ? 1 : 0;
      ctx[s] = n_past + tok_;
      sl[s] = slots_[s];
      for (int b = 0; b < B_; ++b) bt[s * B_ + b] = b < int(blocks_[s].size()) ? blocks_[s][b] : -1;
      for (int j = 0; j < tok_; ++j) {
        ids[s * tok_ + j] = 1000 + (n_past + j) % 5000;
        pos[s * tok_ + j] = n_past + j;
      }
    }
    start[S_] = T_;
    // Host view (read by the launch configuration) points at the first ring slot; only the
    // shape fields are used there and they never change.
    if (r == 0) {
      meta_.positions = pos;
      meta_.seq_start = start;
      meta_.context_len = ctx;
      meta_.block_table = bt;
      meta_.state_slot = sl;
      meta_.state_defer = verify_ ? defer : nullptr;
      meta_.max_context = n_past + tok_;
    }
    CK(cudaMemcpyAsync(dev_.data(), h, sizeof(int32_t) * stride_, cudaMemcpyHostToDevice, stream_));
  }
  void forward() {
    if (mtp_) {
      MtpArgs a;
      a.meta = &meta_;
      a.ids = ids_;
      a.hidden_in = hidden_a_.view(DType::F32, {T_, model_.config().hidden_size});
      a.hidden_out = hidden_b_.view(DType::F32, {T_, model_.config().hidden_size});
      a.memory = &views_;
      a.output_rows = out_rows_.data();
      a.n_output_rows = S_;
      a.logits = logits_.view(DType::F32, {S_, model_.config().vocab_size});
      model_.forward_mtp(a);
      // The next draft step reads this step's hidden.
      CK(cudaMemcpyAsync(hidden_a_.data(), hidden_b_.data(), hidden_a_.size(), cudaMemcpyDeviceToDevice, stream_));
    } else {
      ForwardArgs a;
      a.meta = &meta_;
      a.ids = ids_;
      a.memory = &views_;
      a.output_rows = out_rows_.data();
      a.n_output_rows = S_;
      a.logits = logits_.view(DType::F32, {S_, model_.config().vocab_size});
      if (verify_) a.hidden = hidden_a_.view(DType::F32, {T_, model_.config().hidden_size});
      model_.forward(a);
    }
  }
  void capture(int n_past) {
    stage(n_past, 0);
    forward();  // warm-up: sizes scratch buffers, creates lazily made state
    be_.synchronize();
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    forward();
    CK(cudaStreamEndCapture(stream_, &g));
    CK(cudaGraphInstantiate(&exec_, g, 0));
    CK(cudaGraphDestroy(g));
  }
  void launch(bool use_graph) {
    if (use_graph) CK(cudaGraphLaunch(exec_, stream_));
    else forward();
  }

 private:
  Backend& be_;
  Model& model_;
  CacheMemory& cache_;
  const MemoryViews& views_;
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<int32_t> slots_;
  int S_, tok_;
  bool mtp_, verify_;
  int ring_;
  int T_ = 0, B_ = 0;
  int64_t stride_ = 0;
  int32_t* host_ = nullptr;
  DeviceBuffer dev_, logits_, hidden_a_, hidden_b_;
  std::vector<int32_t> out_rows_;
  cudaStream_t stream_;
  Tensor ids_;
  BatchMeta meta_;
  cudaGraphExec_t exec_ = nullptr;
};

void print_times(const char* title, Backend& be, int divide) {
  auto t = cuda_take_op_times(be);
  double total = 0;
  for (auto& x : t) total += x.ms;
  std::printf("\n%s (per step; %d steps; sum %.3f ms/step)\n", title, divide, total / divide);
  std::printf("  %-34s %8s %10s %6s\n", "op", "calls", "ms/step", "%");
  int shown = 0;
  for (auto& x : t) {
    if (shown++ >= 16) break;
    std::printf("  %-34s %8d %10.4f %5.1f%%\n", x.name.c_str(), x.calls / divide, x.ms / divide, 100.0 * x.ms / total);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") o.model = next();
    else if (a == "--ctx") o.ctx = std::stoi(next());
    else if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--prefill") o.prefill = std::stoi(next());
    else if (a == "--batch") o.batch = std::stoi(next());
    else if (a == "--no-graph") o.graph = false;
    else if (a == "--prefill-chunk") o.prefill_chunk = std::stoi(next());
    else if (a == "--prefill-only") o.prefill_only = true;
    else if (a == "--mixed") {
      const std::string v = next();
      for (std::size_t p = 0; p < v.size();) {
        const std::size_t c = std::min(v.find(',', p), v.size());
        o.mixed.push_back(std::stoi(v.substr(p, c - p)));
        p = c + 1;
      }
    } else if (a == "--mixed-only") o.mixed_only = true;
    else if (a == "--kv-dtype") {
      const std::string v = next();
      bool ok = false;
      for (DType d : {DType::F32, DType::BF16, DType::F8E4M3, DType::F8E5M2})
        if (v == dtype_name(d)) {
          o.kv_dtype = d;
          ok = true;
        }
      if (!ok) {
        std::fprintf(stderr, "--kv-dtype: '%s' is not one of f32, bf16, fp8_e4m3, fp8_e5m2\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--model DIR] [--ctx N] [--steps N] [--prefill N] [--batch N] [--no-graph]\n"
                   "          [--prefill-chunk N] [--prefill-only] [--kv-dtype f32|bf16|fp8_e4m3|fp8_e5m2]\n"
                   "          [--mixed N[,N...]] [--mixed-only]\n",
                   argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("bench_cuda_decode: no CUDA device\n");
    return 0;
  }
  auto be_r = make_backend("cuda", 0);
  if (!be_r.is_ok()) {
    std::fprintf(stderr, "%s\n", be_r.status().message().c_str());
    return 1;
  }
  std::unique_ptr<Backend> be_owned = std::move(*be_r);
  Backend* be = be_owned.get();  // rank 0 of the group below from then on
  std::printf("device: %s\nmodel: %s (dummy weights)\n", be->description().c_str(), o.model.c_str());

  // Ceiling: device-to-device copy bandwidth (bytes read + written).
  double copy_tbs = 0;
  {
    const std::size_t n = std::size_t(4) << 30;
    DeviceBuffer a = be->allocate(n), b = be->allocate(n);
    cudaStream_t s = static_cast<cudaStream_t>(cuda_stream(*be));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < 5; ++i) CK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    copy_tbs = 5.0 * 2 * n / (ms * 1e-3) / 1e12;
    std::printf("d2d copy bandwidth: %.2f TB/s (read + write)\n", copy_tbs);
  }

  double t0 = now_s();
  RankGroupOptions ro;
  ro.model_dir = o.model;
  ro.device = "cuda";
  ro.load.dummy_weights = true;
  auto group_r = RankGroup::create(ro, std::move(be_owned));
  if (!group_r.is_ok()) {
    std::fprintf(stderr, "%s\n", group_r.status().message().c_str());
    return 1;
  }
  std::unique_ptr<RankGroup> group = std::move(*group_r);
  Model* model = &group->model();
  be->synchronize();
  const ModelConfig& cfg = model->config();
  const double wbytes = decode_weight_bytes(cfg);
  std::printf("weights: %.2f GB loaded in %.1f s; decode streams %.2f GB of matmul weights per step\n",
              model->weight_bytes() / 1e9, now_s() - t0, wbytes / 1e9);

  const int bs = 16;
  const int long_ctx = std::max(o.prefill, o.ctx + o.steps + 64) + 16;
  const int blocks_per_seq = (long_ctx + bs - 1) / bs;
  const int n_seqs = std::max(o.batch, 1) + 2;
  CacheConfig cc;
  cc.block_size = bs;
  cc.n_blocks = blocks_per_seq * n_seqs;
  cc.n_slots = n_seqs;
  cc.pending_depth = 4;  // verification runs of 4 tokens defer their GDN state
  cc.kv_dtype = o.kv_dtype;
  CacheMemory cache(*be, model->memory_spec(), cc);
  const MemoryViews& views = cache.views();
  RunnerLimits lim;
  // The batch-N section prefills its --batch prompts in one forward; --mixed-only prefills them
  // one at a time (long --ctx).
  lim.max_tokens = std::max(o.prefill, o.mixed_only ? o.ctx : o.ctx * o.batch);
  lim.max_seqs = n_seqs;
  lim.max_blocks_per_seq = blocks_per_seq;
  lim.max_logit_rows = std::max(16, o.batch);
  lim.mtp = true;  // commit_state staging
  ModelRunner runner(*group, cache, lim);
  std::printf("cache: %d blocks x %d tokens, KV %s, %d slots, pending depth 4; free after setup: %.1f GiB\n",
              cc.n_blocks, bs, std::string(dtype_name(cache.kv_dtype())).c_str(), cc.n_slots,
              be->memory_info().free_bytes / double(1 << 30));

  std::mt19937 rng(7);
  auto new_seq = [&](std::vector<int32_t>& blocks) {
    blocks.clear();
    if (!cache.blocks().allocate(blocks_per_seq, blocks)) {
      std::fprintf(stderr, "out of KV blocks\n");
      std::exit(1);
    }
    return cache.acquire_slot();
  };
  auto free_seq = [&](std::vector<int32_t>& blocks, int slot) {
    for (auto b : blocks) cache.blocks().release(b);
    cache.release_slot(slot);
  };
  auto prompt = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % std::min<int64_t>(cfg.vocab_size, 100000));
    return t;
  };

  // ---- TTFT ---------------------------------------------------------------------------------
  double ttft = 0;
  if (o.prefill > 0 && !o.mixed_only) {
    std::vector<int32_t> blocks;
    int slot = new_seq(blocks);
    // The whole prompt in one forward, or (--prefill-chunk) in chunks continuing the cached prefix.
    const int chunk = o.prefill_chunk > 0 ? std::min(o.prefill_chunk, o.prefill) : o.prefill;
    // A warm-up forward of one chunk: the GEMMs of that row count are planned (and, where
    // DELTASERVE_CUDA_GEMM_TUNE_ROWS reaches it, timed) before the timed prompt.
    auto warm = prompt(chunk);
    RunItem w{warm, 0, blocks, slot, false, false};
    runner.run(std::span<const RunItem>(&w, 1));
    free_seq(blocks, slot);
    auto p = prompt(o.prefill);
    slot = new_seq(blocks);
    auto run_prompt = [&] {
      for (int past = 0; past < o.prefill; past += chunk) {
        const int n = std::min(chunk, o.prefill - past);
        RunItem it{std::span<const int32_t>(p).subspan(past, n), past, blocks, slot, false, past + n < o.prefill};
        runner.run(std::span<const RunItem>(&it, 1));
      }
    };
    be->synchronize();
    t0 = now_s();
    run_prompt();
    ttft = now_s() - t0;
    free_seq(blocks, slot);
    std::printf("\nTTFT (%d-token prompt, %d forward(s) of <= %d tokens + logits to host): %.1f ms (%.0f tok/s prefill)\n",
                o.prefill, (o.prefill + chunk - 1) / chunk, chunk, ttft * 1e3, o.prefill / ttft);
    slot = new_seq(blocks);
    cuda_set_op_timing(*be, true);
    run_prompt();
    cuda_set_op_timing(*be, false);
    print_times("prefill op breakdown", *be, 1);
    free_seq(blocks, slot);
  }

  auto print_gemm_choices = [&] {
    std::printf("\ncuBLAS algorithm per GEMM shape (cuda_gemm.h):\n");
    for (const std::string& line : cuda_gemm_choices(*be)) std::printf("  %s\n", line.c_str());
  };
  if (o.prefill_only) {
    print_gemm_choices();
    return 0;
  }

  double dec_tps = 0, bw = 0, eager_tps = 0, verify_ms = 0, mtp_ms = 0, commit_ms = 0, agg_tps = 0;
  if (!o.mixed_only) {
    // ---- decode, batch 1 ------------------------------------------------------------------------
    std::vector<int32_t> blocks;
    int slot = new_seq(blocks);
    {
      auto p = prompt(o.ctx);
      RunItem it{p, 0, blocks, slot, false, false};
      runner.run(std::span<const RunItem>(&it, 1));
    }
    int n_past = o.ctx;
    // Eager through ModelRunner (metadata upload, forward, logits to host, per step).
    {
      const int n = 16;
      std::vector<int32_t> tok{1234};
      be->synchronize();
      t0 = now_s();
      for (int i = 0; i < n; ++i) {
        RunItem it{tok, n_past + i, blocks, slot, false, false};
        runner.run(std::span<const RunItem>(&it, 1));
      }
      eager_tps = n / (now_s() - t0);
      cuda_set_op_timing(*be, true);
      for (int i = 0; i < 4; ++i) {
        RunItem it{tok, n_past + n + i, blocks, slot, false, false};
        runner.run(std::span<const RunItem>(&it, 1));
      }
      cuda_set_op_timing(*be, false);
      print_times("decode (batch 1) op breakdown", *be, 4);
      n_past += n + 4;
    }
    cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream(*be));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timed_loop = [&](GraphStep& g, int n, int past0, int advance) {
      CK(cudaEventRecord(e0, stream));
      for (int i = 0; i < n; ++i) {
        g.stage(past0 + i * advance, i);
        g.launch(o.graph);
      }
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      return ms / n;
    };
    double dec_ms = 0;
    {
      GraphStep g(*be, *model, cache, views, {blocks}, {slot}, 1, false, false, o.steps + 1);
      if (o.graph) g.capture(n_past);
      n_past += 1;
      dec_ms = timed_loop(g, o.steps, n_past, 1);
      n_past += o.steps;
    }
    dec_tps = 1e3 / dec_ms;
    bw = wbytes / (dec_ms * 1e-3) / 1e12;
    std::printf("\ndecode batch 1 (context %d..%d, %s): %.3f ms/token = %.1f tok/s; weights %.2f TB/s = %.0f%% of the "
                "measured copy bandwidth (eager via ModelRunner: %.1f tok/s)\n",
                o.ctx, n_past, o.graph ? "CUDA graph" : "eager", dec_ms, dec_tps, bw, 100 * bw / copy_tbs, eager_tps);

    // ---- verification (4 tokens, state deferred), commit, 3 MTP steps ---------------------------
    if (model->has_mtp()) {
      GraphStep v(*be, *model, cache, views, {blocks}, {slot}, 4, false, true, 32);
      GraphStep m(*be, *model, cache, views, {blocks}, {slot}, 1, true, false, 32);
      if (o.graph) {
        v.capture(n_past);
        m.capture(n_past + 4);
      }
      verify_ms = timed_loop(v, 10, n_past, 0);
      mtp_ms = timed_loop(m, 30, n_past + 4, 0);
      // The rollback after a verification: 3 of the 4 tokens replayed into the GDN state (eager).
      const StateCommit commit{slot, 3};
      runner.commit_state(std::span<const StateCommit>(&commit, 1));
      be->synchronize();
      const double tc0 = now_s();
      for (int i = 0; i < 20; ++i) runner.commit_state(std::span<const StateCommit>(&commit, 1));
      be->synchronize();
      commit_ms = (now_s() - tc0) * 1e3 / 20;
      std::printf("verify forward (4 tokens, state deferred): %.3f ms; commit (3 tokens): %.3f ms; MTP draft step "
                  "(1 token): %.3f ms; verify + commit + 3 MTP steps: %.3f ms\n",
                  verify_ms, commit_ms, mtp_ms, verify_ms + commit_ms + 3 * mtp_ms);
    }
    free_seq(blocks, slot);

    // ---- decode, batch N -----------------------------------------------------------------------
    double batch_ms = 0;
    if (o.batch > 1) {
      std::vector<std::vector<int32_t>> bl(o.batch);
      std::vector<int32_t> slots(o.batch);
      std::vector<std::vector<int32_t>> prompts(o.batch);
      std::vector<RunItem> items;
      for (int s = 0; s < o.batch; ++s) {
        slots[s] = new_seq(bl[s]);
        prompts[s] = prompt(o.ctx);
      }
      for (int s = 0; s < o.batch; ++s) items.push_back(RunItem{prompts[s], 0, bl[s], slots[s], false, false});
      runner.run(items);
      GraphStep g(*be, *model, cache, views, bl, slots, 1, false, false, o.steps + 1);
      int past = o.ctx;
      if (o.graph) g.capture(past);
      past += 1;
      batch_ms = timed_loop(g, o.steps / 2, past, 1);
      agg_tps = o.batch / (batch_ms * 1e-3);
      std::printf("decode batch %d (context %d+): %.3f ms/step = %.0f tok/s aggregate\n", o.batch, o.ctx, batch_ms, agg_tps);
      past += o.steps / 2;
      // Where a batch-N step goes (eager, CUDA events around each op).
      cuda_set_op_timing(*be, true);
      for (int i = 0; i < 4; ++i) {
        g.stage(past + i, i);
        g.launch(false);
      }
      cuda_set_op_timing(*be, false);
      print_times(("decode (batch " + std::to_string(o.batch) + ") op breakdown").c_str(), *be, 4);
      for (int s = 0; s < o.batch; ++s) free_seq(bl[s], slots[s]);
    }
  }

  // ---- mixed: a prefill chunk beside a decode batch -------------------------------------------
  struct MixedRow {
    int chunk;
    double decode_ms, chunk_ms, both_ms;
  };
  std::vector<MixedRow> mixed_rows;
  for (const int N : o.mixed) {
    if (N <= 0 || o.batch < 2) break;
    const int D = o.batch - 1, reps = 4;
    std::vector<std::vector<int32_t>> bl(D + 1);
    std::vector<int32_t> slots(D + 1);
    std::vector<std::vector<int32_t>> prompts(D);
    std::vector<RunItem> items;
    for (int s = 0; s <= D; ++s) slots[s] = new_seq(bl[s]);
    for (int s = 0; s < D; ++s) {
      prompts[s] = prompt(o.ctx);
      items.push_back(RunItem{prompts[s], 0, bl[s], slots[s], false, false});
    }
    for (const RunItem& it : items) runner.run(std::span<const RunItem>(&it, 1), nullptr, ModelRunner::Fetch::Argmax);
    // The chunked sequence: a cached prefix of --ctx tokens, then chunks of N.
    const int chunk_total = o.ctx + 3 * (reps + 2) * N;
    if (chunk_total + 16 > long_ctx) {
      std::fprintf(stderr, "--mixed %d: raise --prefill to at least %d\n", N, chunk_total + 16);
      return 2;
    }
    const std::vector<int32_t> cp = prompt(chunk_total);
    RunItem pre{std::span<const int32_t>(cp).subspan(0, o.ctx), 0, bl[D], slots[D], false, true};
    runner.run(std::span<const RunItem>(&pre, 1), nullptr, ModelRunner::Fetch::Argmax);
    int dec_past = o.ctx, chunk_past = o.ctx;
    const int32_t one_token = 1000;
    auto decode_items = [&](std::vector<RunItem>& v) {
      v.clear();
      for (int s = 0; s < D; ++s)
        v.push_back(RunItem{std::span<const int32_t>(&one_token, 1), dec_past, bl[s], slots[s], false, false});
    };
    auto chunk_item = [&] {
      return RunItem{std::span<const int32_t>(cp).subspan(chunk_past, N), chunk_past, bl[D], slots[D], false, true};
    };
    // kind 0: decode rows only, 1: the chunk only, 2: both in one forward (the chunk first, then
    // the decode rows: the scheduler's order).
    auto run_kind = [&](int kind) {
      std::vector<RunItem> v;
      if (kind != 1) decode_items(v);
      if (kind != 0) v.insert(v.begin(), chunk_item());
      runner.run(v, nullptr, ModelRunner::Fetch::Argmax);
      if (kind != 1) ++dec_past;
      if (kind != 0) chunk_past += N;
    };
    auto time_kind = [&](int kind) {
      run_kind(kind);  // warm
      be->synchronize();
      const double t = now_s();
      for (int i = 0; i < reps; ++i) run_kind(kind);
      be->synchronize();
      return (now_s() - t) * 1e3 / reps;
    };
    const double mix_dec_ms = time_kind(0);
    const double mix_chunk_ms = time_kind(1);
    const double mix_ms = time_kind(2);
    mixed_rows.push_back({N, mix_dec_ms, mix_chunk_ms, mix_ms});
    std::printf("\nmixed step (%d decode rows at context %d+ and one %d-token chunk on a %d+ prefix; eager, argmax): "
                "decode rows alone %.2f ms, chunk alone %.2f ms, together %.2f ms (chunk + %.2f)\n",
                D, o.ctx, N, o.ctx, mix_dec_ms, mix_chunk_ms, mix_ms, mix_ms - mix_chunk_ms);
    cuda_set_op_timing(*be, true);
    for (int i = 0; i < 2; ++i) run_kind(2);
    cuda_set_op_timing(*be, false);
    print_times("mixed step op breakdown", *be, 2);
    cuda_set_op_timing(*be, true);
    for (int i = 0; i < 2; ++i) run_kind(1);
    cuda_set_op_timing(*be, false);
    print_times("its chunk alone: op breakdown", *be, 2);
    for (int s = 0; s <= D; ++s) free_seq(bl[s], slots[s]);
  }

  std::printf("\n| metric | value |\n|---|---|\n");
  if (dec_tps > 0) {
    std::printf("| decode batch 1 (tok/s) | %.1f |\n", dec_tps);
    std::printf("| decode batch 1 weight bandwidth (TB/s, %% of copy) | %.2f (%.0f%%) |\n", bw, 100 * bw / copy_tbs);
    std::printf("| decode batch 1 eager via ModelRunner (tok/s) | %.1f |\n", eager_tps);
  }
  if (verify_ms > 0)
    std::printf("| verify(4) + commit + 3 MTP steps (ms) | %.2f (%.2f + %.3f + 3 x %.2f) |\n",
                verify_ms + commit_ms + 3 * mtp_ms, verify_ms, commit_ms, mtp_ms);
  if (ttft > 0) std::printf("| TTFT %d-token prompt (ms) | %.0f |\n", o.prefill, ttft * 1e3);
  if (agg_tps > 0) std::printf("| decode batch %d aggregate (tok/s) | %.0f |\n", o.batch, agg_tps);
  for (const MixedRow& r : mixed_rows)
    std::printf("| mixed step: %d decode rows / %d-token chunk / both, %d rows (ms) | %.2f / %.2f / %.2f |\n",
                o.batch - 1, r.chunk, o.batch - 1 + r.chunk, r.decode_ms, r.chunk_ms, r.both_ms);
  print_gemm_choices();
  return 0;
}
