// The shared-memory handshake of one Exchange stream, as a shard holds it
// (proto/shared_memory.h; proto/tally.proto, SharedMemoryOffer): a pull
// asks, the shard offers a region for the stream's values, the worker maps
// it and replies; from then on push chunks may lie in the region's push
// part and pulls be answered in its pull part. The reactor only frames the
// messages and drives the session, as it drives a PushSession.
//
//   kNotAsked --Offer--> kOffered --Reply(mapped)--> kMapped
//       |                   |
//       |                   +------Reply(not mapped)--> kDeclined
//       +--Offer (none made)--> kNotOffered --Reply--> kDeclined
//
// A region is offered once a stream at most, to a worker on this host
// (`colocated`) that is a member of a job with a range here, within the
// host's bounds (ShardHost::ReserveSharedRegion). The host counts the
// region from the offer until it is refused or the session ends. An offer
// unanswered for RequestWaits::offer_answer loses the shard's descriptor
// (a worker that had opened it would have answered by now); the region
// stays for the reply.
//
// Not thread-safe: the ExchangeReactor that owns it calls it from its
// reading side, one message at a time; a pull being served borrows the
// mapped region (PullRegion) for as long as the session lives.
#ifndef TALLY_SERVER_DATA_SHARED_MEMORY_SESSION_H_
#define TALLY_SERVER_DATA_SHARED_MEMORY_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/shared_memory.h"
#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"
#include "server/data/shard_host.h"

namespace tally {

class SharedMemorySession {
 public:
  enum class State {
    kNotAsked,    // no pull asked for an offer yet
    kNotOffered,  // one asked; none was made (the stream goes on without)
    kOffered,     // a region was offered; the worker's reply is awaited
    kMapped,      // the worker mapped it: values may go through it
    kDeclined,    // replied, with no region in use
  };

  // `host` is borrowed; `colocated`: the stream's worker reached this
  // process over loopback or a Unix socket.
  SharedMemorySession(ShardHost* host, bool colocated)
      : host_(host), colocated_(colocated) {}
  SharedMemorySession(const SharedMemorySession&) = delete;
  SharedMemorySession& operator=(const SharedMemorySession&) = delete;
  // Unmaps the region, then the host stops counting it.
  ~SharedMemorySession();

  State state() const { return state_; }

  // A pull's request. When it asks for an offer (offer_shared_memory) and
  // is the stream's first to: true, with the offer to write in *offer
  // (ExchangeResponse.shared), if one is made. Otherwise false and
  // nothing: the pull says what is wrong, if anything.
  bool Offer(const v1::PullRequest& req, absl::Time now,
             v1::ExchangeResponse* offer);

  // The worker's reply to the offer. kInvalidArgument for a reply to no
  // offer, or a second one.
  absl::Status Reply(const v1::SharedMemoryReply& reply);

  // Called for every message read: an offer unanswered since `now` minus
  // the host's offer_answer closes the shard's descriptor.
  void CloseIfUnanswered(absl::Time now);

  // A push chunk of `msg` whose values lie in the region's push part:
  // `msg` reads them from there (counted by the host). kInvalidArgument
  // when no region is mapped, the chunk also carries values, or they lie
  // outside the push part.
  absl::Status UsePushChunk(WireMessage* msg);

  // The region a pull into shared memory answers in; kInvalidArgument
  // when none is mapped.
  absl::StatusOr<SharedRegion*> PullRegion() const;

 private:
  // Lets go of the region and of the host's count of it.
  void Release();

  ShardHost* const host_;  // borrowed
  const bool colocated_;
  State state_ = State::kNotAsked;
  // The region offered (kOffered, kMapped), counted by the host for
  // owner_'s range of count_ values.
  std::unique_ptr<SharedRegion> region_;
  std::string owner_;  // its job and worker
  int64_t count_ = 0;
  absl::Time offered_at_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARED_MEMORY_SESSION_H_
