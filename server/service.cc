#include "server/service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/internal/event_reactor.h"

namespace tally {

namespace {

using internal::EventWriteReactor;

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// A streaming call refused before it starts.
template <typename T>
class RefusedWrite final : public grpc::ServerWriteReactor<T> {
 public:
  explicit RefusedWrite(const absl::Status& status) {
    this->Finish(ToGrpc(status));
  }
  void OnDone() override { delete this; }
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

absl::StatusOr<v1::Job> JobServiceImpl::Visible(
    const grpc::CallbackServerContext& ctx, const std::string& job_id) const {
  auto job = coord_->Get(job_id);
  if (!job.ok()) return job.status();
  const Caller caller = CallerOf(ctx, tokens_);
  if (caller.role == Role::kSubmitter && job->owner() != caller.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        Quoted(job_id), " was submitted by someone else; a submitter sees "
        "and changes only its own jobs"));
  }
  return job;
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(
    grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
    v1::SubmitJobResponse* resp) {
  auto job = coord_->Submit(req->spec(), CallerOf(*ctx, tokens_).name);
  if (!job.ok()) return Reply(ctx, job.status());
  *resp->mutable_job() = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(
    grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
    v1::Job* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  auto job = Visible(*ctx, req->job_id());
  if (!job.ok()) return Reply(ctx, job.status());
  *resp = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJobHistory(
    grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
    v1::JobHistory* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  if (auto job = Visible(*ctx, req->job_id()); !job.ok())
    return Reply(ctx, job.status());
  auto history = coord_->History(req->job_id());
  if (!history.ok()) return Reply(ctx, history.status());
  *resp = *std::move(history);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(
    grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
    v1::ListJobsResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  JobQuery q;
  q.page_size = req->page_size() <= 0 ? 100 : std::min(req->page_size(), 1000);
  q.page_token = req->page_token();
  q.omit_spec = req->omit_spec();
  const Caller caller = CallerOf(*ctx, tokens_);
  if (caller.role == Role::kSubmitter) q.owner = caller.name;
  auto page = coord_->ListPage(q);
  if (!page.ok()) return Reply(ctx, page.status());
  for (v1::Job& j : page->jobs) *resp->add_jobs() = std::move(j);
  resp->set_next_page_token(page->next_page_token);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::Job>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* ctx, const v1::WatchJobRequest* req) {
  if (auto job = Visible(*ctx, req->job_id()); !job.ok())
    return new RefusedWrite<v1::Job>(job.status());
  return new WatchReactor(coord_, req->job_id());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(
    grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
    v1::Job* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  if (auto job = Visible(*ctx, req->job_id()); !job.ok())
    return Reply(ctx, job.status());
  auto job = coord_->Cancel(req->job_id());
  if (!job.ok()) return Reply(ctx, job.status());
  *resp = *std::move(job);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::FileChunk>* JobServiceImpl::FetchWeights(
    grpc::CallbackServerContext* ctx, const v1::FetchWeightsRequest* req) {
  if (auto job = Visible(*ctx, req->job_id()); !job.ok())
    return new RefusedWrite<v1::FileChunk>(job.status());
  return new FetchReactor(coord_, req->job_id());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* req,
    v1::RegisterWorkerResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  auto r = coord_->Register(*req);
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(
    grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
    v1::HeartbeatResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  auto r = coord_->Heartbeat(*req);
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportResult(
    grpc::CallbackServerContext* ctx, const v1::ReportResultRequest* req,
    v1::ReportResultResponse*) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  return Reply(ctx, coord_->ReportResult(*req));
}

grpc::ServerUnaryReactor* JobServiceImpl::ListShards(
    grpc::CallbackServerContext* ctx, const v1::ListShardsRequest*,
    v1::ListShardsResponse* resp) {
  for (v1::ShardInfo& s : coord_->ListShards()) *resp->add_shards() = std::move(s);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::RegisterShard(
    grpc::CallbackServerContext* ctx, const v1::RegisterShardRequest* req,
    v1::RegisterShardResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  const std::string& a = req->address();
  const bool host_port =
      !a.empty() && a.size() <= 256 && a.find(':') != std::string::npos &&
      a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789.-_:[]") == std::string::npos;
  if (!host_port) {
    return Reply(ctx, absl::InvalidArgumentError(
                          "a shard registers with its host:port (letters, "
                          "digits, '.', '-', '_', ':', '[', ']'; 256 bytes "
                          "at most)"));
  }
  *resp = coord_->RegisterShard(*req);
  return Reply(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* CoordinatorServiceImpl::ShardHeartbeat(
    grpc::CallbackServerContext* ctx, const v1::ShardHeartbeatRequest* req,
    v1::ShardHeartbeatResponse* resp) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return Reply(ctx, st);
  auto r = coord_->ShardHeartbeat(*req);
  if (!r.ok()) return Reply(ctx, r.status());
  *resp = *std::move(r);
  return Reply(ctx, absl::OkStatus());
}

// -------------------------------------------------------------- server --

absl::StatusOr<std::unique_ptr<TallyServer>> TallyServer::Start(
    const std::string& address, const CoordinatorOptions& options) {
  ServerOptions o;
  o.coordinator = options;
  return Start(address, o);
}

absl::StatusOr<std::unique_ptr<TallyServer>> TallyServer::Start(
    const std::string& address, const ServerOptions& options) {
  if (absl::Status st = CheckServerSecurity(address, options.security);
      !st.ok()) {
    return st;
  }
  std::unique_ptr<TallyServer> s(new TallyServer());
  s->options_ = options;
  const bool coordinator = options.join.empty();
  if (!coordinator || options.shard) {
    s->host_ = std::make_unique<ShardHost>(options.coordinator.clock,
                                           options.coordinator.spec_limits);
    s->host_->set_streamed_sums(options.streamed_sums,
                                options.streamed_sums_min_bytes / 4);
    s->host_->set_shared_memory(options.shared_memory_max_bytes);
    if (options.metrics != nullptr) {
      s->data_metrics_ =
          std::make_unique<DataPlaneMetrics>(options.metrics->registry());
    }
    s->params_ = std::make_unique<ParameterServiceImpl>(
        s->host_.get(), s->data_metrics_.get());
    s->shard_service_ = std::make_unique<ShardServiceImpl>(s->host_.get());
  }
  if (coordinator) {
    CoordinatorOptions co = options.coordinator;
    co.local_shard = s->host_.get();
    s->coordinator_ = std::make_unique<Coordinator>(co);
    // Jobs kept from an earlier run come back before anyone can connect.
    if (absl::Status r = s->coordinator_->Restore(); !r.ok()) return r;
    s->jobs_ = std::make_unique<JobServiceImpl>(s->coordinator_.get(),
                                                options.security.tokens.get());
    s->workers_ = std::make_unique<WorkerServiceImpl>(s->coordinator_.get());
    s->coordination_ =
        std::make_unique<CoordinatorServiceImpl>(s->coordinator_.get());
    if (options.metrics != nullptr) {
      s->collector_ =
          std::make_shared<CoordinatorCollector>(s->coordinator_.get());
      options.metrics->Add(s->collector_);
    }
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServer(address, &builder, &s->port_, options.security,
                  options.stream_window_bytes);
  if (s->jobs_ != nullptr) {
    builder.RegisterService(s->jobs_.get());
    builder.RegisterService(s->workers_.get());
    builder.RegisterService(s->coordination_.get());
  }
  if (s->params_ != nullptr) {
    builder.RegisterService(s->params_.get());
    builder.RegisterService(s->shard_service_.get());
  }
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (in use by another process?)"));
  }
  s->advertise_ = options.advertise;
  if (s->advertise_.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    s->advertise_ = absl::StrCat(host, ":", s->port_);
  }
  TallyServer* raw = s.get();
  s->ticker_ = std::thread([raw] { raw->TickLoop(); });
  if (coordinator && !options.coordinator.state_dir.empty())
    s->checkpointer_ = std::thread([raw] { raw->CheckpointLoop(); });
  if (!coordinator) s->shard_agent_ = std::thread([raw] { raw->ShardLoop(); });
  return s;
}

bool TallyServer::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  return mu_.AwaitWithTimeout(absl::Condition(&stopped), d);
}

void TallyServer::TickLoop() {
  for (int64_t tick = 1; !SleepUnlessStopped(absl::Milliseconds(100)); ++tick) {
    if (host_ != nullptr) host_->Tick();
    if (coordinator_ != nullptr) coordinator_->Tick();
    // Every 2 s: give back what large transient buffers left free (more
    // than 64 MiB of it), so a refused 1 GB request costs nothing after.
    if (tick % 20 == 0) ReturnFreeMemory(64 << 20);
  }
}

void TallyServer::ShardLoop() {
  auto channel = Dial(options_.join, options_.coordinator.transport);
  auto stub = v1::CoordinatorService::NewStub(channel);
  std::string shard_id;
  int64_t incarnation = 0;
  absl::Duration interval = absl::Milliseconds(100);
  absl::Duration backoff = absl::Milliseconds(100);
  bool said_away = false;
  while (true) {
    if (shard_id.empty()) {
      v1::RegisterShardRequest req;
      req.set_address(advertise_);
      v1::RegisterShardResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      absl::Status st = FromGrpc(stub->RegisterShard(&ctx, req, &resp));
      if (!st.ok()) {
        if (!said_away) {
          std::fprintf(stderr,
                       "tally-server: cannot register with %s: %s; retrying\n",
                       options_.join.c_str(), std::string(st.message()).c_str());
          said_away = true;
        }
        if (SleepUnlessStopped(backoff)) return;
        backoff = std::min(backoff * 2, absl::Seconds(2));
        continue;
      }
      shard_id = resp.shard_id();
      incarnation = resp.incarnation();
      // Well within the lease: a few heartbeats may be lost.
      interval = std::clamp(absl::Milliseconds(resp.lease_ms()) / 6,
                            absl::Milliseconds(20), absl::Milliseconds(500));
      backoff = absl::Milliseconds(100);
      said_away = false;
      std::fprintf(stderr,
                   "tally-server: registered with %s as %s (%s; lease %lld ms)\n",
                   options_.join.c_str(), shard_id.c_str(), advertise_.c_str(),
                   static_cast<long long>(resp.lease_ms()));
    }
    v1::ShardHeartbeatRequest req;
    req.set_shard_id(shard_id);
    req.set_incarnation(incarnation);
    for (v1::RangeStatus& r : host_->Status()) *req.add_ranges() = std::move(r);
    v1::ShardHeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + interval * 2 +
                                        absl::Milliseconds(200)));
    absl::Status st = FromGrpc(stub->ShardHeartbeat(&ctx, req, &resp));
    if (st.ok()) {
      for (const auto& d : resp.drop())
        host_->Drop(d.job_id(), /*ended=*/false, d.map_version());
      for (const auto& d : resp.ended())
        host_->Drop(d.job_id(), /*ended=*/true, d.map_version());
    } else if (ReasonOf(st) == v1::REGISTER_AGAIN) {
      // The coordinator restarted or gave us up: what we hold is stale, and
      // it places its jobs again from its own checkpoints.
      std::fprintf(stderr, "tally-server: %s; registering again\n",
                   std::string(st.message()).c_str());
      host_->DropAll();
      shard_id.clear();
      continue;
    }
    if (SleepUnlessStopped(interval)) return;
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
  if (shard_agent_.joinable()) shard_agent_.join();
  if (server_ != nullptr)
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  // Nothing changes any more: keep every job's latest state.
  if (coordinator_ != nullptr) {
    if (absl::Status s = coordinator_->Checkpoint(/*force=*/true); !s.ok())
      std::fprintf(stderr, "tally-server: checkpoint: %s\n",
                   std::string(s.message()).c_str());
  }
}

TallyServer::~TallyServer() {
  // First: a scrape must not read a coordinator that is going away.
  if (collector_ != nullptr) options_.metrics->Remove(collector_);
  Shutdown(absl::Seconds(1));
}

}  // namespace tally
