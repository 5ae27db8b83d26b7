// CPU matmul kernels and thread pool, Google Benchmark.
//   Matmul/<isa>/<dtype>/n/k/m/threads : one product; counters wGB/s (weight bytes streamed per
//                                         second) and FLOP/s (2*m*n*k per second)
//   DecodeToken/<isa>/<multi>/threads   : every matmul of one tiny-coder decode step at batch 1
//                                         (8 layers + lm_head, 17.9 MB of bf16 weights, separate
//                                         buffers so they stream from L3 as in the real model)
//   MemRead/<MiB>/threads, Memcpy/<MiB> : the machine's cache / DRAM bandwidth for comparison
//   PoolForkJoin/threads                : one empty parallel_for (fork + join latency)
//   AttentionDecode/<kv dtype>/hd/threads : Kernels::attention for 4 decode tokens on 4096-token
//                                         contexts per KV cache dtype; counter kvGB/s (cache bytes
//                                         read per second)
//   GdnLayer/shape/threads/seqs/tokens  : Kernels::gated_delta_net (conv + delta rule + norm) for
//                                         seqs runs of `tokens` tokens each; counter tok/s
// Run: build-kern/bench/cpu_kernels/bench_cpu_kernels [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention_kernels.h"
#include "backend/cpu/cpu_matmul.h"
#include "backend/cpu/vec.h"
#include "core/dtype.h"
#include "util/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltaserve {
namespace {

ThreadPool& pool_of(int n_threads) {
  static ThreadPool pool1(1), pool2(2);
  return n_threads == 1 ? pool1 : pool2;
}

CpuWeight random_weight(DType dtype, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (dtype == DType::BF16) {
    std::vector<uint16_t> raw(static_cast<size_t>(n * k));
    for (auto& v : raw) v = f32_to_bf16(dist(rng));
    return CpuWeight::from(raw.data(), dtype, n, k);
  }
  std::vector<float> raw(static_cast<size_t>(n * k));
  for (auto& v : raw) v = dist(rng);
  return CpuWeight::from(raw.data(), DType::F32, n, k);
}

std::vector<float> random_x(int64_t m, int64_t k) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = dist(rng);
  return x;
}

// args: isa, dtype (0 bf16, 1 f32), n, k, m, threads
void BM_Matmul(benchmark::State& state) {
  const auto isa = static_cast<CpuIsa>(state.range(0));
  const DType dtype = state.range(1) == 0 ? DType::BF16 : DType::F32;
  const int64_t n = state.range(2), k = state.range(3), m = state.range(4);
  const int n_threads = static_cast<int>(state.range(5));
  if (!cpu_isa_supported(isa)) {
    state.SkipWithError("isa not supported on this CPU");
    return;
  }
  CpuWeight w = random_weight(dtype, n, k, 42);
  std::vector<float> x = random_x(m, k), out(static_cast<size_t>(m * n));
  ThreadPool& pool = pool_of(n_threads);
  for (auto _ : state) {
    cpu_matmul(pool, x.data(), m, k, w, out.data(), n, false, isa);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double weight_bytes = static_cast<double>(n * k * (dtype == DType::BF16 ? 2 : 4));
  state.counters["wGB/s"] = benchmark::Counter(weight_bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * m * n * k, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(cpu_isa_name(isa)) + (dtype == DType::BF16 ? " bf16" : " f32"));
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"isa", "f32", "n", "k", "m", "thr"});
  const int64_t isas[] = {static_cast<int64_t>(cpu_best_isa())};
  // tiny-coder (hidden 256, intermediate 768, vocab 8192)
  const std::pair<int64_t, int64_t> tiny[] = {{512, 256}, {256, 256}, {4, 256},
                                              {768, 256}, {256, 768}, {8192, 256}};
  for (int64_t isa : isas)
    for (int64_t thr : {1, 2})
      for (int64_t m : {1, 8, 512})
        for (auto [n, k] : tiny) b->Args({isa, 0, n, k, m, thr});
  // Qwen3.6-27B MLP (hidden 5120, intermediate 17408): full weights for m = 1, 8 (they stream
  // from DRAM: 178 MB bf16 each); a 2048-row slice for m = 512 (compute bound, ~1 s otherwise).
  for (int64_t isa : isas)
    for (int64_t thr : {1, 2}) {
      for (int64_t m : {1, 8}) {
        b->Args({isa, 0, 17408, 5120, m, thr});
        b->Args({isa, 0, 5120, 17408, m, thr});
      }
      b->Args({isa, 0, 2048, 5120, 512, thr});
      b->Args({isa, 0, 2048, 17408, 512, thr});
    }
  // f32 weights and the portable kernels, a few points.
  for (int64_t thr : {1, 2}) {
    b->Args({static_cast<int64_t>(cpu_best_isa()), 1, 768, 256, 1, thr});
    b->Args({static_cast<int64_t>(cpu_best_isa()), 1, 768, 256, 512, thr});
    b->Args({static_cast<int64_t>(CpuIsa::Portable), 0, 768, 256, 1, thr});
    b->Args({static_cast<int64_t>(CpuIsa::Portable), 0, 768, 256, 512, thr});
  }
}
BENCHMARK(BM_Matmul)->Apply(matmul_args)->UseRealTime()->MinTime(0.3);

// One decode step of tiny-coder: 6 Gated DeltaNet layers (in_proj_qkv 512, in_proj_z 256,
// in_proj_a 4, in_proj_b 4, out_proj 256), 2 attention layers (q 512, k 128, v 128, o 256),
// 8 MLPs (gate 768, up 768, down 256<-768) and the lm_head (8192). args: multi, threads.
// multi = 1 groups the products that share x (in-projections, q/k/v, gate+up) in one region.
struct TinyCoderWeights {
  struct Layer {
    bool attention;
    std::vector<CpuWeight> in;  // products of the normed hidden state
    CpuWeight out_proj, gate, up, down;
  };
  std::vector<Layer> layers;
  CpuWeight lm_head;
  TinyCoderWeights() {
    uint32_t seed = 1;
    for (int l = 0; l < 8; ++l) {
      Layer L;
      L.attention = l % 4 == 3;
      const std::vector<int64_t> ins =
          L.attention ? std::vector<int64_t>{512, 128, 128} : std::vector<int64_t>{512, 256, 4, 4};
      for (int64_t n : ins) L.in.push_back(random_weight(DType::BF16, n, 256, seed++));
      L.out_proj = random_weight(DType::BF16, 256, 256, seed++);
      L.gate = random_weight(DType::BF16, 768, 256, seed++);
      L.up = random_weight(DType::BF16, 768, 256, seed++);
      L.down = random_weight(DType::BF16, 256, 768, seed++);
      layers.push_back(std::move(L));
    }
    lm_head = random_weight(DType::BF16, 8192, 256, seed++);
  }
  size_t nbytes() const {
    size_t b = lm_head.nbytes();
    for (auto& L : layers) {
      for (auto& w : L.in) b += w.nbytes();
      b += L.out_proj.nbytes() + L.gate.nbytes() + L.up.nbytes() + L.down.nbytes();
    }
    return b;
  }
};

void BM_DecodeToken(benchmark::State& state) {
  static TinyCoderWeights model;
  const bool multi = state.range(0) != 0;
  ThreadPool& pool = pool_of(static_cast<int>(state.range(1)));
  std::vector<float> h = random_x(1, 256), a(1024), b(768), c(768), logits(8192);
  for (auto _ : state) {
    for (auto& L : model.layers) {
      if (multi) {
        CpuMatmulOut outs[4];
        int64_t off = 0, n_outs = 0;
        for (auto& w : L.in) {
          outs[n_outs++] = {&w, a.data() + off, w.n(), false};
          off += w.n();
        }
        cpu_matmul_multi(pool, h.data(), 1, 256, {outs, static_cast<size_t>(n_outs)});
      } else {
        int64_t off = 0;
        for (auto& w : L.in) {
          cpu_matmul(pool, h.data(), 1, 256, w, a.data() + off, w.n());
          off += w.n();
        }
      }
      cpu_matmul(pool, a.data(), 1, 256, L.out_proj, h.data(), 256, true);
      if (multi) {
        CpuMatmulOut outs[2] = {{&L.gate, b.data(), 768, false}, {&L.up, c.data(), 768, false}};
        cpu_matmul_multi(pool, h.data(), 1, 256, outs);
      } else {
        cpu_matmul(pool, h.data(), 1, 256, L.gate, b.data(), 768);
        cpu_matmul(pool, h.data(), 1, 256, L.up, c.data(), 768);
      }
      for (int i = 0; i < 768; ++i) b[i] = b[i] * 0.001f + c[i] * 0.001f;  // stand-in for SwiGLU
      cpu_matmul(pool, b.data(), 1, 768, L.down, h.data(), 256, true);
    }
    cpu_matmul(pool, h.data(), 1, 256, model.lm_head, logits.data(), 8192);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["wGB/s"] = benchmark::Counter(static_cast<double>(model.nbytes()),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(cpu_matmul_isa()) + (multi ? " grouped" : " one call per weight"));
}
BENCHMARK(BM_DecodeToken)
    ->ArgNames({"multi", "thr"})
    ->ArgsProduct({{0, 1}, {1, 2}})
    ->UseRealTime()
    ->MinTime(0.5);

// Read bandwidth: sum a buffer of `MiB` with 256-bit loads, split across threads.
#if defined(__x86_64__)
__attribute__((target("avx2"))) float sum_range(const float* p, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  float r[8];
  _mm256_storeu_ps(r, s);
  return r[0] + r[1] + r[2] + r[3] + r[4] + r[5] + r[6] + r[7];
}
#else
float sum_range(const float* p, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}
#endif

#if defined(__x86_64__)
// FMA peak of one core: 12 independent 8-wide FMA chains (the ceiling for the GEMM numbers).
__attribute__((target("avx2,fma"), noinline)) float fma_chains(int64_t iters, float bv, float cv) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 b = _mm256_set1_ps(bv), c = _mm256_set1_ps(cv);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  return _mm256_cvtss_f32(s);
}

void BM_FmaPeak(benchmark::State& state) {
  if (!cpu_isa_supported(CpuIsa::Avx2)) {
    state.SkipWithError("needs AVX2+FMA");
    return;
  }
  const int64_t iters = 1 << 16;
  float b = 0.999f, c = 0.001f;
  for (auto _ : state) {
    benchmark::DoNotOptimize(b);
    benchmark::DoNotOptimize(c);
    benchmark::DoNotOptimize(fma_chains(iters, b, c));
  }
  state.counters["FLOP/s"] = benchmark::Counter(iters * 12 * 16.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_FmaPeak)->UseRealTime();
#endif

void BM_MemRead(benchmark::State& state) {
  const int64_t n = state.range(0) * (1 << 20) / 4;
  ThreadPool& pool = pool_of(static_cast<int>(state.range(1)));
  std::vector<float> buf(static_cast<size_t>(n), 1.0f);
  float sums[2] = {0, 0};
  for (auto _ : state) {
    pool.parallel_for(n, 4096, [&](int t, int64_t b, int64_t e) { sums[t] += sum_range(buf.data() + b, e - b); });
    benchmark::DoNotOptimize(sums);
  }
  state.counters["GB/s"] =
      benchmark::Counter(4.0 * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MemRead)
    ->ArgNames({"MiB", "thr"})
    ->ArgsProduct({{1, 16, 1024}, {1, 2}})
    ->UseRealTime()
    ->MinTime(0.3);

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes),
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Memcpy)->ArgName("MiB")->Arg(16)->Arg(1024)->UseRealTime()->MinTime(0.3);

void BM_PoolForkJoin(benchmark::State& state) {
  ThreadPool& pool = pool_of(static_cast<int>(state.range(0)));
  int64_t sink[2] = {0, 0};
  for (auto _ : state) {
    pool.parallel_for(2, 1, [&](int t, int64_t b, int64_t e) { sink[t] += e - b; });
    benchmark::DoNotOptimize(sink);
  }
}
BENCHMARK(BM_PoolForkJoin)->ArgName("thr")->Arg(1)->Arg(2)->UseRealTime();

// S sequences, one decode token each, ctx cached tokens; heads as tiny-coder (4 / 2 KV, head_dim
// 64), the 27B (24 / 4 KV, head_dim 256) or one KV head of tiny-coder (2 / 1, head_dim 64: fewer
// work items than threads, so the key parts spread over them). args: dtype (0 f32, 1 bf16,
// 2 fp8_e4m3, 3 fp8_e5m2), head_dim (65: the one-KV-head shape), threads, sequences, context.
void BM_AttentionDecode(benchmark::State& state) {
  const DType dts[] = {DType::F32, DType::BF16, DType::F8E4M3, DType::F8E5M2};
  const DType dt = dts[state.range(0)];
  const bool one_head = state.range(1) == 65;
  const int hd = one_head ? 64 : static_cast<int>(state.range(1));
  const int nh = one_head ? 2 : hd == 64 ? 4 : 24, nkv = one_head ? 1 : hd == 64 ? 2 : 4;
  auto backend = make_cpu_backend(static_cast<int>(state.range(2)));
  const int S = static_cast<int>(state.range(3)), ctx = static_cast<int>(state.range(4)), bs = 16,
            blocks_per = ctx / bs + 1;
  const int64_t n_blocks = int64_t(S) * blocks_per, cache_elems = n_blocks * bs * nkv * hd;
  std::vector<uint8_t> k(static_cast<size_t>(cache_elems) * dtype_size(dt)), v(k.size());
  std::mt19937 rng(3);
  for (auto& b : k) b = static_cast<uint8_t>(rng() & 0x3f);  // small finite values in every dtype
  for (auto& b : v) b = static_cast<uint8_t>(rng() & 0x3f);
  const int64_t row = int64_t(nh) * hd * 2 + 2LL * nkv * hd;
  std::vector<float> qkv = random_x(S, row), out(static_cast<size_t>(S) * nh * hd), norm(hd, 1.f);
  std::vector<int32_t> pos(S, ctx - 1), start(S + 1), len(S, ctx), slot(S, 0);
  std::vector<int32_t> table(static_cast<size_t>(S) * blocks_per);
  for (int s = 0; s <= S; ++s) start[s] = s;
  for (int i = 0; i < S * blocks_per; ++i) table[i] = i;
  BatchMeta m;
  m.n_tokens = S;
  m.n_seqs = S;
  m.positions = pos.data();
  m.seq_start = start.data();
  m.context_len = len.data();
  m.block_table = table.data();
  m.state_slot = slot.data();
  m.max_blocks = blocks_per;
  m.block_size = bs;
  m.max_seq_tokens = 1;
  m.max_context = ctx;
  AttentionParams p;
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.rotary_dim = hd / 4;
  p.output_gate = true;
  p.q_norm = Tensor(norm.data(), DType::F32, {hd});
  p.k_norm = p.q_norm;
  p.scale = 1.0f / std::sqrt(float(hd));
  KvLayerView kv;
  kv.k = Tensor(k.data(), dt, {n_blocks, bs, nkv, hd});
  kv.v = Tensor(v.data(), dt, {n_blocks, bs, nkv, hd});
  for (auto _ : state) {
    backend->kernels().attention(p, Tensor(qkv.data(), DType::F32, {S, row}), kv, m,
                                 Tensor(out.data(), DType::F32, {S, int64_t(nh) * hd}));
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["kvGB/s"] = benchmark::Counter(2.0 * S * ctx * nkv * hd * double(dtype_size(dt)),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(dtype_name(dt)));
}
// One GDN layer (Kernels::gated_delta_net: conv, delta rule, gated norm) over S runs of n tokens
// each (n = 1: decode rows), f32 state. args: shape (0 tiny-coder: 2 / 4 heads of 64; 1 the 27B:
// 16 / 48 heads of 128), threads, sequences, tokens per sequence.
void BM_GdnLayer(benchmark::State& state) {
  const bool big = state.range(0) == 1;
  const int S = static_cast<int>(state.range(2)), n = static_cast<int>(state.range(3)), T = S * n;
  GdnParams p;
  p.n_k_heads = big ? 16 : 2;
  p.n_v_heads = big ? 48 : 4;
  p.k_head_dim = big ? 128 : 64;
  p.v_head_dim = big ? 128 : 64;
  p.conv_kernel = 4;
  const int64_t cd = p.conv_dim(), rec = int64_t(p.n_v_heads) * p.v_head_dim * p.k_head_dim;
  std::vector<float> cw = random_x(cd, 4), na(p.n_v_heads, -0.5f), dtb(p.n_v_heads, 0.1f), nw(p.v_head_dim, 1.f);
  for (auto& v : cw) v *= 0.5f;
  p.conv_weight = Tensor(cw.data(), DType::F32, {cd, 4});
  p.neg_exp_a = Tensor(na.data(), DType::F32, {p.n_v_heads});
  p.dt_bias = Tensor(dtb.data(), DType::F32, {p.n_v_heads});
  p.norm = Tensor(nw.data(), DType::F32, {p.v_head_dim});
  std::vector<float> proj = random_x(T, p.proj_dim()), conv(size_t(S) * cd * 3, 0.f), recs(size_t(S) * rec, 0.f),
                     out(size_t(T) * p.value_dim());
  StateLayerView sv;
  sv.conv = Tensor(conv.data(), DType::F32, {S, cd, 3});
  sv.recurrent = Tensor(recs.data(), DType::F32, {S, p.n_v_heads, p.v_head_dim, p.k_head_dim});
  std::vector<int32_t> pos(T), start(S + 1), len(S, n), slot(S);
  for (int s = 0; s <= S; ++s) start[s] = s * n;
  for (int s = 0; s < S; ++s) slot[s] = s;
  for (int t = 0; t < T; ++t) pos[t] = t % n;
  BatchMeta m;
  m.n_tokens = T;
  m.n_seqs = S;
  m.positions = pos.data();
  m.seq_start = start.data();
  m.context_len = len.data();
  m.state_slot = slot.data();
  m.max_seq_tokens = n;
  m.max_context = n;
  auto backend = make_cpu_backend(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    backend->kernels().gated_delta_net(p, Tensor(proj.data(), DType::F32, {T, p.proj_dim()}), sv, m,
                                       Tensor(out.data(), DType::F32, {T, p.value_dim()}));
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["tok/s"] = benchmark::Counter(double(T), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GdnLayer)
    ->ArgNames({"shape", "thr", "seqs", "tokens"})
    ->ArgsProduct({{0}, {2}, {1, 16}, {1}})
    ->ArgsProduct({{0}, {2}, {1}, {4, 2048}})
    ->ArgsProduct({{1}, {2}, {1}, {1, 512}})
    ->UseRealTime()
    ->MinTime(0.2);

BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"kv", "hd", "thr", "seqs", "ctx"})
    ->ArgsProduct({{0, 1, 2, 3}, {64, 256}, {1, 2}, {4}, {4096}})
    ->ArgsProduct({{0}, {65}, {1, 2}, {1}, {16384}})
    ->UseRealTime()
    ->MinTime(0.2);

// The decode attention's in-place scores alone: 2 query rows (tiny-coder's group) against 4,096
// keys of head_dim 64 read from a cache laid out [position][2 KV heads][64], in runs of 16 (a
// cache block). args: kernel (0 vec::scores_strided as compiled for this CPU, 1 AVX2, 2 AVX-512).
void BM_ScoresInPlace(benchmark::State& state) {
  const int kernel = static_cast<int>(state.range(0));
#if defined(__x86_64__)
  if ((kernel == 1 && !__builtin_cpu_supports("x86-64-v3")) || (kernel == 2 && !__builtin_cpu_supports("x86-64-v4"))) {
    state.SkipWithError("not this CPU's");
    return;
  }
#else
  if (kernel != 0) {
    state.SkipWithError("x86 only");
    return;
  }
#endif
  const int hd = 64, rows = 2, n_keys = 4096, run = 16;
  const int64_t ldk = 2 * hd;
  std::vector<float> q = random_x(rows, hd), k = random_x(n_keys, ldk), s(static_cast<size_t>(rows) * vec::kKeyBlock);
  for (auto _ : state) {
    for (int j0 = 0; j0 < n_keys; j0 += run) {
      const float* kj = k.data() + int64_t(j0) * ldk;
      if (kernel == 0) vec::scores_strided(q.data(), rows, kj, ldk, run, hd, 0.125f, s.data());
#if defined(__x86_64__)
      else if (kernel == 1) cpu::scores_in_place_avx2(q.data(), rows, kj, ldk, run, hd, 0.125f, s.data(), vec::kKeyBlock);
      else cpu::scores_in_place_avx512(q.data(), rows, kj, ldk, run, hd, 0.125f, s.data(), vec::kKeyBlock);
#endif
      benchmark::DoNotOptimize(s.data());
    }
  }
  state.counters["keys/s"] = benchmark::Counter(n_keys, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ScoresInPlace)->ArgName("kernel")->Arg(0)->Arg(1)->Arg(2)->UseRealTime()->MinTime(0.2);

}  // namespace
}  // namespace deltaserve

BENCHMARK_MAIN();
