// One push as a shard takes it, message by message: the data plane's push
// object, which the services' reactors hand their messages to (they only
// frame them). It is begun by the header (checked once against the shard:
// the job's range here, the member, the step; a finite loss; a push
// already counted is answered at once as a duplicate), takes each chunk
// (checked against the range, its values decoded from gRPC's slices
// straight into the staging buffer, NaNs and infinities found on the way),
// and is finished (the staged push handed to the shard, or the streamed
// one closed; its answer) or aborted (nothing of it counts; its staging
// buffer goes back at once). Coverage is its own: a push that does not
// cover its range is refused at Finish.
//
// Where the shard sums pushes as they arrive (ParameterShard::
// StreamsPushes), nothing is staged: each chunk is decoded a block at a
// time and added to the step's sum. A block whose turn has not come (a
// lower rank has not added that range yet) leaves the session waiting():
// its reader stops reading until `wake` is called, then calls Resume with
// the same message.
//
// Not thread-safe: one reactor's (its reading side's).
#ifndef TALLY_SERVER_DATA_PUSH_SESSION_H_
#define TALLY_SERVER_DATA_PUSH_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/tally.pb.h"
#include "proto/tensor_chunk.h"
#include "server/data/internal/intervals.h"
#include "server/data/shard_host.h"

namespace tally {

class PushSession {
 public:
  // `wake` may be called from any thread, once per wait (and spuriously).
  PushSession(ShardHost* host, std::function<void()> wake);
  PushSession(const PushSession&) = delete;
  PushSession& operator=(const PushSession&) = delete;
  ~PushSession();

  // The header and chunk of one message (`msg` parsed with the chunk as
  // field 2, the header as field 1: PushRequest's and ExchangeRequest's
  // layout). A non-OK status is the push's answer: it has ended, nothing
  // of it staged.
  absl::Status Take(const WireMessage& msg);

  // A block of the last message's chunk waits for its turn.
  bool waiting() const { return waiting_; }
  // Tries the waiting block again (`msg`: the message given to Take).
  absl::Status Resume(const WireMessage& msg);

  // The push was already counted (a duplicate): its answer is ready, the
  // rest of it is ignored.
  bool answered() const { return answered_; }

  // The end of the push: stages it whole, or says why not.
  absl::StatusOr<v1::PushResponse> Finish();

  // The push ends without counting: the staging buffer goes back as soon
  // as the push is decided, not when gRPC finally retires the call. (A
  // streamed push the shard summed part of is dropped with its member's
  // next push or the shard's sum reset: ParameterShard.)
  void Abort();

  // For the metrics.
  bool duplicate() const { return resp_.duplicate(); }
  double bytes() const { return bytes_; }
  absl::Time started() const { return started_; }

 private:
  absl::Status Consume(const WireMessage& msg);

  // The header, checked once: the job's range here, the member, the step,
  // a finite loss. A push already counted is answered at once (duplicate).
  absl::Status Begin(const v1::PushHeader& h);

  // A chunk: checked against the range, then staged or summed.
  absl::Status AddChunk(const WireMessage& msg);

  // Streamed: the chunk's values from chunk_next_ on, a block at a time,
  // into the step's sum, until one must wait.
  absl::Status AddBlocks(const WireMessage& msg);

  // Values [from, from + n) of the message's chunk into `dst`; the index of
  // the first non-finite one (from the chunk's start), or -1. Values up to
  // it are decoded.
  static int64_t Decode(const WireMessage& msg, int64_t from, int64_t n,
                        float* dst);

  // A push that is its own commit (PushHeader.commit) is committed once it
  // is staged (or was already: a duplicate), ...
  void CommitIfAsked();
  // ... and as nothing once it is refused. (The refusal is an error status,
  // which carries no response: the worker commits it as nothing again with
  // its next pull, which changes nothing if this commit was recorded.)
  void RejectAndCommit();

  ShardHost* host_;  // borrowed
  const absl::Time started_ = absl::Now();
  double bytes_ = 0;  // tensor bytes received
  v1::PushResponse resp_;
  bool has_header_ = false;
  bool self_commit_ = false;  // PushHeader.commit
  bool answered_ = false;
  PushMeta meta_;
  Range range_;
  std::shared_ptr<ParameterShard> shard_;
  std::unique_ptr<std::vector<float>> staging_;  // from the shard's pool
  internal::Intervals coverage_;
  // Streamed.
  static constexpr int64_t kBlock = 65536;  // values added at a time
  std::function<void()> wake_;
  bool streamed_ = false;
  int64_t token_ = 0;  // BeginStreamed's
  bool waiting_ = false;
  int64_t chunk_next_ = 0;   // of the current chunk: values added so far
  int64_t block_from_ = -1;  // block_ holds values from here on (-1: none)
  std::vector<float> block_;
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_PUSH_SESSION_H_
