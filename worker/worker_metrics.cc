#include "worker/worker_metrics.h"

namespace tally {

namespace {

prometheus::Counter& OneCounter(prometheus::Registry& r, const char* name,
                                const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram& OneHistogram(prometheus::Registry& r, const char* name,
                                    const char* help) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(r)
      .Add({}, LatencyBuckets());
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : steps(OneCounter(r, "tally_worker_steps_total", "Steps computed")),
      samples(OneCounter(r, "tally_worker_samples_total",
                         "Training samples computed")),
      compute_seconds(OneHistogram(r, "tally_worker_compute_seconds",
                                   "Forward and backward pass of a step")),
      push_seconds(OneHistogram(r, "tally_worker_push_seconds",
                                "A step's push to every shard")),
      pull_seconds(OneHistogram(
          r, "tally_worker_pull_seconds",
          "A pull from every shard, the wait for the step to close "
          "included")) {}

}  // namespace tally
