// One shard's part of a push or a pull as a call of its own (ParamClient
// Options.exchange false): a PushGradients or a PullWeights call, each a
// gRPC callback reactor that deletes itself when it ends, reporting to its
// Work (worker/internal/shard_work.h) and counted in `in_flight` until it
// is gone. The messages are the codec's (worker/internal/codec.h).
#ifndef TALLY_WORKER_INTERNAL_UNARY_CALLS_H_
#define TALLY_WORKER_INTERNAL_UNARY_CALLS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "proto/tally.pb.h"
#include "worker/param_client.h"

namespace tally {
namespace internal {

class FedPart;

// Starts part `part` of a push: grads[offset, offset + count) (nothing of
// it when info.samples is 0) to the shard behind `stub`. With `fed`, the
// call sends its range as a PushFeed offers it, and is held open until the
// feed's Release: the FedPart to give the feed, or null when the part has
// nothing to be fed (the header alone). Null without `fed`.
FedPart* StartPushCall(std::shared_ptr<ShardWork> work, int part,
                       std::shared_ptr<InFlightCalls> in_flight,
                       RawStub* stub, const ParamClientOptions& o,
                       const PushInfo& info, bool commit, const float* grads,
                       int64_t offset, int64_t count, bool fed);

// Starts part `part` of a pull: `req` to the shard behind `stub`, its
// range [offset, offset + count) written into params (and the buffer
// region into `buffers`, if it sends one).
void StartPullCall(std::shared_ptr<ShardWork> work, int part,
                   std::shared_ptr<InFlightCalls> in_flight, RawStub* stub,
                   const ParamClientOptions& o, const v1::PullRequest& req,
                   float* params, int64_t num_params, int64_t offset,
                   int64_t count, std::shared_ptr<std::string> buffers);

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_UNARY_CALLS_H_
