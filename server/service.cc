#include "server/service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/internal/finite.h"

namespace tally {

namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// Merged set of covered [begin, end) element ranges.
class Coverage {
 public:
  void Add(int64_t b, int64_t e) {
    auto it = ranges_.upper_bound(b);
    if (it != ranges_.begin() && std::prev(it)->second >= b) --it;
    while (it != ranges_.end() && it->first <= e) {
      b = std::min(b, it->first);
      e = std::max(e, it->second);
      covered_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_[b] = e;
    covered_ += e - b;
  }
  int64_t covered() const { return covered_; }

 private:
  std::map<int64_t, int64_t> ranges_;
  int64_t covered_ = 0;
};

// ----------------------------------------------------------------- push --

class PushReactor final : public grpc::ServerReadReactor<v1::PushRequest> {
 public:
  PushReactor(Coordinator* coord, v1::PushResponse* resp)
      : coord_(coord), resp_(resp) {
    StartRead(&req_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete();
      return;
    }
    absl::Status s = Consume();
    if (!s.ok()) {
      ReturnStaging();
      Finish(ToGrpc(s));
      return;
    }
    if (done_early_) return;
    StartRead(&req_);
  }

  void OnDone() override {
    ReturnStaging();
    delete this;
  }

 private:
  // The staging buffer goes back as soon as the push is decided, not when
  // gRPC finally retires the call.
  void ReturnStaging() {
    if (shard_ != nullptr && staging_ != nullptr)
      shard_->ReleaseStaging(std::move(staging_));
  }

  absl::Status Consume() {
    if (!has_header_) {
      if (!req_.has_header()) {
        return absl::InvalidArgumentError(
            "the first push message must carry the header");
      }
      const v1::PushHeader& h = req_.header();
      meta_.worker_id = h.worker_id();
      meta_.incarnation = h.incarnation();
      meta_.step = h.step();
      meta_.base_version = h.base_version();
      meta_.samples = h.samples();
      meta_.loss_sum = h.loss_sum();
      meta_.correct = h.correct();
      has_header_ = true;
      auto shard = coord_->Shard(h.job_id());
      if (!shard.ok()) return shard.status();
      shard_ = *std::move(shard);
      if (absl::Status s =
              coord_->CheckWorker(meta_.worker_id, meta_.incarnation);
          !s.ok()) {
        return s;
      }
      bool duplicate = false;
      if (absl::Status s = shard_->CheckPush(meta_, &duplicate); !s.ok())
        return s;
      if (!std::isfinite(meta_.loss_sum)) {
        shard_->Reject(meta_);
        return WithReason(absl::InvalidArgumentError(
                              "non-finite loss_sum; push rejected and counted"),
                          v1::NON_FINITE);
      }
      if (duplicate) {
        // Already counted: acknowledge without reading the rest.
        resp_->set_duplicate(true);
        resp_->set_version(shard_->version());
        done_early_ = true;
        Finish(grpc::Status::OK);
        return absl::OkStatus();
      }
      if (meta_.samples > 0) {
        auto staging = shard_->AcquireStaging();
        if (!staging.ok()) return staging.status();
        staging_ = *std::move(staging);
      }
    } else if (req_.has_header()) {
      return absl::InvalidArgumentError(
          "only the first push message may carry a header");
    }
    if (!req_.has_chunk()) return absl::OkStatus();
    const v1::TensorChunk& c = req_.chunk();
    TALLY_RETURN_IF_ERROR(CheckChunk(c, shard_->num_params()));
    if (meta_.samples == 0) return absl::OkStatus();  // nothing to add
    float* dst = staging_->data() + c.offset();
    const int64_t bad =
        c.dtype() == v1::BFLOAT16
            ? internal::DecodeBfloat16AndFindNonFinite(dst, c.data().data(),
                                                       c.count())
            : internal::CopyAndFindNonFinite(dst, c.data().data(), c.count());
    if (bad >= 0) {
      shard_->Reject(meta_);
      return WithReason(absl::InvalidArgumentError(absl::StrCat(
                            "non-finite gradient value (", dst[bad],
                            ") at element ", c.offset() + bad,
                            "; push rejected and counted")),
                        v1::NON_FINITE);
    }
    coverage_.Add(c.offset(), c.offset() + c.count());
    return absl::OkStatus();
  }

  void Complete() {
    if (!has_header_) {
      Finish(ToGrpc(absl::InvalidArgumentError("empty push stream")));
      return;
    }
    if (meta_.samples > 0 && coverage_.covered() != shard_->num_params()) {
      ReturnStaging();
      Finish(ToGrpc(absl::InvalidArgumentError(
          absl::StrCat("the push covers ", coverage_.covered(), " of ",
                       shard_->num_params(), " gradient elements"))));
      return;
    }
    bool duplicate = false;
    absl::Status s = shard_->Accept(meta_, std::move(staging_), &duplicate);
    resp_->set_duplicate(duplicate);
    resp_->set_version(shard_->version());
    Finish(ToGrpc(s));
  }

  Coordinator* coord_;
  v1::PushResponse* resp_;
  v1::PushRequest req_;
  bool has_header_ = false;
  bool done_early_ = false;
  PushMeta meta_;
  std::shared_ptr<ParameterShard> shard_;
  std::unique_ptr<std::vector<float>> staging_;  // from the shard's pool
  Coverage coverage_;
};

// ---------------------------------------------- event-driven streaming --

// A server-streaming reactor woken by events from elsewhere (a shard reaching
// a version, a job changing). The event sources hold a Handle, never the
// reactor: once gRPC is done with the call the handle is cleared, so a late
// event finds nothing instead of a deleted reactor. The base owns the
// finish-once and cancel logic; Derived writes under mu_.
template <typename Derived, typename Response>
class EventWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (!writing_)
      FinishOnceLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    static_cast<Derived*>(this)->Release();
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    delete this;
  }

 protected:
  EventWriteReactor() : handle_(std::make_shared<Handle>()) {
    absl::MutexLock lock(&handle_->mu);
    handle_->reactor = static_cast<Derived*>(this);
  }

  // A callable for an event source: runs fn(reactor, args...) while the call
  // is live, and nothing after.
  template <typename Fn>
  auto WhileLive(Fn fn) {
    return [handle = handle_, fn](auto&&... args) {
      absl::MutexLock lock(&handle->mu);
      if (handle->reactor != nullptr)
        fn(handle->reactor, std::forward<decltype(args)>(args)...);
    };
  }

  // Hook for OnDone, before the reactor goes (unsubscribe and the like).
  void Release() {}

  void StartWriteLocked(const Response* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    this->StartWrite(r);
  }
  void FinishOnce(const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    FinishOnceLocked(s);
  }
  void FinishOnceLocked(const grpc::Status& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    this->Finish(s);
  }
  // Called by Derived::OnWriteDone first: false when the stream is over.
  bool WriteDoneLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = false;
    if (!ok) {
      FinishOnceLocked(
          grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    }
    return ok && !finished_;
  }

  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;

 private:
  struct Handle {
    absl::Mutex mu;
    Derived* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Handle> handle_;
};

// ----------------------------------------------------------------- pull --

class PullReactor final
    : public EventWriteReactor<PullReactor, v1::PullResponse> {
 public:
  PullReactor(Coordinator* coord, const v1::PullRequest* req) {
    chunk_ =
        req->chunk_elements() > 0
            ? std::min<int64_t>(req->chunk_elements(), kDefaultChunkElements)
            : kDefaultChunkElements;
    auto shard = coord->Shard(req->job_id());
    absl::Status s = shard.status();
    if (s.ok()) s = DTypeWidth(req->dtype()).status();
    dtype_ = req->dtype();
    if (s.ok()) s = coord->CheckWorker(req->worker_id(), req->incarnation());
    // Only the job's members read its weights on the data path (clients
    // fetch them through JobService).
    if (s.ok()) s = (*shard)->CheckMember(req->worker_id(), req->incarnation());
    if (s.ok() && req->has_commit()) {
      (*shard)->Commit(req->worker_id(), req->incarnation(),
                       req->commit().step(), req->commit().contributed());
    }
    if (s.ok() && req->total_steps() > 0) {
      s = (*shard)->SetSchedule(req->total_steps(), req->steps_per_epoch());
    }
    if (!s.ok()) {
      FinishOnce(ToGrpc(s));
      return;
    }
    shard_ = *std::move(shard);
    const int64_t wait_ms = req->max_wait_ms() > 0
                                ? std::min<int64_t>(req->max_wait_ms(), 600000)
                                : 30000;
    shard_->WhenVersion(req->min_version(),
                        absl::Now() + absl::Milliseconds(wait_ms),
                        WhileLive([](PullReactor* r, const absl::Status& st) {
                          r->Ready(st);
                        }));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (WriteDoneLocked(ok)) WriteNextLocked();
  }

 private:
  void Ready(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!s.ok()) {
      FinishOnceLocked(ToGrpc(s));
      return;
    }
    weights_ = shard_->Snapshot(&version_, &total_steps_);
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t n = static_cast<int64_t>(weights_->size());
    if (next_ >= n && next_ > 0) {
      FinishOnceLocked(grpc::Status::OK);
      return;
    }
    const int64_t count = std::min(chunk_, n - next_);
    resp_.Clear();
    resp_.set_version(version_);
    resp_.set_total_steps(total_steps_);
    EncodeChunk(weights_->data() + next_, next_, count, dtype_,
                resp_.mutable_chunk());
    next_ += std::max<int64_t>(count, 1);
    StartWriteLocked(&resp_);
  }

  std::shared_ptr<ParameterShard> shard_;
  int64_t chunk_ = kDefaultChunkElements;
  v1::DType dtype_ = v1::FLOAT32;
  std::shared_ptr<const std::vector<float>> weights_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  v1::PullResponse resp_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- watch --

class WatchReactor final : public EventWriteReactor<WatchReactor, v1::Job> {
 public:
  WatchReactor(Coordinator* coord, const std::string& job_id)
      : coord_(coord), job_id_(job_id) {
    auto sub = coord_->Subscribe(
        job_id_, WhileLive([](WatchReactor* r) { r->Changed(); }));
    if (!sub.ok()) {
      FinishOnce(ToGrpc(sub.status()));
      return;
    }
    subscription_ = *sub;
    Changed();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!WriteDoneLocked(ok)) return;
    if (sent_terminal_) {
      FinishOnceLocked(grpc::Status::OK);
    } else if (pending_) {
      SendLocked();
    }
  }

  void Release() {
    if (subscription_ != 0) coord_->Unsubscribe(subscription_);
  }

 private:
  void Changed() {
    absl::MutexLock lock(&mu_);
    if (finished_ || sent_terminal_) return;
    pending_ = true;
    if (!writing_) SendLocked();
  }

  void SendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    pending_ = false;
    auto job = coord_->Get(job_id_);
    if (!job.ok()) {
      FinishOnceLocked(ToGrpc(job.status()));
      return;
    }
    job_ = *std::move(job);
    sent_terminal_ = Terminal(job_.state());
    StartWriteLocked(&job_);
  }

  Coordinator* coord_;
  const std::string job_id_;
  int64_t subscription_ = 0;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_terminal_ ABSL_GUARDED_BY(mu_) = false;
  v1::Job job_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------- fetch --

class FetchReactor final : public grpc::ServerWriteReactor<v1::FileChunk> {
 public:
  FetchReactor(Coordinator* coord, const std::string& job_id) {
    auto bytes = coord->WeightsFile(job_id);
    if (!bytes.ok()) {
      Finish(ToGrpc(bytes.status()));
      return;
    }
    bytes_ = *std::move(bytes);
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    constexpr size_t kChunk = 1 << 20;
    if (offset_ >= bytes_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const size_t n = std::min(kChunk, bytes_.size() - offset_);
    chunk_.set_data(bytes_.data() + offset_, n);
    chunk_.set_total_size(static_cast<int64_t>(bytes_.size()));
    offset_ += n;
    StartWrite(&chunk_);
  }
  std::string bytes_;
  size_t offset_ = 0;
  v1::FileChunk chunk_;
};

}  // namespace

// ------------------------------------------------------------ services --

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(
    grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
    v1::SubmitJobResponse* resp) {
  auto job = coord_->Submit(req->spec());
  if (!job.ok()) return Reply(ctx, job.status());
  *resp->mutable_job() = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(
    grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
    v1::Job* resp) {
  auto job = coord_->Get(req->job_id());
  if (!job.ok()) return Reply(ctx, job.status());
  *resp = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(
    grpc::CallbackServerContext* ctx, const v1::ListJobsRequest*,
    v1::ListJobsResponse* resp) {
  for (v1::Job& j : coord_->List()) *resp->add_jobs() = std::move(j);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::Job>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext*, const v1::WatchJobRequest* req) {
  return new WatchReactor(coord_, req->job_id());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(
    grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
    v1::Job* resp) {
  auto job = coord_->Cancel(req->job_id());
  if (!job.ok()) return Reply(ctx, job.status());
  *resp = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::FileChunk>* JobServiceImpl::FetchWeights(
    grpc::CallbackServerContext*, const v1::FetchWeightsRequest* req) {
  return new FetchReactor(coord_, req->job_id());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* req,
    v1::RegisterWorkerResponse* resp) {
  *resp = coord_->Register(*req);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(
    grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
    v1::HeartbeatResponse* resp) {
  auto r = coord_->Heartbeat(*req);
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportResult(
    grpc::CallbackServerContext* ctx, const v1::ReportResultRequest* req,
    v1::ReportResultResponse*) {
  return Reply(ctx, coord_->ReportResult(*req));
}

grpc::ServerReadReactor<v1::PushRequest>* ParameterServiceImpl::PushGradients(
    grpc::CallbackServerContext*, v1::PushResponse* resp) {
  return new PushReactor(coord_, resp);
}

grpc::ServerWriteReactor<v1::PullResponse>* ParameterServiceImpl::PullWeights(
    grpc::CallbackServerContext*, const v1::PullRequest* req) {
  return new PullReactor(coord_, req);
}

// -------------------------------------------------------------- server --

absl::StatusOr<std::unique_ptr<TallyServer>> TallyServer::Start(
    const std::string& address, const CoordinatorOptions& options) {
  std::unique_ptr<TallyServer> s(new TallyServer());
  s->coordinator_ = std::make_unique<Coordinator>(options);
  // Jobs kept from an earlier run come back before anyone can connect.
  if (absl::Status r = s->coordinator_->Restore(); !r.ok()) return r;
  s->jobs_ = std::make_unique<JobServiceImpl>(s->coordinator_.get());
  s->workers_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get());
  s->params_ = std::make_unique<ParameterServiceImpl>(s->coordinator_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServer(address, &builder, &s->port_);
  builder.RegisterService(s->jobs_.get());
  builder.RegisterService(s->workers_.get());
  builder.RegisterService(s->params_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (in use by another process?)"));
  }
  TallyServer* raw = s.get();
  s->ticker_ = std::thread([raw] { raw->TickLoop(); });
  if (!options.state_dir.empty())
    s->checkpointer_ = std::thread([raw] { raw->CheckpointLoop(); });
  return s;
}

void TallyServer::TickLoop() {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopped),
                               absl::Milliseconds(100))) {
    mu_.Unlock();
    coordinator_->Tick();
    mu_.Lock();
  }
}

// Its own thread: writing a large model's state takes a while, and leases
// must not wait for it.
void TallyServer::CheckpointLoop() {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  bool failing = false;
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopped),
                               absl::Milliseconds(100))) {
    mu_.Unlock();
    // A failing checkpoint (disk full, ...) is said once, and again once it
    // works; the jobs go on in memory meanwhile.
    const absl::Status s = coordinator_->Checkpoint(/*force=*/false);
    if (s.ok() == failing) {
      failing = !s.ok();
      std::fprintf(stderr, "tally-server: checkpoint: %s\n",
                   s.ok() ? "writing again" : std::string(s.message()).c_str());
    }
    mu_.Lock();
  }
}

void TallyServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  if (checkpointer_.joinable()) checkpointer_.join();
  if (server_ != nullptr)
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  // Nothing changes any more: keep every job's latest state.
  if (coordinator_ != nullptr) {
    if (absl::Status s = coordinator_->Checkpoint(/*force=*/true); !s.ok())
      std::fprintf(stderr, "tally-server: checkpoint: %s\n",
                   std::string(s.message()).c_str());
  }
}

TallyServer::~TallyServer() { Shutdown(absl::Seconds(1)); }

}  // namespace tally
