// A worker's long-lived Exchange stream to one shard (ParamClientOptions::
// exchange): every push and pull of a job to that shard goes on it as an
// op, answered in order, so no call is set up per step.
//
// ShardStream is the stream, a gRPC callback reactor: ops queue for its
// writer in order; the shard answers them in the same order, and the
// reader hands each answer to the oldest op still waiting. Its users
// reach it through a ShardStreamSlot, never directly: the slot's lock and
// user count keep the reactor alive while a user calls into it, and no
// lock is held while gRPC is called (a call may run reactions inline).
// With memory to share, the stream's StreamSharing (worker/internal/
// shared_memory.h) does the handshake, and its later pushes and pulls go
// through the region.
//
// PushOp and PullOp are one shard's part of a push and of a pull on it,
// their messages the codec's (worker/internal/codec.h).
//
// Thread-safe (each class says how).
#ifndef TALLY_WORKER_INTERNAL_EXCHANGE_STREAM_H_
#define TALLY_WORKER_INTERNAL_EXCHANGE_STREAM_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shared_memory.h"
#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"
#include "worker/internal/codec.h"
#include "worker/internal/shared_memory.h"
#include "worker/param_client.h"

namespace tally {
namespace internal {

// One push or pull on an Exchange stream: its messages for the writer, its
// answers from the reader.
class StreamOp {
 public:
  virtual ~StreamOp() = default;
  // The next message, if one is ready (false: none now, or none left).
  virtual bool Next(grpc::ByteBuffer* out) = 0;
  // Every message was made.
  virtual bool written() const = 0;
  // An answer for this op (`msg` parsed with the chunk as field 3): OK
  // while it is well-formed; *done once the op has all its answers (then it
  // reported its result to its work).
  virtual absl::Status Answer(const WireMessage& msg, bool* done) = 0;
  // The stream ended before the op had all its answers.
  virtual void Fail(const absl::Status& s) = 0;
};

class ShardStream;

// How users reach a ShardStream: the lock and the user count keep the
// reactor alive while a user calls into it.
struct ShardStreamSlot {
  absl::Mutex mu;
  ShardStream* stream ABSL_GUARDED_BY(mu) = nullptr;
  bool open ABSL_GUARDED_BY(mu) = true;  // takes ops; holds the stream
  int users ABSL_GUARDED_BY(mu) = 0;
  bool released ABSL_GUARDED_BY(mu) = false;
  absl::Time opened;  // set once, before the slot is shared

  // The stream, kept alive until Unuse; null once it takes no more ops.
  ShardStream* Use();
  void Unuse();
  // Takes no more ops; the stream goes once its users are done.
  void Shut();
};

// The stream. The client keeps it open (a gRPC hold) until it closes it
// or the stream ends; then every op still waiting fails with the stream's
// status. With `share`, its first pull asks the shard for memory to share;
// when the offer comes and maps, the stream's later pushes and pulls go
// through it, one push and one pull at a time (the others as before).
class ShardStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Starts the stream (it deletes itself when it ends, counted in
  // `in_flight` until then), reachable through `slot`; it lives until
  // `lifetime` (its deadline).
  ShardStream(RawStub* stub, std::shared_ptr<InFlightCalls> in_flight,
              absl::Duration lifetime, std::shared_ptr<ShardStreamSlot> slot,
              bool share);

  grpc::ClientContext* context() { return &ctx_; }

  // The calls below are a user's (between the slot's Use and Unuse).
  // Queues `op`.
  void Add(std::shared_ptr<StreamOp> op);
  // Whether a pull should ask for shared memory: once a stream, if asked
  // to.
  bool AskOffer();
  // The shared region's `part`, taken for one op of `values` float32
  // values; null when there is none, the part is smaller, or it is in use.
  std::unique_ptr<SharedPart> TakeShared(SharedRegion::Part part,
                                         int64_t values);
  // Some op still has messages to write.
  bool writing();
  // Half-closes once everything queued is written.
  void CloseWrites();
  // Writes the next message if none is being written.
  void Kick();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // The shard's offer (alone in its message): maps it if it can, and
  // tells the shard either way before writing anything else.
  absl::Status TakeOffer();
  // Weights that lie in the region's pull part are read from there.
  absl::Status UseSharedChunk();

  std::shared_ptr<InFlightCalls> in_flight_;
  std::shared_ptr<ShardStreamSlot> slot_;
  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  StreamSharing sharing_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<StreamOp>> writes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<StreamOp>> answers_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer out_;  // written by one writer at a time (writing_)
  // The reader's (one read at a time).
  grpc::ByteBuffer resp_bytes_;
  WireMessage in_;
};

// One shard's part of a push on its Exchange stream. Offers may come from
// the feed's threads while the stream's writer reads its messages
// (PushMessages is thread-safe).
class PushOp final : public StreamOp, public FedPart {
 public:
  // `slot`: the stream's; `ctx`: the stream's context, for the work (a
  // Cancel cancels the stream); `shared`: the region's push part, taken
  // for this push (or null).
  PushOp(std::shared_ptr<ShardWork> work, int part,
         const std::shared_ptr<InFlightCalls>& in_flight,
         const ParamClientOptions& o, const PushInfo& info, bool commit,
         const float* grads, int64_t offset, int64_t count, bool fed,
         std::shared_ptr<ShardStreamSlot> slot, grpc::ClientContext* ctx,
         std::unique_ptr<SharedPart> shared);

  int64_t begin() const { return messages_.begin(); }
  int64_t end() const { return messages_.end(); }

  bool Next(grpc::ByteBuffer* out) override { return messages_.Next(out); }
  bool written() const override { return messages_.done(); }
  absl::Status Answer(const WireMessage& msg, bool* done) override;
  void Fail(const absl::Status& s) override;

  void Offer(int64_t b, int64_t e) override;
  void Release(bool complete) override;

 private:
  std::shared_ptr<ShardWork> work_;
  const int part_;
  const std::unique_ptr<SharedPart> shared_;  // the region's push part, or null
  PushMessages messages_;
  std::shared_ptr<ShardStreamSlot> slot_;
  grpc::ClientContext* ctx_;  // the stream's, for the work (Cancel)
};

// One shard's part of a pull on its Exchange stream. Used by the stream's
// writer and reader, under the stream's order.
class PullOp final : public StreamOp {
 public:
  // `shared`: the stream's region, its pull part taken for this pull (or
  // null); `ask`: the pull asks for one.
  PullOp(std::shared_ptr<ShardWork> work, int part, v1::PullRequest req,
         float* params, int64_t num_params, int64_t offset, int64_t count,
         std::shared_ptr<std::string> buffers, grpc::ClientContext* ctx,
         std::unique_ptr<SharedPart> shared, bool ask);

  bool Next(grpc::ByteBuffer* out) override;
  bool written() const override { return sent_; }
  absl::Status Answer(const WireMessage& msg, bool* done) override;
  void Fail(const absl::Status& s) override;

 private:
  std::shared_ptr<ShardWork> work_;
  const int part_;
  PullDecoder decoder_;
  grpc::ClientContext* ctx_;  // the stream's, for the work (Cancel)
  const std::unique_ptr<SharedPart> shared_;  // the region's pull part, or null
  grpc::ByteBuffer request_;
  bool sent_ = false;  // the writer's (under the stream's lock)
};

}  // namespace internal
}  // namespace tally

#endif  // TALLY_WORKER_INTERNAL_EXCHANGE_STREAM_H_
