#include "backend/cuda/nccl_communicator.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"

namespace deltaserve {

namespace {

// The NCCL entry points this file uses, resolved once from libnccl.so.2.
struct NcclLib {
  std::string error;  // why it is unavailable ("" when loaded)
  ncclResult_t (*get_version)(int*) = nullptr;
  const char* (*get_error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
};

const NcclLib& nccl() {
  static NcclLib lib;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      lib.error = std::string("cannot load libnccl.so.2 (") + (e ? e : "not found") +
                  "); install NCCL or put its lib/ on LD_LIBRARY_PATH";
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (fn == nullptr && lib.error.empty()) lib.error = std::string("libnccl.so.2 lacks ") + name;
    };
    sym(lib.get_version, "ncclGetVersion");
    sym(lib.get_error_string, "ncclGetErrorString");
    sym(lib.comm_init_all, "ncclCommInitAll");
    sym(lib.get_unique_id, "ncclGetUniqueId");
    sym(lib.comm_init_rank, "ncclCommInitRank");
    sym(lib.group_start, "ncclGroupStart");
    sym(lib.group_end, "ncclGroupEnd");
    sym(lib.comm_destroy, "ncclCommDestroy");
    sym(lib.all_reduce, "ncclAllReduce");
    sym(lib.all_gather, "ncclAllGather");
  });
  return lib;
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) DS_CHECK(false, what, ": ", nccl().get_error_string(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, Backend& backend)
      : comm_(comm), rank_(rank), size_(size), backend_(backend),
        stream_(static_cast<cudaStream_t>(cuda_stream(backend))) {}
  ~NcclCommunicator() override {
    backend_.bind_thread();
    (void)nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor x) override {
    DS_CHECK(x.dtype == DType::F32 && x.device == Device::Cuda, "all_reduce_sum: f32 device tensor");
    nccl_check(nccl().all_reduce(x.data, x.data, static_cast<size_t>(x.numel()), ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce");
  }
  void all_gather(const Tensor& in, Tensor out) override {
    DS_CHECK(out.nbytes() == in.nbytes() * size_, "all_gather: out must hold size x in");
    nccl_check(nccl().all_gather(in.data, out.data, in.nbytes(), ncclUint8, comm_, stream_), "ncclAllGather");
  }
  void barrier() override {
    if (!scratch_.data()) scratch_ = backend_.allocate(4);
    nccl_check(nccl().all_reduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce (barrier)");
    DS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  Backend& backend_;
  cudaStream_t stream_;
  DeviceBuffer scratch_;
};

}  // namespace

std::string nccl_unavailable_reason() { return nccl().error; }

std::string nccl_version() {
  if (!nccl().error.empty()) return "";
  int v = 0;
  if (nccl().get_version(&v) != ncclSuccess) return "";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& backends) {
  if (const std::string why = nccl_unavailable_reason(); !why.empty()) return error("NCCL: ", why);
  const int P = static_cast<int>(backends.size());
  std::vector<int> devs;
  for (Backend* b : backends) {
    const int d = cuda_device_index(*b);
    for (int seen : devs)
      if (seen == d) return error("NCCL needs one GPU per rank; GPU ", d, " holds two ranks");
    devs.push_back(d);
  }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(P));
  if (const ncclResult_t r = nccl().comm_init_all(comms.data(), P, devs.data()); r != ncclSuccess)
    return error("ncclCommInitAll over ", P, " GPUs: ", nccl().get_error_string(r));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < P; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[r], r, P, *backends[r]));
  return out;
}

Result<std::vector<uint8_t>> nccl_unique_id() {
  if (const std::string why = nccl_unavailable_reason(); !why.empty()) return error("NCCL: ", why);
  ncclUniqueId id;
  if (const ncclResult_t r = nccl().get_unique_id(&id); r != ncclSuccess)
    return error("ncclGetUniqueId: ", nccl().get_error_string(r));
  const auto* p = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(p, p + sizeof id);
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& backends,
                                                                            const std::vector<uint8_t>& unique_id,
                                                                            int first_rank, int size) {
  if (const std::string why = nccl_unavailable_reason(); !why.empty()) return error("NCCL: ", why);
  ncclUniqueId id;
  if (unique_id.size() != sizeof id) return error("NCCL unique id of ", unique_id.size(), " bytes (", sizeof id, " expected)");
  std::memcpy(&id, unique_id.data(), sizeof id);
  const int n = static_cast<int>(backends.size());
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  // Several ranks of this process join in one group call (each on its own device).
  if (ncclResult_t r = nccl().group_start(); r != ncclSuccess) return error("ncclGroupStart: ", nccl().get_error_string(r));
  ncclResult_t first_error = ncclSuccess;
  for (int i = 0; i < n; ++i) {
    backends[i]->bind_thread();
    const ncclResult_t r = nccl().comm_init_rank(&comms[i], size, id, first_rank + i);
    if (r != ncclSuccess && first_error == ncclSuccess) first_error = r;
  }
  const ncclResult_t end = nccl().group_end();
  if (first_error == ncclSuccess) first_error = end;
  if (first_error != ncclSuccess)
    return error("ncclCommInitRank (ranks ", first_rank, "..", first_rank + n - 1, " of ", size,
                 "): ", nccl().get_error_string(first_error));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[i], first_rank + i, size, *backends[i]));
  return out;
}

}  // namespace deltaserve
