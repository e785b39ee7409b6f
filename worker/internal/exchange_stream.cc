#include "worker/internal/exchange_stream.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "worker/internal/shard_work.h"

namespace tally {
namespace internal {

namespace {

constexpr char kExchangeMethod[] = "/tally.v1.ParameterService/Exchange";

}  // namespace

// ----------------------------------------------------------- the stream --

ShardStream::ShardStream(RawStub* stub,
                         std::shared_ptr<InFlightCalls> in_flight,
                         absl::Duration lifetime,
                         std::shared_ptr<ShardStreamSlot> slot, bool share)
    : in_flight_(std::move(in_flight)),
      slot_(std::move(slot)),
      sharing_(share) {
  {
    absl::MutexLock lock(&slot_->mu);
    slot_->stream = this;
    slot_->opened = absl::Now();
  }
  ctx_.set_deadline(absl::ToChronoTime(absl::Now() + lifetime));
  stub->PrepareBidiStreamingCall(&ctx_, kExchangeMethod, grpc::StubOptions(),
                                 this);
  AddHold();  // the slot's: released by Shut or the stream's end
  StartRead(&resp_bytes_);
  StartCall();
}

void ShardStream::Add(std::shared_ptr<StreamOp> op) {
  {
    absl::MutexLock lock(&mu_);
    writes_.push_back(op);
    answers_.push_back(std::move(op));
  }
  Kick();
}

bool ShardStream::AskOffer() {
  absl::MutexLock lock(&mu_);
  return sharing_.Ask();
}

std::unique_ptr<SharedPart> ShardStream::TakeShared(SharedRegion::Part part,
                                                    int64_t values) {
  absl::MutexLock lock(&mu_);
  return sharing_.Take(part, values);
}

bool ShardStream::writing() {
  absl::MutexLock lock(&mu_);
  return !writes_.empty();
}

void ShardStream::CloseWrites() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  Kick();
}

void ShardStream::Kick() {
  bool write = false, done = false;
  {
    absl::MutexLock lock(&mu_);
    if (writing_ || writes_done_) return;
    // The reply to an offer goes before anything that may use the region.
    if (sharing_.TakeReply(&out_)) write = writing_ = true;
    while (!write && !writes_.empty()) {
      if (writes_.front()->Next(&out_)) {
        write = writing_ = true;
        break;
      }
      if (!writes_.front()->written()) break;  // a fed push, waiting
      writes_.pop_front();
    }
    if (!write && writes_.empty() && closing_) done = writes_done_ = true;
  }
  if (write) StartWrite(&out_);
  if (done) StartWritesDone();
}

void ShardStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    out_.Clear();  // lets go of a lent gradient as soon as gRPC does
    if (!ok) {
      writes_done_ = true;  // the stream is over: OnDone says why
      return;
    }
  }
  Kick();
}

void ShardStream::OnReadDone(bool ok) {
  if (!ok) {
    // The stream is over (the shard finished it, or it broke): no more
    // ops, and the slot's hold goes so that OnDone can report why.
    slot_->Shut();
    return;
  }
  // ExchangeResponse: 1 version, 2 total_steps, 3 chunk, 4 push.
  std::shared_ptr<StreamOp> op;
  {
    absl::MutexLock lock(&mu_);
    if (!answers_.empty()) op = answers_.front();
  }
  absl::Status s = in_.Parse(resp_bytes_, 3);
  bool done = false;
  if (s.ok() && in_.has(5)) {  // ExchangeResponse: 5 shared
    s = TakeOffer();
    if (s.ok()) {
      StartRead(&resp_bytes_);
      return;
    }
  } else if (s.ok() && in_.has(3) && in_.chunk().shared) {
    s = UseSharedChunk();
  }
  if (!s.ok()) {
    if (!absl::IsDataLoss(s)) {
      s = absl::DataLossError(
          absl::StrCat("malformed answer from the shard: ", s.message()));
    }
  } else if (op == nullptr) {
    s = absl::DataLossError("an answer from the shard to nothing asked");
  } else {
    s = op->Answer(in_, &done);
  }
  if (!s.ok()) {
    // What follows cannot be trusted: the stream ends, and every op
    // waiting on it fails with this.
    {
      absl::MutexLock lock(&mu_);
      error_ = s;
    }
    ctx_.TryCancel();
    slot_->Shut();  // no read follows: the stream ends here
    return;
  }
  if (done) {
    absl::MutexLock lock(&mu_);
    answers_.pop_front();
  }
  StartRead(&resp_bytes_);
}

void ShardStream::OnDone(const grpc::Status& status) {
  std::deque<std::shared_ptr<StreamOp>> waiting;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(answers_);
    writes_.clear();
    s = !error_.ok() ? error_ : FromGrpc(status);
  }
  if (s.ok()) {
    s = absl::UnavailableError("the stream ended before the shard answered");
  }
  for (const auto& op : waiting) op->Fail(s);
  waiting.clear();
  {
    absl::MutexLock lock(&slot_->mu);
    slot_->stream = nullptr;
    slot_->open = false;
  }
  std::shared_ptr<InFlightCalls> in_flight = std::move(in_flight_);
  delete this;
  in_flight->Done();
}

absl::Status ShardStream::TakeOffer() {
  v1::SharedMemoryOffer offer;
  if (in_.has(3) || in_.has(4) || !offer.ParseFromString(in_.bytes(5))) {
    return absl::DataLossError("a malformed shared memory offer");
  }
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(sharing_.Offered());
    // Nothing more will be written: no reply, no use for a region.
    if (writes_done_) return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<SharedRegion>> mapped =
      SharedRegion::Map(offer);
  {
    absl::MutexLock lock(&mu_);
    sharing_.Answer(std::move(mapped));
  }
  Kick();
  return absl::OkStatus();
}

absl::Status ShardStream::UseSharedChunk() {
  std::shared_ptr<SharedRegion> region;
  {
    absl::MutexLock lock(&mu_);
    region = sharing_.region();
  }
  return UseSharedPull(region.get(), &in_);
}

// ------------------------------------------------------------- the slot --

ShardStream* ShardStreamSlot::Use() {
  absl::MutexLock lock(&mu);
  if (!open || stream == nullptr) return nullptr;
  ++users;
  return stream;
}

void ShardStreamSlot::Unuse() {
  ShardStream* release = nullptr;
  {
    absl::MutexLock lock(&mu);
    --users;
    if (!open && users == 0 && !released && stream != nullptr) {
      released = true;
      release = stream;
    }
  }
  if (release != nullptr) release->RemoveHold();
}

void ShardStreamSlot::Shut() {
  ShardStream* release = nullptr;
  {
    absl::MutexLock lock(&mu);
    open = false;
    if (users == 0 && !released && stream != nullptr) {
      released = true;
      release = stream;
    }
  }
  if (release != nullptr) release->RemoveHold();
}

// ------------------------------------------------------------------ ops --

PushOp::PushOp(std::shared_ptr<ShardWork> work, int part,
               const std::shared_ptr<InFlightCalls>& in_flight,
               const ParamClientOptions& o, const PushInfo& info, bool commit,
               const float* grads, int64_t offset, int64_t count, bool fed,
               std::shared_ptr<ShardStreamSlot> slot, grpc::ClientContext* ctx,
               std::unique_ptr<SharedPart> shared)
    : work_(std::move(work)),
      part_(part),
      shared_(std::move(shared)),
      messages_(work_, in_flight, o, info, commit, grads, offset, count,
                PushDone(), shared_ != nullptr ? shared_->region() : nullptr),
      slot_(std::move(slot)),
      ctx_(ctx) {
  if (!fed) messages_.Queue(messages_.begin(), messages_.end());
}

absl::Status PushOp::Answer(const WireMessage& msg, bool* done) {
  v1::PushResponse resp;
  if (!msg.has(4) || msg.has(3) || !resp.ParseFromString(msg.bytes(4))) {
    return absl::DataLossError("a malformed push answer from the shard");
  }
  if (shared_ != nullptr) shared_->Give();  // the shard has read them
  work_->Finished(part_, ctx_, absl::OkStatus(), resp.version(),
                  /*cancel_others=*/false, resp.committed());
  *done = true;
  return absl::OkStatus();
}

void PushOp::Fail(const absl::Status& s) {
  messages_.Drop();  // whoever still holds the op, the gradient goes
  if (shared_ != nullptr) shared_->Give();
  work_->Finished(part_, ctx_, s, -1, /*cancel_others=*/false);
}

void PushOp::Offer(int64_t b, int64_t e) {
  messages_.Queue(b, e);
  if (ShardStream* st = slot_->Use()) {
    st->Kick();
    slot_->Unuse();
  }
}

void PushOp::Release(bool complete) {
  if (complete) return;
  // Half a push cannot be taken back on the stream: the stream goes,
  // and the shard drops the push with it (nothing of it staged).
  if (ShardStream* st = slot_->Use()) {
    st->context()->TryCancel();
    slot_->Unuse();
  }
}

PullOp::PullOp(std::shared_ptr<ShardWork> work, int part, v1::PullRequest req,
               float* params, int64_t num_params, int64_t offset,
               int64_t count, std::shared_ptr<std::string> buffers,
               grpc::ClientContext* ctx, std::unique_ptr<SharedPart> shared,
               bool ask)
    : work_(std::move(work)),
      part_(part),
      decoder_(params, num_params, offset, count, std::move(buffers)),
      ctx_(ctx),
      shared_(std::move(shared)) {
  if (ask) req.set_offer_shared_memory(true);
  if (shared_ != nullptr) req.set_into_shared_memory(true);
  // ExchangeRequest: 4 pull.
  grpc::Slice slice(LengthDelimitedField(4, req.SerializeAsString()));
  request_ = grpc::ByteBuffer(&slice, 1);
}

bool PullOp::Next(grpc::ByteBuffer* out) {
  if (sent_) return false;
  *out = request_;
  sent_ = true;
  return true;
}

absl::Status PullOp::Answer(const WireMessage& msg, bool* done) {
  if (msg.has(4)) {
    return absl::DataLossError("a push answer where weights belong");
  }
  TALLY_RETURN_IF_ERROR(decoder_.Take(msg));
  work_->Arrived(part_, decoder_.contiguous());
  if (decoder_.complete()) {
    if (shared_ != nullptr) shared_->Give();  // copied out
    work_->Finished(part_, ctx_, absl::OkStatus(), decoder_.version(),
                    /*cancel_others=*/true);
    *done = true;
  }
  return absl::OkStatus();
}

void PullOp::Fail(const absl::Status& s) {
  if (shared_ != nullptr) shared_->Give();
  work_->Finished(part_, ctx_, s, decoder_.version(),
                  /*cancel_others=*/true);
}

}  // namespace internal
}  // namespace tally
