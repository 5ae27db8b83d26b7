// Tensor-core prefill attention over the paged KV cache (flash-attention style: online
// softmax, nothing of size context^2 is materialised). Used by launch_attention for batches whose
// sequences have many tokens. qk_prep_kernel (cuda_attention.cu) has already normalised and
// rotated q and k, written this step's k, v into the paged cache (in its dtype) and, for this
// path, also q and (the cached values of) k in fp16 and v in bf16 into per-token scratch
// ([T, nh, hd] and [T, nkv, hd]).
//
// One block = (token tile of one sequence, KV head, group of query heads sharing that KV head).
// Each warp owns 16 query rows: one query head x 16 consecutive tokens; the block has HB heads x
// MT token tiles of 16 (HB*MT <= 8 warps), so one K/V tile in shared memory serves HB query heads
// of the GQA group and 16*MT tokens (for the 27B: 2 heads x 64 tokens = 128 rows per K/V tile;
// the group's 6 heads take 3 blocks).
//
// Per key tile (64 keys; 32 when a sequence continues a cached prefix, so that the f32 staging
// buffer fits), double-buffered, the copy of tile i+1 in flight while tile i is computed:
//   - keys of this step (position >= the sequence's first position in the batch): cp.async of the
//     fp16 K / bf16 V rows from the per-token scratch straight into the tile;
//   - keys of earlier chunks (a chunked prefill continuing a cached prefix): cp.async of the
//     rows from the paged cache (block table per key; f32, bf16 or fp8) into a staging buffer,
//     converted (times the layer's k / v scale) by the whole block at the start of the tile's turn;
//   keys past the block's last query position are zero-filled.
//   Each warp then: S = Q Kᵀ with mma.sync m16n8k16 (fp16 in, f32 accumulate; fp16 rather than
//   bf16 keeps 3 more mantissa bits in the scores: q and k are RMS-normalised, so in range),
//   causal mask from the positions, online softmax in the exp2 domain on the accumulator
//   fragments, P (bf16, straight from the S fragments) · V with mma.sync (bf16 in: V is not
//   normalised, bf16 has f32's range); O (16 x head_dim, f32) stays in registers.
// Epilogue: O / l, the sigmoid output gate, f32 stores.
// Split context (grid z, a.n_split > 1: a chunk of few tiles on a long context): the block scores
// its split's key tiles (flash_split_tiles) and writes a partial; attn_combine_kernel merges them.
//
// Precision: q, k rounded to fp16 (11-bit significand), p and v to bf16 (8-bit); f32 sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kv.cuh"
#include "backend/cuda/cuda_launch.h"
#include "backend/cuda/cuda_flash_tile.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace deltaserve::cuda {

namespace {

constexpr int kMaxWarps = 8;  // per block (O of head_dim 256 takes 128 registers per thread)

// Shared memory: fp16 K and bf16 V tiles of bn keys, two buffers each | fp16 Q | staging of
// earlier chunks' K and V tiles as the cache stores them (stage_elem bytes an element; 0 when no
// sequence continues a cached prefix).
constexpr std::size_t flash_smem_bytes(int hd, int bn, int warps, int stage_elem) {
  return std::size_t(4) * bn * (hd + 8) * 2 + std::size_t(warps) * 16 * (hd + 8) * 2 +
         std::size_t(2) * bn * hd * stage_elem;
}
constexpr int kv_elem_bytes(KvType kv) { return kv == KvType::F32 ? 4 : kv == KvType::BF16 ? 2 : 1; }

// BN keys per tile (64 without staging, 32 with; 16 where shared memory is short: sm_86 at head_dim 256);
// STAGE: some sequence has keys from earlier chunks (read from the paged cache, of type KV).
template <int HD, int BN, bool STAGE, KvType KV>
__global__ void __launch_bounds__(32 * kMaxWarps, 1) flash_attn_kernel(AttnArgs a) {
  using St = KvStorage<KV>;
  constexpr int EPC = kv_per_chunk<KV>();  // cache elements per 16-byte chunk
  constexpr int CPR = HD / EPC;            // 16-byte chunks per cache row
  constexpr int kBN = BN;
  constexpr int LD = HD + 8;      // padded fp16/bf16 row: 16 bytes of skew per row
  constexpr int NT_O = HD / 8;    // n-tiles of O
  constexpr int NT_S = kBN / 8;   // n-tiles of S
  constexpr int C8 = HD / 8;      // 16-byte chunks per fp16/bf16 row
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nthreads = blockDim.x;
  uint16_t* kv_buf = reinterpret_cast<uint16_t*>(smem);                    // [2][K, V][kBN][LD]
  uint16_t* Qs = kv_buf + 4 * kBN * LD;                                    // [warps * 16][LD]
  // [2][kBN][CPR] 16-byte chunks: K, V rows as stored in the cache.
  uint4* stage = reinterpret_cast<uint4*>(Qs + (nthreads >> 5) * 16 * LD);
  const int HB = a.flash_hb, BT = 16 * a.flash_mt;
  const int nh = a.n_heads, nkv = a.n_kv_heads, G = nh / nkv;

  int tile = 0;
  const int s = flash_block_tile(a, blockIdx.x, BT, &tile);
  const int seq_t0 = a.seq_start[s];
  const int pos_first = a.positions[seq_t0];  // keys from here on are this step's (scratch)
  const int t0 = seq_t0 + tile * BT;
  const int t_last = min(t0 + BT, a.seq_start[s + 1]) - 1;
  const int n_keys = a.positions[t_last] + 1;  // positions ascend within a sequence
  const int groups = G / HB;
  const int kvh = blockIdx.y / groups;
  const int h = kvh * G + (blockIdx.y % groups) * HB + warp % HB;
  const int wt0 = t0 + (warp / HB) * 16;  // this warp's first token
  const bool warp_live = wt0 <= t_last;
  const int g = lane >> 2, tig = lane & 3;
  // Query positions of this thread's rows g and g + 8 (rows past the tile reuse the last token).
  const int qpos0 = a.positions[min(wt0 + g, t_last)];
  const int qpos1 = a.positions[min(wt0 + g + 8, t_last)];
  const int warp_max_pos = a.positions[min(wt0 + 15, t_last)];

  // Q rows of this warp (fp16 from qk_prep; zeros past the tile).
  uint16_t* Qw = Qs + warp * 16 * LD;
  for (int i = lane; i < 16 * C8; i += 32) {
    const int r = i / C8, c = i % C8, t = wt0 + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (t <= t_last) v = *reinterpret_cast<const uint4*>(a.q16 + (int64_t(t) * nh + h) * HD + c * 8);
    *reinterpret_cast<uint4*>(Qw + r * LD + c * 8) = v;
  }

  const int32_t* bt = a.block_table + int64_t(s) * a.max_blocks;
  const int bs = a.block_size;
  // Start the copy of key tile `it` (into K/V buffer it & 1, or the staging buffer).
  auto issue = [&](int it) {
    const int j0 = it * kBN;
    if (j0 >= pos_first) {  // this step's keys: fp16/bf16 rows of the scratch
      // Each thread copies one 16-byte column c of rows j, j + jstep, ... (nthreads % C8 == 0).
      const int c = tid % C8, jstep = nthreads / C8;
      int j = tid / C8;
      const int64_t off = (int64_t(seq_t0 + j0 - pos_first + j) * nkv + kvh) * HD + c * 8;
      const int64_t src_step = int64_t(jstep) * nkv * HD;
      const uint16_t* ks = a.k16 + off;
      const uint16_t* vs = a.v16 + off;
      uint32_t kd = smem_u32(kv_buf + (it & 1) * 2 * kBN * LD + j * LD + c * 8);
      const uint32_t dst_step = jstep * LD * 2, v_off = kBN * LD * 2;
      for (; j < kBN; j += jstep) {
        const bool ok = j0 + j < n_keys;  // else zero-fill (the source is not read)
        cp_async16(kd, ok ? ks : a.k16, ok ? 16 : 0);
        cp_async16(kd + v_off, ok ? vs : a.v16, ok ? 16 : 0);
        ks += src_step;
        vs += src_step;
        kd += dst_step;
      }
    } else if constexpr (STAGE) {  // earlier chunks' keys: rows of the paged cache, as stored
      for (int i = tid; i < 2 * kBN * CPR; i += nthreads) {
        const int which = i / (kBN * CPR);
        const int rem = i - which * (kBN * CPR);
        const int j = rem / CPR, c = rem - j * CPR;
        const int pos = j0 + j;
        const St* base = static_cast<const St*>(which ? a.v_cache : a.k_cache);
        const St* src = base;
        int bytes = 0;
        if (pos < n_keys) {
          src = base + ((int64_t(bt[pos / bs]) * bs + pos % bs) * nkv + kvh) * HD + c * EPC;
          bytes = 16;
        }
        cp_async16(smem_u32(stage + i), src, bytes);
      }
    }
    cp_async_commit();
  };

  float o[NT_O][4];
#pragma unroll
  for (int n = 0; n < NT_O; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  FlashRows rows;
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units: exp2f below
  int it_begin = 0, it_end = 0;
  flash_split_tiles(n_keys, kBN, a.n_split, blockIdx.z, a.flash_split_min_tiles * (64 / kBN), &it_begin, &it_end);
  const int mat = lane >> 3, rr = lane & 7;  // ldmatrix: this lane's matrix and row

  if (it_begin < it_end) issue(it_begin);
  for (int it = it_begin; it < it_end; ++it) {
    const int j0 = it * kBN;
    const uint16_t* Ks = kv_buf + (it & 1) * 2 * kBN * LD;
    const uint16_t* Vs = Ks + kBN * LD;
    cp_async_wait_all();
    __syncthreads();  // tile it has landed; every warp is done with tile it - 1
    if (STAGE && j0 < pos_first) {  // staged cache rows -> fp16 K, bf16 V (times the scales)
      for (int i = tid; i < kBN * CPR; i += nthreads) {
        const int j = i / CPR, c = i - j * CPR;
        float k[EPC], v[EPC];
        kv_decode_chunk<KV>(stage[i], k);
        kv_decode_chunk<KV>(stage[kBN * CPR + i], v);
        __half2* kd = reinterpret_cast<__half2*>(const_cast<uint16_t*>(Ks) + j * LD + c * EPC);
        __nv_bfloat162* vd = reinterpret_cast<__nv_bfloat162*>(const_cast<uint16_t*>(Vs) + j * LD + c * EPC);
#pragma unroll
        for (int e = 0; e < EPC / 2; ++e) {
          kd[e] = __floats2half2_rn(k[2 * e] * a.k_scale, k[2 * e + 1] * a.k_scale);
          vd[e] = __floats2bfloat162_rn(v[2 * e] * a.v_scale, v[2 * e + 1] * a.v_scale);
        }
      }
      __syncthreads();  // converted; staging free
    }
    if (it + 1 < it_end) issue(it + 1);
    if (!warp_live || j0 > warp_max_pos) continue;  // every key of the tile is masked for this warp

    // S = Q Kᵀ (16 x kBN per warp).
    float sc[NT_S][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qa[4];
      ldsm_x4(smem_u32(Qw + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8), qa[0], qa[1], qa[2], qa[3]);
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_u32(Ks + (np * 16 + rr + (mat >> 1) * 8) * LD + kk * 16 + (mat & 1) * 8), b0, b1, b2, b3);
        mma_f16(sc[2 * np], qa, b0, b1);
        mma_f16(sc[2 * np + 1], qa, b2, b3);
      }
    }

    // Causal mask, online softmax (rows g and g + 8; a row's scores sit in its 4 quad lanes).
    flash_softmax_tile(sc, o, rows, j0, tig, qpos0, qpos1, sl2);

    // O += P V: the S accumulator fragments of n-tiles 2kk, 2kk+1 are the A fragment of k-step kk.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < HD / 16; ++np) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(smem_u32(Vs + (kk * 16 + rr + (mat & 1) * 8) * LD + np * 16 + (mat >> 1) * 8), b0, b1, b2, b3);
        mma_bf16(o[2 * np], pa, b0, b1);
        mma_bf16(o[2 * np + 1], pa, b2, b3);
      }
    }
  }
  if (!warp_live) return;

  flash_store_rows<HD>(a, o, rows, wt0 + g, t_last, h, tig, blockIdx.z);
}

template <int HD, int BN, bool STAGE, KvType KV = KvType::F32>
void run_flash(const AttnArgs& a, cudaStream_t s) {
  const int warps = a.flash_hb * a.flash_mt;
  const std::size_t smem = flash_smem_bytes(HD, BN, warps, a.flash_stage ? int(sizeof(KvStorage<KV>)) : 0);
  // Opt in to > 48 KB of dynamic shared memory once per size and device.
  static std::atomic<std::size_t> configured[kMaxDevices];
  std::atomic<std::size_t>& conf = configured[current_device()];
  if (smem > conf.load()) {
    DS_CUDA_CHECK(cudaFuncSetAttribute(flash_attn_kernel<HD, BN, STAGE, KV>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    conf.store(smem);
  }
  const int groups = (a.n_heads / a.n_kv_heads) / a.flash_hb;
  dim3 grid(static_cast<unsigned>(a.flash_tiles), static_cast<unsigned>(a.n_kv_heads * groups),
            static_cast<unsigned>(a.n_split));
  flash_attn_kernel<HD, BN, STAGE, KV><<<grid, 32 * warps, smem, s>>>(a);
  DS_CUDA_LAUNCH_CHECK();
}

// Only the staging path reads the cache, so only it has one kernel per KV type.
template <int HD, int BN>
void run_flash_staged(const AttnArgs& a, cudaStream_t s) {
  switch (a.kv_type) {
    case KvType::F32: run_flash<HD, BN, true, KvType::F32>(a, s); break;
    case KvType::BF16: run_flash<HD, BN, true, KvType::BF16>(a, s); break;
    case KvType::E4M3: run_flash<HD, BN, true, KvType::E4M3>(a, s); break;
    case KvType::E5M2: run_flash<HD, BN, true, KvType::E5M2>(a, s); break;
    default: cuda_fail("flash attention", "unknown KV cache type", __FILE__, __LINE__);
  }
}

template <int HD>
void run_flash_hd(const AttnArgs& a, cudaStream_t s) {
  if (a.flash_stage) {
    if (a.flash_bn == 16) run_flash_staged<HD, 16>(a, s);
    else run_flash_staged<HD, 32>(a, s);
  } else if (a.flash_bn == 64) {
    run_flash<HD, 64, false>(a, s);
  } else if (a.flash_bn == 16) {
    run_flash<HD, 16, true>(a, s);  // no staged tile occurs; staging smem not allocated
  } else {
    run_flash<HD, 32, true>(a, s);
  }
}


}  // namespace

bool flash_attention_plan(int n_heads, int n_kv_heads, int head_dim, bool stage, KvType kv, const CudaOptions& o,
                          FlashPlan* plan) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return false;
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) return false;
  // Warpgroup MMA (sm_90, bf16 cache) where a sequence continues a cached prefix: it reads every key
  // from the cache in 64-key tiles, where this kernel stages 32-key tiles and converts them (the
  // 27B, prompts in 8k chunks: 32k 4.00 s against 4.54, 128k 28.3 s against 39.5); on fresh
  // prompts this kernel is faster (8k: 71.8 against 91.5 ms). CudaOptions::flash_wgmma forces either.
  plan->wgmma = false;
  const bool wgmma = o.flash_wgmma > 0 || (o.flash_wgmma < 0 && stage);
  if (wgmma && o.smem_per_block_cap == 0 && flash_wgmma_plan(n_heads, n_kv_heads, head_dim, kv, plan)) return true;
  const int G = n_heads / n_kv_heads;
  // The most warps per block (8 warps: the most that 237 registers per thread allow per SM), then
  // the most query heads sharing each K/V tile. G = 6 (27B): 2 heads x 4 token tiles of 16 (8
  // warps) measured 74 ms for the 8k prefill against 97 ms for 6 heads x 1 tile (6 warps).
  int hb = 1, mt = kMaxWarps;
  for (int d = 1; d <= G && d <= kMaxWarps; ++d)
    if (G % d == 0 && d * (kMaxWarps / d) >= hb * mt) {
      hb = d;
      mt = kMaxWarps / d;
    }
  int bn = stage ? 32 : 64;
  // Tuning overrides (CudaOptions): query heads per block (divides G), 16-token tiles per block,
  // 32 or 64 keys per tile (64 only without staging).
  if (const int v = o.flash_heads_per_block; v >= 1 && v <= kMaxWarps && G % v == 0) {
    hb = v;
    mt = kMaxWarps / hb;
  }
  if (const int v = o.flash_m_tiles; v >= 1 && v * hb <= kMaxWarps) mt = v;
  if (o.flash_keys_per_tile == 32) bn = 32;
  std::size_t optin = static_cast<std::size_t>(device_smem_optin());
  if (o.smem_per_block_cap > 0) optin = std::min(optin, static_cast<std::size_t>(o.smem_per_block_cap));
  const int stage_elem = stage ? kv_elem_bytes(kv) : 0;
  auto fits = [&] { return flash_smem_bytes(head_dim, bn, hb * mt, stage_elem) <= optin; };
  // Too big: fewer token tiles, then smaller key tiles (64 -> 32 -> 16: head_dim 256 on sm_86's
  // 99 KB, where a staged 32-key tile does not fit with even one warp).
  while (!fits() && mt > 1) --mt;
  for (const int smaller : {32, 16}) {
    if (fits() || bn <= smaller) continue;
    bn = smaller;
    mt = kMaxWarps / hb;
    while (!fits() && mt > 1) --mt;
  }
  if (!fits()) return false;
  plan->heads_per_block = hb;
  plan->m_tiles = mt;
  plan->keys_per_tile = bn;
  return true;
}

int flash_attention_splits(int blocks, int max_keys, int min_tiles, const CudaOptions& o) {
  // Both kernels keep one block per SM (shared memory and registers, at head_dim 256), and every
  // block of a chunk walks about the same context. So a launch takes ceil(blocks / SMs) waves,
  // the last one partly idle: a chunk of a few tiles on a long prefix leaves most SMs idle, and
  // 96 blocks on 132 SMs 27% of them. Split the context in k (each split min_tiles 64-key tiles
  // at least) for the fullest waves, the smallest k within 5% of the best.
  if (blocks <= 0 || o.flash_max_splits <= 1) return 1;
  const int sms = sm_count(current_device());
  const int by_keys = std::max(1, (max_keys + 64 * min_tiles - 1) / (64 * min_tiles));
  auto fill = [&](int k) {
    const int64_t n = int64_t(blocks) * k;
    return double(n) / double((n + sms - 1) / sms * sms);
  };
  int best = 1;
  for (int k = 2; k <= std::min(by_keys, o.flash_max_splits); ++k)
    if (fill(k) > fill(best) + 0.05) best = k;
  return best;
}

void launch_flash_attention(const AttnArgs& a, cudaStream_t s) {
  if (a.flash_wgmma) {
    launch_flash_attention_wgmma(a, s);
    return;
  }
  switch (a.head_dim) {
    case 64: run_flash_hd<64>(a, s); break;
    case 128: run_flash_hd<128>(a, s); break;
    case 256: run_flash_hd<256>(a, s); break;
    default: cuda_fail("flash attention", "head_dim must be 64, 128 or 256", __FILE__, __LINE__);
  }
}

}  // namespace deltaserve::cuda
