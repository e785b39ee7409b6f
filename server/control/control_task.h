// One job's pending control-plane work: taken from the job under the
// coordinator's lock (Reconciler::Take), done without it by calls to the
// job's shards (Reconciler::Run, with Planner's membership decisions), and
// what it did applied to the job under the lock again (Reconciler::Apply).
// Plain data: the task owns copies, so the job may change meanwhile (a
// task of a map version the job has left is not applied).
#ifndef TALLY_SERVER_CONTROL_CONTROL_TASK_H_
#define TALLY_SERVER_CONTROL_CONTROL_TASK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/spec/job_spec.h"
#include "server/control/job_entry.h"
#include "server/shard_control.h"

namespace tally {

struct ControlTask {
  std::string job_id;
  int64_t map_version = 0;
  bool terminal = false;
  bool retired = false;
  bool installed = false;
  bool python = false;  // a Python model: installed once it has weights
  std::string spec;
  int64_t num_params = 0;
  Schedule schedule;
  bool async = false;  // training.consistency.mode async
  bool fixed_ranks = false;  // training.ranks
  struct Range {
    std::string shard_id;
    int64_t offset = 0, count = 0;
    std::shared_ptr<ShardControl> control;
    // Its backup copy (two copies, RangeCopies; null control: none), and the
    // failover calls still to make (Placement::promote, unforward).
    std::string backup_shard_id, backup_address;
    std::shared_ptr<ShardControl> backup_control;
    bool promote = false, unforward = false, seed = false, seeding = false;
  };
  std::vector<Range> ranges;
  std::shared_ptr<const StoredJob> start;
  std::vector<MemberSpec> members;  // what every range has
  std::vector<MemberSpec> desired;  // from the slots (join/leave unset)
  // For a job that grows: its slots, and the plan number a change sends
  // (never one sent before, even by a round that failed).
  int world = 0;
  int64_t max_steps = 0;
  int64_t window = 0;  // ssp's staleness; 0 otherwise
  int64_t next_plan = 0;
  LeaveSteps leaves;  // decided before
  int64_t hold_id = 0;
  int64_t generation = 0;

  // Results.
  bool progressed = false;  // something was done; run again
  bool failed = false;      // a shard refused or was away: retry at Tick
  bool installed_now = false;
  // Ranges (indexes) whose failover calls were made (seeded: the new
  // backup installed, catching up from the primary's version seeded_at).
  std::vector<int> promoted, unforwarded, seeded;
  std::vector<int64_t> seeded_at;
  bool members_now = false;
  std::vector<MemberSpec> new_members;
  // Workers joined the job: its new schedule, set with the members; the
  // highest plan number sent to any range; workers that cannot join (no
  // epoch left).
  std::optional<Schedule> new_schedule;
  int64_t plan_sent = 0;
  std::vector<std::string> not_joined;
  LeaveSteps new_leaves;
  bool retired_now = false;
  std::shared_ptr<const std::vector<float>> final_weights;
  std::string final_buffers;  // the buffer region that goes with them
  std::vector<std::shared_ptr<ShardControl>> table_homes;
  std::vector<std::string> table_home_ids;  // their shards, slot order
};

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_CONTROL_TASK_H_
