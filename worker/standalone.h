// Standalone training: one process trains a job spec end to end on its local
// devices, without a parameter server (tally-worker --standalone).
#ifndef TALLY_WORKER_STANDALONE_H_
#define TALLY_WORKER_STANDALONE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/spec/job_spec.h"
#include "worker/internal/waits.h"

namespace tally {

struct ProgressReport {
  int64_t epoch = 0;  // 0-based
  int64_t epochs = 0;
  int64_t step = 0;  // steps done so far
  int64_t total_steps = 0;
  double loss = 0.0;      // mean over the steps since the last report
  double accuracy = 0.0;  // same window
  double samples_per_sec = 0.0;
};

struct StandaloneOptions {
  std::vector<DeviceId> devices = {DeviceId{DeviceType::kCpu, 0}};
  // Called about every `report_every_sec` seconds and once at the end of
  // each epoch; may be empty.
  std::function<void(const ProgressReport&)> on_progress;
  double report_every_sec = 1.0;
  // The loader's next batch (a stuck data source is reported, not waited
  // for forever).
  absl::Duration batch_wait = internal::kDefaultBatchWait;
};

struct TrainSummary {
  double test_accuracy = 0.0;
  double test_loss = 0.0;
  double samples_per_sec = 0.0;  // training loop only
  int64_t steps = 0;
  int64_t samples = 0;
  double final_loss = 0.0;  // mean training loss over the last epoch's
                            // final reporting window
  double train_seconds = 0.0;
  std::string reduction;      // how replicas met: "host", "nccl" or "peer"
  std::vector<float> params;  // final weights, spec.layout order
};

// Trains `spec` and evaluates on its test set. Errors: whatever loading the
// dataset, opening devices or a step reports.
// Runs on the worker engine over options.devices: any number of CPU
// replicas (or GPUs) gives the same result up to float rounding.
absl::StatusOr<TrainSummary> TrainStandalone(const JobSpec& spec,
                                             const StandaloneOptions& options);

}  // namespace tally

#endif  // TALLY_WORKER_STANDALONE_H_
