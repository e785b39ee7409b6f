// tally-worker: trains on this machine's devices.
//
//   tally-worker --server=HOST:PORT [--devices=cpu:1] [--name=NAME]
//                [--health_port=0] [--metrics_port=0]
//   tally-worker --standalone --job=FILE [--devices=cpu:1]
//                [--output=model.safetensors] [--summary_json=PATH]
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/device.h"
#include "common/io/safetensors.h"
#include "common/malloc_tuning.h"
#include "common/metrics/metrics.h"
#include "common/spec/job_spec.h"
#include "common/status_macros.h"
#include "common/stop_signal.h"
#include "proto/transport.h"
#include "proto/transport_flags.h"
#include "worker/daemon.h"
#include "worker/health.h"
#include "worker/standalone.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(bool, standalone, false,
          "Train --job in this process, without a parameter server");
ABSL_FLAG(std::string, job, "", "Job spec file (YAML or JSON)");
ABSL_FLAG(std::string, devices, "cpu:1",
          "Devices to train on: cpu:N, cuda:0,1 or cuda:all");
ABSL_FLAG(std::string, output, "",
          "Write the trained weights here as .safetensors");
ABSL_FLAG(std::string, summary_json, "",
          "Write {test_accuracy, samples_per_sec, steps, final_loss} here");
ABSL_FLAG(bool, quiet, false, "Print no progress, only the result");
ABSL_FLAG(std::string, server, "",
          "Coordinator address HOST:PORT (daemon mode)");
ABSL_FLAG(std::string, name, "",
          "Worker name shown by the server (default: hostname)");
ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics at http://0.0.0.0:PORT/metrics (0: off)");
ABSL_FLAG(bool, overlap_push, true,
          "Push each layer's gradient while the backward pass goes on "
          "(false: push the whole gradient after the step)");
ABSL_FLAG(bool, overlap_pull, true,
          "bsp on one shard: start a step's forward pass while the last "
          "layers' weights still arrive");
ABSL_FLAG(bool, exchange_stream, true,
          "Push and pull on one long-lived stream per shard (false: two "
          "calls per step)");
ABSL_FLAG(bool, shared_memory, true,
          "On those streams, push and pull through memory shared with a "
          "shard on this host, not loopback TCP (where it cannot be "
          "mapped, the stream goes on without it)");
ABSL_FLAG(int64_t, push_chunk_elements, 262144,
          "Gradient elements per push message (and per bucket of layers "
          "pushed together while backward runs); 262144 is 1 MiB of float32");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "Directories a job's dataset may be read from, comma-separated "
          "(default /srv/tally/data,/usr/share); a job naming a file outside "
          "them fails at assignment. --standalone reads any path.");
ABSL_FLAG(int, health_port, 0,
          "Serve grpc.health.v1 on this port (0: any free port, -1: none)");

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "tally-worker: " << s.message() << "\n";
  return 1;
}

void PrintProgress(const tally::ProgressReport& r, bool tty) {
  const double frac =
      r.total_steps > 0 ? static_cast<double>(r.step) / r.total_steps : 0.0;
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string line = absl::StrFormat(
      "epoch %d/%d [%s] step %d/%d  loss %.4f  acc %.3f  %.0f samples/s",
      r.epoch + 1, r.epochs, bar, r.step, r.total_steps, r.loss, r.accuracy,
      r.samples_per_sec);
  if (tty) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

// The daemon's options from the flags; kInvalidArgument names a bad one.
absl::StatusOr<tally::DaemonOptions> DaemonOptionsFromFlags() {
  tally::DaemonOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  TALLY_ASSIGN_OR_RETURN(options.devices,
                         tally::ParseDevices(absl::GetFlag(FLAGS_devices)));
  for (const tally::DeviceId& id : options.devices) {
    // Fail at start-up, not at step 1.
    TALLY_RETURN_IF_ERROR(tally::OpenDevice(id).status());
  }
  options.devices_text = absl::GetFlag(FLAGS_devices);
  options.name = absl::GetFlag(FLAGS_name);
  if (options.name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.name = host;
  }
  options.verbose = !absl::GetFlag(FLAGS_quiet);
  options.overlap_push = absl::GetFlag(FLAGS_overlap_push);
  options.exchange_stream = absl::GetFlag(FLAGS_exchange_stream);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.overlap_pull = absl::GetFlag(FLAGS_overlap_pull);
  options.chunk_elements = absl::GetFlag(FLAGS_push_chunk_elements);
  if (options.chunk_elements <= 0) {
    return absl::InvalidArgumentError("--push_chunk_elements must be positive");
  }
  TALLY_ASSIGN_OR_RETURN(options.transport, tally::TransportFromFlags());
  if (const std::vector<std::string> roots = absl::GetFlag(FLAGS_data_root);
      !roots.empty()) {
    TALLY_ASSIGN_OR_RETURN(options.data_roots, tally::DataRoots::Make(roots));
  }
  return options;
}

// grpc.health.v1 on --health_port (TLS when the worker has it, else
// plaintext on every interface, as probes expect); null with -1. Sets the
// address the worker registers with.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealth(
    tally::HealthService& service, tally::DaemonOptions& options) {
  const int port = absl::GetFlag(FLAGS_health_port);
  if (port < 0) return nullptr;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  int bound = 0;
  tally::ServerSecurity security;
  security.tls = options.transport.tls;
  tally::ConfigureServer(absl::StrCat("0.0.0.0:", port), &builder, &bound,
                         security, tally::Plane::kControl);
  std::unique_ptr<grpc::Server> health = builder.BuildAndStart();
  if (health == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve health checks on port ", port));
  }
  options.address = absl::StrCat(options.name, ":", bound);
  std::fprintf(stderr, "tally-worker[%s]: health service on port %d\n",
               options.name.c_str(), bound);
  return health;
}

int RunDaemon() {
  if (absl::GetFlag(FLAGS_server).empty()) {
    std::cerr << "tally-worker: give --server=HOST:PORT, or --standalone "
                 "--job=FILE\n";
    return 2;
  }
  absl::StatusOr<tally::DaemonOptions> options = DaemonOptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  std::unique_ptr<tally::MetricsEndpoint> metrics;
  std::unique_ptr<tally::WorkerMetrics> worker_metrics;
  if (const int port = absl::GetFlag(FLAGS_metrics_port); port > 0) {
    auto m = tally::MetricsEndpoint::Start(absl::StrCat("0.0.0.0:", port));
    if (!m.ok()) return Fail(m.status());
    metrics = *std::move(m);
    worker_metrics = std::make_unique<tally::WorkerMetrics>(metrics->registry());
    options->metrics = worker_metrics.get();
    std::fprintf(stderr, "tally-worker[%s]: metrics on port %d\n",
                 options->name.c_str(), metrics->port());
  }
  tally::HealthService health_service;
  auto health = StartHealth(health_service, *options);
  if (!health.ok()) return Fail(health.status());
  tally::WorkerDaemon daemon(*options);
  tally::InstallStopSignals();
  std::thread watcher([&daemon] {
    tally::WaitForStopSignal();
    daemon.Stop();
  });
  absl::Status s = daemon.Run();
  tally::RequestStop(SIGTERM);  // ends the watcher
  watcher.join();
  if (*health != nullptr)
    (*health)->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (!s.ok()) return Fail(s);
  return 0;
}

// --output and --summary_json of a standalone run.
int WriteOutputs(const tally::JobSpec& spec, const tally::TrainSummary& summary,
                 bool quiet) {
  if (const std::string out = absl::GetFlag(FLAGS_output); !out.empty()) {
    absl::Status s =
        tally::SaveSafetensors(out, spec.layout.params, summary.params.data(),
                               {{"job", spec.name}, {"format", "pt"}});
    if (!s.ok()) return Fail(s);
    if (!quiet) std::fprintf(stderr, "weights written to %s\n", out.c_str());
  }
  if (const std::string path = absl::GetFlag(FLAGS_summary_json);
      !path.empty()) {
    nlohmann::json j = {{"test_accuracy", summary.test_accuracy},
                        {"test_loss", summary.test_loss},
                        {"samples_per_sec", summary.samples_per_sec},
                        {"steps", summary.steps},
                        {"samples", summary.samples},
                        {"final_loss", summary.final_loss},
                        {"train_seconds", summary.train_seconds},
                        {"gradient_reduction", summary.reduction}};
    absl::Status s = tally::WriteFileAtomic(path, j.dump(2) + "\n");
    if (!s.ok()) return Fail(s);
  }
  return 0;
}

int RunStandalone() {
  const std::string job_path = absl::GetFlag(FLAGS_job);
  if (job_path.empty()) {
    std::cerr << "tally-worker: --standalone needs --job=FILE\n";
    return 2;
  }
  auto devices = tally::ParseDevices(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) return Fail(devices.status());
  auto spec = tally::LoadJobSpec(job_path);
  if (!spec.ok()) return Fail(spec.status());

  const bool quiet = absl::GetFlag(FLAGS_quiet);
  const bool tty = isatty(fileno(stderr));
  tally::StandaloneOptions options;
  options.devices = *devices;
  if (!quiet) {
    options.on_progress = [tty](const tally::ProgressReport& r) {
      PrintProgress(r, tty);
    };
    std::fprintf(stderr, "training %s on %s: %lld parameters\n",
                 spec->name.empty() ? job_path.c_str() : spec->name.c_str(),
                 absl::GetFlag(FLAGS_devices).c_str(),
                 static_cast<long long>(spec->layout.num_params));
  }
  auto summary = tally::TrainStandalone(*spec, options);
  if (tty && !quiet) std::fprintf(stderr, "\n");
  if (!summary.ok()) return Fail(summary.status());

  std::printf(
      "steps %lld  final loss %.4f  %.0f samples/s  test accuracy %.4f\n",
      static_cast<long long>(summary->steps), summary->final_loss,
      summary->samples_per_sec, summary->test_accuracy);

  return WriteOutputs(*spec, *summary, quiet);
}

}  // namespace

int main(int argc, char** argv) {
  tally::UseTransportExperiments();
  tally::TuneMallocForBulkTransfers();
  tally::ParseProgramFlags(
      argc, argv,
      "Tally worker.\n"
      "  tally-worker --server=HOST:7070 [--devices=cpu:1|cuda:all] "
      "[TLS and token flags]\n"
      "  tally-worker --standalone --job=FILE [--devices=cpu:1] "
      "[--output=PATH] [--summary_json=PATH]");
  // Debian's Abseil is built without NDEBUG, so every Mutex lock would
  // walk a deadlock-detection graph (about 1% of a busy cluster's CPU in a
  // profile). The tests keep the check; the programs do not pay for it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  return absl::GetFlag(FLAGS_standalone) ? RunStandalone() : RunDaemon();
}
