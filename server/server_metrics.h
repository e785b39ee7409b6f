// tally-server's metrics (common/metrics): the coordinator's, read from its
// state at every scrape (CoordinatorCollector), and the data plane's,
// counted as pushes and pulls happen (DataPlaneMetrics).
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
//   tally_job_loss{job_id}, tally_job_accuracy{job_id}   gauge, last closed step
//   tally_job_workers{job_id}                  gauge, live members
// Data plane series (every shard, the coordinator's own included):
//   tally_push_bytes_total, tally_pull_bytes_total        counter
//   tally_push_seconds, tally_pull_seconds                histogram, per call
//   tally_pull_wait_seconds                 histogram, waiting for the version
//   tally_pushes_total{result}              counter; result: ok, duplicate,
//       step_closed, non_finite, not_member, invalid, other
#ifndef TALLY_SERVER_SERVER_METRICS_H_
#define TALLY_SERVER_SERVER_METRICS_H_

#include <vector>

#include "absl/status/status.h"
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

class DataPlaneMetrics {
 public:
  explicit DataPlaneMetrics(prometheus::Registry& registry);
  DataPlaneMetrics(const DataPlaneMetrics&) = delete;
  DataPlaneMetrics& operator=(const DataPlaneMetrics&) = delete;

  // A push call that ended with `status` (its answer), after `seconds`,
  // having received `bytes` of tensor data.
  void Pushed(const absl::Status& status, bool duplicate, double seconds,
              double bytes);
  // A pull that waited `wait_seconds` for its version and took `seconds`
  // in all, sending `bytes`.
  void Pulled(double wait_seconds, double seconds, double bytes);
  // A worker's word on the memory a stream offered it: mapped, or not.
  void SharedMemory(bool mapped);

 private:
  prometheus::Counter& push_bytes_;
  prometheus::Counter& pull_bytes_;
  prometheus::Histogram& push_seconds_;
  prometheus::Histogram& pull_seconds_;
  prometheus::Histogram& pull_wait_seconds_;
  prometheus::Family<prometheus::Counter>& pushes_;
  prometheus::Family<prometheus::Counter>& shared_;
};

}  // namespace tally

#endif  // TALLY_SERVER_SERVER_METRICS_H_
