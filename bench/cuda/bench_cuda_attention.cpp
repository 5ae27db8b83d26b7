// bench_cuda_attention: the decode / verification attention op alone (q/k norm + RoPE + KV write,
// attention over the paged cache, split combine) on the 27B's attention shape, at given contexts
// and batch sizes, with the split-KV decode kernel (its knobs swept) and with the tiled kernel it
// replaced. Reports microseconds per call (CUDA events over many back-to-back calls) and the KV
// read bandwidth that implies.
//
//   bench_cuda_attention [--ctx 1024,8192,32768,131072] [--batch 1,16] [--rows 1] [--kv bf16|fp8]
//                        [--iters 50] [--heads 24 --kv-heads 4 --head-dim 256] [--contiguous]
//
// KV blocks are handed out in a shuffled order (as a long-running pool does) unless --contiguous.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_launch.h"
#include "bench_check.h"

using namespace deltaserve;

namespace {

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct Variant {
  std::string name;
  bool decode_kernel;
  int blocks_per_sm, min_keys, keys_per_step, min_blocks;
  bool mma = false;     // the tensor-core decode kernel (blocks_per_sm: its resident blocks, 0 = by smem)
  int smem_cap = 0;     // CudaOptions::smem_per_block_cap (101376: sm_86's tiles)
  int mma_keys = 0, mma_stages = 0;  // CudaOptions::decode_mma_keys / decode_mma_stages
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ctxs = {1024, 8192, 32768, 131072}, batches = {1, 16};
  int rows = 1, iters = 50, nh = 24, nkv = 4, hd = 256, rd = 64;
  bool fp8 = false, contiguous = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ctx") ctxs = int_list(next());
    else if (a == "--batch") batches = int_list(next());
    else if (a == "--rows") rows = std::stoi(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--kv") fp8 = next() == "fp8";
    else if (a == "--heads") nh = std::stoi(next());
    else if (a == "--kv-heads") nkv = std::stoi(next());
    else if (a == "--head-dim") hd = std::stoi(next());
    else if (a == "--contiguous") contiguous = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const int bs = 16;
  const size_t elem = fp8 ? 1 : 2;
  const std::vector<Variant> variants = {
      {"tensor cores (default)", true, 0, 128, 8, 0, true},
      {"tensor cores, 64 keys x 3", true, 0, 128, 8, 0, true, 0, 64, 3},
      {"tensor cores, 32 keys x 2", true, 0, 128, 8, 0, true, 0, 32, 2},
      {"tensor cores, 32 keys x 3", true, 0, 128, 8, 0, true, 0, 32, 3},
      {"tensor cores, sm_86 tiles", true, 0, 128, 8, 0, true, 101376},
      {"split-KV CUDA cores", true, 2, 128, 8, 0},
      {"tiled (old)", false, 0, 0, 0, 0},
  };
  std::printf("attention op: nh %d, nkv %d, head_dim %d, KV %s, %d row(s) per sequence, %s blocks\n", nh, nkv, hd,
              fp8 ? "fp8_e4m3" : "bf16", rows, contiguous ? "contiguous" : "shuffled");
  std::printf("%-8s %-6s %-28s %12s %12s\n", "context", "batch", "kernel", "us / call", "KV GB/s");
  std::mt19937_64 rng(7);
  for (int ctx : ctxs) {
    for (int batch : batches) {
      const int per_seq = (ctx + rows + bs - 1) / bs;
      const int n_blocks = per_seq * batch;
      const int T = batch * rows;
      std::vector<int32_t> perm(n_blocks);
      std::iota(perm.begin(), perm.end(), 0);
      if (!contiguous) std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> table(size_t(batch) * per_seq), positions, seq_start;
      for (int s = 0; s < batch; ++s) {
        for (int b = 0; b < per_seq; ++b) table[size_t(s) * per_seq + b] = perm[size_t(s) * per_seq + b];
        seq_start.push_back(s * rows);
        for (int r = 0; r < rows; ++r) positions.push_back(ctx + r);
      }
      seq_start.push_back(T);
      const size_t cache_bytes = size_t(n_blocks) * bs * nkv * hd * elem;
      void *kc = nullptr, *vc = nullptr;
      CK(cudaMalloc(&kc, cache_bytes));
      CK(cudaMalloc(&vc, cache_bytes));
      // Small finite values in either dtype: bf16 0x3c00-ish, fp8 0x30-ish.
      CK(cudaMemset(kc, fp8 ? 0x30 : 0x3c, cache_bytes));
      CK(cudaMemset(vc, fp8 ? 0x28 : 0x3b, cache_bytes));
      const int64_t row = int64_t(nh) * hd * 2 + 2LL * nkv * hd;
      std::vector<float> qkv_h(size_t(T) * row);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (float& x : qkv_h) x = u(rng);
      std::vector<float> inv_freq_h(rd / 2), ones(hd, 1.f);
      for (int i = 0; i < rd / 2; ++i) inv_freq_h[i] = 1.0f / std::pow(1e7f, float(2 * i) / float(rd));
      float* qkv = device_copy(qkv_h);
      float* inv_freq = device_copy(inv_freq_h);
      float* norm = device_copy(ones);
      int32_t* d_pos = device_copy(positions);
      int32_t* d_start = device_copy(seq_start);
      int32_t* d_table = device_copy(table);
      float *out = nullptr, *q_scratch = nullptr, *part_ml = nullptr, *part_o = nullptr;
      CK(cudaMalloc(&out, size_t(T) * nh * hd * 4));
      CK(cudaMalloc(&q_scratch, size_t(T) * nh * hd * 4));
      CK(cudaMalloc(&part_ml, size_t(T) * nh * 64 * 2 * 4));
      CK(cudaMalloc(&part_o, size_t(T) * nh * 64 * hd * 4));
      cudaStream_t stream;
      CK(cudaStreamCreate(&stream));
      const double kv_bytes = 2.0 * double(batch) * rows * (ctx + 1) * nkv * hd * elem;
      for (const Variant& v : variants) {
        cuda::AttnArgs a;
        a.n_tokens = T;
        a.n_seqs = batch;
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.rotary_dim = rd;
        a.output_gate = true;
        a.scale = 1.0f / std::sqrt(float(hd));
        a.q_norm = norm;
        a.k_norm = norm;
        a.inv_freq = inv_freq;
        a.qkv = qkv;
        a.k_cache = kc;
        a.v_cache = vc;
        a.kv_type = fp8 ? cuda::KvType::E4M3 : cuda::KvType::BF16;
        a.q_scratch = q_scratch;
        a.positions = d_pos;
        a.seq_start = d_start;
        a.block_table = d_table;
        a.max_blocks = per_seq;
        a.block_size = bs;
        a.out = out;
        a.part_ml = part_ml;
        a.part_o = part_o;
        cuda::DecodeMmaPlan plan;
        CudaOptions mo;
        mo.decode_mma_blocks_per_sm = v.blocks_per_sm;
        mo.smem_per_block_cap = v.smem_cap;
        mo.decode_mma_keys = v.mma_keys;
        mo.decode_mma_stages = v.mma_stages;
        if (v.mma) {
          if (!cuda::decode_attention_mma_plan(nh, nkv, hd, a.kv_type, batch, rows, mo, &plan)) continue;
          a.decode_kernel = true;
          a.dec_mma_mt = plan.m_tiles;
          a.dec_mma_kg = plan.key_groups;
          a.dec_mma_bn = plan.keys_per_tile;
          a.dec_mma_stages = plan.stages;
          a.n_split = cuda::decode_attention_mma_splits(batch, nkv, hd, plan, mo);
          a.dec_min_keys = v.min_keys;
        } else if (v.decode_kernel) {
          if (!cuda::decode_attention_supported(nh, nkv, hd, a.kv_type, bs)) continue;
          CudaOptions o;
          o.decode_blocks_per_sm = v.blocks_per_sm;
          a.decode_kernel = true;
          a.n_split = cuda::decode_attention_splits(T, nkv, o);
          a.dec_min_keys = v.min_keys;
          a.dec_keys_per_step = v.keys_per_step;
          a.dec_min_blocks = v.min_blocks;
        } else {
          a.n_split = int64_t(T) * nkv < 128 ? 8 : 1;
        }
        for (int w = 0; w < 3; ++w) cuda::launch_attention(a, stream);
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < iters; ++i) cuda::launch_attention(a, stream);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = 1e3 * ms / iters;
        std::printf("%-8d %-6d %-28s %12.1f %12.0f   (splits %d)\n", ctx, batch, v.name.c_str(), us,
                    kv_bytes / (us * 1e-6) / 1e9, a.n_split);
        std::fflush(stdout);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
      }
      CK(cudaStreamDestroy(stream));
      for (void* p : {kc, vc, static_cast<void*>(qkv), static_cast<void*>(inv_freq), static_cast<void*>(norm),
                      static_cast<void*>(d_pos), static_cast<void*>(d_start), static_cast<void*>(d_table),
                      static_cast<void*>(out), static_cast<void*>(q_scratch), static_cast<void*>(part_ml),
                      static_cast<void*>(part_o)})
        CK(cudaFree(p));
    }
  }
  return 0;
}
