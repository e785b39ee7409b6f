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

absl::Status OffHostDevice::Synchronize() {
  absl::Status status = cpu_->Synchronize();
  for (const Pending& p : pending_) {
    if (std::memcmp(p.src, p.snapshot.data(), p.snapshot.size()) != 0 &&
        status.ok()) {
      status = absl::InternalError(
          absl::StrCat(id_.ToString(), ": the source of an async ",
                       p.dst == nullptr ? "host-to-device" : "device-to-host",
                       " copy changed before Synchronize (a race on a GPU)"));
    }
    if (p.dst != nullptr)
      std::memcpy(p.dst, p.snapshot.data(), p.snapshot.size());
  }
  pending_.clear();
  return status;
}

}  // namespace tally::testing
