// tally-worker's metrics (common/metrics), counted as it trains:
//   tally_worker_steps_total                 counter, steps computed
//   tally_worker_samples_total               counter, training samples
//   tally_worker_compute_seconds             histogram, forward + backward
//   tally_worker_push_seconds                histogram, a step's push to
//                                            every shard
//   tally_worker_pull_seconds                histogram, a pull from every
//                                            shard, waiting for the step to
//                                            close included
// A process trains one job at a time: the series are the process's.
#ifndef TALLY_WORKER_WORKER_METRICS_H_
#define TALLY_WORKER_WORKER_METRICS_H_

#include "common/metrics/metrics.h"

namespace tally {

struct WorkerMetrics {
  explicit WorkerMetrics(prometheus::Registry& registry);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  prometheus::Counter& steps;
  prometheus::Counter& samples;
  prometheus::Histogram& compute_seconds;
  prometheus::Histogram& push_seconds;
  prometheus::Histogram& pull_seconds;
  // The data loader: a step's wait for its batch, what it read from the
  // dataset's files, the samples that stood in for unreadable ones.
  prometheus::Histogram& loader_wait_seconds;
  prometheus::Counter& loader_bytes;
  prometheus::Counter& loader_substituted;
};

}  // namespace tally

#endif  // TALLY_WORKER_WORKER_METRICS_H_
