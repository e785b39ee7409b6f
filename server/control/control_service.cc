#include "server/control/control_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "common/spec/job_spec.h"
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

// The file in pieces of 1 MiB. A job's tables are read from its shards as
// the file goes out, on a thread of the reactor's own (their reads block),
// one piece ahead of the client at most.
class FetchReactor final : public grpc::ServerWriteReactor<v1::FileChunk> {
 public:
  // The file is made on the producer thread: an ended job's export may
  // wait for its retirement and read each shard's table sizes, which must
  // not hold one of gRPC's callback threads.
  FetchReactor(Coordinator* coord, const std::string& job_id)
      : producer_([this, coord, job_id] { Produce(coord, job_id); }) {}
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;
  }
  void OnDone() override {
    // Finish may call this on the producer itself.
    if (producer_.joinable()) {
      if (producer_.get_id() == std::this_thread::get_id()) {
        producer_.detach();
      } else {
        producer_.join();
      }
    }
    delete this;
  }

 private:
  static constexpr size_t kChunk = 1 << 20;

  void Produce(Coordinator* coord, const std::string& job_id) {
    auto file = coord->ExportWeights(job_id);
    if (!file.ok()) {
      Finish(ToGrpc(file.status()));
      return;
    }
    head_ = std::move(file->head);
    tables_ = std::move(file->tables);
    // On every chunk (Write sets only the data and the size).
    chunk_.set_buffers_note(file->buffers_note);
    total_ = static_cast<int64_t>(head_.size()) +
             (tables_ != nullptr ? tables_->bytes() : 0);
    for (size_t at = 0; at < head_.size(); at += kChunk) {
      if (!Write(head_.substr(at, kChunk))) return;
    }
    grpc::Status status = grpc::Status::OK;
    while (tables_ != nullptr) {
      absl::StatusOr<std::string> piece = tables_->Next();
      if (!piece.ok()) {
        status = ToGrpc(piece.status());
        break;
      }
      if (piece->empty()) break;
      if (!Write(*std::move(piece))) return;
    }
    mu_.LockWhen(absl::Condition(this, &FetchReactor::Idle));
    mu_.Unlock();
    Finish(status);
  }
  // One piece once the last is written; false (and finished) when the
  // client went away.
  bool Write(std::string data) {
    mu_.LockWhen(absl::Condition(this, &FetchReactor::Idle));
    const bool cancelled = cancelled_;
    writing_ = !cancelled;
    mu_.Unlock();
    if (cancelled) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return false;
    }
    chunk_.set_data(std::move(data));
    chunk_.set_total_size(total_);
    StartWrite(&chunk_);
    return true;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; }

  std::string head_;
  std::unique_ptr<TableExport> tables_;
  int64_t total_ = 0;
  v1::FileChunk chunk_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread producer_;  // last: it starts once the rest is made
};

}  // namespace

// ------------------------------------------------------------ services --

absl::StatusOr<v1::Job> JobServiceImpl::Visible(
    const grpc::CallbackServerContext& ctx, const std::string& job_id) const {
  auto job = coord_->Get(job_id);
  if (!job.ok()) return job.status();
  const Caller caller = CallerOf(ctx, tokens_);
  if (caller.role == Role::kSubmitter && job->owner() != caller.name) {
    return absl::PermissionDeniedError(
        absl::StrCat(Quoted(job_id),
                     " was submitted by someone else; a submitter sees "
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

// A worker's or a shard's Attend call, held until it ends: a cancel (its
// process died, or it let the call go) or a ping that cannot be written
// ends its lease; a shutdown (OpenAttends::EndAll) ends the call alone.
// No gRPC operation is started under its lock.
class AttendReactor final : public grpc::ServerWriteReactor<v1::AttendResponse> {
 public:
  AttendReactor(Coordinator* coord, OpenAttends* open, std::string id,
                int64_t incarnation)
      : coord_(coord), open_(open), id_(std::move(id)),
        incarnation_(incarnation) {}
  // Once: the first of a cancel, a broken ping and a shutdown finishes the
  // call (after the ping being written, if one is).
  void End(const grpc::Status& st) {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;
      ended_ = true;
      if (writing_) {
        end_ = st;
        return;  // OnWriteDone finishes
      }
    }
    Finish(st);
  }
  void Ping() {
    {
      absl::MutexLock lock(&mu_);
      if (ended_ || writing_) return;
      writing_ = true;
    }
    StartWrite(&ping_);
  }
  void OnWriteDone(bool ok) override {
    bool gone = false;
    grpc::Status st;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ended_) {
        st = end_;  // End came while the ping was out
      } else if (!ok) {
        ended_ = gone = true;  // the connection broke under it
        st = grpc::Status::CANCELLED;
      } else {
        return;
      }
    }
    if (gone) coord_->Gone(id_, incarnation_);
    Finish(st);
  }
  void OnCancel() override {
    coord_->Gone(id_, incarnation_);
    End(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    open_->Remove(this);
    delete this;
  }

 private:
  Coordinator* const coord_;
  OpenAttends* const open_;
  const std::string id_;
  const int64_t incarnation_;
  const v1::AttendResponse ping_;
  absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status end_ ABSL_GUARDED_BY(mu_);
};

bool OpenAttends::Add(AttendReactor* call) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  open_.insert(call);
  return true;
}

void OpenAttends::Remove(AttendReactor* call) {
  absl::MutexLock lock(&mu_);
  open_.erase(call);
}

void OpenAttends::Ping() {
  // Under the lock, as EndAll.
  absl::MutexLock lock(&mu_);
  for (AttendReactor* call : open_) call->Ping();
}

void OpenAttends::EndAll() {
  // Under the lock, so that no call is deleted meanwhile: its OnDone runs
  // after Finish on another thread, and waits here in Remove.
  absl::MutexLock lock(&mu_);
  ended_ = true;
  for (AttendReactor* call : open_)
    call->End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "the coordinator is shutting down"));
}

namespace {

grpc::ServerWriteReactor<v1::AttendResponse>* Attend(Coordinator* coord,
                                                     OpenAttends* open,
                                                     const std::string& id,
                                                     int64_t incarnation) {
  if (absl::Status st = coord->CheckLease(id, incarnation); !st.ok())
    return new RefusedWrite<v1::AttendResponse>(st);
  auto* call = new AttendReactor(coord, open, id, incarnation);
  if (!open->Add(call)) {
    // Not yet started: finishing it now runs OnDone, which deletes it.
    call->End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "the coordinator is shutting down"));
  }
  return call;
}

}  // namespace

grpc::ServerWriteReactor<v1::AttendResponse>* WorkerServiceImpl::Attend(
    grpc::CallbackServerContext*, const v1::AttendRequest* req) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return new RefusedWrite<v1::AttendResponse>(st);
  return tally::Attend(coord_, attends_, req->worker_id(), req->incarnation());
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportResult(
    grpc::CallbackServerContext* ctx, const v1::ReportResultRequest* req,
    v1::ReportResultResponse*) {
  // A Python model's buffers are bounded on their own (and checked against
  // the job's size by the coordinator); the rest as any control message.
  if (req->buffers().size() > static_cast<size_t>(SpecLimits().max_buffer_bytes) ||
      req->ByteSizeLong() - req->buffers().size() > kMaxControlBytes) {
    return Reply(ctx, absl::ResourceExhaustedError(absl::StrCat(
                          "a report is at most ", kMaxControlBytes,
                          " bytes besides buffers of at most ",
                          SpecLimits().max_buffer_bytes)));
  }
  return Reply(ctx, coord_->ReportResult(*req));
}

namespace {

// A Python model's initial weights: the sender checked (the worker asked
// for them) and the offer let in (one a job, within the coordinator's
// bytes for offers: Coordinator::BeginInitialWeights) before anything is
// allocated, then chunks in order, each checked, straight into the
// vector. An offer whose job ends, or whose worker leaves it, is finished
// then by the coordinator (Ender), and its values go with the reactor.
class InitialWeightsReactor
    : public grpc::ServerReadReactor<v1::InitialWeightsChunk> {
 public:
  InitialWeightsReactor(Coordinator* coord,
                        v1::OfferInitialWeightsResponse* resp)
      : coord_(coord), resp_(resp), handle_(std::make_shared<Handle>()) {
    handle_->reactor = this;
    StartRead(&msg_);
  }
  void OnReadDone(bool ok) override {
    if (Finished()) return;  // ended by the coordinator: nothing more
    absl::Status s = ok ? Add() : Install();
    if (!s.ok() || !ok) {
      // Its place and values go before the answer does, so that the
      // worker's next offer does not find them still held.
      std::vector<float>().swap(weights_);
      offer_.reset();
      FinishOnce(s);
      return;
    }
    absl::MutexLock lock(&mu_);
    if (!finished_) StartRead(&msg_);
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&handle_->mu);
      handle_->reactor = nullptr;
    }
    Unref();
  }

 private:
  // What the coordinator holds to end the offer: the reactor while gRPC
  // has it, null after.
  struct Handle {
    absl::Mutex mu;
    InitialWeightsReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  // The coordinator's end of the offer. The reactor is kept (a reference)
  // while the call is finished without the handle's lock, since gRPC may
  // run OnDone on the finishing thread.
  std::function<void(absl::Status)> Ender() {
    return [handle = handle_](absl::Status why) {
      InitialWeightsReactor* r = nullptr;
      {
        absl::MutexLock lock(&handle->mu);
        r = handle->reactor;
        if (r == nullptr) return;
        r->refs_.fetch_add(1);
      }
      r->FinishOnce(why);
      r->Unref();
    };
  }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  bool Finished() {
    absl::MutexLock lock(&mu_);
    return finished_;
  }
  // Finishes the call, once (the reader and the coordinator may race).
  void FinishOnce(const absl::Status& s) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(ToGrpc(s));
  }

  absl::Status Add() {
    if (offer_ == nullptr) {  // the first message
      job_ = msg_.job_id();
      worker_ = msg_.worker_id();
      incarnation_ = msg_.incarnation();
      TALLY_ASSIGN_OR_RETURN(
          offer_,
          coord_->BeginInitialWeights(job_, worker_, incarnation_, Ender()));
      n_ = offer_->values();
      weights_.reserve(n_);  // let in: the sender is the one asked
    }
    if (!msg_.has_chunk()) return absl::OkStatus();
    const v1::TensorChunk& c = msg_.chunk();
    TALLY_RETURN_IF_ERROR(CheckChunk(c, n_));
    if (c.dtype() != v1::FLOAT32 || c.offset() != filled_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial weights come as float32 chunks in order: a chunk at ",
          c.offset(), " where ", filled_, " was next"));
    }
    weights_.resize(filled_ + c.count());
    DecodeChunk(c, weights_.data());
    for (int64_t i = c.offset(); i < c.offset() + c.count(); ++i) {
      if (!std::isfinite(weights_[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("initial weight ", i, " is not finite"));
      }
    }
    filled_ += c.count();
    return absl::OkStatus();
  }
  absl::Status Install() {
    if (offer_ == nullptr) return absl::InvalidArgumentError("an empty offer");
    if (filled_ != n_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial weights cover ", filled_, " of the model's ", n_, " values"));
    }
    TALLY_RETURN_IF_ERROR(coord_->SetInitialWeights(
        job_, worker_, incarnation_, std::move(weights_)));
    resp_->set_taken(true);
    return absl::OkStatus();
  }

  Coordinator* coord_;                       // borrowed
  v1::OfferInitialWeightsResponse* resp_;    // borrowed
  std::shared_ptr<Handle> handle_;
  // gRPC's, until OnDone; an Ender's while it finishes the call.
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  v1::InitialWeightsChunk msg_;
  std::string job_, worker_;
  int64_t incarnation_ = 0;
  // Its place among the offers being read, held while the values are
  // (until the answer, or until the reactor goes when the coordinator
  // ended the offer: a read may be filling them then).
  std::unique_ptr<WeightOffers::Offer> offer_;
  int64_t n_ = 0;  // values expected
  int64_t filled_ = 0;
  std::vector<float> weights_;
};

}  // namespace

grpc::ServerReadReactor<v1::InitialWeightsChunk>*
WorkerServiceImpl::OfferInitialWeights(
    grpc::CallbackServerContext*, v1::OfferInitialWeightsResponse* resp) {
  return new InitialWeightsReactor(coord_, resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListShards(
    grpc::CallbackServerContext* ctx, const v1::ListShardsRequest*,
    v1::ListShardsResponse* resp) {
  for (v1::ShardInfo& s : coord_->ListShards())
    *resp->add_shards() = std::move(s);
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
      a.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
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

grpc::ServerWriteReactor<v1::AttendResponse>*
CoordinatorServiceImpl::AttendShard(grpc::CallbackServerContext*,
                                    const v1::AttendShardRequest* req) {
  if (absl::Status st = CheckControlMessage(*req); !st.ok())
    return new RefusedWrite<v1::AttendResponse>(st);
  return Attend(coord_, attends_, req->shard_id(), req->incarnation());
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

}  // namespace tally
