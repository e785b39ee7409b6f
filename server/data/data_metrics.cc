#include "server/data/data_metrics.h"

#include <string>
#include <vector>

#include "proto/errors.h"

namespace tally {

namespace {

// 20 us to about 30 s, each bound 1.25 times the last: fine enough to read
// a p99 against a p50.
prometheus::Histogram& AddFineHistogram(prometheus::Registry& r,
                                        const char* name, const char* help) {
  std::vector<double> b;
  for (double x = 20e-6; x < 30; x *= 1.25) b.push_back(x);
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(
      {}, prometheus::Histogram::BucketBoundaries(b));
}

}  // namespace

DataPlaneMetrics::DataPlaneMetrics(prometheus::Registry& r)
    : push_bytes_(AddCounter(r, "tally_push_bytes_total",
                             "Gradient bytes received in pushes")),
      pull_bytes_(AddCounter(r, "tally_pull_bytes_total",
                             "Weight bytes sent in pulls")),
      push_seconds_(AddLatencyHistogram(r, "tally_push_seconds",
                                        "Duration of a push call")),
      pull_seconds_(
          AddLatencyHistogram(r, "tally_pull_seconds",
                              "Duration of a pull call, waiting included")),
      pull_wait_seconds_(AddLatencyHistogram(
          r, "tally_pull_wait_seconds",
          "Time a pull waited for its version (the step to close)")),
      publish_seconds_(AddFineHistogram(
          r, "tally_step_publish_seconds",
          "Time from a step's last push to its version being published")),
      close_seconds_(AddFineHistogram(
          r, "tally_step_close_seconds",
          "Time from a step's last commit to its version being published")),
      pushes_(prometheus::BuildCounter()
                  .Name("tally_pushes_total")
                  .Help("Push calls by result")
                  .Register(r)),
      shared_(prometheus::BuildCounter()
                  .Name("tally_shared_memory_streams_total")
                  .Help("Exchange streams offered memory shared with their "
                        "worker, by the worker's answer (mapped: its pushes "
                        "and pulls skip loopback TCP)")
                  .Register(r)) {}

void DataPlaneMetrics::Pushed(const absl::Status& status, bool duplicate,
                              double seconds, double bytes) {
  const char* result = "other";
  if (status.ok()) {
    result = duplicate ? "duplicate" : "ok";
  } else if (ReasonOf(status) == v1::STEP_CLOSED) {
    result = "step_closed";
  } else if (ReasonOf(status) == v1::NON_FINITE) {
    result = "non_finite";
  } else if (ReasonOf(status) == v1::STALE_GRADIENT) {
    result = "stale";
  } else if (ReasonOf(status) == v1::NOT_A_MEMBER) {
    result = "not_member";
  } else if (absl::IsInvalidArgument(status)) {
    result = "invalid";
  }
  pushes_.Add({{"result", result}}).Increment();
  push_seconds_.Observe(seconds);
  push_bytes_.Increment(bytes);
}

void DataPlaneMetrics::Pulled(double wait_seconds, double seconds,
                              double bytes) {
  pull_wait_seconds_.Observe(wait_seconds);
  pull_seconds_.Observe(seconds);
  pull_bytes_.Increment(bytes);
}

void DataPlaneMetrics::SharedMemory(bool mapped) {
  shared_.Add({{"result", mapped ? "mapped" : "declined"}}).Increment();
}

}  // namespace tally
