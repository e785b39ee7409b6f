#include "worker/param_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
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
                    bool cancel_others) {
  absl::MutexLock lock(&mu_);
  live_.erase(std::find(live_.begin(), live_.end(), ctx));
  results_[part] = status;
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

absl::Status Work::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == 0;
  };
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
  absl::MutexLock lock(&mu_);
  return pending_ == 0;
}

std::vector<absl::Status> Work::Results() const {
  absl::MutexLock lock(&mu_);
  return results_;
}

// ------------------------------------------------------------ the calls --

// One shard's part of a push: the header, then the shard's range in chunks,
// each written when the previous one is on its way.
class PushCall final : public grpc::ClientWriteReactor<v1::PushRequest> {
 public:
  PushCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           v1::ParameterService::Stub* stub, const ParamClientOptions& o,
           const PushInfo& info, const float* grads, int64_t offset,
           int64_t count)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        grads_(grads),
        next_(offset),
        end_(offset + count),
        chunk_(std::max<int64_t>(1, o.chunk_elements)),
        dtype_(o.dtype) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + o.rpc_timeout));
    v1::PushHeader* h = msg_.mutable_header();
    h->set_job_id(o.job_id);
    h->set_worker_id(o.worker_id);
    h->set_incarnation(o.incarnation);
    h->set_step(info.step);
    h->set_base_version(info.base_version >= 0 ? info.base_version
                                               : info.step);
    h->set_samples(info.samples);
    h->set_loss_sum(info.loss_sum);
    h->set_correct(info.correct);
    if (info.samples == 0) next_ = end_;  // the header alone
    work_->Started(&ctx_);
    stub->async()->PushGradients(&ctx_, &resp_, this);
    WriteNext();
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    // A failed write ends the call; OnDone reports why.
    if (!ok) return;
    msg_.clear_header();
    if (next_ >= end_) {
      StartWritesDone();
      return;
    }
    WriteNext();
  }

  void OnDone(const grpc::Status& status) override {
    work_->Finished(part_, &ctx_, FromGrpc(status), resp_.version(),
                    /*cancel_others=*/false);
    std::shared_ptr<ParameterClient::InFlight> in_flight =
        std::move(in_flight_);
    delete this;
    in_flight->Done();
  }

 private:
  void WriteNext() {
    if (next_ < end_) {
      const int64_t n = std::min(chunk_, end_ - next_);
      EncodeChunk(grads_ + next_, next_, n, dtype_, msg_.mutable_chunk());
      next_ += n;
    } else {
      msg_.clear_chunk();
    }
    StartWrite(&msg_);
  }

  std::shared_ptr<Work> work_;
  std::shared_ptr<ParameterClient::InFlight> in_flight_;
  const int part_;
  const float* grads_;  // borrowed: the whole flat gradient
  int64_t next_, end_;
  const int64_t chunk_;
  const v1::DType dtype_;
  grpc::ClientContext ctx_;
  v1::PushRequest msg_;
  v1::PushResponse resp_;
};

// One shard's part of a pull: chunks of its range, decoded into the flat
// vector as they arrive, each checked to lie in that range.
class PullCall final : public grpc::ClientReadReactor<v1::PullResponse> {
 public:
  PullCall(std::shared_ptr<Work> work, int part,
           std::shared_ptr<ParameterClient::InFlight> in_flight,
           v1::ParameterService::Stub* stub, const ParamClientOptions& o,
           int64_t min_version, const v1::StepCommit* commit,
           int64_t clock, float* params, int64_t num_params, int64_t offset,
           int64_t count)
      : work_(std::move(work)),
        in_flight_(std::move(in_flight)),
        part_(part),
        params_(params),
        num_params_(num_params),
        offset_(offset),
        count_(count) {
    ctx_.set_deadline(
        absl::ToChronoTime(absl::Now() + o.pull_wait + o.rpc_timeout));
    req_.set_job_id(o.job_id);
    req_.set_worker_id(o.worker_id);
    req_.set_incarnation(o.incarnation);
    req_.set_min_version(min_version);
    req_.set_max_wait_ms(absl::ToInt64Milliseconds(o.pull_wait));
    req_.set_total_steps(o.total_steps);
    req_.set_steps_per_epoch(o.steps_per_epoch);
    req_.set_dtype(o.dtype);
    if (commit != nullptr) *req_.mutable_commit() = *commit;
    if (clock >= 0) req_.set_clock(clock);
    work_->Started(&ctx_);
    stub->async()->PullWeights(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const v1::TensorChunk& c = resp_.chunk();
    absl::Status bad = CheckChunk(c, num_params_);
    if (bad.ok() &&
        (c.offset() < offset_ || c.offset() + c.count() > offset_ + count_)) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "chunk [", c.offset(), ", +", c.count(), ") is outside the shard's [",
          offset_, ", +", count_, ")"));
    }
    if (bad.ok() && version_ >= 0 && resp_.version() != version_) {
      bad = absl::InvalidArgumentError("the version changed within a pull");
    }
    if (!bad.ok()) {
      error_ = absl::DataLossError(absl::StrCat(
          "malformed weights from the shard: ", bad.message()));
      ctx_.TryCancel();
      return;
    }
    DecodeChunk(c, params_);
    received_ += c.count();
    version_ = resp_.version();
    StartRead(&resp_);
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
  v1::PullRequest req_;
  v1::PullResponse resp_;
  absl::Status error_;
  int64_t received_ = 0;
  int64_t version_ = -1;
};

// ------------------------------------------------------ ParameterClient --

absl::StatusOr<std::unique_ptr<ParameterClient>> ParameterClient::Create(
    const v1::ShardMap& map, int64_t num_params,
    const std::string& coordinator, const ParamClientOptions& options) {
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
      return absl::InvalidArgumentError(absl::StrCat(
          "the shard map does not cover the ", num_params,
          " parameters once, in order: entry [", e.offset(), ", +", e.count(),
          ") after ", expect));
    }
    expect += e.count();
    Shard s;
    s.address = e.address().empty() ? coordinator : e.address();
    s.offset = e.offset();
    s.count = e.count();
    std::shared_ptr<grpc::Channel>& ch = channels[s.address];
    if (ch == nullptr) ch = Dial(s.address, options.transport);
    s.stub = v1::ParameterService::NewStub(ch);
    client->shards_.push_back(std::move(s));
  }
  if (expect != num_params) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard map covers ", expect, " of ", num_params,
                     " parameters"));
  }
  return client;
}

ParameterClient::~ParameterClient() {
  absl::MutexLock lock(&in_flight_->mu);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(in_flight_->mu) {
    return in_flight_->calls == 0;
  };
  // Every call has a deadline, so this ends; the bound is for a stuck library.
  in_flight_->mu.AwaitWithTimeout(absl::Condition(&idle), absl::Minutes(5));
}

std::shared_ptr<Work> ParameterClient::Pull(int64_t min_version,
                                            float* params,
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
  for (int i = 0; i < num_shards(); ++i) {
    Shard& s = shards_[i];
    in_flight_->Add();
    new PushCall(work, i, in_flight_, s.stub.get(), options_, info, grads,
                 s.offset, s.count);
  }
  return work;
}

}  // namespace tally
