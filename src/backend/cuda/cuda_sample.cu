// Sampling on the device (Kernels::sample_rows): penalties in place, then one block per row picks
// the row's token from its logits [V] without any of them leaving the GPU.
//
// Per row (1024 threads):
//   1. m = max of s = logit * inv_temperature (greedy rows: argmax, lowest id on ties).
//   2. Masses are exp(s - m) in 2^-40 fixed point (u64): sums are exact and independent of the
//      order threads add them, so a seeded request draws the same token every run.
//   3. No top-k / top-p / min-p: inverse CDF over the whole vocabulary in id order (warp ranges).
//   4. Otherwise a window {s >= m - delta} is collected into shared memory (<= kWindow tokens),
//      with delta such that it provably holds the kept set, as the host Sampler's window: top-k
//      needs >= k tokens in it, min-p reaches the min-p floor, top-p (without top-k) needs its
//      mass >= top_p of the whole. delta comes from one pass that counts the row's tokens in bins
//      of m - s (1/kBinScale wide): the first bin edge whose window holds the kept set. A window
//      that then fails the check (more than kWindow tokens within one bin, rounding at an edge)
//      is searched on by widening and bisecting delta. Any window that holds the kept set gives
//      the same kept set, hence the same token. It is sorted (s descending, id ascending), cut by
//      top-k, top-p and min-p, sorted by id, and drawn from by inverse CDF.
//   5. A kept set that cannot fit the window (a flat row's nucleus, top-k past kWindow, thousands
//      of tied logits) is found over the whole row instead (draw_wide): a prefix of the sorted
//      order is {key > K} plus {key == K, id <= I}; K is found a 4-bit digit at a time from the
//      top by counting (top-k) or by mass (top-p) over the row, I by a scan over id ranges,
//      ~22 passes in all. Every row gets a token.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kWindow = 4096;                 // candidates held in shared memory (32 KB)
constexpr int kBins = kThreads;               // step 4's first pass: bins of m - s over [0, kBins / kBinScale)
constexpr float kBinScale = 32.f;             // bins per unit of s (past 32 a token's mass is 0: 2^40 e^-32 < 0.5)
constexpr float kFixed = 1099511627776.f;    // 2^40: mass units
constexpr unsigned kFull = 0xffffffffu;

// Layouts of deltaserve::SampleRow / PenaltyEntry (backend/kernels.h; sizes checked there).
struct Row {
  float inv_temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float u;
  int32_t reserved;
};
struct Penalty {
  int32_t row, token;
  float rep, sub;
};

// Float -> unsigned key with the same order (larger float, larger key); and back.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ uint64_t mass_of(float s, float m) { return __float2ull_rn(expf(s - m) * kFixed); }

// f(i, v, n) over the row in pieces of four tokens: v holds x[i .. i + n - 1] (n <= 4; the rest
// -inf). Each thread of the block calls f equally often (n = 0 past the row), so f may use warp
// votes. 16-byte loads where the row allows them, else four scalar ones.
template <typename F>
__device__ __forceinline__ void for_each_logit4(const float* x, int V, F f) {
  const int n4 = (V + 3) / 4;
  const bool vec = (V & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
#pragma unroll 2
  for (int j0 = 0; j0 < n4; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x, i = 4 * j;
    const int n = j < n4 ? min(4, V - i) : 0;
    float4 v = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    if (vec && n == 4) {
      v = reinterpret_cast<const float4*>(x)[j];
    } else if (n > 0) {
      v.x = x[i];
      if (n > 1) v.y = x[i + 1];
      if (n > 2) v.z = x[i + 2];
      if (n > 3) v.w = x[i + 3];
    }
    f(i, v, n);
  }
}
__device__ __forceinline__ float lane_of(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

constexpr int kDigitBits = 4, kDigits = 1 << kDigitBits;  // wide_cut's radix

struct Shared {
  union {
    uint64_t cand[kWindow];  // (order_key(s) << 32) | ~id, later (id << 32) | order_key(s)
    struct {                 // step 4's bins (before the window is collected)
      uint64_t mass[kBins];
      uint32_t count[kBins];
    } bin;
  };
  uint64_t red64[kWarps];
  uint64_t digit[kDigits][kWarps];  // per-warp sums of each digit (the radix search)
  float redf[kWarps];
  int redi[kWarps];
  int count;
  int keep;
  uint64_t u64_a;
};

// op over every thread's v (red: kWarps slots of shared memory).
template <typename T, typename Op>
__device__ T block_reduce(T v, T* red, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kWarps; ++w) v = op(v, red[w]);
  return v;
}
__device__ float block_max(float v, Shared& sh) {
  return block_reduce(v, sh.redf, [](float a, float b) { return fmaxf(a, b); });
}
__device__ int block_min_int(int v, Shared& sh) {
  return block_reduce(v, sh.redi, [](int a, int b) { return min(a, b); });
}

__device__ uint64_t warp_inclusive_sum(uint64_t v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Exclusive prefix of v over threads in order; *total gets the sum.
__device__ uint64_t block_exclusive_sum(uint64_t v, Shared& sh, uint64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint64_t incl = warp_inclusive_sum(v);
  __syncthreads();
  if (lane == 31) sh.red64[warp] = incl;
  __syncthreads();
  uint64_t before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.red64[w];
    all += sh.red64[w];
  }
  *total = all;
  return before + incl - v;
}

__device__ uint64_t block_sum(uint64_t v, Shared& sh) {
  uint64_t total;
  block_exclusive_sum(v, sh, &total);
  return total;
}

// In-place bitonic sort of n (a power of two <= kWindow) keys; descending or ascending.
template <bool kDescending>
__device__ void bitonic_sort(uint64_t* a, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const bool up = (i & size) == 0;
        const uint64_t x = a[i], y = a[j];
        if ((x > y) == (up != kDescending) && x != y) {
          a[i] = y;
          a[j] = x;
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Inverse CDF in id order over the tokens `kept(i, s)` admits (s = x[i] * it), the rest massless.
// Each warp owns a contiguous range; lanes read 32 consecutive tokens at a time.
template <typename Kept>
__device__ int draw_in_id_order(const float* x, int V, float it, float m, float u, Kept kept, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int span = ((V + kWarps * 32 - 1) / (kWarps * 32)) * 32;
  const int b = warp * span, e = min(V, b + span);
  auto mass_at = [&](int i) {
    const float s = x[i] * it;
    return kept(i, s) ? mass_of(s, m) : uint64_t(0);
  };
  uint64_t mine = 0;
  for (int i = b + lane; i < e; i += 32) mine += mass_at(i);
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(kFull, mine, o);
  __syncthreads();
  if (lane == 0) sh.red64[warp] = mine;
  if (threadIdx.x == 0) sh.count = -1;
  __syncthreads();
  uint64_t total = 0, before = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.red64[w];
    total += sh.red64[w];
  }
  const uint64_t target = static_cast<uint64_t>(double(u) * double(total));
  if (target >= before && target < before + sh.red64[warp]) {
    uint64_t base = before;
    for (int i0 = b; i0 < e; i0 += 32) {
      const int i = i0 + lane;
      const uint64_t q = i < e ? mass_at(i) : 0;
      const uint64_t incl = warp_inclusive_sum(q);
      const unsigned hit = __ballot_sync(kFull, base + incl > target && q > 0);
      if (hit) {
        if (lane == __ffs(hit) - 1) sh.count = i;
        break;
      }
      base += __shfl_sync(kFull, incl, 31);
    }
  }
  __syncthreads();
  if (sh.count >= 0) return sh.count;
  // Rounding left the target past the last mass: the last kept token with a mass.
  int last = -1;
  for (int i = threadIdx.x; i < V; i += kThreads)
    if (mass_at(i) > 0) last = i;
  return -block_min_int(-last, sh);
}

__device__ int draw_all(const float* x, int V, float it, float m, float u, Shared& sh) {
  return draw_in_id_order(x, V, it, m, u, [](int, float) { return true; }, sh);
}

// A prefix of the order (s descending, id ascending): the tokens with key > key, and those with
// key == key and id <= id (key = order_key(s)).
struct Cut {
  uint32_t key;
  int id;
};
__device__ __forceinline__ bool within(uint32_t key, int i, Cut c) { return key > c.key || (key == c.key && i <= c.id); }
// The shorter of two prefixes.
__device__ __forceinline__ Cut shorter(Cut a, Cut b) {
  if (a.key != b.key) return a.key > b.key ? a : b;
  return a.id < b.id ? a : b;
}

// Count (kMass: mass) of the prefix c over the row, in every thread.
template <bool kMass>
__device__ uint64_t tally(const float* x, int V, float it, float m, Cut c, Shared& sh) {
  uint64_t mine = 0;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float s = x[i] * it;
    if (within(order_key(s), i, c)) mine += kMass ? mass_of(s, m) : uint64_t(1);
  }
  return block_sum(mine, sh);
}

// The largest key K whose {key >= K} holds `need` (kMass: mass, else a count; reachable), a
// kDigitBits digit at a time from the top: a pass sums each next digit's tokens among those whose
// higher digits are K's so far. *above gets what {key > K} holds.
template <bool kMass>
__device__ uint32_t largest_key_holding(const float* x, int V, float it, float m, uint64_t need, Shared& sh,
                                        uint64_t* above_out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0;
  uint64_t above = 0;  // held by keys above the range of the digits found so far
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint32_t high = shift + kDigitBits >= 32 ? 0u : ~0u << (shift + kDigitBits);
    uint64_t c[kDigits];
#pragma unroll
    for (int d = 0; d < kDigits; ++d) c[d] = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const float s = x[i] * it;
      const uint32_t k = order_key(s);
      if ((k & high) != prefix) continue;
      const uint32_t dig = (k >> shift) & (kDigits - 1);
      const uint64_t w = kMass ? mass_of(s, m) : 1;
#pragma unroll
      for (int d = 0; d < kDigits; ++d) c[d] += dig == uint32_t(d) ? w : 0;
    }
#pragma unroll
    for (int d = 0; d < kDigits; ++d)
      for (int o = 16; o > 0; o >>= 1) c[d] += __shfl_xor_sync(kFull, c[d], o);
    __syncthreads();  // the last pass's readers are done
    if (lane == 0)
#pragma unroll
      for (int d = 0; d < kDigits; ++d) sh.digit[d][warp] = c[d];
    __syncthreads();
    if (warp == 0) {  // lane d < kDigits: digit d's total; lane 0 takes the digits from the top
      uint64_t t = 0;
      if (lane < kDigits)
        for (int w = 0; w < kWarps; ++w) t += sh.digit[lane][w];
      uint64_t acc = above;
      int found = 0;
      for (int d = kDigits - 1; d >= 0; --d) {
        const uint64_t td = __shfl_sync(kFull, t, d);
        if (acc + td >= need) {
          found = d;
          break;
        }
        acc += td;
      }
      if (lane == 0) {
        sh.count = found;
        sh.u64_a = acc;
      }
    }
    __syncthreads();
    prefix |= uint32_t(sh.count) << shift;
    above = sh.u64_a;
  }
  *above_out = above;
  return prefix;
}

// The id of the n-th token (n >= 1, in id order) whose key is K: each thread counts a range of
// ids, a block scan finds the range holding it, whose thread walks it.
__device__ int nth_id_at_key(const float* x, int V, float it, uint32_t K, uint64_t n, Shared& sh) {
  const int span = (V + kThreads - 1) / kThreads;
  const int b = min(V, int(threadIdx.x) * span), e = min(V, b + span);
  uint64_t mine = 0;
  for (int i = b; i < e; ++i) mine += order_key(x[i] * it) == K;
  uint64_t total;
  const uint64_t before = block_exclusive_sum(mine, sh, &total);
  if (threadIdx.x == 0) sh.count = V - 1;  // (n > total cannot happen)
  __syncthreads();
  if (before < n && before + mine >= n) {
    uint64_t c = before;
    for (int i = b; i < e; ++i)
      if (order_key(x[i] * it) == K && ++c == n) {
        sh.count = i;
        break;
      }
  }
  __syncthreads();
  const int id = sh.count;
  __syncthreads();  // before sh.count is reused
  return id;
}

// The shortest prefix holding at least `need` tokens (kMass: at least `need` mass), need >= 1 and
// reachable: the largest key K whose {key >= K} holds it, then the smallest id I at K. Tokens at K
// all have the same mass q: as many of them, lowest ids first, as the prefix above K leaves missing.
template <bool kMass>
__device__ Cut shortest_prefix(const float* x, int V, float it, float m, uint64_t need, Shared& sh) {
  uint64_t above = 0;
  const uint32_t K = largest_key_holding<kMass>(x, V, it, m, need, sh, &above);
  uint64_t n_at = need - above;
  if (kMass) {
    const uint64_t q = mass_of(key_value(K), m);
    n_at = q > 0 ? (n_at + q - 1) / q : 1;
  }
  return Cut{K, nth_id_at_key(x, V, it, K, n_at, sh)};
}

// Step 5: the kept set over the whole row (top-k k < V or top-p or min-p), and the draw.
__device__ int draw_wide(const float* x, int V, const Row& r, float m, int k, uint64_t z_all, Shared& sh) {
  const float it = r.inv_temperature;
  Cut cut{0, V - 1};  // everything
  uint64_t z = z_all;
  if (k < V) {
    cut = shortest_prefix<false>(x, V, it, m, uint64_t(k), sh);
    z = tally<true>(x, V, it, m, cut, sh);
  }
  if (r.top_p < 1.f) {
    // The shortest prefix whose mass reaches top_p of z: within the top-k prefix, the same as
    // over the whole row and then the shorter of the two.
    const uint64_t target = max(uint64_t(1), static_cast<uint64_t>(ceil(double(r.top_p) * double(z))));
    cut = shorter(cut, shortest_prefix<true>(x, V, it, m, target, sh));
  }
  const float min_p = r.min_p;
  return draw_in_id_order(
      x, V, it, m, r.u,
      [&](int i, float s) { return within(order_key(s), i, cut) && !(min_p > 0.f && expf(s - m) < min_p); }, sh);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const float* logits, int V, const Row* rows,
                                                               int32_t* out) {
  __shared__ Shared sh;
  const Row r = rows[blockIdx.x];
  const float* x = logits + int64_t(blockIdx.x) * V;
  const int lane = threadIdx.x & 31, tid = threadIdx.x;

  if (r.inv_temperature == 0.f) {  // greedy: the first index of the largest logit
    float best = -INFINITY;
    for (int i = tid; i < V; i += kThreads) best = fmaxf(best, x[i]);
    best = block_max(best, sh);
    int first = V;
    for (int i = tid; i < V; i += kThreads)
      if (x[i] == best) {
        first = i;
        break;
      }
    first = block_min_int(first, sh);
    if (tid == 0) out[blockIdx.x] = first < V ? first : 0;
    return;
  }
  const float it = r.inv_temperature;
  float m = -INFINITY;
  for_each_logit4(x, V, [&](int, float4 v, int) {  // (-inf past the row)
    m = fmaxf(m, fmaxf(fmaxf(v.x * it, v.y * it), fmaxf(v.z * it, v.w * it)));
  });
  m = block_max(m, sh);
  const int k = r.top_k > 0 && r.top_k < V ? r.top_k : V;
  if (k == V && !(r.top_p < 1.f) && !(r.min_p > 0.f)) {
    const int tok = draw_all(x, V, it, m, r.u, sh);
    if (tid == 0) out[blockIdx.x] = tok;
    return;
  }
  // The whole vocabulary's mass: top-p's normaliser when top-k keeps everything.
  uint64_t z_all = 0;
  if (k == V) {
    uint64_t mine = 0;
    for (int i = tid; i < V; i += kThreads) mine += mass_of(x[i] * it, m);
    z_all = block_sum(mine, sh);
  }
  const uint64_t p_target_all = static_cast<uint64_t>(ceil(double(r.top_p) * double(z_all)));

  // The window: the smallest delta found (widening by 4x, then bisecting) whose window holds the
  // kept set and fits in shared memory. It holds the kept set when it has >= k tokens (top-k), or
  // reaches the min-p floor (unless top-p over a top-k set needs that set's mass), or (top-p
  // without top-k) its mass reaches top_p of the whole.
  const float dmin = r.min_p > 0.f ? -logf(r.min_p) + 1e-3f : INFINITY;
  // Which windows hold the kept set, given the count, mass and delta of one.
  auto enough_for = [&](int64_t n, uint64_t mass, float d) {
    return n == V || (k < V && n >= k) || (d >= dmin && (k == V || !(r.top_p < 1.f))) ||
           (k == V && r.top_p < 1.f && mass >= p_target_all);
  };
  float delta = 16.f, lo = 0.f, hi = INFINITY;
  {
    // The first delta from the bins of m - s: bin b holds the tokens with b <= (m - s) kBinScale < b + 1.
    const bool need_mass = k == V && r.top_p < 1.f;
    sh.bin.count[tid] = 0;
    sh.bin.mass[tid] = 0;
    __syncthreads();
    for_each_logit4(x, V, [&](int, float4 v, int n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float s = lane_of(v, e) * it;
        const float d = (m - s) * kBinScale;
        if (e < n && d < float(kBins)) {  // (false for NaN and -inf)
          const int b = max(int(d), 0);
          atomicAdd(&sh.bin.count[b], 1u);
          if (need_mass) atomicAdd(reinterpret_cast<unsigned long long*>(&sh.bin.mass[b]),
                                   static_cast<unsigned long long>(mass_of(s, m)));
        }
      }
    });
    __syncthreads();
    // Thread b: the tokens and mass of bins 0..b, i.e. of the window delta = (b + 1) / kBinScale.
    const uint64_t c_b = sh.bin.count[tid], q_b = sh.bin.mass[tid];
    uint64_t n_all, q_all;
    const uint64_t n_upto = block_exclusive_sum(c_b, sh, &n_all) + c_b;
    const uint64_t q_upto = block_exclusive_sum(q_b, sh, &q_all) + q_b;
    if (tid == 0) sh.count = kBins;
    __syncthreads();
    if (enough_for(int64_t(n_upto), q_upto, float(tid + 1) / kBinScale)) atomicMin(&sh.count, tid);
    __syncthreads();
    const int b = sh.count;
    if (b < kBins) {
      if (tid == b) sh.u64_a = n_upto;
      __syncthreads();
      const uint64_t held = sh.u64_a;
      if (held <= uint64_t(kWindow)) {
        delta = float(b + 1) / kBinScale;  // lo stays 0: a failed check widens from here
      } else {  // bin b alone holds too many: bisect inside it
        lo = float(b) / kBinScale;
        hi = float(b + 1) / kBinScale;
        delta = 0.5f * (lo + hi);
      }
    } else {  // no window within the bins' range does: widen from its edge
      lo = float(kBins) / kBinScale;
      delta = 4.f * lo;
    }
    __syncthreads();  // the bins are read; the window below reuses their memory
  }
  int n_w = 0;
  bool ok = false;
  for (int iter = 0; iter < 48 && !ok; ++iter) {
    const float thr = delta == INFINITY ? -INFINITY : m - delta;
    if (tid == 0) sh.count = 0;
    __syncthreads();
    uint64_t wm = 0;
    // Token i (score s) joins the window when `take` (a whole warp calls it together).
    auto offer = [&](int i, float s, bool take) {
      const unsigned mask = __ballot_sync(kFull, take);
      if (!mask) return;
      int base = 0;
      if (lane == 0) base = atomicAdd(&sh.count, __popc(mask));
      base = __shfl_sync(kFull, base, 0);
      if (take) {
        const int pos = base + __popc(mask & ((1u << lane) - 1u));
        if (pos < kWindow) sh.cand[pos] = (uint64_t(order_key(s)) << 32) | uint64_t(~uint32_t(i));
        wm += mass_of(s, m);
      }
    };
    for_each_logit4(x, V, [&](int i, float4 v, int n) {
      float sc[4];
      bool t[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[e] = lane_of(v, e) * it;
        t[e] = e < n && sc[e] >= thr;
      }
      if (!__any_sync(kFull, t[0] || t[1] || t[2] || t[3])) return;
#pragma unroll
      for (int e = 0; e < 4; ++e) offer(i + e, sc[e], t[e]);
    });
    const uint64_t w_mass = block_sum(wm, sh);  // (syncs: sh.count is final)
    n_w = sh.count;
    // Reaching the min-p floor is enough unless top-p needs the mass of a top-k set larger than
    // the window (its normaliser).
    const bool enough = enough_for(n_w, w_mass, delta);
    if (enough && n_w <= kWindow) {
      ok = true;
    } else if (enough) {  // too many: narrow
      hi = delta;
      delta = 0.5f * (lo + hi);
      if (!(hi - lo > 1e-6f * hi)) break;
    } else {
      lo = delta;
      delta = hi == INFINITY ? (delta > 1e4f ? INFINITY : delta * 4.f) : 0.5f * (lo + hi);
    }
    __syncthreads();
  }
  if (!ok) {  // the kept set does not fit the window
    const int tok = draw_wide(x, V, r, m, k, z_all, sh);
    if (tid == 0) out[blockIdx.x] = tok;
    return;
  }
  // Sort the window: s descending, id ascending.
  const int n_pad = pow2_at_least(n_w);
  for (int j = n_w + tid; j < n_pad; j += kThreads) sh.cand[j] = 0;
  __syncthreads();
  bitonic_sort<true>(sh.cand, n_pad);
  const int nk = min(k, n_w);
  // Cumulative masses over the sorted window: thread t holds entries 4t .. 4t + 3.
  constexpr int kPer = kWindow / kThreads;
  uint64_t q[kPer], mine = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int j = tid * kPer + e;
    q[e] = j < nk ? mass_of(key_value(uint32_t(sh.cand[j] >> 32)), m) : 0;
    mine += q[e];
  }
  uint64_t z_k;
  uint64_t cum = block_exclusive_sum(mine, sh, &z_k);
  const uint64_t z = k < V ? z_k : z_all;
  if (tid == 0) sh.keep = nk;
  __syncthreads();
  if (r.top_p < 1.f) {
    const uint64_t target = static_cast<uint64_t>(ceil(double(r.top_p) * double(z)));
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int j = tid * kPer + e;
      cum += q[e];
      if (j < nk && cum >= target) {
        atomicMin(&sh.keep, j + 1);
        break;
      }
    }
  }
  if (r.min_p > 0.f) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int j = tid * kPer + e;
      if (j >= 1 && j < nk && expf(key_value(uint32_t(sh.cand[j] >> 32)) - m) < r.min_p) {
        atomicMin(&sh.keep, j);
        break;
      }
    }
  }
  __syncthreads();
  const int keep = sh.keep;
  // The kept prefix by id: (id << 32) | key, ascending.
  const int k_pad = pow2_at_least(keep);
  uint64_t re[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int j = tid * kPer + e;
    re[e] = j < keep ? (uint64_t(~uint32_t(sh.cand[j])) << 32) | (sh.cand[j] >> 32) : ~uint64_t(0);
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int j = tid * kPer + e;
    if (j < k_pad) sh.cand[j] = re[e];
  }
  __syncthreads();
  bitonic_sort<false>(sh.cand, k_pad);
  mine = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int j = tid * kPer + e;
    q[e] = j < keep ? mass_of(key_value(uint32_t(sh.cand[j])), m) : 0;
    mine += q[e];
  }
  uint64_t total;
  cum = block_exclusive_sum(mine, sh, &total);
  const uint64_t target = static_cast<uint64_t>(double(r.u) * double(total));
  if (tid == 0) sh.keep = keep - 1;  // rounding past the end: the last kept token
  __syncthreads();
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int j = tid * kPer + e;
    cum += q[e];
    if (j < keep && cum > target && q[e] > 0) {
      atomicMin(&sh.keep, j);
      break;
    }
  }
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = int32_t(sh.cand[sh.keep] >> 32);
}

__global__ void penalties_kernel(float* logits, int64_t V, const Penalty* p, int n) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n) return;
  float& l = logits[int64_t(p[e].row) * V + p[e].token];
  float v = l;
  if (p[e].rep != 1.f) v = v > 0 ? v / p[e].rep : v * p[e].rep;
  l = v - p[e].sub;
}

}  // namespace

void launch_sample_rows(float* logits, int64_t rows, int64_t v, const void* settings, const void* penalties,
                        int n_penalties, int32_t* out, cudaStream_t s) {
  static_assert(sizeof(Row) == 24 && sizeof(Penalty) == 16, "layouts of backend/kernels.h");
  if (rows == 0) return;
  if (n_penalties > 0) {
    penalties_kernel<<<(n_penalties + 255) / 256, 256, 0, s>>>(logits, v, static_cast<const Penalty*>(penalties),
                                                                n_penalties);
    DS_CUDA_LAUNCH_CHECK();
  }
  sample_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(logits, static_cast<int>(v),
                                                                     static_cast<const Row*>(settings), out);
  DS_CUDA_LAUNCH_CHECK();
}

}  // namespace deltaserve::cuda
