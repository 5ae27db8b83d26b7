// Split-KV decode / verification attention over the paged KV cache (flash-decoding) on CUDA cores.
// Reference: backend/cpu/cpu_attention.cpp; the q/k norm + RoPE + cache write ran before
// (cuda_attention.cu, qk_prep_kernel), so q sits in q_scratch [T, nh, HD] (f32).
//
// Grid (token, kv head, split); 4 warps per block. A split is a contiguous key range of the
// token's context; within it, warp w takes the key groups w, w + 4, ... of KB = 4 keys. Each lane
// owns E = HD / 32 consecutive dims of every row: a warp reads a whole K / V row with one
// coalesced load per lane, scores the G query heads of the GQA group at once (q of all G heads in
// registers, partial dots reduced over the warp by butterfly shuffles), and keeps an online
// softmax per head (m, l, o[E] in registers). No shared memory in the key loop: the KV is read
// once per (token, kv head) straight from HBM, KB keys in flight per warp, the next group's block
// id fetched a step ahead. The 4 warps then merge through shared memory, and the block writes
// either the final gated output (n_split = 1) or its partial (max, sum, unnormalised o) for
// cuda_attention.cu's combine kernel.
//
// Graph safety: n_split depends on the batch shape only (decode_attention_splits); each split's
// key range is computed on the device from the token's position, with at least dec_min_keys keys
// per split, so short contexts leave the high splits empty (l = 0, skipped by the combine).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_decode_out.cuh"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kKbMin = 4;  // keys per warp step, at least (the block-size rule below)

__device__ __forceinline__ int seq_of_token(const int32_t* seq_start, int n_seqs, int t) {
  int lo = 0, hi = n_seqs - 1;  // largest s with seq_start[s] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (seq_start[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// A lane's slice of a row: E stored elements = NW 32-bit words (E * sizeof(St) a multiple of 4).
template <KvType KV, int E>
constexpr int slice_words() {
  return E * static_cast<int>(sizeof(KvStorage<KV>)) / 4;
}

template <KvType KV, int E>
__device__ __forceinline__ void load_words(const KvStorage<KV>* p, uint32_t (&w)[slice_words<KV, E>()]) {
  constexpr int kWords = slice_words<KV, E>();
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  } else if constexpr (kWords == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x; w[1] = v.y;
  } else {
    static_assert(kWords == 1, "row slice of 4, 8 or 16n bytes");
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  }
}

// KB: keys per warp step (their K / V slices stay in registers as stored words until used).
// MINB: resident blocks per SM the register allocation must allow (1: as many as it likes).
// Static shared memory: the 4 warps' (m, l) [kWarps][G][2] and o [kWarps][G][HD].
template <int HD, int G, KvType KV, int KB, int MINB>
__global__ void __launch_bounds__(32 * kWarps, MINB) decode_attn_kernel(AttnArgs a) {
  pdl_trigger();  // the next kernel (a GEMV) may start streaming its weights
  using St = KvStorage<KV>;
  constexpr int E = HD / 32;
  constexpr int NW = slice_words<KV, E>();
  __shared__ float s_ml[kWarps][G][2];
  __shared__ float s_o[kWarps][G][HD];
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nh = a.n_heads, nkv = a.n_kv_heads, bs = a.block_size;
  const int s = seq_of_token(a.seq_start, a.n_seqs, t);
  const int n_keys = a.positions[t] + 1;
  // This split's keys [j_begin, j_end): whole groups of kWarps * KB keys, >= dec_min_keys each.
  constexpr int kStep = kWarps * KB;
  int per = (n_keys + a.n_split - 1) / a.n_split;
  per = max(per, a.dec_min_keys);
  per = (per + kStep - 1) / kStep * kStep;
  const int j_begin = split * per;
  const int j_end = min(n_keys, j_begin + per);
  const int32_t* bt = a.block_table + int64_t(s) * a.max_blocks;
  const St* kc = static_cast<const St*>(a.k_cache);
  const St* vc = static_cast<const St*>(a.v_cache);
  const int64_t row_stride = int64_t(nkv) * HD;  // elements between consecutive token rows
  const int64_t lane_off = int64_t(kvh) * HD + lane * E;

  // q of the group's G heads, this lane's dims, pre-multiplied by the softmax scale (k_scale folded in).
  const float qk_scale = a.scale * a.k_scale;
  float q[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qs = a.q_scratch + (int64_t(t) * nh + kvh * G + g) * HD + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) q[g][e] = qs[e] * qk_scale;
  }
  float m[G], l[G], o[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[g][e] = 0.f;
  }

  int j = j_begin + warp * KB;
  int32_t blk = j < j_end ? bt[j / bs] : 0;
  for (; j < j_end; j += kStep) {
    const int jn = j + kStep;
    const int32_t blk_next = jn < j_end ? bt[jn / bs] : 0;  // fetched a step ahead
    const int nk = min(KB, j_end - j);
    const int64_t base = (int64_t(blk) * bs + j % bs) * row_stride + lane_off;  // KB keys in one block
    uint32_t kr[KB][NW], vr[KB][NW];
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      if (kb < nk) {
        load_words<KV, E>(kc + base + kb * row_stride, kr[kb]);
        load_words<KV, E>(vc + base + kb * row_stride, vr[kb]);
      } else {
#pragma unroll
        for (int i = 0; i < NW; ++i) kr[kb][i] = vr[kb][i] = 0u;
      }
    }
    float sc[KB][G];  // scores, then probabilities
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      float kf[E];
      kv_decode_words<KV, NW>(kr[kb], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc = fmaf(q[g][e], kf[e], acc);
        sc[kb][g] = acc;
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int kb = 0; kb < KB; ++kb)
#pragma unroll
        for (int g = 0; g < G; ++g) sc[kb][g] += __shfl_xor_sync(0xffffffffu, sc[kb][g], off);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = m[g];
#pragma unroll
      for (int kb = 0; kb < KB; ++kb)
        if (kb < nk) mx = fmaxf(mx, sc[kb][g]);
      const float corr = __expf(m[g] - mx);  // 0 on the first group (m = -inf)
      float psum = 0.f;
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        sc[kb][g] = kb < nk ? __expf(sc[kb][g] - mx) : 0.f;
        psum += sc[kb][g];
      }
      l[g] = l[g] * corr + psum;
      m[g] = mx;
#pragma unroll
      for (int e = 0; e < E; ++e) o[g][e] *= corr;
    }
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      float vf[E];
      kv_decode_words<KV, NW>(vr[kb], vf);
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) o[g][e] = fmaf(sc[kb][g], vf[e], o[g][e]);
    }
    blk = blk_next;
  }

  // Merge the warps: M = max m_w, L = sum e^(m_w - M) l_w, O = sum e^(m_w - M) o_w.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      s_ml[warp][g][0] = m[g];
      s_ml[warp][g][1] = l[g];
    }
#pragma unroll
    for (int e = 0; e < E; ++e) s_o[warp][g][lane * E + e] = o[g][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
    const int g = idx / HD, d = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (s_ml[w][g][1] > 0.f) M = fmaxf(M, s_ml[w][g][0]);
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float lw = s_ml[w][g][1];
      if (lw > 0.f) {
        const float f = __expf(s_ml[w][g][0] - M);
        L += f * lw;
        O += f * s_o[w][g][d];
      }
    }
    write_decode_result<HD>(a, t, kvh * G + g, split, d, M, L, O);
  }
}

template <int HD, int G, KvType KV, int KB, int MINB>
void launch(const AttnArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_kv_heads),
                  static_cast<unsigned>(a.n_split));
  decode_attn_kernel<HD, G, KV, KB, MINB><<<grid, 32 * kWarps, 0, s>>>(a);
  DS_CUDA_LAUNCH_CHECK();
}

template <int HD, int G, KvType KV>
void run(const AttnArgs& a, cudaStream_t s) {
  if constexpr (KV == KvType::BF16 && HD == 256) {  // the 27B's shape: tuning variants (CudaOptions)
    const bool kb8 = a.dec_keys_per_step == 8 && a.block_size % 8 == 0;
    if (kb8 && a.dec_min_blocks >= 2) return launch<HD, G, KV, 8, 2>(a, s);
    if (kb8) return launch<HD, G, KV, 8, 1>(a, s);
    if (a.dec_min_blocks >= 3) return launch<HD, G, KV, 4, 3>(a, s);
  }
  launch<HD, G, KV, kKbMin, 1>(a, s);
}

template <int HD, KvType KV>
bool run_group(const AttnArgs& a, cudaStream_t s) {
  if constexpr ((HD / 32) * sizeof(KvStorage<KV>) % 4 != 0) {
    return false;  // fp8 at head_dim 64: a lane's slice is 2 bytes (decode_attention_supported says no)
  } else {
    switch (a.n_heads / a.n_kv_heads) {
    case 1: run<HD, 1, KV>(a, s); return true;
    case 2: run<HD, 2, KV>(a, s); return true;
    case 4: run<HD, 4, KV>(a, s); return true;
    case 6: run<HD, 6, KV>(a, s); return true;
    case 8: run<HD, 8, KV>(a, s); return true;
    default: return false;
    }
  }
}

template <KvType KV>
bool run_kv(const AttnArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64: return run_group<64, KV>(a, s);
    case 128: return run_group<128, KV>(a, s);
    case 256: return run_group<256, KV>(a, s);
    default: return false;
  }
}

}  // namespace

bool decode_attention_supported(int n_heads, int n_kv_heads, int head_dim, KvType kv, int block_size) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return false;
  const int g = n_heads / n_kv_heads;
  if (g != 1 && g != 2 && g != 4 && g != 6 && g != 8) return false;
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  const int elem = kv == KvType::F32 ? 4 : kv == KvType::BF16 ? 2 : 1;
  if ((head_dim / 32) * elem % 4 != 0) return false;  // a lane's slice: whole 32-bit words
  return block_size > 0 && block_size % kKbMin == 0;    // a warp's step of keys shares one KV block
}

int decode_attention_splits(int n_tokens, int n_kv_heads, const CudaOptions& o) {
  const int64_t blocks = int64_t(n_tokens) * n_kv_heads;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) (void)cudaGetLastError();
  const int64_t target = int64_t(sm_count(dev)) * std::max(1, o.decode_blocks_per_sm);
  if (blocks <= 0 || blocks >= target) return 1;
  const int64_t n = target / blocks;  // rounded down: the grid fits the resident blocks (one wave)
  return static_cast<int>(std::min<int64_t>(n, std::max(1, o.decode_max_splits)));
}

bool launch_decode_attention(const AttnArgs& a, cudaStream_t s) {
  switch (a.kv_type) {
    case KvType::F32: return run_kv<KvType::F32>(a, s);
    case KvType::BF16: return run_kv<KvType::BF16>(a, s);
    case KvType::E4M3: return run_kv<KvType::E4M3>(a, s);
    case KvType::E5M2: return run_kv<KvType::E5M2>(a, s);
  }
  return false;
}

}  // namespace deltaserve::cuda
