#include "server/control/reconciler.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/schedule.h"
#include "server/control/job_store.h"
#include "server/control/planner.h"
#include "server/control/range_reads.h"

namespace tally {

namespace {

// How long a membership change may hold a job's ranges.
constexpr absl::Duration kHoldFor = absl::Seconds(2);

ControlTask TaskOf(const JobEntry& job, const Registry& registry) {
  ControlTask t;
  t.job_id = job.id();
  t.map_version = job.map_version;
  t.terminal = job.ended();
  t.retired = job.retired;
  t.installed = job.installed;
  t.spec = job.proto.spec();
  t.num_params = job.spec.layout.num_params;
  t.schedule = job.schedule;
  t.async = job.spec.training.consistency.mode == ConsistencyMode::kAsync;
  t.fixed_ranks = job.fixed_ranks();
  t.start = job.start;
  t.python = job.spec.is_python;
  t.members = job.members;
  for (const Placement& p : job.ranges) {
    ControlTask::Range r{p.shard_id, p.offset, p.count,
                         registry.shard(p.shard_id).control};
    if (!p.backup_shard_id.empty()) {
      r.backup_shard_id = p.backup_shard_id;
      r.backup_address = registry.shard(p.backup_shard_id).address;
      r.backup_control = registry.shard(p.backup_shard_id).control;
    }
    r.promote = p.promote;
    r.unforward = p.unforward;
    r.seed = p.seed;
    r.seeding = p.seeding;
    t.ranges.push_back(std::move(r));
  }
  for (size_t r = 0; r < job.slots.size(); ++r) {
    if (job.slots[r].empty()) continue;
    MemberSpec m;
    m.worker_id = job.MemberOf(r);
    m.incarnation = registry.worker(job.slots[r])->incarnation;
    m.rank = static_cast<int>(r);
    t.desired.push_back(m);
  }
  t.leaves = job.leaves;
  // The world a growth makes: up to the highest rank taken (a joiner
  // that left before its round leaves no empty rank at the end).
  t.world = job.schedule.last_world();
  for (size_t r = job.slots.size(); r > 0; --r) {
    if (!job.slots[r - 1].empty()) {
      t.world = std::max(t.world, static_cast<int>(r));
      break;
    }
  }
  t.max_steps = job.spec.training.max_steps;
  t.window = job.spec.training.consistency.Window();
  t.next_plan = job.plan_sent + 1;
  t.generation = job.generation;
  return t;
}

// The ended job's record of what its retired ranges left: the final
// weights, and the shards that keep its tables.
void KeepRetired(const ControlTask& t, JobEntry& job,
                 const Registry& registry) {
  job.retired = true;
  job.final_weights = t.final_weights;
  // A success has its report's buffers; a failed or cancelled job
  // takes the ranges' region (else its export would lack them).
  if (job.final_buffers.empty()) job.final_buffers = t.final_buffers;
  job.table_homes = t.table_homes;
  job.table_home_addresses.clear();
  for (const std::string& id : t.table_home_ids) {
    auto s = registry.shards().find(id);
    job.table_home_addresses.push_back(
        s != registry.shards().end() ? s->second.address : "");
  }
  job.ranges.clear();
  job.members.clear();
}

// The install of range `slot` of the task's job, without its state.
v1::InstallRangeRequest InstallOf(const ControlTask& t, size_t slot) {
  const ControlTask::Range& r = t.ranges[slot];
  v1::InstallRangeRequest req;
  req.set_slot(static_cast<int>(slot));
  req.set_slots(static_cast<int>(t.ranges.size()));
  req.set_job_id(t.job_id);
  req.set_spec(t.spec);
  req.set_map_version(t.map_version);
  req.set_offset(r.offset);
  req.set_count(r.count);
  EncodeSchedule(t.schedule, req.mutable_schedule());
  return req;
}

}  // namespace

std::vector<ControlTask> Reconciler::Take(const JobQueue& jobs,
                                          const Registry& registry,
                                          absl::Time now) {
  std::vector<ControlTask> tasks;
  for (const std::string& id : jobs.order()) {
    const JobEntry& job = jobs.at(id);
    if (!job.dirty) continue;
    if (job.ended() && !job.retired && !job.awaiting_reports.empty() &&
        now < job.retire_after) {
      continue;
    }
    tasks.push_back(TaskOf(job, registry));
    tasks.back().hold_id = next_hold_++;
  }
  return tasks;
}

void Reconciler::Run(ControlTask& t) {
  if (t.terminal) {
    if (!t.retired) Retire(t);
    return;
  }
  if (t.ranges.empty()) return;  // waiting for shards
  if (!t.installed) {
    // A Python model's ranges wait for the weights a worker builds.
    if (t.start == nullptr && t.python) return;
    Install(t);
    return;
  }
  if (!FinishFailover(t)) return;
  SetMembership(t);
}

// A failover's calls (Planner::FailOver): each promoted backup becomes its
// range's primary, each primary whose backup was lost publishes without
// it. Whether all were made (membership waits for them).
bool Reconciler::FinishFailover(ControlTask& t) {
  for (size_t i = 0; i < t.ranges.size(); ++i) {
    const ControlTask::Range& r = t.ranges[i];
    if (r.promote) {
      absl::StatusOr<int64_t> v = r.control->Promote(t.job_id, t.map_version);
      // A primary already (a round that did not finish): done.
      if (!v.ok() && !absl::IsFailedPrecondition(v.status())) {
        t.failed = true;
        return false;
      }
      t.promoted.push_back(static_cast<int>(i));
      t.progressed = true;
    }
    if (r.unforward) {
      if (!r.control->SetBackup(t.job_id, t.map_version, "", 0).ok()) {
        t.failed = true;
        return false;
      }
      t.unforwarded.push_back(static_cast<int>(i));
      t.progressed = true;
    }
    if (r.seed && !r.seeding && r.backup_control != nullptr) {
      absl::StatusOr<int64_t> at = Seed(t, i);
      if (!at.ok()) {
        std::fprintf(stderr, "tally-server: seeding a backup of %s on %s: %s\n",
                     t.job_id.c_str(), r.backup_shard_id.c_str(),
                     std::string(at.status().message()).c_str());
        t.failed = true;
        return false;
      }
      t.seeded.push_back(static_cast<int>(i));
      t.seeded_at.push_back(*at);
      t.progressed = true;
    }
  }
  return true;
}

// A new backup of range `i` from its primary's state, with no hold: the
// primary saves its state as it is and from that version on sends the
// backup's shard every version it makes, without waiting for it, while
// the state is installed there; the backup catches up, and the primary
// says when it is in step (Planner::CheckSeeded).
absl::StatusOr<int64_t> Reconciler::Seed(ControlTask& t, size_t i) {
  const ControlTask::Range& r = t.ranges[i];
  TALLY_ASSIGN_OR_RETURN(
      ShardState state,
      r.control->SeedBackup(t.job_id, t.map_version, r.backup_address,
                            r.count));
  v1::InstallRangeRequest req = InstallOf(t, i);
  req.set_backup(true);
  EncodeRangeState(state, req.mutable_state());
  for (const MemberSpec& m : t.members) *req.add_members() = ToProto(m);
  TALLY_RETURN_IF_ERROR(r.backup_control->Install(req));
  return state.metrics.version;
}

// The end: retire every range, keep the final weights, drop the ranges.
void Reconciler::Retire(ControlTask& t) {
  std::vector<RangeRef> refs;
  bool all_retired = true;  // each range retired now (its tables kept)
  for (const ControlTask::Range& r : t.ranges) {
    absl::Status s = r.control->Retire(t.job_id, t.map_version);
    if (!s.ok() && !absl::IsNotFound(s)) {
      // Away: its weights went with it; the others' are kept below.
      continue;
    }
    // NotFound: retired before (a round that did not finish) or never
    // held; its weights may still be read, its tables are not counted on.
    all_retired = all_retired && s.ok();
    refs.push_back({r.control, r.offset, r.count});
  }
  if (!t.ranges.empty() && refs.size() == t.ranges.size()) {
    RetiredState retired =
        RetiredWeights(t.job_id, t.map_version, t.hold_id, t.num_params, refs);
    t.final_weights = std::move(retired.weights);
    t.final_buffers = std::move(retired.buffers);
    if (all_retired && t.final_weights != nullptr) {
      for (const RangeRef& r : refs) t.table_homes.push_back(r.control);
      for (const ControlTask::Range& r : t.ranges)
        t.table_home_ids.push_back(r.shard_id);
    }
  }
  if (t.final_weights == nullptr && t.start != nullptr) {
    t.final_weights = t.start->state.weights;
    if (t.start->state.buffers != nullptr)
      t.final_buffers = *t.start->state.buffers;
  }
  for (const ControlTask::Range& r : t.ranges) {
    r.control->Drop(t.job_id, /*ended=*/true);
    if (r.backup_control != nullptr) {
      r.backup_control->Retire(t.job_id, t.map_version).IgnoreError();
      r.backup_control->Drop(t.job_id, /*ended=*/true);
    }
  }
  t.retired_now = true;
}

bool Reconciler::FirstInstallError(const std::string& job_id,
                                   int64_t map_version) {
  if (install_errors_.size() > 10000) install_errors_.clear();
  return install_errors_.insert({job_id, map_version}).second;
}

// Every range installed (members come next), from the job's start.
void Reconciler::Install(ControlTask& t) {
  for (size_t slot = 0; slot < t.ranges.size(); ++slot) {
    const ControlTask::Range& r = t.ranges[slot];
    v1::InstallRangeRequest req = InstallOf(t, slot);
    if (t.start != nullptr) {
      t.start->EncodeRange(r.offset, r.count, req.mutable_state());
    }
    absl::Status s;
    if (r.backup_control != nullptr) {
      // The backup first, from the same start: it is there before the
      // primary closes a step.
      v1::InstallRangeRequest backup = req;
      backup.set_backup(true);
      s = r.backup_control->Install(backup);
      req.set_backup_address(r.backup_address);
    }
    if (s.ok()) s = r.control->Install(req);
    if (!s.ok()) {
      // Tried again at the next tick; said once a placement.
      if (FirstInstallError(t.job_id, t.map_version)) {
        std::fprintf(stderr, "tally-server: installing %s on %s: %s\n",
                     t.job_id.c_str(), r.shard_id.c_str(),
                     std::string(s.message()).c_str());
      }
      t.failed = true;
      return;
    }
  }
  t.installed_now = true;
  t.progressed = true;
}

// Membership: what the slots hold against what every range has. Every
// range is held (none closes a step) while the new members are worked out
// from all their reports, then set on every range.
void Reconciler::SetMembership(ControlTask& t) {
  std::vector<MemberSpec> active;
  const bool changed = Planner::MembersDiffer(t, &active);
  // A round that failed half-way may have left a plan on some ranges that
  // the job never adopted: every range gets the job's own again, numbered
  // past it.
  const bool stray_plan = t.next_plan - 1 > t.schedule.plan;
  if (!changed && !stray_plan) return;
  std::vector<HoldReport> reports;
  for (const ControlTask::Range& r : t.ranges) {
    absl::StatusOr<HoldReport> h =
        r.control->Hold(t.job_id, t.map_version, t.hold_id, kHoldFor);
    if (!h.ok()) {
      t.failed = true;  // the holds lapse by themselves
      return;
    }
    reports.push_back(*std::move(h));
  }
  std::vector<MemberSpec> next = Planner::DecideMembers(t, active, reports);
  if (stray_plan && !t.new_schedule.has_value()) {
    t.new_schedule = t.schedule;
    t.new_schedule->plan = t.next_plan;
  }
  PlanChange plan;
  if (t.new_schedule.has_value()) {
    plan.plan = t.new_schedule->plan;
    plan.total_steps = t.new_schedule->total_steps;
    t.plan_sent = plan.plan;
  }
  for (const ControlTask::Range& r : t.ranges) {
    if (!r.control->SetMembers(t.job_id, t.map_version, next, t.hold_id, plan)
             .ok()) {
      // A range whose hold lapsed kept its members; the others have the
      // new ones. Both are safe until the next try sets them all.
      t.failed = true;
      return;
    }
  }
  // Backups take no pushes and close nothing: they are not held, and have
  // the members for the day they take over. One that did not take them
  // fails the round: the next one sets them all again (a backup's shard
  // that is gone is the failover's, which drops it from the job).
  for (const ControlTask::Range& r : t.ranges) {
    if (r.backup_control != nullptr &&
        !r.backup_control->SetMembers(t.job_id, t.map_version, next, 0, plan)
             .ok()) {
      t.failed = true;
      return;
    }
  }
  t.new_members = std::move(next);
  t.members_now = true;
  t.progressed = true;
}

bool Reconciler::Apply(ControlTask& t, JobEntry& job, const Registry& registry,
                       absl::Time now,
                       const std::function<void(const std::string&)>& vacate) {
  // Decided even when not every range took it yet.
  for (const auto& [key, leave] : t.new_leaves) job.leaves[key] = leave;
  for (int i : t.promoted) {
    if (i < static_cast<int>(job.ranges.size()) &&
        job.ranges[i].shard_id == t.ranges[i].shard_id)
      job.ranges[i].promote = false;
  }
  for (int i : t.unforwarded) {
    if (i < static_cast<int>(job.ranges.size()) &&
        job.ranges[i].shard_id == t.ranges[i].shard_id)
      job.ranges[i].unforward = false;
  }
  for (size_t k = 0; k < t.seeded.size(); ++k) {
    const int i = t.seeded[k];
    if (i < static_cast<int>(job.ranges.size()) &&
        job.ranges[i].backup_shard_id == t.ranges[i].backup_shard_id) {
      job.ranges[i].seeding = true;
      job.ranges[i].seeded_at = t.seeded_at[k];
    }
  }
  if (t.installed_now) {
    job.installed = true;
    job.members.clear();
    if (!job.condition.empty()) {
      job.AddEvent(
          now,
          absl::StrCat("placed again on ", job.ranges.size(),
                       " parameter shard", job.ranges.size() == 1 ? "" : "s",
                       " at step ", t.start != nullptr ? t.start->state.metrics.version : 0));
      job.condition.clear();
    }
  }
  job.plan_sent = std::max(job.plan_sent, t.plan_sent);
  if (t.members_now) {
    job.members = t.new_members;
    if (t.new_schedule.has_value())
      Planner::AdoptPlan(job, *t.new_schedule, now);
  }
  for (const std::string& id : t.not_joined) {
    job.AddEvent(now, absl::StrCat(id, " cannot join: no epoch is left to "
                                       "start it at"));
    vacate(id);
    job.grown_out = true;  // nor will one be: epochs only pass
  }
  // Slots past the world that nobody took: the job did not grow there.
  while (static_cast<int>(job.slots.size()) > job.schedule.last_world() &&
         job.slots.back().empty()) {
    job.slots.pop_back();
  }
  if (t.retired_now) KeepRetired(t, job, registry);
  // Done when nothing failed, nothing is left, and nothing changed since
  // the task was taken: the next round finds out.
  if (!t.failed && !t.progressed && job.generation == t.generation)
    job.dirty = false;
  return t.progressed;
}

}  // namespace tally
