// The coordinator's plans: which workers a job has (its slots, filled from
// the idle workers: running jobs first, then pending jobs in submission
// order, then growth), where its parameters go (the shard map: its vector
// split over the live shards, least loaded first, server/control/
// partition.h), the schedule it records (Job.membership, plan), and who
// belongs to which steps (membership decisions, made by the control round
// from every range's report while every range is held).
//
// Membership. A joiner joins at the highest version any range has (no
// range has closed it); a leaver belongs to every step that any range saw
// it commit (that push reached every range). With fixed ranks
// (training.ranks) a rank always has a member: its holder leaves only when
// another takes the rank, who joins at its leave step; until then the
// steps wait for it. A worker past the job's world
// (training.workers: {min, max}) joins at the start of a later epoch, with
// a new plan; a job too near its end to have one left takes nobody.
//
// Borrows the coordinator's JobQueue and Registry. Not thread-safe:
// guarded by its owner (the Coordinator's mu_). The static membership
// decisions read and write only the task they are given.
#ifndef TALLY_SERVER_CONTROL_PLANNER_H_
#define TALLY_SERVER_CONTROL_PLANNER_H_

#include <cstdint>
#include <memory>
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

class Planner {
 public:
  // Steps between the furthest a worker may have begun and the first it
  // may join at (a step computed beside its pull, and one more).
  static constexpr int64_t kJoinMargin = 2;

  // `jobs` and `registry` are borrowed and must outlive the planner.
  Planner(JobQueue* jobs, Registry* registry)
      : jobs_(*jobs), registry_(*registry) {}
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Gives idle workers to jobs: running jobs are placed (when they have no
  // ranges) and their vacant slots refilled; pending jobs start, in
  // submission order, once all their slots can be filled and they are
  // placed; running jobs that may grow take the workers left. Returns the
  // jobs whose watchers are to hear, once a change.
  std::vector<std::string> ScheduleJobs(absl::Time now);
  // Splits the job over the live shards (a new map version); with two
  // copies (RangeCopies) each range has a backup on another shard where
  // one remains, on another host where one has a shard left (unless
  // training.shards says how many, the primaries take half the live
  // shards). False when too few are live.
  bool Place(JobEntry& job, absl::Time now);
  // A lost shard. A job whose every copy there has its other copy live
  // goes on where it is (FailOver). Every other job not ended with a
  // range there loses all its ranges (the others are dropped from their
  // shards) and waits for its start (Restart). Returns those jobs.
  std::vector<std::string> LoseShard(const std::string& shard_id,
                                     absl::Time now);
  // A lost shard's job starts again from `start` (null: the beginning; a
  // Python model keeps the initial weights it was built with).
  static void Restart(JobEntry& job, std::shared_ptr<const StoredJob> start,
                      absl::Time now);
  // Shards that some job's placement names.
  std::set<std::string> PlacedShards() const;
  // Live shards, least loaded first (the values of the ranges, primaries
  // and backups, of every job not ended), as (values, shard id).
  std::vector<std::pair<int64_t, std::string>> LiveShardsByLoad() const;
  // A replicated job's new backups that caught up are counted
  // (CheckSeeded); then its ranges left with one copy (a failover) get a
  // new backup on the least loaded live shard that holds no copy of the
  // job (PickBackup), seeded from the primary by the next control round
  // (Placement::seed); none while no such shard is live.
  void ReplaceBackups(JobEntry& job, absl::Time now);
  // A new backup that is catching up (Placement::seeding) counts as a copy
  // once its primary's status says it is in step (RangeStatus.
  // backup_in_step) with it, at a version made after the seed; until then
  // the primary's loss rolls the job back (and an idle job's new backup,
  // acknowledging nothing, waits for its next step).
  void CheckSeeded(JobEntry& job, absl::Time now);
  // A replicated job's copies on `lost` are gone: each range whose primary
  // was there is taken over by its backup (promote), each whose backup was
  // there goes on without one (unforward); no step is rolled back.
  static void FailOver(JobEntry& job, const std::string& lost,
                       absl::Time now);

  // Heartbeat's answer of the worker's assignment, once it is a member on
  // every range; one it holds already (req.held) is answered "unchanged".
  void Assignment(const v1::HeartbeatRequest& req, const WorkerEntry& w,
                  const JobEntry& job, v1::HeartbeatResponse* out) const;

  // The job's schedule into its record (Job.membership, workers_max,
  // plan); read back from it (with slots for its last world); a decided
  // plan made the job's (an event when the world changed).
  static void RecordPlan(JobEntry& job);
  static void RestorePlan(JobEntry& job);
  static void AdoptPlan(JobEntry& job, const Schedule& grown, absl::Time now);

  // Whether the task's slots differ from the members every range has;
  // `active`: those members not leaving.
  static bool MembersDiffer(const ControlTask& task,
                            std::vector<MemberSpec>* active);
  // The members every range is to have, from what they have (`active`:
  // those not leaving) and their reports, held; sets the task's
  // new_leaves, and new_schedule and not_joined when workers grow it.
  static std::vector<MemberSpec> DecideMembers(
      ControlTask& task, const std::vector<MemberSpec>& active,
      const std::vector<HoldReport>& reports);
  // The first epoch a worker may join at: no earlier than the last world
  // decided, starting at or past `bound`, before the end and max_steps;
  // -1 when there is none.
  static int64_t JoinEpoch(const Schedule& s, int64_t bound,
                           int64_t max_steps);
  // The furthest clock the held ranges saw a member at (async), ignoring
  // values past the schedule's end.
  static int64_t MaxClock(const std::vector<HoldReport>& reports,
                          int64_t total_steps);

 private:
  // A backup's shard for a range whose primary is on `primary`: of the
  // shards in `order` (least loaded first) not in `taken`, the first on
  // another host than the primary's (the host part of its address), else
  // the first; "" when every one is taken.
  std::string PickBackup(
      const std::vector<std::pair<int64_t, std::string>>& order,
      const std::set<std::string>& taken, const std::string& primary) const;
  // DecideMembers' joiners past the world: their epoch and the new plan.
  static void GrowMembers(ControlTask& task, int64_t vmax,
                          const std::vector<HoldReport>& reports,
                          std::vector<MemberSpec>& growing,
                          std::vector<MemberSpec>* next);
  // The idle workers a job may take, newest registration last.
  std::vector<std::string> Eligible(const JobEntry& job,
                                    const std::vector<std::string>& idle) const;
  void AssignSlot(JobEntry& job, int rank, const std::string& worker_id,
                  absl::Time now);
  bool FillSlots(JobEntry& job, std::vector<std::string>& free,
                 absl::Time now);
  // Fixed ranks (training.ranks): a pending job's ranks in blocks over the
  // free workers; a running job's vacant ranks refilled, and its ranks
  // spread over free workers. Both take from `free`.
  void StartRanks(JobEntry& job, std::vector<std::string>& free,
                  absl::Time now);
  bool FillRanks(JobEntry& job, std::vector<std::string>& free,
                 absl::Time now);
  bool SpreadRanks(JobEntry& job, std::vector<std::string>& free,
                   absl::Time now);
  std::vector<std::string> Taken(const std::vector<std::string>& idle,
                                 const std::vector<std::string>& free,
                                 const JobEntry& job) const;
  // A pending job whose slots are filled and ranges placed: RUNNING.
  static void Start(JobEntry& job, absl::Time now);
  // Growth: running jobs take idle workers (ScheduleJobs, last).
  void GrowJobs(std::vector<std::string>& idle, absl::Time now,
                std::vector<std::string>* changed);

  JobQueue& jobs_;
  Registry& registry_;
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_PLANNER_H_
