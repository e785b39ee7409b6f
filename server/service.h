// tally-server's control-plane services (JobService, WorkerService,
// CoordinatorService) over the Coordinator, and TallyServer, which runs a
// server in its roles: the coordinator, a parameter shard (the data-plane
// services, server/shard_service.h), or both. Callback API: one reactor per
// streaming call; absl::Status becomes grpc::Status here.
#ifndef TALLY_SERVER_SERVICE_H_
#define TALLY_SERVER_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/auth.h"
#include "proto/tally.grpc.pb.h"
#include "proto/transport.h"
#include "common/metrics/metrics.h"
#include "server/coordinator.h"
#include "server/server_metrics.h"
#include "server/shard_host.h"
#include "server/shard_service.h"

namespace grpc {
class Server;
}

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

  Coordinator* coord_;          // borrowed
  const TokenTable* tokens_;    // borrowed; may be null
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

class CoordinatorServiceImpl final
    : public v1::CoordinatorService::CallbackService {
 public:
  explicit CoordinatorServiceImpl(Coordinator* coordinator)
      : coord_(coordinator) {}
  CoordinatorServiceImpl(const CoordinatorServiceImpl&) = delete;
  CoordinatorServiceImpl& operator=(const CoordinatorServiceImpl&) = delete;
  grpc::ServerUnaryReactor* RegisterShard(
      grpc::CallbackServerContext* ctx, const v1::RegisterShardRequest* req,
      v1::RegisterShardResponse* resp) override;
  grpc::ServerUnaryReactor* ShardHeartbeat(
      grpc::CallbackServerContext* ctx, const v1::ShardHeartbeatRequest* req,
      v1::ShardHeartbeatResponse* resp) override;

 private:
  Coordinator* coord_;  // borrowed
};

struct ServerOptions {
  // The coordinator's options; its local_shard is set by Start.
  CoordinatorOptions coordinator;
  // Run as a parameter shard only, joining the coordinator at this address
  // (host:port); empty: run the coordinator.
  std::string join;
  // With the coordinator: also hold parameters (the one-process cluster).
  bool shard = true;
  // How workers and the coordinator reach this shard (host:port); empty:
  // this host's name and the bound port.
  std::string advertise;
  // TLS, tokens and the plaintext rule for the listening port; how this
  // server dials others (a shard its coordinator, the coordinator its
  // shards) is coordinator.transport.
  ServerSecurity security;
  // Where this server's metrics go (server/server_metrics.h); borrowed,
  // must outlive the server; null: none.
  MetricsEndpoint* metrics = nullptr;
  // Shards sum pushes as they arrive (bsp without backup workers) instead
  // of staging each whole (server/shard.h), in ranges of at least
  // streamed_sums_min_bytes (4 bytes a value).
  bool streamed_sums = true;
  int64_t streamed_sums_min_bytes = int64_t{16} << 20;
  // A worker on this host may share memory with a shard for its pushes and
  // pulls, in ranges of at most this many bytes (0: never; ShardHost::
  // set_shared_memory).
  int64_t shared_memory_max_bytes = int64_t{16} << 20;
  // Each stream's receive window (proto/transport.h): a push waiting for
  // lower ranks holds up to this much (and 1 MiB more) of shard memory.
  int stream_window_bytes = kServerStreamWindowBytes;
};

// A running tally-server: its services plus grpc.health.v1.
class TallyServer {
 public:
  // Listens on `address` ("0.0.0.0:7070"; port 0 picks a free one).
  static absl::StatusOr<std::unique_ptr<TallyServer>> Start(
      const std::string& address, const ServerOptions& options);
  // The one-process cluster: coordinator and shard.
  static absl::StatusOr<std::unique_ptr<TallyServer>> Start(
      const std::string& address, const CoordinatorOptions& options);
  TallyServer(const TallyServer&) = delete;
  TallyServer& operator=(const TallyServer&) = delete;
  ~TallyServer();

  int port() const { return port_; }
  // Null for a shard process.
  Coordinator* coordinator() { return coordinator_.get(); }
  // Null for a coordinator that holds no parameters.
  ShardHost* shard_host() { return host_.get(); }
  // Stops accepting calls and cancels the rest, waiting at most `grace`.
  void Shutdown(absl::Duration grace);

 private:
  TallyServer() = default;
  void TickLoop();
  void CheckpointLoop();
  // A shard process: registers with the coordinator and heartbeats, with
  // backoff while it is away; registers again when told to.
  void ShardLoop();
  bool SleepUnlessStopped(absl::Duration d);

  ServerOptions options_;
  std::unique_ptr<DataPlaneMetrics> data_metrics_;
  std::shared_ptr<CoordinatorCollector> collector_;  // served by options_.metrics
  std::unique_ptr<ShardHost> host_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> jobs_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<CoordinatorServiceImpl> coordination_;
  std::unique_ptr<ParameterServiceImpl> params_;
  std::unique_ptr<ShardServiceImpl> shard_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string advertise_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;        // Tick every 100 ms
  std::thread checkpointer_;  // with a state_dir: Checkpoint every 100 ms
  std::thread shard_agent_;   // a shard process: ShardLoop
};

}  // namespace tally

#endif  // TALLY_SERVER_SERVICE_H_
