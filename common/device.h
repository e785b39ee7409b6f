// Devices: where tensors live and kernels run.
//
// A Device owns an allocator and a Kernels implementation for one CPU replica
// or one GPU. Layers and models only talk to Device and Kernels, so a new
// backend (CUDA) plugs in behind this header without changing any caller.
//
// Threading: a Device and its Kernels are used by one thread at a time (the
// thread that drives that replica). Distinct devices may run concurrently.
//
// Errors: kernels enqueue work and return nothing, as a GPU stream does; a
// failure is sticky and surfaces as a Status from Synchronize() (and from the
// copy calls), the way cudaGetLastError reports a failed launch.
#ifndef TALLY_COMMON_DEVICE_H_
#define TALLY_COMMON_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

class Kernels;

enum class DeviceType { kCpu, kCuda };

struct DeviceId {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  std::string ToString() const;  // "cpu:0", "cuda:1"
  bool operator==(const DeviceId&) const = default;
};

// Parses a --devices value: "cpu:N" (N CPU replicas), "cuda:0,1" (those GPUs),
// "cuda:all" (every visible GPU). Returns kInvalidArgument for malformed text
// and kFailedPrecondition when CUDA is asked for and cannot be used (no
// backend compiled in, or no usable GPU: the message says what was found).
absl::StatusOr<std::vector<DeviceId>> ParseDevices(absl::string_view spec);

// True when this build contains the CUDA backend.
bool CudaBackendCompiled();

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceId id() const = 0;
  virtual Kernels& kernels() = 0;
  // True when device memory is ordinary host memory (CPU devices), so
  // callers may read and write it directly instead of copying.
  virtual bool host_accessible() const = 0;

  // Device memory. Allocate returns kResourceExhausted on failure.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;

  virtual absl::Status CopyFromHost(void* dst, const void* src,
                                    size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  // Waits for all enqueued work; returns the first error it hit, if any.
  virtual absl::Status Synchronize() = 0;

  // Host memory for buffers that travel to and from this device often
  // (page-locked on GPUs, so copies run at full speed; plain on CPUs).
  virtual absl::StatusOr<void*> AllocateHost(size_t bytes);
  virtual void FreeHost(void* ptr);

  // Lets matrix products use TF32 tensor cores (GPUs that have them); a
  // no-op elsewhere. Off by default: results then match FP32.
  virtual void SetAllowTf32(bool /*allow*/) {}
};

// Sums a float buffer across a group of devices in place, every member
// getting the sum (NCCL on GPUs). Each member's driving thread calls
// AllReduceSum for its own rank; the calls meet, so they must be concurrent.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual absl::Status AllReduceSum(int rank, float* buffer, int64_t count) = 0;
};

// A collective over `devices` (borrowed). kUnimplemented when the devices
// have none (CPU replicas, or a build without NCCL): callers then reduce
// through host memory.
absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const std::vector<Device*>& devices);

// Opens a device. CPU devices always open; each pins BLAS to one thread so
// that N replicas use N cores.
absl::StatusOr<std::unique_ptr<Device>> OpenDevice(DeviceId id);

// Owns `count` elements of T on a device. Movable, not copyable.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    Reset();
    device_ = o.device_;
    data_ = o.data_;
    count_ = o.count_;
    o.device_ = nullptr;
    o.data_ = nullptr;
    o.count_ = 0;
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  // Allocates `count` elements on `device` (borrowed; must outlive this).
  static absl::StatusOr<DeviceBuffer> Create(Device* device, size_t count) {
    DeviceBuffer b;
    if (count == 0) count = 1;  // keep data() non-null
    auto ptr = device->Allocate(count * sizeof(T));
    if (!ptr.ok()) return ptr.status();
    b.device_ = device;
    b.data_ = static_cast<T*>(*ptr);
    b.count_ = count;
    return b;
  }

  T* data() const { return data_; }
  size_t size() const { return count_; }

  void Reset() {
    if (device_ != nullptr && data_ != nullptr) device_->Free(data_);
    device_ = nullptr;
    data_ = nullptr;
    count_ = 0;
  }

 private:
  Device* device_ = nullptr;  // borrowed
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace tally

#endif  // TALLY_COMMON_DEVICE_H_
