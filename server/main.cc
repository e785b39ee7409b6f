// tally-server: the coordinator and/or a parameter shard.
//
//   tally-server [--port=7070] [--lease_timeout_ms=3000] [--noshard]
//                [--state_dir=DIR [--checkpoint_interval_s=30]]
//   tally-server --coordinator=HOST:7070 --port=7071 [--advertise=HOST:7071]
// Every form takes --tls_ca/--tls_cert/--tls_key (mTLS) and --tokens=FILE
// (roles; proto/auth.h); without TLS it listens only on loopback unless
// --insecure.
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/malloc_tuning.h"
#include "common/stop_signal.h"
#include "common/http/http_server.h"
#include "proto/auth.h"
#include "proto/transport_flags.h"
#include "server/dashboard/dashboard.h"
#include "server/service.h"

ABSL_FLAG(std::string, listen, "0.0.0.0",
          "Address to listen on (anything but loopback needs TLS or "
          "--insecure)");
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
ABSL_FLAG(int64_t, max_workers, tally::CoordinatorOptions().max_workers,
          "Refuse worker registrations beyond this many");
ABSL_FLAG(int64_t, max_finished_jobs,
          tally::CoordinatorOptions().max_finished_jobs,
          "Keep at most this many ended jobs (oldest are dropped, with their "
          "files)");
ABSL_FLAG(double, finished_job_ttl_h, 0,
          "Drop ended jobs this many hours after they end (0: never by age)");
ABSL_FLAG(std::string, keep_weights_dir, "",
          "Write a dropped job's final weights here as JOB.safetensors");
ABSL_FLAG(int, port, 7070, "Port to listen on (0 picks a free one)");
ABSL_FLAG(int64_t, lease_timeout_ms, 3000,
          "A worker that sends no heartbeat for this long leaves its job");
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
          "(at most this much memory per worker; small pushes summed as they "
          "arrive were slower)");
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

int main(int argc, char** argv) {
  tally::TuneMallocForBulkTransfers();
  absl::SetProgramUsageMessage("Tally parameter server and coordinator.");
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil is built without NDEBUG, so every Mutex lock would
  // walk a deadlock-detection graph (about 1% of a busy cluster's CPU in a
  // profile). The tests keep the check; the programs do not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  tally::LimitProtobufLogs();
  // Before anything slow: a signal during start-up then stops the server
  // as soon as it is up, instead of being lost.
  tally::InstallStopSignals();
  tally::ServerOptions server_options;
  server_options.join = absl::GetFlag(FLAGS_coordinator);
  server_options.shard = absl::GetFlag(FLAGS_shard);
  server_options.advertise = absl::GetFlag(FLAGS_advertise);
  server_options.streamed_sums = absl::GetFlag(FLAGS_streamed_sums);
  server_options.streamed_sums_min_bytes =
      absl::GetFlag(FLAGS_streamed_sums_min_bytes);
  server_options.shared_memory_max_bytes =
      absl::GetFlag(FLAGS_shared_memory_max_bytes);
  server_options.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  if (server_options.stream_window_bytes < 65535 ||
      server_options.stream_window_bytes > (1 << 30)) {
    std::cerr << "tally-server: --stream_window_bytes must be between 65535 "
                 "(HTTP/2's smallest initial window) and 1073741824\n";
    return 2;
  }
  if (!server_options.join.empty() && !absl::GetFlag(FLAGS_state_dir).empty()) {
    std::cerr << "tally-server: --state_dir belongs to the coordinator; a "
                 "shard keeps nothing on disk\n";
    return 2;
  }
  tally::CoordinatorOptions& options = server_options.coordinator;
  options.lease_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_lease_timeout_ms));
  if (options.lease_timeout <= absl::ZeroDuration()) {
    std::cerr << "tally-server: --lease_timeout_ms must be positive\n";
    return 2;
  }
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.spec_limits.max_spec_bytes = absl::GetFlag(FLAGS_max_spec_bytes);
  options.spec_limits.max_params = absl::GetFlag(FLAGS_max_params);
  if (options.spec_limits.max_spec_bytes <= 0 ||
      options.spec_limits.max_params <= 0) {
    std::cerr << "tally-server: --max_spec_bytes and --max_params must be "
                 "positive\n";
    return 2;
  }
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  options.max_workers = absl::GetFlag(FLAGS_max_workers);
  options.max_finished_jobs = absl::GetFlag(FLAGS_max_finished_jobs);
  options.finished_job_ttl =
      absl::Hours(absl::GetFlag(FLAGS_finished_job_ttl_h));
  options.keep_weights_dir = absl::GetFlag(FLAGS_keep_weights_dir);
  if (options.max_queued_jobs <= 0 || options.max_workers <= 0 ||
      options.max_finished_jobs < 0 ||
      options.finished_job_ttl < absl::ZeroDuration()) {
    std::cerr << "tally-server: --max_queued_jobs and --max_workers must be "
                 "positive, --max_finished_jobs and --finished_job_ttl_h not "
                 "negative\n";
    return 2;
  }
  auto transport = tally::TransportFromFlags();
  if (!transport.ok()) {
    std::cerr << "tally-server: " << transport.status().message() << "\n";
    return 2;
  }
  options.transport = *transport;
  server_options.security.tls = transport->tls;
  server_options.security.insecure = absl::GetFlag(FLAGS_insecure);
  if (const std::string path = absl::GetFlag(FLAGS_tokens); !path.empty()) {
    auto tokens = tally::TokenTable::Load(path);
    if (!tokens.ok()) {
      std::cerr << "tally-server: --tokens: " << tokens.status().message()
                << "\n";
      return 2;
    }
    server_options.security.tokens = *std::move(tokens);
  }
  options.checkpoint_interval =
      absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval_s));
  if (options.checkpoint_interval < absl::ZeroDuration()) {
    std::cerr << "tally-server: --checkpoint_interval_s must not be negative\n";
    return 2;
  }
  std::unique_ptr<tally::MetricsEndpoint> metrics;
  if (const int port = absl::GetFlag(FLAGS_metrics_port); port > 0) {
    auto m = tally::MetricsEndpoint::Start(
        absl::StrCat(absl::GetFlag(FLAGS_listen), ":", port));
    if (!m.ok()) {
      std::cerr << "tally-server: " << m.status().message() << "\n";
      return 1;
    }
    metrics = *std::move(m);
    server_options.metrics = metrics.get();
  }
  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_listen), ":", absl::GetFlag(FLAGS_port));
  auto server = tally::TallyServer::Start(address, server_options);
  if (!server.ok()) {
    std::cerr << "tally-server: " << server.status().message() << "\n";
    return 1;
  }
  std::printf("tally-server listening on %s:%d (%s; lease %lld ms; %s)\n",
              absl::GetFlag(FLAGS_listen).c_str(), (*server)->port(),
              !transport->tls.enabled() ? "plaintext"
              : server_options.security.tokens != nullptr
                  ? "mTLS, tokens"
                  : "mTLS",
              static_cast<long long>(absl::GetFlag(FLAGS_lease_timeout_ms)),
              !server_options.join.empty()
                  ? ("shard of " + server_options.join).c_str()
              : server_options.shard ? "coordinator and shard"
                                     : "coordinator");
  std::unique_ptr<tally::Dashboard> dashboard;
  std::unique_ptr<tally::HttpServer> http;
  if (const int port = absl::GetFlag(FLAGS_http_port); port > 0) {
    if ((*server)->coordinator() == nullptr) {
      std::cerr << "tally-server: --http_port belongs to the coordinator\n";
      return 2;
    }
    dashboard = std::make_unique<tally::Dashboard>((*server)->coordinator());
    auto h = tally::HttpServer::Start(
        absl::StrCat(absl::GetFlag(FLAGS_http_listen), ":", port),
        [d = dashboard.get()](const std::string& path) {
          return d->Handle(path);
        });
    if (!h.ok()) {
      std::cerr << "tally-server: " << h.status().message() << "\n";
      return 1;
    }
    http = *std::move(h);
    std::printf("tally-server: dashboard at http://%s:%d/\n",
                absl::GetFlag(FLAGS_http_listen).c_str(), http->port());
  }
  if (metrics != nullptr) {
    std::printf("tally-server: metrics at http://%s:%d/metrics\n",
                absl::GetFlag(FLAGS_listen).c_str(), metrics->port());
  }
  if (!options.state_dir.empty()) {
    std::printf("tally-server: keeping jobs in %s (%zu restored)\n",
                options.state_dir.c_str(),
                (*server)->coordinator()->List().size());
  }
  std::fflush(stdout);
  const int sig = tally::WaitForStopSignal();
  std::printf("tally-server: signal %d, shutting down\n", sig);
  http.reset();  // no page reads the coordinator from now on
  (*server)->Shutdown(absl::Seconds(2));
  server->reset();  // before the metrics endpoint it reports to
  return 0;
}
