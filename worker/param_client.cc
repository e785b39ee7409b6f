#include "worker/param_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bfloat16.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"

namespace tally {

// ----------------------------------------------------------------- Work --

Work::Work(int parts) : pending_(parts), results_(parts) {}

Work::~Work() = default;

void Work::Started(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  live_.push_back(ctx);
  if (cancelled_) ctx->TryCancel();
}

void Work::Finished(int part, grpc::ClientContext* ctx,
                    const absl::Status& status, int64_t version,
                    bool cancel_others, bool committed) {
  absl::MutexLock lock(&mu_);
  live_.erase(std::find(live_.begin(), live_.end(), ctx));
  results_[part] = status;
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

void Work::Lend() {
  absl::MutexLock lock(&lent_mu_);
  ++lent_;
}

void Work::Returned() {
  absl::MutexLock lock(&lent_mu_);
  --lent_;
}

absl::Status Work::Wait(absl::Time deadline) {
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

absl::StatusOr<int64_t> Work::WaitVersion(absl::Time deadline) {
  if (absl::Status s = Wait(deadline); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return version_;
}

void Work::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (grpc::ClientContext* c : live_) c->TryCancel();
}

bool Work::Done() const {
  {
    absl::MutexLock lock(&lent_mu_);
    if (lent_ != 0) return false;
  }
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

std::vector<absl::Status> Work::Results() const {
  absl::MutexLock lock(&mu_);
  return results_;
}

bool Work::Committed() const {
  absl::MutexLock lock(&mu_);
  return pending_ == 0 && committed_ == static_cast<int>(results_.size());
}

// ------------------------------------------------------------ the calls --

namespace {

constexpr char kPushMethod[] = "/tally.v1.ParameterService/PushGradients";
constexpr char kPullMethod[] = "/tally.v1.ParameterService/PullWeights";

grpc::ByteBuffer Serialized(const google::protobuf::Message& m) {
  grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One shard's part of a push: the header, then the shard's range in chunks,
// each written when the previous one is on its way. Float32 values are not
// copied: each message's data is a slice of the caller's gradient.
class PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           ParameterClient::RawStub* stub, const ParamClientOptions& o,
           const PushInfo& info, bool commit, const float* grads,
           int64_t offset, int64_t count)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        offset_(offset),
        next_(offset),
        end_(offset + count),
        chunk_(std::max<int64_t>(1, o.chunk_elements)),
        dtype_(o.dtype) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
    header_.set_job_id(o.job_id);
    header_.set_worker_id(o.worker_id);
    header_.set_incarnation(o.incarnation);
    header_.set_step(info.step);
    header_.set_base_version(info.base_version >= 0 ? info.base_version
                                                    : info.step);
    header_.set_samples(info.samples);
    header_.set_loss_sum(info.loss_sum);
    header_.set_correct(info.correct);
    header_.set_commit(commit);
    if (info.samples == 0 || count == 0) {
      next_ = end_;  // the header alone
    } else if (dtype_ == v1::BFLOAT16) {
      // Encoded once, whole; the messages are slices of it.
      auto encoded = std::make_shared<std::vector<uint16_t>>(count);
      FloatToBfloat16(grads + offset, reinterpret_cast<char*>(encoded->data()),
                      count);
      values_ = SnapshotSlice(std::move(encoded));
    } else {
      values_ =
          LendSlice(work_, in_flight_, grads + offset, sizeof(float) * count);
    }
    work_->Started(&ctx_);
    stub->PrepareBidiStreamingCall(&ctx_, kPushMethod, grpc::StubOptions(),
                                   this);
    WriteNext(/*first=*/true);
    StartRead(&resp_bytes_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    // A failed write ends the call; OnDone reports why.
    if (!ok) return;
    if (next_ >= end_) {
      msg_.Clear();
      values_ = grpc::Slice();
      StartWritesDone();
      return;
    }
    WriteNext(/*first=*/false);
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
    std::shared_ptr<ParameterClient::InFlight> in_flight =
        std::move(in_flight_);
    delete this;  // lets go of the lent slices: the work may end now
    in_flight->Done();
  }

 private:
  // A slice over `n` bytes of the caller's buffer at `p`, lent to gRPC:
  // `work` is not done, and the client not destroyed, until gRPC has let
  // go of it.
  struct Loan {
    std::shared_ptr<Work> work;
    std::shared_ptr<ParameterClient::InFlight> in_flight;
  };
  static grpc::Slice LendSlice(
      std::shared_ptr<Work> work,
      std::shared_ptr<ParameterClient::InFlight> in_flight, const void* p,
      size_t n) {
    auto* loan = new Loan{std::move(work), std::move(in_flight)};
    loan->work->Lend();
    loan->in_flight->Add();
    return grpc::Slice(
        const_cast<void*>(p), n,
        [](void* u) {
          auto* l = static_cast<Loan*>(u);
          l->work->Returned();
          std::shared_ptr<ParameterClient::InFlight> in_flight =
              std::move(l->in_flight);
          delete l;
          in_flight->Done();
        },
        loan);
  }

  void WriteNext(bool first) {
    const int64_t n = std::min(chunk_, end_ - next_);
    EncodePushRequest(first ? &header_ : nullptr, next_, n, dtype_, values_,
                      next_ - offset_, &msg_);
    next_ += n;
    StartWrite(&msg_);
  }

  std::shared_ptr<Work> work_;
  std::shared_ptr<ParameterClient::InFlight> in_flight_;
  const int part_;
  const int64_t offset_;
  int64_t next_, end_;
  const int64_t chunk_;
  const v1::DType dtype_;
  grpc::ClientContext ctx_;
  v1::PushHeader header_;
  grpc::Slice values_;  // the range's values, in the wire dtype
  grpc::ByteBuffer msg_;
  grpc::ByteBuffer resp_bytes_;
  v1::PushResponse resp_;
  bool answered_ = false;
  absl::Status error_;
};

// One shard's part of a pull: chunks of its range, each checked to lie in
// that range and its values decoded from gRPC's slices straight into the
// flat vector.
class PullCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PullCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           ParameterClient::RawStub* stub, const ParamClientOptions& o,
           int64_t min_version, const v1::StepCommit* commit, int64_t clock,
           float* params, int64_t num_params, int64_t offset, int64_t count)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        params_(params),
        num_params_(num_params),
        offset_(offset),
        count_(count) {
    ctx_.set_deadline(
        absl::ToChronoTime(absl::Now() + o.pull_wait + o.rpc_timeout));
    v1::PullRequest req;
    req.set_job_id(o.job_id);
    req.set_worker_id(o.worker_id);
    req.set_incarnation(o.incarnation);
    req.set_min_version(min_version);
    req.set_max_wait_ms(absl::ToInt64Milliseconds(o.pull_wait));
    req.set_total_steps(o.total_steps);
    req.set_steps_per_epoch(o.steps_per_epoch);
    req.set_dtype(o.dtype);
    if (commit != nullptr) *req.mutable_commit() = *commit;
    if (clock >= 0) req.set_clock(clock);
    req_bytes_ = Serialized(req);
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
    const WireChunk& c = msg_.chunk();
    if (bad.ok()) {
      bad = CheckChunkFields(c.offset, c.count, c.dtype, c.data_size,
                             num_params_);
    }
    if (bad.ok() &&
        (c.offset < offset_ || c.offset + c.count > offset_ + count_)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "chunk [", c.offset, ", +", c.count, ") is outside the shard's [",
          offset_, ", +", count_, ")"));
    }
    const int64_t version = msg_.varint(1);
    if (bad.ok() && version_ >= 0 && version != version_) {
      bad = absl::InvalidArgumentError("the version changed within a pull");
    }
    if (!bad.ok()) {
      error_ = absl::DataLossError(
          absl::StrCat("malformed weights from the shard: ", bad.message()));
      ctx_.TryCancel();
      return;
    }
    float* dst = params_ + c.offset;
    if (c.dtype == v1::BFLOAT16) {
      msg_.ForEachValues(2, [dst](const char* src, int64_t n, int64_t first) {
        Bfloat16ToFloat(src, dst + first, n);
      });
    } else {
      msg_.ForEachValues(4, [dst](const char* src, int64_t n, int64_t first) {
        std::memcpy(dst + first, src, 4 * n);
      });
    }
    received_ += c.count;
    version_ = version;
    StartRead(&resp_bytes_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::Status s = !error_.ok() ? error_ : FromGrpc(status);
    if (s.ok() && received_ != count_) {
      s = absl::DataLossError(absl::StrCat("pulled ", received_, " of the ",
                                           count_, " weights of a shard"));
    }
    work_->Finished(part_, &ctx_, s, version_, /*cancel_others=*/true);
    std::shared_ptr<ParameterClient::InFlight> in_flight =
        std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  std::shared_ptr<Work> work_;
  std::shared_ptr<ParameterClient::InFlight> in_flight_;
  const int part_;
  float* params_;  // borrowed: the whole flat vector
  const int64_t num_params_, offset_, count_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  WireMessage msg_;
  absl::Status error_;
  int64_t received_ = 0;
  int64_t version_ = -1;
};

// ------------------------------------------------------ ParameterClient --

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ShardMap& map, int64_t num_params, const std::string& coordinator,
    const ParamClientOptions& options) {
  if (map.shards().empty()) {
    return absl::InvalidArgumentError("the shard map has no shards");
  }
  std::unique_ptr<ParameterClient> client(
      new ParameterClient(num_params, options));
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
    s.address = e.address().empty() ? coordinator : e.address();
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
  absl::MutexLock lock(&in_flight_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_->mu) {
    return in_flight_->calls == 0;
  };
  // Every call has a deadline, so this ends; the bound is for a stuck library.
  in_flight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Minutes(5));
}

std::shared_ptr<Work> ParameterClient::Pull(int64_t min_version, float* params,
                                            const v1::StepCommit* commit,
                                            int64_t clock) {
  std::shared_ptr<Work> work(new Work(num_shards()));
  work->mixed_ok_ = options_.mixed_versions;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    in_flight_->Add();
    new PullCall(work, i, in_flight_, s.stub.get(), options_, min_version,
                 commit, clock, params, num_params_, s.offset, s.count);
  }
  return work;
}

std::shared_ptr<Work> ParameterClient::Push(const PushInfo& info,
                                            const float* grads) {
  std::shared_ptr<Work> work(new Work(num_shards()));
  const bool commit = info.commit && num_shards() == 1;
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    in_flight_->Add();
    new PushCall(work, i, in_flight_, s.stub.get(), options_, info, commit,
                 grads, s.offset, s.count);
  }
  return work;
}

}  // namespace tally
