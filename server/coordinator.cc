#include "server/coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/safetensors.h"
#include "common/nn/layer_config.h"
#include "common/status_macros.h"

namespace tally {

namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options) {
  if (options_.clock == nullptr) options_.clock = &real_clock_;
}

absl::StatusOr<v1::Job> Coordinator::Submit(const std::string& spec_text) {
  TALLY_ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(spec_text));
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    const std::string id = absl::StrCat("job-", next_job_++);
    JobEntry& job = jobs_[id];
    job.spec = std::move(spec);
    job.proto.set_id(id);
    job.proto.set_name(job.spec.name);
    job.proto.set_state(v1::PENDING);
    job.proto.set_spec(spec_text);
    job.proto.set_num_params(job.spec.layout.num_params);
    job.proto.set_workers_wanted(
        static_cast<int32_t>(job.spec.training.workers));
    job.proto.set_created_unix(UnixSeconds(Now()));
    job.slots.assign(job.spec.training.workers, "");
    job_order_.push_back(id);
    ScheduleLocked(&notes);
    out = Render(jobs_[id]);
  }
  for (auto& n : notes) n();
  return out;
}

v1::Job Coordinator::Render(const JobEntry& job) const {
  v1::Job j = job.proto;
  j.mutable_metrics();  // present, zeros included, before the job starts too
  if (job.shard != nullptr) {
    const ShardMetrics m = job.shard->Metrics();
    v1::JobMetrics* out = j.mutable_metrics();
    out->set_step(m.version);
    out->set_total_steps(m.total_steps);
    out->set_epoch(m.steps_per_epoch > 0
                       ? std::max<int64_t>(0, m.version - 1) / m.steps_per_epoch
                       : 0);
    out->set_loss(m.loss);
    out->set_accuracy(m.accuracy);
    out->set_samples_per_sec(Terminal(job.proto.state()) ? 0.0
                                                         : m.samples_per_sec);
    out->set_samples(m.samples);
    out->set_train_seconds(m.train_seconds);
    out->set_mean_samples_per_sec(
        m.train_seconds > 0 ? m.samples / m.train_seconds : 0.0);
    out->set_rejected_pushes(m.rejected_pushes);
    out->set_workers(Terminal(job.proto.state()) ? 0 : m.members);
  }
  return j;
}

absl::StatusOr<v1::Job> Coordinator::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return Render(it->second);
}

std::vector<v1::Job> Coordinator::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> out;
  for (const std::string& id : job_order_) out.push_back(Render(jobs_.at(id)));
  return out;
}

absl::StatusOr<v1::Job> Coordinator::Cancel(const std::string& job_id) {
  Notes notes;
  v1::Job out;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    }
    if (Terminal(it->second.proto.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat(job_id, " already ended (",
                       v1::JobState_Name(it->second.proto.state()), ")"));
    }
    FinishLocked(it->second, v1::CANCELLED, "cancelled by a client", &notes);
    ScheduleLocked(&notes);
    out = Render(it->second);
  }
  for (auto& n : notes) n();
  return out;
}

absl::StatusOr<std::string> Coordinator::WeightsFile(
    const std::string& job_id) const {
  std::shared_ptr<ParameterShard> shard;
  ModelLayout layout;
  std::string name;
  {
    absl::MutexLock lock(&mu_);
    TALLY_ASSIGN_OR_RETURN(const JobEntry* job, StartedJobLocked(job_id));
    shard = job->shard;
    layout = job->spec.layout;
    name = job->spec.name;
  }
  int64_t version = 0;
  auto weights = shard->Snapshot(&version);
  return EncodeSafetensors(layout.params, weights->data(),
                           {{"format", "pt"},
                            {"job", job_id},
                            {"name", name},
                            {"version", absl::StrCat(version)}});
}

v1::RegisterWorkerResponse Coordinator::Register(
    const v1::RegisterWorkerRequest& req) {
  Notes notes;
  v1::RegisterWorkerResponse out;
  {
    absl::MutexLock lock(&mu_);
    const std::string id = absl::StrCat("worker-", next_worker_++);
    WorkerEntry& w = workers_[id];
    w.name = req.name();
    w.devices = req.devices();
    w.address = req.address();
    w.incarnation = next_incarnation_++;
    w.lease_expiry = Now() + options_.lease_timeout;
    out.set_worker_id(id);
    out.set_incarnation(w.incarnation);
    out.set_lease_ms(absl::ToInt64Milliseconds(options_.lease_timeout));
    ScheduleLocked(&notes);
  }
  for (auto& n : notes) n();
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(
    const v1::HeartbeatRequest& req) {
  Notes notes;
  v1::HeartbeatResponse out;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(req.worker_id());
    if (it == workers_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "unknown worker '", req.worker_id(),
          "' (lease expired or server restarted): register again"));
    }
    WorkerEntry& w = it->second;
    if (w.incarnation != req.incarnation()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stale incarnation ", req.incarnation(), " of ",
                       req.worker_id(), ": register again"));
    }
    w.lease_expiry = Now() + options_.lease_timeout;
    ScheduleLocked(&notes);
    if (!w.job_id.empty()) {
      const JobEntry& job = jobs_.at(w.job_id);
      v1::Assignment* a = out.mutable_assignment();
      a->set_job_id(w.job_id);
      a->set_spec(job.proto.spec());
      a->set_rank(w.rank);
      a->set_world(static_cast<int32_t>(job.slots.size()));
    }
  }
  for (auto& n : notes) n();
  return out;
}

absl::Status Coordinator::CheckWorker(const std::string& worker_id,
                                      int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("unknown worker '", worker_id, "': register again"));
  }
  if (it->second.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale incarnation ", incarnation, " of ", worker_id));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ReportResult(const v1::ReportResultRequest& req) {
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(req.worker_id());
    if (wit == workers_.end() || wit->second.incarnation != req.incarnation()) {
      return absl::FailedPreconditionError(
          absl::StrCat("unknown or stale worker '", req.worker_id(), "'"));
    }
    auto jit = jobs_.find(req.job_id());
    if (jit == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
    }
    JobEntry& job = jit->second;
    // Another worker's report may have ended the job already.
    if (Terminal(job.proto.state())) return absl::OkStatus();
    if (wit->second.job_id != req.job_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat(req.worker_id(), " is not assigned to ", req.job_id()));
    }
    if (!req.ok()) {
      FinishLocked(job, v1::FAILED,
                   absl::StrCat(req.worker_id(), " (", wit->second.name,
                                "): ", req.message()),
                   &notes);
    } else {
      const ShardMetrics m = job.shard->Metrics();
      if (m.total_steps == 0 || m.version < m.total_steps ||
          req.steps() != m.total_steps) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a result must evaluate the final weights (version ", m.total_steps,
            "); got version ", req.steps(), " at step ", m.version));
      }
      job.proto.mutable_metrics()->set_test_accuracy(req.test_accuracy());
      job.proto.mutable_metrics()->set_test_loss(req.test_loss());
      FinishLocked(job, v1::SUCCEEDED, "", &notes);
    }
    ScheduleLocked(&notes);
  }
  for (auto& n : notes) n();
  return absl::OkStatus();
}

absl::StatusOr<const Coordinator::JobEntry*> Coordinator::StartedJobLocked(
    const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  if (it->second.shard == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(job_id, " has not started: it has no weights yet"));
  }
  return &it->second;
}

absl::StatusOr<std::shared_ptr<ParameterShard>> Coordinator::Shard(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  TALLY_ASSIGN_OR_RETURN(const JobEntry* job, StartedJobLocked(job_id));
  return job->shard;
}

absl::StatusOr<int64_t> Coordinator::Subscribe(
    const std::string& job_id, std::function<void()> on_change) {
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(job_id)) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
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

void Coordinator::AssignLocked(JobEntry& job, int rank,
                               const std::string& worker_id) {
  WorkerEntry& w = workers_.at(worker_id);
  w.job_id = job.proto.id();
  w.rank = rank;
  job.slots[rank] = worker_id;
  job.shard->AddMember(worker_id, w.incarnation);
}

void Coordinator::ScheduleLocked(Notes* notes) {
  std::vector<std::string> idle;
  for (const auto& [id, w] : workers_) {
    if (w.job_id.empty()) idle.push_back(id);
  }
  // Refill vacated slots of running jobs first, then start pending jobs in
  // submission order once all their slots can be filled.
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::RUNNING) continue;
    for (size_t r = 0; r < job.slots.size() && !idle.empty(); ++r) {
      if (!job.slots[r].empty()) continue;
      AssignLocked(job, static_cast<int>(r), idle.back());
      idle.pop_back();
      NotifyLocked(jid, notes);
    }
  }
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::PENDING) continue;
    if (idle.size() < job.slots.size()) break;  // first come, first served
    std::vector<float> init =
        InitParams(job.spec.layers, job.spec.layout, job.spec.training.seed);
    auto opt =
        Optimizer::Create(job.spec.optimizer, job.spec.layout.num_params);
    if (!opt.ok()) {
      FinishLocked(job, v1::FAILED, std::string(opt.status().message()), notes);
      continue;
    }
    job.shard = std::make_shared<ParameterShard>(
        std::move(init), *std::move(opt), options_.clock);
    for (size_t r = 0; r < job.slots.size(); ++r) {
      AssignLocked(job, static_cast<int>(r), idle.back());
      idle.pop_back();
    }
    job.proto.set_state(v1::RUNNING);
    NotifyLocked(jid, notes);
  }
}

void Coordinator::FinishLocked(JobEntry& job, v1::JobState state,
                               const std::string& message, Notes* notes) {
  job.proto.set_state(state);
  job.proto.set_message(message);
  job.proto.set_finished_unix(UnixSeconds(Now()));
  for (std::string& wid : job.slots) {
    if (wid.empty()) continue;
    auto it = workers_.find(wid);
    if (it != workers_.end()) {
      it->second.job_id.clear();
      it->second.rank = -1;
    }
    if (job.shard != nullptr) job.shard->RemoveMember(wid);
    wid.clear();
  }
  if (job.shard != nullptr) {
    std::shared_ptr<ParameterShard> shard = job.shard;
    notes->push_back([shard] {
      shard->CancelWaiters();
      shard->Retire();
    });
  }
  NotifyLocked(job.proto.id(), notes);
}

void Coordinator::DropWorkerLocked(const std::string& worker_id, Notes* notes) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  const std::string job_id = it->second.job_id;
  const int rank = it->second.rank;
  workers_.erase(it);
  if (job_id.empty()) return;
  JobEntry& job = jobs_.at(job_id);
  if (rank >= 0 && rank < static_cast<int>(job.slots.size()) &&
      job.slots[rank] == worker_id) {
    job.slots[rank].clear();
  }
  if (job.shard != nullptr) {
    std::shared_ptr<ParameterShard> shard = job.shard;
    // Removing a member may close the open step: do it outside our lock.
    notes->push_back([shard, worker_id] { shard->RemoveMember(worker_id); });
  }
  NotifyLocked(job_id, notes);
}

void Coordinator::Tick() {
  Notes notes;
  std::vector<std::shared_ptr<ParameterShard>> shards;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    std::vector<std::string> expired;
    for (const auto& [id, w] : workers_) {
      if (w.lease_expiry < now) expired.push_back(id);
    }
    for (const std::string& id : expired) DropWorkerLocked(id, &notes);
    ScheduleLocked(&notes);
    for (auto& [id, job] : jobs_) {
      if (job.shard == nullptr) continue;
      shards.push_back(job.shard);
      const int64_t v = job.shard->version();
      if (v != job.notified_version) {
        job.notified_version = v;
        NotifyLocked(id, &notes);
      }
    }
  }
  for (auto& n : notes) n();
  for (auto& s : shards) s->ExpireWaiters();
}

}  // namespace tally
