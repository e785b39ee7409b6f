// A CPU device with a GPU's memory model, so that the code paths Tally takes
// for GPUs (staging, pinned host buffers, streamed copies, device
// collectives) run and are checked on machines without one.
//
// host_accessible() is false. Synchronous copies happen at once. An async
// copy to host lands only at Synchronize() or the WaitCopiesToHost of a later
// mark, so a caller that reads it early sees stale data; an async copy whose
// source changes before it lands (a race on a GPU, where the copy runs beside
// later kernels) makes that call fail with kInternal. Kernels are the CPU's.
#ifndef TALLY_TESTS_OFF_HOST_DEVICE_H_
#define TALLY_TESTS_OFF_HOST_DEVICE_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/device.h"

namespace tally::testing {

class OffHostDevice final : public Device {
 public:
  explicit OffHostDevice(DeviceId id);
  ~OffHostDevice() override;

  // Opens one for EngineOptions::open_device.
  static absl::StatusOr<std::unique_ptr<Device>> Open(DeviceId id);

  DeviceId id() const override { return id_; }
  Kernels& kernels() override { return cpu_->kernels(); }
  bool host_accessible() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    return cpu_->Allocate(bytes);
  }
  void Free(void* ptr) override { cpu_->Free(ptr); }
  absl::Status CopyFromHost(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override;
  absl::Status CopyFromHostAsync(void* dst, const void* src,
                                 size_t bytes) override;
  absl::Status CopyToHostAsync(void* dst, const void* src,
                               size_t bytes) override;
  absl::Status CopyFromPeer(void* dst, Device& peer, const void* src,
                            size_t bytes) override;
  absl::Status Synchronize() override;
  // A mark counts the copies enqueued so far; waiting on it lands those of
  // them that go to host memory (and checks their sources), no others.
  absl::StatusOr<int> MarkCopiesToHost() override;
  absl::Status WaitCopiesToHost(int mark) override;

  // The next Synchronize() fails with `error` (after landing the copies), as
  // a kernel's fault shows only there; WaitCopiesToHost does not see it.
  void FailNextSynchronize(absl::Status error) { injected_ = std::move(error); }

  // Async copies enqueued so far, each way.
  int64_t async_to_device() const { return async_to_device_; }
  int64_t async_to_host() const { return async_to_host_; }

 private:
  struct Pending {
    void* dst;  // null for a host-to-device copy (already done)
    const void* src;
    std::vector<char> snapshot;  // src when the copy was enqueued
    bool landed = false;         // by WaitCopiesToHost
  };
  // Lands a device-to-host copy: kInternal if its source changed.
  absl::Status Land(Pending& p);

  DeviceId id_;
  std::unique_ptr<Device> cpu_;
  std::vector<Pending> pending_;
  absl::Status injected_;
  int64_t async_to_device_ = 0;
  int64_t async_to_host_ = 0;
};

}  // namespace tally::testing

#endif  // TALLY_TESTS_OFF_HOST_DEVICE_H_
