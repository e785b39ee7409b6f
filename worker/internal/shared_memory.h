// The worker's side of memory shared with a shard on its host
// (proto/shared_memory.h) on one Exchange stream: the handshake (a pull
// asks, the shard offers, the worker maps the region and replies) and the
// parts of the mapped region that ops take, one push and one pull at a
// time.
//
// StreamSharing is not thread-safe: the ShardStream that owns it guards it
// with its lock. SharedPart is thread-safe (its region's busy flags are
// atomic).
#ifndef TALLY_WORKER_INTERNAL_SHARED_MEMORY_H_
#define TALLY_WORKER_INTERNAL_SHARED_MEMORY_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/shared_memory.h"
#include "proto/tensor_chunk.h"

namespace tally {
namespace internal {

// A part of a stream's shared region, taken for one op (StreamSharing::
// Take) and given back once: when the op is answered or fails, or at the
// latest with the op.
class SharedPart {
 public:
  SharedPart(std::shared_ptr<SharedRegion> region, SharedRegion::Part part)
      : region_(std::move(region)), part_(part) {}
  SharedPart(const SharedPart&) = delete;
  SharedPart& operator=(const SharedPart&) = delete;
  ~SharedPart() { Give(); }

  const std::shared_ptr<SharedRegion>& region() const { return region_; }
  void Give() {
    if (!given_.exchange(true)) region_->Give(part_);
  }

 private:
  const std::shared_ptr<SharedRegion> region_;
  const SharedRegion::Part part_;
  std::atomic<bool> given_{false};
};

// One stream's handshake, as one state:
//
//   kOff (not wanted)
//   kNotAsked --Ask--> kAsked --Offered--> kAnswered
//
// In kAnswered the shard's offer was answered: mapped (region() is set,
// and a reply saying so waits to be written) or not (a reply saying why
// waits, or none when the stream writes nothing more).
class StreamSharing {
 public:
  enum class State { kOff, kNotAsked, kAsked, kAnswered };

  // `wanted`: ask the shard for memory to share (ParamClientOptions::
  // shared_memory).
  explicit StreamSharing(bool wanted)
      : state_(wanted ? State::kNotAsked : State::kOff) {}

  State state() const { return state_; }

  // Whether a pull should ask for an offer: once a stream, if wanted.
  bool Ask();
  // An offer came: kDataLoss unless one was asked for and none came yet.
  // Then the caller maps it, outside its lock (Answer), unless the stream
  // writes nothing more.
  absl::Status Offered();
  // The mapping's outcome: the region is used from now on, or not; either
  // way a reply for the shard waits (TakeReply).
  void Answer(absl::StatusOr<std::unique_ptr<SharedRegion>> mapped);
  // The reply to the offer, once, before anything that may use the region.
  bool TakeReply(grpc::ByteBuffer* out);

  // The region's `part`, taken for one op of `values` float32 values; null
  // when there is none, the part is smaller, or it is in use.
  std::unique_ptr<SharedPart> Take(SharedRegion::Part part, int64_t values);
  // The mapped region (null: none).
  const std::shared_ptr<SharedRegion>& region() const { return region_; }

 private:
  State state_;
  std::shared_ptr<SharedRegion> region_;  // mapped
  bool reply_pending_ = false;
  grpc::ByteBuffer reply_;
};

// A pull's chunk whose values lie in `region`'s pull part: `in` reads them
// from there. kDataLoss when they lie outside it (or there is no region).
absl::Status UseSharedPull(const SharedRegion* region, WireMessage* in);

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_SHARED_MEMORY_H_
