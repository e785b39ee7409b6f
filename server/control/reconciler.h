// The coordinator's control round: a job's state change (placed, a worker
// joined or left, ended) becomes calls to the shards that hold its ranges.
// Each round takes every dirty job's pending work as a ControlTask
// (control_task.h) under the coordinator's lock (Take), makes the calls
// without it (Run), and applies what they did under the lock again
// (Apply). Run does one of three things:
//   - an ended job: retire every range, keep the final weights (and a
//     Python model's buffer region; the ranges' shards keep the tables),
//     drop the ranges;
//   - a placed job not installed: install every range from the job's start
//     (a Python model's wait for the weights a worker builds);
//   - an installed job whose slots differ from its members: hold every
//     range (none closes a step), decide the members from all their
//     reports (Planner::DecideMembers) and set them, with a new plan when
//     the job grows, on every range.
// A call that fails leaves the job dirty; the next round (the next Tick)
// tries again. A round that failed half-way is safe: a range whose hold
// lapsed keeps its members until the next try sets them all.
//
// Not thread-safe: guarded by its owner (the Coordinator's control_mu_,
// which serialises rounds; Take and Apply also need its mu_).
#ifndef TALLY_SERVER_CONTROL_RECONCILER_H_
#define TALLY_SERVER_CONTROL_RECONCILER_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/control/control_task.h"
#include "server/control/job_entry.h"
#include "server/control/job_queue.h"
#include "server/control/registry.h"

namespace tally {

class Reconciler {
 public:
  Reconciler() = default;
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // Every dirty job's pending work, in submission order. A succeeded job's
  // ranges go once its members have their final weights (or the grace is
  // over): it stays dirty until then.
  std::vector<ControlTask> Take(const JobQueue& jobs, const Registry& registry,
                                absl::Time now);
  // The task's calls to its job's shards; its results are set.
  void Run(ControlTask& task);
  // What the task did, into its job (the caller checked that the job is
  // still at the task's map version); `vacate` takes a worker that cannot
  // join off the job. Whether another round is worth it.
  static bool Apply(ControlTask& task, JobEntry& job, const Registry& registry,
                    absl::Time now,
                    const std::function<void(const std::string&)>& vacate);

 private:
  void Retire(ControlTask& task);
  void Install(ControlTask& task);
  void SetMembership(ControlTask& task);
  bool FinishFailover(ControlTask& task);
  // The primary's version the new backup was seeded at.
  absl::StatusOr<int64_t> Seed(ControlTask& task, size_t range);
  // Whether an install error of this placement is the first (logged).
  bool FirstInstallError(const std::string& job_id, int64_t map_version);

  int64_t next_hold_ = 1;
  std::set<std::pair<std::string, int64_t>> install_errors_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_RECONCILER_H_
