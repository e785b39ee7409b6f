// A shard's part of a push or a pull as the wire carries it (the .proto's
// bytes, proto/tensor_chunk.h), whichever transport takes it: a unary call
// (worker/internal/unary_calls.h) or an op on an Exchange stream
// (worker/internal/exchange_stream.h).
//
// PushMessages is the encoder: the header with the first message, then the
// part's range in chunks, sent as it is offered; PullDecoder is the
// decoder: each chunk checked and its values written straight into the
// flat vector. MakePullRequest is a pull's request.
#ifndef TALLY_WORKER_INTERNAL_CODEC_H_
#define TALLY_WORKER_INTERNAL_CODEC_H_

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/shared_memory.h"
#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"
#include "worker/param_client.h"

namespace grpc {
class ByteBuffer;
}  // namespace grpc

namespace tally {
namespace internal {

// ExchangeRequest.push_done = true, appended to a push's last message on an
// Exchange stream.
const std::string& PushDone();

// A pull's request, as options `o` and the caller's arguments say.
v1::PullRequest MakePullRequest(const ParamClientOptions& o,
                                int64_t min_version,
                                const v1::StepCommit* commit, int64_t clock);

// What a PushFeed feeds: one shard's part of a push.
class FedPart {
 public:
  virtual ~FedPart() = default;
  // grads[b, e), within the part's range, is final: send it.
  virtual void Offer(int64_t b, int64_t e) = 0;
  // The feed's last word (the part may be gone when it returns): the part
  // ends, cancelled first unless its whole range was offered.
  virtual void Release(bool complete) = 0;
};

// One shard's part of a push, as messages: the header with the first, then
// the part's range in chunks, sent as it is offered (all at once, or
// through a PushFeed as the backward pass produces it). Like DDP's gradient
// buckets, a message waits until a whole chunk of adjacent ranges is ready
// or the range is complete: small layers go together, and a model smaller
// than a chunk goes in one message. Float32 values are not copied: each
// message's data is a slice of the caller's gradient. With a shared
// region (an Exchange stream's, its push part taken for this push), each
// offer is copied (or encoded) into the region instead and the messages
// only say where. Thread-safe.
class PushMessages {
 public:
  // Elements [offset, offset + count) of `grads` (borrowed, lent to gRPC
  // through `work`); the last message carries `last_suffix`.
  PushMessages(const std::shared_ptr<ShardWork>& work,
               const std::shared_ptr<InFlightCalls>& in_flight,
               const ParamClientOptions& o, const PushInfo& info, bool commit,
               const float* grads, int64_t offset, int64_t count,
               std::string last_suffix,
               std::shared_ptr<SharedRegion> shared = nullptr);

  int64_t begin() const { return offset_; }
  int64_t end() const { return offset_ + total_; }

  // Readies grads[b, e) (within the range) for sending; bfloat16 encodes
  // it here (its part of the buffer is this caller's alone until queued).
  void Queue(int64_t b, int64_t e);
  // The next message into `out`, if one is ready; the last one carries
  // `last_suffix`.
  bool Next(grpc::ByteBuffer* out);
  // Sends nothing more and lets go of the values.
  void Drop();
  // Every message was made.
  bool done() const;

 private:
  int64_t width() const { return dtype_ == v1::BFLOAT16 ? 2 : 4; }
  // A slice over `n` bytes of the caller's buffer at `p`, lent to gRPC:
  // `work` is not done, and the client not destroyed, until gRPC has let
  // go of it.
  static grpc::Slice Lend(std::shared_ptr<ShardWork> work,
                          std::shared_ptr<InFlightCalls> in_flight,
                          const void* p, size_t n);

  const float* grads_;  // borrowed: the whole flat gradient
  const int64_t offset_;
  const int64_t total_;  // elements to send: the range, or 0 (header only)
  const int64_t chunk_;
  const v1::DType dtype_;
  const std::string last_suffix_;
  // The region whose push part this push holds, and that part (offers may
  // still write there after the push failed: the region lives as long).
  const std::shared_ptr<SharedRegion> shared_;
  char* shared_values_ = nullptr;
  v1::PushHeader header_;
  std::shared_ptr<std::vector<uint16_t>> encoded_holder_;
  char* encoded_ = nullptr;  // bfloat16: the buffer values_ holds
  mutable absl::Mutex mu_;
  grpc::Slice values_ ABSL_GUARDED_BY(mu_);  // the range, in the wire dtype
  std::deque<std::pair<int64_t, int64_t>> ready_ ABSL_GUARDED_BY(mu_);
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool header_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One shard's part of a pull: checks each chunk (well-formed, inside the
// shard's range, one version) and decodes its values from gRPC's slices
// straight into the flat vector. Used by one reader at a time.
class PullDecoder {
 public:
  // `buffers` (may be null): where the buffer region goes, if the shard
  // sends one (the range at offset 0 of a Python model).
  PullDecoder(float* params, int64_t num_params, int64_t offset,
              int64_t count, std::shared_ptr<std::string> buffers)
      : params_(params),
        buffers_(std::move(buffers)),
        num_params_(num_params),
        offset_(offset),
        count_(count),
        contiguous_(offset) {}

  // A message read as `msg` (the chunk its field 3, the version field 1);
  // kDataLoss when it is not what a shard sends.
  absl::Status Take(const WireMessage& msg);

  // Every element before this has arrived (chunks come in order).
  int64_t contiguous() const { return contiguous_; }
  bool complete() const { return received_ == count_; }
  int64_t version() const { return version_; }
  // The pull's result once the shard is done sending.
  absl::Status Result() const;

 private:
  float* params_;  // borrowed: the whole flat vector
  const std::shared_ptr<std::string> buffers_;  // may be null
  const int64_t num_params_, offset_, count_;
  int64_t received_ = 0;
  int64_t version_ = -1;
  int64_t contiguous_;
};

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_CODEC_H_
