// Every Kernels op on the CUDA backend against the CPU backend (the reference) on random inputs.
// Outputs are poisoned (NaN) before each op so unwritten elements fail. Skipped without a GPU.
//
// Tolerances (max |gpu - cpu| / max |cpu|, per tensor):
//   exact copies (embed, gather, snapshots restore): 0
//   f32 elementwise / norms: 1e-5
//   matmul, T <= 8 (f32 x, bf16 w, GEMV): 2e-5 (summation order only)
//   matmul, T > 8 (cuBLAS, exact mode: x split into three bf16 parts): 1e-4
//   attention, gated delta net (f32; order of sums and expf/cosf ulps): 1e-4
//   attention, tensor-core (flash) path: 1e-2 (q, k in fp16, p and v in bf16)
//
// Attention with a bf16 / fp8 KV cache is compared with the CPU reference using the same cache
// dtype and scales, on the same cache bytes: the kernels read identical stored values, so the
// f32 tolerances above apply unchanged. The one difference the dtypes add: this step's keys are
// computed in f32 on both sides (norm, RoPE) and differ by a few f32 ulps (cosf, sum order), so
// a key that lands within those ulps of a rounding midpoint of the cache format can be stored as
// the neighbouring code on one side ("flips": each one is checked to be exactly one code apart;
// values are otherwise bit-equal, and V, which is only converted, always is). A flip is one
// rounding error of the format; rounding the whole cache moves the output by at most u (the unit
// roundoff: 2^-8 bf16, 2^-4 e4m3, 2^-3 e5m2; tests/ops/cpu_attention_test.cpp), so when flips
// occur the output tolerance becomes max(f32 tolerance, u).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_launch.h"
#include "engine/model_runner.h"
#include "core/dtype.h"
#include "sample_reference.h"

namespace deltaserve {
namespace {

struct AttnShape {
  int nh, nkv, hd, rd;
  bool gate;
};

struct GdnShape {
  int hk, hv, dk, dv, k;
};

std::vector<uint16_t> to_bf16(const std::vector<float>& v);

class CudaOpsTest : public ::testing::Test {
 protected:
  // DS_CUDA_OPS_TEST_CPU_ONLY=1 runs the harness with a second CPU backend in place of the GPU
  // (checks the test itself on machines without a GPU).
  static bool cpu_only() { return std::getenv("DS_CUDA_OPS_TEST_CPU_ONLY") != nullptr; }
  static void SetUpTestSuite() {
    if (cuda_device_count() == 0 && !cpu_only()) return;
    cpu_ = make_cpu_backend(0).release();
    // Ops are checked at f32 accuracy: GEMMs above 8 rows in exact mode (three bf16 parts).
    // The default mode (activations rounded to bf16) gets its own backend in Matmul.
    CudaOptions exact;
    exact.exact_gemm = true;
    gpu_ = cpu_only() ? make_cpu_backend(0).release() : make_cuda_backend(0, exact).release();
    gpu_bf16_ = cpu_only() ? nullptr : make_cuda_backend(0, CudaOptions{}).release();
  }
  static void TearDownTestSuite() {
    delete cpu_;
    delete gpu_;
    delete gpu_bf16_;
    cpu_ = gpu_ = gpu_bf16_ = nullptr;
  }
  void SetUp() override {
    if (cuda_device_count() == 0 && !cpu_only()) GTEST_SKIP() << "no CUDA device";
  }

  // A tensor on both backends with the same contents.
  struct Pair {
    DeviceBuffer c, g;
    Tensor tc, tg;
  };
  Pair make(DType dt, std::initializer_list<int64_t> shape, const void* host) {
    Pair p;
    int64_t n = 1;
    for (auto d : shape) n *= d;
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n) * dtype_size(dt), 4);
    p.c = cpu_->allocate(bytes);
    p.g = gpu_->allocate(bytes);
    p.tc = p.c.view(dt, shape);
    p.tg = p.g.view(dt, shape);
    if (host) {
      cpu_->copy_to_device(p.tc, host);
      gpu_->copy_to_device(p.tg, host);
    }
    return p;
  }
  Pair make_f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    return make(DType::F32, shape, v.data());
  }
  Pair poisoned(std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
    return make_f32(shape, nan);
  }
  std::vector<float> rnd(int64_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // Tensor contents as f32 (f32, bf16 and fp8 tensors).
  std::vector<float> host_of(const Tensor& t, Backend& b) {
    std::vector<uint8_t> raw(t.nbytes());
    b.copy_to_host(raw.data(), t);
    std::vector<float> v(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = decode_elem(t.dtype, raw.data(), i);
    return v;
  }
  static float decode_elem(DType dt, const uint8_t* raw, int64_t i) {
    switch (dt) {
      case DType::F32: {
        float f;
        std::memcpy(&f, raw + i * 4, 4);
        return f;
      }
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, raw + i * 2, 2);
        return bf16_to_f32(h);
      }
      case DType::F8E4M3: return f8e4m3_to_f32(raw[i]);
      case DType::F8E5M2: return f8e5m2_to_f32(raw[i]);
      default: ADD_FAILURE() << "dtype " << dtype_name(dt); return NAN;
    }
  }
  // max |gpu - cpu| / max |cpu|; NaN anywhere -> infinity.
  double rel_err(const Pair& p) {
    gpu_->synchronize();
    return rel_err(host_of(p.tc, *cpu_), host_of(p.tg, *gpu_));
  }
  static double rel_err(const std::vector<float>& c, const std::vector<float>& g) {
    double md = 0, mr = 1e-30;
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (std::isnan(g[i]) || std::isnan(c[i])) return INFINITY;
      md = std::max(md, double(std::fabs(g[i] - c[i])));
      mr = std::max(mr, double(std::fabs(c[i])));
    }
    return md / mr;
  }

  // One Gated DeltaNet layer's random parameters, T tokens of projections and n_slots of state
  // (conv windows, recurrent states, depth pending rows each) on both backends.
  struct GdnInputs {
    GdnParams p;  // shapes only; params() adds the weights of one backend
    int64_t cd = 0, rec = 0;  // conv_dim, recurrent state floats per slot
    Pair cw, na, dtb, nw, proj, conv, recs, pend, out;
    int depth = 0;
    GdnParams params(bool gpu) const {
      GdnParams q = p;
      q.conv_weight = gpu ? cw.tg : cw.tc;
      q.neg_exp_a = gpu ? na.tg : na.tc;
      q.dt_bias = gpu ? dtb.tg : dtb.tc;
      q.norm = gpu ? nw.tg : nw.tc;
      return q;
    }
    StateLayerView state(bool gpu) const {
      return gpu ? StateLayerView{conv.tg, recs.tg, pend.tg, depth} : StateLayerView{conv.tc, recs.tc, pend.tc, depth};
    }
  };
  // Every head of v [.., rows, cols] as [.., cols, rows]: the GDN state between CUDA's layouts and
  // the CPU's (kernels.h, StateLayerView): recurrent Sᵀ [Dv, Dk] and S [Dk, Dv], conv windows
  // [conv_dim, K-1] and [K-1, conv_dim].
  static std::vector<float> swap_heads(const std::vector<float>& v, int64_t rows, int64_t cols) {
    std::vector<float> out(v.size());
    const int64_t head = rows * cols;
    for (int64_t h = 0; h < int64_t(v.size()) / head; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[h * head + c * rows + r] = v[h * head + r * cols + c];
    return out;
  }
  // rel_err of the recurrent states and of the conv windows, the CPU's read in CUDA's layout.
  double state_err(const GdnInputs& g) {
    gpu_->synchronize();
    return rel_err(swap_heads(host_of(g.recs.tc, *cpu_), g.p.k_head_dim, g.p.v_head_dim), host_of(g.recs.tg, *gpu_));
  }
  double conv_err(const GdnInputs& g) {
    gpu_->synchronize();
    return rel_err(swap_heads(host_of(g.conv.tc, *cpu_), g.p.conv_kernel - 1, g.cd), host_of(g.conv.tg, *gpu_));
  }
  // rec_dtype: the recurrent state's (F32, or BF16 as --mamba-ssm-dtype bfloat16 stores it).
  GdnInputs gdn_inputs(const GdnShape& sh, int T, int n_slots, int depth, DType rec_dtype = DType::F32) {
    GdnInputs g;
    g.p.n_k_heads = sh.hk;
    g.p.n_v_heads = sh.hv;
    g.p.k_head_dim = sh.dk;
    g.p.v_head_dim = sh.dv;
    g.p.conv_kernel = sh.k;
    g.p.eps = 1e-6f;
    g.depth = depth;
    g.cd = g.p.conv_dim();
    g.rec = int64_t(sh.hv) * sh.dv * sh.dk;
    const int64_t cd = g.cd, row = g.p.proj_dim();
    g.cw = make_f32({cd, sh.k}, rnd(cd * sh.k, -0.5f, 0.5f));
    g.na = make_f32({sh.hv}, rnd(sh.hv, -2.f, -0.1f));
    g.dtb = make_f32({sh.hv}, rnd(sh.hv));
    g.nw = make_f32({sh.dv}, rnd(sh.dv, 0.5f, 1.5f));
    g.proj = make_f32({T, row}, rnd(T * row, -2.f, 2.f));
    const std::vector<float> conv0 = rnd(n_slots * cd * (sh.k - 1));
    g.conv = make_f32({n_slots, cd, sh.k - 1}, conv0);
    cpu_->copy_to_device(g.conv.tc, swap_heads(conv0, cd, sh.k - 1).data());
    const std::vector<float> rec0 = rnd(n_slots * g.rec, -0.3f, 0.3f), rec0_cpu = swap_heads(rec0, sh.dv, sh.dk);
    if (rec_dtype == DType::BF16) {
      g.recs = make(DType::BF16, {n_slots, sh.hv, sh.dv, sh.dk}, to_bf16(rec0).data());
      cpu_->copy_to_device(g.recs.tc, to_bf16(rec0_cpu).data());
    } else {
      g.recs = make_f32({n_slots, sh.hv, sh.dv, sh.dk}, rec0);
      cpu_->copy_to_device(g.recs.tc, rec0_cpu.data());
    }
    g.pend = make_f32({n_slots * depth, cd + 2 * sh.hv}, std::vector<float>(n_slots * depth * (cd + 2 * sh.hv), 0.f));
    g.out = poisoned({T, g.p.value_dim()});
    return g;
  }
  // The layer on both backends over one batch (its host and device metadata).
  void run_gdn(GdnInputs& g, const BatchMeta& cpu, const BatchMeta& gpu) {
    cpu_->kernels().gated_delta_net(g.params(false), g.proj.tc, g.state(false), cpu, g.out.tc);
    gpu_->kernels().gated_delta_net(g.params(true), g.proj.tg, g.state(true), gpu, g.out.tg);
  }

  // The GPU's output and K / V caches after an attention_case, byte for byte.
  struct AttnBytes {
    std::vector<uint8_t> out, k, v;
  };
  void attention_case(const AttnShape& sh, const std::vector<std::pair<int, int>>& seqs, int n_blocks,
                      int max_blocks, double tol, DType kv_dtype = DType::F32, float k_scale = 1.f,
                      float v_scale = 1.f, AttnBytes* gpu_bytes = nullptr);

  static Backend* cpu_;
  static Backend* gpu_;
  static Backend* gpu_bf16_;  // default GEMM mode (nullptr in the CPU-only harness)
  std::mt19937 rng_{42};
};
Backend* CudaOpsTest::cpu_ = nullptr;
Backend* CudaOpsTest::gpu_ = nullptr;
Backend* CudaOpsTest::gpu_bf16_ = nullptr;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
  return r;
}

TEST_F(CudaOpsTest, Embed) {
  for (bool bf16 : {true, false}) {
    const int64_t V = 1000, H = 384, T = 37;
    auto table = rnd(V * H);
    auto tb = to_bf16(table);
    Pair tab = bf16 ? make(DType::BF16, {V, H}, tb.data()) : make_f32({V, H}, table);
    std::vector<int32_t> ids(T);
    for (auto& i : ids) i = static_cast<int32_t>(rng_() % V);
    Pair id = make(DType::I32, {T}, ids.data());
    Pair out = poisoned({T, H});
    cpu_->kernels().embed(tab.tc, id.tc, out.tc);
    gpu_->kernels().embed(tab.tg, id.tg, out.tg);
    EXPECT_EQ(rel_err(out), 0.0) << "bf16=" << bf16;
  }
}

// Vocabulary-parallel embedding (tensor parallelism): a shard of rows [first, first + rows) gives
// zero rows for the other ranks' ids, on both backends; and copy_columns places one rank's
// logits into the full rows.
TEST_F(CudaOpsTest, EmbedShardAndCopyColumns) {
  const int64_t V = 1000, H = 96, T = 29, first = 250, rows = 250;
  auto table = rnd(rows * H);
  Pair tab = make_f32({rows, H}, table);
  std::vector<int32_t> ids(T);
  for (auto& i : ids) i = static_cast<int32_t>(rng_() % V);
  ids[0] = static_cast<int32_t>(first);
  ids[1] = static_cast<int32_t>(first + rows - 1);
  ids[2] = static_cast<int32_t>(first + rows);
  Pair id = make(DType::I32, {T}, ids.data());
  Pair out = poisoned({T, H});
  cpu_->kernels().embed(tab.tc, id.tc, out.tc, first, V);
  gpu_->kernels().embed(tab.tg, id.tg, out.tg, first, V);
  EXPECT_EQ(rel_err(out), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const bool mine = ids[t] >= first && ids[t] < first + rows;
    const float* row = out.tc.f32() + t * H;
    EXPECT_EQ(row[5], mine ? table[(ids[t] - first) * H + 5] : 0.f) << "token " << t << " id " << ids[t];
  }
  const int64_t R = 3, C = 40, c = 13, col = 20;
  Pair src = make_f32({R, c}, rnd(R * c)), dst = poisoned({R, C});
  cpu_->kernels().copy_columns(src.tc, 0, dst.tc, col, c);
  gpu_->kernels().copy_columns(src.tg, 0, dst.tg, col, c);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(dst.tc.f32()[r * C + col + j], src.tc.f32()[r * c + j]);
  std::vector<float> back(R * C);
  gpu_->copy_to_host(back.data(), dst.tg);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < c; ++j) ASSERT_EQ(back[r * C + col + j], src.tc.f32()[r * c + j]);
}

// Greedy sampling on the device picks what std::max_element picks on the host (ties: the first).
// Row counts 1, 5 and 64 split a 248k row into 122, 102 and 8 parts (a block each): ties within a
// part, across parts and at a part's first column; a NaN is never picked.
TEST_F(CudaOpsTest, ArgmaxRowsMatchesTheHostIncludingTies) {
  for (int64_t R : {int64_t(1), int64_t(5), int64_t(64)}) {
    for (int64_t V : {int64_t(7), int64_t(1000), int64_t(248320)}) {
      auto x = rnd(R * V, -3.f, 3.f);
      const int64_t r1 = 1 % R, r2 = 2 % R, r3 = 3 % R, r4 = 4 % R;
      x[r1 * V + V / 2] = 9.f;  // a tie across parts (within one for small V): the first wins
      x[r1 * V + V - 1] = 9.f;
      if (R > 2) {
        for (int64_t i = 0; i < V; ++i) x[r2 * V + i] = -1.f;  // all equal -> 0
      }
      if (R > 3) x[r3 * V + V - 1] = 50.f;  // the last element
      if (R == 5 && V == 248320) {  // a tie at the first column of the second part, and within that part
        const int64_t span = (V + 101) / 102;
        x[r4 * V + span] = 20.f;
        x[r4 * V + span + 3] = 20.f;
      }
      if (R == 64) {  // NaNs around a unique maximum
        x[63 * V + 0] = std::nanf("");
        x[63 * V + V / 3] = 30.f;
        x[63 * V + V - 1] = std::nanf("");
      }
      Pair px = make_f32({R, V}, x);
      std::vector<int32_t> none(R, -7);
      Pair out = make(DType::I32, {R}, none.data());
      gpu_->kernels().argmax_rows(px.tg, out.tg);
      std::vector<int32_t> g(R);
      gpu_->copy_to_host(g.data(), out.tg);
      for (int64_t r = 0; r < R; ++r) {
        const float* row = x.data() + r * V;
        int64_t want = 0;  // the first index of the largest number
        for (int64_t i = 1; i < V; ++i)
          if (!std::isnan(row[i]) && (std::isnan(row[want]) || row[i] > row[want])) want = i;
        EXPECT_EQ(g[r], want) << "R " << R << " V " << V << " row " << r;
        if (r == 63) continue;  // std::max_element is not defined with NaNs
        EXPECT_EQ(std::max_element(row, row + V) - row, want);
      }
      if (R > 1) { EXPECT_EQ(g[r1], V / 2); }
      if (R > 2) { EXPECT_EQ(g[r2], 0); }
      if (R > 3) { EXPECT_EQ(g[r3], V - 1); }
      if (R == 5 && V == 248320) { EXPECT_EQ(g[r4], (V + 101) / 102); }
      if (R == 64) { EXPECT_EQ(g[63], V / 3); }
    }
  }
}

// Sampling on the device (Kernels::sample_rows) draws the reference's token (the CPU kernel, and
// the textbook pipeline of sample_reference.h) for the same penalised row, settings and uniform,
// except within 2e-6 of a CDF boundary or at a top-p / min-p cut within rounding; a row whose
// kept set the kernel cannot bound gives -1 (only flat rows with a large kept set may); the same
// call twice gives the same tokens.
TEST_F(CudaOpsTest, SampleRowsMatchTheReference) {
  struct Case {
    float inv_t, top_p, min_p;
    int top_k;
  };
  const Case cases[] = {{1.f / 0.6f, 0.95f, 0.f, 20}, {1.f / 0.8f, 1.f, 0.f, -1}, {1.f, 0.9f, 0.f, -1},
                        {1.f / 0.7f, 1.f, 0.05f, -1}, {1.f, 0.8f, 0.02f, 50},  {0.f, 1.f, 0.f, -1},
                        {1.f, 1.f, 0.f, 1000},        {2.f, 0.5f, 0.f, 5},     {1.f / 1.5f, 0.99f, 0.f, -1}};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  int compared = 0, skipped = 0, wide = 0;
  // 1001: rows the kernel reads one float at a time (not a multiple of 4 floats, not 16-byte aligned).
  for (int64_t V : {int64_t(1001), int64_t(1000), int64_t(248320)}) {
    for (float spread : {0.3f, 2.f, 6.f}) {
      const int64_t R = static_cast<int64_t>(std::size(cases));
      std::vector<float> x(R * V);
      std::normal_distribution<float> nd(0.f, spread);
      for (auto& v : x) v = nd(rng);
      std::vector<SampleRow> rows(R);
      std::vector<PenaltyEntry> pen;
      for (int64_t r = 0; r < R; ++r) {
        const Case& c = cases[r];
        rows[r] = SampleRow{c.inv_t, c.top_k, c.top_p, c.min_p, static_cast<float>(unif(rng)), 0};
        for (int j = 0; j < 30; ++j)  // distinct tokens per row
          pen.push_back(PenaltyEntry{int32_t(r), int32_t((j * 37 + r) % V), r % 2 ? 1.2f : 1.f, 0.1f * float(j % 4)});
      }
      Pair px = make_f32({R, V}, x);
      Pair pr = make(DType::I32, {R * 6}, rows.data());
      Pair pp = make(DType::I32, {int64_t(pen.size()) * 4}, pen.data());
      std::vector<int32_t> none(R, -7);
      Pair out = make(DType::I32, {R}, none.data());
      cpu_->kernels().sample_rows(px.tc, pr.tc, pp.tc, out.tc);
      gpu_->kernels().sample_rows(px.tg, pr.tg, pp.tg, out.tg);
      std::vector<int32_t> g(R), g2(R);
      gpu_->copy_to_host(g.data(), out.tg);
      // The penalties were applied in place: both backends' rows now hold the penalised logits.
      const auto pc = host_of(px.tc, *cpu_), pg = host_of(px.tg, *gpu_);
      EXPECT_EQ(pg, pc) << "penalised logits, V " << V;
      // Again on the penalised logits without penalties: the same draw, deterministically.
      gpu_->kernels().sample_rows(px.tg, pr.tg, Tensor(nullptr, DType::I32, {0}, px.tg.device), out.tg);
      gpu_->copy_to_host(g2.data(), out.tg);
      EXPECT_EQ(g2, g) << "V " << V << " spread " << spread;
      for (int64_t r = 0; r < R; ++r) {
        bool fragile = false;
        const auto dist = test::reference_distribution(pc.data() + r * V, V, rows[r], &fragile);
        const auto want = test::reference_draw(dist, rows[r].inv_temperature == 0.f ? 0.0 : double(rows[r].u));
        int64_t kept = 0;
        for (double p : dist) kept += p > 0;
        const std::string what = "V " + std::to_string(V) + " spread " + std::to_string(spread) + " row " + std::to_string(r);
        if (kept > 4096) ++wide;  // past the kernel's window: found over the whole row
        if (fragile || (rows[r].inv_temperature != 0.f && want.margin < 2e-6)) {
          ++skipped;
          continue;
        }
        ++compared;
        EXPECT_EQ(out.tc.i32()[r], want.token) << "cpu " << what;
        EXPECT_EQ(g[r], want.token) << "gpu " << what;
      }
    }
  }
  EXPECT_GT(compared, 30) << skipped << " skipped";
  EXPECT_GT(wide, 2) << "rows whose kept set passes the window";
  std::printf("sample_rows: %d compared, %d skipped, %d kept sets past the window\n", compared, skipped, wide);
}

// Kept sets the kernel's 4,096-token window cannot hold: a flat row's nucleus, top-k in the
// thousands, thousands of logits tied at the top or at the top-k boundary, min-p over a flat row.
// And top-k + top-p + min-p where the min-p floor lies above the k-th token: top-p's normaliser is
// the mass of all k (a window narrowed to the floor once took its own mass: another kept set).
// Every row gets the reference's token.
TEST_F(CudaOpsTest, SampleRowsOfWideOrTiedKeptSetsMatchTheReference) {
  const int64_t V = 248320;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  struct Case {
    const char* what;
    float inv_t, top_p, min_p;
    int top_k;
    std::function<float(int64_t)> logit;  // of token i
  };
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> noise(V);
  for (auto& v : noise) v = nd(rng);
  // Top-k 3011 over: one token of mass 1, ten of 0.06 (above min-p 0.05's floor), 3000 of 2e-4
  // (below it), then 5000 of 6e-6 that make the first window too large; the rest ~0. The
  // narrowed window (8 nats) reaches the floor with 11 tokens, but top-p 0.95 is of all 3011's mass.
  const auto floor_above_kth = [](int64_t i) {
    if (i == 1000) return 0.f;
    if (i >= 2000 && i < 3000 && i % 100 == 0) return std::log(0.06f);
    if (i >= 100000 && i < 100000 + 3 * 3000 && i % 3 == 1) return -8.5f;
    if (i >= 150000 && i < 150000 + 5 * 5000 && i % 5 == 0) return -12.f;
    return -30.f;
  };
  const Case cases[] = {
      {"flat row, top-p 0.37", 1.f, 0.37f, 0.f, -1, [](int64_t) { return 0.5f; }},
      {"near-flat row, top-p 0.9", 1.f, 0.9f, 0.f, -1, [&](int64_t i) { return 0.01f * noise[i]; }},
      {"top-k 6000 of distinct logits", 1.f, 1.f, 0.f, 6000, [&](int64_t i) { return noise[i]; }},
      {"top-k 6000, top-p 0.5", 1.f / 0.7f, 0.5f, 0.f, 6000, [&](int64_t i) { return noise[i]; }},
      {"5000 tied at the top, top-k 20", 1.f, 1.f, 0.f, 20,
       [&](int64_t i) { return i % 41 == 3 && i < 41 * 5000 ? 4.f : noise[i]; }},
      {"tied at the top-k boundary, top-k 5000", 1.f, 1.f, 0.f, 5000,
       [&](int64_t i) { return i % 7 == 1 && i < 7 * 3000 ? 3.f + 0.001f * noise[i] : (i % 7 == 2 ? 2.f : -3.f); }},
      {"flat row, min-p 0.5", 1.f, 1.f, 0.5f, -1, [&](int64_t i) { return 0.1f * float(i % 3); }},
      {"near-flat row, top-k 10000, top-p 0.95, min-p 0.9", 1.f / 0.6f, 0.95f, 0.9f, 10000,
       [&](int64_t i) { return 0.05f * noise[i]; }},
      {"top-k 3011, top-p 0.95, min-p 0.05, the floor above the k-th", 1.f, 0.95f, 0.05f, 3011, floor_above_kth},
      {"the same again", 1.f, 0.95f, 0.05f, 3011, floor_above_kth},
      {"and again", 1.f, 0.95f, 0.05f, 3011, floor_above_kth},
  };
  const int64_t R = static_cast<int64_t>(std::size(cases));
  for (int round = 0; round < 3; ++round) {
    std::vector<float> x(R * V);
    std::vector<SampleRow> rows(R);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t i = 0; i < V; ++i) x[r * V + i] = cases[r].logit(i);
      rows[r] = SampleRow{cases[r].inv_t, cases[r].top_k, cases[r].top_p, cases[r].min_p, static_cast<float>(unif(rng)), 0};
    }
    Pair px = make_f32({R, V}, x);
    Pair pr = make(DType::I32, {R * 6}, rows.data());
    std::vector<int32_t> none(R, -7);
    Pair out = make(DType::I32, {R}, none.data());
    gpu_->kernels().sample_rows(px.tg, pr.tg, Tensor(nullptr, DType::I32, {0}, px.tg.device), out.tg);
    std::vector<int32_t> g(R);
    gpu_->copy_to_host(g.data(), out.tg);
    for (int64_t r = 0; r < R; ++r) {
      bool fragile = false;
      const auto dist = test::reference_distribution(x.data() + r * V, V, rows[r], &fragile);
      const auto want = test::reference_draw(dist, double(rows[r].u));
      int64_t kept = 0;
      for (double p : dist) kept += p > 0;
      const std::string what = std::string(cases[r].what) + ", round " + std::to_string(round);
      ASSERT_GE(g[r], 0) << what;
      ASSERT_LT(g[r], V) << what;
      EXPECT_GT(dist[static_cast<std::size_t>(g[r])], 0.0) << "a token outside the kept set: " << what;
      if (fragile || want.margin < 2e-6) continue;
      EXPECT_EQ(g[r], want.token) << what << " (kept " << kept << ")";
    }
  }
}

TEST_F(CudaOpsTest, RmsNorm) {
  for (auto [R, D] : {std::pair<int64_t, int64_t>{1, 5120}, {2, 16}, {7, 256}, {33, 1000}, {300, 17408}}) {
    auto x = rnd(R * D, -3.f, 3.f);
    Pair px = make_f32({R, D}, x), w = make_f32({D}, rnd(D, 0.5f, 1.5f)), out = poisoned({R, D});
    cpu_->kernels().rms_norm(px.tc, w.tc, 1e-6f, out.tc, 0);
    gpu_->kernels().rms_norm(px.tg, w.tg, 1e-6f, out.tg, 0);
    EXPECT_LE(rel_err(out), 1e-5) << R << "x" << D;
  }
  // out_stride: two norms fill the halves of one [R, 2D] row (the MTP input).
  const int64_t R = 5, D = 640;
  Pair a = make_f32({R, D}, rnd(R * D)), b = make_f32({R, D}, rnd(R * D));
  Pair wa = make_f32({D}, rnd(D)), wb = make_f32({D}, rnd(D)), out = poisoned({R, 2 * D});
  for (int side = 0; side < 2; ++side) {
    Pair& x = side ? b : a;
    Pair& w = side ? wb : wa;
    Tensor oc(out.tc.f32() + side * D, DType::F32, {R, D}, Device::Cpu);
    Tensor og(out.tg.f32() + side * D, DType::F32, {R, D}, gpu_->device());
    cpu_->kernels().rms_norm(x.tc, w.tc, 1e-6f, oc, 2 * D);
    gpu_->kernels().rms_norm(x.tg, w.tg, 1e-6f, og, 2 * D);
  }
  EXPECT_LE(rel_err(out), 1e-5);
}

TEST_F(CudaOpsTest, SiluMul) {
  // 4-wide and scalar paths (I % 4), and more rows than one launch's grid holds (65,535).
  for (auto [R, I] : {std::pair<int64_t, int64_t>{1, 17408}, {9, 768}, {130, 1000}, {3, 770}, {65600, 8}, {65600, 5}}) {
    Pair gu = make_f32({R, 2 * I}, rnd(R * 2 * I, -6.f, 6.f)), out = poisoned({R, I});
    cpu_->kernels().silu_mul(gu.tc, out.tc);
    gpu_->kernels().silu_mul(gu.tg, out.tg);
    EXPECT_LE(rel_err(out), 1e-5) << R << "x" << I;
  }
}

TEST_F(CudaOpsTest, Matmul) {
  struct Shape { int64_t n, k; };
  for (Shape s : {Shape{777, 256}, Shape{5120, 640}, Shape{1000, 17408}, Shape{48, 5120}, Shape{300, 1040}}) {
    auto w = to_bf16(rnd(s.n * s.k));
    auto wc = cpu_->make_linear(w.data(), DType::BF16, s.n, s.k);
    auto wg = gpu_->make_linear(w.data(), DType::BF16, s.n, s.k);
    for (int64_t T : {1, 2, 3, 4, 5, 8, 9, 16, 17, 70}) {
      for (bool acc : {false, true}) {
        Pair x = make_f32({T, s.k}, rnd(T * s.k));
        Pair out = acc ? make_f32({T, s.n}, rnd(T * s.n)) : poisoned({T, s.n});
        cpu_->kernels().matmul(x.tc, *wc, out.tc, acc);
        gpu_->kernels().matmul(x.tg, *wg, out.tg, acc);
        const double tol = T == 1 ? 2e-5 : 1e-4;  // f32 GEMV, or (exact mode) three-part cuBLAS
        EXPECT_LE(rel_err(out), tol) << "T=" << T << " N=" << s.n << " K=" << s.k << " acc=" << acc;
        if (gpu_bf16_ && !acc) {
          // Default mode: activations rounded to bf16 once (relative rounding 2^-9 per element),
          // on the one-row GEMV as on cuBLAS.
          auto wb = gpu_bf16_->make_linear(w.data(), DType::BF16, s.n, s.k);
          DeviceBuffer xb = gpu_bf16_->allocate(x.c.size()), ob = gpu_bf16_->allocate(out.c.size());
          Tensor xt = xb.view(DType::F32, {T, s.k}), ot = ob.view(DType::F32, {T, s.n});
          gpu_bf16_->copy_to_device(xt, x.tc.data);
          gpu_bf16_->kernels().matmul(xt, *wb, ot);
          std::vector<float> got(static_cast<size_t>(T * s.n));
          gpu_bf16_->copy_to_host(got.data(), ot);
          double err = 0, ref = 0;
          for (int64_t i = 0; i < T * s.n; ++i) {
            err = std::max(err, double(std::abs(got[i] - out.tc.f32()[i])));
            ref = std::max(ref, double(std::abs(out.tc.f32()[i])));
          }
          EXPECT_LE(err / ref, 1e-2) << "bf16 GEMM T=" << T << " N=" << s.n << " K=" << s.k;
          EXPECT_GT(err, 0.0) << "bf16 GEMM T=" << T << ": identical to f32, is the mode switch working?";
        }
      }
    }
  }
}

// Default mode: a verification row (cuBLAS, several rows) sees what a decode row (the one-row GEMV)
// sees: the same bf16-rounded input, exact bf16 products, only the summation order differs (and the
// tensor cores' accumulation, ~1e-5 over long K; rounding x differently would show as ~1e-3).
// (Through a whole model those ~1e-5 can still move a later input across a rounding step.)
TEST_F(CudaOpsTest, MatmulOneRowMatchesManyRowsInBf16Mode) {
  if (gpu_bf16_ == nullptr) GTEST_SKIP() << "the bf16 GEMM mode needs a GPU";
  struct Shape { int64_t n, k; };
  for (Shape s : {Shape{5120, 6144}, Shape{1000, 17408}, Shape{300, 1040}}) {
    const auto w = to_bf16(rnd(s.n * s.k));
    auto wg = gpu_bf16_->make_linear(w.data(), DType::BF16, s.n, s.k);
    for (int64_t T : {2, 4, 16}) {
      const auto xv = rnd(T * s.k, -3.f, 3.f);
      DeviceBuffer xb = gpu_bf16_->allocate(xv.size() * 4), ob = gpu_bf16_->allocate(T * s.n * 4);
      DeviceBuffer rb = gpu_bf16_->allocate(s.n * 4);
      Tensor x = xb.view(DType::F32, {T, s.k}), o = ob.view(DType::F32, {T, s.n}), r = rb.view(DType::F32, {1, s.n});
      gpu_bf16_->copy_to_device(x, xv.data());
      gpu_bf16_->kernels().matmul(x, *wg, o);
      std::vector<float> many(static_cast<size_t>(T * s.n)), one(static_cast<size_t>(s.n));
      gpu_bf16_->copy_to_host(many.data(), o);
      for (int64_t t = 0; t < T; ++t) {
        Tensor xt(x.f32() + t * s.k, DType::F32, {1, s.k}, gpu_bf16_->device());
        gpu_bf16_->kernels().matmul(xt, *wg, r);
        gpu_bf16_->copy_to_host(one.data(), r);
        double md = 0, mr = 1e-30;
        for (int64_t i = 0; i < s.n; ++i) {
          md = std::max(md, double(std::fabs(one[i] - many[t * s.n + i])));
          mr = std::max(mr, double(std::fabs(many[t * s.n + i])));
        }
        EXPECT_LE(md / mr, 2e-5) << "row " << t << " of " << T << " N=" << s.n << " K=" << s.k;
      }
    }
  }
}

// GEMMs of 2+ rows take their cuBLAS algorithm per shape and bucket of row counts (cuda_gemm.h).
// Each algorithm cuBLASLt offers (forced one by one) and the timed choice give cublasGemmEx's
// product up to the summation order, with and without accumulation (timing writes temporary
// buffers, never the output); 3 rows take the choice timed at 4. A row count keeps its
// algorithm: the same bits on every call, listed once. A row count met first inside a graph capture,
// its bucket untimed, runs GemmEx, in the graph and eagerly after it.
TEST_F(CudaOpsTest, MatmulCublasAlgorithmsAgreeWithGemmExAndAShapeKeepsItsChoice) {
  if (cpu_only()) GTEST_SKIP() << "GPU options";
  CudaOptions ref_opt;
  ref_opt.gemm_algo = 0;
  auto ref = make_cuda_backend(0, ref_opt);
  std::vector<std::unique_ptr<Backend>> algos;  // [0]: timed (the default), then cuBLASLt #1..#8 forced
  for (int a : {-1, 1, 2, 3, 4, 5, 6, 7, 8}) {
    CudaOptions o;
    o.gemm_algo = a;
    algos.push_back(make_cuda_backend(0, o));
  }
  struct Shape { int64_t n, k; };
  bool some_differ = false;
  for (Shape s : {Shape{1000, 17408}, Shape{5120, 640}, Shape{300, 1040}}) {
    const auto w = to_bf16(rnd(s.n * s.k, -0.05f, 0.05f));
    auto wr = ref->make_linear(w.data(), DType::BF16, s.n, s.k);
    std::vector<std::unique_ptr<LinearWeight>> ws;
    for (auto& b : algos) ws.push_back(b->make_linear(w.data(), DType::BF16, s.n, s.k));
    for (int64_t T : {2, 4, 3, 16, 64}) {
      for (bool acc : {false, true}) {
        const auto xv = rnd(T * s.k, -3.f, 3.f), base = rnd(T * s.n);
        auto run = [&](Backend& b, const LinearWeight& lw) {
          DeviceBuffer xb = b.allocate(xv.size() * 4), ob = b.allocate(base.size() * 4);
          Tensor x = xb.view(DType::F32, {T, s.k}), o = ob.view(DType::F32, {T, s.n});
          b.copy_to_device(x, xv.data());
          b.copy_to_device(o, base.data());
          b.kernels().matmul(x, lw, o, acc);
          std::vector<float> got(base.size());
          b.copy_to_host(got.data(), o);
          return got;
        };
        const std::vector<float> r = run(*ref, *wr);
        double mr = 1e-30;
        for (float v : r) mr = std::max(mr, double(std::fabs(v)));
        for (std::size_t i = 0; i < algos.size(); ++i) {
          const std::vector<float> g = run(*algos[i], *ws[i]);
          double md = 0;
          for (std::size_t j = 0; j < g.size(); ++j) md = std::max(md, double(std::fabs(g[j] - r[j])));
          const std::string what = i == 0 ? "timed" : "cuBLASLt #" + std::to_string(i);
          EXPECT_LE(md / mr, 2e-5) << what << " T=" << T << " N=" << s.n << " K=" << s.k << " acc=" << acc;
          some_differ = some_differ || g != r;
          if (i == 0) {
            EXPECT_EQ(run(*algos[0], *ws[0]), g) << "timed, second call, T=" << T << " N=" << s.n;
          }
        }
      }
    }
  }
  EXPECT_TRUE(some_differ) << "every forced cuBLASLt algorithm gave GemmEx's bits: is the switch working?";
  const std::vector<std::string> listed = cuda_gemm_choices(*algos[0]);
  for (const char* shape : {"1000x17408 rows 4:", "1000x17408 rows 3:", "5120x640 rows 64:", "300x1040 rows 2:"})
    EXPECT_EQ(std::count_if(listed.begin(), listed.end(),
                            [&](const std::string& l) { return l.rfind(shape, 0) == 0; }),
              1)
        << shape;
  // A shape first met in a graph capture (5 rows): GemmEx, then kept.
  Backend& tb = *algos[0];
  const int64_t T = 5, N = 1000, K = 1040;
  const auto w = to_bf16(rnd(N * K, -0.05f, 0.05f));
  auto wt = tb.make_linear(w.data(), DType::BF16, N, K);
  auto wr = ref->make_linear(w.data(), DType::BF16, N, K);
  const auto xv = rnd(T * K, -3.f, 3.f);
  DeviceBuffer xb = tb.allocate(xv.size() * 4), ob = tb.allocate(T * N * 4);
  Tensor x = xb.view(DType::F32, {T, K}), o = ob.view(DType::F32, {T, N});
  tb.copy_to_device(x, xv.data());
  auto graph = tb.capture([&] { tb.kernels().matmul(x, *wt, o); });
  ASSERT_NE(graph, nullptr);
  tb.replay(*graph);
  std::vector<float> replayed(T * N), eager(T * N), gemm_ex(T * N);
  tb.copy_to_host(replayed.data(), o);
  tb.kernels().matmul(x, *wt, o);
  tb.copy_to_host(eager.data(), o);
  DeviceBuffer xr = ref->allocate(xv.size() * 4), orb = ref->allocate(T * N * 4);
  Tensor xrt = xr.view(DType::F32, {T, K}), ort = orb.view(DType::F32, {T, N});
  ref->copy_to_device(xrt, xv.data());
  ref->kernels().matmul(xrt, *wr, ort);
  ref->copy_to_host(gemm_ex.data(), ort);
  EXPECT_EQ(replayed, gemm_ex);
  EXPECT_EQ(eager, gemm_ex);
  const std::vector<std::string> after = cuda_gemm_choices(tb);
  EXPECT_EQ(std::count(after.begin(), after.end(), std::string("1000x1040 rows 5: cublasGemmEx")), 1);
}

// Prefill's and verification's projections in the default (bf16) GEMM mode: the RMSNorm or
// SiLU-mul written straight as the GEMM's bf16 input gives exactly what the separate op then matmul
// give (the same rounded values), with and without accumulation.
TEST_F(CudaOpsTest, NormOrSiluMulMatmulManyRowsEqualsSeparateOps) {
  if (gpu_bf16_ == nullptr) GTEST_SKIP() << "the bf16 GEMM mode needs a GPU";
  for (const int64_t T : {3, 70}) {  // verification rows and a prefill
    const int64_t K = 640, N = 300;
    const auto w = to_bf16(rnd(N * K, -0.05f, 0.05f));
    auto wg = gpu_bf16_->make_linear(w.data(), DType::BF16, N, K);
    const auto xin = rnd(T * 2 * K, -3.f, 3.f), nw = rnd(K, 0.5f, 1.5f), base = rnd(T * N);
    DeviceBuffer xb = gpu_bf16_->allocate(xin.size() * 4), nb = gpu_bf16_->allocate(nw.size() * 4);
    DeviceBuffer ab = gpu_bf16_->allocate(T * K * 4);
    DeviceBuffer o1 = gpu_bf16_->allocate(base.size() * 4), o2 = gpu_bf16_->allocate(base.size() * 4);
    Tensor gu = xb.view(DType::F32, {T, 2 * K}), x = xb.view(DType::F32, {T, K}), nt = nb.view(DType::F32, {K});
    Tensor at = ab.view(DType::F32, {T, K});
    Tensor t1 = o1.view(DType::F32, {T, N}), t2 = o2.view(DType::F32, {T, N});
    gpu_bf16_->copy_to_device(gu, xin.data());
    gpu_bf16_->copy_to_device(nt, nw.data());
    for (bool silu : {false, true}) {
      for (bool acc : {false, true}) {
        gpu_bf16_->copy_to_device(t1, base.data());
        gpu_bf16_->copy_to_device(t2, base.data());
        if (silu) {
          gpu_bf16_->kernels().silu_mul_matmul(gu, *wg, t1, acc, at);
          gpu_bf16_->kernels().silu_mul(gu, at);
        } else {
          gpu_bf16_->kernels().rms_norm_matmul(x, nt, 1e-6f, *wg, t1, acc, at);
          gpu_bf16_->kernels().rms_norm(x, nt, 1e-6f, at);
        }
        gpu_bf16_->kernels().matmul(at, *wg, t2, acc);
        std::vector<float> r1(base.size()), r2(base.size());
        gpu_bf16_->copy_to_host(r1.data(), t1);
        gpu_bf16_->copy_to_host(r2.data(), t2);
        EXPECT_EQ(r1, r2) << "T=" << T << " silu=" << silu << " acc=" << acc;
        EXPECT_NE(r1, base) << "T=" << T << " silu=" << silu << " acc=" << acc;
      }
    }
  }
}

// The MLP (Kernels::mlp) in the default (bf16) mode against a double-precision host model of its
// roundings: the norm and down's input in bf16 at any row count; for a prefill chunk (70 rows, more
// than 64) also gate_up's output, and act's buffer then holds bf16(silu(g) * u), checked element by
// element (a GPU sum can land on the other side of a rounding step); 3 rows keep gate_up's f32
// output. The output against the model, with and without accumulation. Exact mode (3-part GEMMs,
// f32 intermediates) against the unrounded reference.
TEST_F(CudaOpsTest, MlpManyRowsKeepsBf16IntermediatesInBf16Mode) {
  if (gpu_bf16_ == nullptr) GTEST_SKIP() << "the bf16 GEMM mode needs a GPU";
  const int64_t H = 640, I = 300;
  const auto wgu = to_bf16(rnd(2 * I * H, -0.08f, 0.08f)), wd = to_bf16(rnd(H * I, -0.08f, 0.08f));
  const auto nw = rnd(H, 0.5f, 1.5f);
  auto bf = [](double v) { return double(bf16_to_f32(f32_to_bf16(static_cast<float>(v)))); };
  for (Backend* gpu : {gpu_bf16_, gpu_}) {
    const bool bf16_mode = gpu == gpu_bf16_;
    auto gu_w = gpu->make_linear(wgu.data(), DType::BF16, 2 * I, H);
    auto d_w = gpu->make_linear(wd.data(), DType::BF16, H, I);
    for (const int64_t T : {3, 70}) {  // 3 rows: f32 intermediates in either mode
      const bool bf16_rows = bf16_mode && T > 64;  // gate_up's output in bf16 too
      const auto xv = rnd(T * H, -3.f, 3.f), base = rnd(T * H);
      // Host model: normed x, then gate_up, SiLU-mul and down, rounding to bf16 where bf16 mode does.
      std::vector<double> act(static_cast<size_t>(T * I)), ref(static_cast<size_t>(T * H));
      for (int64_t t = 0; t < T; ++t) {
        double ss = 0;
        for (int64_t k = 0; k < H; ++k) ss += double(xv[t * H + k]) * xv[t * H + k];
        const double inv = 1.0 / std::sqrt(ss / double(H) + 1e-6);
        std::vector<double> xn(static_cast<size_t>(H));
        for (int64_t k = 0; k < H; ++k) {
          // bf16 mode rounds the f32 norm; exact mode keeps it (3 parts carry f32's bits).
          const float f = static_cast<float>(double(xv[t * H + k]) * inv) * nw[k];
          xn[k] = bf16_mode ? bf(f) : double(f);
        }
        std::vector<double> g(static_cast<size_t>(2 * I));
        for (int64_t n = 0; n < 2 * I; ++n) {
          double sum = 0;
          for (int64_t k = 0; k < H; ++k) sum += xn[k] * bf16_to_f32(wgu[n * H + k]);
          g[n] = bf16_rows ? bf(sum) : sum;
        }
        for (int64_t i = 0; i < I; ++i) {
          const double a = g[i] / (1.0 + std::exp(-g[i])) * g[I + i];
          act[t * I + i] = bf16_mode ? bf(a) : a;
        }
        for (int64_t n = 0; n < H; ++n) {
          double sum = 0;
          for (int64_t i = 0; i < I; ++i) sum += act[t * I + i] * bf16_to_f32(wd[n * I + i]);
          ref[t * H + n] = sum;
        }
      }
      DeviceBuffer xb = gpu->allocate(T * H * 4), nb = gpu->allocate(H * 4), hb = gpu->allocate(T * H * 4);
      DeviceBuffer gb = gpu->allocate(T * 2 * I * 4), ab = gpu->allocate(T * I * 4), ob = gpu->allocate(T * H * 4);
      Tensor x = xb.view(DType::F32, {T, H}), nt = nb.view(DType::F32, {H}), h = hb.view(DType::F32, {T, H});
      Tensor gu = gb.view(DType::F32, {T, 2 * I}), at = ab.view(DType::F32, {T, I}), out = ob.view(DType::F32, {T, H});
      gpu->copy_to_device(x, xv.data());
      gpu->copy_to_device(nt, nw.data());
      for (bool acc : {false, true}) {
        gpu->copy_to_device(out, base.data());
        gpu->kernels().mlp(x, nt, 1e-6f, *gu_w, *d_w, out, acc, h, gu, at);
        std::vector<float> got(static_cast<size_t>(T * H));
        gpu->copy_to_host(got.data(), out);
        const std::string what = std::string(bf16_mode ? "bf16 mode" : "exact mode") + " T=" + std::to_string(T) +
                                 " acc=" + std::to_string(acc);
        double md = 0, mr = 1e-30;
        for (int64_t i = 0; i < T * H; ++i) {
          const double want = ref[i] + (acc ? base[i] : 0.0);
          md = std::max(md, std::fabs(got[i] - want));
          mr = std::max(mr, std::fabs(want));
        }
        EXPECT_LE(md / mr, bf16_mode ? 3e-3 : 1e-4) << what;
        if (bf16_rows) {  // act's first T * I bf16 values: the SiLU-mul, rounded
          std::vector<uint16_t> a16(static_cast<size_t>(T * I));
          std::vector<float> raw(static_cast<size_t>(T * I));
          gpu->copy_to_host(raw.data(), at);
          std::memcpy(a16.data(), raw.data(), a16.size() * 2);
          // A g or u one step off (its f32 sum on the other side of a rounding step) moves the
          // product by up to a step, and its rounding by another: 1 in 1,000 may be two steps off.
          int off1 = 0, off2 = 0;
          for (int64_t i = 0; i < T * I; ++i) {
            const double d = std::fabs(bf16_to_f32(a16[i]) - act[i]), step = std::ldexp(std::fabs(act[i]), -7);
            off1 += d > step + 1e-30;
            off2 += d > 2 * step + 1e-30;
          }
          EXPECT_LE(off1, T * I / 1000 + 1) << what << ": act elements more than one bf16 step from the host model";
          EXPECT_EQ(off2, 0) << what << ": act elements more than two bf16 steps from the host model";
        }
      }
    }
  }
}

// Matmuls behind an RMSNorm or a SiLU-mul (Kernels::rms_norm_matmul / silu_mul_matmul): at one
// row the CUDA backend folds the prologue into the GEMV (every tile shape), at more rows it runs
// the separate kernels; both within the GEMV tolerance of the CPU's separate ops, with and
// without accumulation, on the 27B's shapes and odd ones; the scratch is written only when unfused.
TEST_F(CudaOpsTest, MatmulWithNormOrSiluMulInFront) {
  struct Shape { int64_t n, k; };
  for (int shape : {0, 24, 42, 81}) {
    CudaOptions opt;
    opt.exact_gemm = true;
    opt.gemv_shape = shape;
    opt.fused_gemv = 2;  // both prologues (off by default)
    std::unique_ptr<Backend> gpu = cpu_only() ? make_cpu_backend(0) : make_cuda_backend(0, opt);
    for (Shape s : {Shape{34816, 5120}, Shape{5120, 17408}, Shape{5120, 6144}, Shape{37, 520}, Shape{9000, 64}}) {
      if (shape != 0 && s.n > 9000) continue;  // the big shapes once, at the default tile
      const auto w = to_bf16(rnd(s.n * s.k, -0.05f, 0.05f));
      auto wc = cpu_->make_linear(w.data(), DType::BF16, s.n, s.k);
      auto wg = gpu->make_linear(w.data(), DType::BF16, s.n, s.k);
      for (int64_t T : {1, 3}) {
        for (bool acc : {false, true}) {
          for (bool silu : {false, true}) {
            const int64_t kin = silu ? 2 * s.k : s.k;
            const auto xv = rnd(T * kin, -2.f, 2.f), nv = rnd(s.k, 0.5f, 1.5f), ov = rnd(T * s.n);
            std::vector<float> cout = ov, gout(static_cast<size_t>(T * s.n)), cscr(static_cast<size_t>(T * s.k));
            std::vector<float> gscr(static_cast<size_t>(T * s.k), 1234.f);
            Tensor xc(const_cast<float*>(xv.data()), DType::F32, {T, kin}), nc(const_cast<float*>(nv.data()), DType::F32, {s.k});
            Tensor oc(cout.data(), DType::F32, {T, s.n}), sc(cscr.data(), DType::F32, {T, s.k});
            if (silu) cpu_->kernels().silu_mul_matmul(xc, *wc, oc, acc, sc);
            else cpu_->kernels().rms_norm_matmul(xc, nc, 1e-6f, *wc, oc, acc, sc);
            DeviceBuffer xb = gpu->allocate(xv.size() * 4), nb = gpu->allocate(nv.size() * 4);
            DeviceBuffer ob = gpu->allocate(ov.size() * 4), sb = gpu->allocate(gscr.size() * 4);
            Tensor xg = xb.view(DType::F32, {T, kin}), ng = nb.view(DType::F32, {s.k});
            Tensor og = ob.view(DType::F32, {T, s.n}), sg = sb.view(DType::F32, {T, s.k});
            gpu->copy_to_device(xg, xv.data());
            gpu->copy_to_device(ng, nv.data());
            gpu->copy_to_device(og, ov.data());
            gpu->copy_to_device(sg, gscr.data());
            if (silu) gpu->kernels().silu_mul_matmul(xg, *wg, og, acc, sg);
            else gpu->kernels().rms_norm_matmul(xg, ng, 1e-6f, *wg, og, acc, sg);
            gpu->copy_to_host(gout.data(), og);
            gpu->copy_to_host(gscr.data(), sg);
            double md = 0, mr = 1e-30;
            for (size_t i = 0; i < gout.size(); ++i) {
              md = std::max(md, std::isnan(gout[i]) ? INFINITY : double(std::fabs(gout[i] - cout[i])));
              mr = std::max(mr, double(std::fabs(cout[i])));
            }
            const std::string what = std::string(silu ? "silu" : "norm") + " tile " + std::to_string(shape) + " T=" +
                                     std::to_string(T) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                                     " acc=" + std::to_string(acc);
            EXPECT_LE(md / mr, 2e-5) << what;
            if (!cpu_only() && T == 1) {
              EXPECT_EQ(gscr[0], 1234.f) << "scratch written by the fused path: " << what;
            }
            if (T > 1) {
              EXPECT_NEAR(gscr[0], cscr[0], 1e-5 * std::max(1.f, std::fabs(cscr[0]))) << "scratch of the separate ops: " << what;
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaOpsTest, MatmulDecodeShape27B) {  // the 27B down_proj at batch 1
  const int64_t N = 5120, K = 17408;
  auto w = to_bf16(rnd(N * K));
  auto wc = cpu_->make_linear(w.data(), DType::BF16, N, K);
  auto wg = gpu_->make_linear(w.data(), DType::BF16, N, K);
  Pair x = make_f32({1, K}, rnd(K)), out = poisoned({1, N});
  cpu_->kernels().matmul(x.tc, *wc, out.tc, false);
  gpu_->kernels().matmul(x.tg, *wg, out.tg, false);
  EXPECT_LE(rel_err(out), 2e-5);
}

TEST_F(CudaOpsTest, GatherRows) {
  const int64_t T = 150, D = 333;
  Pair src = make_f32({T, D}, rnd(T * D));
  std::vector<int32_t> rows(100);
  for (auto& r : rows) r = static_cast<int32_t>(rng_() % T);
  Pair out = poisoned({100, D});
  cpu_->kernels().gather_rows(src.tc, rows.data(), 100, out.tc);
  gpu_->kernels().gather_rows(src.tg, rows.data(), 100, out.tg);
  EXPECT_EQ(rel_err(out), 0.0);
}

// The MTP drafts' logits over a token map spread into vocabulary rows: every column either one
// of the map's scores or the fill (-inf), both backends bit for bit; also a source of no columns
// (a tensor-parallel rank holding none of the map's tokens).
TEST_F(CudaOpsTest, GatherColumnsSpreadsTheMapsScoresAndFillsTheRest) {
  for (int64_t m : {int64_t{0}, int64_t{1000}}) {
    const int64_t R = 5, W = 4099;
    std::vector<int32_t> index(static_cast<std::size_t>(W), -1);
    std::vector<int64_t> cols(static_cast<std::size_t>(W));
    for (int64_t c = 0; c < W; ++c) cols[static_cast<std::size_t>(c)] = c;
    std::shuffle(cols.begin(), cols.end(), rng_);
    for (int64_t j = 0; j < m; ++j) index[static_cast<std::size_t>(cols[static_cast<std::size_t>(j)])] = static_cast<int32_t>(j);
    Pair src = make_f32({R, std::max<int64_t>(m, 1)}, rnd(R * std::max<int64_t>(m, 1)));
    Tensor sc(src.tc.data, DType::F32, {R, m}, src.tc.device), sg(src.tg.data, DType::F32, {R, m}, src.tg.device);
    Pair idx = make(DType::I32, {W}, index.data());
    Pair out = poisoned({R, W});
    const float fill = -std::numeric_limits<float>::infinity();
    cpu_->kernels().gather_columns(sc, idx.tc, out.tc, fill);
    gpu_->kernels().gather_columns(sg, idx.tg, out.tg, fill);
    gpu_->synchronize();
    const auto c = host_of(out.tc, *cpu_), g = host_of(out.tg, *gpu_);
    const auto s = host_of(src.tc, *cpu_);
    int64_t filled = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t col = 0; col < W; ++col) {
        const std::size_t at = static_cast<std::size_t>(r * W + col);
        const int32_t j = index[static_cast<std::size_t>(col)];
        const float want = j < 0 ? fill : s[static_cast<std::size_t>(r * std::max<int64_t>(m, 1) + j)];
        ASSERT_EQ(c[at], want) << "cpu row " << r << " column " << col;
        ASSERT_EQ(g[at], want) << "cuda row " << r << " column " << col;
        filled += j < 0;
      }
    EXPECT_EQ(filled, R * (W - m));
  }
}

// Batch metadata for sequences (n_past, n_new) with shuffled (non-contiguous) KV blocks.
struct Meta {
  std::vector<int32_t> positions, seq_start, context_len, block_table, slots, defer;
  BatchMeta cpu, gpu;
  DeviceBuffer dpos, dstart, dctx, dbt, dslot, ddefer;
  std::vector<int32_t> ck_at, ck_slot;
  DeviceBuffer dck;

  // Prefix-cache checkpoint: sequence `seq` saves its GDN state after token `at` of its run into
  // state slot `slot` (both metas; the others save none).
  void checkpoint(Backend& gpu_backend, int seq, int at, int slot) {
    const int S = cpu.n_seqs;
    ck_at.assign(S, -1);
    ck_slot.assign(S, 0);
    ck_at[seq] = at;
    ck_slot[seq] = slot;
    dck = gpu_backend.allocate(std::size_t(S) * 8);
    Tensor dat = dck.view(DType::I32, {S}), dsl = dck.view(DType::I32, {S}, std::size_t(S) * 4);
    gpu_backend.copy_to_device(dat, ck_at.data());
    gpu_backend.copy_to_device(dsl, ck_slot.data());
    cpu.checkpoint_at = gpu.checkpoint_at = ck_at.data();
    cpu.checkpoint_slot = gpu.checkpoint_slot = ck_slot.data();
    cpu.d_checkpoint_at = Tensor(ck_at.data(), DType::I32, {S});
    cpu.d_checkpoint_slot = Tensor(ck_slot.data(), DType::I32, {S});
    gpu.d_checkpoint_at = dat;
    gpu.d_checkpoint_slot = dsl;
  }
};
// defer_upto > 0: sequences of at most that many tokens defer their GDN state (verifications).
std::unique_ptr<Meta> build_meta(Backend& gpu, const std::vector<std::pair<int, int>>& seqs, int block_size,
                                 int max_blocks, const std::vector<int32_t>& block_perm,
                                 const std::vector<int32_t>& slots, int defer_upto) {
  auto m = std::make_unique<Meta>();
  const int S = static_cast<int>(seqs.size());
  m->block_table.assign(int64_t(S) * max_blocks, -1);
  int t = 0, max_tok = 0, max_ctx = 0, next_block = 0;
  for (int s = 0; s < S; ++s) {
    auto [past, n] = seqs[s];
    m->seq_start.push_back(t);
    for (int j = 0; j < n; ++j) m->positions.push_back(past + j);
    m->context_len.push_back(past + n);
    m->defer.push_back(n <= defer_upto ? 1 : 0);
    const int nb = (past + n + block_size - 1) / block_size;
    for (int b = 0; b < nb; ++b) m->block_table[int64_t(s) * max_blocks + b] = block_perm[next_block++];
    t += n;
    max_tok = std::max(max_tok, n);
    max_ctx = std::max(max_ctx, past + n);
  }
  m->seq_start.push_back(t);
  m->slots = slots;
  BatchMeta b;
  b.n_tokens = t;
  b.n_seqs = S;
  b.positions = m->positions.data();
  b.seq_start = m->seq_start.data();
  b.context_len = m->context_len.data();
  b.block_table = m->block_table.data();
  b.state_slot = m->slots.data();
  b.max_blocks = max_blocks;
  b.block_size = block_size;
  b.max_seq_tokens = max_tok;
  b.max_context = max_ctx;
  b.state_defer = defer_upto > 0 ? m->defer.data() : nullptr;
  m->cpu = b;
  m->cpu.d_positions = Tensor(m->positions.data(), DType::I32, {t});
  m->cpu.d_seq_start = Tensor(m->seq_start.data(), DType::I32, {S + 1});
  m->cpu.d_context_len = Tensor(m->context_len.data(), DType::I32, {S});
  m->cpu.d_block_table = Tensor(m->block_table.data(), DType::I32, {S, max_blocks});
  m->cpu.d_state_slot = Tensor(m->slots.data(), DType::I32, {S});
  m->cpu.d_state_defer = Tensor(m->defer.data(), DType::I32, {S});
  m->gpu = b;
  auto up = [&](DeviceBuffer& buf, std::vector<int32_t>& v, Tensor& dst) {
    buf = gpu.allocate(v.size() * 4);
    dst = buf.view(DType::I32, {int64_t(v.size())});
    gpu.copy_to_device(dst, v.data());
  };
  up(m->dpos, m->positions, m->gpu.d_positions);
  up(m->dstart, m->seq_start, m->gpu.d_seq_start);
  up(m->dctx, m->context_len, m->gpu.d_context_len);
  up(m->dbt, m->block_table, m->gpu.d_block_table);
  m->gpu.d_block_table = m->gpu.d_block_table.reshaped({S, max_blocks});
  up(m->dslot, m->slots, m->gpu.d_state_slot);
  up(m->ddefer, m->defer, m->gpu.d_state_defer);
  return m;
}

// Unit roundoff of a KV cache dtype (relative error of one rounding).
double kv_unit_roundoff(DType dt) {
  switch (dt) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F8E4M3: return std::ldexp(1.0, -4);
    case DType::F8E5M2: return std::ldexp(1.0, -3);
    default: return 0.0;
  }
}

// Stored bytes of x / scale in dtype dt.
std::vector<uint8_t> encode_cache(DType dt, const std::vector<float>& x, float scale) {
  std::vector<uint8_t> out(x.size() * dtype_size(dt));
  const float inv = 1.0f / scale;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x[i] * inv;
    switch (dt) {
      case DType::F32: std::memcpy(&out[i * 4], &v, 4); break;
      case DType::BF16: {
        const uint16_t h = f32_to_bf16(v);
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      case DType::F8E4M3: out[i] = f32_to_f8e4m3(v); break;
      case DType::F8E5M2: out[i] = f32_to_f8e5m2(v); break;
      default: ADD_FAILURE() << "dtype";
    }
  }
  return out;
}

// Next representable value of a cache format above |c| (c finite, not the maximum).
float next_up(DType dt, float c) {
  const float a = std::fabs(c);
  switch (dt) {
    case DType::BF16: return bf16_to_f32(static_cast<uint16_t>(f32_to_bf16(a) + 1));
    case DType::F8E4M3: return f8e4m3_to_f32(static_cast<uint8_t>(f32_to_f8e4m3(a) + 1));
    case DType::F8E5M2: return f8e5m2_to_f32(static_cast<uint8_t>(f32_to_f8e5m2(a) + 1));
    default: return std::nextafter(a, INFINITY);
  }
}

// One attention call on both backends: sequences (n_past, n_new) over shuffled KV blocks whose
// past context is random; checks out and the cache contents. kv_dtype / scales: the cache's.
void CudaOpsTest::attention_case(const AttnShape& sh, const std::vector<std::pair<int, int>>& seqs, int n_blocks,
                                 int max_blocks, double tol, DType kv_dtype, float k_scale, float v_scale,
                                 AttnBytes* gpu_bytes) {
  const int bs = 16;
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  auto m = build_meta(*gpu_, seqs, bs, max_blocks, perm, std::vector<int32_t>(seqs.size(), 0), 0);
  const int T = m->cpu.n_tokens;
  const int64_t row = int64_t(sh.nh) * sh.hd * (sh.gate ? 2 : 1) + 2LL * sh.nkv * sh.hd;
  const int64_t cache_n = int64_t(n_blocks) * bs * sh.nkv * sh.hd;
  // The past context: keys at the scale of RMS-normalised rotated keys, values of qkv's.
  const auto kbytes = encode_cache(kv_dtype, rnd(cache_n, -2.f, 2.f), k_scale);
  const auto vbytes = encode_cache(kv_dtype, rnd(cache_n), v_scale);
  Pair kc = make(kv_dtype, {n_blocks, bs, sh.nkv, sh.hd}, kbytes.data());
  Pair vc = make(kv_dtype, {n_blocks, bs, sh.nkv, sh.hd}, vbytes.data());
  Pair qkv = make_f32({T, row}, rnd(T * row, -2.f, 2.f));
  Pair qn = make_f32({sh.hd}, rnd(sh.hd, 0.5f, 1.5f)), kn = make_f32({sh.hd}, rnd(sh.hd, 0.5f, 1.5f));
  Pair out = poisoned({T, int64_t(sh.nh) * sh.hd});
  AttentionParams p;
  p.n_heads = sh.nh;
  p.n_kv_heads = sh.nkv;
  p.head_dim = sh.hd;
  p.rotary_dim = sh.rd;
  p.rope_theta = 1e7f;
  p.output_gate = sh.gate;
  p.eps = 1e-6f;
  p.scale = 1.0f / std::sqrt(float(sh.hd));
  p.q_norm = qn.tc;
  p.k_norm = kn.tc;
  cpu_->kernels().attention(p, qkv.tc, KvLayerView{kc.tc, vc.tc, k_scale, v_scale}, m->cpu, out.tc);
  p.q_norm = qn.tg;
  p.k_norm = kn.tg;
  gpu_->kernels().attention(p, qkv.tg, KvLayerView{kc.tg, vc.tg, k_scale, v_scale}, m->gpu, out.tg);
  std::string what = "nh=" + std::to_string(sh.nh) + " nkv=" + std::to_string(sh.nkv) +
                     " hd=" + std::to_string(sh.hd) + " T=" + std::to_string(T) +
                     " first seq past=" + std::to_string(seqs[0].first) + " kv " + std::string(dtype_name(kv_dtype));
  if (k_scale != 1.f || v_scale != 1.f) what += " scales " + std::to_string(k_scale) + "/" + std::to_string(v_scale);
  // Cache: V bit-equal; K equal up to one code where the f32 key sat at a rounding midpoint, or
  // (a key near zero, from cancellation in the rotation) within f32 rounding of the keys' scale.
  int64_t flips = 0;
  if (kv_dtype == DType::F32) {
    EXPECT_LE(rel_err(kc), 1e-5) << what;
  } else {
    gpu_->synchronize();
    const auto c = host_of(kc.tc, *cpu_), g = host_of(kc.tg, *gpu_);
    float kmax = 0.f;
    for (float v : c) kmax = std::max(kmax, std::fabs(v));
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (c[i] == g[i] || (c[i] == 0.f && g[i] == 0.f)) continue;
      ++flips;
      const float lo = std::min(std::fabs(c[i]), std::fabs(g[i])), hi = std::max(std::fabs(c[i]), std::fabs(g[i]));
      const bool neighbours = std::signbit(c[i]) == std::signbit(g[i]) && next_up(kv_dtype, lo) == hi;
      EXPECT_TRUE(neighbours || std::fabs(c[i] - g[i]) <= 1e-6f * kmax)
          << what << ": key element " << i << " cpu " << c[i] << " gpu " << g[i] << " (not neighbouring codes)";
      if (flips > 20) break;
    }
    EXPECT_LE(flips, std::max<int64_t>(2, int64_t(T) * sh.nkv * sh.hd / 1000)) << what;
  }
  EXPECT_EQ(rel_err(vc), 0.0) << what;
  const double tol_here = flips > 0 ? std::max(tol, kv_unit_roundoff(kv_dtype)) : tol;
  const double e = rel_err(out);
  EXPECT_LE(e, tol_here) << what << " (" << flips << " key flips)";
  if (gpu_bytes) {
    auto bytes = [&](const Tensor& t) {
      std::vector<uint8_t> b(t.nbytes());
      gpu_->copy_to_host(b.data(), t);
      return b;
    };
    *gpu_bytes = AttnBytes{bytes(out.tg), bytes(kc.tg), bytes(vc.tg)};
  }
  if (tol > 1e-4 || flips > 0)
    std::printf("[ attention ] %s: rel err %.3g (tolerance %.0e, %lld key flips)\n", what.c_str(), e, tol_here,
                static_cast<long long>(flips));
}

const DType kKvDtypes[] = {DType::F32, DType::BF16, DType::F8E4M3, DType::F8E5M2};

TEST_F(CudaOpsTest, Attention) {
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 37}, {0, 5}, {20, 11}},   // prefill: fresh prompts + a continued chunk
      {{0, 1}, {63, 1}, {130, 1}},   // decode
      {{45, 4}, {100, 4}},           // verification (4 tokens on a context)
  };
  for (AttnShape sh : {AttnShape{4, 2, 64, 16, true}, AttnShape{24, 4, 256, 64, true},
                       AttnShape{16, 8, 128, 128, false}, AttnShape{6, 2, 32, 8, true},
                       AttnShape{4, 2, 16, 16, false}}) {
    for (DType dt : kKvDtypes)
      for (const auto& seqs : batches) attention_case(sh, seqs, 64, 16, 1e-4, dt);
  }
  // fp8 with checkpoint-style scales (stored = x / scale; keys reach ~6, values 2).
  for (DType dt : {DType::F8E4M3, DType::F8E5M2})
    for (const auto& seqs : batches)
      attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 64, 16, 1e-4, dt, 0.05f, 0.02f);
}

// Decode and verification on long contexts (4k+ tokens, split-KV over shuffled blocks), every
// KV dtype: decode tokens beside a short and an empty context, and runs of k + 1 = 4 tokens.
TEST_F(CudaOpsTest, AttentionLongContextDecodeAndVerify) {
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{4100, 1}, {5000, 1}, {37, 1}, {0, 1}},
      {{4200, 4}, {4500, 4}},
  };
  for (AttnShape sh :
       {AttnShape{24, 4, 256, 64, true}, AttnShape{16, 8, 128, 128, false}, AttnShape{4, 2, 64, 16, true}}) {
    for (DType dt : kKvDtypes) {
      for (const auto& seqs : batches) {
        const bool scaled = dt == DType::F8E4M3 || dt == DType::F8E5M2;
        attention_case(sh, seqs, 700, 330, 1e-4, dt);
        if (scaled) attention_case(sh, seqs, 700, 330, 1e-4, dt, 0.05f, 0.02f);
      }
    }
  }
  // A 33k context beside a short one (the split-KV decode kernel: every split busy for the long
  // sequence, most empty for the short one), decode and verification, on the 27B head shape.
  for (DType dt : {DType::BF16, DType::F8E4M3}) {
    attention_case(AttnShape{24, 4, 256, 64, true}, {{33001, 1}, {100, 1}}, 2200, 2100, 1e-4, dt);
    attention_case(AttnShape{24, 4, 256, 64, true}, {{32999, 4}}, 2200, 2100, 1e-4, dt);
  }
}

// The decode kernels' variants on the 27B head shape, each against the CPU reference as the
// default is: the CUDA-core split-KV kernel (keys per warp step, register caps, split counts), the
// tiled kernel it replaced, and the tensor-core kernel (the default for bf16 / fp8 caches) with
// the shared-memory limit of an sm_86 GPU (32-key tiles, 2 stages: the A6000's configuration),
// few resident blocks (few splits) and a single split.
TEST_F(CudaOpsTest, AttentionDecodeKernelVariants) {
  if (cpu_only()) GTEST_SKIP() << "GPU options";
  struct V {
    bool decode, mma;
    int keys, min_blocks, blocks_per_sm, smem_cap, max_splits;
  };
  for (V v : {V{true, false, 4, 0, 1, 0, 64}, V{true, false, 4, 3, 3, 0, 64}, V{true, false, 8, 0, 2, 0, 64},
              V{true, false, 8, 2, 4, 0, 64}, V{false, false, 4, 0, 2, 0, 64}, V{true, true, 8, 0, 0, 0, 64},
              V{true, true, 8, 0, 0, 101376, 64}, V{true, true, 8, 0, 2, 0, 3}, V{true, true, 8, 0, 1, 0, 1}}) {
    CudaOptions o;
    o.exact_gemm = true;
    o.decode_attention = v.decode;
    o.decode_tensor_cores = v.mma;
    o.decode_keys_per_step = v.keys;
    o.decode_min_blocks = v.min_blocks;
    o.decode_blocks_per_sm = v.blocks_per_sm;
    o.decode_mma_blocks_per_sm = v.blocks_per_sm;
    o.smem_per_block_cap = v.smem_cap;
    o.decode_max_splits = v.max_splits;
    std::unique_ptr<Backend> variant = make_cuda_backend(0, o);
    Backend* saved = gpu_;
    gpu_ = variant.get();
    SCOPED_TRACE("decode " + std::to_string(v.decode) + " mma " + std::to_string(v.mma) + " keys " +
                 std::to_string(v.keys) + " min_blocks " + std::to_string(v.min_blocks) + " blocks/SM " +
                 std::to_string(v.blocks_per_sm) + " smem cap " + std::to_string(v.smem_cap) + " max splits " +
                 std::to_string(v.max_splits));
    const std::vector<std::vector<std::pair<int, int>>> batches = {
        {{4100, 1}, {5000, 1}, {37, 1}, {0, 1}}, {{4200, 4}, {4500, 4}}, {{3000, 5}, {10, 2}, {700, 1}}};
    for (const auto& seqs : batches) attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 700, 330, 1e-4, DType::BF16);
    if (v.mma)
      for (const auto& seqs : batches)
        attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 700, 330, 1e-4, DType::F8E4M3, 0.05f, 0.02f);
    gpu_ = saved;
  }
}

// The tensor-core decode kernel cut into a hundred splits and more (head_dim 64: small blocks,
// several per SM; 32-64 keys a split), most of them empty for a short sequence beside a long one:
// decode rows (132 splits, 65 of them with keys for the long sequence, 1 for the short) and a
// verification of 4 tokens x 8 heads (32 rows, 528 splits, 132 with keys); this step's keys land in
// one split of each sequence, which writes them when the kernel does qk_prep's work (the default).
TEST_F(CudaOpsTest, AttentionDecodeInHundredsOfSplits) {
  if (cpu_only()) GTEST_SKIP() << "GPU options";
  CudaOptions o;
  o.exact_gemm = true;
  o.decode_mma_blocks_per_sm = 64;
  o.decode_max_splits = 1024;
  o.decode_min_keys = 1;
  std::unique_ptr<Backend> variant = make_cuda_backend(0, o);
  Backend* saved = gpu_;
  gpu_ = variant.get();
  for (DType dt : {DType::BF16, DType::F8E4M3}) {
    attention_case(AttnShape{4, 2, 64, 16, true}, {{4100, 1}, {37, 1}}, 700, 330, 1e-4, dt);
    attention_case(AttnShape{16, 2, 64, 16, true}, {{4200, 4}}, 700, 330, 1e-4, dt);
  }
  gpu_ = saved;
}

// The tensor-core decode kernel doing qk_prep's work itself (the default) gives the bits of
// qk_prep_kernel before it: output and caches, decode rows and verifications, bf16 and fp8 caches,
// head dims 64-256, rotary halves of 8-32 dims, one split and many (whose combine is the same).
TEST_F(CudaOpsTest, AttentionDecodeWithItsPrepFoldedInGivesTheSameBits) {
  if (cpu_only()) GTEST_SKIP() << "GPU options";
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{4100, 1}, {37, 1}, {0, 1}}, {{4200, 4}, {45, 4}}, {{3000, 5}, {10, 2}, {700, 1}}};
  for (int max_splits : {64, 1}) {
    AttnBytes got[2];
    for (int fused = 0; fused < 2; ++fused) {
      CudaOptions o;
      o.exact_gemm = true;
      o.decode_fused_prep = fused == 1;
      o.decode_max_splits = max_splits;
      std::unique_ptr<Backend> variant = make_cuda_backend(0, o);
      Backend* saved = gpu_;
      gpu_ = variant.get();
      std::vector<AttnBytes> all;
      rng_.seed(7);
      for (AttnShape sh : {AttnShape{24, 4, 256, 64, true}, AttnShape{16, 8, 128, 128, false},
                           AttnShape{4, 2, 64, 16, true}}) {
        for (const auto& seqs : batches) {
          for (DType dt : {DType::BF16, DType::F8E4M3}) {
            AttnBytes b;
            attention_case(sh, seqs, 700, 330, 1e-4, dt, dt == DType::BF16 ? 1.f : 0.05f,
                           dt == DType::BF16 ? 1.f : 0.02f, &b);
            all.push_back(std::move(b));
          }
        }
      }
      gpu_ = saved;
      for (const AttnBytes& b : all) {
        got[fused].out.insert(got[fused].out.end(), b.out.begin(), b.out.end());
        got[fused].k.insert(got[fused].k.end(), b.k.begin(), b.k.end());
        got[fused].v.insert(got[fused].v.end(), b.v.begin(), b.v.end());
      }
    }
    SCOPED_TRACE("max splits " + std::to_string(max_splits));
    ASSERT_FALSE(got[0].out.empty());
    EXPECT_TRUE(got[0].out == got[1].out) << "attention output";
    EXPECT_TRUE(got[0].k == got[1].k) << "key cache";
    EXPECT_TRUE(got[0].v == got[1].v) << "value cache";
  }
}

// Sequences of >= 64 tokens: the tensor-core (flash) path on CUDA. Two fresh prompts, a chunk
// continuing a cached 400-token prefix (keys from earlier chunks through the block table) and a
// decode token in the same batch; a chunk alone; fresh prompts only (no staged keys: 64-key
// tiles). q, k in fp16 and p, v in bf16 (f32 sums): relative error a few 1e-3 against the f32
// CPU reference.
TEST_F(CudaOpsTest, AttentionLongPrefill) {
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 300}, {0, 700}, {400, 200}, {50, 1}},
      {{100, 64}},
      {{0, 300}, {0, 129}, {0, 1}},
  };
  for (AttnShape sh : {AttnShape{24, 4, 256, 64, true}, AttnShape{16, 8, 128, 128, false},
                       AttnShape{4, 2, 64, 16, true}, AttnShape{6, 2, 64, 32, true}, AttnShape{8, 1, 128, 32, true}}) {
    for (const auto& seqs : batches) attention_case(sh, seqs, 128, 64, 1e-2);
  }
  // Every KV dtype: this step's keys come from the per-token scratch (the values the cache holds),
  // earlier chunks' keys are staged from the cache in its dtype; also a chunk continuing a 4k prefix.
  std::vector<std::vector<std::pair<int, int>>> with_long = batches;
  with_long.push_back({{4096, 128}, {0, 70}});
  for (AttnShape sh : {AttnShape{24, 4, 256, 64, true}, AttnShape{4, 2, 64, 16, true}}) {
    for (DType dt : {DType::BF16, DType::F8E4M3, DType::F8E5M2}) {
      for (const auto& seqs : with_long) {
        attention_case(sh, seqs, 400, 300, 1e-2, dt);
        if (dt == DType::F8E4M3) attention_case(sh, seqs, 400, 300, 1e-2, dt, 0.05f, 0.02f);
      }
    }
  }
}

// The warpgroup-MMA prefill kernel (sm_90 GPUs, bf16 cache; by default for batches continuing a
// cached prefix, here forced for every batch): every key from the paged cache, of this step and of
// earlier chunks alike; one or two query heads per block.
TEST_F(CudaOpsTest, AttentionLongPrefillByWarpgroupMma) {
  if (cpu_only()) GTEST_SKIP() << "a GPU option";
  CudaOptions o;
  o.exact_gemm = true;
  cuda::FlashPlan plan;
  if (!cuda::flash_attention_plan(24, 4, 256, true, cuda::KvType::BF16, o, &plan) || !plan.wgmma)
    GTEST_SKIP() << "warpgroup MMA needs an sm_90 GPU";
  EXPECT_EQ(plan.heads_per_block, 2);
  // By default only batches continuing a cached prefix take it; fresh prompts keep mma.sync.
  ASSERT_TRUE(cuda::flash_attention_plan(24, 4, 256, false, cuda::KvType::BF16, o, &plan));
  EXPECT_FALSE(plan.wgmma);
  o.flash_wgmma = 1;  // always, for the fresh prompts below too
  std::unique_ptr<Backend> wg = make_cuda_backend(0, o);
  Backend* saved = gpu_;
  gpu_ = wg.get();
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 300}, {0, 700}, {400, 200}, {50, 1}}, {{100, 64}}, {{0, 300}, {0, 129}, {0, 1}}, {{4096, 128}, {0, 70}}};
  for (AttnShape sh : {AttnShape{24, 4, 256, 64, true}, AttnShape{16, 8, 128, 128, false},
                       AttnShape{4, 2, 64, 16, true}, AttnShape{6, 2, 64, 32, true}, AttnShape{8, 1, 128, 32, true}})
    for (const auto& seqs : batches) attention_case(sh, seqs, 400, 300, 1e-2, DType::BF16);
  gpu_ = saved;
}

// A short chunk on a long context gives few flash blocks: the context is split over more of them
// (grid z) and attn_combine_kernel merges their partials. Splits past a row's position leave it no
// key (its partial: sum 0). Both kernels, split and not, against the CPU reference.
TEST_F(CudaOpsTest, AttentionChunkOnALongContextSplitsItsKeys) {
  if (cpu_only()) GTEST_SKIP() << "GPU options";
  CudaOptions o;
  o.exact_gemm = true;
  const int sms = cuda::sm_count(0);
  EXPECT_GT(cuda::flash_attention_splits(24, 4224, 4, o), 1);       // 2 tiles x 12 head blocks
  EXPECT_EQ(cuda::flash_attention_splits(sms, 100000, 4, o), 1);    // a wave already
  EXPECT_EQ(cuda::flash_attention_splits(12, 300, 4, o), 2);        // 300 keys: two splits of 4+ tiles
  if (sms == 132) {  // the H200: 384 blocks in 3 full waves, not 96 in one 27% idle
    EXPECT_EQ(cuda::flash_attention_splits(96, 32768, 4, o), 4);
  }
  CudaOptions off = o;
  off.flash_max_splits = 1;
  EXPECT_EQ(cuda::flash_attention_splits(24, 4224, 4, off), 1);
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{4096, 128}, {0, 70}}, {{8000, 100}, {2000, 1}}, {{300, 65}}, {{6000, 64}, {5000, 1}, {40, 1}}};
  for (int wgmma : {0, -1}) {
    for (int splits : {1, 16}) {
      CudaOptions v = o;
      v.flash_wgmma = wgmma;
      v.flash_max_splits = splits;
      std::unique_ptr<Backend> variant = make_cuda_backend(0, v);
      Backend* saved = gpu_;
      gpu_ = variant.get();
      SCOPED_TRACE("flash_wgmma " + std::to_string(wgmma) + " max splits " + std::to_string(splits));
      for (const auto& seqs : batches) {
        attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 1100, 600, 1e-2, DType::BF16);
        if (wgmma == 0) attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 1100, 600, 1e-2, DType::F8E4M3, 0.05f, 0.02f);
      }
      attention_case(AttnShape{16, 8, 128, 128, false}, batches[0], 1100, 600, 1e-2, DType::BF16);
      gpu_ = saved;
    }
  }
}

// The A6000's (sm_86) shared memory, forced on this GPU (CudaOptions::smem_per_block_cap): at
// head_dim 256 the tensor-core prefill still runs, with 16-key tiles when a chunk continues a
// cached prefix (a staged 32-key tile of f32 or bf16 does not fit 99 KB; one of fp8, half a bf16
// one, does), for every KV dtype.
TEST_F(CudaOpsTest, AttentionLongPrefillWithSm86SharedMemory) {
  if (cpu_only()) GTEST_SKIP() << "a GPU option";
  CudaOptions o;
  o.exact_gemm = true;
  o.smem_per_block_cap = 101376;
  for (DType dt : {DType::F32, DType::BF16, DType::F8E4M3}) {
    const cuda::KvType kv = dt == DType::F32 ? cuda::KvType::F32 : dt == DType::BF16 ? cuda::KvType::BF16 : cuda::KvType::E4M3;
    cuda::FlashPlan staged, fresh;
    ASSERT_TRUE(cuda::flash_attention_plan(24, 4, 256, true, kv, o, &staged)) << dtype_name(dt);
    EXPECT_EQ(staged.keys_per_tile, dt == DType::F8E4M3 ? 32 : 16) << dtype_name(dt);
    ASSERT_TRUE(cuda::flash_attention_plan(24, 4, 256, false, kv, o, &fresh)) << dtype_name(dt);
    EXPECT_EQ(fresh.keys_per_tile, 32) << dtype_name(dt);
  }
  std::unique_ptr<Backend> sm86 = make_cuda_backend(0, o);
  Backend* saved = gpu_;
  gpu_ = sm86.get();
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 300}, {0, 700}, {400, 200}, {50, 1}}, {{100, 64}}, {{4096, 128}, {0, 70}}};
  for (DType dt : {DType::F32, DType::BF16, DType::F8E4M3})
    for (const auto& seqs : batches) attention_case(AttnShape{24, 4, 256, 64, true}, seqs, 400, 300, 1e-2, dt);
  gpu_ = saved;
}

// Long runs (prefill): the chunked delta rule on CUDA (head dims 64 and 128; 16 keeps the
// sequential kernel), on tensor cores (the default; and with single buffers, sm_86's variant) and on
// CUDA cores (DELTASERVE_CUDA_GDN=chunked), against the CPU's sequential recurrence: runs longer
// than a chunk, a partial last chunk, several sequences of different lengths, a decode token beside
// them, a continued state, and a prefix-cache checkpoint in the middle of a chunk (its state saved to
// a spare slot). Those run in exact mode (3xTF32 products, 1e-4); the default mode's tensor-core
// path (one TF32 product of rounded operands) is held to 5e-3 and must be less exact than 3xTF32.
TEST_F(CudaOpsTest, GatedDeltaNetLongRuns) {
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 200}, {0, 33}, {10, 70}},
      {{0, 1000}},
      {{0, 300}, {5, 1}},
      // A mixed step: prefill chunks, then decode rows (the scheduler's order), which run through
      // the fused decode kernel in a second launch.
      {{0, 200}, {0, 33}, {10, 1}, {7, 1}, {3, 1}},
  };
  std::unique_ptr<Backend> no_prefetch, cuda_cores;
  if (!cpu_only()) {
    CudaOptions o;
    o.exact_gemm = true;
    o.gdn_chunk_prefetch = false;
    no_prefetch = make_cuda_backend(0, o);
    o.gdn_chunked_mma = false;
    cuda_cores = make_cuda_backend(0, o);
  }
  Backend* const saved = gpu_;
  std::map<std::string, double> exact_err;  // out's error with 3xTF32, per shape and batch
  // The last two: a bf16 recurrent state (--mamba-ssm-dtype bfloat16) through both chunked kernels.
  const std::pair<Backend*, DType> variants[] = {{saved, DType::F32},          {no_prefetch.get(), DType::F32},
                                                 {cuda_cores.get(), DType::F32}, {gpu_bf16_, DType::F32},
                                                 {saved, DType::BF16},          {cuda_cores.get(), DType::BF16}};
  for (auto [variant, rec_dtype] : variants) {
    if (variant == nullptr) continue;
    gpu_ = variant;
    const bool tf32 = variant == gpu_bf16_;
    const bool bf16_state = rec_dtype == DType::BF16;
    for (GdnShape sh : {GdnShape{16, 48, 128, 128, 4}, GdnShape{2, 4, 64, 64, 4}, GdnShape{1, 2, 16, 16, 4}}) {
      for (std::size_t bi = 0; bi < batches.size(); ++bi) {
        const int n_slots = 6, depth = 4;
        std::vector<int32_t> perm(128);
        std::iota(perm.begin(), perm.end(), 0);
        auto m = build_meta(*gpu_, batches[bi], 16, 64, perm, {3, 0, 4, 2, 5}, 0);
        m->checkpoint(*gpu_, 0, 77, 1);  // the first sequence, after token 77 (mid-chunk), into slot 1
        GdnInputs g = gdn_inputs(sh, m->cpu.n_tokens, n_slots, depth, rec_dtype);
        run_gdn(g, m->cpu, m->gpu);
        Pair &out = g.out;
        const std::string key = "Dk=" + std::to_string(sh.dk) + " batch " + std::to_string(bi);
        const std::string what = std::string(variant == saved                 ? "tensor cores"
                                             : variant == no_prefetch.get() ? "tensor cores, single buffers"
                                             : tf32                         ? "tensor cores, 1xTF32 (bf16 mode)"
                                                                            : "CUDA cores") +
                                 (bf16_state ? ", bf16 state " : " ") + key;
        const double tol = tf32 ? 5e-3 : 1e-4;
        EXPECT_LE(rel_err(out), tol) << what;
        EXPECT_LE(conv_err(g), 1e-6) << what;
        EXPECT_LE(state_err(g), bf16_state ? 1e-2 : tol) << what;  // every slot: the runs' states and the checkpoint
        if (variant == saved && !bf16_state) exact_err[key] = rel_err(out);
        if (tf32 && sh.dk >= 64) {
          EXPECT_GT(rel_err(out), exact_err[key]) << what << ": as exact as 3xTF32?";
        }
      }
    }
  }
  gpu_ = saved;
}

// Decode with the whole layer in one kernel (CudaOptions::gdn_fused_decode, the default; also with
// two warps per block, each walking many row groups; conv windows of 3 taps read before the kernel's
// PDL wait, of 5 after it) and as five kernels (DELTASERVE_CUDA_GDN_FUSED=0):
// the same outputs, conv windows (incl. a checkpoint's copy) and states as the CPU, over two steps in a row (the fused kernel's per-key-head counters
// must be back at zero for the second), for 3 and 24 sequences, key heads shared by 1-3 value
// heads, Dv != Dk, and more state rows than a block's warps hold at once (Dv 256).
// Verifications (2-64 rows): the GDN op's kernels after its conv go by PDL in a chain
// (CudaOptions::pdl_chain), the recurrence loading its state before its wait. The chained launches
// give the bits of plain ones (outputs and pending rows), three times over (a race would show as
// a read of conv_out or gb before the kernel writing them had finished).
TEST_F(CudaOpsTest, GatedDeltaNetVerificationByPdlChainGivesThePlainBits) {
  if (cpu_only()) GTEST_SKIP() << "a GPU option";
  CudaOptions chained_opt, plain_opt;
  chained_opt.exact_gemm = plain_opt.exact_gemm = true;
  plain_opt.pdl_chain = false;
  std::unique_ptr<Backend> chained = make_cuda_backend(0, chained_opt), plain = make_cuda_backend(0, plain_opt);
  const std::vector<std::pair<int, int>> verifications = {{30, 4}, {7, 4}, {2, 2}, {11, 3}};
  for (GdnShape sh : {GdnShape{16, 48, 128, 128, 4}, GdnShape{2, 4, 64, 64, 4}}) {
    std::vector<int32_t> perm(64);
    std::iota(perm.begin(), perm.end(), 0);
    auto m = build_meta(*gpu_, verifications, 16, 8, perm, {3, 0, 4, 1}, 4);
    GdnInputs g = gdn_inputs(sh, m->cpu.n_tokens, 5, 4);
    for (int round = 0; round < 3; ++round) {
      std::vector<float> out[2], pend[2];
      for (int c = 0; c < 2; ++c) {
        Backend& b = c == 0 ? *plain : *chained;
        gpu_->synchronize();
        b.kernels().gated_delta_net(g.params(true), g.proj.tg, g.state(true), m->gpu, g.out.tg);
        b.synchronize();
        out[c] = host_of(g.out.tg, *gpu_);
        pend[c] = host_of(g.pend.tg, *gpu_);
      }
      const std::string what = "Hv=" + std::to_string(sh.hv) + " round " + std::to_string(round);
      EXPECT_TRUE(out[0] == out[1]) << what;
      EXPECT_TRUE(pend[0] == pend[1]) << what;
      g.proj = make_f32({m->cpu.n_tokens, g.p.proj_dim()}, rnd(m->cpu.n_tokens * g.p.proj_dim(), -2.f, 2.f));
    }
  }
}

// Decode batches for the fused GDN decode tests, (seqs as (context, new tokens), their state
// slots): 3 sequences, and 24 over shuffled slots.
std::vector<std::pair<std::vector<std::pair<int, int>>, std::vector<int32_t>>> gdn_decode_batches() {
  std::vector<std::pair<int, int>> many;
  std::vector<int32_t> many_slots;
  for (int i = 0; i < 24; ++i) {
    many.push_back({i % 7, 1});
    many_slots.push_back((i * 5) % 24);
  }
  return {{{{3, 1}, {8, 1}, {1, 1}}, {3, 0, 4}}, {many, many_slots}};
}

TEST_F(CudaOpsTest, GatedDeltaNetFusedDecode) {
  if (cpu_only()) GTEST_SKIP() << "a GPU option";
  const auto batches = gdn_decode_batches();
  // Fused with the warps chosen by the batch, fused with 2 warps walking every row group, five
  // kernels; then fused again over a bf16 recurrent state (staged in shared memory on sm_90; the
  // second step starts from states each backend rounded: within a bf16 rounding of each other);
  // then in clusters of 2 blocks per head (f32 state) and of 4 (bf16), where the head's rows allow
  // (sm_90; else a block per head).
  for (int mode = 0; mode < 6; ++mode) {
    const bool fused_decode = mode != 2;
    const bool bf16 = mode == 3 || mode == 5;
    const DType rec_dtype = bf16 ? DType::BF16 : DType::F32;
    const double rec_tol = bf16 ? 1e-2 : 1e-4, out_tol = bf16 ? 1e-2 : 1e-4;
    CudaOptions opt;
    opt.exact_gemm = true;
    opt.gdn_fused_decode = fused_decode;
    opt.gdn_decode_warps = mode == 1 ? 2 : 0;
    opt.gdn_decode_cluster = mode == 4 ? 2 : mode == 5 ? 4 : 1;
    std::unique_ptr<Backend> gpu = make_cuda_backend(0, opt);
    for (GdnShape sh : {GdnShape{2, 4, 64, 64, 4}, GdnShape{1, 2, 16, 16, 4}, GdnShape{16, 48, 128, 128, 4},
                        GdnShape{2, 6, 32, 64, 4}, GdnShape{1, 1, 128, 256, 4}, GdnShape{2, 4, 64, 64, 6}}) {
      for (std::size_t bi = 0; bi < batches.size(); ++bi) {
        const auto& [seqs, slots] = batches[bi];
        const int n_slots = *std::max_element(slots.begin(), slots.end()) + 2;  // the last one a spare
        std::vector<int32_t> perm(64);
        std::iota(perm.begin(), perm.end(), 0);
        auto m = build_meta(*gpu_, seqs, 16, 8, perm, slots, 0);
        m->checkpoint(*gpu_, 1, 0, n_slots - 1);  // the second sequence, after its token, into the last slot
        GdnInputs g = gdn_inputs(sh, m->cpu.n_tokens, n_slots, 4, rec_dtype);
        for (int step = 0; step < 2; ++step) {
          if (step == 1) g.proj = make_f32({m->cpu.n_tokens, g.p.proj_dim()}, rnd(m->cpu.n_tokens * g.p.proj_dim(), -2.f, 2.f));
          gpu_->synchronize();
          cpu_->kernels().gated_delta_net(g.params(false), g.proj.tc, g.state(false), m->cpu, g.out.tc);
          gpu->kernels().gated_delta_net(g.params(true), g.proj.tg, g.state(true), m->gpu, g.out.tg);
          gpu->synchronize();
          const std::string what = "mode " + std::to_string(mode) + " Hv=" + std::to_string(sh.hv) +
                                   " Dv=" + std::to_string(sh.dv) + " batch " + std::to_string(bi) + " step " +
                                   std::to_string(step);
          EXPECT_LE(rel_err(g.out), step == 0 ? 1e-4 : out_tol) << what;
          EXPECT_LE(conv_err(g), 1e-6) << what;
          EXPECT_LE(state_err(g), rec_tol) << what;
        }
      }
    }
  }
}

// The fused decode kernel's lane layouts (CudaOptions::gdn_decode_layout): a lane holding 8 floats
// of a state row in groups of 2 rows (82, the default) gives the bits of 4 floats in groups of 4 (44),
// with its state read in place or staged in shared memory by a bulk copy (gdn_decode_stage 2, sm_90):
// outputs, conv windows (a checkpoint's copy too) and states, over two steps, f32 and bf16 states,
// a block per head and clusters of 4, for 3 and 24 sequences, Dk 16-128 and Dv 256.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(CudaOpsTest, GatedDeltaNetDecodeLayoutsGiveTheSameBits) {
  if (cpu_only()) GTEST_SKIP() << "a GPU option";
  const auto batches = gdn_decode_batches();
  for (int variant = 0; variant < 4; ++variant) {
    const int cluster = variant % 2 ? 4 : 1, stage = variant / 2 ? 2 : 0;
    CudaOptions base_opt;
    base_opt.exact_gemm = true;
    base_opt.gdn_decode_layout = 44;
    base_opt.gdn_decode_stage = 0;
    base_opt.gdn_decode_cluster = cluster;
    CudaOptions opt = base_opt;
    opt.gdn_decode_layout = 0;  // 82
    opt.gdn_decode_stage = stage;
    std::unique_ptr<Backend> base = make_cuda_backend(0, base_opt), gpu = make_cuda_backend(0, opt);
    for (DType rec_dtype : {DType::F32, DType::BF16}) {
      for (GdnShape sh : {GdnShape{16, 48, 128, 128, 4}, GdnShape{2, 4, 64, 64, 4}, GdnShape{1, 2, 16, 16, 4},
                          GdnShape{2, 6, 32, 64, 4}, GdnShape{1, 1, 128, 256, 4}}) {
        for (std::size_t bi = 0; bi < batches.size(); ++bi) {
          const auto& [seqs, slots] = batches[bi];
          const int n_slots = *std::max_element(slots.begin(), slots.end()) + 2;
          std::vector<int32_t> perm(64);
          std::iota(perm.begin(), perm.end(), 0);
          auto m = build_meta(*gpu_, seqs, 16, 8, perm, slots, 0);
          m->checkpoint(*gpu_, 1, 0, n_slots - 1);
          GdnInputs g[2];
          for (GdnInputs& gi : g) {
            rng_.seed(7);  // the same inputs for both
            gi = gdn_inputs(sh, m->cpu.n_tokens, n_slots, 4, rec_dtype);
          }
          for (int step = 0; step < 2; ++step) {
            for (int c = 0; c < 2; ++c) {
              if (step == 1) {
                rng_.seed(11);
                g[c].proj = make_f32({m->cpu.n_tokens, g[c].p.proj_dim()},
                                     rnd(m->cpu.n_tokens * g[c].p.proj_dim(), -2.f, 2.f));
              }
              gpu_->synchronize();
              Backend& b = c == 0 ? *base : *gpu;
              b.kernels().gated_delta_net(g[c].params(true), g[c].proj.tg, g[c].state(true), m->gpu, g[c].out.tg);
              b.synchronize();
            }
            const std::string what = "cluster " + std::to_string(cluster) + " stage " + std::to_string(stage) +
                                     (rec_dtype == DType::BF16 ? " bf16" : " f32") + " Hv=" + std::to_string(sh.hv) +
                                     " Dk=" + std::to_string(sh.dk) + " Dv=" + std::to_string(sh.dv) + " batch " +
                                     std::to_string(bi) + " step " + std::to_string(step);
            EXPECT_TRUE(same_bits(host_of(g[0].out.tg, *gpu_), host_of(g[1].out.tg, *gpu_))) << what;
            EXPECT_TRUE(same_bits(host_of(g[0].conv.tg, *gpu_), host_of(g[1].conv.tg, *gpu_))) << what;
            EXPECT_TRUE(same_bits(host_of(g[0].recs.tg, *gpu_), host_of(g[1].recs.tg, *gpu_))) << what;
          }
        }
      }
    }
  }
}

// Also with a bf16 recurrent state (--mamba-ssm-dtype bfloat16): both backends run in f32 from the
// stored state and round at the end, so outputs agree as closely as with f32 and the states within
// a bf16 rounding.
TEST_F(CudaOpsTest, GatedDeltaNet) {
  for (DType rec_dtype : {DType::F32, DType::BF16}) {
  const double rec_tol = rec_dtype == DType::BF16 ? 1e-2 : 1e-4;
  const std::vector<std::vector<std::pair<int, int>>> batches = {
      {{0, 17}, {0, 1}, {9, 5}},  // prefill-like, different lengths
      {{3, 1}, {8, 1}, {1, 1}},   // decode
      {{30, 4}, {7, 4}, {2, 2}},  // verifications (state deferred)
      {{0, 9}, {7, 4}, {2, 1}},   // a prefill chunk (writes its state) beside verifications
      {{0, 60}, {7, 4}, {2, 3}},  // the same, long enough for the chunked (tensor-core) kernel
  };
  for (GdnShape sh : {GdnShape{2, 4, 64, 64, 4}, GdnShape{1, 2, 16, 16, 4}, GdnShape{16, 48, 128, 128, 4}}) {
    for (std::size_t bi = 0; bi < batches.size(); ++bi) {
      const int depth = 4;
      const int defer_upto = bi >= 2 ? depth : 0;
      const int n_slots = 5;
      std::vector<int32_t> perm(64);
      std::iota(perm.begin(), perm.end(), 0);
      auto m = build_meta(*gpu_, batches[bi], 16, 8, perm, {3, 0, 4}, defer_upto);
      GdnInputs g = gdn_inputs(sh, m->cpu.n_tokens, n_slots, depth, rec_dtype);
      Pair &conv = g.conv, &recs = g.recs, &pend = g.pend, &out = g.out;
      const int64_t cd = g.cd, rec = g.rec;
      const std::vector<float> conv_before = host_of(conv.tc, *cpu_), recs_before = host_of(recs.tc, *cpu_);
      run_gdn(g, m->cpu, m->gpu);
      const std::string what = "Hv=" + std::to_string(sh.hv) + " batch " + std::to_string(bi) + " state " +
                               std::string(dtype_name(rec_dtype));
      EXPECT_LE(rel_err(out), 1e-4) << what;
      EXPECT_LE(conv_err(g), 1e-6) << what;
      EXPECT_LE(state_err(g), rec_tol) << what;
      if (defer_upto == 0) continue;
      EXPECT_LE(rel_err(pend), 0.0) << what;  // raw inputs, copied
      // Deferred sequences kept their state; then commit a prefix of each deferred run on both
      // backends (0 .. n tokens) and compare the states again.
      std::vector<StateCommit> commits;
      for (int s = 0; s < m->cpu.n_seqs; ++s) {
        if (!m->defer[s]) continue;
        const int slot = m->slots[s], n = m->seq_start[s + 1] - m->seq_start[s];
        const int64_t rec0 = int64_t(slot) * rec, conv0 = int64_t(slot) * cd * (sh.k - 1);
        const std::vector<float> now = host_of(recs.tc, *cpu_);
        EXPECT_TRUE(std::equal(now.begin() + rec0, now.begin() + rec0 + rec, recs_before.begin() + rec0)) << what;
        const std::vector<float> cnow = host_of(conv.tc, *cpu_);
        EXPECT_TRUE(std::equal(cnow.begin() + conv0, cnow.begin() + conv0 + cd * (sh.k - 1), conv_before.begin() + conv0))
            << what;
        commits.push_back({slot, (n + s) % (n + 1)});
      }
      std::vector<int32_t> cstart{0}, cslot;
      for (auto c : commits) {
        cstart.push_back(cstart.back() + c.n_tokens);
        cslot.push_back(c.slot);
      }
      BatchMeta cm;
      cm.n_seqs = static_cast<int>(commits.size());
      cm.n_tokens = cstart.back();
      cm.seq_start = cstart.data();
      cm.state_slot = cslot.data();
      cm.d_seq_start = Tensor(cstart.data(), DType::I32, {cm.n_seqs + 1});
      cm.d_state_slot = Tensor(cslot.data(), DType::I32, {cm.n_seqs});
      BatchMeta gm = cm;
      DeviceBuffer ds = gpu_->allocate(cstart.size() * 4), dl = gpu_->allocate(cslot.size() * 4 + 4);
      gm.d_seq_start = ds.view(DType::I32, {cm.n_seqs + 1});
      gm.d_state_slot = dl.view(DType::I32, {cm.n_seqs});
      gpu_->copy_to_device(gm.d_seq_start, cstart.data());
      gpu_->copy_to_device(gm.d_state_slot, cslot.data());
      const GdnParams pc = g.params(false), pg = g.params(true);
      const StateLayerView sc = g.state(false), sg = g.state(true);
      const GdnLayerRef rc[] = {{&pc, &sc}}, rg[] = {{&pg, &sg}};
      cpu_->kernels().gdn_commit(rc, cm);
      gpu_->kernels().gdn_commit(rg, gm);
      EXPECT_LE(state_err(g), rec_tol) << what << " after commit";
      EXPECT_LE(conv_err(g), 1e-6) << what << " after commit";
    }
  }
  }
}

}  // namespace
}  // namespace deltaserve
