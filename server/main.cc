// tally-server: the coordinator and/or a parameter shard.
//
//   tally-server [--port=7070] [--data_port=7071] [--lease_timeout_ms=3000]
//                [--noshard] [--state_dir=DIR [--checkpoint_interval_s=30]]
//   tally-server --coordinator=HOST:7070 --port=7072 [--advertise=HOST:7072]
// Every form takes --tls_ca/--tls_cert/--tls_key (mTLS) and --tokens=FILE
// (roles; proto/auth.h); without TLS it listens on loopback by default and
// refuses any other address unless --insecure.
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/http/http_server.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "common/stop_signal.h"
#include "proto/auth.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "server/dashboard/dashboard.h"
#include "server/tally_server.h"

ABSL_FLAG(std::string, listen, "",
          "Address to listen on (default: 0.0.0.0 with TLS or --insecure, "
          "127.0.0.1 otherwise; anything but loopback needs one of them)");
ABSL_FLAG(bool, insecure, false,
          "Allow listening beyond loopback without TLS (anyone who reaches "
          "the port may do anything)");
ABSL_FLAG(std::string, tokens, "",
          "Token file (lines \"TOKEN ROLE NAME\"; roles admin, submitter, "
          "viewer, worker): every call must carry a token whose role allows "
          "it. Needs TLS. A shard process and the coordinator also present "
          "--token_file (an admin token) to each other");
ABSL_FLAG(int64_t, max_queued_jobs, tally::CoordinatorOptions().max_queued_jobs,
          "Refuse submissions while this many jobs wait for workers");
ABSL_FLAG(int64_t, max_queued_jobs_per_submitter,
          tally::CoordinatorOptions().max_queued_jobs_per_submitter,
          "Refuse a named submitter's jobs while this many of theirs wait "
          "(servers with --tokens)");
ABSL_FLAG(int64_t, max_workers, tally::CoordinatorOptions().max_workers,
          "Refuse worker registrations beyond this many");
ABSL_FLAG(int64_t, max_offer_bytes, tally::CoordinatorOptions().max_offer_bytes,
          "The bytes of Python models' initial weights the coordinator "
          "reads at once, all workers' offers together (one a job; one "
          "offer alone may be larger): more are refused "
          "(RESOURCE_EXHAUSTED) and offered again");
ABSL_FLAG(int64_t, max_finished_jobs,
          tally::CoordinatorOptions().max_finished_jobs,
          "Keep at most this many ended jobs (oldest are dropped, with their "
          "files)");
ABSL_FLAG(double, finished_job_ttl_h, 0,
          "Drop ended jobs this many hours after they end (0: never by age)");
ABSL_FLAG(std::string, keep_weights_dir, "",
          "Write a dropped job's final weights here as JOB.safetensors");
ABSL_FLAG(int, port, 7070,
          "Port to listen on (0 picks a free one): a coordinator's control "
          "plane (jobs, workers, shard registrations), a shard's data plane");
ABSL_FLAG(int, data_port, -1,
          "A coordinator holding parameters: the port its shard serves "
          "pushes and pulls on (default: --port + 1; with --port=0 any)");
ABSL_FLAG(int64_t, lease_timeout_ms, 3000,
          "The coordinator's lease: a worker or shard that sends no "
          "heartbeat for this long is dropped (a shard process takes the "
          "coordinator's)");
ABSL_FLAG(std::string, state_dir, "",
          "Keep jobs (records, weights, optimizer state) in this directory "
          "and resume them after a restart; empty: in memory only");
ABSL_FLAG(std::string, coordinator, "",
          "Run as a parameter shard of the coordinator at this host:port "
          "(empty: run the coordinator)");
ABSL_FLAG(bool, shard, true,
          "The coordinator also holds parameters (a one-process cluster); "
          "--noshard leaves them to shard processes");
ABSL_FLAG(std::string, advertise, "",
          "A shard's host:port as workers and the coordinator reach it "
          "(default: this host's name and --port)");
ABSL_FLAG(int64_t, max_spec_bytes, tally::SpecLimits().max_spec_bytes,
          "Refuse job specs longer than this");
ABSL_FLAG(int64_t, max_params, tally::SpecLimits().max_params,
          "Refuse models with more parameters than this (workers and shards "
          "hold the default; see docs/job-spec.md)");
ABSL_FLAG(int, http_port, 0,
          "The coordinator's dashboard at http://HTTP_LISTEN:PORT/ (0: off)");
ABSL_FLAG(std::string, http_listen, "127.0.0.1",
          "Address the dashboard listens on (it checks no tokens: loopback "
          "unless you put it behind a proxy)");
ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics at http://LISTEN:PORT/metrics (0: off)");
ABSL_FLAG(bool, streamed_sums, true,
          "Sum each push into the step's sum as it arrives (bsp without "
          "backup workers; one sum per shard); false: stage each push whole "
          "until its step closes (one buffer per member)");
ABSL_FLAG(int64_t, streamed_sums_min_bytes,
          tally::ServerOptions().streamed_sums_min_bytes,
          "With --streamed_sums: ranges smaller than this stage their pushes "
          "unless the job's most workers would stage this much on them in "
          "all (small pushes summed as they arrive were slower with few "
          "workers)");
ABSL_FLAG(int64_t, max_table_bytes, tally::ServerOptions().max_table_bytes,
          "The bytes the rows of every job's embedding tables held by this "
          "shard may take together (values, optimizer slots and 40 bytes "
          "of index a row); a pull that would make rows past it is refused "
          "(RESOURCE_EXHAUSTED). 0: unbounded");
ABSL_FLAG(std::string, table_dir, "",
          "Where this shard checkpoints the rows of the embedding tables it "
          "holds, at each of the coordinator's checkpoints (a base, then "
          "the rows changed since): a directory every shard reads at the "
          "same path (one machine's disk, or a shared file system), so "
          "that a range placed again after a shard is lost loads its rows. "
          "Empty: tables are not checkpointed (a lost shard's rows restart "
          "from their initial values)");
ABSL_FLAG(int64_t, shared_memory_max_bytes,
          tally::ServerOptions().shared_memory_max_bytes,
          "A worker on this host pushes and pulls ranges of at most this "
          "size through memory shared with the shard, not loopback TCP (two "
          "copies of the range per worker stream, in both processes' "
          "memory); 0: never");
ABSL_FLAG(int, stream_window_bytes, tally::kServerStreamWindowBytes,
          "Receive window of each stream (HTTP/2): what a caller may send "
          "before the server reads it. A shard holds up to this (and 1 MiB "
          "more) per worker whose push waits; one stream moves at most a "
          "window per round trip, so raise it for links with long ones");
ABSL_FLAG(double, checkpoint_interval_s, 30,
          "With --state_dir: write a training job's weights at most this "
          "often (state changes are written at once)");

namespace {

constexpr char kUsage[] =
    "Tally parameter server and coordinator.\n"
    "  tally-server [--port=7070] [--state_dir=DIR] [--noshard] [TLS flags]\n"
    "  tally-server --coordinator=HOST:7070 --port=7072   (a parameter shard)";

// A flag out of range: the message for stderr, exit code 2.
absl::Status Bad(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status DataPlaneFromFlags(tally::ServerOptions& o) {
  o.join = absl::GetFlag(FLAGS_coordinator);
  o.shard = absl::GetFlag(FLAGS_shard);
  o.advertise = absl::GetFlag(FLAGS_advertise);
  if (const int data_port = absl::GetFlag(FLAGS_data_port); data_port >= 0) {
    if (!o.join.empty() || !o.shard) {
      return Bad(
          "--data_port belongs to a coordinator holding parameters (a "
          "shard process serves its data plane on --port)");
    }
  }
  o.streamed_sums = absl::GetFlag(FLAGS_streamed_sums);
  o.streamed_sums_min_bytes = absl::GetFlag(FLAGS_streamed_sums_min_bytes);
  o.shared_memory_max_bytes = absl::GetFlag(FLAGS_shared_memory_max_bytes);
  o.max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  o.table_dir = absl::GetFlag(FLAGS_table_dir);
  o.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  if (o.stream_window_bytes < 65535 || o.stream_window_bytes > (1 << 30)) {
    return Bad(
        "--stream_window_bytes must be between 65535 (HTTP/2's "
        "smallest initial window) and 1073741824");
  }
  if (!o.join.empty() && !absl::GetFlag(FLAGS_state_dir).empty()) {
    return Bad(
        "--state_dir belongs to the coordinator; a shard keeps "
        "nothing on disk");
  }
  return absl::OkStatus();
}

absl::Status ControlPlaneFromFlags(tally::CoordinatorOptions& o) {
  o.lease_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  if (o.lease_timeout <= absl::ZeroDuration())
    return Bad("--lease_timeout_ms must be positive");
  o.state_dir = absl::GetFlag(FLAGS_state_dir);
  o.spec_limits.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  o.spec_limits.max_params = absl::GetFlag(FLAGS_max_params);
  if (o.spec_limits.max_spec_bytes <= 0 || o.spec_limits.max_params <= 0)
    return Bad("--max_spec_bytes and --max_params must be positive");
  o.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  o.max_queued_jobs_per_submitter =
      absl::GetFlag(FLAGS_max_queued_jobs_per_submitter);
  o.max_workers = absl::GetFlag(FLAGS_max_workers);
  o.max_offer_bytes = absl::GetFlag(FLAGS_max_offer_bytes);
  o.max_finished_jobs = absl::GetFlag(FLAGS_max_finished_jobs);
  o.finished_job_ttl = absl::Hours(absl::GetFlag(FLAGS_finished_job_ttl_h));
  o.keep_weights_dir = absl::GetFlag(FLAGS_keep_weights_dir);
  if (o.max_queued_jobs <= 0 || o.max_queued_jobs_per_submitter <= 0 ||
      o.max_workers <= 0 || o.max_offer_bytes <= 0 ||
      o.max_finished_jobs < 0 || o.finished_job_ttl < absl::ZeroDuration()) {
    return Bad(
        "--max_queued_jobs, --max_queued_jobs_per_submitter, --max_workers "
        "and --max_offer_bytes must be positive, --max_finished_jobs and "
        "--finished_job_ttl_h not negative");
  }
  o.checkpoint_interval =
      absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  if (o.checkpoint_interval < absl::ZeroDuration())
    return Bad("--checkpoint_interval_s must not be negative");
  return absl::OkStatus();
}

absl::Status SecurityFromFlags(tally::ServerOptions& o) {
  auto transport = tally::TransportFromFlags();
  if (!transport.ok()) return Bad(transport.status().message());
  o.coordinator.transport = *std::move(transport);
  o.security.tls = o.coordinator.transport.tls;
  o.security.insecure = absl::GetFlag(FLAGS_insecure);
  if (const std::string path = absl::GetFlag(FLAGS_tokens); !path.empty()) {
    auto tokens = tally::TokenTable::Load(path);
    if (!tokens.ok())
      return Bad(absl::StrCat("--tokens: ", tokens.status().message()));
    o.security.tokens = *std::move(tokens);
  }
  return absl::OkStatus();
}

// Without TLS (and without --insecure) the default address is loopback,
// so that a plaintext server started with no flags runs, reachable from
// this host alone.
std::string ListenAddress(const tally::ServerOptions& o) {
  const std::string flag = absl::GetFlag(FLAGS_listen);
  if (!flag.empty()) return flag;
  return o.security.tls.enabled() || o.security.insecure ? "0.0.0.0"
                                                         : "127.0.0.1";
}

void PrintStarted(const tally::ServerOptions& o, const std::string& listen,
                  const tally::TallyServer& server) {
  const int port = server.port();
  const std::string security = !o.security.tls.enabled()      ? "plaintext"
                               : o.security.tokens != nullptr ? "mTLS, tokens"
                                                              : "mTLS";
  if (!o.join.empty()) {
    // A shard's lease is the coordinator's; it says so once registered.
    std::printf("tally-server listening on %s:%d (%s; shard of %s)\n",
                listen.c_str(), port, security.c_str(), o.join.c_str());
    return;
  }
  std::printf("tally-server listening on %s:%d (%s; lease %lld ms; %s)\n",
              listen.c_str(), port, security.c_str(),
              static_cast<long long>(
                  absl::ToInt64Milliseconds(o.coordinator.lease_timeout)),
              o.shard ? absl::StrCat("coordinator and shard, data plane on "
                                     "port ", server.data_port())
                            .c_str()
                      : "coordinator");
}

// The dashboard, with --http_port (the coordinator's alone).
absl::StatusOr<std::unique_ptr<tally::HttpServer>> StartDashboard(
    tally::TallyServer& server, std::unique_ptr<tally::Dashboard>& dashboard) {
  const int port = absl::GetFlag(FLAGS_http_port);
  if (port <= 0) return nullptr;
  if (server.coordinator() == nullptr)
    return Bad("--http_port belongs to the coordinator");
  dashboard = std::make_unique<tally::Dashboard>(server.coordinator());
  TALLY_ASSIGN_OR_RETURN(
      auto http, tally::HttpServer::Start(
                     absl::StrCat(absl::GetFlag(FLAGS_http_listen), ":", port),
                     [d = dashboard.get()](const std::string& path) {
                       return d->Handle(path);
                     }));
  std::printf("tally-server: dashboard at http://%s:%d/\n",
              absl::GetFlag(FLAGS_http_listen).c_str(), http->port());
  return http;
}

// 2 for a bad flag, 1 for anything else.
int Fail(const absl::Status& s) {
  std::cerr << "tally-server: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  tally::TuneMallocForBulkTransfers();
  tally::ParseProgramFlags(argc, argv, kUsage);
  // Debian's Abseil is built without NDEBUG, so every Mutex lock would
  // walk a deadlock-detection graph (about 1% of a busy cluster's CPU in a
  // profile). The tests keep the check; the programs do not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  tally::LimitProtobufLogs();
  // Before anything slow: a signal during start-up then stops the server
  // as soon as it is up, instead of being lost.
  tally::InstallStopSignals();
  tally::ServerOptions options;
  for (const absl::Status& s :
       {DataPlaneFromFlags(options), ControlPlaneFromFlags(options.coordinator),
        SecurityFromFlags(options)}) {
    if (!s.ok()) return Fail(s);
  }
  const std::string listen = ListenAddress(options);
  if (const int data_port = absl::GetFlag(FLAGS_data_port); data_port >= 0)
    options.data_address = absl::StrCat(listen, ":", data_port);
  std::unique_ptr<tally::MetricsEndpoint> metrics;
  if (const int port = absl::GetFlag(FLAGS_metrics_port); port > 0) {
    auto m = tally::MetricsEndpoint::Start(absl::StrCat(listen, ":", port));
    if (!m.ok()) return Fail(absl::UnavailableError(m.status().message()));
    metrics = *std::move(m);
    options.metrics = metrics.get();
  }
  auto server = tally::TallyServer::Start(
      absl::StrCat(listen, ":", absl::GetFlag(FLAGS_port)), options);
  if (!server.ok())
    return Fail(absl::UnavailableError(server.status().message()));
  PrintStarted(options, listen, **server);
  std::unique_ptr<tally::Dashboard> dashboard;
  auto http = StartDashboard(**server, dashboard);
  if (!http.ok()) return Fail(http.status());
  if (metrics != nullptr) {
    std::printf("tally-server: metrics at http://%s:%d/metrics\n",
                listen.c_str(), metrics->port());
  }
  if (!options.coordinator.state_dir.empty()) {
    std::printf("tally-server: keeping jobs in %s (%zu restored)\n",
                options.coordinator.state_dir.c_str(),
                (*server)->coordinator()->List().size());
  }
  std::fflush(stdout);
  const int sig = tally::WaitForStopSignal();
  std::printf("tally-server: signal %d, shutting down\n", sig);
  http->reset();  // no page reads the coordinator from now on
  (*server)->Shutdown(absl::Seconds(2));
  server->reset();  // before the metrics endpoint it reports to
  return 0;
}
