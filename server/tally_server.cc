#include "server/tally_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "proto/attendance.h"
#include "proto/errors.h"
#include "proto/tensor_chunk.h"
#include "proto/transport.h"
#include "server/data/local_shard_control.h"

namespace tally {

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
  grpc::EnableDefaultHealthCheckService(true);
  // The data wing listens first: the coordinator names its own shard's
  // address in every shard map.
  if (!coordinator || options.shard) {
    s->MakeDataWing();
    std::string data_address = address;
    if (coordinator) {
      TALLY_ASSIGN_OR_RETURN(data_address, DataAddress(address, options));
      TALLY_RETURN_IF_ERROR(CheckServerSecurity(data_address, options.security));
    }
    TALLY_RETURN_IF_ERROR(s->Listen(data_address, Plane::kData));
    s->advertise_ = options.advertise;
    if (s->advertise_.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      s->advertise_ = coordinator ? absl::StrCat(":", s->data_port_)
                                  : absl::StrCat(host, ":", s->data_port_);
    }
  }
  if (coordinator) {
    TALLY_RETURN_IF_ERROR(s->MakeControlWing());
    TALLY_RETURN_IF_ERROR(s->Listen(address, Plane::kControl));
  }
  TallyServer* raw = s.get();
  s->ticker_ = std::thread([raw] { raw->TickLoop(); });
  if (coordinator && !options.coordinator.state_dir.empty())
    s->checkpointer_ = std::thread([raw] { raw->CheckpointLoop(); });
  if (!coordinator) s->shard_agent_ = std::thread([raw] { raw->ShardLoop(); });
  return s;
}

// Where a coordinator's own shard listens: options.data_address, or by
// default the control address's host with the next port (port 0: any).
absl::StatusOr<std::string> TallyServer::DataAddress(
    const std::string& address, const ServerOptions& options) {
  if (!options.data_address.empty()) return options.data_address;
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65534) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot derive the data plane's address from ", address,
        ": give it (--data_port)"));
  }
  return absl::StrCat(address.substr(0, colon), ":", port == 0 ? 0 : port + 1);
}

// One of this process's two listeners: the control wing's services on the
// control plane, the data wing's on the data plane (proto/transport.h).
absl::Status TallyServer::Listen(const std::string& address, Plane plane) {
  grpc::ServerBuilder builder;
  int* port = plane == Plane::kControl ? &port_ : &data_port_;
  ConfigureServer(address, &builder, port, options_.security, plane,
                  options_.stream_window_bytes);
  if (plane == Plane::kControl) {
    builder.RegisterService(jobs_.get());
    builder.RegisterService(workers_.get());
    builder.RegisterService(coordination_.get());
  } else {
    builder.RegisterService(params_.get());
    // The coordinator steers its own shard in process (LocalShardControl).
    if (!options_.join.empty()) builder.RegisterService(shard_service_.get());
  }
  std::unique_ptr<grpc::Server>& server =
      plane == Plane::kControl ? control_server_ : data_server_;
  server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (in use by another process?)"));
  }
  if (plane == Plane::kData && !options_.join.empty()) port_ = data_port_;
  return absl::OkStatus();
}

// The data wing: this process's shard host and its services.
void TallyServer::MakeDataWing() {
  const ServerOptions& o = options_;
  ShardHost::Options ho;
  ho.streamed_sums = o.streamed_sums;
  ho.streamed_sums_min_elements = o.streamed_sums_min_bytes / 4;
  ho.shared_memory_max_bytes = o.shared_memory_max_bytes;
  ho.max_table_bytes = o.max_table_bytes;
  ho.table_dir = o.table_dir;
  ho.waiting_rows_per_worker = o.waiting_rows_per_worker;
  ho.waiting_rows_in_all = o.waiting_rows_in_all;
  // A replicated range's primary dials its backup's shard as this server
  // dials others; ":port" is on the coordinator's host.
  ho.transport = o.coordinator.transport;
  if (!o.join.empty()) ho.coordinator_host = o.join.substr(0, o.join.rfind(':'));
  if (o.metrics != nullptr) {
    data_metrics_ = std::make_unique<DataPlaneMetrics>(o.metrics->registry());
    ho.publish_observer = [m = data_metrics_.get()](const PublishTimes& t) {
      m->Published(t.since_push, t.since_commit);
    };
  }
  host_ = std::make_unique<ShardHost>(o.coordinator.clock,
                                      o.coordinator.spec_limits, std::move(ho));
  params_ =
      std::make_unique<ParameterServiceImpl>(host_.get(), data_metrics_.get());
  shard_service_ = std::make_unique<ShardServiceImpl>(host_.get());
}

// The control wing: the coordinator (given this process's shard as a
// ShardControl, if it has one), restored from its state directory, and its
// services.
absl::Status TallyServer::MakeControlWing() {
  const ServerOptions& o = options_;
  CoordinatorOptions co = o.coordinator;
  if (host_ != nullptr) {
    co.local_shard = MakeLocalShardControl(host_.get());
    co.local_shard_address = advertise_;
  }
  coordinator_ = std::make_unique<Coordinator>(co);
  // Jobs kept from an earlier run come back before anyone can connect.
  TALLY_RETURN_IF_ERROR(coordinator_->Restore());
  jobs_ = std::make_unique<JobServiceImpl>(coordinator_.get(),
                                           o.security.tokens.get());
  workers_ = std::make_unique<WorkerServiceImpl>(coordinator_.get(), &attends_);
  coordination_ =
      std::make_unique<CoordinatorServiceImpl>(coordinator_.get(), &attends_);
  if (o.metrics != nullptr) {
    collector_ = std::make_shared<CoordinatorCollector>(coordinator_.get());
    o.metrics->Add(collector_);
  }
  return absl::OkStatus();
}

bool TallyServer::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  return mu_.AwaitWithTimeout(absl::Condition(&stopped), d);
}

void TallyServer::TickLoop() {
  absl::Time pinged = absl::Now();
  for (int64_t tick = 1; !SleepUnlessStopped(absl::Milliseconds(100)); ++tick) {
    if (host_ != nullptr) host_->Tick();
    if (coordinator_ != nullptr) coordinator_->Tick();
    if (coordinator_ != nullptr && absl::Now() - pinged >= options_.attend_ping) {
      attends_.Ping();
      pinged = absl::Now();
    }
    // Every 2 s: give back what large transient buffers left free (more
    // than 64 MiB of it), so a refused 1 GB request costs nothing after.
    if (tick % 20 == 0) ReturnFreeMemory(64 << 20);
  }
}

void TallyServer::ShardLoop() {
  auto channel = Dial(options_.join, options_.coordinator.transport);
  auto stub = v1::CoordinatorService::NewStub(channel);
  // Held open while each registration lives: a killed shard's lease ends
  // with its connection.
  Attendance attendance(
      [&stub](grpc::ClientContext* ctx, const std::string& id,
              int64_t incarnation) {
        v1::AttendShardRequest req;
        req.set_shard_id(id);
        req.set_incarnation(incarnation);
        return stub->AttendShard(ctx, req);
      },
      absl::Milliseconds(100), absl::Seconds(2));
  ShardRegistration reg;
  absl::Duration backoff = absl::Milliseconds(100);
  bool said_away = false;
  while (true) {
    if (reg.shard_id.empty()) {
      absl::Status st = RegisterShard(*stub, reg);
      if (!st.ok()) {
        if (!said_away) {
          std::fprintf(
              stderr, "tally-server: cannot register with %s: %s; retrying\n",
              options_.join.c_str(), std::string(st.message()).c_str());
          said_away = true;
        }
        if (SleepUnlessStopped(backoff)) return;
        backoff = std::min(backoff * 2, absl::Seconds(2));
        continue;
      }
      backoff = absl::Milliseconds(100);
      said_away = false;
      attendance.Registered(reg.shard_id, reg.incarnation);
    }
    absl::Status st = ShardHeartbeat(*stub, reg);
    if (ReasonOf(st) == v1::REGISTER_AGAIN) {
      // The coordinator restarted or gave us up: what we hold is stale, and
      // it places its jobs again from its own checkpoints.
      std::fprintf(stderr, "tally-server: %s; registering again\n",
                   std::string(st.message()).c_str());
      host_->DropAll();
      reg.shard_id.clear();
      attendance.Registered("", 0);
      continue;
    }
    if (SleepUnlessStopped(reg.interval)) return;
  }
}

absl::Status TallyServer::RegisterShard(v1::CoordinatorService::Stub& stub,
                                        ShardRegistration& reg) {
  v1::RegisterShardRequest req;
  req.set_address(advertise_);
  v1::RegisterShardResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  TALLY_RETURN_IF_ERROR(FromGrpc(stub.RegisterShard(&ctx, req, &resp)));
  reg.shard_id = resp.shard_id();
  reg.incarnation = resp.incarnation();
  // Well within the lease: a few heartbeats may be lost.
  reg.interval = std::clamp(absl::Milliseconds(resp.lease_ms()) / 6,
                            absl::Milliseconds(20), absl::Milliseconds(500));
  std::fprintf(stderr,
               "tally-server: registered with %s as %s (%s; lease %lld ms)\n",
               options_.join.c_str(), reg.shard_id.c_str(), advertise_.c_str(),
               static_cast<long long>(resp.lease_ms()));
  return absl::OkStatus();
}

// The shard's ranges to the coordinator; what it says to drop, dropped.
absl::Status TallyServer::ShardHeartbeat(v1::CoordinatorService::Stub& stub,
                                         const ShardRegistration& reg) {
  v1::ShardHeartbeatRequest req;
  req.set_shard_id(reg.shard_id);
  req.set_incarnation(reg.incarnation);
  for (v1::RangeStatus& r : host_->Status()) *req.add_ranges() = std::move(r);
  v1::ShardHeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + reg.interval * 2 +
                                      absl::Milliseconds(200)));
  TALLY_RETURN_IF_ERROR(FromGrpc(stub.ShardHeartbeat(&ctx, req, &resp)));
  for (const auto& d : resp.drop())
    host_->Drop(d.job_id(), /*ended=*/false, d.map_version());
  for (const auto& d : resp.ended())
    host_->Drop(d.job_id(), /*ended=*/true, d.map_version());
  return absl::OkStatus();
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
  const auto deadline = absl::ToChronoTime(absl::Now() + grace);
  attends_.EndAll();  // else the shutdown waits out its grace for them
  if (control_server_ != nullptr) control_server_->Shutdown(deadline);
  if (data_server_ != nullptr) data_server_->Shutdown(deadline);
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
