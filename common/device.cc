#include "common/device.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/internal/cpu_kernels.h"
#ifdef TALLY_HAVE_CUDA
#include "common/cuda/cuda_device.h"
#endif

namespace tally {

std::string DeviceId::ToString() const {
  return absl::StrCat(type == DeviceType::kCpu ? "cpu:" : "cuda:", index);
}

bool CudaBackendCompiled() {
#ifdef TALLY_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::vector<DeviceId>> ParseDevices(absl::string_view spec) {
  const auto colon = spec.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices: '", spec,
                     "' is not of the form cpu:N, cuda:I[,J...] or cuda:all"));
  }
  const absl::string_view kind = spec.substr(0, colon);
  const absl::string_view rest = spec.substr(colon + 1);
  std::vector<DeviceId> out;
  if (kind == "cpu") {
    int n = 0;
    if (!absl::SimpleAtoi(rest, &n) || n < 1 || n > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: cpu:N needs a replica count N in [1, 1024], got '", rest,
          "'"));
    }
    for (int i = 0; i < n; ++i) out.push_back({DeviceType::kCpu, i});
    return out;
  }
  if (kind != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--devices: unknown device type '", kind, "' (want cpu or cuda)"));
  }
  std::vector<int> wanted;
  if (rest != "all") {
    for (absl::string_view part : absl::StrSplit(rest, ',')) {
      int idx = -1;
      if (!absl::SimpleAtoi(part, &idx) || idx < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--devices: '", part, "' is not a GPU index in '", spec, "'"));
      }
      for (int w : wanted) {
        if (w == idx) {
          return absl::InvalidArgumentError(
              absl::StrCat("--devices: GPU ", idx, " is listed twice"));
        }
      }
      wanted.push_back(idx);
    }
  }
  if (!CudaBackendCompiled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices=", spec,
        ": this build of Tally has no CUDA backend (nvcc was not found when "
        "it was built); use --devices=cpu:N"));
  }
#ifdef TALLY_HAVE_CUDA
  auto count = cuda::DeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices=", spec, ": no usable GPU: ", count.status().message()));
  }
  if (*count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--devices=", spec,
                     ": no usable GPU: cudaGetDeviceCount reported 0 devices"));
  }
  if (rest == "all") {
    for (int i = 0; i < *count; ++i) out.push_back({DeviceType::kCuda, i});
    return out;
  }
  for (int idx : wanted) {
    if (idx >= *count) {
      return absl::FailedPreconditionError(
          absl::StrCat("--devices=", spec, ": there is no GPU ", idx,
                       " (cudaGetDeviceCount reported ", *count, ")"));
    }
    out.push_back({DeviceType::kCuda, idx});
  }
  return out;
#else
  return absl::FailedPreconditionError("no CUDA backend");
#endif
}

absl::StatusOr<void*> Device::AllocateHost(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr)
    return absl::ResourceExhaustedError("host allocation failed");
  return p;
}

void Device::FreeHost(void* ptr) { std::free(ptr); }

absl::Status Device::CopyFromPeer(void* dst, Device& peer, const void* src,
                                  size_t bytes) {
  if (host_accessible() && peer.host_accessible()) {
    // Earlier kernels on this device have run (CPU kernels are synchronous).
    if (dst != src) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  if (host_accessible()) return peer.CopyToHost(dst, src, bytes);
  if (peer.host_accessible()) return CopyFromHost(dst, src, bytes);
  // Two devices that cannot see each other: bounce through host memory.
  std::vector<char> bounce(bytes);
  if (absl::Status s = peer.CopyToHost(bounce.data(), src, bytes); !s.ok())
    return s;
  return CopyFromHost(dst, bounce.data(), bytes);
}

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(DeviceId id) : id_(id), kernels_(&error_) {}

  DeviceId id() const override { return id_; }
  Kernels& kernels() override { return kernels_; }
  bool host_accessible() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(id_.ToString(), ": cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }

  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
    return TakeError();
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
    return TakeError();
  }
  absl::Status Synchronize() override { return TakeError(); }

 private:
  absl::Status TakeError() {
    absl::Status s = std::move(error_);
    error_ = absl::OkStatus();
    return s;
  }

  DeviceId id_;
  absl::Status error_;  // first kernel failure since the last sync
  internal::CpuKernels kernels_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> OpenDevice(DeviceId id) {
  if (id.type == DeviceType::kCpu) {
    // Each CPU replica is driven by one thread; BLAS must not fan out on top.
    openblas_set_num_threads(1);
    return std::unique_ptr<Device>(new CpuDevice(id));
  }
#ifdef TALLY_HAVE_CUDA
  return cuda::OpenDevice(id.index);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot open ", id.ToString(), ": no CUDA backend in this build"));
#endif
}

absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const std::vector<Device*>& devices, absl::Duration timeout,
    std::string* why_not_nccl) {
  bool all_gpus = devices.size() > 1;
  for (Device* d : devices)
    all_gpus = all_gpus && d->id().type == DeviceType::kCuda;
  if (!all_gpus) {
    return absl::UnimplementedError(
        "no device collective for these devices: reduce in host memory");
  }
#ifdef TALLY_HAVE_CUDA
  // NCCL when the build has it and it takes these GPUs (it refuses one GPU
  // listed twice, for instance); peer copies otherwise.
  auto nccl = cuda::CreateNcclCollective(devices);
  if (nccl.ok()) return nccl;
  if (why_not_nccl != nullptr)
    *why_not_nccl = std::string(nccl.status().message());
#else
  if (why_not_nccl != nullptr) *why_not_nccl = "this build has no CUDA";
#endif
  return CreatePeerCollective(devices, timeout);
}

}  // namespace tally
