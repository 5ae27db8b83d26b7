// Tensor-core prefill attention by warpgroup MMA (wgmma, sm_90a), for a bf16 KV cache: the same
// work as flash_attn_kernel (cuda_flash_attention.cu), with the operands read by the tensor cores
// straight from shared memory. That kernel's mma.sync reads every K / V fragment through each warp's
// registers (ldmatrix): at head_dim 256 it moves ~14 flops per byte of shared memory and is bound
// by it (~235 TFLOP/s on the H200 at 8k, 73 ms of an 8k prefill of the 27B). wgmma reads a K / V
// tile once per warpgroup of 64 query rows.
//
// One block = (64-token tile of one sequence, KV head, HB query heads of its GQA group); warpgroup
// w (128 threads) owns query head w of the block: 64 rows x head_dim of O in registers (f32).
// Every key, of this step or of earlier chunks, comes from the paged bf16 cache (qk_prep has
// written this step's keys there): tiles of 64 keys, double-buffered by cp.async. Q (fp16 from
// qk_prep) is rounded to bf16 once into shared memory. Per key tile, each warpgroup:
//   S = Q Kᵀ (64 x 64, head_dim / 16 wgmmas, both operands from shared memory), the causal mask
//   and online softmax on the accumulator fragments (the mma.sync layout, per warp 16 rows), then
//   O += P V (P bf16 from the S fragments as the A operand in registers; V from shared memory,
//   N-major: head_dim is its contiguous dimension).
// Epilogue: O / l, the sigmoid output gate, f32 stores, as flash_attn_kernel. Grid z: the split of
// the context (a.n_split, flash_split_tiles) whose partial the block writes when there are several.
//
// Shared-memory tiles use wgmma's no-swizzle ("interleaved") canonical layout: core matrices of 8
// rows x 16 bytes (128 contiguous bytes); a row's head_dim / 8 core matrices 128 bytes apart; 8-row
// groups head_dim * 16 bytes apart. K (K-major for S) and V (N-major for O) share that layout: only
// the descriptors' leading / stride byte offsets swap.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_flash_tile.cuh"
#include "backend/cuda/cuda_mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS_WGMMA 1
#endif

namespace deltaserve::cuda {

namespace {

// 1 in the code built for sm_90a (the one an sm_90 GPU loads when the build has it), else 0: a
// build for sm_90 without the "a" features has no wgmma.
#ifdef DS_WGMMA
__device__ int wgmma_built = 1;
#else
__device__ int wgmma_built = 0;
#endif

constexpr int kWgRows = 64;  // query rows (tokens of one head) per warpgroup
constexpr int kWgKeys = 64;  // keys per tile

#ifdef DS_WGMMA
// Byte offset of row r's 16-byte chunk c in a tile of HD-wide bf16 rows (the layout above).
template <int HD>
__device__ __forceinline__ uint32_t tile_offset(int r, int c) {
  return uint32_t((r >> 3) * (HD * 16) + c * 128 + (r & 7) * 16);
}

// wgmma shared-memory descriptor, no swizzle: start address, leading / stride byte offsets.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

// The 32 accumulator operands of an m64n64 f32 wgmma: the registers %0-%31 and their constraints.
#define DS_WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DS_WG_D32_OPERANDS(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
  "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Orders the compiler's view of accumulator registers against the asynchronous wgmmas.
template <int N>
__device__ __forceinline__ void wg_fence_regs(float (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
// d (64 x 64 per warpgroup, f32; per thread the mma.sync C layout of 8 n-tiles) (+)= A B, A
// [64 x 16] and B [16 x 64] bf16 from shared memory, both K-major. accumulate 0: d = A B.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[8][4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DS_WG_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : DS_WG_D32_OPERANDS(d)
      : "l"(da), "l"(db), "r"(accumulate));
}
// d += A B, A [64 x 16] bf16 in registers (the mma.sync A fragment of each warp's 16 rows), B
// [16 x 64] bf16 from shared memory, N-major.
__device__ __forceinline__ void wgmma_rs_n64_bt(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " DS_WG_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : DS_WG_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif

template <int HD, int HB>
constexpr std::size_t wg_smem_bytes() {
  return std::size_t(4) * kWgKeys * HD * 2 + std::size_t(HB) * kWgRows * HD * 2;  // [2][K, V] | [HB] Q
}

template <int HD, int HB>
__global__ void __launch_bounds__(128 * HB, 1) flash_attn_wgmma_kernel(AttnArgs a) {
#ifdef DS_WGMMA
  constexpr int CH = HD / 8;                          // 16-byte chunks per row
  constexpr uint32_t kTile = kWgKeys * HD * 2;        // bytes of a K or V tile
  constexpr uint32_t kRowGroup = HD * 16;             // bytes between 8-row groups
  constexpr int kThreads = 128 * HB;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t base = smem_u32(smem);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, tig = lane & 3;
  int tile = 0;
  const int s = flash_block_tile(a, blockIdx.x, kWgRows, &tile);
  const int t0 = a.seq_start[s] + tile * kWgRows;
  const int t_last = min(t0 + kWgRows, a.seq_start[s + 1]) - 1;
  const int n_keys = a.positions[t_last] + 1;  // positions ascend within a sequence
  const int nh = a.n_heads, nkv = a.n_kv_heads, G = nh / nkv, groups = G / HB;
  const int kvh = blockIdx.y / groups;
  const int h = kvh * G + (blockIdx.y % groups) * HB + wg;
  const int r0 = 16 * warp + g;  // this thread's rows r0 and r0 + 8 of the warpgroup's 64
  const int qpos0 = a.positions[min(t0 + r0, t_last)];
  const int qpos1 = a.positions[min(t0 + r0 + 8, t_last)];

  // Q rows of head h: fp16 -> bf16 into this warpgroup's tile (zeros past the tile).
  const uint32_t q_base = base + 4 * kTile + uint32_t(wg) * (kWgRows * HD * 2);
  for (int i = tid & 127; i < kWgRows * CH; i += 128) {
    const int r = (i / (8 * CH)) * 8 + (i & 7), c = (i >> 3) % CH, t = t0 + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t <= t_last) {
      const uint4 f = *reinterpret_cast<const uint4*>(a.q16 + (int64_t(t) * nh + h) * HD + c * 8);
      const uint32_t w[4] = {f.x, f.y, f.z, f.w};
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __half2 hv = *reinterpret_cast<const __half2*>(&w[e]);
        o[e] = pack_bf16(__low2float(hv), __high2float(hv));
      }
      v = make_uint4(o[0], o[1], o[2], o[3]);
    }
    *reinterpret_cast<uint4*>(smem + (q_base - base) + tile_offset<HD>(r, c)) = v;
  }

  const int32_t* bt = a.block_table + int64_t(s) * a.max_blocks;
  const int bs = a.block_size;
  const uint16_t* kc = static_cast<const uint16_t*>(a.k_cache);
  const uint16_t* vc = static_cast<const uint16_t*>(a.v_cache);
  // Start the copy of key tile `it` into buffer it & 1 (keys past n_keys: zeros, not read).
  auto issue = [&](int it) {
    const int j0 = it * kWgKeys;
    const uint32_t kb = base + uint32_t(it & 1) * 2 * kTile, vb = kb + kTile;
    for (int i = tid; i < kWgKeys * CH; i += kThreads) {
      const int j = (i / (8 * CH)) * 8 + (i & 7), c = (i >> 3) % CH, pos = j0 + j;
      const bool ok = pos < n_keys;
      const int64_t off = ok ? ((int64_t(bt[pos / bs]) * bs + pos % bs) * nkv + kvh) * HD + c * 8 : 0;
      const uint32_t so = tile_offset<HD>(j, c);
      cp_async16(kb + so, kc + off, ok ? 16 : 0);
      cp_async16(vb + so, vc + off, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  FlashRows rows;
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units: exp2f below
  int it_begin = 0, it_end = 0;
  flash_split_tiles(n_keys, kWgKeys, a.n_split, blockIdx.z, a.flash_split_min_tiles, &it_begin, &it_end);

  if (it_begin < it_end) issue(it_begin);
  for (int it = it_begin; it < it_end; ++it) {
    const int j0 = it * kWgKeys;
    const uint32_t kb = base + uint32_t(it & 1) * 2 * kTile, vb = kb + kTile;
    cp_async_wait_all();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy writes -> wgmma reads
    __syncthreads();  // tile it (and Q) landed; every warpgroup is done with tile it - 1
    if (it + 1 < it_end) issue(it + 1);

    // S = Q Kᵀ.
    float sc[8][4];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss_n64(sc, wg_desc(q_base + kk * 256, 128, kRowGroup), wg_desc(kb + kk * 256, 128, kRowGroup), kk > 0);
    wg_commit();
    wg_wait_all();
    wg_fence_regs(sc);

    // Causal mask, online softmax (rows r0, r0 + 8; a row's scores in its quad's lanes).
    flash_softmax_tile(sc, o, rows, j0, tig, qpos0, qpos1, sl2);

    // O += P V: n-tiles 2kk, 2kk + 1 of S are the A fragment of keys 16kk .. 16kk + 15 (packed
    // before the fence: registers an mma reads are written before it).
    uint32_t pa[kWgKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) {
      pa[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
      pa[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
      pa[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      pa[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk)
#pragma unroll
      for (int q = 0; q < HD / 64; ++q)
        wgmma_rs_n64_bt(*reinterpret_cast<float(*)[8][4]>(&o[8 * q]), pa[kk],
                        wg_desc(vb + kk * 2 * kRowGroup + q * 8 * 128, kRowGroup, 128));
    wg_commit();
    wg_wait_all();
    wg_fence_regs(o);
  }

  flash_store_rows<HD>(a, o, rows, t0 + r0, t_last, h, tig, blockIdx.z);
#else
  __trap();  // built without sm_90a: flash_wgmma_plan never picks this kernel
#endif
}

template <int HD, int HB>
void run_wgmma(const AttnArgs& a, cudaStream_t s) {
  constexpr std::size_t smem = wg_smem_bytes<HD, HB>();
  static std::atomic<bool> configured[kMaxDevices];
  if (!configured[current_device()].exchange(true))
    DS_CUDA_CHECK(cudaFuncSetAttribute(flash_attn_wgmma_kernel<HD, HB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  const int groups = (a.n_heads / a.n_kv_heads) / HB;
  const dim3 grid(static_cast<unsigned>(a.flash_tiles), static_cast<unsigned>(a.n_kv_heads * groups),
                  static_cast<unsigned>(a.n_split));
  flash_attn_wgmma_kernel<HD, HB><<<grid, 128 * HB, smem, s>>>(a);
  DS_CUDA_LAUNCH_CHECK();
}

template <int HD>
void run_wgmma_hd(const AttnArgs& a, cudaStream_t s) {
  if (a.flash_hb == 2) run_wgmma<HD, 2>(a, s);
  else run_wgmma<HD, 1>(a, s);
}

}  // namespace

bool flash_wgmma_plan(int n_heads, int n_kv_heads, int head_dim, KvType kv, FlashPlan* plan) {
  if (kv != KvType::BF16 || (head_dim != 64 && head_dim != 128 && head_dim != 256)) return false;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return false;
  if (device_attribute(cudaDevAttrComputeCapabilityMajor, current_device(), 0) != 9) return false;
  static std::atomic<int> built[kMaxDevices];  // 0: unknown, 1: yes, 2: no
  std::atomic<int>& b = built[current_device()];
  if (b.load() == 0) {
    int v = 0;
    const bool ok = cudaMemcpyFromSymbol(&v, wgmma_built, sizeof v) == cudaSuccess;
    (void)cudaGetLastError();
    b.store(ok && v == 1 ? 1 : 2);
  }
  if (b.load() != 1) return false;
  // Two query heads of the group share each K / V tile where the group's size is even (a warpgroup
  // each: 192 KB of shared memory at head_dim 256; more warpgroups would cap registers below what
  // O and S take, and the wgmmas would serialize), else one.
  plan->heads_per_block = (n_heads / n_kv_heads) % 2 == 0 ? 2 : 1;
  plan->m_tiles = kWgRows / 16;
  plan->keys_per_tile = kWgKeys;
  plan->wgmma = true;
  return true;
}

void launch_flash_attention_wgmma(const AttnArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64: run_wgmma_hd<64>(a, s); break;
    case 128: run_wgmma_hd<128>(a, s); break;
    default: run_wgmma_hd<256>(a, s); break;
  }
}

}  // namespace deltaserve::cuda
