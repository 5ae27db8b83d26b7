// Helpers of the GPU benchmarks. CK(call): a CUDA runtime call; CB(call): a cuBLAS or cuBLASLt
// call; on error each prints the call with the line and exits 1. bench_split: a flag's list;
// bench_parse_shapes: --shapes NxK,....
// bench_time_us: microseconds per call of f(i) over iters back-to-back calls on stream s, after 3
// warm-up calls (i counts every call, warm-ups included: a caller may rotate its inputs on it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

#define CB(x)                                                                      \
  do {                                                                             \
    const int st_ = static_cast<int>(x);                                           \
    if (st_ != 0) {                                                                \
      std::fprintf(stderr, "%s: cublas status %d (line %d)\n", #x, st_, __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

inline std::vector<std::string> bench_split(const std::string& s, char c) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, c)) v.push_back(item);
  return v;
}

// --shapes NxK[,NxK...] -> (N, K) pairs; false (with a message) when an item is not NxK. std::stoll
// throws on a non-number, as the benchmarks' other flags do.
inline bool bench_parse_shapes(const std::string& v, std::vector<std::pair<int64_t, int64_t>>* shapes) {
  shapes->clear();
  for (const auto& s : bench_split(v, ',')) {
    const auto nk = bench_split(s, 'x');
    if (nk.size() != 2) {
      std::fprintf(stderr, "--shapes: NxK, not %s\n", s.c_str());
      return false;
    }
    shapes->emplace_back(std::stoll(nk[0]), std::stoll(nk[1]));
  }
  return true;
}

template <typename F>
double bench_time_us(F&& f, int iters, cudaStream_t s = nullptr) {
  int i = 0;
  for (; i < 3; ++i) f(i);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, s));
  for (int n = 0; n < iters; ++n, ++i) f(i);
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 1000.0 * ms / iters;
}
