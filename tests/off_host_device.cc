#include "tests/off_host_device.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tally::testing {

OffHostDevice::OffHostDevice(DeviceId id)
    : id_(id), cpu_(*OpenDevice({DeviceType::kCpu, id.index})) {}

OffHostDevice::~OffHostDevice() = default;

absl::StatusOr<std::unique_ptr<Device>> OffHostDevice::Open(DeviceId id) {
  return std::unique_ptr<Device>(new OffHostDevice(id));
}

absl::Status OffHostDevice::CopyFromHost(void* dst, const void* src,
                                         size_t bytes) {
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  std::memcpy(dst, src, bytes);
  return cpu_->Synchronize();
}

absl::Status OffHostDevice::CopyToHost(void* dst, const void* src,
                                       size_t bytes) {
  if (absl::Status s = Synchronize(); !s.ok()) return s;
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status OffHostDevice::CopyFromHostAsync(void* dst, const void* src,
                                              size_t bytes) {
  // Later kernels must see the data, and CPU kernels run at once.
  std::memcpy(dst, src, bytes);
  const char* p = static_cast<const char*>(src);
  pending_.push_back({nullptr, src, std::vector<char>(p, p + bytes)});
  ++async_to_device_;
  return absl::OkStatus();
}

absl::Status OffHostDevice::CopyToHostAsync(void* dst, const void* src,
                                            size_t bytes) {
  const char* p = static_cast<const char*>(src);
  pending_.push_back({dst, src, std::vector<char>(p, p + bytes)});
  ++async_to_host_;
  return absl::OkStatus();
}

absl::Status OffHostDevice::CopyFromPeer(void* dst, Device& peer,
                                         const void* src, size_t bytes) {
  // Device memory of every OffHostDevice is host memory underneath.
  if (dynamic_cast<OffHostDevice*>(&peer) == nullptr)
    return Device::CopyFromPeer(dst, peer, src, bytes);
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status OffHostDevice::Land(Pending& p) {
  absl::Status status;
  if (std::memcmp(p.src, p.snapshot.data(), p.snapshot.size()) != 0) {
    status = absl::InternalError(
        absl::StrCat(id_.ToString(), ": the source of an async ",
                     p.dst == nullptr ? "host-to-device" : "device-to-host",
                     " copy changed before it landed (a race on a GPU)"));
  }
  if (p.dst != nullptr)
    std::memcpy(p.dst, p.snapshot.data(), p.snapshot.size());
  p.landed = true;
  return status;
}

absl::StatusOr<int> OffHostDevice::MarkCopiesToHost() {
  return static_cast<int>(pending_.size()) + 1;
}

absl::Status OffHostDevice::WaitCopiesToHost(int mark) {
  if (mark <= 0 || static_cast<size_t>(mark) > pending_.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("no copy mark ", mark));
  }
  absl::Status status;
  for (int i = 0; i + 1 < mark; ++i) {
    Pending& p = pending_[i];
    if (p.dst == nullptr || p.landed) continue;
    if (absl::Status s = Land(p); status.ok()) status = s;
  }
  return status;
}

absl::Status OffHostDevice::Synchronize() {
  absl::Status status = cpu_->Synchronize();
  for (Pending& p : pending_) {
    if (p.landed) continue;
    if (absl::Status s = Land(p); status.ok()) status = s;
  }
  pending_.clear();
  if (!injected_.ok()) {
    if (status.ok()) status = injected_;
    injected_ = absl::OkStatus();
  }
  return status;
}

}  // namespace tally::testing
