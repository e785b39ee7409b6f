// TallyServer: a running tally-server in its roles, the coordinator (the
// control wing, server/control/), a parameter shard (the data wing,
// server/data/), or both. The start-up code here is the only place that
// sees both wings: it builds the shard host and hands the coordinator a
// ShardControl over it (server/shard_control.h), and, in a shard process,
// registers the shard with its coordinator and heartbeats.
#ifndef TALLY_SERVER_TALLY_SERVER_H_
#define TALLY_SERVER_TALLY_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "proto/auth.h"
#include "proto/transport.h"
#include "server/control/control_service.h"
#include "server/control/coordinator.h"
#include "server/control/coordinator_metrics.h"
#include "server/data/data_metrics.h"
#include "server/data/shard_host.h"
#include "server/data/shard_service.h"

namespace grpc {
class Server;
}

namespace tally {

struct ServerOptions {
  // The coordinator's options; its local_shard is set by Start.
  CoordinatorOptions coordinator;
  // Run as a parameter shard only, joining the coordinator at this address
  // (host:port); empty: run the coordinator.
  std::string join;
  // With the coordinator: also hold parameters (the one-process cluster).
  bool shard = true;
  // A coordinator holding parameters: where its shard's data plane listens
  // (host:port). Empty: the control address's host and its port + 1 (port 0:
  // any free one). A shard process listens on its one address.
  std::string data_address;
  // How workers and the coordinator reach this shard (host:port). Empty: in
  // a shard process, this host's name and the bound port; in a coordinator,
  // ":port", the host workers dial for the coordinator with the data port.
  std::string advertise;
  // TLS, tokens and the plaintext rule for the listening port; how this
  // server dials others (a shard its coordinator, the coordinator its
  // shards) is coordinator.transport.
  ServerSecurity security;
  // Where this server's metrics go (server/control/coordinator_metrics.h,
  // server/data/data_metrics.h); borrowed, must outlive the server; null: none.
  MetricsEndpoint* metrics = nullptr;
  // Shards sum pushes as they arrive (bsp without backup workers) instead
  // of staging each whole (server/data/shard.h), in ranges of at least
  // streamed_sums_min_bytes (4 bytes a value), or on which the job's most
  // workers would stage that much in all.
  bool streamed_sums = true;
  int64_t streamed_sums_min_bytes = int64_t{16} << 20;
  // A worker on this host may share memory with a shard for its pushes and
  // pulls, in ranges of at most this many bytes (0: never; ShardHost::
  // Options::shared_memory_max_bytes).
  int64_t shared_memory_max_bytes = int64_t{16} << 20;
  // The bytes every job's embedding tables on this shard may take (0:
  // unbounded; ShardHost::Options::max_table_bytes). A fixed default, not a
  // share of the machine's memory: the same bound on every host, and in
  // a container, which sees the host's memory rather than its own limit.
  int64_t max_table_bytes = int64_t{4} << 30;
  // Where the shard checkpoints its tables' rows (ShardHost::Options::
  // table_dir); empty: nowhere.
  std::string table_dir;
  // What pulls of rows waiting on this shard may hold, a job's worker's
  // and all together (ShardHost::Options::waiting_rows_*).
  int64_t waiting_rows_per_worker = ShardHost::kMaxWaitingRowBytesPerWorker;
  int64_t waiting_rows_in_all = ShardHost::kMaxWaitingRowBytes;
  // Each stream's receive window (proto/transport.h): a push waiting for
  // lower ranks holds up to this much (and 1 MiB more) of shard memory.
  int stream_window_bytes = kServerStreamWindowBytes;
  // How often the coordinator writes an empty message on each Attend call
  // it holds, so that a proxy between it and a worker or shard process
  // does not end an idle call (and with it the lease).
  absl::Duration attend_ping = absl::Seconds(20);
};

// A running tally-server: its services plus grpc.health.v1 on each of its
// listeners. A coordinator listens for the control plane (jobs, workers,
// shard registrations) and, holding parameters, apart for its shard's data
// plane; a shard process listens for the data plane alone. gRPC's memory
// quota and message limit are per server, so a huge request to the control
// plane is cut at a small quota (proto/transport.h).
class TallyServer {
 public:
  // Listens on `address` ("0.0.0.0:7070"; port 0 picks a free one): the
  // control plane in a coordinator, the data plane in a shard process.
  static absl::StatusOr<std::unique_ptr<TallyServer>> Start(
      const std::string& address, const ServerOptions& options);
  // The one-process cluster: coordinator and shard.
  static absl::StatusOr<std::unique_ptr<TallyServer>> Start(
      const std::string& address, const CoordinatorOptions& options);
  TallyServer(const TallyServer&) = delete;
  TallyServer& operator=(const TallyServer&) = delete;
  ~TallyServer();

  // The port `address` named: the control plane's in a coordinator, the
  // data plane's in a shard process.
  int port() const { return port_; }
  // Where this process's shard serves pushes and pulls; 0: it holds none.
  int data_port() const { return data_port_; }
  // Null for a shard process.
  Coordinator* coordinator() { return coordinator_.get(); }
  // Null for a coordinator that holds no parameters.
  ShardHost* shard_host() { return host_.get(); }
  // Stops accepting calls and cancels the rest, waiting at most `grace`.
  void Shutdown(absl::Duration grace);

 private:
  TallyServer() = default;
  void MakeDataWing();
  absl::Status MakeControlWing();
  static absl::StatusOr<std::string> DataAddress(const std::string& address,
                                                 const ServerOptions& options);
  absl::Status Listen(const std::string& address, Plane plane);
  void TickLoop();
  void CheckpointLoop();
  // A shard process: registers with the coordinator and heartbeats, with
  // backoff while it is away; registers again when told to.
  void ShardLoop();
  // A shard process's registration with its coordinator.
  struct ShardRegistration {
    std::string shard_id;  // empty: not registered
    int64_t incarnation = 0;
    absl::Duration interval = absl::Milliseconds(100);  // between heartbeats
  };
  absl::Status RegisterShard(v1::CoordinatorService::Stub& stub,
                             ShardRegistration& reg);
  absl::Status ShardHeartbeat(v1::CoordinatorService::Stub& stub,
                              const ShardRegistration& reg);

  bool SleepUnlessStopped(absl::Duration d);

  ServerOptions options_;
  std::unique_ptr<DataPlaneMetrics> data_metrics_;
  std::shared_ptr<CoordinatorCollector>
      collector_;  // served by options_.metrics
  std::unique_ptr<ShardHost> host_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobServiceImpl> jobs_;
  OpenAttends attends_;
  std::unique_ptr<WorkerServiceImpl> workers_;
  std::unique_ptr<CoordinatorServiceImpl> coordination_;
  std::unique_ptr<ParameterServiceImpl> params_;
  std::unique_ptr<ShardServiceImpl> shard_service_;
  std::unique_ptr<grpc::Server> control_server_;
  std::unique_ptr<grpc::Server> data_server_;
  int port_ = 0;
  int data_port_ = 0;
  std::string advertise_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread ticker_;        // Tick every 100 ms
  std::thread checkpointer_;  // with a state_dir: Checkpoint every 100 ms
  std::thread shard_agent_;   // a shard process: ShardLoop
};

}  // namespace tally

#endif  // TALLY_SERVER_TALLY_SERVER_H_
