// Gated attention over the paged KV cache on CUDA. Reference: backend/cpu/cpu_attention.cpp.
//
// Kernel 1 (one block per token, or per (token, 4 heads) for few tokens): per-head RMSNorm of q and k, partial RoPE (rotate-half, inv_freq
//   computed on the host exactly as the CPU does), q -> scratch, k and v -> the paged cache.
// Kernel 2 (one block per (token, kv head); one warp per query head of the GQA group): causal
//   attention with an online softmax over key tiles of 32 staged in shared memory (each lane
//   scores one key of the tile, then every lane accumulates its head_dim/32 output dims),
//   then the sigmoid output gate.
// Prefill batches (a sequence of >= 64 tokens) use the tensor-core kernel of
// cuda_flash_attention.cu instead of kernel 2; kernel 1 then also writes fp16 q / k and bf16 v.
// Split-KV (decode kernels; a flash launch with a.n_split > 1): attn_combine_kernel merges the
// splits' partials.
//
// KV cache dtypes (AttnArgs::kv_type): both kernels are templates on it. Kernel 1 stores
// convert(x * inv_scale); kernel 2 stages key / value tiles as f32 (16-byte loads: 4 f32, 8 bf16
// or 16 fp8 elements), k_scale folded into the softmax scale and v_scale into the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_qk_prep.cuh"

namespace deltaserve::cuda {

namespace {

constexpr int kTile = 32;

__device__ __forceinline__ int seq_of(const int32_t* seq_start, int n_seqs, int t) {
  int lo = 0, hi = n_seqs - 1;  // largest s with seq_start[s] <= t
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (seq_start[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Dynamic shared memory: per warp, head_dim floats.
template <KvType KV>
__global__ void qk_prep_kernel(AttnArgs a) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();
  using St = KvStorage<KV>;
  extern __shared__ float sm[];
  const int t = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int head0 = blockIdx.y * nw;  // this block's heads: head0 + warp, + nw * gridDim.y, ...
  const int head_stride = nw * gridDim.y;
  const int hd = a.head_dim, nh = a.n_heads, nkv = a.n_kv_heads;
  const int q_width = a.output_gate ? 2 * hd : hd;
  const int64_t q_cols = int64_t(nh) * q_width, kv_cols = int64_t(nkv) * hd;
  const int64_t row = q_cols + 2 * kv_cols;
  const int s = seq_of(a.seq_start, a.n_seqs, t);
  const int32_t pos = a.positions[t];
  const int32_t block = a.block_table[int64_t(s) * a.max_blocks + pos / a.block_size];
  const int64_t cache_base = (int64_t(block) * a.block_size + pos % a.block_size) * nkv;
  float* buf = sm + warp * hd;
  const float* r = a.qkv + int64_t(t) * row;
  const int half = a.rotary_dim / 2;
  for (int hh = head0 + warp; hh < nh + nkv; hh += head_stride) {
    const bool is_q = hh < nh;
    const int kvh = hh - nh;
    if (!is_q && block < 0) continue;
    const float* src = is_q ? r + int64_t(hh) * q_width : r + q_cols + int64_t(kvh) * hd;
    // Flash path: q only as fp16 (q16, no q_scratch); k also as fp16 (of the value the cache holds).
    float* dst = is_q && a.q_scratch ? a.q_scratch + (int64_t(t) * nh + hh) * hd : nullptr;
    St* kdst = is_q ? nullptr : static_cast<St*>(a.k_cache) + (cache_base + kvh) * hd;
    __half* dst16 = is_q ? (a.q16 ? reinterpret_cast<__half*>(a.q16) + (int64_t(t) * nh + hh) * hd : nullptr)
                         : (a.k16 ? reinterpret_cast<__half*>(a.k16) + (int64_t(t) * nkv + kvh) * hd : nullptr);
    const float* w = is_q ? a.q_norm : a.k_norm;
    norm_rope_row(src, w, hd, half, a.inv_freq, pos, a.eps, buf, lane, [&](int d, float o) {
      if (is_q) {
        if (dst) dst[d] = o;
        if (dst16) dst16[d] = __float2half_rn(o);
      } else {
        const St st = kv_encode<KV>(o * a.k_inv_scale);
        kdst[d] = st;
        if (dst16) dst16[d] = __float2half_rn(kv_decode<KV>(st) * a.k_scale);
      }
    });
    if (!is_q) {
      const float* vs = r + q_cols + kv_cols + int64_t(kvh) * hd;
      St* vd = static_cast<St*>(a.v_cache) + (cache_base + kvh) * hd;
      __nv_bfloat16* vd16 = a.v16 ? reinterpret_cast<__nv_bfloat16*>(a.v16) + (int64_t(t) * nkv + kvh) * hd : nullptr;
      for (int d = lane; d < hd; d += 32) {
        const St st = kv_encode<KV>(vs[d] * a.v_inv_scale);
        vd[d] = st;
        if (vd16) vd16[d] = __float2bfloat16_rn(kv_decode<KV>(st) * a.v_scale);
      }
    }
  }
}

// Shared memory: K tile [kTile][HD + 4] | V tile [kTile][HD] | q [G][HD] (f32, whatever the cache
// dtype: tiles are widened while staged).
template <int HD, KvType KV>
__global__ void attn_kernel(AttnArgs a) {
  extern __shared__ float sm[];
  using St = KvStorage<KV>;
  constexpr int KS = HD + 4;  // padded K row: lane j's float4 reads hit distinct banks
  constexpr int NI = (HD + 31) / 32;  // output dims per lane (lanes >= HD idle when HD < 32)
  constexpr int EPC = kv_per_chunk<KV>();  // elements per 16-byte load
  constexpr int CPR = HD / EPC;            // 16-byte chunks per cache row
  float* Ks = sm;
  float* Vs = Ks + kTile * KS;
  float* Qs = Vs + kTile * HD;
  const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nh = a.n_heads, nkv = a.n_kv_heads, G = nh / nkv;
  const int h = kvh * G + warp;
  const int s = seq_of(a.seq_start, a.n_seqs, t);
  const int n_keys = a.positions[t] + 1;
  // This block's key range: whole tiles, split evenly (a split may get none).
  const int n_tiles = (n_keys + kTile - 1) / kTile;
  const int per_split = (n_tiles + a.n_split - 1) / a.n_split;
  const int j_begin = split * per_split * kTile;
  const int n_ctx = min(n_keys, (split + 1) * per_split * kTile);
  const int32_t* bt = a.block_table + int64_t(s) * a.max_blocks;
  const int bs = a.block_size;
  const St* k_cache = static_cast<const St*>(a.k_cache);
  const St* v_cache = static_cast<const St*>(a.v_cache);
  const float qk_scale = a.scale * a.k_scale;

  float* q = Qs + warp * HD;
  const float* qsrc = a.q_scratch + (int64_t(t) * nh + h) * HD;
  for (int d = lane; d < HD; d += 32) q[d] = qsrc[d];

  float m = -INFINITY, l = 0.f, o[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) o[i] = 0.f;

  const int nthreads = blockDim.x;
  __syncthreads();  // q written (also when this split has no keys)
  for (int j0 = j_begin; j0 < n_ctx; j0 += kTile) {
    __syncthreads();  // previous tile fully consumed
    const int nk = min(kTile, n_ctx - j0);
    for (int idx = threadIdx.x; idx < nk * CPR; idx += nthreads) {
      const int j = idx / CPR, c = idx % CPR;
      const int pos = j0 + j;
      const int32_t block = bt[pos / bs];
      const int64_t off = ((int64_t(block) * bs + pos % bs) * nkv + kvh) * HD + c * EPC;
      const uint4 kraw = *reinterpret_cast<const uint4*>(k_cache + off);
      const uint4 vraw = *reinterpret_cast<const uint4*>(v_cache + off);
      float kf[EPC], vf[EPC];
      kv_decode_chunk<KV>(kraw, kf);
      kv_decode_chunk<KV>(vraw, vf);
#pragma unroll
      for (int e = 0; e < EPC; e += 4) {
        *reinterpret_cast<float4*>(Ks + j * KS + c * EPC + e) = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
        *reinterpret_cast<float4*>(Vs + j * HD + c * EPC + e) = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
      }
    }
    __syncthreads();
    float sc = -INFINITY;
    if (lane < nk) {
      const float* kr = Ks + lane * KS;
      float acc0 = 0.f, acc1 = 0.f;
#pragma unroll 8
      for (int d = 0; d < HD; d += 8) {
        const float4 k0 = *reinterpret_cast<const float4*>(kr + d);
        const float4 k1 = *reinterpret_cast<const float4*>(kr + d + 4);
        const float4 q0 = *reinterpret_cast<const float4*>(q + d);
        const float4 q1 = *reinterpret_cast<const float4*>(q + d + 4);
        acc0 = fmaf(q0.x, k0.x, acc0); acc0 = fmaf(q0.y, k0.y, acc0);
        acc0 = fmaf(q0.z, k0.z, acc0); acc0 = fmaf(q0.w, k0.w, acc0);
        acc1 = fmaf(q1.x, k1.x, acc1); acc1 = fmaf(q1.y, k1.y, acc1);
        acc1 = fmaf(q1.z, k1.z, acc1); acc1 = fmaf(q1.w, k1.w, acc1);
      }
      sc = (acc0 + acc1) * qk_scale;
    }
    const float m_new = fmaxf(m, warp_max(sc));
    const float p = lane < nk ? expf(sc - m_new) : 0.f;
    const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < NI; ++i) o[i] *= corr;
    for (int j = 0; j < nk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const float* vr = Vs + j * HD + lane;
#pragma unroll
      for (int i = 0; i < NI; ++i)
        if (HD >= 32 || lane < HD) o[i] = fmaf(pj, vr[i * 32], o[i]);
    }
    m = m_new;
  }

  if (a.n_split > 1) {  // partial result; attn_combine_kernel finishes
    const int64_t pi = (int64_t(t) * nh + h) * a.n_split + split;
    if (lane == 0) {
      a.part_ml[pi * 2] = m;
      a.part_ml[pi * 2 + 1] = l;
    }
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int d = lane + 32 * i;
      if (d < HD) a.part_o[pi * HD + d] = o[i] * a.v_scale;
    }
    return;
  }
  const float inv = 1.0f / l * a.v_scale;
  const int q_width = a.output_gate ? 2 * HD : HD;
  const int64_t row = int64_t(nh) * q_width + 2 * int64_t(nkv) * HD;
  float* dst = a.out + int64_t(t) * nh * HD + int64_t(h) * HD;
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d >= HD) break;
    float v = o[i] * inv;
    if (a.output_gate) {
      const float g = a.qkv[int64_t(t) * row + int64_t(h) * q_width + HD + d];
      v *= 1.0f / (1.0f + expf(-g));
    }
    dst[d] = v;
  }
}

// One block of 128 threads per (token, head): out = Σ_s e^(m_s - M) o_s / Σ_s e^(m_s - M) l_s, then the gate.
// The splits' (m, l) are read by all threads at once and reduced over the block; their weights go
// to shared memory (dynamic: n_split floats), so that the sums over splits issue independent loads
// (a thread walking the splits one load at a time took ~14 us per call for 33 splits).
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  __syncthreads();  // red free (an earlier reduction's readers are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < nw; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void attn_combine_kernel(AttnArgs a) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  extern __shared__ float w_s[];  // [n_split]: e^(m_s - M), 0 for an empty split
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim, nh = a.n_heads, ns = a.n_split;
  const int64_t base = (int64_t(t) * nh + h) * ns;
  const int q_width = a.output_gate ? 2 * hd : hd;
  const int64_t row = int64_t(nh) * q_width + 2 * int64_t(a.n_kv_heads) * hd;
  float M = -INFINITY;
  for (int sp = threadIdx.x; sp < ns; sp += blockDim.x) M = fmaxf(M, a.part_ml[(base + sp) * 2]);
  M = block_reduce(M, true, red);
  float L = 0.f;
  for (int sp = threadIdx.x; sp < ns; sp += blockDim.x) {
    const float l = a.part_ml[(base + sp) * 2 + 1];
    const float w = l > 0.f ? expf(a.part_ml[(base + sp) * 2] - M) : 0.f;
    w_s[sp] = w;
    L += w * l;
  }
  L = block_reduce(L, false, red);  // its barriers also publish w_s
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float g = a.output_gate ? a.qkv[int64_t(t) * row + int64_t(h) * q_width + hd + d] : 0.f;
    const float* po = a.part_o + base * hd + d;
    float acc = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < ns; ++sp) acc += w_s[sp] * po[int64_t(sp) * hd];
    float v = acc / L;
    if (a.output_gate) v *= 1.0f / (1.0f + expf(-g));
    a.out[int64_t(t) * nh * hd + int64_t(h) * hd + d] = v;
  }
}

template <int HD, KvType KV>
void run_attn(const AttnArgs& a, cudaStream_t s) {
  const int G = a.n_heads / a.n_kv_heads;
  const size_t smem = (size_t(kTile) * (HD + 4) + size_t(kTile) * HD + size_t(G) * HD) * sizeof(float);
  // Opt in to > 48 KB of dynamic shared memory once per size and device (tensor-parallel ranks
  // launch from several threads, on several devices).
  static std::atomic<size_t> configured[kMaxDevices];
  std::atomic<size_t>& conf = configured[current_device()];
  if (smem > conf.load()) {
    DS_CUDA_CHECK(cudaFuncSetAttribute(attn_kernel<HD, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    conf.store(smem);
  }
  dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_kv_heads),
            static_cast<unsigned>(a.n_split));
  attn_kernel<HD, KV><<<grid, 32 * G, smem, s>>>(a);
  DS_CUDA_LAUNCH_CHECK();
  if (a.n_split > 1) {
    attn_combine_kernel<<<dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_heads)),
                          128, a.n_split * sizeof(float), s>>>(a);
    DS_CUDA_LAUNCH_CHECK();
  }
}

template <KvType KV>
void run_attention(const AttnArgs& a, cudaStream_t s) {
  // Few tokens (decode, verification): a block per (token, 4 heads), so that a single token's 28
  // heads do not queue behind 4 warps; many tokens: a block per token.
  const int warps = 4;
  const int head_blocks = a.n_tokens < 64 ? (a.n_heads + a.n_kv_heads + warps - 1) / warps : 1;
  if (!(a.dec_mma_mt > 0 && a.dec_fused_prep))  // (else the tensor-core decode kernel does its work)
    launch_pdl(a.pdl, qk_prep_kernel<KV>, dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(head_blocks)),
               dim3(32 * warps), warps * a.head_dim * sizeof(float), s, a);
  // The flash (prefill) and split-KV decode kernels; with the context split (a decode batch, or a
  // short prefill chunk on a long context), the combine kernel merges their partials.
  const bool launched = a.flash_tiles > 0 ? (launch_flash_attention(a, s), true)
                        : a.dec_mma_mt > 0 ? (launch_decode_attention_mma(a, s), true)
                                           : a.decode_kernel && launch_decode_attention(a, s);
  if (launched) {
    if (a.n_split > 1)
      launch_pdl(a.pdl || a.pdl_chain, attn_combine_kernel, dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_heads)),
                 dim3(128), a.n_split * sizeof(float), s, a);
    return;
  }
  switch (a.head_dim) {
    case 16: run_attn<16, KV>(a, s); break;
    case 32: run_attn<32, KV>(a, s); break;
    case 64: run_attn<64, KV>(a, s); break;
    case 128: run_attn<128, KV>(a, s); break;
    case 256: run_attn<256, KV>(a, s); break;
    default: cuda_fail("attention", "head_dim must be 16, 32, 64, 128 or 256", __FILE__, __LINE__);
  }
}

}  // namespace

void launch_attention(const AttnArgs& a, cudaStream_t s) {
  if (a.n_tokens == 0) return;
  switch (a.kv_type) {
    case KvType::F32: run_attention<KvType::F32>(a, s); break;
    case KvType::BF16: run_attention<KvType::BF16>(a, s); break;
    case KvType::E4M3: run_attention<KvType::E4M3>(a, s); break;
    case KvType::E5M2: run_attention<KvType::E5M2>(a, s); break;
    default: cuda_fail("attention", "unknown KV cache type", __FILE__, __LINE__);
  }
}

}  // namespace deltaserve::cuda
