// The NCCL communicator: one rank per GPU, collectives enqueued on a CUDA stream.
// NVLink multicast (NVLS) is never enabled: see ensure_nvls_off().
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "cuda/common/status.h"
#include "mlakv/parallel.h"
#include "parallel/collective_checks.h"

namespace mlakv {
namespace {

using parallel_internal::Collective;
using parallel_internal::collective_name;

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NcclId must hold an ncclUniqueId");

Status nccl_status(ncclResult_t r, ncclComm_t comm, std::string_view what) {
  if (r == ncclSuccess) return Status::Ok();
  const char* last = ncclGetLastError(comm);  // comm may be null
  const std::string msg = fmt::format("{}: {} ({})", what, ncclGetErrorString(r), last != nullptr ? last : "");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return invalid_argument(msg);
    default: return internal_error(msg);
  }
}

// NCCL reads NCCL_NVLS_ENABLE when it first initialises; multicast can take a shared
// host's GPUs out of service, so mlakv keeps it off: unset -> "0", anything but "0" -> refuse.
Status ensure_nvls_off() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v == nullptr) {
    if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) return internal_error("could not set NCCL_NVLS_ENABLE=0");
    return Status::Ok();
  }
  if (std::strcmp(v, "0") != 0) {
    return failed_precondition(fmt::format(
        "NCCL_NVLS_ENABLE={}: mlakv never runs NCCL with NVLink multicast; unset it or set it to 0", v));
  }
  return Status::Ok();
}

bool nccl_sum_ok(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16 || t == DType::kI32 ||
         t == DType::kI64;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    default: return ncclUint8;  // gathers move bytes
  }
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    ok_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  bool ok() const { return ok_; }

 private:
  int prev_ = -1;
  bool ok_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream, int* flag)
      : comm_(comm), rank_(rank), size_(size), device_(device), own_stream_(stream), stream_(stream), flag_(flag) {}
  ~NcclCommunicator() override {
    DeviceGuard g(device_);
    ncclCommDestroy(comm_);
    cudaFree(flag_);
    cudaStreamDestroy(own_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }
  std::string name() const override { return fmt::format("nccl {}/{} cuda:{}", rank_, size_, device_); }
  void* stream() const override { return stream_; }
  Status set_stream(void* stream) override {
    stream_ = stream != nullptr ? static_cast<cudaStream_t>(stream) : own_stream_;
    return Status::Ok();
  }
  Status synchronize() override {
    DeviceGuard g(device_);
    return cuda::cuda_status(cudaStreamSynchronize(stream_), "synchronize");
  }

  Status all_gather(const TensorView& in, const TensorView& out) override {
    MLAKV_RETURN_IF_ERROR(check(Collective::kAllGather, in, out));
    DeviceGuard g(device_);
    const std::size_t bytes = static_cast<std::size_t>(in.numel()) * dtype_size(in.dtype);
    return nccl_status(ncclAllGather(in.data, out.data, bytes, ncclUint8, comm_, stream_), comm_, "ncclAllGather");
  }
  Status reduce_scatter_sum(const TensorView& in, const TensorView& out) override {
    MLAKV_RETURN_IF_ERROR(check(Collective::kReduceScatterSum, in, out));
    DeviceGuard g(device_);
    return nccl_status(ncclReduceScatter(in.data, out.data, static_cast<std::size_t>(out.numel()), nccl_type(in.dtype),
                                         ncclSum, comm_, stream_),
                       comm_, "ncclReduceScatter");
  }
  Status all_reduce_sum(const TensorView& in, const TensorView& out) override {
    MLAKV_RETURN_IF_ERROR(check(Collective::kAllReduceSum, in, out));
    DeviceGuard g(device_);
    return nccl_status(ncclAllReduce(in.data, out.data, static_cast<std::size_t>(in.numel()), nccl_type(in.dtype),
                                     ncclSum, comm_, stream_),
                       comm_, "ncclAllReduce");
  }
  Status barrier() override {
    DeviceGuard g(device_);
    MLAKV_RETURN_IF_ERROR(
        nccl_status(ncclAllReduce(flag_, flag_, 1, ncclInt32, ncclSum, comm_, stream_), comm_, "barrier"));
    return cuda::cuda_status(cudaStreamSynchronize(stream_), "barrier");
  }

 private:
  Status check(Collective op, const TensorView& in, const TensorView& out) const {
    return parallel_internal::check_collective(op, in, out, size_, device(), nccl_sum_ok).with_context(name());
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  cudaStream_t own_stream_;
  cudaStream_t stream_;
  int* flag_;  // one device int for barrier()
};

Status check_device(int device, std::string_view fn) {
  int count = 0;
  MLAKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return invalid_argument(fmt::format("{}: device {} is outside the {} visible GPU(s)", fn, device, count));
  }
  return Status::Ok();
}

// Wraps an initialised comm; on failure destroys it.
StatusOr<std::unique_ptr<Communicator>> wrap(ncclComm_t comm, int rank, int size, int device) {
  DeviceGuard g(device);
  cudaStream_t stream = nullptr;
  int* flag = nullptr;
  Status st = MLAKV_CUDA_STATUS(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (st.ok()) st = MLAKV_CUDA_STATUS(cudaMalloc(&flag, sizeof(int)));
  if (st.ok()) st = MLAKV_CUDA_STATUS(cudaMemset(flag, 0, sizeof(int)));
  if (!st.ok()) {
    ncclCommDestroy(comm);
    if (flag != nullptr) cudaFree(flag);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, size, device, stream, flag));
}

}  // namespace

StatusOr<NcclId> nccl_unique_id() {
  MLAKV_RETURN_IF_ERROR(ensure_nvls_off());
  ncclUniqueId id;
  MLAKV_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId"));
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(const NcclId& id, int rank, int size, int device) {
  MLAKV_RETURN_IF_ERROR(ensure_nvls_off());
  if (size < 1) return invalid_argument(fmt::format("make_nccl_communicator: size must be >= 1, got {}", size));
  if (rank < 0 || rank >= size) {
    return invalid_argument(fmt::format("make_nccl_communicator: rank {} is outside [0, {})", rank, size));
  }
  MLAKV_RETURN_IF_ERROR(check_device(device, "make_nccl_communicator"));
  DeviceGuard g(device);
  if (!g.ok()) return internal_error(fmt::format("make_nccl_communicator: cudaSetDevice({}) failed", device));
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof(uid));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = "mlakv";
  ncclComm_t comm = nullptr;
  MLAKV_RETURN_IF_ERROR(nccl_status(ncclCommInitRankConfig(&comm, size, uid, rank, &config), comm,
                                    fmt::format("ncclCommInitRankConfig(rank {} of {}, cuda:{})", rank, size, device)));
  return wrap(comm, rank, size, device);
}

StatusOr<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(std::span<const int> devices) {
  MLAKV_RETURN_IF_ERROR(ensure_nvls_off());
  if (devices.empty()) return invalid_argument("make_nccl_communicators: no devices");
  std::set<int> seen;
  for (int d : devices) {
    MLAKV_RETURN_IF_ERROR(check_device(d, "make_nccl_communicators"));
    if (!seen.insert(d).second) {
      return invalid_argument(fmt::format("make_nccl_communicators: device {} is listed twice (one rank per GPU)", d));
    }
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  MLAKV_RETURN_IF_ERROR(nccl_status(ncclCommInitAll(raw.data(), n, devices.data()), nullptr, "ncclCommInitAll"));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    auto c = wrap(raw[static_cast<std::size_t>(r)], r, n, devices[static_cast<std::size_t>(r)]);
    if (!c.ok()) {
      for (int k = r + 1; k < n; ++k) ncclCommDestroy(raw[static_cast<std::size_t>(k)]);
      return c.status();
    }
    comms.push_back(std::move(c).value());
  }
  return comms;
}

}  // namespace mlakv
