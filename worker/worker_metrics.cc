#include "worker/worker_metrics.h"

namespace tally {

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : steps(AddCounter(r, "tally_worker_steps_total", "Steps computed")),
      samples(AddCounter(r, "tally_worker_samples_total",
                         "Training samples computed")),
      compute_seconds(
          AddLatencyHistogram(r, "tally_worker_compute_seconds",
                              "Forward and backward pass of a step")),
      push_seconds(AddLatencyHistogram(r, "tally_worker_push_seconds",
                                       "A step's push to every shard")),
      pull_seconds(AddLatencyHistogram(
          r, "tally_worker_pull_seconds",
          "A pull from every shard, the wait for the step to close "
          "included")),
      loader_wait_seconds(AddLatencyHistogram(
          r, "tally_worker_loader_wait_seconds",
          "A step's wait for its batch from the data loader")),
      loader_bytes(AddCounter(r, "tally_worker_loader_read_bytes_total",
                              "Bytes the data loader read from dataset files")),
      loader_substituted(AddCounter(
          r, "tally_worker_loader_substituted_total",
          "Samples that stood in for unreadable ones (skip_bad)")) {}

}  // namespace tally
