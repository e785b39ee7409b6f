// The control plane's gRPC services over the Coordinator: JobService (for
// clients), WorkerService (for workers) and CoordinatorService (for shard
// processes). Callback API: one reactor per streaming call, thin handlers
// that call the coordinator; absl::Status becomes grpc::Status here.
#ifndef TALLY_SERVER_CONTROL_CONTROL_SERVICE_H_
#define TALLY_SERVER_CONTROL_CONTROL_SERVICE_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/auth.h"
#include "proto/tally.grpc.pb.h"
#include "server/control/coordinator.h"

namespace tally {

// Who may see or change a job: with a token table, a submitter only its own
// jobs (PERMISSION_DENIED otherwise); the method itself was checked by
// TokenAuthProcessor (proto/auth.h).
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  // `tokens` is borrowed; null: no tokens, every caller is an admin.
  JobServiceImpl(Coordinator* coordinator, const TokenTable* tokens)
      : coord_(coordinator), tokens_(tokens) {}
  JobServiceImpl(const JobServiceImpl&) = delete;
  JobServiceImpl& operator=(const JobServiceImpl&) = delete;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(
      grpc::CallbackServerContext* ctx,
      const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::FileChunk>* FetchWeights(
      grpc::CallbackServerContext* ctx,
      const v1::FetchWeightsRequest* req) override;
  grpc::ServerUnaryReactor* ListShards(grpc::CallbackServerContext* ctx,
                                       const v1::ListShardsRequest* req,
                                       v1::ListShardsResponse* resp) override;
  grpc::ServerUnaryReactor* GetJobHistory(grpc::CallbackServerContext* ctx,
                                          const v1::GetJobRequest* req,
                                          v1::JobHistory* resp) override;

 private:
  // The job, if the caller may see and act on it.
  absl::StatusOr<v1::Job> Visible(const grpc::CallbackServerContext& ctx,
                                  const std::string& job_id) const;

  Coordinator* coord_;        // borrowed
  const TokenTable* tokens_;  // borrowed; may be null
};

class AttendReactor;

// The Attend and AttendShard calls a coordinator holds open. Ping sends
// each an empty message, so that a proxy between sees traffic on an idle
// call; a shutdown ends them first (EndAll): gRPC's own shutdown waits its
// whole grace for calls that never end by themselves. Thread-safe.
class OpenAttends {
 public:
  OpenAttends() = default;
  OpenAttends(const OpenAttends&) = delete;
  OpenAttends& operator=(const OpenAttends&) = delete;

  // False once EndAll has run: the call is refused.
  bool Add(AttendReactor* call);
  void Remove(AttendReactor* call);
  // An empty AttendResponse on every call not writing one already.
  void Ping();
  // Ends every call held with UNAVAILABLE, and refuses new ones. Leases
  // stay as they are: the coordinator is going away.
  void EndAll();

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<AttendReactor*> open_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(Coordinator* coordinator, OpenAttends* attends)
      : coord_(coordinator), attends_(attends) {}
  WorkerServiceImpl(const WorkerServiceImpl&) = delete;
  WorkerServiceImpl& operator=(const WorkerServiceImpl&) = delete;
  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* ctx, const v1::RegisterWorkerRequest* req,
      v1::RegisterWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* ReportResult(
      grpc::CallbackServerContext* ctx, const v1::ReportResultRequest* req,
      v1::ReportResultResponse* resp) override;
  grpc::ServerWriteReactor<v1::AttendResponse>* Attend(
      grpc::CallbackServerContext* ctx,
      const v1::AttendRequest* req) override;
  grpc::ServerReadReactor<v1::InitialWeightsChunk>* OfferInitialWeights(
      grpc::CallbackServerContext* ctx,
      v1::OfferInitialWeightsResponse* resp) override;

 private:
  Coordinator* coord_;     // borrowed
  OpenAttends* attends_;   // borrowed
};

class CoordinatorServiceImpl final
    : public v1::CoordinatorService::CallbackService {
 public:
  CoordinatorServiceImpl(Coordinator* coordinator, OpenAttends* attends)
      : coord_(coordinator), attends_(attends) {}
  CoordinatorServiceImpl(const CoordinatorServiceImpl&) = delete;
  CoordinatorServiceImpl& operator=(const CoordinatorServiceImpl&) = delete;
  grpc::ServerUnaryReactor* RegisterShard(
      grpc::CallbackServerContext* ctx, const v1::RegisterShardRequest* req,
      v1::RegisterShardResponse* resp) override;
  grpc::ServerWriteReactor<v1::AttendResponse>* AttendShard(
      grpc::CallbackServerContext* ctx,
      const v1::AttendShardRequest* req) override;
  grpc::ServerUnaryReactor* ShardHeartbeat(
      grpc::CallbackServerContext* ctx, const v1::ShardHeartbeatRequest* req,
      v1::ShardHeartbeatResponse* resp) override;

 private:
  Coordinator* coord_;     // borrowed
  OpenAttends* attends_;   // borrowed
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_CONTROL_SERVICE_H_
