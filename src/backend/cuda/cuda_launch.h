// Launchers of the CUDA kernels (defined in the .cu files), on raw device pointers. Only this
// header is shared between nvcc-compiled files and cuda_backend.cpp, so nvcc never sees the
// project's C++20 headers. All launches are asynchronous on the given stream.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda_options.h"

#include <cuda_runtime.h>

namespace deltaserve::cuda {

// The calling thread's current device (0..kMaxDevices-1), for per-device one-time settings.
constexpr int kMaxDevices = 16;
inline int current_device() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= kMaxDevices) d = 0;
  return d;
}

// A device attribute, asked once per (attribute, device) and kept; `fallback` if the query fails.
inline int device_attribute(cudaDeviceAttr attr, int device, int fallback) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(attr), device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    (void)cudaGetLastError();
    v = fallback;
  }
  return cache[key] = v;
}

// ---- cuda_comm.cu (the in-process peer communicator) ---------------------------------------------
constexpr int kMaxPeers = 8;
struct PeerPtrs {
  void* p[kMaxPeers];  // one per rank (passed by value: fixed in captured graphs)
};
// mine.p[0/1]: this rank's two staging buffers; epoch: this rank's collective counter (device).
void launch_comm_stage(const void* x, int64_t n_words, PeerPtrs mine, const uint32_t* epoch, cudaStream_t s);
// peer_flags.p[q]: rank q's flag array (uint32[kMaxPeers]); my_flags: this rank's.
void launch_comm_barrier(uint32_t* epoch, PeerPtrs peer_flags, uint32_t* my_flags, int rank, int size, cudaStream_t s);
// s0 / s1: every rank's staging buffer 0 / 1. x [n] = sum over ranks, in rank order.
void launch_comm_sum(float* x, int64_t n, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch, cudaStream_t s);
// out [size * n_words] = every rank's staged words, rank-major.
void launch_comm_gather(void* out, int64_t n_words, PeerPtrs s0, PeerPtrs s1, int size, const uint32_t* epoch,
                        cudaStream_t s);

// ---- cuda_ops.cu -------------------------------------------------------------------------------
// Rows first_row .. first_row + rows of a vocabulary of `vocab`: ids of other rows give zeros,
// ids outside [0, vocab) NaN rows.
void launch_embed(const void* table, bool table_bf16, int64_t first_row, int64_t rows, int64_t vocab, int64_t h,
                  const int32_t* ids, int64_t n, float* out, cudaStream_t s);
// dst[r, c] = index[c] >= 0 ? src[r, index[c]] : fill; src [rows, m], index [w], dst [rows, w].
void launch_gather_columns(const float* src, int64_t m, const int32_t* index, int64_t rows, int64_t w, float fill,
                           float* dst, cudaStream_t s);
// out[r] = first index of the largest value of row r (NaNs never; 0 when a row has no number).
// x [rows, v], rows <= 65535; scratch: argmax_scratch_bytes(rows, v) of device memory.
std::size_t argmax_scratch_bytes(int64_t rows, int64_t v);
// pdl (here and below): launched by programmatic dependent launch (cuda_pdl.cuh), so that a small
// kernel is resident before the kernel it follows has finished.
void launch_argmax_rows(const float* x, int64_t rows, int64_t v, int32_t* out, void* scratch, bool pdl,
                        cudaStream_t s);
// ---- cuda_sample.cu ------------------------------------------------------------------------------
// Kernels::sample_rows: settings [rows] deltaserve::SampleRow, penalties [n] PenaltyEntry (device).
void launch_sample_rows(float* logits, int64_t rows, int64_t v, const void* settings, const void* penalties,
                        int n_penalties, int32_t* out, cudaStream_t s);
void launch_rms_norm(const float* x, int64_t rows, int64_t d, const float* w, float eps, float* out,
                     int64_t out_stride, bool pdl, cudaStream_t s);
// The same into bf16 [rows, d] (a GEMM's input: the f32 result is never stored).
void launch_rms_norm_bf16(const float* x, int64_t rows, int64_t d, const float* w, float eps, uint16_t* out,
                          bool pdl, cudaStream_t s);
void launch_silu_mul(const float* gu, int64_t rows, int64_t inter, float* out, bool pdl, cudaStream_t s);
// The same, rounded to bf16 (a GEMM's input: the f32 product is never stored).
void launch_silu_mul_bf16(const float* gu, int64_t rows, int64_t inter, uint16_t* out, bool pdl, cudaStream_t s);
// The same from gate_up's bf16 output gu [rows, 2 * inter] (bf16) to out [rows, inter] (bf16).
void launch_silu_mul_bf16_in(const uint16_t* gu, int64_t rows, int64_t inter, uint16_t* out, cudaStream_t s);
// rows: host array; passed by value in the launch (graph-capture safe).
void launch_gather_rows(const float* src, int64_t d, const int32_t* rows_host, int n_rows, float* dst,
                        cudaStream_t s);
void launch_f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t s);
// x [n] -> parts [3, n] bf16 with x = hi + mid + lo exactly (up to f32 denormals): exact GEMM.
void launch_split_bf16x3(const float* x, int64_t n, uint16_t* parts, cudaStream_t s);
// out[i] (=|+=) (p[i] + p[n + i]) + p[2n + i].
void launch_sum_parts3(const float* p, int64_t n, float* out, bool accumulate, cudaStream_t s);
// Deterministic uniform(-scale, scale) bf16 values (dummy weights).
void launch_random_bf16(uint16_t* w, int64_t n, float scale, uint64_t seed, cudaStream_t s);
// Speculative rollback of one GDN layer: for each pick, conv[slot] = conv_snap[slot * depth + j]
// and recurrent[slot] = recurrent_snap[slot * depth + j] (elems per slot given). picks: host.
// ---- cuda_linear.cu ----------------------------------------------------------------------------
// Streaming multiprocessors of a device (cached; 1 when the query fails).
int sm_count(int device);
// Whether kernels go by programmatic dependent launch (cuda_pdl.cuh): CudaOptions::pdl on a device
// of compute capability 9+. The one decision: the GEMVs and CudaBackend::pdl() ask it.
bool pdl_enabled(const CudaOptions& o, int device);
// One row (decode): out[N] (=|+=) x[K] (f32) · w[N, K]ᵀ (bf16), f32 accumulation on CUDA cores
// (each block streams a few weight rows with 16-byte loads); round_x: x rounded to bf16 first (the
// default GEMM mode, as cuBLAS gets two or more rows). Deterministic. False when the shape is not
// handled (K % 8 != 0, unaligned); the caller then uses cuBLAS.
bool launch_gemv(const float* x, int64_t K, const uint16_t* w, int64_t N, float* out, bool accumulate, bool round_x,
                 const CudaOptions& o, cudaStream_t s);
// The same with a prologue folded in: out[N] (=|+=) f(x) · wᵀ, f = RMSNorm with weight norm [K]
// (x [K]; not with round_x), or SiLU-mul (x = [gate | up], 2K floats). False when not handled.
enum class GemvPrologue : int { RmsNorm, SiluMul };
bool launch_gemv_prologue(const float* x, GemvPrologue prologue, const float* norm, float eps, int64_t K,
                          const uint16_t* w, int64_t N, float* out, bool accumulate, bool round_x,
                          const CudaOptions& o, cudaStream_t s);

// ---- cuda_attention.cu -------------------------------------------------------------------------
// KV cache element type (deltaserve::DType F32, BF16, F8E4M3, F8E5M2; kernels.h KvLayerView).
enum class KvType : int { F32 = 0, BF16 = 1, E4M3 = 2, E5M2 = 3 };

struct AttnArgs {
  int n_tokens = 0, n_seqs = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, rotary_dim = 0;
  bool output_gate = false;
  float eps = 1e-6f, scale = 0.f;
  const float* q_norm = nullptr;  // [head_dim]
  const float* k_norm = nullptr;
  const float* inv_freq = nullptr; // [rotary_dim / 2] device
  const float* qkv = nullptr;      // [T, row]
  void* k_cache = nullptr;         // [n_blocks, bs, nkv, hd] of kv_type
  void* v_cache = nullptr;
  KvType kv_type = KvType::F32;
  // Stored = convert(x * inv_scale); read = stored * scale (per layer; 1 unless fp8 with scales).
  float k_scale = 1.f, v_scale = 1.f, k_inv_scale = 1.f, v_inv_scale = 1.f;
  float* q_scratch = nullptr;      // [T, nh, hd]
  int32_t* tok_seq = nullptr;      // [T] scratch
  const int32_t* positions = nullptr;  // [T]
  const int32_t* seq_start = nullptr;  // [S+1]
  const int32_t* block_table = nullptr;  // [S, max_blocks]
  int max_blocks = 0, block_size = 0;
  float* out = nullptr;            // [T, nh*hd]
  // Split-KV (decode; prefill chunks whose blocks are too few for the GPU): the context is cut
  // into n_split ranges scored by separate blocks; their partial (max, sum, unnormalised output)
  // land in part_ml [T, nh, n_split, 2] / part_o [T, nh, n_split, hd] and a second kernel combines
  // them. n_split = 1: no partials.
  int n_split = 1;
  float* part_ml = nullptr;
  float* part_o = nullptr;
  // Split-KV decode kernel (cuda_decode_attention.cu), when decode_kernel: each split takes at
  // least dec_min_keys keys (the high splits of a short context stay empty).
  bool decode_kernel = false;
  int dec_min_keys = 128;
  // Tuning variants (bf16, head_dim 256 only): 8 keys per warp step; register caps for 2 / 3
  // resident blocks per SM (min_blocks 2 goes with 8 keys, 3 with 4).
  int dec_keys_per_step = 8;
  int dec_min_blocks = 0;
  // Tensor-core decode kernel (cuda_decode_attention_mma.cu), when dec_mma_mt > 0: a block per
  // (sequence, KV head, split), dec_mma_mt m-tiles of 8 query rows x dec_mma_kg key groups of
  // warps, tiles of dec_mma_bn keys in a dec_mma_stages-deep pipeline (DecodeMmaPlan).
  int dec_mma_mt = 0, dec_mma_kg = 0, dec_mma_bn = 64, dec_mma_stages = 3;
  // ... which also does qk_prep's work (no qk_prep launch): each split block writes the keys and
  // values of this step's positions in its range into the cache, and normalises and rotates its
  // query rows itself (the same arithmetic: cuda_qk_prep.cuh). q_scratch is then not written.
  bool dec_fused_prep = false;
  // Tensor-core prefill path (cuda_flash_attention.cu), when flash_tiles > 0: one block per
  // (token tile of 16 * flash_mt tokens of one sequence, KV head, flash_hb query heads of its
  // group); flash_tiles = sum over sequences of ceil(tokens / (16 * flash_mt)).
  int flash_tiles = 0, flash_hb = 0, flash_mt = 0, flash_bn = 32;
  bool flash_stage = false;  // some sequence continues a cached prefix: staging of its keys
  int flash_split_min_tiles = 4;  // with n_split > 1: 64-key tiles per split at least
  bool flash_wgmma = false;  // the warpgroup-MMA kernel (every key from the bf16 paged cache)
  // Flash path only: qk_prep writes q as fp16 to q16 [T, nh, hd] (instead of q_scratch), and this
  // step's k as fp16 / v as bf16 to k16 / v16 [T, nkv, hd] (besides the cache): the values the
  // cache holds (stored * scale), so every key is read the same way whichever chunk wrote it.
  uint16_t* q16 = nullptr;
  uint16_t* k16 = nullptr;
  uint16_t* v16 = nullptr;
  // qk_prep, the tensor-core decode kernel and the combine by programmatic dependent launch.
  bool pdl = false;
  // Batches of 2-64 rows (decode batches, verifications, short chunks; qk_prep follows a cuBLAS
  // GEMM, plainly launched): the tensor-core decode kernel and the combine by PDL, each following
  // one of ours.
  bool pdl_chain = false;
  // The tensor-core decode kernel prefetches [l2_next, + l2_next_bytes) into L2 (o_proj's first
  // bytes; cuda_pdl.cuh, l2_prefetch_share) for a sequence of at most l2_next_max_keys keys (a
  // longer one's own KV reads keep the DRAM busy). Null: nothing.
  const void* l2_next = nullptr;
  int64_t l2_next_bytes = 0;
  int l2_next_max_keys = 0;
};
// q/k norm + RoPE + KV write (qk_prep), then the flash path when a.flash_tiles > 0, else the
// split-KV decode kernel when a.decode_kernel, else the tiled CUDA-core kernel (split-KV when
// n_split > 1); a combine kernel merges the splits' partials.
void launch_attention(const AttnArgs& a, cudaStream_t s);

// ---- cuda_decode_attention.cu ------------------------------------------------------------------
// Whether the split-KV decode kernel handles this shape (group size 1, 2, 4, 6 or 8; head_dim 64,
// 128 or 256, not fp8 at 64; block_size a multiple of 4).
bool decode_attention_supported(int n_heads, int n_kv_heads, int head_dim, KvType kv, int block_size);
// Its split count for a batch shape (graph-safe: independent of the contexts): enough blocks for
// CudaOptions::decode_blocks_per_sm per SM, at most decode_max_splits.
int decode_attention_splits(int n_tokens, int n_kv_heads, const CudaOptions& o);
// The kernel alone (partials when a.n_split > 1); false when the shape is not handled.
bool launch_decode_attention(const AttnArgs& a, cudaStream_t s);

// ---- cuda_decode_attention_mma.cu --------------------------------------------------------------
// Block layout of the tensor-core decode kernel; false when it does not handle the shape (an f32
// cache, head_dim other than 64/128/256, more than 32 query rows (tokens x group) per sequence,
// or too little shared memory).
struct DecodeMmaPlan {
  int m_tiles = 0;        // m-tiles of 8 query rows (dec_mma_mt)
  int key_groups = 0;     // warps per m-tile, each taking its share of a key tile (dec_mma_kg)
  int keys_per_tile = 0;  // 64 or 32 (dec_mma_bn)
  int stages = 0;         // cp.async pipeline depth (dec_mma_stages)
};
bool decode_attention_mma_plan(int n_heads, int n_kv_heads, int head_dim, KvType kv, int n_seqs, int max_seq_tokens,
                               const CudaOptions& o, DecodeMmaPlan* plan);
// Its split count for a batch shape (graph-safe): one wave of resident (sequence, kv head, split)
// blocks, at most decode_max_splits.
int decode_attention_mma_splits(int n_seqs, int n_kv_heads, int head_dim, const DecodeMmaPlan& plan,
                                const CudaOptions& o);
// The kernel alone (partials when a.n_split > 1; the caller runs the combine kernel).
void launch_decode_attention_mma(const AttnArgs& a, cudaStream_t s);

// ---- cuda_flash_attention.cu -------------------------------------------------------------------
// Block layout of the tensor-core path for this head shape on the current device (shared memory
// capped by CudaOptions::smem_per_block_cap). stage: some sequence continues a cached prefix (its
// earlier keys are staged from the cache, stored as kv). False when the shape has no kernel
// (head_dim other than 64, 128, 256). At head_dim 256 on sm_86 (99 KB) a staged step takes
// 16-key tiles.
struct FlashPlan {
  int heads_per_block = 0;  // query heads of one GQA group per block (flash_hb)
  int m_tiles = 0;          // 16-token tiles per block (flash_mt)
  int keys_per_tile = 0;    // 16, 32 or 64 (flash_bn)
  bool wgmma = false;       // the warpgroup-MMA kernel (cuda_flash_attention_wgmma.cu; sm_90, bf16 cache)
};
bool flash_attention_plan(int n_heads, int n_kv_heads, int head_dim, bool stage, KvType kv, const CudaOptions& o,
                          FlashPlan* plan);
// Its split count (AttnArgs::n_split) for `blocks` blocks (flash_tiles x kv heads x head groups)
// over contexts of at most max_keys keys: the split that fills the GPU's waves of blocks best
// (a chunk of few tiles on a long prefix leaves most SMs idle), each split at least min_tiles
// 64-key tiles; 1 when the blocks fill their waves; at most CudaOptions::flash_max_splits.
int flash_attention_splits(int blocks, int max_keys, int min_tiles, const CudaOptions& o);
// The attention itself, after qk_prep (q in q16, this step's k/v in k16/v16 and the paged cache);
// its partials when a.n_split > 1 (launch_attention then combines them).
void launch_flash_attention(const AttnArgs& a, cudaStream_t s);
// cuda_flash_attention_wgmma.cu: its plan (a bf16 cache on an sm_90 GPU, head_dim 64/128/256:
// 64-token tiles of 64 keys, the most query heads per block that fit) and launch.
bool flash_wgmma_plan(int n_heads, int n_kv_heads, int head_dim, KvType kv, FlashPlan* plan);
void launch_flash_attention_wgmma(const AttnArgs& a, cudaStream_t s);

// ---- cuda_gated_delta_net.cu -------------------------------------------------------------------
// The chunked delta rule (long GDN runs): tokens per chunk, and floats per row of GdnArgs::chunk_m.
constexpr int kGdnChunk = 32;
constexpr int kGdnChunkRow = kGdnChunk + 4;

struct GdnArgs {
  int n_tokens = 0, n_seqs = 0;
  int Hk = 0, Hv = 0, Dk = 0, Dv = 0, K = 0;
  float eps = 1e-6f;
  const float* conv_weight = nullptr;  // [conv_dim, K]
  const float* neg_exp_a = nullptr;    // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm = nullptr;         // [Dv]
  const float* proj = nullptr;         // [T, proj_dim]
  float* conv_state = nullptr;         // [slots, conv_dim, K-1]
  void* rec_state = nullptr;           // [slots, Hv, Dv, Dk] f32, or bf16 when rec_bf16 (cuda_gdn.cuh's
  bool rec_bf16 = false;               //   load_state4 / store_state4; a run computes in f32)
  // Deferred sequences (defer[s] != 0, speculative verification): the state is read, not
  // written; the run's raw inputs go to pending rows (slot * pending_depth + j) = [qkv | b | a].
  const int32_t* defer = nullptr;      // [S] device, nullptr = none
  float* pending = nullptr;            // [slots * pending_depth, conv_dim + 2*Hv]
  int pending_depth = 0;
  // Prefix-cache checkpoints: the state after token ckpt_at[s] of the run goes to slot
  // ckpt_slot[s] (ckpt_at -1: none). nullptr: none this step.
  const int32_t* ckpt_at = nullptr;    // [S] device
  const int32_t* ckpt_slot = nullptr;  // [S] device
  const int32_t* seq_start = nullptr;  // [S+1]
  const int32_t* state_slot = nullptr; // [S]
  float* conv_out = nullptr;           // scratch [T, conv_dim]
  float* gb = nullptr;                 // scratch [T, Hv, 2]: beta, decay
  float* out = nullptr;                // [T, Hv*Dv]
  bool rows_kernel = true;             // recurrence with rows spread over lanes (else thread per row)
  bool chunked = true;                 // long runs (prefill): the chunked delta rule (head dims 64/128)
  // Long runs with Dk == Dv in {64, 128}: the chunked rule on tensor cores (cuda_gdn_chunked_mma.cu;
  // else on CUDA cores). Needs chunk_m; borrows out and conv_out's value columns as scratch.
  bool chunked_mma = true;
  float* chunk_m = nullptr;            // scratch [T, Hv, kGdnChunkRow]: token i's masked (q_i.k_j) Gam_ij
                                       // over its chunk's j, then gamma_i, gamma_L / gamma_i, 2 spare
  bool chunk_prefetch = true;          // its state kernel fetches the next chunk's W, Q ahead (where 2 blocks/SM fit)
  int tf32_parts = 3;                  // its products: 3xTF32 (f32-accurate) or 1 (one TF32 product)
  bool decode = false;                 // one token per sequence, no deferral: the layer in one kernel
  int decode_warps = 0;                // decode: warps per block (0: by the batch, cuda_gated_delta_net.cu)
  int decode_layout = 0;               // decode: the state rows' lane layout (82 or 44: floats of a row
                                       // per lane, rows per group; 0: 82)
  int decode_stage = 1;                // decode: the block's state rows staged in shared memory by one
                                       // bulk copy (sm_90): 1 a bf16 state, 2 any, 0 none. The
                                       // launcher hands the kernel a copy with it resolved (1 staged,
                                       // 0 in place) and decode_cluster resolved (the blocks per head)
  int* head_count = nullptr;           // [S, Hk] zeros, for decode: blocks of a key head past reading its
                                       // q/k windows (the last moves them and resets the count)
  bool pdl = false;                    // the decode kernels (the fused layer, or rows recurrence and gated
                                       // norm) by programmatic dependent launch
  bool pdl_chain = false;              // 2-64 rows (the conv follows a cuBLAS GEMM, plainly launched):
                                       // the window, prep, recurrence and gated-norm kernels by PDL
  // decode: blocks per (sequence, value head), a cluster sharing the head's rows (sm_90; 0: by the
  // batch, cuda_gated_delta_net.cu; else at most this many, with Dv / cluster a multiple of 32)
  int decode_cluster = 0;
  // decode: the fused kernel prefetches [l2_next, + l2_next_bytes) into L2 (out_proj's first bytes)
  // for a sequence at a position below l2_next_max_keys (positions [T]), as AttnArgs.
  const void* l2_next = nullptr;
  int64_t l2_next_bytes = 0;
  const int32_t* positions = nullptr;
  int l2_next_max_keys = 0;
};
// Returns false when the head sizes have no compiled kernel.
bool launch_gated_delta_net(const GdnArgs& a, cudaStream_t s);
// Whether a run takes the tensor-core chunked recurrence (then GdnArgs::chunk_m must hold
// [n_tokens, Hv, kGdnChunkRow] floats).
bool gdn_uses_chunked_mma(const GdnArgs& a);

// Speculative commit (Kernels::gdn_commit): every layer's parameters and state, as a device table.
struct GdnCommitLayer {
  const float* conv_weight = nullptr;  // [conv_dim, K]
  const float* neg_exp_a = nullptr;    // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  float* conv_state = nullptr;         // [slots, conv_dim, K-1]
  void* rec_state = nullptr;           // [slots, Hv, Dv, Dk] (GdnCommitArgs::rec_bf16)
  const float* pending = nullptr;      // [slots * pending_depth, conv_dim + 2*Hv]
};
struct GdnCommitArgs {
  int n_layers = 0, n_seqs = 0, max_tokens = 0;  // max_tokens: longest run (sizes nothing; checked)
  int Hk = 0, Hv = 0, Dk = 0, Dv = 0, K = 0, pending_depth = 0;
  bool rec_bf16 = false;                   // every layer's recurrent state is bf16 (else f32)
  const GdnCommitLayer* layers = nullptr;  // [n_layers] device
  const int32_t* seq_start = nullptr;      // [S+1] device: tokens to replay per sequence
  const int32_t* state_slot = nullptr;     // [S] device
  const int32_t* ckpt_at = nullptr;        // [S] device, nullptr = no checkpoints (as GdnArgs)
  const int32_t* ckpt_slot = nullptr;      // [S] device
};
// Two launches for all layers: the recurrence (which reads the old conv windows), then the windows.
bool launch_gdn_commit(const GdnCommitArgs& a, cudaStream_t s);

}  // namespace deltaserve::cuda
