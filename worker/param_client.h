// The worker's side of the data plane: pushes a step's gradient to, and
// pulls a version's weights from, every shard of a job, all shards in
// parallel, over one channel per shard (the job's ShardMap says which shard
// holds which range of the flat vector).
//
// Every operation is asynchronous and returns a Work handle, in the manner
// of c10d's Work: it starts at once, Wait() blocks with a deadline, Cancel()
// stops it. Nothing runs on threads of our own: the RPCs are gRPC callback
// reactors, so an operation costs no thread hand-off and a pull can be in
// flight while the device computes.
//
// By default (options.exchange) every shard has one long-lived Exchange
// stream for all of a job's pushes and pulls, answered in order, so no
// call is set up per step. A stream lives until half its deadline
// (options.stream_lifetime) and is then retired between exchanges. When a
// stream ends under an exchange (the shard restarted, the connection
// broke, an answer was refused), that exchange fails with the stream's
// status and the next one opens a new stream. Cancelling a Work cancels
// the streams its parts are on, and so whatever else is in flight on them
// (in a job runner, nothing else is).
//
//   ParameterClient client(map, num_params, "coord:7070", options);
//   auto pull = client.Pull(step, params);            // in flight
//   ... compute ...
//   absl::StatusOr<int64_t> v = pull->WaitVersion(absl::Now() + timeout);
//   auto push = client.Push(header, grads);
//   absl::Status s = push->Wait(absl::Now() + timeout);
//
// Errors are those of proto/tally.proto's ParameterService, with their
// ErrorReason (proto/errors.h); when shards answer differently, the first
// failure to arrive is the result (a pull's other RPCs are then cancelled:
// the pull is redone whole). A pull whose shards answer different versions
// fails with kAborted (pull again), unless options.mixed_versions (ssp,
// async): then its version is the oldest of them.
//
// Thread-safety: a ParameterClient may be used from any thread; the buffers
// given to Pull and Push are borrowed until their Work is done (Wait
// returned anything but kDeadlineExceeded, or Cancel and Wait).
#ifndef TALLY_WORKER_PARAM_CLIENT_H_
#define TALLY_WORKER_PARAM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "worker/internal/waits.h"

namespace grpc {
class ByteBuffer;
class Channel;
class ClientContext;
template <class RequestType, class ResponseType>
class TemplatedGenericStub;
}  // namespace grpc

namespace tally {

// One asynchronous operation over every shard of a job: the handle its
// caller holds, an interface as c10d's Work is. Its completion (each
// shard's part starting, arriving, ending) is the implementation's own
// (internal::ShardWork, worker/internal/shard_work.h), not part of this
// contract.
class Work {
 public:
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work() = default;

  // Blocks until every shard answered, or `deadline`: then
  // kDeadlineExceeded, and the work goes on (Cancel it, or wait again).
  virtual absl::Status Wait(absl::Time deadline) = 0;
  // A pull's version, once Wait returned OK.
  virtual absl::StatusOr<int64_t> WaitVersion(absl::Time deadline) = 0;
  // A pull's params[begin, end) have arrived (each shard sends its range
  // from its start): OK then, even while later chunks are on their way;
  // the pull's error if it failed; kDeadlineExceeded at `deadline`. Lets a
  // forward pass start on the first layers before the last have arrived.
  virtual absl::Status WaitRange(int64_t begin, int64_t end,
                                 absl::Time deadline) = 0;
  // Cancels every RPC still running; Wait then returns promptly.
  virtual void Cancel() = 0;
  virtual bool Done() const = 0;
  // Each shard's answer, in shard map order, once done.
  virtual std::vector<absl::Status> Results() const = 0;
  // A push that asked to be its own commit (PushInfo.commit): whether every
  // shard answered OK and recorded the commit, once done.
  virtual bool Committed() const = 0;

 protected:
  Work() = default;
};

// The transports, one a file under worker/internal/: the Work's completion
// (shard_work.h), the codec (codec.h), a call a part (unary_calls.h), the
// Exchange stream (exchange_stream.h) and its shared memory
// (shared_memory.h).
namespace internal {
class ShardWork;
// Pushes and pulls are written and read as raw bytes (the .proto's wire,
// proto/tensor_chunk.h), so they go through a generic stub.
using RawStub = grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>;
// Calls whose reactor has not finished deleting itself (shard_work.h).
struct InFlightCalls;
class FedPart;
class ShardStream;
class StreamOp;
struct ShardStreamSlot;
}  // namespace internal

struct ParamClientOptions {
  std::string job_id;
  std::string worker_id;
  int64_t incarnation = 0;
  v1::DType dtype = v1::FLOAT32;
  int64_t chunk_elements = 262144;  // push chunks (1 MiB of float32)
  // How long a pull may wait on a shard for its version (the server's
  // bound); the RPC's own deadline is this plus rpc_timeout.
  absl::Duration pull_wait = internal::kDefaultPullWait;
  absl::Duration rpc_timeout = internal::kDefaultRpcTimeout;
  // The worker's view of the schedule, sent with pulls (0: no claim).
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  int64_t plan = 0;  // the job's plan it follows (Schedule.plan)
  std::string data_fingerprint;  // PullRequest.data_fingerprint
  // The placement the shard map is of (ShardMap.version), named in every
  // push and pull: a shard of another placement answers NOT_FOUND instead
  // of taking a step of a job that was placed again (and perhaps rolled
  // back) since. Create sets it from the map; 0: any placement.
  int64_t map_version = 0;
  // Whether a pull may get different versions from different shards (its
  // version is then the oldest): ssp and async jobs.
  bool mixed_versions = false;
  // How shards are dialled (TLS, token).
  TransportOptions transport;
  // Pushes and pulls go on one long-lived Exchange stream per shard (no
  // call set up per step); false: a PushGradients and a PullWeights call
  // each. A stream is replaced once it is half this old (its deadline).
  bool exchange = true;
  absl::Duration stream_lifetime = absl::Minutes(10);
  // How long the client's destructor waits for the calls it started to
  // end. Every call has a deadline, so they do; the bound is for a stuck
  // library.
  absl::Duration close_wait = absl::Minutes(5);
  // On an Exchange stream, ask the shard for memory to share
  // (proto/shared_memory.h): a shard on this host then takes pushes and
  // gives pulls through it, not through loopback TCP. Where it cannot be
  // mapped (another host or container), the stream goes on as before.
  bool shared_memory = true;
};

// What a push says besides its gradient.
struct PushInfo {
  int64_t step = 0;
  int64_t samples = 0;  // 0: nothing to contribute (grads unused)
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t base_version = -1;  // the version it was computed from; -1: step
  // The push is its own commit (PushHeader.commit), so the next pull need
  // not wait for its answer. Honoured for a one-shard map only (a push
  // that reached its one shard reached them all); ignored otherwise.
  bool commit = false;
  // A Python model's buffers after the step (PushHeader.buffers), sent to
  // the shard whose range starts the vector; null: none. Borrowed until
  // Push returns (the header is encoded there).
  const std::string* buffers = nullptr;
};

// The gradient of a push still being produced (ParameterClient::Push with
// a feed): each range is offered once it is final, in any order, and every
// shard's part of the push sends what falls in its range as it comes (the
// first message with the header), so the push overlaps the backward pass
// that produces it. A part ends its stream once its whole range was
// offered. Thread-safe; offers may come from several threads at once.
class PushFeed {
 public:
  PushFeed(const PushFeed&) = delete;
  PushFeed& operator=(const PushFeed&) = delete;
  // Close().
  ~PushFeed();

  // grads[begin, end) is final: sent by the parts whose ranges it meets.
  // Each element is offered once.
  void Offer(int64_t begin, int64_t end);
  // No more offers. A part whose range was not all offered is cancelled
  // (its Work result is kCancelled; the shard stages nothing of it).
  void Close();

 private:
  friend class ParameterClient;
  PushFeed() = default;
  struct Part {
    internal::FedPart* part;  // alive while `remaining` > 0 (held open)
    std::shared_ptr<internal::FedPart> keep;  // or kept alive by this
    int64_t begin, end;
    int64_t remaining;
  };
  absl::Mutex mu_;
  std::vector<Part> parts_ ABSL_GUARDED_BY(mu_);
};

class ParameterClient {
 public:
  // Checks that `map` covers [0, num_params) exactly once, in order
  // (kInvalidArgument otherwise), and dials each shard; an entry with an
  // empty address is `coordinator`, the address the worker reached the
  // coordinator at.
  static absl::StatusOr<std::unique_ptr<ParameterClient>> Create(
      const v1::ShardMap& map, int64_t num_params,
      const std::string& coordinator, const ParamClientOptions& options);
  ParameterClient(const ParameterClient&) = delete;
  ParameterClient& operator=(const ParameterClient&) = delete;
  // Waits until every call it started has ended (each has a deadline).
  ~ParameterClient();

  int num_shards() const { return static_cast<int>(shards_.size()); }

  // Pulls version >= min_version of every shard's range into
  // params[0, num_params). With `commit`, tells every shard that the push
  // of commit->step reached them all (see PullRequest.commit). With a
  // `clock` (>= 0), each shard also waits as the job's consistency rule
  // says for a worker about to compute that step (PullRequest.clock).
  // With `buffers`, the buffer region the shard at offset 0 sends with the
  // weights (PullResponse.buffers) is written there, before the range's
  // first values arrive (WaitRange); left as it is when that shard sends
  // none. Held by the pull (a cancelled one may still write it): give each
  // pull its own.
  std::shared_ptr<Work> Pull(int64_t min_version, float* params,
                             const v1::StepCommit* commit = nullptr,
                             int64_t clock = -1,
                             std::shared_ptr<std::string> buffers = nullptr);
  // Pushes grads[0, num_params) (unused when info.samples == 0), each shard
  // its range, for step info.step computed from version info.base_version
  // (-1: from version info.step). With `feed`, nothing of the gradient is
  // sent until offered through the PushFeed set there (see PushFeed; the
  // work is not done before the feed has offered everything or closed).
  std::shared_ptr<Work> Push(const PushInfo& info, const float* grads,
                             std::unique_ptr<PushFeed>* feed = nullptr);

 private:
  using RawStub = internal::RawStub;
  using ShardStream = internal::ShardStream;
  using ShardStreamSlot = internal::ShardStreamSlot;
  using StreamOp = internal::StreamOp;
  struct Shard {
    std::string address;
    int64_t offset = 0;
    int64_t count = 0;
    std::unique_ptr<RawStub> stub;
    // The Exchange stream now in use (options.exchange), guarded by
    // streams_mu_; null until the first exchange.
    std::shared_ptr<ShardStreamSlot> slot;
  };
  ParameterClient(int64_t num_params, const ParamClientOptions& options);
  // The shard's current stream, in use until its slot's Unuse (a new one
  // if there is none, it ended or it is old); null if a new one ended at
  // once.
  ShardStream* UseStream(Shard& s, std::shared_ptr<ShardStreamSlot>* slot);
  // Queues the op `make` builds on shard `s`'s stream for part `part` of
  // `work`, or fails that part if no stream can be had.
  using MakeOp = std::function<std::shared_ptr<StreamOp>(
      ShardStream*, const std::shared_ptr<ShardStreamSlot>&)>;
  void OnStream(Shard& s, internal::ShardWork* work, int part,
                const MakeOp& make);
  // Asks nothing more of a stream: it ends once all it was asked is
  // answered.
  static void Retire(const std::shared_ptr<ShardStreamSlot>& slot);

  using InFlight = internal::InFlightCalls;

  const int64_t num_params_;
  const ParamClientOptions options_;
  absl::Mutex streams_mu_;  // guards each Shard's slot
  std::vector<Shard> shards_;
  std::shared_ptr<InFlight> in_flight_;
};

}  // namespace tally

#endif  // TALLY_WORKER_PARAM_CLIENT_H_
