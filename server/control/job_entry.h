// The coordinator's records: a job (JobEntry: its record, plan, placement
// and what its control-plane work has reached), a registered worker and a
// registered shard. Plain data that the coordinator's parts share
// (job_queue.h, registry.h, planner.h, reconciler.h, job_archive.h); the
// coordinator's lock guards every one of them.
#ifndef TALLY_SERVER_CONTROL_JOB_ENTRY_H_
#define TALLY_SERVER_CONTROL_JOB_ENTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/spec/job_spec.h"
#include "proto/tally.pb.h"
#include "server/shard_control.h"

namespace tally {

struct StoredJob;

// One range of a job's shard map: elements [offset, offset + count) on a
// shard, and with two copies (RangeCopies) its backup copy on another
// (docs/cluster.md, "Replicated ranges").
struct Placement {
  std::string shard_id;
  int64_t offset = 0;
  int64_t count = 0;
  std::string backup_shard_id;  // empty: none
  // A failover's calls still to make: the backup that took over is to
  // become the primary (promote); the primary whose backup was lost is to
  // publish without it (unforward); a new backup is to be seeded from the
  // primary's state (seed), and once it is (seeding), it is catching up:
  // it counts as a copy when its primary says it is in step with a version
  // made after the seed (Planner::CheckSeeded).
  bool promote = false;
  bool unforward = false;
  bool seed = false;
  bool seeding = false;
  int64_t seeded_at = 0;  // the primary's version its state was saved at
};

// Leave steps decided, by (worker id, incarnation): (leave step, whether
// its last commit said "nothing").
using LeaveSteps =
    std::map<std::pair<std::string, int64_t>, std::pair<int64_t, bool>>;

struct JobEntry {
  v1::Job proto;
  JobSpec spec;
  Schedule schedule;               // fixed at submission, from the spec alone
  std::vector<std::string> slots;  // worker id per rank; "" = vacant
  // Workers that said they cannot train this job (another dataset): they
  // are never given it again.
  std::set<std::string> barred;
  // "worker@map" of failures reported from placements the job has left
  // (noted once each; map versions below the job's own, so bounded).
  std::set<std::string> stale_reports;
  // The data plane: the shard map (ranges in order) and its version.
  int64_t map_version = 0;
  // Failovers since the placement (a range's backup took over): the map
  // keeps its version, the workers get the new addresses.
  int64_t map_revision = 0;
  std::vector<Placement> ranges;
  bool installed = false;  // every range installed at map_version
  // The membership every range has (set after a hold of every range).
  std::vector<MemberSpec> members;
  // What the ranges start from when (re)installed: a checkpoint's state;
  // null: the spec's initial weights.
  std::shared_ptr<const StoredJob> start;
  // A Python model without weights yet: whom the coordinator asked for
  // them, and since when.
  std::string weights_asked_of;
  absl::Time weights_asked_at;
  // After the end: the final weights, kept here; the shards drop the job.
  std::shared_ptr<const std::vector<float>> final_weights;
  // A job with tables: the shard of each slot when it ended, which keeps
  // the tables (ShardHost::ReadTable); empty when one was away.
  std::vector<std::shared_ptr<ShardControl>> table_homes;
  // Their addresses, kept with the job (JobCheckpoint.table_homes): a
  // restarted coordinator finds the shards by them.
  std::vector<std::string> table_home_addresses;
  // A Python model's buffers: from the report that ended the job, or
  // (no report: it failed or was cancelled) its retired ranges' region.
  std::string final_buffers;
  bool retired = false;  // the ranges were retired (and dropped)
  // After a success: the members that have not reported yet, for whom the
  // ranges keep serving the final weights until retire_after.
  std::set<std::string> awaiting_reports;
  absl::Time retire_after = absl::InfinitePast();
  // A shard of the job was lost: its checkpoint is being read; it is
  // placed again once `start` is set.
  bool awaiting_start = false;
  // What the job waits for now (a restart, a lost shard), shown before
  // its message until its ranges are installed again; the events keep
  // the history.
  std::string condition;
  // The highest plan number sent to any range (Schedule.plan): a new
  // plan is numbered past it, even when a round that sent one failed.
  int64_t plan_sent = 0;
  // A worker could not join: no epoch is left, and none will be.
  bool grown_out = false;
  bool dirty = true;       // control-plane work pending
  int64_t generation = 0;  // bumped with every change that needs work
  // Leave steps decided and sent to some range: never decided again
  // (a range that took one may already have closed that step).
  LeaveSteps leaves;
  int64_t notified_version = -1;
  // When the weights last moved (Tick), for the stall report; and when
  // watchers were last told about a stall.
  absl::Time moved_at = absl::InfinitePast();
  absl::Time stall_noted = absl::InfinitePast();
  // What the last checkpoint holds: state, version, and when.
  v1::JobState saved_state = v1::JOB_STATE_UNSPECIFIED;
  int64_t saved_version = -1;
  absl::Time saved_at = absl::InfinitePast();
  // The dashboard's curves and events (v1::JobHistory says the bounds).
  v1::JobHistory history;
  absl::Time last_point = absl::InfinitePast();
  absl::Duration point_every = absl::Milliseconds(500);

  const std::string& id() const { return proto.id(); }
  bool ended() const;  // SUCCEEDED, FAILED or CANCELLED
  // The job needs control-plane work (the coordinator's control round).
  void MarkDirty() {
    dirty = true;
    ++generation;
  }
  // The worker in the lowest occupied rank; "" if none.
  std::string LowestRank() const;
  // training.ranks: ranks are fixed, a worker may hold several, and a
  // step waits for every one.
  bool fixed_ranks() const { return spec.training.ranks > 0; }
  // The member that rank's slot holder is on every range: the worker, or
  // with fixed ranks "WORKER#RANK.TERM" (RankMember); "" when vacant.
  std::string MemberOf(size_t rank) const;
  // Fixed ranks: how many times each rank was given to a worker (its
  // member's term), counted by AssignSlot.
  std::vector<int64_t> slot_terms;
  // The ranks `worker_id` holds, lowest first.
  std::vector<int> RanksOf(const std::string& worker_id) const;
  // Appends to the history: an event (the last 200 are kept), or a curve
  // point (one a step; a full curve keeps the whole run at half the
  // resolution, and points come half as often).
  void AddEvent(absl::Time now, std::string text);
  void AddCurvePoint(absl::Time now, const v1::JobMetrics& m);
};

struct WorkerEntry {
  std::string name, devices, address;
  std::string python;       // the Python runtime it offers; "": none
  int64_t incarnation = 0;  // its lease's
  uint32_t protocol = 0;    // the worker protocol it speaks
  std::string job_id;       // "" = idle
  int rank = -1;            // its lowest, with training.ranks
  // Its step times on job_id, as its heartbeats say (v1::WorkerProgress).
  double compute_seconds = 0, wait_seconds = 0, push_seconds = 0,
         loader_seconds = 0;
};

struct ShardEntry {
  std::string address;      // "" for the coordinator's own
  int64_t incarnation = 0;  // its lease's
  absl::Time last_seen;
  bool live = true;
  std::shared_ptr<ShardControl> control;
  std::vector<v1::RangeStatus> ranges;  // last reported (remote shards)
};

bool Terminal(v1::JobState s);
double UnixSeconds(absl::Time t);
// "job-12" -> 12 (0 for anything else).
int64_t JobNumber(const std::string& id);
// kNotFound for a job this coordinator does not know.
absl::Status NoJob(const std::string& job_id);

}  // namespace tally

#endif  // TALLY_SERVER_CONTROL_JOB_ENTRY_H_
