// CudaOptions: the CUDA backend's knobs, typed and passed to it when it is made. Defaults are the
// production settings; the others exist for A/B measurements and exact-numerics tests. Developer
// overrides come from environment variables (DELTASERVE_CUDA_GDN_STAGE=0, ...), checked and applied
// when the backend is made: their table is in cuda_option_env.cpp.
#pragma once

namespace deltaserve {

struct CudaOptions {
  // Matmul inputs: rounded to bf16 (vLLM/SGLang's numerics; default: one row on the GEMV with its
  // input rounded, two or more on cuBLAS), or f32-exact (the one-row GEMV on f32 inputs; cuBLAS on
  // three bf16 parts of each input, 3x the tensor-core work; fixture tests).
  bool exact_gemm = false;
  bool flash_attention = true;      // tensor-core prefill attention (else the CUDA-core kernel)
  bool gdn_thread_per_row = false;  // GDN runs of > 8 tokens: a thread per state row (else lanes)
  bool gdn_chunked = true;          // GDN runs of > 8 tokens: the chunked delta rule (head dims 64/128)
  bool gdn_chunked_mma = true;      // ... on tensor cores (Dk == Dv), else on CUDA cores
  int gdn_tf32_parts = 1;           // ... its products outside exact mode: 1 (one TF32 product of the
                                    // rounded operands, finer than the GEMMs' bf16 inputs) or 3
                                    // (3xTF32, f32-accurate; always in exact mode)
  bool gdn_chunk_prefetch = true;   // ... the next chunk fetched ahead, where shared memory allows
  bool gdn_fused_decode = true;     // GDN decode: the whole layer (conv, windows, norms, gates,
                                    // recurrence, gated norm) in one kernel
  int gdn_decode_warps = 0;         // ... its warps per block (0: by the batch, cuda_gated_delta_net.cu)
  int gdn_decode_cluster = 0;       // ... blocks per (sequence, value head): a cluster sharing the
                                    // head's state rows (sm_90; 1: a block per head, 2, 4 or 8;
                                    // 0: by the batch, cuda_gated_delta_net.cu)
  int gdn_decode_layout = 0;        // ... its state rows over lanes: 82 (8 floats of a row a lane, 2
                                    // rows a group; 0 too) or 44 (4 floats, 4 rows); the same bits
  int gdn_decode_stage = 1;         // ... its block's state rows staged in shared memory by one bulk
                                    // copy before its PDL wait (sm_90): 1 a bf16 state, 2 any, 0 none
  bool pdl = true;                  // decode GEMVs by programmatic dependent launch (sm_90+)
  bool pdl_chain = true;            // 2-64 rows: the attention and GDN ops' kernels after their first
                                    // by PDL (each follows one of ours; the first follows cuBLAS)
  int l2_prefetch_mb = 16;          // one-row decode (PDL) at contexts up to 2k: the GDN and attention
                                    // decode kernels prefetch this many MiB (at most a third of L2)
                                    // of the next matmul's weights into L2 (sm_90) while they run
  int fused_gemv = 0;               // 1-row prologues folded into the following GEMV: 0 none,
                                    // 1 SiLU-mul (into down_proj), 2 also RMSNorm (exact mode only).
                                    // On the H200 the SiLU fold loses to the PDL-launched separate
                                    // kernel, as did a bf16-mode norm fold (RESULTS, stops 26, 27)
  int gemv_shape = 0;               // 1-row GEMV tile: rows per block x 10 + loads per row in flight
                                    // (24, 42 or 81; 0: by the matrix, cuda_linear.cu)
  int flash_heads_per_block = 0;    // flash tile overrides (0: chosen per shape and device)
  int flash_m_tiles = 0;
  int flash_keys_per_tile = 0;      // 32 or 64
  int flash_wgmma = -1;             // prefill attention by warpgroup MMA (sm_90, bf16 cache;
                                    // cuda_flash_attention_wgmma.cu): -1 for batches where a sequence
                                    // continues a cached prefix (measured faster there, slower on
                                    // fresh prompts), 1 always, 0 never (mma.sync)
  int flash_max_splits = 16;        // prefill chunks on few blocks (a short chunk on a long context):
                                    // the context split over at most this many blocks per tile
  bool mixed_decode_rows = true;    // a mixed batch's one-token decode rows: the decode kernel (else
                                    // the flash kernel, with the prefill chunks)
  bool decode_attention = true;     // split-KV decode kernel for decode / verification (else tiled)
  int decode_blocks_per_sm = 2;     // its split count: (token, kv head, split) blocks per SM
  int decode_max_splits = 64;
  int decode_min_keys = 128;        // keys per split at least
  int decode_keys_per_step = 8;     // 4 or 8 (8: bf16 at head_dim 256 only)
  int decode_min_blocks = 0;        // register cap: 2 (with 8 keys) or 3 resident blocks per SM
  bool decode_tensor_cores = true;  // bf16/fp8 caches: the tensor-core decode kernel (else CUDA cores)
  int decode_mma_blocks_per_sm = 0; // its split count: resident blocks per SM (0: as shared memory allows)
  int decode_mma_keys = 0;          // its key tile: 32 or 64 (0: 64, or 32 where shared memory is short)
  int decode_mma_stages = 0;        // its pipeline depth: 2..3 (64 keys) or 2..4 (32 keys); 0: 3
  bool decode_fused_prep = true;    // ... and q/k's norms, RoPE and the new keys' cache writes in it
                                    // (else in a kernel before it, qk_prep_kernel; the same bits)
  int cublas_workspace_mb = -1;     // cuBLAS workspace (MiB): -1 by the GPU (32 on sm_90+, 4 before),
                                    // 0 cuBLAS's own default, else this many
  int gemm_algo = -1;               // GEMMs of 2+ rows (cuda_gemm.h): -1 timed per shape up to
                                    // gemm_tune_rows rows (GemmEx beyond, and in exact mode), 0
                                    // cublasGemmEx's default, k >= 1 cuBLASLt's k-th heuristic choice
  int gemm_tune_rows = 64;          // decode batches and verifications; prefill chunks are not timed
  int smem_per_block_cap = 0;       // bytes; caps the device's opt-in shared memory in the attention
                                    // plans (101376 = sm_86's: the A6000 configuration on an H200)
};

}  // namespace deltaserve
