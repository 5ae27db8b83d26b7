// CPU attention (the reference kernel) with every KV cache dtype: f32, bf16, fp8 e4m3 / e5m2, with
// unit and non-unit per-layer scales, over shuffled paged blocks (prefill, a chunk continuing a
// cached prefix, decode on long contexts, verification runs).
//
// 1. Exact: the output equals a double-precision attention that reads the dequantized cache
//    (stored * scale) after the call, and every cache row the call wrote equals
//    convert(f32-path row / scale) bit for bit; rows it did not write are untouched.
//    Tolerance 2e-5 of max |out|: f32 sums over at most a few thousand terms against double.
// 2. Quantization error: the same inputs with the past context at full precision in an f32 cache;
//    max |out - out_f32| / max |out_f32| <= kQuantTol * u, u the unit roundoff of the format
//    (2^-8 bf16, 2^-4 e4m3, 2^-3 e5m2). To first order the error is sum_j p_j dv_j (the values'
//    rounding: at most u max|v|) plus sum_j p_j (ds_j - mean_p ds) v_j (the logits move by
//    ds_j = scale * sum_i q_i dk_i, hd independent roundings of relative size <= u: about
//    u * scale * |q| |k| / 3 ~ 0.7 u for these RMS-normalised q and keys in [-2, 2]). Together
//    that is O(u), and more than u only where max |out| is below max |v| (short softmax tails
//    averaging values); measured over these shapes and batches: 0.5 - 1.2 u. kQuantTol = 2.
//    The test also checks the error is not zero (the dtype is in effect). Test 1 is the one that
//    pins the kernel down exactly; this one bounds what the formats cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_attention_kernels.h"
#include "backend/cpu/vec.h"
#include "core/dtype.h"

namespace deltaserve {
namespace {

constexpr double kExactTol = 2e-5;
constexpr double kQuantTol = 2.0;

struct Shape {
  int nh, nkv, hd, rd;
  bool gate;
};

double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F8E4M3: return std::ldexp(1.0, -4);
    case DType::F8E5M2: return std::ldexp(1.0, -3);
    default: return std::ldexp(1.0, -24);
  }
}

void encode1(DType dt, float x, std::vector<uint8_t>& out_bytes, int64_t i) {
  switch (dt) {
    case DType::F32: std::memcpy(&out_bytes[i * 4], &x, 4); return;
    case DType::BF16: {
      const uint16_t h = f32_to_bf16(x);
      std::memcpy(&out_bytes[i * 2], &h, 2);
      return;
    }
    case DType::F8E4M3: out_bytes[i] = f32_to_f8e4m3(x); return;
    case DType::F8E5M2: out_bytes[i] = f32_to_f8e5m2(x); return;
    default: ADD_FAILURE() << "dtype";
  }
}
float decode1(DType dt, const std::vector<uint8_t>& bytes, int64_t i) {
  switch (dt) {
    case DType::F32: {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, &bytes[i * 2], 2);
      return bf16_to_f32(h);
    }
    case DType::F8E4M3: return f8e4m3_to_f32(bytes[i]);
    case DType::F8E5M2: return f8e5m2_to_f32(bytes[i]);
    default: return NAN;
  }
}

// One batch of sequences (n_past, n_new) over shuffled blocks of 16 positions.
struct Batch {
  std::vector<int32_t> positions, seq_start, context_len, block_table, slots, tok_seq;
  BatchMeta meta;
  int n_blocks = 0;
};
Batch make_batch(const std::vector<std::pair<int, int>>& seqs, std::mt19937& rng) {
  Batch b;
  const int bs = 16;
  int max_blocks = 0, total_blocks = 0;
  for (auto [past, n] : seqs) {
    max_blocks = std::max(max_blocks, (past + n + bs - 1) / bs);
    total_blocks += (past + n + bs - 1) / bs;
  }
  b.n_blocks = total_blocks + 3;  // a few blocks nobody owns (must stay untouched)
  std::vector<int32_t> perm(b.n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.block_table.assign(seqs.size() * max_blocks, -1);
  int t = 0, next = 0, max_tok = 0, max_ctx = 0;
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    auto [past, n] = seqs[s];
    b.seq_start.push_back(t);
    for (int j = 0; j < n; ++j) {
      b.positions.push_back(past + j);
      b.tok_seq.push_back(static_cast<int32_t>(s));
    }
    b.context_len.push_back(past + n);
    for (int k = 0; k < (past + n + bs - 1) / bs; ++k) b.block_table[s * max_blocks + k] = perm[next++];
    t += n;
    max_tok = std::max(max_tok, n);
    max_ctx = std::max(max_ctx, past + n);
  }
  b.seq_start.push_back(t);
  b.slots.assign(seqs.size(), 0);
  BatchMeta& m = b.meta;
  m.n_tokens = t;
  m.n_seqs = static_cast<int>(seqs.size());
  m.positions = b.positions.data();
  m.seq_start = b.seq_start.data();
  m.context_len = b.context_len.data();
  m.block_table = b.block_table.data();
  m.state_slot = b.slots.data();
  m.max_blocks = max_blocks;
  m.block_size = bs;
  m.max_seq_tokens = max_tok;
  m.max_context = max_ctx;
  m.d_positions = Tensor(b.positions.data(), DType::I32, {t});
  m.d_seq_start = Tensor(b.seq_start.data(), DType::I32, {m.n_seqs + 1});
  m.d_context_len = Tensor(b.context_len.data(), DType::I32, {m.n_seqs});
  m.d_block_table = Tensor(b.block_table.data(), DType::I32, {m.n_seqs, max_blocks});
  m.d_state_slot = Tensor(b.slots.data(), DType::I32, {m.n_seqs});
  return b;
}

class CpuAttentionTest : public ::testing::Test {
 protected:
  std::vector<float> rnd(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = d(rng_);
    return v;
  }

  struct Inputs {
    Shape sh;
    Batch batch;
    std::vector<float> qkv, q_norm, k_norm, past_k, past_v;  // past_*: full-precision cache contents
    AttentionParams params;
  };
  Inputs make_inputs(const Shape& sh, const std::vector<std::pair<int, int>>& seqs) {
    Inputs in;
    in.sh = sh;
    in.batch = make_batch(seqs, rng_);
    const int T = in.batch.meta.n_tokens;
    const int64_t row = int64_t(sh.nh) * sh.hd * (sh.gate ? 2 : 1) + 2LL * sh.nkv * sh.hd;
    const int64_t cache_n = int64_t(in.batch.n_blocks) * 16 * sh.nkv * sh.hd;
    in.qkv = rnd(T * row, -2.f, 2.f);
    in.q_norm = rnd(sh.hd, 0.5f, 1.5f);
    in.k_norm = rnd(sh.hd, 0.5f, 1.5f);
    in.past_k = rnd(cache_n, -2.f, 2.f);  // the scale of RMS-normalised, rotated keys
    in.past_v = rnd(cache_n, -2.f, 2.f);
    AttentionParams& p = in.params;
    p.n_heads = sh.nh;
    p.n_kv_heads = sh.nkv;
    p.head_dim = sh.hd;
    p.rotary_dim = sh.rd;
    p.rope_theta = 1e7f;
    p.output_gate = sh.gate;
    p.eps = 1e-6f;
    p.scale = 1.0f / std::sqrt(float(sh.hd));
    p.q_norm = Tensor(in.q_norm.data(), DType::F32, {sh.hd});
    p.k_norm = Tensor(in.k_norm.data(), DType::F32, {sh.hd});
    return in;
  }

  // A cache of dtype dt holding `past / scale`, converted.
  static std::vector<uint8_t> make_cache(DType dt, const std::vector<float>& past, float scale) {
    std::vector<uint8_t> bytes(past.size() * dtype_size(dt));
    const float inv = 1.0f / scale;
    for (std::size_t i = 0; i < past.size(); ++i) encode1(dt, past[i] * inv, bytes, int64_t(i));
    return bytes;
  }

  // Runs the kernel; returns out [T, nh*hd]. k, v: cache bytes (updated in place).
  std::vector<float> run(Inputs& in, DType dt, std::vector<uint8_t>& k, std::vector<uint8_t>& v, float ks,
                         float vs) {
    const Shape& sh = in.sh;
    const int T = in.batch.meta.n_tokens;
    const int64_t row = int64_t(sh.nh) * sh.hd * (sh.gate ? 2 : 1) + 2LL * sh.nkv * sh.hd;
    std::vector<float> out(static_cast<std::size_t>(T) * sh.nh * sh.hd, NAN);
    KvLayerView kv;
    kv.k = Tensor(k.data(), dt, {in.batch.n_blocks, 16, sh.nkv, sh.hd});
    kv.v = Tensor(v.data(), dt, {in.batch.n_blocks, 16, sh.nkv, sh.hd});
    kv.k_scale = ks;
    kv.v_scale = vs;
    backend_->kernels().attention(in.params, Tensor(in.qkv.data(), DType::F32, {T, row}), kv, in.batch.meta,
                                  Tensor(out.data(), DType::F32, {T, int64_t(sh.nh) * sh.hd}));
    return out;
  }

  // Double-precision attention reading the cache as stored * scale (q normalised and rotated
  // with the kernel's f32 RoPE angles).
  std::vector<double> reference(const Inputs& in, DType dt, const std::vector<uint8_t>& k,
                                const std::vector<uint8_t>& v, float ks, float vs) {
    const Shape& sh = in.sh;
    const BatchMeta& m = in.batch.meta;
    const int T = m.n_tokens, hd = sh.hd, qw = sh.gate ? 2 * hd : hd;
    const int64_t row = int64_t(sh.nh) * qw + 2LL * sh.nkv * hd;
    std::vector<float> inv_freq(sh.rd / 2);
    for (int i = 0; i < sh.rd / 2; ++i)
      inv_freq[i] = 1.0f / std::pow(in.params.rope_theta, float(2 * i) / float(sh.rd));
    std::vector<double> out(static_cast<std::size_t>(T) * sh.nh * hd);
    std::vector<double> q(hd), sc;
    for (int t = 0; t < T; ++t) {
      const int s = in.batch.tok_seq[t], pos = m.positions[t];
      for (int h = 0; h < sh.nh; ++h) {
        const float* src = in.qkv.data() + int64_t(t) * row + int64_t(h) * qw;
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += double(src[d]) * src[d];
        const double inv = 1.0 / std::sqrt(ss / hd + double(in.params.eps));
        std::vector<double> x(hd);
        for (int d = 0; d < hd; ++d) x[d] = src[d] * inv * in.q_norm[d];
        q = x;
        for (int i = 0; i < sh.rd / 2; ++i) {
          const double a = double(float(pos) * inv_freq[i]);
          q[i] = x[i] * std::cos(a) - x[i + sh.rd / 2] * std::sin(a);
          q[i + sh.rd / 2] = x[i + sh.rd / 2] * std::cos(a) + x[i] * std::sin(a);
        }
        const int kvh = h / (sh.nh / sh.nkv);
        auto elem = [&](int j, int d) {
          const int32_t blk = m.block_table[int64_t(s) * m.max_blocks + j / 16];
          return ((int64_t(blk) * 16 + j % 16) * sh.nkv + kvh) * hd + d;
        };
        sc.assign(pos + 1, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += q[d] * double(decode1(dt, k, elem(j, d))) * ks;
          sc[j] = dot * in.params.scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& x2 : sc) sum += (x2 = std::exp(x2 - mx));
        for (int d = 0; d < hd; ++d) {
          double o = 0;
          for (int j = 0; j <= pos; ++j) o += sc[j] / sum * double(decode1(dt, v, elem(j, d))) * vs;
          if (sh.gate) o /= 1.0 + std::exp(-double(src[hd + d]));
          out[(int64_t(t) * sh.nh + h) * hd + d] = o;
        }
      }
    }
    return out;
  }

  std::unique_ptr<Backend> backend_ = make_cpu_backend(2);
  std::mt19937 rng_{1234};
};

template <typename A, typename B>
double rel_err(const std::vector<A>& got, const std::vector<B>& ref) {
  double md = 0, mr = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(double(got[i]))) return INFINITY;
    md = std::max(md, std::fabs(double(got[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return md / mr;
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F8E4M3, DType::F8E5M2};
const std::vector<std::vector<std::pair<int, int>>> kBatches = {
    {{0, 37}, {0, 5}, {20, 11}},    // prefill: fresh prompts + a chunk continuing a cached prefix
    {{0, 1}, {700, 1}, {1500, 1}},  // decode (long contexts)
    {{3000, 1}, {2047, 2}},         // decode past one part of keys (vec::kKeyPart): parts merged
    {{45, 4}, {300, 4}},            // verification runs of k + 1 = 4 tokens
};
// (hd 24 and 20: the in-place scores of AVX2 and of plain C++ run on AVX-512 CPUs too.)
const Shape kShapes[] = {{4, 2, 64, 16, true}, {8, 1, 128, 32, false}, {6, 2, 32, 8, true}, {4, 2, 24, 8, false},
                         {4, 2, 20, 4, true}};

TEST_F(CpuAttentionTest, EveryDtypeMatchesDoubleReferenceOnItsStoredValues) {
  for (const Shape& sh : kShapes) {
    for (const auto& seqs : kBatches) {
      Inputs in = make_inputs(sh, seqs);
      // The f32 path (scale 1): its written rows are the values every dtype must store.
      std::vector<uint8_t> k32 = make_cache(DType::F32, in.past_k, 1.f), v32 = make_cache(DType::F32, in.past_v, 1.f);
      run(in, DType::F32, k32, v32, 1.f, 1.f);
      for (DType dt : kDtypes) {
        for (auto [ks, vs] : {std::pair<float, float>{1.f, 1.f}, {0.37f, 2.5f}}) {
          const std::string what = std::string(dtype_name(dt)) + " scales " + std::to_string(ks) + "/" +
                                   std::to_string(vs) + " hd=" + std::to_string(sh.hd) + " T=" +
                                   std::to_string(in.batch.meta.n_tokens);
          std::vector<uint8_t> k = make_cache(dt, in.past_k, ks), v = make_cache(dt, in.past_v, vs);
          const std::vector<uint8_t> k0 = k, v0 = v;
          auto out = run(in, dt, k, v, ks, vs);
          EXPECT_LE(rel_err(out, reference(in, dt, k, v, ks, vs)), kExactTol) << what;
          // Written rows: convert(f32 row / scale); other rows: unchanged.
          std::vector<uint8_t> written(k.size() / dtype_size(dt), 0);
          const BatchMeta& m = in.batch.meta;
          for (int t = 0; t < m.n_tokens; ++t) {
            const int s = in.batch.tok_seq[t], pos = m.positions[t];
            const int64_t base = (int64_t(m.block_table[int64_t(s) * m.max_blocks + pos / 16]) * 16 + pos % 16) *
                                 sh.nkv * sh.hd;
            for (int64_t e = base; e < base + int64_t(sh.nkv) * sh.hd; ++e) written[e] = 1;
          }
          std::vector<uint8_t> want_k(k.size()), want_v(v.size());
          int64_t mismatches = 0, n_written = 0;
          for (int64_t e = 0; e < int64_t(written.size()); ++e) {
            if (written[e]) {
              ++n_written;
              encode1(dt, decode1(DType::F32, k32, e) * (1.0f / ks), want_k, e);
              encode1(dt, decode1(DType::F32, v32, e) * (1.0f / vs), want_v, e);
            } else {
              std::memcpy(&want_k[e * dtype_size(dt)], &k0[e * dtype_size(dt)], dtype_size(dt));
              std::memcpy(&want_v[e * dtype_size(dt)], &v0[e * dtype_size(dt)], dtype_size(dt));
            }
          }
          for (std::size_t b = 0; b < k.size(); ++b) mismatches += (k[b] != want_k[b]) + (v[b] != want_v[b]);
          EXPECT_EQ(mismatches, 0) << what;
          EXPECT_EQ(n_written, int64_t(m.n_tokens) * sh.nkv * sh.hd) << what;
        }
      }
    }
  }
}

// A token's output is the same bits whether its rows sit in a prefill tile (the key blocks
// transposed, vec::scores_block) or in a run of a few tokens (decode, verification: the keys read
// in place, vec::scores_strided), for every dtype and head shape (groups of 2, 8 and 3 query heads
// per KV head: runs of 1-3 tokens have 2-24 rows, on either side of kInPlaceRows). After 2,500
// cached tokens the keys are two parts (vec::kKeyPart), merged in one thread for the prefill tile
// and, with one KV head (one work item, two threads), computed on two threads for a short run.
TEST_F(CpuAttentionTest, ATokensOutputIsTheSameBitsInAPrefillTileAndInAShortRun) {
  for (const Shape& sh : kShapes)
  for (const int past : {300, 2500}) {
    const int n = 40;
    Inputs in = make_inputs(sh, {{past, n}});
    const int64_t row = int64_t(sh.nh) * sh.hd * (sh.gate ? 2 : 1) + 2LL * sh.nkv * sh.hd;
    const int64_t width = int64_t(sh.nh) * sh.hd;
    for (DType dt : kDtypes) {
      const float ks = 0.37f, vs = 2.5f;
      const std::vector<uint8_t> k0 = make_cache(dt, in.past_k, ks), v0 = make_cache(dt, in.past_v, vs);
      std::vector<uint8_t> k = k0, v = v0;
      const std::vector<float> whole = run(in, dt, k, v, ks, vs);
      k = k0;
      v = v0;
      for (int t0 = 0, len = 1; t0 < n; t0 += len, len = len % 3 + 1) {
        const int m = std::min(len, n - t0);
        Inputs part = in;  // the same sequence and blocks, tokens [t0, t0 + m)
        Batch& b = part.batch;
        b.positions.assign(m, 0);
        for (int j = 0; j < m; ++j) b.positions[j] = past + t0 + j;
        b.seq_start = {0, m};
        b.context_len = {past + t0 + m};
        b.tok_seq.assign(m, 0);
        BatchMeta& mt = b.meta;
        mt.n_tokens = m;
        mt.max_seq_tokens = m;
        mt.max_context = past + t0 + m;
        mt.positions = b.positions.data();
        mt.seq_start = b.seq_start.data();
        mt.context_len = b.context_len.data();
        mt.block_table = b.block_table.data();
        mt.state_slot = b.slots.data();
        part.qkv.assign(in.qkv.begin() + t0 * row, in.qkv.begin() + (t0 + m) * row);
        const std::vector<float> out = run(part, dt, k, v, ks, vs);
        ASSERT_EQ(std::memcmp(out.data(), whole.data() + t0 * width, out.size() * sizeof(float)), 0)
            << dtype_name(dt) << " hd=" << sh.hd << " group " << sh.nh / sh.nkv << " past " << past << ": tokens [" << t0 << ", "
            << t0 + m << ") differ from the same tokens in one prefill tile";
      }
    }
  }
}

// The in-place score kernels (vec::scores_strided and the AVX2 / AVX-512 ones, where the CPU runs
// the matching clones) against vec::scores_block on the same keys transposed, bit for bit: 1-8
// query rows, 1-32 keys with a row stride past hd, head dims the kernels take.
TEST(CpuAttentionScores, InPlaceKernelsGiveTheBlockedSums) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  struct Kernel {
    const char* name;
    bool usable;
    int hd_multiple;
    void (*fn)(const float*, int, const float*, int64_t, int, int, float, float*, int64_t);
  };
  const Kernel kernels[] = {
      {"portable", true, 1,
       [](const float* q, int rows, const float* k, int64_t ldk, int n, int hd, float scale, float* s, int64_t) {
         vec::scores_strided(q, rows, k, ldk, n, hd, scale, s);
       }},
#if defined(__x86_64__)
      {"avx2", __builtin_cpu_supports("x86-64-v3") != 0, 8, cpu::scores_in_place_avx2},
      {"avx512", __builtin_cpu_supports("x86-64-v4") != 0, 16, cpu::scores_in_place_avx512},
#endif
  };
  constexpr int NK = vec::kKeyBlock;
  int checked = 0;
  for (const Kernel& kn : kernels) {
    if (!kn.usable) {
      std::printf("[  SKIPPED ] %s: not this CPU's\n", kn.name);
      continue;
    }
    for (int hd : {8, 16, 24, 64, 128, 256}) {
      if (hd % kn.hd_multiple != 0) continue;
      for (int rows = 1; rows <= 8; ++rows)
        for (int n : {1, 5, 8, 15, 16, 17, 31, 32}) {
          const int64_t ldk = hd + 5;
          std::vector<float> q(static_cast<size_t>(rows) * hd), k(static_cast<size_t>(n) * ldk), kt(static_cast<size_t>(hd) * NK, 0.f);
          for (auto& x : q) x = d(rng);
          for (auto& x : k) x = d(rng);
          for (int j = 0; j < n; ++j)
            for (int e = 0; e < hd; ++e) kt[static_cast<size_t>(e) * NK + j] = k[static_cast<size_t>(j) * ldk + e];
          std::vector<float> want(static_cast<size_t>(rows) * NK), got(want.size(), NAN);
          vec::scores_block(q.data(), rows, kt.data(), hd, 0.125f, want.data());
          kn.fn(q.data(), rows, k.data(), ldk, n, hd, 0.125f, got.data(), NK);
          for (int r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(&got[static_cast<size_t>(r) * NK], &want[static_cast<size_t>(r) * NK], n * sizeof(float)), 0)
                << kn.name << ": hd " << hd << ", " << rows << " rows, " << n << " keys: row " << r << " differs";
          ++checked;
        }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST_F(CpuAttentionTest, QuantizedCachesStayWithinTheirRoundoffOfTheF32Cache) {
  for (const Shape& sh : kShapes) {
    for (const auto& seqs : kBatches) {
      Inputs in = make_inputs(sh, seqs);
      std::vector<uint8_t> k32 = make_cache(DType::F32, in.past_k, 1.f), v32 = make_cache(DType::F32, in.past_v, 1.f);
      const auto ref = run(in, DType::F32, k32, v32, 1.f, 1.f);
      for (DType dt : {DType::BF16, DType::F8E4M3, DType::F8E5M2}) {
        // fp8 with a scale that maps the values' range (|x| <= 2 here, ~6 for keys after the norm)
        // onto the format's: checkpoint-style scales are amax / 448 for e4m3.
        for (float ks : {1.f, 0.02f}) {
          std::vector<uint8_t> k = make_cache(dt, in.past_k, ks), v = make_cache(dt, in.past_v, ks);
          const double e = rel_err(run(in, dt, k, v, ks, ks), ref);
          const double u = unit_roundoff(dt);
          const std::string what = std::string(dtype_name(dt)) + " scale " + std::to_string(ks) + " hd=" +
                                   std::to_string(sh.hd) + " T=" + std::to_string(in.batch.meta.n_tokens);
          std::printf("[ quantized KV ] %s: rel err %.3g = %.2f u\n", what.c_str(), e, e / u);
          EXPECT_LE(e, kQuantTol * u) << what;
          EXPECT_GT(e, 0.0) << what << ": identical to the f32 cache, is the dtype in effect?";
        }
      }
    }
  }
}

}  // namespace
}  // namespace deltaserve
