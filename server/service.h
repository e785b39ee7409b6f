// gRPC services of tally-server, on the callback API: one reactor per
// streaming call, nothing blocking inside a reactor. They translate between
// the wire and the Coordinator / ParameterShard, which hold all state;
// absl::Status becomes grpc::Status here and nowhere else.
#ifndef TALLY_SERVER_SERVICE_H_
#define TALLY_SERVER_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/tally.grpc.pb.h"
#include "server/coordinator.h"

namespace grpc {
class Server;
}

namespace tally {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(Coordinator* coordinator) : coord_(coordinator) {}
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

 private:
  Coordinator* coord_;  // borrowed
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  explicit WorkerServiceImpl(Coordinator* coordinator) : coord_(coordinator) {}
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

 private:
  Coordinator* coord_;  // borrowed
};

class ParameterServiceImpl final
    : public v1::ParameterService::CallbackService {
 public:
  explicit ParameterServiceImpl(Coordinator* coordinator)
      : coord_(coordinator) {}
  ParameterServiceImpl(const ParameterServiceImpl&) = delete;
  ParameterServiceImpl& operator=(const ParameterServiceImpl&) = delete;
  grpc::ServerReadReactor<v1::PushRequest>* PushGradients(
      grpc::CallbackServerContext* ctx, v1::PushResponse* resp) override;
  grpc::ServerWriteReactor<v1::PullResponse>* PullWeights(
      grpc::CallbackServerContext* ctx, const v1::PullRequest* req) override;

 private:
  Coordinator* coord_;  // borrowed
};

// A running tally-server: the three services plus grpc.health.v1.
class TallyServer {
 public:
  // Listens on `address` ("0.0.0.0:7070"; port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<TallyServer>> Start(
      const std::string& address, const CoordinatorOptions& options);
  TallyServer(const TallyServer&) = delete;
  TallyServer& operator=(const TallyServer&) = delete;
  ~TallyServer();

  int port() const { return port_; }
  Coordinator& coordinator() { return *coordinator_; }
  // Stops accepting calls and cancels the rest, waiting at most `grace`.
  void Shutdown(absl::Duration grace);

 private:
  TallyServer() = default;
  void TickLoop();
  void CheckpointLoop();

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<ParameterServiceImpl> params_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;        // runs Coordinator::Tick every 100 ms
  std::thread checkpointer_;  // with a state_dir: Checkpoint every 100 ms
};

}  // namespace tally

#endif  // TALLY_SERVER_SERVICE_H_
