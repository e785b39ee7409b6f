// The coordinator's metrics (common/metrics), read from its state at every
// scrape.
//
// Coordinator series (job_id: the job's id, not `job`, which Prometheus
// gives every target; only jobs that are PENDING or RUNNING, so the series
// of a job go away with the first scrape after it ends):
//   tally_jobs{state}                       gauge, every job the server keeps
//   tally_queued_jobs                       gauge, jobs waiting for workers
//   tally_workers, tally_idle_workers       gauge, registered workers
//   tally_live_shards                       gauge
//   tally_lease_expiries_total              counter
//   tally_checkpoints_total                 counter, job files written
//   tally_checkpoint_seconds_total          counter, time writing them
//   tally_checkpoint_age_seconds{job_id}       gauge
//   tally_job_steps_total{job_id}              counter (the weights' version)
//   tally_job_samples_total{job_id}            counter
//   tally_job_rejected_pushes_total{job_id}    counter
//   tally_job_samples_per_second{job_id}       gauge, last few seconds
//   tally_job_loss{job_id}, tally_job_accuracy{job_id}   gauge, last closed
//   step tally_job_workers{job_id}                  gauge, live members
#ifndef TALLY_SERVER_CONTROL_COORDINATOR_METRICS_H_
#define TALLY_SERVER_CONTROL_COORDINATOR_METRICS_H_

#include <vector>

#include "common/metrics/metrics.h"

namespace tally {

class Coordinator;

class CoordinatorCollector final : public prometheus::Collectable {
 public:
  // `coordinator` is borrowed and must outlive the collector's use.
  explicit CoordinatorCollector(const Coordinator* coordinator)
      : coord_(coordinator) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Coordinator* coord_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_COORDINATOR_METRICS_H_
