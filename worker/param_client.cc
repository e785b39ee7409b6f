#include "worker/param_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/shared_memory.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"

namespace tally {

// ----------------------------------------------------------------- Work --

namespace internal {

// The Work of one push or pull: the caller's side (Work's interface) and
// the completion side its parts call as they start, arrive and end.
// Thread-safe.
class ShardWork final : public Work {
 public:
  explicit ShardWork(int parts, bool mixed_ok = false);

  absl::Status Wait(absl::Time deadline) override;
  absl::StatusOr<int64_t> WaitVersion(absl::Time deadline) override;
  absl::Status WaitRange(int64_t begin, int64_t end,
                         absl::Time deadline) override;
  void Cancel() override;
  bool Done() const override;
  std::vector<absl::Status> Results() const override;
  bool Committed() const override;

  // Called once per part, with its context (to cancel it) as it starts and
  // its result as it ends (`committed`: a push's commit was recorded).
  void Started(grpc::ClientContext* ctx);
  void Finished(int part, grpc::ClientContext* ctx, const absl::Status& status,
                int64_t version, bool cancel_others, bool committed = false);
  // A part that failed before it started.
  void Failed(int part, const absl::Status& status);
  // Part `part` of a pull covers [begin, end) of the vector; `upto`: its
  // elements before it have arrived.
  void SetRange(int part, int64_t begin, int64_t end);
  void Arrived(int part, int64_t upto);
  // The caller's buffer is lent to gRPC (a push's slices point into it)
  // until as many Returned() as Lend(): the work is not done before.
  // Returned() may run on any thread, inside gRPC, even one that holds
  // mu_ (a cancel): it takes lent_mu_ only.
  void Lend();
  void Returned();

 private:
  const bool mixed_ok_;  // different versions from different shards are fine
  mutable absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex lent_mu_;
  int lent_ ABSL_GUARDED_BY(lent_mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  int committed_ ABSL_GUARDED_BY(mu_) = 0;  // parts whose commit was recorded
  bool mixed_versions_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  // A pull's parts: their ranges, how far each has arrived, which ended.
  std::vector<std::pair<int64_t, int64_t>> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> arrived_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> ended_ ABSL_GUARDED_BY(mu_);
};

ShardWork::ShardWork(int parts, bool mixed_ok)
    : mixed_ok_(mixed_ok),
      pending_(parts),
      results_(parts),
      ranges_(parts),
      arrived_(parts, 0),
      ended_(parts, false) {}

void ShardWork::SetRange(int part, int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  ranges_[part] = {begin, end};
  arrived_[part] = begin;
}

void ShardWork::Arrived(int part, int64_t upto) {
  absl::MutexLock lock(&mu_);
  arrived_[part] = std::max(arrived_[part], upto);
}

absl::Status ShardWork::WaitRange(int64_t begin, int64_t end,
                                  absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto there = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status_.ok()) return true;
    for (size_t p = 0; p < ranges_.size(); ++p) {
      const auto [b, e] = ranges_[p];
      if (e <= begin || b >= end || ended_[p]) continue;
      if (arrived_[p] < std::min(end, e)) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&there), deadline)) {
    return absl::DeadlineExceededError("the weights did not arrive in time");
  }
  return status_;
}

void ShardWork::Started(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  live_.push_back(ctx);
  if (cancelled_) ctx->TryCancel();
}

void ShardWork::Finished(int part, grpc::ClientContext* ctx,
                         const absl::Status& status, int64_t version,
                         bool cancel_others, bool committed) {
  absl::MutexLock lock(&mu_);
  live_.erase(std::find(live_.begin(), live_.end(), ctx));
  results_[part] = status;
  ended_[part] = true;
  if (status.ok() && committed) ++committed_;
  if (!status.ok()) {
    if (status_.ok()) {
      status_ = status;
      if (cancel_others) {
        for (grpc::ClientContext* c : live_) c->TryCancel();
      }
    }
  } else if (version_ < 0) {
    version_ = version;
  } else if (version_ != version) {
    mixed_versions_ = true;
    version_ = std::min(version_, version);
  }
  --pending_;
}

void ShardWork::Failed(int part, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  results_[part] = status;
  ended_[part] = true;
  if (status_.ok()) status_ = status;
  --pending_;
}

void ShardWork::Lend() {
  absl::MutexLock lock(&lent_mu_);
  ++lent_;
}

void ShardWork::Returned() {
  absl::MutexLock lock(&lent_mu_);
  --lent_;
}

absl::Status ShardWork::Wait(absl::Time deadline) {
  {
    absl::MutexLock lock(&lent_mu_);
    auto returned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lent_mu_) {
      return lent_ == 0;
    };
    if (!lent_mu_.AwaitWithDeadline(absl::Condition(&returned), deadline)) {
      return absl::DeadlineExceededError(
          "gRPC did not let go of the pushed gradient in time");
    }
  }
  absl::MutexLock lock(&mu_);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError("the shards did not answer in time");
  }
  if (!status_.ok()) return status_;
  if (mixed_versions_ && !mixed_ok_) {
    return absl::AbortedError(
        "the shards answered different versions: pull again");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardWork::WaitVersion(absl::Time deadline) {
  if (absl::Status s = Wait(deadline); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return version_;
}

void ShardWork::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : live_) c->TryCancel();
}

bool ShardWork::Done() const {
  {
    absl::MutexLock lock(&lent_mu_);
    if (lent_ != 0) return false;
  }
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

std::vector<absl::Status> ShardWork::Results() const {
  absl::MutexLock lock(&mu_);
  return results_;
}

bool ShardWork::Committed() const {
  absl::MutexLock lock(&mu_);
  return pending_ == 0 && committed_ == static_cast<int>(results_.size());
}

// Calls whose reactor has not finished deleting itself. The client (and so
// its channels) outlives them: a channel whose last reference went with a
// call's context, inside gRPC's callback, crashes gRPC 1.51.
struct InFlightCalls {
  absl::Mutex mu;
  int calls ABSL_GUARDED_BY(mu) = 0;
  void Add() {
    absl::MutexLock lock(&mu);
    ++calls;
  }
  void Done() {
    absl::MutexLock lock(&mu);
    --calls;
  }
};

}  // namespace internal

// ------------------------------------------------------------ the calls --

namespace {

constexpr char kPushMethod[] = "/tally.v1.ParameterService/PushGradients";
constexpr char kPullMethod[] = "/tally.v1.ParameterService/PullWeights";
constexpr char kExchangeMethod[] = "/tally.v1.ParameterService/Exchange";

// ExchangeRequest.push_done = true, appended to a push's last message.
const std::string& PushDone() {
  static const std::string* done = new std::string("\x18\x01", 2);
  return *done;
}

std::string Field(int field, const std::string& body) {
  return LengthDelimitedField(field, body);
}

}  // namespace

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
  PushMessages(const std::shared_ptr<internal::ShardWork>& work,
               const std::shared_ptr<internal::InFlightCalls>& in_flight,
               const ParamClientOptions& o, const PushInfo& info, bool commit,
               const float* grads, int64_t offset, int64_t count,
               std::string last_suffix,
               std::shared_ptr<SharedRegion> shared = nullptr)
      : grads_(grads),
        offset_(offset),
        total_(info.samples == 0 ? 0 : count),
        chunk_(std::max<int64_t>(1, o.chunk_elements)),
        dtype_(o.dtype),
        last_suffix_(std::move(last_suffix)),
        shared_(std::move(shared)) {
    header_.set_job_id(o.job_id);
    header_.set_worker_id(o.worker_id);
    header_.set_incarnation(o.incarnation);
    header_.set_map_version(o.map_version);
    header_.set_step(info.step);
    header_.set_base_version(info.base_version >= 0 ? info.base_version
                                                    : info.step);
    header_.set_samples(info.samples);
    header_.set_loss_sum(info.loss_sum);
    header_.set_correct(info.correct);
    header_.set_commit(commit);
    // The buffer region is the first range's.
    if (info.buffers != nullptr && offset == 0)
      header_.set_buffers(*info.buffers);
    if (shared_ != nullptr) {
      // The region's push part holds the range in float32 (ParameterShard
      // made it so): in either dtype it fits.
      shared_values_ = shared_->data() + shared_->push_at();
    } else if (total_ > 0 && dtype_ == v1::BFLOAT16) {
      // Encoded as offered, into one buffer; the messages are slices of it.
      // Kept here too: an offer may still encode into it after the push
      // failed and let go of its slices.
      encoded_holder_ = std::make_shared<std::vector<uint16_t>>(total_);
      encoded_ = reinterpret_cast<char*>(encoded_holder_->data());
      values_ = SnapshotSlice(encoded_holder_);
    } else if (total_ > 0) {
      values_ = Lend(work, in_flight, grads + offset, sizeof(float) * total_);
    }
  }

  int64_t begin() const { return offset_; }
  int64_t end() const { return offset_ + total_; }

  // Readies grads[b, e) (within the range) for sending; bfloat16 encodes
  // it here (its part of the buffer is this caller's alone until queued).
  void Queue(int64_t b, int64_t e) {
    if (e <= b) return;
    if (shared_values_ != nullptr) {
      char* dst = shared_values_ + width() * (b - offset_);
      if (dtype_ == v1::BFLOAT16) {
        FloatToBfloat16(grads_ + b, dst, e - b);
      } else {
        std::memcpy(dst, grads_ + b, sizeof(float) * (e - b));
      }
    } else if (dtype_ == v1::BFLOAT16) {
      FloatToBfloat16(grads_ + b, encoded_ + 2 * (b - offset_), e - b);
    }
    absl::MutexLock lock(&mu_);
    queued_ += e - b;
    // Adjacent ranges (the layers before and after) make one bucket.
    for (auto& r : ready_) {
      if (r.first == e) {
        r.first = b;
        return;
      }
      if (r.second == b) {
        r.second = e;
        return;
      }
    }
    ready_.push_back({b, e});
  }

  // The next message into `out`, if one is ready; the last one carries
  // `last_suffix`.
  bool Next(grpc::ByteBuffer* out) {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    const bool first = !header_sent_;
    int64_t at = offset_, n = 0;
    if (total_ > 0) {
      auto it = std::find_if(ready_.begin(), ready_.end(), [&](const auto& r) {
        return r.second - r.first >= chunk_;
      });
      if (it == ready_.end() && queued_ == total_ && !ready_.empty())
        it = ready_.begin();
      if (it == ready_.end()) return false;
      auto& [b, e] = *it;
      at = b;
      n = std::min(chunk_, e - b);
      b += n;
      if (b == e) ready_.erase(it);
    }
    done_ = queued_ == total_ && ready_.empty();
    if (shared_values_ != nullptr) {
      // PushRequest (ExchangeRequest's first fields): 1 header, 2 chunk.
      v1::PushRequest m;
      if (first) *m.mutable_header() = header_;
      if (n > 0) {
        v1::TensorChunk* c = m.mutable_chunk();
        c->set_offset(at);
        c->set_count(n);
        c->set_dtype(dtype_);
        c->set_shared_offset(shared_->push_at() + width() * (at - offset_));
      }
      grpc::Slice slice(m.SerializeAsString() +
                        (done_ ? last_suffix_ : std::string()));
      *out = grpc::ByteBuffer(&slice, 1);
      header_sent_ = true;
      return true;
    }
    EncodePushRequest(first ? &header_ : nullptr, at, n, dtype_, values_,
                      at - offset_, out, done_ ? last_suffix_ : std::string());
    header_sent_ = true;
    if (done_) values_ = grpc::Slice();  // the messages hold what they need
    return true;
  }

  // Sends nothing more and lets go of the values.
  void Drop() {
    absl::MutexLock lock(&mu_);
    done_ = true;
    ready_.clear();
    values_ = grpc::Slice();
  }

  // Every message was made.
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 private:
  int64_t width() const { return dtype_ == v1::BFLOAT16 ? 2 : 4; }

  // A slice over `n` bytes of the caller's buffer at `p`, lent to gRPC:
  // `work` is not done, and the client not destroyed, until gRPC has let
  // go of it.
  struct Loan {
    std::shared_ptr<internal::ShardWork> work;
    std::shared_ptr<internal::InFlightCalls> in_flight;
  };
  static grpc::Slice Lend(std::shared_ptr<internal::ShardWork> work,
                          std::shared_ptr<internal::InFlightCalls> in_flight,
                          const void* p, size_t n) {
    auto* loan = new Loan{std::move(work), std::move(in_flight)};
    loan->work->Lend();
    loan->in_flight->Add();
    return grpc::Slice(
        const_cast<void*>(p), n,
        [](void* u) {
          auto* l = static_cast<Loan*>(u);
          l->work->Returned();
          std::shared_ptr<internal::InFlightCalls> in_flight =
              std::move(l->in_flight);
          delete l;
          in_flight->Done();
        },
        loan);
  }

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
  absl::Status Take(const WireMessage& msg) {
    const WireChunk& c = msg.chunk();
    absl::Status bad = CheckChunkFields(c.offset, c.count, c.dtype,
                                        c.data_size, num_params_);
    if (bad.ok() &&
        (c.offset < offset_ || c.offset + c.count > offset_ + count_)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "chunk [", c.offset, ", +", c.count, ") is outside the shard's [",
          offset_, ", +", count_, ")"));
    }
    const int64_t version = msg.varint(1);
    if (bad.ok() && version_ >= 0 && version != version_) {
      bad = absl::InvalidArgumentError("the version changed within a pull");
    }
    if (!bad.ok()) {
      return absl::DataLossError(
          absl::StrCat("malformed weights from the shard: ", bad.message()));
    }
    // PullResponse (and ExchangeResponse): 6 buffers.
    if (buffers_ != nullptr && msg.has(6)) *buffers_ = msg.bytes(6);
    float* dst = params_ + c.offset;
    if (c.dtype == v1::BFLOAT16) {
      msg.ForEachValues(2, [dst](const char* src, int64_t n, int64_t first) {
        Bfloat16ToFloat(src, dst + first, n);
      });
    } else {
      msg.ForEachValues(4, [dst](const char* src, int64_t n, int64_t first) {
        std::memcpy(dst + first, src, 4 * n);
      });
    }
    received_ += c.count;
    version_ = version;
    if (c.offset == contiguous_) contiguous_ += c.count;
    return absl::OkStatus();
  }

  // Every element before this has arrived (chunks come in order).
  int64_t contiguous() const { return contiguous_; }
  bool complete() const { return received_ == count_; }
  int64_t version() const { return version_; }
  // The pull's result once the shard is done sending.
  absl::Status Result() const {
    if (received_ == count_) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("pulled ", received_, " of the ",
                                            count_, " weights of a shard"));
  }

 private:
  float* params_;  // borrowed: the whole flat vector
  const std::shared_ptr<std::string> buffers_;  // may be null
  const int64_t num_params_, offset_, count_;
  int64_t received_ = 0;
  int64_t version_ = -1;
  int64_t contiguous_;
};

v1::PullRequest MakePullRequest(const ParamClientOptions& o,
                                int64_t min_version,
                                const v1::StepCommit* commit, int64_t clock) {
  v1::PullRequest req;
  req.set_job_id(o.job_id);
  req.set_worker_id(o.worker_id);
  req.set_incarnation(o.incarnation);
  req.set_map_version(o.map_version);
  req.set_min_version(min_version);
  req.set_max_wait_ms(absl::ToInt64Milliseconds(o.pull_wait));
  req.set_total_steps(o.total_steps);
  req.set_plan(o.plan);
  req.set_steps_per_epoch(o.steps_per_epoch);
  req.set_data_fingerprint(o.data_fingerprint);
  req.set_dtype(o.dtype);
  if (commit != nullptr) *req.mutable_commit() = *commit;
  if (clock >= 0) req.set_clock(clock);
  return req;
}

// One shard's part of a push as a PushGradients call: its messages, each
// written when the previous one is on its way, then the answer. A fed call
// holds itself open (AddHold) until its feed has offered its whole range
// or closed.
class PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public FedPart {
 public:
  PushCall(std::shared_ptr<internal::ShardWork> work, int part,
           std::shared_ptr<internal::InFlightCalls> in_flight,
           internal::RawStub* stub, const ParamClientOptions& o,
           const PushInfo& info, bool commit, const float* grads,
           int64_t offset, int64_t count, bool fed)
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
    if (fed_) {
      AddHold();  // released by the feed (Release)
    } else {
      messages_.Queue(messages_.begin(), messages_.end());
      messages_.Next(&msg_);  // the header (and the first chunk, if any)
      writing_ = true;
      StartWrite(&msg_);
    }
    StartRead(&resp_bytes_);
    StartCall();
  }

  int64_t begin() const { return messages_.begin(); }
  int64_t end() const { return messages_.end(); }

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
    std::shared_ptr<internal::InFlightCalls> in_flight = std::move(in_flight_);
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

  std::shared_ptr<internal::ShardWork> work_;
  std::shared_ptr<internal::InFlightCalls> in_flight_;
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
  PullCall(std::shared_ptr<internal::ShardWork> work, int part,
           std::shared_ptr<internal::InFlightCalls> in_flight,
           internal::RawStub* stub, const ParamClientOptions& o,
           const v1::PullRequest& req, float* params, int64_t num_params,
           int64_t offset, int64_t count, std::shared_ptr<std::string> buffers)
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
    std::shared_ptr<internal::InFlightCalls> in_flight = std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  std::shared_ptr<internal::ShardWork> work_;
  std::shared_ptr<internal::InFlightCalls> in_flight_;
  const int part_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  WireMessage msg_;
  PullDecoder decoder_;
  absl::Status error_;
};

// ------------------------------------------------------------- Exchange --

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

// A part of a stream's shared region, taken for one op (ShardStream::
// TakeShared) and given back once: when the op is answered or fails, or at
// the latest with the op.
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

// How users reach a ShardStream (see there): the lock and the user count
// keep the reactor alive while a user calls into it.
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

// A worker's long-lived Exchange stream to one shard. Ops queue for the
// writer in order; the shard answers them in the same order, and the
// reader hands each answer to the oldest op still waiting. The client
// keeps the stream open (a gRPC hold) until it closes it or the stream
// ends; then every op still waiting fails with the stream's status.
//
// Its users reach it through a Slot, never directly: the slot's lock and
// user count keep the reactor alive while a user calls into it, and no
// lock is held while gRPC is called (a call may run reactions inline).
//
// With `share`, its first pull asks the shard for memory to share; when
// the offer comes and maps, the stream's later pushes and pulls go through
// it, one push and one pull at a time (the others as before).
class ShardStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ShardStream(internal::RawStub* stub,
              std::shared_ptr<internal::InFlightCalls> in_flight,
              absl::Duration lifetime, std::shared_ptr<ShardStreamSlot> slot,
              bool share)
      : in_flight_(std::move(in_flight)),
        slot_(std::move(slot)),
        share_(share) {
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

  grpc::ClientContext* context() { return &ctx_; }

  // Queues `op` (a user's call, between Use and Unuse).
  void Add(std::shared_ptr<StreamOp> op) {
    {
      absl::MutexLock lock(&mu_);
      writes_.push_back(op);
      answers_.push_back(std::move(op));
    }
    Kick();
  }
  // Whether a pull should ask for shared memory: once a stream, if asked
  // to (a user's call).
  bool AskOffer() {
    absl::MutexLock lock(&mu_);
    if (!share_ || asked_) return false;
    asked_ = true;
    return true;
  }
  // The shared region's `part`, taken for one op of `values` float32
  // values; null when there is none, the part is smaller, or it is in use.
  std::unique_ptr<SharedPart> TakeShared(SharedRegion::Part part,
                                         int64_t values) {
    absl::MutexLock lock(&mu_);
    if (shared_ == nullptr || shared_->part_bytes(part) / 4 < values ||
        !shared_->TryTake(part)) {
      return nullptr;
    }
    return std::make_unique<SharedPart>(shared_, part);
  }

  // Some op still has messages to write (a user's call).
  bool writing() {
    absl::MutexLock lock(&mu_);
    return !writes_.empty();
  }
  // Half-closes once everything queued is written (a user's call).
  void CloseWrites() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    Kick();
  }
  // Writes the next message if none is being written.
  void Kick() {
    bool write = false, done = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || writes_done_) return;
      if (reply_pending_) {  // before anything that may use the region
        reply_pending_ = false;
        out_ = std::move(reply_);
        write = writing_ = true;
      }
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

  void OnWriteDone(bool ok) override {
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

  void OnReadDone(bool ok) override {
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

  void OnDone(const grpc::Status& status) override {
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
    std::shared_ptr<internal::InFlightCalls> in_flight = std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  // The shard's offer (alone in its message): maps it if it can, and
  // tells the shard either way before writing anything else.
  absl::Status TakeOffer() {
    v1::SharedMemoryOffer offer;
    if (in_.has(3) || in_.has(4) || !offer.ParseFromString(in_.bytes(5))) {
      return absl::DataLossError("a malformed shared memory offer");
    }
    v1::SharedMemoryReply reply;
    std::shared_ptr<SharedRegion> region;
    {
      absl::MutexLock lock(&mu_);
      if (!asked_ || offered_) {
        return absl::DataLossError("a shared memory offer nobody asked for");
      }
      offered_ = true;
      // Nothing more will be written: no reply, no use for a region.
      if (writes_done_) return absl::OkStatus();
    }
    absl::StatusOr<std::unique_ptr<SharedRegion>> mapped =
        SharedRegion::Map(offer);
    if (mapped.ok()) {
      region = *std::move(mapped);
      reply.set_mapped(true);
    } else {
      reply.set_error(std::string(mapped.status().message()));
    }
    // ExchangeRequest: 5 shared.
    grpc::Slice slice(Field(5, reply.SerializeAsString()));
    {
      absl::MutexLock lock(&mu_);
      shared_ = std::move(region);
      reply_ = grpc::ByteBuffer(&slice, 1);
      reply_pending_ = true;
    }
    Kick();
    return absl::OkStatus();
  }

  // Weights that lie in the region's pull part are read from there.
  absl::Status UseSharedChunk() {
    const WireChunk& c = in_.chunk();
    std::shared_ptr<SharedRegion> region;
    {
      absl::MutexLock lock(&mu_);
      region = shared_;
    }
    absl::StatusOr<int> width = DTypeWidth(c.dtype);
    const char* at = region != nullptr && width.ok() && c.data_size == 0
                         ? region->Values(SharedRegion::kPull, c.shared_offset,
                                          c.count, *width)
                         : nullptr;
    if (at == nullptr) {
      return absl::DataLossError(
          "weights in shared memory outside the stream's region");
    }
    in_.UseData(at, c.count * *width);
    return absl::OkStatus();
  }

  std::shared_ptr<internal::InFlightCalls> in_flight_;
  std::shared_ptr<ShardStreamSlot> slot_;
  const bool share_;
  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  bool asked_ ABSL_GUARDED_BY(mu_) = false;    // a pull asked for an offer
  bool offered_ ABSL_GUARDED_BY(mu_) = false;  // and it came
  std::shared_ptr<SharedRegion> shared_ ABSL_GUARDED_BY(mu_);  // mapped
  bool reply_pending_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer reply_ ABSL_GUARDED_BY(mu_);
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


// One shard's part of a push on its Exchange stream.
class PushOp final : public StreamOp, public FedPart {
 public:
  PushOp(std::shared_ptr<internal::ShardWork> work, int part,
         const std::shared_ptr<internal::InFlightCalls>& in_flight,
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

  int64_t begin() const { return messages_.begin(); }
  int64_t end() const { return messages_.end(); }

  bool Next(grpc::ByteBuffer* out) override { return messages_.Next(out); }
  bool written() const override { return messages_.done(); }

  absl::Status Answer(const WireMessage& msg, bool* done) override {
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
  void Fail(const absl::Status& s) override {
    messages_.Drop();  // whoever still holds the op, the gradient goes
    if (shared_ != nullptr) shared_->Give();
    work_->Finished(part_, ctx_, s, -1, /*cancel_others=*/false);
  }

  void Offer(int64_t b, int64_t e) override {
    messages_.Queue(b, e);
    if (ShardStream* st = slot_->Use()) {
      st->Kick();
      slot_->Unuse();
    }
  }
  void Release(bool complete) override {
    if (complete) return;
    // Half a push cannot be taken back on the stream: the stream goes,
    // and the shard drops the push with it (nothing of it staged).
    if (ShardStream* st = slot_->Use()) {
      st->context()->TryCancel();
      slot_->Unuse();
    }
  }

 private:
  std::shared_ptr<internal::ShardWork> work_;
  const int part_;
  const std::unique_ptr<SharedPart> shared_;  // the region's push part, or null
  PushMessages messages_;
  std::shared_ptr<ShardStreamSlot> slot_;
  grpc::ClientContext* ctx_;  // the stream's, for the work (Cancel)
};

// One shard's part of a pull on its Exchange stream.
class PullOp final : public StreamOp {
 public:
  // `shared`: the stream's region, its pull part taken for this pull (or
  // null); `ask`: the pull asks for one.
  PullOp(std::shared_ptr<internal::ShardWork> work, int part,
         v1::PullRequest req, float* params, int64_t num_params, int64_t offset,
         int64_t count, std::shared_ptr<std::string> buffers,
         grpc::ClientContext* ctx,
         std::unique_ptr<SharedPart> shared, bool ask)
      : work_(std::move(work)),
        part_(part),
        decoder_(params, num_params, offset, count, std::move(buffers)),
        ctx_(ctx),
        shared_(std::move(shared)) {
    if (ask) req.set_offer_shared_memory(true);
    if (shared_ != nullptr) req.set_into_shared_memory(true);
    // ExchangeRequest: 4 pull.
    grpc::Slice slice(Field(4, req.SerializeAsString()));
    request_ = grpc::ByteBuffer(&slice, 1);
  }

  bool Next(grpc::ByteBuffer* out) override {
    if (sent_) return false;
    *out = request_;
    sent_ = true;
    return true;
  }
  bool written() const override { return sent_; }

  absl::Status Answer(const WireMessage& msg, bool* done) override {
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
  void Fail(const absl::Status& s) override {
    if (shared_ != nullptr) shared_->Give();
    work_->Finished(part_, ctx_, s, decoder_.version(),
                    /*cancel_others=*/true);
  }

 private:
  std::shared_ptr<internal::ShardWork> work_;
  const int part_;
  PullDecoder decoder_;
  grpc::ClientContext* ctx_;  // the stream's, for the work (Cancel)
  const std::unique_ptr<SharedPart> shared_;  // the region's pull part, or null
  grpc::ByteBuffer request_;
  bool sent_ = false;  // the writer's (under the stream's lock)
};

// ------------------------------------------------------------- PushFeed --

PushFeed::~PushFeed() { Close(); }

void PushFeed::Offer(int64_t begin, int64_t end) {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    const int64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
    if (p.remaining <= 0 || e <= b) continue;
    p.part->Offer(b, e);
    p.remaining -= e - b;
    if (p.remaining <= 0) {
      p.part->Release(/*complete=*/true);
      p.keep = nullptr;
    }
  }
}

void PushFeed::Close() {
  absl::MutexLock lock(&mu_);
  for (Part& p : parts_) {
    if (p.remaining > 0) p.part->Release(/*complete=*/false);
    p.remaining = 0;
    p.keep = nullptr;  // a part that failed lets go of the gradient
  }
}

// ------------------------------------------------------ ParameterClient --

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ShardMap& map, int64_t num_params, const std::string& coordinator,
    const ParamClientOptions& options) {
  if (map.shards().empty()) {
    return absl::InvalidArgumentError("the shard map has no shards");
  }
  ParamClientOptions placed = options;
  placed.map_version = map.version();
  std::unique_ptr<ParameterClient> client(
      new ParameterClient(num_params, placed));
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  int64_t expect = 0;
  for (const v1::ShardMap::Entry& e : map.shards()) {
    if (e.offset() != expect || e.count() <= 0 ||
        e.count() > num_params - expect) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shard map does not cover the ", num_params,
                       " parameters once, in order: entry [", e.offset(), ", +",
                       e.count(), ") after ", expect));
    }
    expect += e.count();
    Shard s;
    s.address = ResolveShardAddress(coordinator, e.address());
    s.offset = e.offset();
    s.count = e.count();
    std::shared_ptr<grpc::Channel>& ch = channels[s.address];
    if (ch == nullptr) ch = Dial(s.address, options.transport);
    s.stub = std::make_unique<RawStub>(ch);
    client->shards_.push_back(std::move(s));
  }
  if (expect != num_params) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the shard map covers ", expect, " of ", num_params, " parameters"));
  }
  return client;
}

ParameterClient::ParameterClient(int64_t num_params,
                                 const ParamClientOptions& options)
    : num_params_(num_params),
      options_(options),
      in_flight_(std::make_shared<InFlight>()) {}

ParameterClient::~ParameterClient() {
  {
    absl::MutexLock lock(&streams_mu_);
    for (Shard& s : shards_) {
      if (s.slot != nullptr) Retire(s.slot);
      s.slot = nullptr;
    }
  }
  absl::MutexLock lock(&in_flight_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_->mu) {
    return in_flight_->calls == 0;
  };
  // Every call has a deadline, so this ends; the bound is for a stuck library.
  in_flight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Minutes(5));
}

void ParameterClient::Retire(const std::shared_ptr<ShardStreamSlot>& slot) {
  // What was asked on it is still answered; then the shard ends it.
  if (ShardStream* st = slot->Use()) {
    st->CloseWrites();
    slot->Unuse();
  }
  slot->Shut();
}

ShardStream* ParameterClient::UseStream(
    Shard& s, std::shared_ptr<ShardStreamSlot>* slot) {
  absl::MutexLock lock(&streams_mu_);
  if (s.slot != nullptr) {
    // A stream lives for a bounded time (its deadline): an old one is
    // retired before that, between exchanges, and a new one opened.
    ShardStream* st = s.slot->Use();
    // An old stream is retired, unless an op on it is still being written
    // (a push being fed): the new op queues behind it.
    if (st != nullptr &&
        (absl::Now() - s.slot->opened <= options_.stream_lifetime / 2 ||
         st->writing())) {
      *slot = s.slot;
      return st;
    }
    if (st != nullptr) {
      s.slot->Unuse();
      Retire(s.slot);
    }
    s.slot = nullptr;  // over: a new one
  }
  s.slot = std::make_shared<ShardStreamSlot>();
  in_flight_->Add();
  new ShardStream(s.stub.get(), in_flight_, options_.stream_lifetime, s.slot,
                  options_.shared_memory);
  *slot = s.slot;
  return s.slot->Use();  // null if it ended at once: then the op fails
}

void ParameterClient::OnStream(Shard& s, internal::ShardWork* work, int part,
                               const MakeOp& make) {
  std::shared_ptr<ShardStreamSlot> slot;
  ShardStream* st = UseStream(s, &slot);
  if (st == nullptr) {
    work->Failed(part, absl::UnavailableError("the stream to the shard ended"));
    return;
  }
  work->Started(st->context());
  st->Add(make(st, slot));
  slot->Unuse();
}

std::shared_ptr<Work> ParameterClient::Pull(int64_t min_version, float* params,
                                            const v1::StepCommit* commit,
                                            int64_t clock,
                                            std::shared_ptr<std::string> buffers) {
  auto work = std::make_shared<internal::ShardWork>(num_shards(),
                                                    options_.mixed_versions);
  const v1::PullRequest req =
      MakePullRequest(options_, min_version, commit, clock);
  for (int i = 0; i < num_shards(); ++i) {
    work->SetRange(i, shards_[i].offset, shards_[i].offset + shards_[i].count);
  }
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    std::shared_ptr<std::string> region = s.offset == 0 ? buffers : nullptr;
    if (!options_.exchange) {
      in_flight_->Add();
      new PullCall(work, i, in_flight_, s.stub.get(), options_, req, params,
                   num_params_, s.offset, s.count, region);
      continue;
    }
    OnStream(s, work.get(), i,
             [&](ShardStream* st, const std::shared_ptr<ShardStreamSlot>&) {
               return std::make_shared<PullOp>(
                   work, i, req, params, num_params_, s.offset, s.count,
                   region, st->context(), st->TakeShared(SharedRegion::kPull, s.count),
                   st->AskOffer());
             });
  }
  return work;
}

std::shared_ptr<Work> ParameterClient::Push(const PushInfo& info,
                                            const float* grads,
                                            std::unique_ptr<PushFeed>* feed) {
  auto work = std::make_shared<internal::ShardWork>(num_shards());
  const bool commit = info.commit && num_shards() == 1;
  std::vector<PushFeed::Part> parts;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    if (!options_.exchange) {
      in_flight_->Add();
      auto* call = new PushCall(work, i, in_flight_, s.stub.get(), options_,
                                info, commit, grads, s.offset, s.count,
                                feed != nullptr);
      // A call with nothing to send (the header alone) holds nothing.
      if (feed != nullptr && call->end() > call->begin()) {
        parts.push_back({call, nullptr, call->begin(), call->end(),
                         call->end() - call->begin()});
      }
      continue;
    }
    OnStream(s, work.get(), i,
             [&](ShardStream* st, const std::shared_ptr<ShardStreamSlot>& slot) {
               auto op = std::make_shared<PushOp>(
                   work, i, in_flight_, options_, info, commit, grads,
                   s.offset, s.count, feed != nullptr, slot, st->context(),
                   st->TakeShared(SharedRegion::kPush, s.count));
               if (feed != nullptr && op->end() > op->begin()) {
                 parts.push_back({op.get(), op, op->begin(), op->end(),
                                  op->end() - op->begin()});
               }
               return op;
             });
  }
  if (feed != nullptr) {
    std::unique_ptr<PushFeed> f(new PushFeed);
    absl::MutexLock lock(&f->mu_);
    f->parts_ = std::move(parts);
    *feed = std::move(f);
  }
  return work;
}

}  // namespace tally
