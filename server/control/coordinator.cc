#include "server/control/coordinator.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/control/job_export.h"
#include "server/control/job_render.h"
#include "server/control/remote_shard_control.h"

namespace tally {

namespace {

JobQueue::Options QueueOptions(const CoordinatorOptions& o) {
  JobQueue::Options q;
  q.max_queued_jobs = o.max_queued_jobs;
  q.max_queued_jobs_per_submitter = o.max_queued_jobs_per_submitter;
  q.max_finished_jobs = o.max_finished_jobs;
  q.finished_job_ttl = o.finished_job_ttl;
  q.durable = !o.state_dir.empty();
  q.keep_weights = !o.keep_weights_dir.empty();
  q.initial_weights_timeout = o.initial_weights_timeout;
  return q;
}

JobArchive::Options ArchiveOptions(const CoordinatorOptions& o) {
  JobArchive::Options a;
  a.state_dir = o.state_dir;
  a.spec_limits = o.spec_limits;
  a.checkpoint_interval = o.checkpoint_interval;
  a.keep_weights_dir = o.keep_weights_dir;
  return a;
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options),
      offers_(options.max_offer_bytes),
      archive_(ArchiveOptions(options)),
      jobs_(QueueOptions(options)),
      registry_(
          options.lease_timeout, options.max_workers,
          (options.clock != nullptr ? options.clock : &real_clock_)->Now()),
      planner_(&jobs_, &registry_) {
  if (options_.clock == nullptr) options_.clock = &real_clock_;
  if (options_.connect_shard == nullptr) {
    options_.connect_shard =
        [transport = options_.transport](const std::string& address) {
          return MakeRemoteShardControl(address, transport);
        };
  }
  absl::MutexLock lock(&mu_);
  if (options_.local_shard != nullptr) {
    registry_.AddLocalShard(options_.local_shard, options_.local_shard_address,
                            Now());
  }
}

Coordinator::~Coordinator() = default;

// ------------------------------------------------------------------ jobs --

absl::StatusOr<v1::Job> Coordinator::Submit(const std::string& spec_text,
                                            const std::string& owner) {
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(jobs_.Admit(owner));
  }
  TALLY_ASSIGN_OR_RETURN(JobSpec spec,
                         ParseJobSpec(spec_text, options_.spec_limits));
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(jobs_.Admit(owner));  // again: others submitted
    JobEntry& job = jobs_.Add(std::move(spec), spec_text, owner, Now());
    Planner::RecordPlan(job);
    ScheduleLocked(&notes);
    out = RenderJob(job, registry_, Now());
  }
  Settle(notes);
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(const JobEntry* job, jobs_.Find(job_id));
  return RenderJob(*job, registry_, Now());
}

std::vector<v1::Job> Coordinator::List(bool with_specs) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const std::string& id : jobs_.order()) {
    out.push_back(RenderJob(jobs_.at(id), registry_, Now()));
    if (!with_specs) out.back().clear_spec();
  }
  return out;
}

absl::StatusOr<JobPage> Coordinator::ListPage(const JobQuery& query) const {
  JobPage page;
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(std::vector<const JobEntry*> jobs,
                         jobs_.Page(query, &page.next_page_token));
  for (const JobEntry* job : jobs) {
    page.jobs.push_back(RenderJob(*job, registry_, Now()));
    if (query.omit_spec) page.jobs.back().clear_spec();
  }
  return page;
}

absl::StatusOr<v1::JobHistory> Coordinator::History(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(const JobEntry* job, jobs_.Find(job_id));
  return job->history;
}

absl::StatusOr<std::vector<v1::JobWorker>> Coordinator::JobWorkers(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(const JobEntry* job, jobs_.Find(job_id));
  std::vector<v1::JobWorker> out;
  const std::vector<std::string>& slots = job->slots;
  for (size_t r = 0; r < slots.size(); ++r) {
    const WorkerEntry* w =
        slots[r].empty() ? nullptr : registry_.worker(slots[r]);
    if (w == nullptr) continue;
    v1::JobWorker jw;
    jw.set_worker_id(slots[r]);
    jw.set_name(w->name);
    jw.set_devices(w->devices);
    jw.set_rank(static_cast<int32_t>(r));
    out.push_back(std::move(jw));
  }
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id) {
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    TALLY_ASSIGN_OR_RETURN(JobEntry* job, jobs_.Find(job_id));
    if (job->ended()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            job_id, " already ended (",
                            v1::JobState_Name(job->proto.state()), ")")),
                        v1::JOB_ENDED);
    }
    FinishLocked(*job, v1::CANCELLED, "cancelled by a client", &notes);
    ScheduleLocked(&notes);
    out = RenderJob(*job, registry_, Now());
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

absl::StatusOr<Coordinator::WeightsExport> Coordinator::ExportWeights(
    const std::string& job_id) {
  absl::StatusOr<JobExport> file = absl::UnknownError("not taken");
  {
    absl::MutexLock lock(&mu_);
    // An ended job with tables: its ranges retire in a moment (the control
    // round after the end), and its file then has the tables; waited for
    // 10 s at most.
    const auto retired = [this, &job_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto j = jobs_.entries().find(job_id);
      return j == jobs_.entries().end() || !j->second.ended() ||
             j->second.spec.embeddings.empty() || j->second.retired;
    };
    mu_.AwaitWithTimeout(absl::Condition(&retired), absl::Seconds(10));
    TALLY_ASSIGN_OR_RETURN(const JobEntry* job, jobs_.Find(job_id));
    file = JobExport::Take(*job, registry_);
  }
  if (!file.ok()) return file.status();
  WeightsExport out;
  TALLY_RETURN_IF_ERROR(file->Make(&out.head, &out.tables, &out.buffers_note));
  return out;
}

// --------------------------------------------------------------- workers --

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::Register(
    const v1::RegisterWorkerRequest& req) {
  TALLY_RETURN_IF_ERROR(Registry::CheckRegistration(req));
  Notes notes;
  v1::RegisterWorkerResponse out;
  {
    absl::MutexLock lock(&mu_);
    TALLY_ASSIGN_OR_RETURN(out, registry_.AddWorker(req, Now()));
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
    TALLY_ASSIGN_OR_RETURN(
        WorkerEntry* w,
        registry_.RenewWorker(req.worker_id(), req.incarnation(), Now()));
    if (!req.job_id().empty() && req.job_id() == w->job_id) {
      w->compute_seconds = req.compute_seconds();
      w->wait_seconds = req.wait_seconds();
      w->push_seconds = req.push_seconds();
      w->loader_seconds = req.loader_seconds();
    }
    ScheduleLocked(&notes);
    if (!w->job_id.empty()) {
      JobEntry& job = jobs_.at(w->job_id);
      if (JobQueue::AskForWeights(job, req.worker_id(), Now())) {
        v1::InitialWeightsWanted* want = out.mutable_initial_weights();
        want->set_job_id(w->job_id);
        want->set_spec(job.proto.spec());
      }
      planner_.Assignment(req, *w, job, &out);
    }
  }
  Settle(notes);
  return out;
}

absl::Status Coordinator::CheckLease(const std::string& id,
                                     int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  return registry_.CheckLease(id, incarnation);
}

void Coordinator::Gone(const std::string& id, int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  registry_.EndLease(id, incarnation, Now());
}

absl::StatusOr<std::unique_ptr<WeightOffers::Offer>>
Coordinator::BeginInitialWeights(const std::string& job_id,
                                 const std::string& worker_id,
                                 int64_t incarnation,
                                 std::function<void(absl::Status)> end) {
  // Let in under the lock that ends jobs: an offer of a job that ends
  // after this is found by FinishLocked's note, and none is let in after.
  absl::MutexLock lock(&mu_);
  TALLY_RETURN_IF_ERROR(registry_.CheckLease(worker_id, incarnation));
  TALLY_ASSIGN_OR_RETURN(const JobEntry* job,
                         jobs_.OfferWanted(job_id, worker_id));
  return offers_.Begin(job_id, worker_id, job->spec.layout.num_params,
                       std::move(end));
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
    TALLY_RETURN_IF_ERROR(registry_.CheckLease(worker_id, incarnation));
    TALLY_ASSIGN_OR_RETURN(JobEntry* job, jobs_.OfferWanted(job_id, worker_id));
    const int64_t n = job->spec.layout.num_params;
    if (static_cast<int64_t>(weights.size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("initial weights of ", weights.size(),
                       " values for a model of ", n));
    }
    auto start = std::make_shared<StoredJob>();
    start->has_state = true;
    start->state.weights =
        std::make_shared<const std::vector<float>>(std::move(weights));
    job->start = std::move(start);
    job->weights_asked_of.clear();
    job->AddEvent(Now(), absl::StrCat("initial weights built by ", worker_id));
    job->MarkDirty();
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
    TALLY_ASSIGN_OR_RETURN(
        const WorkerEntry* w,
        registry_.CheckWorker(req.worker_id(), req.incarnation()));
    TALLY_ASSIGN_OR_RETURN(JobEntry* job, jobs_.Find(req.job_id()));
    // Another worker's report may have ended the job already: this one
    // has its final weights now.
    if (job->ended()) {
      if (job->awaiting_reports.erase(req.worker_id()) > 0) job->MarkDirty();
      return absl::OkStatus();
    }
    if (w->job_id != req.job_id()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            Quoted(req.worker_id()), " is not assigned to ",
                            Quoted(req.job_id()))),
                        v1::NOT_A_MEMBER);
    }
    const std::string who = absl::StrCat(req.worker_id(), " (", w->name, ")");
    if (JobQueue::NoteStaleReport(*job, req, who, Now())) {
      return absl::OkStatus();
    }
    if (!req.ok() && req.reason() == v1::SCHEDULE_MISMATCH) {
      // This worker cannot train the job; others can. The job goes on
      // without it and says why.
      job->barred.insert(req.worker_id());
      const std::string note =
          absl::StrCat(who, " cannot train this job: ", req.message());
      job->proto.set_message(
          job->proto.message().empty()
              ? note
              : absl::StrCat(job->proto.message(), "; ", note));
      VacateLocked(*job, req.worker_id(), &notes);
    } else if (!req.ok()) {
      FinishLocked(*job, v1::FAILED, absl::StrCat(who, ": ", req.message()),
                   &notes);
    } else {
      // A member's result on the final weights ends the job.
      TALLY_RETURN_IF_ERROR(
          JobQueue::TakeResult(*job, req, registry_.Version(*job)));
      FinishLocked(*job, v1::SUCCEEDED, "", &notes);
      job->awaiting_reports.erase(req.worker_id());
    }
    ScheduleLocked(&notes);
  }
  Settle(notes);
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
    out = registry_.AddShard(req.address(), std::move(control), Now());
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return out;
}

// A shard process's ranges that the coordinator did not place there (now)
// are answered for dropping: an ended job's as ended.
absl::StatusOr<v1::ShardHeartbeatResponse> Coordinator::ShardHeartbeat(
    const v1::ShardHeartbeatRequest& req) {
  v1::ShardHeartbeatResponse out;
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    TALLY_ASSIGN_OR_RETURN(
        ShardEntry* s,
        registry_.RenewShard(req.shard_id(), req.incarnation(), Now()));
    s->ranges.assign(req.ranges().begin(), req.ranges().end());
    for (const v1::RangeStatus& r : req.ranges()) {
      auto jit = jobs_.entries().find(r.job_id());
      const JobEntry* job =
          jit != jobs_.entries().end() ? &jit->second : nullptr;
      bool placed = false;
      if (job != nullptr && !job->retired &&
          job->map_version == r.map_version()) {
        for (const Placement& p : job->ranges) {
          if (p.shard_id == req.shard_id() ||
              p.backup_shard_id == req.shard_id())
            placed = true;
        }
      }
      if (placed) continue;
      // Only the placement the shard reported: a newer one may be on its
      // way to it.
      v1::ShardHeartbeatResponse::Drop* drop =
          job != nullptr && job->ended() ? out.add_ended() : out.add_drop();
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
  s.workers = static_cast<int64_t>(registry_.workers().size());
  for (const auto& [id, w] : registry_.workers())
    s.idle_workers += w.job_id.empty();
  for (const auto& [id, sh] : registry_.shards()) s.live_shards += sh.live;
  s.lease_expiries = registry_.lease_expiries();
  s.leases_ended = registry_.leases_ended();
  s.checkpoints_written = checkpoints_written_;
  s.checkpoint_seconds = checkpoint_seconds_;
  const absl::Time now = Now();
  for (const auto& [id, job] : jobs_.entries()) {
    if (job.proto.state() == v1::RUNNING &&
        job.saved_at != absl::InfinitePast()) {
      s.checkpoint_age_seconds[id] = absl::ToDoubleSeconds(now - job.saved_at);
    }
  }
  return s;
}

std::vector<v1::ShardInfo> Coordinator::ListShards() const {
  absl::MutexLock lock(&mu_);
  return registry_.ListShards(Now());
}

// ----------------------------------------------------------- subscribers --

absl::StatusOr<int64_t> Coordinator::Subscribe(
    const std::string& job_id, std::function<void()> on_change) {
  absl::MutexLock lock(&mu_);
  TALLY_RETURN_IF_ERROR(jobs_.Find(job_id).status());
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

// ------------------------------------------------------- job lifecycle --

void Coordinator::ScheduleLocked(Notes* notes) {
  for (const std::string& id : planner_.ScheduleJobs(Now()))
    NotifyLocked(id, notes);
}

void Coordinator::FinishLocked(JobEntry& job, v1::JobState state,
                               const std::string& message, Notes* notes) {
  // The figures as they stand, kept with the record from now on.
  const v1::Job rendered = RenderJob(job, registry_, Now());
  job.AddCurvePoint(Now(), rendered.metrics());
  job.AddEvent(Now(),
               absl::StrCat(absl::AsciiStrToLower(v1::JobState_Name(state)),
                            " at step ", rendered.metrics().step(),
                            message.empty() ? "" : ": ", message));
  v1::JobMetrics* metrics = job.proto.mutable_metrics();
  *metrics = rendered.metrics();
  metrics->set_samples_per_sec(0.0);
  metrics->set_workers(0);
  // Nothing waits on anyone once the job has ended (the figures of the
  // moment would stay frozen in the record).
  metrics->clear_stalled_seconds();
  metrics->clear_waiting_on();
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
    if (WorkerEntry* w = registry_.worker(wid); w != nullptr) {
      w->job_id.clear();
      w->rank = -1;
    }
    wid.clear();
  }
  job.retire_after = Now() + options_.final_pull_grace;
  job.MarkDirty();  // retire the ranges, keep the final weights
  NotifyLocked(job.id(), notes);
  // An offer of its initial weights being read ends now, and its memory
  // with it, rather than when its sender stops.
  if (job.spec.is_python) {
    notes->push_back([this, id = job.id()] {
      offers_.End(id, WithReason(absl::FailedPreconditionError(absl::StrCat(
                                     id, " ended while its initial weights "
                                         "were being read")),
                                 v1::JOB_ENDED));
    });
  }
}

void Coordinator::VacateLocked(JobEntry& job, const std::string& worker_id,
                               Notes* notes) {
  job.AddEvent(Now(), absl::StrCat(worker_id, " left"));
  for (std::string& slot : job.slots) {
    if (slot == worker_id) slot.clear();
  }
  WorkerEntry* w = registry_.worker(worker_id);
  if (w != nullptr && w->job_id == job.id()) {
    w->job_id.clear();
    w->rank = -1;
  }
  job.MarkDirty();  // a member leaves every range
  NotifyLocked(job.id(), notes);
  // Its offer of the initial weights, if it was giving them, would be
  // refused at its end: it ends now, and the next worker asked can offer.
  if (job.spec.is_python && job.start == nullptr) {
    notes->push_back([this, id = job.id(), worker_id] {
      offers_.End(id,
                  WithReason(absl::FailedPreconditionError(absl::StrCat(
                                 Quoted(worker_id), " left ", id,
                                 " while offering its initial weights")),
                             v1::NOT_A_MEMBER),
                  worker_id);
    });
  }
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
      tasks = reconciler_.Take(jobs_, registry_, Now());
    }
    if (tasks.empty()) return;
    for (ControlTask& t : tasks) reconciler_.Run(t);
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

bool Coordinator::ApplyTaskLocked(ControlTask& t, Notes* notes) {
  auto it = jobs_.entries().find(t.job_id);
  if (it == jobs_.entries().end()) return false;
  JobEntry& job = it->second;
  if (job.map_version != t.map_version) return false;  // re-placed since
  if (t.members_now) NotifyLocked(t.job_id, notes);
  return Reconciler::Apply(
      t, job, registry_, Now(),
      [this, &job, notes](const std::string& worker_id)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            VacateLocked(job, worker_id, notes);
          });
}

// ------------------------------------------------------------ persistence --

absl::Status Coordinator::Restore() {
  if (!archive_.enabled()) return absl::OkStatus();
  TALLY_ASSIGN_OR_RETURN(JobArchive::Restored restored,
                         archive_.LoadAll(Now()));
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    TALLY_RETURN_IF_ERROR(
        jobs_.Restore(std::move(restored.jobs), restored.next_job));
    ScheduleLocked(&notes);
  }
  Settle(notes);
  return absl::OkStatus();
}

absl::Status Coordinator::Checkpoint(bool force) {
  if (!archive_.enabled()) return absl::OkStatus();
  absl::MutexLock writing(&checkpoint_mu_);  // one writer at a time
  TALLY_RETURN_IF_ERROR(archive_.Open());
  std::vector<CheckpointDue> due;
  {
    absl::MutexLock lock(&mu_);
    due = archive_.Due(jobs_, registry_, force, Now());
  }
  absl::Status first_error;
  for (CheckpointDue& d : due) {
    const absl::Time began = absl::Now();  // real time: work, not schedule
    absl::StatusOr<bool> written = archive_.Write(d);
    if (!written.ok()) {
      if (first_error.ok()) first_error = written.status();
      continue;
    }
    if (!*written) continue;  // the ranges moved on: the next interval
    absl::MutexLock lock(&mu_);
    auto it = jobs_.entries().find(d.job.id());
    if (it == jobs_.entries().end()) continue;
    JobArchive::NoteWritten(d, it->second, Now());
    ++checkpoints_written_;
    checkpoint_seconds_ += absl::ToDoubleSeconds(absl::Now() - began);
  }
  return first_error;
}

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
    next_job = jobs_.next_job();
    dropped = jobs_.TakeDroppable(Now(), registry_.BusyJobs());
  }
  // Job numbers are never given twice, even once every file is gone.
  if (!dropped.empty()) archive_.SaveNextJob(next_job);
  for (const DroppedJob& d : dropped) archive_.Forget(d);
  return static_cast<int>(dropped.size());
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
    std::shared_ptr<const StoredJob> start = archive_.LastState(jid);
    absl::MutexLock lock(&mu_);
    Planner::Restart(jobs_.at(jid), std::move(start), Now());
  }
  {
    absl::MutexLock lock(&mu_);
    // Python jobs whose initial weights did not come in time fail.
    for (auto& [job, message] : jobs_.WeightsOverdue(Now()))
      FinishLocked(*job, v1::FAILED, message, &notes);
    ScheduleLocked(&notes);
    // Moves, stalls and curve points, for watchers and the dashboard.
    for (auto& [id, job] : jobs_.entries()) {
      if (NoteProgress(job, registry_, Now())) NotifyLocked(id, &notes);
    }
  }
  Settle(notes);
  DropOldJobs();
}

std::vector<std::string> Coordinator::ExpireLocked(Notes* notes) {
  const absl::Time now = Now();
  const Registry::Expired expired = registry_.Expire(now);
  for (const std::string& id : expired.workers) {
    const std::string job_id = registry_.worker(id)->job_id;
    if (!job_id.empty()) VacateLocked(jobs_.at(job_id), id, notes);
    registry_.RemoveWorker(id);
  }
  // A shard that lost its lease took its ranges with it: every running job
  // with a range there starts again, on live shards, from its last
  // checkpoint.
  std::vector<std::string> lost_jobs;
  for (const std::string& sid : expired.shards) {
    for (std::string& jid : planner_.LoseShard(sid, now)) {
      NotifyLocked(jid, notes);
      lost_jobs.push_back(std::move(jid));
    }
  }
  // Shards lost long ago are forgotten, once no placement names them.
  registry_.ForgetLostShards(now, planner_.PlacedShards());
  return lost_jobs;
}

}  // namespace tally
