// The worker daemon: registers with the coordinator, keeps its lease alive,
// and trains whatever job it is assigned, step by step in sync with the
// job's other workers through the parameter server:
//   pull version t -> the batch of step t from its shard -> engine step ->
//   push the gradient for step t -> pull version t + 1 ...
// It reconnects by itself, with backoff, when the server is away, and
// re-registers (a new incarnation) when its lease was lost; the coordinator
// then puts it back into a job, where it rejoins at the next step.
#ifndef TALLY_WORKER_DAEMON_H_
#define TALLY_WORKER_DAEMON_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data/data_file.h"
#include "common/device.h"
#include "proto/transport.h"
#include "worker/internal/waits.h"
#include "worker/model_engine.h"

namespace tally {

struct WorkerMetrics;
struct JobSpec;
struct EngineOptions;

// Builds the engine of a job whose model is Python code (model.python), its
// params() holding the module's weights as built with the job's seed.
using PythonEngineFactory =
    std::function<absl::StatusOr<std::unique_ptr<ModelEngine>>(
        const JobSpec& spec, const EngineOptions& options)>;

struct DaemonOptions {
  std::string server = "localhost:7070";
  std::vector<DeviceId> devices = {DeviceId{DeviceType::kCpu, 0}};
  std::string devices_text = "cpu:1";
  std::string name;
  std::string address;  // advertised health endpoint
  absl::Duration rpc_timeout = internal::kDefaultRpcTimeout;
  // A RegisterWorker call.
  absl::Duration register_timeout = absl::Seconds(5);
  // Retries (registering again, a job's step again) wait min_backoff
  // first, twice as long each time after, up to max_backoff.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // What a shard waits for a pull's version (PullRequest.max_wait_ms); the
  // worker waits that plus rpc_timeout for the pull's answer.
  absl::Duration pull_wait = internal::kDefaultPullWait;
  // One ReportResult call.
  absl::Duration report_timeout = absl::Seconds(10);
  // A cancelled push or pull to let go of the buffers it reads or writes
  // (cancelled calls end promptly; this guards against a stuck library).
  absl::Duration release_wait = absl::Minutes(1);
  // The loader's next batch (a stuck data source is reported, not waited
  // for forever).
  absl::Duration batch_wait = internal::kDefaultBatchWait;
  // At most one progress line per job this often.
  absl::Duration log_every = absl::Seconds(5);
  int64_t chunk_elements = 262144;  // push chunks: 1 MiB
  // Each layer's gradient is pushed as the backward pass produces it (the
  // last layer first), beside the layers still computing; false: the whole
  // gradient once the step is done.
  bool overlap_push = true;
  // Pushes and pulls on one Exchange stream per shard for the whole job;
  // false: a PushGradients and a PullWeights call per step.
  bool exchange_stream = true;
  // On those streams, push and pull through memory shared with a shard on
  // this host (ParamClientOptions::shared_memory).
  bool shared_memory = true;
  // bsp on one shard: a step's forward pass starts on the first layers
  // while the last layers' weights still arrive.
  bool overlap_pull = true;
  bool verbose = true;
  // TLS material and bearer token for the coordinator and every shard.
  TransportOptions transport;
  // Where the worker counts its steps (borrowed; null: nowhere).
  WorkerMetrics* metrics = nullptr;
  // The Python worker's (python/tally/): it trains Python models too, and
  // registers with python_runtime ("Python 3.11.2, PyTorch 1.13.1, CPU").
  // Null in tally-worker, which trains models of layers only and is never
  // given a Python model.
  PythonEngineFactory python_engine;
  std::string python_runtime;
  // The directories a job's dataset may be read from (--data_root): a job
  // naming a path outside them fails at assignment, saying so.
  DataRoots data_roots = DataRoots::Default();
};

class WorkerDaemon {
 public:
  explicit WorkerDaemon(const DaemonOptions& options);
  ~WorkerDaemon();
  WorkerDaemon(const WorkerDaemon&) = delete;
  WorkerDaemon& operator=(const WorkerDaemon&) = delete;

  // Runs until Stop(); returns OK then. Returns by itself when the
  // coordinator refuses the worker for good, which retrying cannot fix:
  // kPermissionDenied for its token, kFailedPrecondition + PROTOCOL_TOO_OLD
  // when it needs a newer worker protocol than this build's
  // (v1::WORKER_PROTOCOL_CURRENT, sent with every registration).
  absl::Status Run();
  // Thread-safe; Run returns within about a step.
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tally

#endif  // TALLY_WORKER_DAEMON_H_
