// bench_cuda_comm: the tensor-parallel all-reduce alone (CudaPeerCommunicator, or NCCL with --nccl), one thread per
// rank as the engine runs it: latency of small messages (the decode all-reduces are [batch, 5120]
// f32: 20 KB at batch 1) and bandwidth of large ones (prefill chunks), eager and inside a CUDA graph
// (how decode runs it).
//   bench_cuda_comm [--ranks 2] [--sizes 10240,20480,1048576,67108864] [--iters 200] [--nccl | --nccl-id]
// Ranks go on GPUs 0..P-1, or DELTASERVE_TP_DEVICES=0,0 (several ranks on one GPU).
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_communicator.h"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda_option_env.h"
#include "bench_check.h"

using namespace deltaserve;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) v.push_back(std::atoll(x.c_str()));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  // Spinning collectives and lazily loaded kernels do not mix (see src/app/main.cpp); and this
  // bench allocates nothing while it runs, so ranks on one GPU may use the device barrier.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("DELTASERVE_TP_DEVICE_BARRIER", "1", 0);
  setvbuf(stdout, nullptr, _IONBF, 0);  // a hang (killed by a timeout) still shows how far it got
  int P = 2, iters = 200;
  bool use_nccl = false, by_id = false;
  std::vector<int64_t> sizes = {10240, 20480, 1 << 20, 64 << 20};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc) P = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--sizes") && i + 1 < argc) sizes = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--nccl")) use_nccl = true;
    else if (!std::strcmp(argv[i], "--nccl-id")) use_nccl = by_id = true;
    else {
      std::fprintf(stderr, "usage: %s [--ranks P] [--sizes BYTES,...] [--iters N] [--nccl | --nccl-id]\n", argv[0]);
      return 2;
    }
  }
  if (cuda_device_count() == 0) {
    std::printf("bench_cuda_comm: no CUDA device\n");
    return 0;
  }
  std::vector<int> devices;
  if (const char* env = std::getenv("DELTASERVE_TP_DEVICES")) {
    for (int64_t d : parse_list(env)) devices.push_back(static_cast<int>(d));
    P = static_cast<int>(devices.size());
  } else {
    for (int r = 0; r < P; ++r) devices.push_back(r);
  }
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> backends;
  auto options = cuda_options_from(cuda_option_variables());
  if (!options) {
    std::fprintf(stderr, "bench_cuda_comm: %s\n", options.status().message().c_str());
    return 2;
  }
  for (int d : devices) {
    owned.push_back(make_cuda_backend(d, *options));
    backends.push_back(owned.back().get());
  }
  // --nccl-id: the multi-node path (a unique id, ncclCommInitRank per rank in one group call), here
  // with every rank in this process.
  Result<std::vector<std::unique_ptr<Communicator>>> comms_r = error("no communicator");
  if (by_id) {
    auto id = nccl_unique_id();
    if (!id.is_ok()) {
      std::fprintf(stderr, "%s\n", id.status().message().c_str());
      return 1;
    }
    comms_r = make_nccl_communicators(backends, *id, 0, P);
  } else {
    comms_r = use_nccl ? make_nccl_communicators(backends) : make_cuda_peer_communicators(backends);
  }
  if (!comms_r.is_ok()) {
    std::fprintf(stderr, "%s\n", comms_r.status().message().c_str());
    return 1;
  }
  auto comms = std::move(*comms_r);
  int64_t max_bytes = 0;
  for (int64_t b : sizes) max_bytes = std::max(max_bytes, b);
  std::vector<DeviceBuffer> bufs(P);
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < P; ++r)
      ts.emplace_back([&, r] {
        backends[r]->bind_thread();
        bufs[r] = backends[r]->allocate(static_cast<std::size_t>(max_bytes));
        comms[r]->reserve(static_cast<std::size_t>(max_bytes));
      });
    for (auto& t : ts) t.join();
  }
  std::printf("%s%s: ranks %d on devices", use_nccl ? ("NCCL " + nccl_version()).c_str() : "peer",
              by_id ? " (by unique id, ncclCommInitRank)" : "", P);
  for (int d : devices) std::printf(" %d", d);
  std::printf(" (%s)\n| bytes | eager us/op | graph us/op | graph GB/s (bytes/time) | sums exact |\n"
              "|---|---|---|---|---|\n",
              cuda_device_name(*backends[0]).c_str());
  std::barrier<> phase(P);
  bool all_ok = true;
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    double eager = 0, graph = 0;
    std::vector<double> t_eager(P), t_graph(P);
    std::vector<int> ok(P, 1);
    std::vector<std::thread> ts;
    for (int r = 0; r < P; ++r)
      ts.emplace_back([&, r] {
        Backend& b = *backends[r];
        b.bind_thread();
        Tensor x(bufs[r].data(), DType::F32, {n}, Device::Cuda);
        // Correctness: rank r holds r + 1 + i % 7; the sum over ranks is exact in f32.
        std::vector<float> host(static_cast<std::size_t>(n));
        for (int64_t i = 0; i < n; ++i) host[i] = float(r + 1 + i % 7);
        b.copy_to_device(x, host.data());
        comms[r]->all_reduce_sum(x);
        b.copy_to_host(host.data(), x);
        for (int64_t i = 0; i < n && ok[r]; ++i)
          if (host[i] != float(P * (P + 1) / 2 + P * (i % 7))) ok[r] = 0;
        for (int i = 0; i < 10; ++i) comms[r]->all_reduce_sum(x);
        b.synchronize();
        phase.arrive_and_wait();
        double t0 = now_s();
        for (int i = 0; i < iters; ++i) comms[r]->all_reduce_sum(x);
        b.synchronize();
        t_eager[r] = (now_s() - t0) / iters;
        phase.arrive_and_wait();
        constexpr int kPerGraph = 20;
        auto g = b.capture([&] {
          for (int i = 0; i < kPerGraph; ++i) comms[r]->all_reduce_sum(x);
        });
        phase.arrive_and_wait();  // every rank captured before any replays
        if (g) {
          b.replay(*g);
          b.synchronize();
          t0 = now_s();
          const int reps = std::max(1, iters / kPerGraph);
          for (int i = 0; i < reps; ++i) b.replay(*g);
          b.synchronize();
          t_graph[r] = (now_s() - t0) / (reps * kPerGraph);
        } else {
          t_graph[r] = -1;
        }
        phase.arrive_and_wait();  // every rank done before any graph is destroyed
      });
    for (auto& t : ts) t.join();
    bool size_ok = true;
    for (int r = 0; r < P; ++r) {
      eager = std::max(eager, t_eager[r]);
      graph = std::max(graph, t_graph[r]);
      size_ok = size_ok && ok[r];
    }
    all_ok = all_ok && size_ok;
    std::printf("| %lld | %.1f | %.1f | %.1f | %s |\n", static_cast<long long>(bytes), eager * 1e6, graph * 1e6,
                graph > 0 ? bytes / graph / 1e9 : 0.0, size_ok ? "yes" : "NO");
  }
  if (!all_ok) {
    std::printf("bench_cuda_comm: WRONG SUMS\n");
    return 1;
  }
  return 0;
}
