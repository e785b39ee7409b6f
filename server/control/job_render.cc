#include "server/control/job_render.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/schedule.h"

namespace tally {

namespace {

// Each table's figures, summed over the ranges that hold its rows.
void SumTables(const std::vector<v1::RangeStatus>& ranges,
               v1::JobMetrics* out) {
  out->clear_tables();
  for (const v1::RangeStatus& r : ranges) {
    for (int i = 0; i < r.tables_size(); ++i) {
      const v1::TableStats& t = r.tables(i);
      while (out->tables_size() <= i) out->add_tables()->set_name(t.name());
      v1::TableStats* sum = out->mutable_tables(i);
      sum->set_rows(sum->rows() + t.rows());
      sum->set_bytes(sum->bytes() + t.bytes());
      sum->set_rows_pulled(sum->rows_pulled() + t.rows_pulled());
      sum->set_rows_created(sum->rows_created() + t.rows_created());
      sum->set_rows_pushed(sum->rows_pushed() + t.rows_pushed());
      sum->set_rows_applied(sum->rows_applied() + t.rows_applied());
      sum->set_pulled_bytes(sum->pulled_bytes() + t.pulled_bytes());
      sum->set_pushed_bytes(sum->pushed_bytes() + t.pushed_bytes());
      sum->set_pull_wire_bytes(sum->pull_wire_bytes() + t.pull_wire_bytes());
      sum->set_push_wire_bytes(sum->push_wire_bytes() + t.push_wire_bytes());
      sum->set_rows_evicted(sum->rows_evicted() + t.rows_evicted());
      sum->set_rows_filtered(sum->rows_filtered() + t.rows_filtered());
    }
  }
}

// The range whose figures are those of step `version` (the lowest any
// range has reached): a range already a step further shows the next
// step's loss, which would be drawn a step early.
const v1::RangeStatus& AtVersion(const std::vector<v1::RangeStatus>& ranges,
                                 int64_t version) {
  for (const v1::RangeStatus& r : ranges) {
    if (r.version() == version) return r;
  }
  return ranges.front();
}

// How long the weights have not moved, and (after kStallReport seconds)
// whom the open step waits on.
void RenderStall(const JobEntry& job, int64_t version, absl::Time now,
                 v1::JobMetrics* out) {
  // At the last version no step is open: the workers evaluate the final
  // weights, and the weights are not meant to move again.
  if (job.moved_at == absl::InfinitePast() ||
      (job.schedule.total_steps > 0 && version >= job.schedule.total_steps))
    return;
  const double stalled = absl::ToDoubleSeconds(now - job.moved_at);
  if (stalled < 1.0) return;
  out->set_stalled_seconds(stalled);
  // Nothing waits on a worker in async.
  if (stalled < kStallReport ||
      job.spec.training.consistency.mode == ConsistencyMode::kAsync)
    return;
  // The open step waits on the workers that have not pushed it: those on
  // it or behind, not waiting for weights themselves.
  // A member that has never pulled (clock -1) holds the step as much as one
  // that pulled and did not push: it is named too, so that an operator sees
  // it (docs/cluster.md, "A stalled job").
  // A slot holder whose membership is still being set (or that joins at a
  // later step) is not waited on.
  auto required = [&job, version](const std::string& id) {
    for (const MemberSpec& m : job.members) {
      if (m.worker_id == id && m.join_step <= version && m.leave_step > version)
        return true;
    }
    return false;
  };
  const bool ranks = job.fixed_ranks();
  for (const v1::WorkerProgress& p : out->progress()) {
    const std::string member =
        ranks ? job.MemberOf(static_cast<size_t>(p.rank())) : p.worker_id();
    if (p.clock() <= version && !p.waiting() && required(member)) {
      out->add_waiting_on(absl::StrCat(
          p.worker_id(),
          p.name().empty() ? "" : absl::StrCat(" (", p.name(), ")"),
          ranks ? absl::StrCat(" rank ", p.rank()) : "",
          p.clock() < 0 ? ": has not pulled yet" : ""));
    }
  }
  // Fixed ranks: a rank that lost its worker waits for another.
  for (size_t r = 0; ranks && r < job.slots.size(); ++r) {
    if (job.slots[r].empty()) {
      out->add_waiting_on(
          absl::StrCat("rank ", r, ": its worker left, and no worker has "
                                   "taken it yet"));
    }
  }
}

// Every worker's clock, lag and times; the slowest; a stall and whom it
// waits on.
void RenderProgress(const JobEntry& job, const Registry& registry,
                    int64_t version, const std::vector<v1::RangeStatus>& ranges,
                    absl::Time now, v1::JobMetrics* out) {
  // A worker's clock is the step its last pull was served for, on the
  // range that served it last (they differ by a step at most); it waits
  // while a pull of it waits on any range.
  std::map<std::string, std::pair<int64_t, bool>> clocks;
  for (const v1::RangeStatus& r : ranges) {
    for (const v1::MemberProgress& m : r.member_progress()) {
      auto [it, fresh] = clocks.try_emplace(m.worker_id(), m.clock(), false);
      it->second.first = std::max(it->second.first, m.clock());
      it->second.second = it->second.second || m.waiting();
    }
  }
  int64_t fastest = -1;
  v1::WorkerProgress* slowest = nullptr;
  for (size_t r = 0; r < job.slots.size(); ++r) {
    const std::string& id = job.slots[r];
    const WorkerEntry* w = id.empty() ? nullptr : registry.worker(id);
    if (w == nullptr || w->job_id != job.id()) continue;
    v1::WorkerProgress* p = out->add_progress();
    p->set_worker_id(id);
    p->set_name(w->name);
    p->set_rank(static_cast<int32_t>(r));
    // -1 until a pull of it was served: a joining worker is nobody's
    // straggler yet.
    auto c = clocks.find(job.MemberOf(r));
    p->set_clock(c != clocks.end() ? c->second.first : -1);
    p->set_waiting(c != clocks.end() && c->second.second);
    p->set_compute_seconds(w->compute_seconds);
    p->set_wait_seconds(w->wait_seconds);
    p->set_loader_seconds(w->loader_seconds);
    p->set_push_seconds(w->push_seconds);
    fastest = std::max(fastest, p->clock());
  }
  for (v1::WorkerProgress& p : *out->mutable_progress()) {
    if (p.clock() < 0) continue;
    p.set_lag(fastest - p.clock());
    if (slowest == nullptr || p.clock() < slowest->clock() ||
        (p.clock() == slowest->clock() &&
         p.compute_seconds() > slowest->compute_seconds())) {
      slowest = &p;
    }
  }
  int clocked = 0;
  for (const v1::WorkerProgress& p : out->progress()) clocked += p.clock() >= 0;
  if (slowest != nullptr && clocked > 1) slowest->set_slowest(true);
  RenderStall(job, version, now, out);
}

// The figures of every range at the version every range has reached
// (every push reaches each).
void RenderRanges(const JobEntry& job, const Registry& registry,
                  const std::vector<v1::RangeStatus>& ranges, absl::Time now,
                  v1::JobMetrics* out) {
  int64_t version = INT64_MAX, rejected = 0, stale = 0, late = 0, resets = 0;
  for (const v1::RangeStatus& r : ranges) {
    version = std::min(version, r.version());
    resets += r.sum_resets();  // each range drops its own
    rejected += r.rejected_pushes();
    stale = std::max(stale, r.stale_pushes());
    late = std::max(late, r.late_pushes());
  }
  const v1::RangeStatus& shown = AtVersion(ranges, version);
  out->set_step(version);
  out->set_epoch(
      job.schedule.EpochOfVersion(std::max<int64_t>(0, version - 1)));
  out->set_stale_pushes(stale);
  out->set_late_pushes(late);
  out->set_sum_resets(resets);
  SumTables(ranges, out);
  RenderProgress(job, registry, version, ranges, now, out);
  out->set_loss(shown.loss());
  out->set_accuracy(shown.accuracy());
  out->set_samples_per_sec(shown.samples_per_sec());
  out->set_samples(shown.samples());
  out->set_train_seconds(shown.train_seconds());
  out->set_mean_samples_per_sec(shown.train_seconds() > 0
                                    ? shown.samples() / shown.train_seconds()
                                    : 0.0);
  out->set_rejected_pushes(rejected);
}

}  // namespace

v1::Job RenderJob(const JobEntry& job, const Registry& registry,
                  absl::Time now) {
  v1::Job j = job.proto;
  j.set_loss(MetricLossName(job.spec));
  if (!job.condition.empty() && !job.ended()) {
    j.set_message(j.message().empty()
                      ? job.condition
                      : absl::StrCat(job.condition, "; ", j.message()));
  }
  v1::JobMetrics* out = j.mutable_metrics();
  // Present, zeros included, before the job starts too.
  out->set_total_steps(job.schedule.total_steps);
  if (job.ended()) return j;  // the figures at its end
  // Who is on the job now is rendered afresh, never taken from the record
  // (a restored one carries the previous lifetime's workers).
  out->clear_progress();
  out->clear_waiting_on();
  out->clear_stalled_seconds();
  if (job.ranges.empty() || !job.installed) {
    out->set_samples_per_sec(0.0);
    out->set_workers(0);
    return j;
  }
  const std::vector<v1::RangeStatus> ranges = registry.RangeStatuses(job);
  for (const v1::RangeStatus& r : ranges) {
    // A range not reported yet: the figures it was placed with stand.
    if (r.job_id().empty()) return j;
  }
  RenderRanges(job, registry, ranges, now, out);
  // Workers, not members: with training.ranks one may hold several ranks.
  std::set<std::string> workers;
  for (const MemberSpec& m : job.members) {
    if (m.leave_step == MemberSpec::kNoStep)
      workers.insert(MemberWorker(m.worker_id));
  }
  out->set_workers(static_cast<int32_t>(workers.size()));
  return j;
}

bool NoteProgress(JobEntry& job, const Registry& registry, absl::Time now) {
  if (job.ranges.empty() || !job.installed) return false;
  const int64_t v = registry.Version(job);
  if (v == job.notified_version) {
    // Watchers hear which workers a stalled step waits on.
    if (now - job.moved_at <= absl::Seconds(kStallReport) ||
        now - job.stall_noted < absl::Seconds(1))
      return false;
    job.stall_noted = now;
    return true;
  }
  job.moved_at = now;
  job.notified_version = v;
  // Render only when a point is due: this runs every tick.
  if (now - job.last_point >= job.point_every)
    job.AddCurvePoint(now, RenderJob(job, registry, now).metrics());
  return true;
}

}  // namespace tally
