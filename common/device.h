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
#include "absl/time/time.h"

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
  // Waits for all enqueued work, copies included; returns the first error it
  // hit, if any.
  virtual absl::Status Synchronize() = 0;

  // Copies that may run beside the kernels (a GPU's second stream), so that
  // weights stream in and gradients stream out while layers compute. Errors
  // are sticky and come back from Synchronize(); the default is the
  // synchronous copy.
  //
  // CopyFromHostAsync: kernels enqueued after it see the data; kernels
  // enqueued before it must not use `dst`. `src` must stay unchanged until
  // Synchronize() (pinned memory from AllocateHost makes it truly async).
  virtual absl::Status CopyFromHostAsync(void* dst, const void* src,
                                         size_t bytes) {
    return CopyFromHost(dst, src, bytes);
  }
  // CopyToHostAsync: copies what the kernels enqueued before it wrote, while
  // later kernels run; kernels enqueued after it must not write `src`.
  // `dst` holds the data once Synchronize() returns.
  virtual absl::Status CopyToHostAsync(void* dst, const void* src,
                                       size_t bytes) {
    return CopyToHost(dst, src, bytes);
  }
  // Marks the CopyToHostAsync copies enqueued so far. WaitCopiesToHost(mark)
  // returns once they have landed in host memory, without waiting for the
  // kernels enqueued after them (as Synchronize() does), so a caller can hand
  // on each layer's gradient while earlier layers still compute. Marks count
  // from 1 and are valid until the next Synchronize() (which the synchronous
  // copies also do); the wait returns the first error so far, if any (it
  // stays sticky). The default copies are synchronous: its mark is 0 and
  // there is nothing to wait for.
  virtual absl::StatusOr<int> MarkCopiesToHost() { return 0; }
  virtual absl::Status WaitCopiesToHost(int /*mark*/) {
    return absl::OkStatus();
  }

  // Enqueues a copy of `bytes` at `src` on device `peer` (borrowed) into
  // `dst` on this device, ordered after this device's earlier work. The
  // caller makes sure `peer` has finished writing `src` (its Synchronize()
  // returned) and does not write it until this device synchronises. GPUs use
  // direct peer copies (NVLink/PCIe); the default goes through host memory.
  virtual absl::Status CopyFromPeer(void* dst, Device& peer, const void* src,
                                    size_t bytes);

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
  // "nccl" or "peer", for logs.
  virtual const char* name() const = 0;
};

// A collective over several GPUs (borrowed): NCCL where the build has it and
// it initialises, else the peer-copy collective below, and then
// `why_not_nccl` (if given) says why. kUnimplemented for CPU replicas (and a
// single device): callers then reduce in host memory.
absl::StatusOr<std::unique_ptr<Collective>> CreateCollective(
    const std::vector<Device*>& devices, absl::Duration timeout,
    std::string* why_not_nccl = nullptr);

// A collective built from CopyFromPeer and Kernels::Axpy alone, for any
// devices: a reduce-scatter (rank r sums slice r of every member's buffer)
// then an all-gather, three barriers in all. Each barrier waits at most
// `timeout`; a member that misses it fails the call with kDeadlineExceeded
// on the others and leaves the collective broken (every later call fails
// with kFailedPrecondition). When any member's own work failed before the
// reduction (its Synchronize()), all members return kAborted and no buffer
// changes.
std::unique_ptr<Collective> CreatePeerCollective(
    const std::vector<Device*>& devices, absl::Duration timeout);

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
