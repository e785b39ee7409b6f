#include "server/coordinator.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/io/safetensors.h"
#include "common/nn/layer_config.h"
#include "common/status_macros.h"
#include "proto/checkpoint.pb.h"
#include "proto/errors.h"

namespace tally {

namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

constexpr uint32_t kCheckpointFormat = 1;

absl::string_view FloatBytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()),
                           v.size() * sizeof(float));
}

// The wire form of a length-delimited protobuf field's key and length, so
// that large bytes fields are written from their own memory: a serialised
// message followed by more fields parses as one message.
std::string BytesFieldPrefix(int field, size_t size) {
  std::string out;
  uint64_t v = (static_cast<uint64_t>(field) << 3) | 2;  // wire type 2
  for (int i = 0; i < 2; ++i) {
    while (v >= 0x80) {
      out.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out.push_back(static_cast<char>(v));
    v = size;
  }
  return out;
}

bool BytesToFloats(const std::string& bytes, int64_t want,
                   std::vector<float>* out) {
  if (static_cast<int64_t>(bytes.size()) != want * 4) return false;
  out->resize(want);
  std::memcpy(out->data(), bytes.data(), bytes.size());
  return true;
}

// "job-12" -> 12 (0 for anything else).
int64_t JobNumber(const std::string& id) {
  absl::string_view rest = id;
  int64_t n = 0;
  if (!absl::ConsumePrefix(&rest, "job-") || !absl::SimpleAtoi(rest, &n))
    return 0;
  return n;
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options) {
  if (options_.clock == nullptr) options_.clock = &real_clock_;
  // Incarnations must never repeat, across restarts of the server too: a
  // worker that registered before a restart must not hold one a new
  // registration gets. The clock in microseconds is past every earlier one.
  absl::MutexLock lock(&mu_);
  next_incarnation_ = std::max<int64_t>(1, absl::ToUnixMicros(Now()));
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
  // Present, zeros included, before the job starts too.
  j.mutable_metrics()->set_total_steps(job.schedule.total_steps);
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
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            job_id, " already ended (",
                            v1::JobState_Name(it->second.proto.state()), ")")),
                        v1::JOB_ENDED);
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
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "unknown worker '", req.worker_id(),
                            "' (lease expired or server restarted): register "
                            "again")),
                        v1::REGISTER_AGAIN);
    }
    WorkerEntry& w = it->second;
    if (w.incarnation != req.incarnation()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "stale incarnation ", req.incarnation(), " of ",
                            req.worker_id(), ": register again")),
                        v1::REGISTER_AGAIN);
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
      v1::Schedule* sched = a->mutable_schedule();
      sched->set_train_size(job.schedule.train_size);
      sched->set_steps_per_epoch(job.schedule.steps_per_epoch);
      sched->set_total_steps(job.schedule.total_steps);
      // This server holds the whole vector.
      v1::ShardMap* map = a->mutable_shard_map();
      map->set_version(1);
      v1::ShardMap::Entry* e = map->add_shards();
      e->set_offset(0);
      e->set_count(job.spec.layout.num_params);
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
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "unknown worker '", worker_id, "': register again")),
                      v1::REGISTER_AGAIN);
  }
  if (it->second.incarnation != incarnation) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "stale incarnation ", incarnation, " of ", worker_id,
                          ": register again")),
                      v1::REGISTER_AGAIN);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ReportResult(const v1::ReportResultRequest& req) {
  Notes notes;
  {
    absl::MutexLock lock(&mu_);
    auto wit = workers_.find(req.worker_id());
    if (wit == workers_.end() || wit->second.incarnation != req.incarnation()) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "unknown or stale worker '", req.worker_id(),
                            "': register again")),
                        v1::REGISTER_AGAIN);
    }
    auto jit = jobs_.find(req.job_id());
    if (jit == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job '", req.job_id(), "'"));
    }
    JobEntry& job = jit->second;
    // Another worker's report may have ended the job already.
    if (Terminal(job.proto.state())) return absl::OkStatus();
    if (wit->second.job_id != req.job_id()) {
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              req.worker_id(), " is not assigned to ", req.job_id())),
          v1::NOT_A_MEMBER);
    }
    const std::string who =
        absl::StrCat(req.worker_id(), " (", wit->second.name, ")");
    if (!req.ok() && req.reason() == v1::SCHEDULE_MISMATCH) {
      // This worker cannot train the job; others can. The job goes on
      // without it and says why.
      job.barred.insert(req.worker_id());
      const std::string note =
          absl::StrCat(who, " cannot train this job: ", req.message());
      job.proto.set_message(job.proto.message().empty()
                                ? note
                                : absl::StrCat(job.proto.message(), "; ", note));
      VacateLocked(job, req.worker_id(), &notes);
    } else if (!req.ok()) {
      FinishLocked(job, v1::FAILED, absl::StrCat(who, ": ", req.message()),
                   &notes);
    } else {
      if (req.steps() != job.schedule.total_steps) {
        return WithReason(
            absl::FailedPreconditionError(absl::StrCat(
                "a result must evaluate the final weights (version ",
                job.schedule.total_steps, "), not version ", req.steps())),
            v1::NOT_FINISHED, job.schedule.total_steps);
      }
      const ShardMetrics m = job.shard->Metrics();
      if (m.version < job.schedule.total_steps) {
        return WithReason(absl::UnavailableError(absl::StrCat(
                              "the weights are at version ", m.version, " of ",
                              job.schedule.total_steps, ": not final yet")),
                          v1::NOT_FINISHED, m.version);
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
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          job_id, " has not started: it has no weights yet")),
                      v1::JOB_NOT_STARTED);
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
  // The idle workers a job may take (those it has not barred), newest
  // registration last.
  auto eligible = [&idle](const JobEntry& job) {
    std::vector<std::string> out;
    for (const std::string& id : idle) {
      if (!job.barred.count(id)) out.push_back(id);
    }
    return out;
  };
  auto take = [&idle](const std::string& id) {
    idle.erase(std::find(idle.begin(), idle.end(), id));
  };
  // Refill vacated slots of running jobs first, then start pending jobs in
  // submission order once all their slots can be filled.
  for (const std::string& jid : job_order_) {
    JobEntry& job = jobs_.at(jid);
    if (job.proto.state() != v1::RUNNING) continue;
    std::vector<std::string> free = eligible(job);
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
    std::vector<std::string> free = eligible(job);
    if (free.size() < job.slots.size()) break;  // first come, first served
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
    // Valid by construction (MakeSchedule gives positive counts).
    job.shard
        ->SetSchedule(job.schedule.total_steps, job.schedule.steps_per_epoch)
        .IgnoreError();
    for (size_t r = 0; r < job.slots.size(); ++r) {
      AssignLocked(job, static_cast<int>(r), free.back());
      take(free.back());
      free.pop_back();
    }
    job.proto.set_state(v1::RUNNING);
    NotifyLocked(jid, notes);
  }
}

void Coordinator::FinishLocked(JobEntry& job, v1::JobState state,
                               const std::string& message, Notes* notes) {
  job.proto.set_state(state);
  // A success keeps the notes gathered on the way (workers taken off).
  if (!message.empty() || state != v1::SUCCEEDED) job.proto.set_message(message);
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

void Coordinator::VacateLocked(JobEntry& job, const std::string& worker_id,
                               Notes* notes) {
  for (std::string& slot : job.slots) {
    if (slot == worker_id) slot.clear();
  }
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.job_id == job.proto.id()) {
    it->second.job_id.clear();
    it->second.rank = -1;
  }
  if (job.shard != nullptr) {
    std::shared_ptr<ParameterShard> shard = job.shard;
    // Removing a member may close the open step: do it outside our lock.
    notes->push_back([shard, worker_id] { shard->RemoveMember(worker_id); });
  }
  NotifyLocked(job.proto.id(), notes);
}

void Coordinator::DropWorkerLocked(const std::string& worker_id, Notes* notes) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  const std::string job_id = it->second.job_id;
  if (!job_id.empty()) VacateLocked(jobs_.at(job_id), worker_id, notes);
  workers_.erase(worker_id);
}

Coordinator::~Coordinator() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

absl::StatusOr<Coordinator::JobEntry> Coordinator::LoadJob(
    const std::string& path) const {
  auto bad = [&path](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": ", why,
                     " (move the file away to start without that job)"));
  };
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return bad(bytes.status().message());
  v1::JobCheckpoint ck;
  if (!ck.ParseFromString(*bytes)) return bad("not a job checkpoint");
  if (ck.format() != kCheckpointFormat) {
    return bad(absl::StrCat("format ", ck.format(), ", this server reads ",
                            kCheckpointFormat));
  }
  auto spec = ParseJobSpec(ck.job().spec());
  if (!spec.ok()) return bad(spec.status().message());
  JobEntry job;
  job.proto = ck.job();
  job.spec = *std::move(spec);
  job.schedule = MakeSchedule(job.spec, TrainSize(job.spec.dataset),
                              static_cast<int>(job.spec.training.workers));
  job.slots.assign(job.spec.training.workers, "");
  const int64_t n = job.spec.layout.num_params;
  if (ck.has_shard()) {
    ShardState st;
    st.metrics.version = ck.version();
    st.metrics.total_steps = ck.total_steps();
    st.metrics.steps_per_epoch = ck.steps_per_epoch();
    st.metrics.samples = ck.samples();
    st.metrics.rejected_pushes = ck.rejected_pushes();
    st.metrics.loss = ck.loss();
    st.metrics.accuracy = ck.accuracy();
    st.metrics.train_seconds = ck.train_seconds();
    // A job that ended keeps only its final weights, whatever the moment
    // of the write was.
    st.retired = ck.retired() || Terminal(job.proto.state());
    auto weights = std::make_shared<std::vector<float>>();
    if (!BytesToFloats(ck.weights(), n, weights.get()))
      return bad("the weights do not match the model's size");
    st.weights = std::move(weights);
    st.optimizer.step = ck.optimizer_step();
    for (const std::string& slot : ck.optimizer_slots()) {
      st.optimizer.slots.emplace_back();
      if (!BytesToFloats(slot, n, &st.optimizer.slots.back()))
        return bad("the optimizer state does not match the model's size");
    }
    std::unique_ptr<Optimizer> opt;
    if (!st.retired) {
      auto created = Optimizer::Create(job.spec.optimizer, n);
      if (!created.ok()) return bad(created.status().message());
      opt = *std::move(created);
    }
    auto shard = ParameterShard::Restore(st, std::move(opt), options_.clock);
    if (!shard.ok()) return bad(shard.status().message());
    job.shard = std::shared_ptr<ParameterShard>(*std::move(shard));
    // A job kept before schedules were fixed at submission took its
    // schedule from a worker: that one stands.
    if (st.metrics.total_steps > 0) {
      job.schedule.total_steps = st.metrics.total_steps;
      job.schedule.steps_per_epoch = st.metrics.steps_per_epoch;
    } else {
      job.shard
          ->SetSchedule(job.schedule.total_steps, job.schedule.steps_per_epoch)
          .IgnoreError();
    }
    job.saved_version = st.metrics.version;
  } else if (job.proto.state() == v1::RUNNING) {
    job.proto.set_state(v1::PENDING);  // started without weights: again
  }
  job.saved_state = job.proto.state();
  job.saved_at = Now();
  if (job.proto.id().empty()) return bad("the job has no id");
  return job;
}

absl::Status Coordinator::Restore() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(options_.state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", options_.state_dir, ": ", ec.message()));
  }
  // One server per directory: two writing the same files would lose work.
  if (lock_fd_ < 0) {
    const std::string lock_path =
        (fs::path(options_.state_dir) / "LOCK").string();
    const int fd =
        ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--state_dir: cannot open ", lock_path, ": ", std::strerror(errno)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("--state_dir ", options_.state_dir,
                       " is in use by another tally-server"));
    }
    lock_fd_ = fd;
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(options_.state_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".ckpt") {
      files.push_back(entry.path().string());
    } else if (name.find(".ckpt.tmp.") != std::string::npos) {
      std::error_code ignored;
      fs::remove(entry.path(), ignored);  // a write cut short by a crash
    }
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir ", options_.state_dir, ": ", ec.message()));
  }
  // Everything is read and checked before anything is installed.
  std::map<std::string, JobEntry> restored;
  for (const std::string& path : files) {
    TALLY_ASSIGN_OR_RETURN(JobEntry job, LoadJob(path));
    const std::string id = job.proto.id();
    if (restored.count(id)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, ": job ", id,
                                              " is in another file too"));
    }
    restored.emplace(id, std::move(job));
  }
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
  std::sort(order.begin(), order.end(),
            [](const std::string& a, const std::string& b) {
              return JobNumber(a) < JobNumber(b);
            });
  jobs_ = std::move(restored);
  job_order_ = std::move(order);
  return absl::OkStatus();
}

absl::Status Coordinator::Checkpoint(bool force) {
  if (options_.state_dir.empty()) return absl::OkStatus();
  absl::MutexLock writing(&checkpoint_mu_);  // one writer at a time
  struct Due {
    v1::Job job;
    std::shared_ptr<ParameterShard> shard;
  };
  std::vector<Due> due;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    for (const std::string& id : job_order_) {
      const JobEntry& job = jobs_.at(id);
      const int64_t version = job.shard != nullptr ? job.shard->version() : -1;
      const bool state_changed = job.proto.state() != job.saved_state;
      const bool progressed = version != job.saved_version;
      const bool interval_passed =
          now - job.saved_at >= options_.checkpoint_interval;
      if (state_changed || (progressed && (force || interval_passed)))
        due.push_back({Render(job), job.shard});
    }
  }
  absl::Status first_error;
  for (Due& d : due) {
    // The small fields are serialised; weights and optimizer slots follow
    // as raw fields, straight from the shard's copies.
    ShardState st;
    std::vector<std::string> prefixes;
    std::vector<absl::string_view> pieces(1);
    v1::JobCheckpoint ck;
    ck.set_format(kCheckpointFormat);
    const v1::JobState state = d.job.state();
    const std::string id = d.job.id();
    *ck.mutable_job() = std::move(d.job);
    int64_t version = -1;
    if (d.shard != nullptr) {
      st = d.shard->Save();
      version = st.metrics.version;
      ck.set_has_shard(true);
      ck.set_version(st.metrics.version);
      ck.set_total_steps(st.metrics.total_steps);
      ck.set_steps_per_epoch(st.metrics.steps_per_epoch);
      ck.set_samples(st.metrics.samples);
      ck.set_rejected_pushes(st.metrics.rejected_pushes);
      ck.set_loss(st.metrics.loss);
      ck.set_accuracy(st.metrics.accuracy);
      ck.set_train_seconds(st.metrics.train_seconds);
      ck.set_retired(st.retired);
      ck.set_optimizer_step(st.optimizer.step);
      prefixes.push_back(
          BytesFieldPrefix(v1::JobCheckpoint::kWeightsFieldNumber,
                           FloatBytes(*st.weights).size()));
      for (const auto& slot : st.optimizer.slots) {
        prefixes.push_back(
            BytesFieldPrefix(v1::JobCheckpoint::kOptimizerSlotsFieldNumber,
                             FloatBytes(slot).size()));
      }
    }
    const std::string head = ck.SerializeAsString();
    pieces[0] = head;
    size_t total = head.size();
    for (size_t i = 0; i < prefixes.size(); ++i) {
      const absl::string_view data =
          i == 0 ? FloatBytes(*st.weights)
                 : FloatBytes(st.optimizer.slots[i - 1]);
      pieces.push_back(prefixes[i]);
      pieces.push_back(data);
      total += prefixes[i].size() + data.size();
    }
    const std::string path =
        (std::filesystem::path(options_.state_dir) / (id + ".ckpt")).string();
    // Protocol buffers stop at 2 GiB: weights plus optimizer state of more
    // than about 250M parameters do not fit one file.
    absl::Status s = total < static_cast<size_t>(INT_MAX)
                         ? WriteFileAtomic(path, pieces)
                         : absl::ResourceExhaustedError(absl::StrCat(
                               path,
                               ": the job's state is over 2 GiB, too large to "
                               "checkpoint; it goes on in memory"));
    if (!s.ok()) {
      if (first_error.ok()) first_error = s;
      continue;
    }
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    it->second.saved_state = state;
    it->second.saved_version = version;
    it->second.saved_at = Now();
  }
  return first_error;
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
