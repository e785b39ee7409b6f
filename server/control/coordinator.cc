#include "server/control/coordinator.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/safetensors.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "proto/schedule.h"
#include "server/control/partition.h"
#include "server/control/remote_shard_control.h"

namespace tally {

namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

// "job-12" -> 12 (0 for anything else).
int64_t JobNumber(const std::string& id) {
  absl::string_view rest = id;
  int64_t n = 0;
  if (!absl::ConsumePrefix(&rest, "job-") || !absl::SimpleAtoi(rest, &n))
    return 0;
  return n;
}

// A tag for this coordinator's lifetime, put into every worker and shard
// id it hands out, so that no id repeats across restarts (with or without
// a state_dir): six base-36 characters from the kernel's random source.
std::string LifetimeTag() {
  uint64_t bits = 0;
  ssize_t n;
  do {
    n = getrandom(&bits, sizeof(bits), 0);
  } while (n < 0 && errno == EINTR);
  if (n != sizeof(bits)) {
    // No getrandom (an old kernel, a seccomp profile): the start time and
    // the process id, which also differ between two lifetimes.
    bits = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) *
               0x9e3779b97f4a7c15u ^
           static_cast<uint64_t>(getpid());
  }
  constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string tag;
  for (int i = 0; i < 6; ++i, bits /= 36) tag.push_back(kDigits[bits % 36]);
  return tag;
}

// Appends to a job's events, keeping the last 200.
void AddEvent(v1::JobHistory& history, absl::Time now, std::string text) {
  constexpr int kMaxEvents = 200;
  auto* events = history.mutable_events();
  if (events->size() >= kMaxEvents) events->DeleteSubrange(0, 1);
  v1::JobEvent* e = events->Add();
  e->set_unix_time(UnixSeconds(now));
  e->set_text(std::move(text));
}

constexpr char kLocalShard[] = "shard-0";
// How long a membership change may hold a job's ranges.
constexpr absl::Duration kHoldFor = absl::Seconds(2);
// How long a checkpoint or a fetch waits for every range to reach one
// version.
constexpr absl::Duration kSaveWait = absl::Seconds(10);

// Every range of a job at one version. All ranges are asked at once to
// stop at version `version` (the highest one seen) and hand their state
// over there; a range that was past it already (the coordinator's view of
// a shard process lags by a heartbeat) says where it is, and all are asked
// again a little further on. No range can get more than a
// step ahead of another, so they all get there.
struct RangeRef {
  std::shared_ptr<ShardControl> control;
  int64_t offset = 0;
  int64_t count = 0;
};

// One StoredJob from every range's state at one version.
absl::StatusOr<StoredJob> GatherRanges(
    const std::vector<RangeRef>& ranges,
    const std::vector<absl::StatusOr<ShardState>>& states, int64_t num_params,
    bool weights_only) {
  StoredJob out;
  auto weights = std::make_shared<std::vector<float>>(num_params);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const RangeRef& r = ranges[i];
    const ShardState& st = *states[i];
    if (static_cast<int64_t>(st.weights->size()) != r.count) {
      return absl::DataLossError("a range came back with another size");
    }
    std::copy(st.weights->begin(), st.weights->end(),
              weights->begin() + r.offset);
    if (r.offset == 0 && st.buffers != nullptr) out.buffers = *st.buffers;
    if (i == 0) {
      out.SetRecord(st);
      out.rejected_pushes = 0;  // summed over the ranges below
      out.optimizer_slots.assign(weights_only ? 0 : st.optimizer.slots.size(),
                                 std::vector<float>(num_params));
    }
    out.rejected_pushes += st.metrics.rejected_pushes;
    if (weights_only) continue;
    out.table_files.insert(out.table_files.end(), st.table_files.begin(),
                           st.table_files.end());
    if (st.optimizer.slots.size() != out.optimizer_slots.size()) {
      return absl::DataLossError("ranges with different optimizers");
    }
    for (const auto& slot : st.optimizer.slots) {
      if (static_cast<int64_t>(slot.size()) != r.count) {
        return absl::DataLossError(
            "a range's optimizer state came back with another size");
      }
    }
    for (size_t k = 0; k < st.optimizer.slots.size(); ++k) {
      std::copy(st.optimizer.slots[k].begin(), st.optimizer.slots[k].end(),
                out.optimizer_slots[k].begin() + r.offset);
    }
  }
  out.has_state = true;
  out.weights = std::move(weights);
  return out;
}

absl::StatusOr<StoredJob> SaveRanges(const std::string& job_id,
                                     int64_t map_version,
                                     const std::vector<RangeRef>& ranges,
                                     int64_t version, int64_t last_version,
                                     int64_t num_params, bool weights_only) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    version = std::min(version, last_version);
    std::vector<absl::StatusOr<ShardState>> states(
        ranges.size(), absl::UnknownError("not saved"));
    {
      std::vector<std::thread> threads;
      for (size_t i = 0; i < ranges.size(); ++i) {
        threads.emplace_back([&, i] {
          states[i] =
              ranges[i].control->Save(job_id, map_version, version,
                                      ranges[i].count, kSaveWait, weights_only);
        });
      }
      for (std::thread& t : threads) t.join();
    }
    int64_t past = -1;
    absl::Status failed;
    for (const auto& st : states) {
      if (st.ok()) continue;
      if (ReasonOf(st.status()) == v1::STEP_CLOSED) {
        past = std::max(past, ReasonStep(st.status()));
      } else if (failed.ok()) {
        failed = st.status();
      }
    }
    if (!failed.ok()) return failed;
    if (past >= 0) {
      version = past + 2;  // ahead of where the fastest range was
      continue;
    }
    return GatherRanges(ranges, states, num_params, weights_only);
  }
  return absl::AbortedError(
      "the job's ranges kept moving past the version to save");
}

// What an ended job's ranges hold: its weights (null when a range cannot
// be read) and a Python model's buffer region, which the range at offset
// 0 keeps (empty when no step has set it).
struct RetiredState {
  std::shared_ptr<const std::vector<float>> weights;
  std::string buffers;
};

// Retired ranges do not move: each is saved as it stands.
RetiredState RetiredWeights(const std::string& job_id, int64_t map_version,
                            int64_t hold_id, int64_t num_params,
                            const std::vector<RangeRef>& refs) {
  auto weights = std::make_shared<std::vector<float>>(num_params);
  std::string buffers;
  for (const RangeRef& r : refs) {
    absl::StatusOr<HoldReport> h =
        r.control->Hold(job_id, map_version, hold_id, absl::Milliseconds(1));
    absl::StatusOr<ShardState> st =
        h.ok() ? r.control->Save(job_id, map_version, h->version, r.count,
                                 absl::Seconds(1),
                                 /*weights_only=*/true)
               : absl::StatusOr<ShardState>(h.status());
    if (!st.ok() || static_cast<int64_t>(st->weights->size()) != r.count)
      return {};
    std::copy(st->weights->begin(), st->weights->end(),
              weights->begin() + r.offset);
    if (r.offset == 0 && st->buffers != nullptr) buffers = *st->buffers;
  }
  return {std::move(weights), std::move(buffers)};
}

}  // namespace

// One job's pending control-plane work, taken from the job under mu_ and
// done without it.
struct Coordinator::ControlTask {
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
  struct Range {
    std::string shard_id;
    int64_t offset = 0, count = 0;
    std::shared_ptr<ShardControl> control;
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
  // Decided: (leave step, last commit refused).
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, bool>> leaves;
  int64_t hold_id = 0;
  int64_t generation = 0;
  // Results.
  bool progressed = false;  // something was done; run again
  bool failed = false;      // a shard refused or was away: retry at Tick
  bool installed_now = false;
  bool members_now = false;
  std::vector<MemberSpec> new_members;
  // Workers joined the job: its new schedule, set with the members; the
  // highest plan number sent to any range; workers that cannot join (no
  // epoch left).
  std::optional<Schedule> new_schedule;
  int64_t plan_sent = 0;
  std::vector<std::string> not_joined;
  std::map<std::pair<std::string, int64_t>, std::pair<int64_t, bool>>
      new_leaves;
  bool retired_now = false;
  std::shared_ptr<const std::vector<float>> final_weights;
  std::string final_buffers;  // the buffer region that goes with them
  std::vector<std::shared_ptr<ShardControl>> table_homes;
  std::vector<std::string> table_home_ids;  // their shards, slot order
};

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options),
      lifetime_(LifetimeTag()),
      offers_(options.max_offer_bytes),
      leases_(
          options.lease_timeout,
          (options.clock != nullptr ? options.clock : &real_clock_)->Now()) {
  if (options_.clock == nullptr) options_.clock = &real_clock_;
  if (options_.connect_shard == nullptr) {
    options_.connect_shard =
        [transport = options_.transport](const std::string& address) {
          return MakeRemoteShardControl(address, transport);
        };
  }
  absl::MutexLock lock(&mu_);
  if (options_.local_shard != nullptr) {
    ShardEntry& s = shards_[kLocalShard];
    s.control = options_.local_shard;
    s.address = options_.local_shard_address;
    s.incarnation = leases_.Grant(kLocalShard, Now(), /*forever=*/true);
    s.last_seen = Now();
  }
}

Coordinator::~Coordinator() = default;

// ------------------------------------------------------------------ jobs --

absl::StatusOr<v1::Job> Coordinator::Submit(const std::string& spec_text,
                                            const std::string& owner) {
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(AdmitLocked(owner));
  }
  TALLY_ASSIGN_OR_RETURN(JobSpec spec,
                         ParseJobSpec(spec_text, options_.spec_limits));
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(AdmitLocked(owner));  // again: others submitted
    const std::string id = absl::StrCat("job-", next_job_++);
    JobEntry& job = jobs_[id];
    job.spec = std::move(spec);
    job.schedule = MakeSchedule(job.spec, TrainSize(job.spec.dataset),
                                static_cast<int>(job.spec.training.workers));
    job.proto.set_id(id);
    job.proto.set_name(job.spec.name);
    job.proto.set_state(v1::PENDING);
    job.proto.set_spec(spec_text);
    job.proto.set_num_params(job.spec.layout.num_params);
    job.proto.set_workers_wanted(
        static_cast<int32_t>(job.spec.training.workers));
    job.proto.set_created_unix(UnixSeconds(Now()));
    job.proto.set_owner(owner);
    EventLocked(job, owner.empty() ? "submitted"
                                   : absl::StrCat("submitted by ", owner));
    job.slots.assign(job.spec.training.workers, "");
    RecordPlan(job);
    job_order_.push_back(id);
    ScheduleLocked(&notes);
    out = Render(jobs_[id]);
  }
  Settle(notes);
  return out;
}

std::vector<v1::RangeStatus> Coordinator::RangeStatusLocked(
    const JobEntry& job) const {
  std::vector<v1::RangeStatus> out(job.ranges.size());
  for (size_t i = 0; i < job.ranges.size(); ++i) {
    auto it = shards_.find(job.ranges[i].shard_id);
    if (it == shards_.end()) continue;
    std::vector<v1::RangeStatus> all;
    if (it->second.control->local()) {
      auto st = it->second.control->Status();
      if (st.ok()) all = *std::move(st);
    } else {
      all = it->second.ranges;
    }
    for (v1::RangeStatus& r : all) {
      if (r.job_id() == job.proto.id() && r.map_version() == job.map_version)
        out[i] = std::move(r);
    }
  }
  return out;
}

int64_t Coordinator::VersionLocked(const JobEntry& job) const {
  if (job.ranges.empty() || !job.installed) return job.proto.metrics().step();
  int64_t v = INT64_MAX;
  for (const v1::RangeStatus& r : RangeStatusLocked(job)) {
    // A range not reported yet (a shard process's next heartbeat tells):
    // the job is where it was placed from.
    if (r.job_id().empty()) return job.proto.metrics().step();
    v = std::min(v, r.version());
  }
  return v;
}

namespace {

// Each table's figures, summed over the ranges that hold its rows.
void SumTables(const std::vector<v1::RangeStatus>& ranges, v1::JobMetrics* out) {
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

}  // namespace

v1::Job Coordinator::Render(const JobEntry& job) const {
  v1::Job j = job.proto;
  j.set_loss(MetricLossName(job.spec));
  if (!job.condition.empty() && !Terminal(job.proto.state())) {
    j.set_message(j.message().empty()
                      ? job.condition
                      : absl::StrCat(job.condition, "; ", j.message()));
  }
  v1::JobMetrics* out = j.mutable_metrics();
  // Present, zeros included, before the job starts too.
  out->set_total_steps(job.schedule.total_steps);
  if (Terminal(job.proto.state())) return j;  // the figures at its end
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
  const std::vector<v1::RangeStatus> ranges = RangeStatusLocked(job);
  for (const v1::RangeStatus& r : ranges) {
    // A range not reported yet: the figures it was placed with stand.
    if (r.job_id().empty()) return j;
  }
  // The job is at the version every range has reached; the other figures
  // are those of every range at that version (every push reaches each).
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
  out->set_epoch(job.schedule.EpochOfVersion(std::max<int64_t>(0, version - 1)));
  out->set_stale_pushes(stale);
  out->set_late_pushes(late);
  out->set_sum_resets(resets);
  SumTables(ranges, out);
  RenderProgressLocked(job, version, ranges, out);
  out->set_loss(shown.loss());
  out->set_accuracy(shown.accuracy());
  out->set_samples_per_sec(shown.samples_per_sec());
  out->set_samples(shown.samples());
  out->set_train_seconds(shown.train_seconds());
  out->set_mean_samples_per_sec(shown.train_seconds() > 0
                                    ? shown.samples() / shown.train_seconds()
                                    : 0.0);
  out->set_rejected_pushes(rejected);
  int workers = 0;
  for (const MemberSpec& m : job.members) {
    if (m.leave_step == MemberSpec::kNoStep) ++workers;
  }
  out->set_workers(workers);
  return j;
}

void Coordinator::RenderProgressLocked(
    const JobEntry& job, int64_t version,
    const std::vector<v1::RangeStatus>& ranges, v1::JobMetrics* out) const {
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
  for (const std::string& id : job.slots) {
    auto it = workers_.find(id);
    if (id.empty() || it == workers_.end() ||
        it->second.job_id != job.proto.id())
      continue;
    const WorkerEntry& w = it->second;
    v1::WorkerProgress* p = out->add_progress();
    p->set_worker_id(id);
    p->set_name(w.name);
    p->set_rank(w.rank);
    // -1 until a pull of it was served: a joining worker is nobody's
    // straggler yet.
    auto c = clocks.find(id);
    p->set_clock(c != clocks.end() ? c->second.first : -1);
    p->set_waiting(c != clocks.end() && c->second.second);
    p->set_compute_seconds(w.compute_seconds);
    p->set_wait_seconds(w.wait_seconds);
    p->set_loader_seconds(w.loader_seconds);
    p->set_push_seconds(w.push_seconds);
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
  RenderStallLocked(job, version, out);
}

// How long the weights have not moved, and (after kStallReport seconds)
// whom the open step waits on.
void Coordinator::RenderStallLocked(const JobEntry& job, int64_t version,
                                    v1::JobMetrics* out) const {
  // At the last version no step is open: the workers evaluate the final
  // weights, and the weights are not meant to move again.
  if (job.moved_at == absl::InfinitePast() ||
      (job.schedule.total_steps > 0 && version >= job.schedule.total_steps))
    return;
  const double stalled = absl::ToDoubleSeconds(Now() - job.moved_at);
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
  for (const v1::WorkerProgress& p : out->progress()) {
    if (p.clock() <= version && !p.waiting() && required(p.worker_id())) {
      out->add_waiting_on(absl::StrCat(
          p.worker_id(),
          p.name().empty() ? "" : absl::StrCat(" (", p.name(), ")"),
          p.clock() < 0 ? ": has not pulled yet" : ""));
    }
  }
}

absl::StatusOr<v1::Job> Coordinator::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
  }
  return Render(it->second);
}

std::vector<v1::Job> Coordinator::List(bool with_specs) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const std::string& id : job_order_) {
    out.push_back(Render(jobs_.at(id)));
    if (!with_specs) out.back().clear_spec();
  }
  return out;
}

void Coordinator::EventLocked(JobEntry& job, std::string text) {
  AddEvent(job.history, Now(), std::move(text));
}

void Coordinator::CurvePointLocked(JobEntry& job, const v1::JobMetrics& m) {
  constexpr int kMaxPoints = 1000;
  const absl::Time now = Now();
  auto* curve = job.history.mutable_curve();
  if (m.step() == 0) return;  // no step closed: no loss to show
  if (!curve->empty() && curve->rbegin()->step() == m.step()) return;
  if (curve->size() >= kMaxPoints) {
    // Keep the whole run at half the resolution.
    int kept = 0;
    for (int i = 0; i < curve->size(); i += 2) curve->SwapElements(kept++, i);
    curve->DeleteSubrange(kept, curve->size() - kept);
    job.point_every *= 2;
  }
  v1::CurvePoint* p = curve->Add();
  p->set_step(m.step());
  p->set_unix_time(UnixSeconds(now));
  p->set_loss(m.loss());
  p->set_accuracy(m.accuracy());
  p->set_samples_per_sec(m.samples_per_sec());
  job.last_point = now;
}

absl::StatusOr<v1::JobHistory> Coordinator::History(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
  }
  return it->second.history;
}

absl::StatusOr<std::vector<v1::JobWorker>> Coordinator::JobWorkers(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
  }
  std::vector<v1::JobWorker> out;
  const std::vector<std::string>& slots = it->second.slots;
  for (size_t r = 0; r < slots.size(); ++r) {
    auto w = workers_.find(slots[r]);
    if (slots[r].empty() || w == workers_.end()) continue;
    v1::JobWorker jw;
    jw.set_worker_id(slots[r]);
    jw.set_name(w->second.name);
    jw.set_devices(w->second.devices);
    jw.set_rank(static_cast<int32_t>(r));
    out.push_back(std::move(jw));
  }
  return out;
}

int64_t Coordinator::QueuedLocked(const std::string* owner) const {
  int64_t n = 0;
  for (const auto& [id, job] : jobs_) {
    n += job.proto.state() == v1::PENDING &&
         (owner == nullptr || job.proto.owner() == *owner);
  }
  return n;
}

absl::Status Coordinator::AdmitLocked(const std::string& owner) const {
  if (QueuedLocked() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.max_queued_jobs,
                     " jobs already wait for workers "
                     "(--max_queued_jobs); cancel some or try later"));
  }
  // Without tokens every caller is the same nobody: only named submitters
  // have shares.
  if (!owner.empty() &&
      QueuedLocked(&owner) >= options_.max_queued_jobs_per_submitter) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Quoted(owner), " has ", options_.max_queued_jobs_per_submitter,
        " jobs waiting for workers already "
        "(--max_queued_jobs_per_submitter); cancel some or try later"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobPage> Coordinator::ListPage(const JobQuery& query) const {
  int64_t after = 0;
  if (!query.page_token.empty() &&
      (!absl::SimpleAtoi(query.page_token, &after) || after <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token ", Quoted(query.page_token),
                     " is not one this server gave"));
  }
  const int page_size = query.page_size > 0 ? query.page_size : 100;
  JobPage page;
  absl::MutexLock lock(&mu_);
  // job_order_ is sorted by job number.
  auto it = std::upper_bound(
      job_order_.begin(), job_order_.end(), after,
      [](int64_t n, const std::string& id) { return n < JobNumber(id); });
  for (; it != job_order_.end(); ++it) {
    const JobEntry& job = jobs_.at(*it);
    if (!query.owner.empty() && job.proto.owner() != query.owner) continue;
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = absl::StrCat(JobNumber(page.jobs.back().id()));
      break;
    }
    page.jobs.push_back(Render(job));
    if (query.omit_spec) page.jobs.back().clear_spec();
  }
  return page;
}

// An ended job dropped from memory; its weights, when kept, are encoded
// after the lock: the final vector and its layout.
namespace {

// Why a Python model's file has none of its buffers ("" when it has them
// or the model has none), for the file's metadata and the client: a file
// without them is refused by load_state_dict(strict=True), so it is never
// written silently.
std::string BuffersNote(const PythonModelSpec& py, const std::string& buffers) {
  if (py.buffers.empty() ||
      static_cast<int64_t>(buffers.size()) == py.buffer_bytes)
    return "";
  return absl::StrCat(
      "missing: no step of the job had closed with them (", py.buffers.size(),
      " buffers, ", py.buffers.front().name,
      " first); load the file with load_state_dict(..., strict=False)");
}

// A job's weights as a .safetensors file: the parameters, a Python model's
// buffers (the buffer region; BuffersNote in the metadata when there is
// none) and tied weights' aliases.
std::string ExportFile(const std::vector<ParamInfo>& params,
                       const std::vector<float>& weights,
                       const PythonModelSpec& py, const std::string& buffers,
                       const std::string& job_id, const std::string& name,
                       int64_t version, const TableExport* tables = nullptr,
                       const std::string& tables_note = "") {
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"job", job_id},
      {"name", name},
      {"version", absl::StrCat(version)}};
  if (!tables_note.empty()) metadata["tables"] = tables_note;
  if (const std::string note = BuffersNote(py, buffers); !note.empty())
    metadata["buffers"] = note;
  if (!py.aliases.empty())
    metadata["aliases"] = nlohmann::json(py.aliases).dump();
  std::vector<RawTensor> extra;
  if (static_cast<int64_t>(buffers.size()) == py.buffer_bytes) {
    int64_t at = 0;
    for (const BufferInfo& b : py.buffers) {
      extra.push_back({b.name, b.dtype, b.shape, buffers.substr(at, b.bytes)});
      at += b.bytes;
    }
  }
  return EncodeSafetensors(params, weights.data(), metadata, extra,
                           tables != nullptr ? tables->Tensors()
                                             : std::vector<LaterTensor>{});
}

}  // namespace

struct Coordinator::DroppedJob {
  std::string id;
  std::shared_ptr<const std::vector<float>> weights;
  std::vector<ParamInfo> params;
  PythonModelSpec python;
  std::string buffers;
  std::string name;
  int64_t step = 0;
};

int Coordinator::DropOldJobs() {
  // Not while a checkpoint is being written (it could write a dropped job
  // back); the next call drops it.
  if (!checkpoint_mu_.TryLock()) return 0;
  struct Unlock {
    absl::Mutex* mu;
    ~Unlock() { mu->Unlock(); }
  } unlock{&checkpoint_mu_};
  std::vector<DroppedJob> dropped;
  int64_t next_job = 0;
  {
    absl::MutexLock lock(&mu_);
    next_job = next_job_;
    dropped = TakeDroppableLocked();
  }
  // Job numbers are never given twice, even once every file is gone.
  if (store_ != nullptr && !dropped.empty()) {
    if (absl::Status s = store_->SaveNextJob(next_job); !s.ok()) {
      std::fprintf(stderr, "tally-server: %s\n",
                   std::string(s.message()).c_str());
    }
  }
  for (const DroppedJob& d : dropped) ForgetDropped(d);
  return static_cast<int>(dropped.size());
}

std::vector<Coordinator::DroppedJob> Coordinator::TakeDroppableLocked() {
  const absl::Time now = Now();
  std::set<std::string> busy;  // jobs a worker is still leaving
  for (const auto& [wid, w] : workers_) busy.insert(w.job_id);
  std::vector<std::string> ended;  // oldest first (by job number)
  for (const std::string& id : job_order_) {
    const JobEntry& job = jobs_.at(id);
    // Only once the ranges are gone and the end is on disk.
    if (Terminal(job.proto.state()) && (job.retired || job.ranges.empty()) &&
        (options_.state_dir.empty() || job.saved_state == job.proto.state()) &&
        !busy.count(id)) {
      ended.push_back(id);
    }
  }
  const int64_t excess =
      static_cast<int64_t>(ended.size()) - options_.max_finished_jobs;
  std::vector<DroppedJob> dropped;
  for (size_t i = 0; i < ended.size(); ++i) {
    const JobEntry& job = jobs_.at(ended[i]);
    const bool too_many = static_cast<int64_t>(i) < excess;
    const bool too_old = options_.finished_job_ttl > absl::ZeroDuration() &&
                         now - absl::FromUnixSeconds(static_cast<int64_t>(
                                   job.proto.finished_unix())) >
                             options_.finished_job_ttl;
    if (!too_many && !too_old) continue;
    DroppedJob d;
    d.id = ended[i];
    if (!options_.keep_weights_dir.empty() && job.final_weights != nullptr) {
      d.weights = job.final_weights;
      d.params = job.spec.layout.params;
      d.python = job.spec.python;
      d.buffers = job.final_buffers;
      d.name = job.spec.name;
      d.step = job.proto.metrics().step();
    }
    dropped.push_back(std::move(d));
  }
  for (const DroppedJob& d : dropped) {
    jobs_.erase(d.id);
    job_order_.erase(std::find(job_order_.begin(), job_order_.end(), d.id));
  }
  return dropped;
}

// A dropped job's weights go to keep_weights_dir (when asked), then its
// file goes.
void Coordinator::ForgetDropped(const DroppedJob& d) {
  if (d.weights != nullptr) {
    const std::string path =
        absl::StrCat(options_.keep_weights_dir, "/", d.id, ".safetensors");
    absl::Status s = WriteFileAtomic(
        path, ExportFile(d.params, *d.weights, d.python, d.buffers, d.id,
                         d.name, d.step));
    if (!s.ok()) {
      // The checkpoint stays: the weights are not lost (the job comes back
      // at the next restart, and is dropped again then).
      std::fprintf(stderr, "tally-server: keeping %s's weights: %s\n",
                   d.id.c_str(), std::string(s.message()).c_str());
      return;
    }
  }
  if (store_ != nullptr) {
    if (absl::Status s = store_->Remove(d.id); !s.ok()) {
      std::fprintf(stderr, "tally-server: dropping %s: %s\n", d.id.c_str(),
                   std::string(s.message()).c_str());
    }
  }
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id) {
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
    }
    if (Terminal(it->second.proto.state())) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            job_id, " already ended (",
                            v1::JobState_Name(it->second.proto.state()), ")")),
                        v1::JOB_ENDED);
    }
    FinishLocked(it->second, v1::CANCELLED, "cancelled by a client", &notes);
    ScheduleLocked(&notes);
    out = Render(it->second);
  }
  Settle(notes);
  return out;
}


absl::StatusOr<std::string> Coordinator::WeightsFile(
    const std::string& job_id) {
  TALLY_ASSIGN_OR_RETURN(WeightsExport file, ExportWeights(job_id));
  if (file.tables == nullptr) return std::move(file.head);
  while (true) {
    TALLY_ASSIGN_OR_RETURN(std::string piece, file.tables->Next());
    if (piece.empty()) return std::move(file.head);
    file.head += piece;
  }
}

namespace {

// Where an ended job's tables are (its table homes), or why the file
// has none.
std::unique_ptr<TableExport> TablesOf(
    const std::string& job_id, const JobSpec& spec, bool ended, bool retired,
    int64_t map_version,
    const std::vector<std::shared_ptr<ShardControl>>& homes,
    const std::string& away, std::string* note) {
  if (spec.embeddings.empty()) return nullptr;
  if (!retired) {
    *note = ended ? "not included yet: the shards are still closing the "
                    "job; fetch again in a moment"
                  : "not included: the job is running (they are once it "
                    "has ended)";
    return nullptr;
  }
  if (homes.empty()) {
    *note = away.empty()
                ? "lost: a shard of the job was away when it ended"
                : absl::StrCat("not reachable: ", away,
                               " kept them and has not registered since the "
                               "coordinator restarted");
    return nullptr;
  }
  return std::make_unique<TableExport>(job_id, map_version, spec.embeddings,
                                       spec.training.seed, homes);
}

}  // namespace

// After a restart the homes are the live shards at the addresses the job
// kept, and the tables are read by job alone (map_version 0: the
// placement's number is not kept).
std::vector<std::shared_ptr<ShardControl>> Coordinator::TableHomesLocked(
    const JobEntry& job, int64_t* map_version, std::string* away) const {
  if (!job.table_homes.empty() || job.table_home_addresses.empty())
    return job.table_homes;
  std::vector<std::shared_ptr<ShardControl>> homes;
  for (const std::string& address : job.table_home_addresses) {
    std::shared_ptr<ShardControl> found;
    for (const auto& [id, s] : shards_) {
      if (!address.empty() && s.address == address && s.live) found = s.control;
    }
    if (found == nullptr) {
      *away = address.empty() ? "the coordinator's own shard (restarted)"
                              : absl::StrCat("shard ", address);
      return {};
    }
    homes.push_back(std::move(found));
  }
  *map_version = 0;
  return homes;
}

std::unique_ptr<TableExport> Coordinator::TablesLocked(
    const std::string& job_id, const JobEntry& job, std::string* note) const {
  int64_t map_version = job.map_version;
  std::string away;
  const std::vector<std::shared_ptr<ShardControl>> homes =
      TableHomesLocked(job, &map_version, &away);
  return TablesOf(job_id, job.spec, Terminal(job.proto.state()), job.retired,
                  map_version, homes, away, note);
}

// An ended job with tables: its ranges retire in a moment (the control
// round after the end), and its file then has the tables.
void Coordinator::AwaitRetiredLocked(const std::string& job_id) {
  const auto retired = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto j = jobs_.find(job_id);
    return j == jobs_.end() || !Terminal(j->second.proto.state()) ||
           j->second.spec.embeddings.empty() || j->second.retired;
  };
  mu_.AwaitWithTimeout(absl::Condition(&retired), absl::Seconds(10));
}

absl::StatusOr<Coordinator::WeightsExport> Coordinator::ExportWeights(
    const std::string& job_id) {
  WeightsExport out;
  std::string tables_note;
  PythonModelSpec py;
  std::string buffers;
  ModelLayout layout;
  std::string name;
  std::shared_ptr<const std::vector<float>> weights;
  int64_t version = 0, total_steps = 0, map_version = 0;
  std::vector<RangeRef> ranges;
  {
    absl::MutexLock lock(&mu_);
    AwaitRetiredLocked(job_id);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
    }
    const JobEntry& job = it->second;
    layout = job.spec.layout;
    name = job.spec.name;
    py = job.spec.python;
    buffers = job.final_buffers;
    total_steps = job.schedule.total_steps;
    map_version = job.map_version;
    out.tables = TablesLocked(job_id, job, &tables_note);
    if (job.final_weights != nullptr) {
      weights = job.final_weights;
      version = job.proto.metrics().step();
    } else if (!job.ranges.empty() && job.installed) {
      for (const v1::RangeStatus& r : RangeStatusLocked(job))
        version = std::max(version, r.version());
      for (const Placement& p : job.ranges)
        ranges.push_back({shards_.at(p.shard_id).control, p.offset, p.count});
    } else if (job.start != nullptr) {
      weights = job.start->weights;
      version = job.start->version;
      buffers = job.start->buffers;
    } else {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            job_id, " has not started: it has no weights yet")),
                        v1::JOB_NOT_STARTED);
    }
  }
  if (weights == nullptr) {
    TALLY_ASSIGN_OR_RETURN(StoredJob saved,
                           SaveRanges(job_id, map_version, ranges, version,
                                      total_steps, layout.num_params,
                                      /*weights_only=*/true));
    weights = saved.weights;
    version = saved.version;
    buffers = saved.buffers;  // the buffer region, as the first range has it
  }
  if (out.tables != nullptr) TALLY_RETURN_IF_ERROR(out.tables->Prepare());
  out.buffers_note = BuffersNote(py, buffers);
  out.head = ExportFile(layout.params, *weights, py, buffers, job_id, name,
                        version, out.tables.get(), tables_note);
  return out;
}

// --------------------------------------------------------------- workers --

namespace {

// A worker that cannot follow what this coordinator sends is turned away at
// the door (proto/tally.proto, WorkerProtocol): given a job, it would fail
// that job at its first pull, and every other worker's with it.
absl::Status CheckProtocol(uint32_t version) {
  const auto oldest = static_cast<uint32_t>(v1::WORKER_PROTOCOL_OLDEST);
  if (version >= oldest) return absl::OkStatus();
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "this worker speaks worker protocol ", version,
          version == 0 ? " (it sends no protocol_version: a release before "
                         "versions)"
                       : "",
          " and this coordinator takes ", oldest,
          " or later: such a worker may not follow shard-map addresses "
          "relative to the coordinator's host (':PORT'), the plans of "
          "growing jobs (PLAN_CHANGED) or sparse-table rows, and would fail "
          "the jobs it were given; upgrade it")),
      v1::PROTOCOL_TOO_OLD);
}

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::Register(
    const v1::RegisterWorkerRequest& req) {
  TALLY_RETURN_IF_ERROR(CheckProtocol(req.protocol_version()));
  constexpr size_t kMaxField = 256;
  if (req.name().size() > kMaxField || req.devices().size() > kMaxField ||
      req.address().size() > kMaxField || req.python().size() > kMaxField) {
    return absl::InvalidArgumentError(
        absl::StrCat("a worker's name, devices, address and python are at "
                     "most ",
                     kMaxField, " bytes each"));
  }
  Notes notes;
  v1::RegisterWorkerResponse out;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(workers_.size()) >= options_.max_workers) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.max_workers,
                       " workers are registered already "
                       "(--max_workers)"));
    }
    const std::string id =
        absl::StrCat("worker-", lifetime_, "-", next_worker_++);
    WorkerEntry& w = workers_[id];
    w.name = req.name();
    w.devices = req.devices();
    w.address = req.address();
    w.python = req.python();
    w.incarnation = leases_.Grant(id, Now());
    out.set_worker_id(id);
    out.set_incarnation(w.incarnation);
    out.set_lease_ms(absl::ToInt64Milliseconds(options_.lease_timeout));
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(
    const v1::HeartbeatRequest& req) {
  Notes notes;
  v1::HeartbeatResponse out;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(req.worker_id());
    if (absl::Status s =
            it == workers_.end()
                ? leases_.Check(req.worker_id(), req.incarnation())
                : leases_.Renew(req.worker_id(), req.incarnation(), Now());
        !s.ok() || it == workers_.end()) {
      return !s.ok() ? s : absl::InternalError("a lease without a worker");
    }
    WorkerEntry& w = it->second;
    if (!req.job_id().empty() && req.job_id() == w.job_id) {
      w.compute_seconds = req.compute_seconds();
      w.wait_seconds = req.wait_seconds();
      w.push_seconds = req.push_seconds();
      w.loader_seconds = req.loader_seconds();
    }
    ScheduleLocked(&notes);
    if (!w.job_id.empty()) {
      JobEntry& job = jobs_.at(w.job_id);
      if (AskForWeightsLocked(job, req.worker_id())) {
        v1::InitialWeightsWanted* want = out.mutable_initial_weights();
        want->set_job_id(w.job_id);
        want->set_spec(job.proto.spec());
      }
      AssignmentLocked(req, w, job, &out);
    }
  }
  Settle(notes);
  return out;
}

// The assignment goes out once the worker is a member on every range; one
// it holds already (req.held) stands without being sent again: no spec
// again (a Python model's code can be megabytes, and every worker
// heartbeats about once a second).
void Coordinator::AssignmentLocked(const v1::HeartbeatRequest& req,
                                   const WorkerEntry& w, const JobEntry& job,
                                   v1::HeartbeatResponse* out) const {
  if (!job.installed) return;
  const MemberSpec* member = nullptr;
  for (const MemberSpec& m : job.members) {
    if (m.worker_id == req.worker_id() && m.incarnation == w.incarnation &&
        m.leave_step == MemberSpec::kNoStep) {
      member = &m;
    }
  }
  if (member == nullptr) return;
  const std::string key =
      absl::StrCat(w.job_id, "/", job.map_version, "/", job.schedule.plan, "/",
                   w.rank, "/", member->join_step, "/", w.incarnation);
  if (req.held() == key) {
    out->set_unchanged(true);
    return;
  }
  v1::Assignment* a = out->mutable_assignment();
  a->set_key(key);
  a->set_job_id(w.job_id);
  a->set_spec(job.proto.spec());
  a->set_rank(w.rank);
  a->set_world(job.schedule.last_world());
  a->set_join_step(member->join_step);
  EncodeSchedule(job.schedule, a->mutable_schedule());
  v1::ShardMap* map = a->mutable_shard_map();
  map->set_version(job.map_version);
  for (const Placement& p : job.ranges) {
    v1::ShardMap::Entry* e = map->add_shards();
    e->set_address(shards_.at(p.shard_id).address);
    e->set_offset(p.offset);
    e->set_count(p.count);
  }
}

bool Coordinator::AskForWeightsLocked(JobEntry& job,
                                      const std::string& worker_id) {
  if (!job.spec.is_python || job.start != nullptr ||
      job.proto.state() != v1::RUNNING || LowestRankLocked(job) != worker_id)
    return false;
  if (job.weights_asked_of != worker_id) {  // a new worker: a new clock
    job.weights_asked_of = worker_id;
    job.weights_asked_at = Now();
  }
  return true;
}

void Coordinator::ExpireInitialWeightsLocked(Notes* notes) {
  for (auto& [id, job] : jobs_) {
    if (!job.spec.is_python || job.start != nullptr ||
        job.proto.state() != v1::RUNNING || job.weights_asked_of.empty()) {
      continue;
    }
    // The asked worker left: the clock starts again with the next one.
    if (LowestRankLocked(job) != job.weights_asked_of) {
      job.weights_asked_of.clear();
      continue;
    }
    if (Now() - job.weights_asked_at <= options_.initial_weights_timeout)
      continue;
    FinishLocked(job, v1::FAILED,
                 absl::StrCat("no initial weights from ", job.weights_asked_of,
                              " within ",
                              absl::FormatDuration(
                                  options_.initial_weights_timeout),
                              ": building the module did not end, or its "
                              "offers failed (see that worker's log)"),
                 notes);
  }
}

bool Coordinator::AnyPythonWorkerLocked() const {
  for (const auto& [id, w] : workers_) {
    if (!w.python.empty()) return true;
  }
  return false;
}

std::string Coordinator::LowestRankLocked(const JobEntry& job) const {
  for (const std::string& id : job.slots) {
    if (!id.empty()) return id;
  }
  return "";
}

// The worker must hold its lease and be the one asked for the job's
// initial weights (its lowest rank); the job a Python model's, running,
// without them yet. Returns the values to send.
absl::StatusOr<int64_t> Coordinator::CheckOfferLocked(
    const std::string& job_id, const std::string& worker_id,
    int64_t incarnation) const {
  TALLY_RETURN_IF_ERROR(leases_.Check(worker_id, incarnation));
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
  }
  const JobEntry& job = it->second;
  if (!job.spec.is_python) {
    return absl::InvalidArgumentError(
        absl::StrCat(job_id, " is not a Python model's: its initial weights "
                             "come from its spec"));
  }
  if (Terminal(job.proto.state())) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            job_id, " has ended (",
            v1::JobState_Name(job.proto.state()), "): no initial weights "
            "are wanted")),
        v1::JOB_ENDED);
  }
  // Said, not taken again: a second offer would cost the coordinator a
  // model's memory for nothing.
  if (job.start != nullptr) {
    return WithReason(absl::AlreadyExistsError(absl::StrCat(
                          job_id, " has its initial weights already")),
                      v1::WEIGHTS_GIVEN);
  }
  if (LowestRankLocked(job) != worker_id) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            Quoted(worker_id), " was not asked for ", job_id,
            "'s initial weights (the job's lowest rank gives them)")),
        v1::NOT_A_MEMBER);
  }
  return job.spec.layout.num_params;
}

absl::StatusOr<std::unique_ptr<WeightOffers::Offer>>
Coordinator::BeginInitialWeights(const std::string& job_id,
                                 const std::string& worker_id,
                                 int64_t incarnation,
                                 std::function<void(absl::Status)> end) {
  // Let in under the lock that ends jobs: an offer of a job that ends
  // after this is found by FinishLocked's note, and none is let in after.
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(const int64_t n,
                         CheckOfferLocked(job_id, worker_id, incarnation));
  return offers_.Begin(job_id, worker_id, n, std::move(end));
}

absl::Status Coordinator::SetInitialWeights(const std::string& job_id,
                                            const std::string& worker_id,
                                            int64_t incarnation,
                                            std::vector<float> weights) {
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    // Checked again: the lease or the job may have gone since the offer
    // began.
    TALLY_ASSIGN_OR_RETURN(const int64_t n,
                           CheckOfferLocked(job_id, worker_id, incarnation));
    if (static_cast<int64_t>(weights.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("initial weights of ", weights.size(),
                       " values for a model of ", n));
    }
    JobEntry& job = jobs_.at(job_id);  // found by CheckOfferLocked
    auto start = std::make_shared<StoredJob>();
    start->has_state = true;
    start->weights =
        std::make_shared<const std::vector<float>>(std::move(weights));
    job.start = std::move(start);
    job.weights_asked_of.clear();
    EventLocked(job, absl::StrCat("initial weights built by ", worker_id));
    MarkDirty(job);
    NotifyLocked(job_id, &notes);
  }
  Settle(notes);
  RunControl();
  return absl::OkStatus();
}

absl::Status Coordinator::ReportResult(const v1::ReportResultRequest& req) {
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(req.worker_id());
    if (absl::Status s = leases_.Check(req.worker_id(), req.incarnation());
        !s.ok() || wit == workers_.end()) {
      return !s.ok() ? s : absl::InternalError("a lease without a worker");
    }
    auto jit = jobs_.find(req.job_id());
    if (jit == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job ", Quoted(req.job_id())));
    }
    JobEntry& job = jit->second;
    // Another worker's report may have ended the job already: this one
    // has its final weights now.
    if (Terminal(job.proto.state())) {
      if (job.awaiting_reports.erase(req.worker_id()) > 0) MarkDirty(job);
      return absl::OkStatus();
    }
    if (wit->second.job_id != req.job_id()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            Quoted(req.worker_id()), " is not assigned to ",
                            Quoted(req.job_id()))),
                        v1::NOT_A_MEMBER);
    }
    const std::string who =
        absl::StrCat(req.worker_id(), " (", wit->second.name, ")");
    if (!req.ok() && req.reason() != v1::SCHEDULE_MISMATCH &&
        req.map_version() != 0 && req.map_version() < job.map_version) {
      // A runner of a placement the job has left (a shard was lost, the
      // job rolled back): its step's answers came from shards that are no
      // longer the job's, and its runner on the new map goes on. Noted
      // once a worker and map, the message cut (reports can be repeated).
      const std::string key = absl::StrCat(req.worker_id(), "@", req.map_version());
      if (job.stale_reports.insert(key).second) {
        EventLocked(job, absl::StrCat(who, " stopped on an earlier placement "
                                           "of the job (map version ",
                                      req.map_version(), "): ",
                                      absl::string_view(req.message()).substr(0, 1024)));
      }
      return absl::OkStatus();
    }
    if (!req.ok() && req.reason() == v1::SCHEDULE_MISMATCH) {
      // This worker cannot train the job; others can. The job goes on
      // without it and says why.
      job.barred.insert(req.worker_id());
      const std::string note =
          absl::StrCat(who, " cannot train this job: ", req.message());
      job.proto.set_message(
          job.proto.message().empty()
              ? note
              : absl::StrCat(job.proto.message(), "; ", note));
      VacateLocked(job, req.worker_id(), &notes);
    } else if (!req.ok()) {
      FinishLocked(job, v1::FAILED, absl::StrCat(who, ": ", req.message()),
                   &notes);
    } else {
      TALLY_RETURN_IF_ERROR(SucceedLocked(job, req, &notes));
    }
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return absl::OkStatus();
}

// A member's result on the final weights ends the job: its test figures
// and (a Python model) its buffers are the job's.
absl::Status Coordinator::SucceedLocked(JobEntry& job,
                                        const v1::ReportResultRequest& req,
                                        Notes* notes) {
  if (req.steps() != job.schedule.total_steps) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "a result must evaluate the final weights (version ",
            job.schedule.total_steps, "), not version ", req.steps())),
        v1::NOT_FINISHED, job.schedule.total_steps);
  }
  const int64_t version = VersionLocked(job);
  if (version < job.schedule.total_steps) {
    return WithReason(absl::UnavailableError(absl::StrCat(
                          "the weights are at version ", version, " of ",
                          job.schedule.total_steps, ": not final yet")),
                      v1::NOT_FINISHED, version);
  }
  if (static_cast<int64_t>(req.buffers().size()) !=
      job.spec.python.buffer_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a report's buffers are ", req.buffers().size(), " bytes, the job's ",
        job.spec.python.buffer_bytes));
  }
  job.final_buffers = req.buffers();
  job.proto.mutable_metrics()->set_test_accuracy(req.test_accuracy());
  job.proto.mutable_metrics()->set_test_loss(req.test_loss());
  job.proto.mutable_metrics()->set_test_auc(req.test_auc());
  job.proto.mutable_metrics()->set_no_test_split(req.no_test_split());
  FinishLocked(job, v1::SUCCEEDED, "", notes);
  job.awaiting_reports.erase(req.worker_id());
  return absl::OkStatus();
}

// ---------------------------------------------------------------- shards --

v1::RegisterShardResponse Coordinator::RegisterShard(
    const v1::RegisterShardRequest& req) {
  std::shared_ptr<ShardControl> control = options_.connect_shard(req.address());
  Notes notes;
  v1::RegisterShardResponse out;
  {
    absl::MutexLock lock(&mu_);
    const std::string id =
        absl::StrCat("shard-", lifetime_, "-", next_shard_++);
    ShardEntry& s = shards_[id];
    s.address = req.address();
    s.incarnation = leases_.Grant(id, Now());
    s.last_seen = Now();
    s.control = std::move(control);
    out.set_shard_id(id);
    out.set_incarnation(s.incarnation);
    out.set_lease_ms(absl::ToInt64Milliseconds(options_.lease_timeout));
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return out;
}

absl::StatusOr<v1::ShardHeartbeatResponse> Coordinator::ShardHeartbeat(
    const v1::ShardHeartbeatRequest& req) {
  v1::ShardHeartbeatResponse out;
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    auto it = shards_.find(req.shard_id());
    if (absl::Status st =
            leases_.Renew(req.shard_id(), req.incarnation(), Now());
        !st.ok() || it == shards_.end() || !it->second.live) {
      return !st.ok() ? st
                      : WithReason(absl::FailedPreconditionError(absl::StrCat(
                                       "shard ", Quoted(req.shard_id()),
                                       " was lost: register again")),
                                   v1::REGISTER_AGAIN);
    }
    ShardEntry& s = it->second;
    s.last_seen = Now();
    s.ranges.assign(req.ranges().begin(), req.ranges().end());
    for (const v1::RangeStatus& r : req.ranges()) {
      auto jit = jobs_.find(r.job_id());
      bool placed = false;
      if (jit != jobs_.end() && !jit->second.retired &&
          jit->second.map_version == r.map_version()) {
        for (const Placement& p : jit->second.ranges) {
          if (p.shard_id == req.shard_id()) placed = true;
        }
      }
      if (placed) continue;
      // Only the placement the shard reported: a newer one may be on its
      // way to it.
      v1::ShardHeartbeatResponse::Drop* drop =
          jit != jobs_.end() && Terminal(jit->second.proto.state())
              ? out.add_ended()
              : out.add_drop();
      drop->set_job_id(r.job_id());
      drop->set_map_version(r.map_version());
    }
  }
  Settle(notes);
  return out;
}

CoordinatorStats Coordinator::Stats() const {
  absl::MutexLock lock(&mu_);
  CoordinatorStats s;
  s.workers = static_cast<int64_t>(workers_.size());
  for (const auto& [id, w] : workers_) s.idle_workers += w.job_id.empty();
  for (const auto& [id, sh] : shards_) s.live_shards += sh.live;
  s.lease_expiries = lease_expiries_;
  s.checkpoints_written = checkpoints_written_;
  s.checkpoint_seconds = checkpoint_seconds_;
  const absl::Time now = Now();
  for (const auto& [id, job] : jobs_) {
    if (job.proto.state() == v1::RUNNING &&
        job.saved_at != absl::InfinitePast()) {
      s.checkpoint_age_seconds[id] = absl::ToDoubleSeconds(now - job.saved_at);
    }
  }
  return s;
}

std::vector<v1::ShardInfo> Coordinator::ListShards() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::ShardInfo> out;
  for (const auto& [id, s] : shards_) {
    v1::ShardInfo info;
    info.set_shard_id(id);
    info.set_address(s.address);
    info.set_live(s.live);
    info.set_last_seen_unix(
        UnixSeconds(s.control->local() ? Now() : s.last_seen));
    std::vector<v1::RangeStatus> ranges = s.ranges;
    if (s.control->local()) {
      auto st = s.control->Status();
      if (st.ok()) ranges = *std::move(st);
    }
    int64_t bytes = 0;
    for (const v1::RangeStatus& r : ranges) {
      v1::ShardInfo::Range* out_range = info.add_ranges();
      out_range->set_job_id(r.job_id());
      out_range->set_offset(r.offset());
      out_range->set_count(r.count());
      out_range->set_version(r.version());
      *out_range->mutable_closed() = r.closed();
      bytes += 4 * r.count();
    }
    info.set_bytes(bytes);
    out.push_back(std::move(info));
  }
  return out;
}

// ----------------------------------------------------------- subscribers --

absl::StatusOr<int64_t> Coordinator::Subscribe(
    const std::string& job_id, std::function<void()> on_change) {
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(job_id)) {
    return absl::NotFoundError(absl::StrCat("no job ", Quoted(job_id)));
  }
  const int64_t id = next_subscription_++;
  subscribers_[id] = {job_id, std::move(on_change)};
  return id;
}

void Coordinator::Unsubscribe(int64_t id) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(id);
}

void Coordinator::NotifyLocked(const std::string& job_id, Notes* notes) {
  for (const auto& [id, sub] : subscribers_) {
    if (sub.first == job_id) notes->push_back(sub.second);
  }
}

// ------------------------------------------------------------ scheduling --

void Coordinator::AssignLocked(JobEntry& job, int rank,
                               const std::string& worker_id) {
  WorkerEntry& w = workers_.at(worker_id);
  w.job_id = job.proto.id();
  w.rank = rank;
  w.compute_seconds = w.wait_seconds = w.push_seconds = w.loader_seconds = 0;
  job.slots[rank] = worker_id;
  EventLocked(job,
              absl::StrCat(worker_id, " (", w.name, ") joined as rank ", rank));
  MarkDirty(job);  // a member to add on every range
}

bool Coordinator::PlaceLocked(JobEntry& job) {
  // Live shards, least loaded first.
  std::map<std::string, int64_t> load;
  for (const auto& [id, s] : shards_) {
    if (s.live) load[id] = 0;
  }
  for (const auto& [jid, j] : jobs_) {
    if (Terminal(j.proto.state())) continue;
    for (const Placement& p : j.ranges) {
      if (load.count(p.shard_id)) load[p.shard_id] += p.count;
    }
  }
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [id, bytes] : load) order.emplace_back(bytes, id);
  std::sort(order.begin(), order.end());
  const int64_t n = job.spec.layout.num_params;
  // Backup workers need one shard: shards would each pick the late pushes.
  const int wanted = job.spec.training.consistency.backup_workers > 0
                         ? 1
                         : static_cast<int>(job.spec.training.shards);
  // Tables spread over shards too: their values count with the vector's
  // when the spec leaves the number of shards to us (saturating).
  int64_t values = n;
  for (const EmbeddingTableSpec& t : job.spec.embeddings) {
    const int64_t table =
        t.num_embeddings > INT64_MAX / t.dim ? INT64_MAX : t.num_embeddings * t.dim;
    values = table > INT64_MAX - values ? INT64_MAX : values + table;
  }
  int k = ShardCount(values, wanted, static_cast<int>(order.size()));
  k = std::min<int64_t>(k, n);  // every shard holds some of the vector
  if (k == 0) return false;
  job.ranges.clear();
  const auto parts = PartitionRanges(n, k);
  for (int i = 0; i < k; ++i) {
    job.ranges.push_back({order[i].second, parts[i].first, parts[i].second});
  }
  // Map versions never repeat, across coordinator restarts too (a shard
  // process may still hold an older placement of the job).
  job.map_version = std::max(job.map_version + 1, absl::ToUnixMicros(Now()));
  job.installed = false;
  job.members.clear();
  job.leaves.clear();
  MarkDirty(job);
  return true;
}

// The idle workers a job may take (those it has not barred; for a Python
// model, Python workers alone), newest registration last.
std::vector<std::string> Coordinator::EligibleLocked(
    const JobEntry& job, const std::vector<std::string>& idle) const {
  std::vector<std::string> out;
  for (const std::string& id : idle) {
    if (job.barred.count(id)) continue;
    if (job.spec.is_python && workers_.at(id).python.empty()) continue;
    out.push_back(id);
  }
  return out;
}

void Coordinator::ScheduleLocked(Notes* notes) {
  std::vector<std::string> idle;
  for (const auto& [id, w] : workers_) {
    if (w.job_id.empty()) idle.push_back(id);
  }
  auto take = [&idle](const std::string& id) {
    idle.erase(std::find(idle.begin(), idle.end(), id));
  };
  // Running jobs first: place those without shards (restored, or whose
  // shard was lost), then refill vacated slots; then start pending jobs in
  // submission order once all their slots can be filled.
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::RUNNING || job.awaiting_start) continue;
    if (job.ranges.empty() && !PlaceLocked(job)) continue;
    std::vector<std::string> free = EligibleLocked(job, idle);
    for (size_t r = 0; r < job.slots.size() && !free.empty(); ++r) {
      if (!job.slots[r].empty()) continue;
      AssignLocked(job, static_cast<int>(r), free.back());
      take(free.back());
      free.pop_back();
      NotifyLocked(jid, notes);
    }
  }
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::PENDING) continue;
    std::vector<std::string> free = EligibleLocked(job, idle);
    if (free.size() < job.slots.size()) {
      // First come, first served; but a job no registered worker can run
      // (a Python model, no Python worker) does not hold up the others.
      if (job.spec.is_python && !AnyPythonWorkerLocked()) {
        job.condition =
            "waiting for Python workers (python3 -m tally.worker): no "
            "registered worker runs Python models";
        continue;
      }
      break;
    }
    if (!PlaceLocked(job)) break;  // no shard yet
    for (size_t r = 0; r < job.slots.size(); ++r) {
      AssignLocked(job, static_cast<int>(r), free.back());
      take(free.back());
      free.pop_back();
    }
    StartLocked(job);
    NotifyLocked(jid, notes);
  }
  GrowLocked(idle, notes);
}

// Running jobs that may grow (training.workers: {min, max}) take the idle
// workers left, in submission order, while no job waits for workers (a
// job that grows must not starve the queue). Each joins at the start of a
// later epoch, which SetMembership decides; a job too near its end to have
// one left takes nobody.
void Coordinator::GrowLocked(std::vector<std::string>& idle, Notes* notes) {
  if (idle.empty()) return;
  for (const std::string& jid : job_order_) {
    const JobEntry& job = jobs_.at(jid);
    // A pending job that these workers could start comes first.
    if (job.proto.state() == v1::PENDING && !EligibleLocked(job, idle).empty())
      return;
  }
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::RUNNING || !job.installed ||
        job.awaiting_start || job.grown_out ||
        static_cast<int64_t>(job.slots.size()) >= job.spec.training.max_workers)
      continue;
    // A first look (SetMembership decides, from every range held): none
    // when no epoch is left past where the workers are (in async, a
    // version is a member's push: about world versions a step).
    const int64_t bound = job.schedule.ClockOfVersion(VersionLocked(job)) +
                          job.spec.training.consistency.Window() +
                          kJoinMargin;
    if (JoinEpoch(job.schedule, bound, job.spec.training.max_steps) < 0)
      continue;
    std::vector<std::string> free = EligibleLocked(job, idle);
    while (!free.empty() && static_cast<int64_t>(job.slots.size()) <
                                job.spec.training.max_workers) {
      job.slots.push_back("");
      AssignLocked(job, static_cast<int>(job.slots.size() - 1), free.back());
      idle.erase(std::find(idle.begin(), idle.end(), free.back()));
      free.pop_back();
      NotifyLocked(jid, notes);
    }
  }
}

void Coordinator::RestorePlan(JobEntry& job) {
  // A job that grew keeps its worlds with its record.
  std::vector<WorldPeriod> worlds;
  for (const v1::MembershipPeriod& p : job.proto.membership())
    worlds.push_back(WorldPeriod{p.first_epoch(), p.world()});
  if (worlds.empty())
    worlds.push_back({0, static_cast<int>(job.spec.training.workers)});
  job.schedule = ScheduleOf(job.spec, TrainSize(job.spec.dataset), worlds,
                            job.proto.plan());
  job.plan_sent = job.schedule.plan;
  job.slots.assign(job.schedule.last_world(), "");
  RecordPlan(job);
}

void Coordinator::RecordPlan(JobEntry& job) {
  const Schedule& s = job.schedule;
  job.proto.set_workers_max(static_cast<int32_t>(job.spec.training.max_workers));
  job.proto.set_plan(s.plan);
  job.proto.clear_membership();
  for (const WorldPeriod& p : s.worlds) {
    v1::MembershipPeriod* m = job.proto.add_membership();
    m->set_first_epoch(p.first_epoch);
    m->set_first_step(s.EpochStartVersion(p.first_epoch));
    m->set_world(p.world);
    m->set_global_batch(p.world * job.spec.training.batch_size);
    m->set_steps_per_epoch(s.StepsPerEpoch(p.world));
  }
}

void Coordinator::StartLocked(JobEntry& job) {
  job.condition.clear();
  job.proto.set_state(v1::RUNNING);
  EventLocked(job, absl::StrCat("started: ", job.slots.size(), " worker",
                                job.slots.size() == 1 ? "" : "s", ", ",
                                job.ranges.size(), " parameter shard",
                                job.ranges.size() == 1 ? "" : "s"));
}

void Coordinator::FinishLocked(JobEntry& job, v1::JobState state,
                               const std::string& message, Notes* notes) {
  // The figures as they stand, kept with the record from now on.
  const v1::Job now = Render(job);
  CurvePointLocked(job, now.metrics());
  EventLocked(job, absl::StrCat(absl::AsciiStrToLower(v1::JobState_Name(state)),
                                " at step ", now.metrics().step(),
                                message.empty() ? "" : ": ", message));
  *job.proto.mutable_metrics() = now.metrics();
  job.proto.mutable_metrics()->set_samples_per_sec(0.0);
  job.proto.mutable_metrics()->set_workers(0);
  // Nothing waits on anyone once the job has ended (the figures of the
  // moment would stay frozen in the record).
  job.proto.mutable_metrics()->clear_stalled_seconds();
  job.proto.mutable_metrics()->clear_waiting_on();
  job.proto.set_state(state);
  // A success keeps the notes gathered on the way (workers taken off).
  if (!message.empty() || state != v1::SUCCEEDED)
    job.proto.set_message(message);
  job.proto.set_finished_unix(UnixSeconds(Now()));
  for (std::string& wid : job.slots) {
    if (wid.empty()) continue;
    // After a success the other members may still be pulling the final
    // weights: the ranges serve them until each has reported, or for
    // final_pull_grace (a member that died never will).
    if (state == v1::SUCCEEDED) job.awaiting_reports.insert(wid);
    auto it = workers_.find(wid);
    if (it != workers_.end()) {
      it->second.job_id.clear();
      it->second.rank = -1;
    }
    wid.clear();
  }
  job.retire_after = Now() + options_.final_pull_grace;
  MarkDirty(job);  // retire the ranges, keep the final weights
  NotifyLocked(job.proto.id(), notes);
  // An offer of its initial weights being read ends now, and its memory
  // with it, rather than when its sender stops.
  if (job.spec.is_python) {
    notes->push_back([this, id = job.proto.id()] {
      offers_.End(id, WithReason(absl::FailedPreconditionError(absl::StrCat(
                                     id, " ended while its initial weights "
                                         "were being read")),
                                 v1::JOB_ENDED));
    });
  }
}

void Coordinator::VacateLocked(JobEntry& job, const std::string& worker_id,
                               Notes* notes) {
  EventLocked(job, absl::StrCat(worker_id, " left"));
  for (std::string& slot : job.slots) {
    if (slot == worker_id) slot.clear();
  }
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.job_id == job.proto.id()) {
    it->second.job_id.clear();
    it->second.rank = -1;
  }
  MarkDirty(job);  // a member leaves every range
  NotifyLocked(job.proto.id(), notes);
  // Its offer of the initial weights, if it was giving them, would be
  // refused at its end: it ends now, and the next worker asked can offer.
  if (job.spec.is_python && job.start == nullptr) {
    notes->push_back([this, id = job.proto.id(), worker_id] {
      offers_.End(id,
                  WithReason(absl::FailedPreconditionError(absl::StrCat(
                                 Quoted(worker_id), " left ", id,
                                 " while offering its initial weights")),
                             v1::NOT_A_MEMBER),
                  worker_id);
    });
  }
}

void Coordinator::DropWorkerLocked(const std::string& worker_id, Notes* notes) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  const std::string job_id = it->second.job_id;
  if (!job_id.empty()) VacateLocked(jobs_.at(job_id), worker_id, notes);
  workers_.erase(worker_id);
}

// --------------------------------------------------------- control plane --

void Coordinator::Settle(Notes& notes) {
  for (auto& n : notes) n();
  notes.clear();
  RunControl();
}

void Coordinator::RunControl() {
  absl::MutexLock control(&control_mu_);
  // A few rounds: one change may lead to the next (placed, then installed,
  // then members set). What fails waits for the next Tick.
  for (int round = 0; round < 4; ++round) {
    std::vector<ControlTask> tasks;
    {
      absl::MutexLock lock(&mu_);
      tasks = TakeTasksLocked();
    }
    if (tasks.empty()) return;
    for (ControlTask& t : tasks) Reconcile(t);
    Notes notes;
    bool again = false;
    {
      absl::MutexLock lock(&mu_);
      for (ControlTask& t : tasks) again = ApplyTaskLocked(t, &notes) || again;
    }
    for (auto& n : notes) n();
    if (!again) return;
  }
}

std::vector<Coordinator::ControlTask> Coordinator::TakeTasksLocked() {
  std::vector<ControlTask> tasks;
  for (const std::string& id : job_order_) {
    JobEntry& job = jobs_.at(id);
    if (!job.dirty) continue;
    // A succeeded job's ranges go once its members have their final
    // weights (or the grace is over); it stays due until then.
    if (Terminal(job.proto.state()) && !job.retired &&
        !job.awaiting_reports.empty() && Now() < job.retire_after) {
      continue;
    }
    ControlTask t;
    t.job_id = id;
    t.map_version = job.map_version;
    t.terminal = Terminal(job.proto.state());
    t.retired = job.retired;
    t.installed = job.installed;
    t.spec = job.proto.spec();
    t.num_params = job.spec.layout.num_params;
    t.schedule = job.schedule;
    t.async = job.spec.training.consistency.mode == ConsistencyMode::kAsync;
    t.start = job.start;
    t.python = job.spec.is_python;
    t.members = job.members;
    for (const Placement& p : job.ranges) {
      t.ranges.push_back(
          {p.shard_id, p.offset, p.count, shards_.at(p.shard_id).control});
    }
    for (size_t r = 0; r < job.slots.size(); ++r) {
      if (job.slots[r].empty()) continue;
      MemberSpec m;
      m.worker_id = job.slots[r];
      m.incarnation = workers_.at(job.slots[r]).incarnation;
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
    t.hold_id = next_hold_++;
    tasks.push_back(std::move(t));
  }
  return tasks;
}

// What a task did, into its job (unless the job was placed again since);
// whether another round is worth it.
bool Coordinator::ApplyTaskLocked(ControlTask& t, Notes* notes) {
  auto it = jobs_.find(t.job_id);
  if (it == jobs_.end()) return false;
  JobEntry& job = it->second;
  if (job.map_version != t.map_version) return false;  // re-placed since
  // Decided even when not every range took it yet.
  for (const auto& [key, leave] : t.new_leaves) job.leaves[key] = leave;
  if (t.installed_now) {
    job.installed = true;
    job.members.clear();
    if (!job.condition.empty()) {
      EventLocked(
          job,
          absl::StrCat("placed again on ", job.ranges.size(),
                       " parameter shard", job.ranges.size() == 1 ? "" : "s",
                       " at step ", t.start != nullptr ? t.start->version : 0));
      job.condition.clear();
    }
  }
  job.plan_sent = std::max(job.plan_sent, t.plan_sent);
  if (t.members_now) {
    job.members = t.new_members;
    if (t.new_schedule.has_value()) AdoptPlanLocked(job, *t.new_schedule);
    NotifyLocked(t.job_id, notes);
  }
  for (const std::string& id : t.not_joined) {
    EventLocked(job, absl::StrCat(id, " cannot join: no epoch is left to "
                                      "start it at"));
    VacateLocked(job, id, notes);
    job.grown_out = true;  // nor will one be: epochs only pass
  }
  // Slots past the world that nobody took: the job did not grow there.
  while (static_cast<int>(job.slots.size()) > job.schedule.last_world() &&
         job.slots.back().empty()) {
    job.slots.pop_back();
  }
  if (t.retired_now) {
    job.retired = true;
    job.final_weights = t.final_weights;
    // A success has its report's buffers; a failed or cancelled job
    // takes the ranges' region (else its export would lack them).
    if (job.final_buffers.empty()) job.final_buffers = t.final_buffers;
    job.table_homes = t.table_homes;
    job.table_home_addresses.clear();
    for (const std::string& id : t.table_home_ids) {
      auto s = shards_.find(id);
      job.table_home_addresses.push_back(s != shards_.end() ? s->second.address
                                                            : "");
    }
    job.ranges.clear();
    job.members.clear();
  }
  // Done when nothing failed, nothing is left, and nothing changed since
  // the task was taken: the next round finds out.
  if (!t.failed && !t.progressed && job.generation == t.generation)
    job.dirty = false;
  return t.progressed;
}

void Coordinator::AdoptPlanLocked(JobEntry& job, const Schedule& grown) {
  const WorldPeriod& p = grown.worlds.back();
  const bool grew = grown.worlds.size() != job.schedule.worlds.size() ||
                    p.world != job.schedule.worlds.back().world ||
                    p.first_epoch != job.schedule.worlds.back().first_epoch;
  job.schedule = grown;
  RecordPlan(job);
  if (!grew) return;  // the same worlds, numbered again (SetMembership)
  EventLocked(job,
              absl::StrCat("grows to ", p.world, " workers from step ",
                           grown.EpochStartVersion(p.first_epoch), " (epoch ",
                           p.first_epoch, "): global batch ",
                           p.world * job.spec.training.batch_size, ", ",
                           grown.total_steps, " steps in all"));
}

void Coordinator::Reconcile(ControlTask& t) {
  if (t.terminal) {
    if (!t.retired) RetireRanges(t);
    return;
  }
  if (t.ranges.empty()) return;  // waiting for shards
  if (!t.installed) {
    // A Python model's ranges wait for the weights a worker builds.
    if (t.start == nullptr && t.python) return;
    InstallRanges(t);
    return;
  }
  SetMembership(t);
}

// The end: retire every range, keep the final weights, drop the ranges.
void Coordinator::RetireRanges(ControlTask& t) {
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
    t.final_weights = t.start->weights;
    t.final_buffers = t.start->buffers;
  }
  for (const ControlTask::Range& r : t.ranges)
    r.control->Drop(t.job_id, /*ended=*/true);
  t.retired_now = true;
}

// Whether an install error of this placement is the first (logged).
bool FirstInstallError(const std::string& job_id, int64_t map_version) {
  static absl::Mutex mu;
  static std::set<std::pair<std::string, int64_t>>* seen =
      new std::set<std::pair<std::string, int64_t>>;
  absl::MutexLock lock(&mu);
  if (seen->size() > 10000) seen->clear();
  return seen->insert({job_id, map_version}).second;
}

// Every range installed (members come next), from the job's start.
void Coordinator::InstallRanges(ControlTask& t) {
  int slot = 0;
  for (const ControlTask::Range& r : t.ranges) {
    v1::InstallRangeRequest req;
    req.set_slot(slot++);
    req.set_slots(static_cast<int>(t.ranges.size()));
    req.set_job_id(t.job_id);
    req.set_spec(t.spec);
    req.set_map_version(t.map_version);
    req.set_offset(r.offset);
    req.set_count(r.count);
    EncodeSchedule(t.schedule, req.mutable_schedule());
    if (t.start != nullptr) {
      t.start->EncodeRange(r.offset, r.count, req.mutable_state());
    }
    if (absl::Status s = r.control->Install(req); !s.ok()) {
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

namespace {

bool SameMember(const MemberSpec& a, const MemberSpec& b) {
  return a.worker_id == b.worker_id && a.incarnation == b.incarnation &&
         a.rank == b.rank;
}

bool Contains(const std::vector<MemberSpec>& members, const MemberSpec& m) {
  for (const MemberSpec& x : members) {
    if (SameMember(x, m)) return true;
  }
  return false;
}

// A member's last commit any range saw, and whether it said "nothing".
int64_t LastCommit(const std::vector<HoldReport>& reports, const MemberSpec& m,
                   bool* refused) {
  int64_t c = -1;
  *refused = false;
  for (const HoldReport& h : reports) {
    for (const MemberProgress& p : h.members) {
      if (p.worker_id == m.worker_id && p.incarnation == m.incarnation &&
          p.committed_step > c) {
        c = p.committed_step;
        *refused = p.last_refused;
      }
    }
  }
  return c;
}

}  // namespace

// Membership: what the slots hold against what every range has. Every
// range is held (none closes a step) while the new members are worked out
// from all their reports, then set on every range.
void Coordinator::SetMembership(ControlTask& t) {
  std::vector<MemberSpec> active;
  for (const MemberSpec& m : t.members) {
    if (m.leave_step == MemberSpec::kNoStep) active.push_back(m);
  }
  bool changed = active.size() != t.desired.size();
  for (const MemberSpec& d : t.desired)
    changed = changed || !Contains(active, d);
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
  std::vector<MemberSpec> next = DecideMembers(t, active, reports);
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
  t.new_members = std::move(next);
  t.members_now = true;
  t.progressed = true;
}

// Leavers belong to every step some range saw them commit (that push
// reached every range); joiners join at the highest version any range has
// (no range has closed it).
std::vector<MemberSpec> Coordinator::DecideMembers(
    ControlTask& t, const std::vector<MemberSpec>& active,
    const std::vector<HoldReport>& reports) {
  int64_t vmin = INT64_MAX, vmax = 0;
  for (const HoldReport& h : reports) {
    vmin = std::min(vmin, h.version);
    vmax = std::max(vmax, h.version);
  }
  // Async steps are each worker's own: versions do not bound them.
  const bool async = t.async;
  std::vector<MemberSpec> next;
  for (MemberSpec m : t.members) {
    if (m.leave_step == MemberSpec::kNoStep && !Contains(t.desired, m)) {
      auto decided = t.leaves.find({m.worker_id, m.incarnation});
      if (decided != t.leaves.end()) {
        m.leave_step = decided->second.first;
        m.last_refused = decided->second.second;
      } else {
        bool refused = false;
        const int64_t c = LastCommit(reports, m, &refused);
        m.leave_step = async ? c + 1 : std::max(c + 1, m.join_step);
        m.last_refused = refused && c + 1 == m.leave_step;
      }
      t.new_leaves[{m.worker_id, m.incarnation}] = {m.leave_step,
                                                    m.last_refused};
      // Async ranges drop a leaver at once: it goes out in this round, and
      // one that committed nothing anywhere just goes (nothing to settle).
      if (async && m.leave_step > 0) next.push_back(m);
      if (async) continue;
    }
    if (async) {
      if (m.leave_step == MemberSpec::kNoStep) next.push_back(m);  // stays
    } else if (m.leave_step > vmin) {
      // Keep a leaver while some range may still need its last step.
      next.push_back(m);
    }
  }
  std::vector<MemberSpec> growing;
  for (const MemberSpec& d : t.desired) {
    if (Contains(active, d)) continue;
    MemberSpec m = d;
    // Async steps are each worker's own: a refill starts near the others'.
    // Not before its rank has data (a slot of a world still to come: the
    // joiner that took it left before its epoch), or it would push empty
    // steps, each one of an async job's versions.
    m.join_step = std::max(
        async ? MaxClock(reports, t.schedule.total_steps) : vmax,
        t.schedule.FirstStepOfRank(m.rank));
    // A rank past the job's world joins it as it grows; one within
    // refills a vacant slot, from the next step.
    if (m.rank >= t.schedule.last_world()) {
      growing.push_back(m);
    } else {
      next.push_back(m);
    }
  }
  if (!growing.empty()) Grow(t, vmax, reports, growing, &next);
  return next;
}

// Joiners start an epoch with the world that includes them: the first
// whose first step no worker can have begun (bsp and ssp: past the
// versions any range has, the staleness and a step being computed beside
// its pull; async: past every member's own clock), and no earlier than the
// last world decided. Its split and every later epoch's follow the new
// world; epochs before it are as they were.
void Coordinator::Grow(ControlTask& t, int64_t vmax,
                       const std::vector<HoldReport>& reports,
                       std::vector<MemberSpec>& growing,
                       std::vector<MemberSpec>* next) {
  const Schedule& s = t.schedule;
  const int64_t bound =
      t.async ? MaxClock(reports, s.total_steps) + kJoinMargin
              : vmax + t.window + kJoinMargin;
  const int64_t epoch = JoinEpoch(s, bound, t.max_steps);
  if (epoch < 0) {
    for (const MemberSpec& m : growing) t.not_joined.push_back(m.worker_id);
    return;
  }
  Schedule grown = GrowSchedule(s, epoch, t.world, t.max_steps);
  grown.plan = t.next_plan;
  for (MemberSpec& m : growing) {
    m.join_step = grown.EpochStart(epoch);
    next->push_back(m);
  }
  t.new_schedule = std::move(grown);
}

int64_t Coordinator::JoinEpoch(const Schedule& s, int64_t bound,
                               int64_t max_steps) {
  // The first epoch that starts at or past `bound`, in the last world.
  const Schedule::Place at = s.Locate(bound);
  const int64_t epoch = std::max(s.worlds.back().first_epoch,
                                 at.index == 0 ? at.epoch : at.epoch + 1);
  if (epoch >= s.epochs) return -1;
  if (max_steps > 0 && s.EpochStartVersion(epoch) >= max_steps) return -1;
  return epoch;
}

int64_t Coordinator::MaxClock(const std::vector<HoldReport>& reports,
                              int64_t total_steps) {
  int64_t clock = 0;
  for (const HoldReport& h : reports) {
    for (const MemberProgress& p : h.members) {
      // A worker's word: one past the schedule is nonsense, not a bound.
      if (p.clock <= total_steps) clock = std::max(clock, p.clock);
      if (p.pushed_step < total_steps)
        clock = std::max(clock, p.pushed_step + 1);
    }
  }
  return clock;
}

// ------------------------------------------------------------ persistence --

Coordinator::JobEntry Coordinator::FromStored(StoredJob stored) const {
  JobEntry job;
  job.proto = stored.job;
  job.history = stored.history;
  const bool was_running = stored.job.state() == v1::RUNNING;
  // The spec was checked when the file was read (with the default limits;
  // a spec a larger --max_params admitted is read with that).
  job.spec = *ParseJobSpec(job.proto.spec(), options_.spec_limits);
  if (was_running && !stored.has_state && job.proto.membership_size() > 1) {
    // It starts again from its first step (below): with the workers it
    // was submitted with, not those it had grown to.
    job.proto.clear_membership();
    job.proto.set_plan(job.proto.plan() + 1);
  }
  RestorePlan(job);
  v1::JobMetrics* m = job.proto.mutable_metrics();
  m->set_samples_per_sec(0.0);
  m->set_workers(0);
  if (stored.has_state) {
    m->set_step(stored.version);
    m->set_samples(stored.samples);
    m->set_loss(stored.loss);
    m->set_accuracy(stored.accuracy);
    m->set_train_seconds(stored.train_seconds);
    m->set_rejected_pushes(stored.rejected_pushes);
    job.saved_version = stored.version;
  }
  if (Terminal(job.proto.state())) {
    job.retired = true;
    job.dirty = false;
    if (stored.has_state) job.final_weights = stored.weights;
    job.final_buffers = stored.buffers;
    job.table_home_addresses = stored.table_homes;
  } else if (job.proto.state() == v1::RUNNING) {
    if (stored.has_state) {
      job.start = std::make_shared<const StoredJob>(std::move(stored));
    } else {
      job.proto.set_state(v1::PENDING);  // started without weights: again
    }
  }
  if (job.proto.state() == v1::RUNNING) {
    const std::string from =
        job.start != nullptr
            ? absl::StrCat("the checkpoint of step ", job.start->version)
            : "the initial weights";
    AddEvent(
        job.history, Now(),
        absl::StrCat("the coordinator restarted; the job resumes from ", from));
    job.condition = absl::StrCat("the coordinator restarted; resuming from ",
                                 from, " once its ranges are placed");
  } else if (job.proto.state() == v1::PENDING && was_running) {
    AddEvent(job.history, Now(),
             "the coordinator restarted; the job had no checkpoint and waits "
             "to start again");
  }
  job.saved_state = job.proto.state();
  job.saved_at = Now();
  return job;
}

absl::Status Coordinator::Restore() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  if (store_ == nullptr) {
    auto store =
        std::make_unique<JobStore>(options_.state_dir, options_.spec_limits);
    TALLY_RETURN_IF_ERROR(store->Open());
    store_ = std::move(store);
  }
  // Everything is read and checked before anything is installed.
  TALLY_ASSIGN_OR_RETURN(std::vector<StoredJob> stored, store_->LoadAll());
  std::map<std::string, JobEntry> restored;
  for (StoredJob& s : stored) {
    const std::string id = s.job.id();
    if (restored.count(id)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint of job ", id, " is in two files"));
    }
    restored.emplace(id, FromStored(std::move(s)));
  }
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.empty()) {
      return absl::FailedPreconditionError(
          "Restore must run before any job is submitted");
    }
    std::vector<std::string> order;
    for (auto& [id, job] : restored) {
      order.push_back(id);
      next_job_ = std::max(next_job_, JobNumber(id) + 1);
    }
    next_job_ = std::max(next_job_, store_->LoadNextJob());
    std::sort(order.begin(), order.end(),
              [](const std::string& a, const std::string& b) {
                return JobNumber(a) < JobNumber(b);
              });
    jobs_ = std::move(restored);
    job_order_ = std::move(order);
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return absl::OkStatus();
}

// A job whose record is due to be written, taken under mu_ and written
// without it.
struct Coordinator::CheckpointDue {
  v1::Job job;
  int64_t num_params = 0;
  int64_t total_steps = 0;
  int64_t map_version = 0;
  int64_t version = -1;  // of the ranges, to save at
  std::vector<RangeRef> ranges;
  std::shared_ptr<const std::vector<float>> final_weights;
  std::string final_buffers;
  std::shared_ptr<const StoredJob> start;
  v1::JobHistory history;
  std::vector<std::string> table_homes;  // an ended job's, by address
};

absl::Status Coordinator::Checkpoint(bool force) {
  if (options_.state_dir.empty()) return absl::OkStatus();
  absl::MutexLock writing(&checkpoint_mu_);  // one writer at a time
  if (store_ == nullptr) {
    auto store =
        std::make_unique<JobStore>(options_.state_dir, options_.spec_limits);
    TALLY_RETURN_IF_ERROR(store->Open());
    store_ = std::move(store);
  }
  std::vector<CheckpointDue> due;
  {
    absl::MutexLock lock(&mu_);
    due = DueLocked(force);
  }
  absl::Status first_error;
  for (CheckpointDue& d : due) {
    absl::Status s = WriteCheckpoint(d);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

std::vector<Coordinator::CheckpointDue> Coordinator::DueLocked(bool force) {
  std::vector<CheckpointDue> due;
  const absl::Time now = Now();
  for (const std::string& id : job_order_) {
    const JobEntry& job = jobs_.at(id);
    const bool placed = !job.ranges.empty() && job.installed;
    const int64_t version = placed ? VersionLocked(job) : job.saved_version;
    const bool state_changed = job.proto.state() != job.saved_state;
    const bool progressed = version != job.saved_version;
    const bool interval_passed =
        now - job.saved_at >= options_.checkpoint_interval;
    if (!(state_changed || (progressed && (force || interval_passed))))
      continue;
    // An ended job is written once its final weights are in (its ranges
    // retired), so that its file keeps them.
    if (Terminal(job.proto.state()) && !job.retired && !job.ranges.empty())
      continue;
    CheckpointDue d;
    d.job = Render(job);
    // The record keeps what outlives this process: not the conditions
    // and workers of the moment.
    d.job.set_message(job.proto.message());
    if (!Terminal(job.proto.state())) {
      d.job.mutable_metrics()->clear_progress();
      d.job.mutable_metrics()->clear_waiting_on();
      d.job.mutable_metrics()->clear_stalled_seconds();
    }
    d.history = job.history;
    d.num_params = job.spec.layout.num_params;
    d.total_steps = job.schedule.total_steps;
    d.map_version = job.map_version;
    d.final_weights = job.final_weights;
    d.final_buffers = job.final_buffers;
    d.table_homes = job.table_home_addresses;
    d.start = job.start;
    if (placed && !Terminal(job.proto.state())) {
      for (const v1::RangeStatus& r : RangeStatusLocked(job))
        d.version = std::max(d.version, r.version());
      for (const Placement& p : job.ranges)
        d.ranges.push_back({shards_.at(p.shard_id).control, p.offset, p.count});
    }
    due.push_back(std::move(d));
  }
  return due;
}

// Writes one job's file: a running job's ranges at one version, an ended
// job's final weights, a restored job not placed yet as it was read. A
// running job whose ranges cannot be saved now is skipped (OK): training
// moves on, and the next interval tries again.
absl::Status Coordinator::WriteCheckpoint(CheckpointDue& d) {
  const absl::Time began = absl::Now();  // real time: work, not schedule
  StoredJob stored;
  if (!d.ranges.empty()) {
    absl::StatusOr<StoredJob> saved =
        SaveRanges(d.job.id(), d.map_version, d.ranges, d.version,
                   d.total_steps, d.num_params, /*weights_only=*/false);
    if (!saved.ok()) return absl::OkStatus();
    stored = *std::move(saved);
  } else if (d.final_weights != nullptr) {
    const v1::JobMetrics& m = d.job.metrics();
    stored.has_state = true;
    stored.weights = d.final_weights;
    stored.buffers = d.final_buffers;
    stored.version = m.step();
    stored.samples = m.samples();
    stored.loss = m.loss();
    stored.accuracy = m.accuracy();
    stored.train_seconds = m.train_seconds();
    stored.rejected_pushes = m.rejected_pushes();
  } else if (d.start != nullptr) {
    stored = *d.start;  // restored, not placed yet: as it was
  }
  stored.job = d.job;
  stored.history = std::move(d.history);
  stored.table_homes = std::move(d.table_homes);
  if (stored.has_state) stored.job.mutable_metrics()->set_step(stored.version);
  TALLY_RETURN_IF_ERROR(store_->Save(stored));
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(d.job.id());
  if (it == jobs_.end()) return absl::OkStatus();
  it->second.saved_state = d.job.state();
  it->second.saved_version = stored.has_state ? stored.version : -1;
  it->second.saved_at = Now();
  if (stored.has_state && !Terminal(d.job.state())) {
    EventLocked(it->second,
                absl::StrCat("checkpoint at step ", stored.version));
  }
  ++checkpoints_written_;
  checkpoint_seconds_ += absl::ToDoubleSeconds(absl::Now() - began);
  return absl::OkStatus();
}

// ------------------------------------------------------------------ tick --

void Coordinator::Tick() {
  Notes notes;
  std::vector<std::string> lost_jobs;
  {
    absl::MutexLock lock(&mu_);
    lost_jobs = ExpireLocked(&notes);
  }
  // Where the lost jobs start again: their last checkpoint (read outside
  // the lock), else the beginning.
  for (const std::string& jid : lost_jobs) {
    std::shared_ptr<const StoredJob> start;
    if (store_ != nullptr) {
      absl::StatusOr<StoredJob> s = store_->Load(jid);
      if (s.ok() && s->has_state)
        start = std::make_shared<const StoredJob>(*std::move(s));
    }
    absl::MutexLock lock(&mu_);
    RestartLocked(jobs_.at(jid), std::move(start));
  }
  {
    absl::MutexLock lock(&mu_);
    ExpireInitialWeightsLocked(&notes);
    ScheduleLocked(&notes);
    NoteProgressLocked(&notes);
  }
  Settle(notes);
  DropOldJobs();
}

std::vector<std::string> Coordinator::ExpireLocked(Notes* notes) {
  std::vector<std::string> lost_jobs;
  const absl::Time now = Now();
  std::vector<std::string> lost_shards;
  for (const std::string& id : leases_.Expire(now)) {
    ++lease_expiries_;
    if (workers_.count(id)) DropWorkerLocked(id, notes);
    if (shards_.count(id)) lost_shards.push_back(id);
  }
  // A shard that lost its lease took its ranges with it: every running job
  // with a range there starts again, on live shards, from its last
  // checkpoint.
  for (const std::string& sid : lost_shards) {
    ShardEntry& s = shards_.at(sid);
    s.live = false;
    s.ranges.clear();
    for (const std::string& jid : job_order_) {
      JobEntry& job = jobs_.at(jid);
      if (Terminal(job.proto.state())) continue;
      bool hit = false;
      for (const Placement& p : job.ranges) hit = hit || p.shard_id == sid;
      if (!hit) continue;
      // The other ranges go too: every range must restart from one step.
      for (const Placement& p : job.ranges) {
        if (p.shard_id != sid)
          shards_.at(p.shard_id).control->Drop(jid, /*ended=*/false);
      }
      job.ranges.clear();
      job.installed = false;
      job.members.clear();
      job.leaves.clear();
      job.awaiting_start = true;
      ++job.map_version;  // work in flight for the old map is void
      MarkDirty(job);
      lost_jobs.push_back(jid);
      NotifyLocked(jid, notes);
    }
  }
  // Shards lost long ago are forgotten, once no placement names them.
  std::set<std::string> placed;
  for (const auto& [jid, job] : jobs_) {
    for (const Placement& p : job.ranges) placed.insert(p.shard_id);
  }
  for (auto it = shards_.begin(); it != shards_.end();) {
    if (!it->second.live && !placed.count(it->first) &&
        now - it->second.last_seen > absl::Minutes(10)) {
      it = shards_.erase(it);
    } else {
      ++it;
    }
  }
  return lost_jobs;
}

void Coordinator::RestartLocked(JobEntry& job,
                                std::shared_ptr<const StoredJob> start) {
  // A Python model without a checkpoint starts again from what it started
  // from (its worker-built initial weights), not from nothing.
  if (start != nullptr || !job.spec.is_python) job.start = std::move(start);
  job.weights_asked_of.clear();
  job.awaiting_start = false;
  // The event is the history; the condition is the job's message only
  // until the ranges are installed again.
  const std::string from =
      job.start != nullptr
          ? absl::StrCat("the checkpoint of step ", job.start->version)
          : "the initial weights (there is no checkpoint)";
  EventLocked(job, absl::StrCat("a parameter shard was lost; the job "
                                "starts again from ",
                                from));
  job.condition = absl::StrCat("a parameter shard was lost; resuming from ",
                               from, " once its ranges are placed");
  job.proto.mutable_metrics()->set_step(
      job.start != nullptr ? job.start->version : 0);
}

// Moves, stalls and curve points, for watchers and the dashboard.
void Coordinator::NoteProgressLocked(Notes* notes) {
  for (auto& [id, job] : jobs_) {
    if (job.ranges.empty() || !job.installed) continue;
    const int64_t v = VersionLocked(job);
    const absl::Time now = Now();
    if (v != job.notified_version) {
      job.moved_at = now;
    } else if (now - job.moved_at > absl::Seconds(kStallReport) &&
               now - job.stall_noted >= absl::Seconds(1)) {
      // Watchers hear which workers a stalled step waits on.
      job.stall_noted = now;
      NotifyLocked(id, notes);
    }
    if (v != job.notified_version) {
      job.notified_version = v;
      // Render only when a point is due: this runs every tick.
      if (Now() - job.last_point >= job.point_every)
        CurvePointLocked(job, Render(job).metrics());
      NotifyLocked(id, notes);
    }
  }
}

}  // namespace tally
