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
          "included")) {}

}  // namespace tally
