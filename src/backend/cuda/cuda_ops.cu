// Small CUDA ops: embedding, RMSNorm, SwiGLU, row gather, f32->bf16, dummy-weight init.
// Reference: backend/cpu/cpu_ops.cpp (same formulas, f32 compute).
#include <cmath>
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_pdl.cuh"
#include "backend/cuda/cuda_launch.h"

namespace deltaserve::cuda {

namespace {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024). Every thread gets the result.
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; ++i) t += red[i];
  return t;
}

__global__ void embed_kernel(const void* table, bool bf16, int64_t first_row, int64_t rows, int64_t vocab,
                             int64_t h, const int32_t* ids, float* out) {
  const int64_t t = blockIdx.x;
  const int64_t full_id = ids[t];
  float* dst = out + t * h;
  if (full_id < 0 || full_id >= vocab) {  // the CPU reference rejects these; poison the row
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = __int_as_float(0x7fc00000);
    return;
  }
  const int64_t id = full_id - first_row;
  if (id < 0 || id >= rows) {  // another rank's row (vocabulary-parallel)
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = 0.f;
    return;
  }
  if (bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(table) + int64_t(id) * h;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = bf16_bits_to_f32(src[i]);
  } else {
    const float* src = static_cast<const float*>(table) + int64_t(id) * h;
    for (int64_t i = threadIdx.x; i < h; i += blockDim.x) dst[i] = src[i];
  }
}

// out is f32, or bf16 (a GEMM's input; the rounding f32_to_bf16_kernel does).
template <class Out>
__global__ void rms_norm_kernel(const float* x, int64_t d, const float* w, float eps, Out* out,
                                int64_t out_stride) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  Out* o = out + int64_t(blockIdx.x) * out_stride;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = xr[i] * inv * w[i];
    if constexpr (sizeof(Out) == 2) o[i] = f32_to_bf16_bits(v);
    else o[i] = v;
  }
}

// The same for rows of at most kNormPerThread * blockDim.x: a thread's elements (i = threadIdx.x +
// k * blockDim.x, in the loop's order) and their weights are loaded at once and stay in registers,
// so a row costs one round of loads instead of three (latency: a decode step runs 129 of these).
constexpr int kNormPerThread = 8;

template <class Out>
__global__ void __launch_bounds__(1024) rms_norm_regs_kernel(const float* x, int64_t d, const float* w, float eps,
                                                             Out* out, int64_t out_stride) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  Out* o = out + int64_t(blockIdx.x) * out_stride;
  float xv[kNormPerThread], wv[kNormPerThread];
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    xv[k] = i < d ? xr[i] : 0.f;
    wv[k] = i < d ? w[i] : 0.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) ss += xv[k] * xv[k];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
#pragma unroll
  for (int k = 0; k < kNormPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    if (i >= d) break;
    const float v = xv[k] * inv * wv[k];
    if constexpr (sizeof(Out) == 2) o[i] = f32_to_bf16_bits(v);
    else o[i] = v;
  }
}

template <class Out>
void launch_rms_norm_to(const float* x, int64_t rows, int64_t d, const float* w, float eps, Out* out,
                        int64_t out_stride, bool pdl, cudaStream_t s) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows));
  if (d <= int64_t(kNormPerThread) * 1024) {
    const int64_t warps = (d + 32 * kNormPerThread - 1) / (32 * kNormPerThread);  // 20 for d = 5120
    const int threads = static_cast<int>(std::clamp<int64_t>(32 * warps, 32, 1024));
    launch_pdl(pdl, rms_norm_regs_kernel<Out>, grid, dim3(threads), 0, s, x, d, w, eps, out, out_stride);
  } else {
    launch_pdl(pdl, rms_norm_kernel<Out>, grid, dim3(512), 0, s, x, d, w, eps, out, out_stride);
  }
}

__device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// Row blockIdx.y, VEC columns per thread from VEC * (blockIdx.x * blockDim.x + threadIdx.x); gu is
// f32 or bf16 (In = uint16_t: gate_up's bf16 output), out f32 or bf16 (the rounding
// f32_to_bf16_kernel does).
template <int VEC, class In, class Out>
__global__ void silu_mul_kernel(const In* gu, int64_t inter, Out* out) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();  // (a GEMV: it starts streaming its weights)
  const int64_t c = VEC * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (c >= inter) return;
  const In* g = gu + int64_t(blockIdx.y) * 2 * inter + c;
  Out* o = out + int64_t(blockIdx.y) * inter + c;
  float gv[VEC], uv[VEC], r[VEC];
  if constexpr (VEC == 4 && sizeof(In) == 4) {
    const float4 g4 = *reinterpret_cast<const float4*>(g), u4 = *reinterpret_cast<const float4*>(g + inter);
    gv[0] = g4.x, gv[1] = g4.y, gv[2] = g4.z, gv[3] = g4.w;
    uv[0] = u4.x, uv[1] = u4.y, uv[2] = u4.z, uv[3] = u4.w;
  } else if constexpr (VEC == 4) {
    const uint2 g4 = *reinterpret_cast<const uint2*>(g), u4 = *reinterpret_cast<const uint2*>(g + inter);
    const uint32_t gw[2] = {g4.x, g4.y}, uw[2] = {u4.x, u4.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      gv[i] = bf16_bits_to_f32(static_cast<uint16_t>(gw[i / 2] >> (16 * (i % 2))));
      uv[i] = bf16_bits_to_f32(static_cast<uint16_t>(uw[i / 2] >> (16 * (i % 2))));
    }
  } else {
    if constexpr (sizeof(In) == 4) gv[0] = g[0], uv[0] = g[inter];
    else gv[0] = bf16_bits_to_f32(g[0]), uv[0] = bf16_bits_to_f32(g[inter]);
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) r[i] = silu_mul1(gv[i], uv[i]);
  if constexpr (sizeof(Out) == 2) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) o[i] = f32_to_bf16_bits(r[i]);
  } else if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(o) = make_float4(r[0], r[1], r[2], r[3]);
  } else {
    o[0] = r[0];
  }
}

template <class In, class Out>
void launch_silu_mul_to(const In* gu, int64_t rows, int64_t inter, Out* out, bool pdl, cudaStream_t s) {
  const bool vec = inter % 4 == 0 && reinterpret_cast<uintptr_t>(gu) % (4 * sizeof(In)) == 0 &&
                   (sizeof(Out) == 2 || reinterpret_cast<uintptr_t>(out) % 16 == 0);
  const int64_t per = vec ? 4 * 256 : 256;
  constexpr int64_t kMaxRows = 65535;  // gridDim.y
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const dim3 grid(static_cast<unsigned>((inter + per - 1) / per), static_cast<unsigned>(std::min(kMaxRows, rows - r0)));
    const In* g = gu + r0 * 2 * inter;
    Out* o = out + r0 * inter;
    if (vec) launch_pdl(pdl, silu_mul_kernel<4, In, Out>, grid, dim3(256), 0, s, g, inter, o);
    else launch_pdl(pdl, silu_mul_kernel<1, In, Out>, grid, dim3(256), 0, s, g, inter, o);
  }
}

constexpr int kGatherChunk = 64;
struct GatherRows {
  int32_t rows[kGatherChunk];
};

__global__ void gather_rows_kernel(const float* src, int64_t d, GatherRows r, float* dst) {
  const float* s = src + int64_t(r.rows[blockIdx.x]) * d;
  float* o = dst + int64_t(blockIdx.x) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = s[i];
}

// Grid (column blocks, rows): each thread one column of one row, the writes coalesced; the index
// is read once per row from L2.
__global__ void gather_columns_kernel(const float* src, int64_t m, const int32_t* index, int64_t w, float fill,
                                      float* dst) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= w) return;
  const int64_t r = blockIdx.y;
  const int32_t j = index[c];
  dst[r * w + c] = j >= 0 ? src[r * m + j] : fill;
}

// Argmax in two passes, so that one row is read by many blocks (one block reading a 248k-float
// row alone took ~100 us): argmax_part_kernel's block (part p, row r) scans its span of the row
// (strictly greater keeps the earliest index), argmax_final_kernel reduces a row's parts. (value,
// index) pairs reduce with ties to the lower index; NaNs are never picked.
__device__ __forceinline__ void better(float& best, int& idx, float v, int i) {
  if (v > best || (v == best && (idx < 0 || (i >= 0 && i < idx)))) {
    best = v;
    idx = i;
  }
}

// (best, idx) of the block into thread 0 (blockDim.x a multiple of 32).
__device__ __forceinline__ void block_argmax(float& best, int& idx) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, best, off);
    const int oi = __shfl_down_sync(0xffffffffu, idx, off);
    better(best, idx, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    best = lane < nw ? sv[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : -1;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_down_sync(0xffffffffu, best, off);
      const int oi = __shfl_down_sync(0xffffffffu, idx, off);
      better(best, idx, ov, oi);
    }
  }
}

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxMaxParts = 256;

// parts: [rows][gridDim.x] (value, index) pairs.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_part_kernel(const float* x, int64_t v, int64_t span,
                                                                     float2* parts) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();
  const int64_t i0 = int64_t(blockIdx.x) * span, i1 = i0 + span < v ? i0 + span : v;
  const float* row = x + int64_t(blockIdx.y) * v;
  float best = -INFINITY;
  int idx = -1;
  int64_t i = i0 + threadIdx.x;
  // Four loads in flight per thread; each thread's indices ascend, so ">" keeps its earliest.
  for (; i + 3 * kArgmaxThreads < i1; i += 4 * kArgmaxThreads) {
    const float a = row[i], b = row[i + kArgmaxThreads];
    const float c = row[i + 2 * kArgmaxThreads], d = row[i + 3 * kArgmaxThreads];
    better(best, idx, a, static_cast<int>(i));
    better(best, idx, b, static_cast<int>(i + kArgmaxThreads));
    better(best, idx, c, static_cast<int>(i + 2 * kArgmaxThreads));
    better(best, idx, d, static_cast<int>(i + 3 * kArgmaxThreads));
  }
  for (; i < i1; i += kArgmaxThreads) better(best, idx, row[i], static_cast<int>(i));
  block_argmax(best, idx);
  if (threadIdx.x == 0) parts[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = make_float2(best, __int_as_float(idx));
}

__global__ void argmax_final_kernel(const float2* parts, int n_parts, int32_t* out) {
  pdl_wait();  // cuda_pdl.cuh: a small kernel waits, then lets the next one launch
  pdl_trigger();
  float best = -INFINITY;
  int idx = -1;
  for (int p = threadIdx.x; p < n_parts; p += blockDim.x) {
    const float2 e = parts[int64_t(blockIdx.x) * n_parts + p];
    better(best, idx, e.x, __float_as_int(e.y));
  }
  block_argmax(best, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx < 0 ? 0 : idx;
}

// Parts per row: ~512 blocks in all, at most kArgmaxMaxParts a row, at least 2,048 columns each.
int argmax_parts(int64_t rows, int64_t v) {
  const int64_t by_rows = std::max<int64_t>(1, 512 / std::max<int64_t>(rows, 1));
  const int64_t by_cols = std::max<int64_t>(1, (v + 2047) / 2048);
  return static_cast<int>(std::min<int64_t>({by_rows, by_cols, kArgmaxMaxParts}));
}

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = f32_to_bf16_bits(x[i]);
}

__global__ void split_bf16x3_kernel(const float* x, int64_t n, uint16_t* parts) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const uint16_t hi = f32_to_bf16_bits(v);
    const float r1 = v - bf16_bits_to_f32(hi);  // exact in f32
    const uint16_t mid = f32_to_bf16_bits(r1);
    const float r2 = r1 - bf16_bits_to_f32(mid);
    parts[i] = hi;
    parts[n + i] = mid;
    parts[2 * n + i] = f32_to_bf16_bits(r2);
  }
}

__global__ void sum_parts3_kernel(const float* p, int64_t n, float* out, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = (p[i] + p[n + i]) + p[2 * n + i];
    out[i] = accumulate ? out[i] + v : v;
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void random_bf16_kernel(uint16_t* w, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix64(seed ^ (uint64_t(i) * 0xd1b54a32d192ed03ull));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    w[i] = f32_to_bf16_bits((2.0f * u - 1.0f) * scale);
  }
}

int grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace

void launch_embed(const void* table, bool table_bf16, int64_t first_row, int64_t rows, int64_t vocab, int64_t h,
                  const int32_t* ids, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  embed_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(table, table_bf16, first_row, rows, vocab, h, ids, out);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* out,
                     int64_t out_stride, bool pdl, cudaStream_t s) {
  launch_rms_norm_to(x, rows, d, w, eps, out, out_stride == 0 ? d : out_stride, pdl, s);
}

void launch_rms_norm_bf16(const float* x, int64_t rows, int64_t d, const float* w, float eps, uint16_t* out,
                          bool pdl, cudaStream_t s) {
  launch_rms_norm_to(x, rows, d, w, eps, out, d, pdl, s);
}

void launch_silu_mul(const float* gu, int64_t rows, int64_t inter, float* out, bool pdl, cudaStream_t s) {
  launch_silu_mul_to(gu, rows, inter, out, pdl, s);
}

void launch_silu_mul_bf16(const float* gu, int64_t rows, int64_t inter, uint16_t* out, bool pdl, cudaStream_t s) {
  launch_silu_mul_to(gu, rows, inter, out, pdl, s);
}

void launch_silu_mul_bf16_in(const uint16_t* gu, int64_t rows, int64_t inter, uint16_t* out, cudaStream_t s) {
  launch_silu_mul_to(gu, rows, inter, out, false, s);
}

void launch_gather_rows(const float* src, int64_t d, const int32_t* rows_host, int n_rows, float* dst,
                        cudaStream_t s) {
  for (int i0 = 0; i0 < n_rows; i0 += kGatherChunk) {
    GatherRows r{};
    const int n = n_rows - i0 < kGatherChunk ? n_rows - i0 : kGatherChunk;
    for (int i = 0; i < n; ++i) r.rows[i] = rows_host[i0 + i];
    gather_rows_kernel<<<n, 256, 0, s>>>(src, d, r, dst + int64_t(i0) * d);
    DS_CUDA_LAUNCH_CHECK();
  }
}

void launch_gather_columns(const float* src, int64_t m, const int32_t* index, int64_t rows, int64_t w, float fill,
                           float* dst, cudaStream_t s) {
  if (rows == 0 || w == 0) return;
  const dim3 grid(static_cast<unsigned>((w + 255) / 256), static_cast<unsigned>(rows));
  gather_columns_kernel<<<grid, 256, 0, s>>>(src, m, index, w, fill, dst);
  DS_CUDA_LAUNCH_CHECK();
}

std::size_t argmax_scratch_bytes(int64_t rows, int64_t v) {
  return static_cast<std::size_t>(rows) * argmax_parts(rows, v) * sizeof(float2);
}

void launch_argmax_rows(const float* x, int64_t rows, int64_t v, int32_t* out, void* scratch, bool pdl,
                        cudaStream_t s) {
  if (rows == 0) return;
  const int parts = argmax_parts(rows, v);
  const int64_t span = (v + parts - 1) / parts;
  float2* p = static_cast<float2*>(scratch);
  launch_pdl(pdl, argmax_part_kernel, dim3(static_cast<unsigned>(parts), static_cast<unsigned>(rows)),
             dim3(kArgmaxThreads), 0, s, x, v, span, p);
  launch_pdl(pdl, argmax_final_kernel, dim3(static_cast<unsigned>(rows)), dim3(parts > 128 ? 256 : 128), 0, s,
             static_cast<const float2*>(p), parts, out);
}

void launch_f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n, out);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_split_bf16x3(const float* x, int64_t n, uint16_t* parts, cudaStream_t s) {
  if (n == 0) return;
  split_bf16x3_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, n, parts);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_sum_parts3(const float* p, int64_t n, float* out, bool accumulate, cudaStream_t s) {
  if (n == 0) return;
  sum_parts3_kernel<<<grid_for(n, 256), 256, 0, s>>>(p, n, out, accumulate);
  DS_CUDA_LAUNCH_CHECK();
}

void launch_random_bf16(uint16_t* w, int64_t n, float scale, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  random_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(w, n, scale, seed);
  DS_CUDA_LAUNCH_CHECK();
}

}  // namespace deltaserve::cuda
