#include "server/control/coordinator_metrics.h"

#include <string>

#include "absl/strings/ascii.h"
#include "proto/errors.h"
#include "server/control/coordinator.h"

namespace tally {

namespace {

using prometheus::MetricType;

bool Live(v1::JobState s) { return s == v1::PENDING || s == v1::RUNNING; }

// The series of one value of every live job.
struct PerJob {
  const char* name;
  const char* help;
  MetricType type;
  double (*value)(const v1::JobMetrics&);
};
constexpr PerJob kPerJob[] = {
    {"tally_job_steps_total", "Steps closed (the weights' version)",
     MetricType::Counter,
     [](const v1::JobMetrics& m) { return static_cast<double>(m.step()); }},
    {"tally_job_samples_total", "Training samples consumed",
     MetricType::Counter,
     [](const v1::JobMetrics& m) { return static_cast<double>(m.samples()); }},
    {"tally_job_rejected_pushes_total",
     "Pushes refused (non-finite values, overflowing steps)",
     MetricType::Counter,
     [](const v1::JobMetrics& m) {
       return static_cast<double>(m.rejected_pushes());
     }},
    {"tally_job_samples_per_second", "Samples per second, last few seconds",
     MetricType::Gauge,
     [](const v1::JobMetrics& m) { return m.samples_per_sec(); }},
    {"tally_job_loss", "Mean training loss of the last closed step",
     MetricType::Gauge, [](const v1::JobMetrics& m) { return m.loss(); }},
    {"tally_job_accuracy", "Training accuracy of the last closed step",
     MetricType::Gauge, [](const v1::JobMetrics& m) { return m.accuracy(); }},
    {"tally_job_workers", "Live members of the job", MetricType::Gauge,
     [](const v1::JobMetrics& m) { return static_cast<double>(m.workers()); }},
    {"tally_job_stale_pushes_total",
     "Pushes refused as staler than the job's max_staleness",
     MetricType::Counter,
     [](const v1::JobMetrics& m) {
       return static_cast<double>(m.stale_pushes());
     }},
    {"tally_job_late_pushes_total",
     "Pushes that came after their step had closed (backup workers)",
     MetricType::Counter,
     [](const v1::JobMetrics& m) {
       return static_cast<double>(m.late_pushes());
     }},
    {"tally_job_sum_resets_total",
     "Streamed step sums dropped, their pushes sent again (PUSH_AGAIN)",
     MetricType::Counter,
     [](const v1::JobMetrics& m) {
       return static_cast<double>(m.sum_resets());
     }},
    {"tally_job_stalled_seconds",
     "Seconds the job's weights have not moved (0 while they do)",
     MetricType::Gauge,
     [](const v1::JobMetrics& m) { return m.stalled_seconds(); }},
};

// Per worker of a live job (the label sets go with the job).
struct PerWorker {
  const char* name;
  const char* help;
  double (*value)(const v1::WorkerProgress&);
};
constexpr PerWorker kPerWorker[] = {
    {"tally_job_worker_clock_steps", "The step a worker works on",
     [](const v1::WorkerProgress& p) {
       return static_cast<double>(p.clock());
     }},
    {"tally_job_worker_lag_steps", "Steps a worker is behind the job's fastest",
     [](const v1::WorkerProgress& p) { return static_cast<double>(p.lag()); }},
    {"tally_job_worker_compute_seconds",
     "A worker's mean time computing a step (recent steps)",
     [](const v1::WorkerProgress& p) { return p.compute_seconds(); }},
    {"tally_job_worker_pull_wait_seconds",
     "A worker's mean time waiting for a step's weights (recent steps)",
     [](const v1::WorkerProgress& p) { return p.wait_seconds(); }},
    {"tally_job_worker_loader_wait_seconds",
     "A worker's mean time waiting for its batch from the data loader "
     "(recent steps)",
     [](const v1::WorkerProgress& p) { return p.loader_seconds(); }},
};

void AddServerSeries(const std::vector<v1::Job>& jobs,
                     const CoordinatorStats& stats,
                     std::vector<prometheus::MetricFamily>& out) {
  auto states = Family("tally_jobs", "Jobs the coordinator keeps, by state",
                       MetricType::Gauge);
  int64_t by_state[v1::JobState_ARRAYSIZE] = {};
  for (const v1::Job& j : jobs) ++by_state[j.state()];
  for (int s = 1; s < v1::JobState_ARRAYSIZE; ++s) {
    if (!v1::JobState_IsValid(s)) continue;
    AddSample(&states,
              {{"state", absl::AsciiStrToLower(
                             v1::JobState_Name(static_cast<v1::JobState>(s)))}},
              static_cast<double>(by_state[s]));
  }
  out.push_back(std::move(states));
  auto one = [&out](const char* name, const char* help, MetricType type,
                    double v) {
    auto f = Family(name, help, type);
    AddSample(&f, {}, v);
    out.push_back(std::move(f));
  };
  const MetricType gauge = MetricType::Gauge, counter = MetricType::Counter;
  one("tally_queued_jobs", "Jobs waiting for workers (PENDING)", gauge,
      static_cast<double>(by_state[v1::PENDING]));
  one("tally_workers", "Registered workers holding a lease", gauge,
      static_cast<double>(stats.workers));
  one("tally_idle_workers", "Registered workers without a job", gauge,
      static_cast<double>(stats.idle_workers));
  one("tally_live_shards", "Parameter shards holding their lease", gauge,
      static_cast<double>(stats.live_shards));
  one("tally_lease_expiries_total", "Workers and shards whose lease lapsed",
      counter, static_cast<double>(stats.lease_expiries));
  one("tally_leases_ended_total",
      "Workers and shards whose connection closed (Attend): their lease "
      "ended at once",
      counter, static_cast<double>(stats.leases_ended));
  one("tally_checkpoints_total", "Job checkpoint files written", counter,
      static_cast<double>(stats.checkpoints_written));
  one("tally_checkpoint_seconds_total", "Time spent writing job checkpoints",
      counter, stats.checkpoint_seconds);
  auto age = Family("tally_checkpoint_age_seconds",
                    "Seconds since a running job's last checkpoint",
                    MetricType::Gauge);
  for (const auto& [id, seconds] : stats.checkpoint_age_seconds)
    AddSample(&age, {{"job_id", id}}, seconds);
  out.push_back(std::move(age));
}

void AddJobSeries(const std::vector<v1::Job>& jobs,
                  std::vector<prometheus::MetricFamily>& out) {
  for (const PerJob& p : kPerJob) {
    auto f = Family(p.name, p.help, p.type);
    for (const v1::Job& j : jobs) {
      if (Live(j.state()))
        AddSample(&f, {{"job_id", j.id()}}, p.value(j.metrics()));
    }
    out.push_back(std::move(f));
  }
  for (const PerWorker& p : kPerWorker) {
    auto f = Family(p.name, p.help, MetricType::Gauge);
    for (const v1::Job& j : jobs) {
      if (!Live(j.state())) continue;
      for (const v1::WorkerProgress& w : j.metrics().progress())
        AddSample(&f,
                  {{"job_id", j.id()},
                   {"worker_id", w.worker_id()},
                   {"rank", std::to_string(w.rank())}},
                  p.value(w));
    }
    out.push_back(std::move(f));
  }
}

}  // namespace

std::vector<prometheus::MetricFamily> CoordinatorCollector::Collect() const {
  const std::vector<v1::Job> jobs = coord_->List(/*with_specs=*/false);
  std::vector<prometheus::MetricFamily> out;
  AddServerSeries(jobs, coord_->Stats(), out);
  AddJobSeries(jobs, out);
  return out;
}

}  // namespace tally
