#include "worker/internal/unary_calls.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "worker/internal/codec.h"
#include "worker/internal/shard_work.h"

namespace tally {
namespace internal {

namespace {

constexpr char kPushMethod[] = "/tally.v1.ParameterService/PushGradients";
constexpr char kPullMethod[] = "/tally.v1.ParameterService/PullWeights";

// One shard's part of a push as a PushGradients call: its messages, each
// written when the previous one is on its way, then the answer. A fed call
// holds itself open (AddHold) until its feed has offered its whole range
// or closed.
class PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public FedPart {
 public:
  PushCall(std::shared_ptr<ShardWork> work, int part,
           std::shared_ptr<InFlightCalls> in_flight, RawStub* stub,
           const ParamClientOptions& o, const PushInfo& info, bool commit,
           const float* grads, int64_t offset, int64_t count, bool fed)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        messages_(work_, in_flight_, o, info, commit, grads, offset, count,
                  std::string()) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
    work_->Started(&ctx_);
    stub->PrepareBidiStreamingCall(&ctx_, kPushMethod, grpc::StubOptions(),
                                   this);
    fed_ = fed && messages_.end() > messages_.begin();
  }

  // Whether a feed offers this call its range: then it is held open until
  // the feed's Release. Read before Start (after it, a call that is not
  // held may be gone).
  bool fed() const { return fed_; }

  void Start() {
    if (fed_) {
      AddHold();  // released by the feed (Release)
    } else {
      messages_.Queue(messages_.begin(), messages_.end());
      messages_.Next(&msg_);  // the header (and the first chunk, if any)
      {
        absl::MutexLock lock(&mu_);
        writing_ = true;
      }
      StartWrite(&msg_);
    }
    StartRead(&resp_bytes_);
    StartCall();
  }

  void Offer(int64_t b, int64_t e) override {
    messages_.Queue(b, e);
    WriteIfIdle();
  }
  void Release(bool complete) override {
    if (!complete) ctx_.TryCancel();
    RemoveHold();
  }

  void OnWriteDone(bool ok) override {
    // A failed write ends the call; OnDone reports why.
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    WriteIfIdle();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // no response: the status says why
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (resp_bytes_.Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices)
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
    if (!resp_.ParseFromString(bytes)) {
      error_ = absl::DataLossError("malformed push response from the shard");
    }
    answered_ = true;
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = FromGrpc(status);
    if (s.ok() && !error_.ok()) s = error_;
    if (s.ok() && !answered_) {
      s = absl::DataLossError("the shard ended the push without an answer");
    }
    work_->Finished(part_, &ctx_, s, resp_.version(),
                    /*cancel_others=*/false, resp_.committed());
    std::shared_ptr<InFlightCalls> in_flight = std::move(in_flight_);
    delete this;  // lets go of the lent slices: the work may end now
    in_flight->Done();
  }

 private:
  // Writes the next message if none is being written; after the last,
  // half-closes. Decided under the lock, written after it (a write may
  // complete, and OnWriteDone run, inside StartWrite).
  void WriteIfIdle() {
    bool write = false, last = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || closed_) return;
      if (messages_.Next(&msg_)) {
        write = writing_ = true;
      } else if (messages_.done()) {
        last = closed_ = true;
        msg_.Clear();
      }
    }
    if (write) StartWrite(&msg_);
    if (last) StartWritesDone();
  }

  std::shared_ptr<ShardWork> work_;
  std::shared_ptr<InFlightCalls> in_flight_;
  const int part_;
  bool fed_ = false;
  grpc::ClientContext ctx_;
  PushMessages messages_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer msg_;  // written by one writer at a time (writing_)
  grpc::ByteBuffer resp_bytes_;
  v1::PushResponse resp_;
  bool answered_ = false;
  absl::Status error_;
};

// One shard's part of a pull as a PullWeights call.
class PullCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PullCall(std::shared_ptr<ShardWork> work, int part,
           std::shared_ptr<InFlightCalls> in_flight, RawStub* stub,
           const ParamClientOptions& o, const v1::PullRequest& req,
           float* params, int64_t num_params, int64_t offset, int64_t count,
           std::shared_ptr<std::string> buffers)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        decoder_(params, num_params, offset, count, std::move(buffers)) {
    ctx_.set_deadline(
        absl::ToChronoTime(absl::Now() + o.pull_wait + o.rpc_timeout));
    grpc::Slice slice(req.SerializeAsString());
    req_bytes_ = grpc::ByteBuffer(&slice, 1);
    work_->Started(&ctx_);
    stub->PrepareBidiStreamingCall(&ctx_, kPullMethod, grpc::StubOptions(),
                                   this);
    StartWriteLast(&req_bytes_, grpc::WriteOptions());
    StartRead(&resp_bytes_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    // PullResponse: 1 version, 2 total_steps, 3 chunk.
    absl::Status bad = msg_.Parse(resp_bytes_, 3);
    if (bad.ok()) {
      bad = decoder_.Take(msg_);
      if (bad.ok()) work_->Arrived(part_, decoder_.contiguous());
    } else {
      bad = absl::DataLossError(
          absl::StrCat("malformed weights from the shard: ", bad.message()));
    }
    if (!bad.ok()) {
      error_ = bad;
      ctx_.TryCancel();
      return;
    }
    StartRead(&resp_bytes_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = !error_.ok() ? error_ : FromGrpc(status);
    if (s.ok()) s = decoder_.Result();
    work_->Finished(part_, &ctx_, s, decoder_.version(),
                    /*cancel_others=*/true);
    std::shared_ptr<InFlightCalls> in_flight = std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  std::shared_ptr<ShardWork> work_;
  std::shared_ptr<InFlightCalls> in_flight_;
  const int part_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  WireMessage msg_;
  PullDecoder decoder_;
  absl::Status error_;
};

}  // namespace

FedPart* StartPushCall(std::shared_ptr<ShardWork> work, int part,
                       std::shared_ptr<InFlightCalls> in_flight,
                       RawStub* stub, const ParamClientOptions& o,
                       const PushInfo& info, bool commit, const float* grads,
                       int64_t offset, int64_t count, bool fed) {
  in_flight->Add();
  auto* call = new PushCall(std::move(work), part, std::move(in_flight), stub,
                            o, info, commit, grads, offset, count, fed);
  const bool held = call->fed();
  call->Start();
  return held ? call : nullptr;
}

void StartPullCall(std::shared_ptr<ShardWork> work, int part,
                   std::shared_ptr<InFlightCalls> in_flight, RawStub* stub,
                   const ParamClientOptions& o, const v1::PullRequest& req,
                   float* params, int64_t num_params, int64_t offset,
                   int64_t count, std::shared_ptr<std::string> buffers) {
  in_flight->Add();
  new PullCall(std::move(work), part, std::move(in_flight), stub, o, req,
               params, num_params, offset, count, std::move(buffers));
}

}  // namespace internal
}  // namespace tally
