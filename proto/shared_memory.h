// Memory a parameter shard shares with a worker on its host, for the values
// of one Exchange stream (proto/tally.proto, SharedMemoryOffer): pushes and
// pulls then carry only where their values lie, not the values, so neither
// side copies them through the kernel's loopback TCP.
//
// The shard creates the region (Create): a memfd sealed against shrinking
// and growing, so that a peer that holds it can never make an access fault,
// with a random token at its start. The worker maps it (Map) through
// /proc/<pid>/fd/<fd>, which only a process on the same host, in the same
// pid namespace and allowed to read the shard's descriptors can open,
// checks that it opened a sealed region, maps it and checks the token. Either side treats what the other writes there as
// untrusted input: values are copied out before they are checked.
//
// Thread-safe for concurrent reads and writes of different parts; the
// busy flags are atomic.
#ifndef TALLY_PROTO_SHARED_MEMORY_H_
#define TALLY_PROTO_SHARED_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/tally.pb.h"

namespace tally {

class SharedRegion {
 public:
  // The shard's side: a region with `push_bytes` for a push's values and
  // `pull_bytes` for a pull's. kInvalidArgument for an impossible size,
  // kInternal (with errno's words) when the system will not give one.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(
      int64_t push_bytes, int64_t pull_bytes);
  // The worker's side: maps the region `offer` describes, or says why not
  // (another host, another pid namespace, no permission, not a region the
  // shard made): then the stream goes on without one.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Map(
      const v1::SharedMemoryOffer& offer);

  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  // What the worker is told (the shard's side, until CloseDescriptor).
  v1::SharedMemoryOffer Offer() const;
  // The shard's descriptor goes once the worker has mapped the region (or
  // will not): the mapping stays.
  void CloseDescriptor();

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  int64_t push_at() const { return push_at_; }
  int64_t pull_at() const { return pull_at_; }

  enum Part { kPush = 0, kPull = 1 };

  // Where `count` values of `width` bytes from byte `at` lie, if they are
  // all inside `part` (the push part [push_at, pull_at), the pull part
  // [pull_at, size)); null otherwise, whatever the numbers (a peer's).
  char* Values(Part part, int64_t at, int64_t count, int width) const {
    const int64_t begin = part == kPush ? push_at_ : pull_at_;
    const int64_t end = part == kPush ? pull_at_ : size_;
    if (width <= 0 || count < 0 || count > (end - begin) / width ||
        at < begin || at > end - count * width) {
      return nullptr;
    }
    return data_ + at;
  }
  int64_t part_bytes(Part part) const {
    return part == kPush ? pull_at_ - push_at_ : size_ - pull_at_;
  }

  // One push and one pull at a time use the region (the worker's rule):
  // true when the part was free and is now taken.
  bool TryTake(Part part) { return !busy_[part].exchange(true); }
  void Give(Part part) { busy_[part].store(false); }

 private:
  SharedRegion() = default;

  int fd_ = -1;  // the shard's, until CloseDescriptor; the worker keeps none
  char* data_ = nullptr;
  int64_t size_ = 0;
  int64_t push_at_ = 0;
  int64_t pull_at_ = 0;
  std::string token_;
  std::atomic<bool> busy_[2] = {false, false};
};

}  // namespace tally

#endif  // TALLY_PROTO_SHARED_MEMORY_H_
